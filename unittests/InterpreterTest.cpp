//===- InterpreterTest.cpp - the float64 reference interpreter ------------===//
//
// Checks the interpreter against hand-computed values on small f64 programs.
//
//===----------------------------------------------------------------------===//

#include "Interpreter.h"

#include "pcc/Dialect/Pcc/IR/PccDialect.h"
#include "pcc/runtime/CpuKernels.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

using namespace mlir;
using ::pcc::testing::evaluateOp;
using ::pcc::testing::interpret;
using ::pcc::testing::Tensor;

namespace {

MLIRContext &context() { return ::pcc::testing::testContext(); }

Tensor noParam(StringRef) { return {}; }

/// Parses `source` (one function) and interprets it on `args`; an empty
/// vector, with a test failure, when either step fails.
std::vector<Tensor>
run(StringRef source, std::vector<Tensor> args,
    llvm::function_ref<Tensor(StringRef)> params = noParam) {
  OwningOpRef<ModuleOp> module =
      parseSourceString<ModuleOp>(source, &context());
  if (!module) {
    ADD_FAILURE() << "the test program does not parse";
    return {};
  }
  auto func = *module->getOps<func::FuncOp>().begin();
  std::string error;
  auto results = interpret(func, args, params, &error);
  if (failed(results)) {
    ADD_FAILURE() << "interpret failed: " << error;
    return {};
  }
  return *results;
}

/// Expects `t` to be `shape` with `values` (to 1e-12, relative for large).
void expectTensor(const Tensor &t, std::vector<int64_t> shape,
                  std::vector<double> values, double tolerance = 1e-12) {
  EXPECT_EQ(t.shape, shape);
  ASSERT_EQ(t.data.size(), values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    if (std::isnan(values[i])) {
      EXPECT_TRUE(std::isnan(t.data[i])) << "element " << i;
      continue;
    }
    EXPECT_NEAR(t.data[i], values[i],
                tolerance * std::max(1.0, std::fabs(values[i])))
        << "element " << i;
  }
}

TEST(Interpreter, MatmulTransposes) {
  // A^T B^T with A = [[1,2],[3,4],[5,6]] and B = [[1,0,1],[0,1,1]].
  auto r = run(R"mlir(
    func.func @f(%a: tensor<3x2xf64>, %b: tensor<2x3xf64>) -> tensor<2x2xf64> {
      %y = pcc.matmul %a, %b {transpose_a, transpose_b} : tensor<3x2xf64>, tensor<2x3xf64> -> tensor<2x2xf64>
      return %y : tensor<2x2xf64>
    }
  )mlir",
               {{{3, 2}, {1, 2, 3, 4, 5, 6}}, {{2, 3}, {1, 0, 1, 0, 1, 1}}});
  ASSERT_EQ(r.size(), 1u);
  expectTensor(r[0], {2, 2}, {6, 8, 8, 10});
}

TEST(Interpreter, MatmulBatched) {
  // A shared right operand, then one with lhs's batch dimensions.
  auto r = run(R"mlir(
    func.func @f(%a: tensor<2x1x2xf64>, %w: tensor<2x2xf64>, %b: tensor<2x2x1xf64>)
        -> (tensor<2x1x2xf64>, tensor<2x1x1xf64>) {
      %y = pcc.matmul %a, %w : tensor<2x1x2xf64>, tensor<2x2xf64> -> tensor<2x1x2xf64>
      %z = pcc.matmul %a, %b : tensor<2x1x2xf64>, tensor<2x2x1xf64> -> tensor<2x1x1xf64>
      return %y, %z : tensor<2x1x2xf64>, tensor<2x1x1xf64>
    }
  )mlir",
               {{{}, {1, 2, 3, 4}}, {{}, {1, 1, 0, 1}}, {{}, {1, 1, 2, 0}}});
  ASSERT_EQ(r.size(), 2u);
  expectTensor(r[0], {2, 1, 2}, {1, 3, 3, 7});
  expectTensor(r[1], {2, 1, 1}, {3, 6});
}

TEST(Interpreter, ParamsAndBroadcast) {
  auto r = run(
      R"mlir(
    func.func @f(%c: tensor<2x1xf64>) -> tensor<2x3xf64> {
      %b = pcc.param "bias" : tensor<3xf64>
      %bb = pcc.broadcast %b : tensor<3xf64> -> tensor<2x3xf64>
      %cb = pcc.broadcast %c : tensor<2x1xf64> -> tensor<2x3xf64>
      %y = pcc.add %bb, %cb : tensor<2x3xf64>
      return %y : tensor<2x3xf64>
    }
  )mlir",
      {{{2, 1}, {10, 20}}}, [](StringRef name) -> Tensor {
        EXPECT_EQ(name, "bias");
        return {{3}, {1, 2, 3}};
      });
  ASSERT_EQ(r.size(), 1u);
  expectTensor(r[0], {2, 3}, {11, 12, 13, 21, 22, 23});
}

