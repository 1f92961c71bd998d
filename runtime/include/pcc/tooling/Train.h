//===- Train.h - pcc-run's training mode ------------------------*- C++ -*-===//

#ifndef PCC_TOOLING_TRAIN_H
#define PCC_TOOLING_TRAIN_H

#include "pcc/runtime/Communicator.h"
#include "pcc/runtime/Device.h"
#include "pcc/runtime/ModelLibrary.h"
#include "pcc/runtime/Trainer.h"

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace pccrt {

struct TrainOptions {
  int64_t steps = 0;
  std::vector<std::string> inputs;
  std::string labels;
  std::string data; // --data tokens.bin
  std::string dataDtype = "uint16";
  int64_t seq = 0; // --seq
  Hyperparameters hyper;
  bool lrGiven = false, weightDecayGiven = false;
  int64_t warmup = 0;
  std::string schedule = "constant";
  double minLr = 0; // where cosine and linear schedules end
  std::string lossLog, lossSvg, saveDir, resume;
  /// Pipelined: the last step's timeline (pcc-run --trace, --trace-svg).
  std::string trace, traceSvg;
  /// --weights: the initial weights (default: the file beside the library).
  std::string weights;
  /// --profile: time every op of the steps after the first (Profile.h);
  /// --profile-trace: the last step's ops as a Chrome trace.
  bool profile = false;
  std::string profileTrace;
  int64_t saveEvery = 0;
  /// --save-sharded: every rank writes its own pieces (Checkpoint.h).
  bool saveSharded = false;
  std::optional<uint64_t> shuffle; // --shuffle SEED
  std::optional<uint64_t> seed;    // --seed N (dropout)
  int64_t logEvery = 1;
};

/// Parses training option `arg` at argv[i] (advancing i past its value);
/// returns false when `arg` is not a training option. `value` fetches the
/// next argument, dying with a message when it is missing.
bool parseTrainOption(const std::string &arg, TrainOptions &o,
                      const std::function<std::string()> &value);

/// Where this process trains: one device, or one rank of a data-parallel
/// job.
struct TrainRanks {
  /// The library's communicators, one per mesh axis (null: one rank).
  const pcc_comm *comms = nullptr;
  /// The dp axis's group, for the loss and the label count (null: one rank).
  Communicator *dataParallel = nullptr;
  /// Rank 0 prints, logs and writes checkpoints.
  bool leader = true;
  /// This process's rank in the job, and the job (null: one process).
  int64_t worldRank = 0;
  Communicator *world = nullptr;
  /// A pipelined library: the pp group and this process's place on it.
  Communicator *pipeline = nullptr;
  int32_t pipelineRank = -1;
  /// The engine of the mesh's groups ("mpi", "nccl", "mpi, staged"), for
  /// the start line (null: one rank).
  const char *engine = nullptr;
};

/// Trains `library` on `device` as `o` says; returns the exit status.
int runTraining(const TrainOptions &o, const ModelLibrary &library,
                Device &device, const std::string &libraryPath,
                const TrainRanks &ranks = {});

} // namespace pccrt

#endif // PCC_TOOLING_TRAIN_H
