/* Gradient placement: moving the gradients between placements, the device
 * bucket through which backward writes the offloaded ones, and reading and
 * writing them across the host and device segments.
 *
 * Overlap (a backend with copy_to_host_async: CUDA). The device bucket has
 * two slots, and bucket b is always written in slot b % 2; backward visits
 * the buckets in descending order, so consecutive ones alternate, and the
 * store of bucket b to host memory (copy stream) runs while the ops of
 * bucket b - 1 write the other slot (compute stream). Nothing here waits on
 * the host. What keeps it race-free (the emulator runs the copy stream's
 * copies only when waited for, so a missing wait changes bits there):
 *  1. A store reads its slot after the ops that wrote the bucket: the copy
 *     starts after every op queued before copy_to_host_async.
 *  2. No op writes slot k while a store from it may run: every store from k
 *     marks fence k, and every load into k (the only writer before the
 *     bucket's ops) first waits for fence k; the optimizer's uploads for
 *     the norm and a sharded optimizer's for the exchange (into slot 0)
 *     come after llmt_grads_settle (4).
 *  3. A load of bucket b reads b's host bytes after b's last store: that
 *     store came from slot b % 2 (b's only slot) and marked fence b % 2,
 *     which the load waits for; the upload itself runs on the compute
 *     stream, after that wait.
 *  4. The host reads and writes host_grads only after llmt_grads_settle,
 *     which waits for both streams; frees wait for them too.
 *  5. An overlapped reduction may send an offloaded bucket straight from
 *     its slot (llmt_grads_sent) instead of storing it: the exchange, on
 *     the engine's stream, reads the slot after the bucket's ops, and the
 *     slot is marked in slots_sent until a join of the engine (after which
 *     the compute stream's later ops wait for the exchange) clears it. A
 *     load into a marked slot is refused: the sender joins the engine
 *     before it sends from the other slot (sharded.c), so that with two
 *     slots no load meets a mark, and bucket b's exchange runs while the
 *     ops of bucket b - 1 write the other slot, as a store would.
 * Two buckets of the same parity in a row (a tied LM head's bucket 0, then
 * an even tail bucket) are still correct: the load waits for the store just
 * queued, which then does not overlap.
 *
 * The home (host_grads' room, [0, home_end)). Kept on demand, it holds
 * what a step keeps (llmt_grad_home_elems) and grows only where a store, a
 * settle or a placement moving values in needs it, so a data-parallel
 * step that sends every offloaded bucket from its slot holds no host copy
 * of them (a tied model: its embedding's bucket only). Its end is always 0,
 * grad_split or the end of a bucket's host part, so a bucket's host part
 * lies wholly inside or wholly outside it; host_valid[b] implies inside. A
 * growth waits for the device (invariant 4) before copying the old home. */
#include <string.h>

#include "core/error.h"
#include "dist/shard.h"
#include "model/grad_place.h"
#include "model/transfer.h"

static size_t grad_es(const llmt_model *m)
{
    return llmt_dtype_size(m->dt);
}

/* The slot of grad_bucket that bucket b is written in (its fence too). */
static int slot_of(const llmt_model *m, int32_t b)
{
    return b % llmt_grad_bucket_slots(m->ops->host_memory);
}

/* Where bucket b starting at element s begins in grad_bucket: in its slot
 * (each starts on an LLMT_GRAD_BUCKET_ALIGN boundary), at the byte offset
 * that gives it the alignment (mod LLMT_GRAD_BUCKET_ALIGN) it has in a
 * whole gradient buffer, so a GEMM writing it picks the same kernel (the
 * GPU libraries choose by pointer alignment) and the same bits. */
static char *bucket_base(const llmt_model *m, int32_t b, int64_t s)
{
    size_t slot = m->grad_bucket.bytes / (size_t)llmt_grad_bucket_slots(m->ops->host_memory);
    size_t lead = m->ops->host_memory ? 0 : (size_t)s * grad_es(m) % LLMT_GRAD_BUCKET_ALIGN;
    return (char *)m->grad_bucket.ptr + (size_t)slot_of(m, b) * slot + lead;
}

/* Bucket b's range [*s, *e) and the end *h of its host part (min(e, split)). */
static void bucket_parts(const llmt_model *m, int32_t b, int64_t *s, int64_t *e, int64_t *h)
{
    llmt_grad_bucket_range(m, b, s, e);
    *h = *e < m->grad_split ? *e : m->grad_split;
}

