/*===- CpuKernels.h - CPU kernels called by generated code --------*- C -*-===//
 *
 * The C ABI between code that pcc generates and the CPU backend. Tensors are
 * contiguous row-major buffers; shapes, strides and attributes are static in
 * the generated code and passed as arguments. Elementwise work is not here:
 * pcc generates fused loops for it. Kernels that can fail on run-time data
 * (gather indices) return non-zero and leave a message for
 * pcc_cpu_last_error().
 *
 *===----------------------------------------------------------------------===*/

#ifndef PCC_RUNTIME_CPUKERNELS_H
#define PCC_RUNTIME_CPUKERNELS_H

#include "pcc/runtime/AttentionShape.h"
#include "pcc/runtime/LinearCrossEntropyShape.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Element type codes, as in pccrt::DType. */
enum pcc_dtype {
  PCC_F32 = 0,
  PCC_F64,
  PCC_F16,
  PCC_BF16,
  PCC_I64,
  PCC_I32,
  PCC_I16,
  PCC_I8,
  PCC_U8,
  PCC_BOOL
};

enum pcc_reduce_kind {
  PCC_REDUCE_SUM = 0,
  PCC_REDUCE_MEAN,
  PCC_REDUCE_MAX,
  PCC_REDUCE_MIN,
  PCC_REDUCE_PROD
};

/* The message of the last failing kernel on this thread. */
const char *pcc_cpu_last_error(void);

/* What the CPU kernels run on: "OpenBLAS 0.3.21, Cooperlake kernels, 2
 * OpenMP threads" (OpenBLAS's kernels for this CPU, or those
 * OPENBLAS_CORETYPE names). */
const char *pcc_cpu_describe(void);

/* c[b] = op(a[b]) x op(b[b]) for b < batch; op transposes when trans* is
 * set. a is m x k (k x m if transposed), b is k x n (n x k). stride_a and
 * stride_b are the elements between batch entries (0: shared matrix). */
void pcc_cpu_matmul_f32(const float *a, const float *b, float *c, int64_t batch,
                        int64_t m, int64_t n, int64_t k, int trans_a,
                        int trans_b, int64_t stride_a, int64_t stride_b);

/* pcc_cpu_matmul_f32 on bf16 (uint16_t bits) operands with fp32
 * accumulation and a bf16 result (rounded to nearest even), through
 * oneDNN. Returns non-zero (pcc_cpu_last_error() says why) when oneDNN
 * cannot run the product. */
int pcc_cpu_matmul_bf16(const void *a, const void *b, void *c, int64_t batch,
                        int64_t m, int64_t n, int64_t k, int trans_a,
                        int trans_b, int64_t stride_a, int64_t stride_b);
/* The same on fp16: through oneDNN where it has fp16 kernels for the CPU,
 * else the operands widened to fp32, OpenBLAS's sgemm and the result
 * rounded once (to nearest even). */
int pcc_cpu_matmul_f16(const void *a, const void *b, void *c, int64_t batch,
                       int64_t m, int64_t n, int64_t k, int trans_a,
                       int trans_b, int64_t stride_a, int64_t stride_b);
/* The same two with an fp32 result, the accumulator unrounded (a bias is
 * added to it before the one rounding). */
int pcc_cpu_matmul_bf16_f32(const void *a, const void *b, float *c,
                            int64_t batch, int64_t m, int64_t n, int64_t k,
                            int trans_a, int trans_b, int64_t stride_a,
                            int64_t stride_b);
int pcc_cpu_matmul_f16_f32(const void *a, const void *b, float *c,
                           int64_t batch, int64_t m, int64_t n, int64_t k,
                           int trans_a, int trans_b, int64_t stride_a,
                           int64_t stride_b);

/* y[i] = x[x_offset + sum_d idx_d * x_strides[d]] written at
 * y[y_offset + sum_d idx_d * y_strides[d]] for every index of `shape`.
 * Strides are in elements and may be zero (broadcast) or negative
 * (reversed slices). Covers transpose, broadcast, slice, concat and split. */
void pcc_cpu_copy_strided(const void *x, void *y, int64_t elem_size,
                          int64_t rank, const int64_t *shape,
                          const int64_t *x_strides, int64_t x_offset,
                          const int64_t *y_strides, int64_t y_offset);

/* Embedding-style gather along the middle dimension of data viewed as
 * [outer, axis_dim, inner]; indices (int64 or int32) may be negative.
 * Returns non-zero when an index is out of range. */
int pcc_cpu_gather(const void *data, const void *indices, void *y,
                   int64_t elem_size, int64_t outer, int64_t axis_dim,
                   int64_t inner, int64_t num_indices, int indices_are_i64);

