//===- Machine.h - the machine a plan is searched for -----------*- C++ -*-===//
//
// What the automatic planner (pcc --auto, pcc plan) prices a plan with: one
// device's product rate per precision, its memory and memory bandwidth,
// and the collectives' bandwidth and latency within a node and between
// nodes. Presets for this project's machine kinds (cpu, h100, h200), or a
// JSON file that `pcc calibrate` writes or a user edits.
//
//===----------------------------------------------------------------------===//

#ifndef PCC_ANALYSIS_MACHINE_H
#define PCC_ANALYSIS_MACHINE_H

#include "llvm/ADT/StringRef.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace mlir::pcc {

struct Machine {
  std::string name = "custom";
  /// Devices (ranks) per node: tensor parallelism stays within one, and a
  /// collective whose group spans nodes runs at the inter-node rate.
  int64_t devicesPerNode = 8;
  /// Memory of one device, and what its runtime takes beyond pcc's pools
  /// (CUDA context, NCCL buffers, cuBLAS workspace; 0 on CPU ranks, whose
  /// measured high-water mark counts pcc's pools alone).
  int64_t memoryBytes = 0, reservedBytes = 0;
  /// Product (matmul, attention) rates reached, FLOP/s, per precision, and
  /// the published dense peaks MFU is reported against.
  double fp32Flops = 0, bf16Flops = 0, fp32Peak = 0, bf16Peak = 0;
  /// Bytes per second one device's elementwise kernels move (reads and
  /// writes), and the seconds each kernel costs beyond its bytes.
  double memoryBandwidth = 0, kernelSeconds = 0;
  /// Per-rank bus bandwidth (bytes/s) and latency (s) of a collective
  /// within a node and across nodes.
  double intraBandwidth = 0, intraLatency = 0;
  double interBandwidth = 0, interLatency = 0;
  /// Measured latency of a collective between kernels by group size
  /// (`pcc calibrate -n N`: groups of 2, 4, ... and N, every rank in a
  /// group at once, as a plan's tp or dp groups run); empty: intraLatency
  /// for every group.
  struct GroupLatency {
    int64_t ranks = 0;
    double seconds = 0;
  };
  std::vector<GroupLatency> intraLatencies;
  /// CPU ranks: the cores all the ranks of one node share, in a core's
  /// worth of the rates above (0: each device has its own). `pcc
  /// calibrate -n N` measures it with N ranks computing at once (4 ranks
  /// on 2 cores reach about 1.4 cores' worth: they thrash each other's
  /// caches), so it holds for plans over N ranks.
  double cores = 0;
  /// Measured product rates by size (`pcc calibrate`): a product of
  /// `flops` per call reaches the rate interpolated (in log-log) between
  /// the two sizes around it, the end's beyond; empty: the rates above.
  struct ProductRate {
    double flops = 0, fp32 = 0, bf16 = 0;
  };
  std::vector<ProductRate> products;
  /// Measured fused-attention rates (`pcc calibrate`), FLOPs counted as
  /// pcc.attention's and pcc.attention_grad's (every key, masked or not),
  /// by head width and sequence length; empty: priced as products.
  struct AttentionRate {
    double headDim = 0, seq = 0;
    double fp32 = 0, bf16 = 0, gradFp32 = 0, gradBf16 = 0;
  };
  std::vector<AttentionRate> attention;
  /// Whether gradient collectives overlap the backward pass (NCCL on its
  /// own stream does; MPI over shared memory moves data only in its
  /// calls).
  bool overlapsCollectives = false;

  double productFlops(bool bf16) const { return bf16 ? bf16Flops : fp32Flops; }
  /// The latency of a collective over `ranks` ranks within a node: the
  /// measured table's, interpolated in log2 of the ranks between the sizes
  /// around it (the end's beyond), else intraLatency.
  double intraLatencyFor(int64_t ranks) const;
  /// The rate a product of `flopsPerCall` reaches (the table's, else the
  /// flat rate).
  double productFlops(bool bf16, double flopsPerCall) const;
  double peakFlops(bool bf16) const { return bf16 ? bf16Peak : fp32Peak; }
  /// The rate of a fused attention (or its gradient) of this head width
  /// over `seq` keys: the table's nearest width, interpolated in log-log
  /// between the lengths around `seq` (the end's beyond); 0 without a
  /// measured rate (the caller prices it as a product).
  double attentionFlops(bool bf16, bool grad, double headDim,
                        double seq) const;

  /// The presets: "cpu" (one core of this project's AVX-512/AMX machine
  /// per rank, MPI over shared memory), "h100" (H100 SXM 80 GB, NVLink,
  /// 400 Gb/s InfiniBand per GPU), "h200" (its 141 GB, 4.8 TB/s sibling).
  static std::optional<Machine> preset(llvm::StringRef name);
  /// The preset names, comma-separated.
  static const char *presetNames();

  /// A preset's name or a JSON file's path; the message of what is wrong
  /// otherwise (an unknown key, a value that is not a positive number).
  static std::optional<Machine> load(llvm::StringRef nameOrPath,
                                     std::string &error);
  /// The machine as the JSON `load` reads.
  std::string toJson() const;
  /// What is missing or not positive, or "".
  std::string verify() const;
};

} // namespace mlir::pcc

#endif // PCC_ANALYSIS_MACHINE_H
