//===- pcc-opt.cpp - run pcc passes on MLIR files -------------------------===//

#include "pcc/Dialect/Pcc/IR/PccDialect.h"
#include "pcc/Pipelines/Compile.h"
#include "pcc/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"
#include "mlir/Transforms/Passes.h"

int main(int argc, char **argv) {
  mlir::registerCanonicalizerPass();
  mlir::registerCSEPass();
  mlir::pcc::registerPccPasses();
  mlir::pcc::registerPccPipelines();
  mlir::pcc::registerCompilePipeline();

  mlir::DialectRegistry registry;
  registry.insert<mlir::pcc::PccDialect, mlir::func::FuncDialect>();
  return mlir::asMainReturnCode(
      mlir::MlirOptMain(argc, argv, "pcc optimizer driver\n", registry));
}