TEST(Interpreter, Softmax) {
  double l3 = std::log(3.0);
  auto r = run(R"mlir(
    func.func @f(%x: tensor<2x2xf64>) -> (tensor<2x2xf64>, tensor<2x2xf64>, tensor<2x2xf64>) {
      %s = pcc.softmax %x axis = 1 : tensor<2x2xf64>
      %l = pcc.log_softmax %x axis = 1 : tensor<2x2xf64>
      %c = pcc.softmax %x axis = 0 : tensor<2x2xf64>
      return %s, %l, %c : tensor<2x2xf64>, tensor<2x2xf64>, tensor<2x2xf64>
    }
  )mlir",
               {{{2, 2}, {0, l3, 1, 1}}});
  ASSERT_EQ(r.size(), 3u);
  expectTensor(r[0], {2, 2}, {0.25, 0.75, 0.5, 0.5});
  expectTensor(r[1], {2, 2},
               {std::log(0.25), std::log(0.75), std::log(0.5), std::log(0.5)});
  double e = std::exp(1.0);
  expectTensor(r[2], {2, 2},
               {1 / (1 + e), 1 / (1 + std::exp(1 - l3)), e / (1 + e),
                1 - 1 / (1 + std::exp(1 - l3))});
}

TEST(Interpreter, SoftmaxNanToZero) {
  // A fully masked row is NaN, or 0 with nan_to_zero.
  auto r = run(R"mlir(
    func.func @f() -> (tensor<2x2xf64>, tensor<2x2xf64>) {
      %x = pcc.constant dense<[[0xFFF0000000000000, 0xFFF0000000000000], [0.0, 0.0]]> : tensor<2x2xf64>
      %a = pcc.softmax %x axis = 1 : tensor<2x2xf64>
      %b = pcc.softmax %x axis = 1 {nan_to_zero} : tensor<2x2xf64>
      return %a, %b : tensor<2x2xf64>, tensor<2x2xf64>
    }
  )mlir",
               {});
  ASSERT_EQ(r.size(), 2u);
  double nan = std::numeric_limits<double>::quiet_NaN();
  expectTensor(r[0], {2, 2}, {nan, nan, 0.5, 0.5});
  expectTensor(r[1], {2, 2}, {0, 0, 0.5, 0.5});
}

TEST(Interpreter, LayerNorm) {
  // Mean 2.5, variance 1.25; epsilon 0.
  auto r = run(R"mlir(
    func.func @f(%x: tensor<1x4xf64>, %g: tensor<4xf64>, %b: tensor<4xf64>)
        -> (tensor<1x4xf64>, tensor<1x4xf64>) {
      %y = pcc.layer_norm %x, %g, %b axis = 1 epsilon = 0.000000e+00 : tensor<1x4xf64>, tensor<4xf64>, tensor<4xf64>
      %z = pcc.layer_norm %x, %g axis = 1 epsilon = 0.000000e+00 : tensor<1x4xf64>, tensor<4xf64>
      return %y, %z : tensor<1x4xf64>, tensor<1x4xf64>
    }
  )mlir",
               {{{}, {1, 2, 3, 4}}, {{}, {1, 1, 2, 2}}, {{}, {0, 0, 1, 1}}});
  ASSERT_EQ(r.size(), 2u);
  double s = std::sqrt(1.25);
  expectTensor(r[0], {1, 4}, {-1.5 / s, -0.5 / s, 1 / s + 1, 3 / s + 1});
  expectTensor(r[1], {1, 4}, {-1.5 / s, -0.5 / s, 1 / s, 3 / s});
}

TEST(Interpreter, LayerNormEpsilonAndLeadingAxis) {
  // Normalising over both dimensions of a 2x2 with epsilon 0.25 (an exact
  // f32): variance 1.25 + 0.25.
  auto r = run(R"mlir(
    func.func @f(%x: tensor<2x2xf64>, %g: tensor<2x2xf64>) -> tensor<2x2xf64> {
      %y = pcc.layer_norm %x, %g axis = 0 epsilon = 2.500000e-01 : tensor<2x2xf64>, tensor<2x2xf64>
      return %y : tensor<2x2xf64>
    }
  )mlir",
               {{{}, {1, 2, 3, 4}}, {{}, {1, 1, 1, 1}}});
  ASSERT_EQ(r.size(), 1u);
  double s = std::sqrt(1.5);
  expectTensor(r[0], {2, 2}, {-1.5 / s, -0.5 / s, 0.5 / s, 1.5 / s});
}

TEST(Interpreter, BatchNorm) {
  auto r = run(R"mlir(
    func.func @f(%x: tensor<1x2x2xf64>, %s: tensor<2xf64>, %b: tensor<2xf64>,
                 %m: tensor<2xf64>, %v: tensor<2xf64>) -> tensor<1x2x2xf64> {
      %y = pcc.batch_norm %x, %s, %b, %m, %v epsilon = 0.000000e+00 : tensor<1x2x2xf64>, tensor<2xf64>
      return %y : tensor<1x2x2xf64>
    }
  )mlir",
               {{{}, {1, 2, 3, 4}},
                {{}, {2, 1}},
                {{}, {0, 10}},
                {{}, {1, 0}},
                {{}, {4, 1}}});
  ASSERT_EQ(r.size(), 1u);
  // Channel 0: (x - 1) / 2 * 2; channel 1: x + 10.
  expectTensor(r[0], {1, 2, 2}, {0, 1, 13, 14});
}

