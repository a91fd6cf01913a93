/* ZeRO-1: an optimizer that owns one range of the flat parameter buffer.
 * Gradients reach their owner through the communicator, the owner adds the
 * contributions in a fixed order, updates its range, and the ranges are
 * all-gathered back into every rank's weights.
 *
 * The model's weights and gradients, grad_sum and recv are the backend's
 * memory (device memory on CUDA, which the communicator then moves: NCCL):
 * the host never dereferences them, it only hands them to backend ops and
 * collectives, or copies them (ops->copy_to_host). What the host reads is
 * host memory on every backend: the norm's partials and counts, which an
 * NCCL engine stages through device memory. */
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "core/context_internal.h"
#include "core/error.h"
#include "dist/shard.h"
#include "model/grad_place.h"
#include "model/model_internal.h"
#include "optim/optim_internal.h"

/* Bytes of the weights hashed per copy to the host where the backend's
 * memory is not host memory. */
#define HASH_CHUNK ((size_t)16 << 20)

/* Feeds the model's weights to h: in place where they are host memory,
 * else copied to the host HASH_CHUNK bytes at a time. */
static int hash_weights(XXH3_state_t *h, const llmt_model *m)
{
    if (m->ops->host_memory) {
        XXH3_64bits_update(h, m->weights.ptr, m->weights.bytes);
        return LLMT_OK;
    }
    size_t cap = m->weights.bytes < HASH_CHUNK ? m->weights.bytes : HASH_CHUNK;
    char *buf = malloc(cap ? cap : 1);
    if (!buf)
        return llmt_fail(LLMT_ENOMEM, "llmt_optimizer_create_sharded: out of host memory");
    int rc = LLMT_OK;
    for (size_t at = 0; at < m->weights.bytes && !rc; at += cap) {
        size_t take = m->weights.bytes - at < cap ? m->weights.bytes - at : cap;
        rc = m->ops->copy_to_host(m->dev, buf, (const char *)m->weights.ptr + at, take);
        if (!rc)
            XXH3_64bits_update(h, buf, take);
    }
    free(buf);
    return rc;
}

/* A hash of what every rank must agree on before the first exchange: the
 * model's shape, dtype and weights, and the optimizer's configuration. */
static int agreement_hash(const llmt_optimizer *o, int32_t reduce_mode, uint64_t *out)
{
    const llmt_model *m = o->model;
    const llmt_optimizer_config *c = &o->cfg;
    double settings[] = {c->lr, c->beta1, c->beta2, c->eps, c->weight_decay, c->grad_clip,
                         c->min_lr, (double)c->decay_norms, (double)c->schedule,
                         (double)c->warmup_steps, (double)c->total_steps,
                         (double)m->num_params, (double)m->dt, (double)m->cfg.precision,
                         (double)reduce_mode};
    XXH3_state_t *h = XXH3_createState();
    if (!h)
        return llmt_fail(LLMT_ENOMEM, "llmt_optimizer_create_sharded: out of host memory");
    XXH3_64bits_reset(h);
    XXH3_64bits_update(h, settings, sizeof settings);
    for (int32_t i = 0; i < m->n_params; i++)
        XXH3_64bits_update(h, m->params[i].name, strlen(m->params[i].name));
    int rc = hash_weights(h, m);
    *out = XXH3_64bits_digest(h);
    XXH3_freeState(h);
    return rc;
}

/* Fills the ranks' element and granule bounds and allocates this rank's
 * share; each rank reports its own failure and the ranks agree on it. */
