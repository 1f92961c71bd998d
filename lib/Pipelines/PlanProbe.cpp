//===- PlanProbe.cpp - what one probe compile tells the plan search -------===//
//
// Prices a compiled probe's ops on one rank of a machine and reads the
// prefix sums, memory pools and cut candidates the search prices plans
// from (PlanProbe.h).
//
//===----------------------------------------------------------------------===//

#include "PlanProbe.h"

#include "pcc/Analysis/Arena.h"
#include "pcc/Analysis/CostModel.h"
#include "pcc/Dialect/Pcc/IR/Contracts.h"
#include "pcc/Dialect/Pcc/IR/PccDialect.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/StringSet.h"

#include <algorithm>

using namespace mlir;
using namespace mlir::pcc;

namespace mlir::pcc::autoplan {

namespace {

bool isSixteenBit(Type t) {
  auto shaped = dyn_cast<ShapedType>(t);
  Type e = shaped ? shaped.getElementType() : t;
  return e.isBF16() || e.isF16();
}

/// Which ops read `v` (through ops computed from weights alone), by
/// position.
void usePositions(Value v, const llvm::DenseMap<Operation *, size_t> &index,
                  const llvm::DenseSet<Operation *> &cloned,
                  std::vector<size_t> &out) {
  for (Operation *user : v.getUsers()) {
    auto it = index.find(user);
    if (it != index.end())
      out.push_back(it->second);
    else if (cloned.contains(user))
      for (Value r : user->getResults())
        usePositions(r, index, cloned, out);
  }
}

/// The backward phase's values shaped like a weight: the gradients on
/// their way into the state, from each accumulate or assign into a state
/// up through the ops that only move or sum them (a shard slice of the
/// whole gradient, casts, reshapes, transposes, adds, a scatter-add's
/// table, collectives). A product (the weight gradient's) or a reduction
/// ends the walk: what it reads grows with the rows.
llvm::DenseSet<Value> weightShapedValues(func::FuncOp f) {
  llvm::DenseSet<Value> out;
  SmallVector<Value> work;
  auto add = [&](Value v) {
    if (out.insert(v).second)
      work.push_back(v);
  };
  f.walk([&](Operation *op) {
    if (isa<AccumulateOp, AssignOp>(op) && op->getNumOperands() == 2 &&
        op->getOperand(0).getDefiningOp<ParamOp>())
      for (Value v : op->getOperands())
        add(v);
  });
  auto elements = [](Value v) {
    auto t = dyn_cast<ShapedType>(v.getType());
    return t && t.hasStaticShape() ? t.getNumElements() : int64_t{-1};
  };
  while (!work.empty()) {
    Value v = work.pop_back_val();
    Operation *def = v.getDefiningOp();
    if (!def ||
        !isa<ShardSliceOp, CastOp, ReshapeOp, TransposeOp, AddOp, ScatterAddOp,
             ShardScatterAddOp, AllReduceOp, ReduceScatterOp, AllGatherOp>(def))
      continue;
    for (Value u : def->getOperands())
      if (isa<ShardSliceOp, ReduceScatterOp, AllGatherOp>(def) ||
          elements(u) == elements(v))
        add(u);
  }
  return out;
}

/// The buffers the memory plan gave a phase's results (its
/// `pcc.buffer_offsets`), in program order, for the search to lay out
/// again per stage and rows (replayArena). `at` gives an op's forward
/// position; `isFixed` whether a result's bytes do not grow with the
/// rows; `contributions` how many gradients each state receives.
std::vector<ArenaBuffer>
arenaBuffers(Block &body, llvm::function_ref<size_t(Operation *)> at,
             llvm::function_ref<bool(Value)> isFixed,
             const llvm::StringMap<int> &contributions,
             const llvm::StringMap<int> &forwardReads, bool sequenceParallel) {
  llvm::DenseMap<Operation *, uint32_t> order;
  for (Operation &op : body)
    order[&op] = order.size();
  auto offsetsOf = [](Operation *op) -> ArrayRef<int64_t> {
    if (auto a = op->getAttrOfType<DenseI64ArrayAttr>(kBufferOffsetsAttrName))
      return a.asArrayRef();
    return {};
  };
  // An op computed in its user (the CPU's deferrals: no buffer of its
  // own, though one could be): its operands are read there.
  auto deferredTo = [&](Operation *op) -> Operation * {
    if (isa<ParamOp, ConstantOp, ReshapeOp, WaitCollectivesOp>(op) ||
        op->getNumResults() == 0 || !op->hasOneUse())
      return nullptr;
    ArrayRef<int64_t> offsets = offsetsOf(op);
    if (offsets.empty() ||
        !llvm::all_of(offsets, [](int64_t o) { return o == kNoBuffer; }))
      return nullptr;
    return *op->getUsers().begin();
  };
  // Calls `fn(top, readByProduct)` for each op of the block reading `v`:
  // through its views (a reshape is its buffer, a completed collective the
  // buffer it was started into) and the CPU's deferrals (an op computed in
  // its user is read there; `readByProduct`: a product computed into the
  // state reads it as an operand, the cotangent a weight gradient is made
  // from, which is not that gradient: taken for one, the seventeen
  // cotangents of the zoo Llama's products were left out of its one-device
  // backward, 2.23 MB laid out, 2.63 MB compiled).
  auto forEachReader = [&](Value v,
                           llvm::function_ref<void(Operation *, bool)> fn) {
    SmallVector<Operation *> users(v.getUsers().begin(), v.getUsers().end());
    for (size_t u = 0; u < users.size(); ++u) {
      Operation *user = users[u];
      if (isa<ReshapeOp, WaitCollectivesOp>(user)) {
        for (Value r : user->getResults())
          users.append(r.getUsers().begin(), r.getUsers().end());
        continue;
      }
      bool readByProduct = false;
      if (Operation *into = deferredTo(user)) {
        readByProduct = isa<MatmulOp>(user);
        user = into;
      }
      if (Operation *top = body.findAncestorOpInBlock(*user))
        fn(top, readByProduct);
    }
  };
  // Whether `top` sums the contributions to the gradient of a weight
  // read in several places (its result reduced into that state): in a
  // pipeline each stage sums its own, at its backward's end.
  auto sumsTiedGradient = [&](Operation *top) {
    Operation *cur = top;
    for (int step = 0; step < 4; ++step) {
      if (cur->getNumResults() != 1 || !cur->getResult(0).hasOneUse())
        return false;
      cur = *cur->getResult(0).getUsers().begin();
      if (isa<AccumulateOp, AssignOp>(cur)) {
        // Several gradients, or one fused sum of several (the zoo Llama's
        // RMSNorm weights, one all-ones initializer read by every norm).
        auto state = cur->getOperand(0).getDefiningOp<ParamOp>();
        return state &&
               (contributions.lookup(state.getName()) > 1 ||
                forwardReads.lookup(splitStateName(state.getName()).first) > 1);
      }
      if (!isa<ReduceSumOp, ReshapeOp, CastOp, FusionOp>(cur))
        return false;
    }
    return false;
  };
  // A weight gradient's product computed into its state, and the ops
  // that only feed it (a slice of the cotangent, the gather of a split
  // input): a pipeline stage's backward has them all where their other
  // operands are ready (pcc-merge-weight-gradients moves W's ops as early
  // as they can go), before B's ops reading the same cotangent. Placed
  // after the probe's input gradient instead, the bundled GPT's last
  // stage's head gradient was laid out after the logits' gradient had
  // died (--sp, 131 KB against 172 KB compiled).
  // (Also an embedding's scatter-add and a 16-bit gradient's widening,
  // computed into the state however the gradients accumulate: a buffer
  // only where ZeRO 2 and 3 without a pipeline reduce-scatter it whole.)
  auto deferralOf = [&](Operation &op) {
    ArrayRef<int64_t> offsets = offsetsOf(&op);
    if (op.getNumResults() != 1 || offsets.size() != 1 ||
        offsets[0] != kNoBuffer)
      return CpuDeferral::None;
    return getCpuDeferral(&op, [](Value) { return false; });
  };
  auto intoState = [&](Operation &op) {
    CpuDeferral d = deferralOf(op);
    if (d == CpuDeferral::CastInto) {
      // (A cast into a gradient: the first one, assigned.)
      auto state =
          (*op.getUsers().begin())->getOperand(0).getDefiningOp<ParamOp>();
      return state && splitStateName(state.getName()).second == "grad";
    }
    return (d == CpuDeferral::IntoState && isa<MatmulOp>(op)) ||
           d == CpuDeferral::ScatterInto || d == CpuDeferral::Widen;
  };
  llvm::DenseMap<Operation *, uint32_t> mergedAt;
  for (Operation &op : body) {
    if (!intoState(op))
      continue;
    llvm::SmallPtrSet<Operation *, 8> chain{&op};
    SmallVector<Operation *> work{&op};
    uint32_t made = 0;
    while (!work.empty()) {
      Operation *cur = work.pop_back_val();
      for (Value v : cur->getOperands()) {
        Operation *def = v.getDefiningOp();
        if (!def || !order.count(def) || chain.contains(def))
          continue;
        bool feedsOnly = chain.size() < 8 && !isa<ParamOp>(def) &&
                         llvm::all_of(def->getUsers(), [&](Operation *user) {
                           return chain.contains(user);
                         });
        if (feedsOnly) {
          chain.insert(def);
          work.push_back(def);
        } else {
          made = std::max(made, order.lookup(def));
        }
      }
    }
    for (Operation *o : chain)
      mergedAt[o] = made;
  }
  std::vector<ArenaBuffer> out;
  for (Operation &op : body) {
    ArrayRef<int64_t> offsets = offsetsOf(&op);
    // A weight gradient's product that the CPU back end computes straight
    // into the state it is assigned to (the one-row probe's one
    // micro-batch) takes a buffer where the gradients accumulate (a
    // pipeline's, or over micro-batches): replayArena counts it there. The
    // last stage's tied head gradient, missing, was half its arena.
    if (intoState(op)) {
      Operation *assign = *op.getUsers().begin();
      ArenaBuffer b;
      b.op = order.lookup(&op);
      b.dies = order.lookup(assign);
      b.pos = at(&op);
      b.firstReader = b.lastReader = at(assign);
      b.bytes = getTensorBytes(op.getResult(0).getType());
      auto state = assign->getOperand(0).getDefiningOp<ParamOp>();
      b.intoState = state && contributions.lookup(state.getName()) > 1 ? 2 : 1;
      b.wholeForScatter = deferralOf(op) != CpuDeferral::IntoState;
      b.mergedAt = mergedAt.lookup(&op);
      out.push_back(b);
      continue;
    }
    // ZeRO 3 gathers a weight where it is read, into a buffer alive to
    // its last reader (each read its own gather).
    if (auto param = dyn_cast<ParamOp>(op); param && !param->use_empty()) {
      llvm::StringRef kind = splitStateName(param.getName()).second;
      if (kind.empty() || kind == kBf16CopyState || kind == kF16CopyState) {
        ArenaBuffer b;
        b.op = b.dies = order.lookup(&op);
        b.pos = at(&op);
        b.firstReader = b.lastReader = b.pos;
        b.bytes = getTensorBytes(param.getType());
        b.gathered = true;
        forEachReader(param.getResult(), [&](Operation *top, bool) {
          if (top->hasTrait<OpTrait::IsTerminator>())
            return;
          b.dies = std::max(b.dies, order.lookup(top));
          b.firstReader = std::min(b.firstReader, at(top));
          b.lastReader = std::max(b.lastReader, at(top));
        });
        out.push_back(b);
      }
      continue;
    }
    for (auto [r, offset] : llvm::zip(op.getResults(), offsets)) {
      if (offset < 0)
        continue;
      ArenaBuffer b;
      b.op = order.lookup(&op);
      b.dies = b.op;
      b.pos = at(&op);
      b.firstReader = b.lastReader = b.pos;
      b.bytes = getTensorBytes(r.getType());
      b.perRow = !isFixed(r);
      if (auto it = mergedAt.find(&op); it != mergedAt.end())
        b.mergedAt = it->second;
      forEachReader(r, [&](Operation *top, bool readByProduct) {
        if (top->hasTrait<OpTrait::IsTerminator>()) {
          b.escapes = true; // saved for a later phase
          return;
        }
        if (!readByProduct && isa<AccumulateOp, AssignOp>(top))
          if (auto state = top->getOperand(0).getDefiningOp<ParamOp>()) {
            b.intoState = contributions.lookup(state.getName()) > 1 ? 2 : 1;
            b.widened = isSixteenBit(state.getType());
          }
        b.dies = std::max(b.dies, order.lookup(top));
        if (sumsTiedGradient(top)) {
          b.sumsTied = true;
          return;
        }
        size_t c = at(top);
        b.firstReader = std::min(b.firstReader, c);
        b.lastReader = std::max(b.lastReader, c);
      });
      out.push_back(b);
    }
    // Under --sp a sequence-split collective's operand (a reduce-scatter)
    // or result (an all-gather) is reshaped at one row and transposed at
    // several (the rank's chunk of the sequence moves ahead of the batch):
    // a copy of its bytes alive beside it where it is made. Without them
    // the zoo Llama's tp 4 --sp backward was 7% under its compiled arena.
    if (sequenceParallel && isa<ReduceScatterOp, AllGatherOp>(op)) {
      Value v = isa<ReduceScatterOp>(op) ? op.getOperand(0) : op.getResult(0);
      bool reshaped = isa<ReduceScatterOp>(op)
                          ? static_cast<bool>(v.getDefiningOp<ReshapeOp>())
                          : llvm::any_of(v.getUsers(), [](Operation *user) {
                              return isa<ReshapeOp, WaitCollectivesOp>(user);
                            });
      if (reshaped && !isFixed(v)) {
        ArenaBuffer b;
        b.op = b.dies = order.lookup(&op);
        b.pos = b.firstReader = b.lastReader = at(&op);
        b.bytes = getTensorBytes(v.getType());
        b.perRow = true;
        b.manyRows = true;
        if (auto it = mergedAt.find(&op); it != mergedAt.end())
          b.mergedAt = it->second;
        out.push_back(b);
      }
    }
  }
  return out;
}

} // namespace

double Pricer::op(Operation *op, int64_t tp, double &moved,
                  double &fixed) const {
  if (isa<ParamOp, ConstantOp, ReshapeOp, func::ReturnOp>(op))
    return 0;
  if (auto c = dyn_cast<CollectiveOpInterface>(op)) {
    FailureOr<int64_t> size = getMeshAxisSize(op, c.getMeshAxis());
    int64_t ranks = succeeded(size) ? *size : tp;
    double part = ranks > 1 ? static_cast<double>(ranks - 1) / ranks : 0;
    if (c.getCollectiveKind() == CollectiveKind::AllReduce)
      part *= 2;
    moved += part * static_cast<double>(c.getPayloadBytes());
    fixed += ranks > 1 ? machine.intraLatencyFor(ranks) : 0;
    return collective(c.getCollectiveKind(), c.getPayloadBytes(), ranks,
                      /*intra=*/true);
  }
  double bytes = 0;
  bool sixteen = false;
  for (Value v : op->getOperands()) {
    bytes += static_cast<double>(getTensorBytes(v.getType()));
    sixteen |= isSixteenBit(v.getType());
  }
  for (Value v : op->getResults())
    bytes += static_cast<double>(getTensorBytes(v.getType()));
  double memory = bytes / (machine.memoryBandwidth * share);
  double flops = static_cast<double>(opFlops(op));
  double rate = flops > 0 ? machine.productFlops(sixteen, flops) : 0;
  // A fused attention at its measured rate (a product's is up to 3x its
  // kernel's at narrow heads).
  Value qv, kv;
  if (auto a = dyn_cast<AttentionOp>(op))
    qv = a.getQ(), kv = a.getK();
  if (auto a = dyn_cast<AttentionGradOp>(op))
    qv = a.getQ(), kv = a.getK();
  if (qv) {
    auto q = cast<RankedTensorType>(qv.getType());
    auto k = cast<RankedTensorType>(kv.getType());
    if (double a = machine.attentionFlops(sixteen, isa<AttentionGradOp>(op),
                                          static_cast<double>(q.getDimSize(3)),
                                          static_cast<double>(k.getDimSize(2)));
        a > 0)
      rate = a;
  }
  double compute = flops > 0 ? flops / (rate * share) : 0;
  fixed += machine.kernelSeconds;
  return std::max(memory, compute) + machine.kernelSeconds;
}

/// Reads a compiled probe module.
void readProbe(ModuleOp module, const Pricer &pricer, int64_t tp,
               const llvm::StringSet<> &perRow, Probe &p) {
  auto fwd = module.lookupSymbol<func::FuncOp>(kPhaseFunctions[0]);
  auto bwd = module.lookupSymbol<func::FuncOp>(kPhaseFunctions[1]);
  if (!fwd || !bwd || !fwd.getBody().hasOneBlock()) {
    p.error = "the probe compile has no training phases";
    return;
  }
  llvm::DenseSet<Operation *> cloned;
  std::vector<Operation *> ops;
  llvm::DenseMap<Operation *, size_t> index;
  for (Operation &op : fwd.getBody().front()) {
    if (op.hasTrait<OpTrait::IsTerminator>())
      continue;
    if (isComputedFromWeights(&op, cloned)) {
      cloned.insert(&op);
      continue;
    }
    index[&op] = ops.size();
    ops.push_back(&op);
  }
  size_t n = ops.size();
  p.forward.assign(n + 1, 0);
  p.forwardFixed.assign(n + 1, 0);
  p.backwardFixed.assign(n + 1, 0);
  p.backward.assign(n + 1, 0);
  p.forwardWeight.assign(n + 1, 0);
  p.weightGrad.assign(n + 1, 0);
  // What the batch inputs reach (the rest is a micro-batch's whatever its
  // rows: weights, constants and what is made from them alone).
  llvm::DenseSet<Value> fromBatch =
      valuesReachedFrom(fwd.getBody().front(), fwd.getArguments());
  p.saved.assign(n + 1, 0);
  p.cut.seconds.assign(n + 1, 0);
  p.cut.flops.assign(n + 1, 0);
  double moved = 0;
  for (size_t i = 0; i < n; ++i) {
    double fixed = 0;
    double f = pricer.op(ops[i], tp, moved, fixed);
    p.forwardFixed[i + 1] = p.forwardFixed[i] + fixed;
    p.backwardFixed[i + 1] =
        p.backwardFixed[i] + fixed * (opFlops(ops[i]) ? 2.0 : 1.0);
    if (isa<CollectiveOpInterface>(ops[i]))
      p.tpSeconds += f;
    int64_t flops = opFlops(ops[i]);
    // A product reading a weight: its weight's gradient is W's product of
    // the same FLOPs; the input's gradient is B's.
    bool readsWeight = llvm::any_of(ops[i]->getOperands(), [&](Value v) {
      Operation *def = v.getDefiningOp();
      return def && cloned.contains(def);
    });
    p.forward[i + 1] = p.forward[i] + f;
    bool perRow = llvm::any_of(ops[i]->getResults(),
                               [&](Value r) { return fromBatch.contains(r); });
    p.forwardWeight[i + 1] = p.forwardWeight[i] + (perRow ? 0.0 : f - fixed);
    p.backward[i + 1] = p.backward[i] + f * (flops ? 2.0 : 1.0);
    p.weightGrad[i + 1] = p.weightGrad[i] + (flops && readsWeight ? f : 0);
    p.cut.seconds[i + 1] = p.cut.seconds[i] + f * (flops ? 3.0 : 2.0);
    // The cut search's layers are the products reading weights (a loss
    // with FLOPs after the head is no layer to cut before).
    p.cut.flops[i + 1] = p.cut.flops[i] + (readsWeight ? flops : 0);
    p.flops += 3.0 * static_cast<double>(flops);
  }
  // Saved activations: the forward phase's results after the loss.
  std::vector<int64_t> savedAt(n + 1, 0);
  auto ret = cast<func::ReturnOp>(fwd.getBody().front().getTerminator());
  // What does not grow with the rows in the forward phase: what the
  // weights alone make (a gathered or cast table), and what constants
  // alone make unless the whole batch's program has it per row (`perRow`,
  // by ONNX node: an attention mask built from position ids expanded over
  // the batch is one row's at the probe's one row). Saved so, a rotary
  // table counted per row put the zoo Llama's stages 3% over at 8 rows.
  Block &body = fwd.getBody().front();
  llvm::DenseSet<Value> fromWeights = valuesReachedFrom(
      body, {}, [](Operation &op) { return isa<ParamOp>(op); });
  auto fixedInForward = [&](Value v) {
    if (fromBatch.contains(v))
      return false;
    Operation *def = v.getDefiningOp();
    return fromWeights.contains(v) || !def ||
           !perRow.contains(getOnnxNodeOfLocation(def->getLoc()).second);
  };
  std::vector<int64_t> fixedAt(n + 1, 0);
  // A value read in more than one place is saved by every stage with a
  // reader whose backward needs it (the stage's input, received and saved
  // again; a causal mask or rotary table each stage computes from
  // constants: 268 MB a micro-batch at 8,192 tokens), and not by the one
  // defining it unless a reader is there: `savedReads`.
  for (Value v : ret.getOperands().drop_front()) {
    size_t at = 0;
    if (Operation *def = v.getDefiningOp()) {
      auto it = index.find(def);
      at = it == index.end() ? 0 : it->second;
    }
    std::vector<size_t> readers;
    usePositions(v, index, cloned, readers);
    llvm::sort(readers);
    readers.erase(std::unique(readers.begin(), readers.end()), readers.end());
    bool fixed = fixedInForward(v);
    if (readers.size() > 1 || (readers.size() == 1 && readers[0] != at)) {
      (fixed ? p.savedReadsFixed : p.savedReads)
          .push_back({getTensorBytes(v.getType()), readers});
      continue;
    }
    (fixed ? fixedAt : savedAt)[at] += getTensorBytes(v.getType());
  }
  p.savedFixed.assign(n + 1, 0);
  for (size_t i = 0; i < n; ++i) {
    p.saved[i + 1] = p.saved[i] + savedAt[i];
    p.savedFixed[i + 1] = p.savedFixed[i] + fixedAt[i];
  }
  // What W reads from B: the output cotangent of each op reading a
  // weight, and its activation operands where they are not saved (once per
  // value).
  llvm::DenseSet<Value> savedValues(ret.getOperands().begin() + 1,
                                    ret.getOperands().end());
  llvm::DenseSet<Value> counted;
  // Only the readers of trained weights (with a gradient) have a W: the
  // rotary tables and masks computed from constants have none.
  llvm::StringSet<> trained;
  module.walk([&](ParamOp param) {
    auto [weight, kind] = splitStateName(param.getName());
    if (kind == "grad")
      trained.insert(weight);
  });
  std::vector<char> readsTrained(n, 0);
  fwd.walk([&](ParamOp param) {
    auto [weight, kind] = splitStateName(param.getName());
    if (!trained.contains(weight) ||
        (!kind.empty() && kind != kBf16CopyState && kind != kF16CopyState))
      return;
    std::vector<size_t> at;
    usePositions(param.getResult(), index, cloned, at);
    for (size_t a : at)
      if (a < n)
        readsTrained[a] = 1;
  });
  // An add, or a fusion of adds alone (broadcasts and reshapes beside).
  auto addsOnly = [](Operation *op) {
    if (isa<AddOp>(op))
      return true;
    auto fusion = dyn_cast<FusionOp>(op);
    if (!fusion)
      return false;
    bool adds = false;
    for (Operation &inner : fusion.getBody().front()) {
      if (isa<AddOp>(inner))
        adds = true;
      else if (!isa<BroadcastOp, ReshapeOp, CastOp, YieldOp>(inner))
        return false;
    }
    return adds;
  };
  // The 16-bit float type a fused add casts to or from (mixed precision:
  // a product's bias added in f32 and the sum narrowed, or a 16-bit
  // reduce-scattered partial sum widened into the residual stream).
  auto narrowType = [](Operation *op) -> Type {
    auto fusion = dyn_cast<FusionOp>(op);
    if (!fusion)
      return {};
    for (Operation &inner : fusion.getBody().front())
      if (isa<CastOp>(inner))
        for (Type t :
             {inner.getOperand(0).getType(), inner.getResult(0).getType()})
          if (Type e = cast<RankedTensorType>(t).getElementType();
              e.isBF16() || e.isF16())
            return e;
    return {};
  };
  p.wgradSet.assign(n + 1, 0);
  for (size_t i = 0; i < n; ++i) {
    int64_t set = 0;
    Operation *op = ops[i];
    bool readsWeight = readsTrained[i];
    // A bias added (alone or fused with a residual add): its gradient
    // reads only the sum's cotangent, and when the sum adds to what an op
    // reading a weight made (a product's bias, a norm's shift after its
    // scale) that cotangent is the op's, which B keeps once. Counted with
    // the fusion's operands and as a norm's scale, zb-h1's sets came out
    // 3x their compiled ones.
    bool biasAdd = readsWeight && addsOnly(op);
    bool passesCotangent =
        biasAdd && llvm::any_of(op->getOperands(), [&](Value v) {
          Operation *def = v.getDefiningOp();
          auto it = def ? index.find(def) : index.end();
          return it != index.end() && it->second < n &&
                 readsTrained[it->second] && !isa<ParamOp>(def);
        });
    if (biasAdd) {
      if (!passesCotangent) {
        for (Value r : op->getResults())
          set += getTensorBytes(r.getType());
      } else if (Type narrow = narrowType(op)) {
        // Cast on the way, the product's W reads its cotangent in 16 bits
        // besides the f32 one the bias's gradient reads (GPT's bf16 zb-h1
        // sets counted the fusion as a product's, 1.9x their compiled
        // ones).
        for (Value r : op->getResults())
          set +=
              getTensorBytes(cast<RankedTensorType>(r.getType()).clone(narrow));
      }
    } else if (readsWeight) {
      for (Value r : op->getResults()) {
        // A partial sum reduce-scattered (--sp's row-parallel output): W
        // keeps its cotangent split and gathers it again.
        // (Through the reshape and, at several rows, the transpose that
        // move the rank's chunk of the sequence first: the zoo Llama's
        // row-parallel outputs were counted whole.)
        Value kept = r;
        // A result all-gathered whole (the LM head's logits for the
        // loss): its cotangent comes whole, and W keeps it so (the head's
        // set was half its compiled one). One gathered for a product
        // (--sp: a norm's output for the column-parallel projections)
        // gets its cotangent back as the products' partial sums, which B
        // reduce-scatters: W keeps it split (the zoo Llama's zb-h1 sets
        // were 1.7x their compiled ones).
        auto readByProduct = [](Value gathered) {
          SmallVector<Value> vs = {gathered};
          for (size_t u = 0; u < vs.size() && u < 8; ++u)
            for (Operation *user : vs[u].getUsers()) {
              if (isa<MatmulOp>(user))
                return true;
              if (isa<ReshapeOp, TransposeOp, CastOp>(user))
                vs.push_back(user->getResult(0));
            }
          return false;
        };
        SmallVector<Value> views = {r};
        bool scattered = false;
        for (size_t u = 0; u < views.size() && u < 8; ++u)
          for (Operation *user : views[u].getUsers()) {
            if (isa<ReduceScatterOp>(user)) {
              kept = user->getResult(0);
              scattered = true;
            } else if (isa<CastOp>(user) && !scattered) {
              // (Under mixed precision a 16-bit product's f32 sum is
              // reduce-scattered in 16 bits; its cotangent stays f32.)
              views.push_back(user->getResult(0));
            } else if (isa<AllGatherOp>(user) &&
                       !readByProduct(user->getResult(0))) {
              kept = user->getResult(0);
            } else if (isa<ReshapeOp, TransposeOp>(user)) {
              views.push_back(user->getResult(0));
            }
          }
        // At the product's precision: a 16-bit sum is reduce-scattered in
        // 16 bits, its cotangent f32; a 16-bit product's logits are
        // widened and gathered whole, their cotangent kept in 16 bits (the
        // bundled GPT's bf16 LM head was counted at f32).
        // A fusion that narrows what it computes (a written-out norm's
        // scale, then the cast for the products under mixed precision)
        // takes the weight's gradient from the cotangent before the cast
        // (the zoo Llama's bf16 norms were counted at 16 bits).
        Type element = cast<RankedTensorType>(r.getType()).getElementType();
        if (auto fusion = dyn_cast<FusionOp>(op))
          if (auto narrowed =
                  fusion.getBody()
                      .front()
                      .getTerminator()
                      ->getOperand(cast<OpResult>(r).getResultNumber())
                      .getDefiningOp<CastOp>())
            element = cast<RankedTensorType>(narrowed.getOperand().getType())
                          .getElementType();
        int64_t bytes = getTensorBytes(
            cast<RankedTensorType>(kept.getType()).clone(element));
        set += bytes;
        // A norm op's scale: its gradient also reads the normalized input,
        // made inside the op, which B recomputes. (A norm written out, as
        // exporters do RMSNorm, multiplies the scale into a normalized
        // value of its own: an operand, saved or counted below; counted
        // here too, the zoo Llama's zb-h1 sets were 1.3x their compiled
        // ones.)
        if (isa<LayerNormOp, BatchNormOp>(op))
          set += bytes;
      }
      for (Value v : op->getOperands()) {
        Operation *def = v.getDefiningOp();
        if ((def && cloned.contains(def)) || savedValues.contains(v) ||
            !counted.insert(v).second)
          continue;
        // An input all-gathered (--sp's column-parallel input): W gathers
        // it again from its piece, which the forward saves.
        Value piece = v;
        while (Operation *d = piece.getDefiningOp()) {
          if (isa<ReshapeOp, TransposeOp>(d)) {
            piece = d->getOperand(0);
            continue;
          }
          if (auto gather = dyn_cast<AllGatherOp>(d))
            piece = gather.getInput();
          break;
        }
        if (piece != v &&
            (savedValues.contains(piece) || !counted.insert(piece).second))
          continue;
        set += getTensorBytes(piece.getType());
      }
    }
    p.wgradSet[i + 1] = p.wgradSet[i] + set;
  }
  // Weights (not the optimizer's state), by the ops reading them. Under
  // mixed precision the products read a weight's 16-bit copy: its reads
  // are the weight's, and the weight's bytes are its f32 ones.
  llvm::StringMap<size_t> weightAt;
  fwd.walk([&](ParamOp param) {
    auto [weight, kind] = splitStateName(param.getName());
    bool copy = kind == kBf16CopyState || kind == kF16CopyState;
    if (!kind.empty() && !copy)
      return;
    std::vector<size_t> at;
    usePositions(param.getResult(), index, cloned, at);
    if (at.empty())
      return;
    int64_t bytes = getTensorBytes(param.getType()) * (copy ? 2 : 1);
    auto [it, inserted] = weightAt.try_emplace(weight, p.weights.size());
    if (inserted) {
      p.weights.push_back({bytes, {}});
      p.weightBytes += bytes;
      p.largestWeight = std::max(p.largestWeight, bytes);
    }
    std::vector<size_t> &all = p.weights[it->second].second;
    all.insert(all.end(), at.begin(), at.end());
    // Kept whole over tp ranks that could split it: its lookups.
    if (inserted) {
      Probe::WeightSplit split;
      auto shape = param.getType().getShape();
      if (tp > 1 && !param.getShardAttr() &&
          llvm::any_of(shape, [&](int64_t d) { return d % tp == 0; }))
        split.splitBytes = bytes / tp;
      p.splits.push_back(split);
    }
    for (size_t a : at)
      if (a < n && isa<GatherOp, ShardGatherOp>(ops[a]))
        p.splits[it->second].lookups.push_back(a);
    if (copy) {
      p.copies.push_back({getTensorBytes(param.getType()), at});
      p.largestCopy = std::max(p.largestCopy, getTensorBytes(param.getType()));
    }
  });
  for (auto &entry : p.copies)
    llvm::sort(entry.second);
  for (Probe::WeightSplit &split : p.splits)
    llvm::sort(split.lookups);
  for (auto &entry : p.weights) {
    llvm::sort(entry.second);
    entry.second.erase(std::unique(entry.second.begin(), entry.second.end()),
                       entry.second.end());
  }
  // Bytes live across each position (values used later; graph inputs live
  // from the start to their last use), as pcc-pipeline-cut counts them.
  std::vector<int64_t> delta(n + 2, 0);
  auto addLive = [&](Value v, size_t from) {
    std::vector<size_t> at;
    usePositions(v, index, cloned, at);
    size_t last = from;
    for (size_t a : at)
      last = std::max(last, a);
    if (last > from || isa<BlockArgument>(v)) {
      // As pcc-pipeline-cut weighs it (before fusion: a 16-bit value the
      // fusion wrote is a cast of its f32 one).
      int64_t bytes = cutWeightAsF32(v);
      delta[isa<BlockArgument>(v) ? 0 : from + 1] += bytes;
      delta[last + 1] -= bytes;
    }
  };
  for (BlockArgument arg : fwd.getArguments())
    addLive(arg, 0);
  for (size_t i = 0; i < n; ++i)
    for (Value r : ops[i]->getResults())
      addLive(r, i);
  p.cut.crossing.assign(n + 1, 0);
  int64_t live = 0;
  for (size_t c = 0; c <= n; ++c) {
    live += delta[c];
    p.cut.crossing[c] = live;
  }
  p.gatheredAt.assign(n + 1, 0);
  for (size_t c = 1; c < n; ++c)
    if (auto gather = dyn_cast<AllGatherOp>(ops[c]))
      if (Operation *def = gather.getInput().getDefiningOp();
          def && index.count(def) && index.lookup(def) < c)
        p.gatheredAt[c] = getTensorBytes(gather.getResult().getType()) -
                          getTensorBytes(gather.getInput().getType());
  p.candidates = candidateCuts(p.cut);
  // The node before each candidate, as --pp-cuts names it: the compile
  // cuts after the last op of that node, so the name must not come later.
  // (An op without an ONNX node, such as the loss pcc adds, names no cut:
  // the compile would find it at another place.)
  auto nameOf = [](Operation *op) {
    return getOnnxNodeOfLocation(op->getLoc()).second;
  };
  llvm::StringMap<size_t> lastOf;
  for (size_t i = 0; i < n; ++i)
    if (std::string name = nameOf(ops[i]); !name.empty())
      lastOf[name] = i;
  // A cut between a node's cast of its input and its product (the
  // mixed-precision cast the product's node owns) is named after the node
  // before the cast: the cast goes to the next stage, which changes
  // nothing the cut weighs (a cast weighs as its input).
  for (size_t c : p.candidates) {
    size_t at = c;
    while (at > 1 && isa<CastOp, ReshapeOp>(ops[at - 1]) &&
           lastOf.lookup(nameOf(ops[at - 1])) != at - 1)
      --at;
    std::string name = at > 0 ? nameOf(ops[at - 1]) : std::string();
    // The node's later ops may be what tensor parallelism adds to hand its
    // value on (with --sp, the residual's all-gather and its layout
    // changes): they go to the next stage with the readers they serve.
    bool handsOn = !name.empty();
    for (size_t i = at; handsOn && i <= lastOf.lookup(name); ++i)
      handsOn = nameOf(ops[i]) != name ||
                isa<AllGatherOp, ShardSliceOp, ReshapeOp, TransposeOp, CastOp>(
                    ops[i]);
    bool names = handsOn && name.find(',') == std::string::npos;
    p.cutNames.push_back(names ? name : std::string());
  }
  // Only cuts a plan can name: the compiled plan is then the priced one.
  // Two candidates named after one node (the node's ops, then the ops that
  // hand its value on) are one cut to the compile: the first stays, or a
  // plan could cut twice after the same node (an interleaved GPT of 8
  // stages cut after ln_f twice, which the compile refused).
  std::vector<size_t> named;
  std::vector<std::string> names;
  llvm::StringSet<> seen;
  for (auto [c, name] : llvm::zip(p.candidates, p.cutNames))
    if (!name.empty() && seen.insert(name).second) {
      named.push_back(c);
      names.push_back(name);
    }
  p.candidates = std::move(named);
  p.cutNames = std::move(names);
  // The backward and the step's other phases, priced whole; of the
  // backward, the bytes of weight-shaped values are a micro-batch's
  // whatever its rows (GPT-2's 154 MB table gradient, made whole and
  // sliced at tp 2: 0.25 s a micro-batch on a CPU rank, at one row as at
  // four).
  llvm::DenseSet<Value> perWeight = weightShapedValues(bwd);
  // And what no saved activation or cotangent reaches (a weight gathered
  // again for the input gradient's product).
  llvm::DenseSet<Value> fromRows =
      valuesReachedFrom(bwd.getBody().front(), bwd.getArguments());
  for (Operation &op : bwd.getBody().front()) {
    double fixed = 0;
    double s = pricer.op(&op, tp, moved, fixed);
    p.backwardFixedSeconds += fixed;
    p.backwardSeconds += s;
    bool collective = isa<CollectiveOpInterface>(&op);
    if (collective)
      p.tpSeconds += s;
    bool perRow = llvm::any_of(op.getResults(),
                               [&](Value r) { return fromRows.contains(r); });
    if (!perRow && op.getNumResults() > 0) {
      p.backwardWeightSeconds += s - fixed;
      continue;
    }
    if (!collective && opFlops(&op) != 0)
      continue; // a product: its FLOPs grow with the rows
    double all = 0, weightBytes = 0;
    auto count = [&](Value v) {
      double bytes = static_cast<double>(getTensorBytes(v.getType()));
      all += bytes;
      if (perWeight.contains(v))
        weightBytes += bytes;
    };
    llvm::for_each(op.getOperands(), count);
    llvm::for_each(op.getResults(), count);
    if (weightBytes > 0)
      p.backwardWeightSeconds += (s - fixed) * weightBytes / all;
  }
  for (int phase : {2, 3})
    if (auto f = module.lookupSymbol<func::FuncOp>(kPhaseFunctions[phase]))
      for (Operation &op : f.getBody().front()) {
        double ignored = 0, fixed = 0;
        p.optimizerSeconds += pricer.op(&op, tp, ignored, fixed);
      }
  auto arenaOf = [&](int phase) -> int64_t {
    auto f = module.lookupSymbol<func::FuncOp>(kPhaseFunctions[phase]);
    auto a = f ? f->getAttrOfType<IntegerAttr>(kArenaBytesAttrName) : nullptr;
    return a ? a.getInt() : 0;
  };
  // How many gradients each state receives: a weight the backward phase
  // gives several (a tied embedding and LM head) sums them in a buffer,
  // and with ZeRO 2 and 3 before its one reduce-scatter, each
  // contribution and the sum whole in the arena.
  llvm::StringMap<int> contributions;
  bwd.walk([&](Operation *op) {
    if (!isa<AccumulateOp, AssignOp>(op))
      return;
    if (auto state = op->getOperand(0).getDefiningOp<ParamOp>())
      if (++contributions[state.getName()] == 2)
        p.tiedGrad = std::max(p.tiedGrad, getTensorBytes(state.getType()));
  });
  // How many ops of the forward phase read each weight.
  llvm::StringMap<int> forwardReads;
  for (Operation &op : fwd.getBody().front())
    if (auto param = dyn_cast<ParamOp>(op))
      forwardReads[param.getName()] += static_cast<int>(
          std::distance(param->getUsers().begin(), param->getUsers().end()));
  // The micro-batch phases' buffers by forward position (the backward's
  // ops by their ONNX node's), so that a stage's arena is laid out from
  // its own ops' (the logits and their gradient only on the last stage's;
  // a tied head's gradient buffer there, not on the embedding's stage).
  // A node's backward ops go where its last forward op is: with --sp the
  // all-gather before the LM head carries the head's node and may end the
  // stage before the head's (pcc-pipeline-cut hands it on there), and the
  // head's and the loss's gradients, placed at its first op, were laid out
  // in that stage's arena (3.5x its compiled one).
  {
    llvm::StringMap<size_t> nodeAt;
    for (size_t i = 0; i < n; ++i)
      if (std::string name = getOnnxNodeOfLocation(ops[i]->getLoc()).second;
          !name.empty())
        nodeAt[name] = i;
    auto positions = [&](Block &body, bool forward) {
      llvm::DenseMap<Operation *, size_t> out;
      SmallVector<Operation *> pending;
      for (Operation &op : body) {
        size_t c = n;
        if (forward) {
          auto it = index.find(&op);
          if (it != index.end())
            c = it->second;
        } else if (std::string name = getOnnxNodeOfLocation(op.getLoc()).second;
                   !name.empty()) {
          auto it = nodeAt.find(name);
          if (it != nodeAt.end())
            c = it->second;
        } else if (isa<AccumulateOp, AssignOp>(op)) {
          // A gradient added into the state (no node of its own) goes
          // where the gradient was made: placed at the next node's, the
          // LM head's weight gradient seemed read by the stage before and
          // was left out of the last stage's arena.
          if (Operation *def = op.getOperand(1).getDefiningOp()) {
            auto it = out.find(def);
            if (it != out.end())
              c = it->second;
          }
        }
        if (c == n) {
          pending.push_back(&op);
          continue;
        }
        for (Operation *o : pending)
          out[o] = c;
        pending.clear();
        out[&op] = c;
      }
      for (Operation *o : pending)
        out[o] = forward ? (n ? n - 1 : 0) : 0;
      return out;
    };
    auto fwdAt = positions(body, true);
    auto bwdAt = positions(bwd.getBody().front(), false);
    p.arenaBuffers = {
        arenaBuffers(
            body, [&](Operation *op) { return fwdAt.lookup(op); },
            fixedInForward, contributions, forwardReads, p.sequenceParallel),
        arenaBuffers(
            bwd.getBody().front(),
            [&](Operation *op) { return bwdAt.lookup(op); },
            [&](Value v) {
              return !fromRows.contains(v) || perWeight.contains(v);
            },
            contributions, forwardReads, p.sequenceParallel)};
  }
  p.stepArena = std::max(arenaOf(2), arenaOf(3));
  p.tpBytes = moved;
  p.pools = predictStepMemory(module);
  llvm::StringSet<> narrowed;
  module.walk([&](ParamOp param) {
    if (splitStateName(param.getName()).second == "grad" &&
        param.getType().getElementType().isBF16() &&
        narrowed.insert(param.getName()).second)
      p.narrowGrads += getTensorBytes(param.getType());
  });
}

double replayArena(const Probe &p, size_t lo, size_t hi, double rows,
                   int gradients, bool gathers) {
  double largest = 0;
  // A pipeline stage computes each weight gradient's product where its
  // operands are ready and accumulates it at once: the bundled GPT's last
  // stage's tied head gradient, made right after the logits' gradient
  // there, was laid out after the logits' gradient had died (fp32 tp 2 x
  // pp 2: 131 KB against 164 KB compiled).
  // (On a timeline of twice the ops: a merged W op goes right after the
  // op making its last operand, once what that op read is free: put at
  // it, the bundled GPT's head gradient and the logits' gathered copy,
  // dead by then, made its last stage 38% over.)
  bool merged = !(lo == 0 && hi >= p.size());
  std::array<std::vector<ArenaBuffer>, 2> phases;
  for (size_t i = 0; i < p.arenaBuffers.size(); ++i) {
    phases[i] = p.arenaBuffers[i];
    for (ArenaBuffer &b : phases[i]) {
      b.op *= 2;
      b.dies *= 2;
      if (merged && b.mergedAt)
        b.op = b.dies = 2 * *b.mergedAt + 1;
    }
    if (merged)
      std::stable_sort(phases[i].begin(), phases[i].end(),
                       [](const ArenaBuffer &a, const ArenaBuffer &b) {
                         return a.op < b.op;
                       });
  }
  for (const std::vector<ArenaBuffer> &phase : phases) {
    // The buffers that grow with the rows and those that do not laid out
    // together, as the compile does, on the last stage (and without a
    // pipeline), whose program runs the probe's order; before it, in two
    // arenas: the stage's backward merges its W into B in its own order
    // (pcc-merge-weight-gradients), accumulates its gradients in f32 where
    // the probe kept bf16 (GPT's MLP gradient in f32 and then a second f32
    // buffer for its bias gradient), and a fixed buffer laid out in the
    // rows' holes from the probe's order came out under (the bundled GPT's
    // fourth of eight stages: 139 KB together at four rows, 172 KB apart,
    // 188 KB compiled). Together on the last stage the bundled GPT's tp 2 x
    // pp 2 x dp 2 ZeRO-3 bf16 plan's is its compiled arena to the byte
    // (apart, 20% over), and GPT-2's tp 4 arena too (apart, 15% over).
    // Under --sp the many-row program lays out the gathered logits
    // otherwise (together, the bundled GPT's tp 4 x dp 2 came out 1-3%
    // under, with the transposed copies below counted too).
    bool together = hi >= p.size() && !p.sequenceParallel;
    std::array<BestFitArena, 2> arenas = {BestFitArena(kArenaAlignment),
                                          BestFitArena(kArenaAlignment)};
    // (dies, offset, bytes, arena) of the buffers laid out, the next to die
    // first.
    std::vector<std::tuple<uint32_t, int64_t, int64_t, int>> live;
    // Each arena's buffers with their lifetimes.
    std::array<std::vector<ArenaInterval>, 2> lifetimes;
    // The stage's last op with a buffer of its own: where the stage sums
    // its contributions to a tied weight's gradient.
    uint32_t stageEnd = 0;
    for (const ArenaBuffer &b : phase)
      if (b.pos >= lo && b.pos < hi)
        stageEnd = std::max(stageEnd, b.op);
    auto later = [](const auto &a, const auto &b) {
      return std::get<0>(a) > std::get<0>(b);
    };
    // gradients 3 (ZeRO 2 and 3 without a pipeline): every gradient is
    // made whole before its reduce-scatter (an embedding's scatter-add, a
    // 16-bit gradient widened), and a tied weight's is summed at the
    // phase's end: the head's contribution alive from its product to
    // there, beside the lookup's, then the sum (f32). Added whole to every
    // other buffer, they made the bundled GPT's ZeRO-2/3 plans 8-21% over.
    bool tiedWhole = gradients >= 3;
    uint32_t phaseEnd = 0;
    for (const ArenaBuffer &b : phase)
      phaseEnd = std::max(phaseEnd, b.dies);
    bool tiedSeen = false;
    auto releaseBefore = [&](uint32_t op) {
      while (!live.empty() && std::get<0>(live.front()) < op) {
        arenas[std::get<3>(live.front())].release(std::get<1>(live.front()),
                                                  std::get<2>(live.front()));
        std::pop_heap(live.begin(), live.end(), later);
        live.pop_back();
      }
    };
    auto place = [&](uint32_t op, uint32_t dies, int64_t bytes, int ai) {
      releaseBefore(op);
      int64_t off = arenas[ai].allocate(bytes);
      live.emplace_back(dies, off, bytes, ai);
      std::push_heap(live.begin(), live.end(), later);
      lifetimes[ai].push_back({op, dies, bytes});
    };
    for (const ArenaBuffer &b : phase) {
      // The stage's own buffers: one read by another stage crosses the
      // cut (the stage's output), one the phase returns is saved.
      if (b.pos < lo || b.pos >= hi || b.escapes || b.firstReader < lo ||
          b.lastReader >= hi)
        continue;
      if ((b.wholeForScatter && gradients < 3) ||
          (b.intoState == 1 && gradients < 2) ||
          (b.intoState == 2 && gradients < 1) || (b.manyRows && rows <= 1) ||
          (b.gathered && !gathers))
        continue;
      auto bytes = static_cast<int64_t>(static_cast<double>(b.bytes) *
                                        (b.perRow ? rows : 1.0));
      int ai = !together && b.perRow ? 1 : 0;
      uint32_t dies = b.sumsTied ? std::min(b.dies, stageEnd) : b.dies;
      if (tiedWhole && b.intoState == 2) {
        dies = phaseEnd + 1;
        tiedSeen = true;
      }
      place(b.op, dies, bytes, ai);
      // (Its f32 copy beside it, reduce-scattered: the one-row probe kept
      // the gradient in 16 bits, written once. Left out, Llama-3 8B's
      // ZeRO-2 and 3 plans were 2-3% under: its LM head's.)
      if (gradients >= 3 && b.intoState && b.widened)
        place(b.op, dies, 2 * bytes, ai);
    }
    if (tiedSeen && p.tiedGrad > 0)
      place(phaseEnd + 1, phaseEnd + 1, p.tiedGrad, 0);
    // Laid out by size too (layOutBySize), as pcc-plan-memory does, the
    // smaller kept: on the last stage (and without a pipeline) every
    // buffer in one arena, as its program lays them out; before it each
    // arena on its own. (By size over both arenas, a stage before the
    // last came out up to 2% under: its program merges W into B in its
    // own order.)
    auto bySize = [&](const std::vector<ArenaInterval> &buffers) {
      int64_t peak = 0;
      layOutBySize(buffers, kArenaAlignment, peak);
      return peak;
    };
    int64_t arena = 0;
    if (hi >= p.size()) {
      std::vector<ArenaInterval> all = lifetimes[0];
      all.insert(all.end(), lifetimes[1].begin(), lifetimes[1].end());
      arena = std::min(arenas[0].getPeak() + arenas[1].getPeak(), bySize(all));
    } else {
      for (int ai = 0; ai < 2; ++ai)
        arena += std::min(arenas[ai].getPeak(), bySize(lifetimes[ai]));
    }
    largest = std::max(largest, static_cast<double>(arena));
  }
  return largest;
}

} // namespace mlir::pcc::autoplan
