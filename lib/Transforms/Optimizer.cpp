//===- Optimizer.cpp - the optimizer-step and zero-grad phases ------------===//
//
// pcc-optimizer: @train_optimizer and @train_zero_grad after pcc-autodiff
// on a whole step; every pipeline rank's after pcc-autodiff on stages
// (buildStageOptimizers, StagePhases.cpp).
//
//===----------------------------------------------------------------------===//

#include "StagePhases.h"
#include "pcc/Dialect/Pcc/IR/PccDialect.h"
#include "pcc/Transforms/Passes.h"
#include "pcc/Transforms/Training.h"

#include "llvm/ADT/MapVector.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/ADT/StringSet.h"

namespace mlir::pcc {
#define GEN_PASS_DEF_ASSIGNFIRSTGRADIENTS
#define GEN_PASS_DEF_BF16GRADIENTS
#define GEN_PASS_DEF_OPTIMIZER
#include "pcc/Transforms/Passes.h.inc"
} // namespace mlir::pcc

using namespace mlir;
using namespace mlir::pcc;

namespace {

struct OptimizerPass : public mlir::pcc::impl::OptimizerBase<OptimizerPass> {
  using OptimizerBase::OptimizerBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (kind != "sgd" && kind != "adamw") {
      module.emitError("optimizer: unknown optimizer '")
          << kind << "' (sgd or adamw)";
      return signalPassFailure();
    }
    if (isCutIntoStages(module)) {
      if (failed(buildStageOptimizers(module, kind)))
        signalPassFailure();
      return;
    }
    auto backward = module.lookupSymbol<func::FuncOp>(kPhaseFunctions[1]);
    if (!backward) {
      module.emitError("optimizer: no @")
          << kPhaseFunctions[1] << " (run pcc-autodiff first)";
      return signalPassFailure();
    }
    // The weights with gradients, in the order the backward phase first
    // accumulates them, and their types.
    llvm::MapVector<StringRef, RankedTensorType> weights;
    backward.walk([&](AccumulateOp op) {
      auto state = op.getState().getDefiningOp<ParamOp>();
      weights.insert({splitStateName(state.getName()).first, state.getType()});
    });
    for (auto &[name, type] : weights)
      if (!type.getElementType().isF32()) {
        backward.emitError("optimizer: weight '")
            << name << "' is " << type
            << "; the optimizers update float32 weights";
        return signalPassFailure();
      }

    MLIRContext *ctx = module.getContext();
    OpBuilder mb = OpBuilder::atBlockEnd(module.getBody());
    Location loc = backward.getLoc();
    auto scalar = RankedTensorType::get({}, Float32Type::get(ctx));
    auto state = [&](OpBuilder &b, StringRef weight, StringRef what,
                     RankedTensorType type) -> Value {
      std::string name = what.empty() ? weight.str() : stateName(weight, what);
      return ParamOp::create(b, loc, type, b.getStringAttr(name),
                             ShardingAttr());
    };

    // @train_optimizer() -> gradient norm.
    auto opt = func::FuncOp::create(mb, loc, kPhaseFunctions[2],
                                    mb.getFunctionType({}, {scalar}));
    opt->setAttr(kPhaseAttrName, mb.getStringAttr(kPhaseNames[2]));
    opt.setAllResultAttrs(ArrayRef<DictionaryAttr>{DictionaryAttr::get(
        ctx, {NamedAttribute(StringAttr::get(ctx, "pcc.name"),
                             StringAttr::get(ctx, "grad_norm"))})});
    OpBuilder b = OpBuilder::atBlockEnd(opt.addEntryBlock());
    // The global L2 norm of all gradients (torch.nn.utils.clip_grad_norm_).
    Value total;
    for (auto &[name, type] : weights) {
      Value sum = buildSquaredSum(b, loc, state(b, name, "grad", type));
      total = total ? AddOp::create(b, loc, total, sum).getResult() : sum;
    }
    Value norm = SqrtOp::create(b, loc, total);
    for (auto &[name, type] : weights) {
      // One statement per state: the IR's order does not depend on the
      // compiler's order of evaluating arguments.
      Value p = state(b, name, "", type);
      Value g = state(b, name, "grad", type);
      buildOptimizerUpdate(b, loc, kind, p, g, norm, [&](StringRef what) {
        return state(b, name, what, type);
      });
    }
    func::ReturnOp::create(b, loc, ValueRange{norm});

    // @train_zero_grad().
    auto zero = func::FuncOp::create(mb, loc, kPhaseFunctions[3],
                                     mb.getFunctionType({}, {}));
    zero->setAttr(kPhaseAttrName, mb.getStringAttr(kPhaseNames[3]));
    OpBuilder zb = OpBuilder::atBlockEnd(zero.addEntryBlock());
    for (auto &[name, type] : weights)
      ZeroOp::create(zb, loc, state(zb, name, "grad", type));
    func::ReturnOp::create(zb, loc, ValueRange{});

