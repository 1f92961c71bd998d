//===- Interpreter.cpp - float64 reference interpreter of the pcc dialect -===//
//
// One function per op group (elementwise, linear algebra, softmax and
// normalisation, data movement, reductions, windows, losses) and one
// dispatch on the op's type. To add an op: write its rule in the group it
// belongs to (or a new group function) and add a line to `dispatch`.
//
// Each rule mirrors the CPU back end, so the quirks are the kernels' own:
// max/min of two values are `a > b ? a : b` / `a < b ? a : b` (NaN handling
// follows), reduce_max starts from the lowest finite value, argmax keeps the
// first maximum, max pooling ignores padding, average pooling counts only the
// padding inside the padded input. Ops the back end declares f32 only are
// evaluated for every float type here, in double.
//
// Ops added after this file (scatter_add, pad, cross_entropy,
// cross_entropy_grad) are matched by name and read their attributes by name,
// so this file builds whether or not the dialect has them yet.
//
//===----------------------------------------------------------------------===//

#include "Interpreter.h"

#include "pcc/Dialect/Pcc/IR/PccDialect.h"
#include "pcc/runtime/Philox.h"

#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/BuiltinTypes.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/Twine.h"
#include "llvm/Support/raw_ostream.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <optional>

namespace pcc::testing {
namespace {

namespace P = ::mlir::pcc;
using llvm::ArrayRef;
using llvm::SmallVector;
using llvm::StringRef;
using llvm::Twine;
using ::mlir::Attribute;
using ::mlir::failure;
using ::mlir::FailureOr;
using ::mlir::Operation;
using ::mlir::RankedTensorType;
using ::mlir::Type;
using ::mlir::Value;

using Result = FailureOr<std::vector<Tensor>>;

/// Records `message` and fails.
Result fail(std::string &error, const Twine &message) {
  error = message.str();
  return failure();
}

/// "'pcc.foo'": how messages name an op.
std::string opName(Operation *op) {
  return "'" + op->getName().getStringRef().str() + "'";
}

std::string shapeString(ArrayRef<int64_t> shape) {
  std::string s = "[";
  for (auto [i, d] : llvm::enumerate(shape))
    s += (i ? ", " : "") + std::to_string(d);
  return s + "]";
}

//===----------------------------------------------------------------------===//
// Shapes, indices and element types
//===----------------------------------------------------------------------===//

RankedTensorType typeOf(Value v) {
  return llvm::dyn_cast<RankedTensorType>(v.getType());
}

Type elementTypeOf(Value v) { return typeOf(v).getElementType(); }

int64_t product(ArrayRef<int64_t> dims) {
  int64_t p = 1;
  for (int64_t d : dims)
    p *= d;
  return p;
}

std::vector<int64_t> stridesOf(ArrayRef<int64_t> shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (int64_t d = static_cast<int64_t>(shape.size()) - 2; d >= 0; --d)
    strides[d] = strides[d + 1] * shape[d + 1];
  return strides;
}

/// The multi-index of row-major position `flat` in `shape`.
void unravel(int64_t flat, ArrayRef<int64_t> shape,
             SmallVector<int64_t> &index) {
  index.assign(shape.size(), 0);
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    index[d] = flat % shape[d];
    flat /= shape[d];
  }
}

/// A zero tensor shaped like result `i` of `op`.
Tensor zerosFor(Operation *op, unsigned i = 0) {
  Tensor t;
  auto type = typeOf(op->getResult(i));
  t.shape.assign(type.getShape().begin(), type.getShape().end());
  t.data.assign(type.getNumElements(), 0.0);
  return t;
}

bool isFloat(Type t) { return llvm::isa<mlir::FloatType>(t); }

/// `v` as an element of type `t`: floats stay as they are (the interpreter
/// computes in double); integers truncate towards zero (NaN to 0, clamped to
/// +-9.2e18) and wrap to their width, as pccrt::castElement does; booleans
/// are "not zero".
double toElement(double v, Type t) {
  auto it = llvm::dyn_cast<mlir::IntegerType>(t);
  if (!it)
    return v;
  if (it.getWidth() == 1)
    return v != 0.0 ? 1.0 : 0.0;
  int64_t i =
      std::isnan(v) ? 0 : static_cast<int64_t>(std::clamp(v, -9.2e18, 9.2e18));
  switch (it.getWidth()) {
  case 8:
    return it.isUnsigned() ? static_cast<double>(static_cast<uint8_t>(i))
                           : static_cast<double>(static_cast<int8_t>(i));
  case 16:
    return static_cast<double>(static_cast<int16_t>(i));
  case 32:
    return static_cast<double>(static_cast<int32_t>(i));
  default:
    return static_cast<double>(i);
  }
}

/// The back end's `lowest` / `max` of the C type of a float element (f32 as
/// float, the others as double) or of int64 for integers: reductions start
/// from these.
double lowestOf(Type t) {
  if (t.isF32())
    return std::numeric_limits<float>::lowest();
  if (isFloat(t))
    return std::numeric_limits<double>::lowest();
  return static_cast<double>(std::numeric_limits<int64_t>::lowest());
}
double highestOf(Type t) {
  if (t.isF32())
    return std::numeric_limits<float>::max();
  if (isFloat(t))
    return std::numeric_limits<double>::max();
  return static_cast<double>(std::numeric_limits<int64_t>::max());
}

// The back end's two-operand max and min (std::max / std::min and the
// elementwise kernels agree on these forms).
double maxOf(double a, double b) { return a < b ? b : a; }
double minOf(double a, double b) { return b < a ? b : a; }

//===----------------------------------------------------------------------===//
// Attributes read by name (for ops matched by name)
//===----------------------------------------------------------------------===//

std::optional<std::vector<int64_t>> i64ArrayAttr(Operation *op,
                                                 StringRef name) {
  Attribute attr = op->getAttr(name);
  if (auto dense = llvm::dyn_cast_or_null<mlir::DenseI64ArrayAttr>(attr))
    return std::vector<int64_t>(dense.asArrayRef().begin(),
                                dense.asArrayRef().end());
  if (auto array = llvm::dyn_cast_or_null<mlir::ArrayAttr>(attr)) {
    std::vector<int64_t> values;
    for (Attribute a : array) {
      auto i = llvm::dyn_cast<mlir::IntegerAttr>(a);
      if (!i)
        return std::nullopt;
      values.push_back(i.getInt());
    }
    return values;
  }
  if (auto dense = llvm::dyn_cast_or_null<mlir::DenseIntElementsAttr>(attr)) {
    std::vector<int64_t> values;
    for (const llvm::APInt &v : dense.getValues<llvm::APInt>())
      values.push_back(v.getSExtValue());
    return values;
  }
  return std::nullopt;
}

std::optional<int64_t> i64Attr(Operation *op, StringRef name) {
  if (auto i = op->getAttrOfType<mlir::IntegerAttr>(name))
    return i.getValue().getSExtValue();
  return std::nullopt;
}

//===----------------------------------------------------------------------===//
// Values: constants
//===----------------------------------------------------------------------===//

Result evalConstant(P::ConstantOp op, std::string &error) {
  auto dense = llvm::dyn_cast<mlir::DenseElementsAttr>(op.getValue());
  if (!dense)
    return fail(error, opName(op) + ": only dense constants are evaluable");
  Tensor t = zerosFor(op);
  Type e = dense.getElementType();
  int64_t i = 0;
  if (isFloat(e)) {
    for (const llvm::APFloat &v : dense.getValues<llvm::APFloat>()) {
      bool lost = false;
      llvm::APFloat d = v;
      d.convert(llvm::APFloat::IEEEdouble(), llvm::APFloat::rmNearestTiesToEven,
                &lost);
      t.data[i++] = d.convertToDouble();
    }
  } else {
    bool zext = e.isUnsignedInteger() || e.isInteger(1);
    for (const llvm::APInt &v : dense.getValues<llvm::APInt>())
      t.data[i++] = zext ? static_cast<double>(v.getZExtValue())
                         : static_cast<double>(v.getSExtValue());
  }
  return std::vector<Tensor>{std::move(t)};
}

//===----------------------------------------------------------------------===//
// Linear algebra: matmul
//===----------------------------------------------------------------------===//

Result evalMatmul(P::MatmulOp op, ArrayRef<Tensor> in, std::string &) {
  auto lhs = op.getLhs().getType(), rhs = op.getRhs().getType();
  Tensor out = zerosFor(op);
  ArrayRef<int64_t> os = op.getType().getShape();
  int64_t r = os.size();
  int64_t m = os[r - 2], n = os[r - 1];
  bool ta = op.getTransposeA(), tb = op.getTransposeB();
  int64_t k = ta ? lhs.getDimSize(lhs.getRank() - 2)
                 : lhs.getDimSize(lhs.getRank() - 1);
  int64_t batch = product(os.drop_back(2));
  int64_t strideA = m * k, strideB = rhs.getRank() == 2 ? 0 : k * n;
  const double *a = in[0].data.data(), *b = in[1].data.data();
  for (int64_t bi = 0; bi < batch; ++bi)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double sum = 0;
        for (int64_t l = 0; l < k; ++l) {
          double x = a[bi * strideA + (ta ? l * m + i : i * k + l)];
          double y = b[bi * strideB + (tb ? j * k + l : l * n + j)];
          sum += x * y;
        }
        out.data[(bi * m + i) * n + j] = sum;
      }
  return std::vector<Tensor>{std::move(out)};
}

