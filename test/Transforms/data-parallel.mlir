// RUN: split-file %s %t
// RUN: pcc-opt %t/mlp.mlir --pcc-loss --pcc-autodiff --pcc-optimizer=kind=sgd --cse --pcc-merge-state-loads --pcc-data-parallel=dp=2 --canonicalize | FileCheck %s --check-prefix=Z0
// RUN: pcc-opt %t/mlp.mlir --pcc-loss --pcc-autodiff --pcc-optimizer=kind=sgd --cse --pcc-merge-state-loads --pcc-data-parallel='dp=2 zero=1' --canonicalize | FileCheck %s --check-prefix=Z1
// RUN: pcc-opt %t/mlp.mlir --pcc-loss --pcc-autodiff --pcc-optimizer=kind=sgd --cse --pcc-merge-state-loads --pcc-data-parallel='dp=2 zero=2' --canonicalize | FileCheck %s --check-prefix=Z2
// RUN: pcc-opt %t/mlp.mlir --pcc-loss --pcc-autodiff --pcc-optimizer=kind=sgd --cse --pcc-merge-state-loads --pcc-data-parallel='dp=2 zero=3 prefetch=1' --canonicalize | FileCheck %s --check-prefix=Z3
// RUN: pcc-opt %t/mlp.mlir --pcc-loss --pcc-autodiff --pcc-optimizer=kind=sgd --cse --pcc-merge-state-loads --pcc-data-parallel='dp=2 zero=3 reshard-after-forward=false' --canonicalize | FileCheck %s --check-prefix=KEEP
// RUN: pcc-opt %t/mlp.mlir --pcc-loss --pcc-autodiff --pcc-optimizer=kind=sgd --cse --pcc-merge-state-loads --pcc-data-parallel='dp=2 bucket-bytes=256' --canonicalize | FileCheck %s --check-prefix=BUCKET
// RUN: pcc-opt %t/pipelined.mlir --pcc-autodiff --pcc-optimizer=kind=sgd --cse --pcc-merge-state-loads --pcc-data-parallel='dp=2 zero=2 reduce-each-microbatch=1' --canonicalize | FileCheck %s --check-prefix=PP
// RUN: not pcc-opt %t/pipelined.mlir --pcc-autodiff --pcc-optimizer=kind=sgd --cse --pcc-merge-state-loads --pcc-data-parallel='dp=2 zero=2 reduce-each-microbatch=1 bucket-bytes=-1' 2>&1 | FileCheck %s --check-prefix=PP-ERR
// RUN: not pcc-opt %t/mlp.mlir --pcc-loss --pcc-autodiff --pcc-optimizer=kind=sgd --cse --pcc-merge-state-loads --pcc-data-parallel='dp=2 zero=4' 2>&1 | FileCheck %s --check-prefix=STAGE
// RUN: not pcc-opt %t/mlp.mlir --pcc-loss --pcc-autodiff --pcc-optimizer=kind=sgd --pcc-data-parallel=dp=2 2>&1 | FileCheck %s --check-prefix=CSE
// RUN: pcc-opt %t/errors.mlir --split-input-file --pcc-data-parallel='dp=2 zero=1' -verify-diagnostics
// One data-parallel rank's training step (cross-entropy, SGD).
//--- mlp.mlir
module {
  pcc.mesh @mesh [dp = 2, pp = 1, tp = 1]
  func.func @main(%x: tensor<4x8xf32>) -> tensor<4x5xf32> {
    %w1 = pcc.param "fc1.weight" : tensor<16x8xf32>
    %w2 = pcc.param "fc2.weight" : tensor<5x16xf32>
    %b2 = pcc.param "fc2.bias" : tensor<5xf32>
    %h = pcc.matmul %x, %w1 {transpose_b} : tensor<4x8xf32>, tensor<16x8xf32> -> tensor<4x16xf32>
    %g = pcc.relu %h : tensor<4x16xf32>
    %y = pcc.matmul %g, %w2 {transpose_b} : tensor<4x16xf32>, tensor<5x16xf32> -> tensor<4x5xf32>
    %bb = pcc.broadcast %b2 : tensor<5xf32> -> tensor<4x5xf32>
    %z = pcc.add %y, %bb : tensor<4x5xf32>
    return %z : tensor<4x5xf32>
  }
}

// ZeRO 0: the optimizer reads each gradient through an all-reduce over
// dp, in the order the backward phase produces them.
// Z0: pcc.training = {{.*}}zero = 0
// Z0-LABEL: func.func @train_backward
// Z0-NOT: pcc.all_reduce
// Z0-LABEL: func.func @train_optimizer
// Z0: %[[G:.*]] = pcc.param "fc2.bias@grad" : tensor<5xf32>
// Z0-NEXT: %[[S:.*]] = pcc.all_reduce %[[G]] axis = "dp" : tensor<5xf32>
// Z0: pcc.param "fc1.weight@grad"
// Z0-NEXT: pcc.all_reduce %{{.*}} axis = "dp" : tensor<16x8xf32>
// Z0: pcc.sgd_update %{{.*}}, %[[S]], %{{.*}} : tensor<5xf32>, tensor<f32>

