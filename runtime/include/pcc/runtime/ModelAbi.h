/*===- ModelAbi.h - the C ABI of a model library built by pcc -----*- C -*-===//
 *
 * A model.so built by `pcc model.onnx -o model.so` exports four functions.
 * pcc-run (or any host program) loads it with dlopen, checks
 * abi_version == PCC_MODEL_ABI_VERSION, maps the weights file, allocates
 * arena_bytes on the device it runs on, and calls pcc_model_run.
 *
 * A pipelined library (`pcc --pp=N`) is cut into stages. Each stage has its
 * own inputs, outputs, weights and arena and runs with pcc_model_run_stage;
 * pipeline rank r runs the instruction list schedules[r], which names the
 * stage, the micro-batch and the peer of every compute step, send and
 * receive. A library that is not pipelined has one stage, the whole model.
 *
 * A training library (`pcc --train`, ABI 6) holds the phases of one
 * training step (pcc_model_info.phases): forward (inputs and labels in;
 * the loss sum and the saved activations out), backward (the saved
 * activations and the loss gradient in; every weight's gradient added into
 * its state), the optimizer step and zero-grad. The weight table is then
 * the model state: weights, their gradients and optimizer state, each
 * with a kind (enum pcc_state_kind), all mutable and owned by the caller.
 *
 * A library holds code for one or more targets (`pcc --target=cpu|cuda|all`).
 * The run context names the target of a call and carries the backend's
 * state; every pointer passed to a run (inputs, outputs, weights, arena)
 * lives in that target's memory: host memory for the CPU, device memory
 * for CUDA.
 *
 *===----------------------------------------------------------------------===*/

#ifndef PCC_RUNTIME_MODELABI_H
#define PCC_RUNTIME_MODELABI_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PCC_MODEL_ABI_VERSION 16

/* The mesh axes pcc plans, as the mesh table (mesh_axes) names them; the
 * compiler's dialect spells them the same (Contracts.h). */
#define PCC_MESH_AXIS_DP "dp"
#define PCC_MESH_AXIS_PP "pp"
#define PCC_MESH_AXIS_TP "tp"

/* Targets, as bits of pcc_model_info.targets. */
enum pcc_target { PCC_TARGET_CPU = 1, PCC_TARGET_CUDA = 2 };

typedef struct pcc_tensor_spec {
  const char *name;
  int32_t dtype; /* enum pcc_dtype */
  int32_t rank;
  const int64_t *shape;
} pcc_tensor_spec;

/* Which slice of a stored weight this library reads (see #pcc.shard):
 * dimension `dim` viewed as [stripes, n, chunk] over the n ranks of mesh
 * axis `axis`, rank r reading chunk r of every stripe. axis -1: the whole
 * weight. dim -1 (ABI 8): ZeRO's flat shard, elements [r * s, (r + 1) * s)
 * of the whole tensor flattened and padded with zeros to n * s elements
 * (s = ceil(elements / n)); the local spec is 1-D [s]. within_axis >= 0
 * (ABI 9, ZeRO with tensor parallelism): the flat shard is of this rank's
 * piece of the split (within_axis, within_dim, within_stripes) of the
 * whole tensor, as above; -1: of the whole tensor. */
typedef struct pcc_weight_shard {
  int32_t axis;
  int32_t dim;
  int64_t stripes;
  int32_t within_axis;
  int32_t within_dim;
  int64_t within_stripes;
} pcc_weight_shard;

/* One step of a pipeline rank's schedule. Forward-only runs use the first
 * three kinds; the others are the training schedules' backward work. */
enum pcc_pipeline_op {
  PCC_PIPE_FORWARD = 0,
  PCC_PIPE_SEND_FORWARD = 1, /* the stage's outputs to the next stage */
  PCC_PIPE_RECV_FORWARD = 2, /* the stage's inputs from the previous one */
  PCC_PIPE_BACKWARD = 3,
  PCC_PIPE_WEIGHT_GRAD = 4,
  PCC_PIPE_SEND_BACKWARD = 5,
  PCC_PIPE_RECV_BACKWARD = 6
};

typedef struct pcc_pipeline_instr {
  int32_t op; /* enum pcc_pipeline_op */
  int32_t microbatch;
  int32_t stage; /* the stage of this rank that computes, sends or
                    receives */
  int32_t peer;  /* sends and receives: the pipeline rank at the
                    other end; -1 otherwise */
} pcc_pipeline_instr;

