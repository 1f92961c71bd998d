//===- PipelineStages.cpp - a pipelined module's stages -------------------===//

#include "pcc/Analysis/PipelineStages.h"

#include "pcc/Dialect/Pcc/IR/Contracts.h"

using namespace mlir;
using namespace mlir::pcc;

SmallVector<std::array<func::FuncOp, 3>>
mlir::pcc::getPipelineStagePhases(ModuleOp module) {
  SmallVector<std::array<func::FuncOp, 3>> stages;
  for (auto func : module.getOps<func::FuncOp>()) {
    auto phase = func->getAttrOfType<StringAttr>(kPhaseAttrName);
    auto k = func->getAttrOfType<IntegerAttr>(kPipelineStageAttrName);
    if (!phase || !k)
      continue;
    auto stage = static_cast<size_t>(k.getInt());
    if (stages.size() <= stage)
      stages.resize(stage + 1);
    stages[stage][phase.getValue() == kPhaseNames[0]   ? 0
                  : phase.getValue() == kPhaseNames[1] ? 1
                                                       : 2] = func;
  }
  return stages;
}

FailureOr<TrainingStep> mlir::pcc::getTrainingStep(ModuleOp module,
                                                   StringRef pass) {
  TrainingStep step;
  step.pipelined =
      !module.lookupSymbol(kPhaseFunctions[0]) &&
      llvm::any_of(module.getOps<func::FuncOp>(), [](func::FuncOp f) {
        return f->hasAttr(kPipelineStageAttrName);
      });
  if (step.pipelined) {
    for (auto [k, phases] : llvm::enumerate(getPipelineStagePhases(module))) {
      if (!phases[0] || !phases[1] || !phases[2])
        return module.emitError(pass)
               << ": pipeline stage " << k
               << " lacks its forward, backward or weight-gradient phase";
      step.stages.emplace_back(phases.begin(), phases.end());
    }
    return step;
  }
  SmallVector<func::FuncOp, 4> phases;
  for (StringRef name : kPhaseFunctions) {
    auto phase = module.lookupSymbol<func::FuncOp>(name);
    if (!phase)
      return module.emitError(pass)
             << ": the module has no @" << name
             << " (run pcc-autodiff and pcc-optimizer first)";
    phases.push_back(phase);
  }
  step.stages.push_back({phases[0], phases[1]});
  step.stepPhases.assign(phases.begin() + 2, phases.end());
  return step;
}
