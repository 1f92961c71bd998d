//===- PlanFlags.cpp - pcc's plan-search flags ----------------------------===//
//
// --auto, --devices, --device-memory, --machine, --top and --plan-check,
// read into the plan search's request (lib/Pipelines/AutoPlan).
//
//===----------------------------------------------------------------------===//

#include "Flags.h"

#include "llvm/Support/CommandLine.h"

using namespace mlir;
using namespace pcctool;
namespace cl = llvm::cl;
using Target = mlir::pcc::DeviceTarget;

static cl::opt<bool> autoPlan(
    "auto",
    cl::desc("with --train: choose the plan (tp, pp and its chunks, dp, ZeRO, "
             "micro-batches, schedule, recompute, precision) for --devices "
             "ranks of --device-memory each on --machine, print it with the "
             "runners-up, and compile it; a plan flag given (--tp=2, "
             "--precision=fp32, ...) fixes that dimension"),
    cl::cat(trainCategory));
static cl::opt<int64_t> devices("devices",
                                cl::desc("pcc plan and --auto: the ranks "
                                         "the plan uses (tp x pp x dp)"),
                                cl::init(0), cl::value_desc("N"),
                                cl::cat(trainCategory));
static cl::opt<std::string> deviceMemory(
    "device-memory",
    cl::desc("pcc plan and --auto: one rank's memory (such as 80GiB or "
             "1.2GiB; default: the machine's)"),
    cl::value_desc("bytes"), cl::cat(trainCategory));
static cl::opt<std::string> machineFlag(
    "machine",
    cl::desc("pcc plan and --auto: the machine model: cpu, h100, h200 or a "
             "JSON file (pcc calibrate writes one; default: cpu, or h100 "
             "for --target=cuda)"),
    cl::value_desc("name|file.json"), cl::cat(trainCategory));
static cl::opt<int64_t> top("top",
                            cl::desc("pcc plan and --auto: how many plans to "
                                     "print (default 5)"),
                            cl::init(5), cl::cat(trainCategory));
static cl::opt<int64_t> planCheck(
    "plan-check",
    cl::desc("pcc plan and --auto: compile the N fastest plans (also those "
             "predicted up to twice over the memory) and keep those the "
             "library's memory analysis fits (default 1)"),
    cl::init(1), cl::value_desc("N"), cl::cat(trainCategory));

void pcctool::readPlanDriverFlags(DriverFlags &driver) {
  driver.autoPlan = autoPlan;
  driver.planFlagsGiven =
      devices.getNumOccurrences() || deviceMemory.getNumOccurrences() ||
      machineFlag.getNumOccurrences() || top.getNumOccurrences() ||
      planCheck.getNumOccurrences();
}

std::string pcctool::readPlanFlags(const DriverFlags &driver,
                                   const pcc::CompileOptions &o,
                                   pcc::PlanRequest &request) {
  if (!o.train)
    return std::string(driver.planOnly ? "pcc plan" : "--auto") +
           " plans a training step: add --train";
  if (devices < 1)
    return std::string(driver.planOnly ? "pcc plan" : "--auto") +
           " needs --devices=N, the ranks the plan uses";
  if (o.memCapBytes > 0)
    return "--mem-cap does not go with --auto or pcc plan: give "
           "--device-memory and the search fits every rank in it";
  if (!o.ppCuts.empty())
    return "--pp-cuts does not go with --auto or pcc plan (the search cuts "
           "the stages)";
  std::string name = machineFlag.getNumOccurrences()
                         ? machineFlag.getValue()
                         : (o.target == Target::Cpu ? "cpu" : "h100");
  std::string error;
  std::optional<pcc::Machine> machine = pcc::Machine::load(name, error);
  if (!machine)
    return error;
  if (!deviceMemory.empty()) {
    machine->memoryBytes = pcc::parseBytes(deviceMemory);
    if (machine->memoryBytes <= 0)
      return "--device-memory=" + deviceMemory +
             " is not an amount of memory (such as 80GiB, 1.2GiB or a "
             "number of bytes)";
  }
  if (machine->memoryBytes <= machine->reservedBytes)
    return "machine '" + machine->name +
           "' does not say how much memory a rank has: give --device-memory";
  if (top < 1)
    return "--top must be at least 1";
  if (planCheck < 0)
    return "--plan-check must not be negative";
  request.devices = devices;
  request.machine = *machine;
  request.base = o;
  request.top = top;
  request.verify =
      driver.autoPlan ? std::max<int64_t>(1, planCheck) : planCheck.getValue();
  const GivenPlanDims &g = driver.given;
  request.fixTp = g.tp;
  request.fixPp = g.pp;
  request.fixDp = g.dp;
  request.fixZero = g.zero;
  request.fixMicrobatches = g.microbatches;
  request.fixSchedule = g.schedule;
  request.fixChunks = g.chunks;
  request.fixRecompute = g.recompute;
  request.fixPrecision = g.precision;
  request.fixSp = g.sp;
  if (request.fixTp && request.fixPp && request.fixDp &&
      o.tp * o.pp * o.dp != devices)
    return "--tp=" + std::to_string(o.tp) + " x --pp=" + std::to_string(o.pp) +
           " x --dp=" + std::to_string(o.dp) +
           " is not --devices=" + std::to_string(devices.getValue());
  return "";
}
