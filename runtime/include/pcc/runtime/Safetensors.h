//===- Safetensors.h - the weights file format ------------------*- C++ -*-===//
//
// pcc stores weights in the safetensors format (8-byte little-endian header
// length, a JSON header naming each tensor's dtype, shape and byte range, then
// the packed data), so that other tools can read them and each rank can map
// the file and touch only its own slices. pcc adds two metadata entries:
// "pcc.format" (a version) and "pcc.fnv1a64" (a checksum of the data).
//
//===----------------------------------------------------------------------===//

#ifndef PCC_RUNTIME_SAFETENSORS_H
#define PCC_RUNTIME_SAFETENSORS_H

#include "pcc/runtime/DType.h"
#include "pcc/runtime/Result.h"

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace pccrt {

struct TensorEntry {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  /// Byte range inside the data section.
  uint64_t begin = 0, end = 0;
};

/// The FNV-1a 64-bit initial state.
constexpr uint64_t kFnv1a64Basis = 0xcbf29ce484222325ull;

/// 64-bit FNV-1a over a byte range (the weights checksum), continuing from
/// `state` so that hashing pieces in turn equals hashing their concatenation.
uint64_t fnv1a64(const uint8_t *data, size_t size,
                 uint64_t state = kFnv1a64Basis);

class SafetensorsWriter {
public:
  /// Adds a tensor; `bytes` must hold exactly elementCount(shape) elements.
  Status add(std::string name, DType dtype, std::vector<int64_t> shape,
             std::vector<uint8_t> bytes);
  void setMetadata(std::string key, std::string value);
  /// Writes the file (tensors in the order added).
  Status write(const std::string &path) const;
  /// The file's bytes, as write() would store them.
  std::vector<uint8_t> serialize() const;

private:
  std::vector<TensorEntry> entries;
  std::vector<std::vector<uint8_t>> payloads;
  std::map<std::string, std::string> metadata;
};

/// A safetensors file mapped read-only into memory.
class SafetensorsFile {
public:
  /// Maps and validates `path`: header syntax, dtypes, shapes against byte
  /// ranges, ranges inside the file without gaps or overlaps, and, when
  /// `verifyChecksum` is set and the file carries "pcc.fnv1a64", the data.
  static Result<SafetensorsFile> open(const std::string &path,
                                      bool verifyChecksum = true);
  /// The same checks on a file's bytes held in memory (a checkpoint's
  /// shards put together); `name` stands for the path in messages.
  static Result<SafetensorsFile> fromBytes(std::vector<uint8_t> bytes,
                                           const std::string &name);

  const std::vector<TensorEntry> &tensors() const { return entries; }
  const TensorEntry *find(std::string_view name) const;
  const uint8_t *data(const TensorEntry &entry) const {
    return dataStart + entry.begin;
  }
  const std::map<std::string, std::string> &getMetadata() const {
    return metadata;
  }

private:
  SafetensorsFile() = default;
  static Result<SafetensorsFile> parse(SafetensorsFile file,
                                       const uint8_t *bytes, size_t size,
                                       bool verifyChecksum);
  std::string path;
  std::vector<uint8_t> owned; // fromBytes: the bytes themselves
  /// munmap()s the file's mapping.
  struct Unmapper {
    size_t size;
    void operator()(void *mapping) const;
  };
  std::unique_ptr<void, Unmapper> mapping;
  const uint8_t *dataStart = nullptr;
  std::vector<TensorEntry> entries;
  std::map<std::string, std::string> metadata;
};

} // namespace pccrt

#endif // PCC_RUNTIME_SAFETENSORS_H
