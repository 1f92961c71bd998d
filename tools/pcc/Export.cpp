//===- Export.cpp - pcc export: a checkpoint's weights in the ONNX model --===//

#include "Ckpt.h"

#include "pcc/Import/OnnxImporter.h"
#include "pcc/runtime/Checkpoint.h"
#include "pcc/runtime/CheckpointTools.h"

#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "llvm/ADT/Twine.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/raw_ostream.h"

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <string>
#include <vector>

using namespace mlir;

static int fail(const llvm::Twine &message) {
  llvm::errs() << "pcc: error: " << message << "\n";
  return 1;
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
    // trainer.json's "model": the path pcc compiled the library from.
    auto text = pccrt::readTextFile(*dir + "/trainer.json");
    if (text.ok()) {
      nlohmann::json trainer =
          nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
      if (trainer.is_object() && trainer.contains("model") &&
          trainer["model"].is_string())
        model = trainer["model"].get<std::string>();
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
    temporary = output + ".weights.tmp.safetensors";
    auto written = pccrt::writeCheckpointWeights(*dir, temporary);
    if (!written.ok())
      return fail(written.error());
    weightsPath = temporary;
  }
  auto replaced = pcc::exportTrainedOnnx(model, weightsPath, output, &context);
  if (!temporary.empty())
    llvm::sys::fs::remove(temporary);
  if (failed(replaced))
    return 1;
  llvm::errs() << "pcc: wrote " << output << " (" << model << " with "
               << *replaced << " trained initializers from " << *dir << ")\n";
  return 0;
}
