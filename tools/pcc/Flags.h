//===- Flags.h - pcc's command line -----------------------------*- C++ -*-===//
//
// pcc's flags, read into the driver's settings and the compile's options
// (mlir::pcc::CompileOptions, which verifies how they go together).
//
//===----------------------------------------------------------------------===//

#ifndef PCC_TOOLS_PCC_FLAGS_H
#define PCC_TOOLS_PCC_FLAGS_H

#include "pcc/Import/OnnxImporter.h"
#include "pcc/Pipelines/AutoPlan.h"
#include "pcc/Pipelines/Compile.h"

#include "llvm/Support/CommandLine.h"

#include <string>
#include <vector>

namespace pcctool {

enum class Emit { Auto, Mlir, MlirImported, Weights, Cpp, SharedLibrary };

/// Which plan dimensions the user gave (the plan search keeps them).
struct GivenPlanDims {
  bool tp = false, pp = false, dp = false, zero = false, microbatches = false,
       schedule = false, chunks = false, recompute = false, precision = false,
       sp = false;
};

/// The category of pcc's training (and plan-search) flags.
extern llvm::cl::OptionCategory trainCategory;

/// What the driver does with the compiled module.
struct DriverFlags {
  std::string inputFile, outputFile;
  Emit emit = Emit::Auto;
  bool emitGiven = false;
  std::string dumpIr;
  bool keepSource = false;
  std::vector<std::string> cudaArch;
  bool explain = false;
  /// `pcc plan` (search and print) or --auto (search, then compile the
  /// winner).
  bool planOnly = false, autoPlan = false;
  /// Whether a flag of the plan search was given.
  bool planFlagsGiven = false;
  GivenPlanDims given;
};

/// Parses the command line (pcc's flags and MLIR's IR-printing ones; --help
/// shows those alone).
void parseCommandLine(int argc, char **argv);

/// The parsed flags, or the message of the first that is not valid (the
/// compile options' verify() included).
std::string readFlags(DriverFlags &driver, mlir::pcc::OnnxImportOptions &import,
                      mlir::pcc::CompileOptions &compile);

/// Reads --auto into `driver` and whether any plan-search flag was given
/// (PlanFlags.cpp).
void readPlanDriverFlags(DriverFlags &driver);

/// The plan search's request from --devices, --device-memory, --machine,
/// --top and which plan flags the user gave (after readFlags); the
/// message of the first that is not valid.
std::string readPlanFlags(const DriverFlags &driver,
                          const mlir::pcc::CompileOptions &compile,
                          mlir::pcc::PlanRequest &request);

} // namespace pcctool

#endif // PCC_TOOLS_PCC_FLAGS_H
