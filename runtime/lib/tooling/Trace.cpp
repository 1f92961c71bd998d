//===- Trace.cpp - pipeline timelines: Chrome trace, SVG, bubble ----------===//

#include "pcc/tooling/Trace.h"

#include "pcc/Schedule/Schedule.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

using pccrt::Error;
using pccrt::Status;
using pccrt::TraceEvent;

namespace pccrun {

std::vector<RankTrace>
timelineRows(const pccrt::ModelLibrary &library,
             std::vector<std::vector<TraceEvent>> events) {
  const pcc_model_info &info = library.info();
  std::vector<RankTrace> rows;
  for (size_t rank = 0; rank < events.size(); ++rank) {
    // The mesh coordinates of world rank `rank`, the last axis fastest.
    std::vector<int64_t> c(static_cast<size_t>(info.num_mesh_axes));
    int64_t rest = static_cast<int64_t>(rank);
    for (int a = info.num_mesh_axes - 1; a >= 0; --a) {
      c[a] = rest % info.mesh_sizes[a];
      rest /= info.mesh_sizes[a];
    }
    std::string coords;
    for (int a = 0; a < info.num_mesh_axes; ++a)
      if (info.mesh_sizes[a] > 1)
        coords += (coords.empty() ? "" : ", ") +
                  std::string(info.mesh_axes[a]) + "=" + std::to_string(c[a]);
    int32_t pipeRank = info.pipeline_axis >= 0
                           ? static_cast<int32_t>(c[info.pipeline_axis])
                           : 0;
    std::vector<int32_t> held = library.stagesOf(pipeRank);
    std::string stages = held.size() > 1 ? "stages " : "stage ";
    for (size_t i = 0; i < held.size(); ++i)
      stages += (i ? ", " : "") + std::to_string(held[i]);
    rows.push_back(
        {static_cast<int>(rank), coords, stages, std::move(events[rank])});
  }
  return rows;
}

pccrt::Result<std::vector<std::vector<TraceEvent>>>
gatherEvents(pccrt::Communicator &world, const std::vector<TraceEvent> &mine) {
  using pccrt::DType;
  std::vector<std::vector<TraceEvent>> all(
      static_cast<size_t>(world.rank() == 0 ? world.size() : 0));
  if (world.rank() == 0)
    all[0] = mine;
  for (int r = 1; r < world.size(); ++r) {
    int64_t count = static_cast<int64_t>(mine.size());
    Status s = Status::success();
    if (world.rank() == r) {
      s = world.send(&count, 1, DType::I64, 0);
      if (s.ok() && count)
        s = world.send(mine.data(), count * sizeof(TraceEvent), DType::U8, 0);
    } else if (world.rank() == 0) {
      s = world.recv(&count, 1, DType::I64, r);
      all[r].resize(static_cast<size_t>(count));
      if (s.ok() && count)
        s = world.recv(all[r].data(), count * sizeof(TraceEvent), DType::U8, r);
    }
    if (!s.ok())
      return Error{"gathering the timeline on rank 0: " + s.error()};
  }
  return all;
}

Status reportTimeline(const TraceInfo &info, const std::vector<RankTrace> &rows,
                      bool cuda, const std::string &json,
                      const std::string &svg) {
  double span = makespan(rows);
  double mean = 0;
  // The busiest rank's compute sets the step; the others' extra idle time
  // is the stages' imbalance, not the schedule's.
  double busiest = 0, totalCompute = 0, busiestBubble = 0;
  std::printf("timeline of the last run: makespan %.3f ms\n", span * 1e3);
  for (const RankTrace &r : rows) {
    double compute = 0, zeroGrad = 0, optimizer = 0;
    for (const TraceEvent &e : r.events) {
      if (e.kind == TraceEvent::Kind::Compute)
        compute += e.end - e.start;
      else if (e.kind == TraceEvent::Kind::ZeroGrad)
        zeroGrad += e.end - e.start;
      else if (e.kind == TraceEvent::Kind::Optimizer)
        optimizer += e.end - e.start;
    }
    double bubble = bubbleFraction(r, span);
    mean += bubble / static_cast<double>(rows.size());
    totalCompute += compute;
    if (compute > busiest) {
      busiest = compute;
      busiestBubble = bubble;
    }
    std::printf("  rank %d [%s] %s: compute %.3f ms, bubble %.3f", r.rank,
                r.coords.c_str(), r.stages.c_str(), compute * 1e3, bubble);
    // A training step's phases around the pipeline.
    if (zeroGrad > 0 || optimizer > 0)
      std::printf(" (zero-grad %.3f ms before, optimizer %.3f ms after)",
                  zeroGrad * 1e3, optimizer * 1e3);
    std::printf("\n");
  }
  if (cuda)
    std::printf("  (on CUDA, a compute step is timed until its stream is "
                "done and a receive until its data arrived; sends are timed "
                "as queued, on the transfer stream)\n");
  std::printf(
      "  mean bubble %.3f; %s = %.3f for p=%d, m=%d", mean,
      analyticBubbleFormula(info.chunks),
      analyticBubble(info.pipelineRanks, info.microbatches, info.chunks),
      info.pipelineRanks, info.microbatches);
  std::printf(info.chunks > 1 ? ", v=%d\n" : "\n", info.chunks);
  if (rows.size() > 1 && totalCompute > 0)
    std::printf("  busiest rank's bubble %.3f (the schedule's); compute "
                "imbalance %.3f (busiest / mean rank), which the other ranks "
                "wait out\n",
                busiestBubble,
                busiest / (totalCompute / static_cast<double>(rows.size())));
  if (info.tables && info.pipelineRanks > 1) {
    auto replay = replaySchedule(*info.tables, rows);
    bool training = info.tables->num_phases > 0;
    // The measurement stands without the replay: say why it is missing.
    if (!replay.ok())
      std::printf("  (the schedule's lists do not replay: %s)\n",
                  replay.error().c_str());
    else
      std::printf("  the schedule's lists replayed: with %s one unit%s, "
                  "busiest rank's bubble %.3f (mean %.3f); with this run's %s "
                  "per stage and free transfers, %.3f (mean %.3f)\n",
                  training ? "F, B and W" : "every F", training ? " each" : "",
                  replay->unitBusiest, replay->unitMean,
                  training ? "F, B and W" : "F", replay->measuredBusiest,
                  replay->measuredMean);
  }
  if (!json.empty()) {
    Status s = writeChromeTrace(json, info, rows);
    if (!s.ok())
      return s;
    std::printf("  wrote %s (open in chrome://tracing or ui.perfetto.dev)\n",
                json.c_str());
  }
  if (!svg.empty()) {
    Status s = writeSvg(svg, info, rows);
    if (!s.ok())
      return s;
    std::printf("  wrote %s\n", svg.c_str());
  }
  return Status::success();
}

namespace {
using pcc::schedule::kAbiOps;
using SOp = pcc::schedule::Op;
static_assert(kAbiOps[PCC_PIPE_FORWARD] == SOp::Forward &&
                  kAbiOps[PCC_PIPE_SEND_FORWARD] == SOp::SendForward &&
                  kAbiOps[PCC_PIPE_RECV_FORWARD] == SOp::RecvForward &&
                  kAbiOps[PCC_PIPE_BACKWARD] == SOp::Backward &&
                  kAbiOps[PCC_PIPE_WEIGHT_GRAD] == SOp::WeightGrad &&
                  kAbiOps[PCC_PIPE_SEND_BACKWARD] == SOp::SendBackward &&
                  kAbiOps[PCC_PIPE_RECV_BACKWARD] == SOp::RecvBackward,
              "pcc::schedule::kAbiOps follows enum pcc_pipeline_op");
} // namespace

pccrt::Result<ScheduleReplay>
replaySchedule(const pcc_model_info &model,
               const std::vector<RankTrace> &rows) {
  namespace sch = pcc::schedule;
  int32_t p = model.num_pipeline_ranks, stages = model.num_stages;
  if (p < 1 || stages % p != 0)
    return Error{std::to_string(stages) + " stages over " + std::to_string(p) +
                 " pipeline ranks"};
  sch::Schedule schedule;
  schedule.options.stages = p;
  schedule.options.microbatches = model.microbatches;
  schedule.options.chunks = stages / p;
  schedule.options.forwardOnly = model.num_phases == 0;
  if (auto policy =
          sch::parsePolicy(model.schedule_policy ? model.schedule_policy : ""))
    schedule.options.policy = *policy;
  schedule.ranks.resize(static_cast<size_t>(p));
  for (int32_t r = 0; r < p; ++r)
    for (int32_t n = 0; n < model.schedule_lengths[r]; ++n) {
      const pcc_pipeline_instr &in = model.schedules[r][n];
      if (in.op < 0 || in.op >= sch::kNumAbiOps)
        return Error{"an unknown instruction " + std::to_string(in.op)};
      sch::Op op = sch::kAbiOps[in.op];
      schedule.ranks[r].push_back({op, in.microbatch, in.stage / p, in.peer});
    }
  // Each stage's mean F, B and W over its micro-batches and over the ranks
  // that run it (data- and tensor-parallel replicas).
  sch::Durations measured;
  std::vector<double> sum[3], count[3];
  for (int k = 0; k < 3; ++k) {
    sum[k].assign(static_cast<size_t>(stages), 0);
    count[k].assign(static_cast<size_t>(stages), 0);
  }
  for (const RankTrace &row : rows)
    for (const TraceEvent &e : row.events) {
      if (e.kind != TraceEvent::Kind::Compute || e.stage < 0 ||
          e.stage >= stages)
        continue;
      int k = e.work == 'F' ? 0 : e.work == 'B' ? 1 : 2;
      sum[k][e.stage] += e.end - e.start;
      count[k][e.stage] += 1;
    }
  std::vector<double> *of[3] = {&measured.forwardOf, &measured.backwardOf,
                                &measured.weightGradOf};
  for (int k = 0; k < 3; ++k)
    for (int32_t s = 0; s < stages; ++s)
      of[k]->push_back(count[k][s] > 0 ? sum[k][s] / count[k][s] : 0);
  auto bubbles = [&](const sch::Durations &d, double &busiest,
                     double &mean) -> pccrt::Status {
    sch::SimulateResult sim = sch::simulate(schedule, d);
    if (!sim.simulation)
      return Error{sim.error};
    busiest = sim.simulation->busiestBubbleFraction();
    mean = sim.simulation->meanBubbleFraction();
    return pccrt::Status::success();
  };
  ScheduleReplay out;
  pccrt::Status s = bubbles(sch::Durations{}, out.unitBusiest, out.unitMean);
  if (s.ok())
    s = bubbles(measured, out.measuredBusiest, out.measuredMean);
  if (!s.ok())
    return Error{s.error()};
  return out;
}

double makespan(const std::vector<RankTrace> &ranks) {
  double end = 0;
  for (const RankTrace &r : ranks)
    for (const TraceEvent &e : r.events)
      if (e.kind != TraceEvent::Kind::Optimizer)
        end = std::max(end, e.end);
  return end;
}

double bubbleFraction(const RankTrace &rank, double span) {
  if (span <= 0)
    return 0;
  double busy = 0;
  for (const TraceEvent &e : rank.events)
    if (e.kind == TraceEvent::Kind::Compute ||
        e.kind == TraceEvent::Kind::ZeroGrad)
      busy += e.end - e.start;
  return std::clamp(1 - busy / span, 0.0, 1.0);
}

namespace {
/// The end of every event, the optimizer's included: the width of a
/// drawn timeline.
double drawnSpan(const std::vector<RankTrace> &ranks) {
  double end = 0;
  for (const RankTrace &r : ranks)
    for (const TraceEvent &e : r.events)
      end = std::max(end, e.end);
  return end;
}
} // namespace

double analyticBubble(int p, int m, int v) {
  return double(p - 1) / double(v * m + p - 1);
}

const char *analyticBubbleFormula(int chunks) {
  return chunks > 1 ? "(p-1)/(v*m+p-1)" : "(p-1)/(m+p-1)";
}

namespace {

/// `s` inside a JSON string.
std::string json(const std::string &s) {
  std::string out;
  for (char c : s) {
    unsigned char u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20 || u >= 0x80) {
      // Control characters, and bytes that may not be UTF-8, as escapes.
      char escaped[8];
      std::snprintf(escaped, sizeof(escaped), "\\u%04x", u);
      out += escaped;
    } else {
      out += c;
    }
  }
  return out;
}

/// `s` as SVG (XML) text.
std::string escape(const std::string &s) {
  std::string out;
  for (char c : s) {
    if (c == '<')
      out += "&lt;";
    else if (c == '>')
      out += "&gt;";
    else if (c == '&')
      out += "&amp;";
    else
      out += c;
  }
  return out;
}

/// "F3 (stage 1)", "send 3 > 2", "recv 3 < 0", "wait for sends".
std::string label(const TraceEvent &e) {
  switch (e.kind) {
  case TraceEvent::Kind::Compute:
    return std::string(1, e.work) + std::to_string(e.microbatch) + " (stage " +
           std::to_string(e.stage) + ")";
  case TraceEvent::Kind::Send:
    return "send " + std::to_string(e.microbatch) + " to pp " +
           std::to_string(e.peer);
  case TraceEvent::Kind::Recv:
    return "recv " + std::to_string(e.microbatch) + " from pp " +
           std::to_string(e.peer);
  case TraceEvent::Kind::WaitSends:
    return "wait for sends";
  case TraceEvent::Kind::ZeroGrad:
    return "zero-grad";
  case TraceEvent::Kind::Optimizer:
    return "optimizer";
  }
  return "?";
}

/// The rank's idle intervals within [0, span]: the gaps between its steps.
std::vector<std::pair<double, double>> idleIntervals(const RankTrace &r,
                                                     double span) {
  std::vector<std::pair<double, double>> gaps;
  double at = 0;
  for (const TraceEvent &e : r.events) {
    if (e.kind == TraceEvent::Kind::Optimizer)
      continue;
    if (e.start > at)
      gaps.emplace_back(at, e.start);
    at = std::max(at, e.end);
  }
  if (span > at)
    gaps.emplace_back(at, span);
  return gaps;
}

Status writeFile(const std::string &path, const std::string &text) {
  std::ofstream out(path, std::ios::binary);
  if (!out)
    return Error{"cannot write '" + path + "': " + std::strerror(errno)};
  out << text;
  out.close();
  if (!out)
    return Error{"cannot write '" + path + "': " + std::strerror(errno)};
  return Status::success();
}

} // namespace

