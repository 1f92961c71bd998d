//===- AutoPlan.cpp - the automatic plan search ---------------------------===//
//
// Probes, then numbers (see AutoPlan.h and docs/design-notes.md): a probe
// is the real compile of the training step on one row per micro-batch at
// one tensor-parallel degree, precision and recompute policy; every plan
// with that triple is priced from it without compiling.
//
//===----------------------------------------------------------------------===//

#include "pcc/Pipelines/AutoPlan.h"

#include "PlanProbe.h"

#include "pcc/Analysis/CostModel.h"
#include "pcc/Analysis/CutSearch.h"
#include "pcc/Analysis/MemoryModel.h"
#include "pcc/Dialect/Pcc/IR/Contracts.h"
#include "pcc/Dialect/Pcc/IR/PccDialect.h"
#include "pcc/Dialect/Pcc/IR/PccInterfaces.h"
#include "pcc/Schedule/Schedule.h"
#include "pcc/Schedule/StashSlots.h"
#include "pcc/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/Pass/PassManager.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/FormatVariadic.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <limits>
#include <map>
#include <mutex>
#include <numeric>
#include <thread>
#include <tuple>

using namespace mlir;
using namespace mlir::pcc;
namespace sched = ::pcc::schedule;
using namespace mlir::pcc::autoplan;

namespace {

using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

/// Bytes in MiB below a GiB, else in GiB.
std::string gib(int64_t bytes) {
  // Three decimals below 1 MiB: a small model's plans differ by less than
  // 1% of it (and "never under" needs the digits to tell).
  if (bytes < (int64_t(1) << 20))
    return llvm::formatv("{0:F3} MiB", bytes / 1048576.0).str();
  if (bytes < (int64_t(10) << 20))
    return llvm::formatv("{0:F2} MiB", bytes / 1048576.0).str();
  if (bytes < (int64_t(1) << 30))
    return llvm::formatv("{0:F1} MiB", bytes / 1048576.0).str();
  return llvm::formatv("{0:F2} GiB", bytes / 1073741824.0).str();
}

/// The key of a probe: tensor-parallel degree, precision, recompute,
/// sequence parallelism.
using ProbeKey = std::tuple<int64_t, std::string, std::string, bool>;

/// One plan being priced.
struct Candidate {
  int64_t tp, pp, chunks, dp, zero, microbatches;
  sched::Policy policy;
  std::string precision, recompute;
  bool sp = false; // sequence parallelism (--sp, with tp > 1)
};

/// The compile options of candidate `c` over the user's `base`.
CompileOptions optionsOf(const CompileOptions &base, const Candidate &c) {
  CompileOptions o = base;
  o.tp = c.tp;
  o.pp = c.pp;
  o.ppChunks = c.chunks;
  o.dp = c.dp;
  o.zero = c.zero;
  o.microbatches = c.microbatches;
  o.schedule = c.pp > 1
                   ? std::optional<std::string>(sched::policyName(c.policy))
                   : std::nullopt;
  o.recompute = c.recompute;
  o.precision = c.precision;
  o.sequenceParallel = c.sp;
  o.ppCuts.clear();
  return o;
}

/// Runs the compile pipeline with `o` on a copy of `source`, its errors
/// kept from the user (the first in `error`); null when it fails.
/// Another thread may compile beside it (the probes run on two), each
/// keeping only its own thread's diagnostics.
OwningOpRef<ModuleOp> compileQuietly(ModuleOp source, const CompileOptions &o,
                                     std::string &error) {
  std::thread::id self = std::this_thread::get_id();
  ScopedDiagnosticHandler quiet(source.getContext(), [&](Diagnostic &d) {
    if (std::this_thread::get_id() != self)
      return failure(); // the other compile's
    if (d.getSeverity() == DiagnosticSeverity::Error && error.empty())
      error = d.str();
    return success();
  });
  OwningOpRef<ModuleOp> copy(cast<ModuleOp>(source->clone()));
  PassManager pm(source.getContext(), ModuleOp::getOperationName());
  buildCompilePipeline(pm, o);
  if (failed(pm.run(*copy))) {
    if (error.empty())
      error = "the compile failed";
    return nullptr;
  }
  return copy;
}

class Search {
public:
  Search(ModuleOp imported, const PlanRequest &request)
      : imported(imported), request(request), pricer{request.machine, 1.0} {}
  ~Search() { stopProbesAhead(); }

  FailureOr<PlanSearchResult> run();

private:
  void report(const std::string &line) const {
    if (request.progress)
      request.progress(line);
  }
  const Probe &probe(int64_t tp, const std::string &precision,
                     const std::string &recompute, bool sp);
  /// Compiles the probe of `key` into `p` (on either thread).
  void compileProbe(const ProbeKey &key, Probe &p);
  struct ProbeSlot;
  /// Claims `slot` and compiles its probe, `lock` (on probeMutex) released
  /// meanwhile.
  void fillSlot(const ProbeKey &key, ProbeSlot &slot,
                std::unique_lock<std::mutex> &lock);
  /// Compiles, on a second thread, the probes in `order` the search has not
  /// asked for yet, until `stopAhead`: the search asks for them in about
  /// that order, pricing each probe's plans meanwhile.
  void startProbesAhead(std::vector<ProbeKey> order);
  /// Compiles the next probe of aheadOrder no thread has taken; false when
  /// none is left, or the next must wait for another to finish.
  bool compileNextAhead(std::unique_lock<std::mutex> &lock);
  void stopProbesAhead();
  /// A stage cut and the weight bytes each stage reads.
  struct StageCut {
    std::vector<size_t> bounds; // stages + 1 positions
    std::vector<int64_t> weights;
    /// Per stage: how many weights it reads.
    std::vector<int64_t> weightCounts;
    /// Per pipeline rank: the bytes of the weights it shares with other
    /// pipeline ranks (a tied embedding and LM head on the first and
    /// last stage), whose gradients the step sums over those ranks, and
    /// the largest such group.
    std::vector<int64_t> sharedBytes;
    /// Per stage: the bytes of the 16-bit weight copies it reads, and of
    /// the saved activations read in several places that it saves.
    std::vector<int64_t> copies, savedReads, savedReadsFixed;
    std::vector<int64_t> sharedRanks;
    /// Per stage: the arena bytes a tied table it splits adds (its
    /// lookups' gradient made whole, then sliced to the rank's piece).
    std::vector<int64_t> lookupGradient;
  };
  /// The stage cut for `stages` stages over `ranks` pipeline ranks (no
  /// bounds when the model has too few cut points).
  const StageCut &cutsFor(const Probe &p, const ProbeKey &key, int64_t stages,
                          int64_t ranks);
  /// A schedule replayed: the makespan, and each rank's stash slots and B-to-W
  /// sets per chunk.
  struct Replay {
    std::optional<std::string> error;
    /// The makespan at a whole core's rates per rank, and with the ranks
    /// sharing the machine's cores (CPU ranks outnumbering them).
    double makespan = 0, sharedMakespan = 0;
    std::vector<std::vector<int32_t>> slotCounts, stashCounts;
  };
  std::optional<PlanPrediction> price(const Candidate &c, bool &overMemory,
                                      std::string &why);
  Replay replay(const Candidate &c, const std::vector<double> &f,
                const std::vector<double> &b, const std::vector<double> &w,
                const std::vector<double> &transfer, double collectives);
  /// A plan whose busiest pipeline rank computes longer than this is not
  /// simulated (`price` sets `bounded`): enough faster plans fit.
  double pruneAbove = std::numeric_limits<double>::infinity();
  /// A stage's micro-batch arena by probe, stage bounds, rows and which
  /// weight gradients take a buffer (replayArena).
  std::map<std::tuple<const Probe *, size_t, size_t, int64_t, int, bool>,
           double>
      arenas;
  bool bounded = false;

  /// Whether the plan's ranks share the machine's cores (CPU ranks
  /// outnumbering them).
  bool sharesCores() const {
    return request.machine.cores > 0 &&
           static_cast<double>(request.devices) > request.machine.cores;
  }

