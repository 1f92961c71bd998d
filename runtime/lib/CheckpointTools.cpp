//===- CheckpointTools.cpp - pcc ckpt inspect, verify, export -------------===//
//
// Offline tools for the checkpoints pcc-run --save-dir writes
// (Checkpoint.h): what a checkpoint holds, whether it is whole and sound,
// and its weights as one safetensors file. They need neither the model
// library nor MPI; `pcc ckpt` calls them.
//
//===----------------------------------------------------------------------===//

#include "pcc/runtime/CheckpointTools.h"

#include "pcc/runtime/Checkpoint.h"
#include "pcc/runtime/ModelAbi.h"
#include "pcc/runtime/Safetensors.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

using namespace pccrt;

namespace {

int fail(const std::string &message) {
  std::fprintf(stderr, "pcc: error: %s\n", message.c_str());
  return 1;
}

struct Stats {
  double min = INFINITY, max = -INFINITY, sum = 0;
  int64_t count = 0, nonFinite = 0;
};

/// Statistics of a float32 tensor (other types: count only).
Stats statsOf(const SafetensorsFile &file, const TensorEntry &entry) {
  Stats s;
  int64_t n = 1;
  for (int64_t d : entry.shape)
    n *= d;
  s.count = n;
  if (entry.dtype != DType::F32)
    return s;
  const uint8_t *data = file.data(entry);
  for (int64_t i = 0; i < n; ++i) {
    float v;
    std::memcpy(&v, data + 4 * i, 4);
    if (!std::isfinite(v)) {
      ++s.nonFinite;
      continue;
    }
    s.min = std::min<double>(s.min, v);
    s.max = std::max<double>(s.max, v);
    s.sum += v;
  }
  return s;
}

const char *const kFiles[] = {"weights.safetensors", "optimizer.safetensors"};

} // namespace

int pccrt::inspectCheckpoint(const std::string &dir) {
  auto text = readTextFile(dir + "/trainer.json");
  nlohmann::json state = text.ok()
                             ? nlohmann::json::parse(*text, nullptr, false)
                             : nlohmann::json();
  if (state.is_discarded() || !state.is_object())
    return fail("checkpoint '" + dir + "': trainer.json is unreadable");
  std::printf("checkpoint %s\n", dir.c_str());
  std::printf("  step %lld of a run on %s (%s)\n",
              static_cast<long long>(state.value("step", int64_t(0))),
              state.value("model", std::string("?")).c_str(),
              state.value("library", std::string("?")).c_str());
  std::printf("  loss %s, optimizer %s, batch %lld, %lld micro-batch(es), "
              "saved at tp=%lld x dp=%lld (ZeRO %lld); loads into any "
              "layout\n",
              state.value("loss", std::string("?")).c_str(),
              state.value("optimizer", std::string("?")).c_str(),
              static_cast<long long>(state.value("batch", int64_t(0))),
              static_cast<long long>(state.value("microbatches", int64_t(1))),
              static_cast<long long>(state.value(PCC_MESH_AXIS_TP, int64_t(1))),
              static_cast<long long>(state.value(PCC_MESH_AXIS_DP, int64_t(1))),
              static_cast<long long>(state.value("zero", int64_t(0))));
  auto saved = readCheckpointState(dir);
  if (!saved.ok())
    return fail(saved.error());
  if (saved->sharded)
    std::printf("  sharded: %lld rank files, put together below\n",
                static_cast<long long>(saved->files));
  for (const char *name : kFiles) {
    const SafetensorsFile *file =
        name == std::string(kFiles[0]) ? &*saved->weights : &*saved->optimizer;
    int64_t bytes = 0;
    for (const TensorEntry &e : file->tensors())
      bytes += static_cast<int64_t>(e.end - e.begin);
    std::printf("  %s: %zu tensors, %lld bytes\n", name, file->tensors().size(),
                static_cast<long long>(bytes));
    for (const TensorEntry &e : file->tensors()) {
      Stats s = statsOf(*file, e);
      std::printf("    %-40s %s %-14s", e.name.c_str(),
                  std::string(dtypeName(e.dtype)).c_str(),
                  shapeString(e.shape).c_str());
      if (e.dtype == DType::F32 && s.count > s.nonFinite)
        std::printf(" min %+.4g max %+.4g mean %+.4g", s.min, s.max,
                    s.sum / static_cast<double>(s.count - s.nonFinite));
      if (s.nonFinite)
        std::printf(" (%lld not finite)", static_cast<long long>(s.nonFinite));
      std::printf("\n");
    }
  }
  return 0;
}

