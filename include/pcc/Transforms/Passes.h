//===- Passes.h - pcc passes and pipelines ----------------------*- C++ -*-===//

#ifndef PCC_TRANSFORMS_PASSES_H
#define PCC_TRANSFORMS_PASSES_H

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Pass/Pass.h"
#include "mlir/Pass/PassManager.h"

#include <memory>

namespace mlir::pcc {

#define GEN_PASS_DECL
#include "pcc/Transforms/Passes.h.inc"

/// Sharding decisions shared by several compiles of one model in one
/// process (the plan search's probes differ in precision and recompute,
/// not in the weights the forward phase reads): the layout chosen for each
/// weight, per mesh axis size and set of weights. Thread-safe.
struct ShardingMemo;
std::shared_ptr<ShardingMemo> createShardingMemo();

/// pcc-plan-sharding that searches a forward phase's weights once per memo
/// and reuses the decisions (propagated again) in later compiles.
std::unique_ptr<Pass> createPlanSharding(const PlanShardingOptions &options,
                                         std::shared_ptr<ShardingMemo> memo);

/// The passes `pcc` runs after import: canonicalize (folders, reshape and
/// transpose merging), CSE, and the model summary.
void buildImportCleanupPipeline(OpPassManager &pm);

/// Registers the named pipelines (`pcc-import-cleanup`).
void registerPccPipelines();

#define GEN_PASS_REGISTRATION
#include "pcc/Transforms/Passes.h.inc"

} // namespace mlir::pcc

#endif // PCC_TRANSFORMS_PASSES_H
