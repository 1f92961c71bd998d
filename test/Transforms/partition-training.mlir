// RUN: split-file %s %t
// RUN: pcc-opt %t/mlp.mlir --pcc-loss=kind=mse --pcc-autodiff --pcc-optimizer=kind=sgd --cse --pcc-merge-state-loads --pcc-plan-sharding --pcc-partition-training --canonicalize | FileCheck %s
// RUN: pcc-opt %t/mlp.mlir --pcc-loss=kind=mse --pcc-autodiff --pcc-optimizer=kind=sgd --cse --pcc-merge-state-loads --pcc-plan-sharding --pcc-partition-training=emit-remarks=1 -mlir-print-op-on-diagnostic=false 2>&1 >/dev/null | FileCheck %s --check-prefix=REMARK
// RUN: pcc-opt %t/mlp.mlir --pcc-loss=kind=mse --pcc-autodiff --pcc-optimizer=kind=sgd --cse --pcc-merge-state-loads --pcc-plan-sharding --pcc-partition-training=sequence-parallel=1 --canonicalize | FileCheck %s --check-prefix=SP
// RUN: pcc-opt %t/mlp.mlir --pcc-loss=kind=mse --pcc-autodiff --pcc-optimizer=kind=sgd --cse --pcc-merge-state-loads --pcc-plan-sharding=axis=pp --pcc-partition-training=axis=pp | FileCheck %s --check-prefix=ONE
// RUN: pcc-opt %t/pipelined.mlir --pcc-autodiff --pcc-optimizer=kind=sgd --cse --pcc-merge-state-loads --pcc-plan-sharding --pcc-partition-training --canonicalize | FileCheck %s --check-prefix=PP
// RUN: pcc-opt %t/errors.mlir --split-input-file --pcc-partition-training -verify-diagnostics

// Tests that a training step is partitioned over tp with the plan made on
// its forward phase (fc1 by columns, fc2 by rows): every phase reads the
// weights' pieces, each gradient and momentum buffer lies as its weight,
// the forward phase all-reduces fc2's partial sums, the backward phase
// gathers the split gradient of the replicated bias, and the optimizer
// all-reduces the split weights' squared sums once for the global norm.
//--- mlp.mlir
module {
  pcc.mesh @mesh [dp = 1, pp = 1, tp = 2]
  func.func @main(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
    %w1 = pcc.param "fc1.weight" : tensor<32x8xf32>
    %b1 = pcc.param "fc1.bias" : tensor<32xf32>
    %w2 = pcc.param "fc2.weight" : tensor<8x32xf32>
    %h = pcc.matmul %x, %w1 {transpose_b} : tensor<4x8xf32>, tensor<32x8xf32> -> tensor<4x32xf32>
    %bb1 = pcc.broadcast %b1 : tensor<32xf32> -> tensor<4x32xf32>
    %h1 = pcc.add %h, %bb1 : tensor<4x32xf32>
    %g = pcc.gelu %h1 : tensor<4x32xf32>
    %y = pcc.matmul %g, %w2 {transpose_b} : tensor<4x32xf32>, tensor<8x32xf32> -> tensor<4x8xf32>
    return %y : tensor<4x8xf32>
  }
}
// CHECK-LABEL: func.func @train_forward
// CHECK-SAME: -> (tensor<f32> {pcc.name = "loss"}, tensor<4x8xf32> {pcc.name = "saved0"}, tensor<4x16xf32> {pcc.name = "saved1"}
// CHECK: %[[W1:.*]] = pcc.param "fc1.weight" shard(#pcc.shard<tp, dim = 0>) : tensor<16x8xf32>
// CHECK: %[[B1:.*]] = pcc.param "fc1.bias" : tensor<32xf32>
// CHECK: %[[W2:.*]] = pcc.param "fc2.weight" shard(#pcc.shard<tp, dim = 1>) : tensor<8x16xf32>
// CHECK: pcc.matmul %arg0, %[[W1]] {transpose_b} : tensor<4x8xf32>, tensor<16x8xf32> -> tensor<4x16xf32>
// CHECK: pcc.shard_slice %[[B1]] axis = "tp" dim = 0 stripes = 1 : tensor<32xf32> -> tensor<16xf32>
// CHECK: %[[P:.*]] = pcc.matmul %{{.*}}, %[[W2]] {transpose_b} : tensor<4x16xf32>, tensor<8x16xf32> -> tensor<4x8xf32>
// CHECK: %[[R:.*]] = pcc.all_reduce %[[P]] axis = "tp" : tensor<4x8xf32>
// CHECK: pcc.sub %[[R]], %arg1
// CHECK-LABEL: func.func @train_backward
// CHECK: %[[G2:.*]] = pcc.param "fc2.weight@grad" shard(#pcc.shard<tp, dim = 1>) : tensor<8x16xf32>
// CHECK: pcc.accumulate %[[G2]], %{{.*}} : tensor<8x16xf32>
// CHECK: %[[GB:.*]] = pcc.param "fc1.bias@grad" : tensor<32xf32>
// CHECK: %[[AG:.*]] = pcc.all_gather %{{.*}} axis = "tp" : tensor<16xf32> -> tensor<2x16xf32>
// CHECK: %[[WHOLE:.*]] = pcc.reshape %[[AG]] : tensor<2x16xf32> -> tensor<32xf32>
// CHECK: pcc.accumulate %[[GB]], %[[WHOLE]] : tensor<32xf32>
// CHECK: %[[G1:.*]] = pcc.param "fc1.weight@grad" shard(#pcc.shard<tp, dim = 0>) : tensor<16x8xf32>
// CHECK: pcc.accumulate %[[G1]], %{{.*}} : tensor<16x8xf32>
// CHECK-LABEL: func.func @train_optimizer
// CHECK: pcc.all_reduce %{{.*}} axis = "tp" : tensor<f32>
// CHECK-NOT: pcc.all_reduce
// CHECK: %[[NORM:.*]] = pcc.sqrt
// CHECK: %[[P1:.*]] = pcc.param "fc1.weight" shard(#pcc.shard<tp, dim = 0>) : tensor<16x8xf32>
// CHECK: %[[M1:.*]] = pcc.param "fc1.weight@momentum_buffer" shard(#pcc.shard<tp, dim = 0>) : tensor<16x8xf32>
// CHECK: pcc.sgd_update %[[P1]], %{{.*}}, %[[M1]], %[[NORM]] : tensor<16x8xf32>, tensor<f32>
// CHECK-LABEL: func.func @train_zero_grad
// CHECK: pcc.zero %{{.*}} : tensor<8x16xf32>

