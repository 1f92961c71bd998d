//===- Checkpoint.cpp - training checkpoints on disk ----------------------===//

#include "pcc/runtime/Checkpoint.h"

#include <nlohmann/json.hpp>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
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
  auto record = [&](const std::string &file) -> Status {
    std::string path = temp + "/" + file;
    Status synced = syncPath(path);
    if (!synced.ok())
      return synced;
    auto d = digest(path);
    if (!d.ok())
      return Error{d.error()};
    manifest["files"][file] = {{"bytes", d->first}, {"fnv1a64", hex(d->second)}};
    return Status::success();
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
  written = writeText(temp + "/MANIFEST.json", manifest.dump(2) + "\n");
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

} // namespace pccrt
