// RUN: split-file %s %t
// RUN: pcc-opt %t/bn.mlir --pcc-train-mode | FileCheck %s
// RUN: pcc-opt %t/bn.mlir --pcc-set-mesh='axes=dp=2,pp=1,tp=1' --pcc-train-mode=dp=2 | FileCheck %s --check-prefix=DP
// RUN: pcc-opt %t/one.mlir --pcc-set-mesh='axes=dp=2,pp=1,tp=1' --pcc-train-mode=dp=2 | FileCheck %s --check-prefix=ONE
// RUN: pcc-opt %t/errors.mlir --split-input-file --pcc-train-mode -verify-diagnostics

// Tests that a batch norm whose running statistics are weights normalises
// with the batch's statistics (reductions over N, H, W and elementwise
// ops) and updates the running mean and variance in place, the variance
// with the unbiased factor n / (n - 1) = 16 / 15 (4 x 2 x 2 values per
// channel). Dropout is already in its training form and stays as it is.
//--- bn.mlir
func.func @main(%x: tensor<4x3x2x2xf32>) -> tensor<4x3x2x2xf32> {
  %s = pcc.param "bn.weight" : tensor<3xf32>
  %b = pcc.param "bn.bias" : tensor<3xf32>
  %m = pcc.param "bn.running_mean" : tensor<3xf32>
  %v = pcc.param "bn.running_var" : tensor<3xf32>
  %y = pcc.batch_norm %x, %s, %b, %m, %v epsilon = 1.0E-5 {momentum = 0.8 : f32} : tensor<4x3x2x2xf32>, tensor<3xf32>
  %z = pcc.dropout %y ratio = 0.1 stream = 0 : tensor<4x3x2x2xf32>
  return %z : tensor<4x3x2x2xf32>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<4x3x2x2xf32>)
// CHECK-DAG: %[[S:.*]] = pcc.param "bn.weight"
// CHECK-DAG: %[[B:.*]] = pcc.param "bn.bias"
// CHECK-DAG: %[[RM:.*]] = pcc.param "bn.running_mean"
// CHECK-DAG: %[[RV:.*]] = pcc.param "bn.running_var"
// CHECK-NOT: pcc.batch_norm
// CHECK: %[[MEAN:.*]] = pcc.reduce_mean %arg0 axes = [0, 2, 3] {keep_dims} : tensor<4x3x2x2xf32> -> tensor<1x3x1x1xf32>
// CHECK: %[[MB:.*]] = pcc.broadcast %[[MEAN]] : tensor<1x3x1x1xf32> -> tensor<4x3x2x2xf32>
// CHECK: %[[D:.*]] = pcc.sub %arg0, %[[MB]]
// CHECK: %[[SQ:.*]] = pcc.mul %[[D]], %[[D]]
// CHECK: %[[VAR:.*]] = pcc.reduce_mean %[[SQ]] axes = [0, 2, 3] {keep_dims}
// CHECK: %[[EPS:.*]] = pcc.constant dense<9.99999974E-6> : tensor<1x3x1x1xf32>
// CHECK: %[[VE:.*]] = pcc.add %[[VAR]], %[[EPS]]
// CHECK: %[[STD:.*]] = pcc.sqrt %[[VE]]
// CHECK: %[[R:.*]] = pcc.reciprocal %[[STD]]
// CHECK: %[[RB:.*]] = pcc.broadcast %[[R]]
// CHECK: %[[N:.*]] = pcc.mul %[[D]], %[[RB]]
// CHECK: pcc.reshape %[[S]] : tensor<3xf32> -> tensor<1x3x1x1xf32>
// CHECK: %[[SC:.*]] = pcc.mul %[[N]], %{{.*}}
// CHECK: pcc.reshape %[[B]] : tensor<3xf32> -> tensor<1x3x1x1xf32>
// CHECK: %[[Y:.*]] = pcc.add %[[SC]], %{{.*}}
// CHECK: %[[M3:.*]] = pcc.reshape %[[MEAN]] : tensor<1x3x1x1xf32> -> tensor<3xf32>
// CHECK: pcc.ema_update %[[RM]], %[[M3]] momentum = 8.000000e-01 scale = 1.000000e+00 : tensor<3xf32>
// CHECK: %[[V3:.*]] = pcc.reshape %[[VAR]] : tensor<1x3x1x1xf32> -> tensor<3xf32>
// CHECK: pcc.ema_update %[[RV]], %[[V3]] momentum = 8.000000e-01 scale = 1.0666666666666667 : tensor<3xf32>
// CHECK: %[[Z:.*]] = pcc.dropout %[[Y]] ratio = 1.000000e-01 stream = 0
// CHECK: return %[[Z]]

