//===- GradCheckStructureTest.cpp - VJP rules of structural ops -----------===//
//
// Finite-difference checks (GradCheck.h) of data movement, reductions,
// matrix products and losses, and of the ops without a gradient or a rule.
//
//===----------------------------------------------------------------------===//

#include "GradCheck.h"

#include "pcc/Dialect/Pcc/IR/PccDialect.h"
#include "pcc/Dialect/Pcc/IR/PccInterfaces.h"

#include "mlir/IR/Verifier.h"
#include "mlir/Parser/Parser.h"

#include <gtest/gtest.h>

using namespace mlir;
using namespace mlir::pcc;
using namespace pcc_gradcheck;

namespace {

// Data movement
//===----------------------------------------------------------------------===//

/// @f(%x: `in`) -> `op %x` : `in` -> `out`.
GradCase movement(const std::string &op, const std::string &in,
                  const std::string &out, std::vector<double> x) {
  GradCase c;
  c.ir = "func.func @f(%x: " + in + ") -> " + out + " {\n  %y = " + op + " : " +
         in + " -> " + out + "\n  return %y : " + out + "\n}\n";
  c.args = {std::move(x)};
  return c;
}

/// A data movement op on `n` values drawn uniformly from [-2, 2].
struct MovementCase {
  const char *name;
  const char *op;
  const char *in, *out;
  int64_t n;
};

const MovementCase kMovementCases[] = {
    {"Reshape", "pcc.reshape %x", "tensor<2x3x4xf64>", "tensor<6x4xf64>", 24},
    {"Transpose_Heads", "pcc.transpose %x [0, 2, 1, 3]", "tensor<2x3x2x2xf64>",
     "tensor<2x2x3x2xf64>", 24},
    {"Transpose", "pcc.transpose %x [2, 0, 1]", "tensor<2x3x4xf64>",
     "tensor<4x2x3xf64>", 24},
    {"Broadcast_NewLeadingDims", "pcc.broadcast %x", "tensor<3xf64>",
     "tensor<2x4x3xf64>", 3},
    {"Broadcast_SizeOneDims", "pcc.broadcast %x", "tensor<2x1x3x1xf64>",
     "tensor<2x4x3x2xf64>", 6},
    {"Broadcast_LeadingAndSizeOne", "pcc.broadcast %x", "tensor<4x1xf64>",
     "tensor<2x4x3xf64>", 4},
    {"Broadcast_Scalar", "pcc.broadcast %x", "tensor<f64>", "tensor<2x3xf64>",
     1},
    {"Slice_Step2",
     "pcc.slice %x starts = [1, 0] limits = [3, 6] steps = [1, 2]",
     "tensor<3x6xf64>", "tensor<2x3xf64>", 18},
    {"Slice_NegativeStep",
     "pcc.slice %x starts = [0, 5] limits = [3, -1] steps = [1, -1]",
     "tensor<3x6xf64>", "tensor<3x6xf64>", 18},
    // Columns 4, 2, 0: the pad's limit 4 - 3 * 2 = -2 runs below -1.
    {"Slice_NegativeStep2",
     "pcc.slice %x starts = [2, 4] limits = [0, -1] steps = [-1, -2]",
     "tensor<3x6xf64>", "tensor<2x3xf64>", 18},
    {"Pad_NegativeStep", "pcc.pad %x starts = [0, 4] steps = [1, -2]",
     "tensor<2x3xf64>", "tensor<2x5xf64>", 6},
    // Rows 1, 3 of 4 and columns 0, 3, 6 of 7: start + n * step (5 and 9)
    // lies past the dimensions (4, 7); the rule's slice must stop at the
    // edge.
    {"Pad_Strided", "pcc.pad %x starts = [1, 0] steps = [2, 3]",
     "tensor<2x3xf64>", "tensor<4x7xf64>", 6},
    // Rows 0, 2 of 4 and columns 0, 2, 4 of 6: the rule's slice limits are
    // 4 and 6, exactly the dimensions, so the bug of Pad_Strided is avoided.
    {"Pad_StridedEndingAtTheEdge", "pcc.pad %x starts = [0, 0] steps = [2, 2]",
     "tensor<2x3xf64>", "tensor<4x6xf64>", 6},
};

class GradCheckMovement : public ::testing::TestWithParam<MovementCase> {};

TEST_P(GradCheckMovement, MatchesFiniteDifferences) {
  const MovementCase &c = GetParam();
  Rng r;
  gradCheck(movement(c.op, c.in, c.out, r.uniform(c.n, -2, 2)));
}

INSTANTIATE_TEST_SUITE_P(GradCheck, GradCheckMovement,
                         ::testing::ValuesIn(kMovementCases), CaseName());

GradCase concatCase(Rng &r) {
  GradCase c;
  c.ir = R"mlir(
    func.func @f(%a: tensor<2x1xf64>, %b: tensor<2x3xf64>, %c: tensor<2x2xf64>) -> tensor<2x6xf64> {
      %y = pcc.concat %a, %b, %c axis = 1 : tensor<2x1xf64>, tensor<2x3xf64>, tensor<2x2xf64> -> tensor<2x6xf64>
      return %y : tensor<2x6xf64>
    }
  )mlir";
  c.args = {r.uniform(2, -2, 2), r.uniform(6, -2, 2), r.uniform(4, -2, 2)};
  return c;
}

