//===- CpuKernelsTest.cpp - CPU kernels against naive references ----------===//

#include "pcc/runtime/CpuKernels.h"
#include "pcc/runtime/HalfFloat.h"
#include "pcc/runtime/ModelAbi.h"
#include "pcc/runtime/Philox.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace {

std::vector<float> randomVector(size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float &x : v)
    x = dist(gen);
  return v;
}

void expectNear(const std::vector<float> &a, const std::vector<float> &b,
                float tol = 1e-5f) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i)
    ASSERT_NEAR(a[i], b[i], tol) << "at element " << i;
}

/// The exact (float64) product of batch entry `bi` at (i, j) of the
/// operands pcc_cpu_matmul_* take, each element read as a double by
/// `value`.
template <typename T, typename Value>
double referenceProduct(const std::vector<T> &a, const std::vector<T> &b,
                        int64_t bi, int64_t i, int64_t j, int64_t m, int64_t n,
                        int64_t k, int ta, int tb, bool shared, Value value) {
  double s = 0;
  const T *bb = b.data() + (shared ? 0 : bi * k * n);
  for (int64_t p = 0; p < k; ++p) {
    T av = ta ? a[bi * m * k + p * m + i] : a[bi * m * k + i * k + p];
    T bv = tb ? bb[j * k + p] : bb[p * n + j];
    s += value(av) * value(bv);
  }
  return s;
}

// Tests batched matmul with transposes, a shared right operand (the tall
// GEMM path) and per-batch right operands.
TEST(CpuKernels, Matmul) {
  const int64_t batch = 3, m = 4, n = 5, k = 6;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb)
      for (int shared = 0; shared < 2; ++shared) {
        auto a = randomVector(batch * m * k, 1);
        auto b = randomVector((shared ? 1 : batch) * k * n, 2);
        std::vector<float> c(batch * m * n), ref(batch * m * n, 0.0f);
        pcc_cpu_matmul_f32(a.data(), b.data(), c.data(), batch, m, n, k, ta, tb,
                           m * k, shared ? 0 : k * n);
        for (int64_t bi = 0; bi < batch; ++bi)
          for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < n; ++j)
              ref[(bi * m + i) * n + j] = float(
                  referenceProduct(a, b, bi, i, j, m, n, k, ta, tb, shared,
                                   [](float v) { return double(v); }));
        expectNear(c, ref);
      }
}

// roundToBf16 (the generated loops' rounding of a bf16 op's result, kept in
// a float) is bf16ToFloat(floatToBf16(f)) bit for bit: every 2^32 / 2^22
// bit pattern (all exponents, both signs, mantissas near and on the ties),
// and the special values; exactBf16 of its result is floatToBf16's.
TEST(HalfFloat, RoundToBf16) {
  auto check = [](uint32_t bits) {
    float f = pccrt::bitsToFloat(bits);
    uint32_t expected =
        pccrt::floatToBits(pccrt::bf16ToFloat(pccrt::floatToBf16(f)));
    float rounded = pccrt::roundToBf16(f);
    ASSERT_EQ(pccrt::floatToBits(rounded), expected) << std::hex << bits;
    ASSERT_EQ(pccrt::exactBf16(rounded), pccrt::floatToBf16(f))
        << std::hex << bits;
  };
  for (uint64_t bits = 0; bits < (uint64_t(1) << 32); bits += 1021)
    for (uint32_t low : {0x0000u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu})
      check((static_cast<uint32_t>(bits) & 0xffff0000u) | low);
  for (uint32_t bits : {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u,
                        0x7fc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu,
                        0x00000001u, 0x007fffffu, 0x7f7fffffu, 0x7f7f8000u})
    check(bits);
}

// An embedding's gradient: scatter_add zeroes its table and adds each
// update row at its index, in order; scatter_accumulate adds the same rows
// to what the table holds (rows no index names keep their values), and
// both refuse an index out of range before writing anything.
TEST(CpuKernels, ScatterAccumulate) {
  // Table [4, 2]; updates [3, 2] at rows 1, -1 (row 3) and 1 again.
  const float updates[] = {1, 2, 10, 20, 100, 200};
  const int64_t indices[] = {1, -1, 1};
  std::vector<float> table = {5, 6, 7, 8, 9, 10, 11, 12};
  ASSERT_EQ(pcc_cpu_scatter_accumulate_f32(updates, indices, table.data(), 1, 4,
                                           2, 3, 1),
            0);
  EXPECT_EQ(table, (std::vector<float>{5, 6, 108, 210, 9, 10, 21, 32}));
  std::vector<float> fresh(8, -1.0f);
  ASSERT_EQ(
      pcc_cpu_scatter_add_f32(updates, indices, fresh.data(), 1, 4, 2, 3, 1),
      0);
  EXPECT_EQ(fresh, (std::vector<float>{0, 0, 101, 202, 0, 0, 10, 20}));
  const int64_t bad[] = {1, 4, 0};
  std::vector<float> kept = table;
  EXPECT_NE(
      pcc_cpu_scatter_accumulate_f32(updates, bad, kept.data(), 1, 4, 2, 3, 1),
      0);
  EXPECT_EQ(kept, table);
  EXPECT_NE(std::string(pcc_cpu_last_error()).find("index 4"),
            std::string::npos);
}

// A vocabulary-parallel embedding's gradient (pcc.shard_scatter_add): each
// rank's block holds exactly the rows of the whole table's scatter-add that
// fall in it (indices into the whole dimension, negative from its end), the
// accumulating form adds them to what the block holds, and an index outside
// the whole dimension is refused on every rank.
TEST(CpuKernels, ScatterAddBlock) {
  // Whole table [4, 2] over 2 ranks of 2 rows; updates at rows 1, -1 (3),
  // 1 and 2.
  const float updates[] = {1, 2, 10, 20, 100, 200, 1000, 2000};
  const int64_t indices[] = {1, -1, 1, 2};
  std::vector<float> whole(8, -1.0f);
  ASSERT_EQ(
      pcc_cpu_scatter_add_f32(updates, indices, whole.data(), 1, 4, 2, 4, 1),
      0);
  for (int rank = 0; rank < 2; ++rank) {
    std::vector<float> block(4, -1.0f);
    ASSERT_EQ(pcc_cpu_scatter_add_block_f32(updates, indices, block.data(), 1,
                                            2, rank * 2, 4, 2, 4, 1),
              0);
    EXPECT_EQ(block, std::vector<float>(whole.begin() + rank * 4,
                                        whole.begin() + rank * 4 + 4))
        << "rank " << rank;
    std::vector<float> acc(4, 0.5f);
    ASSERT_EQ(pcc_cpu_scatter_accumulate_block_f32(updates, indices, acc.data(),
                                                   1, 2, rank * 2, 4, 2, 4, 1),
              0);
    for (int i = 0; i < 4; ++i)
      EXPECT_EQ(acc[i], block[i] + 0.5f) << "rank " << rank << " i " << i;
  }
  const int64_t bad[] = {1, 4};
  std::vector<float> block(4, 0.0f);
  EXPECT_NE(pcc_cpu_scatter_add_block_f32(updates, bad, block.data(), 1, 2, 0,
                                          4, 2, 2, 1),
            0);
  EXPECT_NE(std::string(pcc_cpu_last_error()).find("index 4"),
            std::string::npos);
}

