//===- Autocast.cpp - matrix products in bf16 ------------------------------===//
//
// pcc-autocast (see Passes.td): torch.autocast's lower-precision products.
//
//===----------------------------------------------------------------------===//

#include "pcc/Dialect/Pcc/IR/PccDialect.h"
#include "pcc/Transforms/Passes.h"

namespace mlir::pcc {
#define GEN_PASS_DEF_AUTOCAST
#include "pcc/Transforms/Passes.h.inc"
} // namespace mlir::pcc

using namespace mlir;
using namespace mlir::pcc;

namespace {

/// `v` with element type `element` (a cast, unless it has it already).
Value castTo(OpBuilder &b, Location loc, Value v, Type element) {
  auto type = cast<RankedTensorType>(v.getType());
  if (type.getElementType() == element)
    return v;
  return CastOp::create(b, loc, type.clone(element), v);
}

struct AutocastPass : public mlir::pcc::impl::AutocastBase<AutocastPass> {
  using AutocastBase::AutocastBase;

  void runOnOperation() override {
    if (precision == "fp32")
      return;
    if (precision != "bf16") {
      getOperation().emitError("autocast: precision '")
          << precision << "' is not known (bf16 or fp32)";
      return signalPassFailure();
    }
    Type bf16 = BFloat16Type::get(&getContext());
    SmallVector<MatmulOp> products;
    getOperation().walk([&](MatmulOp mm) {
      if (mm.getType().getElementType().isF32())
        products.push_back(mm);
    });
    for (MatmulOp mm : products) {
      OpBuilder b(mm);
      Location loc = mm.getLoc();
      Value lhs = castTo(b, loc, mm.getLhs(), bf16);
      Value rhs = castTo(b, loc, mm.getRhs(), bf16);
      auto product = MatmulOp::create(b, loc, lhs, rhs, mm.getTransposeA(),
                                      mm.getTransposeB());
      Value result =
          castTo(b, loc, product.getResult(), mm.getType().getElementType());
      mm.getResult().replaceAllUsesWith(result);
      mm.erase();
    }
  }
};

} // namespace
