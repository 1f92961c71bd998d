//===- PlanProbe.h - what one probe compile tells the plan search -*- C++
//-*-===//
//
// The plan search (AutoPlan.cpp) compiles the training step once per
// tensor-parallel degree, precision, recompute policy and --sp, on one row
// per micro-batch, and prices every plan with that key from what the
// compile shows: per-op times and FLOPs, bytes live across each position,
// saved activations, weights by where they are read, memory pools.
//
//===----------------------------------------------------------------------===//

#ifndef PCC_LIB_PIPELINES_PLANPROBE_H
#define PCC_LIB_PIPELINES_PLANPROBE_H

#include "pcc/Analysis/CutSearch.h"
#include "pcc/Analysis/Machine.h"
#include "pcc/Analysis/MemoryModel.h"
#include "pcc/Dialect/Pcc/IR/PccInterfaces.h"

#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/StringSet.h"

#include <array>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace mlir::pcc::autoplan {

/// Prices ops on one rank of a machine.
struct Pricer {
  const Machine &machine;
  /// The share of a CPU machine's cores each rank gets.
  double share = 1;

  double collective(CollectiveKind kind, int64_t bytes, int64_t ranks,
                    bool intra) const {
    if (ranks <= 1 || bytes <= 0)
      return 0;
    double part = static_cast<double>(ranks - 1) / static_cast<double>(ranks);
    if (kind == CollectiveKind::AllReduce)
      part *= 2;
    double bw = intra ? machine.intraBandwidth : machine.interBandwidth;
    double latency =
        intra ? machine.intraLatencyFor(ranks) : machine.interLatency;
    return latency + part * static_cast<double>(bytes) / (bw * share);
  }

  /// Seconds of one top-level op of a phase; its collective's bytes moved
  /// are added to `moved`.
  /// `fixed` gets the part that does not grow with the rows (the kernel's
  /// launch, the collective's latency).
  double op(Operation *op, int64_t tp, double &moved, double &fixed) const;
};

/// A buffer the probe's memory plan gave a phase's result: its op and the
/// last op reading it (phase order), the forward positions of its op and
/// of its first and last readers, its bytes at one row and whether they
/// grow with the rows; whether the phase returns it (saved for a later
/// phase) and whether it is a weight gradient on its way into the state
/// (1; 2 for a tied weight's, which has several); whether a reader sums a
/// tied weight's contributions (not counted among its readers: a stage
/// sums its own, so the buffer lives to its stage's end); whether only a
/// program of several rows has it (under --sp, the copy a collective's
/// operand or result is transposed into, a reshape at one row).
struct ArenaBuffer {
  uint32_t op = 0, dies = 0;
  size_t pos = 0, firstReader = 0, lastReader = 0;
  int64_t bytes = 0;
  bool perRow = false, escapes = false, sumsTied = false, manyRows = false;
  /// A weight's read (no buffer in the probe): under ZeRO 3 its gathered
  /// piece, from the read to its last reader.
  bool gathered = false;
  /// A weight gradient's product: where its last operand is made, where a
  /// pipeline stage computes it (pcc-merge-weight-gradients puts each W op
  /// as early as its operands allow, its accumulate right after).
  std::optional<uint32_t> mergedAt;
  uint8_t intoState = 0;
  /// A gradient the CPU back end computes into its state however the
  /// gradients accumulate (an embedding's scatter-add, a widening cast):
  /// a buffer only where it is reduce-scattered whole (replayArena's
  /// gradients 3).
  bool wholeForScatter = false;
  /// A gradient written into a 16-bit state (the one-row probe's, written
  /// once): widened to f32 where it is reduce-scattered whole.
  bool widened = false;
};

/// The byte alignment of the compile's memory plan (pcc-plan-memory's).
inline constexpr int64_t kArenaAlignment = 64;