TEST(GradCheck, Concat) {
  Rng r;
  gradCheck(concatCase(r));
}

TEST(GradCheck, Concat_MiddleNotNeeded) {
  Rng r;
  GradCase c = concatCase(r);
  c.needed = {true, false, true};
  gradCheck(c);
}

TEST(GradCheck, Concat_Axis0) {
  Rng r;
  GradCase c;
  c.ir = R"mlir(
    func.func @f(%a: tensor<1x3xf64>, %b: tensor<2x3xf64>) -> tensor<3x3xf64> {
      %y = pcc.concat %a, %b axis = 0 : tensor<1x3xf64>, tensor<2x3xf64> -> tensor<3x3xf64>
      return %y : tensor<3x3xf64>
    }
  )mlir";
  c.args = {r.uniform(3, -2, 2), r.uniform(6, -2, 2)};
  gradCheck(c);
}

TEST(GradCheck, Split) {
  Rng r;
  GradCase c;
  c.ir = R"mlir(
    func.func @f(%x: tensor<2x6xf64>) -> (tensor<2x1xf64>, tensor<2x3xf64>, tensor<2x2xf64>) {
      %p:3 = pcc.split %x axis = 1 sizes = [1, 3, 2] : tensor<2x6xf64> -> tensor<2x1xf64>, tensor<2x3xf64>, tensor<2x2xf64>
      return %p#0, %p#1, %p#2 : tensor<2x1xf64>, tensor<2x3xf64>, tensor<2x2xf64>
    }
  )mlir";
  c.args = {r.uniform(12, -2, 2)};
  gradCheck(c);
}

TEST(GradCheck, Split_OneResultWithoutGradient) {
  Rng r;
  GradCase c;
  c.ir = R"mlir(
    func.func @f(%x: tensor<6x2xf64>) -> (tensor<1x2xf64>, tensor<3x2xf64>, tensor<2x2xf64>) {
      %p:3 = pcc.split %x axis = 0 sizes = [1, 3, 2] : tensor<6x2xf64> -> tensor<1x2xf64>, tensor<3x2xf64>, tensor<2x2xf64>
      return %p#0, %p#1, %p#2 : tensor<1x2xf64>, tensor<3x2xf64>, tensor<2x2xf64>
    }
  )mlir";
  c.args = {r.uniform(12, -2, 2)};
  c.withGrad = {true, false, true};
  gradCheck(c);
}

/// A gather or scatter_add of `n` values drawn uniformly from [-2, 2] at
/// `indices`.
struct IndexedCase {
  const char *name;
  const char *op;
  int64_t axis;
  const char *in, *indexType, *out;
  int64_t n;
  std::vector<double> indices;
};

// clang-format off
const IndexedCase kIndexedCases[] = {
    // Repeated (0, -1 twice) and negative indices.
    {"Gather_Axis0", "pcc.gather", 0, "tensor<4x3xf64>", "tensor<2x3xi64>", "tensor<2x3x3xf64>", 12, {0, -1, 2, 0, 3, -1}},
    {"Gather_Axis1", "pcc.gather", 1, "tensor<3x4xf64>", "tensor<3xi32>", "tensor<3x3xf64>", 12, {1, -1, 1}},
    {"Gather_ScalarIndex", "pcc.gather", 0, "tensor<4x3xf64>", "tensor<i64>", "tensor<3xf64>", 12, {-2}},
    {"Gather_Axis1_2DIndices", "pcc.gather", 1, "tensor<2x4x3xf64>", "tensor<2x2xi64>", "tensor<2x2x2x3xf64>", 24, {3, -1, 0, 3}},
    {"ScatterAdd_Axis0", "pcc.scatter_add", 0, "tensor<2x3x3xf64>", "tensor<2x3xi64>", "tensor<4x3xf64>", 18, {0, -1, 2, 0, 3, -1}},
    {"ScatterAdd_Axis1", "pcc.scatter_add", 1, "tensor<3x3xf64>", "tensor<3xi32>", "tensor<3x4xf64>", 9, {1, -1, 1}},
};
// clang-format on

class GradCheckIndexed : public ::testing::TestWithParam<IndexedCase> {};

TEST_P(GradCheckIndexed, MatchesFiniteDifferences) {
  const IndexedCase &c = GetParam();
  Rng r;
  GradCase g;
  std::string in = c.in, index = c.indexType, out = c.out;
  g.ir = "func.func @f(%x: " + in + ", %i: " + index + ") -> " + out +
         " {\n  %y = " + c.op + " %x[%i] axis = " + std::to_string(c.axis) +
         " : " + in + ", " + index + " -> " + out + "\n  return %y : " + out +
         "\n}\n";
  g.args = {r.uniform(c.n, -2, 2), c.indices};
  gradCheck(g);
}

