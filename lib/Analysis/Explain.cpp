//===- Explain.cpp - the pcc --explain report -----------------------------===//
//
// What the lowering pipeline made of a model: the plan, the remarks the
// passes made, the schedule, the op mix, the memory plan, and for training
// the memory per device or per pipeline rank with the ZeRO accounting.
//
//===----------------------------------------------------------------------===//

#include "pcc/Analysis/Explain.h"
#include "pcc/Analysis/CostModel.h"
#include "pcc/Analysis/MemoryModel.h"
#include "pcc/Dialect/Pcc/IR/Contracts.h"
#include "pcc/Dialect/Pcc/IR/PccDialect.h"
#include "pcc/Dialect/Pcc/IR/PccInterfaces.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/FormatVariadic.h"

#include <algorithm>
#include <map>

using namespace mlir;

namespace mlir::pcc {

int64_t rankArenaBytes(ModuleOp module) {
  int64_t arena = 0;
  module.walk([&](func::FuncOp f) {
    if (auto a = f->getAttrOfType<IntegerAttr>(kArenaBytesAttrName))
      arena = std::max(arena, a.getInt());
  });
  return arena;
}

std::string describeLocation(Location loc) {
  auto [opType, node] = pcc::getOnnxNodeOfLocation(loc);
  if (!opType.empty())
    return llvm::formatv("node '{0}' ({1})", node, opType).str();
  if (auto name = dyn_cast<NameLoc>(loc))
    return llvm::formatv("'{0}'", name.getName().str()).str();
  if (auto file = dyn_cast<FileLineColLoc>(loc)) {
    if (file.getLine() == 0)
      return file.getFilename().str();
    return llvm::formatv("{0}:{1}:{2}", file.getFilename().str(),
                         file.getLine(), file.getColumn())
        .str();
  }
  return "";
}

std::string grouped(int64_t n) {
  std::string digits = std::to_string(n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0)
      out += ',';
    out += digits[i];
  }
  return out;
}

/// The memory a training library needs on one device, by pool, as the
/// runtime allocates it (pccrt::Trainer): every state tensor, the forward
/// phase's inputs and saved activations, and one arena for the largest
/// phase. pcc-run prints the measured high-water mark to compare.
static void explainPipelineMemory(ModuleOp module, const ExplainSettings &s,
                                  llvm::raw_ostream &os);

