/* llmt_context: the backend and device, the thread count, the accounted
 * allocator with its optional budget, and the root random stream.
 *
 * Every byte the library allocates for tensors goes through a context and is
 * tagged with a category; the context keeps current and peak bytes per
 * category and refuses an allocation that would pass its budget with
 * LLMT_ENOMEM, as a real device would. */
#ifndef LLMT_CONTEXT_H
#define LLMT_CONTEXT_H

#include "llmt/common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct llmt_context llmt_context;

typedef enum llmt_backend {
    LLMT_BACKEND_CPU = 0,
    LLMT_BACKEND_CUDA = 1
} llmt_backend;

/* Categories every allocation is tagged with. */
typedef enum llmt_mem_category {
    LLMT_MEM_PARAMS = 0,      /* model weights in the compute dtype */
    LLMT_MEM_GRADS = 1,       /* parameter gradients */
    LLMT_MEM_OPTIMIZER = 2,   /* optimizer moments and fp32 master weights */
    LLMT_MEM_ACTIVATIONS = 3, /* activations kept for backward */
    LLMT_MEM_WORKSPACE = 4,   /* scratch buffers of the ops */
    LLMT_MEM_STAGING = 5,     /* host copies for checkpoints and transfers */
    /* Training state held in host memory on behalf of the device (offloaded
     * optimizer state and its transfer staging, offloaded gradients, and an
     * ordered slicer's sum of them). Charged to the host budget, not to the
     * budget, total_current or total_peak. */
    LLMT_MEM_HOST_STATE = 6,
    LLMT_MEM_CATEGORY_COUNT = 7
} llmt_mem_category;

/* Room in llmt_memory_stats for categories added later. */
#define LLMT_MEM_CATEGORY_SLOTS 8

/* Name of a category ("params", "grads", ...), or "?" for an unknown one. */
LLMT_API const char *llmt_mem_category_name(int category);

#define LLMT_CONTEXT_CONFIG_VERSION 2

typedef struct llmt_context_config {
    uint32_t version;       /* LLMT_CONTEXT_CONFIG_VERSION (1 is still accepted) */
    int32_t backend;        /* llmt_backend; default LLMT_BACKEND_CPU */
    int32_t device;         /* device index for CUDA; 0 for the CPU */
    int32_t num_threads;    /* CPU threads for the ops; 0 means all online cores */
    uint64_t memory_budget; /* bytes the context may allocate (every category but
                               host_state); 0 means no budget */
    uint64_t seed;          /* seed of the root random stream */
    /* Version 2: */
    uint64_t host_memory_budget; /* bytes of LLMT_MEM_HOST_STATE; 0 means no budget */
} llmt_context_config;

#define LLMT_CONTEXT_CONFIG_INIT {LLMT_CONTEXT_CONFIG_VERSION, LLMT_BACKEND_CPU, 0, 0, 0, 0, 0}

/* Fills cfg with the defaults of LLMT_CONTEXT_CONFIG_INIT. */
LLMT_API void llmt_context_config_init(llmt_context_config *cfg);

/* Creates a context; cfg NULL means LLMT_CONTEXT_CONFIG_INIT (the CPU, all
 * online cores, no budget, seed 0). Errors: LLMT_EINVAL (out-of-range field),
 * LLMT_EVERSION (unknown cfg->version), LLMT_EUNSUPPORTED (CUDA asked for in a
 * build without it), LLMT_ECUDA (no usable device). The context is the
 * caller's; release it with llmt_context_free after every object made from it. */
LLMT_API int llmt_context_create(llmt_context **out, const llmt_context_config *cfg);

/* Releases a context; NULL is accepted. */
LLMT_API void llmt_context_free(llmt_context *ctx);

/* The backend the context runs on (llmt_backend), or -1 for NULL. */
LLMT_API int llmt_context_backend(const llmt_context *ctx);

/* The number of CPU threads the context's ops use, or -1 for NULL. */
LLMT_API int llmt_context_num_threads(const llmt_context *ctx);

#define LLMT_MEMORY_STATS_VERSION 2

/* Device-side totals (total_current, total_peak, budget) count every category
 * but LLMT_MEM_HOST_STATE, which has its own budget (host_budget). */
typedef struct llmt_memory_stats {
    uint32_t version;                          /* set by the caller: LLMT_MEMORY_STATS_VERSION
                                                  (1 is still accepted) */
    uint32_t category_count;                   /* categories filled in (LLMT_MEM_CATEGORY_COUNT) */
    uint64_t current[LLMT_MEM_CATEGORY_SLOTS]; /* bytes allocated now, per category */
    uint64_t peak[LLMT_MEM_CATEGORY_SLOTS];    /* most bytes allocated at once, per category */
    uint64_t total_current;                    /* sum of current but host_state */
    uint64_t total_peak;                       /* most bytes allocated at once in all
                                                  but host_state */
    uint64_t budget;                           /* the budget, 0 when none */
    uint64_t device_total;                     /* device memory in all, 0 when unknown */
    uint64_t device_free;                      /* device memory free now, 0 when unknown */
    /* Version 2: */
    uint64_t host_budget;                      /* the host_state budget, 0 when none */
} llmt_memory_stats;

#define LLMT_MEMORY_STATS_INIT {LLMT_MEMORY_STATS_VERSION, 0, {0}, {0}, 0, 0, 0, 0, 0, 0}

/* Fills *out (whose version the caller has set) with the context's
 * accounting. Errors: LLMT_EINVAL, LLMT_EVERSION. */
LLMT_API int llmt_context_memory_stats(const llmt_context *ctx, llmt_memory_stats *out);

/* Sets every peak to the current value, so the next peak measures what follows. */
LLMT_API int llmt_context_reset_peak(llmt_context *ctx);

/* Changes the budget (bytes; 0 for none). A budget below what is allocated now
 * is refused with LLMT_EINVAL. */
LLMT_API int llmt_context_set_budget(llmt_context *ctx, uint64_t budget);

/* Changes the host budget: the bytes of LLMT_MEM_HOST_STATE the context may
 * hold (0 for none). A budget below what host_state holds now is refused with
 * LLMT_EINVAL. */
LLMT_API int llmt_context_set_host_budget(llmt_context *ctx, uint64_t budget);

/* Position of a counter-based random stream (Philox4x32-10): the stream is
 * identified by (seed, stream) and `offset` counts the 32-bit values drawn.
 * Saving and restoring these three numbers reproduces every later draw. */
typedef struct llmt_rng_state {
    uint64_t seed;
    uint64_t stream;
    uint64_t offset;
} llmt_rng_state;

/* Reads the state of the context's root random stream. */
LLMT_API int llmt_context_rng_get(const llmt_context *ctx, llmt_rng_state *out);

/* Restores the state of the context's root random stream. */
LLMT_API int llmt_context_rng_set(llmt_context *ctx, const llmt_rng_state *state);

/* Draws n uniform floats in [0, 1) from the context's root stream into a
 * caller buffer of n floats. */
LLMT_API int llmt_context_rng_uniform(llmt_context *ctx, float *out, size_t n);

#ifdef __cplusplus
}
#endif

#endif
