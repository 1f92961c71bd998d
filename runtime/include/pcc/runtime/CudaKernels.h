/*===- CudaKernels.h - the CUDA backend of the runtime ------------*- C -*-===//
 *
 * The C ABI between code that pcc generates for the CUDA target and the
 * runtime's CUDA backend (libpcc_runtime_cuda.so), plus the few device
 * calls a host program (pcc-run) needs to run such a model.
 *
 * Every kernel takes the execution context first and is asynchronous on the
 * context's stream. Tensor pointers are device pointers; shape, stride and
 * attribute arrays are host arrays (static in the generated code) that the
 * call copies into the launch. Semantics match CpuKernels.h call for call,
 * so the generated host code of both targets has the same structure.
 *
 * Errors that depend on run-time data (an out-of-range gather index) cannot
 * be reported by an asynchronous kernel: the kernel records the call site's
 * number in the context and pcc_cuda_finish() returns it, so the generated
 * code can name the ONNX node at fault.
 *
 *===----------------------------------------------------------------------===*/

#ifndef PCC_RUNTIME_CUDAKERNELS_H
#define PCC_RUNTIME_CUDAKERNELS_H

#include "pcc/runtime/AttentionShape.h"
#include "pcc/runtime/LinearCrossEntropyShape.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A device, its stream, cuBLAS handle and error flag. Opaque. */
typedef struct pcc_cuda_context pcc_cuda_context;

/*--- Host side: contexts and memory -------------------------------------*/

/* The message of the last failing call on this thread. */
const char *pcc_cuda_last_error(void);

/* Number of CUDA devices; 0 (and a message) when there is no usable one. */
int pcc_cuda_device_count(void);

/* Creates a context on `device`: selects it, makes a stream, a cuBLAS
 * handle and the error flag. Returns null (see pcc_cuda_last_error) on
 * failure. */
pcc_cuda_context *pcc_cuda_context_create(int device);
void pcc_cuda_context_destroy(pcc_cuda_context *ctx);
/* "NVIDIA H100 80GB HBM3 (sm_90, 79.1 GiB)" */
const char *pcc_cuda_device_name(const pcc_cuda_context *ctx);
/* The cudaStream_t generated kernels are launched on. */
void *pcc_cuda_stream(pcc_cuda_context *ctx);
/* The device the context was created on. */
int pcc_cuda_device_ordinal(const pcc_cuda_context *ctx);

/* Device memory; these return 0 on success, non-zero with a message. */
int pcc_cuda_malloc(pcc_cuda_context *ctx, void **ptr, int64_t bytes);
void pcc_cuda_free(pcc_cuda_context *ctx, void *ptr);
int pcc_cuda_copy_to_device(pcc_cuda_context *ctx, void *dst, const void *src,
                            int64_t bytes);
int pcc_cuda_copy_to_host(pcc_cuda_context *ctx, void *dst, const void *src,
                          int64_t bytes);
/* Waits for the stream. */
int pcc_cuda_synchronize(pcc_cuda_context *ctx);

/* Ends a model run: waits for the stream, then returns 0 when all went
 * well, the site number (> 0) passed to the first kernel that found bad
 * data, or -1 on a CUDA error (message in pcc_cuda_last_error). Clears the
 * recorded site. */
int pcc_cuda_finish(pcc_cuda_context *ctx);

/* CUDA graphs: between capture_begin and capture_end, a model run is
 * recorded instead of executed (pcc_cuda_finish does not wait); graph_run
 * replays it and returns what pcc_cuda_finish would. Return 0 on success,
 * -1 with a message. */
int pcc_cuda_capture_begin(pcc_cuda_context *ctx);
int pcc_cuda_capture_end(pcc_cuda_context *ctx);
int pcc_cuda_graph_run(pcc_cuda_context *ctx);

/* Checks the last kernel launch (cudaGetLastError); 0 when it succeeded. */
int pcc_cuda_check_launch(pcc_cuda_context *ctx);

/*--- Kernels: as in CpuKernels.h, with the context first ----------------*/

/* cuBLAS SGEMM (strided batched when batch > 1), row-major operands. */
void pcc_cuda_matmul_f32(pcc_cuda_context *ctx, const float *a, const float *b,
                         float *c, int64_t batch, int64_t m, int64_t n,
                         int64_t k, int trans_a, int trans_b, int64_t stride_a,
                         int64_t stride_b);
