//===- Partition.cpp - SPMD rewrite to one rank's local shapes -----------===//

#include "StagePhases.h"
#include "pcc/Transforms/Passes.h"
#include "pcc/Transforms/Sharding.h"
#include "pcc/Transforms/Training.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/FormatVariadic.h"

#include <algorithm>
#include <functional>

namespace mlir::pcc {
#define GEN_PASS_DEF_PARTITION
#define GEN_PASS_DEF_PARTITIONTRAINING
#include "pcc/Transforms/Passes.h.inc"
} // namespace mlir::pcc

using namespace mlir;
using namespace mlir::pcc;

namespace {

RankedTensorType typeOf(Value v) { return cast<RankedTensorType>(v.getType()); }

class Partitioner {
public:
  Partitioner(func::FuncOp func, const ShardingPlan &plan,
              bool keepResultLayouts = false, bool stateWeights = false)
      : func(func), plan(plan), n(plan.ranks),
        axis(StringAttr::get(func.getContext(), plan.axis)),
        builder(func.getContext()), keepResultLayouts(keepResultLayouts),
        stateWeights(stateWeights) {}

  LogicalResult run();

  int64_t counts[3] = {0, 0, 0};
  int64_t bytes = 0;

private:
  Shard layoutOf(Value v) const { return plan.shards.lookup(v); }
  /// The local value of global `v` in layout `to`.
  Value as(Value v, Shard to);
  /// This rank's slice of replicated `v`, made where `v` is defined when
  /// that is a weight, a constant or a broadcast of one.
  Value sliceOf(Value v, Shard to);
  Value gather(Value local, RankedTensorType global, Shard from);
  Value reduceScatter(Value whole, Shard to);
  Value reshape(Value v, ArrayRef<int64_t> shape) {
    auto type = RankedTensorType::get(shape, typeOf(v).getElementType());
    if (type == v.getType())
      return v;
    return ReshapeOp::create(builder, v.getLoc(), type, v);
  }
  Value transpose(Value v, ArrayRef<int64_t> perm) {
    RankedTensorType t = typeOf(v);
    SmallVector<int64_t> shape;
    for (int64_t p : perm)
      shape.push_back(t.getDimSize(p));
    return TransposeOp::create(builder, v.getLoc(),
                               RankedTensorType::get(shape, t.getElementType()),
                               v, builder.getDenseI64ArrayAttr(perm));
  }
  void count(CollectiveKind kind, Value v) {
    ++counts[static_cast<int>(kind)];
    bytes += getTensorBytes(globalOf(v));
  }
  /// The global type of `v` (an argument's type is its local one by now).
  RankedTensorType globalOf(Value v) const {
    auto it = argGlobals.find(v);
    return it == argGlobals.end() ? typeOf(v) : it->second;
  }

