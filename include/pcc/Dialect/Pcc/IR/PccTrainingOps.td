//===- PccTrainingOps.td - gradients, losses, fused ops -----*- tablegen -*-===//
//
// The ops the training passes build (pcc-loss, pcc-autodiff,
// pcc-optimizer, pcc-data-parallel) and the fused kernels with their
// gradients (pcc.attention, pcc.linear_cross_entropy). Included by
// PccOps.td, whose base classes and traits these use; kept apart so that
// neither file grows past what one reads in a sitting.
//
//===----------------------------------------------------------------------===//

#ifndef PCC_DIALECT_PCC_IR_PCCTRAININGOPS_TD
#define PCC_DIALECT_PCC_IR_PCCTRAININGOPS_TD

//===----------------------------------------------------------------------===//
// Gradients and training (built by pcc-autodiff, pcc-loss, pcc-optimizer)
//===----------------------------------------------------------------------===//

def Pcc_ScatterAddOp : Pcc_Op<"scatter_add", [Pcc_RunsWhole, Pure]> {
  let summary = "adds slices into a zero tensor at the given indices (gather's gradient)";
  let description = [{
    The transpose of `pcc.gather` along `axis`: the result (of the table's
    shape, given by the result type) starts at zero and every slice of
    `updates` is added at the row its index names. Rows named by several
    indices receive the sum (a token seen twice in a batch). Negative
    indices count from the end of the dimension, as in `pcc.gather`.

    ```mlir
    %dw = pcc.scatter_add %g[%ids] axis = 0
        : tensor<2x16x64xf32>, tensor<2x16xi64> -> tensor<512x64xf32>
    ```
  }];
  let arguments = (ins Pcc_Tensor:$updates, Pcc_IndexTensor:$indices,
                       I64Attr:$axis);
  let results = (outs Pcc_Tensor:$result);
  let assemblyFormat = [{
    $updates `[` $indices `]` `axis` `=` $axis attr-dict `:` type($updates)
    `,` type($indices) `->` type($result)
  }];
  let hasVerifier = 1;
}

def Pcc_ShardScatterAddOp : Pcc_Op<"shard_scatter_add", [Pcc_MeshAxisUser,
    Pcc_RunsWhole, Pure]> {
  let summary = "this rank's block of a scatter-add into a table split on its axis";
  let description = [{
    `pcc.scatter_add` for a table whose dimension `axis` is split over mesh
    axis `mesh_axis`: the result is this rank's block, entries
    `[r * n, (r + 1) * n)` of the whole dimension of size `n * ranks` on
    rank r. It starts at zero and the rows of `updates` whose index (into
    the whole dimension; negative ones count from its end) falls in the
    block are added, in index order; the others belong to other ranks.
    This is the gradient of `pcc.shard_gather` (Megatron's
    vocabulary-parallel embedding) without the whole table:
    canonicalization makes it from a `pcc.shard_slice` of a
    `pcc.scatter_add` along the scattered axis, which held the whole
    table's gradient on every rank (4.2 GB for Llama-3 70B's embedding at
    tp 4, where each rank keeps 1.05 GB).

    ```mlir
    %dw = pcc.shard_scatter_add %g[%ids] axis = 0 mesh_axis = "tp"
        : tensor<2x16x64xf32>, tensor<2x16xi64> -> tensor<256x64xf32>
    ```
  }];
  let arguments = (ins Pcc_Tensor:$updates, Pcc_IndexTensor:$indices,
                       I64Attr:$axis, StrAttr:$mesh_axis);
  let results = (outs Pcc_Tensor:$result);
  let assemblyFormat = [{
    $updates `[` $indices `]` `axis` `=` $axis `mesh_axis` `=` $mesh_axis
    attr-dict `:` type($updates) `,` type($indices) `->` type($result)
  }];
  let hasVerifier = 1;
}

def Pcc_PadOp : Pcc_Op<"pad", [Pure]> {
  let summary = "places a tensor into zeros at strided positions (slice's gradient)";
  let description = [{
    The transpose of `pcc.slice`: the result (of the sliced tensor's shape,
    given by the result type) is zero except at `starts[d] + i * steps[d]`,
    which holds element `i` of the input along every dimension `d`.

    ```mlir
    %dx = pcc.pad %g starts = [0, 64] steps = [1, 1]
        : tensor<32x64xf32> -> tensor<32x192xf32>
    ```
  }];
  let arguments = (ins Pcc_Tensor:$input, DenseI64ArrayAttr:$starts,
                       DenseI64ArrayAttr:$steps);
  let results = (outs Pcc_Tensor:$result);
  let assemblyFormat = [{
    $input `starts` `=` $starts `steps` `=` $steps attr-dict `:`
    type($input) `->` type($result)
  }];
  let hasVerifier = 1;
}

