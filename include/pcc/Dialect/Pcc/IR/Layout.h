//===- Layout.h - layouts of a tensor over one mesh axis --------*- C++ -*-===//
//
// The layout algebra the op interfaces speak (PccInterfaces.td): how one
// tensor lies over the ranks of a mesh axis (`Shard`, the in-memory form of
// #pcc.shard), one way an op can run on laid-out operands
// (`ShardingOption`), and the rules every op shares (what fits a shape,
// what a reshape does to a split).
//
//===----------------------------------------------------------------------===//

#ifndef PCC_DIALECT_PCC_IR_LAYOUT_H
#define PCC_DIALECT_PCC_IR_LAYOUT_H

#include "pcc/Dialect/Pcc/IR/PccDialect.h"

#include <optional>
#include <string>

namespace mlir::pcc {

/// A layout change an op's operand needs before the op reads it.
enum class CollectiveKind { AllReduce, AllGather, ReduceScatter };

/// "all_reduce", "all_gather" or "reduce_scatter".
const char *collectiveName(CollectiveKind kind);

/// The layout of a tensor over the mesh axis being planned; see
/// #pcc.shard in PccAttrs.td.
struct Shard {
  ShardKind kind = ShardKind::replicated;
  int64_t dim = -1;
  int64_t stripes = 0;

  static Shard replicated() { return {}; }
  static Shard split(int64_t dim, int64_t stripes) {
    return {ShardKind::split, dim, stripes};
  }
  static Shard partial() { return {ShardKind::partial, -1, 0}; }
  bool isReplicated() const { return kind == ShardKind::replicated; }
  bool isSplit() const { return kind == ShardKind::split; }
  bool isPartial() const { return kind == ShardKind::partial; }
  bool operator==(const Shard &o) const {
    return kind == o.kind && dim == o.dim && stripes == o.stripes;
  }
  bool operator!=(const Shard &o) const { return !(*this == o); }

  ShardingAttr toAttr(MLIRContext *context, StringRef axis) const;
  static Shard fromAttr(ShardingAttr attr);
  /// "replicated", "partial sum", "dim 1" or "dim 1 in 3 stripes".
  std::string describe() const;
};

/// One way to run an op: the layout it reads each operand in and the
/// layouts of its results.
struct ShardingOption {
  SmallVector<Shard> operands, results;
};

/// The shape one rank holds of a tensor of global type `type` (the whole
/// type for a layout that does not fit it: such a layout has no pieces).
RankedTensorType localType(RankedTensorType type, Shard shard, int64_t ranks);

/// The bytes a tensor of ranked tensor type `type` takes: each element
/// rounded up to whole bytes (an i1 takes one).
inline int64_t getTensorBytes(Type type) {
  auto tensor = cast<RankedTensorType>(type);
  return tensor.getNumElements() * ((tensor.getElementTypeBitWidth() + 7) / 8);
}

/// Whether `shard` can lay out a tensor of `type` over `ranks` ranks: a
/// split dimension divides into stripes x ranks pieces; partial sums are
/// of floats.
bool layoutFits(Shard shard, RankedTensorType type, int64_t ranks);

/// The rank counts above 1 (up to `limit`) that divide `size`, for error
/// messages and --explain: "2, 3, 4 or 6", "97", or "none" (a size of 1 or
/// a prime above the limit).
std::string ranksThatDivide(int64_t size, int64_t limit = 1024);

/// The split of a reshape's result that holds, on every rank, exactly the
/// elements the split `s` of its input holds (reshapes keep the flat
/// order), or none when no result dimension expresses it.
std::optional<Shard> reshapeSplit(ArrayRef<int64_t> in, ArrayRef<int64_t> out,
                                  Shard s, int64_t ranks);

/// How a same-shape (elementwise) op treats partial sums, which decides
/// whether a partial operand may stay partial through it.
enum class PartialSums {
  /// Not linear: partial operands are summed first (exp, max, compare...).
  none,
  /// f(a1 + a2, b1 + b2) = f(a1, b1) + f(a2, b2): add, sub.
  additive,
  /// Linear in each operand when the others are whole: neg, mul.
  eachOperand,
  /// Linear in operand 0 only: div.
  firstOperand,
};

/// The options of an op whose operands and results share one shape: follow
/// any operand's split; keep partial sums where `partial` allows it.
void sameShapeShardingOptions(Operation *op, ArrayRef<Shard> operands,
                              PartialSums partial,
                              SmallVectorImpl<ShardingOption> &options);

/// Attaches the external models of the sharding, cost and collective
/// interfaces to every pcc op (called by the dialect's initialize).
void registerPccInterfaceModels(MLIRContext *context);
/// Attaches PccAutodiffOpInterface's rules (AutodiffModels.cpp).
void registerPccAutodiffModels(MLIRContext *context);

} // namespace mlir::pcc

#endif // PCC_DIALECT_PCC_IR_LAYOUT_H
