//===- Pipeline.h - running a pipeline rank's schedule ------------*- C++
//-*-===//
//
// A pipelined model library (pcc --pp=N) is cut into stages, and each
// pipeline rank runs an instruction list (pcc_model_info.schedules): compute
// a stage on a micro-batch, send a stage's outputs to the next rank, receive
// a stage's inputs from the previous one. PipelineRunner binds the stages of
// one rank to a device and runs its list over the whole batch, recording
// when each step began and ended for the timeline (pcc-run --trace).
//
// Micro-batch k of a model input or output is rows [k*b, (k+1)*b) of its
// dimension 0, so its slice of the whole-batch buffer is contiguous: stages
// read model inputs and write model outputs in place. Every (stage,
// micro-batch) keeps its own receive and send buffers, so a send can be in
// flight (MPI_Isend) while the rank computes the next micro-batch.
//
// The transfers between two computes of a list are issued as one group
// (ncclGroupStart/End on GPUs), sends first. On GPUs they run on a CUDA
// stream of their own: a fence makes them wait for the compute before
// them, and another makes the compute after a receive wait for it. A
// group with receives is waited for on the host, as MPI's blocking
// receive is, so the timeline shows the wait as the receive's on both
// engines. A send thus overlaps the next compute only when no receive
// shares its group (the first pipeline rank, the drain): on middle ranks
// the group completes, send included, before the compute that needs its
// receive.
//
//===----------------------------------------------------------------------===//

#ifndef PCC_RUNTIME_PIPELINE_H
#define PCC_RUNTIME_PIPELINE_H

#include "pcc/runtime/Communicator.h"
#include "pcc/runtime/Device.h"
#include "pcc/runtime/ModelLibrary.h"

#include <chrono>
#include <functional>
#include <vector>

namespace pccrt {

/// One step of a rank's timeline.
struct TraceEvent {
  /// ZeroGrad and Optimizer: a training step's phases around the pipeline
  /// (the zero-grad before it, the update after the flush).
  enum class Kind : int32_t { Compute, Send, Recv, WaitSends, ZeroGrad, Optimizer };
  Kind kind;
  int32_t stage;
  int32_t microbatch;
  int32_t peer; // sends and receives; -1 otherwise
  /// Seconds since the run's origin (the barrier every rank leaves
  /// together).
  double start, end;
  /// A compute step's work: 'F' forward, 'B' input gradients, 'W' weight
  /// gradients (pipelined training).
  char work = 'F';
};

/// "compute", "send", "recv", "wait-sends", "zero-grad" or "optimizer".
const char *traceKindName(TraceEvent::Kind kind);

class PipelineRunner {
public:
  /// Binds the stages pipeline rank `ppRank` runs to `device`. `weights`
  /// are host pointers in the library's weight order (null for weights the
  /// rank's stages do not read); on the CPU they are used in place. `pipe`
  /// is the group of the pipeline axis, whose rank r is pipeline rank r;
  /// null when the library has one pipeline rank.
  static Result<PipelineRunner> create(const ModelLibrary &library,
                                       Device &device,
                                       const std::vector<const void *> &weights,
                                       int64_t ppRank, Communicator *pipe);

  /// The collectives of each mesh axis (see CommBinding).
  void setCommunicators(const pcc_comm *tables) { comms = tables; }
  /// Copies the model inputs (host, whole batch) to the device, on ranks
  /// whose stages read them.
  Status setInputs(const std::vector<const void *> &inputs);
  /// Runs the rank's instruction list once over every micro-batch; trace()
  /// then holds its steps, timed from `origin`. A failed run can leave
  /// sends in flight and peers waiting: end the job (pcc-run aborts it
  /// through Communicator::abortJob) rather than run again.
  Status run(std::chrono::steady_clock::time_point origin);
  /// Whether this rank computes the model's outputs (runs the last stage).
  bool holdsOutputs() const { return hasLastStage; }
  /// Copies the whole-batch outputs to host buffers (holdsOutputs() ranks).
  Status readOutputs(const std::vector<void *> &outputs);
  const std::vector<TraceEvent> &trace() const { return events; }

private:
  PipelineRunner() = default;
  /// Per stage this rank runs.
  struct Stage {
    int32_t index = 0;
    void *arena = nullptr;
    std::vector<const void *> weights;
    /// [micro-batch][input]: receive buffer (inputs from the previous
    /// stage) or null (model inputs).
    std::vector<std::vector<void *>> received;
    /// [micro-batch][output]: send buffers; null for the last stage, whose
    /// outputs go into the model's output buffers.
    std::vector<std::vector<void *>> sent;
  };
  /// The stage `instr` runs, or an error when it is not this rank's.
  Result<Stage *> stageOf(const pcc_pipeline_instr &instr);
  Status compute(Stage &s, int32_t microbatch);
  Status send(Stage &s, int32_t microbatch, int32_t peer);
  Status receive(Stage &s, int32_t microbatch, int32_t peer);
  /// Issues the transfers [begin, end) of the list, sends first; sets
  /// `receives` when there is one.
  Status issueGroup(const pcc_pipeline_instr *begin,
                    const pcc_pipeline_instr *end,
                    const std::function<double()> &now, bool &receives);

  const ModelLibrary *library = nullptr;
  Device *device = nullptr;
  Communicator *pipe = nullptr;
  const pcc_comm *comms = nullptr;
  int64_t ppRank = 0;
  std::vector<DeviceBuffer> owned;
  std::vector<Stage> stages;
  /// Whole-batch model inputs and outputs in device memory (null where the
  /// rank does not need them).
  std::vector<void *> inputs, outputs;
  bool hasLastStage = false;
  std::vector<TraceEvent> events;
};

} // namespace pccrt

#endif // PCC_RUNTIME_PIPELINE_H
