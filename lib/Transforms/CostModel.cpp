//===- CostModel.cpp - predicted time of pcc ops --------------------------===//

#include "pcc/Transforms/CostModel.h"

#include "pcc/Dialect/Pcc/IR/PccDialect.h"

#include "mlir/IR/BuiltinOps.h"

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

double CostModel::collectiveSeconds(CollectiveKind kind, int64_t wholeBytes,
                                    int64_t ranks) const {
  double share = static_cast<double>(ranks - 1) / static_cast<double>(ranks);
  if (kind == CollectiveKind::AllReduce)
    share *= 2;
  return collectiveLatency +
         share * static_cast<double>(wholeBytes) / linkBytesPerSecond;
}

/// The size of mesh axis `axis` in `op`'s module, without diagnostics (the
/// verifier reports a missing axis); 2 when it cannot be found.
static int64_t axisSize(Operation *op, StringRef axis) {
  auto module = op->getParentOfType<ModuleOp>();
  auto mesh =
      module ? module->getAttrOfType<DictionaryAttr>(PccDialect::kMeshAttrName)
             : DictionaryAttr();
  auto size = mesh ? mesh.getAs<IntegerAttr>(axis) : IntegerAttr();
  return size ? size.getInt() : 2;
}

double CostModel::opSeconds(Operation *op) const {
  if (isa<ParamOp, ConstantOp, ReshapeOp>(op))
    return 0;
  if (int64_t flops = opFlops(op))
    return static_cast<double>(flops) / flopsPerSecond;
  // The whole tensor: an all-reduce's and a reduce-scatter's input, an
  // all-gather's result.
  if (auto ar = dyn_cast<AllReduceOp>(op))
    return collectiveSeconds(CollectiveKind::AllReduce,
                             tensorBytes(ar.getInput()),
                             axisSize(op, ar.getAxis()));
  if (auto ag = dyn_cast<AllGatherOp>(op))
    return collectiveSeconds(CollectiveKind::AllGather,
                             tensorBytes(ag.getResult()),
                             axisSize(op, ag.getAxis()));
  if (auto rs = dyn_cast<ReduceScatterOp>(op))
    return collectiveSeconds(CollectiveKind::ReduceScatter,
                             tensorBytes(rs.getInput()),
                             axisSize(op, rs.getAxis()));
  int64_t bytes = 0;
  for (Value r : op->getResults())
    bytes += tensorBytes(r);
  return static_cast<double>(bytes) / bytesPerSecond;
}
