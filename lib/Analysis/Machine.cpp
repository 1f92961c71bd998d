//===- Machine.cpp - the machine a plan is searched for -------------------===//

#include "pcc/Analysis/Machine.h"

#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/MemoryBuffer.h"

#include <algorithm>
#include <cmath>
#include <thread>

using namespace mlir::pcc;

namespace {
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

/// The numeric fields, by their JSON key.
template <typename Fn> void forEachField(Machine &m, Fn fn) {
  fn("devices_per_node", m.devicesPerNode);
  fn("memory_bytes", m.memoryBytes);
  fn("reserved_bytes", m.reservedBytes);
  fn("fp32_flops", m.fp32Flops);
  fn("bf16_flops", m.bf16Flops);
  fn("fp32_peak", m.fp32Peak);
  fn("bf16_peak", m.bf16Peak);
  fn("memory_bandwidth", m.memoryBandwidth);
  fn("kernel_seconds", m.kernelSeconds);
  fn("intra_bandwidth", m.intraBandwidth);
  fn("intra_latency", m.intraLatency);
  fn("inter_bandwidth", m.interBandwidth);
  fn("inter_latency", m.interLatency);
  fn("cores", m.cores);
}
/// The "products" table: [{"size": N, "fp32_flops": R, "bf16_flops": R}]
/// (a product N x N x N) or {"flops": F, ...} per call; the message of
/// what is wrong, or "".
std::string readProducts(const llvm::json::Value &value,
                         std::vector<Machine::ProductRate> &out) {
  const llvm::json::Array *rows = value.getAsArray();
  if (!rows)
    return "products must be a list of {\"size\": N, \"fp32_flops\": R, "
           "\"bf16_flops\": R}";
  out.clear();
  for (const llvm::json::Value &row : *rows) {
    const llvm::json::Object *o = row.getAsObject();
    if (!o)
      return "each entry of products must be an object";
    Machine::ProductRate r;
    for (const auto &entry : *o) {
      std::optional<double> v = entry.second.getAsNumber();
      llvm::StringRef key = entry.first;
      if (!v || *v <= 0)
        return "products: " + key.str() + " must be a positive number";
      if (key == "size")
        r.flops = 2.0 * *v * *v * *v;
      else if (key == "flops")
        r.flops = *v;
      else if (key == "fp32_flops")
        r.fp32 = *v;
      else if (key == "bf16_flops")
        r.bf16 = *v;
      else
        return "products: unknown key '" + key.str() +
               "' (size or flops, fp32_flops, bf16_flops)";
    }
    if (r.flops <= 0 || (r.fp32 <= 0 && r.bf16 <= 0))
      return "each entry of products needs a size (or flops) and a rate";
    out.push_back(r);
  }
  std::sort(out.begin(), out.end(),
            [](const auto &a, const auto &b) { return a.flops < b.flops; });
  return "";
}
/// The "attention" table: [{"head_dim": D, "seq": S, "fp32_flops": R,
/// "grad_fp32_flops": R, "bf16_flops": R, "grad_bf16_flops": R}]; the
/// message of what is wrong, or "".
std::string readAttention(const llvm::json::Value &value,
                          std::vector<Machine::AttentionRate> &out) {
  const llvm::json::Array *rows = value.getAsArray();
  if (!rows)
    return "attention must be a list of {\"head_dim\": D, \"seq\": S, "
           "\"fp32_flops\": R, ...}";
  out.clear();
  for (const llvm::json::Value &row : *rows) {
    const llvm::json::Object *o = row.getAsObject();
    if (!o)
      return "each entry of attention must be an object";
    Machine::AttentionRate r;
    for (const auto &entry : *o) {
      std::optional<double> v = entry.second.getAsNumber();
      llvm::StringRef key = entry.first;
      if (!v || *v <= 0)
        return "attention: " + key.str() + " must be a positive number";
      double *field = key == "head_dim"          ? &r.headDim
                      : key == "seq"             ? &r.seq
                      : key == "fp32_flops"      ? &r.fp32
                      : key == "bf16_flops"      ? &r.bf16
                      : key == "grad_fp32_flops" ? &r.gradFp32
                      : key == "grad_bf16_flops" ? &r.gradBf16
                                                 : nullptr;
      if (!field)
        return "attention: unknown key '" + key.str() +
               "' (head_dim, seq, fp32_flops, bf16_flops, grad_fp32_flops, "
               "grad_bf16_flops)";
      *field = *v;
    }
    if (r.headDim <= 0 || r.seq <= 0 || (r.fp32 <= 0 && r.bf16 <= 0))
      return "each entry of attention needs a head_dim, a seq and a rate";
    out.push_back(r);
  }
  std::sort(out.begin(), out.end(), [](const auto &a, const auto &b) {
    return std::make_pair(a.headDim, a.seq) < std::make_pair(b.headDim, b.seq);
  });
  return "";
}
/// The "intra_latencies" table: [{"ranks": G, "seconds": S}]; the message
/// of what is wrong, or "".
std::string readLatencies(const llvm::json::Value &value,
                          std::vector<Machine::GroupLatency> &out) {
  const llvm::json::Array *rows = value.getAsArray();
  if (!rows)
    return "intra_latencies must be a list of {\"ranks\": G, \"seconds\": S}";
  out.clear();
  for (const llvm::json::Value &row : *rows) {
    const llvm::json::Object *o = row.getAsObject();
    std::optional<double> ranks = o ? o->getNumber("ranks") : std::nullopt;
    std::optional<double> seconds = o ? o->getNumber("seconds") : std::nullopt;
    if (!o || o->size() != 2 || !ranks || !seconds || *ranks < 2 ||
        *ranks != std::floor(*ranks) || *seconds < 0)
      return "each entry of intra_latencies must be {\"ranks\": G >= 2, "
             "\"seconds\": S >= 0}";
    out.push_back({static_cast<int64_t>(*ranks), *seconds});
  }
  std::sort(out.begin(), out.end(),
            [](const auto &a, const auto &b) { return a.ranks < b.ranks; });
  return "";
}
} // namespace

