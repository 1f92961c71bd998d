//===- InterfacesTest.cpp - the op interfaces and the layout algebra -----===//

#include "Interpreter.h"
#include "pcc/Dialect/Pcc/IR/PccInterfaces.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"

#include <gtest/gtest.h>

using namespace mlir;
using namespace mlir::pcc;

namespace {

MLIRContext &context() { return ::pcc::testing::testContext(); }

/// The first op named `name` in `source`.
Operation *firstOp(OwningOpRef<ModuleOp> &module, StringRef name) {
  Operation *found = nullptr;
  module->walk([&](Operation *op) {
    if (!found && op->getName().getStringRef() == name)
      found = op;
  });
  return found;
}

TEST(Interfaces, EveryOpHasShardingAndCostRules) {
  // A new op cannot be forgotten by the planners: every registered pcc op
  // carries both interfaces (a rule of its own or the generic one).
  int count = 0;
  for (RegisteredOperationName name : context().getRegisteredOperations()) {
    if (name.getDialectNamespace() != "pcc")
      continue;
    ++count;
    EXPECT_TRUE(name.hasInterface<ShardingOpInterface>())
        << name.getStringRef().str();
    EXPECT_TRUE(name.hasInterface<CostOpInterface>())
        << name.getStringRef().str();
    bool collective = name.getStringRef() == "pcc.all_reduce" ||
                      name.getStringRef() == "pcc.all_gather" ||
                      name.getStringRef() == "pcc.reduce_scatter" ||
                      name.getStringRef() == "pcc.reduce_scatter_start" ||
                      name.getStringRef() == "pcc.all_gather_start";
    EXPECT_EQ(collective, name.hasInterface<CollectiveOpInterface>())
        << name.getStringRef().str();
  }
  EXPECT_GT(count, 50);
}

TEST(Interfaces, MatmulOptionsAndCost) {
  OwningOpRef<ModuleOp> module = parseSourceString<ModuleOp>(R"mlir(
    func.func @f(%x: tensor<2x16x64xf32>) -> tensor<2x16x256xf32> {
      %w = pcc.param "w" : tensor<64x256xf32>
      %y = pcc.matmul %x, %w : tensor<2x16x64xf32>, tensor<64x256xf32> -> tensor<2x16x256xf32>
      return %y : tensor<2x16x256xf32>
    }
  )mlir",
                                                             &context());
  ASSERT_TRUE(module);
  Operation *mm = firstOp(module, "pcc.matmul");
  auto sharding = cast<ShardingOpInterface>(mm);

  // Columns split: the result is split on its last dimension.
  SmallVector<ShardingOption> options;
  sharding.getShardingOptions({Shard::replicated(), Shard::split(1, 1)}, 4,
                              options);
  ASSERT_EQ(options.size(), 1u);
  EXPECT_EQ(options[0].operands[0], Shard::replicated());
  EXPECT_EQ(options[0].results[0], Shard::split(2, 1));
  EXPECT_EQ(sharding.getSplitRole(1, Shard::split(1, 1)), "columns (outputs)");

  // Rows (the contraction) split: partial sums, reading x split on dim 2.
  options.clear();
  sharding.getShardingOptions({Shard::replicated(), Shard::split(0, 1)}, 4,
                              options);
  ASSERT_EQ(options.size(), 1u);
  EXPECT_EQ(options[0].operands[0], Shard::split(2, 1));
  EXPECT_TRUE(options[0].results[0].isPartial());
  EXPECT_EQ(sharding.getSplitRole(1, Shard::split(0, 1)),
            "rows (contraction)");

  // Whole operands: nothing beyond running whole.
  options.clear();
  sharding.getShardingOptions({Shard::replicated(), Shard::replicated()}, 4,
                              options);
  EXPECT_TRUE(options.empty());

  auto cost = cast<CostOpInterface>(mm);
  EXPECT_EQ(cost.getFlops(), 2 * 2 * 16 * 256 * 64);
  EXPECT_EQ(cost.getBytesWritten(), 2 * 16 * 256 * 4);
  EXPECT_EQ(cast<CostOpInterface>(firstOp(module, "pcc.param"))
                .getBytesWritten(),
            0);
}

