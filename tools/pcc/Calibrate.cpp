//===- Calibrate.cpp - pcc calibrate: measure this machine ----------------===//
//
// The measuring runs in pcc-run (beside pcc), which links the runtime's
// kernels, devices and collectives: `pcc-run --calibrate FILE` (see
// pcc/tooling/Calibrate.h). pcc starts it, then reads the file back as
// `pcc plan --machine=FILE` will and prints what it holds.
//
//===----------------------------------------------------------------------===//

#include "Calibrate.h"

#include "pcc/Analysis/Machine.h"

#include "llvm/ADT/SmallString.h"
#include "llvm/ADT/Twine.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/Program.h"
#include "llvm/Support/raw_ostream.h"

#include <cstdlib>
#include <string>
#include <vector>

using namespace mlir::pcc;

namespace {

const char *kUsage = R"(usage: pcc calibrate -o machine.json [options]

Measures this machine for the plan search (pcc --auto, pcc plan) and
writes a machine file for --machine=machine.json: products (fp32 and bf16)
over sizes through the kernels model libraries call, the bytes per second
a device copy moves and what a tiny one costs, how many cores' worth CPU
ranks sharing a host reach together, and with -n an all-reduce over the
ranks (MPI on CPU ranks, NCCL on GPUs) from 4 bytes to 64 MiB. Published
peaks, memory per device and the links between nodes come from the base
preset. It takes a few seconds to a minute.

Options:
  -o FILE          the machine file to write (replaced whole)
  -n RANKS         ranks to measure with, started with mpirun: calibrate
                   with the rank count you plan for (on CPU ranks sharing
                   cores, the cores' worth depends on it)
  --device DEV     cpu (default) or cuda
  --base NAME      the preset for what is not measured (cpu on CPU ranks,
                   h100 on GPUs by default; h200)
  --hostfile FILE  passed to mpirun
  --quick          fewer sizes and repetitions (a rough file, for tests)

Examples:
  pcc calibrate -o cpu4.json -n 4
  pcc plan gpt.onnx --train --devices=4 --device-memory=3GiB --machine=cpu4.json
  pcc calibrate -o node.json -n 8 --device cuda --base h100
)";

int fail(const llvm::Twine &message) {
  llvm::errs() << "pcc: error: " << message << "\n";
  return 1;
}

} // namespace

int runCalibrate(int argc, char **argv) {
  std::string output, ranks, device = "cpu", base, hostfile;
  bool quick = false;
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        fail("pcc calibrate: " + a + " needs a value");
        std::exit(1);
      }
      return argv[++i];
    };
    if (a == "--help" || a == "-h") {
      llvm::outs() << kUsage;
      return 0;
    }
    if (a == "-o")
      output = value();
    else if (a == "-n")
      ranks = value();
    else if (a == "--device")
      device = value();
    else if (a == "--base")
      base = value();
    else if (a == "--hostfile")
      hostfile = value();
    else if (a == "--quick")
      quick = true;
    else
      return fail("pcc calibrate: unknown argument '" + a + "' (see --help)");
  }
  if (output.empty())
    return fail("pcc calibrate: -o machine.json is required (see --help)");
  if (!ranks.empty()) {
    char *end = nullptr;
    long n = std::strtol(ranks.c_str(), &end, 10);
    if (*end || end == ranks.c_str() || n < 1)
      return fail("pcc calibrate: -n needs a positive number of ranks, got '" +
                  ranks + "'");
  }
  if (!base.empty() && !Machine::preset(base))
    return fail("pcc calibrate: --base '" + base + "' is not a preset (" +
                Machine::presetNames() + ")");
  // pcc-run beside this program.
  std::string self = llvm::sys::fs::getMainExecutable(
      argv[0], reinterpret_cast<void *>(&runCalibrate));
  llvm::SmallString<256> runner(llvm::sys::path::parent_path(self));
  llvm::sys::path::append(runner, "pcc-run");
  if (!llvm::sys::fs::can_execute(runner))
    return fail("pcc calibrate measures through pcc-run, which is not beside "
                "pcc (" +
                runner.str() + ")");
  std::vector<std::string> args{runner.str().str(), "--calibrate", output,
                                "--device", device};
  if (!ranks.empty())
    args.insert(args.end(), {"-n", ranks});
  if (!base.empty())
    args.insert(args.end(), {"--calibrate-base", base});
  if (!hostfile.empty())
    args.insert(args.end(), {"--hostfile", hostfile});
  if (quick)
    args.push_back("--calibrate-quick");
  std::vector<llvm::StringRef> refs(args.begin(), args.end());
  std::string error;
  int status = llvm::sys::ExecuteAndWait(runner, refs, /*Env=*/std::nullopt, {},
                                         0, 0, &error);
  if (status != 0)
    return fail("pcc calibrate: the measuring run failed" +
                (error.empty() ? llvm::Twine("") : llvm::Twine(": ") + error) +
                " (its messages are above)");
  std::optional<Machine> m = Machine::load(output, error);
  if (!m)
    return fail("pcc calibrate: " + error);
  llvm::outs() << llvm::formatv("{0}: {1}\n  products: fp32 {2:F1} GFLOP/s",
                                output, m->name, m->fp32Flops / 1e9);
  if (m->bf16Flops > 0)
    llvm::outs() << llvm::formatv(", bf16 {0:F1} GFLOP/s", m->bf16Flops / 1e9);
  llvm::outs() << llvm::formatv(" (best of {0} sizes)\n  copies: {1:F1} GB/s, "
                                "{2:F2} us a kernel\n",
                                m->products.size(), m->memoryBandwidth / 1e9,
                                m->kernelSeconds * 1e6);
  if (!ranks.empty() && ranks != "1")
    llvm::outs() << llvm::formatv(
        "  all-reduce over {0} ranks: {1:F1} us + bytes at {2:F2} GB/s bus\n",
        ranks, m->intraLatency * 1e6, m->intraBandwidth / 1e9);
  if (m->intraLatencies.size() > 1) {
    llvm::outs() << "  a collective between kernels:";
    for (const Machine::GroupLatency &g : m->intraLatencies)
      llvm::outs() << llvm::formatv(" {0} ranks {1:F1} us", g.ranks,
                                    g.seconds * 1e6);
    llvm::outs() << "\n";
  }
  if (m->cores > 0)
    llvm::outs() << llvm::formatv(
        "  cores' worth shared by the ranks: {0:F2}\n", m->cores);
  llvm::outs() << "use it with: pcc plan model.onnx --machine=" << output
               << " ... (or pcc --auto --machine=" << output << ")\n";
  return 0;
}