INSTANTIATE_TEST_SUITE_P(GradCheck, GradCheckIndexed,
                         ::testing::ValuesIn(kIndexedCases), CaseName());

//===----------------------------------------------------------------------===//
// Reductions
//===----------------------------------------------------------------------===//

/// @f(%x: tensor<2x3x4xf64>) -> `op %x axes = axes [keep]`.
GradCase reduceCase(const std::string &op, const std::string &axes, bool keep,
                    const std::string &out, std::vector<double> x) {
  return movement(op + " %x axes = " + axes + (keep ? " {keep_dims}" : ""),
                  "tensor<2x3x4xf64>", out, std::move(x));
}

/// A reduction of 24 values. Max and min draw distinct values (no ties).
struct ReduceCase {
  const char *name;
  const char *op;
  const char *axes;
  bool keep;
  const char *out;
  Sample x;
};

constexpr Sample kAny{Sample::Uniform, -2, 2}, kNoTies{Sample::Distinct, -2, 2},
    // No zero factor (the rule divides by x).
    kNoZero{Sample::AwayFromZero, 0.5, 1.5};

const ReduceCase kReduceCases[] = {
    {"ReduceSum", "pcc.reduce_sum", "[1]", false, "tensor<2x4xf64>", kAny},
    {"ReduceSum_KeepDimsTwoAxes", "pcc.reduce_sum", "[0, 2]", true,
     "tensor<1x3x1xf64>", kAny},
    {"ReduceSum_AllAxes", "pcc.reduce_sum", "[0, 1, 2]", false, "tensor<f64>",
     kAny},
    {"ReduceSum_UnsortedAxes", "pcc.reduce_sum", "[2, 0]", false,
     "tensor<3xf64>", kAny},
    {"ReduceMean_AllAxesKeepDims", "pcc.reduce_mean", "[0, 1, 2]", true,
     "tensor<1x1x1xf64>", kAny},
    {"ReduceMean_KeepDims", "pcc.reduce_mean", "[2]", true, "tensor<2x3x1xf64>",
     kAny},
    {"ReduceMean_TwoAxes", "pcc.reduce_mean", "[0, 2]", false, "tensor<3xf64>",
     kAny},
    {"ReduceMax", "pcc.reduce_max", "[1]", false, "tensor<2x4xf64>", kNoTies},
    {"ReduceMax_KeepDimsTwoAxes", "pcc.reduce_max", "[0, 2]", true,
     "tensor<1x3x1xf64>", kNoTies},
    {"ReduceMax_UnsortedAxes", "pcc.reduce_max", "[2, 1]", false,
     "tensor<2xf64>", kNoTies},
    {"ReduceMin", "pcc.reduce_min", "[2]", false, "tensor<2x3xf64>", kNoTies},
    {"ReduceMin_KeepDimsTwoAxes", "pcc.reduce_min", "[0, 1]", true,
     "tensor<1x1x4xf64>", kNoTies},
    {"ReduceProd", "pcc.reduce_prod", "[1]", false, "tensor<2x4xf64>", kNoZero},
    {"ReduceProd_KeepDimsTwoAxes", "pcc.reduce_prod", "[0, 2]", true,
     "tensor<1x3x1xf64>", kNoZero},
};

class GradCheckReduce : public ::testing::TestWithParam<ReduceCase> {};

TEST_P(GradCheckReduce, MatchesFiniteDifferences) {
  const ReduceCase &c = GetParam();
  Rng r;
  gradCheck(reduceCase(c.op, c.axes, c.keep, c.out, c.x.draw(r, 24)));
}

INSTANTIATE_TEST_SUITE_P(GradCheck, GradCheckReduce,
                         ::testing::ValuesIn(kReduceCases), CaseName());

// amax/amin: ties share the gradient evenly.
TEST(GradCheck, ReduceMax_TiesSplitEvenly) {
  GradCase c = movement("pcc.reduce_max %x axes = [1]", "tensor<2x3xf64>",
                        "tensor<2xf64>", {1, 3, 3, 2, 2, 2});
  c.gy = {{6, 3}};
  expectGradients(c, {{0, 3, 3, 1, 1, 1}});
}

TEST(GradCheck, ReduceMin_TiesSplitEvenly) {
  GradCase c =
      movement("pcc.reduce_min %x axes = [0] {keep_dims}", "tensor<2x3xf64>",
               "tensor<1x3xf64>", {1, 3, -2, 1, 2, -2});
  c.gy = {{4, 6, 8}};
  expectGradients(c, {{2, 0, 4, 2, 6, 4}});
}

//===----------------------------------------------------------------------===//
// Matrix products
//===----------------------------------------------------------------------===//

GradCase matmulCase(Rng &r, const std::string &lhs, int64_t lhsN,
                    const std::string &rhs, int64_t rhsN,
                    const std::string &out, const std::string &attrs) {
  GradCase c;
  c.ir = "func.func @f(%a: " + lhs + ", %b: " + rhs + ") -> " + out +
         " {\n  %y = pcc.matmul %a, %b " + attrs + " : " + lhs + ", " + rhs +
         " -> " + out + "\n  return %y : " + out + "\n}\n";
  c.args = {r.uniform(lhsN, -1, 1), r.uniform(rhsN, -1, 1)};
  return c;
}

