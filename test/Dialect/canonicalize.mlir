// RUN: pcc-opt %s --split-input-file --canonicalize | FileCheck %s

// Tests that identity reshapes, transposes, broadcasts, casts and slices fold away.
// CHECK-LABEL: func.func @identities
// CHECK-SAME:    (%[[X:.+]]: tensor<2x3xf32>)
// CHECK-NEXT:    return %[[X]] : tensor<2x3xf32>
func.func @identities(%x: tensor<2x3xf32>) -> tensor<2x3xf32> {
  %0 = pcc.reshape %x : tensor<2x3xf32> -> tensor<2x3xf32>
  %1 = pcc.transpose %0 [0, 1] : tensor<2x3xf32> -> tensor<2x3xf32>
  %2 = pcc.broadcast %1 : tensor<2x3xf32> -> tensor<2x3xf32>
  %3 = pcc.cast %2 : tensor<2x3xf32> -> tensor<2x3xf32>
  %4 = pcc.slice %3 starts = [0, 0] limits = [2, 3] steps = [1, 1] : tensor<2x3xf32> -> tensor<2x3xf32>
  return %4 : tensor<2x3xf32>
}

// -----

// Tests that adding zero and multiplying by one fold away.
// CHECK-LABEL: func.func @neutral_elements
// CHECK-SAME:    (%[[X:.+]]: tensor<4xf32>)
// CHECK-NEXT:    return %[[X]] : tensor<4xf32>
func.func @neutral_elements(%x: tensor<4xf32>) -> tensor<4xf32> {
  %zero = pcc.constant dense<0.0> : tensor<4xf32>
  %one = pcc.constant dense<1.0> : tensor<4xf32>
  %0 = pcc.add %x, %zero : tensor<4xf32>
  %1 = pcc.mul %one, %0 : tensor<4xf32>
  return %1 : tensor<4xf32>
}

// -----

// Tests that chains of reshapes merge into one.
// CHECK-LABEL: func.func @reshape_chain
// CHECK-NEXT:    %[[R:.+]] = pcc.reshape %{{.*}} : tensor<2x3x4xf32> -> tensor<6x4xf32>
// CHECK-NEXT:    return %[[R]]
func.func @reshape_chain(%x: tensor<2x3x4xf32>) -> tensor<6x4xf32> {
  %0 = pcc.reshape %x : tensor<2x3x4xf32> -> tensor<24xf32>
  %1 = pcc.reshape %0 : tensor<24xf32> -> tensor<6x4xf32>
  return %1 : tensor<6x4xf32>
}

// -----

// Tests that two transposes compose, and cancel when inverse.
// CHECK-LABEL: func.func @transpose_chain
// CHECK-SAME:    (%[[X:.+]]: tensor<2x3x4xf32>)
// CHECK-NEXT:    %[[T:.+]] = pcc.transpose %[[X]] [2, 0, 1] : tensor<2x3x4xf32> -> tensor<4x2x3xf32>
// CHECK-NEXT:    return %[[T]], %[[X]]
func.func @transpose_chain(%x: tensor<2x3x4xf32>) -> (tensor<4x2x3xf32>, tensor<2x3x4xf32>) {
  %0 = pcc.transpose %x [1, 0, 2] : tensor<2x3x4xf32> -> tensor<3x2x4xf32>
  %1 = pcc.transpose %0 [2, 1, 0] : tensor<3x2x4xf32> -> tensor<4x2x3xf32>
  %2 = pcc.transpose %x [0, 2, 1] : tensor<2x3x4xf32> -> tensor<2x4x3xf32>
  %3 = pcc.transpose %2 [0, 2, 1] : tensor<2x4x3xf32> -> tensor<2x3x4xf32>
  return %1, %3 : tensor<4x2x3xf32>, tensor<2x3x4xf32>
}

// -----

// Tests that constants fold through reshape and splat broadcast.
// CHECK-LABEL: func.func @constant_folding
// CHECK-DAG:     pcc.constant dense<{{\[}}[1, 2], [3, 4]]> : tensor<2x2xi64>
// CHECK-DAG:     pcc.constant dense<5.000000e-01> : tensor<2x8xf32>
// CHECK-NOT:     pcc.reshape
// CHECK-NOT:     pcc.broadcast
func.func @constant_folding() -> (tensor<2x2xi64>, tensor<2x8xf32>) {
  %c = pcc.constant dense<[1, 2, 3, 4]> : tensor<4xi64>
  %0 = pcc.reshape %c : tensor<4xi64> -> tensor<2x2xi64>
  %h = pcc.constant dense<0.5> : tensor<8xf32>
  %1 = pcc.broadcast %h : tensor<8xf32> -> tensor<2x8xf32>
  return %0, %1 : tensor<2x2xi64>, tensor<2x8xf32>
}

// -----

