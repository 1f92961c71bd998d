//===- LinearCrossEntropy.cpp - an LM head's fused loss on the CPU --------===//
//
// pcc.linear_cross_entropy and its gradient (CpuKernels.h). The logits
// h w^T are computed a block of rows by a block of classes at a time
// (512 x 2048: 4 MiB of f32), and consumed at once:
//
// - forward: each row's running maximum and sum of exponentials (in
//   double, rescaled when the maximum grows, as an online softmax), and
//   the label's logit; lse = max + log(sum);
// - gradient: the block's logits again, dl = grad_lse exp(l - lse) +
//   grad_target [class == label] in place, then dh += dl w_block and
//   dw_block += dl^T h (two more products over the block; either is
//   skipped when its result is null: zb-h1's B and W copies).
//
// f32 operands go through oneDNN's sgemm. bf16 and fp16 operands go
// through oneDNN's 16-bit matmul (AMX or AVX512-BF16 where the CPU has
// them; HalfGemm.h) with f32 accumulation, as torch.autocast runs the
// unfused head: each logit is rounded to the 16-bit type before the
// statistics, dl is rounded before its two products, and dh and dw are
// accumulated in f32 over the blocks and rounded once at the end.
//
// Block sizes are fixed, not derived from the row count, so an f32 row's
// statistics have the same bits however the rows are split (data
// parallelism, micro-batches).
//
//===----------------------------------------------------------------------===//

#include "pcc/runtime/CpuKernels.h"

#include "CpuError.h"
#include "HalfGemm.h"

#include "pcc/runtime/FastMath.h"
#include "pcc/runtime/HalfFloat.h"

#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

using namespace pccrt;

namespace {

constexpr int64_t kBlockRows = 512;
constexpr int64_t kBlockClasses = 2048;

/// Row-major c = op(a) op(b) + beta c through oneDNN's sgemm.
bool gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float *a,
          int64_t lda, const float *b, int64_t ldb, float beta, float *c,
          int64_t ldc) {
  if (m == 0 || n == 0)
    return true;
  dnnl_status_t status = dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k,
                                    1.0f, a, lda, b, ldb, beta, c, ldc);
  if (status != dnnl_success) {
    cpuLastError = "oneDNN sgemm (" + std::to_string(m) + " x " +
                   std::to_string(n) + " x " + std::to_string(k) +
                   ") failed with status " + std::to_string(status);
    return false;
  }
  return true;
}

int64_t labelAt(const void *labels, int64_t r, int i64) {
  return i64 ? static_cast<const int64_t *>(labels)[r]
             : static_cast<const int32_t *>(labels)[r];
}

/// Row r's label counted from class `first`; -1 for an ignored row.
int64_t classIn(const pcc_lce_shape &s, const void *labels, int64_t r,
                int64_t first) {
  int64_t label = labelAt(labels, r, s.labels_are_i64);
  return label == s.ignore_index ? -1 : label - first;
}

bool checkLabels(const pcc_lce_shape &s, const void *labels) {
  for (int64_t r = 0; r < s.rows; ++r) {
    int64_t label = labelAt(labels, r, s.labels_are_i64);
    if (label != s.ignore_index && (label < 0 || label >= s.vocab_total)) {
      cpuLastError =
          "label " + std::to_string(label) + " (row " + std::to_string(r) +
          ") is outside [0, " + std::to_string(s.vocab_total) +
          ") and is not the ignored " + std::to_string(s.ignore_index);
      return false;
    }
  }
  return true;
}

bool checkShape(const pcc_lce_shape &s) {
  if (s.dtype != PCC_F32 && s.dtype != PCC_BF16 && s.dtype != PCC_F16) {
    cpuLastError = "the fused cross-entropy runs on f32, bf16 or fp16, not "
                   "element type code " +
                   std::to_string(s.dtype);
    return false;
  }
  return true;
}

bool isHalf(const pcc_lce_shape &s) { return s.dtype != PCC_F32; }

/// Row-major c = op(a) op(b) (+ c) on the shape's element type: sgemm on
/// f32, a 16-bit product accumulated in f32 otherwise. Offsets count
/// elements.
bool product(const pcc_lce_shape &s, bool ta, bool tb, int64_t m, int64_t n,
             int64_t k, const void *a, int64_t aOffset, int64_t lda,
             const void *b, int64_t bOffset, int64_t ldb, bool accumulate,
             float *c, int64_t ldc) {
  if (!isHalf(s))
    return gemm(ta, tb, m, n, k, static_cast<const float *>(a) + aOffset, lda,
                static_cast<const float *>(b) + bOffset, ldb,
                accumulate ? 1.0f : 0.0f, c, ldc);
  return halfGemm(s.dtype == PCC_F16, ta, tb, m, n, k,
                  static_cast<const uint16_t *>(a) + aOffset, lda,
                  static_cast<const uint16_t *>(b) + bOffset, ldb, accumulate,
                  c, ldc) == 0;
}

