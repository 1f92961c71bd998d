//===- Attention.cpp - fused attention on the CPU -------------------------===//
//
// pcc.attention and pcc.attention_grad (CpuKernels.h). For each (batch,
// query head) and each strip of query rows, the products go to the GEMM
// libraries (pcc_cpu_matmul_*: oneDNN or OpenBLAS, threaded inside), and
// the scaling, mask, softmax and its gradient run here on the strip's
// rows, every key of them at once: the softmax is exact (no online
// rescaling) and memory is a strip, linear in the sequence. Under a causal
// mask a strip's product stops at its last row's last visible key.
//
// A strip's size depends only on the sequence length and the mask, and
// each (batch, head) is computed alone: a row's bits do not change with the
// batch or head count (data parallelism, micro-batches, heads over tp).
//
//===----------------------------------------------------------------------===//

#include "pcc/runtime/CpuKernels.h"

#include "CpuError.h"

#include "pcc/runtime/FastMath.h"
#include "pcc/runtime/HalfFloat.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

using namespace pccrt;

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

/// Query rows per strip: 64 under a causal mask (so that the strips'
/// products skip the masked upper blocks), else up to 256.
int64_t stripRows(const pcc_attention_shape &s) {
  return std::min<int64_t>(s.seq, s.causal ? 64 : 256);
}

/// The keys row `i` sees: [0, visible).
int64_t visibleKeys(const pcc_attention_shape &s, int64_t i) {
  if (!s.causal)
    return s.len;
  return std::clamp<int64_t>(i + s.len - s.seq + 1, 0, s.len);
}

/// A thread-local buffer of at least `count` elements of T, kept between
/// calls.
template <typename T> T *buffer(int slot, size_t count) {
  thread_local std::vector<T> buffers[4];
  std::vector<T> &b = buffers[slot];
  if (b.size() < count)
    b.resize(count);
  return b.data();
}

/// c (f32, m x n) = op(a) x op(b) on f32 or bf16 operands.
int productF32(int dtype, const void *a, const void *b, float *c, int64_t m,
               int64_t n, int64_t k, int ta, int tb) {
  if (dtype == 0) {
    pcc_cpu_matmul_f32(static_cast<const float *>(a),
                       static_cast<const float *>(b), c, 1, m, n, k, ta, tb, 0,
                       0);
    return 0;
  }
  return pcc_cpu_matmul_bf16_f32(a, b, c, 1, m, n, k, ta, tb, 0, 0);
}

/// c (in the operands' type) = op(a) x op(b).
int product(int dtype, const void *a, const void *b, void *c, int64_t m,
            int64_t n, int64_t k, int ta, int tb) {
  if (dtype == 0)
    return productF32(0, a, b, static_cast<float *>(c), m, n, k, ta, tb);
  return pcc_cpu_matmul_bf16(a, b, c, 1, m, n, k, ta, tb, 0, 0);
}

float load(int dtype, const void *p, int64_t i) {
  return dtype == 0 ? static_cast<const float *>(p)[i]
                    : bf16ToFloat(static_cast<const uint16_t *>(p)[i]);
}

void store(int dtype, void *p, int64_t i, float x) {
  if (dtype == 0)
    static_cast<float *>(p)[i] = x;
  else
    static_cast<uint16_t *>(p)[i] = floatToBf16(x);
}

/// The product operand of f32 values `x` (n of them): `x` itself in f32,
/// else rounded to bf16 into `narrow`.
const void *operand(int dtype, const float *x, uint16_t *narrow, int64_t n) {
  if (dtype == 0)
    return x;
  for (int64_t i = 0; i < n; ++i)
    narrow[i] = floatToBf16(x[i]);
  return narrow;
}

/// Element offsets of one (batch, query head).
struct Head {
  int64_t q, kv, lse, bias;
};

Head headOf(const pcc_attention_shape &s, int64_t b, int64_t h) {
  int64_t group = s.heads / s.kv_heads;
  int64_t qh = b * s.heads + h;
  return {qh * s.seq, (b * s.kv_heads + h / group) * s.len, qh * s.seq,
          b * s.bias_strides[0] + h * s.bias_strides[1]};
}