double Machine::intraLatencyFor(int64_t ranks) const {
  if (intraLatencies.empty() || ranks <= 1)
    return intraLatency;
  if (ranks <= intraLatencies.front().ranks)
    return intraLatencies.front().seconds;
  for (size_t i = 1; i < intraLatencies.size(); ++i) {
    const GroupLatency &lo = intraLatencies[i - 1], &hi = intraLatencies[i];
    if (ranks > hi.ranks)
      continue;
    double t = std::log2(static_cast<double>(ranks) / lo.ranks) /
               std::log2(static_cast<double>(hi.ranks) / lo.ranks);
    return lo.seconds + t * (hi.seconds - lo.seconds);
  }
  return intraLatencies.back().seconds;
}

double Machine::attentionFlops(bool bf16, bool grad, double headDim,
                               double seq) const {
  if (attention.empty() || headDim <= 0 || seq <= 0)
    return 0;
  auto rate = [&](const AttentionRate &r) {
    return grad ? (bf16 ? r.gradBf16 : r.gradFp32) : (bf16 ? r.bf16 : r.fp32);
  };
  // The nearest measured width (in log).
  double width = attention.front().headDim;
  for (const AttentionRate &r : attention)
    if (std::abs(std::log(r.headDim / headDim)) <
        std::abs(std::log(width / headDim)))
      width = r.headDim;
  std::vector<const AttentionRate *> row;
  for (const AttentionRate &r : attention)
    if (r.headDim == width && rate(r) > 0)
      row.push_back(&r);
  if (row.empty())
    return 0;
  if (seq <= row.front()->seq)
    return rate(*row.front());
  for (size_t i = 1; i < row.size(); ++i) {
    const AttentionRate &lo = *row[i - 1], &hi = *row[i];
    if (seq > hi.seq)
      continue;
    double t = std::log(seq / lo.seq) / std::log(hi.seq / lo.seq);
    return std::exp(std::log(rate(lo)) +
                    t * (std::log(rate(hi)) - std::log(rate(lo))));
  }
  return rate(*row.back());
}

const char *Machine::presetNames() { return "cpu, h100, h200"; }

