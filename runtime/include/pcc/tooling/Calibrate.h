//===- Calibrate.h - measure a machine for the plan search ------*- C++ -*-===//
//
// `pcc calibrate` (through `pcc-run --calibrate FILE`): times the kernels
// model libraries call and the collectives their ranks run, on this
// machine's CPU or GPUs, and writes the machine file `pcc plan --machine`
// reads (the keys of pcc/Analysis/Machine.h):
//   - products (fp32, and bf16 with fp32 accumulation) over sizes, alone on
//     one device: the reached rate by FLOPs per call (`products`), the
//     largest as fp32_flops / bf16_flops;
//   - CPU ranks outnumbering or sharing cores: the same product on every
//     rank at once, whose rate against one rank's alone gives the cores the
//     ranks really share (`cores`);
//   - the bytes per second a large device copy moves (`memory_bandwidth`)
//     and what a tiny one costs (`kernel_seconds`);
//   - with several ranks, an all-reduce over all of them from 4 bytes to
//     64 MiB (MPI on CPU ranks, NCCL on GPUs): latency and bus bandwidth
//     (`intra_latency`, `intra_bandwidth`); the latency is the larger of
//     the back-to-back one and that of a 4-byte all-reduce between small
//     products (what a step's collectives see).
// What it cannot measure (published peaks, memory per device, the links
// between nodes) comes from the preset named as `base`.
//
//===----------------------------------------------------------------------===//

#ifndef PCC_TOOLING_CALIBRATE_H
#define PCC_TOOLING_CALIBRATE_H

#include <string>
#include <vector>

namespace pccrun {

struct CalibrateOptions {
  /// The machine file to write.
  std::string output;
  /// The preset the file starts from ("cpu", "h100", "h200"; empty: cpu on
  /// CPU ranks, h100 on GPUs).
  std::string base;
  std::string device = "cpu", hostfile;
  /// Ranks (0 or 1: one, no collectives measured).
  int ranks = 0;
  /// Fewer sizes and repetitions (tests).
  bool quick = false;
  double collectiveTimeout = 300;
  /// The arguments each rank mpirun starts gets.
  std::vector<std::string> rankArgs;
};

/// Measures and writes the machine file; the exit status.
int runCalibration(const CalibrateOptions &options);

} // namespace pccrun

#endif // PCC_TOOLING_CALIBRATE_H
