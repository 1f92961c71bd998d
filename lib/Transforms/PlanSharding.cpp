//===- PlanSharding.cpp - choose every weight's layout over a mesh axis --===//

#include "pcc/Transforms/Passes.h"
#include "pcc/Transforms/Sharding.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/FormatVariadic.h"

namespace mlir::pcc {
#define GEN_PASS_DEF_PLANSHARDING
#include "pcc/Transforms/Passes.h.inc"
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
  for (OpOperand &use : weight.getResult().getUses())
    if (auto sharding = dyn_cast<ShardingOpInterface>(use.getOwner())) {
      std::string role =
          sharding.getSplitRole(use.getOperandNumber(), shard);
      if (!role.empty())
        note(std::move(role));
    }
  return llvm::join(roles, " and ");
}

struct PlanShardingPass
    : public mlir::pcc::impl::PlanShardingBase<PlanShardingPass> {
  using PlanShardingBase::PlanShardingBase;

  void runOnOperation() override {
    func::FuncOp func = getOperation();
    FailureOr<int64_t> ranks = getMeshAxisSize(func, axis);
    if (failed(ranks))
      return signalPassFailure();
    MLIRContext *context = &getContext();

    auto weights = decisionWeights(func);
    llvm::StringMap<Shard> decisions;
    for (auto &w : weights)
      decisions[w.first] = Shard::replicated();
    ShardingPlan best = propagateShardings(func, axis, *ranks, decisions);

    // Coordinate descent: try every layout of one weight at a time. The
    // first phase moves only weights that some matmul reads, so that the
    // layers settle before lookups (embeddings) join in: an embedding split
    // first would split the residual stream and trap the descent in plans
    // that gather around every block.
    llvm::StringSet<> layerWeights;
    func.walk([&](MatmulOp mm) {
      for (Value v : mm->getOperands())
        if (auto p = v.getDefiningOp<ParamOp>())
          layerWeights.insert(p.getName());
    });
    for (int phase = 0; phase < 2 && *ranks > 1; ++phase) {
      for (int sweep = 0; sweep < 8; ++sweep) {
        bool improved = false;
        for (auto &w : weights) {
          if (phase == 0 && !layerWeights.contains(w.first))
            continue;
          for (Shard candidate : candidateShards(w.second, *ranks)) {
            if (candidate == decisions[w.first])
              continue;
            llvm::StringMap<Shard> trial = decisions;
            trial[w.first] = candidate;
            ShardingPlan plan = propagateShardings(func, axis, *ranks, trial);
            if (plan.betterThan(best)) {
              best = std::move(plan);
              decisions = std::move(trial);
              improved = true;
            }
          }
        }
        if (!improved)
          break;
      }
    }

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
    // Why each weight: what the best layout of each other kind would cost.
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
      // Best alternative per kind: replicated, and each other dimension.
      for (int64_t dim = -1; dim < param.getType().getRank(); ++dim) {
        std::optional<ShardingPlan> alt;
        Shard altShard;
        for (Shard c : candidateShards(param.getType(), *ranks)) {
          if (c == chosen || (dim < 0) != c.isReplicated() ||
              (dim >= 0 && c.dim != dim) ||
              (chosen.isSplit() && c.isSplit() && c.dim == chosen.dim))
            continue;
          llvm::StringMap<Shard> trial = decisions;
          trial[param.getName()] = c;
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
        diag << "; "
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
    });
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
                      << " us communication";
  }
};

} // namespace