// Tests that unused params are removed and duplicate reads are merged by CSE.
// CHECK-LABEL: func.func @params
// CHECK-NOT:     pcc.param "unused"
// RUN: pcc-opt %s --split-input-file --canonicalize --cse | FileCheck %s --check-prefix=CSE
// CSE-LABEL:     func.func @params
// CSE-COUNT-1:   pcc.param "w"
// CSE-NOT:       pcc.param
func.func @params(%x: tensor<4x4xf32>) -> tensor<4x4xf32> {
  %unused = pcc.param "unused" : tensor<4x4xf32>
  %w1 = pcc.param "w" : tensor<4x4xf32>
  %w2 = pcc.param "w" : tensor<4x4xf32>
  %0 = pcc.matmul %x, %w1 : tensor<4x4xf32>, tensor<4x4xf32> -> tensor<4x4xf32>
  %1 = pcc.matmul %0, %w2 : tensor<4x4xf32>, tensor<4x4xf32> -> tensor<4x4xf32>
  return %1 : tensor<4x4xf32>
}

// -----

// Tests that the exporters' guard Where(IsNaN(Softmax(s)), 0, Softmax(s))
// becomes one softmax that writes 0 for NaN; a guard with another value
// stays.
// CHECK-LABEL: func.func @nan_guard
// CHECK-NEXT:    %[[S:.*]] = pcc.softmax %arg0 axis = 1 {nan_to_zero} : tensor<2x4xf32>
// CHECK-NEXT:    return %[[S]]
func.func @nan_guard(%x: tensor<2x4xf32>) -> tensor<2x4xf32> {
  %s = pcc.softmax %x axis = 1 : tensor<2x4xf32>
  %n = pcc.is_nan %s : tensor<2x4xf32> -> tensor<2x4xi1>
  %z = pcc.constant dense<0.0> : tensor<2x4xf32>
  %y = pcc.select %n, %z, %s : tensor<2x4xi1>, tensor<2x4xf32>
  return %y : tensor<2x4xf32>
}
// CHECK-LABEL: func.func @nan_guard_one
// CHECK:         pcc.is_nan
// CHECK:         pcc.select
func.func @nan_guard_one(%x: tensor<2x4xf32>) -> tensor<2x4xf32> {
  %s = pcc.softmax %x axis = 1 : tensor<2x4xf32>
  %n = pcc.is_nan %s : tensor<2x4xf32> -> tensor<2x4xi1>
  %z = pcc.constant dense<1.0> : tensor<2x4xf32>
  %y = pcc.select %n, %z, %s : tensor<2x4xi1>, tensor<2x4xf32>
  return %y : tensor<2x4xf32>
}

// -----

// Tests that a lookup with the same positions for every batch entry looks
// up once and broadcasts, and that a row gather from a flattened
// [batch, seq] table gathers within each batch entry.
// CHECK-LABEL: func.func @gathers
// CHECK-DAG:     %[[P:.*]] = pcc.constant dense<{{\[\[}}0, 1, 2]]> : tensor<1x3xi64>
// CHECK-DAG:     %[[W:.*]] = pcc.constant dense<{{\[\[}}1], [2]]> : tensor<2x1xi64>
// CHECK:         %[[E:.*]] = pcc.gather %arg0[%[[P]]] axis = 0 : tensor<8x4xf32>, tensor<1x3xi64> -> tensor<1x3x4xf32>
// CHECK:         pcc.broadcast %[[E]] : tensor<1x3x4xf32> -> tensor<2x3x4xf32>
// CHECK:         %[[V:.*]] = pcc.reshape %arg1 : tensor<6x1xf32> -> tensor<2x3x1xf32>
// CHECK:         pcc.gather %[[V]][%[[W]]] axis = 1 : tensor<2x3x1xf32>, tensor<2x1xi64> -> tensor<2x2x1x1xf32>
func.func @gathers(%table: tensor<8x4xf32>, %flat: tensor<6x1xf32>) -> (tensor<2x3x4xf32>, tensor<2x2x1x1xf32>) {
  %pos = pcc.constant dense<[[0, 1, 2], [0, 1, 2]]> : tensor<2x3xi64>
  %e = pcc.gather %table[%pos] axis = 0 : tensor<8x4xf32>, tensor<2x3xi64> -> tensor<2x3x4xf32>
  %rows = pcc.constant dense<[[[1], [2]], [[4], [5]]]> : tensor<2x2x1xi64>
  %m = pcc.gather %flat[%rows] axis = 0 : tensor<6x1xf32>, tensor<2x2x1xi64> -> tensor<2x2x1x1xf32>
  return %e, %m : tensor<2x3x4xf32>, tensor<2x2x1x1xf32>
}

// -----

