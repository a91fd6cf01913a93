/* llmt_context: creation, accounting queries and the root random stream. */
#include <dlfcn.h>
#include <omp.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "core/context_internal.h"
#include "core/error.h"
#include "core/rng.h"

#define LLMT_MAX_THREADS 1024

void llmt_context_config_init(llmt_context_config *cfg)
{
    if (cfg) {
        const llmt_context_config defaults = LLMT_CONTEXT_CONFIG_INIT;
        *cfg = defaults;
    }
}

const char *llmt_mem_category_name(int category)
{
    static const char *const names[LLMT_MEM_CATEGORY_COUNT] = {
        "params", "grads", "optimizer", "activations", "workspace", "staging", "host_state"};
    return (category >= 0 && category < LLMT_MEM_CATEGORY_COUNT) ? names[category] : "?";
}

static int validate_config(const llmt_context_config *cfg)
{
    if (cfg->version != 1 && cfg->version != LLMT_CONTEXT_CONFIG_VERSION)
        return llmt_fail(LLMT_EVERSION,
                         "llmt_context_create: cfg->version = %u, this library knows 1..%u",
                         cfg->version, LLMT_CONTEXT_CONFIG_VERSION);
    if (cfg->backend != LLMT_BACKEND_CPU && cfg->backend != LLMT_BACKEND_CUDA)
        return llmt_fail(LLMT_EINVAL, "llmt_context_create: cfg->backend = %d is not a backend",
                         cfg->backend);
    if (cfg->device < 0 || (cfg->backend == LLMT_BACKEND_CPU && cfg->device != 0))
        return llmt_fail(LLMT_EINVAL,
                         "llmt_context_create: cfg->device = %d (must be 0 on the CPU, >= 0 on "
                         "CUDA)",
                         cfg->device);
    if (cfg->num_threads < 0 || cfg->num_threads > LLMT_MAX_THREADS)
        return llmt_fail(LLMT_EINVAL, "llmt_context_create: cfg->num_threads = %d (0..%d)",
                         cfg->num_threads, LLMT_MAX_THREADS);
    return LLMT_OK;
}

int llmt_context_create(llmt_context **out, const llmt_context_config *cfg)
{
    if (!out)
        return llmt_fail(LLMT_EINVAL, "llmt_context_create: out is NULL");
    *out = NULL;
    const llmt_context_config defaults = LLMT_CONTEXT_CONFIG_INIT;
    if (!cfg)
        cfg = &defaults;
    int rc = validate_config(cfg);
    if (rc)
        return rc;
    /* A version 1 struct ends before host_memory_budget: read only its fields. */
    llmt_context_config full = defaults;
    memcpy(&full, cfg,
           cfg->version == 1 ? offsetof(llmt_context_config, host_memory_budget) : sizeof full);
    full.version = LLMT_CONTEXT_CONFIG_VERSION;
    cfg = &full;

    llmt_context *ctx = calloc(1, sizeof *ctx);
    if (!ctx)
        return llmt_fail(LLMT_ENOMEM, "llmt_context_create: out of host memory");
    ctx->cfg = *cfg;
    ctx->num_threads = cfg->num_threads ? cfg->num_threads : omp_get_max_threads();
    ctx->budget = cfg->memory_budget;
    ctx->host_budget = cfg->host_memory_budget;
    ctx->rng.seed = cfg->seed;
    ctx->rng.stream = LLMT_STREAM_ROOT;
    pthread_mutex_init(&ctx->mem_lock, NULL);

    if (cfg->backend == LLMT_BACKEND_CPU)
        rc = llmt_cpu_backend_create(ctx->num_threads, &ctx->backend);
    else
        rc = llmt_cuda_plugin_load(ctx, cfg->device, ctx->num_threads);
    if (rc) {
        llmt_context_free(ctx);
        return rc;
    }
    *out = ctx;
    return LLMT_OK;
}

void llmt_context_free(llmt_context *ctx)
{
    if (!ctx)
        return;
    if (ctx->backend)
        ctx->backend->ops->destroy(ctx->backend);
    if (ctx->plugin_handle)
        dlclose(ctx->plugin_handle); /* opened RTLD_NODELETE: stays mapped */
    pthread_mutex_destroy(&ctx->mem_lock);
    free(ctx);
}

int llmt_context_backend(const llmt_context *ctx)
{
    return ctx ? ctx->cfg.backend : -1;
}

int llmt_context_num_threads(const llmt_context *ctx)
{
    return ctx ? ctx->num_threads : -1;
}

