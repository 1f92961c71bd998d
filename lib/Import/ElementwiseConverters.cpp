//===- ElementwiseConverters.cpp - ONNX elementwise ops -------------------===//
//
// Arithmetic, comparisons, logic, activations and casts. ONNX broadcasting is
// made explicit with pcc.broadcast. When every input is a host constant the
// result is computed on the host (shape arithmetic, masks) instead.
//
//===----------------------------------------------------------------------===//

#include "GraphImporter.h"
#include "NodeImporter.h"

#include "pcc/Dialect/Pcc/IR/ShapeRules.h"

#include "pcc/Support/ShortestDecimal.h"

#include <cmath>
#include <functional>

using namespace mlir;
using namespace mlir::pcc;
using namespace mlir::pcc::onnx_import;

namespace {
using FloatFn = std::function<double(double, double)>;
using IntFn = std::function<int64_t(int64_t, int64_t)>;
using BuildFn = std::function<Value(NodeImporter &, Value, Value)>;

/// How one binary ONNX op computes, on the host and in IR.
struct BinarySpec {
  FloatFn onFloats;
  IntFn onInts;
  BuildFn build;
  /// Comparisons and logic produce booleans.
  bool producesBool = false;
};
} // namespace

/// Applies `spec` to two host constants with numpy broadcasting.
static std::optional<HostTensor> foldBinary(const HostTensor &a,
                                            const HostTensor &b,
                                            const BinarySpec &spec,
                                            int64_t limit) {
  auto shape = broadcastShapes(a.getShape(), b.getShape());
  if (!shape || numElements(*shape) > limit)
    return std::nullopt;
  HostTensor lhs = broadcastTo(a, *shape), rhs = broadcastTo(b, *shape);
  Type resultType = spec.producesBool
                        ? IntegerType::get(a.getElementType().getContext(), 1)
                        : a.getElementType();
  HostTensor out(resultType, *shape);
  for (int64_t i = 0; i < out.size(); ++i) {
    if (a.isFloat()) {
      double v = spec.onFloats(lhs.getDouble(i), rhs.getDouble(i));
      out.setDouble(i, v);
    } else {
      out.setInt(i, spec.onInts(lhs.getInt(i), rhs.getInt(i)));
    }
  }
  return out;
}

/// ONNX before opset 7 broadcast only with `broadcast = 1`, aligning the
/// second operand at `axis`. Rewrites it to a numpy-broadcastable shape.
static Value legacyBroadcast(NodeImporter &n, Value a, Value b) {
  if (n.getOpset() >= 7 || n.intAttr("broadcast", 0) == 0)
    return b;
  auto at = cast<RankedTensorType>(a.getType());
  auto bt = cast<RankedTensorType>(b.getType());
  int64_t axis = n.intAttr("axis", at.getRank() - bt.getRank());
  SmallVector<int64_t> shape(axis, 1);
  llvm::append_range(shape, bt.getShape());
  shape.resize(at.getRank(), 1);
  return n.reshape(b, shape);
}

/// Integer arithmetic on host constants wraps around (two's complement), as
/// ONNX Runtime and numpy do, instead of signed overflow's undefined
/// behaviour.
static int64_t wrapAdd(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) +
                              static_cast<uint64_t>(b));
}
static int64_t wrapSub(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) -
                              static_cast<uint64_t>(b));
}
static int64_t wrapMul(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) *
                              static_cast<uint64_t>(b));
}

/// Integer division and remainder truncate towards zero as in C; a zero
/// divisor gives 0 rather than undefined behaviour, and INT64_MIN / -1
/// (which traps on x86) wraps to INT64_MIN.
static int64_t truncDiv(int64_t a, int64_t b) {
  return b == 0 ? 0 : b == -1 ? wrapSub(0, a) : a / b;
}

