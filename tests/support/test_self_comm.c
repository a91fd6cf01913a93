/* A communicator of one process for tests (test_self_comm.h). */
#include <string.h>

#include "test_self_comm.h"

static int self_alltoallv(void *user, const void *send, const size_t *send_bytes,
                          const size_t *send_offsets, void *recv, const size_t *recv_bytes,
                          const size_t *recv_offsets)
{
    (void)user;
    if (send_bytes[0] != recv_bytes[0])
        return 1;
    memmove((char *)recv + recv_offsets[0], (const char *)send + send_offsets[0], send_bytes[0]);
    return 0;
}

static int self_allgatherv(void *user, const void *send, void *recv, const size_t *bytes,
                           const size_t *offsets)
{
    (void)user;
    memmove((char *)recv + offsets[0], send, bytes[0]);
    return 0;
}

static int self_broadcast(void *user, void *buf, size_t bytes, int32_t root)
{
    (void)user, (void)buf, (void)bytes;
    return root != 0;
}

static int self_allreduce_i64(void *user, int64_t *values, size_t count, int32_t op)
{
    (void)user, (void)values, (void)count, (void)op;
    return 0;
}

static int self_barrier(void *user)
{
    (void)user;
    return 0;
}

llmt_comm *test_self_comm(void)
{
    llmt_comm_ops ops = LLMT_COMM_OPS_INIT;
    ops.alltoallv = self_alltoallv;
    ops.allgatherv = self_allgatherv;
    ops.broadcast = self_broadcast;
    ops.allreduce_i64 = self_allreduce_i64;
    ops.barrier = self_barrier;
    llmt_comm *comm = NULL;
    return llmt_comm_create(&comm, &ops) == LLMT_OK ? comm : NULL;
}
