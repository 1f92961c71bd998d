//===- Autodiff.cpp - reverse-mode differentiation into phases ------------===//
//
// pcc-autodiff: @main (inputs, labels) -> loss becomes @train_forward and
// @train_backward; a module cut into stages gets each stage's phases
// instead (StagePhases.cpp). The backward program is built in @main, after the
// forward ops, by walking them in reverse and asking each op's
// PccAutodiffOpInterface rule for its operand gradients; then the function
// is split at that boundary. Forward values the backward ops read become
// the forward phase's extra results (residuals); weights and constants are
// read again instead.
//
//===----------------------------------------------------------------------===//

#include "Differentiate.h"
#include "StagePhases.h"
#include "pcc/Analysis/CutSearch.h"
#include "pcc/Dialect/Pcc/IR/PccDialect.h"
#include "pcc/Dialect/Pcc/IR/PccInterfaces.h"
#include "pcc/Transforms/Passes.h"
#include "pcc/Transforms/Training.h"

#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/SetVector.h"

namespace mlir::pcc {
#define GEN_PASS_DEF_AUTODIFF
#include "pcc/Transforms/Passes.h.inc"
} // namespace mlir::pcc

using namespace mlir;
using namespace mlir::pcc;

namespace {

bool isFloat(Value v) {
  return isa<FloatType>(cast<RankedTensorType>(v.getType()).getElementType());
}

/// Values the backward phase can recompute instead of saving: weights,
/// constants, and reshapes and casts of them (mixed precision's bf16 copy
/// of a weight is cast again rather than saved per micro-batch); more as
/// `policy` says (Recompute).
bool isRecomputable(Value v, Recompute policy) {
  Operation *def = v.getDefiningOp();
  if (!def)
    return false;
  if (isa<ParamOp, ConstantOp>(def))
    return true;
  if (isa<ReshapeOp, CastOp>(def) &&
      isRecomputable(def->getOperand(0), Recompute::None))
    return true;
  // A 16-bit float widened to f32 (exact, mixed precision): the backward
  // phase widens the saved 16-bit value again, at half the memory.
  if (auto widen = dyn_cast<CastOp>(def)) {
    Type from = widen.getInput().getType().getElementType();
    if ((from.isBF16() || from.isF16()) &&
        widen.getType().getElementType().isF32())
      return true;
  }
  // A broadcast (an RMSNorm's per-row scale, rotary cos and sin over batch
  // and heads): the backward phase broadcasts the smaller input again,
  // which fuses into its users, rather than the forward saving the copy
  // whole (Llama's saved activations are a fifth broadcasts otherwise).
  if (isa<BroadcastOp>(def))
    return true;
  // The LM head's fused cross-entropy saves N floats; computing them again
  // would cost the head's whole product.
  if (isa<LinearCrossEntropyOp>(def))
    return false;
  if (policy == Recompute::None || !isPure(def) ||
      isa<AllReduceOp, AllGatherOp, ReduceScatterOp, ShardSliceOp,
          ShardGatherOp, TransferOp>(def))
    return false;
  // A product's sum with another value (a residual or bias add) is saved
  // rather than the product (as many bytes in f32; twice a 16-bit
  // product's under mixed precision, whose sums are f32), and under tensor
  // parallelism a row-split product is a partial sum that only the add's
  // all-reduce makes whole. Saving the product itself took an all-reduce
  // of its own per projection, and led the sharding search to split the
  // residual stream along the hidden dimension (3x the bytes sent at
  // Llama-3 8B).
  // Mixed precision widens the 16-bit product first: recomputing such an
  // add chained the residual stream back to the first layer, recomputed
  // at the start of the backward and held (12 GB of arena at Llama-3 70B).
  if (policy == Recompute::Selective && isa<AddOp>(def) &&
      llvm::any_of(def->getOperands(), [](Value operand) {
        Operation *from = operand.getDefiningOp();
        while (isa_and_nonnull<CastOp, ReshapeOp>(from))
          from = from->getOperand(0).getDefiningOp();
        return isa_and_nonnull<MatmulOp, ConvOp>(from);
      }))
    return false;
  return policy == Recompute::Full || !isa<MatmulOp, ConvOp, GatherOp>(def);
}

} // namespace

