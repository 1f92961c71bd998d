//===- PccOps.cpp - pcc op shape inference and verifiers
//-------------------===//
//
// Each check names the constraint it enforces in its message, and
// test/Dialect/invalid.mlir has a case for each.
//
//===----------------------------------------------------------------------===//

#include "pcc/Dialect/Pcc/IR/PccDialect.h"
#include "pcc/Dialect/Pcc/IR/ShapeRules.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/OpImplementation.h"
#include "llvm/ADT/SmallSet.h"

using namespace mlir;
using namespace mlir::pcc;

#include "pcc/Dialect/Pcc/IR/PccEnums.cpp.inc"

/// `[dp = 2, pp = 1, tp = 4]`: a mesh's axes and sizes, in order.
static ParseResult parseMeshAxes(OpAsmParser &parser, ArrayAttr &axes,
                                 DenseI64ArrayAttr &shape) {
  SmallVector<Attribute> names;
  SmallVector<int64_t> sizes;
  Builder &b = parser.getBuilder();
  if (parser.parseCommaSeparatedList(
          OpAsmParser::Delimiter::Square, [&]() -> ParseResult {
            std::string name;
            int64_t size = 0;
            if (parser.parseKeywordOrString(&name) || parser.parseEqual() ||
                parser.parseInteger(size))
              return failure();
            names.push_back(b.getStringAttr(name));
            sizes.push_back(size);
            return success();
          }))
    return failure();
  axes = b.getArrayAttr(names);
  shape = b.getDenseI64ArrayAttr(sizes);
  return success();
}

static void printMeshAxes(OpAsmPrinter &printer, Operation *, ArrayAttr axes,
                          DenseI64ArrayAttr shape) {
  printer << '[';
  for (auto [i, entry] : llvm::enumerate(llvm::zip(axes, shape.asArrayRef()))) {
    if (i)
      printer << ", ";
    printer.printKeywordOrString(cast<StringAttr>(std::get<0>(entry)));
    printer << " = " << std::get<1>(entry);
  }
  printer << ']';
}

/// AdamW's gradient type: the weight's unless spelled after `grad`.
static ParseResult parseGradType(OpAsmParser &parser, Type &grad, Type param) {
  if (succeeded(parser.parseOptionalKeyword("grad")))
    return parser.parseType(grad);
  grad = param;
  return success();
}

static void printGradType(OpAsmPrinter &printer, Operation *, Type grad,
                          Type param) {
  if (grad != param)
    printer << "grad " << grad;
}

#define GET_OP_CLASSES
#include "pcc/Dialect/Pcc/IR/PccOps.cpp.inc"

static RankedTensorType tensorType(Value v) {
  return cast<RankedTensorType>(v.getType());
}

/// Checks that `axis` lies in [0, rank).
static LogicalResult checkAxis(std::optional<Location> loc, int64_t axis,
                               int64_t rank, StringRef what = "axis") {
  if (axis < 0 || axis >= rank)
    return emitOptionalError(loc, what, " ", axis, " is out of range [0, ",
                             rank, ")");
  return success();
}

//===----------------------------------------------------------------------===//
// matmul
//===----------------------------------------------------------------------===//

LogicalResult MatmulOp::inferReturnTypes(MLIRContext *,
                                         std::optional<Location> loc,
                                         Adaptor adaptor,
                                         SmallVectorImpl<Type> &results) {
  auto lhs = tensorType(adaptor.getLhs());
  auto rhs = tensorType(adaptor.getRhs());
  if (lhs.getRank() < 2 || rhs.getRank() < 2)
    return emitOptionalError(loc,
                             "operand rank: lhs and rhs need rank >= 2, "
                             "got ",
                             lhs.getRank(), " and ", rhs.getRank());
  ArrayRef<int64_t> ls = lhs.getShape(), rs = rhs.getShape();
  int64_t lr = ls.size(), rr = rs.size();
  int64_t m = adaptor.getTransposeA() ? ls[lr - 1] : ls[lr - 2];
  int64_t kl = adaptor.getTransposeA() ? ls[lr - 2] : ls[lr - 1];
  int64_t kr = adaptor.getTransposeB() ? rs[rr - 1] : rs[rr - 2];
  int64_t n = adaptor.getTransposeB() ? rs[rr - 2] : rs[rr - 1];
  if (kl != kr)
    return emitOptionalError(loc, "contraction: lhs has K = ", kl,
                             " but rhs has K = ", kr);
  if (rr != 2 && ls.drop_back(2) != rs.drop_back(2))
    return emitOptionalError(
        loc,
        "batch dimensions: rhs must be a matrix or have lhs's batch "
        "dimensions (",
        shapeToString(ls.drop_back(2)), "), got ",
        shapeToString(rs.drop_back(2)));
  SmallVector<int64_t> shape(ls.drop_back(2));
  shape.push_back(m);
  shape.push_back(n);
  results.push_back(RankedTensorType::get(shape, lhs.getElementType()));
  return success();
}

bool MatmulOp::isCompatibleReturnTypes(TypeRange inferred, TypeRange actual) {
  if (inferred.size() != 1 || actual.size() != 1)
    return false;
  if (inferred[0] == actual[0])
    return true;
  auto want = dyn_cast<RankedTensorType>(inferred[0]);
  auto got = dyn_cast<RankedTensorType>(actual[0]);
  Type element = want ? want.getElementType() : Type();
  return want && got && want.getShape() == got.getShape() &&
         (element.isBF16() || element.isF16()) && got.getElementType().isF32();
}

//===----------------------------------------------------------------------===//
// Elementwise
//===----------------------------------------------------------------------===//

LogicalResult ClampOp::verify() {
  if (getMin().convertToDouble() > getMax().convertToDouble())
    return emitOpError("bounds: min ")
           << getMin().convertToDouble() << " exceeds max "
           << getMax().convertToDouble();
  return success();
}

LogicalResult CompareOp::inferReturnTypes(MLIRContext *ctx,
                                          std::optional<Location>,
                                          Adaptor adaptor,
                                          SmallVectorImpl<Type> &results) {
  auto lhs = tensorType(adaptor.getLhs());
  results.push_back(
      RankedTensorType::get(lhs.getShape(), IntegerType::get(ctx, 1)));
  return success();
}

//===----------------------------------------------------------------------===//
// Fusion
//===----------------------------------------------------------------------===//

