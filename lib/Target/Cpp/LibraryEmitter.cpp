//===- LibraryEmitter.cpp - the model library's translation unit ----------===//
//
// Assembles the C++ (or CUDA C++) source of a model library: each entry
// point's code (CppEmitter.cpp), one per pipeline stage or @main alone, in
// its own namespace; the model ABI's tables (signature, weights and their
// shards, mesh, stages, per-rank schedules); and the exported functions.
//
//===----------------------------------------------------------------------===//

#include "FunctionEmitter.h"
#include "pcc/Target/Cpp.h"

#include "pcc/Dialect/Pcc/IR/Contracts.h"
#include "pcc/Dialect/Pcc/IR/PccDialect.h"
#include "pcc/Dialect/Pcc/IR/ScheduleAttr.h"
#include "pcc/Schedule/Schedule.h"

#include "llvm/ADT/StringSet.h"
#include "llvm/Support/FormatVariadic.h"
#include <climits>

using namespace mlir;
using namespace mlir::pcc;
using namespace mlir::pcc::cpp;

using Specs = std::vector<std::pair<std::string, RankedTensorType>>;

std::vector<std::pair<std::string, RankedTensorType>>
mlir::pcc::getWeightOrder(ModuleOp module) {
  std::vector<std::pair<std::string, RankedTensorType>> order;
  llvm::StringSet<> seen;
  module.walk([&](ParamOp param) {
    if (seen.insert(param.getName()).second)
      order.emplace_back(param.getName().str(), param.getType());
  });
  return order;
}