/// The ZeRO paper's accounting of model state, in float32: Psi trainable
/// parameters (those with a gradient), 4 bytes each for the weights and
/// the gradients, K for the optimizer state (AdamW 8, SGD 4; ZeRO 1 and 2
/// add the 4-byte master piece of each weight, as DeepSpeed's fp32
/// partition: K + 4); other weights (running statistics) on top. A
/// sharded tensor is padded to a multiple of dp elements. Returns Psi.
static int64_t
explainModelState(ModuleOp module, const StepMemory &p, int64_t dp,
                  const std::optional<pcc::TrainingConfig> &training,
                  llvm::raw_ostream &os) {
  int64_t weights = p.weights, grads = p.grads, optimizer = p.optimizer,
          bucketGaps = p.bucketGaps;
  bool offloaded = p.offloaded;
  int64_t stage = training ? training->zero : 0;
  int64_t ranks = dp > 1 ? dp : 1;
  // Psi and the elements of one rank's pieces, from the gradients.
  int64_t psi = 0, pieces = 0, halfGrads = 0;
  llvm::StringSet<> counted;
  module.walk([&](pcc::ParamOp param) {
    if (pcc::splitStateName(param.getName()).second != "grad" ||
        !counted.insert(param.getName()).second)
      return;
    // The rank's tensor-parallel piece (the ZeRO paper's Psi is per
    // model-parallel partition).
    int64_t n = param.getWhole() ? ShapedType::getNumElements(*param.getWhole())
                                 : param.getType().getNumElements();
    if (pcc::ShardingAttr within = param.getWithinAttr())
      n /= *pcc::getMeshAxisSize(param, within.getAxis());
    psi += n;
    pieces += (n + ranks - 1) / ranks;
    // pcc-bf16-gradients: 2 bytes where the table counts 4.
    if (param.getType().getElementType().isBF16())
      halfGrads += 2 * n;
  });
  int64_t master = stage == 1 || stage == 2 ? 4 * pieces : 0;
  int64_t optK = (optimizer - master) / (stage == 0 ? psi : pieces);
  int64_t whole = stage == 0 ? 8 + optK : stage == 1 ? 8 : stage == 2 ? 4 : 0;
  int64_t sharded = stage == 0 ? 0 : stage == 1 ? 4 + optK : 8 + optK;
  int64_t others = weights + grads + optimizer - whole * psi -
                   sharded * pieces - bucketGaps + halfGrads;
  int64_t padding = sharded * pieces * ranks - sharded * psi;
  os << "    model state: " << weights + grads + optimizer + p.copies
     << " bytes = ";
  if (whole)
    os << whole << " x Psi";
  if (whole && sharded)
    os << " + ";
  if (sharded)
    os << sharded << " x Psi / " << ranks;
  os << " for Psi = " << psi << " trainable parameters";
  if (padding > 0)
    os << " (+ " << llvm::format("%.1f", padding / double(ranks))
       << " bytes of padding: each sharded tensor is padded to a multiple of "
       << ranks << " elements)";
  if (bucketGaps > 0)
    os << " (+ " << bucketGaps
       << " bytes of gaps that align the gradients in their buckets)";
  if (others > 0)
    os << " + " << others << " bytes of other weights";
  if (p.copies > 0)
    os << " + " << p.copies << " bytes of " << p.copyType
       << " weight copies (2 x the products' weights)";
  if (halfGrads > 0)
    os << " - " << halfGrads
       << " bytes of gradients kept in bf16 (2 x their parameters)";
  static const char *const kStages[] = {
      "ZeRO stage 0: weights, gradients and optimizer state on every rank",
      "ZeRO stage 1: the optimizer state (and a master piece of each "
      "weight) sharded over dp",
      "ZeRO stage 2: the optimizer state and the gradients sharded over dp",
      "ZeRO stage 3: the optimizer state, the gradients and the weights "
      "sharded over dp"};
  os << "\n      (" << kStages[stage]
     << (offloaded ? "; on the device, since --offload=optimizer keeps the "
                     "optimizer state in host memory"
                   : "")
     << ")\n";
  if (p.copies > 0)
    os << "      (mixed precision: fp32 weights, which are the masters, fp32 "
          "gradients (accumulated over micro-batches in fp32, as DeepSpeed's "
          "bf16 optimizer) and the optimizer state, plus "
       << (p.copyType[0] == 'f' ? "an " : "a ") << p.copyType
       << " copy of "
          "each product's weight cast once per step; the ZeRO paper's "
          "2 + 2 + 12 x Psi keeps 16-bit weights and gradients beside a "
          "separate fp32 master copy)\n";
  if (halfGrads > 0)
    os << "      (a gradient that one bf16 product writes whole each step, "
          "one micro-batch and one contribution, is kept in bf16: the same "
          "values, 2 bytes instead of 4; pcc-bf16-gradients)\n";
  return psi;
}

