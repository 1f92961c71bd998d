//===- Schedule.h - pipeline micro-batch schedules ----------------*- C++
//-*-===//
//
// For p pipeline ranks and m micro-batches, the order in which each rank
// runs its work: forward (F), backward for inputs (B) and weight gradient
// (W) of each micro-batch on each of its model chunks, with the sends and
// receives between neighbouring stages. Four policies:
//
//   gpipe        all forwards, then all backwards (peak m in flight)
//   1f1b         PipeDream-Flush: warm up, then one forward per backward
//                (peak p in flight, same bubble as GPipe)
//   interleaved  1f1b over v chunks per rank (virtual stage c*p + r on rank
//                r); the bubble shrinks by v. Training lists exchange
//                between units as Megatron-LM does (see generate)
//   zb-h1        1f1b with B and W split and each W moved into the idle
//                time after its B (about a third of 1f1b's bubble, same
//                peak)
//
// A schedule is a plain per-rank instruction list: the compiler emits it
// into the model library, the runtime executes it, and `simulate` replays
// it with given durations to check every dependency and measure bubbles.
// Inference runs the forward-only form (F and the activation transfers).
//
// No MLIR here: the library is shared by pcc and the unit tests.
//
//===----------------------------------------------------------------------===//

#ifndef PCC_SCHEDULE_SCHEDULE_H
#define PCC_SCHEDULE_SCHEDULE_H

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace pcc::schedule {

enum class Policy { GPipe, OneFOneB, Interleaved, ZeroBubbleH1 };

/// "gpipe", "1f1b", "interleaved", "zb-h1".
const char *policyName(Policy policy);
std::optional<Policy> parsePolicy(const std::string &name);

enum class Op : uint8_t {
  Forward,      // F: the chunk's forward pass on one micro-batch
  Backward,     // B: gradients of the chunk's inputs
  WeightGrad,   // W: gradients of the chunk's weights
  SendForward,  // activations to the next virtual stage
  RecvForward,  // activations from the previous virtual stage
  SendBackward, // input gradients to the previous virtual stage
  RecvBackward, // output gradients from the next virtual stage
};

/// "F", "B", "W", "send_fwd", "recv_fwd", "send_bwd", "recv_bwd".
const char *opName(Op op);

/// The ops in the order of the model ABI's codes (enum pcc_pipeline_op in
/// pcc/runtime/ModelAbi.h): kAbiOps[code] is that code's op. The library
/// emitter writes the codes; pcc-run reads them back.
inline constexpr Op kAbiOps[] = {Op::Forward,      Op::SendForward,
                                 Op::RecvForward,  Op::Backward,
                                 Op::WeightGrad,   Op::SendBackward,
                                 Op::RecvBackward};
inline constexpr int32_t kNumAbiOps = sizeof(kAbiOps) / sizeof(kAbiOps[0]);
/// The model ABI's code of `op`.
constexpr int32_t abiCode(Op op) {
  for (int32_t code = 0; code < kNumAbiOps; ++code)
    if (kAbiOps[code] == op)
      return code;
  return -1;
}

struct Instr {
  Op op;
  int32_t microbatch;
  int32_t chunk; // model chunk on this rank (0 unless interleaved)
  /// For sends and receives: the pipeline rank on the other end.
  int32_t peer = -1;
  bool operator==(const Instr &o) const {
    return op == o.op && microbatch == o.microbatch && chunk == o.chunk &&
           peer == o.peer;
  }
};

struct Options {
  Policy policy = Policy::OneFOneB;
  int32_t stages = 1;       // p: pipeline ranks
  int32_t microbatches = 1; // m
  int32_t chunks = 1;       // v: model chunks per rank (interleaved only)
  bool forwardOnly = false; // inference: F and activation transfers only
};

struct Schedule {
  Options options;
  /// Per pipeline rank, in execution order.
  std::vector<std::vector<Instr>> ranks;

  /// One line per rank: "rank 0: F0 F1 send_fwd0>1 ...".
  std::string describe() const;
  /// Rank r's list as describe() writes it, without the "rank r: ".
  std::string describeRank(size_t r) const;
};

/// The model stage that chunk `chunk` of pipeline rank `rank` holds, with
/// `ranks` pipeline ranks (Megatron's interleaving: chunk * ranks + rank).
inline int32_t virtualStage(int32_t ranks, int32_t rank, int32_t chunk) {
  return chunk * ranks + rank;
}

/// One instruction as describe() writes it ("F3", "send_fwd3>1",
/// "recv_fwd2.1<0" for chunk 1), or nullopt when `text` is not one.
std::optional<Instr> parseInstr(const std::string &text);

/// The schedule for `options`, or an error naming what does not fit (e.g.
/// interleaving needs m to be a multiple of p).
struct GenerateResult {
  std::optional<Schedule> schedule;
  std::string error;
};
GenerateResult generate(const Options &options);

/// Durations of the work, in any unit. Sends and receives take
/// `transfer` between the end of the sender's compute and the start of the
/// receiver's.
struct Durations {
  double forward = 1, backward = 1, weightGrad = 1, transfer = 0;
  /// Per virtual stage, when given (a measured run's stages differ):
  /// these replace forward, backward and weightGrad for that stage.
  std::vector<double> forwardOf, backwardOf, weightGradOf;
};

struct Interval {
  Instr instr;
  double start, end;
};

struct Simulation {
  double makespan = 0;
  /// Per rank: compute intervals (F, B, W) in time order.
  std::vector<std::vector<Interval>> timeline;
  /// Per rank: 1 - busy / makespan.
  std::vector<double> bubbleFraction;
  /// Per rank: the most micro-batch chunks forwarded but not yet backward
  /// (whose activations are held), or forwarded at all when forward-only.
  std::vector<int32_t> peakInFlight;
  double meanBubbleFraction() const;
  /// The bubble of the rank computing longest (the least idle), the one
  /// that sets the step.
  double busiestBubbleFraction() const;
};

/// Replays `schedule` with `durations`: each rank runs its list in order,
/// and an instruction starts when its rank is free and what it depends on
/// has finished (F of the previous virtual stage, B of the next, F before
/// B, B before W). A receive is posted: it waits for nothing, and the F
/// or B that reads it starts a transfer after the matching send (which
/// must be posted before it on its rank). Checks that every piece of work
/// appears exactly once and that sends and receives pair up.
struct SimulateResult {
  std::optional<Simulation> simulation;
  std::string error; // e.g. "deadlock: rank 1 waits at recv_fwd(mb 3) ..."
};
SimulateResult simulate(const Schedule &schedule,
                        const Durations &durations = {});

/// Checks that `schedule` also runs on a rendezvous transport (NCCL, where
/// a send may wait until its receive is posted) when each run of transfers
/// between two computes on a rank is issued as one group, as the runtime
/// does (ncclGroupStart/End), on a queue of its own. Each rank has two
/// queues: its groups run in order, each entered once the computes before
/// it in the list are done and completed once every transfer in it has
/// its partner in a group the peer has entered; its computes run in order,
/// each once the groups holding its receives have completed. Returns "" or
/// the deadlock, naming the group (or compute) each rank waits in. Every
/// list `generate` makes passes; interleaved training lists with each
/// receive just before its compute would not.
std::string checkGroupedTransfers(const Schedule &schedule);

/// The bubble fraction of GPipe and 1F1B, (p - 1) / (m + p - 1), and of
/// interleaved 1F1B with v chunks, (p - 1) / (v m + p - 1).
double analyticBubbleFraction(const Options &options);

} // namespace pcc::schedule

#endif // PCC_SCHEDULE_SCHEDULE_H
