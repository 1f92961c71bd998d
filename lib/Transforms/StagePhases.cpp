//===- StagePhases.cpp - the training phases of a step cut into stages ----===//
//
// pcc-autodiff and pcc-optimizer on a module pcc-pipeline-cut has cut
// @main (with its loss) into stages. pcc-autodiff gives every stage k the
// phases of a micro-batch:
//
//   @stage<k>_forward      the stage's inputs -> its outputs, then residuals
//   @stage<k>_backward     (B) residuals and one cotangent per float output
//                          -> the cotangents of the float inputs received
//                          from stage k - 1, then the values W reads
//   @stage<k>_weight_grad  (W) the weights' gradients, added into state
//
// and pcc-optimizer every pipeline rank r (running stages r, r + p, ...
// with interleaved chunks) the phases of a step:
//
//   @rank<r>_optimizer     tied weights' gradients summed over pp, the
//                          global norm (one scalar all-reduce over pp), and
//                          the updates of the rank's weights
//   @rank<r>_zero_grad
//
// B and W are separate so that a schedule (ZB-H1) can run W later; GPipe,
// 1F1B and the interleaved schedules run it right after B, and
// pcc-merge-weight-gradients moves W's ops back into B for them once the
// passes that work on W (data parallelism, autocast) have run.
//
// Every float value that crosses a cut has a cotangent flowing back, so
// the sends and receives of the backward pass mirror the forward's. @main
// and the stage functions stay: they record the wiring the emitter and
// the schedule use.
//
//===----------------------------------------------------------------------===//

#include "StagePhases.h"
#include "Differentiate.h"
#include "pcc/Dialect/Pcc/IR/PccDialect.h"
#include "pcc/Transforms/Passes.h"
#include "pcc/Transforms/Training.h"

#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/MapVector.h"

using namespace mlir;
using namespace mlir::pcc;

