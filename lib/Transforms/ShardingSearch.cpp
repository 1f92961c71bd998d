//===- ShardingSearch.cpp - the planner's search over weight layouts -----===//
//
// Two ideas keep the search both good and linear in depth:
//
// - Weight classes. Weights whose place in the program looks the same
//   (a structural hash of the ops around each use, a few levels up and
//   down, names ignored) share one decision: the query projections of
//   layers 1..L-2 of a transformer are one class. A move changes a whole
//   class, so the number of moves does not grow with depth, and each move
//   costs one propagation (linear in the program).
//
// - Group moves (Megatron's blocks). Splitting one weight by columns alone
//   rarely pays: its output has to be gathered again. The group move splits
//   a class by columns, then follows the split: every matmul whose weight is
//   still whole and whose input now arrives split on its contraction
//   dimension takes its weight split by rows (the attention output or
//   second MLP projection), and every matmul reading the same input as the
//   first (K and V beside Q, up beside gate) is split by columns too. The
//   group is then judged as one move.
//
// After the group moves, single-class moves refine the plan (coordinate
// descent, matmul weights first, then lookups), over the layouts whose
// stripes match a cut the program makes.
//
//===----------------------------------------------------------------------===//

#include "pcc/Transforms/Sharding.h"

#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/Hashing.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/ADT/StringSet.h"

#include <algorithm>

using namespace mlir;
using namespace mlir::pcc;

namespace {

/// The op's own structure: name, attributes (weight names and layouts
/// left out) and result types.
size_t localHash(Operation *op) {
  llvm::hash_code h = llvm::hash_value(op->getName().getStringRef());
  bool isParam = isa<ParamOp>(op);
  for (NamedAttribute a : op->getAttrs()) {
    if ((isParam && a.getName() == "name") ||
        a.getName() == PccDialect::kShardingAttrName)
      continue;
    h = llvm::hash_combine(h, a.getName().getAsOpaquePointer(),
                           a.getValue().getAsOpaquePointer());
  }
  for (Type t : op->getResultTypes())
    h = llvm::hash_combine(h, t.getAsOpaquePointer());
  return h;
}

} // namespace

WeightClasses mlir::pcc::classifyWeights(func::FuncOp func, int depth) {
  Block &block = func.getBody().front();
  SmallVector<Operation *> ops;
  for (Operation &op : block)
    ops.push_back(&op);
  llvm::DenseMap<Operation *, size_t> local, up, down;
  for (Operation *op : ops)
    local[op] = up[op] = down[op] = localHash(op);
  // up: the op and what it reads, `depth` levels; down: the op and its
  // readers, `depth` levels.
  for (int level = 0; level < depth; ++level) {
    llvm::DenseMap<Operation *, size_t> nextUp, nextDown;
    for (Operation *op : ops) {
      llvm::hash_code h = local[op];
      for (Value v : op->getOperands()) {
        if (Operation *def = v.getDefiningOp())
          h = llvm::hash_combine(h, up.lookup(def),
                                 cast<OpResult>(v).getResultNumber());
        else
          h = llvm::hash_combine(h, cast<BlockArgument>(v).getArgNumber());
      }
      nextUp[op] = h;
      SmallVector<size_t> readers;
      // A value returned is hashed without its position in the return: a
      // training forward phase returns every layer's saved activations,
      // each at its own position, and hashing that position gave every
      // layer its own classes (98 for 16 Llama layers against 23 in
      // inference), which made the search quadratic in depth.
      for (OpResult r : op->getResults())
        for (OpOperand &use : r.getUses())
          readers.push_back(llvm::hash_combine(
              down.lookup(use.getOwner()),
              isa<func::ReturnOp>(use.getOwner()) ? 0 : use.getOperandNumber(),
              r.getResultNumber()));
      llvm::sort(readers);
      nextDown[op] = llvm::hash_combine(
          local[op], llvm::hash_combine_range(readers.begin(), readers.end()));
    }
    up = std::move(nextUp);
    down = std::move(nextDown);
  }

  WeightClasses out;
  auto weights = decisionWeights(func);
  // A weight's signature: its type and, for every use, the user's
  // structure up and down.
  llvm::StringMap<SmallVector<size_t>> uses;
  func.walk([&](ParamOp param) {
    if (!weights.count(param.getName()))
      return;
    auto &list = uses[param.getName()];
    for (OpOperand &use : param.getResult().getUses())
      list.push_back(llvm::hash_combine(up.lookup(use.getOwner()),
                                        down.lookup(use.getOwner()),
                                        use.getOperandNumber()));
  });
  llvm::DenseMap<size_t, unsigned> bySignature;
  for (auto &w : weights) {
    SmallVector<size_t> list = uses.lookup(w.first);
    llvm::sort(list);
    size_t signature =
        llvm::hash_combine(w.second.getAsOpaquePointer(),
                           llvm::hash_combine_range(list.begin(), list.end()));
    auto [it, inserted] = bySignature.try_emplace(signature, out.size());
    if (inserted)
      out.members.emplace_back();
    out.members[it->second].push_back(w.first);
    out.classOf[w.first] = it->second;
  }
  return out;
}