Status writeChromeTrace(const std::string &path, const TraceInfo &info,
                        const std::vector<RankTrace> &ranks) {
  double span = makespan(ranks);
  std::ostringstream os;
  os.precision(3);
  os << std::fixed;
  os << "{\"displayTimeUnit\": \"ms\", \"otherData\": {\"model\": \""
     << json(info.model) << "\", \"schedule\": \"" << json(info.policy)
     << "\", \"pipeline_ranks\": " << info.pipelineRanks
     << ", \"microbatches\": " << info.microbatches
     << ", \"chunks\": " << info.chunks << "},\n"
     << "\"traceEvents\": [\n";
  bool first = true;
  auto event = [&](const std::string &text) {
    os << (first ? "" : ",\n") << text;
    first = false;
  };
  for (const RankTrace &r : ranks) {
    std::ostringstream name;
    name << "rank " << r.rank << " [" << r.coords << "] " << r.stages
         << ", bubble " << std::lround(100 * bubbleFraction(r, span)) << "%";
    event("{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 0, \"tid\": " +
          std::to_string(r.rank) + ", \"args\": {\"name\": \"" +
          json(name.str()) + "\"}}");
    auto interval = [&](const std::string &label, const char *category,
                        double start, double end, const std::string &args) {
      std::ostringstream e;
      e.precision(3);
      e << std::fixed << "{\"name\": \"" << json(label) << "\", \"cat\": \""
        << category << "\", \"ph\": \"X\", \"pid\": 0, \"tid\": " << r.rank
        << ", \"ts\": " << start * 1e6 << ", \"dur\": " << (end - start) * 1e6
        << ", \"args\": {" << args << "}}";
      event(e.str());
    };
    for (const TraceEvent &e : r.events)
      interval(label(e), pccrt::traceKindName(e.kind), e.start, e.end,
               "\"stage\": " + std::to_string(e.stage) +
                   ", \"microbatch\": " + std::to_string(e.microbatch));
    for (auto [start, end] : idleIntervals(r, span))
      interval("idle", "idle", start, end, "");
  }
  os << "\n]}\n";
  return writeFile(path, os.str());
}

