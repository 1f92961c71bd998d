//===- Communicator.cpp - self, MPI and NCCL communicators ----------------===//

#include "pcc/runtime/Communicator.h"

#include "pcc/runtime/Device.h"

#include "Loader.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

namespace pccrt {

Status Communicator::wait(int64_t) { return Status::success(); }

void Communicator::abortJob(int code) { std::_Exit(code); }

Status Communicator::reduceScatterStart(const void *send, void *recv,
                                        int64_t countPerRank, DType type) {
  size_t bytes = static_cast<size_t>(countPerRank) * dtypeSize(type);
  const char *base = static_cast<const char *>(send);
  if (static_cast<const char *>(recv) != base + rank() * bytes)
    return reduceScatter(send, recv, countPerRank, type, ReduceOp::Sum);
  // In place: the engines' blocking form wants distinct buffers.
  std::vector<char> copy(base, base + size() * bytes);
  return reduceScatter(copy.data(), recv, countPerRank, type, ReduceOp::Sum);
}

Status Communicator::barrier() {
  if (size() == 1)
    return Status::success();
  return Error{"rank " + std::to_string(rank()) + " of " +
               std::to_string(size()) + " in '" + groupName + "' (" + engine() +
               "): barrier: not offered by this engine"};
}

Error Communicator::failure(const std::string &collective, int64_t count,
                            DType type, const std::string &why) const {
  return Error{"rank " + std::to_string(rank()) + " of " +
               std::to_string(size()) + " in '" + groupName + "' (" + engine() +
               ")" +
               (meshCoords.empty() ? "" : " at mesh [" + meshCoords + "]") +
               ": " + collective + " of " + std::to_string(count) + " x " +
               std::string(dtypeName(type)) +
               (*label ? std::string(" for ") + label : std::string()) +
               ": " + why};
}

bool Communicator::launchedByMpi() {
  for (const char *var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK",
                          "MPI_LOCALNRANKS", "SLURM_NTASKS"})
    if (std::getenv(var))
      return true;
  return false;
}

namespace {

//===----------------------------------------------------------------------===//
// The watchdog
//===----------------------------------------------------------------------===//

/// One thread per process that watches the collective in flight (this
/// process issues them from one thread, so there is at most one).
class Watchdog {
public:
  static Watchdog &get() {
    static Watchdog *w = new Watchdog(); // never destroyed: the thread runs
    return *w;                           // until the process ends
  }
  void setTimeout(double seconds) {
    std::lock_guard<std::mutex> lock(mutex);
    timeout = seconds;
    if (seconds > 0 && !started) {
      started = true;
      std::thread([this] { run(); }).detach();
    }
  }
  bool enabled() {
    std::lock_guard<std::mutex> lock(mutex);
    return timeout > 0;
  }
  void begin(std::string description) {
    std::lock_guard<std::mutex> lock(mutex);
    what = std::move(description);
    since = std::chrono::steady_clock::now();
    active = true;
  }
  void end() {
    std::lock_guard<std::mutex> lock(mutex);
    active = false;
  }

private:
  void run() {
    for (;;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      std::lock_guard<std::mutex> lock(mutex);
      if (!active || timeout <= 0)
        continue;
      double waited = std::chrono::duration<double>(
                          std::chrono::steady_clock::now() - since)
                          .count();
      if (waited <= timeout)
        continue;
      std::fprintf(stderr,
                   "pcc-run: error: %s after %.1f s, longer than the "
                   "collective timeout (--collective-timeout %g): a peer "
                   "rank is stalled or has died; ending the job\n",
                   what.c_str(), waited, timeout);
      std::fflush(stderr);
      // Not exit(): MPI_Finalize would wait for the stalled peer. mpirun
      // ends the other ranks when this one exits without finalising.
      std::_Exit(3);
    }
  }
  std::mutex mutex;
  double timeout = 0;
  bool started = false, active = false;
  std::string what;
  std::chrono::steady_clock::time_point since;
};

//===----------------------------------------------------------------------===//
// A world of one
//===----------------------------------------------------------------------===//

class SelfCommunicator final : public Communicator {
public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const char *engine() const override { return "self"; }
  Status allReduce(const void *send, void *recv, int64_t count, DType type,
                   ReduceOp) override {
    return copy(send, recv, count, type);
  }
  Status allGather(const void *send, void *recv, int64_t count,
                   DType type) override {
    return copy(send, recv, count, type);
  }
  Status reduceScatter(const void *send, void *recv, int64_t count, DType type,
                       ReduceOp) override {
    return copy(send, recv, count, type);
  }
  Status broadcast(void *, int64_t, DType, int root) override {
    if (root != 0)
      return Error{"broadcast from rank " + std::to_string(root) +
                   " in a world of one"};
    return Status::success();
  }
  Status send(const void *, int64_t count, DType type, int peer) override {
    return failure("send", count, type,
                   "no peer " + std::to_string(peer) + " in a world of one");
  }
  Status recv(void *, int64_t count, DType type, int peer) override {
    return failure("recv", count, type,
                   "no peer " + std::to_string(peer) + " in a world of one");
  }
  Result<std::unique_ptr<Communicator>> split(int, int) override {
    return std::unique_ptr<Communicator>(new SelfCommunicator());
  }

private:
  static Status copy(const void *send, void *recv, int64_t count, DType type) {
    if (send != recv)
      std::memmove(recv, send, static_cast<size_t>(count * dtypeSize(type)));
    return Status::success();
  }
};

//===----------------------------------------------------------------------===//
// MPI
//===----------------------------------------------------------------------===//

/// The collectives of an engine whose C API has the shape of Engines.h.
template <typename Api, typename Handle>
class EngineCommunicator : public Communicator {
public:
  EngineCommunicator(Api api, Handle *comm, int rank, int size)
      : api(api), comm(comm), myRank(rank), mySize(size) {}
  ~EngineCommunicator() override { api.free(comm); }
  int rank() const override { return myRank; }
  int size() const override { return mySize; }

