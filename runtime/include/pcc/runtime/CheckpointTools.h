//===- CheckpointTools.h - pcc ckpt inspect, verify, export -----*- C++ -*-===//

#ifndef PCC_RUNTIME_CHECKPOINTTOOLS_H
#define PCC_RUNTIME_CHECKPOINTTOOLS_H

#include "pcc/runtime/Result.h"

#include <cstddef>
#include <string>

namespace pccrt {

/// Prints a checkpoint directory's step, the run's settings, its files and
/// every tensor (dtype, shape, min, max, mean). The exit status.
int inspectCheckpoint(const std::string &dir);

/// Checks the manifest's checksums, that every tensor is finite and that
/// each optimizer tensor matches its weight's shape; 1 (naming what is
/// wrong) when not.
int verifyCheckpoint(const std::string &dir);

/// Writes the checkpoint's weights (put together, if it was saved sharded)
/// as one safetensors file, through a temporary file and a rename: a failed
/// write leaves nothing behind. The number of weights.
Result<size_t> writeCheckpointWeights(const std::string &dir,
                                      const std::string &output);

/// `pcc ckpt export CHECKPOINT -o weights.safetensors`: the same, reported
/// on standard error. The exit status.
int exportCheckpointWeights(const std::string &dir, const std::string &output);

} // namespace pccrt

#endif // PCC_RUNTIME_CHECKPOINTTOOLS_H
