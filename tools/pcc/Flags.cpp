//===- Flags.cpp - pcc's command line -------------------------------------===//

#include "Flags.h"

#include "mlir/IR/AsmState.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Pass/PassManager.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/CommandLine.h"

using namespace mlir;
using namespace pcctool;
namespace cl = llvm::cl;
using Target = mlir::pcc::DeviceTarget;

static cl::OptionCategory pccCategory("pcc options");
cl::OptionCategory pcctool::trainCategory("pcc training options");

static cl::opt<std::string> inputFile(cl::Positional,
                                      cl::desc("<model.onnx | model.onnxtxt>"),
                                      cl::cat(pccCategory));
static cl::opt<std::string> outputFile("o",
                                       cl::desc("output file ('-' is "
                                                "stdout)"),
                                       cl::value_desc("file"), cl::init("-"),
                                       cl::cat(pccCategory));

static cl::opt<Emit>
    emit("emit", cl::desc("what to produce"), cl::init(Emit::Auto),
         cl::values(clEnumValN(Emit::Mlir, "mlir",
                               "pcc IR after the import clean-up pipeline"),
                    clEnumValN(Emit::MlirImported, "mlir-imported",
                               "pcc IR exactly as imported, before any pass"),
                    clEnumValN(Emit::Weights, "weights",
                               "one line per initializer: type, shape, storage "
                               "and min/max/mean of the decoded values"),
                    clEnumValN(Emit::Cpp, "cpp",
                               "the generated C++ (CUDA C++ for --target=cuda "
                               "or all) of the model library"),
                    clEnumValN(Emit::SharedLibrary, "so",
                               "a shared library for pcc-run (the default for "
                               "-o *.so)")),
         cl::cat(pccCategory));

static cl::opt<int64_t> batch("batch",
                              cl::desc("bind the leading dimension of every "
                                       "input that is symbolic"),
                              cl::value_desc("N"), cl::cat(pccCategory));
static cl::list<std::string>
    dims("dim", cl::desc("bind a symbolic dimension by name (repeatable)"),
         cl::value_desc("name=N"), cl::cat(pccCategory));
static cl::opt<int64_t> importFoldLimit(
    "import-fold-limit",
    cl::desc("the largest value, in elements, the importer evaluates on the "
             "host (default 4194304); tests lower it to make a small model "
             "compute its masks in IR as a large one does"),
    cl::value_desc("N"), cl::init(pcc::kDefaultFoldLimit), cl::Hidden,
    cl::cat(pccCategory));
