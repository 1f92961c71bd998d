// RUN: split-file %s %t
// RUN: pcc-opt %t/head.mlir --pcc-loss=kind=cross_entropy --pcc-autodiff --canonicalize --cse | FileCheck %s
// RUN: pcc-opt %t/head.mlir --pcc-loss="kind=cross_entropy fuse-head-bytes=-1" --canonicalize | FileCheck %s --check-prefix=OFF
// RUN: pcc-opt %t/dv.mlir --pcc-loss=kind=cross_entropy --canonicalize | FileCheck %s --check-prefix=DV
// RUN: pcc-opt %t/head.mlir --pcc-loss="kind=cross_entropy fuse-head-bytes=1024" --canonicalize | FileCheck %s --check-prefix=OFF
// RUN: pcc-opt %t/head.mlir --pcc-loss="kind=cross_entropy fuse-head-bytes=512" --canonicalize | FileCheck %s --check-prefix=DV-HEAD
// RUN: pcc-opt %t/bias.mlir --pcc-loss=kind=cross_entropy --canonicalize | FileCheck %s --check-prefix=BIAS
// RUN: pcc-opt %t/bf16.mlir --pcc-loss=kind=cross_entropy --pcc-autodiff --canonicalize --cse | FileCheck %s --check-prefix=BF16
// RUN: pcc-opt %t/tied.mlir --pcc-loss=kind=cross_entropy --pcc-autodiff --pcc-optimizer=kind=sgd --cse --pcc-merge-state-loads --pcc-plan-sharding --pcc-partition-training --canonicalize | FileCheck %s --check-prefix=TP

// An LM head (a product of the hidden states and one weight) under the
// cross-entropy loss becomes one pcc.linear_cross_entropy over the rows:
// the per-row loss is lse - target, the ignored rows masked; its gradient
// is pcc.linear_cross_entropy_grad, which reads the saved hidden states,
// labels and log-sum-exps (no logits are saved).
//--- head.mlir
func.func @main(%x: tensor<2x4x8xf32>) -> tensor<2x4x16xf32> {
  %w = pcc.param "head.weight" : tensor<16x8xf32>
  %l = pcc.matmul %x, %w {transpose_b} : tensor<2x4x8xf32>, tensor<16x8xf32> -> tensor<2x4x16xf32>
  return %l : tensor<2x4x16xf32>
}
// CHECK-LABEL: func.func @train_forward
// CHECK-SAME: %[[X:[^:]*]]: tensor<2x4x8xf32>, %[[LABELS:[^:]*]]: tensor<2x4xi64> {pcc.name = "labels"}
// CHECK-DAG: %[[IGNORED:.*]] = pcc.constant dense<-100> : tensor<8xi64>
// CHECK-DAG: %[[ZERO:.*]] = pcc.constant dense<0.000000e+00> : tensor<8xf32>
// CHECK-DAG: %[[W:.*]] = pcc.param "head.weight" : tensor<16x8xf32>
// CHECK-DAG: %[[L:.*]] = pcc.reshape %[[LABELS]] : tensor<2x4xi64> -> tensor<8xi64>
// CHECK-DAG: %[[H:.*]] = pcc.reshape %[[X]] : tensor<2x4x8xf32> -> tensor<8x8xf32>
// CHECK: %[[LSE:.*]], %[[T:.*]] = pcc.linear_cross_entropy %[[H]], %[[W]], %[[L]] ignore_index = -100 {transpose_w} : tensor<8x8xf32>, tensor<16x8xf32>, tensor<8xi64> -> tensor<8xf32>, tensor<8xf32>
// CHECK: %[[ROW:.*]] = pcc.sub %[[LSE]], %[[T]] : tensor<8xf32>
// CHECK: %[[KEEP:.*]] = pcc.compare ne, %[[L]], %[[IGNORED]] : tensor<8xi64>
// CHECK: %[[MASKED:.*]] = pcc.select %[[KEEP]], %[[ROW]], %[[ZERO]]
// CHECK: %[[SUM:.*]] = pcc.reduce_sum %[[MASKED]] axes = [0]
// CHECK: return %[[SUM]], %[[KEEP]], %[[H]], %[[L]], %[[LSE]] :
// CHECK-NOT: pcc.matmul
// CHECK-LABEL: func.func @train_backward
// CHECK-SAME: (%[[SKEEP:[^:]*]]: tensor<8xi1> {{.*}}, %[[SH:[^:]*]]: tensor<8x8xf32> {{.*}}, %[[SL:[^:]*]]: tensor<8xi64> {{.*}}, %[[SLSE:[^:]*]]: tensor<8xf32> {{.*}}, %[[SEED:[^:]*]]: tensor<f32> {pcc.name = "loss_grad"})
// CHECK: %[[G:.*]] = pcc.select %[[SKEEP]]
// CHECK: %[[NG:.*]] = pcc.neg %[[G]] : tensor<8xf32>
// CHECK: %[[DH:.*]], %[[DW:.*]] = pcc.linear_cross_entropy_grad %[[SH]], %{{.*}}, %[[SL]], %[[SLSE]], %[[G]], %[[NG]] ignore_index = -100 {transpose_w}
// CHECK: %[[GW:.*]] = pcc.param "head.weight@grad" : tensor<16x8xf32>
// CHECK: pcc.accumulate %[[GW]], %[[DW]] : tensor<16x8xf32>