FailureOr<llvm::StringSet<>>
mlir::pcc::getFrozenWeights(ModuleOp module, ArrayRef<std::string> names,
                            bool remarks) {
  llvm::StringSet<> out, weights;
  module.walk([&](ParamOp param) {
    auto [weight, kind] = splitStateName(param.getName());
    if (!kind.empty() || !isFloat(param.getResult()))
      return;
    weights.insert(weight);
    // PyTorch's rotary embeddings keep their inverse frequencies in a
    // buffer (Hugging Face: `rotary_emb.inv_freq`), which the dynamo
    // exporter writes as an initializer like any weight.
    if (weight.ends_with("inv_freq") && out.insert(weight).second && remarks)
      param.emitRemark("weight '")
          << weight
          << "' is held constant: a rotary embedding's inverse frequencies, "
             "a buffer PyTorch does not train (--frozen names more)";
  });
  for (const std::string &name : names) {
    if (!weights.contains(name))
      return module.emitError("autodiff: --frozen names '")
             << name << "', which is no float weight of the model";
    out.insert(name);
  }
  return out;
}

DictionaryAttr mlir::pcc::nameAttr(MLIRContext *ctx, StringRef name) {
  return DictionaryAttr::get(ctx,
                             {NamedAttribute(StringAttr::get(ctx, "pcc.name"),
                                             StringAttr::get(ctx, name))});
}

/// The forward phase of `main` (before its backward ops): its first
/// `numArgs` arguments (the others are the cotangents the backward ops
/// read) in; the results, then the residuals, out (named in
/// `fwdResultAttrs`).
static func::FuncOp
buildForwardPhase(func::FuncOp main, unsigned numArgs,
                  const DifferentiateSpec &spec, ArrayRef<Operation *> forward,
                  const llvm::SetVector<Value> &residuals,
                  SmallVectorImpl<DictionaryAttr> &fwdResultAttrs) {
  MLIRContext *ctx = main.getContext();
  OpBuilder mb(main);
  auto named = [&](StringRef name) { return nameAttr(ctx, name); };
  Block &block = main.getBody().front();
  auto ret = cast<func::ReturnOp>(block.getTerminator());
  // The forward function: the arguments in; the results and residuals out.
  SmallVector<Type> fwdInputs;
  for (unsigned i = 0; i < numArgs; ++i)
    fwdInputs.push_back(block.getArgument(i).getType());
  SmallVector<Type> fwdResults(ret.getOperandTypes());
  for (Value r : residuals)
    fwdResults.push_back(r.getType());
  auto fwd = func::FuncOp::create(mb, main.getLoc(), spec.forwardName,
                                  mb.getFunctionType(fwdInputs, fwdResults));
  fwd->setAttr(kPhaseAttrName, mb.getStringAttr(kPhaseNames[0]));
  for (unsigned i = 0; i < numArgs; ++i)
    if (DictionaryAttr attrs = main.getArgAttrDict(i))
      fwd.setArgAttrs(i, attrs);
  for (unsigned j = 0; j < ret.getNumOperands(); ++j)
    fwdResultAttrs.push_back(named(j < spec.resultNames.size()
                                       ? spec.resultNames[j]
                                       : "out" + std::to_string(j)));
  for (unsigned i = 0; i < residuals.size(); ++i)
    fwdResultAttrs.push_back(named("saved" + std::to_string(i)));
  fwd.setAllResultAttrs(fwdResultAttrs);
  Block *fwdBlock = fwd.addEntryBlock();
  IRMapping fmap;
  for (unsigned i = 0; i < numArgs; ++i)
    fmap.map(block.getArgument(i), fwdBlock->getArgument(i));
  OpBuilder fb = OpBuilder::atBlockEnd(fwdBlock);
  for (Operation *op : forward)
    fb.clone(*op, fmap);
  SmallVector<Value> fwdReturn;
  for (Value r : ret.getOperands())
    fwdReturn.push_back(fmap.lookup(r));
  for (Value r : residuals)
    fwdReturn.push_back(fmap.lookup(r));
  func::ReturnOp::create(fb, main.getLoc(), fwdReturn);
  return fwd;
}

