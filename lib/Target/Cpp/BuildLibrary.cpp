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

/// Splits a configure-time list ("80,90").
static std::vector<std::string> splitList(StringRef list) {
  SmallVector<StringRef> parts;
  list.split(parts, ',', -1, /*KeepEmpty=*/false);
  return std::vector<std::string>(parts.begin(), parts.end());
}

std::vector<std::string> mlir::pcc::getDefaultCudaArchitectures() {
  return splitList(setting("PCC_CUDA_ARCHITECTURES", PCC_CUDA_ARCHITECTURES));
}

LogicalResult mlir::pcc::buildSharedLibrary(MLIRContext *context,
                                            StringRef source,
                                            StringRef outputPath,
                                            const BuildOptions &options) {
  Location loc = FileLineColLoc::get(context, outputPath, 0, 0);
  bool cuda = options.targets & kTargetCuda;
  std::string compiler;
  if (cuda) {
    if (!PCC_HAVE_CUDA)
      return emitError(loc)
             << "--target=cuda: this pcc was built without the CUDA backend "
                "(no CUDA toolkit was found when it was configured)";
    compiler = options.nvcc.empty() ? setting("PCC_NVCC", PCC_NVCC_COMPILER)
                                    : options.nvcc;
  } else {
    compiler = options.compiler.empty() ? setting("PCC_CXX", PCC_CXX_COMPILER)
                                        : options.compiler;
  }
  auto program = llvm::sys::findProgramByName(compiler);
  // A path is returned as given: check that it runs.
  if (program && !llvm::sys::fs::can_execute(*program))
    program = std::make_error_code(std::errc::no_such_file_or_directory);
  if (!program) {
    if (cuda)
      return emitError(loc) << "--target=cuda needs nvcc, but '" << compiler
                            << "' was not found (install the CUDA toolkit or "
                               "set PCC_NVCC)";
    return emitError(loc) << "C++ compiler '" << compiler
                          << "' not found (set PCC_CXX)";
  }
  std::string includeDir =
      setting("PCC_RUNTIME_INCLUDE_DIR", PCC_RUNTIME_INCLUDE_DIR);
  std::string libraryDir =
      setting("PCC_RUNTIME_LIBRARY_DIR", PCC_RUNTIME_LIBRARY_DIR);

  StringRef extension = cuda ? "cu" : "cpp";
  std::string sourcePath = (outputPath + "." + extension).str();
  if (!options.keepSource) {
    SmallString<128> tmp;
    if (llvm::sys::fs::createTemporaryFile("pcc-model", extension, tmp))
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

  std::string out = outputPath.str();
  std::vector<std::string> args = {*program,
                                   "-std=c++17",
                                   options.optimization,
                                   "-shared",
                                   "-I" + includeDir,
                                   sourcePath,
                                   "-o",
                                   out,
                                   "-L" + libraryDir};
  if (cuda) {
    // One fatbin with machine code for every architecture asked for, plus
    // PTX of the newest so that later GPUs can JIT it.
    std::vector<std::string> archs = options.cudaArchitectures.empty()
                                         ? getDefaultCudaArchitectures()
                                         : options.cudaArchitectures;
    for (const std::string &arch : archs)
      args.push_back("-gencode=arch=compute_" + arch + ",code=sm_" + arch);
    if (!archs.empty())
      args.push_back("-gencode=arch=compute_" + archs.back() +
                     ",code=compute_" + archs.back());
    llvm::append_range(
        args, std::vector<std::string>{
                  "--expt-relaxed-constexpr", "-w",
                  "-Xcompiler=-fPIC,-fno-trapping-math,-fno-math-errno",
                  "-cudart=shared", "-lpcc_runtime_cuda", "-lpcc_runtime",
                  "-Xlinker=-rpath," + libraryDir,
                  "-Xlinker=-rpath," + std::string(PCC_CUDA_LIBRARY_DIR)});
  } else {
    // Neither -fno-trapping-math nor -fno-math-errno changes a value (no
    // reassociation, no finite-math assumptions); they let GCC vectorise
    // the generated loops, whose sqrt calls would otherwise count as
    // errno-setting. Kernels with selects turn GCC's loop if-conversion off
    // themselves (PCC_SELECT_KERNEL, LibraryEmitter.cpp).
    llvm::append_range(args, std::vector<std::string>{
                                 "-fPIC", "-w", "-fno-trapping-math",
                                 "-fno-math-errno", "-fopenmp", "-lpcc_runtime",
                                 "-Wl,-rpath," + libraryDir});
  }
  SmallVector<StringRef> argRefs(args.begin(), args.end());
  std::optional<StringRef> redirects[] = {std::nullopt, logPath.str(),
                                          logPath.str()};
  std::string execError;
  int rc = llvm::sys::ExecuteAndWait(*program, argRefs, std::nullopt, redirects,
                                     /*SecondsToWait=*/900, 0, &execError);
  std::string log;
  if (auto buffer = llvm::MemoryBuffer::getFile(logPath))
    log = (*buffer)->getBuffer().take_front(2000).str();
  llvm::sys::fs::remove(logPath);
  if (!options.keepSource)
    llvm::sys::fs::remove(sourcePath);
  if (rc != 0)
    return emitError(loc) << "compiling the generated code with '" << compiler
                          << "' failed ("
                          << (execError.empty() ? "exit " + std::to_string(rc)
                                                : execError)
                          << "); compiler output:\n"
                          << log;
  return success();
}
