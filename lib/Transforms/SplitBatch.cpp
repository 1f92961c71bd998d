//===- SplitBatch.cpp - one micro-batch's program, the batch by analysis -===//
//
// See Passes.td (pcc-split-batch). The batch analysis is the sharding
// propagation with the inputs split along dimension 0 over "ranks" that
// are the micro-batches: rows are independent exactly when no collective
// is needed.
//
//===----------------------------------------------------------------------===//

#include "pcc/Transforms/Passes.h"
#include "pcc/Transforms/Sharding.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/SetVector.h"

#include <map>
#include <vector>

namespace mlir::pcc {
#define GEN_PASS_DEF_SPLITBATCH
#include "pcc/Transforms/Passes.h.inc"
} // namespace mlir::pcc

using namespace mlir;
using namespace mlir::pcc;

namespace {

/// The name the model gives argument or result `i` (`pcc.name`).
std::string nameOf(func::FuncOp func, unsigned i, bool result) {
  auto name = result ? func.getResultAttrOfType<StringAttr>(i, "pcc.name")
                     : func.getArgAttrOfType<StringAttr>(i, "pcc.name");
  return name ? name.str() : (result ? "result " : "input ") + std::to_string(i);
}

/// Piece `r` of `attr` along `dim` viewed as [stripes, n, chunk].
DenseElementsAttr pieceOf(DenseElementsAttr attr, int64_t dim, int64_t stripes,
                          int64_t n, int64_t r) {
  auto type = cast<RankedTensorType>(attr.getType());
  ArrayRef<int64_t> shape = type.getShape();
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < dim; ++d)
    outer *= shape[d];
  for (int64_t d = dim + 1; d < type.getRank(); ++d)
    inner *= shape[d];
  int64_t chunk = shape[dim] / (stripes * n);
  SmallVector<Attribute> all(attr.getValues<Attribute>());
  SmallVector<Attribute> piece;
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t s = 0; s < stripes; ++s)
      for (int64_t c = 0; c < chunk; ++c) {
        int64_t row = (s * n + r) * chunk + c;
        for (int64_t i = 0; i < inner; ++i)
          piece.push_back(all[(o * shape[dim] + row) * inner + i]);
      }
  SmallVector<int64_t> pieceShape(shape);
  pieceShape[dim] = stripes * chunk;
  return DenseElementsAttr::get(
      RankedTensorType::get(pieceShape, type.getElementType()), piece);
}

/// The splat a constant holds, or null.
DenseElementsAttr splatOf(Value v) {
  auto cst = v.getDefiningOp<ConstantOp>();
  auto dense = cst ? dyn_cast<DenseElementsAttr>(cst.getValue()) : nullptr;
  return dense && dense.isSplat() ? dense : nullptr;
}

/// Whether `v` is computed from constants alone by pure ops (no graph
/// input, weight or state reaches it).
bool computedFromConstants(Value v, int depth) {
  Operation *def = v.getDefiningOp();
  if (!def || depth > 64 || !isPure(def) || def->getNumRegions() ||
      isa<ParamOp>(def))
    return false;
  return llvm::all_of(def->getOperands(), [&](Value operand) {
    return computedFromConstants(operand, depth + 1);
  });
}

/// A constant's elements as bytes, one element after another (booleans one
/// byte each; MLIR packs them eight to a byte).
struct ConstantBytes {
  explicit ConstantBytes(DenseElementsAttr attr) : attr(attr) {
    Type element = attr.getElementType();
    if (element.isInteger(1)) {
      owned.reserve(attr.getNumElements());
      for (bool bit : attr.getValues<bool>())
        owned.push_back(bit);
      bytes = owned;
      width = 1;
    } else {
      bytes = attr.getRawData();
      width = (element.getIntOrFloatBitWidth() + 7) / 8;
    }
  }

