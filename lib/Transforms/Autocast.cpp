//===- Autocast.cpp - torch.autocast's bf16 and fp16 semantics ------------===//
//
// pcc-autocast and pcc-legalize-bf16 (see Passes.td). pcc-autocast gives
// the model torch.autocast's types: products on a 16-bit float (bf16, or
// fp16 with --precision=fp16: the same op lists), the ops after them in it
// while all their float operands are, f32 where f32 meets it, and losses
// in f32. pcc-legalize-bf16 makes that runnable: an op the back ends do
// not run on 16-bit floats computes in f32 between casts. The bf16 in the
// passes' names is the first of the two types they served; each handles
// both.
//
//===----------------------------------------------------------------------===//

#include "pcc/Dialect/Pcc/IR/Contracts.h"
#include "pcc/Dialect/Pcc/IR/PccDialect.h"
#include "pcc/Transforms/Passes.h"
#include "pcc/Transforms/Training.h"

#include "llvm/ADT/MapVector.h"
#include "llvm/ADT/StringSet.h"

#include <cmath>
#include <map>
#include <optional>
#include <set>

namespace mlir::pcc {
#define GEN_PASS_DEF_AUTOCAST
#define GEN_PASS_DEF_BF16WEIGHTCOPIES
#define GEN_PASS_DEF_BF16WEIGHTS
#define GEN_PASS_DEF_LEGALIZEBF16
#include "pcc/Transforms/Passes.h.inc"
} // namespace mlir::pcc

using namespace mlir;
using namespace mlir::pcc;

