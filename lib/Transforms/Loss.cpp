//===- Loss.cpp - the training loss appended to @main ---------------------===//

#include "pcc/Dialect/Pcc/IR/PccDialect.h"
#include "pcc/Transforms/Passes.h"
#include "pcc/Transforms/Training.h"

#include "mlir/IR/Builders.h"

namespace mlir::pcc {
#define GEN_PASS_DEF_LOSS
#include "pcc/Transforms/Passes.h.inc"
} // namespace mlir::pcc

using namespace mlir;
using namespace mlir::pcc;

namespace {

struct LossPass : public mlir::pcc::impl::LossBase<LossPass> {
  using LossBase::LossBase;

  /// The LM head that produces the logits `y`, where the loss can take its
  /// product over: a matrix product of the hidden states (untransposed)
  /// and one rank-2 weight, read by nothing but the loss; f32, or bf16 /
  /// fp16 widened to f32 by one cast (pcc-autocast's head).
  static MatmulOp fusableHead(Value y) {
    if (!y.hasOneUse())
      return MatmulOp();
    if (auto widen = y.getDefiningOp<CastOp>()) {
      y = widen.getInput();
      Type narrow = cast<RankedTensorType>(y.getType()).getElementType();
      if (!y.hasOneUse() || !(narrow.isBF16() || narrow.isF16()))
        return MatmulOp();
    }
    auto head = y.getDefiningOp<MatmulOp>();
    Type element = cast<RankedTensorType>(y.getType()).getElementType();
    if (!head || head.getTransposeA() ||
        head.getRhs().getType().getRank() != 2 ||
        head.getLhs().getType().getElementType() != element ||
        head.getRhs().getType().getElementType() != element)
      return MatmulOp();
    return head;
  }

  /// The per-row cross-entropy of `head`'s logits against `labels` ([N]):
  /// lse - target from pcc.linear_cross_entropy, 0 where a label is
  /// ignored.
  Value buildLinearCrossEntropy(OpBuilder &b, MatmulOp head, Value labels) {
    Location loc = head.getLoc();
    RankedTensorType hidden = head.getLhs().getType();
    int64_t rows = cast<RankedTensorType>(labels.getType()).getDimSize(0);
    auto rowType = RankedTensorType::get({rows}, b.getF32Type());
    Value h = ReshapeOp::create(
        b, loc,
        RankedTensorType::get({rows, hidden.getShape().back()},
                              hidden.getElementType()),
        head.getLhs());
    auto fused = LinearCrossEntropyOp::create(
        b, loc, rowType, rowType, h, head.getRhs(), labels,
        static_cast<uint64_t>(ignoreIndex.getValue()), head.getTransposeB(),
        /*mesh_axis=*/nullptr);
    Value perRow = SubOp::create(b, loc, fused.getLse(), fused.getTarget());
    auto labelType = cast<RankedTensorType>(labels.getType());
    Value ignored = ConstantOp::create(
        b, loc,
        getSplatAttr(labelType, static_cast<double>(ignoreIndex.getValue())));
    Value kept =
        CompareOp::create(b, loc, ComparePredicate::ne, labels, ignored);
    Value zeros = ConstantOp::create(b, loc, getSplatAttr(rowType, 0.0));
    return SelectOp::create(b, loc, kept, perRow, zeros);
  }