  /// The elements of the box at `starts` of `sizes`, row-major.
  std::vector<char> box(ArrayRef<int64_t> starts,
                        ArrayRef<int64_t> sizes) const {
    ArrayRef<int64_t> shape = attr.getType().getShape();
    int64_t rank = shape.size();
    std::vector<char> out;
    if (rank == 0) {
      out.assign(bytes.begin(), bytes.begin() + width);
      return out;
    }
    int64_t count = 1;
    for (int64_t s : sizes)
      count *= s;
    out.reserve(count * width);
    if (count == 0)
      return out;
    SmallVector<int64_t> strides(rank, 1);
    for (int64_t d = rank - 2; d >= 0; --d)
      strides[d] = strides[d + 1] * shape[d + 1];
    // An odometer over every dimension but the last, whose run is copied.
    SmallVector<int64_t> at(rank, 0);
    int64_t run = sizes[rank - 1] * width;
    while (true) {
      int64_t offset = 0;
      for (int64_t d = 0; d < rank; ++d)
        offset += (starts[d] + at[d]) * strides[d];
      out.insert(out.end(), bytes.begin() + offset * width,
                 bytes.begin() + offset * width + run);
      int64_t d = rank - 2;
      for (; d >= 0; --d) {
        if (++at[d] < sizes[d])
          break;
        at[d] = 0;
      }
      if (d < 0)
        break;
    }
    return out;
  }

  /// A constant of `type` holding `data` (as `box` returns it).
  DenseElementsAttr toAttr(RankedTensorType type, ArrayRef<char> data) const {
    if (type.getElementType().isInteger(1)) {
      SmallVector<bool> bits(data.begin(), data.end());
      return DenseElementsAttr::get(type, ArrayRef<bool>(bits));
    }
    return DenseElementsAttr::getFromRawBuffer(type, data);
  }

  DenseElementsAttr attr;
  std::vector<char> owned;
  ArrayRef<char> bytes;
  int64_t width = 1;
};

/// Piece 0 of box `starts`/`sizes` of constant `dense` along `dim` of `m`
/// pieces, when every piece's box holds the same elements.
FailureOr<DenseElementsAttr> uniformConstantPiece(DenseElementsAttr dense,
                                                  int64_t dim, int64_t m,
                                                  ArrayRef<int64_t> starts,
                                                  ArrayRef<int64_t> sizes) {
  auto pieceType = RankedTensorType::get(sizes, dense.getElementType());
  if (dense.isSplat())
    return dense.resizeSplat(pieceType);
  ConstantBytes bytes(dense);
  std::vector<char> first = bytes.box(starts, sizes);
  SmallVector<int64_t> at(starts);
  int64_t chunk = dense.getType().getDimSize(dim) / m;
  for (int64_t r = 1; r < m; ++r) {
    at[dim] = starts[dim] + r * chunk;
    if (bytes.box(at, sizes) != first)
      return failure();
  }
  return bytes.toAttr(pieceType, first);
}

/// Builds micro-batch 0's piece of a whole-batch value computed from
/// constants (and weights, broadcast over the batch) when every
/// micro-batch's piece is the same, so that piece 0's program is every
/// micro-batch's. The exporters' causal and padding masks at long
/// sequences are such values: aranges and position ids repeated over the
/// batch, compared, selected and indexed row by row (Hugging Face's
/// `padding_mask[batch_idx, kv_idx]`, a GatherND over ids flattened with
/// the batch), too large to fold while importing.
///
/// A request is a box of the value: per dimension a start and a size, the
/// batch dimension's being micro-batch 0's rows. Slices and concatenations
/// along other dimensions narrow the box instead of building the whole, so
/// the batch index a GatherND stacks beside the position is never needed.
class PieceBuilder {
public:
  PieceBuilder(OpBuilder &b) : b(b) {}

  /// Piece 0 of box `starts`/`sizes` of `v` along `dim` of `m` pieces.
  FailureOr<Value> piece(Value v, int64_t dim, int64_t m,
                         ArrayRef<int64_t> starts, ArrayRef<int64_t> sizes,
                         int depth = 0);