/* pcc_cuda_matmul_f32 on bf16 operands and result, fp32 accumulation. */
void pcc_cuda_matmul_bf16(pcc_cuda_context *ctx, const void *a, const void *b,
                          void *c, int64_t batch, int64_t m, int64_t n,
                          int64_t k, int trans_a, int trans_b, int64_t stride_a,
                          int64_t stride_b);
/* The same on fp16 operands and result. */
void pcc_cuda_matmul_f16(pcc_cuda_context *ctx, const void *a, const void *b,
                         void *c, int64_t batch, int64_t m, int64_t n,
                         int64_t k, int trans_a, int trans_b, int64_t stride_a,
                         int64_t stride_b);
/* The same two with an fp32 result, the accumulator unrounded. */
void pcc_cuda_matmul_bf16_f32(pcc_cuda_context *ctx, const void *a,
                              const void *b, float *c, int64_t batch, int64_t m,
                              int64_t n, int64_t k, int trans_a, int trans_b,
                              int64_t stride_a, int64_t stride_b);
void pcc_cuda_matmul_f16_f32(pcc_cuda_context *ctx, const void *a,
                             const void *b, float *c, int64_t batch, int64_t m,
                             int64_t n, int64_t k, int trans_a, int trans_b,
                             int64_t stride_a, int64_t stride_b);

/* rank <= 8. */
void pcc_cuda_copy_strided(pcc_cuda_context *ctx, const void *x, void *y,
                           int64_t elem_size, int64_t rank,
                           const int64_t *shape, const int64_t *x_strides,
                           int64_t x_offset, const int64_t *y_strides,
                           int64_t y_offset);

/* An index outside [-axis_dim, axis_dim) records `site` and writes zeros. */
void pcc_cuda_gather(pcc_cuda_context *ctx, const void *data,
                     const void *indices, void *y, int64_t elem_size,
                     int64_t outer, int64_t axis_dim, int64_t inner,
                     int64_t num_indices, int indices_are_i64, int site);

/* The same from one block of a table split along the gathered dimension
 * (see pcc_cpu_gather_block): indices outside the block give zeros. */
void pcc_cuda_gather_block(pcc_cuda_context *ctx, const void *data,
                           const void *indices, void *y, int64_t elem_size,
                           int64_t outer, int64_t block_dim,
                           int64_t block_start, int64_t axis_dim, int64_t inner,
                           int64_t num_indices, int indices_are_i64, int site);

void pcc_cuda_softmax_f32(pcc_cuda_context *ctx, const float *x, float *y,
                          int64_t outer, int64_t len, int64_t inner,
                          int flags /* PCC_SOFTMAX_* of CpuKernels.h */);

void pcc_cuda_layer_norm_f32(pcc_cuda_context *ctx, const float *x,
                             const float *scale, const float *bias, float *y,
                             int64_t rows, int64_t cols, float epsilon);

void pcc_cuda_batch_norm_f32(pcc_cuda_context *ctx, const float *x,
                             const float *scale, const float *bias,
                             const float *mean, const float *variance, float *y,
                             int64_t n, int64_t c, int64_t spatial,
                             float epsilon);

/* rank <= 8. */
void pcc_cuda_reduce_f32(pcc_cuda_context *ctx, const float *x, float *y,
                         int64_t rank, const int64_t *shape,
                         const int64_t *reduced, int kind);
void pcc_cuda_reduce_i64(pcc_cuda_context *ctx, const int64_t *x, int64_t *y,
                         int64_t rank, const int64_t *shape,
                         const int64_t *reduced, int kind);

void pcc_cuda_argmax_f32(pcc_cuda_context *ctx, const float *x, int64_t *y,
                         int64_t outer, int64_t len, int64_t inner);

/* Convolution as im2col into context-owned scratch plus cuBLAS GEMMs. */
void pcc_cuda_conv_f32(pcc_cuda_context *ctx, const float *x, const float *w,
                       const float *bias, float *y, int64_t spatial_rank,
                       const int64_t *in_shape, const int64_t *w_shape,
                       const int64_t *out_shape, const int64_t *strides,
                       const int64_t *pads, const int64_t *dilations,
                       int64_t groups);

