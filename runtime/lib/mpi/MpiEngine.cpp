//===- MpiEngine.cpp - collectives over MPI for CPU ranks -----------------===//
//
// libpcc_runtime_mpi.so: the C entry points of Engines.h over the MPI C
// API. Communicators return errors instead of aborting
// (MPI_ERRORS_RETURN), so a failure becomes a message naming the
// collective; a rank that dies makes mpirun end the job.
//
//===----------------------------------------------------------------------===//

#include "pcc/runtime/CpuKernels.h"
#include "pcc/runtime/Engines.h"
#include "pcc/runtime/HalfFloat.h"

#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

struct pcc_mpi_comm {
  MPI_Comm comm;
  /// Sends started by pcc_mpi_isend and not yet waited for.
  std::vector<MPI_Request> pending;
  /// Receives posted by pcc_mpi_irecv and not yet waited for, oldest
  /// first.
  std::vector<MPI_Request> receives;
  /// Collectives started by pcc_mpi_iall_reduce, pcc_mpi_ireduce_scatter
  /// or pcc_mpi_iall_gather and not yet waited for, oldest first.
  std::vector<MPI_Request> collectives;
  /// In-place reduce-scatters leave the slice at the buffer's start; it
  /// moves to the rank's place once they complete: (to, from, bytes), and
  /// the index in `collectives` of the call it belongs to.
  struct Move {
    char *to;
    const char *from;
    size_t bytes;
    size_t call;
  };
  std::vector<Move> moves;
};

namespace {
thread_local std::string lastError;

int fail(const std::string &what, int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS)
    length = 0;
  lastError = what + ": " + std::string(text, length);
  return 1;
}

int failWith(const std::string &message) {
  lastError = message;
  return 1;
}

/// The MPI type of a pcc dtype, or MPI_DATATYPE_NULL.
MPI_Datatype mpiType(int dtype) {
  switch (dtype) {
  case PCC_F32:
    return MPI_FLOAT;
  case PCC_F64:
    return MPI_DOUBLE;
  case PCC_F16:
  case PCC_BF16:
    return MPI_UINT16_T; // moved, never reduced
  case PCC_I64:
    return MPI_INT64_T;
  case PCC_I32:
    return MPI_INT32_T;
  case PCC_I16:
    return MPI_INT16_T;
  case PCC_I8:
    return MPI_INT8_T;
  case PCC_U8:
  case PCC_BOOL:
    return MPI_UINT8_T;
  default:
    return MPI_DATATYPE_NULL;
  }
}

/// Checks the arguments shared by every call; fills type (and op).
int prepare(int64_t count, int dtype, MPI_Datatype &type) {
  if (count < 0 || count > INT_MAX)
    return failWith("element count " + std::to_string(count) +
                    " is outside what one MPI call moves (0 to 2^31-1)");
  type = mpiType(dtype);
  if (type == MPI_DATATYPE_NULL)
    return failWith("element type " + std::to_string(dtype) +
                    " has no MPI type");
  return 0;
}

/// 16-bit floats (moved as MPI_UINT16_T): each pair combined in float and
/// rounded back to nearest even, as NCCL reduces bf16 and fp16.
template <bool Brain, int Op>
void combine16(void *in, void *inout, int *len, MPI_Datatype *) {
  const auto *a = static_cast<const uint16_t *>(in);
  auto *b = static_cast<uint16_t *>(inout);
  for (int i = 0; i < *len; ++i) {
    float x = Brain ? pccrt::bf16ToFloat(a[i]) : pccrt::halfToFloat(a[i]);
    float y = Brain ? pccrt::bf16ToFloat(b[i]) : pccrt::halfToFloat(b[i]);
    float r = Op == PCC_OP_SUM   ? x + y
              : Op == PCC_OP_MAX ? std::max(x, y)
                                 : std::min(x, y);
    b[i] = Brain ? pccrt::floatToBf16(r) : pccrt::floatToHalf(r);
  }
}