/* The same from one block of a table split along the gathered dimension:
 * data is entries [block_start, block_start + block_dim) of a dimension of
 * size axis_dim; indices (into the whole dimension) outside the block give
 * zeros, so the ranks' results sum to the whole gather. */
int pcc_cpu_gather_block(const void *data, const void *indices, void *y,
                         int64_t elem_size, int64_t outer, int64_t block_dim,
                         int64_t block_start, int64_t axis_dim, int64_t inner,
                         int64_t num_indices, int indices_are_i64);

/* Flags of the softmax kernels (CPU and CUDA). */
enum {
  PCC_SOFTMAX_LOG = 1,         /* log-softmax */
  PCC_SOFTMAX_NAN_TO_ZERO = 2, /* NaN results (fully masked rows) become 0 */
};

/* Softmax of x viewed as [outer, len, inner] along len; `flags` ORs
 * PCC_SOFTMAX_* values (0: plain softmax). */
void pcc_cpu_softmax_f32(const float *x, float *y, int64_t outer, int64_t len,
                         int64_t inner, int flags);

/* Layer norm of each of `rows` rows of `cols` values; bias may be null. */
void pcc_cpu_layer_norm_f32(const float *x, const float *scale,
                            const float *bias, float *y, int64_t rows,
                            int64_t cols, float epsilon);

/* Inference batch norm of x viewed as [n, c, spatial]. */
void pcc_cpu_batch_norm_f32(const float *x, const float *scale,
                            const float *bias, const float *mean,
                            const float *variance, float *y, int64_t n,
                            int64_t c, int64_t spatial, float epsilon);

/* y[0] = the sum of x[i] * x[i] over n elements: each square rounded to
 * f32, summed as pcc_cpu_reduce_f32 sums a whole tensor (the same bits as
 * a product kernel followed by that reduction), in one pass. The squared
 * norm of a gradient (clipping, the logged norm). */
void pcc_cpu_sum_squares_f32(const float *x, float *y, int64_t n);
/* The same of bf16 values, widened exactly: the bits the widened tensor
 * gives (pcc.sum_squares of a bf16 gradient). */
void pcc_cpu_sum_squares_bf16(const uint16_t *x, float *y, int64_t n);

/* Reduction of x (shape, rank) over the dimensions with reduced[d] != 0;
 * y holds the kept dimensions in order. */
void pcc_cpu_reduce_f32(const float *x, float *y, int64_t rank,
                        const int64_t *shape, const int64_t *reduced, int kind);
void pcc_cpu_reduce_i64(const int64_t *x, int64_t *y, int64_t rank,
                        const int64_t *shape, const int64_t *reduced, int kind);

/* Index of the first maximum of x viewed as [outer, len, inner]. */
void pcc_cpu_argmax_f32(const float *x, int64_t *y, int64_t outer, int64_t len,
                        int64_t inner);

/* Grouped convolution, 1 to 3 spatial dimensions. in_shape is
 * [N, C, D1..], w_shape [M, C/groups, K1..], out_shape [N, M, O1..];
 * pads holds the leading pads then the trailing pads. bias may be null. */
void pcc_cpu_conv_f32(const float *x, const float *w, const float *bias,
                      float *y, int64_t spatial_rank, const int64_t *in_shape,
                      const int64_t *w_shape, const int64_t *out_shape,
                      const int64_t *strides, const int64_t *pads,
                      const int64_t *dilations, int64_t groups);

/* Max / average pooling; shapes as for conv (out_shape has C channels). */
void pcc_cpu_max_pool_f32(const float *x, float *y, int64_t spatial_rank,
                          const int64_t *in_shape, const int64_t *out_shape,
                          const int64_t *kernel, const int64_t *strides,
                          const int64_t *pads, const int64_t *dilations);
void pcc_cpu_max_pool_u8(const uint8_t *x, uint8_t *y, int64_t spatial_rank,
                         const int64_t *in_shape, const int64_t *out_shape,
                         const int64_t *kernel, const int64_t *strides,
                         const int64_t *pads, const int64_t *dilations);
void pcc_cpu_max_pool_i8(const int8_t *x, int8_t *y, int64_t spatial_rank,
                         const int64_t *in_shape, const int64_t *out_shape,
                         const int64_t *kernel, const int64_t *strides,
                         const int64_t *pads, const int64_t *dilations);
void pcc_cpu_avg_pool_f32(const float *x, float *y, int64_t spatial_rank,
                          const int64_t *in_shape, const int64_t *out_shape,
                          const int64_t *kernel, const int64_t *strides,
                          const int64_t *pads, const int64_t *dilations,
                          int count_include_pad);

/* Training. The gradient of a gather: y (viewed as [outer, axis_dim,
 * inner]) is zeroed, then every row j of updates ([outer, num_indices,
 * inner]) is added at row indices[j], in order (deterministic). Returns
 * non-zero when an index is out of range. */
