//===- NodeImporter.cpp - per-node context for ONNX converters ------------===//

#include "GraphImporter.h"
#include "pcc/Import/OnnxImporter.h"
#include "pcc/runtime/DType.h"

#include "pcc/Dialect/Pcc/IR/ShapeRules.h"

using namespace mlir;
using namespace mlir::pcc;
using namespace mlir::pcc::onnx_import;

//===----------------------------------------------------------------------===//
// Element types
//===----------------------------------------------------------------------===//

namespace {
/// An ONNX element type pcc reads: its MLIR type and the runtime's.
struct ElementType {
  int32_t onnx;
  Type (*get)(MLIRContext *);
  ::pccrt::DType runtime;
};

template <typename T> Type get(MLIRContext *ctx) { return T::get(ctx); }
template <unsigned Width> Type getInt(MLIRContext *ctx) {
  return IntegerType::get(ctx, Width);
}

constexpr ElementType kElementTypes[] = {
    {onnx::TensorProto::FLOAT, get<Float32Type>, ::pccrt::DType::F32},
    {onnx::TensorProto::DOUBLE, get<Float64Type>, ::pccrt::DType::F64},
    {onnx::TensorProto::FLOAT16, get<Float16Type>, ::pccrt::DType::F16},
    {onnx::TensorProto::BFLOAT16, get<BFloat16Type>, ::pccrt::DType::BF16},
    {onnx::TensorProto::BOOL, getInt<1>, ::pccrt::DType::Bool},
    {onnx::TensorProto::INT8, getInt<8>, ::pccrt::DType::I8},
    {onnx::TensorProto::INT16, getInt<16>, ::pccrt::DType::I16},
    {onnx::TensorProto::INT32, getInt<32>, ::pccrt::DType::I32},
    {onnx::TensorProto::INT64, getInt<64>, ::pccrt::DType::I64},
    {onnx::TensorProto::UINT8,
     [](MLIRContext *ctx) -> Type {
       return IntegerType::get(ctx, 8, IntegerType::Unsigned);
     },
     ::pccrt::DType::U8},
};

const ElementType *findElementType(int32_t onnxType) {
  for (const ElementType &t : kElementTypes)
    if (t.onnx == onnxType)
      return &t;
  return nullptr;
}
} // namespace

Type onnx_import::convertOnnxElementType(MLIRContext *ctx, int32_t onnxType) {
  const ElementType *t = findElementType(onnxType);
  return t ? t->get(ctx) : Type();
}

std::optional<::pccrt::DType> mlir::pcc::getRuntimeDType(int32_t onnxType) {
  const ElementType *t = findElementType(onnxType);
  return t ? std::optional(t->runtime) : std::nullopt;
}

std::string onnx_import::onnxElementTypeName(int32_t onnxType) {
  if (onnx::TensorProto::DataType_IsValid(onnxType))
    return onnx::TensorProto::DataType_Name(
        static_cast<onnx::TensorProto::DataType>(onnxType));
  return "data type " + std::to_string(onnxType);
}

//===----------------------------------------------------------------------===//
// Inputs
//===----------------------------------------------------------------------===//

FailureOr<Value> NodeImporter::input(unsigned i) {
  if (!hasInput(i))
    return error() << node.op_type() << " needs input " << i;
  return graph.materialize(node.input(i), loc);
}

FailureOr<RankedTensorType> NodeImporter::inputType(unsigned i) {
  if (!hasInput(i))
    return error() << node.op_type() << " needs input " << i;
  ImportedValue *entry = graph.lookup(node.input(i));
  if (entry && entry->constant)
    return entry->constant->getType();
  auto value = input(i);
  if (failed(value))
    return failure();
  return cast<RankedTensorType>(value->getType());
}

int64_t NodeImporter::maxFoldElements() const {
  return graph.getOptions().foldLimit;
}

const HostTensor *NodeImporter::constant(unsigned i) {
  if (!hasInput(i))
    return nullptr;
  ImportedValue *entry = graph.lookup(node.input(i));
  if (!entry)
    return nullptr;
  if (entry->constant)
    return &*entry->constant;
  // A splat (ConstantOfShape) may stand for far more elements than the host
  // folds; such a value stays in IR.
  if (entry->value)
    if (auto cst = entry->value.getDefiningOp<ConstantOp>())
      if (cst.getValue().getNumElements() <= maxFoldElements()) {
        entry->constant = HostTensor::fromAttr(cst.getValue());
        return &*entry->constant;
      }
  return nullptr;
}

FailureOr<HostTensor> NodeImporter::requireConstant(unsigned i,
                                                    StringRef what) {
  if (!hasInput(i))
    return error() << node.op_type() << " needs its " << what << " (input " << i
                   << ")";
  auto tensor = graph.constantOf(node.input(i), loc);
  if (failed(tensor))
    return failure();
  if (!*tensor)
    return error() << node.op_type() << " needs a constant " << what
                   << " but input '" << node.input(i)
                   << "' is computed at run time: data-dependent shapes and "
                      "attributes are not supported";
  return **tensor;
}