/// The user-defined MPI op of a 16-bit float reduction, made once.
MPI_Op reduction16(bool brain, int op) {
  static MPI_Op ops[2][3] = {{MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL},
                             {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL}};
  static MPI_User_function *fns[2][3] = {
      {combine16<false, PCC_OP_SUM>, combine16<false, PCC_OP_MAX>,
       combine16<false, PCC_OP_MIN>},
      {combine16<true, PCC_OP_SUM>, combine16<true, PCC_OP_MAX>,
       combine16<true, PCC_OP_MIN>}};
  int k = op == PCC_OP_SUM ? 0 : op == PCC_OP_MAX ? 1 : 2;
  MPI_Op &made = ops[brain][k];
  if (made == MPI_OP_NULL && MPI_Op_create(fns[brain][k], 1, &made))
    made = MPI_OP_NULL;
  return made;
}

int reduction(int dtype, int op, MPI_Op &mpiOp) {
  if (dtype == PCC_F16 || dtype == PCC_BF16) {
    if (op != PCC_OP_SUM && op != PCC_OP_MAX && op != PCC_OP_MIN)
      return failWith("unknown reduction " + std::to_string(op));
    mpiOp = reduction16(dtype == PCC_BF16, op);
    if (mpiOp == MPI_OP_NULL)
      return failWith("MPI_Op_create failed for a 16-bit float reduction");
    return 0;
  }
  switch (op) {
  case PCC_OP_SUM:
    mpiOp = MPI_SUM;
    return 0;
  case PCC_OP_MAX:
    mpiOp = MPI_MAX;
    return 0;
  case PCC_OP_MIN:
    mpiOp = MPI_MIN;
    return 0;
  default:
    return failWith("unknown reduction " + std::to_string(op));
  }
}

const void *inPlace(const void *send, void *recv) {
  return send == recv ? MPI_IN_PLACE : send;
}

void finalise() {
  int finalised = 0;
  MPI_Finalized(&finalised);
  if (!finalised)
    MPI_Finalize();
}
} // namespace

extern "C" {

const char *pcc_mpi_last_error(void) { return lastError.c_str(); }

pcc_mpi_comm *pcc_mpi_world(void) {
  int initialised = 0;
  MPI_Initialized(&initialised);
  if (!initialised) {
    int provided = 0;
    if (int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED,
                                 &provided)) {
      fail("MPI_Init_thread", rc);
      return nullptr;
    }
    std::atexit(finalise);
  }
  auto *comm = new pcc_mpi_comm;
  if (int rc = MPI_Comm_dup(MPI_COMM_WORLD, &comm->comm)) {
    fail("MPI_Comm_dup", rc);
    delete comm;
    return nullptr;
  }
  MPI_Comm_set_errhandler(comm->comm, MPI_ERRORS_RETURN);
  return comm;
}

void pcc_mpi_free(pcc_mpi_comm *comm) {
  if (!comm)
    return;
  int finalised = 0;
  MPI_Finalized(&finalised);
  if (!finalised)
    MPI_Comm_free(&comm->comm);
  delete comm;
}

int pcc_mpi_rank(const pcc_mpi_comm *comm) {
  int rank = 0;
  MPI_Comm_rank(comm->comm, &rank);
  return rank;
}

int pcc_mpi_size(const pcc_mpi_comm *comm) {
  int size = 0;
  MPI_Comm_size(comm->comm, &size);
  return size;
}

pcc_mpi_comm *pcc_mpi_split(pcc_mpi_comm *comm, int color, int key) {
  auto *sub = new pcc_mpi_comm;
  if (int rc = MPI_Comm_split(comm->comm, color, key, &sub->comm)) {
    fail("MPI_Comm_split", rc);
    delete sub;
    return nullptr;
  }
  MPI_Comm_set_errhandler(sub->comm, MPI_ERRORS_RETURN);
  return sub;
}

int pcc_mpi_all_reduce(pcc_mpi_comm *comm, const void *send, void *recv,
                       int64_t count, int dtype, int op) {
  MPI_Datatype type;
  MPI_Op mpiOp;
  if (prepare(count, dtype, type) || reduction(dtype, op, mpiOp))
    return 1;
  if (int rc = MPI_Allreduce(inPlace(send, recv), recv, int(count), type, mpiOp,
                             comm->comm))
    return fail("MPI_Allreduce", rc);
  return 0;
}