/// A matrix product of values drawn uniformly from [-1, 1].
struct MatmulCase {
  const char *name;
  const char *lhs;
  int64_t lhsN;
  const char *rhs;
  int64_t rhsN;
  const char *out;
  const char *attrs;
};

const MatmulCase kMatmulCases[] = {
    {"Matmul", "tensor<3x4xf64>", 12, "tensor<4x5xf64>", 20, "tensor<3x5xf64>",
     ""},
    {"Matmul_TransposeA", "tensor<4x3xf64>", 12, "tensor<4x5xf64>", 20,
     "tensor<3x5xf64>", "{transpose_a}"},
    {"Matmul_TransposeB", "tensor<3x4xf64>", 12, "tensor<5x4xf64>", 20,
     "tensor<3x5xf64>", "{transpose_b}"},
    {"Matmul_TransposeAB", "tensor<4x3xf64>", 12, "tensor<5x4xf64>", 20,
     "tensor<3x5xf64>", "{transpose_a, transpose_b}"},
    {"Matmul_BatchedSharedRhs", "tensor<2x3x4xf64>", 24, "tensor<4x5xf64>", 20,
     "tensor<2x3x5xf64>", ""},
    {"Matmul_BatchedSharedRhs_TransposeB", "tensor<2x3x4xf64>", 24,
     "tensor<5x4xf64>", 20, "tensor<2x3x5xf64>", "{transpose_b}"},
    {"Matmul_BatchedSharedRhs_TransposeA", "tensor<2x4x3xf64>", 24,
     "tensor<4x5xf64>", 20, "tensor<2x3x5xf64>", "{transpose_a}"},
    {"Matmul_BatchedSharedRhs_TransposeAB", "tensor<2x4x3xf64>", 24,
     "tensor<5x4xf64>", 20, "tensor<2x3x5xf64>", "{transpose_a, transpose_b}"},
    {"Matmul_Batched4DSharedRhs", "tensor<2x2x3x4xf64>", 48, "tensor<4x5xf64>",
     20, "tensor<2x2x3x5xf64>", ""},
    {"Matmul_BatchedPerBatchRhs", "tensor<2x3x4xf64>", 24, "tensor<2x4x5xf64>",
     40, "tensor<2x3x5xf64>", ""},
    {"Matmul_BatchedPerBatchRhs_TransposeAB", "tensor<2x4x3xf64>", 24,
     "tensor<2x5x4xf64>", 40, "tensor<2x3x5xf64>",
     "{transpose_a, transpose_b}"},
    {"Matmul_Batched4DPerBatchRhs_TransposeB", "tensor<2x2x3x4xf64>", 48,
     "tensor<2x2x5x4xf64>", 80, "tensor<2x2x3x5xf64>", "{transpose_b}"},
};

class GradCheckMatmul : public ::testing::TestWithParam<MatmulCase> {};

TEST_P(GradCheckMatmul, MatchesFiniteDifferences) {
  const MatmulCase &c = GetParam();
  Rng r;
  gradCheck(matmulCase(r, c.lhs, c.lhsN, c.rhs, c.rhsN, c.out, c.attrs));
}

INSTANTIATE_TEST_SUITE_P(GradCheck, GradCheckMatmul,
                         ::testing::ValuesIn(kMatmulCases), CaseName());

//===----------------------------------------------------------------------===//
// Losses
//===----------------------------------------------------------------------===//

TEST(GradCheck, CrossEntropy_IgnoreIndex) {
  // Rows 1 and 3 are ignored: zero gradient there.
  Rng r;
  GradCase c;
  c.ir = R"mlir(
    func.func @f(%x: tensor<5x4xf64>, %l: tensor<5xi64>) -> tensor<5xf64> {
      %y = pcc.cross_entropy %x, %l ignore_index = -100 : tensor<5x4xf64>, tensor<5xi64> -> tensor<5xf64>
      return %y : tensor<5xf64>
    }
  )mlir";
  c.args = {r.uniform(20, -3, 3), {2, -100, 0, -100, 3}};
  gradCheck(c);
}

TEST(GradCheck, CrossEntropy_PositiveIgnoreIndex) {
  Rng r;
  GradCase c;
  c.ir = R"mlir(
    func.func @f(%x: tensor<3x4xf64>, %l: tensor<3xi32>) -> tensor<3xf64> {
      %y = pcc.cross_entropy %x, %l ignore_index = 1 : tensor<3x4xf64>, tensor<3xi32> -> tensor<3xf64>
      return %y : tensor<3xf64>
    }
  )mlir";
  c.args = {r.uniform(12, -3, 3), {1, 3, 0}};
  gradCheck(c);
}

//===----------------------------------------------------------------------===//
// Convolution and pooling
//===----------------------------------------------------------------------===//

