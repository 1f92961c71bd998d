//===- CostModel.cpp - predicted time of pcc ops --------------------------===//

#include "pcc/Transforms/CostModel.h"

#include "pcc/Dialect/Pcc/IR/PccDialect.h"

using namespace mlir;
using namespace mlir::pcc;

int64_t mlir::pcc::opFlops(Operation *op) {
  if (auto mm = dyn_cast<MatmulOp>(op)) {
    auto lhs = mm.getLhs().getType();
    int64_t k = lhs.getDimSize(lhs.getRank() - (mm.getTransposeA() ? 2 : 1));
    return 2 * mm.getType().getNumElements() * k;
  }
  if (auto conv = dyn_cast<ConvOp>(op)) {
    auto w = conv.getWeight().getType();
    // Each output element reads C/groups x K1 x ... x Kk inputs.
    return 2 * conv.getType().getNumElements() *
           (w.getNumElements() / w.getDimSize(0));
  }
  return 0;
}

int64_t mlir::pcc::tensorBytes(Value v) {
  auto t = cast<RankedTensorType>(v.getType());
  return t.getNumElements() * ((t.getElementTypeBitWidth() + 7) / 8);
}

double CostModel::opSeconds(Operation *op) const {
  if (isa<ParamOp, ConstantOp, ReshapeOp>(op))
    return 0;
  if (int64_t flops = opFlops(op))
    return static_cast<double>(flops) / flopsPerSecond;
  if (isa<AllReduceOp, AllGatherOp, ReduceScatterOp>(op)) {
    double bytes = static_cast<double>(tensorBytes(op->getOperand(0)));
    return collectiveLatency +
           (isa<AllReduceOp>(op) ? 2 : 1) * bytes / linkBytesPerSecond;
  }
  int64_t bytes = 0;
  for (Value r : op->getResults())
    bytes += tensorBytes(r);
  return static_cast<double>(bytes) / bytesPerSecond;
}
