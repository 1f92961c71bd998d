//===- MergeStateLoads.cpp - one load per state where they agree ----------===//

#include "pcc/Dialect/Pcc/IR/PccDialect.h"
#include "pcc/Transforms/Passes.h"

namespace mlir::pcc {
#define GEN_PASS_DEF_MERGESTATELOADS
#include "pcc/Transforms/Passes.h.inc"
} // namespace mlir::pcc

using namespace mlir;
using namespace mlir::pcc;

namespace {
struct MergeStateLoadsPass
    : pcc::impl::MergeStateLoadsBase<MergeStateLoadsPass> {
  void runOnOperation() override {
    getOperation().walk([](Block *block) { mergeStateLoads(*block); });
  }
};
} // namespace
