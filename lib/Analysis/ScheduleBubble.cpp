//===- ScheduleBubble.cpp - --explain's schedule section ------------------===//
//
// Apart from Explain.cpp: pcc::schedule's namespace would make that file's
// `pcc::` (mlir::pcc) ambiguous.
//
//===----------------------------------------------------------------------===//

#include "pcc/Analysis/Explain.h"
#include "pcc/Dialect/Pcc/IR/ScheduleAttr.h"
#include "pcc/Schedule/Schedule.h"

#include "llvm/Support/raw_ostream.h"

#include <cstdio>

namespace mlir::pcc {

namespace {

std::string bubbleLine(const ::pcc::schedule::Schedule &s) {
  namespace sch = ::pcc::schedule;
  bool backward = !s.options.forwardOnly;
  int64_t chunks = s.options.chunks;
  sch::SimulateResult sim = sch::simulate(s);
  if (!sim.simulation || sim.simulation->bubbleFraction.empty())
    return "";
  char text[400];
  std::snprintf(
      text, sizeof(text),
      "    bubble with %s one unit%s: %.3f on the busiest rank (mean %.3f); "
      "%s = %.3f%s; pcc-run --trace measures it\n",
      backward ? "F, B and W" : "every F", backward ? " each" : "",
      sim.simulation->busiestBubbleFraction(),
      sim.simulation->meanBubbleFraction(),
      chunks > 1 ? "(p-1)/(v*m+p-1)" : "(p-1)/(m+p-1)",
      sch::analyticBubbleFraction(s.options),
      backward && chunks == 1
          ? " (GPipe's, and 1F1B's with its backward as one piece)"
          : "");
  return text;
}

} // namespace

std::string describeSchedule(Operation *main, int64_t pp) {
  std::optional<::pcc::schedule::Schedule> schedule =
      getPipelineSchedule(main);
  if (!schedule)
    return "";
  std::string text;
  llvm::raw_string_ostream os(text);
  const ::pcc::schedule::Options &options = schedule->options;
  os << "  schedule: " << ::pcc::schedule::policyName(options.policy) << ", "
     << options.microbatches << " micro-batches of the batch";
  if (options.chunks > 1)
    os << ", " << options.chunks
       << " chunks per rank (\"F3.1\": micro-batch 3 on chunk 1, stage 1 x "
       << pp << " + rank)";
  os << "; per pipeline rank:\n";
  for (size_t r = 0; r < schedule->ranks.size(); ++r)
    os << "    rank " << r << ": " << schedule->describeRank(r) << "\n";
  if (pp > 1)
    os << bubbleLine(*schedule);
  return text;
}

} // namespace mlir::pcc