/* Training (ABI 6). */
enum pcc_phase {
  PCC_PHASE_FORWARD = 0,
  PCC_PHASE_BACKWARD = 1,
  PCC_PHASE_OPTIMIZER = 2,
  PCC_PHASE_ZERO_GRAD = 3,
  /* ABI 10, `pcc --offload=optimizer` (num_phases 6): the optimizer step's
   * device parts around its update, which then runs on the host (CPU
   * code): the collectives no update feeds (the gradients'
   * reduce-scatter, the norm's all-reduce), whose outputs are the
   * update's inputs (input_sources: output s of this phase), and the
   * collectives that read the updated state (ZeRO's all-gather). */
  PCC_PHASE_OPTIMIZER_PRE = 4,
  PCC_PHASE_OPTIMIZER_POST = 5,
  /* ABI 10, pipelined training: a stage's weight gradients (Zero Bubble's
   * W), split from its backward phase (B), which then computes the input
   * cotangents alone and outputs, after them, the values W reads. */
  PCC_PHASE_WEIGHT_GRAD = 6
};

/* What a model-state tensor is. Weights are loaded from the weights file
 * (or a checkpoint); the others start at zero. */
enum pcc_state_kind {
  PCC_STATE_WEIGHT = 0,
  PCC_STATE_GRAD = 1,
  PCC_STATE_OPTIMIZER = 2, /* exp_avg, exp_avg_sq, momentum_buffer */
  PCC_STATE_MASTER = 3,    /* ZeRO-1/2: this rank's flat shard of a weight,
                              updated by the optimizer and all-gathered into
                              the weight; loaded from the weight, not saved */
  PCC_STATE_BUCKET = 4,    /* ABI 9: a gradient bucket, the buffer that the
                              gradients of weight_aliases live in and whose
                              all-reduce starts during the backward pass;
                              zeroed at the start, never saved */
  PCC_STATE_GATHERED = 5   /* a copy of a weight (or of its tensor-
                              parallel piece) that the zero-grad phase makes
                              at the start of every step and all its
                              micro-batches read: ZeRO-3 in a pipeline with
                              the weights kept gathered (all-gathered), or
                              mixed precision's bf16 copy (cast); never
                              saved */
};

/* ABI 10: where a state tensor of an offloaded optimizer lives
 * (pcc_model_info.weight_offload, bits): HOST_ONLY in host memory alone
 * (optimizer state; the update is its only user); else on the device, and
 * also on the host when TO_HOST (copied to the host before the update:
 * gradients) or TO_DEVICE (copied back after it: updated weights) is set. */
enum pcc_offload {
  PCC_OFFLOAD_HOST_ONLY = 1,
  PCC_OFFLOAD_TO_HOST = 2,
  PCC_OFFLOAD_TO_DEVICE = 4
};

/* ABI 9: state that lives inside another state tensor: gradient i is
 * elements [offset, offset + its size) of bucket `state` (-1: its own). */
typedef struct pcc_weight_alias {
  int32_t state;
  int64_t offset;
} pcc_weight_alias;

/* The run's hyperparameters, pcc_run_context.hyper[PCC_HYPER_*], with
 * PyTorch's meaning. STEP counts optimizer steps from 1 (AdamW's bias
 * correction, SGD's first momentum step); MAX_GRAD_NORM <= 0 disables
 * clipping; NESTEROV is 0 or 1. SEED (an integer below 2^53) keys
 * dropout's random numbers, which also depend on STEP and MICROBATCH (the
 * index of the step's micro-batch that the forward and backward phases
 * run), so that a backward phase draws its forward phase's masks again. */
enum pcc_hyper {
  PCC_HYPER_LR = 0,
  PCC_HYPER_BETA1,
  PCC_HYPER_BETA2,
  PCC_HYPER_EPS,
  PCC_HYPER_WEIGHT_DECAY,
  PCC_HYPER_MOMENTUM,
  PCC_HYPER_DAMPENING,
  PCC_HYPER_NESTEROV,
  PCC_HYPER_MAX_GRAD_NORM,
  PCC_HYPER_STEP,
  PCC_HYPER_SEED,
  PCC_HYPER_MICROBATCH,
  PCC_HYPER_LAST_MICROBATCH, /* ABI 9: 1 in the step's last micro-batch */
  /* ABI 14, fp16 loss scaling: the factor the optimizer multiplies the
   * gradients (and their norm, for clipping) by, 1 / the loss scale (1
   * without); and 1 when an update whose gradient norm is not finite (an
   * overflow) is skipped, leaving the weights and optimizer state as they
   * are (PyTorch's GradScaler.step). */
  PCC_HYPER_GRAD_SCALE,
  PCC_HYPER_SKIP_NONFINITE,
  /* ABI 16, mixed precision: 1 when the weights' 16-bit copies may not
   * hold the weights (the run's first step, or weights loaded or written
   * since the last step), so the zero-grad phase casts them again
   * (pcc.refresh_copy); 0 when the last step's optimizer wrote them. A
   * caller that does not track it passes 1. */
  PCC_HYPER_REFRESH_COPIES,
  PCC_NUM_HYPER
};

