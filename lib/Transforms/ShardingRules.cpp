//===- ShardingRules.cpp - how layouts flow through pcc ops --------------===//
//
// propagateShardings walks a function once and picks, op by op, among the
// ways the op can run given its operands' layouts (its ShardingOpInterface
// options) the one whose operand conversions and compute cost least. See
// Sharding.h.
//
//===----------------------------------------------------------------------===//

#include "pcc/Dialect/Pcc/IR/Contracts.h"
#include "pcc/Transforms/Sharding.h"

#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/FormatVariadic.h"

#include <functional>
#include <limits>

using namespace mlir;
using namespace mlir::pcc;

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

ParamOp mlir::pcc::weightParamOf(Value v) {
  while (auto c = v.getDefiningOp<CastOp>())
    v = c.getInput();
  return v.getDefiningOp<ParamOp>();
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
  for (int64_t d = 0; ranks >= 1 && d < type.getRank(); ++d) {
    int64_t size = type.getDimSize(d);
    if (size <= 0 || size % ranks != 0)
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

using Option = ShardingOption;

class Propagator {
public:
  Propagator(func::FuncOp func, StringRef axis, int64_t ranks,
             const llvm::StringMap<Shard> &decisions, const CostModel &cost,
             ArrayRef<Shard> argLayouts,
             ArrayRef<std::optional<Shard>> resultLayouts)
      : func(func), ranks(ranks), decisions(decisions), cost(cost),
        argLayouts(argLayouts), resultLayouts(resultLayouts) {
    plan.axis = axis.str();
    plan.ranks = ranks;
    if (auto module = func->getParentOfType<ModuleOp>())
      sequenceParallel = axis == kTensorParallelAxis &&
                         module->hasAttr(kSequenceParallelAttrName);
  }

  ShardingPlan run();

private:
  Shard of(Value v) const {
    auto it = plan.shards.find(v);
    return it == plan.shards.end() ? Shard::replicated() : it->second;
  }
  std::vector<Option> options(Operation *op);
  /// The op's own options for operand layouts `in` (not the current ones),
  /// those that divide the shapes.
  SmallVector<Option> optionsFor(Operation *op, ArrayRef<Shard> in);
  /// Whether option `o`'s layouts divide the shapes of `op`'s values.
  bool fits(Operation *op, const Option &o) const {
    auto fitsAll = [&](ValueRange values, ArrayRef<Shard> shards) {
      return values.size() == shards.size() &&
             llvm::all_of(llvm::zip(values, shards), [&](auto p) {
               return layoutFits(std::get<1>(p), typeOf(std::get<0>(p)), ranks);
             });
    };
    return fitsAll(op->getOperands(), o.operands) &&
           fitsAll(op->getResults(), o.results);
  }
  /// Values an in-place state update reads (a weight's gradient) and the
  /// layout of the state it updates: the op that makes one, read by nothing
  /// else, may run split so that it computes only this rank's piece.
  llvm::DenseMap<Value, Shard> demanded;
  /// Seconds to bring `v` from its layout to `to`; infinity if impossible.
  /// `consumer` is the op that reads `v` in layout `to` (null for the
  /// function's results).
  double conversionSeconds(Value v, Shard to, Operation *consumer) const;
  void convert(Value v, Shard to, Operation *consumer);
  double collectiveSeconds(CollectiveKind kind, int64_t bytes) const {
    return cost.collectiveSeconds(kind, bytes, ranks);
  }
  double computeSeconds(Operation *op, const Option &option) const;
  double partialFanOutSeconds(Operation *op, const Option &option) const;

  func::FuncOp func;
  int64_t ranks;
  const llvm::StringMap<Shard> &decisions;
  CostModel cost;
  ArrayRef<Shard> argLayouts;
  /// Where given, the layout a result is returned in (a pipeline stage's
  /// cotangents under --sp, in the layout their activations came in).
  ArrayRef<std::optional<Shard>> resultLayouts;
  /// --sp: activations [batch, sequence, hidden] may be split along the
  /// sequence (Megatron's sequence parallelism).
  bool sequenceParallel = false;
  /// The token dimensions (any but the last) along which the phase's
  /// arguments of `v`'s shape are split (the saved residual stream), in
  /// argument order, each once. Shapes, not types: under mixed precision
  /// a bf16 partial product is widened by a cast to the f32 stream.
  SmallVector<int64_t> argTokenDims(Value v) {
    RankedTensorType type = typeOf(v);
    SmallVector<int64_t> dims;
    for (BlockArgument arg : func.getArguments()) {
      if (typeOf(arg).getShape() != type.getShape())
        continue;
      auto it = plan.shards.find(arg);
      if (it != plan.shards.end() && it->second.isSplit() &&
          it->second.dim < type.getRank() - 1 &&
          !llvm::is_contained(dims, it->second.dim))
        dims.push_back(it->second.dim);
    }
    return dims;
  }
  /// Under --sp: the first of `argTokenDims(v)` that divides `v` over the
  /// ranks; none otherwise.
  std::optional<Shard> streamSplit(Value v) {
    for (int64_t d : argTokenDims(v))
      if (typeOf(v).getDimSize(d) % ranks == 0)
        return Shard::split(d, 1);
    return std::nullopt;
  }
  /// Whether `to` splits `v` along a token dimension (any but the last,
  /// the hidden one: [batch, sequence, hidden], or [batch x sequence,
  /// hidden] as exporters flatten it for a Gemm).
  static bool alongTokens(Value v, Shard to) {
    int64_t rank = typeOf(v).getRank();
    return to.isSplit() && to.stripes == 1 && rank >= 2 && to.dim < rank - 1;
  }
  ShardingPlan plan;
  llvm::StringSet<> seenWeights;
  /// Conversions done already: (value, target layout) pairs.
  llvm::DenseSet<std::tuple<Value, int64_t, int64_t, int64_t>> done;
  bool sliceable(Value v) const;
  /// Values computed from some weight of rank >= 2 on the way (vectors
  /// such as a rotary embedding's inverse frequencies do not count: the
  /// tables computed from them are like inputs).
  llvm::DenseSet<Value> readsWeights;
};

/// Whether a replicated `v` may be sliced: anything computed from inputs,
/// constants and vectors alone, a weight, or a broadcast or reshape of
/// one (a bias broadcast to its matmul's output).
bool Propagator::sliceable(Value v) const {
  if (!readsWeights.contains(v))
    return true;
  Operation *def = v.getDefiningOp();
  if (isa<ParamOp>(def))
    return true;
  if (isa<BroadcastOp, ReshapeOp>(def))
    return sliceable(def->getOperand(0));
  return false;
}

/// Whether `consumer` is a batched product of two activations (attention's
/// scores and context) reading an operand split on a batch dimension
/// `to`: the other operand may then be sliced even when it was computed
/// from weights, as Megatron does with key and value heads replicated over
/// more ranks than there are heads (every rank computes them all and uses
/// its queries' share).
static bool slicesBatchOfProduct(Operation *consumer, Shard to) {
  auto mm = dyn_cast_or_null<MatmulOp>(consumer);
  if (!mm || !to.isSplit())
    return false;
  int64_t ra = mm.getLhs().getType().getRank(),
          rb = mm.getRhs().getType().getRank();
  return ra >= 3 && rb >= 3 && to.dim < ra - 2;
}

/// Whether `v` is a broadcast whose split dimension `to` is one the
/// broadcast creates (a new leading dimension or one of size 1): each
/// rank's piece is a smaller broadcast, and no work is thrown away.
static bool broadcastAlong(Value v, Shard to) {
  auto b = v.getDefiningOp<BroadcastOp>();
  if (!b || !to.isSplit())
    return false;
  int64_t shift = b.getType().getRank() - b.getInput().getType().getRank();
  int64_t d = to.dim - shift;
  return d < 0 || b.getInput().getType().getDimSize(d) == 1;
}

/// Carrying a partial sum through an op whose partial operand other ops
/// read too leaves two partial sums to reduce where one would do (the
/// backward phase's layer-norm input gradient, read by the gradients of
/// the norm's input and of its weight): such an option pays for reducing
/// its result as well (a reduce-scatter under --sp, an all-reduce
/// without), so that reducing the operand once, here, wins. Without --sp
/// the bundled GPT's backward at tp 2 made 27 all-reduces, 7 with it.
double Propagator::partialFanOutSeconds(Operation *op,
                                        const Option &option) const {
  bool fansOut =
      llvm::any_of(llvm::zip(op->getOperands(), option.operands), [&](auto p) {
        Value v = std::get<0>(p);
        return std::get<1>(p).isPartial() && of(v).isPartial() &&
               llvm::is_contained(op->getResultTypes(), v.getType()) &&
               llvm::any_of(v.getUsers(),
                            [&](Operation *user) { return user != op; });
      });
  if (!fansOut)
    return 0;
  double seconds = 0;
  for (auto [result, shard] : llvm::zip(op->getResults(), option.results))
    if (shard.isPartial())
      seconds +=
          collectiveSeconds(sequenceParallel ? CollectiveKind::ReduceScatter
                                             : CollectiveKind::AllReduce,
                            tensorBytes(result));
  return seconds;
}

double Propagator::conversionSeconds(Value v, Shard to,
                                     Operation *consumer) const {
  Shard from = of(v);
  if (from == to ||
      done.contains({v, static_cast<int64_t>(to.kind), to.dim, to.stripes}))
    return 0;
  int64_t bytes = tensorBytes(v);
  if (to.isPartial())
    return std::numeric_limits<double>::infinity();
  if (to.isReplicated()) {
    double seconds =
        collectiveSeconds(from.isPartial() ? CollectiveKind::AllReduce
                                           : CollectiveKind::AllGather,
                          bytes);
    // (A weight read through autocast's cast to 16 bits is still the
    // weight.)
    if (ParamOp param = weightParamOf(v);
        param && param.getType().getRank() >= 2)
      seconds *= cost.weightGatherFactor;
    return seconds;
  }
  // A weight of rank >= 2 has the layout the plan decided: it is not sliced
  // on demand (that would be another decision), nor is its 16-bit cast
  // (slicing the cast made a column split of an MLP under bf16 look free
  // where it is not, and the search kept every MLP weight split by rows).
  if (ParamOp param = weightParamOf(v))
    if (param.getType().getRank() >= 2)
      return std::numeric_limits<double>::infinity();
  // An activation computed from weights is never sliced: that would throw
  // away work done whole, and splitting it would split everything
  // downstream (e.g. the residual stream). Inputs, weights, constants and
  // what is computed from inputs and constants alone (masks, positions,
  // rotary tables) are: every rank has them whole and takes its part.
  // Sequence parallelism splits the residual stream along the sequence:
  // the norms and elementwise ops between the tensor-parallel blocks run
  // on a part of the sequence, and a block's partial sum is
  // reduce-scattered into that split instead of all-reduced.
  bool alongSequence = sequenceParallel && alongTokens(v, to);
  if (from.isReplicated() && !sliceable(v) && !alongSequence &&
      !slicesBatchOfProduct(consumer, to) && !broadcastAlong(v, to))
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

void Propagator::convert(Value v, Shard to, Operation *consumer) {
  Shard from = of(v);
  double seconds = conversionSeconds(v, to, consumer);
  if (from == to ||
      !done.insert({v, static_cast<int64_t>(to.kind), to.dim, to.stripes})
           .second)
    return;
  plan.commSeconds += seconds;
  int64_t bytes = tensorBytes(v);
  if (to.isReplicated())
    plan.collectives.push_back({from.isPartial() ? CollectiveKind::AllReduce
                                                 : CollectiveKind::AllGather,
                                v, consumer, from, to, bytes});
  else if (from.isPartial())
    plan.collectives.push_back(
        {CollectiveKind::ReduceScatter, v, consumer, from, to, bytes});
  else if (from.isSplit()) {
    // Gathered whole, then sliced: the partition pass reuses the whole
    // value for any later reader that needs it replicated, so it is done.
    plan.collectives.push_back({CollectiveKind::AllGather, v, consumer, from,
                                Shard::replicated(), bytes});
    Shard whole = Shard::replicated();
    done.insert(
        {v, static_cast<int64_t>(whole.kind), whole.dim, whole.stripes});
  }
  // Replicated to split is a local slice.
}

/// The op's time on the whole tensors (CostModel::opSeconds), divided
/// over the ranks when the option reads some operand split (each rank
/// works on its share). An op that only carries partial sums through
/// (p * scale) does the whole work on every rank.
double Propagator::computeSeconds(Operation *op, const Option &option) const {
  bool divided =
      llvm::any_of(option.operands, [](const Shard &s) { return s.isSplit(); });
  double seconds = cost.opSeconds(op);
  return divided ? seconds / ranks : seconds;
}

/// The op's options (ShardingOpInterface) whose layouts divide the shapes,
/// after running whole, which every op can.
std::vector<Option> Propagator::options(Operation *op) {
  unsigned numOperands = op->getNumOperands(), numResults = op->getNumResults();
  // Replicated first: on a tie (a split operand whose whole value exists
  // already), keeping values whole avoids splitting the residual stream.
  std::vector<Option> out{
      Option{SmallVector<Shard>(numOperands, Shard::replicated()),
             SmallVector<Shard>(numResults, Shard::replicated())}};
  auto sharding = dyn_cast<ShardingOpInterface>(op);
  if (!sharding)
    return out;
  SmallVector<Shard> in;
  for (Value v : op->getOperands())
    in.push_back(of(v));
  SmallVector<Option> candidates;
  sharding.getShardingOptions(in, ranks, candidates);
  // --sp: an op that reads a partial sum may also run split along a token
  // dimension of its result, on the operands of the result's shape split
  // the same way (the op's own rule for such operands), so that the
  // partial sum is reduce-scattered there instead of all-reduced.
  if (sequenceParallel && op->getNumResults() == 1 &&
      llvm::any_of(op->getOperands(),
                   [&](Value v) { return of(v).isPartial(); })) {
    Value result = op->getResult(0);
    // The token dimensions along which the phase's arguments of the
    // result's shape are split (the saved residual stream), then the
    // innermost (the sequence of [batch, sequence, hidden]): on a tie the
    // first is kept, so the residual stream keeps one split.
    auto sameShape = [&](Value v) {
      return typeOf(v).getShape() == typeOf(result).getShape();
    };
    SmallVector<int64_t> dims = argTokenDims(result);
    for (int64_t d = typeOf(result).getRank() - 2; d >= 0; --d)
      if (!llvm::is_contained(dims, d))
        dims.push_back(d);
    for (int64_t d : dims) {
      Shard tokens = Shard::split(d, 1);
      SmallVector<Shard> split;
      for (Value v : op->getOperands())
        split.push_back(sameShape(v) ? tokens : of(v));
      SmallVector<Option> more;
      sharding.getShardingOptions(split, ranks, more);
      for (Option &o : more)
        if (o.results.size() == 1 && o.results[0] == tokens &&
            llvm::all_of(llvm::zip(op->getOperands(), o.operands), [&](auto p) {
              return !sameShape(std::get<0>(p)) || std::get<1>(p) == tokens;
            }))
          candidates.push_back(std::move(o));
    }
  }
  for (Option &o : candidates)
    if (fits(op, o))
      out.push_back(std::move(o));
  return out;
}

SmallVector<Option> Propagator::optionsFor(Operation *op, ArrayRef<Shard> in) {
  SmallVector<Option> out;
  auto sharding = dyn_cast<ShardingOpInterface>(op);
  if (!sharding)
    return out;
  SmallVector<Option> candidates;
  sharding.getShardingOptions(in, ranks, candidates);
  for (Option &o : candidates)
    if (fits(op, o))
      out.push_back(std::move(o));
  return out;
}

ShardingPlan Propagator::run() {
  Block &block = func.getBody().front();
  for (Operation &op : block) {
    auto param = dyn_cast<ParamOp>(op);
    if ((param && param.getType().getRank() >= 2) ||
        llvm::any_of(op.getOperands(),
                     [&](Value v) { return readsWeights.contains(v); }))
      readsWeights.insert(op.result_begin(), op.result_end());
  }
  for (Operation &op : block) {
    auto effects = dyn_cast<MemoryEffectOpInterface>(&op);
    if (!effects || !effects.hasEffect<MemoryEffects::Write>() ||
        op.getNumOperands() == 0 || op.getNumResults() != 0)
      continue;
    auto state = op.getOperand(0).getDefiningOp<ParamOp>();
    auto it = state ? decisions.find(state.getName()) : decisions.end();
    if (it == decisions.end() || !it->second.isSplit())
      continue;
    for (Value v : op.getOperands().drop_front()) {
      if (v.getType() != state.getType() || !v.hasOneUse())
        continue;
      demanded[v] = it->second;
      // Under mixed precision the gradient is a 16-bit product widened:
      // the product is wanted in the same layout (reduce-scattered into
      // it, not into another split and re-gathered after the cast).
      while (auto c = v.getDefiningOp<CastOp>()) {
        v = c.getInput();
        if (!v.hasOneUse())
          break;
        demanded[v] = it->second;
      }
    }
  }
  for (BlockArgument arg : block.getArguments())
    plan.shards[arg] = arg.getArgNumber() < argLayouts.size()
                           ? argLayouts[arg.getArgNumber()]
                           : Shard::replicated();
  // A training forward phase returns the loss (or a pipeline stage's
  // outputs), then the activations its backward phase reads (pcc-autodiff,
  // "saved<i>"); a pipeline stage's backward phase returns the cotangents
  // it sends, then the values its weight-gradient phase reads
  // ("stash<i>"). Those read later stay in their layouts (a partial sum
  // reduced), since the later phase reads them partitioned. Under --sp a
  // stage's outputs ("out<i>") do too: the next stage receives them split
  // along the sequence, as Megatron sends them.
  auto keptResult = [&](unsigned i) {
    auto name = func.getResultAttrOfType<StringAttr>(i, "pcc.name");
    return name && (name.getValue().starts_with("saved") ||
                    name.getValue().starts_with("stash") ||
                    (sequenceParallel && name.getValue().starts_with("out")));
  };
  auto stashed = [&](unsigned i) {
    auto name = func.getResultAttrOfType<StringAttr>(i, "pcc.name");
    return name && name.getValue().starts_with("stash");
  };
  for (Operation &op : block) {
    if (auto ret = dyn_cast<func::ReturnOp>(op)) {
      SmallVector<Shard> targets;
      for (auto [i, v] : llvm::enumerate(ret.getOperands())) {
        Shard to =
            keptResult(i) && of(v).isSplit() ? of(v) : Shard::replicated();
        // A kept partial sum already reduce-scattered for its readers here
        // (--sp: the embedding's lookup, split along the sequence for the
        // first norm) is kept as that split: no all-reduce for the later
        // phase alone, and a quarter of the bytes kept at tp = 4.
        if (keptResult(i) && of(v).isPartial())
          for (int64_t d = 0; d < typeOf(v).getRank(); ++d)
            if (done.contains({v, static_cast<int64_t>(ShardKind::split), d,
                               int64_t{1}})) {
              to = Shard::split(d, 1);
              break;
            }
        // And a stashed one no reader here reduced (a norm's input
        // cotangent that the next op carries on partial, kept for the norm
        // weight's gradient in W): reduce-scattered along the sequence, as
        // the phase's saved residual stream is split, rather than
        // all-reduced whole and sliced, twice the bytes (the zoo Llama's
        // last stage at tp 2: three 256 KB all-reduces a micro-batch, where
        // the one-stage program reduce-scatters).
        if (sequenceParallel && stashed(i) && of(v).isPartial() &&
            to.isReplicated())
          if (std::optional<Shard> tokens = streamSplit(v))
            to = *tokens;
        if (i < resultLayouts.size() && resultLayouts[i])
          to = *resultLayouts[i];
        convert(v, to, nullptr);
        targets.push_back(to);
      }
      plan.operandShards[&op] = targets;
      continue;
    }
    // An op that writes model state in place (a gradient accumulated, an
    // optimizer update) works on the state where it lives: it reads the
    // state in its own layout, every operand of the state's shape in the
    // same layout, and the others (the gradient norm) whole.
    if (auto effects = dyn_cast<MemoryEffectOpInterface>(op);
        effects && effects.hasEffect<MemoryEffects::Write>() &&
        op.getNumOperands() > 0 && op.getNumResults() == 0) {
      Value state = op.getOperand(0);
      Shard s = of(state);
      SmallVector<Shard> reads;
      for (Value v : op.getOperands())
        reads.push_back(v.getType() == state.getType() ? s
                                                       : Shard::replicated());
      Option inPlace{reads, {}};
      for (auto [v, to] : llvm::zip(op.getOperands(), reads))
        convert(v, to, &op);
      plan.computeSeconds += computeSeconds(&op, inPlace);
      plan.operandShards[&op] = reads;
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
    // A gradient a split state wants: also the ways to compute only this
    // rank's piece by slicing a whole operand (the slice is local).
    size_t ownOptions = candidates.size();
    if (op.getNumResults() == 1 && demanded.count(op.getResult(0))) {
      Shard want = demanded.lookup(op.getResult(0));
      SmallVector<Shard> now;
      for (Value v : op.getOperands())
        now.push_back(of(v));
      for (auto [j, v] : llvm::enumerate(op.getOperands())) {
        if (!now[j].isReplicated())
          continue;
        for (int64_t d = 0; d < typeOf(v).getRank(); ++d) {
          SmallVector<Shard> in(now);
          in[j] = Shard::split(d, want.stripes);
          for (Option &o : optionsFor(&op, in))
            if (o.results.size() == 1 && o.results[0] == want &&
                o.operands[j] == in[j])
              candidates.push_back(std::move(o));
        }
      }
    }
    // A result in another layout than the one demanded is converted again
    // where it is accumulated (an all-gather at most).
    std::optional<Shard> want;
    if (op.getNumResults() == 1 && demanded.count(op.getResult(0)))
      want = demanded.lookup(op.getResult(0));
    const Option *best = nullptr;
    double bestSeconds = std::numeric_limits<double>::infinity();
    for (auto [index, o] : llvm::enumerate(candidates)) {
      bool fromOperand =
          index >= ownOptions ||
          llvm::all_of(o.results,
                       [](const Shard &s) { return s.isReplicated(); }) ||
          llvm::any_of(llvm::zip(op.getOperands(), o.operands), [&](auto p) {
            Shard s = std::get<1>(p);
            Value v = std::get<0>(p);
            // --sp: a partial sum may be reduce-scattered along the tokens.
            return (!s.isReplicated() && of(v) == s) ||
                   (sequenceParallel && of(v).isPartial() && alongTokens(v, s));
          });
      if (!fromOperand)
        continue;
      double seconds = computeSeconds(&op, o) + partialFanOutSeconds(&op, o);
      if (want && o.results.size() == 1 && o.results[0] != *want)
        seconds += collectiveSeconds(CollectiveKind::AllGather,
                                     tensorBytes(op.getResult(0)));
      // A value read twice in one layout (x * x) is converted once.
      SmallVector<std::pair<Value, Shard>, 4> counted;
      for (auto [v, s] : llvm::zip(op.getOperands(), o.operands)) {
        if (llvm::is_contained(counted, std::make_pair(Value(v), s)))
          continue;
        counted.push_back({v, s});
        seconds += conversionSeconds(v, s, &op);
      }
      if (seconds < bestSeconds) {
        bestSeconds = seconds;
        best = &o;
      }
    }
    for (auto [v, s] : llvm::zip(op.getOperands(), best->operands))
      convert(v, s, &op);
    plan.computeSeconds += computeSeconds(&op, *best);
    plan.operandShards[&op] = best->operands;
    for (auto [v, s] : llvm::zip(op.getResults(), best->results))
      plan.shards[v] = s;
  }

  // Weight memory: a weight counts whole on every rank unless every op reads
  // it split (its 16-bit casts' readers included: a bf16 copy gathered
  // whole is a whole weight); whole weights of rank >= 2 are the plan's
  // replicated bytes.
  std::function<bool(Value)> readSplit = [&](Value v) {
    return !v.use_empty() && llvm::all_of(v.getUses(), [&](OpOperand &use) {
      auto it = plan.operandShards.find(use.getOwner());
      if (it == plan.operandShards.end() ||
          !it->second[use.getOperandNumber()].isSplit())
        return false;
      auto c = dyn_cast<CastOp>(use.getOwner());
      return !c || readSplit(c.getResult());
    });
  };
  func.walk([&](ParamOp param) {
    Value v = param.getResult();
    bool split = readSplit(v);
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
                              const CostModel &cost, ArrayRef<Shard> argLayouts,
                              ArrayRef<std::optional<Shard>> resultLayouts) {
  return Propagator(func, axis, ranks, decisions, cost, argLayouts,
                    resultLayouts)
      .run();
}
