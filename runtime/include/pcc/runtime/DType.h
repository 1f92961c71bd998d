//===- DType.h - element types shared by weights, npy and kernels -*- C++
//-*-===//

#ifndef PCC_RUNTIME_DTYPE_H
#define PCC_RUNTIME_DTYPE_H

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace pccrt {

enum class DType : uint8_t { F32, F64, F16, BF16, I64, I32, I16, I8, U8, Bool };

/// Bytes per element.
size_t dtypeSize(DType type);
/// Safetensors spelling: "F32", "BF16", "BOOL", ...
std::string_view dtypeName(DType type);
std::optional<DType> dtypeFromName(std::string_view name);

/// Element count of a shape (1 for a scalar).
/// Element i of a buffer of `type` as a double (for comparisons and
/// printing); unsigned bytes for types without a case.
double elementAsDouble(const uint8_t *data, DType type, int64_t i);
int64_t elementCount(const std::vector<int64_t> &shape);
/// "2x16x64" ("scalar" for rank 0), for messages.
std::string shapeString(const std::vector<int64_t> &shape);

} // namespace pccrt

#endif // PCC_RUNTIME_DTYPE_H