//===----------------------------------------------------------------------===//
// Elementwise
//===----------------------------------------------------------------------===//

using UnaryFn = std::function<double(double)>;
using BinaryFn = std::function<double(double, double)>;

/// The scalar function of a one-operand elementwise op (cast included: the
/// conversion itself is `toElement` on the result type).
std::optional<UnaryFn> unaryFn(Operation *op) {
  if (llvm::isa<P::NegOp>(op))
    return UnaryFn([](double x) { return -x; });
  if (llvm::isa<P::AbsOp>(op))
    return UnaryFn([](double x) { return std::fabs(x); });
  if (llvm::isa<P::SqrtOp>(op))
    return UnaryFn([](double x) { return std::sqrt(x); });
  if (llvm::isa<P::ReciprocalOp>(op))
    return UnaryFn([](double x) { return 1.0 / x; });
  if (llvm::isa<P::ExpOp>(op))
    return UnaryFn([](double x) { return std::exp(x); });
  if (llvm::isa<P::LogOp>(op))
    return UnaryFn([](double x) { return std::log(x); });
  if (llvm::isa<P::ErfOp>(op))
    return UnaryFn([](double x) { return std::erf(x); });
  if (llvm::isa<P::TanhOp>(op))
    return UnaryFn([](double x) { return std::tanh(x); });
  if (llvm::isa<P::SigmoidOp>(op))
    return UnaryFn([](double x) { return 1.0 / (1.0 + std::exp(-x)); });
  if (llvm::isa<P::ReluOp>(op))
    return UnaryFn([](double x) { return x > 0.0 ? x : 0.0; });
  if (llvm::isa<P::FloorOp>(op))
    return UnaryFn([](double x) { return std::floor(x); });
  if (llvm::isa<P::CeilOp>(op))
    return UnaryFn([](double x) { return std::ceil(x); });
  if (llvm::isa<P::SinOp>(op))
    return UnaryFn([](double x) { return std::sin(x); });
  if (llvm::isa<P::CosOp>(op))
    return UnaryFn([](double x) { return std::cos(x); });
  if (llvm::isa<P::NotOp>(op))
    return UnaryFn([](double x) { return x != 0.0 ? 0.0 : 1.0; });
  if (auto g = llvm::dyn_cast<P::GeluOp>(op)) {
    if (g.getTanhApproximation())
      return UnaryFn([](double x) {
        return 0.5 * x *
               (1.0 +
                std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
      });
    return UnaryFn([](double x) {
      return 0.5 * x * (1.0 + std::erf(x * 0.7071067811865476));
    });
  }
  if (auto l = llvm::dyn_cast<P::LeakyReluOp>(op)) {
    double alpha = l.getAlpha().convertToDouble();
    return UnaryFn([alpha](double x) { return x >= 0.0 ? x : alpha * x; });
  }
  if (auto c = llvm::dyn_cast<P::ClampOp>(op)) {
    double lo = c.getMin().convertToDouble(), hi = c.getMax().convertToDouble();
    Type t = c.getType().getElementType();
    if (!isFloat(t)) { // the emitter writes integer bounds as int64 literals
      lo = toElement(lo, mlir::IntegerType::get(op->getContext(), 64));
      hi = toElement(hi, mlir::IntegerType::get(op->getContext(), 64));
    }
    // Infinite bounds are left out, as the emitter does.
    bool useLo = !(std::isinf(lo) && lo < 0),
         useHi = !(std::isinf(hi) && hi > 0);
    return UnaryFn([=](double x) {
      double y = useLo ? maxOf(x, lo) : x;
      return useHi ? minOf(y, hi) : y;
    });
  }
  if (llvm::isa<P::IsNaNOp>(op))
    return UnaryFn([](double x) { return x != x ? 1.0 : 0.0; });
  if (auto i = llvm::dyn_cast<P::IsInfOp>(op)) {
    bool pos = i.getDetectPositive(), neg = i.getDetectNegative();
    return UnaryFn([=](double x) {
      double inf = std::numeric_limits<double>::infinity();
      return ((pos && x == inf) || (neg && x == -inf)) ? 1.0 : 0.0;
    });
  }
  if (llvm::isa<P::CastOp>(op))
    return UnaryFn([](double x) { return x; });
  return std::nullopt;
}

/// The remainder of ONNX Mod as the emitter computes it.
double modOf(double a, double b, bool isFloatType, bool fmodMode) {
  double r;
  if (isFloatType) {
    r = std::fmod(a, b);
  } else {
    // A zero divisor gives 0; so does -1 (INT_MIN % -1 traps in C).
    if (b == 0.0 || b == -1.0)
      return 0.0;
    r = std::fmod(a, b); // C's % on integers: the dividend's sign
  }
  if (fmodMode)
    return r;
  return (r != 0.0 && ((r < 0.0) != (b < 0.0))) ? r + b : r;
}

/// The scalar function of a two-operand elementwise op.
std::optional<BinaryFn> binaryFn(Operation *op) {
  bool floatIn = isFloat(elementTypeOf(op->getOperand(0)));
  if (llvm::isa<P::AddOp>(op))
    return BinaryFn([](double a, double b) { return a + b; });
  if (llvm::isa<P::SubOp>(op))
    return BinaryFn([](double a, double b) { return a - b; });
  if (llvm::isa<P::MulOp>(op))
    return BinaryFn([](double a, double b) { return a * b; });
  if (llvm::isa<P::DivOp>(op)) {
    if (floatIn)
      return BinaryFn([](double a, double b) { return a / b; });
    // Integer division truncates (toElement); a zero divisor gives 0.
    return BinaryFn(
        [](double a, double b) { return b == 0.0 ? 0.0 : std::trunc(a / b); });
  }
  if (llvm::isa<P::PowOp>(op))
    return BinaryFn([](double a, double b) { return std::pow(a, b); });
  if (llvm::isa<P::MaxOp>(op))
    return BinaryFn([](double a, double b) { return a > b ? a : b; });
  if (llvm::isa<P::MinOp>(op))
    return BinaryFn([](double a, double b) { return a < b ? a : b; });
  if (llvm::isa<P::AndOp>(op))
    return BinaryFn(
        [](double a, double b) { return (a != 0.0 && b != 0.0) ? 1.0 : 0.0; });
  if (llvm::isa<P::OrOp>(op))
    return BinaryFn(
        [](double a, double b) { return (a != 0.0 || b != 0.0) ? 1.0 : 0.0; });
  if (llvm::isa<P::XorOp>(op))
    return BinaryFn([](double a, double b) {
      return (a == 0.0) != (b == 0.0) ? 1.0 : 0.0;
    });
  if (auto m = llvm::dyn_cast<P::ModOp>(op)) {
    bool fmodMode = m.getFmod();
    return BinaryFn(
        [=](double a, double b) { return modOf(a, b, floatIn, fmodMode); });
  }
  if (auto c = llvm::dyn_cast<P::CompareOp>(op)) {
    switch (c.getPredicate()) {
    case P::ComparePredicate::eq:
      return BinaryFn([](double a, double b) { return a == b ? 1.0 : 0.0; });
    case P::ComparePredicate::ne:
      return BinaryFn([](double a, double b) { return a != b ? 1.0 : 0.0; });
    case P::ComparePredicate::lt:
      return BinaryFn([](double a, double b) { return a < b ? 1.0 : 0.0; });
    case P::ComparePredicate::le:
      return BinaryFn([](double a, double b) { return a <= b ? 1.0 : 0.0; });
    case P::ComparePredicate::gt:
      return BinaryFn([](double a, double b) { return a > b ? 1.0 : 0.0; });
    case P::ComparePredicate::ge:
      return BinaryFn([](double a, double b) { return a >= b ? 1.0 : 0.0; });
    }
  }
  return std::nullopt;
}

bool isElementwise(Operation *op) {
  return llvm::isa<P::NegOp, P::AbsOp, P::SqrtOp, P::ReciprocalOp, P::ExpOp,
                   P::LogOp, P::ErfOp, P::TanhOp, P::SigmoidOp, P::ReluOp,
                   P::FloorOp, P::CeilOp, P::SinOp, P::CosOp, P::NotOp,
                   P::GeluOp, P::LeakyReluOp, P::ClampOp, P::AddOp, P::SubOp,
                   P::MulOp, P::DivOp, P::PowOp, P::MaxOp, P::MinOp, P::AndOp,
                   P::OrOp, P::XorOp, P::ModOp, P::IsNaNOp, P::IsInfOp,
                   P::CompareOp, P::SelectOp, P::CastOp>(op);
}

/// Elementwise ops, comparisons, select and cast: operands have the
/// result's shape (broadcasts are explicit in pcc).
Result evalElementwise(Operation *op, ArrayRef<Tensor> in, std::string &error) {
  Tensor out = zerosFor(op);
  int64_t n = static_cast<int64_t>(out.data.size());
  for (const Tensor &t : in)
    if (static_cast<int64_t>(t.data.size()) != n)
      return fail(error, opName(op) + ": operands must have the result's " +
                             "element count " + Twine(n));
  if (llvm::isa<P::SelectOp>(op)) {
    for (int64_t i = 0; i < n; ++i)
      out.data[i] = in[0].data[i] != 0.0 ? in[1].data[i] : in[2].data[i];
  } else if (auto f = unaryFn(op)) {
    for (int64_t i = 0; i < n; ++i)
      out.data[i] = (*f)(in[0].data[i]);
  } else if (auto g = binaryFn(op)) {
    for (int64_t i = 0; i < n; ++i)
      out.data[i] = (*g)(in[0].data[i], in[1].data[i]);
  } else {
    return fail(error, opName(op) + ": no elementwise rule");
  }
  return std::vector<Tensor>{std::move(out)};
}

//===----------------------------------------------------------------------===//
// Softmax and normalisation
//===----------------------------------------------------------------------===//

/// softmax / log_softmax along `axis` as pcc_cpu_softmax_f32 computes it.
Result evalSoftmax(Operation *op, ArrayRef<Tensor> in, std::string &) {
  bool isLog = llvm::isa<P::LogSoftmaxOp>(op);
  bool nanToZero = op->hasAttr("nan_to_zero");
  int64_t axis = op->getAttrOfType<mlir::IntegerAttr>("axis").getInt();
  Tensor out = zerosFor(op);
  ArrayRef<int64_t> shape = out.shape;
  int64_t outer = product(shape.take_front(axis)), len = shape[axis],
          inner = product(shape.drop_front(axis + 1));
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      const double *x = in[0].data.data() + o * len * inner + i;
      double *y = out.data.data() + o * len * inner + i;
      double maxValue = -std::numeric_limits<double>::infinity();
      for (int64_t l = 0; l < len; ++l)
        maxValue = maxOf(maxValue, x[l * inner]);
      double sum = 0;
      for (int64_t l = 0; l < len; ++l)
        sum += std::exp(x[l * inner] - maxValue);
      if (isLog) {
        double logSum = std::log(sum);
        for (int64_t l = 0; l < len; ++l)
          y[l * inner] = x[l * inner] - maxValue - logSum;
      } else {
        for (int64_t l = 0; l < len; ++l)
          y[l * inner] = std::exp(x[l * inner] - maxValue) / sum;
      }
      if (nanToZero)
        for (int64_t l = 0; l < len; ++l)
          if (std::isnan(y[l * inner]))
            y[l * inner] = 0.0;
    }
  return std::vector<Tensor>{std::move(out)};
}

