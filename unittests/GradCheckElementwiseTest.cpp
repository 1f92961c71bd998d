//===- GradCheckElementwiseTest.cpp - VJP rules of elementwise ops
//---------===//
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

/// A unary op.
struct UnaryCase {
  const char *name;
  const char *op;
  Sample x;
};

const UnaryCase kUnaryCases[] = {
    {"Neg", "pcc.neg %x", {Sample::Uniform, -2, 2}},
    {"Abs", "pcc.abs %x", {Sample::AwayFromZero, 0.1, 2}},
    {"Sqrt", "pcc.sqrt %x", {Sample::Uniform, 0.2, 3}},
    {"Reciprocal", "pcc.reciprocal %x", {Sample::AwayFromZero, 0.3, 2}},
    {"Exp", "pcc.exp %x", {Sample::Uniform, -2, 2}},
    {"Log", "pcc.log %x", {Sample::Uniform, 0.2, 3}},
    {"Erf", "pcc.erf %x", {Sample::Uniform, -2, 2}},
    {"Tanh", "pcc.tanh %x", {Sample::Uniform, -2, 2}},
    {"Sigmoid", "pcc.sigmoid %x", {Sample::Uniform, -3, 3}},
    {"Relu", "pcc.relu %x", {Sample::AwayFromZero, 0.1, 2}},
    {"Sin", "pcc.sin %x", {Sample::Uniform, -3, 3}},
    {"Cos", "pcc.cos %x", {Sample::Uniform, -3, 3}},
    {"Gelu_Erf", "pcc.gelu %x", {Sample::Uniform, -3, 3}},
    {"Gelu_Tanh", "pcc.gelu %x {tanh_approximation}", {Sample::Uniform, -3, 3}},
    {"LeakyRelu",
     "pcc.leaky_relu %x alpha = 1.000000e-02",
     {Sample::AwayFromZero, 0.1, 2}},
};

class GradCheckUnary : public ::testing::TestWithParam<UnaryCase> {};

TEST_P(GradCheckUnary, MatchesFiniteDifferences) {
  Rng r;
  gradCheck(unaryCase(GetParam().op, GetParam().x.draw(r, 6)));
}

INSTANTIATE_TEST_SUITE_P(GradCheck, GradCheckUnary,
                         ::testing::ValuesIn(kUnaryCases), CaseName());

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

/// A binary op.
struct BinaryCase {
  const char *name;
  const char *op;
  Sample a, b;
};

const BinaryCase kBinaryCases[] = {
    {"Add",
     "pcc.add %a, %b",
     {Sample::Uniform, -2, 2},
     {Sample::Uniform, -2, 2}},
    {"Sub",
     "pcc.sub %a, %b",
     {Sample::Uniform, -2, 2},
     {Sample::Uniform, -2, 2}},
    {"Mul",
     "pcc.mul %a, %b",
     {Sample::Uniform, -2, 2},
     {Sample::Uniform, -2, 2}},
    {"Div",
     "pcc.div %a, %b",
     {Sample::Uniform, -2, 2},
     {Sample::AwayFromZero, 0.5, 2}},
    {"Pow",
     "pcc.pow %a, %b",
     {Sample::Uniform, 0.3, 2.5},
     {Sample::Uniform, -2, 2}},
};

class GradCheckBinary : public ::testing::TestWithParam<BinaryCase> {};

TEST_P(GradCheckBinary, MatchesFiniteDifferences) {
  Rng r;
  const BinaryCase &c = GetParam();
  std::vector<double> a = c.a.draw(r, 6);
  gradCheck(binaryCase(c.op, a, c.b.draw(r, 6)));
}

INSTANTIATE_TEST_SUITE_P(GradCheck, GradCheckBinary,
                         ::testing::ValuesIn(kBinaryCases), CaseName());

TEST(GradCheck, Mul_OnlyRhsNeeded) {
  Rng r;
  GradCase c =
      binaryCase("pcc.mul %a, %b", r.uniform(6, -2, 2), r.uniform(6, -2, 2));
  c.needed = {false, true};
  gradCheck(c);
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

TEST(GradCheck, MaxMin) {
  for (const char *op : {"pcc.max %a, %b", "pcc.min %a, %b"}) {
    SCOPED_TRACE(op);
    Rng r;
    std::vector<double> v = r.distinct(12, -2, 2);
    gradCheck(
        binaryCase(op, {v.begin(), v.begin() + 6}, {v.begin() + 6, v.end()}));
  }
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
  for (const char *op : {"pcc.mod %a, %b", "pcc.mod %a, %b {fmod}"}) {
    SCOPED_TRACE(op);
    Rng r;
    std::vector<double> y = r.awayFromZero(6, 0.7, 2);
    GradCase c = binaryCase(op, awayFromMultiples(r, y), y);
    c.needed = {true, false};
    gradCheck(c);
  }
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
TEST(GradCheck, Cast) {
  for (auto [from, to] : {std::pair("f64", "f32"), std::pair("f32", "f64")}) {
    SCOPED_TRACE(std::string(from) + " to " + to);
    Rng r;
    GradCase c;
    std::string in = std::string("tensor<2x3x") + from + ">",
                out = std::string("tensor<2x3x") + to + ">";
    c.ir = "func.func @f(%x: " + in + ") -> " + out +
           " {\n  %y = pcc.cast %x : " + in + " -> " + out +
           "\n  return %y : " + out + "\n}\n";
    c.args = {r.uniform(6, -2, 2)};
    gradCheck(c);
  }
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

TEST(GradCheck, Softmax) {
  for (auto [op, axis] :
       {std::pair("pcc.softmax", 2), std::pair("pcc.softmax", 1),
        std::pair("pcc.log_softmax", 2), std::pair("pcc.log_softmax", 0)}) {
    SCOPED_TRACE(std::string(op) + " axis " + std::to_string(axis));
    Rng r;
    gradCheck(softmaxCase(op, axis, r));
  }
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