/// @f(%x, %w[, %b]) -> conv, with `attrs` the window attributes.
GradCase conv(const std::string &x, const std::string &w, const std::string &b,
              const std::string &out, const std::string &attrs, Rng &r,
              int64_t xCount, int64_t wCount, int64_t bCount) {
  GradCase c;
  std::string bias = b.empty() ? "" : ", %b: " + b;
  c.ir = "func.func @f(%x: " + x + ", %w: " + w + bias + ") -> " + out +
         " {\n  %y = pcc.conv %x, %w" + (b.empty() ? "" : ", %b") + " " +
         attrs + " : " + x + ", " + w + (b.empty() ? "" : ", " + b) + " -> " +
         out + "\n  return %y : " + out + "\n}\n";
  c.args = {r.uniform(xCount, -2, 2), r.uniform(wCount, -1, 1)};
  if (!b.empty())
    c.args.push_back(r.uniform(bCount, -1, 1));
  return c;
}

TEST(GradCheck, Conv_PadsStridesBias) {
  Rng r;
  gradCheck(conv("tensor<2x2x5x4xf64>", "tensor<3x2x3x2xf64>", "tensor<3xf64>",
                 "tensor<2x3x3x4xf64>",
                 "strides = [2, 1] pads = [1, 0, 1, 1] dilations = [1, 1] "
                 "groups = 1",
                 r, 80, 36, 3));
}

TEST(GradCheck, Conv_GroupsDilations) {
  Rng r;
  gradCheck(conv("tensor<1x4x6x5xf64>", "tensor<4x2x2x2xf64>", "",
                 "tensor<1x4x5x3xf64>",
                 "strides = [1, 2] pads = [0, 1, 1, 0] dilations = [2, 1] "
                 "groups = 2",
                 r, 120, 32, 0));
}

TEST(GradCheck, Conv_1d) {
  Rng r;
  gradCheck(conv("tensor<2x3x7xf64>", "tensor<2x3x3xf64>", "tensor<2xf64>",
                 "tensor<2x2x4xf64>",
                 "strides = [2] pads = [1, 1] dilations = [1] groups = 1", r,
                 42, 18, 2));
}

TEST(GradCheck, MaxPool) {
  Rng r;
  gradCheck(movement("pcc.max_pool %x kernel = [3, 3] strides = [2, 2] pads = "
                     "[1, 1, 1, 1] dilations = [1, 1]",
                     "tensor<2x2x5x5xf64>", "tensor<2x2x3x3xf64>",
                     r.distinct(100, -2, 2)));
}

TEST(GradCheck, MaxPool_CeilModeDilations) {
  Rng r;
  gradCheck(movement("pcc.max_pool %x kernel = [3, 2] strides = [2, 2] pads = "
                     "[1, 0, 1, 1] dilations = [1, 2] {ceil_mode}",
                     "tensor<1x2x7x6xf64>", "tensor<1x2x4x3xf64>",
                     r.distinct(84, -2, 2)));
}

// A tie goes to the window's first maximum, as PyTorch's indices.
TEST(GradCheck, MaxPool_TieGoesToTheFirst) {
  GradCase c;
  c.ir = movement("pcc.max_pool %x kernel = [2, 2] strides = [1, 1] pads = "
                  "[0, 0, 0, 0] dilations = [1, 1]",
                  "tensor<1x1x2x2xf64>", "tensor<1x1x1x1xf64>", {})
             .ir;
  c.args = {{1, 3, 3, 2}};
  c.gy = {{5}};
  expectGradients(c, {{0, 5, 0, 0}});
}

TEST(GradCheck, AvgPool_CountIncludePadCeilMode) {
  Rng r;
  gradCheck(movement("pcc.avg_pool %x kernel = [3, 2] strides = [2, 2] pads = "
                     "[1, 0, 1, 1] dilations = [1, 2] {ceil_mode, "
                     "count_include_pad}",
                     "tensor<1x2x7x6xf64>", "tensor<1x2x4x3xf64>",
                     r.uniform(84, -2, 2)));
}

TEST(GradCheck, AvgPool_RealPositionsOnly) {
  Rng r;
  gradCheck(movement("pcc.avg_pool %x kernel = [3, 3] strides = [2, 2] pads = "
                     "[1, 1, 1, 1] dilations = [1, 1]",
                     "tensor<2x2x5x5xf64>", "tensor<2x2x3x3xf64>",
                     r.uniform(100, -2, 2)));
}

// Dropout: the VJP draws the forward's mask again (same stream, same
// counters), so it is exactly the derivative of the masked scaling.
TEST(GradCheck, Dropout) {
  Rng r;
  GradCase c;
  c.ir = R"mlir(
    func.func @f(%x: tensor<4x9xf64>) -> tensor<4x9xf64> {
      %y = pcc.dropout %x ratio = 3.000000e-01 stream = 5 : tensor<4x9xf64>
      return %y : tensor<4x9xf64>
    }
  )mlir";
  c.args = {r.uniform(36, -2, 2)};
  gradCheck(c);
}

//===----------------------------------------------------------------------===//
// No gradient
//===----------------------------------------------------------------------===//

