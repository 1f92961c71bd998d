// RUN: pcc-opt %s | pcc-opt | FileCheck %s

// Tests that mesh shardings, sharded weights and collectives print and parse.
module {
  pcc.mesh @mesh [dp = 1, pp = 1, tp = 4]
  // CHECK-LABEL: func.func @layouts
  func.func @layouts(%x: tensor<2x64xf32>, %p: tensor<2x64xf32>) -> tensor<2x64xf32> {
    // CHECK: pcc.param "w" shard(#pcc.shard<tp, dim = 1, stripes = 3>) : tensor<64x48xf32>
    %w = pcc.param "w" shard(#pcc.shard<tp, dim = 1, stripes = 3>) : tensor<64x48xf32>
    // CHECK: pcc.sharding = [#pcc.shard<tp, dim = 1>]
    %a = pcc.relu %x {pcc.sharding = [#pcc.shard<tp, dim = 1>]} : tensor<2x64xf32>
    // CHECK: pcc.sharding = [#pcc.shard<tp, partial>]
    %b = pcc.neg %p {pcc.sharding = [#pcc.shard<tp, partial>]} : tensor<2x64xf32>
    // CHECK: pcc.sharding = [#pcc.shard<replicated>]
    %c = pcc.add %a, %b {pcc.sharding = [#pcc.shard<replicated>]} : tensor<2x64xf32>
    // CHECK: pcc.all_reduce %{{.*}} axis = "tp" : tensor<2x64xf32>
    %r = pcc.all_reduce %c axis = "tp" : tensor<2x64xf32>
    // CHECK: pcc.all_gather %{{.*}} axis = "tp" : tensor<2x16xf32> -> tensor<4x2x16xf32>
    %s = pcc.shard_slice %r axis = "tp" dim = 1 stripes = 1 : tensor<2x64xf32> -> tensor<2x16xf32>
    %g = pcc.all_gather %s axis = "tp" : tensor<2x16xf32> -> tensor<4x2x16xf32>
    // CHECK: pcc.reduce_scatter %{{.*}} axis = "tp" : tensor<4x2x16xf32> -> tensor<2x16xf32>
    %rs = pcc.reduce_scatter %g axis = "tp" : tensor<4x2x16xf32> -> tensor<2x16xf32>
    // CHECK: pcc.shard_gather %{{.*}}[%{{.*}}] axis = 0 mesh_axis = "tp" : tensor<128x64xf32>, tensor<2x16xi64> -> tensor<2x16x64xf32>
    %t = pcc.param "table" shard(#pcc.shard<tp, dim = 0>) : tensor<128x64xf32>
    %ids = pcc.constant dense<1> : tensor<2x16xi64>
    %e = pcc.shard_gather %t[%ids] axis = 0 mesh_axis = "tp" : tensor<128x64xf32>, tensor<2x16xi64> -> tensor<2x16x64xf32>
    // CHECK: pcc.shard_scatter_add %{{.*}}[%{{.*}}] axis = 0 mesh_axis = "tp" : tensor<2x16x64xf32>, tensor<2x16xi64> -> tensor<32x64xf32>
    %dt = pcc.shard_scatter_add %e[%ids] axis = 0 mesh_axis = "tp" : tensor<2x16x64xf32>, tensor<2x16xi64> -> tensor<32x64xf32>
    return %r : tensor<2x64xf32>
  }
}