TEST(Interpreter, SliceTransposeConcatSplit) {
  auto r = run(R"mlir(
    func.func @f(%x: tensor<2x5xf64>) -> (tensor<2x3xf64>, tensor<3x2xf64>, tensor<2x8xf64>, tensor<2x2xf64>, tensor<2x1xf64>) {
      %s = pcc.slice %x starts = [0, 4] limits = [2, -1] steps = [1, -2] : tensor<2x5xf64> -> tensor<2x3xf64>
      %t = pcc.transpose %s [1, 0] : tensor<2x3xf64> -> tensor<3x2xf64>
      %c = pcc.concat %s, %x axis = 1 : tensor<2x3xf64>, tensor<2x5xf64> -> tensor<2x8xf64>
      %p:3 = pcc.split %x axis = 1 sizes = [2, 2, 1] : tensor<2x5xf64> -> tensor<2x2xf64>, tensor<2x2xf64>, tensor<2x1xf64>
      return %s, %t, %c, %p#1, %p#2 : tensor<2x3xf64>, tensor<3x2xf64>, tensor<2x8xf64>, tensor<2x2xf64>, tensor<2x1xf64>
    }
  )mlir",
               {{{2, 5}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}}});
  ASSERT_EQ(r.size(), 5u);
  expectTensor(r[0], {2, 3}, {4, 2, 0, 9, 7, 5});
  expectTensor(r[1], {3, 2}, {4, 9, 2, 7, 0, 5});
  expectTensor(r[2], {2, 8}, {4, 2, 0, 0, 1, 2, 3, 4, 9, 7, 5, 5, 6, 7, 8, 9});
  expectTensor(r[3], {2, 2}, {2, 3, 7, 8});
  expectTensor(r[4], {2, 1}, {4, 9});
}

TEST(Interpreter, Gather) {
  auto r = run(R"mlir(
    func.func @f(%t: tensor<3x2xf64>, %i: tensor<2x2xi64>, %j: tensor<2xi32>)
        -> (tensor<2x2x2xf64>, tensor<3x2xf64>) {
      %e = pcc.gather %t[%i] axis = 0 : tensor<3x2xf64>, tensor<2x2xi64> -> tensor<2x2x2xf64>
      %c = pcc.gather %t[%j] axis = 1 : tensor<3x2xf64>, tensor<2xi32> -> tensor<3x2xf64>
      return %e, %c : tensor<2x2x2xf64>, tensor<3x2xf64>
    }
  )mlir",
               {{{}, {1, 2, 3, 4, 5, 6}}, {{}, {2, -1, 0, 1}}, {{}, {-1, 0}}});
  ASSERT_EQ(r.size(), 2u);
  expectTensor(r[0], {2, 2, 2}, {5, 6, 5, 6, 1, 2, 3, 4});
  expectTensor(r[1], {3, 2}, {2, 1, 4, 3, 6, 5});
}

TEST(Interpreter, GatherOutOfRangeFails) {
  OwningOpRef<ModuleOp> module = parseSourceString<ModuleOp>(R"mlir(
    func.func @f(%t: tensor<3x2xf64>, %i: tensor<1xi64>) -> tensor<1x2xf64> {
      %e = pcc.gather %t[%i] axis = 0 : tensor<3x2xf64>, tensor<1xi64> -> tensor<1x2xf64>
      return %e : tensor<1x2xf64>
    }
  )mlir",
                                                             &context());
  ASSERT_TRUE(module);
  std::string error;
  auto r = interpret(*module->getOps<func::FuncOp>().begin(),
                     {{{}, {1, 2, 3, 4, 5, 6}}, {{}, {3}}}, noParam, &error);
  EXPECT_TRUE(failed(r));
  EXPECT_NE(error.find("pcc.gather"), std::string::npos) << error;
  EXPECT_NE(error.find("out of range"), std::string::npos) << error;
}

TEST(Interpreter, Reductions) {
  auto r = run(R"mlir(
    func.func @f(%x: tensor<2x3xf64>) -> (tensor<2xf64>, tensor<1x3xf64>, tensor<f64>, tensor<2xf64>, tensor<3xf64>, tensor<2xi64>, tensor<1x3xi64>) {
      %s = pcc.reduce_sum %x axes = [1] : tensor<2x3xf64> -> tensor<2xf64>
      %m = pcc.reduce_mean %x axes = [0] {keep_dims} : tensor<2x3xf64> -> tensor<1x3xf64>
      %x2 = pcc.reduce_max %x axes = [0, 1] : tensor<2x3xf64> -> tensor<f64>
      %p = pcc.reduce_prod %x axes = [1] : tensor<2x3xf64> -> tensor<2xf64>
      %n = pcc.reduce_min %x axes = [0] : tensor<2x3xf64> -> tensor<3xf64>
      %a = pcc.argmax %x axis = 1 : tensor<2x3xf64> -> tensor<2xi64>
      %b = pcc.argmax %x axis = 0 {keep_dims} : tensor<2x3xf64> -> tensor<1x3xi64>
      return %s, %m, %x2, %p, %n, %a, %b : tensor<2xf64>, tensor<1x3xf64>, tensor<f64>, tensor<2xf64>, tensor<3xf64>, tensor<2xi64>, tensor<1x3xi64>
    }
  )mlir",
               {{{2, 3}, {1, 5, 3, 4, 2, 6}}});
  ASSERT_EQ(r.size(), 7u);
  expectTensor(r[0], {2}, {9, 12});
  expectTensor(r[1], {1, 3}, {2.5, 3.5, 4.5});
  expectTensor(r[2], {}, {6});
  expectTensor(r[3], {2}, {15, 48});
  expectTensor(r[4], {3}, {1, 2, 3});
  expectTensor(r[5], {2}, {1, 2});
  expectTensor(r[6], {1, 3}, {1, 0, 1});
}

