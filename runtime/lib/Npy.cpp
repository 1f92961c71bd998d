//===- Npy.cpp - NumPy .npy files -----------------------------------------===//
//
// The header is a Python dict literal, e.g.
//   {'descr': '<f4', 'fortran_order': False, 'shape': (2, 64), }
// padded with spaces to a 64-byte boundary and ended by '\n'.
//
//===----------------------------------------------------------------------===//

#include "pcc/runtime/Npy.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>

namespace pccrt {

namespace {
constexpr char kMagic[] = "\x93NUMPY";

struct Descr {
  const char *text;
  DType dtype;
};
// '<' little-endian, '|' not applicable (one byte), '=' native (x86 and Arm
// Linux are little-endian).
constexpr Descr kDescrs[] = {
    {"f4", DType::F32}, {"f8", DType::F64}, {"f2", DType::F16},
    {"i8", DType::I64}, {"i4", DType::I32}, {"i2", DType::I16},
    {"i1", DType::I8},  {"u1", DType::U8},  {"b1", DType::Bool}};

Error fail(const std::string &path, const std::string &what) {
  return Error{"'" + path + "': " + what};
}

/// The text after `key` (a quoted dict key) and its colon.
std::optional<size_t> findValue(const std::string &header,
                                const std::string &key) {
  size_t at = header.find("'" + key + "'");
  if (at == std::string::npos)
    return std::nullopt;
  at = header.find(':', at);
  if (at == std::string::npos)
    return std::nullopt;
  at = header.find_first_not_of(' ', at + 1);
  if (at == std::string::npos)
    return std::nullopt;
  return at;
}
} // namespace

Result<NpyArray> readNpy(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return fail(path, std::string("cannot open: ") + std::strerror(errno));
  std::string bytes((std::istreambuf_iterator<char>(in)),
                    std::istreambuf_iterator<char>());
  if (bytes.size() < 10 || bytes.compare(0, 6, kMagic, 6) != 0)
    return fail(path, "not a NumPy .npy file (bad magic)");
  unsigned major = static_cast<unsigned char>(bytes[6]);
  size_t headerLength, headerStart;
  if (major == 1) {
    headerLength = static_cast<unsigned char>(bytes[8]) |
                   (static_cast<unsigned char>(bytes[9]) << 8);
    headerStart = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12)
      return fail(path, "truncated .npy header");
    headerLength = 0;
    for (int i = 0; i < 4; ++i)
      headerLength |= size_t(static_cast<unsigned char>(bytes[8 + i]))
                      << (8 * i);
    headerStart = 12;
  } else {
    return fail(path, ".npy format version " + std::to_string(major) +
                          " is not supported");
  }
  if (headerStart + headerLength > bytes.size())
    return fail(path, "truncated .npy header");
  std::string header = bytes.substr(headerStart, headerLength);

  NpyArray array;
  auto descrAt = findValue(header, "descr");
  if (!descrAt || header[*descrAt] != '\'')
    return fail(path, "header has no 'descr'");
  size_t descrEnd = header.find('\'', *descrAt + 1);
  std::string descr = header.substr(*descrAt + 1, descrEnd - *descrAt - 1);
  if (descr.size() < 2 || descr[0] == '>')
    return fail(path, "dtype '" + descr +
                          "' is not supported (big-endian or unknown)");
  std::string code = descr.substr(1);
  bool found = false;
  for (const Descr &d : kDescrs)
    if (code == d.text) {
      array.dtype = d.dtype;
      found = true;
    }
  if (!found)
    return fail(path, "dtype '" + descr +
                          "' is not supported (use float32/64/16, int64/32/"
                          "16/8, uint8 or bool)");

  auto fortranAt = findValue(header, "fortran_order");
  if (fortranAt && header.compare(*fortranAt, 4, "True") == 0)
    return fail(path, "Fortran-ordered arrays are not supported; save with "
                      "numpy.ascontiguousarray");

  auto shapeAt = findValue(header, "shape");
  if (!shapeAt || header[*shapeAt] != '(')
    return fail(path, "header has no 'shape'");
  size_t shapeEnd = header.find(')', *shapeAt);
  if (shapeEnd == std::string::npos)
    return fail(path, "malformed 'shape' in the header");
  std::string dims = header.substr(*shapeAt + 1, shapeEnd - *shapeAt - 1);
  size_t pos = 0;
  while (pos < dims.size()) {
    size_t next = dims.find(',', pos);
    std::string item = dims.substr(
        pos, next == std::string::npos ? std::string::npos : next - pos);
    item.erase(0, item.find_first_not_of(' '));
    item.erase(item.find_last_not_of(' ') + 1);
    if (!item.empty()) {
      char *end = nullptr;
      long long value = std::strtoll(item.c_str(), &end, 10);
      if (*end != '\0' || value < 0)
        return fail(path, "malformed dimension '" + item + "' in 'shape'");
      array.shape.push_back(value);
    }
    if (next == std::string::npos)
      break;
    pos = next + 1;
  }

  size_t dataStart = headerStart + headerLength;
  size_t expected = elementCount(array.shape) * dtypeSize(array.dtype);
  if (bytes.size() - dataStart != expected)
    return fail(path, "holds " + std::to_string(bytes.size() - dataStart) +
                          " data bytes, shape " + shapeString(array.shape) +
                          " of " + std::string(dtypeName(array.dtype)) +
                          " needs " + std::to_string(expected));
  array.data.assign(bytes.begin() + dataStart, bytes.end());
  return array;
}

Status writeNpy(const std::string &path, const NpyArray &array) {
  const char *code = nullptr;
  for (const Descr &d : kDescrs)
    if (d.dtype == array.dtype)
      code = d.text;
  if (!code)
    return fail(path, "cannot store dtype " +
                          std::string(dtypeName(array.dtype)) + " in .npy");
  if (array.data.size() != elementCount(array.shape) * dtypeSize(array.dtype))
    return fail(path, "array data does not match its shape");
  // Python tuple syntax: "()", "(5,)", "(2, 3)".
  std::string dims;
  for (size_t i = 0; i < array.shape.size(); ++i)
    dims += (i ? ", " : "") + std::to_string(array.shape[i]);
  if (array.shape.size() == 1)
    dims += ",";
  std::string header = std::string("{'descr': '") +
                       (dtypeSize(array.dtype) == 1 ? "|" : "<") + code +
                       "', 'fortran_order': False, 'shape': (" + dims + "), }";
  while ((10 + header.size() + 1) % 64)
    header.push_back(' ');
  header.push_back('\n');

  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out)
    return fail(path, std::string("cannot create: ") + std::strerror(errno));
  out.write(kMagic, 6);
  const char version[2] = {1, 0};
  out.write(version, 2);
  const char length[2] = {static_cast<char>(header.size() & 0xff),
                          static_cast<char>(header.size() >> 8)};
  out.write(length, 2);
  out.write(header.data(), header.size());
  out.write(reinterpret_cast<const char *>(array.data.data()),
            array.data.size());
  if (!out)
    return fail(path, "write failed (disk full?)");
  return Status::success();
}

} // namespace pccrt
