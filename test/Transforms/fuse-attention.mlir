// RUN: pcc-opt %s --split-input-file --pass-pipeline='builtin.module(func.func(pcc-fuse-attention),canonicalize)' | FileCheck %s

// Tests the dynamo exporter's GPT-2 attention: q and k^T each scaled by
// d^-1/4, k^T made by reshape / transpose / reshape, the causal mask a
// constant broadcast over the heads, softmax with nan_to_zero. It becomes
// one causal pcc.attention of scale 1/8 on the untransposed keys.
// CHECK-LABEL: func.func @exporter_causal
// CHECK-SAME: (%[[Q:.*]]: tensor<2x3x4x8xf32>, %[[K:.*]]: tensor<2x3x4x8xf32>, %[[V:.*]]: tensor<2x3x4x8xf32>)
// CHECK-NEXT: %[[O:.*]], %{{.*}} = pcc.attention %[[Q]], %[[K]], %[[V]] scale = 0.12499999{{[0-9]*}} {causal} : tensor<2x3x4x8xf32>, tensor<2x3x4x8xf32>, tensor<2x3x4x8xf32> -> tensor<2x3x4x8xf32>, tensor<2x3x4xf32>
// CHECK-NEXT: return %[[O]]
func.func @exporter_causal(%q: tensor<2x3x4x8xf32>, %k: tensor<2x3x4x8xf32>, %v: tensor<2x3x4x8xf32>) -> tensor<2x3x4x8xf32> {
  %cq = pcc.constant dense<0.353553385> : tensor<2x3x4x8xf32>
  %ck = pcc.constant dense<0.353553385> : tensor<2x3x8x4xf32>
  %mask = pcc.constant dense<[[[[0.0, -3.40282347E+38, -3.40282347E+38, -3.40282347E+38], [0.0, 0.0, -3.40282347E+38, -3.40282347E+38], [0.0, 0.0, 0.0, -3.40282347E+38], [0.0, 0.0, 0.0, 0.0]]], [[[0.0, -3.40282347E+38, -3.40282347E+38, -3.40282347E+38], [0.0, 0.0, -3.40282347E+38, -3.40282347E+38], [0.0, 0.0, 0.0, -3.40282347E+38], [0.0, 0.0, 0.0, 0.0]]]]> : tensor<2x1x4x4xf32>
  %k3 = pcc.reshape %k : tensor<2x3x4x8xf32> -> tensor<6x4x8xf32>
  %kt3 = pcc.transpose %k3 [0, 2, 1] : tensor<6x4x8xf32> -> tensor<6x8x4xf32>
  %kt = pcc.reshape %kt3 : tensor<6x8x4xf32> -> tensor<2x3x8x4xf32>
  %qs = pcc.mul %q, %cq : tensor<2x3x4x8xf32>
  %ks = pcc.mul %kt, %ck : tensor<2x3x8x4xf32>
  %s = pcc.matmul %qs, %ks : tensor<2x3x4x8xf32>, tensor<2x3x8x4xf32> -> tensor<2x3x4x4xf32>
  %m = pcc.broadcast %mask : tensor<2x1x4x4xf32> -> tensor<2x3x4x4xf32>
  %sm = pcc.add %s, %m : tensor<2x3x4x4xf32>
  %p = pcc.softmax %sm axis = 3 {nan_to_zero} : tensor<2x3x4x4xf32>
  %o = pcc.matmul %p, %v : tensor<2x3x4x4xf32>, tensor<2x3x4x8xf32> -> tensor<2x3x4x8xf32>
  return %o : tensor<2x3x4x8xf32>
}

// -----

// Tests ONNX Attention's import: q k^T by transpose_b, the scores scaled,
// a padding mask [B, 1, 1, L] computed from an input (the bias, read at its
// unbroadcast shape).
// CHECK-LABEL: func.func @padding_mask
// CHECK-SAME: (%[[Q:.*]]: tensor<2x2x3x4xf32>, %[[K:.*]]: tensor<2x2x5x4xf32>, %[[V:.*]]: tensor<2x2x5x6xf32>, %[[PAD:.*]]: tensor<2x1x1x5xf32>)
// CHECK-NEXT: %[[O:.*]], %{{.*}} = pcc.attention %[[Q]], %[[K]], %[[V]] bias %[[PAD]] scale = 5.000000e-01 : tensor<2x2x3x4xf32>, tensor<2x2x5x4xf32>, tensor<2x2x5x6xf32>, tensor<2x1x1x5xf32> -> tensor<2x2x3x6xf32>, tensor<2x2x3xf32>
func.func @padding_mask(%q: tensor<2x2x3x4xf32>, %k: tensor<2x2x5x4xf32>, %v: tensor<2x2x5x6xf32>, %pad: tensor<2x1x1x5xf32>) -> tensor<2x2x3x6xf32> {
  %c = pcc.constant dense<5.000000e-01> : tensor<2x2x3x5xf32>
  %s = pcc.matmul %q, %k {transpose_b} : tensor<2x2x3x4xf32>, tensor<2x2x5x4xf32> -> tensor<2x2x3x5xf32>
  %t = pcc.mul %s, %c : tensor<2x2x3x5xf32>
  %m = pcc.broadcast %pad : tensor<2x1x1x5xf32> -> tensor<2x2x3x5xf32>
  %sm = pcc.add %t, %m : tensor<2x2x3x5xf32>
  %p = pcc.softmax %sm axis = 3 {nan_to_zero} : tensor<2x2x3x5xf32>
  %o = pcc.matmul %p, %v : tensor<2x2x3x5xf32>, tensor<2x2x5x6xf32> -> tensor<2x2x3x6xf32>
  return %o : tensor<2x2x3x6xf32>
}