  Status allReduce(const void *send, void *recv, int64_t count, DType type,
                   ReduceOp op) override {
    Watched w(*this, "all_reduce", count, type);
    return check(api.allReduce(comm, send, recv, count, int(type), int(op)),
                 "all_reduce", count, type);
  }
  Status allGather(const void *send, void *recv, int64_t count,
                   DType type) override {
    Watched w(*this, "all_gather", count, type);
    return check(api.allGather(comm, send, recv, count, int(type)),
                 "all_gather", count, type);
  }
  Status reduceScatter(const void *send, void *recv, int64_t count, DType type,
                       ReduceOp op) override {
    Watched w(*this, "reduce_scatter", count, type);
    return check(api.reduceScatter(comm, send, recv, count, int(type), int(op)),
                 "reduce_scatter", count, type);
  }
  Status broadcast(void *buffer, int64_t count, DType type, int root) override {
    Watched w(*this, "broadcast", count, type);
    return check(api.broadcast(comm, buffer, count, int(type), root),
                 "broadcast", count, type);
  }
  Status send(const void *buffer, int64_t count, DType type,
              int peer) override {
    std::string what = "send to rank " + std::to_string(peer);
    Watched w(*this, what, count, type);
    return check(api.send(comm, buffer, count, int(type), peer), what, count,
                 type);
  }
  Status recv(void *buffer, int64_t count, DType type, int peer) override {
    std::string what = "recv from rank " + std::to_string(peer);
    Watched w(*this, what, count, type);
    return check(api.recv(comm, buffer, count, int(type), peer), what, count,
                 type);
  }

