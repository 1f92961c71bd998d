//===- TensorData.cpp - reading ONNX tensor contents ----------------------===//
//
// ONNX stores a tensor's data in one of three places: `raw_data` (little
// endian bytes), the typed repeated fields (float_data, int32_data, ...), or
// an external file named in `external_data` (location, offset, length).
//
//===----------------------------------------------------------------------===//

#include "GraphImporter.h"

#include "mlir/IR/Diagnostics.h"
#include "llvm/ADT/APFloat.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MathExtras.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"

#include <cstring>

using namespace mlir;
using namespace mlir::pcc;
using namespace mlir::pcc::onnx_import;

/// Bytes per element in raw_data, or 0 for unsupported types.
static int64_t rawElementSize(int32_t onnxType) {
  switch (onnxType) {
  case onnx::TensorProto::FLOAT:
  case onnx::TensorProto::INT32:
  case onnx::TensorProto::UINT32:
    return 4;
  case onnx::TensorProto::DOUBLE:
  case onnx::TensorProto::INT64:
  case onnx::TensorProto::UINT64:
    return 8;
  case onnx::TensorProto::FLOAT16:
  case onnx::TensorProto::BFLOAT16:
  case onnx::TensorProto::INT16:
  case onnx::TensorProto::UINT16:
    return 2;
  case onnx::TensorProto::BOOL:
  case onnx::TensorProto::INT8:
  case onnx::TensorProto::UINT8:
    return 1;
  default:
    return 0;
  }
}

/// "initializer 'name'", or "constant tensor" for a Constant node's value.
static std::string describe(const onnx::TensorProto &tensor) {
  if (tensor.name().empty())
    return "constant tensor";
  return "initializer '" + tensor.name() + "'";
}

/// The number of elements; only for a shape checkTensorShape accepted.
static int64_t elementCount(const onnx::TensorProto &tensor) {
  int64_t count = 1;
  for (int64_t d : tensor.dims())
    count *= d;
  return count;
}

LogicalResult onnx_import::checkTensorShape(const onnx::TensorProto &tensor,
                                            Location loc) {
  // The checker accepts any int64 dimensions; the sizes computed from them
  // must not go negative or wrap around (16 bytes: the widest element).
  int64_t bytes = 16;
  for (int64_t d : tensor.dims())
    if (d < 0 || llvm::MulOverflow(bytes, d, bytes)) {
      auto diag = emitError(loc) << describe(tensor) << " has shape [";
      llvm::interleave(tensor.dims(), diag, "x");
      return diag << "], "
                  << (d < 0 ? "with a negative dimension"
                            : "too large to be a tensor");
    }
  return success();
}

namespace {
/// Where the external bytes of a tensor live.
struct ExternalSpan {
  std::string path;
  uint64_t offset = 0;
  std::optional<uint64_t> length;
};
} // namespace

static FailureOr<ExternalSpan> externalSpan(const onnx::TensorProto &tensor,
                                            StringRef baseDir, Location loc) {
  ExternalSpan span;
  std::string location;
  for (const auto &entry : tensor.external_data()) {
    if (entry.key() == "location")
      location = entry.value();
    else if (entry.key() == "offset")
      span.offset = std::strtoull(entry.value().c_str(), nullptr, 10);
    else if (entry.key() == "length")
      span.length = std::strtoull(entry.value().c_str(), nullptr, 10);
  }
  if (location.empty())
    return emitError(loc) << describe(tensor)
                          << " is stored externally but names no location";
  if (llvm::sys::path::is_absolute(location) ||
      StringRef(location).contains(".."))
    return emitError(loc) << describe(tensor) << ": external data location '"
                          << location
                          << "' must be a relative path inside the model's "
                             "directory";
  SmallString<256> path(baseDir);
  llvm::sys::path::append(path, location);
  span.path = path.str().str();
  return span;
}