/* Zeroes a device segment of the gradients (dev, the backend's memory). */
static int zero_device(const llmt_model *m, const llmt_buf *dev)
{
    return dev->bytes ? m->ops->mem_zero(m->dev, dev->ptr, dev->bytes) : LLMT_OK;
}

/* The end of the home: host_grads has room for [0, home_end). */
static int64_t home_end(const llmt_model *m)
{
    return (int64_t)(m->host_grads.bytes / grad_es(m));
}

/* Gives host_grads room for [0, end) (end <= grad_split), keeping what it
 * holds: a larger buffer, the old home copied into it once the device's
 * queued stores and uploads of it are done, the old freed. On failure
 * nothing changes. */
static int home_grow(llmt_model *m, int64_t end)
{
    if (end <= home_end(m))
        return LLMT_OK;
    llmt_buf next = {0};
    LLMT_TRY(llmt_buf_alloc(m->ctx, &next, LLMT_MEM_HOST_STATE, (size_t)end * grad_es(m),
                            "offloaded gradients"));
    int rc = m->host_grads.bytes ? m->ops->synchronize(m->dev) : LLMT_OK;
    if (rc) {
        llmt_buf_free(m->ctx, &next);
        return rc;
    }
    if (m->host_grads.bytes)
        memcpy(next.ptr, m->host_grads.ptr, m->host_grads.bytes);
    llmt_buf_free(m->ctx, &m->host_grads);
    m->host_grads = next;
    return LLMT_OK;
}

int64_t llmt_grad_home_elems(const llmt_model *m, int64_t split)
{
    if (split == 0 || m->lm_head != m->embed)
        return 0;
    int64_t s = 0, e = 0;
    llmt_grad_bucket_range(m, 0, &s, &e);
    return e < split ? e : split;
}

int64_t llmt_dp_grad_home(int64_t split, int64_t kept, int from_slots, int32_t reduce_mode,
                          int32_t count, int32_t size, int32_t rank)
{
    return from_slots && llmt_one_micro_per_exchange(reduce_mode, count, size, rank) ? kept
                                                                                      : split;
}

void llmt_grads_home_on_demand(llmt_model *m, int on_demand)
{
    m->grads_home_on_demand = on_demand;
}

/* The room zero gradients at split need: what a step keeps on demand
 * (llmt_grad_home_elems), else the whole prefix. */
static int64_t home_kept(const llmt_model *m, int64_t split)
{
    return m->grads_home_on_demand ? llmt_grad_home_elems(m, split) : split;
}

/* Zero gradients need no more room than home_kept: a larger home (kept on
 * demand, grown by a write, a settle or a placement) is replaced by one of
 * that size once the device is done with it. Called with no host part
 * valid; on failure the home is empty. */
static int home_shrink(llmt_model *m)
{
    const int64_t keep = home_kept(m, m->grad_split);
    if (home_end(m) <= keep)
        return LLMT_OK;
    LLMT_TRY(m->ops->synchronize(m->dev));
    llmt_buf_free(m->ctx, &m->host_grads);
    return llmt_buf_alloc(m->ctx, &m->host_grads, LLMT_MEM_HOST_STATE,
                          (size_t)keep * grad_es(m), "offloaded gradients");
}

/* Moves bucket b, offloaded, into its slot once the slot's last store is
 * done (invariants 2 and 3 above): its host part from host_grads (zeros
 * where host_valid says it holds none), its device part [split, e) from
 * the start of the device segment. The upload is queued like a copy on the
 * device (host_grads is pinned where the host cannot read device memory),
 * so the host does not wait for it (invariant 4 covers the host's writes). */
static int load(llmt_model *m, int32_t b)
{
    const size_t es = grad_es(m);
    int64_t s, e, h;
    bucket_parts(m, b, &s, &e, &h);
    char *dst = bucket_base(m, b, s);
    if (m->slots_sent >> slot_of(m, b) & 1) /* invariant 5 */
        return llmt_fail(LLMT_EINVAL, "gradient bucket %d: its slot is still read by a queued "
                         "exchange (the engine was not joined)", (int)b);
    if (m->ops->wait_fence)
        LLMT_TRY(m->ops->wait_fence(m->dev, slot_of(m, b)));
    if (m->host_valid[b])
        LLMT_TRY(m->ops->copy_on_device(m->dev, dst,
                                        (const char *)m->host_grads.ptr + (size_t)s * es,
                                        (size_t)(h - s) * es));
    else
        LLMT_TRY(m->ops->mem_zero(m->dev, dst, (size_t)(h - s) * es));
    if (e > h) /* the straddling bucket: its tail is the device segment's head */
        LLMT_TRY(m->ops->copy_on_device(m->dev, dst + (size_t)(h - s) * es, m->grads.ptr,
                                        (size_t)(e - h) * es));
    return LLMT_OK;
}

