//===- GradCheckElementwiseTest.cpp - VJP rules of elementwise ops ---------===//
//
// Finite-difference checks (GradCheck.h) of the elementwise, softmax and
// normalisation rules.
//
//===----------------------------------------------------------------------===//

#include "GradCheck.h"

#include "pcc/Dialect/Pcc/IR/PccDialect.h"
#include "pcc/Dialect/Pcc/IR/PccInterfaces.h"

#include "mlir/Parser/Parser.h"

#include <gtest/gtest.h>

using namespace mlir;
using namespace mlir::pcc;
using namespace pcc_gradcheck;

namespace {

//===----------------------------------------------------------------------===//
// Elementwise unary
//===----------------------------------------------------------------------===//

TEST(GradCheck, Neg) {
  Rng r;
  gradCheck(unaryCase("pcc.neg %x", r.uniform(6, -2, 2)));
}

TEST(GradCheck, Abs) {
  Rng r;
  gradCheck(unaryCase("pcc.abs %x", r.awayFromZero(6, 0.1, 2)));
}

TEST(GradCheck, Sqrt) {
  Rng r;
  gradCheck(unaryCase("pcc.sqrt %x", r.uniform(6, 0.2, 3)));
}

TEST(GradCheck, Reciprocal) {
  Rng r;
  gradCheck(unaryCase("pcc.reciprocal %x", r.awayFromZero(6, 0.3, 2)));
}

TEST(GradCheck, Exp) {
  Rng r;
  gradCheck(unaryCase("pcc.exp %x", r.uniform(6, -2, 2)));
}

TEST(GradCheck, Log) {
  Rng r;
  gradCheck(unaryCase("pcc.log %x", r.uniform(6, 0.2, 3)));
}

TEST(GradCheck, Erf) {
  Rng r;
  gradCheck(unaryCase("pcc.erf %x", r.uniform(6, -2, 2)));
}

TEST(GradCheck, Tanh) {
  Rng r;
  gradCheck(unaryCase("pcc.tanh %x", r.uniform(6, -2, 2)));
}

TEST(GradCheck, Sigmoid) {
  Rng r;
  gradCheck(unaryCase("pcc.sigmoid %x", r.uniform(6, -3, 3)));
}

TEST(GradCheck, Relu) {
  Rng r;
  gradCheck(unaryCase("pcc.relu %x", r.awayFromZero(6, 0.1, 2)));
}

TEST(GradCheck, Sin) {
  Rng r;
  gradCheck(unaryCase("pcc.sin %x", r.uniform(6, -3, 3)));
}

TEST(GradCheck, Cos) {
  Rng r;
  gradCheck(unaryCase("pcc.cos %x", r.uniform(6, -3, 3)));
}

TEST(GradCheck, Gelu_Erf) {
  Rng r;
  gradCheck(unaryCase("pcc.gelu %x", r.uniform(6, -3, 3)));
}

TEST(GradCheck, Gelu_Tanh) {
  Rng r;
  gradCheck(unaryCase("pcc.gelu %x {tanh_approximation}", r.uniform(6, -3, 3)));
}

TEST(GradCheck, LeakyRelu) {
  Rng r;
  gradCheck(unaryCase("pcc.leaky_relu %x alpha = 1.000000e-02",
                      r.awayFromZero(6, 0.1, 2)));
}

TEST(GradCheck, Clamp) {
  Rng r;
  // Both sides of both bounds, none within 0.05 of one.
  GradCase c;
  c.ir = unary("pcc.clamp %x min = -1.000000e+00 max = 1.500000e+00",
               "tensor<3x4xf64>");
  c.args = {r.avoiding(12, -3, 3, {-1.0, 1.5}, 0.05)};
  gradCheck(c);
}

// The conventions at the kinks (PyTorch's): abs has slope 0 at 0, relu 0,
// leaky_relu alpha (x > 0 is tested strictly), clamp 1 at its bounds.
TEST(GradCheck, Kinks_AbsReluLeakyReluAtZero) {
  GradCase c;
  c.args = {{0, 1, -1, 0, 2, -2}};
  c.gy = {{1, 2, 3, 4, 5, 6}};
  c.ir = unary("pcc.abs %x");
  expectGradients(c, {{0, 2, -3, 0, 5, -6}});
  c.ir = unary("pcc.relu %x");
  expectGradients(c, {{0, 2, 0, 0, 5, 0}});
  c.ir = unary("pcc.leaky_relu %x alpha = 5.000000e-01");
  expectGradients(c, {{0.5, 2, 1.5, 2, 5, 3}});
}

TEST(GradCheck, Kinks_ClampPassesAtBounds) {
  GradCase c;
  c.ir = unary("pcc.clamp %x min = -1.000000e+00 max = 1.500000e+00");
  c.args = {{-1, 1.5, -1.5, 2, 0, 1}};
  c.gy = {{1, 2, 3, 4, 5, 6}};
  expectGradients(c, {{1, 2, 0, 0, 5, 6}});
}

//===----------------------------------------------------------------------===//
// Elementwise binary
//===----------------------------------------------------------------------===//

TEST(GradCheck, Add) {
  Rng r;
  gradCheck(binaryCase("pcc.add %a, %b", r.uniform(6, -2, 2),
                       r.uniform(6, -2, 2)));
}

TEST(GradCheck, Sub) {
  Rng r;
  gradCheck(binaryCase("pcc.sub %a, %b", r.uniform(6, -2, 2),
                       r.uniform(6, -2, 2)));
}

TEST(GradCheck, Mul) {
  Rng r;
  gradCheck(binaryCase("pcc.mul %a, %b", r.uniform(6, -2, 2),
                       r.uniform(6, -2, 2)));
}

TEST(GradCheck, Mul_OnlyRhsNeeded) {
  Rng r;
  GradCase c = binaryCase("pcc.mul %a, %b", r.uniform(6, -2, 2),
                          r.uniform(6, -2, 2));
  c.needed = {false, true};
  gradCheck(c);
}

TEST(GradCheck, Div) {
  Rng r;
  gradCheck(binaryCase("pcc.div %a, %b", r.uniform(6, -2, 2),
                       r.awayFromZero(6, 0.5, 2)));
}

TEST(GradCheck, Pow) {
  Rng r;
  gradCheck(binaryCase("pcc.pow %a, %b", r.uniform(6, 0.3, 2.5),
                       r.uniform(6, -2, 2)));
}

TEST(GradCheck, Pow_ZeroExponent) {
  // d/dx x^0 = 0 (also what the rule's mask gives); d/de = log x.
  Rng r;
  gradCheck(binaryCase("pcc.pow %a, %b", r.uniform(6, 0.3, 2.5),
                       {0, 2, 0, -1, 0.5, 0}));
}

TEST(GradCheck, Pow_NegativeBaseIntegerExponent) {
  // Only the base: x^e with x < 0 is not differentiable in e.
  Rng r;
  GradCase c = binaryCase("pcc.pow %a, %b", r.awayFromZero(6, 0.5, 2),
                          {2, 3, -1, 1, -2, 4});
  c.needed = {true, false};
  gradCheck(c);
}

TEST(GradCheck, Max) {
  Rng r;
  std::vector<double> v = r.distinct(12, -2, 2);
  gradCheck(binaryCase("pcc.max %a, %b", {v.begin(), v.begin() + 6},
                       {v.begin() + 6, v.end()}));
}

TEST(GradCheck, Min) {
  Rng r;
  std::vector<double> v = r.distinct(12, -2, 2);
  gradCheck(binaryCase("pcc.min %a, %b", {v.begin(), v.begin() + 6},
                       {v.begin() + 6, v.end()}));
}

// Ties split the gradient in halves; finite differences cannot see this.
TEST(GradCheck, Max_TieSplitsHalf) {
  GradCase c;
  c.ir = binary("pcc.max %a, %b");
  c.args = {{1, 2, 3, 4, 5, 6}, {1, 0, 3, 5, 5, 7}};
  c.gy = {{2, 4, 6, 8, 10, 12}};
  expectGradients(c, {{1, 4, 3, 0, 5, 0}, {1, 0, 3, 8, 5, 12}});
}

TEST(GradCheck, Min_TieSplitsHalf) {
  GradCase c;
  c.ir = binary("pcc.min %a, %b");
  c.args = {{1, 2, 3, 4, 5, 6}, {1, 0, 3, 5, 5, 7}};
  c.gy = {{2, 4, 6, 8, 10, 12}};
  expectGradients(c, {{1, 0, 3, 8, 5, 12}, {1, 4, 3, 0, 5, 0}});
}

/// Dividends x = y (k + f), f in [0.1, 0.9]: away from the jumps of mod.
std::vector<double> awayFromMultiples(Rng &r, const std::vector<double> &y) {
  std::vector<double> x;
  for (double d : y)
    x.push_back(d * (std::floor(r.uniform(-3, 3)) + r.uniform(0.1, 0.9)));
  return x;
}

TEST(GradCheck, Mod) {
  // Only the dividend: the rule refuses the divisor (below).
  Rng r;
  std::vector<double> y = r.awayFromZero(6, 0.7, 2);
  GradCase c = binaryCase("pcc.mod %a, %b", awayFromMultiples(r, y), y);
  c.needed = {true, false};
  gradCheck(c);
}

TEST(GradCheck, Mod_Fmod) {
  Rng r;
  std::vector<double> y = r.awayFromZero(6, 0.7, 2);
  GradCase c = binaryCase("pcc.mod %a, %b {fmod}", awayFromMultiples(r, y), y);
  c.needed = {true, false};
  gradCheck(c);
}

TEST(GradCheck, Mod_DivisorRefused) {
  GradCase c;
  c.ir = binary("pcc.mod %a, %b");
  c.needed = {true, true};
  expectRefused(c, "has no gradient for its divisor");
}

TEST(GradCheck, Select) {
  Rng r;
  GradCase c;
  c.ir = R"mlir(
    func.func @f(%c: tensor<2x3xi1>, %a: tensor<2x3xf64>, %b: tensor<2x3xf64>) -> tensor<2x3xf64> {
      %y = pcc.select %c, %a, %b : tensor<2x3xi1>, tensor<2x3xf64>
      return %y : tensor<2x3xf64>
    }
  )mlir";
  c.args = {{1, 0, 1, 1, 0, 0}, r.uniform(6, -2, 2), r.uniform(6, -2, 2)};
  gradCheck(c);
}