int pcc_mpi_all_gather(pcc_mpi_comm *comm, const void *send, void *recv,
                       int64_t count_per_rank, int dtype) {
  MPI_Datatype type;
  if (prepare(count_per_rank, dtype, type))
    return 1;
  if (int rc = MPI_Allgather(send, int(count_per_rank), type, recv,
                             int(count_per_rank), type, comm->comm))
    return fail("MPI_Allgather", rc);
  return 0;
}

int pcc_mpi_reduce_scatter(pcc_mpi_comm *comm, const void *send, void *recv,
                           int64_t count_per_rank, int dtype, int op) {
  MPI_Datatype type;
  MPI_Op mpiOp;
  if (prepare(count_per_rank, dtype, type) || reduction(dtype, op, mpiOp))
    return 1;
  if (int rc = MPI_Reduce_scatter_block(send, recv, int(count_per_rank), type,
                                        mpiOp, comm->comm))
    return fail("MPI_Reduce_scatter_block", rc);
  return 0;
}

int pcc_mpi_broadcast(pcc_mpi_comm *comm, void *buffer, int64_t count,
                      int dtype, int root) {
  MPI_Datatype type;
  if (prepare(count, dtype, type))
    return 1;
  if (int rc = MPI_Bcast(buffer, int(count), type, root, comm->comm))
    return fail("MPI_Bcast", rc);
  return 0;
}

int pcc_mpi_send(pcc_mpi_comm *comm, const void *buffer, int64_t count,
                 int dtype, int peer) {
  MPI_Datatype type;
  if (prepare(count, dtype, type))
    return 1;
  if (int rc = MPI_Send(buffer, int(count), type, peer, 0, comm->comm))
    return fail("MPI_Send", rc);
  return 0;
}

int pcc_mpi_recv(pcc_mpi_comm *comm, void *buffer, int64_t count, int dtype,
                 int peer) {
  MPI_Datatype type;
  if (prepare(count, dtype, type))
    return 1;
  if (int rc = MPI_Recv(buffer, int(count), type, peer, 0, comm->comm,
                        MPI_STATUS_IGNORE))
    return fail("MPI_Recv", rc);
  return 0;
}

int pcc_mpi_isend(pcc_mpi_comm *comm, const void *buffer, int64_t count,
                  int dtype, int peer) {
  MPI_Datatype type;
  if (prepare(count, dtype, type))
    return 1;
  MPI_Request request;
  if (int rc =
          MPI_Isend(buffer, int(count), type, peer, 0, comm->comm, &request))
    return fail("MPI_Isend", rc);
  comm->pending.push_back(request);
  return 0;
}

int pcc_mpi_wait_sends(pcc_mpi_comm *comm) {
  if (comm->pending.empty())
    return 0;
  int rc = MPI_Waitall(static_cast<int>(comm->pending.size()),
                       comm->pending.data(), MPI_STATUSES_IGNORE);
  comm->pending.clear();
  if (rc)
    return fail("MPI_Waitall (sends)", rc);
  return 0;
}

int pcc_mpi_irecv(pcc_mpi_comm *comm, void *buffer, int64_t count, int dtype,
                  int peer) {
  MPI_Datatype type;
  if (prepare(count, dtype, type))
    return 1;
  MPI_Request request;
  if (int rc =
          MPI_Irecv(buffer, int(count), type, peer, 0, comm->comm, &request))
    return fail("MPI_Irecv", rc);
  comm->receives.push_back(request);
  return 0;
}

int pcc_mpi_wait_receives(pcc_mpi_comm *comm, int64_t count) {
  size_t n = count < 0 ? 0 : static_cast<size_t>(count);
  n = std::min(n, comm->receives.size());
  if (n == 0)
    return 0;
  int rc = MPI_Waitall(static_cast<int>(n), comm->receives.data(),
                       MPI_STATUSES_IGNORE);
  comm->receives.erase(comm->receives.begin(), comm->receives.begin() + n);
  return rc == MPI_SUCCESS ? 0 : fail("MPI_Waitall (receives)", rc);
}

