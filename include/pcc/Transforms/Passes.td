//===- Passes.td - pcc transformation passes ---------------*- tablegen -*-===//

#ifndef PCC_TRANSFORMS_PASSES_TD
#define PCC_TRANSFORMS_PASSES_TD

include "mlir/Pass/PassBase.td"

def SetMesh : Pass<"pcc-set-mesh", "ModuleOp"> {
  let summary = "declares the module's device mesh";
  let description = [{
    Replaces the module's `pcc.mesh @mesh` (if any) with one of the given
    axes, slowest first (the rank grid's order: the last axis varies
    fastest). The first pass of `pcc-compile`: every later pass reads the
    mesh's axis sizes.

    ```mlir
    // pcc-opt --pcc-set-mesh='axes=dp=2,pp=1,tp=4'
    pcc.mesh @mesh [dp = 2, pp = 1, tp = 4]
    ```
  }];
  let options = [
    ListOption<"axes", "axes", "std::string",
               "name=size for each axis, slowest first">
  ];
  let dependentDialects = ["::mlir::pcc::PccDialect"];
}

def ModelStats : Pass<"pcc-model-stats", "func::FuncOp"> {
  let summary = "counts ops, weights and the FLOPs of matmuls and convolutions";
  let description = [{
    An analysis pass: it changes nothing and reports, as pass statistics
    (`--mlir-pass-statistics`) and, with `emit-remark`, as a remark on the
    function, what the cost model and the partitioner start from: the number
    of pcc ops, of distinct weights (`pcc.param` names) and their bytes, and
    the multiply-add FLOPs of `pcc.matmul` and `pcc.conv` (2 per MAC).

    ```mlir
    func.func @main(%x: tensor<2x64xf32>) -> tensor<2x256xf32> {
      %w = pcc.param "fc.weight" : tensor<256x64xf32>
      %y = pcc.matmul %x, %w {transpose_b} : tensor<2x64xf32>, tensor<256x64xf32> -> tensor<2x256xf32>
      return %y : tensor<2x256xf32>
    }
    // remark: 2 ops, 1 weights (65536 bytes), 65536 FLOPs
    ```
  }];
  let options = [
    Option<"emitRemark", "emit-remark", "bool", /*default=*/"false",
           "attach a remark with the summary to each function">
  ];
  let statistics = [
    Statistic<"numOps", "ops", "pcc ops in the function">,
    Statistic<"numWeights", "weights", "distinct weights (pcc.param names)">,
    Statistic<"weightBytes", "weight-bytes", "bytes of the distinct weights">,
    Statistic<"flops", "flops", "FLOPs of matmuls and convolutions">
  ];
}

def MergeStateLoads : Pass<"pcc-merge-state-loads", "func::FuncOp"> {
  let summary = "merges the loads of model state that read the same thing";
  let description = [{
    A `pcc.param` loads model state at its place, so CSE merges two loads
    only with no store between them, to any state (MLIR's CSE does not look
    at which state an op stores to). This pass replaces a load with an
    earlier one of the same state (name, type and shard) in the same block
    when no store to that state lies between them, or when it is used only
    to name the state that ops store to (the state operand of
    `pcc.accumulate` and the optimizer updates). The training passes leave
    one load per state and phase this way, as they expect.

    ```mlir
    // before
    %a = pcc.param "w@grad" : tensor<4xf32>
    pcc.accumulate %a, %d1 : tensor<4xf32>
    %b = pcc.param "w@grad" : tensor<4xf32>
    pcc.accumulate %b, %d2 : tensor<4xf32>
    // after: %b is %a (it only names the state stored to)
    ```
  }];
}

