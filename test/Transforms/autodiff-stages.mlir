// RUN: split-file %s %t
// RUN: pcc-opt %t/cut.mlir --pcc-autodiff --pcc-optimizer | FileCheck %s
// RUN: pcc-opt %t/cut.mlir --pcc-autodiff --pcc-optimizer=kind=sgd | FileCheck %s --check-prefix=SGD
// RUN: pcc-opt %t/cut.mlir --pcc-autodiff=recompute=none,full --pcc-optimizer | FileCheck %s --check-prefix=FULL
// RUN: pcc-opt %t/model.mlir --pcc-loss=kind=mse --pcc-pipeline-cut=cuts=act --pcc-autodiff --pcc-optimizer=kind=sgd | FileCheck %s --check-prefix=CHAIN
// RUN: not pcc-opt %t/cut.mlir --pcc-autodiff --pcc-optimizer=kind=lamb 2>&1 | FileCheck %s --check-prefix=KIND
// RUN: not pcc-opt %t/cut.mlir --pcc-autodiff=recompute=some 2>&1 | FileCheck %s --check-prefix=RECOMPUTE
// RUN: pcc-opt %t/errors.mlir --split-input-file --pcc-autodiff -verify-diagnostics

// pcc-autodiff and pcc-optimizer on a step cut into stages (the whole
// step's phases are autodiff.mlir's and optimizer.mlir's).
// Tests the phases of a step cut into 2 stages: for each stage F, B (the
// cotangent of the activation stage 0 sent, then what W reads) and W (the
// gradients added into state); for each pipeline rank an optimizer and a
// zero-grad. The weight both stages read has its gradient summed over pp
// on both ranks and counted once (on rank 0) in the norm.
//--- cut.mlir
module {
  pcc.mesh @mesh [dp = 1, pp = 2, tp = 1]
  func.func private @stage0(%x: tensor<4x8xf32>) -> tensor<4x16xf32> attributes {pcc.stage = 0 : i64} {
    %w = pcc.param "tied.weight" : tensor<16x8xf32>
    %h = pcc.matmul %x, %w {transpose_b} : tensor<4x8xf32>, tensor<16x8xf32> -> tensor<4x16xf32>
    %g = pcc.tanh %h : tensor<4x16xf32>
    return %g : tensor<4x16xf32>
  }
  func.func private @stage1(%h: tensor<4x16xf32>, %t: tensor<4x8xf32>) -> tensor<f32> attributes {pcc.stage = 1 : i64} {
    %w = pcc.param "tied.weight" : tensor<16x8xf32>
    %w2 = pcc.param "fc.weight" : tensor<16x16xf32>
    %a = pcc.matmul %h, %w2 : tensor<4x16xf32>, tensor<16x16xf32> -> tensor<4x16xf32>
    %y = pcc.matmul %a, %w : tensor<4x16xf32>, tensor<16x8xf32> -> tensor<4x8xf32>
    %d = pcc.sub %y, %t : tensor<4x8xf32>
    %s = pcc.mul %d, %d : tensor<4x8xf32>
    %l = pcc.reduce_sum %s axes = [0, 1] : tensor<4x8xf32> -> tensor<f32>
    return %l : tensor<f32>
  }
  func.func @main(%x: tensor<4x8xf32>, %t: tensor<4x8xf32> {pcc.name = "labels"}) -> (tensor<f32> {pcc.name = "loss"}) {
    %0 = call @stage0(%x) : (tensor<4x8xf32>) -> tensor<4x16xf32>
    %1 = pcc.transfer %0 from 0 to 1 : tensor<4x16xf32>
    %2 = call @stage1(%1, %t) : (tensor<4x16xf32>, tensor<4x8xf32>) -> tensor<f32>
    return %2 : tensor<f32>
  }
}
// CHECK: module attributes {pcc.training = {optimizer = "adamw", tied = ["tied.weight"], weights = ["tied.weight", "fc.weight"]}}
// CHECK-LABEL: func.func @stage0_forward(%arg0: tensor<4x8xf32>) -> (tensor<4x16xf32> {pcc.name = "out0"}
// CHECK-SAME: attributes {pcc.phase = "forward", pcc.pipeline_stage = 0 : i64}
// CHECK-LABEL: func.func @stage0_backward(
// CHECK-SAME: {pcc.name = "grad_out0"}) attributes {pcc.phase = "backward", pcc.pipeline_stage = 0 : i64}
// CHECK-NEXT: return
// CHECK-LABEL: func.func @stage0_weight_grad(
// CHECK-SAME: attributes {pcc.phase = "weight_grad", pcc.pipeline_stage = 0 : i64}
// CHECK: %[[G0:.*]] = pcc.param "tied.weight@grad" : tensor<16x8xf32>
// CHECK-NEXT: pcc.accumulate %[[G0]], %{{.*}} : tensor<16x8xf32>
// CHECK-LABEL: func.func private @stage0(
// CHECK-LABEL: func.func @stage1_forward(%arg0: tensor<4x16xf32>, %arg1: tensor<4x8xf32>) -> (tensor<f32> {pcc.name = "loss"}
// CHECK-SAME: pcc.pipeline_stage = 1 : i64
// CHECK-LABEL: func.func @stage1_backward(
// CHECK-SAME: %arg3: tensor<f32> {pcc.name = "loss_grad"})
// CHECK-SAME: -> (tensor<4x16xf32> {pcc.grad_of = 0 : i32, pcc.name = "grad_in0"}, tensor<4x8xf32> {pcc.grad_of = -1 : i32, pcc.name = "stash0"}
// CHECK-SAME: attributes {pcc.phase = "backward", pcc.pipeline_stage = 1 : i64}
// CHECK-NOT: pcc.accumulate
// CHECK: return
// CHECK-LABEL: func.func @stage1_weight_grad(
// CHECK-SAME: {pcc.name = "stash0"}
// CHECK: pcc.param "tied.weight@grad"
// CHECK: pcc.param "fc.weight@grad"
// CHECK-LABEL: func.func @main(
// CHECK: call @stage0
// CHECK-LABEL: func.func @rank0_optimizer() -> (tensor<f32> {pcc.name = "grad_norm"}) attributes {pcc.phase = "optimizer", pcc.pipeline_rank = 0 : i64}
// CHECK-NEXT: %[[G:.*]] = pcc.param "tied.weight@grad" : tensor<16x8xf32>
// CHECK-NEXT: %[[S:.*]] = pcc.all_reduce %[[G]] axis = "pp" : tensor<16x8xf32>
// CHECK-NEXT: %[[D:.*]] = pcc.param "tied.weight@grad"
// CHECK-NEXT: pcc.assign %[[D]], %[[S]] : tensor<16x8xf32>
// CHECK: pcc.reduce_sum %{{.*}} axes = [0, 1] : tensor<16x8xf32> -> tensor<f32>
// CHECK: %[[N:.*]] = pcc.all_reduce %{{.*}} axis = "pp" : tensor<f32>
// CHECK: %[[NORM:.*]] = pcc.sqrt %[[N]]
// CHECK: pcc.adamw_update %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %[[NORM]] : tensor<16x8xf32>, tensor<f32>
// CHECK-NOT: pcc.adamw_update
// CHECK-LABEL: func.func @rank0_zero_grad() attributes {pcc.phase = "zero_grad", pcc.pipeline_rank = 0 : i64}
// CHECK: pcc.zero %{{.*}} : tensor<16x8xf32>
// CHECK-LABEL: func.func @rank1_optimizer()
// CHECK: pcc.all_reduce %{{.*}} axis = "pp" : tensor<16x8xf32>
// CHECK-NOT: pcc.reduce_sum %{{.*}} : tensor<16x8xf32>
// CHECK: pcc.reduce_sum %{{.*}} axes = [0, 1] : tensor<16x16xf32> -> tensor<f32>
// CHECK: pcc.all_reduce %{{.*}} axis = "pp" : tensor<f32>
// CHECK: pcc.adamw_update {{.*}} : tensor<16x8xf32>, tensor<f32>
// CHECK: pcc.adamw_update {{.*}} : tensor<16x16xf32>, tensor<f32>
// CHECK-LABEL: func.func @rank1_zero_grad()