  func::FuncOp func;
  const ShardingPlan &plan;
  int64_t n;
  StringAttr axis;
  OpBuilder builder;
  bool keepResultLayouts;
  /// Weights are training state, one buffer each: only a weight's own
  /// layout is a `pcc.param` of its piece; other slices are taken locally.
  bool stateWeights;
  llvm::DenseMap<Value, Value> local;
  llvm::DenseMap<Value, RankedTensorType> argGlobals;
  std::map<std::tuple<void *, int, int64_t, int64_t>, Value> converted;
};

Value Partitioner::as(Value v, Shard to) {
  Shard from = layoutOf(v);
  Value lv = local.lookup(v);
  if (from == to)
    return lv;
  auto key = std::make_tuple(v.getAsOpaquePointer(), static_cast<int>(to.kind),
                             to.dim, to.stripes);
  auto it = converted.find(key);
  if (it != converted.end())
    return it->second;
  Value result;
  Location loc = v.getLoc();
  // Mixed precision: a 16-bit product's f32 accumulator (its bias follows)
  // is summed over the ranks in the operands' 16-bit type, as Megatron-LM
  // reduces its bf16 partial products: half the bytes. The bias then adds
  // to the sum in f32, rounded once more.
  Type narrow;
  if (auto mm = lv.getDefiningOp<MatmulOp>(); mm && from.isPartial()) {
    Type element = mm.getLhs().getType().getElementType();
    if ((element.isBF16() || element.isF16()) &&
        mm.getType().getElementType().isF32())
      narrow = element;
  }
  auto retype = [&](Value x, Type element) {
    auto type = cast<RankedTensorType>(x.getType());
    return CastOp::create(builder, loc, type.clone(element), x).getResult();
  };
  if (narrow)
    lv = retype(lv, narrow);
  if (to.isReplicated()) {
    if (from.isPartial()) {
      result = AllReduceOp::create(builder, loc, lv, axis);
      count(CollectiveKind::AllReduce, v);
    } else {
      result = gather(lv, globalOf(v), from);
      count(CollectiveKind::AllGather, v);
    }
  } else if (from.isReplicated()) {
    result = sliceOf(v, to);
  } else if (from.isPartial()) {
    result = reduceScatter(lv, to);
    count(CollectiveKind::ReduceScatter, v);
  } else {
    Value whole = as(v, Shard::replicated());
    result =
        ShardSliceOp::create(builder, loc, localType(globalOf(v), to, n), whole,
                             axis, builder.getI64IntegerAttr(to.dim),
                             builder.getI64IntegerAttr(to.stripes));
  }
  if (narrow)
    result = retype(result, builder.getF32Type());
  converted[key] = result;
  return result;
}

Value Partitioner::sliceOf(Value v, Shard to) {
  RankedTensorType type = localType(globalOf(v), to, n);
  Operation *def = v.getDefiningOp();
  MLIRContext *context = func.getContext();
  if (auto param = dyn_cast_or_null<ParamOp>(def);
      param && (!stateWeights || layoutOf(v) == to))
    return ParamOp::create(builder, param.getLoc(), type, param.getNameAttr(),
                           to.toAttr(context, axis.getValue()));
  if (auto cst = dyn_cast_or_null<ConstantOp>(def)) {
    auto dense = dyn_cast<DenseElementsAttr>(cst.getValue());
    if (dense && dense.isSplat())
      return ConstantOp::create(builder, cst.getLoc(), dense.resizeSplat(type));
  }
  if (auto b = dyn_cast_or_null<BroadcastOp>(def)) {
    ArrayRef<int64_t> in = b.getInput().getType().getShape();
    int64_t shift = b.getType().getRank() - b.getInput().getType().getRank();
    int64_t d = to.dim - shift;
    Value input = local.lookup(b.getInput());
    if (layoutOf(b.getInput()).isReplicated()) {
      if (d >= 0 && in[d] != 1)
        input = as(b.getInput(), Shard::split(d, to.stripes));
      return BroadcastOp::create(builder, b.getLoc(), type, input);
    }
  }
  return ShardSliceOp::create(builder, v.getLoc(), type, local.lookup(v), axis,
                              builder.getI64IntegerAttr(to.dim),
                              builder.getI64IntegerAttr(to.stripes));
}

/// Stacks the ranks' pieces, then moves the rank index next to the chunk
/// it indexes: [n, .., s*c, ..] -> [.., s, n, c, ..] -> global.
Value Partitioner::gather(Value lv, RankedTensorType global, Shard from) {
  RankedTensorType lt = typeOf(lv);
  Location loc = lv.getLoc();
  SmallVector<int64_t> stacked{n};
  llvm::append_range(stacked, lt.getShape());
  Value g = AllGatherOp::create(
      builder, loc, RankedTensorType::get(stacked, lt.getElementType()), lv,
      axis);
  int64_t d = from.dim, s = from.stripes, c = lt.getDimSize(d) / s;
  bool leading = s == 1 && llvm::all_of(lt.getShape().take_front(d),
                                        [](int64_t x) { return x == 1; });
  if (leading)
    return reshape(g, global.getShape());
  SmallVector<int64_t> split{n};
  for (int64_t k = 0; k < lt.getRank(); ++k) {
    if (k == d) {
      split.push_back(s);
      split.push_back(c);
    } else {
      split.push_back(lt.getDimSize(k));
    }
  }
  Value x = reshape(g, split);
  // Dims of `split`: 0 = n, 1..d = before, d+1 = s, d+2 = c, then after.
  SmallVector<int64_t> perm;
  for (int64_t k = 1; k <= d + 1; ++k)
    perm.push_back(k);
  perm.push_back(0);
  for (int64_t k = d + 2; k < static_cast<int64_t>(split.size()); ++k)
    perm.push_back(k);
  return reshape(transpose(x, perm), global.getShape());
}

/// [.., s*n*c, ..] -> [.., s, n, c, ..] -> [n, .., s, c, ..] -> scatter ->
/// local.
Value Partitioner::reduceScatter(Value whole, Shard to) {
  RankedTensorType gt = typeOf(whole);
  Location loc = whole.getLoc();
  int64_t d = to.dim, s = to.stripes, c = gt.getDimSize(d) / (s * n);
  SmallVector<int64_t> split;
  for (int64_t k = 0; k < gt.getRank(); ++k) {
    if (k == d) {
      split.append({s, n, c});
    } else {
      split.push_back(gt.getDimSize(k));
    }
  }
  Value x = reshape(whole, split);
  SmallVector<int64_t> perm{d + 1};
  for (int64_t k = 0; k < static_cast<int64_t>(split.size()); ++k)
    if (k != d + 1)
      perm.push_back(k);
  Value t = transpose(x, perm);
  ArrayRef<int64_t> piece = typeOf(t).getShape().drop_front();
  Value r = ReduceScatterOp::create(
      builder, loc, RankedTensorType::get(piece, gt.getElementType()), t, axis);
  return reshape(r, localType(gt, to, n).getShape());
}

LogicalResult Partitioner::run() {
  Block &block = func.getBody().front();
  // Arguments arrive in their planned layouts: this rank's piece.
  for (BlockArgument arg : block.getArguments()) {
    argGlobals[arg] = typeOf(arg);
    arg.setType(localType(typeOf(arg), layoutOf(arg), n));
    local[arg] = arg;
  }
  SmallVector<Operation *> old;
  for (Operation &op : block)
    old.push_back(&op);
  for (Operation *op : old) {
    builder.setInsertionPoint(op);
    if (auto ret = dyn_cast<func::ReturnOp>(op)) {
      // The planned layouts (whole, or a training forward phase's saved
      // activations as they are); with keepResultLayouts every result as
      // it is, partial sums reduced.
      auto targets = plan.operandShards.lookup(op);
      for (OpOperand &operand : ret->getOpOperands()) {
        unsigned i = operand.getOperandNumber();
        Shard to = i < targets.size() ? targets[i] : Shard::replicated();
        if (keepResultLayouts && !layoutOf(operand.get()).isPartial())
          to = layoutOf(operand.get());
        // A partial sum returned split (--sp: a stash for W) is
        // reduce-scattered where it is made: at the return its whole
        // partial sum lived to the phase's end (the zoo Llama's last stage
        // at tp 2: its arena 1.63 -> 2.75 MiB).
        Operation *made = local.lookup(operand.get()).getDefiningOp();
        if (made && made->getBlock() == &block &&
            layoutOf(operand.get()).isPartial() && to.isSplit())
          builder.setInsertionPointAfter(made);
        operand.set(as(operand.get(), to));
        builder.setInsertionPoint(op);
      }
      func.setType(FunctionType::get(
          func.getContext(), block.getArgumentTypes(), ret->getOperandTypes()));
      continue;
    }
    auto targets = plan.operandShards.lookup(op);
    if (auto param = dyn_cast<ParamOp>(op)) {
      Shard s = layoutOf(param.getResult());
      local[param.getResult()] =
          s.isSplit()
              ? sliceOf(param.getResult(), s)
              : ParamOp::create(builder, param.getLoc(), param.getType(),
                                param.getNameAttr(), ShardingAttr());
      continue;
    }
    // Operand by operand: one value read twice may be read in two layouts
    // (x * x with x a partial sum reads one factor reduced), which a value
    // mapping cannot express.
    SmallVector<Value> operands;
    for (auto [i, operand] : llvm::enumerate(op->getOperands())) {
      Shard want = i < targets.size() ? targets[i] : Shard::replicated();
      operands.push_back(as(operand, want));
    }
    Operation *clone = builder.clone(*op);
    for (auto [i, v] : llvm::enumerate(operands))
      clone->setOperand(i, v);
    clone->removeAttr(PccDialect::kShardingAttrName);
    for (auto [r, nr] : llvm::zip(op->getResults(), clone->getResults())) {
      nr.setType(localType(typeOf(r), layoutOf(r), n));
      local[r] = nr;
    }
    // What counts global sizes changes (ShardingOpInterface).
    if (auto sharding = dyn_cast<ShardingOpInterface>(clone)) {
      SmallVector<Shard> read(targets.begin(), targets.end());
      read.resize(clone->getNumOperands(), Shard::replicated());
      SmallVector<Value> results =
          sharding.partitionLocal(builder, read, n, axis.getValue());
      for (auto [r, nr] : llvm::zip(op->getResults(), results))
        local[r] = nr;
    }
  }
  // Drop the global ops, users first.
  for (Operation *op : llvm::reverse(old))
    if (!isa<func::ReturnOp>(op))
      op->erase();
  // Whole weights and constants whose every reader now takes a slice.
  SmallVector<Operation *> all;
  for (Operation &op : block)
    all.push_back(&op);
  for (Operation *op : llvm::reverse(all))
    if (isOpTriviallyDead(op))
      op->erase();
  return success();
}

} // namespace

