//===- CompileOptions.cpp - which compile options go together -------------===//
//
// Every rule between options lives here, once: pcc reports the message as
// "pcc: error: ...", pcc-compile{...} as a pipeline parse error. Each
// message names the flags at fault and what would work.
//
//===----------------------------------------------------------------------===//

#include "pcc/Dialect/Pcc/IR/Contracts.h"
#include "pcc/Pipelines/Compile.h"

#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/StringSet.h"

using namespace mlir;
using namespace mlir::pcc;
using llvm::StringRef;

std::string CompileOptions::getSchedule() const {
  return schedule.value_or(ppChunks > 1 ? "interleaved" : "1f1b");
}

std::vector<std::string> CompileOptions::getMeshAxes() const {
  std::vector<std::string> axes;
  for (StringRef a : llvm::split(StringRef(meshOrder), ','))
    axes.push_back((a + "=" +
                    std::to_string(a == kDataParallelAxis ? dp
                                   : a == kPipelineAxis   ? pp
                                                          : tp))
                       .str());
  return axes;
}

int64_t mlir::pcc::parseBytes(StringRef text) {
  StringRef number =
      text.take_while([](char c) { return llvm::isDigit(c) || c == '.'; });
  StringRef unit = text.drop_front(number.size()).trim();
  double value = 0;
  if (number.empty() || number.getAsDouble(value) || value <= 0)
    return -1;
  double scale = unit.empty() || unit == "B"    ? 1
                 : unit == "K" || unit == "KiB" ? 1024.0
                 : unit == "M" || unit == "MiB" ? 1048576.0
                 : unit == "G" || unit == "GiB" ? 1073741824.0
                                                : -1;
  return scale < 0 ? -1 : static_cast<int64_t>(value * scale);
}

static std::string str(int64_t n) { return std::to_string(n); }

/// The rules of the mesh and of data parallelism.
static std::string verifyMesh(const CompileOptions &o) {
  for (auto [name, value] : {std::pair{"--tp", o.tp}, std::pair{"--pp", o.pp},
                             std::pair{"--dp", o.dp}})
    if (value < 1)
      return std::string(name) + "=" + str(value) +
             " must be a positive integer";
  if (o.dp > 1 && !o.train)
    return "--dp splits a training step's batch over data-parallel ranks; it "
           "goes with --train (for inference, run one copy of the model per "
           "device)";
  if (o.zero < 0 || o.zero > 3)
    return "--zero=" + str(o.zero) + " is not a ZeRO stage (0, 1, 2 or 3)";
  if (o.zero > 0 && o.dp <= 1)
    return "--zero=" + str(o.zero) +
           " shards model state over data-parallel ranks; it needs --dp "
           "above 1";
  if (o.microbatches < 1)
    return "--microbatches must be at least 1";
  llvm::StringSet<> seen;
  bool valid = true;
  for (StringRef a : llvm::split(StringRef(o.meshOrder), ','))
    valid &= (a == kDataParallelAxis || a == kPipelineAxis ||
              a == kTensorParallelAxis) &&
             seen.insert(a).second;
  if (!valid || seen.size() != 3)
    return "--mesh-order=" + o.meshOrder +
           " must name dp, pp and tp once each, slowest first";
  if (o.bucketMb && (o.dp <= 1 || (*o.bucketMb < 0 && *o.bucketMb != -1)))
    return "--bucket-mb sizes the gradient buckets of --dp (a size in MiB, 0 "
           "for no buckets, -1 for the size chosen from the model)";
  if (o.reshardAfterForward && o.zero != 3)
    return "--zero-reshard-after-forward chooses when ZeRO-3 gathers the "
           "weights again; it goes with --zero=3";
  if (o.zeroPrefetch && (o.zero != 3 || *o.zeroPrefetch < 0))
    return "--zero-prefetch=N starts ZeRO-3's weight gathers N gathers "
           "early; it goes with --zero=3 and N >= 0";
  if (o.zeroGradSync && *o.zeroGradSync != "step" &&
      *o.zeroGradSync != "microbatch")
    return "--zero-grad-sync=" + *o.zeroGradSync +
           " is not known: step or microbatch";
  if (o.zeroGradSync && (!o.train || o.pp <= 1 || o.dp <= 1 || o.zero < 2))
    return "--zero-grad-sync chooses when a pipelined training step "
           "reduce-scatters its gradients under ZeRO 2 or 3; it goes with "
           "--train, --pp, --dp and --zero=2 or 3";
  if (o.sequenceParallel && (o.tp <= 1 || !o.train))
    return "--sp splits the sequence over the tensor-parallel ranks of a "
           "training step; it needs --train and --tp above 1";
  return "";
}

