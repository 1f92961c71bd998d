//===- Compile.h - pcc's compile pipeline as a library ----------*- C++ -*-===//
//
// One compile of a model: its options (the mesh, the pipeline, training,
// data parallelism and ZeRO, memory, the target), their one verify(), and
// the pass pipeline they build. `pcc` fills CompileOptions from its flags;
// `pcc-opt --pass-pipeline='builtin.module(pcc-compile{tp=2 train=true})'`
// from the pipeline's options, and both build the same passes. A planner
// can build and run as many plans as it likes without the tool.
//
//===----------------------------------------------------------------------===//

#ifndef PCC_PIPELINES_COMPILE_H
#define PCC_PIPELINES_COMPILE_H

#include "mlir/Pass/PassManager.h"
#include "llvm/ADT/StringRef.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace mlir::pcc {

struct ShardingMemo;

/// What the model library runs on (pcc --target).
enum class DeviceTarget { Cpu, Cuda, All };

/// Every option of one compile. An unset optional is one the user did not
/// give: its default is what the getter returns, and some choices (the
/// memory fit, ZeRO's defaults on CPU ranks) depend on whether it was given.
struct CompileOptions {
  // The mesh: degrees and the rank grid's order, slowest first.
  int64_t tp = 1, pp = 1, dp = 1;
  std::string meshOrder = "dp,pp,tp";
  bool sequenceParallel = false;
  /// pcc-fuse-attention: the exporters' decomposed attention as one
  /// pcc.attention (--fuse-attention=false keeps the products and softmax).
  bool fuseAttention = true;

  // The pipeline: cuts after these ONNX nodes, model chunks per rank,
  // micro-batches, the schedule.
  std::vector<std::string> ppCuts;
  int64_t ppChunks = 1;
  int64_t microbatches = 1;
  std::optional<std::string> schedule;

  // Training.
  bool train = false;
  std::optional<std::string> loss;
  std::optional<int64_t> ignoreIndex;
  /// --fuse-cross-entropy: an LM head's product and the cross-entropy as
  /// one pcc.linear_cross_entropy (true), the logits then the loss
  /// (false); unset, fused where the logits are large or --mem-cap needs
  /// it (MemoryChoices::fuseHead).
  std::optional<bool> fuseCrossEntropy;
  std::optional<std::string> optimizer;
  std::optional<std::string> recompute;
  /// --frozen: weights training holds constant (getFrozenWeights adds the
  /// rotary inv_freq buffers).
  std::vector<std::string> frozen;

  // Data parallelism and ZeRO.
  int64_t zero = 0;
  std::optional<double> bucketMb;
  std::optional<bool> reshardAfterForward;
  std::optional<int64_t> zeroPrefetch;
  std::optional<std::string> zeroGradSync;
  std::string offload = "none";

  // Mixed precision: fp32 (every op in f32), bf16 or fp16 (pcc-autocast);
  // fp16 training's loss scaling (dynamic, dynamic:N or N; unset: dynamic).
  std::string precision = "fp32";
  std::optional<std::string> lossScale;
  // The type the gradients are summed over dp in: fp32 (unset) or bf16.
  std::optional<std::string> gradReduce;

  /// --mem-cap in bytes (0: none): the pipeline predicts every pipeline
  /// rank's peak and chooses recomputation and ZeRO's trades until it fits.
  int64_t memCapBytes = 0;
  /// Where the memory fit reports each trial (one line each, no newline);
  /// unset: standard error, as "pcc: ...".
  std::function<void(const std::string &)> progress;

  DeviceTarget target = DeviceTarget::Cpu;
  /// The planners explain themselves in remarks (pcc --explain).
  bool emitRemarks = false;
  /// Shared by compiles of one model (the plan search's probes): the
  /// tensor-parallel search runs once per degree and set of weights.
  std::shared_ptr<ShardingMemo> shardingMemo;
  /// Fuse elementwise ops and plan each function's memory: what code
  /// generation and the memory predictions read (pcc does unless it only
  /// prints the IR).
  bool planMemory = true;

  std::string getSchedule() const;
  std::string getLoss() const { return loss.value_or("cross_entropy"); }
  int64_t getIgnoreIndex() const { return ignoreIndex.value_or(-100); }
  std::string getOptimizer() const { return optimizer.value_or("adamw"); }
  std::string getRecompute() const { return recompute.value_or("none"); }
  bool isOffloading() const { return offload == "optimizer"; }
  int64_t getNumStages() const { return pp * ppChunks; }
  /// The mesh axes in rank-grid order, as pcc-set-mesh takes them
  /// ("dp=2", "pp=1", "tp=4").
  std::vector<std::string> getMeshAxes() const;

