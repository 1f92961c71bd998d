// RUN: pcc-opt %s --pcc-loss="kind=cross_entropy fuse-head-bytes=-1" --pcc-autodiff --pcc-optimizer --cse --pcc-assign-first-gradients | FileCheck %s
// RUN: pcc-opt %s --pcc-loss="kind=cross_entropy fuse-head-bytes=-1 microbatches=2" --pcc-autodiff --pcc-optimizer --cse --pcc-assign-first-gradients | FileCheck %s --check-prefix=MB2

// One micro-batch: each gradient is written where the backward phase
// first makes it (pcc.assign), and the zero-grad phase zeroes nothing. The
// embedding table tied to the head gets a second contribution, still
// accumulated. The state is loaded before the product that makes its
// value, so that the CPU back end computes the product in the state
// (CpuDeferral::IntoState).
func.func @main(%ids: tensor<2x4xi64>) -> tensor<2x4x16xf32> {
  %t = pcc.param "wte.weight" : tensor<16x8xf32>
  %b = pcc.param "b" : tensor<2x4x8xf32>
  %e = pcc.gather %t[%ids] axis = 0 : tensor<16x8xf32>, tensor<2x4xi64> -> tensor<2x4x8xf32>
  %f = pcc.add %e, %b : tensor<2x4x8xf32>
  %g = pcc.gelu %f : tensor<2x4x8xf32>
  %l = pcc.matmul %g, %t {transpose_b} : tensor<2x4x8xf32>, tensor<16x8xf32> -> tensor<2x4x16xf32>
  return %l : tensor<2x4x16xf32>
}
// CHECK-LABEL: func.func @train_backward
// CHECK: %[[T1:.*]] = pcc.param "wte.weight@grad" : tensor<16x8xf32>
// CHECK-NEXT: %[[DT:.*]] = pcc.matmul %{{.*}}, %{{.*}} {transpose_a}
// CHECK-NEXT: pcc.assign %[[T1]], %[[DT]] : tensor<16x8xf32>
// CHECK: %[[B:.*]] = pcc.param "b@grad" : tensor<2x4x8xf32>
// CHECK-NEXT: %[[DB:.*]] = pcc.mul
// CHECK-NEXT: pcc.assign %[[B]], %[[DB]] : tensor<2x4x8xf32>
// CHECK: %[[T2:.*]] = pcc.param "wte.weight@grad" : tensor<16x8xf32>
// CHECK-NEXT: pcc.accumulate %[[T2]], %{{.*}} : tensor<16x8xf32>
// CHECK-LABEL: func.func @train_zero_grad
// CHECK-NOT: pcc.zero
// CHECK: return

// Two micro-batches run the backward phase twice a step: the gradients
// are zeroed once and accumulated.
// MB2-LABEL: func.func @train_backward
// MB2-NOT: pcc.assign
// MB2-LABEL: func.func @train_zero_grad
// MB2-COUNT-2: pcc.zero