namespace {

struct StageCall {
  func::FuncOp callee;
  /// Per argument: output s of the previous stage (s >= 0), or model
  /// input k (-1 - k).
  SmallVector<int32_t> sources;
};

FailureOr<SmallVector<StageCall>> collectCalls(func::FuncOp main) {
  SmallVector<StageCall> calls;
  DenseMap<Operation *, unsigned> index;
  ModuleOp module = main->getParentOfType<ModuleOp>();
  for (Operation &op : main.getBody().front()) {
    auto call = dyn_cast<func::CallOp>(op);
    if (!call)
      continue;
    auto callee = module.lookupSymbol<func::FuncOp>(call.getCallee());
    if (!callee || !callee->hasAttr(kStageAttrName))
      return call.emitError("autodiff: @main must call the stages");
    StageCall stage;
    stage.callee = callee;
    for (Value arg : call.getOperands()) {
      if (auto block = dyn_cast<BlockArgument>(arg)) {
        stage.sources.push_back(-1 -
                                static_cast<int32_t>(block.getArgNumber()));
        continue;
      }
      auto transfer = arg.getDefiningOp<TransferOp>();
      Operation *producer =
          transfer ? transfer.getInput().getDefiningOp() : nullptr;
      if (!producer || !index.count(producer) ||
          index.lookup(producer) + 1 != calls.size())
        return call.emitError("autodiff: stage ")
               << calls.size()
               << " must read model inputs or the previous stage's outputs";
      stage.sources.push_back(static_cast<int32_t>(
          cast<OpResult>(transfer.getInput()).getResultNumber()));
    }
    index[call] = calls.size();
    calls.push_back(std::move(stage));
  }
  if (calls.size() < 2)
    return main.emitError("autodiff: expects a module cut into "
                          "stages (run pcc-pipeline-cut first)");
  return calls;
}

/// Values `op` reads, its nested regions' reads from outside included.
SmallVector<Value> usedValues(Operation *op) {
  SmallVector<Value> used(op->getOperands());
  op->walk([&](Operation *inner) {
    if (inner == op)
      return;
    for (Value v : inner->getOperands())
      if (!op->isAncestor(v.getParentRegion()->getParentOp()))
        used.push_back(v);
  });
  return used;
}

/// Where W runs later than B (zb-h1), a fused LM head's gradient that
/// feeds both is computed twice: B's copy gives the hidden states'
/// gradient and W's the weight's (each skips the other's product), so
/// that no weight-sized gradient waits between them, at the cost of the
/// logits' product once more.
void splitFusedHeadGradients(func::FuncOp bwd) {
  bwd.walk([](LinearCrossEntropyGradOp op) {
    if (op.getGradHidden().use_empty() || op.getGradWeight().use_empty())
      return;
    OpBuilder b(op);
    b.setInsertionPointAfter(op);
    auto weight = cast<LinearCrossEntropyGradOp>(b.clone(*op));
    op.getGradWeight().replaceAllUsesWith(weight.getGradWeight());
  });
}

/// Splits a stage's backward function in two (Zero Bubble's B and W):
/// `bwd` keeps what the input cotangents need, and returns after them the
/// values the rest reads ("stash<i>", pcc.grad_of -1); the rest, the
/// weights' gradients added into their state, moves to a new function
/// `name` whose arguments are the backward's arguments it reads and the
/// stash. Weights and constants are read again rather than stashed.
func::FuncOp splitWeightGradients(func::FuncOp bwd, StringRef name) {
  MLIRContext *ctx = bwd.getContext();
  Block &body = bwd.getBody().front();
  auto ret = cast<func::ReturnOp>(body.getTerminator());
  // B: the backward slice of the input cotangents.
  DenseSet<Operation *> inB;
  SmallVector<Operation *> work;
  auto visit = [&](Value v) {
    Operation *def = v.getDefiningOp();
    if (def && def->getBlock() == &body && inB.insert(def).second)
      work.push_back(def);
  };
  for (Value v : ret.getOperands())
    visit(v);
  while (!work.empty())
    for (Value v : usedValues(work.pop_back_val()))
      visit(v);

  OpBuilder mb(bwd);
  mb.setInsertionPointAfter(bwd);
  auto w =
      func::FuncOp::create(mb, bwd.getLoc(), name, mb.getFunctionType({}, {}));
  Block *wBody = w.addEntryBlock();
  OpBuilder b = OpBuilder::atBlockEnd(wBody);
  IRMapping map;
  SmallVector<Value> stash;
  SmallVector<Operation *> moved;
  auto named = [&](StringRef n) { return nameAttr(ctx, n); };
  auto argument = [&](Value v, DictionaryAttr attrs) {
    unsigned i = w.getNumArguments();
    (void)w.insertArgument(i, v.getType(), attrs, v.getLoc());
    map.map(v, w.getArgument(i));
  };
  for (Operation &op : body.without_terminator()) {
    if (inB.contains(&op))
      continue;
    for (Value v : usedValues(&op)) {
      if (map.contains(v)) // W's own value, or already read
        continue;
      if (auto arg = dyn_cast<BlockArgument>(v);
          arg && arg.getOwner() == &body) {
        argument(v, bwd.getArgAttrDict(arg.getArgNumber()));
        continue;
      }
      Operation *def = v.getDefiningOp(); // one of B's
      if (isa<ParamOp, ConstantOp>(def)) {
        b.clone(*def, map);
        continue;
      }
      argument(v, named("stash" + std::to_string(stash.size())));
      stash.push_back(v);
    }
    b.clone(op, map);
    moved.push_back(&op);
  }
  func::ReturnOp::create(b, bwd.getLoc(), ValueRange{});
  // The stash leaves B after the cotangents.
  unsigned first = ret.getNumOperands();
  ret->insertOperands(first, stash);
  SmallVector<Type> results(ret.getOperandTypes());
  SmallVector<DictionaryAttr> attrs;
  for (unsigned j = 0; j < first; ++j)
    attrs.push_back(bwd.getResultAttrDict(j));
  for (unsigned j = 0; j < stash.size(); ++j) {
    NamedAttrList list(named("stash" + std::to_string(j)));
    list.set("pcc.grad_of", IntegerAttr::get(IntegerType::get(ctx, 32), -1));
    attrs.push_back(list.getDictionary(ctx));
  }
  bwd.setType(FunctionType::get(ctx, bwd.getArgumentTypes(), results));
  bwd.setAllResultAttrs(attrs);
  for (Operation *op : llvm::reverse(moved))
    op->erase();
  return w;
}

} // namespace

