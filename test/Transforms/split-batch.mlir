// RUN: pcc-opt %s --split-input-file --pass-pipeline='builtin.module(func.func(pcc-split-batch{microbatches=2}))' -verify-diagnostics | FileCheck %s

// Tests the batch analysis: the whole-batch program of a model exported
// with a fixed batch (the batch written into a reshape and an expanded
// constant) becomes one micro-batch's program when the rows never meet;
// the batch may be dimension 0 or (sequence-first) dimension 1 of the
// inputs and any dimension of an output (recorded as pcc.batch_dim); ops
// that combine rows in both are refused, naming them.

// CHECK-LABEL: func.func @fixed
// CHECK-SAME: (%[[X:.*]]: tensor<2x8xf32> {pcc.batch_dim = 0 : i64, pcc.name = "x"}) -> (tensor<2x2x4xf32> {pcc.batch_dim = 0 : i64, pcc.name = "y"})
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
// (Rows of dimension 1 would be independent too, so the error comes from
// the attempt the analysis keeps: dimension 0.)
func.func @rows_differ(%x: tensor<4x2xf32> {pcc.name = "x"}) -> (tensor<4x2xf32> {pcc.name = "y"}) {
  // expected-error @+1 {{this value is sliced along the batch, and its slices differ between micro-batches}}
  %c = pcc.constant dense<[[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 8.0]]> : tensor<4x2xf32>
  %s = pcc.add %x, %c : tensor<4x2xf32>
  return %s : tensor<4x2xf32>
}

// -----

// x xT combines the rows of every batch entry (and sums over dimension 1).
func.func @rows_meet(%x: tensor<4x8xf32> {pcc.name = "x"}) -> (tensor<4x4xf32> {pcc.name = "p"}) {
  // expected-error @+1 {{cannot split the batch into micro-batches here: this op combines rows of different batch entries (it needs the whole 'tensor<4x8xf32>' that is split by rows, dim 0)}}
  %p = pcc.matmul %x, %x {transpose_b} : tensor<4x8xf32>, tensor<4x8xf32> -> tensor<4x4xf32>
  return %p : tensor<4x4xf32>
}

// -----

// x summed over everything is one result for all rows.
// expected-error @+1 {{graph output 'total' cannot be split into 2 micro-batches: it sums over the batch}}
func.func @sum(%x: tensor<4x8xf32> {pcc.name = "x"}) -> (tensor<1x1xf32> {pcc.name = "total"}) {
  %s = pcc.reduce_sum %x axes = [0, 1] {keep_dims} : tensor<4x8xf32> -> tensor<1x1xf32>
  return %s : tensor<1x1xf32>
}

// -----

// An output that holds the batch in dimension 1 (sequence-first): the
// runtime cuts and reassembles micro-batches along the recorded dimension.
// CHECK-LABEL: func.func @seq_first_out
// CHECK-SAME: (%{{.*}}: tensor<2x3xf32> {pcc.batch_dim = 0 : i64, pcc.name = "x"}) -> (tensor<3x2xf32> {pcc.batch_dim = 1 : i64, pcc.name = "y"})
func.func @seq_first_out(%x: tensor<4x3xf32> {pcc.name = "x"}) -> (tensor<3x4xf32> {pcc.name = "y"}) {
  %t = pcc.transpose %x [1, 0] : tensor<4x3xf32> -> tensor<3x4xf32>
  return %t : tensor<3x4xf32>
}

// -----

// Sequence-first inputs: a softmax over dimension 0 (the sequence) makes
// rows of dimension 0 meet, so the batch is dimension 1.
// CHECK-LABEL: func.func @seq_first_in
// CHECK-SAME: (%{{.*}}: tensor<5x2x8xf32> {pcc.batch_dim = 1 : i64, pcc.name = "x"}) -> (tensor<5x2x8xf32> {pcc.batch_dim = 1 : i64, pcc.name = "y"})
// CHECK: pcc.softmax %{{.*}} axis = 0 : tensor<5x2x8xf32>
func.func @seq_first_in(%x: tensor<5x4x8xf32> {pcc.name = "x"}) -> (tensor<5x4x8xf32> {pcc.name = "y"}) {
  %s = pcc.softmax %x axis = 0 : tensor<5x4x8xf32>
  return %s : tensor<5x4x8xf32>
}