/// The flags that are options of the compile (mlir::pcc::CompileOptions),
/// each named as the field it sets, as the pcc-compile pipeline's are:
/// pcc::setSharedOptions reads either.
static struct SharedFlags {
  cl::opt<int64_t> tp{"tp", cl::desc("tensor-parallel degree"), cl::init(1),
                      cl::cat(pccCategory)};
  cl::opt<int64_t> pp{"pp", cl::desc("pipeline-parallel degree"), cl::init(1),
                      cl::cat(pccCategory)};
  cl::opt<int64_t> dp{"dp", cl::desc("data-parallel degree"), cl::init(1),
                      cl::cat(pccCategory)};
  cl::opt<std::string> meshOrder{
      "mesh-order",
      cl::desc("the order of the mesh axes in the rank grid, slowest first: "
               "the last varies fastest, so its groups are neighbouring ranks "
               "(put tp last to keep it within a node)"),
      cl::value_desc("dp,pp,tp"), cl::init("dp,pp,tp"), cl::cat(pccCategory)};
  cl::opt<bool> sequenceParallel{
      "sp",
      cl::desc("sequence parallelism with --tp (Megatron's): the norms and "
               "elementwise ops between tensor-parallel blocks run on a part "
               "of the sequence; reduce-scatter and all-gather replace each "
               "block's all-reduce"),
      cl::init(false), cl::cat(pccCategory)};
  cl::opt<bool> fuseAttention{
      "fuse-attention",
      cl::desc("each attention as one fused op, without the S x S "
               "scores (=false: the model's products and softmax)"),
      cl::init(true), cl::cat(pccCategory)};
  cl::list<std::string> ppCuts{
      "pp-cuts",
      cl::desc("cut the pipeline after these ONNX nodes (pp x v - 1 "
               "names, in program order) instead of where the cost "
               "model would"),
      cl::value_desc("node,node"), cl::CommaSeparated, cl::cat(pccCategory)};
  cl::opt<int64_t> ppChunks{
      "pp-chunks",
      cl::desc("model chunks per pipeline rank for the interleaved "
               "schedule (implies it): pp x v stages, rank r runs "
               "stages r, r + pp, ..."),
      cl::init(1), cl::value_desc("v"), cl::cat(pccCategory)};
  cl::opt<int64_t> microbatches{
      "microbatches",
      cl::desc("split each batch into this many micro-batches "
               "that flow through the pipeline stages"),
      cl::init(1), cl::value_desc("m"), cl::cat(pccCategory)};
  cl::opt<std::string> schedule{
      "schedule",
      cl::desc("micro-batch schedule: gpipe, 1f1b (default), "
               "interleaved or zb-h1"),
      cl::init("1f1b"), cl::cat(pccCategory)};
  cl::opt<bool> train{
      "train",
      cl::desc("compile a training step (forward, backward, optimizer, "
               "zero-grad phases) instead of inference; pcc-run --steps "
               "trains it"),
      cl::cat(trainCategory)};
  cl::opt<std::string> loss{
      "loss",
      cl::desc("the loss of the first output: cross_entropy (its last "
               "dimension against int64 labels, mean over labels, "
               "ignore-index ignored), mse (mean squared error against "
               "a float target), none (the output is the loss)"),
      cl::init("cross_entropy"), cl::cat(trainCategory)};
  cl::opt<int64_t> ignoreIndex{"ignore-index",
                               cl::desc("cross_entropy: the label that "
                                        "is ignored"),
                               cl::init(-100), cl::cat(trainCategory)};
  cl::opt<bool> fuseCrossEntropy{
      "fuse-cross-entropy",
      cl::desc("cross_entropy: an LM head's product and the loss as one op "
               "in vocabulary blocks, without the N x V logits, for one more "
               "product of the head (=false: the logits, then the loss; "
               "unset: fused where the logits reach 1 GiB or --mem-cap needs "
               "it)"),
      cl::init(false), cl::cat(trainCategory)};
  cl::opt<std::string> optimizer{
      "optimizer",
      cl::desc("sgd or adamw (hyperparameters are pcc-run's: "
               "--lr, --momentum, --betas, --weight-decay, ...)"),
      cl::init("adamw"), cl::cat(trainCategory)};
  cl::opt<std::string> recompute{
      "recompute",
      cl::desc("activation recomputation: none; selective (save what matmuls, "
               "convolutions and lookups produce and the residual and bias "
               "adds after them, compute the other elementwise "
               "ops, norms, softmax and dropout after them again in the "
               "backward pass); full (save the residual stream between "
               "layers, compute each layer again as the backward pass "
               "reaches it); with --pp one value "
               "per stage may be given, comma-separated"),
      cl::init("none"), cl::cat(trainCategory)};
  cl::list<std::string> frozen{
      "frozen",
      cl::desc("weights training holds constant, as PyTorch's "
               "requires_grad=False (no gradient, no optimizer state); the "
               "rotary embeddings' inv_freq buffers are by default"),
      cl::value_desc("weight,weight"), cl::CommaSeparated,
      cl::cat(trainCategory)};
  cl::opt<int64_t> zero{
      "zero",
      cl::desc("ZeRO stage with --dp: 0 replicates the model state on "
               "every rank, 1 shards the optimizer state over dp, 2 also "
               "the gradients, 3 also the weights"),
      cl::init(0), cl::cat(pccCategory)};
  cl::opt<double> bucketMb{
      "bucket-mb",
      cl::desc("with --dp: gradient buckets of about this many MiB, each "
               "all-reduced (ZeRO 0) or reduce-scattered (ZeRO 1-3) while the "
               "backward pass goes on (0: none, each gradient blocking; "
               "-1 and the default: chosen from the model, a quarter of the "
               "gradients within 64 KiB to 25 MiB; by default none for ZeRO "
               "1-3 on --target=cpu and with --offload; with --pp none unless "
               "asked for: each "
               "gradient's all-reduce or reduce-scatter starts in its last W "
               "pass)"),
      cl::init(-1), cl::cat(trainCategory)};
  cl::opt<bool> reshardAfterForward{
      "zero-reshard-after-forward",
      cl::desc("with --zero=3: gather each weight again in the backward pass "
               "(FSDP's default, true); false keeps the forward pass's "
               "gathered weights until the backward pass (more memory, fewer "
               "bytes moved); with --pp, false gathers each weight once per "
               "step for all its micro-batches (with --mem-cap pcc chooses, "
               "keeping them gathered when that fits)"),
      cl::init(true), cl::cat(pccCategory)};
  cl::opt<int> zeroPrefetch{
      "zero-prefetch",
      cl::desc("with --zero=3: start each weight's all-gather this many "
               "gathers before its use, so it overlaps the compute before "
               "(FSDP's prefetch, chosen from the program's order; 0: gather "
               "where it is read, blocking; default 1 for GPU targets, 0 on "
               "--target=cpu, where MPI gains nothing from it)"),
      cl::init(1), cl::cat(pccCategory)};
  cl::opt<std::string> zeroGradSync{
      "zero-grad-sync",
      cl::desc("with --pp and --zero=2 or 3: when each gradient is "
               "reduce-scattered over dp: step (once per step; it accumulates "
               "whole over the micro-batches; the default) or microbatch (in "
               "every W pass, into sharded accumulators: less memory, m times "
               "the traffic); with --mem-cap pcc chooses"),
      cl::init("step"), cl::cat(pccCategory)};
  cl::opt<std::string> offload{
      "offload",
      cl::desc("none or optimizer: keep the optimizer state and run the "
               "update in host memory on GPU ranks (ZeRO-Offload); the "
               "device keeps the forward, backward and collectives"),
      cl::init("none"), cl::cat(trainCategory)};
  cl::opt<std::string> precision{
      "precision",
      cl::desc("fp32 (the default), bf16 or fp16: torch.autocast's mixed "
               "precision (16-bit products, fp32 weights and optimizer)"),
      cl::init("fp32"), cl::cat(pccCategory)};
  cl::opt<std::string> gradReduce{
      "grad-reduce",
      cl::desc("with --dp: the type gradients are summed over dp in: fp32 "
               "(the default) or bf16 (half the bytes; not yet with --pp, "
               "--bucket-mb or --offload)"),
      cl::cat(trainCategory)};
  cl::opt<std::string> lossScale{
      "loss-scale",
      cl::desc("fp16 training: dynamic (the default: from 65536, halved at "
               "an overflow, whose step is skipped, doubled after 2000 "
               "steps without one), dynamic:N (from N) or a static N"),
      cl::cat(trainCategory)};
} flags;

