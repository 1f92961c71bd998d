//===- pcc.cpp - the pcc compiler driver
//-----------------------------------===//
//
// pcc model.onnx [--batch=N] [--dim=name=N] [--tp=N --pp=N --dp=N]
//     [--emit=mlir|mlir-imported|weights|cpp|so] [-o FILE]
//     [--target=cpu|cuda|all] [--cuda-arch=80,90] [--dump-ir=DIR]
//     [--mlir-print-ir-after-all]
//
//===----------------------------------------------------------------------===//

#include "Ckpt.h"
#include "Explain.h"
#include "Memory.h"
#include "pcc/Dialect/Pcc/IR/PccDialect.h"
#include "pcc/Dialect/Pcc/IR/PccInterfaces.h"
#include "pcc/Import/OnnxImporter.h"
#include "pcc/Target/Cpp.h"
#include "pcc/Transforms/CostModel.h"
#include "pcc/Transforms/Passes.h"
#include "pcc/Transforms/Sharding.h"
#include "pcc/Transforms/Training.h"
#include "pcc/runtime/Checkpoint.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/AsmState.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Pass/PassInstrumentation.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Support/FileUtilities.h"
#include "mlir/Transforms/Passes.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/ToolOutputFile.h"
#include "llvm/Support/raw_ostream.h"

using namespace mlir;
using namespace pcctool;
namespace cl = llvm::cl;

static cl::OptionCategory pccCategory("pcc options");

static cl::opt<std::string> inputFile(cl::Positional,
                                      cl::desc("<model.onnx | model.onnxtxt>"),
                                      cl::cat(pccCategory));
static cl::opt<std::string> outputFile("o",
                                       cl::desc("output file ('-' is "
                                                "stdout)"),
                                       cl::value_desc("file"), cl::init("-"),
                                       cl::cat(pccCategory));

enum class Emit { Auto, Mlir, MlirImported, Weights, Cpp, SharedLibrary };
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
static cl::opt<int64_t> tp("tp", cl::desc("tensor-parallel degree"),
                           cl::init(1), cl::cat(pccCategory));
static cl::opt<bool> sequenceParallel(
    "sp",
    cl::desc("sequence parallelism with --tp (Megatron's): the norms and "
             "elementwise ops between tensor-parallel blocks run on a part "
             "of the sequence; reduce-scatter and all-gather replace each "
             "block's all-reduce"),
    cl::init(false), cl::cat(pccCategory));
static cl::opt<bool> reshardAfterForward(
    "zero-reshard-after-forward",
    cl::desc("with --zero=3: gather each weight again in the backward pass "
             "(FSDP's default, true); false keeps the forward pass's "
             "gathered weights until the backward pass (more memory, fewer "
             "bytes moved); with --pp, false gathers each weight once per "
             "step for all its micro-batches (with --mem-cap pcc chooses, "
             "keeping them gathered when that fits)"),
    cl::init(true), cl::cat(pccCategory));
static cl::opt<int> zeroPrefetch(
    "zero-prefetch",
    cl::desc("with --zero=3: start each weight's all-gather this many "
             "gathers before its use, so it overlaps the compute before "
             "(FSDP's prefetch, chosen from the program's order; 0: gather "
             "where it is read, blocking; default 1 for GPU targets, 0 on "
             "--target=cpu, where MPI gains nothing from it)"),
    cl::init(1), cl::cat(pccCategory));
static cl::opt<std::string> zeroGradSync(
    "zero-grad-sync",
    cl::desc("with --pp and --zero=2 or 3: when each gradient is "
             "reduce-scattered over dp: step (once per step; it accumulates "
             "whole over the micro-batches; the default) or microbatch (in "
             "every W pass, into sharded accumulators: less memory, m times "
             "the traffic); with --mem-cap pcc chooses"),
    cl::init("step"), cl::cat(pccCategory));
static cl::opt<std::string> meshOrder(
    "mesh-order",
    cl::desc("the order of the mesh axes in the rank grid, slowest first: "
             "the last varies fastest, so its groups are neighbouring ranks "
             "(put tp last to keep it within a node)"),
    cl::value_desc("dp,pp,tp"), cl::init("dp,pp,tp"), cl::cat(pccCategory));
static cl::opt<int64_t> pp("pp", cl::desc("pipeline-parallel degree"),
                           cl::init(1), cl::cat(pccCategory));
static cl::opt<int64_t> dp("dp", cl::desc("data-parallel degree"), cl::init(1),
                           cl::cat(pccCategory));
static cl::opt<int64_t>
    zero("zero",
         cl::desc("ZeRO stage with --dp: 0 replicates the model state on "
                  "every rank, 1 shards the optimizer state over dp, 2 also "
                  "the gradients, 3 also the weights"),
         cl::init(0), cl::cat(pccCategory));
static cl::list<std::string>
    ppCuts("pp-cuts",
           cl::desc("cut the pipeline after these ONNX nodes (pp x v - 1 "
                    "names, in program order) instead of where the cost "
                    "model would"),
           cl::value_desc("node,node"), cl::CommaSeparated,
           cl::cat(pccCategory));
static cl::opt<int64_t>
    ppChunks("pp-chunks",
             cl::desc("model chunks per pipeline rank for the interleaved "
                      "schedule (implies it): pp x v stages, rank r runs "
                      "stages r, r + pp, ..."),
             cl::init(1), cl::value_desc("v"), cl::cat(pccCategory));
static cl::opt<int64_t>
    microbatches("microbatches",
                 cl::desc("split each batch into this many micro-batches "
                          "that flow through the pipeline stages"),
                 cl::init(1), cl::value_desc("m"), cl::cat(pccCategory));
static cl::opt<std::string>
    schedulePolicy("schedule",
                   cl::desc("micro-batch schedule: gpipe, 1f1b (default), "
                            "interleaved or zb-h1"),
                   cl::init("1f1b"), cl::cat(pccCategory));
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

enum class Target { Cpu, Cuda, All };
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

static cl::OptionCategory trainCategory("pcc training options");
static cl::opt<double> bucketMb(
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
    cl::init(-1), cl::cat(trainCategory));