LogicalResult FusionOp::verify() {
  Block &body = getBody().front();
  if (body.getNumArguments() != getInputs().size())
    return emitOpError("body: has ")
           << body.getNumArguments() << " arguments for " << getInputs().size()
           << " inputs";
  for (auto [arg, input] : llvm::zip(body.getArguments(), getInputs()))
    if (arg.getType() != input.getType())
      return emitOpError("body: argument type ")
             << arg.getType() << " differs from input type " << input.getType();
  auto yield = cast<YieldOp>(body.getTerminator());
  if (yield.getValues().getTypes() != getResultTypes())
    return emitOpError("body: yields ") << yield.getValues().getTypes()
                                        << " for results " << getResultTypes();
  if (getResults().empty())
    return emitOpError("results: needs at least one result");
  ArrayRef<int64_t> shape =
      cast<RankedTensorType>(getResult(0).getType()).getShape();
  for (Type t : getResultTypes())
    if (cast<RankedTensorType>(t).getShape() != shape)
      return emitOpError("results: all results need the iteration shape ")
             << shapeToString(shape);
  for (Operation &op : body.without_terminator()) {
    auto floatCast = dyn_cast<CastOp>(op);
    bool allowed =
        op.hasTrait<OpTrait::Elementwise>() ||
        isa<BroadcastOp, ConstantOp>(op) ||
        (floatCast &&
         isa<FloatType>(floatCast.getInput().getType().getElementType()) &&
         isa<FloatType>(floatCast.getType().getElementType()));
    if (!allowed)
      return op.emitOpError("fusion body: only elementwise ops, float casts, "
                            "broadcasts and constants can be fused");
    for (Value r : op.getResults())
      if (cast<RankedTensorType>(r.getType()).getShape() != shape)
        return op.emitOpError("fusion body: result shape ")
               << shapeToString(cast<RankedTensorType>(r.getType()).getShape())
               << " is not the iteration shape " << shapeToString(shape);
  }
  return success();
}

//===----------------------------------------------------------------------===//
// Normalisation and softmax
//===----------------------------------------------------------------------===//

template <typename Op> static LogicalResult verifySoftmaxLike(Op op) {
  return checkAxis(op.getLoc(), static_cast<int64_t>(op.getAxis()),
                   op.getType().getRank());
}
LogicalResult SoftmaxOp::verify() { return verifySoftmaxLike(*this); }
LogicalResult LogSoftmaxOp::verify() { return verifySoftmaxLike(*this); }

LogicalResult LayerNormOp::verify() {
  auto input = getInput().getType();
  int64_t axis = static_cast<int64_t>(getAxis());
  if (failed(checkAxis(getLoc(), axis, input.getRank())))
    return failure();
  ArrayRef<int64_t> normalized = input.getShape().drop_front(axis);
  auto checkParam = [&](Value v, StringRef name) -> LogicalResult {
    if (!v)
      return success();
    auto t = tensorType(v);
    auto expected = RankedTensorType::get(normalized, input.getElementType());
    if (t != expected)
      return emitOpError("parameter shape: ")
             << name << " must be " << expected << ", got " << t;
    return success();
  };
  if (failed(checkParam(getScale(), "scale")) ||
      failed(checkParam(getBias(), "bias")))
    return failure();
  if (getEpsilon().convertToFloat() < 0)
    return emitOpError("epsilon: must be non-negative");
  return success();
}

LogicalResult BatchNormOp::verify() {
  auto input = getInput().getType();
  if (input.getRank() < 2)
    return emitOpError("input rank: needs N x C x ..., got rank ")
           << input.getRank();
  auto param = getScale().getType();
  if (param.getRank() != 1 || param.getDimSize(0) != input.getDimSize(1))
    return emitOpError("parameter shape: scale, bias, mean and variance must "
                       "have one entry per channel (")
           << input.getDimSize(1) << "), got " << param;
  return success();
}

//===----------------------------------------------------------------------===//
// Data movement
//===----------------------------------------------------------------------===//

LogicalResult ReshapeOp::verify() {
  auto in = getInput().getType(), out = getType();
  if (in.getNumElements() != out.getNumElements())
    return emitOpError("element count: cannot reshape ")
           << in.getNumElements() << " elements into " << out;
  return success();
}

LogicalResult TransposeOp::inferReturnTypes(MLIRContext *,
                                            std::optional<Location> loc,
                                            Adaptor adaptor,
                                            SmallVectorImpl<Type> &results) {
  auto in = tensorType(adaptor.getInput());
  ArrayRef<int64_t> perm = adaptor.getPermutation();
  if (static_cast<int64_t>(perm.size()) != in.getRank())
    return emitOptionalError(loc, "permutation: has ", perm.size(),
                             " entries for an input of rank ", in.getRank());
  SmallVector<bool> seen(perm.size(), false);
  SmallVector<int64_t> shape;
  for (int64_t p : perm) {
    if (p < 0 || p >= in.getRank() || seen[p])
      return emitOptionalError(loc, "permutation: [", ArrayRef<int64_t>(perm),
                               "] is not a permutation of [0, ", in.getRank(),
                               ")");
    seen[p] = true;
    shape.push_back(in.getDimSize(p));
  }
  results.push_back(RankedTensorType::get(shape, in.getElementType()));
  return success();
}

LogicalResult BroadcastOp::verify() {
  auto in = getInput().getType(), out = getType();
  if (!isBroadcastableTo(in.getShape(), out.getShape()))
    return emitOpError("broadcast: ") << in << " does not broadcast to " << out;
  return success();
}

LogicalResult ConcatOp::inferReturnTypes(MLIRContext *,
                                         std::optional<Location> loc,
                                         Adaptor adaptor,
                                         SmallVectorImpl<Type> &results) {
  if (adaptor.getInputs().empty())
    return emitOptionalError(loc, "inputs: needs at least one input");
  auto first = tensorType(adaptor.getInputs().front());
  int64_t axis = static_cast<int64_t>(adaptor.getAxis());
  if (failed(checkAxis(loc, axis, first.getRank())))
    return failure();
  SmallVector<int64_t> shape(first.getShape());
  shape[axis] = 0;
  for (Value v : adaptor.getInputs()) {
    auto t = tensorType(v);
    if (t.getRank() != first.getRank())
      return emitOptionalError(loc, "inputs: ranks differ (", first.getRank(),
                               " and ", t.getRank(), ")");
    for (int64_t d = 0; d < t.getRank(); ++d)
      if (d != axis && t.getDimSize(d) != first.getDimSize(d))
        return emitOptionalError(loc, "inputs: dimension ", d,
                                 " differs off the concatenation axis (",
                                 first.getDimSize(d), " and ", t.getDimSize(d),
                                 ")");
    shape[axis] += t.getDimSize(axis);
  }
  results.push_back(RankedTensorType::get(shape, first.getElementType()));
  return success();
}

