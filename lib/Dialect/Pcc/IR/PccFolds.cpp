//===- PccFolds.cpp - pcc folders and canonicalization patterns -----------===//
//
// Cheap local simplifications only: identities (reshape to the same type,
// identity transposes, x + 0, x * 1), constant reshapes and splat broadcasts,
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

OpFoldResult AddOp::fold(FoldAdaptor adaptor) {
  if (isSplatOf(adaptor.getRhs(), 0.0))
    return getLhs();
  if (isSplatOf(adaptor.getLhs(), 0.0))
    return getRhs();
  return {};
}

OpFoldResult MulOp::fold(FoldAdaptor adaptor) {
  if (isSplatOf(adaptor.getRhs(), 1.0))
    return getLhs();
  if (isSplatOf(adaptor.getLhs(), 1.0))
    return getRhs();
  return {};
}

OpFoldResult CastOp::fold(FoldAdaptor) {
  if (getInput().getType() == getType())
    return getInput();
  return {};
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
} // namespace

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
