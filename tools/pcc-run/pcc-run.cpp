//===- pcc-run.cpp - run a model library built by pcc ---------------------===//
//
//   pcc-run model.so --input x.npy [--input ...] [--output y.npy ...]
//           [--expect ref.npy ...] [--rtol R --atol A] [--bench N]
//           [--weights file.safetensors] [--device cpu|cuda|cuda:N]
//           [-n RANKS [--hostfile FILE]] [--trace t.json] [--trace-svg t.svg]
//
// Plain C++ on the runtime library: no MLIR. Every failure is one message
// naming the file, tensor or node at fault, and exit status 1.
//
//===----------------------------------------------------------------------===//

#include "pcc/runtime/Communicator.h"
#include "pcc/runtime/CpuKernels.h"
#include "pcc/runtime/DType.h"
#include "pcc/runtime/Device.h"
#include "pcc/runtime/HalfFloat.h"
#include "pcc/runtime/ModelLibrary.h"
#include "pcc/runtime/Npy.h"
#include "pcc/runtime/Pipeline.h"
#include "pcc/runtime/Safetensors.h"

#include "Trace.h"
#include "Train.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <unistd.h>

using namespace pccrt;

namespace {

const char *kUsage = R"(pcc-run: run a model library built by pcc

Usage:
  pcc-run model.so --input x.npy [--input x2.npy ...] [options]

Options:
  --input FILE       a .npy file per model input, in the model's order
  --output FILE      write the model's outputs (one per output, in order)
  --expect FILE      compare an output with a reference .npy (one per output)
  --rtol R --atol A  comparison tolerances (default 1e-4 and 1e-5)
  --bench N          run N more times and print latency percentiles
  --weights FILE     the weights file (default: the one beside model.so)
  --device DEV       cpu (default), cuda or cuda:N; the library must hold
                     code for it (pcc --target=cpu|cuda|all)
  --info             print the model's signature and exit
  --list-devices     print the devices this machine offers and exit
  --cuda-graph       on cuda, record one run as a CUDA graph and replay it
                     for --bench (checks that the replay matches)
  -n N               run N ranks, one per position of the mesh the library
                     was partitioned for (pcc --tp=N): pcc-run starts them
                     with mpirun, or joins the job when mpirun or srun
                     started it. Each rank reads only its slice of the
                     weights; rank 0 writes and checks the outputs. If a
                     rank dies, mpirun ends the others and the run fails.
  --hostfile FILE    passed to mpirun for runs over several hosts
  --collective-timeout SECONDS
                     with several ranks: a collective or transfer that
                     waits longer than this (a peer stalled or died) ends
                     the job, naming the rank, its mesh coordinates, the
                     group, the collective and its sequence number
                     (default 300; 0 waits for ever)
  --trace FILE       pipelined libraries (pcc --pp): write every rank's
                     compute, send, receive and idle intervals of the last
                     run as Chrome-trace JSON (chrome://tracing, Perfetto)
                     and print the measured bubble per rank
  --trace-svg FILE   the same timeline as an SVG Gantt chart

Training (a library built by pcc --train):
  --steps N          train until step N (counted from the start of training,
                     also after --resume)
  --input FILE       a .npy per model input with N >= batch rows; step k
                     uses rows [k*B, (k+1)*B) modulo N, in order
  --labels FILE      the labels (.npy): int64 classes for cross_entropy, the
                     float target for mse
  --shuffle SEED     a seeded permutation of the rows per epoch instead
                     (with --data: windows at seeded random offsets)
  --seed N           keys dropout's masks (default 0): the same seed gives
                     the same run; a checkpoint keeps it
  --data FILE --seq S  a token file (uint16, nanoGPT's .bin; --data-dtype
                     int32) cut into windows of S + 1 tokens, one after
                     another, for language models (input: the first S,
                     labels: the last S)
  --lr LR --weight-decay WD --betas B1,B2 --eps E   (AdamW, PyTorch defaults)
  --momentum M --dampening D --nesterov             (SGD)
  --clip-grad-norm MAX  clip the global gradient norm
  --warmup N --schedule-lr constant|cosine|linear [--min-lr LR]
                     linear warmup, then the schedule down to --min-lr
                     (0 by default) at the last step
  --loss-log FILE.csv   step,loss,lr,grad_norm,samples_per_s,step_ms
  --loss-svg FILE.svg   the loss curve
  --save-dir DIR --save-every N   checkpoints (DIR/step-N, DIR/LATEST)
  --save-sharded     every rank writes its own pieces (rank-R.safetensors)
                     instead of rank 0 writing the gathered state
  --resume DIR       continue from a checkpoint (bit-identical to a run
                     that was never interrupted), saved in any layout
  --log-every N      print every N-th step (default 1)

Examples:
  pcc examples/mlp.onnx --batch=2 -o mlp.so
  pcc-run mlp.so --input examples/data/mlp.input.npy --output y.npy \
      --expect examples/data/mlp.output.npy
  pcc examples/mlp.onnx --batch=2 --target=cuda -o mlp-gpu.so
  pcc-run mlp-gpu.so --device cuda --input examples/data/mlp.input.npy \
      --bench 100
  pcc examples/transformer_prenorm.onnx --batch=2 --tp=2 -o enc-tp2.so
  pcc-run -n 2 enc-tp2.so --input examples/data/transformer_prenorm.input.npy \
      --expect examples/data/transformer_prenorm.output.npy
  pcc examples/gpt.onnx --batch=2 --dim=seq=16 --tp=2 --pp=2 \
      --microbatches=2 -o gpt-tp2pp2.so
  pcc-run -n 4 gpt-tp2pp2.so --input examples/data/gpt.input.npy \
      --expect examples/data/gpt.output.npy --trace-svg timeline.svg
  pcc examples/mlp.onnx --train --loss=cross_entropy --batch=8 -o train.so
  pcc-run train.so --steps 200 --input x.npy --labels y.npy --lr 3e-4 \
      --loss-log loss.csv --save-dir ckpt --save-every 50
  pcc-run train.so --steps 400 --input x.npy --labels y.npy --resume ckpt
)";

/// "rank R of N: " once this process is one rank of several.
std::string rankPrefix;
/// The job's world once this process has joined it: a failing rank ends
/// the job through it, so the others do not wait for it forever.
Communicator *jobWorld = nullptr;

[[noreturn]] void die(const std::string &message) {
  std::fprintf(stderr, "pcc-run: %serror: %s\n", rankPrefix.c_str(),
               message.c_str());
  std::fflush(stdout);
  std::fflush(stderr);
  if (jobWorld)
    jobWorld->abortJob(1);
  std::exit(1);
}

/// Element i of a buffer as a double (for comparisons and printing).
double valueAt(const uint8_t *data, DType type, int64_t i) {
  switch (type) {
  case DType::F32:
    return reinterpret_cast<const float *>(data)[i];
  case DType::F64:
    return reinterpret_cast<const double *>(data)[i];
  case DType::F16:
    return halfToFloat(reinterpret_cast<const uint16_t *>(data)[i]);
  case DType::BF16:
    return bf16ToFloat(reinterpret_cast<const uint16_t *>(data)[i]);
  case DType::I64:
    return double(reinterpret_cast<const int64_t *>(data)[i]);
  case DType::I32:
    return reinterpret_cast<const int32_t *>(data)[i];
  case DType::I16:
    return reinterpret_cast<const int16_t *>(data)[i];
  case DType::I8:
    return reinterpret_cast<const int8_t *>(data)[i];
  default:
    return data[i];
  }
}

struct Options {
  std::string library, weights, device = "cpu", hostfile;
  std::string trace, traceSvg;
  /// -n: ranks to run (0: not given).
  int ranks = 0;
  /// Every argument except -n and --hostfile, for the ranks mpirun starts.
  std::vector<std::string> rankArgs;
  std::vector<std::string> inputs, outputs, expects;
  double rtol = 1e-4, atol = 1e-5;
  int bench = 0;
  bool info = false;
  bool listDevices = false;
  bool cudaGraph = false;
  double collectiveTimeout = 300;
  /// Training libraries (pcc --train).
  TrainOptions train;
};

Options parse(int argc, char **argv) {
  Options o;
  auto value = [&](int &i) -> std::string {
    if (i + 1 >= argc)
      die(std::string(argv[i]) + " needs a value");
    return argv[++i];
  };
  auto number = [&](int &i) {
    std::string v = value(i);
    char *end = nullptr;
    double d = std::strtod(v.c_str(), &end);
    if (*end != '\0' || d < 0)
      die(std::string(argv[i - 1]) + " needs a non-negative number, got '" + v +
          "'");
    return d;
  };
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    int first = i; // this option's first argument, for rankArgs
    if (a == "-n" || a == "--ranks" || a == "--hostfile") {
      if (a == "--hostfile") {
        o.hostfile = value(i);
        continue;
      }
      double n = number(i);
      if (n < 1 || n != static_cast<int>(n))
        die("-n needs a positive number of ranks");
      o.ranks = static_cast<int>(n);
      continue;
    }
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else if (a == "--input") {
      o.inputs.push_back(value(i));
    } else if (a == "--output") {
      o.outputs.push_back(value(i));
    } else if (a == "--expect") {
      o.expects.push_back(value(i));
    } else if (a == "--weights") {
      o.weights = value(i);
    } else if (a == "--device") {
      o.device = value(i);
    } else if (a == "--rtol") {
      o.rtol = number(i);
    } else if (a == "--atol") {
      o.atol = number(i);
    } else if (a == "--bench") {
      o.bench = static_cast<int>(number(i));
    } else if (a == "--trace") {
      o.trace = value(i);
    } else if (a == "--trace-svg") {
      o.traceSvg = value(i);
    } else if (a == "--info") {
      o.info = true;
    } else if (a == "--list-devices") {
      o.listDevices = true;
    } else if (a == "--cuda-graph") {
      o.cudaGraph = true;
    } else if (a == "--collective-timeout") {
      o.collectiveTimeout = number(i);
    } else if (parseTrainOption(a, o.train, [&] { return value(i); })) {
    } else if (!a.empty() && a[0] == '-') {
      die("unknown option '" + a + "' (see --help)");
    } else if (o.library.empty()) {
      o.library = a;
    } else {
      die("unexpected argument '" + a + "' (see --help)");
    }
    o.rankArgs.insert(o.rankArgs.end(), argv + first, argv + i + 1);
  }
  if (o.library.empty() && !o.listDevices)
    die("no model library; usage: pcc-run model.so --input x.npy (see "
        "--help)");
  return o;
}

