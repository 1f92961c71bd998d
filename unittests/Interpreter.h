//===- Interpreter.h - float64 reference interpreter of the pcc dialect ---===//
//
// Evaluates pcc ops on host tensors of doubles, for unit tests: every op's
// semantics follow its documentation in PccOps.td and the CPU back end
// (lib/Target/Cpp/CppEmitter.cpp, runtime/lib/CpuKernels.cpp), but every
// value is computed in double whatever the element type. Integers and
// booleans are stored as doubles (booleans as 0 and 1); integer results wrap
// to their element type as the back end's would. The intended use is
// checking gradient rules by finite differences.
//
// Collectives, pipeline transfers, fusions, the sharded ops and the ops with
// side effects are not evaluable: interpret/evaluateOp fail with a message
// naming the op.
//
//===----------------------------------------------------------------------===//

#ifndef PCC_UNITTESTS_INTERPRETER_H
#define PCC_UNITTESTS_INTERPRETER_H

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Operation.h"
#include "mlir/Support/LLVM.h"
#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/STLFunctionalExtras.h"
#include "llvm/ADT/StringRef.h"

#include <cstdint>
#include <string>
#include <vector>

namespace pcc::testing {

/// The run context pcc.dropout sees in the interpreter: seed 0, step 1,
/// micro-batch 0.
inline constexpr uint64_t kInterpreterSeed = 0;
inline constexpr uint32_t kInterpreterStep = 1;

/// One context with the pcc and func dialects loaded, shared by the unit
/// tests of one process.
mlir::MLIRContext &testContext();

/// A row-major host tensor. Integers and booleans are stored as doubles.
struct Tensor {
  std::vector<int64_t> shape;
  std::vector<double> data;

  /// The number of elements `shape` describes (1 for a scalar).
  int64_t numElements() const {
    int64_t n = 1;
    for (int64_t d : shape)
      n *= d;
    return n;
  }
};

/// Runs `func`'s single block on `args` (one per block argument, shaped like
/// it; a tensor may leave `shape` empty and give only the data). `pcc.param`
/// ops read `params(name)` with the param's name. Returns the values
/// `func.return` returns, or failure with a message in `*error` (when given)
/// naming the op that could not be evaluated and its location.
mlir::FailureOr<std::vector<Tensor>>
interpret(mlir::func::FuncOp func, llvm::ArrayRef<Tensor> args,
          llvm::function_ref<Tensor(llvm::StringRef)> params,
          std::string *error = nullptr);

/// Evaluates one op on `operands` (one per operand, shaped like it or with
/// an empty `shape`) and returns one tensor per result, shaped by the result
/// types. A `pcc.param` has no value here (use `interpret`).
mlir::FailureOr<std::vector<Tensor>> evaluateOp(mlir::Operation *op,
                                                llvm::ArrayRef<Tensor> operands,
                                                std::string *error = nullptr);

} // namespace pcc::testing

#endif // PCC_UNITTESTS_INTERPRETER_H
