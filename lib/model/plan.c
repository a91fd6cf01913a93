/* llmt_plan: per-category bytes of a configuration, from the functions that
 * size the real buffers: the parameter table (weights, gradients), the
 * optimizer's sizes, the activation layout, the ops' scratch and, for one
 * rank of a data-parallel run, the ZeRO-1 shard's buffers. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/context_internal.h"
#include "core/cuda_plugin_ops.h"
#include "core/error.h"
#include "dist/shard.h"
#include "llmt/plan.h"
#include "model/grad_place.h"
#include "model/model_internal.h"
#include "model/ordered_sum.h"
#include "ops/cpu/cpu_backend.h"
#include "optim/offload.h"
#include "optim/optim_internal.h"

/* The most host threads a plan without a context takes: a context's bound. */
#define PLAN_MAX_THREADS 1024

/* Bytes of the older structs: everything before the fields the next
 * version appended. */
#define PLAN_CONFIG_V1_BYTES offsetof(llmt_plan_config, world_size)
#define PLAN_CONFIG_V2_BYTES offsetof(llmt_plan_config, offload_parts)
#define PLAN_CONFIG_V3_BYTES offsetof(llmt_plan_config, host_budget)
#define PLAN_CONFIG_V4_BYTES offsetof(llmt_plan_config, reduce_mode)
#define PLAN_V1_BYTES offsetof(llmt_plan, rank)
#define PLAN_V2_BYTES offsetof(llmt_plan, host_peak)

void llmt_plan_config_init(llmt_plan_config *cfg)
{
    if (cfg) {
        const llmt_plan_config defaults = LLMT_PLAN_CONFIG_INIT;
        *cfg = defaults;
    }
}

/* What the parameter table of a configuration decides: its size, the end
 * of the flat prefix whose optimizer state c offloads (by the optimizer's
 * own llmt_offload_prefix, so plan and placement agree), and with gradient
 * offload the gradient split, the device bucket's elements and the host
 * copy's elements kept on demand (by the model's own grad_place.h
 * functions, for a backend whose memory the host can or cannot read). */
typedef struct param_counts {
    int64_t params, prefix, grad_split, bucket, home_kept;
} param_counts;

static int count_params(const llmt_plan_config *c, int host_memory, param_counts *out)
{
    llmt_model tmp;
    memset(&tmp, 0, sizeof tmp);
    memset(out, 0, sizeof *out);
    tmp.cfg = c->model;
    llmt_dims_from_config(&c->model, &tmp.dims);
    int rc = llmt_model_build_params(&tmp);
    out->params = tmp.num_params;
    if (!rc) {
        out->prefix = llmt_offload_prefix(&tmp, c->offload_parts, c->offload_layers);
        if (c->offload_parts & LLMT_OFFLOAD_GRADS) {
            out->grad_split = llmt_grad_split(out->prefix);
            out->bucket = llmt_grad_bucket_elems(&tmp, out->grad_split, host_memory);
            out->home_kept = llmt_grad_home_elems(&tmp, out->grad_split);
        }
    }
    free(tmp.params);
    free(tmp.layer);
    return rc;
}

/* The offload fields (version 3) of a configuration whose other fields are
 * checked. */
static int check_offload_fields(const llmt_plan_config *c, const char *fn)
{
    int rc = llmt_offload_check_parts(fn, "cfg->offload_parts", c->offload_parts);
    if (rc)
        return rc;
    if (c->offload_layers < LLMT_OFFLOAD_ALL_LAYERS || c->offload_layers > c->model.num_layers)
        return llmt_fail(LLMT_EINVAL, "%s: cfg->offload_layers = %d is neither "
                         "LLMT_OFFLOAD_ALL_LAYERS (-1) nor in 0..%d (the model's layers)", fn,
                         c->offload_layers, c->model.num_layers);
    if (c->offload_parts != LLMT_OFFLOAD_NONE && !c->with_optimizer)
        return llmt_fail(LLMT_EINVAL, "%s: cfg->offload_parts = %d needs cfg->with_optimizer = 1 "
                         "(it places the optimizer's state)", fn, c->offload_parts);
    return LLMT_OK;
}