def FuseAttention : Pass<"pcc-fuse-attention", "func::FuncOp"> {
  let summary = "decomposed attention into pcc.attention";
  let description = [{
    Finds `softmax(scale * q k^T + bias) v` as the exporters write it (and
    as ONNX `Attention` imports): a product of q with k transposed (by the
    product's `transpose_b`, or by transposes between reshapes), splat
    scalings of q, of k or of the scores, additive masks, a softmax over the
    keys and the product with v, each intermediate used once. K and V
    repeated for grouped-query attention (`reshape`, `broadcast`, `reshape`)
    are read unrepeated. A constant mask that is exactly the causal one (0
    where key <= query, at most -1e30 elsewhere) becomes `causal`; another
    mask that no weight reaches is the bias, read at its unbroadcast shape.
    The match is left alone where the probabilities have another user, a
    dropout or a softcap intervenes, a mask depends on a weight, or a mask
    could empty a row of a softmax without `nan_to_zero`, or where
    `tensor-parallel` ranks would split the query heads but cannot split
    the key/value heads (grouped-query attention with fewer key/value heads
    than ranks: unfused, K and V are repeated and the repeats split, as
    Megatron keeps K and V whole).

    ```mlir
    // before
    %s = pcc.matmul %q, %k {transpose_b} : tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32> -> tensor<2x4x16x16xf32>
    %c = pcc.constant dense<0.353553385> : tensor<2x4x16x16xf32>
    %t = pcc.mul %s, %c : tensor<2x4x16x16xf32>
    %p = pcc.softmax %t axis = 3 {nan_to_zero} : tensor<2x4x16x16xf32>
    %o = pcc.matmul %p, %v : tensor<2x4x16x16xf32>, tensor<2x4x16x8xf32> -> tensor<2x4x16x8xf32>
    // after
    %o, %lse = pcc.attention %q, %k, %v scale = 0.3535533845424652 : ...
    ```
  }];
  let options = [
    Option<"tensorParallel", "tensor-parallel", "int64_t", "1",
           "the tp degree the program will be split over">,
  ];
  let dependentDialects = ["::mlir::pcc::PccDialect"];
}

def FuseElementwise : Pass<"pcc-fuse-elementwise", "func::FuncOp"> {
  let summary = "groups chains of elementwise ops into pcc.fusion ops";
  let description = [{
    Starting from each elementwise op (last first), absorbs producers that
    compute the same iteration shape and whose every user is already in the
    group: elementwise ops, broadcasts of smaller tensors (which then become
    index arithmetic instead of a copy) and splat constants. A group of two
    or more ops becomes one `pcc.fusion`, which the back end emits as a single
    loop. Casts stay unfused.

    ```mlir
    // before
    %b = pcc.broadcast %bias : tensor<64xf32> -> tensor<2x64xf32>
    %s = pcc.add %x, %b : tensor<2x64xf32>
    %r = pcc.relu %s : tensor<2x64xf32>
    // after
    %r = pcc.fusion (%x, %bias) : (tensor<2x64xf32>, tensor<64xf32>) -> tensor<2x64xf32> {
    ^bb0(%a: tensor<2x64xf32>, %c: tensor<64xf32>):
      %b = pcc.broadcast %c : tensor<64xf32> -> tensor<2x64xf32>
      %s = pcc.add %a, %b : tensor<2x64xf32>
      %r = pcc.relu %s : tensor<2x64xf32>
      pcc.yield %r : tensor<2x64xf32>
    }
    ```
  }];
  let dependentDialects = ["::mlir::pcc::PccDialect"];
}

def PlanMemory : Pass<"pcc-plan-memory", "func::FuncOp"> {
  let summary = "places every intermediate tensor in one arena, reusing "
                "memory whose tensor is dead";
  let description = [{
    Walks the function in order, computes each tensor's live range (its
    definition to its last use; `pcc.reshape` results alias their input and
    extend its range; returned values live to the end) and assigns offsets in
    one arena by best fit over the free gaps, aligned to `alignment` bytes.
    Function arguments, `pcc.param` and `pcc.constant` results need no arena
    space, and neither does a result the function returns: the generated
    code writes it straight into the caller's output buffer. Each op gets
    `pcc.buffer_offsets` (one offset per result, -1 for an alias, -2 for a
    returned result) and the function `pcc.arena_bytes` (the peak). An op
    without results (`pcc.accumulate`, `pcc.assign`) ends its operands'
    ranges like any other reader.

    With `cpu`, the plan is for the CPU back end alone, which computes some
    ops inside their one user (`getCpuDeferral` in Contracts.h: a product
    assigned whole to a state is computed in the state, a scatter-add in the
    state it is accumulated into, the squares of the gradient norm in its
    sum, a cast in the state it is assigned to): those get no buffer (-1),
    and their operands live to the user.

    ```mlir
    // before
    %0 = pcc.relu %x : tensor<256xf32>
    %1 = pcc.exp %0 : tensor<256xf32>
    %2 = pcc.neg %1 : tensor<256xf32>
    // after: %2 reuses %0's bytes, which are dead once %1 is computed
    %0 = pcc.relu %x {pcc.buffer_offsets = array<i64: 0>} : tensor<256xf32>
    %1 = pcc.exp %0 {pcc.buffer_offsets = array<i64: 1024>} : tensor<256xf32>
    %2 = pcc.neg %1 {pcc.buffer_offsets = array<i64: 0>} : tensor<256xf32>
    // func attribute: pcc.arena_bytes = 2048
    ```
  }];
  let options = [
    Option<"alignment", "alignment", "int64_t", /*default=*/"64",
           "byte alignment of every buffer">,
    Option<"emitRemark", "emit-remark", "bool", /*default=*/"false",
           "attach a remark with the arena size and the bytes saved by reuse">,
    Option<"cpu", "cpu", "bool", /*default=*/"false",
           "plan for the CPU back end alone: the ops it computes in their "
           "users get no buffer">
  ];
  let statistics = [
    Statistic<"arenaBytes", "arena-bytes", "peak bytes of the arena">,
    Statistic<"tensorBytes", "tensor-bytes",
              "bytes all intermediate tensors would take without reuse">
  ];
}

def PlanSharding : Pass<"pcc-plan-sharding", "func::FuncOp"> {
  let summary = "chooses how every weight and activation is split over a "
                "mesh axis";
  let description = [{
    For the mesh axis `axis` (default `tp`, its size from the module's
    `pcc.mesh`), decides the layout of every weight of rank >= 2:
    replicated, or one dimension split in some number of stripes (see
    `#pcc.shard`). Layouts of all other values follow from the weights
    through per-op rules (Sharding.h); where an op cannot read an operand
    in its layout, a collective converts it.

    The search is coordinate descent over the weights from all-replicated,
    trying every layout of one weight at a time until no change helps.
    Plans compare first by weight bytes every rank holds whole (the reason
    to ask for tensor parallelism), then by predicted time: compute divided
    over the ranks that share it plus collective time (latency + bytes over
    link bandwidth, ring factors). On a transformer block this finds the
    Megatron plan: QKV and the first MLP projection split by columns (the
    fused QKV in 3 stripes, so each rank has whole heads), attention output
    and second MLP projection split by rows, one all-reduce after each.

    Results: each weight of rank >= 2 and every op result gets a
    `pcc.sharding` attribute; with `emit-remarks`, each weight gets a remark
    with its layout and what the alternatives would cost, and the function
    one with the collectives and their bytes.

    ```mlir
    %w = pcc.param "fc1.weight" {pcc.sharding = [#pcc.shard<tp, dim = 1>]} : tensor<64x256xf32>
    ```
  }];
  let options = [
    Option<"axis", "axis", "std::string", /*default=*/"\"tp\"",
           "the mesh axis to split over">,
    Option<"emitRemarks", "emit-remarks", "bool", /*default=*/"false",
           "explain each weight's layout and the collectives as remarks">
  ];
  let dependentDialects = ["::mlir::pcc::PccDialect"];
}

def SplitBatch : Pass<"pcc-split-batch", "func::FuncOp"> {
  let summary = "rewrites a whole-batch program to one of m micro-batches, "
                "finding the batch by analysis";
  let description = [{
    Micro-batch k of a pipeline is rows `[k b, (k+1) b)` of dimension 0 of
    every input and output (b = batch / m). Instead of trusting names of
    symbolic dimensions, the pass proves that those rows are independent:
    it lays every input out split along dimension 0 over m pieces and
    propagates the split with the sharding rules (`Sharding.h`). The batch
    is sound when no op needs rows of another piece (no collective would
    be needed) and every output comes out split along its dimension 0;
    then the partition rewrite gives piece 0's program, which is every
    micro-batch's. So models exported with a fixed batch (Reshape targets
    and expanded constants with the batch written in) split as well as
    ones with a symbolic batch. Constants sliced along the batch must be
    the same for every micro-batch (an expanded position table is).

    Refused, naming the op or the output: an op that combines rows (a
    batch norm's statistics, a sum over the batch), inputs of different
    batches, an output whose batch is in another dimension (a
    sequence-first output: pcc-run puts micro-batches back together along
    dimension 0), a batch that does not divide.

    ```mlir
    func.func @main(%x: tensor<4x8xf32>) -> tensor<4x8xf32>   // m = 2 ->
    func.func @main(%x: tensor<2x8xf32>) -> tensor<2x8xf32>
    ```
  }];
  let options = [
    Option<"microbatches", "microbatches", "int64_t", /*default=*/"1",
           "micro-batches to split the batch into">,
    Option<"dataParallel", "dp", "int64_t", /*default=*/"1",
           "data-parallel ranks, each of which runs its share of every "
           "micro-batch (the program becomes one rank's micro-batch)">
  ];
  let dependentDialects = ["::mlir::pcc::PccDialect"];
}