int pcc_cpu_scatter_add_f32(const float *updates, const void *indices,
                            float *y, int64_t outer, int64_t axis_dim,
                            int64_t inner, int64_t num_indices,
                            int indices_are_i64);
/* The same rows added to what y holds (an embedding's gradient added to
 * its accumulator: only the rows the indices name are touched). */
int pcc_cpu_scatter_accumulate_f32(const float *updates, const void *indices,
                                   float *y, int64_t outer, int64_t axis_dim,
                                   int64_t inner, int64_t num_indices,
                                   int indices_are_i64);
/* The same for rank r's block of a table whose dimension is split over
 * ranks (pcc.shard_scatter_add): y is [outer, block, inner], indices are
 * into the whole dimension of size `total` (checked against it), and only
 * rows with an index in [start, start + block) are added, at index - start. */
int pcc_cpu_scatter_add_block_f32(const float *updates, const void *indices,
                                  float *y, int64_t outer, int64_t block,
                                  int64_t start, int64_t total, int64_t inner,
                                  int64_t num_indices, int indices_are_i64);
int pcc_cpu_scatter_accumulate_block_f32(const float *updates,
                                         const void *indices, float *y,
                                         int64_t outer, int64_t block,
                                         int64_t start, int64_t total,
                                         int64_t inner, int64_t num_indices,
                                         int indices_are_i64);

/* Per-row cross-entropy of logits [rows, classes] against labels (int64 or
 * int32): logsumexp(row) - row[label], 0 for ignore_index. The gradient
 * kernel writes (softmax(row) - onehot(label)) * grad[row]. Both return
 * non-zero when a label is out of range. */
int pcc_cpu_cross_entropy_f32(const float *logits, const void *labels,
                              float *loss, int64_t rows, int64_t classes,
                              int64_t ignore_index, int labels_are_i64);
int pcc_cpu_cross_entropy_grad_f32(const float *logits, const void *labels,
                                   const float *grad, float *y, int64_t rows,
                                   int64_t classes, int64_t ignore_index,
                                   int labels_are_i64);
/* The same of bf16 logits, each widened exactly (the losses and gradient
 * rows of the widened logits), the gradient written in f32 or, with
 * y_is_bf16, rounded once to bf16 as pcc_cpu_cast rounds it. */
int pcc_cpu_cross_entropy_bf16(const uint16_t *logits, const void *labels,
                               float *loss, int64_t rows, int64_t classes,
                               int64_t ignore_index, int labels_are_i64);
int pcc_cpu_cross_entropy_grad_bf16(const uint16_t *logits, const void *labels,
                                    const float *grad, void *y, int y_is_bf16,
                                    int64_t rows, int64_t classes,
                                    int64_t ignore_index, int labels_are_i64);

/* Fused attention (pcc.attention): out = softmax(scale q k^T + bias, causal
 * mask) v, a strip of query rows at a time (every key of those rows: no
 * S x L buffer), with each row's log-sum-exp in lse (-inf and zero output
 * for a row whose every key is masked). bias may be null. The gradient
 * recomputes the probabilities from lse and writes dq, dk and dv (a key
 * head's summed over the query heads that read it). Both return non-zero
 * (pcc_cpu_last_error() says why) when a product cannot run. Each query
 * row's result depends only on its own (b, h) inputs: the bits do not change
 * with the batch or head count (data and tensor parallelism). */
int pcc_cpu_attention(const pcc_attention_shape *shape, const void *q,
                      const void *k, const void *v, const float *bias,
                      void *out, float *lse);
int pcc_cpu_attention_grad(const pcc_attention_shape *shape, const void *q,
                           const void *k, const void *v, const void *out,
                           const float *lse, const void *grad,
                           const float *bias, void *dq, void *dk, void *dv);

/* An LM head's product and its cross-entropy (pcc.linear_cross_entropy):
 * the logits h w^T computed and consumed in blocks of the vocabulary (no
 * rows x vocab buffer); lse[n] is row n's log-sum-exp over this call's
 * classes [vocab_start, vocab_start + vocab) of the whole vocabulary, and
 * target[n] its label's logit (0 where the label is another call's or
 * ignored). The gradient computes each block of logits again and writes
 * dh = dl w and dw = dl^T h with dl = grad_lse exp(l - lse) + grad_target
 * [class == label] (dh or dw null: that product is skipped). Both return
 * non-zero (pcc_cpu_last_error() says why)
 * for a label outside [0, vocab_total) that is not ignore_index, or when a
 * product cannot run. Each row's statistics depend only on its own row:
 * the bits do not change with the row count (data parallelism,
 * micro-batches). */
