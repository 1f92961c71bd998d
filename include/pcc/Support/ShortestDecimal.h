//===- ShortestDecimal.h - a float32 back as the decimal it was -*- C++ -*-===//

#ifndef PCC_SUPPORT_SHORTESTDECIMAL_H
#define PCC_SUPPORT_SHORTESTDECIMAL_H

#include <cstdio>
#include <cstdlib>

namespace mlir::pcc {

/// The shortest decimal that rounds to `f` (0.1f gives 0.1, not
/// 0.100000001): a float32 ONNX attribute holding a probability or a
/// momentum back as the value the user wrote, so that 1 - p is PyTorch's.
inline double shortestDecimal(float f) {
  char text[32];
  for (int digits = 1; digits <= 9; ++digits) {
    std::snprintf(text, sizeof(text), "%.*g", digits, static_cast<double>(f));
    double value = std::strtod(text, nullptr);
    if (static_cast<float>(value) == f)
      return value;
  }
  return f;
}

} // namespace mlir::pcc

#endif // PCC_SUPPORT_SHORTESTDECIMAL_H
