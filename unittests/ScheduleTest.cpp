//===- ScheduleTest.cpp - pipeline schedule generator ---------------------===//
//
// Every schedule is replayed by `simulate`, which fails on a dependency run
// out of order, a deadlock, missing or repeated work or an unmatched
// transfer. The bubble and in-flight figures are checked against the
// published formulas.
//
//===----------------------------------------------------------------------===//

#include "pcc/Schedule/Schedule.h"
#include "pcc/Schedule/StashSlots.h"

#include <gtest/gtest.h>

#include <algorithm>

using namespace pcc::schedule;

namespace {

Schedule make(Policy policy, int p, int m, int v = 1, bool fwdOnly = false) {
  Options o;
  o.policy = policy;
  o.stages = p;
  o.microbatches = m;
  o.chunks = v;
  o.forwardOnly = fwdOnly;
  GenerateResult g = generate(o);
  EXPECT_TRUE(g.schedule) << g.error;
  return g.schedule ? *g.schedule : Schedule{o, {}};
}

/// A rank's list from describe()'s words.
std::vector<Instr> parseList(const std::string &text) {
  std::vector<Instr> list;
  size_t from = 0;
  while (from < text.size()) {
    size_t space = std::min(text.find(' ', from), text.size());
    std::optional<Instr> i = parseInstr(text.substr(from, space - from));
    EXPECT_TRUE(i) << text.substr(from, space - from);
    if (i)
      list.push_back(*i);
    from = space + 1;
  }
  return list;
}

Simulation run(const Schedule &s, Durations d = {}) {
  SimulateResult r = simulate(s, d);
  EXPECT_TRUE(r.simulation) << r.error << "\n" << s.describe();
  return r.simulation ? *r.simulation : Simulation{};
}

// Tests that every policy, with and without backward work, gives
// dependency-correct lists over a range of shapes.
TEST(Schedule, EveryPolicyReplays) {
  for (Policy policy : {Policy::GPipe, Policy::OneFOneB, Policy::Interleaved,
                        Policy::ZeroBubbleH1})
    for (int p : {1, 2, 3, 4, 8})
      for (int m : {1, 2, 4, 8, 16})
        for (bool fwd : {false, true})
          for (int v : {1, 2, 3}) {
            if ((policy == Policy::Interleaved) != (v > 1) ||
                (policy == Policy::Interleaved && m % p != 0))
              continue;
            SCOPED_TRACE(std::string(policyName(policy)) +
                         " p=" + std::to_string(p) + " m=" + std::to_string(m) +
                         " v=" + std::to_string(v) +
                         (fwd ? " forward-only" : ""));
            Schedule s = make(policy, p, m, v, fwd);
            run(s, {1, 2, 1, 0.25});
            // What the runtime issues as NCCL groups does not deadlock.
            EXPECT_EQ(checkGroupedTransfers(s), "") << s.describe();
          }
}

// Tests GPipe and 1F1B against (p - 1) / (m + p - 1) on every rank, with
// the backward twice the forward.
TEST(Schedule, OneFOneBAndGPipeBubble) {
  for (Policy policy : {Policy::GPipe, Policy::OneFOneB})
    for (int p : {2, 4, 8})
      for (int m : {1, 4, 8, 16}) {
        Schedule s = make(policy, p, m);
        Simulation sim = run(s, {1, 2, 0, 0});
        double want = analyticBubbleFraction(s.options);
        for (int r = 0; r < p; ++r)
          EXPECT_NEAR(sim.bubbleFraction[r], want, 1e-9)
              << policyName(policy) << " p=" << p << " m=" << m << " rank "
              << r;
        EXPECT_DOUBLE_EQ(sim.makespan, 3.0 * (m + p - 1));
      }
}

// Tests the forward-only form (inference): GPipe's bubble with the
// forward alone.
TEST(Schedule, ForwardOnlyBubble) {
  for (int p : {2, 4})
    for (int m : {4, 8, 16}) {
      Schedule s = make(Policy::GPipe, p, m, 1, /*fwdOnly=*/true);
      for (const auto &rank : s.ranks)
        for (const Instr &i : rank)
          EXPECT_TRUE(i.op == Op::Forward || i.op == Op::SendForward ||
                      i.op == Op::RecvForward);
      Simulation sim = run(s);
      EXPECT_NEAR(sim.meanBubbleFraction(), double(p - 1) / double(m + p - 1),
                  1e-9);
    }
}

// Tests that interleaving v chunks divides the bubble by about v:
// (p - 1) / (v m + p - 1) with each chunk doing 1/v of the work.
TEST(Schedule, InterleavedBubble) {
  for (int p : {2, 4})
    for (int m : {4, 8, 16})
      for (int v : {2, 4}) {
        if (m % p)
          continue;
        Schedule s = make(Policy::Interleaved, p, m, v);
        Simulation sim = run(s, {1.0 / v, 2.0 / v, 0, 0});
        double want = analyticBubbleFraction(s.options);
        double oneF = double(p - 1) / double(m + p - 1);
        EXPECT_LT(want, oneF);
        EXPECT_NEAR(sim.meanBubbleFraction(), want, 0.02)
            << "p=" << p << " m=" << m << " v=" << v;
      }
}

// Tests that ZB-H1 leaves about a third of 1F1B's idle time, (p - 1)(F +
// B - W) against (p - 1)(F + B + W) with F, B and W equally long, half of
// pcc's 1F1B's (p - 1)(F + B), and keeps its peak of p micro-batches in
// flight.
TEST(Schedule, ZeroBubbleH1) {
  for (int p : {2, 4, 8})
    for (int m : {8, 16, 32}) {
      Simulation zb = run(make(Policy::ZeroBubbleH1, p, m));
      // 1F1B's backward as one piece (B and W together, as it runs them).
      Simulation ofob = run(make(Policy::OneFOneB, p, m), {1, 2, 0, 0});
      double idleZb = zb.makespan - 3.0 * m, idle1f = ofob.makespan - 3.0 * m;
      EXPECT_DOUBLE_EQ(idle1f, 3.0 * (p - 1));
      EXPECT_LE(idleZb, idle1f / 3 + 1e-9) << "p=" << p << " m=" << m;
      // pcc's 1F1B, whose B sends before its W runs: the previous stage
      // waits F + B, not F + B + W, and ZB-H1 halves that.
      Simulation split = run(make(Policy::OneFOneB, p, m));
      double idleSplit = split.makespan - 3.0 * m;
      EXPECT_DOUBLE_EQ(idleSplit, 2.0 * (p - 1));
      EXPECT_LE(idleZb, idleSplit / 2 + 1e-9) << "p=" << p << " m=" << m;
      EXPECT_GT(idleZb, 0);
      EXPECT_EQ(zb.peakInFlight[0], std::min(p, m));
      // No synchronous step can idle less: the last rank's first F waits
      // for p - 1 forwards before it, and then the rank has 3 m units of
      // work. ZB-H1 attains that bound (with m >= p).
      EXPECT_DOUBLE_EQ(idleZb, p - 1.0) << "p=" << p << " m=" << m;
    }
}

// Tests that per-stage durations replace the scalar ones: forward-only
// GPipe with stage 1 twice as slow takes one F of stage 0, then m of stage
// 1, and stage 0 idles the difference.
TEST(Schedule, PerStageDurations) {
  for (int m : {1, 4, 8}) {
    Durations d;
    d.forwardOf = {1, 2};
    Simulation sim = run(make(Policy::GPipe, 2, m, 1, /*fwdOnly=*/true), d);
    EXPECT_DOUBLE_EQ(sim.makespan, 1 + 2.0 * m);
    EXPECT_DOUBLE_EQ(sim.bubbleFraction[0], 1 - m / (1 + 2.0 * m));
    EXPECT_DOUBLE_EQ(sim.bubbleFraction[1], 1 / (1 + 2.0 * m));
  }
  // A stage without an entry keeps the scalar duration.
  Durations d;
  d.forward = 3;
  d.backwardOf = {0.5};
  Simulation sim = run(make(Policy::OneFOneB, 2, 1), d);
  // F on stage 0 (3), F and B on stage 1 (3 + 1), B on stage 0 (0.5), W (1).
  EXPECT_DOUBLE_EQ(sim.makespan, 3 + 4 + 0.5 + 1);
}

// Tests the in-flight peaks: p for 1F1B (first rank), m for GPipe.
TEST(Schedule, PeakInFlight) {
  for (int p : {2, 4})
    for (int m : {1, 4, 8}) {
      Simulation g = run(make(Policy::GPipe, p, m));
      Simulation f = run(make(Policy::OneFOneB, p, m));
      EXPECT_EQ(g.peakInFlight[0], m);
      EXPECT_EQ(f.peakInFlight[0], std::min(p, m));
      for (int r = 0; r < p; ++r)
        EXPECT_EQ(f.peakInFlight[r], std::min(p - r, m)) << "rank " << r;
    }
}

// Tests the exact lists of a small 1F1B schedule.
TEST(Schedule, Describe) {
  Schedule s = make(Policy::OneFOneB, 2, 3);
  EXPECT_EQ(s.describe(),
            "rank 0: F0 send_fwd0>1 F1 send_fwd1>1 recv_bwd0<1 B0 W0 F2 "
            "send_fwd2>1 recv_bwd1<1 B1 W1 recv_bwd2<1 B2 W2\n"
            "rank 1: recv_fwd0<0 F0 B0 send_bwd0>0 W0 recv_fwd1<0 F1 B1 "
            "send_bwd1>0 W1 recv_fwd2<0 F2 B2 send_bwd2>0 W2\n");
  Schedule i = make(Policy::Interleaved, 2, 2, 2, /*fwdOnly=*/true);
  EXPECT_EQ(i.describe(), "rank 0: F0.0 send_fwd0.0>1 F1.0 send_fwd1.0>1 "
                          "recv_fwd0.1<1 F0.1 send_fwd0.1>1 recv_fwd1.1<1 "
                          "F1.1 send_fwd1.1>1\n"
                          "rank 1: recv_fwd0.0<0 F0.0 send_fwd0.0>0 "
                          "recv_fwd1.0<0 F1.0 send_fwd1.0>0 recv_fwd0.1<0 "
                          "F0.1 recv_fwd1.1<0 F1.1\n");
  // Interleaved training exchanges between units as Megatron-LM does:
  // rank 0 receives B0.1's gradient before F2.0 (a compute early), and
  // sends F2.0's activations with B0.1's gradient; W0.1 runs after that
  // group.
  Schedule t = make(Policy::Interleaved, 2, 4, 2);
  EXPECT_NE(t.describeRank(0).find(
                "recv_bwd0.1<1 F2.0 B0.1 send_fwd2.0>1 send_bwd0.1>1 "
                "recv_bwd1.1<1 W0.1 F3.0 B1.1 send_fwd3.0>1 send_bwd1.1>1 "
                "recv_fwd2.1<1 recv_bwd0.0<1 W1.1 F2.1 B0.0"),
            std::string::npos)
      << t.describeRank(0);
}

// Tests that parseInstr reads back every instruction describe() writes, and
// rejects text that is not one.
TEST(Schedule, ParseInstr) {
  for (Policy policy :
       {Policy::GPipe, Policy::Interleaved, Policy::ZeroBubbleH1})
    for (bool fwd : {false, true}) {
      Schedule s =
          make(policy, 4, 8, policy == Policy::Interleaved ? 2 : 1, fwd);
      std::string text = s.describe();
      size_t rank = 0, start = 0;
      while (start < text.size()) {
        size_t end = text.find('\n', start);
        std::string line = text.substr(start, end - start);
        start = end + 1;
        line = line.substr(line.find(": ") + 2);
        size_t i = 0, from = 0;
        while (from <= line.size()) {
          size_t space = std::min(line.find(' ', from), line.size());
          std::optional<Instr> parsed =
              parseInstr(line.substr(from, space - from));
          ASSERT_TRUE(parsed) << line.substr(from, space - from);
          EXPECT_EQ(*parsed, s.ranks[rank][i++]);
          from = space + 1;
        }
        EXPECT_EQ(i, s.ranks[rank].size());
        ++rank;
      }
    }
  for (const char *bad : {"", "F", "Fx", "F1>2", "send_fwd1", "send_fwd1<2",
                          "recv_fwd1>2", "F1.", "X1", "F1 "})
    EXPECT_FALSE(parseInstr(bad)) << bad;
}

// Tests that without backward work the policies with one chunk agree: a
// forward-only rank runs its micro-batches in order whatever the policy, so
// inference libraries differ only in the policy's name.
TEST(Schedule, ForwardOnlyPoliciesAgree) {
  for (int p : {2, 4})
    for (int m : {1, 4, 8}) {
      std::string gpipe = make(Policy::GPipe, p, m, 1, true).describe();
      EXPECT_EQ(make(Policy::OneFOneB, p, m, 1, true).describe(), gpipe);
      EXPECT_EQ(make(Policy::ZeroBubbleH1, p, m, 1, true).describe(), gpipe);
    }
}

// Tests the generator's errors.
TEST(Schedule, GenerateErrors) {
  Options o;
  o.policy = Policy::Interleaved;
  o.stages = 4;
  o.microbatches = 6;
  o.chunks = 2;
  EXPECT_EQ(generate(o).error,
            "the interleaved schedule runs micro-batches in groups of the 4 "
            "pipeline ranks; 6 micro-batches is not a multiple "
            "(--microbatches=4, 8, ... would; or another schedule)");
  o.policy = Policy::OneFOneB;
  EXPECT_EQ(generate(o).error,
            "only the interleaved schedule runs several chunks per rank "
            "(1f1b with 2)");
  o.chunks = 1;
  o.microbatches = 0;
  EXPECT_EQ(generate(o).error,
            "a pipeline needs at least 1 micro-batch, not 0");
  EXPECT_EQ(parsePolicy("zb-h1"), Policy::ZeroBubbleH1);
  EXPECT_FALSE(parsePolicy("pipedream"));
}

// Tests that the replay rejects broken lists: work before its input, a
// cycle of receives, and work run twice.
TEST(Schedule, SimulateRejectsBrokenLists) {
  Schedule s = make(Policy::GPipe, 2, 2, 1, /*fwdOnly=*/true);
  Schedule early = s;
  std::swap(early.ranks[1][0], early.ranks[1][1]); // F0 before recv_fwd0
  EXPECT_EQ(simulate(early).error,
            "rank 1 runs F0 before recv_fwd0 of virtual stage 1, which it "
            "needs");

  // Rank 0 runs B0 before F1, whose output rank 1 wants before its B0.
  Schedule cycle = make(Policy::OneFOneB, 2, 2);
  cycle.ranks = {parseList("F0 send_fwd0>1 recv_bwd0<1 B0 W0 F1 send_fwd1>1 "
                           "recv_bwd1<1 B1 W1"),
                 parseList("recv_fwd0<0 F0 recv_fwd1<0 F1 B0 send_bwd0>0 W0 "
                           "B1 send_bwd1>0 W1")};
  EXPECT_EQ(simulate(cycle).error, "deadlock: rank 0 waits at B0; rank 1 "
                                   "waits at F1");
  // A receive is posted, not waited in: posting the gradient's receive
  // first is no deadlock.
  Schedule posted = make(Policy::OneFOneB, 2, 2);
  auto &r0 = posted.ranks[0];
  auto recv = std::find_if(r0.begin(), r0.end(), [](const Instr &i) {
    return i.op == Op::RecvBackward;
  });
  std::rotate(r0.begin(), recv, recv + 1);
  EXPECT_TRUE(simulate(posted).simulation) << simulate(posted).error;

  // Both receives are posted before either compute: the replay can run
  // it, but the transports pair messages between two ranks in order.
  Schedule crossed = s;
  auto &r1 = crossed.ranks[1]; // recv_fwd0<0 F0 recv_fwd1<0 F1
  std::rotate(r1.begin(), r1.begin() + 2, r1.begin() + 3);
  EXPECT_EQ(simulate(crossed).error,
            "message 0 from rank 0 to rank 1 is send_fwd of micro-batch 0 to "
            "virtual stage 1, but rank 1 receives send_fwd of micro-batch 1 "
            "to virtual stage 1 there (messages between two ranks pair up in "
            "order)");

  // Interleaved training lists with each receive just before the compute
  // that reads it deadlock as NCCL groups: each rank's backward send waits
  // for a receive the other rank posts only after its next compute.
  Schedule late = make(Policy::Interleaved, 2, 2, 2);
  for (std::vector<Instr> &list : late.ranks) {
    std::vector<Instr> out;
    for (const Instr &i : list) {
      if (i.op == Op::RecvForward || i.op == Op::RecvBackward)
        continue;
      if (i.op == Op::Forward || i.op == Op::Backward) {
        Op recv = i.op == Op::Forward ? Op::RecvForward : Op::RecvBackward;
        for (const Instr &j : list)
          if (j.op == recv && j.microbatch == i.microbatch &&
              j.chunk == i.chunk)
            out.push_back(j);
      }
      out.push_back(i);
    }
    list = out;
  }
  EXPECT_TRUE(simulate(late).simulation) << simulate(late).error;
  EXPECT_EQ(checkGroupedTransfers(late),
            "deadlock with the transfers between two computes grouped (as "
            "NCCL runs them): rank 0 waits in {send_bwd0.1>1}; rank 1 waits "
            "in {send_bwd1.1>0}");

  Schedule twice = s;
  twice.ranks[0].push_back(twice.ranks[0][0]);
  EXPECT_EQ(simulate(twice).error,
            "F of micro-batch 0 on virtual stage 0 runs 2 times, not once");
}

/// Rank r's compute instructions as the slot walk reads them.
std::vector<SlotStep> slotSteps(const Schedule &s, size_t r) {
  std::vector<SlotStep> steps;
  for (const Instr &i : s.ranks[r])
    if (i.op == Op::Forward || i.op == Op::Backward || i.op == Op::WeightGrad)
      steps.push_back({i.chunk, i.microbatch, i.op == Op::Backward,
                       i.op == Op::WeightGrad});
  return steps;
}

// The runtime allocates and the memory model predicts the stash slots with
// one walk: GPipe keeps every micro-batch in flight on rank 0, 1F1B at most
// p - r, and the slots are reused once a W frees them.
TEST(StashSlots, InFlightMicrobatchesPerPolicy) {
  Schedule gpipe = make(Policy::GPipe, 2, 4);
  StashSlots g = assignStashSlots(slotSteps(gpipe, 0), 1, 4);
  EXPECT_TRUE(g.error.empty()) << g.error;
  EXPECT_EQ(g.slotCount, std::vector<int32_t>{4});
  Schedule ofob = make(Policy::OneFOneB, 4, 8);
  for (size_t r = 0; r < 4; ++r) {
    StashSlots s = assignStashSlots(slotSteps(ofob, r), 1, 8);
    EXPECT_TRUE(s.error.empty()) << s.error;
    EXPECT_EQ(s.slotCount[0], static_cast<int32_t>(4 - r)) << "rank " << r;
    // GPipe and 1F1B run W right after B: one set of B's values.
    EXPECT_EQ(s.stashCount[0], 1);
    for (int32_t mb = 0; mb < 8; ++mb)
      EXPECT_LT(s.slotOf[0][static_cast<size_t>(mb)], s.slotCount[0]);
  }
  // ZB-H1 defers some W past later B: more sets of B's values than 1F1B
  // on some rank; a micro-batch keeps its slot until its W, so every rank
  // holds up to p of them (1F1B's rank 0).
  Schedule zb = make(Policy::ZeroBubbleH1, 4, 8);
  int32_t mostSets = 0;
  for (size_t r = 0; r < 4; ++r) {
    StashSlots z = assignStashSlots(slotSteps(zb, r), 1, 8);
    EXPECT_TRUE(z.error.empty()) << z.error;
    EXPECT_LE(z.slotCount[0], 4) << "rank " << r;
    mostSets = std::max(mostSets, z.stashCount[0]);
  }
  EXPECT_GT(mostSets, 1);
}

TEST(StashSlots, RejectsListsOutOfOrder) {
  EXPECT_EQ(assignStashSlots({{0, 0, false, true}}, 1, 1).error,
            "runs W of micro-batch 0 before its B");
  EXPECT_EQ(assignStashSlots({{0, 0, false, false},
                              {0, 0, true, false},
                              {0, 0, false, true},
                              {0, 0, false, false}},
                             1, 1)
                .error,
            "uses micro-batch 0 after its weight gradients");
}

} // namespace
