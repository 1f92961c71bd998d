//===- ShardingRules.cpp - how layouts flow through pcc ops --------------===//
//
// For each op, the ways it can run given its operands' layouts (its
// "options"); propagateShardings picks, op by op, the option whose operand
// conversions and compute cost least. See Sharding.h.
//
//===----------------------------------------------------------------------===//

#include "pcc/Transforms/Sharding.h"

#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/FormatVariadic.h"

#include <limits>

using namespace mlir;
using namespace mlir::pcc;

ShardingAttr Shard::toAttr(MLIRContext *context, StringRef axis) const {
  switch (kind) {
  case ShardKind::replicated:
    return ShardingAttr::replicated(context);
  case ShardKind::partial:
    return ShardingAttr::partial(context, axis);
  case ShardKind::split:
    return ShardingAttr::split(context, axis, dim, stripes);
  }
  return {};
}

Shard Shard::fromAttr(ShardingAttr attr) {
  if (!attr || attr.isReplicated())
    return replicated();
  if (attr.isPartial())
    return partial();
  return split(attr.getDim(), attr.getStripes());
}

std::string Shard::describe() const {
  if (isReplicated())
    return "replicated";
  if (isPartial())
    return "partial sum";
  std::string s = "dim " + std::to_string(dim);
  if (stripes != 1)
    s += " in " + std::to_string(stripes) + " stripes";
  return s;
}

RankedTensorType mlir::pcc::localType(RankedTensorType type, Shard shard,
                                      int64_t ranks) {
  if (!shard.isSplit())
    return type;
  SmallVector<int64_t> shape(type.getShape());
  shape[shard.dim] /= ranks;
  return RankedTensorType::get(shape, type.getElementType());
}

const char *mlir::pcc::collectiveName(CollectiveKind kind) {
  switch (kind) {
  case CollectiveKind::AllReduce:
    return "all_reduce";
  case CollectiveKind::AllGather:
    return "all_gather";
  case CollectiveKind::ReduceScatter:
    return "reduce_scatter";
  }
  return "?";
}

int64_t ShardingPlan::commBytes() const {
  int64_t total = 0;
  for (const PlannedCollective &c : collectives)
    total += c.bytes;
  return total;
}

bool ShardingPlan::betterThan(const ShardingPlan &other) const {
  if (replicatedWeightBytes != other.replicatedWeightBytes)
    return replicatedWeightBytes < other.replicatedWeightBytes;
  return seconds() < other.seconds() * (1 - 1e-9);
}

static RankedTensorType typeOf(Value v) {
  return cast<RankedTensorType>(v.getType());
}

/// Whether `shard` can lay out a tensor of `type` over `ranks` ranks.
static bool fits(Shard shard, RankedTensorType type, int64_t ranks) {
  if (shard.isReplicated())
    return true;
  if (shard.isPartial())
    return isa<FloatType>(type.getElementType());
  return shard.dim >= 0 && shard.dim < type.getRank() && shard.stripes >= 1 &&
         type.getDimSize(shard.dim) % (shard.stripes * ranks) == 0;
}

llvm::MapVector<StringRef, RankedTensorType>
mlir::pcc::decisionWeights(func::FuncOp func) {
  llvm::MapVector<StringRef, RankedTensorType> weights;
  func.walk([&](ParamOp param) {
    if (param.getType().getRank() >= 2)
      weights.insert({param.getName(), param.getType()});
  });
  return weights;
}

std::vector<Shard> mlir::pcc::candidateShards(RankedTensorType type,
                                              int64_t ranks) {
  std::vector<Shard> out{Shard::replicated()};
  for (int64_t d = 0; d < type.getRank(); ++d) {
    int64_t size = type.getDimSize(d);
    if (size % ranks != 0)
      continue;
    for (int64_t s = 1; s <= size / ranks; ++s)
      if ((size / ranks) % s == 0)
        out.push_back(Shard::split(d, s));
  }
  return out;
}

