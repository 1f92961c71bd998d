//===- NeuralConverters.cpp - ONNX linear algebra, norms, conv, pooling ---===//

#include "NodeImporter.h"

#include "pcc/Dialect/Pcc/IR/ShapeRules.h"

#include <limits>

using namespace mlir;
using namespace mlir::pcc;
using namespace mlir::pcc::onnx_import;

//===----------------------------------------------------------------------===//
// MatMul and Gemm
//===----------------------------------------------------------------------===//

/// ONNX MatMul: numpy matmul semantics, including 1-D operands and batch
/// broadcasting, on top of pcc.matmul's "shared matrix or equal batch" form.
static LogicalResult convertMatMul(NodeImporter &n) {
  auto lhsV = n.input(0), rhsV = n.input(1);
  if (failed(lhsV) || failed(rhsV))
    return failure();
  Value lhs = *lhsV, rhs = *rhsV;
  auto lt = cast<RankedTensorType>(lhs.getType());
  auto rt = cast<RankedTensorType>(rhs.getType());
  if (lt.getRank() == 0 || rt.getRank() == 0)
    return n.error() << "MatMul: operands must have rank >= 1";
  bool lhsVector = lt.getRank() == 1, rhsVector = rt.getRank() == 1;
  if (lhsVector)
    lhs = n.reshape(lhs, {1, lt.getDimSize(0)});
  if (rhsVector)
    rhs = n.reshape(rhs, {rt.getDimSize(0), 1});
  lt = cast<RankedTensorType>(lhs.getType());
  rt = cast<RankedTensorType>(rhs.getType());
  int64_t m = lt.getDimSize(lt.getRank() - 2),
          k = lt.getDimSize(lt.getRank() - 1);
  int64_t k2 = rt.getDimSize(rt.getRank() - 2),
          nn = rt.getDimSize(rt.getRank() - 1);
  if (k != k2)
    return n.error() << "MatMul: inner dimensions differ (" << lt << " x " << rt
                     << ")";
  ArrayRef<int64_t> lb = lt.getShape().drop_back(2),
                    rb = rt.getShape().drop_back(2);
  auto batch = broadcastShapes(lb, rb);
  if (!batch)
    return n.error() << "MatMul: batch dimensions " << shapeToString(lb)
                     << " and " << shapeToString(rb) << " do not broadcast";
  FailureOr<MatmulOp> product;
  if (numElements(rb) == 1) {
    // The right operand is one matrix shared by every batch entry.
    rhs = n.reshape(rhs, {k, nn});
    SmallVector<int64_t> lhsShape(*batch);
    lhsShape.append({m, k});
    lhs = n.broadcastTo(lhs, lhsShape);
    product = n.createChecked<MatmulOp>(lhs, rhs, false, false);
  } else {
    SmallVector<int64_t> lhsShape(*batch), rhsShape(*batch);
    lhsShape.append({m, k});
    rhsShape.append({k, nn});
    product =
        n.createChecked<MatmulOp>(n.broadcastTo(lhs, lhsShape),
                                  n.broadcastTo(rhs, rhsShape), false, false);
  }
  if (failed(product))
    return failure();
  Value result = *product;
  SmallVector<int64_t> shape(*batch);
  if (!lhsVector)
    shape.push_back(m);
  if (!rhsVector)
    shape.push_back(nn);
  n.setOutput(0, n.reshape(result, shape));
  return success();
}

static LogicalResult convertGemm(NodeImporter &n) {
  auto a = n.input(0), b = n.input(1);
  if (failed(a) || failed(b))
    return failure();
  auto at = cast<RankedTensorType>(a->getType());
  auto bt = cast<RankedTensorType>(b->getType());
  if (at.getRank() != 2 || bt.getRank() != 2)
    return n.error() << "Gemm: A and B must be matrices, got " << at << " and "
                     << bt;
  auto product = n.createChecked<MatmulOp>(*a, *b, n.intAttr("transA", 0) != 0,
                                           n.intAttr("transB", 0) != 0);
  if (failed(product))
    return failure();
  Value y = *product;
  auto yt = cast<RankedTensorType>(y.getType());
  float alpha = n.floatAttr("alpha", 1.0f), beta = n.floatAttr("beta", 1.0f);
  if (alpha != 1.0f)
    y = n.create<MulOp>(y, n.splat(yt, alpha));
  if (n.hasInput(2) && beta != 0.0f) {
    auto c = n.input(2);
    if (failed(c))
      return failure();
    auto ct = cast<RankedTensorType>(c->getType());
    if (!isBroadcastableTo(ct.getShape(), yt.getShape()))
      return n.error() << "Gemm: C of shape " << shapeToString(ct.getShape())
                       << " does not broadcast to the result "
                       << shapeToString(yt.getShape());
    Value bias = *c;
    if (beta != 1.0f)
      bias = n.create<MulOp>(bias, n.splat(ct, beta));
    y = n.create<AddOp>(y, n.broadcastTo(bias, yt.getShape()));
  }
  n.setOutput(0, y);
  return success();
}

