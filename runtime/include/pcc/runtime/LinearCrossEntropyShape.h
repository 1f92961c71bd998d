/*===- LinearCrossEntropyShape.h - one fused LM-head loss ----------*- C -*-===*
 *
 * What the generated code passes to pcc_cpu_linear_cross_entropy /
 * pcc_cuda_linear_cross_entropy and their gradients
 * (pcc.linear_cross_entropy, pcc.linear_cross_entropy_grad): hidden
 * states h [rows, dim], a weight w [vocab, dim] (transpose_w) or
 * [dim, vocab], labels [rows] and the row statistics [rows].
 *
 *===----------------------------------------------------------------------===*/

#ifndef PCC_RUNTIME_LINEARCROSSENTROPYSHAPE_H
#define PCC_RUNTIME_LINEARCROSSENTROPYSHAPE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pcc_lce_shape {
  int64_t rows, dim;
  /* The classes this call's weight holds, and the whole vocabulary the
   * labels count (vocab x the ranks of a vocabulary split). */
  int64_t vocab, vocab_total;
  int64_t ignore_index;
  /* w is [vocab, dim] (1) or [dim, vocab] (0). */
  int transpose_w;
  int labels_are_i64;
  /* h, w and their gradients: a pcc_dtype (CpuKernels.h): PCC_F32, or
   * PCC_BF16 / PCC_F16, whose products accumulate in f32 and whose logits
   * are rounded to the type before the statistics (a 16-bit product, then
   * a widening cast, as under torch.autocast). */
  int dtype;
} pcc_lce_shape;

#ifdef __cplusplus
}
#endif

#endif /* PCC_RUNTIME_LINEARCROSSENTROPYSHAPE_H */
