//===- TrainingKernels.cu - CUDA kernels of the training ops ---------------===//
//
// The CUDA twins of CpuKernels.cpp's training section (gradient of a
// gather, cross-entropy and its gradient, SGD and AdamW steps, gradients of
// conv and pooling, running statistics), with the same numerics,
// asynchronously on the context's stream; errors as in CudaKernels.cu.
//
//===----------------------------------------------------------------------===//

#include "CudaCommon.cuh"

#include "pcc/runtime/HalfFloat.h"
#include "pcc/runtime/ModelAbi.h"
#include "pcc/runtime/Philox.h"

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
/// y is this rank's block of `block` rows from `start` of a dimension of
/// `total` (pcc.shard_scatter_add; the whole table: start 0, block total):
/// rows with an index outside the block are skipped.
template <typename Index>
__global__ void scatterAddKernel(const float *updates, const Index *indices,
                                 float *y, int64_t block, int64_t start,
                                 int64_t total, int64_t inner,
                                 int64_t numIndices, int64_t columns) {
  for (int64_t c = threadIndex(); c < columns; c += threadCount()) {
    int64_t o = c / inner, i = c % inner;
    const float *in = updates + o * numIndices * inner + i;
    float *out = y + o * block * inner + i;
    for (int64_t j = 0; j < numIndices; ++j) {
      int64_t idx = indices[j];
      if (idx < -total || idx >= total)
        continue;
      if (idx < 0)
        idx += total;
      idx -= start;
      if (idx < 0 || idx >= block)
        continue;
      out[idx * inner] = __fadd_rn(out[idx * inner], in[j * inner]);
    }
  }
}

template <typename Index>
void scatterAdd(pcc_cuda_context *ctx, const float *updates,
                const void *indices, float *y, int64_t outer, int64_t block,
                int64_t start, int64_t total, int64_t inner, int64_t numIndices,
                int site) {
  const Index *idx = static_cast<const Index *>(indices);
  int64_t bytes = outer * block * inner * int64_t(sizeof(float));
  if (bytes > 0)
    if (cudaError_t err =
            cudaMemsetAsync(y, 0, static_cast<size_t>(bytes), ctx->stream))
      setPending(ctx, "pcc_cuda_scatter_add_f32: cudaMemsetAsync", err);
  if (numIndices <= 0)
    return;
  // As on the CPU, every index is checked, even when nothing is added.
  checkIndicesKernel<Index><<<gridFor(numIndices), kThreads, 0, ctx->stream>>>(
      idx, total, numIndices, ctx->errorSite, site);
  int64_t columns = outer * inner;
  if (columns == 0 || block == 0)
    return;
  scatterAddKernel<Index><<<gridFor(columns), kThreads, 0, ctx->stream>>>(
      updates, idx, y, block, start, total, inner, numIndices, columns);
}

/// Cross-entropy of contiguous rows (kGrad: its gradient), one warp or one
/// block per row, with pcc_cpu_cross_entropy_f32's numerics: the maximum in
/// float, the sum of exponentials in double. The gradient's exponentials
/// are computed in double and rounded to float, which matches the CPU's
/// (correctly rounded) expf more closely than CUDA's expf does. A bad label
/// records `site` and gives its row a zero loss (gradient). Logits `T`
/// (float, or bf16 bits widened exactly); a gradient `Out` (float, or bf16
/// bits rounded once as a cast rounds).
__device__ inline float widen(float x) { return x; }
__device__ inline float widen(uint16_t x) { return pccrt::bf16ToFloat(x); }
__device__ inline void narrow(float *y, float v) { *y = v; }
__device__ inline void narrow(uint16_t *y, float v) {
  *y = pccrt::floatToBf16(v);
}

