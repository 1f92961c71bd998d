//===- PipelineTrainer.cpp - a pipeline rank's training step -------------===//
//
// A pipelined training library (pcc --train --pp) has three phases per
// stage (forward F, input-gradient B, weight-gradient W), two per
// pipeline rank (optimizer, zero-grad) and one instruction list per
// pipeline rank (the schedule pcc chose: GPipe, 1F1B, interleaved 1F1B or
// ZB-H1). Pipeline rank r runs stages r, r + P, ... (one per chunk). It
// runs its zero-grad, then its list: F, B and W of micro-batches, the
// activations' sends and receives to the next stage and their gradients'
// to the previous one; then its optimizer, whose collectives over pp sum
// the gradients of tied weights and the global norm.
//
// What a micro-batch keeps between its F and its W (received inputs,
// forward outputs and saved activations, the cotangents received) lives
// in a stash slot; each chunk has as many slots as the list keeps
// micro-batches of it in flight at once (p - r for 1F1B), found by walking
// the list. The values B computes for W live from the B to the W in sets
// of their own: one under GPipe and 1F1B, which run W right after B. The
// cotangents B sends back have a buffer per micro-batch: an asynchronous send
// may still read it after the slot is reused.
//
// Messages between two ranks match in the order they are posted (no
// tags): a forward transfer carries every output of the sending stage in
// order, a backward transfer one cotangent per float output, in order.
// Sends are asynchronous and completed at the end of the step, so a rank
// computes while its activations travel.
//
//===----------------------------------------------------------------------===//

#include "pcc/Schedule/StashSlots.h"
#include "pcc/runtime/Trainer.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <tuple>

