//===- Profile.cpp - pcc-run --profile: where a run's time goes -----------===//

#include "pcc/tooling/Profile.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>

using pccrt::Error;
using pccrt::Status;

namespace pccrun {

//===----------------------------------------------------------------------===//
// Profiler
//===----------------------------------------------------------------------===//

Profiler::Profiler(std::function<void()> sync) : sync(std::move(sync)) {
  table.state = this;
  table.mark = &Profiler::markThunk;
}

void Profiler::markThunk(void *state, const pcc_profile_site *site) {
  static_cast<Profiler *>(state)->mark(site);
}

void Profiler::mark(const pcc_profile_site *site) {
  if (!inRun)
    return;
  if (sync)
    sync();
  Clock::time_point now = Clock::now();
  if (current) {
    double seconds = std::chrono::duration<double>(now - since).count();
    auto [it, inserted] = totals.try_emplace(current);
    if (inserted)
      order.push_back(current);
    ++it->second.calls;
    it->second.seconds += seconds;
    events.push_back({current,
                      std::chrono::duration<double>(since - runStart).count(),
                      seconds});
  }
  current = site;
  since = now;
}

void Profiler::beginRun() {
  if (sync)
    sync();
  events.clear();
  current = nullptr;
  inRun = true;
  runStart = Clock::now();
}

void Profiler::endRun() {
  if (sync)
    sync();
  mark(nullptr);
  wall += std::chrono::duration<double>(Clock::now() - runStart).count();
  inRun = false;
  ++numRuns;
}

std::vector<ProfileRecord> Profiler::records(int rank) const {
  std::vector<ProfileRecord> out;
  for (const pcc_profile_site *site : order) {
    const Totals &t = totals.at(site);
    out.push_back({site->op, site->node, site->function, site->dtype,
                   site->flops, site->bytes, t.calls, t.seconds, rank});
  }
  return out;
}

//===----------------------------------------------------------------------===//
// The machine's peaks
//===----------------------------------------------------------------------===//

MachinePeaks measureCpuPeaks(pccrt::Device &device) {
  // Through the device's own timing entry points, which `pcc calibrate`
  // uses too: one way of measuring the machine.
  MachinePeaks peaks;
  const int64_t n = 1024;
  const double flops = 2.0 * n * n * n;
  if (auto s = device.timeProduct(n, n, n, /*bf16=*/false, 4); s.ok() && *s > 0)
    peaks.gemmF32 = flops / *s / 1e9;
  if (auto s = device.timeProduct(n, n, n, /*bf16=*/true, 4); s.ok() && *s > 0)
    peaks.gemmBf16 = flops / *s / 1e9;
  const int64_t bytes = int64_t(128) << 20;
  if (auto s = device.timeCopy(bytes, 3); s.ok() && *s > 0)
    peaks.copy = 2.0 * static_cast<double>(bytes) / *s / 1e9;
  return peaks;
}

//===----------------------------------------------------------------------===//
// Gathering
//===----------------------------------------------------------------------===//

namespace {

std::string serialize(const std::vector<ProfileRecord> &records) {
  nlohmann::json j = nlohmann::json::array();
  for (const ProfileRecord &r : records)
    j.push_back({r.op, r.node, r.function, r.dtype, r.flops, r.bytes, r.calls,
                 r.seconds, r.rank});
  return j.dump();
}

std::vector<ProfileRecord> parse(const std::string &text) {
  std::vector<ProfileRecord> out;
  for (const nlohmann::json &r : nlohmann::json::parse(text))
    out.push_back({r[0].get<std::string>(), r[1].get<std::string>(),
                   r[2].get<std::string>(), r[3].get<std::string>(),
                   r[4].get<double>(), r[5].get<double>(), r[6].get<int64_t>(),
                   r[7].get<double>(), r[8].get<int>()});
  return out;
}

} // namespace

pccrt::Result<std::vector<ProfileRecord>>
gatherProfile(pccrt::Communicator &world,
              const std::vector<ProfileRecord> &mine) {
  using pccrt::DType;
  std::vector<ProfileRecord> all;
  if (world.rank() == 0)
    all = mine;
  for (int r = 1; r < world.size(); ++r) {
    Status s = Status::success();
    if (world.rank() == r) {
      std::string text = serialize(mine);
      int64_t count = static_cast<int64_t>(text.size());
      s = world.send(&count, 1, DType::I64, 0);
      if (s.ok())
        s = world.send(text.data(), count, DType::U8, 0);
    } else if (world.rank() == 0) {
      int64_t count = 0;
      s = world.recv(&count, 1, DType::I64, r);
      std::string text(static_cast<size_t>(count), '\0');
      if (s.ok())
        s = world.recv(text.data(), count, DType::U8, r);
      if (s.ok()) {
        std::vector<ProfileRecord> theirs = parse(text);
        all.insert(all.end(), theirs.begin(), theirs.end());
      }
    }
    if (!s.ok())
      return Error{"gathering the profile on rank 0: " + s.error()};
  }
  return all;
}

//===----------------------------------------------------------------------===//
// The report
//===----------------------------------------------------------------------===//

namespace {

struct Sum {
  int64_t calls = 0;
  double seconds = 0, flops = 0, bytes = 0;
  void add(const ProfileRecord &r) {
    calls += r.calls;
    seconds += r.seconds;
    flops += r.flops * static_cast<double>(r.calls);
    bytes += r.bytes * static_cast<double>(r.calls);
  }
};

std::string fmt(const char *format, double value) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, value);
  return buf;
}