TEST(Interpreter, ConvPadsStridesBias) {
  // x = 1..9 (3x3), w = [[1, 0], [0, 1]].
  auto r =
      run(R"mlir(
    func.func @f(%x: tensor<1x1x3x3xf64>, %w: tensor<1x1x2x2xf64>, %b: tensor<1xf64>)
        -> (tensor<1x1x2x2xf64>, tensor<1x1x2x2xf64>) {
      %y = pcc.conv %x, %w strides = [1, 1] pads = [0, 0, 0, 0] dilations = [1, 1] groups = 1
          : tensor<1x1x3x3xf64>, tensor<1x1x2x2xf64> -> tensor<1x1x2x2xf64>
      %z = pcc.conv %x, %w, %b strides = [2, 2] pads = [1, 1, 1, 1] dilations = [1, 1] groups = 1
          : tensor<1x1x3x3xf64>, tensor<1x1x2x2xf64>, tensor<1xf64> -> tensor<1x1x2x2xf64>
      return %y, %z : tensor<1x1x2x2xf64>, tensor<1x1x2x2xf64>
    }
  )mlir",
          {{{}, {1, 2, 3, 4, 5, 6, 7, 8, 9}}, {{}, {1, 0, 0, 1}}, {{}, {1}}});
  ASSERT_EQ(r.size(), 2u);
  expectTensor(r[0], {1, 1, 2, 2}, {6, 8, 12, 14});
  expectTensor(r[1], {1, 1, 2, 2}, {2, 4, 8, 15});
}

TEST(Interpreter, ConvGroupsDilationsAsymmetricPads) {
  auto r = run(
      R"mlir(
    func.func @f(%x: tensor<1x2x1x1xf64>, %w: tensor<2x1x1x1xf64>, %u: tensor<1x1x5xf64>, %k: tensor<1x1x2xf64>)
        -> (tensor<1x2x1x1xf64>, tensor<1x1x3xf64>, tensor<1x1x6xf64>) {
      %y = pcc.conv %x, %w strides = [1, 1] pads = [0, 0, 0, 0] dilations = [1, 1] groups = 2
          : tensor<1x2x1x1xf64>, tensor<2x1x1x1xf64> -> tensor<1x2x1x1xf64>
      %z = pcc.conv %u, %k strides = [1] pads = [0, 0] dilations = [2] groups = 1
          : tensor<1x1x5xf64>, tensor<1x1x2xf64> -> tensor<1x1x3xf64>
      %p = pcc.conv %u, %k strides = [1] pads = [2, 0] dilations = [1] groups = 1
          : tensor<1x1x5xf64>, tensor<1x1x2xf64> -> tensor<1x1x6xf64>
      return %y, %z, %p : tensor<1x2x1x1xf64>, tensor<1x1x3xf64>, tensor<1x1x6xf64>
    }
  )mlir",
      {{{}, {2, 3}}, {{}, {10, 100}}, {{}, {1, 2, 3, 4, 5}}, {{}, {1, 10}}});
  ASSERT_EQ(r.size(), 3u);
  expectTensor(r[0], {1, 2, 1, 1}, {20, 300});
  // Taps 2 apart: x[i] + 10 x[i + 2].
  expectTensor(r[1], {1, 1, 3}, {31, 42, 53});
  // Two leading pads, none trailing: [0, 0, 1..5] windows of 2.
  expectTensor(r[2], {1, 1, 6}, {0, 10, 21, 32, 43, 54});
}

TEST(Interpreter, MaxPool) {
  // Padding never wins, even against negative values.
  auto r = run(R"mlir(
    func.func @f(%x: tensor<1x1x3x3xf64>) -> (tensor<1x1x2x2xf64>, tensor<1x1x2x2xf64>) {
      %a = pcc.max_pool %x kernel = [2, 2] strides = [1, 1] pads = [0, 0, 0, 0] dilations = [1, 1]
          : tensor<1x1x3x3xf64> -> tensor<1x1x2x2xf64>
      %n = pcc.neg %x : tensor<1x1x3x3xf64>
      %b = pcc.max_pool %n kernel = [2, 2] strides = [2, 2] pads = [1, 1, 1, 1] dilations = [1, 1]
          : tensor<1x1x3x3xf64> -> tensor<1x1x2x2xf64>
      return %a, %b : tensor<1x1x2x2xf64>, tensor<1x1x2x2xf64>
    }
  )mlir",
               {{{}, {1, 2, 3, 4, 5, 6, 7, 8, 9}}});
  ASSERT_EQ(r.size(), 2u);
  expectTensor(r[0], {1, 1, 2, 2}, {5, 6, 8, 9});
  expectTensor(r[1], {1, 1, 2, 2}, {-1, -2, -4, -5});
}

TEST(Interpreter, AvgPoolPaddingAndCeilMode) {
  auto r = run(R"mlir(
    func.func @f(%x: tensor<1x1x2x2xf64>, %u: tensor<1x1x5xf64>)
        -> (tensor<1x1x2x2xf64>, tensor<1x1x2x2xf64>, tensor<1x1x3xf64>, tensor<1x1x3xf64>) {
      %a = pcc.avg_pool %x kernel = [2, 2] strides = [2, 2] pads = [1, 1, 1, 1] dilations = [1, 1]
          : tensor<1x1x2x2xf64> -> tensor<1x1x2x2xf64>
      %b = pcc.avg_pool %x kernel = [2, 2] strides = [2, 2] pads = [1, 1, 1, 1] dilations = [1, 1] {count_include_pad}
          : tensor<1x1x2x2xf64> -> tensor<1x1x2x2xf64>
      %c = pcc.avg_pool %u kernel = [2] strides = [2] pads = [0, 0] dilations = [1] {ceil_mode, count_include_pad}
          : tensor<1x1x5xf64> -> tensor<1x1x3xf64>
      %d = pcc.max_pool %u kernel = [2] strides = [2] pads = [0, 0] dilations = [1] {ceil_mode}
          : tensor<1x1x5xf64> -> tensor<1x1x3xf64>
      return %a, %b, %c, %d : tensor<1x1x2x2xf64>, tensor<1x1x2x2xf64>, tensor<1x1x3xf64>, tensor<1x1x3xf64>
    }
  )mlir",
               {{{}, {1, 2, 3, 4}}, {{}, {1, 2, 3, 4, 5}}});
  ASSERT_EQ(r.size(), 4u);
  expectTensor(r[0], {1, 1, 2, 2}, {1, 2, 3, 4});
  expectTensor(r[1], {1, 1, 2, 2}, {0.25, 0.5, 0.75, 1});
  // The ceil-mode window past the input counts only its real position.
  expectTensor(r[2], {1, 1, 3}, {1.5, 3.5, 5});
  expectTensor(r[3], {1, 1, 3}, {2, 4, 5});
}

