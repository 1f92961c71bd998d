//===- PipelineStages.h - a pipelined module's stages -----------*- C++ -*-===//

#ifndef PCC_ANALYSIS_PIPELINESTAGES_H
#define PCC_ANALYSIS_PIPELINESTAGES_H

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/SmallVector.h"

#include <array>

namespace mlir::pcc {

/// A pipelined training module's stage phases: per stage k, its forward,
/// backward (B) and weight-gradient (W) functions (null where one is
/// missing), found by their pcc.phase and pcc.pipeline_stage attributes.
llvm::SmallVector<std::array<func::FuncOp, 3>>
getPipelineStagePhases(ModuleOp module);

} // namespace mlir::pcc

#endif // PCC_ANALYSIS_PIPELINESTAGES_H
