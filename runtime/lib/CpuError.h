//===- CpuError.h - the CPU kernels' last error message ---------*- C++ -*-===//
//
// What pcc_cpu_last_error() returns: set by a CPU kernel that returns
// non-zero, in the thread that called it.
//
//===----------------------------------------------------------------------===//

#ifndef PCC_RUNTIME_LIB_CPUERROR_H
#define PCC_RUNTIME_LIB_CPUERROR_H

#include <string>

namespace pccrt {
extern thread_local std::string cpuLastError;
} // namespace pccrt

#endif // PCC_RUNTIME_LIB_CPUERROR_H
