// RUN: pcc-opt %s --pass-pipeline='builtin.module(pcc-pipeline-cut{cuts=l0})' | FileCheck %s

// Tests that the last stage returns exactly the model's outputs, in order:
// a graph input returned as is comes into the last stage directly, a
// constant-only output is computed there, and an output returned twice
// is returned twice. @main returns the last call's results one for one.
module {
  pcc.mesh @mesh [dp = 1, pp = 2, tp = 1]
  func.func @main(%x: tensor<4x8xf32>) -> (tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>) {
    %w0 = pcc.param "w0" : tensor<8x8xf32>
    %w1 = pcc.param "w1" : tensor<8x8xf32>
    %c = pcc.constant dense<2.0> : tensor<4x8xf32>
    %a0 = pcc.matmul %x, %w0 : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32> loc(fused<"MatMul">["l0"])
    %a1 = pcc.matmul %a0, %w1 : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
    return %a1, %x, %c, %a1 : tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>
  }
}
// CHECK-LABEL: func.func private @stage1(%arg0: tensor<4x8xf32>, %arg1: tensor<4x8xf32>) -> (tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>)
// CHECK: %[[A:.*]] = pcc.matmul %arg0
// CHECK: %[[C:.*]] = pcc.constant dense<2.000000e+00>
// CHECK: return %[[A]], %arg1, %[[C]], %[[A]]
// CHECK-LABEL: func.func @main
// CHECK: %[[S1:.*]]:4 = call @stage1(%{{.*}}, %arg0)
// CHECK-NEXT: return %[[S1]]#0, %[[S1]]#1, %[[S1]]#2, %[[S1]]#3
