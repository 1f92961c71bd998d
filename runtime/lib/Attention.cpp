//===- Attention.cpp - fused attention on the CPU -------------------------===//
//
// pcc.attention and pcc.attention_grad (CpuKernels.h). Every product is
// one batched oneDNN matmul over many heads (AMX or AVX-512 brgemm
// kernels, threaded inside), K and V read in place and broadcast over a key
// head's query heads (no repeated K/V); the scaling, mask, softmax and its
// gradient run here on the rows of every head at once, in parallel, every
// key of a row at once: the softmax is exact (no online rescaling).
//
// Short sequences take all the rows of a chunk of key heads at once;
// longer ones a query head and a strip of rows at a time, so memory stays
// linear in the sequence (Plan). The plan depends only on the sequence
// lengths and the mask, and each (batch, head) is its own entry of the
// batched products: a row's bits do not change with the batch or head
// count (data parallelism, micro-batches, heads over tp). The backward
// sums dK and dV in f32: over a key head's query heads and a strip's rows
// in one product, then over strips in order.
//
//===----------------------------------------------------------------------===//

#include "pcc/runtime/CpuKernels.h"

#include "CpuError.h"
#include "HalfGemm.h"
#include "RowKernels.h"

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

/// Scratch per chunk of key heads: the f32 scores and their gradients
/// (and their bf16 copies), and the backward's f32 sums of dK and dV.
constexpr int64_t kScratchBytes = int64_t(32) << 20;

/// Bytes of scratch per score: p and dp in f32 and in bf16.
constexpr int64_t kScoreBytes = 12;

/// The keys row `i` sees: [0, visible).
int64_t visibleKeys(const pcc_attention_shape &s, int64_t i) {
  if (!s.causal)
    return s.len;
  return std::clamp<int64_t>(i + s.len - s.seq + 1, 0, s.len);
}

/// A thread-local buffer of at least `count` elements of T, kept between
/// calls.
template <typename T> T *buffer(int slot, size_t count) {
  thread_local std::vector<T> buffers[5];
  std::vector<T> &b = buffers[slot];
  if (b.size() < count)
    b.resize(count);
  return b.data();
}

float load(int dtype, const void *p, int64_t i) {
  return dtype == 0 ? static_cast<const float *>(p)[i]
                    : bf16ToFloat(static_cast<const uint16_t *>(p)[i]);
}

/// The product operand of n f32 values `x`: `x` itself in f32, else
/// rounded to bf16 into `narrow`.
const void *operand(int dtype, const float *x, uint16_t *narrow, int64_t n) {
  if (dtype == 0)
    return x;
#pragma omp parallel for if (n > 65536)
  for (int64_t i = 0; i < n; ++i)
    narrow[i] = floatToBf16(x[i]);
  return narrow;
}

/// How the products go. Key heads (b, kv) are flattened into `bk`; query
/// head (b, kv * group + g) is then entry (bk, g), with uniform strides.
/// Short sequences (a head's S x L scores within the scratch; at most 512 x
/// 512 under a causal mask, whose upper half is then computed and
/// discarded) take every row as one strip and every query head of a chunk
/// of key heads in one product: each operand is a dense view of its
/// tensor. Longer ones go a query head and a strip of rows at a time (64
/// under a causal mask, so that a strip stops at its last visible key,
/// else 256): products large enough that calling each costs nothing.
/// The choice depends only on the sequence lengths and the mask.
struct Plan {
  int64_t keyHeads, group;
  bool whole;
  int64_t rows;  // query rows per strip
  int64_t heads; // query heads per entry: group (whole) or 1
  int64_t chunk; // key heads per product: 1 unless whole
  int dtype, type;
  int64_t es;

  Plan(const pcc_attention_shape &s, int64_t perKeyHead) {
    keyHeads = s.batch * s.kv_heads;
    group = s.heads / std::max<int64_t>(s.kv_heads, 1);
    whole = s.causal ? s.seq * s.len <= 512 * 512
                     : s.seq * s.len * kScoreBytes <= kScratchBytes;
    rows = whole ? s.seq : std::min<int64_t>(s.seq, s.causal ? 64 : 256);
    heads = whole ? group : 1;
    int64_t bytes = group * s.seq * s.len * kScoreBytes + perKeyHead;
    chunk = whole ? std::clamp<int64_t>(kScratchBytes / std::max<int64_t>(
                                                            bytes, 1),
                                        1, std::max<int64_t>(keyHeads, 1))
                  : 1;
    dtype = s.dtype;
    type = s.dtype == 0 ? PCC_F32 : PCC_BF16;
    es = s.dtype == 0 ? 4 : 2;
  }