/// What one probe compile tells: prefix sums over the forward phase's
/// positions (position c is before op c, as in CutProfile), the step's
/// totals, and its memory pools, all for a micro-batch of one row.
struct Probe {
  std::string error;           // why it could not be compiled ("" when it was)
  bool sequenceParallel = false; // compiled with --sp
  CutProfile cut;              // step seconds, FLOPs, crossing bytes
  std::vector<double> forward; // forward seconds
  /// The parts of forward and of the backward's share that do not grow
  /// with the rows (launches, latencies).
  std::vector<double> forwardFixed, backwardFixed;
  std::vector<double> backward; // the backward's share (products twice)
  /// The forward's ops that no batch input reaches (a weight gathered over
  /// the tp ranks for a product): a micro-batch's whatever its rows.
  std::vector<double> forwardWeight;
  std::vector<double> weightGrad;
  /// Prefix sums of the saved activations read where they are made; and
  /// those read elsewhere too, with the positions of their readers: each
  /// stage holding a reader saves one (a stage's input, a mask).
  std::vector<int64_t> saved;
  /// Per position (n + 1 entries): under --sp, the bytes an all-gather
  /// right after it adds to the value crossing there (a final norm's
  /// output, gathered for the head). The probe hands the value on split;
  /// a stage planned on its own may gather it first and send it whole.
  std::vector<int64_t> gatheredAt;
  std::vector<std::pair<int64_t, std::vector<size_t>>> savedReads;
  /// The same for what a micro-batch saves whatever its rows (made from
  /// weights and constants alone, unless the whole batch's program has it
  /// per row).
  std::vector<int64_t> savedFixed;
  std::vector<std::pair<int64_t, std::vector<size_t>>> savedReadsFixed;
  /// Prefix sums per op: the bytes a stage's B keeps for its W when W runs
  /// later (zb-h1): the output cotangent of every op reading a weight (a
  /// product, a norm's scale, a bias), and its other operands where the
  /// forward does not save them (recomputed in B).
  std::vector<int64_t> wgradSet;
  /// Per weight: its bytes and the positions of the ops reading it.
  std::vector<std::pair<int64_t, std::vector<size_t>>> weights;
  /// Per weight (as `weights`): a weight the probe keeps whole over its
  /// tp ranks though a dimension divides over them has its split bytes
  /// here (0 otherwise), and the positions of its lookups (gathers). A
  /// weight on several stages takes the layout its first stage plans
  /// alone (pcc-partition-training): a tied table that stage only looks
  /// up is split there, and the later stages gather it whole.
  struct WeightSplit {
    int64_t splitBytes = 0;
    std::vector<size_t> lookups;
  };
  std::vector<WeightSplit> splits;
  /// The same for the 16-bit weight copies (mixed precision), which only
  /// the stages whose products read them hold.
  std::vector<std::pair<int64_t, std::vector<size_t>>> copies;
  /// All the weights' f32 bytes, the largest weight's, and the largest
  /// 16-bit copy's (mixed precision).
  int64_t weightBytes = 0, largestWeight = 0, largestCopy = 0;
  double backwardSeconds = 0, backwardFixedSeconds = 0, optimizerSeconds = 0;
  /// The part of backwardSeconds that handles the weights' gradients on
  /// their way to the state (a whole table's gradient sliced to this
  /// rank's rows, a tied weight's two summed, the accumulation): a
  /// micro-batch's whatever its rows, so a plan's micro-batch count, not
  /// its rows, multiplies it.
  double backwardWeightSeconds = 0;
  double tpSeconds = 0, tpBytes = 0; // per micro-batch, forward + backward
  double flops = 0;                  // per micro-batch, forward + backward
  StepMemory pools;
  /// The step's other phases' largest arena (the update, zero-grad).
  int64_t stepArena = 0;
  /// The forward and the backward phase's buffers (the backward's ops at
  /// their ONNX node's forward position), which replayArena lays out
  /// again for a stage and a plan's rows.
  std::array<std::vector<ArenaBuffer>, 2> arenaBuffers;
  /// The largest gradient of a weight with several contributions.
  int64_t tiedGrad = 0;
  /// The bytes of the gradients the probe keeps in bf16
  /// (pcc-bf16-gradients: written once, by one micro-batch); a plan that
  /// accumulates them (micro-batches, stages, data parallelism) keeps them
  /// in f32, twice these bytes.
  int64_t narrowGrads = 0;
  std::vector<size_t> candidates; // where a stage cut may go
  /// Per candidate position: the ONNX node to cut after (--pp-cuts), or ""
  /// where no name picks that position out.
  std::vector<std::string> cutNames;
  size_t size() const { return forward.empty() ? 0 : forward.size() - 1; }
};

/// The arena of a stage's micro-batch phases (the forward positions
/// [lo, hi)) at `rows` rows a micro-batch: the probe's buffers of those ops
/// laid out again as the compile's memory plan lays them out (best fit in
/// program order, so that a buffer fitting in no freed gap grows the arena
/// as it does there), each per-row buffer grown by the rows. The weight
/// gradients on their way into the state take a buffer by `gradients`: 2
/// every one (they accumulate), 1 a tied weight's second contribution
/// only, 0 none, 3 every one and a tied weight's contributions summed
/// whole at the phase's end (ZeRO 2 and 3 without a pipeline); `gathers`:
/// each weight read gathered into a buffer (ZeRO 3).
double replayArena(const Probe &p, size_t lo, size_t hi, double rows,
                   int gradients, bool gathers = false);

/// Reads a compiled probe module.
void readProbe(ModuleOp module, const Pricer &pricer, int64_t tp,
               const llvm::StringSet<> &perRow, Probe &p);

} // namespace mlir::pcc::autoplan

#endif // PCC_LIB_PIPELINES_PLANPROBE_H