  /// Started collectives (gradient buckets, ZeRO 3's prefetch), through
  /// the engine's start functions and waitOldest; a wait is watched and
  /// named by what it completes.
  Status allReduceStart(void *buffer, int64_t count, DType type) override {
    noteStart("all_reduce", count, type);
    return check(startSum(buffer, count, int(type)), "all_reduce (started)",
                 count, type);
  }
  Status reduceScatterStart(const void *send, void *recv, int64_t countPerRank,
                            DType type) override {
    noteStart("reduce_scatter", countPerRank * size(), type);
    return check(startScatter(send, recv, countPerRank, int(type)),
                 "reduce_scatter (started)", countPerRank, type);
  }
  Status allGatherStart(const void *send, void *recv, int64_t countPerRank,
                        DType type) override {
    noteStart("all_gather", countPerRank * size(), type);
    return check(startGather(send, recv, countPerRank, int(type)),
                 "all_gather (started)", countPerRank, type);
  }
  /// Posted receives, through the engine's postReceive and waitReceives;
  /// a wait is watched and named by the receive it completes.
  Status postRecv(void *buffer, int64_t count, DType type,
                  int peer) override {
    Status posted = check(postReceive(buffer, count, int(type), peer),
                          "recv from rank " + std::to_string(peer) +
                              " (posted)",
                          count, type);
    // Numbered as the engine numbers it: only once it is posted.
    if (posted.ok()) {
      ++receiveTicket;
      postedFrom.push_back({peer, count, type});
    }
    return posted;
  }
  int64_t postedReceives() const override { return receiveTicket; }
  Status waitReceivesThrough(int64_t through) override {
    through = std::min(through, receiveTicket);
    if (through <= receivesDone)
      return Status::success();
    int64_t n = through - receivesDone;
    const Posted &last = postedFrom[static_cast<size_t>(n - 1)];
    std::string what = "wait for recv from rank " + std::to_string(last.peer) +
                       (n > 1 ? " (and " + std::to_string(n - 1) + " before)"
                              : std::string());
    postedFrom.erase(postedFrom.begin(), postedFrom.begin() + n);
    receivesDone = through;
    Watched w(*this, what, last.count, last.type);
    return check(waitReceives(n), what, last.count, last.type);
  }
  int64_t startedCollectives() const override { return ticket; }
  Status waitCollectives() override { return waitCollectivesThrough(ticket); }
  Status waitCollectivesThrough(int64_t through) override {
    if (through > ticket)
      through = ticket;
    if (through <= completed)
      return Status::success();
    // What the wait completes, for the watchdog and the errors.
    int64_t count = 0;
    const char *kind = nullptr;
    DType type = DType::F32;
    for (int64_t i = completed; i < through; ++i) {
      const Started &s = inFlight[static_cast<size_t>(i - completed)];
      count += s.count;
      type = s.type;
      kind = !kind || std::strcmp(kind, s.kind) == 0 ? s.kind : "collective";
    }
    int64_t n = through - completed;
    std::string what = "wait for " + std::to_string(n) + " started " + kind +
                       "(s)";
    inFlight.erase(inFlight.begin(), inFlight.begin() + n);
    completed = through;
    Watched w(*this, what, count, type);
    return check(waitOldest(n), what, count, type);
  }

protected:
  virtual int startSum(void *buffer, int64_t count, int dtype) = 0;
  virtual int startScatter(const void *send, void *recv, int64_t countPerRank,
                           int dtype) = 0;
  virtual int startGather(const void *send, void *recv, int64_t countPerRank,
                          int dtype) = 0;
  /// Completes the `count` oldest started collectives.
  virtual int waitOldest(int64_t count) = 0;
  virtual int postReceive(void *buffer, int64_t count, int dtype,
                          int peer) = 0;
  /// Completes the `count` oldest posted receives.
  virtual int waitReceives(int64_t count) = 0;
  /// The posted receives not yet waited for: numbers receivesDone + 1 to
  /// receiveTicket.
  struct Posted {
    int peer;
    int64_t count;
    DType type;
  };
  std::vector<Posted> postedFrom;
  int64_t receiveTicket = 0, receivesDone = 0;
  /// The started collectives not yet waited for, oldest first: numbers
  /// completed + 1 to ticket.
  struct Started {
    const char *kind;
    int64_t count;
    DType type;
  };
  void noteStart(const char *kind, int64_t count, DType type) {
    ++ticket;
    inFlight.push_back({kind, count, type});
  }
  std::vector<Started> inFlight;
  int64_t ticket = 0, completed = 0;

  /// Tells the watchdog (when it is on) which call this rank waits in,
  /// numbered by its place among this group's calls.
  class Watched {
  public:
    Watched(EngineCommunicator &c, const std::string &what, int64_t count,
            DType type) {
      int64_t seq = ++c.calls;
      on = Watchdog::get().enabled();
      if (on)
        Watchdog::get().begin(c.failure(what + " #" + std::to_string(seq),
                                        count, type, "still waiting")
                                  .message);
    }
    ~Watched() {
      if (on)
        Watchdog::get().end();
    }

  private:
    bool on = false;
  };
  int64_t calls = 0;