int llmt_grads_acquire(llmt_model *m, int32_t bucket, char **base)
{
    LLMT_TRY(llmt_grads_ensure(m));
    m->grads_all_zero = 0; /* the caller writes the bucket */
    int64_t s, e;
    llmt_grad_bucket_range(m, bucket, &s, &e);
    if (s >= m->grad_split) { /* on the device: no copy */
        *base = (char *)m->grads.ptr + (size_t)(s - m->grad_split) * grad_es(m);
        return LLMT_OK;
    }
    if (m->loaded != bucket) {
        LLMT_TRY(llmt_grads_flush(m));
        LLMT_TRY(load(m, bucket));
        m->loaded = bucket;
    }
    *base = bucket_base(m, bucket, s);
    return LLMT_OK;
}

int llmt_grads_at(llmt_model *m, int32_t bucket, int64_t off, void **at)
{
    char *base = NULL;
    int64_t s, e;
    LLMT_TRY(llmt_grads_acquire(m, bucket, &base));
    llmt_grad_bucket_range(m, bucket, &s, &e);
    *at = base + (size_t)(off - s) * grad_es(m);
    return LLMT_OK;
}

int llmt_grads_flush(llmt_model *m)
{
    if (m->loaded < 0)
        return LLMT_OK;
    const size_t es = grad_es(m);
    const int32_t b = m->loaded;
    int64_t s, e, h;
    bucket_parts(m, b, &s, &e, &h);
    /* On failure the bucket stays loaded, its values in grad_bucket. */
    LLMT_TRY(home_grow(m, m->grads_home_on_demand ? h : m->grad_split));
    const char *src = bucket_base(m, b, s);
    char *dst = (char *)m->host_grads.ptr + (size_t)s * es;
    const size_t bytes = (size_t)(h - s) * es;
    LLMT_TRY(m->ops->copy_to_host_async
                 ? m->ops->copy_to_host_async(m->dev, dst, src, bytes, slot_of(m, b))
                 : m->ops->copy_to_host(m->dev, dst, src, bytes));
    m->host_valid[b] = 1;
    if (e > h)
        LLMT_TRY(m->ops->copy_on_device(m->dev, m->grads.ptr, src + (size_t)(h - s) * es,
                                        (size_t)(e - h) * es));
    m->loaded = -1;
    return LLMT_OK;
}

int llmt_grads_sent(llmt_model *m, int32_t b)
{
    if (m->loaded != b)
        return llmt_fail(LLMT_EINVAL, "gradient bucket %d was sent from its slot, but bucket %d "
                         "is loaded", (int)b, (int)m->loaded);
    const size_t es = grad_es(m);
    int64_t s, e, h;
    bucket_parts(m, b, &s, &e, &h);
    if (e > h) /* the device segment's head, as a flush stores it */
        LLMT_TRY(m->ops->copy_on_device(m->dev, m->grads.ptr,
                                        bucket_base(m, b, s) + (size_t)(h - s) * es,
                                        (size_t)(e - h) * es));
    m->host_valid[b] = 0;
    m->loaded = -1;
    m->slots_sent |= (uint8_t)(1u << slot_of(m, b));
    return LLMT_OK;
}

void llmt_grads_sent_joined(llmt_model *m)
{
    m->slots_sent = 0;
}

/* llmt_grads_settle within the home: flushed, the device waited for, and
 * every offloaded bucket's host part inside the home holding its values
 * (zero-filled where host_valid was 0); the parts outside stay not valid
 * (zero). */
static int settle_home(llmt_model *m)
{
    LLMT_TRY(llmt_grads_flush(m));
    if (m->grad_split > 0) /* queued stores and uploads of host_grads (invariant 4) */
        LLMT_TRY(m->ops->synchronize(m->dev));
    const size_t es = grad_es(m);
    for (int32_t b = 0; b < llmt_grad_bucket_count(m); b++) {
        int64_t s, e, h;
        bucket_parts(m, b, &s, &e, &h);
        if (s >= m->grad_split || m->host_valid[b] || h > home_end(m))
            continue;
        memset((char *)m->host_grads.ptr + (size_t)s * es, 0, (size_t)(h - s) * es);
        m->host_valid[b] = 1;
    }
    return LLMT_OK;
}

