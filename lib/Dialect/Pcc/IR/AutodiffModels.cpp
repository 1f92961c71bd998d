//===- AutodiffModels.cpp - the VJP rule of every differentiable pcc op ---===//
//
// PccAutodiffOpInterface's external models: one rule per op (or op family),
// written as pcc ops so that the gradient program is planned, partitioned,
// fused and emitted like the forward one. Rules follow PyTorch's derivative
// formulas (tools/autograd/derivatives.yaml) where the two could differ:
// relu and leaky_relu test the sign of their result/input strictly, clamp
// passes the gradient at its bounds, max/min split it at ties, reduce_max
// spreads it evenly over the maxima (amax), abs has zero slope at 0.
//
// Ops that are not differentiable (comparisons, integer arithmetic,
// argmax, rounding) have rules that return no gradient, so a model that
// computes masks or positions differentiates; ops that have no rule yet
// have no model and pcc-autodiff refuses them, naming the ONNX node.
//
//===----------------------------------------------------------------------===//

#include "pcc/Dialect/Pcc/IR/PccDialect.h"
#include "pcc/Dialect/Pcc/IR/PccInterfaces.h"

#include <cmath>
#include <numeric>

using namespace mlir;
using namespace mlir::pcc;

namespace {

RankedTensorType typeOf(Value v) { return cast<RankedTensorType>(v.getType()); }

bool isFloatValue(Value v) {
  return isa<FloatType>(typeOf(v).getElementType());
}

/// Builds gradient ops at one location.
struct GradBuilder {
  OpBuilder &b;
  Location loc;