def Pcc_CrossEntropyOp : Pcc_Op<"cross_entropy", [Pcc_RunsWhole, Pure]> {
  let summary = "per-row cross-entropy of logits against class labels";
  let description = [{
    For every row n of `logits` (`[N, V]`): `logsumexp(logits[n]) -
    logits[n, labels[n]]`, and 0 where `labels[n] == ignore_index`. A label
    outside `[0, V)` (other than `ignore_index`) is a run-time error that
    names the op. The sum over accumulation lives in double, as softmax's.
    Built by `pcc-loss`; its gradient is `pcc.cross_entropy_grad`. bf16
    logits (mixed precision, `pcc-legalize-bf16`) are widened exactly and
    give f32 losses: those of the widened logits.

    ```mlir
    %l = pcc.cross_entropy %logits, %labels ignore_index = -100
        : tensor<32x512xf32>, tensor<32xi64> -> tensor<32xf32>
    ```
  }];
  let arguments = (ins Pcc_FloatTensor:$logits, Pcc_IndexTensor:$labels,
                       I64Attr:$ignore_index);
  let results = (outs Pcc_FloatTensor:$result);
  let assemblyFormat = [{
    $logits `,` $labels `ignore_index` `=` $ignore_index attr-dict `:`
    type($logits) `,` type($labels) `->` type($result)
  }];
  let hasVerifier = 1;
}

def Pcc_CrossEntropyGradOp : Pcc_Op<"cross_entropy_grad",
                                     [Pcc_RunsWhole, Pure]> {
  let summary = "gradient of pcc.cross_entropy with respect to the logits";
  let description = [{
    Row n of the result is `(softmax(logits[n]) - onehot(labels[n])) *
    grad[n]`, and zeros where `labels[n] == ignore_index`: one pass over the
    logits, without materialising the one-hot matrix. With bf16 logits
    (widened exactly) `grad` is f32 and the result f32, or bf16: the f32
    gradient rounded once, as a cast to bf16 would round it.

    ```mlir
    %d = pcc.cross_entropy_grad %logits, %labels, %g ignore_index = -100
        : tensor<32x512xf32>, tensor<32xi64>, tensor<32xf32> -> tensor<32x512xf32>
    ```
  }];
  let arguments = (ins Pcc_FloatTensor:$logits, Pcc_IndexTensor:$labels,
                       Pcc_FloatTensor:$grad, I64Attr:$ignore_index);
  let results = (outs Pcc_FloatTensor:$result);
  let assemblyFormat = [{
    $logits `,` $labels `,` $grad `ignore_index` `=` $ignore_index attr-dict
    `:` type($logits) `,` type($labels) `,` type($grad) `->` type($result)
  }];
  let hasVerifier = 1;
}

def Pcc_LinearCrossEntropyOp : Pcc_Op<"linear_cross_entropy", [Pure]> {
  let summary = "an LM head's product and the cross-entropy's statistics, without the logits";
  let description = [{
    With logits `l = h w^T` (`w` is `[V, D]` with `transpose_w`, else
    `[D, V]`), row n of the results is `lse[n] = logsumexp(l[n])` and
    `target[n] = l[n, labels[n]]`; the per-row cross-entropy is
    `lse - target` (`pcc-loss` masks the rows whose label is
    `ignore_index`). The logits are computed and consumed in blocks of the
    vocabulary: memory is `N` floats instead of the `N x V` logits.

    With `mesh_axis`, `w` is this rank's block of a vocabulary split over
    that mesh axis (rank r holds classes `[r V, (r + 1) V)`); labels count
    the whole vocabulary, `lse` is over this rank's block and `target` is 0
    where the label is another rank's (a partial sum). `pcc-partition`
    builds this local form and combines the ranks' statistics (Megatron's
    vocabulary-parallel cross-entropy). A label outside the whole
    vocabulary that is not `ignore_index` is a run-time error naming the
    op; ignored rows get `target` 0 and their `lse`.

    On bf16 or fp16 `h` and `w` (`pcc-loss` on `pcc-autocast`'s head), the
    products accumulate in f32 and each logit is rounded to that type
    before the statistics, which stay f32: what the 16-bit head followed
    by a widening cast computes, without its `N x V` results.

    ```mlir
    %lse, %t = pcc.linear_cross_entropy %h, %w, %labels ignore_index = -100
        {transpose_w} : tensor<512x768xf32>, tensor<50257x768xf32>,
        tensor<512xi64> -> tensor<512xf32>, tensor<512xf32>
    ```
  }];
  let arguments = (ins Pcc_FloatTensor:$hidden, Pcc_FloatTensor:$weight,
                       Pcc_IndexTensor:$labels, I64Attr:$ignore_index,
                       UnitAttr:$transpose_w,
                       OptionalAttr<StrAttr>:$mesh_axis);
  let results = (outs Pcc_FloatTensor:$lse, Pcc_FloatTensor:$target);
  let assemblyFormat = [{
    $hidden `,` $weight `,` $labels `ignore_index` `=` $ignore_index
    attr-dict `:` type($hidden) `,` type($weight) `,` type($labels) `->`
    type($lse) `,` type($target)
  }];
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    /// The classes this op's weight holds (V; per rank with mesh_axis).
    int64_t getVocabSize() {
      return getWeight().getType().getDimSize(getTransposeW() ? 0 : 1);
    }
  }];
}