/// "train_forward" -> "forward".
std::string phaseName(const std::string &function) {
  return function.rfind("train_", 0) == 0 ? function.substr(6) : function;
}

/// A table with left-aligned text columns and right-aligned numbers.
class Table {
public:
  explicit Table(std::vector<std::string> header, size_t textColumns)
      : textColumns(textColumns) {
    rows.push_back(std::move(header));
  }
  void add(std::vector<std::string> row) { rows.push_back(std::move(row)); }
  std::string str() const {
    std::vector<size_t> width(rows[0].size(), 0);
    for (const auto &row : rows)
      for (size_t c = 0; c < row.size(); ++c)
        width[c] = std::max(width[c], row[c].size());
    std::string out;
    for (const auto &row : rows) {
      std::string line = " ";
      for (size_t c = 0; c < row.size(); ++c) {
        std::string pad(width[c] - row[c].size(), ' ');
        bool last = c + 1 == row.size();
        line +=
            " " + (c < textColumns ? row[c] + (last ? "" : pad) : pad + row[c]);
      }
      out += line + "\n";
    }
    return out;
  }

private:
  size_t textColumns;
  std::vector<std::vector<std::string>> rows;
};

} // namespace

std::string profileReport(const std::vector<ProfileRecord> &records,
                          const ProfileSummary &summary, int top) {
  double runs = static_cast<double>(std::max<int64_t>(summary.runs, 1));
  Sum total;
  Sum rank0;
  for (const ProfileRecord &r : records) {
    total.add(r);
    if (r.rank == 0)
      rank0.add(r);
  }
  double wallMs = summary.wallSeconds * 1e3 / runs;
  auto ms = [&](double seconds) { return fmt("%.3f", seconds * 1e3 / runs); };
  // Shares are of every rank's op time together.
  auto share = [&](double seconds) {
    return fmt("%.1f%%",
               total.seconds > 0 ? 100.0 * seconds / total.seconds : 0.0);
  };
  auto rate = [](double amount, double seconds) {
    return amount > 0 && seconds > 0 ? fmt("%.1f", amount / seconds / 1e9)
                                     : std::string("-");
  };
  auto ofPeak = [](double amount, double seconds, double peak) {
    return amount > 0 && seconds > 0 && peak > 0
               ? fmt("%.0f%%", 100.0 * amount / seconds / 1e9 / peak)
               : std::string("-");
  };
  const MachinePeaks &peaks = summary.peaks;
  auto gemmPeak = [&](const std::string &dtype) {
    if (dtype == "bf16")
      return peaks.gemmBf16;
    return dtype == "f32" ? peaks.gemmF32 : 0.0;
  };

  std::ostringstream os;
  os << "profile: " << summary.runs << " " << summary.unit << " on "
     << summary.device;
  if (summary.ranks > 1)
    os << " x " << summary.ranks << " ranks";
  os << ", " << fmt("%.3f", wallMs) << " ms each (rank 0); the ops took "
     << fmt("%.3f", rank0.seconds * 1e3 / runs) << " ms of it ("
     << fmt("%.1f%%",
            wallMs > 0 ? 100.0 * rank0.seconds * 1e3 / runs / wallMs : 0.0)
     << "), the runtime around them the rest\n";
  if (summary.cuda)
    os << "  (on CUDA every op is timed to its end: the device is "
          "synchronised at each op, so the ops do not overlap their launches "
          "as in an unprofiled run)\n";
  if (peaks.gemmF32 > 0 || peaks.copy > 0) {
    os << "peaks measured now: fp32 product " << fmt("%.0f", peaks.gemmF32)
       << " GFLOP/s";
    if (peaks.gemmBf16 > 0)
      os << ", bf16 product " << fmt("%.0f", peaks.gemmBf16) << " GFLOP/s";
    os << " (1024^3, the runtime's kernels), copy " << fmt("%.1f", peaks.copy)
       << " GB/s (one thread)\n";
  } else {
    os << "peaks: not measured on this device\n";
  }

  // By op kind and element type.
  std::map<std::pair<std::string, std::string>, Sum> byKind;
  for (const ProfileRecord &r : records)
    byKind[{r.op, r.dtype}].add(r);
  std::vector<std::pair<std::pair<std::string, std::string>, Sum>> kinds(
      byKind.begin(), byKind.end());
  std::stable_sort(kinds.begin(), kinds.end(),
                   [](const auto &a, const auto &b) {
                     return a.second.seconds > b.second.seconds;
                   });
  Table kindTable({"op", "type", "calls", "ms", "share", "GFLOP/s", "of peak",
                   "GB/s", "of copy"},
                  2);
  for (const auto &[key, s] : kinds)
    kindTable.add({key.first, key.second,
                   fmt("%.0f", static_cast<double>(s.calls) / runs),
                   ms(s.seconds), share(s.seconds), rate(s.flops, s.seconds),
                   ofPeak(s.flops, s.seconds, gemmPeak(key.second)),
                   rate(s.bytes, s.seconds),
                   ofPeak(s.bytes, s.seconds, peaks.copy)});
  os << "\nby op kind (per " << (summary.unit == "runs" ? "run" : "step")
     << (summary.ranks > 1 ? ", all ranks" : "") << "):\n"
     << kindTable.str();

  // By function: the phases of a training step, the pipeline stages.
  std::map<std::string, Sum> byFunction;
  for (const ProfileRecord &r : records)
    byFunction[phaseName(r.function)].add(r);
  Table fnTable({"function", "ops", "ms", "share", "GFLOP/s"}, 1);
  for (const auto &[name, s] : byFunction)
    fnTable.add({name, fmt("%.0f", static_cast<double>(s.calls) / runs),
                 ms(s.seconds), share(s.seconds), rate(s.flops, s.seconds)});
  os << "\nby function:\n" << fnTable.str();

  if (summary.ranks > 1) {
    std::map<int, Sum> byRank;
    for (const ProfileRecord &r : records)
      byRank[r.rank].add(r);
    Table rankTable({"rank", "ops", "ms", "GFLOP/s"}, 1);
    for (const auto &[rank, s] : byRank)
      rankTable.add({std::to_string(rank),
                     fmt("%.0f", static_cast<double>(s.calls) / runs),
                     ms(s.seconds), rate(s.flops, s.seconds)});
    os << "\nby rank:\n" << rankTable.str();
  }

  // The costliest ops.
  std::vector<const ProfileRecord *> sorted;
  for (const ProfileRecord &r : records)
    sorted.push_back(&r);
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const ProfileRecord *a, const ProfileRecord *b) {
                     return a->seconds > b->seconds;
                   });
  std::vector<std::string> header = {"ms", "share", "GFLOP/s", "GB/s"};
  if (summary.ranks > 1)
    header.push_back("rank");
  for (const char *h : {"function", "op", "type", "node"})
    header.push_back(h);
  Table topTable(header, 0);
  int shown = 0;
  for (const ProfileRecord *r : sorted) {
    if (shown++ == top)
      break;
    double flops = r->flops * static_cast<double>(r->calls);
    double bytes = r->bytes * static_cast<double>(r->calls);
    std::vector<std::string> row = {ms(r->seconds), share(r->seconds),
                                    rate(flops, r->seconds),
                                    rate(bytes, r->seconds)};
    if (summary.ranks > 1)
      row.push_back(std::to_string(r->rank));
    row.push_back(phaseName(r->function));
    row.push_back(r->op);
    row.push_back(r->dtype);
    row.push_back(r->node);
    topTable.add(std::move(row));
  }
  os << "\nthe " << std::min<size_t>(top, sorted.size())
     << " costliest ops (of " << sorted.size() << "):\n"
     << topTable.str();
  return os.str();
}

