// RUN: split-file %s %t
// RUN: pcc-opt %t/mlp.mlir --pcc-loss --pcc-autodiff --pcc-optimizer=kind=adamw --cse --pcc-merge-state-loads --pcc-data-parallel='dp=2 zero=1' --canonicalize --pcc-offload-optimizer | FileCheck %s
// RUN: pcc-opt %t/mlp.mlir --pcc-loss --pcc-autodiff --pcc-optimizer=kind=adamw --cse --pcc-merge-state-loads --pcc-offload-optimizer | FileCheck %s --check-prefix=ONE
// RUN: pcc-opt %t/errors.mlir --split-input-file --pcc-offload-optimizer -verify-diagnostics

// Tests ZeRO-Offload of a ZeRO 1 step over dp = 2: the device keeps the
// gradients' reduce-scatters and the norm's all-reduce (optimizer_pre,
// whose results the host phase takes as arguments) and the gather of the
// updated pieces into the weights (optimizer_post); the host runs the
// norm's square root and the updates. The moments live on the host only;
// the master pieces the host updates are copied back to the device.
//--- mlp.mlir
module {
  pcc.mesh @mesh [dp = 2, pp = 1, tp = 1]
  func.func @main(%x: tensor<4x8xf32>) -> tensor<4x4xf32> {
    %w1 = pcc.param "fc1.weight" : tensor<16x8xf32>
    %w2 = pcc.param "fc2.weight" : tensor<4x16xf32>
    %h = pcc.matmul %x, %w1 {transpose_b} : tensor<4x8xf32>, tensor<16x8xf32> -> tensor<4x16xf32>
    %g = pcc.relu %h : tensor<4x16xf32>
    %y = pcc.matmul %g, %w2 {transpose_b} : tensor<4x16xf32>, tensor<4x16xf32> -> tensor<4x4xf32>
    return %y : tensor<4x4xf32>
  }
}
// CHECK: offload = {host = ["fc1.weight@exp_avg", "fc1.weight@exp_avg_sq", "fc2.weight@exp_avg", "fc2.weight@exp_avg_sq"], to_device = ["fc1.weight@master", "fc2.weight@master"], to_host = []}
// CHECK-LABEL: func.func @train_optimizer_pre()
// CHECK-SAME: -> (tensor<f32> {pcc.name = "crossing0"}, tensor<32xf32> {pcc.name = "crossing1"}, tensor<64xf32> {pcc.name = "crossing2"})
// CHECK-SAME: attributes {pcc.phase = "optimizer_pre"}
// CHECK: %[[G2:.*]] = pcc.reduce_scatter %{{.*}} axis = "dp" : tensor<2x32xf32> -> tensor<32xf32>
// CHECK: %[[G1:.*]] = pcc.reduce_scatter %{{.*}} axis = "dp" : tensor<2x64xf32> -> tensor<64xf32>
// CHECK: %[[SQ:.*]] = pcc.all_reduce %{{.*}} axis = "dp" : tensor<f32>
// CHECK-NOT: pcc.adamw_update
// CHECK: return %[[SQ]], %[[G2]], %[[G1]]
// CHECK-LABEL: func.func @train_optimizer(
// CHECK-SAME: %arg0: tensor<f32> {pcc.name = "crossing0"}, %arg1: tensor<32xf32> {pcc.name = "crossing1"}, %arg2: tensor<64xf32> {pcc.name = "crossing2"})
// CHECK-SAME: -> (tensor<f32> {pcc.name = "grad_norm"}) attributes {pcc.phase = "optimizer"}
// CHECK-NOT: pcc.reduce_scatter
// CHECK-NOT: pcc.all_reduce
// CHECK: %[[NORM:.*]] = pcc.sqrt %arg0
// CHECK: %[[P:.*]] = pcc.param "fc2.weight@master" shard(#pcc.shard<dp, flat>) of [4, 16] : tensor<32xf32>
// CHECK: pcc.adamw_update %[[P]], %arg1, %{{.*}}, %{{.*}}, %[[NORM]] : tensor<32xf32>, tensor<f32>
// CHECK: pcc.adamw_update %{{.*}}, %arg2, %{{.*}}, %{{.*}}, %[[NORM]] : tensor<64xf32>, tensor<f32>
// CHECK-NOT: pcc.all_gather
// CHECK: return %[[NORM]]
// CHECK-LABEL: func.func @train_optimizer_post() attributes {pcc.phase = "optimizer_post"}
// CHECK: %[[M:.*]] = pcc.param "fc2.weight@master" shard(#pcc.shard<dp, flat>) of [4, 16] : tensor<32xf32>
// CHECK-NEXT: %[[AG:.*]] = pcc.all_gather %[[M]] axis = "dp" : tensor<32xf32> -> tensor<2x32xf32>
// CHECK-NEXT: %[[W:.*]] = pcc.reshape %[[AG]] : tensor<2x32xf32> -> tensor<4x16xf32>
// CHECK-NEXT: %[[DST:.*]] = pcc.param "fc2.weight" : tensor<4x16xf32>
// CHECK-NEXT: pcc.assign %[[DST]], %[[W]] : tensor<4x16xf32>
// CHECK: pcc.all_gather %{{.*}} axis = "dp" : tensor<64xf32> -> tensor<2x64xf32>
// CHECK-LABEL: func.func @train_zero_grad()