//===----------------------------------------------------------------------===//
// Layout algebra
//===----------------------------------------------------------------------===//

namespace {

/// A split seen on the flattened tensor: element f belongs to rank
/// (f / block) mod ranks. Reshapes keep the flat order, so a split survives
/// a reshape exactly when some result dimension can express this block.
std::optional<Shard> reshapeSplit(ArrayRef<int64_t> in, ArrayRef<int64_t> out,
                                  Shard s, int64_t ranks) {
  int64_t inner = 1;
  for (size_t k = s.dim + 1; k < in.size(); ++k)
    inner *= in[k];
  int64_t chunk = in[s.dim] / (s.stripes * ranks);
  int64_t block = inner * chunk;
  int64_t innerOut = 1;
  for (int64_t e = static_cast<int64_t>(out.size()) - 1; e >= 0; --e) {
    if (block % innerOut == 0) {
      int64_t c = block / innerOut;
      if (out[e] % (c * ranks) == 0)
        return Shard::split(e, out[e] / (c * ranks));
    }
    innerOut *= out[e];
    if (innerOut > block)
      break;
  }
  return std::nullopt;
}

/// One way to run an op: the layout it reads each operand in and the
/// layouts of its results.
struct Option {
  SmallVector<Shard> operands, results;
};

class Propagator {
public:
  Propagator(func::FuncOp func, StringRef axis, int64_t ranks,
             const llvm::StringMap<Shard> &decisions, const CostModel &cost)
      : func(func), ranks(ranks), decisions(decisions), cost(cost) {
    plan.axis = axis.str();
    plan.ranks = ranks;
  }

  ShardingPlan run();

private:
  Shard of(Value v) const {
    auto it = plan.shards.find(v);
    return it == plan.shards.end() ? Shard::replicated() : it->second;
  }
  std::vector<Option> options(Operation *op);
  /// Seconds to bring `v` from its layout to `to`; infinity if impossible.
  double conversionSeconds(Value v, Shard to) const;
  void convert(Value v, Shard to);
  double collectiveSeconds(CollectiveKind kind, int64_t bytes) const {
    return cost.collectiveSeconds(kind, bytes, ranks);
  }
  double computeSeconds(Operation *op, const Option &option) const;