static int setup(llmt_optimizer *o, llmt_comm *comm, int32_t reduce_mode)
{
    llmt_model *m = o->model;
    const int32_t n = llmt_comm_size(comm), me = llmt_comm_rank(comm);
    o->comm = comm;
    o->reduce_mode = reduce_mode;
    o->bounds = calloc((size_t)n + 1, sizeof *o->bounds);
    o->block_bounds = calloc((size_t)n + 1, sizeof *o->block_bounds);
    o->tensor_bounds = calloc((size_t)n + 1, sizeof *o->tensor_bounds);
    if (!o->bounds || !o->block_bounds || !o->tensor_bounds)
        return llmt_fail(LLMT_ENOMEM, "llmt_optimizer_create_sharded: out of host memory");
    for (int32_t r = 0; r < n; r++) {
        int64_t end = 0;
        llmt_shard_range(m->num_params, n, r, &o->bounds[r], &end);
        o->bounds[r + 1] = end;
    }
    for (int32_t r = 0; r <= n; r++) /* range starts are granules, or the end */
        o->block_bounds[r] = (o->bounds[r] + LLMT_SHARD_GRANULE - 1) / LLMT_SHARD_GRANULE;
    LLMT_TRY(llmt_optimizer_alloc_state(o, o->bounds[me], o->bounds[me + 1]));
    size_t sum_bytes = 0, recv_bytes = 0;
    llmt_shard_buffer_sizes(m->num_params, n, me, llmt_dtype_size(m->dt), &sum_bytes, &recv_bytes);
    LLMT_TRY(llmt_buf_alloc(m->ctx, &o->grad_sum, LLMT_MEM_GRADS, sum_bytes,
                            "owned gradient sum"));
    return llmt_buf_alloc(m->ctx, &o->recv, LLMT_MEM_WORKSPACE, recv_bytes,
                          "gradient exchange buffer");
}

/* The checks one rank can make alone; their outcome is agreed. The
 * communicator must move the memory the model's buffers are in: host
 * memory (a host table, MPI) for the CPU backend, device memory (NCCL) for
 * a backend whose memory the host cannot read (CUDA). */
static int check_sharded(const char *fn, llmt_model *model, const llmt_optimizer_config *cfg,
                         llmt_comm *comm, int32_t reduce_mode)
{
    if (!model || !cfg)
        return llmt_fail(LLMT_EINVAL, "%s: %s is NULL", fn, !model ? "model" : "cfg");
    if (reduce_mode != LLMT_REDUCE_DETERMINISTIC && reduce_mode != LLMT_REDUCE_FAST)
        return llmt_fail(LLMT_EINVAL, "%s: reduce_mode = %d is not an llmt_reduce_mode", fn,
                         reduce_mode);
    LLMT_TRY(llmt_optimizer_config_check(cfg, fn));
    const llmt_backend_ops *ops = model->ops;
    if (!ops->adamw || !ops->cast || !ops->accumulate || !ops->grad_stats_blocks)
        return llmt_fail(LLMT_EUNSUPPORTED, "%s: the %s backend cannot shard the optimizer (it "
                         "needs blocked gradient statistics and an fp32 accumulate)", fn,
                         ops->name);
    if (comm->device && ops->host_memory)
        return llmt_fail(LLMT_EUNSUPPORTED, "%s: comm is an NCCL communicator, which moves CUDA "
                         "device memory, but the model is on the %s backend, whose buffers are "
                         "host memory: use a host communicator (llmt_comm_mpi_create or "
                         "llmt_comm_create)", fn, ops->name);
    if (!comm->device && !ops->host_memory)
        return llmt_fail(LLMT_EUNSUPPORTED, "%s: the model is on the %s backend, whose buffers "
                         "are device memory, but comm moves host memory (a host table such as "
                         "MPI's): use an NCCL communicator on the model's context "
                         "(llmt_comm_create_nccl)", fn, ops->name);
    /* Its collectives run on its context's stream, which waits for nothing
     * on another context's: the model's kernels must be on the same one. */
    if (comm->device && comm->device != model->dev)
        return llmt_fail(LLMT_EINVAL, "%s: comm was made on another context than the model's "
                         "(its collectives would not wait for the model's kernels): make the "
                         "NCCL communicator on the model's context", fn);
    return LLMT_OK;
}

int llmt_optimizer_create_sharded(llmt_optimizer **out, llmt_model *model,
                                  const llmt_optimizer_config *cfg, llmt_comm *comm,
                                  int32_t reduce_mode)
{
    const char *fn = "llmt_optimizer_create_sharded";
    if (!out || !comm)
        return llmt_fail(LLMT_EINVAL, "%s: %s is NULL", fn, out ? "comm" : "out");
    *out = NULL;
    int rc = check_sharded(fn, model, cfg, comm, reduce_mode);
    llmt_optimizer *o = rc ? NULL : calloc(1, sizeof *o);
    if (!rc && !o)
        rc = llmt_fail(LLMT_ENOMEM, "%s: out of host memory", fn);
    rc = llmt_comm_agree(comm, rc); /* before the collectives below */
    if (rc) {
        free(o);
        return rc;
    }
    o->model = model;
    llmt_optimizer_config_copy(&o->cfg, cfg);
    uint64_t hash = 0;
    rc = llmt_comm_agree(comm, agreement_hash(o, reduce_mode, &hash));
    if (!rc)
        rc = llmt_comm_check_same(comm, "the model (configuration and weights), the optimizer "
                                  "configuration or the reduce mode", hash);
    if (!rc)
        rc = llmt_comm_agree(comm, setup(o, comm, reduce_mode));
    if (rc) {
        llmt_optimizer_free(o);
        return llmt_fail_prefix(rc, "%s", fn);
    }
    *out = o;
    return LLMT_OK;
}