  int64_t budget() const {
    return request.machine.memoryBytes - request.machine.reservedBytes;
  }

  ModuleOp imported;
  /// What the probes compile: the model imported at one row, or the
  /// imported model split into micro-batches of one row.
  OwningOpRef<ModuleOp> oneRow;
  ModuleOp probeModule;
  /// ONNX nodes computing, from constants alone, a value with a row per
  /// batch entry in the whole batch's program.
  llvm::StringSet<> perRowConstants;
  int64_t probeMicrobatches = 1;
  /// One tensor-parallel search per degree for all the probes.
  std::shared_ptr<ShardingMemo> shardingMemo = createShardingMemo();
  const PlanRequest &request;
  Pricer pricer;
  int64_t batch = 1;
  /// A probe and whether a thread compiles it or has.
  struct ProbeSlot {
    Probe probe;
    bool started = false, done = false, reported = false;
    double seconds = 0;
  };
  std::map<ProbeKey, ProbeSlot> probes; // under probeMutex
  std::mutex probeMutex;
  std::condition_variable probeDone;
  std::thread ahead;
  /// The probes the search will likely ask for, in order, and the next one
  /// no thread has taken (under probeMutex).
  std::vector<ProbeKey> aheadOrder;
  size_t nextAhead = 0;
  bool stopAhead = false; // under probeMutex
  std::map<std::tuple<ProbeKey, int64_t, int64_t>, StageCut> cuts;
  /// Per probe, pp, chunks, dp, micro-batches and schedule: the replay
  /// (the same for every ZeRO stage).
  std::map<std::tuple<ProbeKey, int64_t, int64_t, int64_t, int64_t, int>,
           Replay>
      replays;
  /// Per schedule (policy, p, m, v): the generated lists, or "" errors.
  std::map<std::tuple<int, int64_t, int64_t, int64_t>,
           std::optional<sched::Schedule>>
      schedules;
};

void Search::compileProbe(const ProbeKey &key, Probe &p) {
  const auto &[tp, precision, recompute, sp] = key;
  CompileOptions o = request.base;
  o.tp = tp;
  o.pp = 1;
  o.dp = 1;
  o.zero = 0;
  o.ppCuts.clear();
  o.ppChunks = 1;
  o.schedule.reset();
  o.microbatches = probeMicrobatches; // one row per micro-batch
  o.recompute = recompute;
  o.precision = precision;
  o.sequenceParallel = sp;
  p.sequenceParallel = sp;
  o.memCapBytes = 0;
  o.emitRemarks = false;
  o.planMemory = true;
  o.offload = "none";
  o.bucketMb.reset();
  o.shardingMemo = shardingMemo;
  std::string verified = o.verify();
  if (!verified.empty()) {
    p.error = verified;
    return;
  }
  // The probe's errors are the search's notes, not the user's.
  if (OwningOpRef<ModuleOp> copy = compileQuietly(probeModule, o, p.error))
    readProbe(*copy, pricer, tp, perRowConstants, p);
}

void Search::fillSlot(const ProbeKey &key, ProbeSlot &slot,
                      std::unique_lock<std::mutex> &lock) {
  slot.started = true;
  lock.unlock();
  Clock::time_point start = Clock::now();
  compileProbe(key, slot.probe);
  lock.lock();
  slot.seconds = secondsSince(start);
  slot.done = true;
  probeDone.notify_all();
}

bool Search::compileNextAhead(std::unique_lock<std::mutex> &lock) {
  while (nextAhead < aheadOrder.size()) {
    const ProbeKey &key = aheadOrder[nextAhead];
    // Another recompute policy's probe waits for its group's first: that
    // one searches the tensor-parallel layouts the others reuse.
    ProbeKey first = key;
    std::get<2>(first) = std::get<2>(aheadOrder.front());
    if (first != key && !probes[first].done)
      return false;
    ++nextAhead;
    ProbeSlot &slot = probes[key];
    if (!slot.started) {
      fillSlot(key, slot, lock);
      return true;
    }
  }
  return false;
}

const Probe &Search::probe(int64_t tp, const std::string &precision,
                           const std::string &recompute, bool sp) {
  ProbeKey key{tp, precision, recompute, sp};
  std::unique_lock<std::mutex> lock(probeMutex);
  ProbeSlot &slot = probes[key]; // std::map: the reference stays valid
  if (!slot.started)
    fillSlot(key, slot, lock);
  // The other thread compiles it: compile the next ones meanwhile.
  while (!slot.done && compileNextAhead(lock))
    ;
  probeDone.wait(lock, [&] { return slot.done; });
  if (!slot.reported) {
    slot.reported = true;
    const Probe &p = slot.probe;
    report(llvm::formatv("probe tp={0}{4} {1} recompute={2}: {3}", tp,
                         precision, recompute,
                         p.error.empty()
                             ? llvm::formatv("{0} forward ops, {1:F1} s",
                                             p.size(), slot.seconds)
                                   .str()
                             : "not possible: " + p.error,
                         sp ? " sp" : "")
               .str());
  }
  return slot.probe;
}

void Search::startProbesAhead(std::vector<ProbeKey> order) {
  aheadOrder = std::move(order);
  ahead = std::thread([this] {
    std::unique_lock<std::mutex> lock(probeMutex);
    while (!stopAhead && nextAhead < aheadOrder.size())
      if (!compileNextAhead(lock))
        probeDone.wait(lock); // for the other thread's probe
  });
}

void Search::stopProbesAhead() {
  {
    std::lock_guard<std::mutex> lock(probeMutex);
    stopAhead = true;
    probeDone.notify_all();
  }
  if (ahead.joinable())
    ahead.join();
}

const Search::StageCut &Search::cutsFor(const Probe &p, const ProbeKey &key,
                                        int64_t stages, int64_t ranks) {
  auto k = std::make_tuple(key, stages, ranks);
  auto it = cuts.find(k);
  if (it != cuts.end())
    return it->second;
  StageCut &out = cuts[k];
  std::vector<size_t> cut;
  if (stages > 1) {
    if (static_cast<int64_t>(p.candidates.size()) < stages - 1)
      return out;
    cut = balanceStages(p.cut, p.candidates, stages);
    if (stages > ranks)
      balanceRanks(p.cut, p.candidates, cut, ranks);
  }
  out.bounds.push_back(0);
  out.bounds.insert(out.bounds.end(), cut.begin(), cut.end());
  out.bounds.push_back(p.size());
  out.weights.assign(static_cast<size_t>(stages), 0);
  out.weightCounts.assign(static_cast<size_t>(stages), 0);
  auto readIn = [&](const std::vector<size_t> &at, int64_t k) {
    auto first = std::lower_bound(at.begin(), at.end(), out.bounds[k]);
    return first != at.end() && *first < out.bounds[k + 1];
  };
  // Per stage, the bytes of the values some op of the stage reads.
  auto perStage =
      [&](const std::vector<std::pair<int64_t, std::vector<size_t>>> &read) {
        std::vector<int64_t> sums(static_cast<size_t>(stages), 0);
        for (const auto &[bytes, at] : read)
          for (int64_t k = 0; k < stages; ++k)
            if (readIn(at, k))
              sums[k] += bytes;
        return sums;
      };
  out.copies = perStage(p.copies);
  out.savedReads = perStage(p.savedReads);
  out.savedReadsFixed = perStage(p.savedReadsFixed);
  out.sharedBytes.assign(static_cast<size_t>(ranks), 0);
  out.sharedRanks.assign(static_cast<size_t>(ranks), 1);
  out.lookupGradient.assign(static_cast<size_t>(stages), 0);
  for (auto [w, entry] : llvm::enumerate(p.weights)) {
    const auto &[bytes, at] = entry;
    // A weight on several stages: the first one's layout holds. Kept
    // whole by the one-stage probe for a later stage's product (a tied LM
    // head), it is split where the first stage only looks it up (the
    // later stages gather it, as the probe's product read it whole), and
    // that stage's lookup gradient is made whole, then sliced.
    int64_t held = bytes;
    const Probe::WeightSplit &split = p.splits[w];
    int64_t first = -1, readers = 0;
    for (int64_t k = 0; k < stages; ++k)
      if (readIn(at, k)) {
        first = first < 0 ? k : first;
        ++readers;
      }
    bool splitFirst = false;
    if (readers > 1 && split.splitBytes > 0) {
      auto lo = std::lower_bound(at.begin(), at.end(), out.bounds[first]);
      auto hi = std::lower_bound(at.begin(), at.end(), out.bounds[first + 1]);
      splitFirst = std::all_of(lo, hi, [&](size_t a) {
        return std::binary_search(split.lookups.begin(), split.lookups.end(),
                                  a);
      });
    }
    if (splitFirst)
      held = split.splitBytes;
    llvm::SmallVector<int64_t, 4> holders;
    for (int64_t k = 0; k < stages; ++k) {
      if (!readIn(at, k))
        continue;
      out.weights[k] += held;
      ++out.weightCounts[k];
      if (splitFirst && k == first)
        out.lookupGradient[k] += bytes + held;
      if (!llvm::is_contained(holders, k % ranks))
        holders.push_back(k % ranks);
    }
    if (holders.size() > 1)
      for (int64_t r : holders) {
        out.sharedBytes[r] += held;
        out.sharedRanks[r] =
            std::max<int64_t>(out.sharedRanks[r], holders.size());
      }
  }
  return out;
}

/// The makespan of `sim` when its ranks share `cores` cores' worth: each
/// stretch of the timeline in which `a` ranks compute (`copies` ranks run
/// each pipeline rank's list: its tp x dp) runs at min(1, cores / a) of a
/// whole core's rates: a bubble is another rank's compute only as far as
/// that rank is waiting for cores. One rank computing alone runs at one
/// core's rate (GPT-2 124M at pp 4 and one micro-batch on 4 ranks of 2
/// cores: 3.4-3.6 s a step, priced 2.35 s as every rank's busy time over
/// the cores' worth), all of them at the cores' worth shared out. The
/// `collectives` share of each stretch is not slowed: the collectives'
/// rates were calibrated with every rank taking part (GPT-2 at tp 4 with
/// --sp and two micro-batches: 3.86 s a step measured, 4.33 priced with
/// its 0.53 s of tensor-parallel collectives stretched 2.7x, 3.60 not).
double sharedMakespan(const sched::Simulation &sim, double copies, double cores,
                      double collectives) {
  std::vector<std::pair<double, int>> events;
  for (const std::vector<sched::Interval> &rank : sim.timeline)
    for (const sched::Interval &in : rank)
      if (in.end > in.start) {
        events.push_back({in.start, 1});
        events.push_back({in.end, -1});
      }
  llvm::sort(events);
  double t = 0, out = 0;
  int active = 0;
  for (auto [at, change] : events) {
    double a = active * copies;
    double stretch = a > cores ? a / cores : 1.0;
    out += (at - t) * (collectives + (1 - collectives) * stretch);
    t = at;
    active += change;
  }
  return out + std::max(0.0, sim.makespan - t);
}

Search::Replay Search::replay(const Candidate &c, const std::vector<double> &f,
                              const std::vector<double> &b,
                              const std::vector<double> &w,
                              const std::vector<double> &transfer,
                              double collectives) {
  Replay out;
  out.slotCounts.resize(static_cast<size_t>(c.pp));
  out.stashCounts.resize(static_cast<size_t>(c.pp));
  double cores = request.machine.cores;
  double copies = static_cast<double>(c.tp * c.dp);
  bool sharing = sharesCores();
  if (c.pp == 1) {
    out.makespan = (f[0] + b[0] + w[0]) * c.microbatches;
    double stretch = sharing ? std::max(1.0, copies / cores) : 1.0;
    out.sharedMakespan =
        out.makespan * (collectives + (1 - collectives) * stretch);
    out.slotCounts[0] = {1};
    out.stashCounts[0] = {0};
    return out;
  }
  auto skey = std::make_tuple(static_cast<int>(c.policy), c.pp, c.microbatches,
                              c.chunks);
  auto found = schedules.find(skey);
  if (found == schedules.end()) {
    sched::Options so;
    so.policy = c.policy;
    so.stages = static_cast<int32_t>(c.pp);
    so.microbatches = static_cast<int32_t>(c.microbatches);
    so.chunks = static_cast<int32_t>(c.chunks);
    sched::GenerateResult g = sched::generate(so);
    found = schedules.emplace(skey, std::move(g.schedule)).first;
  }
  if (!found->second) {
    out.error = "no such schedule";
    return out;
  }
  const sched::Schedule &s = *found->second;
  sched::Durations d;
  d.forwardOf = f;
  d.backwardOf = b;
  d.weightGradOf = w;
  // One transfer time for all the boundaries: the widest.
  d.transfer = *std::max_element(transfer.begin(), transfer.end() - 1);
  sched::SimulateResult sim = sched::simulate(s, d);
  if (!sim.simulation) {
    out.error = "schedule: " + sim.error;
    return out;
  }
  out.makespan = sim.simulation->makespan;
  out.sharedMakespan =
      sharing ? sharedMakespan(*sim.simulation, copies, cores, collectives)
              : out.makespan;
  for (int64_t r = 0; r < c.pp; ++r) {
    // Every instruction, as the runtime walks the list (and the compile's
    // memory model): a micro-batch's slot is taken by its first one, which
    // is its receive where the list posts it before an earlier
    // micro-batch's W (interleaved, rank 1 of 2 at 8 micro-batches: 4+2
    // slots, against 3+1 counted from F, B and W alone; the search
    // under-predicted such plans by 15-23%).
    std::vector<sched::SlotStep> steps;
    for (const sched::Instr &in : s.ranks[r])
      if (in.chunk < c.chunks)
        steps.push_back({in.chunk, in.microbatch, in.op == sched::Op::Backward,
                         in.op == sched::Op::WeightGrad});
    sched::StashSlots slots =
        sched::assignStashSlots(steps, static_cast<int32_t>(c.chunks),
                                static_cast<int32_t>(c.microbatches));
    out.slotCounts[r] = slots.slotCount;
    out.stashCounts[r] = slots.stashCount;
  }
  return out;
}

std::optional<PlanPrediction>
Search::price(const Candidate &c, bool &overMemory, std::string &why) {
  overMemory = false;
  ProbeKey key{c.tp, c.precision, c.recompute, c.sp};
  const Probe &p = probe(c.tp, c.precision, c.recompute, c.sp);
  if (!p.error.empty()) {
    why = p.error;
    return std::nullopt;
  }
  const Machine &m = request.machine;
  int64_t stages = c.pp * c.chunks;
  const StageCut &stageCut = cutsFor(p, key, stages, c.pp);
  if (stageCut.bounds.empty()) {
    why = std::to_string(stages) + " stages need " +
          std::to_string(stages - 1) + " cut points; the model has " +
          std::to_string(p.candidates.size());
    return std::nullopt;
  }
  const std::vector<size_t> &bounds = stageCut.bounds;
  const std::vector<int64_t> &weights = stageCut.weights;
  // The micro-batch's rows (the probe's is one).
  double rows = static_cast<double>(batch / (c.dp * c.microbatches));
  // Per stage: F, B, W seconds per micro-batch; saved bytes; weights.
  auto range = [](const auto &prefix, size_t a, size_t b) {
    return prefix[b] - prefix[a];
  };
  // The backward phase's time, per row and fixed, shared out over the
  // stages as the forward's ops weigh (products twice: two products each);
  // its work on weight-sized buffers, a micro-batch's whatever its rows,
  // on the stages holding the weights (by their bytes).
  double perRowTotal = p.backward.back() - p.backwardFixed.back();
  double rowShare = perRowTotal > 0
                        ? (p.backwardSeconds - p.backwardFixedSeconds -
                           p.backwardWeightSeconds) /
                              perRowTotal
                        : 0;
  double allWeights = static_cast<double>(std::max<int64_t>(1, p.weightBytes));
  double fixedShare = p.backwardFixed.back() > 0
                          ? p.backwardFixedSeconds / p.backwardFixed.back()
                          : 0;
  std::vector<double> f(stages), b(stages), w(stages), transfer(stages, 0),
      weightWork(stages);
  std::vector<int64_t> saved(stages), wgSet(stages), inBytes(stages, 0),
      outBytes(stages, 0);
  for (int64_t k = 0; k < stages; ++k) {
    size_t lo = bounds[k], hi = bounds[k + 1];
    double fixedF = range(p.forwardFixed, lo, hi);
    double weightF = range(p.forwardWeight, lo, hi);
    f[k] =
        fixedF + weightF + (range(p.forward, lo, hi) - fixedF - weightF) * rows;
    double weightB =
        p.backwardWeightSeconds * static_cast<double>(weights[k]) / allWeights;
    weightWork[k] = weightF + weightB;
    double fixedB = range(p.backwardFixed, lo, hi);
    double back = fixedB * fixedShare +
                  (range(p.backward, lo, hi) - fixedB) * rowShare * rows +
                  weightB;
    w[k] = std::min(back, range(p.weightGrad, lo, hi) * rows);
    b[k] = back - w[k];
    saved[k] = static_cast<int64_t>(std::ceil(
        static_cast<double>(range(p.saved, lo, hi) + stageCut.savedReads[k]) *
            rows +
        static_cast<double>(range(p.savedFixed, lo, hi) +
                            stageCut.savedReadsFixed[k])));
    wgSet[k] = static_cast<int64_t>(
        std::ceil(static_cast<double>(range(p.wgradSet, lo, hi)) * rows));
    if (k > 0)
      inBytes[k] = static_cast<int64_t>(
          (p.cut.crossing[lo] + p.gatheredAt[lo]) * rows);
    if (k + 1 < stages)
      outBytes[k] = static_cast<int64_t>(
          (p.cut.crossing[hi] + p.gatheredAt[hi]) * rows);
  }
  // The step is at least the busiest pipeline rank's compute: a plan
  // slower by that alone than enough plans predicted to fit is not
  // simulated (the simulation is most of the pricing at pp x m in the
  // thousands).
  // Each pipeline rank's compute per step: its chunks' F + B + W for every
  // micro-batch.
  std::vector<double> work(static_cast<size_t>(c.pp), 0),
      rankWeightWork(static_cast<size_t>(c.pp), 0);
  for (int64_t r = 0; r < c.pp; ++r)
    for (int64_t ch = 0; ch < c.chunks; ++ch) {
      int64_t k = r + ch * c.pp;
      work[r] += (f[k] + b[k] + w[k]) * c.microbatches;
      rankWeightWork[r] += weightWork[k] * static_cast<double>(c.microbatches);
    }
  size_t busiestRank = static_cast<size_t>(
      std::max_element(work.begin(), work.end()) - work.begin());
  double busiest = work[busiestRank];
  // The pipeline's replay is the same for every ZeRO stage.
  auto rkey = std::make_tuple(key, c.pp, c.chunks, c.dp, c.microbatches,
                              static_cast<int>(c.policy));
  auto cached = replays.find(rkey);
  bounded = false;
  if (cached == replays.end() && busiest > pruneAbove) {
    bounded = true;
    return std::nullopt;
  }
  // pp neighbours are tp ranks apart, dp groups tp x pp apart (the mesh
  // order dp, pp, tp).
  bool ppIntra = c.tp * c.pp <= m.devicesPerNode;
  bool dpIntra = c.tp * c.pp * c.dp <= m.devicesPerNode;
  for (int64_t k = 0; k + 1 < stages; ++k) {
    double bw = ppIntra ? m.intraBandwidth : m.interBandwidth;
    transfer[k] = (ppIntra ? m.intraLatency : m.interLatency) +
                  static_cast<double>(outBytes[k]) / (bw * pricer.share);
  }

  // The pipeline: each rank's list replayed with these durations. The
  // tensor-parallel collectives' share of them is not slowed where ranks
  // share cores (sharedMakespan).
  double stepWork = p.forward.back() + p.backwardSeconds;
  double collectiveShare =
      stepWork > 0 ? std::min(1.0, p.tpSeconds / stepWork) : 0.0;
  if (cached == replays.end())
    cached =
        replays.emplace(rkey, replay(c, f, b, w, transfer, collectiveShare))
            .first;
  const Replay &rep = cached->second;
  if (rep.error) {
    why = *rep.error;
    return std::nullopt;
  }
  double makespan = rep.makespan;
  const std::vector<std::vector<int32_t>> &slotCounts = rep.slotCounts,
                                          &stashCounts = rep.stashCounts;

  // Per pipeline rank: memory, the data-parallel traffic and the update.
  const StepMemory &pool = p.pools;
  double weightTotal = static_cast<double>(std::max<int64_t>(1, p.weightBytes));
  // A gradient is written once (pcc-assign-first-gradients, and in bf16
  // where the probe kept it so) only with one micro-batch, no pipeline and
  // no data parallelism; otherwise it accumulates, in f32.
  bool accumulates = c.microbatches > 1 || c.pp > 1 || c.dp > 1;
  double gradBytes = static_cast<double>(
      pool.grads + (accumulates ? p.narrowGrads : int64_t{0}));
  int64_t peak = 0;
  double dpWorst = 0, optWorst = 0, movedWorst = 0;
  double d = static_cast<double>(c.dp);
  // The largest gradient of weights shared by pipeline ranks.
  double sharedGrads = 0;
  for (int64_t bytes : stageCut.sharedBytes)
    sharedGrads = std::max(sharedGrads, static_cast<double>(bytes) *
                                            (gradBytes / weightTotal));
  for (int64_t r = 0; r < c.pp; ++r) {
    int64_t rankWeights = 0, rankCopies = 0, rankWeightCount = 0;
    double back = 0;
    for (int64_t ch = 0; ch < c.chunks; ++ch) {
      int64_t k = r + ch * c.pp;
      rankWeights += weights[k];
      rankWeightCount += stageCut.weightCounts[k];
      rankCopies += stageCut.copies[k];
      back += b[k] + w[k];
    }
    double share = static_cast<double>(rankWeights) / weightTotal;
    // The 16-bit copies where the rank's products read them (the pool's
    // whole when no stage is cut: every copy the probe read).
    double W = pool.weights * share, G = gradBytes * share,
           O = pool.optimizer * share,
           C = c.pp * c.chunks > 1 ? static_cast<double>(rankCopies)
                                   : static_cast<double>(pool.copies);
    // ZeRO's model state (the optimizer's and a master piece of each
    // weight sharded from stage 1, the gradients from 2, the weights at 3,
    // one gathered weight alive besides). In a pipeline the gradients
    // accumulate whole through the step (--zero-grad-sync=step).
    double shardedGrads = c.zero >= 2 && c.pp == 1 ? G / d : G;
    double state = 0;
    switch (c.zero) {
    case 0:
      state = W + G + O + C;
      break;
    case 1:
    case 2:
      state = W + shardedGrads + C + (O + W) / d;
      break;
    default:
      // ZeRO 3 shards the 16-bit copies too (each gathered as its phase
      // reads it, in the arena): a whole copy per rank made every 70B
      // mixed-precision ZeRO-3 plan twice its compiled peak.
      state = shardedGrads + (W + O + C) / d;
      break;
    }
    double activations = 0;
    for (int64_t ch = 0; ch < c.chunks; ++ch) {
      int64_t k = r + ch * c.pp;
      double slot = static_cast<double>(saved[k] + inBytes[k] + outBytes[k]) +
                    (k + 1 < stages ? static_cast<double>(outBytes[k]) : 0);
      // The batch's inputs: the first stage reads the ids, the last the
      // labels (counted whole on both).
      if (c.pp == 1 || k == 0 || k + 1 == stages)
        slot += static_cast<double>(pool.inputs) * rows;
      activations += slotCounts[r][ch] * slot;
      // B's values for W: zb-h1's sets in flight (the others run W right
      // after B, within it: pcc-merge-weight-gradients). The first stage's
      // B computes nothing (no cotangent to send back): W does it all.
      if (c.policy == sched::Policy::ZeroBubbleH1 && k > 0)
        activations += stashCounts[r][ch] * static_cast<double>(wgSet[k]);
      activations += static_cast<double>(c.microbatches) * inBytes[k];
    }
    // The arena: the largest phase's scratch. A micro-batch's phases: the
    // rank's stages' buffers laid out again at the micro-batch's rows,
    // with an accumulated weight gradient's buffer where it accumulates
    // (pcc-assign-first-gradients writes a gradient where it is made only
    // with one micro-batch, no pipeline and no data parallelism).
    // The rank's stages' arena with `gradients` of the weight gradients'
    // buffers (replayArena).
    auto stageArena = [&](int gradients, bool gathers = false) {
      double most = 0;
      for (int64_t ch = 0; ch < c.chunks; ++ch) {
        int64_t k = r + ch * c.pp;
        auto akey =
            std::make_tuple(&p, bounds[k], bounds[k + 1],
                            static_cast<int64_t>(rows), gradients, gathers);
        auto it = arenas.find(akey);
        if (it == arenas.end())
          it = arenas
                   .emplace(akey, replayArena(p, bounds[k], bounds[k + 1], rows,
                                              gradients, gathers))
                   .first;
        // A pipeline stage's backward merges its W into B in its own order
        // (pcc-merge-weight-gradients), not the probe's: laid out again
        // from the probe's order a stage before the last came out up to
        // 14% under its compiled arena (Llama-3 8B's width at 8,192
        // tokens, 1F1B over 4 stages: 672 MiB against 784).
        double margin = k + 1 < stages ? 1.1 : 1.0;
        most =
            std::max(most, it->second * margin +
                               static_cast<double>(stageCut.lookupGradient[k]));
      }
      return most;
    };
    double perMicrobatch = stageArena(accumulates ? 2 : 1);
    // ZeRO 3 gathers each weight as its phase reads it, alive to its last
    // reader: laid out with the phase's buffers (one largest weight beside
    // the largest scratch put the bundled GPT's ZeRO-3 pipelines 6-14%
    // over; with each read's gather where it is, 0.4-7%).
    if (c.dp > 1 && c.zero == 3)
      perMicrobatch =
          std::max(perMicrobatch, stageArena(accumulates ? 2 : 1, true));
    // ZeRO 2 and 3 without a pipeline also make each weight's gradient
    // whole in the arena before its reduce-scatter, where it is made
    // (replayArena's gradients 3): Llama-3 8B's embedding (2.1 GB; left
    // out, every 8B ZeRO-2 plan was under by that much) and a 16-bit
    // product's gradient with its widened copy (the 8B's LM head); a tied
    // weight's contributions summed at the backward's end. (Added to the
    // scratch without them, one largest gradient and a largest copy put
    // the 8B's ZeRO-3 plan 13% over once pcc-plan-memory laid its arena
    // out by size.)
    if (c.dp > 1 && c.zero >= 2 && c.pp == 1)
      perMicrobatch = std::max(perMicrobatch, stageArena(3, c.zero == 3));
    // The update: ZeRO 1 reduce-scatters the gradients into pieces, 1 and 2
    // gather each updated weight; a weight on several pipeline ranks has
    // its gradient all-reduced over the whole pipeline axis, on every rank
    // of it.
    double stepScratch = static_cast<double>(p.stepArena) * share;
    // In a pipeline the gradients are all-reduced over dp once a step, in
    // the update phase: every sum in the arena at once.
    if (c.dp > 1 && c.zero == 0 && c.pp > 1)
      stepScratch = std::max(stepScratch, G);
    // (In a pipeline ZeRO 2 and 3 reduce-scatter the gradients once a step
    // there too: --zero-grad-sync=step.)
    if (c.dp > 1 && c.zero >= 1) {
      bool pieces = c.zero == 1 || c.pp > 1;
      double gather = c.zero < 3 ? static_cast<double>(p.largestWeight) : 0;
      stepScratch = std::max(stepScratch, (pieces ? G / d : 0.0) + gather);
    }
    stepScratch = std::max(stepScratch, sharedGrads);
    double arena = std::max(perMicrobatch, stepScratch);
    auto total = static_cast<int64_t>(state + activations + arena + 4096);
    peak = std::max(peak, total);

    // Gradients reduced (ZeRO 0: all-reduce; 1-2: reduce-scatter, then the
    // updated weights all-gathered; 3 also gathers every weight, its
    // 16-bit copy under mixed precision, for each micro-batch's forward and
    // backward).
    double comm = 0, moved = 0;
    if (c.dp > 1) {
      double part = (d - 1) / d;
      double bytes = 2 * part * G;
      if (c.zero == 3)
        bytes += 2.0 * c.microbatches * part * (C > 0 ? C : W);
      moved = bytes;
      double bw = dpIntra ? m.intraBandwidth : m.interBandwidth;
      double latency = dpIntra ? m.intraLatencyFor(c.dp) : m.interLatency;
      // One collective per weight (the runtime does not bucket them):
      // ZeRO 0 an all-reduce, 1 and 2 a reduce-scatter and the updated
      // weight's all-gather, 3 the reduce-scatter and a gather in every
      // micro-batch's forward and backward (the bundled GPT at pp 2 x dp
      // 2 with ZeRO 1: 29 collectives a rank, 0.43 ms a step measured,
      // priced 0.14 ms as one latency).
      double perWeight = c.zero == 0   ? 1.0
                         : c.zero <= 2 ? 2.0
                                       : 1.0 + 2.0 * c.microbatches;
      comm = perWeight * static_cast<double>(rankWeightCount) * latency +
             bytes / (bw * pricer.share);
      // NCCL's buckets run beside the last micro-batch's backward (and
      // ZeRO-3's prefetched gathers beside the compute); MPI's do not.
      if (m.overlapsCollectives)
        comm =
            std::max(0.1 * comm,
                     comm - 0.8 * (c.zero == 3 ? back * c.microbatches : back));
    }
    // A weight on several pipeline ranks (a tied embedding and head): its
    // gradient is summed over them once a step (an all-reduce of the
    // whole gradient on the pp link; GPT-2's 154 MB table at pp=2).
    if (stageCut.sharedBytes[r] > 0 && weightTotal > 0) {
      double k = static_cast<double>(stageCut.sharedRanks[r]);
      double grads = static_cast<double>(stageCut.sharedBytes[r]) *
                     (gradBytes / weightTotal);
      double bw = ppIntra ? m.intraBandwidth : m.interBandwidth;
      comm += (ppIntra ? m.intraLatency : m.interLatency) +
              2 * (k - 1) / k * grads / (bw * pricer.share);
      moved += 2 * (k - 1) / k * grads;
    }
    dpWorst = std::max(dpWorst, comm);
    double update = p.optimizerSeconds * share / (c.zero ? d : 1.0);
    optWorst = std::max(optWorst, update);
    movedWorst =
        std::max(movedWorst, moved + p.tpBytes * rows * c.microbatches * share +
                                 static_cast<double>(outBytes[r] + inBytes[r]) *
                                     c.microbatches);
  }

  PlanPrediction out;
  out.options = optionsOf(request.base, c);
  // The stage cut priced here is the plan's: the compile takes it as
  // --pp-cuts (its own cost model would balance the stages otherwise).
  for (size_t k = 1; k + 1 < bounds.size(); ++k) {
    auto at = llvm::lower_bound(p.candidates, bounds[k]);
    std::string name = at != p.candidates.end() && *at == bounds[k]
                           ? p.cutNames[at - p.candidates.begin()]
                           : std::string();
    if (name.empty()) {
      out.options.ppCuts.clear();
      break;
    }
    out.options.ppCuts.push_back(name);
  }
  out.computeSeconds = busiest;
  out.bubbleSeconds = std::max(0.0, makespan - busiest);
  out.dpSeconds = dpWorst;
  out.optimizerSeconds = optWorst;
  out.stepSeconds = makespan + dpWorst + optWorst;
  // More CPU ranks than cores: the pipeline's timeline stretched where
  // more ranks compute than there are cores (at least every rank's work
  // over the cores' worth), the update run by every rank at once; the
  // data-parallel collectives were measured with every rank taking part.
  if (sharesCores()) {
    double busyShare = makespan > 0 ? std::min(1.0, busiest / makespan) : 1;
    out.computeSeconds = rep.sharedMakespan * busyShare;
    out.bubbleSeconds = rep.sharedMakespan - out.computeSeconds;
    out.optimizerSeconds =
        optWorst *
        std::max(1.0, static_cast<double>(request.devices) / m.cores);
    out.stepSeconds = rep.sharedMakespan + dpWorst + out.optimizerSeconds;
  }
  out.tpSeconds = p.tpSeconds * rows * c.microbatches / c.pp;
  out.weightWorkSeconds = rankWeightWork[busiestRank];
  out.peakBytes = peak;
  out.movedBytes = static_cast<int64_t>(movedWorst);
  // Model FLOPs: the probe's (per tp rank) over every row of the batch.
  const Probe &plain = probe(c.tp, c.precision, "none", c.sp);
  double modelFlops = (plain.error.empty() ? plain.flops : p.flops) *
                      static_cast<double>(c.tp) * static_cast<double>(batch);
  out.mfu = modelFlops / (out.stepSeconds * request.devices *
                          m.peakFlops(c.precision != "fp32"));
  if (peak > budget()) {
    overMemory = true;
    why = "needs " + gib(peak) + " per rank";
  }
  return out;
}

/// Why `p` ranks below `best`: its largest extra cost.
std::string whyBelow(const PlanPrediction &p, const PlanPrediction &best) {
  std::pair<double, std::string> parts[] = {
      {p.computeSeconds - best.computeSeconds, "compute"},
      {p.bubbleSeconds - best.bubbleSeconds, "pipeline bubble"},
      {p.dpSeconds - best.dpSeconds, "data-parallel traffic"},
      {p.optimizerSeconds - best.optimizerSeconds, "optimizer update"},
  };
  auto worst = std::max_element(
      std::begin(parts), std::end(parts),
      [](const auto &a, const auto &b) { return a.first < b.first; });
  double slower = p.stepSeconds - best.stepSeconds;
  if (slower <= 1e-3 * best.stepSeconds)
    return p.peakBytes > best.peakBytes
               ? "as fast, " + gib(p.peakBytes - best.peakBytes) +
                     " more memory"
               : "as fast";
  if (worst->first <= 0)
    return llvm::formatv("+{0:F1}%", 100 * slower / best.stepSeconds).str();
  return llvm::formatv("+{0:F1}%: {1} +{2:F1}%",
                       100 * slower / best.stepSeconds, worst->second,
                       100 * worst->first / best.stepSeconds)
      .str();
}

std::vector<int64_t> powersOfTwoUpTo(int64_t limit) {
  std::vector<int64_t> out;
  for (int64_t v = 1; v <= limit; v *= 2)
    out.push_back(v);
  return out;
}

FailureOr<PlanSearchResult> Search::run() {
  Clock::time_point start = Clock::now();
  PlanSearchResult result;
  const CompileOptions &base = request.base;
  const Machine &m = request.machine;
  auto main = imported.lookupSymbol<func::FuncOp>("main");
  if (!main || main.getNumArguments() == 0) {
    imported.emitError("plan: the model has no inputs to size its batch by");
    return failure();
  }
  auto first = dyn_cast<RankedTensorType>(main.getArgumentTypes()[0]);
  if (!first || first.getRank() == 0 || first.isDynamicDim(0)) {
    imported.emitError("plan: the first input's leading dimension (the "
                       "batch) is not known; bind it with --batch or --dim");
    return failure();
  }
  batch = first.getDimSize(0);
  int64_t devices = request.devices;
  if (batch > 1) {
    Block &body = main.getBody().front();
    llvm::DenseSet<Value> fromInputs =
        valuesReachedFrom(body, main.getArguments(),
                          [](Operation &op) { return isa<ParamOp>(op); });
    for (Operation &op : body) {
      for (Value r : op.getResults()) {
        if (fromInputs.contains(r))
          continue;
        auto type = dyn_cast<RankedTensorType>(r.getType());
        std::string node = getOnnxNodeOfLocation(op.getLoc()).second;
        if (type && type.getRank() > 1 && type.getDimSize(0) == batch &&
            !node.empty())
          perRowConstants.insert(node);
      }
    }
  }
  probeModule = imported;
  probeMicrobatches = batch;
  if (request.importOneRow) {
    std::string firstError;
    ScopedDiagnosticHandler quiet(imported.getContext(), [&](Diagnostic &d) {
      if (d.getSeverity() == DiagnosticSeverity::Error && firstError.empty())
        firstError = d.str();
      return success();
    });
    FailureOr<OwningOpRef<ModuleOp>> row = request.importOneRow();
    auto rowMain = succeeded(row) ? (**row).lookupSymbol<func::FuncOp>("main")
                                  : func::FuncOp();
    if (rowMain && rowMain.getNumArguments() > 0 &&
        cast<RankedTensorType>(rowMain.getArgumentTypes()[0]).getDimSize(0) ==
            1) {
      oneRow = std::move(*row);
      probeModule = *oneRow;
      probeMicrobatches = 1;
    }
  }

  std::vector<int64_t> tps =
      request.fixTp ? std::vector<int64_t>{base.tp}
                    : powersOfTwoUpTo(std::min(devices, m.devicesPerNode));
  std::vector<std::string> precisions =
      request.fixPrecision ? std::vector<std::string>{base.precision}
                           : std::vector<std::string>{"fp32", "bf16"};
  // Sequence parallelism splits the norms' and residuals' activations over
  // the tensor-parallel ranks for the same bytes sent.
  auto spsOf = [&](int64_t tp) {
    if (request.fixSp)
      return std::vector<bool>{base.sequenceParallel};
    return tp > 1 ? std::vector<bool>{false, true} : std::vector<bool>{false};
  };
  std::vector<std::string> recomputes =
      request.fixRecompute
          ? std::vector<std::string>{base.getRecompute()}
          : std::vector<std::string>{"none", "selective", "full"};
  // The probes, compiled ahead on a second thread while this one prices
  // (and this one compiles the next while it waits for one): first those
  // of the first recompute policy, which the walk below always asks for,
  // in its order; then the others (asked for only where saving everything
  // fits nowhere), each after its group's first has searched the tensor-
  // parallel layouts they reuse, so that the decisions do not depend on
  // how the threads interleave.
  std::vector<ProbeKey> order;
  for (bool first : {true, false})
    for (int64_t tp : tps)
      if (devices % tp == 0)
        for (const std::string &precision : precisions)
          for (bool sp : spsOf(tp))
            for (size_t k = 0; k < recomputes.size(); ++k)
              if ((k == 0) == first)
                order.emplace_back(tp, precision, recomputes[k], sp);
  if (order.size() > 1 && imported.getContext()->isMultithreadingEnabled() &&
      std::thread::hardware_concurrency() > 1)
    startProbesAhead(std::move(order));

  std::vector<sched::Policy> policies;
  if (request.fixSchedule)
    policies.push_back(*sched::parsePolicy(base.getSchedule()));
  else if (request.fixChunks && base.ppChunks > 1)
    policies.push_back(sched::Policy::Interleaved);
  else
    policies = {sched::Policy::OneFOneB, sched::Policy::ZeroBubbleH1,
                sched::Policy::GPipe, sched::Policy::Interleaved};

  std::vector<PlanPrediction> fitting, uncertain;
  std::optional<PlanPrediction> least;
  // Plans slower than this many plans predicted to fit can be neither
  // shown nor chosen: the walk below takes at most `top` and compiles at
  // most kFindChecks before it takes one.
  const int64_t kBound = 2 * (std::max<int64_t>(1, request.top) + 16);
  std::vector<double> fastestFits;
  // Why plans could not be priced: per reason, how many and one of them.
  std::map<std::string, std::pair<int64_t, std::string>> notes;
  auto note = [&](const std::string &reason, const std::string &example) {
    auto &entry = notes[reason];
    if (entry.first++ == 0)
      entry.second = example;
  };
  for (int64_t tp : tps) {
    if (devices % tp)
      continue;
    for (const std::string &precision : precisions)
      for (bool sp : spsOf(tp)) {
        // Recompute only where saving everything does not fit.
        for (const std::string &recompute : recomputes) {
          if (!probe(tp, precision, recompute, sp).error.empty()) {
            note(probe(tp, precision, recompute, sp).error,
                 "tp=" + std::to_string(tp) + (sp ? " sp " : " ") + precision +
                     " recompute=" + recompute);
            continue;
          }
          int64_t fitsBefore = static_cast<int64_t>(fitting.size());
          for (int64_t pp = 1; pp <= devices / tp; ++pp) {
            if ((devices / tp) % pp || (request.fixPp && pp != base.pp))
              continue;
            int64_t dp = devices / (tp * pp);
            if (request.fixDp && dp != base.dp)
              continue;
            if (batch % dp) {
              ++result.notDividing;
              note("dp does not divide the batch of " + std::to_string(batch),
                   "dp=" + std::to_string(dp));
              continue;
            }
            std::vector<int64_t> ms;
            for (int64_t mb : powersOfTwoUpTo(batch / dp))
              if ((batch / dp) % mb == 0)
                ms.push_back(mb);
            if ((batch / dp) % 3 == 0 || !llvm::is_contained(ms, batch / dp))
              ms.push_back(batch / dp);
            if (request.fixMicrobatches)
              ms = {base.microbatches};
            std::vector<int64_t> zeros = request.fixZero
                                             ? std::vector<int64_t>{base.zero}
                                             : std::vector<int64_t>{0, 1, 2, 3};
            for (int64_t micro : ms) {
              if ((batch / dp) % micro) {
                ++result.notDividing;
                continue;
              }
              for (sched::Policy policy :
                   pp == 1 ? std::vector<sched::Policy>{sched::Policy::OneFOneB}
                           : policies) {
                std::vector<int64_t> chunkList{1};
                if (policy == sched::Policy::Interleaved)
                  chunkList = request.fixChunks
                                  ? std::vector<int64_t>{base.ppChunks}
                                  : std::vector<int64_t>{2, 4};
                for (int64_t chunks : chunkList) {
                  if (policy == sched::Policy::Interleaved &&
                      (pp == 1 || micro % pp))
                    continue;
                  for (int64_t zero : zeros) {
                    if (zero > 0 && dp == 1)
                      continue;
                    Candidate c{tp,    pp,     chunks,    dp,        zero,
                                micro, policy, precision, recompute, sp};
                    CompileOptions check = optionsOf(base, c);
                    std::string conflict = check.verify();
                    if (!conflict.empty()) {
                      note(conflict, planFlags(check));
                      continue;
                    }
                    bool over = false;
                    std::string why;
                    std::optional<PlanPrediction> priced = price(c, over, why);
                    if (!priced && bounded) {
                      ++result.bounded;
                      continue;
                    }
                    if (!priced) {
                      note(why, planFlags(check));
                      continue;
                    }
                    ++result.priced;
                    if (over) {
                      ++result.overMemory;
                      priced->why = why;
                      if (!least || priced->peakBytes < least->peakBytes)
                        least = *priced;
                      // The numbers over-predict memory (the arena and the
                      // activations scale from one row): within twice the
                      // budget the compile decides.
                      if (priced->peakBytes <= 2 * budget())
                        uncertain.push_back(std::move(*priced));
                      continue;
                    }
                    // The kBound fastest plans predicted to fit bound the
                    // rest (a max-heap of their times).
                    fastestFits.push_back(priced->stepSeconds);
                    std::push_heap(fastestFits.begin(), fastestFits.end());
                    if (static_cast<int64_t>(fastestFits.size()) > kBound) {
                      std::pop_heap(fastestFits.begin(), fastestFits.end());
                      fastestFits.pop_back();
                    }
                    if (static_cast<int64_t>(fastestFits.size()) == kBound)
                      pruneAbove = fastestFits.front();
                    fitting.push_back(std::move(*priced));
                  }
                }
              }
            }
          }
          // Saving everything fits somewhere at this tp and precision: more
          // recomputation only costs time.
          if (!request.fixRecompute &&
              static_cast<int64_t>(fitting.size()) > fitsBefore)
            break;
        }
      }
  }
  stopProbesAhead(); // the checks compile on this thread alone
  int64_t predictedFits = static_cast<int64_t>(fitting.size());
  report(llvm::formatv("{0} plans priced, {1} fit, {2} more within twice "
                       "the memory (the compile decides), in {3:F1} s{4}",
                       result.priced, predictedFits, uncertain.size(),
                       secondsSince(start),
                       result.bounded
                           ? llvm::formatv("; {0} slower than {1} that fit "
                                           "by their compute alone, not "
                                           "simulated",
                                           result.bounded, kBound)
                                 .str()
                           : std::string())
             .str());
  std::move(uncertain.begin(), uncertain.end(), std::back_inserter(fitting));
  llvm::stable_sort(fitting,
                    [](const PlanPrediction &a, const PlanPrediction &b) {
                      // Equal times (ZeRO 1 and 2 often tie): the one needing
                      // less memory.
                      if (a.stepSeconds != b.stepSeconds)
                        return a.stepSeconds < b.stepSeconds;
                      return a.peakBytes < b.peakBytes;
                    });

  // The fastest compiled: the library's own analysis has the last word on
  // memory. A plan predicted over the budget is taken only once compiled;
  // when the checks are spent, only plans predicted to fit (the first of
  // them compiled all the same; --plan-check=0: none is).
  int64_t checked = 0;
  double checkSeconds = 0;
  std::vector<PlanPrediction> accepted;
  // Per family of plans (tp, precision, recompute, sp, virtual chunks):
  // the least compiled / predicted peak of its checks so far. A plan
  // predicted over the budget is compiled only if that ratio (else 1/2,
  // the model's largest over-prediction seen on small models) would bring
  // it within: at Llama sizes the predictions are within a few percent,
  // and eight compiles of 70B plans predicted at 1.2-1.4x the budget took
  // 25 s to confirm it.
  std::map<std::tuple<int64_t, std::string, std::string, bool, int64_t>, double>
      checkRatio;
  auto familyOf = [](const CompileOptions &o) {
    return std::make_tuple(o.tp, o.precision, o.recompute.value_or(""),
                           o.sequenceParallel, o.ppChunks);
  };
  auto mayFit = [&](const PlanPrediction &p) {
    auto it = checkRatio.find(familyOf(p.options));
    double ratio = it == checkRatio.end() ? 0.5 : it->second;
    return static_cast<double>(p.peakBytes) * ratio <=
           static_cast<double>(budget());
  };
  // Compiles `p`; whether the library's analysis fits it in the budget.
  auto compileFits = [&](PlanPrediction &p) {
    Clock::time_point t0 = Clock::now();
    std::string firstError;
    CompileOptions o = p.options;
    o.emitRemarks = false;
    o.planMemory = true;
    o.shardingMemo.reset(); // the real search, as the compile will run it
    int64_t compiled = -1;
    if (OwningOpRef<ModuleOp> copy = compileQuietly(imported, o, firstError))
      compiled = predictPeakBytes(*copy);
    ++checked;
    if (compiled > 0 && p.peakBytes > 0) {
      double ratio = static_cast<double>(compiled) / p.peakBytes;
      auto [it, inserted] = checkRatio.try_emplace(familyOf(o), ratio);
      it->second = std::min(it->second, ratio);
    }
    checkSeconds += secondsSince(t0);
    report(llvm::formatv("compiled {0}: {1} in {2:F1} s", planFlags(o),
                         compiled < 0 ? "failed: " + firstError
                                      : "peak " + gib(compiled) +
                                            " per rank (predicted " +
                                            gib(p.peakBytes) + ")",
                         secondsSince(t0))
               .str());
    if (compiled >= 0 && compiled <= budget()) {
      p.compiledPeakBytes = compiled;
      p.why.clear();
      return true;
    }
    if (compiled < 0 && result.compileFailures++ == 0)
      result.firstCompileFailure = planFlags(o) + ": " + firstError;
    note(compiled < 0 ? "dropped: its compile failed: " + firstError
                      : "dropped: compiled, it needs " + gib(compiled) +
                            " (predicted " + gib(p.peakBytes) + ")",
         planFlags(o));
    return false;
  };
  // Until one plan is taken, up to kFindChecks compiles look for it (a
  // plan predicted to fit is compiled all the same).
  constexpr int64_t kFindChecks = 16;
  constexpr double kCheapCheckSeconds = 10;
  std::vector<char> tried(fitting.size(), 0);
  for (size_t i = 0; i < fitting.size(); ++i) {
    PlanPrediction &p = fitting[i];
    if (static_cast<int64_t>(accepted.size()) >=
        std::max<int64_t>(1, request.top))
      break;
    bool predictedFit = p.peakBytes <= budget();
    if (!predictedFit && request.verify > 0 && !mayFit(p)) {
      ++result.skippedChecks;
      continue;
    }
    bool mustCheck = accepted.empty() && request.verify > 0 &&
                     (predictedFit || checked < kFindChecks / 2);
    // Beyond --plan-check, the printed plans are compiled too while the
    // checks have been cheap (a small model's take a fraction of a
    // second): their memory is then the library's own figure.
    bool cheap = request.verify > 0 && checkSeconds < kCheapCheckSeconds;
    if (checked >= request.verify && !mustCheck && !cheap) {
      if (predictedFit)
        accepted.push_back(std::move(p));
      continue;
    }
    tried[i] = 1;
    if (compileFits(p))
      accepted.push_back(std::move(p));
  }
  if (result.skippedChecks)
    report(llvm::formatv("{0} faster plans predicted over the budget not "
                         "compiled: their family's checks compiled at least "
                         "{1:P0} of the prediction",
                         result.skippedChecks,
                         llvm::min_element(checkRatio,
                                           [](auto &a, auto &b) {
                                             return a.second < b.second;
                                           })
                             ->second)
               .str());
  // The fastest plans did not fit: those predicted to need the least
  // memory, compiled in that order.
  if (accepted.empty() && request.verify > 0) {
    std::vector<size_t> order;
    for (size_t i = 0; i < fitting.size(); ++i)
      if (!tried[i])
        order.push_back(i);
    llvm::stable_sort(order, [&](size_t a, size_t b) {
      return fitting[a].peakBytes < fitting[b].peakBytes;
    });
    for (size_t k = 0; k < order.size() && checked < kFindChecks; ++k)
      if (compileFits(fitting[order[k]])) {
        accepted.push_back(std::move(fitting[order[k]]));
        break;
      }
  }
  for (size_t i = 0; i < accepted.size(); ++i) {
    if (i)
      accepted[i].why = whyBelow(accepted[i], accepted[0]);
    result.ranked.push_back(accepted[i]);
  }
  if (result.ranked.empty())
    result.leastMemory = least;
  for (const auto &[reason, entry] : notes)
    result.notes.push_back(
        entry.first == 1 ? entry.second + ": " + reason
                         : llvm::formatv("{0} plans: {1} (such as {2})",
                                         entry.first, reason, entry.second)
                               .str());
  result.searchSeconds = secondsSince(start);
  return result;
}

} // namespace

