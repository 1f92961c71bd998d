// RUN: pcc-opt %s --pcc-loss=kind=mse --pcc-autodiff --pcc-optimizer=kind=adamw | FileCheck %s --check-prefix=ADAMW
// RUN: pcc-opt %s --pcc-loss=kind=mse --pcc-autodiff --pcc-optimizer=kind=sgd | FileCheck %s --check-prefix=SGD
// RUN: not pcc-opt %s --pcc-loss=kind=none 2>&1 | FileCheck %s --check-prefix=NONE

// The optimizer phase: the global gradient norm (returned), then one fused
// in-place update per weight; zero-grad clears every gradient.
func.func @main(%x: tensor<2x4xf32>) -> tensor<2x3xf32> {
  %w = pcc.param "w" : tensor<3x4xf32>
  %y = pcc.matmul %x, %w {transpose_b} : tensor<2x4xf32>, tensor<3x4xf32> -> tensor<2x3xf32>
  %b = pcc.param "b" : tensor<3xf32>
  %bb = pcc.broadcast %b : tensor<3xf32> -> tensor<2x3xf32>
  %z = pcc.add %y, %bb : tensor<2x3xf32>
  return %z : tensor<2x3xf32>
}

// ADAMW: module attributes {{.*}}optimizer = "adamw"
// ADAMW-LABEL: func.func @train_optimizer() -> (tensor<f32> {pcc.name = "grad_norm"}) attributes {pcc.phase = "optimizer"}
// ADAMW: %[[G0:.*]] = pcc.param "b@grad" : tensor<3xf32>
// ADAMW: %[[N0:.*]] = pcc.reduce_sum {{.*}} axes = [0] : tensor<3xf32> -> tensor<f32>
// ADAMW: %[[G1:.*]] = pcc.param "w@grad" : tensor<3x4xf32>
// ADAMW: %[[N1:.*]] = pcc.reduce_sum {{.*}} axes = [0, 1] : tensor<3x4xf32> -> tensor<f32>
// ADAMW: %[[T:.*]] = pcc.add %[[N0]], %[[N1]] : tensor<f32>
// ADAMW: %[[NORM:.*]] = pcc.sqrt %[[T]] : tensor<f32>
// ADAMW: %[[P:.*]] = pcc.param "b" : tensor<3xf32>
// ADAMW: %[[G:.*]] = pcc.param "b@grad" : tensor<3xf32>
// ADAMW: %[[M:.*]] = pcc.param "b@exp_avg" : tensor<3xf32>
// ADAMW: %[[V:.*]] = pcc.param "b@exp_avg_sq" : tensor<3xf32>
// ADAMW: pcc.adamw_update %[[P]], %[[G]], %[[M]], %[[V]], %[[NORM]] : tensor<3xf32>, tensor<f32>
// ADAMW: pcc.adamw_update {{.*}} : tensor<3x4xf32>, tensor<f32>
// ADAMW: return %[[NORM]]
// ADAMW-LABEL: func.func @train_zero_grad() attributes {pcc.phase = "zero_grad"}
// ADAMW: pcc.zero {{.*}} : tensor<3xf32>
// ADAMW: pcc.zero {{.*}} : tensor<3x4xf32>

// SGD: pcc.param "b@momentum_buffer" : tensor<3xf32>
// SGD: pcc.sgd_update {{.*}} : tensor<3xf32>, tensor<f32>

// NONE: error: loss: --loss=none needs the first output to be the loss, a scalar; it is 'tensor<2x3xf32>'