/// Resolves and validates the external span of `tensor`: the file exists,
/// the length matches the shape and the span lies inside the file.
static FailureOr<ExternalSpan> resolveExternal(const onnx::TensorProto &tensor,
                                               StringRef baseDir, Location loc,
                                               int64_t expectedBytes) {
  auto span = externalSpan(tensor, baseDir, loc);
  if (failed(span))
    return failure();
  uint64_t fileSize = 0;
  if (llvm::sys::fs::file_size(span->path, fileSize))
    return emitError(loc) << describe(tensor) << ": external data file '"
                          << span->path << "' is missing";
  uint64_t length = span->length.value_or(expectedBytes);
  if (static_cast<int64_t>(length) != expectedBytes)
    return emitError(loc) << describe(tensor) << ": external data length "
                          << length << " does not match its shape ("
                          << expectedBytes << " bytes)";
  if (span->offset + length > fileSize)
    return emitError(loc) << describe(tensor) << ": external data file '"
                          << span->path << "' is too short (" << fileSize
                          << " bytes, needs " << span->offset + length << ")";
  span->length = length;
  return span;
}

static FailureOr<std::string> readExternal(const onnx::TensorProto &tensor,
                                           StringRef baseDir, Location loc,
                                           int64_t expectedBytes) {
  auto span = resolveExternal(tensor, baseDir, loc, expectedBytes);
  if (failed(span))
    return failure();
  auto buffer =
      llvm::MemoryBuffer::getFileSlice(span->path, *span->length, span->offset);
  if (!buffer)
    return emitError(loc) << describe(tensor) << ": cannot read '" << span->path
                          << "': " << buffer.getError().message();
  return (*buffer)->getBuffer().str();
}

/// Number of values stored in the typed field that holds `onnxType`.
static int64_t typedFieldSize(const onnx::TensorProto &t) {
  switch (t.data_type()) {
  case onnx::TensorProto::FLOAT:
    return t.float_data_size();
  case onnx::TensorProto::DOUBLE:
    return t.double_data_size();
  case onnx::TensorProto::INT64:
    return t.int64_data_size();
  case onnx::TensorProto::UINT32:
  case onnx::TensorProto::UINT64:
    return t.uint64_data_size();
  default:
    return t.int32_data_size();
  }
}

LogicalResult onnx_import::checkTensorData(const onnx::TensorProto &tensor,
                                           StringRef baseDir, Location loc) {
  int64_t elementSize = rawElementSize(tensor.data_type());
  if (elementSize == 0)
    return emitError(loc) << describe(tensor) << " has element type "
                          << onnxElementTypeName(tensor.data_type())
                          << ", which is not supported";
  if (failed(checkTensorShape(tensor, loc)))
    return failure();
  int64_t count = elementCount(tensor);
  if (tensor.data_location() == onnx::TensorProto::EXTERNAL) {
    if (failed(resolveExternal(tensor, baseDir, loc, count * elementSize)))
      return failure();
    return success();
  }
  if (tensor.has_raw_data()) {
    if (static_cast<int64_t>(tensor.raw_data().size()) != count * elementSize)
      return emitError(loc)
             << describe(tensor) << " has " << tensor.raw_data().size()
             << " bytes of raw data, its shape needs " << count * elementSize;
    return success();
  }
  if (typedFieldSize(tensor) != count)
    return emitError(loc) << describe(tensor) << " has "
                          << typedFieldSize(tensor)
                          << " values, its shape needs " << count;
  return success();
}

bool onnx_import::tensorDataReadable(const onnx::TensorProto &tensor,
                                     StringRef baseDir, Location loc) {
  // Quietly: the caller asks whether it may read, it reports nothing.
  ScopedDiagnosticHandler quiet(loc.getContext(),
                                [](Diagnostic &) { return success(); });
  return succeeded(checkTensorData(tensor, baseDir, loc));
}