Result evalLayerNorm(P::LayerNormOp op, ArrayRef<Tensor> in, std::string &) {
  Tensor out = zerosFor(op);
  ArrayRef<int64_t> shape = out.shape;
  int64_t axis = static_cast<int64_t>(op.getAxis());
  int64_t rows = product(shape.take_front(axis)),
          cols = product(shape.drop_front(axis));
  double epsilon = op.getEpsilon().convertToDouble();
  const std::vector<double> &scale = in[1].data;
  const std::vector<double> *bias = op.getBias() ? &in[2].data : nullptr;
  for (int64_t r = 0; r < rows; ++r) {
    const double *x = in[0].data.data() + r * cols;
    double *y = out.data.data() + r * cols;
    double mean = 0, var = 0;
    for (int64_t c = 0; c < cols; ++c)
      mean += x[c];
    mean /= cols;
    for (int64_t c = 0; c < cols; ++c)
      var += (x[c] - mean) * (x[c] - mean);
    var /= cols;
    double inv = 1.0 / std::sqrt(var + epsilon);
    for (int64_t c = 0; c < cols; ++c)
      y[c] = (x[c] - mean) * inv * scale[c] + (bias ? (*bias)[c] : 0.0);
  }
  return std::vector<Tensor>{std::move(out)};
}

Result evalBatchNorm(P::BatchNormOp op, ArrayRef<Tensor> in, std::string &) {
  Tensor out = zerosFor(op);
  ArrayRef<int64_t> shape = out.shape;
  int64_t n = shape[0], channels = shape[1],
          spatial = product(shape.drop_front(2));
  double epsilon = op.getEpsilon().convertToDouble();
  for (int64_t i = 0; i < n; ++i)
    for (int64_t c = 0; c < channels; ++c) {
      double a = in[1].data[c] / std::sqrt(in[4].data[c] + epsilon);
      double b = in[2].data[c] - in[3].data[c] * a;
      for (int64_t s = 0; s < spatial; ++s) {
        int64_t at = (i * channels + c) * spatial + s;
        out.data[at] = in[0].data[at] * a + b;
      }
    }
  return std::vector<Tensor>{std::move(out)};
}

//===----------------------------------------------------------------------===//
// Data movement
//===----------------------------------------------------------------------===//

Result evalReshape(P::ReshapeOp op, ArrayRef<Tensor> in, std::string &) {
  Tensor out = zerosFor(op);
  out.data = in[0].data;
  return std::vector<Tensor>{std::move(out)};
}

Result evalTranspose(P::TransposeOp op, ArrayRef<Tensor> in, std::string &) {
  Tensor out = zerosFor(op);
  std::vector<int64_t> inStrides =
      stridesOf(op.getInput().getType().getShape());
  ArrayRef<int64_t> perm = op.getPermutation();
  SmallVector<int64_t> index;
  for (int64_t i = 0, e = out.data.size(); i < e; ++i) {
    unravel(i, out.shape, index);
    int64_t src = 0;
    for (size_t d = 0; d < index.size(); ++d)
      src += index[d] * inStrides[perm[d]];
    out.data[i] = in[0].data[src];
  }
  return std::vector<Tensor>{std::move(out)};
}

Result evalBroadcast(P::BroadcastOp op, ArrayRef<Tensor> in, std::string &) {
  Tensor out = zerosFor(op);
  ArrayRef<int64_t> inShape = op.getInput().getType().getShape();
  std::vector<int64_t> inStrides = stridesOf(inShape);
  size_t shift = out.shape.size() - inShape.size();
  SmallVector<int64_t> index;
  for (int64_t i = 0, e = out.data.size(); i < e; ++i) {
    unravel(i, out.shape, index);
    int64_t src = 0;
    for (size_t d = 0; d < inShape.size(); ++d)
      if (inShape[d] != 1)
        src += index[d + shift] * inStrides[d];
    out.data[i] = in[0].data[src];
  }
  return std::vector<Tensor>{std::move(out)};
}

