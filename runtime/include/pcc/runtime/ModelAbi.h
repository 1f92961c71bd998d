/*===- ModelAbi.h - the C ABI of a model library built by pcc -----*- C -*-===//
 *
 * A model.so built by `pcc model.onnx -o model.so` exports three functions.
 * pcc-run (or any host program) loads it with dlopen, checks
 * abi_version == PCC_MODEL_ABI_VERSION, maps the weights file, allocates
 * arena_bytes, and calls pcc_model_run.
 *
 *===----------------------------------------------------------------------===*/

#ifndef PCC_RUNTIME_MODELABI_H
#define PCC_RUNTIME_MODELABI_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PCC_MODEL_ABI_VERSION 1

typedef struct pcc_tensor_spec {
  const char *name;
  int32_t dtype; /* enum pcc_dtype */
  int32_t rank;
  const int64_t *shape;
} pcc_tensor_spec;

typedef struct pcc_model_info {
  uint32_t abi_version;
  const char *target;       /* "cpu" */
  const char *source;       /* the model it was compiled from */
  const char *weights_file; /* file name of the weights, beside the .so */
  int32_t num_inputs;
  const pcc_tensor_spec *inputs;
  int32_t num_outputs;
  const pcc_tensor_spec *outputs;
  int32_t num_weights;
  const pcc_tensor_spec *weights;
  int64_t arena_bytes; /* scratch memory pcc_model_run needs */
} pcc_model_info;

typedef const pcc_model_info *(*pcc_model_get_info_fn)(void);
typedef int (*pcc_model_run_fn)(const void *const *inputs, void *const *outputs,
                                const void *const *weights, void *arena);
typedef const char *(*pcc_model_last_error_fn)(void);

/* Exported by every model library. pcc_model_run returns 0 on success; on
 * failure pcc_model_last_error() names the ONNX node at fault. */
const pcc_model_info *pcc_model_get_info(void);
int pcc_model_run(const void *const *inputs, void *const *outputs,
                  const void *const *weights, void *arena);
const char *pcc_model_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* PCC_RUNTIME_MODELABI_H */