FailureOr<PartitionStats> mlir::pcc::partitionFunction(func::FuncOp func,
                                                       const ShardingPlan &plan,
                                                       bool keepResultLayouts,
                                                       bool stateWeights) {
  Partitioner partitioner(func, plan, keepResultLayouts, stateWeights);
  if (failed(partitioner.run()))
    return failure();
  PartitionStats stats;
  std::copy(std::begin(partitioner.counts), std::end(partitioner.counts),
            stats.counts);
  stats.bytes = partitioner.bytes;
  return stats;
}

namespace {

/// The weights' layouts recorded in `func`'s `pcc.sharding` attributes.
LogicalResult recordedDecisions(func::FuncOp func,
                                llvm::StringMap<Shard> &decisions) {
  bool bad = false;
  func.walk([&](ParamOp param) {
    auto attr = param->getAttrOfType<ArrayAttr>(PccDialect::kShardingAttrName);
    if (!attr || param.getType().getRank() < 2)
      return;
    Shard s = Shard::fromAttr(cast<ShardingAttr>(attr[0]));
    auto [it, inserted] = decisions.try_emplace(param.getName(), s);
    if (!inserted && it->second != s) {
      param.emitOpError("weight '")
          << param.getName() << "' has two different layouts";
      bad = true;
    }
  });
  return failure(bad);
}

/// The weights `func` only looks rows up in (every use a pcc.gather, or a
/// cast that only they read).
llvm::StringSet<> lookupOnlyWeights(func::FuncOp func) {
  llvm::StringMap<bool> only;
  std::function<bool(Value)> lookups = [&](Value v) {
    for (Operation *user : v.getUsers()) {
      if (isa<GatherOp>(user) && user->getOperand(0) == v)
        continue;
      if (isa<CastOp>(user) && lookups(user->getResult(0)))
        continue;
      return false;
    }
    return true;
  };
  func.walk([&](ParamOp param) {
    bool l = lookups(param.getResult());
    auto [it, inserted] = only.try_emplace(param.getName(), l);
    if (!inserted)
      it->second = it->second && l;
  });
  llvm::StringSet<> out;
  for (auto &entry : only)
    if (entry.getValue())
      out.insert(entry.getKey());
  return out;
}

struct PartitionPass : public mlir::pcc::impl::PartitionBase<PartitionPass> {
  using PartitionBase::PartitionBase;

