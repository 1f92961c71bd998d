//===- OffloadOptimizer.cpp - the optimizer's update on the host ----------===//
//
// pcc-offload-optimizer (`pcc --offload=optimizer`, ZeRO-Offload): the
// optimizer phase becomes three. The device keeps the collectives; the
// host runs the update over its own copies of the state:
//
//   @train_optimizer_pre   collectives that no update feeds, and their inputs
//   @train_optimizer       the rest (norm, clipping, updates), on the host
//   @train_optimizer_post  collectives that read updated state, and after
//
// Values the host reads from the pre phase cross as its results (e.g. the
// reduce-scattered gradient shards); state crosses through the copies the
// training attribute's `offload` entry lists.
//
//===----------------------------------------------------------------------===//

#include "pcc/Dialect/Pcc/IR/PccDialect.h"
#include "pcc/Dialect/Pcc/IR/PccInterfaces.h"
#include "pcc/Transforms/Passes.h"
#include "pcc/Transforms/Training.h"

#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/ADT/StringSet.h"

namespace mlir::pcc {
#define GEN_PASS_DEF_OFFLOADOPTIMIZER
#include "pcc/Transforms/Passes.h.inc"
} // namespace mlir::pcc

using namespace mlir;
using namespace mlir::pcc;

namespace {

/// The names of the state an op writes in place, by its effects (a
/// gradient, the optimizer's moments, the weight and its 16-bit copy that
/// pcc.adamw_update writes under mixed precision, a bucket).
SmallVector<StringRef> writtenState(Operation *op) {
  SmallVector<StringRef> names;
  for (ParamOp state : getStoredState(op))
    names.push_back(state.getName());
  return names;
}

/// Ops that must run where the communicators are: on the device.
bool onDevice(Operation *op) {
  return isa<CollectiveOpInterface, BucketStartOp, BucketWaitOp>(op);
}

/// Ops every phase that needs them gets a copy of.
bool isFree(Operation *op) { return isa<ParamOp, ConstantOp>(op); }

StringRef stateOf(Value v) {
  auto param = v.getDefiningOp<ParamOp>();
  return param ? param.getName() : StringRef();
}

enum class Place { Pre, Host, Post };

/// Where each op of the optimizer phase runs: on the device before any
/// update (Pre: device ops that no update feeds, with what they read), on
/// the host (the updates and what depends on them), or on the device after
/// the updates (Post: device ops after an update, and every op that uses
/// their results). Weights and constants are copied where needed.
DenseMap<Operation *, Place> placeOps(ArrayRef<Operation *> ops) {
  // Ops that depend on an update: the updates themselves, readers of state
  // an earlier op of the phase wrote, and their users.
  DenseSet<Operation *> afterUpdate;
  llvm::StringSet<> updated;
  for (Operation *op : ops) {
    bool depends = false;
    for (Value operand : op->getOperands()) {
      Operation *def = operand.getDefiningOp();
      depends |= def && afterUpdate.contains(def);
      StringRef state = stateOf(operand);
      depends |= !state.empty() && updated.contains(state);
    }
    if (isFree(op))
      depends = false;
    SmallVector<StringRef> written = writtenState(op);
    if (!written.empty() && !onDevice(op))
      depends = true;
    if (depends)
      afterUpdate.insert(op);
    for (StringRef w : written)
      updated.insert(w);
  }

  // Pre: device ops before any update, with what they read.
  DenseMap<Operation *, Place> place;
  std::function<void(Operation *)> pullIntoPre = [&](Operation *op) {
    if (isFree(op) || place.count(op))
      return;
    place[op] = Place::Pre;
    for (Value operand : op->getOperands())
      if (Operation *def = operand.getDefiningOp())
        pullIntoPre(def);
  };
  for (Operation *op : ops)
    if (onDevice(op) && !afterUpdate.contains(op))
      pullIntoPre(op);
  // Post: device ops after an update, and every op that uses their results.
  for (Operation *op : ops) {
    if (isFree(op) || place.count(op))
      continue;
    bool post = onDevice(op);
    for (Value operand : op->getOperands())
      if (Operation *def = operand.getDefiningOp())
        post |= place.lookup(def) == Place::Post && place.count(def);
    if (post)
      place[op] = Place::Post;
  }
  for (Operation *op : ops)
    if (!isFree(op) && !place.count(op))
      place[op] = Place::Host;
  return place;
}

/// The Pre phase's results the host reads. The Post phase may read only
/// state (through copies) and its own values; anything else is an error.
FailureOr<llvm::SetVector<Value>>
crossingValues(ArrayRef<Operation *> ops,
               const DenseMap<Operation *, Place> &place, func::ReturnOp ret) {
  llvm::SetVector<Value> crossing;
  for (Operation *op : ops) {
    if (isFree(op))
      continue;
    Place p = place.lookup(op);
    for (Value operand : op->getOperands()) {
      Operation *def = operand.getDefiningOp();
      if (!def || isFree(def))
        continue;
      Place from = place.lookup(def);
      if (from == p)
        continue;
      if (p == Place::Host && from == Place::Pre) {
        crossing.insert(operand);
        continue;
      }
      return op->emitError("offload: cannot put the optimizer's update on "
                           "the host: this op (")
             << (p == Place::Host ? "host" : "device")
             << ") reads a value of the "
             << (from == Place::Post ? "device's collectives after the update"
                                     : "host's update")
             << " that is not model state";
    }
  }
  for (Value v : ret.getOperands())
    if (Operation *def = v.getDefiningOp())
      if (!isFree(def) && place.lookup(def) == Place::Post)
        return ret.emitError("offload: the optimizer's result is computed "
                             "after its collectives");
  return crossing;
}

/// Records in pcc.training where each state tensor lives, from who reads
/// and writes it: only the `host` phase (host), written on the device and
/// read on the host (to_host), written on the host and read on the device
/// (to_device).
void recordOffloadTable(ModuleOp module, func::FuncOp host) {
  MLIRContext *ctx = module.getContext();
  llvm::StringSet<> hostRead, hostWritten, deviceRead, deviceWritten;
  module.walk([&](func::FuncOp f) {
    if (!f->hasAttr(kPhaseAttrName))
      return;
    bool onHost = f == host;
    f.walk([&](Operation *op) {
      if (auto param = dyn_cast<ParamOp>(op))
        (onHost ? hostRead : deviceRead).insert(param.getName());
      for (StringRef w : writtenState(op))
        (onHost ? hostWritten : deviceWritten).insert(w);
    });
  });
  SmallVector<Attribute> hostOnly, toHost, toDevice;
  SmallVector<StringRef> names;
  for (auto &entry : hostRead)
    names.push_back(entry.getKey());
  llvm::sort(names);
  for (StringRef name : names) {
    auto attr = StringAttr::get(ctx, name);
    if (!deviceRead.contains(name) && !deviceWritten.contains(name)) {
      hostOnly.push_back(attr);
      continue;
    }
    if (deviceWritten.contains(name))
      toHost.push_back(attr);
    if (hostWritten.contains(name))
      toDevice.push_back(attr);
  }
  auto list = [&](ArrayRef<Attribute> a) { return ArrayAttr::get(ctx, a); };
  setTrainingAttr(
      module,
      {NamedAttribute(
          StringAttr::get(ctx, "offload"),
          DictionaryAttr::get(
              ctx,
              {NamedAttribute(StringAttr::get(ctx, "host"), list(hostOnly)),
               NamedAttribute(StringAttr::get(ctx, "to_host"), list(toHost)),
               NamedAttribute(StringAttr::get(ctx, "to_device"),
                              list(toDevice))}))});
}

struct OffloadOptimizerPass
    : public mlir::pcc::impl::OffloadOptimizerBase<OffloadOptimizerPass> {
  using OffloadOptimizerBase::OffloadOptimizerBase;

  void runOnOperation() override {
    if (failed(offload(getOperation())))
      signalPassFailure();
  }

  LogicalResult offload(ModuleOp module);
};

LogicalResult OffloadOptimizerPass::offload(ModuleOp module) {
  auto opt = module.lookupSymbol<func::FuncOp>(kPhaseFunctions[2]);
  if (!opt || !opt.getBody().hasOneBlock() || opt.getNumArguments() != 0)
    return module.emitError("offload: expects the optimizer phase @")
           << kPhaseFunctions[2] << " (run pcc-optimizer first)";
  Block &block = opt.getBody().front();
  auto ret = cast<func::ReturnOp>(block.getTerminator());
  SmallVector<Operation *> ops;
  for (Operation &op : block.without_terminator())
    ops.push_back(&op);

  DenseMap<Operation *, Place> place = placeOps(ops);

  FailureOr<llvm::SetVector<Value>> crossing = crossingValues(ops, place, ret);
  if (failed(crossing))
    return failure();

  // Build the three functions.
  MLIRContext *ctx = module.getContext();
  OpBuilder mb(opt);
  Location loc = opt.getLoc();
  auto build = [&](StringRef name, StringRef phase, Place which,
                   ArrayRef<Value> args, ArrayRef<Value> results,
                   ArrayAttr resultAttrs) {
    SmallVector<Type> argTypes, resultTypes;
    for (Value a : args)
      argTypes.push_back(a.getType());
    for (Value r : results)
      resultTypes.push_back(r.getType());
    auto f = func::FuncOp::create(mb, loc, name,
                                  mb.getFunctionType(argTypes, resultTypes));
    f->setAttr(kPhaseAttrName, mb.getStringAttr(phase));
    for (unsigned i = 0; i < args.size(); ++i)
      f.setArgAttrs(
          i,
          DictionaryAttr::get(
              ctx, {NamedAttribute(
                       StringAttr::get(ctx, "pcc.name"),
                       StringAttr::get(ctx, "crossing" + std::to_string(i)))}));
    if (resultAttrs)
      f.setAllResultAttrs(resultAttrs);
    Block *body = f.addEntryBlock();
    IRMapping map;
    for (auto [a, arg] : llvm::zip(args, body->getArguments()))
      map.map(a, arg);
    OpBuilder b = OpBuilder::atBlockEnd(body);
    std::function<void(Value)> materialize = [&](Value v) {
      if (map.contains(v))
        return;
      Operation *def = v.getDefiningOp();
      for (Value operand : def->getOperands())
        materialize(operand);
      b.clone(*def, map);
    };
    for (Operation *op : ops) {
      if (isFree(op) || place.lookup(op) != which)
        continue;
      for (Value operand : op->getOperands())
        if (Operation *def = operand.getDefiningOp(); def && isFree(def))
          materialize(operand);
      b.clone(*op, map);
    }
    SmallVector<Value> mapped;
    for (Value r : results) {
      if (Operation *def = r.getDefiningOp(); def && isFree(def))
        materialize(r);
      mapped.push_back(map.lookup(r));
    }
    func::ReturnOp::create(b, loc, mapped);
    return f;
  };
  SmallVector<Value> crossed(crossing->begin(), crossing->end());
  SmallVector<Attribute> crossNames;
  for (unsigned i = 0; i < crossed.size(); ++i)
    crossNames.push_back(DictionaryAttr::get(
        ctx, {NamedAttribute(
                 StringAttr::get(ctx, "pcc.name"),
                 StringAttr::get(ctx, "crossing" + std::to_string(i)))}));
  func::FuncOp pre =
      build(kOffloadPhaseFunctions[0], kOffloadPhaseNames[0], Place::Pre, {},
            crossed, ArrayAttr::get(ctx, crossNames));
  func::FuncOp host =
      build(kPhaseFunctions[2], kPhaseNames[2], Place::Host, crossed,
            SmallVector<Value>(ret.getOperands()), opt.getAllResultAttrs());
  func::FuncOp post = build(kOffloadPhaseFunctions[1], kOffloadPhaseNames[1],
                            Place::Post, {}, {}, ArrayAttr());
  (void)pre;
  (void)post;
  opt.erase();

  recordOffloadTable(module, host);
  return success();
}

} // namespace
