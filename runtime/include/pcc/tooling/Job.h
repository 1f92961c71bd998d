//===- Job.h - one rank of a pcc-run job ------------------------*- C++ -*-===//
//
// What every rank of a pcc-run job shares: how it fails, how the ranks are
// started and joined, and the communicators of the mesh's axes.
//
//===----------------------------------------------------------------------===//

#ifndef PCC_TOOLING_JOB_H
#define PCC_TOOLING_JOB_H

#include "pcc/runtime/Communicator.h"
#include "pcc/runtime/Device.h"
#include "pcc/runtime/ModelAbi.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace pccrun {

using pccrt::CommBinding;
using pccrt::Communicator;

/// Prints "pcc-run: error: ..." (once the rank joined a job, "rank R of N
/// [mesh coordinates]: error: ...") and ends the process, and the whole job
/// once it joined one.
[[noreturn]] void die(const std::string &message);

/// Makes `world` the job a failing rank ends (die), and names the rank in
/// messages, for jobs that join without a mesh (pcc-run --calibrate).
void joinedJob(Communicator &world);

/// Starts `ranks` copies of this program under mpirun, each with
/// `rankArgs`; does not return.
[[noreturn]] void launch(int ranks, const std::string &hostfile,
                         const std::vector<std::string> &rankArgs);

/// Opens `name`; a rank of a job asking for "cuda" gets one of its host's
/// GPUs, round-robin by its local rank.
std::unique_ptr<pccrt::Device> openRankDevice(const std::string &name,
                                              bool rank);

/// The communicators of one rank: the world, and a group per mesh axis
/// bound to the model ABI.
struct Ranks {
  std::unique_ptr<Communicator> world;
  std::vector<std::unique_ptr<Communicator>> groups;
  /// The same groups over MPI, for host-side sums (on GPUs `groups` are
  /// NCCL communicators).
  std::vector<std::unique_ptr<Communicator>> hostGroups;
  std::vector<std::unique_ptr<CommBinding>> bindings;
  std::vector<pcc_comm> tables;
  std::vector<int64_t> coords;
};

/// The world rank at mesh coordinates `coords` (the last axis fastest).
int worldRankAt(const pcc_model_info &info, const std::vector<int64_t> &coords);

/// The mesh coordinates of world rank `rank` (the last axis fastest).
std::vector<int64_t> meshCoordinates(const pcc_model_info &info, int64_t rank);

/// How a GPU job's groups move device buffers (pcc-run --gpu-collectives).
enum class GpuCollectives {
  /// NCCL, unless ranks of one host share a GPU: then staged.
  Auto,
  Nccl,
  /// Through host memory over MPI (several ranks on one GPU; on CPU ranks
  /// the same path with host copies, which tests it without a GPU).
  Staged,
};

/// Joins the MPI job and builds one group per mesh axis: the ranks that
/// differ only in their coordinate on that axis (the last axis varies
/// fastest). A job of another size than the mesh's is an error.
Ranks joinRanks(const pcc_model_info &info, int64_t meshRanks,
                pccrt::Device &device, const std::string &mesh,
                double collectiveTimeout,
                GpuCollectives gpuCollectives = GpuCollectives::Auto);

} // namespace pccrun

#endif // PCC_TOOLING_JOB_H