namespace {

RankedTensorType tensorOf(Value v) {
  return cast<RankedTensorType>(v.getType());
}

Type elementOf(Value v) { return tensorOf(v).getElementType(); }

bool isFloat(Value v) {
  return isa<RankedTensorType>(v.getType()) && isa<FloatType>(elementOf(v));
}

/// A 16-bit float: bf16, or fp16 (one of the two in a module).
bool isHalfType(Type t) { return t.isBF16() || t.isF16(); }

bool isBf16(Value v) { return isFloat(v) && isHalfType(elementOf(v)); }

bool isF32(Value v) { return isFloat(v) && elementOf(v).isF32(); }

/// A load of state `name` of type `type`, laid out as `like` (its shard,
/// whole shape and ZeRO-within-tp layout).
ParamOp loadLike(OpBuilder &b, Location loc, ParamOp like, Type type,
                 StringAttr name) {
  return ParamOp::create(b, loc, type, name, like.getShardAttr(),
                         like.getWholeAttr(), like.getWithinAttr());
}

/// `v` with element type `element` (a cast before `at`, unless it has it).
Value castTo(Operation *at, Value v, Type element) {
  if (elementOf(v) == element)
    return v;
  OpBuilder b(at);
  // A splat constant folds (CastOp::fold) into a constant of the type,
  // rounded as the cast would round it, so that fusions hold it as a
  // literal instead of reading a cast copy (the GPT-2's GELU read three
  // 1.5M-element bf16 tensors of 0.5, 3 and 0.0447 per layer).
  return b.createOrFold<CastOp>(at->getLoc(), tensorOf(v).clone(element), v);
}

/// Casts every float operand of `op` of type `from` to `to`.
void castOperands(Operation *op, Type from, Type to) {
  for (OpOperand &operand : op->getOpOperands())
    if (isFloat(operand.get()) && elementOf(operand.get()) == from)
      operand.set(castTo(op, operand.get(), to));
}

/// Gives every float result of `op` of type `from` the element type `to`.
void retypeResults(Operation *op, Type from, Type to) {
  for (Value r : op->getResults())
    if (isFloat(r) && elementOf(r) == from)
      r.setType(tensorOf(r).clone(to));
}

/// The op behind `v`, looking through broadcasts and reshapes.
Operation *sourceOf(Value v) {
  Operation *def = v.getDefiningOp();
  while (isa_and_present<BroadcastOp, ReshapeOp>(def))
    def = def->getOperand(0).getDefiningOp();
  return def;
}

/// A splat constant (as a Python scalar in PyTorch): it takes the type of
/// the tensor it meets rather than promoting it.
bool isWeak(Value v) {
  auto constant = dyn_cast_if_present<ConstantOp>(sourceOf(v));
  return constant && isa<SplatElementsAttr>(constant.getValue());
}

/// What torch.autocast (CPU and CUDA) does with an op.
enum class Rule {
  /// bf16 operands, a bf16 result: the lower-precision list.
  Product,
  /// Runs in the type of its float operands: bf16 while they all are, f32
  /// (the bf16 ones widened) where f32 meets bf16 (type promotion).
  Follow,
  /// An op PyTorch runs on a bf16 input into a bf16 result, computing in
  /// f32 inside (softmax, the norms, reductions): here it computes in f32
  /// between casts, so that its gradient does too.
  Wrap,
  /// f32: losses and everything not listed.
  Float32,
  /// Fused attention: q, k and v in bf16 (products in bf16 with f32
  /// accumulation, the softmax in f32 inside, as PyTorch's autocast runs
  /// scaled_dot_product_attention), the result in bf16, the row statistics
  /// and the mask in f32. Under fp16 it runs in f32.
  Attention,
};

Rule ruleOf(Operation *op) {
  if (isa<MatmulOp, ConvOp>(op))
    return Rule::Product;
  if (isa<AttentionOp>(op))
    return Rule::Attention;
  if ((op->hasTrait<OpTrait::Elementwise>() && !isa<CastOp>(op)) ||
      isa<ReshapeOp, TransposeOp, BroadcastOp, ConcatOp, SplitOp, SliceOp,
          PadOp, GatherOp>(op))
    return Rule::Follow;
  if (isa<SoftmaxOp, LogSoftmaxOp, LayerNormOp, BatchNormOp, ReduceSumOp,
          ReduceMeanOp, ReduceMaxOp, ReduceMinOp, ReduceProdOp, DropoutOp,
          MaxPoolOp, AvgPoolOp>(op))
    return Rule::Wrap;
  return Rule::Float32;
}

void follow(Operation *op, Type f32, Type half) {
  SmallVector<Value> strong;
  bool anyBf16 = false;
  for (Value v : op->getOperands()) {
    anyBf16 |= isBf16(v);
    if (isF32(v) && !isWeak(v))
      strong.push_back(v);
  }
  if (!anyBf16)
    return;
  // A linear layer's bias (a weight added to a product), as F.linear adds
  // it under autocast: in bf16.
  bool bias = isa<AddOp>(op) && llvm::all_of(strong, [](Value v) {
                return isa_and_present<ParamOp>(sourceOf(v));
              });
  if (strong.empty() || bias) {
    castOperands(op, f32, half);
    retypeResults(op, f32, half);
    return;
  }
  castOperands(op, half, f32);
}

void wrap(Operation *op, Type f32, Type half) {
  bool halfInput = op->getNumOperands() > 0 && isBf16(op->getOperand(0));
  castOperands(op, half, f32);
  if (!halfInput)
    return;
  OpBuilder b(op->getContext());
  b.setInsertionPointAfter(op);
  for (Value r : op->getResults())
    if (isF32(r)) {
      auto narrow = CastOp::create(b, op->getLoc(), tensorOf(r).clone(half), r);
      r.replaceAllUsesExcept(narrow.getResult(), narrow);
    }
}

/// A linear layer's product followed by its bias, `add(matmul(x, w), b)`
/// with `b` a weight: PyTorch's addmm adds the (16-bit) bias inside the
/// product's fp32 accumulation and rounds once. So the product keeps its
/// fp32 result, the bias is rounded to 16 bits and added in f32, and the
/// sum is rounded once. (Rounding the product first and adding the bias in
/// 16 bits rounds twice: a pre-activation within a rounding of zero can
/// then change sign, and ReLU's gradient with it.)
void accumulateBias(MatmulOp mm, Type f32, Type half) {
  Value r = mm.getResult();
  if (!r.hasOneUse())
    return;
  auto add = dyn_cast<AddOp>(*r.getUsers().begin());
  if (!add)
    return;
  unsigned other = add.getLhs() == r ? 1 : 0;
  Value bias = add->getOperand(other);
  if (!isF32(bias) || !isa_and_present<ParamOp>(sourceOf(bias)) ||
      tensorOf(bias).getShape() != tensorOf(r).getShape())
    return;
  r.setType(tensorOf(r).clone(f32));
  add->setOperand(other, castTo(add, castTo(add, bias, half), f32));
  OpBuilder b(add->getContext());
  b.setInsertionPointAfter(add);
  auto narrow = CastOp::create(
      b, add.getLoc(), tensorOf(add.getResult()).clone(half), add.getResult());
  add.getResult().replaceAllUsesExcept(narrow.getResult(), narrow);
}

struct AutocastPass : public mlir::pcc::impl::AutocastBase<AutocastPass> {
  using AutocastBase::AutocastBase;