  Status check(int rc, const std::string &what, int64_t count, DType type) {
    if (rc == 0)
      return Status::success();
    return failure(what, count, type, api.lastError());
  }
  /// "rank R of N in 'name' (engine)"
  std::string where() const {
    return "rank " + std::to_string(myRank) + " of " + std::to_string(mySize) +
           " in '" + name() + "' (" + engine() + ")";
  }

  Api api;
  Handle *comm;
  int myRank, mySize;
};

struct MpiApi {
  decltype(&pcc_mpi_last_error) lastError;
  decltype(&pcc_mpi_world) world;
  decltype(&pcc_mpi_free) free;
  decltype(&pcc_mpi_rank) rank;
  decltype(&pcc_mpi_size) size;
  decltype(&pcc_mpi_split) split;
  decltype(&pcc_mpi_all_reduce) allReduce;
  decltype(&pcc_mpi_all_gather) allGather;
  decltype(&pcc_mpi_reduce_scatter) reduceScatter;
  decltype(&pcc_mpi_broadcast) broadcast;
  decltype(&pcc_mpi_send) send;
  decltype(&pcc_mpi_recv) recv;
  decltype(&pcc_mpi_isend) isend;
  decltype(&pcc_mpi_wait_sends) waitSends;
  decltype(&pcc_mpi_irecv) irecv;
  decltype(&pcc_mpi_wait_receives) waitReceives;
  decltype(&pcc_mpi_iall_reduce) iallReduce;
  decltype(&pcc_mpi_ireduce_scatter) ireduceScatter;
  decltype(&pcc_mpi_iall_gather) iallGather;
  decltype(&pcc_mpi_wait_oldest) waitOldest;
  decltype(&pcc_mpi_test_collectives) testCollectives;
  decltype(&pcc_mpi_barrier) barrier;
  decltype(&pcc_mpi_abort) abort;
};

Result<MpiApi> loadMpiApi() {
  auto handle = loadRuntimeLibrary(
      "libpcc_runtime_mpi.so", "PCC_RUNTIME_MPI_LIBRARY",
      "the MPI engine (libpcc_runtime_mpi.so) cannot be loaded; was pcc built "
      "with OpenMPI (libopenmpi-dev)?");
  if (!handle.ok())
    return Error{handle.error()};
  MpiApi api;
  bool ok = bindSymbol(*handle, api.lastError, "pcc_mpi_last_error") &&
            bindSymbol(*handle, api.world, "pcc_mpi_world") &&
            bindSymbol(*handle, api.free, "pcc_mpi_free") &&
            bindSymbol(*handle, api.rank, "pcc_mpi_rank") &&
            bindSymbol(*handle, api.size, "pcc_mpi_size") &&
            bindSymbol(*handle, api.split, "pcc_mpi_split") &&
            bindSymbol(*handle, api.allReduce, "pcc_mpi_all_reduce") &&
            bindSymbol(*handle, api.allGather, "pcc_mpi_all_gather") &&
            bindSymbol(*handle, api.reduceScatter, "pcc_mpi_reduce_scatter") &&
            bindSymbol(*handle, api.broadcast, "pcc_mpi_broadcast") &&
            bindSymbol(*handle, api.send, "pcc_mpi_send") &&
            bindSymbol(*handle, api.recv, "pcc_mpi_recv") &&
            bindSymbol(*handle, api.isend, "pcc_mpi_isend") &&
            bindSymbol(*handle, api.waitSends, "pcc_mpi_wait_sends") &&
            bindSymbol(*handle, api.irecv, "pcc_mpi_irecv") &&
            bindSymbol(*handle, api.waitReceives, "pcc_mpi_wait_receives") &&
            bindSymbol(*handle, api.iallReduce, "pcc_mpi_iall_reduce") &&
            bindSymbol(*handle, api.ireduceScatter,
                       "pcc_mpi_ireduce_scatter") &&
            bindSymbol(*handle, api.iallGather, "pcc_mpi_iall_gather") &&
            bindSymbol(*handle, api.waitOldest, "pcc_mpi_wait_oldest") &&
            bindSymbol(*handle, api.testCollectives,
                       "pcc_mpi_test_collectives") &&
            bindSymbol(*handle, api.barrier, "pcc_mpi_barrier") &&
            bindSymbol(*handle, api.abort, "pcc_mpi_abort");
  if (!ok)
    return Error{"libpcc_runtime_mpi.so lacks the pcc_mpi_* entry points; it "
                 "belongs to another pcc version"};
  return api;
}

class MpiCommunicator final : public EngineCommunicator<MpiApi, pcc_mpi_comm> {
public:
  MpiCommunicator(MpiApi api, pcc_mpi_comm *comm)
      : EngineCommunicator(api, comm, api.rank(comm), api.size(comm)) {}
  const char *engine() const override { return "mpi"; }
  Status sendAsync(const void *buffer, int64_t count, DType type,
                   int peer) override {
    return check(api.isend(comm, buffer, count, int(type), peer),
                 "send to rank " + std::to_string(peer), count, type);
  }
  Status completeSends() override {
    return check(api.waitSends(comm), "completing sends", 0, DType::U8);
  }
  void progressCollectives() override { api.testCollectives(comm); }
  int startSum(void *buffer, int64_t count, int dtype) override {
    return api.iallReduce(comm, buffer, count, dtype);
  }
  int startScatter(const void *send, void *recv, int64_t countPerRank,
                   int dtype) override {
    return api.ireduceScatter(comm, send, recv, countPerRank, dtype);
  }
  int startGather(const void *send, void *recv, int64_t countPerRank,
                  int dtype) override {
    return api.iallGather(comm, send, recv, countPerRank, dtype);
  }
  int waitOldest(int64_t count) override {
    return api.waitOldest(comm, count);
  }
  int postReceive(void *buffer, int64_t count, int dtype, int peer) override {
    return api.irecv(comm, buffer, count, dtype, peer);
  }
  int waitReceives(int64_t count) override {
    return api.waitReceives(comm, count);
  }
  Status barrier() override {
    return check(api.barrier(comm), "barrier", 0, DType::U8);
  }
  [[noreturn]] void abortJob(int code) override {
    api.abort(code);
    std::_Exit(code);
  }
  Result<std::unique_ptr<Communicator>> split(int color, int key) override {
    pcc_mpi_comm *sub = api.split(comm, color, key);
    if (!sub)
      return Error{where() + ": split: " + api.lastError()};
    return std::unique_ptr<Communicator>(new MpiCommunicator(api, sub));
  }
};

//===----------------------------------------------------------------------===//
// NCCL
//===----------------------------------------------------------------------===//

struct NcclApi {
  decltype(&pcc_nccl_last_error) lastError;
  decltype(&pcc_nccl_unique_id_size) uniqueIdSize;
  decltype(&pcc_nccl_get_unique_id) getUniqueId;
  decltype(&pcc_nccl_init) init;
  decltype(&pcc_nccl_free) free;
  decltype(&pcc_nccl_all_reduce) allReduce;
  decltype(&pcc_nccl_all_gather) allGather;
  decltype(&pcc_nccl_reduce_scatter) reduceScatter;
  decltype(&pcc_nccl_broadcast) broadcast;
  decltype(&pcc_nccl_send) send;
  decltype(&pcc_nccl_recv) recv;
  decltype(&pcc_nccl_wait) wait;
  decltype(&pcc_nccl_own_stream) ownStream;
  decltype(&pcc_nccl_after_compute) afterCompute;
  decltype(&pcc_nccl_before_compute) beforeCompute;
  decltype(&pcc_nccl_group_start) groupStart;
  decltype(&pcc_nccl_group_end) groupEnd;
  decltype(&pcc_nccl_all_reduce_start) allReduceStart;
  decltype(&pcc_nccl_reduce_scatter_start) reduceScatterStart;
  decltype(&pcc_nccl_all_gather_start) allGatherStart;
  decltype(&pcc_nccl_wait_oldest) waitOldest;
  decltype(&pcc_nccl_recv_post) recvPost;
  decltype(&pcc_nccl_wait_receives) waitReceives;
  decltype(&pcc_nccl_join_stream) joinStream;
};

Result<NcclApi> loadNcclApi() {
  auto handle = loadRuntimeLibrary(
      "libpcc_runtime_cuda.so", "PCC_RUNTIME_CUDA_LIBRARY",
      "NCCL needs the CUDA backend (libpcc_runtime_cuda.so), which cannot be "
      "loaded:");
  if (!handle.ok())
    return Error{handle.error()};
  NcclApi api;
  bool ok = bindSymbol(*handle, api.lastError, "pcc_nccl_last_error") &&
            bindSymbol(*handle, api.uniqueIdSize, "pcc_nccl_unique_id_size") &&
            bindSymbol(*handle, api.getUniqueId, "pcc_nccl_get_unique_id") &&
            bindSymbol(*handle, api.init, "pcc_nccl_init") &&
            bindSymbol(*handle, api.free, "pcc_nccl_free") &&
            bindSymbol(*handle, api.allReduce, "pcc_nccl_all_reduce") &&
            bindSymbol(*handle, api.allGather, "pcc_nccl_all_gather") &&
            bindSymbol(*handle, api.reduceScatter, "pcc_nccl_reduce_scatter") &&
            bindSymbol(*handle, api.broadcast, "pcc_nccl_broadcast") &&
            bindSymbol(*handle, api.send, "pcc_nccl_send") &&
            bindSymbol(*handle, api.recv, "pcc_nccl_recv") &&
            bindSymbol(*handle, api.wait, "pcc_nccl_wait") &&
            bindSymbol(*handle, api.ownStream, "pcc_nccl_own_stream") &&
            bindSymbol(*handle, api.afterCompute, "pcc_nccl_after_compute") &&
            bindSymbol(*handle, api.beforeCompute, "pcc_nccl_before_compute") &&
            bindSymbol(*handle, api.groupStart, "pcc_nccl_group_start") &&
            bindSymbol(*handle, api.groupEnd, "pcc_nccl_group_end") &&
            bindSymbol(*handle, api.allReduceStart,
                       "pcc_nccl_all_reduce_start") &&
            bindSymbol(*handle, api.reduceScatterStart,
                       "pcc_nccl_reduce_scatter_start") &&
            bindSymbol(*handle, api.allGatherStart,
                       "pcc_nccl_all_gather_start") &&
            bindSymbol(*handle, api.waitOldest, "pcc_nccl_wait_oldest") &&
            bindSymbol(*handle, api.recvPost, "pcc_nccl_recv_post") &&
            bindSymbol(*handle, api.waitReceives, "pcc_nccl_wait_receives") &&
            bindSymbol(*handle, api.joinStream, "pcc_nccl_join_stream");
  if (!ok)
    return Error{"libpcc_runtime_cuda.so has no NCCL engine (pcc was built "
                 "without NCCL, or the library belongs to another pcc "
                 "version)"};
  return api;
}

class NcclCommunicator final
    : public EngineCommunicator<NcclApi, pcc_nccl_comm> {
public:
  using EngineCommunicator::EngineCommunicator;
  const char *engine() const override { return "nccl"; }
  Status wait(int64_t timeoutMs) override {
    if (api.wait(comm, timeoutMs) == 0)
      return Status::success();
    return Error{where() + ": waiting for collectives: " + api.lastError()};
  }
  /// "rank R of N in 'pp' (nccl): what: why"
  Status call(int rc, const std::string &what) {
    if (rc == 0)
      return Status::success();
    return Error{where() + ": " + what + ": " + api.lastError()};
  }
  Status beginGroup() override {
    return call(api.groupStart(comm), "starting a group of transfers");
  }
  Status endGroup() override {
    return call(api.groupEnd(comm), "ending a group of transfers");
  }
  Status separateTransfers() override {
    return call(api.ownStream(comm), "creating the transfer stream");
  }
  /// A gradient bucket's sum on a stream of its own, overlapping the rest
  /// of the backward pass; the wait fences the compute behind it.
  int startSum(void *buffer, int64_t count, int dtype) override {
    return api.allReduceStart(comm, buffer, count, dtype);
  }
  int startScatter(const void *send, void *recv, int64_t countPerRank,
                   int dtype) override {
    return api.reduceScatterStart(comm, send, recv, countPerRank, dtype);
  }
  int startGather(const void *send, void *recv, int64_t countPerRank,
                  int dtype) override {
    return api.allGatherStart(comm, send, recv, countPerRank, dtype);
  }
  int waitOldest(int64_t count) override {
    return api.waitOldest(comm, count, /*timeout_ms=*/600000);
  }
  int postReceive(void *buffer, int64_t count, int dtype, int peer) override {
    return api.recvPost(comm, buffer, count, dtype, peer);
  }
  int waitReceives(int64_t count) override {
    return api.waitReceives(comm, count, /*timeout_ms=*/600000);
  }
  Status joinTransfers() override {
    return call(api.joinStream(comm), "joining the transfer stream");
  }
  Status transfersAfterCompute() override {
    return call(api.afterCompute(comm), "transfers after compute");
  }
  Status computeAfterTransfers() override {
    return call(api.beforeCompute(comm), "compute after transfers");
  }
  Result<std::unique_ptr<Communicator>> split(int, int) override {
    return Error{where() + ": split NCCL groups from their MPI bootstrap group "
                           "(Communicator::nccl on the split MPI group)"};
  }
};

} // namespace

