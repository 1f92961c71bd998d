//===- CpuKernels.cpp - CPU kernels called by generated code --------------===//
//
// fp32 products go to oneDNN's sgemm (or OpenBLAS's, PCC_CPU_SGEMM=openblas),
// convolutions' GEMMs to OpenBLAS (cblas_sgemm); the other kernels are plain
// loops, parallelised over independent rows with OpenMP where the work is
// large.
//
//===----------------------------------------------------------------------===//

#include "pcc/runtime/CpuKernels.h"

#include "CpuError.h"
#include "HalfGemm.h"
#include "RowKernels.h"
#include <oneapi/dnnl/dnnl.h>

#include "pcc/runtime/CastElement.h"
#include "pcc/runtime/FastMath.h"
#include "pcc/runtime/HalfFloat.h"
#include "pcc/runtime/ModelAbi.h"
#include "pcc/runtime/Philox.h"
#include "pcc/runtime/ReduceIdentity.h"

#include <cblas.h>
#include <omp.h>
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

namespace pccrt {
thread_local std::string cpuLastError;
} // namespace pccrt

namespace {
using pccrt::cpuLastError;

int64_t product(const int64_t *dims, int64_t n) {
  int64_t p = 1;
  for (int64_t i = 0; i < n; ++i)
    p *= dims[i];
  return p;
}

/// Work below this many elements is not worth waking OpenMP threads.
constexpr int64_t kParallelThreshold = 1 << 15;

/// sumDouble of the rows' f32 squares, in the same lanes and order.
PCC_ROW_KERNEL double sumSquaresDouble(const float *x, int64_t n) {
  double acc[kSumLanes] = {};
  int64_t c = 0;
  for (; c + kSumLanes <= n; c += kSumLanes)
    for (int j = 0; j < kSumLanes; ++j) {
      float square = x[c + j] * x[c + j];
      acc[j] += static_cast<double>(square);
    }
  for (; c < n; ++c) {
    float square = x[c] * x[c];
    acc[c % kSumLanes] += static_cast<double>(square);
  }
  return combineLanes(acc);
}

/// The casts of mixed precision (pcc-autocast) over [begin, end), as loops
/// that vectorise, in the AVX2 clone too: the runtime is built for
/// x86-64's baseline, where they run at half the rate.
#define PCC_CAST_RANGE(name, From, To, convert)                                \
  PCC_ROW_KERNEL void name(const void *x, void *y, int64_t begin,              \
                           int64_t end) {                                      \
    const auto *in = static_cast<const From *>(x);                             \
    auto *out = static_cast<To *>(y);                                          \
    for (int64_t i = begin; i < end; ++i)                                      \
      out[i] = convert(in[i]);                                                 \
  }
PCC_CAST_RANGE(castF32ToBf16, float, uint16_t, pccrt::floatToBf16)
PCC_CAST_RANGE(castBf16ToF32, uint16_t, float, pccrt::bf16ToFloat)
PCC_CAST_RANGE(castF32ToF16, float, uint16_t, pccrt::floatToHalf)
PCC_CAST_RANGE(castF16ToF32, uint16_t, float, pccrt::halfToFloat)
#undef PCC_CAST_RANGE

#if defined(__x86_64__) && defined(__GNUC__)
/// The two bf16 casts over [begin, end) with non-temporal stores: a large
/// cast's result (a gradient widened into its f32 accumulator, a weight's
/// bf16 copy) is read again only after hundreds of MB of other traffic, so
/// its lines are not worth reading before they are written (a plain store
/// reads each line first: 4 of the 10 bytes an element costs when
/// widening). The values are castBf16ToF32's and castF32ToBf16's.
__attribute__((target("avx2"))) void
streamBf16ToF32(const void *x, void *y, int64_t begin, int64_t end) {
  const auto *in = static_cast<const uint16_t *>(x);
  auto *out = static_cast<float *>(y);
  int64_t i = begin;
  for (; i < end && (reinterpret_cast<uintptr_t>(out + i) & 31) != 0; ++i)
    out[i] = pccrt::bf16ToFloat(in[i]);
  for (; i + 8 <= end; i += 8) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i *>(in + i));
    __m256i w = _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
    _mm256_stream_ps(out + i, _mm256_castsi256_ps(w));
  }
  for (; i < end; ++i)
    out[i] = pccrt::bf16ToFloat(in[i]);
  _mm_sfence();
}

__attribute__((target("avx2"))) void
streamF32ToBf16(const void *x, void *y, int64_t begin, int64_t end) {
  const auto *in = static_cast<const float *>(x);
  auto *out = static_cast<uint16_t *>(y);
  int64_t i = begin;
  for (; i < end && (reinterpret_cast<uintptr_t>(out + i) & 15) != 0; ++i)
    out[i] = pccrt::floatToBf16(in[i]);
  const __m256i lsb = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7fff),
                absMask = _mm256_set1_epi32(0x7fffffff),
                inf = _mm256_set1_epi32(0x7f800000),
                quiet = _mm256_set1_epi32(0x40);
  for (; i + 8 <= end; i += 8) {
    __m256i bits =
        _mm256_castps_si256(_mm256_loadu_ps(in + i)); // as floatToBf16:
    __m256i rounded = _mm256_srli_epi32(
        _mm256_add_epi32(
            bits,
            _mm256_add_epi32(
                bias, _mm256_and_si256(_mm256_srli_epi32(bits, 16), lsb))),
        16);
    __m256i nan = _mm256_or_si256(_mm256_srli_epi32(bits, 16), quiet);
    __m256i isNan =
        _mm256_cmpgt_epi32(_mm256_and_si256(bits, absMask), inf); // signed ok
    __m256i half = _mm256_blendv_epi8(rounded, nan, isNan);
    // Eight 32-bit lanes to eight 16-bit ones (packus works per 128 bits).
    __m256i packed =
        _mm256_permute4x64_epi64(_mm256_packus_epi32(half, half), 0x08);
    _mm_stream_si128(reinterpret_cast<__m128i *>(out + i),
                     _mm256_castsi256_si128(packed));
  }
  for (; i < end; ++i)
    out[i] = pccrt::floatToBf16(in[i]);
  _mm_sfence();
}

/// Casts whose result is at least this large stream it: a core's L2. Every
/// weight's bf16 copy and widened gradient of GPT-2 124M is above it;
/// measured against 8 MiB (only the LM head's then), the step's copies 47
/// to 40 ms and widened gradients 44 to 30 ms.
constexpr int64_t kStreamBytes = int64_t(2) << 20;

bool canStream() {
  static const bool avx2 = __builtin_cpu_supports("avx2");
  return avx2;
}
#else
constexpr int64_t kStreamBytes = INT64_MAX;
bool canStream() { return false; }
constexpr auto streamBf16ToF32 = castBf16ToF32;
constexpr auto streamF32ToBf16 = castF32ToBf16;
#endif

/// A cast's range function over `count` elements, in blocks split over the
/// threads.
void convertAll(void (*range)(const void *, void *, int64_t, int64_t),
                const void *x, void *y, int64_t count) {
  constexpr int64_t kBlock = int64_t(1) << 16;
  int64_t blocks = (count + kBlock - 1) / kBlock;
#pragma omp parallel for if (count > kParallelThreshold)
  for (int64_t b = 0; b < blocks; ++b)
    range(x, y, b * kBlock, std::min(count, (b + 1) * kBlock));
}

} // namespace


