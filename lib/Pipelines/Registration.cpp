//===- Registration.cpp - pcc-compile{...} for pcc-opt --------------------===//
//
// `pcc-opt --pass-pipeline='builtin.module(pcc-compile{tp=2 train=true})'`
// on `pcc --emit=mlir-imported` output gives what `pcc --emit=mlir` gives
// with the same options (test/Pipelines). The options are pcc's flags,
// spelled the same.
//
//===----------------------------------------------------------------------===//

#include "pcc/Pipelines/Compile.h"

#include "pcc/Transforms/Passes.h"

#include "mlir/Pass/PassOptions.h"
#include "mlir/Pass/PassRegistry.h"

using namespace mlir;
using namespace mlir::pcc;

namespace {

struct CompilePipelineOptions
    : public PassPipelineOptions<CompilePipelineOptions> {
  template <typename T> using Opt = PassOptions::Option<T>;
  template <typename T> using List = PassOptions::ListOption<T>;

  Opt<int64_t> tp{*this, "tp", llvm::cl::desc("tensor-parallel degree"),
                  llvm::cl::init(1)};
  Opt<int64_t> pp{*this, "pp", llvm::cl::desc("pipeline-parallel degree"),
                  llvm::cl::init(1)};
  Opt<int64_t> dp{*this, "dp", llvm::cl::desc("data-parallel degree"),
                  llvm::cl::init(1)};
  Opt<std::string> meshOrder{*this, "mesh-order",
                             llvm::cl::desc("mesh axes, slowest first"),
                             llvm::cl::init("dp,pp,tp")};
  Opt<bool> sequenceParallel{*this, "sp",
                             llvm::cl::desc("sequence parallelism"),
                             llvm::cl::init(false)};
  Opt<bool> fuseAttention{*this, "fuse-attention",
                          llvm::cl::desc("one pcc.attention per attention"),
                          llvm::cl::init(true)};
  List<std::string> ppCuts{*this, "pp-cuts",
                           llvm::cl::desc("cut after these ONNX nodes")};
  Opt<int64_t> ppChunks{*this, "pp-chunks",
                        llvm::cl::desc("model chunks per pipeline rank"),
                        llvm::cl::init(1)};
  Opt<int64_t> microbatches{*this, "microbatches",
                            llvm::cl::desc("micro-batches per batch"),
                            llvm::cl::init(1)};
  Opt<std::string> schedule{*this, "schedule",
                            llvm::cl::desc("gpipe, 1f1b, interleaved, zb-h1")};
  Opt<bool> train{*this, "train", llvm::cl::desc("compile a training step"),
                  llvm::cl::init(false)};
  Opt<std::string> loss{*this, "loss",
                        llvm::cl::desc("cross_entropy, mse or none")};
  Opt<int64_t> ignoreIndex{*this, "ignore-index",
                           llvm::cl::desc("cross_entropy's ignored label")};
  Opt<bool> fuseCrossEntropy{
      *this, "fuse-cross-entropy",
      llvm::cl::desc("one pcc.linear_cross_entropy for an LM head's loss"),
      llvm::cl::init(false)};
  Opt<std::string> optimizer{*this, "optimizer",
                             llvm::cl::desc("sgd or adamw")};
  Opt<std::string> recompute{*this, "recompute",
                             llvm::cl::desc("none, selective or full")};
  List<std::string> frozen{*this, "frozen",
                           llvm::cl::desc("weights held constant")};
  Opt<int64_t> zero{*this, "zero", llvm::cl::desc("ZeRO stage"),
                    llvm::cl::init(0)};
  Opt<double> bucketMb{*this, "bucket-mb",
                       llvm::cl::desc("gradient bucket MiB")};
  Opt<bool> reshardAfterForward{
      *this, "zero-reshard-after-forward",
      llvm::cl::desc("ZeRO 3: gather again for backward")};
  Opt<int64_t> zeroPrefetch{*this, "zero-prefetch",
                            llvm::cl::desc("ZeRO 3: gathers ahead")};
  Opt<std::string> zeroGradSync{*this, "zero-grad-sync",
                                llvm::cl::desc("step or microbatch")};
  Opt<std::string> offload{*this, "offload",
                           llvm::cl::desc("none or optimizer"),
                           llvm::cl::init("none")};
  Opt<std::string> precision{*this, "precision",
                             llvm::cl::desc("fp32, bf16 or fp16"),
                             llvm::cl::init("fp32")};
  Opt<std::string> lossScale{*this, "loss-scale",
                             llvm::cl::desc("fp16: dynamic, dynamic:N or N")};
  Opt<std::string> gradReduce{*this, "grad-reduce",
                              llvm::cl::desc("dp gradient sums: fp32 or bf16")};
  Opt<std::string> memCap{*this, "mem-cap",
                          llvm::cl::desc("device memory per rank")};
  Opt<std::string> target{*this, "target", llvm::cl::desc("cpu, cuda or all"),
                          llvm::cl::init("cpu")};
  Opt<bool> remarks{*this, "explain", llvm::cl::desc("the planners' remarks"),
                    llvm::cl::init(false)};
  Opt<bool> planMemory{*this, "plan-memory",
                       llvm::cl::desc("fuse and plan memory (pcc -o x.so)"),
                       llvm::cl::init(false)};

  /// The options, or a message saying which is not valid.
  std::string toCompileOptions(CompileOptions &o) const {
    setSharedOptions(o, *this,
                     [](const auto &option) { return option.hasValue(); });
    if (memCap.hasValue() && (o.memCapBytes = parseBytes(memCap)) <= 0)
      return "mem-cap=" + memCap.getValue() + " is not an amount of memory";
    if (target != "cpu" && target != "cuda" && target != "all")
      return "target=" + target.getValue() + " is not cpu, cuda or all";
    o.target = target == "cpu"    ? DeviceTarget::Cpu
               : target == "cuda" ? DeviceTarget::Cuda
                                  : DeviceTarget::All;
    o.emitRemarks = remarks;
    o.planMemory = planMemory;
    return o.verify();
  }
};

} // namespace

void mlir::pcc::registerCompilePipeline() {
  registerPassPipeline(
      "pcc-compile",
      "pcc's whole compile of an imported module (pcc --emit=mlir, or with "
      "plan-memory=true what code generation reads); the options are pcc's "
      "flags",
      [](OpPassManager &pm, StringRef text,
         function_ref<LogicalResult(const Twine &)> errorHandler) {
        CompilePipelineOptions parsed;
        if (failed(parsed.parseFromString(text)))
          return failure();
        CompileOptions options;
        std::string message = parsed.toCompileOptions(options);
        if (!message.empty())
          return errorHandler("pcc-compile: " + message);
        buildCompilePipeline(pm, options);
        return success();
      },
      [](function_ref<void(const detail::PassOptions &)> handler) {
        handler(CompilePipelineOptions());
      });
}
