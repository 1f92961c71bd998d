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

/// The pools of an unpipelined training step's device memory (and its
/// host memory under --offload=optimizer), in bytes, as the runtime
/// allocates them (pccrt::Trainer): every state tensor, the forward phase's
/// inputs and saved activations, and one arena for the largest phase.
struct StepMemory {
  int64_t weights = 0, grads = 0, optimizer = 0, inputs = 0, saved = 0,
          arena = 0;
  /// Mixed precision: the bf16 (or fp16) copies of the products' weights.
  int64_t copies = 0;
  const char *copyType = "bf16";
  /// Offloaded: host memory, and the collectives' results the host reads.
  int64_t host = 0, crossing = 0;
  /// Bytes that align the gradients in their buckets.
  int64_t bucketGaps = 0;
  bool offloaded = false;
  /// What one device holds at most (pcc-run's measured high-water mark).
  int64_t device() const {
    return weights + grads + optimizer + copies + inputs + saved + arena +
           crossing;
  }
};

/// The pools of an unpipelined training module after pcc-plan-memory.
StepMemory predictStepMemory(ModuleOp module);

/// The most any rank of a training module after pcc-plan-memory holds
/// (the largest pipeline rank's, or the unpipelined step's); -1 with an
/// error emitted when it cannot be predicted.
int64_t predictPeakBytes(ModuleOp module);

/// Per pipeline rank, from a pipelined training module after
/// pcc-plan-memory; empty (with an error emitted) when the module is not
/// one.
std::vector<PipelineRankMemory> predictPipelineMemory(ModuleOp module);

} // namespace mlir::pcc

#endif // PCC_ANALYSIS_MEMORYMODEL_H
