//===- pcc-onnx-conformance.cpp - import ONNX's own test models -----------===//
//
// Imports every model.onnx under the given test-data directories (ONNX's
// node, pytorch-converted and pytorch-operator suites) and classifies each:
//
//   imported     the model imported and the IR verified
//   unsupported  the model uses an op pcc does not convert, or an op variant
//                the importer rejects on purpose ("... is not supported")
//   FAILED       every op is supported but the import failed: a pcc bug
//
// With --run, every imported test is also compiled for the CPU, run on each
// of its test_data_set_*/input_*.pb and compared with output_*.pb (floats
// within --rtol/--atol, integers and booleans exactly):
//
//   passed       every output of every data set matches
//   unsupported  the code generator rejects an op variant on purpose
//   FAILED       a mismatch, or a failure to build or run: a pcc bug
//
// --device=cuda compiles for and runs on the GPU instead. --export=DIR
// compiles (for --device's target) without running: each test's library,
// weights and data sets (.npy) go to DIR/<suite>/<test>/ and one line per
// data set to DIR/cases.txt, for scripts/run-exported.sh to run with pcc-run
// on another machine (a GPU node without the compiler).
//
// Prints a markdown table (one row per test) and a summary; exits 1 when any
// test FAILED, so the lit suite holds the pass rates over supported ops at
// 100%.
//
//===----------------------------------------------------------------------===//

#include "pcc/Dialect/Pcc/IR/PccDialect.h"
#include "pcc/Import/OnnxImporter.h"
#include "pcc/Target/Cpp.h"
#include "pcc/Transforms/Passes.h"
#include "pcc/runtime/Device.h"
#include "pcc/runtime/HalfFloat.h"
#include "pcc/runtime/ModelLibrary.h"
#include "pcc/runtime/Npy.h"
#include "pcc/runtime/Safetensors.h"

#include "mlir/Pass/PassManager.h"

#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/ScopeExit.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/raw_ostream.h"

#include <onnx/onnx_pb.h>

#include <atomic>
#include <cmath>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <thread>

using namespace mlir;
namespace cl = llvm::cl;

static cl::OptionCategory category("pcc-onnx-conformance options");

static cl::list<std::string> suiteDirs(cl::Positional, cl::OneOrMore,
                                       cl::desc("<test-data directory>..."),
                                       cl::cat(category));
static cl::opt<bool> quiet("summary-only",
                           cl::desc("print only the summary and failures"),
                           cl::cat(category));
static cl::opt<bool>
    runModels("run", cl::desc("compile, run and compare every imported test"),
              cl::cat(category));
static cl::opt<double> relTol("rtol", cl::desc("relative tolerance"),
                              cl::init(1e-4), cl::cat(category));
static cl::opt<double> absTol("atol", cl::desc("absolute tolerance"),
                              cl::init(1e-5), cl::cat(category));
static cl::opt<unsigned> jobs("jobs", cl::desc("tests run in parallel"),
                              cl::init(0), cl::cat(category));
static cl::opt<std::string>
    deviceName("device",
               cl::desc("run on cpu (default) or cuda[:N]; also picks the "
                        "target the tests are compiled for"),
               cl::init("cpu"), cl::cat(category));
static cl::opt<std::string>
    exportDir("export",
              cl::desc("with --run: compile every test into this directory "
                       "with its data as .npy instead of running it"),
              cl::value_desc("dir"), cl::cat(category));