  /// The keys the rows of a strip at i0 of n rows see: [0, keys).
  int64_t keysOf(const pcc_attention_shape &s, int64_t i0, int64_t n) const {
    return whole ? s.len : visibleKeys(s, i0 + n - 1);
  }

  /// q-shaped [B, Hq, S, dim] data as [cn, heads, n, dim] from key head bk0,
  /// query head g0 of its group, row i0.
  MatrixView queries(const pcc_attention_shape &s, const void *base,
                     int64_t bk0, int64_t g0, int64_t i0, int64_t dim) const {
    return {static_cast<const char *>(base) +
                ((bk0 * group + g0) * s.seq + i0) * dim * es,
            {group * s.seq * dim, s.seq * dim, dim, 1}};
  }
  /// The same rows as one [heads n, dim] matrix per key head (contiguous:
  /// one query head, or every row of every head of the group).
  MatrixView queryRows(const pcc_attention_shape &s, const void *base,
                       int64_t bk0, int64_t g0, int64_t i0,
                       int64_t dim) const {
    return {queries(s, base, bk0, g0, i0, dim).data,
            {group * s.seq * dim, 0, dim, 1}};
  }
  /// k-shaped [B, Hkv, L, dim] data from key head bk0 as [keys, dim] (or,
  /// `transposed`, [dim, keys]) per entry, broadcast over the group.
  MatrixView keys(const pcc_attention_shape &s, const void *base, int64_t bk0,
                  int64_t dim, bool transposed) const {
    const void *data = static_cast<const char *>(base) + bk0 * s.len * dim * es;
    if (transposed)
      return {data, {s.len * dim, 0, 1, dim}};
    return {data, {s.len * dim, 0, dim, 1}};
  }
};

/// A dense [cn, heads, n, keys] block.
MatrixView dense(const void *data, int64_t heads, int64_t n, int64_t keys) {
  return {data, {heads * n * keys, n * keys, keys, 1}};
}

/// Entry e of a strip (key head bk0 + e / (heads n), query head g0 +
/// (e / n) % heads, row i0 + e % n): its q/out/lse head and bias offset.
struct Row {
  int64_t head; // b * Hq + h
  int64_t bias;
  int64_t i;
};

Row rowOf(const pcc_attention_shape &s, const Plan &plan, int64_t bk0,
          int64_t g0, int64_t i0, int64_t n, int64_t e) {
  int64_t bk = bk0 + e / (n * plan.heads);
  int64_t g = g0 + (e / n) % plan.heads, i = i0 + e % n;
  int64_t b = bk / s.kv_heads, h = (bk % s.kv_heads) * plan.group + g;
  return {bk * plan.group + g,
          b * s.bias_strides[0] + h * s.bias_strides[1] +
              i * s.bias_strides[2],
          i};
}

/// The rows of a strip that sees no key: zeros in `rows` (q-shaped, `dim`
/// wide) and, given `lse`, -inf there.
void zeroStrip(const pcc_attention_shape &s, const Plan &plan, int64_t bk0,
               int64_t g0, int64_t i0, int64_t n, void *rows, int64_t dim,
               float *lse) {
  int64_t entries = std::min(plan.chunk, plan.keyHeads - bk0) * plan.heads * n;
  for (int64_t e = 0; e < entries; ++e) {
    Row at = rowOf(s, plan, bk0, g0, i0, n, e);
    std::memset(static_cast<char *>(rows) +
                    (at.head * s.seq + at.i) * dim * plan.es,
                0, dim * plan.es);
    if (lse)
      lse[at.head * s.seq + at.i] = kNegInf;
  }
}

/// Row r of a strip at query i: the scaled, biased scores of its visible
/// keys, in place.
/// row[c] = exp(row[c] - shift) for c < n (rowExp without the sum).
PCC_ROW_KERNEL void expRow(float *row, float shift, int64_t n) {
  for (int64_t c = 0; c < n; ++c)
    row[c] = fastExp(row[c] - shift);
}