bool mlir::pcc::isCutIntoStages(ModuleOp module) {
  return llvm::any_of(module.getOps<func::FuncOp>(), [](func::FuncOp f) {
    return f->hasAttr(kStageAttrName);
  });
}

LogicalResult mlir::pcc::differentiateStages(ModuleOp module,
                                             ArrayRef<std::string> recompute,
                                             const llvm::StringSet<> &frozen) {
  auto main = module.lookupSymbol<func::FuncOp>("main");
  if (!main)
    return module.emitError("autodiff: no func.func @main");
  auto calls = collectCalls(main);
  if (failed(calls))
    return failure();
  MLIRContext *ctx = module.getContext();
  unsigned n = calls->size();
  // zb-h1 runs each W in a later bubble; the others right after its B.
  bool deferredW = false;
  if (auto schedule = main->getAttrOfType<DictionaryAttr>("pcc.schedule"))
    if (auto policy = schedule.getAs<StringAttr>("policy"))
      deferredW = policy.getValue() == "zb-h1";

  // Differentiate every stage; its weights in the order of their first
  // gradient.
  llvm::SetVector<StringRef> allTrained;
  for (auto [k, call] : llvm::enumerate(*calls)) {
    func::FuncOp f = call.callee;
    auto ret = cast<func::ReturnOp>(f.getBody().front().getTerminator());
    bool last = k + 1 == n;
    if (last &&
        (ret.getNumOperands() != 1 ||
         cast<RankedTensorType>(ret.getOperand(0).getType()).getRank() != 0))
      return f.emitError("autodiff: the last stage must return the "
                         "scalar loss alone");
    DifferentiateSpec spec;
    spec.frozen = &frozen;
    if (!recompute.empty()) {
      StringRef name = recompute.size() == 1  ? StringRef(recompute[0])
                       : k < recompute.size() ? StringRef(recompute[k])
                                              : StringRef();
      std::optional<Recompute> policy = parseRecompute(name);
      if (!policy)
        return module.emitError("autodiff: recompute '")
               << name << "' for stage " << k
               << " (none, selective or full; one value, or one per stage)";
      spec.recompute = *policy;
    }
    std::string fwdName = "stage" + std::to_string(k) + "_forward";
    std::string bwdName = "stage" + std::to_string(k) + "_backward";
    spec.forwardName = fwdName;
    spec.backwardName = bwdName;
    for (int32_t source : call.sources)
      spec.activeArgs.push_back(source >= 0);
    if (last)
      spec.resultNames.push_back("loss");
    llvm::SetVector<StringRef> trained;
    auto result = differentiateFunction(f, spec, trained);
    if (failed(result))
      return failure();
    auto stageAttr = IntegerAttr::get(IntegerType::get(ctx, 64), k);
    result->forward->setAttr(kPipelineStageAttrName, stageAttr);
    result->backward->setAttr(kPipelineStageAttrName, stageAttr);
    for (auto [j, i] : llvm::enumerate(result->gradOf))
      result->backward.setResultAttr(
          j, "pcc.grad_of", IntegerAttr::get(IntegerType::get(ctx, 32), i));
    if (deferredW)
      splitFusedHeadGradients(result->backward);
    func::FuncOp weightGrad = splitWeightGradients(
        result->backward, "stage" + std::to_string(k) + "_weight_grad");
    weightGrad->setAttr(kPipelineStageAttrName, stageAttr);
    weightGrad->setAttr(kPhaseAttrName,
                        StringAttr::get(ctx, kWeightGradPhaseName));
    weightGrad.walk([&](AccumulateOp op) {
      auto state = op.getState().getDefiningOp<ParamOp>();
      allTrained.insert(splitStateName(state.getName()).first);
    });
  }
  if (allTrained.empty())
    return main.emitError("autodiff: no weight receives a gradient");
  SmallVector<Attribute> names;
  for (StringRef name : allTrained)
    names.push_back(StringAttr::get(ctx, name));
  setTrainingAttr(module, {NamedAttribute(StringAttr::get(ctx, "weights"),
                                          ArrayAttr::get(ctx, names))});
  return success();
}

