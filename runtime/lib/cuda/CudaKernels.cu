//===- CudaKernels.cu - CUDA kernels called by generated code -------------===//
//
// The CUDA twin of CpuKernels.cpp: every kernel computes what its CPU
// counterpart computes (same accumulation types, same NaN behaviour),
// asynchronously on the context's stream. GEMMs go to cuBLAS
// (full FP32, no TF32); convolution is im2col into context-owned scratch plus
// cuBLAS; the other kernels are grid-stride loops of 256-thread blocks, with
// warp or block reductions for the row-wise ones.
//
// Errors come in three kinds. Host calls that fail (an allocation, a copy)
// return non-zero at once with a message for pcc_cuda_last_error(). Failures
// found while enqueueing a kernel (a cuBLAS status, unsupported arguments)
// are kept in the context and reported by the next pcc_cuda_check_launch()
// or pcc_cuda_finish(). Bad run-time data (an out-of-range gather index) is
// found on the device: the kernel writes its call site into the context's
// device flag and pcc_cuda_finish() returns it.
//
//===----------------------------------------------------------------------===//

#include "pcc/runtime/CastElement.h"
#include "pcc/runtime/CudaKernels.h"

#include "pcc/runtime/CpuKernels.h"
#include "pcc/runtime/HalfFloat.h"
#include "pcc/runtime/ModelAbi.h"
#include "pcc/runtime/ReduceIdentity.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <initializer_list>
#include <limits>
#include <string>

#include "CudaCommon.cuh"

namespace pcc_cuda {
thread_local std::string lastError;
} // namespace pcc_cuda

using namespace pcc_cuda;


//===----------------------------------------------------------------------===//
// Contexts, memory and errors
//===----------------------------------------------------------------------===//

namespace {
void release(pcc_cuda_context *ctx) {
  (void)cudaSetDevice(ctx->device);
  if (ctx->stream)
    (void)cudaStreamSynchronize(ctx->stream);
  if (ctx->blas)
    cublasDestroy(ctx->blas);
  if (ctx->graph)
    (void)cudaGraphExecDestroy(ctx->graph);
  if (ctx->errorSite)
    (void)cudaFree(ctx->errorSite);
  if (ctx->hostSite)
    (void)cudaFreeHost(ctx->hostSite);
  if (ctx->scratch)
    (void)cudaFree(ctx->scratch);
  if (ctx->stream)
    (void)cudaStreamDestroy(ctx->stream);
  (void)cudaGetLastError();
  delete ctx;
}

/// Reports and clears the pending failure, if any.
int takePending(pcc_cuda_context *ctx) {
  if (ctx->pendingError.empty())
    return 0;
  lastError = ctx->pendingError;
  ctx->pendingError.clear();
  return -1;
}
} // namespace

extern "C" {

const char *pcc_cuda_last_error(void) { return lastError.c_str(); }

int pcc_cuda_device_count(void) {
  int count = 0; // left unwritten when the call fails
  if (cudaError_t err = cudaGetDeviceCount(&count)) {
    fail("no CUDA device: cudaGetDeviceCount", err);
    return 0;
  }
  if (count == 0)
    lastError = "no CUDA device";
  return count;
}

pcc_cuda_context *pcc_cuda_context_create(int device) {
  auto *ctx = new pcc_cuda_context;
  ctx->device = device;
  std::string what =
      "creating a CUDA context on device " + std::to_string(device) + ": ";
  if (cudaError_t err = cudaSetDevice(device)) {
    fail(what + "cudaSetDevice", err);
    release(ctx);
    return nullptr;
  }
  if (cudaError_t err =
          cudaStreamCreateWithFlags(&ctx->stream, cudaStreamNonBlocking)) {
    fail(what + "cudaStreamCreateWithFlags", err);
    release(ctx);
    return nullptr;
  }
  // The default math mode keeps SGEMM in full FP32 (no TF32).
  if (cublasStatus_t s = cublasCreate(&ctx->blas)) {
    ctx->blas = nullptr;
    lastError = what + "cublasCreate: " + cublasGetStatusName(s);
    release(ctx);
    return nullptr;
  }
  if (cublasStatus_t s = cublasSetStream(ctx->blas, ctx->stream)) {
    lastError = what + "cublasSetStream: " + cublasGetStatusName(s);
    release(ctx);
    return nullptr;
  }
  if (cudaError_t err = cudaMalloc(&ctx->errorSite, sizeof(int))) {
    ctx->errorSite = nullptr;
    fail(what + "cudaMalloc", err);
    release(ctx);
    return nullptr;
  }
  if (cudaError_t err = cudaMemset(ctx->errorSite, 0, sizeof(int))) {
    fail(what + "cudaMemset", err);
    release(ctx);
    return nullptr;
  }
  if (cudaError_t err = cudaMallocHost(&ctx->hostSite, sizeof(int))) {
    ctx->hostSite = nullptr;
    fail(what + "cudaMallocHost", err);
    release(ctx);
    return nullptr;
  }
  *ctx->hostSite = 0;
  cudaDeviceProp prop;
  if (cudaError_t err = cudaGetDeviceProperties(&prop, device)) {
    fail(what + "cudaGetDeviceProperties", err);
    release(ctx);
    return nullptr;
  }
  char name[512];
  std::snprintf(name, sizeof(name), "%s (sm_%d%d, %.1f GiB)", prop.name,
                prop.major, prop.minor,
                static_cast<double>(prop.totalGlobalMem) / (1 << 30));
  ctx->name = name;
  return ctx;
}

void pcc_cuda_context_destroy(pcc_cuda_context *ctx) {
  if (ctx)
    release(ctx);
}

const char *pcc_cuda_device_name(const pcc_cuda_context *ctx) {
  return ctx->name.c_str();
}

void *pcc_cuda_stream(pcc_cuda_context *ctx) { return ctx->stream; }

int pcc_cuda_device_ordinal(const pcc_cuda_context *ctx) { return ctx->device; }

int pcc_cuda_malloc(pcc_cuda_context *, void **ptr, int64_t bytes) {
  *ptr = nullptr;
  if (bytes < 0) {
    lastError = "cudaMalloc: negative size " + std::to_string(bytes);
    return -1;
  }
  if (cudaError_t err = cudaMalloc(ptr, static_cast<size_t>(bytes))) {
    *ptr = nullptr;
    return fail("cudaMalloc of " + std::to_string(bytes) + " bytes", err);
  }
  return 0;
}

void pcc_cuda_free(pcc_cuda_context *, void *ptr) {
  if (ptr)
    if (cudaError_t err = cudaFree(ptr))
      fail("cudaFree", err);
}

// The copies go through the context's stream, so they are ordered after the
// kernels already enqueued there (a non-blocking stream does not wait for
// the legacy default stream), and wait for it: the host buffer is free to
// reuse on return.
int pcc_cuda_copy_to_device(pcc_cuda_context *ctx, void *dst, const void *src,
                            int64_t bytes) {
  if (bytes <= 0)
    return 0;
  std::string what = "copying " + std::to_string(bytes) + " bytes to device";
  if (cudaError_t err = cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes),
                                        cudaMemcpyHostToDevice, ctx->stream))
    return fail(what + ": cudaMemcpyAsync", err);
  if (cudaError_t err = cudaStreamSynchronize(ctx->stream))
    return fail(what + ": cudaStreamSynchronize", err);
  return 0;
}

int pcc_cuda_copy_to_host(pcc_cuda_context *ctx, void *dst, const void *src,
                          int64_t bytes) {
  if (bytes <= 0)
    return 0;
  std::string what = "copying " + std::to_string(bytes) + " bytes to host";
  if (cudaError_t err = cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes),
                                        cudaMemcpyDeviceToHost, ctx->stream))
    return fail(what + ": cudaMemcpyAsync", err);
  if (cudaError_t err = cudaStreamSynchronize(ctx->stream))
    return fail(what + ": cudaStreamSynchronize", err);
  return 0;
}

