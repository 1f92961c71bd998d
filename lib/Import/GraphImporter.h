//===- GraphImporter.h - ONNX graph to one pcc function ---------*- C++ -*-===//

#ifndef PCC_LIB_IMPORT_GRAPHIMPORTER_H
#define PCC_LIB_IMPORT_GRAPHIMPORTER_H

#include "NodeImporter.h"

#include "pcc/Import/OnnxImporter.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/StringSet.h"

namespace mlir::pcc::onnx_import {

/// Decodes an initializer or Constant tensor (raw_data, typed fields or
/// external data relative to `baseDir`). Errors are reported at `loc`.
FailureOr<HostTensor> decodeTensor(const onnx::TensorProto &tensor,
                                   llvm::StringRef baseDir, Location loc);

/// The tensor's data as little-endian bytes in its own element type, from
/// raw_data, an external file or the typed fields.
FailureOr<std::string> tensorBytes(const onnx::TensorProto &tensor,
                                   llvm::StringRef baseDir, Location loc);

/// The bytes of the elements at the given flat `indices`, read without
/// loading the rest of an external tensor.
FailureOr<std::string> tensorElementBytes(const onnx::TensorProto &tensor,
                                          llvm::StringRef baseDir, Location loc,
                                          llvm::ArrayRef<int64_t> indices);

/// Checks that an initializer's data is present and has the right size
/// without decoding it (weights are read by the back end, not the importer).
LogicalResult checkTensorData(const onnx::TensorProto &tensor,
                              llvm::StringRef baseDir, Location loc);

/// Whether checkTensorData would succeed, without reporting anything
/// (pcc plan reads the weights it can and plans without the rest).
bool tensorDataReadable(const onnx::TensorProto &tensor,
                        llvm::StringRef baseDir, Location loc);

/// Checks that a tensor's dimensions are non-negative and that its size in
/// bytes fits in 64 bits (checkTensorData does this first).
LogicalResult checkTensorShape(const onnx::TensorProto &tensor, Location loc);

class GraphImporter {
public:
  GraphImporter(MLIRContext *context, const onnx::ModelProto &model,
                llvm::StringRef modelPath, const OnnxImportOptions &options);

  /// Builds `func.func @main` for the main graph into `module`.
  LogicalResult importInto(ModuleOp module);

  // Used by NodeImporter.
  ImportedValue *lookup(llvm::StringRef name);
  /// lookup(), or an error at `loc` naming a value nothing produced.
  FailureOr<ImportedValue *> lookupInput(llvm::StringRef name, Location loc);
  FailureOr<Value> materialize(llvm::StringRef name, Location loc);
  FailureOr<const HostTensor *> constantOf(llvm::StringRef name, Location loc);
  void define(llvm::StringRef name, ImportedValue value);
  llvm::StringRef getBaseDir() const { return baseDir; }
  /// Whether a node of the main graph reads `name` or the graph returns it.
  bool isConsumed(llvm::StringRef name) const {
    return consumed.contains(name);
  }
  const OnnxImportOptions &getOptions() const { return options; }
  /// A new random stream for a dropout (pcc.dropout's `stream`), in node
  /// order.
  int64_t nextRandomStream() { return randomStreams++; }

private:
  FailureOr<RankedTensorType> inputTypeOf(const onnx::ValueInfoProto &info);
  LogicalResult findTransposedCopies();
  LogicalResult importNode(const onnx::NodeProto &node, unsigned index);
  Location nodeLocation(const onnx::NodeProto &node, unsigned index);
  LogicalResult checkDeclaredOutput(const onnx::ValueInfoProto &info,
                                    Value value);

  MLIRContext *context;
  const onnx::ModelProto &model;
  std::string modelPath;
  std::string baseDir;
  const OnnxImportOptions &options;
  int64_t opset = 0;
  OpBuilder builder;
  Location fileLoc;
  llvm::StringMap<ImportedValue> values;
  llvm::StringSet<> consumed;
  int64_t randomStreams = 0;
};

} // namespace mlir::pcc::onnx_import

#endif // PCC_LIB_IMPORT_GRAPHIMPORTER_H