int llmt_grads_settle(llmt_model *m)
{
    LLMT_TRY(llmt_grads_ensure(m));
    LLMT_TRY(home_grow(m, m->grad_split));
    return settle_home(m);
}

int llmt_grads_zero(llmt_model *m)
{
    LLMT_TRY(llmt_grads_ensure(m));
    /* The loaded bucket is dropped, not stored: its gradient is now zero. */
    m->loaded = -1;
    memset(m->host_valid, 0, (size_t)llmt_grad_bucket_count(m));
    LLMT_TRY(zero_device(m, &m->grads));
    m->grads_all_zero = 1;
    return home_shrink(m);
}

/* The buffers of one placement. */
typedef struct grad_buffers {
    llmt_buf dev, host, bucket;
} grad_buffers;

static void buffers_free(llmt_context *ctx, grad_buffers *g)
{
    llmt_buf_free(ctx, &g->dev);
    llmt_buf_free(ctx, &g->host);
    llmt_buf_free(ctx, &g->bucket);
}

/* Allocates the buffers of split, the host one with room for [0, home),
 * into g (empty on entry); on failure some may be held (buffers_free
 * releases them). */
static int alloc_buffers(const llmt_model *m, int64_t split, int64_t home, grad_buffers *g)
{
    const size_t es = grad_es(m);
    size_t bucket = (size_t)llmt_grad_bucket_elems(m, split, m->ops->host_memory) * es;
    int rc = llmt_buf_alloc(m->ctx, &g->dev, LLMT_MEM_GRADS, (size_t)(m->num_params - split) * es,
                            "model gradients");
    if (!rc)
        rc = llmt_buf_alloc(m->ctx, &g->host, LLMT_MEM_HOST_STATE, (size_t)home * es,
                            "offloaded gradients");
    if (!rc)
        rc = llmt_buf_alloc(m->ctx, &g->bucket, LLMT_MEM_GRADS, bucket, "gradient bucket");
    return rc;
}

/* Copies bytes between two buffers, each host (HOST_STATE) or device memory. */
static int copy_any(const llmt_model *m, void *dst, int dst_host, const void *src, int src_host,
                    size_t bytes)
{
    if (dst_host && src_host) {
        memcpy(dst, src, bytes);
        return LLMT_OK;
    }
    return dst_host   ? m->ops->copy_to_host(m->dev, dst, src, bytes)
           : src_host ? m->ops->copy_to_device(m->dev, dst, src, bytes)
                      : m->ops->copy_on_device(m->dev, dst, src, bytes);
}

/* One placement's elements as three segments: [0, home) in host memory,
 * [home, split) zero with no room (outside the home), [split, num_params)
 * on the device. */
typedef struct segments {
    int64_t at[4];
    char *base[3]; /* NULL for the zero segment */
} segments;

static segments segments_of(const llmt_model *m, const llmt_buf *host, int64_t split,
                            const llmt_buf *dev)
{
    int64_t home = (int64_t)(host->bytes / grad_es(m));
    segments g = {{0, home, split, m->num_params}, {host->ptr, NULL, dev->ptr}};
    return g;
}

/* Copies every gradient from the model's buffers, settled within the home,
 * to `to`, laid out for split: values from either old segment with room,
 * zeros from the old zero one into the new segments with room (the new
 * zero one receives only the old zero one's elements). */
static int copy_values(const llmt_model *m, const grad_buffers *to, int64_t split)
{
    const size_t es = grad_es(m);
    const segments f = segments_of(m, &m->host_grads, m->grad_split, &m->grads);
    const segments t = segments_of(m, &to->host, split, &to->dev);
    for (int i = 0; i < 3; i++)     /* the old segment: host, zero, device */
        for (int j = 0; j < 3; j++) { /* the new one */
            int64_t a = f.at[i] > t.at[j] ? f.at[i] : t.at[j];
            int64_t b = f.at[i + 1] < t.at[j + 1] ? f.at[i + 1] : t.at[j + 1];
            if (b <= a || j == 1)
                continue;
            char *dst = t.base[j] + (size_t)(a - t.at[j]) * es;
            size_t bytes = (size_t)(b - a) * es;
            if (i == 1 && j == 0)
                memset(dst, 0, bytes);
            else if (i == 1)
                LLMT_TRY(m->ops->mem_zero(m->dev, dst, bytes));
            else
                LLMT_TRY(copy_any(m, dst, j == 0, f.base[i] + (size_t)(a - f.at[i]) * es, i == 0,
                                  bytes));
        }
    return LLMT_OK;
}

