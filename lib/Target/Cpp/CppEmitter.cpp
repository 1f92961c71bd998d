//===- CppEmitter.cpp - planned pcc IR to C++
//------------------------------===//
//
// Every SSA value becomes a typed pointer: graph inputs and weights come from
// the caller's arrays, constants are static arrays, reshapes alias their
// input, and every other result points into the arena at the offset
// pcc-plan-memory chose. Elementwise ops become static loop kernels, keyed by
// their text so identical kernels (every layer's GELU, say) are emitted once;
// the other ops call the runtime's CPU kernels with static shapes.
//
//===----------------------------------------------------------------------===//

#include "pcc/Target/Cpp.h"

#include "pcc/Dialect/Pcc/IR/PccDialect.h"
#include "pcc/Import/OnnxImporter.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/ADT/TypeSwitch.h"
#include "llvm/Support/FormatVariadic.h"

#include <cmath>

using namespace mlir;
using namespace mlir::pcc;

namespace {

//===----------------------------------------------------------------------===//
// Types and literals
//===----------------------------------------------------------------------===//

/// C type, ABI dtype code and byte size of an element type.
struct ElementInfo {
  StringRef cType;
  int code;
  int64_t size;
};

std::optional<ElementInfo> elementInfo(Type type) {
  if (type.isF32())
    return ElementInfo{"float", 0, 4};
  if (type.isF64())
    return ElementInfo{"double", 1, 8};
  if (type.isF16())
    return ElementInfo{"uint16_t", 2, 2};
  if (type.isBF16())
    return ElementInfo{"uint16_t", 3, 2};
  if (type.isInteger(64))
    return ElementInfo{"int64_t", 4, 8};
  if (type.isInteger(32))
    return ElementInfo{"int32_t", 5, 4};
  if (type.isInteger(16))
    return ElementInfo{"int16_t", 6, 2};
  if (type.isSignlessInteger(8))
    return ElementInfo{"int8_t", 7, 1};
  if (type.isUnsignedInteger(8))
    return ElementInfo{"uint8_t", 8, 1};
  if (type.isInteger(1))
    return ElementInfo{"uint8_t", 9, 1};
  return std::nullopt;
}

RankedTensorType tensorTypeOf(Value v) {
  return cast<RankedTensorType>(v.getType());
}

/// A C++ literal of `value` in `type` (f32, f64 or an integer type).
std::string literal(double value, Type type) {
  if (isa<FloatType>(type)) {
    StringRef t = type.isF64() ? "double" : "float";
    if (std::isnan(value))
      return ("std::numeric_limits<" + t + ">::quiet_NaN()").str();
    if (std::isinf(value))
      return ((value < 0 ? "-" : "") +
              ("std::numeric_limits<" + t + ">::infinity()"))
          .str();
    return llvm::formatv(type.isF64() ? "{0:e16}" : "{0:e9}f", value).str();
  }
  if (type.isInteger(1))
    return value != 0 ? "1" : "0";
  if (value >= 9.2e18)
    return "INT64_MAX";
  if (value <= -9.2e18)
    return "INT64_MIN";
  return std::to_string(static_cast<int64_t>(value)) + "LL";
}

std::string intList(ArrayRef<int64_t> values) {
  std::string s;
  for (auto [i, v] : llvm::enumerate(values))
    s += (i ? ", " : "") + std::to_string(v) + "LL";
  return s.empty() ? "0LL" : s; // a C array needs one element
}

SmallVector<int64_t> stridesOf(ArrayRef<int64_t> shape) {
  SmallVector<int64_t> strides(shape.size(), 1);
  for (int64_t d = static_cast<int64_t>(shape.size()) - 2; d >= 0; --d)
    strides[d] = strides[d + 1] * shape[d + 1];
  return strides;
}

int64_t product(ArrayRef<int64_t> dims) {
  int64_t p = 1;
  for (int64_t d : dims)
    p *= d;
  return p;
}

/// "node '/enc/MatMul' (MatMul)" for an op imported from ONNX.
std::string describeOp(Operation *op) {
  auto [opType, node] = getOnnxNodeOfLocation(op->getLoc());
  if (!opType.empty())
    return "node '" + node + "' (" + opType + ")";
  return op->getName().getStringRef().str();
}

/// Escapes a string for a C++ string literal.
std::string quoted(StringRef s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\')
      out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out + "\"";
}

//===----------------------------------------------------------------------===//
// The emitter
//===----------------------------------------------------------------------===//

class CppEmitter {
public:
  CppEmitter(func::FuncOp func, const CppEmitOptions &options)
      : func(func), options(options) {}

  LogicalResult emit(llvm::raw_ostream &os);

private:
  // Values.
  std::string nameOf(Value v) { return names.lookup(v); }
  LogicalResult define(Value v, StringRef cType, StringRef init, bool isConst);
  LogicalResult defineResult(Operation *op, unsigned i);

  // Ops.
  LogicalResult emitOp(Operation *op);
  LogicalResult emitElementwise(Operation *op);
  LogicalResult emitFusion(FusionOp fusion);
  /// Adds a kernel (deduplicated by its text) and returns its name.
  std::string kernel(const std::string &text);
  LogicalResult emitCopy(Value in, Value out, ArrayRef<int64_t> shape,
                         ArrayRef<int64_t> inStrides, int64_t inOffset,
                         ArrayRef<int64_t> outStrides, int64_t outOffset);
  LogicalResult emitConstant(ConstantOp op);
  std::optional<std::string>
  scalarExpr(Operation *op, ArrayRef<std::string> args, Type computeType);
  LogicalResult requireF32(Operation *op, Value v);

