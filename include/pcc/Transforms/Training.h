//===- Training.h - builders the training passes share ----------*- C++ -*-===//
//
// The names of phases and state are the dialect's (Contracts.h); these are
// the builders that several training passes call.
//
//===----------------------------------------------------------------------===//

#ifndef PCC_TRANSFORMS_TRAINING_H
#define PCC_TRANSFORMS_TRAINING_H

#include "pcc/Analysis/PipelineStages.h"
#include "pcc/Dialect/Pcc/IR/Contracts.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/STLFunctionalExtras.h"

#include <array>

namespace mlir::pcc {

/// The sum of the squares of every element of `x`, a scalar (a gradient's
/// share of the global norm; mse's loss). Defined in Optimizer.cpp.
Value buildSquaredSum(OpBuilder &b, Location loc, Value x);

/// The update of weight (or master piece) `p` from gradient `g` by optimizer
/// `kind` ("sgd" or "adamw"), clipped by `norm`; `state` gives the
/// optimizer's state tensor of each kind it reads ("momentum_buffer",
/// "exp_avg", "exp_avg_sq"), created in that order. Defined in
/// Optimizer.cpp.
void buildOptimizerUpdate(OpBuilder &b, Location loc, llvm::StringRef kind,
                          Value p, Value g, Value norm,
                          llvm::function_ref<Value(llvm::StringRef)> state);

} // namespace mlir::pcc

#endif // PCC_TRANSFORMS_TRAINING_H