// The interpreter computes every type in double, so a cast between float
// types is the identity there and f64 tolerances apply.
TEST(GradCheck, Cast_F64ToF32) {
  Rng r;
  GradCase c;
  c.ir = R"mlir(
    func.func @f(%x: tensor<2x3xf64>) -> tensor<2x3xf32> {
      %y = pcc.cast %x : tensor<2x3xf64> -> tensor<2x3xf32>
      return %y : tensor<2x3xf32>
    }
  )mlir";
  c.args = {r.uniform(6, -2, 2)};
  gradCheck(c);
}

TEST(GradCheck, Cast_F32ToF64) {
  Rng r;
  GradCase c;
  c.ir = R"mlir(
    func.func @f(%x: tensor<2x3xf32>) -> tensor<2x3xf64> {
      %y = pcc.cast %x : tensor<2x3xf32> -> tensor<2x3xf64>
      return %y : tensor<2x3xf64>
    }
  )mlir";
  c.args = {r.uniform(6, -2, 2)};
  gradCheck(c);
}

//===----------------------------------------------------------------------===//
// Softmax and normalisation
//===----------------------------------------------------------------------===//

GradCase softmaxCase(const std::string &op, int64_t axis, Rng &r) {
  GradCase c;
  c.ir = unary(op + " %x axis = " + std::to_string(axis), "tensor<2x3x4xf64>");
  c.args = {r.uniform(24, -2, 2)};
  return c;
}

