/*===- AttentionShape.h - the sizes of one fused attention --------*- C -*-===*
 *
 * What the generated code passes to pcc_cpu_attention / pcc_cuda_attention
 * and their gradients (pcc.attention, pcc.attention_grad): q [B, Hq, S, D],
 * k [B, Hkv, L, D], v [B, Hkv, L, Dv], out [B, Hq, S, Dv], lse [B, Hq, S].
 *
 *===----------------------------------------------------------------------===*/

#ifndef PCC_RUNTIME_ATTENTIONSHAPE_H
#define PCC_RUNTIME_ATTENTIONSHAPE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pcc_attention_shape {
  int64_t batch, heads, kv_heads, seq, len, head_dim, v_dim;
  /* The f32 bias's element strides over [B, Hq, S, L] (0 where it
   * broadcasts); unused without a bias. */
  int64_t bias_strides[4];
  double scale;
  /* Key j is masked from query i where j > i + L - S. */
  int causal;
  /* q, k, v, out and the gradients: 0 f32, 1 bf16. */
  int dtype;
} pcc_attention_shape;

#ifdef __cplusplus
}
#endif

#endif /* PCC_RUNTIME_ATTENTIONSHAPE_H */
