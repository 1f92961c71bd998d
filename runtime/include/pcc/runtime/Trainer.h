//===- Trainer.h - running the phases of a training library -----*- C++ -*-===//
//
// A training library (pcc --train) bound to a device: the model state
// (weights, gradients, optimizer state) in device memory, the saved
// activations between the forward and backward phases, and one step =
// zero-grad, forward + backward per micro-batch, optimizer.
//
//===----------------------------------------------------------------------===//

#ifndef PCC_RUNTIME_TRAINER_H
#define PCC_RUNTIME_TRAINER_H

#include "pcc/runtime/Checkpoint.h"
#include "pcc/runtime/Communicator.h"
#include "pcc/runtime/Device.h"
#include "pcc/runtime/ModelLibrary.h"
#include "pcc/runtime/Pipeline.h"
#include "pcc/runtime/Safetensors.h"

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace pccrt {

/// The run's hyperparameters, PyTorch's names and defaults (AdamW's).
struct Hyperparameters {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8,
         weightDecay = 0.01, momentum = 0, dampening = 0, maxGradNorm = 0;
  bool nesterov = false;
  /// Keys dropout's random numbers (below 2^53).
  uint64_t seed = 0;
  /// fp16 training: the loss scale of the step (0: no loss scaling). The
  /// table then asks the optimizer to unscale the gradients and to skip an
  /// update whose gradient norm is not finite.
  double lossScale = 0;
  /// The table the library reads (enum pcc_hyper) for optimizer step
  /// `step` (from 1) at learning rate `lr`.
  std::array<double, PCC_NUM_HYPER> table(int64_t step, double lr) const;
};

struct StepResult {
  /// Sum of the per-label losses over the step's micro-batches.
  double lossSum = 0;
  /// Global L2 norm of the gradients (before clipping).
  double gradNorm = 0;
};

class Trainer {
public:
  /// Allocates the model state (zeros), the saved activations and the
  /// arena on `device`. The weights still have to be loaded.
  static Result<Trainer> create(const ModelLibrary &library, Device &device);
  /// A pipelined library (pcc --train --pp): this process is pipeline rank
  /// `pipelineRank` and holds that stage's state alone; `pipe` is the pp
  /// group its activations and their gradients travel over.
  static Result<Trainer> create(const ModelLibrary &library, Device &device,
                                int32_t pipelineRank, Communicator *pipe);

  /// Copies every tensor of `kind` (enum pcc_state_kind) this rank holds
  /// from `reader`, by name, checking dtype and whole shape; a missing one
  /// is an error naming it. The rank reads its own piece (its tensor-
  /// parallel slice, its ZeRO flat piece), from just the files that hold
  /// it when the checkpoint was saved in the same layout; loading the
  /// weights also loads the ZeRO master pieces.
  Status load(CheckpointReader &reader, int32_t kind);
  /// The state tensors of `kind`, read back to the host whole, as a
  /// safetensors writer (names as in the library's table). With ZeRO-
  /// sharded state this is a collective: every rank of the dp axis calls
  /// it, and each gets the whole tensors.
  Result<SafetensorsWriter> save(int32_t kind, const std::string &what) const;
  /// This rank's file of a sharded checkpoint: its pieces of the weights
  /// and the optimizer state that no other rank holds as well (a piece
  /// replicated over an axis is written by that axis's rank 0), and the
  /// piece table in the metadata (Checkpoint.h). Empty (no tensors) when
  /// the rank holds nothing of its own. Not a collective.
  Result<SafetensorsWriter> saveShard(int64_t *tensors) const;

  /// One optimizer step. `microbatches[j]` holds micro-batch j's forward
  /// inputs (host pointers, model inputs then labels); `lossGrad` is the
  /// gradient of the loss sum (one over the labels of the whole step).
  Result<StepResult> step(const std::vector<std::vector<const void *>> &microbatches,
                          double lossGrad,
                          const std::array<double, PCC_NUM_HYPER> &hyper);

  /// Data parallelism: the library's communicators (one per mesh axis,
  /// kept by the caller) and this rank's place on the dp axis. Micro-batch
  /// j of this rank is the step's global micro-batch j * dpSize + dpRank,
  /// the index dropout's masks are keyed by.
  void setCommunicators(const pcc_comm *tables) { comms = tables; }
  void setDataParallelRank(int64_t rank, int64_t size) {
    dpRank = rank;
    dpSize = size;
  }

  /// Bytes of model state, saved activations and arena on the device.
  int64_t stateBytes() const { return stateTotal; }
  /// Whether this rank holds state tensor `i` (a pipeline rank holds its
  /// stages' state alone).
  bool holds(int i) const {
    return statePtrs[static_cast<size_t>(i)] || hostPtrs[static_cast<size_t>(i)];
  }
  int64_t activationBytes() const { return savedTotal; }
  int64_t arenaBytes() const { return arenaTotal; }
  /// --offload=optimizer: bytes of state in host memory (0 otherwise).
  int64_t hostStateBytes() const { return hostTotal; }
  /// Pipelined training: the micro-batches of chunk `chunk` this rank keeps
  /// in flight at once (its stash slots; 0 unpipelined).
  int32_t stashSlots(int32_t chunk) const;
  /// Every pipeline rank's stash slots over all its chunks (a collective
  /// over pp).
  Result<std::vector<int32_t>> stashSlotsPerRank() const;
  /// Pipelined training: record the next step's F, B, W, sends and
  /// receives, timed in seconds since `origin` (steady clock), into
  /// trace().
  void traceNextStep(double origin) {
    tracing = true;
    traceOrigin = origin;
  }
  const std::vector<TraceEvent> &trace() const { return events; }

private:
  Trainer() = default;
  /// This rank's coordinate on mesh axis `axis` (0 without communicators).
  int64_t shardRank(int32_t axis) const;
  /// Every rank of mesh axis `axis`'s `count` elements at `piece` (device
  /// memory when `onDevice`, else host), in rank order, on the host.
  Result<std::vector<uint8_t>> gather(int32_t axis, const void *piece,
                                      bool onDevice, int64_t count,
                                      int32_t dtype,
                                      const std::string &name) const;
  Status runPhase(int32_t phase, const std::vector<const void *> &in,
                  const std::vector<void *> &out, const double *hyper,
                  bool onHost = false);
  /// Pipelined training: the buffers of this rank's stage, and one step
  /// run from the rank's instruction list (PipelineTrainer.cpp).
  Status createPipeline();
  Result<StepResult>
  unpipelinedStep(const std::vector<std::vector<const void *>> &microbatches,
                  double lossGrad,
                  const std::array<double, PCC_NUM_HYPER> &hyper);
  Result<StepResult>
  pipelineStep(const std::vector<std::vector<const void *>> &microbatches,
               double lossGrad, const std::array<double, PCC_NUM_HYPER> &hyper);
  /// What the instructions of one pipelined step share (PipelineTrainer.cpp).
  struct PipelineStepState;
  /// Runs one instruction of this rank's list: a receive posted, a forward,
  /// backward or weight-gradient phase of one micro-batch, a send.
  Status runInstruction(const pcc_pipeline_instr &instr,
                        PipelineStepState &step);
  /// The start of a step: zero-grad phase `zeroGrad`, and the loss
  /// gradient `lossGrad` into the seed the backward phases read.
  Status beginStep(int32_t zeroGrad, double lossGrad, const double *hyper);
  /// The end of a step: the sum of the `count` micro-batch losses at
  /// `losses` (device memory) and the global norm at `gradNorm` (device
  /// memory, or host memory with `normOnHost`).
  Result<StepResult> endStep(const void *losses, int64_t count,
                             const void *gradNorm, bool normOnHost) const;
  /// Pipelined: every rank gets state i whole at `whole` (`bytes` long),
  /// where its first holder has put its copy (assembled from the pieces
  /// of a ZeRO or tensor-parallel shard).
  Status gatherOverPipeline(int i, void *whole, int64_t bytes) const;
  /// Pipelined: the phase of kind `kind` (enum pcc_phase) of stage
  /// `stage` (forward, backward, weight-gradient), or of this pipeline rank
  /// (optimizer, zero-grad).
  int32_t stagePhase(int32_t kind, int32_t stage) const;
  int32_t rankPhase(int32_t kind) const;
  /// The optimizer step of an offloaded library: the device's collectives,
  /// the gradients to the host, the update there, the weights back and the
  /// device's all-gathers.
  Status offloadedStep(const double *hyper);
  /// State tensor i's bytes, from (to) wherever it lives: the device, or
  /// host memory for offloaded optimizer state (both copies when mirrored).
  Status readState(int i, void *to, int64_t bytes) const;
  Status writeState(int i, const void *from, int64_t bytes);
  const ModelLibrary *library = nullptr;
  Device *device = nullptr;
  std::vector<DeviceBuffer> state;      // per weight-table entry
  std::vector<void *> statePtrs;        // null: in host memory only
  /// --offload=optimizer: the host's copies of the state the update reads
  /// (per weight-table entry, null where none), on `host`, the CPU device
  /// (the device itself on a CPU run), with the update's arena and inputs.
  std::unique_ptr<Device> ownHost;
  Device *host = nullptr;
  std::vector<DeviceBuffer> hostState;
  std::vector<void *> hostPtrs;
  std::vector<DeviceBuffer> preOut, hostIn;
  DeviceBuffer hostArena, hostNorm;
  bool offloaded = false;
  int64_t hostTotal = 0;
  /// Mixed precision: whether the weights' 16-bit copies may differ from
  /// the weights (none made yet, or state written since the last step),
  /// passed to the step as PCC_HYPER_REFRESH_COPIES.
  bool copiesStale = true;
  /// Pipelined training: this rank's pipeline rank (-1: not pipelined),
  /// its stages (one per chunk), the pp group, per state the first
  /// pipeline rank that holds it; per chunk its stash slots, each with the
  /// stage's buffers for one micro-batch in flight: forward inputs (model
  /// inputs; those received are in `recv`, one per previous-stage output),
  /// forward outputs (outputs, then the values the backward reads), the
  /// cotangents received for the outputs, and the backward's outputs that
  /// only W reads; per chunk and micro-batch, its slot and the cotangents
  /// its B sends back (PipelineTrainer.cpp).
  int32_t pipeRank = -1;
  std::vector<int32_t> stages;
  Communicator *pipe = nullptr;
  std::vector<int32_t> firstHolder;
  struct Slot {
    std::vector<DeviceBuffer> in, recv, out, gradOut;
  };
  std::vector<std::vector<Slot>> slots;
  std::vector<std::vector<int32_t>> slotOf;
  /// What B leaves for W lives from a micro-batch's B to its W, in a
  /// buffer set of its own: [chunk][set][B output] (empty where the
  /// output is a cotangent to send), and each micro-batch's set.
  std::vector<std::vector<std::vector<DeviceBuffer>>> stashes;
  std::vector<std::vector<int32_t>> stashOf;
  std::vector<std::vector<std::vector<DeviceBuffer>>> sendGrad;
  bool tracing = false;
  double traceOrigin = 0;
  std::vector<TraceEvent> events;
  std::vector<DeviceBuffer> forwardIn;  // per forward input
  std::vector<DeviceBuffer> forwardOut; // loss, saved activations
  DeviceBuffer seed, norm, arena;
  /// The forward phase writes micro-batch j's loss sum into slot j; they
  /// are read once per step, not after every micro-batch.
  DeviceBuffer losses;
  size_t lossSlots = 0;
  int64_t stateTotal = 0, savedTotal = 0, arenaTotal = 0;
  const pcc_comm *comms = nullptr;
  int64_t dpRank = 0, dpSize = 1;
};

} // namespace pccrt

#endif // PCC_RUNTIME_TRAINER_H
