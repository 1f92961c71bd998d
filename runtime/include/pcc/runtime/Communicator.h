//===- Communicator.h - collectives between ranks -----------------*- C++
//-*-===//
//
// One interface, three engines: a world of one (no library needed), MPI
// for CPU ranks (libpcc_runtime_mpi.so) and NCCL for GPU ranks (in
// libpcc_runtime_cuda.so), each loaded on demand; GPU ranks sharing one
// GPU stage their buffers through host memory over MPI (staged()).
// Buffers live where the engine works: host memory for MPI, the device's
// memory for NCCL (whose collectives run on the device's stream and
// complete by wait()).
//
// Every failure names the rank, the group, the rank's mesh coordinates (when
// set) and the collective:
//   rank 1 of 2 in 'tp' (mpi) at mesh [dp=0, pp=0, tp=1]: all_reduce of
//   4096 x F32: MPI_Allreduce: ...
//
//===----------------------------------------------------------------------===//

#ifndef PCC_RUNTIME_COMMUNICATOR_H
#define PCC_RUNTIME_COMMUNICATOR_H

#include "pcc/runtime/DType.h"
#include "pcc/runtime/Engines.h"
#include "pcc/runtime/ModelAbi.h"
#include "pcc/runtime/Result.h"

#include <cstdint>
#include <memory>
#include <string>

namespace pccrt {

class Device;

enum class ReduceOp { Sum = PCC_OP_SUM, Max = PCC_OP_MAX, Min = PCC_OP_MIN };

class Communicator {
public:
  virtual ~Communicator() = default;

  /// A world of one rank: collectives copy, point-to-point fails.
  static std::unique_ptr<Communicator> self();
  /// This process's MPI job (initialises MPI once).
  static Result<std::unique_ptr<Communicator>> mpiWorld();
  /// NCCL over the ranks of `bootstrap` (which carries the unique id from
  /// rank 0 to the others) on a CUDA device.
  static Result<std::unique_ptr<Communicator>> nccl(Communicator &bootstrap,
                                                    Device &device);
  /// The collectives and transfers of `host` (an MPI group) for buffers in
  /// `device`'s memory, staged through host memory: several ranks sharing
  /// one GPU, where NCCL wants one GPU per rank. `host` outlives the result.
  static std::unique_ptr<Communicator> staged(Communicator &host,
                                              Device &device);
  /// Whether mpirun, srun or another MPI launcher started this process.
  static bool launchedByMpi();
  /// The watchdog: when a collective or transfer of an MPI or NCCL group in
  /// this process has waited more than `seconds` (a peer stalled or died),
  /// a thread prints which one (rank, mesh coordinates, group, collective,
  /// its sequence number in the group, count and type) to stderr and ends
  /// this process with status 3, and mpirun then ends the job. 0 (the
  /// default) watches nothing.
  static void setCollectiveTimeout(double seconds);

  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// "self", "mpi" or "nccl".
  virtual const char *engine() const = 0;
  /// The group's name in messages ("world", "tp", ...).
  const std::string &name() const { return groupName; }
  void setName(std::string name) { groupName = std::move(name); }
  /// Where this rank sits in the device mesh, for messages ("dp=0, pp=1,
  /// tp=3"); empty when the run has no mesh.
  void setMeshCoordinates(std::string coords) {
    meshCoords = std::move(coords);
  }
  /// What the next collective computes (the ONNX node a model library's
  /// collective belongs to); messages name it. Null or empty: nothing.
  void setLabel(const char *text) { label = text ? text : ""; }