LogicalResult mlir::pcc::buildStageOptimizers(ModuleOp module, StringRef kind) {
  MLIRContext *ctx = module.getContext();
  SmallVector<std::array<func::FuncOp, 3>> stages =
      getPipelineStagePhases(module);
  unsigned n = stages.size();
  // The weights each stage's W phase trains, in the order of their first
  // gradient.
  SmallVector<llvm::MapVector<StringRef, RankedTensorType>> weights(n);
  for (auto [k, phases] : llvm::enumerate(stages)) {
    if (!phases[2])
      return module.emitError("optimizer: pipeline stage ")
             << k << " has no weight-gradient phase (run pcc-autodiff first)";
    phases[2].walk([&](AccumulateOp op) {
      auto state = op.getState().getDefiningOp<ParamOp>();
      weights[k].insert(
          {splitStateName(state.getName()).first, state.getType()});
    });
    for (auto &[name, type] : weights[k])
      if (!type.getElementType().isF32())
        return phases[2].emitError("optimizer: weight '")
               << name << "' is " << type
               << "; the optimizers update float32 weights";
  }
  // Pipeline rank r runs stages r, r + p, ... (interleaved chunks) and
  // updates the weights of all of them.
  int64_t chunks = getPipelineChunks(module);
  if (chunks < 1 || n % chunks != 0)
    return module.emitError("optimizer: ")
           << n << " stages do not make " << chunks
           << " chunks per pipeline rank";
  unsigned ranks = n / chunks;
  SmallVector<llvm::MapVector<StringRef, RankedTensorType>> held(ranks);
  for (unsigned k = 0; k < n; ++k)
    for (auto &[name, type] : weights[k])
      held[k % ranks].insert({name, type});
  SmallVector<Attribute> tiedNames;
  for (StringRef name : tiedWeights(held))
    tiedNames.push_back(StringAttr::get(ctx, name));
  setTrainingAttr(module, {NamedAttribute(StringAttr::get(ctx, "optimizer"),
                                          StringAttr::get(ctx, kind)),
                           NamedAttribute(StringAttr::get(ctx, "tied"),
                                          ArrayAttr::get(ctx, tiedNames))});
  return buildRankPhases(module, held, FlatShards{ctx, 1}, /*zero=*/0);
}

SmallVector<StringRef> mlir::pcc::tiedWeights(
    ArrayRef<llvm::MapVector<StringRef, RankedTensorType>> held) {
  llvm::SetVector<StringRef> seen, tied;
  for (auto &weights : held)
    for (auto &entry : weights)
      if (!seen.insert(entry.first))
        tied.insert(entry.first);
  return SmallVector<StringRef>(tied.begin(), tied.end());
}

SmallVector<llvm::MapVector<StringRef, RankedTensorType>>
mlir::pcc::rankWeights(ModuleOp module) {
  SmallVector<llvm::MapVector<StringRef, RankedTensorType>> held;
  for (auto func : module.getOps<func::FuncOp>()) {
    auto rank = func->getAttrOfType<IntegerAttr>(kPipelineRankAttrName);
    auto phase = func->getAttrOfType<StringAttr>(kPhaseAttrName);
    if (!rank || !phase || phase.getValue() != kPhaseNames[2])
      continue;
    if (held.size() <= static_cast<size_t>(rank.getInt()))
      held.resize(rank.getInt() + 1);
    func.walk([&](Operation *op) {
      if (!isa<SgdUpdateOp, AdamwUpdateOp>(op))
        return;
      if (auto p = op->getOperand(0).getDefiningOp<ParamOp>())
        held[rank.getInt()].insert({p.getName(), p.getType()});
    });
  }
  return held;
}