int pcc_cuda_synchronize(pcc_cuda_context *ctx) {
  if (cudaError_t err = cudaStreamSynchronize(ctx->stream))
    return fail("cudaStreamSynchronize", err);
  return 0;
}

} // extern "C"

namespace {
/// After the stream has finished a run: the recorded site (cleared), or -1
/// with a message for a pending error.
int collectSite(pcc_cuda_context *ctx) {
  int site = *ctx->hostSite;
  *ctx->hostSite = 0;
  if (site != 0) {
    if (cudaError_t err =
            cudaMemsetAsync(ctx->errorSite, 0, sizeof(int), ctx->stream))
      return fail("clearing the error flag: cudaMemsetAsync", err);
    if (cudaError_t err = cudaStreamSynchronize(ctx->stream))
      return fail("clearing the error flag: cudaStreamSynchronize", err);
  }
  if (takePending(ctx))
    return -1;
  return site;
}
} // namespace

extern "C" {

int pcc_cuda_finish(pcc_cuda_context *ctx) {
  // The flag travels to pinned memory on the stream, so one wait covers
  // the run and the copy.
  if (cudaError_t err =
          cudaMemcpyAsync(ctx->hostSite, ctx->errorSite, sizeof(int),
                          cudaMemcpyDeviceToHost, ctx->stream))
    return fail("reading the error flag: cudaMemcpyAsync", err);
  if (ctx->capturing)
    return takePending(ctx);
  if (cudaError_t err = cudaStreamSynchronize(ctx->stream))
    return fail("running the model: cudaStreamSynchronize", err);
  return collectSite(ctx);
}

int pcc_cuda_capture_begin(pcc_cuda_context *ctx) {
  if (ctx->graph) {
    (void)cudaGraphExecDestroy(ctx->graph);
    ctx->graph = nullptr;
  }
  // Relaxed: conv may look up its (already grown) scratch buffer.
  if (cudaError_t err =
          cudaStreamBeginCapture(ctx->stream, cudaStreamCaptureModeRelaxed))
    return fail("cudaStreamBeginCapture", err);
  ctx->capturing = true;
  return 0;
}

int pcc_cuda_capture_end(pcc_cuda_context *ctx) {
  ctx->capturing = false;
  cudaGraph_t graph = nullptr;
  if (cudaError_t err = cudaStreamEndCapture(ctx->stream, &graph))
    return fail("cudaStreamEndCapture", err);
  cudaError_t err = cudaGraphInstantiate(&ctx->graph, graph, 0);
  (void)cudaGraphDestroy(graph);
  if (err) {
    ctx->graph = nullptr;
    return fail("cudaGraphInstantiate", err);
  }
  return 0;
}

int pcc_cuda_graph_run(pcc_cuda_context *ctx) {
  if (!ctx->graph) {
    lastError = "pcc_cuda_graph_run: no captured run";
    return -1;
  }
  if (cudaError_t err = cudaGraphLaunch(ctx->graph, ctx->stream))
    return fail("cudaGraphLaunch", err);
  if (cudaError_t err = cudaStreamSynchronize(ctx->stream))
    return fail("running the model graph: cudaStreamSynchronize", err);
  return collectSite(ctx);
}

int pcc_cuda_check_launch(pcc_cuda_context *ctx) {
  if (cudaError_t err = cudaGetLastError()) {
    lastError = std::string("kernel launch: ") + cudaGetErrorString(err);
    return -1;
  }
  return takePending(ctx);
}

} // extern "C"

//===----------------------------------------------------------------------===//
// GEMM
//===----------------------------------------------------------------------===//

namespace {
/// Whether every GEMM dimension fits cuBLAS's 32-bit ints (else the pending
/// error says which does not).
bool fitsCublas(pcc_cuda_context *ctx, const char *what,
                std::initializer_list<int64_t> dims) {
  for (int64_t v : dims)
    if (v > INT_MAX) {
      setPending(ctx, std::string(what) + ": GEMM dimension " +
                          std::to_string(v) +
                          " exceeds the 32-bit range of cuBLAS");
      return false;
    }
  return true;
}

/// Row-major c[i] = op(a[i]) x op(b[i]) for i < batch (k >= 1), strides in
/// elements. cuBLAS is column-major, and a row-major matrix read as
/// column-major is its transpose; so compute c^T = op(b)^T op(a)^T, i.e.
/// pass the operands swapped with the same transpose flags and leading
/// dimensions: the result lands in c as row-major m x n with row pitch ldc.
bool gemm(pcc_cuda_context *ctx, const char *what, bool transA, bool transB,
          int64_t batch, int64_t m, int64_t n, int64_t k, const float *a,
          int64_t lda, int64_t strideA, const float *b, int64_t ldb,
          int64_t strideB, float *c, int64_t ldc, int64_t strideC) {
  if (!fitsCublas(ctx, what, {batch, m, n, k, lda, ldb, ldc}))
    return false;
  const float alpha = 1.0f, beta = 0.0f;
  cublasStatus_t s = cublasSgemmStridedBatched(
      ctx->blas, transB ? CUBLAS_OP_T : CUBLAS_OP_N,
      transA ? CUBLAS_OP_T : CUBLAS_OP_N, int(n), int(m), int(k), &alpha, b,
      int(ldb), strideB, a, int(lda), strideA, &beta, c, int(ldc), strideC,
      int(batch));
  if (s != CUBLAS_STATUS_SUCCESS) {
    setPending(ctx, std::string(what) + ": cublasSgemmStridedBatched: " +
                        cublasGetStatusName(s));
    return false;
  }
  return true;
}

/// `gemm` on 16-bit operands and result (`type`: bf16 or fp16) with fp32
/// accumulation (tensor cores): torch.autocast's matmul.
bool gemm16(pcc_cuda_context *ctx, const char *what, cudaDataType type,
            cudaDataType outType, bool transA, bool transB, int64_t batch,
            int64_t m, int64_t n, int64_t k, const void *a, int64_t lda,
            int64_t strideA, const void *b, int64_t ldb, int64_t strideB,
            void *c, int64_t ldc, int64_t strideC) {
  return gemmEx(ctx, what, type, outType, transA, transB, batch, m, n, k, a,
                lda, strideA, b, ldb, strideB, 0.0f, c, ldc, strideC);
}

/// Zeroes `count` floats: the product over an empty inner dimension.
void zero(pcc_cuda_context *ctx, const char *what, float *y, int64_t count) {
  if (cudaError_t err =
          cudaMemsetAsync(y, 0, count * sizeof(float), ctx->stream))
    setPending(ctx, std::string(what) + ": cudaMemsetAsync", err);
}
} // namespace

