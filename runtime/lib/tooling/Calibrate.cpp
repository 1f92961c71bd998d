//===- Calibrate.cpp - measure a machine for the plan search --------------===//

#include "pcc/tooling/Calibrate.h"

#include "pcc/runtime/Communicator.h"
#include "pcc/runtime/CpuKernels.h"
#include "pcc/runtime/Device.h"
#include "pcc/tooling/Job.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <memory>
#include <sched.h>
#include <sstream>
#include <thread>
#include <unistd.h>
#include <utility>
#include <vector>

using namespace pccrt;
using namespace pccrun;

namespace {

using Clock = std::chrono::steady_clock;

struct ProductRate {
  int64_t size = 0; // m = n = k
  double fp32 = 0, bf16 = 0;
};

struct CollectiveTime {
  int64_t bytes = 0;
  double seconds = 0;
};

/// A fused causal attention's rates (FLOPs as pcc counts them: 2 products
/// forward, 5 for the gradient, over every key) at one head width and
/// sequence length.
struct AttentionRate {
  int64_t headDim = 0, seq = 0;
  double fp32 = 0, bf16 = 0, gradFp32 = 0, gradBf16 = 0;
};

/// What was measured; 0 where not.
struct Measured {
  std::vector<AttentionRate> attention;
  std::string device;
  std::vector<ProductRate> products;
  double fp32 = 0, bf16 = 0;
  double together = 0, alone = 0; // the contended product's rates
  int64_t hardwareCores = 0;
  double cores = 0;
  double bandwidth = 0, kernelSeconds = 0;
  std::vector<CollectiveTime> allReduce;
  double latency = 0, busBandwidth = 0;
  double stepLatency = 0; // a collective between kernels (measureInStep)
  /// The same in groups of fewer ranks, every rank in a group at once:
  /// (group size, seconds).
  std::vector<std::pair<int, double>> groupLatencies;
};

void progress(bool root, const std::string &line) {
  if (!root)
    return;
  std::fprintf(stderr, "pcc-run: calibrate: %s\n", line.c_str());
  std::fflush(stderr);
}

std::string fmt(const char *format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), format, v);
  return buf;
}

/// The cores this process may run on.
int64_t usableCores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0)
    return CPU_COUNT(&set);
  return std::max(1u, std::thread::hardware_concurrency());
}

template <typename T> T must(Result<T> r, const std::string &what) {
  if (!r.ok())
    die(what + ": " + r.error());
  return r.take();
}

void must(const Status &s, const std::string &what) {
  if (!s.ok())
    die(what + ": " + s.error());
}

/// Products alone on one device (rank 0; the others wait).
void measureProducts(Device &device, bool quick, bool root, Measured &out) {
  bool gpu = !device.isHost();
  std::vector<int64_t> sizes =
      gpu ? std::vector<int64_t>{256, 512, 1024, 2048, 4096, 8192}
          : std::vector<int64_t>{64, 128, 256, 512, 1024, 2048};
  if (quick)
    sizes =
        gpu ? std::vector<int64_t>{512, 2048} : std::vector<int64_t>{64, 256};
  int times = quick ? 1 : 3;
  bool bf16Works = true;
  for (int64_t n : sizes) {
    ProductRate r;
    r.size = n;
    double flops = 2.0 * static_cast<double>(n) * n * n;
    r.fp32 = flops / must(device.timeProduct(n, n, n, false, times),
                          "fp32 product " + std::to_string(n) + "^3");
    if (bf16Works) {
      auto s = device.timeProduct(n, n, n, true, times);
      if (s.ok())
        r.bf16 = flops / *s;
      else {
        bf16Works = false;
        progress(root, "bf16 products not measured: " + s.error());
      }
    }
    progress(root, "product " + std::to_string(n) + "^3: fp32 " +
                       fmt("%.1f", r.fp32 / 1e9) + " GFLOP/s" +
                       (r.bf16 > 0
                            ? ", bf16 " + fmt("%.1f", r.bf16 / 1e9) + " GFLOP/s"
                            : ""));
    out.fp32 = std::max(out.fp32, r.fp32);
    out.bf16 = std::max(out.bf16, r.bf16);
    out.products.push_back(r);
  }
}