/* The data-parallel fields (version 2) of a configuration. */
static int check_dist_fields(const llmt_plan_config *c, const char *fn)
{
    if (c->world_size < 0 || c->world_size > LLMT_PLAN_MAX_WORLD)
        return llmt_fail(LLMT_EINVAL, "%s: cfg->world_size = %d (must be 0, no communicator, "
                         "or 1..%d ranks)", fn, c->world_size, LLMT_PLAN_MAX_WORLD);
    if (c->world_size == 0 && c->rank != -1)
        return llmt_fail(LLMT_EINVAL, "%s: cfg->rank = %d with cfg->world_size = 0 (must be -1: "
                         "there are no ranks without a communicator)", fn, c->rank);
    if (c->world_size > 0 && (c->rank < -1 || c->rank >= c->world_size))
        return llmt_fail(LLMT_EINVAL, "%s: cfg->rank = %d (must be -1, the rank with the largest "
                         "peak, or 0..%d: cfg->world_size is %d)", fn, c->rank,
                         c->world_size - 1, c->world_size);
    if (c->world_size > 0 && !c->with_optimizer)
        return llmt_fail(LLMT_EINVAL, "%s: cfg->world_size = %d needs cfg->with_optimizer = 1 "
                         "(ZeRO-1 shards the optimizer)", fn, c->world_size);
    if (c->batch_size != 0 && c->batch_size < c->micro_batch)
        return llmt_fail(LLMT_EINVAL, "%s: cfg->batch_size = %d (must be 0, meaning micro_batch, "
                         "or at least cfg->micro_batch = %d)", fn, c->batch_size, c->micro_batch);
    if (c->ordered_accumulation != 0 && c->ordered_accumulation != 1)
        return llmt_fail(LLMT_EINVAL, "%s: cfg->ordered_accumulation = %d (must be 0 or 1)", fn,
                         c->ordered_accumulation);
    if (c->reduce_mode != LLMT_REDUCE_DETERMINISTIC && c->reduce_mode != LLMT_REDUCE_FAST)
        return llmt_fail(LLMT_EINVAL, "%s: cfg->reduce_mode = %d is not an llmt_reduce_mode "
                         "(LLMT_REDUCE_DETERMINISTIC %d, LLMT_REDUCE_FAST %d)", fn,
                         c->reduce_mode, LLMT_REDUCE_DETERMINISTIC, LLMT_REDUCE_FAST);
    return LLMT_OK;
}

/* A configuration of the current version. */
static int check_plan_config(const llmt_plan_config *c, const char *fn)
{
    int rc = llmt_model_config_check(&c->model, fn);
    if (rc)
        return rc;
    if (c->micro_batch < 1)
        return llmt_fail(LLMT_EINVAL, "%s: cfg->micro_batch = %d (must be >= 1)", fn, c->micro_batch);
    if (c->seq_len < 1 || c->seq_len > c->model.max_seq_len)
        return llmt_fail(LLMT_EINVAL, "%s: cfg->seq_len = %d (must be 1..%d, the model's "
                         "max_seq_len)", fn, c->seq_len, c->model.max_seq_len);
    if (c->with_optimizer != 0 && c->with_optimizer != 1)
        return llmt_fail(LLMT_EINVAL, "%s: cfg->with_optimizer = %d (must be 0 or 1)", fn,
                         c->with_optimizer);
    for (int32_t l = 0; l < (c->layer_recompute ? c->model.num_layers : 1); l++) {
        int32_t p = c->layer_recompute ? c->layer_recompute[l] : c->recompute;
        if (p < 0 || p > LLMT_RECOMPUTE_MASK)
            return llmt_fail(LLMT_EINVAL, "%s: recompute policy %d (layer %d) is not a "
                             "combination of llmt_recompute_policy flags", fn, p, l);
    }
    rc = check_dist_fields(c, fn);
    return rc ? rc : check_offload_fields(c, fn);
}

/* Copies a configuration of an older version (its bytes only, the appended
 * fields at their defaults) or of the current version into *out, as the
 * current version, and checks it. */