  /// The first conflict between options, as a message naming the flags
  /// and what would work; empty when they go together.
  std::string verify() const;
};

/// Sets the options that pcc's flags and the pcc-compile pipeline's
/// options share (the mesh, the pipeline, training, data parallelism and
/// ZeRO) from either: `flags` has one member per option, named as the
/// field it sets, and `given(member)` says whether the user gave it (the
/// optional fields stay unset otherwise).
template <typename Flags, typename Given>
void setSharedOptions(CompileOptions &o, const Flags &flags, Given given) {
  auto ifGiven = [&](const auto &flag) {
    using T = std::decay_t<decltype(flag.getValue())>;
    return given(flag) ? std::optional<T>(flag.getValue()) : std::nullopt;
  };
  o.tp = flags.tp;
  o.pp = flags.pp;
  o.dp = flags.dp;
  o.meshOrder = flags.meshOrder;
  o.sequenceParallel = flags.sequenceParallel;
  o.fuseAttention = flags.fuseAttention;
  o.ppCuts.assign(flags.ppCuts.begin(), flags.ppCuts.end());
  o.ppChunks = flags.ppChunks;
  o.microbatches = flags.microbatches;
  o.schedule = ifGiven(flags.schedule);
  o.train = flags.train;
  o.loss = ifGiven(flags.loss);
  o.ignoreIndex = ifGiven(flags.ignoreIndex);
  o.fuseCrossEntropy = ifGiven(flags.fuseCrossEntropy);
  o.optimizer = ifGiven(flags.optimizer);
  o.recompute = ifGiven(flags.recompute);
  o.frozen.assign(flags.frozen.begin(), flags.frozen.end());
  o.zero = flags.zero;
  o.bucketMb = ifGiven(flags.bucketMb);
  o.reshardAfterForward = ifGiven(flags.reshardAfterForward);
  o.zeroPrefetch = ifGiven(flags.zeroPrefetch);
  o.zeroGradSync = ifGiven(flags.zeroGradSync);
  o.offload = flags.offload;
  o.precision = flags.precision;
  o.lossScale = ifGiven(flags.lossScale);
  o.gradReduce = ifGiven(flags.gradReduce);
}

/// What the memory fit chooses (otherwise the options' own values).
struct MemoryChoices {
  /// --recompute: one value, or one per pipeline stage, comma-separated.
  std::string recompute;
  /// ZeRO 3: gather the weights again after the forward pass (or in every
  /// phase of a pipeline), or keep them gathered.
  bool reshardAfterForward = true;
  /// ZeRO 2 and 3 in a pipeline: reduce-scatter each gradient in every
  /// micro-batch's W pass rather than once per step.
  bool reduceEachMicrobatch = false;
  /// ZeRO 3: how many gathers ahead a weight's all-gather starts.
  int64_t prefetch = 0;
  /// pcc-loss's fuse-head-bytes: the LM head fused with its cross-entropy
  /// where its f32 logits take at least this many bytes (0: always, -1:
  /// never).
  int64_t fuseHeadBytes = -1;
};

/// The choices the options make by themselves.
MemoryChoices getDefaultMemoryChoices(const CompileOptions &options);

/// The whole compile of an imported module: the mesh, import clean-up,
/// batch split, loss, stage cut and schedule, differentiation, partition,
/// data parallelism and ZeRO, offload, the collectives' check, fusion and
/// the memory plan. With a memory cap, one pass runs the fit and then the
/// passes it chose. The options must verify().
void buildCompilePipeline(OpPassManager &pm, const CompileOptions &options);

/// The passes after pcc-set-mesh, with these choices (what each trial of
/// the memory fit runs).
void buildCompilePasses(OpPassManager &pm, const CompileOptions &options,
                        const MemoryChoices &choices);

/// Registers `pcc-compile{...}` (and the other named pipelines).
void registerCompilePipeline();

/// "512MiB", "1.5GiB", "64M", "1048576": bytes, or -1.
int64_t parseBytes(llvm::StringRef text);

} // namespace mlir::pcc

#endif // PCC_PIPELINES_COMPILE_H
