// RUN: pcc-opt %s --pcc-loss="kind=cross_entropy fuse-head-bytes=-1" --pcc-autodiff=remarks=true 2>&1 | FileCheck %s
// RUN: pcc-opt %s --pcc-loss="kind=cross_entropy fuse-head-bytes=-1" "--pcc-autodiff=frozen=fc.bias" | FileCheck %s --check-prefix=NAMED
// RUN: not pcc-opt %s --pcc-loss="kind=cross_entropy fuse-head-bytes=-1" "--pcc-autodiff=frozen=fc.nothing" 2>&1 | FileCheck %s --check-prefix=UNKNOWN

// Frozen weights get no gradient and no optimizer state, as a PyTorch
// parameter with requires_grad=False. A rotary embedding's inverse
// frequencies (a buffer PyTorch does not train, which its dynamo exporter
// writes as an initializer like any weight) are frozen by default, with a
// remark; --frozen (frozen=) names others.
func.func @main(%x: tensor<4x8xf32>, %pos: tensor<4x1xf32>) -> tensor<4x3xf32> {
  %f = pcc.param "model.rotary_emb.inv_freq" : tensor<1x8xf32>
  %w = pcc.param "fc.weight" : tensor<3x8xf32>
  %b = pcc.param "fc.bias" : tensor<3xf32>
  %angle = pcc.matmul %pos, %f : tensor<4x1xf32>, tensor<1x8xf32> -> tensor<4x8xf32>
  %c = pcc.cos %angle : tensor<4x8xf32>
  %xr = pcc.mul %x, %c : tensor<4x8xf32>
  %y = pcc.matmul %xr, %w {transpose_b} : tensor<4x8xf32>, tensor<3x8xf32> -> tensor<4x3xf32>
  %bb = pcc.broadcast %b : tensor<3xf32> -> tensor<4x3xf32>
  %z = pcc.add %y, %bb : tensor<4x3xf32>
  return %z : tensor<4x3xf32>
}

// CHECK: remark: weight 'model.rotary_emb.inv_freq' is held constant: a rotary embedding's inverse frequencies, a buffer PyTorch does not train (--frozen names more)
// CHECK: pcc.training = {{{.*}}weights = ["fc.bias", "fc.weight"]}
// CHECK-LABEL: func.func @train_backward(
// CHECK-NOT: inv_freq@grad
// CHECK: pcc.param "fc.bias@grad"
// CHECK: pcc.param "fc.weight@grad"
// CHECK-NOT: inv_freq@grad
// CHECK: return

// NAMED: pcc.training = {{{.*}}weights = ["fc.weight"]}
// NAMED-LABEL: func.func @train_backward(
// NAMED-NOT: fc.bias@grad
// NAMED: pcc.param "fc.weight@grad"
// NAMED-NOT: @grad
// NAMED: return

// UNKNOWN: error: autodiff: --frozen names 'fc.nothing', which is no float weight of the model