/// Decodes one little-endian element of `onnxType` from `p` into `out`.
static void decodeRaw(const char *p, int32_t onnxType, HostTensor &out,
                      int64_t i) {
  auto load = [&](auto zero) {
    decltype(zero) v;
    std::memcpy(&v, p, sizeof(v));
    return v;
  };
  switch (onnxType) {
  case onnx::TensorProto::FLOAT:
    out.setDouble(i, load(float{}));
    break;
  case onnx::TensorProto::DOUBLE:
    out.setDouble(i, load(double{}));
    break;
  case onnx::TensorProto::FLOAT16:
  case onnx::TensorProto::BFLOAT16: {
    APFloat f(onnxType == onnx::TensorProto::FLOAT16 ? APFloat::IEEEhalf()
                                                     : APFloat::BFloat(),
              APInt(16, load(uint16_t{})));
    out.setDouble(i, f.convertToDouble());
    break;
  }
  case onnx::TensorProto::INT64:
    out.setInt(i, load(int64_t{}));
    break;
  case onnx::TensorProto::UINT64:
    out.setInt(i, static_cast<int64_t>(load(uint64_t{})));
    break;
  case onnx::TensorProto::INT32:
    out.setInt(i, load(int32_t{}));
    break;
  case onnx::TensorProto::UINT32:
    out.setInt(i, load(uint32_t{}));
    break;
  case onnx::TensorProto::INT16:
    out.setInt(i, load(int16_t{}));
    break;
  case onnx::TensorProto::UINT16:
    out.setInt(i, load(uint16_t{}));
    break;
  case onnx::TensorProto::INT8:
    out.setInt(i, load(int8_t{}));
    break;
  default: // BOOL, UINT8
    out.setInt(i, load(uint8_t{}));
    break;
  }
}

FailureOr<HostTensor> onnx_import::decodeTensor(const onnx::TensorProto &tensor,
                                                StringRef baseDir,
                                                Location loc) {
  MLIRContext *ctx = loc.getContext();
  Type elementType = convertOnnxElementType(ctx, tensor.data_type());
  if (!elementType)
    return emitError(loc) << describe(tensor) << " has element type "
                          << onnxElementTypeName(tensor.data_type())
                          << ", which is not supported";
  if (failed(checkTensorData(tensor, baseDir, loc)))
    return failure();
  SmallVector<int64_t> shape(tensor.dims().begin(), tensor.dims().end());
  HostTensor out(elementType, shape);
  int64_t count = out.size();
  int64_t elementSize = rawElementSize(tensor.data_type());

  std::string external;
  const std::string *raw = nullptr;
  if (tensor.data_location() == onnx::TensorProto::EXTERNAL) {
    auto bytes = readExternal(tensor, baseDir, loc, count * elementSize);
    if (failed(bytes))
      return failure();
    external = std::move(*bytes);
    raw = &external;
  } else if (tensor.has_raw_data()) {
    raw = &tensor.raw_data();
  }
  if (raw) {
    for (int64_t i = 0; i < count; ++i)
      decodeRaw(raw->data() + i * elementSize, tensor.data_type(), out, i);
    return out;
  }

  for (int64_t i = 0; i < count; ++i) {
    switch (tensor.data_type()) {
    case onnx::TensorProto::FLOAT:
      out.setDouble(i, tensor.float_data(i));
      break;
    case onnx::TensorProto::DOUBLE:
      out.setDouble(i, tensor.double_data(i));
      break;
    case onnx::TensorProto::INT64:
      out.setInt(i, tensor.int64_data(i));
      break;
    case onnx::TensorProto::UINT32:
    case onnx::TensorProto::UINT64:
      out.setInt(i, static_cast<int64_t>(tensor.uint64_data(i)));
      break;
    case onnx::TensorProto::FLOAT16:
    case onnx::TensorProto::BFLOAT16: {
      // Half-precision values are stored as their bit patterns.
      uint16_t bits = static_cast<uint16_t>(tensor.int32_data(i));
      char bytes[2];
      std::memcpy(bytes, &bits, 2);
      decodeRaw(bytes, tensor.data_type(), out, i);
      break;
    }
    default:
      out.setInt(i, tensor.int32_data(i));
      break;
    }
  }
  return out;
}