def Pcc_LinearCrossEntropyGradOp : Pcc_Op<"linear_cross_entropy_grad",
                                          [Pure]> {
  let summary = "gradient of pcc.linear_cross_entropy with respect to the hidden states and the weight";
  let description = [{
    With the logits recomputed block by block, `dl[n, v] = grad_lse[n]
    exp(l[n, v] - lse[n]) + grad_target[n] [v == labels[n]]`, and the
    results are `dl w` (`[N, D]`) and `dl^T h` (the weight's shape and
    layout). `lse` is the forward's (over the whole vocabulary, also with
    `mesh_axis`, where labels count the whole vocabulary as in the
    forward): one more product than the unfused backward, and no `N x V`
    buffer. On bf16 or fp16 operands the logits are rounded as in the
    forward, `dl` is rounded to the type before its products, and each
    result is accumulated in f32 and rounded once.

    ```mlir
    %dh, %dw = pcc.linear_cross_entropy_grad %h, %w, %labels, %lse, %gl,
        %gt ignore_index = -100 {transpose_w} : tensor<512x768xf32>,
        tensor<50257x768xf32>, tensor<512xi64>, tensor<512xf32>,
        tensor<512xf32>, tensor<512xf32> -> tensor<512x768xf32>,
        tensor<50257x768xf32>
    ```
  }];
  let arguments = (ins Pcc_FloatTensor:$hidden, Pcc_FloatTensor:$weight,
                       Pcc_IndexTensor:$labels, Pcc_FloatTensor:$lse,
                       Pcc_FloatTensor:$grad_lse, Pcc_FloatTensor:$grad_target,
                       I64Attr:$ignore_index, UnitAttr:$transpose_w,
                       OptionalAttr<StrAttr>:$mesh_axis);
  let results = (outs Pcc_FloatTensor:$grad_hidden,
                      Pcc_FloatTensor:$grad_weight);
  let assemblyFormat = [{
    $hidden `,` $weight `,` $labels `,` $lse `,` $grad_lse `,` $grad_target
    `ignore_index` `=` $ignore_index attr-dict `:` type($hidden) `,`
    type($weight) `,` type($labels) `,` type($lse) `,` type($grad_lse) `,`
    type($grad_target) `->` type($grad_hidden) `,` type($grad_weight)
  }];
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    int64_t getVocabSize() {
      return getWeight().getType().getDimSize(getTransposeW() ? 0 : 1);
    }
  }];
}

