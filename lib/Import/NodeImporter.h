//===- NodeImporter.h - per-node context for ONNX converters ----*- C++ -*-===//
//
// Converters are plain functions keyed by ONNX op type (OnnxOpConverters.cpp
// and friends). Each receives a NodeImporter, which gives typed access to the
// node's inputs (as SSA values, or as host constants when they folded) and
// attributes, builds ops at the node's location, and records outputs.
//
//===----------------------------------------------------------------------===//

#ifndef PCC_LIB_IMPORT_NODEIMPORTER_H
#define PCC_LIB_IMPORT_NODEIMPORTER_H

#include "HostTensor.h"

#include "pcc/Dialect/Pcc/IR/PccDialect.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/Diagnostics.h"
#include "llvm/ADT/StringMap.h"

#include <onnx/onnx_pb.h>
#include <optional>

namespace mlir::pcc::onnx_import {

/// What the importer knows about one ONNX value name.
struct ImportedValue {
  /// The SSA value, once materialised.
  Value value;
  /// The value's contents when it is known at import time.
  std::optional<HostTensor> constant;
  /// The initializer it comes from, if any (weights become pcc.param).
  const onnx::TensorProto *initializer = nullptr;
  /// For an initializer that holds exactly the transpose of another (a tied
  /// weight the exporter wrote twice): that other initializer's name. The
  /// value is imported as a transpose of it, and stored once.
  std::string transposeOf;
  /// Set for node outputs pcc cannot produce (e.g. Dropout's mask): using
  /// the value is an error with this reason, leaving it unused is fine.
  std::string unsupportedReason;
};

class GraphImporter;

class NodeImporter {
public:
  NodeImporter(GraphImporter &graph, const onnx::NodeProto &node, int64_t opset,
               OpBuilder &builder, Location loc)
      : graph(graph), node(node), opset(opset), builder(builder), loc(loc) {}

  const onnx::NodeProto &getNode() const { return node; }
  int64_t getOpset() const { return opset; }
  /// Largest constant (in elements) the importer folds on the host; bigger
  /// results are computed in IR when the op has an IR form
  /// (OnnxImportOptions::foldLimit).
  int64_t maxFoldElements() const;
  OpBuilder &getBuilder() { return builder; }
  Location getLoc() const { return loc; }
  MLIRContext *getContext() { return builder.getContext(); }

  //===--- inputs ---------------------------------------------------------===//
  unsigned numInputs() const { return node.input_size(); }
  /// Whether optional input `i` is given (present with a non-empty name).
  bool hasInput(unsigned i) const {
    return static_cast<int>(i) < node.input_size() && !node.input(i).empty();
  }
  /// Input `i` as an SSA value; host constants are materialised as
  /// pcc.constant and initializers as pcc.param.
  FailureOr<Value> input(unsigned i);
  /// The type of input `i`.
  FailureOr<RankedTensorType> inputType(unsigned i);
  /// Input `i`'s contents if it is known at import time, else null.
  const HostTensor *constant(unsigned i);
  /// Input `i`'s contents; reports an error naming `what` if not constant.
  FailureOr<HostTensor> requireConstant(unsigned i, llvm::StringRef what);
  /// Whether every given input is known at import time.
  bool allInputsConstant();

  //===--- attributes -----------------------------------------------------===//
  const onnx::AttributeProto *attr(llvm::StringRef name) const;
  int64_t intAttr(llvm::StringRef name, int64_t defaultValue) const;
  float floatAttr(llvm::StringRef name, float defaultValue) const;
  std::string stringAttr(llvm::StringRef name,
                         llvm::StringRef defaultValue) const;
  std::optional<SmallVector<int64_t>> intsAttr(llvm::StringRef name) const;

