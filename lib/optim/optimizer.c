/* llmt_optimizer: AdamW over the model's flat parameter buffer, with the
 * loss scaler's overflow check, global-norm clipping and the schedule. */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "core/context_internal.h"
#include "core/error.h"
#include "model/grad_place.h"
#include "model/model_internal.h"
#include "model/transfer.h"
#include "dist/shard.h"
#include "optim/offload.h"
#include "optim/optim_internal.h"

void llmt_optimizer_config_init(llmt_optimizer_config *cfg)
{
    if (cfg) {
        const llmt_optimizer_config defaults = LLMT_OPTIMIZER_CONFIG_INIT;
        *cfg = defaults;
    }
}

/* Range of each setting; integer settings must be whole numbers. */
typedef struct setting {
    const char *name;
    double lo, hi;
    int open_lo, open_hi, integer;
} setting;

static const setting settings[] = {
    [LLMT_OPT_LR] = {"lr", 0, 10, 1, 0, 0},
    [LLMT_OPT_BETA1] = {"beta1", 0, 1, 0, 1, 0},
    [LLMT_OPT_BETA2] = {"beta2", 0, 1, 0, 1, 0},
    [LLMT_OPT_EPS] = {"eps", 0, 1, 1, 0, 0},
    [LLMT_OPT_WEIGHT_DECAY] = {"weight_decay", 0, 1, 0, 0, 0},
    [LLMT_OPT_DECAY_NORMS] = {"decay_norms", 0, 1, 0, 0, 1},
    [LLMT_OPT_GRAD_CLIP] = {"grad_clip", 0, 1e12, 0, 0, 0},
    [LLMT_OPT_SCHEDULE] = {"schedule", 0, 2, 0, 0, 1},
    [LLMT_OPT_WARMUP_STEPS] = {"warmup_steps", 0, 1e15, 0, 0, 1},
    [LLMT_OPT_TOTAL_STEPS] = {"total_steps", 0, 1e15, 0, 0, 1},
    [LLMT_OPT_MIN_LR] = {"min_lr", 0, 10, 0, 0, 0},
};
#define SETTING_COUNT ((int)(sizeof settings / sizeof settings[0]))
_Static_assert(SETTING_COUNT == LLMT_OPTIMIZER_SETTINGS, "a setting without its table entry");

static int check_setting(const char *fn, int param, double v)
{
    const setting *s = &settings[param];
    int ok = isfinite(v) && (s->open_lo ? v > s->lo : v >= s->lo) &&
             (s->open_hi ? v < s->hi : v <= s->hi) && (!s->integer || v == floor(v));
    if (!ok)
        return llmt_fail(LLMT_EINVAL, "%s: %s = %g is outside %s%g, %g%s%s", fn, s->name, v,
                         s->open_lo ? "(" : "[", s->lo, s->hi, s->open_hi ? ")" : "]",
                         s->integer ? " or not a whole number" : "");
    return LLMT_OK;
}

double llmt_optimizer_setting(const llmt_optimizer_config *c, int param)
{
    switch (param) {
    case LLMT_OPT_LR: return c->lr;
    case LLMT_OPT_BETA1: return c->beta1;
    case LLMT_OPT_BETA2: return c->beta2;
    case LLMT_OPT_EPS: return c->eps;
    case LLMT_OPT_WEIGHT_DECAY: return c->weight_decay;
    case LLMT_OPT_DECAY_NORMS: return c->decay_norms;
    case LLMT_OPT_GRAD_CLIP: return c->grad_clip;
    case LLMT_OPT_SCHEDULE: return c->schedule;
    case LLMT_OPT_WARMUP_STEPS: return (double)c->warmup_steps;
    case LLMT_OPT_TOTAL_STEPS: return (double)c->total_steps;
    default: return c->min_lr;
    }
}

const char *llmt_optimizer_setting_name(int param)
{
    return settings[param].name;
}

