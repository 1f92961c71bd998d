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
#include <memory>
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
/// and checksum; without `verifyChecksums`, the safetensors files' sizes
/// only (a CheckpointReader checks each one it reads, which spares a
/// resuming rank reading every rank's shards); the message names the file
/// at fault.
Result<std::string> openCheckpoint(const std::string &path,
                                   bool verifyChecksums = true);

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
/// tensors, for the offline tools: its weights and optimizer files, or its
/// shards put together (every piece of every tensor must be there; the
/// message names the missing one).
struct CheckpointState {
  std::optional<SafetensorsFile> weights, optimizer;
  bool sharded = false;
  int64_t files = 0; // the files the state was read from
};
Result<CheckpointState> readCheckpointState(const std::string &dir);

/// The metadata key of a shard file's piece table.
inline constexpr const char *kPiecesKey = "pcc.pieces";

/// A tensor as it was saved: its name, "weight" or "optimizer", dtype and
/// whole shape.
struct SavedTensor {
  std::string name, kind;
  DType dtype;
  std::vector<int64_t> shape;
};

/// The piece of a tensor a rank holds (pcc_weight_shard's terms): split
/// piece `splitRank` of `splitRanks` along `dim` in `stripes` stripes
/// (splitRanks 1: the whole tensor), and of that, flat piece `flatRank` of
/// `flatRanks`, `flatBytes` long and zero-padded (flatRanks 1: all of it).
struct PieceSpec {
  int64_t splitRanks = 1, splitRank = 0, dim = 0, stripes = 1;
  int64_t flatRanks = 1, flatRank = 0, flatBytes = 0;
  /// The bytes of the piece of a tensor of `wholeBytes`.
  int64_t bytes(int64_t wholeBytes) const {
    return flatRanks > 1 ? flatBytes : wholeBytes / splitRanks;
  }
};

/// A checkpoint (or one safetensors file of weights) read piece by piece.
/// Opening reads the files' headers and piece tables only. A piece in the
/// layout it was saved in comes straight from the file that holds it; a
/// different split is put together from the saved pieces first. Each file
/// is checked against the manifest's checksum the first time a piece is
/// read from it, so a resuming rank reads, and checks, only the files that
/// hold its pieces.
class CheckpointReader {
public:
  /// Checkpoint `dir`, as openCheckpoint returns it.
  static Result<CheckpointReader> open(const std::string &dir);
  /// One safetensors file of whole tensors of `kind` (a library's initial
  /// weights), checked as it opens.
  static Result<CheckpointReader> fromFile(const std::string &path,
                                           const std::string &kind);

  CheckpointReader(CheckpointReader &&) noexcept;
  CheckpointReader &operator=(CheckpointReader &&) noexcept;
  ~CheckpointReader();

  const std::vector<SavedTensor> &tensors() const;
  const SavedTensor *find(const std::string &name) const;
  /// Writes piece `spec` of tensor `name` (spec.bytes() of it) to `out`.
  Status read(const std::string &name, const PieceSpec &spec, uint8_t *out);

  /// Where the state came from, for messages: the directory or file.
  const std::string &source() const;
  bool sharded() const;
  /// The data files, and those read from so far.
  int64_t files() const;
  int64_t filesRead() const;

private:
  CheckpointReader();
  struct Impl;
  std::unique_ptr<Impl> impl;
};

} // namespace pccrt

#endif // PCC_RUNTIME_CHECKPOINT_H