//===----------------------------------------------------------------------===//
// The search
//===----------------------------------------------------------------------===//

namespace {

/// A matmul whose right-hand side is a decision weight.
struct WeightMatmul {
  mutable MatmulOp op;
  StringRef weight;
  int64_t kB, nB; // the weight's contraction and output dimensions
  int64_t kA;     // the input's contraction dimension
};

class Search {
public:
  Search(func::FuncOp func, StringRef axis, int64_t ranks)
      : func(func), axis(axis), ranks(ranks), weights(decisionWeights(func)),
        classes(classifyWeights(func)) {
    for (auto &w : weights)
      decisions[w.first] = Shard::replicated();
    func.walk([&](MatmulOp mm) {
      ParamOp param = weightParamOf(mm.getRhs());
      if (!param || !weights.count(param.getName()) ||
          param.getType().getRank() != 2)
        return;
      int64_t ra = mm.getLhs().getType().getRank();
      matmuls.push_back({mm, param.getName(), mm.getTransposeB() ? 1 : 0,
                         mm.getTransposeB() ? 0 : 1,
                         mm.getTransposeA() ? ra - 2 : ra - 1});
    });
    // The stripe counts worth trying: one, and the number of equal pieces
    // the program cuts a dimension into (a fused QKV's split or three
    // slices; at most 16: a one-token slice of a sequence is not a fused
    // projection). Any other count cuts where nothing in the program does, and
    // trying every divisor made a 70B layer's classes ~40 trials each.
    stripeChoices.insert(1);
    func.walk([&](Operation *op) {
      if (auto split = dyn_cast<SplitOp>(op)) {
        if (llvm::all_equal(split.getSizes()))
          stripeChoices.insert(static_cast<int64_t>(split.getSizes().size()));
      } else if (auto slice = dyn_cast<SliceOp>(op)) {
        ArrayRef<int64_t> shape = slice.getInput().getType().getShape();
        for (auto [d, size] : llvm::enumerate(shape)) {
          int64_t width = slice.getLimits()[d] - slice.getStarts()[d];
          if (slice.getSteps()[d] == 1 && width > 0 && width < size &&
              size % width == 0 && size / width <= 16)
            stripeChoices.insert(size / width);
        }
      }
    });
    best = evaluate(decisions);
  }

  SearchResult run();

private:
  ShardingPlan evaluate(const llvm::StringMap<Shard> &trial) {
    ++result.evaluations;
    return propagateShardings(func, axis, ranks, trial);
  }
  void setClass(llvm::StringMap<Shard> &trial, StringRef weight, Shard s) {
    for (StringRef member : classes.members[classes.classOf.lookup(weight)])
      trial[member] = s;
  }
  bool fits(StringRef weight, Shard s) const {
    return layoutFits(s, weights.lookup(weight), ranks);
  }
  /// Takes `trial` if its plan beats the best one.
  bool offer(llvm::StringMap<Shard> trial, ShardingPlan *known = nullptr) {
    ShardingPlan plan = known ? std::move(*known) : evaluate(trial);
    if (!plan.betterThan(best))
      return false;
    best = std::move(plan);
    decisions = std::move(trial);
    return true;
  }
  /// Splits by rows every whole weight whose matmul now reads its input
  /// split on the contraction; returns the plan of the final `trial`.
  ShardingPlan followSplit(llvm::StringMap<Shard> &trial);
  void groupMoves();
  void coordinateDescent();