// -----

// expected-error @+1 {{graph input 'm' has 3 rows in dimension 0, but input 'x' has 4; micro-batches split one batch shared by every input}}
func.func @two_batches(%x: tensor<4x8xf32> {pcc.name = "x"}, %m: tensor<3x5xf32> {pcc.name = "m"}) -> (tensor<4x8xf32> {pcc.name = "y"}) {
  return %x : tensor<4x8xf32>
}

// -----

// A mask computed from constants rather than folded (the exporters' causal
// masks past the importer's folding limit): aranges repeated over the
// batch, broadcast, compared and selected. Every micro-batch's slice is the
// same, so its program computes the mask's piece from the constants'
// pieces.
// CHECK-LABEL: func.func @computed_mask
// CHECK-DAG: %[[Q:.*]] = pcc.constant dense<{{.*}}> : tensor<2x4x1xi64>
// CHECK-DAG: %[[K:.*]] = pcc.constant dense<{{.*}}> : tensor<1x4xi64>
// CHECK-DAG: %[[BQ:.*]] = pcc.broadcast %[[Q]] : tensor<2x4x1xi64> -> tensor<2x4x4xi64>
// CHECK-DAG: %[[BK:.*]] = pcc.broadcast %[[K]] : tensor<1x4xi64> -> tensor<2x4x4xi64>
// CHECK: %[[C:.*]] = pcc.compare le, %[[BK]], %[[BQ]] : tensor<2x4x4xi64>
// CHECK: %[[M:.*]] = pcc.select %[[C]], %{{.*}}, %{{.*}} : tensor<2x4x4xi1>, tensor<2x4x4xf32>
// CHECK: pcc.add %{{.*}}, %[[M]] : tensor<2x4x4xf32>
// CHECK-NOT: tensor<4x4x4
func.func @computed_mask(%x: tensor<4x4x4xf32> {pcc.name = "x"}) -> (tensor<4x4x4xf32> {pcc.name = "y"}) {
  %q = pcc.constant dense<[[[0], [1], [2], [3]], [[0], [1], [2], [3]], [[0], [1], [2], [3]], [[0], [1], [2], [3]]]> : tensor<4x4x1xi64>
  %k = pcc.constant dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>
  %bq = pcc.broadcast %q : tensor<4x4x1xi64> -> tensor<4x4x4xi64>
  %bk = pcc.broadcast %k : tensor<1x4xi64> -> tensor<4x4x4xi64>
  %c = pcc.compare le, %bk, %bq : tensor<4x4x4xi64>
  %zero = pcc.constant dense<0.0> : tensor<4x4x4xf32>
  %low = pcc.constant dense<-1.0e30> : tensor<4x4x4xf32>
  %m = pcc.select %c, %zero, %low : tensor<4x4x4xi1>, tensor<4x4x4xf32>
  %y = pcc.add %x, %m : tensor<4x4x4xf32>
  return %y : tensor<4x4x4xf32>
}

// -----

// The same with rows that differ between micro-batches: refused.
func.func @differing_mask(%x: tensor<4x4xf32> {pcc.name = "x"}) -> (tensor<4x4xf32> {pcc.name = "y"}) {
  %q = pcc.constant dense<[[0], [1], [2], [3]]> : tensor<4x1xi64>
  %bq = pcc.broadcast %q : tensor<4x1xi64> -> tensor<4x4xi64>
  %k = pcc.constant dense<2> : tensor<4x4xi64>
  %c = pcc.compare le, %bq, %k : tensor<4x4xi64>
  %zero = pcc.constant dense<0.0> : tensor<4x4xf32>
  %low = pcc.constant dense<-1.0e30> : tensor<4x4xf32>
  // expected-error @+1 {{cannot split the batch into micro-batches: this value is sliced along the batch, and its slices differ between micro-batches}}
  %m = pcc.select %c, %zero, %low : tensor<4x4xi1>, tensor<4x4xf32>
  %y = pcc.add %x, %m : tensor<4x4xf32>
  return %y : tensor<4x4xf32>
}