Result evalConcat(P::ConcatOp op, ArrayRef<Tensor> in, std::string &) {
  Tensor out = zerosFor(op);
  int64_t axis = static_cast<int64_t>(op.getAxis());
  ArrayRef<int64_t> shape = out.shape;
  int64_t outer = product(shape.take_front(axis)),
          inner = product(shape.drop_front(axis + 1)), total = shape[axis];
  int64_t at = 0;
  for (auto [k, v] : llvm::enumerate(op.getInputs())) {
    int64_t len = typeOf(v).getDimSize(axis);
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t l = 0; l < len; ++l)
        for (int64_t i = 0; i < inner; ++i)
          out.data[(o * total + at + l) * inner + i] =
              in[k].data[(o * len + l) * inner + i];
    at += len;
  }
  return std::vector<Tensor>{std::move(out)};
}

Result evalSplit(P::SplitOp op, ArrayRef<Tensor> in, std::string &) {
  ArrayRef<int64_t> shape = op.getInput().getType().getShape();
  int64_t axis = static_cast<int64_t>(op.getAxis());
  int64_t outer = product(shape.take_front(axis)),
          inner = product(shape.drop_front(axis + 1)), total = shape[axis];
  std::vector<Tensor> results;
  int64_t at = 0;
  for (unsigned r = 0; r < op->getNumResults(); ++r) {
    Tensor out = zerosFor(op, r);
    int64_t len = out.shape[axis];
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t l = 0; l < len; ++l)
        for (int64_t i = 0; i < inner; ++i)
          out.data[(o * len + l) * inner + i] =
              in[0].data[(o * total + at + l) * inner + i];
    at += len;
    results.push_back(std::move(out));
  }
  return results;
}

Result evalSlice(P::SliceOp op, ArrayRef<Tensor> in, std::string &) {
  Tensor out = zerosFor(op);
  std::vector<int64_t> inStrides =
      stridesOf(op.getInput().getType().getShape());
  ArrayRef<int64_t> starts = op.getStarts(), steps = op.getSteps();
  SmallVector<int64_t> index;
  for (int64_t i = 0, e = out.data.size(); i < e; ++i) {
    unravel(i, out.shape, index);
    int64_t src = 0;
    for (size_t d = 0; d < index.size(); ++d)
      src += (starts[d] + index[d] * steps[d]) * inStrides[d];
    out.data[i] = in[0].data[src];
  }
  return std::vector<Tensor>{std::move(out)};
}

/// An index into a dimension of size `dim`: negative ones count from the
/// end, as in pcc_cpu_gather; out of range fails.
std::optional<int64_t> wrapIndex(double value, int64_t dim) {
  int64_t idx = static_cast<int64_t>(value);
  if (idx < -dim || idx >= dim)
    return std::nullopt;
  return idx < 0 ? idx + dim : idx;
}

Result evalGather(P::GatherOp op, ArrayRef<Tensor> in, std::string &error) {
  Tensor out = zerosFor(op);
  ArrayRef<int64_t> shape = op.getData().getType().getShape();
  int64_t axis = static_cast<int64_t>(op.getAxis());
  int64_t outer = product(shape.take_front(axis)), dim = shape[axis],
          inner = product(shape.drop_front(axis + 1));
  int64_t count = static_cast<int64_t>(in[1].data.size());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < count; ++j) {
      auto idx = wrapIndex(in[1].data[j], dim);
      if (!idx)
        return fail(error, opName(op) + ": index " +
                               Twine(static_cast<int64_t>(in[1].data[j])) +
                               " is out of range for a dimension of size " +
                               Twine(dim));
      for (int64_t i = 0; i < inner; ++i)
        out.data[(o * count + j) * inner + i] =
            in[0].data[(o * dim + *idx) * inner + i];
    }
  return std::vector<Tensor>{std::move(out)};
}

/// pcc.scatter_add %updates, %indices {axis}: the table-shaped result is
/// zero plus, for every index j, updates[..., j..., ...] added at row
/// indices[j] along `axis` (negative indices wrap): gather's adjoint.
Result evalScatterAdd(Operation *op, ArrayRef<Tensor> in, std::string &error) {
  auto axisAttr = i64Attr(op, "axis");
  if (!axisAttr || op->getNumOperands() != 2 || op->getNumResults() != 1)
    return fail(error, opName(op) + ": expected operands (updates, indices), "
                                    "one result and an integer `axis`");
  Tensor out = zerosFor(op);
  ArrayRef<int64_t> shape = out.shape;
  int64_t axis = *axisAttr;
  if (axis < 0 || axis >= static_cast<int64_t>(shape.size()))
    return fail(error,
                opName(op) + ": axis " + Twine(axis) + " is out of range");
  int64_t outer = product(shape.take_front(axis)), dim = shape[axis],
          inner = product(shape.drop_front(axis + 1));
  int64_t count = static_cast<int64_t>(in[1].data.size());
  if (static_cast<int64_t>(in[0].data.size()) != outer * count * inner)
    return fail(error, opName(op) + ": updates must have " +
                           Twine(outer * count * inner) + " elements");
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < count; ++j) {
      auto idx = wrapIndex(in[1].data[j], dim);
      if (!idx)
        return fail(error, opName(op) + ": index " +
                               Twine(static_cast<int64_t>(in[1].data[j])) +
                               " is out of range for a dimension of size " +
                               Twine(dim));
      for (int64_t i = 0; i < inner; ++i)
        out.data[(o * dim + *idx) * inner + i] +=
            in[0].data[(o * count + j) * inner + i];
    }
  return std::vector<Tensor>{std::move(out)};
}

/// pcc.pad %input {starts, steps}: zeros of the result's shape with
/// input[i] at starts + i * steps in each dimension: slice's adjoint.
Result evalPad(Operation *op, ArrayRef<Tensor> in, std::string &error) {
  auto starts = i64ArrayAttr(op, "starts"), steps = i64ArrayAttr(op, "steps");
  auto inType = typeOf(op->getOperand(0));
  size_t rank = inType.getRank();
  if (!starts || !steps || starts->size() != rank || steps->size() != rank)
    return fail(error, opName(op) + ": expected `starts` and `steps` with one "
                                    "entry per dimension");
  Tensor out = zerosFor(op);
  std::vector<int64_t> outStrides = stridesOf(out.shape);
  SmallVector<int64_t> index;
  for (int64_t i = 0, e = in[0].data.size(); i < e; ++i) {
    unravel(i, inType.getShape(), index);
    int64_t dst = 0;
    for (size_t d = 0; d < rank; ++d) {
      int64_t at = (*starts)[d] + index[d] * (*steps)[d];
      if (at < 0 || at >= out.shape[d])
        return fail(error, opName(op) + ": element " + Twine(index[d]) +
                               " of dimension " + Twine(d) +
                               " lands outside the result");
      dst += at * outStrides[d];
    }
    out.data[dst] = in[0].data[i];
  }
  return std::vector<Tensor>{std::move(out)};
}

//===----------------------------------------------------------------------===//
// Reductions
//===----------------------------------------------------------------------===//

/// reduce_sum / mean / max / min / prod as the `reduce` kernel computes them
/// (a double accumulator; max and min start from the element type's lowest
/// and highest finite values).
Result evalReduce(Operation *op, ArrayRef<Tensor> in, std::string &) {
  auto inType = typeOf(op->getOperand(0));
  ArrayRef<int64_t> shape = inType.getShape();
  Type e = inType.getElementType();
  SmallVector<bool> reduced(shape.size(), false);
  for (int64_t a :
       op->getAttrOfType<mlir::DenseI64ArrayAttr>("axes").asArrayRef())
    reduced[a] = true;
  // Output strides over the kept dimensions; reduced dimensions stride 0.
  std::vector<int64_t> outStride(shape.size(), 0);
  int64_t outCount = 1, reducedCount = 1;
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    if (reduced[d]) {
      reducedCount *= shape[d];
    } else {
      outStride[d] = outCount;
      outCount *= shape[d];
    }
  }
  double init = 0;
  if (llvm::isa<P::ReduceMaxOp>(op))
    init = lowestOf(e);
  else if (llvm::isa<P::ReduceMinOp>(op))
    init = highestOf(e);
  else if (llvm::isa<P::ReduceProdOp>(op))
    init = 1;
  Tensor out = zerosFor(op);
  out.data.assign(outCount, init);
  SmallVector<int64_t> index;
  for (int64_t i = 0, n = in[0].data.size(); i < n; ++i) {
    unravel(i, shape, index);
    int64_t o = 0;
    for (size_t d = 0; d < shape.size(); ++d)
      o += index[d] * outStride[d];
    double v = in[0].data[i];
    double &a = out.data[o];
    if (llvm::isa<P::ReduceMaxOp>(op))
      a = maxOf(a, v);
    else if (llvm::isa<P::ReduceMinOp>(op))
      a = minOf(a, v);
    else if (llvm::isa<P::ReduceProdOp>(op))
      a *= v;
    else
      a += v;
  }
  if (llvm::isa<P::ReduceMeanOp>(op))
    for (double &v : out.data)
      v /= reducedCount;
  return std::vector<Tensor>{std::move(out)};
}

