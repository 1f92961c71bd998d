//===- NcclEngine.cpp - collectives over NCCL for GPU ranks ---------------===//
//
// The NCCL entry points of Engines.h, part of libpcc_runtime_cuda.so. Each
// communicator enqueues on its CUDA context's stream; pcc_nccl_wait bounds
// the wait and aborts the communicator when a peer is gone, so a dead rank
// ends the others with a message instead of a hang.
//
//===----------------------------------------------------------------------===//

#include "pcc/runtime/CpuKernels.h"
#include "pcc/runtime/CudaKernels.h"
#include "pcc/runtime/Engines.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <deque>
#include <string>
#include <thread>
#include <utility>
#include <vector>

struct pcc_nccl_comm {
  ncclComm_t comm = nullptr;
  /// Where the calls are enqueued: the context's stream, or its own.
  cudaStream_t stream = nullptr;
  /// The context's (compute) stream.
  cudaStream_t compute = nullptr;
  /// The communicator's own stream, once pcc_nccl_own_stream made it;
  /// `ownStream` while the calls go there.
  cudaStream_t transfers = nullptr;
  bool ownStream = false;
  /// Posted receives (pcc_nccl_recv_post) by number: how many were posted,
  /// have an event marking them, and were waited for; each mark is the
  /// number of the last receive it covers and its event on `stream`.
  int64_t receivesPosted = 0, receivesMarked = 0, receivesCompleted = 0;
  std::deque<std::pair<int64_t, cudaEvent_t>> receiveMarks;
  bool inGroup = false;
  /// Fences between the two streams (no timing).
  cudaEvent_t computeDone = nullptr, callsDone = nullptr;
  /// Started all-reduces (gradient buckets) run on a stream of their own,
  /// after the work on `stream` before them; finishing them fences
  /// `stream` behind them.
  cudaStream_t side = nullptr;
  cudaEvent_t sideReady = nullptr;
  /// One event per started collective still running, recorded on `side`
  /// after it, oldest first; and the events free for reuse.
  std::deque<cudaEvent_t> started;
  std::vector<cudaEvent_t> spareEvents;
  int device = 0;
  bool aborted = false;
};

namespace {
thread_local std::string lastError;

/// A failed NCCL call on `comm` leaves it unusable: it is marked aborted,
/// so later calls fail at once and pcc_nccl_free aborts it rather than
/// waiting for its work in ncclCommDestroy.
int fail(const std::string &what, ncclResult_t rc, pcc_nccl_comm *comm) {
  lastError = what + ": " + ncclGetErrorString(rc);
  if (comm && rc != ncclSuccess) {
    const char *detail = ncclGetLastError(comm->comm);
    if (detail && *detail)
      lastError += std::string(" (") + detail + ")";
    comm->aborted = true;
  }
  return 1;
}

int failIfAborted(const pcc_nccl_comm *comm) {
  if (!comm->aborted && comm->comm)
    return 0;
  lastError = "the NCCL communicator was aborted after an earlier failure";
  return 1;
}

int failWith(const std::string &message) {
  lastError = message;
  return 1;
}

/// The NCCL type of each pcc element type NCCL can move.
constexpr std::pair<int, ncclDataType_t> kNcclTypes[] = {
    {PCC_F32, ncclFloat32},   {PCC_F64, ncclFloat64}, {PCC_F16, ncclFloat16},
    {PCC_BF16, ncclBfloat16}, {PCC_I64, ncclInt64},   {PCC_I32, ncclInt32},
    {PCC_I8, ncclInt8},       {PCC_U8, ncclUint8},    {PCC_BOOL, ncclUint8},
};

bool ncclTypeOf(int dtype, ncclDataType_t &type) {
  for (auto [pcc, nccl] : kNcclTypes)
    if (pcc == dtype) {
      type = nccl;
      return true;
    }
  return false;
}

int prepare(pcc_nccl_comm *comm, int dtype, ncclDataType_t &type) {
  if (failIfAborted(comm))
    return 1;
  if (!ncclTypeOf(dtype, type))
    return failWith("element type " + std::to_string(dtype) +
                    " has no NCCL type");
  return 0;
}

bool ncclOpOf(int op, ncclRedOp_t &out) {
  switch (op) {
  case PCC_OP_SUM:
    out = ncclSum;
    return true;
  case PCC_OP_MAX:
    out = ncclMax;
    return true;
  case PCC_OP_MIN:
    out = ncclMin;
    return true;
  default:
    return false;
  }
}

/// prepare() for a reduction: also its NCCL operation.
int prepare(pcc_nccl_comm *comm, int dtype, ncclDataType_t &type, int op,
            ncclRedOp_t &red) {
  if (prepare(comm, dtype, type))
    return 1;
  if (!ncclOpOf(op, red))
    return failWith("unknown reduction " + std::to_string(op));
  return 0;
}

std::string versionString;
} // namespace

