//===- HostTensorTest.cpp - constants evaluated at import time
//-------------===//

#include "../lib/Import/HostTensor.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/MLIRContext.h"

#include <gtest/gtest.h>

using namespace mlir;
using namespace mlir::pcc::onnx_import;

namespace {

class HostTensorTest : public ::testing::Test {
protected:
  MLIRContext context;
  Builder b{&context};
};

// Tests that broadcasting repeats values along size-1 and missing dimensions.
TEST_F(HostTensorTest, BroadcastTo) {
  HostTensor col = HostTensor::ints(b.getI64Type(), {2, 1}, {7, 9});
  HostTensor out = broadcastTo(col, {3, 2, 2});
  ASSERT_EQ(out.size(), 12);
  std::vector<int64_t> expected = {7, 7, 9, 9, 7, 7, 9, 9, 7, 7, 9, 9};
  EXPECT_EQ(out.toInts(), expected);
}

// Tests ONNX Cast semantics: truncation towards zero, non-zero is true,
// and saturation instead of undefined behaviour for out-of-range floats.
TEST_F(HostTensorTest, CastTo) {
  HostTensor f =
      HostTensor::floats(b.getF32Type(), {4}, {-1.7, 0.0, 2.9, 1e30});
  EXPECT_EQ(f.castTo(b.getI64Type()).toInts(),
            (std::vector<int64_t>{-1, 0, 2, INT64_MAX}));
  EXPECT_EQ(f.castTo(b.getI1Type()).toInts(),
            (std::vector<int64_t>{1, 0, 1, 1}));
  HostTensor i = HostTensor::ints(b.getI64Type(), {2}, {3, -4});
  HostTensor g = i.castTo(b.getF16Type());
  EXPECT_DOUBLE_EQ(g.getDouble(1), -4.0);
}

// Tests the round trip through an MLIR dense attribute, int64 extremes
// included (Slice ends are often INT64_MAX).
TEST_F(HostTensorTest, AttrRoundTrip) {
  HostTensor t =
      HostTensor::ints(b.getI64Type(), {3}, {INT64_MAX, INT64_MIN, -1});
  DenseElementsAttr attr = t.toAttr();
  EXPECT_EQ(attr.getType().getShape(), ArrayRef<int64_t>{3});
  EXPECT_EQ(HostTensor::fromAttr(attr).toInts(), t.toInts());

  HostTensor u8 = HostTensor::ints(b.getIntegerType(8, false), {2}, {255, 0});
  EXPECT_EQ(HostTensor::fromAttr(u8.toAttr()).toInts(),
            (std::vector<int64_t>{255, 0}));

  HostTensor half = HostTensor::floats(b.getBF16Type(), {2}, {0.5, -2.0});
  HostTensor back = HostTensor::fromAttr(half.toAttr());
  EXPECT_DOUBLE_EQ(back.getDouble(0), 0.5);
  EXPECT_DOUBLE_EQ(back.getDouble(1), -2.0);
}

// Tests that a reshape keeps the data and changes only the shape.
TEST_F(HostTensorTest, Reshaped) {
  HostTensor t = HostTensor::ints(b.getI32Type(), {2, 3}, {1, 2, 3, 4, 5, 6});
  HostTensor r = t.reshaped({3, 2});
  EXPECT_EQ(r.getShape(), ArrayRef<int64_t>({3, 2}));
  EXPECT_EQ(r.toInts(), t.toInts());
  EXPECT_EQ(stridesOf({2, 3, 4}), (llvm::SmallVector<int64_t>{12, 4, 1}));
}

} // namespace