def PartitionTraining : Pass<"pcc-partition-training", "ModuleOp"> {
  let summary = "rewrites every phase of a training module to one rank's "
                "local shapes";
  let description = [{
    Tensor parallelism for training: the autodiff, loss and optimizer passes
    have written the whole step (`@train_forward`, `@train_backward`,
    `@train_optimizer`, `@train_zero_grad`) for one device; this pass
    partitions all of it over mesh axis `axis` with one plan, as XLA's SPMD
    partitioner does after differentiation. The gradient flows need no
    rules of their own: where the backward phase reads a split activation
    against a split weight it computes a partial sum, and the all-reduce of
    Megatron's `f` operator is where that partial sum is read whole.

    - The weights' layouts are those `pcc-plan-sharding` recorded on
      `@train_forward`; every state tensor `<weight>@<kind>` (gradient,
      moments) takes its weight's layout.
    - The forward phase returns the loss whole and its saved activations
      in their layouts (partial sums reduced); the backward phase reads
      them in those layouts.
    - An op that writes state in place (`pcc.accumulate`, the optimizer
      updates, `pcc.zero`) works on the state's local piece: its other
      operands are brought to the state's layout.

    A pipelined step (pcc-autodiff on stages) is planned on each stage's
    forward phase (a weight on two stages keeps the first one's layout);
    each stage's F, B and W are partitioned in turn, values that cross a
    stage boundary whole, `saved<i>` and `stash<i>` in their layouts; the
    pipeline ranks' optimizers are rebuilt over the weights' pieces.
  }];
  let options = [
    Option<"axis", "axis", "std::string", /*default=*/"\"tp\"",
           "the mesh axis to partition over">,
    Option<"emitRemarks", "emit-remarks", "bool", /*default=*/"false",
           "report each phase's collectives and their bytes as remarks">,
    Option<"sequenceParallel", "sequence-parallel", "bool",
           /*default=*/"false",
           "Megatron's sequence parallelism: with the weights' layouts "
           "as planned, a partial sum read by an elementwise op or a norm "
           "may be reduce-scattered along a token dimension, and the "
           "residual stream split there (the module gets "
           "`pcc.sequence_parallel`)">
  ];
  let dependentDialects = ["::mlir::pcc::PccDialect"];
}

def CheckCollectives : Pass<"pcc-check-collectives", "ModuleOp"> {
  let summary = "proves that the ranks of every mesh group issue the same "
                "collectives";
  let description = [{
    pcc knows every rank's program: the training phases or `@main` (the
    same on every rank), or, in a pipeline, the stages each pipeline rank
    runs (stage k on rank k mod pp). For every mesh axis, the ranks of one
    group along it must issue the same collectives over that axis, in the
    same order, on the same types; a mismatch would hang the job or
    exchange the wrong data at run time. Along every axis but `pp` the
    members run one program, so this holds by construction; along `pp`
    the pass compares the pipeline ranks' stages, collective by
    collective, and refuses the first mismatch, naming both ranks, the
    collectives and their ONNX nodes.

    Communicators are created by the runtime in mesh-axis order on every
    rank, and pipeline transfers are matched by the schedule generator
    (`checkGroupedTransfers`), so they need no check here.
  }];
  let dependentDialects = ["::mlir::pcc::PccDialect"];
}

def Partition : Pass<"pcc-partition", "func::FuncOp"> {
  let summary = "rewrites a function to one rank's local shapes and inserts "
                "the collectives";
  let description = [{
    Reads the layouts of the weights from their `pcc.sharding` attributes
    (as `pcc-plan-sharding` left them, or written by hand), derives every
    other layout with the same rules, and rewrites the function to what one
    rank of mesh axis `axis` runs:
    - split weights become `pcc.param ... shard(#pcc.shard<...>)` of the
      local shape (the runtime reads only that slice);
    - every op gets local shapes (slice bounds and split sizes scaled);
    - where an operand's layout changes: `pcc.all_reduce` (partial sum to
      replicated), `pcc.all_gather` plus a transpose/reshape (split to
      replicated), `pcc.reduce_scatter` (partial sum to split), or a local
      slice: of the weight or constant where it is defined, else
      `pcc.shard_slice`;
    - results are returned replicated.

    ```mlir
    // before (tp = 2)
    %w = pcc.param "fc2.weight" {pcc.sharding = [#pcc.shard<tp, dim = 0>]} : tensor<256x64xf32>
    %y = pcc.matmul %h, %w : tensor<2x256xf32>, tensor<256x64xf32> -> tensor<2x64xf32>
    // after, with %h split on dim 1
    %w = pcc.param "fc2.weight" shard(#pcc.shard<tp, dim = 0>) : tensor<128x64xf32>
    %p = pcc.matmul %h, %w : tensor<2x128xf32>, tensor<128x64xf32> -> tensor<2x64xf32>
    %y = pcc.all_reduce %p axis = "tp" : tensor<2x64xf32>
    ```
  }];
  let options = [
    Option<"axis", "axis", "std::string", /*default=*/"\"tp\"",
           "the mesh axis to partition over">,
    Option<"emitRemarks", "emit-remarks", "bool", /*default=*/"false",
           "report the collectives inserted and their bytes as a remark">
  ];
  let statistics = [
    Statistic<"numAllReduce", "all-reduce", "pcc.all_reduce ops inserted">,
    Statistic<"numAllGather", "all-gather", "pcc.all_gather ops inserted">,
    Statistic<"numReduceScatter", "reduce-scatter",
              "pcc.reduce_scatter ops inserted">,
    Statistic<"commBytes", "comm-bytes",
              "bytes of the tensors the collectives carry, per run">
  ];
  let dependentDialects = ["::mlir::pcc::PccDialect"];
}

