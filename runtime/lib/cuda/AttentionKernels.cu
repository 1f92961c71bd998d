//===- AttentionKernels.cu - fused attention on the GPU -------------------===//
//
// pcc_cuda_attention and its gradient (CudaKernels.h): the CPU kernels'
// scheme (runtime/lib/Attention.cpp) with every (batch, key head) of a strip
// of query rows in one strided batched cuBLAS product, and the softmax and
// its gradient one block per row. Query head h = kh * group + j; the group's
// heads run one after another, so the products never repeat K or V. The
// strips live in the context's scratch; a key head's gradient sums in f32
// over its query heads and strips (cuBLAS's beta = 1) and is rounded once.
//
//===----------------------------------------------------------------------===//

#include "CudaCommon.cuh"

#include "pcc/runtime/HalfFloat.h"

#include <cmath>

using namespace pcc_cuda;

namespace {

/// Query rows per strip: the masked blocks above the diagonal are skipped a
/// strip at a time.
int64_t stripRows(const pcc_attention_shape &s) {
  return std::min<int64_t>(s.seq, 256);
}

__host__ __device__ int64_t visibleKeys(const pcc_attention_shape &s,
                                        int64_t i) {
  if (!s.causal)
    return s.len;
  int64_t v = i + s.len - s.seq + 1;
  return v < 0 ? 0 : (v > s.len ? s.len : v);
}

__device__ float loadAs(int dtype, const void *p, int64_t i) {
  return dtype == 0 ? static_cast<const float *>(p)[i]
                    : pccrt::bf16ToFloat(static_cast<const uint16_t *>(p)[i]);
}

/// One strip's rows: which (batch, key head) entry, query head and row.
struct StripRow {
  int64_t e, h, i, qRow;
};

__device__ StripRow stripRow(const pcc_attention_shape &s, int64_t t,
                             int64_t n, int64_t i0, int64_t j) {
  int64_t group = s.heads / s.kv_heads;
  StripRow r;
  r.e = t / n;
  r.i = i0 + t % n;
  int64_t b = r.e / s.kv_heads;
  r.h = (r.e % s.kv_heads) * group + j;
  r.qRow = (b * s.heads + r.h) * s.seq + r.i;
  return r;
}

__device__ float biasAt(const pcc_attention_shape &s, const float *bias,
                        const StripRow &r, int64_t c) {
  if (!bias)
    return 0.0f;
  int64_t b = r.e / s.kv_heads;
  return bias[b * s.bias_strides[0] + r.h * s.bias_strides[1] +
              r.i * s.bias_strides[2] + c * s.bias_strides[3]];
}

/// The forward softmax of a strip, one block per row: `p` holds the raw
/// products q k^T ([rows, keys]) and gets the probabilities (0 beyond the
/// visible keys), or, when dtype is bf16, `narrow` gets them rounded.
__global__ void softmaxStripKernel(pcc_attention_shape s, const float *bias,
                                   float *p, uint16_t *narrow, float *lse,
                                   int64_t rows, int64_t n, int64_t keys,
                                   int64_t i0, int64_t j) {
  __shared__ float sharedF[32];
  __shared__ double sharedD[32];
  for (int64_t t = blockIdx.x; t < rows; t += gridDim.x) {
    StripRow r = stripRow(s, t, n, i0, j);
    int64_t visible = visibleKeys(s, r.i);
    float *row = p + t * keys;
    float scale = static_cast<float>(s.scale);
    float m = -INFINITY;
    for (int64_t c = threadIdx.x; c < visible; c += blockDim.x) {
      float x = row[c] * scale + biasAt(s, bias, r, c);
      row[c] = x;
      m = maxOf(m, x);
    }
    m = blockReduce(m, MaxOp{}, sharedF);
    double sum = 0;
    if (m != -INFINITY)
      for (int64_t c = threadIdx.x; c < visible; c += blockDim.x)
        sum += static_cast<double>(expf(row[c] - m));
    sum = blockReduce(sum, SumOp{}, sharedD);
    bool empty = m == -INFINITY;
    float inv = empty ? 0.0f : static_cast<float>(1.0 / sum);
    for (int64_t c = threadIdx.x; c < keys; c += blockDim.x) {
      float y = c < visible && !empty ? expf(row[c] - m) * inv : 0.0f;
      // In bf16 only the rounded copy feeds the product.
      if (narrow)
        narrow[t * keys + c] = pccrt::floatToBf16(y);
      else
        row[c] = y;
    }
    if (threadIdx.x == 0)
      lse[r.qRow] = empty ? -INFINITY : m + static_cast<float>(log(sum));
  }
}

/// The gradient's row work, one block per row: `p` holds q k^T and gets
/// p = exp(scale q k^T + bias - lse); `dp` holds grad v^T and gets
/// ds = p (dp - rowsum(grad out)) scale; in bf16 both go rounded to
/// `narrowP` and `narrowDs` instead.
__global__ void gradStripKernel(pcc_attention_shape s, const float *bias,
                                const float *lse, const void *grad,
                                const void *out, float *p, float *dp,
                                uint16_t *narrowP, uint16_t *narrowDs,
                                int64_t rows, int64_t n, int64_t keys,
                                int64_t i0, int64_t j) {
  __shared__ double sharedD[32];
  for (int64_t t = blockIdx.x; t < rows; t += gridDim.x) {
    StripRow r = stripRow(s, t, n, i0, j);
    int64_t visible = visibleKeys(s, r.i);
    double dot = 0;
    for (int64_t c = threadIdx.x; c < s.v_dim; c += blockDim.x)
      dot += static_cast<double>(loadAs(s.dtype, grad, r.qRow * s.v_dim + c)) *
             loadAs(s.dtype, out, r.qRow * s.v_dim + c);
    float rowDot = static_cast<float>(blockReduce(dot, SumOp{}, sharedD));
    float rowLse = lse[r.qRow];
    float scale = static_cast<float>(s.scale);
    for (int64_t c = threadIdx.x; c < keys; c += blockDim.x) {
      int64_t at = t * keys + c;
      float pv = 0.0f;
      if (c < visible && rowLse != -INFINITY)
        pv = expf(p[at] * scale + biasAt(s, bias, r, c) - rowLse);
      float ds = pv * (dp[at] - rowDot) * scale;
      if (narrowP) {
        narrowP[at] = pccrt::floatToBf16(pv);
        narrowDs[at] = pccrt::floatToBf16(ds);
      } else {
        p[at] = pv;
        dp[at] = ds;
      }
    }
  }
}

__global__ void roundKernel(const float *x, uint16_t *y, int64_t n) {
  for (int64_t i = threadIndex(); i < n; i += threadCount())
    y[i] = pccrt::floatToBf16(x[i]);
}

__global__ void fillKernel(float *y, float value, int64_t n) {
  for (int64_t i = threadIndex(); i < n; i += threadCount())
    y[i] = value;
}

bool zeroBytes(pcc_cuda_context *ctx, const char *what, void *p,
               int64_t bytes) {
  if (bytes <= 0)
    return true;
  if (cudaError_t err = cudaMemsetAsync(p, 0, bytes, ctx->stream)) {
    setPending(ctx, std::string(what) + ": cudaMemsetAsync", err);
    return false;
  }
  return true;
}

/// Element pointers by element offset.
const void *at(const void *p, int64_t offset, int64_t es) {
  return static_cast<const char *>(p) + offset * es;
}
void *at(void *p, int64_t offset, int64_t es) {
  return static_cast<char *>(p) + offset * es;
}

} // namespace

