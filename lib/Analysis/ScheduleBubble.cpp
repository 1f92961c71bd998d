//===- ScheduleBubble.cpp - --explain's bubble line for a schedule --------===//
//
// Apart from Explain.cpp: pcc::schedule's namespace would make that file's
// `pcc::` (mlir::pcc) ambiguous.
//
//===----------------------------------------------------------------------===//

#include "pcc/Analysis/Explain.h"
#include "pcc/Schedule/Schedule.h"

#include <cstdio>
#include <sstream>

namespace mlir::pcc {

std::string scheduleBubbleLine(const std::string &policy, int64_t pp,
                               int64_t microbatches, int64_t chunks,
                               const std::vector<std::string> &ranks) {
  namespace sch = ::pcc::schedule;
  sch::Schedule s;
  s.options.stages = static_cast<int32_t>(pp);
  s.options.microbatches = static_cast<int32_t>(microbatches);
  s.options.chunks = static_cast<int32_t>(chunks);
  if (auto p = sch::parsePolicy(policy))
    s.options.policy = *p;
  bool backward = false;
  for (const std::string &line : ranks) {
    s.ranks.emplace_back();
    std::istringstream words(line);
    for (std::string word; words >> word;) {
      std::optional<sch::Instr> i = sch::parseInstr(word);
      if (!i)
        return "";
      backward |= i->op == sch::Op::Backward;
      s.ranks.back().push_back(*i);
    }
  }
  s.options.forwardOnly = !backward;
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

} // namespace mlir::pcc
