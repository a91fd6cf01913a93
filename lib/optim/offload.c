/* Optimizer offload: where the optimizer's state lives (a host segment
 * [first, split) and a device segment [split, end)), moving it between
 * placements, and the AdamW update of the host segment with the CPU
 * backend's kernel, so that offload changes no bit of the result. */
#include <stdio.h>
#include <string.h>

#include "core/context_internal.h"
#include "core/error.h"
#include "model/grad_place.h"
#include "model/model_internal.h"
#include "model/transfer.h"
#include "optim/offload.h"
#include "optim/optim_internal.h"

int64_t llmt_offload_prefix(const llmt_model *m, int32_t parts, int32_t layers)
{
    if (parts == LLMT_OFFLOAD_NONE || layers == 0)
        return 0;
    if (layers == LLMT_OFFLOAD_ALL_LAYERS)
        return m->num_params;
    /* The embedding is stored first, then each layer, then the final norm. */
    return layers < m->dims.layers ? m->layer[layers].ln1 : m->norm;
}

int llmt_offload_check_parts(const char *fn, const char *name, int32_t parts)
{
    if (parts == LLMT_OFFLOAD_GRADS)
        return llmt_fail(LLMT_EINVAL,
                         "%s: %s = LLMT_OFFLOAD_GRADS alone: gradient offload needs "
                         "LLMT_OFFLOAD_OPTIMIZER too (the host AdamW reads the offloaded "
                         "gradients)",
                         fn, name);
    if (parts < LLMT_OFFLOAD_NONE || parts > (LLMT_OFFLOAD_OPTIMIZER | LLMT_OFFLOAD_GRADS))
        return llmt_fail(LLMT_EINVAL,
                         "%s: %s = %d is not LLMT_OFFLOAD_NONE (0), LLMT_OFFLOAD_OPTIMIZER (1) "
                         "or LLMT_OFFLOAD_OPTIMIZER | LLMT_OFFLOAD_GRADS (3)",
                         fn, name, parts);
    return LLMT_OK;
}

int64_t llmt_offload_grad_split_of(const llmt_model *m, int32_t parts, int32_t layers)
{
    return parts & LLMT_OFFLOAD_GRADS ? llmt_grad_split(llmt_offload_prefix(m, parts, layers)) : 0;
}

int llmt_offload_check(const char *fn, int32_t parts, int32_t layers, int64_t num_layers)
{
    LLMT_TRY(llmt_offload_check_parts(fn, "parts", parts));
    if (parts != LLMT_OFFLOAD_NONE && (layers < LLMT_OFFLOAD_ALL_LAYERS || layers > num_layers))
        return llmt_fail(LLMT_EINVAL,
                         "%s: layers = %d is neither LLMT_OFFLOAD_ALL_LAYERS (-1) nor in 0..%lld "
                         "(the model's layers)",
                         fn, layers, (long long)num_layers);
    return LLMT_OK;
}

int64_t llmt_offload_split(const llmt_optimizer *o, int32_t parts, int32_t layers)
{
    return llmt_offload_split_of(llmt_offload_prefix(o->model, parts, layers), o->first, o->end);
}

int64_t llmt_offload_split_of(int64_t prefix, int64_t first, int64_t end)
{
    return prefix < first ? first : prefix > end ? end : prefix;
}

size_t llmt_offload_staging_bytes(int host_memory, int64_t host_elems, size_t w_size)
{
    if (host_memory || host_elems <= 0)
        return 0;
    int64_t k = host_elems < LLMT_OFFLOAD_CHUNK ? host_elems : LLMT_OFFLOAD_CHUNK;
    return 2 * LLMT_OFFLOAD_HALVES * (size_t)k * w_size;
}

/* The state buffers of one placement. */
typedef struct placement {
    int64_t split;
    llmt_buf dev[3];  /* m, v, master over [split, end) */
    llmt_buf host[3]; /* the same over [first, split) */
    llmt_buf stage_g, stage_w;
    llmt_device *host_dev;
} placement;

static void placement_free(llmt_context *ctx, placement *p)
{
    for (int k = 0; k < 3; k++) {
        llmt_buf_free(ctx, &p->dev[k]);
        llmt_buf_free(ctx, &p->host[k]);
    }
    llmt_buf_free(ctx, &p->stage_g);
    llmt_buf_free(ctx, &p->stage_w);
    if (p->host_dev)
        p->host_dev->ops->destroy(p->host_dev);
    p->host_dev = NULL;
}

