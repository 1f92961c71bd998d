// RUN: pcc-opt %s --pass-pipeline='builtin.module(func.func(pcc-autocast,pcc-fuse-elementwise,pcc-plan-memory))' | pcc-translate --pcc-to-cpp | FileCheck %s
// RUN: pcc-opt %s --pass-pipeline='builtin.module(func.func(pcc-autocast,pcc-fuse-elementwise,pcc-plan-memory))' | pcc-translate --pcc-to-cuda | FileCheck %s --check-prefix=CUDA

// A bf16 product (pcc-autocast) in the model library: its operands are
// cast by the runtime's cast kernel, the product calls the bf16 GEMM
// (oneDNN on the CPU, whose failure the library reports naming the node;
// cuBLAS with fp32 accumulation on CUDA), and its result is cast back.

module {
  pcc.mesh @mesh [dp = 1, pp = 1, tp = 1]
  func.func @main(%x: tensor<4x8xf32>) -> (tensor<4x3xf32> {pcc.name = "y"}) {
    %w = pcc.param "fc.weight" : tensor<3x8xf32>
    %y = pcc.matmul %x, %w {transpose_b} : tensor<4x8xf32>, tensor<3x8xf32> -> tensor<4x3xf32>
    return %y : tensor<4x3xf32>
  }
}

// CHECK: pcc_cpu_cast({{.*}}, 0, {{.*}}, 3, 32);
// CHECK: pcc_cpu_cast({{.*}}, 0, {{.*}}, 3, 24);
// CHECK: if (pcc_cpu_matmul_bf16({{.*}}, 1, 4, 3, 8, 0, 1, 32, 0))
// CHECK-NEXT: return fail(
// CHECK: pcc_cpu_cast({{.*}}, 3, {{.*}}, 0, 12);

// CUDA: pcc_cuda_matmul_bf16(ctx, {{.*}}, 1, 4, 3, 8, 0, 1, 32, 0);