//===----------------------------------------------------------------------===//
// Softmax and normalisation
//===----------------------------------------------------------------------===//

template <typename OpTy>
static LogicalResult convertSoftmaxLike(NodeImporter &n) {
  auto v = n.input(0);
  if (failed(v))
    return failure();
  auto type = cast<RankedTensorType>(v->getType());
  int64_t rank = type.getRank();
  if (n.getOpset() >= 13) {
    auto a = n.axis(n.intAttr("axis", -1), rank, "axis");
    if (failed(a))
      return failure();
    n.setOutput(0, n.create<OpTy>(*v, *a));
    return success();
  }
  // Before opset 13 the input is viewed as a matrix [prod(:axis),
  // prod(axis:)] and normalised along its rows.
  int64_t axisValue = n.intAttr("axis", 1);
  if (axisValue < 0)
    axisValue += rank;
  if (axisValue < 0 || axisValue > rank)
    return n.error() << n.getNode().op_type() << ": axis "
                     << n.intAttr("axis", 1) << " is out of range";
  int64_t outer = numElements(type.getShape().take_front(axisValue));
  int64_t inner = type.getNumElements() / std::max<int64_t>(outer, 1);
  Value flat = n.reshape(*v, {outer, inner});
  Value r = n.create<OpTy>(flat, 1);
  n.setOutput(0, n.reshape(r, type.getShape()));
  return success();
}

static LogicalResult convertLayerNorm(NodeImporter &n) {
  if (failed(n.rejectOutputsFrom(1, "pcc computes inference only, not the "
                                    "saved mean and inverse deviation")))
    return failure();
  auto x = n.input(0), scale = n.input(1);
  if (failed(x) || failed(scale))
    return failure();
  auto type = cast<RankedTensorType>(x->getType());
  auto a = n.axis(n.intAttr("axis", -1), type.getRank(), "axis");
  if (failed(a))
    return failure();
  ArrayRef<int64_t> normalized = type.getShape().drop_front(*a);
  auto fit = [&](Value v, StringRef what) -> FailureOr<Value> {
    auto vt = cast<RankedTensorType>(v.getType());
    if (!isBroadcastableTo(vt.getShape(), normalized))
      return n.error() << "LayerNormalization: " << what << " of shape "
                       << shapeToString(vt.getShape())
                       << " does not match the normalised shape "
                       << shapeToString(normalized);
    return n.broadcastTo(v, normalized);
  };
  auto s = fit(*scale, "scale");
  if (failed(s))
    return failure();
  Value bias;
  if (n.hasInput(2)) {
    auto bv = n.input(2);
    if (failed(bv))
      return failure();
    auto fitted = fit(*bv, "bias");
    if (failed(fitted))
      return failure();
    bias = *fitted;
  }
  auto &b = n.getBuilder();
  n.setOutput(0, n.create<LayerNormOp>(
                     type, *x, *s, bias, b.getI64IntegerAttr(*a),
                     b.getF32FloatAttr(n.floatAttr("epsilon", 1e-5f))));
  return success();
}

static LogicalResult convertBatchNorm(NodeImporter &n) {
  // A graph exported in training mode (training_mode = 1) is imported as
  // the same model in eval mode, with its running statistics; pcc --train
  // gives it batch statistics again (pcc-train-mode), as
  // torch.nn.Module.train() does.
  bool training = n.intAttr("training_mode", 0) != 0;
  if (n.getOpset() < 9 && n.intAttr("spatial", 1) != 1)
    return n.error() << "BatchNormalization with spatial = 0 is not supported";
  if (training) {
    for (unsigned i = 1; i < 3; ++i)
      if (n.outputConsumed(i))
        return n.error() << "BatchNormalization output " << i << " ('"
                         << n.getNode().output(i)
                         << "', the updated running statistics) is read by "
                            "the graph, which is not supported: pcc keeps "
                            "running statistics as model state (pcc --train)";
  } else if (failed(n.rejectOutputsFrom(1, "running statistics are only "
                                           "produced in training mode"))) {
    return failure();
  }
  SmallVector<Value> operands;
  for (unsigned i = 0; i < 5; ++i) {
    auto v = n.input(i);
    if (failed(v))
      return failure();
    operands.push_back(*v);
  }
  auto &b = n.getBuilder();
  float momentum = n.floatAttr("momentum", 0.9f);
  n.setOutput(0, n.create<BatchNormOp>(
                     operands[0].getType(), operands[0], operands[1],
                     operands[2], operands[3], operands[4],
                     b.getF32FloatAttr(n.floatAttr("epsilon", 1e-5f)),
                     momentum == 0.9f ? FloatAttr()
                                      : b.getF32FloatAttr(momentum)));
  return success();
}

