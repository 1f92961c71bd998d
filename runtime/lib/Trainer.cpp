//===- Trainer.cpp - running the phases of a training library -------------===//

#include "pcc/runtime/Trainer.h"

#include "pcc/runtime/Checkpoint.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>

namespace pccrt {

std::array<double, PCC_NUM_HYPER> Hyperparameters::table(int64_t step,
                                                         double rate) const {
  std::array<double, PCC_NUM_HYPER> t{};
  t[PCC_HYPER_LR] = rate;
  t[PCC_HYPER_BETA1] = beta1;
  t[PCC_HYPER_BETA2] = beta2;
  t[PCC_HYPER_EPS] = eps;
  t[PCC_HYPER_WEIGHT_DECAY] = weightDecay;
  t[PCC_HYPER_MOMENTUM] = momentum;
  t[PCC_HYPER_DAMPENING] = dampening;
  t[PCC_HYPER_NESTEROV] = nesterov ? 1 : 0;
  t[PCC_HYPER_MAX_GRAD_NORM] = maxGradNorm;
  t[PCC_HYPER_STEP] = static_cast<double>(step);
  t[PCC_HYPER_SEED] = static_cast<double>(seed);
  t[PCC_HYPER_MICROBATCH] = 0;
  t[PCC_HYPER_LAST_MICROBATCH] = 1;
  t[PCC_HYPER_GRAD_SCALE] = lossScale > 0 ? 1.0 / lossScale : 1.0;
  t[PCC_HYPER_SKIP_NONFINITE] = lossScale > 0 ? 1 : 0;
  t[PCC_HYPER_REFRESH_COPIES] = 1; // Trainer::step knows better
  return t;
}


Result<Trainer> Trainer::create(const ModelLibrary &library, Device &device) {
  return create(library, device, -1, nullptr);
}

Result<Trainer> Trainer::create(const ModelLibrary &library, Device &device,
                                int32_t pipelineRank, Communicator *pipe) {
  const pcc_model_info &info = library.info();
  if (!library.isTraining())
    return Error{"this is an inference library; compile the model with pcc "
                 "--train to train it"};
  Status target = checkTarget(library, device);
  if (!target.ok())
    return Error{target.error()};
  Trainer t;
  t.library = &library;
  t.device = &device;
  t.offloaded = info.num_phases == 6;
  // A pipeline rank holds the state its stage's phases read.
  std::vector<bool> needed(static_cast<size_t>(info.num_weights), true);
  if (library.isPipelined()) {
    if (pipelineRank < 0 || !pipe)
      return Error{"a pipelined training library runs on its pipeline ranks "
                   "(pcc-run -n " + std::to_string(library.meshRanks()) + ")"};
    int32_t P = info.num_pipeline_ranks;
    if (pipelineRank >= P)
      return Error{"pipeline rank " + std::to_string(pipelineRank) +
                   " of " + std::to_string(P)};
    t.pipeRank = pipelineRank;
    t.pipe = pipe;
    std::fill(needed.begin(), needed.end(), false);
    // Phases 0 .. 3 S - 1 are stage k = phase / 3's, run by rank k % P;
    // the rest pipeline rank (phase - 3 S) / 2's.
    t.firstHolder.assign(static_cast<size_t>(info.num_weights), -1);
    for (int k = info.num_phases - 1; k >= 0; --k) {
      const pcc_phase_info &phase = info.phases[k];
      int32_t rank = k < 3 * info.num_stages ? phase.stage % P : phase.stage;
      for (int s = 0; s < phase.num_state; ++s) {
        int32_t &first = t.firstHolder[phase.state[s]];
        first = first < 0 ? rank : std::min(first, rank);
        if (rank == pipelineRank)
          needed[phase.state[s]] = true;
      }
    }
  }
  if (t.offloaded) {
    if (device.isHost()) {
      t.host = &device;
    } else {
      auto cpu = Device::open("cpu");
      if (!cpu.ok())
        return Error{"the offloaded optimizer's host: " + cpu.error()};
      t.ownHost = cpu.take();
      t.host = t.ownHost.get();
    }
  }
  for (int i = 0; i < info.num_weights; ++i) {
    int32_t offload = info.weight_offload[i];
    int64_t bytes = specBytes(info.weights[i]);
    t.hostPtrs.push_back(nullptr);
    t.hostState.emplace_back();
    if (offload != 0) {
      auto buffer = DeviceBuffer::zeros(*t.host, bytes);
      if (!buffer.ok())
        return Error{"model state '" + std::string(info.weights[i].name) +
                     "' in host memory: " + buffer.error()};
      t.hostPtrs.back() = buffer->data();
      t.hostState.back() = buffer.take();
      t.hostTotal += bytes;
    }
    // A gradient inside a bucket is a view of it (set below); offloaded
    // optimizer state lives in host memory alone; another pipeline
    // stage's state is not here.
    if ((info.weight_aliases && info.weight_aliases[i].state >= 0) ||
        (offload & PCC_OFFLOAD_HOST_ONLY) || !needed[i]) {
      t.statePtrs.push_back(nullptr);
      t.state.emplace_back();
      continue;
    }
    auto buffer = DeviceBuffer::zeros(device, bytes);
    if (!buffer.ok())
      return Error{"model state '" + std::string(info.weights[i].name) +
                   "': " + buffer.error()};
    t.statePtrs.push_back(buffer->data());
    t.state.push_back(buffer.take());
    t.stateTotal += bytes;
  }
  for (int i = 0; info.weight_aliases && i < info.num_weights; ++i) {
    const pcc_weight_alias &alias = info.weight_aliases[i];
    if (alias.state < 0)
      continue;
    const pcc_tensor_spec &bucket = info.weights[alias.state];
    int64_t element = dtypeSize(static_cast<DType>(bucket.dtype));
    if (alias.state >= info.num_weights || !t.statePtrs[alias.state] ||
        (alias.offset * element + specBytes(info.weights[i])) >
            specBytes(bucket))
      return Error{"state '" + std::string(info.weights[i].name) +
                   "' does not fit in its bucket"};
    t.statePtrs[i] =
        static_cast<char *>(t.statePtrs[alias.state]) + alias.offset * element;
  }
  if (t.pipeRank >= 0) {
    Status made = t.createPipeline();
    if (!made.ok())
      return Error{made.error()};
    return t;
  }
  const pcc_phase_info &fwd = info.phases[PCC_PHASE_FORWARD];
  for (int i = 0; i < fwd.num_inputs; ++i) {
    auto buffer = DeviceBuffer::zeros(device, specBytes(fwd.inputs[i]));
    if (!buffer.ok())
      return Error{buffer.error()};
    t.forwardIn.push_back(buffer.take());
  }
  // Output 0, the loss sum, goes to a per-micro-batch slot (step()).
  t.forwardOut.emplace_back();
  for (int i = 1; i < fwd.num_outputs; ++i) {
    int64_t bytes = specBytes(fwd.outputs[i]);
    auto buffer = DeviceBuffer::zeros(device, bytes);
    if (!buffer.ok())
      return Error{"saved activations: " + buffer.error()};
    t.forwardOut.push_back(buffer.take());
    t.savedTotal += bytes;
  }
  for (int k = 0; k < info.num_phases; ++k)
    if (!t.offloaded || k != PCC_PHASE_OPTIMIZER)
      t.arenaTotal = std::max(t.arenaTotal, info.phases[k].arena_bytes);
  if (t.offloaded) {
    const pcc_phase_info &pre = info.phases[PCC_PHASE_OPTIMIZER_PRE];
    const pcc_phase_info &update = info.phases[PCC_PHASE_OPTIMIZER];
    for (int k = 0; k < pre.num_outputs; ++k) {
      auto buffer = DeviceBuffer::zeros(device, specBytes(pre.outputs[k]));
      if (!buffer.ok())
        return Error{buffer.error()};
      t.preOut.push_back(buffer.take());
    }
    for (int k = 0; k < update.num_inputs; ++k) {
      auto buffer = DeviceBuffer::zeros(*t.host, specBytes(update.inputs[k]));
      if (!buffer.ok())
        return Error{buffer.error()};
      t.hostIn.push_back(buffer.take());
    }
    auto arena = DeviceBuffer::zeros(*t.host, update.arena_bytes);
    auto norm = DeviceBuffer::zeros(*t.host, 4);
    if (!arena.ok() || !norm.ok())
      return Error{"cannot allocate the host optimizer's arena of " +
                   std::to_string(update.arena_bytes) + " bytes"};
    t.hostArena = arena.take();
    t.hostNorm = norm.take();
  }
  auto seed = DeviceBuffer::zeros(device, 4), norm = DeviceBuffer::zeros(device, 4),
       arena = DeviceBuffer::zeros(device, t.arenaTotal);
  if (!seed.ok() || !norm.ok() || !arena.ok())
    return Error{"cannot allocate the training arena of " +
                 std::to_string(t.arenaTotal) + " bytes"};
  t.seed = seed.take();
  t.norm = norm.take();
  t.arena = arena.take();
  return t;
}

int64_t Trainer::shardRank(int32_t axis) const {
  return axis >= 0 && comms ? comms[axis].rank : 0;
}

Status Trainer::load(CheckpointReader &reader, int32_t kind) {
  const pcc_model_info &info = library->info();
  for (int i = 0; i < info.num_weights; ++i) {
    // A ZeRO master piece is loaded from its weight.
    bool master = kind == PCC_STATE_WEIGHT &&
                  info.weight_kinds[i] == PCC_STATE_MASTER;
    if (info.weight_kinds[i] != kind && !master)
      continue;
    if (pipeRank >= 0 && !statePtrs[i])
      continue; // another pipeline rank's
    const pcc_tensor_spec &spec = info.weights[i];
    const pcc_tensor_spec &whole =
        info.whole_weights[master ? info.weight_owners[i] : i];
    const SavedTensor *saved = reader.find(whole.name);
    if (!saved)
      return Error{"'" + reader.source() + "' has no tensor '" + whole.name +
                   "' (was it written for another model?)"};
    if (saved->dtype != static_cast<DType>(whole.dtype) ||
        saved->shape != specShape(whole))
      return Error{"'" + reader.source() + "': tensor '" + whole.name +
                   "' is " + std::string(dtypeName(saved->dtype)) + " " +
                   shapeString(saved->shape) + " but the model needs " +
                   describeSpec(whole)};
    // The rank's piece: its tensor-parallel slice (or what its ZeRO shard
    // is a flat piece of), then its flat piece, zero-padded.
    const pcc_weight_shard &shard = info.weight_shards[i];
    PieceSpec piece;
    int32_t splitAxis = shard.dim >= 0 ? shard.axis : shard.within_axis;
    if (splitAxis >= 0) {
      piece.splitRanks = info.mesh_sizes[splitAxis];
      piece.splitRank = shardRank(splitAxis);
      piece.dim = shard.dim >= 0 ? shard.dim : shard.within_dim;
      piece.stripes = shard.dim >= 0 ? shard.stripes : shard.within_stripes;
    }
    int64_t bytes = specBytes(spec);
    if (shard.axis >= 0 && shard.dim < 0) {
      piece.flatRanks = info.mesh_sizes[shard.axis];
      piece.flatRank = shardRank(shard.axis);
      piece.flatBytes = bytes;
    }
    std::vector<uint8_t> data(static_cast<size_t>(bytes));
    Status read = reader.read(whole.name, piece, data.data());
    if (!read.ok())
      return read;
    Status copied = writeState(i, data.data(), bytes);
    if (!copied.ok())
      return copied;
  }
  return Status::success();
}

Result<std::vector<uint8_t>> Trainer::gather(int32_t axis, const void *piece,
                                             bool onDevice, int64_t count,
                                             int32_t dtype,
                                             const std::string &name) const {
  const pcc_comm &comm = comms[axis];
  int64_t bytes = count * dtypeSize(static_cast<DType>(dtype));
  std::vector<uint8_t> all(static_cast<size_t>(bytes * comm.size));
  // On the CPU straight into host memory; a GPU gathers on the device.
  DeviceBuffer from, gathered;
  if (!device->isHost()) {
    auto in = DeviceBuffer::allocate(*device, bytes);
    auto out = DeviceBuffer::allocate(*device, bytes * comm.size);
    if (!in.ok() || !out.ok())
      return Error{in.ok() ? out.error() : in.error()};
    from = in.take();
    gathered = out.take();
    if (!onDevice) {
      Status copied = device->copyToDevice(from.data(), piece, bytes);
      if (!copied.ok())
        return Error{copied.error()};
      piece = from.data();
    }
  }
  void *into = device->isHost() ? all.data() : gathered.data();
  if (comm.all_gather(comm.group, piece, into, count, dtype) != 0)
    return Error{"gathering '" + name +
                 "' for a checkpoint: " + comm.last_error(comm.group)};
  if (!device->isHost()) {
    Status read = device->copyToHost(all.data(), gathered.data(),
                                     static_cast<int64_t>(all.size()));
    if (!read.ok())
      return Error{read.error()};
  }
  return all;
}

Result<SafetensorsWriter> Trainer::save(int32_t kind,
                                        const std::string &what) const {
  const pcc_model_info &info = library->info();
  SafetensorsWriter writer;
  for (int i = 0; i < info.num_weights; ++i) {
    if (info.weight_kinds[i] != kind)
      continue;
    const pcc_tensor_spec &spec = info.weights[i];
    const pcc_tensor_spec &whole = info.whole_weights[i];
    const pcc_weight_shard &shard = info.weight_shards[i];
    std::vector<int64_t> shape = specShape(whole);
    int64_t element = dtypeSize(static_cast<DType>(whole.dtype));
    std::vector<uint8_t> bytes(static_cast<size_t>(specBytes(whole)));
    // A pipelined library: the ranks of the pipeline positions that hold
    // the state put it together first (their dp or tp pieces), then every
    // rank takes part in the gather over the pipeline.
    bool here = statePtrs[i] || hostPtrs[i];
    if (here && shard.axis < 0) {
      Status read = readState(i, bytes.data(),
                              static_cast<int64_t>(bytes.size()));
      if (!read.ok())
        return Error{read.error()};
    } else if (here) {
      // Every rank's piece, gathered (a collective: every rank saves).
      bool onDevice = statePtrs[i] != nullptr;
      auto all = gather(shard.axis, onDevice ? statePtrs[i] : hostPtrs[i],
                        onDevice,
                        elementCount(specShape(spec)), spec.dtype, spec.name);
      if (!all.ok())
        return Error{all.error()};
      int32_t splitAxis = shard.dim >= 0 ? shard.axis : shard.within_axis;
      if (shard.dim < 0) {
        // Flat pieces in rank order, padding dropped: the whole, or this
        // rank's tensor-parallel piece, gathered over that axis next.
        int64_t total = splitAxis >= 0
                            ? specBytes(whole) / info.mesh_sizes[splitAxis]
                            : specBytes(whole);
        all->resize(static_cast<size_t>(total));
        if (splitAxis >= 0) {
          all = gather(splitAxis, all->data(), /*onDevice=*/false,
                       total / element, spec.dtype, spec.name);
          if (!all.ok())
            return Error{all.error()};
        } else {
          bytes = std::move(*all);
        }
      }
      if (splitAxis >= 0) {
        int64_t dim = shard.dim >= 0 ? shard.dim : shard.within_dim;
        int64_t stripes =
            shard.dim >= 0 ? shard.stripes : shard.within_stripes;
        int64_t ranks = info.mesh_sizes[splitAxis];
        int64_t piece = specBytes(whole) / ranks;
        for (int64_t r = 0; r < ranks; ++r)
          copySplitPiece(shape, element, dim, stripes, ranks, r, bytes.data(),
                    all->data() + r * piece, /*toPiece=*/false);
      }
    }
    if (pipeRank >= 0) {
      Status read = gatherOverPipeline(i, bytes.data(),
                                       static_cast<int64_t>(bytes.size()));
      if (!read.ok())
        return Error{read.error()};
    }
    Status added = writer.add(whole.name, static_cast<DType>(whole.dtype),
                              shape, std::move(bytes));
    if (!added.ok())
      return Error{added.error()};
  }
  writer.setMetadata("pcc.content", what);
  return writer;
}

Result<SafetensorsWriter> Trainer::saveShard(int64_t *tensors) const {
  const pcc_model_info &info = library->info();
  SafetensorsWriter writer;
  nlohmann::json table = nlohmann::json::object();
  *tensors = 0;
  for (int i = 0; i < info.num_weights; ++i) {
    int32_t kind = info.weight_kinds[i];
    if (kind != PCC_STATE_WEIGHT && kind != PCC_STATE_OPTIMIZER)
      continue;
    const pcc_tensor_spec &spec = info.weights[i];
    const pcc_tensor_spec &whole = info.whole_weights[i];
    const pcc_weight_shard &shard = info.weight_shards[i];
    int32_t splitAxis = shard.dim >= 0 ? shard.axis : shard.within_axis;
    int32_t flatAxis = shard.dim < 0 ? shard.axis : -1;
    // A piece other ranks hold as well is written by the first of them
    // (a pipeline rank holds its stages' state; a tied weight's first
    // holder writes it).
    bool mine = pipeRank < 0 || (statePtrs[i] && firstHolder[i] == pipeRank);
    for (int a = 0; a < info.num_mesh_axes; ++a)
      if (a != splitAxis && a != flatAxis && a != info.pipeline_axis &&
          info.mesh_sizes[a] > 1 && shardRank(a) != 0)
        mine = false;
    if (!mine)
      continue;
    std::vector<uint8_t> bytes(static_cast<size_t>(specBytes(spec)));
    Status read =
        readState(i, bytes.data(), static_cast<int64_t>(bytes.size()));
    if (!read.ok())
      return Error{read.error()};
    Status added = writer.add(whole.name, static_cast<DType>(spec.dtype),
                              specShape(spec), std::move(bytes));
    if (!added.ok())
      return Error{added.error()};
    nlohmann::json piece = {
        {"kind", kind == PCC_STATE_WEIGHT ? "weight" : "optimizer"},
        {"shape", specShape(whole)}};
    if (splitAxis >= 0)
      piece["split"] = {
          {"ranks", info.mesh_sizes[splitAxis]},
          {"rank", shardRank(splitAxis)},
          {"dim", shard.dim >= 0 ? shard.dim : shard.within_dim},
          {"stripes", shard.dim >= 0 ? shard.stripes : shard.within_stripes}};
    if (flatAxis >= 0)
      piece["flat"] = {{"ranks", info.mesh_sizes[flatAxis]},
                       {"rank", shardRank(flatAxis)}};
    table[whole.name] = std::move(piece);
    ++*tensors;
  }
  writer.setMetadata(kPiecesKey, table.dump());
  writer.setMetadata("pcc.content", "shard");
  return writer;
}

Status Trainer::readState(int i, void *to, int64_t bytes) const {
  if (statePtrs[i])
    return device->copyToHost(to, statePtrs[i], bytes);
  std::memcpy(to, hostPtrs[i], static_cast<size_t>(bytes));
  return Status::success();
}

Status Trainer::writeState(int i, const void *from, int64_t bytes) {
  copiesStale = true;
  if (hostPtrs[i])
    std::memcpy(hostPtrs[i], from, static_cast<size_t>(bytes));
  if (!statePtrs[i])
    return Status::success();
  return device->copyToDevice(statePtrs[i], from, bytes);
}

Status Trainer::runPhase(int32_t phase, const std::vector<const void *> &in,
                         const std::vector<void *> &out, const double *hyper,
                         bool onHost) {
  const pcc_model_info &model = library->info();
  const pcc_phase_info &info = model.phases[phase];
  std::vector<void *> phaseState;
  for (int s = 0; s < info.num_state; ++s) {
    void *p = onHost ? hostPtrs[info.state[s]] : statePtrs[info.state[s]];
    if (!p)
      return Error{std::string("internal error: state '") +
                   model.weights[info.state[s]].name + "' is not in " +
                   (onHost ? "host" : "device") + " memory"};
    phaseState.push_back(p);
  }
  pcc_run_context context = (onHost ? host : device)->runContext();
  context.comms = comms;
  context.hyper = hyper;
  return library->runPhase(phase, context, in.data(), out.data(),
                           phaseState.data(),
                           onHost ? hostArena.data() : arena.data());
}

Status Trainer::offloadedStep(const double *hyper) {
  const pcc_model_info &info = library->info();
  std::vector<void *> preOutPtrs;
  for (DeviceBuffer &b : preOut)
    preOutPtrs.push_back(b.data());
  Status ran = runPhase(PCC_PHASE_OPTIMIZER_PRE, {}, preOutPtrs, hyper);
  if (!ran.ok())
    return ran;
  // The update's inputs and the state it reads that the device wrote.
  const pcc_phase_info &update = info.phases[PCC_PHASE_OPTIMIZER];
  std::vector<const void *> in;
  for (int k = 0; k < update.num_inputs; ++k) {
    int32_t source = update.input_sources[k];
    Status copied = device->copyToHost(hostIn[k].data(),
                                       preOut[source].data(),
                                       specBytes(update.inputs[k]));
    if (!copied.ok())
      return copied;
    in.push_back(hostIn[k].data());
  }
  for (int i = 0; i < info.num_weights; ++i)
    if (info.weight_offload[i] & PCC_OFFLOAD_TO_HOST) {
      Status copied = device->copyToHost(hostPtrs[i], statePtrs[i],
                                         specBytes(info.weights[i]));
      if (!copied.ok())
        return copied;
    }
  std::vector<void *> out{hostNorm.data()};
  ran = runPhase(PCC_PHASE_OPTIMIZER, in, out, hyper, /*onHost=*/true);
  if (!ran.ok())
    return ran;
  for (int i = 0; i < info.num_weights; ++i)
    if (info.weight_offload[i] & PCC_OFFLOAD_TO_DEVICE) {
      Status copied = device->copyToDevice(statePtrs[i], hostPtrs[i],
                                           specBytes(info.weights[i]));
      if (!copied.ok())
        return copied;
    }
  return runPhase(PCC_PHASE_OPTIMIZER_POST, {}, {}, hyper);
}

Result<StepResult>
Trainer::step(const std::vector<std::vector<const void *>> &microbatches,
              double lossGrad, const std::array<double, PCC_NUM_HYPER> &table) {
  // The 16-bit weight copies are cast again only when the weights changed
  // other than by the last step's optimizer, which writes them.
  std::array<double, PCC_NUM_HYPER> hyper = table;
  hyper[PCC_HYPER_REFRESH_COPIES] = copiesStale ? 1 : 0;
  Result<StepResult> result =
      pipeRank >= 0 ? pipelineStep(microbatches, lossGrad, hyper)
                    : unpipelinedStep(microbatches, lossGrad, hyper);
  if (result.ok())
    copiesStale = false;
  return result;
}

Result<StepResult> Trainer::unpipelinedStep(
    const std::vector<std::vector<const void *>> &microbatches, double lossGrad,
    const std::array<double, PCC_NUM_HYPER> &hyper) {
  const pcc_model_info &info = library->info();
  const pcc_phase_info &fwd = info.phases[PCC_PHASE_FORWARD];
  const pcc_phase_info &bwd = info.phases[PCC_PHASE_BACKWARD];
  Status begun = beginStep(PCC_PHASE_ZERO_GRAD, lossGrad, hyper.data());
  if (!begun.ok())
    return Error{begun.error()};
  std::vector<const void *> fwdIn;
  std::vector<void *> fwdOut;
  for (DeviceBuffer &b : forwardIn)
    fwdIn.push_back(b.data());
  for (DeviceBuffer &b : forwardOut)
    fwdOut.push_back(b.data());
  std::vector<const void *> bwdIn;
  for (int i = 0; i < bwd.num_inputs; ++i) {
    int32_t source = bwd.input_sources[i];
    bwdIn.push_back(source == PCC_SOURCE_LOSS_GRAD ? seed.data()
                                                   : forwardOut[source].data());
  }
  if (microbatches.size() > lossSlots) {
    auto slots = DeviceBuffer::zeros(*device, 4 * static_cast<int64_t>(microbatches.size()));
    if (!slots.ok())
      return Error{slots.error()};
    losses = slots.take();
    lossSlots = microbatches.size();
  }
  for (size_t j = 0; j < microbatches.size(); ++j) {
    const std::vector<const void *> &inputs = microbatches[j];
    if (static_cast<int>(inputs.size()) != fwd.num_inputs)
      return Error{"a micro-batch needs " + std::to_string(fwd.num_inputs) +
                   " inputs"};
    for (int i = 0; i < fwd.num_inputs; ++i) {
      Status copied = device->copyToDevice(forwardIn[i].data(), inputs[i],
                                           specBytes(fwd.inputs[i]));
      if (!copied.ok())
        return Error{copied.error()};
    }
    fwdOut[0] = static_cast<char *>(losses.data()) + 4 * j;
    // Both phases of a micro-batch see its index (dropout's masks).
    std::array<double, PCC_NUM_HYPER> mbHyper = hyper;
    mbHyper[PCC_HYPER_MICROBATCH] =
        static_cast<double>(static_cast<int64_t>(j) * dpSize + dpRank);
    // Gradient buckets start their all-reduce in the last one only.
    mbHyper[PCC_HYPER_LAST_MICROBATCH] = j + 1 == microbatches.size() ? 1 : 0;
    Status ran = runPhase(PCC_PHASE_FORWARD, fwdIn, fwdOut, mbHyper.data());
    if (!ran.ok())
      return Error{ran.error()};
    ran = runPhase(PCC_PHASE_BACKWARD, bwdIn, {}, mbHyper.data());
    if (!ran.ok())
      return Error{ran.error()};
  }
  std::vector<void *> optOut{norm.data()};
  Status ran = offloaded
                   ? offloadedStep(hyper.data())
                   : runPhase(PCC_PHASE_OPTIMIZER, {}, optOut, hyper.data());
  if (!ran.ok())
    return Error{ran.error()};
  return endStep(losses.data(), static_cast<int64_t>(microbatches.size()),
                 offloaded ? hostNorm.data() : norm.data(), offloaded);
}

Status Trainer::beginStep(int32_t zeroGrad, double lossGrad,
                          const double *hyper) {
  Status zeroed = runPhase(zeroGrad, {}, {}, hyper);
  if (!zeroed.ok())
    return zeroed;
  float seedValue = static_cast<float>(lossGrad);
  return device->copyToDevice(seed.data(), &seedValue, 4);
}

Result<StepResult> Trainer::endStep(const void *losses, int64_t count,
                                    const void *gradNorm,
                                    bool normOnHost) const {
  StepResult result;
  std::vector<float> loss(static_cast<size_t>(count));
  Status read = device->copyToHost(loss.data(), losses, 4 * count);
  if (!read.ok())
    return Error{read.error()};
  for (float l : loss)
    result.lossSum += l;
  float value = 0;
  if (normOnHost)
    std::memcpy(&value, gradNorm, 4);
  else
    read = device->copyToHost(&value, gradNorm, 4);
  if (!read.ok())
    return Error{read.error()};
  result.gradNorm = value;
  return result;
}

} // namespace pccrt
