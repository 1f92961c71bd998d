//===- CostModel.h - predicted time of pcc ops ------------------*- C++ -*-===//
//
// One machine model for the planners: the sharding planner prices layouts
// with it and the pipeline cut balances stages with it.
//
//===----------------------------------------------------------------------===//

#ifndef PCC_ANALYSIS_COSTMODEL_H
#define PCC_ANALYSIS_COSTMODEL_H

#include "pcc/Dialect/Pcc/IR/Layout.h"

#include "mlir/IR/Operation.h"

#include <cstdint>

namespace mlir::pcc {

/// The machine plans are costed for. Figures for one H100 SXM node with
/// NVLink; only their ratios steer the searches.
struct CostModel {
  double flopsPerSecond = 400e12;    // dense fp32-with-tensor-core GEMM rate
  double bytesPerSecond = 2.0e12;    // memory bandwidth, for non-GEMM ops
  double linkBytesPerSecond = 150e9; // per-rank collective bandwidth
  double collectiveLatency = 10e-6;  // seconds per collective
  /// How much dearer gathering a split weight of rank >= 2 is than its
  /// collective. The search prices whole weights by memory instead (1);
  /// the training step's other phases, whose weights are decided, keep
  /// them split where the forward phase does (pcc-partition-training).
  double weightGatherFactor = 1;

  /// One core of an x86 server with AVX-512 running OpenBLAS, as CPU ranks
  /// are: SGEMM at about 50 GFLOP/s (measured on the bundled GPT's stages),
  /// a fused elementwise kernel writing about 8 GB/s, and MPI over shared
  /// memory. A byte written costs 6 FLOPs here against the H100's 200, so
  /// the pipeline cut balances CPU stages by their matmuls.
  static CostModel cpuCore() {
    CostModel c;
    c.flopsPerSecond = 50e9;
    c.bytesPerSecond = 50e9;
    c.linkBytesPerSecond = 5e9;
    c.collectiveLatency = 5e-6;
    return c;
  }

  /// Seconds of one op from its CostOpInterface: its FLOPs at the GEMM rate
  /// when it has any, else the bytes it writes at memory bandwidth;
  /// collectives (CollectiveOpInterface) by collectiveSeconds.
  double opSeconds(Operation *op) const;
  /// Seconds of a ring collective among `ranks` ranks on a tensor of
  /// `wholeBytes` (its unsharded size): the latency plus (ranks - 1) /
  /// ranks of the bytes over a link, twice for an all-reduce.
  double collectiveSeconds(CollectiveKind kind, int64_t wholeBytes,
                           int64_t ranks) const;
};

/// FLOPs (2 per multiply-add) of `op` (CostOpInterface::getFlops): a
/// matmul's or convolution's, else 0.
int64_t opFlops(Operation *op);

/// Bytes of a tensor value (sub-byte elements round up).
int64_t tensorBytes(Value v);

} // namespace mlir::pcc

#endif // PCC_ANALYSIS_COSTMODEL_H