// REMARK: remark: tp=2 @train_forward: 1 all_reduce, 0 all_gather, 0 reduce_scatter; 128 bytes per run
// REMARK: remark: tp=2 @train_backward: 0 all_reduce, 1 all_gather, 0 reduce_scatter; 128 bytes per run
// REMARK: remark: tp=2 @train_optimizer: 1 all_reduce, 0 all_gather, 0 reduce_scatter; 4 bytes per run
// REMARK: remark: tp=2 @train_zero_grad: 0 all_reduce, 0 all_gather, 0 reduce_scatter; 0 bytes per run
// REMARK: remark: tp=2 training step: 2 all_reduce, 1 all_gather, 0 reduce_scatter; 260 bytes per micro-batch and step

// Sequence parallelism: the partial sums are reduce-scattered along the
// token dimension instead, the loss's residual is saved in that split
// and the loss's partial sums are all-reduced.
// SP: module attributes {pcc.sequence_parallel
// SP-LABEL: func.func @train_forward
// SP-SAME: tensor<2x8xf32> {pcc.name = "saved0"}
// SP-NOT: pcc.all_reduce {{.*}} : tensor<4x8xf32>
// SP: pcc.reduce_scatter %{{.*}} axis = "tp" : tensor<2x1x2x8xf32> -> tensor<1x2x8xf32>
// SP: pcc.all_reduce %{{.*}} axis = "tp" : tensor<f32>
// SP-LABEL: func.func @train_backward(%arg0: tensor<2x8xf32> {pcc.name = "saved0"}
// SP: pcc.all_gather %{{.*}} axis = "tp" : tensor<2x8xf32> -> tensor<2x2x8xf32>

// Over an axis of one rank nothing is partitioned and the plan's marks go.
// ONE: pcc.mesh @mesh
// ONE-NOT: pcc.sharding
// ONE-NOT: shard(