/* A backward input that is not a forward output: the gradient of the loss
 * sum (one over the number of labels of the whole step's batch). */
#define PCC_SOURCE_LOSS_GRAD (-1000000)
/* ABI 10, a pipelined training library: a backward input that is the
 * cotangent of the stage's forward output j, received from the next
 * stage (its backward output whose output_targets entry is the forward
 * input fed by output j). */
#define PCC_SOURCE_OUTPUT_GRAD_BASE (-2000000)
#define PCC_SOURCE_OUTPUT_GRAD(j) (PCC_SOURCE_OUTPUT_GRAD_BASE - (j))
/* ABI 10: a weight-gradient input that is output j of the stage's
 * backward phase (a value B computed for W). */
#define PCC_SOURCE_BACKWARD_OUTPUT_BASE (-3000000)
#define PCC_SOURCE_BACKWARD_OUTPUT(j) (PCC_SOURCE_BACKWARD_OUTPUT_BASE - (j))

/* One phase of a training step. */
typedef struct pcc_phase_info {
  int32_t phase; /* enum pcc_phase */
  int32_t num_inputs;
  const pcc_tensor_spec *inputs;
  /* Per input: -1 - k is model input k (forward; the labels are the last
   * model input), s >= 0 is output s of the forward phase (backward: a
   * saved activation), PCC_SOURCE_LOSS_GRAD the loss gradient. */
  const int32_t *input_sources;
  int32_t num_outputs;
  const pcc_tensor_spec *outputs; /* forward: loss sum first; optimizer:
                                     the global gradient norm */
  int32_t num_state;
  const int32_t *state; /* indices into pcc_model_info.weights */
  int64_t arena_bytes;
  /* ABI 10: the pipeline stage the phase belongs to (0 unpipelined; the
   * pipeline rank for a pipelined optimizer or zero-grad phase), and for a
   * pipelined backward phase, per output the forward input whose
   * cotangent it is (sent to the previous stage), -1 for an output that
   * only the weight-gradient phase reads; null otherwise. */
  int32_t stage;
  const int32_t *output_targets;
} pcc_phase_info;

/* One pipeline stage: a program over one micro-batch. */
typedef struct pcc_stage_info {
  int32_t num_inputs;
  const pcc_tensor_spec *inputs;
  /* Where each input comes from: s >= 0 is output s of the previous stage
   * (received with PCC_PIPE_RECV_FORWARD), -1 - k is model input k (the
   * micro-batch's rows of it). */
  const int32_t *input_sources;
  int32_t num_outputs;
  const pcc_tensor_spec *outputs; /* the last stage's are the model's */
  int32_t num_weights;
  const int32_t *weights; /* indices into pcc_model_info.weights, in the
                             order pcc_model_run_stage reads them */
  int64_t arena_bytes;
} pcc_stage_info;