/// The rules of training: offload, memory, recomputation, loss, optimizer.
static std::string verifyTraining(const CompileOptions &o) {
  if (o.offload != "none" && o.offload != "optimizer")
    return "--offload=" + o.offload + " is not known: none or optimizer";
  if (o.isOffloading() && !o.train)
    return "--offload=optimizer moves a training step's optimizer to the "
           "host; it goes with --train";
  if (o.memCapBytes > 0) {
    if (!o.train || o.pp <= 1)
      return "--mem-cap chooses each pipeline stage's activation "
             "recomputation; it goes with --train --pp (use --recompute on "
             "one device)";
    if (o.recompute)
      return "--mem-cap chooses the recomputation itself; drop --recompute";
  }
  if (!o.frozen.empty() && !o.train)
    return "--frozen names weights a training step holds constant; it goes "
           "with --train";
  if (o.recompute && !o.train)
    return "--recompute chooses what a training step saves for its backward "
           "pass; it goes with --train";
  std::string recompute = o.getRecompute();
  llvm::SmallVector<StringRef> values;
  StringRef(recompute).split(values, ',');
  for (StringRef v : values)
    if (v != "none" && v != "selective" && v != "full")
      return "--recompute=" + recompute + ": '" + v.str() +
             "' is not none, selective or full";
  int64_t stages = o.getNumStages();
  if (values.size() > 1 &&
      (o.pp <= 1 || static_cast<int64_t>(values.size()) != stages))
    return "--recompute=" + recompute + " gives " + str(values.size()) +
           " values: one for the whole step, or one per pipeline stage (" +
           str(o.pp > 1 ? stages : 1) + ")";
  if (o.isOffloading() && o.target == DeviceTarget::Cpu)
    return "--offload=optimizer is for GPU ranks (--target=cuda or all): on "
           "the CPU the optimizer state already lives in host memory";
  if (o.train && o.pp > 1 && o.dp > 1 && o.bucketMb && *o.bucketMb != 0 &&
      o.zero >= 2 && o.zeroGradSync.value_or("step") == "microbatch")
    return "--bucket-mb with --pp starts each gradient's sum over dp in the "
           "W pass that completes it, once per step; with "
           "--zero-grad-sync=microbatch every W pass reduce-scatters already";
  if (o.train && o.pp > 1 && o.offload != "none")
    return "--offload=optimizer does not go with --pp yet";
  std::string loss = o.getLoss(), optimizer = o.getOptimizer();
  if (o.train && loss != "cross_entropy" && loss != "mse" && loss != "none")
    return "--loss=" + loss + " is not a loss (cross_entropy, mse or none)";
  if (o.train && optimizer != "sgd" && optimizer != "adamw")
    return "--optimizer=" + optimizer + " is not an optimizer (sgd or adamw)";
  if (!o.train &&
      (o.loss || o.optimizer || o.ignoreIndex || o.fuseCrossEntropy))
    return "--loss, --optimizer, --ignore-index and --fuse-cross-entropy go "
           "with --train";
  if (o.fuseCrossEntropy.value_or(false) && loss != "cross_entropy")
    return "--fuse-cross-entropy fuses an LM head with --loss=cross_entropy, "
           "not --loss=" +
           loss;
  return "";
}