/// Starts `ranks` copies of this program under mpirun; does not return.
[[noreturn]] void launch(const Options &o) {
  std::vector<std::string> args{"mpirun", "-n", std::to_string(o.ranks)};
  if (geteuid() == 0)
    args.push_back("--allow-run-as-root");
  // Ranks may outnumber cores on one host; do not pin them to cores.
  for (const char *a : {"--oversubscribe", "--bind-to", "none"})
    args.push_back(a);
  // Several ranks per host each spawning a thread per core oversubscribe
  // the cores; one thread per rank unless the user says otherwise.
  for (const char *var : {"OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"}) {
    if (!std::getenv(var))
      setenv(var, "1", 0);
    args.push_back("-x");
    args.push_back(var);
  }
  if (!o.hostfile.empty()) {
    args.push_back("--hostfile");
    args.push_back(o.hostfile);
  }
  char self[4096];
  ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (len <= 0)
    die("cannot find this program's path to start the ranks");
  self[len] = '\0';
  args.push_back(self);
  for (const std::string &a : o.rankArgs)
    args.push_back(a);
  std::vector<char *> cargs;
  for (std::string &a : args)
    cargs.push_back(a.data());
  cargs.push_back(nullptr);
  std::fflush(stdout);
  execvp("mpirun", cargs.data());
  die("cannot start " + std::to_string(o.ranks) +
      " ranks: mpirun: " + std::strerror(errno) +
      " (install openmpi-bin, or start pcc-run under your own mpirun/srun)");
}