  func::FuncOp func;
  StringRef axis;
  int64_t ranks;
  llvm::MapVector<StringRef, RankedTensorType> weights;
  WeightClasses classes;
  std::vector<WeightMatmul> matmuls;
  /// Stripe counts the coordinate descent tries (the constructor's).
  llvm::SmallSetVector<int64_t, 4> stripeChoices;
  /// Classes a group move decided to keep whole.
  llvm::DenseSet<unsigned> frozen;
  llvm::StringMap<Shard> decisions;
  ShardingPlan best;
  SearchResult result;
};

/// The stripes a column split of `m`'s weight needs so that each piece of
/// a following split (a fused QKV cut into Q, K and V) stays on one rank.
int64_t columnStripes(const WeightMatmul &m) {
  Value v = m.op.getResult();
  // Look through a bias add and reshapes to the split.
  for (int hops = 0; hops < 4 && v.hasOneUse(); ++hops) {
    Operation *user = *v.getUsers().begin();
    if (auto split = dyn_cast<SplitOp>(user)) {
      ArrayRef<int64_t> sizes = split.getSizes();
      bool equal = llvm::all_equal(sizes);
      return equal ? static_cast<int64_t>(sizes.size()) : 1;
    }
    if (!isa<AddOp, ReshapeOp>(user))
      break;
    v = user->getResult(0);
  }
  return 1;
}

ShardingPlan Search::followSplit(llvm::StringMap<Shard> &trial) {
  for (int round = 0;; ++round) {
    ShardingPlan plan = evaluate(trial);
    bool changed = false;
    for (const WeightMatmul &m : matmuls) {
      if (!trial.lookup(m.weight).isReplicated())
        continue;
      Shard in = plan.shards.lookup(m.op.getLhs());
      if (!in.isSplit() || in.dim != m.kA)
        continue;
      Shard rows = Shard::split(m.kB, in.stripes);
      if (!fits(m.weight, rows))
        continue;
      setClass(trial, m.weight, rows);
      changed = true;
    }
    if (!changed || round == 3)
      return changed ? evaluate(trial) : plan;
  }
}

/// The activations a plan all-gathers. A weight gathered for a reader that
/// needs it whole is not counted: the whole-bytes term of betterThan
/// already weighs it, and counting it made a group move on tied classes
/// (one class for a role in every layer) keep K and V whole. Splitting
/// layer 0's attention with its siblings sets the O class to rows in
/// every layer, whose other layers' weights are gathered until their own
/// move; the variant without siblings then won, froze K and V whole, and
/// the search ended gathering around every block.
static int64_t countGathers(const ShardingPlan &plan) {
  return llvm::count_if(plan.collectives, [](const PlannedCollective &c) {
    return c.kind == CollectiveKind::AllGather && !weightParamOf(c.value);
  });
}

/// Between two variants of one group move: fewer all-gathers, then fewer
/// whole weight bytes, then less time.
static bool preferredVariant(const ShardingPlan &a, const ShardingPlan &b) {
  if (countGathers(a) != countGathers(b))
    return countGathers(a) < countGathers(b);
  return a.betterThan(b);
}

void Search::groupMoves() {
  // One try per class: a class's group move sets the whole class, so
  // trying it again from another member would repeat the same trial.
  llvm::DenseSet<unsigned> tried;
  for (const WeightMatmul &first : matmuls) {
    unsigned cls = classes.classOf.lookup(first.weight);
    if (!decisions.lookup(first.weight).isReplicated() ||
        frozen.contains(cls) || !tried.insert(cls).second)
      continue;
    Shard column = Shard::split(first.nB, columnStripes(first));
    if (!fits(first.weight, column))
      continue;
    // Two variants: with the siblings (weights applied to the same input:
    // K and V beside Q, the MLP of a parallel block) split by columns too,
    // or kept whole (key and value heads fewer than the ranks, replicated
    // as Megatron does). A Megatron block gathers no activation inside:
    // the variant with fewer all-gathers wins, then the one that keeps
    // fewer weights whole, then the faster.
    std::optional<std::pair<llvm::StringMap<Shard>, ShardingPlan>> chosen;
    for (bool withSiblings : {true, false}) {
      llvm::StringMap<Shard> trial = decisions;
      setClass(trial, first.weight, column);
      bool anySibling = false;
      for (const WeightMatmul &m : matmuls) {
        Shard s = Shard::split(m.nB, columnStripes(m));
        if (m.op.getLhs() == first.op.getLhs() && m.weight != first.weight &&
            trial.lookup(m.weight).isReplicated() && fits(m.weight, s)) {
          anySibling = true;
          if (withSiblings)
            setClass(trial, m.weight, s);
        }
      }
      if (!withSiblings && !anySibling)
        break;
      ShardingPlan plan = followSplit(trial);
      if (!chosen || preferredVariant(plan, chosen->second))
        chosen.emplace(std::move(trial), std::move(plan));
    }
    // Siblings the faster variant keeps whole stay whole: splitting them
    // alone would save their bytes but cost the collectives the variant
    // avoided.
    SmallVector<unsigned> keptWhole;
    for (const WeightMatmul &m : matmuls)
      if (m.op.getLhs() == first.op.getLhs() && m.weight != first.weight &&
          chosen->first.lookup(m.weight).isReplicated())
        keptWhole.push_back(classes.classOf.lookup(m.weight));
    llvm::StringMap<Shard> trial = std::move(chosen->first);
    ShardingPlan plan = std::move(chosen->second);
    SmallVector<StringRef> changedWeights;
    for (auto &w : weights)
      if (trial.lookup(w.first) != decisions.lookup(w.first))
        changedWeights.push_back(w.first);
    int64_t beforeBytes = best.replicatedWeightBytes,
            beforeComm = best.commBytes();
    double beforeSeconds = best.seconds();
    if (offer(std::move(trial), &plan)) {
      frozen.insert(keptWhole.begin(), keptWhole.end());
      GroupMove move;
      for (StringRef w : changedWeights)
        move.weights.push_back({w, decisions.lookup(w)});
      move.replicatedBytesSaved = beforeBytes - best.replicatedWeightBytes;
      move.commBytesAdded = best.commBytes() - beforeComm;
      move.secondsAdded = best.seconds() - beforeSeconds;
      result.groups.push_back(std::move(move));
    }
  }
}

void Search::coordinateDescent() {
  // Matmul weights first, so that the layers settle before lookups
  // (embeddings) join in: an embedding split first would split the
  // residual stream and trap the descent in plans that gather around every
  // block.
  llvm::StringSet<> layerWeights;
  func.walk([&](MatmulOp mm) {
    for (Value v : mm->getOperands())
      if (ParamOp p = weightParamOf(v))
        layerWeights.insert(p.getName());
  });
  for (int phase = 0; phase < 2; ++phase) {
    for (int sweep = 0; sweep < 8; ++sweep) {
      bool improved = false;
      for (const auto &members : classes.members) {
        StringRef w = members.front();
        if ((phase == 0 && !layerWeights.contains(w)) ||
            frozen.contains(classes.classOf.lookup(w)))
          continue;
        for (Shard candidate : candidateShards(weights.lookup(w), ranks)) {
          if (candidate == decisions.lookup(w) ||
              (candidate.isSplit() &&
               !stripeChoices.contains(candidate.stripes)))
            continue;
          llvm::StringMap<Shard> trial = decisions;
          setClass(trial, w, candidate);
          improved |= offer(std::move(trial));
        }
      }
      if (!improved)
        break;
    }
  }
}

SearchResult Search::run() {
  if (ranks > 1) {
    groupMoves();
    coordinateDescent();
  }
  result.decisions = decisions;
  result.plan = std::move(best);
  result.classes = std::move(classes);
  return std::move(result);
}

} // namespace

SearchResult mlir::pcc::searchShardings(func::FuncOp func, StringRef axis,
                                        int64_t ranks) {
  return Search(func, axis, ranks).run();
}
