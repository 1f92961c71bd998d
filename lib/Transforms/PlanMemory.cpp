//===- PlanMemory.cpp - static arena layout by liveness
//--------------------===//

#include "pcc/Analysis/Arena.h"
#include "pcc/Dialect/Pcc/IR/Contracts.h"
#include "pcc/Dialect/Pcc/IR/Layout.h"
#include "pcc/Dialect/Pcc/IR/PccDialect.h"
#include "pcc/Transforms/Passes.h"

#include "llvm/ADT/DenseMap.h"

#include <map>

#include "llvm/ADT/DenseSet.h"

namespace mlir::pcc {
#define GEN_PASS_DEF_PLANMEMORY
#include "pcc/Transforms/Passes.h.inc"
} // namespace mlir::pcc

using namespace mlir;
using namespace mlir::pcc;

namespace {

/// Bytes of a tensor; booleans take one byte each.
/// Whether `op`'s results need no arena space of their own.
bool needsNoBuffer(Operation *op) {
  return isa<ParamOp, ConstantOp, ReshapeOp, WaitCollectivesOp>(op);
}

/// Whether `result` is one its op skips when nothing reads it: the fused
/// head's gradients, each computed in its own zb-h1 phase (the kernel
/// takes a null pointer for the other).
bool skippedUnread(Value result) {
  return result.use_empty() &&
         isa<LinearCrossEntropyGradOp>(result.getDefiningOp());
}

/// The value whose buffer `v` lives in (through reshapes, and from a
/// completed collective to the buffer it was started into).
Value storageOf(Value v) {
  while (true) {
    if (auto reshape = v.getDefiningOp<ReshapeOp>()) {
      v = reshape.getInput();
    } else if (auto wait = v.getDefiningOp<WaitCollectivesOp>()) {
      v = wait.getStarted()[cast<OpResult>(v).getResultNumber()];
    } else {
      return v;
    }
  }
}

struct PlanMemoryPass : pcc::impl::PlanMemoryBase<PlanMemoryPass> {
  using PlanMemoryBase::PlanMemoryBase;