// With fuse-head-bytes, only logits of at least that many bytes (these
// take 8 x 16 x 4 = 512).
// DV-HEAD: pcc.linear_cross_entropy

// OFF: %[[LOGITS:.*]] = pcc.matmul
// OFF: pcc.cross_entropy %{{.*}}, %{{.*}} ignore_index = -100 : tensor<8x16xf32>
// OFF-NOT: pcc.linear_cross_entropy

// A [D, V] weight (the dynamo exporter's pre-transposed Llama head) is
// read in place: no transpose_w.
//--- dv.mlir
func.func @main(%x: tensor<2x4x8xf32>) -> tensor<2x4x16xf32> {
  %w = pcc.param "head" : tensor<8x16xf32>
  %l = pcc.matmul %x, %w : tensor<2x4x8xf32>, tensor<8x16xf32> -> tensor<2x4x16xf32>
  return %l : tensor<2x4x16xf32>
}
// DV: pcc.linear_cross_entropy %{{.*}}, %{{.*}}, %{{.*}} ignore_index = -100 : tensor<8x8xf32>, tensor<8x16xf32>, tensor<8xi64> -> tensor<8xf32>, tensor<8xf32>

// pcc-autocast's head: a bf16 product widened to f32 by a cast. The fused
// op takes the bf16 operands (it rounds each logit to bf16 as the product
// does) and gives f32 statistics; its gradients are bf16, widened where
// the weight's f32 gradient is accumulated.
//--- bf16.mlir
func.func @main(%x: tensor<2x4x8xf32>) -> tensor<2x4x16xf32> {
  %w = pcc.param "head.weight" : tensor<16x8xf32>
  %x16 = pcc.cast %x : tensor<2x4x8xf32> -> tensor<2x4x8xbf16>
  %w16 = pcc.cast %w : tensor<16x8xf32> -> tensor<16x8xbf16>
  %p = pcc.matmul %x16, %w16 {transpose_b} : tensor<2x4x8xbf16>, tensor<16x8xbf16> -> tensor<2x4x16xbf16>
  %l = pcc.cast %p : tensor<2x4x16xbf16> -> tensor<2x4x16xf32>
  return %l : tensor<2x4x16xf32>
}
// BF16-LABEL: func.func @train_forward
// BF16: pcc.linear_cross_entropy %{{.*}}, %{{.*}}, %{{.*}} ignore_index = -100 {transpose_w} : tensor<8x8xbf16>, tensor<16x8xbf16>, tensor<8xi64> -> tensor<8xf32>, tensor<8xf32>
// BF16-NOT: pcc.matmul
// BF16-LABEL: func.func @train_backward
// BF16: %{{.*}}, %[[DW:.*]] = pcc.linear_cross_entropy_grad {{.*}} : tensor<8x8xbf16>, tensor<16x8xbf16>, tensor<8xi64>, tensor<8xf32>, tensor<8xf32>, tensor<8xf32> -> tensor<8x8xbf16>, tensor<16x8xbf16>
// BF16: %[[DW32:.*]] = pcc.cast %[[DW]] : tensor<16x8xbf16> -> tensor<16x8xf32>
// BF16: pcc.accumulate %{{.*}}, %[[DW32]] : tensor<16x8xf32>