def Pcc_AttentionOp : Pcc_Op<"attention", [Pure]> {
  let summary = "scaled dot-product attention without the S x L scores";
  let description = [{
    `out = softmax(scale * q k^T + bias [+ causal mask]) v` over the last
    axis, for `q` `[B, Hq, S, D]`, `k` `[B, Hkv, L, D]` and `v`
    `[B, Hkv, L, Dv]`; query head h reads key/value head `h / (Hq / Hkv)`
    (grouped-query attention, K and V never repeated). `bias`, when present,
    is f32 (or q's type) of rank 4 and broadcasts to `[B, Hq, S, L]` (size-1
    dimensions are read with stride 0: a padding mask `[B, 1, 1, L]` stays
    that size). `causal` masks key j from query i when `j > i + L - S`. A
    row whose every key is masked gives zeros (softmax's `nan_to_zero`).
    The second result is each row's log-sum-exp of the (scaled, biased)
    scores in f32, which the gradient reads instead of the probabilities
    (-inf for a fully masked row).

    The kernels compute the scores a strip of query rows at a time, every
    key of those rows at once (exact softmax, no rescaling), so memory is
    linear in the sequence: `pcc-fuse-attention` builds this op from the
    exporters' decomposed attention and from ONNX `Attention`.

    ```mlir
    %o, %lse = pcc.attention %q, %k, %v scale = 1.250000e-01 {causal}
        : tensor<2x4x16x8xf32>, tensor<2x2x16x8xf32>, tensor<2x2x16x8xf32>
        -> tensor<2x4x16x8xf32>, tensor<2x4x16xf32>
    ```
  }];
  let arguments = (ins Pcc_FloatTensor:$q, Pcc_FloatTensor:$k,
                       Pcc_FloatTensor:$v, Optional<Pcc_FloatTensor>:$bias,
                       F64Attr:$scale, UnitAttr:$causal);
  let results = (outs Pcc_FloatTensor:$result, Pcc_FloatTensor:$lse);
  let assemblyFormat = [{
    $q `,` $k `,` $v (`bias` $bias^)? `scale` `=` $scale attr-dict `:`
    type($q) `,` type($k) `,` type($v) (`,` type($bias)^)? `->`
    type($result) `,` type($lse)
  }];
  let hasVerifier = 1;
}

def Pcc_AttentionGradOp : Pcc_Op<"attention_grad",
    [Pure]> {
  let summary = "gradient of pcc.attention with respect to q, k and v";
  let description = [{
    From the forward operands, its result `out`, its row log-sum-exps `lse`
    and the result's gradient `grad`: the probabilities are recomputed a
    strip of query rows at a time (`p = exp(s - lse)`), `dv = p^T grad`,
    `ds = p (grad v^T - rowsum(grad out))`, `dq = scale ds k` and
    `dk = scale ds^T q`; a key/value head's gradients sum over the query
    heads that read it. `bias` gets no gradient (masks).

    ```mlir
    %dq, %dk, %dv = pcc.attention_grad %q, %k, %v, %o, %lse, %g
        scale = 1.250000e-01 {causal}
        : tensor<2x4x16x8xf32>, tensor<2x2x16x8xf32>, tensor<2x2x16x8xf32>,
          tensor<2x4x16x8xf32>, tensor<2x4x16xf32>, tensor<2x4x16x8xf32>
        -> tensor<2x4x16x8xf32>, tensor<2x2x16x8xf32>, tensor<2x2x16x8xf32>
    ```
  }];
  let arguments = (ins Pcc_FloatTensor:$q, Pcc_FloatTensor:$k,
                       Pcc_FloatTensor:$v, Pcc_FloatTensor:$out,
                       Pcc_FloatTensor:$lse, Pcc_FloatTensor:$grad,
                       Optional<Pcc_FloatTensor>:$bias, F64Attr:$scale,
                       UnitAttr:$causal);
  let results = (outs Pcc_FloatTensor:$dq, Pcc_FloatTensor:$dk,
                      Pcc_FloatTensor:$dv);
  let assemblyFormat = [{
    $q `,` $k `,` $v `,` $out `,` $lse `,` $grad (`bias` $bias^)?
    `scale` `=` $scale attr-dict `:` type($q) `,` type($k) `,` type($v) `,`
    type($out) `,` type($lse) `,` type($grad) (`,` type($bias)^)? `->`
    type($dq) `,` type($dk) `,` type($dv)
  }];
  let hasVerifier = 1;
}

def Pcc_DropoutOp : Pcc_Op<"dropout", [Pcc_RunsWhole, Pure,
    AllTypesMatch<["input", "result"]>]> {
  let summary = "training-mode dropout with counter-based random numbers";
  let description = [{
    `y = x * mask / (1 - ratio)`, the mask keeping an element when its
    uniform random number in [0, 1) is at least `ratio`. The number of
    element i is Philox-4x32-10 keyed by the run's seed at counter
    (i / 4, micro-batch, `stream`, step) (runtime/include/pcc/runtime/
    Philox.h), so it is the same wherever and whenever it is computed: the
    gradient is the same dropout applied to the result's gradient, drawing
    the forward pass's mask again instead of saving it. `stream` tells the
    dropouts of a model apart. The op is pure within one run of a phase.

    ```mlir
    %y = pcc.dropout %x ratio = 1.000000e-01 stream = 0 : tensor<4x16x64xf32>
    ```
  }];
  let arguments = (ins Pcc_FloatTensor:$input, F64Attr:$ratio,
                       I64Attr:$stream);
  let results = (outs Pcc_FloatTensor:$result);
  let assemblyFormat = [{
    $input `ratio` `=` $ratio `stream` `=` $stream attr-dict `:` type($input)
  }];
  let hasVerifier = 1;
}

def Pcc_ConvGradInputOp : Pcc_Op<"conv_grad_input", [Pcc_RunsWhole, Pure,
    SameOperandsElementType]> {
  let summary = "gradient of pcc.conv with respect to its input";
  let description = [{
    The transpose of `pcc.conv` in its input: `grad` is the gradient of the
    convolution's result (`N x M x O1 ... Ok`) and the result, of the
    convolution's input type, is what the weight spreads it back to. The
    window attributes are the convolution's.

    ```mlir
    %dx = pcc.conv_grad_input %dy, %w strides = [1, 1] pads = [1, 1, 1, 1]
        dilations = [1, 1] groups = 1
        : tensor<2x8x32x32xf32>, tensor<8x3x3x3xf32> -> tensor<2x3x32x32xf32>
    ```
  }];
  let arguments = (ins Pcc_FloatTensor:$grad, Pcc_FloatTensor:$weight,
                       DenseI64ArrayAttr:$strides, DenseI64ArrayAttr:$pads,
                       DenseI64ArrayAttr:$dilations, I64Attr:$groups);
  let results = (outs Pcc_FloatTensor:$result);
  let assemblyFormat = [{
    $grad `,` $weight `strides` `=` $strides `pads` `=` $pads
    `dilations` `=` $dilations `groups` `=` $groups attr-dict `:`
    type($grad) `,` type($weight) `->` type($result)
  }];
  let hasVerifier = 1;
}

def Pcc_ConvGradWeightOp : Pcc_Op<"conv_grad_weight", [Pcc_RunsWhole, Pure,
    SameOperandsElementType]> {
  let summary = "gradient of pcc.conv with respect to its weight";
  let description = [{
    The correlation of the convolution's `input` with the gradient of its
    result, summed over the batch; the result has the weight's type.

    ```mlir
    %dw = pcc.conv_grad_weight %x, %dy strides = [1, 1] pads = [1, 1, 1, 1]
        dilations = [1, 1] groups = 1
        : tensor<2x3x32x32xf32>, tensor<2x8x32x32xf32> -> tensor<8x3x3x3xf32>
    ```
  }];
  let arguments = (ins Pcc_FloatTensor:$input, Pcc_FloatTensor:$grad,
                       DenseI64ArrayAttr:$strides, DenseI64ArrayAttr:$pads,
                       DenseI64ArrayAttr:$dilations, I64Attr:$groups);
  let results = (outs Pcc_FloatTensor:$result);
  let assemblyFormat = [{
    $input `,` $grad `strides` `=` $strides `pads` `=` $pads
    `dilations` `=` $dilations `groups` `=` $groups attr-dict `:`
    type($input) `,` type($grad) `->` type($result)
  }];
  let hasVerifier = 1;
}

def Pcc_MaxPoolGradOp : Pcc_Op<"max_pool_grad", [Pcc_RunsWhole, Pure,
    SameOperandsElementType, AllTypesMatch<["input", "result"]>]> {
  let summary = "gradient of pcc.max_pool with respect to its input";
  let description = [{
    Every element of `grad` (shaped like the pooling's result) goes to the
    position that won its window: the first maximum in window order, as
    PyTorch's `max_pool2d_with_indices` picks it. The winner is found again
    from the saved `input` instead of storing indices, which would take
    twice the result's memory in int64.

    ```mlir
    %dx = pcc.max_pool_grad %x, %dy kernel = [3, 3] strides = [2, 2]
        pads = [1, 1, 1, 1] dilations = [1, 1]
        : tensor<2x8x32x32xf32>, tensor<2x8x16x16xf32> -> tensor<2x8x32x32xf32>
    ```
  }];
  let arguments = (ins Pcc_FloatTensor:$input, Pcc_FloatTensor:$grad,
                       DenseI64ArrayAttr:$kernel_shape,
                       DenseI64ArrayAttr:$strides, DenseI64ArrayAttr:$pads,
                       DenseI64ArrayAttr:$dilations, UnitAttr:$ceil_mode);
  let results = (outs Pcc_FloatTensor:$result);
  let assemblyFormat = [{
    $input `,` $grad `kernel` `=` $kernel_shape `strides` `=` $strides
    `pads` `=` $pads `dilations` `=` $dilations attr-dict `:` type($input)
    `,` type($grad) `->` type($result)
  }];
  let hasVerifier = 1;
}

def Pcc_AvgPoolGradOp : Pcc_Op<"avg_pool_grad", [Pcc_RunsWhole, Pure,
    SameOperandsAndResultElementType]> {
  let summary = "gradient of pcc.avg_pool with respect to its input";
  let description = [{
    Every element of `grad` is shared out over its window's real positions,
    divided as the pooling divided. The result has the pooling's input
    type.

    ```mlir
    %dx = pcc.avg_pool_grad %dy kernel = [2, 2] strides = [2, 2]
        pads = [0, 0, 0, 0] dilations = [1, 1]
        : tensor<2x8x16x16xf32> -> tensor<2x8x32x32xf32>
    ```
  }];
  let arguments = (ins Pcc_FloatTensor:$grad, DenseI64ArrayAttr:$kernel_shape,
                       DenseI64ArrayAttr:$strides, DenseI64ArrayAttr:$pads,
                       DenseI64ArrayAttr:$dilations, UnitAttr:$ceil_mode,
                       UnitAttr:$count_include_pad);
  let results = (outs Pcc_FloatTensor:$result);
  let assemblyFormat = [{
    $grad `kernel` `=` $kernel_shape `strides` `=` $strides `pads` `=` $pads
    `dilations` `=` $dilations attr-dict `:` type($grad) `->` type($result)
  }];
  let hasVerifier = 1;
}

// The ops below write model state (a `pcc.param` naming a gradient, an
// optimizer moment or a weight) in place. They have no results; their
// effects on the state they write keep them where the pass put them and
// alive.

def Pcc_AccumulateOp : Pcc_Op<"accumulate", [Pcc_RunsWhole,
    AllTypesMatch<["state", "value"]>]> {
  let summary = "adds a gradient into its state tensor in place";
  let description = [{
    `state += value`, where `state` is the `pcc.param` of a gradient
    (`<weight>@grad`). Gradients of one weight from several uses (a tied
    embedding and LM head) and from several micro-batches add up here.

    ```mlir
    %gw = pcc.param "fc1.weight@grad" : tensor<256x64xf32>
    pcc.accumulate %gw, %dw : tensor<256x64xf32>
    ```
  }];
  let arguments = (ins Pcc_UpdatedState<"the gradient">:$state,
                       Pcc_FloatTensor:$value);
  let assemblyFormat = "$state `,` $value attr-dict `:` type($state)";
  let hasVerifier = 1;
}

def Pcc_EmaUpdateOp : Pcc_Op<"ema_update", [Pcc_RunsWhole,
    AllTypesMatch<["state", "value"]>]> {
  let summary = "moving average of a state tensor, in place (running statistics)";
  let description = [{
    `state = momentum * state + (1 - momentum) * scale * value`, computed in
    double: batch normalisation's running mean (`scale` 1) and running
    variance (`scale` n / (n - 1), the unbiased correction) in training
    mode. `momentum` is ONNX's (PyTorch's `1 - momentum`).

    ```mlir
    %rm = pcc.param "bn1.running_mean" : tensor<8xf32>
    pcc.ema_update %rm, %mean momentum = 0.9 scale = 1.0 : tensor<8xf32>
    ```
  }];
  let arguments = (ins Pcc_UpdatedState<"the running statistic">:$state,
                       Pcc_FloatTensor:$value,
                       F64Attr:$momentum, F64Attr:$scale);
  let assemblyFormat = [{
    $state `,` $value `momentum` `=` $momentum `scale` `=` $scale attr-dict
    `:` type($state)
  }];
  let hasVerifier = 1;
}

def Pcc_ZeroOp : Pcc_Op<"zero", [Pcc_RunsWhole]> {
  let summary = "sets a state tensor to zero in place";
  let description = [{
    ```mlir
    pcc.zero %gw : tensor<256x64xf32>
    ```
  }];
  let arguments = (ins Pcc_OverwrittenState<"the state zeroed">:$state);
  let assemblyFormat = "$state attr-dict `:` type($state)";
  let hasVerifier = 1;
}

def Pcc_AssignOp : Pcc_Op<"assign", [Pcc_RunsWhole,
    AllTypesMatch<["state", "value"]>]> {
  let summary = "overwrites a state tensor in place";
  let description = [{
    `state = value`. ZeRO-1 and -2 write the all-gathered shards of the
    updated weights back into each rank's whole copy of the weight.

    ```mlir
    %w = pcc.param "fc1.weight" : tensor<256x64xf32>
    pcc.assign %w, %gathered : tensor<256x64xf32>
    ```
  }];
  let arguments = (ins Pcc_OverwrittenState<"the state overwritten">:$state,
                       Pcc_FloatTensor:$value);
  let assemblyFormat = "$state `,` $value attr-dict `:` type($state)";
  let hasVerifier = 1;
}

def Pcc_SumSquaresOp : Pcc_Op<"sum_squares", [Pcc_RunsWhole, Pure]> {
  let summary = "the sum of a tensor's squares: a gradient's squared norm";
  let description = [{
    `reduce_sum(mul(x, x))` over every axis of `x` widened to f32 (exactly,
    for a bf16 `x`), each square rounded to f32 and summed in double in the
    order of the f32 gradient norm's kernel, so the result is the bits that
    the widened tensor's squared norm gives. Built by
    `pcc-bf16-gradients` for the gradients it keeps in bf16.

    ```mlir
    %s = pcc.sum_squares %g : tensor<256x64xbf16> -> tensor<f32>
    ```
  }];
  let arguments = (ins Pcc_FloatTensor:$input);
  let results = (outs Pcc_FloatTensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($input) `->` type($result)";
  let hasVerifier = 1;
}

def Pcc_RefreshCopyOp : Pcc_Op<"refresh_copy", [Pcc_RunsWhole]> {
  let summary = "casts a weight into its 16-bit copy when the run asks";
  let description = [{
    Mixed-precision training (pcc-bf16-weight-copies): `copy = cast(weight)`
    when the run's hyperparameters say the copies are stale
    (`PCC_HYPER_REFRESH_COPIES`: at a run's first step, and after weights
    were loaded or written), and nothing otherwise: the optimizer's update
    (`pcc.adamw_update ... copy`) wrote the copy at the end of the last
    step. A run without hyperparameters always casts.

    ```mlir
    %w = pcc.param "fc.weight" : tensor<8x8xf32>
    %c = pcc.param "fc.weight@bf16" : tensor<8x8xbf16>
    pcc.refresh_copy %c, %w : tensor<8x8xbf16>, tensor<8x8xf32>
    ```
  }];
  let arguments = (ins Pcc_OverwrittenState<"the 16-bit copy">:$copy,
                       Pcc_FloatTensor:$weight);
  let assemblyFormat = [{
    $copy `,` $weight attr-dict `:` type($copy) `,` type($weight)
  }];
  let hasVerifier = 1;
}

def Pcc_BucketStartOp : Pcc_Op<"bucket_start", [Pcc_MeshAxisUser, Pcc_RunsWhole,
    MemoryEffects<[MemRead, MemWrite]>]> {
  let summary = "starts the sum of a gradient bucket over an axis";
  let description = [{
    In the step's last micro-batch (`pcc_run_context.hyper`'s
    LAST_MICROBATCH; earlier micro-batches only accumulate), starts the
    in-place sum of `bucket` over mesh axis `axis` and returns before it
    completes, so that it overlaps the rest of the backward pass. The
    gradients that live in the bucket (the module's `pcc.training`
    `buckets`) are complete when it starts; `pcc.bucket_wait` completes it.

    With `scatter` (ZeRO 1: pairs of an element offset and a piece size
    s), each segment [offset, offset + n s) of the bucket, n the axis'
    size, is reduce-scattered in place instead: rank r's piece of the sum
    lands at [offset + r s, offset + (r + 1) s), the rest of the segment is
    left undefined, and nothing else of the bucket moves.

    ```mlir
    %b = pcc.param "fc3.bias@bucket" : tensor<8224xf32>
    pcc.bucket_start %b axis = "dp" : tensor<8224xf32>
    pcc.bucket_start %b axis = "dp" {scatter = array<i64: 0, 4096, 8192, 16>}
        : tensor<8224xf32>
    ```
  }];
  let arguments = (ins Pcc_UpdatedState<"the bucket summed in place">:$bucket,
                       StrAttr:$axis,
                       OptionalAttr<DenseI64ArrayAttr>:$scatter);
  let assemblyFormat = "$bucket `axis` `=` $axis attr-dict `:` type($bucket)";
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    /// The checks that need the size of the mesh axis (MeshAxisUser).
    ::mlir::LogicalResult verifyAxisSize(int64_t size);
  }];
}

