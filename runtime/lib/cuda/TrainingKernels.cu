//===- TrainingKernels.cu - CUDA kernels of the training ops ---------------===//
//
// The CUDA twins of CpuKernels.cpp's training section (gradient of a
// gather, cross-entropy and its gradient, SGD and AdamW steps), with the
// same numerics, asynchronously on the context's stream; errors as in
// CudaKernels.cu.
//
//===----------------------------------------------------------------------===//

#include "CudaCommon.cuh"

#include "pcc/runtime/ModelAbi.h"

#include <cmath>

using namespace pcc_cuda;

//===----------------------------------------------------------------------===//
// Training: scatter-add, cross-entropy, optimizer steps
//===----------------------------------------------------------------------===//
//
// The float arithmetic is written with the _rn intrinsics where nvcc would
// otherwise contract a multiply and an add into an FMA: each operation is
// rounded as on the CPU, so both targets compute the same bits.

namespace {
/// Adds the rows of `updates` ([outer, numIndices, inner]) into y ([outer,
/// axisDim, inner], already zeroed) at their indices: one thread per
/// (outer, inner) column, looping over the indices in order, so every sum
/// is formed in pcc_cpu_scatter_add_f32's order on every run (no atomics).
/// Bad indices add nothing; checkIndicesKernel reports them.
template <typename Index>
__global__ void scatterAddKernel(const float *updates, const Index *indices,
                                 float *y, int64_t axisDim, int64_t inner,
                                 int64_t numIndices, int64_t columns) {
  for (int64_t c = threadIndex(); c < columns; c += threadCount()) {
    int64_t o = c / inner, i = c % inner;
    const float *in = updates + o * numIndices * inner + i;
    float *out = y + o * axisDim * inner + i;
    for (int64_t j = 0; j < numIndices; ++j) {
      int64_t idx = indices[j];
      if (idx < -axisDim || idx >= axisDim)
        continue;
      if (idx < 0)
        idx += axisDim;
      out[idx * inner] = __fadd_rn(out[idx * inner], in[j * inner]);
    }
  }
}

template <typename Index>
void scatterAdd(pcc_cuda_context *ctx, const float *updates,
                const void *indices, float *y, int64_t outer, int64_t axisDim,
                int64_t inner, int64_t numIndices, int site) {
  const Index *idx = static_cast<const Index *>(indices);
  int64_t bytes = outer * axisDim * inner * int64_t(sizeof(float));
  if (bytes > 0)
    if (cudaError_t err =
            cudaMemsetAsync(y, 0, static_cast<size_t>(bytes), ctx->stream))
      setPending(ctx, "pcc_cuda_scatter_add_f32: cudaMemsetAsync", err);
  if (numIndices <= 0)
    return;
  // As on the CPU, every index is checked, even when nothing is added.
  checkIndicesKernel<Index><<<gridFor(numIndices), kThreads, 0, ctx->stream>>>(
      idx, axisDim, numIndices, ctx->errorSite, site);
  int64_t columns = outer * inner;
  if (columns == 0 || axisDim == 0)
    return;
  scatterAddKernel<Index><<<gridFor(columns), kThreads, 0, ctx->stream>>>(
      updates, idx, y, axisDim, inner, numIndices, columns);
}

/// Cross-entropy of contiguous rows (kGrad: its gradient), one warp or one
/// block per row, with pcc_cpu_cross_entropy_f32's numerics: the maximum in
/// float, the sum of exponentials in double. The gradient's exponentials
/// are computed in double and rounded to float, which matches the CPU's
/// (correctly rounded) expf more closely than CUDA's expf does. A bad label
/// records `site` and gives its row a zero loss (gradient).
template <bool kWarp, bool kGrad, typename Index>
__global__ void crossEntropyKernel(const float *logits, const Index *labels,
                                   const float *grad, float *y, int64_t rows,
                                   int64_t classes, int64_t ignore,
                                   int *errorSite, int site) {
  using Team = RowTeam<kWarp>;
  __shared__ float sharedMax[32];
  __shared__ double sharedSum[32];
  for (int64_t r = Team::firstRow(); r < rows; r += Team::rowStep()) {
    // The label is the same for the whole team: no divergence below.
    int64_t label = labels[r];
    bool skip = label == ignore;
    if (!skip && (label < 0 || label >= classes)) {
      if (Team::lane() == 0)
        atomicCAS(errorSite, 0, site); // keep the first site
      skip = true;
    }
    if (skip) {
      if constexpr (kGrad) {
        for (int64_t c = Team::lane(); c < classes; c += Team::size())
          y[r * classes + c] = 0.0f;
      } else if (Team::lane() == 0) {
        y[r] = 0.0f;
      }
      continue;
    }
    const float *row = logits + r * classes;
    float maxValue = -INFINITY;
    for (int64_t c = Team::lane(); c < classes; c += Team::size())
      maxValue = maxOf(maxValue, row[c]);
    maxValue = Team::reduce(maxValue, MaxOp(), sharedMax);
    double sum = 0;
    for (int64_t c = Team::lane(); c < classes; c += Team::size())
      sum += exp(static_cast<double>(__fsub_rn(row[c], maxValue)));
    sum = Team::reduce(sum, SumOp(), sharedSum);
    if constexpr (kGrad) {
      float inv = static_cast<float>(1.0 / sum), g = grad[r];
      float *out = y + r * classes;
      for (int64_t c = Team::lane(); c < classes; c += Team::size()) {
        float e = static_cast<float>(
            exp(static_cast<double>(__fsub_rn(row[c], maxValue))));
        float v = __fmul_rn(__fmul_rn(e, inv), g);
        out[c] = c == label ? __fsub_rn(v, g) : v;
      }
    } else if (Team::lane() == 0) {
      y[r] = static_cast<float>(static_cast<double>(maxValue) + log(sum) -
                                static_cast<double>(row[label]));
    }
  }
}

template <bool kGrad, typename Index>
void crossEntropy(pcc_cuda_context *ctx, const float *logits,
                  const void *labels, const float *grad, float *y, int64_t rows,
                  int64_t classes, int64_t ignore, int site) {
  if (rows <= 0)
    return;
  const Index *l = static_cast<const Index *>(labels);
  if (classes <= kWarpRowLimit)
    crossEntropyKernel<true, kGrad, Index>
        <<<rowGrid(rows, true), kThreads, 0, ctx->stream>>>(
            logits, l, grad, y, rows, classes, ignore, ctx->errorSite, site);
  else
    crossEntropyKernel<false, kGrad, Index>
        <<<rowGrid(rows, false), kThreads, 0, ctx->stream>>>(
            logits, l, grad, y, rows, classes, ignore, ctx->errorSite, site);
}

/// Gradient clipping as the CPU's clipCoefficient: max_norm / (norm +
/// 1e-6), at most 1, in float; 1 when the run does not clip. The norm is
/// read on the device, where the step computed it.
struct Clip {
  bool enabled;
  float maxNorm;
};

Clip clipFor(const double *hyper) {
  double maxNorm = hyper[PCC_HYPER_MAX_GRAD_NORM];
  return Clip{maxNorm > 0, static_cast<float>(maxNorm)};
}

__device__ float clipCoefficient(Clip clip, const float *norm) {
  if (!clip.enabled)
    return 1.0f;
  float coef = __fdiv_rn(clip.maxNorm, __fadd_rn(*norm, 1e-6f));
  return minOf(coef, 1.0f);
}

/// pcc_cpu_sgd_f32's scalars, computed on the host as there.
struct SgdScalars {
  Clip clip;
  float lr, wd, momentum, keep;
  bool nesterov, first;
};

__global__ void sgdKernel(float *param, const float *grad,
                          float *momentumBuffer, int64_t n, SgdScalars s,
                          const float *norm) {
  float coef = clipCoefficient(s.clip, norm);
  for (int64_t i = threadIndex(); i < n; i += threadCount()) {
    float g = __fmul_rn(grad[i], coef);
    if (s.wd != 0)
      g = __fadd_rn(g, __fmul_rn(s.wd, param[i]));
    if (s.momentum != 0) {
      float buf = s.first ? g
                          : __fadd_rn(__fmul_rn(momentumBuffer[i], s.momentum),
                                      __fmul_rn(s.keep, g));
      momentumBuffer[i] = buf;
      g = s.nesterov ? __fadd_rn(g, __fmul_rn(s.momentum, buf)) : buf;
    }
    param[i] = __fadd_rn(param[i], __fmul_rn(-s.lr, g));
  }
}

/// pcc_cpu_adamw_f32's scalars, computed on the host (in double) as there.
struct AdamwScalars {
  Clip clip;
  float decay, w1, b2, w2, negStep, bc2Sqrt, eps;
};

__global__ void adamwKernel(float *param, const float *grad, float *expAvg,
                            float *expAvgSq, int64_t n, AdamwScalars s,
                            const float *norm) {
  float coef = clipCoefficient(s.clip, norm);
  for (int64_t i = threadIndex(); i < n; i += threadCount()) {
    float g = __fmul_rn(grad[i], coef);
    float p = __fmul_rn(param[i], s.decay);
    float m = expAvg[i];
    m = __fadd_rn(m, __fmul_rn(s.w1, __fsub_rn(g, m))); // lerp, weight < 0.5
    float v = __fadd_rn(__fmul_rn(expAvgSq[i], s.b2),
                        __fmul_rn(__fmul_rn(s.w2, g), g));
    float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), s.bc2Sqrt), s.eps);
    param[i] = __fadd_rn(p, __fdiv_rn(__fmul_rn(s.negStep, m), denom));
    expAvg[i] = m;
    expAvgSq[i] = v;
  }
}
} // namespace

