//===- FuseElementwise.cpp - elementwise chains into pcc.fusion
//------------===//

#include "pcc/Dialect/Pcc/IR/PccDialect.h"
#include "pcc/Transforms/Passes.h"

#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/SetVector.h"

#include <memory>

namespace mlir::pcc {
#define GEN_PASS_DEF_FUSEELEMENTWISE
#include "pcc/Transforms/Passes.h.inc"
} // namespace mlir::pcc

using namespace mlir;
using namespace mlir::pcc;

namespace {

ArrayRef<int64_t> shapeOf(Value v) {
  return cast<RankedTensorType>(v.getType()).getShape();
}

/// A cast between float types (mixed precision's casts): elementwise work
/// a fused loop does on the value it holds in f32.
bool isFloatCast(Operation *op) {
  auto cast = dyn_cast<CastOp>(op);
  return cast && isa<FloatType>(cast.getInput().getType().getElementType()) &&
         isa<FloatType>(cast.getType().getElementType());
}

/// Ops a fusion can start from or absorb as elementwise work.
bool isFusibleElementwise(Operation *op) {
  return ((op->hasTrait<OpTrait::Elementwise>() &&
           isa<PccDialect>(op->getDialect())) ||
          isFloatCast(op)) &&
         op->getNumResults() == 1;
}

bool isSplatConstant(Operation *op) {
  auto cst = dyn_cast<ConstantOp>(op);
  return cst && isa<SplatElementsAttr>(cst.getValue());
}

/// Whether `producer` can join a group computing `shape`.
bool canAbsorb(Operation *producer, ArrayRef<int64_t> shape) {
  if (producer->getNumResults() != 1 ||
      shapeOf(producer->getResult(0)) != shape)
    return false;
  return isFusibleElementwise(producer) || isa<BroadcastOp>(producer) ||
         isSplatConstant(producer);
}

struct FuseElementwisePass
    : pcc::impl::FuseElementwiseBase<FuseElementwisePass> {
  void runOnOperation() override {
    func::FuncOp func = getOperation();
    SmallVector<Operation *> candidates;
    func.walk([&](Operation *op) {
      if (isFusibleElementwise(op) && !op->getParentOfType<FusionOp>())
        candidates.push_back(op);
    });
    llvm::SmallPtrSet<Operation *, 32> done;
    // A group computes at its root: a producer that reads loaded state
    // joins only when no store to that state lies between the load and the
    // root (the fusion would read the stored value).
    llvm::DenseMap<Block *, std::unique_ptr<StateStores>> stores;
    auto readsStoredState = [&](Operation *producer, Operation *root) {
      std::unique_ptr<StateStores> &block = stores[root->getBlock()];
      if (!block)
        block = std::make_unique<StateStores>(*root->getBlock());
      return llvm::any_of(producer->getOperands(), [&](Value v) {
        auto load = v.getDefiningOp<ParamOp>();
        return load && load->getBlock() == root->getBlock() &&
               block->storeBetween(load.getName(), load, root);
      });
    };
    for (Operation *root : llvm::reverse(candidates)) {
      if (done.contains(root))
        continue;
      ArrayRef<int64_t> shape = shapeOf(root->getResult(0));
      llvm::SetVector<Operation *> group;
      group.insert(root);
      SmallVector<Operation *> worklist{root};
      while (!worklist.empty()) {
        Operation *current = worklist.pop_back_val();
        for (Value operand : current->getOperands()) {
          Operation *producer = operand.getDefiningOp();
          if (!producer || group.contains(producer) ||
              producer->getBlock() != root->getBlock() ||
              !canAbsorb(producer, shape) || readsStoredState(producer, root))
            continue;
          // Broadcasts and splat constants cost nothing to recompute, so a
          // group takes its own copy even when they have other users. Other
          // producers join only when the group consumes all of their
          // results: anything else would be materialised anyway.
          bool free = isa<BroadcastOp>(producer) || isSplatConstant(producer);
          if (!free && llvm::any_of(producer->getUsers(), [&](Operation *user) {
                return !group.contains(user);
              }))
            continue;
          group.insert(producer);
          worklist.push_back(producer);
        }
      }
      for (Operation *op : group)
        done.insert(op);
      // A shared broadcast or constant stays a candidate for other groups.
      int64_t work = llvm::count_if(group, isFusibleElementwise);
      if (group.size() < 2 ||
          (work < 2 && !llvm::any_of(group, [](Operation *op) {
             return isa<BroadcastOp>(op) || isSplatConstant(op);
           })))
        continue;
      buildFusion(root, group);
    }
  }

  /// Replaces the ops of `group` (rooted at `root`, whose result is the
  /// group's only value used outside it) with one pcc.fusion.
  void buildFusion(Operation *root, const llvm::SetVector<Operation *> &group) {
    // Ops in program order.
    SmallVector<Operation *> ops(group.begin(), group.end());
    llvm::sort(
        ops, [](Operation *a, Operation *b) { return a->isBeforeInBlock(b); });
    llvm::SetVector<Value> inputs;
    for (Operation *op : ops)
      for (Value operand : op->getOperands())
        if (!group.contains(operand.getDefiningOp()))
          inputs.insert(operand);

    OpBuilder builder(root);
    Location loc = root->getLoc();
    auto fusion = FusionOp::create(builder, loc, root->getResultTypes(),
                                   inputs.getArrayRef());
    Block *body = new Block();
    fusion.getBody().push_back(body);
    IRMapping mapping;
    for (Value input : inputs)
      mapping.map(input, body->addArgument(input.getType(), input.getLoc()));
    OpBuilder inner = OpBuilder::atBlockEnd(body);
    for (Operation *op : ops)
      inner.clone(*op, mapping);
    YieldOp::create(inner, loc, mapping.lookup(root->getResult(0)));
    root->getResult(0).replaceAllUsesWith(fusion.getResult(0));
    // Ops the group cloned but others still read (shared broadcasts and
    // constants) stay.
    for (Operation *op : llvm::reverse(ops))
      if (op->use_empty())
        op->erase();
  }
};
} // namespace