TEST(GradCheck, Softmax_LastAxis) {
  Rng r;
  gradCheck(softmaxCase("pcc.softmax", 2, r));
}

TEST(GradCheck, Softmax_MiddleAxis) {
  Rng r;
  gradCheck(softmaxCase("pcc.softmax", 1, r));
}

TEST(GradCheck, Softmax_NanToZeroMaskedRows) {
  // Row 1 is fully masked (softmax 0 with nan_to_zero: zero gradient), row
  // 2 partly; -inf entries are not perturbed, their gradient must be 0.
  Rng r;
  double inf = std::numeric_limits<double>::infinity();
  std::vector<double> x = r.uniform(12, -2, 2);
  for (int j = 4; j < 8; ++j)
    x[j] = -inf;
  x[9] = x[11] = -inf;
  GradCase c;
  c.ir = unary("pcc.softmax %x axis = 1 {nan_to_zero}", "tensor<3x4xf64>");
  c.args = {x};
  gradCheck(c);
  // And directly: the masked row's gradient is exactly 0, not NaN.
  c.gy = {std::vector<double>(12, 1.0)};
  BuiltVjp built;
  buildAndRunVjp(c, r, built);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  ASSERT_TRUE(built.grads[0]);
  for (int j = 4; j < 8; ++j)
    EXPECT_EQ(built.grads[0]->data[j], 0.0) << "element " << j;
}

TEST(GradCheck, LogSoftmax_LastAxis) {
  Rng r;
  gradCheck(softmaxCase("pcc.log_softmax", 2, r));
}

TEST(GradCheck, LogSoftmax_FirstAxis) {
  Rng r;
  gradCheck(softmaxCase("pcc.log_softmax", 0, r));
}

TEST(GradCheck, LogSoftmax_NanToZeroRefused) {
  GradCase c;
  c.ir = unary("pcc.log_softmax %x axis = 1 {nan_to_zero}");
  c.needed = {true};
  expectRefused(c, "with nan_to_zero has no gradient rule");
}

