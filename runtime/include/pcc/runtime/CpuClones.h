//===- CpuClones.h - the CPU kernels' target clones -------------*- C++ -*-===//
//
// The instruction sets every vectorised CPU kernel is built for, the
// generated ones (PCC_KERNEL, LibraryEmitter.cpp) and the runtime's row
// kernels (RowKernels.h): AVX-512 and AVX2+FMA clones beside x86-64's
// baseline, picked when the library loads (docs/design-notes.md, "AVX-512
// clones of the CPU kernels").
//
//===----------------------------------------------------------------------===//

#ifndef PCC_RUNTIME_CPUCLONES_H
#define PCC_RUNTIME_CPUCLONES_H

#if defined(__x86_64__) && defined(__GNUC__)
#define PCC_CPU_CLONES                                                         \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define PCC_CPU_CLONES
#endif

#endif // PCC_RUNTIME_CPUCLONES_H
