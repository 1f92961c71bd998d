//===- PccDialect.cpp - pcc dialect registration, attributes ------------===//

#include "pcc/Dialect/Pcc/IR/PccDialect.h"
#include "pcc/Dialect/Pcc/IR/Contracts.h"

#include "pcc/Dialect/Pcc/IR/Layout.h"
#include "pcc/Dialect/Pcc/IR/ScheduleAttr.h"
#include "llvm/ADT/StringSet.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/DialectImplementation.h"
#include "mlir/Interfaces/FunctionInterfaces.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace mlir::pcc;

#include "pcc/Dialect/Pcc/IR/PccOpsDialect.cpp.inc"

#define GET_ATTRDEF_CLASSES
#include "pcc/Dialect/Pcc/IR/PccAttrs.cpp.inc"

void PccDialect::initialize() {
  addOperations<
#define GET_OP_LIST
#include "pcc/Dialect/Pcc/IR/PccOps.cpp.inc"
      >();
  addAttributes<
#define GET_ATTRDEF_LIST
#include "pcc/Dialect/Pcc/IR/PccAttrs.cpp.inc"
      >();
  registerPccInterfaceModels(getContext());
  registerPccAutodiffModels(getContext());
}

Operation *PccDialect::materializeConstant(OpBuilder &builder, Attribute value,
                                           Type type, Location loc) {
  auto elements = dyn_cast<ElementsAttr>(value);
  if (!elements || elements.getType() != type)
    return nullptr;
  return ConstantOp::create(builder, loc, elements);
}

//===----------------------------------------------------------------------===//
// #pcc.shard<replicated> | <axis, partial> | <axis, dim = D[, stripes = S]>
//===----------------------------------------------------------------------===//

Attribute ShardingAttr::parse(AsmParser &parser, Type) {
  MLIRContext *context = parser.getContext();
  if (parser.parseLess())
    return {};
  std::string axis;
  if (parser.parseKeywordOrString(&axis))
    return {};
  if (axis == "replicated") {
    if (parser.parseGreater())
      return {};
    return ShardingAttr::replicated(context);
  }
  if (parser.parseComma())
    return {};
  if (succeeded(parser.parseOptionalKeyword("partial"))) {
    if (parser.parseGreater())
      return {};
    return ShardingAttr::partial(context, axis);
  }
  if (succeeded(parser.parseOptionalKeyword("flat"))) {
    if (parser.parseGreater())
      return {};
    return ShardingAttr::flat(context, axis);
  }
  int64_t dim = 0, stripes = 1;
  if (parser.parseKeyword("dim") || parser.parseEqual() ||
      parser.parseInteger(dim))
    return {};
  if (succeeded(parser.parseOptionalComma()) &&
      (parser.parseKeyword("stripes") || parser.parseEqual() ||
       parser.parseInteger(stripes)))
    return {};
  if (parser.parseGreater())
    return {};
  if (dim < 0 || stripes < 1) {
    parser.emitError(parser.getNameLoc(),
                     "#pcc.shard needs dim >= 0 and stripes >= 1");
    return {};
  }
  return ShardingAttr::split(context, axis, dim, stripes);
}

void ShardingAttr::print(AsmPrinter &printer) const {
  printer << "<";
  if (isReplicated()) {
    printer << "replicated>";
    return;
  }
  printer.printKeywordOrString(getAxis());
  if (isPartial()) {
    printer << ", partial>";
    return;
  }
  if (isFlat()) {
    printer << ", flat>";
    return;
  }
  printer << ", dim = " << getDim();
  if (getStripes() != 1)
    printer << ", stripes = " << getStripes();
  printer << ">";
}

MeshOp mlir::pcc::getMesh(Operation *op) {
  auto module =
      isa<ModuleOp>(op) ? cast<ModuleOp>(op) : op->getParentOfType<ModuleOp>();
  if (!module)
    return MeshOp();
  auto meshes = module.getOps<MeshOp>();
  return meshes.empty() ? MeshOp() : *meshes.begin();
}

void mlir::pcc::setMesh(ModuleOp module,
                        ArrayRef<std::pair<StringRef, int64_t>> axes) {
  for (MeshOp old : llvm::make_early_inc_range(module.getOps<MeshOp>()))
    old.erase();
  OpBuilder b = OpBuilder::atBlockBegin(module.getBody());
  SmallVector<Attribute> names;
  SmallVector<int64_t> sizes;
  for (auto [name, size] : axes) {
    names.push_back(b.getStringAttr(name));
    sizes.push_back(size);
  }
  MeshOp::create(b, module.getLoc(), "mesh", b.getArrayAttr(names),
                 b.getDenseI64ArrayAttr(sizes));
}

FailureOr<int64_t> mlir::pcc::verifyMeshAxisUse(Operation *op, StringRef axis) {
  MeshOp mesh = getMesh(op);
  if (!mesh)
    return op->emitOpError("names mesh axis '")
           << axis << "', but the module has no pcc.mesh";
  std::optional<int64_t> size = mesh.getAxisSize(axis);
  if (!size)
    return op->emitOpError("names mesh axis '")
           << axis << "', which is not an axis of @" << mesh.getSymName();
  return *size;
}