bool NodeImporter::allInputsConstant() {
  for (unsigned i = 0; i < numInputs(); ++i)
    if (hasInput(i) && !constant(i))
      return false;
  return true;
}

//===----------------------------------------------------------------------===//
// Attributes
//===----------------------------------------------------------------------===//

const onnx::AttributeProto *NodeImporter::attr(StringRef name) const {
  for (const auto &a : node.attribute())
    if (a.name() == name)
      return &a;
  return nullptr;
}

int64_t NodeImporter::intAttr(StringRef name, int64_t defaultValue) const {
  const auto *a = attr(name);
  return a ? a->i() : defaultValue;
}

float NodeImporter::floatAttr(StringRef name, float defaultValue) const {
  const auto *a = attr(name);
  return a ? a->f() : defaultValue;
}

std::string NodeImporter::stringAttr(StringRef name,
                                     StringRef defaultValue) const {
  const auto *a = attr(name);
  return a ? a->s() : defaultValue.str();
}

std::optional<SmallVector<int64_t>>
NodeImporter::intsAttr(StringRef name) const {
  const auto *a = attr(name);
  if (!a)
    return std::nullopt;
  return SmallVector<int64_t>(a->ints().begin(), a->ints().end());
}

//===----------------------------------------------------------------------===//
// Outputs
//===----------------------------------------------------------------------===//

void NodeImporter::setOutput(unsigned i, Value value) {
  if (!outputUsed(i))
    return;
  ImportedValue entry;
  entry.value = value;
  graph.define(node.output(i), std::move(entry));
}

void NodeImporter::setConstantOutput(unsigned i, HostTensor value) {
  if (!outputUsed(i))
    return;
  ImportedValue entry;
  entry.constant = std::move(value);
  graph.define(node.output(i), std::move(entry));
}

void NodeImporter::alias(unsigned output, unsigned input) {
  if (!outputUsed(output) || !hasInput(input))
    return;
  if (ImportedValue *entry = graph.lookup(node.input(input)))
    graph.define(node.output(output), *entry);
}

bool NodeImporter::outputConsumed(unsigned i) const {
  return outputUsed(i) && graph.isConsumed(node.output(i));
}

LogicalResult NodeImporter::rejectOutputsFrom(unsigned first, StringRef why) {
  for (unsigned i = first; i < numOutputs(); ++i)
    if (outputUsed(i))
      return error() << node.op_type() << " output " << i << " ('"
                     << node.output(i) << "') is not supported: " << why;
  return success();
}

//===----------------------------------------------------------------------===//
// Building helpers
//===----------------------------------------------------------------------===//

Value NodeImporter::constantValue(const HostTensor &t) {
  return create<ConstantOp>(t.toAttr());
}

Value NodeImporter::splat(RankedTensorType type, double value) {
  return create<ConstantOp>(getSplatAttr(type, value));
}

Value NodeImporter::reshape(Value v, ArrayRef<int64_t> shape) {
  auto type = cast<RankedTensorType>(v.getType());
  if (type.getShape() == shape)
    return v;
  return create<ReshapeOp>(RankedTensorType::get(shape, type.getElementType()),
                           v);
}

Value NodeImporter::broadcastTo(Value v, ArrayRef<int64_t> shape) {
  auto type = cast<RankedTensorType>(v.getType());
  if (type.getShape() == shape)
    return v;
  return create<BroadcastOp>(
      RankedTensorType::get(shape, type.getElementType()), v);
}

FailureOr<SmallVector<Value>>
NodeImporter::broadcastTogether(ArrayRef<Value> values) {
  SmallVector<int64_t> shape;
  for (Value v : values) {
    auto vShape = cast<RankedTensorType>(v.getType()).getShape();
    auto merged = broadcastShapes(shape, vShape);
    if (!merged)
      return error() << node.op_type() << ": operand shapes "
                     << shapeToString(shape) << " and " << shapeToString(vShape)
                     << " do not broadcast";
    shape = *merged;
  }
  SmallVector<Value> out;
  for (Value v : values)
    out.push_back(broadcastTo(v, shape));
  return out;
}

FailureOr<int64_t> NodeImporter::axis(int64_t value, int64_t rank,
                                      StringRef what) {
  auto normalized = normalizeAxis(value, rank);
  if (!normalized)
    return error() << node.op_type() << ": " << what << " " << value
                   << " is out of range for rank " << rank;
  return *normalized;
}

//===----------------------------------------------------------------------===//
// Converter table
//===----------------------------------------------------------------------===//

const llvm::StringMap<ConverterFn> &onnx_import::getConverters() {
  static const llvm::StringMap<ConverterFn> table = [] {
    llvm::StringMap<ConverterFn> t;
    registerElementwiseConverters(t);
    registerShapeConverters(t);
    registerNeuralConverters(t);
    registerIndexingConverters(t);
    registerCompositeConverters(t);
    return t;
  }();
  return table;
}