    setTrainingAttr(module, {NamedAttribute(StringAttr::get(ctx, "optimizer"),
                                            StringAttr::get(ctx, kind))});
  }
};

} // namespace

namespace {

/// Program order, each block numbered once: Operation::isBeforeInBlock
/// renumbers a whole block whenever an insertion found no gap, which grows
/// with the square of a large model's backward phase when asked after
/// every rewrite. Valid for ops that were in their block when it was
/// numbered and have kept their relative order.
class ProgramOrder {
public:
  bool isBefore(Operation *a, Operation *b) {
    number(a->getBlock());
    number(b->getBlock());
    return index.lookup(a) < index.lookup(b);
  }

private:
  void number(Block *block) {
    if (!numbered.insert(block).second)
      return;
    size_t i = 0;
    for (Operation &op : *block)
      index[&op] = i++;
  }
  llvm::DenseMap<Operation *, size_t> index;
  llvm::DenseSet<Block *> numbered;
};

struct AssignFirstGradientsPass
    : public mlir::pcc::impl::AssignFirstGradientsBase<
          AssignFirstGradientsPass> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    std::optional<TrainingConfig> config = getTrainingConfig(module);
    if (!config || config->microbatches != 1 || config->zero != 0 ||
        !config->buckets.empty() || config->offloaded)
      return;
    auto forward = module.lookupSymbol<func::FuncOp>(kPhaseFunctions[0]);
    auto backward = module.lookupSymbol<func::FuncOp>(kPhaseFunctions[1]);
    auto zeroGrad = module.lookupSymbol<func::FuncOp>(kPhaseFunctions[3]);
    if (!forward || !backward || !zeroGrad ||
        !backward.getBody().hasOneBlock())
      return;
    auto stateName = [](Value v) -> std::optional<StringRef> {
      if (auto param = v.getDefiningOp<ParamOp>())
        return param.getName();
      return std::nullopt;
    };
    // The states zeroed whole, once.
    llvm::StringMap<ZeroOp> zeroed;
    llvm::StringSet<> twice;
    zeroGrad.walk([&](ZeroOp zero) {
      if (std::optional<StringRef> name = stateName(zero.getState()))
        if (!zeroed.try_emplace(*name, zero).second)
          twice.insert(*name);
    });
    // Ops of `fn` (with their regions) touching a zeroed state, in order.
    auto touches = [&](Operation *top, function_ref<void(StringRef, Value,
                                                         Operation *)>
                                           fn) {
      top->walk([&](Operation *op) {
        for (Value operand : op->getOperands())
          if (std::optional<StringRef> name = stateName(operand))
            if (zeroed.count(*name))
              fn(*name, operand, op);
      });
    };
    llvm::StringSet<> keep(twice);
    touches(forward, [&](StringRef name, Value, Operation *) {
      keep.insert(name);
    });
    // The first op of the backward touching each state, where it is an
    // accumulation of the whole state.
    llvm::StringSet<> seen;
    SmallVector<std::pair<AccumulateOp, ZeroOp>> firsts;
    for (Operation &top : backward.getBody().front())
      touches(&top, [&](StringRef name, Value state, Operation *op) {
        if (!seen.insert(name).second || keep.count(name))
          return;
        ZeroOp zero = zeroed.lookup(name);
        auto acc = dyn_cast<AccumulateOp>(op);
        if (acc && op == &top && acc.getState() == state &&
            acc.getValue() != state &&
            state.getType() == zero.getState().getType())
          firsts.push_back({acc, zero});
      });
    ProgramOrder order;
    for (auto [acc, zero] : firsts) {
      OpBuilder b(acc);
      AssignOp::create(b, acc.getLoc(), acc.getState(), acc.getValue());
      // The state loaded before its value is made, so that the CPU back end
      // can compute the value in the state's memory (a weight gradient's
      // product: CpuDeferral::IntoState).
      Operation *def = acc.getValue().getDefiningOp();
      Operation *load = acc.getState().getDefiningOp();
      if (def && isa_and_nonnull<ParamOp>(load) &&
          def->getBlock() == load->getBlock() && order.isBefore(def, load))
        load->moveBefore(def);
      acc.erase();
      Value state = zero.getState();
      zero.erase();
      if (Operation *load = state.getDefiningOp(); load && load->use_empty())
        load->erase();
    }
  }
};