/* Allocates the buffers of split point split; on failure nothing is held. */
static int placement_alloc(const llmt_optimizer *o, int64_t split, placement *p)
{
    static const char *const dev_what[3] = {"AdamW first moment", "AdamW second moment",
                                            "fp32 master weights"};
    static const char *const host_what[3] = {"offloaded AdamW first moment",
                                             "offloaded AdamW second moment",
                                             "offloaded fp32 master weights"};
    const llmt_model *m = o->model;
    llmt_context *ctx = m->ctx;
    memset(p, 0, sizeof *p);
    p->split = split;
    size_t dev_bytes[3], host_bytes[3];
    llmt_optimizer_sizes(m->cfg.precision, o->end - split, &dev_bytes[0], &dev_bytes[2]);
    llmt_optimizer_sizes(m->cfg.precision, split - o->first, &host_bytes[0], &host_bytes[2]);
    dev_bytes[1] = dev_bytes[0];
    host_bytes[1] = host_bytes[0];
    int rc = LLMT_OK;
    for (int k = 0; k < 3 && !rc; k++)
        rc = llmt_buf_alloc(ctx, &p->dev[k], LLMT_MEM_OPTIMIZER, dev_bytes[k], dev_what[k]);
    for (int k = 0; k < 3 && !rc; k++)
        rc = llmt_buf_alloc(ctx, &p->host[k], LLMT_MEM_HOST_STATE, host_bytes[k], host_what[k]);
    size_t stage = llmt_offload_staging_bytes(m->ops->host_memory, split - o->first,
                                              llmt_dtype_size(m->dt)) / 2;
    if (!rc)
        rc = llmt_buf_alloc(ctx, &p->stage_g, LLMT_MEM_HOST_STATE, stage,
                            "offload staging (gradients)");
    if (!rc)
        rc = llmt_buf_alloc(ctx, &p->stage_w, LLMT_MEM_HOST_STATE, stage,
                            "offload staging (weights)");
    if (!rc && stage)
        rc = llmt_cpu_backend_create(ctx->num_threads, &p->host_dev);
    if (rc)
        placement_free(ctx, p);
    return rc;
}

/* Moves p's buffers into o, whose own must be empty. */
static void placement_install(llmt_optimizer *o, placement *p)
{
    llmt_buf *dev[3] = {&o->m, &o->v, &o->master};
    llmt_buf *host[3] = {&o->hm, &o->hv, &o->hmaster};
    for (int k = 0; k < 3; k++) {
        *dev[k] = p->dev[k];
        *host[k] = p->host[k];
    }
    o->stage_g = p->stage_g;
    o->stage_w = p->stage_w;
    o->host_dev = p->host_dev;
    o->split = p->split;
}

/* Moves o's buffers into p, leaving o's empty. */
static void placement_take(llmt_optimizer *o, placement *p)
{
    llmt_buf *dev[3] = {&o->m, &o->v, &o->master};
    llmt_buf *host[3] = {&o->hm, &o->hv, &o->hmaster};
    for (int k = 0; k < 3; k++) {
        p->dev[k] = *dev[k];
        p->host[k] = *host[k];
        memset(dev[k], 0, sizeof *dev[k]);
        memset(host[k], 0, sizeof *host[k]);
    }
    p->stage_g = o->stage_g;
    p->stage_w = o->stage_w;
    p->host_dev = o->host_dev;
    p->split = o->split;
    memset(&o->stage_g, 0, sizeof o->stage_g);
    memset(&o->stage_w, 0, sizeof o->stage_w);
    o->host_dev = NULL;
}

void llmt_offload_free(llmt_optimizer *o)
{
    placement p;
    placement_take(o, &p);
    placement_free(o->model->ctx, &p);
}

/* The CPU device that runs host-segment ops: the model's own on a backend
 * whose memory is host memory. */
static llmt_device *host_device(const llmt_optimizer *o)
{
    return o->host_dev ? o->host_dev : o->model->dev;
}