// With dp = 2 (SyncBatchNorm), each statistic is this rank's sum,
// all-reduced over dp and divided by the global count 2 x 16 = 32; the
// unbiased factor is 32 / 31.
// DP-LABEL: func.func @main
// DP-NOT: pcc.reduce_mean
// DP: %[[SUM:.*]] = pcc.reduce_sum %arg0 axes = [0, 2, 3] {keep_dims} : tensor<4x3x2x2xf32> -> tensor<1x3x1x1xf32>
// DP: %[[ALL:.*]] = pcc.all_reduce %[[SUM]] axis = "dp" : tensor<1x3x1x1xf32>
// DP: %[[INV:.*]] = pcc.constant dense<3.125000e-02> : tensor<1x3x1x1xf32>
// DP: %[[MEAN:.*]] = pcc.mul %[[ALL]], %[[INV]]
// DP: pcc.sub %arg0, %{{.*}}
// DP: %[[VSUM:.*]] = pcc.reduce_sum %{{.*}} axes = [0, 2, 3] {keep_dims}
// DP: pcc.all_reduce %[[VSUM]] axis = "dp" : tensor<1x3x1x1xf32>
// DP: pcc.ema_update %{{.*}} momentum = 8.000000e-01 scale = 1.000000e+00 : tensor<3xf32>
// DP: pcc.ema_update %{{.*}} momentum = 8.000000e-01 scale = 1.032258064516129 : tensor<3xf32>

// One example per rank (no spatial dimensions) trains at dp = 2: the
// statistics are the global batch's (2 values per channel; factor 2 / 1);
// the momentum defaults to ONNX's 0.9.
//--- one.mlir
func.func @main(%x: tensor<1x3xf32>) -> tensor<1x3xf32> {
  %s = pcc.param "bn.weight" : tensor<3xf32>
  %b = pcc.param "bn.bias" : tensor<3xf32>
  %m = pcc.param "bn.running_mean" : tensor<3xf32>
  %v = pcc.param "bn.running_var" : tensor<3xf32>
  %y = pcc.batch_norm %x, %s, %b, %m, %v epsilon = 1.0E-5 : tensor<1x3xf32>, tensor<3xf32>
  return %y : tensor<1x3xf32>
}
// ONE: pcc.reduce_sum %arg0 axes = [0] {keep_dims} : tensor<1x3xf32> -> tensor<1x3xf32>
// ONE: pcc.constant dense<5.000000e-01> : tensor<1x3xf32>
// ONE: pcc.ema_update %{{.*}} momentum = 9.000000e-01 scale = 1.000000e+00 : tensor<3xf32>
// ONE: pcc.ema_update %{{.*}} momentum = 9.000000e-01 scale = 2.000000e+00 : tensor<3xf32>

//--- errors.mlir
// The same batch norm on one rank: one value per channel has no variance.
func.func @main(%x: tensor<1x3xf32>) -> tensor<1x3xf32> {
  %s = pcc.param "bn.weight" : tensor<3xf32>
  %m = pcc.param "bn.running_mean" : tensor<3xf32>
  // expected-error @below {{train mode: batch normalisation over 1 value per channel (a batch of 1); training needs more than 1, as PyTorch}}
  %y = pcc.batch_norm %x, %s, %s, %m, %m epsilon = 1.0E-5 : tensor<1x3xf32>, tensor<3xf32>
  return %y : tensor<1x3xf32>
}

// -----

// Running statistics computed in the graph cannot be updated in place.
func.func @computed(%x: tensor<2x3xf32>) -> tensor<2x3xf32> {
  %s = pcc.param "bn.weight" : tensor<3xf32>
  %m = pcc.mul %s, %s : tensor<3xf32>
  // expected-error @below {{train mode: the running statistics of this batch normalisation are computed in the graph, not weights}}
  %y = pcc.batch_norm %x, %s, %s, %m, %m epsilon = 1.0E-5 : tensor<2x3xf32>, tensor<3xf32>
  return %y : tensor<2x3xf32>
}
