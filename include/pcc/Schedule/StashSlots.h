//===- StashSlots.h - the buffers a pipeline rank's list needs --*- C++ -*-===//
//
// One walk of a pipeline rank's instruction list, shared by the runtime
// (which allocates the buffers, runtime/lib/PipelineTrainer.cpp) and the
// compiler's memory model (which predicts them, lib/Analysis): a
// micro-batch holds a stash slot of its chunk from its first instruction
// to its W (its inputs, saved activations and received cotangents), and a
// set of B's values for W from its B to its W. Slots are reused from a
// free list, so a chunk needs as many as it has micro-batches in flight.
// Header-only plain C++: the runtime links no compiler library.
//
//===----------------------------------------------------------------------===//

#ifndef PCC_SCHEDULE_STASHSLOTS_H
#define PCC_SCHEDULE_STASHSLOTS_H

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace pcc::schedule {

/// One compute instruction of a rank's list: its chunk on the rank, its
/// micro-batch, and whether it is a B or a W (else an F).
struct SlotStep {
  int32_t chunk = 0, microbatch = 0;
  bool backward = false, weightGrad = false;
};

struct StashSlots {
  /// Per chunk and micro-batch: its stash slot, and its B-to-W set.
  std::vector<std::vector<int32_t>> slotOf, stashOf;
  /// Per chunk: slots and sets needed (the most in flight at once).
  std::vector<int32_t> slotCount, stashCount;
  /// Non-empty when the list uses a micro-batch after its W, or runs a W
  /// before its B.
  std::string error;
};

inline StashSlots assignStashSlots(const std::vector<SlotStep> &list,
                                   int32_t chunks, int32_t microbatches) {
  auto c = static_cast<size_t>(chunks);
  auto m = static_cast<size_t>(microbatches);
  StashSlots s;
  s.slotOf.assign(c, std::vector<int32_t>(m, -1));
  s.stashOf.assign(c, std::vector<int32_t>(m, -1));
  s.slotCount.assign(c, 0);
  s.stashCount.assign(c, 0);
  // Per (chunk, micro-batch): 0 not started, 1 holding its slot, 2 done.
  std::vector<std::vector<int8_t>> held(c, std::vector<int8_t>(m));
  std::vector<std::vector<int32_t>> freeSlots(c), freeStashes(c);
  for (const SlotStep &step : list) {
    auto k = static_cast<size_t>(step.chunk);
    auto mb = static_cast<size_t>(step.microbatch);
    if (held[k][mb] == 2) {
      s.error = "uses micro-batch " + std::to_string(step.microbatch) +
                " after its weight gradients";
      return s;
    }
    if (held[k][mb] == 0) {
      if (freeSlots[k].empty())
        freeSlots[k].push_back(s.slotCount[k]++);
      s.slotOf[k][mb] = freeSlots[k].back();
      freeSlots[k].pop_back();
      held[k][mb] = 1;
    }
    if (step.backward) {
      if (freeStashes[k].empty())
        freeStashes[k].push_back(s.stashCount[k]++);
      s.stashOf[k][mb] = freeStashes[k].back();
      freeStashes[k].pop_back();
    }
    if (step.weightGrad) {
      if (s.stashOf[k][mb] < 0) {
        s.error = "runs W of micro-batch " + std::to_string(step.microbatch) +
                  " before its B";
        return s;
      }
      freeStashes[k].push_back(s.stashOf[k][mb]);
      freeSlots[k].push_back(s.slotOf[k][mb]);
      held[k][mb] = 2;
    }
  }
  return s;
}

} // namespace pcc::schedule

#endif // PCC_SCHEDULE_STASHSLOTS_H