/// pow in double, saturated to int64 like HostTensor::setDouble (converting
/// an out-of-range double is undefined behaviour).
static int64_t intPow(int64_t a, int64_t b) {
  double v = std::pow(static_cast<double>(a), static_cast<double>(b));
  if (std::isnan(v))
    return 0;
  if (v >= 9.2e18)
    return INT64_MAX;
  if (v <= -9.2e18)
    return INT64_MIN;
  return static_cast<int64_t>(v);
}

static LogicalResult convertBinary(NodeImporter &n, const BinarySpec &spec) {
  const HostTensor *ca = n.constant(0), *cb = n.constant(1);
  if (ca && cb && n.getOpset() >= 7) {
    if (auto folded = foldBinary(*ca, *cb, spec, n.maxFoldElements())) {
      n.setConstantOutput(0, std::move(*folded));
      return success();
    }
  }
  auto a = n.input(0), b = n.input(1);
  if (failed(a) || failed(b))
    return failure();
  Value rhs = legacyBroadcast(n, *a, *b);
  auto operands = n.broadcastTogether({*a, rhs});
  if (failed(operands))
    return failure();
  auto at = cast<RankedTensorType>((*operands)[0].getType());
  auto bt = cast<RankedTensorType>((*operands)[1].getType());
  if (at.getElementType() != bt.getElementType())
    return n.error() << n.getNode().op_type() << ": operand element types "
                     << at.getElementType() << " and " << bt.getElementType()
                     << " differ";
  n.setOutput(0, spec.build(n, (*operands)[0], (*operands)[1]));
  return success();
}

template <typename OpTy> static BuildFn buildWith() {
  return [](NodeImporter &n, Value a, Value b) -> Value {
    return n.create<OpTy>(a, b);
  };
}

static BuildFn buildCompare(ComparePredicate predicate) {
  return [predicate](NodeImporter &n, Value a, Value b) -> Value {
    return n.create<CompareOp>(predicate, a, b);
  };
}

static const llvm::StringMap<BinarySpec> &binarySpecs() {
  static const llvm::StringMap<BinarySpec> specs = [] {
    llvm::StringMap<BinarySpec> s;
    s["Add"] = {std::plus<double>(), wrapAdd, buildWith<AddOp>()};
    s["Sub"] = {std::minus<double>(), wrapSub, buildWith<SubOp>()};
    s["Mul"] = {std::multiplies<double>(), wrapMul, buildWith<MulOp>()};
    s["Div"] = {std::divides<double>(), truncDiv, buildWith<DivOp>()};
    s["Pow"] = {[](double a, double b) { return std::pow(a, b); },
                intPow,
                buildWith<PowOp>()};
    s["Max"] = {[](double a, double b) { return std::max(a, b); },
                [](int64_t a, int64_t b) { return std::max(a, b); },
                buildWith<MaxOp>()};
    s["Min"] = {[](double a, double b) { return std::min(a, b); },
                [](int64_t a, int64_t b) { return std::min(a, b); },
                buildWith<MinOp>()};
    s["And"] = {nullptr, [](int64_t a, int64_t b) -> int64_t { return a && b; },
                buildWith<AndOp>(), true};
    s["Or"] = {nullptr, [](int64_t a, int64_t b) -> int64_t { return a || b; },
               buildWith<OrOp>(), true};
    s["Xor"] = {nullptr,
                [](int64_t a, int64_t b) -> int64_t { return !a != !b; },
                buildWith<XorOp>(), true};
    auto cmp = [&](StringRef name, ComparePredicate p,
                   std::function<bool(double, double)> f) {
      s[name] = {[f](double a, double b) -> double { return f(a, b); },
                 [f](int64_t a, int64_t b) -> int64_t {
                   return f(static_cast<double>(a), static_cast<double>(b));
                 },
                 buildCompare(p), true};
    };
    cmp("Equal", ComparePredicate::eq, std::equal_to<double>());
    cmp("Less", ComparePredicate::lt, std::less<double>());
    cmp("LessOrEqual", ComparePredicate::le, std::less_equal<double>());
    cmp("Greater", ComparePredicate::gt, std::greater<double>());
    cmp("GreaterOrEqual", ComparePredicate::ge, std::greater_equal<double>());
    return s;
  }();
  return specs;
}

