//===- Passes.h - pcc passes and pipelines ----------------------*- C++ -*-===//

#ifndef PCC_TRANSFORMS_PASSES_H
#define PCC_TRANSFORMS_PASSES_H

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Pass/Pass.h"
#include "mlir/Pass/PassManager.h"

namespace mlir::pcc {

#define GEN_PASS_DECL
#include "pcc/Transforms/Passes.h.inc"

/// The passes `pcc` runs after import: canonicalize (folders, reshape and
/// transpose merging), CSE, and the model summary.
void buildImportCleanupPipeline(OpPassManager &pm);

/// Registers the named pipelines (`pcc-import-cleanup`).
void registerPccPipelines();

#define GEN_PASS_REGISTRATION
#include "pcc/Transforms/Passes.h.inc"

} // namespace mlir::pcc

#endif // PCC_TRANSFORMS_PASSES_H
