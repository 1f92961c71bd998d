//===- Loader.h - loading the runtime's optional libraries ------*- C++ -*-===//
//
// The CUDA backend and the MPI engine are shared libraries beside the
// runtime, opened on first use so that programs start without them.
//
//===----------------------------------------------------------------------===//

#ifndef PCC_RUNTIME_LIB_LOADER_H
#define PCC_RUNTIME_LIB_LOADER_H

#include "pcc/runtime/Result.h"

#include <string>

namespace pccrt {

/// dlopen()s `fileName` from $envVar, then beside this runtime, then from
/// ../lib, then from the library path. The error lists every attempt after
/// `purpose`.
Result<void *> loadRuntimeLibrary(const char *fileName, const char *envVar,
                                  const std::string &purpose);

/// dlsym() of every name into the matching function pointer; false if one
/// is missing.
template <typename Fn> bool bindSymbol(void *handle, Fn &fn, const char *name);

} // namespace pccrt

#include <dlfcn.h>

template <typename Fn>
bool pccrt::bindSymbol(void *handle, Fn &fn, const char *name) {
  fn = reinterpret_cast<Fn>(dlsym(handle, name));
  return fn != nullptr;
}

#endif // PCC_RUNTIME_LIB_LOADER_H
