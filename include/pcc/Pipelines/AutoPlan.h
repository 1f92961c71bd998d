//===- AutoPlan.h - the automatic plan search -------------------*- C++ -*-===//
//
// pcc --auto and `pcc plan`: for a device count, a device's memory and a
// machine model, the parallel plan (tp, pp and its chunks, dp, ZeRO stage,
// micro-batches, schedule, recompute, precision) with the least predicted
// step time among those predicted to fit, and the runners-up.
//
// The search decomposes (docs/design-notes.md, "Automatic plans"): one
// probe compile per tensor-parallel degree, precision and recompute policy
// (the real pipeline on one micro-batch row, tp ranks, no pipeline or data
// parallelism) gives every op of the step priced on the machine, the
// step's memory pools and the forward's cut profile; each plan is then
// numbers alone: the stage cut by the cut search on the probe's profile,
// the micro-batch schedule replayed by the schedule simulator with its
// stages' F, B and W times and transfers, the data-parallel and ZeRO
// traffic on the machine's links, the memory per rank from the probe's
// pools by the plan's sharding and the schedule's in-flight counts. The
// winner is then compiled for real and its memory predicted by the
// analysis that sizes the library; one that does not fit is dropped for
// the next.
//
//===----------------------------------------------------------------------===//

#ifndef PCC_PIPELINES_AUTOPLAN_H
#define PCC_PIPELINES_AUTOPLAN_H

#include "pcc/Analysis/Machine.h"
#include "pcc/Pipelines/Compile.h"

#include "mlir/IR/BuiltinOps.h"
#include "llvm/Support/raw_ostream.h"

#include <functional>
#include <string>
#include <vector>

namespace mlir::pcc {

struct PlanRequest {
  /// Ranks the plan uses, all of them (tp x pp x dp).
  int64_t devices = 1;
  Machine machine;
  /// The user's options: the model's (training, loss, optimizer, target)
  /// and every plan dimension the user fixed.
  CompileOptions base;
  /// Which plan dimensions the user fixed (the rest are searched).
  bool fixTp = false, fixPp = false, fixDp = false, fixZero = false,
       fixMicrobatches = false, fixSchedule = false, fixChunks = false,
       fixRecompute = false, fixPrecision = false, fixSp = false;
  /// How many plans to report.
  int64_t top = 5;
  /// How many of the best plans to compile and check against the memory
  /// analysis of the library (the first that fits wins); 0: none.
  int64_t verify = 1;
  /// Imports the model with its batch dimension bound to one row (unset,
  /// or a model whose batch is not symbolic: the probes split the imported
  /// batch into micro-batches of one row).
  std::function<FailureOr<OwningOpRef<ModuleOp>>()> importOneRow;
  /// One line per step of the search (probes, plans priced, checks).
  std::function<void(const std::string &)> progress;
};

/// One plan and what it is predicted to cost.
struct PlanPrediction {
  CompileOptions options;
  double stepSeconds = 0;
  /// The busiest pipeline rank's compute, the pipeline's idle time on it,
  /// data-parallel (and ZeRO) collectives not hidden, and the update.
  double computeSeconds = 0, bubbleSeconds = 0, dpSeconds = 0,
         optimizerSeconds = 0;
  /// The tensor-parallel collectives inside the compute; and the work on
  /// weight-sized buffers on the busiest pipeline rank, which each
  /// micro-batch pays whatever its rows (a weight gathered over the tp
  /// ranks; the backward's slicing, summing and accumulating of the weight
  /// gradients).
  double tpSeconds = 0, weightWorkSeconds = 0;
  double mfu = 0;
  /// The largest rank's predicted peak and the bytes a rank sends per step.
  int64_t peakBytes = 0, movedBytes = 0;
  /// The peak the library's own analysis predicts, once compiled (-1: not
  /// checked).
  int64_t compiledPeakBytes = -1;
  /// Why it ranks below the winner, or why it was dropped.
  std::string why;
};

struct PlanSearchResult {
  /// Plans predicted to fit, fastest first (at most `top`).
  std::vector<PlanPrediction> ranked;
  /// The plan needing the least memory, when none fits.
  std::optional<PlanPrediction> leastMemory;
  int64_t priced = 0, overMemory = 0, notDividing = 0;
  /// Plans not simulated: their busiest rank's compute alone is slower
  /// than enough plans predicted to fit (none of them could be chosen).
  int64_t bounded = 0;
  /// Compile checks that failed (not for memory), and the first one's
  /// plan and error.
  int64_t compileFailures = 0;
  std::string firstCompileFailure;
  /// Plans predicted over the budget and not compiled: their family's
  /// checks showed the prediction too close to the compile for them to
  /// fit.
  int64_t skippedChecks = 0;
  /// What ruled out whole parts of the space ("tp=8: ...").
  std::vector<std::string> notes;
  double searchSeconds = 0;
};

/// Searches plans for an imported module (weights need not be readable).
/// Fails with an error emitted when no plan can be priced at all.
FailureOr<PlanSearchResult> searchPlans(ModuleOp imported,
                                        const PlanRequest &request);

/// The flags that select `o`'s plan ("--tp=2 --pp=2 --microbatches=4 ...").
std::string planFlags(const CompileOptions &o);

/// The table `pcc plan` and `pcc --auto` print.
void printPlans(const PlanSearchResult &result, const PlanRequest &request,
                llvm::raw_ostream &os);

} // namespace mlir::pcc

#endif // PCC_PIPELINES_AUTOPLAN_H