std::optional<Machine> Machine::preset(llvm::StringRef name) {
  Machine m;
  m.name = name.str();
  if (name == "cpu") {
    // One rank per core of this project's machine kind (AVX-512 with
    // AMX-BF16; OpenBLAS SGEMM, pcc's AMX kernels for bf16), MPI over
    // shared memory; every rank on one host. Measured figures of
    // docs/benchmarks.md; `pcc calibrate` measures a machine instead.
    m.devicesPerNode = 1 << 20;
    m.memoryBytes = 0; // --device-memory says
    m.fp32Flops = 120e9;
    m.bf16Flops = 500e9;
    m.fp32Peak = 160e9;  // 2 AVX-512 FMA units at about 2.5 GHz
    m.bf16Peak = 2.5e12; // AMX: 1,024 bf16 FLOPs per cycle
    m.memoryBandwidth = 8e9;
    m.kernelSeconds = 2e-6;
    m.intraBandwidth = m.interBandwidth = 4e9;
    m.intraLatency = m.interLatency = 5e-6;
    m.cores = std::max(1u, std::thread::hardware_concurrency());
    m.overlapsCollectives = false;
    return m;
  }
  if (name == "h100" || name == "h200") {
    // H100 SXM: 989 TFLOP/s dense bf16, 67 fp32 (pcc's fp32 products run
    // with TF32 off), NVLink 4 through NVSwitch within a node of 8, one
    // 400 Gb/s InfiniBand link per GPU between nodes. Reached rates are
    // the fractions large products and NCCL's bus bandwidth reach.
    m.devicesPerNode = 8;
    bool h200 = name == "h200";
    m.memoryBytes = static_cast<int64_t>((h200 ? 139.0 : 79.0) * kGiB);
    m.reservedBytes = static_cast<int64_t>(2.5 * kGiB);
    m.fp32Flops = 50e12;
    m.bf16Flops = 650e12;
    m.fp32Peak = 67e12;
    m.bf16Peak = 989e12;
    m.memoryBandwidth = (h200 ? 4.8e12 : 3.35e12) * 0.8;
    m.kernelSeconds = 4e-6;
    m.intraBandwidth = 360e9;
    m.intraLatency = 10e-6;
    m.interBandwidth = 45e9;
    m.interLatency = 20e-6;
    m.overlapsCollectives = true;
    return m;
  }
  return std::nullopt;
}

double Machine::productFlops(bool bf16, double flopsPerCall) const {
  double flat = productFlops(bf16);
  auto rate = [&](const ProductRate &r) {
    double v = bf16 ? r.bf16 : r.fp32;
    return v > 0 ? v : flat;
  };
  if (products.empty() || flopsPerCall <= 0)
    return flat;
  if (flopsPerCall <= products.front().flops)
    return rate(products.front());
  for (size_t i = 1; i < products.size(); ++i) {
    const ProductRate &lo = products[i - 1], &hi = products[i];
    if (flopsPerCall > hi.flops)
      continue;
    double t =
        std::log(flopsPerCall / lo.flops) / std::log(hi.flops / lo.flops);
    return std::exp(std::log(rate(lo)) +
                    t * (std::log(rate(hi)) - std::log(rate(lo))));
  }
  return rate(products.back());
}

std::string Machine::verify() const {
  auto positive = [](double v) { return v > 0; };
  if (devicesPerNode < 1)
    return "devices_per_node must be at least 1";
  if (memoryBytes < 0 || reservedBytes < 0 || cores < 0)
    return "memory_bytes, reserved_bytes and cores must not be negative";
  for (auto [key, v] : {std::pair{"fp32_flops", fp32Flops},
                        {"bf16_flops", bf16Flops},
                        {"fp32_peak", fp32Peak},
                        {"bf16_peak", bf16Peak},
                        {"memory_bandwidth", memoryBandwidth},
                        {"intra_bandwidth", intraBandwidth},
                        {"inter_bandwidth", interBandwidth}})
    if (!positive(v))
      return std::string(key) + " must be a positive number";
  if (kernelSeconds < 0 || intraLatency < 0 || interLatency < 0)
    return "kernel_seconds and the latencies must not be negative";
  return "";
}

