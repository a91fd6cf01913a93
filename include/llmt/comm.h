/* llmt_comm: the ranks of a data-parallel run, as seen by the library.
 *
 * The library does no rendezvous and reads no environment variable: the
 * host program starts the ranks (mpirun, srun, its own launcher) and hands
 * the library a table of byte-moving collectives that an existing engine
 * implements. llmt/comm_mpi.h fills the table from an MPI communicator in
 * the host's own code, so no MPI type crosses this ABI.
 *
 * Every collective is called by all ranks in the same order with agreeing
 * sizes. The library keeps each call under 2^31 bytes in every count and
 * offset (it splits larger exchanges into windows), so an engine whose
 * counts are C ints needs no large-count support. Buffers are host memory
 * (device memory for an NCCL communicator: llmt_comm_create_nccl).
 *
 * A callback returns 0 on success; anything else is a failure of the
 * engine, reported by the library as LLMT_ECOMM naming the collective and
 * the rank. Engines that abort the job on a dead peer (MPI's default) never
 * return in that case; see docs/distributed.md. */
#ifndef LLMT_COMM_H
#define LLMT_COMM_H

#include "llmt/common.h"
#include "llmt/context.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct llmt_comm llmt_comm;

/* Reductions of allreduce_i64. */
typedef enum llmt_comm_op {
    LLMT_COMM_SUM = 0,
    LLMT_COMM_MAX = 1
} llmt_comm_op;

#define LLMT_COMM_OPS_VERSION 1
/* The collectives of one engine. All are required. */
typedef struct llmt_comm_ops {
    uint32_t version; /* LLMT_COMM_OPS_VERSION */
    int32_t rank;     /* this process, in [0, size) */
    int32_t size;     /* ranks in the run, >= 1 */
    void *user;       /* passed to every callback */
    /* To each rank i: send_bytes[i] bytes at send + send_offsets[i]; from
     * each rank i: recv_bytes[i] bytes into recv + recv_offsets[i]. */
    int (*alltoallv)(void *user, const void *send, const size_t *send_bytes,
                     const size_t *send_offsets, void *recv, const size_t *recv_bytes,
                     const size_t *recv_offsets);
    /* Every rank i contributes bytes[i] bytes from its send, which land at
     * recv + offsets[i] on every rank. send == recv + offsets[rank] means in
     * place (MPI_IN_PLACE). */
    int (*allgatherv)(void *user, const void *send, void *recv, const size_t *bytes,
                      const size_t *offsets);
    /* bytes at buf on root replace buf on every other rank. */
    int (*broadcast)(void *user, void *buf, size_t bytes, int32_t root);
    /* values[0..count) of every rank reduced with op (llmt_comm_op), in place. */
    int (*allreduce_i64)(void *user, int64_t *values, size_t count, int32_t op);
    /* Returns when every rank has called it. */
    int (*barrier)(void *user);
} llmt_comm_ops;

#define LLMT_COMM_OPS_INIT {LLMT_COMM_OPS_VERSION, 0, 1, 0, 0, 0, 0, 0, 0}

/* Fills ops with LLMT_COMM_OPS_INIT (rank 0 of 1, no callbacks). */
LLMT_API void llmt_comm_ops_init(llmt_comm_ops *ops);

/* Creates a communicator over an engine's table (copied; ops->user must
 * outlive the communicator). Collective: every rank calls it, and the ranks
 * check that they agree on the size and hold distinct ranks (LLMT_ECOMM
 * naming the ranks that do not). Errors: LLMT_EINVAL naming the field,
 * LLMT_EVERSION. */
LLMT_API int llmt_comm_create(llmt_comm **out, const llmt_comm_ops *ops);

/* Releases a communicator; NULL accepted. Not collective, except for an
 * NCCL communicator (llmt_comm_create_nccl), whose release is. */
LLMT_API void llmt_comm_free(llmt_comm *comm);