/// The collectives' bytes per step, in the units pcc-run measures them
/// (an all-reduce of B bytes counts 2B, a gather or scatter its whole
/// tensor; the forward and backward phases run once per micro-batch), and
/// how the data-parallel ones run.
static void explainTraffic(ModuleOp module, int64_t dp, int64_t psi,
                           const std::optional<pcc::TrainingConfig> &training,
                           llvm::raw_ostream &os) {
  int64_t microbatches = training ? training->microbatches : 1;
  int64_t moved = 0, tpMoved = 0;
  // The data-parallel collectives in the program, by how they run.
  int64_t prefetched = 0, startedScatters = 0, bucketStarts = 0, blocking = 0;
  for (func::FuncOp f : module.getOps<func::FuncOp>()) {
    auto phase = f->getAttrOfType<StringAttr>(pcc::kPhaseAttrName);
    if (!phase)
      continue;
    f.walk([&](Operation *op) {
      if (isa<pcc::BucketStartOp>(op))
        ++bucketStarts;
      else if (isa<pcc::AllGatherStartOp>(op))
        ++prefetched;
      else if (isa<pcc::ReduceScatterStartOp>(op))
        ++startedScatters;
      else if (auto c = dyn_cast<pcc::CollectiveOpInterface>(op))
        blocking += c.getMeshAxis() == kDataParallelAxis;
    });
    int64_t times = phase.getValue() == pcc::kPhaseNames[0] ||
                            phase.getValue() == pcc::kPhaseNames[1]
                        ? microbatches
                        : 1;
    f.walk([&](Operation *op) {
      // A bucket's all-reduce runs once per step (the last micro-batch).
      // With `scatter` (ZeRO 1), each segment's reduce-scatter.
      if (auto start = dyn_cast<pcc::BucketStartOp>(op)) {
        if (std::optional<ArrayRef<int64_t>> scatter = start.getScatter()) {
          for (size_t i = 1; i < scatter->size(); i += 2)
            moved += dp * (*scatter)[i] * 4;
        } else {
          moved += 2 * getTensorBytes(start.getBucket().getType());
        }
        return;
      }
      auto collective = dyn_cast<pcc::CollectiveOpInterface>(op);
      if (!collective)
        return;
      int64_t &into =
          collective.getMeshAxis() == kTensorParallelAxis ? tpMoved : moved;
      if (isa<pcc::AllReduceOp>(op))
        into += times * 2 * getTensorBytes(op->getResult(0).getType());
      else if (isa<pcc::AllGatherOp, pcc::AllGatherStartOp>(op))
        into += times * getTensorBytes(op->getResult(0).getType());
      else if (isa<pcc::ReduceScatterOp, pcc::ReduceScatterStartOp>(op))
        into += times * getTensorBytes(op->getOperand(0).getType());
    });
  }
  if (tpMoved > 0)
    os << "    tensor-parallel communication per step on each rank: "
       << llvm::format("%.3f", tpMoved / 1048576.0)
       << " MiB (activations, their gradients and the gradient norm; "
          "pcc-run measures it)\n";
  if (moved > 0)
    os << "    communication per step on each rank: "
       << llvm::format("%.3f", moved / (4.0 * psi))
       << " Psi = " << llvm::format("%.3f", moved / 1048576.0)
       << " MiB (pcc-run measures it)\n";
  if (moved > 0)
    os << "    data-parallel collectives in the program: " << bucketStarts
       << " gradient buckets and " << startedScatters
       << " reduce-scatters started during the backward pass, " << prefetched
       << " weight gathers started ahead (--zero-prefetch), " << blocking
       << " blocking\n";
}

static void explainTrainingMemory(ModuleOp module, const ExplainSettings &s,
                                  llvm::raw_ostream &os) {
  if (!module.lookupSymbol(pcc::kPhaseFunctions[0]))
    return explainPipelineMemory(module, s, os);
  const int64_t tp = s.tp, dp = s.dp;
  std::optional<pcc::TrainingConfig> training = pcc::getTrainingConfig(module);
  StepMemory p = predictStepMemory(module);
  int64_t weights = p.weights, grads = p.grads, optimizer = p.optimizer,
          inputs = p.inputs, saved = p.saved, arena = p.arena, host = p.host,
          crossing = p.crossing;
  bool offloaded = p.offloaded;
  auto mib = [](int64_t bytes) {
    return llvm::format("%10.3f MiB", bytes / 1048576.0);
  };
  if (dp * tp > 1)
    os << "  training memory on each of the " << dp * tp << " ranks ("
       << (tp > 1 ? "tp=" + std::to_string(tp) : std::string())
       << (tp > 1 && dp > 1 ? " x " : "")
       << (dp > 1 ? "dp=" + std::to_string(dp) : std::string())
       << "; predicted; pcc-run prints rank 0's measured high-water "
          "mark):\n";
  else
    os << "  training memory on one device (predicted; pcc-run prints the "
          "measured high-water mark):\n";
  os << "    weights            " << mib(weights) << "\n";
  os << "    gradients          " << mib(grads) << "\n";
  os << "    optimizer state    " << mib(optimizer)
     << (offloaded ? "  (the rest is in host memory: --offload)\n" : "\n");
  if (p.copies > 0)
    os << "    " << p.copyType << " weight copies " << mib(p.copies)
       << "  (cast once per step)\n";
  if (offloaded)
    os << "    to the host        " << mib(crossing)
       << "  (the collectives' results the host's update reads)\n";
  os << "    inputs and labels  " << mib(inputs) << "  (one micro-batch)\n";
  os << "    saved activations  " << mib(saved) << "  (one micro-batch)\n";
  os << "    scratch (arena)    " << mib(arena) << "  (the largest phase)\n";
  os << "    total              "
     << mib(weights + grads + optimizer + p.copies + inputs + saved + arena +
            crossing)
     << "\n";
  if (offloaded)
    os << "  in host memory (--offload=optimizer): " << mib(host)
       << "  (optimizer state, copies of the gradients and weights the "
          "update reads and writes, its inputs and arena)\n";
  if (grads > 0)
    explainTraffic(module, dp, explainModelState(module, p, dp, training, os),
                   training, os);
}

