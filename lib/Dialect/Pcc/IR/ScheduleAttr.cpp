//===- ScheduleAttr.cpp - a pipelined main's schedule, typed --------------===//

#include "pcc/Dialect/Pcc/IR/ScheduleAttr.h"
#include "pcc/Dialect/Pcc/IR/Contracts.h"

#include "llvm/ADT/STLExtras.h"

#include <cstdint>

using namespace mlir;
using namespace mlir::pcc;

namespace {

using EmitError = llvm::function_ref<InFlightDiagnostic()>;

LogicalResult readCount(Attribute attr, StringRef what, int64_t &out,
                        EmitError emitError) {
  auto value = dyn_cast_if_present<IntegerAttr>(attr);
  if (!value || value.getInt() < 1 || value.getInt() > INT32_MAX)
    return emitError() << what << " must be a positive 32-bit integer";
  out = value.getInt();
  return success();
}

} // namespace

LogicalResult
mlir::pcc::parseScheduleAttr(DictionaryAttr attr,
                             ::pcc::schedule::Schedule &schedule,
                             EmitError emitError) {
  namespace sch = ::pcc::schedule;
  auto policy = attr.getAs<StringAttr>("policy");
  auto lists = attr.getAs<ArrayAttr>("ranks");
  std::optional<sch::Policy> parsed =
      policy ? sch::parsePolicy(policy.str()) : std::nullopt;
  if (!parsed)
    return emitError() << "pcc.schedule policy must be gpipe, 1f1b, "
                          "interleaved or zb-h1";
  if (!lists || lists.empty() ||
      !llvm::all_of(lists, llvm::IsaPred<StringAttr>))
    return emitError() << "pcc.schedule ranks must be one instruction list "
                          "(a string) per pipeline rank";
  int64_t microbatches = 0, chunks = 1;
  if (failed(readCount(attr.get("microbatches"), "pcc.schedule microbatches",
                       microbatches, emitError)))
    return failure();
  if (Attribute c = attr.get("chunks"))
    if (failed(readCount(c, "pcc.schedule chunks", chunks, emitError)))
      return failure();
  for (NamedAttribute entry : attr)
    if (!llvm::is_contained({"policy", "ranks", "microbatches", "chunks"},
                            entry.getName().getValue()))
      return emitError() << "pcc.schedule: unknown entry '"
                         << entry.getName().getValue()
                         << "' (policy, microbatches, chunks, ranks)";
  schedule.options.policy = *parsed;
  schedule.options.stages = static_cast<int32_t>(lists.size());
  schedule.options.microbatches = static_cast<int32_t>(microbatches);
  schedule.options.chunks = static_cast<int32_t>(chunks);
  schedule.options.forwardOnly = true;
  schedule.ranks.clear();
  for (auto [r, text] : llvm::enumerate(lists.getAsValueRange<StringAttr>())) {
    std::vector<sch::Instr> &list = schedule.ranks.emplace_back();
    SmallVector<StringRef> words;
    text.split(words, ' ', -1, /*KeepEmpty=*/false);
    for (StringRef word : words) {
      std::optional<sch::Instr> instr = sch::parseInstr(word.str());
      bool transfer = instr && instr->op != sch::Op::Forward &&
                      instr->op != sch::Op::Backward &&
                      instr->op != sch::Op::WeightGrad;
      if (!instr || instr->microbatch >= microbatches ||
          instr->chunk >= chunks ||
          (transfer && (instr->peer < 0 ||
                        instr->peer >= static_cast<int64_t>(lists.size()))))
        return emitError() << "pcc.schedule rank " << r << ": '" << word
                           << "' is not an instruction of " << lists.size()
                           << " ranks, " << microbatches
                           << " micro-batches and " << chunks << " chunk"
                           << (chunks == 1 ? "" : "s");
      if (instr->op == sch::Op::Backward || instr->op == sch::Op::WeightGrad)
        schedule.options.forwardOnly = false;
      list.push_back(*instr);
    }
  }
  return success();
}

std::optional<::pcc::schedule::Schedule>
mlir::pcc::getPipelineSchedule(Operation *main) {
  auto attr = main ? main->getAttrOfType<DictionaryAttr>(kScheduleAttrName)
                   : DictionaryAttr();
  if (!attr)
    return std::nullopt;
  ::pcc::schedule::Schedule schedule;
  if (failed(parseScheduleAttr(attr, schedule,
                               [&] { return main->emitError(); })))
    return std::nullopt;
  return schedule;
}