static void put_setting(llmt_optimizer_config *c, int param, double v)
{
    switch (param) {
    case LLMT_OPT_LR: c->lr = v; break;
    case LLMT_OPT_BETA1: c->beta1 = v; break;
    case LLMT_OPT_BETA2: c->beta2 = v; break;
    case LLMT_OPT_EPS: c->eps = v; break;
    case LLMT_OPT_WEIGHT_DECAY: c->weight_decay = v; break;
    case LLMT_OPT_DECAY_NORMS: c->decay_norms = (int32_t)v; break;
    case LLMT_OPT_GRAD_CLIP: c->grad_clip = v; break;
    case LLMT_OPT_SCHEDULE: c->schedule = (int32_t)v; break;
    case LLMT_OPT_WARMUP_STEPS: c->warmup_steps = (int64_t)v; break;
    case LLMT_OPT_TOTAL_STEPS: c->total_steps = (int64_t)v; break;
    default: c->min_lr = v; break;
    }
}

int llmt_optimizer_config_check(const llmt_optimizer_config *c, const char *fn)
{
    if (c->version != 1 && c->version != LLMT_OPTIMIZER_CONFIG_VERSION)
        return llmt_fail(LLMT_EVERSION, "%s: cfg->version = %u, this library knows 1..%u", fn,
                         c->version, LLMT_OPTIMIZER_CONFIG_VERSION);
    /* The layer range is checked against the model at creation. */
    if (c->version >= 2)
        LLMT_TRY(llmt_offload_check_parts(fn, "offload_parts", c->offload_parts));
    for (int p = 0; p < SETTING_COUNT; p++) {
        int rc = check_setting(fn, p, llmt_optimizer_setting(c, p));
        if (rc)
            return rc;
    }
    if (c->min_lr > c->lr)
        return llmt_fail(LLMT_EINVAL, "%s: min_lr = %g is above lr = %g", fn, c->min_lr, c->lr);
    return LLMT_OK;
}

void llmt_optimizer_config_copy(llmt_optimizer_config *dst, const llmt_optimizer_config *src)
{
    const llmt_optimizer_config defaults = LLMT_OPTIMIZER_CONFIG_INIT;
    *dst = defaults;
    memcpy(dst, src, src->version == 1 ? offsetof(llmt_optimizer_config, offload_parts) : sizeof *dst);
    dst->version = LLMT_OPTIMIZER_CONFIG_VERSION;
}

void llmt_optimizer_sizes(int precision, int64_t num_params, size_t *moment_bytes,
                          size_t *master_bytes)
{
    int mixed = precision == LLMT_PRECISION_BF16_MIXED || precision == LLMT_PRECISION_FP16_MIXED;
    size_t moment = precision == LLMT_PRECISION_BF16_PURE ? 2 : 4;
    *moment_bytes = (size_t)num_params * moment;
    *master_bytes = mixed ? (size_t)num_params * sizeof(float) : 0;
}

int llmt_optimizer_alloc_state(llmt_optimizer *o, int64_t first, int64_t end)
{
    llmt_model *model = o->model;
    int precision = model->cfg.precision;
    o->state_dt = precision == LLMT_PRECISION_BF16_PURE ? LLMT_DTYPE_BF16 : LLMT_DTYPE_F32;
    o->has_master = precision == LLMT_PRECISION_BF16_MIXED || precision == LLMT_PRECISION_FP16_MIXED;
    o->first = first;
    o->end = end;
    const char *fn = o->comm ? "llmt_optimizer_create_sharded" : "llmt_optimizer_create";
    int rc = llmt_offload_check(fn, o->cfg.offload_parts, o->cfg.offload_layers, model->dims.layers);
    if (!rc)
        rc = llmt_offload_check_backend(o, fn, o->cfg.offload_parts);
    if (rc)
        return rc;
    o->offload_parts = o->cfg.offload_parts;
    o->offload_layers = o->offload_parts == LLMT_OFFLOAD_NONE ? 0 : o->cfg.offload_layers;
    o->split = first;
    rc = llmt_offload_alloc(o, llmt_offload_split(o, o->offload_parts, o->offload_layers));
    /* The model's gradients, allocated where this placement puts them. */
    if (!rc)
        rc = llmt_offload_place_grads(o);
    if (!rc)
        rc = llmt_grads_ensure(model);
    if (!rc)
        rc = llmt_buf_alloc(model->ctx, &o->scratch, LLMT_MEM_WORKSPACE,
                            model->ops->optim_scratch_bytes, "optimizer scratch");
    size_t blocks = (size_t)((model->num_params + LLMT_SHARD_GRANULE - 1) / LLMT_SHARD_GRANULE);
    if (!rc && model->ops->grad_stats_blocks && !(o->partials = calloc(blocks + 1, sizeof(double))))
        rc = llmt_fail(LLMT_ENOMEM, "optimizer: out of host memory");
    o->weights_epoch = model->weights_epoch;
    return rc;
}