static LogicalResult convertBinaryByName(NodeImporter &n) {
  const BinarySpec &spec = binarySpecs().find(n.getNode().op_type())->second;
  // Pow may take an exponent of another type; compute in the base's type.
  if (n.getNode().op_type() == "Pow") {
    auto base = n.inputType(0), exponent = n.inputType(1);
    if (failed(base) || failed(exponent))
      return failure();
    if (base->getElementType() != exponent->getElementType() &&
        !(n.constant(0) && n.constant(1))) {
      auto a = n.input(0), b = n.input(1);
      if (failed(a) || failed(b))
        return failure();
      Value castB = n.create<CastOp>(
          RankedTensorType::get(exponent->getShape(), base->getElementType()),
          *b);
      auto operands = n.broadcastTogether({*a, castB});
      if (failed(operands))
        return failure();
      n.setOutput(0, n.create<PowOp>((*operands)[0], (*operands)[1]));
      return success();
    }
  }
  return convertBinary(n, spec);
}

/// Sum, Mean, Max and Min take any number of inputs.
static LogicalResult convertVariadic(NodeImporter &n) {
  StringRef op = n.getNode().op_type();
  StringRef binary = op == "Sum" || op == "Mean" ? "Add" : op;
  const BinarySpec &spec = binarySpecs().find(binary)->second;
  if (n.numInputs() == 2 && op != "Mean")
    return convertBinary(n, spec);
  SmallVector<Value> inputs;
  for (unsigned i = 0; i < n.numInputs(); ++i) {
    auto v = n.input(i);
    if (failed(v))
      return failure();
    inputs.push_back(*v);
  }
  auto operands = n.broadcastTogether(inputs);
  if (failed(operands))
    return failure();
  Value acc = (*operands)[0];
  for (Value v : llvm::drop_begin(*operands))
    acc = spec.build(n, acc, v);
  if (op == "Mean")
    acc = n.create<DivOp>(
        acc, n.splat(cast<RankedTensorType>(acc.getType()), inputs.size()));
  n.setOutput(0, acc);
  return success();
}

/// Mod: with fmod = 0 (integers only) the remainder takes the divisor's
/// sign, as Python's %; with fmod = 1 the dividend's, as C's fmod.
static LogicalResult convertMod(NodeImporter &n) {
  bool fmod = n.intAttr("fmod", 0) != 0;
  auto type = n.inputType(0);
  if (failed(type))
    return failure();
  if (isa<FloatType>(type->getElementType()) && !fmod)
    return n.error() << "Mod: floating-point operands need fmod = 1 (ONNX "
                        "defines fmod = 0 for integers only)";
  BinarySpec spec{
      [](double a, double b) { return std::fmod(a, b); },
      [fmod](int64_t a, int64_t b) -> int64_t {
        if (b == 0 || b == -1) // -1: INT64_MIN % -1 traps; the remainder is 0
          return 0;
        int64_t r = a % b;
        return !fmod && r != 0 && ((r < 0) != (b < 0)) ? r + b : r;
      },
      [fmod](NodeImporter &n, Value a, Value b) -> Value {
        auto op = n.create<ModOp>(a, b);
        op.setFmod(fmod);
        return op;
      }};
  return convertBinary(n, spec);
}