namespace {
enum class Outcome { Imported, Unsupported, Failed };

enum class RunOutcome { NotRun, Passed, Unsupported, Failed, Exported };

struct Row {
  std::string suite, test, detail;
  Outcome outcome;
  RunOutcome run = RunOutcome::NotRun;
  std::string runDetail;
};

/// One line, no table separators.
std::string flatten(std::string text) {
  for (char &c : text)
    if (c == '\n' || c == '|')
      c = ' ';
  if (text.size() > 200)
    text = text.substr(0, 200) + "...";
  return text;
}

/// The test's test_data_set_* directories, sorted.
std::vector<std::string> dataSetsOf(const std::string &dir) {
  std::vector<std::string> dataSets;
  std::error_code ec;
  for (llvm::sys::fs::directory_iterator it(dir, ec), end; it != end && !ec;
       it.increment(ec))
    if (StringRef(llvm::sys::path::filename(it->path()))
            .starts_with("test_data_set_"))
      dataSets.push_back(it->path());
  llvm::sort(dataSets);
  return dataSets;
}

/// Each worker thread runs on its own device context (a CUDA stream and
/// cuBLAS handle per thread).
std::mutex deviceMutex;
std::string deviceOpenError;

pccrt::Device *deviceOfThisThread() {
  thread_local std::unique_ptr<pccrt::Device> device;
  thread_local bool tried = false;
  if (!tried) {
    tried = true;
    auto opened = pccrt::Device::open(deviceName);
    if (opened.ok()) {
      device = opened.take();
    } else {
      std::lock_guard<std::mutex> lock(deviceMutex);
      deviceOpenError = opened.error();
    }
  }
  return device.get();
}

std::string deviceError() {
  std::lock_guard<std::mutex> lock(deviceMutex);
  return deviceOpenError;
}

std::mutex casesMutex;

/// Writes every data set of the test as .npy files beside the exported
/// library and lists them in cases.txt.
void exportDataSets(Row &row, const std::string &dir, const std::string &out,
                    MLIRContext &context, std::string &firstError) {
  std::vector<std::string> dataSets = dataSetsOf(dir);
  std::string lines;
  for (auto [k, set] : llvm::enumerate(dataSets)) {
    std::string prefix = "set" + std::to_string(k);
    int counts[2] = {0, 0};
    for (int io = 0; io < 2; ++io) {
      const char *kind = io ? "output" : "input";
      for (int i = 0;; ++i) {
        std::string pb = set + "/" + kind + "_" + std::to_string(i) + ".pb";
        if (!llvm::sys::fs::exists(pb))
          break;
        auto t = pcc::readOnnxTensorFile(pb, &context);
        if (failed(t)) {
          // As when running: a deliberate limit is "unsupported".
          bool deliberate = StringRef(firstError).contains("not supported");
          row.run = deliberate ? RunOutcome::Unsupported : RunOutcome::Failed;
          row.runDetail = flatten(pb + ": " + firstError);
          return;
        }
        pccrt::NpyArray array;
        array.dtype = t->dtype;
        array.shape = t->shape;
        array.data.assign(t->bytes.begin(), t->bytes.end());
        std::string npy =
            out + "/" + prefix + "." + kind + std::to_string(i) + ".npy";
        auto status = pccrt::writeNpy(npy, array);
        if (!status.ok()) {
          row.run = RunOutcome::Failed;
          row.runDetail = flatten(status.error());
          return;
        }
        ++counts[io];
      }
    }
    lines += row.suite + "/" + row.test + " " + prefix + " " +
             std::to_string(counts[0]) + " " + std::to_string(counts[1]) + "\n";
  }
  {
    std::lock_guard<std::mutex> lock(casesMutex);
    std::error_code ec;
    llvm::raw_fd_ostream cases(exportDir + "/cases.txt", ec,
                               llvm::sys::fs::OF_Append);
    if (ec) {
      row.run = RunOutcome::Failed;
      row.runDetail = "cannot write cases.txt: " + ec.message();
      return;
    }
    cases << lines;
  }
  row.run = RunOutcome::Exported;
  row.runDetail = std::to_string(dataSets.size()) + " data set(s)";
}

/// Compiles the imported module, runs it on every data set of the test and
/// compares the outputs. Sets row.run and row.runDetail.
void runTest(Row &row, const std::string &dir, ModuleOp module,
             MLIRContext &context, std::string &firstError) {
  auto fail = [&](RunOutcome outcome, const std::string &detail) {
    row.run = outcome;
    row.runDetail = flatten(detail);
  };
  auto diagnosed = [&](const std::string &what) {
    bool deliberate = StringRef(firstError).contains("not supported");
    fail(deliberate ? RunOutcome::Unsupported : RunOutcome::Failed,
         deliberate ? firstError : what + ": " + firstError);
  };
  bool cuda = StringRef(deviceName).starts_with("cuda");
  PassManager pm(&context);
  pcc::buildImportCleanupPipeline(pm);
  pm.addNestedPass<func::FuncOp>(pcc::createFuseElementwise());
  pm.addNestedPass<func::FuncOp>(pcc::createPlanMemory());
  if (failed(pm.run(module)))
    return diagnosed("pipeline");
  std::string source;
  llvm::raw_string_ostream os(source);
  pcc::CppEmitOptions emitOptions;
  emitOptions.source = dir + "/model.onnx";
  emitOptions.weightsFile = "model.safetensors";
  emitOptions.targets = cuda ? pcc::kTargetCuda : pcc::kTargetCpu;
  if (failed(pcc::emitCpp(module, os, emitOptions)))
    return diagnosed("code generation");

  SmallString<128> tmp;
  bool exporting = !exportDir.empty();
  if (exporting) {
    tmp = exportDir + "/" + row.suite + "/" + row.test;
    if (llvm::sys::fs::create_directories(tmp))
      return fail(RunOutcome::Failed,
                  "cannot create '" + tmp.str().str() + "'");
  } else if (llvm::sys::fs::createUniqueDirectory("pcc-conformance", tmp)) {
    return fail(RunOutcome::Failed, "cannot create a temporary directory");
  }
  std::string library = (tmp + "/model.so").str();
  std::string weightsPath = (tmp + "/model.safetensors").str();
  llvm::scope_exit cleanup([&] {
    if (exporting)
      return;
    llvm::sys::fs::remove(library);
    llvm::sys::fs::remove(weightsPath);
    llvm::sys::fs::remove(tmp);
  });
  std::vector<std::string> names;
  for (auto &entry : pcc::getWeightOrder(module))
    names.push_back(entry.first);
  if (failed(pcc::writeOnnxWeights(dir + "/model.onnx", names, weightsPath,
                                   &context)))
    return diagnosed("weights");
  pcc::BuildOptions buildOptions;
  buildOptions.optimization = "-O1";
  buildOptions.targets = emitOptions.targets;
  if (failed(pcc::buildSharedLibrary(&context, source, library, buildOptions)))
    return diagnosed("build");

  if (exporting)
    return exportDataSets(row, dir, tmp.str().str(), context, firstError);

  auto lib = pccrt::ModelLibrary::open(library);
  if (!lib.ok())
    return fail(RunOutcome::Failed, lib.error());
  auto weightsFile = pccrt::SafetensorsFile::open(weightsPath);
  if (!weightsFile.ok())
    return fail(RunOutcome::Failed, weightsFile.error());
  auto weights = lib->bindWeights(*weightsFile, weightsPath);
  if (!weights.ok())
    return fail(RunOutcome::Failed, weights.error());
  const pcc_model_info &info = lib->info();

  std::vector<std::string> dataSets = dataSetsOf(dir);
  if (dataSets.empty())
    return fail(RunOutcome::Failed, "no test_data_set_* directory");

  double worst = 0;
  for (const std::string &set : dataSets) {
    std::vector<pcc::OnnxTensorFile> inputs;
    std::vector<const void *> inputPtrs;
    for (int i = 0; i < info.num_inputs; ++i) {
      auto t = pcc::readOnnxTensorFile(
          set + "/input_" + std::to_string(i) + ".pb", &context);
      if (failed(t))
        return diagnosed("input " + std::to_string(i));
      if (t->dtype != static_cast<pccrt::DType>(info.inputs[i].dtype) ||
          t->shape != pccrt::specShape(info.inputs[i]))
        return fail(RunOutcome::Failed,
                    "input " + std::to_string(i) + " does not match " +
                        pccrt::describeSpec(info.inputs[i]));
      inputs.push_back(std::move(*t));
    }
    for (auto &t : inputs)
      inputPtrs.push_back(t.bytes.data());
    std::vector<std::unique_ptr<pccrt::AlignedBuffer>> outputs;
    std::vector<void *> outputPtrs;
    for (int i = 0; i < info.num_outputs; ++i) {
      const pcc_tensor_spec &spec = info.outputs[i];
      outputs.push_back(std::make_unique<pccrt::AlignedBuffer>(
          pccrt::elementCount(pccrt::specShape(spec)) *
          pccrt::dtypeSize(static_cast<pccrt::DType>(spec.dtype))));
      outputPtrs.push_back(outputs.back()->data());
    }
    pccrt::Device *device = deviceOfThisThread();
    if (!device)
      return fail(RunOutcome::Failed, deviceError());
    auto runner = pccrt::ModelRunner::create(*lib, *device, *weights);
    if (!runner.ok())
      return fail(RunOutcome::Failed, runner.error());
    auto status = runner->run(inputPtrs, outputPtrs);
    if (!status.ok())
      return fail(RunOutcome::Failed, status.error());
    for (int i = 0; i < info.num_outputs; ++i) {
      auto ref = pcc::readOnnxTensorFile(
          set + "/output_" + std::to_string(i) + ".pb", &context);
      if (failed(ref))
        return diagnosed("output " + std::to_string(i));
      const pcc_tensor_spec &spec = info.outputs[i];
      auto type = static_cast<pccrt::DType>(spec.dtype);
      if (ref->shape != pccrt::specShape(spec) || ref->dtype != type)
        return fail(RunOutcome::Failed,
                    "output " + std::to_string(i) + " is " +
                        pccrt::describeSpec(spec) + ", the reference " +
                        std::string(pccrt::dtypeName(ref->dtype)) + " " +
                        pccrt::shapeString(ref->shape));
      bool isFloat = type == pccrt::DType::F32 || type == pccrt::DType::F64 ||
                     type == pccrt::DType::F16 || type == pccrt::DType::BF16;
      const auto *got = static_cast<const uint8_t *>(outputPtrs[i]);
      const auto *want = reinterpret_cast<const uint8_t *>(ref->bytes.data());
      int64_t count = pccrt::elementCount(ref->shape);
      for (int64_t j = 0; j < count; ++j) {
        double x = pccrt::elementAsDouble(got, type, j),
               r = pccrt::elementAsDouble(want, type, j);
        // Equal values (equal infinities included) and NaN where NaN is
        // expected match.
        if (x == r || (std::isnan(x) && std::isnan(r)))
          continue;
        double diff = std::fabs(x - r);
        bool ok = isFloat ? diff <= absTol + relTol * std::fabs(r) : x == r;
        if (!ok)
          return fail(RunOutcome::Failed,
                      llvm::formatv("output {0} element {1}: got {2}, "
                                    "expected {3}",
                                    i, j, x, r)
                          .str());
        worst = std::max(worst, diff);
      }
    }
  }
  row.run = RunOutcome::Passed;
  row.runDetail = llvm::formatv("max |diff| {0:e2}", worst).str();
}

/// Op types of the model's main graph, or nullopt if it does not parse.
std::optional<std::set<std::string>> opTypesOf(const std::string &path,
                                               std::string &domainIssue) {
  std::ifstream in(path, std::ios::binary);
  onnx::ModelProto model;
  if (!in || !model.ParseFromIstream(&in))
    return std::nullopt;
  std::set<std::string> ops;
  for (const auto &node : model.graph().node()) {
    if (!node.domain().empty() && node.domain() != "ai.onnx")
      domainIssue = node.domain() + "::" + node.op_type();
    ops.insert(node.op_type());
  }
  return ops;
}

Row runOne(const std::string &suite, const std::string &dir) {
  Row row{suite, llvm::sys::path::filename(dir).str(), "", Outcome::Imported};
  std::string model = dir + "/model.onnx";
  std::string domainIssue;
  auto ops = opTypesOf(model, domainIssue);
  if (!ops) {
    row.outcome = Outcome::Failed;
    row.detail = "model.onnx does not parse";
    return row;
  }
  if (!domainIssue.empty()) {
    row.outcome = Outcome::Unsupported;
    row.detail = "op " + domainIssue + " (non-default domain)";
    return row;
  }
  std::vector<std::string> missing;
  for (const std::string &op : *ops)
    if (!pcc::isSupportedOnnxOp(op))
      missing.push_back(op);
  if (!missing.empty()) {
    row.outcome = Outcome::Unsupported;
    row.detail = "op " + llvm::join(missing, ", ");
    return row;
  }

  MLIRContext context;
  std::string firstError;
  ScopedDiagnosticHandler handler(&context, [&](Diagnostic &diag) {
    if (diag.getSeverity() == DiagnosticSeverity::Error && firstError.empty()) {
      auto [opType, node] = pcc::getOnnxNodeOfLocation(diag.getLocation());
      firstError = (opType.empty() ? "" : opType + ": ") + diag.str();
    }
    return success();
  });
  auto module = pcc::importOnnxFile(model, &context);
  if (succeeded(module)) {
    if (runModels)
      runTest(row, dir, **module, context, firstError);
    return row;
  }
  // Messages for deliberate limits say "not supported"; anything else
  // on a model whose ops are all supported is a bug.
  bool deliberate = StringRef(firstError).contains("not supported");
  row.outcome = deliberate ? Outcome::Unsupported : Outcome::Failed;
  row.detail = flatten(firstError);
  return row;
}
} // namespace