extern "C" void pcc_cuda_attention(pcc_cuda_context *ctx,
                                   const pcc_attention_shape *shape,
                                   const void *q, const void *k, const void *v,
                                   const float *bias, void *out, float *lse) {
  const char *what = "pcc_cuda_attention";
  const pcc_attention_shape s = *shape;
  int64_t es = s.dtype == 0 ? 4 : 2;
  cudaDataType type = s.dtype == 0 ? CUDA_R_32F : CUDA_R_16BF;
  int64_t group = s.heads / s.kv_heads, entries = s.batch * s.kv_heads;
  int64_t rows = stripRows(s), d = s.head_dim, dv = s.v_dim;
  if (entries == 0 || s.seq == 0)
    return;
  int64_t stripElems = entries * rows * s.len;
  int64_t bytes = stripElems * 4 + (s.dtype ? stripElems * 2 : 0);
  if (!ensureScratch(ctx, bytes, what))
    return;
  float *p = ctx->scratch;
  uint16_t *narrow =
      s.dtype ? reinterpret_cast<uint16_t *>(p + stripElems) : nullptr;
  for (int64_t j = 0; j < group; ++j)
    for (int64_t i0 = 0; i0 < s.seq; i0 += rows) {
      int64_t n = std::min(rows, s.seq - i0);
      int64_t keys = visibleKeys(s, i0 + n - 1);
      void *o = at(out, (j * s.seq + i0) * dv, es);
      if (keys == 0) {
        // Every row masked: zeros, and -inf statistics.
        for (int64_t e = 0; e < entries; ++e) {
          zeroBytes(ctx, what, at(out, ((e * group + j) * s.seq + i0) * dv, es),
                    n * dv * es);
          fillKernel<<<gridFor(n), kThreads, 0, ctx->stream>>>(
              lse + (e * group + j) * s.seq + i0, -INFINITY, n);
        }
        continue;
      }
      if (!gemmEx(ctx, what, type, CUDA_R_32F, false, true, entries, n, keys, d,
                  at(q, (j * s.seq + i0) * d, es), d, group * s.seq * d, k, d,
                  s.len * d, 0.0f, p, keys, n * keys))
        return;
      int64_t stripRowsAll = entries * n;
      softmaxStripKernel<<<static_cast<unsigned>(
                               std::min(stripRowsAll, kMaxBlocks)),
                           128, 0, ctx->stream>>>(s, bias, p, narrow, lse,
                                                  stripRowsAll, n, keys, i0, j);
      if (!gemmEx(ctx, what, type, type, false, false, entries, n, dv, keys,
                  s.dtype ? static_cast<const void *>(narrow) : p, keys,
                  n * keys, v, dv, s.len * dv, 0.0f, o, dv, group * s.seq * dv))
        return;
    }
}