static cl::opt<std::string>
    dumpIr("dump-ir",
           cl::desc("write the IR after import and after each pass to "
                    "numbered files in this directory"),
           cl::value_desc("dir"), cl::cat(pccCategory));
static cl::opt<bool> keepSource(
    "keep-source",
    cl::desc("keep the generated source beside the library (model.so.cpp, "
             "or model.so.cu for CUDA)"),
    cl::cat(pccCategory));

static cl::opt<Target> target(
    "target", cl::desc("what the model library runs on"), cl::init(Target::Cpu),
    cl::values(clEnumValN(Target::Cpu, "cpu",
                          "the host CPU (host C++ compiler; the default)"),
               clEnumValN(Target::Cuda, "cuda", "NVIDIA GPUs (nvcc)"),
               clEnumValN(Target::All, "all",
                          "both, in one library (nvcc); pcc-run --device "
                          "picks")),
    cl::cat(pccCategory));
static cl::list<std::string>
    cudaArch("cuda-arch",
             cl::desc("GPU architectures to build for (default: the ones "
                      "pcc was configured with, 80,90)"),
             cl::value_desc("80,90"), cl::CommaSeparated, cl::cat(pccCategory));
static cl::opt<bool> explainPlan(
    "explain",
    cl::desc("print how the model is compiled: ops, fusions, the memory plan "
             "(peak arena bytes, reuse), weights and the parallel plan"),
    cl::cat(pccCategory));
static cl::opt<bool> noOnnxCheck("no-onnx-check",
                                 cl::desc("skip onnx::checker before import"),
                                 cl::cat(pccCategory));

static cl::opt<std::string> memCap(
    "mem-cap",
    cl::desc("with --train --pp: the device memory each rank may use (such "
             "as 512MiB, 1.5GiB or a number of bytes); pcc predicts every "
             "pipeline rank's peak and recomputes activations (none, then "
             "selective, then full, stage by stage) until each fits, and "
             "prints what it chose"),
    cl::init(""), cl::cat(trainCategory));

static const char *kOverview = R"(pcc: the pcc auto-partitioning compiler

Examples:
  pcc examples/mlp.onnx --batch=2 --emit=mlir
  pcc examples/gpt.onnx --dim=batch=8 --dim=seq=16 --explain  # memory plan, fusions
  pcc examples/mlp.onnx --batch=2 -o mlp.so                 # mlp.so + mlp.safetensors
  pcc-run mlp.so --input examples/data/mlp.input.npy --output y.npy
  pcc examples/gpt.onnx --dim=batch=8 --dim=seq=16 --target=cuda -o gpt.so
  pcc examples/gpt.onnx --dim=batch=2 --dim=seq=16 --tp=4 -o gpt4.so
  pcc-run -n 4 gpt4.so --input examples/data/gpt.input.npy    # 4 ranks, mpirun