  /// send == recv is in place. Counts are elements of `type`; gathers and
  /// reduce-scatters take the count per rank.
  virtual Status allReduce(const void *send, void *recv, int64_t count,
                           DType type, ReduceOp op) = 0;
  virtual Status allGather(const void *send, void *recv, int64_t countPerRank,
                           DType type) = 0;
  /// An in-place sum that may still run when the call returns (a gradient
  /// bucket); waitCollectives completes every one started, and
  /// progressCollectives lets them advance. By default the sum is done
  /// before the call returns.
  virtual Status allReduceStart(void *buffer, int64_t count, DType type) {
    return allReduce(buffer, buffer, count, type, ReduceOp::Sum);
  }
  virtual Status waitCollectives() { return Status::success(); }
  virtual void progressCollectives() {}
  virtual Status reduceScatter(const void *send, void *recv,
                               int64_t countPerRank, DType type,
                               ReduceOp op) = 0;
  /// A sum of `send` ([size, countPerRank]) whose slice for this rank goes
  /// to `recv` and that may still run when the call returns (ZeRO's
  /// gradient buckets), completed by waitCollectives. In place when `recv`
  /// is this rank's slice of `send`, as ncclReduceScatter's in-place form.
  /// By default the sum is done before the call returns.
  virtual Status reduceScatterStart(const void *send, void *recv,
                                    int64_t countPerRank, DType type);
  /// A gather of every rank's `send` into `recv` ([size, countPerRank])
  /// that may still run when the call returns (ZeRO 3's prefetch). By
  /// default it is done before the call returns.
  virtual Status allGatherStart(const void *send, void *recv,
                                int64_t countPerRank, DType type) {
    return allGather(send, recv, countPerRank, type);
  }
  /// The started collectives are numbered 1, 2, ... in the order they
  /// start; this is the latest one's number (0: none, or every start
  /// completed before it returned).
  virtual int64_t startedCollectives() const { return 0; }
  /// Completes the started collectives numbered up to `ticket`; later ones
  /// may still run.
  virtual Status waitCollectivesThrough(int64_t ticket) {
    (void)ticket;
    return Status::success();
  }
  virtual Status broadcast(void *buffer, int64_t count, DType type,
                           int root) = 0;
  virtual Status send(const void *buffer, int64_t count, DType type,
                      int peer) = 0;
  virtual Status recv(void *buffer, int64_t count, DType type, int peer) = 0;
  /// A send that may return before the peer has the data (MPI_Isend); the
  /// buffer stays untouched until completeSends(). Sends and receives
  /// between two ranks match in the order they are issued. Engines without
  /// non-blocking sends send at once.
  virtual Status sendAsync(const void *buffer, int64_t count, DType type,
                           int peer) {
    return send(buffer, count, type, peer);
  }
  /// Completes every sendAsync issued so far.
  virtual Status completeSends() { return Status::success(); }
  /// A receive that may still run when the call returns (MPI_Irecv; NCCL:
  /// a receive in the current group): a pipeline's receive posted a
  /// compute early. Posted receives are numbered 1, 2, ... in the order
  /// they are posted; waitReceivesThrough(n) completes 1 to n, after which
  /// their buffers hold the data and compute issued later reads it. By
  /// default the receive is done before the call returns.
  virtual Status postRecv(void *buffer, int64_t count, DType type, int peer) {
    return recv(buffer, count, type, peer);
  }
  virtual int64_t postedReceives() const { return 0; }
  virtual Status waitReceivesThrough(int64_t ticket) {
    (void)ticket;
    return Status::success();
  }
  /// Sends and receives issued between these two progress together (NCCL
  /// groups), so that a send that waits for its receive cannot hold up a
  /// receive of the same group. Issue a group's sends before its receives:
  /// other engines receive at once, blocking. Once beginGroup succeeded,
  /// call endGroup on every path, errors included: an open NCCL group
  /// swallows every later NCCL call of the thread.
  virtual Status beginGroup() { return Status::success(); }
  virtual Status endGroup() { return Status::success(); }
  /// Moves every later call of this group (meant for its sends and
  /// receives; collectives would run unordered with compute) to a queue of
  /// its own so they overlap the device's compute (NCCL: a second CUDA
  /// stream), ordered with it only by the two fences below. Engines whose calls
  /// complete on return need no queue, and their fences do nothing.
  virtual Status separateTransfers() { return Status::success(); }
  /// Undoes separateTransfers: compute issued from now on waits for the
  /// transfers issued so far, and later calls (a step's collectives) run on
  /// the device's queue again, ordered with compute.
  virtual Status joinTransfers() { return Status::success(); }
  /// Transfers issued from now on wait for the compute issued so far.
  virtual Status transfersAfterCompute() { return Status::success(); }
  /// Compute issued from now on waits for the transfers issued so far.
  virtual Status computeAfterTransfers() { return Status::success(); }
  /// Returns once every rank of the group has called it.
  virtual Status barrier();
  /// Ends this process and, for MPI, the whole job: a rank that fails
  /// while its peers wait in a receive or a barrier must not leave them
  /// waiting (exit() would wait for them in MPI_Finalize).
  [[noreturn]] virtual void abortJob(int code);
  /// Completes the collectives issued so far (NCCL: waits for the stream,
  /// aborting after `timeoutMs` when a peer is gone; others: no-op).
  virtual Status wait(int64_t timeoutMs);
  /// The ranks with the same color, ordered by key, as a new group.
  virtual Result<std::unique_ptr<Communicator>> split(int color, int key) = 0;

protected:
  /// "rank R of N in 'name' (engine) at mesh [coords]: <collective> of
  /// <count> x <type>: why"
  Error failure(const std::string &collective, int64_t count, DType type,
                const std::string &why) const;

private:
  std::string groupName = "world";
  std::string meshCoords;
  const char *label = "";
};

/// A communicator as the model ABI's table of collectives (pcc_comm), which
/// a partitioned model library calls. Sums only: the partitioner's
/// collectives reduce partial sums.
class CommBinding {
public:
  explicit CommBinding(Communicator &comm);
  CommBinding(const CommBinding &) = delete;
  CommBinding &operator=(const CommBinding &) = delete;
  const pcc_comm &table() const { return abi; }

