// RUN: split-file %s %t
// RUN: pcc-opt %t/mlp.mlir --pcc-plan-sharding | FileCheck %s
// RUN: pcc-opt %t/mlp.mlir --pcc-plan-sharding=axis=dp | FileCheck %s --check-prefix=DP
// RUN: pcc-opt %t/mlp.mlir --pcc-plan-sharding=emit-remarks=1 -mlir-print-op-on-diagnostic=false 2>&1 >/dev/null | FileCheck %s --check-prefix=REMARK
// RUN: pcc-opt %t/phases.mlir --pcc-plan-sharding | FileCheck %s --check-prefix=PHASE
// RUN: pcc-opt %t/errors.mlir --split-input-file --pcc-plan-sharding -verify-diagnostics

// Tests that the planner finds the Megatron MLP at tp = 2: fc1 split by
// its output columns (dim 0 of a transposed weight), fc2 by its
// contraction rows (dim 1), the activations split between them, and one
// partial sum at the end. Every op result records its layout.
//--- mlp.mlir
module {
  pcc.mesh @mesh [dp = 4, pp = 1, tp = 2]
  func.func @main(%x: tensor<4x16xf32>) -> tensor<4x16xf32> {
    %w1 = pcc.param "fc1.weight" : tensor<64x16xf32>
    %b1 = pcc.param "fc1.bias" : tensor<64xf32>
    %w2 = pcc.param "fc2.weight" : tensor<16x64xf32>
    %h = pcc.matmul %x, %w1 {transpose_b} : tensor<4x16xf32>, tensor<64x16xf32> -> tensor<4x64xf32>
    %bb1 = pcc.broadcast %b1 : tensor<64xf32> -> tensor<4x64xf32>
    %h1 = pcc.add %h, %bb1 : tensor<4x64xf32>
    %g = pcc.gelu %h1 : tensor<4x64xf32>
    %y = pcc.matmul %g, %w2 {transpose_b} : tensor<4x64xf32>, tensor<16x64xf32> -> tensor<4x16xf32>
    return %y : tensor<4x16xf32>
  }
}
// CHECK-LABEL: func.func @main
// CHECK: pcc.param "fc1.weight" {pcc.sharding = [#pcc.shard<tp, dim = 0>]} : tensor<64x16xf32>
// CHECK: pcc.param "fc1.bias" {pcc.sharding = [#pcc.shard<replicated>]} : tensor<64xf32>
// CHECK: pcc.param "fc2.weight" {pcc.sharding = [#pcc.shard<tp, dim = 1>]} : tensor<16x64xf32>
// CHECK: pcc.matmul {{.*}} {pcc.sharding = [#pcc.shard<tp, dim = 1>], transpose_b} : {{.*}} -> tensor<4x64xf32>
// CHECK: pcc.broadcast {{.*}} {pcc.sharding = [#pcc.shard<replicated>]}
// CHECK: pcc.add {{.*}} {pcc.sharding = [#pcc.shard<tp, dim = 1>]}
// CHECK: pcc.gelu {{.*}} {pcc.sharding = [#pcc.shard<tp, dim = 1>]}
// CHECK: pcc.matmul {{.*}} {pcc.sharding = [#pcc.shard<tp, partial>], transpose_b} : {{.*}} -> tensor<4x16xf32>

// The same plan over another axis, its size (4) from the mesh.
// DP: pcc.param "fc1.weight" {pcc.sharding = [#pcc.shard<dp, dim = 0>]} : tensor<64x16xf32>
// DP: pcc.param "fc2.weight" {pcc.sharding = [#pcc.shard<dp, dim = 1>]} : tensor<16x64xf32>
// DP: pcc.matmul {{.*}} {pcc.sharding = [#pcc.shard<dp, partial>], transpose_b}

// REMARK: remark: tp=2: fc1.weight [64x16] split dim 0 = columns (outputs) -> local [32x16]; replicated: +8192 B whole weights
// REMARK: remark: tp=2: fc2.weight [16x64] split dim 1 = rows (contraction) -> local [16x32]; replicated: +4096 B whole weights
// REMARK: remark: tp=2 group: fc1.weight columns (outputs), fc2.weight rows (contraction): 8192 B fewer whole weights per rank
// REMARK: remark: tp=2: all_reduce of 'tensor<4x16xf32>' (256 bytes): partial sum -> replicated
// REMARK: remark: tp=2 plan: 1 collectives moving 256 bytes per run; weights 4352 bytes per rank (0 bytes of rank >= 2 whole)

// Tests that a training step is planned on its forward phase alone (the
// other phases take its layouts in pcc-partition-training), and that the
// stage functions of a pipelined step, which only record the wiring, are
// left alone.
//--- phases.mlir
module {
  pcc.mesh @mesh [dp = 1, pp = 1, tp = 2]
  func.func @train_forward(%x: tensor<4x8xf32>) -> tensor<4x8xf32> attributes {pcc.phase = "forward"} {
    %w = pcc.param "w" : tensor<8x8xf32>
    %y = pcc.matmul %x, %w : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
    return %y : tensor<4x8xf32>
  }
  func.func @train_backward(%x: tensor<4x8xf32>) -> tensor<4x8xf32> attributes {pcc.phase = "backward"} {
    %w = pcc.param "w" : tensor<8x8xf32>
    %y = pcc.matmul %x, %w {transpose_b} : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
    return %y : tensor<4x8xf32>
  }
  func.func private @stage0(%x: tensor<4x8xf32>) -> tensor<4x8xf32> attributes {pcc.stage = 0 : i64} {
    %w = pcc.param "w" : tensor<8x8xf32>
    %y = pcc.matmul %x, %w : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
    return %y : tensor<4x8xf32>
  }
}
// PHASE-LABEL: func.func @train_forward
// PHASE: pcc.param "w" {pcc.sharding = [#pcc.shard<tp, dim = 1>]} : tensor<8x8xf32>
// PHASE: pcc.matmul {{.*}} {pcc.sharding = [#pcc.shard<tp, dim = 1>]}
// PHASE-LABEL: func.func @train_backward
// PHASE-NOT: pcc.sharding
// PHASE-LABEL: func.func private @stage0
// PHASE-NOT: pcc.sharding
// PHASE: return

//--- errors.mlir
// The axis must be in the module's mesh.
module {
  pcc.mesh @mesh [dp = 2, pp = 1]
  // expected-error @below {{'func.func' op mesh axis 'tp' is not in the module's pcc.mesh}}
  func.func @main(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
    %w = pcc.param "w" : tensor<8x8xf32>
    %y = pcc.matmul %x, %w : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
    return %y : tensor<4x8xf32>
  }
}

// -----

// No dimension of the weight divides over 2 ranks: a warning, and every
// layout replicated.
module {
  pcc.mesh @mesh [dp = 1, pp = 1, tp = 2]
  // expected-warning @below {{tp=2: no weight is split (none of their dimensions divides into 2 or splitting costs more than it saves), so every rank holds and computes the whole model}}
  func.func @main(%x: tensor<4x3xf32>) -> tensor<4x5xf32> {
    %w = pcc.param "w" : tensor<3x5xf32>
    %y = pcc.matmul %x, %w : tensor<4x3xf32>, tensor<3x5xf32> -> tensor<4x5xf32>
    return %y : tensor<4x5xf32>
  }
}
