//===- LinearCrossEntropyKernels.cu - an LM head's fused loss on the GPU --===//
//
// pcc_cpu_linear_cross_entropy and its gradient on the GPU, block for block
// as on the CPU: cuBLAS computes the logits of up to 4096 rows by 4096
// classes (64 MiB of scratch) and the kernels here consume them (one
// thread block per row: the running maximum and double sum of
// exponentials, the label's logit; or dl in place), then two more cuBLAS
// products give dh and dw. No rows x vocabulary buffer.
//
// bf16 and fp16 operands multiply with f32 accumulation as on the CPU:
// each logit rounded to the 16-bit type before the statistics, dl rounded
// before its products, dh and the block of dw summed in f32 scratch and
// rounded once.
//
//===----------------------------------------------------------------------===//

#include "CudaCommon.cuh"

#include "pcc/runtime/CpuKernels.h" // enum pcc_dtype
#include "pcc/runtime/HalfFloat.h"

#include <algorithm>
#include <cmath>

using namespace pcc_cuda;

namespace {

constexpr int64_t kBlockRows = 4096;
constexpr int64_t kBlockClasses = 4096;

template <typename Index>
__device__ int64_t classIn(const void *labels, int64_t r, int64_t ignore,
                           int64_t first) {
  int64_t label = static_cast<const Index *>(labels)[r];
  return label == ignore ? -1 : label - first;
}

template <typename Index>
__global__ void checkLabelsKernel(const void *labels, int64_t rows,
                                  int64_t total, int64_t ignore, int *errorSite,
                                  int site) {
  for (int64_t r = threadIndex(); r < rows; r += threadCount()) {
    int64_t label = static_cast<const Index *>(labels)[r];
    if (label != ignore && (label < 0 || label >= total))
      atomicCAS(errorSite, 0, site);
  }
}

__global__ void startStatsKernel(float *maxima, double *sums, float *target,
                                 int64_t rows) {
  for (int64_t r = threadIndex(); r < rows; r += threadCount()) {
    maxima[r] = -INFINITY;
    sums[r] = 0.0;
    target[r] = 0.0f;
  }
}

/// One block per row of the block of logits: the row's running maximum
/// and sum of exponentials (rescaled when the maximum grows), and its
/// label's logit.
template <typename Index>
__global__ void statsKernel(const float *block, int64_t rows, int64_t classes,
                            const void *labels, int64_t ignore, int64_t first,
                            float *maxima, double *sums, float *target) {
  __shared__ float sharedMax[32];
  __shared__ double sharedSum[32];
  using Team = RowTeam<false>;
  for (int64_t r = Team::firstRow(); r < rows; r += Team::rowStep()) {
    const float *row = block + r * classes;
    float m = -INFINITY;
    for (int64_t c = Team::lane(); c < classes; c += Team::size())
      m = maxOf(m, row[c]);
    m = maxOf(Team::reduce(m, MaxOp(), sharedMax), maxima[r]);
    double sum = 0;
    for (int64_t c = Team::lane(); c < classes; c += Team::size())
      sum += exp(static_cast<double>(__fsub_rn(row[c], m)));
    sum = Team::reduce(sum, SumOp(), sharedSum);
    if (Team::lane() == 0) {
      double before = sums[r];
      sums[r] =
          (before == 0.0 ? 0.0
                         : before * exp(static_cast<double>(maxima[r]) - m)) +
          sum;
      maxima[r] = m;
      int64_t label = classIn<Index>(labels, r, ignore, first);
      if (label >= 0 && label < classes)
        target[r] = row[label];
    }
    __syncthreads(); // the shared sums are used again for the next row
  }
}

__global__ void finishStatsKernel(const float *maxima, const double *sums,
                                  float *lse, int64_t rows) {
  for (int64_t r = threadIndex(); r < rows; r += threadCount())
    lse[r] = static_cast<float>(static_cast<double>(maxima[r]) + log(sums[r]));
}

/// dl = grad_lse exp(l - lse) + grad_target [class == label], in place.
template <typename Index>
__global__ void logitsGradKernel(float *block, int64_t rows, int64_t classes,
                                 const void *labels, int64_t ignore,
                                 int64_t first, const float *lse,
                                 const float *gradLse,
                                 const float *gradTarget) {
  int64_t n = rows * classes;
  for (int64_t e = threadIndex(); e < n; e += threadCount()) {
    int64_t r = e / classes, c = e % classes;
    float v =
        gradLse[r] * static_cast<float>(
                         exp(static_cast<double>(__fsub_rn(block[e], lse[r]))));
    if (classIn<Index>(labels, r, ignore, first) == c)
      v += gradTarget[r];
    block[e] = v;
  }
}

__device__ inline float roundTo(int dtype, float x) {
  return dtype == PCC_BF16 ? pccrt::bf16ToFloat(pccrt::floatToBf16(x))
                           : pccrt::halfToFloat(pccrt::floatToHalf(x));
}

__device__ inline uint16_t narrowTo(int dtype, float x) {
  return dtype == PCC_BF16 ? pccrt::floatToBf16(x) : pccrt::floatToHalf(x);
}

/// Each of n logits rounded to the 16-bit type, in place.
__global__ void roundKernel(float *x, int64_t n, int dtype) {
  for (int64_t e = threadIndex(); e < n; e += threadCount())
    x[e] = roundTo(dtype, x[e]);
}

/// y[r * ldy + c] = x[r * cols + c] rounded, for a rows x cols block.
__global__ void narrowKernel(const float *x, int64_t rows, int64_t cols,
                             uint16_t *y, int64_t ldy, int dtype) {
  int64_t n = rows * cols;
  for (int64_t e = threadIndex(); e < n; e += threadCount())
    y[(e / cols) * ldy + e % cols] = narrowTo(dtype, x[e]);
}

/// The labels of rows r0 and on.
const void *labelsFrom(const pcc_lce_shape &s, const void *labels, int64_t r0) {
  return static_cast<const char *>(labels) + r0 * (s.labels_are_i64 ? 8 : 4);
}

bool isHalf(const pcc_lce_shape &s) { return s.dtype != PCC_F32; }

cudaDataType typeOf(const pcc_lce_shape &s) {
  return s.dtype == PCC_BF16  ? CUDA_R_16BF
         : s.dtype == PCC_F16 ? CUDA_R_16F
                              : CUDA_R_32F;
}

/// Elements of the shape's type from `base`.
const void *at(const pcc_lce_shape &s, const void *base, int64_t offset) {
  return static_cast<const char *>(base) + offset * (isHalf(s) ? 2 : 4);
}

/// c (f32) = op(a) op(b) (+ c) on operands of the shape's type.
bool product(pcc_cuda_context *ctx, const char *what, const pcc_lce_shape &s,
             bool ta, bool tb, int64_t m, int64_t n, int64_t k, const void *a,
             int64_t lda, const void *b, int64_t ldb, bool accumulate, float *c,
             int64_t ldc) {
  return gemmEx(ctx, what, typeOf(s), CUDA_R_32F, ta, tb, 1, m, n, k, a, lda, 0,
                b, ldb, 0, accumulate ? 1.0f : 0.0f, c, ldc, 0);
}

/// The logits of rows [r0, r0 + nr) and classes [c0, c0 + nc) (rounded
/// to 16-bit operands' type).
bool logitsBlock(pcc_cuda_context *ctx, const pcc_lce_shape &s, const void *h,
                 const void *w, int64_t r0, int64_t nr, int64_t c0, int64_t nc,
                 float *block, const char *what) {
  bool ok = s.transpose_w
                ? product(ctx, what, s, false, true, nr, nc, s.dim,
                          at(s, h, r0 * s.dim), s.dim, at(s, w, c0 * s.dim),
                          s.dim, false, block, nc)
                : product(ctx, what, s, false, false, nr, nc, s.dim,
                          at(s, h, r0 * s.dim), s.dim, at(s, w, c0), s.vocab,
                          false, block, nc);
  if (ok && isHalf(s))
    roundKernel<<<gridFor(nr * nc), kThreads, 0, ctx->stream>>>(block, nr * nc,
                                                                s.dtype);
  return ok;
}

bool checkLabels(pcc_cuda_context *ctx, const pcc_lce_shape &s,
                 const void *labels, int site, const char *what) {
  if (s.dtype != PCC_F32 && s.dtype != PCC_BF16 && s.dtype != PCC_F16) {
    setPending(ctx, std::string(what) +
                        ": runs on f32, bf16 or fp16, not "
                        "element type code " +
                        std::to_string(s.dtype));
    return false;
  }
  if (s.rows == 0)
    return true;
  if (s.labels_are_i64)
    checkLabelsKernel<int64_t><<<gridFor(s.rows), kThreads, 0, ctx->stream>>>(
        labels, s.rows, s.vocab_total, s.ignore_index, ctx->errorSite, site);
  else
    checkLabelsKernel<int32_t><<<gridFor(s.rows), kThreads, 0, ctx->stream>>>(
        labels, s.rows, s.vocab_total, s.ignore_index, ctx->errorSite, site);
  return true;
}

} // namespace

