//===- PipelineTrainer.cpp - a pipeline rank's training step -------------===//
//
// A pipelined training library (pcc --train --pp) has four phases per
// stage and one instruction list per pipeline rank (the schedule pcc
// chose: GPipe or 1F1B). The rank runs its stage's zero-grad, then its
// list: forward and backward passes of micro-batches, the activations'
// sends and receives to the next stage and their gradients' to the
// previous one; then its stage's optimizer, whose collectives over pp sum
// the gradients of tied weights and the global norm.
//
// Messages between two ranks match in the order they are posted (no
// tags): a forward transfer carries every output of the sending stage in
// order, a backward transfer one cotangent per float output, in order.
// Sends are asynchronous and completed at the end of the step, so a rank
// computes while its activations travel.
//
//===----------------------------------------------------------------------===//

#include "pcc/runtime/Trainer.h"

#include <algorithm>
#include <cstring>

namespace pccrt {

namespace {

bool isFloat(int32_t dtype) {
  DType t = static_cast<DType>(dtype);
  return t == DType::F32 || t == DType::F64 || t == DType::F16 ||
         t == DType::BF16;
}

Result<DeviceBuffer> allocateZeros(Device &device, int64_t bytes) {
  auto buffer = DeviceBuffer::allocate(device, bytes);
  if (!buffer.ok())
    return Error{buffer.error()};
  if (bytes > 0) {
    std::vector<uint8_t> host(static_cast<size_t>(bytes), 0);
    Status copied = device.copyToDevice(buffer->data(), host.data(), bytes);
    if (!copied.ok())
      return Error{copied.error()};
  }
  return buffer.take();
}

int64_t count(const pcc_tensor_spec &spec) {
  return elementCount(specShape(spec));
}

} // namespace

Status Trainer::createPipeline(int32_t pipelineRank) {
  const pcc_model_info &info = library->info();
  if (info.num_stages != info.num_pipeline_ranks)
    return Error{"this pipelined training library has " +
                 std::to_string(info.num_stages) + " stages on " +
                 std::to_string(info.num_pipeline_ranks) +
                 " pipeline ranks; one stage per rank is supported"};
  if (pipelineRank >= info.num_stages)
    return Error{"pipeline rank " + std::to_string(pipelineRank) +
                 " has no stage"};
  const pcc_phase_info &fwd = info.phases[phaseIndex(PCC_PHASE_FORWARD)];
  const pcc_phase_info &bwd = info.phases[phaseIndex(PCC_PHASE_BACKWARD)];
  const pcc_stage_info &me = info.stages[stage];
  int64_t m = std::max<int32_t>(info.microbatches, 1);
  auto make = [&](std::vector<DeviceBuffer> &into,
                  const pcc_tensor_spec &spec) -> Status {
    auto buffer = allocateZeros(*device, specBytes(spec));
    if (!buffer.ok())
      return Error{std::string("pipeline buffer '") + spec.name +
                   "': " + buffer.error()};
    into.push_back(buffer.take());
    return Status::success();
  };
  // One slot per micro-batch: a stage keeps at most m in flight.
  micro.resize(static_cast<size_t>(m));
  for (Micro &slot : micro) {
    for (int i = 0; i < fwd.num_inputs; ++i) {
      // Received inputs live in `recv`; the slot keeps an empty buffer.
      if (fwd.input_sources[i] >= 0) {
        slot.in.emplace_back();
        continue;
      }
      if (Status s = make(slot.in, fwd.inputs[i]); !s.ok())
        return s;
    }
    if (stage > 0) {
      const pcc_stage_info &prev = info.stages[stage - 1];
      for (int j = 0; j < prev.num_outputs; ++j)
        if (Status s = make(slot.recv, prev.outputs[j]); !s.ok())
          return s;
    }
    for (int j = 0; j < fwd.num_outputs; ++j) {
      if (Status s = make(slot.out, fwd.outputs[j]); !s.ok())
        return s;
      if (j >= me.num_outputs)
        savedTotal += specBytes(fwd.outputs[j]);
    }
    bool last = stage + 1 == info.num_stages;
    for (int j = 0; j < me.num_outputs && !last; ++j) {
      if (!isFloat(me.outputs[j].dtype)) {
        slot.gradOut.emplace_back();
        continue;
      }
      if (Status s = make(slot.gradOut, me.outputs[j]); !s.ok())
        return s;
    }
    for (int o = 0; o < bwd.num_outputs; ++o)
      if (Status s = make(slot.gradIn, bwd.outputs[o]); !s.ok())
        return s;
  }
  for (int p = 0; p < 4; ++p)
    arenaTotal = std::max(arenaTotal, info.phases[phaseIndex(p)].arena_bytes);
  auto seedBuffer = allocateZeros(*device, 4), normBuffer = allocateZeros(*device, 4),
       arenaBuffer = allocateZeros(*device, arenaTotal);
  if (!seedBuffer.ok() || !normBuffer.ok() || !arenaBuffer.ok())
    return Error{"cannot allocate the training arena of " +
                 std::to_string(arenaTotal) + " bytes"};
  seed = seedBuffer.take();
  norm = normBuffer.take();
  arena = arenaBuffer.take();
  return Status::success();
}

Status Trainer::gatherOverPipeline(int i, void *to, int64_t bytes) const {
  const pcc_model_info &info = library->info();
  const pcc_comm &comm = comms[info.pipeline_axis];
  const pcc_tensor_spec &spec = info.weights[i];
  // The first holder's copy, summed with everyone else's zeros.
  auto buffer = allocateZeros(*device, bytes);
  if (!buffer.ok())
    return Error{buffer.error()};
  if (firstHolder[i] == stage && statePtrs[i]) {
    std::vector<uint8_t> host(static_cast<size_t>(bytes));
    Status read = readState(i, host.data(), bytes);
    if (!read.ok())
      return read;
    Status copied = device->copyToDevice(buffer->data(), host.data(), bytes);
    if (!copied.ok())
      return copied;
  }
  if (comm.all_reduce(comm.group, buffer->data(), buffer->data(), count(spec),
                      spec.dtype) != 0)
    return Error{std::string("gathering '") + spec.name +
                 "' over the pipeline for a checkpoint: " +
                 comm.last_error(comm.group)};
  return device->copyToHost(to, buffer->data(), bytes);
}

Result<StepResult> Trainer::pipelineStep(
    const std::vector<std::vector<const void *>> &microbatches,
    double lossGrad, const std::array<double, PCC_NUM_HYPER> &hyper) {
  const pcc_model_info &info = library->info();
  const pcc_phase_info &fwd = info.phases[phaseIndex(PCC_PHASE_FORWARD)];
  const pcc_phase_info &bwd = info.phases[phaseIndex(PCC_PHASE_BACKWARD)];
  const pcc_stage_info &me = info.stages[stage];
  bool last = stage + 1 == info.num_stages;
  int32_t rank = stage; // one stage per pipeline rank
  if (microbatches.size() != micro.size())
    return Error{"a step of this library has " + std::to_string(micro.size()) +
                 " micro-batches, not " + std::to_string(microbatches.size())};
  StepResult result;
  Status ran = runPhase(phaseIndex(PCC_PHASE_ZERO_GRAD), {}, {}, hyper.data());
  if (!ran.ok())
    return Error{ran.error()};
  float seedValue = static_cast<float>(lossGrad);
  Status seeded = device->copyToDevice(seed.data(), &seedValue, 4);
  if (!seeded.ok())
    return Error{seeded.error()};

  auto where = [&](const char *what, int32_t mb) {
    return "pipeline rank " + std::to_string(rank) + ", " + what +
           " of micro-batch " + std::to_string(mb) + ": ";
  };
  const pcc_pipeline_instr *list = info.schedules[rank];
  for (int32_t n = 0; n < info.schedule_lengths[rank]; ++n) {
    const pcc_pipeline_instr &instr = list[n];
    int32_t mb = instr.microbatch;
    if (mb < 0 || mb >= static_cast<int32_t>(micro.size()))
      return Error{"the schedule names micro-batch " + std::to_string(mb)};
    Micro &slot = micro[static_cast<size_t>(mb)];
    std::array<double, PCC_NUM_HYPER> mbHyper = hyper;
    mbHyper[PCC_HYPER_MICROBATCH] = static_cast<double>(mb);
    mbHyper[PCC_HYPER_LAST_MICROBATCH] = mb + 1 == info.microbatches ? 1 : 0;
    Status st = Status::success();
    switch (instr.op) {
    case PCC_PIPE_RECV_FORWARD: {
      const pcc_stage_info &prev = info.stages[stage - 1];
      for (int j = 0; j < prev.num_outputs && st.ok(); ++j)
        st = pipe->recv(slot.recv[j].data(), count(prev.outputs[j]),
                        static_cast<DType>(prev.outputs[j].dtype), instr.peer);
      break;
    }
    case PCC_PIPE_FORWARD: {
      std::vector<const void *> in;
      for (int i = 0; i < fwd.num_inputs && st.ok(); ++i) {
        int32_t source = fwd.input_sources[i];
        if (source >= 0) {
          in.push_back(slot.recv[source].data());
          continue;
        }
        st = device->copyToDevice(slot.in[i].data(),
                                  microbatches[mb][-1 - source],
                                  specBytes(fwd.inputs[i]));
        in.push_back(slot.in[i].data());
      }
      std::vector<void *> out;
      for (DeviceBuffer &b : slot.out)
        out.push_back(b.data());
      if (st.ok())
        st = runPhase(phaseIndex(PCC_PHASE_FORWARD), in, out, mbHyper.data());
      break;
    }
    case PCC_PIPE_SEND_FORWARD:
      for (int j = 0; j < me.num_outputs && st.ok(); ++j)
        st = pipe->sendAsync(slot.out[j].data(), count(me.outputs[j]),
                             static_cast<DType>(me.outputs[j].dtype),
                             instr.peer);
      break;
    case PCC_PIPE_RECV_BACKWARD:
      for (int j = 0; j < me.num_outputs && st.ok(); ++j)
        if (isFloat(me.outputs[j].dtype))
          st = pipe->recv(slot.gradOut[j].data(), count(me.outputs[j]),
                          static_cast<DType>(me.outputs[j].dtype),
                          instr.peer);
      break;
    case PCC_PIPE_BACKWARD: {
      std::vector<const void *> in;
      for (int i = 0; i < bwd.num_inputs; ++i) {
        int32_t source = bwd.input_sources[i];
        if (source == PCC_SOURCE_LOSS_GRAD)
          in.push_back(seed.data());
        else if (source <= PCC_SOURCE_OUTPUT_GRAD_BASE)
          in.push_back(slot.gradOut[PCC_SOURCE_OUTPUT_GRAD_BASE - source].data());
        else
          in.push_back(slot.out[source].data());
      }
      std::vector<void *> out;
      for (DeviceBuffer &b : slot.gradIn)
        out.push_back(b.data());
      st = runPhase(phaseIndex(PCC_PHASE_BACKWARD), in, out, mbHyper.data());
      break;
    }
    case PCC_PIPE_WEIGHT_GRAD:
      break; // the backward phase computed the weights' gradients too
    case PCC_PIPE_SEND_BACKWARD: {
      // One cotangent per float output of the previous stage, in order:
      // the backward's output for the input that output feeds.
      const pcc_stage_info &prev = info.stages[stage - 1];
      for (int j = 0; j < prev.num_outputs && st.ok(); ++j) {
        if (!isFloat(prev.outputs[j].dtype))
          continue;
        int found = -1;
        for (int o = 0; o < bwd.num_outputs; ++o)
          if (fwd.input_sources[bwd.output_targets[o]] == j)
            found = o;
        if (found < 0)
          return Error{where("send_bwd", mb) + "no cotangent for output " +
                       std::to_string(j) + " of stage " +
                       std::to_string(stage - 1)};
        st = pipe->sendAsync(slot.gradIn[found].data(), count(prev.outputs[j]),
                             static_cast<DType>(prev.outputs[j].dtype),
                             instr.peer);
      }
      break;
    }
    default:
      return Error{"the schedule has an unknown instruction " +
                   std::to_string(instr.op)};
    }
    if (!st.ok())
      return Error{where(instr.op == PCC_PIPE_FORWARD    ? "forward"
                         : instr.op == PCC_PIPE_BACKWARD ? "backward"
                                                         : "transfer",
                         mb) +
                   st.error()};
  }
  Status sent = pipe->completeSends();
  if (!sent.ok())
    return Error{sent.error()};

  std::vector<void *> optOut{norm.data()};
  ran = runPhase(phaseIndex(PCC_PHASE_OPTIMIZER), {}, optOut, hyper.data());
  if (!ran.ok())
    return Error{ran.error()};
  // The losses are on the last stage: every rank gets them.
  std::vector<float> loss(micro.size(), 0.0f);
  if (last)
    for (size_t j = 0; j < micro.size(); ++j) {
      Status read = device->copyToHost(&loss[j], micro[j].out[0].data(), 4);
      if (!read.ok())
        return Error{read.error()};
    }
  auto sums = allocateZeros(*device, 4 * static_cast<int64_t>(loss.size()));
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
  Status read = device->copyToHost(loss.data(), sums->data(),
                                   4 * static_cast<int64_t>(loss.size()));
  if (!read.ok())
    return Error{read.error()};
  for (float l : loss)
    result.lossSum += l;
  float gradNorm = 0;
  read = device->copyToHost(&gradNorm, norm.data(), 4);
  if (!read.ok())
    return Error{read.error()};
  result.gradNorm = gradNorm;
  return result;
}

} // namespace pccrt
