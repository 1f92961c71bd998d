//===- ModelLibrary.cpp - loading and running a model library -------------===//

#include "pcc/runtime/ModelLibrary.h"

#include "pcc/runtime/Device.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>

namespace pccrt {

std::vector<int64_t> specShape(const pcc_tensor_spec &spec) {
  return std::vector<int64_t>(spec.shape, spec.shape + spec.rank);
}

int64_t specBytes(const pcc_tensor_spec &spec) {
  return elementCount(specShape(spec)) *
         dtypeSize(static_cast<DType>(spec.dtype));
}

std::string describeSpec(const pcc_tensor_spec &spec) {
  return std::string(dtypeName(static_cast<DType>(spec.dtype))) + " " +
         shapeString(specShape(spec));
}

Result<ModelLibrary> ModelLibrary::open(const std::string &path) {
  // dlopen searches the library path for names without a slash.
  std::string where = path.find('/') == std::string::npos ? "./" + path : path;
  void *handle = dlopen(where.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle)
    return Error{"cannot load '" + path + "': " + dlerror()};
  ModelLibrary lib;
  lib.path = path;
  lib.handle.reset(handle);
  auto getInfo = reinterpret_cast<pcc_model_get_info_fn>(
      dlsym(handle, "pcc_model_get_info"));
  lib.runFn =
      reinterpret_cast<pcc_model_run_fn>(dlsym(handle, "pcc_model_run"));
  lib.lastErrorFn = reinterpret_cast<pcc_model_last_error_fn>(
      dlsym(handle, "pcc_model_last_error"));
  lib.runStageFn = reinterpret_cast<pcc_model_run_stage_fn>(
      dlsym(handle, "pcc_model_run_stage"));
  if (!getInfo || !lib.runFn || !lib.lastErrorFn)
    return Error{"'" + path +
                 "' is not a pcc model library (it does not export "
                 "pcc_model_run)"};
  lib.modelInfo = getInfo();
  if (lib.modelInfo->abi_version != PCC_MODEL_ABI_VERSION)
    return Error{"'" + path + "' was built for model ABI version " +
                 std::to_string(lib.modelInfo->abi_version) +
                 " but this runtime speaks " +
                 std::to_string(PCC_MODEL_ABI_VERSION) +
                 "; rebuild it with the matching pcc"};
  if (!lib.runStageFn)
    return Error{"'" + path + "' does not export pcc_model_run_stage"};
  Status tables = lib.checkPipeline();
  if (!tables.ok())
    return Error{"'" + path +
                 "' has a broken pipeline table: " + tables.error()};
  lib.runPhaseFn = reinterpret_cast<pcc_model_run_phase_fn>(
      dlsym(handle, "pcc_model_run_phase"));
  if (!lib.runPhaseFn)
    return Error{"'" + path + "' does not export pcc_model_run_phase"};
  Status phases = lib.checkPhases();
  if (!phases.ok())
    return Error{"'" + path +
                 "' has a broken training table: " + phases.error()};
  return lib;
}

void ModelLibrary::Closer::operator()(void *handle) const { dlclose(handle); }

std::string ModelLibrary::defaultWeightsPath() const {
  size_t slash = path.find_last_of('/');
  std::string dir = slash == std::string::npos ? "" : path.substr(0, slash + 1);
  return dir + modelInfo->weights_file;
}

int64_t ModelLibrary::meshRanks() const {
  int64_t ranks = 1;
  for (int i = 0; i < modelInfo->num_mesh_axes; ++i)
    ranks *= modelInfo->mesh_sizes[i];
  return ranks;
}

std::string ModelLibrary::describeMesh() const {
  std::string s;
  for (int i = 0; i < modelInfo->num_mesh_axes; ++i)
    if (modelInfo->mesh_sizes[i] > 1)
      s += (s.empty() ? "" : " ") + std::string(modelInfo->mesh_axes[i]) + "=" +
           std::to_string(modelInfo->mesh_sizes[i]);
  return s.empty() ? "one device" : s;
}

Result<std::vector<const void *>> ModelLibrary::bindWeights(
    const SafetensorsFile &file, const std::string &weightsPath,
    const std::vector<int64_t> &coords, const std::vector<bool> *needed) const {
  std::vector<const void *> pointers;
  for (int i = 0; i < modelInfo->num_weights; ++i) {
    if (needed && !(*needed)[i]) {
      pointers.push_back(nullptr);
      continue;
    }
    const pcc_tensor_spec &spec = modelInfo->weights[i];
    const pcc_weight_shard &shard = modelInfo->weight_shards[i];
    if (shard.axis >= 0 && shard.dim < 0)
      return Error{std::string("weight '") + spec.name +
                   "' is a ZeRO shard of training state; only a training "
                   "run (pcc-run --steps) loads it"};
    const TensorEntry *entry = file.find(spec.name);
    if (!entry)
      return Error{"weights file '" + weightsPath + "' has no tensor '" +
                   spec.name + "' (was it written for another model?)"};
    std::vector<int64_t> whole = specShape(spec);
    int64_t ranks = 1, rank = 0;
    if (shard.axis >= 0) {
      ranks = modelInfo->mesh_sizes[shard.axis];
      rank = static_cast<size_t>(shard.axis) < coords.size()
                 ? coords[shard.axis]
                 : 0;
      whole[shard.dim] *= ranks;
    }
    if (entry->dtype != static_cast<DType>(spec.dtype) || entry->shape != whole)
      return Error{"weights file '" + weightsPath + "': tensor '" + spec.name +
                   "' is " + std::string(dtypeName(entry->dtype)) + " " +
                   shapeString(entry->shape) + " but the model needs " +
                   std::string(dtypeName(static_cast<DType>(spec.dtype))) +
                   " " + shapeString(whole)};
    const char *data = reinterpret_cast<const char *>(file.data(*entry));
    if (shard.axis < 0) {
      pointers.push_back(data);
      continue;
    }
    int64_t element = dtypeSize(entry->dtype);
    auto buffer = std::make_unique<AlignedBuffer>(
        elementCount(specShape(spec)) * element);
    if (!buffer->ok())
      return Error{"out of memory for the slice of weight '" +
                   std::string(spec.name) + "'"};
    copySplitPiece(whole, element, shard.dim, shard.stripes, ranks, rank,
                   reinterpret_cast<uint8_t *>(const_cast<char *>(data)),
                   static_cast<uint8_t *>(buffer->data()), /*toPiece=*/true);
    pointers.push_back(buffer->data());
    shardBuffers.push_back(std::move(buffer));
  }
  return pointers;
}

void copySplitPiece(const std::vector<int64_t> &shape, int64_t elementBytes,
                    int64_t dim, int64_t stripes, int64_t ranks, int64_t rank,
                    uint8_t *whole, uint8_t *piece, bool toPiece) {
  int64_t pre = 1, post = 1;
  for (int64_t d = 0; d < dim; ++d)
    pre *= shape[d];
  for (size_t d = dim + 1; d < shape.size(); ++d)
    post *= shape[d];
  int64_t chunk = shape[dim] / (stripes * ranks);
  int64_t bytes = chunk * post * elementBytes;
  for (int64_t p = 0; p < pre * stripes; ++p) {
    uint8_t *w = whole + (p * ranks + rank) * bytes;
    uint8_t *l = piece + p * bytes;
    std::memcpy(toPiece ? l : w, toPiece ? w : l, static_cast<size_t>(bytes));
  }
}

Status ModelLibrary::run(const pcc_run_context &context,
                         const void *const *inputs, void *const *outputs,
                         const void *const *weights, void *arena) const {
  int rc = runFn(&context, inputs, outputs, weights, arena);
  closeProfile(context);
  if (rc != 0)
    return Error{std::string("the model failed: ") + lastErrorFn()};
  return Status::success();
}

Status ModelLibrary::checkPipeline() const {
  const pcc_model_info &info = *modelInfo;
  int32_t stages = info.num_stages, ranks = info.num_pipeline_ranks;
  int32_t m = info.microbatches;
  if (stages < 1 || ranks < 1 || m < 1 || stages % ranks != 0)
    return Error{std::to_string(stages) + " stages, " + std::to_string(ranks) +
                 " pipeline ranks, " + std::to_string(m) + " micro-batches"};
  if (stages > 1 &&
      (info.pipeline_axis < 0 || info.pipeline_axis >= info.num_mesh_axes ||
       info.mesh_sizes[info.pipeline_axis] != ranks))
    return Error{"the pipeline axis does not match the " +
                 std::to_string(ranks) + " pipeline ranks"};
  for (int32_t k = 0; k < stages; ++k) {
    const pcc_stage_info &stage = info.stages[k];
    for (int i = 0; i < stage.num_inputs; ++i) {
      int32_t s = stage.input_sources[i];
      bool ok = s < 0 ? -1 - s < info.num_inputs
                      : k > 0 && s < info.stages[k - 1].num_outputs;
      if (!ok)
        return Error{"stage " + std::to_string(k) + " input " +
                     std::to_string(i) + " has no source " + std::to_string(s)};
    }
    for (int i = 0; i < stage.num_weights; ++i)
      if (stage.weights[i] < 0 || stage.weights[i] >= info.num_weights)
        return Error{"stage " + std::to_string(k) + " reads weight " +
                     std::to_string(stage.weights[i])};
  }
  if (info.stages[stages - 1].num_outputs != info.num_outputs)
    return Error{"the last stage does not return the model's outputs"};
  for (int32_t r = 0; r < ranks; ++r)
    for (int32_t n = 0; n < info.schedule_lengths[r]; ++n) {
      const pcc_pipeline_instr &instr = info.schedules[r][n];
      bool p2p = instr.op == PCC_PIPE_SEND_FORWARD ||
                 instr.op == PCC_PIPE_RECV_FORWARD;
      bool ok =
          instr.microbatch >= 0 && instr.microbatch < m && instr.stage >= 0 &&
          instr.stage < stages && instr.stage % ranks == r &&
          (!p2p || (instr.peer >= 0 && instr.peer < ranks)) &&
          !(instr.op == PCC_PIPE_SEND_FORWARD && instr.stage == stages - 1) &&
          !(instr.op == PCC_PIPE_RECV_FORWARD && instr.stage == 0);
      if (!ok)
        return Error{"pipeline rank " + std::to_string(r) + " step " +
                     std::to_string(n) + " (op " + std::to_string(instr.op) +
                     ", micro-batch " + std::to_string(instr.microbatch) +
                     ", stage " + std::to_string(instr.stage) + ", peer " +
                     std::to_string(instr.peer) + ")"};
    }
  return Status::success();
}

Status ModelLibrary::runStage(int32_t stage, const pcc_run_context &context,
                              const void *const *inputs, void *const *outputs,
                              const void *const *weights, void *arena) const {
  int rc = runStageFn(stage, &context, inputs, outputs, weights, arena);
  closeProfile(context);
  if (rc != 0)
    return Error{"stage " + std::to_string(stage) +
                 " failed: " + lastErrorFn()};
  return Status::success();
}

Status ModelLibrary::runPhase(int32_t phase, const pcc_run_context &context,
                              const void *const *inputs, void *const *outputs,
                              void *const *state, void *arena) const {
  static const char *const names[] = {"forward",   "backward",
                                      "optimizer", "zero-grad",
                                      "optimizer's device part before the update",
                                      "optimizer's device part after the update"};
  int rc = runPhaseFn(phase, &context, inputs, outputs, state, arena);
  closeProfile(context);
  if (rc != 0) {
    const pcc_model_info &info = *modelInfo;
    bool known = phase >= 0 && phase < info.num_phases;
    int32_t kind = known ? info.phases[phase].phase : -1;
    std::string stage = isPipelined() && known
                            ? " of stage " +
                                  std::to_string(info.phases[phase].stage)
                            : std::string();
    return Error{std::string("the ") +
                 (kind >= 0 && kind < 6 ? names[kind] : "unknown") +
                 " phase" + stage + " failed: " + lastErrorFn()};
  }
  return Status::success();
}

Status ModelLibrary::checkPhases() const {
  const pcc_model_info &info = *modelInfo;
  if (info.num_phases == 0)
    return Status::success();
  bool pipelined = info.num_stages > 1;
  int32_t S = info.num_stages, P = info.num_pipeline_ranks;
  if ((pipelined ? P < 1 || S % P != 0 || info.num_phases != 3 * S + 2 * P
                 : info.num_phases != 4 && info.num_phases != 6) ||
      !info.phases || !info.weight_kinds || !info.weight_owners ||
      !info.weight_offload)
    return Error{"a training library has 4 phases (6 with an offloaded "
                 "optimizer; 3 per stage and 2 per pipeline rank when "
                 "pipelined) with state tables"};
  for (int i = 0; i < info.num_weights; ++i)
    if (info.weight_kinds[i] < PCC_STATE_WEIGHT ||
        info.weight_kinds[i] > PCC_STATE_GATHERED ||
        info.weight_owners[i] < 0 || info.weight_owners[i] >= info.num_weights)
      return Error{"state " + std::to_string(i) + " has a bad kind or owner"};
  static const int32_t kStageKinds[] = {PCC_PHASE_FORWARD, PCC_PHASE_BACKWARD,
                                        PCC_PHASE_WEIGHT_GRAD};
  for (int k = 0; k < info.num_phases; ++k) {
    const pcc_phase_info &phase = info.phases[k];
    bool perStage = pipelined && k < 3 * S;
    int32_t kind = !pipelined ? k
                   : perStage ? kStageKinds[k % 3]
                              : PCC_PHASE_OPTIMIZER + (k - 3 * S) % 2;
    int32_t owner = !pipelined ? 0 : perStage ? k / 3 : (k - 3 * S) / 2;
    if (phase.phase != kind || phase.stage != owner)
      return Error{"phase " + std::to_string(k) + " is out of order"};
    for (int s = 0; s < phase.num_state; ++s)
      if (phase.state[s] < 0 || phase.state[s] >= info.num_weights)
        return Error{"phase " + std::to_string(k) + " reads state " +
                     std::to_string(phase.state[s]) + " of " +
                     std::to_string(info.num_weights)};
    if (pipelined && !perStage && phase.num_inputs != 0)
      return Error{"phase " + std::to_string(k) + " takes inputs"};
    for (int i = 0; i < phase.num_inputs && perStage; ++i) {
      int32_t source = phase.input_sources[i];
      const pcc_stage_info &stage = info.stages[owner];
      const pcc_phase_info &forward = info.phases[3 * owner];
      const pcc_phase_info &backward = info.phases[3 * owner + 1];
      bool cotangentOrSaved =
          (source == PCC_SOURCE_LOSS_GRAD && owner + 1 == S) ||
          (source <= PCC_SOURCE_OUTPUT_GRAD_BASE &&
           source > PCC_SOURCE_BACKWARD_OUTPUT_BASE &&
           PCC_SOURCE_OUTPUT_GRAD_BASE - source < stage.num_outputs) ||
          (source >= 0 && source < forward.num_outputs);
      bool ok =
          (kind == PCC_PHASE_FORWARD &&
           ((source < 0 && -1 - source < info.num_inputs) ||
            (source >= 0 && owner > 0 &&
             source < info.stages[owner - 1].num_outputs))) ||
          (kind == PCC_PHASE_BACKWARD && cotangentOrSaved) ||
          (kind == PCC_PHASE_WEIGHT_GRAD &&
           (cotangentOrSaved ||
            (source <= PCC_SOURCE_BACKWARD_OUTPUT_BASE &&
             PCC_SOURCE_BACKWARD_OUTPUT_BASE - source < backward.num_outputs)));
      if (!ok)
        return Error{"phase " + std::to_string(k) + " input " +
                     std::to_string(i) + " has a bad source " +
                     std::to_string(source)};
    }
    for (int o = 0; perStage && kind == PCC_PHASE_BACKWARD &&
                    o < phase.num_outputs;
         ++o)
      if (!phase.output_targets || phase.output_targets[o] < -1 ||
          phase.output_targets[o] >= info.phases[k - 1].num_inputs)
        return Error{"phase " + std::to_string(k) + " output " +
                     std::to_string(o) + " names no forward input"};
    for (int i = 0; i < phase.num_inputs && !pipelined; ++i) {
      int32_t source = phase.input_sources[i];
      bool ok = (k == PCC_PHASE_FORWARD && source < 0 &&
                 -1 - source < info.num_inputs) ||
                (k == PCC_PHASE_BACKWARD &&
                 (source == PCC_SOURCE_LOSS_GRAD ||
                  (source >= 0 &&
                   source < info.phases[PCC_PHASE_FORWARD].num_outputs))) ||
                (k == PCC_PHASE_OPTIMIZER && info.num_phases == 6 &&
                 source >= 0 &&
                 source < info.phases[PCC_PHASE_OPTIMIZER_PRE].num_outputs);
      if (!ok)
        return Error{"phase " + std::to_string(k) + " input " +
                     std::to_string(i) + " has a bad source " +
                     std::to_string(source)};
    }
  }
  return Status::success();
}

std::vector<int32_t> ModelLibrary::stagesOf(int64_t ppRank) const {
  std::vector<int32_t> stages;
  int64_t ranks = std::max<int32_t>(modelInfo->num_pipeline_ranks, 1);
  for (int32_t s = 0; s < modelInfo->num_stages; ++s)
    if (s % ranks == ppRank)
      stages.push_back(s);
  return stages;
}

int32_t ModelLibrary::batchDimOf(const pcc_tensor_spec &spec) const {
  const pcc_model_info &info = *modelInfo;
  if (info.input_batch_dims && &spec >= info.inputs &&
      &spec < info.inputs + info.num_inputs)
    return info.input_batch_dims[&spec - info.inputs];
  if (info.output_batch_dims && &spec >= info.outputs &&
      &spec < info.outputs + info.num_outputs)
    return info.output_batch_dims[&spec - info.outputs];
  return 0;
}

std::vector<int64_t>
ModelLibrary::batchShape(const pcc_tensor_spec &spec) const {
  std::vector<int64_t> shape = specShape(spec);
  int32_t dim = batchDimOf(spec);
  if (dim >= 0 && dim < static_cast<int32_t>(shape.size()))
    shape[dim] *= modelInfo->microbatches;
  return shape;
}

AlignedBuffer::AlignedBuffer(int64_t bytes) {
  size_t size = static_cast<size_t>(std::max<int64_t>(bytes, 64));
  size = (size + 63) / 64 * 64;
  ptr = std::aligned_alloc(64, size); // null on failure: see ok()
}

AlignedBuffer::~AlignedBuffer() { std::free(ptr); }

} // namespace pccrt
