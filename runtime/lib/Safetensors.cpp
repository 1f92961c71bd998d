//===- Safetensors.cpp - the weights file format --------------------------===//

#include "pcc/runtime/Safetensors.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <fstream>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace pccrt {

namespace {
constexpr const char *kFormatKey = "pcc.format";
constexpr const char *kFormatVersion = "1";
constexpr const char *kChecksumKey = "pcc.fnv1a64";
/// Headers larger than this are rejected as corrupt (the spec's own limit).
constexpr uint64_t kMaxHeaderBytes = 100u << 20;

Error fail(const std::string &path, const std::string &what) {
  return Error{"weights file '" + path + "': " + what};
}

std::string hex64(uint64_t v) {
  char buffer[17];
  std::snprintf(buffer, sizeof(buffer), "%016llx",
                static_cast<unsigned long long>(v));
  return buffer;
}
} // namespace

uint64_t fnv1a64(const uint8_t *data, size_t size, uint64_t state) {
  uint64_t h = state;
  for (size_t i = 0; i < size; ++i) {
    h ^= data[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

//===----------------------------------------------------------------------===//
// Writer
//===----------------------------------------------------------------------===//

Status SafetensorsWriter::add(std::string name, DType dtype,
                              std::vector<int64_t> shape,
                              std::vector<uint8_t> bytes) {
  uint64_t expected = elementCount(shape) * dtypeSize(dtype);
  if (bytes.size() != expected)
    return Error{"tensor '" + name + "': " + std::to_string(bytes.size()) +
                 " bytes for shape " + shapeString(shape) + " of " +
                 std::string(dtypeName(dtype)) + " (needs " +
                 std::to_string(expected) + ")"};
  for (const TensorEntry &e : entries)
    if (e.name == name)
      return Error{"tensor '" + name + "' is added twice"};
  uint64_t begin = entries.empty() ? 0 : entries.back().end;
  entries.push_back(
      {std::move(name), dtype, std::move(shape), begin, begin + expected});
  payloads.push_back(std::move(bytes));
  return Status::success();
}

void SafetensorsWriter::setMetadata(std::string key, std::string value) {
  metadata[std::move(key)] = std::move(value);
}

Status SafetensorsWriter::write(const std::string &path) const {
  std::vector<uint8_t> bytes = serialize();
  std::string tmp = path + ".tmp";
  std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
  if (!out)
    return fail(path, std::string("cannot create: ") + std::strerror(errno));
  out.write(reinterpret_cast<const char *>(bytes.data()), bytes.size());
  out.close();
  if (!out)
    return fail(path, "write failed (disk full?)");
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    return fail(path, std::string("cannot rename into place: ") +
                          std::strerror(errno));
  return Status::success();
}

std::vector<uint8_t> SafetensorsWriter::serialize() const {
  uint64_t checksum = kFnv1a64Basis;
  for (const auto &payload : payloads)
    checksum = fnv1a64(payload.data(), payload.size(), checksum);

  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  nlohmann::ordered_json meta = nlohmann::ordered_json::object();
  for (const auto &[key, value] : metadata)
    meta[key] = value;
  meta[kFormatKey] = kFormatVersion;
  meta[kChecksumKey] = hex64(checksum);
  header["__metadata__"] = meta;
  for (const TensorEntry &e : entries)
    header[e.name] = {{"dtype", std::string(dtypeName(e.dtype))},
                      {"shape", e.shape},
                      {"data_offsets", {e.begin, e.end}}};
  std::string text = header.dump();
  // Pad with spaces so the data section starts 8-byte aligned.
  while ((8 + text.size()) % 8)
    text.push_back(' ');

  std::vector<uint8_t> bytes;
  uint64_t length = text.size();
  for (int i = 0; i < 8; ++i)
    bytes.push_back(static_cast<uint8_t>(length >> (8 * i)));
  bytes.insert(bytes.end(), text.begin(), text.end());
  for (const auto &payload : payloads)
    bytes.insert(bytes.end(), payload.begin(), payload.end());
  return bytes;
}

//===----------------------------------------------------------------------===//
// Reader
//===----------------------------------------------------------------------===//

void SafetensorsFile::Unmapper::operator()(void *mapping) const {
  munmap(mapping, size);
}

const TensorEntry *SafetensorsFile::find(std::string_view name) const {
  for (const TensorEntry &e : entries)
    if (e.name == name)
      return &e;
  return nullptr;
}

Result<SafetensorsFile> SafetensorsFile::open(const std::string &path,
                                              bool verifyChecksum) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0)
    return fail(path, std::string("cannot open: ") + std::strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    ::close(fd);
    return fail(path, std::string("cannot stat: ") + std::strerror(errno));
  }
  size_t size = static_cast<size_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    return fail(path, "is " + std::to_string(size) +
                          " bytes long, too short for a safetensors file");
  }
  void *mapping = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (mapping == MAP_FAILED)
    return fail(path, std::string("cannot map: ") + std::strerror(errno));

  SafetensorsFile file;
  file.path = path;
  file.mapping = std::unique_ptr<void, Unmapper>(mapping, Unmapper{size});
  return parse(std::move(file), static_cast<const uint8_t *>(mapping), size,
               verifyChecksum);
}