  void runOnOperation() override {
    ModuleOp module = getOperation();
    auto main = module.lookupSymbol<func::FuncOp>("main");
    if (!main || !main.getBody().hasOneBlock()) {
      module.emitError("loss: expects a single-block func.func @main");
      return signalPassFailure();
    }
    if (kind != "cross_entropy" && kind != "mse" && kind != "none") {
      main.emitError("loss: unknown loss '")
          << kind << "' (cross_entropy, mse or none)";
      return signalPassFailure();
    }
    Block &block = main.getBody().front();
    auto ret = cast<func::ReturnOp>(block.getTerminator());
    if (ret.getNumOperands() == 0) {
      main.emitError("loss: the model has no output to train");
      return signalPassFailure();
    }
    Value y = ret.getOperand(0);
    auto yType = cast<RankedTensorType>(y.getType());
    Location loc = y.getLoc();
    auto floatType = dyn_cast<FloatType>(yType.getElementType());
    if (!floatType || !floatType.isF32()) {
      main.emitError("loss: the first output is ")
          << yType << "; training needs a float32 output";
      return signalPassFailure();
    }
    OpBuilder b(ret);
    auto scalar = RankedTensorType::get({}, floatType);
    // Where the batch lies in the output (pcc-split-batch), for the labels.
    IntegerAttr batchDim;
    if (DictionaryAttr attrs = main.getResultAttrDict(0))
      batchDim = attrs.getAs<IntegerAttr>("pcc.batch_dim");
    auto addLabels = [&](RankedTensorType type) -> Value {
      unsigned index = main.getNumArguments();
      SmallVector<NamedAttribute> attrs{
          b.getNamedAttr("pcc.name", b.getStringAttr("labels"))};
      if (batchDim)
        attrs.push_back(b.getNamedAttr("pcc.batch_dim", batchDim));
      if (failed(main.insertArgument(index, type,
                                     b.getDictionaryAttr(attrs), loc)))
        return Value();
      return block.getArgument(index);
    };

    Value loss;
    int64_t rows = 0;
    if (kind == "cross_entropy") {
      if (yType.getRank() < 1 || yType.getShape().back() < 1) {
        main.emitError("loss: cross_entropy needs logits with a class "
                       "dimension last; the first output is ")
            << yType;
        return signalPassFailure();
      }
      int64_t classes = yType.getShape().back();
      rows = yType.getNumElements() / classes;
      Value labels = addLabels(RankedTensorType::get(
          yType.getShape().drop_back(), b.getI64Type()));
      if (!labels)
        return signalPassFailure();
      Value flat = ReshapeOp::create(
          b, loc, RankedTensorType::get({rows}, b.getI64Type()), labels);
      Value perRow;
      bool fuse =
          fuseHeadBytes >= 0 && yType.getNumElements() * 4 >= fuseHeadBytes;
      if (MatmulOp head = fuse ? fusableHead(y) : MatmulOp()) {
        perRow = buildLinearCrossEntropy(b, head, flat);
      } else {
        Value logits = ReshapeOp::create(
            b, loc, RankedTensorType::get({rows, classes}, floatType), y);
        perRow = CrossEntropyOp::create(
            b, loc, RankedTensorType::get({rows}, floatType), logits, flat,
            static_cast<uint64_t>(ignoreIndex.getValue()));
      }
      loss = ReduceSumOp::create(b, loc, perRow, ArrayRef<int64_t>{0},
                                 /*keep_dims=*/false);
    } else if (kind == "mse") {
      Value target = addLabels(yType);
      if (!target)
        return signalPassFailure();
      Value diff = SubOp::create(b, loc, y, target);
      loss = buildSquaredSum(b, loc, diff);
    } else {
      if (yType.getNumElements() != 1) {
        main.emitError("loss: --loss=none needs the first output to be the "
                       "loss, a scalar; it is ")
            << yType;
        return signalPassFailure();
      }
      loss = yType.getRank() == 0 ? y : ReshapeOp::create(b, loc, scalar, y);
    }

    // @main now returns the loss alone.
    func::ReturnOp::create(b, ret.getLoc(), ValueRange{loss});
    ret.erase();
    SmallVector<Type> inputs(main.getArgumentTypes());
    main.setFunctionType(b.getFunctionType(inputs, {scalar}));
    main.setAllResultAttrs(ArrayRef<DictionaryAttr>{b.getDictionaryAttr(
        {b.getNamedAttr("pcc.name", b.getStringAttr("loss"))})});

    SmallVector<NamedAttribute> training{
        b.getNamedAttr("loss", b.getStringAttr(kind)),
        b.getNamedAttr("microbatches", b.getI64IntegerAttr(microbatches))};
    if (kind == "cross_entropy")
      training.push_back(b.getNamedAttr(
          "ignore_index", b.getI64IntegerAttr(ignoreIndex.getValue())));
    setTrainingAttr(module, training);
  }
};

} // namespace
