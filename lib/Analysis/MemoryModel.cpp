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

} // namespace mlir::pcc