std::unique_ptr<Communicator> Communicator::self() {
  return std::unique_ptr<Communicator>(new SelfCommunicator());
}

Result<std::unique_ptr<Communicator>> Communicator::mpiWorld() {
  auto api = loadMpiApi();
  if (!api.ok())
    return Error{api.error()};
  pcc_mpi_comm *world = api->world();
  if (!world)
    return Error{std::string("starting MPI: ") + api->lastError()};
  return std::unique_ptr<Communicator>(new MpiCommunicator(*api, world));
}

Result<std::unique_ptr<Communicator>>
Communicator::nccl(Communicator &bootstrap, Device &device) {
  if (device.target() != PCC_TARGET_CUDA)
    return Error{"NCCL needs a CUDA device, not " + device.describe()};
  auto api = loadNcclApi();
  if (!api.ok())
    return Error{api.error()};
  // Rank 0 makes the unique id; the bootstrap group hands it to the others.
  std::vector<uint8_t> id(static_cast<size_t>(api->uniqueIdSize()));
  if (bootstrap.rank() == 0 && api->getUniqueId(id.data()))
    return Error{std::string("rank 0: ncclGetUniqueId: ") + api->lastError()};
  Status shared = bootstrap.broadcast(
      id.data(), static_cast<int64_t>(id.size()), DType::U8, 0);
  if (!shared.ok())
    return Error{"handing out the NCCL unique id: " + shared.error()};
  auto *ctx = static_cast<pcc_cuda_context *>(device.runContext().backend);
  pcc_nccl_comm *comm =
      api->init(ctx, id.data(), bootstrap.size(), bootstrap.rank());
  if (!comm)
    return Error{"rank " + std::to_string(bootstrap.rank()) + " of " +
                 std::to_string(bootstrap.size()) + ": " + api->lastError()};
  auto result = std::unique_ptr<Communicator>(
      new NcclCommunicator(*api, comm, bootstrap.rank(), bootstrap.size()));
  result->setName(bootstrap.name());
  return result;
}