/// x rounded to the shape's 16-bit type and widened back.
inline float roundToType(int dtype, float x) {
  return dtype == PCC_BF16 ? bf16ToFloat(floatToBf16(x))
                           : halfToFloat(floatToHalf(x));
}

/// The logits of rows [r0, r0 + nr) and classes [c0, c0 + nc) into
/// `block` (nr x nc); on 16-bit operands, each rounded to their type.
bool logitsBlock(const pcc_lce_shape &s, const void *h, const void *w,
                 int64_t r0, int64_t nr, int64_t c0, int64_t nc, float *block) {
  bool ok = s.transpose_w
                ? product(s, false, true, nr, nc, s.dim, h, r0 * s.dim, s.dim,
                          w, c0 * s.dim, s.dim, false, block, nc)
                : product(s, false, false, nr, nc, s.dim, h, r0 * s.dim, s.dim,
                          w, c0, s.vocab, false, block, nc);
  if (ok && isHalf(s)) {
    int dtype = s.dtype;
#pragma omp parallel for if (nr * nc > 65536)
    for (int64_t i = 0; i < nr * nc; ++i)
      block[i] = roundToType(dtype, block[i]);
  }
  return ok;
}

/// n f32 values rounded into the shape's 16-bit type.
void narrow(const pcc_lce_shape &s, const float *x, uint16_t *y, int64_t n) {
  pcc_cpu_cast(x, PCC_F32, y, s.dtype, n);
}

float *scratch(size_t count) {
  thread_local std::vector<float> buffer;
  if (buffer.size() < count)
    buffer.resize(count);
  return buffer.data();
}

/// The largest of n floats.
float blockMax(const float *x, int64_t n) {
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t c = 0; c < n; ++c)
    m = x[c] > m ? x[c] : m;
  return m;
}

/// The sum of exp(x - shift) over n floats, in double (four lanes, a fixed
/// order).
double sumExp(const float *x, float shift, int64_t n) {
  double acc[4] = {0, 0, 0, 0};
  int64_t c = 0;
  for (; c + 4 <= n; c += 4)
    for (int j = 0; j < 4; ++j)
      acc[j] += static_cast<double>(fastExp(x[c + j] - shift));
  for (; c < n; ++c)
    acc[0] += static_cast<double>(fastExp(x[c] - shift));
  return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

} // namespace

