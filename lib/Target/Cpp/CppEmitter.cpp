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

#include "FunctionEmitter.h"
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
#include <limits>

using namespace mlir;
using namespace mlir::pcc;
using namespace mlir::pcc::cpp;

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
  // What a pass named it ("the gradient of 'fc1.weight'").
  if (auto name = dyn_cast<NameLoc>(op->getLoc()))
    return name.getName().str() + " (" + op->getName().getStringRef().str() +
           ")";
  return op->getName().getStringRef().str();
}

//===----------------------------------------------------------------------===//
// The emitter
//===----------------------------------------------------------------------===//

class CppEmitter {
public:
  CppEmitter(func::FuncOp func, bool cuda, const llvm::StringMap<int> &meshAxes)
      : func(func), cuda(cuda), meshAxes(meshAxes) {}

  /// Emits `run_cpu` or `run_cuda` with the kernels and constants it uses.
  FailureOr<TargetCode> emit();

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
  /// The loop header of an elementwise kernel over `count` elements: a plain
  /// loop on the CPU, a grid-stride loop on the GPU.
  std::string loop(int64_t count) const;
  std::string parallelFor(int64_t count) const;
  /// Calls (CPU) or launches (CUDA) an elementwise kernel.
  void launch(const std::string &kernelName, int64_t count,
              const std::string &args);
  LogicalResult emitCopy(Value in, Value out, ArrayRef<int64_t> shape,
                         ArrayRef<int64_t> inStrides, int64_t inOffset,
                         ArrayRef<int64_t> outStrides, int64_t outOffset);
  LogicalResult emitCopy(Value in, Value out, ArrayRef<int64_t> shape,
                         ArrayRef<int64_t> inStrides,
                         const std::string &inOffset,
                         ArrayRef<int64_t> outStrides, int64_t outOffset);
  LogicalResult emitConstant(ConstantOp op);
  LogicalResult emitCollective(Operation *op);
  /// Gradient, loss and optimizer ops (pcc-autodiff, pcc-loss,
  /// pcc-optimizer).
  LogicalResult emitTraining(Operation *op);
  /// A call of a runtime kernel that can fail on data: on the CPU its
  /// status is checked at once; on CUDA the kernel records `site` and the
  /// run's end reports `message`.
  void checkedCall(StringRef kernel, const std::string &args,
                   const std::string &message, Operation *op);
  /// Sets `bytes` bytes at `ptr` to zero.
  void zeroFill(const std::string &ptr, int64_t bytes);
  void copyBytes(const std::string &to, const std::string &from, int64_t bytes);
  /// `rc->comms[i]` for mesh axis `axis`.
  std::string comm(StringRef axis) const {
    return "rc->comms[" + std::to_string(meshAxes.lookup(axis)) + "]";
  }
  std::optional<std::string>
  scalarExpr(Operation *op, ArrayRef<std::string> args, Type computeType);
  LogicalResult requireF32(Operation *op, Value v);

  void line(const llvm::Twine &text) { body += "  " + text.str() + "\n"; }
  /// `std::exp` on the CPU, the CUDA math library's `exp` on the GPU.
  std::string math(StringRef fn) const {
    return (cuda ? "" : "std::") + fn.str();
  }
  /// exp, tanh and erf in f32 on the CPU use pccrt's vectorisable forms
  /// (runtime/include/pcc/runtime/FastMath.h); elsewhere `math(fn)`.
  std::string transcendental(StringRef fn, Type computeType) const {
    if (cuda || !computeType.isF32())
      return math(fn);
    if (fn == "exp")
      return "pccrt::fastExp";
    if (fn == "tanh")
      return "pccrt::fastTanh";
    return "pccrt::fastErf";
  }
  /// The start of a call to runtime kernel `name` of this target.
  std::string call(StringRef name) const {
    return cuda ? ("pcc_cuda_" + name + "(ctx, ").str()
                : ("pcc_cpu_" + name + "(").str();
  }
  /// Grid size of a grid-stride loop over `count` elements.
  static int64_t gridFor(int64_t count) {
    return std::clamp<int64_t>((count + 255) / 256, 1, 65535 * 8);
  }