LogicalResult SplitOp::inferReturnTypes(MLIRContext *,
                                        std::optional<Location> loc,
                                        Adaptor adaptor,
                                        SmallVectorImpl<Type> &results) {
  auto in = tensorType(adaptor.getInput());
  int64_t axis = static_cast<int64_t>(adaptor.getAxis());
  if (failed(checkAxis(loc, axis, in.getRank())))
    return failure();
  int64_t total = 0;
  for (int64_t size : adaptor.getSizes()) {
    if (size < 0)
      return emitOptionalError(loc, "sizes: negative piece size ", size);
    total += size;
  }
  if (total != in.getDimSize(axis))
    return emitOptionalError(loc, "sizes: pieces add up to ", total,
                             " but dimension ", axis, " has ",
                             in.getDimSize(axis));
  for (int64_t size : adaptor.getSizes()) {
    SmallVector<int64_t> shape(in.getShape());
    shape[axis] = size;
    results.push_back(RankedTensorType::get(shape, in.getElementType()));
  }
  return success();
}

LogicalResult SliceOp::inferReturnTypes(MLIRContext *,
                                        std::optional<Location> loc,
                                        Adaptor adaptor,
                                        SmallVectorImpl<Type> &results) {
  auto in = tensorType(adaptor.getInput());
  ArrayRef<int64_t> starts = adaptor.getStarts(), limits = adaptor.getLimits(),
                    steps = adaptor.getSteps();
  size_t rank = in.getRank();
  if (starts.size() != rank || limits.size() != rank || steps.size() != rank)
    return emitOptionalError(loc, "bounds: starts, limits and steps need ",
                             rank, " entries each");
  SmallVector<int64_t> shape;
  for (size_t d = 0; d < rank; ++d) {
    int64_t dim = in.getDimSize(d);
    if (steps[d] == 0)
      return emitOptionalError(loc, "bounds: step of dimension ", d,
                               " is zero");
    bool ok = steps[d] > 0 ? (starts[d] >= 0 && starts[d] <= dim &&
                              limits[d] >= 0 && limits[d] <= dim)
                           : (starts[d] >= -1 && starts[d] < dim &&
                              limits[d] >= -1 && limits[d] < dim);
    if (!ok)
      return emitOptionalError(loc, "bounds: dimension ", d, " of size ", dim,
                               " cannot take start ", starts[d], " limit ",
                               limits[d], " step ", steps[d]);
    shape.push_back(sliceLength(starts[d], limits[d], steps[d]));
  }
  results.push_back(RankedTensorType::get(shape, in.getElementType()));
  return success();
}

LogicalResult GatherOp::inferReturnTypes(MLIRContext *,
                                         std::optional<Location> loc,
                                         Adaptor adaptor,
                                         SmallVectorImpl<Type> &results) {
  auto data = tensorType(adaptor.getData());
  auto indices = tensorType(adaptor.getIndices());
  int64_t axis = static_cast<int64_t>(adaptor.getAxis());
  if (failed(checkAxis(loc, axis, data.getRank())))
    return failure();
  SmallVector<int64_t> shape(data.getShape().take_front(axis));
  llvm::append_range(shape, indices.getShape());
  llvm::append_range(shape, data.getShape().drop_front(axis + 1));
  results.push_back(RankedTensorType::get(shape, data.getElementType()));
  return success();
}

//===----------------------------------------------------------------------===//
// Reductions
//===----------------------------------------------------------------------===//

/// Shape of a reduction of `in` over `axes`, checking the axes.
static FailureOr<SmallVector<int64_t>> reducedShape(std::optional<Location> loc,
                                                    RankedTensorType in,
                                                    ArrayRef<int64_t> axes,
                                                    bool keepDims) {
  SmallVector<bool> reduced(in.getRank(), false);
  for (int64_t a : axes) {
    if (failed(checkAxis(loc, a, in.getRank(), "reduction axis")))
      return failure();
    if (reduced[a])
      return emitOptionalError(loc, "reduction axis ", a, " is repeated");
    reduced[a] = true;
  }
  SmallVector<int64_t> shape;
  for (int64_t d = 0; d < in.getRank(); ++d) {
    if (!reduced[d])
      shape.push_back(in.getDimSize(d));
    else if (keepDims)
      shape.push_back(1);
  }
  return shape;
}

#define PCC_REDUCE_INFER(OP)                                                   \
  LogicalResult OP::inferReturnTypes(                                          \
      MLIRContext *, std::optional<Location> loc, Adaptor adaptor,             \
      SmallVectorImpl<Type> &results) {                                        \
    auto in = tensorType(adaptor.getInput());                                  \
    auto shape =                                                               \
        reducedShape(loc, in, adaptor.getAxes(), adaptor.getKeepDims());       \
    if (failed(shape))                                                         \
      return failure();                                                        \
    results.push_back(RankedTensorType::get(*shape, in.getElementType()));     \
    return success();                                                          \
  }
PCC_REDUCE_INFER(ReduceSumOp)
PCC_REDUCE_INFER(ReduceMeanOp)
PCC_REDUCE_INFER(ReduceMaxOp)
PCC_REDUCE_INFER(ReduceMinOp)
PCC_REDUCE_INFER(ReduceProdOp)
#undef PCC_REDUCE_INFER

LogicalResult ArgMaxOp::inferReturnTypes(MLIRContext *ctx,
                                         std::optional<Location> loc,
                                         Adaptor adaptor,
                                         SmallVectorImpl<Type> &results) {
  auto in = tensorType(adaptor.getInput());
  int64_t axis = static_cast<int64_t>(adaptor.getAxis());
  auto shape = reducedShape(loc, in, {axis}, adaptor.getKeepDims());
  if (failed(shape))
    return failure();
  results.push_back(RankedTensorType::get(*shape, IntegerType::get(ctx, 64)));
  return success();
}

//===----------------------------------------------------------------------===//
// Convolution and pooling
//===----------------------------------------------------------------------===//