// On one device there is no collective: the device phases are empty, the
// gradients go to the host and the updated weights come back.
// ONE: offload = {host = ["fc1.weight@exp_avg", "fc1.weight@exp_avg_sq", "fc2.weight@exp_avg", "fc2.weight@exp_avg_sq"], to_device = ["fc1.weight", "fc2.weight"], to_host = ["fc1.weight@grad", "fc2.weight@grad"]}
// ONE-LABEL: func.func @train_optimizer_pre() attributes {pcc.phase = "optimizer_pre"}
// ONE-NEXT: return
// ONE-LABEL: func.func @train_optimizer() -> (tensor<f32> {pcc.name = "grad_norm"}) attributes {pcc.phase = "optimizer"}
// ONE: pcc.sqrt
// ONE: pcc.adamw_update {{.*}} : tensor<4x16xf32>, tensor<f32>
// ONE: pcc.adamw_update {{.*}} : tensor<16x8xf32>, tensor<f32>
// ONE-LABEL: func.func @train_optimizer_post() attributes {pcc.phase = "optimizer_post"}
// ONE-NEXT: return

//--- errors.mlir
// expected-error @below {{offload: expects the optimizer phase @train_optimizer (run pcc-optimizer first)}}
module { pcc.mesh @mesh [dp = 2] }

// -----

// A collective that reads what the host computed from an updated weight.
module {
  pcc.mesh @mesh [dp = 2]
  func.func @train_optimizer() -> tensor<f32> attributes {pcc.phase = "optimizer"} {
    %g = pcc.param "w@grad" : tensor<4xf32>
    %n = pcc.constant dense<1.0> : tensor<f32>
    %p = pcc.param "w" : tensor<4xf32>
    %m = pcc.param "w@momentum_buffer" : tensor<4xf32>
    pcc.sgd_update %p, %g, %m, %n : tensor<4xf32>, tensor<f32>
    %q = pcc.mul %p, %p : tensor<4xf32>
    // expected-error @below {{offload: cannot put the optimizer's update on the host: this op (device) reads a value of the host's update that is not model state}}
    %r = pcc.all_reduce %q axis = "dp" : tensor<4xf32>
    return %n : tensor<f32>
  }
}

// -----

// The phase's result comes from a collective after the update.
module {
  pcc.mesh @mesh [dp = 2]
  func.func @train_optimizer() -> tensor<4xf32> attributes {pcc.phase = "optimizer"} {
    %g = pcc.param "w@grad" : tensor<4xf32>
    %n = pcc.constant dense<1.0> : tensor<f32>
    %p = pcc.param "w" : tensor<4xf32>
    %m = pcc.param "w@momentum_buffer" : tensor<4xf32>
    pcc.sgd_update %p, %g, %m, %n : tensor<4xf32>, tensor<f32>
    %r = pcc.all_reduce %p axis = "dp" : tensor<4xf32>
    // expected-error @below {{offload: the optimizer's result is computed after its collectives}}
    return %r : tensor<4xf32>
  }
}
