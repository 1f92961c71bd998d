//===- PccFolds.cpp - pcc folders and canonicalization patterns -----------===//
//
// Cheap local simplifications only: identities (reshape to the same type,
// identity transposes, x + 0, x * 1), constant reshapes and splat broadcasts,
// arithmetic, comparisons and casts of float splats (the constants that
// gradients of the exporters' decompositions make: pow's exponent - 1, its
// mask), selects on a splat condition,
// merging chains of reshapes and transposes, and the exporters' NaN guard
// around softmax.
//
//===----------------------------------------------------------------------===//

#include "pcc/Dialect/Pcc/IR/PccDialect.h"

#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/Matchers.h"
#include "mlir/IR/PatternMatch.h"

using namespace mlir;
using namespace mlir::pcc;

OpFoldResult ConstantOp::fold(FoldAdaptor) { return getValue(); }

/// Whether `attr` is a splat constant equal to `value`.
static bool isSplatOf(Attribute attr, double value) {
  auto splat = dyn_cast_if_present<SplatElementsAttr>(attr);
  if (!splat)
    return false;
  Type elementType = splat.getElementType();
  if (isa<FloatType>(elementType))
    return splat.getSplatValue<APFloat>().convertToDouble() == value;
  if (elementType.isInteger(1))
    return false;
  if (isa<IntegerType>(elementType))
    return splat.getSplatValue<APInt>().getSExtValue() ==
           static_cast<int64_t>(value);
  return false;
}

/// The value of a float splat constant.
static std::optional<double> floatSplat(Attribute attr) {
  auto splat = dyn_cast_if_present<SplatElementsAttr>(attr);
  if (!splat || !isa<FloatType>(splat.getElementType()))
    return std::nullopt;
  return splat.getSplatValue<APFloat>().convertToDouble();
}

/// An elementwise op of two float splats, folded to the splat the back
/// ends would compute: +, -, * and / in double rounded to f32 are f32's
/// own (double holds more than twice f32's digits), and a 16-bit result is
/// computed in f32 and rounded again, as the generated code does.
static Attribute
foldFloatSplats(Type resultType, Attribute lhs, Attribute rhs,
                llvm::function_ref<double(double, double)> fn) {
  std::optional<double> a = floatSplat(lhs), b = floatSplat(rhs);
  auto type = dyn_cast<RankedTensorType>(resultType);
  if (!a || !b || !type)
    return {};
  auto element = cast<FloatType>(type.getElementType());
  APFloat value(fn(*a, *b));
  bool losesInfo = false;
  if (!element.isF64())
    value.convert(APFloat::IEEEsingle(), APFloat::rmNearestTiesToEven,
                  &losesInfo);
  if (!element.isF64() && !element.isF32())
    value.convert(element.getFloatSemantics(), APFloat::rmNearestTiesToEven,
                  &losesInfo);
  return SplatElementsAttr::get(type, value);
}

OpFoldResult SubOp::fold(FoldAdaptor adaptor) {
  if (isSplatOf(adaptor.getRhs(), 0.0))
    return getLhs();
  return foldFloatSplats(getType(), adaptor.getLhs(), adaptor.getRhs(),
                         [](double a, double b) { return a - b; });
}

OpFoldResult DivOp::fold(FoldAdaptor adaptor) {
  if (isSplatOf(adaptor.getRhs(), 1.0))
    return getLhs();
  return foldFloatSplats(getType(), adaptor.getLhs(), adaptor.getRhs(),
                         [](double a, double b) { return a / b; });
}

OpFoldResult CompareOp::fold(FoldAdaptor adaptor) {
  std::optional<double> a = floatSplat(adaptor.getLhs()),
                        b = floatSplat(adaptor.getRhs());
  auto type = dyn_cast<RankedTensorType>(getType());
  if (!a || !b || !type)
    return {};
  bool result = false;
  switch (getPredicate()) {
  case ComparePredicate::eq:
    result = *a == *b;
    break;
  case ComparePredicate::ne:
    result = *a != *b;
    break;
  case ComparePredicate::lt:
    result = *a < *b;
    break;
  case ComparePredicate::le:
    result = *a <= *b;
    break;
  case ComparePredicate::gt:
    result = *a > *b;
    break;
  case ComparePredicate::ge:
    result = *a >= *b;
    break;
  }
  return SplatElementsAttr::get(type, BoolAttr::get(getContext(), result));
}

OpFoldResult SelectOp::fold(FoldAdaptor adaptor) {
  auto condition =
      dyn_cast_if_present<SplatElementsAttr>(adaptor.getCondition());
  if (condition)
    return condition.getSplatValue<bool>() ? getTrueValue() : getFalseValue();
  if (getTrueValue() == getFalseValue())
    return getTrueValue();
  return {};
}