/// Checks the window attributes of a conv or pool over `spatial` dimensions
/// and computes the spatial output sizes.
static FailureOr<SmallVector<int64_t>>
windowShape(std::optional<Location> loc, RankedTensorType in,
            ArrayRef<int64_t> kernel, ArrayRef<int64_t> strides,
            ArrayRef<int64_t> pads, ArrayRef<int64_t> dilations,
            bool ceilMode) {
  int64_t spatial = in.getRank() - 2;
  if (spatial < 1 || spatial > 3)
    return emitOptionalError(loc,
                             "input rank: needs N x C with 1 to 3 "
                             "spatial dimensions, got rank ",
                             in.getRank());
  if (static_cast<int64_t>(kernel.size()) != spatial ||
      static_cast<int64_t>(strides.size()) != spatial ||
      static_cast<int64_t>(dilations.size()) != spatial ||
      static_cast<int64_t>(pads.size()) != 2 * spatial)
    return emitOptionalError(loc, "window attributes: need ", spatial,
                             " kernel sizes, strides and dilations and ",
                             2 * spatial, " pads");
  SmallVector<int64_t> out;
  for (int64_t d = 0; d < spatial; ++d) {
    if (kernel[d] < 1 || strides[d] < 1 || dilations[d] < 1 || pads[d] < 0 ||
        pads[d + spatial] < 0)
      return emitOptionalError(loc, "window attributes: kernel, stride and "
                                    "dilation must be positive and pads "
                                    "non-negative");
    int64_t size =
        windowOutputSize(in.getDimSize(d + 2), kernel[d], strides[d], pads[d],
                         pads[d + spatial], dilations[d], ceilMode);
    if (size < 1)
      return emitOptionalError(loc, "window: kernel of size ", kernel[d],
                               " does not fit spatial dimension ", d,
                               " of size ", in.getDimSize(d + 2));
    out.push_back(size);
  }
  return out;
}

LogicalResult ConvOp::inferReturnTypes(MLIRContext *,
                                       std::optional<Location> loc,
                                       Adaptor adaptor,
                                       SmallVectorImpl<Type> &results) {
  auto in = tensorType(adaptor.getInput());
  auto w = tensorType(adaptor.getWeight());
  int64_t groups = static_cast<int64_t>(adaptor.getGroups());
  if (w.getRank() != in.getRank())
    return emitOptionalError(loc, "weight rank: weight has rank ", w.getRank(),
                             " for an input of rank ", in.getRank());
  if (groups < 1 || in.getDimSize(1) % groups || w.getDimSize(0) % groups)
    return emitOptionalError(loc, "groups: ", groups,
                             " must divide input channels ", in.getDimSize(1),
                             " and output channels ", w.getDimSize(0));
  if (w.getDimSize(1) * groups != in.getDimSize(1))
    return emitOptionalError(
        loc, "weight shape: expects ", in.getDimSize(1) / groups,
        " input channels per group, weight has ", w.getDimSize(1));
  if (Value bias = adaptor.getBias()) {
    auto b = tensorType(bias);
    if (b.getRank() != 1 || b.getDimSize(0) != w.getDimSize(0))
      return emitOptionalError(loc, "bias shape: needs ", w.getDimSize(0),
                               " entries, got ", b);
  }
  auto spatial = windowShape(loc, in, w.getShape().drop_front(2),
                             adaptor.getStrides(), adaptor.getPads(),
                             adaptor.getDilations(), /*ceilMode=*/false);
  if (failed(spatial))
    return failure();
  SmallVector<int64_t> shape{in.getDimSize(0), w.getDimSize(0)};
  llvm::append_range(shape, *spatial);
  results.push_back(RankedTensorType::get(shape, in.getElementType()));
  return success();
}

template <typename Adaptor>
static LogicalResult inferPool(std::optional<Location> loc, Adaptor adaptor,
                               SmallVectorImpl<Type> &results) {
  auto in = tensorType(adaptor.getInput());
  auto spatial = windowShape(loc, in, adaptor.getKernelShape(),
                             adaptor.getStrides(), adaptor.getPads(),
                             adaptor.getDilations(), adaptor.getCeilMode());
  if (failed(spatial))
    return failure();
  SmallVector<int64_t> shape{in.getDimSize(0), in.getDimSize(1)};
  llvm::append_range(shape, *spatial);
  results.push_back(RankedTensorType::get(shape, in.getElementType()));
  return success();
}

LogicalResult MaxPoolOp::inferReturnTypes(MLIRContext *,
                                          std::optional<Location> loc,
                                          Adaptor adaptor,
                                          SmallVectorImpl<Type> &results) {
  return inferPool(loc, adaptor, results);
}

LogicalResult AvgPoolOp::inferReturnTypes(MLIRContext *,
                                          std::optional<Location> loc,
                                          Adaptor adaptor,
                                          SmallVectorImpl<Type> &results) {
  return inferPool(loc, adaptor, results);
}

//===----------------------------------------------------------------------===//
// Sharded params and collectives
//===----------------------------------------------------------------------===//

LogicalResult ParamOp::verify() {
  ShardingAttr shard = getShardAttr();
  ShardingAttr within = getWithinAttr();
  if (within && (!shard || !shard.isFlat()))
    return emitOpError("within: only a flat shard is taken within a split");
  if (!shard) {
    if (getWhole())
      return emitOpError("has a whole shape (`of`) but no flat shard");
    return success();
  }
  if (shard.isFlat()) {
    FailureOr<int64_t> size = getMeshAxisSize(*this, shard.getAxis());
    if (failed(size))
      return failure();
    if (!getWhole())
      return emitOpError("shard: a flat shard needs the whole shape (`of`)");
    SmallVector<int64_t> whole(*getWhole());
    if (within) {
      // The flat shard is of this rank's piece of the split `within`.
      FailureOr<int64_t> ranks = getMeshAxisSize(*this, within.getAxis());
      if (failed(ranks))
        return failure();
      if (!within.isSplit() || within.getDim() >= static_cast<int64_t>(
                                                      whole.size()) ||
          whole[within.getDim()] % (*ranks * within.getStripes()) != 0)
        return emitOpError("within: ")
               << within << " does not split a tensor of shape ["
               << ArrayRef<int64_t>(whole) << "]";
      if (within.getAxis() == shard.getAxis())
        return emitOpError("within: the split and the flat shard are over "
                           "the same mesh axis '")
               << shard.getAxis() << "'";
      whole[within.getDim()] /= *ranks;
    }
    int64_t elements = ShapedType::getNumElements(whole);
    int64_t piece = (elements + *size - 1) / *size;
    if (getType() != RankedTensorType::get({piece}, getType().getElementType()))
      return emitOpError("shard: a flat shard of ")
             << elements << " elements over " << *size << " ranks is a "
             << RankedTensorType::get({piece}, getType().getElementType())
             << ", not " << getType();
    return success();
  }
  if (getWhole())
    return emitOpError("has a whole shape (`of`) but no flat shard");
  if (!shard.isSplit())
    return emitOpError("shard: a stored weight can only be split, got ")
           << shard;
  FailureOr<int64_t> size = getMeshAxisSize(*this, shard.getAxis());
  if (failed(size))
    return failure();
  RankedTensorType type = getType();
  if (shard.getDim() >= type.getRank())
    return emitOpError("shard: dim ")
           << shard.getDim() << " is out of range for " << type;
  if (type.getDimSize(shard.getDim()) % shard.getStripes() != 0)
    return emitOpError("shard: the local dimension ")
           << shard.getDim() << " (" << type.getDimSize(shard.getDim())
           << ") does not divide into " << shard.getStripes() << " stripes";
  return success();
}