namespace pccrt {

namespace {

bool isFloat(int32_t dtype) {
  DType t = static_cast<DType>(dtype);
  return t == DType::F32 || t == DType::F64 || t == DType::F16 ||
         t == DType::BF16;
}

int64_t count(const pcc_tensor_spec &spec) {
  return elementCount(specShape(spec));
}

} // namespace

int32_t Trainer::stagePhase(int32_t kind, int32_t stage) const {
  int32_t offset = kind == PCC_PHASE_FORWARD    ? 0
                   : kind == PCC_PHASE_BACKWARD ? 1
                                                : 2;
  return 3 * stage + offset;
}

int32_t Trainer::rankPhase(int32_t kind) const {
  const pcc_model_info &info = library->info();
  return 3 * info.num_stages + 2 * pipeRank +
         (kind == PCC_PHASE_OPTIMIZER ? 0 : 1);
}

Status Trainer::createPipeline() {
  const pcc_model_info &info = library->info();
  int32_t P = info.num_pipeline_ranks;
  int32_t chunks = info.num_stages / P;
  int32_t m = std::max<int32_t>(info.microbatches, 1);
  for (int32_t c = 0; c < chunks; ++c)
    stages.push_back(pipeRank + c * P);

  // Stash slots and B-to-W sets: the walk the memory model predicts with
  // (pcc/Schedule/StashSlots.h).
  const pcc_pipeline_instr *list = info.schedules[pipeRank];
  std::vector<::pcc::schedule::SlotStep> steps;
  for (int32_t n = 0; n < info.schedule_lengths[pipeRank]; ++n) {
    const pcc_pipeline_instr &instr = list[n];
    if (instr.stage < 0 || instr.stage >= info.num_stages ||
        instr.stage % P != pipeRank || instr.microbatch < 0 ||
        instr.microbatch >= m)
      return Error{"the schedule of pipeline rank " + std::to_string(pipeRank) +
                   " names micro-batch " + std::to_string(instr.microbatch) +
                   " of stage " + std::to_string(instr.stage)};
    steps.push_back({instr.stage / P, instr.microbatch,
                     instr.op == PCC_PIPE_BACKWARD,
                     instr.op == PCC_PIPE_WEIGHT_GRAD});
  }
  ::pcc::schedule::StashSlots assigned =
      ::pcc::schedule::assignStashSlots(steps, chunks, m);
  if (!assigned.error.empty())
    return Error{"the schedule of pipeline rank " + std::to_string(pipeRank) +
                 " " + assigned.error};
  slotOf = std::move(assigned.slotOf);
  stashOf = std::move(assigned.stashOf);
  const std::vector<int32_t> &slotCount = assigned.slotCount;
  const std::vector<int32_t> &stashCount = assigned.stashCount;

  auto make = [&](std::vector<DeviceBuffer> &into,
                  const pcc_tensor_spec &spec) -> Status {
    auto buffer = DeviceBuffer::zeros(*device, specBytes(spec));
    if (!buffer.ok())
      return Error{std::string("pipeline buffer '") + spec.name +
                   "': " + buffer.error()};
    into.push_back(buffer.take());
    return Status::success();
  };
  slots.resize(static_cast<size_t>(chunks));
  sendGrad.resize(static_cast<size_t>(chunks));
  for (int32_t c = 0; c < chunks; ++c) {
    int32_t k = stages[static_cast<size_t>(c)];
    const pcc_phase_info &fwd = info.phases[stagePhase(PCC_PHASE_FORWARD, k)];
    const pcc_phase_info &bwd = info.phases[stagePhase(PCC_PHASE_BACKWARD, k)];
    const pcc_stage_info &me = info.stages[k];
    bool last = k + 1 == info.num_stages;
    slots[c].resize(static_cast<size_t>(slotCount[c]));
    for (Slot &slot : slots[c]) {
      for (int i = 0; i < fwd.num_inputs; ++i) {
        // Received inputs live in `recv`; the slot keeps an empty buffer.
        if (fwd.input_sources[i] >= 0) {
          slot.in.emplace_back();
          continue;
        }
        if (Status s = make(slot.in, fwd.inputs[i]); !s.ok())
          return s;
      }
      // A stage's outputs as its forward phase makes them, this rank's
      // piece (under --sp the boundary is split along the sequence; the
      // stage table has the whole tensor).
      if (k > 0) {
        const pcc_phase_info &prevFwd =
            info.phases[stagePhase(PCC_PHASE_FORWARD, k - 1)];
        for (int j = 0; j < info.stages[k - 1].num_outputs; ++j)
          if (Status s = make(slot.recv, prevFwd.outputs[j]); !s.ok())
            return s;
      }
      for (int j = 0; j < fwd.num_outputs; ++j) {
        if (Status s = make(slot.out, fwd.outputs[j]); !s.ok())
          return s;
        if (j >= me.num_outputs)
          savedTotal += specBytes(fwd.outputs[j]);
      }
      for (int j = 0; j < me.num_outputs && !last; ++j) {
        if (!isFloat(me.outputs[j].dtype)) {
          slot.gradOut.emplace_back();
          continue;
        }
        if (Status s = make(slot.gradOut, fwd.outputs[j]); !s.ok())
          return s;
      }
    }
    stashes.emplace_back(static_cast<size_t>(stashCount[c]));
    for (std::vector<DeviceBuffer> &set : stashes.back())
      for (int o = 0; o < bwd.num_outputs; ++o) {
        if (bwd.output_targets[o] >= 0) {
          set.emplace_back();
          continue;
        }
        if (Status s = make(set, bwd.outputs[o]); !s.ok())
          return s;
        savedTotal += specBytes(bwd.outputs[o]);
      }
    sendGrad[c].resize(static_cast<size_t>(m));
    for (std::vector<DeviceBuffer> &send : sendGrad[c])
      for (int o = 0; o < bwd.num_outputs; ++o) {
        if (bwd.output_targets[o] < 0) {
          send.emplace_back();
          continue;
        }
        if (Status s = make(send, bwd.outputs[o]); !s.ok())
          return s;
      }
    for (int32_t kind :
         {PCC_PHASE_FORWARD, PCC_PHASE_BACKWARD, PCC_PHASE_WEIGHT_GRAD})
      arenaTotal =
          std::max(arenaTotal, info.phases[stagePhase(kind, k)].arena_bytes);
  }
  for (int32_t kind : {PCC_PHASE_OPTIMIZER, PCC_PHASE_ZERO_GRAD})
    arenaTotal = std::max(arenaTotal, info.phases[rankPhase(kind)].arena_bytes);
  auto seedBuffer = DeviceBuffer::zeros(*device, 4),
       normBuffer = DeviceBuffer::zeros(*device, 4),
       arenaBuffer = DeviceBuffer::zeros(*device, arenaTotal);
  if (!seedBuffer.ok() || !normBuffer.ok() || !arenaBuffer.ok())
    return Error{"cannot allocate the training arena of " +
                 std::to_string(arenaTotal) + " bytes"};
  seed = seedBuffer.take();
  norm = normBuffer.take();
  arena = arenaBuffer.take();
  return Status::success();
}

int32_t Trainer::stashSlots(int32_t chunk) const {
  return chunk < static_cast<int32_t>(slots.size())
             ? static_cast<int32_t>(slots[static_cast<size_t>(chunk)].size())
             : 0;
}

Result<std::vector<int32_t>> Trainer::stashSlotsPerRank() const {
  const pcc_model_info &info = library->info();
  int32_t P = info.num_pipeline_ranks;
  std::vector<float> counts(static_cast<size_t>(P), 0.0f);
  for (const std::vector<Slot> &chunk : slots)
    counts[static_cast<size_t>(pipeRank)] += static_cast<float>(chunk.size());
  auto buffer = DeviceBuffer::zeros(*device, 4 * static_cast<int64_t>(P));
  if (!buffer.ok())
    return Error{buffer.error()};
  Status st = device->copyToDevice(buffer->data(), counts.data(), 4 * P);
  const pcc_comm &pp = comms[info.pipeline_axis];
  if (st.ok() && pp.all_reduce(pp.group, buffer->data(), buffer->data(), P,
                               static_cast<int32_t>(DType::F32)) != 0)
    st = Error{std::string("gathering the stash slots over the pipeline: ") +
               pp.last_error(pp.group)};
  if (st.ok())
    st = device->copyToHost(counts.data(), buffer->data(), 4 * P);
  if (!st.ok())
    return Error{st.error()};
  std::vector<int32_t> out;
  for (float c : counts)
    out.push_back(static_cast<int32_t>(c));
  return out;
}

Status Trainer::gatherOverPipeline(int i, void *whole, int64_t bytes) const {
  const pcc_model_info &info = library->info();
  const pcc_comm &comm = comms[info.pipeline_axis];
  const pcc_tensor_spec &spec = info.whole_weights[i];
  // The first holder's copy, summed with everyone else's zeros.
  auto buffer = DeviceBuffer::zeros(*device, bytes);
  if (!buffer.ok())
    return Error{buffer.error()};
  if (firstHolder[i] == pipeRank) {
    Status copied = device->copyToDevice(buffer->data(), whole, bytes);
    if (!copied.ok())
      return copied;
  }
  if (comm.all_reduce(comm.group, buffer->data(), buffer->data(), count(spec),
                      spec.dtype) != 0)
    return Error{
        std::string("gathering '") + spec.name +
        "' over the pipeline for a checkpoint: " + comm.last_error(comm.group)};
  return device->copyToHost(whole, buffer->data(), bytes);
}

struct Trainer::PipelineStepState {
  const std::vector<std::vector<const void *>> &microbatches;
  const std::array<double, PCC_NUM_HYPER> &hyper;
  /// Each micro-batch's loss (the last stage's rank).
  std::vector<float> &loss;
  /// The receives posted for a forward or backward (its op, stage and
  /// micro-batch): the number to wait through before it runs, and the peer.
  std::map<std::tuple<int32_t, int32_t, int32_t>, std::pair<int64_t, int32_t>>
      &posted;
};

Status Trainer::runInstruction(const pcc_pipeline_instr &instr,
                               PipelineStepState &step) {
  const pcc_model_info &info = library->info();
  int32_t m = std::max<int32_t>(info.microbatches, 1);
  const std::vector<std::vector<const void *>> &microbatches =
      step.microbatches;
  const std::array<double, PCC_NUM_HYPER> &hyper = step.hyper;
  std::vector<float> &loss = step.loss;
  auto &posted = step.posted;
  auto where = [&](const char *what, int32_t k, int32_t mb) {
    return "pipeline rank " + std::to_string(pipeRank) + ", " + what +
           " of stage " + std::to_string(k) + ", micro-batch " +
           std::to_string(mb) + ": ";
  };
  int32_t mb = instr.microbatch;
  int32_t k = instr.stage;
  auto c = static_cast<size_t>(k / info.num_pipeline_ranks);
  Slot &slot =
      slots[c][static_cast<size_t>(slotOf[c][static_cast<size_t>(mb)])];
  int32_t set = stashOf[c][static_cast<size_t>(mb)];
  auto stash = [&](int o) {
    return stashes[c][static_cast<size_t>(set)][static_cast<size_t>(o)].data();
  };
  std::vector<DeviceBuffer> &send = sendGrad[c][static_cast<size_t>(mb)];
  const pcc_phase_info &fwd = info.phases[stagePhase(PCC_PHASE_FORWARD, k)];
  const pcc_phase_info &bwd = info.phases[stagePhase(PCC_PHASE_BACKWARD, k)];
  const pcc_stage_info &me = info.stages[k];
  std::array<double, PCC_NUM_HYPER> mbHyper = hyper;
  mbHyper[PCC_HYPER_MICROBATCH] = static_cast<double>(mb);
  mbHyper[PCC_HYPER_LAST_MICROBATCH] = mb + 1 == m ? 1 : 0;
  // A backward or weight-gradient input.
  auto source = [&](int32_t s) -> const void * {
    if (s == PCC_SOURCE_LOSS_GRAD)
      return seed.data();
    if (s <= PCC_SOURCE_BACKWARD_OUTPUT_BASE) {
      int32_t o = PCC_SOURCE_BACKWARD_OUTPUT_BASE - s;
      return bwd.output_targets[o] >= 0 ? send[o].data() : stash(o);
    }
    if (s <= PCC_SOURCE_OUTPUT_GRAD_BASE)
      return slot.gradOut[PCC_SOURCE_OUTPUT_GRAD_BASE - s].data();
    return slot.out[s].data();
  };
  Status st = Status::success();
  const char *what = "transfer";
  switch (instr.op) {
  case PCC_PIPE_RECV_FORWARD: {
    const pcc_phase_info &prevFwd =
        info.phases[stagePhase(PCC_PHASE_FORWARD, k - 1)];
    for (int j = 0; j < info.stages[k - 1].num_outputs && st.ok(); ++j)
      st = pipe->postRecv(slot.recv[j].data(), count(prevFwd.outputs[j]),
                          static_cast<DType>(prevFwd.outputs[j].dtype),
                          instr.peer);
    posted[{PCC_PIPE_FORWARD, k, mb}] = {pipe->postedReceives(), instr.peer};
    break;
  }
  case PCC_PIPE_FORWARD: {
    what = "forward";
    std::vector<const void *> in;
    for (int i = 0; i < fwd.num_inputs && st.ok(); ++i) {
      int32_t s = fwd.input_sources[i];
      if (s >= 0) {
        in.push_back(slot.recv[s].data());
        continue;
      }
      st = device->copyToDevice(slot.in[i].data(), microbatches[mb][-1 - s],
                                specBytes(fwd.inputs[i]));
      in.push_back(slot.in[i].data());
    }
    std::vector<void *> out;
    for (DeviceBuffer &b : slot.out)
      out.push_back(b.data());
    if (st.ok())
      st = runPhase(stagePhase(PCC_PHASE_FORWARD, k), in, out, mbHyper.data());
    // The loss leaves the slot before the slot is reused.
    if (st.ok() && k + 1 == info.num_stages)
      st = device->copyToHost(&loss[mb], slot.out[0].data(), 4);
    break;
  }
  case PCC_PIPE_SEND_FORWARD:
    for (int j = 0; j < me.num_outputs && st.ok(); ++j)
      st = pipe->sendAsync(slot.out[j].data(), count(fwd.outputs[j]),
                           static_cast<DType>(fwd.outputs[j].dtype),
                           instr.peer);
    break;
  case PCC_PIPE_RECV_BACKWARD:
    for (int j = 0; j < me.num_outputs && st.ok(); ++j)
      if (isFloat(me.outputs[j].dtype))
        st =
            pipe->postRecv(slot.gradOut[j].data(), count(fwd.outputs[j]),
                           static_cast<DType>(fwd.outputs[j].dtype),
                           instr.peer);
    posted[{PCC_PIPE_BACKWARD, k, mb}] = {pipe->postedReceives(), instr.peer};
    break;
  case PCC_PIPE_BACKWARD: {
    what = "backward";
    std::vector<const void *> in;
    for (int i = 0; i < bwd.num_inputs; ++i)
      in.push_back(source(bwd.input_sources[i]));
    std::vector<void *> out;
    for (int o = 0; o < bwd.num_outputs; ++o)
      out.push_back(bwd.output_targets[o] >= 0 ? send[o].data() : stash(o));
    st = runPhase(stagePhase(PCC_PHASE_BACKWARD, k), in, out, mbHyper.data());
    break;
  }
  case PCC_PIPE_WEIGHT_GRAD: {
    what = "weight gradients";
    const pcc_phase_info &w = info.phases[stagePhase(PCC_PHASE_WEIGHT_GRAD, k)];
    std::vector<const void *> in;
    for (int i = 0; i < w.num_inputs; ++i)
      in.push_back(source(w.input_sources[i]));
    st = runPhase(stagePhase(PCC_PHASE_WEIGHT_GRAD, k), in, {}, mbHyper.data());
    break;
  }
  case PCC_PIPE_SEND_BACKWARD: {
    // One cotangent per float output of the previous stage, in order:
    // the backward's output for the input that output feeds.
    const pcc_stage_info &prev = info.stages[k - 1];
    for (int j = 0; j < prev.num_outputs && st.ok(); ++j) {
      if (!isFloat(prev.outputs[j].dtype))
        continue;
      int found = -1;
      for (int o = 0; o < bwd.num_outputs; ++o)
        if (bwd.output_targets[o] >= 0 &&
            fwd.input_sources[bwd.output_targets[o]] == j)
          found = o;
      if (found < 0)
        return Error{"no cotangent for output " + std::to_string(j) +
                     " of stage " + std::to_string(k - 1)};
      st = pipe->sendAsync(send[found].data(), count(bwd.outputs[found]),
                           static_cast<DType>(bwd.outputs[found].dtype),
                           instr.peer);
    }
    break;
  }
  default:
    return Error{"the schedule has an unknown instruction " +
                 std::to_string(instr.op)};
  }
  if (!st.ok())
    return Error{where(what, k, mb) + st.error()};
  return Status::success();
}

Result<StepResult> Trainer::pipelineStep(
    const std::vector<std::vector<const void *>> &microbatches, double lossGrad,
    const std::array<double, PCC_NUM_HYPER> &hyper) {
  const pcc_model_info &info = library->info();
  int32_t m = std::max<int32_t>(info.microbatches, 1);
  if (microbatches.size() != static_cast<size_t>(m))
    return Error{"a step of this library has " + std::to_string(m) +
                 " micro-batches, not " + std::to_string(microbatches.size())};
  StepResult result;
  bool tracingStep = tracing;
  tracing = false;
  events.clear();
  auto now = [&] {
    return std::chrono::duration<double>(
               std::chrono::steady_clock::now().time_since_epoch())
               .count() -
           traceOrigin;
  };
  // A phase around the pipeline (zero-grad, optimizer), timed until the
  // device is done with it when tracing.
  auto aroundPipeline = [&](int32_t kind, std::vector<void *> outputs,
                            TraceEvent::Kind traced) -> Status {
    double start = tracingStep ? now() : 0;
    Status st = runPhase(rankPhase(kind), {}, outputs, hyper.data());
    if (st.ok() && tracingStep && !device->isHost())
      st = device->synchronize();
    if (st.ok() && tracingStep)
      events.push_back({traced, -1, -1, -1, start, now()});
    return st;
  };
  Status ran =
      aroundPipeline(PCC_PHASE_ZERO_GRAD, {}, TraceEvent::Kind::ZeroGrad);
  if (!ran.ok())
    return Error{ran.error()};
  float seedValue = static_cast<float>(lossGrad);
  Status seeded = device->copyToDevice(seed.data(), &seedValue, 4);
  if (!seeded.ok())
    return Error{seeded.error()};
  std::vector<float> loss(static_cast<size_t>(m), 0.0f);

  // The receives posted for a forward or backward (its op, stage and
  // micro-batch): the number to wait through before it runs, and the peer.
  std::map<std::tuple<int32_t, int32_t, int32_t>, std::pair<int64_t, int32_t>>
      posted;
  PipelineStepState state{microbatches, hyper, loss, posted};
  auto execute = [&](const pcc_pipeline_instr &instr) {
    return runInstruction(instr, state);
  };
  // The transfers between two computes go as one group (NCCL), after the
  // compute before them (what the sends read, the slots the receives
  // fill), on a queue of their own (NCCL: a second stream). Receives are
  // posted (interleaved lists post some a compute early: the schedule
  // pass checked that the groups cannot deadlock), and each forward or
  // backward waits for its own before it runs.
  const pcc_pipeline_instr *list = info.schedules[pipeRank];
  int32_t length = info.schedule_lengths[pipeRank];
  auto isSend = [](int32_t op) {
    return op == PCC_PIPE_SEND_FORWARD || op == PCC_PIPE_SEND_BACKWARD;
  };
  auto isRecv = [](int32_t op) {
    return op == PCC_PIPE_RECV_FORWARD || op == PCC_PIPE_RECV_BACKWARD;
  };
  // Runs one instruction, and with tracing records when it ran (a compute
  // step until the device is done with it).
  auto run = [&](const pcc_pipeline_instr &instr) -> Status {
    auto received = posted.find({instr.op, instr.stage, instr.microbatch});
    if (received != posted.end()) {
      double waitStart = tracingStep ? now() : 0;
      // The wait's messages (the watchdog's too) name what it is for.
      bool forward = instr.op == PCC_PIPE_FORWARD;
      std::string label = std::string(forward ? "the input" : "the gradient") +
                          " of stage " + std::to_string(instr.stage) + "'s " +
                          (forward ? "forward" : "backward") +
                          ", micro-batch " + std::to_string(instr.microbatch);
      pipe->setLabel(label.c_str());
      Status st = pipe->waitReceivesThrough(received->second.first);
      pipe->setLabel(nullptr);
      if (!st.ok())
        return Error{"pipeline rank " + std::to_string(pipeRank) + ": " +
                     st.error()};
      if (tracingStep)
        events.push_back({TraceEvent::Kind::Recv, instr.stage, instr.microbatch,
                          received->second.second, waitStart, now()});
      posted.erase(received);
    }
    double start = tracingStep ? now() : 0;
    Status st = execute(instr);
    // A receive is traced when its compute waits for it.
    if (!tracingStep || !st.ok() || isRecv(instr.op))
      return st;
    bool compute = !isSend(instr.op) && !isRecv(instr.op);
    if (compute && !device->isHost())
      st = device->synchronize();
    TraceEvent e{compute            ? TraceEvent::Kind::Compute
                 : isSend(instr.op) ? TraceEvent::Kind::Send
                                    : TraceEvent::Kind::Recv,
                 instr.stage,
                 instr.microbatch,
                 compute ? -1 : instr.peer,
                 start,
                 now()};
    e.work = instr.op == PCC_PIPE_BACKWARD      ? 'B'
             : instr.op == PCC_PIPE_WEIGHT_GRAD ? 'W'
                                                : 'F';
    events.push_back(e);
    return st;
  };
  if (length > 0) {
    Status separate = pipe->separateTransfers();
    if (!separate.ok())
      return Error{separate.error()};
  }
  for (int32_t n = 0; n < length;) {
    if (!isSend(list[n].op) && !isRecv(list[n].op)) {
      Status st = run(list[n++]);
      if (!st.ok())
        return Error{st.error()};
      continue;
    }
    int32_t end = n;
    while (end < length && (isSend(list[end].op) || isRecv(list[end].op)))
      ++end;
    Status st = pipe->transfersAfterCompute();
    if (st.ok())
      st = pipe->beginGroup();
    if (!st.ok())
      return Error{st.error()};
    for (bool sends : {true, false})
      for (int32_t t = n; t < end && st.ok(); ++t)
        if (isSend(list[t].op) == sends)
          st = run(list[t]);
    // Ended on every path: an open NCCL group would swallow later calls.
    Status closed = pipe->endGroup();
    if (st.ok())
      st = closed;
    if (!st.ok())
      return Error{st.error()};
    n = end;
  }
  if (!posted.empty())
    return Error{"the schedule of pipeline rank " + std::to_string(pipeRank) +
                 " receives for micro-batch " +
                 std::to_string(std::get<2>(posted.begin()->first)) +
                 " of stage " +
                 std::to_string(std::get<1>(posted.begin()->first)) +
                 " but never computes it"};
  double waitStart = tracingStep ? now() : 0;
  // The step's sends are done (NCCL: the transfer stream, bounded, so a
  // stalled peer is reported), and the optimizer's collectives over pp run
  // on the compute stream again.
  Status sent = pipe->completeSends();
  if (sent.ok() && length > 0)
    sent = pipe->wait(/*timeoutMs=*/600000);
  if (sent.ok() && length > 0)
    sent = pipe->joinTransfers();
  if (!sent.ok())
    return Error{sent.error()};
  if (tracingStep)
    events.push_back(
        {TraceEvent::Kind::WaitSends, -1, -1, -1, waitStart, now()});

  ran = aroundPipeline(PCC_PHASE_OPTIMIZER, {norm.data()},
                       TraceEvent::Kind::Optimizer);
  if (!ran.ok())
    return Error{ran.error()};
  // The losses are on the last stage's rank: every rank gets them.
  auto sums =
      DeviceBuffer::zeros(*device, 4 * static_cast<int64_t>(loss.size()));
  if (!sums.ok())
    return Error{sums.error()};
  Status copied = device->copyToDevice(sums->data(), loss.data(),
                                       4 * static_cast<int64_t>(loss.size()));
  if (!copied.ok())
    return Error{copied.error()};
  const pcc_comm &pp = comms[info.pipeline_axis];
  if (pp.all_reduce(pp.group, sums->data(), sums->data(),
                    static_cast<int64_t>(loss.size()),
                    static_cast<int32_t>(DType::F32)) != 0)
    return Error{std::string("sharing the losses over the pipeline: ") +
                 pp.last_error(pp.group)};
  return endStep(sums->data(), static_cast<int64_t>(loss.size()), norm.data(),
                 /*normOnHost=*/false);
}

} // namespace pccrt