/// Opens `name`; a rank of a job asking for "cuda" gets one of its host's
/// GPUs, round-robin by its local rank.
std::unique_ptr<Device> openRankDevice(const std::string &name, bool rank) {
  std::string deviceName = name;
  if (rank && deviceName == "cuda")
    if (const char *local = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK")) {
      auto count = Device::cudaDeviceCount();
      if (count.ok() && *count > 0)
        deviceName = "cuda:" + std::to_string(std::atoi(local) % *count);
    }
  auto device = Device::open(deviceName);
  if (!device.ok())
    die(device.error());
  return device.take();
}

/// The communicators of one rank: the world, and a group per mesh axis
/// bound to the model ABI.
struct Ranks {
  std::unique_ptr<Communicator> world;
  std::vector<std::unique_ptr<Communicator>> groups;
  /// The same groups over MPI, for host-side sums (on GPUs `groups` are
  /// NCCL communicators).
  std::vector<std::unique_ptr<Communicator>> hostGroups;
  std::vector<std::unique_ptr<CommBinding>> bindings;
  std::vector<pcc_comm> tables;
  std::vector<int64_t> coords;
};

/// The world rank at mesh coordinates `coords` (the last axis fastest).
int worldRankAt(const pcc_model_info &info,
                const std::vector<int64_t> &coords) {
  int64_t rank = 0;
  for (int a = 0; a < info.num_mesh_axes; ++a)
    rank = rank * info.mesh_sizes[a] + coords[a];
  return static_cast<int>(rank);
}

/// The mesh coordinates of world rank `rank` (the last axis fastest).
std::vector<int64_t> meshCoordinates(const pcc_model_info &info, int64_t rank) {
  std::vector<int64_t> coords(info.num_mesh_axes);
  for (int a = info.num_mesh_axes - 1; a >= 0; --a) {
    coords[a] = rank % info.mesh_sizes[a];
    rank /= info.mesh_sizes[a];
  }
  return coords;
}

/// Joins the MPI job and builds one group per mesh axis: the ranks that
/// differ only in their coordinate on that axis (the last axis varies
/// fastest).
Ranks joinRanks(const pcc_model_info &info, int64_t meshRanks, Device &device,
                const std::string &mesh, double collectiveTimeout) {
  Ranks r;
  Communicator::setCollectiveTimeout(collectiveTimeout);
  auto world = Communicator::mpiWorld();
  if (!world.ok())
    die(world.error());
  r.world = world.take();
  jobWorld = r.world.get();
  int rank = r.world->rank(), size = r.world->size();
  rankPrefix =
      "rank " + std::to_string(rank) + " of " + std::to_string(size) + ": ";
  if (size != meshRanks)
    die("the library was partitioned for " + mesh + " (" +
        std::to_string(meshRanks) + " ranks) but this run has " +
        std::to_string(size) + "; run it with -n " + std::to_string(meshRanks));
  r.coords = meshCoordinates(info, rank);
  for (int a = 0; a < info.num_mesh_axes; ++a) {
    // The group of axis a: the ranks that differ from this one only there,
    // named by the one of them at coordinate 0.
    std::vector<int64_t> first = r.coords;
    first[a] = 0;
    auto group =
        r.world->split(worldRankAt(info, first), static_cast<int>(r.coords[a]));
    if (!group.ok())
      die(group.error());
    std::unique_ptr<Communicator> g = group.take();
    g->setName(info.mesh_axes[a]);
    if (!device.isHost() && info.mesh_sizes[a] > 1) {
      auto nccl = Communicator::nccl(*g, device);
      if (!nccl.ok())
        die(nccl.error());
      r.hostGroups.push_back(std::move(g));
      g = nccl.take();
      g->setName(info.mesh_axes[a]);
    } else {
      r.hostGroups.push_back(nullptr);
    }
    r.groups.push_back(std::move(g));
  }
  // Messages from here on say where the rank sits in the mesh.
  std::string coords;
  for (int a = 0; a < info.num_mesh_axes; ++a)
    coords += (a ? ", " : "") + std::string(info.mesh_axes[a]) + "=" +
              std::to_string(r.coords[a]);
  rankPrefix = "rank " + std::to_string(rank) + " of " + std::to_string(size) +
               " [" + coords + "]: ";
  r.world->setMeshCoordinates(coords);
  for (auto &g : r.groups) {
    g->setMeshCoordinates(coords);
    r.bindings.push_back(std::make_unique<CommBinding>(*g));
  }
  for (auto &b : r.bindings)
    r.tables.push_back(b->table());
  return r;
}

