//===- MemoryFit.cpp - the --mem-cap fit ----------------------------------===//
//
// The least activation recomputation whose predicted memory fits on every
// pipeline rank. Every stage starts saving everything; each rank over the
// cap moves its stages one step (none, selective, full) until it fits.
// Before recomputing, the LM head fused with its cross-entropy is tried
// (unless --fuse-cross-entropy says): one more product of the head instead
// of the logits and their gradient. Then ZeRO's cheaper savings, each
// costing only traffic: under ZeRO 3 the weights gathered in every phase
// instead of kept through the step, then under ZeRO 2 and 3 the gradients
// reduce-scattered in every W phase instead of once per step (each unless the
// user chose). ZeRO 3's prefetch (one more gathered weight alive, no more
// bytes) is given up before the gradients are reduce-scattered every
// micro-batch.
//
//===----------------------------------------------------------------------===//

#include "MemoryFit.h"

#include "pcc/Analysis/MemoryModel.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/PassManager.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/raw_ostream.h"

#include <tuple>

using namespace mlir;
using namespace mlir::pcc;

namespace {

std::string mib(int64_t bytes) {
  return llvm::formatv("{0:F3} MiB", bytes / 1048576.0).str();
}

class MemoryFitPass
    : public PassWrapper<MemoryFitPass, OperationPass<ModuleOp>> {
public:
  MLIR_DEFINE_EXPLICIT_INTERNAL_INLINE_TYPE_ID(MemoryFitPass)

  explicit MemoryFitPass(CompileOptions options)
      : options(std::move(options)) {}

  StringRef getArgument() const override { return "pcc-memory-fit"; }
  StringRef getDescription() const override {
    return "chooses recomputation and ZeRO's trades until every pipeline "
           "rank's predicted peak fits --mem-cap, then runs the compile";
  }

  void runOnOperation() override {
    std::optional<MemoryChoices> chosen = choose(getOperation());
    if (!chosen)
      return signalPassFailure();
    OpPassManager rest(ModuleOp::getOperationName());
    buildCompilePasses(rest, options, *chosen);
    if (failed(runPipeline(rest, getOperation())))
      signalPassFailure();
  }

private:
  void report(const std::string &line) const {
    if (options.progress)
      options.progress(line);
    else
      llvm::errs() << "pcc: " << line << "\n";
  }

  /// The predicted peak of each pipeline rank with these choices, from a
  /// copy of the module; empty after an error.
  std::vector<PipelineRankMemory> predict(ModuleOp module,
                                          const MemoryChoices &choices) {
    CompileOptions trialOptions = options;
    trialOptions.emitRemarks = false; // the final run makes them
    trialOptions.planMemory = true;
    OwningOpRef<ModuleOp> trial(cast<ModuleOp>(module->clone()));
    PassManager pm(module.getContext(), ModuleOp::getOperationName());
    buildCompilePasses(pm, trialOptions, choices);
    if (failed(pm.run(*trial)))
      return {};
    return predictPipelineMemory(*trial);
  }

  std::string describe(const MemoryChoices &c, bool tryHead, bool tryPrefetch,
                       bool pipelinedZero) const {
    std::string text = "--recompute=" + c.recompute;
    if (tryHead && c.fuseHeadBytes == 0)
      text += ", the LM head fused with its loss";
    if (options.zero == 3 && options.dp > 1)
      text += c.reshardAfterForward
                  ? ", ZeRO-3 weights gathered in every phase"
                  : ", ZeRO-3 weights kept gathered through the step";
    if (tryPrefetch && c.reshardAfterForward)
      text += c.prefetch ? " (prefetched)" : " (not prefetched)";
    if (pipelinedZero)
      text += c.reduceEachMicrobatch
                  ? ", gradients reduce-scattered every micro-batch"
                  : ", gradients reduce-scattered once per step";
    return text;
  }

  std::optional<MemoryChoices> choose(ModuleOp module) {
    static const char *kLevels[] = {"none", "selective", "full"};
    const CompileOptions &o = options;
    int64_t cap = o.memCapBytes, stages = o.getNumStages();
    MemoryChoices defaults = getDefaultMemoryChoices(o);
    // What ZeRO may trade for memory, unless the user said, in the order of
    // the bytes each moves per step: ZeRO 3's weights kept gathered through
    // the step (one gather per weight and step) or gathered in every phase
    // (about 3m); ZeRO 2 and 3's gradients reduce-scattered once per step
    // or in every micro-batch's W (m times).
    bool tryKeeping = o.zero == 3 && o.dp > 1 && !o.reshardAfterForward;
    bool pipelinedZero = o.pp > 1 && o.zero >= 2 && o.dp > 1;
    bool tryStep = pipelinedZero && !o.zeroGradSync;
    // A prefetch only acts where the weights are gathered in every phase.
    bool tryPrefetch =
        o.zero == 3 && o.dp > 1 && defaults.prefetch > 0 && !o.zeroPrefetch;
    // The LM head fused with the loss (a cross-entropy's), unless the user
    // said.
    bool tryHead = !o.fuseCrossEntropy && o.getLoss() == "cross_entropy";
    // (reshard, each micro-batch, prefetch)
    std::vector<std::tuple<bool, bool, int64_t>> trades;
    for (bool r : tryKeeping ? std::vector<bool>{false, true}
                             : std::vector<bool>{defaults.reshardAfterForward})
      for (bool e : tryStep
                        ? std::vector<bool>{false, true}
                        : std::vector<bool>{defaults.reduceEachMicrobatch}) {
        trades.push_back({r, e, defaults.prefetch});
        if (r && tryPrefetch)
          trades.push_back({r, e, 0});
      }
    size_t trade = 0;
    std::vector<int> level(static_cast<size_t>(stages), 0);
    MemoryChoices c = defaults;
    // The first trial as the options say; then, from the second on, the
    // head fused.
    bool headTried = !tryHead, headTrial = false;
    size_t last = static_cast<size_t>((stages - 1) % o.pp);
    std::string lastPeaks;
    int64_t lastHeadRank = 0;
    while (true) {
      std::tie(c.reshardAfterForward, c.reduceEachMicrobatch, c.prefetch) =
          trades[trade];
      c.recompute.clear();
      for (int l : level)
        c.recompute +=
            (c.recompute.empty() ? "" : ",") + std::string(kLevels[l]);
      std::vector<PipelineRankMemory> ranks = predict(module, c);
      if (ranks.empty())
        return std::nullopt;
      std::string peaks;
      bool fits = true;
      for (auto [r, mem] : llvm::enumerate(ranks)) {
        peaks += (r ? ", " : "") + mib(mem.total());
        fits &= mem.total() <= cap;
      }
      // A model without an LM head to fuse predicts the same: that trial
      // is not reported.
      if (!headTrial || peaks != lastPeaks)
        report("--mem-cap " + mib(cap) + ": " +
               describe(c, tryHead, tryPrefetch, pipelinedZero) + " predicts " +
               peaks + " on pipeline ranks 0 to " +
               std::to_string(ranks.size() - 1) + (fits ? ": fits" : ""));
      lastPeaks = peaks;
      // The fused head is kept only where it lowers its rank's peak (it
      // can raise it: under a pipeline, the weight's gradient waits from B
      // to W where the unfused head's logits gradient is smaller).
      if (headTrial && !fits && last < ranks.size() &&
          ranks[last].total() >= lastHeadRank) {
        c.fuseHeadBytes = defaults.fuseHeadBytes;
        tryHead = false;
      }
      headTrial = false;
      if (fits)
        return c;
      // The head is on the rank of the last stage: fused only where that
      // rank is over the cap.
      if (!headTried) {
        headTried = true;
        if (last < ranks.size() && ranks[last].total() > cap) {
          lastHeadRank = ranks[last].total();
          c.fuseHeadBytes = 0;
          headTrial = true;
          continue; // then ZeRO's trades and recompute, with the head fused
        }
      }
      if (trade + 1 < trades.size()) {
        ++trade;
        continue; // then recompute, with the last trade
      }
      for (auto [r, mem] : llvm::enumerate(ranks)) {
        if (mem.total() <= cap)
          continue;
        bool rankMoved = false;
        for (int64_t k = r; k < stages; k += o.pp)
          if (level[k] < 2) {
            ++level[k];
            rankMoved = true;
          }
        if (!rankMoved) {
          emitError(UnknownLoc::get(module.getContext()))
              << "--mem-cap " << mib(cap) << " cannot be met: pipeline rank "
              << r << " needs " << mib(mem.total())
              << " even with --recompute=full (" << mib(mem.state)
              << " of it model state; add ranks with --pp, --tp or --dp "
                 "--zero, or fewer micro-batches in flight)";
          return std::nullopt;
        }
      }
    }
  }

  CompileOptions options;
};

} // namespace

std::unique_ptr<Pass>
mlir::pcc::createMemoryFitPass(const CompileOptions &options) {
  return std::make_unique<MemoryFitPass>(options);
}