static cl::opt<std::string> offload(
    "offload",
    cl::desc("none or optimizer: keep the optimizer state and run the "
             "update in host memory on GPU ranks (ZeRO-Offload); the "
             "device keeps the forward, backward and collectives"),
    cl::init("none"), cl::cat(trainCategory));
static cl::opt<std::string> recompute(
    "recompute",
    cl::desc("activation recomputation: none; selective (save what matmuls, "
             "convolutions and lookups produce, compute the elementwise "
             "ops, norms, softmax and dropout after them again in the "
             "backward pass); full (save each stage's or the step's inputs "
             "alone, compute the whole forward again); with --pp one value "
             "per stage may be given, comma-separated"),
    cl::init("none"), cl::cat(trainCategory));
static cl::opt<std::string> memCap(
    "mem-cap",
    cl::desc("with --train --pp: the device memory each rank may use (such "
             "as 512MiB, 1.5GiB or a number of bytes); pcc predicts every "
             "pipeline rank's peak and recomputes activations (none, then "
             "selective, then full, stage by stage) until each fits, and "
             "prints what it chose"),
    cl::init(""), cl::cat(trainCategory));
static int64_t memCapBytes = 0;
static cl::opt<bool>
    train("train",
          cl::desc("compile a training step (forward, backward, optimizer, "
                   "zero-grad phases) instead of inference; pcc-run --steps "
                   "trains it"),
          cl::cat(trainCategory));
static cl::opt<std::string>
    lossKind("loss",
             cl::desc("the loss of the first output: cross_entropy (its last "
                      "dimension against int64 labels, mean over labels, "
                      "ignore-index ignored), mse (mean squared error against "
                      "a float target), none (the output is the loss)"),
             cl::init("cross_entropy"), cl::cat(trainCategory));
static cl::opt<int64_t> ignoreIndex("ignore-index",
                                    cl::desc("cross_entropy: the label that "
                                             "is ignored"),
                                    cl::init(-100), cl::cat(trainCategory));
static cl::opt<std::string>
    optimizerKind("optimizer",
                  cl::desc("sgd or adamw (hyperparameters are pcc-run's: "
                           "--lr, --momentum, --betas, --weight-decay, ...)"),
                  cl::init("adamw"), cl::cat(trainCategory));

static const char *kOverview = R"(pcc: the pcc auto-partitioning compiler

Reads an ONNX model, imports it into the pcc dialect (static shapes, explicit
broadcasts, weights as named pcc.param ops) and runs the compiler pipeline.

Examples:
  pcc examples/mlp.onnx --batch=2 --emit=mlir
  pcc examples/gpt.onnx --dim=batch=2 --dim=seq=16 --emit=mlir -o gpt.mlir
  pcc examples/mlp.onnx --batch=2 --emit=mlir --dump-ir=ir/   # ir/00-import.mlir, ...
  pcc examples/mlp.onnx --emit=weights                        # decoded initializers
  pcc examples/gpt.onnx --dim=batch=8 --dim=seq=16 --explain  # memory plan, fusions
  pcc examples/mlp.onnx --batch=2 -o mlp.so                 # mlp.so + mlp.safetensors
  pcc-run mlp.so --input examples/data/mlp.input.npy --output y.npy
  pcc examples/gpt.onnx --dim=batch=8 --dim=seq=16 --target=cuda -o gpt.so
  pcc-run gpt.so --device cuda --input examples/data/gpt.input.npy --bench 100
  pcc examples/gpt.onnx --dim=batch=2 --dim=seq=16 --tp=4 -o gpt4.so
  pcc-run -n 4 gpt4.so --input examples/data/gpt.input.npy    # 4 ranks, mpirun
  pcc examples/gpt.onnx --dim=batch=8 --dim=seq=16 --pp=2 --microbatches=4 --explain
  pcc examples/gpt.onnx --dim=batch=8 --dim=seq=16 --tp=2 --pp=2 --microbatches=4 -o gp.so
  pcc-run -n 4 gp.so --input examples/data/gpt.batch8.input.npy --trace-svg t.svg
  pcc examples/gpt.onnx --dim=batch=8 --dim=seq=16 --pp=2 --pp-chunks=2 --microbatches=4 -o il.so

Training (one device, or any mix of --tp, --pp, --dp and ZeRO):
  pcc export ckpt -o trained.onnx        # the model with a checkpoint's weights
  pcc ckpt inspect|verify ckpt           # what a checkpoint holds; whether it is sound
  pcc examples/gpt.onnx --train --dim=batch=8 --dim=seq=16 --dp=4 --zero=3 -o z3.so
  pcc-run -n 4 z3.so --steps 100 --data tokens.bin --seq 16   # ZeRO-3 over 4 ranks
  pcc examples/gpt.onnx --train --dim=batch=8 --dim=seq=16 --tp=2 --dp=4 --zero=3 --sp -o t.so
  pcc-run -n 8 t.so --steps 100 --data tokens.bin --seq 16 --save-dir ckpt --save-sharded
  pcc examples/gpt.onnx --train --dim=batch=16 --dim=seq=16 --tp=2 --pp=2 --dp=2 --zero=2 --microbatches=4 -o 3d.so
  pcc-run -n 8 3d.so --steps 100 --data tokens.bin --seq 16 --trace-svg 3d.svg
  pcc examples/mlp.onnx --train --loss=cross_entropy --optimizer=adamw --batch=8 -o train.so
  pcc-run train.so --steps 200 --input x.npy --labels y.npy --lr 3e-4 --loss-log loss.csv
  pcc examples/gpt.onnx --train --dim=batch=8 --dim=seq=64 --microbatches=2 -o gpt-train.so
  pcc examples/gpt.onnx --train --dim=batch=8 --dim=seq=16 --target=cuda --offload=optimizer -o off.so
  pcc examples/mlp.onnx --train --batch=8 --emit=mlir    # forward, backward, optimizer, zero-grad

Exit status: 0 on success, 1 on any error (the message names the file, the
ONNX node or the option at fault).
)";

