//===- InterfaceModels.cpp - every pcc op's sharding, cost, collective rules //
//
// The external models behind PccInterfaces.td. Each rule is a function
// overloaded on the op class and chosen at compile time; the generic
// template covers the ops without a rule of their own (Elementwise ops get
// the same-shape rule, the others run whole). registerPccInterfaceModels
// attaches the models to every op of the dialect.
//
//===----------------------------------------------------------------------===//

#include "pcc/Dialect/Pcc/IR/PccInterfaces.h"

#include "llvm/ADT/STLExtras.h"

#include <numeric>
#include <type_traits>

using namespace mlir;
using namespace mlir::pcc;

#include "pcc/Dialect/Pcc/IR/PccInterfaces.cpp.inc"

namespace {

RankedTensorType typeOf(Value v) { return cast<RankedTensorType>(v.getType()); }

using Options = SmallVectorImpl<ShardingOption>;

//===----------------------------------------------------------------------===//
// Sharding options
//===----------------------------------------------------------------------===//

template <typename OpT> constexpr PartialSums partialSumsOf() {
  if constexpr (std::is_same_v<OpT, AddOp> || std::is_same_v<OpT, SubOp>)
    return PartialSums::additive;
  if constexpr (std::is_same_v<OpT, NegOp> || std::is_same_v<OpT, MulOp>)
    return PartialSums::eachOperand;
  if constexpr (std::is_same_v<OpT, DivOp>)
    return PartialSums::firstOperand;
  return PartialSums::none;
}

/// Ops with no rule of their own: Elementwise ops follow their operands'
/// split; RunsWhole ops run on whole tensors.
template <typename OpT>
void genericShardingOptions(OpT op, ArrayRef<Shard> in, int64_t, Options &out) {
  static_assert(OpT::template hasTrait<OpTrait::Elementwise>() ||
                    OpT::template hasTrait<RunsWhole>(),
                "an op without a sharding rule must be Elementwise or "
                "RunsWhole");
  if constexpr (OpT::template hasTrait<OpTrait::Elementwise>())
    sameShapeShardingOptions(op, in, partialSumsOf<OpT>(), out);
}

void shardingOptions(CastOp op, ArrayRef<Shard> in, int64_t, Options &out) {
  sameShapeShardingOptions(op, in, PartialSums::none, out);
}

void shardingOptions(TransposeOp op, ArrayRef<Shard> in, int64_t,
                     Options &out) {
  ArrayRef<int64_t> perm = op.getPermutation();
  if (in[0].isSplit())
    for (size_t j = 0; j < perm.size(); ++j)
      if (perm[j] == in[0].dim)
        out.push_back({{in[0]}, {Shard::split(j, in[0].stripes)}});
  if (in[0].isPartial())
    out.push_back({{in[0]}, {in[0]}});
}

void shardingOptions(ReshapeOp op, ArrayRef<Shard> in, int64_t ranks,
                     Options &out) {
  if (in[0].isSplit())
    if (auto s = reshapeSplit(typeOf(op.getInput()).getShape(),
                              op.getType().getShape(), in[0], ranks))
      out.push_back({{in[0]}, {*s}});
  if (in[0].isPartial())
    out.push_back({{in[0]}, {in[0]}});
}

void shardingOptions(BroadcastOp op, ArrayRef<Shard> in, int64_t,
                     Options &out) {
  ArrayRef<int64_t> inShape = op.getInput().getType().getShape(),
                    outShape = op.getType().getShape();
  int64_t shift = outShape.size() - inShape.size();
  if (in[0].isSplit() && inShape[in[0].dim] == outShape[in[0].dim + shift])
    out.push_back({{in[0]}, {Shard::split(in[0].dim + shift, in[0].stripes)}});
  // A partial sum broadcast is the sum of the broadcast pieces: GPT's
  // positional rows, looked up from a table split by positions, are
  // added to every row of the batch. (Without it, at two rows or more the
  // search split that table by columns, and the residual stream by its
  // hidden dimension at the first block: four more all-gathers a step at
  // tp 4 --sp, each layer's activations saved whole.)
  if (in[0].isPartial())
    out.push_back({{in[0]}, {in[0]}});
}

void shardingOptions(SliceOp op, ArrayRef<Shard> in, int64_t, Options &out) {
  Shard x = in[0];
  if (x.isSplit()) {
    int64_t d = x.dim, size = op.getInput().getType().getDimSize(d);
    int64_t stripe = size / x.stripes;
    int64_t start = op.getStarts()[d], limit = op.getLimits()[d],
            step = op.getSteps()[d];
    if (start == 0 && limit == size && step == 1)
      out.push_back({{x}, {x}});
    else if (step == 1 && start % stripe == 0 && limit % stripe == 0 &&
             limit > start)
      out.push_back({{x}, {Shard::split(d, (limit - start) / stripe)}});
  }
  if (x.isPartial())
    out.push_back({{x}, {x}});
}

/// The inverse of a slice (a slice's gradient): a piece split along the
/// padded dimension lands in whole stripes of the result, so the result is
/// split there with stripes of the piece's stripe size (the fused QKV's
/// gradient: each of q, k and v padded into its third).
void shardingOptions(PadOp op, ArrayRef<Shard> in, int64_t, Options &out) {
  Shard x = in[0];
  if (x.isSplit()) {
    int64_t d = x.dim, size = op.getInput().getType().getDimSize(d),
            whole = op.getType().getDimSize(d);
    int64_t stripe = size / x.stripes;
    int64_t start = op.getStarts()[d], step = op.getSteps()[d];
    if (start == 0 && size == whole && step == 1)
      out.push_back({{x}, {x}});
    else if (step == 1 && start % stripe == 0 && whole % stripe == 0)
      out.push_back({{x}, {Shard::split(d, whole / stripe)}});
  }
  if (x.isPartial())
    out.push_back({{x}, {x}});
}

void shardingOptions(SplitOp op, ArrayRef<Shard> in, int64_t, Options &out) {
  Shard x = in[0];
  unsigned numResults = op->getNumResults();
  int64_t axis = op.getAxis();
  if (x.isSplit() && x.dim != axis)
    out.push_back({{x}, SmallVector<Shard>(numResults, x)});
  if (x.isSplit() && x.dim == axis) {
    int64_t stripe = op.getInput().getType().getDimSize(axis) / x.stripes;
    SmallVector<Shard> results;
    for (int64_t size : op.getSizes())
      if (size % stripe == 0)
        results.push_back(Shard::split(axis, size / stripe));
    if (results.size() == numResults)
      out.push_back({{x}, results});
  }
  if (x.isPartial())
    out.push_back({{x}, SmallVector<Shard>(numResults, x)});
}

void shardingOptions(ConcatOp op, ArrayRef<Shard> in, int64_t, Options &out) {
  int64_t axis = op.getAxis();
  unsigned numOperands = op->getNumOperands();
  for (Shard s : in)
    if (s.isSplit() && s.dim != axis)
      out.push_back({SmallVector<Shard>(numOperands, s), {s}});
  // The inverse of a split (a split's gradient, the fused QKV's): pieces
  // split along the axis in stripes of one size are consecutive stripes
  // of the result, and each rank concatenates its own chunks.
  if (llvm::any_of(in, [&](Shard s) { return s.isSplit() && s.dim == axis; })) {
    int64_t stripe = 0, stripes = 0;
    SmallVector<Shard> reads;
    for (Value input : op.getInputs()) {
      int64_t size = cast<RankedTensorType>(input.getType()).getDimSize(axis);
      if (!stripe)
        stripe = size;
      for (Value other : op.getInputs())
        stripe = std::gcd(
            stripe, cast<RankedTensorType>(other.getType()).getDimSize(axis));
    }
    for (Value input : op.getInputs()) {
      int64_t size = cast<RankedTensorType>(input.getType()).getDimSize(axis);
      reads.push_back(Shard::split(axis, size / stripe));
      stripes += size / stripe;
    }
    // Only when each input is one piece split as it is (whole stripes).
    bool matches = llvm::all_of(llvm::zip(in, reads), [](auto p) {
      Shard have = std::get<0>(p);
      return !have.isSplit() || have == std::get<1>(p);
    });
    if (matches)
      out.push_back({reads, {Shard::split(axis, stripes)}});
  }
  if (llvm::all_of(in, [](Shard s) { return s.isPartial(); }))
    out.push_back({SmallVector<Shard>(in), {Shard::partial()}});
}

/// Softmax-like ops normalise along `axis`: any other split stays local.
template <typename OpT>
void softmaxOptions(OpT op, ArrayRef<Shard> in, Options &out) {
  if (in[0].isSplit() && in[0].dim != static_cast<int64_t>(op.getAxis()))
    out.push_back({{in[0]}, {in[0]}});
}
void shardingOptions(SoftmaxOp op, ArrayRef<Shard> in, int64_t, Options &out) {
  softmaxOptions(op, in, out);
}
void shardingOptions(LogSoftmaxOp op, ArrayRef<Shard> in, int64_t,
                     Options &out) {
  softmaxOptions(op, in, out);
}

void shardingOptions(LayerNormOp op, ArrayRef<Shard> in, int64_t,
                     Options &out) {
  if (in[0].isSplit() && in[0].dim < static_cast<int64_t>(op.getAxis())) {
    SmallVector<Shard> targets(op->getNumOperands(), Shard::replicated());
    targets[0] = in[0];
    out.push_back({targets, {in[0]}});
  }
}

/// Attention splits over the batch (dimension 0) or the heads (dimension
/// 1): q, k and v (and the forward result, its statistics and gradient)
/// split alike, a bias where it has that dimension (a size-1 one is read
/// whole). Query head h reads key head h / (Hq / Hkv), so contiguous
/// pieces of both keep every group on one rank. Any other split (the
/// sequence, the head size) is gathered.
template <typename OpT>
void attentionOptions(OpT op, ArrayRef<Shard> in, Options &out) {
  for (int64_t dim : {0, 1}) {
    bool any = false;
    for (unsigned i = 0; i < op->getNumOperands(); ++i)
      any |= in[i].isSplit() && in[i].dim == dim &&
             typeOf(op->getOperand(i)).getDimSize(dim) > 1;
    if (!any)
      continue;
    Shard split = Shard::split(dim, 1);
    SmallVector<Shard> operands;
    for (unsigned i = 0; i < op->getNumOperands(); ++i) {
      bool whole = op.getBias() && op->getOperand(i) == op.getBias() &&
                   typeOf(op.getBias()).getDimSize(dim) == 1;
      operands.push_back(whole ? Shard::replicated() : split);
    }
    out.push_back({operands, SmallVector<Shard>(op->getNumResults(), split)});
  }
}
void shardingOptions(AttentionOp op, ArrayRef<Shard> in, int64_t,
                     Options &out) {
  attentionOptions(op, in, out);
}
void shardingOptions(AttentionGradOp op, ArrayRef<Shard> in, int64_t,
                     Options &out) {
  attentionOptions(op, in, out);
}

/// The LM head's fused cross-entropy splits over the rows (the hidden
/// states, labels and row statistics alike; the weight's gradient is then
/// a partial sum) or over the vocabulary (the weight's classes: Megatron's
/// vocabulary-parallel cross-entropy). Over the vocabulary the forward's
/// statistics come back whole (partitionLocal combines the ranks'), and
/// the gradient's hidden states are a partial sum.
template <typename OpT>
void linearCrossEntropyOptions(OpT op, ArrayRef<Shard> in, Options &out) {
  unsigned n = op->getNumOperands();
  int64_t vocabDim = op.getTransposeW() ? 0 : 1;
  constexpr bool forward = std::is_same_v<OpT, LinearCrossEntropyOp>;
  bool rows = false;
  for (unsigned i = 0; i < n; ++i)
    rows |= i != 1 && in[i].isSplit() && in[i].dim == 0;
  if (rows) {
    SmallVector<Shard> operands(n, Shard::split(0, 1));
    operands[1] = Shard::replicated();
    if (forward)
      out.push_back({operands, {Shard::split(0, 1), Shard::split(0, 1)}});
    else
      out.push_back({operands, {Shard::split(0, 1), Shard::partial()}});
  }
  if (in[1].isSplit() && in[1].dim == vocabDim && in[1].stripes == 1) {
    SmallVector<Shard> operands(n, Shard::replicated());
    operands[1] = in[1];
    if (forward)
      out.push_back({operands, {Shard::replicated(), Shard::replicated()}});
    else
      out.push_back({operands, {Shard::partial(), in[1]}});
  }
}
void shardingOptions(LinearCrossEntropyOp op, ArrayRef<Shard> in, int64_t,
                     Options &out) {
  linearCrossEntropyOptions(op, in, out);
}
void shardingOptions(LinearCrossEntropyGradOp op, ArrayRef<Shard> in, int64_t,
                     Options &out) {
  linearCrossEntropyOptions(op, in, out);
}

void shardingOptions(GatherOp op, ArrayRef<Shard> in, int64_t, Options &out) {
  int64_t axis = op.getAxis();
  int64_t indexRank = op.getIndices().getType().getRank();
  if (in[1].isSplit())
    out.push_back({{Shard::replicated(), in[1]},
                   {Shard::split(axis + in[1].dim, in[1].stripes)}});
  if (in[0].isSplit() && in[0].dim != axis) {
    int64_t d = in[0].dim < axis ? in[0].dim : in[0].dim - 1 + indexRank;
    out.push_back(
        {{in[0], Shard::replicated()}, {Shard::split(d, in[0].stripes)}});
  }
  // A table split on the gathered axis: each rank looks up the indices in
  // its block and writes zeros for the rest (pcc.shard_gather), leaving a
  // partial sum: Megatron's vocabulary-parallel embedding.
  if (in[0].isSplit() && in[0].dim == axis && in[0].stripes == 1)
    out.push_back({{in[0], Shard::replicated()}, {Shard::partial()}});
}

/// Reductions keep a split of a dimension they do not reduce; a sum over a
/// split dimension leaves partial sums; sums and means are linear.
template <typename OpT>
void reduceOptions(OpT op, ArrayRef<Shard> in, Options &out) {
  ArrayRef<int64_t> axes = op.getAxes();
  bool keep = op.getKeepDims();
  Shard x = in[0];
  if (x.isSplit() && !llvm::is_contained(axes, x.dim)) {
    int64_t d = x.dim;
    if (!keep)
      d -= llvm::count_if(axes, [&](int64_t a) { return a < x.dim; });
    out.push_back({{x}, {Shard::split(d, x.stripes)}});
  }
  constexpr bool isSum = std::is_same_v<OpT, ReduceSumOp>;
  constexpr bool linear = isSum || std::is_same_v<OpT, ReduceMeanOp>;
  if (isSum && x.isSplit() && llvm::is_contained(axes, x.dim))
    out.push_back({{x}, {Shard::partial()}});
  if (linear && x.isPartial())
    out.push_back({{x}, {x}});
}
void shardingOptions(ReduceSumOp op, ArrayRef<Shard> in, int64_t,
                     Options &out) {
  reduceOptions(op, in, out);
}
void shardingOptions(ReduceMeanOp op, ArrayRef<Shard> in, int64_t,
                     Options &out) {
  reduceOptions(op, in, out);
}
void shardingOptions(ReduceMaxOp op, ArrayRef<Shard> in, int64_t,
                     Options &out) {
  reduceOptions(op, in, out);
}
void shardingOptions(ReduceMinOp op, ArrayRef<Shard> in, int64_t,
                     Options &out) {
  reduceOptions(op, in, out);
}
void shardingOptions(ReduceProdOp op, ArrayRef<Shard> in, int64_t,
                     Options &out) {
  reduceOptions(op, in, out);
}

/// Ops that treat the entries of dimension 0 (the batch of images)
/// independently and read their other operands whole: convolution,
/// pooling, inference batch norm. A split of dimension 0 stays local.
template <typename OpT>
void batchOnlyOptions(OpT op, ArrayRef<Shard> in, Options &out) {
  if (!in[0].isSplit() || in[0].dim != 0)
    return;
  SmallVector<Shard> operands(op->getNumOperands(), Shard::replicated());
  operands[0] = in[0];
  out.push_back({operands, {in[0]}});
}
void shardingOptions(ConvOp op, ArrayRef<Shard> in, int64_t, Options &out) {
  batchOnlyOptions(op, in, out);
}
void shardingOptions(MaxPoolOp op, ArrayRef<Shard> in, int64_t, Options &out) {
  batchOnlyOptions(op, in, out);
}
void shardingOptions(AvgPoolOp op, ArrayRef<Shard> in, int64_t, Options &out) {
  batchOnlyOptions(op, in, out);
}
void shardingOptions(BatchNormOp op, ArrayRef<Shard> in, int64_t,
                     Options &out) {
  batchOnlyOptions(op, in, out);
}

/// ArgMax keeps a split of any dimension it does not reduce.
void shardingOptions(ArgMaxOp op, ArrayRef<Shard> in, int64_t, Options &out) {
  Shard x = in[0];
  int64_t axis = op.getAxis();
  if (!x.isSplit() || x.dim == axis)
    return;
  int64_t d = !op.getKeepDims() && x.dim > axis ? x.dim - 1 : x.dim;
  out.push_back({{x}, {Shard::split(d, x.stripes)}});
}

/// The dimensions of a matmul's operands: rows of A, contraction in A and
/// B, columns of B.
struct MatmulDims {
  int64_t mA, kA, kB, nB;
};
MatmulDims matmulDims(MatmulOp op) {
  int64_t ra = op.getLhs().getType().getRank(),
          rb = op.getRhs().getType().getRank();
  return {op.getTransposeA() ? ra - 1 : ra - 2,
          op.getTransposeA() ? ra - 2 : ra - 1,
          op.getTransposeB() ? rb - 1 : rb - 2,
          op.getTransposeB() ? rb - 2 : rb - 1};
}

void shardingOptions(MatmulOp op, ArrayRef<Shard> in, int64_t, Options &out) {
  int64_t rb = op.getRhs().getType().getRank(), r = op.getType().getRank();
  MatmulDims dims = matmulDims(op);
  Shard a = in[0], b = in[1];
  Shard rep = Shard::replicated();
  // Batch dimensions.
  for (int64_t d = 0; d < r - 2; ++d) {
    for (Shard s : {a, b}) {
      if (!s.isSplit() || s.dim != d || (rb == 2 && s == b))
        continue;
      out.push_back({{s, rb == 2 ? rep : s}, {s}});
    }
  }
  if (a.isSplit() && a.dim == dims.mA)
    out.push_back({{a, rep}, {Shard::split(r - 2, a.stripes)}});
  if (b.isSplit() && b.dim == dims.nB)
    out.push_back({{rep, b}, {Shard::split(r - 1, b.stripes)}});
  // A split contraction leaves each rank a partial sum.
  for (Shard s : {a, b}) {
    if (!s.isSplit())
      continue;
    if ((s == a && s.dim == dims.kA) ||
        (s == b && s.dim == dims.kB && !(s == a)))
      out.push_back(
          {{Shard::split(dims.kA, s.stripes), Shard::split(dims.kB, s.stripes)},
           {Shard::partial()}});
  }
  if (a.isPartial())
    out.push_back({{a, rep}, {a}});
  if (b.isPartial())
    out.push_back({{rep, b}, {b}});
}

//===----------------------------------------------------------------------===//
// Local rewrites (pcc-partition) and roles (--explain)
//===----------------------------------------------------------------------===//

template <typename OpT>
SmallVector<Value> partitionLocal(OpT op, OpBuilder &, ArrayRef<Shard>, int64_t,
                                  StringRef) {
  return SmallVector<Value>(op->getResults());
}

/// A lookup in a table split on the gathered axis becomes the
/// vocabulary-parallel lookup (zeros for indices other ranks own).
SmallVector<Value> partitionLocal(GatherOp op, OpBuilder &builder,
                                  ArrayRef<Shard> in, int64_t, StringRef axis) {
  if (!in[0].isSplit() || in[0].dim != static_cast<int64_t>(op.getAxis()))
    return {op.getResult()};
  builder.setInsertionPoint(op);
  auto local = ShardGatherOp::create(
      builder, op.getLoc(), op.getType(), op.getData(), op.getIndices(),
      op.getAxisAttr(), builder.getStringAttr(axis));
  op.erase();
  return {local.getResult()};
}

/// Over a vocabulary split, each rank's fused cross-entropy reads its
/// block of classes (mesh_axis), and the forward's statistics become the
/// whole vocabulary's: the label's logit is a sum over the ranks (one of
/// them has it), and the log-sum-exp that of the ranks' log-sum-exps.
template <typename OpT> bool splitsVocabulary(OpT op, ArrayRef<Shard> in) {
  return in[1].isSplit() && in[1].dim == (op.getTransposeW() ? 0 : 1);
}
SmallVector<Value> partitionLocal(LinearCrossEntropyGradOp op, OpBuilder &,
                                  ArrayRef<Shard> in, int64_t, StringRef axis) {
  if (splitsVocabulary(op, in))
    op.setMeshAxis(axis);
  return SmallVector<Value>(op->getResults());
}
SmallVector<Value> partitionLocal(LinearCrossEntropyOp op, OpBuilder &b,
                                  ArrayRef<Shard> in, int64_t ranks,
                                  StringRef axis) {
  if (!splitsVocabulary(op, in))
    return SmallVector<Value>(op->getResults());
  op.setMeshAxis(axis);
  b.setInsertionPointAfter(op);
  Location loc = op.getLoc();
  auto axisAttr = b.getStringAttr(axis);
  Value target = AllReduceOp::create(b, loc, op.getTarget(), axisAttr);
  RankedTensorType rowType = op.getLse().getType();
  int64_t rows = rowType.getDimSize(0);
  auto stacked = RankedTensorType::get({ranks, rows}, rowType.getElementType());
  Value all = AllGatherOp::create(b, loc, stacked, op.getLse(), axisAttr);
  Value max = ReduceMaxOp::create(b, loc, all, ArrayRef<int64_t>{0},
                                  /*keep_dims=*/false);
  Value shifted =
      SubOp::create(b, loc, all, BroadcastOp::create(b, loc, stacked, max));
  Value sum = ReduceSumOp::create(b, loc, ExpOp::create(b, loc, shifted),
                                  ArrayRef<int64_t>{0}, /*keep_dims=*/false);
  Value lse = AddOp::create(b, loc, max, LogOp::create(b, loc, sum));
  return {lse, target};
}

/// Bounds along a split dimension count local entries.
SmallVector<Value> partitionLocal(SliceOp op, OpBuilder &, ArrayRef<Shard> in,
                                  int64_t ranks, StringRef) {
  if (in[0].isSplit()) {
    SmallVector<int64_t> starts(op.getStarts()), limits(op.getLimits());
    starts[in[0].dim] /= ranks;
    limits[in[0].dim] /= ranks;
    op.setStarts(starts);
    op.setLimits(limits);
  }
  return {op.getResult()};
}

/// The start along a split dimension counts local entries.
SmallVector<Value> partitionLocal(PadOp op, OpBuilder &, ArrayRef<Shard> in,
                                  int64_t ranks, StringRef) {
  if (in[0].isSplit()) {
    SmallVector<int64_t> starts(op.getStarts());
    starts[in[0].dim] /= ranks;
    op.setStarts(starts);
  }
  return {op.getResult()};
}

SmallVector<Value> partitionLocal(SplitOp op, OpBuilder &, ArrayRef<Shard> in,
                                  int64_t ranks, StringRef) {
  if (in[0].isSplit() && in[0].dim == static_cast<int64_t>(op.getAxis())) {
    SmallVector<int64_t> sizes(op.getSizes());
    for (int64_t &size : sizes)
      size /= ranks;
    op.setSizes(sizes);
  }
  return SmallVector<Value>(op->getResults());
}

template <typename OpT> std::string splitRole(OpT, unsigned, Shard) {
  return "";
}

std::string splitRole(MatmulOp op, unsigned operand, Shard shard) {
  if (operand != 1 || !shard.isSplit())
    return "";
  return shard.dim == matmulDims(op).kB ? "rows (contraction)"
                                        : "columns (outputs)";
}

std::string splitRole(AttentionOp, unsigned operand, Shard shard) {
  if (operand != 0 || !shard.isSplit())
    return "";
  return shard.dim == 1 ? "heads" : shard.dim == 0 ? "batch" : "";
}

template <typename OpT>
std::string linearCrossEntropyRole(OpT op, unsigned operand, Shard shard) {
  if (operand != 1 || !shard.isSplit())
    return "";
  return shard.dim == (op.getTransposeW() ? 0 : 1) ? "vocabulary (classes)"
                                                   : "";
}
std::string splitRole(LinearCrossEntropyOp op, unsigned operand, Shard shard) {
  return linearCrossEntropyRole(op, operand, shard);
}
std::string splitRole(LinearCrossEntropyGradOp op, unsigned operand,
                      Shard shard) {
  return linearCrossEntropyRole(op, operand, shard);
}

std::string splitRole(GatherOp op, unsigned operand, Shard shard) {
  if (operand != 0 || !shard.isSplit() ||
      shard.dim != static_cast<int64_t>(op.getAxis()))
    return "";
  return "vocabulary (lookup rows)";
}

//===----------------------------------------------------------------------===//
// Cost
//===----------------------------------------------------------------------===//

template <typename OpT> int64_t flopsOf(OpT) { return 0; }

int64_t flopsOf(MatmulOp op) {
  auto lhs = op.getLhs().getType();
  int64_t k = lhs.getDimSize(lhs.getRank() - (op.getTransposeA() ? 2 : 1));
  return 2 * op.getType().getNumElements() * k;
}

/// Attention's products: q k^T and p v (the gradient: those two again,
/// and the three of dq, dk and dv), over the whole S x L scores (the causal
/// mask's skipped blocks counted, as MFU counts them).
int64_t attentionFlops(RankedTensorType q, RankedTensorType v, int64_t len,
                       int64_t products) {
  return products * q.getNumElements() / q.getDimSize(3) * len *
         (q.getDimSize(3) + v.getDimSize(3));
}
int64_t flopsOf(AttentionOp op) {
  return attentionFlops(op.getQ().getType(), op.getV().getType(),
                        op.getK().getType().getDimSize(2), 2);
}
int64_t flopsOf(AttentionGradOp op) {
  return attentionFlops(op.getQ().getType(), op.getV().getType(),
                        op.getK().getType().getDimSize(2), 5);
}

/// The LM head's product: 2 N D V; the gradient computes it again and
/// then the products of the hidden states' and the weight's gradients,
/// each where something reads it (zb-h1 gives B and W one each).
int64_t flopsOf(LinearCrossEntropyOp op) {
  return 2 * op.getHidden().getType().getNumElements() * op.getVocabSize();
}
int64_t flopsOf(LinearCrossEntropyGradOp op) {
  int64_t products =
      1 + !op.getGradHidden().use_empty() + !op.getGradWeight().use_empty();
  return 2 * products * op.getHidden().getType().getNumElements() *
         op.getVocabSize();
}

/// A convolution with result (or result gradient) `out` and weight `w`:
/// each output element reads C/groups x K1 x ... x Kk inputs. Its two
/// gradients do the same multiply-adds, transposed.
int64_t convFlops(RankedTensorType out, RankedTensorType w) {
  return 2 * out.getNumElements() * (w.getNumElements() / w.getDimSize(0));
}

int64_t flopsOf(ConvOp op) {
  return convFlops(op.getType(), op.getWeight().getType());
}

int64_t flopsOf(ConvGradInputOp op) {
  return convFlops(op.getGrad().getType(), op.getWeight().getType());
}

int64_t flopsOf(ConvGradWeightOp op) {
  return convFlops(op.getGrad().getType(), op.getType());
}

/// Views, weights and constants write nothing at run time.
template <typename OpT> constexpr bool writesNothing() {
  return std::is_same_v<OpT, ReshapeOp> || std::is_same_v<OpT, ParamOp> ||
         std::is_same_v<OpT, ConstantOp>;
}

//===----------------------------------------------------------------------===//
// The models
//===----------------------------------------------------------------------===//

/// Whether `OpT` has a sharding rule of its own (an overload of
/// shardingOptions above).
template <typename OpT, typename = void>
struct HasShardingRule : std::false_type {};
template <typename OpT>
struct HasShardingRule<OpT,
                       std::void_t<decltype(shardingOptions(
                           std::declval<OpT>(), std::declval<ArrayRef<Shard>>(),
                           int64_t(), std::declval<Options &>()))>>
    : std::true_type {};

template <typename OpT>
struct ShardingModel
    : public ShardingOpInterface::ExternalModel<ShardingModel<OpT>, OpT> {
  /// Total for any input: a layout an operand is said to have that does
  /// not fit it (a split of a dimension too small for the ranks, of a
  /// dimension that does not exist, partial integers) is read as whole,
  /// and only options whose every layout fits its value come back.
  void getShardingOptions(Operation *op, ArrayRef<Shard> operands,
                          int64_t ranks, Options &options) const {
    if (ranks < 1 || operands.size() != op->getNumOperands())
      return;
    SmallVector<Shard> in(operands);
    for (auto [v, s] : llvm::zip(op->getOperands(), in))
      if (!layoutFits(s, typeOf(v), ranks))
        s = Shard::replicated();
    SmallVector<ShardingOption> candidates;
    if constexpr (HasShardingRule<OpT>::value)
      shardingOptions(cast<OpT>(op), in, ranks, candidates);
    else
      genericShardingOptions(cast<OpT>(op), in, ranks, candidates);
    auto fitsAll = [&](ValueRange values, ArrayRef<Shard> shards) {
      return values.size() == shards.size() &&
             llvm::all_of(llvm::zip(values, shards), [&](auto p) {
               return layoutFits(std::get<1>(p), typeOf(std::get<0>(p)), ranks);
             });
    };
    for (ShardingOption &o : candidates)
      if (fitsAll(op->getOperands(), o.operands) &&
          fitsAll(op->getResults(), o.results))
        options.push_back(std::move(o));
  }
  SmallVector<Value> partitionLocal(Operation *op, OpBuilder &builder,
                                    ArrayRef<Shard> operands, int64_t ranks,
                                    StringRef axis) const {
    return ::partitionLocal(cast<OpT>(op), builder, operands, ranks, axis);
  }
  std::string getSplitRole(Operation *op, unsigned operand, Shard shard) const {
    return splitRole(cast<OpT>(op), operand, shard);
  }
};

template <typename OpT>
struct CostModelImpl
    : public CostOpInterface::ExternalModel<CostModelImpl<OpT>, OpT> {
  int64_t getFlops(Operation *op) const { return flopsOf(cast<OpT>(op)); }
  int64_t getBytesWritten(Operation *op) const {
    if constexpr (writesNothing<OpT>())
      return 0;
    int64_t bytes = 0;
    for (Value r : op->getResults())
      bytes += getTensorBytes(r.getType());
    return bytes;
  }
};

/// Each collective's kind and the whole tensor it works on: an
/// all-reduce's and a reduce-scatter's input, an all-gather's result.
std::pair<CollectiveKind, Value> collectiveOf(AllReduceOp op) {
  return {CollectiveKind::AllReduce, op.getInput()};
}
std::pair<CollectiveKind, Value> collectiveOf(AllGatherOp op) {
  return {CollectiveKind::AllGather, op.getResult()};
}
std::pair<CollectiveKind, Value> collectiveOf(ReduceScatterOp op) {
  return {CollectiveKind::ReduceScatter, op.getInput()};
}
std::pair<CollectiveKind, Value> collectiveOf(ReduceScatterStartOp op) {
  return {CollectiveKind::ReduceScatter, op.getInput()};
}
std::pair<CollectiveKind, Value> collectiveOf(AllGatherStartOp op) {
  return {CollectiveKind::AllGather, op.getResult()};
}

template <typename OpT>
struct CollectiveModel
    : public CollectiveOpInterface::ExternalModel<CollectiveModel<OpT>, OpT> {
  CollectiveKind getCollectiveKind(Operation *op) const {
    return collectiveOf(cast<OpT>(op)).first;
  }
  int64_t getPayloadBytes(Operation *op) const {
    return getTensorBytes(collectiveOf(cast<OpT>(op)).second.getType());
  }
};

/// Every op gets the cost model. The sharding model goes to ops with a
/// rule of their own and to those that say they need none (Elementwise or
/// RunsWhole): a new op with neither has no sharding interface, which
/// InterfacesTest's "every op has rules" reports.
template <typename OpT> void attachModels(MLIRContext *context) {
  OpT::template attachInterface<CostModelImpl<OpT>>(*context);
  if constexpr (HasShardingRule<OpT>::value ||
                OpT::template hasTrait<OpTrait::Elementwise>() ||
                OpT::template hasTrait<RunsWhole>())
    OpT::template attachInterface<ShardingModel<OpT>>(*context);
}

template <typename... Ops> void attachToAll(MLIRContext *context) {
  (attachModels<Ops>(context), ...);
}

} // namespace

void mlir::pcc::registerPccInterfaceModels(MLIRContext *context) {
  attachToAll<
#define GET_OP_LIST
#include "pcc/Dialect/Pcc/IR/PccOps.cpp.inc"
      >(context);
  AllReduceOp::attachInterface<CollectiveModel<AllReduceOp>>(*context);
  AllGatherOp::attachInterface<CollectiveModel<AllGatherOp>>(*context);
  ReduceScatterOp::attachInterface<CollectiveModel<ReduceScatterOp>>(*context);
  ReduceScatterStartOp::attachInterface<CollectiveModel<ReduceScatterStartOp>>(
      *context);
  AllGatherStartOp::attachInterface<CollectiveModel<AllGatherStartOp>>(
      *context);
}
