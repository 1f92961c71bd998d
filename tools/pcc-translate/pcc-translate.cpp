//===- pcc-translate.cpp - planned pcc IR to the model library's C++ ------===//
//
// pcc-translate --pcc-to-cpp file.mlir: the C++ pcc would compile into the
// model library (the IR after pcc-plan-memory; `pcc --emit=mlir --explain`
// or pcc-compile{plan-memory=true} make it). --pcc-to-cuda: the CUDA C++.
// For test/Target.
//
//===----------------------------------------------------------------------===//

#include "pcc/Dialect/Pcc/IR/PccDialect.h"
#include "pcc/Target/Cpp.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Tools/mlir-translate/MlirTranslateMain.h"
#include "mlir/Tools/mlir-translate/Translation.h"

using namespace mlir;

static void registerTarget(StringRef name, StringRef description,
                           unsigned targets) {
  TranslateFromMLIRRegistration(
      name, description,
      [targets](Operation *op, llvm::raw_ostream &os) -> LogicalResult {
        auto module = dyn_cast<ModuleOp>(op);
        if (!module)
          return op->emitError("expected a builtin.module");
        pcc::CppEmitOptions options;
        options.targets = targets;
        options.source = "model.onnx";
        options.weightsFile = "model.safetensors";
        return pcc::emitCpp(module, os, options);
      },
      [](DialectRegistry &registry) {
        registry.insert<pcc::PccDialect, func::FuncDialect>();
      });
}

int main(int argc, char **argv) {
  registerTarget("pcc-to-cpp", "the model library's C++ (CPU)",
                 pcc::kTargetCpu);
  registerTarget("pcc-to-cuda", "the model library's CUDA C++",
                 pcc::kTargetCuda);
  return failed(mlirTranslateMain(argc, argv, "pcc translation driver"));
}
