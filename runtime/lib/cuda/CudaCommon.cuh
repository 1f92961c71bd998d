//===- CudaCommon.cuh - what the CUDA kernel files share --------*- CUDA -*-===//
//
// Internal to libpcc_runtime_cuda: the context behind pcc_cuda_context, the
// error helpers, launch geometry and the warp/block reductions that
// CudaKernels.cu (inference kernels) and TrainingKernels.cu (gradient,
// loss and optimizer kernels) both use.
//
//===----------------------------------------------------------------------===//

#ifndef PCC_RUNTIME_CUDA_CUDACOMMON_CUH
#define PCC_RUNTIME_CUDA_CUDACOMMON_CUH

#include "pcc/runtime/CudaKernels.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

struct pcc_cuda_context {
  int device = 0;
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  /// Device flag: the site of the first kernel that found bad data, or 0.
  int *errorSite = nullptr;
  /// Pinned host copy of errorSite, written by the stream at the end of a run.
  int *hostSite = nullptr;
  /// While a run is captured into a CUDA graph, pcc_cuda_finish only
  /// enqueues the error flag's copy; pcc_cuda_graph_run waits.
  bool capturing = false;
  cudaGraphExec_t graph = nullptr;
  /// The im2col buffer of conv, grown on demand.
  float *scratch = nullptr;
  int64_t scratchBytes = 0;
  std::string name;
  /// A failure found while enqueueing work, reported by the next
  /// pcc_cuda_check_launch() or pcc_cuda_finish().
  std::string pendingError;
};