Result<SafetensorsFile> SafetensorsFile::fromBytes(std::vector<uint8_t> bytes,
                                                   const std::string &name) {
  if (bytes.size() < 8)
    return fail(name, "is " + std::to_string(bytes.size()) +
                          " bytes long, too short for a safetensors file");
  SafetensorsFile file;
  file.path = name;
  file.owned = std::move(bytes);
  const uint8_t *data = file.owned.data();
  size_t size = file.owned.size();
  return parse(std::move(file), data, size, /*verifyChecksum=*/true);
}

Result<SafetensorsFile> SafetensorsFile::parse(SafetensorsFile file,
                                               const uint8_t *bytes,
                                               size_t size,
                                               bool verifyChecksum) {
  const std::string path = file.path;
  uint64_t headerLength = 0;
  for (int i = 0; i < 8; ++i)
    headerLength |= uint64_t(bytes[i]) << (8 * i);
  if (headerLength > kMaxHeaderBytes || headerLength > size - 8)
    return fail(path, "header length " + std::to_string(headerLength) +
                          " does not fit the file (" + std::to_string(size) +
                          " bytes): truncated or not a safetensors file");
  const char *headerStart = reinterpret_cast<const char *>(bytes + 8);
  nlohmann::json header =
      nlohmann::json::parse(headerStart, headerStart + headerLength, nullptr,
                            /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object())
    return fail(path, "header is not a JSON object");
  file.dataStart = bytes + 8 + headerLength;
  uint64_t dataSize = size - 8 - headerLength;

  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string &name = it.key();
    const nlohmann::json &value = it.value();
    if (name == "__metadata__") {
      if (!value.is_object())
        return fail(path, "__metadata__ is not an object");
      for (auto m = value.begin(); m != value.end(); ++m)
        if (m.value().is_string())
          file.metadata[m.key()] = m.value().get<std::string>();
      continue;
    }
    auto bad = [&](const std::string &what) {
      return fail(path, "tensor '" + name + "': " + what);
    };
    if (!value.is_object() || !value.contains("dtype") ||
        !value.contains("shape") || !value.contains("data_offsets"))
      return bad("needs dtype, shape and data_offsets");
    const auto &dtypeJson = value["dtype"];
    std::optional<DType> dtype =
        dtypeJson.is_string() ? dtypeFromName(dtypeJson.get<std::string>())
                              : std::nullopt;
    if (!dtype)
      return bad("unsupported dtype " + dtypeJson.dump());
    TensorEntry entry{name, *dtype, {}, 0, 0};
    if (!value["shape"].is_array())
      return bad("shape is not an array");
    for (const auto &d : value["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0)
        return bad("shape has a non-integer or negative dimension");
      entry.shape.push_back(d.get<int64_t>());
    }
    const auto &offsets = value["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2 ||
        !offsets[0].is_number_unsigned() || !offsets[1].is_number_unsigned())
      return bad("data_offsets must be two non-negative integers");
    entry.begin = offsets[0].get<uint64_t>();
    entry.end = offsets[1].get<uint64_t>();
    uint64_t expected = elementCount(entry.shape) * dtypeSize(*dtype);
    if (entry.end < entry.begin || entry.end - entry.begin != expected)
      return bad("byte range [" + std::to_string(entry.begin) + ", " +
                 std::to_string(entry.end) + ") does not hold shape " +
                 shapeString(entry.shape) + " of " + dtypeJson.dump());
    if (entry.end > dataSize)
      return bad("data ends at byte " + std::to_string(entry.end) +
                 " but the file holds " + std::to_string(dataSize) +
                 " data bytes: the file is truncated");
    file.entries.push_back(std::move(entry));
  }

  // The data section is covered exactly, without gaps or overlaps.
  std::vector<const TensorEntry *> sorted;
  for (const TensorEntry &e : file.entries)
    sorted.push_back(&e);
  std::sort(sorted.begin(), sorted.end(),
            [](auto *a, auto *b) { return a->begin < b->begin; });
  uint64_t cursor = 0;
  for (const TensorEntry *e : sorted) {
    if (e->begin != cursor)
      return fail(path, "tensor '" + e->name + "' starts at byte " +
                            std::to_string(e->begin) + ", expected " +
                            std::to_string(cursor) +
                            " (gap or overlap in the data section)");
    cursor = e->end;
  }
  if (cursor != dataSize)
    return fail(path, "data section has " + std::to_string(dataSize) +
                          " bytes but the tensors cover " +
                          std::to_string(cursor));

  auto checksum = file.metadata.find(kChecksumKey);
  if (verifyChecksum && checksum != file.metadata.end()) {
    std::string actual = hex64(fnv1a64(file.dataStart, dataSize));
    if (actual != checksum->second)
      return fail(path, "checksum mismatch (header says " + checksum->second +
                            ", data hashes to " + actual +
                            "): the file is corrupt");
  }
  return file;
}

} // namespace pccrt