extern "C" {

const char *pcc_nccl_last_error(void) { return lastError.c_str(); }

int pcc_nccl_unique_id_size(void) { return sizeof(ncclUniqueId); }

int pcc_nccl_get_unique_id(void *id) {
  if (ncclResult_t rc = ncclGetUniqueId(static_cast<ncclUniqueId *>(id)))
    return fail("ncclGetUniqueId", rc, nullptr);
  return 0;
}

const char *pcc_nccl_version(void) {
  int code = 0;
  ncclGetVersion(&code);
  versionString = "NCCL " + std::to_string(code / 10000) + "." +
                  std::to_string(code / 100 % 100) + "." +
                  std::to_string(code % 100);
  return versionString.c_str();
}

pcc_nccl_comm *pcc_nccl_init(pcc_cuda_context *ctx, const void *id, int size,
                             int rank) {
  auto *comm = new pcc_nccl_comm;
  comm->device = pcc_cuda_device_ordinal(ctx);
  comm->stream = static_cast<cudaStream_t>(pcc_cuda_stream(ctx));
  comm->compute = comm->stream;
  if (cudaError_t err = cudaSetDevice(comm->device)) {
    failWith(std::string("cudaSetDevice: ") + cudaGetErrorString(err));
    delete comm;
    return nullptr;
  }
  ncclUniqueId uid;
  std::memcpy(&uid, id, sizeof(uid));
  if (ncclResult_t rc = ncclCommInitRank(&comm->comm, size, uid, rank)) {
    fail("ncclCommInitRank (rank " + std::to_string(rank) + " of " +
             std::to_string(size) + ")",
         rc, nullptr);
    delete comm;
    return nullptr;
  }
  return comm;
}

void pcc_nccl_free(pcc_nccl_comm *comm) {
  if (!comm)
    return;
  if (comm->comm)
    (void)(comm->aborted ? ncclCommAbort(comm->comm)
                         : ncclCommDestroy(comm->comm));
  for (cudaEvent_t e : comm->started)
    (void)cudaEventDestroy(e);
  for (auto &mark : comm->receiveMarks)
    (void)cudaEventDestroy(mark.second);
  for (cudaEvent_t e : comm->spareEvents)
    (void)cudaEventDestroy(e);
  if (comm->side) {
    (void)cudaEventDestroy(comm->sideReady);
    (void)cudaStreamDestroy(comm->side);
  }
  if (comm->transfers) {
    (void)cudaEventDestroy(comm->computeDone);
    (void)cudaEventDestroy(comm->callsDone);
    (void)cudaStreamDestroy(comm->transfers);
  }
  delete comm;
}

int pcc_nccl_all_reduce(pcc_nccl_comm *comm, const void *send, void *recv,
                        int64_t count, int dtype, int op) {
  ncclDataType_t type;
  ncclRedOp_t red;
  if (prepare(comm, dtype, type, op, red))
    return 1;
  if (ncclResult_t rc = ncclAllReduce(send, recv, size_t(count), type, red,
                                      comm->comm, comm->stream))
    return fail("ncclAllReduce", rc, comm);
  return 0;
}

int pcc_nccl_all_gather(pcc_nccl_comm *comm, const void *send, void *recv,
                        int64_t count_per_rank, int dtype) {
  ncclDataType_t type;
  if (prepare(comm, dtype, type))
    return 1;
  if (ncclResult_t rc = ncclAllGather(send, recv, size_t(count_per_rank), type,
                                      comm->comm, comm->stream))
    return fail("ncclAllGather", rc, comm);
  return 0;
}

int pcc_nccl_reduce_scatter(pcc_nccl_comm *comm, const void *send, void *recv,
                            int64_t count_per_rank, int dtype, int op) {
  ncclDataType_t type;
  ncclRedOp_t red;
  if (prepare(comm, dtype, type, op, red))
    return 1;
  if (ncclResult_t rc = ncclReduceScatter(send, recv, size_t(count_per_rank),
                                          type, red, comm->comm, comm->stream))
    return fail("ncclReduceScatter", rc, comm);
  return 0;
}

int pcc_nccl_broadcast(pcc_nccl_comm *comm, void *buffer, int64_t count,
                       int dtype, int root) {
  ncclDataType_t type;
  if (prepare(comm, dtype, type))
    return 1;
  if (ncclResult_t rc = ncclBroadcast(buffer, buffer, size_t(count), type, root,
                                      comm->comm, comm->stream))
    return fail("ncclBroadcast", rc, comm);
  return 0;
}

int pcc_nccl_send(pcc_nccl_comm *comm, const void *buffer, int64_t count,
                  int dtype, int peer) {
  ncclDataType_t type;
  if (prepare(comm, dtype, type))
    return 1;
  if (ncclResult_t rc =
          ncclSend(buffer, size_t(count), type, peer, comm->comm, comm->stream))
    return fail("ncclSend", rc, comm);
  return 0;
}

int pcc_nccl_recv(pcc_nccl_comm *comm, void *buffer, int64_t count, int dtype,
                  int peer) {
  ncclDataType_t type;
  if (prepare(comm, dtype, type))
    return 1;
  if (ncclResult_t rc =
          ncclRecv(buffer, size_t(count), type, peer, comm->comm, comm->stream))
    return fail("ncclRecv", rc, comm);
  return 0;
}

int pcc_nccl_own_stream(pcc_nccl_comm *comm) {
  if (comm->ownStream)
    return 0;
  if (comm->transfers) {
    comm->stream = comm->transfers;
    comm->ownStream = true;
    return 0;
  }
  if (cudaError_t err = cudaSetDevice(comm->device))
    return failWith(std::string("cudaSetDevice: ") + cudaGetErrorString(err));
  cudaStream_t stream = nullptr;
  if (cudaError_t err =
          cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking))
    return failWith(std::string("cudaStreamCreateWithFlags: ") +
                    cudaGetErrorString(err));
  cudaEvent_t a = nullptr, b = nullptr;
  cudaError_t err = cudaEventCreateWithFlags(&a, cudaEventDisableTiming);
  if (err == cudaSuccess)
    err = cudaEventCreateWithFlags(&b, cudaEventDisableTiming);
  if (err != cudaSuccess) {
    if (a)
      (void)cudaEventDestroy(a);
    (void)cudaStreamDestroy(stream);
    return failWith(std::string("cudaEventCreateWithFlags: ") +
                    cudaGetErrorString(err));
  }
  comm->transfers = stream;
  comm->stream = stream;
  comm->computeDone = a;
  comm->callsDone = b;
  comm->ownStream = true;
  return 0;
}