extern "C" {

const char *pcc_cpu_last_error(void) { return cpuLastError.c_str(); }

/// fp32 products through oneDNN's sgemm (the default: 7-9% faster GPT-2
/// steps on this machine kind, docs/benchmarks.md) or, with
/// PCC_CPU_SGEMM=openblas, OpenBLAS's. Both give each row of a product the
/// same bits however the rows are split (data parallelism, micro-batches)
/// and from run to run.
static bool sgemmByOnednn() {
  static const bool onednn = [] {
    const char *e = std::getenv("PCC_CPU_SGEMM");
    return !(e && std::strcmp(e, "openblas") == 0);
  }();
  return onednn;
}

const char *pcc_cpu_describe(void) {
  static const std::string text = [] {
    // "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH ...": its first two words.
    std::string config = openblas_get_config();
    size_t space = config.find(' ');
    if (space != std::string::npos)
      space = config.find(' ', space + 1);
    std::string blas =
        config.substr(0, space) + " (" + openblas_get_corename() + " kernels)";
    const dnnl_version_t *v = dnnl_version();
    std::string onednn = "oneDNN " + std::to_string(v->major) + "." +
                         std::to_string(v->minor) + "." +
                         std::to_string(v->patch);
    int threads = omp_get_max_threads();
    // Where oneDNN has no kernels on a 16-bit type for this CPU (bf16
    // without AVX512, fp16 without AVX512-FP16), its products widen to fp32.
    auto half = [&](bool f16) {
      return pccrt::nativeHalfProducts(f16) ? onednn : "widened to fp32";
    };
    return "fp32 products: " + (sgemmByOnednn() ? onednn : blas) +
           ", bf16 products: " + half(false) + ", fp16 products: " +
           half(true) + ", convolutions: " + blas + ", " +
           std::to_string(threads) + " OpenMP thread" +
           (threads == 1 ? "" : "s");
  }();
  return text.c_str();
}

void pcc_cpu_matmul_f32(const float *a, const float *b, float *c, int64_t batch,
                        int64_t m, int64_t n, int64_t k, int trans_a,
                        int trans_b, int64_t stride_a, int64_t stride_b) {
  // OpenBLAS is the faster of the two on the smallest products: up to 2^18
  // multiply-adds (64 x 64 x 64: 4.6 us against oneDNN's 7.2; 16 x 10 x 512:
  // 2.8 against 3.6), which oneDNN's dispatch outweighs; above, oneDNN is
  // 2-5x faster on this machine kind (128 x 128 x 64: 15.8 us against 31.1).
  // The choice depends on the call's whole shape, so layouts that give a
  // call the same rows (dp ranks, micro-batches) compute the same bits.
  constexpr int64_t kSmallProduct = int64_t(1) << 18;
  bool tall = stride_b == 0 && !trans_a && stride_a == m * k;
  int64_t rows = tall ? batch * m : m;
  if (sgemmByOnednn() && rows * n * k > kSmallProduct) {
    // An LM head's product (a transposed weight of a vocabulary's rows):
    // oneDNN's matmul primitive is 1.1-1.2x its sgemm there (GPT-2's
    // 512 x 50,257 x 768 at 290 against 264 GFLOP/s, Llama's 32,000-row
    // head at 280 against 234), and 0.4-1.0x on the blocks' products
    // (docs/benchmarks.md).
    constexpr int64_t kWideProduct = 16384;
    if (tall && trans_b && !trans_a && n >= kWideProduct) {
      pccrt::MatrixView x{a, {0, 0, k, 1}}, w{b, {0, 0, 1, k}},
          y{c, {0, 0, n, 1}};
      if (pccrt::batchedProduct(PCC_F32, PCC_F32, 1, 1, false, rows, n, k, x, w,
                                y, false) == 0)
        return;
      // oneDNN refused the primitive: sgemm below computes it.
    }
    int64_t lda = trans_a ? m : k, ldb = trans_b ? k : n;
    char ta = trans_a ? 'T' : 'N', tb = trans_b ? 'T' : 'N';
    if (tall) {
      dnnl_sgemm(ta, tb, batch * m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, n);
      return;
    }
    for (int64_t i = 0; i < batch; ++i)
      dnnl_sgemm(ta, tb, m, n, k, 1.0f, a + i * stride_a, lda, b + i * stride_b,
                 ldb, 0.0f, c + i * m * n, n);
    return;
  }
  CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans;
  CBLAS_TRANSPOSE tb = trans_b ? CblasTrans : CblasNoTrans;
  int64_t lda = trans_a ? m : k, ldb = trans_b ? k : n;
  // A shared right operand and contiguous, untransposed left operands form
  // one tall GEMM: [batch * m, k] x [k, n].
  if (stride_b == 0 && !trans_a && stride_a == m * k) {
    cblas_sgemm(CblasRowMajor, ta, tb, batch * m, n, k, 1.0f, a, lda, b, ldb,
                0.0f, c, n);
    return;
  }
  for (int64_t i = 0; i < batch; ++i)
    cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, 1.0f, a + i * stride_a, lda,
                b + i * stride_b, ldb, 0.0f, c + i * m * n, n);
}

void pcc_cpu_copy_strided(const void *x, void *y, int64_t elem_size,
                          int64_t rank, const int64_t *shape,
                          const int64_t *x_strides, int64_t x_offset,
                          const int64_t *y_strides, int64_t y_offset) {
  const char *src = static_cast<const char *>(x);
  char *dst = static_cast<char *>(y);
  // Dimensions of size 1 dropped and neighbours contiguous on both sides
  // merged, so that the innermost loop is as long as it can be: a
  // tensor-parallel slice of columns, [rows, 1, columns, 1], was copied
  // one element a call (16K calls, 0.26 ms, for a 64 x 256 slice).
  constexpr int64_t kMaxRank = 16;
  int64_t dims[kMaxRank], xst[kMaxRank], yst[kMaxRank];
  if (rank <= kMaxRank) {
    int64_t n = 0;
    for (int64_t d = 0; d < rank; ++d) {
      if (shape[d] == 0)
        return;
      if (shape[d] == 1)
        continue;
      if (n > 0 && xst[n - 1] == shape[d] * x_strides[d] &&
          yst[n - 1] == shape[d] * y_strides[d]) {
        dims[n - 1] *= shape[d];
        xst[n - 1] = x_strides[d];
        yst[n - 1] = y_strides[d];
        continue;
      }
      dims[n] = shape[d], xst[n] = x_strides[d], yst[n] = y_strides[d];
      ++n;
    }
    rank = n, shape = dims, x_strides = xst, y_strides = yst;
  }
  if (rank == 0) {
    std::memcpy(dst + y_offset * elem_size, src + x_offset * elem_size,
                elem_size);
    return;
  }
  // The innermost dimension is copied in a tight loop (memcpy when both
  // sides are contiguous there); the outer ones are walked with a counter.
  int64_t inner = shape[rank - 1];
  int64_t xs = x_strides[rank - 1], ys = y_strides[rank - 1];
  int64_t outer = product(shape, rank - 1);
  if (inner == 0 || outer == 0)
    return;
#pragma omp parallel for if (outer * inner > kParallelThreshold)
  for (int64_t o = 0; o < outer; ++o) {
    int64_t xi = x_offset, yi = y_offset, rem = o;
    for (int64_t d = rank - 2; d >= 0; --d) {
      int64_t idx = rem % shape[d];
      rem /= shape[d];
      xi += idx * x_strides[d];
      yi += idx * y_strides[d];
    }
    if (xs == 1 && ys == 1) {
      std::memcpy(dst + yi * elem_size, src + xi * elem_size,
                  inner * elem_size);
    } else if (elem_size == 4) {
      const float *s = reinterpret_cast<const float *>(src) + xi;
      float *t = reinterpret_cast<float *>(dst) + yi;
      for (int64_t i = 0; i < inner; ++i)
        t[i * ys] = s[i * xs];
    } else {
      for (int64_t i = 0; i < inner; ++i)
        std::memcpy(dst + (yi + i * ys) * elem_size,
                    src + (xi + i * xs) * elem_size, elem_size);
    }
  }
}

int pcc_cpu_gather(const void *data, const void *indices, void *y,
                   int64_t elem_size, int64_t outer, int64_t axis_dim,
                   int64_t inner, int64_t num_indices, int indices_are_i64) {
  return pcc_cpu_gather_block(data, indices, y, elem_size, outer, axis_dim, 0,
                              axis_dim, inner, num_indices, indices_are_i64);
}

