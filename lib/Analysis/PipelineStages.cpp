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
