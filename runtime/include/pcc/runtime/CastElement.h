//===- CastElement.h - ONNX Cast of one element, host and device -*- C++
//-*-===//
//
// Shared by pcc_cpu_cast and the CUDA cast kernel so both backends convert
// identically: floating sources go through double (f16 / bf16 widened
// exactly), integer sources through int64. A float becomes an integer by
// truncation after clamping to +-9.2e18 (NaN becomes 0), then wraps to
// narrower types; bool is "not zero". Unknown codes read as u8 and write as
// bool.
//
//===----------------------------------------------------------------------===//

#ifndef PCC_RUNTIME_CASTELEMENT_H
#define PCC_RUNTIME_CASTELEMENT_H

#include "pcc/runtime/CpuKernels.h"
#include "pcc/runtime/HalfFloat.h"

#include <cstdint>

namespace pccrt {

PCC_HOST_DEVICE inline void castElement(const void *x, int fromType, void *y,
                                        int toType, int64_t i) {
  double v = 0;
  int64_t iv = 0;
  bool isFloat = true;
  switch (fromType) {
  case PCC_F32:
    v = static_cast<const float *>(x)[i];
    break;
  case PCC_F64:
    v = static_cast<const double *>(x)[i];
    break;
  case PCC_F16:
    v = halfToFloat(static_cast<const uint16_t *>(x)[i]);
    break;
  case PCC_BF16:
    v = bf16ToFloat(static_cast<const uint16_t *>(x)[i]);
    break;
  default:
    isFloat = false;
    switch (fromType) {
    case PCC_I64:
      iv = static_cast<const int64_t *>(x)[i];
      break;
    case PCC_I32:
      iv = static_cast<const int32_t *>(x)[i];
      break;
    case PCC_I16:
      iv = static_cast<const int16_t *>(x)[i];
      break;
    case PCC_I8:
      iv = static_cast<const int8_t *>(x)[i];
      break;
    default:
      iv = static_cast<const uint8_t *>(x)[i];
      break;
    }
    v = static_cast<double>(iv);
  }
  int64_t asInt = iv;
  if (isFloat)
    asInt = v != v ? 0
                   : static_cast<int64_t>(v < -9.2e18  ? -9.2e18
                                          : 9.2e18 < v ? 9.2e18
                                                       : v);
  switch (toType) {
  case PCC_F32:
    static_cast<float *>(y)[i] = static_cast<float>(v);
    break;
  case PCC_F64:
    static_cast<double *>(y)[i] = v;
    break;
  case PCC_F16:
    static_cast<uint16_t *>(y)[i] = floatToHalf(static_cast<float>(v));
    break;
  case PCC_BF16:
    static_cast<uint16_t *>(y)[i] = floatToBf16(static_cast<float>(v));
    break;
  case PCC_I64:
    static_cast<int64_t *>(y)[i] = asInt;
    break;
  case PCC_I32:
    static_cast<int32_t *>(y)[i] = static_cast<int32_t>(asInt);
    break;
  case PCC_I16:
    static_cast<int16_t *>(y)[i] = static_cast<int16_t>(asInt);
    break;
  case PCC_I8:
    static_cast<int8_t *>(y)[i] = static_cast<int8_t>(asInt);
    break;
  case PCC_U8:
    static_cast<uint8_t *>(y)[i] = static_cast<uint8_t>(asInt);
    break;
  default:
    static_cast<uint8_t *>(y)[i] = isFloat ? (v != 0.0) : (iv != 0);
    break;
  }
}

} // namespace pccrt

#endif // PCC_RUNTIME_CASTELEMENT_H