CommBinding::CommBinding(Communicator &comm) : comm(&comm) {
  abi.group = this;
  abi.rank = comm.rank();
  abi.size = comm.size();
  abi.all_reduce = &CommBinding::allReduce;
  abi.all_gather = &CommBinding::allGather;
  abi.reduce_scatter = &CommBinding::reduceScatter;
  abi.last_error = &CommBinding::lastError;
  abi.set_label = &CommBinding::setLabel;
  abi.all_reduce_start = &CommBinding::allReduceStart;
  abi.reduce_scatter_start = &CommBinding::reduceScatterStart;
  abi.wait_all = &CommBinding::waitAll;
  abi.progress = &CommBinding::progress;
  abi.all_gather_start = &CommBinding::allGatherStart;
  abi.started = &CommBinding::started;
  abi.wait_through = &CommBinding::waitThrough;
}

namespace {
/// Adds the seconds the enclosing scope takes to `into`.
struct Timed {
  explicit Timed(double &into)
      : into(into), begin(std::chrono::steady_clock::now()) {}
  ~Timed() {
    into += std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                          begin)
                .count();
  }
  double &into;
  std::chrono::steady_clock::time_point begin;
};

/// Counts a started collective moving `bytes` (in the units of `kind`).
void countStarted(CommBinding::Traffic &t,
                  int64_t CommBinding::Traffic::*kind, int64_t bytes) {
  t.*kind += bytes;
  ++t.calls;
  ++t.started;
}
} // namespace