  void runOnOperation() override {
    func::FuncOp func = getOperation();
    if (alignment < 1) {
      func.emitError("pcc-plan-memory: alignment must be positive");
      return signalPassFailure();
    }
    if (!func.getBody().hasOneBlock()) {
      func.emitError("pcc-plan-memory: expects a single-block function");
      return signalPassFailure();
    }
    Block &body = func.getBody().front();
    // A pipeline's @main only calls the stages, which have their own plans.
    if (llvm::any_of(body,
                     [](Operation &op) { return isa<func::CallOp>(op); })) {
      func->setAttr(
          kArenaBytesAttrName,
          IntegerAttr::get(IntegerType::get(func.getContext(), 64), 0));
      return;
    }

    // A result the function returns is written straight into the caller's
    // output (the C++ emitter's out[k], at its first place in the return):
    // it takes no arena space (offset -2).
    // So is one returned through reshapes (the C++ emitter computes it in
    // the output the reshape is returned as).
    llvm::DenseSet<Value> returned;
    for (Value v : body.getTerminator()->getOperands()) {
      returned.insert(v);
      while (auto reshape = v.getDefiningOp<ReshapeOp>())
        v = reshape.getInput();
      returned.insert(v);
    }
    // For the CPU alone: the ops its back end computes in their users.
    llvm::DenseSet<Operation *> deferred;
    if (cpu)
      for (Operation &op : body)
        if (getCpuDeferral(&op, [&](Value v) {
              return returned.contains(v);
            }) != CpuDeferral::None)
          deferred.insert(&op);

    // Index of each op and the last use of each buffer (through aliases);
    // a deferred op's operands are read by its user.
    llvm::DenseMap<Operation *, int64_t> index;
    for (auto [i, op] : llvm::enumerate(body))
      index[&op] = static_cast<int64_t>(i);
    llvm::DenseMap<Value, int64_t> lastUse;
    for (Operation &op : body) {
      bool isReturn = op.hasTrait<OpTrait::IsTerminator>();
      int64_t at =
          deferred.contains(&op) ? index[*op.getUsers().begin()] : index[&op];
      for (Value operand : op.getOperands()) {
        Value storage = storageOf(operand);
        int64_t &last = lastUse[storage];
        last = isReturn ? INT64_MAX : std::max(last, at);
      }
    }

    // Each buffer's lifetime, laid out twice: best fit in program order
    // (BestFitArena) and by size with every lifetime known
    // (layOutBySize); the smaller arena is kept.
    BestFitArena arena(alignment);
    std::vector<ArenaInterval> intervals;
    std::vector<int64_t> inOrder;
    std::multimap<int64_t, std::pair<int64_t, int64_t>>
        dying; // at -> (off, bytes)
    Builder b(func.getContext());
    int64_t total = 0;
    // Per op with results: kNoBuffer, kReturnedBuffer, or the index of
    // each buffer in `intervals`.
    SmallVector<std::pair<Operation *, SmallVector<int64_t>>> slots;
    // Places `op`'s results (at position `at`) in the arena.
    auto allocateResults = [&](Operation &op, int64_t at) {
      SmallVector<int64_t> offsets;
      for (Value result : op.getResults()) {
        if (needsNoBuffer(&op) || skippedUnread(result) ||
            deferred.contains(&op)) {
          offsets.push_back(kNoBuffer);
          continue;
        }
        if (returned.contains(result)) {
          offsets.push_back(kReturnedBuffer);
          continue;
        }
        int64_t bytes = getTensorBytes(result.getType());
        total += bytes;
        int64_t offset = arena.allocate(bytes);
        auto last = lastUse.find(result);
        // A result nobody reads dies right after its op.
        int64_t dies = last == lastUse.end() ? at : last->second;
        if (dies != INT64_MAX)
          dying.emplace(dies, std::make_pair(offset, bytes));
        offsets.push_back(static_cast<int64_t>(intervals.size()));
        intervals.push_back({at, dies, bytes});
        inOrder.push_back(offset);
      }
      slots.emplace_back(&op, std::move(offsets));
    };
    for (Operation &op : body) {
      int64_t at = index[&op];
      if (op.getNumResults() != 0 && isa<PccDialect>(op.getDialect()))
        allocateResults(op, at);
      // Buffers whose last use is this op are free for the next ops; an
      // op's own operands stay live until it has written its results. Ops
      // without results count too: a weight gradient's last reader is the
      // pcc.accumulate that adds it into its state, and its buffer is free
      // from there on (released only at result-producing ops, a
      // pipeline's W phase kept every weight gradient of the stage).
      auto [from, to] = dying.equal_range(at);
      for (auto it = from; it != to; ++it)
        arena.release(it->second.first, it->second.second);
      dying.erase(from, to);
    }
    int64_t peak = arena.getPeak(), bySizePeak = 0;
    std::vector<int64_t> bySize =
        layOutBySize(intervals, alignment, bySizePeak);
    const std::vector<int64_t> &chosen = bySizePeak < peak ? bySize : inOrder;
    peak = std::min(peak, bySizePeak);
    for (auto &[op, offsets] : slots) {
      for (int64_t &offset : offsets)
        if (offset >= 0)
          offset = chosen[static_cast<size_t>(offset)];
      op->setAttr(kBufferOffsetsAttrName, b.getDenseI64ArrayAttr(offsets));
    }
    func->setAttr(kArenaBytesAttrName, b.getI64IntegerAttr(peak));
    arenaBytes += peak;
    tensorBytes += total;
    if (emitRemark)
      func.emitRemark() << "arena " << peak << " bytes for " << total
                        << " bytes of intermediate tensors";
    markAllAnalysesPreserved();
  }
};
} // namespace