  //===--- outputs --------------------------------------------------------===//
  unsigned numOutputs() const { return node.output_size(); }
  /// Whether output `i` exists and is consumed (named).
  bool outputUsed(unsigned i) const {
    return static_cast<int>(i) < node.output_size() && !node.output(i).empty();
  }
  /// Whether output `i` is read by a node or returned by the graph.
  bool outputConsumed(unsigned i) const;
  GraphImporter &getGraph() { return graph; }
  void setOutput(unsigned i, Value value);
  void setConstantOutput(unsigned i, HostTensor value);
  /// Output `output` is input `input` (Identity, Dropout in inference).
  void alias(unsigned output, unsigned input);
  /// Fails with an error if any output from `first` on is used.
  LogicalResult rejectOutputsFrom(unsigned first, llvm::StringRef why);

  //===--- building helpers -----------------------------------------------===//
  InFlightDiagnostic error() { return emitError(loc); }
  template <typename OpTy, typename... Args> OpTy create(Args &&...args) {
    return OpTy::create(builder, loc, std::forward<Args>(args)...);
  }
  /// Creates an op whose result types are inferred, reporting the shape
  /// error at the node instead of aborting as ODS's inferring builders do.
  template <typename OpTy, typename... Args>
  FailureOr<OpTy> createChecked(Args &&...args) {
    OperationState state(loc, OpTy::getOperationName());
    SmallVector<Type, 1> placeholder;
    if constexpr (OpTy::template hasTrait<OpTrait::OneResult>())
      placeholder.push_back(builder.getNoneType());
    OpTy::build(builder, state, TypeRange(placeholder),
                std::forward<Args>(args)...);
    SmallVector<Type> types;
    if (failed(OpTy::inferReturnTypes(
            getContext(), loc, state.operands,
            state.attributes.getDictionary(getContext()),
            state.getRawProperties(), state.regions, types)))
      return failure();
    state.types.assign(types.begin(), types.end());
    return cast<OpTy>(builder.create(state));
  }
  /// createChecked, then records the op's single result as output 0.
  template <typename OpTy, typename... Args>
  LogicalResult produce(Args &&...args) {
    auto op = createChecked<OpTy>(std::forward<Args>(args)...);
    if (failed(op))
      return failure();
    setOutput(0, *op);
    return success();
  }
  Value constantValue(const HostTensor &t);
  /// A constant of `type` with every element equal to `value`.
  Value splat(RankedTensorType type, double value);
  Value reshape(Value v, llvm::ArrayRef<int64_t> shape);
  Value broadcastTo(Value v, llvm::ArrayRef<int64_t> shape);
  /// Broadcasts all values to their common numpy shape; reports an error
  /// naming the shapes when they are incompatible.
  FailureOr<SmallVector<Value>> broadcastTogether(llvm::ArrayRef<Value> values);
  /// Normalises an ONNX axis for a tensor of `rank`, or reports an error.
  FailureOr<int64_t> axis(int64_t value, int64_t rank, llvm::StringRef what);

private:
  GraphImporter &graph;
  const onnx::NodeProto &node;
  int64_t opset;
  OpBuilder &builder;
  Location loc;
};

/// Converts one node. Converters fold to host constants themselves when
/// their inputs are constant and the op is cheap to evaluate.
using ConverterFn = LogicalResult (*)(NodeImporter &);

/// The table of converters, keyed by ONNX op type.
const llvm::StringMap<ConverterFn> &getConverters();

/// Registration of each converter group (one per source file).
void registerElementwiseConverters(llvm::StringMap<ConverterFn> &table);
void registerShapeConverters(llvm::StringMap<ConverterFn> &table);
void registerNeuralConverters(llvm::StringMap<ConverterFn> &table);
void registerIndexingConverters(llvm::StringMap<ConverterFn> &table);
void registerCompositeConverters(llvm::StringMap<ConverterFn> &table);

/// Maps an ONNX TensorProto data type to an MLIR element type, or null.
Type convertOnnxElementType(MLIRContext *context, int32_t onnxType);
/// The ONNX name of a data type ("FLOAT", "INT64", ...), for diagnostics.
std::string onnxElementTypeName(int32_t onnxType);

} // namespace mlir::pcc::onnx_import

#endif // PCC_LIB_IMPORT_NODEIMPORTER_H
