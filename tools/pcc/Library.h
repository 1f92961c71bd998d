//===- Library.h - pcc -o model.so ------------------------------*- C++ -*-===//

#ifndef PCC_TOOLS_PCC_LIBRARY_H
#define PCC_TOOLS_PCC_LIBRARY_H

#include "Flags.h"

#include "mlir/IR/BuiltinOps.h"

namespace pcctool {

/// Writes the compiled module's C++ (`cppOnly`, --emit=cpp) or builds its
/// shared library and writes the weights file beside it. The exit status.
int writeLibrary(mlir::ModuleOp module, const DriverFlags &flags,
                 const mlir::pcc::CompileOptions &options, bool cppOnly);

} // namespace pcctool

#endif // PCC_TOOLS_PCC_LIBRARY_H