/// Fused attention (pcc.attention and its gradient), through the kernels
/// model libraries call: a product's rate misprices it by up to ten times
/// (the zoo's Llama, head width 16 at 64 tokens: 12.6 GFLOP/s forward and
/// 22 backward in bf16, where its products reach 150).
void measureAttention(Device &device, bool quick, bool root, Measured &out) {
  std::vector<int64_t> widths = {16, 64, 128};
  std::vector<int64_t> lengths = {64, 256, 1024};
  if (quick) {
    widths = {64};
    lengths = {64, 256};
  }
  int times = quick ? 1 : 3;
  bool bf16Works = true;
  for (int64_t d : widths)
    for (int64_t s : lengths) {
      // About 50 MFLOP a call forward (a few ms on one CPU core).
      int64_t heads = std::max<int64_t>(1, (int64_t(50) << 20) / (4 * s * s * d));
      heads = std::min<int64_t>(heads, 64);
      double forward = 2.0 * heads * s * s * 2.0 * d;
      AttentionRate r;
      r.headDim = d;
      r.seq = s;
      auto name = [&](const char *what) {
        return std::string(what) + " (" + std::to_string(heads) + " heads, " +
               std::to_string(s) + " tokens, width " + std::to_string(d) + ")";
      };
      r.fp32 = forward / must(device.timeAttention(heads, s, d, false, false,
                                                   times),
                              name("attention"));
      r.gradFp32 =
          2.5 * forward /
          must(device.timeAttention(heads, s, d, false, true, times),
               name("attention gradient"));
      if (bf16Works) {
        auto f = device.timeAttention(heads, s, d, true, false, times);
        auto g = device.timeAttention(heads, s, d, true, true, times);
        if (f.ok() && g.ok()) {
          r.bf16 = forward / *f;
          r.gradBf16 = 2.5 * forward / *g;
        } else {
          bf16Works = false;
          progress(root, "bf16 attention not measured: " +
                             (f.ok() ? g.error() : f.error()));
        }
      }
      progress(root, "attention, width " + std::to_string(d) + " at " +
                         std::to_string(s) + " tokens: fp32 " +
                         fmt("%.1f", r.fp32 / 1e9) + " GFLOP/s (gradient " +
                         fmt("%.1f", r.gradFp32 / 1e9) + ")" +
                         (r.bf16 > 0 ? ", bf16 " + fmt("%.1f", r.bf16 / 1e9) +
                                           " (gradient " +
                                           fmt("%.1f", r.gradBf16 / 1e9) + ")"
                                     : ""));
      out.attention.push_back(r);
    }
}

/// Copies: a large one's bytes per second (read and write), a tiny one's
/// seconds.
void measureCopies(Device &device, bool quick, bool root, Measured &out) {
  int64_t bytes = device.isHost() ? (int64_t(64) << 20) : (int64_t(1) << 30);
  if (quick)
    bytes = int64_t(8) << 20;
  double s = must(device.timeCopy(bytes, quick ? 2 : 5), "copy");
  out.bandwidth = 2.0 * static_cast<double>(bytes) / s;
  out.kernelSeconds =
      must(device.timeCopy(64, quick ? 200 : 2000), "tiny copy");
  progress(root, "copy " + std::to_string(bytes >> 20) +
                     " MiB: " + fmt("%.1f", out.bandwidth / 1e9) +
                     " GB/s moved; a tiny copy " +
                     fmt("%.2f", out.kernelSeconds * 1e6) + " us");
}