// The bf16 casts of large tensors (8 MiB of results and more) stream their
// results past the caches: the same values as the element-wise conversions,
// from and to unaligned addresses, NaNs, infinities and ties included.
TEST(CpuKernels, CastBf16Large) {
  const int64_t n = (int64_t(4) << 20) + 37;
  std::mt19937 rng(7);
  std::vector<uint32_t> bits(n + 1);
  for (auto &b : bits)
    b = rng();
  const uint32_t special[] = {0x7f800000u, 0xff800000u, 0x7fc00001u,
                              0xffbfffffu, 0x00008000u, 0x3f808000u,
                              0x3f818000u, 0x7f7fffffu, 0x80000001u};
  for (int64_t j = 0; j < n; j += 4099)
    bits[j] = special[(j / 4099) % 9];
  for (int offset : {0, 1}) {
    std::vector<float> x(n + 1);
    for (int64_t j = 0; j <= n; ++j)
      x[j] = pccrt::bitsToFloat(bits[j]);
    std::vector<uint16_t> h(n + 1);
    pcc_cpu_cast(x.data() + offset, PCC_F32, h.data() + offset, PCC_BF16, n);
    for (int64_t j = 0; j < n; ++j)
      ASSERT_EQ(h[j + offset], pccrt::floatToBf16(x[j + offset]))
          << "element " << j << " offset " << offset;
    std::vector<float> back(n + 1);
    pcc_cpu_cast(h.data() + offset, PCC_BF16, back.data() + offset, PCC_F32, n);
    for (int64_t j = 0; j < n; ++j)
      ASSERT_EQ(pccrt::floatToBits(back[j + offset]),
                pccrt::floatToBits(pccrt::bf16ToFloat(h[j + offset])))
          << "element " << j << " offset " << offset;
  }
}

// The bf16 product (oneDNN): bf16 operands, fp32 accumulation, one
// rounding to bf16. Against the exact product of the same bf16 operands
// (float64) rounded once to bf16: fp32 accumulation over k = 96 moves a sum
// by far less than half a bf16 unit (2^-9 relative), so a result may differ
// from the reference only where the exact value lies that close to a
// rounding boundary, and then by one unit. Bound: every element within one
// bf16 unit, and at least 99% identical. Transposes, a shared right operand
// (one tall product) and per-batch right operands, as pcc_cpu_matmul_f32.
TEST(CpuKernels, MatmulBf16) {
  const int64_t batch = 3, m = 17, n = 40, k = 96;
  auto toBf16 = [](const std::vector<float> &v) {
    std::vector<uint16_t> out(v.size());
    for (size_t i = 0; i < v.size(); ++i)
      out[i] = pccrt::floatToBf16(v[i]);
    return out;
  };
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb)
      for (int shared = 0; shared < 2; ++shared) {
        auto a = toBf16(randomVector(batch * m * k, 3));
        auto b = toBf16(randomVector((shared ? 1 : batch) * k * n, 4));
        std::vector<uint16_t> c(batch * m * n);
        ASSERT_EQ(pcc_cpu_matmul_bf16(a.data(), b.data(), c.data(), batch, m, n,
                                      k, ta, tb, m * k, shared ? 0 : k * n),
                  0)
            << pcc_cpu_last_error();
        int64_t same = 0;
        for (int64_t bi = 0; bi < batch; ++bi)
          for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < n; ++j) {
              double s = referenceProduct(
                  a, b, bi, i, j, m, n, k, ta, tb, shared,
                  [](uint16_t v) { return double(pccrt::bf16ToFloat(v)); });
              uint16_t ref = pccrt::floatToBf16(float(s));
              uint16_t got = c[(bi * m + i) * n + j];
              same += got == ref;
              ASSERT_LE(std::abs(int(got) - int(ref)), 1)
                  << "at " << bi << "," << i << "," << j << ": "
                  << pccrt::bf16ToFloat(got) << " vs "
                  << pccrt::bf16ToFloat(ref) << " (ta " << ta << ", tb " << tb
                  << ", shared " << shared << ")";
            }
        EXPECT_GE(same, batch * m * n * 99 / 100)
            << "ta " << ta << ", tb " << tb << ", shared " << shared;
      }
}

// Tests the fp16 product (oneDNN's, or the operands widened to f32, sgemm
// and one rounding where oneDNN has no fp16 kernels for the CPU): every
// element within fp32 accumulation's error bound (2k units of 2^-24 of the
// sum of |a||b|) plus one fp16 rounding of the exact product of the fp16
// operands, and the f32-result form (a bias is added to the accumulator
// before rounding) within the accumulation bound alone.
TEST(CpuKernels, MatmulF16) {
  const int64_t batch = 2, m = 9, n = 24, k = 80;
  auto toF16 = [](const std::vector<float> &v) {
    std::vector<uint16_t> out(v.size());
    for (size_t i = 0; i < v.size(); ++i)
      out[i] = pccrt::floatToHalf(v[i]);
    return out;
  };
  auto widen = [](uint16_t v) { return double(pccrt::halfToFloat(v)); };
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb)
      for (int shared = 0; shared < 2; ++shared) {
        auto a = toF16(randomVector(batch * m * k, 5));
        auto b = toF16(randomVector((shared ? 1 : batch) * k * n, 6));
        std::vector<uint16_t> c(batch * m * n);
        std::vector<float> wide(batch * m * n);
        ASSERT_EQ(pcc_cpu_matmul_f16(a.data(), b.data(), c.data(), batch, m, n,
                                     k, ta, tb, m * k, shared ? 0 : k * n),
                  0)
            << pcc_cpu_last_error();
        ASSERT_EQ(pcc_cpu_matmul_f16_f32(a.data(), b.data(), wide.data(), batch,
                                         m, n, k, ta, tb, m * k,
                                         shared ? 0 : k * n),
                  0)
            << pcc_cpu_last_error();
        for (int64_t bi = 0; bi < batch; ++bi)
          for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < n; ++j) {
              double s = referenceProduct(a, b, bi, i, j, m, n, k, ta, tb,
                                          shared, widen);
              int64_t at = (bi * m + i) * n + j;
              // fp32 accumulation: within k rounding errors of the sum of
              // |a||b|; then one fp16 rounding (half a unit, 2^-11
              // relative, or half the smallest subnormal).
              double magnitude = referenceProduct(
                  a, b, bi, i, j, m, n, k, ta, tb, shared,
                  [&](uint16_t v) { return std::abs(widen(v)); });
              double accumulation = 2.0 * k * std::ldexp(magnitude, -24);
              double rounding =
                  std::ldexp(std::abs(s), -11) + std::ldexp(1.0, -25);
              ASSERT_LE(std::abs(pccrt::halfToFloat(c[at]) - s),
                        accumulation + rounding)
                  << "at " << bi << "," << i << "," << j << " (ta " << ta
                  << ", tb " << tb << ", shared " << shared << ")";
              ASSERT_LE(std::abs(wide[at] - s), accumulation)
                  << "at " << bi << "," << i << "," << j;
            }
      }
}

// Tests the f32 <-> fp16 casts: round to nearest even, exact widening,
// overflow to infinity.
TEST(CpuKernels, CastF16) {
  std::vector<float> x = {0.0f,     1.0f,  -2.5f,       65504.0f,
                          70000.0f, 1e-8f, 3.14159265f, 6.1e-5f};
  std::vector<uint16_t> h(x.size());
  std::vector<float> back(x.size());
  pcc_cpu_cast(x.data(), PCC_F32, h.data(), PCC_F16, int64_t(x.size()));
  pcc_cpu_cast(h.data(), PCC_F16, back.data(), PCC_F32, int64_t(x.size()));
  EXPECT_EQ(back[0], 0.0f);
  EXPECT_EQ(back[1], 1.0f);
  EXPECT_EQ(back[2], -2.5f);
  EXPECT_EQ(back[3], 65504.0f);
  EXPECT_TRUE(std::isinf(back[4]));
  EXPECT_EQ(back[5], 0.0f);
  EXPECT_NEAR(back[6], 3.140625f, 1e-7);
  for (size_t i = 0; i < x.size(); ++i)
    EXPECT_EQ(h[i], pccrt::floatToHalf(x[i])) << "element " << i;
}

