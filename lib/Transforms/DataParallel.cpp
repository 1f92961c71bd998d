//===- DataParallel.cpp - gradients over the dp axis, ZeRO sharding -------===//
//
// pcc-data-parallel (see Passes.td). ZeRO 0: the optimizer phase reads every
// gradient through an all-reduce over dp, in backward order. ZeRO 1-3 shard
// model state flat over dp (#pcc.shard<dp, flat>): each weight's tensors
// are flattened and padded to dp x s elements, and rank r keeps elements
// [r s, (r + 1) s) of its optimizer state (1), also of its gradient (2),
// also of the weight itself (3).
//
//===----------------------------------------------------------------------===//

#include "StagePhases.h"
#include "pcc/Dialect/Pcc/IR/PccDialect.h"
#include "pcc/Transforms/Passes.h"
#include "pcc/Transforms/Training.h"

#include "llvm/ADT/MapVector.h"
#include "llvm/ADT/StringSet.h"

#include <map>

namespace mlir::pcc {
#define GEN_PASS_DEF_DATAPARALLEL
#include "pcc/Transforms/Passes.h.inc"
} // namespace mlir::pcc

using namespace mlir;
using namespace mlir::pcc;

namespace {

struct DataParallelPass
    : public mlir::pcc::impl::DataParallelBase<DataParallelPass> {
  using DataParallelBase::DataParallelBase;

  /// --grad-reduce: the type the gradients are summed over dp in (null:
  /// f32, as they are).
  Type reduceType() {
    return gradReduce == "bf16" ? BFloat16Type::get(&getContext()) : Type();
  }

  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (dataParallel <= 1)
      return;
    if (zero < 0 || zero > 3) {
      module.emitError("data parallel: ZeRO stage ")
          << static_cast<int64_t>(zero) << " is not 0 to 3";
      return signalPassFailure();
    }
    if (gradReduce != "fp32" && gradReduce != "bf16") {
      module.emitError("data parallel: grad-reduce '")
          << gradReduce << "' is not fp32 or bf16";
      return signalPassFailure();
    }
    if (!module.lookupSymbol(kPhaseFunctions[0]) &&
        llvm::any_of(module.getOps<func::FuncOp>(), [](func::FuncOp f) {
          return f->hasAttr(kPipelineStageAttrName);
        })) {
      if (reduceType()) {
        module.emitError("data parallel: grad-reduce=bf16 is not supported "
                         "in a pipeline yet");
        return signalPassFailure();
      }
      if (failed(runPipelined(module)))
        return signalPassFailure();
      setTrainingAttr(
          module, {NamedAttribute(
                      StringAttr::get(module.getContext(), "zero"),
                      IntegerAttr::get(
                          IntegerType::get(module.getContext(), 64), zero))});
      return;
    }
    func::FuncOp phases[4];
    for (int k = 0; k < 4; ++k) {
      phases[k] = module.lookupSymbol<func::FuncOp>(kPhaseFunctions[k]);
      if (!phases[k]) {
        module.emitError("data parallel: no @")
            << kPhaseFunctions[k] << " (run pcc-optimizer first)";
        return signalPassFailure();
      }
    }
    if (reduceType() && bucketBytes != 0) {
      module.emitError("data parallel: grad-reduce=bf16 with gradient "
                       "buckets is not supported yet (bucket-bytes=0)");
      return signalPassFailure();
    }
    if (failed(zero > 0           ? shard(phases, module)
               : bucketBytes != 0 ? bucketGradients(phases, module, nullptr)
                                  : allReduceGradients(phases[2])))
      return signalPassFailure();
    setTrainingAttr(
        module,
        {NamedAttribute(StringAttr::get(module.getContext(), "zero"),
                        IntegerAttr::get(
                            IntegerType::get(module.getContext(), 64), zero))});
  }