int llmt_optimizer_create(llmt_optimizer **out, llmt_model *model, const llmt_optimizer_config *cfg)
{
    const char *fn = "llmt_optimizer_create";
    if (!out)
        return llmt_fail(LLMT_EINVAL, "%s: out is NULL", fn);
    *out = NULL;
    if (!model || !cfg)
        return llmt_fail(LLMT_EINVAL, "%s: %s is NULL", fn, model ? "cfg" : "model");
    int rc = llmt_optimizer_config_check(cfg, fn);
    if (rc)
        return rc;
    if (!model->ops->adamw || !model->ops->grad_stats || !model->ops->cast)
        return llmt_fail(LLMT_EUNSUPPORTED, "%s: the %s backend has no optimizer ops", fn,
                         model->ops->name);
    llmt_optimizer *o = calloc(1, sizeof *o);
    if (!o)
        return llmt_fail(LLMT_ENOMEM, "%s: out of host memory", fn);
    o->model = model;
    llmt_optimizer_config_copy(&o->cfg, cfg);
    rc = llmt_optimizer_alloc_state(o, 0, model->num_params);
    if (rc) {
        llmt_optimizer_free(o);
        return rc;
    }
    *out = o;
    return LLMT_OK;
}

void llmt_optimizer_free(llmt_optimizer *o)
{
    if (!o)
        return;
    llmt_offload_free(o);
    llmt_buf_free(o->model->ctx, &o->scratch);
    free(o->partials);
    llmt_optimizer_free_sharded(o);
    free(o);
}

int llmt_optimizer_set(llmt_optimizer *o, int param, double value)
{
    const char *fn = "llmt_optimizer_set";
    if (!o)
        return llmt_fail(LLMT_EINVAL, "%s: opt is NULL", fn);
    if (param < 0 || param >= SETTING_COUNT)
        return llmt_fail(LLMT_EINVAL, "%s: param = %d is not an llmt_opt_param", fn, param);
    int rc = check_setting(fn, param, value);
    if (rc)
        return rc;
    llmt_optimizer_config next = o->cfg;
    put_setting(&next, param, value);
    if (next.min_lr > next.lr)
        return llmt_fail(LLMT_EINVAL, "%s: %s = %g would put min_lr (%g) above lr (%g)", fn,
                         settings[param].name, value, next.min_lr, next.lr);
    o->cfg = next;
    return LLMT_OK;
}

int llmt_optimizer_set_settings(llmt_optimizer *o, const llmt_optimizer_config *cfg)
{
    const char *fn = "llmt_optimizer_set_settings";
    if (!o || !cfg)
        return llmt_fail(LLMT_EINVAL, "%s: %s is NULL", fn, o ? "cfg" : "opt");
    if (cfg->version != 1 && cfg->version != LLMT_OPTIMIZER_CONFIG_VERSION)
        return llmt_fail(LLMT_EVERSION, "%s: cfg->version = %u, this library knows 1 and %u", fn,
                         cfg->version, LLMT_OPTIMIZER_CONFIG_VERSION);
    /* Every setting lies before the fields version 2 appended. */
    llmt_optimizer_config next = o->cfg;
    for (int p = 0; p < SETTING_COUNT; p++) {
        double v = llmt_optimizer_setting(cfg, p);
        LLMT_TRY(check_setting(fn, p, v));
        put_setting(&next, p, v);
    }
    if (next.min_lr > next.lr)
        return llmt_fail(LLMT_EINVAL, "%s: min_lr = %g is above lr = %g", fn, next.min_lr,
                         next.lr);
    o->cfg = next;
    return LLMT_OK;
}