LogicalResult BucketStartOp::verify() {
  if (getBucket().getType().getRank() != 1)
    return emitOpError("bucket: a gradient bucket is 1-D, not ")
           << getBucket().getType();
  if (std::optional<ArrayRef<int64_t>> scatter = getScatter())
    if (scatter->size() % 2 != 0)
      return emitOpError("scatter: pairs of an offset and a piece size, got ")
             << scatter->size() << " numbers";
  return success();
}

LogicalResult BucketStartOp::verifyAxisSize(int64_t ranks) {
  std::optional<ArrayRef<int64_t>> scatter = getScatter();
  for (size_t i = 0; scatter && i + 1 < scatter->size(); i += 2) {
    int64_t offset = (*scatter)[i], piece = (*scatter)[i + 1];
    if (offset < 0 || piece < 1 ||
        offset + ranks * piece > getBucket().getType().getNumElements())
      return emitOpError("scatter: segment at ")
             << offset << " of " << ranks << " x " << piece
             << " elements is outside the bucket " << getBucket().getType();
  }
  return success();
}

/// Checks that `stacked` is `[size] + piece` for mesh axis `axis` of size
/// `size`.
static LogicalResult verifyStacked(Operation *op, StringRef axis, int64_t size,
                                   RankedTensorType piece,
                                   RankedTensorType stacked) {
  SmallVector<int64_t> expected{size};
  llvm::append_range(expected, piece.getShape());
  if (stacked.getShape() != ArrayRef<int64_t>(expected) ||
      stacked.getElementType() != piece.getElementType())
    return op->emitOpError("the stacked tensor must be ")
           << RankedTensorType::get(expected, piece.getElementType()) << " for "
           << size << " ranks of '" << axis << "', got " << stacked;
  return success();
}

LogicalResult AllGatherOp::verifyAxisSize(int64_t size) {
  return verifyStacked(*this, getAxis(), size, getInput().getType(), getType());
}

LogicalResult ReduceScatterOp::verifyAxisSize(int64_t size) {
  return verifyStacked(*this, getAxis(), size, getType(), getInput().getType());
}

/// A started collective's result holds nothing until its wait: only that
/// one pcc.wait_collectives may use it.
static LogicalResult verifyWaitedFor(Operation *op) {
  Value result = op->getResult(0);
  if (!result.hasOneUse() ||
      !isa<WaitCollectivesOp>(*result.getUsers().begin()))
    return op->emitOpError("the result must be used by one "
                           "pcc.wait_collectives and nothing else");
  return success();
}

LogicalResult ReduceScatterStartOp::verify() { return verifyWaitedFor(*this); }

LogicalResult ReduceScatterStartOp::verifyAxisSize(int64_t size) {
  return verifyStacked(*this, getAxis(), size, getType(), getInput().getType());
}

//===----------------------------------------------------------------------===//
// mesh
//===----------------------------------------------------------------------===//

std::optional<int64_t> MeshOp::getAxisSize(StringRef axis) {
  for (auto [name, size] : llvm::zip(getAxes(), getShape()))
    if (cast<StringAttr>(name).getValue() == axis)
      return size;
  return std::nullopt;
}

LogicalResult MeshOp::verify() {
  if (getAxes().size() != getShape().size())
    return emitOpError("axes: ") << getAxes().size() << " names for "
                                 << getShape().size() << " sizes";
  llvm::SmallSet<StringRef, 4> seen;
  for (auto [name, size] : llvm::zip(getAxes(), getShape())) {
    StringRef axis = cast<StringAttr>(name).getValue();
    if (axis.empty() || !seen.insert(axis).second)
      return emitOpError("axes: '") << axis << "' is empty or named twice";
    if (size < 1)
      return emitOpError("axes: '") << axis << "' needs a size >= 1, got "
                                    << size;
  }
  auto module = (*this)->getParentOfType<ModuleOp>();
  for (auto other : module.getOps<MeshOp>())
    if (other != *this)
      return emitOpError("module: one pcc.mesh per module");
  return success();
}

LogicalResult AllGatherStartOp::verify() { return verifyWaitedFor(*this); }

LogicalResult AllGatherStartOp::verifyAxisSize(int64_t size) {
  return verifyStacked(*this, getAxis(), size, getInput().getType(), getType());
}

LogicalResult WaitCollectivesOp::verify() {
  if (getStarted().size() != getResults().size())
    return emitOpError("has ") << getStarted().size() << " started values but "
                               << getResults().size() << " results";
  for (auto [started, result] : llvm::zip(getStarted(), getResults())) {
    Operation *start = started.getDefiningOp();
    if (!isa_and_nonnull<ReduceScatterStartOp, AllGatherStartOp>(start) ||
        start->getAttrOfType<StringAttr>("axis").getValue() != getAxis())
      return emitOpError("started operand is not a collective started over '")
             << getAxis() << "'";
    if (started.getType() != result.getType())
      return emitOpError("result type ")
             << result.getType() << " differs from its started value's "
             << started.getType();
    if (!llvm::is_contained(getReading(), start->getOperand(0)))
      return emitOpError("does not keep the input of a collective it "
                         "completes ('reading' lacks it)");
  }
  return success();
}

LogicalResult BucketWaitOp::verify() {
  if (getBucket().getType().getRank() != 1)
    return emitOpError("bucket: a gradient bucket is 1-D, not ")
           << getBucket().getType();
  return success();
}

LogicalResult ShardGatherOp::verify() {
  RankedTensorType data = getData().getType();
  int64_t axis = static_cast<int64_t>(getAxis());
  if (failed(checkAxis(getLoc(), axis, data.getRank())))
    return failure();
  SmallVector<int64_t> shape(data.getShape().take_front(axis));
  llvm::append_range(shape, getIndices().getType().getShape());
  llvm::append_range(shape, data.getShape().drop_front(axis + 1));
  auto expected = RankedTensorType::get(shape, data.getElementType());
  if (expected != getType())
    return emitOpError("result must be ") << expected << ", got " << getType();
  return success();
}

