//===- Arena.h - pcc-plan-memory's arena allocator -------------*- C++ -*-===//
//
// Best fit over the free gaps of one arena, in program order: the memory
// plan of every compiled function, and the plan search's replay of a
// stage's buffers at a plan's rows (lib/Pipelines/PlanProbe.cpp), so that
// the two agree on what fragments.
//
//===----------------------------------------------------------------------===//

#ifndef PCC_ANALYSIS_ARENA_H
#define PCC_ANALYSIS_ARENA_H

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <map>

namespace mlir::pcc {

/// Free gaps of the arena, by offset.
class BestFitArena {
public:
  explicit BestFitArena(int64_t alignment) : alignment(alignment) {}

  int64_t allocate(int64_t bytes) {
    bytes = (bytes + alignment - 1) / alignment * alignment;
    // Best fit: the smallest gap that holds the buffer.
    auto best = gaps.end();
    for (auto it = gaps.begin(); it != gaps.end(); ++it)
      if (it->second >= bytes &&
          (best == gaps.end() || it->second < best->second))
        best = it;
    if (best != gaps.end()) {
      int64_t offset = best->first, size = best->second;
      gaps.erase(best);
      if (size > bytes)
        gaps[offset + bytes] = size - bytes;
      return offset;
    }
    // Grow the arena, absorbing a free gap at its end.
    int64_t offset = end;
    if (!gaps.empty()) {
      auto last = std::prev(gaps.end());
      if (last->first + last->second == end) {
        offset = last->first;
        gaps.erase(last);
      }
    }
    end = offset + bytes;
    peak = std::max(peak, end);
    return offset;
  }

  void release(int64_t offset, int64_t bytes) {
    bytes = (bytes + alignment - 1) / alignment * alignment;
    auto [it, inserted] = gaps.emplace(offset, bytes);
    (void)inserted;
    // Merge with the following and the preceding gap.
    auto next = std::next(it);
    if (next != gaps.end() && it->first + it->second == next->first) {
      it->second += next->second;
      gaps.erase(next);
    }
    if (it != gaps.begin()) {
      auto prev = std::prev(it);
      if (prev->first + prev->second == it->first) {
        prev->second += it->second;
        gaps.erase(it);
      }
    }
  }

  int64_t getPeak() const { return peak; }

private:
  int64_t alignment;
  int64_t end = 0, peak = 0;
  std::map<int64_t, int64_t> gaps;
};

} // namespace mlir::pcc

#endif // PCC_ANALYSIS_ARENA_H