struct Bf16GradientsPass
    : public mlir::pcc::impl::Bf16GradientsBase<Bf16GradientsPass> {
  /// How a load of a candidate gradient is used.
  struct Uses {
    SmallVector<AssignOp> assigns;
    SmallVector<ReduceSumOp> norms; // reduce_sum(mul(g, g)) over all axes
    SmallVector<AdamwUpdateOp> updates;
  };

  /// Whether every use of `load` is one this pass rewrites, recorded in
  /// `uses`.
  static bool classify(ParamOp load, Uses &uses) {
    for (OpOperand &use : load->getUses()) {
      Operation *user = use.getOwner();
      if (auto assign = dyn_cast<AssignOp>(user)) {
        auto widen = assign.getValue().getDefiningOp<CastOp>();
        if (use.getOperandNumber() != 0 || !widen ||
            !cast<RankedTensorType>(widen.getInput().getType())
                 .getElementType()
                 .isBF16())
          return false;
        uses.assigns.push_back(assign);
        continue;
      }
      if (auto update = dyn_cast<AdamwUpdateOp>(user)) {
        if (update.getGrad() != load.getResult() ||
            update.getParam() == load.getResult())
          return false;
        uses.updates.push_back(update);
        continue;
      }
      auto mul = dyn_cast<MulOp>(user);
      if (!mul || mul.getLhs() != mul.getRhs() || !mul->hasOneUse())
        return false;
      auto sum = dyn_cast<ReduceSumOp>(*mul->getUsers().begin());
      int64_t rank = cast<RankedTensorType>(load.getType()).getRank();
      if (!sum || static_cast<int64_t>(sum.getAxes().size()) != rank ||
          sum.getKeepDims())
        return false;
      if (llvm::is_contained(uses.norms, sum))
        continue; // the mul's second operand
      uses.norms.push_back(sum);
    }
    return true;
  }

  void runOnOperation() override {
    ModuleOp module = getOperation();
    // Every f32 load of each state, by name; names some other op writes
    // or reads are dropped below.
    llvm::MapVector<StringRef, SmallVector<ParamOp>> loads;
    llvm::StringSet<> rejected;
    module.walk([&](ParamOp p) {
      if (!p.getType().getElementType().isF32())
        rejected.insert(p.getName());
      loads[p.getName()].push_back(p);
    });
    ProgramOrder order;
    for (auto &[name, ps] : loads) {
      if (rejected.contains(name))
        continue;
      Uses uses;
      bool ok = llvm::all_of(ps, [&](ParamOp p) { return classify(p, uses); });
      // One write per step (the assign), read by the norm and AdamW only.
      if (!ok || uses.assigns.size() != 1 || uses.updates.size() != 1 ||
          uses.norms.size() > 1)
        continue;
      for (ParamOp p : ps) {
        OpBuilder b(p);
        auto narrow = ParamOp::create(
            b, p.getLoc(),
            p.getType().clone(BFloat16Type::get(module.getContext())),
            p.getNameAttr(), p.getShardAttr(), p.getWholeAttr(),
            p.getWithinAttr());
        llvm::SetVector<Operation *> users;
        for (Operation *user : p->getUsers())
          users.insert(user);
        for (Operation *user : users) {
          if (auto assign = dyn_cast<AssignOp>(user)) {
            auto widen = assign.getValue().getDefiningOp<CastOp>();
            OpBuilder ab(assign);
            AssignOp::create(ab, assign.getLoc(), narrow, widen.getInput());
            // Loaded before the value is made, so that the back end can
            // compute the value in the state's memory.
            Operation *def = widen.getInput().getDefiningOp();
            // (narrow is just before p, which was there when numbered.)
            if (def && def->getBlock() == narrow->getBlock() &&
                order.isBefore(def, p))
              narrow->moveBefore(def);
            assign.erase();
            if (widen->use_empty())
              widen.erase();
          } else if (auto update = dyn_cast<AdamwUpdateOp>(user)) {
            update.getGradMutable().assign(narrow);
          } else {
            auto mul = cast<MulOp>(user);
            auto sum = cast<ReduceSumOp>(*mul->getUsers().begin());
            OpBuilder sb(sum);
            auto squares =
                SumSquaresOp::create(sb, sum.getLoc(), sum.getType(), narrow);
            sum.getResult().replaceAllUsesWith(squares.getResult());
            sum.erase();
            mul.erase();
          }
        }
        p.erase();
      }
    }
  }
};

} // namespace

Value mlir::pcc::buildSquaredSum(OpBuilder &b, Location loc, Value x) {
  Value sq = MulOp::create(b, loc, x, x);
  int64_t rank = cast<RankedTensorType>(x.getType()).getRank();
  if (rank == 0)
    return sq;
  SmallVector<int64_t> all;
  for (int64_t d = 0; d < rank; ++d)
    all.push_back(d);
  return ReduceSumOp::create(b, loc, sq, all, /*keep_dims=*/false);
}

void mlir::pcc::buildOptimizerUpdate(OpBuilder &b, Location loc, StringRef kind,
                                     Value p, Value g, Value norm,
                                     function_ref<Value(StringRef)> state) {
  // One statement per state: the IR's order does not depend on the
  // compiler's order of evaluating arguments.
  if (kind == "sgd") {
    Value buf = state("momentum_buffer");
    SgdUpdateOp::create(b, loc, p, g, buf, norm);
    return;
  }
  Value m = state("exp_avg");
  Value v = state("exp_avg_sq");
  AdamwUpdateOp::create(b, loc, p, g, m, v, norm, /*copy=*/Value());
}
