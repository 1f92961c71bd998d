//===- ModelLibrary.h - loading and running a model library ------*- C++
//-*-===//
//
// A model.so built by pcc, opened with dlopen and checked against the model
// ABI this runtime speaks. Used by pcc-run and by the conformance runner.
//
//===----------------------------------------------------------------------===//

#ifndef PCC_RUNTIME_MODELLIBRARY_H
#define PCC_RUNTIME_MODELLIBRARY_H

#include "pcc/runtime/DType.h"
#include "pcc/runtime/ModelAbi.h"
#include "pcc/runtime/Result.h"
#include "pcc/runtime/Safetensors.h"

#include <memory>
#include <string>
#include <vector>

namespace pccrt {

struct AlignedBuffer;

/// "F32 2x16" for a tensor spec.
std::string describeSpec(const pcc_tensor_spec &spec);
std::vector<int64_t> specShape(const pcc_tensor_spec &spec);
/// Bytes of a tensor of `spec`.
int64_t specBytes(const pcc_tensor_spec &spec);

class ModelLibrary {
public:
  /// Loads `path` and checks that it exports the model ABI this runtime
  /// speaks (PCC_MODEL_ABI_VERSION).
  static Result<ModelLibrary> open(const std::string &path);

  const pcc_model_info &info() const { return *modelInfo; }
  /// The weights file named by the model, beside the library.
  std::string defaultWeightsPath() const;
  /// Pointers to each weight the model needs, in its order, checking names,
  /// dtypes and shapes against the model's table. A weight split over a
  /// mesh axis is read as this rank's slice (`coords`: the rank's position
  /// on each mesh axis; empty for rank 0 of every axis) into memory the
  /// library keeps; whole weights point into the mapped file.
  /// `needed`, when given, marks the weights to read (a pipeline rank's
  /// stages); the others are left null.
  Result<std::vector<const void *>>
  bindWeights(const SafetensorsFile &file, const std::string &path,
              const std::vector<int64_t> &coords = {},
              const std::vector<bool> *needed = nullptr) const;
  /// Ranks the library was partitioned for (the product of its mesh).
  int64_t meshRanks() const;
  /// "tp=2" style description of the mesh axes above size 1, or "one
  /// device".
  std::string describeMesh() const;
  /// Runs the model; the message names the node at fault on failure.
  Status run(const pcc_run_context &context, const void *const *inputs,
             void *const *outputs, const void *const *weights,
             void *arena) const;
  /// Runs one pipeline stage on its own inputs, outputs, weights and arena.
  Status runStage(int32_t stage, const pcc_run_context &context,
                  const void *const *inputs, void *const *outputs,
                  const void *const *weights, void *arena) const;
  /// Whether the library is a training step (pcc --train): it runs by
  /// phases (runPhase) and its weight table is the model state.
  bool isTraining() const { return modelInfo->num_phases > 0; }
  /// Runs one training phase (enum pcc_phase) on its inputs, outputs, model
  /// state and arena.
  Status runPhase(int32_t phase, const pcc_run_context &context,
                  const void *const *inputs, void *const *outputs,
                  void *const *state, void *arena) const;
  /// Whether the library is cut into pipeline stages.
  bool isPipelined() const { return modelInfo->num_stages > 1; }
  /// Model chunks per pipeline rank (above 1: interleaved stages).
  int32_t chunksPerPipelineRank() const {
    return modelInfo->num_stages / modelInfo->num_pipeline_ranks;
  }
  /// The stages pipeline rank `ppRank` runs, in order.
  std::vector<int32_t> stagesOf(int64_t ppRank) const;
  /// The dimension that holds the batch of model input or output `spec`
  /// (one of info().inputs / info().outputs); 0 for other specs.
  int32_t batchDimOf(const pcc_tensor_spec &spec) const;
  /// The shape of model input or output `spec` over the whole batch: every
  /// micro-batch's rows.
  std::vector<int64_t> batchShape(const pcc_tensor_spec &spec) const;

private:
  ModelLibrary() = default;
  /// Checks the stage and schedule tables against each other, so a broken
  /// library fails on open rather than out of bounds in a run.
  Status checkPipeline() const;
  /// Checks the phase and state tables of a training library.
  Status checkPhases() const;
  /// dlclose()s the library.
  struct Closer {
    void operator()(void *handle) const;
  };
  std::string path;
  std::unique_ptr<void, Closer> handle;
  const pcc_model_info *modelInfo = nullptr;
  pcc_model_run_fn runFn = nullptr;
  pcc_model_run_stage_fn runStageFn = nullptr;
  pcc_model_run_phase_fn runPhaseFn = nullptr;
  pcc_model_last_error_fn lastErrorFn = nullptr;
  mutable std::vector<std::unique_ptr<AlignedBuffer>> shardBuffers;
};

/// A split of dimension `dim` of a tensor of `shape` in `stripes` over
/// `ranks` ranks (#pcc.shard): the dimension viewed as [stripes, ranks,
/// chunk], rank `rank` holding chunk `rank` of every stripe. Copies that
/// rank's piece out of the whole tensor (`toPiece`) or back into it.
void copySplitPiece(const std::vector<int64_t> &shape, int64_t elementBytes,
                    int64_t dim, int64_t stripes, int64_t ranks, int64_t rank,
                    uint8_t *whole, uint8_t *piece, bool toPiece);

/// 64-byte aligned scratch memory (the arena, output buffers).
struct AlignedBuffer {
  explicit AlignedBuffer(int64_t bytes);
  ~AlignedBuffer();
  AlignedBuffer(const AlignedBuffer &) = delete;
  AlignedBuffer &operator=(const AlignedBuffer &) = delete;
  void *data() const { return ptr; }
  /// False when the allocation failed.
  bool ok() const { return ptr != nullptr; }

private:
  void *ptr = nullptr;
};

} // namespace pccrt

#endif // PCC_RUNTIME_MODELLIBRARY_H