namespace pcc_cuda {
/// The message of the last failing host call on this thread
/// (pcc_cuda_last_error); defined in CudaKernels.cu.
extern thread_local std::string lastError;

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65535 * 8;
constexpr int kMaxRank = 8;
/// Conv processes as many images at once as fit in this much im2col scratch
/// (at least one).
constexpr int64_t kScratchLimit = int64_t(256) << 20;

/// Records a failed CUDA call and clears CUDA's last-error state, so that
/// the next pcc_cuda_check_launch() does not report it again.
inline int fail(const std::string &what, cudaError_t err) {
  lastError = what + ": " + cudaGetErrorString(err);
  (void)cudaGetLastError();
  return -1;
}

/// Grows the context's scratch (conv's im2col, a long reduction's parts,
/// attention's strips) to at least `bytes`, waiting for the kernels that
/// may still read the old buffer; false (a pending error) when it cannot.
bool ensureScratch(pcc_cuda_context *ctx, int64_t bytes, const char *caller);

/// Row-major c[e] = op(a[e]) op(b[e]) + beta c[e] for e < batch through
/// cublasGemmStridedBatchedEx: leading dimensions and strides in elements,
/// operands of `type`, the result of `outType`, fp32 accumulation (no
/// TF32). False (a pending error naming `what`) when cuBLAS refuses.
bool gemmEx(pcc_cuda_context *ctx, const char *what, cudaDataType type,
            cudaDataType outType, bool transA, bool transB, int64_t batch,
            int64_t m, int64_t n, int64_t k, const void *a, int64_t lda,
            int64_t strideA, const void *b, int64_t ldb, int64_t strideB,
            float beta, void *c, int64_t ldc, int64_t strideC);

/// Keeps the first failure found while enqueueing work.
inline void setPending(pcc_cuda_context *ctx, const std::string &message) {
  lastError = message;
  if (ctx->pendingError.empty())
    ctx->pendingError = message;
}

inline void setPending(pcc_cuda_context *ctx, const std::string &what,
                       cudaError_t err) {
  setPending(ctx, what + ": " + cudaGetErrorString(err));
  (void)cudaGetLastError();
}

inline int64_t product(const int64_t *dims, int64_t n) {
  int64_t p = 1;
  for (int64_t i = 0; i < n; ++i)
    p *= dims[i];
  return p;
}

/// Blocks for one thread per item, capped: the kernels loop.
inline unsigned gridFor(int64_t items) {
  return static_cast<unsigned>(
      std::min((items + kThreads - 1) / kThreads, kMaxBlocks));
}

__device__ inline int64_t threadIndex() {
  return int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
}

__device__ inline int64_t threadCount() { return int64_t(gridDim.x) * blockDim.x; }

/// std::max / std::min as the CPU kernels use them: the first argument wins
/// unless the comparison holds, so a NaN second argument is ignored.
template <typename T> __device__ T maxOf(T a, T b) { return a < b ? b : a; }
template <typename T> __device__ T minOf(T a, T b) { return b < a ? b : a; }

struct MaxOp {
  __device__ float operator()(float a, float b) const { return maxOf(a, b); }
};
struct SumOp {
  __device__ double operator()(double a, double b) const { return a + b; }
};

/// All lanes of the warp get the result.
template <typename T, typename Op> __device__ T warpReduce(T v, Op op) {
  for (int offset = 16; offset > 0; offset /= 2)
    v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

/// All threads of the block get the result; `shared` holds 32 values.
template <typename T, typename Op>
__device__ T blockReduce(T v, Op op, T *shared) {
  v = warpReduce(v, op);
  __syncthreads(); // `shared` may still be read by a previous reduction
  if (threadIdx.x % 32 == 0)
    shared[threadIdx.x / 32] = v;
  __syncthreads();
  T r = shared[0];
  for (unsigned w = 1; w < blockDim.x / 32; ++w)
    r = op(r, shared[w]);
  return r;
}

/// The threads that share one row: a warp (short rows) or the whole block.
template <bool kWarp> struct RowTeam {
  __device__ static int64_t firstRow() {
    return kWarp ? threadIndex() / 32 : int64_t(blockIdx.x);
  }
  __device__ static int64_t rowStep() {
    return kWarp ? threadCount() / 32 : int64_t(gridDim.x);
  }
  __device__ static int lane() {
    return kWarp ? threadIdx.x % 32 : threadIdx.x;
  }
  __device__ static int size() { return kWarp ? 32 : blockDim.x; }
  template <typename T, typename Op>
  __device__ static T reduce(T v, Op op, T *shared) {
    if constexpr (kWarp)
      return warpReduce(v, op);
    else
      return blockReduce(v, op, shared);
  }
};

/// Rows up to this long get one warp each, longer ones a block.
constexpr int64_t kWarpRowLimit = 1024;

/// Blocks for `rows` rows, one warp or one block per row.
inline unsigned rowGrid(int64_t rows, bool warpPerRow) {
  return warpPerRow ? gridFor(rows * 32)
                    : static_cast<unsigned>(std::min(rows, kMaxBlocks));
}

/// Index checks alone, for a gather that copies nothing (as on the CPU, a
/// bad index is still an error).
template <typename Index>
__global__ void checkIndicesKernel(const Index *indices, int64_t axisDim,
                                   int64_t numIndices, int *errorSite,
                                   int site) {
  for (int64_t j = threadIndex(); j < numIndices; j += threadCount()) {
    int64_t idx = indices[j];
    if (idx < -axisDim || idx >= axisDim)
      atomicCAS(errorSite, 0, site);
  }
}

/// Sliding-window geometry shared by conv and pooling and their gradients,
/// always with three spatial dimensions: the missing trailing ones have
/// size 1 (and kernel 1, stride 1, no padding), which leaves every offset
/// unchanged.
struct Window {
  int64_t in[3], out[3], kernel[3], stride[3], padBegin[3], padEnd[3],
      dilation[3];
  int64_t inCount, outCount, kernelCount;
};

/// False when the spatial rank is not 1 to 3. pads holds the leading pads,
/// then the trailing ones.
inline bool makeWindow(Window &w, int64_t rank, const int64_t *inShape,
                       const int64_t *outShape, const int64_t *kernel,
                       const int64_t *strides, const int64_t *pads,
                       const int64_t *dilations) {
  if (rank < 1 || rank > 3)
    return false;
  for (int64_t d = 0; d < 3; ++d) {
    bool real = d < rank;
    w.in[d] = real ? inShape[2 + d] : 1;
    w.out[d] = real ? outShape[2 + d] : 1;
    w.kernel[d] = real ? kernel[d] : 1;
    w.stride[d] = real ? strides[d] : 1;
    w.padBegin[d] = real ? pads[d] : 0;
    w.padEnd[d] = real ? pads[rank + d] : 0;
    w.dilation[d] = real ? dilations[d] : 1;
  }
  w.inCount = product(w.in, 3);
  w.outCount = product(w.out, 3);
  w.kernelCount = product(w.kernel, 3);
  return true;
}

/// Input offset of output position `o` and kernel position `k` within one
/// plane, or -1 when it falls in the padding. `inPadded` tells whether the
/// position lies within the padded input: in ceil mode a window may reach
/// past the trailing pads too. (A window never starts before the leading
/// pads, so only the end needs a check.)
__device__ inline int64_t windowSource(const Window &w, int64_t o, int64_t k,
                                bool &inPadded) {
  int64_t offset = 0, scale = 1;
  bool inside = true;
  inPadded = true;
#pragma unroll
  for (int d = 2; d >= 0; --d) {
    int64_t od = o % w.out[d], kd = k % w.kernel[d];
    o /= w.out[d];
    k /= w.kernel[d];
    int64_t pos = od * w.stride[d] - w.padBegin[d] + kd * w.dilation[d];
    if (pos < 0 || pos >= w.in[d]) {
      inside = false;
      if (pos >= w.in[d] + w.padEnd[d])
        inPadded = false;
    }
    offset += pos * scale;
    scale *= w.in[d];
  }
  return inside ? offset : -1;
}

/// The same without the padded-input test (the CPU's Window::source).
__device__ inline int64_t windowSource(const Window &w, int64_t o,
                                       int64_t k) {
  bool inPadded;
  return windowSource(w, o, k, inPadded);
}

} // namespace pcc_cuda

#endif // PCC_RUNTIME_CUDA_CUDACOMMON_CUH