void llmt_optimizer_free_sharded(llmt_optimizer *o)
{
    llmt_context *ctx = o->model->ctx;
    llmt_buf_free(ctx, &o->grad_sum);
    llmt_buf_free(ctx, &o->recv);
    free(o->bounds);
    free(o->block_bounds);
    free(o->tensor_bounds);
}

int llmt_optimizer_reduce_begin(llmt_optimizer *o)
{
    const llmt_model *m = o->model;
    o->grads_reduced = 1;
    return m->ops->mem_zero(m->dev, o->grad_sum.ptr, o->grad_sum.bytes);
}

/* The reduction of the model's gradients [s, e) for one round, read from
 * src (element s's address; the bytes must be the backend's memory), in
 * windows of at most llmt_exchange_window elements: every rank i with
 * present[i] sends each owner the part of the window in the owner's range,
 * and each owner adds the pieces to its gradient sum in rank order, in
 * fp32. Queued on the engine (llmt_comm_alltoallv_add;
 * llmt_optimizer_reduce_join orders the device after it) when `queued`,
 * else done before returning. Every element is in one window, so the order
 * of its additions, and so its bits, do not depend on [s, e). */
static int reduce_range(llmt_optimizer *o, int64_t s, int64_t e, const char *src,
                        const uint8_t *present, int queued)
{
    const llmt_model *m = o->model;
    const int32_t n = llmt_comm_size(o->comm), me = llmt_comm_rank(o->comm);
    const size_t es = llmt_dtype_size(m->dt);
    const int64_t window = llmt_exchange_window(n, es);
    size_t *counts = o->comm->counts;
    size_t *send_bytes = counts, *send_offsets = counts + n, *recv_bytes = counts + 2 * n,
           *recv_offsets = counts + 3 * n;
    int rc = LLMT_OK;
    for (int64_t w0 = s; w0 < e && !rc; w0 += window) {
        int64_t w1 = w0 + window < e ? w0 + window : e;
        for (int32_t r = 0; r < n; r++) {
            int64_t a = o->bounds[r] > w0 ? o->bounds[r] : w0;
            int64_t b = o->bounds[r + 1] < w1 ? o->bounds[r + 1] : w1;
            send_bytes[r] = present[me] && b > a ? (size_t)(b - a) * es : 0;
            send_offsets[r] = b > a ? (size_t)(a - w0) * es : 0;
        }
        int64_t a = o->first > w0 ? o->first : w0, b = o->end < w1 ? o->end : w1;
        size_t slot = b > a ? (size_t)(b - a) * es : 0;
        for (int32_t r = 0; r < n; r++) {
            recv_bytes[r] = present[r] ? slot : 0;
            recv_offsets[r] = (size_t)r * slot;
        }
        float *sum = (float *)o->grad_sum.ptr + (slot ? a - o->first : 0);
        const void *send = src + (size_t)(w0 - s) * es;
        if (queued) {
            rc = llmt_comm_alltoallv_add(o->comm, "gradient exchange", send, send_bytes,
                                         send_offsets, o->recv.ptr, recv_bytes, recv_offsets, sum,
                                         slot ? b - a : 0, m->dt);
            continue;
        }
        rc = llmt_comm_alltoallv(o->comm, "gradient exchange", send, send_bytes, send_offsets,
                                 o->recv.ptr, recv_bytes, recv_offsets);
        /* In rank order, which is global micro-batch order within a round,
         * in fp32 as the ordered slicer adds. */
        for (int32_t r = 0; r < n && !rc && slot; r++)
            if (present[r])
                rc = m->ops->accumulate(m->dev, sum, (char *)o->recv.ptr + recv_offsets[r], b - a,
                                        m->dt);
    }
    return rc;
}

