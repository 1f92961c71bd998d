//===- HalfGemm.h - strided 16-bit products into f32 ------------*- C++ -*-===//
//
// For kernels that multiply blocks of larger 16-bit matrices (the fused LM
// head): row-major c = op(a) op(b) (+ c), a and b bf16 or fp16 with row
// strides, c f32, through oneDNN (Bf16Gemm.cpp).
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

} // namespace pccrt

#endif // PCC_RUNTIME_LIB_HALFGEMM_H