/// Every CPU rank runs the same product at once: the rate each gets
/// against one rank's alone says how many cores the ranks really share.
void measureSharing(Device &device, Communicator &world, bool quick,
                    Measured &out) {
  bool root = world.rank() == 0;
  const int64_t n = quick ? 128 : 512;
  double flops = 2.0 * static_cast<double>(n) * n * n;
  double alone = 0;
  if (root)
    alone = flops / must(device.timeProduct(n, n, n, false, quick ? 2 : 5),
                         "product alone");
  must(world.barrier(), "barrier");
  // A long run of products on every rank at once (timeProduct's warm-up
  // and `reps` timed calls), timed whole so that the ranks' time slices
  // average out.
  int reps = quick ? 8 : 30;
  Clock::time_point t0 = Clock::now();
  must(device.timeProduct(n, n, n, false, reps), "product together");
  double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  double rate = flops * (reps + 1) / seconds;
  double sum = rate;
  must(world.allReduce(&sum, &sum, 1, DType::F64, ReduceOp::Sum),
       "sharing sum");
  must(world.broadcast(&alone, 1, DType::F64, 0), "sharing alone");
  out.alone = alone;
  out.together = sum / world.size();
  out.cores = std::clamp(sum / alone, 1.0, static_cast<double>(world.size()));
  progress(root, std::to_string(world.size()) + " ranks at once on " +
                     std::to_string(out.hardwareCores) +
                     " cores: each reaches " + fmt("%.1f", out.together / 1e9) +
                     " GFLOP/s at " + std::to_string(n) + "^3 against " +
                     fmt("%.1f", alone / 1e9) +
                     " alone: " + fmt("%.2f", out.cores) + " cores' worth");
}

/// All-reduce over every rank (`comm`: MPI, or NCCL on GPUs), from 4 bytes
/// to 64 MiB; a least-squares line through the times gives latency and
/// bus bandwidth.
void measureAllReduce(Device &device, Communicator &world, Communicator &comm,
                      bool quick, Measured &out) {
  bool root = world.rank() == 0;
  int ranks = comm.size();
  std::vector<int64_t> counts = {1, 256, 16384, 262144, 4194304, 16777216};
  if (quick)
    counts = {1, 16384, 262144};
  int64_t largest = counts.back() * 4;
  DeviceBuffer buffer = must(DeviceBuffer::zeros(device, largest), "buffer");
  for (int64_t count : counts) {
    int64_t bytes = count * 4;
    int reps = bytes <= (1 << 20) ? (quick ? 10 : 50) : (quick ? 2 : 5);
    auto once = [&] {
      must(comm.allReduce(buffer.data(), buffer.data(), count, DType::F32,
                          ReduceOp::Sum),
           "all_reduce of " + std::to_string(bytes) + " bytes");
      must(comm.waitCollectives(), "all_reduce");
      must(device.synchronize(), "all_reduce");
    };
    once();
    must(world.barrier(), "barrier");
    Clock::time_point t0 = Clock::now();
    for (int i = 0; i < reps; ++i)
      once();
    double seconds =
        std::chrono::duration<double>(Clock::now() - t0).count() / reps;
    // The slowest rank's time is the collective's.
    must(world.allReduce(&seconds, &seconds, 1, DType::F64, ReduceOp::Max),
         "timing");
    out.allReduce.push_back({bytes, seconds});
    double bus = 2.0 * (ranks - 1) / ranks * static_cast<double>(bytes);
    progress(root, "all_reduce over " + std::to_string(ranks) + " ranks (" +
                       comm.engine() + "), " + std::to_string(bytes) +
                       " bytes: " + fmt("%.1f", seconds * 1e6) + " us, " +
                       fmt("%.2f", bus / seconds / 1e9) + " GB/s bus");
  }
  // t = latency + busBytes / bandwidth, fitted on the sizes from 64 KiB
  // to 16 MiB (the small ones give the latency alone; gradients are
  // reduced in buckets of 25 MiB and less, and larger all-reduces of CPU
  // ranks fall out of the caches: 4 ranks here reach 1.45 GB/s at 16 MiB
  // and 0.75-0.9 at 64).
  out.latency = out.allReduce.front().seconds;
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  int n = 0;
  for (const CollectiveTime &t : out.allReduce) {
    if (t.bytes < 65536 || t.bytes > (int64_t(16) << 20))
      continue;
    double x = 2.0 * (ranks - 1) / ranks * static_cast<double>(t.bytes);
    sx += x, sy += t.seconds, sxx += x * x, sxy += x * t.seconds, ++n;
  }
  double slope = n >= 2 && n * sxx - sx * sx > 0
                     ? (n * sxy - sx * sy) / (n * sxx - sx * sx)
                     : 0;
  if (slope <= 0) {
    const CollectiveTime &last = out.allReduce.back();
    slope = std::max(1e-15, last.seconds - out.latency) /
            (2.0 * (ranks - 1) / ranks * static_cast<double>(last.bytes));
  }
  out.busBandwidth = 1.0 / slope;
}

