// RUN: pcc-opt %s --split-input-file --pass-pipeline='builtin.module(pcc-pipeline-cut)' | FileCheck %s
// RUN: pcc-opt %s --split-input-file --pass-pipeline='builtin.module(pcc-pipeline-cut{emit-remarks})' 2>&1 >/dev/null | FileCheck %s --check-prefix=REMARK
// RUN: pcc-opt %s --split-input-file --pass-pipeline='builtin.module(pcc-pipeline-cut{cuts=l0})' | FileCheck %s --check-prefix=FORCED
// RUN: pcc-opt %s --split-input-file --pass-pipeline='builtin.module(pcc-pipeline-cut,pcc-pipeline-schedule{policy=gpipe microbatches=2})' | FileCheck %s --check-prefix=SCHED

// Tests that three equal layers on two stages split 2 + 1 at the narrowest
// points (only the residual crosses), that weights are cloned into the
// stage that reads them, that the graph input goes to every stage that
// reads it, and that @main calls the stages with one transfer.
module {
  pcc.mesh @mesh [dp = 1, pp = 2, tp = 1]
  func.func @main(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
    %w0 = pcc.param "w0" : tensor<8x8xf32>
    %w1 = pcc.param "w1" : tensor<8x8xf32>
    %w2 = pcc.param "w2" : tensor<8x8xf32>
    %a0 = pcc.matmul %x, %w0 : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32> loc(fused<"MatMul">["l0"])
    %r0 = pcc.add %a0, %x : tensor<4x8xf32> loc(fused<"Add">["l0"])
    %a1 = pcc.matmul %r0, %w1 : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
    %r1 = pcc.add %a1, %r0 : tensor<4x8xf32>
    %a2 = pcc.matmul %r1, %w2 : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
    %r2 = pcc.add %a2, %x : tensor<4x8xf32>
    return %r2 : tensor<4x8xf32>
  }
}
// CHECK-LABEL: func.func private @stage0(%arg0: tensor<4x8xf32>) -> tensor<4x8xf32> attributes {pcc.stage = 0 : i64}
// CHECK-DAG: pcc.param "w0"
// CHECK-DAG: pcc.param "w1"
// CHECK-NOT: pcc.param "w2"
// CHECK: return
// CHECK-LABEL: func.func private @stage1(%arg0: tensor<4x8xf32>, %arg1: tensor<4x8xf32>) -> tensor<4x8xf32> attributes {pcc.stage = 1 : i64}
// CHECK: %[[W2:.*]] = pcc.param "w2"
// CHECK: %[[A:.*]] = pcc.matmul %arg0, %[[W2]]
// CHECK: pcc.add %[[A]], %arg1
// CHECK-LABEL: func.func @main(%arg0: tensor<4x8xf32>) -> tensor<4x8xf32>
// CHECK-NEXT: %[[S0:.*]] = call @stage0(%arg0)
// CHECK-NEXT: %[[T:.*]] = pcc.transfer %[[S0]] from 0 to 1 : tensor<4x8xf32>
// CHECK-NEXT: %[[S1:.*]] = call @stage1(%[[T]], %arg0)
// CHECK-NEXT: return %[[S1]]

// REMARK: remark: pp=2: stage 0: 4 ops, node 'l0' .. node 'pcc.add'; predicted {{.*}} us (1024 FLOPs); weights 512 bytes; activations in 0 bytes, out 128 bytes
// REMARK: remark: pp=2: stage 1: 2 ops, node 'pcc.matmul' .. node 'pcc.add'; predicted {{.*}} us (512 FLOPs); weights 256 bytes; activations in 128 bytes, out 0 bytes
// REMARK: remark: pp=2: slowest stage {{.*}} us, mean {{.*}} us, imbalance 1.33 (slowest / mean)

// --pp-cuts: after node 'l0' instead (1 + 2).
// FORCED-LABEL: func.func private @stage0
// FORCED-NOT: pcc.param "w1"
// FORCED: return
// FORCED-LABEL: func.func private @stage1
// FORCED-DAG: pcc.param "w1"
// FORCED-DAG: pcc.param "w2"

// SCHED: pcc.schedule = {microbatches = 2 : i64, policy = "gpipe", ranks = ["F0 send_fwd0>1 F1 send_fwd1>1", "recv_fwd0<0 F0 recv_fwd1<0 F1"]}