  /// A pipelined step (pcc-autodiff on stages, maybe partitioned over tp):
  /// every pipeline rank is replicated over dp. ZeRO 2 and 3 reduce-scatter
  /// the gradients once per step in the optimizer (accumulated whole over
  /// the micro-batches, as Megatron's distributed optimizer does), or each
  /// micro-batch's in its W phases (reduce-each-microbatch: sharded
  /// accumulators); ZeRO 3 gathers every weight where an F, B or W phase
  /// reads it (FSDP's resharding after forward, per micro-batch and phase)
  /// or once per step; every rank's optimizer is rebuilt over dp.
  LogicalResult runPipelined(ModuleOp module) {
    MLIRContext *ctx = module.getContext();
    if (bucketBytes != 0 && zero >= 2 && reduceEachMicrobatch)
      return module.emitError("data parallel: gradient buckets in a "
                              "pipelined step go with the gradients "
                              "reduced once per step");
    SmallVector<llvm::MapVector<StringRef, RankedTensorType>> held =
        rankWeights(module);
    FlatShards flat{ctx, dataParallel};
    llvm::StringSet<> weightNames, gradNames;
    // The tensor-parallel pieces (pcc-partition-training ran first), as
    // the W phases accumulate them.
    SmallVector<func::FuncOp> stagePhases;
    for (auto func : module.getOps<func::FuncOp>())
      if (func->hasAttr(kPipelineStageAttrName))
        stagePhases.push_back(func);
    for (auto &weights : held)
      for (auto &entry : weights) {
        weightNames.insert(entry.first);
        gradNames.insert(stateName(entry.first, "grad"));
      }
    for (func::FuncOp phase : stagePhases)
      phase.walk([&](ParamOp p) {
        ShardingAttr split = p.getShardAttr();
        if (!split || !split.isSplit() ||
            !weightNames.contains(splitStateName(p.getName()).first))
          return;
        flat.splits[splitStateName(p.getName()).first] = split;
        if (FailureOr<int64_t> n = getMeshAxisSize(p, split.getAxis());
            succeeded(n))
          flat.splitRanks = *n;
      });
    bool shardedGradients = zero >= 2 && reduceEachMicrobatch;
    // With buckets, each gradient's sum over dp (ZeRO 0) or reduce-scatter
    // (1-3, once per step) starts in the last micro-batch's W phase that
    // completes it.
    llvm::StringSet<> started;
    if (bucketBytes != 0)
      started = startGradientSums(stagePhases, gradNames);
    if (shardedGradients)
      for (func::FuncOp phase : stagePhases)
        if (auto name = phase->getAttrOfType<StringAttr>(kPhaseAttrName);
            name && name.getValue() == kWeightGradPhaseName)
          scatterGradientAccumulations(phase, flat, gradNames);
    // ZeRO 3 gathers each weight where a phase reads it; or, keeping the
    // weights gathered through the step (reshard-after-forward=false), the
    // zero-grad phase gathers each once per step into `<weight>@gathered`,
    // which every micro-batch's phases read.
    bool keep = zero == 3 && !reshardAfterForward;
    if (zero == 3)
      for (func::FuncOp phase : stagePhases) {
        SmallVector<ParamOp> reads;
        phase.walk([&](ParamOp p) {
          if (weightNames.contains(p.getName()) &&
              p.getShardAttr() == flat.splitOf(p.getName()))
            reads.push_back(p);
        });
        for (ParamOp p : reads) {
          OpBuilder b(p);
          Value whole =
              keep ? flat.local(b, p.getLoc(),
                                stateName(p.getName(), kGatheredState),
                                p.getType())
                   : flat.allGather(
                         b, p.getLoc(),
                         flat.param(b, p.getLoc(), p.getName(), p.getType()),
                         p.getType());
          p.getResult().replaceAllUsesWith(whole);
          p.erase();
        }
        if (!keep)
          prefetchGathers(phase, prefetch);
      }
    return buildRankPhases(module, held, flat, zero, keep, shardedGradients,
                           &started);
  }

