//===- PccInterfaces.h - per-op rules the passes ask for --------*- C++ -*-===//
//
// The op interfaces of PccInterfaces.td and the layout types they use.
//
//===----------------------------------------------------------------------===//

#ifndef PCC_DIALECT_PCC_IR_PCCINTERFACES_H
#define PCC_DIALECT_PCC_IR_PCCINTERFACES_H

#include "pcc/Dialect/Pcc/IR/Layout.h"

#include "mlir/IR/Builders.h"

#include "pcc/Dialect/Pcc/IR/PccInterfaces.h.inc"

#endif // PCC_DIALECT_PCC_IR_PCCINTERFACES_H
