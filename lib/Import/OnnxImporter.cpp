//===- OnnxImporter.cpp - ONNX model to pcc dialect -----------------------===//
//
// Loading (binary or text format, checker), the graph walk and the mapping
// from ONNX value names to SSA values or host constants. Per-op conversion
// lives in the converter files. This file is compiled with exceptions on:
// libonnx's checker and parser report errors by throwing, and every such
// exception is caught here and turned into a diagnostic.
//
//===----------------------------------------------------------------------===//

#include "GraphImporter.h"

#include <cstdio>
#include <fstream>

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Verifier.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/Support/MathExtras.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"

#include <onnx/checker.h>
#include <onnx/defs/parser.h>

#include "pcc/runtime/HalfFloat.h"
#include "pcc/runtime/Safetensors.h"

#include <cstring>
#include <exception>
#include <map>

using namespace mlir;
using namespace mlir::pcc;
using namespace mlir::pcc::onnx_import;

//===----------------------------------------------------------------------===//
// Loading
//===----------------------------------------------------------------------===//

static LogicalResult loadModel(StringRef path, MLIRContext *context,
                               onnx::ModelProto &model) {
  Location loc = FileLineColLoc::get(context, path, 0, 0);
  auto buffer = llvm::MemoryBuffer::getFile(path, /*IsText=*/false,
                                            /*RequiresNullTerminator=*/true);
  if (!buffer)
    return emitError(loc) << "cannot open ONNX model: "
                          << buffer.getError().message();
  StringRef bytes = (*buffer)->getBuffer();
  if (bytes.empty())
    return emitError(loc) << "the file is empty, not an ONNX model";

  if (path.ends_with(".onnxtxt")) {
    try {
      auto status = onnx::OnnxParser::Parse(model, bytes.data());
      if (!status.IsOK())
        return emitError(loc)
               << "cannot parse ONNX text format: " << status.ErrorMessage();
    } catch (const std::exception &e) {
      return emitError(loc) << "cannot parse ONNX text format: " << e.what();
    }
    return success();
  }

  if (bytes.size() > static_cast<size_t>(INT32_MAX))
    return emitError(loc) << "the file is larger than 2 GiB; store the "
                             "weights as ONNX external data";
  if (!model.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())))
    return emitError(loc) << "not a valid ONNX protobuf (truncated, corrupt "
                             "or not an ONNX file)";
  // Protobuf accepts many byte strings; a real model has a version and a
  // graph with at least one node or output.
  if (model.ir_version() <= 0 || !model.has_graph() ||
      (model.graph().node_size() == 0 && model.graph().output_size() == 0))
    return emitError(loc) << "does not look like an ONNX model (no "
                             "ir_version or no graph)";
  return success();
}

namespace {
/// A model read from `path` for its initializers: where external data lies
/// and where errors point.
struct ModelFile {
  onnx::ModelProto model;
  std::string baseDir;
  Location loc;
};
} // namespace

static FailureOr<ModelFile> openModelFile(StringRef path,
                                          MLIRContext *context) {
  ModelFile file{{},
                 llvm::sys::path::parent_path(path).str(),
                 FileLineColLoc::get(context, path, 0, 0)};
  if (failed(loadModel(path, context, file.model)))
    return failure();
  return file;
}

static LogicalResult runChecker(const onnx::ModelProto &model, StringRef path,
                                MLIRContext *context, bool shapesOnly) {
  Location loc = FileLineColLoc::get(context, path, 0, 0);
  try {
    // The path form resolves external data next to the model; the
    // ModelProto form would look in the working directory.
    if (shapesOnly) {
      // The checker looks for every external file: check a copy in which
      // each externally stored weight is a graph input of its type.
      onnx::ModelProto copy = model;
      auto *graph = copy.mutable_graph();
      auto *inits = graph->mutable_initializer();
      for (int i = inits->size() - 1; i >= 0; --i) {
        const onnx::TensorProto &t = inits->Get(i);
        if (t.data_location() != onnx::TensorProto::EXTERNAL)
          continue;
        onnx::ValueInfoProto *input = graph->add_input();
        input->set_name(t.name());
        auto *tensorType = input->mutable_type()->mutable_tensor_type();
        tensorType->set_elem_type(t.data_type());
        for (int64_t d : t.dims())
          tensorType->mutable_shape()->add_dim()->set_dim_value(d);
        inits->DeleteSubrange(i, 1);
      }
      onnx::checker::check_model(copy);
    } else if (path.ends_with(".onnxtxt")) {
      onnx::checker::check_model(model);
    } else {
      onnx::checker::check_model(path.str());
    }
  } catch (const std::exception &e) {
    std::string message = e.what();
    // The checker appends a long context dump; keep its first lines.
    size_t cut = message.find("\n\n==>");
    if (cut != std::string::npos)
      message.resize(cut);
    // One line: the checker's own text wraps and indents.
    std::string oneLine;
    for (char c : message) {
      if (c == '\n' || c == '\t')
        c = ' ';
      if (c == ' ' && (oneLine.empty() || oneLine.back() == ' '))
        continue;
      oneLine += c;
    }
    message = StringRef(oneLine).rtrim().str();
    return emitError(loc) << "ONNX checker rejected the model: " << message;
  }
  return success();
}