namespace {
const char *severityName(DiagnosticSeverity severity) {
  switch (severity) {
  case DiagnosticSeverity::Error:
    return "error";
  case DiagnosticSeverity::Warning:
    return "warning";
  case DiagnosticSeverity::Remark:
    return "remark";
  case DiagnosticSeverity::Note:
    return "note";
  }
  return "error";
}

/// Writes the top-level module to `dir/NN-name.mlir` after every pass.
class DumpIrInstrumentation : public PassInstrumentation {
public:
  explicit DumpIrInstrumentation(std::string dir) : dir(std::move(dir)) {}

  LogicalResult dump(Operation *op, StringRef name) {
    while (op->getParentOp())
      op = op->getParentOp();
    SmallString<256> path(dir);
    llvm::sys::path::append(
        path, llvm::formatv("{0:2}-{1}.mlir", counter++, name).str());
    std::error_code ec;
    llvm::raw_fd_ostream os(path, ec);
    if (ec)
      return emitError(op->getLoc())
             << "cannot write '" << path << "': " << ec.message();
    op->print(os);
    return success();
  }

  void runAfterPass(Pass *pass, Operation *op) override {
    (void)dump(op, pass->getArgument().empty() ? pass->getName()
                                               : pass->getArgument());
  }

private:
  std::string dir;
  unsigned counter = 0;
};

int fail(const llvm::Twine &message) {
  llvm::errs() << "pcc: error: " << message << "\n";
  return 1;
}
} // namespace

/// "1,234,567"
/// The passes' remarks for --explain, and whether the import is done (its
/// remarks come first).
static std::vector<std::pair<NoteKind, std::string>> explainNotes;
static bool imported = false;

/// "512MiB", "1.5GiB", "64M", "1048576": bytes, or -1.
static int64_t parseBytes(StringRef text) {
  StringRef number = text.take_while(
      [](char c) { return llvm::isDigit(c) || c == '.'; });
  StringRef unit = text.drop_front(number.size()).trim();
  double value = 0;
  if (number.empty() || number.getAsDouble(value) || value <= 0)
    return -1;
  double scale = unit.empty() || unit == "B"            ? 1
                 : unit == "K" || unit == "KiB"          ? 1024.0
                 : unit == "M" || unit == "MiB"          ? 1048576.0
                 : unit == "G" || unit == "GiB"          ? 1073741824.0
                                                         : -1;
  return scale < 0 ? -1 : static_cast<int64_t>(value * scale);
}

/// --mem-cap: the least activation recomputation whose predicted memory
/// fits on every pipeline rank. Every stage starts saving everything; each
/// rank over the cap moves its stages one step (none, selective, full)
/// until it fits. Before recomputing, ZeRO's cheaper savings are tried,
/// each costing only traffic: under ZeRO 3 the weights gathered in every
/// phase instead of kept through the step, then under ZeRO 2 and 3 the
/// gradients reduce-scattered in every W phase instead of once per step
/// (each unless the user chose). ZeRO 3's prefetch (one more gathered
/// weight alive, no more bytes) is given up before the gradients are
/// reduce-scattered every micro-batch. Returns the --recompute value, or
/// none after an error.
static std::optional<std::string> chooseRecomputation(
    ModuleOp module,
    llvm::function_ref<void(PassManager &, const std::string &, bool)>
        addPasses,
    bool &reshard, bool &eachMicrobatch, int64_t &prefetch) {
  static const char *kLevels[] = {"none", "selective", "full"};
  int64_t stages = pp * ppChunks;
  std::vector<int> level(static_cast<size_t>(stages), 0);
  auto mib = [](int64_t bytes) {
    return llvm::formatv("{0:F3} MiB", bytes / 1048576.0).str();
  };
  // What ZeRO may trade for memory, unless the user said, in the order of
  // the bytes each moves per step: ZeRO 3's weights kept gathered through
  // the step (one gather per weight and step) or gathered in every phase
  // (about 3m); ZeRO 2 and 3's gradients reduce-scattered once per step or
  // in every micro-batch's W (m times).
  bool tryKeeping = zero == 3 && dp > 1 &&
                    !reshardAfterForward.getNumOccurrences();
  bool pipelinedZero = pp > 1 && zero >= 2 && dp > 1;
  bool tryStep = pipelinedZero && !zeroGradSync.getNumOccurrences();
  // A prefetch only acts where the weights are gathered in every phase.
  bool tryPrefetch = zero == 3 && dp > 1 && prefetch > 0 &&
                     !zeroPrefetch.getNumOccurrences();
  // (reshard, eachMicrobatch, prefetch)
  std::vector<std::tuple<bool, bool, int64_t>> choices;
  for (bool r : tryKeeping ? std::vector<bool>{false, true}
                           : std::vector<bool>{reshard})
    for (bool e : tryStep ? std::vector<bool>{false, true}
                          : std::vector<bool>{eachMicrobatch}) {
      choices.push_back({r, e, prefetch});
      if (r && tryPrefetch)
        choices.push_back({r, e, 0});
    }
  size_t choice = 0;
  std::tie(reshard, eachMicrobatch, prefetch) = choices[0];
  while (true) {
    std::string spec;
    for (int l : level)
      spec += (spec.empty() ? "" : ",") + std::string(kLevels[l]);
    OwningOpRef<ModuleOp> trial(cast<ModuleOp>(module->clone()));
    PassManager pm(module.getContext());
    addPasses(pm, spec, /*planMemory=*/true);
    if (failed(pm.run(*trial)))
      return std::nullopt;
    std::vector<pcc::PipelineRankMemory> ranks =
        pcc::predictPipelineMemory(*trial);
    if (ranks.empty())
      return std::nullopt;
    std::string peaks;
    bool fits = true;
    for (auto [r, mem] : llvm::enumerate(ranks)) {
      peaks += (r ? ", " : "") + mib(mem.total());
      fits &= mem.total() <= memCapBytes;
    }
    llvm::errs() << "pcc: --mem-cap " << mib(memCapBytes)
                 << ": --recompute=" << spec
                 << (zero == 3 && dp > 1
                         ? std::string(reshard ? ", ZeRO-3 weights gathered "
                                                 "in every phase"
                                               : ", ZeRO-3 weights kept "
                                                 "gathered through the step")
                         : std::string())
                 << (tryPrefetch && reshard
                         ? std::string(prefetch ? " (prefetched)"
                                                : " (not prefetched)")
                         : std::string())
                 << (pipelinedZero
                         ? std::string(eachMicrobatch
                                           ? ", gradients reduce-scattered "
                                             "every micro-batch"
                                           : ", gradients reduce-scattered "
                                             "once per step")
                         : std::string())
                 << " predicts " << peaks << " on pipeline ranks 0 to "
                 << ranks.size() - 1 << (fits ? ": fits" : "") << "\n";
    if (fits)
      return spec;
    if (choice + 1 < choices.size()) {
      std::tie(reshard, eachMicrobatch, prefetch) = choices[++choice];
      continue; // then recompute, with the last choice
    }
    for (auto [r, mem] : llvm::enumerate(ranks)) {
      if (mem.total() <= memCapBytes)
        continue;
      bool rankMoved = false;
      for (int64_t k = r; k < stages; k += pp)
        if (level[k] < 2) {
          ++level[k];
          rankMoved = true;
        }
      if (!rankMoved) {
        llvm::errs() << "pcc: error: --mem-cap " << mib(memCapBytes)
                     << " cannot be met: pipeline rank " << r << " needs "
                     << mib(mem.total()) << " even with --recompute=full ("
                     << mib(mem.state)
                     << " of it model state; add ranks with --pp, --tp or "
                        "--dp --zero, or fewer micro-batches in flight)\n";
        return std::nullopt;
      }
    }
  }
}

