//===- Pipelines.cpp - named pcc pass pipelines
//----------------------------===//

#include "pcc/Transforms/Passes.h"

#include "mlir/Pass/PassRegistry.h"
#include "mlir/Transforms/Passes.h"

using namespace mlir;

void mlir::pcc::buildImportCleanupPipeline(OpPassManager &pm) {
  pm.addPass(createCanonicalizerPass());
  pm.addPass(createCSEPass());
  pm.addNestedPass<func::FuncOp>(createModelStats());
}

void mlir::pcc::registerPccPipelines() {
  PassPipelineRegistration<>(
      "pcc-import-cleanup",
      "canonicalize, CSE and summarise freshly imported pcc IR",
      [](OpPassManager &pm) { buildImportCleanupPipeline(pm); });
}