/// The rules of the pipeline: chunks, schedule, cuts, micro-batches.
static std::string verifyPipeline(const CompileOptions &o) {
  if (o.ppChunks < 1)
    return "--pp-chunks must be at least 1";
  if (o.ppChunks > 1 && o.pp == 1)
    return "--pp-chunks splits each pipeline rank's share of the model into "
           "chunks; it needs --pp above 1";
  std::string policy = o.getSchedule();
  if (o.ppChunks > 1 && policy != "interleaved")
    return "--pp-chunks=" + str(o.ppChunks) +
           " gives each pipeline rank several model chunks, which only "
           "--schedule=interleaved runs, not --schedule=" +
           policy;
  if (o.pp > 1 && o.ppChunks == 1 && policy == "interleaved")
    return "--schedule=interleaved runs several model chunks on each "
           "pipeline rank: add --pp-chunks=v with v of 2 or more";
  int64_t stages = o.getNumStages();
  if (!o.ppCuts.empty() && static_cast<int64_t>(o.ppCuts.size()) != stages - 1)
    return "--pp=" + str(o.pp) +
           (o.ppChunks > 1 ? " with --pp-chunks=" + str(o.ppChunks) + " (" +
                                 str(stages) + " stages)"
                           : std::string()) +
           " needs " + str(stages - 1) + " names in --pp-cuts, not " +
           str(o.ppCuts.size());
  if (o.microbatches > 1 && o.pp == 1 && !o.train)
    return "--microbatches splits the batch for a pipeline (or, with "
           "--train, for gradient accumulation); it needs --pp above 1 or "
           "--train";
  return "";
}

/// Mixed precision.
static std::string verifyPrecision(const CompileOptions &o) {
  if (o.precision != "fp32" && o.precision != "bf16" && o.precision != "fp16")
    return "--precision=" + o.precision + " is not known: fp32, bf16 or fp16";
  if (o.gradReduce) {
    if (*o.gradReduce != "fp32" && *o.gradReduce != "bf16")
      return "--grad-reduce=" + *o.gradReduce + " is not known: fp32 or bf16";
    if (!o.train || o.dp <= 1)
      return "--grad-reduce is the type of --train's gradient sums over "
             "--dp; it needs both";
    if (*o.gradReduce == "bf16" && o.pp > 1)
      return "--grad-reduce=bf16 with --pp is not supported yet (the "
             "pipeline's gradient sums are fp32)";
    if (*o.gradReduce == "bf16" && o.bucketMb && *o.bucketMb != 0)
      return "--grad-reduce=bf16 with --bucket-mb is not supported yet "
             "(buckets are summed in place, in fp32); leave --bucket-mb "
             "out or give 0";
    if (*o.gradReduce == "bf16" && o.offload != "none")
      return "--grad-reduce=bf16 with --offload is not supported yet";
  }
  if (o.lossScale) {
    if (o.precision != "fp16" || !o.train)
      return "--loss-scale is for --train --precision=fp16 (bf16 and fp32 "
             "have fp32's range and need none)";
    if (!parseLossScale(*o.lossScale))
      return "--loss-scale=" + *o.lossScale +
             " is not known: dynamic (from 65536), dynamic:N (from N) or a "
             "positive number (a static scale)";
  }
  return "";
}

std::string CompileOptions::verify() const {
  for (auto rules :
       {verifyMesh, verifyTraining, verifyPipeline, verifyPrecision}) {
    std::string message = rules(*this);
    if (!message.empty())
      return message;
  }
  return "";
}

MemoryChoices mlir::pcc::getDefaultMemoryChoices(const CompileOptions &o) {
  MemoryChoices choices;
  choices.recompute = o.getRecompute();
  choices.reshardAfterForward = o.reshardAfterForward.value_or(true);
  choices.reduceEachMicrobatch =
      o.zeroGradSync.value_or("step") == "microbatch";
  // Started gathers hide nothing on CPU ranks (MPI moves them only in its
  // calls; docs/benchmarks.md), so no prefetch there by default.
  choices.prefetch =
      o.zeroPrefetch.value_or(o.target == DeviceTarget::Cpu ? 0 : 1);
  // The fused head saves the logits and their gradient (2 N V floats) for
  // one more product of the head (2 N D V FLOPs): 7-10% of a GPT-2 step at
  // batch 4 x 128 on the CPU and 4 x 1024 on an H200 (docs/benchmarks.md).
  // Unasked, it is taken where the logits of one micro-batch reach 1 GiB
  // (Llama 3's 128K vocabulary at 2048 tokens), or where --mem-cap needs
  // it (MemoryFit).
  constexpr int64_t kLargeLogits = int64_t(1) << 30;
  choices.fuseHeadBytes =
      o.fuseCrossEntropy ? (*o.fuseCrossEntropy ? 0 : -1) : kLargeLogits;
  return choices;
}