def PipelineCut : Pass<"pcc-pipeline-cut", "ModuleOp"> {
  let summary = "cuts @main into pipeline stages balanced by a cost model";
  let description = [{
    Splits `@main` into `stages` x `chunks` contiguous pieces (`stages`:
    the mesh's `pp` axis unless given), outlines each as `func.func @stage<k>` with
    `pcc.stage = k`, and leaves `@main` calling them in order, with a
    `pcc.transfer` from each stage to the next for every value a later
    stage reads (values for stages further on pass through the stages
    between, so every transfer is one hop, as the schedule's sends are).
    Weights and
    constants are cloned into each stage that reads them; graph inputs go
    to every stage that reads them; outputs come from the last stage.

    Cuts go where no more activation bytes are live than at the narrowest
    point between the model's first and last matmul (between transformer
    layers: only the residual stream). Among those, the cuts minimise the predicted time of
    the slowest stage (matmul FLOPs and other ops' memory traffic), then the
    bytes transferred. The rates are an H100's, or with `device=cpu` one
    CPU core's (pcc sets it for CPU ranks). Layers need not divide evenly
    by the stages: 3
    layers on 2 stages give 2 + 1 with the embedding and LM head weighed
    in. `cuts` forces the cuts after the named ONNX nodes instead.

    With `chunks` = v above 1 (the interleaved schedule), each pipeline
    rank holds v model chunks: the program is cut into pp x v stages,
    stage k runs on rank k mod pp, and the module records
    `pcc.pp_chunks = v`. Stage pp - 1 hands its activations to stage pp,
    back on rank 0.

    ```mlir
    // after, pp = 2
    func.func @main(%ids: tensor<2x16xi64>) -> tensor<2x16x512xf32> {
      %0 = call @stage0(%ids) : (tensor<2x16xi64>) -> tensor<2x16x64xf32>
      %1 = pcc.transfer %0 from 0 to 1 : tensor<2x16x64xf32>
      %2 = call @stage1(%1) : (tensor<2x16x64xf32>) -> tensor<2x16x512xf32>
      return %2 : tensor<2x16x512xf32>
    }
    func.func private @stage0(...) attributes {pcc.stage = 0 : i64} {...}
    ```
  }];
  let options = [
    Option<"stages", "stages", "int64_t", /*default=*/"0",
           "number of pipeline ranks (0: the size of the mesh's pp axis)">,
    Option<"chunks", "chunks", "int64_t", /*default=*/"1",
           "model chunks per pipeline rank: cut stages x chunks stages, "
           "stage k on rank k mod stages (the interleaved schedule)">,
    ListOption<"cuts", "cuts", "std::string",
               "cut after these ONNX nodes (stages x chunks - 1 of them, in "
               "order)">,
    Option<"emitRemarks", "emit-remarks", "bool", /*default=*/"false",
           "report each stage's ops, predicted time, weight and activation "
           "bytes, and the imbalance, as remarks">,
    Option<"device", "device", "std::string", /*default=*/"\"gpu\"",
           "the machine the stages are balanced for: gpu (an H100's rates) "
           "or cpu (one core's: GEMM FLOPs weigh more against memory "
           "traffic)">
  ];
  let statistics = [
    Statistic<"transferBytes", "transfer-bytes",
              "bytes the transfers carry per micro-batch">
  ];
  let dependentDialects = ["::mlir::pcc::PccDialect",
                           "::mlir::func::FuncDialect"];
}

def PipelineSchedule : Pass<"pcc-pipeline-schedule", "ModuleOp"> {
  let summary = "attaches the micro-batch schedule of a cut program";
  let description = [{
    Generates each pipeline rank's instruction list for `microbatches`
    micro-batches under `policy` (gpipe, 1f1b, interleaved, zb-h1; see
    include/pcc/Schedule/Schedule.h) and records it on `@main`, one string
    per rank, as the runtime will execute it. Inference runs the forward
    instructions (F and the activation transfers), in the order the policy
    gives them. A module cut into `pcc.pp_chunks` chunks per rank gets the
    interleaved schedule's chunk numbers ("F3.1": micro-batch 3 on the
    rank's chunk 1, stage 1 x pp + rank) and `chunks` in the attribute.

    ```mlir
    func.func @main(...) attributes {pcc.schedule = {microbatches = 2 : i64,
        policy = "1f1b", ranks = ["F0 send_fwd0>1 F1 send_fwd1>1",
                                  "recv_fwd0<0 F0 recv_fwd1<0 F1"]}}
    ```
  }];
  let options = [
    Option<"policy", "policy", "std::string", /*default=*/"\"1f1b\"",
           "gpipe, 1f1b, interleaved or zb-h1">,
    Option<"microbatches", "microbatches", "int64_t", /*default=*/"1",
           "micro-batches per batch">,
    Option<"groupedTransfers", "grouped-transfers", "bool", /*default=*/"true",
           "check the lists as NCCL runs them (the transfers between two "
           "computes as one group); off for MPI ranks, whose sends never "
           "wait for their receives">
  ];
  let dependentDialects = ["::mlir::pcc::PccDialect"];
}

//===----------------------------------------------------------------------===//
// Training
//===----------------------------------------------------------------------===//

def Autocast : Pass<"pcc-autocast", "func::FuncOp"> {
  let summary = "gives the model torch.autocast's bf16 or fp16 types";
  let description = [{
    Mixed precision (`--precision=bf16`), with the semantics of
    `torch.autocast(dtype=torch.bfloat16)` so that a user's PyTorch run and
    pcc's agree. Ops are visited in order:

    - products (`pcc.matmul`: PyTorch's `mm`, `bmm`, `matmul`, `linear`)
      cast their float operands to bf16 and give a bf16 result (fp32
      accumulation inside);
    - elementwise ops and data movement run in the type of their float
      operands: bf16 while all of them are bf16, f32 where f32 meets bf16
      (the bf16 ones cast; PyTorch's type promotion). A splat constant
      takes the other operand's type (a Python scalar does not promote),
      and a weight added to a bf16 value is a linear layer's bias, added
      in bf16 as `F.linear` does;
    - softmax, the norms, reductions and dropout on a bf16 input compute in
      f32 between casts and give a bf16 result, as PyTorch's bf16 kernels
      compute inside; so their gradients are computed in f32 too;
    - everything else (losses, convolutions for now) computes in f32;
    - the function's results keep their types.

    The casts are ops in the IR: `pcc-autodiff` differentiates them (the
    gradient of a cast is the cast back), so the backward pass runs in the
    forward's types and every gradient reaches its f32 weight in f32, as
    autograd does under autocast. The module records `pcc.precision`.

    `--precision=fp16` is the same with fp16 for bf16 (torch.autocast's op
    lists are the same for both). It also records `pcc.loss_scale`, the
    loss scaling its training needs (fp16's range ends at 65504, and small
    gradients flush to zero): `dynamic` starts at 2^16 and, like PyTorch's
    GradScaler, halves at each overflow and doubles after 2000 steps
    without one; `dynamic:N` starts at N; a number is a static scale.

    ```mlir
    %y = pcc.matmul %x, %w : tensor<8x64xf32>, tensor<64x32xf32> -> tensor<8x32xf32>
    %r = pcc.relu %y : tensor<8x32xf32>
    // becomes
    %xb = pcc.cast %x : tensor<8x64xf32> -> tensor<8x64xbf16>
    %wb = pcc.cast %w : tensor<64x32xf32> -> tensor<64x32xbf16>
    %yb = pcc.matmul %xb, %wb : tensor<8x64xbf16>, tensor<64x32xbf16> -> tensor<8x32xbf16>
    %r = pcc.relu %yb : tensor<8x32xbf16>
    ```

    Runs before the loss and autodiff, on the model as imported (and split
    into micro-batches).
  }];
  let options = [
    Option<"precision", "precision", "std::string", /*default=*/"\"bf16\"",
           "the products' element type: bf16, fp16 or fp32 (no change)">,
    Option<"lossScale", "loss-scale", "std::string",
           /*default=*/"\"dynamic\"",
           "fp16: dynamic (from 65536), dynamic:N (from N) or a static N">
  ];
  let dependentDialects = ["::mlir::pcc::PccDialect"];
}

def LegalizeBf16 : Pass<"pcc-legalize-bf16", "func::FuncOp"> {
  let summary = "computes in f32 what the back ends do not run on bf16";
  let description = [{
    After `pcc-autocast` and everything that builds ops from its types
    (autodiff, partitioning): an op with a bf16 operand or result that the
    back ends do not run on bf16 (reductions, softmax, norms, losses,
    optimizer updates) computes in f32 between casts: its bf16 operands
    widened (exactly), its bf16 results rounded once, as PyTorch's bf16
    kernels compute inside. Elementwise ops, data movement, products,
    casts, constants, collectives and transfers run on bf16 as they are.
    Cross-entropy and its gradient then read bf16 logits without their
    widened copy (the kernels widen each logit), and a gradient read only
    through a cast to bf16 is written in bf16 (rounded once, as the cast
    rounds it): the same numbers, three passes over the logits less.
  }];
  let dependentDialects = ["::mlir::pcc::PccDialect"];
}

def Bf16Weights : Pass<"pcc-bf16-weights", "ModuleOp"> {
  let summary = "stores in bf16 the weights an inference model reads as bf16";
  let description = [{
    Mixed-precision inference: a weight that every op reading it reads
    through a cast to bf16 (the products' weights and their biases) becomes
    a bf16 weight, so the library casts nothing per call and the weights
    file stores it in bf16 (half the bytes, rounded to nearest even as the
    cast would). Weights read in f32 too (norms, embeddings) stay f32.

    ```mlir
    %w = pcc.param "fc.weight" : tensor<8x8xf32>
    %wb = pcc.cast %w : tensor<8x8xf32> -> tensor<8x8xbf16>
    // becomes
    %wb = pcc.param "fc.weight" : tensor<8x8xbf16>
    ```
  }];
  let dependentDialects = ["::mlir::pcc::PccDialect"];
}

def Bf16WeightCopies : Pass<"pcc-bf16-weight-copies", "ModuleOp"> {
  let summary = "casts each weight to bf16 once per step, not per use";
  let description = [{
    Mixed-precision training, after the training passes: every cast of an
    f32 weight to bf16 in a micro-batch's phases (forward, backward, a
    pipeline stage's F, B and W) reads `<weight>@bf16` instead, a state
    that the zero-grad phase of the weight's pipeline rank (run at the
    start of every step) assigns once. The cast then happens once per
    weight per step instead of once per use and micro-batch. Where the
    weight's pipeline rank updates it whole with AdamW (not a ZeRO shard,
    not offloaded), the update writes the copy as it writes the weight
    (`pcc.adamw_update ... copy`), and the zero-grad phase casts only when
    the run says the copies are stale (`pcc.refresh_copy`: the first step,
    weights loaded or written since the last). A weight read
    through ZeRO-3's all-gather is cast before the gather instead (its
    piece, which the cast commutes with exactly), so that the gather moves
    bf16: half the bytes.

    ```mlir
    // @train_forward (and @train_backward):
    %w = pcc.param "fc.weight" : tensor<8x8xf32>
    %wb = pcc.cast %w : tensor<8x8xf32> -> tensor<8x8xbf16>
    // becomes
    %wb = pcc.param "fc.weight@bf16" : tensor<8x8xbf16>
    // and @train_zero_grad gains
    %w = pcc.param "fc.weight" : tensor<8x8xf32>
    %c = pcc.cast %w : tensor<8x8xf32> -> tensor<8x8xbf16>
    %copy = pcc.param "fc.weight@bf16" : tensor<8x8xbf16>
    pcc.assign %copy, %c : tensor<8x8xbf16>
    ```
  }];
  let dependentDialects = ["::mlir::pcc::PccDialect"];
}

def TrainMode : Pass<"pcc-train-mode", "func::FuncOp"> {
  let summary = "gives the program the semantics of torch.nn.Module.train()";
  let description = [{
    Runs first when pcc trains (after `pcc-split-batch`, so statistics are
    a micro-batch's, as in PyTorch's gradient accumulation). Every
    `pcc.batch_norm` whose running statistics are weights normalises with
    its batch's statistics instead, written as reductions and elementwise
    ops (so pcc-autodiff differentiates through them with their rules),
    and updates the running statistics in place with `pcc.ema_update`:
    the mean, and the variance with the unbiased correction n / (n - 1),
    weighted by ONNX's momentum (PyTorch's `1 - momentum`).

    ```mlir
    %y = pcc.batch_norm %x, %s, %b, %rm, %rv epsilon = 1.0E-5 : tensor<4x8x16x16xf32>, tensor<8xf32>
    // becomes
    %mean = pcc.reduce_mean %x axes = [0, 2, 3] {keep_dims} : ...
    %d = pcc.sub %x, (broadcast %mean)
    %var = pcc.reduce_mean (%d * %d) axes = [0, 2, 3] {keep_dims} : ...
    %y = %d * broadcast(1 / sqrt(%var + eps)) * broadcast(%s) + broadcast(%b)
    pcc.ema_update %rm, %mean momentum = 0.9 scale = 1.0 : tensor<8xf32>
    pcc.ema_update %rv, %var momentum = 0.9 scale = 1.0009775171065494 : tensor<8xf32>
    ```

    With `dp` above 1 (data parallelism: this program holds one rank's
    rows), the statistics are the global batch's, as PyTorch's
    SyncBatchNorm: each mean is a `pcc.reduce_sum`, a `pcc.all_reduce`
    over `dp` and a division by the global count, so a CNN trains the same
    at any dp. pcc-autodiff differentiates the all-reduce (its VJP is the
    all-reduce of the cotangent).
  }];
  let options = [
    Option<"dataParallel", "dp", "int64_t", /*default=*/"1",
           "ranks of the dp mesh axis the batch is split over">
  ];
  let dependentDialects = ["::mlir::pcc::PccDialect"];
}

def Loss : Pass<"pcc-loss", "ModuleOp"> {
  let summary = "appends the training loss to @main";
  let description = [{
    Rewrites `@main` to take the labels as a last input and return the sum
    of the per-example losses of its first output as a scalar:

    - `cross_entropy`: the first output's last dimension holds the logits
      of the classes; labels are integers of the other dimensions'
      shape, and `ignore-index` labels contribute nothing
      (`pcc.cross_entropy` on the logits viewed as `[N, V]`);
    - `mse`: labels are a float target of the output's shape; the sum of
      squared differences;
    - `none`: the first output already is the loss (a scalar).

    A cross-entropy whose logits are a matrix product of the hidden states
    and a rank-2 weight (an LM head), where the f32 logits take at least
    `fuse-head-bytes` (0, the default: always; -1: never), is
    `pcc.linear_cross_entropy`: the head's product and the loss in blocks
    of the vocabulary, without the `N x V` logits, the per-row loss its
    `lse - target` with the ignored rows masked. It saves the logits and
    their gradient for one more product of the head in the backward pass.

    The loss is a sum, not a mean: the runtime scales the gradient by one
    over the number of labels of the whole batch (over all micro-batches),
    so gradient accumulation and data parallelism give the mean over the
    global batch exactly, as `torch.nn.functional.cross_entropy` does. The
    module's `pcc.training` attribute records the loss and the number of
    micro-batches a step accumulates (`microbatches`).

    ```mlir
    func.func @main(%x: tensor<4x64xf32>, %labels: tensor<4xi64>) -> tensor<f32> {
      ...
      %l = pcc.cross_entropy %logits, %labels ignore_index = -100 : tensor<4x32xf32>, tensor<4xi64> -> tensor<4xf32>
      %s = pcc.reduce_sum %l axes = [0] : tensor<4xf32> -> tensor<f32>
      return %s : tensor<f32>
    }
    ```
  }];
  let options = [
    Option<"kind", "kind", "std::string", /*default=*/"\"cross_entropy\"",
           "cross_entropy, mse or none">,
    Option<"ignoreIndex", "ignore-index", "int64_t", /*default=*/"-100",
           "cross_entropy: the label value that is ignored">,
    Option<"fuseHeadBytes", "fuse-head-bytes", "int64_t", /*default=*/"0",
           "cross_entropy: an LM head's product and the loss as one "
           "pcc.linear_cross_entropy (no N x V logits) where the f32 logits "
           "would take at least this many bytes (0: always, -1: never)">,
    Option<"microbatches", "microbatches", "int64_t", /*default=*/"1",
           "the micro-batches one step accumulates (recorded for the "
           "runtime)">
  ];
  let dependentDialects = ["::mlir::pcc::PccDialect"];
}

def Autodiff : Pass<"pcc-autodiff", "ModuleOp"> {
  let summary = "reverse-mode differentiation of the loss into phases";
  let description = [{
    Differentiates `@main`'s scalar loss (pcc-loss) with respect to every
    floating-point weight, with each op's rule from
    PccAutodiffOpInterface, and splits the result into two phases:

    - `@train_forward` (`pcc.phase = "forward"`): the inputs and labels
      in, the loss and the saved activations (residuals) out;
    - `@train_backward` (`pcc.phase = "backward"`): the residuals and the
      loss gradient (one over the global label count) in; each weight's
      gradient is added into its state `<weight>@grad` by
      `pcc.accumulate` as soon as the backward pass produces it (so
      gradient accumulation over micro-batches needs nothing more, and
      a tied weight receives both gradients).

    Residuals are exactly the values the rules declare as saved
    (`getSavedValues`; checked); weights and constants are read again in
    the backward phase instead of being saved. An op without a rule is an
    error naming its ONNX node.

    Autodiff runs on global shapes, after the batch is split into
    micro-batches and before any partitioning, so that the sharding
    planner sees forward and backward together (docs/design-notes.md,
    "Training").

    `recompute` trades compute for memory: `selective` saves only what
    contractions and lookups produce (matmul, conv, gather) and computes
    the ops after them again in the backward phase (elementwise ops,
    norms, softmax, dropout with its counter-based mask); `full` saves
    the phase's inputs and the residual stream where one layer hands over
    to the next (the narrowest points between layers, as the stage cut
    finds them) and computes each layer again when the backward reaches
    it.

    `frozen` weights get no gradient and no optimizer state, as a
    PyTorch parameter with `requires_grad=False` or a buffer; the rotary
    embeddings' `inv_freq` (a buffer the dynamo exporter writes as an
    initializer) are frozen by default.

    On a step pcc-pipeline-cut has cut into stages, each stage k is
    differentiated instead: `@stage<k>_forward` (the stage's outputs, then
    the values its backward reads), `@stage<k>_backward` (B: one cotangent
    per float output in, the cotangents of the float inputs received from
    stage k - 1 out, marked `pcc.grad_of`, then the values W reads,
    `stash<i>`) and `@stage<k>_weight_grad` (W: the weights' gradients
    added into state), all marked `pcc.pipeline_stage = k`. B and W are
    separate so that a schedule (ZB-H1) can run W later. `recompute` then
    takes one policy for every stage, or one per stage.
  }];
  let options = [
    ListOption<"recompute", "recompute", "std::string",
               "none, selective or full (default none); on a step cut into "
               "stages, one value for every stage or one per stage">,
    ListOption<"frozen", "frozen", "std::string",
               "weights held constant (no gradient, no optimizer state); "
               "the rotary embeddings' inv_freq buffers are by default">,
    Option<"emitRemarks", "remarks", "bool", /*default=*/"false",
           "a remark for each weight held constant by default">
  ];
  let dependentDialects = ["::mlir::pcc::PccDialect"];
}

