//===- LinearCrossEntropyKernels.cu - an LM head's fused loss on the GPU --===//
//
// pcc_cpu_linear_cross_entropy and its gradient on the GPU, block for block
// as on the CPU: cuBLAS computes the logits of up to 4096 rows by 4096
// classes (64 MiB of scratch) and the kernels here consume them (one
// thread block per row: the running maximum and double sum of
// exponentials, the label's logit; or dl in place), then two more cuBLAS
// products give dh and dw. No rows x vocabulary buffer.
//
//===----------------------------------------------------------------------===//

#include "CudaCommon.cuh"

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

/// The labels of rows r0 and on.
const void *labelsFrom(const pcc_lce_shape &s, const void *labels, int64_t r0) {
  return static_cast<const char *>(labels) + r0 * (s.labels_are_i64 ? 8 : 4);
}

/// The logits of rows [r0, r0 + nr) and classes [c0, c0 + nc).
bool logitsBlock(pcc_cuda_context *ctx, const pcc_lce_shape &s, const float *h,
                 const float *w, int64_t r0, int64_t nr, int64_t c0, int64_t nc,
                 float *block, const char *what) {
  if (s.transpose_w)
    return gemmEx(ctx, what, CUDA_R_32F, CUDA_R_32F, false, true, 1, nr, nc,
                  s.dim, h + r0 * s.dim, s.dim, 0, w + c0 * s.dim, s.dim, 0,
                  0.0f, block, nc, 0);
  return gemmEx(ctx, what, CUDA_R_32F, CUDA_R_32F, false, false, 1, nr, nc,
                s.dim, h + r0 * s.dim, s.dim, 0, w + c0, s.vocab, 0, 0.0f,
                block, nc, 0);
}

bool checkLabels(pcc_cuda_context *ctx, const pcc_lce_shape &s,
                 const void *labels, int site, const char *what) {
  if (s.dtype != 0) {
    setPending(ctx, std::string(what) + ": runs on f32 only");
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
  const float *h = static_cast<const float *>(hv);
  const float *w = static_cast<const float *>(wv);
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
      if (!logitsBlock(ctx, s, h, w, r0, nr, c0, nc, block, what))
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
  const float *h = static_cast<const float *>(hv);
  const float *w = static_cast<const float *>(wv);
  float *dh = static_cast<float *>(dhv);
  float *dw = static_cast<float *>(dwv);
  if (s.rows == 0 || s.vocab == 0) {
    if (cudaError_t err =
            cudaMemsetAsync(dh, 0, s.rows * s.dim * 4, ctx->stream))
      setPending(ctx, what, err);
    if (cudaError_t err =
            cudaMemsetAsync(dw, 0, s.vocab * s.dim * 4, ctx->stream))
      setPending(ctx, what, err);
    return;
  }
  int64_t blockRows = std::min(s.rows, kBlockRows);
  int64_t blockClasses = std::min(s.vocab, kBlockClasses);
  if (!ensureScratch(ctx, blockRows * blockClasses * 4, what))
    return;
  float *block = ctx->scratch;
  for (int64_t c0 = 0; c0 < s.vocab; c0 += blockClasses) {
    int64_t nc = std::min(blockClasses, s.vocab - c0);
    for (int64_t r0 = 0; r0 < s.rows; r0 += blockRows) {
      int64_t nr = std::min(blockRows, s.rows - r0);
      if (!logitsBlock(ctx, s, h, w, r0, nr, c0, nc, block, what))
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
      // dh (rows r0..) += dl w_block: the first block of classes writes.
      float keep = c0 == 0 ? 0.0f : 1.0f;
      bool ok = true;
      if (dh)
        ok = s.transpose_w
                 ? gemmEx(ctx, what, CUDA_R_32F, CUDA_R_32F, false, false, 1,
                          nr, s.dim, nc, block, nc, 0, w + c0 * s.dim, s.dim, 0,
                          keep, dh + r0 * s.dim, s.dim, 0)
                 : gemmEx(ctx, what, CUDA_R_32F, CUDA_R_32F, false, true, 1, nr,
                          s.dim, nc, block, nc, 0, w + c0, s.vocab, 0, keep,
                          dh + r0 * s.dim, s.dim, 0);
      // dw_block += dl^T h (rows r0..): the first block of rows writes.
      float accumulate = r0 == 0 ? 0.0f : 1.0f;
      if (dw && ok)
        ok = s.transpose_w
                 ? gemmEx(ctx, what, CUDA_R_32F, CUDA_R_32F, true, false, 1, nc,
                          s.dim, nr, block, nc, 0, h + r0 * s.dim, s.dim, 0,
                          accumulate, dw + c0 * s.dim, s.dim, 0)
                 : gemmEx(ctx, what, CUDA_R_32F, CUDA_R_32F, true, false, 1,
                          s.dim, nc, nr, h + r0 * s.dim, s.dim, 0, block, nc, 0,
                          accumulate, dw + c0, s.vocab, 0);
      if (!ok)
        return;
    }
  }
}