//===----------------------------------------------------------------------===//
// Reductions
//===----------------------------------------------------------------------===//

template <typename OpTy> static LogicalResult convertReduce(NodeImporter &n) {
  auto v = n.input(0);
  if (failed(v))
    return failure();
  auto type = cast<RankedTensorType>(v->getType());
  int64_t rank = type.getRank();
  // ReduceSum takes its axes as an input from opset 13, the others from 18.
  int64_t inputSince = n.getNode().op_type() == "ReduceSum" ? 13 : 18;
  std::vector<int64_t> axes;
  if (n.getOpset() >= inputSince) {
    if (n.hasInput(1)) {
      auto t = n.requireConstant(1, "axes");
      if (failed(t))
        return failure();
      axes = t->toInts();
    }
  } else if (auto attr = n.intsAttr("axes")) {
    axes.assign(attr->begin(), attr->end());
  }
  if (axes.empty()) {
    if (n.intAttr("noop_with_empty_axes", 0)) {
      n.setOutput(0, *v);
      return success();
    }
    for (int64_t d = 0; d < rank; ++d)
      axes.push_back(d);
  }
  SmallVector<int64_t> normalized;
  for (int64_t a : axes) {
    auto d = n.axis(a, rank, "reduction axis");
    if (failed(d))
      return failure();
    if (llvm::is_contained(normalized, *d))
      return n.error() << n.getNode().op_type() << ": axis " << *d
                       << " is repeated";
    normalized.push_back(*d);
  }
  llvm::sort(normalized);
  return n.produce<OpTy>(*v, normalized, n.intAttr("keepdims", 1) != 0);
}

static LogicalResult convertArgMax(NodeImporter &n) {
  if (n.intAttr("select_last_index", 0) != 0)
    return n.error() << "ArgMax with select_last_index = 1 is not supported";
  auto v = n.input(0);
  if (failed(v))
    return failure();
  auto type = cast<RankedTensorType>(v->getType());
  auto a = n.axis(n.intAttr("axis", 0), type.getRank(), "axis");
  if (failed(a))
    return failure();
  return n.produce<ArgMaxOp>(*v, *a, n.intAttr("keepdims", 1) != 0);
}

template <typename OpTy>
static LogicalResult convertGlobalPool(NodeImporter &n) {
  auto v = n.input(0);
  if (failed(v))
    return failure();
  auto type = cast<RankedTensorType>(v->getType());
  if (type.getRank() < 3)
    return n.error() << n.getNode().op_type()
                     << ": input needs N x C x spatial dimensions";
  SmallVector<int64_t> axes;
  for (int64_t d = 2; d < type.getRank(); ++d)
    axes.push_back(d);
  return n.produce<OpTy>(*v, axes, /*keep_dims=*/true);
}

//===----------------------------------------------------------------------===//
// Convolution and pooling
//===----------------------------------------------------------------------===//

namespace {
struct Window {
  SmallVector<int64_t> kernel, strides, pads, dilations;
};
} // namespace

/// Reads kernel/strides/pads/dilations, resolving auto_pad, for `spatial`
/// dimensions of `in`.
static FailureOr<Window> readWindow(NodeImporter &n, RankedTensorType in,
                                    ArrayRef<int64_t> kernel, bool ceilMode) {
  int64_t spatial = in.getRank() - 2;
  Window w;
  w.kernel.assign(kernel.begin(), kernel.end());
  w.strides = n.intsAttr("strides").value_or(SmallVector<int64_t>(spatial, 1));
  w.dilations =
      n.intsAttr("dilations").value_or(SmallVector<int64_t>(spatial, 1));
  w.pads = n.intsAttr("pads").value_or(SmallVector<int64_t>(2 * spatial, 0));
  if (static_cast<int64_t>(w.kernel.size()) != spatial ||
      static_cast<int64_t>(w.strides.size()) != spatial ||
      static_cast<int64_t>(w.dilations.size()) != spatial ||
      static_cast<int64_t>(w.pads.size()) != 2 * spatial)
    return n.error() << n.getNode().op_type() << ": kernel, strides, "
                     << "dilations and pads do not match " << spatial
                     << " spatial dimensions";
  // The ONNX checker does not look at attribute values; a zero stride
  // divides by zero below (SIGFPE).
  for (int64_t d = 0; d < spatial; ++d)
    if (w.strides[d] <= 0 || w.dilations[d] <= 0 || w.kernel[d] <= 0)
      return n.error() << n.getNode().op_type()
                       << ": kernel sizes, strides and dilations must be "
                          "positive";
  std::string autoPad = n.stringAttr("auto_pad", "NOTSET");
  if (autoPad == "VALID") {
    w.pads.assign(2 * spatial, 0);
  } else if (autoPad == "SAME_UPPER" || autoPad == "SAME_LOWER") {
    for (int64_t d = 0; d < spatial; ++d) {
      int64_t size = in.getDimSize(d + 2);
      int64_t out = (size + w.strides[d] - 1) / w.strides[d];
      int64_t total = std::max<int64_t>(
          0, (out - 1) * w.strides[d] + (w.kernel[d] - 1) * w.dilations[d] + 1 -
                 size);
      int64_t small = total / 2, large = total - small;
      w.pads[d] = autoPad == "SAME_UPPER" ? small : large;
      w.pads[d + spatial] = autoPad == "SAME_UPPER" ? large : small;
    }
  } else if (autoPad != "NOTSET") {
    return n.error() << n.getNode().op_type() << ": unknown auto_pad '"
                     << autoPad << "'";
  }
  (void)ceilMode;
  return w;
}