std::optional<Machine> Machine::load(llvm::StringRef nameOrPath,
                                     std::string &error) {
  if (std::optional<Machine> m = preset(nameOrPath))
    return m;
  auto buffer = llvm::MemoryBuffer::getFile(nameOrPath);
  if (!buffer) {
    error = "--machine=" + nameOrPath.str() + " is neither a preset (" +
            presetNames() +
            ") nor a readable file: " + buffer.getError().message();
    return std::nullopt;
  }
  llvm::Expected<llvm::json::Value> parsed =
      llvm::json::parse((*buffer)->getBuffer());
  if (!parsed) {
    error = "machine file '" + nameOrPath.str() +
            "' is not JSON: " + llvm::toString(parsed.takeError());
    return std::nullopt;
  }
  const llvm::json::Object *object = parsed->getAsObject();
  if (!object) {
    error = "machine file '" + nameOrPath.str() + "' is not a JSON object";
    return std::nullopt;
  }
  // A file may start from a preset ("base": "h100") and change some fields.
  Machine m;
  m.name = nameOrPath.str();
  if (std::optional<llvm::StringRef> base = object->getString("base")) {
    std::optional<Machine> b = preset(*base);
    if (!b) {
      error = "machine file '" + nameOrPath.str() + "': base '" + base->str() +
              "' is not a preset (" + presetNames() + ")";
      return std::nullopt;
    }
    m = *b;
    m.name = nameOrPath.str();
  }
  for (const auto &entry : *object) {
    llvm::StringRef key = entry.first;
    const llvm::json::Value &value = entry.second;
    if (key == "base" || key == "name") {
      if (key == "name" && value.getAsString())
        m.name = value.getAsString()->str();
      continue;
    }
    // What pcc calibrate saw (device, ranks, the all-reduce times): kept
    // in the file for the reader.
    if (key == "measured")
      continue;
    // The tables.
    std::optional<std::string> table;
    if (key == "products")
      table = readProducts(value, m.products);
    else if (key == "intra_latencies")
      table = readLatencies(value, m.intraLatencies);
    else if (key == "attention")
      table = readAttention(value, m.attention);
    if (table) {
      if (!table->empty()) {
        error = "machine file '" + nameOrPath.str() + "': " + *table;
        return std::nullopt;
      }
      continue;
    }
    if (key == "overlaps_collectives") {
      std::optional<bool> b = value.getAsBoolean();
      if (!b) {
        error = "machine file '" + nameOrPath.str() +
                "': overlaps_collectives must be true or false";
        return std::nullopt;
      }
      m.overlapsCollectives = *b;
      continue;
    }
    bool known = false;
    forEachField(m, [&](llvm::StringRef name, auto &field) {
      if (name != key)
        return;
      known = true;
      std::optional<double> v = value.getAsNumber();
      if (!v || *v < 0) {
        error = "machine file '" + nameOrPath.str() + "': " + name.str() +
                " must be a number >= 0";
        return;
      }
      field = static_cast<std::decay_t<decltype(field)>>(*v);
    });
    if (!error.empty())
      return std::nullopt;
    if (!known) {
      error = "machine file '" + nameOrPath.str() + "': unknown key '" +
              key.str() + "'";
      return std::nullopt;
    }
  }
  error = m.verify();
  if (!error.empty()) {
    error = "machine file '" + nameOrPath.str() + "': " + error;
    return std::nullopt;
  }
  return m;
}

std::string Machine::toJson() const {
  llvm::json::Object object;
  object["name"] = name;
  Machine copy = *this;
  forEachField(copy,
               [&](llvm::StringRef key, auto &field) { object[key] = field; });
  object["overlaps_collectives"] = overlapsCollectives;
  if (!products.empty()) {
    llvm::json::Array rows;
    for (const ProductRate &r : products) {
      llvm::json::Object row{{"flops", r.flops}};
      if (r.fp32 > 0)
        row["fp32_flops"] = r.fp32;
      if (r.bf16 > 0)
        row["bf16_flops"] = r.bf16;
      rows.push_back(std::move(row));
    }
    object["products"] = std::move(rows);
  }
  if (!attention.empty()) {
    llvm::json::Array rows;
    for (const AttentionRate &r : attention) {
      llvm::json::Object row{{"head_dim", r.headDim}, {"seq", r.seq}};
      for (auto [key, v] : {std::pair<const char *, double>{"fp32_flops", r.fp32},
                            {"bf16_flops", r.bf16},
                            {"grad_fp32_flops", r.gradFp32},
                            {"grad_bf16_flops", r.gradBf16}})
        if (v > 0)
          row[key] = v;
      rows.push_back(std::move(row));
    }
    object["attention"] = std::move(rows);
  }
  if (!intraLatencies.empty()) {
    llvm::json::Array rows;
    for (const GroupLatency &g : intraLatencies)
      rows.push_back(
          llvm::json::Object{{"ranks", g.ranks}, {"seconds", g.seconds}});
    object["intra_latencies"] = std::move(rows);
  }
  std::string text;
  llvm::raw_string_ostream os(text);
  os << llvm::formatv("{0:2}", llvm::json::Value(std::move(object))) << "\n";
  return text;
}
