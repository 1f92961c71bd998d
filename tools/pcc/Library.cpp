//===- Library.cpp - pcc -o model.so: the library and its weights ---------===//

#include "Library.h"

#include "pcc/Analysis/Explain.h"
#include "pcc/Dialect/Pcc/IR/Contracts.h"
#include "pcc/Dialect/Pcc/IR/Layout.h"
#include "pcc/Dialect/Pcc/IR/PccDialect.h"
#include "pcc/Import/OnnxImporter.h"
#include "pcc/Target/Cpp.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Support/FileUtilities.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/ToolOutputFile.h"
#include "llvm/Support/raw_ostream.h"

using namespace mlir;
using namespace mlir::pcc;

static int fail(const llvm::Twine &message) {
  llvm::errs() << "pcc: error: " << message << "\n";
  return 1;
}

int pcctool::writeLibrary(ModuleOp module, const DriverFlags &flags,
                          const pcc::CompileOptions &options, bool cppOnly) {
  std::string weightsPath = flags.outputFile;
  if (StringRef(weightsPath).ends_with(".so"))
    weightsPath.resize(weightsPath.size() - 3);
  weightsPath += ".safetensors";
  // An offloaded optimizer runs the CPU code of its update phase.
  unsigned targets =
      options.target == pcc::DeviceTarget::Cpu ? pcc::kTargetCpu
      : options.target == pcc::DeviceTarget::Cuda && !options.isOffloading()
          ? pcc::kTargetCuda
          : pcc::kTargetCpu | pcc::kTargetCuda;
  pcc::CppEmitOptions emitOptions;
  emitOptions.targets = targets;
  emitOptions.source = flags.inputFile;
  emitOptions.weightsFile = llvm::sys::path::filename(weightsPath).str();
  std::string source;
  llvm::raw_string_ostream sourceStream(source);
  if (failed(pcc::emitCpp(module, sourceStream, emitOptions)))
    return 1;
  if (cppOnly) {
    std::string errorMessage;
    auto output = openOutputFile(flags.outputFile, &errorMessage);
    if (!output)
      return fail("cannot write '" + flags.outputFile + "': " + errorMessage);
    output->os() << source;
    output->keep();
    return 0;
  }
  // The weights file holds the initializers; gradients and optimizer
  // state (`<weight>@<kind>`) start at zero in the runtime.
  std::vector<std::string> names;
  for (auto &[name, type] : pcc::getWeightOrder(module))
    if (pcc::splitStateName(name).second.empty())
      names.push_back(name);
  // Bytes in the file (whole weights) and bytes one rank reads (its
  // slices of split weights, plus every weight some op reads whole).
  // A pipeline rank reads only its stage's weights.
  llvm::StringMap<int64_t> wholeBytes;
  llvm::DenseMap<Operation *, llvm::StringMap<int64_t>> stageBytes;
  module->walk([&](pcc::ParamOp param) {
    int64_t local = getTensorBytes(param.getType());
    int64_t whole = local;
    if (pcc::ShardingAttr shard = param.getShardAttr())
      whole = shard.isFlat()
                  ? getTensorBytes(RankedTensorType::get(
                        *param.getWhole(), param.getType().getElementType()))
                  : whole * *pcc::getMeshAxisSize(param, shard.getAxis());
    if (!pcc::splitStateName(param.getName()).second.empty())
      return; // training state, not stored
    wholeBytes[param.getName()] = whole;
    int64_t &read =
        stageBytes[param->getParentOfType<func::FuncOp>()][param.getName()];
    read = std::max(read, local);
  });
  int64_t weightBytes = 0, bytesPerRank = 0;
  for (auto &entry : wholeBytes)
    weightBytes += entry.second;
  for (auto &[stage, bytes] : stageBytes) {
    int64_t sum = 0;
    for (auto &entry : bytes)
      sum += entry.second;
    bytesPerRank = std::max(bytesPerRank, sum);
  }
  // Weights the library reads as bf16 or fp16 (inference with
  // --precision=bf16 or fp16).
  llvm::StringSet<> narrow;
  bool toF16 = false;
  module->walk([&](pcc::ParamOp param) {
    mlir::Type element = param.getType().getElementType();
    if ((element.isBF16() || element.isF16()) &&
        pcc::splitStateName(param.getName()).second.empty()) {
      narrow.insert(param.getName());
      toF16 = element.isF16();
    }
  });
  if (failed(pcc::writeOnnxWeights(flags.inputFile, names, weightsPath,
                                   module.getContext(), &narrow, toF16)))
    return 1;
  pcc::BuildOptions buildOptions;
  buildOptions.keepSource = flags.keepSource;
  buildOptions.targets = targets;
  for (const std::string &arch : flags.cudaArch) {
    int64_t n = 0;
    if (StringRef(arch).getAsInteger(10, n) || n < 50)
      return fail("--cuda-arch=" + arch +
                  " is not a GPU architecture number such as 80 or 90");
    buildOptions.cudaArchitectures.push_back(arch);
  }
  if (targets & pcc::kTargetCuda) {
    std::vector<std::string> archs = buildOptions.cudaArchitectures;
    if (archs.empty())
      archs = pcc::getDefaultCudaArchitectures();
    std::string list;
    for (const std::string &arch : archs)
      list += (list.empty() ? "sm_" : ", sm_") + arch;
    llvm::errs() << "pcc: compiling CUDA kernels with nvcc for " << list
                 << "\n";
  }
  if (failed(pcc::buildSharedLibrary(module.getContext(), source,
                                     flags.outputFile, buildOptions)))
    return 1;
  int64_t arena = rankArenaBytes(module);
  llvm::errs() << "pcc: wrote " << flags.outputFile << " ("
               << (options.target == pcc::DeviceTarget::Cpu    ? "cpu"
                   : options.target == pcc::DeviceTarget::Cuda ? "cuda"
                                                               : "cpu+cuda")
               << ", arena " << arena << " bytes) and " << weightsPath << " ("
               << names.size() << " weights, " << weightBytes << " bytes";
  if (options.tp > 1 && options.pp == 1 && options.dp == 1)
    llvm::errs() << "; each of the " << options.tp << " tp ranks reads "
                 << bytesPerRank;
  else if (options.pp == 1 && bytesPerRank < weightBytes)
    llvm::errs() << "; each of the " << options.tp * options.dp
                 << " ranks reads " << bytesPerRank;
  else if (options.pp > 1)
    llvm::errs() << "; each of the " << options.tp * options.pp * options.dp
                 << " ranks reads at most " << bytesPerRank;
  llvm::errs() << ")\n";
  return 0;
}
