//===- Cpp.h - C++ emission and the model library build ---------*- C++ -*-===//
//
// pcc's back end: a planned `func.func @main` (pcc-plan-memory has run)
// becomes one translation unit implementing the model ABI of
// runtime/include/pcc/runtime/ModelAbi.h for the CPU, for CUDA, or for both.
// Elementwise ops and fusions become generated kernels (loops on the CPU,
// grid-stride __global__ kernels on the GPU; identical kernels are emitted
// once); everything else calls the runtime's CPU or CUDA kernels. The unit is
// compiled into model.so by the host C++ compiler (CPU only) or by nvcc.
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

/// Targets, as bits (the values of the runtime's enum pcc_target).
enum : unsigned { kTargetCpu = 1, kTargetCuda = 2 };

struct CppEmitOptions {
  /// kTargetCpu and/or kTargetCuda.
  unsigned targets = kTargetCpu;
  /// Recorded in the model info: the model compiled and its weights file.
  std::string source;
  std::string weightsFile;
};

/// The weights `@main` reads, in the order the emitted code expects them:
/// (initializer name, type), first use first, each name once.
std::vector<std::pair<std::string, RankedTensorType>>
getWeightOrder(ModuleOp module);

/// Emits the C++ (CPU only) or CUDA C++ source of the model library. Fails
/// with a diagnostic at the op that has no lowering (e.g. an integer
/// matmul).
LogicalResult emitCpp(ModuleOp module, llvm::raw_ostream &os,
                      const CppEmitOptions &options);

struct BuildOptions {
  /// kTargetCpu and/or kTargetCuda: with CUDA the source is CUDA C++ and
  /// nvcc builds it.
  unsigned targets = kTargetCpu;
  /// C++ compiler; empty means the one pcc was configured with.
  std::string compiler;
  /// nvcc; empty means the one pcc was configured with (or PCC_NVCC).
  std::string nvcc;
  /// GPU architectures for nvcc, e.g. {"80", "90"}; empty means the
  /// configured default.
  std::vector<std::string> cudaArchitectures;
  /// Keep the generated source beside the library (model.so.cpp).
  bool keepSource = false;
  /// Optimisation flag for the host compiler.
  std::string optimization = "-O3";
};

/// The GPU architectures nvcc builds for when BuildOptions names none:
/// PCC_CUDA_ARCHITECTURES from the environment, else the configured ones.
std::vector<std::string> getDefaultCudaArchitectures();

/// Compiles `source` into the shared library `outputPath`, linked against
/// the pcc runtime (and its CUDA backend). Reports a missing compiler and
/// compiler errors as diagnostics.
LogicalResult buildSharedLibrary(MLIRContext *context, llvm::StringRef source,
                                 llvm::StringRef outputPath,
                                 const BuildOptions &options);

} // namespace mlir::pcc

#endif // PCC_TARGET_CPP_H