/// A pipelined training step's memory per pipeline rank (Memory.h).
static void explainPipelineMemory(ModuleOp module, const ExplainSettings &s,
                                  llvm::raw_ostream &os) {
  const int64_t tp = s.tp, dp = s.dp, zero = s.zero;
  std::vector<pcc::PipelineRankMemory> ranks =
      pcc::predictPipelineMemory(module);
  auto mib = [](int64_t bytes) {
    return llvm::format("%.3f", bytes / 1048576.0);
  };
  os << "  training memory per pipeline rank (MiB; predicted; pcc-run "
        "prints each rank's measured high-water mark"
     << (tp * dp > 1 ? ", the same on each of its " + std::to_string(tp * dp) +
                           " tp x dp ranks"
                     : std::string())
     << "):\n";
  for (auto [r, mem] : llvm::enumerate(ranks)) {
    std::string slots, sets;
    for (auto [c, count] : llvm::enumerate(mem.slotCounts)) {
      slots += (c ? "+" : "") + std::to_string(count);
      sets += (c ? "+" : "") + std::to_string(mem.stashCounts[c]);
    }
    os << "    rank " << r << ": " << mib(mem.total()) << " = state "
       << mib(mem.state) << " + " << slots << " stash slots " << mib(mem.slots)
       << " + " << sets << " B-to-W sets " << mib(mem.stash) << " + sends "
       << mib(mem.sendGrad) << " + arena " << mib(mem.arena) << " + "
       << mem.other << " bytes\n";
  }
  if (dp <= 1 || zero < 2)
    return;
  // Where ZeRO 2 and 3 keep the gradients between the micro-batches.
  bool sharded = false;
  module.walk([&](pcc::ParamOp p) {
    if (pcc::splitStateName(p.getName()).second == "grad" && p.getShardAttr() &&
        p.getShardAttr().getAxis() == kDataParallelAxis)
      sharded = true;
  });
  os << "  gradients (ZeRO " << zero << " over dp=" << dp << "): "
     << (sharded ? "reduce-scattered in every micro-batch's W phase into "
                   "this rank's pieces (--zero-grad-sync=microbatch)"
                 : "accumulated whole through the step, reduce-scattered once "
                   "per step in each rank's optimizer "
                   "(--zero-grad-sync=microbatch keeps only this rank's "
                   "pieces, for m times the bytes)")
     << "\n";
}

