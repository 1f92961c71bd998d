//===- Run.h - what pcc-run does with a model library -----------*- C++ -*-===//
//
// pcc-run parses its flags into RunOptions and calls one of these: run an
// inference library (on one device, over the ranks of a partitioned mesh,
// or as a pipeline), train a training library, or describe it.
//
//===----------------------------------------------------------------------===//

#ifndef PCC_TOOLING_RUN_H
#define PCC_TOOLING_RUN_H

#include "pcc/runtime/DType.h"
#include "pcc/runtime/ModelLibrary.h"
#include "pcc/tooling/Job.h"
#include "pcc/tooling/Train.h"

#include <cstdint>
#include <string>
#include <vector>

namespace pccrun {

/// pcc-run's settings (its flags).
struct RunOptions {
  std::string library, weights, device = "cpu", hostfile;
  std::string trace, traceSvg;
  /// -n: ranks to run (0: not given).
  int ranks = 0;
  /// Every argument except -n and --hostfile, for the ranks mpirun starts.
  std::vector<std::string> rankArgs;
  std::vector<std::string> inputs, outputs, expects;
  double rtol = 1e-4, atol = 1e-5;
  int bench = 0;
  bool info = false;
  bool listDevices = false;
  bool cudaGraph = false;
  /// --profile, --profile-trace FILE (Profile.h).
  bool profile = false;
  std::string profileTrace;
  double collectiveTimeout = 300;
  /// --gpu-collectives auto|nccl|staged (Job.h).
  GpuCollectives gpuCollectives = GpuCollectives::Auto;
  /// --calibrate FILE [--calibrate-base NAME] [--calibrate-quick]
  /// (Calibrate.h; what `pcc calibrate` runs).
  std::string calibrate, calibrateBase;
  bool calibrateQuick = false;
  /// Training libraries (pcc --train).
  pccrt::TrainOptions train;
};

/// Prints the CPU (with its BLAS and threads) and every usable CUDA device,
/// or why there is none.
int listDevices();

/// --info: the library's signature, mesh and pipeline.
int printInfo(const RunOptions &opts, const pccrt::ModelLibrary &library);

/// Runs an inference library: checks the inputs, starts or joins the ranks
/// of its mesh, runs it (as a pipeline where it is one), writes, prints and
/// compares the outputs, and benchmarks. The exit status.
int runInference(RunOptions &opts, const pccrt::ModelLibrary &library);

/// Trains a training library on this rank of its mesh (starting the ranks
/// under mpirun when asked to). The exit status.
int runTrainingJob(RunOptions &opts, const pccrt::ModelLibrary &library);

} // namespace pccrun

#endif // PCC_TOOLING_RUN_H
