/* The communicator inside the library: checked wrappers around the host's
 * collectives, and the windowed exchanges the data-parallel code builds on. */
#ifndef LLMT_DIST_COMM_INTERNAL_H
#define LLMT_DIST_COMM_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "llmt/comm.h"

/* Largest byte count or offset handed to one engine call (a C int holds it). */
#define LLMT_COMM_CALL_MAX ((size_t)1 << 30)

struct llmt_comm {
    llmt_comm_ops ops;
    int64_t bytes_sent;
    /* Scratch of the collectives, allocated once so that no rank can fail
     * to allocate between two collectives: 4 x size counts and offsets, and
     * size values (one thread at a time uses a communicator). */
    size_t *counts;
    uint64_t *values;
    /* An engine the library made (the CUDA plugin's NCCL engine), released
     * with the communicator; such an engine sets llmt_error_last() itself
     * when a collective fails. NULL for a host's table. */
    void (*engine_free)(void *user);
    /* The device whose memory the collectives take, on its context's
     * stream (NCCL: the context it was made on); host buffers still work,
     * staged by the engine. NULL: host memory (a host's table). */
    const struct llmt_device *device;
    /* The overlapped reduction of an engine that has one (the NCCL
     * engine's, lib/dist/comm_nccl_plugin.h); both NULL otherwise. */
    int (*alltoallv_add)(void *user, const void *send, const size_t *send_bytes,
                         const size_t *send_offsets, void *recv, const size_t *recv_bytes,
                         const size_t *recv_offsets, float *sum, int64_t n, int dt);
    int (*join)(void *user);
};

/* Makes the communicator over a checked table: runs the membership check
 * (collective) and, on any failure, releases the engine with engine_free
 * (may be NULL) before returning. */
int llmt_comm_adopt(llmt_comm **out, const llmt_comm_ops *ops, void (*engine_free)(void *user),
                    const struct llmt_device *device);

/* Each wrapper calls the engine and turns its failure into LLMT_ECOMM
 * naming `what` and this rank; counts at or over LLMT_COMM_CALL_MAX are a
 * bug of the caller (LLMT_EINVAL). */
int llmt_comm_alltoallv(llmt_comm *c, const char *what, const void *send, const size_t *send_bytes,
                        const size_t *send_offsets, void *recv, const size_t *recv_bytes,
                        const size_t *recv_offsets);
int llmt_comm_allgatherv(llmt_comm *c, const char *what, const void *send, void *recv,
                         const size_t *bytes, const size_t *offsets);
/* The engine's alltoallv_add (c->alltoallv_add not NULL): the exchange
 * of llmt_comm_alltoallv and the sum of the received pieces, queued, not
 * waited for; llmt_comm_join then orders the device's later ops after it.
 * Failures as llmt_comm_alltoallv's. */
int llmt_comm_alltoallv_add(llmt_comm *c, const char *what, const void *send,
                            const size_t *send_bytes, const size_t *send_offsets, void *recv,
                            const size_t *recv_bytes, const size_t *recv_offsets, float *sum,
                            int64_t n, int dt);
int llmt_comm_join(llmt_comm *c, const char *what);
int llmt_comm_broadcast(llmt_comm *c, const char *what, void *buf, size_t bytes, int32_t root);
int llmt_comm_allreduce_i64(llmt_comm *c, const char *what, int64_t *values, size_t count, int op);

/* llmt_comm_broadcast of any size, in windows under the per-call limit. */
int llmt_comm_broadcast_all(llmt_comm *c, const char *what, void *buf, size_t bytes, int32_t root);

/* llmt_comm_agree that also gives the lowest failed rank's status in
 * *failed_status (LLMT_OK when none failed). */
int llmt_comm_agree_code(llmt_comm *c, int status, int *failed_status);

/* In-place all-gather of one item of item_bytes per rank: rank i's at buf +
 * i x item_bytes (its own there before the call, every rank's after). */
int llmt_comm_allgather_items(llmt_comm *c, const char *what, void *buf, size_t item_bytes);

/* In-place all-gather of a flat buffer of elem_size-byte elements of which
 * rank i holds [bounds[i], bounds[i + 1]) (bounds has size + 1 entries,
 * non-decreasing): afterwards every rank holds all of [bounds[0],
 * bounds[size]). Runs in windows so no call passes LLMT_COMM_CALL_MAX. */
int llmt_comm_allgather_ranges(llmt_comm *c, const char *what, void *buf, size_t elem_size,
                               const int64_t *bounds);

#endif
