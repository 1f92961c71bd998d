//===- MergeWeightGradients.cpp - W back into B where it runs right after --===//
//
// See Passes.td (pcc-merge-weight-gradients).
//
//===----------------------------------------------------------------------===//

#include "pcc/Analysis/PipelineStages.h"
#include "pcc/Dialect/Pcc/IR/Contracts.h"
#include "pcc/Dialect/Pcc/IR/PccDialect.h"
#include "pcc/Dialect/Pcc/IR/PccInterfaces.h"
#include "pcc/Transforms/Passes.h"

#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/StringMap.h"

namespace mlir::pcc {
#define GEN_PASS_DEF_MERGEWEIGHTGRADIENTS
#include "pcc/Transforms/Passes.h.inc"
} // namespace mlir::pcc

using namespace mlir;
using namespace mlir::pcc;

namespace {

StringRef argName(func::FuncOp f, unsigned i) {
  auto name = f.getArgAttrOfType<StringAttr>(i, "pcc.name");
  return name ? name.getValue() : StringRef();
}

StringRef resultName(func::FuncOp f, unsigned i) {
  auto name = f.getResultAttrOfType<StringAttr>(i, "pcc.name");
  return name ? name.getValue() : StringRef();
}

/// Moves `w`'s ops into `b`, each as early as its operands and W's order
/// allow, and drops the values B returned for W.
LogicalResult merge(func::FuncOp b, func::FuncOp w) {
  Block &bBody = b.getBody().front();
  Block &wBody = w.getBody().front();
  auto bRet = cast<func::ReturnOp>(bBody.getTerminator());
  // B's ops that only compute values for W sit where a pass left them,
  // often just before the return (a collective the partition put before
  // its one user): each goes right after its operands, so that W's ops
  // reading it can too.
  {
    SmallVector<Operation *> forW;
    for (Operation &op : bBody.without_terminator())
      if (op.getNumResults() && !op.getNumRegions() &&
          (isPure(&op) || isa<CollectiveOpInterface>(op)) &&
          llvm::all_of(op.getUsers(),
                       [&](Operation *user) { return user == bRet; }))
        forW.push_back(&op);
    for (Operation *op : forW) {
      Operation *after = nullptr;
      for (Value v : op->getOperands()) {
        Operation *def = v.getDefiningOp();
        if (def && def->getBlock() == &bBody &&
            (!after || after->isBeforeInBlock(def)))
          after = def;
      }
      if (after)
        op->moveAfter(after);
      else
        op->moveBefore(&bBody, bBody.begin());
    }
  }
  // What each of W's arguments is in B.
  llvm::StringMap<Value> bArgs, stash;
  for (unsigned i = 0; i < b.getNumArguments(); ++i)
    bArgs[argName(b, i)] = b.getArgument(i);
  for (unsigned j = 0; j < b.getNumResults(); ++j)
    if (resultName(b, j).starts_with("stash"))
      stash[resultName(b, j)] = bRet.getOperand(j);
  for (unsigned i = 0; i < w.getNumArguments(); ++i) {
    StringRef name = argName(w, i);
    if (name.empty())
      return w.emitError("merge weight gradients: input ")
             << i << " of " << w.getSymName() << " has no pcc.name";
    auto it = stash.find(name);
    Value v = it != stash.end() ? it->second : bArgs.lookup(name);
    if (!v)
      return w.emitError("merge weight gradients: input '")
             << name << "' of " << w.getSymName() << " is not in "
             << b.getSymName();
    w.getArgument(i).replaceAllUsesWith(v);
  }
  // B's ops in order; a value's anchor is the B op after which it exists
  // (a block argument's: none, -1).
  SmallVector<Operation *> bOps;
  DenseMap<Operation *, int64_t> anchors;
  for (Operation &op : bBody.without_terminator()) {
    anchors[&op] = bOps.size();
    bOps.push_back(&op);
  }
  auto anchorOf = [&](Value v) -> int64_t {
    Operation *def = v.getDefiningOp();
    auto it = def ? anchors.find(def) : anchors.end();
    return it == anchors.end() ? -1 : it->second;
  };
  // W's ops keep their order (accumulations, bucket starts and
  // collectives are side effects), each right after the last B op that
  // defines one of its operands: a weight's gradient as soon as B has
  // its inputs, which then die there rather than at B's end.
  Operation *cursor = nullptr; // the last W op moved
  int64_t cursorAnchor = -1;
  SmallVector<Operation *> ops;
  for (Operation &op : wBody.without_terminator())
    ops.push_back(&op);
  for (Operation *op : ops) {
    int64_t anchor = cursorAnchor;
    op->walk([&](Operation *inner) {
      for (Value v : inner->getOperands())
        anchor = std::max(anchor, anchorOf(v));
    });
    if (anchor > cursorAnchor)
      op->moveAfter(bOps[anchor]);
    else if (cursor)
      op->moveAfter(cursor);
    else
      op->moveBefore(&bBody, bBody.begin());
    cursor = op;
    cursorAnchor = anchor;
    anchors[op] = anchor;
  }
  // B no longer returns W's values; W is empty.
  SmallVector<Value> kept;
  SmallVector<DictionaryAttr> keptAttrs;
  for (unsigned j = 0; j < b.getNumResults(); ++j) {
    if (resultName(b, j).starts_with("stash"))
      continue;
    kept.push_back(bRet.getOperand(j));
    keptAttrs.push_back(b.getResultAttrDict(j));
  }
  bRet->setOperands(kept);
  SmallVector<Type> types;
  for (Value v : kept)
    types.push_back(v.getType());
  b.setType(FunctionType::get(b.getContext(), b.getArgumentTypes(), types));
  b.setAllResultAttrs(keptAttrs);
  BitVector all(w.getNumArguments(), true);
  if (failed(w.eraseArguments(all)))
    return failure();
  return success();
}

struct MergeWeightGradientsPass
    : public mlir::pcc::impl::MergeWeightGradientsBase<
          MergeWeightGradientsPass> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    // Only where every W runs right after its B: not zb-h1.
    auto main = module.lookupSymbol<func::FuncOp>("main");
    auto schedule =
        main ? main->getAttrOfType<DictionaryAttr>(kScheduleAttrName)
             : DictionaryAttr();
    auto policy = schedule ? schedule.getAs<StringAttr>("policy") : nullptr;
    if (!policy || policy.getValue() == "zb-h1")
      return;
    for (auto &phases : getPipelineStagePhases(module)) {
      if (!phases[1] || !phases[2])
        continue;
      if (failed(merge(phases[1], phases[2])))
        return signalPassFailure();
    }
  }
};

} // namespace
