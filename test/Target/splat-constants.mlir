// RUN: pcc-opt %s --pass-pipeline='builtin.module(func.func(pcc-fuse-elementwise,pcc-plan-memory))' | pcc-translate --pcc-to-cpp | FileCheck %s
// RUN: pcc-opt %s --pass-pipeline='builtin.module(func.func(pcc-fuse-elementwise,pcc-plan-memory))' | pcc-translate --pcc-to-cuda | FileCheck %s --check-prefix=CUDA

// Splat constants a kernel reads from memory (here a product's operands)
// are not written out element by element: zeros live in zero-initialised
// storage, any other value is filled once when the library loads. (GPT-2's
// GELU constants at 128 x 3072 in a bf16 pipeline stage made a 309 MB
// library that took four minutes to compile.) A small one stays a list.

module {
  pcc.mesh @mesh [dp = 1, pp = 1, tp = 1]
  func.func @main(%x: tensor<16x16xf32>) -> (tensor<16x16xf32> {pcc.name = "y"}, tensor<16x16xf32> {pcc.name = "z"}, tensor<2x2xf32> {pcc.name = "s"}) {
    %half = pcc.constant dense<5.000000e-01> : tensor<16x16xf32>
    %zero = pcc.constant dense<0.000000e+00> : tensor<16x16xf32>
    %small = pcc.constant dense<2.000000e+00> : tensor<2x2xf32>
    %y = pcc.matmul %x, %half : tensor<16x16xf32>, tensor<16x16xf32> -> tensor<16x16xf32>
    %z = pcc.matmul %x, %zero : tensor<16x16xf32>, tensor<16x16xf32> -> tensor<16x16xf32>
    %s = pcc.matmul %small, %small : tensor<2x2xf32>, tensor<2x2xf32> -> tensor<2x2xf32>
    return %y, %z, %s : tensor<16x16xf32>, tensor<16x16xf32>, tensor<2x2xf32>
  }
}

// CHECK: alignas(64) static float [[HALF:c[0-9]+]][256];
// CHECK-NEXT: static const bool [[HALF]]_filled = [] {
// CHECK-NEXT: for (int64_t i = 0; i < 256; ++i)
// CHECK-NEXT: [[HALF]][i] = 5.000000000e-01f;
// CHECK-NEXT: return true;
// CHECK-NEXT: }();
// CHECK-NEXT: alignas(64) static float [[ZERO:c[0-9]+]][256];
// CHECK-NEXT: alignas(64) static const float [[SMALL:c[0-9]+]][] = {
// CHECK-NEXT: 2.000000000e+00f, 2.000000000e+00f, 2.000000000e+00f, 2.000000000e+00f};
// CHECK: const float *[[VH:v[0-9]+]] = [[HALF]];
// CHECK: const float *[[VZ:v[0-9]+]] = [[ZERO]];
// CHECK: const float *[[VS:v[0-9]+]] = [[SMALL]];
// CHECK: pcc_cpu_matmul_f32(v0, [[VH]],
// CHECK: pcc_cpu_matmul_f32(v0, [[VZ]],
// CHECK: pcc_cpu_matmul_f32([[VS]], [[VS]],

// On a GPU zeros are a device global without an initialiser; another
// value keeps its list.
// CUDA: __device__ float [[GHALF:gc[0-9]+]][] = {
// CUDA-NEXT: 5.000000000e-01f, 5.000000000e-01f,
// CUDA: __device__ float [[GZERO:gc[0-9]+]][256];
