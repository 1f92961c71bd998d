//===- ReduceIdentity.h - where a reduction starts ---------------*- C++ -*-===//
//
// Shared by the CPU and CUDA reductions so both start from the same value.
//
//===----------------------------------------------------------------------===//

#ifndef PCC_RUNTIME_REDUCEIDENTITY_H
#define PCC_RUNTIME_REDUCEIDENTITY_H

#include "pcc/runtime/CpuKernels.h"

#include <limits>

namespace pccrt {

/// The identity of reduction `kind` (enum pcc_reduce_kind) over T: the
/// lowest T for a max, the largest for a min, 1 for a product, else 0.
template <typename T> constexpr T reduceIdentity(int kind) {
  if (kind == PCC_REDUCE_MAX)
    return std::numeric_limits<T>::lowest();
  if (kind == PCC_REDUCE_MIN)
    return std::numeric_limits<T>::max();
  return kind == PCC_REDUCE_PROD ? T(1) : T(0);
}

} // namespace pccrt

#endif // PCC_RUNTIME_REDUCEIDENTITY_H