/// Reorders a whole-batch array whose batch is dimension `dim` between the
/// user's layout [outer, m x b, inner] and the runtime's, micro-batch after
/// micro-batch: [m, outer, b, inner] (`toMicrobatches`) or back.
void reorderMicrobatches(NpyArray &a, int32_t dim, int64_t m,
                         bool toMicrobatches) {
  if (m <= 1 || dim <= 0)
    return; // dimension 0: already micro-batch after micro-batch
  int64_t outer = 1, inner = dtypeSize(a.dtype);
  for (int32_t d = 0; d < dim; ++d)
    outer *= a.shape[d];
  for (size_t d = dim + 1; d < a.shape.size(); ++d)
    inner *= a.shape[d];
  int64_t rows = a.shape[dim] / m; // one micro-batch's
  std::vector<uint8_t> out(a.data.size());
  for (int64_t k = 0; k < m; ++k)
    for (int64_t o = 0; o < outer; ++o) {
      int64_t user = (o * a.shape[dim] + k * rows) * inner;
      int64_t runtime = ((k * outer + o) * rows) * inner;
      const uint8_t *from = a.data.data() + (toMicrobatches ? user : runtime);
      uint8_t *to = out.data() + (toMicrobatches ? runtime : user);
      std::memcpy(to, from, rows * inner);
    }
  a.data = std::move(out);
}

/// Reads the --input files and checks them against the model's inputs
/// (whole batch: every micro-batch's rows).
std::vector<NpyArray> readInputs(const Options &opts,
                                 const ModelLibrary &library) {
  const pcc_model_info &info = library.info();
  auto describeInput = [&](const pcc_tensor_spec &spec) {
    std::string s = std::string(dtypeName(static_cast<DType>(spec.dtype))) +
                    " " + shapeString(library.batchShape(spec));
    if (info.microbatches > 1)
      s += " (" + std::to_string(info.microbatches) + " micro-batches of " +
           shapeString(specShape(spec)) + ")";
    return s;
  };
  if (static_cast<int>(opts.inputs.size()) != info.num_inputs) {
    std::string names;
    for (int i = 0; i < info.num_inputs; ++i)
      names += std::string(i ? ", " : "") + info.inputs[i].name + " (" +
               describeInput(info.inputs[i]) + ")";
    die("the model takes " + std::to_string(info.num_inputs) + " input(s): " +
        names + "; got " + std::to_string(opts.inputs.size()) + " --input");
  }
  std::vector<NpyArray> inputs;
  for (int i = 0; i < info.num_inputs; ++i) {
    auto array = readNpy(opts.inputs[i]);
    if (!array.ok())
      die(array.error());
    const pcc_tensor_spec &spec = info.inputs[i];
    if (array->dtype != static_cast<DType>(spec.dtype) ||
        array->shape != library.batchShape(spec))
      die("input '" + std::string(spec.name) + "' must be " +
          describeInput(spec) + ", but '" + opts.inputs[i] + "' holds " +
          std::string(dtypeName(array->dtype)) + " " +
          shapeString(array->shape));
    inputs.push_back(array.take());
    reorderMicrobatches(inputs.back(), library.batchDimOf(spec),
                        info.microbatches, /*toMicrobatches=*/true);
  }
  return inputs;
}

/// Host buffers for the model's outputs over the whole batch.
std::vector<NpyArray> makeOutputs(const ModelLibrary &library) {
  const pcc_model_info &info = library.info();
  std::vector<NpyArray> outputs;
  for (int i = 0; i < info.num_outputs; ++i) {
    NpyArray a;
    a.dtype = static_cast<DType>(info.outputs[i].dtype);
    a.shape = library.batchShape(info.outputs[i]);
    a.data.resize(elementCount(a.shape) * dtypeSize(a.dtype));
    outputs.push_back(std::move(a));
  }
  return outputs;
}