/// Whether pcc can represent a tensor of `shape`: no negative dimension and
/// a size in bytes (at most 16 per element) that fits in 64 bits. Shapes
/// come from the model's data, and products of arbitrary int64s wrap.
static bool isRepresentableShape(ArrayRef<int64_t> shape) {
  int64_t bytes = 16;
  for (int64_t d : shape)
    if (d < 0 || llvm::MulOverflow(bytes, d, bytes))
      return false;
  return true;
}

//===----------------------------------------------------------------------===//
// Locations
//===----------------------------------------------------------------------===//

Location GraphImporter::nodeLocation(const onnx::NodeProto &node,
                                     unsigned index) {
  std::string name = node.name().empty()
                         ? node.op_type() + "_" + std::to_string(index)
                         : node.name();
  Location nameLoc = NameLoc::get(StringAttr::get(context, name), fileLoc);
  return FusedLoc::get(context, {nameLoc},
                       StringAttr::get(context, node.op_type()));
}

//===----------------------------------------------------------------------===//
// GraphImporter
//===----------------------------------------------------------------------===//

GraphImporter::GraphImporter(MLIRContext *context,
                             const onnx::ModelProto &model, StringRef modelPath,
                             const OnnxImportOptions &options)
    : context(context), model(model), modelPath(modelPath.str()),
      baseDir(llvm::sys::path::parent_path(modelPath).str()), options(options),
      builder(context), fileLoc(FileLineColLoc::get(context, modelPath, 0, 0)) {
}

ImportedValue *GraphImporter::lookup(StringRef name) {
  auto it = values.find(name);
  return it == values.end() ? nullptr : &it->second;
}

FailureOr<ImportedValue *> GraphImporter::lookupInput(StringRef name,
                                                     Location loc) {
  if (ImportedValue *entry = lookup(name))
    return entry;
  return emitError(loc) << "input '" << name
                        << "' is not produced by any earlier node, graph "
                           "input or initializer";
}

void GraphImporter::define(StringRef name, ImportedValue value) {
  values[name] = std::move(value);
}

FailureOr<Value> GraphImporter::materialize(StringRef name, Location loc) {
  FailureOr<ImportedValue *> found = lookupInput(name, loc);
  if (failed(found))
    return failure();
  ImportedValue *entry = *found;
  if (entry->value)
    return entry->value;
  if (!entry->unsupportedReason.empty())
    return emitError(loc) << "value '" << name
                          << "' is not supported: " << entry->unsupportedReason;
  if (entry->constant) {
    entry->value = ConstantOp::create(builder, loc, entry->constant->toAttr());
    return entry->value;
  }
  if (!entry->transposeOf.empty()) {
    std::string source = entry->transposeOf;
    auto base = materialize(source, loc);
    if (failed(base))
      return failure();
    Location copyLoc = NameLoc::get(StringAttr::get(context, name), fileLoc);
    auto type = cast<RankedTensorType>(base->getType());
    entry->value = TransposeOp::create(
        builder, copyLoc,
        RankedTensorType::get({type.getDimSize(1), type.getDimSize(0)},
                              type.getElementType()),
        *base, builder.getDenseI64ArrayAttr({1, 0}));
    return entry->value;
  }
  // A weight: checked here, read by the back end.
  const onnx::TensorProto &init = *entry->initializer;
  Type elementType = convertOnnxElementType(context, init.data_type());
  if (!elementType)
    return emitError(loc) << "initializer '" << name << "' has element type "
                          << onnxElementTypeName(init.data_type())
                          << ", which is not supported";
  // pcc plan reads shapes alone: an external file need not exist.
  bool unread =
      options.shapesOnly && init.data_location() == onnx::TensorProto::EXTERNAL;
  if (!unread && failed(checkTensorData(init, baseDir, loc)))
    return failure();
  SmallVector<int64_t> shape(init.dims().begin(), init.dims().end());
  // Named after the initializer, not the value: exporters alias shared
  // initializers through Identity nodes (TorchScript writes one zero bias
  // for every zero bias of a fresh model).
  Location paramLoc =
      NameLoc::get(StringAttr::get(context, init.name()), fileLoc);
  entry->value = ParamOp::create(builder, paramLoc,
                                 RankedTensorType::get(shape, elementType),
                                 builder.getStringAttr(init.name()),
                                 /*shard=*/ShardingAttr());
  return entry->value;
}