extern "C" {

void pcc_cuda_scatter_add_f32(pcc_cuda_context *ctx, const float *updates,
                              const void *indices, float *y, int64_t outer,
                              int64_t axis_dim, int64_t inner,
                              int64_t num_indices, int indices_are_i64,
                              int site) {
  if (indices_are_i64)
    scatterAdd<int64_t>(ctx, updates, indices, y, outer, axis_dim, inner,
                        num_indices, site);
  else
    scatterAdd<int32_t>(ctx, updates, indices, y, outer, axis_dim, inner,
                        num_indices, site);
}

void pcc_cuda_cross_entropy_f32(pcc_cuda_context *ctx, const float *logits,
                                const void *labels, float *loss, int64_t rows,
                                int64_t classes, int64_t ignore_index,
                                int labels_are_i64, int site) {
  if (labels_are_i64)
    crossEntropy<false, int64_t>(ctx, logits, labels, nullptr, loss, rows,
                                 classes, ignore_index, site);
  else
    crossEntropy<false, int32_t>(ctx, logits, labels, nullptr, loss, rows,
                                 classes, ignore_index, site);
}

void pcc_cuda_cross_entropy_grad_f32(pcc_cuda_context *ctx, const float *logits,
                                     const void *labels, const float *grad,
                                     float *y, int64_t rows, int64_t classes,
                                     int64_t ignore_index, int labels_are_i64,
                                     int site) {
  if (labels_are_i64)
    crossEntropy<true, int64_t>(ctx, logits, labels, grad, y, rows, classes,
                                ignore_index, site);
  else
    crossEntropy<true, int32_t>(ctx, logits, labels, grad, y, rows, classes,
                                ignore_index, site);
}

void pcc_cuda_sgd_f32(pcc_cuda_context *ctx, float *param, const float *grad,
                      float *momentum_buffer, int64_t n, const double *hyper,
                      const float *norm) {
  if (n <= 0)
    return;
  SgdScalars s;
  s.clip = clipFor(hyper);
  s.lr = static_cast<float>(hyper[PCC_HYPER_LR]);
  s.wd = static_cast<float>(hyper[PCC_HYPER_WEIGHT_DECAY]);
  s.momentum = static_cast<float>(hyper[PCC_HYPER_MOMENTUM]);
  s.keep = static_cast<float>(1.0 - hyper[PCC_HYPER_DAMPENING]);
  s.nesterov = hyper[PCC_HYPER_NESTEROV] != 0;
  s.first = hyper[PCC_HYPER_STEP] <= 1;
  sgdKernel<<<gridFor(n), kThreads, 0, ctx->stream>>>(
      param, grad, momentum_buffer, n, s, norm);
}

void pcc_cuda_adamw_f32(pcc_cuda_context *ctx, float *param, const float *grad,
                        float *exp_avg, float *exp_avg_sq, int64_t n,
                        const double *hyper, const float *norm) {
  if (n <= 0)
    return;
  double lr = hyper[PCC_HYPER_LR], beta1 = hyper[PCC_HYPER_BETA1],
         beta2 = hyper[PCC_HYPER_BETA2], step = hyper[PCC_HYPER_STEP];
  AdamwScalars s;
  s.clip = clipFor(hyper);
  s.decay = static_cast<float>(1.0 - lr * hyper[PCC_HYPER_WEIGHT_DECAY]);
  s.w1 = static_cast<float>(1.0 - beta1);
  s.b2 = static_cast<float>(beta2);
  s.w2 = static_cast<float>(1.0 - beta2);
  s.negStep = static_cast<float>(-(lr / (1.0 - std::pow(beta1, step))));
  s.bc2Sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(beta2, step)));
  s.eps = static_cast<float>(hyper[PCC_HYPER_EPS]);
  adamwKernel<<<gridFor(n), kThreads, 0, ctx->stream>>>(param, grad, exp_avg,
                                                        exp_avg_sq, n, s, norm);
}

} // extern "C"

