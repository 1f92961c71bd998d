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

/// The micro-batch piece of `v` along `dim` (of m equal pieces), rebuilt
/// from its constants' pieces, when `v` is computed by elementwise ops and
/// broadcasts from constants whose pieces are all the same: then every
/// micro-batch's slice is the same too. The exporters' causal masks at
/// long sequences are such values (aranges repeated over the batch,
/// compared and selected, too large to fold while importing).
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

/// `blocker` is set to the op whose pieces could not be shown equal.
FailureOr<Value> uniformPiece(Value v, int64_t dim, int64_t m, OpBuilder &b,
                              IRMapping &done, int depth, Operation *&blocker) {
  if (Value known = done.lookupOrNull(v))
    return known;
  auto type = dyn_cast<RankedTensorType>(v.getType());
  Operation *def = v.getDefiningOp();
  blocker = def;
  if (!type || !def || depth > 64 || type.getRank() <= dim ||
      type.getDimSize(dim) % m != 0)
    return failure();
  SmallVector<int64_t> shape(type.getShape());
  shape[dim] /= m;
  auto pieceType = RankedTensorType::get(shape, type.getElementType());
  Value out;
  if (auto cst = dyn_cast<ConstantOp>(def)) {
    auto dense = dyn_cast<DenseElementsAttr>(cst.getValue());
    if (!dense)
      return failure();
    if (dense.isSplat()) {
      out = ConstantOp::create(b, cst.getLoc(), dense.resizeSplat(pieceType))
                .getResult();
    } else {
      DenseElementsAttr piece = pieceOf(dense, dim, 1, m, 0);
      for (int64_t r = 1; r < m; ++r)
        if (pieceOf(dense, dim, 1, m, r) != piece)
          return failure();
      out = ConstantOp::create(b, cst.getLoc(), piece).getResult();
    }
  } else if (auto gather = dyn_cast<GatherOp>(def);
             gather && splatOf(gather.getData()) &&
             computedFromConstants(gather.getIndices(), 0)) {
    // Every element of a splat table is the same whichever rows the
    // indices pick (the exporters' padding masks, attention_mask[b, kv]
    // of an all-ones mask, past the folding limit at 1,024 x 4,096).
    out = ConstantOp::create(b, gather.getLoc(),
                             splatOf(gather.getData()).resizeSplat(pieceType))
              .getResult();
  } else if (auto bc = dyn_cast<BroadcastOp>(def)) {
    auto inType = cast<RankedTensorType>(bc.getInput().getType());
    int64_t inDim = dim - (type.getRank() - inType.getRank());
    Value input = bc.getInput();
    if (inDim >= 0 && inType.getDimSize(inDim) != 1) {
      FailureOr<Value> piece =
          uniformPiece(input, inDim, m, b, done, depth + 1, blocker);
      if (failed(piece))
        return failure();
      input = *piece;
    }
    out = BroadcastOp::create(b, bc.getLoc(), pieceType, input).getResult();
  } else if (def->hasTrait<OpTrait::Elementwise>() &&
             def->getNumResults() == 1 && def->getNumRegions() == 0 &&
             isPure(def)) {
    IRMapping operands;
    for (Value operand : def->getOperands()) {
      auto t = dyn_cast<RankedTensorType>(operand.getType());
      if (!t || t.getShape() != type.getShape())
        return failure();
      FailureOr<Value> piece =
          uniformPiece(operand, dim, m, b, done, depth + 1, blocker);
      if (failed(piece))
        return failure();
      operands.map(operand, *piece);
    }
    Operation *copy = b.clone(*def, operands);
    copy->getResult(0).setType(pieceType);
    out = copy->getResult(0);
  } else {
    return failure();
  }
  done.map(v, out);
  return out;
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
      DenseElementsAttr whole;
      if (auto cst = slice.getInput().getDefiningOp<ConstantOp>())
        whole = dyn_cast<DenseElementsAttr>(cst.getValue());
      int64_t dim = slice.getDim(), stripes = slice.getStripes();
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
      Operation *blocker = nullptr;
      if (stripes == 1) {
        OpBuilder b(slice);
        IRMapping done;
        FailureOr<Value> piece =
            uniformPiece(slice.getInput(), dim, m, b, done, 0, blocker);
        if (succeeded(piece) && piece->getType() == slice.getType()) {
          Value whole = slice.getInput();
          slice.replaceAllUsesWith(*piece);
          slice.erase();
          // The whole-batch ops the piece replaced, where nothing else
          // reads them (constants go below).
          SmallVector<Operation *> work;
          if (Operation *def = whole.getDefiningOp())
            work.push_back(def);
          while (!work.empty()) {
            Operation *op = work.pop_back_val();
            if (!op->use_empty() || !isPure(op) || isa<ConstantOp>(op))
              continue;
            for (Value operand : op->getOperands())
              if (Operation *def = operand.getDefiningOp())
                work.push_back(def);
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