/// The backward phase: the residuals and the cotangents (`seeds`) in; the
/// active arguments' cotangents (`argGrads`) out (the weights' gradients
/// are state), with the `recomputed` forward values computed again where
/// the `backward` ops read them.
static func::FuncOp
buildBackwardPhase(func::FuncOp main, const DifferentiateSpec &spec,
                   ArrayRef<Operation *> backward,
                   const llvm::SetVector<Value> &residuals,
                   ArrayRef<Value> seeds, ArrayRef<Value> argGrads,
                   const DenseSet<Value> &recomputed, const Differentiated &out,
                   ArrayRef<DictionaryAttr> fwdResultAttrs) {
  MLIRContext *ctx = main.getContext();
  OpBuilder mb(main);
  auto named = [&](StringRef name) { return nameAttr(ctx, name); };
  // The backward function: residuals and cotangents in; the active
  // arguments' cotangents out (the weights' gradients are state).
  SmallVector<Type> bwdInputs, bwdResults;
  for (Value r : residuals)
    bwdInputs.push_back(r.getType());
  for (Value s : seeds)
    bwdInputs.push_back(s.getType());
  for (Value g : argGrads)
    bwdResults.push_back(g.getType());
  auto bwd = func::FuncOp::create(mb, main.getLoc(), spec.backwardName,
                                  mb.getFunctionType(bwdInputs, bwdResults));
  bwd->setAttr(kPhaseAttrName, mb.getStringAttr(kPhaseNames[1]));
  for (unsigned i = 0; i < residuals.size(); ++i)
    bwd.setArgAttrs(i, named("saved" + std::to_string(i)));
  for (auto [k, j] : llvm::enumerate(out.seedOf))
    bwd.setArgAttrs(
        residuals.size() + k,
        named(fwdResultAttrs[j].getAs<StringAttr>("pcc.name").getValue() ==
                      "loss"
                  ? std::string("loss_grad")
                  : "grad_out" + std::to_string(j)));
  for (auto [k, i] : llvm::enumerate(out.gradOf))
    bwd.setResultAttrs(k, named("grad_in" + std::to_string(i)));
  Block *bwdBlock = bwd.addEntryBlock();
  IRMapping bmap;
  for (auto [i, r] : llvm::enumerate(residuals))
    bmap.map(r, bwdBlock->getArgument(i));
  for (auto [k, s] : llvm::enumerate(seeds))
    bmap.map(s, bwdBlock->getArgument(residuals.size() + k));
  OpBuilder bb = OpBuilder::atBlockEnd(bwdBlock);
  // Weights, constants and their reshapes (and with --recompute the
  // policy's values) are computed again where needed.
  std::function<Value(Value)> recompute = [&](Value v) -> Value {
    if (Value mapped = bmap.lookupOrNull(v))
      return mapped;
    Operation *def = v.getDefiningOp();
    for (Value operand : def->getOperands())
      recompute(operand);
    Operation *copy = bb.clone(*def, bmap);
    return copy->getResult(cast<OpResult>(v).getResultNumber());
  };
  for (Operation *op : backward) {
    for (Value operand : op->getOperands())
      if (!bmap.contains(operand) && recomputed.contains(operand))
        recompute(operand);
    bb.clone(*op, bmap);
  }
  SmallVector<Value> bwdReturn;
  for (Value g : argGrads)
    bwdReturn.push_back(recompute(g));
  func::ReturnOp::create(bb, main.getLoc(), bwdReturn);
  return bwd;
}