TEST(Interpreter, ElementwiseFloat) {
  auto r = run(R"mlir(
    func.func @f(%x: tensor<4xf64>, %y: tensor<4xf64>)
        -> (tensor<4xf64>, tensor<4xf64>, tensor<4xf64>, tensor<4xf64>, tensor<4xf64>, tensor<4xf64>, tensor<4xf64>) {
      %g = pcc.gelu %x : tensor<4xf64>
      %t = pcc.gelu %x {tanh_approximation} : tensor<4xf64>
      %l = pcc.leaky_relu %x alpha = 5.000000e-01 : tensor<4xf64>
      %c = pcc.clamp %x min = -1.000000e+00 max = 1.500000e+00 : tensor<4xf64>
      %p = pcc.pow %x, %y : tensor<4xf64>
      %m = pcc.mod %x, %y : tensor<4xf64>
      %f = pcc.mod %x, %y {fmod} : tensor<4xf64>
      return %g, %t, %l, %c, %p, %m, %f : tensor<4xf64>, tensor<4xf64>, tensor<4xf64>, tensor<4xf64>, tensor<4xf64>, tensor<4xf64>, tensor<4xf64>
    }
  )mlir",
               {{{}, {1, -2, 7, -7}}, {{}, {2, 3, -3, 3}}});
  ASSERT_EQ(r.size(), 7u);
  auto gelu = [](double x) {
    return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
  };
  auto geluTanh = [](double x) {
    return 0.5 * x *
           (1 + std::tanh(std::sqrt(2 / std::acos(-1.0)) *
                          (x + 0.044715 * x * x * x)));
  };
  expectTensor(r[0], {4}, {0.8413447460685429, gelu(-2), gelu(7), gelu(-7)});
  expectTensor(r[1], {4},
               {0.8411919906082768, geluTanh(-2), geluTanh(7), geluTanh(-7)});
  expectTensor(r[2], {4}, {1, -1, 7, -3.5});
  expectTensor(r[3], {4}, {1, -1, 1.5, -1});
  expectTensor(r[4], {4}, {1, -8, 1.0 / 343, -343});
  // ONNX Mod: the divisor's sign; fmod: the dividend's.
  expectTensor(r[5], {4}, {1, 1, -2, 2});
  expectTensor(r[6], {4}, {1, -2, 1, -1});
}

TEST(Interpreter, ComparisonsSelectAndTests) {
  auto r = run(R"mlir(
    func.func @f(%x: tensor<3xf64>, %y: tensor<3xf64>)
        -> (tensor<3xi1>, tensor<3xi1>, tensor<3xi1>, tensor<3xi1>, tensor<3xi1>, tensor<3xi1>, tensor<3xf64>, tensor<3xi1>, tensor<3xi1>, tensor<3xi1>) {
      %eq = pcc.compare eq, %x, %y : tensor<3xf64>
      %ne = pcc.compare ne, %x, %y : tensor<3xf64>
      %lt = pcc.compare lt, %x, %y : tensor<3xf64>
      %le = pcc.compare le, %x, %y : tensor<3xf64>
      %gt = pcc.compare gt, %x, %y : tensor<3xf64>
      %ge = pcc.compare ge, %x, %y : tensor<3xf64>
      %s = pcc.select %lt, %x, %y : tensor<3xi1>, tensor<3xf64>
      %l = pcc.log %x : tensor<3xf64>
      %n = pcc.is_nan %l : tensor<3xf64> -> tensor<3xi1>
      %r = pcc.reciprocal %x : tensor<3xf64>
      %i = pcc.is_inf %r {detect_negative = false} : tensor<3xf64> -> tensor<3xi1>
      %o = pcc.xor %n, %i : tensor<3xi1>
      return %eq, %ne, %lt, %le, %gt, %ge, %s, %n, %i, %o : tensor<3xi1>, tensor<3xi1>, tensor<3xi1>, tensor<3xi1>, tensor<3xi1>, tensor<3xi1>, tensor<3xf64>, tensor<3xi1>, tensor<3xi1>, tensor<3xi1>
    }
  )mlir",
               {{{}, {1, 0, -1}}, {{}, {1, 2, -3}}});
  ASSERT_EQ(r.size(), 10u);
  expectTensor(r[0], {3}, {1, 0, 0});
  expectTensor(r[1], {3}, {0, 1, 1});
  expectTensor(r[2], {3}, {0, 1, 0});
  expectTensor(r[3], {3}, {1, 1, 0});
  expectTensor(r[4], {3}, {0, 0, 1});
  expectTensor(r[5], {3}, {1, 0, 1});
  expectTensor(r[6], {3}, {1, 0, -3});
  expectTensor(r[7], {3}, {0, 0, 1}); // log(-1) is NaN, log(0) is -inf
  expectTensor(r[8], {3}, {0, 1, 0}); // 1/0 is +inf
  expectTensor(r[9], {3}, {0, 1, 1});
}

