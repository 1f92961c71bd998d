//===- RowKernels.h - vectorised row loops of the CPU kernels ---*- C++ -*-===//
//
// Row helpers shared by the normalising kernels (CpuKernels.cpp) and fused
// attention (Attention.cpp). Each gets AVX-512 and AVX2+FMA clones beside
// the baseline one, picked when the runtime loads (the runtime is built for
// x86-64's baseline, as the generated kernels' clones are); the OpenMP
// loops call them per row. Their reductions run in interleaved lanes:
// GCC keeps a floating-point reduction's order, so a single accumulator
// would keep the loop from vectorising at all.
//
//===----------------------------------------------------------------------===//

#ifndef PCC_RUNTIME_LIB_ROWKERNELS_H
#define PCC_RUNTIME_LIB_ROWKERNELS_H

#include "pcc/runtime/CpuClones.h"
#include "pcc/runtime/FastMath.h"

#include <algorithm>
#include <cstdint>
#include <limits>

#if !defined(__clang__)
#define PCC_ROW_KERNEL PCC_CPU_CLONES
#else
#define PCC_ROW_KERNEL
#endif

namespace {

/// Sums n floats in double, in sixteen interleaved partial sums so that the
/// loop vectorises and keeps four vectors of adds in flight (one double
/// accumulator is a chain of dependent adds, four cycles each; one vector of
/// four is still bound by that latency, at a quarter of the memory rate);
/// the order is fixed, so the result is deterministic.
constexpr int kSumLanes = 16;

double combineLanes(const double *acc) {
  // A fixed pairwise tree over the lanes.
  double level[kSumLanes];
  for (int j = 0; j < kSumLanes; ++j)
    level[j] = acc[j];
  for (int width = kSumLanes / 2; width >= 1; width /= 2)
    for (int j = 0; j < width; ++j)
      level[j] = level[2 * j] + level[2 * j + 1];
  return level[0];
}

PCC_ROW_KERNEL double sumDouble(const float *x, int64_t n) {
  double acc[kSumLanes] = {};
  int64_t c = 0;
  for (; c + kSumLanes <= n; c += kSumLanes)
    for (int j = 0; j < kSumLanes; ++j)
      acc[j] += static_cast<double>(x[c + j]);
  for (; c < n; ++c)
    acc[c % kSumLanes] += static_cast<double>(x[c]);
  return combineLanes(acc);
}

/// The largest element of a row, in eight interleaved lanes so that the
/// loop vectorises. (A NaN in the row makes the exponentials NaN anyway.)
PCC_ROW_KERNEL float rowMax(const float *row, int64_t n) {
  float lanes[8];
  for (float &l : lanes)
    l = -std::numeric_limits<float>::infinity();
  int64_t c = 0;
  for (; c + 8 <= n; c += 8)
    for (int j = 0; j < 8; ++j)
      lanes[j] = lanes[j] > row[c + j] ? lanes[j] : row[c + j];
  float maxValue = -std::numeric_limits<float>::infinity();
  for (float l : lanes)
    maxValue = std::max(maxValue, l);
  for (; c < n; ++c)
    maxValue = std::max(maxValue, row[c]);
  return maxValue;
}

/// Writes exp(x - max) of one row to `e` and returns their sum, in double.
PCC_ROW_KERNEL double rowExp(const float *row, float maxValue, float *e,
                             int64_t n) {
  for (int64_t c = 0; c < n; ++c)
    e[c] = pccrt::fastExp(row[c] - maxValue);
  return sumDouble(e, n);
}

/// y[c] *= scale over a row.
PCC_ROW_KERNEL void rowScale(float *y, float scale, int64_t n) {
  for (int64_t c = 0; c < n; ++c)
    y[c] *= scale;
}

} // namespace

#endif // PCC_RUNTIME_LIB_ROWKERNELS_H
