//===- pcc-fuzz-import.cpp - libFuzzer target for the ONNX importer ------===//
//
// Feeds arbitrary bytes through pcc's front door, as `pcc model.onnx` would:
// the ONNX checker, the importer (symbolic dimensions batch=2, seq=8; any
// other unbound dimension is an import error) and the import clean-up
// pipeline (canonicalize, CSE, model statistics). Diagnostics are discarded:
// rejecting an input is fine; a crash, an abort, an uncaught exception, a
// sanitizer report, a leak or a hang is a finding. PCC_FUZZ_VERBOSE=1
// prints the diagnostics (to see why an input is rejected).
//
// An input whose first byte is '<' or '#' is ONNX text format (.onnxtxt, as
// the importer's lit tests are written); anything else is a binary
// ModelProto (whose encoding never starts with either byte in practice).
// The bytes go to a file in a private temporary directory because the
// checker and the importer resolve external data next to the model file; an
// empty directory means an external-data reference names a missing file.
//
// Built by scripts/fuzz.sh (cmake -DPCC_FUZZ=ON with clang; ASan + UBSan +
// libFuzzer); run it as any libFuzzer binary:
//   build-fuzz/bin/pcc-fuzz-import CORPUS_DIR -max_len=1000000
//
//===----------------------------------------------------------------------===//

#include "pcc/Dialect/Pcc/IR/PccDialect.h"
#include "pcc/Import/OnnxImporter.h"
#include "pcc/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Pass/PassManager.h"
#include "llvm/Support/raw_ostream.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <unistd.h>

using namespace mlir;

namespace {
struct FuzzState {
  std::string binaryPath, textPath;
  DialectRegistry registry;
  bool verbose = false;
};
} // namespace

static FuzzState *state;

static bool writeFile(const std::string &path, const uint8_t *data,
                      size_t size) {
  FILE *f = std::fopen(path.c_str(), "wb");
  if (!f)
    return false;
  bool ok = std::fwrite(data, 1, size, f) == size;
  return std::fclose(f) == 0 && ok;
}

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
  state = new FuzzState;
  const char *tmp = std::getenv("TMPDIR");
  std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") +
                        "/pcc-fuzz-import.XXXXXX";
  if (!mkdtemp(pattern.data())) {
    std::perror("pcc-fuzz-import: mkdtemp");
    std::abort();
  }
  state->binaryPath = pattern + "/model.onnx";
  state->textPath = pattern + "/model.onnxtxt";
  state->registry.insert<pcc::PccDialect, func::FuncDialect>();
  const char *verbose = std::getenv("PCC_FUZZ_VERBOSE");
  state->verbose = verbose && *verbose && *verbose != '0';
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  bool text = size > 0 && (data[0] == '<' || data[0] == '#');
  const std::string &path = text ? state->textPath : state->binaryPath;
  if (!writeFile(path, data, size)) {
    std::perror("pcc-fuzz-import: writing the input");
    std::abort();
  }

  // A fresh context per input: a long-lived one would keep every uniqued
  // constant of every input alive. No thread pool for one small module.
  MLIRContext context(state->registry, MLIRContext::Threading::DISABLED);
  context.loadAllAvailableDialects();
  // PCC_FUZZ_VERBOSE=1 prints them instead (triage: why an input stops).
  ScopedDiagnosticHandler discard(&context, [](Diagnostic &diag) {
    if (state->verbose)
      llvm::errs() << diag.getLocation() << ": " << diag << "\n";
    return success();
  });

  pcc::OnnxImportOptions options;
  options.dimBindings["batch"] = 2;
  options.dimBindings["seq"] = 8;
  options.runChecker = true;
  auto module = pcc::importOnnxFile(path, &context, options);
  if (succeeded(module)) {
    PassManager pm(&context);
    pcc::buildImportCleanupPipeline(pm);
    (void)pm.run(**module);
  }
  return 0;
}
