/* The NCCL engine of the CUDA plugin (cuda/comm_nccl.cu) as libllmt reaches
 * it (lib/dist/comm_nccl.c): the plugin's fourth exported symbol hands out
 * this table, the way lib/core/cuda_plugin_info.h reaches the second. The
 * plugin dlopens libnccl.so.2 on first use, so neither the plugin nor
 * libllmt links NCCL. Not public API. */
#ifndef LLMT_DIST_COMM_NCCL_PLUGIN_H
#define LLMT_DIST_COMM_NCCL_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#include "llmt/comm.h"
#include "ops/ops.h"

#define LLMT_CUDA_PLUGIN_NCCL "llmt_plugin_cuda_nccl"
/* Bumped whenever llmt_nccl_api changes. */
#define LLMT_NCCL_API_VERSION 2
/* Bytes of an NCCL unique id (NCCL_UNIQUE_ID_BYTES). */
#define LLMT_NCCL_ID_BYTES 128
/* Seconds a collective may take before the engine aborts the communicator. */
#define LLMT_NCCL_TIMEOUT_S 600

typedef struct llmt_nccl_api {
    /* Writes a new unique id (no device needed). LLMT_ECUDA naming the
     * reason when libnccl.so.2 cannot be loaded or NCCL fails. */
    int (*unique_id)(const llmt_plugin_host *host, uint8_t *id);
    /* Joins the communicator of id as rank of size on dev (a CUDA backend):
     * blocks until every rank has joined. Fills ops (rank, size, user and
     * the five collectives, on dev's memory and stream); the collectives set
     * their own message on failure. LLMT_ECUDA naming the reason. */
    int (*create)(llmt_device *dev, const uint8_t *id, int32_t rank, int32_t size,
                  llmt_comm_ops *ops);
    /* Releases what create made (ops->user). */
    void (*destroy)(void *user);
    /* The overlapped reduction (user: ops->user). alltoallv_add queues on
     * the engine's stream, after every op queued on dev's stream before the
     * call, the alltoallv of the arguments (device memory only) and then,
     * for each rank i in order with recv_bytes[i] > 0 (each n elements of
     * dtype dt), sum[0, n) += recv + recv_offsets[i] in fp32; it returns
     * without waiting, and none of its buffers may be touched until a join.
     * join makes ops queued later on dev's stream wait for all of it; the
     * host does not wait. A failure in the queued work surfaces in the next
     * collective's (bounded) wait. A failure of either call aborts the
     * communicator: nothing it queued is then ordered before later ops, and
     * none of it may be used. */
    int (*alltoallv_add)(void *user, const void *send, const size_t *send_bytes,
                         const size_t *send_offsets, void *recv, const size_t *recv_bytes,
                         const size_t *recv_offsets, float *sum, int64_t n, int dt);
    int (*join)(void *user);
} llmt_nccl_api;

/* The plugin's function: LLMT_EVERSION when host->abi or version differs
 * from the plugin's; LLMT_EUNSUPPORTED (with a message) when the plugin was
 * built without nccl.h; else writes the table, which lives as long as the
 * process. */
typedef int (*llmt_plugin_nccl_fn)(const llmt_plugin_host *host, uint32_t version,
                                   const llmt_nccl_api **out);

#endif
