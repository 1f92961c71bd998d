//===- TrainMode.cpp - torch.nn.Module.train() semantics ------------------===//
//
// pcc-train-mode: batch normalisation with batch statistics and running
// statistics updated in place (see Passes.td). The normalisation is written
// as reductions and elementwise ops, so pcc-autodiff differentiates it with
// their rules (checked by finite differences) and the fusion pass fuses the
// elementwise parts.
//
//===----------------------------------------------------------------------===//

#include "pcc/Dialect/Pcc/IR/PccDialect.h"
#include "pcc/Support/ShortestDecimal.h"
#include "pcc/Transforms/Passes.h"
#include "pcc/Transforms/Training.h"

namespace mlir::pcc {
#define GEN_PASS_DEF_TRAINMODE
#include "pcc/Transforms/Passes.h.inc"
} // namespace mlir::pcc

using namespace mlir;
using namespace mlir::pcc;

namespace {

LogicalResult toTrainingMode(BatchNormOp bn, int64_t dp) {
  auto mean = bn.getMean().getDefiningOp<ParamOp>();
  auto var = bn.getVariance().getDefiningOp<ParamOp>();
  if (!mean || !var)
    return bn.emitError("train mode: the running statistics of this batch "
                        "normalisation are computed in the graph, not "
                        "weights; pcc cannot update them while training");
  Value x = bn.getInput();
  auto type = cast<RankedTensorType>(x.getType());
  int64_t rank = type.getRank();
  if (rank < 2)
    return bn.emitError("train mode: batch normalisation needs N x C x ...");
  SmallVector<int64_t> axes{0}, statShape(rank, 1);
  // Values per channel over the global batch (every dp rank's rows).
  int64_t count = type.getDimSize(0) * dp;
  for (int64_t d = 2; d < rank; ++d) {
    axes.push_back(d);
    count *= type.getDimSize(d);
  }
  if (count < 2)
    return bn.emitError("train mode: batch normalisation over ")
           << count << " value per channel (a batch of "
           << type.getDimSize(0) * dp
           << "); training needs more than 1, as PyTorch";
  statShape[1] = type.getDimSize(1);

  OpBuilder b(bn);
  Location loc = bn.getLoc();
  auto statType = RankedTensorType::get(statShape, type.getElementType());
  auto full = [&](Value v) -> Value {
    return BroadcastOp::create(b, loc, type, v);
  };
  auto perChannel = [&](Value v) -> Value {
    return full(ReshapeOp::create(b, loc, statType, v));
  };
  auto splat = [&](RankedTensorType t, double value) -> Value {
    return ConstantOp::create(b, loc, getSplatAttr(t, value));
  };

  // The mean over the batch: this program's rows alone, or with data
  // parallelism every rank's (a local sum, summed over dp, over the global
  // count).
  auto batchAverage = [&](Value v) -> Value {
    if (dp == 1)
      return ReduceMeanOp::create(b, loc, v, axes, /*keep_dims=*/true);
    Value sum = ReduceSumOp::create(b, loc, v, axes, /*keep_dims=*/true);
    sum = AllReduceOp::create(b, loc, sum, b.getStringAttr(kDataParallelAxis));
    return MulOp::create(b, loc, sum, splat(statType, 1.0 / count));
  };
  Value batchMean = batchAverage(x);
  Value centred = SubOp::create(b, loc, x, full(batchMean));
  Value batchVar = batchAverage(MulOp::create(b, loc, centred, centred));
  Value rstd = ReciprocalOp::create(
      b, loc,
      SqrtOp::create(
          b, loc,
          AddOp::create(b, loc, batchVar,
                        splat(statType, bn.getEpsilon().convertToFloat()))));
  Value y = MulOp::create(b, loc, centred, full(rstd));
  y = MulOp::create(b, loc, y, perChannel(bn.getScale()));
  y = AddOp::create(b, loc, y, perChannel(bn.getBias()));

  double momentum =
      bn.getMomentumAttr()
          ? shortestDecimal(bn.getMomentumAttr().getValueAsDouble())
          : 0.9;
  auto vecType = cast<RankedTensorType>(mean.getType());
  EmaUpdateOp::create(b, loc, mean,
                      ReshapeOp::create(b, loc, vecType, batchMean),
                      b.getF64FloatAttr(momentum), b.getF64FloatAttr(1.0));
  EmaUpdateOp::create(
      b, loc, var, ReshapeOp::create(b, loc, vecType, batchVar),
      b.getF64FloatAttr(momentum),
      b.getF64FloatAttr(static_cast<double>(count) / (count - 1)));
  bn.replaceAllUsesWith(y);
  bn.erase();
  return success();
}

struct TrainModePass : public mlir::pcc::impl::TrainModeBase<TrainModePass> {
  using TrainModeBase::TrainModeBase;

  void runOnOperation() override {
    SmallVector<BatchNormOp> norms;
    getOperation().walk([&](BatchNormOp bn) { norms.push_back(bn); });
    for (BatchNormOp bn : norms)
      if (failed(toTrainingMode(bn, dataParallel)))
        return signalPassFailure();
  }
};

} // namespace