TEST(Interpreter, IntegersAndCasts) {
  auto r = run(R"mlir(
    func.func @f(%x: tensor<4xf64>, %a: tensor<4xi64>, %b: tensor<4xi64>)
        -> (tensor<4xi64>, tensor<4xi1>, tensor<4xi8>, tensor<4xi64>, tensor<4xi64>, tensor<4xf64>) {
      %i = pcc.cast %x : tensor<4xf64> -> tensor<4xi64>
      %t = pcc.cast %x : tensor<4xf64> -> tensor<4xi1>
      %w = pcc.cast %a : tensor<4xi64> -> tensor<4xi8>
      %d = pcc.div %a, %b : tensor<4xi64>
      %m = pcc.mod %a, %b : tensor<4xi64>
      %f = pcc.cast %d : tensor<4xi64> -> tensor<4xf64>
      return %i, %t, %w, %d, %m, %f : tensor<4xi64>, tensor<4xi1>, tensor<4xi8>, tensor<4xi64>, tensor<4xi64>, tensor<4xf64>
    }
  )mlir",
               {{{}, {-2.7, 0.0, 0.5, 3.9}},
                {{}, {-7, 7, 300, 5}},
                {{}, {2, -2, 7, 0}}});
  ASSERT_EQ(r.size(), 6u);
  expectTensor(r[0], {4}, {-2, 0, 0, 3});
  expectTensor(r[1], {4}, {1, 0, 1, 1});
  expectTensor(r[2], {4}, {-7, 7, 44, 5});  // 300 wraps to 44 in i8
  expectTensor(r[3], {4}, {-3, -3, 42, 0}); // truncating; / 0 gives 0
  expectTensor(r[4], {4}, {1, -1, 6, 0});   // the divisor's sign; % 0 is 0
  expectTensor(r[5], {4}, {-3, -3, 42, 0});
}

TEST(Interpreter, EvaluateOpAndUnevaluableOps) {
  OwningOpRef<ModuleOp> module = parseSourceString<ModuleOp>(R"mlir(
    module {
      pcc.mesh @mesh [tp = 2]
      func.func @f(%x: tensor<2xf64>) -> tensor<2xf64> {
        %s = pcc.sigmoid %x : tensor<2xf64>
        %y = pcc.all_reduce %s axis = "tp" : tensor<2xf64>
        return %y : tensor<2xf64>
      }
    }
  )mlir",
                                                             &context());
  ASSERT_TRUE(module);
  Operation *sigmoid = nullptr;
  module->walk([&](Operation *op) {
    if (op->getName().getStringRef() == "pcc.sigmoid")
      sigmoid = op;
  });
  ASSERT_TRUE(sigmoid);
  auto s = evaluateOp(sigmoid, {{{2}, {0, 1}}});
  ASSERT_TRUE(succeeded(s));
  expectTensor((*s)[0], {2}, {0.5, 1 / (1 + std::exp(-1.0))});

  std::string error;
  EXPECT_TRUE(failed(evaluateOp(sigmoid, {{{3}, {0, 1, 2}}}, &error)));
  EXPECT_NE(error.find("operand 0"), std::string::npos) << error;

  auto r = interpret(*module->getOps<func::FuncOp>().begin(), {{{2}, {0, 1}}},
                     noParam, &error);
  EXPECT_TRUE(failed(r));
  EXPECT_NE(error.find("'pcc.all_reduce'"), std::string::npos) << error;
  EXPECT_NE(error.find("not evaluable"), std::string::npos) << error;
}

/// Uniform floats in [-1, 1) from `gen`.
std::vector<float> randomFloats(std::mt19937 &gen, size_t n) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float &x : v)
    x = dist(gen);
  return v;
}

Tensor asTensor(const std::vector<float> &v) {
  return Tensor{{}, std::vector<double>(v.begin(), v.end())};
}

/// The pcc ops of `module`, in order.
std::vector<Operation *> pccOps(ModuleOp module) {
  std::vector<Operation *> ops;
  module->walk([&](Operation *op) {
    if (op->getDialect() && op->getDialect()->getNamespace() == "pcc")
      ops.push_back(op);
  });
  return ops;
}

void expectClose(const Tensor &t, const std::vector<float> &expected) {
  ASSERT_EQ(t.data.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i)
    ASSERT_NEAR(t.data[i], expected[i], 1e-5) << "element " << i;
}

// The window geometry of both tests below.
const int64_t kIn[] = {2, 4, 7, 6}, kWShape[] = {6, 2, 3, 2},
              kConvOut[] = {2, 6, 4, 5}, kPoolOut[] = {2, 4, 4, 3};
const int64_t kConvStrides[] = {2, 1}, kConvPads[] = {1, 0, 2, 1},
              kConvDilations[] = {1, 2};
const int64_t kKernel[] = {3, 2}, kPoolStrides[] = {2, 2},
              kPoolPads[] = {1, 0, 1, 1}, kPoolDilations[] = {1, 2};