void pcc_cuda_max_pool_f32(pcc_cuda_context *ctx, const float *x, float *y,
                           int64_t spatial_rank, const int64_t *in_shape,
                           const int64_t *out_shape, const int64_t *kernel,
                           const int64_t *strides, const int64_t *pads,
                           const int64_t *dilations);
void pcc_cuda_max_pool_u8(pcc_cuda_context *ctx, const uint8_t *x, uint8_t *y,
                          int64_t spatial_rank, const int64_t *in_shape,
                          const int64_t *out_shape, const int64_t *kernel,
                          const int64_t *strides, const int64_t *pads,
                          const int64_t *dilations);
void pcc_cuda_max_pool_i8(pcc_cuda_context *ctx, const int8_t *x, int8_t *y,
                          int64_t spatial_rank, const int64_t *in_shape,
                          const int64_t *out_shape, const int64_t *kernel,
                          const int64_t *strides, const int64_t *pads,
                          const int64_t *dilations);
void pcc_cuda_avg_pool_f32(pcc_cuda_context *ctx, const float *x, float *y,
                           int64_t spatial_rank, const int64_t *in_shape,
                           const int64_t *out_shape, const int64_t *kernel,
                           const int64_t *strides, const int64_t *pads,
                           const int64_t *dilations, int count_include_pad);

/* Training (see CpuKernels.h). Scatter-add zeroes y, then adds the rows of
 * updates in index order, one thread per column: deterministic, no
 * atomics. An index outside [-axis_dim, axis_dim) records `site` and adds
 * nothing. */
void pcc_cuda_scatter_add_f32(pcc_cuda_context *ctx, const float *updates,
                              const void *indices, float *y, int64_t outer,
                              int64_t axis_dim, int64_t inner,
                              int64_t num_indices, int indices_are_i64,
                              int site);
/* Rank r's block of a table split on the scattered dimension
 * (pcc.shard_scatter_add; see pcc_cpu_scatter_add_block_f32). */
void pcc_cuda_scatter_add_block_f32(pcc_cuda_context *ctx, const float *updates,
                                    const void *indices, float *y,
                                    int64_t outer, int64_t block, int64_t start,
                                    int64_t total, int64_t inner,
                                    int64_t num_indices, int indices_are_i64,
                                    int site);

/* A label outside [0, classes) that is not ignore_index records `site`;
 * its row gets a zero loss (gradient). */
void pcc_cuda_cross_entropy_f32(pcc_cuda_context *ctx, const float *logits,
                                const void *labels, float *loss, int64_t rows,
                                int64_t classes, int64_t ignore_index,
                                int labels_are_i64, int site);
void pcc_cuda_cross_entropy_grad_f32(pcc_cuda_context *ctx, const float *logits,
                                     const void *labels, const float *grad,
                                     float *y, int64_t rows, int64_t classes,
                                     int64_t ignore_index, int labels_are_i64,
                                     int site);
/* bf16 logits widened exactly; the gradient in f32 or (y_is_bf16) rounded
 * once to bf16 (pcc_cpu_cross_entropy_bf16). */
void pcc_cuda_cross_entropy_bf16(pcc_cuda_context *ctx, const uint16_t *logits,
                                 const void *labels, float *loss, int64_t rows,
                                 int64_t classes, int64_t ignore_index,
                                 int labels_are_i64, int site);
void pcc_cuda_cross_entropy_grad_bf16(pcc_cuda_context *ctx,
                                      const uint16_t *logits,
                                      const void *labels, const float *grad,
                                      void *y, int y_is_bf16, int64_t rows,
                                      int64_t classes, int64_t ignore_index,
                                      int labels_are_i64, int site);

/* pcc_cpu_linear_cross_entropy and its gradient on the GPU: cuBLAS's
 * products of up to 4096 x 4096 logits at a time in the context's scratch.
 * A label outside [0, vocab_total) that is not ignore_index records
 * `site`. */
void pcc_cuda_linear_cross_entropy(pcc_cuda_context *ctx,
                                   const pcc_lce_shape *shape,
                                   int64_t vocab_start, const void *h,
                                   const void *w, const void *labels,
                                   float *lse, float *target, int site);
