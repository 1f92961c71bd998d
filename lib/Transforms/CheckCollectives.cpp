//===- CheckCollectives.cpp - every group's ranks issue the same collectives
//===//
//
// pcc-check-collectives (see Passes.td). pcc knows the program of every
// rank: the training phases, @main, or a pipeline rank's stages. For each
// mesh axis and each group of ranks along it (the ranks that differ only in
// that coordinate), the collectives over that axis must be the same on
// every member, in the same order, with the same types; otherwise the job
// would hang or exchange garbage at run time.
//
//===----------------------------------------------------------------------===//

#include "pcc/Dialect/Pcc/IR/PccDialect.h"
#include "pcc/Dialect/Pcc/IR/PccInterfaces.h"
#include "pcc/Transforms/Passes.h"
#include "pcc/Transforms/Training.h"

namespace mlir::pcc {
#define GEN_PASS_DEF_CHECKCOLLECTIVES
#include "pcc/Transforms/Passes.h.inc"
} // namespace mlir::pcc

using namespace mlir;
using namespace mlir::pcc;

namespace {

/// The collectives over one axis that one program issues, in order.
SmallVector<Operation *> collectivesOver(ArrayRef<func::FuncOp> program,
                                         StringRef axis) {
  SmallVector<Operation *> out;
  for (func::FuncOp f : program)
    f.walk([&](Operation *op) {
      if (auto c = dyn_cast<CollectiveOpInterface>(op);
          c && c.getMeshAxis() == axis)
        out.push_back(op);
    });
  return out;
}

/// "all_reduce of tensor<4x256xf32>".
std::string describe(Operation *op) {
  std::string text;
  llvm::raw_string_ostream os(text);
  os << op->getName().stripDialect() << " of " << op->getOperand(0).getType();
  if (op->getNumResults())
    os << " -> " << op->getResult(0).getType();
  return text;
}

bool sameCollective(Operation *a, Operation *b) {
  return a->getName() == b->getName() &&
         a->getOperandTypes() == b->getOperandTypes() &&
         a->getResultTypes() == b->getResultTypes();
}

struct CheckCollectivesPass
    : public mlir::pcc::impl::CheckCollectivesBase<CheckCollectivesPass> {
  using CheckCollectivesBase::CheckCollectivesBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    MeshOp mesh = getMesh(module);
    if (!mesh)
      return;
    // The pipeline axis: rank p runs the stages k with k mod pp == p (the
    // interleaved schedule's placement; one stage each otherwise), every
    // micro-batch in stage order. Every other rank runs the whole program.
    int64_t pp = 1;
    if (std::optional<int64_t> size = mesh.getAxisSize(kPipelineAxis))
      pp = *size;
    SmallVector<func::FuncOp> stages;
    module.walk([&](func::FuncOp f) {
      if (auto k = f->getAttrOfType<IntegerAttr>(kStageAttrName)) {
        if (static_cast<size_t>(k.getInt()) >= stages.size())
          stages.resize(k.getInt() + 1);
        stages[k.getInt()] = f;
      }
    });
    SmallVector<SmallVector<func::FuncOp>> programs;
    // A pipelined training step: pipeline rank r runs its zero-grad, the
    // F, B and W phases of its stages (per micro-batch, as its list says),
    // then its optimizer, whose collectives over pp (tied weights' sums,
    // the norm) every rank must join in one order.
    SmallVector<func::FuncOp> zeroGrads, optimizers;
    for (func::FuncOp f : module.getOps<func::FuncOp>())
      if (auto r = f->getAttrOfType<IntegerAttr>(kPipelineRankAttrName)) {
        auto &into =
            f->getAttrOfType<StringAttr>(kPhaseAttrName) &&
                    f->getAttrOfType<StringAttr>(kPhaseAttrName).getValue() ==
                        kPhaseNames[3]
                ? zeroGrads
                : optimizers;
        if (into.size() <= static_cast<size_t>(r.getInt()))
          into.resize(r.getInt() + 1);
        into[r.getInt()] = f;
      }
    if (!optimizers.empty() && pp > 1) {
      SmallVector<std::array<func::FuncOp, 3>> phases =
          getPipelineStagePhases(module);
      programs.resize(pp);
      for (int64_t r = 0; r < pp; ++r) {
        func::FuncOp zero = static_cast<size_t>(r) < zeroGrads.size()
                                ? zeroGrads[r]
                                : func::FuncOp();
        func::FuncOp opt = static_cast<size_t>(r) < optimizers.size()
                               ? optimizers[r]
                               : func::FuncOp();
        if (!zero || !opt) {
          module.emitError("pcc-check-collectives: pipeline rank ")
              << r << " has no optimizer or zero-grad phase";
          return signalPassFailure();
        }
        programs[r].push_back(zero);
        for (size_t k = r; k < phases.size(); k += pp)
          for (func::FuncOp f : phases[k])
            if (f)
              programs[r].push_back(f);
        programs[r].push_back(opt);
      }
    } else if (!stages.empty() && pp > 1) {
      programs.resize(pp);
      for (auto [k, f] : llvm::enumerate(stages)) {
        if (!f) {
          module.emitError("pcc-check-collectives: pipeline stage ")
              << k << " has no function";
          return signalPassFailure();
        }
        programs[k % pp].push_back(f);
      }
    } else {
      programs.emplace_back();
      for (func::FuncOp f : module.getOps<func::FuncOp>())
        programs.back().push_back(f);
    }
    // Only the pipeline axis gives the members of a group different
    // programs: along any other axis the members share their pp coordinate
    // and so run one program, and matching holds by construction.
    for (auto [axis, size] : llvm::zip(mesh.getAxes(), mesh.getShape())) {
      StringRef name = cast<StringAttr>(axis).getValue();
      if (size <= 1 || name != kPipelineAxis)
        continue;
      SmallVector<SmallVector<Operation *>> issued;
      for (auto &program : programs)
        issued.push_back(collectivesOver(program, name));
      for (size_t r = 1; r < issued.size(); ++r) {
        const auto &first = issued[0], &other = issued[r];
        size_t n = std::min(first.size(), other.size());
        for (size_t i = 0; i <= n; ++i) {
          if (i < n && sameCollective(first[i], other[i]))
            continue;
          if (i == n && first.size() == other.size())
            break;
          Operation *here = i < other.size() ? other[i] : first[i];
          auto diag = here->emitError("collectives over '")
                      << name << "' do not match: ";
          auto say = [&](size_t rank, const SmallVector<Operation *> &ops) {
            diag << "pipeline rank " << rank << " (" << name << "=" << rank
                 << ") issues ";
            if (i < ops.size())
              diag << "collective #" << i + 1 << " " << describe(ops[i]);
            else
              diag << "no collective #" << i + 1 << " (it issues " << ops.size()
                   << ")";
          };
          say(0, first);
          diag << " but ";
          say(r, other);
          diag << "; the job would hang or exchange mismatched data";
          Operation *there = i < first.size() ? first[i] : nullptr;
          if (there && there != here)
            diag.attachNote(there->getLoc())
                << "pipeline rank 0's collective #" << i + 1 << " is here";
          return signalPassFailure();
        }
      }
    }
  }
};

} // namespace