// The window ops on awkward geometry (groups, strides, asymmetric pads,
// dilations, ceil mode) against the CPU kernels themselves, on f32 data.
TEST(Interpreter, WindowOpsMatchCpuKernels) {
  OwningOpRef<ModuleOp> module = parseSourceString<ModuleOp>(R"mlir(
    func.func @f(%x: tensor<2x4x7x6xf32>, %w: tensor<6x2x3x2xf32>, %b: tensor<6xf32>)
        -> (tensor<2x6x4x5xf32>, tensor<2x4x4x3xf32>, tensor<2x4x4x3xf32>) {
      %c = pcc.conv %x, %w, %b strides = [2, 1] pads = [1, 0, 2, 1] dilations = [1, 2] groups = 2
          : tensor<2x4x7x6xf32>, tensor<6x2x3x2xf32>, tensor<6xf32> -> tensor<2x6x4x5xf32>
      %m = pcc.max_pool %x kernel = [3, 2] strides = [2, 2] pads = [1, 0, 1, 1] dilations = [1, 2] {ceil_mode}
          : tensor<2x4x7x6xf32> -> tensor<2x4x4x3xf32>
      %a = pcc.avg_pool %x kernel = [3, 2] strides = [2, 2] pads = [1, 0, 1, 1] dilations = [1, 2] {ceil_mode, count_include_pad}
          : tensor<2x4x7x6xf32> -> tensor<2x4x4x3xf32>
      return %c, %m, %a : tensor<2x6x4x5xf32>, tensor<2x4x4x3xf32>, tensor<2x4x4x3xf32>
    }
  )mlir",
                                                             &context());
  ASSERT_TRUE(module);
  std::mt19937 gen(7);
  std::vector<float> x = randomFloats(gen, 2 * 4 * 7 * 6),
                     w = randomFloats(gen, 6 * 2 * 3 * 2),
                     b = randomFloats(gen, 6);
  std::vector<Operation *> ops = pccOps(*module);
  ASSERT_EQ(ops.size(), 3u);

  auto conv = evaluateOp(ops[0], {asTensor(x), asTensor(w), asTensor(b)});
  ASSERT_TRUE(succeeded(conv));
  std::vector<float> y(2 * 6 * 4 * 5);
  pcc_cpu_conv_f32(x.data(), w.data(), b.data(), y.data(), 2, kIn, kWShape,
                   kConvOut, kConvStrides, kConvPads, kConvDilations, 2);
  expectClose((*conv)[0], y);

  auto maxPool = evaluateOp(ops[1], {asTensor(x)});
  ASSERT_TRUE(succeeded(maxPool));
  y.assign(2 * 4 * 4 * 3, 0.0f);
  pcc_cpu_max_pool_f32(x.data(), y.data(), 2, kIn, kPoolOut, kKernel, kPoolStrides,
                       kPoolPads, kPoolDilations);
  expectClose((*maxPool)[0], y);

  auto avgPool = evaluateOp(ops[2], {asTensor(x)});
  ASSERT_TRUE(succeeded(avgPool));
  pcc_cpu_avg_pool_f32(x.data(), y.data(), 2, kIn, kPoolOut, kKernel, kPoolStrides,
                       kPoolPads, kPoolDilations, 1);
  expectClose((*avgPool)[0], y);
}

// The gradient kernels of conv and pooling against the interpreter, on the
// geometry above (groups, strides, dilations, asymmetric pads, ceil mode).
TEST(Interpreter, WindowGradientsMatchCpuKernels) {
  OwningOpRef<ModuleOp> module = parseSourceString<ModuleOp>(R"mlir(
    func.func @f(%x: tensor<2x4x7x6xf32>, %w: tensor<6x2x3x2xf32>, %dc: tensor<2x6x4x5xf32>,
                 %dp: tensor<2x4x4x3xf32>)
        -> (tensor<2x4x7x6xf32>, tensor<6x2x3x2xf32>, tensor<2x4x7x6xf32>, tensor<2x4x7x6xf32>) {
      %gi = pcc.conv_grad_input %dc, %w strides = [2, 1] pads = [1, 0, 2, 1] dilations = [1, 2] groups = 2
          : tensor<2x6x4x5xf32>, tensor<6x2x3x2xf32> -> tensor<2x4x7x6xf32>
      %gw = pcc.conv_grad_weight %x, %dc strides = [2, 1] pads = [1, 0, 2, 1] dilations = [1, 2] groups = 2
          : tensor<2x4x7x6xf32>, tensor<2x6x4x5xf32> -> tensor<6x2x3x2xf32>
      %m = pcc.max_pool_grad %x, %dp kernel = [3, 2] strides = [2, 2] pads = [1, 0, 1, 1] dilations = [1, 2] {ceil_mode}
          : tensor<2x4x7x6xf32>, tensor<2x4x4x3xf32> -> tensor<2x4x7x6xf32>
      %a = pcc.avg_pool_grad %dp kernel = [3, 2] strides = [2, 2] pads = [1, 0, 1, 1] dilations = [1, 2] {ceil_mode, count_include_pad}
          : tensor<2x4x4x3xf32> -> tensor<2x4x7x6xf32>
      return %gi, %gw, %m, %a : tensor<2x4x7x6xf32>, tensor<6x2x3x2xf32>, tensor<2x4x7x6xf32>, tensor<2x4x7x6xf32>
    }
  )mlir",
                                                             &context());
  ASSERT_TRUE(module);
  std::mt19937 gen(11);
  std::vector<float> x = randomFloats(gen, 2 * 4 * 7 * 6),
                     w = randomFloats(gen, 6 * 2 * 3 * 2),
                     dc = randomFloats(gen, 2 * 6 * 4 * 5),
                     dp = randomFloats(gen, 2 * 4 * 4 * 3);
  std::vector<Operation *> ops = pccOps(*module);
  ASSERT_EQ(ops.size(), 4u);
  // Garbage in the outputs: the kernels must overwrite, not accumulate.
  std::vector<float> dx(x.size(), 7.0f), dw(w.size(), 7.0f);

  auto gi = evaluateOp(ops[0], {asTensor(dc), asTensor(w)});
  ASSERT_TRUE(succeeded(gi));
  pcc_cpu_conv_grad_input_f32(dc.data(), w.data(), dx.data(), 2, kIn, kWShape,
                              kConvOut, kConvStrides, kConvPads, kConvDilations, 2);
  expectClose((*gi)[0], dx);

  auto gw = evaluateOp(ops[1], {asTensor(x), asTensor(dc)});
  ASSERT_TRUE(succeeded(gw));
  pcc_cpu_conv_grad_weight_f32(x.data(), dc.data(), dw.data(), 2, kIn, kWShape,
                               kConvOut, kConvStrides, kConvPads, kConvDilations,
                               2);
  expectClose((*gw)[0], dw);

  auto m = evaluateOp(ops[2], {asTensor(x), asTensor(dp)});
  ASSERT_TRUE(succeeded(m));
  dx.assign(x.size(), 7.0f);
  pcc_cpu_max_pool_grad_f32(x.data(), dp.data(), dx.data(), 2, kIn, kPoolOut,
                            kKernel, kPoolStrides, kPoolPads, kPoolDilations);
  expectClose((*m)[0], dx);

  auto a = evaluateOp(ops[3], {asTensor(dp)});
  ASSERT_TRUE(succeeded(a));
  dx.assign(x.size(), 7.0f);
  pcc_cpu_avg_pool_grad_f32(dp.data(), dx.data(), 2, kIn, kPoolOut, kKernel,
                            kPoolStrides, kPoolPads, kPoolDilations, 1);
  expectClose((*a)[0], dx);
}