def MergeWeightGradients : Pass<"pcc-merge-weight-gradients", "ModuleOp"> {
  let summary = "moves each stage's weight gradients (W) back into its "
                "backward (B) where the schedule runs W right after B";
  let description = [{
    pcc-autodiff splits a pipeline stage's backward in two so that a
    zero-bubble schedule can run W later; B then returns every value W
    reads (each layer's inputs and output cotangents), and all of them
    stay live from B's first op to W's end. Under GPipe, 1F1B and the
    interleaved schedules W runs right after its B, and that set is pure
    cost: Llama-3 70B with `--recompute=full`, 10 layers a stage, keeps
    25 GiB of it, more than the layer-by-layer recomputation saves.

    This pass moves W's ops into B, in W's order (its accumulations,
    gradient buckets and collectives are side effects), each right after
    the last of B's ops that defines one of its operands: a weight's
    gradient is computed as soon as B has its inputs, which die there. B
    stops returning W's values and W is left empty (the schedule still
    calls it). zb-h1 keeps its W.
  }];
  let dependentDialects = ["::mlir::pcc::PccDialect"];
}

def AssignFirstGradients : Pass<"pcc-assign-first-gradients", "ModuleOp"> {
  let summary = "writes a gradient where it is first accumulated, instead of zeroing it first";
  let description = [{
    Where the backward phase runs once per step (one micro-batch, no
    pipeline, no gradient buckets, ZeRO or offload), the zero-grad phase's
    `pcc.zero` of a gradient and the backward's first `pcc.accumulate` into
    it are one write: the accumulate becomes a `pcc.assign` and the zero
    goes. A tied weight's later accumulations stay. Each gradient is then
    written once instead of zeroed, read and written (GPT-2 124M: 500 MB
    of zeroing and of reads less per step). A gradient the forward phase
    touches, or that the backward reads before its first accumulation,
    keeps its zero.

    ```mlir
    // @train_zero_grad:
    pcc.zero %g : tensor<8x8xf32>            // removed
    // @train_backward:
    pcc.accumulate %g, %dw : tensor<8x8xf32> // becomes
    pcc.assign %g, %dw : tensor<8x8xf32>
    ```
  }];
  let dependentDialects = ["::mlir::pcc::PccDialect"];
}