std::string mlir::pcc::planFlags(const CompileOptions &o) {
  std::string s = llvm::formatv("--tp={0} --pp={1}", o.tp, o.pp).str();
  if (o.ppChunks > 1)
    s += " --pp-chunks=" + std::to_string(o.ppChunks);
  s += " --dp=" + std::to_string(o.dp);
  if (o.dp > 1)
    s += " --zero=" + std::to_string(o.zero);
  s += " --microbatches=" + std::to_string(o.microbatches);
  if (o.pp > 1)
    s += " --schedule=" + o.getSchedule();
  s += " --recompute=" + o.getRecompute();
  s += " --precision=" + o.precision;
  if (o.sequenceParallel)
    s += " --sp";
  if (!o.ppCuts.empty())
    s += " --pp-cuts=" + llvm::join(o.ppCuts, ",");
  return s;
}

FailureOr<PlanSearchResult> mlir::pcc::searchPlans(ModuleOp imported,
                                                   const PlanRequest &request) {
  std::string machine = request.machine.verify();
  if (!machine.empty()) {
    imported.emitError("plan: machine '")
        << request.machine.name << "': " << machine;
    return failure();
  }
  if (request.devices < 1) {
    imported.emitError("plan: --devices must be at least 1");
    return failure();
  }
  if (request.machine.memoryBytes <= request.machine.reservedBytes) {
    imported.emitError("plan: no device memory to plan for (give "
                       "--device-memory)");
    return failure();
  }
  return Search(imported, request).run();
}

