//===- Contracts.h - what the passes tell each other ------------*- C++ -*-===//
//
// Model state beyond the weights is named after its weight: `<weight>@grad`,
// `<weight>@exp_avg`, `<weight>@exp_avg_sq`, `<weight>@momentum_buffer`
// (PyTorch's optimizer state names). The phases of a training module are
// functions marked `pcc.phase`; the module's `pcc.training` dictionary
// records the loss, the optimizer, the trained weights, ZeRO and the
// buckets; a pipelined @main's `pcc.schedule` holds each pipeline rank's
// instructions. The passes write these, the C++ emitter, the analyses and
// --explain read them: they belong to the dialect, which verifies them
// (PccDialect::verifyOperationAttribute) and reads them into the typed
// TrainingConfig below and ::pcc::schedule::Schedule (ScheduleAttr.h).
//
//===----------------------------------------------------------------------===//

#ifndef PCC_DIALECT_PCC_IR_CONTRACTS_H
#define PCC_DIALECT_PCC_IR_CONTRACTS_H

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Diagnostics.h"
#include "llvm/ADT/STLFunctionalExtras.h"
#include "llvm/ADT/StringRef.h"

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace mlir::pcc {

/// The mesh axes pcc plans, as `pcc.mesh` and the collectives name them
/// (the model ABI's mesh table spells them the same).
inline constexpr llvm::StringLiteral kDataParallelAxis = "dp";
inline constexpr llvm::StringLiteral kPipelineAxis = "pp";
inline constexpr llvm::StringLiteral kTensorParallelAxis = "tp";

inline constexpr llvm::StringLiteral kTrainingAttrName = "pcc.training";
/// On the module, set by pcc-autocast: the mixed precision the model's
/// products compute in ("bf16").
inline constexpr llvm::StringLiteral kPrecisionAttrName = "pcc.precision";
/// On the module with pcc.precision = "fp16", set by pcc-autocast: fp16
/// training's loss scaling, {initial = <f64>, window = <i64>} (window 0: a
/// static scale; else a dynamic one, doubled after `window` steps without
/// an overflow and halved at each overflow).
inline constexpr llvm::StringLiteral kLossScaleAttrName = "pcc.loss_scale";

/// --loss-scale: (initial scale, growth window; 0 for a static scale).
/// PyTorch's GradScaler defaults: from 2^16, doubled after 2000 steps.
inline std::optional<std::pair<double, int64_t>>
parseLossScale(llvm::StringRef text) {
  constexpr double kInitial = 65536;
  constexpr int64_t kWindow = 2000;
  if (text == "dynamic")
    return std::make_pair(kInitial, kWindow);
  bool dynamic = text.consume_front("dynamic:");
  double value = 0;
  if (text.getAsDouble(value) || !(value > 0) || !std::isfinite(value))
    return std::nullopt;
  return std::make_pair(value, dynamic ? kWindow : int64_t(0));
}

inline constexpr llvm::StringLiteral kPhaseAttrName = "pcc.phase";
/// The memory plan (pcc-plan-memory): on a function, the bytes of its
/// arena; on each pcc op in it, per result the offset of its buffer in the
/// arena, or kNoBuffer (a view, a weight, a constant) or kReturnedBuffer
/// (written straight into the caller's output).
inline constexpr llvm::StringLiteral kArenaBytesAttrName = "pcc.arena_bytes";
inline constexpr llvm::StringLiteral kBufferOffsetsAttrName =
    "pcc.buffer_offsets";
inline constexpr int64_t kNoBuffer = -1, kReturnedBuffer = -2;

/// On each function pcc-pipeline-cut cuts @main into: its stage number.
inline constexpr llvm::StringLiteral kStageAttrName = "pcc.stage";

/// On a pipelined @main (pcc-pipeline-schedule): the schedule.
inline constexpr llvm::StringLiteral kScheduleAttrName = "pcc.schedule";

/// The phases, in the order of the model ABI's enum pcc_phase.
inline constexpr llvm::StringLiteral kPhaseNames[] = {"forward", "backward",
                                                      "optimizer", "zero_grad"};
inline constexpr llvm::StringLiteral kPhaseFunctions[] = {
    "train_forward", "train_backward", "train_optimizer", "train_zero_grad"};

/// The phase of a pipeline stage that computes its weights' gradients
/// (the W of a zero-bubble schedule).
inline constexpr llvm::StringLiteral kWeightGradPhaseName = "weight_grad";

/// Pipelined training (pcc-autodiff on stages): the phase functions of
/// stage k are @stage<k>_forward, _backward and _weight_grad, each marked
/// with this attribute holding k ...
inline constexpr llvm::StringLiteral kPipelineStageAttrName =
    "pcc.pipeline_stage";
/// ... and @rank<r>_optimizer and _zero_grad, the phases of pipeline rank
/// r (the weights of all its stages, pcc-optimizer), are marked with this
/// one holding r.
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

/// Mixed precision (pcc-bf16-weight-copies): the bf16 copy of a weight
/// (or of its tensor-parallel piece) that the zero-grad phase casts at the
/// start of every step and every micro-batch's phases read. Not saved; the
/// library's state kind is that of a gathered copy.
inline constexpr llvm::StringLiteral kBf16CopyState = "bf16";
/// The same with --precision=fp16: the fp16 copy.
inline constexpr llvm::StringLiteral kF16CopyState = "fp16";

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

/// A gradient bucket (pcc-data-parallel): the state `state` holds the
/// gradients `grads`, each from its element offset.
struct GradientBucket {
  std::string state;
  std::vector<std::string> grads;
  std::vector<int64_t> offsets;
};

/// The module's `pcc.training`, typed. Each pass adds its entries.
struct TrainingConfig {
  /// pcc-loss: "cross_entropy", "mse" or "none"; cross_entropy's ignored
  /// label; the micro-batches of a step.
  std::string loss;
  std::optional<int64_t> ignoreIndex;
  int64_t microbatches = 1;
  /// pcc-optimizer: "sgd" or "adamw", the
  /// trained weights, and those read in several pipeline stages.
  std::string optimizer;
  std::vector<std::string> weights, tied;
  /// pcc-data-parallel: the ZeRO stage and the gradient buckets.
  int64_t zero = 0;
  std::vector<GradientBucket> buckets;
  /// pcc-offload-optimizer: state kept in host memory, copied to the host
  /// after the backward pass, and back to the device after the update.
  bool offloaded = false;
  std::vector<std::string> offloadHost, offloadToHost, offloadToDevice;
};

/// Reads a `pcc.training` dictionary; an unknown entry or one of the wrong
/// kind is an error through `emitError`.
LogicalResult
parseTrainingAttr(DictionaryAttr attr, TrainingConfig &config,
                  llvm::function_ref<InFlightDiagnostic()> emitError);
/// The module's training configuration (verified with the module), or
/// nullopt for an inference module.
std::optional<TrainingConfig> getTrainingConfig(ModuleOp module);

/// How the CPU back end computes an op inside the op that consumes it, so
/// that the op needs no buffer of its own. pcc-plan-memory (planning for
/// the CPU alone: --target=cpu) and the C++ emitter both ask this one
/// function, so the arena holds no buffer the code never writes.
enum class CpuDeferral {
  None,
  /// An f32 x * x whose one user, the next op, sums it whole: the sum
  /// reads x (the global gradient norm).
  SumSquares,
  /// A scatter-add whose one user, the next op, assigns or accumulates it
  /// into a state of its type: it is computed in the state (an embedding's
  /// gradient).
  ScatterInto,
  /// A 16-bit to f32 cast whose one user, the next op, accumulates it into
  /// a state: widened as it is added.
  Widen,
  /// A cast whose one user, the next op, assigns it to a state: cast
  /// straight into the state.
  CastInto,
  /// A product whose one user, the next op, assigns it whole to a state
  /// loaded before it and not read by the product: computed in the state.
  IntoState,
};

/// The deferral of `op` (the next op skips pcc.param loads); `isReturned`
/// says whether a value is returned by the function (directly or through
/// reshapes), which keeps it in the caller's output.
CpuDeferral getCpuDeferral(Operation *op,
                           llvm::function_ref<bool(Value)> isReturned);

} // namespace mlir::pcc

#endif // PCC_DIALECT_PCC_IR_CONTRACTS_H
