//===- AnalysisTest.cpp - the cut search and the cost model ---------------===//
//
// lib/Analysis on numbers: the pipeline cut's candidates and its dynamic
// programme on synthetic profiles whose best cuts are known, and the cost
// model's prices of ops parsed from IR.
//
//===----------------------------------------------------------------------===//

#include "Interpreter.h"

#include "pcc/Analysis/Arena.h"
#include "pcc/Analysis/CostModel.h"
#include "pcc/Analysis/CutSearch.h"
#include "pcc/Analysis/Machine.h"
#include "pcc/Analysis/PipelineStages.h"
#include "pcc/Dialect/Pcc/IR/Contracts.h"
#include "pcc/runtime/ModelAbi.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/Parser/Parser.h"

#include <algorithm>
#include <cmath>
#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <tuple>

using namespace mlir;
using namespace mlir::pcc;

namespace {

/// A profile of ops with these seconds and FLOPs, and `crossing` bytes
/// live across each position (n + 1 entries).
CutProfile profile(const std::vector<double> &seconds,
                   const std::vector<int64_t> &flops,
                   const std::vector<int64_t> &crossing) {
  CutProfile p;
  p.seconds.assign(1, 0);
  p.flops.assign(1, 0);
  for (size_t i = 0; i < seconds.size(); ++i) {
    p.seconds.push_back(p.seconds.back() + seconds[i]);
    p.flops.push_back(p.flops.back() + flops[i]);
  }
  p.crossing = crossing;
  return p;
}

CutProfile uniform(size_t n, int64_t bytes) {
  return profile(std::vector<double>(n, 1.0), std::vector<int64_t>(n, 1),
                 std::vector<int64_t>(n + 1, bytes));
}

TEST(CutSearch, UniformLayersSplitEvenly) {
  CutProfile p = uniform(8, 100);
  std::vector<size_t> candidates = candidateCuts(p);
  EXPECT_EQ(candidates, (std::vector<size_t>{1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(balanceStages(p, candidates, 2), (std::vector<size_t>{4}));
  EXPECT_EQ(balanceStages(p, candidates, 4), (std::vector<size_t>{2, 4, 6}));
  EXPECT_EQ(balanceStages(p, candidates, 8),
            (std::vector<size_t>{1, 2, 3, 4, 5, 6, 7}));
}

TEST(CutSearch, CutsOnlyAtTheNarrowestPoints) {
  // Six equal ops; activations are narrow only after ops 2 and 4.
  CutProfile p =
      profile(std::vector<double>(6, 1.0), std::vector<int64_t>(6, 1),
              {0, 900, 50, 900, 50, 900, 0});
  std::vector<size_t> candidates = candidateCuts(p);
  EXPECT_EQ(candidates, (std::vector<size_t>{2, 4}));
  // Two stages: after op 2 leaves 4 s behind, after op 4 leaves 4 s ahead;
  // equal slowest stages and bytes: the later cut.
  EXPECT_EQ(balanceStages(p, candidates, 2), (std::vector<size_t>{4}));
  EXPECT_EQ(balanceStages(p, candidates, 3), (std::vector<size_t>{2, 4}));
}

TEST(CutSearch, SlowestStageFirstThenBytes) {
  // Ops of 1, 3, 1, 1, 3, 1 seconds: the best two-stage cut is after op 3
  // (5 s and 5 s), though after op 2 crosses fewer bytes.
  CutProfile p = profile({1, 3, 1, 1, 3, 1}, std::vector<int64_t>(6, 1),
                         {0, 10, 5, 10, 10, 10, 0});
  std::vector<size_t> candidates = candidateCuts(p);
  // Narrowest point between layers: 5 bytes, after op 2 alone.
  EXPECT_EQ(candidates, (std::vector<size_t>{2}));
  p.crossing = {0, 10, 10, 10, 10, 10, 0};
  candidates = candidateCuts(p);
  EXPECT_EQ(balanceStages(p, candidates, 2), (std::vector<size_t>{3}));
  // Between two equally slow cuts the one crossing fewer bytes wins.
  CutProfile q = profile({2, 1, 2}, {1, 1, 1}, {0, 7, 7, 0});
  EXPECT_EQ(balanceStages(q, candidateCuts(q), 2), (std::vector<size_t>{2}));
  q.crossing = {0, 3, 7, 0};
  EXPECT_EQ(balanceStages(q, {1, 2}, 2), (std::vector<size_t>{1}));
}

TEST(CutSearch, PrologueDoesNotSetTheNarrowestPoint) {
  // A thin spot before the first layer (an embedding, no FLOPs) must not
  // rule out the cuts between layers, where more bytes are live.
  CutProfile p =
      profile({1, 1, 1, 1, 1}, {0, 0, 5, 5, 5}, {0, 10, 40, 40, 40, 0});
  std::vector<size_t> candidates = candidateCuts(p);
  EXPECT_EQ(candidates, (std::vector<size_t>{1, 2, 3, 4}));
  EXPECT_EQ(balanceStages(p, candidates, 2), (std::vector<size_t>{3}));
}

TEST(CutSearch, RanksBalanceChunks) {
  // Eight unit stages on two ranks with two chunks each: stages 0 and 2 on
  // rank 0, 1 and 3 on rank 1.
  CutProfile p = uniform(8, 1);
  EXPECT_EQ(rankSeconds(p, {2, 4, 6}, 2), (std::vector<double>{4, 4}));
  // Ops of 3, 1, 1, ... seconds: the stage-balanced cuts (after ops 1, 4
  // and 7: stages of 3, 3, 3 and 1 s) leave rank 0 with 6 s and rank 1
  // with 4; moving the middle cut one op later evens them at 5 and 5.
  CutProfile q = profile({3, 1, 1, 1, 1, 1, 1, 1}, std::vector<int64_t>(8, 1),
                         std::vector<int64_t>(9, 1));
  std::vector<size_t> candidates = candidateCuts(q);
  std::vector<size_t> cuts = balanceStages(q, candidates, 4);
  EXPECT_EQ(cuts, (std::vector<size_t>{1, 4, 7}));
  EXPECT_EQ(rankSeconds(q, cuts, 2), (std::vector<double>{6, 4}));
  balanceRanks(q, candidates, cuts, 2);
  EXPECT_EQ(cuts, (std::vector<size_t>{1, 5, 7}));
  EXPECT_EQ(rankSeconds(q, cuts, 2), (std::vector<double>{5, 5}));
  // The moves are single steps, so the search can stop short: on 4, 1, 1,
  // 4, 1, 1, 1, 1 it keeps 8 s and 6 s, though cuts after ops 1, 4 and 7
  // give 7 and 7 (two moves away). Pinned here so that a better search
  // shows up as a change.
  CutProfile r = profile({4, 1, 1, 4, 1, 1, 1, 1}, std::vector<int64_t>(8, 1),
                         std::vector<int64_t>(9, 1));
  candidates = candidateCuts(r);
  cuts = balanceStages(r, candidates, 4);
  balanceRanks(r, candidates, cuts, 2);
  EXPECT_EQ(rankSeconds(r, cuts, 2), (std::vector<double>{8, 6}));
  EXPECT_EQ(rankSeconds(r, {1, 4, 7}, 2), (std::vector<double>{7, 7}));
}

TEST(CostModel, PricesMatmulsByFlopsAndTheRestByBytes) {
  MLIRContext *context = &::pcc::testing::testContext();
  OwningOpRef<ModuleOp> module = parseSourceString<ModuleOp>(R"mlir(
    func.func @main(%a: tensor<64x128xf32>, %b: tensor<128x32xf32>) -> tensor<64x32xf32> {
      %c = pcc.matmul %a, %b : tensor<64x128xf32>, tensor<128x32xf32> -> tensor<64x32xf32>
      %d = pcc.add %c, %c : tensor<64x32xf32>
      return %d : tensor<64x32xf32>
    })mlir",
                                                             context);
  ASSERT_TRUE(module);
  auto main = cast<func::FuncOp>(module->lookupSymbol("main"));
  Operation *matmul = &main.getBody().front().front();
  Operation *add = matmul->getNextNode();
  EXPECT_EQ(opFlops(matmul), 2 * 64 * 128 * 32);
  EXPECT_EQ(opFlops(add), 0);
  EXPECT_EQ(tensorBytes(add->getResult(0)), 64 * 32 * 4);
  CostModel cpu = CostModel::cpuCore();
  EXPECT_DOUBLE_EQ(cpu.opSeconds(matmul), 2.0 * 64 * 128 * 32 / 50e9);
  EXPECT_DOUBLE_EQ(cpu.opSeconds(add), 64.0 * 32 * 4 / 50e9);
  // A ring all-reduce moves 2 (n - 1) / n of the bytes, after a latency.
  EXPECT_DOUBLE_EQ(cpu.collectiveSeconds(CollectiveKind::AllReduce, 1 << 20, 4),
                   5e-6 + 2.0 * 3 / 4 * (1 << 20) / 5e9);
  EXPECT_DOUBLE_EQ(cpu.collectiveSeconds(CollectiveKind::AllGather, 1 << 20, 2),
                   5e-6 + 0.5 * (1 << 20) / 5e9);
}

/// The names of `funcs`.
std::vector<std::string> names(ArrayRef<func::FuncOp> funcs) {
  std::vector<std::string> out;
  for (func::FuncOp f : funcs)
    out.push_back(f ? f.getSymName().str() : "(none)");
  return out;
}

TEST(Machine, AttentionRatesByNearestWidthAndLength) {
  Machine m = *Machine::preset("cpu");
  EXPECT_EQ(m.attentionFlops(false, false, 64, 256), 0) << "no table: 0";
  m.attention = {{16, 64, 10e9, 0, 20e9, 0},
                 {16, 256, 40e9, 0, 80e9, 0},
                 {64, 64, 100e9, 200e9, 100e9, 200e9}};
  // Width 16's row, interpolated in log-log between 64 and 256 keys.
  EXPECT_DOUBLE_EQ(m.attentionFlops(false, false, 16, 64), 10e9);
  EXPECT_NEAR(m.attentionFlops(false, false, 16, 128), 20e9, 1e3);
  EXPECT_NEAR(m.attentionFlops(false, true, 16, 128), 40e9, 1e3);
  // Beyond the ends: the end's; a width of 24 is nearer 16 than 64.
  EXPECT_DOUBLE_EQ(m.attentionFlops(false, false, 24, 4096), 40e9);
  EXPECT_DOUBLE_EQ(m.attentionFlops(false, false, 128, 16), 100e9);
  // No bf16 rate at width 16: 0, the caller prices it as a product.
  EXPECT_EQ(m.attentionFlops(true, false, 16, 64), 0);
  EXPECT_DOUBLE_EQ(m.attentionFlops(true, true, 64, 64), 200e9);
  // The table survives the JSON round trip.
  std::string error;
  std::string path = ::testing::TempDir() + "attention-machine.json";
  {
    std::FILE *f = std::fopen(path.c_str(), "w");
    ASSERT_TRUE(f);
    std::string json = m.toJson();
    std::fwrite(json.data(), 1, json.size(), f);
    std::fclose(f);
  }
  std::optional<Machine> back = Machine::load(path, error);
  ASSERT_TRUE(back) << error;
  EXPECT_NEAR(back->attentionFlops(false, false, 16, 128), 20e9, 1e3);
  std::remove(path.c_str());
}

TEST(Machine, LatencyByGroupSize) {
  std::optional<Machine> cpu = Machine::preset("cpu");
  ASSERT_TRUE(cpu);
  Machine m = *cpu;
  m.intraLatency = 50e-6;
  EXPECT_DOUBLE_EQ(m.intraLatencyFor(2), 50e-6) << "no table: intraLatency";
  m.intraLatencies = {{2, 10e-6}, {4, 20e-6}, {8, 50e-6}};
  EXPECT_DOUBLE_EQ(m.intraLatencyFor(2), 10e-6);
  EXPECT_DOUBLE_EQ(m.intraLatencyFor(8), 50e-6);
  // Between the sizes around it, in log2 of the ranks; the end's beyond.
  EXPECT_NEAR(m.intraLatencyFor(6), 20e-6 + std::log2(1.5) * 30e-6, 1e-12);
  EXPECT_DOUBLE_EQ(m.intraLatencyFor(64), 50e-6);
  EXPECT_DOUBLE_EQ(m.intraLatencyFor(1), 50e-6);
  // The table survives the JSON round trip; a bad entry is an error.
  std::string error;
  std::string path = ::testing::TempDir() + "latency-machine.json";
  auto write = [&](const std::string &json) {
    std::FILE *f = std::fopen(path.c_str(), "w");
    ASSERT_TRUE(f);
    std::fwrite(json.data(), 1, json.size(), f);
    std::fclose(f);
  };
  write(m.toJson());
  std::optional<Machine> back = Machine::load(path, error);
  ASSERT_TRUE(back) << error;
  EXPECT_DOUBLE_EQ(back->intraLatencyFor(4), 20e-6);
  write(
      R"({"base": "cpu", "intra_latencies": [{"ranks": 1, "seconds": 1e-5}]})");
  EXPECT_FALSE(Machine::load(path, error));
  EXPECT_NE(error.find("intra_latencies"), std::string::npos) << error;
  std::remove(path.c_str());
}

TEST(TrainingStep, AWholeStepIsOneStage) {
  MLIRContext *context = &::pcc::testing::testContext();
  OwningOpRef<ModuleOp> module = parseSourceString<ModuleOp>(R"mlir(
    func.func @train_zero_grad() attributes {pcc.phase = "zero_grad"} { return }
    func.func @train_forward() attributes {pcc.phase = "forward"} { return }
    func.func @train_optimizer() attributes {pcc.phase = "optimizer"} { return }
    func.func @train_backward() attributes {pcc.phase = "backward"} { return }
  )mlir",
                                                             context);
  ASSERT_TRUE(module);
  FailureOr<TrainingStep> step = getTrainingStep(*module, "test");
  ASSERT_TRUE(succeeded(step));
  EXPECT_FALSE(step->pipelined);
  ASSERT_EQ(step->stages.size(), 1u);
  EXPECT_EQ(names(step->stages[0]),
            (std::vector<std::string>{"train_forward", "train_backward"}));
  EXPECT_EQ(names(step->stepPhases),
            (std::vector<std::string>{"train_optimizer", "train_zero_grad"}));
}

TEST(TrainingStep, APipelinedStepHasEachStagesPhasesInOrder) {
  MLIRContext *context = &::pcc::testing::testContext();
  OwningOpRef<ModuleOp> module = parseSourceString<ModuleOp>(R"mlir(
    func.func @stage1_weight_grad() attributes {pcc.phase = "weight_grad", pcc.pipeline_stage = 1 : i64} { return }
    func.func @stage0_forward() attributes {pcc.phase = "forward", pcc.pipeline_stage = 0 : i64} { return }
    func.func @stage1_forward() attributes {pcc.phase = "forward", pcc.pipeline_stage = 1 : i64} { return }
    func.func @stage0_backward() attributes {pcc.phase = "backward", pcc.pipeline_stage = 0 : i64} { return }
    func.func @stage0_weight_grad() attributes {pcc.phase = "weight_grad", pcc.pipeline_stage = 0 : i64} { return }
    func.func @stage1_backward() attributes {pcc.phase = "backward", pcc.pipeline_stage = 1 : i64} { return }
  )mlir",
                                                             context);
  ASSERT_TRUE(module);
  FailureOr<TrainingStep> step = getTrainingStep(*module, "test");
  ASSERT_TRUE(succeeded(step));
  EXPECT_TRUE(step->pipelined);
  ASSERT_EQ(step->stages.size(), 2u);
  EXPECT_EQ(names(step->stages[1]),
            (std::vector<std::string>{"stage1_forward", "stage1_backward",
                                      "stage1_weight_grad"}));
  EXPECT_TRUE(step->stepPhases.empty());
  // A stage without its W phase is named.
  module->lookupSymbol<func::FuncOp>("stage1_weight_grad").erase();
  std::string error;
  ScopedDiagnosticHandler handler(context, [&](Diagnostic &d) {
    error = d.str();
    return success();
  });
  EXPECT_TRUE(failed(getTrainingStep(*module, "test")));
  EXPECT_EQ(error, "test: pipeline stage 1 lacks its forward, backward or "
                   "weight-gradient phase");
}

/// Program-order best fit over `in` (as pcc-plan-memory lays out first):
/// the arena's size.
int64_t inOrderPeak(const std::vector<ArenaInterval> &in, int64_t alignment) {
  BestFitArena arena(alignment);
  // (dies, offset, bytes) of the buffers alive.
  std::vector<std::tuple<int64_t, int64_t, int64_t>> placed;
  for (const ArenaInterval &b : in) {
    for (auto it = placed.begin(); it != placed.end();)
      if (std::get<0>(*it) < b.first) {
        arena.release(std::get<1>(*it), std::get<2>(*it));
        it = placed.erase(it);
      } else {
        ++it;
      }
    placed.emplace_back(b.last, arena.allocate(b.bytes), b.bytes);
  }
  return arena.getPeak();
}

TEST(Arena, BySizeNeverOverlapsBuffersAliveTogether) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<ArenaInterval> in;
    int n = 1 + static_cast<int>(rng() % 40);
    for (int i = 0; i < n; ++i) {
      int64_t first = static_cast<int64_t>(rng() % 50);
      in.push_back({first, first + static_cast<int64_t>(rng() % 20),
                    1 + static_cast<int64_t>(rng() % 5000)});
    }
    int64_t peak = 0;
    std::vector<int64_t> offsets = layOutBySize(in, 64, peak);
    int64_t mostAlive = 0;
    for (size_t i = 0; i < in.size(); ++i) {
      EXPECT_EQ(offsets[i] % 64, 0);
      EXPECT_LE(offsets[i] + in[i].bytes, peak);
      int64_t alive = 0;
      for (size_t j = 0; j < in.size(); ++j) {
        bool together = in[i].first <= in[j].last && in[j].first <= in[i].last;
        if (in[j].first <= in[i].first && in[i].first <= in[j].last)
          alive += (in[j].bytes + 63) / 64 * 64;
        if (i == j || !together)
          continue;
        bool apart = offsets[i] + in[i].bytes <= offsets[j] ||
                     offsets[j] + in[j].bytes <= offsets[i];
        EXPECT_TRUE(apart) << "trial " << trial << ": buffers " << i << " and "
                           << j << " overlap";
      }
      mostAlive = std::max(mostAlive, alive);
    }
    // Never below what is alive at once (at some buffer's start).
    EXPECT_GE(peak, mostAlive);
  }
}

TEST(Arena, BySizeFillsTheHolesProgramOrderLeaves) {
  // Two small buffers freed apart leave two holes between long-lived
  // ones; a larger one made after them fits neither in program order and
  // grows the arena. Largest first, it goes at the bottom and the small
  // ones around it: the arena is what is alive at once.
  std::vector<ArenaInterval> in = {
      {0, 1, 1024}, {0, 5, 1024}, {0, 1, 1024}, {0, 5, 1024}, {2, 5, 2048}};
  int64_t peak = 0;
  layOutBySize(in, 64, peak);
  EXPECT_EQ(inOrderPeak(in, 64), 6144);
  EXPECT_EQ(peak, 4096);
}

TEST(Contracts, MeshAxisNamesMatchTheAbi) {
  // The compiler names the axes in the mesh table the runtime reads.
  EXPECT_EQ(kDataParallelAxis, PCC_MESH_AXIS_DP);
  EXPECT_EQ(kPipelineAxis, PCC_MESH_AXIS_PP);
  EXPECT_EQ(kTensorParallelAxis, PCC_MESH_AXIS_TP);
}

} // namespace
