//===- MemoryModel.h - predicted memory of a pipelined step -----*- C++ -*-===//
//
// What each pipeline rank of a `pcc --train --pp` library allocates, as
// the runtime allocates it (runtime/lib/PipelineTrainer.cpp): the state of
// its stages, one stash slot per micro-batch its list keeps in flight
// (inputs received, forward outputs and saved activations, the output
// cotangents received), one set of B's values for W per micro-batch
// between its B and its W, a cotangent send buffer per micro-batch, and
// one arena for its largest phase. `pcc --explain` prints it and
// `--mem-cap` chooses the recomputation that fits; pcc-run prints each
// rank's measured high-water mark.
//
//===----------------------------------------------------------------------===//

#ifndef PCC_ANALYSIS_MEMORYMODEL_H
#define PCC_ANALYSIS_MEMORYMODEL_H

#include "mlir/IR/BuiltinOps.h"

#include <cstdint>
#include <vector>

namespace mlir::pcc {

struct PipelineRankMemory {
  int64_t state = 0;    // weights, gradients and optimizer state
  int64_t slots = 0;    // stash slots, F to W
  int64_t stash = 0;    // B's values for W, B to W
  int64_t sendGrad = 0; // the cotangents B sends, per micro-batch
  int64_t arena = 0;    // the largest phase's scratch
  int64_t other = 0;    // the norm, the loss gradient, the step's losses
  /// Per chunk: stash slots, and sets of B's values for W.
  std::vector<int32_t> slotCounts, stashCounts;
  /// One stash slot's bytes, per chunk (what recomputation shrinks).
  std::vector<int64_t> slotBytes;
  int64_t total() const {
    return state + slots + stash + sendGrad + arena + other;
  }
};

/// Per pipeline rank, from a pipelined training module after
/// pcc-plan-memory; empty (with an error emitted) when the module is not
/// one.
std::vector<PipelineRankMemory> predictPipelineMemory(ModuleOp module);

} // namespace mlir::pcc

#endif // PCC_ANALYSIS_MEMORYMODEL_H
