//===- Bf16Gemm.cpp - 16-bit matrix products on the CPU through oneDNN ----===//
//
// pcc_cpu_matmul_bf16: bf16 operands, fp32 accumulation, a bf16 result (as
// torch.autocast's matmul, linear and bmm give). oneDNN picks the kernels
// for the CPU it runs on (AMX where the CPU has it, else AVX512-BF16's dot
// products, else AVX512's conversions); Debian's OpenBLAS 0.3.21 exports
// no bf16 GEMM (docs/design-notes.md, mixed precision). Primitives are made
// once per shape and kept: a step runs the same few shapes many times.
//
// pcc_cpu_matmul_f16: the same on fp16, where oneDNN has fp16 kernels for
// the CPU (AVX512-FP16 or AMX-FP16).
//
// Where oneDNN 2.6 has no kernels for a 16-bit type on this CPU (fp16
// without AVX512-FP16, as on AMD Zen 4; bf16 without AVX512, as on an AVX2
// machine) the operands are widened exactly to fp32, multiplied in fp32
// and the result rounded once: the same fp32 accumulation and rounding, at
// fp32's speed.
//
//===----------------------------------------------------------------------===//

#include "CpuError.h"
#include "HalfGemm.h"
#include "pcc/runtime/CpuKernels.h"
#include "pcc/runtime/HalfFloat.h"

#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl.hpp>

#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