// -----

// Tests grouped-query attention as the Llama export writes it: K and V of
// 2 heads repeated to 4 (reshape, broadcast, reshape). The fused op reads
// the 2-head K and V.
// CHECK-LABEL: func.func @grouped_query
// CHECK-SAME: (%[[Q:.*]]: tensor<1x4x3x8xf32>, %[[K:.*]]: tensor<1x2x3x8xf32>, %[[V:.*]]: tensor<1x2x3x8xf32>)
// CHECK-NEXT: pcc.attention %[[Q]], %[[K]], %[[V]] scale = 1.250000e-01 : tensor<1x4x3x8xf32>, tensor<1x2x3x8xf32>, tensor<1x2x3x8xf32> -> tensor<1x4x3x8xf32>, tensor<1x4x3xf32>
// CHECK-NOT: pcc.broadcast
func.func @grouped_query(%q: tensor<1x4x3x8xf32>, %k: tensor<1x2x3x8xf32>, %v: tensor<1x2x3x8xf32>) -> tensor<1x4x3x8xf32> {
  %k5 = pcc.reshape %k : tensor<1x2x3x8xf32> -> tensor<1x2x1x3x8xf32>
  %kb = pcc.broadcast %k5 : tensor<1x2x1x3x8xf32> -> tensor<1x2x2x3x8xf32>
  %k3 = pcc.reshape %kb : tensor<1x2x2x3x8xf32> -> tensor<4x3x8xf32>
  %kt3 = pcc.transpose %k3 [0, 2, 1] : tensor<4x3x8xf32> -> tensor<4x8x3xf32>
  %kt = pcc.reshape %kt3 : tensor<4x8x3xf32> -> tensor<1x4x8x3xf32>
  %v5 = pcc.reshape %v : tensor<1x2x3x8xf32> -> tensor<1x2x1x3x8xf32>
  %vb = pcc.broadcast %v5 : tensor<1x2x1x3x8xf32> -> tensor<1x2x2x3x8xf32>
  %vr = pcc.reshape %vb : tensor<1x2x2x3x8xf32> -> tensor<1x4x3x8xf32>
  %s = pcc.matmul %q, %kt : tensor<1x4x3x8xf32>, tensor<1x4x8x3xf32> -> tensor<1x4x3x3xf32>
  %c = pcc.constant dense<1.250000e-01> : tensor<1x4x3x3xf32>
  %t = pcc.mul %s, %c : tensor<1x4x3x3xf32>
  %p = pcc.softmax %t axis = 3 : tensor<1x4x3x3xf32>
  %o = pcc.matmul %p, %vr : tensor<1x4x3x3xf32>, tensor<1x4x3x8xf32> -> tensor<1x4x3x8xf32>
  return %o : tensor<1x4x3x8xf32>
}

// -----

// Tests what stays unfused: the probabilities returned as well, a mask
// computed from a weight (it may need a gradient), and a mask that could
// empty a row of a softmax without nan_to_zero.
// CHECK-LABEL: func.func @probabilities_used
// CHECK-NOT: pcc.attention
// CHECK: pcc.softmax
func.func @probabilities_used(%q: tensor<1x1x2x4xf32>, %k: tensor<1x1x2x4xf32>, %v: tensor<1x1x2x4xf32>) -> (tensor<1x1x2x4xf32>, tensor<1x1x2x2xf32>) {
  %s = pcc.matmul %q, %k {transpose_b} : tensor<1x1x2x4xf32>, tensor<1x1x2x4xf32> -> tensor<1x1x2x2xf32>
  %p = pcc.softmax %s axis = 3 {nan_to_zero} : tensor<1x1x2x2xf32>
  %o = pcc.matmul %p, %v : tensor<1x1x2x2xf32>, tensor<1x1x2x4xf32> -> tensor<1x1x2x4xf32>
  return %o, %p : tensor<1x1x2x4xf32>, tensor<1x1x2x2xf32>
}

