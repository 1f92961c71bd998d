//===- Profile.h - pcc-run --profile: where a run's time goes ---*- C++ -*-===//
//
// The generated run functions mark the start of every op with its static
// profile site (pcc_profile_site, ABI 15) when the run context carries a
// profiler. Profiler turns the marks into time per op: on a CUDA device it
// waits for the queued work at every mark, so that each op's time is its
// own. The records of every rank, gathered on rank 0, become tables (by op
// kind, by phase, by rank, the costliest ops) with the achieved GFLOP/s
// and GB/s against peaks measured on this machine, and a Chrome trace of
// the last profiled run's ops.
//
//===----------------------------------------------------------------------===//

#ifndef PCC_TOOLING_PROFILE_H
#define PCC_TOOLING_PROFILE_H

#include "pcc/runtime/Communicator.h"
#include "pcc/runtime/Device.h"
#include "pcc/runtime/ModelAbi.h"
#include "pcc/runtime/Result.h"

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace pccrun {

/// One profile site's totals over the profiled runs of one rank.
struct ProfileRecord {
  std::string op, node, function, dtype;
  double flops = 0, bytes = 0; // of one call
  int64_t calls = 0;
  double seconds = 0;
  int rank = 0;
};

/// One op of the last profiled run, in seconds from the run's start.
struct ProfileEvent {
  const pcc_profile_site *site;
  double start, duration;
};

class Profiler {
public:
  /// `sync` waits for the work queued on the device (null on the CPU).
  explicit Profiler(std::function<void()> sync);
  Profiler(const Profiler &) = delete;
  Profiler &operator=(const Profiler &) = delete;

  /// What the run contexts carry (pccrt::setRunProfile).
  const pcc_profile *abi() const { return &table; }

  /// Opens and closes a profiled run (an inference run, a training step):
  /// marks outside such a run (warm-up) are not counted, and each run's
  /// events replace the last one's.
  void beginRun();
  void endRun();
  int64_t runs() const { return numRuns; }
  /// The profiled runs' wall time, in seconds.
  double wallSeconds() const { return wall; }

  std::vector<ProfileRecord> records(int rank) const;
  const std::vector<ProfileEvent> &lastRunEvents() const { return events; }

private:
  using Clock = std::chrono::steady_clock;
  static void markThunk(void *state, const pcc_profile_site *site);
  void mark(const pcc_profile_site *site);

  std::function<void()> sync;
  pcc_profile table;
  bool inRun = false;
  const pcc_profile_site *current = nullptr;
  Clock::time_point since, runStart;
  struct Totals {
    int64_t calls = 0;
    double seconds = 0;
  };
  std::unordered_map<const pcc_profile_site *, Totals> totals;
  std::vector<const pcc_profile_site *> order; // first seen first
  std::vector<ProfileEvent> events;
  int64_t numRuns = 0;
  double wall = 0;
};

/// The machine's rates, measured now (0: not measured): an fp32 and a bf16
/// 1024^3 product through the runtime's kernels (GFLOP/s), and a 128 MiB
/// copy through the runtime's copy kernel (GB/s, bytes read plus written).
struct MachinePeaks {
  double gemmF32 = 0, gemmBf16 = 0, copy = 0;
};
MachinePeaks measureCpuPeaks(pccrt::Device &device);

/// Every rank's records, on rank 0 (the others get an empty list).
pccrt::Result<std::vector<ProfileRecord>>
gatherProfile(pccrt::Communicator &world,
              const std::vector<ProfileRecord> &mine);

/// What the report says around its tables.
struct ProfileSummary {
  /// "training steps", "runs".
  std::string unit;
  int64_t runs = 0;
  /// Rank 0's wall time of the profiled runs, seconds.
  double wallSeconds = 0;
  int ranks = 1;
  /// "cpu", or the CUDA device's name.
  std::string device;
  bool cuda = false;
  MachinePeaks peaks;
};

/// The tables: by op kind and element type, by function (phase), by rank
/// (with several), and the `top` costliest ops.
std::string profileReport(const std::vector<ProfileRecord> &records,
                          const ProfileSummary &summary, int top = 20);

/// The last profiled run's ops as Chrome-trace JSON (chrome://tracing,
/// Perfetto): one row per function.
pccrt::Status writeProfileTrace(const std::string &path,
                                const std::vector<ProfileEvent> &events);

/// pcc-run --profile: a profiler that every run context of this process
/// carries from now on.
std::unique_ptr<Profiler> startProfiling(pccrt::Device &device);
/// Ends profiling: every rank's records go to rank 0 (`world` null: one
/// rank), which measures the machine's peaks (CPU), prints the report and
/// writes the trace of its last profiled run (`tracePath` empty: none).
/// Every rank calls it.
pccrt::Status finishProfiling(Profiler &profiler, pccrt::Device &device,
                              pccrt::Communicator *world,
                              const std::string &unit,
                              const std::string &tracePath);

} // namespace pccrun

#endif // PCC_TOOLING_PROFILE_H
