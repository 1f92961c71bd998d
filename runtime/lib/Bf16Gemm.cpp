//===- Bf16Gemm.cpp - 16-bit matrix products on the CPU through oneDNN ----===//
//
// pcc_cpu_matmul_bf16: bf16 operands, fp32 accumulation, a bf16 result (as
// torch.autocast's matmul, linear and bmm give). oneDNN picks the kernels
// for the CPU it runs on (AMX where the CPU has it, else AVX512-BF16's dot
// products, else a conversion to fp32); Debian's OpenBLAS 0.3.21 exports
// no bf16 GEMM (docs/design-notes.md, mixed precision). Primitives are made
// once per shape and kept: a step runs the same few shapes many times.
//
// pcc_cpu_matmul_f16: the same on fp16, where oneDNN has fp16 kernels for
// the CPU (AVX512-FP16 or AMX-FP16); elsewhere (oneDNN 2.6 has none for
// AVX512 without FP16, as on AMD Zen 4) the operands are widened exactly
// to fp32, multiplied by OpenBLAS's sgemm and the result rounded once:
// the same fp32 accumulation and rounding, at fp32's speed.
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
  /// fp16: -1 not yet asked, 0 oneDNN has no fp16 matmul for this CPU, 1 it
  /// has.
  int f16Native = -1;
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

/// Whether oneDNN has an fp16 matmul for this CPU (asked once).
bool f16Native() {
  Context &ctx = context();
  std::lock_guard<std::mutex> hold(ctx.lock);
  if (ctx.f16Native < 0) {
    try {
      auto f16 = memory::data_type::f16;
      dnnl::matmul::desc desc(matrix(8, 8, false, f16),
                              matrix(8, 8, false, f16),
                              matrix(8, 8, false, f16));
      dnnl::matmul::primitive_desc pd(desc, ctx.engine);
      ctx.f16Native = 1;
    } catch (const dnnl::error &) {
      ctx.f16Native = 0;
    }
  }
  return ctx.f16Native == 1;
}

/// The stored matrix behind a strided operand, widened to a dense f32
/// copy (row stride: the stored row's length).
std::vector<float> widenF16(const void *x, int64_t rows, int64_t cols,
                            bool trans, int64_t ld) {
  int64_t storedRows = trans ? cols : rows, storedCols = trans ? rows : cols;
  std::vector<float> out(static_cast<size_t>(storedRows * storedCols));
  const auto *h = static_cast<const uint16_t *>(x);
  for (int64_t r = 0; r < storedRows; ++r)
    for (int64_t c = 0; c < storedCols; ++c)
      out[r * storedCols + c] = pccrt::halfToFloat(h[r * ld + c]);
  return out;
}

} // namespace

int pccrt::halfGemm(bool f16, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                    const void *a, int64_t lda, const void *b, int64_t ldb,
                    bool accumulate, float *c, int64_t ldc) {
  if (m <= 0 || n <= 0)
    return 0;
  if (f16 && !f16Native()) {
    // No fp16 kernels here: the operands widened exactly, fp32's product.
    std::vector<float> x = widenF16(a, m, k, ta, lda),
                       y = widenF16(b, k, n, tb, ldb);
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

int pcc_cpu_matmul_bf16(const void *a, const void *b, void *c, int64_t batch,
                        int64_t m, int64_t n, int64_t k, int trans_a,
                        int trans_b, int64_t stride_a, int64_t stride_b) {
  return product(memory::data_type::bf16, memory::data_type::bf16, a, b, c,
                 batch, m, n, k, trans_a, trans_b, stride_a, stride_b);
}

int pcc_cpu_matmul_bf16_f32(const void *a, const void *b, float *c,
                            int64_t batch, int64_t m, int64_t n, int64_t k,
                            int trans_a, int trans_b, int64_t stride_a,
                            int64_t stride_b) {
  return product(memory::data_type::bf16, memory::data_type::f32, a, b, c,
                 batch, m, n, k, trans_a, trans_b, stride_a, stride_b);
}

namespace {
/// fp16 products: oneDNN's where it has fp16 kernels for this CPU, else
/// the operands widened exactly, multiplied in fp32 and (`f32Out` false)
/// the result rounded once.
int f16Product(const void *a, const void *b, void *c, bool f32Out,
               int64_t batch, int64_t m, int64_t n, int64_t k, int trans_a,
               int trans_b, int64_t stride_a, int64_t stride_b) {
  if (batch <= 0 || m <= 0 || n <= 0)
    return 0;
  if (f16Native())
    return product(memory::data_type::f16,
                   f32Out ? memory::data_type::f32 : memory::data_type::f16, a,
                   b, c, batch, m, n, k, trans_a, trans_b, stride_a, stride_b);
  int64_t na = (batch - 1) * stride_a + m * k;
  int64_t nb = (batch - 1) * stride_b + k * n;
  std::vector<float> x(static_cast<size_t>(na)), w(static_cast<size_t>(nb)),
      y(f32Out ? 0 : static_cast<size_t>(batch * m * n));
  pcc_cpu_cast(a, PCC_F16, x.data(), PCC_F32, na);
  pcc_cpu_cast(b, PCC_F16, w.data(), PCC_F32, nb);
  float *out = f32Out ? static_cast<float *>(c) : y.data();
  pcc_cpu_matmul_f32(x.data(), w.data(), out, batch, m, n, k, trans_a, trans_b,
                     stride_a, stride_b);
  if (!f32Out)
    pcc_cpu_cast(y.data(), PCC_F32, c, PCC_F16, batch * m * n);
  return 0;
}
} // namespace

int pcc_cpu_matmul_f16(const void *a, const void *b, void *c, int64_t batch,
                       int64_t m, int64_t n, int64_t k, int trans_a,
                       int trans_b, int64_t stride_a, int64_t stride_b) {
  return f16Product(a, b, c, false, batch, m, n, k, trans_a, trans_b, stride_a,
                    stride_b);
}

int pcc_cpu_matmul_f16_f32(const void *a, const void *b, float *c,
                           int64_t batch, int64_t m, int64_t n, int64_t k,
                           int trans_a, int trans_b, int64_t stride_a,
                           int64_t stride_b) {
  return f16Product(a, b, c, true, batch, m, n, k, trans_a, trans_b, stride_a,
                    stride_b);
}

} // extern "C"