// The gradients of a convolution cost its multiply-adds, as it does.
TEST(Interfaces, ConvolutionGradientsCostTheConvolution) {
  OwningOpRef<ModuleOp> module = parseSourceString<ModuleOp>(R"mlir(
    func.func @f(%x: tensor<2x4x7x6xf32>, %w: tensor<6x2x3x2xf32>, %dy: tensor<2x6x4x5xf32>) {
      %y = pcc.conv %x, %w strides = [2, 1] pads = [1, 0, 2, 1] dilations = [1, 2] groups = 2
          : tensor<2x4x7x6xf32>, tensor<6x2x3x2xf32> -> tensor<2x6x4x5xf32>
      %dx = pcc.conv_grad_input %dy, %w strides = [2, 1] pads = [1, 0, 2, 1] dilations = [1, 2] groups = 2
          : tensor<2x6x4x5xf32>, tensor<6x2x3x2xf32> -> tensor<2x4x7x6xf32>
      %dw = pcc.conv_grad_weight %x, %dy strides = [2, 1] pads = [1, 0, 2, 1] dilations = [1, 2] groups = 2
          : tensor<2x4x7x6xf32>, tensor<2x6x4x5xf32> -> tensor<6x2x3x2xf32>
      return
    }
  )mlir",
                                                             &context());
  ASSERT_TRUE(module);
  // 240 outputs, each reading 2 channels x 3 x 2 taps.
  const int64_t flops = 2 * (2 * 6 * 4 * 5) * (2 * 3 * 2);
  for (const char *name :
       {"pcc.conv", "pcc.conv_grad_input", "pcc.conv_grad_weight"})
    EXPECT_EQ(cast<CostOpInterface>(firstOp(module, name)).getFlops(), flops)
        << name;
}

TEST(Interfaces, ElementwisePartialSums) {
  OwningOpRef<ModuleOp> module = parseSourceString<ModuleOp>(R"mlir(
    func.func @f(%a: tensor<4x8xf32>, %b: tensor<4x8xf32>) -> (tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>) {
      %s = pcc.add %a, %b : tensor<4x8xf32>
      %d = pcc.div %a, %b : tensor<4x8xf32>
      %e = pcc.exp %a : tensor<4x8xf32>
      return %s, %d, %e : tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>
    }
  )mlir",
                                                             &context());
  ASSERT_TRUE(module);
  auto optionsOf = [&](StringRef name, ArrayRef<Shard> in) {
    SmallVector<ShardingOption> options;
    cast<ShardingOpInterface>(firstOp(module, name))
        .getShardingOptions(in, 2, options);
    return options;
  };
  Shard p = Shard::partial(), r = Shard::replicated();
  // p + p stays partial, p + whole does not.
  EXPECT_EQ(optionsOf("pcc.add", {p, p}).size(), 1u);
  EXPECT_TRUE(optionsOf("pcc.add", {p, r}).empty());
  // p / whole stays partial, whole / p does not.
  EXPECT_EQ(optionsOf("pcc.div", {p, r}).size(), 1u);
  EXPECT_TRUE(optionsOf("pcc.div", {r, p}).empty());
  EXPECT_TRUE(optionsOf("pcc.exp", {p}).empty());
  // Any split is followed.
  auto split = optionsOf("pcc.exp", {Shard::split(1, 1)});
  ASSERT_EQ(split.size(), 1u);
  EXPECT_EQ(split[0].results[0], Shard::split(1, 1));
}

TEST(Layout, ReshapeSplitFollowsFlatOrder) {
  // [2, 16, 64] split on dim 2 over 4 ranks -> [2, 16, 8, 8]: heads 0-1 on
  // rank 0, so dim 2 (the heads) is split.
  auto s = reshapeSplit({2, 16, 64}, {2, 16, 8, 8}, Shard::split(2, 1), 4);
  ASSERT_TRUE(s);
  EXPECT_EQ(*s, Shard::split(2, 1));
  // Three stripes of a fused QKV [2, 16, 192] -> [2, 16, 3, 64]: each rank
  // holds a block of each of q, k, v, i.e. dim 3 split.
  s = reshapeSplit({2, 16, 192}, {2, 16, 3, 64}, Shard::split(2, 3), 2);
  ASSERT_TRUE(s);
  EXPECT_EQ(*s, Shard::split(3, 1));
  // A split that no result dimension can express.
  EXPECT_FALSE(reshapeSplit({6, 4}, {4, 6}, Shard::split(1, 1), 4));
}

TEST(Layout, FitsDividesStripesAndRanks) {
  auto t = RankedTensorType::get({12, 8}, Float32Type::get(&context()));
  EXPECT_TRUE(layoutFits(Shard::split(0, 3), t, 4));
  EXPECT_FALSE(layoutFits(Shard::split(0, 2), t, 4)); // 12 % 8
  EXPECT_FALSE(layoutFits(Shard::split(2, 1), t, 2)); // no such dim
  EXPECT_TRUE(layoutFits(Shard::partial(), t, 2));
  auto i = RankedTensorType::get({12}, IntegerType::get(&context(), 64));
  EXPECT_FALSE(layoutFits(Shard::partial(), i, 2));
}

} // namespace
