//===- Contracts.cpp - the typed training configuration and schedule ------===//
//
// `pcc.training` and `pcc.schedule` are dictionaries in the IR, so that each
// pass adds its entries and the IR stays readable; the dialect verifies
// them here, and everything that reads them takes the typed form.
//
//===----------------------------------------------------------------------===//

#include "pcc/Dialect/Pcc/IR/Contracts.h"
#include "pcc/Dialect/Pcc/IR/PccDialect.h"

#include "mlir/IR/BuiltinAttributes.h"
#include "llvm/ADT/STLExtras.h"

#include <cstdint>

using namespace mlir;
using namespace mlir::pcc;

namespace {

using EmitError = llvm::function_ref<InFlightDiagnostic()>;

LogicalResult readStrings(Attribute attr, StringRef what,
                          std::vector<std::string> &out, EmitError emitError) {
  auto list = dyn_cast_if_present<ArrayAttr>(attr);
  if (!list || !llvm::all_of(list, llvm::IsaPred<StringAttr>))
    return emitError() << what << " must be a list of strings";
  for (StringRef name : list.getAsValueRange<StringAttr>())
    out.push_back(name.str());
  return success();
}

LogicalResult readInt(Attribute attr, StringRef what, int64_t min, int64_t max,
                      int64_t &out, EmitError emitError) {
  auto value = dyn_cast_if_present<IntegerAttr>(attr);
  if (!value || value.getInt() < min || value.getInt() > max)
    return emitError() << what << " must be an integer in [" << min << ", "
                       << max << "]";
  out = value.getInt();
  return success();
}

LogicalResult readChoice(Attribute attr, StringRef what,
                         ArrayRef<StringRef> choices, std::string &out,
                         EmitError emitError) {
  auto value = dyn_cast_if_present<StringAttr>(attr);
  if (!value || !llvm::is_contained(choices, value.getValue())) {
    InFlightDiagnostic diag = emitError();
    diag << what << " must be one of";
    for (StringRef choice : choices)
      diag << " '" << choice << "'";
    return diag;
  }
  out = value.str();
  return success();
}

LogicalResult readBucket(Attribute attr, GradientBucket &bucket,
                         EmitError emitError) {
  auto dict = dyn_cast<DictionaryAttr>(attr);
  auto state = dict ? dict.getAs<StringAttr>("state") : StringAttr();
  auto grads = dict ? dict.get("grads") : Attribute();
  auto offsets = dict ? dict.getAs<DenseI64ArrayAttr>("offsets")
                      : DenseI64ArrayAttr();
  if (!state || !grads || !offsets || dict.size() != 3)
    return emitError() << "pcc.training buckets: each bucket must be "
                          "{grads = [...], offsets = array<i64: ...>, "
                          "state = \"...\"}";
  bucket.state = state.str();
  if (failed(readStrings(grads, "pcc.training bucket grads", bucket.grads,
                         emitError)))
    return failure();
  bucket.offsets.assign(offsets.asArrayRef().begin(),
                        offsets.asArrayRef().end());
  if (bucket.offsets.size() != bucket.grads.size() ||
      llvm::any_of(bucket.offsets, [](int64_t o) { return o < 0; }))
    return emitError() << "pcc.training bucket '" << bucket.state
                       << "': one offset (>= 0) per gradient";
  return success();
}

} // namespace

LogicalResult mlir::pcc::parseTrainingAttr(DictionaryAttr attr,
                                           TrainingConfig &config,
                                           EmitError emitError) {
  for (NamedAttribute entry : attr) {
    StringRef key = entry.getName().getValue();
    Attribute value = entry.getValue();
    LogicalResult ok = success();
    if (key == "loss") {
      ok = readChoice(value, "pcc.training loss",
                      {"cross_entropy", "mse", "none"}, config.loss,
                      emitError);
    } else if (key == "ignore_index") {
      int64_t index = 0;
      ok = readInt(value, "pcc.training ignore_index", INT64_MIN, INT64_MAX,
                   index, emitError);
      config.ignoreIndex = index;
    } else if (key == "microbatches") {
      ok = readInt(value, "pcc.training microbatches", 1, INT64_MAX,
                   config.microbatches, emitError);
    } else if (key == "optimizer") {
      ok = readChoice(value, "pcc.training optimizer", {"sgd", "adamw"},
                      config.optimizer, emitError);
    } else if (key == "weights") {
      ok = readStrings(value, "pcc.training weights", config.weights,
                       emitError);
    } else if (key == "tied") {
      ok = readStrings(value, "pcc.training tied", config.tied, emitError);
    } else if (key == "zero") {
      ok = readInt(value, "pcc.training zero", 0, 3, config.zero, emitError);
    } else if (key == "buckets") {
      auto list = dyn_cast<ArrayAttr>(value);
      if (!list)
        return emitError() << "pcc.training buckets must be a list";
      for (Attribute bucket : list)
        if (failed(readBucket(bucket, config.buckets.emplace_back(),
                              emitError)))
          return failure();
    } else if (key == "offload") {
      auto dict = dyn_cast<DictionaryAttr>(value);
      if (!dict)
        return emitError() << "pcc.training offload must be a dictionary";
      config.offloaded = true;
      for (NamedAttribute part : dict) {
        StringRef name = part.getName().getValue();
        std::vector<std::string> *list =
            name == "host"        ? &config.offloadHost
            : name == "to_host"   ? &config.offloadToHost
            : name == "to_device" ? &config.offloadToDevice
                                  : nullptr;
        if (!list)
          return emitError() << "pcc.training offload: unknown entry '"
                             << name << "' (host, to_host, to_device)";
        if (failed(readStrings(part.getValue(),
                               "pcc.training offload " + name.str(), *list,
                               emitError)))
          return failure();
      }
    } else {
      return emitError() << "pcc.training: unknown entry '" << key
                         << "' (loss, ignore_index, microbatches, optimizer, "
                            "weights, tied, zero, buckets, offload)";
    }
    if (failed(ok))
      return failure();
  }
  return success();
}