// CHECK-LABEL: func.func @weight_mask
// CHECK-NOT: pcc.attention
// CHECK: pcc.softmax
func.func @weight_mask(%q: tensor<1x1x2x4xf32>, %k: tensor<1x1x2x4xf32>, %v: tensor<1x1x2x4xf32>) -> tensor<1x1x2x4xf32> {
  %w = pcc.param "relative_bias" : tensor<1x1x2x2xf32>
  %s = pcc.matmul %q, %k {transpose_b} : tensor<1x1x2x4xf32>, tensor<1x1x2x4xf32> -> tensor<1x1x2x2xf32>
  %b = pcc.add %s, %w : tensor<1x1x2x2xf32>
  %p = pcc.softmax %b axis = 3 {nan_to_zero} : tensor<1x1x2x2xf32>
  %o = pcc.matmul %p, %v : tensor<1x1x2x2xf32>, tensor<1x1x2x4xf32> -> tensor<1x1x2x4xf32>
  return %o : tensor<1x1x2x4xf32>
}

// CHECK-LABEL: func.func @mask_without_nan_guard
// CHECK-NOT: pcc.attention
// CHECK: pcc.softmax
func.func @mask_without_nan_guard(%q: tensor<1x1x2x4xf32>, %k: tensor<1x1x2x4xf32>, %v: tensor<1x1x2x4xf32>, %m: tensor<1x1x2x2xf32>) -> tensor<1x1x2x4xf32> {
  %s = pcc.matmul %q, %k {transpose_b} : tensor<1x1x2x4xf32>, tensor<1x1x2x4xf32> -> tensor<1x1x2x2xf32>
  %b = pcc.add %s, %m : tensor<1x1x2x2xf32>
  %p = pcc.softmax %b axis = 3 : tensor<1x1x2x2xf32>
  %o = pcc.matmul %p, %v : tensor<1x1x2x2xf32>, tensor<1x1x2x4xf32> -> tensor<1x1x2x4xf32>
  return %o : tensor<1x1x2x4xf32>
}

// -----

// Tests the TorchScript exporter's attention (the bundled GPT): k^T as a
// [B, S, H, D] tensor permuted [0, 2, 3, 1], and the causal mask as a
// masked_fill of -inf under a boolean constant. The keys become a [0, 2,
// 1, 3] transpose of the same tensor; the softmax needs no nan_to_zero (a
// causal row keeps its diagonal).
// CHECK-LABEL: func.func @masked_fill_causal
// CHECK-SAME: (%[[Q:.*]]: tensor<1x2x3x4xf32>, %[[X:.*]]: tensor<1x3x2x4xf32>, %[[V:.*]]: tensor<1x2x3x4xf32>)
// CHECK-NEXT: %[[K:.*]] = pcc.transpose %[[X]] [0, 2, 1, 3]
// CHECK-NEXT: pcc.attention %[[Q]], %[[K]], %[[V]] scale = 5.000000e-01 {causal}
func.func @masked_fill_causal(%q: tensor<1x2x3x4xf32>, %x: tensor<1x3x2x4xf32>, %v: tensor<1x2x3x4xf32>) -> tensor<1x2x3x4xf32> {
  %kt = pcc.transpose %x [0, 2, 3, 1] : tensor<1x3x2x4xf32> -> tensor<1x2x4x3xf32>
  %s = pcc.matmul %q, %kt : tensor<1x2x3x4xf32>, tensor<1x2x4x3xf32> -> tensor<1x2x3x3xf32>
  %c = pcc.constant dense<5.000000e-01> : tensor<1x2x3x3xf32>
  %t = pcc.mul %s, %c : tensor<1x2x3x3xf32>
  %cond = pcc.constant dense<[[false, true, true], [false, false, true], [false, false, false]]> : tensor<3x3xi1>
  %cb = pcc.broadcast %cond : tensor<3x3xi1> -> tensor<1x2x3x3xi1>
  %inf = pcc.constant dense<0xFF800000> : tensor<1x2x3x3xf32>
  %m = pcc.select %cb, %inf, %t : tensor<1x2x3x3xi1>, tensor<1x2x3x3xf32>
  %p = pcc.softmax %m axis = 3 : tensor<1x2x3x3xf32>
  %o = pcc.matmul %p, %v : tensor<1x2x3x3xf32>, tensor<1x2x3x4xf32> -> tensor<1x2x3x4xf32>
  return %o : tensor<1x2x3x4xf32>
}