FailureOr<const HostTensor *> GraphImporter::constantOf(StringRef name,
                                                        Location loc) {
  FailureOr<ImportedValue *> found = lookupInput(name, loc);
  if (failed(found))
    return failure();
  ImportedValue *entry = *found;
  if (entry->constant)
    return &*entry->constant;
  if (entry->initializer) {
    auto decoded = decodeTensor(*entry->initializer, baseDir, loc);
    if (failed(decoded))
      return failure();
    entry->constant = std::move(*decoded);
    return &*entry->constant;
  }
  if (entry->value)
    if (auto cst = entry->value.getDefiningOp<ConstantOp>()) {
      // A splat (ConstantOfShape, Expand of a constant) can be far larger
      // than its attribute; host tensors store every element. (A value an
      // op needs on the host, such as a shape, is evaluated up to the
      // default fold limit whatever --import-fold-limit says.)
      int64_t count = cst.getValue().getNumElements();
      if (count > kDefaultFoldLimit)
        return emitError(loc)
               << "input '" << name << "' is a constant of " << count
               << " elements, too large to evaluate while importing (at most "
               << kDefaultFoldLimit << ")";
      entry->constant = HostTensor::fromAttr(cst.getValue());
      return &*entry->constant;
    }
  return static_cast<const HostTensor *>(nullptr);
}

/// Exporters untie tied weights: torch.onnx writes the LM head of a model
/// whose head shares the token embedding as a second initializer holding the
/// table transposed. Finds such pairs ([a, b] and [b, a], a != b, equal up
/// to the transpose) so that the weight is stored once and the sharding
/// planner sees one table read twice. Square matrices are left alone: a
/// transformer has many of the same shape and they are never copies.
LogicalResult GraphImporter::findTransposedCopies() {
  // Rank-2 float weights by (element type, rows, cols), in model order.
  std::map<std::tuple<int32_t, int64_t, int64_t>,
           SmallVector<const onnx::TensorProto *>>
      byShape;
  for (const onnx::TensorProto &init : model.graph().initializer()) {
    ImportedValue *entry = lookup(init.name());
    if (!entry || entry->constant || init.dims_size() != 2 ||
        init.dims(0) == init.dims(1))
      continue;
    // pcc plan: a weight whose external file is absent is counted as its
    // own (never under: a tied copy counts twice).
    if (options.shapesOnly && !tensorDataReadable(init, baseDir, fileLoc))
      continue;
    byShape[{init.data_type(), init.dims(0), init.dims(1)}].push_back(&init);
  }
  // A fingerprint first (a few elements, read without loading the tensor),
  // then every element.
  constexpr int64_t kSamples = 16;
  auto samples = [&](const onnx::TensorProto &t,
                     bool transposed) -> FailureOr<std::string> {
    int64_t rows = t.dims(0), cols = t.dims(1);
    int64_t r = transposed ? cols : rows, c = transposed ? rows : cols;
    SmallVector<int64_t> flat;
    for (int64_t k = 0; k < kSamples; ++k) {
      // Position (i, j) of the untransposed view.
      int64_t i = (k * 7919) % r, j = (k * 104729 + k / 3) % c;
      flat.push_back(transposed ? j * cols + i : i * cols + j);
    }
    return tensorElementBytes(t, baseDir, fileLoc, flat);
  };
  for (auto &[key, group] : byShape) {
    auto [type, rows, cols] = key;
    if (rows > cols)
      continue; // each pair once, from its wide side
    auto other = byShape.find({type, cols, rows});
    if (other == byShape.end())
      continue;
    // The other side's fingerprints, read once.
    std::vector<std::string> otherSamples;
    for (const onnx::TensorProto *b : other->second) {
      auto sb = samples(*b, /*transposed=*/true);
      if (failed(sb))
        return failure();
      otherSamples.push_back(std::move(*sb));
    }
    for (const onnx::TensorProto *a : group) {
      auto sa = samples(*a, /*transposed=*/false);
      if (failed(sa))
        return failure();
      for (auto [b, sb] : llvm::zip(other->second, otherSamples)) {
        if (!lookup(b->name())->transposeOf.empty() || *sa != sb)
          continue;
        auto da = tensorBytes(*a, baseDir, fileLoc);
        auto db = tensorBytes(*b, baseDir, fileLoc);
        if (failed(da) || failed(db))
          return failure();
        size_t size = da->size() / (rows * cols);
        bool equal = true;
        for (int64_t i = 0; i < rows && equal; ++i)
          for (int64_t j = 0; j < cols && equal; ++j)
            equal = std::memcmp(da->data() + (i * cols + j) * size,
                                db->data() + (j * rows + i) * size, size) == 0;
        if (!equal)
          continue;
        // The copy is the one later in the model.
        const onnx::TensorProto *first = a, *copy = b;
        for (const onnx::TensorProto &init : model.graph().initializer()) {
          if (&init == b) {
            std::swap(first, copy);
            break;
          }
          if (&init == a)
            break;
        }
        lookup(copy->name())->transposeOf = first->name();
        if (options.remarkSharedWeights)
          emitRemark(fileLoc)
              << "initializer '" << copy->name() << "' [" << copy->dims(0)
              << "x" << copy->dims(1) << "] is '" << first->name()
              << "' transposed (a tied weight the exporter wrote twice); "
                 "stored once, "
              << da->size() << " bytes saved";
        break;
      }
    }
  }
  return success();
}

