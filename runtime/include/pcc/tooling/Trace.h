//===- Trace.h - pipeline timelines: Chrome trace, SVG, bubble --*- C++ -*-===//
//
// Every rank's steps of one pipelined run (pccrt::TraceEvent), gathered on
// rank 0, become a Chrome-trace / Perfetto JSON file (compute, send, recv
// and idle intervals per rank), an SVG Gantt chart, and the measured bubble
// fraction per rank: the share of the run's makespan the rank spent not
// computing.
//
//===----------------------------------------------------------------------===//

#ifndef PCC_TOOLING_TRACE_H
#define PCC_TOOLING_TRACE_H

#include "pcc/runtime/Communicator.h"
#include "pcc/runtime/ModelLibrary.h"
#include "pcc/runtime/Pipeline.h"
#include "pcc/runtime/Result.h"

#include <string>
#include <vector>

namespace pccrun {

/// One rank's row of the timeline.
struct RankTrace {
  int rank = 0;
  /// "pp=1, tp=0"
  std::string coords;
  /// The stages the rank runs, as "stage 1" or "stages 1, 3".
  std::string stages;
  std::vector<pccrt::TraceEvent> events;
};

/// What the run was, for titles.
struct TraceInfo {
  std::string model;
  std::string policy;
  int pipelineRanks = 1;
  int microbatches = 1;
  /// Model chunks per pipeline rank (the interleaved schedule).
  int chunks = 1;
  /// The library's schedule tables, replayed beside the measurement (none:
  /// not replayed).
  const pcc_model_info *tables = nullptr;
};

/// What replaying the library's schedule lists gives (pcc::schedule's
/// simulate): with F, B and W one unit each, and with the run's measured
/// mean F, B and W of every stage and no transfer time. Bubbles are
/// per-rank shares of the replay's makespan; "busiest" is that of the rank
/// computing longest, the one that sets the step.
struct ScheduleReplay {
  double unitBusiest = 0, unitMean = 0;
  double measuredBusiest = 0, measuredMean = 0;
};
/// The replay, or an error (a library whose lists do not replay).
pccrt::Result<ScheduleReplay>
replaySchedule(const pcc_model_info &model, const std::vector<RankTrace> &rows);

/// The run's makespan: the latest end of any rank's step, not counting a
/// training step's optimizer after the pipeline's flush.
double makespan(const std::vector<RankTrace> &ranks);
/// 1 - (the rank's compute time, its zero-grad's included) / makespan.
double bubbleFraction(const RankTrace &rank, double makespan);
/// The analytic bubble of GPipe and 1F1B, (p - 1) / (m + p - 1), and of
/// interleaved 1F1B with v chunks per rank, (p - 1) / (v m + p - 1).
double analyticBubble(int pipelineRanks, int microbatches, int chunks);
/// "(p-1)/(m+p-1)" or, with chunks, "(p-1)/(v*m+p-1)".
const char *analyticBubbleFormula(int chunks);

/// The rows of a pipelined library's timeline from every rank's events
/// (world rank order): each labelled with its mesh coordinates ("dp=1,
/// pp=0, tp=1") and the stages its pipeline rank runs.
std::vector<RankTrace>
timelineRows(const pccrt::ModelLibrary &library,
             std::vector<std::vector<pccrt::TraceEvent>> events);

/// Every rank's events on rank 0 (a collective over `world`; the other
/// ranks get an empty list).
pccrt::Result<std::vector<std::vector<pccrt::TraceEvent>>>
gatherEvents(pccrt::Communicator &world,
             const std::vector<pccrt::TraceEvent> &mine);
/// Prints the makespan, each rank's compute time and bubble next to the
/// analytic bubble, and writes the Chrome trace and SVG files named (none
/// when empty).
pccrt::Status reportTimeline(const TraceInfo &info,
                             const std::vector<RankTrace> &rows, bool cuda,
                             const std::string &json, const std::string &svg);

pccrt::Status writeChromeTrace(const std::string &path, const TraceInfo &info,
                               const std::vector<RankTrace> &ranks);
pccrt::Status writeSvg(const std::string &path, const TraceInfo &info,
                       const std::vector<RankTrace> &ranks);

} // namespace pccrun

#endif // PCC_TOOLING_TRACE_H