// ZeRO 1: each gradient reduce-scattered (the 5-element bias padded to
// 2 x 3), this rank's master piece and momentum updated, the pieces
// (loaded again after the update) gathered back into the whole weight; the
// norm's squares all-reduced.
// Z1-LABEL: func.func @train_optimizer
// Z1: pcc.pad %{{.*}} starts = [0] steps = [1] : tensor<5xf32> -> tensor<6xf32>
// Z1: %[[GS:.*]] = pcc.reduce_scatter %{{.*}} axis = "dp" : tensor<2x3xf32> -> tensor<3xf32>
// Z1: %[[SQ:.*]] = pcc.all_reduce %{{.*}} axis = "dp" : tensor<f32>
// Z1-NEXT: %[[NORM:.*]] = pcc.sqrt %[[SQ]]
// Z1-NEXT: %[[P:.*]] = pcc.param "fc2.bias@master" shard(#pcc.shard<dp, flat>) of [5] : tensor<3xf32>
// Z1-NEXT: %[[M:.*]] = pcc.param "fc2.bias@momentum_buffer" shard(#pcc.shard<dp, flat>) of [5] : tensor<3xf32>
// Z1-NEXT: pcc.sgd_update %[[P]], %[[GS]], %[[M]], %[[NORM]] : tensor<3xf32>, tensor<f32>
// Z1-NEXT: %[[UP:.*]] = pcc.param "fc2.bias@master" shard(#pcc.shard<dp, flat>) of [5] : tensor<3xf32>
// Z1-NEXT: %[[AG:.*]] = pcc.all_gather %[[UP]] axis = "dp" : tensor<3xf32> -> tensor<2x3xf32>
// Z1: %[[W:.*]] = pcc.slice %{{.*}} starts = [0] limits = [5] steps = [1] : tensor<6xf32> -> tensor<5xf32>
// Z1-NEXT: %[[DST:.*]] = pcc.param "fc2.bias" : tensor<5xf32>
// Z1-NEXT: pcc.assign %[[DST]], %[[W]] : tensor<5xf32>

// ZeRO 2: the backward phase reduce-scatters each gradient as it is made
// and accumulates this rank's piece; the optimizer reads the pieces.
// Z2-LABEL: func.func @train_backward
// Z2: %[[RS:.*]] = pcc.reduce_scatter %{{.*}} axis = "dp" : tensor<2x40xf32> -> tensor<40xf32>
// Z2-NEXT: %[[G:.*]] = pcc.param "fc2.weight@grad" shard(#pcc.shard<dp, flat>) of [5, 16] : tensor<40xf32>
// Z2-NEXT: pcc.accumulate %[[G]], %[[RS]] : tensor<40xf32>
// Z2-LABEL: func.func @train_optimizer
// Z2-NOT: pcc.reduce_scatter
// Z2-LABEL: func.func @train_zero_grad
// Z2: pcc.zero %{{.*}} : tensor<40xf32>

// ZeRO 3, prefetch 1: weights are pieces; each gather starts one gather
// ahead; the optimizer updates the pieces in place (no master, no gather).
// Z3-LABEL: func.func @train_forward
// Z3: %[[P1:.*]] = pcc.param "fc1.weight" shard(#pcc.shard<dp, flat>) of [16, 8] : tensor<64xf32>
// Z3-NEXT: %[[S1:.*]] = pcc.all_gather_start %[[P1]] axis = "dp" : tensor<64xf32> -> tensor<2x64xf32>
// Z3-NEXT: pcc.wait_collectives axis = "dp"(%[[S1]]) reading(%[[P1]])
// Z3-NEXT: %[[P2:.*]] = pcc.param "fc2.weight" shard(#pcc.shard<dp, flat>) of [5, 16] : tensor<40xf32>
// Z3-NEXT: %[[S2:.*]] = pcc.all_gather_start %[[P2]] axis = "dp"
// Z3: pcc.wait_collectives axis = "dp"(%[[S2]]) reading(%[[P2]])
// Z3-LABEL: func.func @train_optimizer
// Z3-NOT: @master
// Z3: %[[W:.*]] = pcc.param "fc1.weight" shard(#pcc.shard<dp, flat>) of [16, 8] : tensor<64xf32>
// Z3: pcc.sgd_update %[[W]], {{.*}} : tensor<64xf32>, tensor<f32>
// Z3-NOT: pcc.all_gather