void pcc_cuda_linear_cross_entropy_grad(pcc_cuda_context *ctx,
                                        const pcc_lce_shape *shape,
                                        int64_t vocab_start, const void *h,
                                        const void *w, const void *labels,
                                        const float *lse, const float *grad_lse,
                                        const float *grad_target, void *dh,
                                        void *dw, int site);

/* pcc_cpu_attention and its gradient on the GPU: cuBLAS's strided batched
 * products over every (batch, key head) at once, a strip of query rows at
 * a time, the softmax and its gradient in kernels of their own, strips in
 * the context's scratch. `shape` is read when the call is made. */
void pcc_cuda_attention(pcc_cuda_context *ctx, const pcc_attention_shape *shape,
                        const void *q, const void *k, const void *v,
                        const float *bias, void *out, float *lse);
void pcc_cuda_attention_grad(pcc_cuda_context *ctx,
                             const pcc_attention_shape *shape, const void *q,
                             const void *k, const void *v, const void *out,
                             const float *lse, const void *grad,
                             const float *bias, void *dq, void *dk, void *dv);

/* `hyper` is a host array (PCC_NUM_HYPER values, enum pcc_hyper), read
 * when the call is made; `norm` is a device pointer to the global gradient
 * norm, read by the kernel. */
void pcc_cuda_sgd_f32(pcc_cuda_context *ctx, float *param, const float *grad,
                      float *momentum_buffer, int64_t n, const double *hyper,
                      const float *norm);
void pcc_cuda_adamw_f32(pcc_cuda_context *ctx, float *param, const float *grad,
                        float *exp_avg, float *exp_avg_sq, int64_t n,
                        const double *hyper, const float *norm);

/* Gradients of conv and pooling (see CpuKernels.h), deterministic: one
 * thread (conv's weight gradient: one warp or block) per gradient element,
 * summing in a fixed order, no atomics. The pooling gradients sum in the
 * CPU's order and give its bits. */
void pcc_cuda_conv_grad_input_f32(pcc_cuda_context *ctx, const float *dy,
                                  const float *w, float *dx,
                                  int64_t spatial_rank, const int64_t *in_shape,
                                  const int64_t *w_shape,
                                  const int64_t *out_shape,
                                  const int64_t *strides, const int64_t *pads,
                                  const int64_t *dilations, int64_t groups);
void pcc_cuda_conv_grad_weight_f32(pcc_cuda_context *ctx, const float *x,
                                   const float *dy, float *dw,
                                   int64_t spatial_rank,
                                   const int64_t *in_shape,
                                   const int64_t *w_shape,
                                   const int64_t *out_shape,
                                   const int64_t *strides, const int64_t *pads,
                                   const int64_t *dilations, int64_t groups);
void pcc_cuda_max_pool_grad_f32(pcc_cuda_context *ctx, const float *x,
                                const float *dy, float *dx,
                                int64_t spatial_rank, const int64_t *in_shape,
                                const int64_t *out_shape, const int64_t *kernel,
                                const int64_t *strides, const int64_t *pads,
                                const int64_t *dilations);
void pcc_cuda_avg_pool_grad_f32(pcc_cuda_context *ctx, const float *dy,
                                float *dx, int64_t spatial_rank,
                                const int64_t *in_shape,
                                const int64_t *out_shape, const int64_t *kernel,
                                const int64_t *strides, const int64_t *pads,
                                const int64_t *dilations,
                                int count_include_pad);

/* state = momentum * state + (1 - momentum) * scale * value, in double. */
void pcc_cuda_ema_update_f32(pcc_cuda_context *ctx, float *state,
                             const float *value, int64_t n, double momentum,
                             double scale);

/* Dropout as pcc_cpu_dropout_f32 (the same mask); hyper is host memory. */
void pcc_cuda_dropout_f32(pcc_cuda_context *ctx, const float *x, float *y,
                          int64_t n, double ratio, int64_t stream,
                          const double *hyper);

void pcc_cuda_cast(pcc_cuda_context *ctx, const void *x, int from_type, void *y,
                   int to_type, int64_t count);

#ifdef __cplusplus
}
#endif

#endif /* PCC_RUNTIME_CUDAKERNELS_H */
