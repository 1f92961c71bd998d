//===- pcc-onnx-conformance.cpp - import ONNX's own test models
//------------===//
//
// Imports every model.onnx under the given test-data directories (ONNX's
// node, pytorch-converted and pytorch-operator suites) and classifies each:
//
//   imported     the model imported and the IR verified
//   unsupported  the model uses an op pcc does not convert, or an op variant
//                the importer rejects on purpose ("... is not supported")
//   FAILED       every op is supported but the import failed: a pcc bug
//
// Prints a markdown table (one row per test) and a summary; exits 1 when any
// test FAILED, so the lit suite holds the pass rate over supported ops at
// 100%.
//
//===----------------------------------------------------------------------===//

#include "pcc/Import/OnnxImporter.h"

#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/raw_ostream.h"

#include <onnx/onnx_pb.h>

#include <fstream>
#include <map>
#include <set>

using namespace mlir;
namespace cl = llvm::cl;

static cl::list<std::string> suiteDirs(cl::Positional, cl::OneOrMore,
                                       cl::desc("<test-data directory>..."));
static cl::opt<bool> quiet("summary-only",
                           cl::desc("print only the summary and failures"));

namespace {
enum class Outcome { Imported, Unsupported, Failed };

struct Row {
  std::string suite, test, detail;
  Outcome outcome;
};

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
  if (succeeded(module))
    return row;
  // Messages for deliberate limits say "not supported"; anything else
  // on a model whose ops are all supported is a bug.
  bool deliberate = StringRef(firstError).contains("not supported");
  row.outcome = deliberate ? Outcome::Unsupported : Outcome::Failed;
  row.detail = firstError;
  for (char &c : row.detail)
    if (c == '\n' || c == '|')
      c = ' ';
  return row;
}
} // namespace

int main(int argc, char **argv) {
  llvm::InitLLVM init(argc, argv);
  cl::ParseCommandLineOptions(
      argc, argv,
      "imports ONNX's own test models and prints a conformance table\n\n"
      "Example:\n"
      "  pcc-onnx-conformance /usr/share/libonnx-testdata/data/node \\\n"
      "      /usr/share/libonnx-testdata/data/pytorch-converted\n");

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
    for (const std::string &test : tests)
      rows.push_back(runOne(suite, test));
  }

  std::map<std::string, std::array<int, 3>> perSuite;
  for (const Row &row : rows)
    ++perSuite[row.suite][static_cast<int>(row.outcome)];

  llvm::outs() << "| suite | test | result | detail |\n|---|---|---|---|\n";
  for (const Row &row : rows) {
    if (quiet && row.outcome != Outcome::Failed)
      continue;
    const char *result = row.outcome == Outcome::Imported      ? "imported"
                         : row.outcome == Outcome::Unsupported ? "unsupported"
                                                               : "FAILED";
    llvm::outs() << "| " << row.suite << " | " << row.test << " | " << result
                 << " | " << row.detail << " |\n";
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
  llvm::outs() << "\nsupported ops: " << pcc::getSupportedOnnxOps().size()
               << ", failed: " << totalFailed << "\n";
  return totalFailed ? 1 : 0;
}
