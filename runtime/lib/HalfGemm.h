//===- HalfGemm.h - strided 16-bit products into f32 ------------*- C++ -*-===//
//
// For kernels that multiply blocks of larger matrices (the fused LM head,
// fused attention): row-major c = op(a) op(b) (+ c) on strided views,
// through oneDNN's matmul (Bf16Gemm.cpp).
//
//===----------------------------------------------------------------------===//

#ifndef PCC_RUNTIME_LIB_HALFGEMM_H
#define PCC_RUNTIME_LIB_HALFGEMM_H

#include <cstdint>

namespace pccrt {

/// c [m, n] (row stride ldc) = op(a) [m, k] op(b) [k, n], plus c when
/// `accumulate`. op(a) is a (row stride lda) or, with `ta`, the transpose
/// of a stored [k, m]; likewise b. `f16` picks fp16 operands, else bf16.
/// Accumulates in f32. Returns 0, or 1 with cpuLastError set.
int halfGemm(bool f16, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
             const void *a, int64_t lda, const void *b, int64_t ldb,
             bool accumulate, float *c, int64_t ldc);

/// Whether oneDNN has matmul kernels on fp16 (`f16`) or bf16 for this CPU;
/// where it has not, 16-bit products widen their operands to fp32.
bool nativeHalfProducts(bool f16);

/// A 4-D operand of a batched product: its data and its element strides
/// over [batch, group, rows, columns] (0 where it broadcasts).
struct MatrixView {
  const void *data;
  int64_t strides[4];
};

/// c[i, g] = a[i, g] b[i, g] (+ c[i, g]) for i < batch, g < group, through
/// one oneDNN matmul: a is [m, k], b [k, n] and c [m, n] per entry, each
/// laid out by its view's strides (b's group stride 0 with `broadcastB`:
/// one b for every g). `type` is the pcc_dtype of a and b (PCC_F32 or
/// PCC_BF16), `outType` of c; sums in f32. The primitive of each
/// shape and layout is made once and kept. Returns 0, or 1 with
/// cpuLastError set.
int batchedProduct(int type, int outType, int64_t batch, int64_t group,
                   bool broadcastB, int64_t m, int64_t n, int64_t k,
                   const MatrixView &a, const MatrixView &b, const MatrixView &c,
                   bool accumulate);

} // namespace pccrt

#endif // PCC_RUNTIME_LIB_HALFGEMM_H