FailureOr<Differentiated>
mlir::pcc::differentiateFunction(func::FuncOp main,
                                 const DifferentiateSpec &spec,
                                 llvm::SetVector<StringRef> &trained) {
  Block &block = main.getBody().front();
  auto ret = cast<func::ReturnOp>(block.getTerminator());
  SmallVector<Operation *> forward;
  for (Operation &op : block.without_terminator())
    forward.push_back(&op);
  unsigned numArgs = block.getNumArguments();

  // Activity: values that depend on a floating-point weight or on an
  // active argument.
  DenseSet<Value> active;
  for (unsigned i = 0; i < numArgs; ++i)
    if (i < spec.activeArgs.size() && spec.activeArgs[i] &&
        isFloat(block.getArgument(i)))
      active.insert(block.getArgument(i));
  for (Operation *op : forward) {
    auto param = dyn_cast<ParamOp>(op);
    bool fromWeight =
        param && !(spec.frozen && spec.frozen->contains(param.getName()));
    for (Value operand : op->getOperands())
      fromWeight |= active.contains(operand);
    if (fromWeight)
      for (Value result : op->getResults())
        if (isFloat(result))
          active.insert(result);
  }

  // The backward program, after the forward ops: one cotangent argument
  // per float result.
  OpBuilder b(ret);
  Operation *boundary = ret;
  DenseMap<Value, Value> grads;
  Differentiated out;
  SmallVector<Value> seeds;
  for (auto [j, r] : llvm::enumerate(ret.getOperands())) {
    if (!isFloat(r))
      continue;
    Value seed = block.addArgument(r.getType(), main.getLoc());
    seeds.push_back(seed);
    out.seedOf.push_back(static_cast<unsigned>(j));
    Value &slot = grads[r];
    slot =
        slot ? AddOp::create(b, main.getLoc(), slot, seed).getResult() : seed;
  }
  DenseSet<Value> seedSet(seeds.begin(), seeds.end());
  // Declared saved values of every op whose rule ran (checked below).
  DenseSet<Value> declared;

  auto accumulate = [&](ParamOp param, Value g) {
    std::string name = stateName(param.getName(), "grad");
    Value state = ParamOp::create(b, param.getLoc(), param.getType(),
                                  b.getStringAttr(name), ShardingAttr());
    AccumulateOp::create(b, param.getLoc(), state, g);
    trained.insert(param.getName());
  };

  for (Operation *op : llvm::reverse(forward)) {
    SmallVector<Value> resultGrads;
    bool any = false;
    for (Value r : op->getResults()) {
      resultGrads.push_back(grads.lookup(r));
      any |= static_cast<bool>(resultGrads.back());
    }
    if (!any || op->getNumOperands() == 0)
      continue;
    SmallVector<bool> needed;
    bool anyNeeded = false;
    for (Value operand : op->getOperands()) {
      needed.push_back(active.contains(operand));
      anyNeeded |= needed.back();
    }
    if (!anyNeeded)
      continue;
    auto rule = dyn_cast<AutodiffOpInterface>(op);
    if (!rule)
      return op->emitError("autodiff: ")
             << op->getName()
             << " has no gradient rule; training through it is not "
                "supported yet";
    SmallVector<Value> operandGrads;
    if (failed(rule.buildVjp(b, resultGrads, needed, operandGrads)))
      return failure();
    SmallVector<Value> saved;
    rule.getSavedValues(saved);
    declared.insert(saved.begin(), saved.end());
    for (auto [operand, g, want] :
         llvm::zip(op->getOperands(), operandGrads, needed)) {
      if (!g || !want)
        continue;
      if (g.getType() != operand.getType())
        return op->emitError("autodiff: internal error: the rule of ")
               << op->getName() << " gives a " << g.getType()
               << " gradient for a " << operand.getType() << " operand";
      // A weight's gradient goes into its state at once, in the order the
      // backward pass produces it.
      if (auto param = operand.getDefiningOp<ParamOp>()) {
        accumulate(param, g);
        continue;
      }
      Value &slot = grads[operand];
      slot = slot ? AddOp::create(b, op->getLoc(), slot, g).getResult() : g;
    }
  }
  // The active arguments' cotangents (zeros where nothing reached them).
  SmallVector<Value> argGrads;
  for (unsigned i = 0; i < numArgs; ++i) {
    Value arg = block.getArgument(i);
    if (!active.contains(arg))
      continue;
    Value g = grads.lookup(arg);
    if (!g)
      g = ConstantOp::create(
          b, main.getLoc(),
          getSplatAttr(cast<RankedTensorType>(arg.getType()), 0.0));
    argGrads.push_back(g);
    out.gradOf.push_back(i);
  }

  // Split at the boundary: ops before it are the forward phase.
  SmallVector<Operation *> backward;
  for (Operation *op = forward.empty() ? &block.front()
                                       : forward.back()->getNextNode();
       op != boundary; op = op->getNextNode())
    backward.push_back(op);
  DenseSet<Operation *> inBackward(backward.begin(), backward.end());
  llvm::SetVector<Value> residuals;
  // Forward values the backward recomputes: what they read is saved (or
  // recomputed in turn).
  DenseSet<Value> recomputed, readByRecompute;
  // Full recomputation keeps the residual stream where one layer hands
  // over to the next and recomputes one layer at a time, as the backward
  // reaches it (recomputing back to the step's inputs would hold every
  // layer's activations again at once).
  llvm::SetVector<Value> kept;
  if (spec.recompute == Recompute::Full)
    kept =
        layerBoundaryValues(forward, block.getArguments().take_front(numArgs));
  std::function<void(Value, bool)> addResidual = [&](Value operand,
                                                     bool direct) {
    if (seedSet.contains(operand))
      return;
    Operation *def = operand.getDefiningOp();
    if (def && inBackward.contains(def))
      return;
    if (isRecomputable(operand, spec.recompute) &&
        !(kept.contains(operand) &&
          !isRecomputable(operand, Recompute::None))) {
      if (recomputed.insert(operand).second)
        for (Value v : def->getOperands())
          addResidual(v, false);
      return;
    }
    if (!direct)
      readByRecompute.insert(operand);
    residuals.insert(operand);
  };
  for (Operation *op : backward)
    for (Value operand : op->getOperands())
      addResidual(operand, true);
  for (Value g : argGrads)
    addResidual(g, true);
  for (Value r : residuals)
    if (!declared.contains(r) && !isa<BlockArgument>(r) &&
        !readByRecompute.contains(r)) {
      InFlightDiagnostic diag = main.emitError(
          "autodiff: internal error: a gradient rule reads a forward value "
          "it does not declare as saved");
      if (Operation *def = r.getDefiningOp())
        diag.attachNote(def->getLoc()) << "the value of " << def->getName();
      return diag;
    }

  SmallVector<DictionaryAttr> fwdResultAttrs;
  func::FuncOp fwd = buildForwardPhase(main, numArgs, spec, forward, residuals,
                                       fwdResultAttrs);
  func::FuncOp bwd =
      buildBackwardPhase(main, spec, backward, residuals, seeds, argGrads,
                         recomputed, out, fwdResultAttrs);

  // Leave `main` as it was.
  for (Operation *op : llvm::reverse(backward))
    op->erase();
  while (block.getNumArguments() > numArgs)
    block.eraseArgument(block.getNumArguments() - 1);
  out.forward = fwd;
  out.backward = bwd;
  out.numResiduals = residuals.size();
  return out;
}