// Tests that arithmetic, comparisons and casts of float splats fold as the
// back ends compute them (a pow gradient's exponent - 1 and its mask): a
// bf16 result is computed in f32 and rounded to bf16 (0.1 + 0.2 = 0.3 in
// f32, 0.30078125 in bf16); a cast rounds to nearest even (0.1 in bf16 is
// 0.10009765625); a select on a splat condition picks its side; x - 0 and
// x / 1 are x.
// CHECK-LABEL: func.func @splat_arithmetic
// CHECK-DAG:     %[[TWO:.*]] = pcc.constant dense<2.000000e+00> : tensor<4xbf16>
// CHECK-DAG:     %[[SUM:.*]] = pcc.constant dense<3.007810e-01> : tensor<4xbf16>
// CHECK-DAG:     %[[TENTH:.*]] = pcc.constant dense<1.000980e-01> : tensor<4xbf16>
// CHECK-DAG:     %[[Q:.*]] = pcc.constant dense<2.500000e-01> : tensor<4xf32>
// CHECK:         %[[P:.*]] = pcc.pow %arg0, %[[TWO]] : tensor<4xbf16>
// CHECK:         return %[[P]], %[[SUM]], %[[TENTH]], %[[Q]], %arg1
func.func @splat_arithmetic(%x: tensor<4xbf16>, %y: tensor<4xf32>) -> (tensor<4xbf16>, tensor<4xbf16>, tensor<4xbf16>, tensor<4xf32>, tensor<4xf32>) {
  %three = pcc.constant dense<3.0> : tensor<4xbf16>
  %one = pcc.constant dense<1.0> : tensor<4xbf16>
  %zero = pcc.constant dense<0.0> : tensor<4xbf16>
  %e = pcc.sub %three, %one : tensor<4xbf16>
  %p = pcc.pow %x, %e : tensor<4xbf16>
  %nonzero = pcc.compare ne, %three, %zero : tensor<4xbf16>
  %g = pcc.select %nonzero, %p, %zero : tensor<4xi1>, tensor<4xbf16>
  %a = pcc.constant dense<0.1> : tensor<4xbf16>
  %b = pcc.constant dense<0.2> : tensor<4xbf16>
  %s = pcc.add %a, %b : tensor<4xbf16>
  %tenth32 = pcc.constant dense<0.1> : tensor<4xf32>
  %tenth = pcc.cast %tenth32 : tensor<4xf32> -> tensor<4xbf16>
  %half = pcc.constant dense<0.5> : tensor<4xf32>
  %q = pcc.mul %half, %half : tensor<4xf32>
  %zero32 = pcc.constant dense<0.0> : tensor<4xf32>
  %one32 = pcc.constant dense<1.0> : tensor<4xf32>
  %d = pcc.sub %y, %zero32 : tensor<4xf32>
  %r = pcc.div %d, %one32 : tensor<4xf32>
  return %g, %s, %tenth, %q, %r : tensor<4xbf16>, tensor<4xbf16>, tensor<4xbf16>, tensor<4xf32>, tensor<4xf32>
}

// -----

// Tests that this rank's slice of a scatter-add along the scattered axis
// becomes the scatter-add of this rank's block (the vocabulary-parallel
// embedding's gradient without the whole table), and that a slice along
// another dimension, a striped one or a table with another reader is kept.
// CHECK-LABEL: func.func @scatter_only_the_block
// CHECK-SAME:    (%[[G:.+]]: tensor<2x3x8xf32>, %[[I:.+]]: tensor<2x3xi64>)
// CHECK-NEXT:    %[[B:.+]] = pcc.shard_scatter_add %[[G]][%[[I]]] axis = 0 mesh_axis = "tp" : tensor<2x3x8xf32>, tensor<2x3xi64> -> tensor<8x8xf32>
// CHECK-NEXT:    %[[W:.+]] = pcc.scatter_add %[[G]][%[[I]]] axis = 0 : tensor<2x3x8xf32>, tensor<2x3xi64> -> tensor<16x8xf32>
// CHECK-NEXT:    %[[C:.+]] = pcc.shard_slice %[[W]] axis = "tp" dim = 1
// CHECK-NEXT:    %[[S:.+]] = pcc.shard_slice %[[W]] axis = "tp" dim = 0 stripes = 2
// CHECK-NEXT:    return %[[B]], %[[C]], %[[S]]
module {
  pcc.mesh @mesh [tp = 2]
  func.func @scatter_only_the_block(%g: tensor<2x3x8xf32>, %ids: tensor<2x3xi64>) -> (tensor<8x8xf32>, tensor<16x4xf32>, tensor<8x8xf32>) {
    %t = pcc.scatter_add %g[%ids] axis = 0 : tensor<2x3x8xf32>, tensor<2x3xi64> -> tensor<16x8xf32>
    %b = pcc.shard_slice %t axis = "tp" dim = 0 stripes = 1 : tensor<16x8xf32> -> tensor<8x8xf32>
    %w = pcc.scatter_add %g[%ids] axis = 0 : tensor<2x3x8xf32>, tensor<2x3xi64> -> tensor<16x8xf32>
    %c = pcc.shard_slice %w axis = "tp" dim = 1 stripes = 1 : tensor<16x8xf32> -> tensor<16x4xf32>
    %s = pcc.shard_slice %w axis = "tp" dim = 0 stripes = 2 : tensor<16x8xf32> -> tensor<8x8xf32>
    return %b, %c, %s : tensor<8x8xf32>, tensor<16x4xf32>, tensor<8x8xf32>
  }
}