Status writeSvg(const std::string &path, const TraceInfo &info,
                const std::vector<RankTrace> &ranks) {
  double span = makespan(ranks), drawn = drawnSpan(ranks);
  const int left = 250, right = 50, top = 56, row = 34, bar = 24;
  const int plot = 900;
  int width = left + plot + right;
  int height = top + row * static_cast<int>(ranks.size()) + 50;
  auto x = [&](double t) { return left + (drawn > 0 ? t / drawn : 0) * plot; };
  std::ostringstream os;
  os.precision(2);
  os << std::fixed;
  os << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width
     << "\" height=\"" << height << "\" font-family=\"sans-serif\" "
     << "font-size=\"12\">\n"
     << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  double mean = 0;
  for (const RankTrace &r : ranks)
    mean += bubbleFraction(r, span);
  mean /= std::max<size_t>(ranks.size(), 1);
  std::ostringstream title;
  title.precision(3);
  title << std::fixed << escape(info.model) << ": " << info.pipelineRanks
        << " pipeline ranks";
  if (info.chunks > 1)
    title << " x " << info.chunks << " chunks";
  title << ", " << info.microbatches << " micro-batches, "
        << escape(info.policy) << "; makespan " << span * 1e3
        << " ms, measured bubble " << mean << " (analytic "
        << analyticBubble(info.pipelineRanks, info.microbatches, info.chunks)
        << ")";
  os << "<text x=\"10\" y=\"22\" font-size=\"14\">" << title.str()
     << "</text>\n";
  for (size_t i = 0; i < ranks.size(); ++i) {
    const RankTrace &r = ranks[i];
    double y = top + row * static_cast<double>(i);
    os << "<text x=\"10\" y=\"" << y + bar * 0.7 << "\">rank " << r.rank << " ["
       << escape(r.coords) << "] bubble "
       << std::lround(100 * bubbleFraction(r, span)) << "%</text>\n";
    os << "<rect x=\"" << left << "\" y=\"" << y << "\" width=\"" << plot
       << "\" height=\"" << bar << "\" fill=\"#f2f2f2\"/>\n";
    for (const TraceEvent &e : r.events) {
      double x0 = x(e.start), w = std::max(x(e.end) - x0, 0.5);
      std::string fill = "#9e9e9e";
      int chunk = info.chunks > 1 ? e.stage / info.pipelineRanks : 0;
      bool full = e.kind == TraceEvent::Kind::Compute ||
                  e.kind == TraceEvent::Kind::ZeroGrad ||
                  e.kind == TraceEvent::Kind::Optimizer;
      if (e.kind == TraceEvent::Kind::Compute) {
        // One hue per micro-batch, darker for later chunks.
        int hue = (e.microbatch * 47) % 360;
        fill = "hsl(" + std::to_string(hue) + ",65%," +
               std::to_string(std::max(25, 55 - 15 * chunk)) + "%)";
      } else if (full) {
        fill = "#37474f"; // the step's zero-grad and optimizer
      }
      os << "<rect x=\"" << x0 << "\" y=\"" << y + (full ? 0 : bar / 3.0)
         << "\" width=\"" << w << "\" height=\"" << (full ? bar : bar / 3.0)
         << "\" fill=\"" << fill << "\"><title>" << escape(label(e)) << " "
         << (e.end - e.start) * 1e3 << " ms</title></rect>\n";
      if (e.kind == TraceEvent::Kind::Compute && w > 18)
        os << "<text x=\"" << x0 + w / 2 << "\" y=\"" << y + bar * 0.68
           << "\" text-anchor=\"middle\" fill=\"white\">" << e.work
           << e.microbatch
           << (info.chunks > 1 ? "." + std::to_string(chunk) : std::string())
           << "</text>\n";
    }
  }
  double axis = top + row * static_cast<double>(ranks.size()) + 8;
  os << "<line x1=\"" << left << "\" y1=\"" << axis << "\" x2=\"" << left + plot
     << "\" y2=\"" << axis << "\" stroke=\"black\"/>\n";
  for (int t = 0; t <= 4; ++t) {
    double at = drawn * t / 4;
    os << "<text x=\"" << x(at) << "\" y=\"" << axis + 16
       << "\" text-anchor=\"middle\">" << at * 1e3 << " ms</text>\n";
  }
  os << "<text x=\"10\" y=\"" << axis + 34
     << "\">coloured: compute (one colour per micro-batch"
     << (info.chunks > 1 ? "; Fm.c: chunk c, darker for later chunks" : "")
     << "); grey bars: send and receive; light grey: idle"
     << (drawn > span ? "; dark: zero-grad and optimizer" : "") << "</text>\n";
  os << "</svg>\n";
  return writeFile(path, os.str());
}

} // namespace pccrun
