//===- FlatShards.h - ZeRO's flat pieces of model state over dp -*- C++ -*-===//
//
// Shared by pcc-data-parallel and pcc-optimizer: ZeRO 1-3 keep each
// weight's tensors flattened, padded to dp x s elements, and rank r holds
// elements [r s, (r + 1) s) (#pcc.shard<dp, flat>).
//
//===----------------------------------------------------------------------===//

#ifndef PCC_TRANSFORMS_FLATSHARDS_H
#define PCC_TRANSFORMS_FLATSHARDS_H

#include "pcc/Dialect/Pcc/IR/PccDialect.h"
#include "pcc/Transforms/Training.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/MapVector.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/StringSet.h"

namespace mlir::pcc {

/// Builds the flat-shard views of the tensors of one weight over dp ranks.
struct FlatShards {
  MLIRContext *ctx;
  int64_t ranks;

  static int64_t elements(RankedTensorType type) {
    return type.getNumElements();
  }
  int64_t piece(RankedTensorType type) const {
    return (elements(type) + ranks - 1) / ranks;
  }
  RankedTensorType pieceType(RankedTensorType type) const {
    return RankedTensorType::get({piece(type)}, type.getElementType());
  }

  /// Tensor parallelism: the split of each weight (by name) whose
  /// rank-local piece is what gets sharded flat, and the ranks of its axis.
  llvm::StringMap<ShardingAttr> splits;
  int64_t splitRanks = 1;

  /// The split of the weight of state or weight `name` (null: whole).
  ShardingAttr splitOf(StringRef name) const {
    return splits.lookup(splitStateName(name).first);
  }

  /// `pcc.param "<name>" shard(#pcc.shard<dp, flat>) of <whole>`, with
  /// tensor parallelism `of <global> within(<split>)` (`whole` is then the
  /// rank's tensor-parallel piece).
  Value param(OpBuilder &b, Location loc, StringRef name,
              RankedTensorType whole) const {
    SmallVector<int64_t> global(whole.getShape());
    ShardingAttr split = splitOf(name);
    if (split)
      global[split.getDim()] *= splitRanks;
    return ParamOp::create(b, loc, pieceType(whole), b.getStringAttr(name),
                           ShardingAttr::flat(ctx, kDataParallelAxis),
                           b.getDenseI64ArrayAttr(global), split);
  }

  /// `pcc.param "<name>"` of the rank's tensor-parallel piece (or whole).
  Value local(OpBuilder &b, Location loc, StringRef name,
              RankedTensorType type) const {
    return ParamOp::create(b, loc, type, b.getStringAttr(name), splitOf(name));
  }

  /// A whole tensor as [ranks, s]: flattened, padded with zeros.
  Value stack(OpBuilder &b, Location loc, Value whole) const {
    auto type = cast<RankedTensorType>(whole.getType());
    Type element = type.getElementType();
    int64_t n = elements(type), s = piece(type);
    Value flat =
        ReshapeOp::create(b, loc, RankedTensorType::get({n}, element), whole);
    if (n != ranks * s)
      flat = PadOp::create(b, loc, RankedTensorType::get({ranks * s}, element),
                           flat, b.getDenseI64ArrayAttr({0}),
                           b.getDenseI64ArrayAttr({1}));
    return ReshapeOp::create(b, loc, RankedTensorType::get({ranks, s}, element),
                             flat);
  }

  /// The global norm's sum of squares from its two kinds of terms: those
  /// of tensor-parallel pieces (`split`, distinct on every tp rank) summed
  /// over tp, added to the rest (`whole`, the same on every tp rank).
  /// Either may be null; zero when both are.
  Value combineNormTerms(OpBuilder &b, Location loc, Value split,
                         Value whole) const {
    auto scalar = RankedTensorType::get({}, Float32Type::get(ctx));
    if (split) {
      split = AllReduceOp::create(
          b, loc, scalar, split,
          b.getStringAttr(splits.begin()->second.getAxis()));
      whole = whole ? AddOp::create(b, loc, whole, split).getResult() : split;
    }
    if (!whole)
      whole = ConstantOp::create(b, loc, getSplatAttr(scalar, 0.0));
    return whole;
  }

  /// This rank's piece of the sum over the ranks of a whole tensor,
  /// started (the stacked input, which must outlive it, and the result).
  std::pair<Value, Value> reduceScatterStart(OpBuilder &b, Location loc,
                                             Value whole) const {
    auto type = cast<RankedTensorType>(whole.getType());
    Value stacked = stack(b, loc, whole);
    Value piece = ReduceScatterStartOp::create(
        b, loc, pieceType(type), stacked, b.getStringAttr(kDataParallelAxis));
    return {stacked, piece};
  }