Training (one device, or any mix of --tp, --pp, --dp and ZeRO; pcc-run trains):
  pcc export ckpt -o trained.onnx; pcc ckpt inspect|verify ckpt   # ONNX; what it holds, is it sound
  pcc examples/gpt.onnx --train --dim=batch=8 --dim=seq=16 --dp=4 --zero=3 -o z3.so
  pcc examples/gpt.onnx --train --dim=batch=16 --dim=seq=16 --tp=2 --pp=2 --dp=2 --zero=2 --microbatches=4 -o 3d.so
  pcc-run -n 8 3d.so --steps 100 --data tokens.bin --seq 16 --save-dir ckpt --trace-svg 3d.svg
  pcc examples/mlp.onnx --train --loss=cross_entropy --optimizer=adamw --batch=8 -o train.so
  pcc-run train.so --steps 200 --input x.npy --labels y.npy --lr 3e-4 --loss-log loss.csv
  pcc examples/gpt.onnx --train --dim=batch=8 --dim=seq=64 --microbatches=2 --precision=bf16 -o gpt16.so

Automatic plans (pcc plan searches and prints; --auto also compiles the winner):
  pcc plan examples/gpt.onnx --train --dim=batch=8 --dim=seq=16 --devices=4 --device-memory=64MiB
  pcc examples/gpt.onnx --train --dim=batch=8 --dim=seq=16 --auto --devices=4 --device-memory=64MiB -o a.so
  pcc plan big.onnx --train --dim=batch=512 --dim=seq=4096 --devices=1024 --machine=h100 --top=10  # no .onnx.data needed

Exit status: 0 on success, 1 on any error (the message names the file, the
ONNX node or the option at fault).
)";

void pcctool::parseCommandLine(int argc, char **argv) {
  registerAsmPrinterCLOptions();
  registerMLIRContextCLOptions();
  registerPassManagerCLOptions();
  cl::SetVersionPrinter(
      [](llvm::raw_ostream &os) { os << "pcc 0.1.0 (MLIR 22)\n"; });
  // --help shows pcc's options and the IR-inspection options of MLIR, not
  // the hundreds of LLVM internals linked in (--help-hidden lists all).
  cl::HideUnrelatedOptions({&pccCategory, &trainCategory});
  auto &registered = cl::getRegisteredOptions();
  for (const char *name :
       {"mlir-print-ir-after-all", "mlir-print-ir-before-all",
        "mlir-print-ir-after-failure", "mlir-print-ir-after-change",
        "mlir-timing", "mlir-print-debuginfo"}) {
    auto it = registered.find(name);
    if (it != registered.end()) {
      it->second->setHiddenFlag(cl::NotHidden);
      it->second->addCategory(pccCategory);
    }
  }
  cl::ParseCommandLineOptions(argc, argv, kOverview);
}

std::string pcctool::readFlags(DriverFlags &driver,
                               pcc::OnnxImportOptions &import,
                               pcc::CompileOptions &o) {
  driver.inputFile = inputFile;
  driver.outputFile = outputFile;
  driver.emit = emit;
  driver.emitGiven = emit.getNumOccurrences();
  driver.dumpIr = dumpIr;
  driver.keepSource = keepSource;
  driver.cudaArch.assign(cudaArch.begin(), cudaArch.end());
  driver.explain = explainPlan;
  readPlanDriverFlags(driver);
  if (driver.inputFile.empty())
    return "no input model; usage: pcc model.onnx [options] (see --help)";

  import.runChecker = !noOnnxCheck;
  if (importFoldLimit < 1)
    return "--import-fold-limit must be a positive number of elements";
  import.foldLimit = importFoldLimit;
  import.remarkSharedWeights = explainPlan;
  import.training = flags.train;
  if (batch.getNumOccurrences()) {
    if (batch < 1)
      return "--batch=" + std::to_string(batch.getValue()) +
             " must be a positive integer";
    import.batch = batch;
  }
  for (const std::string &binding : dims) {
    auto [name, value] = llvm::StringRef(binding).split('=');
    int64_t n = 0;
    if (name.empty() || value.getAsInteger(10, n) || n < 1)
      return "--dim=" + binding +
             " must have the form name=N with N a positive integer";
    import.dimBindings[name] = n;
  }

  auto given = [](const auto &flag) { return flag.getNumOccurrences() > 0; };
  pcc::setSharedOptions(o, flags, given);
  driver.given = {given(flags.tp),           given(flags.pp),
                  given(flags.dp),           given(flags.zero),
                  given(flags.microbatches), given(flags.schedule),
                  given(flags.ppChunks),     given(flags.recompute),
                  given(flags.precision),    given(flags.sequenceParallel)};
  o.target = target;
  o.emitRemarks = explainPlan;
  if (!memCap.empty()) {
    o.memCapBytes = pcc::parseBytes(memCap);
    if (o.memCapBytes <= 0)
      return "--mem-cap=" + memCap +
             " is not an amount of memory (such as 512MiB, 1.5GiB or a "
             "number of bytes)";
  }
  return o.verify();
}
