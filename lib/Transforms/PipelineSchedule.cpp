//===- PipelineSchedule.cpp - record the micro-batch schedule -------------===//

#include "pcc/Dialect/Pcc/IR/PccDialect.h"
#include "pcc/Schedule/Schedule.h"
#include "pcc/Transforms/Passes.h"
#include "pcc/Transforms/Training.h"

#include "mlir/IR/Builders.h"

namespace mlir::pcc {
#define GEN_PASS_DEF_PIPELINESCHEDULE
#include "pcc/Transforms/Passes.h.inc"
} // namespace mlir::pcc

using namespace mlir;
using namespace mlir::pcc;

namespace {

struct PipelineSchedulePass
    : public mlir::pcc::impl::PipelineScheduleBase<PipelineSchedulePass> {
  using PipelineScheduleBase::PipelineScheduleBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    auto main = module.lookupSymbol<func::FuncOp>("main");
    if (!main) {
      module.emitError("pipeline schedule: no func.func @main");
      return signalPassFailure();
    }
    int64_t stages = 0;
    module.walk([&](func::FuncOp f) {
      if (f->hasAttr(kStageAttrName))
        ++stages;
    });
    if (stages == 0)
      return; // not cut: nothing to schedule
    std::optional<::pcc::schedule::Policy> kind =
        ::pcc::schedule::parsePolicy(policy);
    if (!kind) {
      main.emitError("unknown pipeline schedule '")
          << policy << "' (gpipe, 1f1b, interleaved, zb-h1)";
      return signalPassFailure();
    }
    // Each pipeline rank runs `chunks` of the stages (interleaved).
    int64_t chunks = getPipelineChunks(module);
    if (stages % chunks != 0) {
      main.emitError("pipeline schedule: ")
          << stages << " stages do not make " << chunks
          << " chunks per pipeline rank";
      return signalPassFailure();
    }
    ::pcc::schedule::Options options;
    options.policy = *kind;
    options.stages = static_cast<int32_t>(stages / chunks);
    options.chunks = static_cast<int32_t>(chunks);
    options.microbatches = static_cast<int32_t>(microbatches);
    // A training program's lists have backward passes and their transfers.
    options.forwardOnly = !module->hasAttr(kTrainingAttrName);
    ::pcc::schedule::GenerateResult result = ::pcc::schedule::generate(options);
    if (!result.schedule) {
      main.emitError("pipeline schedule: ") << result.error;
      return signalPassFailure();
    }
    // Every list replays: each piece of work once, after what it needs,
    // and the messages between two ranks received in the order they are
    // sent (the transports pair them in order, with no tags).
    ::pcc::schedule::SimulateResult replayed =
        ::pcc::schedule::simulate(*result.schedule);
    if (!replayed.simulation) {
      main.emitError("pipeline schedule: ") << replayed.error;
      return signalPassFailure();
    }
    // The runtime issues the transfers between two computes as one group;
    // on NCCL that must not deadlock either.
    std::string grouped =
        groupedTransfers
            ? ::pcc::schedule::checkGroupedTransfers(*result.schedule)
            : std::string();
    if (!grouped.empty()) {
      main.emitError("pipeline schedule: ") << grouped;
      return signalPassFailure();
    }
    // One string per rank, as Schedule::describe prints it.
    Builder b(module.getContext());
    SmallVector<Attribute> ranks;
    for (size_t r = 0; r < result.schedule->ranks.size(); ++r)
      ranks.push_back(b.getStringAttr(result.schedule->describeRank(r)));
    SmallVector<NamedAttribute> fields{
        b.getNamedAttr("policy", b.getStringAttr(policy)),
        b.getNamedAttr("microbatches", b.getI64IntegerAttr(microbatches)),
        b.getNamedAttr("ranks", b.getArrayAttr(ranks)),
    };
    if (chunks > 1)
      fields.push_back(b.getNamedAttr("chunks", b.getI64IntegerAttr(chunks)));
    main->setAttr("pcc.schedule", b.getDictionaryAttr(fields));
  }
};

} // namespace