/// IsNaN and IsInf: float tests producing booleans.
static LogicalResult convertFloatTest(NodeImporter &n) {
  bool isNan = n.getNode().op_type() == "IsNaN";
  bool positive = n.intAttr("detect_positive", 1) != 0,
       negative = n.intAttr("detect_negative", 1) != 0;
  auto type = n.inputType(0);
  if (failed(type))
    return failure();
  if (!isa<FloatType>(type->getElementType()))
    return n.error() << n.getNode().op_type()
                     << ": the input must be floating-point, got "
                     << type->getElementType();
  if (const HostTensor *c = n.constant(0)) {
    HostTensor out(n.getBuilder().getI1Type(), c->getShape());
    for (int64_t i = 0; i < out.size(); ++i) {
      double v = c->getDouble(i);
      out.setInt(i, isNan ? std::isnan(v)
                          : std::isinf(v) && (v > 0 ? positive : negative));
    }
    n.setConstantOutput(0, std::move(out));
    return success();
  }
  auto v = n.input(0);
  if (failed(v))
    return failure();
  auto boolType =
      RankedTensorType::get(type->getShape(), n.getBuilder().getI1Type());
  if (isNan)
    n.setOutput(0, n.create<IsNaNOp>(boolType, *v));
  else
    n.setOutput(0, n.create<IsInfOp>(boolType, *v, positive, negative));
  return success();
}

static LogicalResult convertWhere(NodeImporter &n) {
  const HostTensor *c = n.constant(0), *x = n.constant(1), *y = n.constant(2);
  if (c && x && y) {
    auto shape = broadcastShapes(c->getShape(), x->getShape());
    if (shape)
      shape = broadcastShapes(*shape, y->getShape());
    if (shape && numElements(*shape) <= n.maxFoldElements()) {
      HostTensor cb = broadcastTo(*c, *shape), xb = broadcastTo(*x, *shape),
                 yb = broadcastTo(*y, *shape);
      HostTensor out(x->getElementType(), *shape);
      for (int64_t i = 0; i < out.size(); ++i) {
        const HostTensor &pick = cb.getInt(i) ? xb : yb;
        if (out.isFloat())
          out.setDouble(i, pick.getDouble(i));
        else
          out.setInt(i, pick.getInt(i));
      }
      n.setConstantOutput(0, std::move(out));
      return success();
    }
  }
  auto cond = n.input(0), tv = n.input(1), fv = n.input(2);
  if (failed(cond) || failed(tv) || failed(fv))
    return failure();
  auto operands = n.broadcastTogether({*cond, *tv, *fv});
  if (failed(operands))
    return failure();
  n.setOutput(
      0, n.create<SelectOp>((*operands)[0], (*operands)[1], (*operands)[2]));
  return success();
}

//===----------------------------------------------------------------------===//
// Unary
//===----------------------------------------------------------------------===//

namespace {
struct UnarySpec {
  std::function<double(double)> onHost; // null: never folded on the host
  std::function<Value(NodeImporter &, Value)> build;
};
} // namespace

template <typename OpTy>
static std::function<Value(NodeImporter &, Value)> buildUnary() {
  return [](NodeImporter &n, Value v) -> Value { return n.create<OpTy>(v); };
}

static const llvm::StringMap<UnarySpec> &unarySpecs() {
  static const llvm::StringMap<UnarySpec> specs = [] {
    llvm::StringMap<UnarySpec> s;
    s["Neg"] = {[](double x) { return -x; }, buildUnary<NegOp>()};
    s["Abs"] = {[](double x) { return std::fabs(x); }, buildUnary<AbsOp>()};
    s["Sqrt"] = {[](double x) { return std::sqrt(x); }, buildUnary<SqrtOp>()};
    s["Reciprocal"] = {[](double x) { return 1.0 / x; },
                       buildUnary<ReciprocalOp>()};
    s["Floor"] = {[](double x) { return std::floor(x); },
                  buildUnary<FloorOp>()};
    s["Ceil"] = {[](double x) { return std::ceil(x); }, buildUnary<CeilOp>()};
    s["Not"] = {[](double x) -> double { return x == 0.0; },
                buildUnary<NotOp>()};
    // Computed from constants alone (a rotary table from a constant
    // position range), these fold on the host too, in double.
    s["Exp"] = {[](double x) { return std::exp(x); }, buildUnary<ExpOp>()};
    s["Log"] = {[](double x) { return std::log(x); }, buildUnary<LogOp>()};
    s["Erf"] = {[](double x) { return std::erf(x); }, buildUnary<ErfOp>()};
    s["Tanh"] = {[](double x) { return std::tanh(x); }, buildUnary<TanhOp>()};
    s["Sigmoid"] = {[](double x) { return 1.0 / (1.0 + std::exp(-x)); },
                    buildUnary<SigmoidOp>()};
    s["Relu"] = {[](double x) { return x > 0 ? x : 0.0; },
                 buildUnary<ReluOp>()};
    s["Sin"] = {[](double x) { return std::sin(x); }, buildUnary<SinOp>()};
    s["Cos"] = {[](double x) { return std::cos(x); }, buildUnary<CosOp>()};
    return s;
  }();
  return specs;
}