  /// Pipelined buckets: in the W phases, after the accumulation that
  /// completes a gradient in the step's last micro-batch, its in-place
  /// all-reduce over dp (ZeRO 0) or in-place reduce-scatter (ZeRO 1-3:
  /// rank r's piece lands at its place r of the whole gradient) starts
  /// (`pcc.bucket_start` on the gradient's state, each gradient its own
  /// bucket), so that it overlaps the rest of the rank's backward work and
  /// the pipeline's drain; the optimizer phase waits. Only gradients that
  /// one W phase of one pipeline rank completes (W phases run in
  /// micro-batch order, so that phase's last micro-batch is the last
  /// accumulation), and under ZeRO 1-3 only those whose elements divide
  /// over dp (an in-place piece needs no padding); the rest stay summed in
  /// the optimizer. Returns the weights whose sums start early.
  llvm::StringSet<> startGradientSums(ArrayRef<func::FuncOp> phases,
                                      const llvm::StringSet<> &gradNames) {
    // (pipeline rank, gradient) -> the W phases accumulating it there.
    std::map<std::pair<int64_t, std::string>, int> writers;
    SmallVector<std::pair<func::FuncOp, AccumulateOp>> last;
    for (func::FuncOp phase : phases) {
      auto name = phase->getAttrOfType<StringAttr>(kPhaseAttrName);
      if (!name || name.getValue() != kWeightGradPhaseName)
        continue;
      auto stage = phase->getAttrOfType<IntegerAttr>(kPipelineStageAttrName);
      FailureOr<int64_t> pp = getMeshAxisSize(phase, kPipelineAxis);
      int64_t rank = stage && succeeded(pp) ? stage.getInt() % *pp : -1;
      llvm::MapVector<StringRef, AccumulateOp> lastHere;
      phase.walk([&](AccumulateOp acc) {
        auto state = acc.getState().getDefiningOp<ParamOp>();
        if (state && gradNames.contains(state.getName()))
          lastHere[state.getName()] = acc;
      });
      for (auto &[grad, acc] : lastHere) {
        ++writers[{rank, grad.str()}];
        last.push_back({phase, acc});
      }
    }
    llvm::StringSet<> shared;
    for (auto &[key, count] : writers)
      if (count > 1 || key.first < 0)
        shared.insert(key.second);
    llvm::StringSet<> started;
    for (auto &[phase, acc] : last) {
      auto state = acc.getState().getDefiningOp<ParamOp>();
      StringRef grad = state.getName();
      auto type = cast<RankedTensorType>(state.getType());
      int64_t n = type.getNumElements();
      if (shared.contains(grad) || (zero > 0 && n % dataParallel != 0))
        continue;
      OpBuilder b(acc->getContext());
      b.setInsertionPointAfter(acc);
      // The sum of the accumulated gradient: a load after the store.
      Value summed = b.clone(*state)->getResult(0);
      Value flatGrad = ReshapeOp::create(
          b, acc.getLoc(), RankedTensorType::get({n}, type.getElementType()),
          summed);
      BucketStartOp::create(
          b, acc.getLoc(), flatGrad, b.getStringAttr(kDataParallelAxis),
          zero > 0 ? b.getDenseI64ArrayAttr({0, n / dataParallel})
                   : DenseI64ArrayAttr());
      started.insert(splitStateName(grad).first);
    }
    return started;
  }

  /// ZeRO 0: each gradient the optimizer reads, all-reduced.
  LogicalResult allReduceGradients(func::FuncOp opt) {
    // pcc-optimizer reads the gradients first in backward order (the global
    // norm); after pcc-merge-state-loads each gradient is one pcc.param.
    SmallVector<ParamOp> grads;
    llvm::StringSet<> seen;
    opt.walk([&](ParamOp p) {
      if (splitStateName(p.getName()).second == "grad")
        grads.push_back(p);
    });
    for (ParamOp g : grads) {
      if (!seen.insert(g.getName()).second)
        return g.emitError("data parallel: gradient '")
               << g.getName()
               << "' is read by two pcc.param ops (run pcc-merge-state-loads first)";
      OpBuilder b(g->getContext());
      b.setInsertionPointAfter(g);
      Location loc = NameLoc::get(b.getStringAttr(
          "the gradient of '" + splitStateName(g.getName()).first + "'"));
      Value sent = narrowGradient(b, loc, g.getResult(), reduceType());
      Value sum =
          widenGradient(b, loc,
                        AllReduceOp::create(
                            b, loc, sent, b.getStringAttr(kDataParallelAxis)));
      g.getResult().replaceAllUsesExcept(sum, sent == g.getResult()
                                                  ? sum.getDefiningOp()
                                                  : sent.getDefiningOp());
    }
    return success();
  }

