//===- Training.h - names shared by the training passes and back end -*- C++ -*-===//
//
// Model state beyond the weights is named after its weight: `<weight>@grad`,
// `<weight>@exp_avg`, `<weight>@exp_avg_sq`, `<weight>@momentum_buffer`
// (PyTorch's optimizer state names). The phases of a training module are
// functions marked `pcc.phase`; the module's `pcc.training` dictionary
// records the loss and the optimizer.
//
//===----------------------------------------------------------------------===//

#ifndef PCC_TRANSFORMS_TRAINING_H
#define PCC_TRANSFORMS_TRAINING_H

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/STLFunctionalExtras.h"

#include <array>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

namespace mlir::pcc {

inline constexpr llvm::StringLiteral kTrainingAttrName = "pcc.training";
inline constexpr llvm::StringLiteral kPhaseAttrName = "pcc.phase";

/// The phases, in the order of the model ABI's enum pcc_phase.
inline constexpr llvm::StringLiteral kPhaseNames[] = {"forward", "backward",
                                                      "optimizer", "zero_grad"};
inline constexpr llvm::StringLiteral kPhaseFunctions[] = {
    "train_forward", "train_backward", "train_optimizer", "train_zero_grad"};

/// Pipelined training (pcc-pipeline-training): the phase functions of
/// stage k are @stage<k>_forward, _backward and _weight_grad, each marked
/// with this attribute holding k ...
inline constexpr llvm::StringLiteral kPipelineStageAttrName =
    "pcc.pipeline_stage";
/// ... and @rank<r>_optimizer and _zero_grad, the phases of pipeline rank
/// r (the weights of all its stages), are marked with this one holding r.
inline constexpr llvm::StringLiteral kPipelineRankAttrName =
    "pcc.pipeline_rank";

/// `pcc --offload=optimizer` (pcc-offload-optimizer): the device's parts of
/// the optimizer step, before and after the host's update; phases 4 and 5
/// of enum pcc_phase.
inline constexpr llvm::StringLiteral kOffloadPhaseNames[] = {"optimizer_pre",
                                                             "optimizer_post"};
inline constexpr llvm::StringLiteral kOffloadPhaseFunctions[] = {
    "train_optimizer_pre", "train_optimizer_post"};

/// ZeRO-1 and -2: the shard of a weight that a rank's optimizer updates
/// (`<weight>@master`, the fp32 master partition of DeepSpeed), all-gathered
/// into the whole weight after the step. Loaded from the weight, not saved.
inline constexpr llvm::StringLiteral kMasterState = "master";

/// ZeRO-3 in a pipeline with the weights kept gathered through a step
/// (`--zero-reshard-after-forward=false`): the whole copy the zero-grad
/// phase all-gathers and every micro-batch's phases read. Not saved.
inline constexpr llvm::StringLiteral kGatheredState = "gathered";

/// `<weight>@<kind>`.
inline std::string stateName(llvm::StringRef weight, llvm::StringRef kind) {
  return (weight + "@" + kind).str();
}

/// (weight, kind) of a state name; kind is empty for a weight itself.
inline std::pair<llvm::StringRef, llvm::StringRef>
splitStateName(llvm::StringRef name) {
  size_t at = name.rfind('@');
  if (at == llvm::StringRef::npos)
    return {name, llvm::StringRef()};
  return {name.take_front(at), name.drop_front(at + 1)};
}

/// The shortest decimal that rounds to `f` (0.1f gives 0.1, not
/// 0.100000001): a float32 ONNX attribute holding a probability or a
/// momentum back as the value the user wrote, so that 1 - p is PyTorch's.
inline double shortestDecimal(float f) {
  char text[32];
  for (int digits = 1; digits <= 9; ++digits) {
    std::snprintf(text, sizeof(text), "%.*g", digits, static_cast<double>(f));
    double value = std::strtod(text, nullptr);
    if (static_cast<float>(value) == f)
      return value;
  }
  return f;
}

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

/// A pipelined training module's stage phases: per stage k, its forward,
/// backward (B) and weight-gradient (W) functions (null where one is
/// missing). Defined in PipelineTraining.cpp.
llvm::SmallVector<std::array<func::FuncOp, 3>>
getPipelineStagePhases(ModuleOp module);

/// Merges `entries` into the module's pcc.training dictionary.
inline void setTrainingAttr(ModuleOp module,
                            llvm::ArrayRef<NamedAttribute> entries) {
  NamedAttrList list;
  if (auto old = module->getAttrOfType<DictionaryAttr>(kTrainingAttrName))
    list.append(old.getValue());
  for (const NamedAttribute &entry : entries)
    list.set(entry.getName(), entry.getValue());
  module->setAttr(kTrainingAttrName, list.getDictionary(module.getContext()));
}

} // namespace mlir::pcc

#endif // PCC_TRANSFORMS_TRAINING_H