OpFoldResult AddOp::fold(FoldAdaptor adaptor) {
  if (Attribute folded =
          foldFloatSplats(getType(), adaptor.getLhs(), adaptor.getRhs(),
                          [](double a, double b) { return a + b; }))
    return folded;
  if (isSplatOf(adaptor.getRhs(), 0.0))
    return getLhs();
  if (isSplatOf(adaptor.getLhs(), 0.0))
    return getRhs();
  return {};
}

OpFoldResult MulOp::fold(FoldAdaptor adaptor) {
  if (Attribute folded =
          foldFloatSplats(getType(), adaptor.getLhs(), adaptor.getRhs(),
                          [](double a, double b) { return a * b; }))
    return folded;
  if (isSplatOf(adaptor.getRhs(), 1.0))
    return getLhs();
  if (isSplatOf(adaptor.getLhs(), 1.0))
    return getRhs();
  return {};
}

OpFoldResult CastOp::fold(FoldAdaptor adaptor) {
  if (getInput().getType() == getType())
    return getInput();
  // A float splat rounded to another float type, as the cast would.
  auto splat = dyn_cast_if_present<SplatElementsAttr>(adaptor.getInput());
  auto type = dyn_cast<RankedTensorType>(getType());
  if (!splat || !isa<FloatType>(splat.getElementType()) || !type ||
      !isa<FloatType>(type.getElementType()))
    return {};
  APFloat v = splat.getSplatValue<APFloat>();
  bool losesInfo = false;
  v.convert(cast<FloatType>(type.getElementType()).getFloatSemantics(),
            APFloat::rmNearestTiesToEven, &losesInfo);
  return SplatElementsAttr::get(type, v);
}

OpFoldResult ReshapeOp::fold(FoldAdaptor adaptor) {
  if (getInput().getType() == getType())
    return getInput();
  if (auto dense = dyn_cast_if_present<DenseElementsAttr>(adaptor.getInput()))
    return dense.reshape(getType());
  return {};
}

namespace {
/// reshape(reshape(x)) -> reshape(x).
struct MergeReshapes : OpRewritePattern<ReshapeOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(ReshapeOp op,
                                PatternRewriter &rewriter) const override {
    auto producer = op.getInput().getDefiningOp<ReshapeOp>();
    if (!producer)
      return rewriter.notifyMatchFailure(op, "input is not a reshape");
    rewriter.replaceOpWithNewOp<ReshapeOp>(op, op.getType(),
                                           producer.getInput());
    return success();
  }
};

/// transpose(transpose(x, p1), p2) -> transpose(x, p1 o p2).
struct MergeTransposes : OpRewritePattern<TransposeOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(TransposeOp op,
                                PatternRewriter &rewriter) const override {
    auto producer = op.getInput().getDefiningOp<TransposeOp>();
    if (!producer)
      return rewriter.notifyMatchFailure(op, "input is not a transpose");
    ArrayRef<int64_t> inner = producer.getPermutation();
    SmallVector<int64_t> composed;
    for (int64_t p : op.getPermutation())
      composed.push_back(inner[p]);
    rewriter.replaceOpWithNewOp<TransposeOp>(op, producer.getInput(), composed);
    return success();
  }
};

/// matmul(transpose(x)) -> matmul(x) with the operand's transpose flag
/// flipped, when the transpose swaps the two matrix dimensions only (as a
/// tied LM head that reads the embedding table transposed does).
struct FoldTransposeIntoMatmul : OpRewritePattern<MatmulOp> {
  using OpRewritePattern::OpRewritePattern;
  static TransposeOp swapsMatrixDims(Value v) {
    auto t = v.getDefiningOp<TransposeOp>();
    if (!t)
      return {};
    ArrayRef<int64_t> perm = t.getPermutation();
    int64_t r = perm.size();
    for (int64_t i = 0; i < r - 2; ++i)
      if (perm[i] != i)
        return {};
    return perm[r - 2] == r - 1 && perm[r - 1] == r - 2 ? t : TransposeOp();
  }
  LogicalResult matchAndRewrite(MatmulOp op,
                                PatternRewriter &rewriter) const override {
    TransposeOp lhs = swapsMatrixDims(op.getLhs()),
                rhs = swapsMatrixDims(op.getRhs());
    if (!lhs && !rhs)
      return rewriter.notifyMatchFailure(op, "no operand is transposed");
    rewriter.modifyOpInPlace(op, [&] {
      if (lhs) {
        op.getLhsMutable().assign(lhs.getInput());
        op.setTransposeA(!op.getTransposeA());
      }
      if (rhs) {
        op.getRhsMutable().assign(rhs.getInput());
        op.setTransposeB(!op.getTransposeB());
      }
    });
    return success();
  }
};