def Bf16Gradients : Pass<"pcc-bf16-gradients", "ModuleOp"> {
  let summary = "keeps in bf16 a gradient that is one bf16 product's, widened";
  let description = [{
    Mixed precision on the CPU, after `pcc-assign-first-gradients`: a
    gradient state written once per step by a `pcc.assign` of a bf16 value
    widened to f32 (one micro-batch, one contribution: a product's weight
    gradient under autocast), and read only by the optimizer's squared norm
    and AdamW, holds exactly the bf16 values widened. It is stored in bf16:
    the assign writes the bf16 value as it is, the norm reads it through
    `pcc.sum_squares` and AdamW widens it as it reads it. The same bits
    (the widening is exact, and the squares are summed in the f32 norm's
    order), and per parameter 2 bytes of gradient memory less, no widening
    pass, and half the norm's reads. A gradient accumulated over
    micro-batches or contributions, summed over dp, offloaded or read by SGD
    stays f32.

    ```mlir
    // @train_backward:
    %w = pcc.cast %dw : tensor<8x8xbf16> -> tensor<8x8xf32>
    pcc.assign %g, %w : tensor<8x8xf32>   // becomes
    pcc.assign %g16, %dw : tensor<8x8xbf16>
    // @train_optimizer:
    %s = pcc.sum_squares %g16 : tensor<8x8xbf16> -> tensor<f32>
    pcc.adamw_update %p, %g16, %m, %v, %norm : tensor<8x8xf32>, tensor<f32>
    ```
  }];
  let dependentDialects = ["::mlir::pcc::PccDialect"];
}