def Pcc_BucketWaitOp : Pcc_Op<"bucket_wait", [Pcc_MeshAxisUser, Pcc_RunsWhole,
    MemoryEffects<[MemRead, MemWrite]>]> {
  let summary = "completes the all-reduces started over an axis";
  let description = [{
    Waits until every bucket all-reduce started over `axis` is done; the
    gradients in `bucket` are then the sums over the axis.

    ```mlir
    pcc.bucket_wait %b axis = "dp" : tensor<8224xf32>
    ```
  }];
  let arguments = (ins Pcc_UpdatedState<"the bucket summed in place">:$bucket,
                       StrAttr:$axis);
  let assemblyFormat = "$bucket `axis` `=` $axis attr-dict `:` type($bucket)";
  let hasVerifier = 1;
}

def Pcc_ReduceScatterStartOp : Pcc_Op<"reduce_scatter_start", [
    Pcc_MeshAxisUser, Pcc_RunsWhole,
    MemoryEffects<[MemRead, MemWrite]>]> {
  let summary = "starts a reduce-scatter that a later op completes";
  let description = [{
    `pcc.reduce_scatter`, started: the call returns before the sum is done,
    so the ops after it overlap the traffic (ZeRO 2 and 3's gradient
    buckets in the backward pass). The result holds nothing until a
    `pcc.wait_collectives` takes it, and the input must stay as it is until
    then, so both are that op's operands and only it may use the result.

    ```mlir
    %p = pcc.reduce_scatter_start %g axis = "dp" : tensor<2x64xf32> -> tensor<64xf32>
    %q = pcc.wait_collectives axis = "dp" (%p) reading (%g)
        : (tensor<64xf32>), (tensor<2x64xf32>) -> tensor<64xf32>
    ```
  }];
  let arguments = (ins Pcc_FloatTensor:$input, StrAttr:$axis);
  let results = (outs Pcc_FloatTensor:$result);
  let assemblyFormat = [{
    $input `axis` `=` $axis attr-dict `:` type($input) `->` type($result)
  }];
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    /// The checks that need the size of the mesh axis (MeshAxisUser).
    ::mlir::LogicalResult verifyAxisSize(int64_t size);
  }];
}

