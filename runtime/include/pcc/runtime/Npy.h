//===- Npy.h - NumPy .npy files for model inputs and outputs ----*- C++ -*-===//
//
// pcc-run reads inputs and writes outputs as .npy (format versions 1-3,
// little-endian, C order). Anything else is an error naming the file.
//
//===----------------------------------------------------------------------===//

#ifndef PCC_RUNTIME_NPY_H
#define PCC_RUNTIME_NPY_H

#include "pcc/runtime/DType.h"
#include "pcc/runtime/Result.h"

#include <cstdint>
#include <string>
#include <vector>

namespace pccrt {

struct NpyArray {
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> data; // elementCount(shape) * dtypeSize(dtype) bytes
};

Result<NpyArray> readNpy(const std::string &path);
Status writeNpy(const std::string &path, const NpyArray &array);

} // namespace pccrt

#endif // PCC_RUNTIME_NPY_H
