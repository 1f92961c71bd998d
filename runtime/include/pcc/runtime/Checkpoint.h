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
// A sharded checkpoint (pcc-run --save-sharded) holds, instead of the two
// safetensors files, `rank-<R>.safetensors` from each rank that holds a
// piece of the state no other rank holds: the pieces as they lie on the
// rank, and in the file's metadata ("pcc.pieces") each piece's tensor, its
// whole shape, and which slice it is (a tensor-parallel split, a ZeRO flat
// piece, or both). Every rank writes its file; after a barrier rank 0
// writes trainer.json and the manifest over all files, last.
//
//===----------------------------------------------------------------------===//

#ifndef PCC_RUNTIME_CHECKPOINT_H
#define PCC_RUNTIME_CHECKPOINT_H

#include "pcc/runtime/Result.h"
#include "pcc/runtime/Safetensors.h"

#include <cstdint>
#include <functional>
#include <optional>
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

/// Writes a sharded checkpoint: `shard` as this rank's file (none when
/// null), and on rank 0 trainer.json, the manifest and LATEST. `barrier`
/// returns once every rank of the job has called it. Returns the
/// checkpoint's directory.
Result<std::string>
writeShardedCheckpoint(const std::string &saveDir, int64_t step, int rank,
                       const SafetensorsWriter *shard,
                       const std::string &trainerJson,
                       const std::function<Status()> &barrier);

/// The state of checkpoint `dir` (as openCheckpoint returns it) as whole
/// tensors: its weights and optimizer files, or its shards put together
/// (every piece of every tensor must be there; the message names the
/// missing one). With `wanted`, a sharded checkpoint's tensors it rejects
/// (another pipeline rank's state) are not put together.
struct CheckpointState {
  std::optional<SafetensorsFile> weights, optimizer;
  bool sharded = false;
  int64_t files = 0;     // the files the state was read from
  int64_t assembled = 0; // sharded: the tensors put together
  int64_t tensors = 0;   // sharded: the tensors the shards hold
};
Result<CheckpointState> readCheckpointState(
    const std::string &dir,
    const std::function<bool(const std::string &)> &wanted = {});

/// The metadata key of a shard file's piece table.
inline constexpr const char *kPiecesKey = "pcc.pieces";

} // namespace pccrt

#endif // PCC_RUNTIME_CHECKPOINT_H