LogicalResult TransferOp::verify() {
  FailureOr<int64_t> stages = getPipelineStageCount(*this);
  if (failed(stages))
    return failure();
  int64_t from = static_cast<int64_t>(getFrom()),
          to = static_cast<int64_t>(getTo());
  if (from < 0 || to >= *stages || from >= to)
    return emitOpError("goes from stage ")
           << from << " to stage " << to << "; stages run forward, in [0, "
           << *stages << ")";
  return success();
}

LogicalResult ShardSliceOp::verify() {
  RankedTensorType in = getInput().getType();
  int64_t dim = getDim(), stripes = getStripes();
  if (dim < 0 || dim >= in.getRank() || stripes < 1)
    return emitOpError("dim ")
           << dim << " / stripes " << stripes << " do not fit " << in;
  return success();
}

LogicalResult ShardSliceOp::verifyAxisSize(int64_t size) {
  RankedTensorType in = getInput().getType(), out = getType();
  int64_t dim = getDim(), stripes = getStripes();
  if (dim < 0 || dim >= in.getRank() || stripes < 1)
    return success(); // verify() says so
  SmallVector<int64_t> expected(in.getShape());
  if (expected[dim] % (stripes * size) != 0)
    return emitOpError("dimension ")
           << dim << " (" << expected[dim] << ") does not divide into "
           << stripes << " stripe(s) x " << size << " ranks";
  expected[dim] /= size;
  if (out.getShape() != ArrayRef<int64_t>(expected) ||
      out.getElementType() != in.getElementType())
    return emitOpError("result must be ")
           << RankedTensorType::get(expected, in.getElementType()) << ", got "
           << out;
  return success();
}

//===----------------------------------------------------------------------===//
// Gradients and training
//===----------------------------------------------------------------------===//

/// A scatter-add's shapes: updates = table[:axis] + indices +
/// table[axis+1:], as gather's result (for shard_scatter_add, `table` is
/// this rank's block: only the scattered dimension differs).
static LogicalResult verifyScatterAdd(Operation *op, RankedTensorType updates,
                                      RankedTensorType indices,
                                      RankedTensorType table, int64_t axis) {
  if (axis < 0 || axis >= table.getRank())
    return op->emitOpError("axis ")
           << axis << " is outside the result's rank " << table.getRank();
  // updates = table[:axis] + indices + table[axis+1:], as gather's result.
  SmallVector<int64_t> expected(table.getShape().take_front(axis));
  llvm::append_range(expected, indices.getShape());
  llvm::append_range(expected, table.getShape().drop_front(axis + 1));
  if (ArrayRef<int64_t>(expected) != updates.getShape() ||
      updates.getElementType() != table.getElementType())
    return op->emitOpError("updates ")
           << updates << " are not what gathering " << indices << " from "
           << table << " along axis " << axis << " gives";
  return success();
}

LogicalResult ScatterAddOp::verify() {
  return verifyScatterAdd(*this, getUpdates().getType(), getIndices().getType(),
                          getType(), static_cast<int64_t>(getAxis()));
}

LogicalResult ShardScatterAddOp::verify() {
  return verifyScatterAdd(*this, getUpdates().getType(), getIndices().getType(),
                          getType(), static_cast<int64_t>(getAxis()));
}

LogicalResult DropoutOp::verify() {
  double ratio = getRatio().convertToDouble();
  if (!(ratio >= 0.0 && ratio < 1.0))
    return emitOpError("ratio ") << ratio << " is outside [0, 1)";
  if (getStream() < 0 || getStream() > 0xFFFFFFFFll)
    return emitOpError("stream ") << getStream()
                                  << " is outside [0, 2^32)";
  return success();
}

/// Gradient ops of a convolution of `in` by `w` giving `out`: the shapes
/// must be the convolution's.
static LogicalResult verifyConvGrad(Operation *op, RankedTensorType in,
                                    RankedTensorType w, RankedTensorType out,
                                    ArrayRef<int64_t> strides,
                                    ArrayRef<int64_t> pads,
                                    ArrayRef<int64_t> dilations,
                                    int64_t groups) {
  if (w.getRank() != in.getRank() || out.getRank() != in.getRank())
    return op->emitOpError("input, weight and gradient need the same rank");
  if (groups < 1 || in.getDimSize(1) % groups || w.getDimSize(0) % groups ||
      w.getDimSize(1) * groups != in.getDimSize(1))
    return op->emitOpError("groups ")
           << groups << " do not fit input " << in << " and weight " << w;
  auto spatial = windowShape(op->getLoc(), in, w.getShape().drop_front(2),
                             strides, pads, dilations, /*ceilMode=*/false);
  if (failed(spatial))
    return failure();
  SmallVector<int64_t> shape{in.getDimSize(0), w.getDimSize(0)};
  llvm::append_range(shape, *spatial);
  if (ArrayRef<int64_t>(shape) != out.getShape())
    return op->emitOpError("gradient ")
           << out << " is not shaped like the convolution's result of "
           << in << " by " << w;
  return success();
}

LogicalResult ConvGradInputOp::verify() {
  return verifyConvGrad(*this, getType(), getWeight().getType(),
                        getGrad().getType(), getStrides(), getPads(),
                        getDilations(), getGroups());
}

LogicalResult ConvGradWeightOp::verify() {
  return verifyConvGrad(*this, getInput().getType(), getType(),
                        getGrad().getType(), getStrides(), getPads(),
                        getDilations(), getGroups());
}

/// Gradient ops of a pooling of `in`: `grad` must be shaped like its result.
template <typename OpTy>
static LogicalResult verifyPoolGrad(OpTy op, RankedTensorType in,
                                    RankedTensorType grad) {
  auto spatial = windowShape(op.getLoc(), in, op.getKernelShape(),
                             op.getStrides(), op.getPads(), op.getDilations(),
                             op.getCeilMode());
  if (failed(spatial))
    return failure();
  SmallVector<int64_t> shape{in.getDimSize(0), in.getDimSize(1)};
  llvm::append_range(shape, *spatial);
  if (ArrayRef<int64_t>(shape) != grad.getShape())
    return op.emitOpError("gradient ")
           << grad << " is not shaped like the pooling's result of " << in;
  return success();
}

LogicalResult MaxPoolGradOp::verify() {
  return verifyPoolGrad(*this, getInput().getType(), getGrad().getType());
}