int main(int argc, char **argv) {
  llvm::InitLLVM init(argc, argv);
  cl::HideUnrelatedOptions(category);
  cl::ParseCommandLineOptions(
      argc, argv,
      "imports ONNX's own test models and prints a conformance table\n\n"
      "Example:\n"
      "  pcc-onnx-conformance /usr/share/libonnx-testdata/data/node \\\n"
      "      /usr/share/libonnx-testdata/data/pytorch-converted\n"
      "  pcc-onnx-conformance --run /usr/share/libonnx-testdata/data/node\n"
      "  pcc-onnx-conformance --run --device=cuda --export=gpu-cases \\\n"
      "      /usr/share/libonnx-testdata/data/node   # then, on a GPU node:\n"
      "  scripts/run-exported.sh gpu-cases cuda\n");

  if (!exportDir.empty()) {
    if (!runModels) {
      llvm::errs() << "pcc-onnx-conformance: error: --export needs --run\n";
      return 1;
    }
    if (std::error_code ec = llvm::sys::fs::create_directories(exportDir)) {
      llvm::errs() << "pcc-onnx-conformance: error: cannot create '"
                   << exportDir << "': " << ec.message() << "\n";
      return 1;
    }
    llvm::sys::fs::remove(exportDir + "/cases.txt");
  }

  std::vector<Row> rows;
  for (const std::string &suiteDir : suiteDirs) {
    if (!llvm::sys::fs::is_directory(suiteDir)) {
      llvm::errs() << "pcc-onnx-conformance: error: '" << suiteDir
                   << "' is not a directory\n";
      return 1;
    }
    std::string suite = llvm::sys::path::filename(suiteDir).str();
    std::vector<std::string> tests;
    std::error_code ec;
    for (llvm::sys::fs::directory_iterator it(suiteDir, ec), end;
         it != end && !ec; it.increment(ec))
      if (llvm::sys::fs::exists(it->path() + "/model.onnx"))
        tests.push_back(it->path());
    llvm::sort(tests);
    size_t first = rows.size();
    rows.resize(first + tests.size());
    std::atomic<size_t> next{0};
    unsigned workers =
        jobs ? jobs : std::max(1u, std::thread::hardware_concurrency());
    std::vector<std::thread> pool;
    for (unsigned w = 0; w < workers; ++w)
      pool.emplace_back([&] {
        for (size_t i = next++; i < tests.size(); i = next++)
          rows[first + i] = runOne(suite, tests[i]);
      });
    for (std::thread &t : pool)
      t.join();
  }

  std::map<std::string, std::array<int, 3>> perSuite;
  std::map<std::string, std::array<int, 5>> perSuiteRun;
  for (const Row &row : rows) {
    ++perSuite[row.suite][static_cast<int>(row.outcome)];
    ++perSuiteRun[row.suite][static_cast<int>(row.run)];
  }

  llvm::outs() << "| suite | test | import | detail |"
               << (runModels ? " run | detail |" : "") << "\n|---|---|---|---|"
               << (runModels ? "---|---|" : "") << "\n";
  for (const Row &row : rows) {
    bool bad = row.outcome == Outcome::Failed || row.run == RunOutcome::Failed;
    if (quiet && !bad)
      continue;
    const char *result = row.outcome == Outcome::Imported      ? "imported"
                         : row.outcome == Outcome::Unsupported ? "unsupported"
                                                               : "FAILED";
    llvm::outs() << "| " << row.suite << " | " << row.test << " | " << result
                 << " | " << row.detail << " |";
    if (runModels) {
      const char *run = row.run == RunOutcome::Passed        ? "passed"
                        : row.run == RunOutcome::Unsupported ? "unsupported"
                        : row.run == RunOutcome::Failed      ? "FAILED"
                        : row.run == RunOutcome::Exported    ? "exported"
                                                             : "";
      llvm::outs() << " " << run << " | " << row.runDetail << " |";
    }
    llvm::outs() << "\n";
  }
  llvm::outs() << "\n| suite | imported | unsupported | FAILED | pass rate "
                  "over supported |\n|---|---|---|---|---|\n";
  int totalFailed = 0;
  for (auto &[suite, counts] : perSuite) {
    int supported = counts[0] + counts[2];
    totalFailed += counts[2];
    llvm::outs() << "| " << suite << " | " << counts[0] << " | " << counts[1]
                 << " | " << counts[2] << " | "
                 << llvm::format("%.1f%%", supported
                                               ? 100.0 * counts[0] / supported
                                               : 100.0)
                 << " |\n";
  }
  if (runModels) {
    llvm::outs() << "\nrun on: " << deviceName
                 << (exportDir.empty() ? ""
                                       : " (exported to " + exportDir + ")")
                 << "\n\n| suite | run: passed | unsupported | FAILED | pass "
                    "rate over runnable |\n|---|---|---|---|---|\n";
    for (auto &[suite, counts] : perSuiteRun) {
      int runnable = counts[1] + counts[3];
      totalFailed += counts[3];
      llvm::outs() << "| " << suite << " | " << counts[1] << " | " << counts[2]
                   << " | " << counts[3] << " | "
                   << llvm::format("%.1f%%", runnable
                                                 ? 100.0 * counts[1] / runnable
                                                 : 100.0)
                   << " |\n";
    }
    llvm::outs() << "\ntolerance: rtol " << relTol << ", atol " << absTol
                 << " (integers and booleans exact)\n";
    if (!exportDir.empty()) {
      int exported = 0;
      for (auto &entry : perSuiteRun)
        exported += entry.second[4];
      llvm::outs() << "exported " << exported << " tests to " << exportDir
                   << " (cases.txt)\n";
    }
  }
  llvm::outs() << "\nsupported ops: " << pcc::getSupportedOnnxOps().size()
               << ", failed: " << totalFailed << "\n";
  return totalFailed ? 1 : 0;
}