FailureOr<RankedTensorType>
GraphImporter::inputTypeOf(const onnx::ValueInfoProto &info) {
  if (!info.type().has_tensor_type())
    return emitError(fileLoc) << "graph input '" << info.name()
                              << "' is not a tensor (sequences, maps and "
                                 "optionals are not supported)";
  const auto &tensorType = info.type().tensor_type();
  Type elementType = convertOnnxElementType(context, tensorType.elem_type());
  if (!elementType)
    return emitError(fileLoc)
           << "graph input '" << info.name() << "' has element type "
           << onnxElementTypeName(tensorType.elem_type())
           << ", which is not supported";
  if (!tensorType.has_shape())
    return emitError(fileLoc) << "graph input '" << info.name()
                              << "' has no shape; pcc needs ranked inputs";
  SmallVector<int64_t> shape;
  for (auto [i, dim] : llvm::enumerate(tensorType.shape().dim())) {
    if (dim.has_dim_value() && dim.dim_value() >= 0) {
      shape.push_back(dim.dim_value());
      continue;
    }
    std::string symbol = dim.has_dim_param() ? dim.dim_param() : "";
    auto bound = options.dimBindings.find(symbol);
    std::optional<int64_t> size;
    if (i == 0 && options.rows)
      size = *options.rows;
    else if (!symbol.empty() && bound != options.dimBindings.end())
      size = bound->second;
    else if (i == 0 && options.batch)
      size = *options.batch;
    if (size) {
      shape.push_back(*size);
    } else {
      auto diag = emitError(fileLoc)
                  << "graph input '" << info.name() << "' dimension " << i;
      if (symbol.empty())
        diag << " has no size or name; bind it with --batch=<size> "
                "(possible for dimension 0 only)";
      else
        diag << " is the symbolic dimension '" << symbol
             << "'; bind it with --dim=" << symbol << "=<size>"
             << (i == 0 ? " or --batch=<size>" : "");
      return failure();
    }
  }
  if (!isRepresentableShape(shape)) {
    auto diag = emitError(fileLoc) << "graph input '" << info.name()
                                   << "' has shape [";
    llvm::interleave(shape, diag, "x");
    return diag << "], too large to be a tensor";
  }
  return RankedTensorType::get(shape, elementType);
}

