//===- Differentiate.h - reverse mode over one function ---------*- C++ -*-===//
//
// The core of pcc-autodiff, for a whole step and for each stage: a function
// becomes a forward function (its results, then the values the backward
// needs) and a backward function (those values and one cotangent per float
// result in; the cotangents of the chosen arguments out), with every
// weight's gradient added into its `@grad` state on the way.
//
//===----------------------------------------------------------------------===//

#ifndef PCC_TRANSFORMS_DIFFERENTIATE_H
#define PCC_TRANSFORMS_DIFFERENTIATE_H

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/ADT/StringSet.h"

#include <optional>

namespace mlir::pcc {

/// What the backward function recomputes from the forward's values
/// instead of having them saved: weights and constants always; with
/// `Selective` also every pure op but the contractions and lookups
/// (matmul, conv, gather: their outputs are saved, the elementwise ops,
/// norms, softmax and dropout after them are computed again); with `Full`
/// everything, from the function's arguments.
enum class Recompute { None, Selective, Full };

/// `{pcc.name = name}`: how the phases name their arguments and results.
DictionaryAttr nameAttr(MLIRContext *ctx, llvm::StringRef name);

/// "none", "selective" or "full".
inline std::optional<Recompute> parseRecompute(llvm::StringRef name) {
  if (name == "none")
    return Recompute::None;
  if (name == "selective")
    return Recompute::Selective;
  if (name == "full")
    return Recompute::Full;
  return std::nullopt;
}

struct DifferentiateSpec {
  Recompute recompute = Recompute::None;
  llvm::StringRef forwardName, backwardName;
  /// Per argument of the function: whether it is differentiated (a value
  /// received from an earlier pipeline stage); its cotangent is a result
  /// of the backward function, in argument order.
  llvm::SmallVector<bool> activeArgs;
  /// Names of the forward function's results (the residuals are
  /// saved<i>); empty: out<j>.
  llvm::SmallVector<std::string> resultNames;
  /// Weights held constant: no gradient, no optimizer state
  /// (getFrozenWeights).
  const llvm::StringSet<> *frozen = nullptr;
};

/// The weights of `module` training holds constant: those named in
/// `names` (an error names one that is not a weight) and, by default, the
/// rotary embeddings' inverse frequencies (`...inv_freq`), buffers PyTorch
/// does not train that its current exporter writes as initializers.
/// With `remarks`, one remark per weight frozen by default.
FailureOr<llvm::StringSet<>>
getFrozenWeights(ModuleOp module, ArrayRef<std::string> names, bool remarks);

struct Differentiated {
  func::FuncOp forward, backward;
  /// Per backward result: the argument it is the cotangent of.
  llvm::SmallVector<unsigned> gradOf;
  /// Per backward argument after the residuals: the result it seeds.
  llvm::SmallVector<unsigned> seedOf;
  unsigned numResiduals = 0;
};

/// Differentiates `f` (single block) into two new functions inserted
/// before it; `f` is left in place. Every float result gets a cotangent
/// argument. Weights with gradients are added to `trained` in the order
/// their first gradient appears.
FailureOr<Differentiated>
differentiateFunction(func::FuncOp f, const DifferentiateSpec &spec,
                      llvm::SetVector<llvm::StringRef> &trained);

} // namespace mlir::pcc

#endif // PCC_TRANSFORMS_DIFFERENTIATE_H