def Pcc_AllGatherStartOp : Pcc_Op<"all_gather_start", [
    Pcc_MeshAxisUser, Pcc_RunsWhole,
    MemoryEffects<[MemRead, MemWrite]>]> {
  let summary = "starts an all-gather that a later op completes";
  let description = [{
    `pcc.all_gather`, started: the call returns before the gather is done,
    so the ops after it overlap the traffic (ZeRO 3's prefetch of the next
    weight while the current one computes). As for
    `pcc.reduce_scatter_start`, only a `pcc.wait_collectives` that also
    reads the input may use the result.

    ```mlir
    %p = pcc.all_gather_start %w axis = "dp" : tensor<64xf32> -> tensor<2x64xf32>
    %q = pcc.wait_collectives axis = "dp" (%p) reading (%w)
        : (tensor<2x64xf32>), (tensor<64xf32>) -> tensor<2x64xf32>
    ```
  }];
  let arguments = (ins Pcc_FloatTensor:$input, StrAttr:$axis);
  let results = (outs Pcc_FloatTensor:$result);
  let assemblyFormat = [{
    $input `axis` `=` $axis attr-dict `:` type($input) `->` type($result)
  }];
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    /// The checks that need the size of the mesh axis (MeshAxisUser).
    ::mlir::LogicalResult verifyAxisSize(int64_t size);
  }];
}