LogicalResult
GraphImporter::checkDeclaredOutput(const onnx::ValueInfoProto &info,
                                   Value value) {
  auto type = cast<RankedTensorType>(value.getType());
  if (!info.type().has_tensor_type() || !info.type().tensor_type().has_shape())
    return success();
  const auto &dims = info.type().tensor_type().shape().dim();
  if (dims.size() != type.getRank())
    return emitError(fileLoc)
           << "graph output '" << info.name() << "' is declared with rank "
           << dims.size() << " but computes " << type;
  for (auto [i, dim] : llvm::enumerate(dims))
    if (dim.has_dim_value() && dim.dim_value() > 0 &&
        dim.dim_value() != type.getDimSize(i))
      return emitError(fileLoc)
             << "graph output '" << info.name() << "' is declared with "
             << "dimension " << i << " = " << dim.dim_value()
             << " but computes " << type;
  return success();
}

LogicalResult GraphImporter::importNode(const onnx::NodeProto &node,
                                        unsigned index) {
  Location loc = nodeLocation(node, index);
  if (!node.domain().empty() && node.domain() != "ai.onnx")
    return emitError(loc) << "unsupported op '" << node.domain()
                          << "::" << node.op_type()
                          << "': only the default ONNX domain is supported";
  const auto &converters = getConverters();
  auto it = converters.find(node.op_type());
  if (it == converters.end())
    return emitError(loc) << "unsupported ONNX op '" << node.op_type()
                          << "' (opset " << opset
                          << "); see docs/op-support.md for the supported ops";
  NodeImporter nodeImporter(*this, node, opset, builder, loc);
  if (failed(it->second(nodeImporter)))
    return failure();
  // Converters compute shapes from the model's data (Reshape, Expand,
  // ConstantOfShape, Tile, ...); one whose product wrapped around or went
  // negative must stop here, before anything sizes buffers by it.
  for (int i = 0; i < node.output_size(); ++i) {
    ImportedValue *out =
        node.output(i).empty() ? nullptr : lookup(node.output(i));
    if (!out || (!out->value && !out->constant))
      continue;
    auto type = out->value ? dyn_cast<RankedTensorType>(out->value.getType())
                           : out->constant->getType();
    if (type && !isRepresentableShape(type.getShape())) {
      auto diag = emitError(loc) << node.op_type() << ": output '"
                                 << node.output(i) << "' would have shape [";
      llvm::interleave(type.getShape(), diag, "x");
      return diag << "], too large to be a tensor";
    }
  }
  // Outputs a converter did not produce are an error only if used.
  for (int i = 0; i < node.output_size(); ++i)
    if (!node.output(i).empty() && !lookup(node.output(i))) {
      ImportedValue unsupported;
      unsupported.unsupportedReason =
          ("output " + std::to_string(i) + " of " + node.op_type() + " node '" +
           node.name() + "' is not produced by pcc")
              .c_str();
      define(node.output(i), std::move(unsupported));
    }
  return success();
}

LogicalResult GraphImporter::importInto(ModuleOp module) {
  const onnx::GraphProto &graph = model.graph();
  for (const auto &entry : model.opset_import())
    if (entry.domain().empty() || entry.domain() == "ai.onnx")
      opset = entry.version();
  if (opset == 0)
    return emitError(fileLoc) << "model imports no default-domain opset";
  if (opset < 6)
    return emitError(fileLoc) << "opset " << opset
                              << " is not supported (pcc reads opsets 6 and "
                                 "later; convert the model first)";

  for (const onnx::NodeProto &node : graph.node())
    for (const std::string &input : node.input())
      consumed.insert(input);
  for (const onnx::ValueInfoProto &output : graph.output())
    consumed.insert(output.name());

  // Initializers first: graph inputs with the same name are overridable
  // defaults in ONNX, and pcc treats them as weights.
  for (const onnx::TensorProto &init : graph.initializer()) {
    ImportedValue value;
    value.initializer = &init;
    Type elementType = convertOnnxElementType(context, init.data_type());
    if (failed(checkTensorShape(init, fileLoc)))
      return failure();
    int64_t count = 1;
    for (int64_t d : init.dims())
      count *= d;
    // Integer, boolean and single-element initializers are shape vectors,
    // indices and scalars: fold them. Other float tensors are weights.
    bool isWeight = elementType && isa<FloatType>(elementType) && count > 1;
    if (!isWeight) {
      auto decoded = decodeTensor(init, baseDir, fileLoc);
      if (failed(decoded))
        return failure();
      value.constant = std::move(*decoded);
    }
    define(init.name(), std::move(value));
  }

  // Also for pcc plan (tied weights are stored once: the search must count
  // them as the compile does), over the weights whose data is present.
  if (failed(findTransposedCopies()))
    return failure();

  SmallVector<Type> argTypes;
  SmallVector<const onnx::ValueInfoProto *> args;
  for (const onnx::ValueInfoProto &info : graph.input()) {
    if (lookup(info.name()))
      continue;
    auto type = inputTypeOf(info);
    if (failed(type))
      return failure();
    argTypes.push_back(*type);
    args.push_back(&info);
  }

  builder.setInsertionPointToEnd(module.getBody());
  auto func = func::FuncOp::create(builder, fileLoc, "main",
                                   builder.getFunctionType(argTypes, {}));
  Block *body = func.addEntryBlock();
  for (auto [i, info] : llvm::enumerate(args)) {
    func.setArgAttr(i, "pcc.name", builder.getStringAttr(info->name()));
    ImportedValue value;
    value.value = body->getArgument(i);
    define(info->name(), std::move(value));
  }
  builder.setInsertionPointToEnd(body);

  for (auto [index, node] : llvm::enumerate(graph.node()))
    if (failed(importNode(node, index)))
      return failure();

  SmallVector<Value> results;
  for (const onnx::ValueInfoProto &info : graph.output()) {
    auto value = materialize(info.name(), fileLoc);
    if (failed(value))
      return failure();
    if (failed(checkDeclaredOutput(info, *value)))
      return failure();
    results.push_back(*value);
  }
  func::ReturnOp::create(builder, fileLoc, results);
  func.setType(builder.getFunctionType(argTypes, TypeRange(results)));
  for (auto [i, info] : llvm::enumerate(graph.output()))
    func.setResultAttr(i, "pcc.name", builder.getStringAttr(info.name()));
  if (!graph.name().empty())
    func->setAttr("pcc.graph_name", builder.getStringAttr(graph.name()));
  return success();
}