int pcc_cpu_gather_block(const void *data, const void *indices, void *y,
                         int64_t elem_size, int64_t outer, int64_t block_dim,
                         int64_t block_start, int64_t axis_dim, int64_t inner,
                         int64_t num_indices, int indices_are_i64) {
  const char *src = static_cast<const char *>(data);
  char *dst = static_cast<char *>(y);
  int64_t row = inner * elem_size;
  auto index = [&](int64_t j) -> int64_t {
    return indices_are_i64 ? static_cast<const int64_t *>(indices)[j]
                           : static_cast<const int32_t *>(indices)[j];
  };
  for (int64_t j = 0; j < num_indices; ++j) {
    int64_t idx = index(j);
    if (idx < -axis_dim || idx >= axis_dim) {
      cpuLastError = "gather index " + std::to_string(idx) +
                     " is out of range for a dimension of size " +
                     std::to_string(axis_dim);
      return 1;
    }
  }
#pragma omp parallel for if (outer * num_indices * inner > kParallelThreshold)
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < num_indices; ++j) {
      int64_t idx = index(j);
      if (idx < 0)
        idx += axis_dim;
      idx -= block_start;
      char *out = dst + (o * num_indices + j) * row;
      if (idx >= 0 && idx < block_dim)
        std::memcpy(out, src + (o * block_dim + idx) * row, row);
      else
        std::memset(out, 0, row);
    }
  return 0;
}

void pcc_cpu_softmax_f32(const float *x, float *y, int64_t outer, int64_t len,
                         int64_t inner, int flags) {
  bool nanToZero = flags & PCC_SOFTMAX_NAN_TO_ZERO;
#pragma omp parallel for collapse(2) if (outer * len * inner >                 \
                                         kParallelThreshold)
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      const float *in = x + o * len * inner + i;
      float *out = y + o * len * inner + i;
      float maxValue = -std::numeric_limits<float>::infinity();
      if (inner == 1)
        maxValue = rowMax(in, len);
      else
        for (int64_t l = 0; l < len; ++l)
          maxValue = std::max(maxValue, in[l * inner]);
      double sum;
      if (inner == 1) {
        // Contiguous rows: the exponentials vectorise into the output,
        // which then holds the numerators.
        sum = rowExp(in, maxValue, out, len);
      } else {
        sum = 0;
        for (int64_t l = 0; l < len; ++l)
          sum += static_cast<double>(pccrt::fastExp(in[l * inner] - maxValue));
      }
      if (flags & PCC_SOFTMAX_LOG) {
        float logSum = static_cast<float>(std::log(sum));
        for (int64_t l = 0; l < len; ++l)
          out[l * inner] = in[l * inner] - maxValue - logSum;
      } else if (inner == 1) {
        rowScale(out, static_cast<float>(1.0 / sum), len);
      } else {
        float inv = static_cast<float>(1.0 / sum);
        for (int64_t l = 0; l < len; ++l)
          out[l * inner] = pccrt::fastExp(in[l * inner] - maxValue) * inv;
      }
      // A fully masked row (all -inf) or a NaN input gives NaN; the
      // exporters' Where(IsNaN(softmax), 0, softmax) wants 0 there.
      if (nanToZero)
        for (int64_t l = 0; l < len; ++l)
          if (std::isnan(out[l * inner]))
            out[l * inner] = 0.0f;
    }
}

void pcc_cpu_layer_norm_f32(const float *x, const float *scale,
                            const float *bias, float *y, int64_t rows,
                            int64_t cols, float epsilon) {
#pragma omp parallel for if (rows * cols > kParallelThreshold)
  for (int64_t r = 0; r < rows; ++r) {
    const float *in = x + r * cols;
    float *out = y + r * cols;
    double mean = 0, var = 0;
    for (int64_t c = 0; c < cols; ++c)
      mean += in[c];
    mean /= cols;
    for (int64_t c = 0; c < cols; ++c)
      var += (in[c] - mean) * (in[c] - mean);
    var /= cols;
    float inv = static_cast<float>(1.0 / std::sqrt(var + epsilon));
    float m = static_cast<float>(mean);
    for (int64_t c = 0; c < cols; ++c)
      out[c] = (in[c] - m) * inv * scale[c] + (bias ? bias[c] : 0.0f);
  }
}

void pcc_cpu_batch_norm_f32(const float *x, const float *scale,
                            const float *bias, const float *mean,
                            const float *variance, float *y, int64_t n,
                            int64_t c, int64_t spatial, float epsilon) {
#pragma omp parallel for collapse(2) if (n * c * spatial > kParallelThreshold)
  for (int64_t i = 0; i < n; ++i)
    for (int64_t ch = 0; ch < c; ++ch) {
      float a = scale[ch] / std::sqrt(variance[ch] + epsilon);
      float b = bias[ch] - mean[ch] * a;
      const float *in = x + (i * c + ch) * spatial;
      float *out = y + (i * c + ch) * spatial;
      for (int64_t s = 0; s < spatial; ++s)
        out[s] = in[s] * a + b;
    }
}

} // extern "C"

namespace {
/// Reduces x viewed as [outer, middle, inner] over `middle` into acc
/// ([outer, inner], holding the initial values), combining each output's
/// inputs in increasing index order. The combine is a template argument so
/// that the inner loops vectorise; the work splits over rows, or over
/// column blocks when there is one row (a bias gradient's column sums).
template <typename T, typename Combine>
void reduceRuns(const T *x, double *acc, int64_t outer, int64_t middle,
                int64_t inner, Combine combine) {
  int64_t total = outer * middle * inner;
  if (inner == 1) {
#pragma omp parallel for if (total > kParallelThreshold && outer > 1)
    for (int64_t o = 0; o < outer; ++o) {
      const T *row = x + o * middle;
      double a = acc[o];
      for (int64_t r = 0; r < middle; ++r)
        a = combine(a, static_cast<double>(row[r]));
      acc[o] = a;
    }
    return;
  }
  constexpr int64_t kBlock = 512;
  int64_t blocks = (inner + kBlock - 1) / kBlock;
#pragma omp parallel for collapse(2) if (total > kParallelThreshold &&        \
                                             outer * blocks > 1)
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t b = 0; b < blocks; ++b) {
      int64_t begin = b * kBlock, end = std::min(inner, begin + kBlock);
      double *a = acc + o * inner;
      const T *rows = x + o * middle * inner;
      for (int64_t r = 0; r < middle; ++r)
        for (int64_t i = begin; i < end; ++i)
          a[i] = combine(a[i], static_cast<double>(rows[r * inner + i]));
    }
}