/// In a step a collective comes between kernels, and the ranks reach it
/// at different times (CPU ranks sharing cores are not all running at
/// once, and one that waits is descheduled): small products, each
/// followed by a 4-byte all-reduce, against the same products alone, say
/// what a collective costs there. Back to back, as measureAllReduce times
/// them, the ranks arrive together: 4 CPU ranks on 2 cores took 8 us a
/// call there and 40-70 us inside a training step.
void measureInStep(Device &device, Communicator &world, Communicator &comm,
                   bool quick, Measured &out) {
  bool root = world.rank() == 0;
  const int64_t n = 96; // ~1.8 MFLOP: 10-40 us a product
  int reps = quick ? 20 : 150;
  DeviceBuffer buffer = must(DeviceBuffer::zeros(device, 4), "buffer");
  auto loop = [&](bool collective) {
    must(world.barrier(), "barrier");
    Clock::time_point t0 = Clock::now();
    for (int i = 0; i < reps; ++i) {
      must(device.timeProduct(n, n, n, false, 1), "product");
      if (collective) {
        must(comm.allReduce(buffer.data(), buffer.data(), 1, DType::F32,
                            ReduceOp::Sum),
             "all_reduce between products");
        must(comm.waitCollectives(), "all_reduce between products");
        must(device.synchronize(), "all_reduce between products");
      }
    }
    double seconds =
        std::chrono::duration<double>(Clock::now() - t0).count() / reps;
    must(world.allReduce(&seconds, &seconds, 1, DType::F64, ReduceOp::Max),
         "timing");
    return seconds;
  };
  // In turn, several times; the median of the differences (the best of
  // two each, as before, gave 27, 53 and 100 us in three calibrations of
  // 8 ranks on 2 cores, and the plans' collectives were priced by it).
  std::vector<double> extra;
  for (int pair = 0; pair < (quick ? 3 : 9); ++pair) {
    double alone = loop(false);
    extra.push_back(loop(true) - alone);
  }
  std::nth_element(extra.begin(), extra.begin() + extra.size() / 2,
                   extra.end());
  out.stepLatency = std::max(0.0, extra[extra.size() / 2]);
  if (comm.size() < world.size()) {
    progress(root, "all_reduce of 4 bytes between products in groups of " +
                       std::to_string(comm.size()) + " ranks: " +
                       fmt("%.1f", out.stepLatency * 1e6) + " us a call");
    return;
  }
  progress(root, "all_reduce of 4 bytes between products: " +
                     fmt("%.1f", out.stepLatency * 1e6) + " us a call (" +
                     fmt("%.1f", out.latency * 1e6) + " back to back)");
}

/// measureInStep in groups of 2, 4, ... ranks below the world's, every
/// rank in one group at once (a plan's tp or dp groups): over 8 CPU ranks
/// sharing 2 cores a group of 2 is not an 8-rank collective, and pricing
/// every group at the 8-rank latency put the bundled GPT's tp 2 x pp 2 x dp
/// 2 plans at twice their measured step.
void measureGroups(Device &device, Communicator &world, bool quick,
                   Measured &out) {
  for (int g = 2; g < world.size(); g *= 2) {
    if (world.size() % g != 0)
      continue;
    std::unique_ptr<Communicator> group =
        must(world.split(world.rank() / g, world.rank()),
             "a group of " + std::to_string(g) + " ranks");
    Measured m;
    measureInStep(device, world, *group, quick, m);
    out.groupLatencies.push_back({g, m.stepLatency});
  }
}