extern "C" void pcc_cuda_linear_cross_entropy(pcc_cuda_context *ctx,
                                              const pcc_lce_shape *shape,
                                              int64_t vocab_start,
                                              const void *hv, const void *wv,
                                              const void *labels, float *lse,
                                              float *target, int site) {
  const char *what = "pcc_cuda_linear_cross_entropy";
  const pcc_lce_shape s = *shape;
  if (!checkLabels(ctx, s, labels, site, what) || s.rows == 0)
    return;
  int64_t blockRows = std::min(s.rows, kBlockRows);
  int64_t blockClasses = std::max<int64_t>(std::min(s.vocab, kBlockClasses), 1);
  int64_t blockBytes = blockRows * blockClasses * 4;
  // The block of logits, then the row sums (double) and maxima.
  if (!ensureScratch(ctx, blockBytes + s.rows * 12, what))
    return;
  float *block = ctx->scratch;
  double *sums = reinterpret_cast<double *>(
      reinterpret_cast<char *>(ctx->scratch) + blockBytes);
  float *maxima = reinterpret_cast<float *>(sums + s.rows);
  startStatsKernel<<<gridFor(s.rows), kThreads, 0, ctx->stream>>>(
      maxima, sums, target, s.rows);
  for (int64_t r0 = 0; r0 < s.rows; r0 += blockRows) {
    int64_t nr = std::min(blockRows, s.rows - r0);
    for (int64_t c0 = 0; c0 < s.vocab; c0 += blockClasses) {
      int64_t nc = std::min(blockClasses, s.vocab - c0);
      if (!logitsBlock(ctx, s, hv, wv, r0, nr, c0, nc, block, what))
        return;
      const void *rowLabels = labelsFrom(s, labels, r0);
      if (s.labels_are_i64)
        statsKernel<int64_t><<<rowGrid(nr, false), kThreads, 0, ctx->stream>>>(
            block, nr, nc, rowLabels, s.ignore_index, vocab_start + c0,
            maxima + r0, sums + r0, target + r0);
      else
        statsKernel<int32_t><<<rowGrid(nr, false), kThreads, 0, ctx->stream>>>(
            block, nr, nc, rowLabels, s.ignore_index, vocab_start + c0,
            maxima + r0, sums + r0, target + r0);
    }
  }
  finishStatsKernel<<<gridFor(s.rows), kThreads, 0, ctx->stream>>>(maxima, sums,
                                                                   lse, s.rows);
}