def Pcc_WaitCollectivesOp : Pcc_Op<"wait_collectives", [
    Pcc_MeshAxisUser, Pcc_RunsWhole,
    MemoryEffects<[MemRead, MemWrite]>, AttrSizedOperandSegments]> {
  let summary = "completes the collectives started over an axis";
  let description = [{
    Waits until its `started` collectives, and every collective started
    over `axis` before them, are done (started collectives complete in the
    order they started; later ones may still run). Each result
    is the completed value of the same-numbered `started` operand (its
    buffer: no copy); `reading` names the inputs of those collectives, kept
    untouched until here.

    ```mlir
    %q1, %q2 = pcc.wait_collectives axis = "dp" (%p1, %p2) reading (%g1, %g2)
        : (tensor<64xf32>, tensor<8xf32>), (tensor<2x64xf32>, tensor<2x8xf32>)
        -> tensor<64xf32>, tensor<8xf32>
    ```
  }];
  let arguments = (ins Variadic<Pcc_FloatTensor>:$started,
                       Variadic<Pcc_FloatTensor>:$reading, StrAttr:$axis);
  let results = (outs Variadic<Pcc_FloatTensor>:$results);
  let assemblyFormat = [{
    `axis` `=` $axis `(` $started `)` `reading` `(` $reading `)` attr-dict
    `:` `(` type($started) `)` `,` `(` type($reading) `)` `->` type($results)
  }];
  let hasVerifier = 1;
}

