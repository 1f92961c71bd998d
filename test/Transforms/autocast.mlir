// RUN: pcc-opt %s --pcc-autocast | FileCheck %s
// RUN: pcc-opt %s --pcc-autocast='precision=fp32' | FileCheck %s --check-prefix=FP32
// RUN: pcc-opt %s --pcc-autocast --cse --pcc-loss --pcc-autodiff | FileCheck %s --check-prefix=GRAD
// RUN: not pcc-opt %s --pcc-autocast='precision=fp8' 2>&1 | FileCheck %s --check-prefix=BAD

// Tests that every f32 matrix product computes on bf16 operands with a
// bf16 result, cast back to f32 for the ops after it (torch.autocast's
// lower-precision list); the weight read by two products is cast once
// after CSE; ops other than products stay f32.
func.func @main(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %w = pcc.param "fc.weight" : tensor<8x8xf32>
  %y = pcc.matmul %x, %w {transpose_b} : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  %r = pcc.relu %y : tensor<4x8xf32>
  %z = pcc.matmul %r, %w : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  return %z : tensor<4x8xf32>
}

// CHECK-LABEL: func.func @main
// CHECK: %[[W:.*]] = pcc.param "fc.weight" : tensor<8x8xf32>
// CHECK: %[[XB:.*]] = pcc.cast %arg0 : tensor<4x8xf32> -> tensor<4x8xbf16>
// CHECK: %[[WB:.*]] = pcc.cast %[[W]] : tensor<8x8xf32> -> tensor<8x8xbf16>
// CHECK: %[[YB:.*]] = pcc.matmul %[[XB]], %[[WB]] {transpose_b} : tensor<4x8xbf16>, tensor<8x8xbf16> -> tensor<4x8xbf16>
// CHECK: %[[Y:.*]] = pcc.cast %[[YB]] : tensor<4x8xbf16> -> tensor<4x8xf32>
// CHECK: %[[R:.*]] = pcc.relu %[[Y]] : tensor<4x8xf32>
// CHECK: %[[RB:.*]] = pcc.cast %[[R]] : tensor<4x8xf32> -> tensor<4x8xbf16>
// CHECK: %[[ZB:.*]] = pcc.matmul %[[RB]], {{.*}} : tensor<4x8xbf16>, tensor<8x8xbf16> -> tensor<4x8xbf16>
// CHECK: %[[Z:.*]] = pcc.cast %[[ZB]] : tensor<4x8xbf16> -> tensor<4x8xf32>
// CHECK: return %[[Z]]

// FP32-NOT: bf16

// The backward phase differentiates the casts: the cotangent of a
// product's result is cast to bf16, the products of the backward pass run
// in bf16, the two uses of the weight's bf16 copy add their gradients in
// bf16 (as autograd does for autocast's cached weight cast), and the sum
// reaches the f32 gradient state through a cast.
// GRAD-LABEL: func.func @train_backward
// GRAD: %[[G:.*]] = pcc.cast {{.*}} : tensor<4x8xf32> -> tensor<4x8xbf16>
// GRAD: %[[DW1:.*]] = pcc.matmul {{.*}}, %[[G]] {transpose_a} : tensor<4x8xbf16>, tensor<4x8xbf16> -> tensor<8x8xbf16>
// GRAD: %[[DW2:.*]] = pcc.matmul {{.*}} {transpose_a} : tensor<4x8xbf16>, tensor<4x8xbf16> -> tensor<8x8xbf16>
// GRAD: %[[DW:.*]] = pcc.add %[[DW1]], %[[DW2]] : tensor<8x8xbf16>
// GRAD: %[[DW32:.*]] = pcc.cast %[[DW]] : tensor<8x8xbf16> -> tensor<8x8xf32>
// GRAD: pcc.accumulate {{.*}}, %[[DW32]] : tensor<8x8xf32>

// BAD: autocast: precision 'fp8' is not known (bf16 or fp32)