/// Writes the --output files, prints each output and compares it with its
/// --expect reference; false when one does not match.
bool reportOutputs(const Options &opts, const pcc_model_info &info,
                   const std::vector<NpyArray> &outputs) {
  if (opts.outputs.size() > outputs.size())
    die(std::to_string(opts.outputs.size()) + " --output files for " +
        std::to_string(outputs.size()) + " model output(s)");
  for (size_t i = 0; i < opts.outputs.size(); ++i) {
    Status s = writeNpy(opts.outputs[i], outputs[i]);
    if (!s.ok())
      die(s.error());
  }
  bool allMatch = true;
  for (size_t i = 0; i < outputs.size(); ++i) {
    const NpyArray &a = outputs[i];
    int64_t count = elementCount(a.shape);
    std::printf("output %s: %s %s [", info.outputs[i].name,
                std::string(dtypeName(a.dtype)).c_str(),
                shapeString(a.shape).c_str());
    for (int64_t j = 0; j < std::min<int64_t>(count, 6); ++j)
      std::printf("%s%.6g", j ? ", " : "", valueAt(a.data.data(), a.dtype, j));
    std::printf("%s]\n", count > 6 ? ", ..." : "");
    if (i >= opts.expects.size())
      continue;
    auto ref = readNpy(opts.expects[i]);
    if (!ref.ok())
      die(ref.error());
    if (ref->shape != a.shape)
      die("reference '" + opts.expects[i] + "' has shape " +
          shapeString(ref->shape) + ", output '" + info.outputs[i].name +
          "' has " + shapeString(a.shape));
    double maxAbs = 0, maxRel = 0;
    int64_t bad = 0;
    for (int64_t j = 0; j < count; ++j) {
      double x = valueAt(a.data.data(), a.dtype, j);
      double r = valueAt(ref->data.data(), ref->dtype, j);
      // Equal values (equal infinities included) and NaN for NaN match.
      bool nanMatch = x == r || (std::isnan(x) && std::isnan(r));
      double diff = nanMatch ? 0.0 : std::fabs(x - r);
      if (!nanMatch && !(diff <= opts.atol + opts.rtol * std::fabs(r)))
        ++bad;
      if (!nanMatch) {
        maxAbs = std::max(maxAbs, diff);
        if (r != 0)
          maxRel = std::max(maxRel, diff / std::fabs(r));
      }
    }
    std::printf("  vs %s: max |diff| %.3g, max rel %.3g: %s (rtol %g, atol "
                "%g)\n",
                opts.expects[i].c_str(), maxAbs, maxRel,
                bad ? "MISMATCH" : "matches", opts.rtol, opts.atol);
    if (bad) {
      std::printf("  %lld of %lld elements outside tolerance\n",
                  static_cast<long long>(bad), static_cast<long long>(count));
      allMatch = false;
    }
  }
  return allMatch;
}

/// Prints the --bench line from run latencies in milliseconds.
void printBench(std::vector<double> ms, const std::string &where,
                const char *extra, int64_t batch) {
  std::sort(ms.begin(), ms.end());
  auto pct = [&](double p) {
    return ms[std::min<size_t>(ms.size() - 1, size_t(p * ms.size()))];
  };
  double mean = 0;
  for (double m : ms)
    mean += m;
  mean /= ms.size();
  std::printf("bench (%s%s, inputs resident): %d runs, latency ms p50 %.3f "
              "p90 %.3f p99 %.3f mean %.3f; %.1f runs/s, %.1f samples/s "
              "(batch %lld)\n",
              where.c_str(), extra, static_cast<int>(ms.size()), pct(0.5),
              pct(0.9), pct(0.99), mean, 1000.0 / mean, 1000.0 * batch / mean,
              static_cast<long long>(batch));
}