def Pcc_SgdUpdateOp : Pcc_Op<"sgd_update", [Pcc_RunsWhole,
    AllTypesMatch<["param", "grad", "momentum_buffer"]>]> {
  let summary = "one SGD step of a weight, in place (torch.optim.SGD)";
  let description = [{
    With `g` the gradient times the clipping coefficient (from `norm`, the
    global gradient norm, and the run's max norm), PyTorch's update:
    `g += wd * p`; with momentum, `buf = g` at the first step, else
    `buf = momentum * buf + (1 - dampening) * g`, and `g = buf` (or
    `g + momentum * buf` with Nesterov); `p -= lr * g`. The hyperparameters
    are the run's (pcc_run_context.hyper), so one library trains under any
    schedule.

    ```mlir
    pcc.sgd_update %p, %g, %buf, %norm : tensor<256x64xf32>, tensor<f32>
    ```
  }];
  let arguments = (ins Pcc_UpdatedState<"the weight">:$param,
                       Pcc_FloatTensor:$grad,
                       Pcc_UpdatedState<"the momentum buffer">:$momentum_buffer,
                       Pcc_FloatTensor:$norm);
  let assemblyFormat = [{
    $param `,` $grad `,` $momentum_buffer `,` $norm attr-dict `:`
    type($param) `,` type($norm)
  }];
  let hasVerifier = 1;
}

def Pcc_AdamwUpdateOp : Pcc_Op<"adamw_update", [Pcc_RunsWhole,
    AllTypesMatch<["param", "exp_avg", "exp_avg_sq"]>]> {
  let summary = "one AdamW step of a weight, in place (torch.optim.AdamW)";
  let description = [{
    With `g` the gradient times the clipping coefficient: `p *= 1 - lr * wd`;
    `m = beta1 * m + (1 - beta1) * g`; `v = beta2 * v + (1 - beta2) * g^2`;
    `p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)`,
    in PyTorch's order of operations, t being the run's step.

    With `copy` (mixed precision, pcc-bf16-weight-copies), the updated
    weight rounded to the copy's 16-bit type is written there too, as
    `pcc.cast` rounds it, so that the next step's micro-batches read it
    without a pass over the weight of its own. A skipped update (fp16's
    overflow) leaves the copy as it is, as it leaves the weight.

    The gradient has the weight's type, or is its bf16 (a gradient that
    `pcc-bf16-gradients` keeps in bf16), widened exactly as it is read;
    the type is then spelled after `grad`:
    `pcc.adamw_update %p, %g, %m, %v, %norm : tensor<8xf32>, tensor<f32>
    grad tensor<8xbf16>`.

    ```mlir
    pcc.adamw_update %p, %g, %m, %v, %norm : tensor<256x64xf32>, tensor<f32>
    pcc.adamw_update %p, %g, %m, %v, %norm copy %c
        : tensor<256x64xf32>, tensor<f32>, tensor<256x64xbf16>
    ```
  }];
  let arguments = (ins Pcc_UpdatedState<"the weight">:$param,
                       Pcc_FloatTensor:$grad,
                       Pcc_UpdatedState<"the first moment">:$exp_avg,
                       Pcc_UpdatedState<"the second moment">:$exp_avg_sq,
                       Pcc_FloatTensor:$norm,
                       Arg<Optional<Pcc_FloatTensor>, "the weight's 16-bit copy",
                           [MemWrite<Pcc_StateResource>]>:$copy);
  let assemblyFormat = [{
    $param `,` $grad `,` $exp_avg `,` $exp_avg_sq `,` $norm
    (`copy` $copy^)? attr-dict `:` type($param) `,` type($norm)
    (`,` type($copy)^)? custom<GradType>(type($grad), ref(type($param)))
  }];
  let hasVerifier = 1;
}

#endif // PCC_DIALECT_PCC_IR_PCCTRAININGOPS_TD
