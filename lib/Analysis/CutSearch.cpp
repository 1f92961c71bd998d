//===- CutSearch.cpp - where to cut a program into pipeline stages --------===//

#include "pcc/Analysis/CutSearch.h"
#include "pcc/Analysis/CostModel.h"
#include "pcc/Dialect/Pcc/IR/PccDialect.h"

#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"

#include <algorithm>
#include <limits>
#include <tuple>
#include <utility>

using namespace mlir;
using namespace mlir::pcc;

int64_t mlir::pcc::cutWeight(Value v) {
  int64_t bytes = tensorBytes(v);
  if (auto cast = v.getDefiningOp<CastOp>())
    bytes = std::max(bytes, tensorBytes(cast.getInput()));
  return bytes;
}

int64_t mlir::pcc::cutWeightAsF32(Value v) {
  Type element = cast<ShapedType>(v.getType()).getElementType();
  return element.isBF16() || element.isF16() ? 2 * tensorBytes(v)
                                             : cutWeight(v);
}

bool mlir::pcc::isComputedFromWeights(
    Operation *op, const llvm::DenseSet<Operation *> &fromWeights) {
  if (isa<ParamOp, ConstantOp>(op))
    return true;
  if (!isPure(op) || (op->getNumRegions() != 0 && !isa<FusionOp>(op)) ||
      op->getNumOperands() == 0 || op->hasTrait<OpTrait::IsTerminator>())
    return false;
  return llvm::all_of(op->getOperands(), [&](Value v) {
    Operation *def = v.getDefiningOp();
    return def && fromWeights.contains(def);
  });
}

llvm::DenseSet<Value>
mlir::pcc::valuesReachedFrom(Block &block, ValueRange seeds,
                             llvm::function_ref<bool(Operation &)> isSource) {
  llvm::DenseSet<Value> reached(seeds.begin(), seeds.end());
  for (Operation &op : block) {
    if (!isSource(op) && llvm::none_of(op.getOperands(), [&](Value v) {
          return reached.contains(v);
        }))
      continue;
    reached.insert(op.getResults().begin(), op.getResults().end());
  }
  return reached;
}

/// Where a cut may go: positions with compute on both sides where no more
/// bytes are live than at the narrowest point between the model's layers
/// (between its first and last matmul or convolution), one per run of free
/// ops. Measuring the narrowest point between layers keeps a thin spot in
/// the prologue (a tensor-parallel embedding scattered over the ranks)
/// from ruling out every cut between layers.
std::vector<size_t> mlir::pcc::candidateCuts(const CutProfile &p) {
  size_t n = p.size();
  const std::vector<int64_t> &flops = p.flops;
  auto interior = [&](size_t c) {
    return p.seconds[c] > 0 && p.seconds[n] - p.seconds[c] > 0;
  };
  auto betweenLayers = [&](size_t c) {
    return flops[c] > 0 && flops[n] - flops[c] > 0;
  };
  bool layered = false;
  for (size_t c = 1; c < n; ++c)
    layered |= betweenLayers(c);
  int64_t least = std::numeric_limits<int64_t>::max();
  for (size_t c = 1; c < n; ++c)
    if (layered ? betweenLayers(c) : interior(c))
      least = std::min(least, p.crossing[c]);
  std::vector<size_t> out;
  for (size_t c = 1; c < n; ++c)
    if (interior(c) && p.crossing[c] <= least &&
        (out.empty() || p.seconds[c] > p.seconds[out.back()]))
      out.push_back(c);
  return out;
}