static LogicalResult convertConv(NodeImporter &n) {
  auto x = n.input(0), wv = n.input(1);
  if (failed(x) || failed(wv))
    return failure();
  auto in = cast<RankedTensorType>(x->getType());
  auto wt = cast<RankedTensorType>(wv->getType());
  if (in.getRank() < 3 || wt.getRank() != in.getRank())
    return n.error() << "Conv: input " << in << " and weight " << wt
                     << " must both be N x C x spatial";
  SmallVector<int64_t> kernel(wt.getShape().drop_front(2));
  if (auto attr = n.intsAttr("kernel_shape"); attr && *attr != kernel)
    return n.error() << "Conv: kernel_shape does not match the weight";
  auto w = readWindow(n, in, kernel, false);
  if (failed(w))
    return failure();
  Value bias;
  if (n.hasInput(2)) {
    auto b = n.input(2);
    if (failed(b))
      return failure();
    bias = *b;
  }
  return n.produce<ConvOp>(*x, *wv, bias, w->strides, w->pads, w->dilations,
                           n.intAttr("group", 1));
}

template <typename OpTy> static LogicalResult convertPool(NodeImporter &n) {
  if (failed(n.rejectOutputsFrom(1, "pooling indices are not supported")))
    return failure();
  auto x = n.input(0);
  if (failed(x))
    return failure();
  auto in = cast<RankedTensorType>(x->getType());
  auto kernel = n.intsAttr("kernel_shape");
  if (!kernel)
    return n.error() << n.getNode().op_type() << ": missing kernel_shape";
  bool ceilMode = n.intAttr("ceil_mode", 0) != 0;
  if (in.getRank() < 3)
    return n.error() << n.getNode().op_type()
                     << ": input needs N x C x spatial dimensions";
  auto w = readWindow(n, in, *kernel, ceilMode);
  if (failed(w))
    return failure();
  if constexpr (std::is_same_v<OpTy, AvgPoolOp>)
    return n.produce<OpTy>(*x, w->kernel, w->strides, w->pads, w->dilations,
                           ceilMode, n.intAttr("count_include_pad", 0) != 0);
  else
    return n.produce<OpTy>(*x, w->kernel, w->strides, w->pads, w->dilations,
                           ceilMode);
}

void onnx_import::registerNeuralConverters(llvm::StringMap<ConverterFn> &t) {
  t["MatMul"] = convertMatMul;
  t["Gemm"] = convertGemm;
  t["Softmax"] = convertSoftmaxLike<SoftmaxOp>;
  t["LogSoftmax"] = convertSoftmaxLike<LogSoftmaxOp>;
  t["LayerNormalization"] = convertLayerNorm;
  t["BatchNormalization"] = convertBatchNorm;
  t["ReduceSum"] = convertReduce<ReduceSumOp>;
  t["ReduceMean"] = convertReduce<ReduceMeanOp>;
  t["ReduceMax"] = convertReduce<ReduceMaxOp>;
  t["ReduceMin"] = convertReduce<ReduceMinOp>;
  t["ReduceProd"] = convertReduce<ReduceProdOp>;
  t["ArgMax"] = convertArgMax;
  t["GlobalAveragePool"] = convertGlobalPool<ReduceMeanOp>;
  t["GlobalMaxPool"] = convertGlobalPool<ReduceMaxOp>;
  t["Conv"] = convertConv;
  t["MaxPool"] = convertPool<MaxPoolOp>;
  t["AveragePool"] = convertPool<AvgPoolOp>;
}