/// The index of the first maximum ('>' against the best so far).
Result evalArgMax(P::ArgMaxOp op, ArrayRef<Tensor> in, std::string &) {
  ArrayRef<int64_t> shape = op.getInput().getType().getShape();
  int64_t axis = static_cast<int64_t>(op.getAxis());
  int64_t outer = product(shape.take_front(axis)), len = shape[axis],
          inner = product(shape.drop_front(axis + 1));
  Tensor out = zerosFor(op);
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      const double *x = in[0].data.data() + o * len * inner + i;
      int64_t best = 0;
      for (int64_t l = 1; l < len; ++l)
        if (x[l * inner] > x[best * inner])
          best = l;
      out.data[o * inner + i] = static_cast<double>(best);
    }
  return std::vector<Tensor>{std::move(out)};
}

//===----------------------------------------------------------------------===//
// Convolution and pooling
//===----------------------------------------------------------------------===//

/// Sliding-window geometry over the spatial dimensions of N x C x D...
/// tensors, as the kernels' `Window`.
struct Window {
  std::vector<int64_t> inSpatial, outSpatial, kernel, strides, pads, dilations;
  int64_t inCount, outCount, kernelCount;

  Window(ArrayRef<int64_t> inShape, ArrayRef<int64_t> outShape,
         ArrayRef<int64_t> kernel, ArrayRef<int64_t> strides,
         ArrayRef<int64_t> pads, ArrayRef<int64_t> dilations)
      : inSpatial(inShape.begin() + 2, inShape.end()),
        outSpatial(outShape.begin() + 2, outShape.end()),
        kernel(kernel.begin(), kernel.end()),
        strides(strides.begin(), strides.end()), pads(pads.begin(), pads.end()),
        dilations(dilations.begin(), dilations.end()),
        inCount(product(inShape.drop_front(2))),
        outCount(product(outShape.drop_front(2))),
        kernelCount(product(kernel)) {}

  int64_t rank() const { return static_cast<int64_t>(inSpatial.size()); }

  /// The input position along each spatial dimension of output position `o`
  /// and kernel position `k` (flat indices), possibly in the padding.
  SmallVector<int64_t> positions(int64_t o, int64_t k) const {
    SmallVector<int64_t> pos(rank());
    for (int64_t d = rank() - 1; d >= 0; --d) {
      int64_t od = o % outSpatial[d], kd = k % kernel[d];
      o /= outSpatial[d];
      k /= kernel[d];
      pos[d] = od * strides[d] - pads[d] + kd * dilations[d];
    }
    return pos;
  }

  /// The offset within one channel plane, or -1 in the padding.
  int64_t source(int64_t o, int64_t k) const {
    SmallVector<int64_t> pos = positions(o, k);
    int64_t offset = 0;
    for (int64_t d = 0; d < rank(); ++d) {
      if (pos[d] < 0 || pos[d] >= inSpatial[d])
        return -1;
      offset = offset * inSpatial[d] + pos[d];
    }
    return offset;
  }

  /// Whether the position lies inside the padded input (not past the
  /// trailing pad, as ceil mode allows).
  bool insidePadded(int64_t o, int64_t k) const {
    SmallVector<int64_t> pos = positions(o, k);
    for (int64_t d = 0; d < rank(); ++d)
      if (pos[d] >= inSpatial[d] + pads[rank() + d])
        return false;
    return true;
  }
};

Result evalConv(P::ConvOp op, ArrayRef<Tensor> in, std::string &) {
  auto inType = op.getInput().getType();
  ArrayRef<int64_t> wShape = op.getWeight().getType().getShape();
  Tensor out = zerosFor(op);
  Window win(inType.getShape(), out.shape, wShape.drop_front(2),
             op.getStrides(), op.getPads(), op.getDilations());
  int64_t n = inType.getDimSize(0), c = inType.getDimSize(1), m = wShape[0];
  int64_t groups = static_cast<int64_t>(op.getGroups());
  int64_t cg = c / groups, mg = m / groups;
  const std::vector<double> &x = in[0].data, &w = in[1].data;
  for (int64_t b = 0; b < n; ++b)
    for (int64_t oc = 0; oc < m; ++oc) {
      int64_t g = oc / mg;
      for (int64_t o = 0; o < win.outCount; ++o) {
        double sum = 0;
        for (int64_t ch = 0; ch < cg; ++ch) {
          const double *plane = x.data() + (b * c + g * cg + ch) * win.inCount;
          const double *kernel = w.data() + (oc * cg + ch) * win.kernelCount;
          for (int64_t k = 0; k < win.kernelCount; ++k) {
            int64_t s = win.source(o, k);
            if (s >= 0)
              sum += plane[s] * kernel[k];
          }
        }
        if (op.getBias())
          sum += in[2].data[oc];
        out.data[(b * m + oc) * win.outCount + o] = sum;
      }
    }
  return std::vector<Tensor>{std::move(out)};
}

/// max_pool (padding never wins; a window wholly in the padding gives -inf,
/// or the lowest value of an integer type) and avg_pool.
Result evalPool(Operation *op, ArrayRef<Tensor> in, std::string &) {
  auto attr = [&](StringRef name) {
    return op->getAttrOfType<mlir::DenseI64ArrayAttr>(name).asArrayRef();
  };
  auto inType = typeOf(op->getOperand(0));
  Tensor out = zerosFor(op);
  Window win(inType.getShape(), out.shape, attr("kernel_shape"),
             attr("strides"), attr("pads"), attr("dilations"));
  int64_t planes = inType.getDimSize(0) * inType.getDimSize(1);
  bool isMax = llvm::isa<P::MaxPoolOp>(op);
  bool countIncludePad = op->hasAttr("count_include_pad");
  Type e = inType.getElementType();
  double lowest = isFloat(e) ? -std::numeric_limits<double>::infinity()
                  : e.isUnsignedInteger(8) ? 0.0
                  : e.isInteger(8)         ? -128.0
                                           : lowestOf(e);
  for (int64_t p = 0; p < planes; ++p)
    for (int64_t o = 0; o < win.outCount; ++o) {
      const double *x = in[0].data.data() + p * win.inCount;
      double best = lowest, sum = 0;
      int64_t count = 0, padded = 0;
      for (int64_t k = 0; k < win.kernelCount; ++k) {
        int64_t s = win.source(o, k);
        if (s >= 0) {
          best = maxOf(best, x[s]);
          sum += x[s];
          ++count;
        } else if (countIncludePad && win.insidePadded(o, k)) {
          ++padded;
        }
      }
      double &y = out.data[p * win.outCount + o];
      if (isMax) {
        y = best;
      } else {
        int64_t divisor = countIncludePad ? count + padded : count;
        y = divisor ? sum / divisor : 0.0;
      }
    }
  return std::vector<Tensor>{std::move(out)};
}

/// pcc.dropout with the interpreter's run context: seed 0, step 1,
/// micro-batch 0 (the kernels' numbers, runtime/include/pcc/runtime/Philox.h).
Result evalDropout(P::DropoutOp op, ArrayRef<Tensor> in, std::string &) {
  Tensor out = zerosFor(op);
  double ratio = op.getRatio().convertToDouble();
  double scale = 1.0 / (1.0 - ratio);
  for (size_t i = 0; i < out.data.size(); ++i) {
    pccrt::Philox4 bits = pccrt::dropoutBits(
        kInterpreterSeed, i / 4, /*microbatch=*/0,
        static_cast<uint32_t>(op.getStream()), kInterpreterStep);
    bool keep = pccrt::uniformFromBits(bits.v[i % 4]) >= ratio;
    out.data[i] = keep ? in[0].data[i] * scale : 0.0;
  }
  return std::vector<Tensor>{std::move(out)};
}