  /// The whole-value request: piece 0 of `v` along `dim`.
  FailureOr<Value> piece(Value v, int64_t dim, int64_t m) {
    auto type = cast<RankedTensorType>(v.getType());
    SmallVector<int64_t> starts(type.getRank(), 0);
    SmallVector<int64_t> sizes(type.getShape());
    sizes[dim] /= m;
    return piece(v, dim, m, starts, sizes);
  }

  /// The op whose pieces could not be shown equal.
  Operation *blocker = nullptr;

private:
  FailureOr<Value> build(Value v, int64_t dim, int64_t m,
                         ArrayRef<int64_t> starts, ArrayRef<int64_t> sizes,
                         RankedTensorType pieceType, int depth);
  /// Box `starts`/`sizes` of `v` (no batch dimension to split).
  Value sliceOf(Value v, ArrayRef<int64_t> starts, ArrayRef<int64_t> sizes);
  /// `table` (rank 1) as rows of `row` elements that are all equal: the
  /// first row.
  FailureOr<Value> equalRows(Value table, int64_t row, int depth);
  FailureOr<Value> linearGather(GatherOp gather, int64_t dim, int64_t m,
                                ArrayRef<int64_t> starts,
                                ArrayRef<int64_t> sizes,
                                RankedTensorType pieceType, int depth);

  OpBuilder &b;
  std::map<std::pair<void *, std::vector<int64_t>>, Value> memo;
};

Value PieceBuilder::sliceOf(Value v, ArrayRef<int64_t> starts,
                            ArrayRef<int64_t> sizes) {
  auto type = cast<RankedTensorType>(v.getType());
  if (llvm::all_of(starts, [](int64_t s) { return s == 0; }) &&
      type.getShape() == sizes)
    return v;
  SmallVector<int64_t> limits, steps(starts.size(), 1);
  for (auto [s, n] : llvm::zip(starts, sizes))
    limits.push_back(s + n);
  return SliceOp::create(
             b, v.getLoc(), RankedTensorType::get(sizes, type.getElementType()),
             v, b.getDenseI64ArrayAttr(starts), b.getDenseI64ArrayAttr(limits),
             b.getDenseI64ArrayAttr(steps))
      .getResult();
}

FailureOr<Value> PieceBuilder::piece(Value v, int64_t dim, int64_t m,
                                     ArrayRef<int64_t> starts,
                                     ArrayRef<int64_t> sizes, int depth) {
  std::vector<int64_t> key{dim, m};
  key.insert(key.end(), starts.begin(), starts.end());
  key.insert(key.end(), sizes.begin(), sizes.end());
  auto memoKey = std::make_pair(v.getAsOpaquePointer(), std::move(key));
  if (auto it = memo.find(memoKey); it != memo.end()) {
    if (!it->second)
      return failure();
    return it->second;
  }
  auto type = dyn_cast<RankedTensorType>(v.getType());
  blocker = v.getDefiningOp();
  if (!type || !blocker || depth > 256 || type.getRank() <= dim ||
      type.getDimSize(dim) % m != 0)
    return failure();
  // The piece of the whole rows, sliced, where it can be built: boxes
  // narrowed at every level (a prefix sum's shifted slices) would build
  // one piece per offset. A narrower box is built only where the whole
  // differs between micro-batches (a GatherND's batch index beside its
  // position).
  FailureOr<Value> out = failure();
  SmallVector<int64_t> wholeSizes(type.getShape());
  wholeSizes[dim] = sizes[dim];
  bool narrowed = wholeSizes != sizes ||
                  llvm::any_of(starts, [](int64_t s) { return s != 0; });
  if (narrowed) {
    SmallVector<int64_t> zeros(type.getRank(), 0);
    FailureOr<Value> whole = piece(v, dim, m, zeros, wholeSizes, depth);
    if (succeeded(whole))
      out = sliceOf(*whole, starts, sizes);
  }
  if (failed(out))
    out = build(v, dim, m, starts, sizes,
                RankedTensorType::get(sizes, type.getElementType()), depth);
  memo[memoKey] = succeeded(out) ? *out : Value();
  return out;
}

