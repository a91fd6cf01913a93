/* Ordered accumulation's fp32 sum, across the gradients' host and device
 * segments (ordered_sum.h). */
#include "core/context_internal.h"
#include "core/error.h"
#include "model/grad_place.h"
#include "model/model_internal.h"
#include "model/ordered_sum.h"
#include "ops/cpu/cpu_backend.h"

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
    if (s->host_dev)
        s->host_dev->ops->destroy(s->host_dev);
    s->host_dev = NULL;
    s->split = 0;
    s->live = 0;
}

/* Allocates both parts for split, and the CPU device of the host part's
 * ops where the backend's memory is not host memory (nothing held on
 * failure). */
static int alloc_parts(llmt_ordered_sum *s, const llmt_model *m, int64_t split)
{
    uint64_t device = 0, host = 0;
    llmt_ordered_sum_bytes(m->num_params, split, &device, &host);
    int rc = llmt_buf_alloc(m->ctx, &s->dev, LLMT_MEM_GRADS, (size_t)device,
                            "ordered gradient sum");
    if (!rc)
        rc = llmt_buf_alloc(m->ctx, &s->host, LLMT_MEM_HOST_STATE, (size_t)host,
                            "ordered gradient sum (offloaded)");
    if (!rc && split > 0 && !m->ops->host_memory)
        rc = llmt_cpu_backend_create(m->ctx->num_threads, &s->host_dev);
    if (rc) {
        llmt_ordered_sum_release(s, m->ctx);
        return rc;
    }
    s->split = split;
    s->live = 1;
    return LLMT_OK;
}

/* The device that runs ops on the host part (host memory on every
 * backend): the model's where that is host memory. */
static llmt_device *host_device(const llmt_ordered_sum *s, const llmt_model *m)
{
    return s->host_dev ? s->host_dev : m->dev;
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
    llmt_device *hd = host_device(s, m);
    if (split > 0)
        LLMT_TRY(hd->ops->cast(hd, s->host.ptr, LLMT_DTYPE_F32, m->host_grads.ptr, m->dt, split));
    if (dev_n == 0)
        return LLMT_OK;
    if (m->dt == LLMT_DTYPE_F32)
        return m->ops->copy_on_device(m->dev, s->dev.ptr, m->grads.ptr, m->grads.bytes);
    return m->ops->cast(m->dev, s->dev.ptr, LLMT_DTYPE_F32, m->grads.ptr, m->dt, dev_n);
}

int llmt_ordered_sum_add(llmt_ordered_sum *s, llmt_model *m)
{
    const int64_t split = s->split, dev_n = m->num_params - split;
    if (split > 0) {
        LLMT_TRY(llmt_grads_settle(m)); /* the host segment holds this micro-batch's values */
        llmt_device *hd = host_device(s, m);
        LLMT_TRY(hd->ops->accumulate(hd, s->host.ptr, m->host_grads.ptr, split, m->dt));
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
    llmt_device *hd = host_device(s, m);
    /* Every offloaded bucket's host part is marked valid already: the last
     * llmt_ordered_sum_add settled the gradients. */
    if (split > 0 && m->dt == LLMT_DTYPE_F32)
        swap_bufs(&m->host_grads, &s->host);
    else if (split > 0)
        LLMT_TRY(hd->ops->cast(hd, m->host_grads.ptr, m->dt, s->host.ptr, LLMT_DTYPE_F32, split));
    if (dev_n == 0)
        return LLMT_OK;
    if (m->dt == LLMT_DTYPE_F32) {
        swap_bufs(&m->grads, &s->dev);
        return LLMT_OK;
    }
    return m->ops->cast(m->dev, m->grads.ptr, m->dt, s->dev.ptr, LLMT_DTYPE_F32, dev_n);
}