/// `select(is_nan(s), 0, s)` where `s` is a softmax (what both torch
/// exporters write for masked attention): one softmax that writes 0 where
/// it would give NaN, instead of a NaN scan and a select over the scores.
struct FoldNanGuardIntoSoftmax : OpRewritePattern<SelectOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(SelectOp op,
                                PatternRewriter &rewriter) const override {
    auto isNan = op.getCondition().getDefiningOp<IsNaNOp>();
    Operation *softmax = op.getFalseValue().getDefiningOp();
    if (!isNan || isNan.getInput() != op.getFalseValue() ||
        !isa_and_nonnull<SoftmaxOp, LogSoftmaxOp>(softmax))
      return rewriter.notifyMatchFailure(op, "not select(is_nan(s), _, s)");
    Attribute zero;
    // Positive zero only: -0.0 would differ in sign.
    auto splat = matchPattern(op.getTrueValue(), m_Constant(&zero))
                     ? dyn_cast<SplatElementsAttr>(zero)
                     : SplatElementsAttr();
    if (!splat || !splat.getSplatValue<APFloat>().isPosZero())
      return rewriter.notifyMatchFailure(op, "the NaN replacement is not 0");
    Operation *guarded = rewriter.clone(*softmax);
    guarded->setAttr("nan_to_zero", rewriter.getUnitAttr());
    rewriter.replaceOp(op, guarded->getResults());
    return success();
  }
};

/// A row gather from a table whose rows are B groups of R (a [B, R, ...]
/// tensor flattened, as exporters index a [batch, seq] mask with computed
/// positions), where index [t0, t...] picks row t0 * R + g(t...): each
/// batch entry reads only its own group. Gathering along axis 1 of the
/// [B, R, ...] view with indices g says so, and lets the sharding rules see
/// that batch entries stay apart (micro-batches, data parallelism).
struct GatherWithinGroups : OpRewritePattern<GatherOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(GatherOp op,
                                PatternRewriter &rewriter) const override {
    auto indicesType = op.getIndices().getType();
    auto dataType = op.getData().getType();
    DenseElementsAttr indices;
    if (op.getAxis() != 0 || indicesType.getRank() < 1 ||
        !matchPattern(op.getIndices(), m_Constant(&indices)))
      return rewriter.notifyMatchFailure(op, "not a row gather by constants");
    int64_t groups = indicesType.getDimSize(0), rows = dataType.getDimSize(0);
    if (groups < 2 || rows % groups != 0)
      return rewriter.notifyMatchFailure(op, "no group structure");
    int64_t perGroup = rows / groups;
    int64_t inner = indicesType.getNumElements() / groups;
    SmallVector<int64_t> values;
    for (APInt v : indices.getValues<APInt>()) {
      int64_t x = v.getSExtValue();
      values.push_back(x < 0 ? x + rows : x);
    }
    SmallVector<int64_t> within(values.begin(), values.begin() + inner);
    for (int64_t g = 0; g < groups; ++g)
      for (int64_t i = 0; i < inner; ++i) {
        int64_t x = values[g * inner + i];
        if (x / perGroup != g || x % perGroup != within[i])
          return rewriter.notifyMatchFailure(op, "rows cross groups");
      }
    SmallVector<int64_t> viewShape{groups, perGroup};
    llvm::append_range(viewShape, dataType.getShape().drop_front());
    Value view = ReshapeOp::create(
        rewriter, op.getLoc(),
        RankedTensorType::get(viewShape, dataType.getElementType()),
        op.getData());
    auto withinType = RankedTensorType::get(indicesType.getShape().drop_front(),
                                            indicesType.getElementType());
    SmallVector<APInt> withinValues;
    unsigned width = indicesType.getElementTypeBitWidth();
    for (int64_t x : within)
      withinValues.push_back(APInt(width, x, /*isSigned=*/true));
    Value withinIndices = ConstantOp::create(
        rewriter, op.getLoc(),
        DenseElementsAttr::get(withinType, withinValues));
    rewriter.replaceOpWithNewOp<GatherOp>(op, op.getType(), view,
                                          withinIndices,
                                          rewriter.getI64IntegerAttr(1));
    return success();
  }
};