  func::FuncOp func;
  int64_t ranks;
  const llvm::StringMap<Shard> &decisions;
  CostModel cost;
  ShardingPlan plan;
  llvm::StringSet<> seenWeights;
  /// Conversions done already: (value, target layout) pairs.
  llvm::DenseSet<std::tuple<Value, int64_t, int64_t, int64_t>> done;
};

/// Whether a replicated `v` may be sliced: a function input, a weight or
/// constant, or a broadcast or reshape of one.
static bool sliceable(Value v) {
  Operation *def = v.getDefiningOp();
  if (!def)
    return true;
  if (isa<ParamOp, ConstantOp>(def))
    return true;
  if (isa<BroadcastOp, ReshapeOp>(def))
    return sliceable(def->getOperand(0));
  return false;
}

double Propagator::conversionSeconds(Value v, Shard to) const {
  Shard from = of(v);
  if (from == to ||
      done.contains({v, static_cast<int64_t>(to.kind), to.dim, to.stripes}))
    return 0;
  int64_t bytes = tensorBytes(v);
  if (to.isPartial())
    return std::numeric_limits<double>::infinity();
  if (to.isReplicated())
    return collectiveSeconds(from.isPartial() ? CollectiveKind::AllReduce
                                              : CollectiveKind::AllGather,
                             bytes);
  // A weight of rank >= 2 has the layout the plan decided: it is not sliced
  // on demand (that would be another decision).
  if (auto param = v.getDefiningOp<ParamOp>())
    if (param.getType().getRank() >= 2)
      return std::numeric_limits<double>::infinity();
  // A computed activation is never sliced: that would throw away work done
  // whole, and splitting it would split everything downstream (e.g. the
  // residual stream). Inputs, biases, constants and their broadcasts are.
  if (from.isReplicated() && !sliceable(v))
    return std::numeric_limits<double>::infinity();
  // To a split: slicing is local; a partial sum scatters; another split is
  // gathered first.
  double slice = static_cast<double>(bytes) / ranks / cost.bytesPerSecond;
  if (from.isReplicated())
    return slice;
  if (from.isPartial())
    return collectiveSeconds(CollectiveKind::ReduceScatter, bytes);
  return collectiveSeconds(CollectiveKind::AllGather, bytes) + slice;
}

void Propagator::convert(Value v, Shard to) {
  Shard from = of(v);
  double seconds = conversionSeconds(v, to);
  if (from == to ||
      !done.insert({v, static_cast<int64_t>(to.kind), to.dim, to.stripes})
           .second)
    return;
  plan.commSeconds += seconds;
  int64_t bytes = tensorBytes(v);
  if (to.isReplicated())
    plan.collectives.push_back({from.isPartial() ? CollectiveKind::AllReduce
                                                 : CollectiveKind::AllGather,
                                v, from, to, bytes});
  else if (from.isPartial())
    plan.collectives.push_back(
        {CollectiveKind::ReduceScatter, v, from, to, bytes});
  else if (from.isSplit()) {
    // Gathered whole, then sliced: the partition pass reuses the whole
    // value for any later reader that needs it replicated, so it is done.
    plan.collectives.push_back(
        {CollectiveKind::AllGather, v, from, Shard::replicated(), bytes});
    Shard whole = Shard::replicated();
    done.insert(
        {v, static_cast<int64_t>(whole.kind), whole.dim, whole.stripes});
  }
  // Replicated to split is a local slice.
}

/// The op's time on the whole tensors (CostModel::opSeconds), divided
/// over the ranks when the option splits its results (a partial sum
/// counts: each rank computes its share of it).
double Propagator::computeSeconds(Operation *op, const Option &option) const {
  bool divided = llvm::any_of(option.results,
                              [](const Shard &s) { return !s.isReplicated(); });
  double seconds = cost.opSeconds(op);
  return divided ? seconds / ranks : seconds;
}

//===----------------------------------------------------------------------===//
// Per-op options
//===----------------------------------------------------------------------===//

/// Whether a unary or product op keeps a partial-sum operand partial (the
/// other factors replicated).
static bool isLinearInPartial(Operation *op, unsigned operand) {
  if (isa<NegOp, MulOp>(op))
    return true;
  if (isa<DivOp>(op))
    return operand == 0;
  return false;
}

std::vector<Option> Propagator::options(Operation *op) {
  std::vector<Option> out;
  unsigned numOperands = op->getNumOperands(), numResults = op->getNumResults();
  SmallVector<Shard> in;
  for (Value v : op->getOperands())
    in.push_back(of(v));
  auto replicatedAll = [&]() {
    return Option{SmallVector<Shard>(numOperands, Shard::replicated()),
                  SmallVector<Shard>(numResults, Shard::replicated())};
  };
  auto add = [&](Option o) {
    for (auto [v, s] : llvm::zip(op->getOperands(), o.operands))
      if (!fits(s, typeOf(v), ranks))
        return;
    for (auto [v, s] : llvm::zip(op->getResults(), o.results))
      if (!fits(s, typeOf(v), ranks))
        return;
    out.push_back(std::move(o));
  };
  // Same-shape ops: follow any operand's split; partial sums pass through
  // the ops that are linear in them.
  auto sameShape = [&](bool linear) {
    SmallVector<Shard> seen;
    for (Shard s : in)
      if (s.isSplit() && !llvm::is_contained(seen, s)) {
        seen.push_back(s);
        add({SmallVector<Shard>(numOperands, s),
             SmallVector<Shard>(numResults, s)});
      }
    if (!linear)
      return;
    // p + p stays partial; p + replicated does not.
    if (isa<AddOp, SubOp>(op)) {
      if (llvm::all_of(in, [](Shard s) { return s.isPartial(); }))
        add({SmallVector<Shard>(numOperands, Shard::partial()),
             {Shard::partial()}});
      return;
    }
    for (unsigned i = 0; i < numOperands; ++i) {
      if (!in[i].isPartial() || !isLinearInPartial(op, i))
        continue;
      SmallVector<Shard> targets(numOperands, Shard::replicated());
      targets[i] = Shard::partial();
      add({targets, {Shard::partial()}});
    }
  };

  if (op->hasTrait<OpTrait::Elementwise>()) {
    sameShape(/*linear=*/isa<AddOp, SubOp, NegOp, MulOp, DivOp>(op));
  } else if (isa<CastOp>(op)) {
    sameShape(/*linear=*/false);
  } else if (auto t = dyn_cast<TransposeOp>(op)) {
    ArrayRef<int64_t> perm = t.getPermutation();
    if (in[0].isSplit())
      for (size_t j = 0; j < perm.size(); ++j)
        if (perm[j] == in[0].dim)
          add({{in[0]}, {Shard::split(j, in[0].stripes)}});
    if (in[0].isPartial())
      add({{in[0]}, {in[0]}});
  } else if (auto r = dyn_cast<ReshapeOp>(op)) {
    if (in[0].isSplit())
      if (auto s = reshapeSplit(typeOf(r.getInput()).getShape(),
                                r.getType().getShape(), in[0], ranks))
        add({{in[0]}, {*s}});
    if (in[0].isPartial())
      add({{in[0]}, {in[0]}});
  } else if (auto b = dyn_cast<BroadcastOp>(op)) {
    ArrayRef<int64_t> inShape = b.getInput().getType().getShape(),
                      outShape = b.getType().getShape();
    int64_t shift = outShape.size() - inShape.size();
    if (in[0].isSplit() && inShape[in[0].dim] == outShape[in[0].dim + shift])
      add({{in[0]}, {Shard::split(in[0].dim + shift, in[0].stripes)}});
    if (in[0].isPartial() &&
        b.getInput().getType().getNumElements() == b.getType().getNumElements())
      add({{in[0]}, {in[0]}});
  } else if (auto s = dyn_cast<SliceOp>(op)) {
    Shard x = in[0];
    if (x.isSplit()) {
      int64_t d = x.dim, size = s.getInput().getType().getDimSize(d);
      int64_t stripe = size / x.stripes;
      int64_t start = s.getStarts()[d], limit = s.getLimits()[d],
              step = s.getSteps()[d];
      if (start == 0 && limit == size && step == 1)
        add({{x}, {x}});
      else if (step == 1 && start % stripe == 0 && limit % stripe == 0 &&
               limit > start)
        add({{x}, {Shard::split(d, (limit - start) / stripe)}});
    }
    if (x.isPartial())
      add({{x}, {x}});
  } else if (auto s = dyn_cast<SplitOp>(op)) {
    Shard x = in[0];
    int64_t axis = s.getAxis();
    if (x.isSplit() && x.dim != axis)
      add({{x}, SmallVector<Shard>(numResults, x)});
    if (x.isSplit() && x.dim == axis) {
      int64_t stripe = s.getInput().getType().getDimSize(axis) / x.stripes;
      SmallVector<Shard> results;
      for (int64_t size : s.getSizes())
        if (size % stripe == 0)
          results.push_back(Shard::split(axis, size / stripe));
      if (results.size() == numResults)
        add({{x}, results});
    }
    if (x.isPartial())
      add({{x}, SmallVector<Shard>(numResults, x)});
  } else if (auto c = dyn_cast<ConcatOp>(op)) {
    int64_t axis = c.getAxis();
    for (Shard s : in)
      if (s.isSplit() && s.dim != axis)
        add({SmallVector<Shard>(numOperands, s), {s}});
    if (llvm::all_of(in, [](Shard s) { return s.isPartial(); }))
      add({in, {Shard::partial()}});
  } else if (isa<SoftmaxOp, LogSoftmaxOp>(op)) {
    int64_t axis = op->getAttrOfType<IntegerAttr>("axis").getInt();
    if (in[0].isSplit() && in[0].dim != axis)
      add({{in[0]}, {in[0]}});
  } else if (auto ln = dyn_cast<LayerNormOp>(op)) {
    if (in[0].isSplit() && in[0].dim < static_cast<int64_t>(ln.getAxis())) {
      SmallVector<Shard> targets(numOperands, Shard::replicated());
      targets[0] = in[0];
      add({targets, {in[0]}});
    }
  } else if (auto g = dyn_cast<GatherOp>(op)) {
    int64_t axis = g.getAxis();
    int64_t indexRank = g.getIndices().getType().getRank();
    if (in[1].isSplit())
      add({{Shard::replicated(), in[1]},
           {Shard::split(axis + in[1].dim, in[1].stripes)}});
    if (in[0].isSplit() && in[0].dim != axis) {
      int64_t d = in[0].dim < axis ? in[0].dim : in[0].dim - 1 + indexRank;
      add({{in[0], Shard::replicated()}, {Shard::split(d, in[0].stripes)}});
    }
    // A table split on the gathered axis: each rank looks up the indices in
    // its block and writes zeros for the rest (pcc.shard_gather), leaving a
    // partial sum: Megatron's vocabulary-parallel embedding.
    if (in[0].isSplit() && in[0].dim == axis && in[0].stripes == 1)
      add({{in[0], Shard::replicated()}, {Shard::partial()}});
  } else if (isa<ReduceSumOp, ReduceMeanOp, ReduceMaxOp, ReduceMinOp,
                 ReduceProdOp>(op)) {
    auto axes = op->getAttrOfType<DenseI64ArrayAttr>("axes").asArrayRef();
    bool keep = op->hasAttr("keep_dims");
    Shard x = in[0];
    if (x.isSplit() && !llvm::is_contained(axes, x.dim)) {
      int64_t d = x.dim;
      if (!keep)
        d -= llvm::count_if(axes, [&](int64_t a) { return a < x.dim; });
      add({{x}, {Shard::split(d, x.stripes)}});
    }
    bool linear = isa<ReduceSumOp, ReduceMeanOp>(op);
    if (x.isSplit() && llvm::is_contained(axes, x.dim) && isa<ReduceSumOp>(op))
      add({{x}, {Shard::partial()}});
    if (x.isPartial() && linear)
      add({{x}, {x}});
  } else if (auto mm = dyn_cast<MatmulOp>(op)) {
    int64_t ra = mm.getLhs().getType().getRank(),
            rb = mm.getRhs().getType().getRank(), r = mm.getType().getRank();
    int64_t mA = mm.getTransposeA() ? ra - 1 : ra - 2;
    int64_t kA = mm.getTransposeA() ? ra - 2 : ra - 1;
    int64_t kB = mm.getTransposeB() ? rb - 1 : rb - 2;
    int64_t nB = mm.getTransposeB() ? rb - 2 : rb - 1;
    Shard a = in[0], b = in[1];
    Shard rep = Shard::replicated();
    // Batch dimensions.
    for (int64_t d = 0; d < r - 2; ++d) {
      for (Shard s : {a, b}) {
        if (!s.isSplit() || s.dim != d || (rb == 2 && s == b))
          continue;
        add({{s, rb == 2 ? rep : s}, {s}});
      }
    }
    if (a.isSplit() && a.dim == mA)
      add({{a, rep}, {Shard::split(r - 2, a.stripes)}});
    if (b.isSplit() && b.dim == nB)
      add({{rep, b}, {Shard::split(r - 1, b.stripes)}});
    // A split contraction leaves each rank a partial sum.
    for (Shard s : {a, b}) {
      if (!s.isSplit())
        continue;
      if ((s == a && s.dim == kA) || (s == b && s.dim == kB && !(s == a)))
        add({{Shard::split(kA, s.stripes), Shard::split(kB, s.stripes)},
             {Shard::partial()}});
    }
    if (a.isPartial())
      add({{a, rep}, {a}});
    if (b.isPartial())
      add({{rep, b}, {b}});
  }
  // Replicated first: on a tie (a split operand whose whole value exists
  // already), keeping values whole avoids splitting the residual stream.
  out.insert(out.begin(), replicatedAll());
  return out;
}

ShardingPlan Propagator::run() {
  Block &block = func.getBody().front();
  for (BlockArgument arg : block.getArguments())
    plan.shards[arg] = Shard::replicated();
  for (Operation &op : block) {
    if (auto ret = dyn_cast<func::ReturnOp>(op)) {
      SmallVector<Shard> targets(ret.getNumOperands(), Shard::replicated());
      for (Value v : ret.getOperands())
        convert(v, Shard::replicated());
      plan.operandShards[&op] = targets;
      continue;
    }
    if (auto param = dyn_cast<ParamOp>(op)) {
      auto it = decisions.find(param.getName());
      Shard s = it == decisions.end() ? Shard::replicated() : it->second;
      plan.shards[param.getResult()] = s;
      continue;
    }
    if (isa<ConstantOp>(op)) {
      plan.shards[op.getResult(0)] = Shard::replicated();
      continue;
    }
    // Pick the cheapest option among those that keep a split or partial
    // sum some operand already has (splits start at weights).
    std::vector<Option> candidates = options(&op);
    const Option *best = nullptr;
    double bestSeconds = std::numeric_limits<double>::infinity();
    for (const Option &o : candidates) {
      bool fromOperand =
          llvm::all_of(o.results,
                       [](const Shard &s) { return s.isReplicated(); }) ||
          llvm::any_of(llvm::zip(op.getOperands(), o.operands), [&](auto p) {
            Shard s = std::get<1>(p);
            return !s.isReplicated() && of(std::get<0>(p)) == s;
          });
      if (!fromOperand)
        continue;
      double seconds = computeSeconds(&op, o);
      for (auto [v, s] : llvm::zip(op.getOperands(), o.operands))
        seconds += conversionSeconds(v, s);
      if (seconds < bestSeconds) {
        bestSeconds = seconds;
        best = &o;
      }
    }
    for (auto [v, s] : llvm::zip(op.getOperands(), best->operands))
      convert(v, s);
    plan.computeSeconds += computeSeconds(&op, *best);
    plan.operandShards[&op] = best->operands;
    for (auto [v, s] : llvm::zip(op.getResults(), best->results))
      plan.shards[v] = s;
  }

  // Weight memory: a weight counts whole on every rank unless every op reads
  // it split; whole weights of rank >= 2 are the plan's replicated bytes.
  func.walk([&](ParamOp param) {
    Value v = param.getResult();
    bool split =
        !v.use_empty() && llvm::all_of(v.getUses(), [&](OpOperand &use) {
          auto it = plan.operandShards.find(use.getOwner());
          return it != plan.operandShards.end() &&
                 it->second[use.getOperandNumber()].isSplit();
        });
    if (!seenWeights.insert(param.getName()).second)
      return;
    int64_t bytes = tensorBytes(v);
    plan.weightBytesPerRank += split ? bytes / ranks : bytes;
    if (!split && param.getType().getRank() >= 2)
      plan.replicatedWeightBytes += bytes;
  });
  return std::move(plan);
}

} // namespace

ShardingPlan
mlir::pcc::propagateShardings(func::FuncOp func, StringRef axis, int64_t ranks,
                              const llvm::StringMap<Shard> &decisions,
                              const CostModel &cost) {
  return Propagator(func, axis, ranks, decisions, cost).run();
}