def Optimizer : Pass<"pcc-optimizer", "ModuleOp"> {
  let summary = "builds the optimizer-step and zero-grad phases";
  let description = [{
    For every weight the backward phase accumulates a gradient into, adds
    its optimizer state (`<weight>@momentum_buffer` for SGD,
    `<weight>@exp_avg` / `<weight>@exp_avg_sq` for AdamW) and builds:

    - `@train_optimizer` (`pcc.phase = "optimizer"`): the global gradient
      norm (returned; clipping uses it) and one fused in-place update per
      weight (`pcc.sgd_update`, `pcc.adamw_update`), whose learning rate
      and other hyperparameters the runtime passes at each step;
    - `@train_zero_grad` (`pcc.phase = "zero_grad"`): `pcc.zero` on every
      gradient.

    After pcc-autodiff on a step cut into stages it builds, for pipeline
    rank r (stages r, r + p, ...), `@rank<r>_optimizer` and
    `@rank<r>_zero_grad`, marked `pcc.pipeline_rank = r`. The optimizer
    sums the gradients of weights held by several ranks (a tied embedding
    and head) over `pp`, counts each weight once in the global norm (a
    scalar all-reduce over `pp`), and updates the rank's weights.
    pcc-partition-training (tp) and pcc-data-parallel (dp, ZeRO) rebuild
    the per-rank phases over their pieces.
  }];
  let options = [
    Option<"kind", "kind", "std::string", /*default=*/"\"adamw\"",
           "sgd or adamw">
  ];
  let dependentDialects = ["::mlir::pcc::PccDialect"];
}