typedef struct pcc_model_info {
  uint32_t abi_version;
  uint32_t targets;         /* bits of enum pcc_target */
  const char *target;       /* "cpu", "cuda" or "cpu+cuda" */
  const char *source;       /* the model it was compiled from */
  const char *weights_file; /* file name of the weights, beside the .so */
  int32_t num_inputs;
  const pcc_tensor_spec *inputs;
  int32_t num_outputs;
  const pcc_tensor_spec *outputs;
  int32_t num_weights;
  const pcc_tensor_spec *weights;
  int64_t arena_bytes; /* scratch memory pcc_model_run needs */
  /* The device mesh the library was partitioned for: axis names and sizes
   * (e.g. dp, pp, tp). A run needs one rank per mesh position; the rank's
   * coordinate on the last axis varies fastest. */
  int32_t num_mesh_axes;
  const char *const *mesh_axes;
  const int64_t *mesh_sizes;
  const pcc_weight_shard *weight_shards; /* one per weight */
  /* Pipelining. Every input and output carries the batch in one dimension
   * (input_batch_dims / output_batch_dims below, found by pcc's batch
   * analysis), split into `microbatches` equal parts; the specs above and
   * the stages' are one micro-batch's. The runtime's whole-batch buffers
   * hold micro-batch after micro-batch (pcc-run reorders the user's arrays
   * when the batch is not dimension 0). */
  int32_t microbatches;
  int32_t num_stages;
  const pcc_stage_info *stages;
  int32_t pipeline_axis; /* index into mesh_axes of the pipeline axis; -1 */
  int32_t num_pipeline_ranks;
  const int32_t *schedule_lengths;            /* per pipeline rank */
  const pcc_pipeline_instr *const *schedules; /* per pipeline rank */
  const char *schedule_policy;      /* "gpipe", "1f1b", ...; "" unpipelined */
  const int32_t *input_batch_dims;  /* per input (ABI 5) */
  const int32_t *output_batch_dims; /* per output (ABI 5) */
  /* Training (ABI 6); num_phases is 0 for an inference library. A
   * pipelined training library (ABI 10) has 3 phases per stage (forward,
   * backward and weight-gradient of stage k at 3 k, 3 k + 1, 3 k + 2),
   * then 2 per pipeline rank (optimizer and zero-grad of rank r at
   * 3 S + 2 r and 3 S + 2 r + 1, S stages); pipeline rank r runs stages
   * r, r + P, ... (P pipeline ranks). Its stages table gives each stage's
   * forward inputs and outputs, and schedules the F/B/W order per rank. */
  int32_t num_phases;
  const pcc_phase_info *phases; /* indexed by enum pcc_phase */
  const int32_t *weight_kinds;  /* per weight: enum pcc_state_kind */
  const int32_t *weight_owners; /* per weight: the weight it belongs to
                                   (itself for a weight) */
  const char *loss;             /* "cross_entropy", "mse", "none"; "" */
  const char *optimizer;        /* "sgd", "adamw"; "" */
  int64_t ignore_index;         /* cross_entropy's ignored label */
  /* Per weight (ABI 8): the whole tensor, as stored in the weights file and
   * in checkpoints (the weights' specs above are this rank's pieces). */
  const pcc_tensor_spec *whole_weights;
  /* Per weight (ABI 9): where it lives when inside a gradient bucket. */
  const pcc_weight_alias *weight_aliases;
  /* Per weight (ABI 10): enum pcc_offload bits; 0 without --offload. */
  const int32_t *weight_offload;
  /* The ZeRO stage (0 to 3) it was compiled for (ABI 13). */
  int32_t zero_stage;
  /* ABI 14: the precision its products compute in ("fp32", "bf16" or
   * "fp16"), and fp16 training's loss scaling: the scale the run starts at
   * (0: none), and the steps without an overflow after which a dynamic
   * scale doubles (0: a static scale; an overflow halves a dynamic one). */
  const char *precision;
  double loss_scale;
  int32_t loss_scale_window;
} pcc_model_info;

/* The collectives of one mesh axis, bound by the runtime to MPI or NCCL.
 * Counts are elements of `dtype`; gathers and scatters take the count per
 * rank. A call returns 0 on success; on failure last_error names the rank,
 * the group and the collective. On CUDA the call is queued on the run's
 * stream. */
typedef struct pcc_comm {
  void *group;
  int32_t rank;
  int32_t size;
  int (*all_reduce)(void *group, const void *send, void *recv, int64_t count,
                    int32_t dtype);
  int (*all_gather)(void *group, const void *send, void *recv,
                    int64_t count_per_rank, int32_t dtype);
  int (*reduce_scatter)(void *group, const void *send, void *recv,
                        int64_t count_per_rank, int32_t dtype);
  const char *(*last_error)(void *group);
  /* ABI 9: what the next collective computes, for the watchdog's and the
   * errors' messages ("node '/blocks.0/attn/proj/MatMul' (MatMul)"); the
   * string outlives the call. May be null. */
  void (*set_label)(void *group, const char *label);
  /* ABI 9: an in-place sum of `buffer` over the group that may still run
   * when the call returns (a gradient bucket during the backward pass);
   * wait_all completes every one started on the group, and progress lets
   * them advance (MPI moves data only inside its calls). */
  int (*all_reduce_start)(void *group, void *buffer, int64_t count,
                          int32_t dtype);
  int (*wait_all)(void *group);
  void (*progress)(void *group);
  /* ABI 11: this rank's slice of the sum over the group of `send` ([size,
   * count_per_rank]) into `recv`, which may still run when the call returns
   * (ZeRO's gradient buckets); wait_all completes it. In place when `recv`
   * is send + rank * count_per_rank elements (ncclReduceScatter's form). */
  int (*reduce_scatter_start)(void *group, const void *send, void *recv,
                              int64_t count_per_rank, int32_t dtype);
  /* ABI 12: every rank's `send` stacked into `recv` ([size,
   * count_per_rank]), which may still run when the call returns (ZeRO 3's
   * prefetch of the next weight). The collectives started on a group are
   * numbered 1, 2, ... in the order they start; `started` returns the
   * number of the latest, and wait_through completes every one numbered up
   * to `ticket` (they complete in order; later ones may still run). */
  int (*all_gather_start)(void *group, const void *send, void *recv,
                          int64_t count_per_rank, int32_t dtype);
  int64_t (*started)(void *group);
  int (*wait_through)(void *group, int64_t ticket);
} pcc_comm;