namespace {

using dnnl::memory;

struct Context {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::mutex lock;
  /// (type, m, n, k, trans_a, trans_b) -> the product of one batch entry.
  std::map<std::tuple<int, int64_t, int64_t, int64_t, int, int>, dnnl::matmul>
      products;
  /// batchedProduct's (and halfGemm's): types, sizes and strides.
  std::map<std::vector<int64_t>, dnnl::matmul> batched;
  /// Per 16-bit type (bf16, fp16): -1 not yet asked, 0 oneDNN has no
  /// matmul on it for this CPU, 1 it has.
  int native[2] = {-1, -1};
};

Context &context() {
  static Context ctx;
  return ctx;
}

/// A row-major `rows` x `cols` 16-bit matrix, stored transposed when
/// `trans`.
memory::desc matrix(int64_t rows, int64_t cols, bool trans,
                    memory::data_type type) {
  return trans ? memory::desc({rows, cols}, type, memory::dims{1, rows})
               : memory::desc({rows, cols}, type, memory::dims{cols, 1});
}

const char *typeName(memory::data_type type) {
  return type == memory::data_type::f16 ? "fp16" : "bf16";
}

/// The product on `type` through oneDNN, into `out` (`type`, or f32).
int product(memory::data_type type, memory::data_type out, const void *a,
            const void *b, void *c, int64_t batch, int64_t m, int64_t n,
            int64_t k, int trans_a, int trans_b, int64_t stride_a,
            int64_t stride_b) {
  if (batch <= 0 || m <= 0 || n <= 0)
    return 0;
  // A shared right operand and contiguous, untransposed left operands form
  // one tall product: [batch * m, k] x [k, n].
  if (batch > 1 && stride_b == 0 && !trans_a && stride_a == m * k) {
    m *= batch;
    batch = 1;
  }
  Context &ctx = context();
  try {
    std::lock_guard<std::mutex> hold(ctx.lock);
    auto key =
        std::make_tuple(static_cast<int>(type) * 64 + static_cast<int>(out), m,
                        n, k, trans_a, trans_b);
    auto found = ctx.products.find(key);
    if (found == ctx.products.end()) {
      dnnl::matmul::desc desc(matrix(m, k, trans_a, type),
                              matrix(k, n, trans_b, type),
                              matrix(m, n, false, out));
      dnnl::matmul::primitive_desc pd(desc, ctx.engine);
      found = ctx.products.emplace(key, dnnl::matmul(pd)).first;
    }
    auto *x = static_cast<uint16_t *>(const_cast<void *>(a));
    auto *w = static_cast<uint16_t *>(const_cast<void *>(b));
    auto *y = static_cast<uint8_t *>(c);
    size_t outBytes = out == memory::data_type::f32 ? 4 : 2;
    memory::desc ad = matrix(m, k, trans_a, type),
                 bd = matrix(k, n, trans_b, type),
                 cd = matrix(m, n, false, out);
    for (int64_t i = 0; i < batch; ++i) {
      memory am(ad, ctx.engine, x + i * stride_a);
      memory bm(bd, ctx.engine, w + i * stride_b);
      memory cm(cd, ctx.engine, y + i * m * n * outBytes);
      found->second.execute(
          ctx.stream,
          {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
    }
    ctx.stream.wait();
  } catch (const dnnl::error &e) {
    pccrt::cpuLastError = std::string("oneDNN ") + typeName(type) +
                          " matmul (" + std::to_string(m) + " x " +
                          std::to_string(n) + " x " + std::to_string(k) +
                          "): " + e.what();
    return 1;
  }
  return 0;
}

/// Whether oneDNN has a matmul on 16-bit `type` for this CPU (asked once
/// per type).
bool nativeHalf(memory::data_type type) {
  Context &ctx = context();
  std::lock_guard<std::mutex> hold(ctx.lock);
  int &known = ctx.native[type == memory::data_type::f16 ? 1 : 0];
  if (known < 0) {
    try {
      dnnl::matmul::desc desc(matrix(8, 8, false, type),
                              matrix(8, 8, false, type),
                              matrix(8, 8, false, type));
      dnnl::matmul::primitive_desc pd(desc, ctx.engine);
      known = 1;
    } catch (const dnnl::error &) {
      known = 0;
    }
  }
  return known == 1;
}

memory::data_type halfType(bool f16) {
  return f16 ? memory::data_type::f16 : memory::data_type::bf16;
}

/// The stored matrix behind a strided operand, widened to a dense f32
/// copy (row stride: the stored row's length).
std::vector<float> widenHalf(bool f16, const void *x, int64_t rows,
                             int64_t cols, bool trans, int64_t ld) {
  int64_t storedRows = trans ? cols : rows, storedCols = trans ? rows : cols;
  std::vector<float> out(static_cast<size_t>(storedRows * storedCols));
  const auto *h = static_cast<const uint16_t *>(x);
  for (int64_t r = 0; r < storedRows; ++r)
    for (int64_t c = 0; c < storedCols; ++c)
      out[r * storedCols + c] = f16 ? pccrt::halfToFloat(h[r * ld + c])
                                    : pccrt::bf16ToFloat(h[r * ld + c]);
  return out;
}

/// The elements a 4-D view over `dims` spans, from its first to its last.
int64_t spanOf(const int64_t (&dims)[4], const pccrt::MatrixView &v) {
  int64_t last = 0;
  for (int d = 0; d < 4; ++d)
    last += (dims[d] - 1) * v.strides[d];
  return last + 1;
}

} // namespace

bool pccrt::nativeHalfProducts(bool f16) { return nativeHalf(halfType(f16)); }

int pccrt::halfGemm(bool f16, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                    const void *a, int64_t lda, const void *b, int64_t ldb,
                    bool accumulate, float *c, int64_t ldc) {
  if (m <= 0 || n <= 0)
    return 0;
  if (!nativeHalf(halfType(f16))) {
    // No kernels on this type here: the operands widened exactly, fp32's
    // product.
    std::vector<float> x = widenHalf(f16, a, m, k, ta, lda),
                       y = widenHalf(f16, b, k, n, tb, ldb);
    dnnl_status_t status = dnnl_sgemm(
        ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, 1.0f, x.data(), ta ? m : k,
        y.data(), tb ? k : n, accumulate ? 1.0f : 0.0f, c, ldc);
    if (status != dnnl_success) {
      cpuLastError = "oneDNN sgemm (" + std::to_string(m) + " x " +
                     std::to_string(n) + " x " + std::to_string(k) +
                     ") failed with status " + std::to_string(status);
      return 1;
    }
    return 0;
  }
  // One entry of a batched product; each view's strides over [rows, cols].
  auto view = [](const void *data, bool trans, int64_t ld) {
    return MatrixView{data, {0, 0, trans ? 1 : ld, trans ? ld : 1}};
  };
  return batchedProduct(f16 ? PCC_F16 : PCC_BF16, PCC_F32, 1, 1, false, m, n, k,
                        view(a, ta, lda), view(b, tb, ldb), view(c, false, ldc),
                        accumulate);
}

int pccrt::batchedProduct(int type, int outType, int64_t batch, int64_t group,
                          bool broadcastB, int64_t m, int64_t n, int64_t k,
                          const MatrixView &a, const MatrixView &b,
                          const MatrixView &c, bool accumulate) {
  if (batch <= 0 || group <= 0 || m <= 0 || n <= 0)
    return 0;
  if ((type == PCC_BF16 || type == PCC_F16) &&
      !nativeHalf(halfType(type == PCC_F16))) {
    // No kernels on this type here: each view's span widened exactly (the
    // strides kept), fp32's product, and a 16-bit result rounded once
    // (what the span holds besides the result is written back as it was:
    // widening and rounding back is exact).
    int64_t aDims[4] = {batch, group, m, k},
            bDims[4] = {batch, broadcastB ? 1 : group, k, n},
            cDims[4] = {batch, group, m, n};
    int64_t na = spanOf(aDims, a), nb = spanOf(bDims, b), nc = spanOf(cDims, c);
    std::vector<float> x(static_cast<size_t>(na)), w(static_cast<size_t>(nb)),
        y(outType == PCC_F32 ? 0 : static_cast<size_t>(nc));
    pcc_cpu_cast(a.data, type, x.data(), PCC_F32, na);
    pcc_cpu_cast(b.data, type, w.data(), PCC_F32, nb);
    float *out = outType == PCC_F32
                     ? static_cast<float *>(const_cast<void *>(c.data))
                     : y.data();
    if (outType != PCC_F32)
      pcc_cpu_cast(c.data, outType, out, PCC_F32, nc);
    auto with = [](const MatrixView &v, const void *data) {
      return MatrixView{
          data, {v.strides[0], v.strides[1], v.strides[2], v.strides[3]}};
    };
    if (int rc = batchedProduct(PCC_F32, PCC_F32, batch, group, broadcastB, m,
                                n, k, with(a, x.data()), with(b, w.data()),
                                with(c, out), accumulate))
      return rc;
    if (outType != PCC_F32)
      pcc_cpu_cast(out, PCC_F32, const_cast<void *>(c.data), outType, nc);
    return 0;
  }
  auto dataType = [](int code) {
    return code == PCC_BF16  ? memory::data_type::bf16
           : code == PCC_F16 ? memory::data_type::f16
                             : memory::data_type::f32;
  };
  // A dimension of size 1 gets the stride of a dense layout, so that
  // oneDNN sees a plain (or plain transposed) layout and takes its brgemm
  // kernels (oneDNN 2.6 runs its reference kernel on other strides).
  auto view = [](memory::dims dims, const MatrixView &v, memory::data_type t) {
    memory::dims strides{v.strides[0], v.strides[1], v.strides[2],
                         v.strides[3]};
    int64_t inner = dims[2] * dims[3];
    if (dims[1] == 1)
      strides[1] = inner;
    if (dims[0] == 1)
      strides[0] = dims[1] * strides[1];
    return memory::desc(dims, t, strides);
  };
  memory::desc ad = view({batch, group, m, k}, a, dataType(type)),
               bd = view({batch, broadcastB ? 1 : group, k, n}, b,
                         dataType(type)),
               cd = view({batch, group, m, n}, c, dataType(outType));
  Context &ctx = context();
  try {
    std::lock_guard<std::mutex> hold(ctx.lock);
    std::vector<int64_t> key{type, outType, batch, group, broadcastB, m, n, k,
                             accumulate};
    for (const MatrixView *v : {&a, &b, &c})
      key.insert(key.end(), v->strides, v->strides + 4);
    auto found = ctx.batched.find(key);
    if (found == ctx.batched.end()) {
      dnnl::primitive_attr attr;
      if (accumulate) {
        dnnl::post_ops ops;
        ops.append_sum(1.0f);
        attr.set_post_ops(ops);
      }
      dnnl::matmul::desc desc(ad, bd, cd);
      dnnl::matmul::primitive_desc pd(desc, attr, ctx.engine);
      found = ctx.batched.emplace(key, dnnl::matmul(pd)).first;
    }
    memory am(ad, ctx.engine, const_cast<void *>(a.data));
    memory bm(bd, ctx.engine, const_cast<void *>(b.data));
    memory cm(cd, ctx.engine, const_cast<void *>(c.data));
    found->second.execute(
        ctx.stream,
        {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
    ctx.stream.wait();
  } catch (const dnnl::error &e) {
    cpuLastError = "oneDNN batched matmul (" + std::to_string(batch) + " x " +
                   std::to_string(group) + " of " + std::to_string(m) + " x " +
                   std::to_string(n) + " x " + std::to_string(k) + "): " +
                   e.what();
    return 1;
  }
  return 0;
}

extern "C" {

namespace {
/// 16-bit products: oneDNN's where it has kernels on the type for this
/// CPU, else the operands widened exactly, multiplied in fp32 and
/// (`f32Out` false) the result rounded once.
int halfProduct(bool f16, const void *a, const void *b, void *c, bool f32Out,
                int64_t batch, int64_t m, int64_t n, int64_t k, int trans_a,
                int trans_b, int64_t stride_a, int64_t stride_b) {
  if (batch <= 0 || m <= 0 || n <= 0)
    return 0;
  memory::data_type type = halfType(f16);
  if (nativeHalf(type))
    return product(type, f32Out ? memory::data_type::f32 : type, a, b, c, batch,
                   m, n, k, trans_a, trans_b, stride_a, stride_b);
  int code = f16 ? PCC_F16 : PCC_BF16;
  int64_t na = (batch - 1) * stride_a + m * k;
  int64_t nb = (batch - 1) * stride_b + k * n;
  std::vector<float> x(static_cast<size_t>(na)), w(static_cast<size_t>(nb)),
      y(f32Out ? 0 : static_cast<size_t>(batch * m * n));
  pcc_cpu_cast(a, code, x.data(), PCC_F32, na);
  pcc_cpu_cast(b, code, w.data(), PCC_F32, nb);
  float *out = f32Out ? static_cast<float *>(c) : y.data();
  pcc_cpu_matmul_f32(x.data(), w.data(), out, batch, m, n, k, trans_a, trans_b,
                     stride_a, stride_b);
  if (!f32Out)
    pcc_cpu_cast(y.data(), PCC_F32, c, code, batch * m * n);
  return 0;
}
} // namespace

int pcc_cpu_matmul_bf16(const void *a, const void *b, void *c, int64_t batch,
                        int64_t m, int64_t n, int64_t k, int trans_a,
                        int trans_b, int64_t stride_a, int64_t stride_b) {
  return halfProduct(false, a, b, c, false, batch, m, n, k, trans_a, trans_b,
                     stride_a, stride_b);
}

int pcc_cpu_matmul_bf16_f32(const void *a, const void *b, float *c,
                            int64_t batch, int64_t m, int64_t n, int64_t k,
                            int trans_a, int trans_b, int64_t stride_a,
                            int64_t stride_b) {
  return halfProduct(false, a, b, c, true, batch, m, n, k, trans_a, trans_b,
                     stride_a, stride_b);
}

int pcc_cpu_matmul_f16(const void *a, const void *b, void *c, int64_t batch,
                       int64_t m, int64_t n, int64_t k, int trans_a,
                       int trans_b, int64_t stride_a, int64_t stride_b) {
  return halfProduct(true, a, b, c, false, batch, m, n, k, trans_a, trans_b,
                     stride_a, stride_b);
}

int pcc_cpu_matmul_f16_f32(const void *a, const void *b, float *c,
                           int64_t batch, int64_t m, int64_t n, int64_t k,
                           int trans_a, int trans_b, int64_t stride_a,
                           int64_t stride_b) {
  return halfProduct(true, a, b, c, true, batch, m, n, k, trans_a, trans_b,
                     stride_a, stride_b);
}

} // extern "C"
