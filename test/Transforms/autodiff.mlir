// RUN: pcc-opt %s --pcc-loss="kind=cross_entropy fuse-head-bytes=-1" --pcc-autodiff --canonicalize --cse --pcc-merge-state-loads --split-input-file | FileCheck %s

// A linear layer with a bias, trained with cross-entropy: the forward phase
// returns the loss sum and what the rules save (the logits, the labels and
// the layer's input); the backward phase adds each weight's gradient into
// its state as soon as it is produced.
func.func @main(%x: tensor<4x8xf32>) -> tensor<4x3xf32> {
  %w = pcc.param "fc.weight" : tensor<3x8xf32>
  %b = pcc.param "fc.bias" : tensor<3xf32>
  %y = pcc.matmul %x, %w {transpose_b} : tensor<4x8xf32>, tensor<3x8xf32> -> tensor<4x3xf32>
  %bb = pcc.broadcast %b : tensor<3xf32> -> tensor<4x3xf32>
  %z = pcc.add %y, %bb : tensor<4x3xf32>
  return %z : tensor<4x3xf32>
}

// CHECK: module attributes {pcc.training = {ignore_index = -100 : i64, loss = "cross_entropy", microbatches = 1 : i64, weights = ["fc.bias", "fc.weight"]}}
// CHECK-LABEL: func.func @train_forward(
// CHECK-SAME: %[[X:.*]]: tensor<4x8xf32>, %[[L:.*]]: tensor<4xi64> {pcc.name = "labels"})
// CHECK-SAME: -> (tensor<f32> {pcc.name = "loss"}, tensor<4x3xf32> {pcc.name = "saved0"}, tensor<4xi64> {pcc.name = "saved1"}, tensor<4x8xf32> {pcc.name = "saved2"})
// CHECK-SAME: attributes {pcc.phase = "forward"}
// CHECK: %[[Z:.*]] = pcc.add
// CHECK: %[[CE:.*]] = pcc.cross_entropy %[[Z]], %[[L]] ignore_index = -100
// CHECK: %[[S:.*]] = pcc.reduce_sum %[[CE]] axes = [0]
// CHECK: return %[[S]], %[[Z]], %[[L]], %[[X]]

// CHECK-LABEL: func.func @train_backward(
// CHECK-SAME: %[[Z2:[^:]*]]: tensor<4x3xf32> {pcc.name = "saved0"}, %[[L2:[^:]*]]: tensor<4xi64> {pcc.name = "saved1"}, %[[X2:[^:]*]]: tensor<4x8xf32> {pcc.name = "saved2"}, %[[SEED:[^:]*]]: tensor<f32> {pcc.name = "loss_grad"})
// CHECK-SAME: attributes {pcc.phase = "backward"}
// CHECK: %[[G:.*]] = pcc.broadcast {{.*}} -> tensor<4xf32>
// CHECK: %[[DZ:.*]] = pcc.cross_entropy_grad %[[Z2]], %[[L2]], %[[G]] ignore_index = -100
// CHECK: %[[DB:.*]] = pcc.reduce_sum %[[DZ]] axes = [0] {keep_dims}
// CHECK: %[[DB1:.*]] = pcc.reshape %[[DB]] : tensor<1x3xf32> -> tensor<3xf32>
// CHECK: %[[GB:.*]] = pcc.param "fc.bias@grad" : tensor<3xf32>
// CHECK: pcc.accumulate %[[GB]], %[[DB1]] : tensor<3xf32>
// CHECK: %[[DW:.*]] = pcc.matmul %[[DZ]], %[[X2]] {transpose_a} : tensor<4x3xf32>, tensor<4x8xf32> -> tensor<3x8xf32>
// CHECK: %[[GW:.*]] = pcc.param "fc.weight@grad" : tensor<3x8xf32>
// CHECK: pcc.accumulate %[[GW]], %[[DW]] : tensor<3x8xf32>
// CHECK-NOT: pcc.matmul
// CHECK: return

// -----

// A weight read by two ops (a tied embedding and LM head) receives both
// gradients: one accumulate each, into the same state.
func.func @main(%ids: tensor<2x4xi64>) -> tensor<2x4x16xf32> {
  %t = pcc.param "wte.weight" : tensor<16x8xf32>
  %e = pcc.gather %t[%ids] axis = 0 : tensor<16x8xf32>, tensor<2x4xi64> -> tensor<2x4x8xf32>
  %l = pcc.matmul %e, %t {transpose_b} : tensor<2x4x8xf32>, tensor<16x8xf32> -> tensor<2x4x16xf32>
  return %l : tensor<2x4x16xf32>
}
// CHECK-LABEL: func.func @train_backward
// CHECK: %[[G1:.*]] = pcc.matmul {{.*}} {transpose_a} : tensor<8x16xf32>, tensor<8x8xf32> -> tensor<16x8xf32>
// CHECK: %[[S:.*]] = pcc.param "wte.weight@grad" : tensor<16x8xf32>
// CHECK: pcc.accumulate %[[S]], %[[G1]]
// CHECK: %[[G2:.*]] = pcc.scatter_add {{.*}} axis = 0 : tensor<2x4x8xf32>, tensor<2x4xi64> -> tensor<16x8xf32>
// CHECK: pcc.accumulate %[[S]], %[[G2]]

// -----

// A per-row scale broadcast over the row (an RMSNorm's) and multiplied into
// the input of a product: the backward needs the scale for the first
// weight's gradient. The forward saves the [4, 1] scale, and the backward
// broadcasts it again, rather than saving the [4, 8] broadcast.
func.func @main(%x: tensor<4x8xf32>) -> tensor<4x3xf32> {
  %w1 = pcc.param "fc1.weight" : tensor<8x8xf32>
  %w2 = pcc.param "fc2.weight" : tensor<3x8xf32>
  %h = pcc.matmul %x, %w1 {transpose_b} : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  %s = pcc.reduce_sum %x axes = [1] {keep_dims} : tensor<4x8xf32> -> tensor<4x1xf32>
  %sb = pcc.broadcast %s : tensor<4x1xf32> -> tensor<4x8xf32>
  %n = pcc.mul %h, %sb : tensor<4x8xf32>
  %y = pcc.matmul %n, %w2 {transpose_b} : tensor<4x8xf32>, tensor<3x8xf32> -> tensor<4x3xf32>
  return %y : tensor<4x3xf32>
}
// CHECK-LABEL: func.func @train_forward(
// CHECK-SAME: tensor<4x1xf32> {pcc.name = "saved
// CHECK-SAME: attributes {pcc.phase = "forward"}
// CHECK-LABEL: func.func @train_backward(
// CHECK-SAME: %[[S:[^:]*]]: tensor<4x1xf32> {pcc.name = "saved
// CHECK: pcc.broadcast %[[S]] : tensor<4x1xf32> -> tensor<4x8xf32>
