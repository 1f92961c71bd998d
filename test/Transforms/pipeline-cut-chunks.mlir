// RUN: pcc-opt %s --pass-pipeline='builtin.module(pcc-pipeline-cut{chunks=2},pcc-pipeline-schedule{policy=interleaved microbatches=2})' | FileCheck %s
// RUN: pcc-opt %s --mlir-print-op-on-diagnostic=false --pass-pipeline='builtin.module(pcc-pipeline-cut{chunks=2 emit-remarks})' 2>&1 >/dev/null | FileCheck %s --check-prefix=REMARK

// Tests the interleaved cut: 2 pipeline ranks x 2 chunks make 4 stages
// (stage k on rank k mod 2), the module records pcc.pp_chunks, and the
// schedule numbers each rank's chunks. Four equal layers: each rank gets
// two, so the ranks balance.
module {
  pcc.mesh @mesh [dp = 1, pp = 2, tp = 1]
  func.func @main(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
    %w0 = pcc.param "w0" : tensor<8x8xf32>
    %w1 = pcc.param "w1" : tensor<8x8xf32>
    %w2 = pcc.param "w2" : tensor<8x8xf32>
    %w3 = pcc.param "w3" : tensor<8x8xf32>
    %a0 = pcc.matmul %x, %w0 : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32> loc(fused<"MatMul">["l0"])
    %a1 = pcc.matmul %a0, %w1 : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32> loc(fused<"MatMul">["l1"])
    %a2 = pcc.matmul %a1, %w2 : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32> loc(fused<"MatMul">["l2"])
    %a3 = pcc.matmul %a2, %w3 : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32> loc(fused<"MatMul">["l3"])
    return %a3 : tensor<4x8xf32>
  }
}
// REMARK: remark: pp=2 x 2 chunks: stage 0 (rank 0): 1 ops, node 'l0' .. node 'l0'
// REMARK: remark: pp=2 x 2 chunks: stage 3 (rank 1): 1 ops, node 'l3' .. node 'l3'
// REMARK: remark: pp=2 x 2 chunks: per rank (its stages together): rank 0 {{.*}} us, rank 1 {{.*}} us; imbalance 1.00 (busiest / mean)
// CHECK: module attributes {{{.*}}pcc.pp_chunks = 2 : i64}
// CHECK: func.func private @stage3({{.*}} attributes {pcc.stage = 3 : i64}
// CHECK-LABEL: func.func @main
// CHECK-SAME: pcc.schedule = {chunks = 2 : i64, microbatches = 2 : i64, policy = "interleaved", ranks = ["F0.0 send_fwd0.0>1 F1.0 send_fwd1.0>1 recv_fwd0.1<1 F0.1 send_fwd0.1>1 recv_fwd1.1<1 F1.1 send_fwd1.1>1", "recv_fwd0.0<0 F0.0 send_fwd0.0>0 recv_fwd1.0<0 F1.0 send_fwd1.0>0 recv_fwd0.1<0 F0.1 recv_fwd1.1<0 F1.1"]}
// CHECK: pcc.transfer {{.*}} from 0 to 1
// CHECK: pcc.transfer {{.*}} from 1 to 2
// CHECK: pcc.transfer {{.*}} from 2 to 3