static int upgrade_plan_config(const llmt_plan_config *in, llmt_plan_config *out, const char *fn)
{
    if (in->version < 1 || in->version > LLMT_PLAN_CONFIG_VERSION)
        return llmt_fail(LLMT_EVERSION, "%s: cfg->version = %u, this library knows 1..%u", fn,
                         in->version, LLMT_PLAN_CONFIG_VERSION);
    llmt_plan_config_init(out);
    memcpy(out, in, in->version == 1   ? PLAN_CONFIG_V1_BYTES
                    : in->version == 2 ? PLAN_CONFIG_V2_BYTES
                    : in->version == 3 ? PLAN_CONFIG_V3_BYTES
                    : in->version == 4 ? PLAN_CONFIG_V4_BYTES
                                       : sizeof *out);
    out->version = LLMT_PLAN_CONFIG_VERSION;
    return check_plan_config(out, fn);
}

/* What an optimizer owning [first, end) allocates: its state's device
 * segment [split, end) (OPTIMIZER) and host segment [first, split) with its
 * staging (HOST_STATE), split being the offloaded prefix's end clamped to
 * the range (llmt_offload_split_of), and for one rank of a sharded
 * optimizer (llmt_optimizer_create_sharded) the owner's gradient sum (fp32)
 * and the exchange receive buffer. */
typedef struct shard_bytes {
    int64_t first, end;
    uint64_t optimizer, host, grad_sum, recv;
} shard_bytes;

/* The state bytes of the range [out->first, out->end) with the offloaded
 * prefix [0, prefix), into out's optimizer and host fields. */
static void state_bytes(int precision, size_t elem, int64_t prefix, int host_memory,
                        shard_bytes *out)
{
    int64_t split = llmt_offload_split_of(prefix, out->first, out->end);
    size_t moment = 0, master = 0, host_moment = 0, host_master = 0;
    llmt_optimizer_sizes(precision, out->end - split, &moment, &master);
    llmt_optimizer_sizes(precision, split - out->first, &host_moment, &host_master);
    out->optimizer = 2 * (uint64_t)moment + master;
    out->host = 2 * (uint64_t)host_moment + host_master +
                llmt_offload_staging_bytes(host_memory, split - out->first, elem);
}

static void rank_shard_bytes(int precision, size_t elem, int64_t params, int64_t prefix,
                             int host_memory, int32_t size, int32_t rank, shard_bytes *out)
{
    size_t grad_sum = 0, recv = 0;
    llmt_shard_range(params, size, rank, &out->first, &out->end);
    state_bytes(precision, elem, prefix, host_memory, out);
    llmt_shard_buffer_sizes(params, size, rank, elem, &grad_sum, &recv);
    out->grad_sum = grad_sum;
    out->recv = recv;
}

/* The rank of c to plan, and its shard: c->rank, or the lowest rank whose
 * shard's device bytes are the largest (every other device byte is the
 * same on all ranks). */
static int32_t plan_rank(const llmt_plan_config *c, size_t elem, int64_t params, int64_t prefix,
                         int host_memory, shard_bytes *out)
{
    int32_t best = c->rank < 0 ? 0 : c->rank;
    rank_shard_bytes(c->model.precision, elem, params, prefix, host_memory, c->world_size, best,
                     out);
    for (int32_t r = best + 1; c->rank < 0 && r < c->world_size; r++) {
        shard_bytes s;
        rank_shard_bytes(c->model.precision, elem, params, prefix, host_memory, c->world_size, r,
                         &s);
        if (s.optimizer + s.grad_sum + s.recv > out->optimizer + out->grad_sum + out->recv) {
            *out = s;
            best = r;
        }
    }
    return best;
}

/* Elements of the offloaded gradients rank keeps in host memory (every
 * rank holds the whole model's gradients; llmt_dp_grad_home): on a backend
 * whose memory the host cannot read the engine is NCCL's, which sends them
 * from the device bucket. */
static int64_t rank_grad_home(const llmt_plan_config *c, const param_counts *n,
                              int host_memory, int32_t rank)
{
    const int32_t batch = c->batch_size ? c->batch_size : c->micro_batch;
    const int32_t count = (batch + c->micro_batch - 1) / c->micro_batch;
    return llmt_dp_grad_home(n->grad_split, n->home_kept, !host_memory, c->reduce_mode,
                             count, c->world_size, rank);
}