std::string today() {
  std::time_t now = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d", std::gmtime(&now));
  return buf;
}

std::string hostName() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0)
    return "unknown";
  return buf;
}

/// Where the file is written before it is renamed over `path`.
std::string temporaryPath(const std::string &path) {
  return path + ".tmp." + std::to_string(getpid());
}

/// Fails before anything is measured when `path` cannot be written.
void checkWritable(const std::string &path) {
  std::string temp = temporaryPath(path);
  std::ofstream f(temp, std::ios::binary | std::ios::trunc);
  if (!f)
    die("cannot write the machine file '" + path +
        "': " + std::strerror(errno));
  f.close();
  std::remove(temp.c_str());
}

/// The machine file (Machine::load's keys), written to a temporary file
/// and renamed over `path`.
void writeMachine(const CalibrateOptions &o, const std::string &base, int ranks,
                  const Measured &m) {
  std::ostringstream os;
  os.precision(6);
  os << "{\n";
  os << "  \"name\": \"calibrated "
     << (m.device.rfind("cuda", 0) == 0 ? "cuda" : "cpu") << " (" << ranks
     << " rank" << (ranks == 1 ? "" : "s") << ", " << hostName() << ", "
     << today() << ")\",\n";
  os << "  \"base\": \"" << base << "\",\n";
  os << "  \"fp32_flops\": " << m.fp32 << ",\n";
  if (m.bf16 > 0)
    os << "  \"bf16_flops\": " << m.bf16 << ",\n";
  os << "  \"memory_bandwidth\": " << m.bandwidth << ",\n";
  os << "  \"kernel_seconds\": " << m.kernelSeconds << ",\n";
  if (m.busBandwidth > 0) {
    os << "  \"intra_bandwidth\": " << m.busBandwidth << ",\n";
    // The latency a step's collectives see (the larger of the two).
    os << "  \"intra_latency\": " << std::max(m.latency, m.stepLatency)
       << ",\n";
    if (!m.groupLatencies.empty()) {
      os << "  \"intra_latencies\": [";
      for (const auto &[ranks, seconds] : m.groupLatencies)
        os << "{\"ranks\": " << ranks << ", \"seconds\": " << seconds << "}, ";
      os << "{\"ranks\": " << ranks
         << ", \"seconds\": " << std::max(m.latency, m.stepLatency) << "}],\n";
    }
  }
  if (m.cores > 0)
    os << "  \"cores\": " << m.cores << ",\n";
  else if (m.device == "cpu")
    os << "  \"cores\": " << m.hardwareCores << ",\n";
  os << "  \"products\": [";
  for (size_t i = 0; i < m.products.size(); ++i) {
    const ProductRate &r = m.products[i];
    os << (i ? "," : "") << "\n    {\"size\": " << r.size
       << ", \"fp32_flops\": " << r.fp32;
    if (r.bf16 > 0)
      os << ", \"bf16_flops\": " << r.bf16;
    os << "}";
  }
  os << "\n  ],\n";
  if (!m.attention.empty()) {
    os << "  \"attention\": [";
    for (size_t i = 0; i < m.attention.size(); ++i) {
      const AttentionRate &r = m.attention[i];
      os << (i ? "," : "") << "\n    {\"head_dim\": " << r.headDim
         << ", \"seq\": " << r.seq << ", \"fp32_flops\": " << r.fp32
         << ", \"grad_fp32_flops\": " << r.gradFp32;
      if (r.bf16 > 0)
        os << ", \"bf16_flops\": " << r.bf16
           << ", \"grad_bf16_flops\": " << r.gradBf16;
      os << "}";
    }
    os << "\n  ],\n";
  }
  os << "  \"measured\": {\"device\": \"" << m.device
     << "\", \"ranks\": " << ranks
     << ", \"hardware_cores\": " << m.hardwareCores;
  if (m.alone > 0)
    os << ", \"product_alone_flops\": " << m.alone
       << ", \"product_together_flops\": " << m.together;
  // Both whenever the all-reduce was measured (between products it may
  // measure 0: no slower than the products alone).
  if (!m.allReduce.empty())
    os << ", \"all_reduce_latency_back_to_back\": " << m.latency
       << ", \"all_reduce_latency_between_products\": " << m.stepLatency;
  if (!m.allReduce.empty()) {
    os << ", \"all_reduce\": [";
    for (size_t i = 0; i < m.allReduce.size(); ++i)
      os << (i ? ", " : "") << "[" << m.allReduce[i].bytes << ", "
         << m.allReduce[i].seconds << "]";
    os << "]";
  }
  os << "}\n}\n";
  std::string temp = temporaryPath(o.output);
  {
    std::ofstream f(temp, std::ios::binary | std::ios::trunc);
    f << os.str();
    f.close();
    if (!f)
      die("cannot write the machine file '" + o.output +
          "': " + std::strerror(errno));
  }
  if (std::rename(temp.c_str(), o.output.c_str()) != 0) {
    int err = errno;
    std::remove(temp.c_str());
    die("cannot write the machine file '" + o.output +
        "': " + std::strerror(err));
  }
}

} // namespace

