//===- Run.cpp - what pcc-run does with a model library -------------------===//

#include "pcc/tooling/Run.h"

#include "pcc/runtime/Communicator.h"
#include "pcc/runtime/CpuKernels.h"
#include "pcc/runtime/Device.h"
#include "pcc/runtime/Npy.h"
#include "pcc/runtime/Pipeline.h"
#include "pcc/runtime/Safetensors.h"
#include "pcc/tooling/Job.h"
#include "pcc/tooling/Profile.h"
#include "pcc/tooling/Trace.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>

using namespace pccrt;
using namespace pccrun;

namespace {

/// Inference runs --profile times when --bench does not say.
constexpr int kProfileRuns = 10;

/// The runs after the first: --bench's, or kProfileRuns under --profile
/// alone, each profiled under --profile (`profiler`, started here).
/// `once` runs one and returns its latency in ms; the latencies.
std::vector<double> repeatRuns(const RunOptions &opts, Device &device,
                               std::unique_ptr<Profiler> &profiler,
                               const std::function<double()> &once) {
  if (opts.profile)
    profiler = startProfiling(device);
  int runs = opts.bench > 0 ? opts.bench : opts.profile ? kProfileRuns : 0;
  std::vector<double> ms;
  for (int i = 0; i < runs; ++i) {
    if (profiler)
      profiler->beginRun();
    ms.push_back(once());
    if (profiler)
      profiler->endRun();
  }
  return ms;
}

/// --profile's report (after the latencies), gathered over `world`.
void reportProfile(const RunOptions &opts, Profiler *profiler, Device &device,
                   Communicator *world) {
  if (!profiler)
    return;
  Status s =
      finishProfiling(*profiler, device, world, "runs", opts.profileTrace);
  if (!s.ok())
    die("--profile: " + s.error());
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
std::vector<NpyArray> readInputs(const RunOptions &opts,
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
bool reportOutputs(const RunOptions &opts, const pcc_model_info &info,
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
      std::printf("%s%.6g", j ? ", " : "",
                  elementAsDouble(a.data.data(), a.dtype, j));
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
      double x = elementAsDouble(a.data.data(), a.dtype, j);
      double r = elementAsDouble(ref->data.data(), ref->dtype, j);
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
int runPipelined(RunOptions &opts, const ModelLibrary &library, Device &device,
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

  std::unique_ptr<Profiler> profiler;
  std::vector<double> ms = repeatRuns(opts, device, profiler, runOnce);
  if (opts.bench > 0) {
    int64_t batch = info.num_inputs && info.inputs[0].rank
                        ? library.batchShape(info.inputs[0])[0]
                        : 1;
    if (leader)
      printBench(ms,
                 device.describe() + " x " + std::to_string(world.size()) +
                     " ranks",
                 ", pipelined", batch);
  }
  reportProfile(opts, profiler.get(), device, &world);

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
      pccrun::TraceInfo ti{model,
                           info.schedule_policy,
                           info.num_pipeline_ranks,
                           info.microbatches,
                           chunks,
                           &info};
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
int pccrun::listDevices() {
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

int pccrun::printInfo(const RunOptions &opts, const ModelLibrary &library) {
  const pcc_model_info *info = &library.info();
  std::printf("model %s (targets %s, compiled from %s)\n", opts.library.c_str(),
              info->target, info->source);
  for (int i = 0; i < info->num_inputs; ++i)
    std::printf(
        "  input  %s: %s %s\n", info->inputs[i].name,
        std::string(dtypeName(static_cast<DType>(info->inputs[i].dtype)))
            .c_str(),
        shapeString(library.batchShape(info->inputs[i])).c_str());
  for (int i = 0; i < info->num_outputs; ++i)
    std::printf(
        "  output %s: %s %s\n", info->outputs[i].name,
        std::string(dtypeName(static_cast<DType>(info->outputs[i].dtype)))
            .c_str(),
        shapeString(library.batchShape(info->outputs[i])).c_str());
  std::printf("  %d weights in %s, arena %lld bytes\n", info->num_weights,
              info->weights_file, static_cast<long long>(info->arena_bytes));
  if (library.meshRanks() > 1)
    std::printf("  mesh: %s (%lld ranks)\n", library.describeMesh().c_str(),
                static_cast<long long>(library.meshRanks()));
  else
    std::printf("  mesh: %s\n", library.describeMesh().c_str());
  if (library.isPipelined()) {
    std::printf(
        "  pipeline: %d stages on %d pipeline ranks, %d "
        "micro-batches of %lld rows (batch in dimension %d of the first "
        "input), %s schedule\n",
        info->num_stages, info->num_pipeline_ranks, info->microbatches,
        static_cast<long long>(
            info->num_inputs && info->inputs[0].rank
                ? info->inputs[0].shape[library.batchDimOf(info->inputs[0])]
                : 1),
        info->num_inputs ? library.batchDimOf(info->inputs[0]) : 0,
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

int pccrun::runTrainingJob(RunOptions &opts, const ModelLibrary &library) {
  const pcc_model_info *info = &library.info();
  if (!opts.inputs.empty())
    opts.train.inputs = opts.inputs;
  // A data-parallel library (pcc --train --dp=N) runs one rank per dp
  // position, started here under mpirun like a partitioned one.
  bool underMpi = Communicator::launchedByMpi();
  int64_t meshRanks = library.meshRanks();
  if (opts.ranks > 0 && opts.ranks != meshRanks)
    die("'" + opts.library + "' was compiled for " + library.describeMesh() +
        ", which takes " + std::to_string(meshRanks) + " rank(s), not -n " +
        std::to_string(opts.ranks));
  if (opts.ranks > 1 && !underMpi)
    launch(opts.ranks, opts.hostfile, opts.rankArgs);
  if (meshRanks > 1 && !underMpi)
    die("'" + opts.library + "' was compiled for " + library.describeMesh() +
        "; run it with pcc-run -n " + std::to_string(meshRanks));
  std::unique_ptr<Device> device = openRankDevice(opts.device, underMpi);
  Ranks ranks;
  TrainRanks trainRanks;
  if (underMpi) {
    ranks = joinRanks(*info, meshRanks, *device, library.describeMesh(),
                      opts.collectiveTimeout, opts.gpuCollectives);
    trainRanks.comms = ranks.tables.data();
    // The host-side sums (loss, label count) go over the dp group with
    // MPI whatever engine the library's collectives use; tensor-parallel
    // ranks of one dp position compute the same loss.
    for (int a = 0; a < info->num_mesh_axes; ++a)
      if (std::string(info->mesh_axes[a]) == PCC_MESH_AXIS_DP &&
          info->mesh_sizes[a] > 1)
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
    // The engine of the mesh's groups (an axis of one rank stays MPI's).
    for (auto &g : ranks.groups)
      if (g->size() > 1)
        trainRanks.engine = g->engine();
  }
  opts.train.trace = opts.trace;
  opts.train.traceSvg = opts.traceSvg;
  opts.train.weights = opts.weights;
  opts.train.profile = opts.profile;
  opts.train.profileTrace = opts.profileTrace;
  if ((!opts.trace.empty() || !opts.traceSvg.empty()) && !library.isPipelined())
    die("--trace and --trace-svg draw a pipeline's timeline; '" + opts.library +
        "' is not pipelined (pcc --pp)");
  return runTraining(opts.train, library, *device, opts.library, trainRanks);
}

int pccrun::runInference(RunOptions &opts, const ModelLibrary &library) {
  const pcc_model_info *info = &library.info();
  // Ranks: start them, or join the job that started this one. The inputs
  // are checked first, so a wrong file fails before any rank starts.
  bool underMpi = Communicator::launchedByMpi();
  int64_t meshRanks = library.meshRanks();
  if (opts.ranks > 0 && opts.ranks != meshRanks)
    die("'" + opts.library + "' was partitioned for " + library.describeMesh() +
        ", which takes " + std::to_string(meshRanks) + " rank(s), not -n " +
        std::to_string(opts.ranks));
  std::vector<NpyArray> inputs = readInputs(opts, library);
  if (opts.ranks > 1 && !underMpi)
    launch(opts.ranks, opts.hostfile, opts.rankArgs);
  if (meshRanks > 1 && !underMpi)
    die("'" + opts.library + "' was partitioned for " + library.describeMesh() +
        "; run it with pcc-run -n " + std::to_string(meshRanks));
  bool multiRank = underMpi;
  if (opts.cudaGraph && opts.profile)
    die("--profile times each op of a run; a --cuda-graph replay runs them "
        "as one graph: profile without --cuda-graph");
  if (opts.cudaGraph && library.isPipelined())
    die("--cuda-graph records one device's run; '" + opts.library +
        "' is pipelined over several ranks (pcc --pp), which it cannot "
        "capture");
  if ((!opts.trace.empty() || !opts.traceSvg.empty()) && !library.isPipelined())
    die("--trace and --trace-svg draw a pipeline's timeline; '" + opts.library +
        "' is not pipelined (pcc --pp)");

  // The device: weights, inputs, outputs and the arena live in its memory.
  std::unique_ptr<Device> device = openRankDevice(opts.device, multiRank);
  Ranks ranks;
  if (multiRank)
    ranks = joinRanks(*info, meshRanks, *device, library.describeMesh(),
                      opts.collectiveTimeout, opts.gpuCollectives);
  bool leader = !multiRank || ranks.world->rank() == 0;
  if (library.isPipelined())
    return runPipelined(opts, library, *device, ranks, inputs);

  // Weights: map the file and bind each weight by name, checking its type.
  std::string weightsPath =
      opts.weights.empty() ? library.defaultWeightsPath() : opts.weights;
  auto weightsFile = SafetensorsFile::open(weightsPath);
  if (!weightsFile.ok())
    die(weightsFile.error());
  auto weights = library.bindWeights(*weightsFile, weightsPath, ranks.coords);
  if (!weights.ok())
    die(weights.error());

  std::vector<const void *> inputPtrs;
  for (const NpyArray &a : inputs)
    inputPtrs.push_back(a.data.data());
  std::vector<NpyArray> outputs = makeOutputs(library);
  std::vector<void *> outputPtrs;
  for (NpyArray &a : outputs)
    outputPtrs.push_back(a.data.data());

  auto runner = ModelRunner::create(library, *device, *weights);
  if (!runner.ok())
    die(runner.error());
  if (multiRank)
    runner->setCommunicators(ranks.tables.data());
  if (multiRank && leader)
    std::printf("ranks: %d (%s), %s\n", ranks.world->size(),
                library.describeMesh().c_str(),
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
  std::unique_ptr<Profiler> profiler;
  std::vector<double> ms = repeatRuns(opts, *device, profiler, [&] {
    auto start = std::chrono::steady_clock::now();
    Status again =
        opts.cudaGraph ? runner->replayGraph() : runner->runResident();
    if (!again.ok())
      die(again.error());
    return std::chrono::duration<double, std::milli>(
               std::chrono::steady_clock::now() - start)
        .count();
  });
  if (opts.bench > 0) {
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
  reportProfile(opts, profiler.get(), *device,
                multiRank ? ranks.world.get() : nullptr);
  return allMatch ? 0 : 1;
}