  func::FuncOp func;
  bool cuda;
  /// Messages of the CUDA calls that can fail on data, by site number - 1.
  std::vector<std::string> sites;
  llvm::DenseMap<Value, std::string> names;
  unsigned nextValue = 0;
  /// Results the function returns that its ops write straight into the
  /// caller's output array (the first place each is returned), so that no
  /// copy follows: out[k] for result value v.
  llvm::DenseMap<Value, unsigned> returnedAt;
  llvm::DenseSet<Value> writtenInPlace;
  std::string constants, kernels, body;
  llvm::StringMap<std::string> kernelNames; // kernel text -> name
  std::vector<std::pair<std::string, RankedTensorType>> weights;
  std::vector<std::string> weightShards;
  std::vector<std::vector<int64_t>> weightWholes;
  llvm::StringMap<unsigned> weightIndex; // name and shard -> index
  const llvm::StringMap<int> &meshAxes;  // mesh axis -> index
  /// Whether the run context's hyperparameters have been checked.
  bool hyperChecked = false;
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
  // A returned result is computed where the caller wants it.
  if (auto it = returnedAt.find(result); it != returnedAt.end()) {
    writtenInPlace.insert(result);
    return define(result, info->cType,
                  llvm::formatv("static_cast<{0} *>(out[{1}])", info->cType,
                                it->second)
                      .str(),
                  /*isConst=*/false);
  }
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
         << " is not supported by the " << (cuda ? "CUDA" : "CPU")
         << " back end (f32 only)";
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
        return isFloat ? math("fabs") + "(" + a[0] + ")"
                       : "(" + a[0] + " < 0 ? -" + a[0] + " : " + a[0] + ")";
      })
      .Case([&](SqrtOp) { return math("sqrt") + "(" + a[0] + ")"; })
      .Case([&](ReciprocalOp) { return one() + " / " + a[0]; })
      .Case([&](ExpOp) { return transcendental("exp", t) + "(" + a[0] + ")"; })
      .Case([&](LogOp) { return math("log") + "(" + a[0] + ")"; })
      .Case([&](ErfOp) { return transcendental("erf", t) + "(" + a[0] + ")"; })
      .Case(
          [&](TanhOp) { return transcendental("tanh", t) + "(" + a[0] + ")"; })
      .Case([&](SigmoidOp) {
        return one() + " / (" + one() + " + " + transcendental("exp", t) +
               "(-" + a[0] + "))";
      })
      .Case([&](ReluOp) {
        return "(" + a[0] + " > " + zero() + " ? " + a[0] + " : " + zero() +
               ")";
      })
      .Case([&](FloorOp) { return math("floor") + "(" + a[0] + ")"; })
      .Case([&](CeilOp) { return math("ceil") + "(" + a[0] + ")"; })
      .Case([&](SinOp) { return math("sin") + "(" + a[0] + ")"; })
      .Case([&](CosOp) { return math("cos") + "(" + a[0] + ")"; })
      .Case([&](NotOp) { return "static_cast<uint8_t>(!" + a[0] + ")"; })
      .Case([&](GeluOp g) -> std::string {
        if (g.getTanhApproximation())
          return "(" + literal(0.5, t) + " * " + a[0] + " * (" + one() + " + " +
                 transcendental("tanh", t) + "(" +
                 literal(0.7978845608028654, t) + " * (" + a[0] + " + " +
                 literal(0.044715, t) + " * " + a[0] + " * " + a[0] + " * " +
                 a[0] + "))))";
        return "(" + literal(0.5, t) + " * " + a[0] + " * (" + one() + " + " +
               transcendental("erf", t) + "(" + a[0] + " * " +
               literal(0.7071067811865476, t) + ")))";
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
          return math("pow") + "(" + a[0] + ", " + a[1] + ")";
        return "static_cast<" + T + ">(" + math("pow") +
               "(static_cast<double>(" + a[0] + "), static_cast<double>(" +
               a[1] + ")))";
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
      .Case([&](IsNaNOp) {
        return "static_cast<uint8_t>(" + a[0] + " != " + a[0] + ")";
      })
      .Case([&](IsInfOp i) -> std::string {
        double inf = std::numeric_limits<double>::infinity();
        std::string pos = "(" + a[0] + " == " + literal(inf, in) + ")",
                    neg = "(" + a[0] + " == " + literal(-inf, in) + ")";
        if (i.getDetectPositive() && i.getDetectNegative())
          return "static_cast<uint8_t>(" + pos + " || " + neg + ")";
        if (i.getDetectPositive())
          return "static_cast<uint8_t>" + pos;
        if (i.getDetectNegative())
          return "static_cast<uint8_t>" + neg;
        return "static_cast<uint8_t>(0)";
      })
      .Case([&](ModOp m) -> std::string {
        if (isFloat) {
          std::string r = math("fmod") + "(" + a[0] + ", " + a[1] + ")";
          if (m.getFmod())
            return r;
          // The divisor's sign: shift a remainder of the other sign.
          return "([&] { " + T + " r = " + r + "; return (r != " + zero() +
                 " && ((r < " + zero() + ") != (" + a[1] + " < " + zero() +
                 "))) ? r + " + a[1] + " : r; }())";
        }
        // A zero divisor gives 0; so does -1 (INT_MIN % -1 traps).
        std::string r = "((" + a[1] + " == 0 || " + a[1] + " == -1) ? " +
                        zero() + " : static_cast<" + T + ">(" + a[0] + " % " +
                        a[1] + "))";
        if (m.getFmod())
          return r;
        return "([&] { " + T + " r = " + r + "; return (r != " + zero() +
               " && ((r < " + zero() + ") != (" + a[1] + " < " + zero() +
               "))) ? static_cast<" + T + ">(r + " + a[1] + ") : r; }())";
      })
      .Default([](Operation *) { return std::nullopt; });
}

std::string CppEmitter::kernel(const std::string &text) {
  auto [it, inserted] = kernelNames.try_emplace(
      text, (cuda ? "g" : "k") + std::to_string(kernelNames.size()));
  if (inserted)
    kernels += (cuda ? "__global__ void " : "PCC_KERNEL void ") + it->second +
               text + "\n";
  return it->second;
}

std::string CppEmitter::loop(int64_t count) const {
  if (cuda)
    return llvm::formatv("for (int64_t i = blockIdx.x * int64_t(blockDim.x) + "
                         "threadIdx.x; i < {0}; i += int64_t(gridDim.x) * "
                         "blockDim.x)",
                         count)
        .str();
  return parallelFor(count) +
         llvm::formatv("for (int64_t i = 0; i < {0}; ++i)", count).str();
}

/// Every generated CPU loop computes each element on its own, so a long one
/// is split over the OpenMP threads the runtime and OpenBLAS share (the
/// same values, in any split); short ones stay serial, under the cost of
/// waking the team.
std::string CppEmitter::parallelFor(int64_t count) const {
  constexpr int64_t kParallelElements = 32768;
  if (cuda || count < kParallelElements)
    return "";
  return "_Pragma(\"omp parallel for schedule(static)\") ";
}

void CppEmitter::launch(const std::string &kernelName, int64_t count,
                        const std::string &args) {
  if (count == 0)
    return;
  if (cuda)
    line(llvm::formatv("{0}<<<{1}, 256, 0, stream>>>({2});", kernelName,
                       gridFor(count), args)
             .str());
  else
    line(kernelName + "(" + args + ");");
}

/// The index into an input of shape `in` broadcast to `out` (numpy rules),
/// as an expression of the flat output index `i`. Adjacent dimensions that
/// are all kept or all broadcast are merged first, so the common cases are a
/// single modulo (a bias: `i % N`) or division (a column: `i / N`).
static std::string broadcastIndex(ArrayRef<int64_t> in, ArrayRef<int64_t> out,
                                  StringRef var = "i") {
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
      std::string coord = outStride == 1
                              ? var.str()
                              : var.str() + " / " + std::to_string(outStride);
      if (it + 1 != groups.rend())
        coord = "(" + coord + ") % " + std::to_string(size);
      std::string term = inStride == 1
                             ? "(" + coord + ")"
                             : "(" + coord + ") * " + std::to_string(inStride);
      index = index.empty() ? term : index + " + " + term;
      inStride *= size;
    }
    outStride *= size;
  }
  return index.empty() ? "0" : index;
}

