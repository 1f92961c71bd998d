//===- Compile.cpp - the compile pipeline ---------------------------------===//

#include "pcc/Pipelines/Compile.h"
#include "MemoryFit.h"

#include "pcc/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Transforms/Passes.h"
#include "llvm/ADT/StringExtras.h"

using namespace mlir;
using namespace mlir::pcc;

/// The stage cut and the micro-batch schedule of --pp.
static void addPipelineCut(OpPassManager &pm, const CompileOptions &o,
                           bool groupedTransfers) {
  PipelineCutOptions cut;
  cut.emitRemarks = o.emitRemarks;
  cut.chunks = o.ppChunks;
  cut.cuts.assign(o.ppCuts.begin(), o.ppCuts.end());
  // CPU ranks' stages are balanced for a CPU core; GPU (and --target=all)
  // libraries for the GPU.
  cut.device = o.target == DeviceTarget::Cpu ? "cpu" : "gpu";
  pm.addPass(createPipelineCut(cut));
  PipelineScheduleOptions sched;
  sched.policy = o.getSchedule();
  sched.microbatches = o.microbatches;
  sched.groupedTransfers = groupedTransfers;
  pm.addPass(createPipelineSchedule(sched));
}

/// The training step: loss, then (cut first, so that the loss lands on the
/// last stage) the differentiation of each stage, or of the whole step.
static void addTraining(OpPassManager &pm, const CompileOptions &o,
                        const MemoryChoices &choices) {
  TrainModeOptions trainMode;
  trainMode.dataParallel = o.dp;
  pm.addNestedPass<func::FuncOp>(createTrainMode(trainMode));
  LossOptions loss;
  loss.kind = o.getLoss();
  loss.ignoreIndex = o.getIgnoreIndex();
  loss.fuseHeadBytes = choices.fuseHeadBytes;
  loss.microbatches = o.microbatches;
  pm.addPass(createLoss(loss));
  pm.addPass(createCanonicalizerPass());
  // A schedule places each stage's forward and backward phases. GPU ranks
  // run each list's transfers as NCCL groups, which the schedule pass
  // checks cannot deadlock.
  if (o.pp > 1)
    addPipelineCut(pm, o, /*groupedTransfers=*/o.target != DeviceTarget::Cpu);
  // The whole step's phases, or each stage's and each pipeline rank's.
  AutodiffOptions autodiff;
  for (StringRef r : llvm::split(StringRef(choices.recompute), ','))
    autodiff.recompute.push_back(r.str());
  autodiff.frozen.assign(o.frozen.begin(), o.frozen.end());
  autodiff.emitRemarks = o.emitRemarks;
  pm.addPass(createAutodiff(autodiff));
  OptimizerOptions optimizer;
  optimizer.kind = o.getOptimizer();
  pm.addPass(createOptimizer(optimizer));
  pm.addPass(createCanonicalizerPass());
  pm.addPass(createCSEPass());
  pm.addNestedPass<func::FuncOp>(createMergeStateLoads());
}

/// --bucket-mb as the data-parallel pass's bucket bytes (-1: chosen from
/// the model, 0: none).
static int64_t bucketBytes(const CompileOptions &o) {
  // An offloaded optimizer's buckets are untried on GPUs. A pipelined
  // step's gradient all-reduce (ZeRO 0) or reduce-scatter (1-3) starts in
  // its last W pass when asked for (every gradient its own bucket). ZeRO
  // 1-3's started reduce-scatters hide nothing on CPU ranks (MPI moves them
  // only in its calls; docs/benchmarks.md).
  if (o.isOffloading() && !o.bucketMb)
    return 0;
  // bf16 gradient sums are blocking collectives (buckets sum in place).
  if (o.gradReduce == "bf16")
    return 0;
  if (o.pp > 1)
    return o.bucketMb && *o.bucketMb != 0 ? -1 : 0;
  if (o.bucketMb && *o.bucketMb >= 0)
    return static_cast<int64_t>(*o.bucketMb * 1048576.0);
  if (o.zero > 0 && o.target == DeviceTarget::Cpu && !o.bucketMb)
    return 0;
  return -1;
}