int llmt_grads_place(llmt_model *m, int64_t split)
{
    if (split < 0 || split > m->num_params || split % LLMT_SHARD_GRANULE)
        return llmt_fail(LLMT_EINVAL,
                         "gradient placement: split = %lld is not a multiple of %d in 0..%lld "
                         "(the model's parameters)",
                         (long long)split, LLMT_SHARD_GRANULE, (long long)m->num_params);
    if (split == m->grad_split)
        return LLMT_OK;
    if (!m->grads_live) { /* allocated there at first use */
        m->grad_split = split;
        return LLMT_OK;
    }
    /* Zero gradients (no bucket loaded) are not copied. Others are settled
     * within the home first (which changes where values are held, never a
     * value; a store may grow the home). */
    const int zero = m->grads_all_zero;
    if (!zero)
        LLMT_TRY(settle_home(m));
    /* The new home: the whole prefix, or on demand what the old one held
     * below split (an end of a bucket's host part there too), all of it
     * where device values move in, what a step keeps for zero gradients. */
    int64_t home = split;
    if (zero)
        home = home_kept(m, split);
    else if (m->grads_home_on_demand && split <= m->grad_split)
        home = home_end(m) < split ? home_end(m) : split;
    llmt_context *ctx = m->ctx;
    grad_buffers next = {0};
    int rc = alloc_buffers(m, split, home, &next);
    if (!rc)
        rc = zero ? zero_device(m, &next.dev) : copy_values(m, &next, split);
    if (!rc)
        rc = m->ops->synchronize(m->dev);
    grad_buffers old = {m->grads, m->host_grads, m->grad_bucket};
    buffers_free(ctx, rc ? &next : &old);
    if (rc)
        return rc;
    m->grads = next.dev;
    m->host_grads = next.host;
    m->grad_bucket = next.bucket;
    m->grad_split = split;
    /* Every value was copied: each offloaded bucket's host part inside the
     * home holds it (zero gradients: none holds one). */
    for (int32_t b = 0; b < llmt_grad_bucket_count(m); b++) {
        int64_t s, e, h;
        bucket_parts(m, b, &s, &e, &h);
        m->host_valid[b] = !zero && s < split && h <= home;
    }
    m->loaded = -1;
    return LLMT_OK;
}

int llmt_grads_ensure(llmt_model *m)
{
    if (m->grads_live)
        return LLMT_OK;
    grad_buffers g = {0};
    int rc = alloc_buffers(m, m->grad_split, home_kept(m, m->grad_split), &g);
    if (!rc)
        rc = zero_device(m, &g.dev);
    if (rc) {
        buffers_free(m->ctx, &g);
        return rc;
    }
    m->grads = g.dev;
    m->host_grads = g.host;
    m->grad_bucket = g.bucket;
    memset(m->host_valid, 0, (size_t)llmt_grad_bucket_count(m)); /* the host parts are zero */
    m->loaded = -1;
    m->grads_live = 1;
    m->grads_all_zero = 1;
    return LLMT_OK;
}

int llmt_grads_io(llmt_model *m, int64_t off, int64_t n, float *buf, int to_grads)
{
    /* A write needs room for the whole prefix; a read only what the room
     * holds, the host parts past it being zero. */
    LLMT_TRY(llmt_grads_ensure(m));
    LLMT_TRY(to_grads ? llmt_grads_settle(m) : settle_home(m));
    if (to_grads)
        m->grads_all_zero = 0;
    const size_t es = grad_es(m);
    int64_t h = off + n < m->grad_split ? off + n : m->grad_split; /* host part [off, h) */
    int64_t r = h < home_end(m) ? h : home_end(m);                 /* [off, r) in the room */
    if (h > off && to_grads)
        llmt_transfer_narrow((char *)m->host_grads.ptr + (size_t)off * es, m->dt, buf, h - off);
    else if (h > off) {
        if (r > off)
            llmt_transfer_widen(buf, (char *)m->host_grads.ptr + (size_t)off * es, m->dt, r - off);
        for (int64_t i = r > off ? r : off; i < h; i++)
            buf[i - off] = 0.0f;
    }
    int64_t d = h > off ? h : off; /* device part [d, off + n) */
    if (off + n <= d)
        return LLMT_OK;
    return to_grads ? llmt_transfer_in(m, m->grads.ptr, m->dt, d - m->grad_split, buf + (d - off),
                                       off + n - d)
                    : llmt_transfer_out(m, m->grads.ptr, m->dt, d - m->grad_split,
                                        buf + (d - off), off + n - d);
}
