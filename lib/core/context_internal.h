/* The context's internals, shared by the library's modules. */
#ifndef LLMT_CORE_CONTEXT_INTERNAL_H
#define LLMT_CORE_CONTEXT_INTERNAL_H

#include <pthread.h>

#include "llmt/context.h"
#include "ops/ops.h"

struct llmt_context {
    llmt_context_config cfg;
    llmt_device *backend;
    void *plugin_handle; /* dlopen handle of the CUDA plugin, NULL on the CPU */
    int num_threads;

    /* Accounting. Guarded by mem_lock: an async checkpoint writer frees its
     * staging buffer from its own thread. */
    pthread_mutex_t mem_lock;
    uint64_t current[LLMT_MEM_CATEGORY_SLOTS];
    uint64_t peak[LLMT_MEM_CATEGORY_SLOTS];
    uint64_t total_current; /* every category but LLMT_MEM_HOST_STATE */
    uint64_t total_peak;
    uint64_t budget;
    uint64_t host_budget;   /* of LLMT_MEM_HOST_STATE alone; 0: none */

    llmt_rng_state rng; /* root stream */
};

/* The backend's op table. */
static inline const llmt_backend_ops *llmt_ops(const llmt_context *ctx)
{
    return ctx->backend->ops;
}

/* Loads the CUDA plugin and opens device `device` (lib/core/cuda_plugin.c). */
int llmt_cuda_plugin_load(llmt_context *ctx, int device, int num_threads);

#endif