// Tests transpose, broadcast and a reversed strided slice through the one
// strided-copy kernel.
TEST(CpuKernels, CopyStrided) {
  std::vector<float> x(24);
  for (int i = 0; i < 24; ++i)
    x[i] = float(i);
  // Transpose [2,3,4] by perm [2,0,1]: out[i][j][l] = x[j][l][i].
  std::vector<float> t(24);
  int64_t shape[] = {4, 2, 3}, xs[] = {1, 12, 4}, ys[] = {6, 3, 1};
  pcc_cpu_copy_strided(x.data(), t.data(), 4, 3, shape, xs, 0, ys, 0);
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 2; ++j)
      for (int l = 0; l < 3; ++l)
        ASSERT_EQ(t[i * 6 + j * 3 + l], x[j * 12 + l * 4 + i]);
  // Broadcast a column [3,1] to [2,3,4].
  std::vector<float> col = {7, 8, 9}, big(24);
  int64_t bshape[] = {2, 3, 4}, bxs[] = {0, 1, 0}, bys[] = {12, 4, 1};
  pcc_cpu_copy_strided(col.data(), big.data(), 4, 3, bshape, bxs, 0, bys, 0);
  for (int i = 0; i < 24; ++i)
    ASSERT_EQ(big[i], col[(i / 4) % 3]);
  // Reversed slice x[1, ::-2] of x viewed as [2, 12] -> 6 values.
  std::vector<float> r(6);
  int64_t rshape[] = {6}, rxs[] = {-2}, rys[] = {1};
  pcc_cpu_copy_strided(x.data(), r.data(), 4, 1, rshape, rxs, 23, rys, 0);
  EXPECT_EQ(r, (std::vector<float>{23, 21, 19, 17, 15, 13}));
}

// Tests gather with negative indices and the out-of-range error.
TEST(CpuKernels, Gather) {
  std::vector<float> table = {0, 1, 10, 11, 20, 21}; // [3, 2]
  std::vector<int64_t> idx = {2, -3, 1};
  std::vector<float> y(6);
  ASSERT_EQ(
      pcc_cpu_gather(table.data(), idx.data(), y.data(), 4, 1, 3, 2, 3, 1), 0);
  EXPECT_EQ(y, (std::vector<float>{20, 21, 0, 1, 10, 11}));
  std::vector<int32_t> bad = {3};
  EXPECT_NE(
      pcc_cpu_gather(table.data(), bad.data(), y.data(), 4, 1, 3, 2, 1, 0), 0);
  EXPECT_STREQ(pcc_cpu_last_error(),
               "gather index 3 is out of range for a dimension of size 3");
}

// Tests that the blocks of a table split along the gathered dimension give
// partial gathers that sum to the whole one (the vocabulary-parallel lookup).
TEST(CpuKernels, GatherBlock) {
  std::vector<float> table = {0, 1, 10, 11, 20, 21, 30, 31}; // [4, 2]
  std::vector<int64_t> idx = {3, -4, 1, -2};
  std::vector<float> whole(8), sum(8, 0), y(8);
  ASSERT_EQ(
      pcc_cpu_gather(table.data(), idx.data(), whole.data(), 4, 1, 4, 2, 4, 1),
      0);
  for (int64_t rank = 0; rank < 2; ++rank) {
    ASSERT_EQ(pcc_cpu_gather_block(table.data() + rank * 4, idx.data(),
                                   y.data(), 4, 1, 2, rank * 2, 4, 2, 4, 1),
              0);
    for (int i = 0; i < 8; ++i) {
      // Each entry comes from exactly one rank; the others write zeros.
      bool mine = (i / 2 == 0 || i / 2 == 3) ? rank == 1 : rank == 0;
      EXPECT_EQ(y[i], mine ? whole[i] : 0.0f) << "rank " << rank << " i " << i;
      sum[i] += y[i];
    }
  }
  EXPECT_EQ(sum, whole);
  // Indices are checked against the whole dimension.
  std::vector<int64_t> bad = {4};
  EXPECT_NE(pcc_cpu_gather_block(table.data(), bad.data(), y.data(), 4, 1, 2, 0,
                                 4, 2, 1, 1),
            0);
  EXPECT_STREQ(pcc_cpu_last_error(),
               "gather index 4 is out of range for a dimension of size 4");
}

// Tests softmax and log-softmax along a middle axis.
TEST(CpuKernels, Softmax) {
  auto x = randomVector(2 * 5 * 3, 3);
  std::vector<float> y(x.size()), ly(x.size());
  pcc_cpu_softmax_f32(x.data(), y.data(), 2, 5, 3, 0);
  pcc_cpu_softmax_f32(x.data(), ly.data(), 2, 5, 3, 1);
  for (int o = 0; o < 2; ++o)
    for (int i = 0; i < 3; ++i) {
      double denom = 0;
      for (int l = 0; l < 5; ++l)
        denom += std::exp(x[o * 15 + l * 3 + i]);
      for (int l = 0; l < 5; ++l) {
        int at = o * 15 + l * 3 + i;
        ASSERT_NEAR(y[at], std::exp(x[at]) / denom, 1e-6);
        ASSERT_NEAR(ly[at], x[at] - std::log(denom), 1e-5);
      }
    }
}

// Tests layer norm (zero mean, unit variance before scale/bias) and
// inference batch norm.
TEST(CpuKernels, Normalisation) {
  auto x = randomVector(3 * 8, 4);
  std::vector<float> scale(8, 2.0f), bias(8, 0.5f), y(x.size());
  pcc_cpu_layer_norm_f32(x.data(), scale.data(), bias.data(), y.data(), 3, 8,
                         0.0f);
  for (int r = 0; r < 3; ++r) {
    double mean = 0, var = 0;
    for (int c = 0; c < 8; ++c)
      mean += (y[r * 8 + c] - 0.5) / 2;
    mean /= 8;
    for (int c = 0; c < 8; ++c)
      var += std::pow((y[r * 8 + c] - 0.5) / 2 - mean, 2);
    EXPECT_NEAR(mean, 0.0, 1e-5);
    EXPECT_NEAR(var / 8, 1.0, 1e-4);
  }
  std::vector<float> in = {1, 2, 3, 4}, s = {2, 1}, b = {0, 1}, m = {1, 0},
                     v = {4, 1}, out(4);
  pcc_cpu_batch_norm_f32(in.data(), s.data(), b.data(), m.data(), v.data(),
                         out.data(), 1, 2, 2, 0.0f);
  expectNear(out, {0, 1, 4, 5});
}

// Tests reductions over non-adjacent axes and every kind.
// The fused squared norm gives the bits of the product kernel's squares
// summed by the whole-tensor reduction it replaces.
TEST(CpuKernels, SumSquares) {
  for (int64_t n : {int64_t(0), int64_t(3), int64_t(1000003)}) {
    std::vector<float> x(n), squares(n);
    uint32_t state = 12345;
    for (int64_t i = 0; i < n; ++i) {
      state = state * 1664525u + 1013904223u;
      x[i] = (static_cast<float>(state >> 8) / 16777216.0f - 0.5f) * 1e-3f;
      squares[i] = x[i] * x[i];
    }
    float fused = -1, reference = -1;
    pcc_cpu_sum_squares_f32(x.data(), &fused, n);
    int64_t shape[] = {n}, reduced[] = {1};
    pcc_cpu_reduce_f32(squares.data(), &reference, 1, shape, reduced,
                       PCC_REDUCE_SUM);
    EXPECT_EQ(std::memcmp(&fused, &reference, sizeof(float)), 0)
        << n << ": " << fused << " vs " << reference;
  }
}

TEST(CpuKernels, Reduce) {
  std::vector<float> x(24);
  for (int i = 0; i < 24; ++i)
    x[i] = float(i % 7) - 3;
  int64_t shape[] = {2, 3, 4}, reduced[] = {1, 0, 1};
  for (int kind = 0; kind < 5; ++kind) {
    std::vector<float> y(3);
    pcc_cpu_reduce_f32(x.data(), y.data(), 3, shape, reduced, kind);
    for (int j = 0; j < 3; ++j) {
      double acc = kind == PCC_REDUCE_MAX    ? -1e30
                   : kind == PCC_REDUCE_MIN  ? 1e30
                   : kind == PCC_REDUCE_PROD ? 1
                                             : 0;
      for (int i = 0; i < 2; ++i)
        for (int l = 0; l < 4; ++l) {
          double v = x[i * 12 + j * 4 + l];
          acc = kind == PCC_REDUCE_MAX    ? std::max(acc, v)
                : kind == PCC_REDUCE_MIN  ? std::min(acc, v)
                : kind == PCC_REDUCE_PROD ? acc * v
                                          : acc + v;
        }
      if (kind == PCC_REDUCE_MEAN)
        acc /= 8;
      ASSERT_NEAR(y[j], acc, 1e-4) << "kind " << kind << " column " << j;
    }
  }
}