/// `pcc export CKPT -o trained.onnx [--model model.onnx]`: the original
/// ONNX model with a training checkpoint's weights.
int exportCheckpoint(int argc, char **argv) {
  std::string checkpoint, output, model;
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        fail(a + " needs a value");
        std::exit(1);
      }
      return argv[++i];
    };
    if (a == "-o")
      output = value();
    else if (a == "--model")
      model = value();
    else if (a == "--help" || a == "-h") {
      llvm::outs() << "usage: pcc export CHECKPOINT -o trained.onnx "
                      "[--model model.onnx]\n\n"
                      "Writes the ONNX model the checkpoint was trained from "
                      "(or --model) with the trained weights: a save "
                      "directory (its LATEST) or one step-N directory of "
                      "pcc-run --save-dir.\n";
      return 0;
    } else if (!a.empty() && a[0] == '-')
      return fail("pcc export: unknown option '" + a + "' (see --help)");
    else if (checkpoint.empty())
      checkpoint = a;
    else
      return fail("pcc export: unexpected argument '" + a + "'");
  }
  if (checkpoint.empty() || output.empty())
    return fail("usage: pcc export CHECKPOINT -o trained.onnx [--model "
                "model.onnx]");
  auto dir = pccrt::openCheckpoint(checkpoint);
  if (!dir.ok())
    return fail(dir.error());
  if (model.empty()) {
    auto text = pccrt::readTextFile(*dir + "/trainer.json");
    StringRef json = text.ok() ? StringRef(*text) : StringRef();
    // trainer.json's "model": the path pcc compiled the library from.
    size_t at = json.find("\"model\": \"");
    if (at != StringRef::npos) {
      StringRef rest = json.drop_front(at + 10);
      model = rest.take_until([](char c) { return c == '"'; }).str();
    }
    if (model.empty() || !llvm::sys::fs::exists(model))
      return fail("pcc export: the checkpoint names its model as '" + model +
                  "', which is not here; give it with --model model.onnx");
  }
  MLIRContext context;
  ScopedDiagnosticHandler handler(&context, [&](Diagnostic &diag) {
    llvm::errs() << "pcc: error: " << diag.str() << "\n";
    return success();
  });
  // A sharded checkpoint's weights are put together into a temporary file.
  std::string weightsPath = *dir + "/weights.safetensors";
  std::string temporary;
  if (!llvm::sys::fs::exists(weightsPath)) {
    auto saved = pccrt::readCheckpointState(*dir);
    if (!saved.ok())
      return fail(saved.error());
    temporary = output + ".weights.tmp.safetensors";
    pccrt::SafetensorsWriter writer;
    for (const pccrt::TensorEntry &e : saved->weights->tensors()) {
      const uint8_t *data = saved->weights->data(e);
      if (!writer
               .add(e.name, e.dtype, e.shape,
                    std::vector<uint8_t>(data, data + (e.end - e.begin)))
               .ok())
        return fail("pcc export: cannot put '" + e.name + "' together");
    }
    pccrt::Status written = writer.write(temporary);
    if (!written.ok())
      return fail(written.error());
    weightsPath = temporary;
  }
  auto replaced =
      pcc::exportTrainedOnnx(model, weightsPath, output, &context);
  if (!temporary.empty())
    llvm::sys::fs::remove(temporary);
  if (failed(replaced))
    return 1;
  llvm::errs() << "pcc: wrote " << output << " (" << model << " with "
               << *replaced << " trained initializers from " << *dir << ")\n";
  return 0;
}