std::optional<TrainingConfig> mlir::pcc::getTrainingConfig(ModuleOp module) {
  auto attr = module->getAttrOfType<DictionaryAttr>(kTrainingAttrName);
  if (!attr)
    return std::nullopt;
  TrainingConfig config;
  // The verifier has checked the attribute; a reader of unverified IR gets
  // the error on the module.
  if (failed(parseTrainingAttr(attr, config,
                               [&] { return module.emitError(); })))
    return std::nullopt;
  return config;
}

//===----------------------------------------------------------------------===//
// Ops the CPU back end computes in their users
//===----------------------------------------------------------------------===//

namespace {

/// The op after `op` that does work (pcc.param loads are none).
Operation *nextWorker(Operation *op) {
  Operation *next = op->getNextNode();
  while (next && isa<ParamOp>(next))
    next = next->getNextNode();
  return next;
}

/// Element types the C++ back end stores (its ElementInfo table).
bool storable(Type t) {
  return isa<Float32Type, Float64Type, Float16Type, BFloat16Type>(t) ||
         t.isInteger(64) || t.isInteger(32) || t.isInteger(16) ||
         t.isInteger(8) || t.isInteger(1);
}

} // namespace

CpuDeferral
mlir::pcc::getCpuDeferral(Operation *op,
                          llvm::function_ref<bool(Value)> isReturned) {
  if (op->getNumResults() != 1 || !op->hasOneUse())
    return CpuDeferral::None;
  Value result = op->getResult(0);
  Operation *user = *op->getUsers().begin();
  if (user != nextWorker(op) || isReturned(result))
    return CpuDeferral::None;
  auto type = cast<RankedTensorType>(result.getType());
  if (auto product = dyn_cast<MatmulOp>(op)) {
    auto assign = dyn_cast<AssignOp>(user);
    if (!assign || assign.getValue() != result)
      return CpuDeferral::None;
    auto load = assign.getState().getDefiningOp<ParamOp>();
    // Not a product that reads the state it would overwrite.
    auto readsState = [&](Value v) {
      auto p = v.getDefiningOp<ParamOp>();
      return p && p.getName() == load.getName();
    };
    if (load && load->getBlock() == op->getBlock() &&
        load->isBeforeInBlock(op) &&
        llvm::none_of(op->getOperands(), readsState))
      return CpuDeferral::IntoState;
    return CpuDeferral::None;
  }
  if (auto mul = dyn_cast<MulOp>(op)) {
    auto sum = dyn_cast<ReduceSumOp>(user);
    if (sum && mul.getLhs() == mul.getRhs() && type.getElementType().isF32() &&
        static_cast<int64_t>(sum.getAxes().size()) == type.getRank())
      return CpuDeferral::SumSquares;
    return CpuDeferral::None;
  }
  if (isa<ScatterAddOp, ShardScatterAddOp>(op)) {
    if (isa<AssignOp, AccumulateOp>(user) &&
        user->getOperand(0).getType() == type && user->getOperand(1) == result)
      return CpuDeferral::ScatterInto;
    return CpuDeferral::None;
  }
  if (auto cast = dyn_cast<CastOp>(op)) {
    Type from = cast.getInput().getType().getElementType();
    Type to = type.getElementType();
    if (isa<AccumulateOp>(user))
      return (from.isBF16() || from.isF16()) && to.isF32() ? CpuDeferral::Widen
                                                           : CpuDeferral::None;
    if (isa<AssignOp>(user) && user->getOperand(1) == result &&
        storable(from) && storable(to))
      return CpuDeferral::CastInto;
  }
  return CpuDeferral::None;
}