/// Makes `waiter` wait for the work enqueued so far on `done`'s stream.
static int streamWait(cudaEvent_t event, cudaStream_t done,
                      cudaStream_t waiter, const char *what) {
  if (cudaError_t err = cudaEventRecord(event, done))
    return failWith(std::string(what) +
                    ": cudaEventRecord: " + cudaGetErrorString(err));
  if (cudaError_t err = cudaStreamWaitEvent(waiter, event, 0))
    return failWith(std::string(what) +
                    ": cudaStreamWaitEvent: " + cudaGetErrorString(err));
  return 0;
}

/// streamWait between the context's stream and the communicator's own;
/// nothing when the communicator shares the context's stream.
static int fence(pcc_nccl_comm *comm, cudaEvent_t event, cudaStream_t done,
                 cudaStream_t waiter, const char *what) {
  if (failIfAborted(comm))
    return 1;
  if (!comm->ownStream)
    return 0;
  return streamWait(event, done, waiter, what);
}

int pcc_nccl_after_compute(pcc_nccl_comm *comm) {
  return fence(comm, comm->computeDone, comm->compute, comm->stream,
               "ordering transfers after compute");
}

int pcc_nccl_before_compute(pcc_nccl_comm *comm) {
  return fence(comm, comm->callsDone, comm->stream, comm->compute,
               "ordering compute after transfers");
}

int pcc_nccl_join_stream(pcc_nccl_comm *comm) {
  if (failIfAborted(comm))
    return 1;
  if (!comm->ownStream)
    return 0;
  if (streamWait(comm->callsDone, comm->stream, comm->compute,
                 "ordering compute after transfers"))
    return 1;
  comm->stream = comm->compute;
  comm->ownStream = false;
  return 0;
}

} // extern "C"