void mlir::pcc::printPlans(const PlanSearchResult &r, const PlanRequest &q,
                           llvm::raw_ostream &os) {
  const Machine &m = q.machine;
  os << llvm::formatv("pcc plan: {0} devices ({1}), {2} per device", q.devices,
                      m.name, gib(m.memoryBytes));
  if (m.reservedBytes)
    os << " less " << gib(m.reservedBytes) << " for the runtime";
  os << llvm::formatv("; {0} plans priced in {1:F1} s, {2} over memory\n",
                      r.priced, r.searchSeconds, r.overMemory);
  if (r.ranked.empty()) {
    os << "  no plan fits";
    if (r.leastMemory)
      os << ": the least memory, " << planFlags(r.leastMemory->options) << ", "
         << r.leastMemory->why << " of "
         << gib(m.memoryBytes - m.reservedBytes);
    os << "\n";
  } else {
    os << "  #  step (s)   MFU   peak/rank  compiled   bubble  "
          "sent/rank  plan\n";
    for (auto [i, p] : llvm::enumerate(r.ranked)) {
      double bubble = p.stepSeconds > 0 ? p.bubbleSeconds / p.stepSeconds : 0;
      os << llvm::formatv(
          "  {0,-2} {1,9:F6} {2,5:F1}% {3,10} {4,9} {5,7:F1}% {6,10}  {7}{8}\n",
          i + 1, p.stepSeconds, 100 * p.mfu, gib(p.peakBytes),
          p.compiledPeakBytes < 0 ? std::string("-") : gib(p.compiledPeakBytes),
          100 * bubble,
          llvm::formatv("{0:F1} MiB", p.movedBytes / 1048576.0).str(),
          planFlags(p.options), p.why.empty() ? "" : "  (" + p.why + ")");
    }
    const PlanPrediction &w = r.ranked.front();
    os << llvm::formatv("  chosen: {0}\n    predicted step {1:F6} s = compute "
                        "{2:F6} (tensor-parallel collectives {3:F6}, "
                        "weight-sized work {7:F6}) + "
                        "bubble {4:F6} + data-parallel {5:F6} + update "
                        "{6:F6}\n",
                        planFlags(w.options), w.stepSeconds, w.computeSeconds,
                        w.tpSeconds, w.bubbleSeconds, w.dpSeconds,
                        w.optimizerSeconds, w.weightWorkSeconds);
  }
  for (const std::string &note : r.notes)
    os << "  note: " << note << "\n";
}