Status writeProfileTrace(const std::string &path,
                         const std::vector<ProfileEvent> &events) {
  nlohmann::json trace = nlohmann::json::array();
  std::map<std::string, int> rows;
  for (const ProfileEvent &e : events)
    rows.try_emplace(e.site->function, static_cast<int>(rows.size()));
  trace.push_back({{"name", "process_name"},
                   {"ph", "M"},
                   {"pid", 0},
                   {"args", {{"name", "rank 0: the last profiled run"}}}});
  for (const auto &[function, tid] : rows)
    trace.push_back({{"name", "thread_name"},
                     {"ph", "M"},
                     {"pid", 0},
                     {"tid", tid},
                     {"args", {{"name", phaseName(function)}}}});
  for (const ProfileEvent &e : events) {
    nlohmann::json args = {{"node", e.site->node},
                           {"type", e.site->dtype},
                           {"bytes", e.site->bytes}};
    if (e.site->flops > 0) {
      args["flops"] = e.site->flops;
      if (e.duration > 0)
        args["GFLOP/s"] = e.site->flops / e.duration / 1e9;
    }
    trace.push_back({{"name", e.site->op},
                     {"cat", phaseName(e.site->function)},
                     {"ph", "X"},
                     {"pid", 0},
                     {"tid", rows.at(e.site->function)},
                     {"ts", e.start * 1e6},
                     {"dur", e.duration * 1e6},
                     {"args", std::move(args)}});
  }
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    if (!out)
      return Error{"cannot write '" + tmp + "': " + std::strerror(errno)};
    out << nlohmann::json{{"traceEvents", trace}, {"displayTimeUnit", "ms"}}
               .dump()
        << "\n";
    if (!out)
      return Error{"cannot write '" + tmp + "': " + std::strerror(errno)};
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    return Error{"cannot write '" + path + "': " + std::strerror(errno)};
  return Status::success();
}