/// A gather whose constant indices repeat along some dimension (the same
/// positions for every batch entry) looks up one copy and broadcasts it:
/// less work, and the sharding rules see that the lookup does not depend
/// on that dimension (a piece of it is a smaller broadcast).
struct GatherOnceAndBroadcast : OpRewritePattern<GatherOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(GatherOp op,
                                PatternRewriter &rewriter) const override {
    DenseElementsAttr indices;
    if (!matchPattern(op.getIndices(), m_Constant(&indices)))
      return rewriter.notifyMatchFailure(op, "indices are not constant");
    auto type = op.getIndices().getType();
    ArrayRef<int64_t> shape = type.getShape();
    SmallVector<APInt> values(indices.getValues<APInt>());
    SmallVector<int64_t> reduced(shape);
    bool any = false;
    for (int64_t d = 0; d < type.getRank(); ++d) {
      if (shape[d] < 2)
        continue;
      int64_t inner = 1;
      for (int64_t e = d + 1; e < type.getRank(); ++e)
        inner *= shape[e];
      bool uniform = true;
      for (size_t i = 0; i < values.size() && uniform; ++i)
        uniform = values[i] == values[i % inner + (i / (inner * shape[d])) *
                                                       inner * shape[d]];
      if (!uniform)
        continue;
      // Keep only index 0 along d.
      SmallVector<APInt> kept;
      for (size_t i = 0; i < values.size(); ++i)
        if ((i / inner) % shape[d] == 0)
          kept.push_back(values[i]);
      values = std::move(kept);
      reduced[d] = 1;
      shape = reduced;
      any = true;
    }
    if (!any)
      return rewriter.notifyMatchFailure(op, "no repeated dimension");
    auto smallType = RankedTensorType::get(reduced, type.getElementType());
    Value small = ConstantOp::create(rewriter, op.getLoc(),
                                     DenseElementsAttr::get(smallType, values));
    auto dataType = op.getData().getType();
    int64_t axis = op.getAxis();
    SmallVector<int64_t> resultShape(dataType.getShape().take_front(axis));
    llvm::append_range(resultShape, reduced);
    llvm::append_range(resultShape, dataType.getShape().drop_front(axis + 1));
    Value once = GatherOp::create(
        rewriter, op.getLoc(),
        RankedTensorType::get(resultShape, dataType.getElementType()),
        op.getData(), small, op.getAxisAttr());
    rewriter.replaceOpWithNewOp<BroadcastOp>(op, op.getType(), once);
    return success();
  }
};
} // namespace

/// This rank's block of a scatter-add along the scattered axis: each rank
/// adds only the rows its block holds (pcc.shard_scatter_add) instead of
/// every rank forming the whole table's gradient and slicing it (a
/// vocabulary-parallel embedding's gradient: 4.2 GB of Llama-3 70B's
/// table at tp 4 where each rank keeps 1.05 GB).
struct ScatterOnlyTheBlock : OpRewritePattern<ShardSliceOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(ShardSliceOp op,
                                PatternRewriter &rewriter) const override {
    auto scatter = op.getInput().getDefiningOp<ScatterAddOp>();
    if (!scatter || !scatter->hasOneUse() || op.getStripes() != 1 ||
        op.getDim() != static_cast<int64_t>(scatter.getAxis()))
      return failure();
    rewriter.replaceOpWithNewOp<ShardScatterAddOp>(
        op, op.getType(), scatter.getUpdates(), scatter.getIndices(),
        scatter.getAxisAttr(), op.getAxisAttr());
    rewriter.eraseOp(scatter);
    return success();
  }
};

void ShardSliceOp::getCanonicalizationPatterns(RewritePatternSet &patterns,
                                               MLIRContext *context) {
  patterns.add<ScatterOnlyTheBlock>(context);
}

void GatherOp::getCanonicalizationPatterns(RewritePatternSet &patterns,
                                           MLIRContext *context) {
  patterns.add<GatherWithinGroups, GatherOnceAndBroadcast>(context);
}

void SelectOp::getCanonicalizationPatterns(RewritePatternSet &patterns,
                                           MLIRContext *context) {
  patterns.add<FoldNanGuardIntoSoftmax>(context);
}

void MatmulOp::getCanonicalizationPatterns(RewritePatternSet &patterns,
                                           MLIRContext *context) {
  patterns.add<FoldTransposeIntoMatmul>(context);
}

void ReshapeOp::getCanonicalizationPatterns(RewritePatternSet &patterns,
                                            MLIRContext *context) {
  patterns.add<MergeReshapes>(context);
}

OpFoldResult TransposeOp::fold(FoldAdaptor) {
  for (auto [i, p] : llvm::enumerate(getPermutation()))
    if (static_cast<int64_t>(i) != p)
      return {};
  return getInput();
}

void TransposeOp::getCanonicalizationPatterns(RewritePatternSet &patterns,
                                              MLIRContext *context) {
  patterns.add<MergeTransposes>(context);
}

OpFoldResult BroadcastOp::fold(FoldAdaptor adaptor) {
  if (getInput().getType() == getType())
    return getInput();
  if (auto splat = dyn_cast_if_present<SplatElementsAttr>(adaptor.getInput()))
    return SplatElementsAttr::get(getType(), splat.getSplatValue<Attribute>());
  return {};
}

OpFoldResult SliceOp::fold(FoldAdaptor) {
  if (getInput().getType() != getType())
    return {};
  for (int64_t step : getSteps())
    if (step != 1)
      return {};
  return getInput();
}