/// pcc.conv_grad_input %dy, %w and pcc.conv_grad_weight %x, %dy: the
/// convolution's sums run backwards, accumulating into the input's or the
/// weight's positions.
Result evalConvGrad(Operation *op, ArrayRef<Tensor> in, std::string &) {
  bool wantInput = llvm::isa<P::ConvGradInputOp>(op);
  auto attr = [&](StringRef name) {
    return op->getAttrOfType<mlir::DenseI64ArrayAttr>(name).asArrayRef();
  };
  RankedTensorType xType = wantInput ? typeOf(op->getResult(0))
                                     : typeOf(op->getOperand(0));
  RankedTensorType wType = wantInput ? typeOf(op->getOperand(1))
                                     : typeOf(op->getResult(0));
  RankedTensorType gType = typeOf(op->getOperand(wantInput ? 0 : 1));
  const std::vector<double> &dy = in[wantInput ? 0 : 1].data;
  const std::vector<double> &other = in[wantInput ? 1 : 0].data;
  Tensor out = zerosFor(op);
  ArrayRef<int64_t> wShape = wType.getShape();
  Window win(xType.getShape(), gType.getShape(), wShape.drop_front(2),
             attr("strides"), attr("pads"), attr("dilations"));
  int64_t n = xType.getDimSize(0), c = xType.getDimSize(1), m = wShape[0];
  int64_t groups = *i64Attr(op, "groups");
  int64_t cg = c / groups, mg = m / groups;
  for (int64_t b = 0; b < n; ++b)
    for (int64_t oc = 0; oc < m; ++oc) {
      int64_t g = oc / mg;
      for (int64_t o = 0; o < win.outCount; ++o) {
        double grad = dy[(b * m + oc) * win.outCount + o];
        for (int64_t ch = 0; ch < cg; ++ch) {
          int64_t plane = (b * c + g * cg + ch) * win.inCount;
          int64_t kernel = (oc * cg + ch) * win.kernelCount;
          for (int64_t k = 0; k < win.kernelCount; ++k) {
            int64_t s = win.source(o, k);
            if (s < 0)
              continue;
            if (wantInput)
              out.data[plane + s] += grad * other[kernel + k];
            else
              out.data[kernel + k] += grad * other[plane + s];
          }
        }
      }
    }
  return std::vector<Tensor>{std::move(out)};
}

/// pcc.max_pool_grad %x, %dy: each gradient goes to its window's first
/// maximum. pcc.avg_pool_grad %dy: shared out as the pooling divided.
Result evalPoolGrad(Operation *op, ArrayRef<Tensor> in, std::string &) {
  bool isMax = llvm::isa<P::MaxPoolGradOp>(op);
  auto attr = [&](StringRef name) {
    return op->getAttrOfType<mlir::DenseI64ArrayAttr>(name).asArrayRef();
  };
  RankedTensorType xType = typeOf(op->getResult(0));
  const std::vector<double> &dy = in[isMax ? 1 : 0].data;
  Tensor out = zerosFor(op);
  Window win(xType.getShape(), typeOf(op->getOperand(isMax ? 1 : 0)).getShape(),
             attr("kernel_shape"), attr("strides"), attr("pads"),
             attr("dilations"));
  int64_t planes = xType.getDimSize(0) * xType.getDimSize(1);
  bool countIncludePad = op->hasAttr("count_include_pad");
  for (int64_t p = 0; p < planes; ++p)
    for (int64_t o = 0; o < win.outCount; ++o) {
      double g = dy[p * win.outCount + o];
      double *dx = out.data.data() + p * win.inCount;
      if (isMax) {
        const double *x = in[0].data.data() + p * win.inCount;
        int64_t winner = -1;
        for (int64_t k = 0; k < win.kernelCount; ++k) {
          int64_t s = win.source(o, k);
          if (s >= 0 && (winner < 0 || x[s] > x[winner]))
            winner = s;
        }
        if (winner >= 0)
          dx[winner] += g;
        continue;
      }
      int64_t count = 0, padded = 0;
      for (int64_t k = 0; k < win.kernelCount; ++k) {
        if (win.source(o, k) >= 0)
          ++count;
        else if (countIncludePad && win.insidePadded(o, k))
          ++padded;
      }
      int64_t divisor = countIncludePad ? count + padded : count;
      for (int64_t k = 0; k < win.kernelCount; ++k) {
        int64_t s = win.source(o, k);
        if (s >= 0)
          dx[s] += g / divisor;
      }
    }
  return std::vector<Tensor>{std::move(out)};
}

//===----------------------------------------------------------------------===//
// Losses (matched by name)
//===----------------------------------------------------------------------===//

/// pcc.cross_entropy %logits, %labels {ignore_index}: per row,
/// logsumexp(row) - row[label], 0 where label == ignore_index.
/// pcc.cross_entropy_grad %logits, %labels, %grad {ignore_index}: per row,
/// (softmax(row) - onehot(label)) * grad[n], zero rows where ignored.
Result evalCrossEntropy(Operation *op, ArrayRef<Tensor> in,
                        std::string &error) {
  bool isGrad = op->getName().getStringRef() == "pcc.cross_entropy_grad";
  if (op->getNumOperands() != (isGrad ? 3u : 2u) || op->getNumResults() != 1)
    return fail(error, opName(op) + ": unexpected operand or result count");
  auto logits = typeOf(op->getOperand(0));
  if (logits.getRank() != 2)
    return fail(error, opName(op) + ": logits must be N x V");
  int64_t rows = logits.getDimSize(0), vocab = logits.getDimSize(1);
  std::optional<int64_t> ignore = i64Attr(op, "ignore_index");
  Tensor out = zerosFor(op);
  for (int64_t r = 0; r < rows; ++r) {
    double labelValue = in[1].data[r];
    int64_t label = static_cast<int64_t>(labelValue);
    if (ignore && label == *ignore)
      continue; // a zero loss and a zero gradient row
    if (label < 0 || label >= vocab)
      return fail(error, opName(op) + ": label " + Twine(label) + " of row " +
                             Twine(r) + " is out of range [0, " + Twine(vocab) +
                             ")");
    const double *x = in[0].data.data() + r * vocab;
    double maxValue = -std::numeric_limits<double>::infinity();
    for (int64_t v = 0; v < vocab; ++v)
      maxValue = maxOf(maxValue, x[v]);
    double sum = 0;
    for (int64_t v = 0; v < vocab; ++v)
      sum += std::exp(x[v] - maxValue);
    if (!isGrad) {
      out.data[r] = maxValue + std::log(sum) - x[label];
      continue;
    }
    double g = in[2].data[r];
    for (int64_t v = 0; v < vocab; ++v)
      out.data[r * vocab + v] =
          (std::exp(x[v] - maxValue) / sum - (v == label ? 1.0 : 0.0)) * g;
  }
  return std::vector<Tensor>{std::move(out)};
}

