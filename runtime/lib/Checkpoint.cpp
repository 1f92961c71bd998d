//===- Checkpoint.cpp - training checkpoints on disk ----------------------===//

#include "pcc/runtime/Checkpoint.h"
#include "pcc/runtime/ModelLibrary.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace pccrt {

namespace {

std::string errnoText() { return std::strerror(errno); }

/// fsync of a file or directory.
Status syncPath(const std::string &path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0)
    return Error{"cannot open '" + path + "' to sync it: " + errnoText()};
  int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0)
    return Error{"cannot sync '" + path + "': " + errnoText()};
  return Status::success();
}

Status writeText(const std::string &path, const std::string &text) {
  FILE *f = std::fopen(path.c_str(), "wb");
  if (!f)
    return Error{"cannot write '" + path + "': " + errnoText()};
  bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  ok = std::fflush(f) == 0 && ok;
  ok = ::fsync(fileno(f)) == 0 && ok;
  ok = std::fclose(f) == 0 && ok;
  if (!ok)
    return Error{"cannot write '" + path + "': " + errnoText()};
  return Status::success();
}

/// Size and FNV-1a 64 of a file.
Result<std::pair<uint64_t, uint64_t>> digest(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return Error{"cannot read '" + path + "'"};
  uint64_t state = kFnv1a64Basis, size = 0;
  std::vector<char> buffer(1 << 20);
  while (in) {
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    std::streamsize n = in.gcount();
    if (n <= 0)
      break;
    state = fnv1a64(reinterpret_cast<const uint8_t *>(buffer.data()),
                    static_cast<size_t>(n), state);
    size += static_cast<uint64_t>(n);
  }
  return std::make_pair(size, state);
}

std::string hex(uint64_t v) {
  char text[17];
  std::snprintf(text, sizeof(text), "%016llx",
                static_cast<unsigned long long>(v));
  return text;
}

bool isDirectory(const std::string &path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::string stepName(int64_t step) {
  char text[32];
  std::snprintf(text, sizeof(text), "step-%08lld",
                static_cast<long long>(step));
  return text;
}

/// Removes a directory of plain files (a stale temporary checkpoint).
void removeDirectory(const std::string &path) {
  if (DIR *dir = ::opendir(path.c_str())) {
    while (dirent *e = ::readdir(dir)) {
      std::string name = e->d_name;
      if (name != "." && name != "..")
        ::unlink((path + "/" + name).c_str());
    }
    ::closedir(dir);
  }
  ::rmdir(path.c_str());
}

} // namespace

namespace {
Result<std::string> commitCheckpoint(const std::string &saveDir,
                                     const std::string &name,
                                     const std::string &temp,
                                     const nlohmann::json &manifest);

/// Records `file` of directory `dir` (synced) in `manifest`.
Status recordFile(const std::string &dir, const std::string &file,
                  nlohmann::json &manifest) {
  std::string path = dir + "/" + file;
  Status synced = syncPath(path);
  if (!synced.ok())
    return synced;
  auto d = digest(path);
  if (!d.ok())
    return Error{d.error()};
  manifest["files"][file] = {{"bytes", d->first}, {"fnv1a64", hex(d->second)}};
  return Status::success();
}

/// The names in directory `dir` that start with `prefix` and end with
/// `suffix`, sorted.
std::vector<std::string> listFiles(const std::string &dir,
                                   const std::string &prefix,
                                   const std::string &suffix) {
  std::vector<std::string> names;
  if (DIR *d = ::opendir(dir.c_str())) {
    while (struct dirent *e = ::readdir(d)) {
      std::string n = e->d_name;
      if (n.size() >= prefix.size() + suffix.size() &&
          n.compare(0, prefix.size(), prefix) == 0 &&
          n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0)
        names.push_back(n);
    }
    ::closedir(d);
  }
  std::sort(names.begin(), names.end());
  return names;
}
} // namespace