int pccrun::runCalibration(const CalibrateOptions &o) {
  if (o.output.empty())
    die("--calibrate needs the machine file to write");
  bool underMpi = Communicator::launchedByMpi();
  if (o.ranks > 1 && !underMpi)
    launch(o.ranks, o.hostfile, o.rankArgs);
  std::unique_ptr<Communicator> world;
  if (underMpi) {
    Communicator::setCollectiveTimeout(o.collectiveTimeout);
    world = must(Communicator::mpiWorld(), "joining the MPI job");
    joinedJob(*world);
  } else {
    world = Communicator::self();
  }
  bool root = world->rank() == 0;
  if (root)
    checkWritable(o.output);
  std::unique_ptr<Device> device = openRankDevice(o.device, underMpi);
  std::string base =
      o.base.empty() ? (device->isHost() ? "cpu" : "h100") : o.base;
  Measured m;
  m.device = device->describe();
  m.hardwareCores = usableCores();
  progress(root, "measuring " + m.device + " with " +
                     std::to_string(world->size()) +
                     (world->size() == 1 ? " rank" : " ranks") +
                     (device->isHost()
                          ? " on " + std::to_string(m.hardwareCores) + " cores"
                          : "") +
                     (o.quick ? " (quick)" : ""));
  if (root) {
    measureProducts(*device, o.quick, root, m);
    measureAttention(*device, o.quick, root, m);
    measureCopies(*device, o.quick, root, m);
  }
  if (world->size() > 1) {
    must(world->barrier(), "barrier");
    if (device->isHost())
      measureSharing(*device, *world, o.quick, m);
    std::unique_ptr<Communicator> nccl;
    Communicator *comm = world.get();
    if (!device->isHost()) {
      nccl = must(Communicator::nccl(*world, *device), "NCCL");
      comm = nccl.get();
    }
    measureAllReduce(*device, *world, *comm, o.quick, m);
    measureInStep(*device, *world, *comm, o.quick, m);
    // (MPI groups only: NCCL's would each need their own communicator.)
    if (device->isHost())
      measureGroups(*device, *world, o.quick, m);
  }
  if (root) {
    writeMachine(o, base, world->size(), m);
    progress(root, "wrote " + o.output + " (base '" + base + "')");
  }
  if (world->size() > 1)
    must(world->barrier(), "barrier");
  return 0;
}