int CommBinding::allReduceStart(void *group, void *buffer, int64_t count,
                                int32_t dtype) {
  auto *self = static_cast<CommBinding *>(group);
  Timed t(self->moved.seconds);
  countStarted(self->moved, &Traffic::allReduce,
               2 * count * dtypeSize(static_cast<DType>(dtype)));
  return self->check(
      self->comm->allReduceStart(buffer, count, static_cast<DType>(dtype)));
}

int CommBinding::reduceScatterStart(void *group, const void *send, void *recv,
                                    int64_t count, int32_t dtype) {
  auto *self = static_cast<CommBinding *>(group);
  Timed t(self->moved.seconds);
  countStarted(self->moved, &Traffic::reduceScatter,
               count * self->abi.size * dtypeSize(static_cast<DType>(dtype)));
  return self->check(self->comm->reduceScatterStart(
      send, recv, count, static_cast<DType>(dtype)));
}

int CommBinding::allGatherStart(void *group, const void *send, void *recv,
                                int64_t count, int32_t dtype) {
  auto *self = static_cast<CommBinding *>(group);
  Timed t(self->moved.seconds);
  countStarted(self->moved, &Traffic::allGather,
               count * self->abi.size * dtypeSize(static_cast<DType>(dtype)));
  ++self->moved.startedGathers;
  return self->check(self->comm->allGatherStart(send, recv, count,
                                                static_cast<DType>(dtype)));
}