  void runOnOperation() override {
    func::FuncOp func = getOperation();
    if (func->hasAttr(kPhaseAttrName)) {
      func.emitError("pcc-partition: @")
          << func.getSymName()
          << " is a phase of a training step; the phases are partitioned "
             "together by pcc-partition-training";
      return signalPassFailure();
    }
    FailureOr<int64_t> ranks = getMeshAxisSize(func, axis);
    if (failed(ranks))
      return signalPassFailure();
    llvm::StringMap<Shard> decisions;
    if (failed(recordedDecisions(func, decisions)))
      return signalPassFailure();
    if (*ranks == 1) {
      func.walk(
          [](Operation *op) { op->removeAttr(PccDialect::kShardingAttrName); });
      return;
    }
    ShardingPlan plan = propagateShardings(func, axis, *ranks, decisions);
    FailureOr<PartitionStats> stats = partitionFunction(func, plan);
    if (failed(stats))
      return signalPassFailure();
    numAllReduce = stats->counts[0];
    numAllGather = stats->counts[1];
    numReduceScatter = stats->counts[2];
    commBytes = stats->bytes;
    if (emitRemarks)
      func.emitRemark() << axis << "=" << *ranks << ": " << stats->counts[0]
                        << " all_reduce, " << stats->counts[1]
                        << " all_gather, " << stats->counts[2]
                        << " reduce_scatter; " << stats->bytes
                        << " bytes per run";
  }
};

} // namespace