/// Direct convolution, for comparison with the im2col + GEMM kernel.
std::vector<float> naiveConv2d(const std::vector<float> &x,
                               const std::vector<float> &w, const float *bias,
                               int64_t n, int64_t c, int64_t h, int64_t wd,
                               int64_t m, int64_t kh, int64_t kw, int64_t s,
                               int64_t p, int64_t dil, int64_t groups,
                               int64_t oh, int64_t ow) {
  std::vector<float> y(n * m * oh * ow, 0.0f);
  int64_t cg = c / groups, mg = m / groups;
  for (int64_t b = 0; b < n; ++b)
    for (int64_t o = 0; o < m; ++o)
      for (int64_t i = 0; i < oh; ++i)
        for (int64_t j = 0; j < ow; ++j) {
          double acc = bias ? bias[o] : 0.0;
          int64_t g = o / mg;
          for (int64_t ci = 0; ci < cg; ++ci)
            for (int64_t u = 0; u < kh; ++u)
              for (int64_t v = 0; v < kw; ++v) {
                int64_t yi = i * s - p + u * dil, xj = j * s - p + v * dil;
                if (yi < 0 || yi >= h || xj < 0 || xj >= wd)
                  continue;
                acc += x[((b * c + g * cg + ci) * h + yi) * wd + xj] *
                       w[((o * cg + ci) * kh + u) * kw + v];
              }
          y[((b * m + o) * oh + i) * ow + j] = float(acc);
        }
  return y;
}

// Tests grouped, strided, padded and dilated 2-D convolution with bias.
TEST(CpuKernels, Conv2d) {
  struct Case {
    int64_t stride, pad, dil, groups;
  } cases[] = {{1, 0, 1, 1}, {2, 1, 1, 2}, {1, 2, 2, 1}, {1, 1, 1, 4}};
  for (const Case &cs : cases) {
    int64_t n = 2, c = 4, h = 7, wd = 6, m = 8, kh = 3, kw = 3;
    int64_t oh = (h + 2 * cs.pad - cs.dil * (kh - 1) - 1) / cs.stride + 1;
    int64_t ow = (wd + 2 * cs.pad - cs.dil * (kw - 1) - 1) / cs.stride + 1;
    auto x = randomVector(n * c * h * wd, 5);
    auto w = randomVector(m * (c / cs.groups) * kh * kw, 6);
    auto bias = randomVector(m, 7);
    std::vector<float> y(n * m * oh * ow);
    int64_t in[] = {n, c, h, wd}, ws[] = {m, c / cs.groups, kh, kw},
            out[] = {n, m, oh, ow}, st[] = {cs.stride, cs.stride},
            pd[] = {cs.pad, cs.pad, cs.pad, cs.pad}, dl[] = {cs.dil, cs.dil};
    pcc_cpu_conv_f32(x.data(), w.data(), bias.data(), y.data(), 2, in, ws, out,
                     st, pd, dl, cs.groups);
    expectNear(y,
               naiveConv2d(x, w, bias.data(), n, c, h, wd, m, kh, kw, cs.stride,
                           cs.pad, cs.dil, cs.groups, oh, ow),
               1e-4f);
  }
}

// Tests max and average pooling with padding; the average with and without
// counting padded positions.
TEST(CpuKernels, Pooling) {
  std::vector<float> x = {1, 2, 3, 4, 5, 6, 7, 8, 9}; // [1,1,3,3]
  int64_t in[] = {1, 1, 3, 3}, out[] = {1, 1, 2, 2}, k[] = {2, 2}, s[] = {2, 2},
          p[] = {1, 1, 1, 1}, d[] = {1, 1};
  std::vector<float> y(4);
  pcc_cpu_max_pool_f32(x.data(), y.data(), 2, in, out, k, s, p, d);
  EXPECT_EQ(y, (std::vector<float>{1, 3, 7, 9}));
  pcc_cpu_avg_pool_f32(x.data(), y.data(), 2, in, out, k, s, p, d, 0);
  EXPECT_EQ(y, (std::vector<float>{1, 2.5, 5.5, 7}));
  pcc_cpu_avg_pool_f32(x.data(), y.data(), 2, in, out, k, s, p, d, 1);
  EXPECT_EQ(y, (std::vector<float>{0.25, 1.25, 2.75, 7}));
}

// Tests casts: truncation, booleans, and half/bfloat16 round trips.
TEST(CpuKernels, Cast) {
  std::vector<float> x = {-1.7f, 0.0f, 2.5f, 65504.0f};
  std::vector<int64_t> i(4);
  pcc_cpu_cast(x.data(), PCC_F32, i.data(), PCC_I64, 4);
  EXPECT_EQ(i, (std::vector<int64_t>{-1, 0, 2, 65504}));
  std::vector<uint8_t> b(4);
  pcc_cpu_cast(x.data(), PCC_F32, b.data(), PCC_BOOL, 4);
  EXPECT_EQ(b, (std::vector<uint8_t>{1, 0, 1, 1}));
  std::vector<uint16_t> h(4);
  std::vector<float> back(4);
  pcc_cpu_cast(x.data(), PCC_F32, h.data(), PCC_F16, 4);
  pcc_cpu_cast(h.data(), PCC_F16, back.data(), PCC_F32, 4);
  EXPECT_NEAR(back[0], -1.7f, 1e-3);
  EXPECT_EQ(back[3], 65504.0f);
  EXPECT_EQ(pccrt::halfToFloat(pccrt::floatToHalf(1e6f)), INFINITY);
  EXPECT_EQ(pccrt::bf16ToFloat(pccrt::floatToBf16(1.0f)), 1.0f);
  EXPECT_NEAR(pccrt::halfToFloat(pccrt::floatToHalf(3e-6f)), 3e-6f, 6e-8f);
}

// Philox-4x32-10 reproduces the known-answer vectors of Random123 (the
// reference implementation of Salmon et al.).
TEST(Philox, KnownAnswers) {
  auto check = [](pccrt::Philox4 counter, uint32_t k0, uint32_t k1,
                  pccrt::Philox4 want) {
    pccrt::Philox4 got = pccrt::philox4x32(counter, k0, k1);
    for (int i = 0; i < 4; ++i)
      EXPECT_EQ(got.v[i], want.v[i]) << "word " << i;
  };
  check({{0, 0, 0, 0}}, 0, 0,
        {{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}});
  check({{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}}, 0xffffffffu,
        0xffffffffu, {{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}});
  check({{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}}, 0xa4093822u,
        0x299f31d0u, {{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}});
}

