//===- Checkpoint.h - training checkpoints on disk --------------*- C++ -*-===//
//
// A checkpoint is a directory `<save-dir>/step-<N>` holding
//   weights.safetensors    the weights, named after the ONNX initializers
//   optimizer.safetensors  optimizer state (`<weight>@exp_avg`, ...)
//   trainer.json           step, data position, seeds, run settings
//   MANIFEST.json          size and FNV-1a 64 checksum of each file above
// and `<save-dir>/LATEST` names the newest complete one. A save writes into
// a temporary directory, syncs every file, writes the manifest last,
// renames the directory into place and then replaces LATEST by rename: a
// process killed at any moment leaves the previous checkpoint loadable.
//
//===----------------------------------------------------------------------===//

#ifndef PCC_RUNTIME_CHECKPOINT_H
#define PCC_RUNTIME_CHECKPOINT_H

#include "pcc/runtime/Result.h"
#include "pcc/runtime/Safetensors.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace pccrt {

/// Writes checkpoint `step` under `saveDir` (created if missing): each
/// safetensors file by name, then `trainerJson` as trainer.json, the
/// manifest, and LATEST. Returns the checkpoint's directory.
/// `crashBeforeManifest` kills the process with SIGKILL after the data
/// files are written (fault injection for the tests).
Result<std::string>
writeCheckpoint(const std::string &saveDir, int64_t step,
                const std::vector<std::pair<std::string, const SafetensorsWriter *>>
                    &files,
                const std::string &trainerJson, bool crashBeforeManifest = false);

/// The checkpoint directory `path` names: a save directory (its LATEST) or
/// a step directory. Checks the manifest: every file present with its size
/// and checksum; the message names the file at fault.
Result<std::string> openCheckpoint(const std::string &path);

/// The contents of a small file (trainer.json).
Result<std::string> readTextFile(const std::string &path);

} // namespace pccrt

#endif // PCC_RUNTIME_CHECKPOINT_H
