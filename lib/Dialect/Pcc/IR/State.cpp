//===- State.cpp - loads and stores of model state ------------------------===//
//
// A `pcc.param` loads model state at its place; the in-place updates store
// to it through the operands their effects name (PccOps.td). The C++ back
// end reads a loaded value from the state's buffer rather than from a copy,
// which is the same only while no store to that state intervenes: the
// helpers here let a pass keep that order and the back end check it.
//
//===----------------------------------------------------------------------===//

#include "pcc/Dialect/Pcc/IR/PccDialect.h"

#include <algorithm>
#include <memory>

using namespace mlir;
using namespace mlir::pcc;

SmallVector<ParamOp> mlir::pcc::getStoredState(Operation *op) {
  SmallVector<ParamOp> stored;
  auto effects = dyn_cast<MemoryEffectOpInterface>(op);
  if (!effects)
    return stored;
  SmallVector<MemoryEffects::EffectInstance> list;
  effects.getEffectsOnResource(StateResource::get(), list);
  for (const MemoryEffects::EffectInstance &effect : list) {
    Value value = effect.getValue();
    if (!isa<MemoryEffects::Write>(effect.getEffect()) || !value)
      continue;
    // A reshape of a load is a view of the state (a bucket's flat view).
    while (auto view = value.getDefiningOp<ReshapeOp>())
      value = view.getInput();
    if (auto param = value.getDefiningOp<ParamOp>())
      stored.push_back(param);
  }
  return stored;
}

StateStores::StateStores(Block &block) {
  for (Operation &op : block) {
    position[&op] = ops.size();
    for (ParamOp state : getStoredState(&op))
      stores[state.getName()].push_back(ops.size());
    ops.push_back(&op);
  }
}

Operation *StateStores::storeBetween(StringRef name, Operation *from,
                                     Operation *to) const {
  auto it = stores.find(name);
  if (it == stores.end())
    return nullptr;
  unsigned begin = position.lookup(from), end = position.lookup(to);
  const SmallVector<unsigned> &at = it->second;
  auto first = std::upper_bound(at.begin(), at.end(), begin);
  return first != at.end() && *first < end ? ops[*first] : nullptr;
}

bool mlir::pcc::namesStoredState(OpOperand &use) {
  auto effects = dyn_cast<MemoryEffectOpInterface>(use.getOwner());
  if (!effects)
    return false;
  SmallVector<MemoryEffects::EffectInstance> list;
  effects.getEffectsOnResource(StateResource::get(), list);
  return llvm::any_of(list, [&](const MemoryEffects::EffectInstance &e) {
    return isa<MemoryEffects::Write>(e.getEffect()) &&
           e.getEffectValue<OpOperand *>() == &use;
  });
}

unsigned mlir::pcc::mergeStateLoads(Block &block) {
  StateStores stores(block);
  // Per state, its loads seen so far (distinct by type and shard).
  llvm::StringMap<SmallVector<ParamOp, 2>> earlier;
  unsigned merged = 0;
  for (Operation &op : llvm::make_early_inc_range(block)) {
    auto load = dyn_cast<ParamOp>(op);
    if (!load)
      continue;
    SmallVector<ParamOp, 2> &seen = earlier[load.getName()];
    bool onlyNames = llvm::all_of(load->getUses(), namesStoredState);
    ParamOp same;
    for (ParamOp e : seen)
      if (e->getAttrDictionary() == load->getAttrDictionary() &&
          e.getType() == load.getType() &&
          e->getPropertiesAsAttribute() == load->getPropertiesAsAttribute() &&
          (onlyNames || !stores.storeBetween(load.getName(), e, load)))
        same = e;
    if (!same) {
      seen.push_back(load);
      continue;
    }
    load.getResult().replaceAllUsesWith(same.getResult());
    load->erase();
    ++merged;
  }
  return merged;
}

LogicalResult mlir::pcc::verifyStateOrder(Operation *root) {
  // The blocks that load state, each with its stores.
  llvm::DenseMap<Block *, std::unique_ptr<StateStores>> blocks;
  WalkResult result = root->walk([&](ParamOp load) -> WalkResult {
    Block *block = load->getBlock();
    std::unique_ptr<StateStores> &stores = blocks[block];
    if (!stores)
      stores = std::make_unique<StateStores>(*block);
    for (OpOperand &use : load->getUses()) {
      // An update names the state it stores to; it reads the state itself.
      if (namesStoredState(use))
        continue;
      Operation *user = use.getOwner();
      Operation *reader = block->findAncestorOpInBlock(*user);
      if (!reader || reader->isBeforeInBlock(load))
        continue;
      if (Operation *store =
              stores->storeBetween(load.getName(), load, reader)) {
        InFlightDiagnostic diag =
            user->emitError("reads state '")
            << load.getName()
            << "' loaded before an op that stores to it; load it again "
               "after the store";
        diag.attachNote(store->getLoc()) << "the store";
        return WalkResult::interrupt();
      }
    }
    return WalkResult::advance();
  });
  return failure(result.wasInterrupted());
}