/// An element read as its compute type: half-precision floats widen to f32.
static std::string load(Type type, const std::string &element) {
  if (type.isF16())
    return "pccrt::halfToFloat(" + element + ")";
  if (type.isBF16())
    return "pccrt::bf16ToFloat(" + element + ")";
  return element;
}

LogicalResult CppEmitter::emitFusion(FusionOp fusion) {
  Block &body = fusion.getBody().front();
  ArrayRef<int64_t> shape = tensorTypeOf(fusion.getResult(0)).getShape();
  int64_t count = product(shape);
  // On the CPU, a fusion that broadcasts runs as two loops, the inner one
  // over the last dimension: an input broadcast along the leading
  // dimensions is then read contiguously (x[j]) and one broadcast along the
  // last dimension is a scalar per row, both of which vectorise, unlike
  // per-element index arithmetic.
  bool broadcasts = llvm::any_of(
      body.getOperations(), [](Operation &op) { return isa<BroadcastOp>(op); });
  bool nested = !cuda && broadcasts && shape.size() >= 2 && shape.back() > 1;
  int64_t inner = nested ? shape.back() : count;
  auto inputIndex = [&](ArrayRef<int64_t> in) -> std::string {
    if (!nested)
      return broadcastIndex(in, shape);
    SmallVector<int64_t> padded(shape.size() - in.size(), 1);
    llvm::append_range(padded, in);
    std::string lead = broadcastIndex(ArrayRef<int64_t>(padded).drop_back(),
                                      shape.drop_back(), "o");
    if (padded.back() != inner)
      return lead;
    return lead == "0" ? "j"
                       : "(" + lead + ") * " + std::to_string(inner) + " + j";
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
                            inputIndex(tensorTypeOf(arg).getShape()) + "]");
      continue;
    }
    if (auto cst = dyn_cast<ConstantOp>(op)) {
      auto splat = dyn_cast<SplatElementsAttr>(cst.getValue());
      if (!splat)
        return op.emitError("code generation: fused constants must be splats");
      double v =
          isa<FloatType>(element)
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
      return op.emitError("code generation: no lowering for '")
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
    params +=
        llvm::formatv("const {0} *__restrict x{1}, ",
                      elementInfo(tensorTypeOf(arg).getElementType())->cType,
                      arg.getArgNumber())
            .str();
  for (auto [r, v] : llvm::enumerate(fusion.getResults()))
    params +=
        llvm::formatv("{0}{1} *__restrict y{2}", r ? ", " : "",
                      elementInfo(tensorTypeOf(v).getElementType())->cType, r)
            .str();
  std::string header =
      nested ? parallelFor(count) +
                   llvm::formatv("for (int64_t o = 0; o < {0}; ++o)\n  for "
                                 "(int64_t j = 0; j < {1}; ++j) {\n    const "
                                 "int64_t i = o * {1} + j;",
                                 count / inner, inner)
                       .str()
             : loop(count) + " {";
  std::string name = kernel(
      llvm::formatv("({0}) {\n  {1}\n{2}  }\n}\n", params, header, code).str());
  for (unsigned r = 0; r < fusion.getNumResults(); ++r)
    if (failed(defineResult(fusion, r)))
      return failure();
  std::string args;
  for (Value v : fusion.getInputs())
    args += nameOf(v) + ", ";
  for (auto [r, v] : llvm::enumerate(fusion.getResults()))
    args += (r ? ", " : "") + nameOf(v);
  launch(name, count, args);
  return success();
}

LogicalResult CppEmitter::emitElementwise(Operation *op) {
  Type resultElement = tensorTypeOf(op->getResult(0)).getElementType();
  SmallVector<std::string> args;
  for (auto [i, v] : llvm::enumerate(op->getOperands()))
    args.push_back(load(tensorTypeOf(v).getElementType(),
                        "x" + std::to_string(i) + "[i]"));
  auto expr = scalarExpr(op, args, computeTypeOf(resultElement));
  if (!expr)
    return op->emitError("code generation: no lowering for '")
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
  std::string name =
      kernel(llvm::formatv("({0}) {\n  {1}\n    y[i] = {2};\n}\n", params,
                           loop(count), *expr)
                 .str());
  if (failed(defineResult(op, 0)))
    return failure();
  std::string callArgs;
  for (Value v : op->getOperands())
    callArgs += nameOf(v) + ", ";
  launch(name, count, callArgs + nameOf(op->getResult(0)));
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
  return emitCopy(in, out, shape, inStrides, std::to_string(inOffset),
                  outStrides, outOffset);
}

