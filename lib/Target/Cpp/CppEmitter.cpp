//===- CppEmitter.cpp - planned pcc IR to C++ -----------------------------===//
//
// Every SSA value becomes a typed pointer: graph inputs and weights come from
// the caller's arrays, constants are static arrays, reshapes alias their
// input, and every other result points into the arena at the offset
// pcc-plan-memory chose (or, returned, into the caller's output). The
// elementwise kernels are ElementwiseEmitter.cpp's; the other ops call the
// runtime's kernels with static shapes (by family: MovementEmitter.cpp,
// ComputeEmitter.cpp, WindowEmitter.cpp; state and communication here).
//
//===----------------------------------------------------------------------===//

#include "CppEmitter.h"
#include "pcc/Dialect/Pcc/IR/Contracts.h"
#include "pcc/Dialect/Pcc/IR/Layout.h"
#include "pcc/Dialect/Pcc/IR/PccInterfaces.h"
#include "pcc/Target/Cpp.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/ADT/TypeSwitch.h"

#include <limits>

using namespace mlir;
using namespace mlir::pcc;
using namespace mlir::pcc::cpp;

namespace mlir::pcc::cpp {

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
  auto offsets = op->getAttrOfType<DenseI64ArrayAttr>(kBufferOffsetsAttrName);
  if (!offsets || offsets.size() != static_cast<int64_t>(op->getNumResults()))
    return op->emitError("code generation: the op has no buffer offsets; "
                         "run pcc-plan-memory first");
  int64_t offset = offsets[i];
  // A product assigned to a state is computed there (pcc-plan-memory,
  // planning for the CPU, gave it no buffer).
  if (Value state = intoState.lookup(result))
    return define(result, info->cType, nameOf(state), /*isConst=*/false);
  // A result its op skips (pcc-plan-memory gave it no buffer): null.
  if (offset == kNoBuffer)
    return define(result, info->cType, "nullptr", /*isConst=*/false);
  // A returned result is computed where the caller wants it.
  if (auto it = returnedAt.find(result); it != returnedAt.end()) {
    writtenInPlace.insert(result);
    return define(
        result, info->cType,
        llvm::formatv("static_cast<{0} *>(out[{1}])", info->cType, it->second)
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
  if (!info)
    return op.emitError("code generation: unsupported constant type ") << type;
  auto attr = dyn_cast<DenseElementsAttr>(op.getValue());
  if (!attr)
    return op.emitError("code generation: constants must be dense");
  std::string name = (cuda ? "gc" : "c") + std::to_string(nextValue);
  // A splat (the constants of an elementwise op that stayed unfused, a
  // tensor of zeros) is not written out element by element: GPT-2's GELU
  // constants at 128 x 3072 in a pipeline stage made a 309 MB library that
  // took minutes to compile. Zeros live in zero-initialised storage; any
  // other value is filled in once when the library loads.
  if (attr.isSplat() && attr.getNumElements() > 64) {
    std::string count = std::to_string(attr.getNumElements());
    std::string value;
    Type elem = type.getElementType();
    if (elem.isF16() || elem.isBF16())
      value =
          std::to_string(
              attr.getSplatValue<APFloat>().bitcastToAPInt().getZExtValue()) +
          "u";
    else if (isa<FloatType>(elem))
      value = literal(attr.getSplatValue<APFloat>().convertToDouble(), elem);
    else
      value = literal(elem.isUnsignedInteger() || elem.isInteger(1)
                          ? double(attr.getSplatValue<APInt>().getZExtValue())
                          : double(attr.getSplatValue<APInt>().getSExtValue()),
                      elem);
    bool zero = isa<FloatType>(elem) ? attr.getSplatValue<APFloat>().isPosZero()
                                     : attr.getSplatValue<APInt>().isZero();
    if (cuda && zero) {
      constants +=
          llvm::formatv("__device__ {0} {1}[{2}];\n", info->cType, name, count)
              .str();
      return define(
          op.getResult(), info->cType,
          llvm::formatv("static_cast<const {0} *>(symbolAddress({1}))",
                        info->cType, name)
              .str(),
          /*isConst=*/true);
    }
    if (!cuda) {
      constants += llvm::formatv("alignas(64) static {0} {1}[{2}];\n",
                                 info->cType, name, count)
                       .str();
      if (!zero)
        constants += llvm::formatv("static const bool {0}_filled = [] {{\n"
                                   "  for (int64_t i = 0; i < {1}; ++i)\n"
                                   "    {0}[i] = {2};\n"
                                   "  return true;\n}();\n",
                                   name, count, value)
                         .str();
      return define(op.getResult(), info->cType, name, /*isConst=*/true);
    }
  }
  std::string values;
  int64_t n = 0;
  auto append = [&](const std::string &v) {
    values += (n++ ? (n % 8 == 1 ? ",\n    " : ", ") : "") + v;
  };
  if (type.getElementType().isF16() || type.getElementType().isBF16()) {
    // Stored as their bits (uint16_t).
    for (APFloat v : attr.getValues<APFloat>())
      append(std::to_string(v.bitcastToAPInt().getZExtValue()) + "u");
  } else if (isa<FloatType>(type.getElementType())) {
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
  } else if (isa<AllGatherOp, AllGatherStartOp>(op)) {
    fn = isa<AllGatherStartOp>(op) ? "all_gather_start" : "all_gather";
    count = tensorTypeOf(in).getNumElements();
  } else {
    fn = isa<ReduceScatterStartOp>(op) ? "reduce_scatter_start"
                                       : "reduce_scatter";
    count = tensorTypeOf(out).getNumElements();
  }
  // A started collective's number on its group, for the wait that
  // completes it.
  bool started = isa<ReduceScatterStartOp, AllGatherStartOp>(op);
  if (started) {
    std::string ticket = "ticket" + std::to_string(tickets.size());
    tickets[out] = ticket;
    line("int64_t " + ticket + " = 0;");
  }
  line("{ const pcc_comm &c = " + comm(axis) + ";");
  line("  if (c.set_label) c.set_label(c.group, " + quoted(describeOp(op)) +
       ");");
  line(llvm::formatv("  if (c.{0}(c.group, {1}, {2}, {3}, {4}))", fn,
                     nameOf(in), nameOf(out), count, info->code)
           .str());
  line("    return fail(" + quoted(describeOp(op)) +
       ", c.last_error(c.group));");
  if (started)
    line("  " + tickets.lookup(out) + " = c.started(c.group);");
  line("}");
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

LogicalResult CppEmitter::blockOf(Operation *op, StringRef meshAxis,
                                  int64_t block, int64_t &total,
                                  std::string &start) {
  total = block;
  start = "0";
  if (meshAxis.empty())
    return success();
  FailureOr<int64_t> ranks = getMeshAxisSize(op, meshAxis);
  if (failed(ranks))
    return failure();
  total = block * *ranks;
  start = "static_cast<int64_t>(" + comm(meshAxis) + ".rank) * " +
          std::to_string(block);
  return success();
}

LogicalResult CppEmitter::emitScatterAdd(Operation *sa, const std::string &into,
                                         bool accumulate) {
  Value updates = sa->getOperand(0), indexValue = sa->getOperand(1);
  ArrayRef<int64_t> shape = tensorTypeOf(sa->getResult(0)).getShape();
  int64_t axis = sa->getAttrOfType<IntegerAttr>("axis").getInt();
  auto indices = tensorTypeOf(indexValue);
  int64_t block = shape[axis], total = block;
  std::string start;
  auto sharded = dyn_cast<ShardScatterAddOp>(sa);
  if (failed(blockOf(sa, sharded ? sharded.getMeshAxis() : "", block, total,
                     start)))
    return failure();
  std::string args = llvm::formatv(
      "{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}, {8}, {9}", nameOf(updates),
      nameOf(indexValue), into, product(shape.take_front(axis)), block, start,
      total, product(shape.drop_front(axis + 1)), indices.getNumElements(),
      indices.getElementType().isInteger(64) ? 1 : 0);
  checkedCall(
      accumulate ? "scatter_accumulate_block_f32" : "scatter_add_block_f32",
      args, llvm::formatv("an index is outside [-{0}, {0})", total), sa);
  return success();
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
  // State copies and zeroing move bytes of any type.
  if (isa<AssignOp, ZeroOp>(op)) {
    auto state = tensorTypeOf(op->getOperand(0));
    if (CastOp cast = castInto.lookup(op)) {
      // The cast writes the state itself.
      line(llvm::formatv(
               "{5}{0}, {1}, {2}, {3}, {4});", nameOf(cast.getInput()),
               elementInfo(cast.getInput().getType().getElementType())->code,
               nameOf(op->getOperand(0)),
               elementInfo(state.getElementType())->code,
               state.getNumElements(), call("cast"))
               .str());
      return success();
    }
    if (Operation *sa = scatterInto.lookup(op))
      return emitScatterAdd(sa, nameOf(op->getOperand(0)),
                            /*accumulate=*/false);
    if (auto assign = dyn_cast<AssignOp>(op))
      copyBytes(nameOf(assign.getState()), nameOf(assign.getValue()),
                getTensorBytes(state));
    else
      zeroFill(nameOf(op->getOperand(0)), getTensorBytes(state));
    return success();
  }
  if (auto squares = dyn_cast<SumSquaresOp>(op)) {
    Value x = squares.getInput();
    bool half = tensorTypeOf(x).getElementType().isBF16();
    if (cuda)
      return op->emitError("code generation: pcc.sum_squares is for the CPU "
                           "back end (pcc-bf16-gradients)");
    line(llvm::formatv("{0}{1}, {2}, {3});",
                       call(half ? "sum_squares_bf16" : "sum_squares_f32"),
                       nameOf(x), nameOf(squares.getResult()),
                       tensorTypeOf(x).getNumElements())
             .str());
    return success();
  }
  if (auto refresh = dyn_cast<RefreshCopyOp>(op)) {
    // Only when the run says the copies are stale (the optimizer's update
    // wrote them otherwise); always without hyperparameters.
    auto copy = tensorTypeOf(refresh.getCopy());
    line("if (!rc->hyper || rc->hyper[PCC_HYPER_REFRESH_COPIES] != 0)");
    line(llvm::formatv(
             "  {0}{1}, {2}, {3}, {4}, {5});", call("cast"),
             nameOf(refresh.getWeight()),
             elementInfo(refresh.getWeight().getType().getElementType())->code,
             nameOf(refresh.getCopy()),
             elementInfo(copy.getElementType())->code, copy.getNumElements())
             .str());
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
    // bf16 logits (widened by the kernels); a gradient f32 or bf16.
    bool half = logits.getElementType().isBF16();
    if (!half && failed(requireF32(op, op->getOperand(0))))
      return failure();
    std::string resultType;
    if (half && isa<CrossEntropyGradOp>(op))
      resultType = tensorTypeOf(op->getResult(0)).getElementType().isBF16()
                       ? ", 1"
                       : ", 0";
    std::string args = llvm::formatv(
        "{0}, {1}, {2}{3}{8}, {4}, {5}, {6}LL, {7}", nameOf(op->getOperand(0)),
        nameOf(labels), grad, nameOf(op->getResult(0)), logits.getDimSize(0),
        logits.getDimSize(1), ignore, isI64(labels), resultType);
    std::string kernel =
        isa<CrossEntropyOp>(op) ? "cross_entropy" : "cross_entropy_grad";
    checkedCall(kernel + (half ? "_bf16" : "_f32"), args, message, op);
    return success();
  }
  if (failed(requireF32(op, op->getOperand(0))))
    return failure();
  if (isa<ScatterAddOp, ShardScatterAddOp>(op))
    return emitScatterAdd(op, nameOf(op->getResult(0)), /*accumulate=*/false);
  auto state = tensorTypeOf(op->getOperand(0));
  int64_t count = state.getNumElements();
  if (Operation *sa = scatterInto.lookup(op))
    return emitScatterAdd(sa, nameOf(op->getOperand(0)), /*accumulate=*/true);
  if (auto acc = dyn_cast<AccumulateOp>(op); acc && widened.count(op)) {
    // A 16-bit gradient widened (exactly) as it is added.
    Value x = widened.lookup(op);
    bool bf16 = tensorTypeOf(x).getElementType().isBF16();
    std::string name = kernel(
        llvm::formatv("(float *__restrict y, const uint16_t *__restrict x) "
                      "{\n  {0}\n    y[i] += pccrt::{1}(x[i]);\n}\n",
                      loop(count), bf16 ? "bf16ToFloat" : "halfToFloat")
            .str());
    launch(name, count, nameOf(acc.getState()) + ", " + nameOf(x));
    return success();
  }
  if (auto acc = dyn_cast<AccumulateOp>(op)) {
    std::string name = kernel(
        llvm::formatv("(float *__restrict y, const float *__restrict x) {\n"
                      "  {0}\n    y[i] += x[i];\n}\n",
                      loop(count))
            .str());
    launch(name, count, nameOf(acc.getState()) + ", " + nameOf(acc.getValue()));
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
    line(llvm::formatv("{0}{1}, {2}, {3}, {4}, rc->hyper, {5});",
                       call("sgd_f32"), nameOf(sgd.getParam()),
                       nameOf(sgd.getGrad()), nameOf(sgd.getMomentumBuffer()),
                       count, nameOf(sgd.getNorm()))
             .str());
    return success();
  }
  auto adamw = cast<AdamwUpdateOp>(op);
  Value copy = adamw.getCopy();
  // A bf16 gradient (pcc-bf16-gradients, CPU only) is widened as it is read.
  bool halfGrad = tensorTypeOf(adamw.getGrad()).getElementType().isBF16();
  if (halfGrad && cuda)
    return op->emitError("code generation: the CUDA back end's AdamW reads "
                         "f32 gradients (pcc-bf16-gradients is for the CPU)");
  std::string copyArgs;
  if (copy && !cuda)
    copyArgs =
        ", " + nameOf(copy) + ", " +
        std::to_string(elementInfo(tensorTypeOf(copy).getElementType())->code);
  else if (halfGrad)
    copyArgs = ", nullptr, 0";
  StringRef kernel = halfGrad        ? "adamw_bf16_grad_f32"
                     : copy && !cuda ? "adamw_copy_f32"
                                     : "adamw_f32";
  line(llvm::formatv("{0}{1}, {2}, {3}, {4}, {5}, rc->hyper, {6}{7});",
                     call(kernel), nameOf(adamw.getParam()),
                     nameOf(adamw.getGrad()), nameOf(adamw.getExpAvg()),
                     nameOf(adamw.getExpAvgSq()), count,
                     nameOf(adamw.getNorm()), copyArgs)
           .str());
  // On CUDA the copy is a cast of its own after the update (a skipped
  // update left the weight, so its cast is the copy it was).
  if (copy && cuda)
    line(llvm::formatv("{0}{1}, {2}, {3}, {4}, {5});", call("cast"),
                       nameOf(adamw.getParam()),
                       elementInfo(Float32Type::get(op->getContext()))->code,
                       nameOf(copy),
                       elementInfo(tensorTypeOf(copy).getElementType())->code,
                       count)
             .str());
  return success();
}

namespace {
int64_t bytesOf(Value v);
} // namespace

bool CppEmitter::deferToUser(Operation *op) {
  if (cuda)
    return false;
  CpuDeferral deferral =
      getCpuDeferral(op, [&](Value v) { return returnedAt.count(v) != 0; });
  if (deferral == CpuDeferral::None || deferral == CpuDeferral::IntoState)
    return false;
  Operation *user = *op->getUsers().begin();
  switch (deferral) {
  case CpuDeferral::SumSquares:
    squares[user] = cast<MulOp>(op).getLhs();
    break;
  case CpuDeferral::ScatterInto:
    scatterInto[user] = op;
    break;
  case CpuDeferral::Widen:
    widened[user] = cast<CastOp>(op).getInput();
    break;
  default:
    castInto[user] = cast<CastOp>(op);
    break;
  }
  return true;
}

LogicalResult CppEmitter::emitOp(Operation *op) {
  if (isa<NegOp, AbsOp, SqrtOp, ReciprocalOp, ExpOp, LogOp, ErfOp, TanhOp,
          SigmoidOp, ReluOp, FloorOp, CeilOp, SinOp, CosOp, NotOp, GeluOp,
          LeakyReluOp, ClampOp, AddOp, SubOp, MulOp, DivOp, PowOp, MaxOp, MinOp,
          AndOp, OrOp, XorOp, CompareOp, SelectOp, IsNaNOp, IsInfOp, ModOp>(op))
    return emitElementwise(op);

  // Ops whose results are no arena buffer of their own: fusions (their
  // roots' results), weights, constants, views and waits (the started
  // collective's buffer).
  std::optional<LogicalResult> result =
      llvm::TypeSwitch<Operation *, std::optional<LogicalResult>>(op)
          .Case([&](FusionOp fusion) { return emitFusion(fusion); })
          .Case([&](ConstantOp cst) { return emitConstant(cst); })
          .Case([&](ReshapeOp reshape) {
            names[reshape.getResult()] = nameOf(reshape.getInput());
            return success();
          })
          .Case<ParamOp, WaitCollectivesOp>(
              [&](auto typed) { return emit(typed); })
          .Default([](Operation *) { return std::nullopt; });
  if (result)
    return *result;

  // Every other op writes its results into the arena.
  for (unsigned i = 0; i < op->getNumResults(); ++i)
    if (failed(defineResult(op, i)))
      return failure();
  return llvm::TypeSwitch<Operation *, LogicalResult>(op)
      .Case<AllReduceOp, AllGatherOp, ReduceScatterOp, ReduceScatterStartOp,
            AllGatherStartOp, ShardSliceOp>(
          [&](Operation *op) { return emitCollective(op); })
      .Case<ScatterAddOp, ShardScatterAddOp, PadOp, CrossEntropyOp,
            CrossEntropyGradOp, AccumulateOp, AssignOp, ZeroOp, EmaUpdateOp,
            DropoutOp, SgdUpdateOp, AdamwUpdateOp, RefreshCopyOp, SumSquaresOp>(
          [&](Operation *op) { return emitTraining(op); })
      .Case<BucketStartOp, BucketWaitOp, CastOp, BroadcastOp, TransposeOp,
            SliceOp, ConcatOp, SplitOp, MatmulOp, LayerNormOp, BatchNormOp,
            ArgMaxOp, ConvOp>([&](auto typed) { return emit(typed); })
      .Case<GatherOp, ShardGatherOp>(
          [&](Operation *op) { return emitGather(op); })
      .Case<SoftmaxOp, LogSoftmaxOp>(
          [&](Operation *op) { return emitSoftmax(op); })
      .Case<AttentionOp, AttentionGradOp>(
          [&](Operation *op) { return emitAttention(op); })
      .Case<LinearCrossEntropyOp, LinearCrossEntropyGradOp>(
          [&](Operation *op) { return emitLinearCrossEntropy(op); })
      .Case<ReduceSumOp, ReduceMeanOp, ReduceMaxOp, ReduceMinOp, ReduceProdOp>(
          [&](Operation *op) { return emitReduce(op); })
      .Case<MaxPoolOp, AvgPoolOp>([&](Operation *op) { return emitPool(op); })
      .Case<ConvGradInputOp, ConvGradWeightOp>(
          [&](Operation *op) { return emitConvGrad(op); })
      .Case<MaxPoolGradOp, AvgPoolGradOp>(
          [&](Operation *op) { return emitPoolGrad(op); })
      .Default([](Operation *op) {
        return op->emitError("code generation: no lowering for '")
               << op->getName() << "'";
      });
}

LogicalResult CppEmitter::emit(ParamOp param) {
  Operation *op = param;
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
  return define(
      param.getResult(), info->cType,
      llvm::formatv("static_cast<{0} *>(w[{1}])", info->cType, it->second)
          .str(),
      /*isConst=*/false);
}

LogicalResult CppEmitter::emit(WaitCollectivesOp wait) {
  Operation *op = wait;
  // Each result is its started collective's buffer, complete from here.
  for (auto [started, result] : llvm::zip(wait.getStarted(), wait.getResults()))
    names[result] = nameOf(started);
  // Started collectives complete in order: waiting through the latest
  // of these completes them all, and leaves later ones running.
  std::string through;
  for (Value started : wait.getStarted()) {
    std::string ticket = tickets.lookup(started);
    if (ticket.empty())
      return wait.emitOpError("waits for a collective this function did "
                              "not start");
    through = through.empty()
                  ? ticket
                  : "std::max<int64_t>(" + through + ", " + ticket + ")";
  }
  line("{ const pcc_comm &c = " + comm(wait.getAxis()) + ";");
  line("  if (c.set_label) c.set_label(c.group, " + quoted(describeOp(op)) +
       ");");
  line("  if (c.wait_through(c.group, " + through + ")) return fail(" +
       quoted(describeOp(op)) + ", c.last_error(c.group)); }");
  return success();
}

LogicalResult CppEmitter::emit(BucketStartOp start) {
  Operation *op = start;
  // Earlier micro-batches only accumulate into the bucket.
  auto type = tensorTypeOf(start.getBucket());
  int code = elementInfo(type.getElementType())->code;
  std::string bucket = nameOf(start.getBucket());
  line("if (rc->hyper && rc->hyper[PCC_HYPER_LAST_MICROBATCH] != 0) {");
  line("  const pcc_comm &c = " + comm(start.getAxis()) + ";");
  line("  if (c.set_label) c.set_label(c.group, " + quoted(describeOp(op)) +
       ");");
  std::optional<ArrayRef<int64_t>> scatter = start.getScatter();
  if (!scatter) {
    line(llvm::formatv("  if (c.all_reduce_start(c.group, {0}, {1}, {2}))",
                       bucket, type.getNumElements(), code)
             .str());
    line("    return fail(" + quoted(describeOp(op)) +
         ", c.last_error(c.group));");
  }
  // ZeRO 1: each gradient's segment reduce-scattered in place, rank r's
  // piece landing at its place r.
  for (size_t i = 0; scatter && i < scatter->size(); i += 2) {
    int64_t offset = (*scatter)[i], piece = (*scatter)[i + 1];
    line(llvm::formatv("  if (c.reduce_scatter_start(c.group, {0} + {1}, "
                       "{0} + {1} + static_cast<int64_t>(c.rank) * {2}, "
                       "{2}, {3}))",
                       bucket, offset, piece, code)
             .str());
    line("    return fail(" + quoted(describeOp(op)) +
         ", c.last_error(c.group));");
  }
  line("}");
  return success();
}

LogicalResult CppEmitter::emit(BucketWaitOp wait) {
  Operation *op = wait;
  line("{ const pcc_comm &c = " + comm(wait.getAxis()) + ";");
  line("  if (c.set_label) c.set_label(c.group, \"the gradient buckets\");");
  line("  if (c.wait_all(c.group)) return fail(" + quoted(describeOp(op)) +
       ", c.last_error(c.group)); }");
  return success();
}

//===----------------------------------------------------------------------===//
// The translation unit
//===----------------------------------------------------------------------===//

FailureOr<TargetCode> CppEmitter::emit() {
  if (!func->getAttrOfType<IntegerAttr>(kArenaBytesAttrName))
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
  // A result returned through reshapes (a view: the same bytes) is computed
  // in the caller's output too: a training forward returns many fusion
  // results reshaped for the backward (85 MB copied per GPT-2 bf16 step).
  auto viewed = [](Value v) {
    while (auto reshape = v.getDefiningOp<ReshapeOp>())
      v = reshape.getInput();
    return v;
  };
  for (auto [i, v] : llvm::enumerate(ret.getOperands())) {
    returnedAt.try_emplace(v, static_cast<unsigned>(i));
    if (viewed(v) != v)
      returnedAt.try_emplace(viewed(v), static_cast<unsigned>(i));
  }
  // Once a collective has started, each later matmul or convolution lets
  // it advance (MPI moves data only inside its calls). Calling MPI after
  // every op, as the code did first, cost more than it moved: ZeRO 3's
  // prefetch on the GPT at dp=2 took 21% more time in collectives than
  // blocking gathers then, and is within noise of them now
  // (bench/dp_overlap.py --what prefetch).
  // A product whose one user is the next op, an assign of it whole to a
  // state loaded before it, writes the state itself (on the CPU: the
  // product kernels write their whole result).
  if (!cuda)
    for (auto assign : block.getOps<AssignOp>()) {
      Operation *product = assign.getValue().getDefiningOp();
      if (product && getCpuDeferral(product, [&](Value v) {
                       return returnedAt.count(v) != 0;
                     }) == CpuDeferral::IntoState) {
        intoState[product->getResult(0)] = assign.getState();
        assignedInPlace.insert(assign);
      }
    }
  std::optional<std::string> started;
  for (Operation &op : block.without_terminator()) {
    if (assignedInPlace.contains(&op) || deferToUser(&op))
      continue;
    if (!isa<ReshapeOp, ParamOp, ConstantOp>(op))
      line(profileMark(&op));
    if (failed(emitOp(&op)))
      return failure();
    if (auto start = dyn_cast<BucketStartOp>(op))
      started = comm(start.getAxis());
    else if (auto start = dyn_cast<ReduceScatterStartOp>(op))
      started = comm(start.getAxis());
    else if (auto start = dyn_cast<AllGatherStartOp>(op))
      started = comm(start.getAxis());
    else if (started &&
             isa<MatmulOp, ConvOp, ConvGradInputOp, ConvGradWeightOp>(op))
      line("if (" + *started + ".progress) " + *started + ".progress(" +
           *started + ".group);");
  }
  // The copies of results not computed in place are a site of their own.
  auto inPlace = [&](Value v, unsigned i) {
    Value root = viewed(v);
    return writtenInPlace.contains(root) && returnedAt.lookup(root) == i;
  };
  int64_t copied = 0;
  for (auto [i, v] : llvm::enumerate(ret.getOperands()))
    if (!inPlace(v, i))
      copied += bytesOf(v);
  if (copied > 0)
    line(profileSite("copy_out", "the results not computed in place", "-", 0,
                     2.0 * static_cast<double>(copied)));
  for (auto [i, v] : llvm::enumerate(ret.getOperands())) {
    if (inPlace(v, i))
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
  fn += "const pcc_profile_site " + profileTable() + "[] = {\n";
  for (const std::string &site : profileSites)
    fn += "    " + site + ",\n";
  fn += "    {nullptr, nullptr, nullptr, nullptr, 0.0, 0.0}};\n\n";
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

//===----------------------------------------------------------------------===//
// Profile sites
//===----------------------------------------------------------------------===//

namespace {

int64_t bytesOf(Value v) {
  auto type = dyn_cast<RankedTensorType>(v.getType());
  if (!type)
    return 0;
  auto info = elementInfo(type.getElementType());
  return info ? type.getNumElements() * info->size : 0;
}

/// The op's FLOPs of one call, from its cost rule (CostOpInterface: 2 per
/// multiply-add of the products, convolutions and attention).
double flopsOf(Operation *op) {
  if (auto cost = dyn_cast<CostOpInterface>(op))
    return static_cast<double>(cost.getFlops());
  return 0.0;
}

/// The ONNX node (or pass name) an op came from; for a fusion, its first
/// op that has one, and how many ops it fuses.
std::string profileNode(Operation *op) {
  auto fusion = dyn_cast<FusionOp>(op);
  if (!fusion)
    return describeOp(op);
  std::string first, kinds;
  int64_t ops = 0;
  for (Operation &inner : fusion.getBody().front().without_terminator()) {
    if (ops++ < 4)
      kinds +=
          (kinds.empty() ? "" : ", ") + inner.getName().stripDialect().str();
    if (first.empty() && !getOnnxNodeOfLocation(inner.getLoc()).first.empty())
      first = describeOp(&inner);
  }
  // Without an ONNX node (ops a pass made): what it fuses.
  if (first.empty())
    return kinds + (ops > 4 ? ", ..." : "");
  return first + " and " + std::to_string(ops - 1) + " more";
}

StringRef dtypeName(Type type) {
  if (type.isF32())
    return "f32";
  if (type.isBF16())
    return "bf16";
  if (type.isF16())
    return "f16";
  if (type.isF64())
    return "f64";
  return "int";
}

} // namespace

std::string CppEmitter::profileSite(StringRef kind, StringRef node,
                                    StringRef dtype, double flops,
                                    double bytes) {
  profileSites.push_back(llvm::formatv("{{{0}, {1}, {2}, {3}, {4:e6}, {5:e6}}",
                                       quoted(kind), quoted(node),
                                       quoted(func.getSymName()), quoted(dtype),
                                       flops, bytes)
                             .str());
  return "if (rc->profile) rc->profile->mark(rc->profile->state, &" +
         profileTable() + "[" + std::to_string(profileSites.size() - 1) + "]);";
}

std::string CppEmitter::profileMark(Operation *op) {
  double bytes = 0;
  Type computeType;
  for (Value v : llvm::concat<Value>(op->getOperands(), op->getResults())) {
    bytes += static_cast<double>(bytesOf(v));
    auto type = dyn_cast<RankedTensorType>(v.getType());
    if (!computeType && type && isa<FloatType>(type.getElementType()))
      computeType = type.getElementType();
  }
  // A copy's refresh moves its bytes only at a run's first step and after
  // a load: a rate from them would be meaningless on every other step.
  if (isa<RefreshCopyOp>(op))
    bytes = 0;
  return profileSite(op->getName().stripDialect(), profileNode(op),
                     computeType ? dtypeName(computeType) : "int", flopsOf(op),
                     bytes);
}

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