LogicalResult mlir::pcc::buildRankPhases(
    ModuleOp module,
    ArrayRef<llvm::MapVector<StringRef, RankedTensorType>> held,
    const FlatShards &flat, int64_t zero, bool gatherWeights,
    bool shardedGradients, const llvm::StringSet<> *started) {
  MLIRContext *ctx = module.getContext();
  Location loc = module.getLoc();
  std::optional<TrainingConfig> training = getTrainingConfig(module);
  if (!training || training->optimizer.empty())
    return module.emitError("optimizer: the module records no optimizer "
                            "(run pcc-optimizer first)");
  std::string kind = training->optimizer;
  for (auto func : llvm::make_early_inc_range(module.getOps<func::FuncOp>()))
    if (func->hasAttr(kPipelineRankAttrName))
      func.erase();
  unsigned ranks = held.size();
  // Weights on several ranks (a tied embedding and head): their gradients
  // are summed over pp before the update; the first holder counts them in
  // the norm.
  DenseMap<StringRef, unsigned> firstHolder;
  for (unsigned r = 0; r < ranks; ++r)
    for (auto &entry : held[r])
      firstHolder.try_emplace(entry.first, r);
  SmallVector<StringRef> tied = tiedWeights(held);
  DenseMap<StringRef, RankedTensorType> typeOf;
  for (auto &weights : held)
    for (auto &[name, type] : weights)
      typeOf.try_emplace(name, type);

  int64_t stage = flat.ranks > 1 ? zero : 0; // the ZeRO stage in effect
  bool gradPieces = stage >= 2 && shardedGradients;
  // A state tensor of a weight as this rank holds it: whole (or its
  // tensor-parallel piece), or ZeRO's flat piece of that over dp.
  auto state = [&](OpBuilder &b, StringRef weight, StringRef what,
                   bool piece) -> Value {
    std::string name = what.empty() ? weight.str() : stateName(weight, what);
    RankedTensorType type = typeOf.lookup(weight);
    return piece ? flat.param(b, loc, name, type)
                 : flat.local(b, loc, name, type);
  };
  OpBuilder mb = OpBuilder::atBlockEnd(module.getBody());
  auto scalar = RankedTensorType::get({}, Float32Type::get(ctx));
  for (unsigned k = 0; k < ranks; ++k) {
    auto rankAttr = IntegerAttr::get(IntegerType::get(ctx, 64), k);
    auto opt =
        func::FuncOp::create(mb, loc, "rank" + std::to_string(k) + "_optimizer",
                             mb.getFunctionType({}, {scalar}));
    opt->setAttr(kPhaseAttrName, mb.getStringAttr(kPhaseNames[2]));
    opt->setAttr(kPipelineRankAttrName, rankAttr);
    opt.setAllResultAttrs(ArrayRef<DictionaryAttr>{DictionaryAttr::get(
        ctx, {NamedAttribute(StringAttr::get(ctx, "pcc.name"),
                             StringAttr::get(ctx, "grad_norm"))})});
    OpBuilder b = OpBuilder::atBlockEnd(opt.addEntryBlock());
    // The gradients' sums over dp that the W phases started complete
    // first (one wait completes every one).
    auto isStarted = [&](StringRef name) {
      return flat.ranks > 1 && !gradPieces && started &&
             started->contains(name);
    };
    for (auto &entry : held[k]) {
      if (!isStarted(entry.first))
        continue;
      Value g = state(b, entry.first, "grad", false);
      auto type = cast<RankedTensorType>(g.getType());
      Value flatGrad = ReshapeOp::create(
          b, loc,
          RankedTensorType::get({type.getNumElements()}, type.getElementType()),
          g);
      BucketWaitOp::create(b, loc, flatGrad,
                           b.getStringAttr(kDataParallelAxis));
      break;
    }
    // Every rank joins every tied weight's sum, in one order; a rank
    // without the weight adds zeros.
    for (StringRef name : tied) {
      bool holds = held[k].count(name);
      RankedTensorType type = typeOf.lookup(name);
      RankedTensorType gradType = gradPieces ? flat.pieceType(type) : type;
      Value g = holds ? state(b, name, "grad", gradPieces)
                      : ConstantOp::create(b, loc, getSplatAttr(gradType, 0.0))
                            .getResult();
      Value sum = AllReduceOp::create(b, loc, gradType, g,
                                      b.getStringAttr(kPipelineAxis));
      if (holds)
        AssignOp::create(b, loc, state(b, name, "grad", gradPieces), sum);
    }
    // Each gradient summed over dp: whole (ZeRO 0), or this rank's piece,
    // reduce-scattered here once per step unless the W phases did.
    SmallVector<Value> grads;
    for (auto &entry : held[k]) {
      StringRef name = entry.first;
      Location at =
          NameLoc::get(b.getStringAttr("the gradient of '" + name.str() + "'"));
      Value g = state(b, name, "grad", gradPieces);
      if (stage == 0 && flat.ranks > 1 && !isStarted(name))
        g = AllReduceOp::create(b, at, g, b.getStringAttr(kDataParallelAxis));
      else if (stage > 0 && !gradPieces)
        // Reduce-scattered in place by the W phase when started: this
        // rank's piece is at its place in the whole gradient.
        g = isStarted(name) ? flat.slice(b, at, g)
                            : flat.reduceScatter(b, at, g);
      grads.push_back(g);
    }
    // The global norm: tensor-parallel pieces' squares summed over tp, the
    // pieces of ZeRO over dp, every rank's weights over pp.
    Value total, splitTotal;
    for (auto [i, entry] : llvm::enumerate(held[k])) {
      if (firstHolder.lookup(entry.first) != k)
        continue;
      Value sum = buildSquaredSum(b, loc, grads[i]);
      Value &into = flat.splitOf(entry.first) ? splitTotal : total;
      into = into ? AddOp::create(b, loc, into, sum).getResult() : sum;
    }
    total = flat.combineNormTerms(b, loc, splitTotal, total);
    if (stage > 0)
      total = AllReduceOp::create(b, loc, scalar, total,
                                  b.getStringAttr(kDataParallelAxis));
    total = AllReduceOp::create(b, loc, scalar, total,
                                b.getStringAttr(kPipelineAxis));
    Value norm = SqrtOp::create(b, loc, total);
    for (auto [i, entry] : llvm::enumerate(held[k])) {
      StringRef name = entry.first;
      Location at =
          NameLoc::get(b.getStringAttr("the update of '" + name.str() + "'"));
      Value p = stage == 0   ? state(b, name, "", false)
                : stage == 3 ? state(b, name, "", true)
                             : state(b, name, kMasterState, true);
      buildOptimizerUpdate(b, at, kind, p, grads[i], norm, [&](StringRef what) {
        return state(b, name, what, stage > 0);
      });
      if (stage == 1 || stage == 2) {
        // One op-building call per statement: the order of arguments'
        // evaluation is the compiler's (GCC's order kept).
        // The updated piece: a load after the update's store.
        Value updated = state(b, name, kMasterState, true);
        Value whole = flat.allGather(b, at, updated, typeOf.lookup(name));
        AssignOp::create(b, at, state(b, name, "", false), whole);
      }
    }
    func::ReturnOp::create(b, loc, ValueRange{norm});

    auto zeroGrad =
        func::FuncOp::create(mb, loc, "rank" + std::to_string(k) + "_zero_grad",
                             mb.getFunctionType({}, {}));
    zeroGrad->setAttr(kPhaseAttrName, mb.getStringAttr(kPhaseNames[3]));
    zeroGrad->setAttr(kPipelineRankAttrName, rankAttr);
    OpBuilder zb = OpBuilder::atBlockEnd(zeroGrad.addEntryBlock());
    for (auto &entry : held[k])
      ZeroOp::create(zb, loc, state(zb, entry.first, "grad", gradPieces));
    // The step's copies of the weights, gathered once for every
    // micro-batch (the pieces changed in the last step's update).
    for (auto &[name, type] : held[k]) {
      if (!gatherWeights)
        break;
      Location at =
          NameLoc::get(zb.getStringAttr("the gathered '" + name.str() + "'"));
      Value whole = flat.allGather(zb, at, state(zb, name, "", true), type);
      AssignOp::create(
          zb, at, flat.local(zb, at, stateName(name, kGatheredState), type),
          whole);
    }
    func::ReturnOp::create(zb, loc, ValueRange{});
  }
  return success();
}