  void runOnOperation() override {
    func::FuncOp func = getOperation();
    if (precision == "fp32")
      return;
    if (precision != "bf16" && precision != "fp16") {
      func.emitError("autocast: precision '")
          << precision << "' is not known (bf16, fp16 or fp32)";
      return signalPassFailure();
    }
    Type f32 = Float32Type::get(&getContext());
    Type half = precision == "fp16" ? Type(Float16Type::get(&getContext()))
                                    : Type(BFloat16Type::get(&getContext()));
    // The model's ops as they are before the pass: the casts it inserts
    // are not visited again.
    SmallVector<Operation *> original;
    for (Block &block : func.getBody())
      for (Operation &op : block)
        original.push_back(&op);
    for (Operation *visited : original) {
      Operation &op = *visited;
      if (auto ret = dyn_cast<func::ReturnOp>(op)) {
        // The model's outputs keep their types.
        for (auto [operand, type] : llvm::zip(
                 ret->getOpOperands(), func.getFunctionType().getResults()))
          if (operand.get().getType() != type)
            operand.set(castTo(ret, operand.get(),
                               cast<RankedTensorType>(type).getElementType()));
        continue;
      }
      switch (ruleOf(&op)) {
      case Rule::Product:
        if (llvm::any_of(op.getOperands(), isF32) ||
            llvm::any_of(op.getResults(), isF32)) {
          castOperands(&op, f32, half);
          retypeResults(&op, f32, half);
          if (auto mm = dyn_cast<MatmulOp>(op))
            accumulateBias(mm, f32, half);
        }
        break;
      case Rule::Follow:
        follow(&op, f32, half);
        break;
      case Rule::Wrap:
        wrap(&op, f32, half);
        break;
      case Rule::Float32:
        castOperands(&op, half, f32);
        break;
      case Rule::Attention: {
        auto attention = cast<AttentionOp>(op);
        if (!half.isBF16()) {
          castOperands(&op, half, f32);
          break;
        }
        for (unsigned i = 0; i < 3; ++i)
          op.setOperand(i, castTo(&op, op.getOperand(i), half));
        if (Value bias = attention.getBias(); bias && isBf16(bias))
          attention.getBiasMutable().assign(castTo(&op, bias, f32));
        attention.getResult().setType(
            tensorOf(attention.getResult()).clone(half));
        break;
      }
      }
    }
    auto module = func->getParentOfType<ModuleOp>();
    module->setAttr(kPrecisionAttrName,
                    StringAttr::get(&getContext(), precision));
    if (precision == "fp16") {
      std::optional<std::pair<double, int64_t>> scale =
          parseLossScale(lossScale);
      if (!scale) {
        func.emitError("autocast: loss scale '")
            << lossScale << "' is not dynamic, dynamic:N or a positive number";
        return signalPassFailure();
      }
      Builder b(&getContext());
      module->setAttr(
          kLossScaleAttrName,
          b.getDictionaryAttr(
              {b.getNamedAttr("initial", b.getF64FloatAttr(scale->first)),
               b.getNamedAttr("window", b.getI64IntegerAttr(scale->second))}));
    }
  }
};

/// Ops the back ends run on bf16 as they are: elementwise work (computed in
/// f32, rounded once per result), data movement, products, casts,
/// constants, state copies, collectives and transfers.
bool runsOnBf16(Operation *op) {
  // Fused attention has bf16 kernels (not fp16 ones).
  if (isa<AttentionOp, AttentionGradOp>(op))
    return !elementOf(op->getOperand(0)).isF16();
  // The fused LM head multiplies bf16 and fp16 (f32 statistics).
  if (isa<LinearCrossEntropyOp, LinearCrossEntropyGradOp>(op))
    return true;
  // A weight's 16-bit copy is written by a cast's rounding (the update's
  // other operands are f32).
  if (isa<RefreshCopyOp>(op))
    return true;
  // Cross-entropy widens bf16 logits itself (readBf16Logits).
  if (isa<CrossEntropyOp, CrossEntropyGradOp>(op))
    return elementOf(op->getOperand(0)).isBF16();
  if (auto u = dyn_cast<AdamwUpdateOp>(op))
    return u.getCopy() && llvm::none_of(op->getOperands(), [&](Value v) {
             return v != u.getCopy() && isBf16(v);
           });
  return op->hasTrait<OpTrait::Elementwise>() ||
         isa<CastOp, MatmulOp, ReshapeOp, TransposeOp, BroadcastOp, ConcatOp,
             SplitOp, SliceOp, PadOp, GatherOp, ShardGatherOp, ShardSliceOp,
             AllReduceOp, AllGatherOp, ReduceScatterOp, TransferOp, ParamOp,
             ConstantOp, AssignOp, ZeroOp, func::ReturnOp, func::CallOp>(op);
}

struct LegalizeBf16Pass
    : public mlir::pcc::impl::LegalizeBf16Base<LegalizeBf16Pass> {
  void runOnOperation() override {
    Type f32 = Float32Type::get(&getContext());
    SmallVector<Operation *> ops;
    getOperation().walk([&](Operation *op) {
      if (runsOnBf16(op) || op->getNumRegions() > 0)
        return;
      if (llvm::any_of(op->getOperands(), isBf16) ||
          llvm::any_of(op->getResults(), isBf16))
        ops.push_back(op);
    });
    for (Operation *op : ops) {
      for (OpOperand &operand : op->getOpOperands())
        if (isBf16(operand.get()))
          operand.set(castTo(op, operand.get(), f32));
      SmallVector<std::pair<Value, Type>> narrowed;
      for (Value r : op->getResults())
        if (isBf16(r)) {
          narrowed.push_back({r, r.getType()});
          r.setType(tensorOf(r).clone(f32));
        }
      OpBuilder b(op->getContext());
      b.setInsertionPointAfter(op);
      for (auto [r, type] : narrowed) {
        auto narrow = CastOp::create(b, op->getLoc(), type, r);
        r.replaceAllUsesExcept(narrow.getResult(), narrow);
      }
    }
    SmallVector<Operation *> losses;
    getOperation().walk([&](Operation *op) {
      if (isa<CrossEntropyOp, CrossEntropyGradOp>(op))
        losses.push_back(op);
    });
    for (Operation *op : losses)
      readBf16Logits(op);
  }

  /// Cross-entropy reads bf16 logits as they are (the kernels widen each
  /// exactly: the same losses) instead of a widened f32 copy, and its
  /// gradient is rounded to bf16 as it is written when a cast to bf16 is
  /// its only reader: two passes over the B x S x V logits less each.
  static void readBf16Logits(Operation *op) {
    // `v`'s definition through one-use reshapes: the reshapes and the op.
    auto through = [](Value v, SmallVector<ReshapeOp> &chain) {
      while (auto r = v.getDefiningOp<ReshapeOp>()) {
        if (!r->hasOneUse())
          return Value();
        chain.push_back(r);
        v = r.getInput();
      }
      return v;
    };
    SmallVector<ReshapeOp> chain;
    Value wide = through(op->getOperand(0), chain);
    auto widen = wide ? wide.getDefiningOp<CastOp>() : CastOp();
    if (!widen || !widen->hasOneUse() || !elementOf(widen.getInput()).isBF16())
      return;
    Value logits = widen.getInput();
    OpBuilder b(op);
    // The reshapes again, on bf16 (a reshape is free either way).
    for (ReshapeOp r : llvm::reverse(chain))
      logits = ReshapeOp::create(
          b, r.getLoc(), tensorOf(r.getResult()).clone(elementOf(logits)),
          logits);
    op->setOperand(0, logits);
    for (ReshapeOp r : chain)
      r.erase();
    widen.erase();
    auto grad = dyn_cast<CrossEntropyGradOp>(op);
    if (!grad || !grad->hasOneUse())
      return;
    // The gradient's only reader, through one-use reshapes, a cast to bf16.
    Operation *user = *grad->getUsers().begin();
    SmallVector<Operation *> reshapes;
    while (isa<ReshapeOp>(user) && user->hasOneUse()) {
      reshapes.push_back(user);
      user = *user->getUsers().begin();
    }
    auto narrow = dyn_cast<CastOp>(user);
    if (!narrow || !elementOf(narrow.getResult()).isBF16())
      return;
    Type bf16 = elementOf(narrow.getResult());
    grad.getResult().setType(tensorOf(grad.getResult()).clone(bf16));
    for (Operation *r : reshapes)
      r->getResult(0).setType(tensorOf(r->getResult(0)).clone(bf16));
    narrow.getResult().replaceAllUsesWith(narrow.getInput());
    narrow.erase();
  }
};

/// ZeRO-3 gathers each weight from its pieces where a phase reads it;
/// a weight that is only read through a cast to 16 bits is gathered in 16
/// bits: the cast moves before the all-gather (and the reshapes and slices
/// between them), which it commutes with exactly, and the gather moves half
/// the bytes.
void narrowGathers(ModuleOp module) {
  SmallVector<CastOp> casts;
  module.walk([&](CastOp c) {
    Type to = c.getType().getElementType();
    if ((to.isBF16() || to.isF16()) &&
        c.getInput().getType().getElementType().isF32())
      casts.push_back(c);
  });
  for (CastOp c : casts) {
    SmallVector<Operation *> chain;
    Value v = c.getInput();
    while (isa_and_present<ReshapeOp, SliceOp>(v.getDefiningOp()) &&
           v.hasOneUse()) {
      chain.push_back(v.getDefiningOp());
      v = v.getDefiningOp()->getOperand(0);
    }
    auto gather = v.getDefiningOp<AllGatherOp>();
    if (!gather || !v.hasOneUse())
      continue;
    Type to = c.getType().getElementType();
    gather->getOpOperand(0).set(castTo(gather, gather.getInput(), to));
    gather.getResult().setType(tensorOf(gather.getResult()).clone(to));
    for (Operation *op : llvm::reverse(chain))
      op->getResult(0).setType(tensorOf(op->getResult(0)).clone(to));
    c.getResult().replaceAllUsesWith(c.getInput());
    c.erase();
  }
}

struct Bf16WeightCopiesPass
    : public mlir::pcc::impl::Bf16WeightCopiesBase<Bf16WeightCopiesPass> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (!module->hasAttr(kPrecisionAttrName))
      return;
    narrowGathers(module);
    // The zero-grad phase of each pipeline rank (-1: an unpipelined step).
    std::map<int64_t, func::FuncOp> zeroGrad;
    SmallVector<func::FuncOp> microbatchPhases;
    for (auto func : module.getOps<func::FuncOp>()) {
      auto phase = func->getAttrOfType<StringAttr>(kPhaseAttrName);
      if (!phase)
        continue;
      if (phase.getValue() == kPhaseNames[3]) {
        auto rank = func->getAttrOfType<IntegerAttr>(kPipelineRankAttrName);
        zeroGrad[rank ? rank.getInt() : -1] = func;
      } else if (phase.getValue() == kPhaseNames[0] ||
                 phase.getValue() == kPhaseNames[1] ||
                 phase.getValue() == kWeightGradPhaseName) {
        microbatchPhases.push_back(func);
      }
    }
    if (zeroGrad.empty())
      return;
    // Each pipeline rank's AdamW updates of whole weights, by name: they
    // write the copies at the end of a step (the zero-grad phase then
    // casts only when the run says the copies are stale). A ZeRO shard's
    // or an offloaded update is not a whole weight's; its copy stays the
    // zero-grad phase's cast.
    std::map<std::pair<int64_t, std::string>, AdamwUpdateOp> updates;
    for (auto func : module.getOps<func::FuncOp>()) {
      auto phase = func->getAttrOfType<StringAttr>(kPhaseAttrName);
      if (!phase || phase.getValue() != kPhaseNames[2])
        continue;
      auto rank = func->getAttrOfType<IntegerAttr>(kPipelineRankAttrName);
      func.walk([&](AdamwUpdateOp u) {
        if (auto p = u.getParam().getDefiningOp<ParamOp>())
          updates[{rank ? rank.getInt() : -1, p.getName().str()}] = u;
      });
    }
    std::set<std::pair<int64_t, std::string>> copied;
    for (func::FuncOp phase : microbatchPhases) {
      int64_t rank = -1;
      if (auto stage =
              phase->getAttrOfType<IntegerAttr>(kPipelineStageAttrName)) {
        FailureOr<int64_t> pp = getMeshAxisSize(phase, kPipelineAxis);
        if (failed(pp))
          return signalPassFailure();
        rank = stage.getInt() % *pp;
      }
      auto zg = zeroGrad.find(rank);
      if (zg == zeroGrad.end())
        continue;
      SmallVector<CastOp> casts;
      phase.walk([&](CastOp c) {
        auto weight = c.getInput().getDefiningOp<ParamOp>();
        if (weight && !weight.getName().contains('@') &&
            c.getInput().getType().getElementType().isF32() &&
            isHalfType(c.getType().getElementType()))
          casts.push_back(c);
      });
      for (CastOp c : casts) {
        auto weight = c.getInput().getDefiningOp<ParamOp>();
        std::string name =
            stateName(weight.getName(), c.getType().getElementType().isF16()
                                            ? kF16CopyState
                                            : kBf16CopyState);
        Location loc = c.getLoc();
        if (copied.insert({rank, weight.getName().str()}).second) {
          Block &body = zg->second.getBody().front();
          OpBuilder b(body.getTerminator());
          auto load =
              loadLike(b, loc, weight, weight.getType(), weight.getNameAttr());
          auto copy =
              loadLike(b, loc, weight, c.getType(), b.getStringAttr(name));
          auto update = updates.find({rank, weight.getName().str()});
          if (update != updates.end() && !update->second.getCopy() &&
              update->second.getParam().getType() == weight.getType()) {
            RefreshCopyOp::create(b, loc, copy, load);
            AdamwUpdateOp u = update->second;
            OpBuilder ub(u);
            auto target =
                loadLike(ub, loc, weight, c.getType(), ub.getStringAttr(name));
            u.getCopyMutable().assign(target);
          } else {
            Value narrow = CastOp::create(b, loc, c.getType(), load);
            AssignOp::create(b, loc, copy, narrow);
          }
        }
        OpBuilder b(c);
        auto read =
            loadLike(b, loc, weight, c.getType(), b.getStringAttr(name));
        c.getResult().replaceAllUsesWith(read.getResult());
        c.erase();
        if (weight->use_empty())
          weight.erase();
      }
    }
  }
};