//===----------------------------------------------------------------------===//
// Entry point
//===----------------------------------------------------------------------===//

FailureOr<OwningOpRef<ModuleOp>>
mlir::pcc::importOnnxFile(StringRef path, MLIRContext *context,
                          const OnnxImportOptions &options) {
  context->loadDialect<PccDialect, func::FuncDialect>();
  onnx::ModelProto model;
  if (failed(loadModel(path, context, model)))
    return failure();
  if (options.runChecker &&
      failed(runChecker(model, path, context, options.shapesOnly)))
    return failure();

  Location loc = FileLineColLoc::get(context, path, 0, 0);
  OwningOpRef<ModuleOp> module = ModuleOp::create(loc);
  OpBuilder b(context);
  (*module)->setAttr("pcc.source", b.getStringAttr(path));
  if (!model.producer_name().empty())
    (*module)->setAttr("pcc.producer", b.getStringAttr(model.producer_name()));

  GraphImporter importer(context, model, path, options);
  if (failed(importer.importInto(*module)))
    return failure();
  for (const auto &entry : model.opset_import())
    if (entry.domain().empty() || entry.domain() == "ai.onnx")
      (*module)->setAttr("pcc.opset", b.getI64IntegerAttr(entry.version()));
  if (failed(verify(*module)))
    return emitError(loc) << "the model does not form valid pcc IR (see the "
                             "errors above)";
  return module;
}

FailureOr<std::vector<OnnxWeightSummary>>
mlir::pcc::summarizeOnnxWeights(StringRef path, MLIRContext *context) {
  FailureOr<ModelFile> onnxFile = openModelFile(path, context);
  if (failed(onnxFile))
    return failure();
  auto &[model, baseDir, loc] = *onnxFile;
  std::vector<OnnxWeightSummary> out;
  for (const onnx::TensorProto &init : model.graph().initializer()) {
    auto tensor = decodeTensor(init, baseDir, loc);
    if (failed(tensor))
      return failure();
    OnnxWeightSummary w;
    w.name = init.name();
    w.elementType = onnxElementTypeName(init.data_type());
    w.shape.assign(init.dims().begin(), init.dims().end());
    if (init.data_location() == onnx::TensorProto::EXTERNAL) {
      w.storage = "external";
      for (const auto &entry : init.external_data())
        if (entry.key() == "location")
          w.storage += ":" + entry.value();
    } else {
      w.storage = init.has_raw_data() ? "raw" : "typed";
    }
    w.count = tensor->size();
    double sum = 0;
    for (int64_t i = 0; i < tensor->size(); ++i) {
      double v = tensor->getDouble(i);
      w.min = i ? std::min(w.min, v) : v;
      w.max = i ? std::max(w.max, v) : v;
      sum += v;
    }
    w.mean = w.count ? sum / w.count : 0.0;
    out.push_back(std::move(w));
  }
  return out;
}

