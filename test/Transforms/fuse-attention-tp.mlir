// RUN: pcc-opt %s --pass-pipeline='builtin.module(func.func(pcc-fuse-attention{tensor-parallel=4}),canonicalize)' | FileCheck %s

// Tests that grouped-query attention whose 2 key/value heads 4 tp ranks
// cannot split stays decomposed: K and V repeated to the 4 query heads,
// whose repeats tp splits (Megatron keeps K and V whole). At tp 2 it fuses.
// RUN: pcc-opt %s --pass-pipeline='builtin.module(func.func(pcc-fuse-attention{tensor-parallel=2}),canonicalize)' | FileCheck %s --check-prefix=TP2
// CHECK-LABEL: func.func @grouped_query
// CHECK-NOT: pcc.attention
// CHECK: pcc.softmax
// TP2: pcc.attention
func.func @grouped_query(%q: tensor<1x4x3x8xf32>, %k: tensor<1x2x3x8xf32>, %v: tensor<1x2x3x8xf32>) -> tensor<1x4x3x8xf32> {
  %k5 = pcc.reshape %k : tensor<1x2x3x8xf32> -> tensor<1x2x1x3x8xf32>
  %kb = pcc.broadcast %k5 : tensor<1x2x1x3x8xf32> -> tensor<1x2x2x3x8xf32>
  %kr = pcc.reshape %kb : tensor<1x2x2x3x8xf32> -> tensor<1x4x3x8xf32>
  %v5 = pcc.reshape %v : tensor<1x2x3x8xf32> -> tensor<1x2x1x3x8xf32>
  %vb = pcc.broadcast %v5 : tensor<1x2x1x3x8xf32> -> tensor<1x2x2x3x8xf32>
  %vr = pcc.reshape %vb : tensor<1x2x2x3x8xf32> -> tensor<1x4x3x8xf32>
  %s = pcc.matmul %q, %kr {transpose_b} : tensor<1x4x3x8xf32>, tensor<1x4x3x8xf32> -> tensor<1x4x3x3xf32>
  %p = pcc.softmax %s axis = 3 : tensor<1x4x3x3xf32>
  %o = pcc.matmul %p, %vr : tensor<1x4x3x3xf32>, tensor<1x4x3x8xf32> -> tensor<1x4x3x8xf32>
  return %o : tensor<1x4x3x8xf32>
}