int llmt_context_memory_stats(const llmt_context *ctx, llmt_memory_stats *out)
{
    if (!ctx)
        return llmt_fail(LLMT_EINVAL, "llmt_context_memory_stats: ctx is NULL");
    if (!out)
        return llmt_fail(LLMT_EINVAL, "llmt_context_memory_stats: out is NULL");
    if (out->version != 1 && out->version != LLMT_MEMORY_STATS_VERSION)
        return llmt_fail(LLMT_EVERSION,
                         "llmt_context_memory_stats: out->version = %u, this library knows 1..%u",
                         out->version, LLMT_MEMORY_STATS_VERSION);
    uint64_t total = 0, free_now = 0;
    int rc = ctx->backend->ops->mem_info(ctx->backend, &total, &free_now);
    if (rc)
        return rc;

    llmt_memory_stats s;
    llmt_context *mut = (llmt_context *)ctx; /* the lock, not the state, changes */
    pthread_mutex_lock(&mut->mem_lock);
    memset(&s, 0, sizeof s);
    s.version = out->version;
    s.category_count = LLMT_MEM_CATEGORY_COUNT;
    memcpy(s.current, ctx->current, sizeof s.current);
    memcpy(s.peak, ctx->peak, sizeof s.peak);
    s.total_current = ctx->total_current;
    s.total_peak = ctx->total_peak;
    s.budget = ctx->budget;
    s.host_budget = ctx->host_budget;
    pthread_mutex_unlock(&mut->mem_lock);
    s.device_total = total;
    s.device_free = free_now;
    /* A version 1 struct ends before host_budget. */
    memcpy(out, &s, out->version == 1 ? offsetof(llmt_memory_stats, host_budget) : sizeof s);
    return LLMT_OK;
}

int llmt_context_reset_peak(llmt_context *ctx)
{
    if (!ctx)
        return llmt_fail(LLMT_EINVAL, "llmt_context_reset_peak: ctx is NULL");
    pthread_mutex_lock(&ctx->mem_lock);
    memcpy(ctx->peak, ctx->current, sizeof ctx->peak);
    ctx->total_peak = ctx->total_current;
    pthread_mutex_unlock(&ctx->mem_lock);
    return LLMT_OK;
}

int llmt_context_set_budget(llmt_context *ctx, uint64_t budget)
{
    if (!ctx)
        return llmt_fail(LLMT_EINVAL, "llmt_context_set_budget: ctx is NULL");
    pthread_mutex_lock(&ctx->mem_lock);
    uint64_t in_use = ctx->total_current;
    int ok = budget == 0 || budget >= in_use;
    if (ok)
        ctx->budget = budget;
    pthread_mutex_unlock(&ctx->mem_lock);
    if (!ok)
        return llmt_fail(LLMT_EINVAL,
                         "llmt_context_set_budget: budget = %llu bytes is below the %llu in use",
                         (unsigned long long)budget, (unsigned long long)in_use);
    return LLMT_OK;
}

int llmt_context_set_host_budget(llmt_context *ctx, uint64_t budget)
{
    if (!ctx)
        return llmt_fail(LLMT_EINVAL, "llmt_context_set_host_budget: ctx is NULL");
    pthread_mutex_lock(&ctx->mem_lock);
    uint64_t in_use = ctx->current[LLMT_MEM_HOST_STATE];
    int ok = budget == 0 || budget >= in_use;
    if (ok)
        ctx->host_budget = budget;
    pthread_mutex_unlock(&ctx->mem_lock);
    if (!ok)
        return llmt_fail(LLMT_EINVAL,
                         "llmt_context_set_host_budget: budget = %llu bytes is below the %llu "
                         "host_state bytes in use",
                         (unsigned long long)budget, (unsigned long long)in_use);
    return LLMT_OK;
}

int llmt_context_rng_get(const llmt_context *ctx, llmt_rng_state *out)
{
    if (!ctx || !out)
        return llmt_fail(LLMT_EINVAL, "llmt_context_rng_get: %s is NULL", ctx ? "out" : "ctx");
    *out = ctx->rng;
    return LLMT_OK;
}

int llmt_context_rng_set(llmt_context *ctx, const llmt_rng_state *state)
{
    if (!ctx || !state)
        return llmt_fail(LLMT_EINVAL, "llmt_context_rng_set: %s is NULL", ctx ? "state" : "ctx");
    ctx->rng = *state;
    return LLMT_OK;
}

int llmt_context_rng_uniform(llmt_context *ctx, float *out, size_t n)
{
    if (!ctx || (!out && n))
        return llmt_fail(LLMT_EINVAL, "llmt_context_rng_uniform: %s is NULL",
                         ctx ? "out" : "ctx");
    llmt_rng_fill_uniform(&ctx->rng, out, n);
    return LLMT_OK;
}