llvm::SetVector<Value>
mlir::pcc::layerBoundaryValues(ArrayRef<Operation *> all,
                               ArrayRef<BlockArgument> args) {
  // Ops of weights and constants alone are not positions: they are read
  // again wherever they are needed.
  llvm::DenseSet<Operation *> fromWeights;
  std::vector<Operation *> ops;
  llvm::DenseMap<Operation *, size_t> index;
  for (Operation *op : all) {
    if (isComputedFromWeights(op, fromWeights)) {
      fromWeights.insert(op);
      continue;
    }
    index[op] = ops.size();
    ops.push_back(op);
  }
  size_t n = ops.size();
  if (n < 3)
    return {};
  // A value is live from after its definition to its last reader among
  // `ops` (position n for the terminator; the backward's readers, where
  // the program is being differentiated, do not count).
  auto lastUse = [&](Value v, size_t from) {
    size_t last = from;
    for (Operation *user : v.getUsers()) {
      auto it = index.find(user);
      if (it != index.end())
        last = std::max(last, it->second);
      else if (user->hasTrait<OpTrait::IsTerminator>())
        last = n;
    }
    return last;
  };
  // Weighted as the stage cut weighs them (a 16-bit value at its f32
  // size, so that the epilogue's 16-bit input to the head is no narrower
  // than the residual stream), arguments included, so that the narrow
  // points are the cut candidates; `bytes` without the arguments and at
  // the values' own size, to choose within a run.
  std::vector<int64_t> delta(n + 2, 0), byteDelta(n + 2, 0);
  for (BlockArgument arg : args) {
    size_t last = lastUse(arg, 0);
    delta[0] += tensorBytes(arg);
    delta[last + 1] -= tensorBytes(arg);
  }
  struct Live {
    Value value;
    size_t from, last;
  };
  std::vector<Live> values;
  for (size_t i = 0; i < n; ++i)
    for (Value r : ops[i]->getResults()) {
      size_t last = lastUse(r, i);
      if (last == i)
        continue;
      values.push_back({r, i + 1, last});
      delta[i + 1] += cutWeightAsF32(r);
      delta[last + 1] -= cutWeightAsF32(r);
      byteDelta[i + 1] += tensorBytes(r);
      byteDelta[last + 1] -= tensorBytes(r);
    }
  std::vector<int64_t> crossing(n + 1, 0), bytes(n + 1, 0), flops(n + 1, 0);
  int64_t live = 0, liveBytes = 0;
  for (size_t c = 0; c <= n; ++c) {
    live += delta[c];
    liveBytes += byteDelta[c];
    crossing[c] = live;
    bytes[c] = liveBytes;
    if (c < n)
      flops[c + 1] = flops[c] + opFlops(ops[c]);
  }
  auto betweenLayers = [&](size_t c) {
    return flops[c] > 0 && flops[n] - flops[c] > 0;
  };
  int64_t least = std::numeric_limits<int64_t>::max();
  for (size_t c = 1; c < n; ++c)
    if (betweenLayers(c))
      least = std::min(least, crossing[c]);
  // One position per run of narrow positions: the fewest bytes, the first
  // on a tie.
  auto narrow = [&](size_t c) {
    return betweenLayers(c) && crossing[c] <= least;
  };
  std::vector<size_t> chosen;
  for (size_t c = 1; c < n; ++c) {
    if (!narrow(c))
      continue;
    if (chosen.empty() || !narrow(c - 1))
      chosen.push_back(c);
    else if (bytes[c] < bytes[chosen.back()])
      chosen.back() = c;
  }
  llvm::SetVector<Value> out;
  for (const Live &l : values) {
    // Live across position c when defined before it and read at or after.
    auto it = std::lower_bound(chosen.begin(), chosen.end(), l.from);
    if (it != chosen.end() && *it <= l.last)
      out.insert(l.value);
  }
  return out;
}

/// The stages - 1 candidates minimising (slowest stage, bytes crossing).
std::vector<size_t>
mlir::pcc::balanceStages(const CutProfile &p,
                         const std::vector<size_t> &candidates,
                         int64_t stages) {
  size_t k = candidates.size(), n = p.size();
  using Score = std::pair<double, int64_t>;
  const Score worst{std::numeric_limits<double>::infinity(), 0};
  // best[s][j]: s + 1 stages ending at candidate j (cut after stage s).
  std::vector<std::vector<Score>> best(stages, std::vector<Score>(k, worst));
  std::vector<std::vector<int>> from(stages, std::vector<int>(k, -1));
  auto better = [](Score a, Score b) {
    if (a.first != b.first)
      return a.first < b.first * (1 - 1e-12);
    return a.second < b.second;
  };
  for (size_t j = 0; j < k; ++j)
    best[0][j] = {p.seconds[candidates[j]], p.crossing[candidates[j]]};
  for (int64_t s = 1; s < stages - 1; ++s)
    for (size_t j = 0; j < k; ++j)
      for (size_t i = 0; i < j; ++i) {
        if (best[s - 1][i].first == worst.first)
          continue;
        double stage = p.seconds[candidates[j]] - p.seconds[candidates[i]];
        Score sc{std::max(best[s - 1][i].first, stage),
                 best[s - 1][i].second + p.crossing[candidates[j]]};
        if (better(sc, best[s][j])) {
          best[s][j] = sc;
          from[s][j] = static_cast<int>(i);
        }
      }
  // The last stage runs from the last cut to the end.
  Score total = worst;
  int last = -1;
  for (size_t j = 0; j < k; ++j) {
    if (best[stages - 2][j].first == worst.first)
      continue;
    Score sc{std::max(best[stages - 2][j].first,
                      p.seconds[n] - p.seconds[candidates[j]]),
             best[stages - 2][j].second};
    // On a tie the later cut: earlier stages take the extra layer, since
    // the last one usually also holds the head.
    if (last < 0 || !better(total, sc)) {
      total = sc;
      last = static_cast<int>(j);
    }
  }
  std::vector<size_t> cuts;
  for (int64_t s = stages - 2; s >= 0; --s) {
    cuts.push_back(candidates[last]);
    last = from[s][last];
  }
  std::reverse(cuts.begin(), cuts.end());
  return cuts;
}