namespace {

struct PartitionTrainingPass
    : public mlir::pcc::impl::PartitionTrainingBase<PartitionTrainingPass> {
  using PartitionTrainingBase::PartitionTrainingBase;

  /// The global norm adds one squared sum per weight; each split weight's
  /// is a partial sum that the partition all-reduced on its own. Summed
  /// first and all-reduced once, they cost one collective instead of one
  /// per split weight. Returns the all-reduces saved.
  int64_t fuseNormAllReduces(func::FuncOp optimizer) {
    int64_t saved = 0;
    SmallVector<SqrtOp> roots;
    optimizer.walk([&](SqrtOp op) { roots.push_back(op); });
    for (SqrtOp root : roots) {
      // The leaves of the chain of single-use scalar adds under the root.
      SmallVector<Value> leaves;
      SmallVector<Operation *> chain;
      std::function<void(Value)> collect = [&](Value v) {
        auto add = v.getDefiningOp<AddOp>();
        if (add && add->hasOneUse() &&
            cast<RankedTensorType>(add.getType()).getRank() == 0) {
          chain.push_back(add);
          collect(add.getLhs());
          collect(add.getRhs());
          return;
        }
        leaves.push_back(v);
      };
      collect(root.getInput());
      SmallVector<Value> partial, whole;
      SmallVector<Operation *> reduces;
      for (Value leaf : leaves) {
        auto reduce = leaf.getDefiningOp<AllReduceOp>();
        if (reduce && reduce.getAxis() == axis && reduce->hasOneUse()) {
          partial.push_back(reduce.getInput());
          reduces.push_back(reduce);
        } else {
          whole.push_back(leaf);
        }
      }
      if (partial.size() < 2)
        continue;
      OpBuilder b(root);
      Location loc = root.getLoc();
      auto sum = [&](ArrayRef<Value> terms) {
        Value acc = terms.front();
        for (Value t : terms.drop_front())
          acc = AddOp::create(b, loc, acc, t);
        return acc;
      };
      Value reduced =
          AllReduceOp::create(b, loc, sum(partial), b.getStringAttr(axis));
      Value total =
          whole.empty()
              ? reduced
              : AddOp::create(b, loc, sum(whole), reduced).getResult();
      root->setOperand(0, total);
      for (Operation *op : chain)
        op->erase();
      for (Operation *op : reduces)
        op->erase();
      saved += static_cast<int64_t>(reduces.size()) - 1;
    }
    return saved;
  }

  /// A training step, pipelined or not (TrainingStep): every stage's
  /// phases partitioned with the layouts planned on the stages' forward
  /// phases, in order, each phase reading what an earlier one of its stage
  /// left for it (saved activations, B's stash for W) in the layout that
  /// one returned it in; what crosses a stage boundary (activations, their
  /// cotangents) travels whole. Then the step's phases: an unpipelined
  /// step's optimizer and zero-grad partitioned as planned, a pipelined
  /// step's per-rank ones rebuilt over the weights' pieces.
  void runOnOperation() override {
    ModuleOp module = getOperation();
    FailureOr<TrainingStep> step =
        getTrainingStep(module, "pcc-partition-training");
    if (failed(step))
      return signalPassFailure();
    FailureOr<int64_t> ranks = getMeshAxisSize(step->stages.front()[0], axis);
    if (failed(ranks))
      return signalPassFailure();
    // A weight on several stages (a tied embedding and LM head) was
    // planned on each: the first stage that computes with it (not only
    // looks rows up in it) decides, else the first, and the other stages'
    // values flow around it. The LM head's vocabulary split holds, as
    // Megatron's: the embedding stage's own choice, a split of the
    // columns, made the head's stage gather the table whole and
    // re-stack it every micro-batch (two whole tables in its arena) and
    // the embedding stage make its gradient whole and slice it.
    llvm::StringMap<Shard> decisions;
    llvm::StringSet<> lookedUp;
    // Per stage, its own search's decisions; how many stages decided each
    // weight.
    SmallVector<llvm::StringMap<Shard>> stageOwn;
    llvm::StringMap<int> deciders;
    for (auto &phases : step->stages) {
      llvm::StringMap<Shard> &own = stageOwn.emplace_back();
      if (failed(recordedDecisions(phases[0], own)))
        return signalPassFailure();
      for (auto &entry : own)
        ++deciders[entry.getKey()];
      llvm::StringSet<> onlyLookups = lookupOnlyWeights(phases[0]);
      for (auto &entry : own) {
        StringRef name = entry.getKey();
        bool lookup = onlyLookups.contains(name);
        auto [it, inserted] = decisions.try_emplace(name, entry.getValue());
        if (!inserted && lookedUp.contains(name) && !lookup) {
          it->second = entry.getValue();
          lookedUp.erase(name);
        } else if (inserted && lookup) {
          lookedUp.insert(name);
        }
      }
    }
    // --sp changes how layouts flow, not the weights' plan.
    if (!beginStep(module, *ranks, decisions))
      return;
    PartitionStats total;
    // The phases after a stage's forward read the weights it read: they
    // work on their pieces (Megatron's input gradients) rather than
    // gathering a weight to keep an activation's split. Under --sp the
    // forward phase keeps the weights split too: with the norms on part of
    // the sequence, gathering a projection's weight would tie with
    // gathering its input on small models, and the weight would then be
    // gathered in every micro-batch (Llama's attention did).
    CostModel keepWeightsSplit;
    keepWeightsSplit.weightGatherFactor = 1e3;
    // Under --sp a pipeline's activations cross the stage boundaries split
    // along the sequence as a stage's forward returns them: each stage's
    // forward receives them so, and its backward returns their cotangents
    // in the same layouts (and reads those of its outputs so).
    SmallVector<SmallVector<int32_t>> sources;
    if (step->pipelined && sequenceParallel)
      sources = stageSources(module);
    SmallVector<Shard> previousOut; // by output number, of the last stage
    for (auto [k, phases] : llvm::enumerate(step->stages)) {
      // The layouts of the values a phase returns for a later one, by name.
      llvm::StringMap<Shard> later;
      SmallVector<Shard> forwardArgs;
      for (auto [i, phase] : llvm::enumerate(phases)) {
        func::FuncOp func = phase;
        SmallVector<Shard> args;
        SmallVector<std::optional<Shard>> results;
        bool boundaries = k < sources.size();
        if (i == 0 && boundaries) {
          for (int32_t s : sources[k])
            args.push_back(s >= 0 && static_cast<size_t>(s) < previousOut.size()
                               ? previousOut[s]
                               : Shard::replicated());
          forwardArgs = args;
        }
        if (i > 0)
          for (unsigned a = 0; a < func.getNumArguments(); ++a) {
            auto name = func.getArgAttrOfType<StringAttr>(a, "pcc.name");
            StringRef n = name ? name.getValue() : StringRef();
            // A received cotangent: in its output's layout.
            if (boundaries && n.consume_front("grad_out")) {
              args.push_back(later.lookup(("out" + n).str()));
              continue;
            }
            args.push_back(name ? later.lookup(name.getValue())
                                : Shard::replicated());
          }
        if (i == 1 && boundaries)
          for (unsigned r = 0; r < func.getNumResults(); ++r) {
            auto of = func.getResultAttrOfType<IntegerAttr>(r, "pcc.grad_of");
            results.push_back(
                of && of.getInt() >= 0 &&
                        static_cast<size_t>(of.getInt()) < forwardArgs.size()
                    ? std::optional<Shard>(forwardArgs[of.getInt()])
                    : std::nullopt);
          }
        const CostModel &cost =
            i > 0 || sequenceParallel ? keepWeightsSplit : CostModel();
        // (Their gradients and moments follow them.)
        if (i == 0 && replanLookups(func, stageOwn[k], deciders, decisions,
                                    *ranks, cost, args))
          addStateDecisions(module, decisions);
        ShardingPlan plan = propagateShardings(func, axis, *ranks, decisions,
                                               cost, args, results);
        auto ret = cast<func::ReturnOp>(func.getBody().front().getTerminator());
        SmallVector<Shard> layouts = plan.operandShards.lookup(ret);
        for (unsigned r = 0; r < func.getNumResults(); ++r)
          if (auto name = func.getResultAttrOfType<StringAttr>(r, "pcc.name"))
            later[name.getValue()] =
                r < layouts.size() ? layouts[r] : Shard::replicated();
        if (i == 0) {
          previousOut.clear();
          for (unsigned r = 0; r < func.getNumResults(); ++r)
            previousOut.push_back(r < layouts.size() ? layouts[r]
                                                     : Shard::replicated());
        }
        if (failed(partitionPhase(func, plan, *ranks, total)))
          return signalPassFailure();
      }
    }
    for (func::FuncOp func : step->stepPhases)
      if (failed(partitionPhase(
              func, propagateShardings(func, axis, *ranks, decisions), *ranks,
              total)))
        return signalPassFailure();
    if (!step->pipelined)
      return remarkStep(module, *ranks, "training step", total);
    // Every pipeline rank's optimizer and zero-grad, rebuilt over its
    // weights' pieces (the tied weights' sums over pp on the pieces, one
    // all-reduce over tp for the norm's split terms).
    SmallVector<llvm::MapVector<StringRef, RankedTensorType>> held =
        rankWeights(module);
    FlatShards pieces{module.getContext(), 1};
    pieces.splitRanks = *ranks;
    for (auto &weights : held)
      for (auto &[name, type] : weights) {
        Shard s = decisions.lookup(name);
        if (!s.isSplit())
          continue;
        type = localType(type, s, *ranks);
        pieces.splits[name] = s.toAttr(module.getContext(), axis);
      }
    if (failed(buildRankPhases(module, held, pieces, /*zero=*/0)))
      return signalPassFailure();
    remarkStep(module, *ranks, "pipelined training step", total);
  }

  /// A stage whose search decided a weight another stage's decision
  /// overrode (a tied table this stage only looks up, split by the LM
  /// head's vocabulary) planned its other weights around a layout it does
  /// not get: the bundled GPT's embedding stage split the positional table
  /// by columns beside the token table's, so with the table split by rows
  /// it reduce-scattered the embedding by columns, and under --sp sent the
  /// residual stream on split by columns (the next stage gathered it and
  /// saved it whole). Its own lookup-only weights, which no other stage
  /// reads, are planned again here, the overriding layouts held: each
  /// takes the layout with the better plan of the stage's forward.
  bool replanLookups(func::FuncOp forward, const llvm::StringMap<Shard> &own,
                     const llvm::StringMap<int> &deciders,
                     llvm::StringMap<Shard> &decisions, int64_t ranks,
                     const CostModel &cost, ArrayRef<Shard> args) {
    bool overridden = llvm::any_of(own, [&](const auto &entry) {
      return decisions.lookup(entry.getKey()) != entry.getValue();
    });
    if (!overridden)
      return false;
    llvm::StringSet<> onlyLookups = lookupOnlyWeights(forward);
    llvm::MapVector<StringRef, RankedTensorType> weights =
        decisionWeights(forward);
    SmallVector<StringRef> free;
    for (auto &[name, type] : weights)
      if (onlyLookups.contains(name) && deciders.lookup(name) == 1 &&
          own.count(name) && decisions.lookup(name) == own.lookup(name))
        free.push_back(name);
    bool changed = false;
    if (free.empty())
      return false;
    ShardingPlan best =
        propagateShardings(forward, axis, ranks, decisions, cost, args);
    for (StringRef name : free)
      for (Shard candidate : candidateShards(weights.lookup(name), ranks)) {
        Shard before = decisions.lookup(name);
        if (candidate == before)
          continue;
        decisions[name] = candidate;
        ShardingPlan plan =
            propagateShardings(forward, axis, ranks, decisions, cost, args);
        if (plan.betterThan(best)) {
          best = std::move(plan);
          changed = true;
        } else {
          decisions[name] = before;
        }
      }
    return changed;
  }

  void remarkStep(ModuleOp module, int64_t ranks, StringRef what,
                  const PartitionStats &total) {
    if (emitRemarks)
      module.emitRemark() << axis << "=" << ranks << " " << what << ": "
                          << total.counts[0] << " all_reduce, "
                          << total.counts[1] << " all_gather, "
                          << total.counts[2] << " reduce_scatter; "
                          << total.bytes << " bytes per micro-batch and step";
  }

  /// Per pipeline stage (@main's calls in order), per input: the output of
  /// the previous stage it receives, or -1 (a model input).
  static SmallVector<SmallVector<int32_t>> stageSources(ModuleOp module) {
    SmallVector<SmallVector<int32_t>> out;
    auto main = module.lookupSymbol<func::FuncOp>("main");
    if (!main)
      return out;
    for (auto call : main.getBody().front().getOps<func::CallOp>()) {
      SmallVector<int32_t> stage;
      for (Value v : call.getOperands()) {
        auto transfer = v.getDefiningOp<TransferOp>();
        auto result =
            transfer ? dyn_cast<OpResult>(transfer.getInput()) : OpResult();
        stage.push_back(result && isa<func::CallOp>(result.getOwner())
                            ? static_cast<int32_t>(result.getResultNumber())
                            : -1);
      }
      out.push_back(std::move(stage));
    }
    return out;
  }

  /// Before partitioning a step over `ranks`: false with one rank, whose
  /// plans' marks are dropped (nothing to partition); otherwise marks the
  /// module for --sp's propagation moves and gives every state tensor its
  /// weight's decision.
  bool beginStep(ModuleOp module, int64_t ranks,
                 llvm::StringMap<Shard> &decisions) {
    if (ranks == 1) {
      module.walk(
          [](Operation *op) { op->removeAttr(PccDialect::kShardingAttrName); });
      return false;
    }
    if (sequenceParallel)
      module->setAttr(kSequenceParallelAttrName, UnitAttr::get(&getContext()));
    addStateDecisions(module, decisions);
    return true;
  }

  /// A gradient or moment lies where its weight does.
  static void addStateDecisions(ModuleOp module,
                                llvm::StringMap<Shard> &decisions) {
    module.walk([&](ParamOp param) {
      auto [weight, kind] = splitStateName(param.getName());
      auto it = decisions.find(weight);
      if (kind.empty() || it == decisions.end())
        return;
      Shard s = it->second; // before an insertion moves the entries
      decisions[param.getName()] = s;
    });
  }

  /// Partitions one phase, adding its collectives to `total`.
  LogicalResult partitionPhase(func::FuncOp func, const ShardingPlan &plan,
                               int64_t ranks, PartitionStats &total) {
    FailureOr<PartitionStats> stats =
        partitionFunction(func, plan, /*keepResultLayouts=*/false,
                          /*stateWeights=*/true);
    if (failed(stats))
      return failure();
    // The optimizer's norm: one all-reduce for every split weight's sum.
    if (auto phase = func->getAttrOfType<StringAttr>(kPhaseAttrName);
        phase && phase.getValue() == kPhaseNames[2]) {
      int64_t fused = fuseNormAllReduces(func);
      stats->counts[0] -= fused;
      stats->bytes -= 4 * fused;
    }
    for (int k = 0; k < 3; ++k)
      total.counts[k] += stats->counts[k];
    total.bytes += stats->bytes;
    if (emitRemarks)
      func.emitRemark() << axis << "=" << ranks << " @" << func.getSymName()
                        << ": " << stats->counts[0] << " all_reduce, "
                        << stats->counts[1] << " all_gather, "
                        << stats->counts[2] << " reduce_scatter; "
                        << stats->bytes << " bytes per run";
    return success();
  }
};

} // namespace