  Value splat(RankedTensorType type, double value) {
    return ConstantOp::create(b, loc, getSplatAttr(type, value));
  }
  Value like(Value v, double value) { return splat(typeOf(v), value); }
  Value add(Value x, Value y) { return AddOp::create(b, loc, x, y); }
  Value sub(Value x, Value y) { return SubOp::create(b, loc, x, y); }
  Value mul(Value x, Value y) { return MulOp::create(b, loc, x, y); }
  Value div(Value x, Value y) { return DivOp::create(b, loc, x, y); }
  Value neg(Value x) { return NegOp::create(b, loc, x); }
  Value scale(Value x, double c) { return mul(x, like(x, c)); }
  Value cmp(ComparePredicate p, Value x, Value y) {
    return CompareOp::create(b, loc, p, x, y);
  }
  Value select(Value c, Value x, Value y) {
    return SelectOp::create(b, loc, c, x, y);
  }
  /// g where `c`, else 0.
  Value mask(Value c, Value g) { return select(c, g, like(g, 0.0)); }
  Value reshape(Value v, ArrayRef<int64_t> shape) {
    RankedTensorType t = typeOf(v);
    if (t.getShape() == shape)
      return v;
    return ReshapeOp::create(
        b, loc, RankedTensorType::get(shape, t.getElementType()), v);
  }
  Value broadcast(Value v, ArrayRef<int64_t> shape) {
    RankedTensorType t = typeOf(v);
    if (t.getShape() == shape)
      return v;
    return BroadcastOp::create(
        b, loc, RankedTensorType::get(shape, t.getElementType()), v);
  }
  /// Sums `axes` of `v`, keeping them as size-1 dimensions.
  Value sumKeep(Value v, ArrayRef<int64_t> axes) {
    if (axes.empty())
      return v;
    return ReduceSumOp::create(b, loc, v, axes, /*keep_dims=*/true);
  }
  /// `v` reduced over `axes` (kept as size 1) broadcast back to `shape`.
  Value sumBroadcast(Value v, ArrayRef<int64_t> axes) {
    return broadcast(sumKeep(v, axes), typeOf(v).getShape());
  }
  /// The gradient of a broadcast: `g` summed down to `shape` (numpy rules:
  /// leading dimensions dropped, size-1 dimensions summed).
  Value sumToShape(Value g, ArrayRef<int64_t> shape) {
    ArrayRef<int64_t> from = typeOf(g).getShape();
    if (from == shape)
      return g;
    int64_t shift = from.size() - shape.size();
    SmallVector<int64_t> axes;
    for (int64_t d = 0; d < static_cast<int64_t>(from.size()); ++d)
      if (d < shift || (shape[d - shift] == 1 && from[d] != 1))
        axes.push_back(d);
    Value summed = sumKeep(g, axes);
    return reshape(summed, shape);
  }
  Value transpose(Value v, ArrayRef<int64_t> perm) {
    return TransposeOp::create(b, loc, v, perm);
  }
  Value matmul(Value x, Value y, bool ta, bool tb) {
    return MatmulOp::create(b, loc, x, y, ta, tb);
  }
};

/// Every axis of a tensor from `first` on.
SmallVector<int64_t> axesFrom(int64_t first, int64_t rank) {
  SmallVector<int64_t> axes(rank - first);
  std::iota(axes.begin(), axes.end(), first);
  return axes;
}

LogicalResult unsupported(Operation *op, const Twine &what) {
  return op->emitError("autodiff: ") << op->getName() << " " << what;
}

//===----------------------------------------------------------------------===//
// Rules. Each returns the operand gradients (null: none) and names the
// forward values it reads.
//===----------------------------------------------------------------------===//

/// Ops that are not differentiable: no gradient for any operand.
template <typename OpT> struct NoGradient {
  static void saved(OpT, SmallVectorImpl<Value> &) {}
  static LogicalResult vjp(OpT op, GradBuilder &, ArrayRef<Value>,
                           ArrayRef<bool>, SmallVectorImpl<Value> &grads) {
    grads.assign(op->getNumOperands(), Value());
    return success();
  }
};

template <typename OpT> struct Rule;

// Unary ops: dx = g * f'(x), written with the saved input or result.
#define PCC_UNARY_RULE(OP, SAVE, BODY)                                         \
  template <> struct Rule<OP> {                                                \
    static void saved(OP op, SmallVectorImpl<Value> &s) {                      \
      Value x = op.getInput(), y = op.getResult();                             \
      (void)x;                                                                 \
      (void)y;                                                                 \
      s.append(SAVE);                                                          \
    }                                                                          \
    static LogicalResult vjp(OP op, GradBuilder &gb, ArrayRef<Value> rg,       \
                             ArrayRef<bool>, SmallVectorImpl<Value> &grads) {  \
      Value x = op.getInput(), y = op.getResult(), g = rg[0];                  \
      (void)x;                                                                 \
      (void)y;                                                                 \
      grads.push_back(BODY);                                                   \
      return success();                                                        \
    }                                                                          \
  };

using Values = std::initializer_list<Value>;

PCC_UNARY_RULE(NegOp, (Values{}), gb.neg(g))
PCC_UNARY_RULE(AbsOp, (Values{x}), [&] {
  // One op per statement: C++ leaves the order in which arguments are
  // evaluated open, and the IR's order must not depend on the compiler
  // (the planners walk it in order). The order is the one GCC gave the
  // nested form these rules had, which the suite's plans were made with.
  Value flipped = gb.neg(g);
  Value negative = gb.cmp(ComparePredicate::lt, x, gb.like(x, 0.0));
  Value onNegative = gb.mask(negative, flipped);
  Value positive = gb.cmp(ComparePredicate::gt, x, gb.like(x, 0.0));
  return gb.select(positive, g, onNegative);
}())
PCC_UNARY_RULE(SqrtOp, (Values{y}), gb.div(g, gb.scale(y, 2.0)))
PCC_UNARY_RULE(ReciprocalOp, (Values{y}), gb.neg(gb.mul(g, gb.mul(y, y))))
PCC_UNARY_RULE(ExpOp, (Values{y}), gb.mul(g, y))
PCC_UNARY_RULE(LogOp, (Values{x}), gb.div(g, x))
PCC_UNARY_RULE(ErfOp, (Values{x}),
               gb.mul(g, gb.scale(ExpOp::create(gb.b, gb.loc,
                                                gb.neg(gb.mul(x, x))),
                                  2.0 / std::sqrt(M_PI))))
PCC_UNARY_RULE(TanhOp, (Values{y}), [&] {
  // One op per statement (see AbsOp's rule).
  Value square = gb.mul(y, y);
  Value one = gb.like(y, 1.0);
  return gb.mul(g, gb.sub(one, square));
}())
PCC_UNARY_RULE(SigmoidOp, (Values{y}),
               gb.mul(g, gb.mul(y, gb.sub(gb.like(y, 1.0), y))))
PCC_UNARY_RULE(ReluOp, (Values{y}),
               gb.mask(gb.cmp(ComparePredicate::gt, y, gb.like(y, 0.0)), g))
PCC_UNARY_RULE(SinOp, (Values{x}),
               gb.mul(g, CosOp::create(gb.b, gb.loc, x)))
PCC_UNARY_RULE(CosOp, (Values{x}),
               gb.neg(gb.mul(g, SinOp::create(gb.b, gb.loc, x))))
#undef PCC_UNARY_RULE

template <> struct Rule<GeluOp> {
  static void saved(GeluOp op, SmallVectorImpl<Value> &s) {
    s.push_back(op.getInput());
  }
  static LogicalResult vjp(GeluOp op, GradBuilder &gb, ArrayRef<Value> rg,
                           ArrayRef<bool>, SmallVectorImpl<Value> &grads) {
    Value x = op.getInput(), g = rg[0];
    Value half = gb.like(x, 0.5), one = gb.like(x, 1.0);
    Value slope;
    if (op.getTanhApproximation()) {
      // t = tanh(k (x + c x^3)): 0.5 (1 + t) + 0.5 x (1 - t^2) k (1 + 3 c x^2)
      const double k = std::sqrt(2.0 / M_PI), c = 0.044715;
      Value x2 = gb.mul(x, x);
      Value inner = gb.scale(gb.add(x, gb.scale(gb.mul(x2, x), c)), k);
      Value t = TanhOp::create(gb.b, gb.loc, inner);
      Value dInner = gb.scale(gb.add(one, gb.scale(x2, 3.0 * c)), k);
      // One op per statement (see AbsOp's rule).
      Value sech2 = gb.sub(one, gb.mul(t, t));
      Value chain = gb.mul(sech2, dInner);
      Value halfX = gb.mul(half, x);
      Value right = gb.mul(halfX, chain);
      Value left = gb.mul(half, gb.add(one, t));
      slope = gb.add(left, right);
    } else {
      // Phi(x) + x phi(x)
      Value cdf = gb.mul(
          half, gb.add(one, ErfOp::create(gb.b, gb.loc,
                                          gb.scale(x, 1.0 / std::sqrt(2.0)))));
      Value pdf = gb.scale(
          ExpOp::create(gb.b, gb.loc, gb.scale(gb.mul(x, x), -0.5)),
          1.0 / std::sqrt(2.0 * M_PI));
      slope = gb.add(cdf, gb.mul(x, pdf));
    }
    grads.push_back(gb.mul(g, slope));
    return success();
  }
};

template <> struct Rule<LeakyReluOp> {
  static void saved(LeakyReluOp op, SmallVectorImpl<Value> &s) {
    s.push_back(op.getInput());
  }
  static LogicalResult vjp(LeakyReluOp op, GradBuilder &gb, ArrayRef<Value> rg,
                           ArrayRef<bool>, SmallVectorImpl<Value> &grads) {
    Value x = op.getInput(), g = rg[0];
    // One op per statement (see AbsOp's rule).
    Value scaled = gb.scale(g, op.getAlpha().convertToFloat());
    Value positive = gb.cmp(ComparePredicate::gt, x, gb.like(x, 0.0));
    grads.push_back(gb.select(positive, g, scaled));
    return success();
  }
};

template <> struct Rule<ClampOp> {
  static void saved(ClampOp op, SmallVectorImpl<Value> &s) {
    s.push_back(op.getInput());
  }
  static LogicalResult vjp(ClampOp op, GradBuilder &gb, ArrayRef<Value> rg,
                           ArrayRef<bool>, SmallVectorImpl<Value> &grads) {
    Value x = op.getInput(), g = rg[0];
    // One op per statement (see AbsOp's rule).
    Value belowMax = gb.cmp(ComparePredicate::le, x,
                            gb.like(x, op.getMax().convertToDouble()));
    Value aboveMin = gb.cmp(ComparePredicate::ge, x,
                            gb.like(x, op.getMin().convertToDouble()));
    Value inside = AndOp::create(gb.b, gb.loc, aboveMin, belowMax);
    grads.push_back(gb.mask(inside, g));
    return success();
  }
};

// Binary ops (operands of one shape: the importer made broadcasts explicit).
template <> struct Rule<AddOp> {
  static void saved(AddOp, SmallVectorImpl<Value> &) {}
  static LogicalResult vjp(AddOp, GradBuilder &, ArrayRef<Value> rg,
                           ArrayRef<bool>, SmallVectorImpl<Value> &grads) {
    grads.append({rg[0], rg[0]});
    return success();
  }
};

template <> struct Rule<SubOp> {
  static void saved(SubOp, SmallVectorImpl<Value> &) {}
  static LogicalResult vjp(SubOp, GradBuilder &gb, ArrayRef<Value> rg,
                           ArrayRef<bool> needed,
                           SmallVectorImpl<Value> &grads) {
    grads.append({rg[0], needed[1] ? gb.neg(rg[0]) : Value()});
    return success();
  }
};

template <> struct Rule<MulOp> {
  static void saved(MulOp op, SmallVectorImpl<Value> &s) {
    s.append({op.getLhs(), op.getRhs()});
  }
  static LogicalResult vjp(MulOp op, GradBuilder &gb, ArrayRef<Value> rg,
                           ArrayRef<bool> needed,
                           SmallVectorImpl<Value> &grads) {
    grads.append({needed[0] ? gb.mul(rg[0], op.getRhs()) : Value(),
                  needed[1] ? gb.mul(rg[0], op.getLhs()) : Value()});
    return success();
  }
};

template <> struct Rule<DivOp> {
  static void saved(DivOp op, SmallVectorImpl<Value> &s) {
    s.append({op.getRhs(), op.getResult()});
  }
  static LogicalResult vjp(DivOp op, GradBuilder &gb, ArrayRef<Value> rg,
                           ArrayRef<bool> needed,
                           SmallVectorImpl<Value> &grads) {
    if (!isFloatValue(op.getResult()))
      return NoGradient<DivOp>::vjp(op, gb, rg, needed, grads);
    Value dx = gb.div(rg[0], op.getRhs());
    grads.append({needed[0] ? dx : Value(),
                  needed[1] ? gb.neg(gb.mul(dx, op.getResult())) : Value()});
    return success();
  }
};

template <> struct Rule<PowOp> {
  static void saved(PowOp op, SmallVectorImpl<Value> &s) {
    s.append({op.getLhs(), op.getRhs(), op.getResult()});
  }
  static LogicalResult vjp(PowOp op, GradBuilder &gb, ArrayRef<Value> rg,
                           ArrayRef<bool> needed,
                           SmallVectorImpl<Value> &grads) {
    Value x = op.getLhs(), e = op.getRhs(), y = op.getResult(), g = rg[0];
    // d/dx = e x^(e-1), 0 where e == 0 (PyTorch's pow_backward).
    Value dx;
    if (needed[0]) {
      Value powm1 = PowOp::create(gb.b, gb.loc, x, gb.sub(e, gb.like(e, 1.0)));
      Value slope = gb.mul(g, gb.mul(e, powm1));
      Value nonzero = gb.cmp(ComparePredicate::ne, e, gb.like(e, 0.0));
      dx = gb.mask(nonzero, slope);
    }
    // d/de = x^e log x, 0 where x == 0 and e >= 0.
    Value de;
    if (needed[1]) {
      Value zero = gb.like(x, 0.0);
      Value negative = gb.cmp(ComparePredicate::lt, e, gb.like(e, 0.0));
      Value nonzero = gb.cmp(ComparePredicate::ne, x, zero);
      Value keep = OrOp::create(gb.b, gb.loc, nonzero, negative);
      de = gb.mask(keep, gb.mul(g, gb.mul(y, LogOp::create(gb.b, gb.loc, x))));
    }
    grads.append({dx, de});
    return success();
  }
};

/// max and min: the gradient goes to the operand that was chosen, half to
/// each at ties (PyTorch's maximum/minimum backward).
template <typename OpT, ComparePredicate Wins> struct ExtremumRule {
  static void saved(OpT op, SmallVectorImpl<Value> &s) {
    s.append({op.getLhs(), op.getRhs()});
  }
  static LogicalResult vjp(OpT op, GradBuilder &gb, ArrayRef<Value> rg,
                           ArrayRef<bool>, SmallVectorImpl<Value> &grads) {
    Value x = op.getLhs(), y = op.getRhs(), g = rg[0];
    Value half = gb.scale(g, 0.5);
    Value tie = gb.cmp(ComparePredicate::eq, x, y);
    Value lhsTie = gb.mask(tie, half);
    Value xWins = gb.cmp(Wins, x, y);
    Value lhs = gb.select(xWins, g, lhsTie);
    Value rhsTie = gb.mask(tie, half);
    Value yWins = gb.cmp(Wins, y, x);
    Value rhs = gb.select(yWins, g, rhsTie);
    grads.append({lhs, rhs});
    return success();
  }
};
template <>
struct Rule<MaxOp> : ExtremumRule<MaxOp, ComparePredicate::gt> {};
template <>
struct Rule<MinOp> : ExtremumRule<MinOp, ComparePredicate::lt> {};

template <> struct Rule<ModOp> {
  static void saved(ModOp, SmallVectorImpl<Value> &) {}
  static LogicalResult vjp(ModOp op, GradBuilder &, ArrayRef<Value> rg,
                           ArrayRef<bool> needed,
                           SmallVectorImpl<Value> &grads) {
    if (needed[1])
      return unsupported(op, "has no gradient for its divisor");
    grads.append({rg[0], Value()});
    return success();
  }
};

template <> struct Rule<SelectOp> {
  static void saved(SelectOp op, SmallVectorImpl<Value> &s) {
    s.push_back(op.getCondition());
  }
  static LogicalResult vjp(SelectOp op, GradBuilder &gb, ArrayRef<Value> rg,
                           ArrayRef<bool> needed,
                           SmallVectorImpl<Value> &grads) {
    Value c = op.getCondition(), g = rg[0], zero = gb.like(g, 0.0);
    grads.append({Value(), needed[1] ? gb.select(c, g, zero) : Value(),
                  needed[2] ? gb.select(c, zero, g) : Value()});
    return success();
  }
};

template <> struct Rule<CastOp> {
  static void saved(CastOp, SmallVectorImpl<Value> &) {}
  static LogicalResult vjp(CastOp op, GradBuilder &gb, ArrayRef<Value> rg,
                           ArrayRef<bool>, SmallVectorImpl<Value> &grads) {
    if (!isFloatValue(op.getInput()) || !isFloatValue(op.getResult())) {
      grads.push_back(Value());
      return success();
    }
    grads.push_back(CastOp::create(gb.b, gb.loc, op.getInput().getType(),
                                   rg[0]));
    return success();
  }
};

// Softmax and normalisation.
template <> struct Rule<SoftmaxOp> {
  static void saved(SoftmaxOp op, SmallVectorImpl<Value> &s) {
    s.push_back(op.getResult());
  }
  static LogicalResult vjp(SoftmaxOp op, GradBuilder &gb, ArrayRef<Value> rg,
                           ArrayRef<bool>, SmallVectorImpl<Value> &grads) {
    // dx = y (g - sum(g y)); rows that nan_to_zero emptied have y = 0.
    Value y = op.getResult(), g = rg[0];
    int64_t axis = static_cast<int64_t>(op.getAxis());
    Value gy = gb.mul(g, y);
    grads.push_back(gb.sub(gy, gb.mul(y, gb.sumBroadcast(gy, {axis}))));
    return success();
  }
};

template <> struct Rule<LogSoftmaxOp> {
  static void saved(LogSoftmaxOp op, SmallVectorImpl<Value> &s) {
    s.push_back(op.getResult());
  }
  static LogicalResult vjp(LogSoftmaxOp op, GradBuilder &gb,
                           ArrayRef<Value> rg, ArrayRef<bool>,
                           SmallVectorImpl<Value> &grads) {
    if (op.getNanToZero())
      return unsupported(op, "with nan_to_zero has no gradient rule");
    // dx = g - exp(y) sum(g)
    Value y = op.getResult(), g = rg[0];
    int64_t axis = static_cast<int64_t>(op.getAxis());
    // One op per statement (see AbsOp's rule).
    Value total = gb.sumBroadcast(g, {axis});
    Value softmax = ExpOp::create(gb.b, gb.loc, y);
    grads.push_back(gb.sub(g, gb.mul(softmax, total)));
    return success();
  }
};

template <> struct Rule<LayerNormOp> {
  static void saved(LayerNormOp op, SmallVectorImpl<Value> &s) {
    s.append({op.getInput(), op.getScale()});
  }
  static LogicalResult vjp(LayerNormOp op, GradBuilder &gb, ArrayRef<Value> rg,
                           ArrayRef<bool> needed,
                           SmallVectorImpl<Value> &grads) {
    // Recomputes the statistics from the input (as the kernel does, in the
    // input's type), then the standard formula:
    //   dx = rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat)),
    //   dxhat = g scale, dscale = sum(g xhat), dbias = sum(g).
    Value x = op.getInput(), g = rg[0];
    RankedTensorType type = typeOf(x);
    int64_t axis = static_cast<int64_t>(op.getAxis()), rank = type.getRank();
    SmallVector<int64_t> normAxes = axesFrom(axis, rank),
                         lead = axesFrom(0, axis);
    int64_t count = 1;
    for (int64_t d : normAxes)
      count *= type.getDimSize(d);
    double inv = 1.0 / static_cast<double>(count);
    auto meanBroadcast = [&](Value v) {
      return gb.scale(gb.sumBroadcast(v, normAxes), inv);
    };
    Value centered = gb.sub(x, meanBroadcast(x));
    Value var = meanBroadcast(gb.mul(centered, centered));
    Value rstd = ReciprocalOp::create(
        gb.b, gb.loc,
        SqrtOp::create(gb.b, gb.loc,
                       gb.add(var, gb.like(var,
                                           op.getEpsilon().convertToFloat()))));
    Value xhat = gb.mul(centered, rstd);
    Value dxhat = gb.mul(g, gb.broadcast(op.getScale(), type.getShape()));
    // One op per statement (see AbsOp's rule).
    Value projection = gb.mul(xhat, meanBroadcast(gb.mul(dxhat, xhat)));
    Value dxhatCentered = gb.sub(dxhat, meanBroadcast(dxhat));
    Value dx = gb.mul(rstd, gb.sub(dxhatCentered, projection));
    auto paramGrad = [&](Value v) {
      return gb.reshape(gb.sumKeep(v, lead),
                        typeOf(op.getScale()).getShape());
    };
    grads.push_back(needed[0] ? dx : Value());
    grads.push_back(needed[1] ? paramGrad(gb.mul(g, xhat)) : Value());
    if (op.getBias())
      grads.push_back(needed[2] ? paramGrad(g) : Value());
    return success();
  }
};

template <> struct Rule<BatchNormOp> {
  static void saved(BatchNormOp op, SmallVectorImpl<Value> &s) {
    s.append({op.getInput(), op.getScale(), op.getMean(), op.getVariance()});
  }
  static LogicalResult vjp(BatchNormOp op, GradBuilder &gb, ArrayRef<Value> rg,
                           ArrayRef<bool> needed,
                           SmallVectorImpl<Value> &grads) {
    // Inference mode: y = (x - mean) rstd scale + bias with fixed
    // statistics, so dx = g scale rstd per channel.
    if (needed[3] || needed[4])
      return unsupported(op, "has no gradient for its running statistics");
    Value x = op.getInput(), g = rg[0];
    RankedTensorType type = typeOf(x);
    int64_t rank = type.getRank();
    SmallVector<int64_t> channelShape(rank, 1);
    channelShape[1] = type.getDimSize(1);
    auto perChannel = [&](Value v) {
      return gb.broadcast(gb.reshape(v, channelShape), type.getShape());
    };
    Value var = op.getVariance();
    Value rstd = ReciprocalOp::create(
        gb.b, gb.loc,
        SqrtOp::create(gb.b, gb.loc,
                       gb.add(var, gb.like(var,
                                           op.getEpsilon().convertToFloat()))));
    SmallVector<int64_t> others{0};
    llvm::append_range(others, axesFrom(2, rank));
    auto channelSum = [&](Value v) {
      return gb.reshape(gb.sumKeep(v, others), typeOf(var).getShape());
    };
    Value xhat = gb.mul(gb.sub(x, perChannel(op.getMean())), perChannel(rstd));
    grads.push_back(
        needed[0]
            ? gb.mul(g, perChannel(gb.mul(op.getScale(), rstd)))
            : Value());
    grads.push_back(needed[1] ? channelSum(gb.mul(g, xhat)) : Value());
    grads.push_back(needed[2] ? channelSum(g) : Value());
    grads.append({Value(), Value()});
    return success();
  }
};

// Data movement.
template <> struct Rule<ReshapeOp> {
  static void saved(ReshapeOp, SmallVectorImpl<Value> &) {}
  static LogicalResult vjp(ReshapeOp op, GradBuilder &gb, ArrayRef<Value> rg,
                           ArrayRef<bool>, SmallVectorImpl<Value> &grads) {
    grads.push_back(gb.reshape(rg[0], typeOf(op.getInput()).getShape()));
    return success();
  }
};

template <> struct Rule<TransposeOp> {
  static void saved(TransposeOp, SmallVectorImpl<Value> &) {}
  static LogicalResult vjp(TransposeOp op, GradBuilder &gb, ArrayRef<Value> rg,
                           ArrayRef<bool>, SmallVectorImpl<Value> &grads) {
    ArrayRef<int64_t> perm = op.getPermutation();
    SmallVector<int64_t> inverse(perm.size());
    for (auto [i, p] : llvm::enumerate(perm))
      inverse[p] = i;
    grads.push_back(gb.transpose(rg[0], inverse));
    return success();
  }
};

template <> struct Rule<BroadcastOp> {
  static void saved(BroadcastOp, SmallVectorImpl<Value> &) {}
  static LogicalResult vjp(BroadcastOp op, GradBuilder &gb, ArrayRef<Value> rg,
                           ArrayRef<bool>, SmallVectorImpl<Value> &grads) {
    grads.push_back(gb.sumToShape(rg[0], typeOf(op.getInput()).getShape()));
    return success();
  }
};

template <> struct Rule<ConcatOp> {
  static void saved(ConcatOp, SmallVectorImpl<Value> &) {}
  static LogicalResult vjp(ConcatOp op, GradBuilder &gb, ArrayRef<Value> rg,
                           ArrayRef<bool> needed,
                           SmallVectorImpl<Value> &grads) {
    int64_t axis = static_cast<int64_t>(op.getAxis()), offset = 0;
    ArrayRef<int64_t> shape = typeOf(op.getResult()).getShape();
    for (auto [i, input] : llvm::enumerate(op.getInputs())) {
      int64_t size = typeOf(input).getDimSize(axis);
      if (!needed[i]) {
        grads.push_back(Value());
        offset += size;
        continue;
      }
      SmallVector<int64_t> starts(shape.size(), 0), limits(shape),
          steps(shape.size(), 1);
      starts[axis] = offset;
      limits[axis] = offset + size;
      grads.push_back(
          SliceOp::create(gb.b, gb.loc, rg[0], starts, limits, steps));
      offset += size;
    }
    return success();
  }
};

template <> struct Rule<SplitOp> {
  static void saved(SplitOp, SmallVectorImpl<Value> &) {}
  static LogicalResult vjp(SplitOp op, GradBuilder &gb, ArrayRef<Value> rg,
                           ArrayRef<bool>, SmallVectorImpl<Value> &grads) {
    SmallVector<Value> pieces;
    for (auto [r, g] : llvm::zip(op.getResults(), rg))
      pieces.push_back(g ? g : gb.like(r, 0.0));
    grads.push_back(ConcatOp::create(gb.b, gb.loc, pieces, op.getAxis()));
    return success();
  }
};

template <> struct Rule<SliceOp> {
  static void saved(SliceOp, SmallVectorImpl<Value> &) {}
  static LogicalResult vjp(SliceOp op, GradBuilder &gb, ArrayRef<Value> rg,
                           ArrayRef<bool>, SmallVectorImpl<Value> &grads) {
    grads.push_back(PadOp::create(gb.b, gb.loc, op.getInput().getType(), rg[0],
                                  op.getStarts(), op.getSteps()));
    return success();
  }
};

template <> struct Rule<PadOp> {
  static void saved(PadOp, SmallVectorImpl<Value> &) {}
  static LogicalResult vjp(PadOp op, GradBuilder &gb, ArrayRef<Value> rg,
                           ArrayRef<bool>, SmallVectorImpl<Value> &grads) {
    ArrayRef<int64_t> starts = op.getStarts(), steps = op.getSteps();
    ArrayRef<int64_t> in = typeOf(op.getInput()).getShape();
    SmallVector<int64_t> limits;
    for (auto [d, n] : llvm::enumerate(in))
      limits.push_back(starts[d] + n * steps[d]);
    // The last element's successor may lie outside the padded dimension
    // (below -1 for a negative step): the slice stops at the edge.
    ArrayRef<int64_t> out = typeOf(op.getResult()).getShape();
    for (size_t d = 0; d < limits.size(); ++d)
      limits[d] = steps[d] < 0 ? std::max<int64_t>(limits[d], -1)
                               : std::min<int64_t>(limits[d], out[d]);
    grads.push_back(
        SliceOp::create(gb.b, gb.loc, rg[0], starts, limits, steps));
    return success();
  }
};

template <> struct Rule<GatherOp> {
  static void saved(GatherOp op, SmallVectorImpl<Value> &s) {
    s.push_back(op.getIndices());
  }
  static LogicalResult vjp(GatherOp op, GradBuilder &gb, ArrayRef<Value> rg,
                           ArrayRef<bool>, SmallVectorImpl<Value> &grads) {
    grads.push_back(ScatterAddOp::create(gb.b, gb.loc, op.getData().getType(),
                                         rg[0], op.getIndices(),
                                         op.getAxis()));
    grads.push_back(Value());
    return success();
  }
};

template <> struct Rule<ScatterAddOp> {
  static void saved(ScatterAddOp op, SmallVectorImpl<Value> &s) {
    s.push_back(op.getIndices());
  }
  static LogicalResult vjp(ScatterAddOp op, GradBuilder &gb,
                           ArrayRef<Value> rg, ArrayRef<bool>,
                           SmallVectorImpl<Value> &grads) {
    grads.push_back(
        GatherOp::create(gb.b, gb.loc, rg[0], op.getIndices(), op.getAxis()));
    grads.push_back(Value());
    return success();
  }
};

// Reductions.
template <typename OpT> struct ReduceRule {
  /// The reduced axes as size-1 dimensions: the result's shape with
  /// keep_dims.
  static SmallVector<int64_t> keptShape(OpT op) {
    SmallVector<int64_t> shape(typeOf(op.getInput()).getShape());
    for (int64_t a : op.getAxes())
      shape[a] = 1;
    return shape;
  }
  /// A result-shaped value broadcast back over the input.
  static Value expand(OpT op, GradBuilder &gb, Value v) {
    return gb.broadcast(gb.reshape(v, keptShape(op)),
                        typeOf(op.getInput()).getShape());
  }
  static int64_t count(OpT op) {
    int64_t n = 1;
    for (int64_t a : op.getAxes())
      n *= typeOf(op.getInput()).getDimSize(a);
    return n;
  }
};

template <> struct Rule<ReduceSumOp> : ReduceRule<ReduceSumOp> {
  static void saved(ReduceSumOp, SmallVectorImpl<Value> &) {}
  static LogicalResult vjp(ReduceSumOp op, GradBuilder &gb, ArrayRef<Value> rg,
                           ArrayRef<bool>, SmallVectorImpl<Value> &grads) {
    grads.push_back(expand(op, gb, rg[0]));
    return success();
  }
};

template <> struct Rule<ReduceMeanOp> : ReduceRule<ReduceMeanOp> {
  static void saved(ReduceMeanOp, SmallVectorImpl<Value> &) {}
  static LogicalResult vjp(ReduceMeanOp op, GradBuilder &gb,
                           ArrayRef<Value> rg, ArrayRef<bool>,
                           SmallVectorImpl<Value> &grads) {
    grads.push_back(gb.scale(expand(op, gb, rg[0]), 1.0 / count(op)));
    return success();
  }
};

/// amax/amin: the gradient spread evenly over the elements equal to the
/// extremum.
template <typename OpT> struct ExtremeReduceRule : ReduceRule<OpT> {
  using Base = ReduceRule<OpT>;
  static void saved(OpT op, SmallVectorImpl<Value> &s) {
    s.append({op.getInput(), op.getResult()});
  }
  static LogicalResult vjp(OpT op, GradBuilder &gb, ArrayRef<Value> rg,
                           ArrayRef<bool> needed,
                           SmallVectorImpl<Value> &grads) {
    Value x = op.getInput();
    if (!isFloatValue(x))
      return NoGradient<OpT>::vjp(op, gb, rg, needed, grads);
    Value hit = gb.cmp(ComparePredicate::eq, x,
                       Base::expand(op, gb, op.getResult()));
    Value zeros = gb.like(x, 0.0);
    Value ones = gb.select(hit, gb.like(x, 1.0), zeros);
    Value count = gb.sumBroadcast(ones, op.getAxes());
    grads.push_back(gb.div(gb.mul(ones, Base::expand(op, gb, rg[0])), count));
    return success();
  }
};
template <> struct Rule<ReduceMaxOp> : ExtremeReduceRule<ReduceMaxOp> {};
template <> struct Rule<ReduceMinOp> : ExtremeReduceRule<ReduceMinOp> {};

template <> struct Rule<ReduceProdOp> : ReduceRule<ReduceProdOp> {
  static void saved(ReduceProdOp op, SmallVectorImpl<Value> &s) {
    s.append({op.getInput(), op.getResult()});
  }
  static LogicalResult vjp(ReduceProdOp op, GradBuilder &gb,
                           ArrayRef<Value> rg, ArrayRef<bool> needed,
                           SmallVectorImpl<Value> &grads) {
    // prod / x: exact where no factor is zero (documented limit).
    if (!isFloatValue(op.getInput()))
      return NoGradient<ReduceProdOp>::vjp(op, gb, rg, needed, grads);
    grads.push_back(gb.div(gb.mul(expand(op, gb, rg[0]),
                                  expand(op, gb, op.getResult())),
                           op.getInput()));
    return success();
  }
};

// Matrix product: C = op_a(A) op_b(B), op_x a transpose of the last two
// dimensions when its flag is set.
//   d op_a(A) = G op_b(B)^T,  d op_b(B) = op_a(A)^T G.
template <> struct Rule<MatmulOp> {
  static void saved(MatmulOp op, SmallVectorImpl<Value> &s) {
    s.append({op.getLhs(), op.getRhs()});
  }
  static LogicalResult vjp(MatmulOp op, GradBuilder &gb, ArrayRef<Value> rg,
                           ArrayRef<bool> needed,
                           SmallVectorImpl<Value> &grads) {
    Value a = op.getLhs(), bm = op.getRhs(), g = rg[0];
    bool ta = op.getTransposeA(), tb = op.getTransposeB();
    RankedTensorType aType = typeOf(a), bType = typeOf(bm);
    // A 16-bit product with an f32 result (a bias accumulated before
    // rounding): its gradient products run in the operands' type, as
    // addmm's backward does.
    if (typeOf(g).getElementType() != aType.getElementType())
      g = CastOp::create(gb.b, gb.loc, typeOf(g).clone(aType.getElementType()),
                         g);
    if (aType.getRank() < 2 || bType.getRank() < 2)
      return unsupported(op, "on vectors has no gradient rule");
    bool shared = bType.getRank() == 2 && aType.getRank() > 2;
    Value da, db;
    if (needed[0]) {
      if (!ta) {
        da = gb.matmul(g, bm, false, !tb);
      } else {
        // dA = op_b(B) G^T; B must carry A's batch dimensions here.
        Value bFull = shared ? gb.broadcast(bm, batchShape(aType, bType))
                             : bm;
        da = gb.matmul(bFull, g, tb, true);
      }
    }
    if (needed[1]) {
      if (shared && !ta) {
        // Rows of every batch entry contract together: [P*M, K]^T [P*M, N].
        int64_t k = aType.getShape().back();
        int64_t n = typeOf(g).getShape().back();
        int64_t rows = aType.getNumElements() / k;
        Value a2 = gb.reshape(a, {rows, k});
        Value g2 = gb.reshape(g, {rows, n});
        db = tb ? gb.matmul(g2, a2, true, false) : gb.matmul(a2, g2, true, false);
      } else if (shared) {
        // Per batch entry, then summed over the batch.
        Value per = tb ? gb.matmul(g, a, true, ta) : gb.matmul(a, g, !ta, false);
        db = gb.sumToShape(per, bType.getShape());
      } else {
        db = tb ? gb.matmul(g, a, true, ta) : gb.matmul(a, g, !ta, false);
      }
    }
    grads.append({da, db});
    return success();
  }
  /// B's matrix with A's batch dimensions in front.
  static SmallVector<int64_t> batchShape(RankedTensorType a,
                                         RankedTensorType b) {
    SmallVector<int64_t> shape(a.getShape().drop_back(2));
    llvm::append_range(shape, b.getShape());
    return shape;
  }
};

template <> struct Rule<CrossEntropyOp> {
  static void saved(CrossEntropyOp op, SmallVectorImpl<Value> &s) {
    s.append({op.getLogits(), op.getLabels()});
  }
  static LogicalResult vjp(CrossEntropyOp op, GradBuilder &gb,
                           ArrayRef<Value> rg, ArrayRef<bool>,
                           SmallVectorImpl<Value> &grads) {
    grads.push_back(CrossEntropyGradOp::create(
        gb.b, gb.loc, op.getLogits().getType(), op.getLogits(),
        op.getLabels(), rg[0], op.getIgnoreIndex()));
    grads.push_back(Value());
    return success();
  }
};

// The LM head's fused cross-entropy: the logits computed again, block by
// block, from the saved row log-sum-exps (no N x V buffer kept).
template <> struct Rule<LinearCrossEntropyOp> {
  static void saved(LinearCrossEntropyOp op, SmallVectorImpl<Value> &s) {
    s.append({op.getHidden(), op.getWeight(), op.getLabels(), op.getLse()});
  }
  static LogicalResult vjp(LinearCrossEntropyOp op, GradBuilder &gb,
                           ArrayRef<Value> rg, ArrayRef<bool>,
                           SmallVectorImpl<Value> &grads) {
    Value gl = rg[0] ? rg[0] : gb.like(op.getLse(), 0.0);
    Value gt = rg[1] ? rg[1] : gb.like(op.getTarget(), 0.0);
    auto grad = LinearCrossEntropyGradOp::create(
        gb.b, gb.loc, op.getHidden().getType(), op.getWeight().getType(),
        op.getHidden(), op.getWeight(), op.getLabels(), op.getLse(), gl, gt,
        op.getIgnoreIndexAttr(), op.getTransposeWAttr(), op.getMeshAxisAttr());
    grads.append({grad.getGradHidden(), grad.getGradWeight(), Value()});
    return success();
  }
};

// Attention: FlashAttention's backward, the probabilities recomputed from
// the saved row log-sum-exps. The bias (a mask) gets no gradient.
template <> struct Rule<AttentionOp> {
  static void saved(AttentionOp op, SmallVectorImpl<Value> &s) {
    s.append({op.getQ(), op.getK(), op.getV(), op.getResult(), op.getLse()});
    if (op.getBias())
      s.push_back(op.getBias());
  }
  static LogicalResult vjp(AttentionOp op, GradBuilder &gb, ArrayRef<Value> rg,
                           ArrayRef<bool> needed,
                           SmallVectorImpl<Value> &grads) {
    if (rg[1])
      return unsupported(op, "has no gradient for its log-sum-exp result");
    if (op.getBias() && needed.size() > 3 && needed[3])
      return unsupported(op, "has no gradient for its bias (a mask); a "
                             "trained attention bias runs unfused "
                             "(--fuse-attention=false)");
    Value g = rg[0] ? rg[0] : gb.like(op.getResult(), 0.0);
    auto grad = AttentionGradOp::create(
        gb.b, gb.loc, op.getQ().getType(), op.getK().getType(),
        op.getV().getType(), op.getQ(), op.getK(), op.getV(), op.getResult(),
        op.getLse(), g, op.getBias(), op.getScaleAttr(), op.getCausalAttr());
    grads.append({grad.getDq(), grad.getDk(), grad.getDv()});
    if (op.getBias())
      grads.push_back(Value());
    return success();
  }
};

// Dropout: the same mask again (the op draws it from its counter).
template <> struct Rule<DropoutOp> {
  static void saved(DropoutOp, SmallVectorImpl<Value> &) {}
  static LogicalResult vjp(DropoutOp op, GradBuilder &gb, ArrayRef<Value> rg,
                           ArrayRef<bool>, SmallVectorImpl<Value> &grads) {
    grads.push_back(DropoutOp::create(gb.b, gb.loc, rg[0], op.getRatio(),
                                      op.getStream()));
    return success();
  }
};

// A sum over the ranks of a mesh axis, read by every rank: the objective is
// the sum of the ranks' losses, so d(x_r) = sum over ranks s of d(y_s), the
// same all-reduce of the cotangents. (Data parallelism's synchronised batch
// statistics: pcc-train-mode inserts these before autodiff.)
template <> struct Rule<AllReduceOp> {
  static void saved(AllReduceOp, SmallVectorImpl<Value> &) {}
  static LogicalResult vjp(AllReduceOp op, GradBuilder &gb, ArrayRef<Value> rg,
                           ArrayRef<bool>, SmallVectorImpl<Value> &grads) {
    grads.push_back(
        AllReduceOp::create(gb.b, gb.loc, rg[0], op.getAxisAttr()));
    return success();
  }
};

// Convolution and pooling.
template <> struct Rule<ConvOp> {
  static void saved(ConvOp op, SmallVectorImpl<Value> &s) {
    s.append({op.getInput(), op.getWeight()});
  }
  static LogicalResult vjp(ConvOp op, GradBuilder &gb, ArrayRef<Value> rg,
                           ArrayRef<bool> needed,
                           SmallVectorImpl<Value> &grads) {
    Value g = rg[0];
    grads.push_back(needed[0] ? ConvGradInputOp::create(
                                    gb.b, gb.loc, op.getInput().getType(), g,
                                    op.getWeight(), op.getStrides(),
                                    op.getPads(), op.getDilations(),
                                    op.getGroups())
                                    .getResult()
                              : Value());
    grads.push_back(needed[1] ? ConvGradWeightOp::create(
                                    gb.b, gb.loc, op.getWeight().getType(),
                                    op.getInput(), g, op.getStrides(),
                                    op.getPads(), op.getDilations(),
                                    op.getGroups())
                                    .getResult()
                              : Value());
    if (Value bias = op.getBias()) {
      // The bias is added at every position of every image.
      SmallVector<int64_t> others{0};
      llvm::append_range(others, axesFrom(2, typeOf(g).getRank()));
      grads.push_back(needed[2] ? gb.reshape(gb.sumKeep(g, others),
                                             typeOf(bias).getShape())
                                : Value());
    }
    return success();
  }
};

template <> struct Rule<MaxPoolOp> {
  static void saved(MaxPoolOp op, SmallVectorImpl<Value> &s) {
    s.push_back(op.getInput());
  }
  static LogicalResult vjp(MaxPoolOp op, GradBuilder &gb, ArrayRef<Value> rg,
                           ArrayRef<bool>, SmallVectorImpl<Value> &grads) {
    grads.push_back(MaxPoolGradOp::create(
        gb.b, gb.loc, op.getInput().getType(), op.getInput(), rg[0],
        op.getKernelShape(), op.getStrides(), op.getPads(),
        op.getDilations(), op.getCeilMode()));
    return success();
  }
};

template <> struct Rule<AvgPoolOp> {
  static void saved(AvgPoolOp, SmallVectorImpl<Value> &) {}
  static LogicalResult vjp(AvgPoolOp op, GradBuilder &gb, ArrayRef<Value> rg,
                           ArrayRef<bool>, SmallVectorImpl<Value> &grads) {
    grads.push_back(AvgPoolGradOp::create(
        gb.b, gb.loc, op.getInput().getType(), rg[0], op.getKernelShape(),
        op.getStrides(), op.getPads(), op.getDilations(), op.getCeilMode(),
        op.getCountIncludePad()));
    return success();
  }
};

/// The interface model over Rule<OpT>.
template <typename OpT>
struct AutodiffModel
    : public AutodiffOpInterface::ExternalModel<AutodiffModel<OpT>, OpT> {
  void getSavedValues(Operation *op, SmallVectorImpl<Value> &saved) const {
    Rule<OpT>::saved(cast<OpT>(op), saved);
  }
  LogicalResult buildVjp(Operation *op, OpBuilder &builder,
                         ArrayRef<Value> resultGrads, ArrayRef<bool> needed,
                         SmallVectorImpl<Value> &operandGrads) const {
    GradBuilder gb{builder, op->getLoc()};
    // A result without a gradient contributes zeros; rules of one-result
    // ops are only asked when it has one.
    SmallVector<Value> grads(resultGrads);
    if (op->getNumResults() == 1 && !grads[0])
      grads[0] = gb.like(op->getResult(0), 0.0);
    operandGrads.clear();
    if (failed(Rule<OpT>::vjp(cast<OpT>(op), gb, grads, needed, operandGrads)))
      return failure();
    assert(operandGrads.size() == op->getNumOperands() &&
           "a VJP rule gives one entry per operand");
    return success();
  }
};

template <typename OpT> struct NoGradientModel
    : public AutodiffOpInterface::ExternalModel<NoGradientModel<OpT>, OpT> {
  void getSavedValues(Operation *, SmallVectorImpl<Value> &) const {}
  LogicalResult buildVjp(Operation *op, OpBuilder &, ArrayRef<Value>,
                         ArrayRef<bool>,
                         SmallVectorImpl<Value> &operandGrads) const {
    operandGrads.assign(op->getNumOperands(), Value());
    return success();
  }
};

template <typename... Ops> void attachRules(MLIRContext *context) {
  (Ops::template attachInterface<AutodiffModel<Ops>>(*context), ...);
}
template <typename... Ops> void attachNoGradient(MLIRContext *context) {
  (Ops::template attachInterface<NoGradientModel<Ops>>(*context), ...);
}

} // namespace

