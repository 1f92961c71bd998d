//===- Autodiff.cpp - reverse-mode differentiation into phases ------------===//
//
// pcc-autodiff: @main (inputs, labels) -> loss becomes @train_forward and
// @train_backward. The backward program is built in @main, after the
// forward ops, by walking them in reverse and asking each op's
// PccAutodiffOpInterface rule for its operand gradients; then the function
// is split at that boundary. Forward values the backward ops read become
// the forward phase's extra results (residuals); weights and constants are
// read again instead.
//
//===----------------------------------------------------------------------===//

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
/// constants and reshapes of them.
bool isRecomputable(Value v) {
  Operation *def = v.getDefiningOp();
  if (!def)
    return false;
  if (isa<ParamOp, ConstantOp>(def))
    return true;
  if (auto reshape = dyn_cast<ReshapeOp>(def))
    return isRecomputable(reshape.getInput());
  return false;
}

struct AutodiffPass : public mlir::pcc::impl::AutodiffBase<AutodiffPass> {
  using AutodiffBase::AutodiffBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
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
    if (failed(differentiate(module, main)))
      return signalPassFailure();
  }

  LogicalResult differentiate(ModuleOp module, func::FuncOp main);
};

LogicalResult AutodiffPass::differentiate(ModuleOp module, func::FuncOp main) {
  Block &block = main.getBody().front();
  auto ret = cast<func::ReturnOp>(block.getTerminator());
  Value loss = ret.getOperand(0);
  SmallVector<Operation *> forward;
  for (Operation &op : block.without_terminator())
    forward.push_back(&op);

  // Activity: values that depend on a floating-point weight.
  DenseSet<Value> active;
  for (Operation *op : forward) {
    bool fromWeight = isa<ParamOp>(op);
    for (Value operand : op->getOperands())
      fromWeight |= active.contains(operand);
    if (fromWeight)
      for (Value result : op->getResults())
        if (isFloat(result))
          active.insert(result);
  }
  if (!active.contains(loss))
    return main.emitError("autodiff: the loss does not depend on any "
                          "float weight; there is nothing to train");

  // The backward program, after the forward ops.
  OpBuilder b(ret);
  auto seedType = cast<RankedTensorType>(loss.getType());
  Value seed = block.addArgument(seedType, main.getLoc());
  Operation *boundary = ret;
  DenseMap<Value, Value> grads;
  grads[loss] = seed;
  // Declared saved values of every op whose rule ran (checked below).
  DenseSet<Value> declared;
  // Weights in the order their first gradient appears.
  llvm::SetVector<StringRef> trained;

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
  if (trained.empty())
    return main.emitError("autodiff: no weight receives a gradient");

  // Split at the boundary: ops before it are the forward phase.
  SmallVector<Operation *> backward;
  for (Operation *op = forward.back()->getNextNode(); op != boundary;
       op = op->getNextNode())
    backward.push_back(op);
  DenseSet<Operation *> inBackward(backward.begin(), backward.end());
  llvm::SetVector<Value> residuals;
  for (Operation *op : backward)
    for (Value operand : op->getOperands()) {
      if (operand == seed)
        continue;
      Operation *def = operand.getDefiningOp();
      if (def && inBackward.contains(def))
        continue;
      if (isRecomputable(operand))
        continue;
      residuals.insert(operand);
    }
  for (Value r : residuals)
    if (!declared.contains(r)) {
      InFlightDiagnostic diag = main.emitError(
          "autodiff: internal error: a gradient rule reads a forward value "
          "it does not declare as saved");
      if (Operation *def = r.getDefiningOp())
        diag.attachNote(def->getLoc()) << "the value of " << def->getName();
      return diag;
    }

  MLIRContext *ctx = module.getContext();
  OpBuilder mb(main);
  auto named = [&](StringRef name) {
    return DictionaryAttr::get(
        ctx, {NamedAttribute(StringAttr::get(ctx, "pcc.name"),
                             StringAttr::get(ctx, name))});
  };

  // @train_forward: the inputs and labels in; the loss and residuals out.
  // Every argument of @main but the loss gradient added above.
  SmallVector<Type> fwdInputs(main.getArgumentTypes());
  SmallVector<Type> fwdResults{loss.getType()};
  for (Value r : residuals)
    fwdResults.push_back(r.getType());
  auto fwd = func::FuncOp::create(mb, main.getLoc(), kPhaseFunctions[0],
                                  mb.getFunctionType(fwdInputs, fwdResults));
  fwd->setAttr(kPhaseAttrName, mb.getStringAttr(kPhaseNames[0]));
  for (unsigned i = 0; i < fwdInputs.size(); ++i)
    if (DictionaryAttr attrs = main.getArgAttrDict(i))
      fwd.setArgAttrs(i, attrs);
  SmallVector<DictionaryAttr> fwdResultAttrs{named("loss")};
  for (unsigned i = 0; i < residuals.size(); ++i)
    fwdResultAttrs.push_back(named("saved" + std::to_string(i)));
  fwd.setAllResultAttrs(fwdResultAttrs);
  Block *fwdBlock = fwd.addEntryBlock();
  IRMapping fmap;
  for (unsigned i = 0; i < fwdInputs.size(); ++i)
    fmap.map(block.getArgument(i), fwdBlock->getArgument(i));
  OpBuilder fb = OpBuilder::atBlockEnd(fwdBlock);
  for (Operation *op : forward)
    fb.clone(*op, fmap);
  SmallVector<Value> fwdReturn{fmap.lookup(loss)};
  for (Value r : residuals)
    fwdReturn.push_back(fmap.lookup(r));
  func::ReturnOp::create(fb, main.getLoc(), fwdReturn);

  // @train_backward: residuals and the loss gradient in; nothing out (the
  // gradients are state).
  SmallVector<Type> bwdInputs;
  for (Value r : residuals)
    bwdInputs.push_back(r.getType());
  bwdInputs.push_back(seedType);
  auto bwd = func::FuncOp::create(mb, main.getLoc(), kPhaseFunctions[1],
                                  mb.getFunctionType(bwdInputs, {}));
  bwd->setAttr(kPhaseAttrName, mb.getStringAttr(kPhaseNames[1]));
  for (unsigned i = 0; i < residuals.size(); ++i)
    bwd.setArgAttrs(i, named("saved" + std::to_string(i)));
  bwd.setArgAttrs(residuals.size(), named("loss_grad"));
  Block *bwdBlock = bwd.addEntryBlock();
  IRMapping bmap;
  for (auto [i, r] : llvm::enumerate(residuals))
    bmap.map(r, bwdBlock->getArgument(i));
  bmap.map(seed, bwdBlock->getArguments().back());
  OpBuilder bb = OpBuilder::atBlockEnd(bwdBlock);
  // Weights, constants and their reshapes are read again where needed.
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
      if (!bmap.contains(operand) && isRecomputable(operand))
        recompute(operand);
    bb.clone(*op, bmap);
  }
  func::ReturnOp::create(bb, main.getLoc(), ValueRange{});

  main.erase();
  SmallVector<Attribute> names;
  for (StringRef name : trained)
    names.push_back(StringAttr::get(ctx, name));
  setTrainingAttr(module, {NamedAttribute(StringAttr::get(ctx, "weights"),
                                          ArrayAttr::get(ctx, names))});
  return success();
}

} // namespace