/* The most host bytes any of c's ranks holds, for parameters of elem
 * bytes: its shard's offloaded state and its offloaded gradients. */
static uint64_t most_rank_host(const llmt_plan_config *c, const param_counts *n, size_t elem,
                               int host_memory)
{
    uint64_t most = 0;
    for (int32_t r = 0; r < c->world_size; r++) {
        shard_bytes s;
        rank_shard_bytes(c->model.precision, elem, n->params, n->prefix, host_memory,
                         c->world_size, r, &s);
        uint64_t host = s.host + (uint64_t)rank_grad_home(c, n, host_memory, r) * elem;
        most = host > most ? host : most;
    }
    return most;
}

/* The plan of a checked configuration, for a backend's op table (only its
 * size functions are called) and a host thread count; out is a whole
 * current-version plan. With most_host (not NULL), *most_host receives the
 * host bytes the fit holds to c->host_budget: out->host_peak, or with a
 * host budget, world_size and rank -1 the most of any rank's (out plans the
 * rank with the most device bytes, which holds the least offloaded
 * state). */
static int plan(const llmt_backend_ops *ops, int num_threads, const llmt_plan_config *c,
                llmt_plan *out, uint64_t *most_host)
{
    if ((c->offload_parts & LLMT_OFFLOAD_GRADS) && !ops->grad_stats_blocks)
        return llmt_fail(LLMT_EUNSUPPORTED, "llmt_plan_compute: cfg->offload_parts = %d: gradient "
                         "offload needs the gradient norm per granule, which the %s backend does "
                         "not have", c->offload_parts, ops->name);
    param_counts n;
    int rc = count_params(c, ops->host_memory, &n);
    const int64_t params = n.params, split = n.prefix;
    uint8_t *flags = malloc((size_t)c->model.num_layers);
    if (!rc && !flags)
        rc = llmt_fail(LLMT_ENOMEM, "llmt_plan_compute: out of host memory");
    if (rc) {
        free(flags);
        return rc;
    }
    for (int32_t l = 0; l < c->model.num_layers; l++)
        flags[l] = (uint8_t)(c->layer_recompute ? c->layer_recompute[l] : c->recompute);
    llmt_layout lay;
    rc = llmt_layout_compute(&c->model, flags, c->micro_batch, c->seq_len, num_threads, ops, 0,
                             &lay);
    free(flags);
    if (rc)
        return rc;
    size_t e = llmt_dtype_size(llmt_precision_dtype(c->model.precision));
    shard_bytes shard = {0, params, 0, 0, 0, 0};
    out->rank = -1;
    if (c->world_size > 0)
        out->rank = plan_rank(c, e, params, split, ops->host_memory, &shard);
    else if (c->with_optimizer)
        state_bytes(c->model.precision, e, split, ops->host_memory, &shard);
    /* Gradient offload: [0, grad_split) on the host (with a communicator
     * rank_grad_home's part of it), the rest and one bucket on the device
     * (grad_split and bucket are 0 without it). Without a communicator, an
     * ordered slicer sums
     * each micro-batch's gradient into one more buffer, fp32 in every
     * mode, split as the gradients are (ordered_sum.h), when the batch has
     * more than one. */
    int32_t batch = c->batch_size ? c->batch_size : c->micro_batch;
    uint64_t sum_device = 0, sum_host = 0;
    if (c->world_size == 0 && c->ordered_accumulation && batch > c->micro_batch)
        llmt_ordered_sum_bytes(params, n.grad_split, &sum_device, &sum_host);
    const int64_t grad_home = c->world_size > 0 ? rank_grad_home(c, &n, ops->host_memory,
                                                                 out->rank)
                                                : n.grad_split;
    uint64_t host_state = shard.host + (uint64_t)grad_home * e + sum_host;
    memset(out->bytes, 0, sizeof out->bytes);
    out->bytes[LLMT_MEM_PARAMS] = (uint64_t)params * e;
    out->bytes[LLMT_MEM_GRADS] = (uint64_t)(params - n.grad_split + n.bucket) * e + sum_device +
                                 shard.grad_sum;
    out->bytes[LLMT_MEM_OPTIMIZER] = shard.optimizer;
    out->bytes[LLMT_MEM_HOST_STATE] = host_state;
    out->bytes[LLMT_MEM_ACTIVATIONS] = lay.act_bytes;
    out->bytes[LLMT_MEM_WORKSPACE] = lay.work_bytes + llmt_model_constant_bytes(&c->model) +
                                     (c->with_optimizer ? ops->optim_scratch_bytes : 0) +
                                     shard.recv;
    out->shard_first = shard.first;
    out->shard_end = shard.end;
    out->peak = 0;
    for (int i = 0; i < LLMT_MEM_CATEGORY_COUNT; i++)
        out->peak += i == LLMT_MEM_HOST_STATE ? 0 : out->bytes[i];
    out->host_peak = host_state;
    out->num_params = params;
    if (most_host)
        *most_host = c->host_budget && c->world_size > 0 && c->rank < 0
                         ? most_rank_host(c, &n, e, ops->host_memory)
                         : host_state;
    return LLMT_OK;
}

