//===- OnnxImporter.h - ONNX model to pcc dialect ---------------*- C++ -*-===//
//
// Reads an ONNX model (binary protobuf, or ONNX text format for files ending
// in .onnxtxt) with ONNX's own protobuf classes and builds a module with one
// `func.func @main` in the pcc dialect. Symbolic dimensions must be bound
// through the options; shape sub-graphs are then folded to constants.
// Every op carries the location `fused<"OpType">["node name"]`, so any later
// diagnostic can name the ONNX node.
//
//===----------------------------------------------------------------------===//

#ifndef PCC_IMPORT_ONNXIMPORTER_H
#define PCC_IMPORT_ONNXIMPORTER_H

#include "pcc/runtime/DType.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/ADT/StringSet.h"

#include <optional>
#include <string>
#include <vector>

namespace mlir::pcc {

/// The largest value, in elements, the importer evaluates on the host by
/// default (OnnxImportOptions::foldLimit).
inline constexpr int64_t kDefaultFoldLimit = int64_t(1) << 22;

struct OnnxImportOptions {
  /// Values for symbolic dimensions, by their ONNX `dim_param` name.
  llvm::StringMap<int64_t> dimBindings;
  /// Binds the leading dimension of every graph input when it is symbolic
  /// or unknown (`pcc --batch=N`). `dimBindings` wins where both apply.
  std::optional<int64_t> batch;
  /// Runs onnx::checker on the model before importing it.
  bool runChecker = true;
  /// Emits a remark for each initializer found to be a transposed copy of
  /// another (stored once either way); `pcc --explain` lists them.
  bool remarkSharedWeights = false;
  /// Imports the graph for training (`pcc --train`): Dropout in training
  /// mode becomes pcc.dropout. Otherwise it is imported in eval mode, as
  /// torch.nn.Module.eval() runs it (an identity), like batch norm.
  bool training = false;
  /// Reads shapes alone (pcc plan): a weight stored in an external file
  /// is not looked for, so a model plans with its `.onnx.data` left out.
  /// Transposed copies are then not found (each is counted on its own).
  bool shapesOnly = false;
  /// Binds the leading dimension of every graph input where it is
  /// symbolic, over `dimBindings` and `batch`: the plan search imports
  /// one row to price a plan by.
  std::optional<int64_t> rows;
  /// The largest value, in elements, evaluated on the host while
  /// importing; a larger one is computed in IR where its op has an IR form
  /// (`pcc --import-fold-limit`: tests make a small model take the path
  /// of a large one's masks).
  int64_t foldLimit = kDefaultFoldLimit;
};

/// Imports the model at `path`. On failure the error has been reported
/// through the context's diagnostic engine and the result is failure.
FailureOr<OwningOpRef<ModuleOp>>
importOnnxFile(llvm::StringRef path, MLIRContext *context,
               const OnnxImportOptions &options = {});

/// What one initializer holds, decoded from wherever ONNX stores it.
struct OnnxWeightSummary {
  std::string name;
  std::string elementType; // ONNX name: FLOAT, INT64, ...
  std::vector<int64_t> shape;
  std::string storage; // "raw", "typed" or "external:<file>"
  int64_t count = 0;
  double min = 0, max = 0, mean = 0;
};

/// Decodes every initializer of the model at `path` and summarises it
/// (`pcc --emit=weights`). Fails with a diagnostic on missing or short data.
FailureOr<std::vector<OnnxWeightSummary>>
summarizeOnnxWeights(llvm::StringRef path, MLIRContext *context);

/// Writes the initializers called `names` of the model at `modelPath` to a
/// safetensors file (the weights file of a compiled model), in that order;
/// those in `narrow` (float32 initializers) rounded to bfloat16, or to
/// float16 with `toF16` (to nearest even), as a library compiled with
/// --precision=bf16 (fp16) reads them.
LogicalResult writeOnnxWeights(llvm::StringRef modelPath,
                               llvm::ArrayRef<std::string> names,
                               llvm::StringRef outputPath, MLIRContext *context,
                               const llvm::StringSet<> *narrow = nullptr,
                               bool toF16 = false);

/// Writes the model at `modelPath` with the weights of a training
/// checkpoint (`weightsPath`, a safetensors file named after the ONNX
/// initializers) to `outputPath`, a self-contained ONNX file. An
/// initializer the checkpoint lacks but whose original value is the
/// transpose of one it holds (a tied weight the exporter wrote twice, which
/// pcc trains as one) gets that weight's trained value, transposed; other
/// initializers (constants) are kept. The graph is written in eval mode:
/// BatchNormalization without training_mode (its running statistics, which
/// training updated), Dropout without its training_mode input. Returns the
/// number of initializers replaced.
FailureOr<int64_t> exportTrainedOnnx(llvm::StringRef modelPath,
                                     llvm::StringRef weightsPath,
                                     llvm::StringRef outputPath,
                                     MLIRContext *context);

/// A tensor stored in its own file (ONNX test data: input_0.pb, ...).
struct OnnxTensorFile {
  std::string name;
  ::pccrt::DType dtype;
  std::vector<int64_t> shape;
  std::string bytes; // little-endian, dtype-sized elements
};

/// Reads a serialized onnx.TensorProto.
FailureOr<OnnxTensorFile> readOnnxTensorFile(llvm::StringRef path,
                                             MLIRContext *context);

/// The runtime's dtype for an ONNX TensorProto data type, if it has one.
std::optional<::pccrt::DType> getRuntimeDType(int32_t onnxType);

/// ONNX op types (default domain) the importer converts, sorted. Some only
/// when their inputs fold to constants (Shape, Range, ConstantOfShape, ...).
std::vector<std::string> getSupportedOnnxOps();
bool isSupportedOnnxOp(llvm::StringRef opType);

} // namespace mlir::pcc

#endif // PCC_IMPORT_ONNXIMPORTER_H