  void line(const llvm::Twine &text) { body += "  " + text.str() + "\n"; }

  func::FuncOp func;
  const CppEmitOptions &options;
  llvm::DenseMap<Value, std::string> names;
  unsigned nextValue = 0;
  std::string constants, kernels, body;
  llvm::StringMap<std::string> kernelNames; // kernel text -> name
  std::vector<std::pair<std::string, RankedTensorType>> weights;
  llvm::StringMap<unsigned> weightIndex;
};

LogicalResult CppEmitter::define(Value v, StringRef cType, StringRef init,
                                 bool isConst) {
  std::string name = "v" + std::to_string(nextValue++);
  names[v] = name;
  line((isConst ? "const " : "") + cType + " *" + name + " = " + init + ";");
  return success();
}

LogicalResult CppEmitter::defineResult(Operation *op, unsigned i) {
  Value result = op->getResult(i);
  auto info = elementInfo(tensorTypeOf(result).getElementType());
  if (!info)
    return op->emitError("code generation: unsupported element type ")
           << tensorTypeOf(result).getElementType();
  auto offsets = op->getAttrOfType<DenseI64ArrayAttr>("pcc.buffer_offsets");
  if (!offsets || offsets.size() != static_cast<int64_t>(op->getNumResults()))
    return op->emitError("code generation: the op has no buffer offsets; "
                         "run pcc-plan-memory first");
  int64_t offset = offsets[i];
  return define(
      result, info->cType,
      llvm::formatv("reinterpret_cast<{0} *>(arena + {1})", info->cType, offset)
          .str(),
      /*isConst=*/false);
}

LogicalResult CppEmitter::requireF32(Operation *op, Value v) {
  if (tensorTypeOf(v).getElementType().isF32())
    return success();
  return op->emitError("code generation: ")
         << op->getName() << " on " << tensorTypeOf(v).getElementType()
         << " is not supported by the CPU back end (f32 only)";
}

//===----------------------------------------------------------------------===//
// Elementwise ops: one loop kernel each, deduplicated by text
//===----------------------------------------------------------------------===//

/// Half-precision types are stored as bits and computed in f32.
static Type computeTypeOf(Type type) {
  if (type.isF16() || type.isBF16())
    return Float32Type::get(type.getContext());
  return type;
}

std::optional<std::string> CppEmitter::scalarExpr(Operation *op,
                                                  ArrayRef<std::string> a,
                                                  Type computeType) {
  Type t = computeType;
  Type in = computeTypeOf(tensorTypeOf(op->getOperand(0)).getElementType());
  bool isFloat = isa<FloatType>(in);
  std::string T = elementInfo(t) ? elementInfo(t)->cType.str() : "";
  auto one = [&] { return "static_cast<" + T + ">(1)"; };
  auto zero = [&] { return "static_cast<" + T + ">(0)"; };
  return llvm::TypeSwitch<Operation *, std::optional<std::string>>(op)
      .Case([&](NegOp) { return "-" + a[0]; })
      .Case([&](AbsOp) {
        return isFloat ? "std::fabs(" + a[0] + ")"
                       : "(" + a[0] + " < 0 ? -" + a[0] + " : " + a[0] + ")";
      })
      .Case([&](SqrtOp) { return "std::sqrt(" + a[0] + ")"; })
      .Case([&](ReciprocalOp) { return one() + " / " + a[0]; })
      .Case([&](ExpOp) { return "std::exp(" + a[0] + ")"; })
      .Case([&](LogOp) { return "std::log(" + a[0] + ")"; })
      .Case([&](ErfOp) { return "std::erf(" + a[0] + ")"; })
      .Case([&](TanhOp) { return "std::tanh(" + a[0] + ")"; })
      .Case([&](SigmoidOp) {
        return one() + " / (" + one() + " + std::exp(-" + a[0] + "))";
      })
      .Case([&](ReluOp) {
        return "(" + a[0] + " > " + zero() + " ? " + a[0] + " : " + zero() +
               ")";
      })
      .Case([&](FloorOp) { return "std::floor(" + a[0] + ")"; })
      .Case([&](CeilOp) { return "std::ceil(" + a[0] + ")"; })
      .Case([&](SinOp) { return "std::sin(" + a[0] + ")"; })
      .Case([&](CosOp) { return "std::cos(" + a[0] + ")"; })
      .Case([&](NotOp) { return "static_cast<uint8_t>(!" + a[0] + ")"; })
      .Case([&](GeluOp g) -> std::string {
        if (g.getTanhApproximation())
          return "(" + literal(0.5, t) + " * " + a[0] + " * (" + one() +
                 " + std::tanh(" + literal(0.7978845608028654, t) + " * (" +
                 a[0] + " + " + literal(0.044715, t) + " * " + a[0] + " * " +
                 a[0] + " * " + a[0] + "))))";
        return "(" + literal(0.5, t) + " * " + a[0] + " * (" + one() +
               " + std::erf(" + a[0] + " * " + literal(0.7071067811865476, t) +
               ")))";
      })
      .Case([&](LeakyReluOp l) {
        return "(" + a[0] + " >= " + zero() + " ? " + a[0] + " : " +
               literal(l.getAlpha().convertToDouble(), t) + " * " + a[0] + ")";
      })
      .Case([&](ClampOp c) {
        double lo = c.getMin().convertToDouble(),
               hi = c.getMax().convertToDouble();
        std::string lower = a[0];
        if (!std::isinf(lo) || lo > 0)
          lower = "std::max<" + T + ">(" + a[0] + ", " + literal(lo, t) + ")";
        if (std::isinf(hi) && hi > 0)
          return lower;
        return "std::min<" + T + ">(" + lower + ", " + literal(hi, t) + ")";
      })
      .Case([&](AddOp) { return "(" + a[0] + " + " + a[1] + ")"; })
      .Case([&](SubOp) { return "(" + a[0] + " - " + a[1] + ")"; })
      .Case([&](MulOp) { return "(" + a[0] + " * " + a[1] + ")"; })
      .Case([&](DivOp) -> std::string {
        if (isFloat)
          return "(" + a[0] + " / " + a[1] + ")";
        // ONNX integer division truncates; a zero divisor gives 0 here
        // instead of undefined behaviour.
        return "(" + a[1] + " == 0 ? " + zero() + " : static_cast<" + T + ">(" +
               a[0] + " / " + a[1] + "))";
      })
      .Case([&](PowOp) -> std::string {
        if (isFloat)
          return "std::pow(" + a[0] + ", " + a[1] + ")";
        return "static_cast<" + T + ">(std::pow(static_cast<double>(" + a[0] +
               "), static_cast<double>(" + a[1] + ")))";
      })
      .Case([&](MaxOp) {
        return "(" + a[0] + " > " + a[1] + " ? " + a[0] + " : " + a[1] + ")";
      })
      .Case([&](MinOp) {
        return "(" + a[0] + " < " + a[1] + " ? " + a[0] + " : " + a[1] + ")";
      })
      .Case([&](AndOp) {
        return "static_cast<uint8_t>(" + a[0] + " && " + a[1] + ")";
      })
      .Case([&](OrOp) {
        return "static_cast<uint8_t>(" + a[0] + " || " + a[1] + ")";
      })
      .Case([&](XorOp) {
        return "static_cast<uint8_t>(!" + a[0] + " != !" + a[1] + ")";
      })
      .Case([&](CompareOp c) {
        StringRef symbol;
        switch (c.getPredicate()) {
        case ComparePredicate::eq:
          symbol = "==";
          break;
        case ComparePredicate::ne:
          symbol = "!=";
          break;
        case ComparePredicate::lt:
          symbol = "<";
          break;
        case ComparePredicate::le:
          symbol = "<=";
          break;
        case ComparePredicate::gt:
          symbol = ">";
          break;
        case ComparePredicate::ge:
          symbol = ">=";
          break;
        }
        return "static_cast<uint8_t>(" + a[0] + " " + symbol.str() + " " +
               a[1] + ")";
      })
      .Case([&](SelectOp) {
        return "(" + a[0] + " ? " + a[1] + " : " + a[2] + ")";
      })
      .Default([](Operation *) { return std::nullopt; });
}

std::string CppEmitter::kernel(const std::string &text) {
  auto [it, inserted] = kernelNames.try_emplace(
      text, "k" + std::to_string(kernelNames.size()));
  if (inserted)
    kernels += "static void " + it->second + text + "\n";
  return it->second;
}

/// The index into an input of shape `in` broadcast to `out` (numpy rules),
/// as an expression of the flat output index `i`. Adjacent dimensions that
/// are all kept or all broadcast are merged first, so the common cases are a
/// single modulo (a bias: `i % N`) or division (a column: `i / N`).
static std::string broadcastIndex(ArrayRef<int64_t> in, ArrayRef<int64_t> out) {
  size_t rank = out.size();
  SmallVector<int64_t> padded(rank - in.size(), 1);
  llvm::append_range(padded, in);
  // Groups of (size, kept) from the outermost dimension in.
  SmallVector<std::pair<int64_t, bool>> groups;
  for (size_t d = 0; d < rank; ++d) {
    if (out[d] == 1)
      continue;
    bool kept = padded[d] == out[d];
    if (!groups.empty() && groups.back().second == kept)
      groups.back().first *= out[d];
    else
      groups.push_back({out[d], kept});
  }
  std::string index;
  int64_t outStride = 1, inStride = 1;
  for (auto it = groups.rbegin(); it != groups.rend(); ++it) {
    auto [size, kept] = *it;
    if (kept) {
      std::string coord = outStride == 1 ? "i" : "i / " + std::to_string(outStride);
      if (it + 1 != groups.rend())
        coord = "(" + coord + ") % " + std::to_string(size);
      std::string term = inStride == 1 ? "(" + coord + ")"
                                       : "(" + coord + ") * " +
                                             std::to_string(inStride);
      index = index.empty() ? term : index + " + " + term;
      inStride *= size;
    }
    outStride *= size;
  }
  return index.empty() ? "0" : index;
}

LogicalResult CppEmitter::emitFusion(FusionOp fusion) {
  Block &body = fusion.getBody().front();
  ArrayRef<int64_t> shape =
      tensorTypeOf(fusion.getResult(0)).getShape();
  int64_t count = product(shape);
  auto load = [](Type type, const std::string &element) {
    if (type.isF16())
      return "pccrt::halfToFloat(" + element + ")";
    if (type.isBF16())
      return "pccrt::bf16ToFloat(" + element + ")";
    return element;
  };
  llvm::DenseMap<Value, std::string> expr;
  std::string code;
  unsigned temp = 0;
  for (BlockArgument arg : body.getArguments())
    if (tensorTypeOf(arg).getShape() == shape)
      expr[arg] = load(tensorTypeOf(arg).getElementType(),
                       "x" + std::to_string(arg.getArgNumber()) + "[i]");
  for (Operation &op : body.without_terminator()) {
    Value result = op.getResult(0);
    Type element = tensorTypeOf(result).getElementType();
    Type compute = computeTypeOf(element);
    if (auto b = dyn_cast<BroadcastOp>(op)) {
      auto arg = dyn_cast<BlockArgument>(b.getInput());
      if (!arg)
        return op.emitError("code generation: a fused broadcast must read a "
                            "fusion input");
      expr[result] =
          load(element, "x" + std::to_string(arg.getArgNumber()) + "[" +
                            broadcastIndex(tensorTypeOf(arg).getShape(), shape) +
                            "]");
      continue;
    }
    if (auto cst = dyn_cast<ConstantOp>(op)) {
      auto splat = dyn_cast<SplatElementsAttr>(cst.getValue());
      if (!splat)
        return op.emitError("code generation: fused constants must be splats");
      double v = isa<FloatType>(element)
                     ? splat.getSplatValue<APFloat>().convertToDouble()
                     : (element.isUnsignedInteger() || element.isInteger(1)
                            ? double(splat.getSplatValue<APInt>().getZExtValue())
                            : double(splat.getSplatValue<APInt>().getSExtValue()));
      expr[result] = literal(v, compute);
      continue;
    }
    SmallVector<std::string> args;
    for (Value operand : op.getOperands())
      args.push_back(expr.lookup(operand));
    auto e = scalarExpr(&op, args, compute);
    if (!e)
      return op.emitError("code generation: no CPU lowering for '")
             << op.getName() << "' in a fusion";
    std::string name = "t" + std::to_string(temp++);
    code += llvm::formatv("    const {0} {1} = {2};\n",
                          elementInfo(compute)->cType, name, *e)
                .str();
    expr[result] = name;
  }
  auto yield = cast<YieldOp>(body.getTerminator());
  for (auto [r, v] : llvm::enumerate(yield.getValues())) {
    Type element = tensorTypeOf(v).getElementType();
    std::string value = expr.lookup(v);
    if (element.isF16())
      value = "pccrt::floatToHalf(" + value + ")";
    else if (element.isBF16())
      value = "pccrt::floatToBf16(" + value + ")";
    code += llvm::formatv("    y{0}[i] = {1};\n", r, value).str();
  }
  std::string params;
  for (BlockArgument arg : body.getArguments())
    params += llvm::formatv("const {0} *__restrict x{1}, ",
                            elementInfo(tensorTypeOf(arg).getElementType())->cType,
                            arg.getArgNumber())
                  .str();
  for (auto [r, v] : llvm::enumerate(fusion.getResults()))
    params += llvm::formatv("{0}{1} *__restrict y{2}", r ? ", " : "",
                            elementInfo(tensorTypeOf(v).getElementType())->cType,
                            r)
                  .str();
  std::string name = kernel(llvm::formatv("({0}) {\n  for (int64_t i = 0; i < "
                                          "{1}; ++i) {\n{2}  }\n}\n",
                                          params, count, code)
                                .str());
  for (unsigned r = 0; r < fusion.getNumResults(); ++r)
    if (failed(defineResult(fusion, r)))
      return failure();
  std::string call = name + "(";
  for (Value v : fusion.getInputs())
    call += nameOf(v) + ", ";
  for (auto [r, v] : llvm::enumerate(fusion.getResults()))
    call += (r ? ", " : "") + nameOf(v);
  line(call + ");");
  return success();
}

LogicalResult CppEmitter::emitElementwise(Operation *op) {
  Type resultElement = tensorTypeOf(op->getResult(0)).getElementType();
  auto load = [](Type type, const std::string &element) {
    if (type.isF16())
      return "pccrt::halfToFloat(" + element + ")";
    if (type.isBF16())
      return "pccrt::bf16ToFloat(" + element + ")";
    return element;
  };
  SmallVector<std::string> args;
  for (auto [i, v] : llvm::enumerate(op->getOperands()))
    args.push_back(load(tensorTypeOf(v).getElementType(),
                        "x" + std::to_string(i) + "[i]"));
  auto expr = scalarExpr(op, args, computeTypeOf(resultElement));
  if (!expr)
    return op->emitError("code generation: no CPU lowering for '")
           << op->getName() << "'";
  if (resultElement.isF16())
    expr = "pccrt::floatToHalf(" + *expr + ")";
  else if (resultElement.isBF16())
    expr = "pccrt::floatToBf16(" + *expr + ")";
  int64_t count = tensorTypeOf(op->getResult(0)).getNumElements();
  std::string params;
  for (auto [i, v] : llvm::enumerate(op->getOperands()))
    params +=
        llvm::formatv("const {0} *__restrict x{1}, ",
                      elementInfo(tensorTypeOf(v).getElementType())->cType, i)
            .str();
  params += elementInfo(resultElement)->cType.str() + " *__restrict y";
  std::string text = llvm::formatv("({0}) {\n  for (int64_t i = 0; i < {1}; "
                                   "++i)\n    y[i] = {2};\n}\n",
                                   params, count, *expr)
                         .str();
  auto [it, inserted] =
      kernelNames.try_emplace(text, "k" + std::to_string(kernelNames.size()));
  if (inserted)
    kernels += "static void " + it->second + text + "\n";
  if (failed(defineResult(op, 0)))
    return failure();
  std::string call = it->second + "(";
  for (Value v : op->getOperands())
    call += nameOf(v) + ", ";
  line(call + nameOf(op->getResult(0)) + ");");
  return success();
}

//===----------------------------------------------------------------------===//
// Data movement
//===----------------------------------------------------------------------===//

LogicalResult CppEmitter::emitCopy(Value in, Value out, ArrayRef<int64_t> shape,
                                   ArrayRef<int64_t> inStrides,
                                   int64_t inOffset,
                                   ArrayRef<int64_t> outStrides,
                                   int64_t outOffset) {
  int64_t size = elementInfo(tensorTypeOf(in).getElementType())->size;
  line(llvm::formatv("{ static const int64_t s[] = {{{0}}, xs[] = {{{1}}, "
                     "ys[] = {{{2}};",
                     intList(shape), intList(inStrides), intList(outStrides))
           .str());
  line(llvm::formatv("  pcc_cpu_copy_strided({0}, {1}, {2}, {3}, s, xs, {4}, "
                     "ys, {5}); }",
                     nameOf(in), nameOf(out), size, shape.size(), inOffset,
                     outOffset)
           .str());
  return success();
}

LogicalResult CppEmitter::emitConstant(ConstantOp op) {
  auto type = op.getType();
  auto info = elementInfo(type.getElementType());
  if (!info || type.getElementType().isF16() || type.getElementType().isBF16())
    return op.emitError("code generation: unsupported constant type ") << type;
  auto attr = dyn_cast<DenseElementsAttr>(op.getValue());
  if (!attr)
    return op.emitError("code generation: constants must be dense");
  std::string name = "c" + std::to_string(nextValue);
  std::string values;
  int64_t n = 0;
  auto append = [&](const std::string &v) {
    values += (n++ ? (n % 8 == 1 ? ",\n    " : ", ") : "") + v;
  };
  if (isa<FloatType>(type.getElementType())) {
    for (APFloat v : attr.getValues<APFloat>())
      append(literal(v.convertToDouble(), type.getElementType()));
  } else {
    bool isUnsigned = type.getElementType().isUnsignedInteger() ||
                      type.getElementType().isInteger(1);
    for (APInt v : attr.getValues<APInt>())
      append(literal(isUnsigned ? double(v.getZExtValue())
                                : double(v.getSExtValue()),
                     type.getElementType()));
  }
  if (n == 0)
    append("0");
  constants += llvm::formatv("alignas(64) static const {0} {1}[] = {{\n    "
                             "{2}};\n",
                             info->cType, name, values)
                   .str();
  return define(op.getResult(), info->cType, name, /*isConst=*/true);
}

//===----------------------------------------------------------------------===//
// All ops
//===----------------------------------------------------------------------===//

LogicalResult CppEmitter::emitOp(Operation *op) {
  if (isa<NegOp, AbsOp, SqrtOp, ReciprocalOp, ExpOp, LogOp, ErfOp, TanhOp,
          SigmoidOp, ReluOp, FloorOp, CeilOp, SinOp, CosOp, NotOp, GeluOp,
          LeakyReluOp, ClampOp, AddOp, SubOp, MulOp, DivOp, PowOp, MaxOp, MinOp,
          AndOp, OrOp, XorOp, CompareOp, SelectOp>(op))
    return emitElementwise(op);

  if (auto fusion = dyn_cast<FusionOp>(op))
    return emitFusion(fusion);
  if (auto param = dyn_cast<ParamOp>(op)) {
    auto info = elementInfo(param.getType().getElementType());
    if (!info)
      return op->emitError("code generation: unsupported weight type ")
             << param.getType();
    auto [it, inserted] =
        weightIndex.try_emplace(param.getName(), weights.size());
    if (inserted)
      weights.emplace_back(param.getName().str(), param.getType());
    return define(param.getResult(), info->cType,
                  llvm::formatv("static_cast<const {0} *>(w[{1}])", info->cType,
                                it->second)
                      .str(),
                  /*isConst=*/true);
  }
  if (auto cst = dyn_cast<ConstantOp>(op))
    return emitConstant(cst);
  if (auto reshape = dyn_cast<ReshapeOp>(op)) {
    names[reshape.getResult()] = nameOf(reshape.getInput());
    return success();
  }

  // Every other op writes its results into the arena.
  for (unsigned i = 0; i < op->getNumResults(); ++i)
    if (failed(defineResult(op, i)))
      return failure();

  if (auto cast = dyn_cast<CastOp>(op)) {
    auto from = elementInfo(cast.getInput().getType().getElementType());
    auto to = elementInfo(cast.getType().getElementType());
    line(llvm::formatv("pcc_cpu_cast({0}, {1}, {2}, {3}, {4});",
                       nameOf(cast.getInput()), from->code,
                       nameOf(cast.getResult()), to->code,
                       cast.getType().getNumElements())
             .str());
    return success();
  }
  if (auto b = dyn_cast<BroadcastOp>(op)) {
    ArrayRef<int64_t> in = b.getInput().getType().getShape();
    ArrayRef<int64_t> out = b.getType().getShape();
    SmallVector<int64_t> inStrides = stridesOf(in), xs(out.size(), 0);
    int64_t shift = out.size() - in.size();
    for (size_t d = 0; d < in.size(); ++d)
      xs[d + shift] = in[d] == 1 ? 0 : inStrides[d];
    return emitCopy(b.getInput(), b.getResult(), out, xs, 0, stridesOf(out), 0);
  }
  if (auto t = dyn_cast<TransposeOp>(op)) {
    SmallVector<int64_t> inStrides =
        stridesOf(t.getInput().getType().getShape());
    SmallVector<int64_t> xs;
    for (int64_t p : t.getPermutation())
      xs.push_back(inStrides[p]);
    ArrayRef<int64_t> out = t.getType().getShape();
    return emitCopy(t.getInput(), t.getResult(), out, xs, 0, stridesOf(out), 0);
  }
  if (auto s = dyn_cast<SliceOp>(op)) {
    SmallVector<int64_t> inStrides =
        stridesOf(s.getInput().getType().getShape());
    SmallVector<int64_t> xs;
    int64_t offset = 0;
    for (size_t d = 0; d < inStrides.size(); ++d) {
      xs.push_back(inStrides[d] * s.getSteps()[d]);
      offset += s.getStarts()[d] * inStrides[d];
    }
    ArrayRef<int64_t> out = s.getType().getShape();
    return emitCopy(s.getInput(), s.getResult(), out, xs, offset,
                    stridesOf(out), 0);
  }
  if (auto c = dyn_cast<ConcatOp>(op)) {
    ArrayRef<int64_t> out = c.getType().getShape();
    SmallVector<int64_t> outStrides = stridesOf(out);
    int64_t axis = static_cast<int64_t>(c.getAxis()), at = 0;
    for (Value in : c.getInputs()) {
      ArrayRef<int64_t> shape = tensorTypeOf(in).getShape();
      if (failed(emitCopy(in, c.getResult(), shape, stridesOf(shape), 0,
                          outStrides, at * outStrides[axis])))
        return failure();
      at += shape[axis];
    }
    return success();
  }
  if (auto s = dyn_cast<SplitOp>(op)) {
    SmallVector<int64_t> inStrides =
        stridesOf(s.getInput().getType().getShape());
    int64_t axis = static_cast<int64_t>(s.getAxis()), at = 0;
    for (Value r : s.getResults()) {
      ArrayRef<int64_t> shape = tensorTypeOf(r).getShape();
      if (failed(emitCopy(s.getInput(), r, shape, inStrides,
                          at * inStrides[axis], stridesOf(shape), 0)))
        return failure();
      at += shape[axis];
    }
    return success();
  }
  if (auto g = dyn_cast<GatherOp>(op)) {
    ArrayRef<int64_t> data = g.getData().getType().getShape();
    int64_t axis = static_cast<int64_t>(g.getAxis());
    line(llvm::formatv(
             "if (pcc_cpu_gather({0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}, {8}))",
             nameOf(g.getData()), nameOf(g.getIndices()), nameOf(g.getResult()),
             elementInfo(g.getData().getType().getElementType())->size,
             product(data.take_front(axis)), data[axis],
             product(data.drop_front(axis + 1)),
             g.getIndices().getType().getNumElements(),
             g.getIndices().getType().getElementType().isInteger(64) ? 1 : 0)
             .str());
    line("  return fail(" + quoted(describeOp(op)) + ");");
    return success();
  }
  if (auto mm = dyn_cast<MatmulOp>(op)) {
    if (failed(requireF32(op, mm.getLhs())))
      return failure();
    auto lhs = mm.getLhs().getType(), rhs = mm.getRhs().getType();
    auto out = mm.getType();
    int64_t r = out.getRank();
    int64_t m = out.getDimSize(r - 2), n = out.getDimSize(r - 1);
    int64_t k = mm.getTransposeA() ? lhs.getDimSize(lhs.getRank() - 2)
                                   : lhs.getDimSize(lhs.getRank() - 1);
    int64_t batch = product(out.getShape().drop_back(2));
    line(llvm::formatv("pcc_cpu_matmul_f32({0}, {1}, {2}, {3}, {4}, {5}, {6}, "
                       "{7}, {8}, {9}, {10});",
                       nameOf(mm.getLhs()), nameOf(mm.getRhs()),
                       nameOf(mm.getResult()), batch, m, n, k,
                       mm.getTransposeA() ? 1 : 0, mm.getTransposeB() ? 1 : 0,
                       m * k, rhs.getRank() == 2 ? 0 : k * n)
             .str());
    return success();
  }
  if (isa<SoftmaxOp, LogSoftmaxOp>(op)) {
    if (failed(requireF32(op, op->getOperand(0))))
      return failure();
    auto shape = tensorTypeOf(op->getResult(0)).getShape();
    int64_t axis =
        static_cast<int64_t>(cast<IntegerAttr>(op->getAttr("axis")).getInt());
    line(llvm::formatv("pcc_cpu_softmax_f32({0}, {1}, {2}, {3}, {4}, {5});",
                       nameOf(op->getOperand(0)), nameOf(op->getResult(0)),
                       product(shape.take_front(axis)), shape[axis],
                       product(shape.drop_front(axis + 1)),
                       isa<LogSoftmaxOp>(op) ? 1 : 0)
             .str());
    return success();
  }
  if (auto ln = dyn_cast<LayerNormOp>(op)) {
    if (failed(requireF32(op, ln.getInput())))
      return failure();
    auto shape = ln.getType().getShape();
    int64_t axis = static_cast<int64_t>(ln.getAxis());
    line(llvm::formatv("pcc_cpu_layer_norm_f32({0}, {1}, {2}, {3}, {4}, {5}, "
                       "{6});",
                       nameOf(ln.getInput()), nameOf(ln.getScale()),
                       ln.getBias() ? nameOf(ln.getBias()) : "nullptr",
                       nameOf(ln.getResult()), product(shape.take_front(axis)),
                       product(shape.drop_front(axis)),
                       literal(ln.getEpsilon().convertToDouble(),
                               ln.getType().getElementType()))
             .str());
    return success();
  }
  if (auto bn = dyn_cast<BatchNormOp>(op)) {
    if (failed(requireF32(op, bn.getInput())))
      return failure();
    auto shape = bn.getType().getShape();
    line(llvm::formatv("pcc_cpu_batch_norm_f32({0}, {1}, {2}, {3}, {4}, {5}, "
                       "{6}, {7}, {8}, {9});",
                       nameOf(bn.getInput()), nameOf(bn.getScale()),
                       nameOf(bn.getBias()), nameOf(bn.getMean()),
                       nameOf(bn.getVariance()), nameOf(bn.getResult()),
                       shape[0], shape[1], product(shape.drop_front(2)),
                       literal(bn.getEpsilon().convertToDouble(),
                               bn.getType().getElementType()))
             .str());
    return success();
  }
  if (isa<ReduceSumOp, ReduceMeanOp, ReduceMaxOp, ReduceMinOp, ReduceProdOp>(
          op)) {
    Value in = op->getOperand(0);
    auto inType = tensorTypeOf(in);
    Type e = inType.getElementType();
    if (!e.isF32() && !e.isInteger(64))
      return op->emitError("code generation: the CPU back end reduces f32 "
                           "and i64 tensors, got ")
             << e;
    int kind = isa<ReduceSumOp>(op)    ? 0
               : isa<ReduceMeanOp>(op) ? 1
               : isa<ReduceMaxOp>(op)  ? 2
               : isa<ReduceMinOp>(op)  ? 3
                                       : 4;
    SmallVector<int64_t> reduced(inType.getRank(), 0);
    for (int64_t a : cast<DenseI64ArrayAttr>(op->getAttr("axes")).asArrayRef())
      reduced[a] = 1;
    line(llvm::formatv("{ static const int64_t s[] = {{{0}}, r[] = {{{1}};",
                       intList(inType.getShape()), intList(reduced))
             .str());
    line(llvm::formatv("  pcc_cpu_reduce_{0}({1}, {2}, {3}, s, r, {4}); }",
                       e.isF32() ? "f32" : "i64", nameOf(in),
                       nameOf(op->getResult(0)), inType.getRank(), kind)
             .str());
    return success();
  }
  if (auto am = dyn_cast<ArgMaxOp>(op)) {
    if (failed(requireF32(op, am.getInput())))
      return failure();
    auto shape = am.getInput().getType().getShape();
    int64_t axis = static_cast<int64_t>(am.getAxis());
    line(llvm::formatv("pcc_cpu_argmax_f32({0}, {1}, {2}, {3}, {4});",
                       nameOf(am.getInput()), nameOf(am.getResult()),
                       product(shape.take_front(axis)), shape[axis],
                       product(shape.drop_front(axis + 1)))
             .str());
    return success();
  }
  if (auto conv = dyn_cast<ConvOp>(op)) {
    if (failed(requireF32(op, conv.getInput())))
      return failure();
    auto in = conv.getInput().getType();
    line(llvm::formatv(
             "{ static const int64_t in[] = {{{0}}, w[] = {{{1}}, out[] = "
             "{{{2}}, st[] = {{{3}}, pd[] = {{{4}}, dl[] = {{{5}};",
             intList(in.getShape()),
             intList(conv.getWeight().getType().getShape()),
             intList(conv.getType().getShape()), intList(conv.getStrides()),
             intList(conv.getPads()), intList(conv.getDilations()))
             .str());
    line(llvm::formatv("  pcc_cpu_conv_f32({0}, {1}, {2}, {3}, {4}, in, w, "
                       "out, st, pd, dl, {5}); }",
                       nameOf(conv.getInput()), nameOf(conv.getWeight()),
                       conv.getBias() ? nameOf(conv.getBias()) : "nullptr",
                       nameOf(conv.getResult()), in.getRank() - 2,
                       conv.getGroups())
             .str());
    return success();
  }
  if (isa<MaxPoolOp, AvgPoolOp>(op)) {
    Type e = tensorTypeOf(op->getOperand(0)).getElementType();
    StringRef suffix = e.isF32()                ? "f32"
                       : e.isUnsignedInteger(8) ? "u8"
                       : e.isSignlessInteger(8) ? "i8"
                                                : "";
    if (suffix.empty() || (isa<AvgPoolOp>(op) && suffix != "f32"))
      return op->emitError("code generation: ")
             << op->getName() << " on " << e
             << " is not supported by the CPU back end";
    auto in = tensorTypeOf(op->getOperand(0));
    auto attr = [&](StringRef name) {
      return intList(cast<DenseI64ArrayAttr>(op->getAttr(name)).asArrayRef());
    };
    line(llvm::formatv("{ static const int64_t in[] = {{{0}}, out[] = {{{1}}, "
                       "k[] = {{{2}}, st[] = {{{3}}, pd[] = {{{4}}, dl[] = "
                       "{{{5}};",
                       intList(in.getShape()),
                       intList(tensorTypeOf(op->getResult(0)).getShape()),
                       attr("kernel_shape"), attr("strides"), attr("pads"),
                       attr("dilations"))
             .str());
    if (auto avg = dyn_cast<AvgPoolOp>(op))
      line(llvm::formatv("  pcc_cpu_avg_pool_f32({0}, {1}, {2}, in, out, k, "
                         "st, pd, dl, {3}); }",
                         nameOf(avg.getInput()), nameOf(avg.getResult()),
                         in.getRank() - 2, avg.getCountIncludePad() ? 1 : 0)
               .str());
    else
      line(llvm::formatv("  pcc_cpu_max_pool_{0}({1}, {2}, {3}, in, out, k, "
                         "st, pd, dl); }",
                         suffix, nameOf(op->getOperand(0)),
                         nameOf(op->getResult(0)), in.getRank() - 2)
               .str());
    return success();
  }
  return op->emitError("code generation: no CPU lowering for '")
         << op->getName() << "'";
}

//===----------------------------------------------------------------------===//
// The translation unit
//===----------------------------------------------------------------------===//

std::string specArray(StringRef name,
                      ArrayRef<std::pair<std::string, RankedTensorType>> specs,
                      std::string &shapes) {
  std::string s = "static const pcc_tensor_spec " + name.str() + "[] = {\n";
  for (auto [i, spec] : llvm::enumerate(specs)) {
    std::string shapeName = (name + "_shape" + llvm::Twine(i)).str();
    shapes += "static const int64_t " + shapeName + "[] = {" +
              intList(spec.second.getShape()) + "};\n";
    s += llvm::formatv("    {{{0}, {1}, {2}, {3}},\n", quoted(spec.first),
                       elementInfo(spec.second.getElementType())->code,
                       spec.second.getRank(), shapeName)
             .str();
  }
  if (specs.empty())
    s += "    {nullptr, 0, 0, nullptr},\n";
  return s + "};\n";
}

LogicalResult CppEmitter::emit(llvm::raw_ostream &os) {
  auto arenaAttr = func->getAttrOfType<IntegerAttr>("pcc.arena_bytes");
  if (!arenaAttr)
    return func.emitError("code generation: @main has no pcc.arena_bytes; "
                          "run pcc-plan-memory first");
  Block &block = func.getBody().front();
  for (BlockArgument arg : block.getArguments()) {
    auto info = elementInfo(tensorTypeOf(arg).getElementType());
    if (!info)
      return func.emitError("code generation: unsupported input type ")
             << arg.getType();
    if (failed(define(arg, info->cType,
                      llvm::formatv("static_cast<const {0} *>(in[{1}])",
                                    info->cType, arg.getArgNumber())
                          .str(),
                      /*isConst=*/true)))
      return failure();
  }
  for (Operation &op : block.without_terminator())
    if (failed(emitOp(&op)))
      return failure();
  auto ret = cast<func::ReturnOp>(block.getTerminator());
  for (auto [i, v] : llvm::enumerate(ret.getOperands())) {
    auto type = tensorTypeOf(v);
    line(llvm::formatv("std::memcpy(out[{0}], {1}, {2});", i, nameOf(v),
                       type.getNumElements() *
                           elementInfo(type.getElementType())->size)
             .str());
  }

  auto nameAttr = [&](DictionaryAttr attrs, unsigned i) {
    auto name = attrs ? attrs.getAs<StringAttr>("pcc.name") : StringAttr();
    return name ? name.str() : "value" + std::to_string(i);
  };
  std::vector<std::pair<std::string, RankedTensorType>> inputs, outputs;
  for (BlockArgument arg : block.getArguments())
    inputs.emplace_back(
        nameAttr(func.getArgAttrDict(arg.getArgNumber()), arg.getArgNumber()),
        tensorTypeOf(arg));
  for (auto [i, v] : llvm::enumerate(ret.getOperands()))
    outputs.emplace_back(nameAttr(func.getResultAttrDict(i), i),
                         tensorTypeOf(v));

  std::string shapes;
  std::string specs = specArray("kInputs", inputs, shapes) +
                      specArray("kOutputs", outputs, shapes) +
                      specArray("kWeights", weights, shapes);

  os << "// Generated by pcc from " << options.source
     << ". Do not edit.\n"
        "#include \"pcc/runtime/CpuKernels.h\"\n"
        "#include \"pcc/runtime/HalfFloat.h\"\n"
        "#include \"pcc/runtime/ModelAbi.h\"\n\n"
        "#include <algorithm>\n#include <cmath>\n#include <cstdint>\n"
        "#include <cstring>\n#include <limits>\n#include <string>\n\n"
        "namespace {\n\n"
     << "thread_local std::string lastError;\n\n"
     << "int fail(const char *where) {\n"
        "  lastError = std::string(where) + \": \" + pcc_cpu_last_error();\n"
        "  return 1;\n}\n\n"
     << constants << "\n"
     << kernels << shapes << specs << "\n"
     << "const pcc_model_info kInfo = {PCC_MODEL_ABI_VERSION, \"cpu\", "
     << quoted(options.source) << ", " << quoted(options.weightsFile) << ", "
     << inputs.size() << ", kInputs, " << outputs.size() << ", kOutputs, "
     << weights.size() << ", kWeights, " << arenaAttr.getInt() << "};\n\n"
     << "} // namespace\n\n"
     << "extern \"C\" {\n\n"
     << "const pcc_model_info *pcc_model_get_info(void) { return &kInfo; }\n\n"
     << "const char *pcc_model_last_error(void) { return lastError.c_str(); "
        "}\n\n"
     << "int pcc_model_run(const void *const *in, void *const *out,\n"
        "                  const void *const *w, void *arena_) {\n"
        "  (void)in; (void)w;\n"
        "  char *arena = static_cast<char *>(arena_);\n"
        "  (void)arena;\n"
     << body << "  return 0;\n}\n\n} // extern \"C\"\n";
  return success();
}

} // namespace

std::vector<std::pair<std::string, RankedTensorType>>
mlir::pcc::getWeightOrder(ModuleOp module) {
  std::vector<std::pair<std::string, RankedTensorType>> order;
  llvm::StringSet<> seen;
  module.walk([&](ParamOp param) {
    if (seen.insert(param.getName()).second)
      order.emplace_back(param.getName().str(), param.getType());
  });
  return order;
}

LogicalResult mlir::pcc::emitCpp(ModuleOp module, llvm::raw_ostream &os,
                                 const CppEmitOptions &options) {
  auto func = module.lookupSymbol<func::FuncOp>("main");
  if (!func || !func.getBody().hasOneBlock())
    return module.emitError("code generation: expects a single-block "
                            "func.func @main");
  CppEmitter emitter(func, options);
  return emitter.emit(os);
}