template <typename T>
void reduce(const T *x, T *y, int64_t rank, const int64_t *shape,
            const int64_t *reduced, int kind) {
  int64_t total = product(shape, rank);
  // Output strides over the kept dimensions; reduced dimensions stride 0.
  std::vector<int64_t> outStride(rank, 0);
  int64_t outCount = 1, reducedCount = 1;
  for (int64_t d = rank - 1; d >= 0; --d) {
    if (reduced[d]) {
      reducedCount *= shape[d];
    } else {
      outStride[d] = outCount;
      outCount *= shape[d];
    }
  }
  T init = pccrt::reduceIdentity<T>(kind);
  std::vector<double> acc(outCount, static_cast<double>(init));
  // Fast path: the dimensions merge into [outer, reduced, inner] (the
  // common row sums, column sums and middle reductions). Every output still
  // combines its inputs in increasing index order, in double, so the result
  // is the generic loop's to the bit.
  int64_t outer = 1, middle = 1, inner = 1;
  int phase = 0; // 0: before the reduced run, 1: in it, 2: after it
  bool simple = true;
  for (int64_t d = 0; d < rank && simple; ++d) {
    if (shape[d] == 1)
      continue;
    if (reduced[d]) {
      if (phase == 2)
        simple = false;
      phase = 1;
      middle *= shape[d];
    } else if (phase == 0) {
      outer *= shape[d];
    } else {
      phase = 2;
      inner *= shape[d];
    }
  }
  if (simple && total > 0 && inner == 1 && std::is_same_v<T, float> &&
      (kind == PCC_REDUCE_SUM || kind == PCC_REDUCE_MEAN)) {
    // Row sums (a softmax's backward, a loss over classes): each row in
    // sumDouble's four interleaved lanes, which vectorise; one double
    // accumulator is a chain of dependent adds, four cycles each.
#pragma omp parallel for if (total > kParallelThreshold && outer > 1)
    for (int64_t o = 0; o < outer; ++o)
      acc[o] += sumDouble(reinterpret_cast<const float *>(x) + o * middle,
                          middle);
    for (int64_t o = 0; o < outCount; ++o)
      y[o] = static_cast<T>(kind == PCC_REDUCE_MEAN ? acc[o] / reducedCount
                                                    : acc[o]);
    return;
  }
  if (simple && total > 0) {
    switch (kind) {
    case PCC_REDUCE_MAX:
      reduceRuns(x, acc.data(), outer, middle, inner,
                 [](double a, double v) { return std::max(a, v); });
      break;
    case PCC_REDUCE_MIN:
      reduceRuns(x, acc.data(), outer, middle, inner,
                 [](double a, double v) { return std::min(a, v); });
      break;
    case PCC_REDUCE_PROD:
      reduceRuns(x, acc.data(), outer, middle, inner,
                 [](double a, double v) { return a * v; });
      break;
    default:
      reduceRuns(x, acc.data(), outer, middle, inner,
                 [](double a, double v) { return a + v; });
    }
    for (int64_t o = 0; o < outCount; ++o)
      y[o] = static_cast<T>(kind == PCC_REDUCE_MEAN ? acc[o] / reducedCount
                                                    : acc[o]);
    return;
  }
  // [reduced A, kept C, reduced B] (a batch norm's statistics over N, H,
  // W): each output over its A x B inputs in increasing index order, the
  // outputs split over the threads; the generic loop's result to the bit.
  {
    int64_t groups[3] = {1, 1, 1};
    int group = -1;
    bool lastReduced = false, fits = total > 0;
    for (int64_t d = 0; d < rank && fits; ++d) {
      if (shape[d] == 1)
        continue;
      bool r = reduced[d] != 0;
      if (group < 0 || r != lastReduced) {
        ++group;
        lastReduced = r;
        // reduced, kept, reduced: groups 0 and 2 reduced, 1 kept.
        fits = group < 3 && r == (group != 1);
      }
      if (fits)
        groups[group] *= shape[d];
    }
    if (fits && group == 2 &&
        (kind == PCC_REDUCE_SUM || kind == PCC_REDUCE_MEAN)) {
      int64_t a = groups[0], c = groups[1], b = groups[2];
#pragma omp parallel for if (total > kParallelThreshold && c > 1)
      for (int64_t k = 0; k < c; ++k) {
        double sum = acc[k];
        for (int64_t n = 0; n < a; ++n) {
          const T *run = x + (n * c + k) * b;
          for (int64_t j = 0; j < b; ++j)
            sum += static_cast<double>(run[j]);
        }
        acc[k] = sum;
      }
      for (int64_t o = 0; o < outCount; ++o)
        y[o] = static_cast<T>(kind == PCC_REDUCE_MEAN ? acc[o] / reducedCount
                                                      : acc[o]);
      return;
    }
  }
  std::vector<int64_t> coords(rank, 0);
  int64_t out = 0;
  for (int64_t i = 0; i < total; ++i) {
    double v = static_cast<double>(x[i]);
    double &a = acc[out];
    switch (kind) {
    case PCC_REDUCE_MAX:
      a = std::max(a, v);
      break;
    case PCC_REDUCE_MIN:
      a = std::min(a, v);
      break;
    case PCC_REDUCE_PROD:
      a *= v;
      break;
    default:
      a += v;
    }
    for (int64_t d = rank - 1; d >= 0; --d) {
      out += outStride[d];
      if (++coords[d] < shape[d])
        break;
      out -= outStride[d] * shape[d];
      coords[d] = 0;
    }
  }
  for (int64_t o = 0; o < outCount; ++o)
    y[o] = static_cast<T>(kind == PCC_REDUCE_MEAN ? acc[o] / reducedCount
                                                  : acc[o]);
}
} // namespace

extern "C" {

void pcc_cpu_reduce_f32(const float *x, float *y, int64_t rank,
                        const int64_t *shape, const int64_t *reduced,
                        int kind) {
  reduce(x, y, rank, shape, reduced, kind);
}

void pcc_cpu_sum_squares_f32(const float *x, float *y, int64_t n) {
  // Blocks of a fixed size summed in parallel, then their sums in order:
  // the result does not depend on the thread count (one block: the plain
  // sum). The gradient norm reads every gradient once per step.
  constexpr int64_t kBlock = int64_t(1) << 16;
  int64_t blocks = (n + kBlock - 1) / kBlock;
  if (blocks <= 1) {
    y[0] = static_cast<float>(sumSquaresDouble(x, n));
    return;
  }
  std::vector<double> partial(static_cast<size_t>(blocks));
#pragma omp parallel for
  for (int64_t b = 0; b < blocks; ++b)
    partial[b] =
        sumSquaresDouble(x + b * kBlock, std::min(kBlock, n - b * kBlock));
  double total = 0;
  for (double p : partial)
    total += p;
  y[0] = static_cast<float>(total);
}

void pcc_cpu_sum_squares_bf16(const uint16_t *x, float *y, int64_t n) {
  // pcc_cpu_sum_squares_f32's blocks and order over the widened values
  // (each block widened into a scratch block): the same bits.
  constexpr int64_t kBlock = int64_t(1) << 16;
  int64_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<double> partial(
      static_cast<size_t>(std::max<int64_t>(blocks, 1)));
#pragma omp parallel if (blocks > 1)
  {
    std::vector<float> wide(static_cast<size_t>(std::min(kBlock, n)));
#pragma omp for
    for (int64_t b = 0; b < blocks; ++b) {
      int64_t len = std::min(kBlock, n - b * kBlock);
      castBf16ToF32(x + b * kBlock, wide.data(), 0, len);
      partial[b] = sumSquaresDouble(wide.data(), len);
    }
  }
  if (blocks <= 1) {
    y[0] = static_cast<float>(blocks == 1 ? partial[0] : 0.0);
    return;
  }
  double total = 0;
  for (double p : partial)
    total += p;
  y[0] = static_cast<float>(total);
}

void pcc_cpu_reduce_i64(const int64_t *x, int64_t *y, int64_t rank,
                        const int64_t *shape, const int64_t *reduced,
                        int kind) {
  reduce(x, y, rank, shape, reduced, kind);
}

void pcc_cpu_argmax_f32(const float *x, int64_t *y, int64_t outer, int64_t len,
                        int64_t inner) {
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      const float *in = x + o * len * inner + i;
      int64_t best = 0;
      for (int64_t l = 1; l < len; ++l)
        if (in[l * inner] > in[best * inner])
          best = l;
      y[o * inner + i] = best;
    }
}

} // extern "C"

namespace {
/// Sliding-window geometry shared by conv and pooling.
struct Window {
  int64_t rank;
  const int64_t *inSpatial, *outSpatial, *kernel, *strides, *pads, *dilations;
  int64_t inCount, outCount, kernelCount;

  Window(int64_t rank, const int64_t *inShape, const int64_t *outShape,
         const int64_t *kernel, const int64_t *strides, const int64_t *pads,
         const int64_t *dilations)
      : rank(rank), inSpatial(inShape + 2), outSpatial(outShape + 2),
        kernel(kernel), strides(strides), pads(pads), dilations(dilations),
        inCount(product(inShape + 2, rank)),
        outCount(product(outShape + 2, rank)),
        kernelCount(product(kernel, rank)) {}

  /// Input offset of output position `o` and kernel position `k` within one
  /// channel, or -1 when it falls in the padding.
  int64_t source(int64_t o, int64_t k) const {
    int64_t offset = 0;
    for (int64_t d = 0; d < rank; ++d) {
      int64_t od = o, kd = k;
      for (int64_t e = rank - 1; e > d; --e) {
        od /= outSpatial[e];
        kd /= kernel[e];
      }
      od %= outSpatial[d];
      kd %= kernel[d];
      int64_t pos = od * strides[d] - pads[d] + kd * dilations[d];
      if (pos < 0 || pos >= inSpatial[d])
        return -1;
      offset = offset * inSpatial[d] + pos;
    }
    return offset;
  }