TEST(GradCheck, LayerNorm_WithBias) {
  Rng r;
  GradCase c;
  c.ir = R"mlir(
    func.func @f(%x: tensor<2x3x4xf64>, %g: tensor<4xf64>, %b: tensor<4xf64>) -> tensor<2x3x4xf64> {
      %y = pcc.layer_norm %x, %g, %b axis = 2 epsilon = 9.99999974E-6 : tensor<2x3x4xf64>, tensor<4xf64>, tensor<4xf64>
      return %y : tensor<2x3x4xf64>
    }
  )mlir";
  c.args = {r.uniform(24, -2, 2), r.uniform(4, 0.5, 1.5), r.uniform(4, -1, 1)};
  gradCheck(c);
}

TEST(GradCheck, LayerNorm_NoBias) {
  Rng r;
  GradCase c;
  c.ir = R"mlir(
    func.func @f(%x: tensor<2x3x4xf64>, %g: tensor<4xf64>) -> tensor<2x3x4xf64> {
      %y = pcc.layer_norm %x, %g axis = 2 epsilon = 9.99999974E-6 : tensor<2x3x4xf64>, tensor<4xf64>
      return %y : tensor<2x3x4xf64>
    }
  )mlir";
  c.args = {r.uniform(24, -2, 2), r.uniform(4, 0.5, 1.5)};
  gradCheck(c);
}

TEST(GradCheck, LayerNorm_AxisNotLast) {
  // Normalises over [1, 3): scale and bias are 3x4.
  Rng r;
  GradCase c;
  c.ir = R"mlir(
    func.func @f(%x: tensor<2x3x4xf64>, %g: tensor<3x4xf64>, %b: tensor<3x4xf64>) -> tensor<2x3x4xf64> {
      %y = pcc.layer_norm %x, %g, %b axis = 1 epsilon = 1.000000e-03 : tensor<2x3x4xf64>, tensor<3x4xf64>, tensor<3x4xf64>
      return %y : tensor<2x3x4xf64>
    }
  )mlir";
  c.args = {r.uniform(24, -2, 2), r.uniform(12, 0.5, 1.5),
            r.uniform(12, -1, 1)};
  gradCheck(c);
}

TEST(GradCheck, LayerNorm_AxisZero) {
  // Normalises the whole tensor: no leading dimension to sum over.
  Rng r;
  GradCase c;
  c.ir = R"mlir(
    func.func @f(%x: tensor<2x3xf64>, %g: tensor<2x3xf64>, %b: tensor<2x3xf64>) -> tensor<2x3xf64> {
      %y = pcc.layer_norm %x, %g, %b axis = 0 epsilon = 9.99999974E-6 : tensor<2x3xf64>, tensor<2x3xf64>, tensor<2x3xf64>
      return %y : tensor<2x3xf64>
    }
  )mlir";
  c.args = {r.uniform(6, -2, 2), r.uniform(6, 0.5, 1.5), r.uniform(6, -1, 1)};
  gradCheck(c);
}

GradCase batchNormCase(Rng &r, const std::string &xType, int64_t n) {
  GradCase c;
  c.ir = "func.func @f(%x: " + xType +
         ", %s: tensor<3xf64>, %b: tensor<3xf64>, %m: tensor<3xf64>, %v: "
         "tensor<3xf64>) -> " +
         xType +
         " {\n  %y = pcc.batch_norm %x, %s, %b, %m, %v epsilon = "
         "9.99999974E-6 : " +
         xType + ", tensor<3xf64>\n  return %y : " + xType + "\n}\n";
  c.args = {r.uniform(n, -2, 2), r.uniform(3, 0.5, 1.5), r.uniform(3, -1, 1),
            r.uniform(3, -0.5, 0.5), r.uniform(3, 0.5, 2)};
  // Inference mode: the running statistics get no gradient.
  c.needed = {true, true, true, false, false};
  return c;
}

TEST(GradCheck, BatchNorm) {
  Rng r;
  gradCheck(batchNormCase(r, "tensor<2x3x2x2xf64>", 24));
}

TEST(GradCheck, BatchNorm_Rank2) {
  Rng r;
  gradCheck(batchNormCase(r, "tensor<4x3xf64>", 12));
}

TEST(GradCheck, BatchNorm_StatisticsRefused) {
  Rng r;
  GradCase c = batchNormCase(r, "tensor<4x3xf64>", 12);
  c.needed = {true, true, true, true, false};
  expectRefused(c, "has no gradient for its running statistics");
}

//===----------------------------------------------------------------------===//

} // namespace