/* The op table of a backend without a context: the CPU's (from a CPU device
 * made and freed at once), or the CUDA plugin's, loaded without opening a
 * device. Both live as long as the process. */
static int backend_ops(int32_t backend, int32_t num_threads, const char *fn,
                       const llmt_backend_ops **out)
{
    if (num_threads < 1 || num_threads > PLAN_MAX_THREADS)
        return llmt_fail(LLMT_EINVAL, "%s: num_threads = %d (must be 1..%d)", fn, num_threads,
                         PLAN_MAX_THREADS);
    if (backend == LLMT_BACKEND_CUDA)
        return llmt_cuda_plugin_ops(out);
    if (backend != LLMT_BACKEND_CPU)
        return llmt_fail(LLMT_EINVAL, "%s: backend = %d is not a backend (LLMT_BACKEND_CPU %d, "
                         "LLMT_BACKEND_CUDA %d)", fn, backend, LLMT_BACKEND_CPU, LLMT_BACKEND_CUDA);
    llmt_device *dev = NULL;
    int rc = llmt_cpu_backend_create(num_threads, &dev);
    if (rc)
        return rc;
    *out = dev->ops;
    llmt_cpu_destroy(dev);
    return LLMT_OK;
}

/* Checks the arguments both ways of planning share; *c is cfg as the
 * current version. */
static int check_compute_args(const llmt_plan_config *cfg, const llmt_plan *out,
                              llmt_plan_config *c, const char *fn)
{
    if (!cfg || !out)
        return llmt_fail(LLMT_EINVAL, "%s: %s is NULL", fn, !cfg ? "cfg" : "out");
    if (out->version < 1 || out->version > LLMT_PLAN_VERSION)
        return llmt_fail(LLMT_EVERSION, "%s: out->version = %u, this library knows 1..%u", fn,
                         out->version, LLMT_PLAN_VERSION);
    return upgrade_plan_config(cfg, c, fn);
}

/* Plans c into out, writing only the fields of out's version. */
static int plan_out(const llmt_backend_ops *ops, int num_threads, const llmt_plan_config *c,
                    llmt_plan *out)
{
    llmt_plan p = LLMT_PLAN_INIT;
    int rc = plan(ops, num_threads, c, &p, NULL);
    if (!rc) {
        p.version = out->version;
        memcpy(out, &p, out->version == 1   ? PLAN_V1_BYTES
                        : out->version == 2 ? PLAN_V2_BYTES
                                            : sizeof p);
    }
    return rc;
}

int llmt_plan_compute(const llmt_context *ctx, const llmt_plan_config *cfg, llmt_plan *out)
{
    const char *fn = "llmt_plan_compute";
    if (!ctx)
        return llmt_fail(LLMT_EINVAL, "%s: ctx is NULL", fn);
    llmt_plan_config c;
    int rc = check_compute_args(cfg, out, &c, fn);
    return rc ? rc : plan_out(llmt_ops(ctx), ctx->num_threads, &c, out);
}