static LogicalResult convertUnary(NodeImporter &n) {
  const UnarySpec &spec = unarySpecs().find(n.getNode().op_type())->second;
  if (spec.onHost) {
    if (const HostTensor *c = n.constant(0)) {
      HostTensor out(c->getElementType(), c->getShape());
      for (int64_t i = 0; i < out.size(); ++i) {
        if (c->isFloat())
          out.setDouble(i, spec.onHost(c->getDouble(i)));
        else
          out.setInt(i, static_cast<int64_t>(
                            spec.onHost(static_cast<double>(c->getInt(i)))));
      }
      n.setConstantOutput(0, std::move(out));
      return success();
    }
  }
  auto v = n.input(0);
  if (failed(v))
    return failure();
  n.setOutput(0, spec.build(n, *v));
  return success();
}

static LogicalResult convertLeakyRelu(NodeImporter &n) {
  auto v = n.input(0);
  if (failed(v))
    return failure();
  n.setOutput(0, n.create<LeakyReluOp>(*v, n.getBuilder().getF32FloatAttr(
                                               n.floatAttr("alpha", 0.01f))));
  return success();
}

static LogicalResult convertGelu(NodeImporter &n) {
  auto v = n.input(0);
  if (failed(v))
    return failure();
  std::string approximate = n.stringAttr("approximate", "none");
  if (approximate != "none" && approximate != "tanh")
    return n.error() << "Gelu: unknown approximate = '" << approximate << "'";
  auto op = n.create<GeluOp>(*v, approximate == "tanh");
  n.setOutput(0, op);
  return success();
}

static LogicalResult convertClip(NodeImporter &n) {
  auto type = n.inputType(0);
  if (failed(type))
    return failure();
  double lo = -std::numeric_limits<double>::infinity();
  double hi = std::numeric_limits<double>::infinity();
  if (n.getOpset() < 11) {
    lo = n.floatAttr("min", -std::numeric_limits<float>::max());
    hi = n.floatAttr("max", std::numeric_limits<float>::max());
  } else {
    for (unsigned i : {1u, 2u}) {
      if (!n.hasInput(i))
        continue;
      auto bound = n.requireConstant(i, i == 1 ? "min bound" : "max bound");
      if (failed(bound))
        return failure();
      (i == 1 ? lo : hi) = bound->getDouble(0);
    }
  }
  auto v = n.input(0);
  if (failed(v))
    return failure();
  if (lo > hi)
    return n.error() << "Clip: min " << lo << " exceeds max " << hi;
  auto &b = n.getBuilder();
  n.setOutput(
      0, n.create<ClampOp>(*v, b.getF64FloatAttr(lo), b.getF64FloatAttr(hi)));
  return success();
}

/// Cast's conversion to `elementType` (folded for a constant input).
static LogicalResult castInputTo(NodeImporter &n, Type elementType) {
  if (const HostTensor *c = n.constant(0)) {
    n.setConstantOutput(0, c->castTo(elementType));
    return success();
  }
  auto v = n.input(0);
  if (failed(v))
    return failure();
  auto type = cast<RankedTensorType>(v->getType());
  n.setOutput(0, n.create<CastOp>(type.clone(elementType), *v));
  return success();
}