/* ABI 15, profiling (pcc-run --profile): one op of a generated run
 * function, a static table entry of the library. `flops` is the arithmetic
 * of one call (multiply-adds count 2; 0 where the op is not arithmetic);
 * `bytes` what its operands and results hold, the least it moves. */
typedef struct pcc_profile_site {
  const char *op;       /* "matmul", "fusion", "all_reduce", ... */
  const char *node;     /* the ONNX node, or what a pass named it */
  const char *function; /* the planned function: "train_forward", "main" */
  const char *dtype;    /* the element type it computes in: "f32", "bf16" */
  double flops;
  double bytes;
} pcc_profile_site;

/* The profiler of a run: before each op its run function calls
 * mark(state, &site); the caller calls mark(state, null) when the run
 * function returns, so the time between two marks is the earlier site's. */
typedef struct pcc_profile {
  void *state;
  void (*mark)(void *state, const pcc_profile_site *site);
} pcc_profile;

/* What one run executes on. */
typedef struct pcc_run_context {
  int32_t target; /* one enum pcc_target */
  int32_t device; /* CUDA device ordinal; 0 on the CPU */
  void *backend;  /* pcc_cuda_context * for CUDA; null on the CPU */
  /* One per mesh axis, in the order of pcc_model_info.mesh_axes; null is
   * allowed when every axis has size 1. */
  const pcc_comm *comms;
  /* Training: PCC_NUM_HYPER values (enum pcc_hyper) on the host; null for
   * inference. */
  const double *hyper;
  /* ABI 15: the profiler, or null (no profiling; the generated code then
   * only tests this pointer before each op). */
  const pcc_profile *profile;
} pcc_run_context;

typedef const pcc_model_info *(*pcc_model_get_info_fn)(void);
typedef int (*pcc_model_run_fn)(const pcc_run_context *context,
                                const void *const *inputs, void *const *outputs,
                                const void *const *weights, void *arena);
typedef int (*pcc_model_run_stage_fn)(int32_t stage,
                                      const pcc_run_context *context,
                                      const void *const *inputs,
                                      void *const *outputs,
                                      const void *const *weights, void *arena);
typedef int (*pcc_model_run_phase_fn)(int32_t phase,
                                      const pcc_run_context *context,
                                      const void *const *inputs,
                                      void *const *outputs, void *const *state,
                                      void *arena);
typedef const char *(*pcc_model_last_error_fn)(void);

/* Exported by every model library. pcc_model_run returns 0 on success, the
 * outputs written (on CUDA: the stream synchronised); on failure
 * pcc_model_last_error() names the ONNX node at fault. A pipelined library
 * refuses pcc_model_run: its stages run one at a time with
 * pcc_model_run_stage, whose inputs, outputs, weights and arena are the
 * stage's (pcc_stage_info). */
const pcc_model_info *pcc_model_get_info(void);
int pcc_model_run(const pcc_run_context *context, const void *const *inputs,
                  void *const *outputs, const void *const *weights,
                  void *arena);
int pcc_model_run_stage(int32_t stage, const pcc_run_context *context,
                        const void *const *inputs, void *const *outputs,
                        const void *const *weights, void *arena);
/* Runs one phase of a training step (pcc_phase_info): its inputs,
 * outputs, model state (indices pcc_phase_info.state into the weight
 * table; written in place) and an arena of its arena_bytes. */
int pcc_model_run_phase(int32_t phase, const pcc_run_context *context,
                        const void *const *inputs, void *const *outputs,
                        void *const *state, void *arena);
const char *pcc_model_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* PCC_RUNTIME_MODELABI_H */