namespace {
/// An event from the spare ones, or a new one.
int takeEvent(pcc_nccl_comm *comm, cudaEvent_t &event, const char *what) {
  if (!comm->spareEvents.empty()) {
    event = comm->spareEvents.back();
    comm->spareEvents.pop_back();
    return 0;
  }
  if (cudaError_t err = cudaEventCreateWithFlags(&event, cudaEventDisableTiming))
    return failWith(std::string(what) + ": cudaEventCreate: " +
                    cudaGetErrorString(err));
  return 0;
}

/// Marks the receives posted since the last mark with an event on the
/// calls' stream, after them.
int markReceives(pcc_nccl_comm *comm) {
  if (comm->receivesPosted == comm->receivesMarked)
    return 0;
  cudaEvent_t event = nullptr;
  if (takeEvent(comm, event, "marking posted receives"))
    return 1;
  if (cudaError_t err = cudaEventRecord(event, comm->stream)) {
    comm->spareEvents.push_back(event);
    return failWith(std::string("marking posted receives: cudaEventRecord: ") +
                    cudaGetErrorString(err));
  }
  comm->receiveMarks.push_back({comm->receivesPosted, event});
  comm->receivesMarked = comm->receivesPosted;
  return 0;
}
} // namespace

extern "C" {

int pcc_nccl_group_start(pcc_nccl_comm *comm) {
  if (failIfAborted(comm))
    return 1;
  if (ncclResult_t rc = ncclGroupStart())
    return fail("ncclGroupStart", rc, comm);
  comm->inGroup = true;
  return 0;
}

int pcc_nccl_group_end(pcc_nccl_comm *comm) {
  // Always ends the group, even on an aborted communicator: an open group
  // would swallow every later NCCL call of this thread.
  comm->inGroup = false;
  if (ncclResult_t rc = ncclGroupEnd())
    return fail("ncclGroupEnd", rc, comm);
  // The group's receives complete with it.
  return markReceives(comm);
}

int pcc_nccl_recv_post(pcc_nccl_comm *comm, void *buffer, int64_t count,
                       int dtype, int peer) {
  if (pcc_nccl_recv(comm, buffer, count, dtype, peer))
    return 1;
  ++comm->receivesPosted;
  return comm->inGroup ? 0 : markReceives(comm);
}

/// Polls `query` (a stream's or an event's) until it is done, up to
/// timeout_ms; on a timeout or an asynchronous NCCL error the communicator
/// is aborted.
} // extern "C"