// SGD: optimizer = "sgd"
// SGD-LABEL: func.func @rank1_optimizer()
// SGD: pcc.param "fc.weight@momentum_buffer" : tensor<16x16xf32>
// SGD: pcc.sgd_update {{.*}} : tensor<16x16xf32>, tensor<f32>

// One recompute policy per stage: stage 1 recomputes everything from its
// inputs and what crosses the narrowest point between its layers (here the
// product between its two matmuls, saved2), so its forward saves nothing
// else.
// FULL-LABEL: func.func @stage0_forward
// FULL-SAME: -> (tensor<4x16xf32> {pcc.name = "out0"}, tensor<4x16xf32> {pcc.name = "saved0"}, tensor<4x8xf32> {pcc.name = "saved1"})
// FULL-LABEL: func.func @stage1_forward(%arg0: tensor<4x16xf32>, %arg1: tensor<4x8xf32>)
// FULL-SAME: -> (tensor<f32> {pcc.name = "loss"}, tensor<4x16xf32> {pcc.name = "saved0"}, tensor<4x8xf32> {pcc.name = "saved1"}, tensor<4x16xf32> {pcc.name = "saved2"})
// FULL-NEXT: pcc.param

// The passes before it: the loss on @main, cut after node 'act'.
//--- model.mlir
module {
  pcc.mesh @mesh [dp = 1, pp = 2, tp = 1]
  func.func @main(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
    %w1 = pcc.param "fc1.weight" : tensor<8x8xf32>
    %w2 = pcc.param "fc2.weight" : tensor<8x8xf32>
    %h = pcc.matmul %x, %w1 : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32> loc(fused<"MatMul">["fc1"])
    %g = pcc.relu %h : tensor<4x8xf32> loc(fused<"Relu">["act"])
    %y = pcc.matmul %g, %w2 : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32> loc(fused<"MatMul">["fc2"])
    return %y : tensor<4x8xf32>
  }
}
// CHAIN-LABEL: func.func @stage0_weight_grad
// CHAIN: pcc.param "fc1.weight@grad" : tensor<8x8xf32>
// CHAIN-LABEL: func.func @stage1_forward(%arg0: tensor<4x8xf32>, %arg1: tensor<4x8xf32>)
// CHAIN-LABEL: func.func @stage1_weight_grad
// CHAIN: pcc.param "fc2.weight@grad" : tensor<8x8xf32>
// CHAIN-LABEL: func.func @rank0_optimizer()
// CHAIN: pcc.sgd_update {{.*}} : tensor<8x8xf32>, tensor<f32>
// CHAIN-LABEL: func.func @rank1_optimizer()

