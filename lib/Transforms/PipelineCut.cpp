//===- PipelineCut.cpp - split @main into balanced pipeline stages --------===//
//
// The program is one block in topological order, so a stage is a
// contiguous run of its ops. The pass prices every op with the cost model,
// finds the narrowest points (where the fewest activation bytes are live
// across the cut), chooses stages - 1 of them that minimise the slowest
// stage's predicted time and then the bytes transferred, and outlines each
// stage as a function. See PipelineCut in Passes.td.
//
//===----------------------------------------------------------------------===//

#include "pcc/Analysis/CostModel.h"
#include "pcc/Analysis/CutSearch.h"
#include "pcc/Dialect/Pcc/IR/PccDialect.h"
#include "pcc/Dialect/Pcc/IR/PccInterfaces.h"
#include "pcc/Transforms/Passes.h"
#include "pcc/Transforms/Training.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/FormatVariadic.h"

#include <limits>
#include <map>

namespace mlir::pcc {
#define GEN_PASS_DEF_PIPELINECUT
#include "pcc/Transforms/Passes.h.inc"
} // namespace mlir::pcc

using namespace mlir;
using namespace mlir::pcc;

namespace {

/// Clones the cloned op defining `v` (and what it reads) into `b`.
void cloneDefinition(Value v, OpBuilder &b, IRMapping &map) {
  if (map.contains(v))
    return;
  Operation *def = v.getDefiningOp();
  for (Value operand : def->getOperands())
    cloneDefinition(operand, b, map);
  b.clone(*def, map);
}

std::string nodeName(Operation *op) {
  auto [type, node] = getOnnxNodeOfLocation(op->getLoc());
  return type.empty() ? op->getName().getStringRef().str() : node;
}

/// The op sequence being cut and what crosses each position.
struct CutModel {
  std::vector<Operation *> ops; // without cloned ops and the return
  llvm::DenseSet<Operation *> cloned;
  bool isCloned(Operation *op) const { return cloned.contains(op); }
  std::vector<double> prefix; // prefix[i]: seconds of ops[0, i)
  /// crossing[c]: bytes live across a cut before ops[c] (values defined
  /// before c and used at or after c; the return counts as position n).
  std::vector<int64_t> crossing;
  /// The same without graph inputs (which are not transferred).
  std::vector<int64_t> carried;
  /// Per op index: the values crossing just before it.
  llvm::DenseMap<Operation *, size_t> index;
  /// What the cut search reads (lib/Analysis/CutSearch).
  CutProfile profile;
};

/// An op's share of a step: its forward time, and for a training step
/// (the loss program, cut before differentiation) its backward's too: a
/// contraction's two (the input's and the weight's gradients, each about
/// the forward's FLOPs), an elementwise op's or a reduction's one.
double stepSeconds(Operation *op, const CostModel &cost, bool training) {
  double forward = cost.opSeconds(op);
  if (!training)
    return forward;
  auto priced = dyn_cast<CostOpInterface>(op);
  return forward * (priced && priced.getFlops() ? 3.0 : 2.0);
}

CutModel analyse(func::FuncOp main, const CostModel &cost) {
  bool training = main->getParentOfType<ModuleOp>()->hasAttr(kTrainingAttrName);
  CutModel m;
  for (Operation &op : main.getBody().front())
    if (isComputedFromWeights(&op, m.cloned))
      m.cloned.insert(&op);
  for (Operation &op : main.getBody().front())
    if (!m.isCloned(&op) && !op.hasTrait<OpTrait::IsTerminator>()) {
      m.index[&op] = m.ops.size();
      m.ops.push_back(&op);
    }
  size_t n = m.ops.size();
  m.prefix.assign(n + 1, 0);
  for (size_t i = 0; i < n; ++i)
    m.prefix[i + 1] = m.prefix[i] + stepSeconds(m.ops[i], cost, training);
  std::vector<int64_t> delta(n + 2, 0), argDelta(n + 2, 0);
  // Graph inputs reach every stage directly, but a cut where one is still
  // needed is inside the layer that reads it: count them as live from the
  // start, so that the narrowest points stay between layers.
  for (BlockArgument arg : main.getArguments()) {
    size_t last = 0;
    for (Operation *user : arg.getUsers()) {
      auto it = m.index.find(user);
      last = std::max(last, it == m.index.end() ? n : it->second);
    }
    argDelta[0] += tensorBytes(arg);
    argDelta[last + 1] -= tensorBytes(arg);
  }
  for (size_t i = 0; i < n; ++i)
    for (Value r : m.ops[i]->getResults()) {
      size_t last = i;
      for (Operation *user : r.getUsers()) {
        auto it = m.index.find(user);
        last = std::max(last, it == m.index.end() ? n : it->second);
      }
      if (last > i) {
        delta[i + 1] += cutWeight(r);
        delta[last + 1] -= cutWeight(r);
      }
    }
  m.crossing.assign(n + 1, 0);
  m.carried.assign(n + 1, 0);
  int64_t live = 0, args = 0;
  for (size_t c = 0; c <= n; ++c) {
    live += delta[c];
    args += argDelta[c];
    m.carried[c] = live;
    m.crossing[c] = live + args;
  }
  m.profile.seconds = m.prefix;
  m.profile.crossing = m.crossing;
  m.profile.flops.assign(n + 1, 0);
  for (size_t i = 0; i < n; ++i)
    m.profile.flops[i + 1] = m.profile.flops[i] + opFlops(m.ops[i]);
  return m;
}

struct PipelineCutPass
    : public mlir::pcc::impl::PipelineCutBase<PipelineCutPass> {
  using PipelineCutBase::PipelineCutBase;

  void runOnOperation() override;

private:
  LogicalResult outline(func::FuncOp main, const CutModel &m,
                        ArrayRef<size_t> cuts);
};

void PipelineCutPass::runOnOperation() {
  ModuleOp module = getOperation();
  auto main = module.lookupSymbol<func::FuncOp>("main");
  if (!main || !main.getBody().hasOneBlock()) {
    module.emitError("pipeline cut: expects a single-block func.func @main");
    return signalPassFailure();
  }
  int64_t ranks = stages;
  if (ranks == 0) {
    FailureOr<int64_t> pp = getMeshAxisSize(main, kPipelineAxis);
    if (failed(pp))
      return signalPassFailure();
    ranks = *pp;
  }
  if (ranks < 1 || chunks < 1) {
    main.emitError("pipeline cut: ")
        << ranks << " pipeline ranks with " << static_cast<int64_t>(chunks)
        << " chunks each";
    return signalPassFailure();
  }
  int64_t n = ranks * chunks;
  if (n == 1 && cuts.empty())
    return;
  if (chunks > 1)
    module->setAttr(PccDialect::kPipelineChunksAttrName,
                    Builder(module.getContext()).getI64IntegerAttr(chunks));
  // Remarks start "pp=" (pcc --explain files them under the pipeline);
  // with chunks they say which rank runs each stage.
  std::string prefix =
      "pp=" + std::to_string(ranks) +
      (chunks > 1 ? " x " + std::to_string(chunks) + " chunks" : std::string());
  auto stageName = [&](size_t s) {
    return "stage " + std::to_string(s) +
           (chunks > 1 ? " (rank " + std::to_string(s % ranks) + ")"
                       : std::string());
  };
  if (device != "gpu" && device != "cpu") {
    main.emitError("pipeline cut: device '") << device << "' is not gpu or cpu";
    return signalPassFailure();
  }
  CostModel cost = device == "cpu" ? CostModel::cpuCore() : CostModel();
  CutModel m = analyse(main, cost);

  std::vector<size_t> chosen;
  if (!cuts.empty()) {
    if (static_cast<int64_t>(cuts.size()) != n - 1) {
      main.emitError("pipeline cut: ")
          << n << " stages need " << n - 1 << " cuts, but " << cuts.size()
          << " were given";
      return signalPassFailure();
    }
    for (const std::string &name : cuts) {
      // After the last op of the node.
      std::optional<size_t> at;
      for (size_t i = 0; i < m.ops.size(); ++i)
        if (nodeName(m.ops[i]) == name)
          at = i + 1;
      if (!at) {
        main.emitError("pipeline cut: no ONNX node '")
            << name << "' to cut after";
        return signalPassFailure();
      }
      if (*at >= m.ops.size() || (!chosen.empty() && *at <= chosen.back())) {
        main.emitError("pipeline cut: cutting after node '")
            << name << "' leaves a stage with nothing to run (cuts go in "
            << "program order, before the last node)";
        return signalPassFailure();
      }
      chosen.push_back(*at);
    }
  } else {
    std::vector<size_t> candidates = candidateCuts(m.profile);
    if (static_cast<int64_t>(candidates.size()) < n - 1) {
      auto diag = main.emitError("pipeline cut: ")
                  << n << " stages"
                  << (chunks > 1 ? " (" + prefix + ")" : std::string())
                  << " need " << n - 1 << " cuts, but the model has "
                  << candidates.size() << " places to cut between its layers";
      if (!candidates.empty())
        diag << " (where " << m.crossing[candidates[0]]
             << " bytes of activations are live)";
      diag << "; use fewer stages" << (chunks > 1 ? " or chunks" : "")
           << ", or --pp-cuts to cut elsewhere";
      return signalPassFailure();
    }
    chosen = balanceStages(m.profile, candidates, n);
    if (chunks > 1)
      balanceRanks(m.profile, candidates, chosen, ranks);
  }

  if (emitRemarks) {
    std::vector<size_t> bounds{0};
    llvm::append_range(bounds, chosen);
    bounds.push_back(m.ops.size());
    double slowest = 0;
    for (size_t s = 0; s + 1 < bounds.size(); ++s)
      slowest =
          std::max(slowest, m.prefix[bounds[s + 1]] - m.prefix[bounds[s]]);
    double mean = m.prefix[m.ops.size()] / n;
    for (size_t s = 0; s + 1 < bounds.size(); ++s) {
      size_t b = bounds[s], e = bounds[s + 1];
      int64_t weights = 0, flops = 0;
      llvm::StringSet<> weightNames;
      for (size_t i = b; i < e; ++i) {
        flops += opFlops(m.ops[i]);
        for (Value v : m.ops[i]->getOperands())
          if (auto p = v.getDefiningOp<ParamOp>())
            if (weightNames.insert(p.getName()).second)
              weights += tensorBytes(p.getResult());
      }
      main.emitRemark() << llvm::formatv(
          "{9}: {0}: {1} ops, node '{2}' .. node '{3}'; predicted "
          "{4:f2} us "
          "({5} FLOPs); weights {6} bytes; activations in {7} bytes, out "
          "{8} bytes",
          stageName(s), e - b, nodeName(m.ops[b]), nodeName(m.ops[e - 1]),
          (m.prefix[e] - m.prefix[b]) * 1e6, flops, weights,
          b == 0 ? 0 : m.carried[b], e == m.ops.size() ? 0 : m.carried[e],
          prefix);
    }
    if (chunks > 1) {
      std::vector<double> perRank = rankSeconds(m.profile, chosen, ranks);
      double busiest = *std::max_element(perRank.begin(), perRank.end());
      std::string loads;
      for (int64_t r = 0; r < ranks; ++r)
        loads += llvm::formatv("{0}rank {1} {2:f2} us", r ? ", " : "", r,
                               perRank[r] * 1e6)
                     .str();
      main.emitRemark() << llvm::formatv(
          "{0}: per rank (its stages together): {1}; imbalance {2:f2} "
          "(busiest / mean)",
          prefix, loads, busiest / (m.prefix[m.ops.size()] / ranks));
    }
    main.emitRemark() << llvm::formatv(
        "{0}: slowest stage {1:f2} us, mean {2:f2} us, imbalance {3:f2} "
        "(slowest / mean){4}",
        prefix, slowest * 1e6, mean * 1e6, mean > 0 ? slowest / mean : 1.0,
        cuts.empty() ? "" : "; cuts forced by --pp-cuts");
  }
  if (failed(outline(main, m, chosen)))
    return signalPassFailure();
}

LogicalResult PipelineCutPass::outline(func::FuncOp main, const CutModel &m,
                                       ArrayRef<size_t> cuts) {
  MLIRContext *context = main.getContext();
  std::vector<size_t> bounds{0};
  llvm::append_range(bounds, cuts);
  bounds.push_back(m.ops.size());
  int64_t numStages = bounds.size() - 1;
  auto stageOf = [&](Operation *op) -> int64_t {
    size_t i = m.index.lookup(op);
    return std::upper_bound(bounds.begin(), bounds.end(), i) - bounds.begin() -
           1;
  };
  auto ret = cast<func::ReturnOp>(main.getBody().front().getTerminator());
  std::vector<Operation *> old;
  for (Operation &op : main.getBody().front())
    if (!op.hasTrait<OpTrait::IsTerminator>())
      old.push_back(&op);

  // Per stage: its inputs (in order of first use) and outputs. Transfers go
  // to the next stage only: a value a later stage reads passes through the
  // stages between (an input returned as is), so that each micro-batch's
  // activations move one hop per send, as the schedule's send_fwd/recv_fwd
  // pairs say.
  std::vector<llvm::SetVector<Value>> inputs(numStages), outputs(numStages);
  auto carry = [&](Value v, int64_t from, int64_t to) {
    for (int64_t s = from; s < to; ++s) {
      outputs[s].insert(v);
      inputs[s + 1].insert(v);
    }
  };
  for (int64_t s = 0; s < numStages; ++s)
    for (size_t i = bounds[s]; i < bounds[s + 1]; ++i)
      for (Value v : m.ops[i]->getOperands()) {
        Operation *def = v.getDefiningOp();
        if (def && m.isCloned(def))
          continue;
        if (!def)
          inputs[s].insert(v); // a graph input, read directly
        else if (stageOf(def) != s)
          carry(v, stageOf(def), s);
      }
  // The last stage returns the model's outputs, in order and with
  // repeats: values computed earlier pass through, graph inputs come in
  // directly and weight- or constant-only values are cloned into it.
  int64_t last = numStages - 1;
  SmallVector<Value> finalOutputs(ret.getOperands());
  for (Value v : finalOutputs) {
    Operation *def = v.getDefiningOp();
    if (!def)
      inputs[last].insert(v);
    else if (!m.isCloned(def))
      carry(v, stageOf(def), last);
  }

  OpBuilder builder(context);
  builder.setInsertionPoint(main);
  std::vector<func::FuncOp> funcs;
  for (int64_t s = 0; s < numStages; ++s) {
    SmallVector<Value> returned =
        s == last ? finalOutputs
                  : SmallVector<Value>(outputs[s].begin(), outputs[s].end());
    SmallVector<Type> in, out;
    for (Value v : inputs[s])
      in.push_back(v.getType());
    for (Value v : returned)
      out.push_back(v.getType());
    auto f = func::FuncOp::create(builder, main.getLoc(),
                                  ("stage" + std::to_string(s)),
                                  builder.getFunctionType(in, out));
    f.setPrivate();
    f->setAttr(kStageAttrName, builder.getI64IntegerAttr(s));
    Block *body = f.addEntryBlock();
    OpBuilder b = OpBuilder::atBlockBegin(body);
    IRMapping map;
    for (auto [v, arg] : llvm::zip(inputs[s], body->getArguments()))
      map.map(v, arg);
    for (size_t i = bounds[s]; i < bounds[s + 1]; ++i) {
      for (Value v : m.ops[i]->getOperands())
        if (Operation *def = v.getDefiningOp(); def && m.isCloned(def))
          cloneDefinition(v, b, map);
      b.clone(*m.ops[i], map);
    }
    SmallVector<Value> results;
    for (Value v : returned) {
      if (Operation *def = v.getDefiningOp(); def && m.isCloned(def))
        cloneDefinition(v, b, map);
      results.push_back(map.lookup(v));
    }
    func::ReturnOp::create(b, main.getLoc(), results);
    funcs.push_back(f);
  }

  // @main: call the stages in order, each receiving the previous one's
  // outputs through transfers.
  builder.setInsertionPoint(ret);
  llvm::DenseMap<Value, Value> latest; // global value -> newest call result
  int64_t bytes = 0;
  for (int64_t s = 0; s < numStages; ++s) {
    SmallVector<Value> args;
    for (Value v : inputs[s]) {
      auto it = latest.find(v);
      if (it == latest.end()) {
        args.push_back(v); // a graph input
        continue;
      }
      args.push_back(TransferOp::create(builder, v.getLoc(), it->second,
                                        builder.getI64IntegerAttr(s - 1),
                                        builder.getI64IntegerAttr(s)));
      bytes += tensorBytes(v);
    }
    auto call = func::CallOp::create(builder, main.getLoc(), funcs[s], args);
    if (s == last) {
      // Outputs are the last stage's results, one for one.
      ret->setOperands(call.getResults());
      break;
    }
    for (auto [v, r] : llvm::zip(outputs[s], call.getResults()))
      latest[v] = r;
  }
  transferBytes = bytes;
  // The original ops, users first.
  for (Operation *op : llvm::reverse(old))
    if (op->use_empty())
      op->erase();
    else
      return op->emitError("pipeline cut: op still used after outlining");
  return success();
}

} // namespace
