//===- FunctionEmitter.h - one planned function to C++ ----------*- C++ -*-===//
//
// Internal to the C++ target. CppEmitter.cpp turns one planned function
// (@main, or a pipeline stage) into a run function for one target, with
// the kernels and constants it uses; LibraryEmitter.cpp assembles those
// into the model library's translation unit (the model ABI's tables and
// entry points).
//
//===----------------------------------------------------------------------===//

#ifndef PCC_LIB_TARGET_CPP_FUNCTIONEMITTER_H
#define PCC_LIB_TARGET_CPP_FUNCTIONEMITTER_H

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/StringMap.h"

#include <string>
#include <utility>
#include <vector>

namespace mlir::pcc::cpp {

/// The code of one function for one target: file-scope definitions and the
/// run function (`run_cpu` or `run_cuda`).
struct TargetCode {
  std::string constants, kernels, function;
  /// The weights the function reads, in the order of its `w` array.
  std::vector<std::pair<std::string, RankedTensorType>> weights;
  /// Per weight: its pcc_weight_shard initialiser.
  std::vector<std::string> weightShards;
  /// Per weight: the whole tensor's shape (the stored or checkpointed one).
  std::vector<std::vector<int64_t>> weightWholes;
};

/// Emits `func` (planned by pcc-plan-memory) for the CPU or CUDA;
/// `meshAxes` maps each mesh axis to its index in the run context's comms.
FailureOr<TargetCode> emitFunction(func::FuncOp func, bool cuda,
                                   const llvm::StringMap<int> &meshAxes);

RankedTensorType tensorTypeOf(Value v);
/// `s` as a C++ string literal.
std::string quoted(StringRef s);
/// A `static const pcc_tensor_spec name[]` table of (name, type) pairs; the
/// shape arrays it points to are appended to `shapes`.
std::string specArray(StringRef name,
                      ArrayRef<std::pair<std::string, RankedTensorType>> specs,
                      std::string &shapes);

} // namespace mlir::pcc::cpp

#endif // PCC_LIB_TARGET_CPP_FUNCTIONEMITTER_H
