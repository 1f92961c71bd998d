//===- ModelStats.cpp - op, weight and FLOP counts
//-------------------------===//

#include "pcc/Analysis/CostModel.h"
#include "pcc/Dialect/Pcc/IR/Layout.h"
#include "pcc/Dialect/Pcc/IR/PccDialect.h"
#include "pcc/Transforms/Passes.h"

#include "llvm/ADT/StringSet.h"

namespace mlir::pcc {
#define GEN_PASS_DEF_MODELSTATS
#include "pcc/Transforms/Passes.h.inc"
} // namespace mlir::pcc

using namespace mlir;
using namespace mlir::pcc;

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
      flopCount += static_cast<uint64_t>(opFlops(op));
      if (auto param = dyn_cast<ParamOp>(op)) {
        if (!seen.insert(param.getName()).second)
          return;
        ++weights;
        bytes += getTensorBytes(param.getType());
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
