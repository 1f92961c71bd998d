//===- PccDialect.h - pcc dialect -------------------------------*- C++ -*-===//

#ifndef PCC_DIALECT_PCC_IR_PCCDIALECT_H
#define PCC_DIALECT_PCC_IR_PCCDIALECT_H

#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Dialect.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/Interfaces/InferTypeOpInterface.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringMap.h"

#include <utility>

#include "pcc/Dialect/Pcc/IR/PccEnums.h.inc"
#include "pcc/Dialect/Pcc/IR/PccOpsDialect.h.inc"

#define GET_ATTRDEF_CLASSES
#include "pcc/Dialect/Pcc/IR/PccAttrs.h.inc"

namespace mlir::pcc {
/// The size of mesh axis `axis` in the `pcc.mesh` of `op`'s module, or an
/// error on `op` naming the axis when the module has no such axis.
FailureOr<int64_t> getMeshAxisSize(Operation *op, llvm::StringRef axis);
/// The module's `pcc.pp_chunks` (model chunks per pipeline rank), 1 when
/// absent.
int64_t getPipelineChunks(Operation *op);
/// The number of pipeline stages of `op`'s module: the mesh's pp axis
/// times its `pcc.pp_chunks` (model chunks per pipeline rank).
FailureOr<int64_t> getPipelineStageCount(Operation *op);
/// Splits an importer location (a fused location of the node's name with
/// its op type as metadata) back into ONNX op type and node name; both
/// empty when `loc` does not come from a node.
std::pair<std::string, std::string> getOnnxNodeOfLocation(Location loc);
/// A splat of `value` with `type` (integers truncate): what a
/// `pcc.constant` holds for a filled tensor.
DenseElementsAttr getSplatAttr(RankedTensorType type, double value);

/// An op the sharding planner never splits: every plan runs it on whole
/// tensors (a weight, a loss, a collective, an optimizer update). Ops with
/// neither a sharding rule of their own, nor Elementwise, nor this trait
/// get no sharding interface, and the "every op has rules" test fails.
template <typename ConcreteType>
class RunsWhole : public ::mlir::OpTrait::TraitBase<ConcreteType, RunsWhole> {};

/// The size of mesh axis `axis`, which `op` names, in the pcc.mesh of the
/// module `op` is in; an error on `op` where there is no such axis.
FailureOr<int64_t> verifyMeshAxisUse(Operation *op, StringRef axis);

/// An op whose `axis` attribute names a mesh axis. Its SymbolUserOpInterface
/// checks the name against the module's pcc.mesh when the module verifies
/// (an op's own verifier must not look outside the op), and then the op's
/// `LogicalResult verifyAxisSize(int64_t)`, where it has one: the checks
/// that need the axis' size.
template <typename ConcreteType>
class MeshAxisUser
    : public ::mlir::OpTrait::TraitBase<ConcreteType, MeshAxisUser> {
  template <typename T>
  using AxisSizeCheck = decltype(std::declval<T &>().verifyAxisSize(int64_t()));
  /// The op's `mesh_axis`, where `axis` is something else (shard_gather).
  template <typename T>
  using MeshAxisAttr = decltype(std::declval<T &>().getMeshAxis());

public:
  LogicalResult verifySymbolUses(SymbolTableCollection &) {
    auto op = llvm::cast<ConcreteType>(this->getOperation());
    StringRef axis;
    if constexpr (llvm::is_detected<MeshAxisAttr, ConcreteType>::value)
      axis = op.getMeshAxis();
    else
      axis = op.getAxis();
    FailureOr<int64_t> size = verifyMeshAxisUse(op, axis);
    if (failed(size))
      return failure();
    if constexpr (llvm::is_detected<AxisSizeCheck, ConcreteType>::value)
      return op.verifyAxisSize(*size);
    return success();
  }
};

/// Model state (PccOps.td, Pcc_StateResource): what `pcc.param` loads and
/// the in-place updates store to.
struct StateResource : public SideEffects::Resource::Base<StateResource> {
  StringRef getName() final { return "pcc.state"; }
};
} // namespace mlir::pcc

#define GET_OP_CLASSES
#include "pcc/Dialect/Pcc/IR/PccOps.h.inc"

namespace mlir::pcc {
/// The `pcc.mesh` of `op`'s module (or of `op` itself, a module); null when
/// it has none.
MeshOp getMesh(Operation *op);
/// Sets `module`'s mesh to `axes` (name and size), in the rank grid's
/// order, slowest first: a `pcc.mesh @mesh` at the top of its body,
/// replacing any other.
void setMesh(ModuleOp module,
             llvm::ArrayRef<std::pair<llvm::StringRef, int64_t>> axes);

/// The state `op` stores to: the loads (`pcc.param`) of the operands it
/// writes through, by its effects on StateResource.
llvm::SmallVector<ParamOp> getStoredState(Operation *op);

/// The stores to model state in one block, in program order.
class StateStores {
public:
  explicit StateStores(Block &block);
  /// The first op of the block strictly between `from` and `to` (ops of
  /// the block, `from` before `to`) that stores to state `name`, or null.
  Operation *storeBetween(llvm::StringRef name, Operation *from,
                          Operation *to) const;

private:
  llvm::DenseMap<Operation *, unsigned> position;
  llvm::StringMap<llvm::SmallVector<unsigned>> stores;
  llvm::SmallVector<Operation *> ops;
};

/// Whether `use` names the state its op stores to (the state operand of an
/// in-place update) rather than reading a loaded value.
bool namesStoredState(OpOperand &use);

/// Replaces loads of model state with earlier loads of the same state in
/// the same block where that reads the same (pcc-merge-state-loads).
/// Returns the number of loads replaced.
unsigned mergeStateLoads(Block &block);

/// The contract of code that reads a loaded state from the state's own
/// buffer (the C++ back end does, without a copy): no use of a `pcc.param`
/// follows, in its block, an op that stores to the same state, other than
/// that use itself. Fails with an error on the use, naming the store.
LogicalResult verifyStateOrder(Operation *root);
} // namespace mlir::pcc

#endif // PCC_DIALECT_PCC_IR_PCCDIALECT_H
