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
    double latency = intra ? machine.intraLatency : machine.interLatency;
    return latency + part * static_cast<double>(bytes) / (bw * share);
  }

  /// Seconds of one top-level op of a phase; its collective's bytes moved
  /// are added to `moved`.
  /// `fixed` gets the part that does not grow with the rows (the kernel's
  /// launch, the collective's latency).
  double op(Operation *op, int64_t tp, double &moved, double &fixed) const;
};

/// What one probe compile tells: prefix sums over the forward phase's
/// positions (position c is before op c, as in CutProfile), the step's
/// totals, and its memory pools, all for a micro-batch of one row.
struct Probe {
  std::string error;           // why it could not be compiled ("" when it was)
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
  std::vector<std::pair<int64_t, std::vector<size_t>>> savedReads;
  /// Prefix sums per op: the bytes a stage's B keeps for its W when W runs
  /// later (zb-h1): the output cotangent of every op reading a weight (a
  /// product, a norm's scale, a bias), and its other operands where the
  /// forward does not save them (recomputed in B).
  std::vector<int64_t> wgradSet;
  /// Per weight: its bytes and the positions of the ops reading it.
  std::vector<std::pair<int64_t, std::vector<size_t>>> weights;
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
  /// The per-micro-batch phases' largest arena at one row, less the
  /// buffer of an accumulated weight gradient (`gradBuffer`, the largest,
  /// which does not grow with the rows); the other phases' largest arena.
  int64_t rowArena = 0, stepArena = 0, gradBuffer = 0;
  /// The largest gradient of a weight with several contributions.
  int64_t tiedGrad = 0;
  /// The bytes of the gradients the probe keeps in bf16
  /// (pcc-bf16-gradients: written once, by one micro-batch); a plan that
  /// accumulates them (micro-batches, stages, data parallelism) keeps them
  /// in f32, twice these bytes.
  int64_t narrowGrads = 0;
  /// The forward phase's largest buffer made from the weights alone.
  int64_t weightOnly = 0;
  std::vector<size_t> candidates; // where a stage cut may go
  /// Per candidate position: the ONNX node to cut after (--pp-cuts), or ""
  /// where no name picks that position out.
  std::vector<std::string> cutNames;
  size_t size() const { return forward.empty() ? 0 : forward.size() - 1; }
};

/// Reads a compiled probe module.
void readProbe(ModuleOp module, const Pricer &pricer, int64_t tp, bool cpu,
               const llvm::StringSet<> &perRow, Probe &p);

} // namespace mlir::pcc::autoplan

#endif // PCC_LIB_PIPELINES_PLANPROBE_H