LogicalResult
mlir::pcc::writeOnnxWeights(StringRef modelPath, ArrayRef<std::string> names,
                            StringRef outputPath, MLIRContext *context,
                            const llvm::StringSet<> *narrow, bool toF16) {
  FailureOr<ModelFile> onnxFile = openModelFile(modelPath, context);
  if (failed(onnxFile))
    return failure();
  auto &[model, baseDir, loc] = *onnxFile;
  llvm::StringMap<const onnx::TensorProto *> byName;
  for (const onnx::TensorProto &init : model.graph().initializer())
    byName[init.name()] = &init;
  ::pccrt::SafetensorsWriter writer;
  for (const std::string &name : names) {
    const onnx::TensorProto *init = byName.lookup(name);
    if (!init)
      return emitError(loc) << "the model has no initializer '" << name << "'";
    auto dtype = getRuntimeDType(init->data_type());
    if (!dtype)
      return emitError(loc) << "initializer '" << name << "' has element type "
                            << onnxElementTypeName(init->data_type())
                            << ", which is not supported";
    auto bytes = tensorBytes(*init, baseDir, loc);
    if (failed(bytes))
      return failure();
    std::vector<int64_t> shape(init->dims().begin(), init->dims().end());
    std::vector<uint8_t> data(bytes->begin(), bytes->end());
    if (narrow && narrow->contains(name)) {
      if (*dtype != ::pccrt::DType::F32)
        return emitError(loc) << "initializer '" << name
                              << "' is not float32; it cannot be stored "
                              << (toF16 ? "as float16" : "as bfloat16");
      std::vector<uint8_t> half(data.size() / 2);
      for (size_t i = 0; i < data.size() / 4; ++i) {
        float v;
        std::memcpy(&v, data.data() + 4 * i, 4);
        uint16_t h = toF16 ? ::pccrt::floatToHalf(v) : ::pccrt::floatToBf16(v);
        std::memcpy(half.data() + 2 * i, &h, 2);
      }
      data = std::move(half);
      dtype = toF16 ? ::pccrt::DType::F16 : ::pccrt::DType::BF16;
    }
    auto status = writer.add(name, *dtype, std::move(shape), std::move(data));
    if (!status.ok())
      return emitError(loc) << status.error();
  }
  writer.setMetadata("pcc.source", modelPath.str());
  auto status = writer.write(outputPath.str());
  if (!status.ok())
    return emitError(FileLineColLoc::get(context, outputPath, 0, 0))
           << status.error();
  return success();
}