template <bool kWarp, bool kGrad, typename Index, typename T, typename Out>
__global__ void crossEntropyKernel(const T *logits, const Index *labels,
                                   const float *grad, Out *y, int64_t rows,
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
          narrow(y + r * classes + c, 0.0f);
      } else if (Team::lane() == 0) {
        narrow(y + r, 0.0f);
      }
      continue;
    }
    const T *row = logits + r * classes;
    float maxValue = -INFINITY;
    for (int64_t c = Team::lane(); c < classes; c += Team::size())
      maxValue = maxOf(maxValue, widen(row[c]));
    maxValue = Team::reduce(maxValue, MaxOp(), sharedMax);
    double sum = 0;
    for (int64_t c = Team::lane(); c < classes; c += Team::size())
      sum += exp(static_cast<double>(__fsub_rn(widen(row[c]), maxValue)));
    sum = Team::reduce(sum, SumOp(), sharedSum);
    if constexpr (kGrad) {
      float inv = static_cast<float>(1.0 / sum), g = grad[r];
      Out *out = y + r * classes;
      for (int64_t c = Team::lane(); c < classes; c += Team::size()) {
        float e = static_cast<float>(
            exp(static_cast<double>(__fsub_rn(widen(row[c]), maxValue))));
        float v = __fmul_rn(__fmul_rn(e, inv), g);
        narrow(out + c, c == label ? __fsub_rn(v, g) : v);
      }
    } else if (Team::lane() == 0) {
      narrow(y + r,
             static_cast<float>(static_cast<double>(maxValue) + log(sum) -
                                static_cast<double>(widen(row[label]))));
    }
  }
}

template <bool kGrad, typename Index, typename T, typename Out>
void crossEntropyLaunch(pcc_cuda_context *ctx, const T *logits,
                        const void *labels, const float *grad, Out *y,
                        int64_t rows, int64_t classes, int64_t ignore,
                        int site) {
  if (rows <= 0)
    return;
  const Index *l = static_cast<const Index *>(labels);
  if (classes <= kWarpRowLimit)
    crossEntropyKernel<true, kGrad, Index, T, Out>
        <<<rowGrid(rows, true), kThreads, 0, ctx->stream>>>(
            logits, l, grad, y, rows, classes, ignore, ctx->errorSite, site);
  else
    crossEntropyKernel<false, kGrad, Index, T, Out>
        <<<rowGrid(rows, false), kThreads, 0, ctx->stream>>>(
            logits, l, grad, y, rows, classes, ignore, ctx->errorSite, site);
}

/// crossEntropyLaunch for int64 or int32 labels.
template <bool kGrad, typename T, typename Out>
void crossEntropy(pcc_cuda_context *ctx, const T *logits, const void *labels,
                  const float *grad, Out *y, int64_t rows, int64_t classes,
                  int64_t ignore, int labelsAreI64, int site) {
  if (labelsAreI64)
    crossEntropyLaunch<kGrad, int64_t>(ctx, logits, labels, grad, y, rows,
                                       classes, ignore, site);
  else
    crossEntropyLaunch<kGrad, int32_t>(ctx, logits, labels, grad, y, rows,
                                       classes, ignore, site);
}

/// Gradient clipping as the CPU's clipCoefficient: max_norm / (norm +
/// 1e-6), at most 1, in float; 1 when the run does not clip. The norm is
/// read on the device, where the step computed it.
/// Under fp16 loss scaling, the gradients (and their norm) are unscaled by
/// `unscale`, and an update whose norm is not finite is skipped.
struct Clip {
  bool enabled;
  float maxNorm;
  float unscale;
  bool skipNonFinite;
};

Clip clipFor(const double *hyper) {
  double maxNorm = hyper[PCC_HYPER_MAX_GRAD_NORM];
  return Clip{maxNorm > 0, static_cast<float>(maxNorm),
              static_cast<float>(hyper[PCC_HYPER_GRAD_SCALE]),
              hyper[PCC_HYPER_SKIP_NONFINITE] != 0};
}

__device__ float clipCoefficient(Clip clip, const float *norm) {
  if (!clip.enabled)
    return 1.0f;
  float unscaled = __fmul_rn(*norm, clip.unscale);
  float coef = __fdiv_rn(clip.maxNorm, __fadd_rn(unscaled, 1e-6f));
  return minOf(coef, 1.0f);
}