/// Row r of a strip at query i: the scaled, biased scores of its visible
/// keys, in place.
void scoreRow(const pcc_attention_shape &s, float *row, int64_t visible,
              const float *bias, int64_t biasRow) {
  float scale = static_cast<float>(s.scale);
  if (!bias) {
    for (int64_t c = 0; c < visible; ++c)
      row[c] *= scale;
    return;
  }
  const float *br = bias + biasRow;
  int64_t step = s.bias_strides[3];
  for (int64_t c = 0; c < visible; ++c)
    row[c] = row[c] * scale + br[c * step];
}

constexpr int64_t kParallelRows = 1 << 14;

} // namespace

extern "C" {

int pcc_cpu_attention(const pcc_attention_shape *shape, const void *q,
                      const void *k, const void *v, const float *bias,
                      void *out, float *lse) {
  const pcc_attention_shape &s = *shape;
  int dtype = s.dtype;
  int64_t es = dtype == 0 ? 4 : 2;
  const char *qb = static_cast<const char *>(q),
             *kb = static_cast<const char *>(k),
             *vb = static_cast<const char *>(v);
  char *ob = static_cast<char *>(out);
  int64_t rows = stripRows(s);
  float *scores = buffer<float>(0, rows * s.len);
  uint16_t *narrow = buffer<uint16_t>(1, rows * s.len);
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads; ++h) {
      Head hd = headOf(s, b, h);
      for (int64_t i0 = 0; i0 < s.seq; i0 += rows) {
        int64_t n = std::min(rows, s.seq - i0);
        int64_t keys = visibleKeys(s, i0 + n - 1);
        char *o = ob + (hd.q + i0) * s.v_dim * es;
        if (keys == 0) {
          // Every row of the strip is masked: zeros.
          std::memset(o, 0, n * s.v_dim * es);
          for (int64_t r = 0; r < n; ++r)
            lse[hd.lse + i0 + r] = kNegInf;
          continue;
        }
        if (productF32(dtype, qb + (hd.q + i0) * s.head_dim * es,
                       kb + hd.kv * s.head_dim * es, scores, n, keys,
                       s.head_dim, 0, 1))
          return -1;
#pragma omp parallel for if (n * keys > kParallelRows)
        for (int64_t r = 0; r < n; ++r) {
          int64_t i = i0 + r, visible = visibleKeys(s, i);
          float *row = scores + r * keys;
          scoreRow(s, row, visible, bias, hd.bias + i * s.bias_strides[2]);
          float maxValue = kNegInf;
          for (int64_t c = 0; c < visible; ++c)
            maxValue = std::max(maxValue, row[c]);
          if (maxValue == kNegInf) {
            std::fill(row, row + keys, 0.0f);
            lse[hd.lse + i] = kNegInf;
            continue;
          }
          double sum = 0;
          for (int64_t c = 0; c < visible; ++c) {
            row[c] = fastExp(row[c] - maxValue);
            sum += row[c];
          }
          float inv = static_cast<float>(1.0 / sum);
          for (int64_t c = 0; c < visible; ++c)
            row[c] *= inv;
          std::fill(row + visible, row + keys, 0.0f);
          lse[hd.lse + i] = maxValue + static_cast<float>(std::log(sum));
        }
        const void *p = operand(dtype, scores, narrow, n * keys);
        if (product(dtype, p, vb + hd.kv * s.v_dim * es, o, n, s.v_dim, keys,
                    0, 0))
          return -1;
      }
    }
  return 0;
}