// Dropout keeps about 1 - ratio of the elements, scaled by 1 / (1 - ratio);
// the same (seed, step, micro-batch, stream) gives the same mask and any
// other gives another.
TEST(CpuKernels, Dropout) {
  const int64_t n = 200003; // not a multiple of 4
  std::vector<float> x(n, 2.0f), y(n), z(n);
  double hyper[PCC_NUM_HYPER] = {};
  hyper[PCC_HYPER_SEED] = 1234;
  hyper[PCC_HYPER_STEP] = 7;
  hyper[PCC_HYPER_MICROBATCH] = 1;
  const double ratio = 0.3;
  pcc_cpu_dropout_f32(x.data(), y.data(), n, ratio, 2, hyper);
  int64_t kept = 0;
  for (float v : y) {
    ASSERT_TRUE(v == 0.0f || v == static_cast<float>(2.0f / (1.0 - ratio)))
        << v;
    kept += v != 0.0f;
  }
  // Binomial(n, 0.7): the standard deviation is about 205 elements.
  EXPECT_NEAR(static_cast<double>(kept) / n, 1 - ratio, 0.005);
  pcc_cpu_dropout_f32(x.data(), z.data(), n, ratio, 2, hyper);
  EXPECT_EQ(y, z);
  auto differs = [&](int which, double value) {
    double h[PCC_NUM_HYPER];
    std::copy(hyper, hyper + PCC_NUM_HYPER, h);
    if (which >= 0)
      h[which] = value;
    pcc_cpu_dropout_f32(x.data(), z.data(), n, ratio, which < 0 ? 3 : 2, h);
    return y != z;
  };
  EXPECT_TRUE(differs(PCC_HYPER_SEED, 1235));
  EXPECT_TRUE(differs(PCC_HYPER_STEP, 8));
  EXPECT_TRUE(differs(PCC_HYPER_MICROBATCH, 0));
  EXPECT_TRUE(differs(-1, 0)); // another stream
}

// Cross-entropy of bf16 logits: the losses and gradient of the widened
// logits bit for bit (f32 kernels), the gradient rounded as pcc_cpu_cast
// rounds it; an ignored row is zeros, a bad label an error.
TEST(CpuKernels, CrossEntropyBf16) {
  const int64_t rows = 6, classes = 70001; // a ragged row length
  std::vector<uint16_t> half(rows * classes);
  std::vector<float> wide(rows * classes);
  for (int64_t i = 0; i < rows * classes; ++i) {
    half[i] =
        pccrt::floatToBf16(8.0f * std::sin(0.37f * static_cast<float>(i)));
    wide[i] = pccrt::bf16ToFloat(half[i]);
  }
  std::vector<int64_t> labels = {3, 70000, -100, 0, 12345, 69999};
  std::vector<float> grad = {0.5f, 0.25f, 1.0f, 0.125f, 2.0f, 1.0f / 3};
  std::vector<float> loss(rows), expectLoss(rows);
  ASSERT_EQ(0, pcc_cpu_cross_entropy_f32(wide.data(), labels.data(),
                                         expectLoss.data(), rows, classes, -100,
                                         1));
  ASSERT_EQ(0, pcc_cpu_cross_entropy_bf16(half.data(), labels.data(),
                                          loss.data(), rows, classes, -100, 1));
  EXPECT_EQ(0, std::memcmp(loss.data(), expectLoss.data(), 4 * rows));
  EXPECT_EQ(loss[2], 0.0f);
  std::vector<float> dx(rows * classes), expect(rows * classes);
  ASSERT_EQ(0, pcc_cpu_cross_entropy_grad_f32(wide.data(), labels.data(),
                                              grad.data(), expect.data(), rows,
                                              classes, -100, 1));
  ASSERT_EQ(0, pcc_cpu_cross_entropy_grad_bf16(half.data(), labels.data(),
                                               grad.data(), dx.data(), 0, rows,
                                               classes, -100, 1));
  EXPECT_EQ(0, std::memcmp(dx.data(), expect.data(), 4 * rows * classes));
  std::vector<uint16_t> dh(rows * classes), expectHalf(rows * classes);
  pcc_cpu_cast(expect.data(), PCC_F32, expectHalf.data(), PCC_BF16,
               rows * classes);
  ASSERT_EQ(0, pcc_cpu_cross_entropy_grad_bf16(half.data(), labels.data(),
                                               grad.data(), dh.data(), 1, rows,
                                               classes, -100, 1));
  EXPECT_EQ(dh, expectHalf);
  labels[1] = classes; // out of range
  EXPECT_NE(0, pcc_cpu_cross_entropy_bf16(half.data(), labels.data(),
                                          loss.data(), rows, classes, -100, 1));
}

// AdamW with a 16-bit copy: the update bit for bit pcc_cpu_adamw_f32's,
// and the copy pcc_cpu_cast's rounding of the updated weights (bf16 over
// the streaming threshold, f16); a skipped update (fp16's overflow) leaves
// both as they were.
TEST(CpuKernels, AdamwCopy) {
  const int64_t n = (int64_t(3) << 20) + 5; // streams; a ragged end
  std::vector<float> p(n), g(n), m(n), v(n);
  for (int64_t i = 0; i < n; ++i) {
    p[i] = std::sin(0.001f * static_cast<float>(i)) * 3.0f;
    g[i] = std::cos(0.0007f * static_cast<float>(i)) * 0.01f;
    m[i] = 0.001f * std::sin(0.013f * static_cast<float>(i));
    v[i] = 1e-6f * (1.5f + std::cos(0.011f * static_cast<float>(i)));
  }
  double hyper[PCC_NUM_HYPER] = {};
  hyper[PCC_HYPER_LR] = 3e-3;
  hyper[PCC_HYPER_BETA1] = 0.9;
  hyper[PCC_HYPER_BETA2] = 0.95;
  hyper[PCC_HYPER_EPS] = 1e-8;
  hyper[PCC_HYPER_WEIGHT_DECAY] = 0.1;
  hyper[PCC_HYPER_MAX_GRAD_NORM] = 1.0;
  hyper[PCC_HYPER_STEP] = 3;
  hyper[PCC_HYPER_GRAD_SCALE] = 1.0;
  float norm = 2.5f;
  for (int type : {PCC_BF16, PCC_F16}) {
    std::vector<float> p1 = p, m1 = m, v1 = v, p2 = p, m2 = m, v2 = v;
    pcc_cpu_adamw_f32(p1.data(), g.data(), m1.data(), v1.data(), n, hyper,
                      &norm);
    std::vector<uint16_t> cast(n), copy(n, 0xabcd);
    pcc_cpu_cast(p1.data(), PCC_F32, cast.data(), type, n);
    pcc_cpu_adamw_copy_f32(p2.data(), g.data(), m2.data(), v2.data(), n, hyper,
                           &norm, copy.data(), type);
    EXPECT_EQ(0, std::memcmp(p1.data(), p2.data(), 4 * n));
    EXPECT_EQ(0, std::memcmp(m1.data(), m2.data(), 4 * n));
    EXPECT_EQ(0, std::memcmp(v1.data(), v2.data(), 4 * n));
    EXPECT_EQ(cast, copy) << "copy type " << type;
  }
  // A bf16 gradient: the update of its widened values, bit for bit.
  std::vector<uint16_t> gh(n);
  std::vector<float> gw(n);
  for (int64_t i = 0; i < n; ++i) {
    gh[i] = pccrt::floatToBf16(g[i]);
    gw[i] = pccrt::bf16ToFloat(gh[i]);
  }
  {
    std::vector<float> p1 = p, m1 = m, v1 = v, p2 = p, m2 = m, v2 = v;
    std::vector<uint16_t> c1(n), c2(n);
    pcc_cpu_adamw_copy_f32(p1.data(), gw.data(), m1.data(), v1.data(), n, hyper,
                           &norm, c1.data(), PCC_BF16);
    pcc_cpu_adamw_bf16_grad_f32(p2.data(), gh.data(), m2.data(), v2.data(), n,
                                hyper, &norm, c2.data(), PCC_BF16);
    EXPECT_EQ(0, std::memcmp(p1.data(), p2.data(), 4 * n));
    EXPECT_EQ(0, std::memcmp(m1.data(), m2.data(), 4 * n));
    EXPECT_EQ(0, std::memcmp(v1.data(), v2.data(), 4 * n));
    EXPECT_EQ(c1, c2);
    // Its squared norm: the widened tensor's, bit for bit (one block and
    // many).
    for (int64_t len : {int64_t(1000), n}) {
      float s1 = 0, s2 = 0;
      pcc_cpu_sum_squares_f32(gw.data(), &s1, len);
      pcc_cpu_sum_squares_bf16(gh.data(), &s2, len);
      EXPECT_EQ(0, std::memcmp(&s1, &s2, 4)) << len;
    }
  }
  hyper[PCC_HYPER_SKIP_NONFINITE] = 1;
  float inf = std::numeric_limits<float>::infinity();
  std::vector<float> p3 = p;
  std::vector<uint16_t> copy(n, 0xabcd);
  pcc_cpu_adamw_copy_f32(p3.data(), g.data(), m.data(), v.data(), n, hyper,
                         &inf, copy.data(), PCC_BF16);
  EXPECT_EQ(p3, p);
  EXPECT_TRUE(std::all_of(copy.begin(), copy.end(),
                          [](uint16_t c) { return c == 0xabcd; }));
}

} // namespace

