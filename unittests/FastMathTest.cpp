//===- FastMathTest.cpp - error bounds of pccrt::fastExp/Tanh/Erf ---------===//

#include "pcc/runtime/FastMath.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace {

/// Every float in [lo, hi] at `steps` evenly spaced points.
template <typename F> void sweep(float lo, float hi, int steps, F check) {
  for (int i = 0; i <= steps; ++i)
    check(lo + (hi - lo) * static_cast<float>(i) / static_cast<float>(steps));
}

TEST(FastMath, ExpRelativeError) {
  double worst = 0;
  sweep(-87.0f, 88.0f, 2000000, [&](float x) {
    double ref = std::exp(static_cast<double>(x));
    worst = std::max(worst, std::fabs(pccrt::fastExp(x) - ref) / ref);
  });
  EXPECT_LT(worst, 3e-7);
}

TEST(FastMath, ExpLimits) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(std::isnan(pccrt::fastExp(std::nanf(""))));
  EXPECT_EQ(pccrt::fastExp(inf), inf);
  EXPECT_EQ(pccrt::fastExp(100.0f), inf);
  EXPECT_EQ(pccrt::fastExp(-inf), 0.0f);
  EXPECT_EQ(pccrt::fastExp(-100.0f), 0.0f);
  EXPECT_EQ(pccrt::fastExp(0.0f), 1.0f);
}

TEST(FastMath, TanhAbsoluteError) {
  double worst = 0, worstSmallRel = 0;
  sweep(-12.0f, 12.0f, 2000000, [&](float x) {
    double ref = std::tanh(static_cast<double>(x));
    double err = std::fabs(pccrt::fastTanh(x) - ref);
    worst = std::max(worst, err);
    if (std::fabs(x) < 0.625f && x != 0)
      worstSmallRel = std::max(worstSmallRel, err / std::fabs(ref));
  });
  EXPECT_LT(worst, 3e-7);
  EXPECT_LT(worstSmallRel, 3e-7);
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(pccrt::fastTanh(inf), 1.0f);
  EXPECT_EQ(pccrt::fastTanh(-inf), -1.0f);
  EXPECT_TRUE(std::isnan(pccrt::fastTanh(std::nanf(""))));
  EXPECT_EQ(pccrt::fastTanh(0.0f), 0.0f);
}

TEST(FastMath, ErfAbsoluteError) {
  double worst = 0;
  sweep(-8.0f, 8.0f, 2000000, [&](float x) {
    worst = std::max(
        worst, std::fabs(pccrt::fastErf(x) - std::erf(static_cast<double>(x))));
  });
  EXPECT_LT(worst, 1e-6); // 1.5e-7 in exact arithmetic, ~6e-7 in float
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(pccrt::fastErf(inf), 1.0f);
  EXPECT_EQ(pccrt::fastErf(-inf), -1.0f);
  EXPECT_TRUE(std::isnan(pccrt::fastErf(std::nanf(""))));
}

} // namespace
