/* LD_PRELOAD stand-in for the CUDA side of llmt-train's NCCL join
 * (examples/train_cli/nccl_comm.c), so that its failure paths run without a
 * GPU: contexts open on the CPU, rank 0's unique id is its pid's bytes (so a
 * rank that prints the same id as rank 0 received it over MPI), and
 * llmt_comm_create_nccl prints the id it was given and then does what
 * SHIM_MODE says:
 *   id_fails     rank 0's unique id fails (LLMT_ECUDA)
 *   create_fails rank SHIM_RANK fails to create, the others get a
 *                communicator of one (they then learn of the failure)
 *   stuck        rank SHIM_RANK fails, the others never return (as in
 *                NCCL's join when a peer never arrives)
 * Used by tests/tools/test_llmt_train_nccl_join.sh. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "llmt/llmt.h"

static int mode_is(const char *mode)
{
    const char *m = getenv("SHIM_MODE");
    return m && strcmp(m, mode) == 0;
}

int llmt_context_create(llmt_context **out, const llmt_context_config *cfg)
{
    typedef int (*create_fn)(llmt_context **, const llmt_context_config *);
    create_fn real = (create_fn)dlsym(RTLD_NEXT, "llmt_context_create");
    if (!real || !cfg)
        return LLMT_EINVAL;
    llmt_context_config cpu = *cfg;
    cpu.backend = LLMT_BACKEND_CPU;
    cpu.device = 0;
    return real(out, &cpu);
}

int llmt_comm_nccl_unique_id(llmt_context *ctx, uint8_t id[LLMT_COMM_NCCL_ID_BYTES])
{
    (void)ctx;
    if (mode_is("id_fails"))
        return llmt_error_set(LLMT_ECUDA, "shim: no unique id here");
    memset(id, 0, LLMT_COMM_NCCL_ID_BYTES);
    snprintf((char *)id, LLMT_COMM_NCCL_ID_BYTES, "id-of-pid-%ld", (long)getpid());
    return LLMT_OK;
}

/* A communicator of one rank: the collectives copy this rank's bytes. */
static int one_alltoallv(void *user, const void *send, const size_t *send_bytes,
                         const size_t *send_offsets, void *recv, const size_t *recv_bytes,
                         const size_t *recv_offsets)
{
    (void)user, (void)recv_bytes;
    memmove((char *)recv + recv_offsets[0], (const char *)send + send_offsets[0], send_bytes[0]);
    return 0;
}

static int one_allgatherv(void *user, const void *send, void *recv, const size_t *bytes,
                          const size_t *offsets)
{
    (void)user;
    memmove((char *)recv + offsets[0], send, bytes[0]);
    return 0;
}

static int one_broadcast(void *user, void *buf, size_t bytes, int32_t root)
{
    (void)user, (void)buf, (void)bytes, (void)root;
    return 0;
}

static int one_allreduce(void *user, int64_t *values, size_t count, int32_t op)
{
    (void)user, (void)values, (void)count, (void)op;
    return 0;
}

static int one_barrier(void *user)
{
    (void)user;
    return 0;
}

int llmt_comm_create_nccl(llmt_comm **out, llmt_context *ctx,
                          const uint8_t id[LLMT_COMM_NCCL_ID_BYTES], int32_t rank, int32_t size)
{
    (void)ctx;
    *out = NULL;
    fprintf(stderr, "shim: rank %d of %d was given %.*s\n", (int)rank, (int)size,
            (int)LLMT_COMM_NCCL_ID_BYTES, (const char *)id);
    const char *who = getenv("SHIM_RANK");
    if (who && atoi(who) == rank)
        return llmt_error_set(LLMT_ECUDA, "shim: ncclCommInitRank failed on this rank");
    if (mode_is("stuck"))
        for (;;)
            pause();
    llmt_comm_ops one;
    llmt_comm_ops_init(&one);
    one.alltoallv = one_alltoallv, one.allgatherv = one_allgatherv;
    one.broadcast = one_broadcast, one.allreduce_i64 = one_allreduce, one.barrier = one_barrier;
    return llmt_comm_create(out, &one); /* freed unused: another rank failed */
}