int llmt_optimizer_get(const llmt_optimizer *o, int param, double *value)
{
    if (!o || !value)
        return llmt_fail(LLMT_EINVAL, "llmt_optimizer_get: %s is NULL", o ? "value" : "opt");
    if (param < 0 || param >= SETTING_COUNT)
        return llmt_fail(LLMT_EINVAL, "llmt_optimizer_get: param = %d is not an llmt_opt_param",
                         param);
    *value = llmt_optimizer_setting(&o->cfg, param);
    return LLMT_OK;
}

int llmt_optimizer_get_config(const llmt_optimizer *o, llmt_optimizer_config *out)
{
    if (!o || !out)
        return llmt_fail(LLMT_EINVAL, "llmt_optimizer_get_config: %s is NULL", o ? "out" : "opt");
    /* The placement is the optimizer's, not the (checkpointed) settings'. */
    llmt_optimizer_config c = o->cfg;
    c.offload_parts = o->offload_parts;
    c.offload_layers = o->offload_parts == LLMT_OFFLOAD_NONE ? LLMT_OFFLOAD_ALL_LAYERS
                                                             : o->offload_layers;
    if (out->version != 1 && out->version != LLMT_OPTIMIZER_CONFIG_VERSION)
        return llmt_fail(LLMT_EVERSION, "llmt_optimizer_get_config: out->version = %u: set it to "
                         "%u (or 1 for a version 1 struct)", out->version,
                         LLMT_OPTIMIZER_CONFIG_VERSION);
    /* A caller that says version 1 has a version 1 struct. */
    if (out->version == 1) {
        memcpy(out, &c, offsetof(llmt_optimizer_config, offload_parts));
        out->version = 1;
    } else {
        *out = c;
    }
    return LLMT_OK;
}

double llmt_optimizer_lr(const llmt_optimizer *o)
{
    return o ? llmt_schedule_lr(&o->cfg, o->steps) : 0.0;
}

/* Runs AdamW over each maximal run of consecutive tensors sharing a weight
 * decay (norm weights are excluded unless decay_norms), within the range
 * [first, end) the optimizer updates. */
static int update_all(llmt_optimizer *o, float grad_factor, double lr)
{
    const llmt_model *m = o->model;
    int64_t t = o->steps + 1;
    llmt_adamw_args a = {
        .w_dt = m->dt,
        .state_dt = o->state_dt,
        .grad_factor = grad_factor,
        .lr = (float)lr,
        .beta1 = (float)o->cfg.beta1,
        .beta2 = (float)o->cfg.beta2,
        .eps = (float)o->cfg.eps,
        .bias_correction1 = (float)(1.0 - pow(o->cfg.beta1, (double)t)),
        .bias_correction2 = (float)(1.0 - pow(o->cfg.beta2, (double)t)),
        .stochastic = m->cfg.precision == LLMT_PRECISION_BF16_PURE,
        .seed = m->ctx->cfg.seed,
    };
    size_t wb = llmt_dtype_size(m->dt), sb = llmt_dtype_size(o->state_dt);
    for (int32_t i = 0; i < m->n_params;) {
        int decay = m->params[i].kind != LLMT_PARAM_NORM || o->cfg.decay_norms;
        int32_t j = i + 1;
        while (j < m->n_params && (m->params[j].kind != LLMT_PARAM_NORM || o->cfg.decay_norms) == decay)
            j++;
        int64_t run_end = m->params[j - 1].offset + m->params[j - 1].numel;
        int64_t off = m->params[i].offset > o->first ? m->params[i].offset : o->first;
        int64_t end = run_end < o->end ? run_end : o->end;
        i = j;
        if (end <= off)
            continue;
        a.weight_decay = decay ? (float)o->cfg.weight_decay : 0.0f;
        if (off < o->split) { /* the offloaded part of the run */
            int64_t host_end = end < o->split ? end : o->split;
            LLMT_TRY(llmt_offload_update(o, a, off, host_end));
            off = host_end;
        }
        if (end <= off)
            continue;
        int64_t local = off - o->split; /* in the device buffers */
        a.n = end - off;
        a.w = (char *)m->weights.ptr + (size_t)off * wb;
        /* The device segment's gradients: a sharded optimizer's sum holds
         * element first + i at i, the model's device gradients element
         * grad_split + i (the split is at most the optimizer's). */
        a.g = o->comm ? (const char *)o->grad_sum.ptr + (size_t)(off - o->first) * wb
                      : (const char *)m->grads.ptr + (size_t)(off - m->grad_split) * wb;
        a.m = (char *)o->m.ptr + (size_t)local * sb;
        a.v = (char *)o->v.ptr + (size_t)local * sb;
        a.master = o->has_master ? (float *)o->master.ptr + local : NULL;
        /* Each step draws fresh rounding bits: element e uses value t P + e. */
        a.rng_offset = (uint64_t)o->steps * (uint64_t)m->num_params + (uint64_t)off;
        LLMT_TRY(m->ops->adamw(m->dev, &a));
    }
    return LLMT_OK;
}