FailureOr<int64_t> mlir::pcc::getMeshAxisSize(Operation *op, StringRef axis) {
  MeshOp mesh = getMesh(op);
  std::optional<int64_t> size = mesh ? mesh.getAxisSize(axis) : std::nullopt;
  if (!size)
    return op->emitOpError("mesh axis '")
           << axis << "' is not in the module's pcc.mesh";
  return *size;
}

DenseElementsAttr mlir::pcc::getSplatAttr(RankedTensorType type, double value) {
  Attribute element;
  if (auto floatType = dyn_cast<FloatType>(type.getElementType()))
    element = FloatAttr::get(floatType, value);
  else
    element =
        IntegerAttr::get(type.getElementType(), static_cast<int64_t>(value));
  return DenseElementsAttr::get(type, element);
}

int64_t mlir::pcc::getPipelineChunks(Operation *op) {
  auto module =
      isa<ModuleOp>(op) ? cast<ModuleOp>(op) : op->getParentOfType<ModuleOp>();
  auto chunks = module ? module->getAttrOfType<IntegerAttr>(
                             PccDialect::kPipelineChunksAttrName)
                       : IntegerAttr();
  return chunks ? chunks.getInt() : 1;
}

FailureOr<int64_t> mlir::pcc::getPipelineStageCount(Operation *op) {
  FailureOr<int64_t> pp = getMeshAxisSize(op, kPipelineAxis);
  if (failed(pp))
    return failure();
  return *pp * getPipelineChunks(op);
}

/// Checks that `sharding` can describe a tensor of global type `type`.
static LogicalResult verifySharding(Operation *op, ShardingAttr sharding,
                                    Type type, unsigned resultIndex) {
  if (sharding.isReplicated())
    return success();
  FailureOr<int64_t> size = getMeshAxisSize(op, sharding.getAxis());
  if (failed(size))
    return failure();
  auto tensor = dyn_cast<RankedTensorType>(type);
  if (!tensor)
    return op->emitOpError("pcc.sharding of result ")
           << resultIndex << ": not a ranked tensor";
  if (sharding.isPartial()) {
    if (!isa<FloatType>(tensor.getElementType()))
      return op->emitOpError("pcc.sharding of result ")
             << resultIndex << ": a partial sum needs a float tensor, got "
             << tensor;
    return success();
  }
  if (sharding.getDim() >= tensor.getRank())
    return op->emitOpError("pcc.sharding of result ")
           << resultIndex << ": dim " << sharding.getDim()
           << " is out of range for " << tensor;
  int64_t extent = tensor.getDimSize(sharding.getDim());
  int64_t pieces = sharding.getStripes() * *size;
  if (extent % pieces != 0)
    return op->emitOpError("pcc.sharding of result ")
           << resultIndex << ": dimension " << sharding.getDim() << " ("
           << extent << ") does not divide into " << sharding.getStripes()
           << " stripe(s) x " << *size << " ranks of '" << sharding.getAxis()
           << "'";
  return success();
}

/// pcc.buffer_offsets (Contracts.h): one entry per result, each buffer
/// within the arena of the function around `op`.
static LogicalResult verifyBufferOffsets(Operation *op, Attribute value) {
  auto offsets = dyn_cast<DenseI64ArrayAttr>(value);
  if (!offsets || offsets.size() != static_cast<int64_t>(op->getNumResults()))
    return op->emitOpError(kBufferOffsetsAttrName)
           << " needs one offset per result (" << op->getNumResults() << ")";
  auto func = op->getParentOfType<FunctionOpInterface>();
  auto arena = func ? func->getAttrOfType<IntegerAttr>(kArenaBytesAttrName)
                    : IntegerAttr();
  for (auto [i, offset] : llvm::enumerate(offsets.asArrayRef())) {
    if (offset == kNoBuffer || offset == kReturnedBuffer)
      continue;
    auto type = dyn_cast<RankedTensorType>(op->getResult(i).getType());
    if (offset < 0 || !type)
      return op->emitOpError(kBufferOffsetsAttrName)
             << ": result " << i << " has offset " << offset
             << " (a buffer's offset is >= 0; " << kNoBuffer << ": no buffer, "
             << kReturnedBuffer << ": the caller's)";
    if (!arena)
      return op->emitOpError(kBufferOffsetsAttrName)
             << " in a function without " << kArenaBytesAttrName;
    int64_t end = offset + getTensorBytes(type);
    if (end > arena.getInt())
      return op->emitOpError(kBufferOffsetsAttrName)
             << ": result " << i << " lies at bytes [" << offset << ", " << end
             << "), past the function's arena of " << arena.getInt()
             << " bytes";
  }
  return success();
}

