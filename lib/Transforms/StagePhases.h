//===- StagePhases.h - training phases of a step cut in stages -*- C++ -*-===//
//
// pcc-autodiff and pcc-optimizer on a module pcc-pipeline-cut has cut into
// stages (StagePhases.cpp), and the per-rank phases that pcc-optimizer,
// pcc-partition-training and pcc-data-parallel (re)build.
//
//===----------------------------------------------------------------------===//

#ifndef PCC_TRANSFORMS_STAGEPHASES_H
#define PCC_TRANSFORMS_STAGEPHASES_H

#include "FlatShards.h"

namespace mlir::pcc {

/// Whether pcc-pipeline-cut has cut `module` into stages.
bool isCutIntoStages(ModuleOp module);

/// pcc-autodiff on a module cut into stages: every stage's forward, B and W
/// phases, with recompute policy `recompute[k]` for stage k (one value: for
/// every stage; none: none); the `frozen` weights get no gradient.
LogicalResult differentiateStages(ModuleOp module,
                                  ArrayRef<std::string> recompute,
                                  const llvm::StringSet<> &frozen);

/// pcc-optimizer on a module differentiated by stage: every pipeline rank's
/// optimizer (`kind`: sgd or adamw) and zero-grad phases.
LogicalResult buildStageOptimizers(ModuleOp module, StringRef kind);

/// Pipelined training: the weights each pipeline rank's stages train
/// (name and the rank's tensor type), read from its optimizer phase, in
/// update order.
SmallVector<llvm::MapVector<StringRef, RankedTensorType>>
rankWeights(ModuleOp module);

/// The weights held by more than one pipeline rank, in first-seen order.
SmallVector<StringRef>
tiedWeights(ArrayRef<llvm::MapVector<StringRef, RankedTensorType>> held);

/// Pipelined training: (re)builds every pipeline rank's @rank<r>_optimizer
/// and @rank<r>_zero_grad for the weights `held` (by rank, as the rank
/// holds them: whole, or its tensor-parallel piece as `flat.splits` says)
/// with the optimizer the module's pcc.training records: tied weights'
/// gradients summed over pp, then over dp as ZeRO stage `zero` says (when
/// `flat.ranks` > 1), the global norm over tp, dp and pp, and the
/// updates; with `gatherWeights` (ZeRO 3 kept gathered) the zero-grad
/// phase also all-gathers every weight into `<weight>@gathered`. Under
/// ZeRO 2 and 3 the gradient states are this rank's pieces when
/// `shardedGradients` (the W phases reduce-scatter into them), else whole,
/// reduce-scattered here once per step. Under ZeRO 0, the weights in
/// `started` have their gradients' sums over dp started by the W phases
/// (pcc.bucket_start): the optimizer waits for them instead of summing.
LogicalResult
buildRankPhases(ModuleOp module,
                ArrayRef<llvm::MapVector<StringRef, RankedTensorType>> held,
                const FlatShards &flat, int64_t zero,
                bool gatherWeights = false, bool shardedGradients = false,
                const llvm::StringSet<> *started = nullptr);

} // namespace mlir::pcc

#endif // PCC_TRANSFORMS_STAGEPHASES_H