/* This process's rank; -1 for NULL. */
LLMT_API int32_t llmt_comm_rank(const llmt_comm *comm);

/* The number of ranks; -1 for NULL. */
LLMT_API int32_t llmt_comm_size(const llmt_comm *comm);

/* Bytes this process has sent through the communicator's collectives
 * (payload only, excluding what a rank sends to itself); -1 for NULL. */
LLMT_API int64_t llmt_comm_bytes_sent(const llmt_comm *comm);

/* Collective: fails with LLMT_ECOMM on every rank unless all ranks pass the
 * same value; the message names `what` and the first rank that differs
 * from rank 0. Use it to check that configurations agree (a hash). */
LLMT_API int llmt_comm_check_same(llmt_comm *comm, const char *what, uint64_t value);

/* Collective: every rank passes its own status (0 or an LLMT_E* code) and
 * receives LLMT_OK when all ranks passed 0; otherwise every rank gets
 * LLMT_ECOMM naming the lowest failed rank (the failing rank keeps its own
 * status and message). Call it before a collective that a failure on one
 * rank would leave the others waiting in. */
LLMT_API int llmt_comm_agree(llmt_comm *comm, int status);

/* NCCL on the CUDA backend: the CUDA plugin dlopens libnccl.so.2 (its
 * RUNPATH holds the directory of the NCCL found at build time) and runs
 * the collectives above on device memory of the context's device, on a
 * stream of its own that first waits for the work queued on the context's
 * stream, each waited for (at most 600 s; past that, or on an
 * asynchronous NCCL error, the communicator is aborted and every later
 * collective fails with LLMT_ECOMM; so does any other failure of a
 * collective, this rank's calls being out of step with the others' after
 * it). Host buffers are accepted too (staged through the device), so
 * llmt_comm_check_same and llmt_comm_agree work on it. Its release
 * (llmt_comm_free) is collective: every rank's waits at most 60 s for the
 * others' before NCCL's ncclCommDestroy, which waits without a bound for
 * the other ranks on the node to release theirs; a release the others do
 * not match in time (a rank died, or never releases) aborts the
 * communicator instead (ncclCommAbort, which itself may wait for a live
 * peer in some NCCL versions: docs/distributed.md), and a release after a
 * failure (the communicator already aborted) waits for no rank. See
 * docs/distributed.md. */

/* Bytes of an NCCL unique id. */
#define LLMT_COMM_NCCL_ID_BYTES 128

/* Writes a new NCCL unique id to id (LLMT_COMM_NCCL_ID_BYTES bytes). Rank 0
 * calls it and the host hands the bytes to every rank (MPI_Bcast, a file,
 * its own launcher). Errors: LLMT_EINVAL for NULL, LLMT_EUNSUPPORTED
 * naming the backend when ctx is not on CUDA (or the plugin was built
 * without NCCL), LLMT_ECUDA with the reason when libnccl.so.2 cannot be
 * loaded or NCCL fails. */
LLMT_API int llmt_comm_nccl_unique_id(llmt_context *ctx, uint8_t id[LLMT_COMM_NCCL_ID_BYTES]);

/* Creates a communicator over NCCL for rank of size ranks, one device per
 * rank: ctx's. Collective: every rank calls it with the same id and size,
 * and it returns when all have joined (NCCL's own wait, no library
 * timeout); then the ranks check they agree as llmt_comm_create does. The
 * communicator borrows ctx: free it before the context. Errors: as
 * llmt_comm_nccl_unique_id, LLMT_EINVAL naming rank and size when not
 * 0 <= rank < size, LLMT_ECOMM when the ranks disagree. */
LLMT_API int llmt_comm_create_nccl(llmt_comm **out, llmt_context *ctx, const uint8_t id[LLMT_COMM_NCCL_ID_BYTES], int32_t rank, int32_t size);

#ifdef __cplusplus
}
#endif

#endif