LogicalResult AvgPoolGradOp::verify() {
  return verifyPoolGrad(*this, getType(), getGrad().getType());
}

LogicalResult PadOp::verify() {
  RankedTensorType in = getInput().getType(), out = getType();
  ArrayRef<int64_t> starts = getStarts(), steps = getSteps();
  if (in.getRank() != out.getRank() ||
      in.getElementType() != out.getElementType() ||
      static_cast<int64_t>(starts.size()) != in.getRank() ||
      static_cast<int64_t>(steps.size()) != in.getRank())
    return emitOpError("needs one start and step per dimension of ")
           << in << " and a result of the same rank and element type";
  for (int64_t d = 0; d < in.getRank(); ++d) {
    int64_t n = in.getDimSize(d);
    if (steps[d] == 0)
      return emitOpError("step of dimension ") << d << " is zero";
    int64_t last = starts[d] + (n - 1) * steps[d];
    if (n > 0 && (starts[d] < 0 || starts[d] >= out.getDimSize(d) ||
                  last < 0 || last >= out.getDimSize(d)))
      return emitOpError("dimension ")
             << d << ": " << n << " elements from " << starts[d]
             << " by steps of " << steps[d] << " do not fit in "
             << out.getDimSize(d);
  }
  return success();
}

/// [N, V] logits, [N] labels: the shapes of the cross-entropy ops.
static LogicalResult verifyCrossEntropy(Operation *op, RankedTensorType logits,
                                        RankedTensorType labels) {
  if (logits.getRank() != 2 || labels.getRank() != 1 ||
      labels.getDimSize(0) != logits.getDimSize(0))
    return op->emitOpError("takes [N, V] logits and [N] labels, not ")
           << logits << " and " << labels;
  return success();
}

/// The type cross-entropy computes in: the logits', f32 for bf16 logits
/// (widened exactly).
static Type lossElement(RankedTensorType logits) {
  Type e = logits.getElementType();
  return e.isBF16() ? Float32Type::get(e.getContext()) : e;
}

LogicalResult CrossEntropyOp::verify() {
  RankedTensorType logits = getLogits().getType();
  if (failed(verifyCrossEntropy(*this, logits, getLabels().getType())))
    return failure();
  if (getType() !=
      RankedTensorType::get({logits.getDimSize(0)}, lossElement(logits)))
    return emitOpError("gives one loss per row: ")
           << logits.getDimSize(0) << " of " << lossElement(logits);
  return success();
}

LogicalResult CrossEntropyGradOp::verify() {
  RankedTensorType logits = getLogits().getType();
  if (failed(verifyCrossEntropy(*this, logits, getLabels().getType())))
    return failure();
  Type loss = lossElement(logits);
  // bf16 logits' gradient: f32, or rounded once to bf16.
  bool resultOk = getType() == logits || getType() == logits.clone(loss);
  if (getGrad().getType() !=
          RankedTensorType::get({logits.getDimSize(0)}, loss) ||
      !resultOk)
    return emitOpError("takes one gradient per row in ")
           << loss << " and gives the logits' shape in their type";
  return success();
}

/// The shapes of the linear cross-entropy ops: [N, D] hidden states, a
/// [V, D] (transpose_w) or [D, V] weight of their type, [N] labels and [N]
/// row statistics in f32 (f64 for f64 hidden states).
static LogicalResult
verifyLinearCrossEntropy(Operation *op, RankedTensorType hidden,
                         RankedTensorType weight, RankedTensorType labels,
                         bool transposeW, ArrayRef<Value> statistics) {
  if (hidden.getRank() != 2 || weight.getRank() != 2 || labels.getRank() != 1)
    return op->emitOpError("takes [N, D] hidden states, a rank-2 weight and "
                           "[N] labels, not ")
           << hidden << ", " << weight << " and " << labels;
  int64_t rows = hidden.getDimSize(0), dim = hidden.getDimSize(1);
  if (weight.getDimSize(transposeW ? 1 : 0) != dim)
    return op->emitOpError("weight ")
           << weight << " does not contract with the hidden states' " << dim
           << (transposeW ? " (it is [V, D] with transpose_w)"
                          : " (it is [D, V] without transpose_w)");
  if (weight.getElementType() != hidden.getElementType())
    return op->emitOpError("weight ")
           << weight << " is not of the hidden states' type";
  if (labels.getDimSize(0) != rows)
    return op->emitOpError("takes one label per row: ")
           << labels << " for " << rows << " rows";
  Type stat = hidden.getElementType().isF64()
                  ? Type(Float64Type::get(op->getContext()))
                  : Type(Float32Type::get(op->getContext()));
  auto expected = RankedTensorType::get({rows}, stat);
  for (Value v : statistics)
    if (v.getType() != expected)
      return op->emitOpError("row statistics and their gradients are ")
             << expected << ", not " << v.getType();
  return success();
}

LogicalResult LinearCrossEntropyOp::verify() {
  return verifyLinearCrossEntropy(*this, getHidden().getType(),
                                  getWeight().getType(), getLabels().getType(),
                                  getTransposeW(), {getLse(), getTarget()});
}

LogicalResult LinearCrossEntropyGradOp::verify() {
  if (failed(verifyLinearCrossEntropy(
          *this, getHidden().getType(), getWeight().getType(),
          getLabels().getType(), getTransposeW(),
          {getLse(), getGradLse(), getGradTarget()})))
    return failure();
  if (getGradHidden().getType() != getHidden().getType() ||
      getGradWeight().getType() != getWeight().getType())
    return emitOpError("gives gradients of the hidden states' and the "
                       "weight's types");
  return success();
}

