//===- CostModel.cpp - predicted time of pcc ops --------------------------===//

#include "pcc/Analysis/CostModel.h"

#include "pcc/Dialect/Pcc/IR/PccInterfaces.h"

#include "mlir/IR/BuiltinOps.h"

using namespace mlir;
using namespace mlir::pcc;

int64_t mlir::pcc::opFlops(Operation *op) {
  auto cost = dyn_cast<CostOpInterface>(op);
  return cost ? cost.getFlops() : 0;
}

int64_t mlir::pcc::tensorBytes(Value v) { return getTensorBytes(v.getType()); }

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
  MeshOp mesh = getMesh(op);
  std::optional<int64_t> size = mesh ? mesh.getAxisSize(axis) : std::nullopt;
  return size ? *size : 2;
}

double CostModel::opSeconds(Operation *op) const {
  if (auto c = dyn_cast<CollectiveOpInterface>(op))
    return collectiveSeconds(c.getCollectiveKind(), c.getPayloadBytes(),
                             axisSize(op, c.getMeshAxis()));
  auto cost = dyn_cast<CostOpInterface>(op);
  if (!cost)
    return 0;
  if (int64_t flops = cost.getFlops())
    return static_cast<double>(flops) / flopsPerSecond;
  return static_cast<double>(cost.getBytesWritten()) / bytesPerSecond;
}