namespace {

/// The initialiser of a static int32_t table (C++ has no empty arrays: an
/// unused 0 stands in for none).
std::string list(ArrayRef<int32_t> values) {
  std::string s;
  for (int32_t v : values)
    s += (s.empty() ? "" : ", ") + std::to_string(v);
  return s.empty() ? std::string("0") : s;
}

/// An argument's or result's `pcc.name`, or `fallback`.
std::string nameOf(DictionaryAttr attrs, StringRef fallback) {
  auto name = attrs ? attrs.getAs<StringAttr>("pcc.name") : StringAttr();
  return name ? name.str() : fallback.str();
}

/// One entry point of the library: @main when the model is not pipelined,
/// else each @stage<k> that @main calls.
struct StageProgram {
  func::FuncOp func;
  /// Per input: output s of the previous stage (s >= 0) or model input k
  /// (-1 - k), as pcc_stage_info.input_sources.
  SmallVector<int32_t> sources;
  std::optional<TargetCode> cpu, cuda;
  /// Per weight the stage reads: its index in the library's table.
  SmallVector<int32_t> weightIndices;
  /// A training phase: its pipeline stage, its kind (enum pcc_phase; -1:
  /// its index) and, for a pipelined backward, its outputs' forward inputs.
  int32_t stage = 0;
  int kind = -1;
  SmallVector<int32_t> targets;
  int64_t arenaBytes() const {
    return func->getAttrOfType<IntegerAttr>(kArenaBytesAttrName).getInt();
  }
};

/// The stages @main calls, in order, with where each stage input comes from.
/// @main must be what pcc-pipeline-cut builds: calls joined by one-hop
/// pcc.transfer ops, returning the last stage's results.
FailureOr<std::vector<StageProgram>> collectStages(ModuleOp module,
                                                   func::FuncOp main) {
  std::vector<StageProgram> stages;
  Block &block = main.getBody().front();
  DenseMap<Operation *, int32_t> stageOfCall;
  for (Operation &op : block.without_terminator()) {
    if (isa<TransferOp>(op))
      continue;
    auto call = dyn_cast<func::CallOp>(op);
    auto callee = call ? module.lookupSymbol<func::FuncOp>(call.getCallee())
                       : func::FuncOp();
    if (!callee || !callee->hasAttr(kStageAttrName))
      return op.emitError("code generation: a pipelined @main holds only "
                          "calls of pipeline stages and pcc.transfer ops "
                          "(run pcc-pipeline-cut)");
    int32_t k = static_cast<int32_t>(stages.size());
    StageProgram stage;
    stage.func = callee;
    for (Value operand : call.getOperands()) {
      if (auto arg = dyn_cast<BlockArgument>(operand)) {
        stage.sources.push_back(-1 - static_cast<int32_t>(arg.getArgNumber()));
        continue;
      }
      auto transfer = operand.getDefiningOp<TransferOp>();
      Operation *producer =
          transfer ? transfer.getInput().getDefiningOp() : nullptr;
      if (!transfer || !producer || !stageOfCall.count(producer) ||
          stageOfCall.lookup(producer) != k - 1 ||
          static_cast<int64_t>(transfer.getTo()) != k ||
          static_cast<int64_t>(transfer.getFrom()) != k - 1)
        return call.emitError("code generation: stage ")
               << k << " must read model inputs or the outputs of stage "
               << k - 1 << " through a one-hop pcc.transfer";
      stage.sources.push_back(static_cast<int32_t>(
          cast<OpResult>(transfer.getInput()).getResultNumber()));
    }
    stageOfCall[call] = k;
    stages.push_back(std::move(stage));
  }
  auto ret = cast<func::ReturnOp>(block.getTerminator());
  Operation *last = nullptr;
  for (auto [i, v] : llvm::enumerate(ret.getOperands())) {
    auto result = dyn_cast<OpResult>(v);
    if (!result || result.getResultNumber() != i ||
        (last && result.getOwner() != last) ||
        !stageOfCall.count(result.getOwner()) ||
        stageOfCall.lookup(result.getOwner()) !=
            static_cast<int32_t>(stages.size()) - 1)
      return main.emitError("code generation: a pipelined @main returns the "
                            "last stage's results, in order");
    last = result.getOwner();
  }
  if (stages.empty() || (last && last->getNumResults() != ret.getNumOperands()))
    return main.emitError("code generation: a pipelined @main returns the "
                          "last stage's results, in order");
  return stages;
}

/// The schedule tables of the model info (kSchedule<r>, kScheduleLengths,
/// kSchedules): each pipeline rank's instruction list from @main's
/// pcc.schedule as pcc_pipeline_instr initialisers ("{op, microbatch,
/// stage, peer}"), under a comment with its text. Without a schedule, one
/// rank computes the one stage. `ranks` is set to the pipeline ranks.
FailureOr<std::string>
scheduleSource(func::FuncOp main,
               const std::optional<::pcc::schedule::Schedule> &schedule,
               int64_t stages, int64_t &ranks) {
  std::vector<std::pair<std::string, std::vector<std::string>>> tables;
  if (!schedule)
    tables.push_back({"F0", {"{0, 0, 0, -1}"}});
  if (schedule && stages % schedule->ranks.size() != 0)
    return main.emitError("code generation: pcc.schedule needs one "
                          "instruction list per pipeline rank");
  int64_t p = schedule ? schedule->ranks.size() : 1;
  for (size_t r = 0; schedule && r < schedule->ranks.size(); ++r) {
    tables.push_back({schedule->describeRank(r), {}});
    std::vector<std::string> &table = tables.back().second;
    for (const ::pcc::schedule::Instr &instr : schedule->ranks[r]) {
      int code = ::pcc::schedule::abiCode(instr.op);
      int64_t stage = ::pcc::schedule::virtualStage(
          static_cast<int32_t>(p), static_cast<int32_t>(r), instr.chunk);
      if (stage >= stages)
        return main.emitError("code generation: pcc.schedule rank ")
               << r << " names stage " << stage << " of a model cut into "
               << stages;
      table.push_back(llvm::formatv("{{{0}, {1}, {2}, {3}}", code,
                                    instr.microbatch, stage, instr.peer)
                          .str());
    }
  }
  ranks = p;
  std::string source;
  for (auto [r, table] : llvm::enumerate(tables)) {
    source += "// pipeline rank " + std::to_string(r) + ": " + table.first +
              "\nstatic const pcc_pipeline_instr kSchedule" +
              std::to_string(r) + "[] = {";
    for (const std::string &instr : table.second)
      source += instr + ", ";
    source += "};\n";
  }
  source += "static const int32_t kScheduleLengths[] = {";
  for (const auto &table : tables)
    source += std::to_string(table.second.size()) + ", ";
  source += "};\nstatic const pcc_pipeline_instr *const kSchedules[] = {";
  for (size_t r = 0; r < tables.size(); ++r)
    source += "kSchedule" + std::to_string(r) + ", ";
  return source + "};\n";
}

/// A stage's or phase's tables: its input and output specs (shapes appended
/// to `shapes`), its input sources and its weight or state indices, named
/// `<prefix>Inputs`, `<prefix>Outputs`, `<prefix>Sources` and
/// `<prefix><indices>`.
std::string programTables(const std::string &prefix, const Specs &in,
                          const Specs &out, const StageProgram &program,
                          StringRef indices, std::string &shapes) {
  // One statement per table: each appends its shapes in order.
  std::string source = specArray(prefix + "Inputs", in, shapes);
  source += specArray(prefix + "Outputs", out, shapes);
  return source + "static const int32_t " + prefix + "Sources[] = {" +
         list(program.sources) + "};\nstatic const int32_t " + prefix +
         indices.str() + "[] = {" + list(program.weightIndices) + "};\n";
}

/// The stage tables of the model info: each stage's input and output specs
/// (shapes appended to `shapes`), input sources, weight indices and arena.
std::string stageSource(ArrayRef<StageProgram> stages, const Specs &inputs,
                        const Specs &outputs, std::string &shapes) {
  std::string source, info;
  for (auto [k, stage] : llvm::enumerate(stages)) {
    std::string prefix = "kStage" + std::to_string(k);
    Specs in, out;
    func::FuncOp f = stage.func;
    for (BlockArgument arg : f.getArguments()) {
      int32_t from = stage.sources[arg.getArgNumber()];
      in.emplace_back(from < 0 ? inputs[-1 - from].first
                               : "stage" + std::to_string(k - 1) + ".out" +
                                     std::to_string(from),
                      tensorTypeOf(arg));
    }
    auto ret = cast<func::ReturnOp>(f.getBody().front().getTerminator());
    bool last = k + 1 == stages.size();
    for (auto [i, v] : llvm::enumerate(ret.getOperands()))
      out.emplace_back(last ? outputs[i].first
                            : "stage" + std::to_string(k) + ".out" +
                                  std::to_string(i),
                       tensorTypeOf(v));
    source += programTables(prefix, in, out, stage, "Weights", shapes);
    info += llvm::formatv(
        "    {{{0}, {1}Inputs, {1}Sources, {2}, {1}Outputs, {3}, {1}Weights, "
        "{4}},\n",
        f.getNumArguments(), prefix, f.getNumResults(),
        stage.weightIndices.size(), stage.arenaBytes());
  }
  return source + "static const pcc_stage_info kStages[] = {\n" + info + "};\n";
}

/// The phases of a training module (pcc-autodiff, pcc-optimizer), in the
/// order of enum pcc_phase, with where each input comes from.
FailureOr<std::vector<StageProgram>> collectPhases(ModuleOp module) {
  std::vector<StageProgram> phases;
  for (auto [k, name] : llvm::enumerate(kPhaseFunctions)) {
    auto f = module.lookupSymbol<func::FuncOp>(name);
    if (!f || !f.getBody().hasOneBlock())
      return module.emitError("code generation: a training module needs a "
                              "single-block func.func @")
             << name << " (run pcc-autodiff and pcc-optimizer)";
    StageProgram phase;
    phase.func = f;
    unsigned n = f.getNumArguments();
    for (unsigned i = 0; i < n; ++i) {
      if (k == 0)
        phase.sources.push_back(-1 - static_cast<int32_t>(i));
      else if (k == 1)
        // Saved activation i is forward output 1 + i; the loss gradient
        // comes last.
        phase.sources.push_back(i + 1 == n ? -1000000
                                           : static_cast<int32_t>(i + 1));
      else if (k == 2 && module.lookupSymbol(kOffloadPhaseFunctions[0]))
        // An offloaded update reads the optimizer_pre phase's outputs.
        phase.sources.push_back(static_cast<int32_t>(i));
      else
        return f.emitError("code generation: the ")
               << kPhaseNames[k] << " phase takes no inputs";
    }
    phases.push_back(std::move(phase));
  }
  // pcc --offload=optimizer: the device's parts of the optimizer step.
  for (StringRef name : kOffloadPhaseFunctions) {
    auto f = module.lookupSymbol<func::FuncOp>(name);
    if (!f)
      break;
    if (!f.getBody().hasOneBlock() || f.getNumArguments() != 0)
      return f.emitError("code generation: @")
             << name << " must be one block without arguments";
    StageProgram phase;
    phase.func = f;
    phases.push_back(std::move(phase));
  }
  if (phases.size() == 5)
    return module.emitError("code generation: an offloaded optimizer needs "
                            "both @")
           << kOffloadPhaseFunctions[0] << " and @"
           << kOffloadPhaseFunctions[1];
  if (phases[1].func.getNumArguments() != phases[0].func.getNumResults())
    return phases[1].func.emitError(
        "code generation: the backward phase must take the forward phase's "
        "saved activations and the loss gradient");
  return phases;
}

/// The phases of a pipelined training module (pcc-autodiff, pcc-optimizer):
/// stage k's forward, backward and weight-gradient at 3 k + {0, 1, 2},
/// then pipeline rank r's optimizer and zero-grad at 3 S + 2 r + {0, 1},
/// with where each input comes from and, for a backward phase, which
/// forward input each output is the cotangent of.
FailureOr<std::vector<StageProgram>>
collectPipelinePhases(ModuleOp module, ArrayRef<StageProgram> stages) {
  std::vector<StageProgram> phases;
  auto lookup = [&](const std::string &name) -> FailureOr<func::FuncOp> {
    auto f = module.lookupSymbol<func::FuncOp>(name);
    if (!f || !f.getBody().hasOneBlock())
      return module.emitError("code generation: a pipelined training "
                              "module needs @")
             << name << " (run pcc-autodiff and pcc-optimizer)";
    return f;
  };
  static const char *const kSuffix[] = {"_forward", "_backward",
                                        "_weight_grad"};
  static const int kKinds[] = {0, 1, 6};
  for (auto [k, stage] : llvm::enumerate(stages)) {
    func::FuncOp backward;
    for (int p = 0; p < 3; ++p) {
      auto f = lookup("stage" + std::to_string(k) + kSuffix[p]);
      if (failed(f))
        return failure();
      StageProgram phase;
      phase.func = *f;
      phase.stage = static_cast<int32_t>(k);
      phase.kind = kKinds[p];
      unsigned realOutputs = func::FuncOp(stage.func).getNumResults();
      for (unsigned i = 0; i < f->getNumArguments(); ++i) {
        if (p == 0) {
          phase.sources.push_back(stage.sources[i]);
          continue;
        }
        // The name lives in `full`: argName views it (nameOf returns a
        // string, and a view of that temporary would dangle).
        std::string full = nameOf(f->getArgAttrDict(i), "");
        StringRef argName = full;
        int32_t source = INT32_MIN;
        if (argName == "loss_grad")
          source = -1000000;
        else if (argName.consume_front("grad_out"))
          source = -2000000 - std::stoi(argName.str());
        else if (argName.consume_front("saved"))
          source = realOutputs + std::stoi(argName.str());
        else if (p == 2 && argName.starts_with("stash"))
          for (unsigned j = 0; j < backward.getNumResults(); ++j)
            if (nameOf(backward.getResultAttrDict(j), "") == full)
              source = -3000000 - static_cast<int32_t>(j);
        if (source == INT32_MIN)
          return f->emitError("code generation: ")
                 << kSuffix[p] + 1 << " input " << i
                 << " is neither saved, a cotangent nor a backward output";
        phase.sources.push_back(source);
      }
      for (unsigned j = 0; j < f->getNumResults() && p == 1; ++j) {
        auto of = f->getResultAttrOfType<IntegerAttr>(j, "pcc.grad_of");
        if (!of)
          return f->emitError("code generation: backward output ")
                 << j << " has no pcc.grad_of";
        phase.targets.push_back(static_cast<int32_t>(of.getInt()));
      }
      if (p == 1)
        backward = *f;
      phases.push_back(std::move(phase));
    }
  }
  for (int32_t r = 0;
       module.lookupSymbol("rank" + std::to_string(r) + "_optimizer"); ++r) {
    for (int p = 2; p < 4; ++p) {
      auto f = lookup("rank" + std::to_string(r) +
                      (p == 2 ? "_optimizer" : "_zero_grad"));
      if (failed(f))
        return failure();
      if (f->getNumArguments() != 0)
        return f->emitError("code generation: the ")
               << kPhaseNames[p] << " phase takes no inputs";
      StageProgram phase;
      phase.func = *f;
      phase.stage = r;
      phase.kind = p;
      phases.push_back(std::move(phase));
    }
  }
  return phases;
}

/// The phase tables of a training library (kPhases).
std::string phaseSource(ArrayRef<StageProgram> phases, std::string &shapes) {
  std::string source, info;
  for (auto [k, phase] : llvm::enumerate(phases)) {
    std::string prefix = "kPhase" + std::to_string(k);
    func::FuncOp f = phase.func;
    Specs in, out;
    for (BlockArgument arg : f.getArguments())
      in.emplace_back(nameOf(f.getArgAttrDict(arg.getArgNumber()),
                             "in" + std::to_string(arg.getArgNumber())),
                      tensorTypeOf(arg));
    auto ret = cast<func::ReturnOp>(f.getBody().front().getTerminator());
    for (auto [i, v] : llvm::enumerate(ret.getOperands()))
      out.emplace_back(
          nameOf(f.getResultAttrDict(i), "out" + std::to_string(i)),
          tensorTypeOf(v));
    source += programTables(prefix, in, out, phase, "State", shapes);
    std::string targets = "nullptr";
    if (!phase.targets.empty()) {
      source += "static const int32_t " + prefix + "Targets[] = {" +
                list(phase.targets) + "};\n";
      targets = prefix + "Targets";
    }
    info += llvm::formatv(
        "    {{{0}, {1}, {2}Inputs, {2}Sources, {3}, {2}Outputs, {4}, "
        "{2}State, {5}, {6}, {7}},\n",
        phase.kind >= 0 ? phase.kind : static_cast<int>(k), f.getNumArguments(),
        prefix, f.getNumResults(), phase.weightIndices.size(),
        phase.arenaBytes(), phase.stage, targets);
  }
  return source + "static const pcc_phase_info kPhases[] = {\n" + info + "};\n";
}

/// Includes and the helpers every entry point uses (error reporting).
void writePreamble(raw_ostream &os, bool cpu, bool cuda, StringRef source) {
  os << "// Generated by pcc from " << source << ". Do not edit.\n"
     << (cpu ? "#include \"pcc/runtime/CpuKernels.h\"\n"
               "#include \"pcc/runtime/FastMath.h\"\n"
             : "")
     << (cuda ? "#include \"pcc/runtime/CudaKernels.h\"\n" : "")
     << "#include \"pcc/runtime/HalfFloat.h\"\n"
        "#include \"pcc/runtime/ModelAbi.h\"\n\n"
     << (cuda ? "#include <cuda_runtime.h>\n\n" : "")
     << "#include <algorithm>\n#include <cmath>\n#include <cstdint>\n"
        "#include <cstring>\n#include <limits>\n#include <string>\n\n"
        "namespace {\n\n"
     << (cpu ? "// CPU kernels get the runtime's clones (CpuClones.h).\n"
               "#include \"pcc/runtime/CpuClones.h\"\n"
               "#define PCC_KERNEL PCC_CPU_CLONES static\n"
               "// GCC 12's loop if-conversion miscompiles a select whose arm\n"
               "// is a load (docs/design-notes.md): kernels with selects go\n"
               "// without it.\n"
               "#if defined(__GNUC__) && !defined(__clang__)\n"
               "#define PCC_SELECT_KERNEL __attribute__((optimize("
               "\"no-tree-loop-if-convert\"))) PCC_KERNEL\n"
               "#else\n#define PCC_SELECT_KERNEL PCC_KERNEL\n#endif\n\n"
             : "")
     << "thread_local std::string lastError;\n\n"
     << "int fail(const char *where, const char *why) {\n"
        "  lastError = std::string(where) + \": \" + why;\n"
        "  return 1;\n}\n\n"
     << (cuda ? "int failWith(const char *message) {\n"
                "  lastError = message;\n  return 1;\n}\n\n"
              : "");
  if (cuda)
    os << "template <typename T> const void *symbolAddress(const T &symbol) "
          "{\n  void *address = nullptr;\n"
          "  cudaGetSymbolAddress(&address, symbol);\n  return address;\n}\n\n";
}

/// The exported functions: pcc_model_get_info, pcc_model_last_error,
/// pcc_model_run_stage (dispatching to each stage's run function for the
/// context's target) and pcc_model_run.
void writeStageSwitch(raw_ostream &os, size_t numStages, bool cpu, bool cuda,
                      int64_t meshRanks, StringRef targetName,
                      llvm::function_ref<std::string(size_t)> space);

void writeSwitch(raw_ostream &os, StringRef what, size_t cases, bool cpu,
                 bool cuda, StringRef targetName,
                 llvm::function_ref<std::string(size_t)> space);

void writeEntryPoints(raw_ostream &os, size_t numStages, bool pipelined,
                      bool training, bool cpu, bool cuda, int64_t meshRanks,
                      StringRef targetName,
                      llvm::function_ref<std::string(size_t)> space) {
  os << "extern \"C\" {\n\n"
     << "const pcc_model_info *pcc_model_get_info(void) { return &kInfo; }\n\n"
     << "const char *pcc_model_last_error(void) { return lastError.c_str(); "
        "}\n\n"
     << "int pcc_model_run_stage(int32_t stage, const pcc_run_context "
        "*context,\n"
        "                        const void *const *in, void *const *out,\n"
        "                        const void *const *w, void *arena) {\n"
        "  char *bytes = static_cast<char *>(arena);\n"
        "  // Inference only reads the model state.\n"
        "  void *const *state = const_cast<void *const *>(w);\n";
  if (training)
    os << "  (void)stage; (void)in; (void)out; (void)state; (void)bytes;\n"
          "  return fail(\"pcc_model_run\", \"this is a training library; "
          "train it with pcc-run --steps (pcc_model_run_phase)\");\n}\n\n";
  else
    writeStageSwitch(os, numStages, cpu, cuda, meshRanks, targetName, space);
  if (pipelined || training)
    os << "int pcc_model_run(const pcc_run_context *context, const void "
          "*const *in,\n"
          "                  void *const *out, const void *const *w, "
          "void *arena) {\n"
          "  (void)context; (void)in; (void)out; (void)w; (void)arena;\n"
          "  return fail(\"pcc_model_run\", "
       << (training ? std::string("\"this is a training library; train it "
                                  "with pcc-run --steps\"")
                    : "\"this library is pipelined over " +
                          std::to_string(numStages) +
                          " stages; run each stage with pcc_model_run_stage "
                          "(pcc-run -n " +
                          std::to_string(meshRanks) + " does)\"")
       << ");\n}\n\n";
  else
    os << "int pcc_model_run(const pcc_run_context *context, const void "
          "*const *in,\n"
          "                  void *const *out, const void *const *w, "
          "void *arena) {\n"
          "  return pcc_model_run_stage(0, context, in, out, w, arena);\n"
          "}\n\n";
  // Training phases.
  os << "int pcc_model_run_phase(int32_t phase, const pcc_run_context "
        "*context,\n"
        "                        const void *const *in, void *const *out,\n"
        "                        void *const *state, void *arena) {\n"
        "  char *bytes = static_cast<char *>(arena);\n";
  if (!training) {
    os << "  (void)phase; (void)context; (void)in; (void)out; (void)state; "
          "(void)bytes;\n"
          "  return fail(\"pcc_model_run_phase\", \"this is an inference "
          "library (compile with pcc --train to train)\");\n}\n\n";
  } else {
    writeSwitch(os, "phase", numStages, cpu, cuda, targetName, space);
  }
  os << "} // extern \"C\"\n";
}

/// pcc_model_run_stage's body after its prologue: the switch over the
/// stages, dispatching to each stage's run function for the context's
/// target.
void writeStageSwitch(raw_ostream &os, size_t numStages, bool cpu, bool cuda,
                      int64_t meshRanks, StringRef targetName,
                      llvm::function_ref<std::string(size_t)> space) {
  if (meshRanks > 1)
    os << "  if (!context->comms)\n"
          "    return fail(\"pcc_model_run\", \"this library was partitioned "
          "for a mesh of "
       << meshRanks << " ranks; run it with pcc-run -n " << meshRanks
       << "\");\n";
  writeSwitch(os, "stage", numStages, cpu, cuda, targetName, space);
}

/// The end of an entry point's body: a switch over `what` ("stage" or
/// "phase"), dispatching case k to space(k)'s run function for the
/// context's target, and the errors for no such case or target.
void writeSwitch(raw_ostream &os, StringRef what, size_t cases, bool cpu,
                 bool cuda, StringRef targetName,
                 llvm::function_ref<std::string(size_t)> space) {
  os << "  switch (" << what << ") {\n";
  for (size_t k = 0; k < cases; ++k) {
    os << "  case " << k << ":\n";
    if (cpu)
      os << "    if (context->target == PCC_TARGET_CPU)\n"
            "      return "
         << space(k) << "::run_cpu(context, in, out, state, bytes);\n";
    if (cuda)
      os << "    if (context->target == PCC_TARGET_CUDA)\n"
            "      return "
         << space(k)
         << "::run_cuda(context, static_cast<pcc_cuda_context *>("
            "context->backend), in, out, state, bytes);\n";
    os << "    break;\n";
  }
  os << "  default:\n"
        "    return fail(\"pcc_model_run_"
     << what << "\", \"no such " << what
     << "\");\n"
        "  }\n"
        "  (void)in; (void)out; (void)state; (void)bytes;\n"
        "  return fail(\"pcc_model_run_"
     << what
     << "\", \"this library has "
        "no code for the requested target (it was compiled for "
     << targetName << ")\");\n}\n\n";
}

/// The mesh: axis names in the rank grid's order (the mesh op's), their
/// indices and sizes, as the library's tables list them.
struct MeshInfo {
  llvm::StringMap<int> axes;
  std::string names, sizes;
  int64_t ranks = 1;
};

MeshInfo getMeshInfo(ModuleOp module) {
  MeshInfo info;
  if (MeshOp mesh = getMesh(module))
    for (auto [axis, size] : llvm::zip(mesh.getAxes(), mesh.getShape())) {
      StringRef name = cast<StringAttr>(axis).getValue();
      info.axes[name] = info.axes.size();
      info.ranks *= size;
      info.names += quoted(name) + ", ";
      info.sizes += std::to_string(size) + ", ";
    }
  return info;
}

/// The programs the library runs: a training module's phases (a pipelined
/// one's per stage and rank, with the stages' wiring in `pipeStages`), a
/// pipeline's stages, or @main whole.
LogicalResult collectPrograms(ModuleOp module, func::FuncOp func, bool training,
                              bool pipelined, std::vector<StageProgram> &stages,
                              std::vector<StageProgram> &pipeStages) {
  if (training && pipelined) {
    auto collected = collectStages(module, func);
    if (failed(collected))
      return failure();
    pipeStages = std::move(*collected);
    auto phases = collectPipelinePhases(module, pipeStages);
    if (failed(phases))
      return failure();
    stages = std::move(*phases);
  } else if (training) {
    auto phases = collectPhases(module);
    if (failed(phases))
      return failure();
    stages = std::move(*phases);
  } else if (pipelined) {
    auto collected = collectStages(module, func);
    if (failed(collected))
      return failure();
    stages = std::move(*collected);
  } else {
    StageProgram whole;
    whole.func = func;
    for (unsigned k = 0; k < func.getNumArguments(); ++k)
      whole.sources.push_back(-1 - static_cast<int32_t>(k));
    stages.push_back(std::move(whole));
  }
  return success();
}

/// The library's weight table: every program's weights and state, each
/// (name, shard) once, with each program's indices into it.
struct WeightTable {
  Specs weights, wholeWeights;
  std::vector<std::string> shards;
};

WeightTable collectWeights(MutableArrayRef<StageProgram> programs) {
  WeightTable table;
  llvm::StringMap<int32_t> index;
  for (StageProgram &program : programs) {
    const TargetCode &code = program.cpu ? *program.cpu : *program.cuda;
    for (auto [i, weight] : llvm::enumerate(code.weights)) {
      auto [it, inserted] = index.try_emplace(
          weight.first + "|" + code.weightShards[i], table.weights.size());
      if (inserted) {
        table.weights.push_back(weight);
        table.shards.push_back(code.weightShards[i]);
        table.wholeWeights.emplace_back(
            weight.first,
            RankedTensorType::get(code.weightWholes[i],
                                  weight.second.getElementType()));
      }
      program.weightIndices.push_back(it->second);
    }
  }
  return table;
}

/// Per state tensor of `weights`: its kind and the weight it belongs to
/// (kWeightKinds, kWeightOwners), the bucket it lives in
/// (kWeightAliases, pcc-data-parallel's buckets) and where offloaded state
/// lives and when it is copied (kWeightOffload, ABI 10).
FailureOr<std::string>
stateTables(ModuleOp module, const Specs &weights,
            const std::optional<TrainingConfig> &training) {
  std::string kinds = "static const int32_t kWeightKinds[] = {",
              owners = "static const int32_t kWeightOwners[] = {";
  {
    llvm::StringMap<int32_t> weightIndex;
    for (auto [i, w] : llvm::enumerate(weights))
      if (splitStateName(w.first).second.empty())
        weightIndex.try_emplace(w.first, i);
    for (auto [i, w] : llvm::enumerate(weights)) {
      auto [owner, kind] = splitStateName(w.first);
      bool copy = kind == kGatheredState || kind == kBf16CopyState ||
                  kind == kF16CopyState;
      int code = kind.empty()           ? 0
                 : kind == "grad"       ? 1
                 : kind == kMasterState ? 3
                 : kind == "bucket"     ? 4
                 : copy                 ? 5
                                        : 2;
      auto it = weightIndex.find(owner);
      if (it == weightIndex.end())
        return module.emitError("code generation: state '")
               << w.first << "' belongs to no weight of the library";
      kinds += std::to_string(code) + ", ";
      owners += std::to_string(it->second) + ", ";
    }
    kinds += "0};\n";
    owners += "0};\n";
  }
  // Where offloaded state lives and when it is copied (ABI 10).
  std::string offloadTable = "static const int32_t kWeightOffload[] = {";
  {
    llvm::StringMap<int32_t> flags;
    auto mark = [&](const std::vector<std::string> &names, int32_t bit) {
      for (const std::string &name : names)
        flags[name] |= bit;
    };
    // enum pcc_offload's bits.
    if (training) {
      mark(training->offloadHost, 1);
      mark(training->offloadToHost, 2);
      mark(training->offloadToDevice, 4);
    }
    for (auto &w : weights)
      offloadTable += std::to_string(flags.lookup(w.first)) + ", ";
    offloadTable += "0};\n";
  }
  // Gradients that live in a bucket (pcc-data-parallel's buckets).
  std::string aliases = "static const pcc_weight_alias kWeightAliases[] = {";
  {
    llvm::StringMap<std::pair<std::string, int64_t>> inBucket;
    if (training)
      for (const GradientBucket &bucket : training->buckets)
        for (auto [g, offset] : llvm::zip(bucket.grads, bucket.offsets))
          inBucket[g] = {bucket.state, offset};
    llvm::StringMap<int32_t> indexOf;
    for (auto [j, w] : llvm::enumerate(weights))
      indexOf[w.first] = static_cast<int32_t>(j);
    for (auto &w : weights) {
      auto it = inBucket.find(w.first);
      auto bucket =
          it == inBucket.end() ? indexOf.end() : indexOf.find(it->second.first);
      int32_t index = bucket == indexOf.end() ? -1 : bucket->second;
      if (it != inBucket.end() && index < 0)
        return module.emitError("code generation: the bucket of '")
               << w.first << "' is not model state of the library";
      aliases += llvm::formatv("{{{0}, {1}}, ", index,
                               index < 0 ? 0 : it->second.second)
                     .str();
    }
    aliases += "{-1, 0}};\n";
  }
  return kinds + owners + aliases + offloadTable;
}

} // namespace

