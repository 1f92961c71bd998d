// RUN: pcc-opt %s --pcc-autocast --cse --pcc-loss --pcc-autodiff --pcc-optimizer --pcc-bf16-weight-copies | FileCheck %s
// RUN: pcc-opt %s --pcc-autocast --cse --pcc-loss --pcc-autodiff --pcc-optimizer=kind=sgd --pcc-bf16-weight-copies | FileCheck %s --check-prefix=SGD
// RUN: pcc-opt %s --pcc-autocast --cse --pcc-bf16-weights | FileCheck %s --check-prefix=INFER

// Tests that a weight is cast to bf16 once per step: the forward phase
// (and a backward phase that needs it) reads its bf16 copy (a state). The
// AdamW update writes it at the end of each step, and the zero-grad phase
// (run at the start of every step) casts it only when the run says the
// copies are stale (pcc.refresh_copy: the first step, after a load). An
// update that does not write copies (SGD) leaves the cast to the zero-grad
// phase, every step.
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
// CHECK-LABEL: func.func @train_optimizer
// CHECK: %[[P:.*]] = pcc.param "fc.weight" : tensor<8x8xf32>
// CHECK: %[[OUT:.*]] = pcc.param "fc.weight@bf16" : tensor<8x8xbf16>
// CHECK: pcc.adamw_update %[[P]], %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} copy %[[OUT]] : tensor<8x8xf32>, tensor<f32>, tensor<8x8xbf16>
// CHECK-LABEL: func.func @train_zero_grad
// CHECK: %[[W:.*]] = pcc.param "fc.weight" : tensor<8x8xf32>
// CHECK: %[[COPY:.*]] = pcc.param "fc.weight@bf16" : tensor<8x8xbf16>
// CHECK: pcc.refresh_copy %[[COPY]], %[[W]] : tensor<8x8xbf16>, tensor<8x8xf32>
// CHECK-NEXT: return

// SGD-LABEL: func.func @train_optimizer
// SGD-NOT: @bf16
// SGD-LABEL: func.func @train_zero_grad
// SGD: %[[W:.*]] = pcc.param "fc.weight" : tensor<8x8xf32>
// SGD: %[[COPY:.*]] = pcc.param "fc.weight@bf16" : tensor<8x8xbf16>
// SGD: %[[C:.*]] = pcc.cast %[[W]] : tensor<8x8xf32> -> tensor<8x8xbf16>
// SGD: pcc.assign %[[COPY]], %[[C]] : tensor<8x8xbf16>
// SGD-NEXT: return

// Inference: a weight read only through casts to bf16 is a bf16 weight
// (stored so in the weights file); nothing casts it per call.
// INFER-LABEL: func.func @main
// INFER: %[[W:.*]] = pcc.param "fc.weight" : tensor<8x8xbf16>
// INFER-NOT: pcc.cast %{{.*}} : tensor<8x8xf32> -> tensor<8x8xbf16>
// INFER: pcc.matmul %{{.*}}, %[[W]] {transpose_b}