int pcc_cpu_linear_cross_entropy(const pcc_lce_shape *shape,
                                 int64_t vocab_start, const void *h,
                                 const void *w, const void *labels, float *lse,
                                 float *target);
int pcc_cpu_linear_cross_entropy_grad(const pcc_lce_shape *shape,
                                      int64_t vocab_start, const void *h,
                                      const void *w, const void *labels,
                                      const float *lse, const float *grad_lse,
                                      const float *grad_target, void *dh,
                                      void *dw);

/* One optimizer step of n weights in place, in PyTorch's order of
 * operations (torch.optim.SGD / AdamW, foreach=False). `hyper` holds the
 * run's hyperparameters (enum pcc_hyper in ModelAbi.h); `norm` points to
 * the global gradient norm, which scales the gradient when the run clips
 * (max_norm / (norm + 1e-6), at most 1). */
void pcc_cpu_sgd_f32(float *param, const float *grad, float *momentum_buffer,
                     int64_t n, const double *hyper, const float *norm);
void pcc_cpu_adamw_f32(float *param, const float *grad, float *exp_avg,
                       float *exp_avg_sq, int64_t n, const double *hyper,
                       const float *norm);
/* pcc_cpu_adamw_f32 that also writes the updated weights, rounded to
 * copy_type (PCC_BF16 or PCC_F16) as pcc_cpu_cast rounds them, to `copy`
 * (mixed precision's 16-bit weight copy, ABI 16); a skipped update leaves
 * the copy untouched. */
void pcc_cpu_adamw_copy_f32(float *param, const float *grad, float *exp_avg,
                            float *exp_avg_sq, int64_t n, const double *hyper,
                            const float *norm, void *copy, int copy_type);
/* The same with the gradients in bf16 (widened exactly as they are read);
 * `copy` may be null (no copy). */
void pcc_cpu_adamw_bf16_grad_f32(float *param, const uint16_t *grad,
                                 float *exp_avg, float *exp_avg_sq, int64_t n,
                                 const double *hyper, const float *norm,
                                 void *copy, int copy_type);

/* Gradients of conv: shapes and attributes as for pcc_cpu_conv_f32.
 * grad_input writes dx (in_shape) from dy (out_shape) and w; grad_weight
 * writes dw (w_shape) from x and dy, summed over the batch. Both are
 * deterministic (no atomics, a fixed order). */
void pcc_cpu_conv_grad_input_f32(const float *dy, const float *w, float *dx,
                                 int64_t spatial_rank, const int64_t *in_shape,
                                 const int64_t *w_shape,
                                 const int64_t *out_shape,
                                 const int64_t *strides, const int64_t *pads,
                                 const int64_t *dilations, int64_t groups);
void pcc_cpu_conv_grad_weight_f32(const float *x, const float *dy, float *dw,
                                  int64_t spatial_rank,
                                  const int64_t *in_shape,
                                  const int64_t *w_shape,
                                  const int64_t *out_shape,
                                  const int64_t *strides, const int64_t *pads,
                                  const int64_t *dilations, int64_t groups);

/* Gradients of pooling: dx (in_shape) from dy (out_shape). Max pooling
 * sends each gradient to its window's first maximum in x (NaN wins, as
 * PyTorch); average pooling shares it out as the forward divided. */
void pcc_cpu_max_pool_grad_f32(const float *x, const float *dy, float *dx,
                               int64_t spatial_rank, const int64_t *in_shape,
                               const int64_t *out_shape, const int64_t *kernel,
                               const int64_t *strides, const int64_t *pads,
                               const int64_t *dilations);
void pcc_cpu_avg_pool_grad_f32(const float *dy, float *dx,
                               int64_t spatial_rank, const int64_t *in_shape,
                               const int64_t *out_shape, const int64_t *kernel,
                               const int64_t *strides, const int64_t *pads,
                               const int64_t *dilations,
                               int count_include_pad);

/* state = momentum * state + (1 - momentum) * scale * value, in double
 * (batch normalisation's running statistics). */
void pcc_cpu_ema_update_f32(float *state, const float *value, int64_t n,
                            double momentum, double scale);

/* y = x * mask / (1 - ratio) over n elements, the mask drawn from
 * Philox.h's numbers of (hyper[PCC_HYPER_SEED], element, micro-batch,
 * stream, step): an element is kept when its number is >= ratio. */
void pcc_cpu_dropout_f32(const float *x, float *y, int64_t n, double ratio,
                         int64_t stream, const double *hyper);

/* Element type conversion with ONNX Cast semantics. */
void pcc_cpu_cast(const void *x, int from_type, void *y, int to_type,
                  int64_t count);

#ifdef __cplusplus
}
#endif

#endif /* PCC_RUNTIME_CPUKERNELS_H */