/// Predicted seconds of each pipeline rank per micro-batch when stage k of
/// the cut `cuts` runs on rank k mod `ranks`.
std::vector<double> mlir::pcc::rankSeconds(const CutProfile &p,
                                           llvm::ArrayRef<size_t> cuts,
                                           int64_t ranks) {
  std::vector<double> out(ranks, 0);
  size_t begin = 0;
  for (size_t s = 0; s <= cuts.size(); ++s) {
    size_t end = s < cuts.size() ? cuts[s] : p.size();
    out[s % ranks] += p.seconds[end] - p.seconds[begin];
    begin = end;
  }
  return out;
}

/// With several chunks per rank, a rank's work per micro-batch is the sum
/// of its stages, and the busiest rank bounds the pipeline's rate. Starting
/// from the stage-balanced cuts, moves single cuts to neighbouring
/// candidates while that lowers (busiest rank, slowest stage, bytes).
void mlir::pcc::balanceRanks(const CutProfile &p,
                             const std::vector<size_t> &candidates,
                             std::vector<size_t> &cuts, int64_t ranks) {
  auto score = [&](const std::vector<size_t> &c) {
    std::vector<double> perRank = rankSeconds(p, c, ranks);
    double slowest = 0;
    int64_t bytes = 0;
    for (size_t s = 0; s <= c.size(); ++s) {
      size_t b = s ? c[s - 1] : 0, e = s < c.size() ? c[s] : p.size();
      slowest = std::max(slowest, p.seconds[e] - p.seconds[b]);
      if (s < c.size())
        bytes += p.crossing[c[s]];
    }
    return std::make_tuple(*std::max_element(perRank.begin(), perRank.end()),
                           slowest, bytes);
  };
  auto better = [](auto a, auto b) {
    if (std::get<0>(a) != std::get<0>(b))
      return std::get<0>(a) < std::get<0>(b) * (1 - 1e-12);
    if (std::get<1>(a) != std::get<1>(b))
      return std::get<1>(a) < std::get<1>(b) * (1 - 1e-12);
    return std::get<2>(a) < std::get<2>(b);
  };
  std::vector<size_t> at; // cuts as candidate indices
  for (size_t c : cuts)
    at.push_back(std::find(candidates.begin(), candidates.end(), c) -
                 candidates.begin());
  auto current = score(cuts);
  for (bool moved = true; moved;) {
    moved = false;
    for (size_t i = 0; i < at.size(); ++i)
      for (int step : {-1, 1}) {
        int64_t to = static_cast<int64_t>(at[i]) + step;
        int64_t lo = i ? static_cast<int64_t>(at[i - 1]) : -1;
        int64_t hi = i + 1 < at.size()
                         ? static_cast<int64_t>(at[i + 1])
                         : static_cast<int64_t>(candidates.size());
        if (to <= lo || to >= hi)
          continue;
        std::vector<size_t> trial = cuts;
        trial[i] = candidates[to];
        auto s = score(trial);
        if (better(s, current)) {
          current = s;
          cuts = std::move(trial);
          at[i] = to;
          moved = true;
        }
      }
  }
}
