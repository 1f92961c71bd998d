//===- DType.cpp - element types ------------------------------------------===//

#include "pcc/runtime/DType.h"
#include "pcc/runtime/HalfFloat.h"

namespace pccrt {

namespace {
struct DTypeInfo {
  DType type;
  std::string_view name;
  size_t size;
};
constexpr DTypeInfo kTypes[] = {
    {DType::F32, "F32", 4},   {DType::F64, "F64", 8}, {DType::F16, "F16", 2},
    {DType::BF16, "BF16", 2}, {DType::I64, "I64", 8}, {DType::I32, "I32", 4},
    {DType::I16, "I16", 2},   {DType::I8, "I8", 1},   {DType::U8, "U8", 1},
    {DType::Bool, "BOOL", 1}};
} // namespace

size_t dtypeSize(DType type) {
  for (const DTypeInfo &info : kTypes)
    if (info.type == type)
      return info.size;
  return 0;
}

std::string_view dtypeName(DType type) {
  for (const DTypeInfo &info : kTypes)
    if (info.type == type)
      return info.name;
  return "?";
}

std::optional<DType> dtypeFromName(std::string_view name) {
  for (const DTypeInfo &info : kTypes)
    if (info.name == name)
      return info.type;
  return std::nullopt;
}

int64_t elementCount(const std::vector<int64_t> &shape) {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}

std::string shapeString(const std::vector<int64_t> &shape) {
  if (shape.empty())
    return "scalar";
  std::string s;
  for (size_t i = 0; i < shape.size(); ++i)
    s += (i ? "x" : "") + std::to_string(shape[i]);
  return s;
}

double elementAsDouble(const uint8_t *data, DType type, int64_t i) {
  switch (type) {
  case DType::F32:
    return reinterpret_cast<const float *>(data)[i];
  case DType::F64:
    return reinterpret_cast<const double *>(data)[i];
  case DType::F16:
    return halfToFloat(reinterpret_cast<const uint16_t *>(data)[i]);
  case DType::BF16:
    return bf16ToFloat(reinterpret_cast<const uint16_t *>(data)[i]);
  case DType::I64:
    return double(reinterpret_cast<const int64_t *>(data)[i]);
  case DType::I32:
    return reinterpret_cast<const int32_t *>(data)[i];
  case DType::I16:
    return reinterpret_cast<const int16_t *>(data)[i];
  case DType::I8:
    return reinterpret_cast<const int8_t *>(data)[i];
  default:
    return data[i];
  }
}

} // namespace pccrt