void mlir::pcc::buildCompilePasses(OpPassManager &pm, const CompileOptions &o,
                                   const MemoryChoices &choices) {
  buildImportCleanupPipeline(pm);
  if (o.fuseAttention) {
    FuseAttentionOptions attention;
    attention.tensorParallel = o.tp;
    pm.addNestedPass<func::FuncOp>(createFuseAttention(attention));
    pm.addPass(createCanonicalizerPass());
  }
  if (o.microbatches * o.dp > 1) {
    // The model is imported at its whole batch; the analysis finds the rows
    // and rewrites the program to one micro-batch of one data-parallel rank
    // (micro-batch j of rank r: rows [(j dp + r) b, ...)).
    SplitBatchOptions split;
    split.microbatches = o.microbatches;
    split.dataParallel = o.dp;
    pm.addNestedPass<func::FuncOp>(createSplitBatch(split));
    pm.addPass(createCanonicalizerPass());
  }
  // Mixed precision on the model as imported, so that autodiff
  // differentiates its casts (autograd under torch.autocast).
  if (o.precision != "fp32") {
    AutocastOptions autocast;
    autocast.precision = o.precision;
    autocast.lossScale = o.lossScale.value_or("dynamic");
    pm.addNestedPass<func::FuncOp>(createAutocast(autocast));
    pm.addPass(createCSEPass());
  }
  if (o.train)
    addTraining(pm, o, choices);
  if (o.train && o.tp > 1) {
    // One plan for the whole step (each pipeline stage's), made on the
    // forward phase; every phase partitioned with it.
    PlanShardingOptions plan;
    plan.emitRemarks = o.emitRemarks;
    pm.addNestedPass<func::FuncOp>(createPlanSharding(plan, o.shardingMemo));
    PartitionTrainingOptions partition;
    partition.emitRemarks = o.emitRemarks;
    partition.sequenceParallel = o.sequenceParallel;
    pm.addPass(createPartitionTraining(partition));
    pm.addPass(createCanonicalizerPass());
    pm.addPass(createCSEPass());
    pm.addNestedPass<func::FuncOp>(createMergeStateLoads());
  }
  if (o.train && o.dp > 1) {
    DataParallelOptions data;
    data.dataParallel = o.dp;
    data.zero = o.zero;
    data.reshardAfterForward = choices.reshardAfterForward;
    data.prefetch = choices.prefetch;
    data.reduceEachMicrobatch = choices.reduceEachMicrobatch;
    data.bucketBytes = bucketBytes(o);
    data.gradReduce = o.gradReduce.value_or("fp32");
    pm.addPass(createDataParallel(data));
    pm.addPass(createCanonicalizerPass());
  }
  if (o.tp > 1 && !o.train) {
    PlanShardingOptions plan;
    plan.emitRemarks = o.emitRemarks;
    pm.addNestedPass<func::FuncOp>(createPlanSharding(plan, o.shardingMemo));
    PartitionOptions partition;
    partition.emitRemarks = o.emitRemarks;
    pm.addNestedPass<func::FuncOp>(createPartition(partition));
    pm.addPass(createCanonicalizerPass());
  }
  if (o.pp > 1 && !o.train)
    addPipelineCut(pm, o, /*groupedTransfers=*/true);
  if (o.precision != "fp32") {
    if (o.train)
      pm.addPass(createBf16WeightCopies());
    else
      pm.addPass(createBf16Weights());
    pm.addNestedPass<func::FuncOp>(createLegalizeBf16());
  }
  // After the 16-bit copies: the host's update writes each weight's copy
  // too (pcc.adamw_update ... copy), which the offload table must send
  // back to the device.
  if (o.isOffloading()) {
    pm.addPass(createOffloadOptimizer());
    pm.addPass(createCanonicalizerPass());
  }
  if (o.train)
    pm.addPass(createAssignFirstGradients());
  // bf16 gradients on the CPU (the CUDA kernels read f32 gradients).
  if (o.train && o.precision == "bf16" && o.target == DeviceTarget::Cpu)
    pm.addPass(createBf16Gradients());
  // W right after B (not zb-h1): one backward, each weight's gradient as
  // soon as its inputs are.
  if (o.train && o.pp > 1)
    pm.addPass(createMergeWeightGradients());
  if (o.tp * o.pp * o.dp > 1)
    pm.addPass(createCheckCollectives());
  if (o.planMemory) {
    pm.addNestedPass<func::FuncOp>(createFuseElementwise());
    PlanMemoryOptions plan;
    plan.cpu = o.target == DeviceTarget::Cpu;
    pm.addNestedPass<func::FuncOp>(createPlanMemory(plan));
  }
}

void mlir::pcc::buildCompilePipeline(OpPassManager &pm,
                                     const CompileOptions &o) {
  SetMeshOptions mesh;
  std::vector<std::string> axes = o.getMeshAxes();
  mesh.axes.assign(axes.begin(), axes.end());
  pm.addPass(createSetMesh(mesh));
  if (o.memCapBytes > 0)
    pm.addPass(createMemoryFitPass(o));
  else
    buildCompilePasses(pm, o, getDefaultMemoryChoices(o));
}