TEST(GradCheck, NoGradient_Floor) { expectNoGradient(unary("pcc.floor %x")); }

TEST(GradCheck, NoGradient_Ceil) { expectNoGradient(unary("pcc.ceil %x")); }

TEST(GradCheck, NoGradient_Compare) {
  expectNoGradient(R"mlir(
    func.func @f(%a: tensor<2x3xf64>, %b: tensor<2x3xf64>) -> tensor<2x3xi1> {
      %y = pcc.compare lt, %a, %b : tensor<2x3xf64>
      return %y : tensor<2x3xi1>
    }
  )mlir");
}

TEST(GradCheck, NoGradient_ArgMax) {
  expectNoGradient(R"mlir(
    func.func @f(%x: tensor<2x3xf64>) -> tensor<2xi64> {
      %y = pcc.argmax %x axis = 1 : tensor<2x3xf64> -> tensor<2xi64>
      return %y : tensor<2xi64>
    }
  )mlir");
}

TEST(GradCheck, NoGradient_IsNaNIsInf) {
  expectNoGradient(R"mlir(
    func.func @f(%x: tensor<2x3xf64>) -> tensor<2x3xi1> {
      %y = pcc.is_nan %x : tensor<2x3xf64> -> tensor<2x3xi1>
      return %y : tensor<2x3xi1>
    }
  )mlir");
  expectNoGradient(R"mlir(
    func.func @f(%x: tensor<2x3xf64>) -> tensor<2x3xi1> {
      %y = pcc.is_inf %x : tensor<2x3xf64> -> tensor<2x3xi1>
      return %y : tensor<2x3xi1>
    }
  )mlir");
}

TEST(GradCheck, NoGradient_Logical) {
  expectNoGradient(unary("pcc.not %x", "tensor<2x3xi1>"));
  for (const char *op : {"pcc.and %a, %b", "pcc.or %a, %b", "pcc.xor %a, %b"})
    expectNoGradient(binary(op, "tensor<2x3xi1>"));
}

TEST(GradCheck, NoGradient_ParamAndConstant) {
  expectNoGradient(R"mlir(
    func.func @f() -> tensor<2x3xf64> {
      %y = pcc.param "w" : tensor<2x3xf64>
      return %y : tensor<2x3xf64>
    }
  )mlir");
  expectNoGradient(R"mlir(
    func.func @f() -> tensor<2xf64> {
      %y = pcc.constant dense<[1.0, 2.0]> : tensor<2xf64>
      return %y : tensor<2xf64>
    }
  )mlir");
}

// Rules of ops that also take integers give integers no gradient. (Their
// saved lists do not look at the type and are left alone: pcc-autodiff
// never asks an op without a float operand.)
TEST(GradCheck, NoGradient_IntegerOperands) {
  expectNoGradient(binary("pcc.div %a, %b", "tensor<2x3xi64>"),
                   /*noSaved=*/false);
  for (const char *op : {"pcc.reduce_max", "pcc.reduce_min", "pcc.reduce_prod"})
    expectNoGradient(movement(std::string(op) + " %x axes = [1]",
                              "tensor<2x3xi64>", "tensor<2xi64>", {})
                         .ir,
                     /*noSaved=*/false);
  expectNoGradient(
      movement("pcc.cast %x", "tensor<2x3xi64>", "tensor<2x3xf64>", {}).ir);
  expectNoGradient(
      movement("pcc.cast %x", "tensor<2x3xf64>", "tensor<2x3xi64>", {}).ir);
}

//===----------------------------------------------------------------------===//
// Ops without a rule: pcc-autodiff refuses them
//===----------------------------------------------------------------------===//

// Gradient ops (no second derivatives yet), collectives and state updates.
const char *const kRefused[] = {
    "pcc.conv_grad_input",
    "pcc.conv_grad_weight",
    "pcc.max_pool_grad",
    "pcc.avg_pool_grad",
    "pcc.all_gather",
    "pcc.reduce_scatter",
    "pcc.shard_slice",
    "pcc.shard_gather",
    "pcc.shard_scatter_add",
    "pcc.transfer",
    "pcc.fusion",
    "pcc.yield",
    "pcc.cross_entropy_grad",
    "pcc.attention_grad",
    "pcc.linear_cross_entropy_grad",
    "pcc.accumulate",
    "pcc.zero",
    "pcc.assign",
    "pcc.bucket_start",
    "pcc.bucket_wait",
    "pcc.ema_update",
    "pcc.sgd_update",
    "pcc.adamw_update",
    "pcc.refresh_copy",
    "pcc.sum_squares",
    "pcc.reduce_scatter_start",
    "pcc.wait_collectives",
    "pcc.all_gather_start",
    "pcc.mesh",
};

TEST(GradCheck, NoRule_GradientsCollectivesState) {
  for (const char *name : kRefused) {
    auto op = RegisteredOperationName::lookup(name, &context());
    ASSERT_TRUE(op.has_value()) << name << " is not registered";
    EXPECT_FALSE(op->hasInterface<AutodiffOpInterface>())
        << name << " has a gradient rule; give it a gradient check here";
  }
}

