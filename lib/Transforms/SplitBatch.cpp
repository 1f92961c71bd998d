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

struct SplitBatchPass
    : public mlir::pcc::impl::SplitBatchBase<SplitBatchPass> {
  using SplitBatchBase::SplitBatchBase;

  void runOnOperation() override {
    func::FuncOp func = getOperation();
    int64_t m = microbatches;
    if (m <= 1)
      return;
    // Every input carries the batch in dimension 0, one batch for all.
    int64_t batch = -1;
    std::string first;
    for (BlockArgument arg : func.getArguments()) {
      auto type = cast<RankedTensorType>(arg.getType());
      std::string name = nameOf(func, arg.getArgNumber(), false);
      if (type.getRank() == 0) {
        func.emitError() << "graph input '" << name
                         << "' is a scalar; micro-batches split dimension 0 "
                            "(the batch) of every input";
        return signalPassFailure();
      }
      if (batch < 0) {
        batch = type.getDimSize(0);
        first = name;
      } else if (type.getDimSize(0) != batch) {
        func.emitError() << "graph input '" << name << "' has "
                         << type.getDimSize(0)
                         << " rows in dimension 0, but input '" << first
                         << "' has " << batch
                         << "; micro-batches split one batch shared by "
                            "every input";
        return signalPassFailure();
      }
    }
    if (batch < 0) {
      func.emitError() << "the model has no inputs to split into micro-batches";
      return signalPassFailure();
    }
    if (batch % m != 0) {
      func.emitError() << "batch " << batch << " (dimension 0 of input '"
                       << first << "') does not divide into " << m
                       << " micro-batches";
      return signalPassFailure();
    }

    SmallVector<Shard> inputs(func.getNumArguments(), Shard::split(0, 1));
    ShardingPlan plan =
        propagateShardings(func, "microbatch", m, {}, CostModel(), inputs);

    // Rows must never meet.
    for (const PlannedCollective &c : plan.collectives) {
      if (!c.consumer)
        continue;
      c.consumer->emitError()
          << "cannot split the batch into micro-batches here: this op "
             "combines rows of different batch entries (it needs the whole "
          << c.value.getType() << " that is split by rows, "
          << c.from.describe() << ")";
      return signalPassFailure();
    }
    // Every output comes out split by rows, in order.
    auto ret = cast<func::ReturnOp>(func.getBody().front().getTerminator());
    for (auto [i, v] : llvm::enumerate(ret.getOperands())) {
      Shard s = plan.shards.lookup(v);
      if (s == Shard::split(0, 1))
        continue;
      auto diag = func.emitError()
                  << "graph output '" << nameOf(func, i, true)
                  << "' cannot be split into " << m << " micro-batches: ";
      if (s.isSplit() && s.dim != 0)
        diag << "it holds the batch in dimension " << s.dim
             << " (pcc-run puts micro-batches back together along "
                "dimension 0)";
      else if (s.isSplit())
        diag << "its rows of one micro-batch are not contiguous ("
             << s.describe() << ")";
      else if (s.isPartial())
        diag << "it sums over the batch";
      else
        diag << "it does not depend on the batch row by row";
      return signalPassFailure();
    }

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
      slice.emitError() << "cannot split the batch into micro-batches: this "
                           "value is sliced along the batch, and its slices "
                           "differ between micro-batches";
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
