//===- ShapeRulesTest.cpp - shape arithmetic shared by ops and importer ---===//

#include "pcc/Dialect/Pcc/IR/ShapeRules.h"

#include <gtest/gtest.h>

using namespace mlir::pcc;

namespace {

// Tests numpy broadcasting, including rank extension and the failure case.
TEST(ShapeRules, BroadcastShapes) {
  auto s = broadcastShapes({2, 1, 4}, {3, 1});
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(*s, (llvm::SmallVector<int64_t>{2, 3, 4}));
  EXPECT_EQ(*broadcastShapes({}, {5}), (llvm::SmallVector<int64_t>{5}));
  EXPECT_FALSE(broadcastShapes({2, 3}, {4, 3}).has_value());
}

// Tests that one-way broadcastability rejects shrinking and mismatches.
TEST(ShapeRules, IsBroadcastableTo) {
  EXPECT_TRUE(isBroadcastableTo({64}, {2, 16, 64}));
  EXPECT_TRUE(isBroadcastableTo({1, 64}, {2, 64}));
  EXPECT_FALSE(isBroadcastableTo({2, 64}, {64}));
  EXPECT_FALSE(isBroadcastableTo({3}, {2, 4}));
}

// Tests ONNX axis normalisation at the range boundaries.
TEST(ShapeRules, NormalizeAxis) {
  EXPECT_EQ(normalizeAxis(-1, 3), 2);
  EXPECT_EQ(normalizeAxis(-3, 3), 0);
  EXPECT_EQ(normalizeAxis(2, 3), 2);
  EXPECT_FALSE(normalizeAxis(3, 3).has_value());
  EXPECT_FALSE(normalizeAxis(-4, 3).has_value());
}

// Tests conv/pool output sizes against PyTorch's formula, ceil mode included.
TEST(ShapeRules, WindowOutputSize) {
  // ResNet stem: 224, kernel 7, stride 2, pad 3 -> 112.
  EXPECT_EQ(windowOutputSize(224, 7, 2, 3, 3, 1, false), 112);
  // Max pool 3x3 stride 2 pad 1 on 112 -> 56.
  EXPECT_EQ(windowOutputSize(112, 3, 2, 1, 1, 1, false), 56);
  // Ceil mode adds a partial window: 5, kernel 2, stride 2 -> 3 (floor 2).
  EXPECT_EQ(windowOutputSize(5, 2, 2, 0, 0, 1, true), 3);
  EXPECT_EQ(windowOutputSize(5, 2, 2, 0, 0, 1, false), 2);
  // The last window may not start in the trailing padding.
  EXPECT_EQ(windowOutputSize(4, 2, 2, 0, 1, 1, true), 2);
  // Dilation 2 makes a 3-tap kernel span 5.
  EXPECT_EQ(windowOutputSize(7, 3, 1, 0, 0, 2, false), 3);
  EXPECT_LT(windowOutputSize(2, 3, 1, 0, 0, 1, false), 1);
}

// Tests strided slice lengths for positive and negative steps.
TEST(ShapeRules, SliceLength) {
  EXPECT_EQ(sliceLength(0, 10, 1), 10);
  EXPECT_EQ(sliceLength(1, 10, 3), 3);
  EXPECT_EQ(sliceLength(9, -1, -1), 10);
  EXPECT_EQ(sliceLength(9, 0, -2), 5);
  EXPECT_EQ(sliceLength(5, 5, 1), 0);
}

} // namespace