// A pipelined step: each stage's F, B and W phases with the layouts
// planned on the stages' forward phases (the weight on both stages keeps
// stage 0's), and each pipeline rank's optimizer over its pieces.
//--- pipelined.mlir
module {
  pcc.mesh @mesh [dp = 1, pp = 2, tp = 2]
  func.func private @stage0(%x: tensor<4x8xf32>) -> tensor<4x16xf32> attributes {pcc.stage = 0 : i64} {
    %w = pcc.param "tied.weight" : tensor<16x8xf32>
    %h = pcc.matmul %x, %w {transpose_b} : tensor<4x8xf32>, tensor<16x8xf32> -> tensor<4x16xf32>
    %g = pcc.tanh %h : tensor<4x16xf32>
    return %g : tensor<4x16xf32>
  }
  func.func private @stage1(%h: tensor<4x16xf32>) -> tensor<f32> attributes {pcc.stage = 1 : i64} {
    %w = pcc.param "tied.weight" : tensor<16x8xf32>
    %w2 = pcc.param "fc.weight" : tensor<16x16xf32>
    %a = pcc.matmul %h, %w2 : tensor<4x16xf32>, tensor<16x16xf32> -> tensor<4x16xf32>
    %y = pcc.matmul %a, %w : tensor<4x16xf32>, tensor<16x8xf32> -> tensor<4x8xf32>
    %l = pcc.reduce_sum %y axes = [0, 1] : tensor<4x8xf32> -> tensor<f32>
    return %l : tensor<f32>
  }
  func.func @main(%x: tensor<4x8xf32>) -> tensor<f32> {
    %0 = call @stage0(%x) : (tensor<4x8xf32>) -> tensor<4x16xf32>
    %1 = pcc.transfer %0 from 0 to 1 : tensor<4x16xf32>
    %2 = call @stage1(%1) : (tensor<4x16xf32>) -> tensor<f32>
    return %2 : tensor<f32>
  }
}
// PP-LABEL: func.func @stage0_forward
// PP: pcc.param "tied.weight" shard(#pcc.shard<tp, dim = 0>) : tensor<8x8xf32>
// PP-LABEL: func.func @stage1_forward
// PP: pcc.param "tied.weight" shard(#pcc.shard<tp, dim = 0>) : tensor<8x8xf32>
// PP: pcc.param "fc.weight" shard(#pcc.shard<tp, dim = 1>) : tensor<16x8xf32>
// PP: pcc.all_reduce %{{.*}} axis = "tp"
// PP-LABEL: func.func @stage1_weight_grad
// PP: pcc.param "tied.weight@grad" shard(#pcc.shard<tp, dim = 0>) : tensor<8x8xf32>
// PP: pcc.param "fc.weight@grad" shard(#pcc.shard<tp, dim = 1>) : tensor<16x8xf32>
// PP-LABEL: func.func @rank1_optimizer
// PP: pcc.all_reduce %{{.*}} axis = "pp" : tensor<8x8xf32>
// PP: %[[TP:.*]] = pcc.all_reduce %{{.*}} axis = "tp" : tensor<f32>
// PP: pcc.all_reduce %[[TP]] axis = "pp" : tensor<f32>
// PP: pcc.param "fc.weight@momentum_buffer" shard(#pcc.shard<tp, dim = 1>) : tensor<16x8xf32>
// PP: pcc.sgd_update {{.*}} : tensor<16x8xf32>, tensor<f32>

//--- errors.mlir
// expected-error @below {{pcc-partition-training: the module has no @train_forward (run pcc-autodiff and pcc-optimizer first)}}
module { pcc.mesh @mesh [tp = 2] }

// -----

// expected-error @below {{pcc-partition-training: pipeline stage 0 lacks its forward, backward or weight-gradient phase}}
module {
  pcc.mesh @mesh [tp = 2]
  func.func @stage0_forward(%x: tensor<4x8xf32>) -> tensor<4x8xf32> attributes {pcc.phase = "forward", pcc.pipeline_stage = 0 : i64} {
    return %x : tensor<4x8xf32>
  }
}

// -----

module {
  pcc.mesh @mesh [tp = 2]
  func.func @train_forward(%x: tensor<4x8xf32>) -> tensor<4x8xf32> attributes {pcc.phase = "forward"} {
    %a = pcc.param "w" {pcc.sharding = [#pcc.shard<tp, dim = 0>]} : tensor<8x8xf32>
    // expected-error @below {{'pcc.param' op weight 'w' has two different layouts}}
    %b = pcc.param "w" {pcc.sharding = [#pcc.shard<tp, dim = 1>]} : tensor<8x8xf32>
    %y = pcc.matmul %x, %a : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
    %z = pcc.matmul %y, %b : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
    return %z : tensor<4x8xf32>
  }
  func.func @train_backward() attributes {pcc.phase = "backward"} { return }
  func.func @train_optimizer() attributes {pcc.phase = "optimizer"} { return }
  func.func @train_zero_grad() attributes {pcc.phase = "zero_grad"} { return }
}