  /// Whether kernel position `k` of output position `o` lies inside the
  /// padded input (not past the trailing pad, as ceil mode allows).
  bool insidePadded(int64_t o, int64_t k) const {
    for (int64_t d = rank - 1; d >= 0; --d) {
      int64_t od = o % outSpatial[d], kd = k % kernel[d];
      o /= outSpatial[d];
      k /= kernel[d];
      int64_t pos = od * strides[d] - pads[d] + kd * dilations[d];
      if (pos >= inSpatial[d] + pads[rank + d])
        return false;
    }
    return true;
  }
};

/// The input offset of every (kernel position, output position) pair of
/// one channel plane, -1 in the padding.
std::vector<int64_t> sourceTable(const Window &win) {
  std::vector<int64_t> sourceOf(win.kernelCount * win.outCount);
  for (int64_t k = 0; k < win.kernelCount; ++k)
    for (int64_t o = 0; o < win.outCount; ++o)
      sourceOf[k * win.outCount + o] = win.source(o, k);
  return sourceOf;
}

/// sourceTable, computed once per window geometry: a training step calls
/// each convolution's three kernels every micro-batch with the same one.
const std::vector<int64_t> &cachedSourceTable(const Window &win) {
  static std::mutex lock;
  static std::map<std::vector<int64_t>, std::vector<int64_t>> tables;
  std::vector<int64_t> key{win.rank};
  for (int64_t d = 0; d < win.rank; ++d)
    key.insert(key.end(),
               {win.inSpatial[d], win.outSpatial[d], win.kernel[d],
                win.strides[d], win.pads[d], win.dilations[d]});
  std::lock_guard<std::mutex> guard(lock);
  auto it = tables.find(key);
  if (it == tables.end())
    it = tables.emplace(std::move(key), sourceTable(win)).first;
  return it->second;
}

/// A scratch buffer of at least `count` floats for this thread, kept
/// between calls (the convolutions' column buffers: no allocation and no
/// page faults per call).
float *scratch(size_t slot, size_t count) {
  thread_local std::vector<float> buffers[2];
  std::vector<float> &b = buffers[slot];
  if (b.size() < count)
    b.resize(count);
  return b.data();
}

/// A grouped convolution's sizes and source table: what the convolution
/// and its two gradients share. The n images of a batch are one GEMM per
/// group: column (b, o) of the im2col matrix is image b's output position
/// o, so small images still make a GEMM that OpenBLAS threads.
struct ConvGeometry {
  Window win;
  int64_t n, c, m, cg, mg, rows; // rows: im2col rows per group
  int64_t cols;                  // n x output positions
  const std::vector<int64_t> &sourceOf;

  ConvGeometry(int64_t spatialRank, const int64_t *inShape,
               const int64_t *wShape, const int64_t *outShape,
               const int64_t *strides, const int64_t *pads,
               const int64_t *dilations, int64_t groups)
      : win(spatialRank, inShape, outShape, wShape + 2, strides, pads,
            dilations),
        n(inShape[0]), c(inShape[1]), m(wShape[0]), cg(c / groups),
        mg(m / groups), rows(cg * win.kernelCount), cols(n * win.outCount),
        sourceOf(cachedSourceTable(win)) {}

  /// im2col of group g of every image: row (channel, kernel position),
  /// column (image, output position).
  void im2col(const float *x, int64_t g, float *out) const {
#pragma omp parallel for if (rows * cols > kParallelThreshold)
    for (int64_t r = 0; r < rows; ++r) {
      int64_t ch = r / win.kernelCount, k = r % win.kernelCount;
      const int64_t *src = &sourceOf[k * win.outCount];
      for (int64_t b = 0; b < n; ++b) {
        const float *plane = x + (b * c + g * cg + ch) * win.inCount;
        float *dst = out + r * cols + b * win.outCount;
        for (int64_t o = 0; o < win.outCount; ++o)
          dst[o] = src[o] < 0 ? 0.0f : plane[src[o]];
      }
    }
  }

  /// [mg, n x out] (group g's channels, image-major columns) from or to
  /// the [n, m, out] layout of the activations.
  void toImages(const float *from, float *y, int64_t g,
                const float *bias) const {
#pragma omp parallel for if (mg * cols > kParallelThreshold)
    for (int64_t j = 0; j < mg; ++j)
      for (int64_t b = 0; b < n; ++b) {
        const float *src = from + j * cols + b * win.outCount;
        float *dst = y + (b * m + g * mg + j) * win.outCount;
        float add = bias ? bias[g * mg + j] : 0.0f;
        for (int64_t o = 0; o < win.outCount; ++o)
          dst[o] = bias ? src[o] + add : src[o];
      }
  }
  void fromImages(const float *y, float *to, int64_t g) const {
#pragma omp parallel for if (mg * cols > kParallelThreshold)
    for (int64_t j = 0; j < mg; ++j)
      for (int64_t b = 0; b < n; ++b)
        std::memcpy(to + j * cols + b * win.outCount,
                    y + (b * m + g * mg + j) * win.outCount,
                    sizeof(float) * win.outCount);
  }
};

/// Max pooling for any element type; padded positions never win.
template <typename T>
void maxPool(const T *x, T *y, int64_t spatialRank, const int64_t *inShape,
             const int64_t *outShape, const int64_t *kernel,
             const int64_t *strides, const int64_t *pads,
             const int64_t *dilations) {
  Window win(spatialRank, inShape, outShape, kernel, strides, pads, dilations);
  const std::vector<int64_t> &sourceOf = cachedSourceTable(win);
  int64_t planes = inShape[0] * inShape[1];
#pragma omp parallel for if (planes * win.outCount > kParallelThreshold)
  for (int64_t p = 0; p < planes; ++p)
    for (int64_t o = 0; o < win.outCount; ++o) {
      T best = std::numeric_limits<T>::has_infinity
                   ? -std::numeric_limits<T>::infinity()
                   : std::numeric_limits<T>::lowest();
      for (int64_t k = 0; k < win.kernelCount; ++k) {
        int64_t s = sourceOf[k * win.outCount + o];
        if (s >= 0)
          best = std::max(best, x[p * win.inCount + s]);
      }
      y[p * win.outCount + o] = best;
    }
}
} // namespace

extern "C" {

void pcc_cpu_conv_f32(const float *x, const float *w, const float *bias,
                      float *y, int64_t spatial_rank, const int64_t *in_shape,
                      const int64_t *w_shape, const int64_t *out_shape,
                      const int64_t *strides, const int64_t *pads,
                      const int64_t *dilations, int64_t groups) {
  ConvGeometry geo(spatial_rank, in_shape, w_shape, out_shape, strides, pads,
                   dilations, groups);
  if (geo.cols == 0)
    return;
  float *cols = scratch(0, static_cast<size_t>(geo.rows * geo.cols));
  float *out = scratch(1, static_cast<size_t>(geo.mg * geo.cols));
  for (int64_t g = 0; g < groups; ++g) {
    geo.im2col(x, g, cols);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, geo.mg, geo.cols,
                geo.rows, 1.0f, w + g * geo.mg * geo.rows, geo.rows, cols,
                geo.cols, 0.0f, out, geo.cols);
    geo.toImages(out, y, g, bias);
  }
}

void pcc_cpu_max_pool_f32(const float *x, float *y, int64_t spatial_rank,
                          const int64_t *in_shape, const int64_t *out_shape,
                          const int64_t *kernel, const int64_t *strides,
                          const int64_t *pads, const int64_t *dilations) {
  maxPool(x, y, spatial_rank, in_shape, out_shape, kernel, strides, pads,
          dilations);
}

void pcc_cpu_max_pool_u8(const uint8_t *x, uint8_t *y, int64_t spatial_rank,
                         const int64_t *in_shape, const int64_t *out_shape,
                         const int64_t *kernel, const int64_t *strides,
                         const int64_t *pads, const int64_t *dilations) {
  maxPool(x, y, spatial_rank, in_shape, out_shape, kernel, strides, pads,
          dilations);
}

void pcc_cpu_max_pool_i8(const int8_t *x, int8_t *y, int64_t spatial_rank,
                         const int64_t *in_shape, const int64_t *out_shape,
                         const int64_t *kernel, const int64_t *strides,
                         const int64_t *pads, const int64_t *dilations) {
  maxPool(x, y, spatial_rank, in_shape, out_shape, kernel, strides, pads,
          dilations);
}