// -----

// A gather from a splat table is that splat whichever rows the indices
// pick (the exporters' padding mask, attention_mask[b, kv] of an all-ones
// mask, left computed past the folding limit at 1,024 x 4,096 tokens).
// CHECK-LABEL: func.func @splat_gather
// CHECK: %[[G:.*]] = pcc.constant dense<1.000000e+00> : tensor<2x4xf32>
// CHECK: pcc.mul %{{.*}}, %[[G]] : tensor<2x4xf32>
// CHECK-NOT: pcc.gather
func.func @splat_gather(%x: tensor<4x4xf32> {pcc.name = "x"}) -> (tensor<4x4xf32> {pcc.name = "y"}) {
  %t = pcc.constant dense<1.0> : tensor<16xf32>
  %i = pcc.constant dense<[[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]> : tensor<4x4xi64>
  %z = pcc.constant dense<0> : tensor<4x4xi64>
  %j = pcc.add %i, %z : tensor<4x4xi64>
  %g = pcc.gather %t[%j] axis = 0 : tensor<16xf32>, tensor<4x4xi64> -> tensor<4x4xf32>
  %y = pcc.mul %x, %g : tensor<4x4xf32>
  return %y : tensor<4x4xf32>
}

// -----

// From a table whose entries differ, the rows picked differ: refused, and
// the error names the op it could not see through.
func.func @table_gather(%x: tensor<4x4xf32> {pcc.name = "x"}) -> (tensor<4x4xf32> {pcc.name = "y"}) {
  %t = pcc.constant dense<[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0]> : tensor<16xf32>
  %i = pcc.constant dense<[[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]> : tensor<4x4xi64>
  %z = pcc.constant dense<0> : tensor<4x4xi64>
  %j = pcc.add %i, %z : tensor<4x4xi64>
  // expected-error @+1 {{slices differ between micro-batches (or cannot be shown equal through pcc.gather at}}
  %g = pcc.gather %t[%j] axis = 0 : tensor<16xf32>, tensor<4x4xi64> -> tensor<4x4xf32>
  %y = pcc.mul %x, %g : tensor<4x4xf32>
  return %y : tensor<4x4xf32>
}

// -----

// Hugging Face's `mask[batch_idx, q_idx]`, as the importer flattens a
// GatherND past the folding limit: gather(reshape(table), b * 4 + q) with
// (b, q) sliced from stacked index tuples. The table's rows are all the
// same (position ids repeated over the batch), so whichever row b picks,
// the entry is row 0's at q mod 4; the batch index b is never built.
// CHECK-LABEL: func.func @gathernd_rows
// CHECK: %[[ROW:.*]] = pcc.reshape %{{.*}} : tensor<1x4xi64> -> tensor<4xi64>
// CHECK: %[[Q1:.*]] = pcc.constant dense<{{\[\[\[}}0], [1], [2], [3]], {{\[\[}}0], [1], [2], [3]]]> : tensor<2x4x1xi64>
// CHECK: %[[Q:.*]] = pcc.reshape %[[Q1]] : tensor<2x4x1xi64> -> tensor<2x4xi64>
// CHECK: %[[S:.*]] = pcc.constant dense<4> : tensor<2x4xi64>
// CHECK: %[[I:.*]] = pcc.mod %[[Q]], %[[S]] : tensor<2x4xi64>
// CHECK: pcc.gather %[[ROW]][%[[I]]] axis = 0 : tensor<4xi64>, tensor<2x4xi64> -> tensor<2x4xi64>
// CHECK-NOT: tensor<16xi64>
// CHECK-NOT: tensor<4x4x2xi64>
func.func @gathernd_rows(%x: tensor<4x4xf32> {pcc.name = "x"}) -> (tensor<4x4xf32> {pcc.name = "y"}) {
  %p = pcc.constant dense<[[0, 1, 2, 3], [0, 1, 2, 3], [0, 1, 2, 3], [0, 1, 2, 3]]> : tensor<4x4xi64>
  %one = pcc.constant dense<1> : tensor<4x4xi64>
  %ids = pcc.add %p, %one : tensor<4x4xi64>
  %flat = pcc.reshape %ids : tensor<4x4xi64> -> tensor<16xi64>
  %b = pcc.constant dense<[[[0], [0], [0], [0]], [[1], [1], [1], [1]], [[2], [2], [2], [2]], [[3], [3], [3], [3]]]> : tensor<4x4x1xi64>
  %q = pcc.constant dense<[[[0], [1], [2], [3]], [[0], [1], [2], [3]], [[0], [1], [2], [3]], [[0], [1], [2], [3]]]> : tensor<4x4x1xi64>
  %t = pcc.concat %b, %q axis = 2 : tensor<4x4x1xi64>, tensor<4x4x1xi64> -> tensor<4x4x2xi64>
  %t0 = pcc.slice %t starts = [0, 0, 0] limits = [4, 4, 1] steps = [1, 1, 1] : tensor<4x4x2xi64> -> tensor<4x4x1xi64>
  %r0 = pcc.reshape %t0 : tensor<4x4x1xi64> -> tensor<4x4xi64>
  %s = pcc.constant dense<4> : tensor<4x4xi64>
  %rs = pcc.mul %r0, %s : tensor<4x4xi64>
  %t1 = pcc.slice %t starts = [0, 0, 1] limits = [4, 4, 2] steps = [1, 1, 1] : tensor<4x4x2xi64> -> tensor<4x4x1xi64>
  %r1 = pcc.reshape %t1 : tensor<4x4x1xi64> -> tensor<4x4xi64>
  %k = pcc.add %rs, %r1 : tensor<4x4xi64>
  %g = pcc.gather %flat[%k] axis = 0 : tensor<16xi64>, tensor<4x4xi64> -> tensor<4x4xi64>
  %c = pcc.cast %g : tensor<4x4xi64> -> tensor<4x4xf32>
  %y = pcc.add %x, %c : tensor<4x4xf32>
  return %y : tensor<4x4xf32>
}

// -----

// The same over a table whose rows differ (each batch entry its own
// positions): the entries picked differ between micro-batches, refused,
// naming the table whose rows differ.
func.func @gathernd_rows_differ(%x: tensor<4x4xf32> {pcc.name = "x"}) -> (tensor<4x4xf32> {pcc.name = "y"}) {
  %p = pcc.constant dense<[[0, 1, 2, 3], [0, 1, 2, 3], [4, 5, 6, 7], [4, 5, 6, 7]]> : tensor<4x4xi64>
  %one = pcc.constant dense<1> : tensor<4x4xi64>
  %ids = pcc.add %p, %one : tensor<4x4xi64>
  %flat = pcc.reshape %ids : tensor<4x4xi64> -> tensor<16xi64>
  %b = pcc.constant dense<[[0, 0, 0, 0], [1, 1, 1, 1], [2, 2, 2, 2], [3, 3, 3, 3]]> : tensor<4x4xi64>
  %q = pcc.constant dense<[[0, 1, 2, 3], [0, 1, 2, 3], [0, 1, 2, 3], [0, 1, 2, 3]]> : tensor<4x4xi64>
  %s = pcc.constant dense<4> : tensor<4x4xi64>
  %rs = pcc.mul %b, %s : tensor<4x4xi64>
  %k = pcc.add %rs, %q : tensor<4x4xi64>
  %g = pcc.gather %flat[%k] axis = 0 : tensor<16xi64>, tensor<4x4xi64> -> tensor<4x4xi64>
  // expected-error @+1 {{slices differ between micro-batches (or cannot be shown equal through pcc.constant at}}
  %c = pcc.cast %g : tensor<4x4xi64> -> tensor<4x4xf32>
  %y = pcc.add %x, %c : tensor<4x4xf32>
  return %y : tensor<4x4xf32>
}