extern "C" void pcc_cuda_attention_grad(
    pcc_cuda_context *ctx, const pcc_attention_shape *shape, const void *q,
    const void *k, const void *v, const void *out, const float *lse,
    const void *grad, const float *bias, void *dq, void *dk, void *dv) {
  const char *what = "pcc_cuda_attention_grad";
  const pcc_attention_shape s = *shape;
  int64_t es = s.dtype == 0 ? 4 : 2;
  cudaDataType type = s.dtype == 0 ? CUDA_R_32F : CUDA_R_16BF;
  int64_t group = s.heads / s.kv_heads, entries = s.batch * s.kv_heads;
  int64_t rows = stripRows(s), d = s.head_dim, dvd = s.v_dim;
  if (entries == 0 || s.seq == 0)
    return;
  int64_t stripElems = entries * rows * s.len;
  int64_t accElems = s.dtype ? entries * s.len * (d + dvd) : 0;
  int64_t bytes =
      stripElems * 8 + (s.dtype ? stripElems * 4 : 0) + accElems * 4;
  if (!ensureScratch(ctx, bytes, what))
    return;
  float *p = ctx->scratch, *dp = p + stripElems;
  float *acc = dp + stripElems;
  uint16_t *narrowP = nullptr, *narrowDs = nullptr;
  if (s.dtype) {
    narrowP = reinterpret_cast<uint16_t *>(acc + accElems);
    narrowDs = narrowP + stripElems;
  }
  // The key heads' gradients sum in f32: in dk and dv themselves, or in
  // the scratch for bf16.
  float *dkAcc = s.dtype ? acc : static_cast<float *>(dk);
  float *dvAcc = s.dtype ? acc + entries * s.len * d : static_cast<float *>(dv);
  if (!zeroBytes(ctx, what, dkAcc, entries * s.len * d * 4) ||
      !zeroBytes(ctx, what, dvAcc, entries * s.len * dvd * 4))
    return;
  for (int64_t j = 0; j < group; ++j)
    for (int64_t i0 = 0; i0 < s.seq; i0 += rows) {
      int64_t n = std::min(rows, s.seq - i0);
      int64_t keys = visibleKeys(s, i0 + n - 1);
      int64_t qOff = (j * s.seq + i0) * d, oOff = (j * s.seq + i0) * dvd;
      if (keys == 0) {
        for (int64_t e = 0; e < entries; ++e)
          zeroBytes(ctx, what, at(dq, ((e * group + j) * s.seq + i0) * d, es),
                    n * d * es);
        continue;
      }
      // p = q k^T and dp = grad v^T, then the row work.
      if (!gemmEx(ctx, what, type, CUDA_R_32F, false, true, entries, n, keys, d,
                  at(q, qOff, es), d, group * s.seq * d, k, d, s.len * d, 0.0f,
                  p, keys, n * keys) ||
          !gemmEx(ctx, what, type, CUDA_R_32F, false, true, entries, n, keys,
                  dvd, at(grad, oOff, es), dvd, group * s.seq * dvd, v, dvd,
                  s.len * dvd, 0.0f, dp, keys, n * keys))
        return;
      int64_t stripRowsAll = entries * n;
      gradStripKernel<<<static_cast<unsigned>(
                            std::min(stripRowsAll, kMaxBlocks)),
                        128, 0, ctx->stream>>>(s, bias, lse, grad, out, p, dp,
                                               narrowP, narrowDs, stripRowsAll,
                                               n, keys, i0, j);
      const void *pOp = s.dtype ? static_cast<const void *>(narrowP) : p;
      const void *dsOp = s.dtype ? static_cast<const void *>(narrowDs) : dp;
      // dv += p^T grad; dq = ds k; dk += ds^T q.
      if (!gemmEx(ctx, what, type, CUDA_R_32F, true, false, entries, keys, dvd,
                  n, pOp, keys, n * keys, at(grad, oOff, es), dvd,
                  group * s.seq * dvd, 1.0f, dvAcc, dvd, s.len * dvd) ||
          !gemmEx(ctx, what, type, type, false, false, entries, n, d, keys,
                  dsOp, keys, n * keys, k, d, s.len * d, 0.0f, at(dq, qOff, es),
                  d, group * s.seq * d) ||
          !gemmEx(ctx, what, type, CUDA_R_32F, true, false, entries, keys, d, n,
                  dsOp, keys, n * keys, at(q, qOff, es), d, group * s.seq * d,
                  1.0f, dkAcc, d, s.len * d))
        return;
    }
  if (s.dtype) {
    int64_t nk = entries * s.len * d, nv = entries * s.len * dvd;
    roundKernel<<<gridFor(nk), kThreads, 0, ctx->stream>>>(
        dkAcc, static_cast<uint16_t *>(dk), nk);
    roundKernel<<<gridFor(nv), kThreads, 0, ctx->stream>>>(
        dvAcc, static_cast<uint16_t *>(dv), nv);
  }
}