def DataParallel : Pass<"pcc-data-parallel", "ModuleOp"> {
  let summary = "sums the gradients over the dp mesh axis";
  let description = [{
    Runs after pcc-optimizer on a training program compiled for one data-
    parallel rank's rows (pcc-split-batch split the batch over dp x the
    micro-batches). Every rank accumulates its own gradients over its
    micro-batches (no communication during the backward passes, as DDP's
    `no_sync`); `@train_optimizer` then reads each gradient through a
    `pcc.all_reduce` over `dp`, in the order the backward phase produces
    them, before the global norm and the updates. The loss-gradient seed is
    one over the global batch's labels, so the sum is the global mean's
    gradient and every rank applies the same update.

    ```mlir
    %g = pcc.param "fc1.weight@grad" : tensor<256x64xf32>
    %r = pcc.all_reduce %g axis = "dp" : tensor<256x64xf32>
    pcc.adamw_update %p, %r, %m, %v, %norm : tensor<256x64xf32>, tensor<f32>
    ```

    With `zero` 1 to 3 (ZeRO, Rajbhandari et al. 2020) the model state of
    each trained weight is sharded flat over dp (`#pcc.shard<dp, flat>`):
    flattened, padded with zeros to dp x s elements, rank r keeping
    elements `[r s, (r + 1) s)`. Stage 1 shards the optimizer state: the
    optimizer reduce-scatters each gradient, updates this rank's piece of
    the weight (`<weight>@master`), and all-gathers the pieces into the
    whole weight with `pcc.assign`. Stage 2 also shards the gradients: the
    backward phase reduce-scatters each weight gradient as it produces it
    and accumulates the piece. Stage 3 also shards the weights: the forward
    and backward phases all-gather a weight where they read it, and the
    optimizer updates the pieces in place. The global gradient norm sums
    each rank's pieces and all-reduces the scalar, so every element counts
    once.

    ```mlir
    %g = pcc.param "fc1.weight@grad" : tensor<256x64xf32>
    %f = pcc.reshape %g : tensor<256x64xf32> -> tensor<2x8192xf32>
    %s = pcc.reduce_scatter %f axis = "dp" : tensor<2x8192xf32> -> tensor<8192xf32>
    %p = pcc.param "fc1.weight@master" shard(#pcc.shard<dp, flat>) of [256, 64] : tensor<8192xf32>
    pcc.adamw_update %p, %s, %m, %v, %norm : tensor<8192xf32>, tensor<f32>
    %w = pcc.all_gather %p axis = "dp" : tensor<8192xf32> -> tensor<2x8192xf32>
    ```

    A pipelined step (pcc-autodiff on stages, maybe partitioned over tp
    first): every pipeline rank's optimizer is rebuilt over dp (tied
    weights summed over pp, the norm over tp, dp and pp). Stages 2 and 3
    accumulate each gradient whole through the step's micro-batches and
    the optimizer reduce-scatters it once per step, or, with
    `reduce-each-microbatch`, each W phase reduce-scatters it into the
    rank's piece (sharded gradients, m times the traffic). Stage 3 gathers
    the weights in every F, B and W phase, or, with
    `reshard-after-forward=false`, once per step into `<weight>@gathered`
    in the zero-grad phase. With `bucket-bytes` (any non-zero value: each
    gradient is its own bucket), the W phase that completes a gradient in
    the step's last micro-batch starts its all-reduce (stage 0) or its
    in-place reduce-scatter (stages 1 to 3, when its elements divide over
    dp) with `pcc.bucket_start`, and the optimizer waits once.

    With `prefetch` N > 0 (stage 3), each weight's all-gather becomes a
    `pcc.all_gather_start` begun N gathers earlier in program order (right
    after the wait of the gather N places before it) and completed by a
    `pcc.wait_collectives` where the blocking gather was.

    ```mlir
    %p1 = pcc.param "fc2.weight" shard(#pcc.shard<dp, flat>) of [256, 256] : tensor<32768xf32>
    %s1 = pcc.all_gather_start %p1 axis = "dp" : tensor<32768xf32> -> tensor<2x32768xf32>
    ... (fc1's bias-add and GELU)
    %g1 = pcc.wait_collectives axis = "dp"(%s1) reading(%p1)
        : (tensor<2x32768xf32>), (tensor<32768xf32>) -> tensor<2x32768xf32>
    ```
  }];
  let options = [
    Option<"dataParallel", "dp", "int64_t", /*default=*/"1",
           "ranks of the dp mesh axis">,
    Option<"gradReduce", "grad-reduce", "std::string", /*default=*/"\"fp32\"",
           "the type the gradients are summed over dp in: fp32, or bf16 "
           "(each gradient cast to bf16 before its all-reduce or "
           "reduce-scatter and widened after: half the bytes; blocking "
           "collectives only, no buckets)">,
    Option<"zero", "zero", "int64_t", /*default=*/"0",
           "ZeRO stage: 0 replicates the model state, 1 shards the "
           "optimizer state, 2 also the gradients, 3 also the weights">,
    Option<"reshardAfterForward", "reshard-after-forward", "bool",
           /*default=*/"true",
           "ZeRO 3: gather each weight again in the backward phase "
           "(FSDP's default); false keeps the forward phase's gathered "
           "weights as saved values until the backward phase (more "
           "memory, one gather per weight and micro-batch)">,
    Option<"reduceEachMicrobatch", "reduce-each-microbatch", "bool",
           /*default=*/"false",
           "a pipelined step under ZeRO 2 or 3: reduce-scatter each "
           "micro-batch's gradients in its W phases into sharded "
           "accumulators, instead of accumulating them whole and "
           "reduce-scattering once per step">,
    Option<"prefetch", "prefetch", "int64_t", /*default=*/"0",
           "ZeRO 3: start each weight's all-gather this many gathers "
           "ahead, so that it overlaps the compute before its use (0: "
           "each gathered where it is read, blocking)">,
    Option<"bucketBytes", "bucket-bytes", "int64_t", /*default=*/"0",
           "gradient buckets of about this many bytes (-1: chosen from "
           "the model; in a pipelined step any non-zero value, each "
           "gradient its own bucket), whose sums over dp start while the "
           "backward pass goes on (0: none, every collective blocking)">
  ];
  let dependentDialects = ["::mlir::pcc::PccDialect"];
}

def OffloadOptimizer : Pass<"pcc-offload-optimizer", "ModuleOp"> {
  let summary = "moves the optimizer's update to the host (ZeRO-Offload)";
  let description = [{
    Runs last among the training passes. Splits `@train_optimizer` into:

    - `@train_optimizer_pre` (`pcc.phase = "optimizer_pre"`, on the
      device): the collectives that do not depend on an update (the
      gradients' reduce-scatter, the norm's all-reduce) and what they read;
      its results are the values the update reads from it;
    - `@train_optimizer` (on the host): everything else: the norm, the
      clipping and every weight's update, over host copies of the state;
    - `@train_optimizer_post` (`pcc.phase = "optimizer_post"`, on the
      device): the collectives that read updated state (ZeRO's all-gather
      of the weights) and what follows from them.

    The module's `pcc.training` gains `offload = {host, to_host,
    to_device}`: the state that lives only in host memory (optimizer
    state), the state copied to the host before the update (gradients,
    weights the device wrote) and the state copied back after it (the
    updated weights or ZeRO shards). Refused, naming the op, when the
    update's ops and the device's collectives cannot be separated.
  }];
  let dependentDialects = ["::mlir::pcc::PccDialect"];
}

#endif // PCC_TRANSFORMS_PASSES_TD