namespace {

struct AutodiffPass : public mlir::pcc::impl::AutodiffBase<AutodiffPass> {
  using AutodiffBase::AutodiffBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    FailureOr<llvm::StringSet<>> frozenWeights =
        getFrozenWeights(module, frozen, emitRemarks);
    if (failed(frozenWeights))
      return signalPassFailure();
    if (isCutIntoStages(module)) {
      if (failed(differentiateStages(module, recompute, *frozenWeights)))
        signalPassFailure();
      return;
    }
    auto main = module.lookupSymbol<func::FuncOp>("main");
    if (!main || !main.getBody().hasOneBlock()) {
      module.emitError("autodiff: expects a single-block func.func @main");
      return signalPassFailure();
    }
    Block &block = main.getBody().front();
    auto ret = cast<func::ReturnOp>(block.getTerminator());
    if (ret.getNumOperands() != 1 ||
        cast<RankedTensorType>(ret.getOperand(0).getType()).getRank() != 0 ||
        !isFloat(ret.getOperand(0))) {
      main.emitError("autodiff: @main must return one scalar loss (run "
                     "pcc-loss first)");
      return signalPassFailure();
    }
    if (!dependsOnWeight(ret.getOperand(0))) {
      main.emitError("autodiff: the loss does not depend on any float "
                     "weight; there is nothing to train");
      return signalPassFailure();
    }
    DifferentiateSpec spec;
    if (recompute.size() > 1) {
      module.emitError("autodiff: ")
          << recompute.size()
          << " recompute policies, one per stage, for a step not cut into "
             "stages";
      return signalPassFailure();
    }
    StringRef name = recompute.empty() ? "none" : StringRef(recompute[0]);
    std::optional<Recompute> policy = parseRecompute(name);
    if (!policy) {
      module.emitError("autodiff: recompute '")
          << name << "' is not none, selective or full";
      return signalPassFailure();
    }
    spec.recompute = *policy;
    spec.frozen = &*frozenWeights;
    spec.forwardName = kPhaseFunctions[0];
    spec.backwardName = kPhaseFunctions[1];
    spec.resultNames.push_back("loss");
    llvm::SetVector<StringRef> trained;
    if (failed(differentiateFunction(main, spec, trained)))
      return signalPassFailure();
    if (trained.empty()) {
      main.emitError("autodiff: no weight receives a gradient");
      return signalPassFailure();
    }
    MLIRContext *ctx = module.getContext();
    SmallVector<Attribute> names;
    for (StringRef name : trained)
      names.push_back(StringAttr::get(ctx, name));
    main.erase();
    setTrainingAttr(module, {NamedAttribute(StringAttr::get(ctx, "weights"),
                                            ArrayAttr::get(ctx, names))});
  }

  /// Whether `v` depends on a float weight.
  static bool dependsOnWeight(Value v) {
    DenseSet<Operation *> seen;
    SmallVector<Value> work{v};
    while (!work.empty()) {
      Operation *def = work.pop_back_val().getDefiningOp();
      if (!def || !seen.insert(def).second)
        continue;
      if (auto param = dyn_cast<ParamOp>(def))
        if (isFloat(param.getResult()))
          return true;
      for (Value operand : def->getOperands())
        work.push_back(operand);
    }
    return false;
  }
};

} // namespace