/// pcc.linear_cross_entropy %h, %w, %labels: the logits l = h w^T in full
/// (w [V, D] with transpose_w, else [D, V]), each row's log-sum-exp and its
/// label's logit (0 for an ignored label). The gradient: dl = g_lse
/// softmax(l) + g_target onehot(label), dh = dl w, dw = dl^T h (in w's
/// layout). Without a mesh (mesh_axis is not evaluable here).
Result evalLinearCrossEntropy(Operation *op, ArrayRef<Tensor> in,
                              std::string &error) {
  bool isGrad = op->getName().getStringRef() == "pcc.linear_cross_entropy_grad";
  if (op->hasAttr("mesh_axis"))
    return fail(error, opName(op) + " is not evaluable with a mesh_axis");
  auto h = typeOf(op->getOperand(0)), w = typeOf(op->getOperand(1));
  bool transposeW = op->hasAttr("transpose_w");
  int64_t rows = h.getDimSize(0), dim = h.getDimSize(1);
  int64_t vocab = w.getDimSize(transposeW ? 0 : 1);
  auto weight = [&](int64_t v, int64_t d) -> int64_t {
    return transposeW ? v * dim + d : d * vocab + v;
  };
  std::optional<int64_t> ignore = i64Attr(op, "ignore_index");
  Tensor lse = zerosFor(op, 0), second = zerosFor(op, 1);
  std::vector<double> logits(static_cast<size_t>(vocab));
  for (int64_t r = 0; r < rows; ++r) {
    int64_t label = static_cast<int64_t>(in[2].data[r]);
    bool ignored = ignore && label == *ignore;
    if (!ignored && (label < 0 || label >= vocab))
      return fail(error, opName(op) + ": label " + Twine(label) + " of row " +
                             Twine(r) + " is out of range [0, " + Twine(vocab) +
                             ")");
    double maxValue = -std::numeric_limits<double>::infinity();
    for (int64_t v = 0; v < vocab; ++v) {
      double x = 0;
      for (int64_t d = 0; d < dim; ++d)
        x += in[0].data[r * dim + d] * in[1].data[weight(v, d)];
      logits[v] = x;
      maxValue = maxOf(maxValue, x);
    }
    double sum = 0;
    for (int64_t v = 0; v < vocab; ++v)
      sum += std::exp(logits[v] - maxValue);
    double rowLse = maxValue + std::log(sum);
    if (!isGrad) {
      lse.data[r] = rowLse;
      second.data[r] = ignored ? 0.0 : logits[label];
      continue;
    }
    // Gradient: lse is the forward's (operand 3), the cotangents 4 and 5.
    double gl = in[4].data[r], gt = in[5].data[r];
    for (int64_t v = 0; v < vocab; ++v) {
      double dl = gl * std::exp(logits[v] - in[3].data[r]) +
                  (!ignored && v == label ? gt : 0.0);
      for (int64_t d = 0; d < dim; ++d) {
        lse.data[r * dim + d] += dl * in[1].data[weight(v, d)];
        second.data[weight(v, d)] += dl * in[0].data[r * dim + d];
      }
    }
  }
  return std::vector<Tensor>{std::move(lse), std::move(second)};
}

/// pcc.attention %q, %k, %v [bias %b] {scale, causal}: the scores in full,
/// softmax over the visible keys (zeros for a row with none), times v; and
/// each row's log-sum-exp. pcc.attention_grad %q, %k, %v, %out, %lse, %g:
/// p = exp(s - lse), dv = p^T g, ds = p (g v^T - rowsum(g out)),
/// dq = scale ds k, dk = scale ds^T q (a key head's summed over its group).
Result evalAttention(Operation *op, ArrayRef<Tensor> in, std::string &error) {
  bool isGrad = op->getName().getStringRef() == "pcc.attention_grad";
  unsigned fixed = isGrad ? 6 : 3;
  if (op->getNumOperands() != fixed && op->getNumOperands() != fixed + 1)
    return fail(error, opName(op) + ": unexpected operand count");
  const Tensor *bias = op->getNumOperands() > fixed ? &in[fixed] : nullptr;
  auto q = typeOf(op->getOperand(0)), k = typeOf(op->getOperand(1)),
       v = typeOf(op->getOperand(2));
  int64_t batch = q.getDimSize(0), hq = q.getDimSize(1), s = q.getDimSize(2),
          d = q.getDimSize(3), hkv = k.getDimSize(1), len = k.getDimSize(2),
          dv = v.getDimSize(3), group = hq / hkv;
  double scale = op->getAttrOfType<mlir::FloatAttr>("scale").getValueAsDouble();
  bool causal = op->hasAttr("causal");
  std::vector<int64_t> biasShape(4, 1);
  if (bias)
    biasShape.assign(bias->shape.begin(), bias->shape.end());
  auto biasAt = [&](int64_t b, int64_t h, int64_t i, int64_t j) {
    if (!bias)
      return 0.0;
    int64_t idx[4] = {b, h, i, j}, flat = 0;
    for (int d = 0; d < 4; ++d)
      flat = flat * biasShape[d] + (biasShape[d] == 1 ? 0 : idx[d]);
    return bias->data[flat];
  };
  std::vector<Tensor> results;
  for (unsigned r = 0; r < op->getNumResults(); ++r)
    results.push_back(zerosFor(op, r));
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> scores(len);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < hq; ++h) {
      int64_t kvHead = b * hkv + h / group, qHead = b * hq + h;
      for (int64_t i = 0; i < s; ++i) {
        int64_t visible = causal ? std::clamp<int64_t>(i + len - s + 1, 0, len)
                                 : len;
        const double *qi = in[0].data.data() + (qHead * s + i) * d;
        double maxValue = -inf;
        for (int64_t j = 0; j < visible; ++j) {
          const double *kj = in[1].data.data() + (kvHead * len + j) * d;
          double dot = 0;
          for (int64_t c = 0; c < d; ++c)
            dot += qi[c] * kj[c];
          scores[j] = dot * scale + biasAt(b, h, i, j);
          maxValue = maxOf(maxValue, scores[j]);
        }
        if (!isGrad) {
          double *o = results[0].data.data() + (qHead * s + i) * dv;
          if (maxValue == -inf) {
            results[1].data[qHead * s + i] = -inf;
            continue;
          }
          double sum = 0;
          for (int64_t j = 0; j < visible; ++j)
            sum += std::exp(scores[j] - maxValue);
          for (int64_t j = 0; j < visible; ++j) {
            double p = std::exp(scores[j] - maxValue) / sum;
            const double *vj = in[2].data.data() + (kvHead * len + j) * dv;
            for (int64_t c = 0; c < dv; ++c)
              o[c] += p * vj[c];
          }
          results[1].data[qHead * s + i] = maxValue + std::log(sum);
          continue;
        }
        double lse = in[4].data[qHead * s + i];
        if (lse == -inf)
          continue;
        const double *gi = in[5].data.data() + (qHead * s + i) * dv;
        const double *oi = in[3].data.data() + (qHead * s + i) * dv;
        double rowDot = 0;
        for (int64_t c = 0; c < dv; ++c)
          rowDot += gi[c] * oi[c];
        double *dqi = results[0].data.data() + (qHead * s + i) * d;
        for (int64_t j = 0; j < visible; ++j) {
          double p = std::exp(scores[j] - lse);
          const double *vj = in[2].data.data() + (kvHead * len + j) * dv;
          const double *kj = in[1].data.data() + (kvHead * len + j) * d;
          double dp = 0;
          for (int64_t c = 0; c < dv; ++c) {
            dp += gi[c] * vj[c];
            results[2].data[(kvHead * len + j) * dv + c] += p * gi[c];
          }
          double ds = p * (dp - rowDot) * scale;
          for (int64_t c = 0; c < d; ++c) {
            dqi[c] += ds * kj[c];
            results[1].data[(kvHead * len + j) * d + c] += ds * qi[c];
          }
        }
      }
    }
  return results;
}

//===----------------------------------------------------------------------===//
// Dispatch
//===----------------------------------------------------------------------===//

