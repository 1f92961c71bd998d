//===- HalfFloat.h - float16 and bfloat16 conversions -----------*- C++ -*-===//

#ifndef PCC_RUNTIME_HALFFLOAT_H
#define PCC_RUNTIME_HALFFLOAT_H

#include <cstdint>
#include <cstring>

// The conversions also serve kernels that pcc generates for CUDA.
#ifdef __CUDACC__
#define PCC_HOST_DEVICE __host__ __device__
#else
#define PCC_HOST_DEVICE
#endif

namespace pccrt {

/// The bits of `from` read as a `To` of the same size (host and device:
/// CUDA compiles memcpy of a register to a move).
template <typename To, typename From>
PCC_HOST_DEVICE inline To bitCast(From from) {
  static_assert(sizeof(To) == sizeof(From), "a bit cast keeps the size");
  To to;
  memcpy(&to, &from, sizeof(To));
  return to;
}

PCC_HOST_DEVICE inline float bitsToFloat(uint32_t bits) {
  return bitCast<float>(bits);
}

PCC_HOST_DEVICE inline uint32_t floatToBits(float f) {
  return bitCast<uint32_t>(f);
}

PCC_HOST_DEVICE inline float bf16ToFloat(uint16_t h) {
  return bitsToFloat(uint32_t(h) << 16);
}

/// Round to nearest even; NaN stays NaN.
PCC_HOST_DEVICE inline uint16_t floatToBf16(float f) {
  uint32_t bits = floatToBits(f);
  if ((bits & 0x7fffffff) > 0x7f800000)
    return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fff + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}

/// bf16ToFloat(floatToBf16(f)) in one step: f rounded to the nearest bf16
/// (even on ties) and kept in a float. Generated elementwise loops round
/// every bf16 op's result so; without the narrowing to 16 bits and the
/// widening back, a vector of floats stays one (GELU's bf16 loops 20%
/// faster). NaN stays NaN, quietened as floatToBf16 does.
PCC_HOST_DEVICE inline float roundToBf16(float f) {
  uint32_t bits = floatToBits(f);
  uint32_t rounded = (bits + 0x7fff + ((bits >> 16) & 1)) & 0xffff0000u;
  uint32_t nan = (bits | 0x00400000u) & 0xffff0000u;
  return bitsToFloat((bits & 0x7fffffff) > 0x7f800000 ? nan : rounded);
}

/// The bf16 of a float that is one exactly (roundToBf16's result, a
/// widened bf16): its upper half.
PCC_HOST_DEVICE inline uint16_t exactBf16(float f) {
  return static_cast<uint16_t>(floatToBits(f) >> 16);
}

PCC_HOST_DEVICE inline float halfToFloat(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000) << 16;
  uint32_t exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
  if (exponent == 0x1f) // inf or NaN
    return bitsToFloat(sign | 0x7f800000 | (mantissa << 13));
  if (exponent == 0) {
    if (mantissa == 0)
      return bitsToFloat(sign);
    // Subnormal: value = mantissa * 2^-24.
    float v = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  return bitsToFloat(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

/// Round to nearest even, overflow to infinity.
PCC_HOST_DEVICE inline uint16_t floatToHalf(float f) {
  uint32_t bits = floatToBits(f);
  uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
  uint32_t absBits = bits & 0x7fffffff;
  if (absBits > 0x7f800000) // NaN
    return sign | 0x7e00;
  if (absBits >= 0x477ff000) // rounds to >= 65520: infinity
    return sign | 0x7c00;
  if (absBits < 0x38800000) { // below the smallest normal half
    // Subnormal: scale so the unit is 2^-24 and round to nearest even.
    float scaled = bitsToFloat(absBits) * 16777216.0f;
    uint32_t m = static_cast<uint32_t>(scaled);
    float rem = scaled - static_cast<float>(m);
    if (rem > 0.5f || (rem == 0.5f && (m & 1)))
      ++m;
    return sign | static_cast<uint16_t>(m);
  }
  uint32_t exponent = (absBits >> 23) - 112;
  uint32_t mantissa = absBits & 0x7fffff;
  uint32_t half = (exponent << 10) | (mantissa >> 13);
  uint32_t rest = mantissa & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (half & 1)))
    ++half;
  return sign | static_cast<uint16_t>(half);
}

} // namespace pccrt

#endif // PCC_RUNTIME_HALFFLOAT_H