  /// This rank's piece of a whole tensor (no communication).
  Value slice(OpBuilder &b, Location loc, Value whole) const {
    auto type = cast<RankedTensorType>(whole.getType());
    Value stacked = stack(b, loc, whole);
    Value row = ShardSliceOp::create(
        b, loc, RankedTensorType::get({1, piece(type)}, type.getElementType()),
        stacked, b.getStringAttr(kDataParallelAxis), b.getI64IntegerAttr(0),
        b.getI64IntegerAttr(1));
    return ReshapeOp::create(b, loc, pieceType(type), row);
  }

  /// This rank's piece of the sum over the ranks of a whole tensor.
  Value reduceScatter(OpBuilder &b, Location loc, Value whole) const {
    auto type = cast<RankedTensorType>(whole.getType());
    return ReduceScatterOp::create(b, loc, pieceType(type),
                                   stack(b, loc, whole),
                                   b.getStringAttr(kDataParallelAxis));
  }

  /// The whole tensor of `type` from every rank's piece.
  Value allGather(OpBuilder &b, Location loc, Value piece,
                  RankedTensorType type) const {
    Type element = type.getElementType();
    int64_t n = elements(type), s = this->piece(type);
    Value stacked =
        AllGatherOp::create(b, loc, RankedTensorType::get({ranks, s}, element),
                            piece, b.getStringAttr(kDataParallelAxis));
    Value flat = ReshapeOp::create(
        b, loc, RankedTensorType::get({ranks * s}, element), stacked);
    if (n != ranks * s)
      flat = SliceOp::create(b, loc, RankedTensorType::get({n}, element), flat,
                             b.getDenseI64ArrayAttr({0}),
                             b.getDenseI64ArrayAttr({n}),
                             b.getDenseI64ArrayAttr({1}));
    return ReshapeOp::create(b, loc, type, flat);
  }
};

/// ZeRO 2 and 3: each gradient of `grads` that `phase` accumulates is
/// reduce-scattered there into this rank's piece of its state. With
/// `bucketBytes` (-1: chosen from the gradients' size, see bucketTarget),
/// the gradients are grouped in buckets in the order the phase completes
/// them: a bucket's reduce-scatters start once its last gradient is done,
/// and complete (then accumulate) where the next bucket starts, or at the
/// end of the phase, so each bucket's traffic overlaps the next one's
/// compute. With `reduceType` (bf16; --grad-reduce) each gradient is
/// reduce-scattered in that type and widened after (blocking ones only).
void scatterGradientAccumulations(func::FuncOp phase, const FlatShards &flat,
                                  const llvm::StringSet<> &grads,
                                  int64_t bucketBytes = 0,
                                  Type reduceType = {});

/// --grad-reduce: `g` cast to `reduceType` for its sum over dp (as it is
/// when `reduceType` is null or its type), and a sum widened back to f32.
Value narrowGradient(OpBuilder &b, Location loc, Value g, Type reduceType);
Value widenGradient(OpBuilder &b, Location loc, Value sum);

/// ZeRO 3's prefetch: each blocking all-gather over dp of a weight's piece
/// (read by a pcc.param) in `phase`'s body becomes a started one, begun
/// `depth` gathers earlier in program order: right after the wait of the
/// gather `depth` places before it (the first `depth` at the top of the
/// phase), completed where the blocking one was. So each gather overlaps
/// the compute between the uses of the `depth` weights before it, at the
/// cost of keeping up to `depth` more gathered weights alive. The phase
/// must not write the weights (forward, backward and weight-gradient
/// phases).
void prefetchGathers(func::FuncOp phase, int64_t depth);

/// The bytes a gradient bucket holds: `bucketBytes` if positive, else a
/// quarter of `total` (so that about three buckets' traffic can overlap
/// the backward pass) within [64 KiB, 25 MiB] (PyTorch DDP's size).
int64_t bucketTarget(int64_t bucketBytes, int64_t total);

/// ZeRO 2 and 3: `phase`'s zeroing of each gradient of `grads`, on its piece.
void shardGradientZeros(func::FuncOp phase, const FlatShards &flat,
                        const llvm::StringSet<> &grads);

} // namespace mlir::pcc

#endif // PCC_TRANSFORMS_FLATSHARDS_H