bool pcc_cuda::gemmEx(pcc_cuda_context *ctx, const char *what,
                      cudaDataType type, cudaDataType outType, bool transA,
                      bool transB, int64_t batch, int64_t m, int64_t n,
                      int64_t k, const void *a, int64_t lda, int64_t strideA,
                      const void *b, int64_t ldb, int64_t strideB, float beta,
                      void *c, int64_t ldc, int64_t strideC) {
  if (!fitsCublas(ctx, what, {batch, m, n, k, lda, ldb, ldc}))
    return false;
  const float alpha = 1.0f;
  // Column-major cuBLAS computes c^T = op(b)^T op(a)^T.
  cublasStatus_t s = cublasGemmStridedBatchedEx(
      ctx->blas, transB ? CUBLAS_OP_T : CUBLAS_OP_N,
      transA ? CUBLAS_OP_T : CUBLAS_OP_N, int(n), int(m), int(k), &alpha, b,
      type, int(ldb), strideB, a, type, int(lda), strideA, &beta, c, outType,
      int(ldc), strideC, int(batch), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  if (s != CUBLAS_STATUS_SUCCESS) {
    setPending(ctx, std::string(what) + ": cublasGemmStridedBatchedEx: " +
                        cublasGetStatusName(s));
    return false;
  }
  return true;
}

extern "C" void pcc_cuda_matmul_f32(pcc_cuda_context *ctx, const float *a,
                                    const float *b, float *c, int64_t batch,
                                    int64_t m, int64_t n, int64_t k,
                                    int trans_a, int trans_b, int64_t stride_a,
                                    int64_t stride_b) {
  const char *what = "pcc_cuda_matmul_f32";
  if (batch <= 0 || m <= 0 || n <= 0)
    return;
  if (k <= 0) {
    zero(ctx, what, c, batch * m * n);
    return;
  }
  int64_t lda = trans_a ? m : k, ldb = trans_b ? k : n;
  // A shared right operand and contiguous, untransposed left operands form
  // one tall GEMM: [batch * m, k] x [k, n].
  if (batch > 1 && stride_b == 0 && !trans_a && stride_a == m * k) {
    gemm(ctx, what, false, trans_b, 1, batch * m, n, k, a, lda, 0, b, ldb, 0, c,
         n, 0);
    return;
  }
  gemm(ctx, what, trans_a, trans_b, batch, m, n, k, a, lda, stride_a, b, ldb,
       stride_b, c, n, m * n);
}

namespace {
/// pcc_cuda_matmul_f32's shapes on 16-bit operands.
void matmul16(pcc_cuda_context *ctx, const char *what, cudaDataType type,
              cudaDataType outType, const void *a, const void *b, void *c,
              int64_t batch, int64_t m, int64_t n, int64_t k, int trans_a,
              int trans_b, int64_t stride_a, int64_t stride_b) {
  if (batch <= 0 || m <= 0 || n <= 0)
    return;
  if (k <= 0) {
    int64_t bytes = batch * m * n * (outType == CUDA_R_32F ? 4 : 2);
    if (cudaError_t err = cudaMemsetAsync(c, 0, bytes, ctx->stream))
      setPending(ctx, std::string(what) + ": cudaMemsetAsync", err);
    return;
  }
  int64_t lda = trans_a ? m : k, ldb = trans_b ? k : n;
  if (batch > 1 && stride_b == 0 && !trans_a && stride_a == m * k) {
    gemm16(ctx, what, type, outType, false, trans_b, 1, batch * m, n, k, a, lda,
           0, b, ldb, 0, c, n, 0);
    return;
  }
  gemm16(ctx, what, type, outType, trans_a, trans_b, batch, m, n, k, a, lda,
         stride_a, b, ldb, stride_b, c, n, m * n);
}
} // namespace

extern "C" void pcc_cuda_matmul_bf16(pcc_cuda_context *ctx, const void *a,
                                     const void *b, void *c, int64_t batch,
                                     int64_t m, int64_t n, int64_t k,
                                     int trans_a, int trans_b, int64_t stride_a,
                                     int64_t stride_b) {
  matmul16(ctx, "pcc_cuda_matmul_bf16", CUDA_R_16BF, CUDA_R_16BF, a, b, c,
           batch, m, n, k, trans_a, trans_b, stride_a, stride_b);
}

extern "C" void pcc_cuda_matmul_bf16_f32(pcc_cuda_context *ctx, const void *a,
                                         const void *b, float *c, int64_t batch,
                                         int64_t m, int64_t n, int64_t k,
                                         int trans_a, int trans_b,
                                         int64_t stride_a, int64_t stride_b) {
  matmul16(ctx, "pcc_cuda_matmul_bf16_f32", CUDA_R_16BF, CUDA_R_32F, a, b, c,
           batch, m, n, k, trans_a, trans_b, stride_a, stride_b);
}

extern "C" void pcc_cuda_matmul_f16_f32(pcc_cuda_context *ctx, const void *a,
                                        const void *b, float *c, int64_t batch,
                                        int64_t m, int64_t n, int64_t k,
                                        int trans_a, int trans_b,
                                        int64_t stride_a, int64_t stride_b) {
  matmul16(ctx, "pcc_cuda_matmul_f16_f32", CUDA_R_16F, CUDA_R_32F, a, b, c,
           batch, m, n, k, trans_a, trans_b, stride_a, stride_b);
}

extern "C" void pcc_cuda_matmul_f16(pcc_cuda_context *ctx, const void *a,
                                    const void *b, void *c, int64_t batch,
                                    int64_t m, int64_t n, int64_t k,
                                    int trans_a, int trans_b, int64_t stride_a,
                                    int64_t stride_b) {
  matmul16(ctx, "pcc_cuda_matmul_f16", CUDA_R_16F, CUDA_R_16F, a, b, c, batch,
           m, n, k, trans_a, trans_b, stride_a, stride_b);
}

//===----------------------------------------------------------------------===//
// Data movement: strided copies and gather
//===----------------------------------------------------------------------===//

namespace {
/// A copy of `count` units (1, 2, 4 or 8 bytes); an element wider than its
/// unit adds an innermost dimension, hence one more than kMaxRank.
struct StridedCopy {
  int rank;
  int64_t shape[kMaxRank + 1], xStride[kMaxRank + 1], yStride[kMaxRank + 1];
  int64_t xOffset, yOffset, count;
};

template <typename T>
__global__ void copyStridedKernel(const T *x, T *y, StridedCopy g) {
  for (int64_t i = threadIndex(); i < g.count; i += threadCount()) {
    int64_t rem = i, xi = g.xOffset, yi = g.yOffset;
    for (int d = g.rank - 1; d >= 0; --d) {
      int64_t idx = rem % g.shape[d];
      rem /= g.shape[d];
      xi += idx * g.xStride[d];
      yi += idx * g.yStride[d];
    }
    y[yi] = x[xi];
  }
}

/// The widest unit (8, 4, 2 or 1 bytes) that divides `bytes` and the
/// alignment of both pointers.
int64_t unitFor(int64_t bytes, const void *x, const void *y) {
  int64_t unit = 8;
  while (unit > 1 && (bytes % unit || reinterpret_cast<uintptr_t>(x) % unit ||
                      reinterpret_cast<uintptr_t>(y) % unit))
    unit /= 2;
  return unit;
}

template <typename T>
void launchCopy(pcc_cuda_context *ctx, const void *x, void *y,
                const StridedCopy &g) {
  copyStridedKernel<T><<<gridFor(g.count), kThreads, 0, ctx->stream>>>(
      static_cast<const T *>(x), static_cast<T *>(y), g);
}

/// Where a gather reads: rows [blockStart, blockStart + blockDim) of a
/// dimension of size axisDim are in `data` (the whole table when blockStart
/// is 0 and blockDim is axisDim); see pcc_cuda_gather_block.
struct GatherBlock {
  int64_t blockDim, blockStart, axisDim;
};

/// Gathers rows of `units` T-sized units; rows in another block are zero.
template <typename T, typename Index>
__global__ void gatherKernel(const T *data, const Index *indices, T *y,
                             GatherBlock b, int64_t units, int64_t numIndices,
                             int64_t count, int *errorSite, int site) {
  for (int64_t i = threadIndex(); i < count; i += threadCount()) {
    int64_t u = i % units, row = i / units;
    int64_t j = row % numIndices, o = row / numIndices;
    int64_t idx = indices[j];
    if (idx < -b.axisDim || idx >= b.axisDim) {
      // Keep the first site: later kernels find the flag already set.
      atomicCAS(errorSite, 0, site);
      y[i] = T(0);
      continue;
    }
    if (idx < 0)
      idx += b.axisDim;
    idx -= b.blockStart;
    y[i] = idx >= 0 && idx < b.blockDim
               ? data[(o * b.blockDim + idx) * units + u]
               : T(0);
  }
}

template <typename T, typename Index>
void launchGather(pcc_cuda_context *ctx, const void *data, const void *indices,
                  void *y, GatherBlock b, int64_t units, int64_t numIndices,
                  int64_t count, int site) {
  gatherKernel<T, Index><<<gridFor(count), kThreads, 0, ctx->stream>>>(
      static_cast<const T *>(data), static_cast<const Index *>(indices),
      static_cast<T *>(y), b, units, numIndices, count, ctx->errorSite, site);
}

template <typename Index>
void gather(pcc_cuda_context *ctx, const void *data, const void *indices,
            void *y, int64_t elemSize, int64_t outer, GatherBlock b,
            int64_t inner, int64_t numIndices, int site) {
  int64_t rowBytes = inner * elemSize;
  int64_t count = outer * numIndices * rowBytes;
  if (count == 0) {
    if (numIndices > 0)
      checkIndicesKernel<Index>
          <<<gridFor(numIndices), kThreads, 0, ctx->stream>>>(
              static_cast<const Index *>(indices), b.axisDim, numIndices,
              ctx->errorSite, site);
    return;
  }
  // Rows are contiguous: move them in the widest unit they allow.
  int64_t unit = unitFor(rowBytes, data, y);
  int64_t units = rowBytes / unit;
  count /= unit;
  switch (unit) {
  case 8:
    launchGather<uint64_t, Index>(ctx, data, indices, y, b, units, numIndices,
                                  count, site);
    break;
  case 4:
    launchGather<uint32_t, Index>(ctx, data, indices, y, b, units, numIndices,
                                  count, site);
    break;
  case 2:
    launchGather<uint16_t, Index>(ctx, data, indices, y, b, units, numIndices,
                                  count, site);
    break;
  default:
    launchGather<uint8_t, Index>(ctx, data, indices, y, b, units, numIndices,
                                 count, site);
  }
}
} // namespace

extern "C" {

void pcc_cuda_copy_strided(pcc_cuda_context *ctx, const void *x, void *y,
                           int64_t elem_size, int64_t rank,
                           const int64_t *shape, const int64_t *x_strides,
                           int64_t x_offset, const int64_t *y_strides,
                           int64_t y_offset) {
  if (rank < 0 || rank > kMaxRank || elem_size < 1) {
    setPending(ctx, "pcc_cuda_copy_strided: rank " + std::to_string(rank) +
                        " with elements of " + std::to_string(elem_size) +
                        " bytes is not supported (rank <= 8)");
    return;
  }
  if (product(shape, rank) == 0)
    return;
  // Count in units; an element of several units is an innermost dimension.
  int64_t unit = unitFor(elem_size, x, y), per = elem_size / unit;
  int64_t sizes[kMaxRank + 1], xs[kMaxRank + 1], ys[kMaxRank + 1];
  for (int64_t d = 0; d < rank; ++d) {
    sizes[d] = shape[d];
    xs[d] = x_strides[d] * per;
    ys[d] = y_strides[d] * per;
  }
  sizes[rank] = per;
  xs[rank] = ys[rank] = 1;
  // Drop unit dimensions and merge neighbours that are contiguous on both
  // sides: fewer divisions per element, and plain copies become rank 1.
  StridedCopy g;
  g.rank = 0;
  g.xOffset = x_offset * per;
  g.yOffset = y_offset * per;
  g.count = 1;
  for (int64_t d = 0; d <= rank; ++d) {
    g.count *= sizes[d];
    if (sizes[d] == 1)
      continue;
    int r = g.rank;
    if (r > 0 && g.xStride[r - 1] == sizes[d] * xs[d] &&
        g.yStride[r - 1] == sizes[d] * ys[d]) {
      g.shape[r - 1] *= sizes[d];
      g.xStride[r - 1] = xs[d];
      g.yStride[r - 1] = ys[d];
      continue;
    }
    g.shape[r] = sizes[d];
    g.xStride[r] = xs[d];
    g.yStride[r] = ys[d];
    ++g.rank;
  }
  if (g.rank == 0 || (g.rank == 1 && g.xStride[0] == 1 && g.yStride[0] == 1)) {
    if (cudaError_t err = cudaMemcpyAsync(
            static_cast<char *>(y) + g.yOffset * unit,
            static_cast<const char *>(x) + g.xOffset * unit, g.count * unit,
            cudaMemcpyDeviceToDevice, ctx->stream))
      setPending(ctx, "pcc_cuda_copy_strided: cudaMemcpyAsync", err);
    return;
  }
  switch (unit) {
  case 8:
    launchCopy<uint64_t>(ctx, x, y, g);
    break;
  case 4:
    launchCopy<uint32_t>(ctx, x, y, g);
    break;
  case 2:
    launchCopy<uint16_t>(ctx, x, y, g);
    break;
  default:
    launchCopy<uint8_t>(ctx, x, y, g);
  }
}

void pcc_cuda_gather(pcc_cuda_context *ctx, const void *data,
                     const void *indices, void *y, int64_t elem_size,
                     int64_t outer, int64_t axis_dim, int64_t inner,
                     int64_t num_indices, int indices_are_i64, int site) {
  pcc_cuda_gather_block(ctx, data, indices, y, elem_size, outer, axis_dim, 0,
                        axis_dim, inner, num_indices, indices_are_i64, site);
}

void pcc_cuda_gather_block(pcc_cuda_context *ctx, const void *data,
                           const void *indices, void *y, int64_t elem_size,
                           int64_t outer, int64_t block_dim,
                           int64_t block_start, int64_t axis_dim, int64_t inner,
                           int64_t num_indices, int indices_are_i64, int site) {
  GatherBlock b{block_dim, block_start, axis_dim};
  if (indices_are_i64)
    gather<int64_t>(ctx, data, indices, y, elem_size, outer, b, inner,
                    num_indices, site);
  else
    gather<int32_t>(ctx, data, indices, y, elem_size, outer, b, inner,
                    num_indices, site);
}

} // extern "C"

//===----------------------------------------------------------------------===//
// Row-wise normalisations: softmax, layer norm, batch norm
//===----------------------------------------------------------------------===//

namespace {
/// The last pass of softmax over one row (elements `stride` apart), as on
/// the CPU: the maximum subtracted in float, the sum of exponentials in
/// double; `flags` as pcc_cpu_softmax_f32's.
__device__ void writeSoftmax(const float *in, float *out, int64_t len,
                             int64_t stride, float maxValue, double sum,
                             int flags, int64_t first, int64_t step) {
  bool nanToZero = flags & PCC_SOFTMAX_NAN_TO_ZERO;
  if (flags & PCC_SOFTMAX_LOG) {
    float logSum = static_cast<float>(log(sum));
    for (int64_t l = first; l < len; l += step) {
      float v = in[l * stride] - maxValue - logSum;
      out[l * stride] = nanToZero && isnan(v) ? 0.0f : v;
    }
  } else {
    float inv = static_cast<float>(1.0 / sum);
    for (int64_t l = first; l < len; l += step) {
      float v = expf(in[l * stride] - maxValue) * inv;
      out[l * stride] = nanToZero && isnan(v) ? 0.0f : v;
    }
  }
}

/// Softmax of contiguous rows, one warp or one block per row.
template <bool kWarp>
__global__ void softmaxRowsKernel(const float *x, float *y, int64_t rows,
                                  int64_t len, int flags) {
  using Team = RowTeam<kWarp>;
  __shared__ float sharedMax[32];
  __shared__ double sharedSum[32];
  for (int64_t r = Team::firstRow(); r < rows; r += Team::rowStep()) {
    const float *in = x + r * len;
    float maxValue = -INFINITY;
    for (int64_t l = Team::lane(); l < len; l += Team::size())
      maxValue = maxOf(maxValue, in[l]);
    maxValue = Team::reduce(maxValue, MaxOp(), sharedMax);
    double sum = 0;
    for (int64_t l = Team::lane(); l < len; l += Team::size())
      sum += exp(static_cast<double>(in[l] - maxValue));
    sum = Team::reduce(sum, SumOp(), sharedSum);
    writeSoftmax(in, y + r * len, len, 1, maxValue, sum, flags,
                 Team::lane(), Team::size());
  }
}

/// Softmax along a strided axis: one thread per (outer, inner) pair, which
/// keeps neighbouring threads on neighbouring addresses.
__global__ void softmaxStridedKernel(const float *x, float *y, int64_t outer,
                                     int64_t len, int64_t inner,
                                     int flags) {
  for (int64_t i = threadIndex(); i < outer * inner; i += threadCount()) {
    int64_t base = (i / inner) * len * inner + i % inner;
    const float *in = x + base;
    float maxValue = -INFINITY;
    for (int64_t l = 0; l < len; ++l)
      maxValue = maxOf(maxValue, in[l * inner]);
    double sum = 0;
    for (int64_t l = 0; l < len; ++l)
      sum += exp(static_cast<double>(in[l * inner] - maxValue));
    writeSoftmax(in, y + base, len, inner, maxValue, sum, flags, 0, 1);
  }
}

/// Layer norm with the CPU's numerics: mean and population variance
/// accumulated in double (two passes), epsilon inside the square root.
template <bool kWarp>
__global__ void layerNormKernel(const float *x, const float *scale,
                                const float *bias, float *y, int64_t rows,
                                int64_t cols, float epsilon) {
  using Team = RowTeam<kWarp>;
  __shared__ double shared[32];
  for (int64_t r = Team::firstRow(); r < rows; r += Team::rowStep()) {
    const float *in = x + r * cols;
    float *out = y + r * cols;
    double mean = 0, var = 0;
    for (int64_t c = Team::lane(); c < cols; c += Team::size())
      mean += in[c];
    mean = Team::reduce(mean, SumOp(), shared) / cols;
    for (int64_t c = Team::lane(); c < cols; c += Team::size())
      var += (in[c] - mean) * (in[c] - mean);
    var = Team::reduce(var, SumOp(), shared) / cols;
    float inv = static_cast<float>(1.0 / sqrt(var + epsilon));
    float m = static_cast<float>(mean);
    for (int64_t c = Team::lane(); c < cols; c += Team::size())
      out[c] = (in[c] - m) * inv * scale[c] + (bias ? bias[c] : 0.0f);
  }
}

__global__ void batchNormKernel(const float *x, const float *scale,
                                const float *bias, const float *mean,
                                const float *variance, float *y, int64_t c,
                                int64_t spatial, float epsilon, int64_t count) {
  for (int64_t i = threadIndex(); i < count; i += threadCount()) {
    int64_t ch = (i / spatial) % c;
    float a = scale[ch] / sqrtf(variance[ch] + epsilon);
    float b = bias[ch] - mean[ch] * a;
    y[i] = x[i] * a + b;
  }
}
} // namespace

extern "C" {

void pcc_cuda_softmax_f32(pcc_cuda_context *ctx, const float *x, float *y,
                          int64_t outer, int64_t len, int64_t inner,
                          int flags) {
  if (outer * len * inner == 0)
    return;
  if (inner > 1) {
    softmaxStridedKernel<<<gridFor(outer * inner), kThreads, 0, ctx->stream>>>(
        x, y, outer, len, inner, flags);
  } else if (len <= kWarpRowLimit) {
    softmaxRowsKernel<true><<<rowGrid(outer, true), kThreads, 0, ctx->stream>>>(
        x, y, outer, len, flags);
  } else {
    softmaxRowsKernel<false>
        <<<rowGrid(outer, false), kThreads, 0, ctx->stream>>>(x, y, outer, len,
                                                              flags);
  }
}

void pcc_cuda_layer_norm_f32(pcc_cuda_context *ctx, const float *x,
                             const float *scale, const float *bias, float *y,
                             int64_t rows, int64_t cols, float epsilon) {
  if (rows * cols == 0)
    return;
  if (cols <= kWarpRowLimit)
    layerNormKernel<true><<<rowGrid(rows, true), kThreads, 0, ctx->stream>>>(
        x, scale, bias, y, rows, cols, epsilon);
  else
    layerNormKernel<false><<<rowGrid(rows, false), kThreads, 0, ctx->stream>>>(
        x, scale, bias, y, rows, cols, epsilon);
}

void pcc_cuda_batch_norm_f32(pcc_cuda_context *ctx, const float *x,
                             const float *scale, const float *bias,
                             const float *mean, const float *variance, float *y,
                             int64_t n, int64_t c, int64_t spatial,
                             float epsilon) {
  int64_t count = n * c * spatial;
  if (count == 0)
    return;
  batchNormKernel<<<gridFor(count), kThreads, 0, ctx->stream>>>(
      x, scale, bias, mean, variance, y, c, spatial, epsilon, count);
}

} // extern "C"

//===----------------------------------------------------------------------===//
// Reductions and argmax
//===----------------------------------------------------------------------===//

namespace {
/// x's dimensions split into kept and reduced ones, each in order, with
/// their strides in x. y is the kept dimensions in order.
struct ReduceGeometry {
  int keptRank, reducedRank;
  int64_t keptShape[kMaxRank], keptStride[kMaxRank];
  int64_t reducedShape[kMaxRank], reducedStride[kMaxRank];
  int64_t outCount, reducedCount;
};

/// One reduction step as on the CPU (accumulator in double; max and min
/// behave as std::max / std::min, so NaN inputs are skipped by them).
struct ReduceOp {
  int kind;
  __device__ double operator()(double a, double v) const {
    switch (kind) {
    case PCC_REDUCE_MAX:
      return maxOf(a, v);
    case PCC_REDUCE_MIN:
      return minOf(a, v);
    case PCC_REDUCE_PROD:
      return a * v;
    default:
      return a + v;
    }
  }
};

__device__ int64_t keptOffset(const ReduceGeometry &g, int64_t o) {
  int64_t offset = 0;
  for (int d = g.keptRank - 1; d >= 0; --d) {
    offset += (o % g.keptShape[d]) * g.keptStride[d];
    o /= g.keptShape[d];
  }
  return offset;
}

template <typename T>
__device__ T reduceResult(const ReduceGeometry &g, int kind, double acc) {
  return static_cast<T>(kind == PCC_REDUCE_MEAN ? acc / g.reducedCount : acc);
}

/// One thread per output, walking the reduced elements in x's order (the
/// CPU's order, so sums match it exactly).
template <typename T>
__global__ void reduceKernel(const T *x, T *y, ReduceGeometry g, int kind,
                             double init) {
  ReduceOp op{kind};
  for (int64_t o = threadIndex(); o < g.outCount; o += threadCount()) {
    int64_t offset = keptOffset(g, o);
    int64_t coords[kMaxRank] = {};
    double acc = init;
    for (int64_t r = 0; r < g.reducedCount; ++r) {
      acc = op(acc, static_cast<double>(x[offset]));
      for (int d = g.reducedRank - 1; d >= 0; --d) {
        offset += g.reducedStride[d];
        if (++coords[d] < g.reducedShape[d])
          break;
        offset -= g.reducedStride[d] * g.reducedShape[d];
        coords[d] = 0;
      }
    }
    y[o] = reduceResult<T>(g, kind, acc);
  }
}

/// One block per output, for few outputs or long contiguous reductions.
template <typename T>
__global__ void reduceBlockKernel(const T *x, T *y, ReduceGeometry g, int kind,
                                  double init) {
  __shared__ double shared[32];
  ReduceOp op{kind};
  for (int64_t o = blockIdx.x; o < g.outCount; o += gridDim.x) {
    int64_t base = keptOffset(g, o);
    double acc = init;
    for (int64_t r = threadIdx.x; r < g.reducedCount; r += blockDim.x) {
      int64_t offset = base, rem = r;
      for (int d = g.reducedRank - 1; d >= 0; --d) {
        offset += (rem % g.reducedShape[d]) * g.reducedStride[d];
        rem /= g.reducedShape[d];
      }
      acc = op(acc, static_cast<double>(x[offset]));
    }
    acc = blockReduce(acc, op, shared);
    if (threadIdx.x == 0)
      y[o] = reduceResult<T>(g, kind, acc);
  }
}

/// A long reduction into few outputs, in two passes (one block alone would
/// leave the rest of the device idle: a gradient norm's sum of squares over
/// GPT-2's 38.6M-element embedding took 5 ms in one block). Pass one: block
/// (p, o) reduces part p of output o's elements, in order, to a double;
/// pass two combines each output's parts in order: deterministic.
template <typename T>
__global__ void reducePartsKernel(const T *x, double *parts, ReduceGeometry g,
                                  int kind, double init, int64_t count) {
  __shared__ double shared[32];
  ReduceOp op{kind};
  int64_t o = blockIdx.y, p = blockIdx.x;
  int64_t chunk = (g.reducedCount + count - 1) / count;
  int64_t begin = p * chunk, end = minOf(begin + chunk, g.reducedCount);
  int64_t base = keptOffset(g, o);
  double acc = init;
  if (g.reducedRank == 1 && g.reducedStride[0] == 1) {
    // Contiguous (a whole gradient's sum of squares): no index arithmetic.
    for (int64_t r = begin + threadIdx.x; r < end; r += blockDim.x)
      acc = op(acc, static_cast<double>(x[base + r]));
  } else {
    for (int64_t r = begin + threadIdx.x; r < end; r += blockDim.x) {
      int64_t offset = base, rem = r;
      for (int d = g.reducedRank - 1; d >= 0; --d) {
        offset += (rem % g.reducedShape[d]) * g.reducedStride[d];
        rem /= g.reducedShape[d];
      }
      acc = op(acc, static_cast<double>(x[offset]));
    }
  }
  acc = blockReduce(acc, op, shared);
  if (threadIdx.x == 0)
    parts[o * count + p] = acc;
}

template <typename T>
__global__ void reduceFinishKernel(const double *parts, T *y, ReduceGeometry g,
                                   int kind, double init, int64_t count) {
  ReduceOp op{kind};
  for (int64_t o = threadIndex(); o < g.outCount; o += threadCount()) {
    double acc = init;
    for (int64_t p = 0; p < count; ++p)
      acc = op(acc, parts[o * count + p]);
    y[o] = reduceResult<T>(g, kind, acc);
  }
}

/// Each row of a [rows, len] matrix reduced to one value by a warp: the
/// lanes read consecutive elements (coalesced), each lane in order, then
/// the warp's butterfly: deterministic. For many short rows (a norm's
/// gradient: 4096 rows of 768), where a block per row waits on its barriers.
template <typename T>
__global__ void reduceRowsWarpKernel(const T *x, T *y, ReduceGeometry g,
                                     int kind, double init) {
  ReduceOp op{kind};
  int64_t len = g.reducedCount;
  int lane = threadIdx.x % 32;
  for (int64_t row = threadIndex() / 32; row < g.outCount;
       row += threadCount() / 32) {
    const T *in = x + row * len;
    double acc = init;
    for (int64_t c = lane; c < len; c += 32)
      acc = op(acc, static_cast<double>(in[c]));
    acc = warpReduce(acc, op);
    if (lane == 0)
      y[row] = reduceResult<T>(g, kind, acc);
  }
}

/// A reduction over the rows of a [rows, cols] matrix into its columns (a
/// bias's or a norm's gradient): one thread per column, so that a warp
/// reads consecutive elements, and the rows in parts over the grid's y.
/// Part p of column o sums its rows in order into parts[p * cols + o];
/// reduceColumnsFinishKernel combines the parts in order: deterministic.
template <typename T>
__global__ void reduceColumnsKernel(const T *x, double *parts, int64_t rows,
                                    int64_t cols, int kind, double init,
                                    int64_t count) {
  ReduceOp op{kind};
  int64_t o = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t p = blockIdx.y;
  if (o >= cols)
    return;
  int64_t chunk = (rows + count - 1) / count;
  int64_t begin = p * chunk, end = minOf(begin + chunk, rows);
  double acc = init;
  for (int64_t r = begin; r < end; ++r)
    acc = op(acc, static_cast<double>(x[r * cols + o]));
  parts[p * cols + o] = acc;
}

template <typename T>
__global__ void reduceColumnsFinishKernel(const double *parts, T *y,
                                          ReduceGeometry g, int kind,
                                          double init, int64_t count) {
  ReduceOp op{kind};
  for (int64_t o = threadIndex(); o < g.outCount; o += threadCount()) {
    double acc = init;
    for (int64_t p = 0; p < count; ++p)
      acc = op(acc, parts[p * g.outCount + o]);
    y[o] = reduceResult<T>(g, kind, acc);
  }
}

template <typename T>
void reduce(pcc_cuda_context *ctx, const char *what, const T *x, T *y,
            int64_t rank, const int64_t *shape, const int64_t *reduced,
            int kind) {
  if (rank < 0 || rank > kMaxRank) {
    setPending(ctx, std::string(what) + ": rank " + std::to_string(rank) +
                        " is not supported (rank <= 8)");
    return;
  }
  // Drop unit dimensions and merge neighbours of the same kind; the walk
  // over x stays in row-major order.
  int64_t size[kMaxRank];
  bool isReduced[kMaxRank];
  int r = 0;
  for (int64_t d = 0; d < rank; ++d) {
    if (shape[d] == 1)
      continue;
    bool red = reduced[d] != 0;
    if (r > 0 && isReduced[r - 1] == red) {
      size[r - 1] *= shape[d];
    } else {
      size[r] = shape[d];
      isReduced[r++] = red;
    }
  }
  ReduceGeometry g;
  g.keptRank = g.reducedRank = 0;
  for (int d = 0; d < r; ++d)
    ++(isReduced[d] ? g.reducedRank : g.keptRank);
  g.outCount = g.reducedCount = 1;
  int kept = g.keptRank, red = g.reducedRank;
  int64_t stride = 1;
  for (int d = r - 1; d >= 0; --d) {
    if (isReduced[d]) {
      g.reducedShape[--red] = size[d];
      g.reducedStride[red] = stride;
      g.reducedCount *= size[d];
    } else {
      g.keptShape[--kept] = size[d];
      g.keptStride[kept] = stride;
      g.outCount *= size[d];
    }
    stride *= size[d];
  }
  if (g.outCount == 0)
    return;
  T init = pccrt::reduceIdentity<T>(kind);
  // Few outputs with many elements each: in parts, over the whole device.
  constexpr int64_t kPartElements = 16384, kMaxParts = 512;
  if (g.outCount <= 64 && g.reducedCount >= 4 * kPartElements) {
    int64_t count = std::min(kMaxParts, g.reducedCount / kPartElements);
    if (ensureScratch(ctx, g.outCount * count * 8, what)) {
      auto *parts = reinterpret_cast<double *>(ctx->scratch);
      reducePartsKernel<T><<<dim3(static_cast<unsigned>(count),
                                  static_cast<unsigned>(g.outCount)),
                             kThreads, 0, ctx->stream>>>(
          x, parts, g, kind, static_cast<double>(init), count);
      reduceFinishKernel<T><<<1, 64, 0, ctx->stream>>>(
          parts, y, g, kind, static_cast<double>(init), count);
    }
    return;
  }
  // Rows into columns ([rows, cols], the outer dimensions reduced): a
  // thread per column reads coalesced; the rows in up to 256 parts of at
  // least 32.
  if (r == 2 && isReduced[0] && !isReduced[1] && g.reducedCount >= 64) {
    int64_t cols = g.outCount, rows = g.reducedCount;
    int64_t count = std::clamp<int64_t>(rows / 32, 1, 256);
    if (ensureScratch(ctx, cols * count * 8, what)) {
      auto *parts = reinterpret_cast<double *>(ctx->scratch);
      reduceColumnsKernel<T>
          <<<dim3(static_cast<unsigned>((cols + kThreads - 1) / kThreads),
                  static_cast<unsigned>(count)),
             kThreads, 0, ctx->stream>>>(x, parts, rows, cols, kind,
                                         static_cast<double>(init), count);
      reduceColumnsFinishKernel<T><<<gridFor(cols), kThreads, 0, ctx->stream>>>(
          parts, y, g, kind, static_cast<double>(init), count);
    }
    return;
  }
  // Many short contiguous rows: a warp per row.
  if (r == 2 && !isReduced[0] && isReduced[1] && g.reducedCount <= 8192 &&
      g.outCount >= 256) {
    reduceRowsWarpKernel<T>
        <<<gridFor(g.outCount * 32), kThreads, 0, ctx->stream>>>(
            x, y, g, kind, static_cast<double>(init));
    return;
  }
  // A block per output pays off when each output has many inputs and either
  // they are contiguous or there are too few outputs to fill the device.
  bool blockPerOutput = g.reducedCount >= kThreads &&
                        ((r > 0 && isReduced[r - 1]) || g.outCount < 1024);
  if (blockPerOutput)
    reduceBlockKernel<T>
        <<<static_cast<unsigned>(std::min(g.outCount, kMaxBlocks)), kThreads, 0,
           ctx->stream>>>(x, y, g, kind, static_cast<double>(init));
  else
    reduceKernel<T><<<gridFor(g.outCount), kThreads, 0, ctx->stream>>>(
        x, y, g, kind, static_cast<double>(init));
}

/// The first maximum wins: only a strictly greater value replaces it.
__global__ void argmaxKernel(const float *x, int64_t *y, int64_t len,
                             int64_t inner, int64_t count) {
  for (int64_t i = threadIndex(); i < count; i += threadCount()) {
    const float *in = x + (i / inner) * len * inner + i % inner;
    int64_t best = 0;
    for (int64_t l = 1; l < len; ++l)
      if (in[l * inner] > in[best * inner])
        best = l;
    y[i] = best;
  }
}
} // namespace

extern "C" {

void pcc_cuda_reduce_f32(pcc_cuda_context *ctx, const float *x, float *y,
                         int64_t rank, const int64_t *shape,
                         const int64_t *reduced, int kind) {
  reduce(ctx, "pcc_cuda_reduce_f32", x, y, rank, shape, reduced, kind);
}

void pcc_cuda_reduce_i64(pcc_cuda_context *ctx, const int64_t *x, int64_t *y,
                         int64_t rank, const int64_t *shape,
                         const int64_t *reduced, int kind) {
  reduce(ctx, "pcc_cuda_reduce_i64", x, y, rank, shape, reduced, kind);
}

void pcc_cuda_argmax_f32(pcc_cuda_context *ctx, const float *x, int64_t *y,
                         int64_t outer, int64_t len, int64_t inner) {
  int64_t count = outer * inner;
  if (count == 0)
    return;
  argmaxKernel<<<gridFor(count), kThreads, 0, ctx->stream>>>(x, y, len, inner,
                                                             count);
}

} // extern "C"

//===----------------------------------------------------------------------===//
// Sliding windows: convolution and pooling
//===----------------------------------------------------------------------===//

namespace {
std::string badWindow(const char *what, int64_t rank) {
  return std::string(what) + ": " + std::to_string(rank) +
         " spatial dimensions are not supported (1 to 3 are)";
}


/// col[image][channel * kernelCount + k][o] = the input under kernel
/// position k of output position o, 0 in the padding. Per group, the rows
/// of col then match the weights' [C / groups, K...] layout.
__global__ void im2colKernel(const float *x, float *col, Window w,
                             int64_t count) {
  for (int64_t i = threadIndex(); i < count; i += threadCount()) {
    int64_t o = i % w.outCount, t = i / w.outCount;
    int64_t k = t % w.kernelCount, plane = t / w.kernelCount;
    bool inPadded;
    int64_t s = windowSource(w, o, k, inPadded);
    col[i] = s < 0 ? 0.0f : x[plane * w.inCount + s];
  }
}

__global__ void addBiasKernel(float *y, const float *bias, int64_t channels,
                              int64_t planeSize, int64_t count) {
  for (int64_t i = threadIndex(); i < count; i += threadCount())
    y[i] += bias[(i / planeSize) % channels];
}

} // namespace

bool pcc_cuda::ensureScratch(pcc_cuda_context *ctx, int64_t bytes,
                             const char *caller) {
  if (bytes <= ctx->scratchBytes)
    return true;
  std::string what = std::string(caller) + ": growing the scratch";
  if (cudaError_t err = cudaStreamSynchronize(ctx->stream)) {
    setPending(ctx, std::string(what) + ": cudaStreamSynchronize", err);
    return false;
  }
  if (ctx->scratch)
    (void)cudaFree(ctx->scratch);
  ctx->scratch = nullptr;
  ctx->scratchBytes = 0;
  void *p = nullptr;
  if (cudaError_t err = cudaMalloc(&p, static_cast<size_t>(bytes))) {
    setPending(ctx,
               std::string(what) + " to " + std::to_string(bytes) +
                   " bytes: cudaMalloc",
               err);
    return false;
  }
  ctx->scratch = static_cast<float *>(p);
  ctx->scratchBytes = bytes;
  return true;
}

namespace {

/// Max pooling for any element type; padded positions never win.
template <typename T>
__global__ void maxPoolKernel(const T *x, T *y, Window w, T init,
                              int64_t count) {
  for (int64_t i = threadIndex(); i < count; i += threadCount()) {
    int64_t plane = i / w.outCount, o = i % w.outCount;
    const T *in = x + plane * w.inCount;
    T best = init;
    for (int64_t k = 0; k < w.kernelCount; ++k) {
      bool inPadded;
      int64_t s = windowSource(w, o, k, inPadded);
      if (s >= 0)
        best = maxOf(best, in[s]);
    }
    y[i] = best;
  }
}

template <typename T>
void maxPool(pcc_cuda_context *ctx, const char *what, const T *x, T *y,
             int64_t spatialRank, const int64_t *inShape,
             const int64_t *outShape, const int64_t *kernel,
             const int64_t *strides, const int64_t *pads,
             const int64_t *dilations) {
  Window w;
  if (!makeWindow(w, spatialRank, inShape, outShape, kernel, strides, pads,
                  dilations)) {
    setPending(ctx, badWindow(what, spatialRank));
    return;
  }
  int64_t count = inShape[0] * inShape[1] * w.outCount;
  if (count == 0)
    return;
  T init = std::numeric_limits<T>::has_infinity
               ? -std::numeric_limits<T>::infinity()
               : std::numeric_limits<T>::lowest();
  maxPoolKernel<T>
      <<<gridFor(count), kThreads, 0, ctx->stream>>>(x, y, w, init, count);
}

/// Average pooling, summed in double. With count_include_pad the divisor
/// also counts padded positions, but only those within the pads, not those
/// past them in ceil mode (ONNX and PyTorch agree).
__global__ void avgPoolKernel(const float *x, float *y, Window w,
                              int countIncludePad, int64_t count) {
  for (int64_t i = threadIndex(); i < count; i += threadCount()) {
    int64_t plane = i / w.outCount, o = i % w.outCount;
    const float *in = x + plane * w.inCount;
    double sum = 0;
    int64_t inside = 0, padded = 0;
    for (int64_t k = 0; k < w.kernelCount; ++k) {
      bool inPadded;
      int64_t s = windowSource(w, o, k, inPadded);
      if (s >= 0) {
        sum += in[s];
        ++inside;
      } else if (inPadded) {
        ++padded;
      }
    }
    int64_t divisor = countIncludePad ? inside + padded : inside;
    y[i] = divisor ? static_cast<float>(sum / divisor) : 0.0f;
  }
}
} // namespace

extern "C" {

void pcc_cuda_conv_f32(pcc_cuda_context *ctx, const float *x, const float *w,
                       const float *bias, float *y, int64_t spatial_rank,
                       const int64_t *in_shape, const int64_t *w_shape,
                       const int64_t *out_shape, const int64_t *strides,
                       const int64_t *pads, const int64_t *dilations,
                       int64_t groups) {
  const char *what = "pcc_cuda_conv_f32";
  Window win;
  if (!makeWindow(win, spatial_rank, in_shape, out_shape, w_shape + 2, strides,
                  pads, dilations)) {
    setPending(ctx, badWindow(what, spatial_rank));
    return;
  }
  int64_t n = in_shape[0], c = in_shape[1], m = w_shape[0];
  if (groups < 1 || c % groups || m % groups) {
    setPending(ctx, std::string(what) + ": " + std::to_string(groups) +
                        " groups do not divide " + std::to_string(c) +
                        " input and " + std::to_string(m) + " output channels");
    return;
  }
  int64_t cg = c / groups, mg = m / groups;
  int64_t rows = cg * win.kernelCount; // GEMM depth: im2col rows per group
  int64_t outCount = win.outCount;
  if (n * m * outCount == 0)
    return;
  if (rows == 0) {
    zero(ctx, what, y, n * m * outCount);
  } else {
    // A 1x1 kernel with unit strides and no padding reads x as it is.
    bool direct = true;
    for (int d = 0; d < 3; ++d)
      direct = direct && win.kernel[d] == 1 && win.stride[d] == 1 &&
               win.padBegin[d] == 0 && win.out[d] == win.in[d];
    int64_t imageCol = c * win.kernelCount * outCount; // floats per image
    int64_t chunk = n;
    if (!direct) {
      chunk = std::clamp<int64_t>(
          kScratchLimit / (imageCol * int64_t(sizeof(float))), 1, n);
      if (!ensureScratch(ctx, chunk * imageCol * int64_t(sizeof(float)),
                         "pcc_cuda_conv_f32"))
        return;
    }
    for (int64_t b0 = 0; b0 < n; b0 += chunk) {
      int64_t images = std::min(chunk, n - b0);
      const float *col = x + b0 * c * win.inCount;
      if (!direct) {
        im2colKernel<<<gridFor(images * imageCol), kThreads, 0, ctx->stream>>>(
            col, ctx->scratch, win, images * imageCol);
        col = ctx->scratch;
      }
      // Per image and group: y[mg, O] = w_g[mg, rows] x col_g[rows, O].
      // Batch the GEMMs over whichever of groups and images is larger.
      if (groups > images) {
        for (int64_t i = 0; i < images; ++i)
          if (!gemm(ctx, what, false, false, groups, mg, outCount, rows, w,
                    rows, mg * rows, col + i * imageCol, outCount,
                    rows * outCount, y + (b0 + i) * m * outCount, outCount,
                    mg * outCount))
            return;
      } else {
        for (int64_t g = 0; g < groups; ++g)
          if (!gemm(ctx, what, false, false, images, mg, outCount, rows,
                    w + g * mg * rows, rows, 0, col + g * rows * outCount,
                    outCount, imageCol, y + (b0 * m + g * mg) * outCount,
                    outCount, m * outCount))
            return;
      }
    }
  }
  if (bias)
    addBiasKernel<<<gridFor(n * m * outCount), kThreads, 0, ctx->stream>>>(
        y, bias, m, outCount, n * m * outCount);
}

void pcc_cuda_max_pool_f32(pcc_cuda_context *ctx, const float *x, float *y,
                           int64_t spatial_rank, const int64_t *in_shape,
                           const int64_t *out_shape, const int64_t *kernel,
                           const int64_t *strides, const int64_t *pads,
                           const int64_t *dilations) {
  maxPool(ctx, "pcc_cuda_max_pool_f32", x, y, spatial_rank, in_shape, out_shape,
          kernel, strides, pads, dilations);
}

void pcc_cuda_max_pool_u8(pcc_cuda_context *ctx, const uint8_t *x, uint8_t *y,
                          int64_t spatial_rank, const int64_t *in_shape,
                          const int64_t *out_shape, const int64_t *kernel,
                          const int64_t *strides, const int64_t *pads,
                          const int64_t *dilations) {
  maxPool(ctx, "pcc_cuda_max_pool_u8", x, y, spatial_rank, in_shape, out_shape,
          kernel, strides, pads, dilations);
}

void pcc_cuda_max_pool_i8(pcc_cuda_context *ctx, const int8_t *x, int8_t *y,
                          int64_t spatial_rank, const int64_t *in_shape,
                          const int64_t *out_shape, const int64_t *kernel,
                          const int64_t *strides, const int64_t *pads,
                          const int64_t *dilations) {
  maxPool(ctx, "pcc_cuda_max_pool_i8", x, y, spatial_rank, in_shape, out_shape,
          kernel, strides, pads, dilations);
}

void pcc_cuda_avg_pool_f32(pcc_cuda_context *ctx, const float *x, float *y,
                           int64_t spatial_rank, const int64_t *in_shape,
                           const int64_t *out_shape, const int64_t *kernel,
                           const int64_t *strides, const int64_t *pads,
                           const int64_t *dilations, int count_include_pad) {
  Window w;
  if (!makeWindow(w, spatial_rank, in_shape, out_shape, kernel, strides, pads,
                  dilations)) {
    setPending(ctx, badWindow("pcc_cuda_avg_pool_f32", spatial_rank));
    return;
  }
  int64_t count = in_shape[0] * in_shape[1] * w.outCount;
  if (count == 0)
    return;
  avgPoolKernel<<<gridFor(count), kThreads, 0, ctx->stream>>>(
      x, y, w, count_include_pad, count);
}

} // extern "C"

//===----------------------------------------------------------------------===//
// Cast
//===----------------------------------------------------------------------===//

namespace {
/// ONNX Cast, element by element: the same castElement as pcc_cpu_cast.
__global__ void castKernel(const void *x, int fromType, void *y, int toType,
                           int64_t count) {
  for (int64_t i = threadIndex(); i < count; i += threadCount())
    pccrt::castElement(x, fromType, y, toType, i);
}
} // namespace

extern "C" void pcc_cuda_cast(pcc_cuda_context *ctx, const void *x,
                              int from_type, void *y, int to_type,
                              int64_t count) {
  if (count <= 0)
    return;
  castKernel<<<gridFor(count), kThreads, 0, ctx->stream>>>(x, from_type, y,
                                                           to_type, count);
}