// KIND: error: optimizer: unknown optimizer 'lamb' (sgd or adamw)
// RECOMPUTE: error: autodiff: recompute 'some' for stage 0 (none, selective or full; one value, or one per stage)

//--- errors.mlir
module {
  func.func private @stage0(%x: tensor<4x8xf32>) -> tensor<f32> attributes {pcc.stage = 0 : i64} {
    %l = pcc.reduce_sum %x axes = [0, 1] : tensor<4x8xf32> -> tensor<f32>
    return %l : tensor<f32>
  }
  // expected-error @below {{autodiff: expects a module cut into stages (run pcc-pipeline-cut first)}}
  func.func @main(%x: tensor<4x8xf32>) -> tensor<f32> {
    %l = call @stage0(%x) : (tensor<4x8xf32>) -> tensor<f32>
    return %l : tensor<f32>
  }
}

// -----

module {
  pcc.mesh @mesh [dp = 1, pp = 2, tp = 1]
  func.func private @stage0(%x: tensor<4x8xf32>) -> tensor<4x8xf32> attributes {pcc.stage = 0 : i64} {
    %w = pcc.param "w" : tensor<8x8xf32>
    %h = pcc.matmul %x, %w : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
    return %h : tensor<4x8xf32>
  }
  // expected-error @below {{autodiff: the last stage must return the scalar loss alone}}
  func.func private @stage1(%h: tensor<4x8xf32>) -> tensor<4x8xf32> attributes {pcc.stage = 1 : i64} {
    return %h : tensor<4x8xf32>
  }
  func.func @main(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
    %0 = call @stage0(%x) : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %1 = pcc.transfer %0 from 0 to 1 : tensor<4x8xf32>
    %2 = call @stage1(%1) : (tensor<4x8xf32>) -> tensor<4x8xf32>
    return %2 : tensor<4x8xf32>
  }
}