int llmt_offload_master_from_weights(llmt_optimizer *o)
{
    const llmt_model *m = o->model;
    if (!o->has_master)
        return LLMT_OK;
    if (o->end > o->split)
        LLMT_TRY(m->ops->cast(m->dev, o->master.ptr, LLMT_DTYPE_F32,
                              llmt_model_at(m, &m->weights, o->split), m->dt, o->end - o->split));
    if (m->ops->host_memory || o->split == o->first)
        return o->split > o->first
                   ? m->ops->cast(m->dev, o->hmaster.ptr, LLMT_DTYPE_F32,
                                  llmt_model_at(m, &m->weights, o->first), m->dt,
                                  o->split - o->first)
                   : LLMT_OK;
    /* Through the staging, chunk by chunk: widening to fp32 is exact. */
    size_t wb = llmt_dtype_size(m->dt);
    llmt_device *hd = host_device(o);
    for (int64_t c = o->first; c < o->split; c += LLMT_OFFLOAD_CHUNK) {
        int64_t k = o->split - c < LLMT_OFFLOAD_CHUNK ? o->split - c : LLMT_OFFLOAD_CHUNK;
        LLMT_TRY(m->ops->copy_to_host(m->dev, o->stage_w.ptr, llmt_model_at(m, &m->weights, c),
                                      (size_t)k * wb));
        LLMT_TRY(hd->ops->cast(hd, (float *)o->hmaster.ptr + (c - o->first), LLMT_DTYPE_F32,
                               o->stage_w.ptr, m->dt, k));
    }
    return LLMT_OK;
}

int llmt_offload_alloc(llmt_optimizer *o, int64_t split)
{
    const llmt_model *m = o->model;
    placement p;
    LLMT_TRY(placement_alloc(o, split, &p));
    placement_install(o, &p);
    if (o->hm.bytes) { /* host buffers are host memory on every backend */
        memset(o->hm.ptr, 0, o->hm.bytes);
        memset(o->hv.ptr, 0, o->hv.bytes);
    }
    LLMT_TRY(m->ops->mem_zero(m->dev, o->m.ptr, o->m.bytes));
    LLMT_TRY(m->ops->mem_zero(m->dev, o->v.ptr, o->v.bytes));
    return llmt_offload_master_from_weights(o);
}

/* One chunk of a host-segment update: elements [c, c + k), whose gradients
 * are in host_grads (host_g) or on the device; k = 0: none left. */
typedef struct chunk {
    int64_t c, k;
    int host_g;
} chunk;

/* Where the gradients the host AdamW reads stop being host_grads: the
 * model's gradient split, or 0 for a sharded optimizer, which reads its
 * reduced sum (in the backend's memory) wherever the model's own are. */
static int64_t host_grads_end(const llmt_optimizer *o)
{
    return o->comm ? 0 : o->model->grad_split;
}

/* The chunk of the range [c, e) that starts at c: at most limit elements,
 * its gradients from one place (the gradient split gs never inside). */
static chunk chunk_at(int64_t c, int64_t e, int64_t gs, int64_t limit)
{
    chunk ch = {c, e - c, c < gs};
    if (ch.host_g && gs - c < ch.k)
        ch.k = gs - c;
    if (ch.k > limit)
        ch.k = limit;
    return ch;
}

/* a's state pointers, gradients and weights for chunk ch where they are
 * stored (the staging replaces the device's on a backend the host cannot
 * read); element first + i of the host segment's buffers is at i. A
 * sharded optimizer's gradients are its reduced sum (on the device, in the
 * weight dtype by the time AdamW runs), element first + i at i. */
static void chunk_args(const llmt_optimizer *o, llmt_adamw_args *a, chunk ch)
{
    const llmt_model *m = o->model;
    size_t wb = llmt_dtype_size(m->dt), sb = llmt_dtype_size(o->state_dt);
    int64_t i = ch.c - o->first;
    a->n = ch.k;
    if (o->comm)
        a->g = (const char *)o->grad_sum.ptr + (size_t)i * wb;
    else
        a->g = ch.host_g ? (const char *)m->host_grads.ptr + (size_t)ch.c * wb
                         : (const char *)m->grads.ptr + (size_t)(ch.c - m->grad_split) * wb;
    a->m = (char *)o->hm.ptr + (size_t)i * sb;
    a->v = (char *)o->hv.ptr + (size_t)i * sb;
    a->master = o->has_master ? (float *)o->hmaster.ptr + i : NULL;
    a->w = llmt_model_at(m, &m->weights, ch.c);
    a->rng_offset = (uint64_t)o->steps * (uint64_t)m->num_params + (uint64_t)ch.c;
}

