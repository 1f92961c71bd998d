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
#include <utility>
#include <vector>

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

/// A buffer to lay out: alive from the op at `first` to the op at `last`
/// (both included: an op's operands stay live until it has written its
/// results).
struct ArenaInterval {
  int64_t first = 0, last = 0, bytes = 0;
};

/// Lays out buffers whose lifetimes are all known (greedy by size, as
/// TensorFlow Lite's offline planner does): the largest first, each in
/// the smallest gap left between the buffers laid out already that are
/// alive at the same time, or above them all. Program-order best fit
/// (BestFitArena) leaves holes a later, larger buffer cannot use: the zoo
/// Llama's --sp backward at 16 rows was 1.70 MB for 1.44 MB alive at its
/// peak. Returns each buffer's offset; `peak` is the arena's size.
inline std::vector<int64_t> layOutBySize(const std::vector<ArenaInterval> &in,
                                         int64_t alignment, int64_t &peak) {
  auto align = [&](int64_t bytes) {
    return (bytes + alignment - 1) / alignment * alignment;
  };
  std::vector<size_t> order(in.size());
  for (size_t i = 0; i < in.size(); ++i)
    order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    int64_t sa = align(in[a].bytes), sb = align(in[b].bytes);
    return sa != sb ? sa > sb : in[a].first < in[b].first;
  });
  std::vector<int64_t> offsets(in.size(), -1);
  std::vector<size_t> placed;
  // (offset, end) of the placed buffers alive with the one being placed.
  std::vector<std::pair<int64_t, int64_t>> overlapping;
  peak = 0;
  for (size_t i : order) {
    int64_t bytes = align(in[i].bytes);
    overlapping.clear();
    for (size_t j : placed)
      if (in[j].first <= in[i].last && in[i].first <= in[j].last)
        overlapping.emplace_back(offsets[j], offsets[j] + align(in[j].bytes));
    std::sort(overlapping.begin(), overlapping.end());
    int64_t best = -1, bestGap = 0, top = 0;
    for (auto [offset, end] : overlapping) {
      if (offset > top) {
        int64_t gap = offset - top;
        if (gap >= bytes && (best < 0 || gap < bestGap)) {
          best = top;
          bestGap = gap;
        }
      }
      top = std::max(top, end);
    }
    offsets[i] = best >= 0 ? best : top;
    peak = std::max(peak, offsets[i] + bytes);
    placed.push_back(i);
  }
  return offsets;
}

} // namespace mlir::pcc

#endif // PCC_ANALYSIS_ARENA_H
