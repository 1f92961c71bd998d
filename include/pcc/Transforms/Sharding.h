//===- Sharding.h - layouts over one mesh axis and their propagation -*- C++
//-*-===//
//
// The model behind pcc-plan-sharding and pcc-partition. A plan fixes the
// layout of every weight of rank >= 2 (the decisions); `propagateShardings`
// derives from them the layout of every other value, the layout each op
// reads each operand in (which is where collectives go) and the plan's
// cost. The planner searches the decisions; the partition pass re-derives
// the same plan from the decisions recorded on the weights and rewrites.
//
// Splits start at weights and flow through ops: an op never splits a value
// none of its operands had split, so an activation is only ever split
// because a weight was (see docs/design-notes.md, "Sharding planner").
//
//===----------------------------------------------------------------------===//

#ifndef PCC_TRANSFORMS_SHARDING_H
#define PCC_TRANSFORMS_SHARDING_H

#include "pcc/Dialect/Pcc/IR/PccInterfaces.h"
#include "pcc/Analysis/CostModel.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/MapVector.h"
#include "llvm/ADT/StringMap.h"

#include <string>
#include <vector>

namespace mlir::pcc {

/// A unit attribute on the module (pcc --sp): the planner may split
/// [batch, sequence, hidden] activations along the sequence over tp.
inline constexpr llvm::StringLiteral kSequenceParallelAttrName =
    "pcc.sequence_parallel";

/// One collective the plan inserts.
struct PlannedCollective {
  CollectiveKind kind;
  Value value;    // the value converted
  Operation *consumer; // the op that reads it converted (null: the results)
  Shard from, to; // its layouts
  int64_t bytes;  // the whole tensor's bytes (the collective's payload)
};

struct ShardingPlan {
  std::string axis;
  int64_t ranks = 1;
  /// Every value's layout (results, arguments).
  llvm::DenseMap<Value, Shard> shards;
  /// The layout each op reads each of its operands in.
  llvm::DenseMap<Operation *, SmallVector<Shard>> operandShards;
  /// The collectives, in program order (one per value and target layout).
  std::vector<PlannedCollective> collectives;
  /// Bytes of weights every rank holds whole: replicated weights of rank
  /// >= 2 plus split ones that some op gathers back.
  int64_t replicatedWeightBytes = 0;
  /// Bytes of weights one rank holds.
  int64_t weightBytesPerRank = 0;
  double computeSeconds = 0, commSeconds = 0;
  double seconds() const { return computeSeconds + commSeconds; }
  int64_t commBytes() const;
  /// Lexicographic: less replicated weight memory, then less time.
  bool betterThan(const ShardingPlan &other) const;
};

/// The weights whose layout is a decision of the plan (rank >= 2), by name,
/// in program order. Smaller weights (biases, norm scales) are sliced where
/// a consumer needs them split.
llvm::MapVector<StringRef, RankedTensorType> decisionWeights(func::FuncOp func);

/// The weight `v` is, seen through autocast's casts (a matmul under
/// --precision=bf16 reads its weight's 16-bit cast, which pcc-bf16-copies
/// makes the weight's bf16 copy, split as the weight is); null otherwise.
ParamOp weightParamOf(Value v);

/// Derives the layout of every value from the weight decisions (weights not
/// listed are replicated) and the layouts of the function's arguments
/// (`argLayouts`, one per argument; replicated when empty).
ShardingPlan
propagateShardings(func::FuncOp func, StringRef axis, int64_t ranks,
                   const llvm::StringMap<Shard> &decisions,
                   const CostModel &cost = {}, ArrayRef<Shard> argLayouts = {},
                   ArrayRef<std::optional<Shard>> resultLayouts = {});

/// Rewrites `func` to what one rank of `plan`'s axis computes (the
/// pcc-partition pass's rewrite). With `keepResultLayouts` the results stay
/// in their planned layouts (the function returns local pieces) instead of
/// being made whole. With `stateWeights` (training: a weight is one state
/// buffer that the optimizer updates) a weight is a `pcc.param` of a piece
/// only in its own layout; other slices of it are taken locally from it.
/// Returns the number of each kind of collective
/// inserted (indexed by CollectiveKind) and their bytes.
struct PartitionStats {
  int64_t counts[3] = {0, 0, 0};
  int64_t bytes = 0;
};
FailureOr<PartitionStats> partitionFunction(func::FuncOp func,
                                            const ShardingPlan &plan,
                                            bool keepResultLayouts = false,
                                            bool stateWeights = false);

/// Every layout a weight of `type` can take over `ranks` ranks: replicated,
/// and each dimension split in each number of stripes that divides.
std::vector<Shard> candidateShards(RankedTensorType type, int64_t ranks);

/// Weights that share one decision because their place in the program
/// looks the same (ShardingSearch.cpp): the same projection of every
/// middle layer of a transformer is one class.
struct WeightClasses {
  /// Each class's weights, in program order; classes in the order of their
  /// first weight.
  std::vector<SmallVector<StringRef>> members;
  llvm::StringMap<unsigned> classOf;
  size_t size() const { return members.size(); }
};

/// Groups the decision weights of `func` by a structural hash of the ops
/// around their uses, `depth` levels up and down (names ignored).
WeightClasses classifyWeights(func::FuncOp func, int depth = 6);

/// A move the search took that changed several classes together.
struct GroupMove {
  /// The weights it changed and their new layouts.
  SmallVector<std::pair<StringRef, Shard>> weights;
  int64_t replicatedBytesSaved = 0, commBytesAdded = 0;
  double secondsAdded = 0;
};

struct SearchResult {
  llvm::StringMap<Shard> decisions;
  ShardingPlan plan;
  WeightClasses classes;
  std::vector<GroupMove> groups;
  /// Propagations the search ran (each linear in the program).
  int64_t evaluations = 0;
};

/// The planner's search: group moves (a class split by columns and the
/// matmuls that contract over it split by rows), then coordinate descent
/// over classes. Planning time is the number of evaluations (independent
/// of depth) times one propagation.
SearchResult searchShardings(func::FuncOp func, StringRef axis, int64_t ranks);

} // namespace mlir::pcc

#endif // PCC_TRANSFORMS_SHARDING_H