/* Half h (0 or 1) of staging buffer b. */
static char *stage_half(const llmt_buf *b, int h)
{
    return (char *)b->ptr + (size_t)h * (b->bytes / LLMT_OFFLOAD_HALVES);
}

_Static_assert(LLMT_OFFLOAD_FENCE + LLMT_OFFLOAD_HALVES <= LLMT_COPY_FENCES,
               "the staging halves' fences are copy-stream fences");
_Static_assert(LLMT_OFFLOAD_HALVES == 2,
               "update_chunks alternates two halves (h = 1 - h): one the host updates, "
               "the other the copy stream fills; more halves need a deeper pipeline there");

/* The copy-stream fence of staging half h. */
static int half_fence(int h)
{
    return LLMT_OFFLOAD_FENCE + h;
}

/* Queues chunk ch's downloads into staging half h on the copy stream: its
 * device gradients (offloaded ones are read in place) and its weights
 * where no master holds them, each marking h's fence. */
static int download(const llmt_optimizer *o, chunk ch, int h)
{
    const llmt_model *m = o->model;
    llmt_adamw_args a = {0};
    chunk_args(o, &a, ch);
    size_t bytes = (size_t)ch.k * llmt_dtype_size(m->dt);
    if (!ch.host_g)
        LLMT_TRY(m->ops->copy_to_host_async(m->dev, stage_half(&o->stage_g, h), a.g, bytes,
                                            half_fence(h)));
    if (!o->has_master)
        LLMT_TRY(m->ops->copy_to_host_async(m->dev, stage_half(&o->stage_w, h), a.w, bytes,
                                            half_fence(h)));
    return LLMT_OK;
}

/* update_pipelined's chunks, up to its final wait (its invariants 1-3). */
static int update_chunks(llmt_optimizer *o, llmt_adamw_args a, int64_t off, int64_t e)
{
    const llmt_model *m = o->model;
    size_t wb = llmt_dtype_size(m->dt);
    chunk cur = chunk_at(off, e, host_grads_end(o), LLMT_OFFLOAD_CHUNK);
    LLMT_TRY(download(o, cur, 0));
    for (int h = 0; cur.k > 0; h = 1 - h) {
        chunk next = chunk_at(cur.c + cur.k, e, host_grads_end(o), LLMT_OFFLOAD_CHUNK);
        if (next.k > 0)
            LLMT_TRY(download(o, next, 1 - h));
        LLMT_TRY(m->ops->fence_sync(m->dev, half_fence(h)));
        chunk_args(o, &a, cur);
        void *w_dev = a.w;
        if (!cur.host_g)
            a.g = stage_half(&o->stage_g, h);
        a.w = stage_half(&o->stage_w, h);
        LLMT_TRY(o->host_dev->ops->adamw(o->host_dev, &a));
        LLMT_TRY(m->ops->copy_to_device_async(m->dev, w_dev, a.w, (size_t)cur.k * wb,
                                              half_fence(h)));
        cur = next;
    }
    return LLMT_OK;
}

/* The update of [off, e) on a backend whose memory the host cannot read,
 * pipelined: chunk j (of at most LLMT_OFFLOAD_CHUNK elements) uses staging
 * half h = j % 2 and its fence F(h), and while the host runs AdamW on chunk
 * j the copy stream uploads chunk j - 1's weights and downloads chunk
 * j + 1's gradients (and weights). Its order: download(j + 1) into half
 * 1 - h is queued, the host waits for F(h) (fence_sync), updates half h
 * and queues half h's upload, marking F(h). What keeps it race-free and the
 * bits those of the serial update (the emulator runs the copy stream's
 * copies only when waited for, so a missing wait changes bits there):
 *  1. The copy stream runs its copies in the order queued, and a copy
 *     starts after every op queued before it (the gradients and weights it
 *     reads are final).
 *  2. The download of chunk j into half h is queued while the host updates
 *     chunk j - 1 in the other half: after the host's last use of h (chunk
 *     j - 2's update, done) and, on the copy stream, after h's last upload
 *     (chunk j - 2's, by 1), so it overwrites no byte still to be read.
 *  3. Before the host reads or writes half h it waits for F(h): every copy
 *     into or out of h marks F(h), so none is pending after the wait (by
 *     1, the mark follows them all): the host reads chunk j's downloaded
 *     bytes and overwrites no byte an upload has yet to read.
 *  4. After the last chunk (or a failure) the compute stream waits for
 *     both fences, so no later op reads the weights (or writes the
 *     gradients the downloads read) before every copy is done; the host
 *     touches the staging again only in this function (3) or after the
 *     compute stream (llmt_offload_master_from_weights's synchronous
 *     copies, after 4), and frees and placement changes synchronize both
 *     streams. */
