//===- PlanSharding.cpp - choose every weight's layout over a mesh axis --===//

#include "pcc/Dialect/Pcc/IR/Contracts.h"
#include "pcc/Transforms/Passes.h"
#include "pcc/Transforms/Sharding.h"
#include "pcc/Transforms/Training.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/FormatVariadic.h"

#include <condition_variable>
#include <mutex>

namespace mlir::pcc {
#define GEN_PASS_DEF_PLANSHARDING
#include "pcc/Transforms/Passes.h.inc"

struct ShardingMemo {
  std::mutex mutex;
  std::condition_variable searched;
  llvm::StringMap<llvm::StringMap<Shard>> decisions;
  /// Keys a thread is searching: another asking for one waits for it, so
  /// that every probe gets the first search's decisions, however the
  /// threads interleave.
  llvm::StringSet<> searching;
};
} // namespace mlir::pcc

using namespace mlir;
using namespace mlir::pcc;

namespace {

std::string shapeString(RankedTensorType type) {
  std::string s;
  for (int64_t d : type.getShape())
    s += (s.empty() ? "" : "x") + std::to_string(d);
  return s;
}

/// What a split of `weight` means to its consumers: "columns (outputs)",
/// "rows (contraction)" of a matmul, "vocabulary (lookup rows)" of a
/// gather; several joined by " and " (a tied embedding is both).
std::string roleOf(ParamOp weight, Shard shard) {
  if (!shard.isSplit())
    return "";
  SmallVector<std::string> roles;
  auto note = [&](std::string role) {
    if (!llvm::is_contained(roles, role))
      roles.push_back(std::move(role));
  };
  // Its readers, and those of its 16-bit casts (autocast's).
  SmallVector<Value> values{weight.getResult()};
  for (size_t i = 0; i < values.size(); ++i)
    for (OpOperand &use : values[i].getUses()) {
      if (auto c = dyn_cast<CastOp>(use.getOwner())) {
        values.push_back(c.getResult());
        continue;
      }
      if (auto sharding = dyn_cast<ShardingOpInterface>(use.getOwner())) {
        std::string role = sharding.getSplitRole(use.getOperandNumber(), shard);
        if (!role.empty())
          note(std::move(role));
      }
    }
  return llvm::join(roles, " and ");
}

struct PlanShardingPass
    : public mlir::pcc::impl::PlanShardingBase<PlanShardingPass> {
  using PlanShardingBase::PlanShardingBase;
  PlanShardingPass(const PlanShardingOptions &options,
                   std::shared_ptr<ShardingMemo> memo)
      : PlanShardingBase(options), memo(std::move(memo)) {}

  /// The search's decisions, or the memo's for these weights (propagated
  /// again on this function).
  SearchResult search(func::FuncOp func, int64_t ranks,
                      const llvm::MapVector<StringRef, RankedTensorType> &w) {
    if (!memo || emitRemarks) // the remarks need the search's classes
      return searchShardings(func, axis, ranks);
    SmallVector<StringRef> names;
    for (auto &entry : w)
      names.push_back(entry.first);
    llvm::sort(names);
    // The decisions depend on the precision too (pcc-autocast has set it:
    // the products' costs and the bytes a layout moves).
    std::string precision;
    if (auto module = func->getParentOfType<ModuleOp>())
      if (auto p = module->getAttrOfType<StringAttr>(kPrecisionAttrName))
        precision = p.getValue().str();
    // And on --sp's propagation (pcc-partition marks the module).
    bool sp = false;
    if (auto module = func->getParentOfType<ModuleOp>())
      sp = module->hasAttr(kSequenceParallelAttrName);
    std::string key = axis + "=" + std::to_string(ranks) + ":" + precision +
                      (sp ? ":sp:" : ":") + llvm::join(names, ",");
    std::unique_lock<std::mutex> lock(memo->mutex);
    memo->searched.wait(lock, [&] { return !memo->searching.contains(key); });
    auto it = memo->decisions.find(key);
    if (it != memo->decisions.end()) {
      SearchResult known;
      known.decisions = it->second;
      lock.unlock();
      known.plan = propagateShardings(func, axis, ranks, known.decisions);
      known.evaluations = 1;
      return known;
    }
    memo->searching.insert(key);
    lock.unlock();
    SearchResult searched = searchShardings(func, axis, ranks);
    lock.lock();
    memo->decisions[key] = searched.decisions;
    memo->searching.erase(key);
    memo->searched.notify_all();
    return searched;
  }

  std::shared_ptr<ShardingMemo> memo;

  void runOnOperation() override {
    func::FuncOp func = getOperation();
    // A training step is planned on its forward phase; pcc-partition-
    // training gives the other phases the same weight layouts.
    if (auto phase = func->getAttrOfType<StringAttr>(kPhaseAttrName);
        phase && phase.getValue() != kPhaseNames[0])
      return;
    // A pipelined step is planned on its stages' forward phases; the
    // stage functions they were made from only record the wiring.
    if (func->hasAttr(kStageAttrName))
      return;
    FailureOr<int64_t> ranks = getMeshAxisSize(func, axis);
    if (failed(ranks))
      return signalPassFailure();
    MLIRContext *context = &getContext();

    auto weights = decisionWeights(func);
    SearchResult search = this->search(func, *ranks, weights);
    llvm::StringMap<Shard> &decisions = search.decisions;
    ShardingPlan &best = search.plan;

    // Nothing split: every rank would hold and compute the whole model.
    if (!weights.empty() &&
        llvm::none_of(decisions, [](const auto &d) {
          return d.getValue().isSplit();
        }))
      func.emitWarning() << axis << "=" << *ranks
                         << ": no weight is split (none of their dimensions "
                            "divides into "
                         << *ranks
                         << " or splitting costs more than it saves), so "
                            "every rank holds and computes the whole model";
    // Record the layouts.
    Block &block = func.getBody().front();
    for (Operation &op : block) {
      if (op.getNumResults() == 0)
        continue;
      SmallVector<Attribute> attrs;
      for (Value r : op.getResults())
        attrs.push_back(best.shards.lookup(r).toAttr(context, axis));
      op.setAttr(PccDialect::kShardingAttrName, ArrayAttr::get(context, attrs));
    }

    if (!emitRemarks)
      return;
    // Why each weight: what the best layout of each other kind would cost,
    // computed once per class (every member takes the same layouts).
    llvm::DenseMap<unsigned, std::string> alternatives;
    auto alternativesOf = [&](ParamOp param, Shard chosen) -> std::string {
      unsigned cls = search.classes.classOf.lookup(param.getName());
      auto it = alternatives.find(cls);
      if (it != alternatives.end())
        return it->second;
      std::string text;
      llvm::raw_string_ostream os(text);
      for (int64_t dim = -1; dim < param.getType().getRank(); ++dim) {
        std::optional<ShardingPlan> alt;
        Shard altShard;
        for (Shard c : candidateShards(param.getType(), *ranks)) {
          if (c == chosen || (dim < 0) != c.isReplicated() ||
              (dim >= 0 && c.dim != dim) ||
              (chosen.isSplit() && c.isSplit() && c.dim == chosen.dim))
            continue;
          llvm::StringMap<Shard> trial = decisions;
          for (StringRef member : search.classes.members[cls])
            trial[member] = c;
          ShardingPlan plan = propagateShardings(func, axis, *ranks, trial);
          if (!alt || plan.betterThan(*alt)) {
            alt = std::move(plan);
            altShard = c;
          }
        }
        if (!alt)
          continue;
        auto sign = [](auto x) {
          return (x >= 0 ? "+" : "") + llvm::formatv("{0}", x).str();
        };
        os << "; "
           << (altShard.isReplicated() ? "replicated"
                                       : "split " + altShard.describe())
           << ": "
           << sign(alt->replicatedWeightBytes - best.replicatedWeightBytes)
           << " B whole weights, "
           << sign(alt->commBytes() - best.commBytes()) << " B communicated, "
           << llvm::formatv("{0}{1:f1}",
                            alt->seconds() >= best.seconds() ? "+" : "",
                            (alt->seconds() - best.seconds()) * 1e6)
           << " us";
      }
      size_t size = search.classes.members[cls].size();
      if (size > 1)
        os << " (one decision for " << size
           << " weights of the same structure)";
      return alternatives[cls] = os.str();
    };
    llvm::StringSet<> explained;
    func.walk([&](ParamOp param) {
      if (!weights.count(param.getName()) ||
          !explained.insert(param.getName()).second)
        return;
      Shard chosen = decisions[param.getName()];
      std::string role = roleOf(param, chosen);
      auto diag = param.emitRemark();
      diag << axis << "=" << *ranks << ": " << param.getName() << " ["
           << shapeString(param.getType()) << "] ";
      if (chosen.isReplicated()) {
        diag << "replicated";
        if (llvm::none_of(candidateShards(param.getType(), *ranks),
                          [](Shard s) { return s.isSplit(); }))
          diag << " (no dimension divides by " << *ranks << ")";
      } else {
        diag << "split " << chosen.describe()
             << (role.empty() ? "" : " = " + role) << " -> local ["
             << shapeString(localType(param.getType(), chosen, *ranks)) << "]";
      }
      // Dimensions no split of this degree can take (a vocabulary of 97):
      // kept whole, and which degrees would split them.
      for (auto [d, size] : llvm::enumerate(param.getType().getShape()))
        if (size > 1 && size % *ranks != 0) {
          std::string would = ranksThatDivide(size);
          diag << "; dim " << d << " (" << size << ") does not divide over "
               << *ranks << " " << axis << " ranks";
          if (would != "none")
            diag << " (--" << axis << "=" << would << " would)";
        }
      diag << alternativesOf(param, chosen);
    });
    // The blocks the search split together, and why.
    for (const GroupMove &group : search.groups) {
      auto diag = func.emitRemark();
      diag << axis << "=" << *ranks << " group:";
      llvm::StringMap<unsigned> seenClass;
      for (auto [i, w] : llvm::enumerate(group.weights)) {
        ParamOp param;
        func.walk([&](ParamOp p) {
          if (!param && p.getName() == w.first)
            param = p;
        });
        std::string role = param ? roleOf(param, w.second) : "";
        diag << (i ? ", " : " ") << w.first << " "
             << (role.empty() ? "split " + w.second.describe() : role);
      }
      diag << ": " << group.replicatedBytesSaved
           << " B fewer whole weights per rank for "
           << llvm::formatv("{0}{1}", group.commBytesAdded >= 0 ? "+" : "",
                            group.commBytesAdded)
           << " B communicated ("
           << llvm::formatv("{0}{1:f1}", group.secondsAdded >= 0 ? "+" : "",
                            group.secondsAdded * 1e6)
           << " us)";
    }
    for (const PlannedCollective &c : best.collectives) {
      Operation *where = c.value.getDefiningOp();
      auto diag = where ? where->emitRemark() : func.emitRemark();
      diag << axis << "=" << *ranks << ": " << collectiveName(c.kind) << " of "
           << c.value.getType() << " (" << c.bytes
           << " bytes): " << c.from.describe() << " -> " << c.to.describe();
    }
    func.emitRemark() << axis << "=" << *ranks
                      << " plan: " << best.collectives.size()
                      << " collectives moving " << best.commBytes()
                      << " bytes per run; weights " << best.weightBytesPerRank
                      << " bytes per rank (" << best.replicatedWeightBytes
                      << " bytes of rank >= 2 whole); predicted "
                      << llvm::formatv("{0:f1}", best.computeSeconds * 1e6)
                      << " us compute + "
                      << llvm::formatv("{0:f1}", best.commSeconds * 1e6)
                      << " us communication; " << search.classes.size()
                      << " weight classes, " << search.evaluations
                      << " plans evaluated";
  }
};

} // namespace

std::shared_ptr<ShardingMemo> mlir::pcc::createShardingMemo() {
  return std::make_shared<ShardingMemo>();
}

std::unique_ptr<Pass>
mlir::pcc::createPlanSharding(const PlanShardingOptions &options,
                              std::shared_ptr<ShardingMemo> memo) {
  return std::make_unique<PlanShardingPass>(options, std::move(memo));
}