namespace {

/// Naive float64 attention and its gradient on the shapes of a
/// pcc_attention_shape (with an optional [B, 1, 1, L] bias).
struct AttentionReference {
  std::vector<double> out, lse, dq, dk, dv;
};

AttentionReference referenceAttention(const pcc_attention_shape &s,
                                      const std::vector<double> &q,
                                      const std::vector<double> &k,
                                      const std::vector<double> &v,
                                      const std::vector<double> &bias,
                                      const std::vector<double> &g) {
  int64_t group = s.heads / s.kv_heads, d = s.head_dim, dv = s.v_dim;
  AttentionReference r;
  r.out.assign(s.batch * s.heads * s.seq * dv, 0.0);
  r.lse.assign(s.batch * s.heads * s.seq, 0.0);
  r.dq.assign(q.size(), 0.0);
  r.dk.assign(k.size(), 0.0);
  r.dv.assign(v.size(), 0.0);
  std::vector<double> p(s.len);
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads; ++h) {
      int64_t qh = b * s.heads + h, kh = b * s.kv_heads + h / group;
      for (int64_t i = 0; i < s.seq; ++i) {
        int64_t visible =
            s.causal ? std::clamp<int64_t>(i + s.len - s.seq + 1, 0, s.len)
                     : s.len;
        double m = -INFINITY;
        for (int64_t j = 0; j < visible; ++j) {
          double dot = 0;
          for (int64_t c = 0; c < d; ++c)
            dot += q[(qh * s.seq + i) * d + c] * k[(kh * s.len + j) * d + c];
          p[j] = dot * s.scale + (bias.empty() ? 0.0 : bias[b * s.len + j]);
          m = std::max(m, p[j]);
        }
        if (m == -INFINITY) {
          r.lse[qh * s.seq + i] = -INFINITY;
          continue;
        }
        double sum = 0;
        for (int64_t j = 0; j < visible; ++j)
          sum += std::exp(p[j] - m);
        r.lse[qh * s.seq + i] = m + std::log(sum);
        for (int64_t j = 0; j < visible; ++j)
          p[j] = std::exp(p[j] - m) / sum;
        double *o = &r.out[(qh * s.seq + i) * dv];
        for (int64_t j = 0; j < visible; ++j)
          for (int64_t c = 0; c < dv; ++c)
            o[c] += p[j] * v[(kh * s.len + j) * dv + c];
        const double *gi = &g[(qh * s.seq + i) * dv];
        double rowDot = 0;
        for (int64_t c = 0; c < dv; ++c)
          rowDot += gi[c] * o[c];
        for (int64_t j = 0; j < visible; ++j) {
          double dp = 0;
          for (int64_t c = 0; c < dv; ++c) {
            dp += gi[c] * v[(kh * s.len + j) * dv + c];
            r.dv[(kh * s.len + j) * dv + c] += p[j] * gi[c];
          }
          double ds = p[j] * (dp - rowDot) * s.scale;
          for (int64_t c = 0; c < d; ++c) {
            r.dq[(qh * s.seq + i) * d + c] += ds * k[(kh * s.len + j) * d + c];
            r.dk[(kh * s.len + j) * d + c] += ds * q[(qh * s.seq + i) * d + c];
          }
        }
      }
    }
  return r;
}

std::vector<uint16_t> toBf16(const std::vector<float> &x) {
  std::vector<uint16_t> y(x.size());
  for (size_t i = 0; i < x.size(); ++i)
    y[i] = pccrt::floatToBf16(x[i]);
  return y;
}

std::vector<double> widen(const std::vector<float> &x, bool bf16) {
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i)
    y[i] = bf16 ? pccrt::bf16ToFloat(pccrt::floatToBf16(x[i])) : x[i];
  return y;
}

template <typename T> std::vector<double> asDouble(const std::vector<T> &x) {
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    if constexpr (std::is_same_v<T, uint16_t>)
      y[i] = pccrt::bf16ToFloat(x[i]);
    else
      y[i] = x[i];
  }
  return y;
}

void expectClose(const std::vector<double> &got,
                 const std::vector<double> &want, double tol,
                 const char *what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isinf(want[i])) {
      ASSERT_EQ(got[i], want[i]) << what << " element " << i;
      continue;
    }
    ASSERT_NEAR(got[i], want[i], tol * (1.0 + std::fabs(want[i])))
        << what << " element " << i;
  }
}

/// One case in f32 (dtype 0) or bf16 (1): the kernels against the float64
/// reference on the same (rounded) inputs.
template <typename T>
void checkAttention(pcc_attention_shape s, bool withBias, double tol) {
  int64_t nq = s.batch * s.heads * s.seq * s.head_dim,
          nk = s.batch * s.kv_heads * s.len * s.head_dim,
          nv = s.batch * s.kv_heads * s.len * s.v_dim,
          no = s.batch * s.heads * s.seq * s.v_dim;
  bool bf16 = std::is_same_v<T, uint16_t>;
  std::vector<float> qf = randomVector(nq, 1), kf = randomVector(nk, 2),
                     vf = randomVector(nv, 3), gf = randomVector(no, 4);
  std::vector<float> bias;
  if (withBias) {
    // A padding mask: the last key of batch entry 1 masked.
    bias.assign(s.batch * s.len, 0.0f);
    bias[1 * s.len + s.len - 1] = -INFINITY;
    s.bias_strides[0] = s.len;
    s.bias_strides[3] = 1;
  }
  auto in = [&](const std::vector<float> &x) {
    if constexpr (std::is_same_v<T, uint16_t>)
      return toBf16(x);
    else
      return x;
  };
  std::vector<T> q = in(qf), k = in(kf), v = in(vf), g = in(gf);
  std::vector<T> out(no), dq(nq), dk(nk), dv(nv);
  std::vector<float> lse(s.batch * s.heads * s.seq);
  const float *b = withBias ? bias.data() : nullptr;
  ASSERT_EQ(pcc_cpu_attention(&s, q.data(), k.data(), v.data(), b, out.data(),
                              lse.data()),
            0)
      << pcc_cpu_last_error();
  std::vector<double> biasD(bias.begin(), bias.end());
  AttentionReference ref =
      referenceAttention(s, widen(qf, bf16), widen(kf, bf16), widen(vf, bf16),
                         biasD, widen(gf, bf16));
  expectClose(asDouble(out), ref.out, tol, "out");
  expectClose(asDouble(lse), ref.lse, 1e-5, "lse");
  ASSERT_EQ(pcc_cpu_attention_grad(&s, q.data(), k.data(), v.data(),
                                   out.data(), lse.data(), g.data(), b,
                                   dq.data(), dk.data(), dv.data()),
            0)
      << pcc_cpu_last_error();
  // The gradient reads the kernel's own (rounded) forward result.
  expectClose(asDouble(dq), ref.dq, tol * 4, "dq");
  expectClose(asDouble(dk), ref.dk, tol * 4, "dk");
  expectClose(asDouble(dv), ref.dv, tol * 4, "dv");
}