int pccrt::verifyCheckpoint(const std::string &dir) {
  int64_t tensors = 0, elements = 0;
  std::map<std::string, std::vector<int64_t>> weights;
  auto saved = readCheckpointState(dir);
  if (!saved.ok())
    return fail(saved.error());
  for (const char *name : kFiles) {
    const SafetensorsFile *file =
        name == std::string(kFiles[0]) ? &*saved->weights : &*saved->optimizer;
    for (const TensorEntry &e : file->tensors()) {
      Stats s = statsOf(*file, e);
      if (s.nonFinite)
        return fail("checkpoint '" + dir + "': tensor '" + e.name + "' in " +
                    name + " has " + std::to_string(s.nonFinite) + " of " +
                    std::to_string(s.count) +
                    " values that are not finite (NaN or infinity)");
      std::string n = e.name;
      size_t at = n.rfind('@');
      if (std::string(name) == kFiles[0]) {
        weights[n] = e.shape;
      } else {
        if (at == std::string::npos)
          return fail("checkpoint '" + dir + "': optimizer tensor '" + n +
                      "' is not named <weight>@<state>");
        auto it = weights.find(n.substr(0, at));
        if (it == weights.end())
          return fail("checkpoint '" + dir + "': optimizer tensor '" + n +
                      "' belongs to no weight of weights.safetensors");
        if (it->second != e.shape)
          return fail("checkpoint '" + dir + "': optimizer tensor '" + n +
                      "' is " + shapeString(e.shape) + " but its weight is " +
                      shapeString(it->second));
      }
      ++tensors;
      elements += s.count;
    }
  }
  std::printf("pcc: checkpoint %s is sound: the manifest's checksums match, "
              "%lld tensors (%lld values) are finite, and the optimizer "
              "state matches the weights\n",
              dir.c_str(), static_cast<long long>(tensors),
              static_cast<long long>(elements));
  return 0;
}

Result<size_t> pccrt::writeCheckpointWeights(const std::string &dir,
                                             const std::string &output) {
  auto saved = readCheckpointState(dir);
  if (!saved.ok())
    return Error{saved.error()};
  const SafetensorsFile *file = &*saved->weights;
  SafetensorsWriter writer;
  for (const TensorEntry &e : file->tensors()) {
    const uint8_t *data = file->data(e);
    Status added =
        writer.add(e.name, e.dtype, e.shape,
                   std::vector<uint8_t>(data, data + (e.end - e.begin)));
    if (!added.ok())
      return Error{added.error()};
  }
  writer.setMetadata("pcc.content", "weights");
  writer.setMetadata("pcc.checkpoint", dir);
  std::string temp = output + ".tmp";
  Status written = writer.write(temp);
  if (!written.ok())
    return Error{written.error()};
  if (std::rename(temp.c_str(), output.c_str()) != 0) {
    std::remove(temp.c_str());
    return Error{"cannot write '" + output + "'"};
  }
  return file->tensors().size();
}

int pccrt::exportCheckpointWeights(const std::string &dir,
                                   const std::string &output) {
  auto written = writeCheckpointWeights(dir, output);
  if (!written.ok())
    return fail(written.error());
  std::fprintf(stderr, "pcc: wrote %s (%zu weights from %s)\n", output.c_str(),
               *written, dir.c_str());
  return 0;
}
