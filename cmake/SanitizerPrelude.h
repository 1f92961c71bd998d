//===- SanitizerPrelude.h - pre-included in ASan builds of pcc ---*- C++ -*-===//
//
// Force-included (-include) into every C++ file of pcc when it is built with
// -DPCC_SANITIZE=ON or -DPCC_FUZZ=ON.
//
// LLVM's BumpPtrAllocator (llvm/Support/Allocator.h) poisons its slabs and
// unpoisons each allocation when the including file is compiled with ASan.
// MLIR and LLVM are prebuilt without ASan, and the same inline allocator
// functions are then emitted both with and without the annotations; the
// linker keeps one copy of each, so a slab poisoned by pcc's copy of one
// function is later written by MLIR's unannotated copy of another: a false
// "use-after-poison" in MLIR's own code (first seen in
// mlir::Dialect::addType while a context loads the builtin dialect). Here
// the annotations are switched off for pcc's copies too, so that every copy
// agrees. Everything else ASan checks is unaffected.
//
//===----------------------------------------------------------------------===//

#ifndef PCC_CMAKE_SANITIZERPRELUDE_H
#define PCC_CMAKE_SANITIZERPRELUDE_H

#if __has_include("llvm/Support/Compiler.h")
#include "llvm/Support/Compiler.h" // declares the functions, defines the macro

#undef LLVM_ADDRESS_SANITIZER_BUILD
#define LLVM_ADDRESS_SANITIZER_BUILD 0
#define __asan_poison_memory_region(p, size) ((void)(p), (void)(size))
#define __asan_unpoison_memory_region(p, size) ((void)(p), (void)(size))
#endif

#endif // PCC_CMAKE_SANITIZERPRELUDE_H