  /// ZeRO 0 with buckets (DDP's): the gradients, in the order the
  /// backward phase completes them, are laid out in buckets of about
  /// `bucketBytes` (each gradient a view of its bucket, 64-byte aligned);
  /// the backward phase starts a bucket's all-reduce right after its last
  /// gradient is accumulated (in the step's last micro-batch), and the
  /// optimizer phase waits for them before it reads any gradient.
  /// ZeRO 1 (`flat` given): each gradient's place in its bucket is padded to
  /// dp x s elements, and the bucket's start reduce-scatters each gradient
  /// in place instead, leaving this rank's piece at its place r.
  LogicalResult bucketGradients(func::FuncOp (&phases)[4], ModuleOp module,
                                const FlatShards *flat) {
    MLIRContext *ctx = module.getContext();
    // Each gradient's last accumulation, in program order.
    llvm::MapVector<StringRef, AccumulateOp> last;
    phases[1].walk([&](AccumulateOp acc) {
      auto state = acc.getState().getDefiningOp<ParamOp>();
      if (state && splitStateName(state.getName()).second == "grad")
        last[state.getName()] = acc;
    });
    SmallVector<std::pair<StringRef, AccumulateOp>> order(last.begin(),
                                                          last.end());
    llvm::stable_sort(order, [](auto &a, auto &b) {
      return a.second->isBeforeInBlock(b.second);
    });
    if (order.empty())
      return phases[1].emitError("data parallel: no gradient to bucket");
    auto typeOf = [&](StringRef name) {
      return cast<RankedTensorType>(last.lookup(name).getState().getType());
    };
    // The elements a gradient takes in its bucket.
    auto slot = [&](RankedTensorType type) {
      return flat ? flat->ranks * flat->piece(type) : type.getNumElements();
    };
    int64_t total = 0;
    for (auto &[name, acc] : order)
      total += slot(typeOf(name)) * 4;
    int64_t target = bucketTarget(bucketBytes, total);
    struct Bucket {
      SmallVector<StringRef> grads;
      SmallVector<int64_t> offsets, scatter;
      int64_t elements = 0;
      Type element;
    };
    SmallVector<Bucket> buckets;
    for (auto &[name, acc] : order) {
      RankedTensorType type = typeOf(name);
      if (buckets.empty() || buckets.back().elements * 4 >= target ||
          buckets.back().element != type.getElementType())
        buckets.push_back({{}, {}, {}, 0, type.getElementType()});
      Bucket &b = buckets.back();
      b.grads.push_back(name);
      b.offsets.push_back(b.elements);
      if (flat)
        llvm::append_values(b.scatter, b.elements, flat->piece(type));
      // 16 elements (64 bytes) aligned, as the kernels' vectors like it.
      b.elements += (slot(type) + 15) / 16 * 16;
    }
    // The buckets in the module (the library lays the gradients in them),
    // their starts in the backward phase, the waits in the optimizer's.
    Builder attrs(ctx);
    SmallVector<Attribute> table;
    OpBuilder wait = OpBuilder::atBlockBegin(&phases[2].getBody().front());
    for (Bucket &b : buckets) {
      std::string name =
          stateName(splitStateName(b.grads.front()).first, "bucket");
      auto type = RankedTensorType::get({b.elements}, b.element);
      SmallVector<Attribute> grads;
      for (StringRef g : b.grads)
        grads.push_back(attrs.getStringAttr(g));
      table.push_back(attrs.getDictionaryAttr({
          attrs.getNamedAttr("state", attrs.getStringAttr(name)),
          attrs.getNamedAttr("grads", attrs.getArrayAttr(grads)),
          attrs.getNamedAttr("offsets", attrs.getDenseI64ArrayAttr(b.offsets)),
      }));
      // After the last accumulation into any of its gradients.
      AccumulateOp latest = last.lookup(b.grads.front());
      for (StringRef g : b.grads)
        if (latest->isBeforeInBlock(last.lookup(g)))
          latest = last.lookup(g);
      OpBuilder start(latest->getContext());
      start.setInsertionPointAfter(latest);
      Location loc = NameLoc::get(attrs.getStringAttr(
          "the gradient bucket of '" + b.grads.front().str() + "' ...'" +
          b.grads.back().str() + "'"));
      Value bucket = ParamOp::create(start, loc, type,
                                     attrs.getStringAttr(name), ShardingAttr());
      BucketStartOp::create(
          start, loc, bucket, attrs.getStringAttr(kDataParallelAxis),
          flat ? attrs.getDenseI64ArrayAttr(b.scatter) : DenseI64ArrayAttr());
      // One wait completes every bucket (before any gradient is read).
      if (table.size() == 1) {
        Value waited = ParamOp::create(
            wait, loc, type, attrs.getStringAttr(name), ShardingAttr());
        BucketWaitOp::create(wait, loc, waited,
                             attrs.getStringAttr(kDataParallelAxis));
      }
    }
    setTrainingAttr(module,
                    {attrs.getNamedAttr("buckets", attrs.getArrayAttr(table))});
    return success();
  }