/// `pcc --explain`: what the lowering pipeline made of the model.
void explain(ModuleOp module, const ExplainSettings &s, llvm::raw_ostream &os) {
  const int64_t tp = s.tp, pp = s.pp, dp = s.dp, ppChunks = s.ppChunks;
  auto main = module.lookupSymbol<func::FuncOp>("main");
  os << "pcc explain: " << s.inputFile << "\n";
  os << "  plan: tp=" << tp << " pp=" << pp << " dp=" << dp
     << (tp * pp * dp == 1 ? " (one device)" : "");
  if (ppChunks > 1)
    os << " (" << ppChunks
       << " model chunks per pipeline rank: " << pp * ppChunks << " stages)";
  os << "\n";
  for (auto [kind, heading] :
       {std::pair{NoteKind::Import, "shared weights:"},
        std::pair{NoteKind::Sharding,
                  "tensor parallelism (each weight's split, and what the best "
                  "alternatives would cost; collectives):"},
        std::pair{NoteKind::Pipeline, "pipeline stages:"}}) {
    bool headed = false;
    for (auto &[noteKind, note] : s.notes) {
      if (noteKind != kind)
        continue;
      if (!headed)
        os << "  " << heading << "\n";
      headed = true;
      os << "    " << note << "\n";
    }
  }
  if (main)
    os << describeSchedule(main, pp);
  llvm::StringMap<int64_t> histogram;
  int64_t fusions = 0, fused = 0, intermediate = 0, flops = 0;
  llvm::StringSet<> weightNames;
  int64_t weightBytes = 0;
  std::vector<std::pair<int64_t, Operation *>> largest;
  module.walk([&](Operation *op) {
    // The mesh describes the devices; it computes nothing.
    if (!isa<pcc::PccDialect>(op->getDialect()) || isa<pcc::MeshOp>(op))
      return;
    if (op->getParentOfType<pcc::FusionOp>()) {
      if (op->hasTrait<OpTrait::Elementwise>())
        ++fused;
      return;
    }
    if (isa<pcc::FusionOp>(op))
      ++fusions;
    ++histogram[op->getName().stripDialect()];
    if (auto param = dyn_cast<pcc::ParamOp>(op)) {
      if (weightNames.insert(param.getName()).second)
        weightBytes += getTensorBytes(param.getType());
      return;
    }
    flops += pcc::opFlops(op);
    auto offsets = op->getAttrOfType<DenseI64ArrayAttr>(kBufferOffsetsAttrName);
    if (!offsets)
      return;
    for (auto [i, result] : llvm::enumerate(op->getResults()))
      if (offsets[i] >= 0) {
        intermediate += getTensorBytes(result.getType());
        largest.push_back({getTensorBytes(result.getType()), op});
      }
  });
  int64_t total = 0;
  for (auto &entry : histogram)
    total += entry.second;
  std::vector<std::pair<std::string, int64_t>> sorted;
  for (auto &entry : histogram)
    sorted.push_back({entry.first().str(), entry.second});
  llvm::sort(sorted, [](auto &a, auto &b) {
    return a.second != b.second ? a.second > b.second : a.first < b.first;
  });
  os << "  ops: " << total << " after fusion (";
  for (auto [i, entry] : llvm::enumerate(sorted))
    os << (i ? ", " : "") << entry.first << " " << entry.second;
  os << ")\n";
  os << "  fusion: " << fusions << " pcc.fusion kernels compute " << fused
     << " elementwise ops\n";
  os << "  compute: " << grouped(flops)
     << " FLOPs in products (matmuls, convolutions, attention)\n";
  int64_t arena = rankArenaBytes(module);
  os << "  memory plan: peak arena " << grouped(arena) << " bytes for "
     << grouped(intermediate) << " bytes of intermediate tensors";
  if (arena > 0)
    os << llvm::format(" (%.1fx reuse)", double(intermediate) / double(arena));
  os << "\n";
  if (main && !module->hasAttr(pcc::kTrainingAttrName)) {
    int64_t inBytes = 0, outBytes = 0;
    for (BlockArgument arg : main.getArguments())
      inBytes += getTensorBytes(arg.getType());
    for (Type t : main.getResultTypes())
      outBytes += getTensorBytes(t);
    os << "  weights: " << weightNames.size() << " tensors, "
       << grouped(weightBytes) << " bytes; inputs " << grouped(inBytes)
       << " bytes, outputs " << grouped(outBytes) << " bytes\n";
    os << "  device memory for one run: "
       << grouped(arena + weightBytes + inBytes + outBytes) << " bytes\n";
  } else {
    explainTrainingMemory(module, s, os);
  }
  llvm::sort(largest, [](auto &a, auto &b) { return a.first > b.first; });
  os << "  largest intermediate tensors:\n";
  for (auto &[bytes, op] : llvm::ArrayRef(largest).take_front(3))
    os << "    " << grouped(bytes)
       << " bytes: " << describeLocation(op->getLoc()) << " (" << op->getName()
       << ")\n";
}

} // namespace mlir::pcc
