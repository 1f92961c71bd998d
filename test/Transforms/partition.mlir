// RUN: pcc-opt %s --split-input-file --pass-pipeline='builtin.module(func.func(pcc-partition))' | FileCheck %s
// RUN: pcc-opt %s --split-input-file --pass-pipeline='builtin.module(func.func(pcc-partition{emit-remarks}))' 2>&1 >/dev/null | FileCheck %s --check-prefix=REMARK

// Tests the Megatron MLP at tp = 2: the first projection split by columns
// (its bias sliced where it is defined), GELU on local columns, the second
// split by rows, and one all-reduce of its partial sums before the bias.
module {
  pcc.mesh @mesh [tp = 2]
  func.func @mlp(%x: tensor<8x64xf32>) -> tensor<8x64xf32> {
    %w1 = pcc.param "fc1.weight" {pcc.sharding = [#pcc.shard<tp, dim = 1>]} : tensor<64x256xf32>
    %b1 = pcc.param "fc1.bias" : tensor<256xf32>
    %w2 = pcc.param "fc2.weight" {pcc.sharding = [#pcc.shard<tp, dim = 0>]} : tensor<256x64xf32>
    %b2 = pcc.param "fc2.bias" : tensor<64xf32>
    %h = pcc.matmul %x, %w1 : tensor<8x64xf32>, tensor<64x256xf32> -> tensor<8x256xf32>
    %bb1 = pcc.broadcast %b1 : tensor<256xf32> -> tensor<8x256xf32>
    %h1 = pcc.add %h, %bb1 : tensor<8x256xf32>
    %g = pcc.gelu %h1 : tensor<8x256xf32>
    %y = pcc.matmul %g, %w2 : tensor<8x256xf32>, tensor<256x64xf32> -> tensor<8x64xf32>
    %bb2 = pcc.broadcast %b2 : tensor<64xf32> -> tensor<8x64xf32>
    %y1 = pcc.add %y, %bb2 : tensor<8x64xf32>
    return %y1 : tensor<8x64xf32>
  }
}
// REMARK: remark: tp=2: 1 all_reduce, 0 all_gather, 0 reduce_scatter; 2048 bytes per run
// CHECK-LABEL: func.func @mlp
// CHECK-DAG: %[[W1:.*]] = pcc.param "fc1.weight" shard(#pcc.shard<tp, dim = 1>) : tensor<64x128xf32>
// CHECK-DAG: %[[W2:.*]] = pcc.param "fc2.weight" shard(#pcc.shard<tp, dim = 0>) : tensor<128x64xf32>
// CHECK: %[[H:.*]] = pcc.matmul %{{.*}}, %[[W1]] : tensor<8x64xf32>, tensor<64x128xf32> -> tensor<8x128xf32>
// CHECK: %[[B1:.*]] = pcc.param "fc1.bias" shard(#pcc.shard<tp, dim = 0>) : tensor<128xf32>
// CHECK: pcc.broadcast %[[B1]] : tensor<128xf32> -> tensor<8x128xf32>
// CHECK: %[[G:.*]] = pcc.gelu %{{.*}} : tensor<8x128xf32>
// CHECK: %[[P:.*]] = pcc.matmul %[[G]], %[[W2]] : tensor<8x128xf32>, tensor<128x64xf32> -> tensor<8x64xf32>
// CHECK: %[[R:.*]] = pcc.all_reduce %[[P]] axis = "tp" : tensor<8x64xf32>
// CHECK: %[[Y:.*]] = pcc.add %[[R]], %{{.*}} : tensor<8x64xf32>
// CHECK: return %[[Y]]

// -----

// Tests that a result split in stripes is gathered whole: the stacked
// pieces are reordered so each rank's chunk goes back into every stripe.
module {
  pcc.mesh @mesh [tp = 2]
  func.func @gather_stripes(%x: tensor<4x8xf32>) -> tensor<4x12xf32> {
    %w = pcc.param "w" {pcc.sharding = [#pcc.shard<tp, dim = 1, stripes = 3>]} : tensor<8x12xf32>
    %y = pcc.matmul %x, %w : tensor<4x8xf32>, tensor<8x12xf32> -> tensor<4x12xf32>
    return %y : tensor<4x12xf32>
  }
}
// REMARK: remark: tp=2: 0 all_reduce, 1 all_gather, 0 reduce_scatter; 192 bytes per run
// CHECK-LABEL: func.func @gather_stripes
// CHECK: pcc.param "w" shard(#pcc.shard<tp, dim = 1, stripes = 3>) : tensor<8x6xf32>
// CHECK: %[[Y:.*]] = pcc.matmul {{.*}} -> tensor<4x6xf32>
// CHECK: %[[G:.*]] = pcc.all_gather %[[Y]] axis = "tp" : tensor<4x6xf32> -> tensor<2x4x6xf32>
// CHECK: %[[S:.*]] = pcc.reshape %[[G]] : tensor<2x4x6xf32> -> tensor<2x4x3x2xf32>
// CHECK: %[[T:.*]] = pcc.transpose %[[S]] [1, 2, 0, 3] : tensor<2x4x3x2xf32> -> tensor<4x3x2x2xf32>
// CHECK: %[[W:.*]] = pcc.reshape %[[T]] : tensor<4x3x2x2xf32> -> tensor<4x12xf32>
// CHECK: return %[[W]]

// -----

// Tests that a partial sum read split becomes a reduce-scatter.
module {
  pcc.mesh @mesh [tp = 2]
  func.func @scatter(%x: tensor<4x8xf32>, %z: tensor<4x6xf32>) -> tensor<4x6xf32> {
    %a = pcc.param "a" {pcc.sharding = [#pcc.shard<tp, dim = 1>]} : tensor<4x8xf32>
    %w = pcc.param "w" {pcc.sharding = [#pcc.shard<tp, dim = 0>]} : tensor<8x6xf32>
    %v = pcc.param "v" {pcc.sharding = [#pcc.shard<tp, dim = 1>]} : tensor<4x6xf32>
    %s = pcc.add %x, %a : tensor<4x8xf32>
    %p = pcc.matmul %s, %w : tensor<4x8xf32>, tensor<8x6xf32> -> tensor<4x6xf32>
    %q = pcc.sub %p, %v : tensor<4x6xf32>
    return %q : tensor<4x6xf32>
  }
}
// REMARK: remark: tp=2: 0 all_reduce, 1 all_gather, 1 reduce_scatter
// CHECK-LABEL: func.func @scatter
// CHECK: %[[P:.*]] = pcc.matmul {{.*}} -> tensor<4x6xf32>
// CHECK: %[[T:.*]] = pcc.transpose {{.*}} [2, 0, 1, 3] : tensor<4x1x2x3xf32> -> tensor<2x4x1x3xf32>
// CHECK: %[[R:.*]] = pcc.reduce_scatter %[[T]] axis = "tp" : tensor<2x4x1x3xf32> -> tensor<4x1x3xf32>
// CHECK: pcc.sub {{.*}} : tensor<4x3xf32>
// CHECK: pcc.all_gather

// -----

// Tests that a lookup in a table split by rows becomes a shard gather whose
// partial sums are all-reduced (the vocabulary-parallel embedding), and that
// the same table read transposed by a matmul gives its columns.
module {
  pcc.mesh @mesh [tp = 2]
  func.func @embedding(%ids: tensor<2x3xi64>) -> tensor<2x3x10xf32> {
    %t = pcc.param "table" {pcc.sharding = [#pcc.shard<tp, dim = 0>]} : tensor<10x4xf32>
    %e = pcc.gather %t[%ids] axis = 0 : tensor<10x4xf32>, tensor<2x3xi64> -> tensor<2x3x4xf32>
    %h = pcc.tanh %e : tensor<2x3x4xf32>
    %l = pcc.matmul %h, %t {transpose_b} : tensor<2x3x4xf32>, tensor<10x4xf32> -> tensor<2x3x10xf32>
    return %l : tensor<2x3x10xf32>
  }
}
// REMARK: remark: tp=2: 1 all_reduce, 1 all_gather, 0 reduce_scatter
// CHECK-LABEL: func.func @embedding
// CHECK: %[[T:.*]] = pcc.param "table" shard(#pcc.shard<tp, dim = 0>) : tensor<5x4xf32>
// CHECK: %[[E:.*]] = pcc.shard_gather %[[T]][%arg0] axis = 0 mesh_axis = "tp" : tensor<5x4xf32>, tensor<2x3xi64> -> tensor<2x3x4xf32>
// CHECK: %[[R:.*]] = pcc.all_reduce %[[E]] axis = "tp" : tensor<2x3x4xf32>
// CHECK: %[[H:.*]] = pcc.tanh %[[R]]
// CHECK: pcc.matmul %[[H]], %[[T]] {transpose_b} : tensor<2x3x4xf32>, tensor<5x4xf32> -> tensor<2x3x5xf32>
// CHECK: pcc.all_gather {{.*}} : tensor<2x3x5xf32> -> tensor<2x2x3x5xf32>