Result<std::string> readTextFile(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return Error{"cannot read '" + path + "'"};
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

Result<std::string> writeCheckpoint(
    const std::string &saveDir, int64_t step,
    const std::vector<std::pair<std::string, const SafetensorsWriter *>> &files,
    const std::string &trainerJson, bool crashBeforeManifest) {
  if (!isDirectory(saveDir) && ::mkdir(saveDir.c_str(), 0755) != 0 &&
      errno != EEXIST)
    return Error{"cannot create the checkpoint directory '" + saveDir +
                 "': " + errnoText()};
  std::string name = stepName(step);
  std::string final = saveDir + "/" + name;
  std::string temp =
      saveDir + "/." + name + ".tmp-" + std::to_string(::getpid());
  removeDirectory(temp);
  if (::mkdir(temp.c_str(), 0755) != 0)
    return Error{"cannot create '" + temp + "': " + errnoText()};
  nlohmann::json manifest;
  manifest["format"] = "pcc-checkpoint-1";
  manifest["step"] = step;
  auto record = [&](const std::string &file) {
    return recordFile(temp, file, manifest);
  };
  for (const auto &[file, writer] : files) {
    Status written = writer->write(temp + "/" + file);
    if (!written.ok())
      return Error{written.error()};
    Status recorded = record(file);
    if (!recorded.ok())
      return Error{recorded.error()};
  }
  Status written = writeText(temp + "/trainer.json", trainerJson);
  if (!written.ok())
    return Error{written.error()};
  Status recorded = record("trainer.json");
  if (!recorded.ok())
    return Error{recorded.error()};
  if (crashBeforeManifest) {
    std::fflush(stdout);
    std::raise(SIGKILL);
  }
  return commitCheckpoint(saveDir, name, temp, manifest);
}

namespace {
/// Writes the manifest into the temporary directory `temp`, then renames
/// it to `<saveDir>/<name>` and points LATEST at it.
Result<std::string> commitCheckpoint(const std::string &saveDir,
                                     const std::string &name,
                                     const std::string &temp,
                                     const nlohmann::json &manifest) {
  std::string final = saveDir + "/" + name;
  Status written =
      writeText(temp + "/MANIFEST.json", manifest.dump(2) + "\n");
  if (!written.ok())
    return Error{written.error()};
  Status synced = syncPath(temp);
  if (!synced.ok())
    return Error{synced.error()};
  // A checkpoint of the same step (a rerun) is replaced whole.
  if (isDirectory(final)) {
    std::string old = final + ".old-" + std::to_string(::getpid());
    if (::rename(final.c_str(), old.c_str()) != 0)
      return Error{"cannot move the old '" + final + "' aside: " + errnoText()};
    removeDirectory(old);
  }
  if (::rename(temp.c_str(), final.c_str()) != 0)
    return Error{"cannot rename '" + temp + "' to '" + final +
                 "': " + errnoText()};
  std::string latestTemp = saveDir + "/.LATEST.tmp-" + std::to_string(::getpid());
  written = writeText(latestTemp, name + "\n");
  if (!written.ok())
    return Error{written.error()};
  if (::rename(latestTemp.c_str(), (saveDir + "/LATEST").c_str()) != 0)
    return Error{"cannot update '" + saveDir + "/LATEST': " + errnoText()};
  synced = syncPath(saveDir);
  if (!synced.ok())
    return Error{synced.error()};
  return final;
}
} // namespace

Result<std::string> openCheckpoint(const std::string &path) {
  std::string dir = path;
  while (dir.size() > 1 && dir.back() == '/')
    dir.pop_back();
  if (!isDirectory(dir))
    return Error{"checkpoint '" + path + "' is not a directory"};
  if (::access((dir + "/MANIFEST.json").c_str(), F_OK) != 0) {
    auto latest = readTextFile(dir + "/LATEST");
    if (!latest.ok())
      return Error{"'" + path +
                   "' holds no checkpoint: neither MANIFEST.json nor LATEST "
                   "(a save that was interrupted leaves only a temporary "
                   "directory, which is ignored)"};
    std::string name = *latest;
    while (!name.empty() && (name.back() == '\n' || name.back() == ' '))
      name.pop_back();
    if (name.empty() || name.find('/') != std::string::npos)
      return Error{"'" + dir + "/LATEST' does not name a checkpoint"};
    dir += "/" + name;
  }
  auto text = readTextFile(dir + "/MANIFEST.json");
  if (!text.ok())
    return Error{"checkpoint '" + dir + "' has no MANIFEST.json"};
  nlohmann::json manifest = nlohmann::json::parse(*text, nullptr, false);
  if (manifest.is_discarded() || !manifest.contains("files") ||
      manifest.value("format", "") != "pcc-checkpoint-1")
    return Error{"checkpoint '" + dir + "': MANIFEST.json is not a pcc "
                 "checkpoint manifest"};
  for (auto &[file, entry] : manifest["files"].items()) {
    auto d = digest(dir + "/" + file);
    if (!d.ok())
      return Error{"checkpoint '" + dir + "': '" + file +
                   "' is missing or unreadable"};
    if (d->first != entry.value("bytes", uint64_t(0)) ||
        hex(d->second) != entry.value("fnv1a64", std::string()))
      return Error{"checkpoint '" + dir + "': '" + file +
                   "' does not match its checksum in MANIFEST.json (the file "
                   "is corrupt or was changed)"};
  }
  return dir;
}

Result<std::string>
writeShardedCheckpoint(const std::string &saveDir, int64_t step, int rank,
                       const SafetensorsWriter *shard,
                       const std::string &trainerJson,
                       const std::function<Status()> &barrier) {
  std::string name = stepName(step);
  std::string temp = saveDir + "/." + name + ".tmp-sharded";
  if (rank == 0) {
    if (!isDirectory(saveDir) && ::mkdir(saveDir.c_str(), 0755) != 0 &&
        errno != EEXIST)
      return Error{"cannot create the checkpoint directory '" + saveDir +
                   "': " + errnoText()};
    removeDirectory(temp);
    if (::mkdir(temp.c_str(), 0755) != 0)
      return Error{"cannot create '" + temp + "': " + errnoText()};
  }
  Status met = barrier();
  if (!met.ok())
    return Error{met.error()};
  if (shard) {
    char file[32];
    std::snprintf(file, sizeof(file), "rank-%05d.safetensors", rank);
    Status written = shard->write(temp + "/" + file);
    if (!written.ok())
      return Error{written.error()};
    Status synced = syncPath(temp + "/" + file);
    if (!synced.ok())
      return Error{synced.error()};
  }
  met = barrier();
  if (!met.ok())
    return Error{met.error()};
  Result<std::string> final = saveDir + "/" + name;
  if (rank == 0) {
    nlohmann::json manifest;
    manifest["format"] = "pcc-checkpoint-1";
    manifest["step"] = step;
    manifest["sharded"] = true;
    for (const std::string &file : listFiles(temp, "rank-", ".safetensors")) {
      Status recorded = recordFile(temp, file, manifest);
      if (!recorded.ok())
        return Error{recorded.error()};
    }
    Status written = writeText(temp + "/trainer.json", trainerJson);
    if (written.ok())
      written = recordFile(temp, "trainer.json", manifest);
    if (!written.ok())
      return Error{written.error()};
    final = commitCheckpoint(saveDir, name, temp, manifest);
    if (!final.ok())
      return final;
  }
  // No rank goes on (and possibly saves again) before the commit.
  met = barrier();
  if (!met.ok())
    return Error{met.error()};
  return final;
}

Result<CheckpointState>
readCheckpointState(const std::string &dir,
                    const std::function<bool(const std::string &)> &wanted) {
  CheckpointState state;
  if (::access((dir + "/weights.safetensors").c_str(), F_OK) == 0) {
    auto weights = SafetensorsFile::open(dir + "/weights.safetensors");
    if (!weights.ok())
      return Error{weights.error()};
    auto optimizer = SafetensorsFile::open(dir + "/optimizer.safetensors");
    if (!optimizer.ok())
      return Error{optimizer.error()};
    state.weights.emplace(weights.take());
    state.optimizer.emplace(optimizer.take());
    state.files = 2;
    return state;
  }
  std::vector<std::string> files = listFiles(dir, "rank-", ".safetensors");
  if (files.empty())
    return Error{"checkpoint '" + dir + "' holds neither weights.safetensors "
                 "nor rank-*.safetensors shards"};
  // Each tensor's pieces, from every shard file's piece table.
  struct Piece {
    const SafetensorsFile *file;
    const TensorEntry *entry;
    int64_t splitRanks = 1, splitRank = 0, dim = 0, stripes = 1;
    int64_t flatRanks = 1, flatRank = 0;
  };
  struct Whole {
    std::string name, kind;
    DType dtype;
    std::vector<int64_t> shape;
    std::vector<Piece> pieces;
  };
  std::vector<SafetensorsFile> opened;
  opened.reserve(files.size());
  std::vector<Whole> wholes;
  std::map<std::string, size_t> index;
  for (const std::string &file : files) {
    auto f = SafetensorsFile::open(dir + "/" + file);
    if (!f.ok())
      return Error{f.error()};
    opened.push_back(f.take());
  }
  for (size_t k = 0; k < opened.size(); ++k) {
    const SafetensorsFile &f = opened[k];
    std::string where = "checkpoint '" + dir + "': '" + files[k] + "'";
    auto meta = f.getMetadata().find(kPiecesKey);
    nlohmann::json table =
        meta == f.getMetadata().end()
            ? nlohmann::json()
            : nlohmann::json::parse(meta->second, nullptr, false);
    if (!table.is_object())
      return Error{where + " has no piece table (" + kPiecesKey + ")"};
    for (const TensorEntry &e : f.tensors()) {
      const nlohmann::json &p = table[e.name];
      if (!p.is_object() || !p["shape"].is_array())
        return Error{where + ": tensor '" + e.name +
                     "' is not in the piece table"};
      Piece piece{&f, &e};
      if (p.contains("split")) {
        piece.splitRanks = p["split"].value("ranks", int64_t(1));
        piece.splitRank = p["split"].value("rank", int64_t(0));
        piece.dim = p["split"].value("dim", int64_t(0));
        piece.stripes = p["split"].value("stripes", int64_t(1));
      }
      if (p.contains("flat")) {
        piece.flatRanks = p["flat"].value("ranks", int64_t(1));
        piece.flatRank = p["flat"].value("rank", int64_t(0));
      }
      auto [it, inserted] = index.try_emplace(e.name, wholes.size());
      if (inserted)
        wholes.push_back({e.name, p.value("kind", std::string("weight")),
                          e.dtype, p["shape"].get<std::vector<int64_t>>(),
                          {}});
      wholes[it->second].pieces.push_back(piece);
    }
  }
  SafetensorsWriter weights, optimizer;
  state.tensors = static_cast<int64_t>(wholes.size());
  for (Whole &w : wholes) {
    if (wanted && !wanted(w.name))
      continue;
    ++state.assembled;
    int64_t element = dtypeSize(w.dtype);
    int64_t wholeBytes = elementCount(w.shape) * element;
    const Piece &first = w.pieces.front();
    int64_t splitRanks = first.splitRanks, flatRanks = first.flatRanks;
    // Every (split rank, flat rank) once.
    std::vector<const Piece *> grid(splitRanks * flatRanks, nullptr);
    for (const Piece &p : w.pieces) {
      if (p.splitRanks != splitRanks || p.flatRanks != flatRanks ||
          p.splitRank >= splitRanks || p.flatRank >= flatRanks)
        return Error{"checkpoint '" + dir + "': tensor '" + w.name +
                     "' has pieces of different layouts"};
      grid[p.splitRank * flatRanks + p.flatRank] = &p;
    }
    for (int64_t r = 0; r < splitRanks; ++r)
      for (int64_t q = 0; q < flatRanks; ++q)
        if (!grid[r * flatRanks + q])
          return Error{"checkpoint '" + dir + "': tensor '" + w.name +
                       "' lacks its piece of split rank " + std::to_string(r) +
                       " and flat rank " + std::to_string(q) +
                       " (a shard file is missing)"};
    std::vector<uint8_t> bytes(static_cast<size_t>(wholeBytes), 0);
    int64_t splitBytes = wholeBytes / splitRanks;
    std::vector<uint8_t> part(static_cast<size_t>(splitBytes));
    for (int64_t r = 0; r < splitRanks; ++r) {
      // The flat pieces in rank order, padding dropped.
      for (int64_t q = 0; q < flatRanks; ++q) {
        const Piece &p = *grid[r * flatRanks + q];
        int64_t size = static_cast<int64_t>(p.entry->end - p.entry->begin);
        int64_t begin = std::min(splitBytes, q * size);
        int64_t end = std::min(splitBytes, begin + size);
        std::memcpy(part.data() + begin, p.file->data(*p.entry),
                    static_cast<size_t>(end - begin));
      }
      if (splitRanks > 1)
        copySplitPiece(w.shape, element, first.dim, first.stripes, splitRanks,
                       r, bytes.data(), part.data(), /*toPiece=*/false);
      else
        bytes = part;
    }
    Status added = (w.kind == "optimizer" ? optimizer : weights)
                       .add(w.name, w.dtype, w.shape, std::move(bytes));
    if (!added.ok())
      return Error{added.error()};
  }
  weights.setMetadata("pcc.content", "weights");
  optimizer.setMetadata("pcc.content", "optimizer state");
  auto w = SafetensorsFile::fromBytes(weights.serialize(),
                                      dir + " (weights from its shards)");
  auto o = SafetensorsFile::fromBytes(optimizer.serialize(),
                                      dir + " (optimizer state from its shards)");
  if (!w.ok() || !o.ok())
    return Error{w.ok() ? o.error() : w.error()};
  state.weights.emplace(w.take());
  state.optimizer.emplace(o.take());
  state.sharded = true;
  state.files = static_cast<int64_t>(files.size());
  return state;
}

} // namespace pccrt
