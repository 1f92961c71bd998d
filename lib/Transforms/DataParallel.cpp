//===- DataParallel.cpp - gradients summed over the dp mesh axis ----------===//
//
// pcc-data-parallel (see Passes.td): the optimizer phase reads every
// gradient through an all-reduce over dp, in backward order.
//
//===----------------------------------------------------------------------===//

#include "pcc/Dialect/Pcc/IR/PccDialect.h"
#include "pcc/Transforms/Passes.h"
#include "pcc/Transforms/Training.h"

#include "llvm/ADT/StringSet.h"

namespace mlir::pcc {
#define GEN_PASS_DEF_DATAPARALLEL
#include "pcc/Transforms/Passes.h.inc"
} // namespace mlir::pcc

using namespace mlir;
using namespace mlir::pcc;

namespace {

struct DataParallelPass
    : public mlir::pcc::impl::DataParallelBase<DataParallelPass> {
  using DataParallelBase::DataParallelBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (dataParallel <= 1)
      return;
    auto opt = module.lookupSymbol<func::FuncOp>(kPhaseFunctions[2]);
    if (!opt) {
      module.emitError("data parallel: no @")
          << kPhaseFunctions[2] << " (run pcc-optimizer first)";
      return signalPassFailure();
    }
    // pcc-optimizer reads the gradients first in backward order (the global
    // norm); after CSE each gradient is one pcc.param.
    SmallVector<ParamOp> grads;
    llvm::StringSet<> seen;
    opt.walk([&](ParamOp p) {
      if (splitStateName(p.getName()).second == "grad")
        grads.push_back(p);
    });
    for (ParamOp g : grads) {
      if (!seen.insert(g.getName()).second) {
        g.emitError("data parallel: gradient '")
            << g.getName() << "' is read by two pcc.param ops (run CSE first)";
        return signalPassFailure();
      }
      OpBuilder b(g->getContext());
      b.setInsertionPointAfter(g);
      auto sum = AllReduceOp::create(b, g.getLoc(), g.getResult(),
                                     b.getStringAttr("dp"));
      g.getResult().replaceAllUsesExcept(sum.getResult(), sum);
    }
  }
};

} // namespace