// ZeRO 3 without resharding: the backward phase reads the gathered
// weight the forward phase saved instead of gathering it again.
// KEEP-LABEL: func.func @train_forward
// KEEP-SAME: tensor<5x16xf32> {pcc.name = "gathered:fc2.weight"}
// KEEP-LABEL: func.func @train_backward
// KEEP-SAME: %arg4: tensor<5x16xf32> {pcc.name = "gathered:fc2.weight"}
// KEEP-NOT: pcc.all_gather
// KEEP: func.func @train_optimizer

// Gradient buckets of 256 bytes: the backward phase starts each bucket's
// all-reduce after its last gradient; the optimizer waits once.
// BUCKET: buckets = [{grads = ["fc2.bias@grad", "fc2.weight@grad"], offsets = array<i64: 0, 16>, state = "fc2.bias@bucket"}, {grads = ["fc1.weight@grad"], offsets = array<i64: 0>, state = "fc1.weight@bucket"}]
// BUCKET-LABEL: func.func @train_backward
// BUCKET: pcc.accumulate %{{.*}} : tensor<5x16xf32>
// BUCKET-NEXT: %[[B:.*]] = pcc.param "fc2.bias@bucket" : tensor<96xf32>
// BUCKET-NEXT: pcc.bucket_start %[[B]] axis = "dp" : tensor<96xf32>
// BUCKET-LABEL: func.func @train_optimizer
// BUCKET-NEXT: %[[W:.*]] = pcc.param "fc2.bias@bucket" : tensor<96xf32>
// BUCKET-NEXT: pcc.bucket_wait %[[W]] axis = "dp" : tensor<96xf32>
// BUCKET-NOT: pcc.all_reduce %{{.*}} : tensor<5

// A pipelined step under ZeRO 2 reducing each micro-batch: the W phases
// reduce-scatter into sharded accumulators; each rank's optimizer sums the
// stage-shared weight over pp and the norm over dp, then pp.
//--- pipelined.mlir
module {
  pcc.mesh @mesh [dp = 2, pp = 2, tp = 1]
  func.func private @stage0(%x: tensor<4x8xf32>) -> tensor<4x8xf32> attributes {pcc.stage = 0 : i64} {
    %w = pcc.param "w" : tensor<8x8xf32>
    %h = pcc.matmul %x, %w : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
    return %h : tensor<4x8xf32>
  }
  func.func private @stage1(%h: tensor<4x8xf32>) -> tensor<f32> attributes {pcc.stage = 1 : i64} {
    %w = pcc.param "w" : tensor<8x8xf32>
    %y = pcc.matmul %h, %w : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
    %l = pcc.reduce_sum %y axes = [0, 1] : tensor<4x8xf32> -> tensor<f32>
    return %l : tensor<f32>
  }
  func.func @main(%x: tensor<4x8xf32>) -> tensor<f32> {
    %0 = call @stage0(%x) : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %1 = pcc.transfer %0 from 0 to 1 : tensor<4x8xf32>
    %2 = call @stage1(%1) : (tensor<4x8xf32>) -> tensor<f32>
    return %2 : tensor<f32>
  }
}
// PP: pcc.training = {{.*}}zero = 2
// PP-LABEL: func.func @stage1_weight_grad
// PP: %[[RS:.*]] = pcc.reduce_scatter %{{.*}} axis = "dp" : tensor<2x32xf32> -> tensor<32xf32>
// PP-NEXT: %[[G:.*]] = pcc.param "w@grad" shard(#pcc.shard<dp, flat>) of [8, 8] : tensor<32xf32>
// PP-NEXT: pcc.accumulate %[[G]], %[[RS]] : tensor<32xf32>
// PP-LABEL: func.func @rank1_optimizer
// PP: pcc.all_reduce %{{.*}} axis = "pp" : tensor<32xf32>
// PP: %[[N:.*]] = pcc.all_reduce %{{.*}} axis = "dp" : tensor<f32>
// PP-NEXT: pcc.all_reduce %[[N]] axis = "pp" : tensor<f32>
// PP: pcc.param "w@master" shard(#pcc.shard<dp, flat>) of [8, 8] : tensor<32xf32>

// PP-ERR: error: data parallel: gradient buckets in a pipelined step go with the gradients reduced once per step
// STAGE: error: data parallel: ZeRO stage 4 is not 0 to 3
// CSE: error: data parallel: gradient 'fc2.bias@grad' is read by two pcc.param ops (run pcc-merge-state-loads first)

//--- errors.mlir
// expected-error @below {{data parallel: no @train_forward (run pcc-optimizer first)}}
module { pcc.mesh @mesh [dp = 2] }

// -----

module {
  pcc.mesh @mesh [dp = 2]
  func.func @train_forward() attributes {pcc.phase = "forward"} { return }
  func.func @train_backward() attributes {pcc.phase = "backward"} { return }
  // expected-error @below {{data parallel: the optimizer updates no weight}}
  func.func @train_optimizer() attributes {pcc.phase = "optimizer"} { return }
  func.func @train_zero_grad() attributes {pcc.phase = "zero_grad"} { return }
}
