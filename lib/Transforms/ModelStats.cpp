//===- ModelStats.cpp - op, weight and FLOP counts
//-------------------------===//

#include "pcc/Dialect/Pcc/IR/PccDialect.h"
#include "pcc/Transforms/Passes.h"

#include "llvm/ADT/StringSet.h"

namespace mlir::pcc {
#define GEN_PASS_DEF_MODELSTATS
#include "pcc/Transforms/Passes.h.inc"
} // namespace mlir::pcc

using namespace mlir;
using namespace mlir::pcc;

/// FLOPs (2 per multiply-add) of a matmul or convolution, else 0.
static uint64_t flopsOf(Operation *op) {
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

namespace {
struct ModelStatsPass : pcc::impl::ModelStatsBase<ModelStatsPass> {
  using ModelStatsBase::ModelStatsBase;

  void runOnOperation() override {
    func::FuncOp func = getOperation();
    uint64_t ops = 0, weights = 0, bytes = 0, flopCount = 0;
    llvm::StringSet<> seen;
    func.walk([&](Operation *op) {
      if (!isa<PccDialect>(op->getDialect()))
        return;
      ++ops;
      flopCount += flopsOf(op);
      if (auto param = dyn_cast<ParamOp>(op)) {
        if (!seen.insert(param.getName()).second)
          return;
        ++weights;
        auto type = param.getType();
        bytes +=
            type.getNumElements() * ((type.getElementTypeBitWidth() + 7) / 8);
      }
    });
    numOps += ops;
    numWeights += weights;
    weightBytes += bytes;
    flops += flopCount;
    if (emitRemark)
      func.emitRemark() << ops << " ops, " << weights << " weights (" << bytes
                        << " bytes), " << flopCount << " FLOPs";
    markAllAnalysesPreserved();
  }
};
} // namespace
