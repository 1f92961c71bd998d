//===- Cpp.h - C++ emission and the model library build ---------*- C++ -*-===//
//
// pcc's back end for the CPU: a planned `func.func @main` (pcc-plan-memory
// has run) becomes one C++ translation unit implementing the model ABI of
// runtime/include/pcc/runtime/ModelAbi.h. Elementwise ops become loops in
// static kernels (identical kernels are emitted once); everything else calls
// the runtime's CPU kernels. The unit is compiled into model.so by the host
// C++ compiler.
//
//===----------------------------------------------------------------------===//

#ifndef PCC_TARGET_CPP_H
#define PCC_TARGET_CPP_H

#include "mlir/IR/BuiltinOps.h"
#include "llvm/Support/raw_ostream.h"

#include <string>
#include <utility>
#include <vector>

namespace mlir::pcc {

struct CppEmitOptions {
  /// Recorded in the model info: the model compiled and its weights file.
  std::string source;
  std::string weightsFile;
};

/// The weights `@main` reads, in the order the emitted code expects them:
/// (initializer name, type), first use first, each name once.
std::vector<std::pair<std::string, RankedTensorType>>
getWeightOrder(ModuleOp module);

/// Emits the C++ source of the model library. Fails with a diagnostic at
/// the op that has no CPU lowering (e.g. an integer matmul).
LogicalResult emitCpp(ModuleOp module, llvm::raw_ostream &os,
                      const CppEmitOptions &options);

struct BuildOptions {
  /// C++ compiler; empty means the one pcc was configured with.
  std::string compiler;
  /// Keep the generated source beside the library (model.so.cpp).
  bool keepSource = false;
  /// Optimisation flag for the host compiler.
  std::string optimization = "-O3";
};

/// Compiles `source` (C++ text) into the shared library `outputPath`,
/// linked against the pcc runtime. Reports compiler errors as diagnostics.
LogicalResult buildSharedLibrary(MLIRContext *context, llvm::StringRef source,
                                 llvm::StringRef outputPath,
                                 const BuildOptions &options);

} // namespace mlir::pcc

#endif // PCC_TARGET_CPP_H