std::unique_ptr<Profiler> startProfiling(pccrt::Device &device) {
  std::function<void()> sync;
  if (!device.isHost())
    sync = [&device] { (void)device.synchronize(); };
  auto profiler = std::make_unique<Profiler>(std::move(sync));
  pccrt::setRunProfile(profiler->abi());
  return profiler;
}

Status finishProfiling(Profiler &profiler, pccrt::Device &device,
                       pccrt::Communicator *world, const std::string &unit,
                       const std::string &tracePath) {
  pccrt::setRunProfile(nullptr);
  int rank = world ? world->rank() : 0;
  std::vector<ProfileRecord> records = profiler.records(rank);
  if (world) {
    auto all = gatherProfile(*world, records);
    if (!all.ok())
      return Error{all.error()};
    records = all.take();
  }
  if (rank != 0)
    return Status::success();
  ProfileSummary summary;
  summary.unit = unit;
  summary.runs = profiler.runs();
  summary.wallSeconds = profiler.wallSeconds();
  summary.ranks = world ? world->size() : 1;
  summary.device = device.describe();
  summary.cuda = !device.isHost();
  if (device.isHost())
    summary.peaks = measureCpuPeaks(device);
  std::fputs(("\n" + profileReport(records, summary)).c_str(), stdout);
  if (!tracePath.empty()) {
    Status s = writeProfileTrace(tracePath, profiler.lastRunEvents());
    if (!s.ok())
      return s;
    std::printf("profile trace (rank 0's last profiled run, %zu ops): %s\n",
                profiler.lastRunEvents().size(), tracePath.c_str());
  }
  std::fflush(stdout);
  return Status::success();
}

} // namespace pccrun
