// RUN: pcc-opt %s --pass-pipeline='builtin.module(func.func(pcc-plan-memory))' | pcc-translate --pcc-to-cpp | FileCheck %s
// RUN: pcc-opt %s --pass-pipeline='builtin.module(func.func(pcc-plan-memory))' | pcc-translate --pcc-to-cuda | FileCheck %s --check-prefix=CUDA

// A vocabulary-parallel embedding's gradient (pcc.shard_scatter_add) calls
// the block kernels with this rank's block (8 of 16 rows, starting at its
// tp rank times 8), checked against the whole dimension.

module {
  pcc.mesh @mesh [dp = 1, pp = 1, tp = 2]
  func.func @main(%g: tensor<2x3x8xf32>, %ids: tensor<2x3xi64>) -> (tensor<8x8xf32> {pcc.name = "dw"}) {
    %dw = pcc.shard_scatter_add %g[%ids] axis = 0 mesh_axis = "tp" : tensor<2x3x8xf32>, tensor<2x3xi64> -> tensor<8x8xf32>
    return %dw : tensor<8x8xf32>
  }
}

// CHECK: if (pcc_cpu_scatter_add_block_f32({{.*}}, 1, 8, static_cast<int64_t>(rc->comms[{{[0-9]}}].rank) * 8, 16, 8, 6, 1))
// CHECK-NEXT: return fail("pcc.shard_scatter_add{{.*}}", pcc_cpu_last_error());
// CUDA: "pcc.shard_scatter_add{{.*}}: an index is outside [-16, 16)"
// CUDA: pcc_cuda_scatter_add_block_f32(ctx, {{.*}}, 1, 8, static_cast<int64_t>(rc->comms[{{[0-9]}}].rank) * 8, 16, 8, 6, 1, 1);