FailureOr<Value> PieceBuilder::equalRows(Value table, int64_t row, int depth) {
  auto type = cast<RankedTensorType>(table.getType());
  int64_t rows = type.getNumElements() / row;
  auto rowType = RankedTensorType::get({row}, type.getElementType());
  if (auto cst = table.getDefiningOp<ConstantOp>()) {
    // The table as [rows, row], its first row if every row is it.
    auto dense = dyn_cast<DenseElementsAttr>(cst.getValue());
    if (!dense)
      return failure();
    FailureOr<DenseElementsAttr> first =
        uniformConstantPiece(dense.reshape(RankedTensorType::get(
                                 {rows, row}, type.getElementType())),
                             0, rows, {0, 0}, {1, row});
    if (failed(first))
      return failure();
    return ConstantOp::create(b, cst.getLoc(), first->reshape(rowType))
        .getResult();
  }
  // A reshape of [rows, ...] whose rows after the first are the row.
  auto reshape = table.getDefiningOp<ReshapeOp>();
  if (!reshape)
    return failure();
  auto inType = cast<RankedTensorType>(reshape.getInput().getType());
  if (inType.getRank() < 1 || inType.getDimSize(0) != rows)
    return failure();
  SmallVector<int64_t> starts(inType.getRank(), 0);
  SmallVector<int64_t> sizes(inType.getShape());
  sizes[0] = 1;
  FailureOr<Value> first =
      piece(reshape.getInput(), 0, rows, starts, sizes, depth + 1);
  if (failed(first))
    return failure();
  return ReshapeOp::create(b, reshape.getLoc(), rowType, *first).getResult();
}

/// gather(table, X * row + Y) over a flattened table whose rows of `row`
/// elements are all equal is gather(first row, Y mod row) whatever the
/// row X picks: the importer's GatherND flattens its index tuples so.
FailureOr<Value> PieceBuilder::linearGather(GatherOp gather, int64_t dim,
                                            int64_t m, ArrayRef<int64_t> starts,
                                            ArrayRef<int64_t> sizes,
                                            RankedTensorType pieceType,
                                            int depth) {
  auto dataType = cast<RankedTensorType>(gather.getData().getType());
  auto add = gather.getIndices().getDefiningOp<AddOp>();
  if (gather.getAxis() != 0 || dataType.getRank() != 1 || !add)
    return failure();
  for (auto [scaled, offset] : {std::pair(add.getLhs(), add.getRhs()),
                                std::pair(add.getRhs(), add.getLhs())}) {
    auto mul = scaled.getDefiningOp<MulOp>();
    if (!mul)
      continue;
    DenseElementsAttr stride = splatOf(mul.getRhs());
    if (!stride)
      stride = splatOf(mul.getLhs());
    if (!stride || !isa<IntegerType>(stride.getElementType()))
      continue;
    int64_t row = stride.getSplatValue<APInt>().getSExtValue();
    if (row <= 0 || dataType.getDimSize(0) % row != 0)
      continue;
    FailureOr<Value> first = equalRows(gather.getData(), row, depth);
    if (failed(first))
      return failure();
    FailureOr<Value> column = piece(offset, dim, m, starts, sizes, depth + 1);
    if (failed(column))
      return failure();
    auto columnType = cast<RankedTensorType>(column->getType());
    Value rowSize =
        ConstantOp::create(
            b, gather.getLoc(),
            DenseElementsAttr::get(
                columnType, APInt(columnType.getElementTypeBitWidth(), row)))
            .getResult();
    Value index =
        ModOp::create(b, gather.getLoc(), columnType, *column, rowSize, nullptr)
            .getResult();
    return GatherOp::create(b, gather.getLoc(), pieceType, *first, index,
                            b.getI64IntegerAttr(0))
        .getResult();
  }
  return failure();
}