extern "C" {

int pcc_cpu_linear_cross_entropy(const pcc_lce_shape *shape,
                                 int64_t vocab_start, const void *hv,
                                 const void *wv, const void *labels, float *lse,
                                 float *target) {
  const pcc_lce_shape &s = *shape;
  if (!checkShape(s) || !checkLabels(s, labels))
    return 1;
  int64_t blockRows = std::min(s.rows, kBlockRows);
  int64_t blockClasses = std::min(s.vocab, kBlockClasses);
  float *block = scratch(static_cast<size_t>(blockRows * blockClasses));
  std::vector<float> maxima(static_cast<size_t>(blockRows));
  std::vector<double> sums(static_cast<size_t>(blockRows));
  for (int64_t r0 = 0; r0 < s.rows; r0 += blockRows) {
    int64_t nr = std::min(blockRows, s.rows - r0);
    std::fill(maxima.begin(), maxima.end(),
              -std::numeric_limits<float>::infinity());
    std::fill(sums.begin(), sums.end(), 0.0);
    for (int64_t r = r0; r < r0 + nr; ++r)
      target[r] = 0.0f;
    for (int64_t c0 = 0; c0 < s.vocab; c0 += blockClasses) {
      int64_t nc = std::min(blockClasses, s.vocab - c0);
      if (!logitsBlock(s, hv, wv, r0, nr, c0, nc, block))
        return 1;
#pragma omp parallel for if (nr * nc > 65536)
      for (int64_t i = 0; i < nr; ++i) {
        const float *row = block + i * nc;
        float m = std::max(maxima[i], blockMax(row, nc));
        // Rescale the sum so far to the new maximum (exactly 1 when it
        // did not change; 0 for the first block's -inf).
        double scaled =
            sums[i] == 0.0
                ? 0.0
                : sums[i] * std::exp(static_cast<double>(maxima[i]) - m);
        sums[i] = scaled + sumExp(row, m, nc);
        maxima[i] = m;
        int64_t label = classIn(s, labels, r0 + i, vocab_start + c0);
        if (label >= 0 && label < nc)
          target[r0 + i] = row[label];
      }
    }
    for (int64_t i = 0; i < nr; ++i)
      lse[r0 + i] = static_cast<float>(static_cast<double>(maxima[i]) +
                                       std::log(sums[i]));
  }
  return 0;
}

int pcc_cpu_linear_cross_entropy_grad(const pcc_lce_shape *shape,
                                      int64_t vocab_start, const void *hv,
                                      const void *wv, const void *labels,
                                      const float *lse, const float *grad_lse,
                                      const float *grad_target, void *dhv,
                                      void *dwv) {
  const pcc_lce_shape &s = *shape;
  if (!checkShape(s) || !checkLabels(s, labels))
    return 1;
  bool half = isHalf(s);
  size_t elementBytes = half ? 2 : 4;
  if (s.vocab == 0 || s.rows == 0) {
    // Zero bits are 0.0 in every float type.
    if (dhv)
      std::memset(dhv, 0, static_cast<size_t>(s.rows * s.dim) * elementBytes);
    if (dwv)
      std::memset(dwv, 0, static_cast<size_t>(s.vocab * s.dim) * elementBytes);
    return 0;
  }
  int64_t blockRows = std::min(s.rows, kBlockRows);
  int64_t blockClasses = std::min(s.vocab, kBlockClasses);
  float *block = scratch(static_cast<size_t>(blockRows * blockClasses));
  // On 16-bit operands, dl rounded for its products, and dh and the block
  // of dw accumulated in f32 (rounded once, as a single 16-bit product
  // rounds its f32 sums). On f32 the products write dh and dw in place.
  std::vector<uint16_t> dl16(
      half ? static_cast<size_t>(blockRows * blockClasses) : 0);
  std::vector<float> dhSum(half && dhv ? static_cast<size_t>(s.rows * s.dim)
                                       : 0);
  std::vector<float> dwSum(
      half && dwv ? static_cast<size_t>(blockClasses * s.dim) : 0);
  float *dh = half ? dhSum.data() : static_cast<float *>(dhv);
  const void *dl = half ? static_cast<const void *>(dl16.data()) : block;
  for (int64_t c0 = 0; c0 < s.vocab; c0 += blockClasses) {
    int64_t nc = std::min(blockClasses, s.vocab - c0);
    // This block of dw: [nc, D] rows of a [V, D] weight; [D, nc] columns of
    // a [D, V] one (row stride V in place, nc in the f32 sum).
    float *dw =
        half ? dwSum.data()
             : static_cast<float *>(dwv) + (s.transpose_w ? c0 * s.dim : c0);
    int64_t ldw = s.transpose_w ? s.dim : (half ? nc : s.vocab);
    for (int64_t r0 = 0; r0 < s.rows; r0 += blockRows) {
      int64_t nr = std::min(blockRows, s.rows - r0);
      if (!logitsBlock(s, hv, wv, r0, nr, c0, nc, block))
        return 1;
#pragma omp parallel for if (nr * nc > 65536)
      for (int64_t i = 0; i < nr; ++i) {
        float *row = block + i * nc;
        float g = grad_lse[r0 + i], shift = lse[r0 + i];
        for (int64_t c = 0; c < nc; ++c)
          row[c] = g * fastExp(row[c] - shift);
        int64_t label = classIn(s, labels, r0 + i, vocab_start + c0);
        if (label >= 0 && label < nc)
          row[label] += grad_target[r0 + i];
      }
      if (half)
        narrow(s, block, dl16.data(), nr * nc);
      // dh (rows r0..) += dl w_block; the first block of classes writes.
      bool ok = true;
      if (dhv)
        ok = s.transpose_w
                 ? product(s, false, false, nr, s.dim, nc, dl, 0, nc, wv,
                           c0 * s.dim, s.dim, c0 != 0, dh + r0 * s.dim, s.dim)
                 : product(s, false, true, nr, s.dim, nc, dl, 0, nc, wv, c0,
                           s.vocab, c0 != 0, dh + r0 * s.dim, s.dim);
      // dw_block += dl^T h (rows r0..); the first block of rows writes.
      if (dwv && ok)
        ok = s.transpose_w
                 ? product(s, true, false, nc, s.dim, nr, dl, 0, nc, hv,
                           r0 * s.dim, s.dim, r0 != 0, dw, ldw)
                 : product(s, true, false, s.dim, nc, nr, hv, r0 * s.dim, s.dim,
                           dl, 0, nc, r0 != 0, dw, ldw);
      if (!ok)
        return 1;
    }
    if (half && dwv) {
      auto *out = static_cast<uint16_t *>(dwv);
      if (s.transpose_w)
        narrow(s, dw, out + c0 * s.dim, nc * s.dim);
      else
        for (int64_t d = 0; d < s.dim; ++d)
          narrow(s, dw + d * nc, out + d * s.vocab + c0, nc);
    }
  }
  if (half && dhv)
    narrow(s, dhSum.data(), static_cast<uint16_t *>(dhv), s.rows * s.dim);
  return 0;
}

} // extern "C"
