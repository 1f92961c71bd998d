/*===- Engines.h - C entry points of the communication engines ---*- C -*-===//
 *
 * The runtime loads its communication engines on demand, like the CUDA
 * backend: libpcc_runtime_mpi.so (MPI, CPU buffers) and the NCCL part of
 * libpcc_runtime_cuda.so (device buffers). pccrt::Communicator wraps these;
 * programs use that, not this header.
 *
 * Every call returns 0 on success, or non-zero with a message for
 * pcc_mpi_last_error() / pcc_nccl_last_error(). Element types are enum
 * pcc_dtype codes; reduction ops are enum pcc_collective_op.
 *
 *===----------------------------------------------------------------------===*/

#ifndef PCC_RUNTIME_ENGINES_H
#define PCC_RUNTIME_ENGINES_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum pcc_collective_op { PCC_OP_SUM = 0, PCC_OP_MAX, PCC_OP_MIN };

/*--- MPI (libpcc_runtime_mpi.so) ---------------------------------------*/

typedef struct pcc_mpi_comm pcc_mpi_comm;

const char *pcc_mpi_last_error(void);
/* The job's world (initialises MPI on first use, finalises at exit). */
pcc_mpi_comm *pcc_mpi_world(void);
void pcc_mpi_free(pcc_mpi_comm *comm);
int pcc_mpi_rank(const pcc_mpi_comm *comm);
int pcc_mpi_size(const pcc_mpi_comm *comm);
/* Ranks with equal color form a group, ordered by key. */
pcc_mpi_comm *pcc_mpi_split(pcc_mpi_comm *comm, int color, int key);
int pcc_mpi_all_reduce(pcc_mpi_comm *comm, const void *send, void *recv,
                       int64_t count, int dtype, int op);
int pcc_mpi_all_gather(pcc_mpi_comm *comm, const void *send, void *recv,
                       int64_t count_per_rank, int dtype);
int pcc_mpi_reduce_scatter(pcc_mpi_comm *comm, const void *send, void *recv,
                           int64_t count_per_rank, int dtype, int op);
int pcc_mpi_broadcast(pcc_mpi_comm *comm, void *buffer, int64_t count,
                      int dtype, int root);
int pcc_mpi_send(pcc_mpi_comm *comm, const void *buffer, int64_t count,
                 int dtype, int peer);
int pcc_mpi_recv(pcc_mpi_comm *comm, void *buffer, int64_t count, int dtype,
                 int peer);
int pcc_mpi_barrier(pcc_mpi_comm *comm);
/* A send that returns at once; the buffer must stay untouched until
 * pcc_mpi_wait_sends, which completes every send started so far. */
int pcc_mpi_isend(pcc_mpi_comm *comm, const void *buffer, int64_t count,
                  int dtype, int peer);
int pcc_mpi_wait_sends(pcc_mpi_comm *comm);
/* A receive that returns at once (MPI_Irecv, a pipeline's receive posted
 * a compute early); pcc_mpi_wait_receives completes the `count` oldest
 * posted receives still pending. */
int pcc_mpi_irecv(pcc_mpi_comm *comm, void *buffer, int64_t count, int dtype,
                  int peer);
int pcc_mpi_wait_receives(pcc_mpi_comm *comm, int64_t count);
/* A started in-place sum (MPI_Iallreduce), completed by
 * pcc_mpi_wait_oldest in the order the collectives of `comm` started;
 * pcc_mpi_test_collectives lets them advance (MPI_Testall). */
int pcc_mpi_iall_reduce(pcc_mpi_comm *comm, void *buffer, int64_t count,
                        int dtype);
/* A started sum of `send` ([size, count_per_rank]) keeping this rank's
 * slice in `recv` (MPI_Ireduce_scatter_block), completed with the sums. In
 * place when recv == send + rank * count_per_rank elements: the slice then
 * stays where it lies, as ncclReduceScatter's in-place form leaves it. */
int pcc_mpi_ireduce_scatter(pcc_mpi_comm *comm, const void *send, void *recv,
                            int64_t count_per_rank, int dtype);
/* A started gather of every rank's `send` into `recv` ([size,
 * count_per_rank], MPI_Iallgather), completed with the others. */
int pcc_mpi_iall_gather(pcc_mpi_comm *comm, const void *send, void *recv,
                        int64_t count_per_rank, int dtype);
/* Completes the `count` oldest started collectives still running on
 * `comm`; the later ones may still run. */
int pcc_mpi_wait_oldest(pcc_mpi_comm *comm, int64_t count);
void pcc_mpi_test_collectives(pcc_mpi_comm *comm);
/* Ends the whole job (MPI_Abort on the world): for a failure on one rank
 * while the others wait in a receive or a barrier. Does not return. */
void pcc_mpi_abort(int code);

/*--- NCCL (libpcc_runtime_cuda.so) --------------------------------------*/