/// Runs a pipelined library: every rank runs its pipeline rank's schedule
/// over the micro-batches; the rank of the last stage (tp 0) sends the
/// outputs to rank 0, which writes and checks them; --trace gathers every
/// rank's timeline on rank 0.
int runPipelined(Options &opts, const ModelLibrary &library, Device &device,
                 Ranks &ranks, const std::vector<NpyArray> &inputs) {
  const pcc_model_info &info = library.info();
  Communicator &world = *ranks.world;
  int ppAxis = info.pipeline_axis;
  int64_t ppRank = ranks.coords[ppAxis];
  std::vector<int32_t> mine = library.stagesOf(ppRank);
  bool leader = world.rank() == 0;

  // Weights: only those of this rank's stages, sliced for its tp position.
  std::vector<bool> needed(info.num_weights, false);
  for (int32_t k : mine)
    for (int i = 0; i < info.stages[k].num_weights; ++i)
      needed[info.stages[k].weights[i]] = true;
  std::string weightsPath =
      opts.weights.empty() ? library.defaultWeightsPath() : opts.weights;
  auto weightsFile = SafetensorsFile::open(weightsPath);
  if (!weightsFile.ok())
    die(weightsFile.error());
  auto weights =
      library.bindWeights(*weightsFile, weightsPath, ranks.coords, &needed);
  if (!weights.ok())
    die(weights.error());

  auto runner = PipelineRunner::create(library, device, *weights, ppRank,
                                       ranks.groups[ppAxis].get());
  if (!runner.ok())
    die(runner.error());
  runner->setCommunicators(ranks.tables.data());
  std::vector<const void *> inputPtrs;
  for (const NpyArray &a : inputs)
    inputPtrs.push_back(a.data.data());
  Status set = runner->setInputs(inputPtrs);
  if (!set.ok())
    die(set.error());
  if (leader)
    std::printf("ranks: %d (%s), %s; %d stages%s, %d micro-batches, %s "
                "schedule\n",
                world.size(), library.describeMesh().c_str(),
                ranks.groups.back()->engine(), info.num_stages,
                library.chunksPerPipelineRank() > 1
                    ? (" (" + std::to_string(library.chunksPerPipelineRank()) +
                       " chunks per pipeline rank)")
                          .c_str()
                    : "",
                info.microbatches, info.schedule_policy);
  if (!device.isHost() && leader)
    std::printf("device %s\n", device.describe().c_str());

  // One run: every rank leaves a barrier together, which is time zero of
  // its timeline, and the run ends when every rank is done.
  auto runOnce = [&]() -> double {
    Status b = world.barrier();
    if (!b.ok())
      die(b.error());
    auto origin = std::chrono::steady_clock::now();
    Status s = runner->run(origin);
    if (!s.ok())
      die(s.error());
    b = world.barrier();
    if (!b.ok())
      die(b.error());
    return std::chrono::duration<double, std::milli>(
               std::chrono::steady_clock::now() - origin)
        .count();
  };
  runOnce();

  // Outputs: from the last stage's first rank to rank 0.
  std::vector<NpyArray> outputs = makeOutputs(library);
  std::vector<int64_t> holderCoords(info.num_mesh_axes, 0);
  holderCoords[ppAxis] = (info.num_stages - 1) % info.num_pipeline_ranks;
  int holder = worldRankAt(info, holderCoords);
  if (world.rank() == holder) {
    std::vector<void *> ptrs;
    for (NpyArray &a : outputs)
      ptrs.push_back(a.data.data());
    Status r = runner->readOutputs(ptrs);
    if (!r.ok())
      die(r.error());
  }
  // In pieces of at most 1 GiB: MPI counts are ints.
  const int64_t piece = int64_t(1) << 30;
  if (holder != 0)
    for (NpyArray &a : outputs)
      for (int64_t at = 0; at < static_cast<int64_t>(a.data.size());
           at += piece) {
        int64_t bytes =
            std::min<int64_t>(piece, static_cast<int64_t>(a.data.size()) - at);
        Status s = Status::success();
        if (world.rank() == holder)
          s = world.send(a.data.data() + at, bytes, DType::U8, 0);
        else if (leader)
          s = world.recv(a.data.data() + at, bytes, DType::U8, holder);
        if (!s.ok())
          die("collecting the outputs on rank 0: " + s.error());
      }
  if (leader)
    for (int i = 0; i < info.num_outputs; ++i)
      reorderMicrobatches(outputs[i], library.batchDimOf(info.outputs[i]),
                          info.microbatches, /*toMicrobatches=*/false);
  bool allMatch = leader ? reportOutputs(opts, info, outputs) : true;

  if (opts.bench > 0) {
    std::vector<double> ms;
    for (int i = 0; i < opts.bench; ++i)
      ms.push_back(runOnce());
    int64_t batch = info.num_inputs && info.inputs[0].rank
                        ? library.batchShape(info.inputs[0])[0]
                        : 1;
    if (leader)
      printBench(ms,
                 device.describe() + " x " + std::to_string(world.size()) +
                     " ranks",
                 ", pipelined", batch);
  }

  // The timeline of the last run, gathered on rank 0.
  if (!opts.trace.empty() || !opts.traceSvg.empty()) {
    auto all = pccrun::gatherEvents(world, runner->trace());
    if (!all.ok())
      die(all.error());
    if (leader) {
      std::vector<pccrun::RankTrace> rows =
          pccrun::timelineRows(library, all.take());
      std::string model = info.source;
      model = model.substr(model.find_last_of('/') + 1);
      int chunks = library.chunksPerPipelineRank();
      pccrun::TraceInfo ti{model, info.schedule_policy, info.num_pipeline_ranks,
                           info.microbatches, chunks, &info};
      Status s = pccrun::reportTimeline(ti, rows, !device.isHost(), opts.trace,
                                        opts.traceSvg);
      if (!s.ok())
        die(s.error());
    }
  }
  return allMatch ? 0 : 1;
}

} // namespace

/// Prints the CPU (with its BLAS and threads) and every usable CUDA
/// device, or why there is none.
int listDevices() {
  std::printf("cpu (%s)\n", pcc_cpu_describe());
  auto count = Device::cudaDeviceCount();
  if (!count.ok()) {
    std::printf("cuda: not available: %s\n", count.error().c_str());
    return 0;
  }
  for (int i = 0; i < *count; ++i) {
    auto device = Device::open("cuda:" + std::to_string(i));
    if (device.ok())
      std::printf("%s\n", (*device)->describe().c_str());
    else
      std::printf("cuda:%d: not usable: %s\n", i, device.error().c_str());
  }
  return 0;
}

