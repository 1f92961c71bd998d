//===- MemoryFit.h - the --mem-cap fit as a pass ----------------*- C++ -*-===//

#ifndef PCC_LIB_PIPELINES_MEMORYFIT_H
#define PCC_LIB_PIPELINES_MEMORYFIT_H

#include "pcc/Pipelines/Compile.h"

#include "mlir/Pass/Pass.h"

#include <memory>

namespace mlir::pcc {

/// A module pass that compiles copies of the module with more and more
/// memory saved until every pipeline rank's predicted peak fits
/// `options.memCapBytes`, reports each trial, and then runs the passes it
/// chose on the module itself.
std::unique_ptr<Pass> createMemoryFitPass(const CompileOptions &options);

} // namespace mlir::pcc

#endif // PCC_LIB_PIPELINES_MEMORYFIT_H
