/* The accounted allocator: per-category current and peak bytes, and the budget. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "core/buffer.h"
#include "core/context_internal.h"
#include "core/error.h"

/* Formats the per-category use into buf, for budget messages. */
static void describe_use(const llmt_context *ctx, char *buf, size_t cap)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int c = 0; c < LLMT_MEM_CATEGORY_COUNT && used < cap; c++) {
        int n = snprintf(buf + used, cap - used, "%s%s %" PRIu64, c ? ", " : "",
                         llmt_mem_category_name(c), ctx->current[c]);
        if (n < 0)
            break;
        used += (size_t)n;
    }
}

int llmt_buf_alloc(llmt_context *ctx, llmt_buf *b, int category, size_t bytes, const char *what)
{
    memset(b, 0, sizeof *b);
    b->category = category;
    if (category < 0 || category >= LLMT_MEM_CATEGORY_COUNT)
        return llmt_fail(LLMT_EINVAL, "allocation of %s: unknown memory category %d", what,
                         category);
    if (bytes == 0)
        return LLMT_OK;

    /* HOST_STATE has its own budget and stays out of the device-side totals. */
    int host = category == LLMT_MEM_HOST_STATE;
    pthread_mutex_lock(&ctx->mem_lock);
    uint64_t limit = host ? ctx->host_budget : ctx->budget;
    uint64_t used = host ? ctx->current[LLMT_MEM_HOST_STATE] : ctx->total_current;
    if (limit && (bytes > limit || used > limit - bytes)) {
        char use[256];
        describe_use(ctx, use, sizeof use);
        int rc = llmt_fail(LLMT_ENOMEM,
                           "allocation of %zu bytes for %s (%s) refused: %s %" PRIu64
                           " bytes, %" PRIu64 " in use (%s)",
                           bytes, llmt_mem_category_name(category), what,
                           host ? "host budget" : "budget", limit, used, use);
        pthread_mutex_unlock(&ctx->mem_lock);
        return rc;
    }
    /* Charge before allocating so a concurrent allocation sees the budget used. */
    ctx->current[category] += bytes;
    if (!host)
        ctx->total_current += bytes;
    pthread_mutex_unlock(&ctx->mem_lock);

    void *ptr = NULL;
    const llmt_backend_ops *ops = llmt_ops(ctx);
    int rc = llmt_buf_is_host(category) && ops->host_alloc
                 ? ops->host_alloc(ctx->backend, bytes, &ptr)
                 : ops->mem_alloc(ctx->backend, bytes, &ptr);

    pthread_mutex_lock(&ctx->mem_lock);
    if (rc != LLMT_OK) {
        ctx->current[category] -= bytes;
        if (!host)
            ctx->total_current -= bytes;
    } else {
        if (ctx->current[category] > ctx->peak[category])
            ctx->peak[category] = ctx->current[category];
        if (!host && ctx->total_current > ctx->total_peak)
            ctx->total_peak = ctx->total_current;
    }
    pthread_mutex_unlock(&ctx->mem_lock);
    if (rc != LLMT_OK)
        return llmt_fail_prefix(rc, "allocation of %zu bytes for %s (%s)", bytes,
                                llmt_mem_category_name(category), what);
    b->ptr = ptr;
    b->bytes = bytes;
    return LLMT_OK;
}

void llmt_buf_free(llmt_context *ctx, llmt_buf *b)
{
    if (!b || b->bytes == 0) {
        if (b)
            memset(b, 0, sizeof *b);
        return;
    }
    const llmt_backend_ops *ops = llmt_ops(ctx);
    if (llmt_buf_is_host(b->category) && ops->host_free)
        ops->host_free(ctx->backend, b->ptr);
    else
        ops->mem_free(ctx->backend, b->ptr);
    pthread_mutex_lock(&ctx->mem_lock);
    ctx->current[b->category] -= b->bytes;
    if (b->category != LLMT_MEM_HOST_STATE)
        ctx->total_current -= b->bytes;
    pthread_mutex_unlock(&ctx->mem_lock);
    memset(b, 0, sizeof *b);
}