__device__ bool skipUpdate(Clip clip, const float *norm) {
  return clip.skipNonFinite && !isfinite(*norm);
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
  if (skipUpdate(s.clip, norm))
    return;
  float coef = clipCoefficient(s.clip, norm);
  for (int64_t i = threadIndex(); i < n; i += threadCount()) {
    float g = __fmul_rn(__fmul_rn(grad[i], s.clip.unscale), coef);
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
  if (skipUpdate(s.clip, norm))
    return;
  float coef = clipCoefficient(s.clip, norm);
  for (int64_t i = threadIndex(); i < n; i += threadCount()) {
    float g = __fmul_rn(__fmul_rn(grad[i], s.clip.unscale), coef);
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
  pcc_cuda_scatter_add_block_f32(ctx, updates, indices, y, outer, axis_dim, 0,
                                 axis_dim, inner, num_indices, indices_are_i64,
                                 site);
}

void pcc_cuda_scatter_add_block_f32(pcc_cuda_context *ctx, const float *updates,
                                    const void *indices, float *y,
                                    int64_t outer, int64_t block, int64_t start,
                                    int64_t total, int64_t inner,
                                    int64_t num_indices, int indices_are_i64,
                                    int site) {
  if (indices_are_i64)
    scatterAdd<int64_t>(ctx, updates, indices, y, outer, block, start, total,
                        inner, num_indices, site);
  else
    scatterAdd<int32_t>(ctx, updates, indices, y, outer, block, start, total,
                        inner, num_indices, site);
}

void pcc_cuda_cross_entropy_f32(pcc_cuda_context *ctx, const float *logits,
                                const void *labels, float *loss, int64_t rows,
                                int64_t classes, int64_t ignore_index,
                                int labels_are_i64, int site) {
  crossEntropy<false>(ctx, logits, labels, nullptr, loss, rows, classes,
                      ignore_index, labels_are_i64, site);
}

void pcc_cuda_cross_entropy_grad_f32(pcc_cuda_context *ctx, const float *logits,
                                     const void *labels, const float *grad,
                                     float *y, int64_t rows, int64_t classes,
                                     int64_t ignore_index, int labels_are_i64,
                                     int site) {
  crossEntropy<true>(ctx, logits, labels, grad, y, rows, classes, ignore_index,
                     labels_are_i64, site);
}

void pcc_cuda_cross_entropy_bf16(pcc_cuda_context *ctx, const uint16_t *logits,
                                 const void *labels, float *loss, int64_t rows,
                                 int64_t classes, int64_t ignore_index,
                                 int labels_are_i64, int site) {
  crossEntropy<false>(ctx, logits, labels, nullptr, loss, rows, classes,
                      ignore_index, labels_are_i64, site);
}

void pcc_cuda_cross_entropy_grad_bf16(pcc_cuda_context *ctx,
                                      const uint16_t *logits,
                                      const void *labels, const float *grad,
                                      void *y, int y_is_bf16, int64_t rows,
                                      int64_t classes, int64_t ignore_index,
                                      int labels_are_i64, int site) {
  if (y_is_bf16)
    crossEntropy<true>(ctx, logits, labels, grad, static_cast<uint16_t *>(y),
                       rows, classes, ignore_index, labels_are_i64, site);
  else
    crossEntropy<true>(ctx, logits, labels, grad, static_cast<float *>(y), rows,
                       classes, ignore_index, labels_are_i64, site);
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


//===----------------------------------------------------------------------===//
// Training: gradients of conv and pooling, running statistics
//===----------------------------------------------------------------------===//
//
// Every gradient is a gather: one thread (conv's weight gradient: one warp
// or block) per element it writes, summing its terms in a fixed order, so
// each run gives the same bits (no atomics). The pooling gradients add
// their terms in pcc_cpu_*_pool_grad_f32's order (output positions
// ascending) and match the CPU bit for bit; the conv gradients, which the
// CPU forms with SGEMM, accumulate with explicit single-rounding FMAs.

namespace {
/// Checks the rank (recording a failure for `what`); false when the call
/// must not go on.
bool windowFor(pcc_cuda_context *ctx, const char *what, Window &w,
               int64_t rank, const int64_t *inShape, const int64_t *outShape,
               const int64_t *kernel, const int64_t *strides,
               const int64_t *pads, const int64_t *dilations) {
  if (makeWindow(w, rank, inShape, outShape, kernel, strides, pads,
                 dilations))
    return true;
  setPending(ctx, std::string(what) + ": " + std::to_string(rank) +
                      " spatial dimensions are not supported (1 to 3 are)");
  return false;
}

/// Checks that `groups` divides both channel counts.
bool groupsFit(pcc_cuda_context *ctx, const char *what, int64_t groups,
               int64_t c, int64_t m) {
  if (groups >= 1 && c % groups == 0 && m % groups == 0)
    return true;
  setPending(ctx, std::string(what) + ": " + std::to_string(groups) +
                      " groups do not divide " + std::to_string(c) +
                      " input and " + std::to_string(m) + " output channels");
  return false;
}

/// windowFor and groupsFit for a convolution of `inShape` [N, C, ...] by
/// `wShape` [M, C / groups, ...].
bool convWindowFor(pcc_cuda_context *ctx, const char *what, Window &w,
                   int64_t rank, const int64_t *inShape, const int64_t *wShape,
                   const int64_t *outShape, const int64_t *strides,
                   const int64_t *pads, const int64_t *dilations,
                   int64_t groups) {
  return windowFor(ctx, what, w, rank, inShape, outShape, wShape + 2, strides,
                   pads, dilations) &&
         groupsFit(ctx, what, groups, inShape[1], wShape[0]);
}

/// The coordinates of offset `i` within a [n0, n1, n2] block.
__device__ inline void unflatten(int64_t i, const int64_t n[3], int64_t c[3]) {
  c[2] = i % n[2];
  i /= n[2];
  c[1] = i % n[1];
  c[0] = i / n[1];
}

/// The output coordinate along dimension d whose kernel tap kd reads input
/// coordinate i (od * stride - padBegin + kd * dilation == i), or -1.
__device__ inline int64_t coveringOutput(const Window &w, int d, int64_t i,
                                         int64_t kd) {
  int64_t num = i + w.padBegin[d] - kd * w.dilation[d];
  if (num < 0 || num % w.stride[d] != 0)
    return -1;
  int64_t od = num / w.stride[d];
  return od < w.out[d] ? od : -1;
}


/// Calls f(o) for every output position o whose window covers input
/// coordinates `id`, in ascending order of o (the CPU's order of
/// accumulation): each dimension's taps run backwards, so its output
/// coordinates run forwards. Also passes the kernel position.
template <typename F>
__device__ inline void forCoveringOutputs(const Window &w, const int64_t id[3],
                                          F f) {
  for (int64_t k0 = w.kernel[0] - 1; k0 >= 0; --k0) {
    int64_t o0 = coveringOutput(w, 0, id[0], k0);
    if (o0 < 0)
      continue;
    for (int64_t k1 = w.kernel[1] - 1; k1 >= 0; --k1) {
      int64_t o1 = coveringOutput(w, 1, id[1], k1);
      if (o1 < 0)
        continue;
      for (int64_t k2 = w.kernel[2] - 1; k2 >= 0; --k2) {
        int64_t o2 = coveringOutput(w, 2, id[2], k2);
        if (o2 < 0)
          continue;
        f((o0 * w.out[1] + o1) * w.out[2] + o2,
          (k0 * w.kernel[1] + k1) * w.kernel[2] + k2);
      }
    }
  }
}

/// dx[b, ch, i] = sum over the output channels j of ch's group and the
/// taps k whose output position o reads i of w[j, ch % cg, k] * dy[b, j, o].
/// One thread per dx element.
__global__ void convGradInputKernel(const float *dy, const float *w, float *dx,
                                    Window win, int64_t c, int64_t m,
                                    int64_t cg, int64_t mg, int64_t count) {
  for (int64_t t = threadIndex(); t < count; t += threadCount()) {
    int64_t i = t % win.inCount, plane = t / win.inCount;
    int64_t ch = plane % c, b = plane / c;
    int64_t g = ch / cg, cl = ch % cg;
    int64_t id[3];
    unflatten(i, win.in, id);
    const float *dyGroup = dy + (b * m + g * mg) * win.outCount;
    const float *wGroup = w + (g * mg * cg + cl) * win.kernelCount;
    int64_t wStep = cg * win.kernelCount; // one output channel further
    float acc = 0.0f;
    forCoveringOutputs(win, id, [&](int64_t o, int64_t k) {
      for (int64_t j = 0; j < mg; ++j)
        acc = __fmaf_rn(wGroup[j * wStep + k], dyGroup[j * win.outCount + o],
                        acc);
    });
    dx[t] = acc;
  }
}

struct FloatSumOp {
  __device__ float operator()(float a, float b) const { return __fadd_rn(a, b); }
};

/// dw[j, cl, k] = sum over images b and output positions o of
/// dy[b, j, o] * x[b, g * cg + cl, source(o, k)], g = j / mg. One warp or
/// block per dw element; the lanes take (b, o) pairs in turn, then a
/// fixed-shape tree reduction adds their sums.
template <bool kWarp>
__global__ void convGradWeightKernel(const float *x, const float *dy, float *dw,
                                     Window win, int64_t n, int64_t c,
                                     int64_t m, int64_t cg, int64_t mg,
                                     int64_t count) {
  using Team = RowTeam<kWarp>;
  __shared__ float shared[32];
  int64_t len = n * win.outCount;
  for (int64_t e = Team::firstRow(); e < count; e += Team::rowStep()) {
    int64_t k = e % win.kernelCount, t = e / win.kernelCount;
    int64_t cl = t % cg, j = t / cg;
    int64_t g = j / mg;
    int64_t kd[3];
    unflatten(k, win.kernel, kd);
    const float *xPlane = x + (g * cg + cl) * win.inCount;
    const float *dyPlane = dy + j * win.outCount;
    float acc = 0.0f;
    for (int64_t r = Team::lane(); r < len; r += Team::size()) {
      int64_t o = r % win.outCount, b = r / win.outCount;
      int64_t od[3];
      unflatten(o, win.out, od);
      int64_t s = 0;
      bool inside = true;
#pragma unroll
      for (int d = 0; d < 3; ++d) {
        int64_t pos = od[d] * win.stride[d] - win.padBegin[d] +
                      kd[d] * win.dilation[d];
        inside = inside && pos >= 0 && pos < win.in[d];
        s = s * win.in[d] + pos;
      }
      if (inside)
        acc = __fmaf_rn(dyPlane[b * m * win.outCount + o],
                        xPlane[b * c * win.inCount + s], acc);
    }
    acc = Team::reduce(acc, FloatSumOp(), shared);
    if (Team::lane() == 0)
      dw[e] = acc;
  }
}

/// The input offset that wins window o in pcc_cpu_max_pool_grad_f32: the
/// first maximum in window order, or the last NaN; -1 for an empty window.
__device__ int64_t maxPoolWinner(const Window &w, const float *in, int64_t o) {
  int64_t winner = -1;
  float best = 0.0f;
  for (int64_t k = 0; k < w.kernelCount; ++k) {
    int64_t s = windowSource(w, o, k);
    if (s >= 0 && (winner < 0 || in[s] > best || isnan(in[s]))) {
      winner = s;
      best = in[s];
    }
  }
  return winner;
}

/// dx[plane, i] = the sum, over the windows that i wins, of their dy, in
/// ascending window order as on the CPU. One thread per dx element.
__global__ void maxPoolGradKernel(const float *x, const float *dy, float *dx,
                                  Window w, int64_t count) {
  for (int64_t t = threadIndex(); t < count; t += threadCount()) {
    int64_t i = t % w.inCount, plane = t / w.inCount;
    const float *in = x + plane * w.inCount;
    const float *grad = dy + plane * w.outCount;
    int64_t id[3];
    unflatten(i, w.in, id);
    float acc = 0.0f;
    forCoveringOutputs(w, id, [&](int64_t o, int64_t) {
      if (maxPoolWinner(w, in, o) == i)
        acc = __fadd_rn(acc, grad[o]);
    });
    dx[t] = acc;
  }
}

/// The divisor of average pooling's window o: its taps inside the input,
/// or (count_include_pad) those inside the padded input, not past the
/// trailing pads (ceil mode). Both sets are products over the dimensions.
__device__ int64_t avgPoolDivisor(const Window &w, int64_t o,
                                  int countIncludePad) {
  int64_t od[3];
  unflatten(o, w.out, od);
  int64_t divisor = 1;
#pragma unroll
  for (int d = 0; d < 3; ++d) {
    int64_t taps = 0;
    for (int64_t kd = 0; kd < w.kernel[d]; ++kd) {
      int64_t pos = od[d] * w.stride[d] - w.padBegin[d] + kd * w.dilation[d];
      taps += countIncludePad ? pos < w.in[d] + w.padEnd[d]
                              : pos >= 0 && pos < w.in[d];
    }
    divisor *= taps;
  }
  return divisor;
}

/// dx[plane, i] = the sum of dy[o] / divisor(o) over the windows o that
/// read i, in ascending order as on the CPU. One thread per dx element.
__global__ void avgPoolGradKernel(const float *dy, float *dx, Window w,
                                  int countIncludePad, int64_t count) {
  for (int64_t t = threadIndex(); t < count; t += threadCount()) {
    int64_t i = t % w.inCount, plane = t / w.inCount;
    const float *grad = dy + plane * w.outCount;
    int64_t id[3];
    unflatten(i, w.in, id);
    float acc = 0.0f;
    forCoveringOutputs(w, id, [&](int64_t o, int64_t) {
      // A window that reads i has at least one tap inside: divisor >= 1.
      int64_t divisor = avgPoolDivisor(w, o, countIncludePad);
      acc = __fadd_rn(acc, __fdiv_rn(grad[o], static_cast<float>(divisor)));
    });
    dx[t] = acc;
  }
}

/// state = momentum * state + keep * (scale * value) in double, keep = 1 -
/// momentum computed on the host, each operation rounded as on the CPU.
__global__ void emaUpdateKernel(float *state, const float *value, int64_t n,
                                double momentum, double keep, double scale) {
  for (int64_t i = threadIndex(); i < n; i += threadCount())
    state[i] = static_cast<float>(
        __dadd_rn(__dmul_rn(momentum, static_cast<double>(state[i])),
                  __dmul_rn(keep, __dmul_rn(scale,
                                            static_cast<double>(value[i])))));
}
/// Dropout: a thread per group of four elements (one Philox call).
__global__ void dropoutKernel(const float *x, float *y, int64_t n,
                              double ratio, float scale, uint32_t stream,
                              uint64_t seed, uint32_t step,
                              uint32_t microbatch) {
  int64_t groups = (n + 3) / 4;
  for (int64_t g = threadIndex(); g < groups; g += threadCount()) {
    pccrt::Philox4 bits = pccrt::dropoutBits(
        seed, static_cast<uint64_t>(g), microbatch, stream, step);
    for (int64_t lane = 0; lane < 4 && 4 * g + lane < n; ++lane) {
      bool keep = pccrt::uniformFromBits(bits.v[lane]) >= ratio;
      y[4 * g + lane] = __fmul_rn(x[4 * g + lane], keep ? scale : 0.0f);
    }
  }
}
} // namespace

extern "C" {

void pcc_cuda_dropout_f32(pcc_cuda_context *ctx, const float *x, float *y,
                          int64_t n, double ratio, int64_t stream,
                          const double *hyper) {
  if (n <= 0)
    return;
  // hyper is host memory: the kernel gets its values.
  dropoutKernel<<<gridFor((n + 3) / 4), kThreads, 0, ctx->stream>>>(
      x, y, n, ratio, static_cast<float>(1.0 / (1.0 - ratio)),
      static_cast<uint32_t>(stream),
      static_cast<uint64_t>(hyper[PCC_HYPER_SEED]),
      static_cast<uint32_t>(hyper[PCC_HYPER_STEP]),
      static_cast<uint32_t>(hyper[PCC_HYPER_MICROBATCH]));
}

void pcc_cuda_conv_grad_input_f32(pcc_cuda_context *ctx, const float *dy,
                                  const float *w, float *dx,
                                  int64_t spatial_rank, const int64_t *in_shape,
                                  const int64_t *w_shape,
                                  const int64_t *out_shape,
                                  const int64_t *strides, const int64_t *pads,
                                  const int64_t *dilations, int64_t groups) {
  Window win;
  if (!convWindowFor(ctx, "pcc_cuda_conv_grad_input_f32", win, spatial_rank,
                     in_shape, w_shape, out_shape, strides, pads, dilations,
                     groups))
    return;
  int64_t n = in_shape[0], c = in_shape[1], m = w_shape[0];
  int64_t count = n * c * win.inCount;
  if (count == 0)
    return;
  convGradInputKernel<<<gridFor(count), kThreads, 0, ctx->stream>>>(
      dy, w, dx, win, c, m, c / groups, m / groups, count);
}

void pcc_cuda_conv_grad_weight_f32(
    pcc_cuda_context *ctx, const float *x, const float *dy, float *dw,
    int64_t spatial_rank, const int64_t *in_shape, const int64_t *w_shape,
    const int64_t *out_shape, const int64_t *strides, const int64_t *pads,
    const int64_t *dilations, int64_t groups) {
  Window win;
  if (!convWindowFor(ctx, "pcc_cuda_conv_grad_weight_f32", win, spatial_rank,
                     in_shape, w_shape, out_shape, strides, pads, dilations,
                     groups))
    return;
  int64_t n = in_shape[0], c = in_shape[1], m = w_shape[0];
  int64_t cg = c / groups, mg = m / groups;
  int64_t count = m * cg * win.kernelCount; // dw elements
  if (count == 0)
    return;
  // Sums of up to kWarpRowLimit terms get a warp each, longer ones a block.
  // An empty batch gives zeros.
  if (n * win.outCount <= kWarpRowLimit)
    convGradWeightKernel<true>
        <<<rowGrid(count, true), kThreads, 0, ctx->stream>>>(
            x, dy, dw, win, n, c, m, cg, mg, count);
  else
    convGradWeightKernel<false>
        <<<rowGrid(count, false), kThreads, 0, ctx->stream>>>(
            x, dy, dw, win, n, c, m, cg, mg, count);
}

void pcc_cuda_max_pool_grad_f32(pcc_cuda_context *ctx, const float *x,
                                const float *dy, float *dx,
                                int64_t spatial_rank, const int64_t *in_shape,
                                const int64_t *out_shape, const int64_t *kernel,
                                const int64_t *strides, const int64_t *pads,
                                const int64_t *dilations) {
  Window w;
  if (!windowFor(ctx, "pcc_cuda_max_pool_grad_f32", w, spatial_rank, in_shape,
                 out_shape, kernel, strides, pads, dilations))
    return;
  int64_t count = in_shape[0] * in_shape[1] * w.inCount;
  if (count == 0)
    return;
  maxPoolGradKernel<<<gridFor(count), kThreads, 0, ctx->stream>>>(x, dy, dx, w,
                                                                  count);
}

void pcc_cuda_avg_pool_grad_f32(pcc_cuda_context *ctx, const float *dy,
                                float *dx, int64_t spatial_rank,
                                const int64_t *in_shape,
                                const int64_t *out_shape, const int64_t *kernel,
                                const int64_t *strides, const int64_t *pads,
                                const int64_t *dilations,
                                int count_include_pad) {
  Window w;
  if (!windowFor(ctx, "pcc_cuda_avg_pool_grad_f32", w, spatial_rank, in_shape,
                 out_shape, kernel, strides, pads, dilations))
    return;
  int64_t count = in_shape[0] * in_shape[1] * w.inCount;
  if (count == 0)
    return;
  avgPoolGradKernel<<<gridFor(count), kThreads, 0, ctx->stream>>>(
      dy, dx, w, count_include_pad, count);
}

void pcc_cuda_ema_update_f32(pcc_cuda_context *ctx, float *state,
                             const float *value, int64_t n, double momentum,
                             double scale) {
  if (n <= 0)
    return;
  emaUpdateKernel<<<gridFor(n), kThreads, 0, ctx->stream>>>(
      state, value, n, momentum, 1.0 - momentum, scale);
}

} // extern "C"