template <typename Query>
static int waitUntil(pcc_nccl_comm *comm, int64_t timeout_ms, Query query) {
  if (failIfAborted(comm))
    return 1;
  auto begin = std::chrono::steady_clock::now();
  auto deadline = begin + std::chrono::milliseconds(timeout_ms);
  while (true) {
    cudaError_t state = query();
    if (state == cudaSuccess)
      return 0;
    if (state != cudaErrorNotReady)
      return failWith(std::string("the stream failed: ") +
                      cudaGetErrorString(state));
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(comm->comm, &async);
    if (async != ncclSuccess && async != ncclInProgress) {
      comm->aborted = true;
      ncclCommAbort(comm->comm);
      comm->comm = nullptr;
      return fail("NCCL reported an asynchronous error", async, nullptr);
    }
    if (std::chrono::steady_clock::now() > deadline) {
      comm->aborted = true;
      ncclCommAbort(comm->comm);
      comm->comm = nullptr;
      return failWith("no progress within " + std::to_string(timeout_ms) +
                      " ms (a peer rank is gone or stuck); the communicator "
                      "was aborted");
    }
    // Receives wait here on the pipeline's critical path: spin for the
    // first 200 us, then poll every 50 us.
    if (std::chrono::steady_clock::now() - begin >
        std::chrono::microseconds(200))
      std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

extern "C" {

int pcc_nccl_wait(pcc_nccl_comm *comm, int64_t timeout_ms) {
  return waitUntil(comm, timeout_ms,
                   [&] { return cudaStreamQuery(comm->stream); });
}

int pcc_nccl_wait_receives(pcc_nccl_comm *comm, int64_t count,
                           int64_t timeout_ms) {
  if (failIfAborted(comm))
    return 1;
  int64_t through = comm->receivesCompleted + (count < 0 ? 0 : count);
  if (through > comm->receivesPosted)
    through = comm->receivesPosted;
  if (through <= comm->receivesCompleted)
    return 0;
  if (through > comm->receivesMarked)
    return failWith("waiting for receives posted in a group that has not "
                    "ended");
  // The first mark covering receive `through`: the calls' stream runs in
  // order, so its event covers every receive before it.
  cudaEvent_t event = nullptr;
  for (auto &mark : comm->receiveMarks)
    if (mark.first >= through) {
      event = mark.second;
      break;
    }
  if (cudaError_t err = cudaStreamWaitEvent(comm->compute, event, 0))
    return failWith(std::string("waiting for posted receives: "
                                "cudaStreamWaitEvent: ") +
                    cudaGetErrorString(err));
  int rc = waitUntil(comm, timeout_ms, [&] { return cudaEventQuery(event); });
  while (!comm->receiveMarks.empty() &&
         comm->receiveMarks.front().first <= through) {
    comm->spareEvents.push_back(comm->receiveMarks.front().second);
    comm->receiveMarks.pop_front();
  }
  comm->receivesCompleted = through;
  return rc;
}

} // extern "C"

namespace {
/// Readies the side stream of started collectives, behind the work
/// enqueued on the calls' stream so far (what the collective reads).
int startOnSide(pcc_nccl_comm *comm, const char *what) {
  if (!comm->side) {
    if (cudaError_t err =
            cudaStreamCreateWithFlags(&comm->side, cudaStreamNonBlocking))
      return failWith(std::string("creating the started collectives' "
                                  "stream: ") +
                      cudaGetErrorString(err));
    if (cudaEventCreateWithFlags(&comm->sideReady, cudaEventDisableTiming))
      return failWith("creating the started collectives' events");
  }
  return streamWait(comm->sideReady, comm->stream, comm->side, what);
}

/// Marks the end of the collective just enqueued on the side stream.
int noteStarted(pcc_nccl_comm *comm, const char *what) {
  cudaEvent_t event = nullptr;
  if (takeEvent(comm, event, what))
    return 1;
  if (cudaError_t err = cudaEventRecord(event, comm->side)) {
    comm->spareEvents.push_back(event);
    return failWith(std::string(what) + ": cudaEventRecord: " +
                    cudaGetErrorString(err));
  }
  comm->started.push_back(event);
  return 0;
}
/// Enqueues `call` (the NCCL collective `ncclName` on comm->side, given
/// the NCCL type of `dtype`) after the work on the calls' stream so far,
/// and marks its end for the waits.
template <typename Call>
int startCollective(pcc_nccl_comm *comm, int dtype, const char *name,
                    const char *ncclName, Call call) {
  ncclDataType_t type;
  if (prepare(comm, dtype, type))
    return 1;
  std::string what = std::string("starting an ") + name;
  if (startOnSide(comm, what.c_str()))
    return 1;
  if (ncclResult_t rc = call(type))
    return fail(std::string(ncclName) + " (started)", rc, comm);
  return noteStarted(comm, what.c_str());
}
} // namespace

extern "C" {

int pcc_nccl_all_reduce_start(pcc_nccl_comm *comm, void *buffer,
                              int64_t count, int dtype) {
  // The bucket is complete once the work enqueued before this call ran.
  return startCollective(
      comm, dtype, "all_reduce", "ncclAllReduce", [&](ncclDataType_t type) {
        return ncclAllReduce(buffer, buffer, size_t(count), type, ncclSum,
                             comm->comm, comm->side);
      });
}

int pcc_nccl_reduce_scatter_start(pcc_nccl_comm *comm, const void *send,
                                  void *recv, int64_t count_per_rank,
                                  int dtype) {
  return startCollective(
      comm, dtype, "reduce_scatter", "ncclReduceScatter",
      [&](ncclDataType_t type) {
        return ncclReduceScatter(send, recv, size_t(count_per_rank), type,
                                 ncclSum, comm->comm, comm->side);
      });
}

int pcc_nccl_all_gather_start(pcc_nccl_comm *comm, const void *send,
                              void *recv, int64_t count_per_rank, int dtype) {
  return startCollective(
      comm, dtype, "all_gather", "ncclAllGather", [&](ncclDataType_t type) {
        return ncclAllGather(send, recv, size_t(count_per_rank), type,
                             comm->comm, comm->side);
      });
}

int pcc_nccl_wait_oldest(pcc_nccl_comm *comm, int64_t count,
                         int64_t timeout_ms) {
  if (failIfAborted(comm))
    return 1;
  size_t n = count < 0 ? 0 : size_t(count);
  if (n > comm->started.size())
    n = comm->started.size();
  if (n == 0)
    return 0;
  // The side stream runs the started collectives in order: the n-th one's
  // event covers the n - 1 before it. Later work on the stream reads
  // their results...
  cudaEvent_t last = comm->started[n - 1];
  if (cudaError_t err = cudaStreamWaitEvent(comm->stream, last, 0))
    return failWith(std::string("waiting for the started collectives: "
                                "cudaStreamWaitEvent: ") +
                    cudaGetErrorString(err));
  // ...and the host bounds the wait, so a stalled peer is reported.
  int rc = waitUntil(comm, timeout_ms, [&] { return cudaEventQuery(last); });
  for (size_t i = 0; i < n; ++i) {
    comm->spareEvents.push_back(comm->started.front());
    comm->started.pop_front();
  }
  return rc;
}

} // extern "C"