/// The softmax gradient of a row: ds = p (dp - rowDot) scale, into dp.
PCC_ROW_KERNEL void softmaxGradRow(const float *p, float *dp, float rowDot,
                                   float scale, int64_t n) {
  for (int64_t c = 0; c < n; ++c)
    dp[c] = p[c] * (dp[c] - rowDot) * scale;
}

PCC_ROW_KERNEL void scoreRow(const pcc_attention_shape &s, float *row,
                             int64_t visible, const float *bias,
                             int64_t biasRow) {
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

} // namespace

extern "C" {

int pcc_cpu_attention(const pcc_attention_shape *shape, const void *q,
                      const void *k, const void *v, const float *bias,
                      void *out, float *lse) {
  const pcc_attention_shape &s = *shape;
  Plan plan(s, 0);
  int dtype = plan.dtype, type = plan.type;
  int64_t block = plan.chunk * plan.heads * plan.rows * s.len;
  float *scores = buffer<float>(0, block);
  uint16_t *narrow = buffer<uint16_t>(1, block);
  for (int64_t bk0 = 0; bk0 < plan.keyHeads; bk0 += plan.chunk) {
    int64_t cn = std::min(plan.chunk, plan.keyHeads - bk0);
    for (int64_t g0 = 0; g0 < plan.group; g0 += plan.heads)
      for (int64_t i0 = 0; i0 < s.seq; i0 += plan.rows) {
        int64_t n = std::min(plan.rows, s.seq - i0);
        int64_t keys = plan.keysOf(s, i0, n), entries = cn * plan.heads * n;
        if (keys == 0) {
          // Every row of the strip is masked: zeros.
          zeroStrip(s, plan, bk0, g0, i0, n, out, s.v_dim, lse);
          continue;
        }
        if (batchedProduct(type, PCC_F32, cn, plan.heads, true, n, keys,
                           s.head_dim,
                           plan.queries(s, q, bk0, g0, i0, s.head_dim),
                           plan.keys(s, k, bk0, s.head_dim, true),
                           dense(scores, plan.heads, n, keys), false))
          return -1;
#pragma omp parallel for if (entries * keys > 16384)
        for (int64_t e = 0; e < entries; ++e) {
          Row at = rowOf(s, plan, bk0, g0, i0, n, e);
          int64_t visible = visibleKeys(s, at.i);
          float *row = scores + e * keys;
          scoreRow(s, row, visible, bias, at.bias);
          float maxValue = rowMax(row, visible);
          if (maxValue == kNegInf) {
            std::fill(row, row + keys, 0.0f);
            lse[at.head * s.seq + at.i] = kNegInf;
            continue;
          }
          double sum = rowExp(row, maxValue, row, visible);
          rowScale(row, static_cast<float>(1.0 / sum), visible);
          std::fill(row + visible, row + keys, 0.0f);
          lse[at.head * s.seq + at.i] =
              maxValue + static_cast<float>(std::log(sum));
        }
        const void *p = operand(dtype, scores, narrow, entries * keys);
        if (batchedProduct(type, type, cn, plan.heads, true, n, s.v_dim, keys,
                           dense(p, plan.heads, n, keys),
                           plan.keys(s, v, bk0, s.v_dim, false),
                           plan.queries(s, out, bk0, g0, i0, s.v_dim), false))
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
  int64_t d = s.head_dim, dvd = s.v_dim;
  Plan plan(s, s.len * (d + dvd) * 4);
  int dtype = plan.dtype, type = plan.type;
  int64_t es = plan.es;
  int64_t block = plan.chunk * plan.heads * plan.rows * s.len;
  float *p = buffer<float>(0, block);
  float *dp = buffer<float>(1, block);
  uint16_t *narrowP = buffer<uint16_t>(2, block);
  uint16_t *narrowDs = buffer<uint16_t>(3, block);
  // The chunk's f32 sums of dK and dV over its query heads and strips.
  float *dkAcc = buffer<float>(4, plan.chunk * s.len * (d + dvd));
  float *dvAcc = dkAcc + plan.chunk * s.len * d;
  float scale = static_cast<float>(s.scale);
  for (int64_t bk0 = 0; bk0 < plan.keyHeads; bk0 += plan.chunk) {
    int64_t cn = std::min(plan.chunk, plan.keyHeads - bk0);
    std::fill(dkAcc, dkAcc + cn * s.len * (d + dvd), 0.0f);
    for (int64_t g0 = 0; g0 < plan.group; g0 += plan.heads)
      for (int64_t i0 = 0; i0 < s.seq; i0 += plan.rows) {
        int64_t n = std::min(plan.rows, s.seq - i0);
        int64_t keys = plan.keysOf(s, i0, n), entries = cn * plan.heads * n;
        if (keys == 0) {
          zeroStrip(s, plan, bk0, g0, i0, n, dq, d, nullptr);
          continue;
        }
        // p = q k^T, dp = grad v^T.
        if (batchedProduct(type, PCC_F32, cn, plan.heads, true, n, keys, d,
                           plan.queries(s, q, bk0, g0, i0, d),
                           plan.keys(s, k, bk0, d, true),
                           dense(p, plan.heads, n, keys), false) ||
            batchedProduct(type, PCC_F32, cn, plan.heads, true, n, keys, dvd,
                           plan.queries(s, grad, bk0, g0, i0, dvd),
                           plan.keys(s, v, bk0, dvd, true),
                           dense(dp, plan.heads, n, keys), false))
          return -1;
#pragma omp parallel for if (entries * keys > 16384)
        for (int64_t e = 0; e < entries; ++e) {
          Row at = rowOf(s, plan, bk0, g0, i0, n, e);
          int64_t visible = visibleKeys(s, at.i);
          int64_t qRow = at.head * s.seq + at.i;
          float *row = p + e * keys, *dsRow = dp + e * keys;
          float rowLse = lse[qRow];
          if (rowLse == kNegInf) {
            std::fill(row, row + keys, 0.0f);
            std::fill(dsRow, dsRow + keys, 0.0f);
            continue;
          }
          // rowsum(grad * out) in double, as the unfused softmax's
          // gradient sums.
          double dot = 0;
          for (int64_t c = 0; c < dvd; ++c)
            dot += static_cast<double>(load(dtype, grad, qRow * dvd + c)) *
                   load(dtype, out, qRow * dvd + c);
          float rd = static_cast<float>(dot);
          scoreRow(s, row, visible, bias, at.bias);
          expRow(row, rowLse, visible);
          std::fill(row + visible, row + keys, 0.0f);
          softmaxGradRow(row, dsRow, rd, scale, keys);
        }
        const void *pOp = operand(dtype, p, narrowP, entries * keys);
        const void *dsOp = operand(dtype, dp, narrowDs, entries * keys);
        // Per key head, the rows of the strip (of all its query heads when
        // whole) are one contraction: [keys, heads n] x [heads n, dim].
        int64_t hn = plan.heads * n;
        MatrixView pT{pOp, {hn * keys, 0, 1, keys}},
            dsT{dsOp, {hn * keys, 0, 1, keys}},
            dvSum{dvAcc, {s.len * dvd, 0, dvd, 1}},
            dkSum{dkAcc, {s.len * d, 0, d, 1}};
        // dv += p^T grad; dk += ds^T q; dq = ds k (each row written once).
        if (batchedProduct(type, PCC_F32, cn, 1, false, keys, dvd, hn, pT,
                           plan.queryRows(s, grad, bk0, g0, i0, dvd), dvSum,
                           true) ||
            batchedProduct(type, PCC_F32, cn, 1, false, keys, d, hn, dsT,
                           plan.queryRows(s, q, bk0, g0, i0, d), dkSum,
                           true) ||
            batchedProduct(type, type, cn, plan.heads, true, n, d, keys,
                           dense(dsOp, plan.heads, n, keys),
                           plan.keys(s, k, bk0, d, false),
                           plan.queries(s, dq, bk0, g0, i0, d), false))
          return -1;
      }
    int64_t kElems = cn * s.len * d, vElems = cn * s.len * dvd;
    char *dkOut = static_cast<char *>(dk) + bk0 * s.len * d * es;
    char *dvOut = static_cast<char *>(dv) + bk0 * s.len * dvd * es;
    if (dtype == 0) {
      std::memcpy(dkOut, dkAcc, kElems * 4);
      std::memcpy(dvOut, dvAcc, vElems * 4);
    } else {
      pcc_cpu_cast(dkAcc, PCC_F32, dkOut, PCC_BF16, kElems);
      pcc_cpu_cast(dvAcc, PCC_F32, dvOut, PCC_BF16, vElems);
    }
  }
  return 0;
}

} // extern "C"
