// RUN: pcc-opt %s --pcc-autocast --cse --pcc-loss --pcc-autodiff --pcc-optimizer --pcc-bf16-weight-copies | FileCheck %s
// RUN: pcc-opt %s --pcc-autocast --cse --pcc-bf16-weights | FileCheck %s --check-prefix=INFER

// Tests that a weight is cast to bf16 once per step: the forward phase
// (and a backward phase that needs it) reads its bf16 copy (a state), which the zero-grad phase
// (run at the start of every step) assigns.
func.func @main(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %w = pcc.param "fc.weight" : tensor<8x8xf32>
  %y = pcc.matmul %x, %w {transpose_b} : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  return %y : tensor<4x8xf32>
}

// CHECK-LABEL: func.func @train_forward
// CHECK-NOT: pcc.cast %{{.*}} : tensor<8x8xf32> -> tensor<8x8xbf16>
// CHECK: pcc.param "fc.weight@bf16" : tensor<8x8xbf16>
// CHECK-LABEL: func.func @train_backward
// CHECK-NOT: pcc.cast %{{.*}} : tensor<8x8xf32> -> tensor<8x8xbf16>
// CHECK-LABEL: func.func @train_zero_grad
// CHECK: %[[W:.*]] = pcc.param "fc.weight" : tensor<8x8xf32>
// CHECK: %[[C:.*]] = pcc.cast %[[W]] : tensor<8x8xf32> -> tensor<8x8xbf16>
// CHECK: %[[COPY:.*]] = pcc.param "fc.weight@bf16" : tensor<8x8xbf16>
// CHECK: pcc.assign %[[COPY]], %[[C]] : tensor<8x8xbf16>
// CHECK-NEXT: return

// Inference: a weight read only through casts to bf16 is a bf16 weight
// (stored so in the weights file); nothing casts it per call.
// INFER-LABEL: func.func @main
// INFER: %[[W:.*]] = pcc.param "fc.weight" : tensor<8x8xbf16>
// INFER-NOT: pcc.cast %{{.*}} : tensor<8x8xf32> -> tensor<8x8xbf16>
// INFER: pcc.matmul %{{.*}}, %[[W]] {transpose_b}