pcc_attention_shape attentionShape(int64_t batch, int64_t heads,
                                   int64_t kvHeads, int64_t seq, int64_t len,
                                   int64_t d, int causal, int dtype) {
  pcc_attention_shape s{};
  s.batch = batch;
  s.heads = heads;
  s.kv_heads = kvHeads;
  s.seq = seq;
  s.len = len;
  s.head_dim = d;
  s.v_dim = d;
  s.scale = 1.0 / std::sqrt(static_cast<double>(d));
  s.causal = causal;
  s.dtype = dtype;
  return s;
}

} // namespace

TEST(CpuKernels, Attention) {
  // Several strips (130 rows: 64 + 64 + 2 under the causal mask, one strip
  // of 130 without), grouped-query heads, fewer queries than keys (the
  // causal mask aligned to the bottom right), a padding bias.
  SCOPED_TRACE("f32 causal");
  checkAttention<float>(attentionShape(2, 4, 2, 130, 130, 16, 1, 0), false,
                        1e-5);
  SCOPED_TRACE("f32 plain, grouped, bias");
  checkAttention<float>(attentionShape(2, 6, 2, 33, 47, 8, 0, 0), true, 1e-5);
  SCOPED_TRACE("f32 causal, queries < keys, bias");
  checkAttention<float>(attentionShape(2, 2, 2, 70, 90, 8, 1, 0), true, 1e-5);
  SCOPED_TRACE("bf16 causal, grouped");
  checkAttention<uint16_t>(attentionShape(2, 4, 1, 100, 100, 32, 1, 1), false,
                           2e-2);
  // Past 512 x 512 under a causal mask: a query head and a strip of 64 rows
  // at a time (10 strips, the last of 24 rows).
  SCOPED_TRACE("f32 causal, strips, grouped, bias");
  checkAttention<float>(attentionShape(2, 2, 1, 600, 600, 8, 1, 0), true, 1e-5);
  SCOPED_TRACE("bf16 causal, strips");
  checkAttention<uint16_t>(attentionShape(1, 2, 2, 600, 610, 8, 1, 1), false,
                           2e-2);
}

TEST(CpuKernels, Attention_SameBitsWhateverTheBatch) {
  // Data parallelism splits the batch: each entry's rows keep their bits.
  pcc_attention_shape whole = attentionShape(4, 2, 2, 80, 80, 16, 1, 0);
  pcc_attention_shape half = whole;
  half.batch = 2;
  int64_t nq = 4 * 2 * 80 * 16;
  std::vector<float> q = randomVector(nq, 5), k = randomVector(nq, 6),
                     v = randomVector(nq, 7);
  std::vector<float> out(nq), lse(4 * 2 * 80), outHalf(nq / 2),
      lseHalf(4 * 80);
  ASSERT_EQ(pcc_cpu_attention(&whole, q.data(), k.data(), v.data(), nullptr,
                              out.data(), lse.data()),
            0);
  ASSERT_EQ(pcc_cpu_attention(&half, q.data() + nq / 2, k.data() + nq / 2,
                              v.data() + nq / 2, nullptr, outHalf.data(),
                              lseHalf.data()),
            0);
  EXPECT_EQ(0, std::memcmp(out.data() + nq / 2, outHalf.data(),
                           outHalf.size() * sizeof(float)));
}

//===----------------------------------------------------------------------===//
// The LM head's fused cross-entropy
//===----------------------------------------------------------------------===//

namespace {

/// Each row's lse and label logit against `logits` ([rows, vocab] in
/// double; this call's classes from `start`), within the tolerances;
/// returns the rows whose label logit has the reference's exact value.
template <typename Label>
int64_t checkRowStatistics(const std::vector<double> &logits,
                           const std::vector<Label> &labels, int64_t start,
                           int64_t vocab, const std::vector<float> &lse,
                           const std::vector<float> &target, double lseTol,
                           double targetTol) {
  int64_t exact = 0;
  for (size_t r = 0; r < labels.size(); ++r) {
    const double *row = logits.data() + r * vocab;
    double m = -INFINITY, sum = 0;
    for (int64_t v = 0; v < vocab; ++v)
      m = std::max(m, row[v]);
    for (int64_t v = 0; v < vocab; ++v)
      sum += std::exp(row[v] - m);
    EXPECT_NEAR(lse[r], m + std::log(sum), lseTol) << "row " << r;
    int64_t label = labels[r] == -100 ? -1 : labels[r] - start;
    double expected = label >= 0 && label < vocab ? row[label] : 0.0;
    EXPECT_NEAR(target[r], expected, targetTol) << "row " << r;
    exact += target[r] == expected;
  }
  return exact;
}

/// pcc_cpu_linear_cross_entropy and its gradient against the logits
/// computed whole in double: several blocks of rows (512 each) and of
/// classes (2048 each), ignored rows, and with `start` > 0 a block of a
/// vocabulary split over ranks (labels of other blocks give target 0).
template <typename Label>
void checkLinearCrossEntropy(int64_t rows, int64_t dim, int64_t vocab,
                             int64_t start, int64_t total, bool transposeW) {
  pcc_lce_shape s{
      rows, dim, vocab, total, -100, transposeW ? 1 : 0, sizeof(Label) == 8, 0};
  std::vector<float> h = randomVector(rows * dim, 11),
                     w = randomVector(vocab * dim, 12);
  std::mt19937 gen(13);
  std::vector<Label> labels(rows);
  for (int64_t r = 0; r < rows; ++r)
    labels[r] = r % 7 == 3 ? -100 : static_cast<Label>(gen() % total);
  auto weight = [&](int64_t v, int64_t d) {
    return static_cast<double>(transposeW ? w[v * dim + d] : w[d * vocab + v]);
  };
  std::vector<double> logits(rows * vocab);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t v = 0; v < vocab; ++v) {
      double x = 0;
      for (int64_t d = 0; d < dim; ++d)
        x += static_cast<double>(h[r * dim + d]) * weight(v, d);
      logits[r * vocab + v] = x;
    }
  std::vector<float> lse(rows), target(rows);
  ASSERT_EQ(pcc_cpu_linear_cross_entropy(&s, start, h.data(), w.data(),
                                         labels.data(), lse.data(),
                                         target.data()),
            0)
      << pcc_cpu_last_error();
  checkRowStatistics(logits, labels, start, vocab, lse, target, 1e-4, 1e-4);
  // The gradient, with random cotangents.
  std::vector<float> gl = randomVector(rows, 14), gt = randomVector(rows, 15);
  std::vector<float> dh(rows * dim), dw(vocab * dim);
  ASSERT_EQ(pcc_cpu_linear_cross_entropy_grad(
                &s, start, h.data(), w.data(), labels.data(), lse.data(),
                gl.data(), gt.data(), dh.data(), dw.data()),
            0)
      << pcc_cpu_last_error();
  std::vector<double> dhRef(rows * dim, 0.0), dwRef(vocab * dim, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    int64_t label = labels[r] == -100 ? -1 : labels[r] - start;
    for (int64_t v = 0; v < vocab; ++v) {
      double dl = gl[r] * std::exp(logits[r * vocab + v] - lse[r]) +
                  (v == label ? gt[r] : 0.0);
      for (int64_t d = 0; d < dim; ++d) {
        dhRef[r * dim + d] += dl * weight(v, d);
        (transposeW ? dwRef[v * dim + d] : dwRef[d * vocab + v]) +=
            dl * h[r * dim + d];
      }
    }
  }
  double worst = 0;
  for (size_t i = 0; i < dh.size(); ++i)
    worst = std::max(worst, std::abs(dh[i] - dhRef[i]));
  for (size_t i = 0; i < dw.size(); ++i)
    worst = std::max(worst, std::abs(dw[i] - dwRef[i]));
  EXPECT_LT(worst, 1e-4);
}

