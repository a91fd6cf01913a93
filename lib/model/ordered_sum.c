/* Ordered accumulation's fp32 sum, across the gradients' host and device
 * segments (ordered_sum.h). */
#include "core/context_internal.h"
#include "core/error.h"
#include "model/grad_place.h"
#include "model/model_internal.h"
#include "model/ordered_sum.h"
#include "model/transfer.h"

/* Host elements widened per pass of host_add (a stack buffer per thread). */
#define HOST_ADD_CHUNK 4096

void llmt_ordered_sum_bytes(int64_t num_params, int64_t grad_split, uint64_t *device,
                            uint64_t *host)
{
    *device = (uint64_t)(num_params - grad_split) * sizeof(float);
    *host = (uint64_t)grad_split * sizeof(float);
}

void llmt_ordered_sum_release(llmt_ordered_sum *s, llmt_context *ctx)
{
    llmt_buf_free(ctx, &s->dev);
    llmt_buf_free(ctx, &s->host);
    s->split = 0;
    s->live = 0;
}

/* Allocates both parts for split (nothing held on failure). */
static int alloc_parts(llmt_ordered_sum *s, const llmt_model *m, int64_t split)
{
    uint64_t device = 0, host = 0;
    llmt_ordered_sum_bytes(m->num_params, split, &device, &host);
    int rc = llmt_buf_alloc(m->ctx, &s->dev, LLMT_MEM_GRADS, (size_t)device,
                            "ordered gradient sum");
    if (!rc)
        rc = llmt_buf_alloc(m->ctx, &s->host, LLMT_MEM_HOST_STATE, (size_t)host,
                            "ordered gradient sum (offloaded)");
    if (rc) {
        llmt_ordered_sum_release(s, m->ctx);
        return rc;
    }
    s->split = split;
    s->live = 1;
    return LLMT_OK;
}

int llmt_ordered_sum_begin(llmt_ordered_sum *s, llmt_model *m)
{
    /* The host segment's values are read below: settled, and zero where
     * no backward wrote them. */
    LLMT_TRY(llmt_grads_settle(m));
    const int64_t split = m->grad_split, dev_n = m->num_params - split;
    if (s->live && s->split != split)
        llmt_ordered_sum_release(s, m->ctx);
    if (!s->live)
        LLMT_TRY(alloc_parts(s, m, split));
    llmt_transfer_widen(s->host.ptr, m->host_grads.ptr, m->dt, split);
    if (dev_n == 0)
        return LLMT_OK;
    if (m->dt == LLMT_DTYPE_F32)
        return m->ops->copy_on_device(m->dev, s->dev.ptr, m->grads.ptr, m->grads.bytes);
    return m->ops->cast(m->dev, s->dev.ptr, LLMT_DTYPE_F32, m->grads.ptr, m->dt, dev_n);
}

/* sum[i] += x[i] widened to fp32 for i < n, in host memory: the device
 * accumulate op's arithmetic (one fp32 addition an element, so neither the
 * chunking nor the thread count changes a bit). */
static void host_add(float *sum, const void *x, int dt, int64_t n, int threads)
{
    const size_t es = llmt_dtype_size(dt);
    const int64_t chunks = (n + HOST_ADD_CHUNK - 1) / HOST_ADD_CHUNK;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t c = 0; c < chunks; c++) {
        float wide[HOST_ADD_CHUNK];
        const int64_t i0 = c * HOST_ADD_CHUNK;
        const int64_t k = n - i0 < HOST_ADD_CHUNK ? n - i0 : HOST_ADD_CHUNK;
        llmt_transfer_widen(wide, (const char *)x + (size_t)i0 * es, dt, k);
        for (int64_t i = 0; i < k; i++)
            sum[i0 + i] += wide[i];
    }
}

int llmt_ordered_sum_add(llmt_ordered_sum *s, llmt_model *m)
{
    const int64_t split = s->split, dev_n = m->num_params - split;
    if (split > 0) {
        LLMT_TRY(llmt_grads_settle(m)); /* the host segment holds this micro-batch's values */
        host_add(s->host.ptr, m->host_grads.ptr, m->dt, split, m->ctx->num_threads);
    }
    return dev_n > 0 ? m->ops->accumulate(m->dev, s->dev.ptr, m->grads.ptr, dev_n, m->dt)
                     : LLMT_OK;
}

/* Swaps buffers a and b (the same size and category). */
static void swap_bufs(llmt_buf *a, llmt_buf *b)
{
    llmt_buf t = *a;
    *a = *b;
    *b = t;
}

int llmt_ordered_sum_end(llmt_ordered_sum *s, llmt_model *m)
{
    const int64_t split = s->split, dev_n = m->num_params - split;
    /* Every offloaded bucket's host part is marked valid already: the last
     * llmt_ordered_sum_add settled the gradients. */
    if (split > 0 && m->dt == LLMT_DTYPE_F32)
        swap_bufs(&m->host_grads, &s->host);
    else if (split > 0)
        llmt_transfer_narrow(m->host_grads.ptr, m->dt, s->host.ptr, split);
    if (dev_n == 0)
        return LLMT_OK;
    if (m->dt == LLMT_DTYPE_F32) {
        swap_bufs(&m->grads, &s->dev);
        return LLMT_OK;
    }
    return m->ops->cast(m->dev, m->grads.ptr, m->dt, s->dev.ptr, LLMT_DTYPE_F32, dev_n);
}