  /// ZeRO 1-3.
  LogicalResult shard(func::FuncOp (&phases)[4], ModuleOp module) {
    MLIRContext *ctx = module.getContext();
    FlatShards flat{ctx, dataParallel};
    func::FuncOp opt = phases[2];
    // The trained weights, in the order the optimizer updates them (the
    // order the backward phase produces their gradients), and whether the
    // optimizer is SGD.
    llvm::MapVector<StringRef, RankedTensorType> weights;
    bool sgd = false;
    for (Operation &op : opt.getBody().front()) {
      if (!isa<SgdUpdateOp, AdamwUpdateOp>(op))
        continue;
      sgd = isa<SgdUpdateOp>(op);
      auto p = op.getOperand(0).getDefiningOp<ParamOp>();
      weights.insert({p.getName(), p.getType()});
      // A tensor-parallel piece (pcc-partition-training ran first).
      if (ShardingAttr split = p.getShardAttr()) {
        if (!split.isSplit())
          return p.emitError("data parallel: weight '")
                 << p.getName() << "' is already sharded as " << split;
        FailureOr<int64_t> ranks = getMeshAxisSize(p, split.getAxis());
        if (failed(ranks))
          return failure();
        flat.splits[p.getName()] = split;
        flat.splitRanks = *ranks;
      }
    }
    if (weights.empty())
      return opt.emitError("data parallel: the optimizer updates no weight");
    llvm::StringSet<> gradNames;
    for (auto &entry : weights)
      gradNames.insert(stateName(entry.first, "grad"));

    // ZeRO 2 and 3: each gradient of a micro-batch is reduce-scattered as
    // the backward phase produces it, into this rank's piece of the
    // gradient state.
    if (zero >= 2) {
      scatterGradientAccumulations(phases[1], flat, gradNames, bucketBytes,
                                   reduceType());
      shardGradientZeros(phases[3], flat, gradNames);
    }
    // ZeRO 3: the forward and backward phases gather each weight where
    // they read it (FSDP's reshard after forward: the backward phase
    // gathers it again) and release it after its last use.
    // Without resharding after forward (FSDP's reshard_after_forward=False)
    // the forward phase returns each weight it gathered as a saved value,
    // and the backward phase reads that instead of gathering again.
    if (zero == 3) {
      llvm::MapVector<StringRef, Value> gathered;
      llvm::StringMap<Value> savedArgs;
      for (func::FuncOp phase : {phases[0], phases[1]}) {
        SmallVector<ParamOp> reads;
        phase.walk([&](ParamOp p) {
          if (p.getShardAttr() == flat.splitOf(p.getName()) &&
              weights.count(p.getName()))
            reads.push_back(p);
        });
        for (ParamOp p : reads) {
          OpBuilder b(p);
          Value whole;
          if (phase == phases[1] && savedArgs.count(p.getName())) {
            whole = savedArgs.lookup(p.getName());
          } else {
            Value piece = flat.param(b, p.getLoc(), p.getName(), p.getType());
            whole = flat.allGather(b, p.getLoc(), piece, p.getType());
            if (phase == phases[0] && !gathered.count(p.getName()))
              gathered[p.getName()] = whole;
          }
          p.getResult().replaceAllUsesWith(whole);
          p.erase();
        }
        prefetchGathers(phase, prefetch);
        if (phase != phases[0] || reshardAfterForward)
          continue;
        // Every gathered weight the backward phase will read is returned.
        llvm::StringSet<> readBack;
        phases[1].walk([&](ParamOp p) {
          if (p.getShardAttr() == flat.splitOf(p.getName()))
            readBack.insert(p.getName());
        });
        // In one order: forward result k + 1 is backward argument k, and
        // the loss gradient stays last.
        auto ret =
            cast<func::ReturnOp>(phases[0].getBody().front().getTerminator());
        func::FuncOp backward = phases[1];
        for (auto &[name, value] : gathered) {
          if (!readBack.contains(name))
            continue;
          auto attrs = DictionaryAttr::get(
              ctx,
              {NamedAttribute(StringAttr::get(ctx, "pcc.name"),
                              StringAttr::get(ctx, "gathered:" + name.str()))});
          if (failed(phases[0].insertResult(phases[0].getNumResults(),
                                            value.getType(), attrs)))
            return failure();
          ret->insertOperands(ret.getNumOperands(), value);
          unsigned at = backward.getNumArguments() - 1;
          if (failed(backward.insertArgument(at, value.getType(), attrs,
                                             value.getLoc())))
            return failure();
          savedArgs[name] = backward.getArgument(at);
        }
      }
    }

    // The optimizer phase, rebuilt over the pieces: the global norm from
    // each rank's pieces (every element counted once), the updates, and
    // for ZeRO 1 and 2 the all-gather of the updated pieces into the
    // weights every rank keeps whole.
    Block &body = opt.getBody().front();
    Location loc = opt.getLoc();
    body.clear();
    OpBuilder b = OpBuilder::atBlockEnd(&body);
    auto scalar = RankedTensorType::get({}, Float32Type::get(ctx));
    SmallVector<Value> grads;
    // Sums of squares of the pieces of tensor-parallel splits (distinct on
    // every tp rank) and of the rest (the same on every tp rank).
    Value splitTotal, total;
    for (auto &[name, type] : weights) {
      std::string gradName = stateName(name, "grad");
      Location loc =
          NameLoc::get(b.getStringAttr("the gradient of '" + name.str() + "'"));
      Value g;
      if (zero == 1 && bucketBytes != 0) {
        // Reduce-scattered in place in its bucket by the backward phase.
        g = flat.slice(b, loc, flat.local(b, loc, gradName, type));
      } else if (zero == 1) {
        Value whole = flat.local(b, loc, gradName, type);
        g = widenGradient(
            b, loc,
            flat.reduceScatter(b, loc,
                               narrowGradient(b, loc, whole, reduceType())));
      } else {
        g = flat.param(b, loc, gradName, type);
      }
      grads.push_back(g);
      Value sum = buildSquaredSum(b, loc, g);
      Value &into = flat.splitOf(name) ? splitTotal : total;
      into = into ? AddOp::create(b, loc, into, sum).getResult() : sum;
    }
    total = flat.combineNormTerms(b, loc, splitTotal, total);
    total = AllReduceOp::create(b, loc, scalar, total,
                                b.getStringAttr(kDataParallelAxis));
    Value norm = SqrtOp::create(b, loc, total);
    for (auto [i, entry] : llvm::enumerate(weights)) {
      auto &[name, type] = entry;
      Location loc =
          NameLoc::get(b.getStringAttr("the update of '" + name.str() + "'"));
      Value p = flat.param(
          b, loc, zero == 3 ? name.str() : stateName(name, kMasterState), type);
      buildOptimizerUpdate(b, loc, sgd ? "sgd" : "adamw", p, grads[i], norm,
                           [&](StringRef what) {
                             return flat.param(b, loc, stateName(name, what),
                                               type);
                           });
      if (zero < 3) {
        // The updated piece: a load after the update's store.
        Value updated =
            flat.param(b, loc, stateName(name, kMasterState), type);
        Value whole = flat.allGather(b, loc, updated, type);
        AssignOp::create(b, loc, flat.local(b, loc, name, type), whole);
      }
    }
    func::ReturnOp::create(b, loc, ValueRange{norm});
    if (zero == 1 && bucketBytes != 0)
      return bucketGradients(phases, module, &flat);
    return success();
  }
};

} // namespace