TEST(GradCheck, NoRule_OnAParsedConvGradient) {
  OwningOpRef<ModuleOp> module = parseSourceString<ModuleOp>(R"mlir(
    func.func @f(%g: tensor<1x1x2x2xf64>, %w: tensor<1x1x2x2xf64>) -> tensor<1x1x3x3xf64> {
      %y = pcc.conv_grad_input %g, %w strides = [1, 1] pads = [0, 0, 0, 0] dilations = [1, 1] groups = 1
          : tensor<1x1x2x2xf64>, tensor<1x1x2x2xf64> -> tensor<1x1x3x3xf64>
      return %y : tensor<1x1x3x3xf64>
    }
  )mlir",
                                                             &context());
  ASSERT_TRUE(module);
  Operation *op = opUnderTest(module);
  ASSERT_TRUE(op);
  EXPECT_FALSE(isa<AutodiffOpInterface>(op));
}

// all_reduce over a mesh axis: the interpreter runs one rank, so finite
// differences check the rule on an axis of one rank (where the sum is the
// identity), its structure is checked on two (the VJP is the same
// all-reduce of the cotangent), and its numbers over several ranks in
// test/Training/dp-*.test, where data parallelism with synchronised batch
// statistics trains what one device trains.
TEST(GradCheck, AllReduce_OneRank) {
  GradCase c;
  c.ir = "module {\n  pcc.mesh @mesh [dp = 1]\n" +
         unary("pcc.all_reduce %x axis = \"dp\"") + "}\n";
  c.args = {{0.5, -1.25, 2.0, 0.0, 3.5, -0.75}};
  gradCheck(c);
}

TEST(GradCheck, AllReduce_IsAllReduceOfTheCotangent) {
  OwningOpRef<ModuleOp> module = parseSourceString<ModuleOp>(R"mlir(
    module {
      pcc.mesh @mesh [dp = 2]
      func.func @f(%x: tensor<2x3xf32>) -> tensor<2x3xf32> {
        %y = pcc.all_reduce %x axis = "dp" : tensor<2x3xf32>
        return %y : tensor<2x3xf32>
      }
    }
  )mlir",
                                                             &context());
  ASSERT_TRUE(module);
  Operation *op = opUnderTest(module);
  ASSERT_TRUE(op);
  auto rule = dyn_cast<AutodiffOpInterface>(op);
  ASSERT_TRUE(rule);
  SmallVector<Value> saved;
  rule.getSavedValues(saved);
  EXPECT_TRUE(saved.empty());
  OpBuilder b(op->getBlock()->getTerminator());
  Value seed = op->getBlock()->getArgument(0);
  SmallVector<Value> grads;
  ASSERT_TRUE(succeeded(rule.buildVjp(b, {seed}, {true}, grads)));
  ASSERT_EQ(grads.size(), 1u);
  auto reduce = grads[0].getDefiningOp<AllReduceOp>();
  ASSERT_TRUE(reduce);
  EXPECT_EQ(reduce.getInput(), seed);
  EXPECT_EQ(reduce.getAxis(), "dp");
  EXPECT_TRUE(succeeded(verify(*module)));
}

// Every registered pcc op is covered above: a rule (checked by a GradCheck
// case), a no-gradient rule, or none (refused). A new op must be sorted.
TEST(GradCheck, EveryOpIsClassified) {
  const llvm::DenseSet<StringRef> noGradient = {
      "pcc.floor",   "pcc.ceil",   "pcc.not",    "pcc.and",
      "pcc.or",      "pcc.xor",    "pcc.is_nan", "pcc.is_inf",
      "pcc.compare", "pcc.argmax", "pcc.param",  "pcc.constant"};
  const llvm::DenseSet<StringRef> withRule = {
      "pcc.neg",           "pcc.abs",
      "pcc.sqrt",          "pcc.reciprocal",
      "pcc.exp",           "pcc.log",
      "pcc.erf",           "pcc.tanh",
      "pcc.sigmoid",       "pcc.relu",
      "pcc.sin",           "pcc.cos",
      "pcc.gelu",          "pcc.leaky_relu",
      "pcc.clamp",         "pcc.add",
      "pcc.sub",           "pcc.mul",
      "pcc.div",           "pcc.pow",
      "pcc.max",           "pcc.min",
      "pcc.mod",           "pcc.select",
      "pcc.cast",          "pcc.softmax",
      "pcc.log_softmax",   "pcc.layer_norm",
      "pcc.batch_norm",    "pcc.reshape",
      "pcc.transpose",     "pcc.broadcast",
      "pcc.concat",        "pcc.split",
      "pcc.slice",         "pcc.pad",
      "pcc.gather",        "pcc.scatter_add",
      "pcc.reduce_sum",    "pcc.reduce_mean",
      "pcc.reduce_max",    "pcc.reduce_min",
      "pcc.reduce_prod",   "pcc.matmul",
      "pcc.cross_entropy", "pcc.conv",
      "pcc.max_pool",      "pcc.avg_pool",
      "pcc.dropout",       "pcc.all_reduce",
      "pcc.attention",     "pcc.linear_cross_entropy"};
  llvm::DenseSet<StringRef> refused(std::begin(kRefused), std::end(kRefused));
  int count = 0;
  for (RegisteredOperationName name : context().getRegisteredOperations()) {
    if (name.getDialectNamespace() != "pcc")
      continue;
    ++count;
    StringRef n = name.getStringRef();
    int lists =
        withRule.contains(n) + noGradient.contains(n) + refused.contains(n);
    EXPECT_EQ(lists, 1) << n.str() << " is in " << lists
                        << " of the lists here";
    EXPECT_EQ(name.hasInterface<AutodiffOpInterface>(), !refused.contains(n))
        << n.str();
  }
  EXPECT_EQ(count, static_cast<int>(withRule.size() + noGradient.size() +
                                    refused.size()));
}

} // namespace