/// The same on 16-bit h and w (PCC_BF16 or PCC_F16), against torch.autocast's
/// unfused head computed in double: logits rounded to the type, the loss's
/// f32 statistics, dl rounded to the type, dh and dw rounded once.
void checkHalfLinearCrossEntropy(int dtype, int64_t rows, int64_t dim,
                                 int64_t vocab, int64_t start, int64_t total,
                                 bool transposeW) {
  pcc_lce_shape s{rows, dim, vocab, total, -100, transposeW ? 1 : 0, 1, dtype};
  auto narrow = [&](float x) {
    return dtype == PCC_BF16 ? pccrt::floatToBf16(x) : pccrt::floatToHalf(x);
  };
  auto widen = [&](uint16_t x) {
    return static_cast<double>(dtype == PCC_BF16 ? pccrt::bf16ToFloat(x)
                                                 : pccrt::halfToFloat(x));
  };
  auto round = [&](double x) { return widen(narrow(static_cast<float>(x))); };
  std::vector<float> hf = randomVector(rows * dim, 31),
                     wf = randomVector(vocab * dim, 32);
  std::vector<uint16_t> h(hf.size()), w(wf.size());
  for (size_t i = 0; i < hf.size(); ++i)
    h[i] = narrow(hf[i]);
  for (size_t i = 0; i < wf.size(); ++i)
    w[i] = narrow(wf[i]);
  std::mt19937 gen(33);
  std::vector<int64_t> labels(rows);
  for (int64_t r = 0; r < rows; ++r)
    labels[r] = r % 5 == 2 ? -100 : static_cast<int64_t>(gen() % total);
  auto weight = [&](int64_t v, int64_t d) {
    return widen(transposeW ? w[v * dim + d] : w[d * vocab + v]);
  };
  std::vector<double> logits(rows * vocab);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t v = 0; v < vocab; ++v) {
      double x = 0;
      for (int64_t d = 0; d < dim; ++d)
        x += widen(h[r * dim + d]) * weight(v, d);
      logits[r * vocab + v] = round(x);
    }
  std::vector<float> lse(rows), target(rows);
  ASSERT_EQ(pcc_cpu_linear_cross_entropy(&s, start, h.data(), w.data(),
                                         labels.data(), lse.data(),
                                         target.data()),
            0)
      << pcc_cpu_last_error();
  // A logit can round the other way (f32 sums, not double): one unit in
  // the last place of the type at these magnitudes (|logit| < 8).
  double ulp = dtype == PCC_BF16 ? 1.0 / 16 : 1.0 / 128;
  int64_t exact = checkRowStatistics(logits, labels, start, vocab, lse, target,
                                     ulp / 8, ulp);
  // The label's logit is rounded to the type: nearly always the same bits.
  EXPECT_GE(exact, rows * 95 / 100);
  std::vector<float> gl = randomVector(rows, 34), gt = randomVector(rows, 35);
  std::vector<uint16_t> dh(rows * dim), dw(vocab * dim);
  ASSERT_EQ(pcc_cpu_linear_cross_entropy_grad(
                &s, start, h.data(), w.data(), labels.data(), lse.data(),
                gl.data(), gt.data(), dh.data(), dw.data()),
            0)
      << pcc_cpu_last_error();
  std::vector<double> dhRef(rows * dim, 0.0), dwRef(vocab * dim, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    int64_t label = labels[r] == -100 ? -1 : labels[r] - start;
    for (int64_t v = 0; v < vocab; ++v) {
      double dl = round(gl[r] * std::exp(logits[r * vocab + v] - lse[r]) +
                        (v == label ? gt[r] : 0.0));
      for (int64_t d = 0; d < dim; ++d) {
        dhRef[r * dim + d] += dl * weight(v, d);
        (transposeW ? dwRef[v * dim + d] : dwRef[d * vocab + v]) +=
            dl * widen(h[r * dim + d]);
      }
    }
  }
  // Each result within two units in the last place of the type (the
  // rounding of dl and of the result) of its size, plus the sums' spread.
  double rel = dtype == PCC_BF16 ? 1.0 / 128 : 1.0 / 1024;
  auto check = [&](const std::vector<uint16_t> &got,
                   const std::vector<double> &ref, const char *name) {
    double scale = 0;
    for (double x : ref)
      scale = std::max(scale, std::abs(x));
    int bad = 0;
    for (size_t i = 0; i < got.size() && bad < 5; ++i)
      if (std::abs(widen(got[i]) - ref[i]) >
          2 * rel * std::abs(ref[i]) + rel / 4 * scale) {
        ADD_FAILURE() << name << "[" << i << "] = " << widen(got[i])
                      << ", expected " << ref[i];
        ++bad;
      }
  };
  check(dh, dhRef, "dh");
  check(dw, dwRef, "dw");
}

} // namespace

TEST(CpuKernels, LinearCrossEntropy_Bf16) {
  SCOPED_TRACE("[V, D] weight, 2 x 3 blocks");
  checkHalfLinearCrossEntropy(PCC_BF16, 600, 24, 4500, 0, 4500, true);
  SCOPED_TRACE("[D, V] weight, the second rank's block");
  checkHalfLinearCrossEntropy(PCC_BF16, 70, 16, 2100, 2100, 4200, false);
}

TEST(CpuKernels, LinearCrossEntropy_F16) {
  checkHalfLinearCrossEntropy(PCC_F16, 130, 16, 2500, 0, 2500, true);
  checkHalfLinearCrossEntropy(PCC_F16, 70, 16, 2100, 0, 2100, false);
}

TEST(CpuKernels, LinearCrossEntropy) {
  SCOPED_TRACE("[V, D] weight, i64 labels, 2 x 3 blocks");
  checkLinearCrossEntropy<int64_t>(600, 24, 4500, 0, 4500, true);
  SCOPED_TRACE("[D, V] weight, i32 labels, the second rank's block");
  checkLinearCrossEntropy<int32_t>(70, 16, 2100, 2100, 4200, false);
}

TEST(CpuKernels, LinearCrossEntropy_BadLabel) {
  pcc_lce_shape s{3, 4, 10, 20, -100, 1, 1, 0};
  pcc_lce_shape f64 = s;
  f64.dtype = PCC_F64;
  float none = 0;
  EXPECT_NE(pcc_cpu_linear_cross_entropy(&f64, 0, &none, &none, nullptr, &none,
                                         &none),
            0);
  EXPECT_NE(std::string(pcc_cpu_last_error()).find("f32, bf16 or fp16"),
            std::string::npos)
      << pcc_cpu_last_error();
  std::vector<float> h(12, 0.5f), w(40, 0.25f), lse(3), target(3);
  std::vector<int64_t> labels{1, 20, -100};
  EXPECT_NE(pcc_cpu_linear_cross_entropy(&s, 10, h.data(), w.data(),
                                         labels.data(), lse.data(),
                                         target.data()),
            0);
  EXPECT_NE(std::string(pcc_cpu_last_error()).find("outside [0, 20)"),
            std::string::npos)
      << pcc_cpu_last_error();
}

TEST(CpuKernels, LinearCrossEntropy_SameBitsWhateverTheRows) {
  // Data parallelism and micro-batches split the rows: each keeps its bits.
  pcc_lce_shape whole{900, 32, 3000, 3000, -100, 1, 1, 0};
  pcc_lce_shape half = whole;
  half.rows = 450;
  std::vector<float> h = randomVector(900 * 32, 21),
                     w = randomVector(3000 * 32, 22);
  std::vector<int64_t> labels(900);
  for (int64_t r = 0; r < 900; ++r)
    labels[r] = (r * 37) % 3000;
  std::vector<float> lse(900), target(900), lseHalf(450), targetHalf(450);
  ASSERT_EQ(pcc_cpu_linear_cross_entropy(&whole, 0, h.data(), w.data(),
                                         labels.data(), lse.data(),
                                         target.data()),
            0);
  ASSERT_EQ(pcc_cpu_linear_cross_entropy(&half, 0, h.data() + 450 * 32,
                                         w.data(), labels.data() + 450,
                                         lseHalf.data(), targetHalf.data()),
            0);
  EXPECT_EQ(0, std::memcmp(lse.data() + 450, lseHalf.data(), 450 * 4));
  EXPECT_EQ(0, std::memcmp(target.data() + 450, targetHalf.data(), 450 * 4));
}