static int update_pipelined(llmt_optimizer *o, llmt_adamw_args a, int64_t off, int64_t e)
{
    const llmt_model *m = o->model;
    char first_why[LLMT_ERROR_CAP]; /* the first failure's message: the waits after it
                                     * may fail too and would overwrite it */
    int rc = update_chunks(o, a, off, e);
    if (rc)
        snprintf(first_why, sizeof first_why, "%s", llmt_error_last());
    for (int h = 0; h < LLMT_OFFLOAD_HALVES; h++) { /* invariant 4 */
        int waited = m->ops->wait_fence(m->dev, half_fence(h));
        if (!rc && waited) {
            rc = waited;
            snprintf(first_why, sizeof first_why, "%s", llmt_error_last());
        }
    }
    return rc ? llmt_error_set(rc, first_why) : LLMT_OK;
}

int llmt_offload_update(llmt_optimizer *o, llmt_adamw_args a, int64_t off, int64_t e)
{
    const llmt_model *m = o->model;
    if (!m->ops->host_memory)
        return update_pipelined(o, a, off, e);
    /* Host memory: the CPU kernel updates in place, one call per place the
     * gradients come from. */
    for (chunk ch = chunk_at(off, e, host_grads_end(o), e - off); ch.k > 0;
         ch = chunk_at(ch.c + ch.k, e, host_grads_end(o), e - off)) {
        chunk_args(o, &a, ch);
        LLMT_TRY(m->ops->adamw(m->dev, &a));
    }
    return LLMT_OK;
}

int64_t llmt_offload_grad_split(const llmt_optimizer *o)
{
    return llmt_offload_grad_split_of(o->model, o->offload_parts, o->offload_layers);
}

int llmt_offload_place_grads(llmt_optimizer *o)
{
    int64_t want = llmt_offload_grad_split(o);
    return o->model->grad_split == want ? LLMT_OK : llmt_grads_place(o->model, want);
}

void llmt_offload_section(const llmt_optimizer *o, int sec, const llmt_buf **host,
                          const llmt_buf **dev)
{
    *host = sec == 0 ? &o->hm : sec == 1 ? &o->hv : &o->hmaster;
    *dev = sec == 0 ? &o->m : sec == 1 ? &o->v : &o->master;
}

void *llmt_offload_state_base(const llmt_optimizer *o, int sec, int64_t e, int64_t *index)
{
    const llmt_buf *host, *dev;
    llmt_offload_section(o, sec, &host, &dev);
    int in_host = e < o->split;
    *index = in_host ? e - o->first : e - o->split;
    return in_host ? host->ptr : dev->ptr;
}

int llmt_offload_state_io(const llmt_optimizer *o, int sec, int64_t e0, int64_t n, float *buf,
                          int to_state)
{
    int dt = sec == 2 ? LLMT_DTYPE_F32 : o->state_dt;
    while (n > 0) {
        int64_t idx = 0;
        void *base = llmt_offload_state_base(o, sec, e0, &idx);
        int64_t seg_end = e0 < o->split ? o->split : o->end;
        int64_t k = n < seg_end - e0 ? n : seg_end - e0;
        LLMT_TRY(to_state ? llmt_transfer_in(o->model, base, dt, idx, buf, k)
                          : llmt_transfer_out(o->model, base, dt, idx, buf, k));
        e0 += k;
        buf += k;
        n -= k;
    }
    return LLMT_OK;
}

