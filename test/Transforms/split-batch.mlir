// RUN: pcc-opt %s --split-input-file --pass-pipeline='builtin.module(func.func(pcc-split-batch{microbatches=2}))' -verify-diagnostics | FileCheck %s

// Tests the batch analysis: the whole-batch program of a model exported
// with a fixed batch (the batch written into a reshape and an expanded
// constant) becomes one micro-batch's program when the rows never meet;
// ops that combine rows and outputs without the batch in dimension 0 are
// refused, naming them.

// CHECK-LABEL: func.func @fixed
// CHECK-SAME: (%[[X:.*]]: tensor<2x8xf32> {pcc.name = "x"}) -> (tensor<2x2x4xf32> {pcc.name = "y"})
// CHECK: %[[W:.*]] = pcc.param "w" : tensor<8x8xf32>
// CHECK: %[[H:.*]] = pcc.matmul %[[X]], %[[W]] : tensor<2x8xf32>, tensor<8x8xf32> -> tensor<2x8xf32>
// The position table is the same for both micro-batches: its piece is
// a constant.
// CHECK: %[[P:.*]] = pcc.constant dense<{{.*}}> : tensor<2x8xf32>
// CHECK: %[[S:.*]] = pcc.add %[[H]], %[[P]] : tensor<2x8xf32>
// CHECK: pcc.reshape %[[S]] : tensor<2x8xf32> -> tensor<2x2x4xf32>
// CHECK-NOT: tensor<4x8xf32>
func.func @fixed(%x: tensor<4x8xf32> {pcc.name = "x"}) -> (tensor<4x2x4xf32> {pcc.name = "y"}) {
  %w = pcc.param "w" : tensor<8x8xf32>
  %h = pcc.matmul %x, %w : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  %p = pcc.constant dense<[[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0], [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0], [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0], [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]]> : tensor<4x8xf32>
  %s = pcc.add %h, %p : tensor<4x8xf32>
  %r = pcc.reshape %s : tensor<4x8xf32> -> tensor<4x2x4xf32>
  return %r : tensor<4x2x4xf32>
}

// -----

// A constant whose rows differ between micro-batches cannot be shared.
func.func @rows_differ(%x: tensor<4x2xf32> {pcc.name = "x"}) -> (tensor<4x2xf32> {pcc.name = "y"}) {
  // expected-error @+1 {{this value is sliced along the batch, and its slices differ between micro-batches}}
  %c = pcc.constant dense<[[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 8.0]]> : tensor<4x2xf32>
  %s = pcc.add %x, %c : tensor<4x2xf32>
  return %s : tensor<4x2xf32>
}

// -----

// A softmax over the batch combines the rows of every batch entry.
func.func @rows_meet(%x: tensor<4x8xf32> {pcc.name = "x"}) -> (tensor<4x8xf32> {pcc.name = "p"}) {
  // expected-error @+1 {{cannot split the batch into micro-batches here: this op combines rows of different batch entries (it needs the whole 'tensor<4x8xf32>' that is split by rows, dim 0)}}
  %p = pcc.softmax %x axis = 0 : tensor<4x8xf32>
  return %p : tensor<4x8xf32>
}

// -----

// x summed over the batch (as x^T x would be) is one result for all rows.
// expected-error @+1 {{graph output 'total' cannot be split into 2 micro-batches: it sums over the batch}}
func.func @sum(%x: tensor<4x8xf32> {pcc.name = "x"}) -> (tensor<8xf32> {pcc.name = "total"}) {
  %s = pcc.reduce_sum %x axes = [0] : tensor<4x8xf32> -> tensor<8xf32>
  return %s : tensor<8xf32>
}

// -----

// expected-error @+1 {{graph output 'y' cannot be split into 2 micro-batches: it holds the batch in dimension 1}}
func.func @seq_first(%x: tensor<4x3xf32> {pcc.name = "x"}) -> (tensor<3x4xf32> {pcc.name = "y"}) {
  %t = pcc.transpose %x [1, 0] : tensor<4x3xf32> -> tensor<3x4xf32>
  return %t : tensor<3x4xf32>
}

// -----

// expected-error @+1 {{graph input 'm' has 3 rows in dimension 0, but input 'x' has 4; micro-batches split one batch shared by every input}}
func.func @two_batches(%x: tensor<4x8xf32> {pcc.name = "x"}, %m: tensor<3x8xf32> {pcc.name = "m"}) -> (tensor<4x8xf32> {pcc.name = "y"}) {
  return %x : tensor<4x8xf32>
}