/* Per-granule partials of the gradients [0, n) held in host memory at g,
 * into partials: read in place where the backend's memory is host memory,
 * else uploaded chunk by chunk into the model's gradient bucket. */
static int host_grad_stats(llmt_optimizer *o, const void *g, int64_t n, float inv_scale,
                           int64_t *nonfinite)
{
    const llmt_model *m = o->model;
    size_t es = llmt_dtype_size(m->dt);
    if (m->ops->host_memory)
        return m->ops->grad_stats_blocks(m->dev, g, n, m->dt, inv_scale, LLMT_SHARD_GRANULE,
                                         o->partials, nonfinite, o->scratch.ptr);
    for (int64_t c = 0; c < n; c += LLMT_GRAD_STATS_CHUNK) { /* granule-aligned chunks */
        int64_t k = n - c < LLMT_GRAD_STATS_CHUNK ? n - c : LLMT_GRAD_STATS_CHUNK;
        int64_t bad = 0;
        LLMT_TRY(m->ops->copy_to_device(m->dev, m->grad_bucket.ptr, (const char *)g + (size_t)c * es,
                                        (size_t)k * es));
        LLMT_TRY(m->ops->grad_stats_blocks(m->dev, m->grad_bucket.ptr, k, m->dt, inv_scale,
                                           LLMT_SHARD_GRANULE, o->partials + c / LLMT_SHARD_GRANULE,
                                           &bad, o->scratch.ptr));
        *nonfinite += bad;
    }
    return LLMT_OK;
}

/* The unscaled gradient's sum of squares and non-finite count over all
 * parameters: per granule (the same bits for any thread count, world size
 * or gradient placement) where the backend can, else in one pass. */
static int grad_stats(llmt_optimizer *o, float inv_scale, double *sumsq, int64_t *nonfinite)
{
    const llmt_model *m = o->model;
    if (o->comm)
        return llmt_optimizer_sharded_stats(o, inv_scale, sumsq, nonfinite);
    if (!o->partials)
        return m->ops->grad_stats(m->dev, m->grads.ptr, m->num_params, m->dt, inv_scale, sumsq,
                                  nonfinite, o->scratch.ptr);
    /* [0, grad_split) in host memory, the rest on the device; the split is
     * a granule boundary, so the partials are those of one buffer. */
    const int64_t gs = m->grad_split;
    int64_t host_bad = 0, dev_bad = 0;
    if (gs > 0)
        LLMT_TRY(host_grad_stats(o, m->host_grads.ptr, gs, inv_scale, &host_bad));
    LLMT_TRY(m->ops->grad_stats_blocks(m->dev, m->grads.ptr, m->num_params - gs, m->dt, inv_scale,
                                       LLMT_SHARD_GRANULE, o->partials + gs / LLMT_SHARD_GRANULE,
                                       &dev_bad, o->scratch.ptr));
    *nonfinite = host_bad + dev_bad;
    int64_t blocks = (m->num_params + LLMT_SHARD_GRANULE - 1) / LLMT_SHARD_GRANULE;
    double total = 0.0;
    for (int64_t b = 0; b < blocks; b++) /* in block order: the sharded sum's order */
        total += o->partials[b];
    *sumsq = total;
    return LLMT_OK;
}