/* The round's reduction of the offloaded gradients [0, grad_split) after
 * backward (an overlapped one sends them from the gradient bucket's slots,
 * llmt_optimizer_reduce_bucket), from host memory (host_grads): sent from
 * there where that is the backend's memory, else uploaded into the model's
 * gradient bucket LLMT_GRAD_STATS_CHUNK elements at a time, as the norm's
 * uploads are (slot 0 holds that many; it is free once the gradients are
 * settled), and sent from it. The upload is queued on the device before
 * the exchange, which the engine orders after it and waits for, so the
 * next upload does not overwrite bytes still to be sent. The exchange's
 * windows are cut at the split (and at every chunk), so the ranks' calls
 * line up only where their splits are the same: the trainer and
 * llmt_optimizer_step check that they are. */
static int reduce_offloaded(llmt_optimizer *o, const uint8_t *present)
{
    const llmt_model *m = o->model;
    const size_t es = llmt_dtype_size(m->dt);
    const int64_t gs = m->grad_split;
    if (m->ops->host_memory)
        return gs > 0 ? reduce_range(o, 0, gs, m->host_grads.ptr, present, 0) : LLMT_OK;
    for (int64_t c = 0; c < gs; c += LLMT_GRAD_STATS_CHUNK) {
        int64_t k = gs - c < LLMT_GRAD_STATS_CHUNK ? gs - c : LLMT_GRAD_STATS_CHUNK;
        LLMT_TRY(m->ops->copy_on_device(m->dev, m->grad_bucket.ptr,
                                        (const char *)m->host_grads.ptr + (size_t)c * es,
                                        (size_t)k * es));
        LLMT_TRY(reduce_range(o, c, c + k, m->grad_bucket.ptr, present, 0));
    }
    return LLMT_OK;
}

int llmt_optimizer_reduce_round(llmt_optimizer *o, const uint8_t *present)
{
    /* The gradients where this optimizer's placement puts them (another
     * optimizer of the model may have moved them), whole in host_grads
     * below the split and in the device buffer from it. */
    llmt_model *m = o->model;
    LLMT_TRY(llmt_offload_place_grads(o));
    LLMT_TRY(llmt_grads_settle(m));
    LLMT_TRY(reduce_offloaded(o, present));
    return reduce_range(o, m->grad_split, m->num_params, m->grads.ptr, present, 0);
}

int llmt_optimizer_reduce_overlaps(llmt_optimizer *o, int one_micro, int *overlaps)
{
    *overlaps = 0;
    if (!o->comm->alltoallv_add)
        return LLMT_OK;
    llmt_model *m = o->model;
    llmt_grads_home_on_demand(m, one_micro && llmt_grad_bucket_slots(m->ops->host_memory) > 1);
    LLMT_TRY(llmt_offload_place_grads(o));
    LLMT_TRY(llmt_grads_ensure(m));
    /* Offloaded buckets are sent from their slots: one slot's exchange
     * runs while backward writes the other (grad_buckets.c). */
    *overlaps = m->grad_split == 0 || llmt_grad_bucket_slots(m->ops->host_memory) > 1;
    return LLMT_OK;
}

int llmt_optimizer_reduce_bucket(llmt_optimizer *o, int32_t bucket, const uint8_t *present)
{
    llmt_model *m = o->model;
    int64_t s = 0, e = 0;
    llmt_grad_bucket_range(m, bucket, &s, &e);
    if (s >= m->grad_split) /* in the device segment, which starts at the split */
        return reduce_range(o, s, e, llmt_model_at(m, &m->grads, s - m->grad_split), present, 1);
    if (!present[llmt_comm_rank(o->comm)]) /* sends nothing: any address in the bucket serves */
        return reduce_range(o, s, e, m->grad_bucket.ptr, present, 1);
    /* Offloaded: sent from its slot of the gradient bucket, where backward
     * wrote it (loaded there if backward did not reach it), not stored to
     * host memory. The exchanges that may still read the other slot are
     * joined first, so that the ops after this bucket's (the next bucket's
     * load into that slot) wait for them, and this bucket's exchange, not
     * yet queued, runs while the next bucket is computed (grad_buckets.c's
     * invariant 5). */
    if (m->slots_sent)
        LLMT_TRY(llmt_optimizer_reduce_join(o));
    char *base = NULL;
    LLMT_TRY(llmt_grads_acquire(m, bucket, &base));
    LLMT_TRY(reduce_range(o, s, e, base, present, 1));
    return llmt_grads_sent(m, bucket);
}