FailureOr<int64_t> mlir::pcc::exportTrainedOnnx(StringRef modelPath,
                                                StringRef weightsPath,
                                                StringRef outputPath,
                                                MLIRContext *context) {
  FailureOr<ModelFile> onnxFile = openModelFile(modelPath, context);
  if (failed(onnxFile))
    return failure();
  auto &[model, baseDir, loc] = *onnxFile;
  auto file = ::pccrt::SafetensorsFile::open(weightsPath.str());
  if (!file.ok())
    return emitError(FileLineColLoc::get(context, weightsPath, 0, 0))
           << file.error();
  // The original values, for finding tied copies.
  llvm::StringMap<std::string> original;
  onnx::GraphProto *graph = model.mutable_graph();
  for (const onnx::TensorProto &init : graph->initializer()) {
    auto bytes = tensorBytes(init, baseDir, loc);
    if (failed(bytes))
      return failure();
    original[init.name()] = std::move(*bytes);
  }
  auto setData = [](onnx::TensorProto &init, const uint8_t *data,
                    size_t size) {
    init.clear_float_data();
    init.clear_external_data();
    init.set_data_location(onnx::TensorProto::DEFAULT);
    init.set_raw_data(data, size);
  };
  int64_t replaced = 0;
  for (onnx::TensorProto &init : *graph->mutable_initializer()) {
    std::vector<int64_t> shape(init.dims().begin(), init.dims().end());
    if (const ::pccrt::TensorEntry *entry = file->find(init.name())) {
      if (init.data_type() != onnx::TensorProto::FLOAT ||
          entry->dtype != ::pccrt::DType::F32 || entry->shape != shape)
        return emitError(loc) << "checkpoint tensor '" << init.name()
                              << "' does not have the initializer's type "
                                 "and shape";
      setData(init, file->data(*entry), entry->end - entry->begin);
      ++replaced;
      continue;
    }
    // A transposed copy of a trained weight keeps following it.
    if (init.data_type() != onnx::TensorProto::FLOAT || shape.size() != 2 ||
        shape[0] == shape[1])
      continue;
    const std::string &mine = original[init.name()];
    for (const ::pccrt::TensorEntry &entry : file->tensors()) {
      if (entry.dtype != ::pccrt::DType::F32 || entry.shape.size() != 2 ||
          entry.shape[0] != shape[1] || entry.shape[1] != shape[0] ||
          !original.count(entry.name))
        continue;
      const float *a = reinterpret_cast<const float *>(mine.data());
      const float *b =
          reinterpret_cast<const float *>(original[entry.name].data());
      int64_t rows = shape[0], cols = shape[1];
      bool same = mine.size() == static_cast<size_t>(rows * cols * 4);
      for (int64_t i = 0; same && i < rows; ++i)
        for (int64_t j = 0; same && j < cols; ++j)
          same = a[i * cols + j] == b[j * rows + i];
      if (!same)
        continue;
      const float *trained =
          reinterpret_cast<const float *>(file->data(entry));
      std::vector<float> t(rows * cols);
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j)
          t[i * cols + j] = trained[j * rows + i];
      setData(init, reinterpret_cast<const uint8_t *>(t.data()), t.size() * 4);
      ++replaced;
      break;
    }
  }
  // The trained model is written in eval mode (torch.nn.Module.eval()):
  // batch normalisation with its running statistics, dropout off. A model
  // exported in training mode would otherwise make an inference runtime
  // use batch statistics.
  for (onnx::NodeProto &node : *graph->mutable_node()) {
    if (node.op_type() == "BatchNormalization") {
      auto *attrs = node.mutable_attribute();
      for (int i = attrs->size() - 1; i >= 0; --i)
        if (attrs->Get(i).name() == "training_mode")
          attrs->DeleteSubrange(i, 1);
      while (node.output_size() > 1)
        node.mutable_output()->RemoveLast();
    } else if (node.op_type() == "Dropout") {
      while (node.input_size() > 2)
        node.mutable_input()->RemoveLast(); // training_mode: false
    }
  }
  std::string bytes;
  if (!model.SerializeToString(&bytes))
    return emitError(loc) << "cannot serialise the trained model (larger "
                             "than 2 GiB?)";
  std::string temp = (outputPath + ".tmp").str();
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out.good())
      return emitError(FileLineColLoc::get(context, outputPath, 0, 0))
             << "cannot write the trained model";
  }
  if (std::rename(temp.c_str(), outputPath.str().c_str()) != 0)
    return emitError(FileLineColLoc::get(context, outputPath, 0, 0))
           << "cannot write the trained model";
  return replaced;
}

FailureOr<OnnxTensorFile> mlir::pcc::readOnnxTensorFile(StringRef path,
                                                        MLIRContext *context) {
  Location loc = FileLineColLoc::get(context, path, 0, 0);
  auto buffer = llvm::MemoryBuffer::getFile(path, /*IsText=*/false);
  if (!buffer)
    return emitError(loc) << "cannot open: " << buffer.getError().message();
  onnx::TensorProto tensor;
  StringRef data = (*buffer)->getBuffer();
  if (!tensor.ParseFromArray(data.data(), static_cast<int>(data.size())))
    return emitError(loc) << "not a serialized ONNX TensorProto";
  auto dtype = getRuntimeDType(tensor.data_type());
  if (!dtype)
    return emitError(loc) << "element type "
                          << onnxElementTypeName(tensor.data_type())
                          << " is not supported";
  auto bytes = tensorBytes(tensor, llvm::sys::path::parent_path(path), loc);
  if (failed(bytes))
    return failure();
  OnnxTensorFile file;
  file.name = tensor.name();
  file.dtype = *dtype;
  file.shape.assign(tensor.dims().begin(), tensor.dims().end());
  file.bytes = std::move(*bytes);
  return file;
}

std::vector<std::string> mlir::pcc::getSupportedOnnxOps() {
  std::vector<std::string> ops;
  for (const auto &entry : onnx_import::getConverters())
    ops.push_back(entry.getKey().str());
  llvm::sort(ops);
  return ops;
}

bool mlir::pcc::isSupportedOnnxOp(StringRef opType) {
  return onnx_import::getConverters().count(opType);
}
