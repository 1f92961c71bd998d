//===- PccDialect.cpp - pcc dialect registration
//---------------------------===//

#include "pcc/Dialect/Pcc/IR/PccDialect.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinAttributes.h"

using namespace mlir;
using namespace mlir::pcc;

#include "pcc/Dialect/Pcc/IR/PccOpsDialect.cpp.inc"

void PccDialect::initialize() {
  addOperations<
#define GET_OP_LIST
#include "pcc/Dialect/Pcc/IR/PccOps.cpp.inc"
      >();
}

Operation *PccDialect::materializeConstant(OpBuilder &builder, Attribute value,
                                           Type type, Location loc) {
  auto elements = dyn_cast<ElementsAttr>(value);
  if (!elements || elements.getType() != type)
    return nullptr;
  return ConstantOp::create(builder, loc, elements);
}