void pcc_cpu_avg_pool_f32(const float *x, float *y, int64_t spatial_rank,
                          const int64_t *in_shape, const int64_t *out_shape,
                          const int64_t *kernel, const int64_t *strides,
                          const int64_t *pads, const int64_t *dilations,
                          int count_include_pad) {
  Window win(spatial_rank, in_shape, out_shape, kernel, strides, pads,
             dilations);
  int64_t planes = in_shape[0] * in_shape[1];
#pragma omp parallel for if (planes * win.outCount > kParallelThreshold)
  for (int64_t p = 0; p < planes; ++p)
    for (int64_t o = 0; o < win.outCount; ++o) {
      double sum = 0;
      int64_t count = 0, padded = 0;
      for (int64_t k = 0; k < win.kernelCount; ++k) {
        int64_t s = win.source(o, k);
        if (s >= 0) {
          sum += x[p * win.inCount + s];
          ++count;
        } else if (count_include_pad && win.insidePadded(o, k)) {
          // Only positions inside the padded input count, not those past
          // it in ceil mode (ONNX and PyTorch agree).
          ++padded;
        }
      }
      int64_t divisor = count_include_pad ? count + padded : count;
      y[p * win.outCount + o] =
          divisor ? static_cast<float>(sum / divisor) : 0.0f;
    }
}

void pcc_cpu_conv_grad_input_f32(const float *dy, const float *w, float *dx,
                                 int64_t spatial_rank, const int64_t *in_shape,
                                 const int64_t *w_shape,
                                 const int64_t *out_shape,
                                 const int64_t *strides, const int64_t *pads,
                                 const int64_t *dilations, int64_t groups) {
  ConvGeometry geo(spatial_rank, in_shape, w_shape, out_shape, strides, pads,
                   dilations, groups);
  const Window &win = geo.win;
  std::memset(dx, 0, sizeof(float) * geo.n * geo.c * win.inCount);
  if (geo.cols == 0)
    return;
  float *cols = scratch(0, static_cast<size_t>(geo.rows * geo.cols));
  float *grads = scratch(1, static_cast<size_t>(geo.mg * geo.cols));
  for (int64_t g = 0; g < groups; ++g) {
    // cols = W_g^T dY_g over every image, then each column entry is added
    // back to the input position it was read from (col2im), a (image,
    // channel) plane per thread, kernel positions in order.
    geo.fromImages(dy, grads, g);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, geo.rows, geo.cols,
                geo.mg, 1.0f, w + g * geo.mg * geo.rows, geo.rows, grads,
                geo.cols, 0.0f, cols, geo.cols);
#pragma omp parallel for if (geo.rows * geo.cols > kParallelThreshold)
    for (int64_t plane = 0; plane < geo.n * geo.cg; ++plane) {
      int64_t b = plane / geo.cg, ch = plane % geo.cg;
      float *in = dx + (b * geo.c + g * geo.cg + ch) * win.inCount;
      for (int64_t k = 0; k < win.kernelCount; ++k) {
        const int64_t *src = &geo.sourceOf[k * win.outCount];
        const float *col =
            cols + (ch * win.kernelCount + k) * geo.cols + b * win.outCount;
        for (int64_t o = 0; o < win.outCount; ++o)
          if (src[o] >= 0)
            in[src[o]] += col[o];
      }
    }
  }
}

void pcc_cpu_conv_grad_weight_f32(const float *x, const float *dy, float *dw,
                                  int64_t spatial_rank,
                                  const int64_t *in_shape,
                                  const int64_t *w_shape,
                                  const int64_t *out_shape,
                                  const int64_t *strides, const int64_t *pads,
                                  const int64_t *dilations, int64_t groups) {
  ConvGeometry geo(spatial_rank, in_shape, w_shape, out_shape, strides, pads,
                   dilations, groups);
  if (geo.cols == 0) {
    std::memset(dw, 0, sizeof(float) * geo.m * geo.rows);
    return;
  }
  float *cols = scratch(0, static_cast<size_t>(geo.rows * geo.cols));
  float *grads = scratch(1, static_cast<size_t>(geo.mg * geo.cols));
  int64_t out = geo.win.outCount;
  for (int64_t g = 0; g < groups; ++g) {
    // dW_g (+)= dY_g cols^T image by image, in order: the sums PyTorch's
    // reference makes (one contraction over every image's positions would
    // round differently, enough to flip a max-pool winner in later steps).
    geo.im2col(x, g, cols);
    geo.fromImages(dy, grads, g);
    for (int64_t b = 0; b < geo.n; ++b)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, geo.mg, geo.rows,
                  out, 1.0f, grads + b * out, geo.cols, cols + b * out,
                  geo.cols, b ? 1.0f : 0.0f, dw + g * geo.mg * geo.rows,
                  geo.rows);
  }
}

void pcc_cpu_max_pool_grad_f32(const float *x, const float *dy, float *dx,
                               int64_t spatial_rank, const int64_t *in_shape,
                               const int64_t *out_shape, const int64_t *kernel,
                               const int64_t *strides, const int64_t *pads,
                               const int64_t *dilations) {
  Window win(spatial_rank, in_shape, out_shape, kernel, strides, pads,
             dilations);
  const std::vector<int64_t> &sourceOf = cachedSourceTable(win);
  int64_t planes = in_shape[0] * in_shape[1];
#pragma omp parallel for if (planes * win.outCount > kParallelThreshold)
  for (int64_t p = 0; p < planes; ++p) {
    const float *in = x + p * win.inCount;
    float *out = dx + p * win.inCount;
    std::fill(out, out + win.inCount, 0.0f);
    for (int64_t o = 0; o < win.outCount; ++o) {
      int64_t winner = -1;
      float best = 0.0f;
      for (int64_t k = 0; k < win.kernelCount; ++k) {
        int64_t s = sourceOf[k * win.outCount + o];
        if (s >= 0 && (winner < 0 || in[s] > best || std::isnan(in[s]))) {
          winner = s;
          best = in[s];
        }
      }
      if (winner >= 0)
        out[winner] += dy[p * win.outCount + o];
    }
  }
}

void pcc_cpu_avg_pool_grad_f32(const float *dy, float *dx,
                               int64_t spatial_rank, const int64_t *in_shape,
                               const int64_t *out_shape, const int64_t *kernel,
                               const int64_t *strides, const int64_t *pads,
                               const int64_t *dilations,
                               int count_include_pad) {
  Window win(spatial_rank, in_shape, out_shape, kernel, strides, pads,
             dilations);
  int64_t planes = in_shape[0] * in_shape[1];
#pragma omp parallel for if (planes * win.outCount > kParallelThreshold)
  for (int64_t p = 0; p < planes; ++p) {
    float *out = dx + p * win.inCount;
    std::fill(out, out + win.inCount, 0.0f);
    for (int64_t o = 0; o < win.outCount; ++o) {
      int64_t count = 0, padded = 0;
      for (int64_t k = 0; k < win.kernelCount; ++k) {
        if (win.source(o, k) >= 0)
          ++count;
        else if (count_include_pad && win.insidePadded(o, k))
          ++padded;
      }
      int64_t divisor = count_include_pad ? count + padded : count;
      if (divisor == 0)
        continue;
      float share = dy[p * win.outCount + o] / static_cast<float>(divisor);
      for (int64_t k = 0; k < win.kernelCount; ++k) {
        int64_t s = win.source(o, k);
        if (s >= 0)
          out[s] += share;
      }
    }
  }
}

void pcc_cpu_ema_update_f32(float *state, const float *value, int64_t n,
                            double momentum, double scale) {
  for (int64_t i = 0; i < n; ++i)
    state[i] = static_cast<float>(momentum * state[i] +
                                  (1.0 - momentum) * (scale * value[i]));
}