void mlir::pcc::registerPccAutodiffModels(MLIRContext *context) {
  attachRules<NegOp, AbsOp, SqrtOp, ReciprocalOp, ExpOp, LogOp, ErfOp, TanhOp,
              SigmoidOp, ReluOp, SinOp, CosOp, GeluOp, LeakyReluOp, ClampOp,
              AddOp, SubOp, MulOp, DivOp, PowOp, MaxOp, MinOp, ModOp, SelectOp,
              CastOp, SoftmaxOp, LogSoftmaxOp, LayerNormOp, BatchNormOp,
              ReshapeOp, TransposeOp, BroadcastOp, ConcatOp, SplitOp, SliceOp,
              PadOp, GatherOp, ScatterAddOp, ReduceSumOp, ReduceMeanOp,
              ReduceMaxOp, ReduceMinOp, ReduceProdOp, MatmulOp, ConvOp,
              MaxPoolOp, AvgPoolOp, CrossEntropyOp, DropoutOp, AllReduceOp,
              AttentionOp, LinearCrossEntropyOp>(context);
  // Piecewise-constant or non-float results: no gradient flows through.
  attachNoGradient<FloorOp, CeilOp, NotOp, AndOp, OrOp, XorOp, IsNaNOp,
                   IsInfOp, CompareOp, ArgMaxOp, ParamOp, ConstantOp>(context);
}