int64_t CommBinding::started(void *group) {
  return static_cast<CommBinding *>(group)->comm->startedCollectives();
}

int CommBinding::waitThrough(void *group, int64_t ticket) {
  auto *self = static_cast<CommBinding *>(group);
  Timed t(self->moved.seconds);
  return self->check(self->comm->waitCollectivesThrough(ticket));
}

int CommBinding::waitAll(void *group) {
  auto *self = static_cast<CommBinding *>(group);
  Timed t(self->moved.seconds);
  return self->check(self->comm->waitCollectives());
}

void CommBinding::progress(void *group) {
  auto *self = static_cast<CommBinding *>(group);
  Timed t(self->moved.seconds);
  self->comm->progressCollectives();
}

void CommBinding::setLabel(void *group, const char *label) {
  static_cast<CommBinding *>(group)->comm->setLabel(label);
}

int CommBinding::check(Status status) {
  // The label named this call only; later calls (a checkpoint's gathers,
  // a pipeline's transfers) set their own or none.
  comm->setLabel(nullptr);
  if (status.ok())
    return 0;
  error = status.error();
  return 1;
}

int CommBinding::allReduce(void *group, const void *send, void *recv,
                           int64_t count, int32_t dtype) {
  auto *self = static_cast<CommBinding *>(group);
  Timed t(self->moved.seconds);
  self->moved.allReduce += 2 * count * dtypeSize(static_cast<DType>(dtype));
  ++self->moved.calls;
  return self->check(self->comm->allReduce(
      send, recv, count, static_cast<DType>(dtype), ReduceOp::Sum));
}

int CommBinding::allGather(void *group, const void *send, void *recv,
                           int64_t count, int32_t dtype) {
  auto *self = static_cast<CommBinding *>(group);
  Timed t(self->moved.seconds);
  self->moved.allGather += count * self->abi.size *
                           dtypeSize(static_cast<DType>(dtype));
  ++self->moved.calls;
  return self->check(
      self->comm->allGather(send, recv, count, static_cast<DType>(dtype)));
}

int CommBinding::reduceScatter(void *group, const void *send, void *recv,
                               int64_t count, int32_t dtype) {
  auto *self = static_cast<CommBinding *>(group);
  Timed t(self->moved.seconds);
  self->moved.reduceScatter += count * self->abi.size *
                               dtypeSize(static_cast<DType>(dtype));
  ++self->moved.calls;
  return self->check(self->comm->reduceScatter(
      send, recv, count, static_cast<DType>(dtype), ReduceOp::Sum));
}

const char *CommBinding::lastError(void *group) {
  return static_cast<CommBinding *>(group)->error.c_str();
}

void Communicator::setCollectiveTimeout(double seconds) {
  Watchdog::get().setTimeout(seconds);
}

} // namespace pccrt
