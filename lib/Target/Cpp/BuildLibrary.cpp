//===- BuildLibrary.cpp - compile generated C++ into model.so -------------===//

#include "pcc/Target/Cpp.h"

#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/Location.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/Program.h"
#include "llvm/Support/raw_ostream.h"

#include <cstdlib>

using namespace mlir;
using namespace mlir::pcc;

/// A configure-time path, overridable by an environment variable.
static std::string setting(const char *env, const char *builtIn) {
  const char *value = std::getenv(env);
  return value && *value ? value : builtIn;
}

LogicalResult mlir::pcc::buildSharedLibrary(MLIRContext *context,
                                            StringRef source,
                                            StringRef outputPath,
                                            const BuildOptions &options) {
  Location loc = FileLineColLoc::get(context, outputPath, 0, 0);
  std::string compiler = options.compiler.empty()
                             ? setting("PCC_CXX", PCC_CXX_COMPILER)
                             : options.compiler;
  auto program = llvm::sys::findProgramByName(compiler);
  if (!program)
    return emitError(loc) << "C++ compiler '" << compiler
                          << "' not found (set PCC_CXX)";
  std::string includeDir =
      setting("PCC_RUNTIME_INCLUDE_DIR", PCC_RUNTIME_INCLUDE_DIR);
  std::string libraryDir =
      setting("PCC_RUNTIME_LIBRARY_DIR", PCC_RUNTIME_LIBRARY_DIR);

  std::string sourcePath = (outputPath + ".cpp").str();
  if (!options.keepSource) {
    SmallString<128> tmp;
    if (llvm::sys::fs::createTemporaryFile("pcc-model", "cpp", tmp))
      return emitError(loc) << "cannot create a temporary file";
    sourcePath = tmp.str().str();
  }
  {
    std::error_code ec;
    llvm::raw_fd_ostream os(sourcePath, ec);
    if (ec)
      return emitError(loc)
             << "cannot write '" << sourcePath << "': " << ec.message();
    os << source;
  }
  SmallString<128> logPath;
  if (llvm::sys::fs::createTemporaryFile("pcc-cxx", "log", logPath))
    return emitError(loc) << "cannot create a temporary file";

  std::string rpath = "-Wl,-rpath," + libraryDir;
  std::string libFlag = "-L" + libraryDir;
  std::string incFlag = "-I" + includeDir;
  std::string out = outputPath.str();
  SmallVector<StringRef> args = {
      *program,   "-std=c++17", "-O3", "-fPIC", "-shared",       "-w", incFlag,
      sourcePath, "-o",         out,   libFlag, "-lpcc_runtime", rpath};
  std::optional<StringRef> redirects[] = {std::nullopt, logPath.str(),
                                          logPath.str()};
  std::string execError;
  int rc = llvm::sys::ExecuteAndWait(*program, args, std::nullopt, redirects,
                                     /*SecondsToWait=*/600, 0, &execError);
  std::string log;
  if (auto buffer = llvm::MemoryBuffer::getFile(logPath))
    log = (*buffer)->getBuffer().take_front(2000).str();
  llvm::sys::fs::remove(logPath);
  if (!options.keepSource)
    llvm::sys::fs::remove(sourcePath);
  if (rc != 0)
    return emitError(loc) << "compiling the generated code failed ("
                          << (execError.empty() ? "exit " + std::to_string(rc)
                                                : execError)
                          << "); compiler output:\n"
                          << log;
  return success();
}