int main(int argc, char **argv) {
  Options opts = parse(argc, argv);
  if (opts.listDevices)
    return listDevices();

  auto library = ModelLibrary::open(opts.library);
  if (!library.ok())
    die(library.error());
  const pcc_model_info *info = &library->info();

  if (library->isTraining() && !opts.info) {
    if (!opts.inputs.empty())
      opts.train.inputs = opts.inputs;
    // A data-parallel library (pcc --train --dp=N) runs one rank per dp
    // position, started here under mpirun like a partitioned one.
    bool underMpi = Communicator::launchedByMpi();
    int64_t meshRanks = library->meshRanks();
    if (opts.ranks > 0 && opts.ranks != meshRanks)
      die("'" + opts.library + "' was compiled for " +
          library->describeMesh() + ", which takes " +
          std::to_string(meshRanks) + " rank(s), not -n " +
          std::to_string(opts.ranks));
    if (opts.ranks > 1 && !underMpi)
      launch(opts);
    if (meshRanks > 1 && !underMpi)
      die("'" + opts.library + "' was compiled for " +
          library->describeMesh() + "; run it with pcc-run -n " +
          std::to_string(meshRanks));
    std::unique_ptr<Device> device = openRankDevice(opts.device, underMpi);
    Ranks ranks;
    TrainRanks trainRanks;
    if (underMpi) {
      ranks = joinRanks(*info, meshRanks, *device, library->describeMesh(),
                      opts.collectiveTimeout);
      trainRanks.comms = ranks.tables.data();
      // The host-side sums (loss, label count) go over the dp group with
      // MPI whatever engine the library's collectives use; tensor-parallel
      // ranks of one dp position compute the same loss.
      for (int a = 0; a < info->num_mesh_axes; ++a)
        if (std::string(info->mesh_axes[a]) == "dp" && info->mesh_sizes[a] > 1)
          trainRanks.dataParallel = ranks.hostGroups[a]
                                        ? ranks.hostGroups[a].get()
                                        : ranks.groups[a].get();
      if (info->pipeline_axis >= 0) {
        trainRanks.pipeline = ranks.groups[info->pipeline_axis].get();
        trainRanks.pipelineRank =
            static_cast<int32_t>(ranks.coords[info->pipeline_axis]);
      }
      trainRanks.leader = ranks.world->rank() == 0;
      trainRanks.worldRank = ranks.world->rank();
      trainRanks.world = ranks.world.get();
    }
    opts.train.trace = opts.trace;
    opts.train.traceSvg = opts.traceSvg;
    if ((!opts.trace.empty() || !opts.traceSvg.empty()) &&
        !library->isPipelined())
      die("--trace and --trace-svg draw a pipeline's timeline; '" +
          opts.library + "' is not pipelined (pcc --pp)");
    return runTraining(opts.train, *library, *device, opts.library,
                       trainRanks);
  }
  if (opts.train.steps > 0 || !opts.train.labels.empty())
    die("'" + opts.library +
        "' is an inference library; compile the model with pcc --train to "
        "train it");
  if (opts.info) {
    std::printf("model %s (targets %s, compiled from %s)\n",
                opts.library.c_str(), info->target, info->source);
    for (int i = 0; i < info->num_inputs; ++i)
      std::printf(
          "  input  %s: %s %s\n", info->inputs[i].name,
          std::string(dtypeName(static_cast<DType>(info->inputs[i].dtype)))
              .c_str(),
          shapeString(library->batchShape(info->inputs[i])).c_str());
    for (int i = 0; i < info->num_outputs; ++i)
      std::printf(
          "  output %s: %s %s\n", info->outputs[i].name,
          std::string(dtypeName(static_cast<DType>(info->outputs[i].dtype)))
              .c_str(),
          shapeString(library->batchShape(info->outputs[i])).c_str());
    std::printf("  %d weights in %s, arena %lld bytes\n", info->num_weights,
                info->weights_file, static_cast<long long>(info->arena_bytes));
    if (library->meshRanks() > 1)
      std::printf("  mesh: %s (%lld ranks)\n",
                  library->describeMesh().c_str(),
                  static_cast<long long>(library->meshRanks()));
    else
      std::printf("  mesh: %s\n", library->describeMesh().c_str());
    if (library->isPipelined()) {
      std::printf(
          "  pipeline: %d stages on %d pipeline ranks, %d "
          "micro-batches of %lld rows (batch in dimension %d of the first "
          "input), %s schedule\n",
          info->num_stages, info->num_pipeline_ranks, info->microbatches,
          static_cast<long long>(
              info->num_inputs && info->inputs[0].rank
                  ? info->inputs[0].shape[library->batchDimOf(info->inputs[0])]
                  : 1),
          info->num_inputs ? library->batchDimOf(info->inputs[0]) : 0,
          info->schedule_policy);
      for (int k = 0; k < info->num_stages; ++k)
        std::printf("    stage %d (pipeline rank %d): %d inputs, %d outputs, "
                    "%d weights, arena %lld bytes\n",
                    k, k % info->num_pipeline_ranks, info->stages[k].num_inputs,
                    info->stages[k].num_outputs, info->stages[k].num_weights,
                    static_cast<long long>(info->stages[k].arena_bytes));
    }
    return 0;
  }

  // Ranks: start them, or join the job that started this one. The inputs
  // are checked first, so a wrong file fails before any rank starts.
  bool underMpi = Communicator::launchedByMpi();
  int64_t meshRanks = library->meshRanks();
  if (opts.ranks > 0 && opts.ranks != meshRanks)
    die("'" + opts.library + "' was partitioned for " +
        library->describeMesh() + ", which takes " + std::to_string(meshRanks) +
        " rank(s), not -n " + std::to_string(opts.ranks));
  std::vector<NpyArray> inputs = readInputs(opts, *library);
  if (opts.ranks > 1 && !underMpi)
    launch(opts);
  if (meshRanks > 1 && !underMpi)
    die("'" + opts.library + "' was partitioned for " +
        library->describeMesh() + "; run it with pcc-run -n " +
        std::to_string(meshRanks));
  bool multiRank = underMpi;
  if (opts.cudaGraph && library->isPipelined())
    die("--cuda-graph records one device's run; '" + opts.library +
        "' is pipelined over several ranks (pcc --pp), which it cannot "
        "capture");
  if ((!opts.trace.empty() || !opts.traceSvg.empty()) &&
      !library->isPipelined())
    die("--trace and --trace-svg draw a pipeline's timeline; '" + opts.library +
        "' is not pipelined (pcc --pp)");

  // The device: weights, inputs, outputs and the arena live in its memory.
  std::unique_ptr<Device> device = openRankDevice(opts.device, multiRank);
  Ranks ranks;
  if (multiRank)
    ranks = joinRanks(*info, meshRanks, *device, library->describeMesh(),
                      opts.collectiveTimeout);
  bool leader = !multiRank || ranks.world->rank() == 0;
  if (library->isPipelined())
    return runPipelined(opts, *library, *device, ranks, inputs);

  // Weights: map the file and bind each weight by name, checking its type.
  std::string weightsPath =
      opts.weights.empty() ? library->defaultWeightsPath() : opts.weights;
  auto weightsFile = SafetensorsFile::open(weightsPath);
  if (!weightsFile.ok())
    die(weightsFile.error());
  auto weights = library->bindWeights(*weightsFile, weightsPath, ranks.coords);
  if (!weights.ok())
    die(weights.error());

  std::vector<const void *> inputPtrs;
  for (const NpyArray &a : inputs)
    inputPtrs.push_back(a.data.data());
  std::vector<NpyArray> outputs = makeOutputs(*library);
  std::vector<void *> outputPtrs;
  for (NpyArray &a : outputs)
    outputPtrs.push_back(a.data.data());

  auto runner = ModelRunner::create(*library, *device, *weights);
  if (!runner.ok())
    die(runner.error());
  if (multiRank)
    runner->setCommunicators(ranks.tables.data());
  if (multiRank && leader)
    std::printf("ranks: %d (%s), %s\n", ranks.world->size(),
                library->describeMesh().c_str(),
                ranks.groups.empty() ? "mpi" : ranks.groups.back()->engine());
  if (!device->isHost() && leader)
    std::printf("device %s\n", device->describe().c_str());
  Status first = runner->run(inputPtrs, outputPtrs);
  if (!first.ok())
    die(first.error());
  if (opts.cudaGraph) {
    // Record one run, replay it, and check it computes the same bytes.
    Status captured = runner->captureGraph();
    if (!captured.ok())
      die("--cuda-graph: " + captured.error());
    Status replayed = runner->replayGraph();
    if (!replayed.ok())
      die(replayed.error());
    std::vector<std::vector<uint8_t>> again;
    std::vector<void *> againPtrs;
    for (const NpyArray &a : outputs)
      again.emplace_back(a.data.size());
    for (auto &buffer : again)
      againPtrs.push_back(buffer.data());
    Status read = runner->readOutputs(againPtrs);
    if (!read.ok())
      die(read.error());
    for (int i = 0; i < info->num_outputs; ++i)
      if (again[i] != outputs[i].data)
        die("--cuda-graph: the replayed graph computed a different '" +
            std::string(info->outputs[i].name) + "' than the direct run");
    std::printf("cuda graph: captured one run; its replay matches\n");
  }

  // Outputs: rank 0 writes, prints and compares; every rank runs the
  // benchmark, since each run is collective.
  bool allMatch = leader ? reportOutputs(opts, *info, outputs) : true;
  if (opts.bench > 0) {
    std::vector<double> ms;
    for (int i = 0; i < opts.bench; ++i) {
      auto start = std::chrono::steady_clock::now();
      Status again =
          opts.cudaGraph ? runner->replayGraph() : runner->runResident();
      if (!again.ok())
        die(again.error());
      ms.push_back(std::chrono::duration<double, std::milli>(
                       std::chrono::steady_clock::now() - start)
                       .count());
    }
    int64_t batch =
        info->num_inputs && info->inputs[0].rank ? info->inputs[0].shape[0] : 1;
    if (leader)
      printBench(ms,
                 device->describe() +
                     (multiRank ? " x " + std::to_string(ranks.world->size()) +
                                      " ranks"
                                : ""),
                 opts.cudaGraph ? ", cuda graph" : "", batch);
  }
  return allMatch ? 0 : 1;
}