extern "C" void pcc_cuda_linear_cross_entropy_grad(
    pcc_cuda_context *ctx, const pcc_lce_shape *shape, int64_t vocab_start,
    const void *hv, const void *wv, const void *labels, const float *lse,
    const float *grad_lse, const float *grad_target, void *dhv, void *dwv,
    int site) {
  const char *what = "pcc_cuda_linear_cross_entropy_grad";
  const pcc_lce_shape s = *shape;
  if (!checkLabels(ctx, s, labels, site, what))
    return;
  bool half = isHalf(s);
  int64_t elementBytes = half ? 2 : 4;
  if (s.rows == 0 || s.vocab == 0) {
    // A null result is a product zb-h1's other copy computes.
    for (auto [out, count] : {std::pair{dhv, s.rows}, std::pair{dwv, s.vocab}})
      if (out)
        if (cudaError_t err = cudaMemsetAsync(
                out, 0, count * s.dim * elementBytes, ctx->stream))
          setPending(ctx, what, err);
    return;
  }
  int64_t blockRows = std::min(s.rows, kBlockRows);
  int64_t blockClasses = std::min(s.vocab, kBlockClasses);
  // The block of logits; on 16-bit operands then dl rounded, dh's f32 sum
  // and the f32 sum of dw's block.
  int64_t blockBytes = blockRows * blockClasses * 4;
  int64_t dlBytes = half ? blockRows * blockClasses * 2 : 0;
  int64_t dhBytes = half && dhv ? s.rows * s.dim * 4 : 0;
  int64_t dwBytes = half && dwv ? blockClasses * s.dim * 4 : 0;
  if (!ensureScratch(ctx, blockBytes + dlBytes + dhBytes + dwBytes, what))
    return;
  char *scratch = reinterpret_cast<char *>(ctx->scratch);
  float *block = ctx->scratch;
  auto *dl16 = reinterpret_cast<uint16_t *>(scratch + blockBytes);
  const void *dl = half ? static_cast<const void *>(dl16) : block;
  float *dh =
      half ? (dhv ? reinterpret_cast<float *>(scratch + blockBytes + dlBytes)
                  : nullptr)
           : static_cast<float *>(dhv);
  float *dwSum =
      reinterpret_cast<float *>(scratch + blockBytes + dlBytes + dhBytes);
  for (int64_t c0 = 0; c0 < s.vocab; c0 += blockClasses) {
    int64_t nc = std::min(blockClasses, s.vocab - c0);
    // This block of dw: [nc, D] rows of a [V, D] weight; [D, nc] columns of
    // a [D, V] one (row stride V in place, nc in the f32 sum).
    float *dw =
        !dwv   ? nullptr
        : half ? dwSum
               : static_cast<float *>(dwv) + (s.transpose_w ? c0 * s.dim : c0);
    int64_t ldw = s.transpose_w ? s.dim : (half ? nc : s.vocab);
    for (int64_t r0 = 0; r0 < s.rows; r0 += blockRows) {
      int64_t nr = std::min(blockRows, s.rows - r0);
      if (!logitsBlock(ctx, s, hv, wv, r0, nr, c0, nc, block, what))
        return;
      const void *rowLabels = labelsFrom(s, labels, r0);
      if (s.labels_are_i64)
        logitsGradKernel<int64_t>
            <<<gridFor(nr * nc), kThreads, 0, ctx->stream>>>(
                block, nr, nc, rowLabels, s.ignore_index, vocab_start + c0,
                lse + r0, grad_lse + r0, grad_target + r0);
      else
        logitsGradKernel<int32_t>
            <<<gridFor(nr * nc), kThreads, 0, ctx->stream>>>(
                block, nr, nc, rowLabels, s.ignore_index, vocab_start + c0,
                lse + r0, grad_lse + r0, grad_target + r0);
      if (half)
        narrowKernel<<<gridFor(nr * nc), kThreads, 0, ctx->stream>>>(
            block, nr, nc, dl16, nc, s.dtype);
      // dh (rows r0..) += dl w_block: the first block of classes writes.
      bool ok = true;
      if (dh)
        ok = s.transpose_w ? product(ctx, what, s, false, false, nr, s.dim, nc,
                                     dl, nc, at(s, wv, c0 * s.dim), s.dim,
                                     c0 != 0, dh + r0 * s.dim, s.dim)
                           : product(ctx, what, s, false, true, nr, s.dim, nc,
                                     dl, nc, at(s, wv, c0), s.vocab, c0 != 0,
                                     dh + r0 * s.dim, s.dim);
      // dw_block += dl^T h (rows r0..): the first block of rows writes.
      if (dw && ok)
        ok = s.transpose_w
                 ? product(ctx, what, s, true, false, nc, s.dim, nr, dl, nc,
                           at(s, hv, r0 * s.dim), s.dim, r0 != 0, dw, ldw)
                 : product(ctx, what, s, true, false, s.dim, nc, nr,
                           at(s, hv, r0 * s.dim), s.dim, dl, nc, r0 != 0, dw,
                           ldw);
      if (!ok)
        return;
    }
    if (half && dwv) {
      auto *out = static_cast<uint16_t *>(dwv);
      if (s.transpose_w)
        narrowKernel<<<gridFor(nc * s.dim), kThreads, 0, ctx->stream>>>(
            dwSum, nc, s.dim, out + c0 * s.dim, s.dim, s.dtype);
      else
        narrowKernel<<<gridFor(nc * s.dim), kThreads, 0, ctx->stream>>>(
            dwSum, s.dim, nc, out + c0, s.vocab, s.dtype);
    }
  }
  if (half && dhv)
    narrowKernel<<<gridFor(s.rows * s.dim), kThreads, 0, ctx->stream>>>(
        dh, s.rows, s.dim, static_cast<uint16_t *>(dhv), s.dim, s.dtype);
}
