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

bool endsWith(const std::string &s, const std::string &suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

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

Result<std::string> openCheckpoint(const std::string &path,
                                   bool verifyChecksums) {
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
    // The data files' checksums may wait (a CheckpointReader checks each
    // as it reads it); the small files are checked now.
    if (!verifyChecksums && endsWith(file, ".safetensors")) {
      struct stat st;
      if (::stat((dir + "/" + file).c_str(), &st) != 0)
        return Error{"checkpoint '" + dir + "': '" + file +
                     "' is missing or unreadable"};
      if (static_cast<uint64_t>(st.st_size) != entry.value("bytes", uint64_t(0)))
        return Error{"checkpoint '" + dir + "': '" + file +
                     "' does not have the size MANIFEST.json records (the "
                     "file is truncated or was changed)"};
      continue;
    }
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

struct CheckpointReader::Impl {
  /// One saved piece: the file holding it, and which slice it is.
  struct Piece {
    size_t file;
    const TensorEntry *entry;
    int64_t splitRanks = 1, splitRank = 0, dim = 0, stripes = 1;
    int64_t flatRanks = 1, flatRank = 0;
  };
  std::string source;
  bool sharded = false;
  std::vector<std::string> names; // the files, relative to `source`
  std::vector<std::unique_ptr<SafetensorsFile>> files;
  /// The manifest's checksum of each file; empty: checked already.
  std::vector<std::string> checksum;
  std::vector<char> read;
  std::vector<SavedTensor> tensors;
  /// Per tensor, its pieces by (split rank, flat rank).
  std::vector<std::vector<Piece>> grids;
  std::map<std::string, size_t> index;

  std::string where() const { return "checkpoint '" + source + "'"; }
  /// The bytes of piece `p`, after checking its file once.
  Result<const uint8_t *> data(const Piece &p) {
    if (!read[p.file]) {
      if (!checksum[p.file].empty()) {
        auto d = digest(source + "/" + names[p.file]);
        if (!d.ok() || hex(d->second) != checksum[p.file])
          return Error{where() + ": '" + names[p.file] +
                       "' does not match its checksum in MANIFEST.json (the "
                       "file is corrupt or was changed)"};
      }
      read[p.file] = 1;
    }
    return files[p.file]->data(*p.entry);
  }
  /// Split piece `r` as saved (its flat pieces in order, padding dropped).
  Status savedSplit(size_t t, int64_t r, uint8_t *out, int64_t splitBytes) {
    const std::vector<Piece> &grid = grids[t];
    int64_t flatRanks = grid.front().flatRanks;
    for (int64_t q = 0; q < flatRanks; ++q) {
      const Piece &p = grid[r * flatRanks + q];
      auto bytes = data(p);
      if (!bytes.ok())
        return Error{bytes.error()};
      int64_t size = static_cast<int64_t>(p.entry->end - p.entry->begin);
      int64_t begin = std::min(splitBytes, q * size);
      int64_t end = std::min(splitBytes, begin + size);
      std::memcpy(out + begin, *bytes, static_cast<size_t>(end - begin));
    }
    return Status::success();
  }
};

CheckpointReader::CheckpointReader() : impl(std::make_unique<Impl>()) {}
CheckpointReader::CheckpointReader(CheckpointReader &&) noexcept = default;
CheckpointReader &
CheckpointReader::operator=(CheckpointReader &&) noexcept = default;
CheckpointReader::~CheckpointReader() = default;

const std::vector<SavedTensor> &CheckpointReader::tensors() const {
  return impl->tensors;
}
const SavedTensor *CheckpointReader::find(const std::string &name) const {
  auto it = impl->index.find(name);
  return it == impl->index.end() ? nullptr : &impl->tensors[it->second];
}
const std::string &CheckpointReader::source() const { return impl->source; }
bool CheckpointReader::sharded() const { return impl->sharded; }
int64_t CheckpointReader::files() const {
  return static_cast<int64_t>(impl->files.size());
}
int64_t CheckpointReader::filesRead() const {
  return std::count(impl->read.begin(), impl->read.end(), 1);
}

Result<CheckpointReader> CheckpointReader::fromFile(const std::string &path,
                                                    const std::string &kind) {
  auto f = SafetensorsFile::open(path);
  if (!f.ok())
    return Error{f.error()};
  CheckpointReader reader;
  Impl &r = *reader.impl;
  r.source = path;
  r.names.push_back(path);
  r.files.push_back(std::make_unique<SafetensorsFile>(f.take()));
  r.checksum.emplace_back(); // checked as it opened
  r.read.push_back(0);
  for (const TensorEntry &e : r.files[0]->tensors()) {
    r.index[e.name] = r.tensors.size();
    r.tensors.push_back({e.name, kind, e.dtype, e.shape});
    r.grids.push_back({Impl::Piece{0, &e}});
  }
  return reader;
}

Result<CheckpointReader> CheckpointReader::open(const std::string &dir) {
  CheckpointReader reader;
  Impl &r = *reader.impl;
  r.source = dir;
  auto text = readTextFile(dir + "/MANIFEST.json");
  nlohmann::json manifest =
      text.ok() ? nlohmann::json::parse(*text, nullptr, false)
                : nlohmann::json();
  if (!manifest.is_object() || !manifest["files"].is_object())
    return Error{r.where() + " has no readable MANIFEST.json"};
  std::vector<std::pair<std::string, std::string>> files; // (name, kind)
  if (::access((dir + "/weights.safetensors").c_str(), F_OK) == 0) {
    files = {{"weights.safetensors", "weight"},
             {"optimizer.safetensors", "optimizer"}};
  } else {
    for (const std::string &f : listFiles(dir, "rank-", ".safetensors"))
      files.push_back({f, ""});
    if (files.empty())
      return Error{r.where() + " holds neither weights.safetensors nor "
                   "rank-*.safetensors shards"};
    r.sharded = true;
  }
  for (auto &[name, kind] : files) {
    const nlohmann::json &entry = manifest["files"][name];
    if (!entry.is_object())
      return Error{r.where() + ": '" + name + "' is not in MANIFEST.json"};
    // The data are checked against the manifest when first read.
    auto f = SafetensorsFile::open(dir + "/" + name, /*verifyChecksum=*/false);
    if (!f.ok())
      return Error{f.error()};
    r.names.push_back(name);
    r.files.push_back(std::make_unique<SafetensorsFile>(f.take()));
    r.checksum.push_back(entry.value("fnv1a64", std::string("?")));
    r.read.push_back(0);
  }
  for (size_t k = 0; k < r.files.size(); ++k) {
    const SafetensorsFile &f = *r.files[k];
    std::string where = r.where() + ": '" + r.names[k] + "'";
    nlohmann::json table;
    if (r.sharded) {
      auto meta = f.getMetadata().find(kPiecesKey);
      if (meta != f.getMetadata().end())
        table = nlohmann::json::parse(meta->second, nullptr, false);
      if (!table.is_object())
        return Error{where + " has no piece table (" + kPiecesKey + ")"};
    }
    for (const TensorEntry &e : f.tensors()) {
      Impl::Piece piece{k, &e};
      std::string kind = files[k].second;
      std::vector<int64_t> shape = e.shape;
      if (r.sharded) {
        const nlohmann::json &p = table[e.name];
        if (!p.is_object() || !p["shape"].is_array())
          return Error{where + ": tensor '" + e.name +
                       "' is not in the piece table"};
        kind = p.value("kind", std::string("weight"));
        shape = p["shape"].get<std::vector<int64_t>>();
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
      }
      auto [it, inserted] = r.index.try_emplace(e.name, r.tensors.size());
      if (inserted) {
        r.tensors.push_back({e.name, kind, e.dtype, shape});
        r.grids.emplace_back();
      }
      r.grids[it->second].push_back(piece);
    }
  }
  // Each tensor's pieces in one layout, every (split rank, flat rank) once,
  // ordered by them.
  for (size_t t = 0; t < r.tensors.size(); ++t) {
    std::vector<Impl::Piece> &pieces = r.grids[t];
    const Impl::Piece first = pieces.front();
    std::vector<Impl::Piece> grid(first.splitRanks * first.flatRanks,
                                  Impl::Piece{0, nullptr});
    for (const Impl::Piece &p : pieces) {
      if (p.splitRanks != first.splitRanks || p.flatRanks != first.flatRanks ||
          p.dim != first.dim || p.stripes != first.stripes ||
          p.splitRank >= p.splitRanks || p.flatRank >= p.flatRanks)
        return Error{r.where() + ": tensor '" + r.tensors[t].name +
                     "' has pieces of different layouts"};
      grid[p.splitRank * p.flatRanks + p.flatRank] = p;
    }
    for (int64_t s = 0; s < first.splitRanks; ++s)
      for (int64_t q = 0; q < first.flatRanks; ++q)
        if (!grid[s * first.flatRanks + q].entry)
          return Error{r.where() + ": tensor '" + r.tensors[t].name +
                       "' lacks its piece of split rank " + std::to_string(s) +
                       " and flat rank " + std::to_string(q) +
                       " (a shard file is missing)"};
    pieces = std::move(grid);
  }
  return reader;
}

Status CheckpointReader::read(const std::string &name, const PieceSpec &spec,
                              uint8_t *out) {
  Impl &r = *impl;
  auto it = r.index.find(name);
  if (it == r.index.end())
    return Error{r.where() + " has no tensor '" + name + "'"};
  size_t t = it->second;
  const SavedTensor &meta = r.tensors[t];
  const Impl::Piece &first = r.grids[t].front();
  int64_t element = dtypeSize(meta.dtype);
  int64_t wholeBytes = elementCount(meta.shape) * element;
  int64_t savedSplit = wholeBytes / first.splitRanks;
  bool sameSplit =
      spec.splitRanks == first.splitRanks &&
      (spec.splitRanks == 1 ||
       (spec.dim == first.dim && spec.stripes == first.stripes));
  // The piece exactly as saved: straight from its file.
  if (sameSplit && spec.flatRanks == first.flatRanks) {
    const Impl::Piece &p =
        r.grids[t][spec.splitRank * first.flatRanks + spec.flatRank];
    int64_t size = static_cast<int64_t>(p.entry->end - p.entry->begin);
    if (size == spec.bytes(wholeBytes)) {
      auto bytes = r.data(p);
      if (!bytes.ok())
        return Error{bytes.error()};
      std::memcpy(out, *bytes, static_cast<size_t>(size));
      return Status::success();
    }
  }
  // The wanted split piece: as saved, or cut from the whole tensor.
  std::vector<uint8_t> split;
  if (sameSplit) {
    split.resize(static_cast<size_t>(savedSplit));
    Status s = r.savedSplit(t, spec.splitRank, split.data(), savedSplit);
    if (!s.ok())
      return s;
  } else {
    std::vector<uint8_t> whole(static_cast<size_t>(wholeBytes));
    std::vector<uint8_t> part(static_cast<size_t>(savedSplit));
    for (int64_t s = 0; s < first.splitRanks; ++s) {
      Status st = r.savedSplit(t, s, part.data(), savedSplit);
      if (!st.ok())
        return st;
      if (first.splitRanks > 1)
        copySplitPiece(meta.shape, element, first.dim, first.stripes,
                       first.splitRanks, s, whole.data(), part.data(),
                       /*toPiece=*/false);
      else
        whole = part;
    }
    if (spec.splitRanks > 1) {
      split.resize(static_cast<size_t>(wholeBytes / spec.splitRanks));
      copySplitPiece(meta.shape, element, spec.dim, spec.stripes,
                     spec.splitRanks, spec.splitRank, whole.data(),
                     split.data(), /*toPiece=*/true);
    } else {
      split = std::move(whole);
    }
  }
  if (spec.flatRanks <= 1) {
    std::memcpy(out, split.data(), split.size());
    return Status::success();
  }
  // A flat piece: bytes [q s, (q + 1) s) of the split piece, zero-padded.
  int64_t total = static_cast<int64_t>(split.size());
  int64_t begin = std::min(total, spec.flatRank * spec.flatBytes);
  int64_t end = std::min(total, begin + spec.flatBytes);
  std::memset(out, 0, static_cast<size_t>(spec.flatBytes));
  std::memcpy(out, split.data() + begin, static_cast<size_t>(end - begin));
  return Status::success();
}

Result<CheckpointState> readCheckpointState(const std::string &dir) {
  if (::access((dir + "/weights.safetensors").c_str(), F_OK) == 0) {
    CheckpointState state;
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
  auto opened = CheckpointReader::open(dir);
  if (!opened.ok())
    return Error{opened.error()};
  CheckpointReader reader = opened.take();
  CheckpointState state;
  state.sharded = reader.sharded();
  SafetensorsWriter weights, optimizer;
  for (const SavedTensor &t : reader.tensors()) {
    std::vector<uint8_t> bytes(
        static_cast<size_t>(elementCount(t.shape) * dtypeSize(t.dtype)));
    Status read = reader.read(t.name, PieceSpec{}, bytes.data());
    if (!read.ok())
      return Error{read.error()};
    Status added = (t.kind == "optimizer" ? optimizer : weights)
                       .add(t.name, t.dtype, t.shape, std::move(bytes));
    if (!added.ok())
      return Error{added.error()};
  }
  state.files = reader.files();
  weights.setMetadata("pcc.content", "weights");
  optimizer.setMetadata("pcc.content", "optimizer state");
  auto w = SafetensorsFile::fromBytes(weights.serialize(),
                                      dir + " (weights from its shards)");
  auto o = SafetensorsFile::fromBytes(
      optimizer.serialize(), dir + " (optimizer state from its shards)");
  if (!w.ok() || !o.ok())
    return Error{w.ok() ? o.error() : w.error()};
  state.weights.emplace(w.take());
  state.optimizer.emplace(o.take());
  return state;
}

} // namespace pccrt
