//===- RuntimeFormatsTest.cpp - .npy and safetensors files ----------------===//

#include "pcc/runtime/Npy.h"
#include "pcc/runtime/Safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>

using namespace pccrt;

namespace {

std::string tempPath(const std::string &name) {
  return ::testing::TempDir() + "/pcc_" + name;
}

std::vector<uint8_t> floatBytes(std::vector<float> values) {
  std::vector<uint8_t> bytes(values.size() * 4);
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

std::string readFile(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)),
                     std::istreambuf_iterator<char>());
}

void writeFile(const std::string &path, const std::string &bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// Tests reading arrays that NumPy itself wrote (the examples' references).
TEST(Npy, ReadsNumpyFiles) {
  auto input = readNpy(PCC_SOURCE_DIR "/examples/data/mlp.input.npy");
  ASSERT_TRUE(input.ok()) << input.error();
  EXPECT_EQ(input->dtype, DType::F32);
  EXPECT_EQ(input->shape, (std::vector<int64_t>{2, 64}));
  EXPECT_EQ(input->data.size(), 2u * 64 * 4);

  auto ids = readNpy(PCC_SOURCE_DIR "/examples/data/gpt.input.npy");
  ASSERT_TRUE(ids.ok()) << ids.error();
  EXPECT_EQ(ids->dtype, DType::I64);
  EXPECT_EQ(ids->shape, (std::vector<int64_t>{2, 16}));
}

// Tests that what writeNpy writes reads back identically, for ranks 0-2.
TEST(Npy, RoundTrip) {
  for (std::vector<int64_t> shape : {std::vector<int64_t>{}, {5}, {2, 3}}) {
    NpyArray a{DType::F32, shape,
               floatBytes(std::vector<float>(elementCount(shape), 1.5f))};
    std::string path = tempPath("roundtrip.npy");
    ASSERT_TRUE(writeNpy(path, a).ok());
    auto b = readNpy(path);
    ASSERT_TRUE(b.ok()) << b.error();
    EXPECT_EQ(b->shape, shape);
    EXPECT_EQ(b->data, a.data);
    // The header is padded so the data starts 64-byte aligned.
    EXPECT_EQ((readFile(path).size() - a.data.size()) % 64, 0u);
  }
}

// Tests the errors for files that are not usable arrays.
TEST(Npy, Errors) {
  std::string path = tempPath("bad.npy");
  writeFile(path, "hello, not numpy");
  auto notNpy = readNpy(path);
  ASSERT_FALSE(notNpy.ok());
  EXPECT_NE(notNpy.error().find("not a NumPy .npy file"), std::string::npos);

  NpyArray a{DType::I64, {4}, std::vector<uint8_t>(32, 0)};
  ASSERT_TRUE(writeNpy(path, a).ok());
  std::string bytes = readFile(path);
  writeFile(path, bytes.substr(0, bytes.size() - 3));
  auto truncated = readNpy(path);
  ASSERT_FALSE(truncated.ok());
  EXPECT_NE(truncated.error().find("holds 29 data bytes, shape 4 of I64 "
                                   "needs 32"),
            std::string::npos)
      << truncated.error();

  auto missing = readNpy(tempPath("does-not-exist.npy"));
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().find("cannot open"), std::string::npos);
}

// Tests a safetensors round trip: shapes, dtypes, data and metadata.
TEST(Safetensors, RoundTrip) {
  SafetensorsWriter writer;
  ASSERT_TRUE(
      writer.add("w", DType::F32, {2, 2}, floatBytes({1, 2, 3, 4})).ok());
  ASSERT_TRUE(
      writer.add("ids", DType::I64, {1}, std::vector<uint8_t>(8, 7)).ok());
  writer.setMetadata("source", "unit-test");
  std::string path = tempPath("weights.safetensors");
  ASSERT_TRUE(writer.write(path).ok());

  auto file = SafetensorsFile::open(path);
  ASSERT_TRUE(file.ok()) << file.error();
  ASSERT_EQ(file->tensors().size(), 2u);
  const TensorEntry *w = file->find("w");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->shape, (std::vector<int64_t>{2, 2}));
  float values[4];
  std::memcpy(values, file->data(*w), 16);
  EXPECT_EQ(values[3], 4.0f);
  EXPECT_EQ(file->getMetadata().at("source"), "unit-test");
  EXPECT_EQ(file->getMetadata().count("pcc.fnv1a64"), 1u);
  // The data section starts 8-byte aligned.
  EXPECT_EQ(reinterpret_cast<uintptr_t>(file->data(*w)) % 8, 0u);
}

// Tests that a file without tensors (a model without weights) round-trips,
// and that hashing in pieces equals hashing the whole.
TEST(Safetensors, EmptyFileAndChunkedChecksum) {
  SafetensorsWriter writer;
  std::string path = tempPath("empty.safetensors");
  ASSERT_TRUE(writer.write(path).ok());
  auto file = SafetensorsFile::open(path);
  ASSERT_TRUE(file.ok()) << file.error();
  EXPECT_TRUE(file->tensors().empty());
  const uint8_t data[] = {1, 2, 3, 4, 5};
  EXPECT_EQ(fnv1a64(data + 2, 3, fnv1a64(data, 2)), fnv1a64(data, 5));
}

// Tests that the writer rejects data that does not match the shape.
TEST(Safetensors, WriterChecksSizes) {
  SafetensorsWriter writer;
  Status s = writer.add("w", DType::F32, {3}, floatBytes({1, 2}));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error(), "tensor 'w': 8 bytes for shape 3 of F32 (needs 12)");
}

// Tests that corruption is detected: a flipped data byte fails the
// checksum, a truncated file and a garbage header are rejected.
TEST(Safetensors, DetectsCorruption) {
  SafetensorsWriter writer;
  ASSERT_TRUE(writer.add("w", DType::F32, {4}, floatBytes({1, 2, 3, 4})).ok());
  std::string path = tempPath("corrupt.safetensors");
  ASSERT_TRUE(writer.write(path).ok());
  std::string good = readFile(path);

  std::string flipped = good;
  flipped[flipped.size() - 1] ^= 0x40;
  writeFile(path, flipped);
  auto bad = SafetensorsFile::open(path);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().find("checksum mismatch"), std::string::npos);
  EXPECT_TRUE(SafetensorsFile::open(path, /*verifyChecksum=*/false).ok());

  writeFile(path, good.substr(0, good.size() - 5));
  auto truncated = SafetensorsFile::open(path);
  ASSERT_FALSE(truncated.ok());
  EXPECT_NE(truncated.error().find("truncated"), std::string::npos)
      << truncated.error();

  writeFile(path, std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8) + "{}");
  auto garbage = SafetensorsFile::open(path);
  ASSERT_FALSE(garbage.ok());
  EXPECT_NE(garbage.error().find("does not fit the file"), std::string::npos);

  writeFile(path, std::string("\x04\0\0\0\0\0\0\0", 8) + "[1,2");
  auto notObject = SafetensorsFile::open(path);
  ASSERT_FALSE(notObject.ok());
  EXPECT_NE(notObject.error().find("not a JSON object"), std::string::npos);
}

} // namespace