int llmt_plan_compute_backend(int32_t backend, int32_t num_threads, const llmt_plan_config *cfg,
                              llmt_plan *out)
{
    const char *fn = "llmt_plan_compute_backend";
    const llmt_backend_ops *ops = NULL;
    llmt_plan_config c;
    int rc = check_compute_args(cfg, out, &c, fn);
    if (!rc)
        rc = backend_ops(backend, num_threads, fn, &ops);
    return rc ? rc : plan_out(ops, num_threads, &c, out);
}

/* The recompute ladder, lightest first: what the adaptive controller climbs. */
static const int32_t ladder[] = {
    LLMT_RECOMPUTE_NONE,
    LLMT_RECOMPUTE_FFN_ACT,
    LLMT_RECOMPUTE_FFN_ACT | LLMT_RECOMPUTE_ATTN_CORE,
    LLMT_RECOMPUTE_ATTN_CORE | LLMT_RECOMPUTE_FFN,
    LLMT_RECOMPUTE_FULL,
};

/* Rungs of the fit's ladder at one micro-batch: the recompute ladder
 * without offload, then, when offload may be used, full recompute with the
 * state (and, when allowed, the gradients) of layers [0, k) offloaded for
 * k = 1..num_layers, then all of it. */
static int32_t rung_count(const llmt_plan_config *c, int offload)
{
    int32_t n = (int32_t)(sizeof ladder / sizeof ladder[0]);
    return offload ? n + c->model.num_layers + 1 : n;
}

/* Sets c's recompute and offload to rung i of rung_count; the offload rungs
 * offload `parts` (the parts the caller allows). */
static void set_rung(llmt_plan_config *c, int32_t i, int32_t parts)
{
    int32_t n = (int32_t)(sizeof ladder / sizeof ladder[0]);
    c->recompute = ladder[i < n ? i : n - 1];
    c->offload_parts = i < n ? LLMT_OFFLOAD_NONE : parts;
    c->offload_layers = i < n ? 0 : i - n + 1 <= c->model.num_layers ? i - n + 1
                                                                      : LLMT_OFFLOAD_ALL_LAYERS;
}

/* The fit of a checked current-version configuration (see llmt_plan_fit and,
 * with offload_layers non-NULL, llmt_plan_fit_offload). */
static int fit(const llmt_backend_ops *ops, int num_threads, const llmt_plan_config *cfg,
               uint64_t budget, int32_t *micro_batch, int32_t *recompute,
               int32_t *offload_layers, const char *fn)
{
    llmt_plan_config c = *cfg;
    c.layer_recompute = NULL;
    c.batch_size = cfg->batch_size ? cfg->batch_size : cfg->micro_batch; /* stays as b halves */
    int offload = offload_layers && cfg->offload_parts != LLMT_OFFLOAD_NONE;
    llmt_plan p = LLMT_PLAN_INIT;
    uint64_t host = 0; /* p's host bytes as the fit compares them (plan's most_host) */
    int rc;
    for (int32_t b = cfg->micro_batch;; b = (b + 1) / 2) {
        c.micro_batch = b;
        for (int32_t i = 0; i < rung_count(&c, offload); i++) {
            if (offload_layers)
                set_rung(&c, i, cfg->offload_parts);
            else
                c.recompute = ladder[i];
            if ((rc = plan(ops, num_threads, &c, &p, &host)))
                return rc;
            if (p.peak <= budget && (!c.host_budget || host <= c.host_budget)) {
                *micro_batch = b;
                *recompute = c.recompute;
                if (offload_layers)
                    *offload_layers = c.offload_layers;
                return LLMT_OK;
            }
        }
        if (b == 1)
            break;
    }
    char where[64] = "", host_limit[64] = "", placed[128] = "";
    if (c.world_size > 0)
        snprintf(where, sizeof where, " on rank %d of %d", p.rank, c.world_size);
    if (c.host_budget)
        snprintf(host_limit, sizeof host_limit, " with a host budget of %llu",
                 (unsigned long long)c.host_budget);
    if (c.offload_parts != LLMT_OFFLOAD_NONE)
        snprintf(placed, sizeof placed, " and the optimizer%s%s offloaded (host %llu)",
                 c.offload_layers == LLMT_OFFLOAD_ALL_LAYERS ? "" : "'s first layers",
                 c.offload_parts & LLMT_OFFLOAD_GRADS ? " and gradients" : "",
                 (unsigned long long)host);
    return llmt_fail(LLMT_ENOMEM, "%s: nothing fits %llu bytes%s%s: micro-batch 1 with full "
                     "recompute%s needs %llu (params %llu, grads %llu, optimizer %llu, "
                     "activations %llu, workspace %llu)", fn, (unsigned long long)budget, where,
                     host_limit, placed, (unsigned long long)p.peak,
                     (unsigned long long)p.bytes[LLMT_MEM_PARAMS],
                     (unsigned long long)p.bytes[LLMT_MEM_GRADS],
                     (unsigned long long)p.bytes[LLMT_MEM_OPTIMIZER],
                     (unsigned long long)p.bytes[LLMT_MEM_ACTIVATIONS],
                     (unsigned long long)p.bytes[LLMT_MEM_WORKSPACE]);
}

