// RUN: pcc-opt %s --pass-pipeline='builtin.module(pcc-pipeline-cut{cuts=l0,l1})' | FileCheck %s

// Tests that a value a later stage reads passes through the stages between
// (transfers go one hop, as the schedule's sends do), and that an output
// computed early reaches the last stage the same way.
module {
  pcc.mesh @mesh [dp = 1, pp = 3, tp = 1]
  func.func @main(%x: tensor<4x8xf32>) -> (tensor<4x8xf32>, tensor<4x8xf32>) {
    %w0 = pcc.param "w0" : tensor<8x8xf32>
    %w1 = pcc.param "w1" : tensor<8x8xf32>
    %w2 = pcc.param "w2" : tensor<8x8xf32>
    %a0 = pcc.matmul %x, %w0 : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32> loc(fused<"MatMul">["l0"])
    %a1 = pcc.matmul %a0, %w1 : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32> loc(fused<"MatMul">["l1"])
    %a2 = pcc.matmul %a1, %w2 : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
    %r = pcc.add %a2, %a0 : tensor<4x8xf32>
    return %r, %a0 : tensor<4x8xf32>, tensor<4x8xf32>
  }
}
// CHECK-LABEL: func.func private @stage1(%arg0: tensor<4x8xf32>) -> (tensor<4x8xf32>, tensor<4x8xf32>)
// CHECK: return %{{.*}}, %arg0
// CHECK-LABEL: func.func private @stage2(%arg0: tensor<4x8xf32>, %arg1: tensor<4x8xf32>) -> (tensor<4x8xf32>, tensor<4x8xf32>)
// CHECK: %[[R:.*]] = pcc.add %{{.*}}, %arg1
// CHECK: return %[[R]], %arg1
// CHECK-LABEL: func.func @main
// CHECK: %[[S0:.*]] = call @stage0
// CHECK: %[[T01:.*]] = pcc.transfer %[[S0]] from 0 to 1
// CHECK: %[[S1:.*]]:2 = call @stage1(%[[T01]])
// CHECK: %[[A:.*]] = pcc.transfer %[[S1]]#0 from 1 to 2
// CHECK: %[[B:.*]] = pcc.transfer %[[S1]]#1 from 1 to 2
// CHECK: %[[S2:.*]]:2 = call @stage2(%[[A]], %[[B]])
// CHECK: return %[[S2]]#0, %[[S2]]#1