LogicalResult PccDialect::verifyOperationAttribute(Operation *op,
                                                   NamedAttribute attr) {
  // The mesh was a module attribute (a dictionary, so its axes were sorted
  // by name, with the rank grid's order beside it); it is an op now.
  if (attr.getName() == kMeshAttrName || attr.getName() == kMeshOrderAttrName)
    return op->emitError(attr.getName().getValue())
           << " is not an attribute: the mesh is an op in the module, in "
              "the rank grid's order, e.g. pcc.mesh @mesh [dp = 2, pp = 1, "
              "tp = 2]";
  if (attr.getName() == kPipelineChunksAttrName) {
    auto chunks = dyn_cast<IntegerAttr>(attr.getValue());
    if (!isa<ModuleOp>(op) || !chunks || chunks.getInt() < 1)
      return op->emitError("pcc.pp_chunks must be an integer >= 1 on the "
                           "module");
    return success();
  }
  if (attr.getName() == kShardingAttrName) {
    auto list = dyn_cast<ArrayAttr>(attr.getValue());
    if (!list || list.size() != op->getNumResults())
      return op->emitOpError("pcc.sharding needs one #pcc.shard per result (")
             << op->getNumResults() << ")";
    for (auto [i, element] : llvm::enumerate(list)) {
      auto sharding = dyn_cast<ShardingAttr>(element);
      if (!sharding)
        return op->emitOpError("pcc.sharding element ") << i
                                                        << " is not a "
                                                           "#pcc.shard";
      if (failed(verifySharding(op, sharding, op->getResult(i).getType(), i)))
        return failure();
    }
    return success();
  }
  // What the passes tell each other (Contracts.h).
  StringRef name = attr.getName().getValue();
  auto error = [&] { return op->emitError(); };
  if (name == kTrainingAttrName) {
    auto dict = dyn_cast<DictionaryAttr>(attr.getValue());
    if (!isa<ModuleOp>(op) || !dict)
      return op->emitError("pcc.training must be a dictionary on the module");
    TrainingConfig config;
    return parseTrainingAttr(dict, config, error);
  }
  if (name == kPrecisionAttrName) {
    auto precision = dyn_cast<StringAttr>(attr.getValue());
    if (!isa<ModuleOp>(op) || !precision ||
        (precision.getValue() != "bf16" && precision.getValue() != "fp16"))
      return op->emitError(
          "pcc.precision must be \"bf16\" or \"fp16\" on the module");
    return success();
  }
  if (name == kLossScaleAttrName) {
    auto dict = dyn_cast<DictionaryAttr>(attr.getValue());
    auto initial = dict ? dict.getAs<FloatAttr>("initial") : FloatAttr();
    auto window = dict ? dict.getAs<IntegerAttr>("window") : IntegerAttr();
    if (!isa<ModuleOp>(op) || !initial || !window ||
        !(initial.getValueAsDouble() > 0) || window.getInt() < 0)
      return op->emitError("pcc.loss_scale must be {initial = <positive "
                           "f64>, window = <non-negative i64>} on the module");
    return success();
  }
  if (name == kScheduleAttrName) {
    auto dict = dyn_cast<DictionaryAttr>(attr.getValue());
    if (!isa<FunctionOpInterface>(op) || !dict)
      return op->emitError("pcc.schedule must be a dictionary on a function");
    ::pcc::schedule::Schedule schedule;
    return parseScheduleAttr(dict, schedule, error);
  }
  if (name == kPhaseAttrName) {
    auto phase = dyn_cast<StringAttr>(attr.getValue());
    auto known = [&](StringRef p) {
      return llvm::is_contained(kPhaseNames, p) ||
             llvm::is_contained(kOffloadPhaseNames, p) ||
             p == kWeightGradPhaseName;
    };
    if (!isa<FunctionOpInterface>(op) || !phase || !known(phase.getValue()))
      return op->emitError("pcc.phase must name a phase on a function "
                           "(forward, backward, weight_grad, optimizer, "
                           "zero_grad, optimizer_pre, optimizer_post)");
    return success();
  }
  if (name == kPipelineStageAttrName || name == kPipelineRankAttrName) {
    auto index = dyn_cast<IntegerAttr>(attr.getValue());
    if (!isa<FunctionOpInterface>(op) || !index || index.getInt() < 0)
      return op->emitError(name) << " must be an integer >= 0 on a function";
    return success();
  }
  if (name == kArenaBytesAttrName) {
    auto bytes = dyn_cast<IntegerAttr>(attr.getValue());
    if (!isa<FunctionOpInterface>(op) || !bytes || bytes.getInt() < 0)
      return op->emitError(name) << " must be an integer >= 0 on a function";
    return success();
  }
  if (name == kBufferOffsetsAttrName)
    return verifyBufferOffsets(op, attr.getValue());
  // pcc.opset, pcc.source, pcc.name, ...: checked by their users.
  return success();
}

std::pair<std::string, std::string>
mlir::pcc::getOnnxNodeOfLocation(Location loc) {
  auto fused = dyn_cast<FusedLoc>(loc);
  if (!fused)
    return {};
  auto opType = dyn_cast_if_present<StringAttr>(fused.getMetadata());
  if (!opType)
    return {};
  for (Location inner : fused.getLocations())
    if (auto name = dyn_cast<NameLoc>(inner))
      return {opType.str(), name.getName().str()};
  return {};
}