int llmt_optimizer_step(llmt_optimizer *o, llmt_loss_scaler *scaler, llmt_update_report *report)
{
    const char *fn = "llmt_optimizer_step";
    if (!o)
        return llmt_fail(LLMT_EINVAL, "%s: opt is NULL", fn);
    if (report && report->version != LLMT_UPDATE_REPORT_VERSION)
        return llmt_fail(LLMT_EVERSION, "%s: report->version = %u, this library knows %u", fn,
                         report->version, LLMT_UPDATE_REPORT_VERSION);
    const llmt_model *m = o->model;
    /* Weights set or loaded since the master was taken win over it. */
    if (o->has_master && o->weights_epoch != m->weights_epoch) {
        int rc = llmt_offload_master_from_weights(o);
        if (rc)
            return rc;
        o->weights_epoch = m->weights_epoch;
    }
    /* A sharded optimizer outside a trainer: this rank's gradient is its
     * whole contribution. The ranks' gradient splits must agree: the
     * exchange's windows are cut there (sharded.c). */
    if (o->comm && !o->grads_reduced) {
        uint8_t *all = malloc((size_t)llmt_comm_size(o->comm));
        if (!all)
            return llmt_fail(LLMT_ENOMEM, "%s: out of host memory", fn);
        memset(all, 1, (size_t)llmt_comm_size(o->comm));
        int rc = llmt_comm_check_same(o->comm, "the gradient placement (offloaded layers)",
                                      (uint64_t)llmt_offload_grad_split(o));
        if (!rc)
            rc = llmt_optimizer_reduce_begin(o);
        if (!rc)
            rc = llmt_optimizer_reduce_round(o, all);
        free(all);
        if (rc) {
            o->grads_reduced = 0; /* no whole sum: a retry reduces anew */
            return rc;
        }
    }
    o->grads_reduced = 0;
    /* The gradients where this optimizer's placement says (another
     * optimizer of the model may have moved them), and, for an unsharded
     * update, which reads them, whole on the host. A sharded one reads its
     * reduced sum: settling would only zero-fill the host part of each
     * bucket an overlapped reduction sent from its slot. */
    LLMT_TRY(llmt_offload_place_grads(o));
    if (!o->comm)
        LLMT_TRY(llmt_grads_settle(o->model));
    double scale = scaler ? llmt_loss_scaler_scale(scaler) : 1.0;
    float inv_scale = (float)(1.0 / scale);
    double sumsq = 0.0;
    int64_t nonfinite = 0;
    int rc = grad_stats(o, inv_scale, &sumsq, &nonfinite);
    if (rc)
        return rc;
    double lr = llmt_schedule_lr(&o->cfg, o->steps);
    double norm = nonfinite ? INFINITY : sqrt(sumsq);
    /* torch.nn.utils.clip_grad_norm_: coefficient max_norm / (norm + 1e-6), at most 1. */
    double coef = o->cfg.grad_clip > 0.0 && !nonfinite ? o->cfg.grad_clip / (norm + 1e-6) : 1.0;
    float factor = (float)((double)inv_scale * (coef < 1.0 ? coef : 1.0));
    /* A finite gradient so large that the factor is no normal float (clip /
     * norm below about 1.2e-38) would underflow when applied (to zero, or to
     * a few subnormal bits): skipped like an overflow instead. */
    const int skip = nonfinite > 0 || !isnormal(factor);
    if (!skip) {
        rc = update_all(o, factor, lr);
        if (!rc && o->comm)
            rc = llmt_optimizer_gather_weights(o);
        if (rc)
            return rc;
        o->steps++;
    }
    if (scaler && (rc = llmt_loss_scaler_update(scaler, skip)))
        return rc;
    if (report) {
        report->step = o->steps;
        report->skipped = skip;
        report->grad_norm = norm;
        report->lr = lr;
        report->loss_scale = scale;
    }
    return LLMT_OK;
}

int64_t llmt_optimizer_step_count(const llmt_optimizer *o)
{
    return o ? o->steps : -1;
}

int llmt_optimizer_set_step_count(llmt_optimizer *o, int64_t steps)
{
    if (!o || steps < 0)
        return llmt_fail(LLMT_EINVAL, "llmt_optimizer_set_step_count: %s", o ? "steps < 0" : "opt is NULL");
    o->steps = steps;
    return LLMT_OK;
}

