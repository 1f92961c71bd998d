//===- FastMath.h - vectorisable exp, tanh, erf for generated loops -*- C++
//-*-===//
//
// libm's expf/tanhf/erff are calls the compiler cannot vectorise without
// -ffast-math (which would also drop NaN and infinity semantics ONNX tests
// check). These are branch-free polynomial forms that GCC and Clang
// vectorise inside the generated elementwise loops:
//
//   fastExp   Cephes' range reduction (x = n ln2 + r) and degree-6
//             polynomial; max relative error ~2e-7 on [-87, 88]; exact
//             limits: NaN -> NaN, +inf -> +inf, below -87.3 -> 0.
//   fastTanh  x + x^3 P(x^2) for |x| < 0.625 (Cephes), 1 - 2/(e^2|x| + 1)
//             above; max absolute error ~2e-7; saturates to +-1.
//   fastErf   Abramowitz & Stegun 7.1.26; max absolute error 1.5e-7
//             (about 6e-7 evaluated in float).
//
// pcc uses them for f32 (and f16/bf16 computed in f32) elementwise code on
// the CPU; the unit tests hold the error bounds against libm.
//
//===----------------------------------------------------------------------===//

#ifndef PCC_RUNTIME_FASTMATH_H
#define PCC_RUNTIME_FASTMATH_H

#include <cstdint>
#include <cstring>

namespace pccrt {

inline float fastExp(float x) {
  const float hi = 88.7228317f, lo = -87.3365479f;
  // NaN clamps to hi (every comparison with it is false): converting a NaN
  // n to int below would be undefined behaviour. The result is x anyway.
  float clamped = x < hi ? (x > lo ? x : lo) : hi;
  // n = round(x / ln2) by the 1.5 * 2^23 trick (no call to floorf, which
  // x86-64's baseline cannot inline or vectorise); r = x - n ln2 in two
  // parts for accuracy.
  const float magic = 12582912.0f;
  float n = (clamped * 1.44269504088896341f + magic) - magic;
  float r = clamped - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  // 2^n by building the exponent bits (n is within [-126, 128]: split in
  // two factors so 2^128 does not overflow the exponent field).
  int32_t ni = static_cast<int32_t>(n);
  int32_t half = ni / 2;
  uint32_t b1 = static_cast<uint32_t>(half + 127) << 23;
  uint32_t b2 = static_cast<uint32_t>(ni - half + 127) << 23;
  float s1, s2;
  std::memcpy(&s1, &b1, 4);
  std::memcpy(&s2, &b2, 4);
  float result = p * s1 * s2;
  result = x > hi ? __builtin_inff() : result;
  result = x < lo ? 0.0f : result;
  return x != x ? x : result;
}

inline float fastTanh(float x) {
  float a = x < 0 ? -x : x;
  // Small |x|: odd polynomial (no cancellation).
  float z = x * x;
  float small = -5.70498872745e-3f;
  small = small * z + 2.06390887954e-2f;
  small = small * z - 5.37397155531e-2f;
  small = small * z + 1.33314422036e-1f;
  small = small * z - 3.33332819422e-1f;
  small = small * z * x + x;
  // Large |x|: 1 - 2 / (e^(2|x|) + 1), saturating to 1.
  float e = fastExp(2.0f * (a < 9.0f ? a : 9.0f));
  float large = 1.0f - 2.0f / (e + 1.0f);
  large = a >= 9.0f ? 1.0f : large;
  large = x < 0 ? -large : large;
  float result = a < 0.625f ? small : large;
  return x != x ? x : result;
}

inline float fastErf(float x) {
  float a = x < 0 ? -x : x;
  float t = 1.0f / (1.0f + 0.3275911f * a);
  float poly = 1.061405429f;
  poly = poly * t - 1.453152027f;
  poly = poly * t + 1.421413741f;
  poly = poly * t - 0.284496736f;
  poly = poly * t + 0.254829592f;
  poly = poly * t;
  float y = 1.0f - poly * fastExp(-a * a);
  y = x < 0 ? -y : y;
  return x != x ? x : y;
}

} // namespace pccrt

#endif // PCC_RUNTIME_FASTMATH_H
