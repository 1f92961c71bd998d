//===- ComputeEmitter.cpp - products, norms and reductions ----------------===//
//
// Matrix products (the runtime's GEMMs), softmax, the norms, reductions
// and arg-max as calls of the runtime's kernels with static shapes.
//
//===----------------------------------------------------------------------===//

#include "CppEmitter.h"

#include "llvm/Support/FormatVariadic.h"

using namespace mlir;
using namespace mlir::pcc;

namespace mlir::pcc::cpp {

LogicalResult CppEmitter::emit(MatmulOp mm) {
  Operation *op = mm;
  // bf16 or fp16 (pcc-autocast): fp32 accumulation, a 16-bit result.
  Type element = mm.getLhs().getType().getElementType();
  bool half = element.isBF16() || element.isF16();
  if (!half && failed(requireF32(op, mm.getLhs())))
    return failure();
  // A 16-bit product with an f32 result: the accumulator unrounded.
  std::string kernel =
      std::string(element.isF16() ? "matmul_f16" : "matmul_bf16") +
      (half && mm.getType().getElementType().isF32() ? "_f32" : "");
  auto lhs = mm.getLhs().getType(), rhs = mm.getRhs().getType();
  auto out = mm.getType();
  int64_t r = out.getRank();
  int64_t m = out.getDimSize(r - 2), n = out.getDimSize(r - 1);
  int64_t k = mm.getTransposeA() ? lhs.getDimSize(lhs.getRank() - 2)
                                 : lhs.getDimSize(lhs.getRank() - 1);
  int64_t batch = product(out.getShape().drop_back(2));
  std::string args =
      llvm::formatv("{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}, {8}, {9}, {10})",
                    nameOf(mm.getLhs()), nameOf(mm.getRhs()),
                    nameOf(mm.getResult()), batch, m, n, k,
                    mm.getTransposeA() ? 1 : 0, mm.getTransposeB() ? 1 : 0,
                    m * k, rhs.getRank() == 2 ? 0 : k * n)
          .str();
  if (!half) {
    line(call("matmul_f32") + args + ";");
  } else if (cuda) {
    line(call(kernel) + args + ";");
  } else {
    line("if (" + call(kernel) + args + ")");
    line("  return fail(" + quoted(describeOp(op)) +
         ", pcc_cpu_last_error());");
  }
  return success();
}

LogicalResult CppEmitter::emitSoftmax(Operation *op) {
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

/// pcc.attention and its gradient: one runtime call with the sizes in a
/// static pcc_attention_shape (runtime/include/pcc/runtime/
/// AttentionShape.h).
LogicalResult CppEmitter::emitAttention(Operation *op) {
  auto forward = dyn_cast<AttentionOp>(op);
  auto backward = dyn_cast<AttentionGradOp>(op);
  RankedTensorType q = tensorTypeOf(op->getOperand(0)),
                   k = tensorTypeOf(op->getOperand(1)),
                   v = tensorTypeOf(op->getOperand(2));
  Type element = q.getElementType();
  if (!element.isF32() && !element.isBF16())
    return op->emitError("code generation: ")
           << op->getName() << " runs on f32 or bf16, not " << element;
  Value bias = forward ? forward.getBias() : backward.getBias();
  SmallVector<int64_t> biasStrides(4, 0);
  if (bias) {
    RankedTensorType bt = tensorTypeOf(bias);
    if (!bt.getElementType().isF32())
      return op->emitError("code generation: ")
             << op->getName() << " takes an f32 bias, not " << bt;
    int64_t stride = 1;
    for (int64_t d = 3; d >= 0; --d) {
      biasStrides[d] = bt.getDimSize(d) == 1 ? 0 : stride;
      stride *= bt.getDimSize(d);
    }
  }
  double scale = forward ? forward.getScale().convertToDouble()
                         : backward.getScale().convertToDouble();
  bool causal = forward ? forward.getCausal() : backward.getCausal();
  std::string shape = llvm::formatv(
      "{{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {{{7}, {8}, {9}, {10}}, {11:e16}, "
      "{12}, {13}}",
      q.getDimSize(0), q.getDimSize(1), k.getDimSize(1), q.getDimSize(2),
      k.getDimSize(2), q.getDimSize(3), v.getDimSize(3), biasStrides[0],
      biasStrides[1], biasStrides[2], biasStrides[3], scale, causal ? 1 : 0,
      element.isBF16() ? 1 : 0);
  std::string biasName = bias ? nameOf(bias) : "nullptr";
  std::string args;
  if (forward)
    args = llvm::formatv("&shape, {0}, {1}, {2}, {3}, {4}, {5})",
                         nameOf(forward.getQ()), nameOf(forward.getK()),
                         nameOf(forward.getV()), biasName,
                         nameOf(forward.getResult()), nameOf(forward.getLse()));
  else
    args = llvm::formatv(
        "&shape, {0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}, {8}, {9})",
        nameOf(backward.getQ()), nameOf(backward.getK()),
        nameOf(backward.getV()), nameOf(backward.getOut()),
        nameOf(backward.getLse()), nameOf(backward.getGrad()), biasName,
        nameOf(backward.getDq()), nameOf(backward.getDk()),
        nameOf(backward.getDv()));
  std::string kernel = forward ? "attention" : "attention_grad";
  line("{");
  line("  static const pcc_attention_shape shape = " + shape + ";");
  if (cuda) {
    line("  " + call(kernel) + args + ";");
  } else {
    line("  if (" + call(kernel) + args + ")");
    line("    return fail(" + quoted(describeOp(op)) +
         ", pcc_cpu_last_error());");
  }
  line("}");
  return success();
}

/// pcc.linear_cross_entropy and its gradient: one runtime call with the
/// sizes in a static pcc_lce_shape (runtime/include/pcc/runtime/
/// LinearCrossEntropyShape.h); with mesh_axis, this rank's first class.
LogicalResult CppEmitter::emitLinearCrossEntropy(Operation *op) {
  auto forward = dyn_cast<LinearCrossEntropyOp>(op);
  auto backward = dyn_cast<LinearCrossEntropyGradOp>(op);
  Value hidden = op->getOperand(0), weight = op->getOperand(1),
        labels = op->getOperand(2);
  RankedTensorType h = tensorTypeOf(hidden);
  Type element = h.getElementType();
  // pcc_dtype codes (runtime/include/pcc/runtime/CpuKernels.h).
  int dtype = element.isF32()    ? 0
              : element.isF16()  ? 2
              : element.isBF16() ? 3
                                 : -1;
  if (dtype < 0)
    return op->emitOpError("runs on f32, bf16 or fp16 hidden states, not ")
           << element;
  bool transposeW =
      forward ? forward.getTransposeW() : backward.getTransposeW();
  int64_t vocab = forward ? forward.getVocabSize() : backward.getVocabSize();
  int64_t ignore =
      forward ? forward.getIgnoreIndex() : backward.getIgnoreIndex();
  std::optional<StringRef> axis =
      forward ? forward.getMeshAxis() : backward.getMeshAxis();
  int64_t total = vocab;
  std::string start = "0";
  if (axis) {
    FailureOr<int64_t> ranks = getMeshAxisSize(op, *axis);
    if (failed(ranks))
      return failure();
    total = vocab * *ranks;
    start = "static_cast<int64_t>(" + comm(*axis) + ".rank) * " +
            std::to_string(vocab);
  }
  std::string shape = llvm::formatv(
      "{{{0}, {1}, {2}, {3}, {4}LL, {5}, {6}, {7}}", h.getDimSize(0),
      h.getDimSize(1), vocab, total, ignore, transposeW ? 1 : 0,
      tensorTypeOf(labels).getElementType().isInteger(64) ? 1 : 0, dtype);
  std::string args;
  if (forward)
    args = llvm::formatv("&shape, {0}, {1}, {2}, {3}, {4}, {5}", start,
                         nameOf(hidden), nameOf(weight), nameOf(labels),
                         nameOf(forward.getLse()), nameOf(forward.getTarget()));
  else
    args = llvm::formatv(
        "&shape, {0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}, {8}", start,
        nameOf(hidden), nameOf(weight), nameOf(labels),
        nameOf(backward.getLse()), nameOf(backward.getGradLse()),
        nameOf(backward.getGradTarget()), nameOf(backward.getGradHidden()),
        nameOf(backward.getGradWeight()));
  line("{");
  line("  static const pcc_lce_shape shape = " + shape + ";");
  checkedCall(forward ? "linear_cross_entropy" : "linear_cross_entropy_grad",
              args,
              llvm::formatv("a label is outside [0, {0}) and is not the "
                            "ignored {1}",
                            total, ignore),
              op);
  line("}");
  return success();
}

LogicalResult CppEmitter::emit(LayerNormOp ln) {
  Operation *op = ln;
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

LogicalResult CppEmitter::emit(BatchNormOp bn) {
  Operation *op = bn;
  if (failed(requireF32(op, bn.getInput())))
    return failure();
  auto shape = bn.getType().getShape();
  line(llvm::formatv("{10}{0}, {1}, {2}, {3}, {4}, {5}, "
                     "{6}, {7}, {8}, {9});",
                     nameOf(bn.getInput()), nameOf(bn.getScale()),
                     nameOf(bn.getBias()), nameOf(bn.getMean()),
                     nameOf(bn.getVariance()), nameOf(bn.getResult()), shape[0],
                     shape[1], product(shape.drop_front(2)),
                     literal(bn.getEpsilon().convertToDouble(),
                             bn.getType().getElementType()),
                     call("batch_norm_f32"))
           .str());
  return success();
}

LogicalResult CppEmitter::emitReduce(Operation *op) {
  Value in = op->getOperand(0);
  auto inType = tensorTypeOf(in);
  Type e = inType.getElementType();
  if (!e.isF32() && !e.isInteger(64))
    return op->emitError("code generation: reductions take f32 and i64 "
                         "tensors, got ")
           << e;
  if (Value x = squares.lookup(op)) {
    // The whole-tensor sum of x * x in one pass (deferToUser).
    line(llvm::formatv("{0}{1}, {2}, {3});", call("sum_squares_f32"), nameOf(x),
                       nameOf(op->getResult(0)),
                       tensorTypeOf(x).getNumElements())
             .str());
    return success();
  }
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
                     call(e.isF32() ? "reduce_f32" : "reduce_i64"), nameOf(in),
                     nameOf(op->getResult(0)), inType.getRank(), kind)
           .str());
  return success();
}

LogicalResult CppEmitter::emit(ArgMaxOp am) {
  Operation *op = am;
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

} // namespace mlir::pcc::cpp