//===----------------------------------------------------------------------===//
// The training ops (skipped while the dialect does not have them)
//===----------------------------------------------------------------------===//

TEST(Interpreter, ScatterAddIsGathersAdjoint) {
  auto r = run(R"mlir(
    func.func @f(%u: tensor<2x2x2xf64>, %i: tensor<2x2xi64>, %v: tensor<3x2xf64>, %j: tensor<2xi32>)
        -> (tensor<3x2xf64>, tensor<3x2xf64>) {
      %a = pcc.scatter_add %u[%i] axis = 0 : tensor<2x2x2xf64>, tensor<2x2xi64> -> tensor<3x2xf64>
      %b = pcc.scatter_add %v[%j] axis = 1 : tensor<3x2xf64>, tensor<2xi32> -> tensor<3x2xf64>
      return %a, %b : tensor<3x2xf64>, tensor<3x2xf64>
    }
  )mlir",
               {{{}, {1, 2, 3, 4, 5, 6, 7, 8}},
                {{}, {2, -1, 0, 2}},
                {{}, {1, 2, 3, 4, 5, 6}},
                {{}, {-1, -1}}});
  ASSERT_EQ(r.size(), 2u);
  // Rows 2 (three times: 2, -1, 2) and 0.
  expectTensor(r[0], {3, 2}, {5, 6, 0, 0, 1 + 3 + 7, 2 + 4 + 8});
  expectTensor(r[1], {3, 2}, {0, 3, 0, 7, 0, 11});
}

TEST(Interpreter, PadIsSlicesAdjoint) {
  auto r = run(R"mlir(
    func.func @f(%x: tensor<2x3xf64>) -> tensor<2x5xf64> {
      %p = pcc.pad %x starts = [0, 4] steps = [1, -2] : tensor<2x3xf64> -> tensor<2x5xf64>
      return %p : tensor<2x5xf64>
    }
  )mlir",
               {{{}, {4, 2, 0, 9, 7, 5}}});
  ASSERT_EQ(r.size(), 1u);
  // The inverse of the slice in SliceTransposeConcatSplit on its positions.
  expectTensor(r[0], {2, 5}, {0, 0, 2, 0, 4, 5, 0, 7, 0, 9});
}

TEST(Interpreter, CrossEntropyAndGradient) {
  auto r = run(R"mlir(
    func.func @f(%x: tensor<3x2xf64>, %l: tensor<3xi64>, %g: tensor<3xf64>)
        -> (tensor<3xf64>, tensor<3x2xf64>) {
      %c = pcc.cross_entropy %x, %l ignore_index = -100 : tensor<3x2xf64>, tensor<3xi64> -> tensor<3xf64>
      %d = pcc.cross_entropy_grad %x, %l, %g ignore_index = -100 : tensor<3x2xf64>, tensor<3xi64>, tensor<3xf64> -> tensor<3x2xf64>
      return %c, %d : tensor<3xf64>, tensor<3x2xf64>
    }
  )mlir",
               {{{}, {0, 1, 2, 2, 5, 3}}, {{}, {1, -100, 0}}, {{}, {2, 3, 1}}});
  ASSERT_EQ(r.size(), 2u);
  double e = std::exp(1.0), s = 1 / (1 + e), t = 1 / (1 + std::exp(-2.0));
  expectTensor(r[0], {3},
               {std::log(1 + e) - 1, 0, std::log(1 + std::exp(-2.0))});
  expectTensor(r[1], {3, 2}, {2 * s, 2 * (e * s - 1), 0, 0, t - 1, 1 - t});
}

} // namespace