Result dispatch(Operation *op, ArrayRef<Tensor> in, std::string &error) {
  if (llvm::isa<P::ParamOp>(op))
    return fail(error, opName(op) + " has no value without a weight store; "
                                    "evaluate it with interpret()");
  if (auto c = llvm::dyn_cast<P::ConstantOp>(op))
    return evalConstant(c, error);
  if (auto mm = llvm::dyn_cast<P::MatmulOp>(op))
    return evalMatmul(mm, in, error);
  if (isElementwise(op))
    return evalElementwise(op, in, error);
  if (llvm::isa<P::SoftmaxOp, P::LogSoftmaxOp>(op))
    return evalSoftmax(op, in, error);
  if (auto ln = llvm::dyn_cast<P::LayerNormOp>(op))
    return evalLayerNorm(ln, in, error);
  if (auto bn = llvm::dyn_cast<P::BatchNormOp>(op))
    return evalBatchNorm(bn, in, error);
  if (auto r = llvm::dyn_cast<P::ReshapeOp>(op))
    return evalReshape(r, in, error);
  if (auto t = llvm::dyn_cast<P::TransposeOp>(op))
    return evalTranspose(t, in, error);
  if (auto b = llvm::dyn_cast<P::BroadcastOp>(op))
    return evalBroadcast(b, in, error);
  if (auto c = llvm::dyn_cast<P::ConcatOp>(op))
    return evalConcat(c, in, error);
  if (auto s = llvm::dyn_cast<P::SplitOp>(op))
    return evalSplit(s, in, error);
  if (auto s = llvm::dyn_cast<P::SliceOp>(op))
    return evalSlice(s, in, error);
  if (auto g = llvm::dyn_cast<P::GatherOp>(op))
    return evalGather(g, in, error);
  if (llvm::isa<P::ReduceSumOp, P::ReduceMeanOp, P::ReduceMaxOp, P::ReduceMinOp,
                P::ReduceProdOp>(op))
    return evalReduce(op, in, error);
  if (auto a = llvm::dyn_cast<P::ArgMaxOp>(op))
    return evalArgMax(a, in, error);
  if (auto c = llvm::dyn_cast<P::ConvOp>(op))
    return evalConv(c, in, error);
  if (llvm::isa<P::MaxPoolOp, P::AvgPoolOp>(op))
    return evalPool(op, in, error);
  if (auto d = llvm::dyn_cast<P::DropoutOp>(op))
    return evalDropout(d, in, error);
  if (llvm::isa<P::ConvGradInputOp, P::ConvGradWeightOp>(op))
    return evalConvGrad(op, in, error);
  if (llvm::isa<P::MaxPoolGradOp, P::AvgPoolGradOp>(op))
    return evalPoolGrad(op, in, error);

  // Ops matched by name (added to the dialect after this file).
  StringRef name = op->getName().getStringRef();
  if (name == "pcc.scatter_add")
    return evalScatterAdd(op, in, error);
  if (name == "pcc.pad")
    return evalPad(op, in, error);
  if (name == "pcc.cross_entropy" || name == "pcc.cross_entropy_grad")
    return evalCrossEntropy(op, in, error);
  if (name == "pcc.attention" || name == "pcc.attention_grad")
    return evalAttention(op, in, error);
  if (name == "pcc.linear_cross_entropy" ||
      name == "pcc.linear_cross_entropy_grad")
    return evalLinearCrossEntropy(op, in, error);

  // A sum over a mesh axis of one rank is that rank's tensor (the gradient
  // check of all_reduce's rule runs on such a mesh).
  if (auto reduce = llvm::dyn_cast<P::AllReduceOp>(op)) {
    FailureOr<int64_t> ranks = P::getMeshAxisSize(op, reduce.getAxis());
    if (succeeded(ranks) && *ranks == 1) {
      Tensor out = zerosFor(op);
      out.data = in[0].data;
      return std::vector<Tensor>{std::move(out)};
    }
  }
  if (llvm::isa<P::AllReduceOp, P::AllGatherOp, P::ReduceScatterOp,
                P::ShardSliceOp, P::ShardGatherOp>(op))
    return fail(error, opName(op) + " is not evaluable: it depends on the "
                                    "mesh (collectives and sharded ops)");
  if (llvm::isa<P::TransferOp>(op))
    return fail(error, opName(op) + " is not evaluable: pipeline transfer");
  if (llvm::isa<P::FusionOp, P::YieldOp>(op))
    return fail(error, opName(op) + " is not evaluable: fusions are not "
                                    "interpreted");
  if (op->getNumResults() == 0)
    return fail(error, opName(op) + " is not evaluable: it has no results "
                                    "(side effects are not interpreted)");
  return fail(error, opName(op) + " is not evaluable: no rule for it");
}

/// Checks that `t` holds a value of `v`'s type: its element count, and its
/// shape unless it leaves the shape empty.
bool fits(const Tensor &t, Value v) {
  auto type = typeOf(v);
  return type && type.hasStaticShape() &&
         static_cast<int64_t>(t.data.size()) == type.getNumElements() &&
         (t.shape.empty() || ArrayRef<int64_t>(t.shape) == type.getShape());
}

} // namespace

FailureOr<std::vector<Tensor>>
evaluateOp(Operation *op, ArrayRef<Tensor> operands, std::string *error) {
  std::string message;
  auto done = [&](Result r) {
    if (failed(r) && error)
      *error = message;
    return r;
  };
  if (operands.size() != op->getNumOperands())
    return done(fail(message, opName(op) + ": got " + Twine(operands.size()) +
                                  " operand tensors for " +
                                  Twine(op->getNumOperands()) + " operands"));
  for (auto [i, v] : llvm::enumerate(op->getOperands()))
    if (!fits(operands[i], v))
      return done(fail(message, opName(op) + ": operand " + Twine(i) +
                                    " has shape " +
                                    shapeString(operands[i].shape) + " and " +
                                    Twine(operands[i].data.size()) +
                                    " elements, which does not fit its type"));
  for (Value r : op->getResults())
    if (!typeOf(r) || !typeOf(r).hasStaticShape())
      return done(fail(message, opName(op) + ": results must be statically "
                                             "shaped ranked tensors"));
  Result r = dispatch(op, operands, message);
  if (failed(r))
    return done(r);
  if (r->size() != op->getNumResults())
    return done(fail(message, opName(op) + ": the rule gave " +
                                  Twine(r->size()) + " results for " +
                                  Twine(op->getNumResults())));
  // Integer and boolean results truncate and wrap to their element type.
  for (auto [t, v] : llvm::zip(*r, op->getResults())) {
    Type e = elementTypeOf(v);
    if (!isFloat(e))
      for (double &x : t.data)
        x = toElement(x, e);
  }
  return r;
}

FailureOr<std::vector<Tensor>>
interpret(mlir::func::FuncOp func, ArrayRef<Tensor> args,
          llvm::function_ref<Tensor(StringRef)> params, std::string *error) {
  std::string message;
  auto failWith = [&](const Twine &text) -> Result {
    if (error)
      *error = text.str();
    return failure();
  };
  /// "'pcc.foo' at loc(...)".
  auto where = [](Operation *op) {
    std::string s;
    llvm::raw_string_ostream os(s);
    os << opName(op) << " at " << op->getLoc();
    return s;
  };
  if (func.getBody().empty() || !llvm::hasSingleElement(func.getBody()))
    return failWith("@" + func.getSymName() + " must have a single block");
  mlir::Block &block = func.getBody().front();
  if (args.size() != block.getNumArguments())
    return failWith("@" + func.getSymName() + " takes " +
                    Twine(block.getNumArguments()) + " arguments, got " +
                    Twine(args.size()));
  llvm::DenseMap<Value, Tensor> values;
  for (auto [i, arg] : llvm::enumerate(block.getArguments())) {
    if (!fits(args[i], arg))
      return failWith("argument " + Twine(i) + " has shape " +
                      shapeString(args[i].shape) + " and " +
                      Twine(args[i].data.size()) +
                      " elements, which does not fit its type");
    Tensor t = args[i];
    t.shape.assign(typeOf(arg).getShape().begin(),
                   typeOf(arg).getShape().end());
    values[arg] = std::move(t);
  }
  for (Operation &op : block) {
    if (auto ret = llvm::dyn_cast<mlir::func::ReturnOp>(op)) {
      std::vector<Tensor> results;
      for (Value v : ret.getOperands())
        results.push_back(values.lookup(v));
      return results;
    }
    if (auto param = llvm::dyn_cast<P::ParamOp>(op)) {
      Tensor t = params(param.getName());
      if (!fits(t, param.getResult()))
        return failWith(where(&op) + ": the weight '" + param.getName() +
                        "' has shape " + shapeString(t.shape) + " and " +
                        Twine(t.data.size()) + " elements, not those of " +
                        "its type");
      t.shape.assign(param.getType().getShape().begin(),
                     param.getType().getShape().end());
      values[param.getResult()] = std::move(t);
      continue;
    }
    std::vector<Tensor> operands;
    for (Value v : op.getOperands()) {
      auto it = values.find(v);
      if (it == values.end())
        return failWith(where(&op) + ": an operand is not defined in the "
                                     "function's block");
      operands.push_back(it->second);
    }
    auto results = evaluateOp(&op, operands, &message);
    if (failed(results))
      return failWith(message + " (" + where(&op) + ")");
    for (auto [v, t] : llvm::zip(op.getResults(), *results))
      values[v] = std::move(t);
  }
  return failWith("@" + func.getSymName() + " has no func.return");
}

} // namespace pcc::testing

mlir::MLIRContext &pcc::testing::testContext() {
  static mlir::MLIRContext *ctx = [] {
    auto *c = new mlir::MLIRContext();
    c->loadDialect<mlir::pcc::PccDialect, mlir::func::FuncDialect>();
    return c;
  }();
  return *ctx;
}