//===----------------------------------------------------------------------===//
// Fused attention
//===----------------------------------------------------------------------===//

/// pcc.attention's rule (pcc.attention_grad, the probabilities recomputed
/// from the saved log-sum-exps) against finite differences of the forward:
/// plain, causal with fewer queries than keys (the mask aligned to the
/// bottom right), grouped-query with a padding bias.
TEST(GradCheck, Attention) {
  struct Case {
    const char *name, *attrs;
    int64_t hq, hkv, s, l;
    bool bias;
  };
  for (Case k : {Case{"plain", "", 2, 2, 3, 3, false},
                 Case{"causal", "{causal}", 2, 2, 3, 5, false},
                 Case{"grouped, bias", "{causal}", 4, 2, 4, 4, true}}) {
    SCOPED_TRACE(k.name);
    auto t = [](int64_t h, int64_t s, int64_t d) {
      return "tensor<2x" + std::to_string(h) + "x" + std::to_string(s) + "x" +
             std::to_string(d) + "xf64>";
    };
    std::string q = t(k.hq, k.s, 3), kv = t(k.hkv, k.l, 3),
                o = t(k.hq, k.s, 3),
                lse = "tensor<2x" + std::to_string(k.hq) + "x" +
                      std::to_string(k.s) + "xf64>",
                b = "tensor<2x1x1x" + std::to_string(k.l) + "xf64>";
    GradCase c;
    c.ir = "func.func @f(%q: " + q + ", %k: " + kv + ", %v: " + kv +
           (k.bias ? ", %b: " + b : std::string()) + ") -> (" + o + ", " +
           lse + ")" +
           " {\n  %o, %lse = pcc.attention %q, %k, %v" +
           (k.bias ? " bias %b" : "") + " scale = 0.7 " + k.attrs + " : " + q +
           ", " + kv + ", " + kv + (k.bias ? ", " + b : std::string()) +
           " -> " + o + ", " + lse + "\n  return %o, %lse : " + o + ", " + lse +
           "\n}\n";
    // The log-sum-exps only feed the gradient.
    c.withGrad = {true, false};
    Rng r;
    c.args = {r.uniform(2 * k.hq * k.s * 3, -1, 1),
              r.uniform(2 * k.hkv * k.l * 3, -1, 1),
              r.uniform(2 * k.hkv * k.l * 3, -1, 1)};
    if (k.bias) {
      std::vector<double> pad(2 * k.l, 0.0);
      pad[k.l - 1] = -std::numeric_limits<double>::infinity();
      c.args.push_back(pad);
      c.needed = {true, true, true, false};
    }
    gradCheck(c);
  }
}

//===----------------------------------------------------------------------===//
// The LM head's fused cross-entropy
//===----------------------------------------------------------------------===//

/// pcc.linear_cross_entropy's rule (pcc.linear_cross_entropy_grad, the
/// logits recomputed from the saved log-sum-exps) against finite
/// differences of both results, with the weight [V, D] (transpose_w) and
/// [D, V], an ignored row among them.
TEST(GradCheck, LinearCrossEntropy) {
  for (bool transposeW : {true, false}) {
    SCOPED_TRACE(transposeW ? "[V, D] weight" : "[D, V] weight");
    std::string w = transposeW ? "tensor<6x3xf64>" : "tensor<3x6xf64>";
    GradCase c;
    c.ir = "func.func @f(%h: tensor<4x3xf64>, %w: " + w +
           ", %l: tensor<4xi64>) -> (tensor<4xf64>, tensor<4xf64>) {\n"
           "  %lse, %t = pcc.linear_cross_entropy %h, %w, %l ignore_index = "
           "-100 " +
           (transposeW ? "{transpose_w} " : "") + ": tensor<4x3xf64>, " + w +
           ", tensor<4xi64> -> tensor<4xf64>, tensor<4xf64>\n"
           "  return %lse, %t : tensor<4xf64>, tensor<4xf64>\n}\n";
    Rng r;
    c.args = {r.uniform(12, -1, 1), r.uniform(18, -1, 1), {5, -100, 0, 2}};
    gradCheck(c);
  }
}