LogicalResult CppEmitter::emitCopy(Value in, Value out, ArrayRef<int64_t> shape,
                                   ArrayRef<int64_t> inStrides,
                                   const std::string &inOffset,
                                   ArrayRef<int64_t> outStrides,
                                   int64_t outOffset) {
  int64_t size = elementInfo(tensorTypeOf(in).getElementType())->size;
  line(llvm::formatv("{ static const int64_t s[] = {{{0}}, xs[] = {{{1}}, "
                     "ys[] = {{{2}};",
                     intList(shape), intList(inStrides), intList(outStrides))
           .str());
  line(llvm::formatv("  {6}{0}, {1}, {2}, {3}, s, xs, {4}, ys, {5}); }",
                     nameOf(in), nameOf(out), size, shape.size(), inOffset,
                     outOffset, call("copy_strided"))
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
  std::string name = (cuda ? "gc" : "c") + std::to_string(nextValue);
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
  if (cuda) {
    // Device globals, initialised when the module loads.
    constants += llvm::formatv("__device__ {0} {1}[] = {{\n    {2}};\n",
                               info->cType, name, values)
                     .str();
    return define(op.getResult(), info->cType,
                  llvm::formatv("static_cast<const {0} *>(symbolAddress({1}))",
                                info->cType, name)
                      .str(),
                  /*isConst=*/true);
  }
  constants += llvm::formatv("alignas(64) static const {0} {1}[] = {{\n    "
                             "{2}};\n",
                             info->cType, name, values)
                   .str();
  return define(op.getResult(), info->cType, name, /*isConst=*/true);
}

//===----------------------------------------------------------------------===//
// All ops
//===----------------------------------------------------------------------===//

//===----------------------------------------------------------------------===//
// Collectives: calls through the run context's pcc_comm of the mesh axis
//===----------------------------------------------------------------------===//

LogicalResult CppEmitter::emitCollective(Operation *op) {
  if (auto slice = dyn_cast<ShardSliceOp>(op)) {
    // [pre, stripes, n, chunk, post] -> this rank's [pre, stripes, chunk, post]
    ArrayRef<int64_t> in = slice.getInput().getType().getShape();
    int64_t d = slice.getDim(), s = slice.getStripes();
    int64_t n = in[d] / slice.getType().getDimSize(d);
    int64_t c = in[d] / (s * n);
    int64_t pre = product(in.take_front(d)),
            post = product(in.drop_front(d + 1));
    SmallVector<int64_t> shape{pre, s, c, post};
    SmallVector<int64_t> xs{in[d] * post, n * c * post, post, 1};
    std::string offset = "static_cast<int64_t>(" + comm(slice.getAxis()) +
                         ".rank) * " + std::to_string(c * post);
    return emitCopy(slice.getInput(), slice.getResult(), shape, xs, offset,
                    stridesOf(shape), 0);
  }
  Value in = op->getOperand(0), out = op->getResult(0);
  auto axis = op->getAttrOfType<StringAttr>("axis").getValue();
  auto info = elementInfo(tensorTypeOf(in).getElementType());
  std::string fn;
  int64_t count = 0;
  if (isa<AllReduceOp>(op)) {
    fn = "all_reduce";
    count = tensorTypeOf(in).getNumElements();
  } else if (isa<AllGatherOp>(op)) {
    fn = "all_gather";
    count = tensorTypeOf(in).getNumElements();
  } else {
    fn = "reduce_scatter";
    count = tensorTypeOf(out).getNumElements();
  }
  line("{ const pcc_comm &c = " + comm(axis) + ";");
  line("  if (c.set_label) c.set_label(c.group, " + quoted(describeOp(op)) +
       ");");
  line(llvm::formatv("  if (c.{0}(c.group, {1}, {2}, {3}, {4}))", fn,
                     nameOf(in), nameOf(out), count, info->code)
           .str());
  line("    return fail(" + quoted(describeOp(op)) +
       ", c.last_error(c.group)); }");
  return success();
}

void CppEmitter::checkedCall(StringRef kernel, const std::string &args,
                             const std::string &message, Operation *op) {
  if (cuda) {
    sites.push_back(describeOp(op) + ": " + message);
    line(call(kernel) + args + ", " + std::to_string(sites.size()) + ");");
    return;
  }
  line("if (" + call(kernel) + args + "))");
  line("  return fail(" + quoted(describeOp(op)) + ", pcc_cpu_last_error());");
}

void CppEmitter::zeroFill(const std::string &ptr, int64_t bytes) {
  if (bytes == 0)
    return;
  if (cuda)
    line(llvm::formatv("cudaMemsetAsync({0}, 0, {1}, stream);", ptr, bytes)
             .str());
  else
    line(llvm::formatv("std::memset({0}, 0, {1});", ptr, bytes).str());
}

void CppEmitter::copyBytes(const std::string &to, const std::string &from,
                           int64_t bytes) {
  if (bytes == 0)
    return;
  if (cuda)
    line(llvm::formatv("cudaMemcpyAsync({0}, {1}, {2}, "
                       "cudaMemcpyDeviceToDevice, stream);",
                       to, from, bytes)
             .str());
  else
    line(llvm::formatv("std::memcpy({0}, {1}, {2});", to, from, bytes).str());
}

LogicalResult CppEmitter::emitTraining(Operation *op) {
  auto isI64 = [](Value v) {
    return tensorTypeOf(v).getElementType().isInteger(64) ? 1 : 0;
  };
  if (auto pad = dyn_cast<PadOp>(op)) {
    // Zeros, then the input copied to strided positions of the result.
    auto out = pad.getType();
    auto in = pad.getInput().getType();
    int64_t size = elementInfo(out.getElementType())->size;
    zeroFill(nameOf(pad.getResult()), out.getNumElements() * size);
    if (in.getNumElements() == 0)
      return success();
    SmallVector<int64_t> outStrides = stridesOf(out.getShape()), strides;
    int64_t offset = 0;
    for (int64_t d = 0; d < in.getRank(); ++d) {
      strides.push_back(outStrides[d] * pad.getSteps()[d]);
      offset += pad.getStarts()[d] * outStrides[d];
    }
    return emitCopy(pad.getInput(), pad.getResult(), in.getShape(),
                    stridesOf(in.getShape()), 0, strides, offset);
  }
  if (failed(requireF32(op, op->getOperand(0))))
    return failure();
  if (auto sa = dyn_cast<ScatterAddOp>(op)) {
    ArrayRef<int64_t> shape = sa.getType().getShape();
    int64_t axis = static_cast<int64_t>(sa.getAxis());
    auto indices = sa.getIndices().getType();
    std::string args = llvm::formatv(
        "{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}", nameOf(sa.getUpdates()),
        nameOf(sa.getIndices()), nameOf(sa.getResult()),
        product(shape.take_front(axis)), shape[axis],
        product(shape.drop_front(axis + 1)), indices.getNumElements(),
        isI64(sa.getIndices()));
    checkedCall("scatter_add_f32", args,
                llvm::formatv("an index is outside [-{0}, {0})", shape[axis]),
                op);
    return success();
  }
  if (isa<CrossEntropyOp, CrossEntropyGradOp>(op)) {
    auto logits = tensorTypeOf(op->getOperand(0));
    Value labels = op->getOperand(1);
    int64_t ignore = op->getAttrOfType<IntegerAttr>("ignore_index").getInt();
    std::string message =
        llvm::formatv("a label is outside [0, {0}) and is not the ignored {1}",
                      logits.getDimSize(1), ignore);
    std::string grad =
        isa<CrossEntropyGradOp>(op) ? nameOf(op->getOperand(2)) + ", " : "";
    std::string args = llvm::formatv(
        "{0}, {1}, {2}{3}, {4}, {5}, {6}LL, {7}", nameOf(op->getOperand(0)),
        nameOf(labels), grad, nameOf(op->getResult(0)), logits.getDimSize(0),
        logits.getDimSize(1), ignore, isI64(labels));
    checkedCall(isa<CrossEntropyOp>(op) ? "cross_entropy_f32"
                                        : "cross_entropy_grad_f32",
                args, message, op);
    return success();
  }
  auto state = tensorTypeOf(op->getOperand(0));
  int64_t count = state.getNumElements();
  if (auto acc = dyn_cast<AccumulateOp>(op)) {
    std::string name = kernel(
        llvm::formatv("(float *__restrict y, const float *__restrict x) {\n"
                      "  {0}\n    y[i] += x[i];\n}\n",
                      loop(count))
            .str());
    launch(name, count, nameOf(acc.getState()) + ", " + nameOf(acc.getValue()));
    return success();
  }
  if (auto assign = dyn_cast<AssignOp>(op)) {
    copyBytes(nameOf(assign.getState()), nameOf(assign.getValue()), count * 4);
    return success();
  }
  if (auto zero = dyn_cast<ZeroOp>(op)) {
    zeroFill(nameOf(zero.getState()), count * 4);
    return success();
  }
  if (auto ema = dyn_cast<EmaUpdateOp>(op)) {
    line(llvm::formatv("{0}{1}, {2}, {3}, {4}, {5});", call("ema_update_f32"),
                       nameOf(ema.getState()), nameOf(ema.getValue()), count,
                       literal(ema.getMomentum().convertToDouble(),
                               Float64Type::get(op->getContext())),
                       literal(ema.getScale().convertToDouble(),
                               Float64Type::get(op->getContext())))
             .str());
    return success();
  }
  // Dropout and the optimizer updates read the hyperparameters from the
  // run context, checked once per function.
  if (!hyperChecked) {
    line("if (!rc->hyper)");
    line("  return fail(" + quoted(describeOp(op)) +
         ", \"a training step needs the run's hyperparameters "
         "(pcc_run_context.hyper)\");");
    hyperChecked = true;
  }
  if (auto dropout = dyn_cast<DropoutOp>(op)) {
    line(llvm::formatv("{0}{1}, {2}, {3}, {4}, {5}LL, rc->hyper);",
                       call("dropout_f32"), nameOf(dropout.getInput()),
                       nameOf(dropout.getResult()), count,
                       literal(dropout.getRatio().convertToDouble(),
                               Float64Type::get(op->getContext())),
                       dropout.getStream())
             .str());
    return success();
  }
  if (auto sgd = dyn_cast<SgdUpdateOp>(op)) {
    line(llvm::formatv("{0}{1}, {2}, {3}, {4}, rc->hyper, {5});", call("sgd_f32"),
                       nameOf(sgd.getParam()), nameOf(sgd.getGrad()),
                       nameOf(sgd.getMomentumBuffer()), count,
                       nameOf(sgd.getNorm()))
             .str());
    return success();
  }
  auto adamw = cast<AdamwUpdateOp>(op);
  line(llvm::formatv("{0}{1}, {2}, {3}, {4}, {5}, rc->hyper, {6});",
                     call("adamw_f32"), nameOf(adamw.getParam()),
                     nameOf(adamw.getGrad()), nameOf(adamw.getExpAvg()),
                     nameOf(adamw.getExpAvgSq()), count,
                     nameOf(adamw.getNorm()))
           .str());
  return success();
}

LogicalResult CppEmitter::emitOp(Operation *op) {
  if (isa<NegOp, AbsOp, SqrtOp, ReciprocalOp, ExpOp, LogOp, ErfOp, TanhOp,
          SigmoidOp, ReluOp, FloorOp, CeilOp, SinOp, CosOp, NotOp, GeluOp,
          LeakyReluOp, ClampOp, AddOp, SubOp, MulOp, DivOp, PowOp, MaxOp, MinOp,
          AndOp, OrOp, XorOp, CompareOp, SelectOp, IsNaNOp, IsInfOp, ModOp>(
          op))
    return emitElementwise(op);

  if (auto fusion = dyn_cast<FusionOp>(op))
    return emitFusion(fusion);
  if (auto param = dyn_cast<ParamOp>(op)) {
    auto info = elementInfo(param.getType().getElementType());
    if (!info)
      return op->emitError("code generation: unsupported weight type ")
             << param.getType();
    ShardingAttr shard = param.getShardAttr(), within = param.getWithinAttr();
    // A flat (ZeRO) shard is dim -1; its whole shape is the op's `of`, and
    // `within` the split of that whole it is a flat shard of.
    auto triple = [&](ShardingAttr s) {
      return s ? llvm::formatv("{0}, {1}, {2}", meshAxes.lookup(s.getAxis()),
                               s.getDim(), s.getStripes())
                     .str()
               : std::string("-1, 0, 0");
    };
    std::string shardInit = "{" + triple(shard) + ", " + triple(within) + "}";
    std::vector<int64_t> whole(param.getType().getShape());
    if (shard && shard.isFlat())
      whole.assign(param.getWhole()->begin(), param.getWhole()->end());
    else if (shard)
      whole[shard.getDim()] *= *getMeshAxisSize(param, shard.getAxis());
    auto [it, inserted] = weightIndex.try_emplace(
        (param.getName() + "|" + shardInit).str(), weights.size());
    if (inserted) {
      weights.emplace_back(param.getName().str(), param.getType());
      weightShards.push_back(shardInit);
      weightWholes.push_back(std::move(whole));
    }
    // Model state is mutable (training updates it in place); inference
    // code only reads it.
    return define(param.getResult(), info->cType,
                  llvm::formatv("static_cast<{0} *>(w[{1}])", info->cType,
                                it->second)
                      .str(),
                  /*isConst=*/false);
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

  if (isa<AllReduceOp, AllGatherOp, ReduceScatterOp, ShardSliceOp>(op))
    return emitCollective(op);
  if (auto start = dyn_cast<BucketStartOp>(op)) {
    // Earlier micro-batches only accumulate into the bucket.
    auto type = tensorTypeOf(start.getBucket());
    line("if (rc->hyper && rc->hyper[PCC_HYPER_LAST_MICROBATCH] != 0) {");
    line("  const pcc_comm &c = " + comm(start.getAxis()) + ";");
    line("  if (c.set_label) c.set_label(c.group, " +
         quoted(describeOp(op)) + ");");
    line(llvm::formatv("  if (c.all_reduce_start(c.group, {0}, {1}, {2}))",
                       nameOf(start.getBucket()), type.getNumElements(),
                       elementInfo(type.getElementType())->code)
             .str());
    line("    return fail(" + quoted(describeOp(op)) +
         ", c.last_error(c.group));");
    line("}");
    return success();
  }
  if (auto wait = dyn_cast<BucketWaitOp>(op)) {
    line("{ const pcc_comm &c = " + comm(wait.getAxis()) + ";");
    line("  if (c.set_label) c.set_label(c.group, \"the gradient buckets\");");
    line("  if (c.wait_all(c.group)) return fail(" + quoted(describeOp(op)) +
         ", c.last_error(c.group)); }");
    return success();
  }
  if (isa<ScatterAddOp, PadOp, CrossEntropyOp, CrossEntropyGradOp,
          AccumulateOp, AssignOp, ZeroOp, EmaUpdateOp, DropoutOp, SgdUpdateOp,
          AdamwUpdateOp>(op))
    return emitTraining(op);
  if (auto cast = dyn_cast<CastOp>(op)) {
    auto from = elementInfo(cast.getInput().getType().getElementType());
    auto to = elementInfo(cast.getType().getElementType());
    line(llvm::formatv("{5}{0}, {1}, {2}, {3}, {4});", nameOf(cast.getInput()),
                       from->code, nameOf(cast.getResult()), to->code,
                       cast.getType().getNumElements(), call("cast"))
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
  if (isa<GatherOp, ShardGatherOp>(op)) {
    // A shard_gather reads this rank's block of the gathered dimension.
    Value data = op->getOperand(0), indices = op->getOperand(1);
    ArrayRef<int64_t> shape = tensorTypeOf(data).getShape();
    int64_t axis = op->getAttrOfType<IntegerAttr>("axis").getInt();
    int64_t block = shape[axis], total = block;
    std::string start = "0";
    if (auto sg = dyn_cast<ShardGatherOp>(op)) {
      FailureOr<int64_t> ranks = getMeshAxisSize(op, sg.getMeshAxis());
      if (failed(ranks))
        return failure();
      total = block * *ranks;
      start = "static_cast<int64_t>(" + comm(sg.getMeshAxis()) + ".rank) * " +
              std::to_string(block);
    }
    auto indexType = tensorTypeOf(indices);
    std::string args = llvm::formatv(
        "{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}, {8}, {9}, {10}", nameOf(data),
        nameOf(indices), nameOf(op->getResult(0)),
        elementInfo(tensorTypeOf(data).getElementType())->size,
        product(shape.take_front(axis)), block, start, total,
        product(shape.drop_front(axis + 1)), indexType.getNumElements(),
        indexType.getElementType().isInteger(64) ? 1 : 0);
    if (cuda) {
      // Checked when the run finishes (see pcc_cuda_finish).
      sites.push_back(llvm::formatv("{0}: an index is outside [-{1}, {1})",
                                    describeOp(op), total)
                          .str());
      line(call("gather_block") + args + ", " + std::to_string(sites.size()) +
           ");");
      return success();
    }
    line("if (" + call("gather_block") + args + "))");
    line("  return fail(" + quoted(describeOp(op)) +
         ", pcc_cpu_last_error());");
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
    line(llvm::formatv("{11}{0}, {1}, {2}, {3}, {4}, {5}, {6}, "
                       "{7}, {8}, {9}, {10});",
                       nameOf(mm.getLhs()), nameOf(mm.getRhs()),
                       nameOf(mm.getResult()), batch, m, n, k,
                       mm.getTransposeA() ? 1 : 0, mm.getTransposeB() ? 1 : 0,
                       m * k, rhs.getRank() == 2 ? 0 : k * n,
                       call("matmul_f32"))
             .str());
    return success();
  }
  if (isa<SoftmaxOp, LogSoftmaxOp>(op)) {
    if (failed(requireF32(op, op->getOperand(0))))
      return failure();
    auto shape = tensorTypeOf(op->getResult(0)).getShape();
    int64_t axis =
        static_cast<int64_t>(cast<IntegerAttr>(op->getAttr("axis")).getInt());
    line(llvm::formatv("{6}{0}, {1}, {2}, {3}, {4}, {5});",
                       nameOf(op->getOperand(0)), nameOf(op->getResult(0)),
                       product(shape.take_front(axis)), shape[axis],
                       product(shape.drop_front(axis + 1)),
                       // PCC_SOFTMAX_LOG | PCC_SOFTMAX_NAN_TO_ZERO
                       (isa<LogSoftmaxOp>(op) ? 1 : 0) |
                           (op->hasAttr("nan_to_zero") ? 2 : 0),
                       call("softmax_f32"))
             .str());
    return success();
  }
  if (auto ln = dyn_cast<LayerNormOp>(op)) {
    if (failed(requireF32(op, ln.getInput())))
      return failure();
    auto shape = ln.getType().getShape();
    int64_t axis = static_cast<int64_t>(ln.getAxis());
    line(llvm::formatv("{7}{0}, {1}, {2}, {3}, {4}, {5}, {6});",
                       nameOf(ln.getInput()), nameOf(ln.getScale()),
                       ln.getBias() ? nameOf(ln.getBias()) : "nullptr",
                       nameOf(ln.getResult()), product(shape.take_front(axis)),
                       product(shape.drop_front(axis)),
                       literal(ln.getEpsilon().convertToDouble(),
                               ln.getType().getElementType()),
                       call("layer_norm_f32"))
             .str());
    return success();
  }
  if (auto bn = dyn_cast<BatchNormOp>(op)) {
    if (failed(requireF32(op, bn.getInput())))
      return failure();
    auto shape = bn.getType().getShape();
    line(llvm::formatv("{10}{0}, {1}, {2}, {3}, {4}, {5}, "
                       "{6}, {7}, {8}, {9});",
                       nameOf(bn.getInput()), nameOf(bn.getScale()),
                       nameOf(bn.getBias()), nameOf(bn.getMean()),
                       nameOf(bn.getVariance()), nameOf(bn.getResult()),
                       shape[0], shape[1], product(shape.drop_front(2)),
                       literal(bn.getEpsilon().convertToDouble(),
                               bn.getType().getElementType()),
                       call("batch_norm_f32"))
             .str());
    return success();
  }
  if (isa<ReduceSumOp, ReduceMeanOp, ReduceMaxOp, ReduceMinOp, ReduceProdOp>(
          op)) {
    Value in = op->getOperand(0);
    auto inType = tensorTypeOf(in);
    Type e = inType.getElementType();
    if (!e.isF32() && !e.isInteger(64))
      return op->emitError("code generation: reductions take f32 and i64 "
                           "tensors, got ")
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
    line(llvm::formatv("  {0}{1}, {2}, {3}, s, r, {4}); }",
                       call(e.isF32() ? "reduce_f32" : "reduce_i64"),
                       nameOf(in), nameOf(op->getResult(0)), inType.getRank(),
                       kind)
             .str());
    return success();
  }
  if (auto am = dyn_cast<ArgMaxOp>(op)) {
    if (failed(requireF32(op, am.getInput())))
      return failure();
    auto shape = am.getInput().getType().getShape();
    int64_t axis = static_cast<int64_t>(am.getAxis());
    line(llvm::formatv("{5}{0}, {1}, {2}, {3}, {4});", nameOf(am.getInput()),
                       nameOf(am.getResult()), product(shape.take_front(axis)),
                       shape[axis], product(shape.drop_front(axis + 1)),
                       call("argmax_f32"))
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
    line(llvm::formatv("  {6}{0}, {1}, {2}, {3}, {4}, in, w, "
                       "out, st, pd, dl, {5}); }",
                       nameOf(conv.getInput()), nameOf(conv.getWeight()),
                       conv.getBias() ? nameOf(conv.getBias()) : "nullptr",
                       nameOf(conv.getResult()), in.getRank() - 2,
                       conv.getGroups(), call("conv_f32"))
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
             << op->getName() << " on " << e << " is not supported by the "
             << (cuda ? "CUDA" : "CPU") << " back end";
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
      line(llvm::formatv("  {4}{0}, {1}, {2}, in, out, k, "
                         "st, pd, dl, {3}); }",
                         nameOf(avg.getInput()), nameOf(avg.getResult()),
                         in.getRank() - 2, avg.getCountIncludePad() ? 1 : 0,
                         call("avg_pool_f32"))
               .str());
    else
      line(llvm::formatv("  {0}{1}, {2}, {3}, in, out, k, "
                         "st, pd, dl); }",
                         call(("max_pool_" + suffix).str()),
                         nameOf(op->getOperand(0)), nameOf(op->getResult(0)),
                         in.getRank() - 2)
               .str());
    return success();
  }
  if (isa<ConvGradInputOp, ConvGradWeightOp>(op)) {
    // (gradient, weight) -> input, or (input, gradient) -> weight; the
    // kernels take the convolution's three shapes.
    bool wantInput = isa<ConvGradInputOp>(op);
    if (failed(requireF32(op, op->getOperand(0))))
      return failure();
    auto in = tensorTypeOf(wantInput ? op->getResult(0) : op->getOperand(0));
    auto w = tensorTypeOf(wantInput ? op->getOperand(1) : op->getResult(0));
    auto out = tensorTypeOf(op->getOperand(wantInput ? 0 : 1));
    auto attr = [&](StringRef name) {
      return intList(cast<DenseI64ArrayAttr>(op->getAttr(name)).asArrayRef());
    };
    line(llvm::formatv(
             "{ static const int64_t in[] = {{{0}}, w[] = {{{1}}, out[] = "
             "{{{2}}, st[] = {{{3}}, pd[] = {{{4}}, dl[] = {{{5}};",
             intList(in.getShape()), intList(w.getShape()),
             intList(out.getShape()), attr("strides"), attr("pads"),
             attr("dilations"))
             .str());
    line(llvm::formatv("  {0}{1}, {2}, {3}, {4}, in, w, out, st, pd, dl, "
                       "{5}); }",
                       call(wantInput ? "conv_grad_input_f32"
                                      : "conv_grad_weight_f32"),
                       nameOf(op->getOperand(0)), nameOf(op->getOperand(1)),
                       nameOf(op->getResult(0)), in.getRank() - 2,
                       op->getAttrOfType<IntegerAttr>("groups").getInt())
             .str());
    return success();
  }
  if (isa<MaxPoolGradOp, AvgPoolGradOp>(op)) {
    bool isMax = isa<MaxPoolGradOp>(op);
    if (failed(requireF32(op, op->getOperand(0))))
      return failure();
    auto in = tensorTypeOf(op->getResult(0));
    auto out = tensorTypeOf(op->getOperand(isMax ? 1 : 0));
    auto attr = [&](StringRef name) {
      return intList(cast<DenseI64ArrayAttr>(op->getAttr(name)).asArrayRef());
    };
    line(llvm::formatv("{ static const int64_t in[] = {{{0}}, out[] = {{{1}}, "
                       "k[] = {{{2}}, st[] = {{{3}}, pd[] = {{{4}}, dl[] = "
                       "{{{5}};",
                       intList(in.getShape()), intList(out.getShape()),
                       attr("kernel_shape"), attr("strides"), attr("pads"),
                       attr("dilations"))
             .str());
    if (isMax)
      line(llvm::formatv("  {0}{1}, {2}, {3}, {4}, in, out, k, st, pd, dl); }",
                         call("max_pool_grad_f32"), nameOf(op->getOperand(0)),
                         nameOf(op->getOperand(1)), nameOf(op->getResult(0)),
                         in.getRank() - 2)
               .str());
    else
      line(llvm::formatv("  {0}{1}, {2}, {3}, in, out, k, st, pd, dl, {4}); }",
                         call("avg_pool_grad_f32"), nameOf(op->getOperand(0)),
                         nameOf(op->getResult(0)), in.getRank() - 2,
                         op->hasAttr("count_include_pad") ? 1 : 0)
               .str());
    return success();
  }
  return op->emitError("code generation: no lowering for '")
         << op->getName() << "'";
}

//===----------------------------------------------------------------------===//
// The translation unit
//===----------------------------------------------------------------------===//

FailureOr<TargetCode> CppEmitter::emit() {
  if (!func->getAttrOfType<IntegerAttr>("pcc.arena_bytes"))
    return func.emitError("code generation: @")
           << func.getSymName()
           << " has no pcc.arena_bytes; run pcc-plan-memory first";
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
  auto ret = cast<func::ReturnOp>(block.getTerminator());
  for (auto [i, v] : llvm::enumerate(ret.getOperands()))
    returnedAt.try_emplace(v, static_cast<unsigned>(i));
  // After a gradient bucket's all-reduce has started, each later op lets
  // it advance (MPI moves data only inside its calls).
  std::optional<std::string> started;
  for (Operation &op : block.without_terminator()) {
    if (failed(emitOp(&op)))
      return failure();
    if (auto start = dyn_cast<BucketStartOp>(op))
      started = comm(start.getAxis());
    else if (started && !isa<ParamOp, ReshapeOp, ConstantOp>(op))
      line("if (" + *started + ".progress) " + *started + ".progress(" +
           *started + ".group);");
  }
  for (auto [i, v] : llvm::enumerate(ret.getOperands())) {
    if (writtenInPlace.contains(v) && returnedAt.lookup(v) == i)
      continue;
    auto type = tensorTypeOf(v);
    int64_t bytes =
        type.getNumElements() * elementInfo(type.getElementType())->size;
    if (cuda)
      line(llvm::formatv("cudaMemcpyAsync(out[{0}], {1}, {2}, "
                         "cudaMemcpyDeviceToDevice, stream);",
                         i, nameOf(v), bytes)
               .str());
    else
      line(
          llvm::formatv("std::memcpy(out[{0}], {1}, {2});", i, nameOf(v), bytes)
              .str());
  }

  TargetCode code;
  code.constants = std::move(constants);
  code.kernels = std::move(kernels);
  code.weights = std::move(weights);
  code.weightShards = std::move(weightShards);
  code.weightWholes = std::move(weightWholes);
  std::string &fn = code.function;
  if (cuda) {
    fn += "const char *const kCudaSites[] = {\n";
    for (const std::string &site : sites)
      fn += "    " + quoted(site) + ",\n";
    fn += "    nullptr};\n\n";
    fn += "int run_cuda(const pcc_run_context *rc, pcc_cuda_context *ctx,\n"
          "             const void *const *in, void *const *out,\n"
          "             void *const *w, char *arena) {\n"
          "  (void)rc; (void)in; (void)w; (void)arena;\n"
          "  cudaStream_t stream = static_cast<cudaStream_t>("
          "pcc_cuda_stream(ctx));\n"
          "  (void)stream;\n";
    fn += body;
    fn += "  int status = pcc_cuda_finish(ctx);\n"
          "  if (status > 0)\n"
          "    return failWith(kCudaSites[status - 1]);\n"
          "  if (status < 0)\n"
          "    return fail(\"the CUDA backend\", pcc_cuda_last_error());\n"
          "  return 0;\n}\n\n";
  } else {
    fn += "int run_cpu(const pcc_run_context *rc, const void *const *in,\n"
          "            void *const *out, void *const *w, "
          "char *arena) {\n"
          "  (void)rc; (void)in; (void)w; (void)arena;\n";
    fn += body;
    fn += "  return 0;\n}\n\n";
  }
  return code;
}

} // namespace

namespace mlir::pcc::cpp {

RankedTensorType tensorTypeOf(Value v) {
  return cast<RankedTensorType>(v.getType());
}

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

FailureOr<TargetCode> emitFunction(func::FuncOp func, bool cuda,
                                   const llvm::StringMap<int> &meshAxes) {
  return CppEmitter(func, cuda, meshAxes).emit();
}

} // namespace mlir::pcc::cpp