FailureOr<Value> PieceBuilder::build(Value v, int64_t dim, int64_t m,
                                     ArrayRef<int64_t> starts,
                                     ArrayRef<int64_t> sizes,
                                     RankedTensorType pieceType, int depth) {
  auto type = cast<RankedTensorType>(v.getType());
  ArrayRef<int64_t> shape = type.getShape();
  Operation *def = v.getDefiningOp();
  int64_t rank = type.getRank();
  if (auto cst = dyn_cast<ConstantOp>(def)) {
    auto dense = dyn_cast<DenseElementsAttr>(cst.getValue());
    if (!dense)
      return failure();
    FailureOr<DenseElementsAttr> piece =
        uniformConstantPiece(dense, dim, m, starts, sizes);
    if (failed(piece))
      return failure();
    return ConstantOp::create(b, cst.getLoc(), *piece).getResult();
  }
  if (auto gather = dyn_cast<GatherOp>(def)) {
    // Every element of a splat table is the same whichever rows the
    // indices pick (the exporters' padding masks, attention_mask[b, kv]
    // of an all-ones mask, past the folding limit at 1,024 x 4,096).
    if (DenseElementsAttr splat = splatOf(gather.getData());
        splat && computedFromConstants(gather.getIndices(), 0))
      return ConstantOp::create(b, gather.getLoc(),
                                splat.resizeSplat(pieceType))
          .getResult();
    return linearGather(gather, dim, m, starts, sizes, pieceType, depth);
  }
  if (auto bc = dyn_cast<BroadcastOp>(def)) {
    auto inType = cast<RankedTensorType>(bc.getInput().getType());
    int64_t offset = rank - inType.getRank();
    SmallVector<int64_t> inStarts, inSizes;
    for (int64_t d = 0; d < inType.getRank(); ++d) {
      bool stretched = inType.getDimSize(d) == 1 && shape[d + offset] != 1;
      inStarts.push_back(stretched ? 0 : starts[d + offset]);
      inSizes.push_back(stretched ? 1 : sizes[d + offset]);
    }
    int64_t inDim = dim - offset;
    Value input;
    if (inDim < 0 || inType.getDimSize(inDim) == 1) {
      // The same rows for every micro-batch.
      input = sliceOf(bc.getInput(), inStarts, inSizes);
    } else {
      FailureOr<Value> p =
          piece(bc.getInput(), inDim, m, inStarts, inSizes, depth + 1);
      if (failed(p))
        return failure();
      input = *p;
    }
    return BroadcastOp::create(b, bc.getLoc(), pieceType, input).getResult();
  }
  if (auto slice = dyn_cast<SliceOp>(def)) {
    // A unit-step slice that keeps the batch whole narrows the box.
    auto inType = cast<RankedTensorType>(slice.getInput().getType());
    if (inType.getDimSize(dim) != shape[dim] || slice.getStarts()[dim] != 0 ||
        llvm::any_of(slice.getSteps(), [](int64_t s) { return s != 1; }))
      return failure();
    SmallVector<int64_t> inStarts;
    for (int64_t d = 0; d < rank; ++d)
      inStarts.push_back(slice.getStarts()[d] + starts[d]);
    return piece(slice.getInput(), dim, m, inStarts, sizes, depth + 1);
  }
  if (auto concat = dyn_cast<ConcatOp>(def)) {
    // The operands the box overlaps, each narrowed to its part.
    int64_t axis = concat.getAxis();
    if (axis == dim)
      return failure();
    SmallVector<Value> parts;
    int64_t at = 0, begin = starts[axis], end = starts[axis] + sizes[axis];
    for (Value input : concat.getInputs()) {
      int64_t len = cast<RankedTensorType>(input.getType()).getDimSize(axis);
      int64_t lo = std::max(begin, at), hi = std::min(end, at + len);
      if (lo < hi) {
        SmallVector<int64_t> inStarts(starts), inSizes(sizes);
        inStarts[axis] = lo - at;
        inSizes[axis] = hi - lo;
        FailureOr<Value> p = piece(input, dim, m, inStarts, inSizes, depth + 1);
        if (failed(p))
          return failure();
        parts.push_back(*p);
      }
      at += len;
    }
    if (parts.size() == 1)
      return parts.front();
    return ConcatOp::create(b, concat.getLoc(), pieceType, parts,
                            b.getI64IntegerAttr(axis))
        .getResult();
  }
  if (auto reshape = dyn_cast<ReshapeOp>(def)) {
    // A reshape that only inserts or drops unit dimensions maps the box
    // dimension by dimension.
    auto inType = cast<RankedTensorType>(reshape.getInput().getType());
    SmallVector<int64_t> inStarts(inType.getRank(), 0),
        inSizes(inType.getRank(), 1);
    int64_t inDim = -1, d = 0;
    bool mapped = true;
    for (int64_t i = 0; i < inType.getRank() && mapped; ++i) {
      if (inType.getDimSize(i) == 1)
        continue;
      while (d < rank && shape[d] == 1)
        ++d;
      if (d == rank || shape[d] != inType.getDimSize(i)) {
        mapped = false;
        break;
      }
      inStarts[i] = starts[d];
      inSizes[i] = sizes[d];
      if (d == dim)
        inDim = i;
      ++d;
    }
    while (d < rank && shape[d] == 1)
      ++d;
    if (!mapped || d != rank || inDim < 0)
      return failure();
    FailureOr<Value> p =
        piece(reshape.getInput(), inDim, m, inStarts, inSizes, depth + 1);
    if (failed(p))
      return failure();
    if (p->getType() == pieceType)
      return *p;
    return ReshapeOp::create(b, reshape.getLoc(), pieceType, *p).getResult();
  }
  if ((def->hasTrait<OpTrait::Elementwise>() || isa<CastOp>(def)) &&
      def->getNumResults() == 1 && def->getNumRegions() == 0 && isPure(def)) {
    IRMapping operands;
    for (Value operand : def->getOperands()) {
      auto t = dyn_cast<RankedTensorType>(operand.getType());
      if (!t || t.getShape() != shape)
        return failure();
      FailureOr<Value> p = piece(operand, dim, m, starts, sizes, depth + 1);
      if (failed(p))
        return failure();
      operands.map(operand, *p);
    }
    Operation *copy = b.clone(*def, operands);
    copy->getResult(0).setType(pieceType);
    return copy->getResult(0);
  }
  return failure();
}