void mlir::pcc::prefetchGathers(func::FuncOp phase, int64_t depth) {
  if (depth <= 0)
    return;
  Block &body = phase.getBody().front();
  SmallVector<AllGatherOp> gathers;
  for (auto gather : body.getOps<AllGatherOp>())
    if (gather.getAxis() == kDataParallelAxis &&
        gather.getInput().getDefiningOp<ParamOp>())
      gathers.push_back(gather);
  SmallVector<Operation *> waits;
  for (auto [i, gather] : llvm::enumerate(gathers)) {
    auto param = gather.getInput().getDefiningOp<ParamOp>();
    OpBuilder b(phase.getContext());
    if (static_cast<int64_t>(i) < depth)
      b.setInsertionPointToStart(&body);
    else
      b.setInsertionPointAfter(waits[i - depth]);
    // The piece is read where the gather starts (the phase does not write
    // it), and kept unchanged until the wait.
    Value piece = b.clone(*param)->getResult(0);
    Location loc = gather.getLoc();
    auto start = AllGatherStartOp::create(b, loc, gather.getType(), piece,
                                          gather.getAxisAttr());
    b.setInsertionPoint(gather);
    auto wait = WaitCollectivesOp::create(
        b, loc, TypeRange{gather.getType()}, ValueRange{start.getResult()},
        ValueRange{piece}, gather.getAxisAttr());
    gather.getResult().replaceAllUsesWith(wait.getResult(0));
    gather.erase();
    if (param->use_empty())
      param.erase();
    waits.push_back(wait);
  }
}