typedef struct pcc_nccl_comm pcc_nccl_comm;
struct pcc_cuda_context;

const char *pcc_nccl_last_error(void);
/* Size of an ncclUniqueId and a new one (rank 0 makes it, all ranks get
 * it through a bootstrap communicator). */
int pcc_nccl_unique_id_size(void);
int pcc_nccl_get_unique_id(void *id);
/* The communicator of rank `rank` of `size` on the context's device; its
 * collectives are enqueued on the context's stream. */
pcc_nccl_comm *pcc_nccl_init(struct pcc_cuda_context *ctx, const void *id,
                             int size, int rank);
void pcc_nccl_free(pcc_nccl_comm *comm);
/* "NCCL 2.28.9" */
const char *pcc_nccl_version(void);
int pcc_nccl_all_reduce(pcc_nccl_comm *comm, const void *send, void *recv,
                        int64_t count, int dtype, int op);
int pcc_nccl_all_gather(pcc_nccl_comm *comm, const void *send, void *recv,
                        int64_t count_per_rank, int dtype);
int pcc_nccl_reduce_scatter(pcc_nccl_comm *comm, const void *send, void *recv,
                            int64_t count_per_rank, int dtype, int op);
int pcc_nccl_broadcast(pcc_nccl_comm *comm, void *buffer, int64_t count,
                       int dtype, int root);
int pcc_nccl_send(pcc_nccl_comm *comm, const void *buffer, int64_t count,
                  int dtype, int peer);
int pcc_nccl_recv(pcc_nccl_comm *comm, void *buffer, int64_t count, int dtype,
                  int peer);
/* Waits for the stream, up to timeout_ms; on a timeout or an asynchronous
 * NCCL error the communicator is aborted and the call fails. */
int pcc_nccl_wait(pcc_nccl_comm *comm, int64_t timeout_ms);
/* An in-place sum of `buffer` over the group on a stream of its own, after
 * the work enqueued so far (a gradient bucket that the backward pass has
 * completed), so it overlaps the compute enqueued next. */
int pcc_nccl_all_reduce_start(pcc_nccl_comm *comm, void *buffer,
                              int64_t count, int dtype);
/* The same for this rank's slice of the sum of `send` ([size,
 * count_per_rank]) into `recv` (in place when recv == send + rank *
 * count_per_rank elements). */
int pcc_nccl_reduce_scatter_start(pcc_nccl_comm *comm, const void *send,
                                  void *recv, int64_t count_per_rank,
                                  int dtype);
/* A started ncclAllGather on the same stream as the started sums. */
int pcc_nccl_all_gather_start(pcc_nccl_comm *comm, const void *send,
                              void *recv, int64_t count_per_rank, int dtype);
/* Completes the `count` oldest started collectives (later work on the
 * calls' stream waits for them; the host waits up to `timeout_ms`); the
 * later ones may still run. */
int pcc_nccl_wait_oldest(pcc_nccl_comm *comm, int64_t count,
                         int64_t timeout_ms);
/* Moves the communicator's calls to a stream of its own, so that its
 * transfers overlap the compute on the context's stream. The two are then
 * ordered only by the fences below. */
int pcc_nccl_own_stream(pcc_nccl_comm *comm);
/* Calls enqueued after this wait for the compute enqueued so far on the
 * context's stream (no-op without an own stream). */
int pcc_nccl_after_compute(pcc_nccl_comm *comm);
/* Compute enqueued on the context's stream after this waits for the calls
 * enqueued so far (no-op without an own stream). */
int pcc_nccl_before_compute(pcc_nccl_comm *comm);
/* ncclGroupStart / ncclGroupEnd: the sends and receives between them
 * progress together. */
int pcc_nccl_group_start(pcc_nccl_comm *comm);
int pcc_nccl_group_end(pcc_nccl_comm *comm);
/* A receive enqueued as pcc_nccl_recv, numbered among the posted ones; the
 * end of its group (or the call, outside a group) is marked with an event,
 * so that pcc_nccl_wait_receives waits for it and not for the transfers
 * enqueued after it. */
int pcc_nccl_recv_post(pcc_nccl_comm *comm, void *buffer, int64_t count,
                       int dtype, int peer);
/* Completes the `count` oldest posted receives still pending: compute
 * enqueued on the context's stream from now on reads them, and the host
 * waits for them up to timeout_ms (then the communicator is aborted). */
int pcc_nccl_wait_receives(pcc_nccl_comm *comm, int64_t count,
                           int64_t timeout_ms);
/* Undoes pcc_nccl_own_stream: compute enqueued from now on waits for the
 * calls enqueued so far, and later calls go to the context's stream again
 * (collectives ordered with compute). pcc_nccl_own_stream moves them back
 * to the same own stream. */
int pcc_nccl_join_stream(pcc_nccl_comm *comm);

#ifdef __cplusplus
}
#endif

#endif /* PCC_RUNTIME_ENGINES_H */
