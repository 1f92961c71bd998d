//===- Ckpt.cpp - pcc ckpt inspect|verify|export --------------------------===//
//
// Offline tools for the checkpoints pcc-run --save-dir writes (see
// runtime/include/pcc/runtime/Checkpoint.h): what a checkpoint holds, whether
// it is whole and sound, and its weights as one safetensors file or an ONNX
// model. They need neither the model library nor MPI.
//
//===----------------------------------------------------------------------===//

#include "Ckpt.h"

#include "pcc/runtime/Checkpoint.h"
#include "pcc/runtime/CheckpointTools.h"

#include <cstdio>
#include <cstring>
#include <string>

using namespace pccrt;

namespace {

int fail(const std::string &message) {
  std::fprintf(stderr, "pcc: error: %s\n", message.c_str());
  return 1;
}

const char *const kUsage =
    "usage: pcc ckpt inspect CHECKPOINT\n"
    "       pcc ckpt verify CHECKPOINT\n"
    "       pcc ckpt export CHECKPOINT -o weights.safetensors | -o model.onnx "
    "[--model model.onnx]\n\n"
    "CHECKPOINT is a save directory of pcc-run --save-dir (its LATEST) or "
    "one step-N directory in it.\n"
    "  inspect  the step, the run's settings, the files and every tensor "
    "(dtype, shape, min, max, mean)\n"
    "  verify   checks the manifest's checksums, that every tensor is "
    "finite and that each optimizer tensor matches its weight's shape; "
    "exit status 1 names what is wrong\n"
    "  export   the trained weights as one safetensors file (named after "
    "the ONNX initializers), or the ONNX model with them (as pcc export)\n\n"
    "Examples:\n"
    "  pcc ckpt inspect ckpt\n"
    "  pcc ckpt verify ckpt/step-00000200\n"
    "  pcc ckpt export ckpt -o trained.safetensors\n"
    "  pcc ckpt export ckpt -o trained.onnx\n";

} // namespace

int runCkpt(int argc, char **argv) {
  if (argc < 3 || std::strcmp(argv[2], "--help") == 0 ||
      std::strcmp(argv[2], "-h") == 0) {
    std::fputs(kUsage, argc < 3 ? stderr : stdout);
    return argc < 3 ? 1 : 0;
  }
  std::string command = argv[2];
  if (command == "export") {
    // The ONNX model: pcc export's work; one safetensors file: here.
    std::string output, checkpoint;
    for (int i = 3; i < argc; ++i) {
      std::string a = argv[i];
      if (a == "-o" && i + 1 < argc)
        output = argv[++i];
      else if (a == "--model" && i + 1 < argc)
        ++i;
      else if (!a.empty() && a[0] != '-' && checkpoint.empty())
        checkpoint = a;
    }
    auto endsWith = [&](const char *suffix) {
      size_t n = std::strlen(suffix);
      return output.size() >= n &&
             output.compare(output.size() - n, n, suffix) == 0;
    };
    if (endsWith(".onnx") || endsWith(".onnxtxt") || output.empty() ||
        checkpoint.empty())
      return exportCheckpoint(argc - 1, argv + 1);
    if (!endsWith(".safetensors"))
      return fail("pcc ckpt export: -o '" + output +
                  "' is neither a .safetensors nor an .onnx file");
    auto dir = openCheckpoint(checkpoint);
    if (!dir.ok())
      return fail(dir.error());
    return exportCheckpointWeights(*dir, output);
  }
  if (command != "inspect" && command != "verify")
    return fail("pcc ckpt: unknown command '" + command +
                "' (inspect, verify or export; see pcc ckpt --help)");
  if (argc != 4)
    return fail(std::string("usage: pcc ckpt ") + command + " CHECKPOINT");
  auto dir = openCheckpoint(argv[3]);
  if (!dir.ok())
    return fail(dir.error());
  return command == "inspect" ? inspectCheckpoint(*dir)
                              : verifyCheckpoint(*dir);
}