// A head with a bias is not a bare product: the logits, then the loss.
//--- bias.mlir
func.func @main(%x: tensor<2x4x8xf32>) -> tensor<2x4x16xf32> {
  %w = pcc.param "head.weight" : tensor<16x8xf32>
  %b = pcc.param "head.bias" : tensor<2x4x16xf32>
  %p = pcc.matmul %x, %w {transpose_b} : tensor<2x4x8xf32>, tensor<16x8xf32> -> tensor<2x4x16xf32>
  %l = pcc.add %p, %b : tensor<2x4x16xf32>
  return %l : tensor<2x4x16xf32>
}
// BIAS: pcc.cross_entropy
// BIAS-NOT: pcc.linear_cross_entropy

// A head tied to the embedding at tp 2: the table is split over the
// vocabulary, each rank's fused loss reads its block (mesh_axis), and the
// ranks' statistics are combined: the label's logit summed, the
// log-sum-exps gathered and reduced (Megatron's vocabulary-parallel
// cross-entropy). The gradient reads the whole log-sum-exp and leaves the
// hidden states' gradient a partial sum, all-reduced where it meets the
// replicated activations.
//--- tied.mlir
module {
  pcc.mesh @mesh [dp = 1, pp = 1, tp = 2]
  func.func @main(%ids: tensor<2x4xi64>) -> tensor<2x4x16xf32> {
    %t = pcc.param "wte.weight" : tensor<16x8xf32>
    %e = pcc.gather %t[%ids] axis = 0 : tensor<16x8xf32>, tensor<2x4xi64> -> tensor<2x4x8xf32>
    %g = pcc.gelu %e : tensor<2x4x8xf32>
    %l = pcc.matmul %g, %t {transpose_b} : tensor<2x4x8xf32>, tensor<16x8xf32> -> tensor<2x4x16xf32>
    return %l : tensor<2x4x16xf32>
  }
}
// TP-LABEL: func.func @train_forward
// TP: %[[W:.*]] = pcc.param "wte.weight" shard(#pcc.shard<tp, dim = 0>) : tensor<8x8xf32>
// TP: %[[LSE:.*]], %[[T:.*]] = pcc.linear_cross_entropy %{{.*}}, %[[W]], %{{.*}} ignore_index = -100 {mesh_axis = "tp", transpose_w} : tensor<8x8xf32>, tensor<8x8xf32>
// TP: %[[TSUM:.*]] = pcc.all_reduce %[[T]] axis = "tp" : tensor<8xf32>
// TP: %[[ALL:.*]] = pcc.all_gather %[[LSE]] axis = "tp" : tensor<8xf32> -> tensor<2x8xf32>
// TP: %[[MAX:.*]] = pcc.reduce_max %[[ALL]] axes = [0]
// TP: %[[SHIFT:.*]] = pcc.broadcast %[[MAX]]
// TP: %[[D:.*]] = pcc.sub %[[ALL]], %[[SHIFT]]
// TP: %[[E:.*]] = pcc.exp %[[D]]
// TP: %[[S:.*]] = pcc.reduce_sum %[[E]] axes = [0]
// TP: %[[LOG:.*]] = pcc.log %[[S]]
// TP: %[[WHOLE:.*]] = pcc.add %[[MAX]], %[[LOG]] : tensor<8xf32>
// TP: pcc.sub %[[WHOLE]], %[[TSUM]] : tensor<8xf32>
// TP-LABEL: func.func @train_backward
// TP: %[[BW:.*]] = pcc.param "wte.weight" shard(#pcc.shard<tp, dim = 0>) : tensor<8x8xf32>
// TP: %[[DH:.*]], %[[DW:.*]] = pcc.linear_cross_entropy_grad %{{.*}}, %[[BW]], {{.*}} {mesh_axis = "tp", transpose_w}
// TP: %[[GW:.*]] = pcc.param "wte.weight@grad" shard(#pcc.shard<tp, dim = 0>) : tensor<8x8xf32>
// TP: pcc.accumulate %[[GW]], %[[DW]] : tensor<8x8xf32>
// TP: pcc.reshape %[[DH]]
// TP: pcc.all_reduce %{{.*}} axis = "tp" : tensor<2x4x8xf32>