void pcc_cpu_dropout_f32(const float *x, float *y, int64_t n, double ratio,
                         int64_t stream, const double *hyper) {
  uint64_t seed = static_cast<uint64_t>(hyper[PCC_HYPER_SEED]);
  uint32_t step = static_cast<uint32_t>(hyper[PCC_HYPER_STEP]);
  uint32_t microbatch = static_cast<uint32_t>(hyper[PCC_HYPER_MICROBATCH]);
  float scale = static_cast<float>(1.0 / (1.0 - ratio));
  int64_t groups = (n + 3) / 4;
#pragma omp parallel for if (n > kParallelThreshold)
  for (int64_t g = 0; g < groups; ++g) {
    pccrt::Philox4 bits =
        pccrt::dropoutBits(seed, static_cast<uint64_t>(g), microbatch,
                           static_cast<uint32_t>(stream), step);
    for (int64_t lane = 0; lane < 4 && 4 * g + lane < n; ++lane) {
      bool keep = pccrt::uniformFromBits(bits.v[lane]) >= ratio;
      y[4 * g + lane] = x[4 * g + lane] * (keep ? scale : 0.0f);
    }
  }
}

void pcc_cpu_cast(const void *x, int from_type, void *y, int to_type,
                  int64_t count) {
  // Mixed precision's casts (pcc-autocast).
  bool stream = count * 2 >= kStreamBytes && canStream();
  if (from_type == PCC_F32 && to_type == PCC_BF16)
    return convertAll(stream ? streamF32ToBf16 : castF32ToBf16, x, y, count);
  if (from_type == PCC_BF16 && to_type == PCC_F32)
    return convertAll(stream ? streamBf16ToF32 : castBf16ToF32, x, y, count);
  if (from_type == PCC_F32 && to_type == PCC_F16)
    return convertAll(castF32ToF16, x, y, count);
  if (from_type == PCC_F16 && to_type == PCC_F32)
    return convertAll(castF16ToF32, x, y, count);
  for (int64_t i = 0; i < count; ++i)
    pccrt::castElement(x, from_type, y, to_type, i);
}


//===----------------------------------------------------------------------===//
// Training
//===----------------------------------------------------------------------===//

namespace {
int64_t indexAt(const void *indices, int64_t j, int i64) {
  return i64 ? static_cast<const int64_t *>(indices)[j]
             : static_cast<const int32_t *>(indices)[j];
}

/// The factor clipping scales gradients by: max_norm / (norm + 1e-6), at
/// most 1, in float as torch.nn.utils.clip_grad_norm_ computes it; 1
/// without clipping. Under fp16 loss scaling `norm` is the scaled
/// gradients' norm, unscaled here by the gradient scale.
float clipCoefficient(const double *hyper, const float *norm) {
  double maxNorm = hyper[PCC_HYPER_MAX_GRAD_NORM];
  if (!(maxNorm > 0))
    return 1.0f;
  float unscaled = *norm * static_cast<float>(hyper[PCC_HYPER_GRAD_SCALE]);
  float coef = static_cast<float>(maxNorm) / (unscaled + 1e-6f);
  return std::min(coef, 1.0f);
}

/// fp16 loss scaling: an update whose gradient norm is not finite (the
/// scaled gradients overflowed) is skipped, as GradScaler.step skips it.
bool skipUpdate(const double *hyper, const float *norm) {
  return hyper[PCC_HYPER_SKIP_NONFINITE] != 0 && !std::isfinite(*norm);
}

extern "C++" {
/// pcc_cpu_adamw_copy_f32 with gradients of type G (float, or bf16 bits
/// widened exactly as they are read).
inline float widenGrad(float g) { return g; }
inline float widenGrad(uint16_t g) { return pccrt::bf16ToFloat(g); }

template <typename G>
void adamw(float *param, const G *grad, float *exp_avg, float *exp_avg_sq,
           int64_t n, const double *hyper, const float *norm, void *copy,
           int copy_type) {
  if (skipUpdate(hyper, norm))
    return;
  float coef = clipCoefficient(hyper, norm);
  float unscale = static_cast<float>(hyper[PCC_HYPER_GRAD_SCALE]);
  double lr = hyper[PCC_HYPER_LR], beta1 = hyper[PCC_HYPER_BETA1],
         beta2 = hyper[PCC_HYPER_BETA2], step = hyper[PCC_HYPER_STEP];
  // Scalars in double, as PyTorch computes them in Python.
  float decay = static_cast<float>(1.0 - lr * hyper[PCC_HYPER_WEIGHT_DECAY]);
  float w1 = static_cast<float>(1.0 - beta1);
  float b2 = static_cast<float>(beta2), w2 = static_cast<float>(1.0 - beta2);
  float negStep = static_cast<float>(-(lr / (1.0 - std::pow(beta1, step))));
  float bc2Sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(beta2, step)));
  float eps = static_cast<float>(hyper[PCC_HYPER_EPS]);
  // The copy: pcc_cpu_cast's conversion of each block just updated, while
  // it is in cache (streamed when the copy is large, as the cast streams).
  void (*convert)(const void *, void *, int64_t, int64_t) = nullptr;
  if (copy)
    convert = copy_type == PCC_F16                   ? castF32ToF16
              : n * 2 >= kStreamBytes && canStream() ? streamF32ToBf16
                                                     : castF32ToBf16;
  constexpr int64_t kBlock = int64_t(1) << 13;
  int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for if (n > kParallelThreshold)
  for (int64_t b = 0; b < blocks; ++b) {
    int64_t end = std::min(n, (b + 1) * kBlock);
    for (int64_t i = b * kBlock; i < end; ++i) {
      float g = widenGrad(grad[i]) * unscale * coef;
      float p = param[i] * decay;
      float m = exp_avg[i];
      m = m + w1 * (g - m); // lerp with a weight below 0.5
      float v = exp_avg_sq[i] * b2 + w2 * g * g;
      float denom = std::sqrt(v) / bc2Sqrt + eps;
      param[i] = p + negStep * m / denom;
      exp_avg[i] = m;
      exp_avg_sq[i] = v;
    }
    if (convert)
      convert(param, copy, b * kBlock, end);
  }
}
} // extern "C++"
} // namespace

int pcc_cpu_scatter_accumulate_block_f32(const float *updates,
                                         const void *indices, float *y,
                                         int64_t outer, int64_t block,
                                         int64_t start, int64_t total,
                                         int64_t inner, int64_t num_indices,
                                         int indices_are_i64) {
  for (int64_t j = 0; j < num_indices; ++j) {
    int64_t idx = indexAt(indices, j, indices_are_i64);
    if (idx < -total || idx >= total) {
      cpuLastError = "index " + std::to_string(idx) +
                     " is out of range for a dimension of size " +
                     std::to_string(total);
      return 1;
    }
  }
  // Rows are added in index order, each column by one thread: the same
  // sums in the same order on every run. Rows of other ranks' blocks are
  // skipped.
#pragma omp parallel for collapse(2) if (outer * num_indices * inner >         \
                                         kParallelThreshold)
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i)
      for (int64_t j = 0; j < num_indices; ++j) {
        int64_t idx = indexAt(indices, j, indices_are_i64);
        if (idx < 0)
          idx += total;
        idx -= start;
        if (idx < 0 || idx >= block)
          continue;
        y[(o * block + idx) * inner + i] +=
            updates[(o * num_indices + j) * inner + i];
      }
  return 0;
}

int pcc_cpu_scatter_add_block_f32(const float *updates, const void *indices,
                                  float *y, int64_t outer, int64_t block,
                                  int64_t start, int64_t total, int64_t inner,
                                  int64_t num_indices, int indices_are_i64) {
  std::memset(y, 0, static_cast<size_t>(outer * block * inner) * 4);
  return pcc_cpu_scatter_accumulate_block_f32(updates, indices, y, outer, block,
                                              start, total, inner, num_indices,
                                              indices_are_i64);
}

int pcc_cpu_scatter_accumulate_f32(const float *updates, const void *indices,
                                   float *y, int64_t outer, int64_t axis_dim,
                                   int64_t inner, int64_t num_indices,
                                   int indices_are_i64) {
  return pcc_cpu_scatter_accumulate_block_f32(updates, indices, y, outer,
                                              axis_dim, 0, axis_dim, inner,
                                              num_indices, indices_are_i64);
}