int pcc_cpu_attention_grad(const pcc_attention_shape *shape, const void *q,
                           const void *k, const void *v, const void *out,
                           const float *lse, const void *grad,
                           const float *bias, void *dq, void *dk, void *dv) {
  const pcc_attention_shape &s = *shape;
  int dtype = s.dtype;
  int64_t es = dtype == 0 ? 4 : 2;
  const char *qb = static_cast<const char *>(q),
             *kb = static_cast<const char *>(k),
             *vb = static_cast<const char *>(v),
             *gb = static_cast<const char *>(grad);
  int64_t rows = stripRows(s), group = s.heads / s.kv_heads;
  int64_t d = s.head_dim, dvd = s.v_dim;
  float *p = buffer<float>(0, rows * s.len);
  float *dp = buffer<float>(1, rows * s.len);
  uint16_t *narrow = buffer<uint16_t>(2, rows * s.len);
  // The key head's f32 sums, and one strip's term.
  float *acc = buffer<float>(3, s.len * (d + dvd) + s.len * std::max(d, dvd) +
                                    rows);
  float *dkAcc = acc, *dvAcc = acc + s.len * d,
        *term = acc + s.len * (d + dvd),
        *rowDot = term + s.len * std::max(d, dvd);
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t kh = 0; kh < s.kv_heads; ++kh) {
      std::fill(dkAcc, dkAcc + s.len * (d + dvd), 0.0f);
      for (int64_t j = 0; j < group; ++j) {
        Head hd = headOf(s, b, kh * group + j);
        for (int64_t i0 = 0; i0 < s.seq; i0 += rows) {
          int64_t n = std::min(rows, s.seq - i0);
          int64_t keys = visibleKeys(s, i0 + n - 1);
          char *dqStrip = static_cast<char *>(dq) + (hd.q + i0) * d * es;
          if (keys == 0) {
            std::memset(dqStrip, 0, n * d * es);
            continue;
          }
          const char *qStrip = qb + (hd.q + i0) * d * es;
          const char *gStrip = gb + (hd.q + i0) * dvd * es;
          const char *kHead = kb + hd.kv * d * es, *vHead = vb + hd.kv * dvd * es;
          // p = exp(scale q k^T + bias - lse); dp = grad v^T.
          if (productF32(dtype, qStrip, kHead, p, n, keys, d, 0, 1) ||
              productF32(dtype, gStrip, vHead, dp, n, keys, dvd, 0, 1))
            return -1;
#pragma omp parallel for if (n * keys > kParallelRows)
          for (int64_t r = 0; r < n; ++r) {
            int64_t i = i0 + r, visible = visibleKeys(s, i);
            float *row = p + r * keys;
            float rowLse = lse[hd.lse + i];
            // rowsum(grad * out) in double, as the unfused softmax's
            // gradient sums.
            double dot = 0;
            for (int64_t c = 0; c < dvd; ++c)
              dot += static_cast<double>(load(dtype, grad, (hd.q + i) * dvd + c)) *
                     load(dtype, out, (hd.q + i) * dvd + c);
            rowDot[r] = static_cast<float>(dot);
            if (rowLse == kNegInf) {
              std::fill(row, row + keys, 0.0f);
              continue;
            }
            scoreRow(s, row, visible, bias, hd.bias + i * s.bias_strides[2]);
            for (int64_t c = 0; c < visible; ++c)
              row[c] = fastExp(row[c] - rowLse);
            std::fill(row + visible, row + keys, 0.0f);
          }
          // dv += p^T grad.
          const void *pOp = operand(dtype, p, narrow, n * keys);
          if (productF32(dtype, pOp, gStrip, term, keys, dvd, n, 1, 0))
            return -1;
          for (int64_t e = 0; e < keys * dvd; ++e)
            dvAcc[e] += term[e];
          // ds = p (dp - rowDot) scale, into dp.
          float scale = static_cast<float>(s.scale);
#pragma omp parallel for if (n * keys > kParallelRows)
          for (int64_t r = 0; r < n; ++r) {
            float *dsRow = dp + r * keys;
            const float *pRow = p + r * keys;
            for (int64_t c = 0; c < keys; ++c)
              dsRow[c] = pRow[c] * (dsRow[c] - rowDot[r]) * scale;
          }
          const void *dsOp = operand(dtype, dp, narrow, n * keys);
          // dq = ds k (every key of these rows: written once); dk += ds^T q.
          if (product(dtype, dsOp, kHead, dqStrip, n, d, keys, 0, 0) ||
              productF32(dtype, dsOp, qStrip, term, keys, d, n, 1, 0))
            return -1;
          for (int64_t e = 0; e < keys * d; ++e)
            dkAcc[e] += term[e];
        }
      }
      Head hd = headOf(s, b, kh * group);
      for (int64_t e = 0; e < s.len * d; ++e)
        store(dtype, dk, hd.kv * d + e, dkAcc[e]);
      for (int64_t e = 0; e < s.len * dvd; ++e)
        store(dtype, dv, hd.kv * dvd + e, dvAcc[e]);
    }
  return 0;
}

} // extern "C"
