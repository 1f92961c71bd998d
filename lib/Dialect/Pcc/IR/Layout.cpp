//===- Layout.cpp - layouts of a tensor over one mesh axis ---------------===//

#include "pcc/Dialect/Pcc/IR/Layout.h"

#include "llvm/ADT/STLExtras.h"

using namespace mlir;
using namespace mlir::pcc;

const char *mlir::pcc::collectiveName(CollectiveKind kind) {
  switch (kind) {
  case CollectiveKind::AllReduce:
    return "all_reduce";
  case CollectiveKind::AllGather:
    return "all_gather";
  case CollectiveKind::ReduceScatter:
    return "reduce_scatter";
  }
  return "?";
}

ShardingAttr Shard::toAttr(MLIRContext *context, StringRef axis) const {
  switch (kind) {
  case ShardKind::replicated:
    return ShardingAttr::replicated(context);
  case ShardKind::partial:
    return ShardingAttr::partial(context, axis);
  case ShardKind::split:
    return ShardingAttr::split(context, axis, dim, stripes);
  case ShardKind::flat:
    return ShardingAttr::flat(context, axis);
  }
  return {};
}

Shard Shard::fromAttr(ShardingAttr attr) {
  if (!attr || attr.isReplicated())
    return replicated();
  if (attr.isPartial())
    return partial();
  return split(attr.getDim(), attr.getStripes());
}

std::string Shard::describe() const {
  if (isReplicated())
    return "replicated";
  if (isPartial())
    return "partial sum";
  std::string s = "dim " + std::to_string(dim);
  if (stripes != 1)
    s += " in " + std::to_string(stripes) + " stripes";
  return s;
}

RankedTensorType mlir::pcc::localType(RankedTensorType type, Shard shard,
                                      int64_t ranks) {
  // Only a layout that fits has pieces (the planners never make another).
  if (!shard.isSplit() || !layoutFits(shard, type, ranks))
    return type;
  SmallVector<int64_t> shape(type.getShape());
  shape[shard.dim] /= ranks;
  return RankedTensorType::get(shape, type.getElementType());
}

bool mlir::pcc::layoutFits(Shard shard, RankedTensorType type, int64_t ranks) {
  if (ranks < 1)
    return false;
  if (shard.isReplicated())
    return true;
  if (shard.isPartial())
    return isa<FloatType>(type.getElementType());
  if (shard.dim < 0 || shard.dim >= type.getRank() || shard.stripes < 1)
    return false;
  int64_t size = type.getDimSize(shard.dim);
  // A zero-size (or dynamic) dimension has no pieces to hand out.
  return size > 0 && size % (shard.stripes * ranks) == 0;
}

std::string mlir::pcc::ranksThatDivide(int64_t size, int64_t limit) {
  SmallVector<int64_t> ranks;
  for (int64_t r = 2; r <= std::min(size, limit); ++r)
    if (size % r == 0)
      ranks.push_back(r);
  if (ranks.empty())
    return "none";
  std::string s;
  for (auto [i, r] : llvm::enumerate(ranks)) {
    if (i)
      s += i + 1 == ranks.size() ? " or " : ", ";
    s += std::to_string(r);
  }
  return s;
}

/// A split seen on the flattened tensor: element f belongs to rank
/// (f / block) mod ranks. Reshapes keep the flat order, so a split survives
/// a reshape exactly when some result dimension can express this block.
/// Total: a split that does not fit the input (or a zero-size tensor on
/// either side) has no image.
std::optional<Shard> mlir::pcc::reshapeSplit(ArrayRef<int64_t> in,
                                             ArrayRef<int64_t> out, Shard s,
                                             int64_t ranks) {
  if (!s.isSplit() || ranks < 1 || s.stripes < 1 || s.dim < 0 ||
      s.dim >= static_cast<int64_t>(in.size()))
    return std::nullopt;
  auto positive = [](int64_t d) { return d > 0; };
  if (!llvm::all_of(in, positive) || !llvm::all_of(out, positive) ||
      in[s.dim] % (s.stripes * ranks) != 0)
    return std::nullopt;
  int64_t inner = 1;
  for (size_t k = s.dim + 1; k < in.size(); ++k)
    inner *= in[k];
  int64_t chunk = in[s.dim] / (s.stripes * ranks);
  int64_t block = inner * chunk;
  int64_t innerOut = 1;
  for (int64_t e = static_cast<int64_t>(out.size()) - 1; e >= 0; --e) {
    if (block % innerOut == 0) {
      int64_t c = block / innerOut;
      if (out[e] % (c * ranks) == 0)
        return Shard::split(e, out[e] / (c * ranks));
    }
    innerOut *= out[e];
    if (innerOut > block)
      break;
  }
  return std::nullopt;
}

void mlir::pcc::sameShapeShardingOptions(
    Operation *op, ArrayRef<Shard> in, PartialSums partial,
    SmallVectorImpl<ShardingOption> &options) {
  unsigned numOperands = op->getNumOperands(), numResults = op->getNumResults();
  SmallVector<Shard> seen;
  for (Shard s : in)
    if (s.isSplit() && !llvm::is_contained(seen, s)) {
      seen.push_back(s);
      options.push_back({SmallVector<Shard>(numOperands, s),
                         SmallVector<Shard>(numResults, s)});
    }
  switch (partial) {
  case PartialSums::none:
    return;
  case PartialSums::additive:
    // p + p stays partial; p + replicated does not.
    if (llvm::all_of(in, [](Shard s) { return s.isPartial(); }))
      options.push_back({SmallVector<Shard>(numOperands, Shard::partial()),
                         SmallVector<Shard>(numResults, Shard::partial())});
    return;
  case PartialSums::eachOperand:
  case PartialSums::firstOperand:
    for (unsigned i = 0; i < numOperands; ++i) {
      if (!in[i].isPartial() ||
          (partial == PartialSums::firstOperand && i != 0))
        continue;
      SmallVector<Shard> targets(numOperands, Shard::replicated());
      targets[i] = Shard::partial();
      options.push_back(
          {targets, SmallVector<Shard>(numResults, Shard::partial())});
    }
    return;
  }
}