int pcc_cpu_scatter_add_f32(const float *updates, const void *indices, float *y,
                            int64_t outer, int64_t axis_dim, int64_t inner,
                            int64_t num_indices, int indices_are_i64) {
  return pcc_cpu_scatter_add_block_f32(updates, indices, y, outer, axis_dim, 0,
                                       axis_dim, inner, num_indices,
                                       indices_are_i64);
}

namespace {
/// Checks the labels; sets cpuLastError and returns false on a bad one.
bool checkLabels(const void *labels, int64_t rows, int64_t classes,
                 int64_t ignore, int i64) {
  for (int64_t r = 0; r < rows; ++r) {
    int64_t label = indexAt(labels, r, i64);
    if (label != ignore && (label < 0 || label >= classes)) {
      cpuLastError = "label " + std::to_string(label) + " (row " +
                     std::to_string(r) + ") is outside [0, " +
                     std::to_string(classes) + ") and is not the ignored " +
                     std::to_string(ignore);
      return false;
    }
  }
  return true;
}

extern "C++" {
/// Row r of the logits in f32: the row itself, or (bf16 logits) the row
/// widened exactly into `scratch`.
const float *logitRow(const float *logits, int64_t r, int64_t classes,
                      float *) {
  return logits + r * classes;
}
const float *logitRow(const uint16_t *logits, int64_t r, int64_t classes,
                      float *scratch) {
  castBf16ToF32(logits + r * classes, scratch, 0, classes);
  return scratch;
}

/// Per-row cross-entropy of f32 or bf16 logits: logsumexp(row) -
/// row[label] with the maximum in float and the sum in double; 0 for an
/// ignored label.
template <typename T>
int crossEntropyRows(const T *logits, const void *labels, float *loss,
                     int64_t rows, int64_t classes, int64_t ignore,
                     int labelsAreI64) {
  if (!checkLabels(labels, rows, classes, ignore, labelsAreI64))
    return 1;
#pragma omp parallel if (rows * classes > kParallelThreshold)
  {
    std::vector<float> e(static_cast<size_t>(classes));
#pragma omp for
    for (int64_t r = 0; r < rows; ++r) {
      int64_t label = indexAt(labels, r, labelsAreI64);
      if (label == ignore) {
        loss[r] = 0.0f;
        continue;
      }
      // The exponentials overwrite the scratch row (a widened row's own).
      const float *row = logitRow(logits, r, classes, e.data());
      float maxValue = rowMax(row, classes), at = row[label];
      double sum = rowExp(row, maxValue, e.data(), classes);
      loss[r] = static_cast<float>(static_cast<double>(maxValue) +
                                   std::log(sum) - at);
    }
  }
  return 0;
}

/// Its gradient, (softmax(row) - onehot(label)) * grad[row], written in f32
/// or (yIsBf16) rounded once to bf16 as pcc_cpu_cast rounds it.
template <typename T>
int crossEntropyGradRows(const T *logits, const void *labels, const float *grad,
                         void *y, bool yIsBf16, int64_t rows, int64_t classes,
                         int64_t ignore, int labelsAreI64) {
  if (!checkLabels(labels, rows, classes, ignore, labelsAreI64))
    return 1;
  size_t size = yIsBf16 ? 2 : 4;
  // f32 logits into an f32 gradient need no scratch row.
  bool direct = std::is_same_v<T, float> && !yIsBf16;
#pragma omp parallel if (rows * classes > kParallelThreshold)
  {
    std::vector<float> w(direct ? 0 : static_cast<size_t>(classes));
#pragma omp for
    for (int64_t r = 0; r < rows; ++r) {
      int64_t label = indexAt(labels, r, labelsAreI64);
      void *out = static_cast<char *>(y) + r * classes * size;
      if (label == ignore) {
        std::memset(out, 0, static_cast<size_t>(classes) * size);
        continue;
      }
      float *e = direct ? static_cast<float *>(out) : w.data();
      const float *row = logitRow(logits, r, classes, e);
      double sum = rowExp(row, rowMax(row, classes), e, classes);
      rowScale(e, static_cast<float>(1.0 / sum) * grad[r], classes);
      e[label] -= grad[r];
      if (yIsBf16)
        castF32ToBf16(e, out, 0, classes);
      else if (!direct)
        std::memcpy(out, e, static_cast<size_t>(classes) * 4);
    }
  }
  return 0;
}
} // extern "C++"
} // namespace

int pcc_cpu_cross_entropy_f32(const float *logits, const void *labels,
                              float *loss, int64_t rows, int64_t classes,
                              int64_t ignore_index, int labels_are_i64) {
  return crossEntropyRows(logits, labels, loss, rows, classes, ignore_index,
                          labels_are_i64);
}

int pcc_cpu_cross_entropy_grad_f32(const float *logits, const void *labels,
                                   const float *grad, float *y, int64_t rows,
                                   int64_t classes, int64_t ignore_index,
                                   int labels_are_i64) {
  return crossEntropyGradRows(logits, labels, grad, y, /*yIsBf16=*/false, rows,
                              classes, ignore_index, labels_are_i64);
}

int pcc_cpu_cross_entropy_bf16(const uint16_t *logits, const void *labels,
                               float *loss, int64_t rows, int64_t classes,
                               int64_t ignore_index, int labels_are_i64) {
  return crossEntropyRows(logits, labels, loss, rows, classes, ignore_index,
                          labels_are_i64);
}

int pcc_cpu_cross_entropy_grad_bf16(const uint16_t *logits, const void *labels,
                                    const float *grad, void *y, int y_is_bf16,
                                    int64_t rows, int64_t classes,
                                    int64_t ignore_index, int labels_are_i64) {
  return crossEntropyGradRows(logits, labels, grad, y, y_is_bf16 != 0, rows,
                              classes, ignore_index, labels_are_i64);
}

void pcc_cpu_sgd_f32(float *param, const float *grad, float *momentum_buffer,
                     int64_t n, const double *hyper, const float *norm) {
  if (skipUpdate(hyper, norm))
    return;
  float coef = clipCoefficient(hyper, norm);
  float unscale = static_cast<float>(hyper[PCC_HYPER_GRAD_SCALE]);
  float lr = static_cast<float>(hyper[PCC_HYPER_LR]);
  float wd = static_cast<float>(hyper[PCC_HYPER_WEIGHT_DECAY]);
  float momentum = static_cast<float>(hyper[PCC_HYPER_MOMENTUM]);
  float keep = static_cast<float>(1.0 - hyper[PCC_HYPER_DAMPENING]);
  bool nesterov = hyper[PCC_HYPER_NESTEROV] != 0;
  bool first = hyper[PCC_HYPER_STEP] <= 1;
#pragma omp parallel for if (n > kParallelThreshold)
  for (int64_t i = 0; i < n; ++i) {
    float g = grad[i] * unscale * coef;
    if (wd != 0)
      g = g + wd * param[i];
    if (momentum != 0) {
      float buf = first ? g : momentum_buffer[i] * momentum + keep * g;
      momentum_buffer[i] = buf;
      g = nesterov ? g + momentum * buf : buf;
    }
    param[i] = param[i] + -lr * g;
  }
}

void pcc_cpu_adamw_f32(float *param, const float *grad, float *exp_avg,
                       float *exp_avg_sq, int64_t n, const double *hyper,
                       const float *norm) {
  pcc_cpu_adamw_copy_f32(param, grad, exp_avg, exp_avg_sq, n, hyper, norm,
                         nullptr, PCC_BF16);
}

void pcc_cpu_adamw_copy_f32(float *param, const float *grad, float *exp_avg,
                            float *exp_avg_sq, int64_t n, const double *hyper,
                            const float *norm, void *copy, int copy_type) {
  adamw(param, grad, exp_avg, exp_avg_sq, n, hyper, norm, copy, copy_type);
}

void pcc_cpu_adamw_bf16_grad_f32(float *param, const uint16_t *grad,
                                 float *exp_avg, float *exp_avg_sq, int64_t n,
                                 const double *hyper, const float *norm,
                                 void *copy, int copy_type) {
  adamw(param, grad, exp_avg, exp_avg_sq, n, hyper, norm, copy, copy_type);
}

} // extern "C"
