//===- PipelineStages.h - a pipelined module's stages -----------*- C++ -*-===//

#ifndef PCC_ANALYSIS_PIPELINESTAGES_H
#define PCC_ANALYSIS_PIPELINESTAGES_H

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/Support/LogicalResult.h"
#include "llvm/ADT/SmallVector.h"

#include <array>

namespace mlir::pcc {

/// A pipelined training module's stage phases: per stage k, its forward,
/// backward (B) and weight-gradient (W) functions (null where one is
/// missing), found by their pcc.phase and pcc.pipeline_stage attributes.
llvm::SmallVector<std::array<func::FuncOp, 3>>
getPipelineStagePhases(ModuleOp module);

/// A training module's step, pipelined or not, in one shape: stages, each
/// a list of phases run per micro-batch in order (forward, backward and,
/// pipelined, the weight-gradient phase W), then the phases run once per
/// step. An unpipelined step (pcc-autodiff, pcc-optimizer) is one stage
/// (@train_forward, @train_backward) and its step phases are
/// @train_optimizer and @train_zero_grad; a pipelined one
/// (pcc-autodiff on stages) has every stage's F, B and W, and its per-rank
/// optimizer and zero-grad phases are rebuilt by the passes that change a
/// rank's state (their `stepPhases` stay empty).
struct TrainingStep {
  bool pipelined = false;
  llvm::SmallVector<llvm::SmallVector<func::FuncOp, 3>> stages;
  llvm::SmallVector<func::FuncOp, 2> stepPhases;
};

/// The step of `module`; an error naming `pass` (and what to run first)
/// where a phase is missing.
FailureOr<TrainingStep> getTrainingStep(ModuleOp module, llvm::StringRef pass);

} // namespace mlir::pcc

#endif // PCC_ANALYSIS_PIPELINESTAGES_H