LogicalResult mlir::pcc::emitCpp(ModuleOp module, llvm::raw_ostream &os,
                                 const CppEmitOptions &options) {
  // A training module's entry points are its phases; the forward phase
  // stands for the model's signature.
  std::optional<TrainingConfig> training = getTrainingConfig(module);
  if (!training && module->hasAttr(kTrainingAttrName))
    return failure();
  // A pipelined one's @main (the calls of its stages) does.
  StringRef entry = training && !module.lookupSymbol("train_forward")
                        ? StringRef("main")
                    : training ? StringRef(kPhaseFunctions[0])
                               : StringRef("main");
  auto func = module.lookupSymbol<func::FuncOp>(entry);
  if (!func || !func.getBody().hasOneBlock())
    return module.emitError("code generation: expects a single-block "
                            "func.func @")
           << entry;
  bool cpu = options.targets & kTargetCpu, cuda = options.targets & kTargetCuda;
  if (!cpu && !cuda)
    return module.emitError("code generation: no target");
  // The generated code reads a loaded weight or state from its buffer.
  if (failed(verifyStateOrder(module)))
    return failure();
  MeshInfo mesh = getMeshInfo(module);
  const llvm::StringMap<int> &meshAxes = mesh.axes;

  // The entry points: @main, or the pipeline stages it calls.
  std::optional<::pcc::schedule::Schedule> schedule = getPipelineSchedule(func);
  if (!schedule && func->hasAttr(kScheduleAttrName))
    return failure();
  std::vector<StageProgram> stages, pipeStages;
  if (failed(collectPrograms(module, func, training.has_value(),
                             schedule.has_value(), stages, pipeStages)))
    return failure();
  for (StageProgram &stage : stages) {
    for (bool onGpu : {false, true}) {
      if (!(onGpu ? cuda : cpu))
        continue;
      auto code = emitFunction(stage.func, onGpu, meshAxes);
      if (failed(code))
        return failure();
      (onGpu ? stage.cuda : stage.cpu) = std::move(*code);
    }
  }

  WeightTable table = collectWeights(stages);
  const Specs &weights = table.weights;

  Block &block = func.getBody().front();
  auto ret = cast<func::ReturnOp>(block.getTerminator());
  auto nameAttr = [](DictionaryAttr attrs, unsigned i) {
    return nameOf(attrs, "value" + std::to_string(i));
  };
  Specs inputs, outputs;
  for (BlockArgument arg : block.getArguments())
    inputs.emplace_back(
        nameAttr(func.getArgAttrDict(arg.getArgNumber()), arg.getArgNumber()),
        tensorTypeOf(arg));
  for (auto [i, v] : llvm::enumerate(ret.getOperands()))
    outputs.emplace_back(nameAttr(func.getResultAttrDict(i), i),
                         tensorTypeOf(v));
  std::string shardTable = "static const pcc_weight_shard kWeightShards[] = {";
  for (const std::string &shard : table.shards)
    shardTable += shard + ", ";
  shardTable += table.shards.empty() ? "{-1, 0, 0, -1, 0, 0}};\n" : "};\n";
  shardTable += "static const char *const kMeshAxes[] = {" + mesh.names +
                "nullptr};\nstatic const int64_t kMeshSizes[] = {" +
                mesh.sizes + "0};\n";
  // Where each input's and output's batch lies (pcc-split-batch; 0 when
  // the program is not micro-batched).
  auto batchDims = [&](StringRef name, unsigned count, bool results) {
    std::string table = "static const int32_t " + name.str() + "[] = {";
    for (unsigned i = 0; i < count; ++i) {
      DictionaryAttr attrs =
          results ? func.getResultAttrDict(i) : func.getArgAttrDict(i);
      auto dim =
          attrs ? attrs.getAs<IntegerAttr>("pcc.batch_dim") : IntegerAttr();
      table += std::to_string(dim ? dim.getInt() : 0) + ", ";
    }
    return table + "0};\n";
  };
  std::string batchTables = batchDims("kInputBatchDims", inputs.size(), false) +
                            batchDims("kOutputBatchDims", outputs.size(), true);
  std::string shapes;
  std::string specs = specArray("kInputs", inputs, shapes);
  specs += specArray("kOutputs", outputs, shapes);
  specs += specArray("kWeights", weights, shapes);
  specs += specArray("kWholeWeights", table.wholeWeights, shapes);
  // A pipelined training stage's table lists its forward phase's weights.
  for (auto [k, stage] : llvm::enumerate(pipeStages))
    stage.weightIndices = stages[3 * k].weightIndices;
  std::string stageTables =
      stageSource(!pipeStages.empty() ? ArrayRef<StageProgram>(pipeStages)
                  : training ? ArrayRef<StageProgram>(stages).take_front(1)
                             : ArrayRef<StageProgram>(stages),
                  inputs, outputs, shapes);
  std::string phaseTables = training
                                ? phaseSource(stages, shapes)
                                : std::string("static const pcc_phase_info "
                                              "*const kPhases = nullptr;\n");
  FailureOr<std::string> stateTableSource =
      stateTables(module, weights, training);
  if (failed(stateTableSource))
    return failure();
  std::string loss = quoted(training ? training->loss : "");
  std::string optimizer = quoted(training ? training->optimizer : "");
  int64_t ignoreIndex =
      training ? training->ignoreIndex.value_or(-100) : int64_t(-100);
  // The ZeRO stage the data-parallel pass applied (ABI 13), so that the
  // runtime need not infer it from the shard table.
  int64_t zeroStage = training ? training->zero : 0;
  // Mixed precision (ABI 14): the products' type and fp16 training's loss
  // scaling.
  auto precisionAttr = module->getAttrOfType<StringAttr>(kPrecisionAttrName);
  std::string precision = precisionAttr ? precisionAttr.str() : "fp32";
  double lossScale = 0;
  int64_t lossScaleWindow = 0;
  if (auto scale = module->getAttrOfType<DictionaryAttr>(kLossScaleAttrName);
      scale && training) {
    lossScale = scale.getAs<FloatAttr>("initial").getValueAsDouble();
    lossScaleWindow = scale.getAs<IntegerAttr>("window").getInt();
  }
  // A rank runs one stage: its arena is the largest.
  int64_t arenaBytes = 0;
  for (const StageProgram &stage : stages)
    arenaBytes = std::max(arenaBytes, stage.arenaBytes());

  // The schedule: per pipeline rank, its instruction list.
  int64_t microbatches = 1, pipelineRanks = 1;
  int pipelineAxis = -1;
  std::string policy;
  if (training)
    microbatches = training->microbatches;
  if (schedule) {
    microbatches = schedule->options.microbatches;
    policy = ::pcc::schedule::policyName(schedule->options.policy);
    auto pp = meshAxes.find(kPipelineAxis);
    if (pp == meshAxes.end())
      return module.emitError("code generation: a pipelined module needs a "
                              "'pp' axis in its pcc.mesh");
    pipelineAxis = pp->second;
  }
  auto scheduleTable = scheduleSource(
      func, schedule, pipeStages.empty() ? stages.size() : pipeStages.size(),
      pipelineRanks);
  if (failed(scheduleTable))
    return failure();

  writePreamble(os, cpu, cuda, options.source);
  // Each entry point in its own namespace: kernels and constants are named
  // per program.
  auto space = [&](size_t k) {
    if (training)
      return "phase" + std::to_string(k);
    return schedule ? "stage" + std::to_string(k) : std::string("model");
  };
  for (auto [k, stage] : llvm::enumerate(stages)) {
    os << "namespace " << space(k) << " {\n\n";
    if (schedule || training)
      os << "// " << (training ? "Training phase " : "Pipeline stage ") << k
         << " (@" << stage.func.getSymName() << ")\n\n";
    if (stage.cpu)
      os << "// CPU\n\n"
         << stage.cpu->constants << "\n"
         << stage.cpu->kernels << stage.cpu->function;
    if (stage.cuda)
      os << "// CUDA\n\n"
         << stage.cuda->constants << "\n"
         << stage.cuda->kernels << stage.cuda->function;
    os << "} // namespace " << space(k) << "\n\n";
  }
  StringRef targetName = cpu && cuda ? "cpu+cuda" : cpu ? "cpu" : "cuda";
  os << shapes << specs << batchTables << shardTable << stageTables
     << phaseTables << *stateTableSource << *scheduleTable << "\n"
     << "const pcc_model_info kInfo = {PCC_MODEL_ABI_VERSION, "
     << options.targets << ", " << quoted(targetName) << ", "
     << quoted(options.source) << ", " << quoted(options.weightsFile) << ", "
     << inputs.size() << ", kInputs, " << outputs.size() << ", kOutputs, "
     << weights.size() << ", kWeights, " << arenaBytes << ", "
     << meshAxes.size() << ", kMeshAxes, kMeshSizes, kWeightShards, "
     << microbatches << ", "
     << (!pipeStages.empty() ? pipeStages.size()
         : training          ? 1
                             : stages.size())
     << ", kStages, " << pipelineAxis << ", " << pipelineRanks
     << ", kScheduleLengths, kSchedules, " << quoted(policy)
     << ", kInputBatchDims, kOutputBatchDims, "
     << (training ? stages.size() : 0) << ", kPhases, kWeightKinds, "
     << "kWeightOwners, " << loss << ", " << optimizer << ", " << ignoreIndex
     << "LL, kWholeWeights, kWeightAliases, kWeightOffload, " << zeroStage
     << ", " << quoted(precision) << ", "
     << llvm::formatv("{0:e17}", lossScale).str() << ", " << lossScaleWindow
     << "};\n\n"
     << "} // namespace\n\n";
  writeEntryPoints(os, stages.size(), static_cast<bool>(schedule),
                   static_cast<bool>(training), cpu, cuda, mesh.ranks,
                   targetName, space);
  return success();
}
