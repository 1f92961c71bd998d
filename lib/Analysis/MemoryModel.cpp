//===- MemoryModel.cpp - predicted memory of a pipelined step -------------===//

#include "pcc/Analysis/MemoryModel.h"
#include "pcc/Analysis/PipelineStages.h"

#include "pcc/Dialect/Pcc/IR/Contracts.h"
#include "pcc/Dialect/Pcc/IR/Layout.h"
#include "pcc/Dialect/Pcc/IR/PccDialect.h"
#include "pcc/Dialect/Pcc/IR/ScheduleAttr.h"
#include "pcc/Schedule/Schedule.h"
#include "pcc/Schedule/StashSlots.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/StringSet.h"

#include <algorithm>
#include <array>

using namespace mlir;

namespace mlir::pcc {

namespace {

bool named(func::FuncOp f, unsigned result, StringRef prefix) {
  auto name = f.getResultAttrOfType<StringAttr>(result, "pcc.name");
  return name && name.getValue().starts_with(prefix);
}

int64_t arenaOf(func::FuncOp f) {
  auto bytes = f->getAttrOfType<IntegerAttr>(kArenaBytesAttrName);
  return bytes ? bytes.getInt() : 0;
}

} // namespace

std::vector<PipelineRankMemory> predictPipelineMemory(ModuleOp module) {
  auto main = module.lookupSymbol<func::FuncOp>("main");
  std::optional<::pcc::schedule::Schedule> schedule = getPipelineSchedule(main);
  if (!schedule) {
    module.emitError("memory: the module has no pipeline schedule");
    return {};
  }
  auto p = static_cast<int32_t>(schedule->ranks.size());
  int64_t m = schedule->options.microbatches;
  // Each stage's F, B and W; each pipeline rank's optimizer and zero-grad.
  SmallVector<std::array<func::FuncOp, 3>> stages =
      getPipelineStagePhases(module);
  SmallVector<SmallVector<func::FuncOp>> rankPhases(p);
  for (auto f : module.getOps<func::FuncOp>())
    if (auto r = f->getAttrOfType<IntegerAttr>(kPipelineRankAttrName))
      if (r.getInt() < p)
        rankPhases[r.getInt()].push_back(f);
  auto n = static_cast<int32_t>(stages.size());
  if (n == 0 || n % p != 0 ||
      llvm::any_of(stages, [](auto &s) { return !s[0] || !s[1] || !s[2]; })) {
    module.emitError("memory: the module is not a pipelined training step");
    return {};
  }
  int32_t chunks = n / p;

  std::vector<PipelineRankMemory> out(static_cast<size_t>(p));
  for (int32_t r = 0; r < p; ++r) {
    PipelineRankMemory &mem = out[static_cast<size_t>(r)];
    // State: every tensor the rank's phases read, once.
    llvm::StringMap<int64_t> state;
    SmallVector<func::FuncOp> phases(rankPhases[r]);
    for (int32_t c = 0; c < chunks; ++c)
      for (func::FuncOp f : stages[r + c * p])
        phases.push_back(f);
    for (func::FuncOp f : phases) {
      f.walk([&](ParamOp param) {
        state.try_emplace(param.getName(), getTensorBytes(param.getType()));
      });
      mem.arena = std::max(mem.arena, arenaOf(f));
    }
    for (auto &entry : state)
      mem.state += entry.getValue();

    // Slots and stash sets: the runtime's walk of the list.
    std::vector<::pcc::schedule::SlotStep> steps;
    for (const ::pcc::schedule::Instr &instr : schedule->ranks[r]) {
      if (instr.chunk >= chunks)
        continue;
      steps.push_back({instr.chunk, instr.microbatch,
                       instr.op == ::pcc::schedule::Op::Backward,
                       instr.op == ::pcc::schedule::Op::WeightGrad});
    }
    ::pcc::schedule::StashSlots assigned = ::pcc::schedule::assignStashSlots(
        steps, chunks, static_cast<int32_t>(m));
    mem.slotCounts = assigned.slotCount;
    mem.stashCounts = assigned.stashCount;

    for (int32_t c = 0; c < chunks; ++c) {
      int32_t k = r + c * p;
      auto [fwd, bwd, w] = stages[k];
      bool last = k + 1 == n;
      // A slot: the forward's inputs (received or read from the batch),
      // its outputs and saved activations, and (not on the last stage)
      // the cotangents of its outputs.
      int64_t slot = 0;
      for (Type t : fwd.getArgumentTypes())
        slot += getTensorBytes(t);
      for (auto [j, t] : llvm::enumerate(fwd.getResultTypes())) {
        slot += getTensorBytes(t);
        if (!last && !named(fwd, j, "saved") &&
            isa<FloatType>(cast<RankedTensorType>(t).getElementType()))
          slot += getTensorBytes(t);
      }
      int64_t set = 0, send = 0;
      for (auto [o, t] : llvm::enumerate(bwd.getResultTypes()))
        (named(bwd, o, "stash") ? set : send) += getTensorBytes(t);
      mem.slotBytes.push_back(slot);
      mem.slots += mem.slotCounts[static_cast<size_t>(c)] * slot;
      mem.stash += mem.stashCounts[static_cast<size_t>(c)] * set;
      mem.sendGrad += m * send;
    }
    // The loss gradient and the norm, and the step's losses (or, after the
    // run, the gathered stash counts).
    mem.other = 8 + 4 * std::max<int64_t>(m, p);
  }
  return out;
}

StepMemory predictStepMemory(ModuleOp module) {
  std::optional<TrainingConfig> training = getTrainingConfig(module);
  StepMemory p;
  llvm::StringMap<int64_t> stateBytes;
  int64_t &weights = p.weights, &grads = p.grads, &optimizer = p.optimizer,
          &inputs = p.inputs, &saved = p.saved, &arena = p.arena;
  // Gradients in a bucket are views of it: the bucket counts, with the
  // gaps that align each gradient.
  llvm::StringSet<> inBucket;
  // --offload=optimizer: state in host memory alone, and host copies.
  llvm::StringSet<> hostOnly, hostCopy;
  if (training) {
    for (const GradientBucket &bucket : training->buckets)
      for (const std::string &g : bucket.grads)
        inBucket.insert(g);
    for (const std::string &name : training->offloadHost)
      hostOnly.insert(name);
    for (const auto *copies :
         {&training->offloadToHost, &training->offloadToDevice})
      for (const std::string &name : *copies)
        hostCopy.insert(name);
  }
  bool offloaded = p.offloaded = !hostOnly.empty() || !hostCopy.empty();
  int64_t &host = p.host, &crossing = p.crossing, &bucketGaps = p.bucketGaps;
  module.walk([&](ParamOp param) {
    if (!stateBytes.insert({param.getName(), getTensorBytes(param.getType())})
             .second)
      return;
    StringRef kind = splitStateName(param.getName()).second;
    int64_t bytes = getTensorBytes(param.getType());
    if (hostCopy.contains(param.getName()))
      host += bytes;
    if (hostOnly.contains(param.getName())) {
      host += bytes;
      return;
    }
    if (inBucket.contains(param.getName())) {
      bucketGaps -= bytes;
      return;
    }
    if (kind == "bucket")
      bucketGaps += bytes;
    if (kind == kF16CopyState)
      p.copyType = "fp16";
    (kind == kBf16CopyState || kind == kF16CopyState ? p.copies
     : kind.empty()                                  ? weights
     : kind == "grad" || kind == "bucket"            ? grads
                                                     : optimizer) += bytes;
  });
  for (func::FuncOp f : module.getOps<func::FuncOp>()) {
    auto bytes = f->getAttrOfType<IntegerAttr>(kArenaBytesAttrName);
    // An offloaded update's arena and inputs are in host memory; the
    // device holds the outputs of the collectives before it.
    if (offloaded && f.getSymName() == kPhaseFunctions[2]) {
      for (Type t : f.getArgumentTypes())
        host += getTensorBytes(t);
      host += bytes ? bytes.getInt() : 0;
      continue;
    }
    if (offloaded && f.getSymName() == kOffloadPhaseFunctions[0])
      for (Type t : f.getResultTypes())
        crossing += getTensorBytes(t);
    if (bytes)
      arena = std::max(arena, bytes.getInt());
    if (f.getSymName() != kPhaseFunctions[0])
      continue;
    for (Type t : f.getArgumentTypes())
      inputs += getTensorBytes(t);
    for (Type t : f.getResultTypes().drop_front())
      saved += getTensorBytes(t);
  }
  return p;
}

int64_t predictPeakBytes(ModuleOp module) {
  if (module.lookupSymbol(kPhaseFunctions[0]))
    return predictStepMemory(module).device();
  std::vector<PipelineRankMemory> ranks = predictPipelineMemory(module);
  if (ranks.empty())
    return -1;
  int64_t peak = 0;
  for (const PipelineRankMemory &r : ranks)
    peak = std::max(peak, r.total());
  return peak;
}

} // namespace mlir::pcc