FailureOr<std::string>
onnx_import::tensorElementBytes(const onnx::TensorProto &tensor,
                                StringRef baseDir, Location loc,
                                ArrayRef<int64_t> indices) {
  if (failed(checkTensorData(tensor, baseDir, loc)))
    return failure();
  int64_t elementSize = rawElementSize(tensor.data_type());
  int64_t count = elementCount(tensor);
  for (int64_t i : indices)
    if (i < 0 || i >= count)
      return emitError(loc) << describe(tensor) << ": element " << i
                            << " is out of range (" << count << " elements)";
  std::string out;
  out.reserve(indices.size() * elementSize);
  if (tensor.data_location() == onnx::TensorProto::EXTERNAL) {
    auto span = resolveExternal(tensor, baseDir, loc, count * elementSize);
    if (failed(span))
      return failure();
    auto file = llvm::sys::fs::openNativeFileForRead(span->path);
    if (!file)
      return emitError(loc)
             << describe(tensor) << ": cannot read '" << span->path
             << "': " << llvm::toString(file.takeError());
    char element[16];
    for (int64_t i : indices) {
      auto read = llvm::sys::fs::readNativeFileSlice(
          *file, llvm::MutableArrayRef<char>(element, elementSize),
          span->offset + i * elementSize);
      if (!read || *read != static_cast<size_t>(elementSize)) {
        if (!read)
          llvm::consumeError(read.takeError());
        llvm::sys::fs::closeFile(*file);
        return emitError(loc)
               << describe(tensor) << ": cannot read '" << span->path << "'";
      }
      out.append(element, elementSize);
    }
    llvm::sys::fs::closeFile(*file);
    return out;
  }
  if (tensor.has_raw_data()) {
    for (int64_t i : indices)
      out.append(tensor.raw_data().data() + i * elementSize, elementSize);
    return out;
  }
  auto all = tensorBytes(tensor, baseDir, loc);
  if (failed(all))
    return failure();
  for (int64_t i : indices)
    out.append(all->data() + i * elementSize, elementSize);
  return out;
}

FailureOr<std::string> onnx_import::tensorBytes(const onnx::TensorProto &tensor,
                                                StringRef baseDir,
                                                Location loc) {
  if (failed(checkTensorData(tensor, baseDir, loc)))
    return failure();
  int64_t count = elementCount(tensor);
  int64_t elementSize = rawElementSize(tensor.data_type());
  if (tensor.data_location() == onnx::TensorProto::EXTERNAL)
    return readExternal(tensor, baseDir, loc, count * elementSize);
  if (tensor.has_raw_data())
    return tensor.raw_data();
  std::string bytes(count * elementSize, '\0');
  char *out = bytes.data();
  auto put = [&](int64_t i, auto value) {
    std::memcpy(out + i * elementSize, &value, elementSize);
  };
  for (int64_t i = 0; i < count; ++i) {
    switch (tensor.data_type()) {
    case onnx::TensorProto::FLOAT:
      put(i, tensor.float_data(i));
      break;
    case onnx::TensorProto::DOUBLE:
      put(i, tensor.double_data(i));
      break;
    case onnx::TensorProto::INT64:
      put(i, tensor.int64_data(i));
      break;
    case onnx::TensorProto::UINT32:
    case onnx::TensorProto::UINT64:
      put(i, tensor.uint64_data(i));
      break;
    default: {
      // int32_data holds int32, int16, int8, uint8, bool and the bit
      // patterns of float16 / bfloat16; keep the low elementSize bytes.
      int32_t v = tensor.int32_data(i);
      std::memcpy(out + i * elementSize, &v, elementSize);
      break;
    }
    }
  }
  return bytes;
}