struct Bf16WeightsPass
    : public mlir::pcc::impl::Bf16WeightsBase<Bf16WeightsPass> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (!module->hasAttr(kPrecisionAttrName))
      return;
    // Every load of each weight, and whether all of them are read only
    // through casts to the module's 16-bit type.
    auto precision = module->getAttrOfType<StringAttr>(kPrecisionAttrName);
    Type half = precision.getValue() == "fp16"
                    ? Type(Float16Type::get(&getContext()))
                    : Type(BFloat16Type::get(&getContext()));
    llvm::MapVector<StringRef, SmallVector<ParamOp>> loads;
    llvm::StringSet<> mixed;
    module.walk([&](ParamOp p) {
      if (p.getName().contains('@') || !p.getType().getElementType().isF32())
        return;
      loads[p.getName()].push_back(p);
      bool viaBf16 =
          !p->use_empty() && llvm::all_of(p->getUsers(), [&](Operation *user) {
            auto c = dyn_cast<CastOp>(user);
            return c && c.getType().getElementType() == half;
          });
      if (!viaBf16)
        mixed.insert(p.getName());
    });
    for (auto &[name, params] : loads) {
      if (mixed.contains(name))
        continue;
      for (ParamOp p : params) {
        OpBuilder b(p);
        auto narrow = loadLike(b, p.getLoc(), p, p.getType().clone(half),
                               p.getNameAttr());
        for (Operation *user : llvm::make_early_inc_range(p->getUsers())) {
          user->getResult(0).replaceAllUsesWith(narrow.getResult());
          user->erase();
        }
        p.erase();
      }
    }
  }
};

} // namespace