struct SplitBatchPass
    : public mlir::pcc::impl::SplitBatchBase<SplitBatchPass> {
  using SplitBatchBase::SplitBatchBase;

  static ShardingPlan propagate(func::FuncOp func, int64_t dim, int64_t m) {
    SmallVector<Shard> inputs(func.getNumArguments(), Shard::split(dim, 1));
    return propagateShardings(func, "microbatch", m, {}, CostModel(), inputs);
  }

  /// Whether every input has a dimension `dim` of one size that m divides.
  static bool inputDimFits(func::FuncOp func, int64_t dim, int64_t m) {
    int64_t size = -1;
    for (BlockArgument arg : func.getArguments()) {
      auto type = cast<RankedTensorType>(arg.getType());
      if (type.getRank() <= dim || (size >= 0 && type.getDimSize(dim) != size))
        return false;
      size = type.getDimSize(dim);
    }
    return size > 0 && size % m == 0;
  }

  /// Whether the rows never meet and every output comes out split by rows
  /// (in one block per micro-batch) along some dimension.
  static bool sound(func::FuncOp func, const ShardingPlan &plan) {
    if (llvm::any_of(plan.collectives,
                     [](const PlannedCollective &c) { return c.consumer; }))
      return false;
    auto ret = cast<func::ReturnOp>(func.getBody().front().getTerminator());
    return llvm::all_of(ret.getOperands(), [&](Value v) {
      Shard s = plan.shards.lookup(v);
      return s.isSplit() && s.stripes == 1;
    });
  }

  /// Errors for inputs that cannot share a batch in dimension 0.
  LogicalResult checkInputs(func::FuncOp func, int64_t m) {
    int64_t batch = -1;
    std::string first;
    for (BlockArgument arg : func.getArguments()) {
      auto type = cast<RankedTensorType>(arg.getType());
      std::string name = nameOf(func, arg.getArgNumber(), false);
      if (type.getRank() == 0)
        return func.emitError()
               << "graph input '" << name
               << "' is a scalar; micro-batches split the batch of every "
                  "input";
      if (batch < 0) {
        batch = type.getDimSize(0);
        first = name;
      } else if (type.getDimSize(0) != batch) {
        return func.emitError()
               << "graph input '" << name << "' has " << type.getDimSize(0)
               << " rows in dimension 0, but input '" << first << "' has "
               << batch
               << "; micro-batches split one batch shared by every input";
      }
    }
    if (batch < 0)
      return func.emitError()
             << "the model has no inputs to split into micro-batches";
    if (batch % m != 0) {
      // What would work: the piece counts that divide the batch.
      std::string would = ranksThatDivide(batch);
      return func.emitError()
             << "batch " << batch << " (dimension 0 of input '" << first
             << "') does not divide into " << m
             << (dataParallel > 1
                     ? " pieces (" + std::to_string(microbatches) +
                           " micro-batch(es) on each of " +
                           std::to_string(dataParallel) +
                           " data-parallel ranks, --dp)"
                     : std::string(" micro-batches"))
             << "; "
             << (would == "none"
                     ? std::string("a batch of ") + std::to_string(batch) +
                           " cannot be split: use --batch (or --dim) to "
                           "compile for a larger one"
                     : std::string(dataParallel > 1
                                       ? "--dp x --microbatches"
                                       : "--microbatches") +
                           " must divide it: " + would + " would (or "
                           "compile for another batch with --batch)");
    }
    return success();
  }

  static std::optional<ShardingPlan> analyze(func::FuncOp func, int64_t dim,
                                             int64_t m) {
    ShardingPlan plan = propagate(func, dim, m);
    if (!sound(func, plan))
      return std::nullopt;
    return plan;
  }

  /// Names the op where rows meet, or the output that is not split by rows.
  static void reportFailure(func::FuncOp func, const ShardingPlan &plan,
                            int64_t m) {
    for (const PlannedCollective &c : plan.collectives) {
      if (!c.consumer)
        continue;
      c.consumer->emitError()
          << "cannot split the batch into micro-batches here: this op "
             "combines rows of different batch entries (it needs the whole "
          << c.value.getType() << " that is split by rows, "
          << c.from.describe() << ")";
      return;
    }
    auto ret = cast<func::ReturnOp>(func.getBody().front().getTerminator());
    for (auto [i, v] : llvm::enumerate(ret.getOperands())) {
      Shard s = plan.shards.lookup(v);
      if (s.isSplit() && s.stripes == 1)
        continue;
      auto diag = func.emitError()
                  << "graph output '" << nameOf(func, i, true)
                  << "' cannot be split into " << m << " micro-batches: ";
      if (s.isSplit())
        diag << "its rows of one micro-batch are not contiguous ("
             << s.describe() << ")";
      else if (s.isPartial())
        diag << "it sums over the batch";
      else
        diag << "it does not depend on the batch row by row";
      return;
    }
  }

  void runOnOperation() override {
    func::FuncOp func = getOperation();
    int64_t m = microbatches * dataParallel;
    if (m <= 1)
      return;
    // The batch is dimension 0 of every input, or dimension 1 of every
    // input (sequence-first layouts: [seq, batch, ...]) when dimension 0's
    // rows meet and dimension 1's do not.
    std::optional<ShardingPlan> found;
    if (inputDimFits(func, 0, m))
      found = analyze(func, 0, m);
    if (!found && inputDimFits(func, 1, m))
      found = analyze(func, 1, m);
    if (!found) {
      // Say why dimension 0 does not hold the batch.
      if (failed(checkInputs(func, m)))
        return signalPassFailure();
      reportFailure(func, propagate(func, 0, m), m);
      return signalPassFailure();
    }
    ShardingPlan plan = std::move(*found);
    // Where the batch lies, for the runtime to cut and reassemble
    // micro-batches (model ABI: input/output batch dimensions).
    OpBuilder b(func.getContext());
    for (BlockArgument arg : func.getArguments())
      func.setArgAttr(arg.getArgNumber(), "pcc.batch_dim",
                      b.getI64IntegerAttr(plan.shards.lookup(arg).dim));
    auto ret = cast<func::ReturnOp>(func.getBody().front().getTerminator());
    for (auto [i, v] : llvm::enumerate(ret.getOperands()))
      func.setResultAttr(i, "pcc.batch_dim",
                         b.getI64IntegerAttr(plan.shards.lookup(v).dim));

    if (failed(partitionFunction(func, plan, /*keepResultLayouts=*/true)))
      return signalPassFailure();

    // Piece 0's program is every micro-batch's only if what it slices is
    // the same in every piece.
    bool bad = false;
    func.walk([&](ShardSliceOp slice) {
      int64_t dim = slice.getDim(), stripes = slice.getStripes();
      Operation *blocker = nullptr;
      if (stripes > 1) {
        // Stripes of a constant (a fused product's columns).
        DenseElementsAttr whole;
        if (auto cst = slice.getInput().getDefiningOp<ConstantOp>())
          whole = dyn_cast<DenseElementsAttr>(cst.getValue());
        if (whole) {
          DenseElementsAttr piece = pieceOf(whole, dim, stripes, m, 0);
          bool same = true;
          for (int64_t r = 1; r < m && same; ++r)
            same = pieceOf(whole, dim, stripes, m, r) == piece;
          if (same) {
            OpBuilder b(slice);
            slice.replaceAllUsesWith(
                ConstantOp::create(b, slice.getLoc(), piece).getResult());
            slice.erase();
            return;
          }
        }
      } else {
        OpBuilder b(slice);
        PieceBuilder pieces(b);
        FailureOr<Value> piece = pieces.piece(slice.getInput(), dim, m);
        blocker = pieces.blocker;
        if (succeeded(piece) && piece->getType() == slice.getType()) {
          Value whole = slice.getInput();
          slice.replaceAllUsesWith(*piece);
          slice.erase();
          // The whole-batch ops the piece replaced, where nothing else
          // reads them (constants go below).
          // (A set: an op read twice by one op is erased once.)
          llvm::SetVector<Operation *> work;
          if (Operation *def = whole.getDefiningOp())
            work.insert(def);
          while (!work.empty()) {
            Operation *op = work.pop_back_val();
            if (!op->use_empty() || !isPure(op) || isa<ConstantOp>(op))
              continue;
            for (Value operand : op->getOperands())
              if (Operation *def = operand.getDefiningOp())
                work.insert(def);
            op->erase();
          }
          return;
        }
      }
      auto diag = slice.emitError()
                  << "cannot split the batch into micro-batches: this "
                     "value is sliced along the batch, and its slices "
                     "differ between micro-batches";
      if (blocker)
        diag << " (or cannot be shown equal through " << blocker->getName()
             << " at " << blocker->getLoc() << ")";
      bad = true;
    });
    func.walk([&](ParamOp param) {
      if (param.getShard()) {
        param.emitError() << "cannot split the batch into micro-batches: "
                             "weight '"
                          << param.getName()
                          << "' would have to be split along the batch";
        bad = true;
      }
    });
    if (bad)
      return signalPassFailure();
    // The whole constants the pieces came from.
    SmallVector<Operation *> dead;
    func.walk([&](ConstantOp c) {
      if (c->use_empty())
        dead.push_back(c);
    });
    for (Operation *op : dead)
      op->erase();
  }
};

} // namespace