int32_t llmt_optimizer_state_dtype(const llmt_optimizer *o, int kind)
{
    if (!o)
        return -1;
    switch (kind) {
    case LLMT_OPT_STATE_EXP_AVG:
    case LLMT_OPT_STATE_EXP_AVG_SQ: return o->state_dt;
    case LLMT_OPT_STATE_MASTER: return o->has_master ? LLMT_DTYPE_F32 : -1;
    default: return -1;
    }
}

/* The state section (0 first moment, 1 second, 2 master) of kind, or -1
 * with an error. */
static int state_section(const llmt_optimizer *o, const char *fn, int kind, int *rc)
{
    if (!o) {
        *rc = llmt_fail(LLMT_EINVAL, "%s: opt is NULL", fn);
        return -1;
    }
    if (kind == LLMT_OPT_STATE_EXP_AVG || kind == LLMT_OPT_STATE_EXP_AVG_SQ)
        return kind == LLMT_OPT_STATE_EXP_AVG ? 0 : 1;
    if (kind == LLMT_OPT_STATE_MASTER && o->has_master)
        return 2;
    if (kind == LLMT_OPT_STATE_MASTER)
        *rc = llmt_fail(LLMT_ENOTFOUND, "%s: kind = master weights: this precision mode has none", fn);
    else
        *rc = llmt_fail(LLMT_EINVAL, "%s: kind = %d is not an llmt_opt_state", fn, kind);
    return -1;
}

/* The parameter named name with a buffer of count floats, or NULL with an
 * error. */
static const llmt_param *state_param(const llmt_optimizer *o, const char *fn, const char *name,
                                     const void *buf, const char *buf_name, size_t count, int *rc)
{
    const llmt_param *p = llmt_model_find_param(o->model, fn, name);
    if (!p) {
        *rc = name ? LLMT_ENOTFOUND : LLMT_EINVAL; /* the message is set */
        return NULL;
    }
    if (!buf || count != (size_t)p->numel) {
        *rc = llmt_fail(LLMT_EINVAL, "%s: %s: %s is NULL or count = %zu is not its %lld elements",
                        fn, name, buf_name, count, (long long)p->numel);
        return NULL;
    }
    return p;
}

int llmt_optimizer_get_state(const llmt_optimizer *o, int kind, const char *name, float *out,
                             size_t count)
{
    const char *fn = "llmt_optimizer_get_state";
    int rc = LLMT_OK;
    int sec = state_section(o, fn, kind, &rc);
    if (sec < 0)
        return rc;
    const llmt_param *p = state_param(o, fn, name, out, "out", count, &rc);
    if (!p)
        return rc;
    if (!o->comm)
        return llmt_offload_state_io(o, sec, p->offset, p->numel, out, 0);
    return llmt_optimizer_gather_tensor((llmt_optimizer *)o, sec, p->offset, p->numel, out);
}

int llmt_optimizer_set_state(llmt_optimizer *o, int kind, const char *name, const float *in,
                             size_t count)
{
    const char *fn = "llmt_optimizer_set_state";
    int rc = LLMT_OK;
    int sec = state_section(o, fn, kind, &rc);
    if (sec < 0)
        return rc;
    const llmt_param *p = state_param(o, fn, name, in, "in", count, &rc);
    if (!p)
        return rc;
    /* The part of the tensor this optimizer owns (all of it unless sharded). */
    int64_t a = p->offset > o->first ? p->offset : o->first;
    int64_t e = p->offset + p->numel < o->end ? p->offset + p->numel : o->end;
    return e > a ? llmt_offload_state_io(o, sec, a, e - a, (float *)(in + (a - p->offset)), 1)
                 : LLMT_OK;
}

int llmt_optimizer_shard(const llmt_optimizer *o, int64_t *first, int64_t *end)
{
    if (!o || !first || !end)
        return llmt_fail(LLMT_EINVAL, "llmt_optimizer_shard: %s is NULL",
                         !o ? "opt" : !first ? "first" : "end");
    *first = o->first;
    *end = o->end;
    return LLMT_OK;
}