  /// The bytes the library's collectives have moved through this group, in
  /// the ZeRO paper's units: an all-reduce of B bytes counts 2B (a
  /// reduce-scatter and an all-gather), an all-gather or a reduce-scatter
  /// whose whole tensor has B bytes counts B. A rank sends (n - 1) / n of
  /// that over a ring.
  struct Traffic {
    int64_t allReduce = 0, allGather = 0, reduceScatter = 0, calls = 0;
    /// Of the calls, those started to complete later (gradient buckets),
    /// and of those the gathers (ZeRO 3's prefetch).
    int64_t started = 0, startedGathers = 0;
    /// Seconds the calls kept this rank waiting: blocking collectives
    /// whole, started ones in their start, progress and wait calls only.
    double seconds = 0;
    int64_t total() const { return allReduce + allGather + reduceScatter; }
  };
  const Traffic &traffic() const { return moved; }

private:
  static int allReduce(void *group, const void *send, void *recv, int64_t count,
                       int32_t dtype);
  static int allGather(void *group, const void *send, void *recv, int64_t count,
                       int32_t dtype);
  static int reduceScatter(void *group, const void *send, void *recv,
                           int64_t count, int32_t dtype);
  static const char *lastError(void *group);
  static void setLabel(void *group, const char *label);
  static int allReduceStart(void *group, void *buffer, int64_t count,
                            int32_t dtype);
  static int reduceScatterStart(void *group, const void *send, void *recv,
                                int64_t count, int32_t dtype);
  static int allGatherStart(void *group, const void *send, void *recv,
                            int64_t count, int32_t dtype);
  static int64_t started(void *group);
  static int waitThrough(void *group, int64_t ticket);
  static int waitAll(void *group);
  static void progress(void *group);
  int check(Status status);

  Communicator *comm;
  std::string error;
  pcc_comm abi;
  Traffic moved;
};

} // namespace pccrt

#endif // PCC_RUNTIME_COMMUNICATOR_H