static LogicalResult convertCast(NodeImporter &n) {
  int64_t to = n.intAttr("to", 0);
  Type elementType = convertOnnxElementType(n.getContext(), to);
  if (!elementType)
    return n.error() << "Cast to " << onnxElementTypeName(to)
                     << " is not supported";
  return castInputTo(n, elementType);
}

/// CastLike: Cast to the element type of the second input (the dynamo
/// exporter writes it before its graph is optimised).
static LogicalResult convertCastLike(NodeImporter &n) {
  if (!n.hasInput(1))
    return n.error() << "CastLike needs the tensor whose type it takes";
  if (const HostTensor *like = n.constant(1))
    return castInputTo(n, like->getElementType());
  auto like = n.input(1);
  if (failed(like))
    return failure();
  return castInputTo(n,
                     cast<RankedTensorType>(like->getType()).getElementType());
}

/// Identity.
static LogicalResult convertIdentity(NodeImporter &n) {
  if (!n.hasInput(0))
    return n.error() << n.getNode().op_type() << " needs an input";
  n.alias(0, 0);
  return success();
}

/// Dropout: an identity in eval mode; with training_mode set and pcc
/// training, pcc.dropout with a stream of its own.
static LogicalResult convertDropout(NodeImporter &n) {
  if (!n.hasInput(0))
    return n.error() << "Dropout needs an input";
  if (n.outputConsumed(1))
    return n.error() << "Dropout's mask output ('" << n.getNode().output(1)
                     << "') is not supported";
  bool trainingMode = false;
  if (n.hasInput(2)) {
    const HostTensor *training = n.constant(2);
    if (!training)
      return n.error() << "Dropout with a training_mode computed in the "
                          "graph is not supported (it must be a constant)";
    trainingMode = training->getInt(0) != 0;
  }
  // Eval mode (module.eval()): an identity, whatever the ratio.
  if (!trainingMode || !n.getGraph().getOptions().training) {
    n.alias(0, 0);
    return success();
  }
  double ratio = 0.5;
  if (n.getOpset() < 12) {
    ratio = n.floatAttr("ratio", 0.5f);
  } else if (n.hasInput(1)) {
    const HostTensor *r = n.constant(1);
    if (!r)
      return n.error() << "Dropout with a ratio computed in the graph is not "
                          "supported (it must be a constant)";
    ratio = r->getDouble(0);
  }
  if (ratio == 0.0) {
    n.alias(0, 0);
    return success();
  }
  if (!(ratio > 0.0 && ratio < 1.0))
    return n.error() << "Dropout's ratio " << ratio << " is outside [0, 1)";
  auto x = n.input(0);
  if (failed(x))
    return failure();
  if (!isa<FloatType>(cast<RankedTensorType>(x->getType()).getElementType()))
    return n.error() << "Dropout needs a float input";
  // The decimal the exporter's float came from (0.1f gives 0.1).
  double exact = shortestDecimal(static_cast<float>(ratio));
  auto &b = n.getBuilder();
  n.setOutput(0, n.create<DropoutOp>(*x, b.getF64FloatAttr(exact),
                                     b.getI64IntegerAttr(
                                         n.getGraph().nextRandomStream())));
  return success();
}

void onnx_import::registerElementwiseConverters(
    llvm::StringMap<ConverterFn> &table) {
  for (const auto &entry : binarySpecs())
    table[entry.getKey()] = convertBinaryByName;
  for (const auto &entry : unarySpecs())
    table[entry.getKey()] = convertUnary;
  for (StringRef op : {"Sum", "Mean", "Max", "Min"})
    table[op] = convertVariadic;
  table["Where"] = convertWhere;
  table["Mod"] = convertMod;
  table["IsNaN"] = convertFloatTest;
  table["IsInf"] = convertFloatTest;
  table["LeakyRelu"] = convertLeakyRelu;
  table["Gelu"] = convertGelu;
  table["Clip"] = convertClip;
  table["Cast"] = convertCast;
  table["CastLike"] = convertCastLike;
  table["Identity"] = convertIdentity;
  table["Dropout"] = convertDropout;
}