/* The checks and the fit every llmt_plan_fit* function shares: ops is the
 * context's (ctx non-NULL) or the backend's. */
static int fit_entry(const llmt_context *ctx, int32_t backend, int32_t num_threads,
                     const llmt_plan_config *cfg, uint64_t budget, int32_t *micro_batch,
                     int32_t *recompute, int32_t *offload_layers, int with_offload,
                     const char *fn)
{
    if (!cfg || !micro_batch || !recompute || (with_offload && !offload_layers))
        return llmt_fail(LLMT_EINVAL, "%s: %s is NULL", fn,
                         !cfg ? "cfg" : !micro_batch ? "micro_batch"
                                    : !recompute ? "recompute" : "offload_layers");
    const llmt_backend_ops *ops = NULL;
    llmt_plan_config c;
    int rc = upgrade_plan_config(cfg, &c, fn);
    if (!rc && ctx) {
        ops = llmt_ops(ctx);
        num_threads = ctx->num_threads;
    } else if (!rc) {
        rc = backend_ops(backend, num_threads, fn, &ops);
    }
    return rc ? rc : fit(ops, num_threads, &c, budget, micro_batch, recompute, offload_layers, fn);
}

int llmt_plan_fit(const llmt_context *ctx, const llmt_plan_config *cfg, uint64_t budget,
                  int32_t *micro_batch, int32_t *recompute)
{
    if (!ctx)
        return llmt_fail(LLMT_EINVAL, "llmt_plan_fit: ctx is NULL");
    return fit_entry(ctx, 0, 0, cfg, budget, micro_batch, recompute, NULL, 0, "llmt_plan_fit");
}

int llmt_plan_fit_backend(int32_t backend, int32_t num_threads, const llmt_plan_config *cfg,
                          uint64_t budget, int32_t *micro_batch, int32_t *recompute)
{
    return fit_entry(NULL, backend, num_threads, cfg, budget, micro_batch, recompute, NULL, 0,
                     "llmt_plan_fit_backend");
}

int llmt_plan_fit_offload(const llmt_context *ctx, const llmt_plan_config *cfg, uint64_t budget,
                          int32_t *micro_batch, int32_t *recompute, int32_t *offload_layers)
{
    if (!ctx)
        return llmt_fail(LLMT_EINVAL, "llmt_plan_fit_offload: ctx is NULL");
    return fit_entry(ctx, 0, 0, cfg, budget, micro_batch, recompute, offload_layers, 1,
                     "llmt_plan_fit_offload");
}

int llmt_plan_fit_offload_backend(int32_t backend, int32_t num_threads,
                                  const llmt_plan_config *cfg, uint64_t budget,
                                  int32_t *micro_batch, int32_t *recompute,
                                  int32_t *offload_layers)
{
    return fit_entry(NULL, backend, num_threads, cfg, budget, micro_batch, recompute,
                     offload_layers, 1, "llmt_plan_fit_offload_backend");
}