int llmt_optimizer_reduce_join(llmt_optimizer *o)
{
    int rc = llmt_comm_join(o->comm, "gradient exchange");
    /* Joined, the device's later ops wait for every queued exchange; the
     * join failed, the engine is aborted and what it queued is not used. */
    llmt_grads_sent_joined(o->model);
    return rc;
}

int llmt_round_in_place(llmt_device *dev, void *buf, int64_t n, int dt, void *bounce,
                        size_t bounce_bytes)
{
    const llmt_backend_ops *ops = dev->ops;
    const size_t es = llmt_dtype_size(dt);
    const int64_t chunk = (int64_t)(bounce_bytes / es);
    if (n > 0 && chunk < 1)
        return llmt_fail(LLMT_EINVAL, "llmt_round_in_place: bounce_bytes = %zu holds no element "
                         "of %zu bytes", bounce_bytes, es);
    for (int64_t a = 0; a < n; a += chunk) {
        int64_t c = n - a < chunk ? n - a : chunk;
        LLMT_TRY(ops->cast(dev, bounce, dt, (float *)buf + a, LLMT_DTYPE_F32, c));
        LLMT_TRY(ops->copy_on_device(dev, (char *)buf + (size_t)a * es, bounce, (size_t)c * es));
    }
    return LLMT_OK;
}

int llmt_optimizer_sharded_stats(llmt_optimizer *o, float inv_scale, double *sumsq,
                                 int64_t *nonfinite)
{
    const llmt_model *m = o->model;
    const int32_t me = llmt_comm_rank(o->comm), n = llmt_comm_size(o->comm);
    int64_t bad = 0;
    /* The 16-bit modes: the fp32 sum rounded once, as the ordered slicer
     * rounds its sum, through the receive buffer (free between reductions
     * and at least min(owned, window) gradients large). Once per reduction:
     * llmt_optimizer_step clears grads_reduced before it gets here, so any
     * retry reduces again from llmt_optimizer_reduce_begin, which zeroes
     * the sum. */
    if (m->dt != LLMT_DTYPE_F32)
        LLMT_TRY(llmt_round_in_place(m->dev, o->grad_sum.ptr, o->end - o->first, m->dt,
                                     o->recv.ptr, o->recv.bytes));
    if (o->end > o->first)
        LLMT_TRY(m->ops->grad_stats_blocks(m->dev, o->grad_sum.ptr, o->end - o->first, m->dt,
                                           inv_scale, LLMT_SHARD_GRANULE,
                                           o->partials + o->block_bounds[me], &bad,
                                           o->scratch.ptr));
    LLMT_TRY(llmt_comm_allgather_ranges(o->comm, "gradient norm", o->partials, sizeof(double),
                                        o->block_bounds));
    LLMT_TRY(llmt_comm_allreduce_i64(o->comm, "gradient norm", &bad, 1, LLMT_COMM_SUM));
    double total = 0.0;
    for (int64_t b = 0; b < o->block_bounds[n]; b++) /* block order, as unsharded */
        total += o->partials[b];
    *sumsq = total;
    *nonfinite = bad;
    return LLMT_OK;
}

int llmt_optimizer_gather_weights(llmt_optimizer *o)
{
    llmt_model *m = o->model;
    return llmt_comm_allgather_ranges(o->comm, "weight all-gather", m->weights.ptr,
                                      llmt_dtype_size(m->dt), o->bounds);
}

int llmt_optimizer_gather_tensor(llmt_optimizer *o, int sec, int64_t s, int64_t n, float *out)
{
    const int32_t size = llmt_comm_size(o->comm);
    int64_t *tb = o->tensor_bounds;
    for (int32_t r = 0; r <= size; r++) {
        int64_t x = o->bounds[r] < s ? s : o->bounds[r] > s + n ? s + n : o->bounds[r];
        tb[r] = x - s;
    }
    const int32_t me = llmt_comm_rank(o->comm);
    int rc = LLMT_OK;
    if (tb[me + 1] > tb[me])
        rc = llmt_offload_state_io(o, sec, s + tb[me], tb[me + 1] - tb[me], out + tb[me], 0);
    rc = llmt_comm_agree(o->comm, rc);
    if (!rc)
        rc = llmt_comm_allgather_ranges(o->comm, "llmt_optimizer_get_state", out, sizeof(float),
                                        tb);
    return rc;
}