int pcc_mpi_iall_reduce(pcc_mpi_comm *comm, void *buffer, int64_t count,
                        int dtype) {
  MPI_Datatype type;
  if (prepare(count, dtype, type))
    return 1;
  if (dtype != PCC_F32 && dtype != PCC_F64 && dtype != PCC_I64 &&
      dtype != PCC_I32)
    return failWith("a started all-reduce sums f32, f64, i64 or i32");
  MPI_Request request;
  int rc = MPI_Iallreduce(MPI_IN_PLACE, buffer, static_cast<int>(count), type,
                          MPI_SUM, comm->comm, &request);
  if (rc != MPI_SUCCESS)
    return fail("MPI_Iallreduce", rc);
  comm->collectives.push_back(request);
  return 0;
}

int pcc_mpi_ireduce_scatter(pcc_mpi_comm *comm, const void *send, void *recv,
                            int64_t count_per_rank, int dtype) {
  MPI_Datatype type;
  if (prepare(count_per_rank, dtype, type))
    return 1;
  if (dtype != PCC_F32 && dtype != PCC_F64)
    return failWith("a started reduce-scatter sums f32 or f64");
  int rank = 0;
  MPI_Comm_rank(comm->comm, &rank);
  size_t bytes = static_cast<size_t>(count_per_rank) * (dtype == PCC_F64 ? 8 : 4);
  auto *base = const_cast<char *>(static_cast<const char *>(send));
  bool inPlace = static_cast<char *>(recv) == base + rank * bytes;
  MPI_Request request;
  int rc = MPI_Ireduce_scatter_block(
      inPlace ? MPI_IN_PLACE : send, inPlace ? base : recv,
      static_cast<int>(count_per_rank), type, MPI_SUM, comm->comm, &request);
  if (rc != MPI_SUCCESS)
    return fail("MPI_Ireduce_scatter_block", rc);
  comm->collectives.push_back(request);
  if (inPlace && rank != 0)
    comm->moves.push_back({static_cast<char *>(recv), base, bytes,
                           comm->collectives.size() - 1});
  return 0;
}

int pcc_mpi_iall_gather(pcc_mpi_comm *comm, const void *send, void *recv,
                        int64_t count_per_rank, int dtype) {
  MPI_Datatype type;
  if (prepare(count_per_rank, dtype, type))
    return 1;
  int rank = 0, width = 0;
  MPI_Comm_rank(comm->comm, &rank);
  MPI_Type_size(type, &width);
  size_t bytes = static_cast<size_t>(count_per_rank) * width;
  bool inPlace = send == static_cast<const char *>(recv) + rank * bytes;
  MPI_Request request;
  int rc = MPI_Iallgather(inPlace ? MPI_IN_PLACE : send,
                          static_cast<int>(count_per_rank), type, recv,
                          static_cast<int>(count_per_rank), type, comm->comm,
                          &request);
  if (rc != MPI_SUCCESS)
    return fail("MPI_Iallgather", rc);
  comm->collectives.push_back(request);
  return 0;
}

int pcc_mpi_wait_oldest(pcc_mpi_comm *comm, int64_t count) {
  size_t n = count < 0 ? 0 : static_cast<size_t>(count);
  if (n > comm->collectives.size())
    n = comm->collectives.size();
  if (n == 0)
    return 0;
  int rc = MPI_Waitall(static_cast<int>(n), comm->collectives.data(),
                       MPI_STATUSES_IGNORE);
  comm->collectives.erase(comm->collectives.begin(),
                          comm->collectives.begin() + n);
  // Each move stays within the buffer of its own call.
  std::vector<pcc_mpi_comm::Move> later;
  for (pcc_mpi_comm::Move m : comm->moves) {
    if (m.call < n) {
      std::memmove(m.to, m.from, m.bytes);
    } else {
      m.call -= n;
      later.push_back(m);
    }
  }
  comm->moves = std::move(later);
  return rc == MPI_SUCCESS ? 0 : fail("MPI_Waitall", rc);
}

void pcc_mpi_test_collectives(pcc_mpi_comm *comm) {
  if (comm->collectives.empty())
    return;
  int done = 0;
  MPI_Testall(static_cast<int>(comm->collectives.size()),
              comm->collectives.data(), &done, MPI_STATUSES_IGNORE);
}

void pcc_mpi_abort(int code) {
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

int pcc_mpi_barrier(pcc_mpi_comm *comm) {
  if (int rc = MPI_Barrier(comm->comm))
    return fail("MPI_Barrier", rc);
  return 0;
}

} // extern "C"