int main(int argc, char **argv) {
  if (argc >= 2 && StringRef(argv[1]) == "export")
    return exportCheckpoint(argc, argv);
  if (argc >= 2 && StringRef(argv[1]) == "ckpt")
    return runCkpt(argc, argv);
  llvm::InitLLVM init(argc, argv);
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

  if (inputFile.empty())
    return fail("no input model; usage: pcc model.onnx [options] (see "
                "--help)");
  for (auto [name, value] :
       {std::pair{"--tp", tp.getValue()}, std::pair{"--pp", pp.getValue()},
        std::pair{"--dp", dp.getValue()}})
    if (value < 1)
      return fail(llvm::Twine(name) + "=" + llvm::Twine(value) +
                  " must be a positive integer");

  pcc::OnnxImportOptions options;
  options.runChecker = !noOnnxCheck;
  options.remarkSharedWeights = explainPlan;
  options.training = train;
  if (batch.getNumOccurrences()) {
    if (batch < 1)
      return fail("--batch=" + llvm::Twine(batch.getValue()) +
                  " must be a positive integer");
    options.batch = batch;
  }
  for (const std::string &binding : dims) {
    auto [name, value] = StringRef(binding).split('=');
    int64_t n = 0;
    if (name.empty() || value.getAsInteger(10, n) || n < 1)
      return fail("--dim=" + binding +
                  " must have the form name=N with N a positive integer");
    options.dimBindings[name] = n;
  }

  Emit what = emit;
  if (what == Emit::Auto)
    what = StringRef(outputFile).ends_with(".so") ? Emit::SharedLibrary
                                                  : Emit::Mlir;
  bool generate = what == Emit::SharedLibrary || what == Emit::Cpp;
  // --explain alone prints the report instead of the IR.
  bool reportOnly =
      explainPlan && !emit.getNumOccurrences() && outputFile == "-";
  if (explainPlan && (what == Emit::MlirImported || what == Emit::Weights))
    return fail("--explain describes the compiled model; it does not go with "
                "--emit=mlir-imported or --emit=weights");
  if (what == Emit::SharedLibrary && outputFile == "-")
    return fail("building a model library needs -o <file>.so");
  if (dp > 1 && !train)
    return fail("--dp splits a training step's batch over data-parallel "
                "ranks; it goes with --train (for inference, run one copy "
                "of the model per device)");
  if (zero < 0 || zero > 3)
    return fail("--zero=" + std::to_string(zero) +
                " is not a ZeRO stage (0, 1, 2 or 3)");
  if (zero > 0 && dp <= 1)
    return fail("--zero=" + std::to_string(zero) +
                " shards model state over data-parallel ranks; it needs "
                "--dp above 1");
  if (microbatches < 1)
    return fail("--microbatches must be at least 1");
  {
    llvm::StringSet<> seen;
    bool valid = true;
    for (StringRef a : llvm::split(StringRef(meshOrder), ','))
      valid &= (a == "dp" || a == "pp" || a == "tp") && seen.insert(a).second;
    if (!valid || seen.size() != 3)
      return fail("--mesh-order=" + meshOrder +
                  " must name dp, pp and tp once each, slowest first");
  }
  if (bucketMb.getNumOccurrences() &&
      (dp <= 1 || (bucketMb < 0 && bucketMb != -1)))
    return fail("--bucket-mb sizes the gradient buckets of --dp (a size in "
                "MiB, 0 for no buckets, -1 for the size chosen from the "
                "model)");
  if (reshardAfterForward.getNumOccurrences() && zero != 3)
    return fail("--zero-reshard-after-forward chooses when ZeRO-3 gathers "
                "the weights again; it goes with --zero=3");
  if (zeroPrefetch.getNumOccurrences() && (zero != 3 || zeroPrefetch < 0))
    return fail("--zero-prefetch=N starts ZeRO-3's weight gathers N gathers "
                "early; it goes with --zero=3 and N >= 0");
  if (zeroGradSync != "step" && zeroGradSync != "microbatch")
    return fail("--zero-grad-sync=" + zeroGradSync +
                " is not known: step or microbatch");
  if (zeroGradSync.getNumOccurrences() &&
      (!train || pp <= 1 || dp <= 1 || zero < 2))
    return fail("--zero-grad-sync chooses when a pipelined training step "
                "reduce-scatters its gradients under ZeRO 2 or 3; it goes "
                "with --train, --pp, --dp and --zero=2 or 3");
  if (sequenceParallel && (tp <= 1 || !train))
    return fail("--sp splits the sequence over the tensor-parallel ranks of "
                "a training step; it needs --train and --tp above 1");
  if (offload != "none" && offload != "optimizer")
    return fail("--offload=" + offload + " is not known: none or optimizer");
  bool offloading = offload == "optimizer";
  if (offloading && !train)
    return fail("--offload=optimizer moves a training step's optimizer to "
                "the host; it goes with --train");
  if (!memCap.empty()) {
    memCapBytes = parseBytes(memCap);
    if (memCapBytes <= 0)
      return fail("--mem-cap=" + memCap +
                  " is not an amount of memory (such as 512MiB, 1.5GiB or "
                  "a number of bytes)");
    if (!train || pp <= 1)
      return fail("--mem-cap chooses each pipeline stage's activation "
                  "recomputation; it goes with --train --pp (use "
                  "--recompute on one device)");
    if (recompute.getNumOccurrences())
      return fail("--mem-cap chooses the recomputation itself; drop "
                  "--recompute");
  }
  if (recompute.getNumOccurrences() && !train)
    return fail("--recompute chooses what a training step saves for its "
                "backward pass; it goes with --train");
  {
    SmallVector<StringRef> values;
    StringRef(recompute).split(values, ',');
    for (StringRef v : values)
      if (v != "none" && v != "selective" && v != "full")
        return fail("--recompute=" + recompute + ": '" + v.str() +
                    "' is not none, selective or full");
    int64_t stagesWanted = pp * ppChunks;
    if (values.size() > 1 &&
        (pp <= 1 || static_cast<int64_t>(values.size()) != stagesWanted))
      return fail("--recompute=" + recompute + " gives " +
                  std::to_string(values.size()) +
                  " values: one for the whole step, or one per pipeline "
                  "stage (" + std::to_string(pp > 1 ? stagesWanted : 1) +
                  ")");
  }
  if (offloading && target == Target::Cpu)
    return fail("--offload=optimizer is for GPU ranks (--target=cuda or "
                "all): on the CPU the optimizer state already lives in host "
                "memory");
  if (train && pp > 1 && dp > 1 && bucketMb.getNumOccurrences() &&
      bucketMb != 0 && zero >= 2 && zeroGradSync == "microbatch")
    return fail("--bucket-mb with --pp starts each gradient's sum over dp in "
                "the W pass that completes it, once per step; with "
                "--zero-grad-sync=microbatch every W pass reduce-scatters "
                "already");

  if (train && pp > 1 && offload != "none")
    return fail("--offload=optimizer does not go with --pp yet");

  if (train && lossKind != "cross_entropy" && lossKind != "mse" &&
      lossKind != "none")
    return fail("--loss=" + lossKind + " is not a loss (cross_entropy, mse "
                "or none)");
  if (train && optimizerKind != "sgd" && optimizerKind != "adamw")
    return fail("--optimizer=" + optimizerKind +
                " is not an optimizer (sgd or adamw)");
  if (!train && (lossKind.getNumOccurrences() ||
                 optimizerKind.getNumOccurrences() ||
                 ignoreIndex.getNumOccurrences()))
    return fail("--loss, --optimizer and --ignore-index go with --train");
  if (ppChunks < 1)
    return fail("--pp-chunks must be at least 1");
  if (ppChunks > 1 && pp == 1)
    return fail("--pp-chunks splits each pipeline rank's share of the "
                "model into chunks; it needs --pp above 1");
  std::string policy = schedulePolicy;
  if (ppChunks > 1 && !schedulePolicy.getNumOccurrences())
    policy = "interleaved";
  if (ppChunks > 1 && policy != "interleaved")
    return fail("--pp-chunks=" + std::to_string(ppChunks) +
                " gives each pipeline rank several model chunks, which only "
                "--schedule=interleaved runs, not --schedule=" +
                policy);
  if (pp > 1 && ppChunks == 1 && policy == "interleaved")
    return fail("--schedule=interleaved runs several model chunks on each "
                "pipeline rank: add --pp-chunks=v with v of 2 or more");
  int64_t numStages = pp * ppChunks;
  if (!ppCuts.empty() && static_cast<int64_t>(ppCuts.size()) != numStages - 1)
    return fail("--pp=" + std::to_string(pp) +
                (ppChunks > 1
                     ? " with --pp-chunks=" + std::to_string(ppChunks) + " (" +
                           std::to_string(numStages) + " stages)"
                     : std::string()) +
                " needs " + std::to_string(numStages - 1) +
                " names in --pp-cuts, not " + std::to_string(ppCuts.size()));
  if (microbatches > 1 && pp == 1 && !train)
    return fail("--microbatches splits the batch for a pipeline (or, with "
                "--train, for gradient accumulation); it needs --pp above 1 "
                "or --train");

  MLIRContext context;
  context.loadDialect<pcc::PccDialect, func::FuncDialect>();
  // Errors name the ONNX node; the op itself, in generic form, is noise.
  context.printOpOnDiagnostic(false);
  int errors = 0;
  ScopedDiagnosticHandler handler(&context, [&](Diagnostic &diag) {
    if (diag.getSeverity() == DiagnosticSeverity::Error)
      ++errors;
    // The sharding passes explain themselves in remarks; --explain prints
    // them in its report.
    if (explainPlan && diag.getSeverity() == DiagnosticSeverity::Remark) {
      std::string where = describeLocation(diag.getLocation());
      std::string text = diag.str();
      NoteKind kind = !imported                            ? NoteKind::Import
                      : StringRef(text).starts_with("pp=") ? NoteKind::Pipeline
                                                           : NoteKind::Sharding;
      explainNotes.push_back(
          {kind, (where.empty() ? "" : where + ": ") + text});
      return success();
    }
    std::string where = describeLocation(diag.getLocation());
    llvm::errs() << "pcc: " << severityName(diag.getSeverity()) << ": "
                 << (where.empty() ? "" : where + ": ") << diag.str() << "\n";
    for (Diagnostic &note : diag.getNotes()) {
      std::string noteWhere = describeLocation(note.getLocation());
      llvm::errs() << "pcc: note: "
                   << (noteWhere.empty() ? "" : noteWhere + ": ") << note.str()
                   << "\n";
    }
    return success();
  });

  if (what == Emit::Weights) {
    auto weights = pcc::summarizeOnnxWeights(inputFile, &context);
    if (failed(weights))
      return 1;
    std::string errorMessage;
    auto output = openOutputFile(outputFile, &errorMessage);
    if (!output)
      return fail("cannot write '" + outputFile + "': " + errorMessage);
    for (const pcc::OnnxWeightSummary &w : *weights) {
      std::string shape;
      for (int64_t d : w.shape)
        shape += (shape.empty() ? "" : "x") + std::to_string(d);
      output->os() << llvm::formatv(
          "{0} {1} [{2}] {3} count={4} min={5:g} max={6:g} mean={7:g}\n",
          w.name, w.elementType, shape, w.storage, w.count, w.min, w.max,
          w.mean);
    }
    output->keep();
    return 0;
  }

  auto module = pcc::importOnnxFile(inputFile, &context, options);
  if (failed(module))
    return 1;
  imported = true;
  Builder b(&context);
  // The mesh, in the rank grid's order (--mesh-order, slowest first).
  SmallVector<std::pair<StringRef, int64_t>> meshAxes;
  for (StringRef a : llvm::split(StringRef(meshOrder), ','))
    meshAxes.emplace_back(a, a == "dp" ? dp : a == "pp" ? pp : tp);
  pcc::setMesh(**module, meshAxes);

  std::unique_ptr<DumpIrInstrumentation> dumper;
  if (!dumpIr.empty()) {
    if (std::error_code ec = llvm::sys::fs::create_directories(dumpIr))
      return fail("cannot create --dump-ir directory '" + dumpIr +
                  "': " + ec.message());
    // A pass nested on functions runs on several functions at once; the
    // dump prints the whole module after each of them, so it must not run
    // beside a pass changing a sibling function (a crash or a hang, found
    // by the plan fuzzer). MLIR asks the same of module-scope IR printing.
    context.disableMultithreading();
    dumper = std::make_unique<DumpIrInstrumentation>(dumpIr);
    if (failed(dumper->dump(**module, "import")))
      return 1;
  }

  if (what == Emit::Mlir || generate) {
    PassManager pm(&context);
    if (failed(applyPassManagerCLOptions(pm)))
      return 1;
    if (dumper)
      pm.addInstrumentation(std::move(dumper));
    // The passes, with the activation recomputation `recomputeSpec`
    // (--recompute, or what --mem-cap chose); `planMemory` adds the fusion
    // and memory plan that code generation and the predictions read.
    // ZeRO 3: gather the weights again after the forward pass (or, in a
    // pipeline, in every phase); --mem-cap may choose to keep them.
    bool reshard = reshardAfterForward;
    // ZeRO 2 and 3 in a pipeline: reduce-scatter once per step, or in
    // every W phase; --mem-cap may choose the second.
    bool eachMicrobatch = zeroGradSync == "microbatch";
    // ZeRO 3's prefetch depth: started gathers hide nothing on CPU ranks
    // (MPI moves them only in its calls; docs/benchmarks.md), so 0 there;
    // --mem-cap may give it up.
    int64_t prefetch = zeroPrefetch.getNumOccurrences() ? zeroPrefetch
                       : target == Target::Cpu          ? 0
                                                        : 1;
    auto addPasses = [&](PassManager &pm, const std::string &recomputeSpec,
                         bool planMemory) {
      pcc::buildImportCleanupPipeline(pm);
      if (microbatches * dp > 1) {
        // The model is imported at its whole batch; the analysis finds the
        // rows and rewrites the program to one micro-batch of one data-
        // parallel rank (micro-batch j of rank r: rows [(j dp + r) b, ...)).
        pcc::SplitBatchOptions split;
        split.microbatches = microbatches;
        split.dataParallel = dp;
        pm.addNestedPass<func::FuncOp>(pcc::createSplitBatch(split));
        pm.addPass(createCanonicalizerPass());
      }
      if (train) {
        pcc::TrainModeOptions trainMode;
        trainMode.dataParallel = dp;
        pm.addNestedPass<func::FuncOp>(pcc::createTrainMode(trainMode));
        pcc::setTrainingAttr(**module,
                             {b.getNamedAttr("microbatches",
                                             b.getI64IntegerAttr(microbatches))});
        pcc::LossOptions loss;
        loss.kind = lossKind;
        loss.ignoreIndex = ignoreIndex;
        pm.addPass(pcc::createLoss(loss));
        pm.addPass(createCanonicalizerPass());
      }
      // The stage cut and the micro-batch schedule of --pp.
      auto addPipelineCut = [&](bool groupedTransfers) {
        pcc::PipelineCutOptions cut;
        cut.emitRemarks = explainPlan;
        cut.chunks = ppChunks;
        cut.cuts.assign(ppCuts.begin(), ppCuts.end());
        // CPU ranks' stages are balanced for a CPU core; GPU (and
        // --target=all) libraries for the GPU.
        cut.device = target == Target::Cpu ? "cpu" : "gpu";
        pm.addPass(pcc::createPipelineCut(cut));
        pcc::PipelineScheduleOptions sched;
        sched.policy = policy;
        sched.microbatches = microbatches;
        sched.groupedTransfers = groupedTransfers;
        pm.addPass(pcc::createPipelineSchedule(sched));
      };
      if (train && pp > 1) {
        // Cut first (the loss lands on the last stage), then differentiate
        // each stage: a schedule places its forward and backward phases.
        // GPU ranks run each list's transfers as NCCL groups, which the
        // schedule pass checks cannot deadlock.
        addPipelineCut(/*groupedTransfers=*/target != Target::Cpu);
        pcc::PipelineTrainingOptions stages;
        stages.kind = optimizerKind;
        for (StringRef r : llvm::split(StringRef(recomputeSpec), ','))
          stages.recompute.push_back(r.str());
        pm.addPass(pcc::createPipelineTraining(stages));
      } else if (train) {
        pcc::AutodiffOptions autodiff;
        autodiff.recompute = recomputeSpec;
        pm.addPass(pcc::createAutodiff(autodiff));
        pcc::OptimizerOptions optimizer;
        optimizer.kind = optimizerKind;
        pm.addPass(pcc::createOptimizer(optimizer));
      }
      if (train) {
        pm.addPass(createCanonicalizerPass());
        pm.addPass(createCSEPass());
      }
      if (train && tp > 1) {
        // One plan for the whole step (each pipeline stage's), made on the
        // forward phase; every phase partitioned with it.
        pcc::PlanShardingOptions plan;
        plan.emitRemarks = explainPlan;
        pm.addNestedPass<func::FuncOp>(pcc::createPlanSharding(plan));
        pcc::PartitionTrainingOptions partition;
        partition.emitRemarks = explainPlan;
        partition.sequenceParallel = sequenceParallel;
        pm.addPass(pcc::createPartitionTraining(partition));
        pm.addPass(createCanonicalizerPass());
        pm.addPass(createCSEPass());
      }
      if (train && dp > 1) {
        pcc::DataParallelOptions data;
        data.dataParallel = dp;
        data.zero = zero;
        data.reshardAfterForward = reshard;
        data.prefetch = prefetch;
        data.reduceEachMicrobatch = eachMicrobatch;
        // ZeRO 1-3's started reduce-scatters hide nothing on CPU ranks
        // (MPI moves them only in its calls; docs/benchmarks.md), so they
        // are off there unless --bucket-mb asks for them; so are an
        // offloaded optimizer's buckets (untried on GPUs).
        // A pipelined step: each gradient's all-reduce (ZeRO 0) or
        // reduce-scatter (1-3) starts in its last W pass when asked for (no
        // sizes: every gradient is its own bucket).
        bool pipelinedBuckets = bucketMb.getNumOccurrences() && bucketMb != 0;
        data.bucketBytes =
            offloading && !bucketMb.getNumOccurrences()    ? 0
            : pp > 1                                       ? (pipelinedBuckets ? -1 : 0)
            : bucketMb >= 0                                ? static_cast<int64_t>(
                                                                 bucketMb * 1048576.0)
            : zero > 0 && target == Target::Cpu &&
                    !bucketMb.getNumOccurrences()
                ? 0
                : -1;
        pm.addPass(pcc::createDataParallel(data));
        pm.addPass(createCanonicalizerPass());
      }
      if (offloading) {
        pm.addPass(pcc::createOffloadOptimizer());
        pm.addPass(createCanonicalizerPass());
      }
      if (tp > 1 && !train) {
        pcc::PlanShardingOptions plan;
        plan.emitRemarks = explainPlan;
        pm.addNestedPass<func::FuncOp>(pcc::createPlanSharding(plan));
        pcc::PartitionOptions partition;
        partition.emitRemarks = explainPlan;
        pm.addNestedPass<func::FuncOp>(pcc::createPartition(partition));
        pm.addPass(createCanonicalizerPass());
      }
      if (pp > 1 && !train)
        addPipelineCut(/*groupedTransfers=*/true);
      if (tp * pp * dp > 1)
        pm.addPass(pcc::createCheckCollectives());
      if (planMemory) {
        pm.addNestedPass<func::FuncOp>(pcc::createFuseElementwise());
        pm.addNestedPass<func::FuncOp>(pcc::createPlanMemory());
      }
    };
    std::string recomputeSpec = recompute;
    if (memCapBytes > 0) {
      auto chosen =
          chooseRecomputation(**module, addPasses, reshard, eachMicrobatch,
                              prefetch);
      if (!chosen)
        return 1;
      recomputeSpec = *chosen;
      explainNotes.clear(); // the trials' remarks, made again below
    }
    addPasses(pm, recomputeSpec, generate || explainPlan);
    if (failed(pm.run(**module)))
      return 1;
  }
  if (errors)
    return 1;
  if (explainPlan)
    explain(**module,
            ExplainSettings{inputFile, tp, pp, ppChunks, dp, zero, explainNotes},
            llvm::outs());
  if (reportOnly)
    return 0;

  if (generate) {
    std::string weightsPath = outputFile;
    if (StringRef(weightsPath).ends_with(".so"))
      weightsPath.resize(weightsPath.size() - 3);
    weightsPath += ".safetensors";
    // An offloaded optimizer runs the CPU code of its update phase.
    unsigned targets = target == Target::Cpu ? pcc::kTargetCpu
                       : target == Target::Cuda && !offloading
                           ? pcc::kTargetCuda
                           : pcc::kTargetCpu | pcc::kTargetCuda;
    pcc::CppEmitOptions emitOptions;
    emitOptions.targets = targets;
    emitOptions.source = inputFile;
    emitOptions.weightsFile = llvm::sys::path::filename(weightsPath).str();
    std::string source;
    llvm::raw_string_ostream sourceStream(source);
    if (failed(pcc::emitCpp(**module, sourceStream, emitOptions)))
      return 1;
    if (what == Emit::Cpp) {
      std::string errorMessage;
      auto output = openOutputFile(outputFile, &errorMessage);
      if (!output)
        return fail("cannot write '" + outputFile + "': " + errorMessage);
      output->os() << source;
      output->keep();
      return 0;
    }
    // The weights file holds the initializers; gradients and optimizer
    // state (`<weight>@<kind>`) start at zero in the runtime.
    std::vector<std::string> names;
    for (auto &[name, type] : pcc::getWeightOrder(**module))
      if (pcc::splitStateName(name).second.empty())
        names.push_back(name);
    // Bytes in the file (whole weights) and bytes one rank reads (its
    // slices of split weights, plus every weight some op reads whole).
    // A pipeline rank reads only its stage's weights.
    llvm::StringMap<int64_t> wholeBytes;
    llvm::DenseMap<Operation *, llvm::StringMap<int64_t>> stageBytes;
    (*module)->walk([&](pcc::ParamOp param) {
      int64_t local = bytesOf(param.getType());
      int64_t whole = local;
      if (pcc::ShardingAttr shard = param.getShardAttr())
        whole = shard.isFlat()
                    ? bytesOf(RankedTensorType::get(
                          *param.getWhole(), param.getType().getElementType()))
                    : whole * *pcc::getMeshAxisSize(param, shard.getAxis());
      if (!pcc::splitStateName(param.getName()).second.empty())
        return; // training state, not stored
      wholeBytes[param.getName()] = whole;
      int64_t &read =
          stageBytes[param->getParentOfType<func::FuncOp>()][param.getName()];
      read = std::max(read, local);
    });
    int64_t weightBytes = 0, bytesPerRank = 0;
    for (auto &entry : wholeBytes)
      weightBytes += entry.second;
    for (auto &[stage, bytes] : stageBytes) {
      int64_t sum = 0;
      for (auto &entry : bytes)
        sum += entry.second;
      bytesPerRank = std::max(bytesPerRank, sum);
    }
    if (failed(pcc::writeOnnxWeights(inputFile, names, weightsPath, &context)))
      return 1;
    pcc::BuildOptions buildOptions;
    buildOptions.keepSource = keepSource;
    buildOptions.targets = targets;
    for (const std::string &arch : cudaArch) {
      int64_t n = 0;
      if (StringRef(arch).getAsInteger(10, n) || n < 50)
        return fail("--cuda-arch=" + arch +
                    " is not a GPU architecture number such as 80 or 90");
      buildOptions.cudaArchitectures.push_back(arch);
    }
    if (targets & pcc::kTargetCuda) {
      std::vector<std::string> archs = buildOptions.cudaArchitectures;
      if (archs.empty())
        archs = pcc::getDefaultCudaArchitectures();
      std::string list;
      for (const std::string &arch : archs)
        list += (list.empty() ? "sm_" : ", sm_") + arch;
      llvm::errs() << "pcc: compiling CUDA kernels with nvcc for " << list
                   << "\n";
    }
    if (failed(pcc::buildSharedLibrary(&context, source, outputFile,
                                       buildOptions)))
      return 1;
    int64_t arena = rankArenaBytes(**module);
    llvm::errs() << "pcc: wrote " << outputFile << " ("
                 << (target == Target::Cpu    ? "cpu"
                     : target == Target::Cuda ? "cuda"
                                              : "cpu+cuda")
                 << ", arena " << arena << " bytes) and " << weightsPath << " ("
                 << names.size() << " weights, " << weightBytes << " bytes";
    if (tp > 1 && pp == 1 && dp == 1)
      llvm::errs() << "; each of the " << tp << " tp ranks reads "
                   << bytesPerRank;
    else if (pp == 1 && bytesPerRank < weightBytes)
      llvm::errs() << "; each of the " << tp * dp << " ranks reads "
                   << bytesPerRank;
    else if (pp > 1)
      llvm::errs() << "; each of the " << tp * pp * dp << " ranks reads at most "
                   << bytesPerRank;
    llvm::errs() << ")\n";
    return 0;
  }

  std::string errorMessage;
  auto output = openOutputFile(outputFile, &errorMessage);
  if (!output)
    return fail("cannot write '" + outputFile + "': " + errorMessage);
  (*module)->print(output->os());
  output->os() << "\n";
  output->keep();
  return 0;
}