/* Copies every element of section sec from placement `from` to `to`. */
static int copy_section(const llmt_optimizer *o, const placement *from, const placement *to,
                        int sec)
{
    const llmt_model *m = o->model;
    size_t es = llmt_dtype_size(sec == 2 ? LLMT_DTYPE_F32 : o->state_dt);
    const llmt_buf *fb[2] = {&from->host[sec], &from->dev[sec]};
    const llmt_buf *tb[2] = {&to->host[sec], &to->dev[sec]};
    int64_t fs[3] = {o->first, from->split, o->end}, ts[3] = {o->first, to->split, o->end};
    for (int i = 0; i < 2; i++)     /* the old segment */
        for (int j = 0; j < 2; j++) { /* the new one */
            int64_t a = fs[i] > ts[j] ? fs[i] : ts[j];
            int64_t b = fs[i + 1] < ts[j + 1] ? fs[i + 1] : ts[j + 1];
            if (b > a)
                LLMT_TRY(m->ops->copy_on_device(m->dev, (char *)tb[j]->ptr + (size_t)(a - ts[j]) * es,
                                                (const char *)fb[i]->ptr + (size_t)(a - fs[i]) * es,
                                                (size_t)(b - a) * es));
        }
    return LLMT_OK;
}

/* Moves o's state to split point split: the new buffers are filled before
 * the old ones are freed; on failure the old placement stays. */
static int move_state(llmt_optimizer *o, int64_t split)
{
    const llmt_model *m = o->model;
    placement next, old;
    LLMT_TRY(placement_alloc(o, split, &next));
    placement_take(o, &old);
    int rc = LLMT_OK;
    for (int sec = 0; sec < (o->has_master ? 3 : 2) && !rc; sec++)
        rc = copy_section(o, &old, &next, sec);
    if (!rc)
        rc = m->ops->synchronize(m->dev);
    placement *keep = rc ? &old : &next, *drop = rc ? &next : &old;
    placement_install(o, keep);
    placement_free(m->ctx, drop);
    return rc;
}

int llmt_offload_check_backend(const llmt_optimizer *o, const char *fn, int32_t parts)
{
    if (!(parts & LLMT_OFFLOAD_GRADS) || o->model->ops->grad_stats_blocks)
        return LLMT_OK;
    return llmt_fail(LLMT_EUNSUPPORTED,
                     "%s: parts = %d: gradient offload needs the gradient norm per granule, "
                     "which the %s backend does not have",
                     fn, parts, o->model->ops->name);
}

int llmt_optimizer_set_offload(llmt_optimizer *o, int32_t parts, int32_t layers)
{
    const char *fn = "llmt_optimizer_set_offload";
    if (!o)
        return llmt_fail(LLMT_EINVAL, "%s: opt is NULL", fn);
    LLMT_TRY(llmt_offload_check(fn, parts, layers, o->model->dims.layers));
    LLMT_TRY(llmt_offload_check_backend(o, fn, parts));
    if (parts == LLMT_OFFLOAD_NONE)
        layers = 0;
    llmt_model *m = o->model;
    int64_t split = llmt_offload_split(o, parts, layers);
    /* The gradients move first (nothing changes if they cannot); if the
     * state then cannot, they go back, and should that fail too the next
     * step puts them where the placement says before it reads them. */
    const int64_t old_grad_split = m->grad_split;
    LLMT_TRY(llmt_grads_place(m, llmt_offload_grad_split_of(m, parts, layers)));
    int rc = split == o->split ? LLMT_OK : move_state(o, split);
    if (rc) { /* the gradients go back; the state's refusal is the message */
        char why[512];
        snprintf(why, sizeof why, "%s", llmt_error_last());
        (void)llmt_grads_place(m, old_grad_split);
        return llmt_fail(rc, "%s", why);
    }
    o->offload_parts = parts;
    o->offload_layers = layers;
    return LLMT_OK;
}

int llmt_optimizer_get_offload(const llmt_optimizer *o, int32_t *parts, int32_t *layers)
{
    if (!o || !parts || !layers)
        return llmt_fail(LLMT_EINVAL, "llmt_optimizer_get_offload: %s is NULL",
                         !o ? "opt" : !parts ? "parts" : "layers");
    *parts = o->offload_parts;
    *layers = o->offload_layers;
    return LLMT_OK;
}
