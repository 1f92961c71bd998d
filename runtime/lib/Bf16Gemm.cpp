//===- Bf16Gemm.cpp - bf16 matrix products on the CPU through oneDNN ------===//
//
// pcc_cpu_matmul_bf16: bf16 operands, fp32 accumulation, a bf16 result (as
// torch.autocast's matmul, linear and bmm give). oneDNN picks the kernels
// for the CPU it runs on (AMX where the CPU has it, else AVX512-BF16's dot
// products, else a conversion to fp32); Debian's OpenBLAS 0.3.21 exports
// no bf16 GEMM (docs/design-notes.md, mixed precision). Primitives are made
// once per shape and kept: a step runs the same few shapes many times.
//
//===----------------------------------------------------------------------===//

#include "CpuError.h"
#include "pcc/runtime/CpuKernels.h"

#include <oneapi/dnnl/dnnl.hpp>

#include <map>
#include <mutex>
#include <string>
#include <tuple>

namespace {

using dnnl::memory;

struct Context {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::mutex lock;
  /// (m, n, k, trans_a, trans_b) -> the product of one batch entry.
  std::map<std::tuple<int64_t, int64_t, int64_t, int, int>, dnnl::matmul>
      products;
};

Context &context() {
  static Context ctx;
  return ctx;
}

/// A row-major `rows` x `cols` bf16 matrix, stored transposed when `trans`.
memory::desc matrix(int64_t rows, int64_t cols, bool trans,
                    memory::data_type type = memory::data_type::bf16) {
  return trans ? memory::desc({rows, cols}, type, memory::dims{1, rows})
               : memory::desc({rows, cols}, type, memory::dims{cols, 1});
}

} // namespace

extern "C" {

int pcc_cpu_matmul_bf16(const void *a, const void *b, void *c, int64_t batch,
                        int64_t m, int64_t n, int64_t k, int trans_a,
                        int trans_b, int64_t stride_a, int64_t stride_b) {
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
    auto key = std::make_tuple(m, n, k, trans_a, trans_b);
    auto found = ctx.products.find(key);
    if (found == ctx.products.end()) {
      dnnl::matmul::desc desc(matrix(m, k, trans_a), matrix(k, n, trans_b),
                              matrix(m, n, false));
      dnnl::matmul::primitive_desc pd(desc, ctx.engine);
      found = ctx.products.emplace(key, dnnl::matmul(pd)).first;
    }
    auto *x = static_cast<uint16_t *>(const_cast<void *>(a));
    auto *w = static_cast<uint16_t *>(const_cast<void *>(b));
    auto *y = static_cast<uint16_t *>(c);
    memory::desc ad = matrix(m, k, trans_a), bd = matrix(k, n, trans_b),
                 cd = matrix(m, n, false);
    for (int64_t i = 0; i < batch; ++i) {
      memory am(ad, ctx.engine, x + i * stride_a);
      memory bm(bd, ctx.engine, w + i * stride_b);
      memory cm(cd, ctx.engine, y + i * m * n);
      found->second.execute(
          ctx.stream,
          {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
    }
    ctx.stream.wait();
  } catch (const dnnl::error &e) {
    pccrt::cpuLastError = "oneDNN bf16 matmul (" + std::to_string(m) + " x " +
                          std::to_string(n) + " x " + std::to_string(k) +
                          "): " + e.what();
    return 1;
  }
  return 0;
}

} // extern "C"
