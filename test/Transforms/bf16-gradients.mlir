// RUN: pcc-opt %s --pcc-autocast --cse --pcc-loss=fuse-head-bytes=-1 --pcc-autodiff --pcc-optimizer --pcc-bf16-weight-copies --pcc-legalize-bf16 --pcc-assign-first-gradients --pcc-bf16-gradients | FileCheck %s
// RUN: pcc-opt %s --pcc-autocast --cse --pcc-loss=fuse-head-bytes=-1 --pcc-autodiff --pcc-optimizer=kind=sgd --pcc-bf16-weight-copies --pcc-legalize-bf16 --pcc-assign-first-gradients --pcc-bf16-gradients | FileCheck %s --check-prefix=SGD

// Tests that a weight gradient one bf16 product writes whole each step is
// kept in bf16: the backward assigns the product's bf16 result (no
// widening), loaded before the product so that the back end can compute it
// in place; the optimizer's norm reads it through pcc.sum_squares and
// AdamW widens it as it reads it. A bias's gradient (an f32 reduction) and
// every gradient SGD reads stay f32.
func.func @main(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %w = pcc.param "fc.weight" : tensor<8x8xf32>
  %b = pcc.param "fc.bias" : tensor<8xf32>
  %y = pcc.matmul %x, %w {transpose_b} : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  %bb = pcc.broadcast %b : tensor<8xf32> -> tensor<4x8xf32>
  %z = pcc.add %y, %bb : tensor<4x8xf32>
  return %z : tensor<4x8xf32>
}

// CHECK-LABEL: func.func @train_backward
// CHECK: pcc.param "fc.bias@grad" : tensor<8xf32>
// CHECK: %[[G:.*]] = pcc.param "fc.weight@grad" : tensor<8x8xbf16>
// CHECK-NEXT: %[[DW:.*]] = pcc.matmul {{.*}} -> tensor<8x8xbf16>
// CHECK-NEXT: pcc.assign %[[G]], %[[DW]] : tensor<8x8xbf16>
// CHECK-LABEL: func.func @train_optimizer
// CHECK: pcc.param "fc.bias@grad" : tensor<8xf32>
// CHECK: %[[N:.*]] = pcc.param "fc.weight@grad" : tensor<8x8xbf16>
// CHECK: pcc.sum_squares %[[N]] : tensor<8x8xbf16> -> tensor<f32>
// CHECK: %[[U:.*]] = pcc.param "fc.weight@grad" : tensor<8x8xbf16>
// CHECK: pcc.adamw_update %{{.*}}, %[[U]], %{{.*}}, %{{.*}}, %{{.*}} copy %{{.*}} : tensor<8x8xf32>, tensor<f32>, tensor<8x8xbf16> grad tensor<8x8xbf16>

// SGD-NOT: xbf16> -> tensor<f32>
// SGD-NOT: pcc.param "fc.weight@grad" : tensor<8x8xbf16>
// SGD-NOT: sum_squares
