//===- ElementwiseEmitter.cpp - elementwise ops as generated loops --------===//
//
// Each elementwise op, and each fusion of them, becomes one static loop
// kernel (a grid-stride `__global__` kernel on CUDA), deduplicated by its
// text so that identical kernels (every layer's GELU, say) are emitted
// once. Long CPU loops are split over the OpenMP threads.
//
//===----------------------------------------------------------------------===//

#include "CppEmitter.h"

#include "llvm/ADT/TypeSwitch.h"

#include <limits>

using namespace mlir;
using namespace mlir::pcc;

namespace mlir::pcc::cpp {

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
      .Case([&](PowOp pow) -> std::string {
        // A constant exponent of 2 or 3 multiplies, as PyTorch's
        // pow(tensor, scalar) does (the exporters' tanh GELU cubes with
        // Pow): std::pow is a call per element that does not vectorise,
        // 10 ns an element here.
        auto cst = pow.getRhs().getDefiningOp<ConstantOp>();
        auto splat = cst ? dyn_cast<SplatElementsAttr>(cst.getValue())
                         : SplatElementsAttr();
        if (isFloat && splat && isa<FloatType>(splat.getElementType())) {
          double e = splat.getSplatValue<APFloat>().convertToDouble();
          if (e == 2)
            return "(" + a[0] + " * " + a[0] + ")";
          if (e == 3)
            return "(" + a[0] + " * " + a[0] + " * " + a[0] + ")";
        }
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
  // A kernel whose ops select (select, relu, max, integer division, ...)
  // is built without GCC's loop if-conversion, which once turned a select
  // of a load into masked loads that dropped elements (g++ 12.2 at -O3 for
  // x86-64-v3; test/Fuzz/Inputs/plans/recompute-relu-first-stage). Every
  // other kernel keeps it: the selects inside fastExp, fastTanh and fastErf
  // vectorise only with it (the GPT's tanh GELU ran 6x slower without).
  StringRef prefix = cuda ? "__global__ void "
                     : StringRef(text).contains(" ? ")
                         ? "PCC_SELECT_KERNEL void "
                         : "PCC_KERNEL void ";
  if (inserted)
    kernels += prefix.str() + it->second + text + "\n";
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
  // Values held in a float that are bf16 exactly (bf16 inputs, rounded
  // results): casting one to bf16 again is the value itself, and storing
  // one takes its upper half.
  llvm::DenseSet<Value> exactBf16;
  for (BlockArgument arg : body.getArguments())
    if (tensorTypeOf(arg).getElementType().isBF16())
      exactBf16.insert(arg);
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
      if (element.isBF16())
        exactBf16.insert(result);
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
    if (auto cast = dyn_cast<CastOp>(op)) {
      // A float cast (pcc-fuse-elementwise fuses no other): the value is
      // held in f32, rounded as the narrower type when it narrows.
      std::string in = expr.lookup(cast.getInput());
      if (element.isBF16())
        exactBf16.insert(result);
      expr[result] = element.isBF16() ? (exactBf16.contains(cast.getInput())
                                             ? in
                                             : "pccrt::roundToBf16(" + in + ")")
                     : element.isF16()
                         ? "pccrt::halfToFloat(pccrt::floatToHalf(" + in + "))"
                     : element.isF32() ? "static_cast<float>(" + in + ")"
                                       : "static_cast<double>(" + in + ")";
      continue;
    }
    SmallVector<std::string> args;
    for (Value operand : op.getOperands())
      args.push_back(expr.lookup(operand));
    auto e = scalarExpr(&op, args, compute);
    if (!e)
      return op.emitError("code generation: no lowering for '")
             << op.getName() << "' in a fusion";
    // A 16-bit float result is rounded where the op computes it, as an
    // unfused op (and PyTorch's op by op) would store it.
    if (element.isBF16()) {
      e = "pccrt::roundToBf16(" + *e + ")";
      exactBf16.insert(result);
    } else if (element.isF16())
      e = "pccrt::halfToFloat(pccrt::floatToHalf(" + *e + "))";
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
      value = (exactBf16.contains(v) ? "pccrt::exactBf16("
                                     : "pccrt::floatToBf16(") +
              value + ")";
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


} // namespace mlir::pcc::cpp
