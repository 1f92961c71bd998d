//===- pcc-run.cpp - run a model library built by pcc ---------------------===//
//
//   pcc-run model.so --input x.npy [--input ...] [--output y.npy ...]
//           [--expect ref.npy ...] [--rtol R --atol A] [--bench N]
//           [--weights file.safetensors] [--device cpu|cuda|cuda:N]
//           [-n RANKS [--hostfile FILE]]
//
// Plain C++ on the runtime library: no MLIR. Every failure is one message
// naming the file, tensor or node at fault, and exit status 1.
//
//===----------------------------------------------------------------------===//

#include "pcc/runtime/Communicator.h"
#include "pcc/runtime/DType.h"
#include "pcc/runtime/Device.h"
#include "pcc/runtime/HalfFloat.h"
#include "pcc/runtime/ModelLibrary.h"
#include "pcc/runtime/Npy.h"
#include "pcc/runtime/Safetensors.h"

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
)";

/// "rank R of N: " once this process is one rank of several.
std::string rankPrefix;

[[noreturn]] void die(const std::string &message) {
  std::fprintf(stderr, "pcc-run: %serror: %s\n", rankPrefix.c_str(),
               message.c_str());
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
    } else if (a == "--info") {
      o.info = true;
    } else if (a == "--list-devices") {
      o.listDevices = true;
    } else if (a == "--cuda-graph") {
      o.cudaGraph = true;
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

/// The communicators of one rank: the world, and a group per mesh axis
/// bound to the model ABI.
struct Ranks {
  std::unique_ptr<Communicator> world;
  std::vector<std::unique_ptr<Communicator>> groups;
  std::vector<std::unique_ptr<CommBinding>> bindings;
  std::vector<pcc_comm> tables;
  std::vector<int64_t> coords;
};

/// Joins the MPI job and builds one group per mesh axis: the ranks that
/// differ only in their coordinate on that axis (the last axis varies
/// fastest).
Ranks joinRanks(const pcc_model_info &info, int64_t meshRanks, Device &device,
                const std::string &mesh) {
  Ranks r;
  auto world = Communicator::mpiWorld();
  if (!world.ok())
    die(world.error());
  r.world = world.take();
  int rank = r.world->rank(), size = r.world->size();
  rankPrefix =
      "rank " + std::to_string(rank) + " of " + std::to_string(size) + ": ";
  if (size != meshRanks)
    die("the library was partitioned for " + mesh + " (" +
        std::to_string(meshRanks) + " ranks) but this run has " +
        std::to_string(size) + "; run it with -n " + std::to_string(meshRanks));
  int64_t stride = 1;
  std::vector<int64_t> strides(info.num_mesh_axes);
  for (int a = info.num_mesh_axes - 1; a >= 0; --a) {
    strides[a] = stride;
    stride *= info.mesh_sizes[a];
  }
  for (int a = 0; a < info.num_mesh_axes; ++a) {
    int64_t coord = (rank / strides[a]) % info.mesh_sizes[a];
    r.coords.push_back(coord);
    auto group = r.world->split(static_cast<int>(rank - coord * strides[a]),
                                static_cast<int>(coord));
    if (!group.ok())
      die(group.error());
    std::unique_ptr<Communicator> g = group.take();
    g->setName(info.mesh_axes[a]);
    if (!device.isHost() && info.mesh_sizes[a] > 1) {
      auto nccl = Communicator::nccl(*g, device);
      if (!nccl.ok())
        die(nccl.error());
      g = nccl.take();
      g->setName(info.mesh_axes[a]);
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

} // namespace

/// Prints "cpu" and every usable CUDA device, or why there is none.
int listDevices() {
  std::printf("cpu\n");
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

  if (opts.info) {
    std::printf("model %s (targets %s, compiled from %s)\n",
                opts.library.c_str(), info->target, info->source);
    for (int i = 0; i < info->num_inputs; ++i)
      std::printf("  input  %s: %s\n", info->inputs[i].name,
                  describeSpec(info->inputs[i]).c_str());
    for (int i = 0; i < info->num_outputs; ++i)
      std::printf("  output %s: %s\n", info->outputs[i].name,
                  describeSpec(info->outputs[i]).c_str());
    std::printf("  %d weights in %s, arena %lld bytes\n", info->num_weights,
                info->weights_file, static_cast<long long>(info->arena_bytes));
    return 0;
  }

  // Ranks: start them, or join the job that started this one.
  bool underMpi = Communicator::launchedByMpi();
  int64_t meshRanks = library->meshRanks();
  if (opts.ranks > 0 && opts.ranks != meshRanks)
    die("'" + opts.library + "' was partitioned for " +
        library->describeMesh() + ", which takes " + std::to_string(meshRanks) +
        " rank(s), not -n " + std::to_string(opts.ranks));
  if (opts.ranks > 1 && !underMpi)
    launch(opts);
  if (meshRanks > 1 && !underMpi)
    die("'" + opts.library + "' was partitioned for " +
        library->describeMesh() + "; run it with pcc-run -n " +
        std::to_string(meshRanks));
  bool multiRank = underMpi;

  // The device: weights, inputs, outputs and the arena live in its memory.
  // Ranks on one host share its GPUs round-robin.
  std::string deviceName = opts.device;
  if (multiRank && deviceName == "cuda")
    if (const char *local = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK")) {
      auto count = Device::cudaDeviceCount();
      if (count.ok() && *count > 0)
        deviceName = "cuda:" + std::to_string(std::atoi(local) % *count);
    }
  auto device = Device::open(deviceName);
  if (!device.ok())
    die(device.error());
  Ranks ranks;
  if (multiRank)
    ranks = joinRanks(*info, meshRanks, **device, library->describeMesh());
  bool leader = !multiRank || ranks.world->rank() == 0;

  // Weights: map the file and bind each weight by name, checking its type.
  std::string weightsPath =
      opts.weights.empty() ? library->defaultWeightsPath() : opts.weights;
  auto weightsFile = SafetensorsFile::open(weightsPath);
  if (!weightsFile.ok())
    die(weightsFile.error());
  auto weights = library->bindWeights(*weightsFile, weightsPath, ranks.coords);
  if (!weights.ok())
    die(weights.error());

  // Inputs, checked against the model's signature.
  if (static_cast<int>(opts.inputs.size()) != info->num_inputs) {
    std::string names;
    for (int i = 0; i < info->num_inputs; ++i)
      names += std::string(i ? ", " : "") + info->inputs[i].name + " (" +
               describeSpec(info->inputs[i]) + ")";
    die("the model takes " + std::to_string(info->num_inputs) + " input(s): " +
        names + "; got " + std::to_string(opts.inputs.size()) + " --input");
  }
  std::vector<NpyArray> inputs;
  std::vector<const void *> inputPtrs;
  for (int i = 0; i < info->num_inputs; ++i) {
    auto array = readNpy(opts.inputs[i]);
    if (!array.ok())
      die(array.error());
    const pcc_tensor_spec &spec = info->inputs[i];
    if (array->dtype != static_cast<DType>(spec.dtype) ||
        array->shape != specShape(spec))
      die("input '" + std::string(spec.name) + "' must be " +
          describeSpec(spec) + ", but '" + opts.inputs[i] + "' holds " +
          std::string(dtypeName(array->dtype)) + " " +
          shapeString(array->shape));
    inputs.push_back(array.take());
  }
  for (const NpyArray &a : inputs)
    inputPtrs.push_back(a.data.data());

  std::vector<NpyArray> outputs;
  std::vector<void *> outputPtrs;
  for (int i = 0; i < info->num_outputs; ++i) {
    const pcc_tensor_spec &spec = info->outputs[i];
    NpyArray a;
    a.dtype = static_cast<DType>(spec.dtype);
    a.shape = specShape(spec);
    a.data.resize(elementCount(a.shape) * dtypeSize(a.dtype));
    outputs.push_back(std::move(a));
  }
  for (NpyArray &a : outputs)
    outputPtrs.push_back(a.data.data());

  auto runner = ModelRunner::create(*library, **device, *weights);
  if (!runner.ok())
    die(runner.error());
  if (multiRank)
    runner->setCommunicators(ranks.tables.data());
  if (multiRank && leader)
    std::printf("ranks: %d (%s), %s\n", ranks.world->size(),
                library->describeMesh().c_str(),
                ranks.groups.empty() ? "mpi" : ranks.groups.back()->engine());
  if (!(*device)->isHost() && leader)
    std::printf("device %s\n", (*device)->describe().c_str());
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
  if (!leader)
    opts.outputs.clear(), opts.expects.clear();
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
    if (!leader)
      continue;
    std::printf("output %s: %s %s [", info->outputs[i].name,
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
          shapeString(ref->shape) + ", output '" + info->outputs[i].name +
          "' has " + shapeString(a.shape));
    double maxAbs = 0, maxRel = 0;
    int64_t bad = 0;
    for (int64_t j = 0; j < count; ++j) {
      double x = valueAt(a.data.data(), a.dtype, j);
      double r = valueAt(ref->data.data(), ref->dtype, j);
      double diff = std::fabs(x - r);
      bool nanMatch = std::isnan(x) && std::isnan(r);
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
    std::sort(ms.begin(), ms.end());
    auto pct = [&](double p) {
      return ms[std::min<size_t>(ms.size() - 1, size_t(p * ms.size()))];
    };
    double mean = 0;
    for (double m : ms)
      mean += m;
    mean /= ms.size();
    int64_t batch =
        info->num_inputs && info->inputs[0].rank ? info->inputs[0].shape[0] : 1;
    if (!leader)
      return allMatch ? 0 : 1;
    std::printf(
        "bench (%s%s, inputs resident): %d runs, latency ms p50 %.3f p90 "
        "%.3f p99 %.3f mean "
        "%.3f; %.1f runs/s, %.1f samples/s (batch %lld)\n",
        ((*device)->describe() +
         (multiRank ? " x " + std::to_string(ranks.world->size()) + " ranks"
                    : ""))
            .c_str(),
        opts.cudaGraph ? ", cuda graph" : "", opts.bench, pct(0.5), pct(0.9),
        pct(0.99), mean, 1000.0 / mean, 1000.0 * batch / mean,
        static_cast<long long>(batch));
  }
  return allMatch ? 0 : 1;
}
