//===- CutSearch.h - where to cut a program into stages ---------*- C++ -*-===//
//
// The search behind pcc-pipeline-cut, on numbers alone: a program in
// topological order is a profile of positions (position c is before op c;
// the program has n ops and n + 1 positions), each with the predicted
// seconds and FLOPs before it and the bytes live across it. Candidates are
// the narrowest positions; the stages are chosen by dynamic programming to
// minimise the slowest stage and then the bytes crossing; with several
// chunks per rank the cuts move to balance the busiest rank.
//
//===----------------------------------------------------------------------===//

#ifndef PCC_ANALYSIS_CUTSEARCH_H
#define PCC_ANALYSIS_CUTSEARCH_H

#include "mlir/IR/Value.h"
#include "mlir/IR/ValueRange.h"
#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/STLFunctionalExtras.h"
#include "llvm/ADT/SetVector.h"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace mlir::pcc {

struct CutProfile {
  /// seconds[c]: the predicted seconds of ops [0, c) (n + 1 entries).
  std::vector<double> seconds;
  /// flops[c]: the FLOPs of ops [0, c) (n + 1 entries).
  std::vector<int64_t> flops;
  /// crossing[c]: the bytes live across position c (n + 1 entries).
  std::vector<int64_t> crossing;
  size_t size() const { return seconds.empty() ? 0 : seconds.size() - 1; }
};

/// What a value weighs where the stage cut counts the bytes live across a
/// position: its bytes, except that a cast's result weighs as its input
/// (mixed precision casts an activation to bf16 just before a product: that
/// spot is not narrower than the layers' boundaries, whose residual stays
/// f32, and taking it for the narrowest would rule them all out).
int64_t cutWeight(mlir::Value v);

/// cutWeight, and a 16-bit value at its f32 size: how a program after
/// mixed precision's casts (and fusion, which writes a 16-bit value where
/// the f32 one was cast) is weighed as the cut weighs it before them.
int64_t cutWeightAsF32(mlir::Value v);

/// Whether `op` is a weight, a constant or computed from such ops alone
/// (those in `fromWeights`): what a stage clones rather than receives, and
/// what the backward phase reads again rather than keeps. A fusion of such
/// values is one too.
bool isComputedFromWeights(
    mlir::Operation *op, const llvm::DenseSet<mlir::Operation *> &fromWeights);

/// The values of `block` computed, through any chain of its ops, from
/// `seeds` or from an op `isSource` accepts (the seeds and the sources'
/// results included): what depends on the graph's inputs, say, as against
/// what is computed from weights and constants alone.
llvm::DenseSet<mlir::Value> valuesReachedFrom(
    mlir::Block &block, mlir::ValueRange seeds,
    llvm::function_ref<bool(mlir::Operation &)> isSource =
        [](mlir::Operation &) { return false; });

/// Where a cut may go: positions with compute on both sides where no more
/// bytes are live than at the narrowest point between the model's layers
/// (between its first and last op with FLOPs), one per run of free ops.
std::vector<size_t> candidateCuts(const CutProfile &profile);

/// The values live across the narrowest positions between the layers of
/// the program `ops` (a function body in order, without its terminator;
/// `args` its arguments): the residual stream where one layer hands over to
/// the next, one position per run of narrow positions, the one of fewest
/// bytes. Ops computed from weights and constants alone, and the
/// arguments, are not counted among the values (they are read again, not
/// kept). Empty where the program has no positions between layers.
llvm::SetVector<mlir::Value>
layerBoundaryValues(llvm::ArrayRef<mlir::Operation *> ops,
                    llvm::ArrayRef<mlir::BlockArgument> args);

/// The stages - 1 candidates minimising (slowest stage, bytes crossing);
/// on a tie the later cut. `candidates` must hold stages - 1 or more.
std::vector<size_t> balanceStages(const CutProfile &profile,
                                  const std::vector<size_t> &candidates,
                                  int64_t stages);

/// Predicted seconds of each pipeline rank per micro-batch when stage k of
/// the cut `cuts` runs on rank k mod `ranks`.
std::vector<double> rankSeconds(const CutProfile &profile,
                                llvm::ArrayRef<size_t> cuts, int64_t ranks);

/// With several chunks per rank: moves single cuts to neighbouring
/// candidates while that lowers (busiest rank, slowest stage, bytes).
void balanceRanks(const CutProfile &profile,
                  const std::vector<size_t> &candidates,
                  std::vector<size_t> &cuts, int64_t ranks);

} // namespace mlir::pcc

#endif // PCC_ANALYSIS_CUTSEARCH_H