int64_t mlir::pcc::bucketTarget(int64_t bucketBytes, int64_t total) {
  return bucketBytes > 0 ? bucketBytes
                         : std::clamp<int64_t>(total / 4, 64 << 10, 25 << 20);
}

Value mlir::pcc::narrowGradient(OpBuilder &b, Location loc, Value g,
                                Type reduceType) {
  auto type = cast<RankedTensorType>(g.getType());
  if (!reduceType || type.getElementType() == reduceType)
    return g;
  return CastOp::create(b, loc, type.clone(reduceType), g);
}

Value mlir::pcc::widenGradient(OpBuilder &b, Location loc, Value sum) {
  auto type = cast<RankedTensorType>(sum.getType());
  if (type.getElementType().isF32())
    return sum;
  return CastOp::create(b, loc, type.clone(b.getF32Type()), sum);
}

void mlir::pcc::scatterGradientAccumulations(func::FuncOp phase,
                                             const FlatShards &flat,
                                             const llvm::StringSet<> &grads,
                                             int64_t bucketBytes,
                                             Type reduceType) {
  // A tied weight (an embedding and an LM head) gets several gradients in
  // one phase: they are added up where the last is accumulated, so its
  // gradient is reduce-scattered once.
  llvm::MapVector<StringRef, SmallVector<AccumulateOp>> byState;
  phase.walk([&](AccumulateOp acc) {
    auto state = acc.getState().getDefiningOp<ParamOp>();
    if (state && grads.contains(state.getName()))
      byState[state.getName()].push_back(acc);
  });
  // Each gradient's sum, where its last accumulation was.
  struct Done {
    std::string name;
    RankedTensorType type;
    Value sum;
    Operation *at;
  };
  SmallVector<Done> done;
  for (auto &[name, group] : byState) {
    AccumulateOp acc = group.back();
    auto state = acc.getState().getDefiningOp<ParamOp>();
    OpBuilder b(acc);
    Location loc = acc.getLoc();
    Value sum = group.front().getValue();
    for (AccumulateOp other : ArrayRef(group).drop_front())
      sum = AddOp::create(b, loc, sum, other.getValue());
    for (AccumulateOp other : ArrayRef(group).drop_back()) {
      auto otherState = other.getState().getDefiningOp<ParamOp>();
      other.erase();
      if (otherState->use_empty())
        otherState.erase();
    }
    if (bucketBytes == 0) {
      Value piece = widenGradient(
          b, loc,
          flat.reduceScatter(b, loc, narrowGradient(b, loc, sum, reduceType)));
      Value sharded = flat.param(b, loc, state.getName(), state.getType());
      AccumulateOp::create(b, loc, sharded, piece);
    } else {
      // Where the sum is complete: a marker until the buckets are placed.
      Operation *at = ConstantOp::create(
          b, loc, getSplatAttr(RankedTensorType::get({}, b.getF32Type()), 0));
      done.push_back({state.getName().str(), state.getType(), sum, at});
    }
    acc.erase();
    if (state->use_empty())
      state.erase();
  }
  if (done.empty())
    return;
  llvm::stable_sort(done, [](const Done &a, const Done &b) {
    return a.at->isBeforeInBlock(b.at);
  });
  int64_t total = 0;
  for (const Done &d : done)
    total += flat.ranks * flat.piece(d.type) * 4;
  int64_t target = bucketTarget(bucketBytes, total);
  // Buckets in completion order; each starts after its last gradient.
  SmallVector<SmallVector<Done *>> buckets;
  int64_t filled = 0;
  for (Done &d : done) {
    if (buckets.empty() || filled >= target) {
      buckets.emplace_back();
      filled = 0;
    }
    buckets.back().push_back(&d);
    filled += flat.ranks * flat.piece(d.type) * 4;
  }
  // Completes bucket `k`'s reduce-scatters at `b` and accumulates them.
  SmallVector<SmallVector<Value>> stacked(buckets.size()),
      started(buckets.size());
  auto finish = [&](OpBuilder &b, size_t k) {
    Location loc = NameLoc::get(
        b.getStringAttr("the gradient bucket of '" + buckets[k].front()->name +
                        "' ...'" + buckets[k].back()->name + "'"));
    SmallVector<Type> types;
    for (Value v : started[k])
      types.push_back(v.getType());
    auto wait = WaitCollectivesOp::create(b, loc, types, started[k], stacked[k],
                                          b.getStringAttr(kDataParallelAxis));
    for (auto [d, piece] : llvm::zip(buckets[k], wait.getResults())) {
      Value sharded = flat.param(b, loc, d->name, d->type);
      AccumulateOp::create(b, loc, sharded, piece);
    }
  };
  for (size_t k = 0; k < buckets.size(); ++k) {
    Operation *at = buckets[k].back()->at;
    OpBuilder b(at);
    // One bucket in flight: the previous one completes before this starts.
    if (k > 0)
      finish(b, k - 1);
    for (Done *d : buckets[k]) {
      auto [input, piece] = flat.reduceScatterStart(b, d->at->getLoc(), d->sum);
      stacked[k].push_back(input);
      started[k].push_back(piece);
    }
  }
  OpBuilder end(phase.getBody().front().getTerminator());
  finish(end, buckets.size() - 1);
  for (Done &d : done)
    d.at->erase();
}

void mlir::pcc::shardGradientZeros(func::FuncOp phase, const FlatShards &flat,
                                   const llvm::StringSet<> &grads) {
  SmallVector<ZeroOp> zeros;
  phase.walk([&](ZeroOp z) { zeros.push_back(z); });
  for (ZeroOp z : zeros) {
    auto state = z.getState().getDefiningOp<ParamOp>();
    if (!state || !grads.contains(state.getName()))
      continue;
    OpBuilder b(z);
    ZeroOp::create(b, z.getLoc(),
                   flat.param(b, z.getLoc(), state.getName(), state.getType()));
    z.erase();
    if (state->use_empty())
      state.erase();
  }
}
