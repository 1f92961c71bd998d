//===- Pipeline.cpp - running a pipeline rank's schedule ------------------===//

#include "pcc/runtime/Pipeline.h"

#include <algorithm>

namespace pccrt {

const char *traceKindName(TraceEvent::Kind kind) {
  switch (kind) {
  case TraceEvent::Kind::Compute:
    return "compute";
  case TraceEvent::Kind::Send:
    return "send";
  case TraceEvent::Kind::Recv:
    return "recv";
  case TraceEvent::Kind::WaitSends:
    return "wait-sends";
  case TraceEvent::Kind::ZeroGrad:
    return "zero-grad";
  case TraceEvent::Kind::Optimizer:
    return "optimizer";
  }
  return "?";
}

Result<PipelineRunner>
PipelineRunner::create(const ModelLibrary &library, Device &device,
                       const std::vector<const void *> &weights, int64_t ppRank,
                       Communicator *pipe) {
  const pcc_model_info &info = library.info();
  Status target = checkTarget(library, device);
  if (!target.ok())
    return Error{target.error()};
  if (ppRank >= info.num_pipeline_ranks)
    return Error{"pipeline rank " + std::to_string(ppRank) +
                 " has no schedule (the library has " +
                 std::to_string(info.num_pipeline_ranks) + ")"};
  PipelineRunner runner;
  runner.library = &library;
  runner.device = &device;
  runner.pipe = pipe;
  runner.ppRank = ppRank;
  // Transfers get a queue of their own where the engine has one (a second
  // CUDA stream for NCCL), so sends overlap the next compute.
  if (pipe) {
    Status separate = pipe->separateTransfers();
    if (!separate.ok())
      return Error{separate.error()};
  }
  auto own = [&](int64_t bytes, const std::string &what) -> Result<void *> {
    auto buffer = DeviceBuffer::allocate(device, bytes);
    if (!buffer.ok())
      return Error{what + ": " + buffer.error()};
    runner.owned.push_back(buffer.take());
    return runner.owned.back().data();
  };

  // Weights: each one a stage of this rank reads, in device memory once.
  std::vector<const void *> deviceWeights(info.num_weights, nullptr);
  std::vector<int32_t> mine = library.stagesOf(ppRank);
  for (int32_t k : mine) {
    const pcc_stage_info &stage = info.stages[k];
    for (int i = 0; i < stage.num_weights; ++i) {
      int32_t w = stage.weights[i];
      if (deviceWeights[w])
        continue;
      if (!weights[w])
        return Error{"weight '" + std::string(info.weights[w].name) +
                     "' of stage " + std::to_string(k) + " was not bound"};
      if (device.isHost()) {
        deviceWeights[w] = weights[w];
        continue;
      }
      int64_t bytes = specBytes(info.weights[w]);
      auto ptr =
          own(bytes, "weight '" + std::string(info.weights[w].name) + "'");
      if (!ptr.ok())
        return Error{ptr.error()};
      Status s = device.copyToDevice(*ptr, weights[w], bytes);
      if (!s.ok())
        return Error{"weight '" + std::string(info.weights[w].name) +
                     "': " + s.error()};
      deviceWeights[w] = *ptr;
    }
  }

  // Whole-batch model inputs read by this rank's stages, and the model's
  // outputs on the rank of the last stage.
  runner.inputs.assign(info.num_inputs, nullptr);
  runner.outputs.assign(info.num_outputs, nullptr);
  int32_t m = info.microbatches;
  for (int32_t k : mine) {
    const pcc_stage_info &stage = info.stages[k];
    for (int i = 0; i < stage.num_inputs; ++i) {
      int32_t source = stage.input_sources[i];
      if (source >= 0 || runner.inputs[-1 - source])
        continue;
      const pcc_tensor_spec &spec = info.inputs[-1 - source];
      auto ptr =
          own(specBytes(spec) * m, "input '" + std::string(spec.name) + "'");
      if (!ptr.ok())
        return Error{ptr.error()};
      runner.inputs[-1 - source] = *ptr;
    }
    if (k + 1 == info.num_stages) {
      runner.hasLastStage = true;
      for (int j = 0; j < info.num_outputs; ++j) {
        auto ptr = own(specBytes(info.outputs[j]) * m,
                       "output '" + std::string(info.outputs[j].name) + "'");
        if (!ptr.ok())
          return Error{ptr.error()};
        runner.outputs[j] = *ptr;
      }
    }
  }

  // Per stage: the arena, and a receive and a send buffer per micro-batch.
  for (int32_t k : mine) {
    const pcc_stage_info &info_k = info.stages[k];
    Stage s;
    s.index = k;
    std::string where = "stage " + std::to_string(k);
    auto arena = own(info_k.arena_bytes,
                     where + " arena (" + std::to_string(info_k.arena_bytes) +
                         " bytes)");
    if (!arena.ok())
      return Error{arena.error()};
    s.arena = *arena;
    for (int i = 0; i < info_k.num_weights; ++i)
      s.weights.push_back(deviceWeights[info_k.weights[i]]);
    bool last = k + 1 == info.num_stages;
    for (int32_t mb = 0; mb < m; ++mb) {
      std::vector<void *> &in = s.received.emplace_back();
      for (int i = 0; i < info_k.num_inputs; ++i) {
        if (info_k.input_sources[i] < 0) {
          in.push_back(nullptr);
          continue;
        }
        auto ptr = own(specBytes(info_k.inputs[i]),
                       where + " input '" + info_k.inputs[i].name + "'");
        if (!ptr.ok())
          return Error{ptr.error()};
        in.push_back(*ptr);
      }
      std::vector<void *> &out = s.sent.emplace_back();
      for (int j = 0; j < info_k.num_outputs && !last; ++j) {
        auto ptr = own(specBytes(info_k.outputs[j]),
                       where + " output '" + info_k.outputs[j].name + "'");
        if (!ptr.ok())
          return Error{ptr.error()};
        out.push_back(*ptr);
      }
    }
    runner.stages.push_back(std::move(s));
  }
  return runner;
}

Status PipelineRunner::setInputs(const std::vector<const void *> &host) {
  const pcc_model_info &info = library->info();
  for (int i = 0; i < info.num_inputs; ++i) {
    if (!inputs[i])
      continue;
    Status s = device->copyToDevice(
        inputs[i], host[i], specBytes(info.inputs[i]) * info.microbatches);
    if (!s.ok())
      return Error{"input '" + std::string(info.inputs[i].name) +
                   "': " + s.error()};
  }
  return Status::success();
}

Result<PipelineRunner::Stage *>
PipelineRunner::stageOf(const pcc_pipeline_instr &instr) {
  for (Stage &s : stages)
    if (s.index == instr.stage)
      return &s;
  return Error{"the schedule of pipeline rank " + std::to_string(ppRank) +
               " names stage " + std::to_string(instr.stage) +
               ", which runs elsewhere"};
}

Status PipelineRunner::compute(Stage &s, int32_t mb) {
  const pcc_model_info &info = library->info();
  const pcc_stage_info &stage = info.stages[s.index];
  std::vector<const void *> in;
  for (int i = 0; i < stage.num_inputs; ++i) {
    int32_t source = stage.input_sources[i];
    if (source >= 0) {
      in.push_back(s.received[mb][i]);
      continue;
    }
    // The micro-batch's rows of the model input.
    const pcc_tensor_spec &spec = info.inputs[-1 - source];
    in.push_back(static_cast<const char *>(inputs[-1 - source]) +
                 mb * specBytes(spec));
  }
  std::vector<void *> out;
  if (s.index + 1 == info.num_stages)
    for (int j = 0; j < info.num_outputs; ++j)
      out.push_back(static_cast<char *>(outputs[j]) +
                    mb * specBytes(info.outputs[j]));
  else
    out = s.sent[mb];
  pcc_run_context context = device->runContext();
  context.comms = comms;
  return library->runStage(s.index, context, in.data(), out.data(),
                           s.weights.data(), s.arena);
}

Status PipelineRunner::send(Stage &s, int32_t mb, int32_t peer) {
  // The next stage's inputs that come from this one, in its order.
  const pcc_model_info &info = library->info();
  const pcc_stage_info &from = info.stages[s.index];
  const pcc_stage_info &to = info.stages[s.index + 1];
  for (int i = 0; i < to.num_inputs; ++i) {
    int32_t source = to.input_sources[i];
    if (source < 0)
      continue;
    const pcc_tensor_spec &spec = from.outputs[source];
    Status st =
        pipe->sendAsync(s.sent[mb][source], elementCount(specShape(spec)),
                        static_cast<DType>(spec.dtype), peer);
    if (!st.ok())
      return Error{"stage " + std::to_string(s.index) + " sending '" +
                   spec.name + "' of micro-batch " + std::to_string(mb) + ": " +
                   st.error()};
  }
  return Status::success();
}

Status PipelineRunner::receive(Stage &s, int32_t mb, int32_t peer) {
  const pcc_stage_info &to = library->info().stages[s.index];
  for (int i = 0; i < to.num_inputs; ++i) {
    if (to.input_sources[i] < 0)
      continue;
    const pcc_tensor_spec &spec = to.inputs[i];
    Status st = pipe->recv(s.received[mb][i], elementCount(specShape(spec)),
                           static_cast<DType>(spec.dtype), peer);
    if (!st.ok())
      return Error{"stage " + std::to_string(s.index) + " receiving '" +
                   spec.name + "' of micro-batch " + std::to_string(mb) + ": " +
                   st.error()};
  }
  return Status::success();
}

static bool isTransfer(int32_t op) {
  return op == PCC_PIPE_SEND_FORWARD || op == PCC_PIPE_RECV_FORWARD;
}

Status PipelineRunner::issueGroup(const pcc_pipeline_instr *begin,
                                  const pcc_pipeline_instr *end,
                                  const std::function<double()> &now,
                                  bool &receives) {
  // Sends first: other engines' receives block.
  for (int32_t op : {PCC_PIPE_SEND_FORWARD, PCC_PIPE_RECV_FORWARD})
    for (const pcc_pipeline_instr *t = begin; t != end; ++t) {
      if (t->op != op)
        continue;
      auto s = stageOf(*t);
      if (!s.ok())
        return Error{s.error()};
      double start = now();
      bool isSend = op == PCC_PIPE_SEND_FORWARD;
      Status st = isSend ? send(**s, t->microbatch, t->peer)
                         : receive(**s, t->microbatch, t->peer);
      if (!st.ok())
        return st;
      receives |= !isSend;
      events.push_back(
          {isSend ? TraceEvent::Kind::Send : TraceEvent::Kind::Recv, t->stage,
           t->microbatch, t->peer, start, now()});
    }
  return Status::success();
}

Status PipelineRunner::run(std::chrono::steady_clock::time_point origin) {
  const pcc_model_info &info = library->info();
  events.clear();
  auto now = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                         origin)
        .count();
  };
  const pcc_pipeline_instr *list = info.schedules[ppRank];
  int32_t length = info.schedule_lengths[ppRank];
  for (int32_t n = 0; n < length;) {
    const pcc_pipeline_instr &instr = list[n];
    if (instr.op == PCC_PIPE_FORWARD) {
      auto s = stageOf(instr);
      if (!s.ok())
        return Error{s.error()};
      double start = now();
      Status st = compute(**s, instr.microbatch);
      if (!st.ok())
        return st;
      events.push_back({TraceEvent::Kind::Compute, instr.stage,
                        instr.microbatch, -1, start, now()});
      ++n;
      continue;
    }
    if (!isTransfer(instr.op))
      return Error{"the schedule of pipeline rank " + std::to_string(ppRank) +
                   " holds backward work (op " + std::to_string(instr.op) +
                   "), which inference runs do not do"};
    if (!pipe)
      return Error{"the schedule sends between pipeline ranks, but this run "
                   "has one"};
    // The transfers up to the next compute go as one group (the schedule
    // pass checked that this cannot deadlock, see
    // schedule::checkGroupedTransfers), after the compute before them;
    // sends first, since receives may block.
    int32_t end = n;
    while (end < length && isTransfer(list[end].op))
      ++end;
    Status st = pipe->transfersAfterCompute();
    if (st.ok())
      st = pipe->beginGroup();
    if (!st.ok())
      return st;
    bool receives = false;
    st = issueGroup(list + n, list + end, now, receives);
    // Ended on every path: an open NCCL group would swallow later calls.
    Status ended = pipe->endGroup();
    if (st.ok())
      st = ended;
    if (st.ok() && receives) {
      // The next compute reads what arrived. Engines that queue transfers
      // (NCCL) are waited for here, as a blocking receive would be, and
      // the timeline charts the wait to the group's last receive (the
      // sends come first), so receives never overlap on a row.
      st = pipe->computeAfterTransfers();
      if (st.ok())
        st = pipe->wait(/*timeoutMs=*/600000);
      events.back().end = now();
    }
    if (!st.ok())
      return st;
    n = end;
  }
  if (pipe) {
    double start = now();
    Status st = pipe->completeSends();
    if (st.ok())
      st = pipe->wait(/*timeoutMs=*/600000);
    if (!st.ok())
      return st;
    events.push_back({TraceEvent::Kind::WaitSends, -1, -1, -1, start, now()});
  }
  return device->synchronize();
}

Status PipelineRunner::readOutputs(const std::vector<void *> &host) {
  const pcc_model_info &info = library->info();
  for (int j = 0; j < info.num_outputs; ++j) {
    Status s = device->copyToHost(
        host[j], outputs[j], specBytes(info.outputs[j]) * info.microbatches);
    if (!s.ok())
      return Error{"output '" + std::string(info.outputs[j].name) +
                   "': " + s.error()};
  }
  return Status::success();
}

} // namespace pccrt
