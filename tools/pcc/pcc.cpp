//===- pcc.cpp - the pcc compiler driver ----------------------------------===//
//
// pcc model.onnx [flags] [-o model.so]: imports the model, runs the compile
// pipeline (lib/Pipelines) with the options of its flags, and prints the IR
// or the --explain report, or writes the model library. `pcc export` and
// `pcc ckpt` work on training checkpoints (Ckpt.cpp).
//
//===----------------------------------------------------------------------===//

#include "Calibrate.h"
#include "Ckpt.h"
#include "Flags.h"
#include "Library.h"
#include "pcc/Analysis/Explain.h"
#include "pcc/Dialect/Pcc/IR/PccDialect.h"
#include "pcc/Import/OnnxImporter.h"
#include "pcc/Pipelines/AutoPlan.h"
#include "pcc/Pipelines/Compile.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Pass/Pass.h"
#include "mlir/Pass/PassInstrumentation.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Support/FileUtilities.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/ToolOutputFile.h"
#include "llvm/Support/raw_ostream.h"

using namespace mlir;
using namespace mlir::pcc;
using namespace pcctool;

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

/// The passes' remarks for --explain, and whether the import is done (its
/// remarks come first).
static std::vector<std::pair<NoteKind, std::string>> explainNotes;
static bool imported = false;

/// Writes the module as text to `path`.
static int printModule(ModuleOp module, const std::string &path) {
  std::string errorMessage;
  auto output = openOutputFile(path, &errorMessage);
  if (!output)
    return fail("cannot write '" + path + "': " + errorMessage);
  module->print(output->os());
  output->os() << "\n";
  output->keep();
  return 0;
}

int main(int argc, char **argv) {
  if (argc >= 2 && StringRef(argv[1]) == "export")
    return exportCheckpoint(argc, argv);
  if (argc >= 2 && StringRef(argv[1]) == "ckpt")
    return runCkpt(argc, argv);
  if (argc >= 2 && StringRef(argv[1]) == "calibrate")
    return runCalibrate(argc, argv);
  llvm::InitLLVM init(argc, argv);
  // `pcc plan model.onnx ...`: the search alone, on the model's shapes.
  SmallVector<char *> args(argv, argv + argc);
  bool planOnly = args.size() >= 2 && StringRef(args[1]) == "plan";
  if (planOnly)
    args.erase(args.begin() + 1);
  parseCommandLine(static_cast<int>(args.size()), args.data());
  DriverFlags flags;
  OnnxImportOptions importOptions;
  CompileOptions options;
  std::string message = readFlags(flags, importOptions, options);
  if (!message.empty())
    return fail(message);
  flags.planOnly = planOnly;
  PlanRequest planRequest;
  if (planOnly || flags.autoPlan) {
    message = readPlanFlags(flags, options, planRequest);
    if (!message.empty())
      return fail(message);
    if (planOnly &&
        (flags.emitGiven || flags.explain || flags.outputFile != "-"))
      return fail("pcc plan prints the plans alone; compile one with --auto "
                  "(or its flags) and -o");
    importOptions.shapesOnly = planOnly;
  } else if (flags.planFlagsGiven) {
    return fail("--devices, --device-memory, --machine, --top and "
                "--plan-check go with --auto or pcc plan");
  }

  Emit what = flags.emit;
  if (what == Emit::Auto)
    what = StringRef(flags.outputFile).ends_with(".so") ? Emit::SharedLibrary
                                                        : Emit::Mlir;
  bool generate = what == Emit::SharedLibrary || what == Emit::Cpp;
  // --explain alone prints the report instead of the IR.
  bool reportOnly =
      flags.explain && !flags.emitGiven && flags.outputFile == "-";
  if (flags.explain && (what == Emit::MlirImported || what == Emit::Weights))
    return fail("--explain describes the compiled model; it does not go with "
                "--emit=mlir-imported or --emit=weights");
  if (what == Emit::SharedLibrary && flags.outputFile == "-")
    return fail("building a model library needs -o <file>.so");
  // Code generation and the report read the fusion and memory plan.
  options.planMemory = generate || flags.explain;

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
    if (flags.explain && diag.getSeverity() == DiagnosticSeverity::Remark) {
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
    auto weights = pcc::summarizeOnnxWeights(flags.inputFile, &context);
    if (failed(weights))
      return 1;
    std::string errorMessage;
    auto output = openOutputFile(flags.outputFile, &errorMessage);
    if (!output)
      return fail("cannot write '" + flags.outputFile + "': " + errorMessage);
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

  auto module = importOnnxFile(flags.inputFile, &context, importOptions);
  if (failed(module))
    return 1;
  imported = true;
  if (what == Emit::MlirImported)
    return printModule(**module, flags.outputFile);

  if (planOnly || flags.autoPlan) {
    planRequest.importOneRow = [&]() {
      OnnxImportOptions oneRow = importOptions;
      oneRow.rows = 1;
      oneRow.runChecker = false; // checked once above
      return importOnnxFile(flags.inputFile, &context, oneRow);
    };
    planRequest.progress = [](const std::string &line) {
      llvm::errs() << "pcc: plan: " << line << "\n";
    };
    FailureOr<PlanSearchResult> plans = searchPlans(**module, planRequest);
    if (failed(plans))
      return 1;
    // --auto's table goes to standard error: standard output may carry
    // the IR.
    printPlans(*plans, planRequest, planOnly ? llvm::outs() : llvm::errs());
    if (plans->ranked.empty() && plans->compileFailures > 0)
      return fail(
          "no plan for " + std::to_string(planRequest.devices) +
          " devices passed its compile check: " +
          std::to_string(plans->compileFailures) +
          " failed to compile, the first " + plans->firstCompileFailure +
          " (--plan-check=0 prints the search's plans without compiling "
          "them)");
    if (plans->ranked.empty())
      return fail("no plan for " + std::to_string(planRequest.devices) +
                  " devices fits in their memory (see above)");
    if (planOnly)
      return 0;
    options = plans->ranked.front().options;
  }

  std::unique_ptr<DumpIrInstrumentation> dumper;
  if (!flags.dumpIr.empty()) {
    if (std::error_code ec = llvm::sys::fs::create_directories(flags.dumpIr))
      return fail("cannot create --dump-ir directory '" + flags.dumpIr +
                  "': " + ec.message());
    // A pass nested on functions runs on several functions at once; the
    // dump prints the whole module after each of them, so it must not run
    // beside a pass changing a sibling function (a crash or a hang, found
    // by the plan fuzzer). MLIR asks the same of module-scope IR printing.
    context.disableMultithreading();
    dumper = std::make_unique<DumpIrInstrumentation>(flags.dumpIr);
    if (failed(dumper->dump(**module, "import")))
      return 1;
  }

  PassManager pm(&context);
  if (failed(applyPassManagerCLOptions(pm)))
    return 1;
  if (dumper)
    pm.addInstrumentation(std::move(dumper));
  buildCompilePipeline(pm, options);
  if (failed(pm.run(**module)) || errors)
    return 1;
  if (flags.explain)
    explain(**module,
            ExplainSettings{flags.inputFile, options.tp, options.pp,
                            options.ppChunks, options.dp, options.zero,
                            explainNotes},
            llvm::outs());
  if (reportOnly)
    return 0;
  if (generate)
    return writeLibrary(**module, flags, options, what == Emit::Cpp);
  return printModule(**module, flags.outputFile);
}