/// The shapes of the attention ops: q [B, Hq, S, D], k [B, Hkv, L, D],
/// v [B, Hkv, L, Dv] with Hkv dividing Hq, a rank-4 bias broadcasting to
/// [B, Hq, S, L] in f32 or q's type, and the row statistics [B, Hq, S] in
/// f32 (f64 for f64 q).
static LogicalResult verifyAttention(Operation *op, RankedTensorType q,
                                     RankedTensorType k, RankedTensorType v,
                                     Value bias, RankedTensorType lse) {
  if (q.getRank() != 4 || k.getRank() != 4 || v.getRank() != 4)
    return op->emitOpError("takes [B, H, S, D] q, k and v, not ")
           << q << ", " << k << " and " << v;
  int64_t batch = q.getDimSize(0), hq = q.getDimSize(1), hkv = k.getDimSize(1);
  if (k.getDimSize(0) != batch || v.getDimSize(0) != batch ||
      k.getDimSize(3) != q.getDimSize(3) || v.getDimSize(1) != hkv ||
      v.getDimSize(2) != k.getDimSize(2) || hkv == 0 || hq % hkv != 0)
    return op->emitOpError("q ")
           << q << ", k " << k << " and v " << v
           << " do not fit together (k and v share their heads and length, "
              "their heads divide q's)";
  if (k.getElementType() != q.getElementType() ||
      v.getElementType() != q.getElementType())
    return op->emitOpError("takes q, k and v of one element type");
  Type f32 = Float32Type::get(op->getContext());
  Type stat = q.getElementType().isF64() ? q.getElementType() : f32;
  if (bias) {
    auto b = cast<RankedTensorType>(bias.getType());
    SmallVector<int64_t> scores = {batch, hq, q.getDimSize(2), k.getDimSize(2)};
    bool fits = b.getRank() == 4;
    for (int64_t d = 0; fits && d < 4; ++d)
      fits = b.getDimSize(d) == 1 || b.getDimSize(d) == scores[d];
    if (!fits)
      return op->emitOpError("bias ")
             << b << " does not broadcast to the scores "
             << RankedTensorType::get(scores, q.getElementType());
    if (b.getElementType() != stat && b.getElementType() != q.getElementType())
      return op->emitOpError("takes a bias in ") << stat << " or q's type";
  }
  if (lse != RankedTensorType::get(q.getShape().drop_back(), stat))
    return op->emitOpError("keeps one log-sum-exp per query row: ")
           << RankedTensorType::get(q.getShape().drop_back(), stat) << ", not "
           << lse;
  return success();
}

LogicalResult AttentionOp::verify() {
  RankedTensorType q = getQ().getType(), v = getV().getType();
  if (failed(verifyAttention(*this, q, getK().getType(), v, getBias(),
                             getLse().getType())))
    return failure();
  SmallVector<int64_t> shape(q.getShape());
  shape[3] = v.getDimSize(3);
  if (getResult().getType() != q.clone(shape))
    return emitOpError("gives ") << q.clone(shape) << ", not "
                                 << getResult().getType();
  return success();
}

LogicalResult AttentionGradOp::verify() {
  RankedTensorType q = getQ().getType(), k = getK().getType(),
                   v = getV().getType();
  if (failed(verifyAttention(*this, q, k, v, getBias(), getLse().getType())))
    return failure();
  SmallVector<int64_t> shape(q.getShape());
  shape[3] = v.getDimSize(3);
  if (getOut().getType() != q.clone(shape) ||
      getGrad().getType() != q.clone(shape))
    return emitOpError("takes the forward result and its gradient as ")
           << q.clone(shape);
  if (getDq().getType() != q || getDk().getType() != k ||
      getDv().getType() != v)
    return emitOpError("gives gradients of q, k and v's types");
  return success();
}

/// In-place ops write model state: their state operands are `pcc.param`s.
static LogicalResult verifyState(Operation *op, ArrayRef<Value> states) {
  for (Value state : states)
    if (!state.getDefiningOp<ParamOp>())
      return op->emitOpError("writes model state in place: operand ")
             << "must be a pcc.param, not a computed value";
  return success();
}

LogicalResult AccumulateOp::verify() {
  if (getState().getType() != getValue().getType())
    return emitOpError("adds a ") << getValue().getType() << " into a "
                                  << getState().getType();
  return verifyState(*this, {getState()});
}

LogicalResult EmaUpdateOp::verify() {
  double m = getMomentum().convertToDouble();
  if (!(m >= 0.0 && m <= 1.0))
    return emitOpError("momentum ") << m << " is outside [0, 1]";
  return verifyState(*this, {getState()});
}

LogicalResult ZeroOp::verify() { return verifyState(*this, {getState()}); }

LogicalResult AssignOp::verify() { return verifyState(*this, {getState()}); }

/// Optimizer updates: every tensor has the weight's type; norm is a scalar.
static LogicalResult verifyUpdate(Operation *op, ArrayRef<Value> states,
                                  Value grad, Value norm) {
  Type type = states.front().getType();
  SmallVector<Value> all(states);
  all.push_back(grad);
  for (Value v : all)
    if (v.getType() != type)
      return op->emitOpError("takes tensors of the weight's type ") << type;
  auto normType = cast<RankedTensorType>(norm.getType());
  if (normType.getRank() != 0 || !normType.getElementType().isF32())
    return op->emitOpError("takes the gradient norm as a tensor<f32>");
  return verifyState(op, states);
}

LogicalResult SgdUpdateOp::verify() {
  return verifyUpdate(*this, {getParam(), getMomentumBuffer()}, getGrad(),
                      getNorm());
}

/// A weight's 16-bit copy: its shape, bf16 or f16, model state.
static LogicalResult verifyCopy(Operation *op, Value copy, Value weight) {
  auto c = cast<RankedTensorType>(copy.getType());
  auto w = cast<RankedTensorType>(weight.getType());
  if (c.getShape() != w.getShape() || !w.getElementType().isF32() ||
      !(c.getElementType().isBF16() || c.getElementType().isF16()))
    return op->emitOpError("writes a bf16 or f16 copy of an f32 weight of ")
           << "its shape, not " << c << " of " << w;
  return verifyState(op, {copy});
}

LogicalResult AdamwUpdateOp::verify() {
  if (getCopy() && failed(verifyCopy(*this, getCopy(), getParam())))
    return failure();
  // A bf16 gradient of an f32 weight is read widened.
  Value grad = getGrad();
  auto g = cast<RankedTensorType>(grad.getType());
  auto p = cast<RankedTensorType>(getParam().getType());
  if (g.getElementType().isBF16() && p.getElementType().isF32()) {
    if (g.getShape() != p.getShape())
      return emitOpError("takes a gradient of the weight's shape ")
             << p.getShape();
    grad = getParam();
  }
  return verifyUpdate(*this, {getParam(), getExpAvg(), getExpAvgSq()}, grad,
                      getNorm());
}

LogicalResult SumSquaresOp::verify() {
  auto result = cast<RankedTensorType>(getType());
  Type e = cast<RankedTensorType>(getInput().getType()).getElementType();
  if (result.getRank() != 0 || !result.getElementType().isF32() ||
      !(e.isF32() || e.isBF16()))
    return emitOpError("sums the squares of an f32 or bf16 tensor into a "
                       "tensor<f32>");
  return success();
}

LogicalResult RefreshCopyOp::verify() {
  return verifyCopy(*this, getCopy(), getWeight());
}
