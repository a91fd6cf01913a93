/* llmt_trainer: the training step, the loop, evaluation, periodic
 * checkpoints, metrics and the adaptive memory controller. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ckpt/store_internal.h"
#include "core/context_internal.h"
#include "core/error.h"
#include "data/loader_internal.h"
#include "optim/optim_internal.h"
#include "train/dist_fast_tier.h"
#include "train/trainer_internal.h"
#include "util/json.h"

void llmt_trainer_config_init(llmt_trainer_config *cfg)
{
    if (cfg) {
        const llmt_trainer_config defaults = LLMT_TRAINER_CONFIG_INIT;
        *cfg = defaults;
    }
}

static double now_seconds(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Logs a line to the callback and, as an event, to the metrics file. */
void llmt_trainer_log(llmt_trainer *tr, const char *event, const char *fmt, ...)
{
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (tr->log)
        tr->log(tr->log_user, line);
    llmt_metrics_event(tr, event, line);
}

static int check_parts(const llmt_trainer_parts *p, const llmt_trainer_config *c)
{
    const char *fn = "llmt_trainer_create";
    if (p->version != LLMT_TRAINER_PARTS_VERSION || c->version != LLMT_TRAINER_CONFIG_VERSION)
        return llmt_fail(LLMT_EVERSION, "%s: parts->version = %u, cfg->version = %u, this "
                         "library knows %u and %u", fn, p->version, c->version,
                         LLMT_TRAINER_PARTS_VERSION, LLMT_TRAINER_CONFIG_VERSION);
    if (!p->model || !p->optimizer || !p->loader)
        return llmt_fail(LLMT_EINVAL, "%s: parts->%s is NULL", fn,
                         !p->model ? "model" : !p->optimizer ? "optimizer" : "loader");
    if (c->adaptive && (!p->recompute || !p->slicer))
        return llmt_fail(LLMT_EINVAL, "%s: the adaptive controller needs parts->recompute and "
                         "parts->slicer", fn);
    if (c->batch_size < 1 || c->seq_len < 1 || c->seq_len > p->model->cfg.max_seq_len)
        return llmt_fail(LLMT_EINVAL, "%s: cfg->batch_size = %d, cfg->seq_len = %d (the model's "
                         "max_seq_len is %d)", fn, c->batch_size, c->seq_len,
                         p->model->cfg.max_seq_len);
    /* Each step asks the loaders for batch_size x seq_len tokens: refused
     * here rather than at the first step. */
    const llmt_loader *loaders[2] = {p->loader, p->eval_loader};
    for (int i = 0; i < 2; i++) {
        int32_t b = 0, t = 0;
        if (!loaders[i])
            continue;
        llmt_loader_shape(loaders[i], &b, &t);
        if (b != c->batch_size || t != c->seq_len)
            return llmt_fail(LLMT_EINVAL, "%s: cfg->batch_size = %d, cfg->seq_len = %d, but "
                             "parts->%s serves batch_size %d, seq_len %d", fn, c->batch_size,
                             c->seq_len, i ? "eval_loader" : "loader", b, t);
    }
    if (c->total_steps < 0 || c->eval_every < 0 || c->checkpoint_every < 0 ||
        c->fast_checkpoint_every < 0 || (c->eval_every && c->eval_batches < 1))
        return llmt_fail(LLMT_EINVAL, "%s: negative step counts or eval_batches < 1", fn);
    if (!(c->memory_threshold > 0 && c->memory_threshold <= 1) || !(c->hysteresis >= 0) ||
        c->hysteresis >= c->memory_threshold || c->relax_window < 1)
        return llmt_fail(LLMT_EINVAL, "%s: cfg->memory_threshold = %g, hysteresis = %g, "
                         "relax_window = %d (need 0 < hysteresis < threshold <= 1, window >= 1)",
                         fn, c->memory_threshold, c->hysteresis, c->relax_window);
    /* In a data-parallel run only rank 0 holds the store. */
    const llmt_comm *comm = p->optimizer->comm;
    int needs_store = !comm || llmt_comm_rank(comm) == 0;
    if ((c->eval_every && !p->eval_loader) ||
        ((c->checkpoint_every || c->fast_checkpoint_every) && !p->store && needs_store))
        return llmt_fail(LLMT_EINVAL, "%s: %s", fn, c->eval_every && !p->eval_loader
                                                        ? "cfg->eval_every needs parts->eval_loader"
                                                        : "checkpoints need parts->store");
    return LLMT_OK;
}

int llmt_trainer_create(llmt_trainer **out, const llmt_trainer_parts *parts,
                        const llmt_trainer_config *cfg)
{
    if (!out || !parts)
        return llmt_fail(LLMT_EINVAL, "llmt_trainer_create: %s is NULL", !out ? "out" : "parts");
    *out = NULL;
    llmt_trainer_config defaults = LLMT_TRAINER_CONFIG_INIT;
    if (!cfg && parts->version == LLMT_TRAINER_PARTS_VERSION && parts->loader) {
        llmt_loader_shape(parts->loader, &defaults.batch_size, &defaults.seq_len);
        defaults.adaptive = parts->recompute && parts->slicer; /* what the parts allow */
    }
    if (!cfg)
        cfg = &defaults;
    /* With a sharded optimizer creation is collective: every exit agrees. */
    llmt_comm *comm = parts->version == LLMT_TRAINER_PARTS_VERSION && parts->optimizer
                          ? parts->optimizer->comm : NULL;
    int rc = check_parts(parts, cfg);
    llmt_trainer *tr = rc ? NULL : calloc(1, sizeof *tr);
    if (!rc && !tr)
        rc = llmt_fail(LLMT_ENOMEM, "llmt_trainer_create: out of host memory");
    if (rc)
        return comm ? llmt_comm_agree(comm, rc) : rc;
    tr->parts = *parts;
    tr->cfg = *cfg;
    tr->ctx = parts->model->ctx;
    tr->saved[0] = tr->saved[1] = -1;
    tr->saving_tier = -1;
    size_t n = (size_t)cfg->batch_size * (size_t)cfg->seq_len;
    tr->tokens = malloc(n * sizeof *tr->tokens);
    tr->targets = malloc(n * sizeof *tr->targets);
    tr->config_yaml = cfg->config_yaml ? strdup(cfg->config_yaml) : NULL;
    tr->cfg.config_yaml = tr->config_yaml;
    tr->cfg.metrics_path = NULL; /* not kept: the file is opened below */
    if (!tr->tokens || !tr->targets || (cfg->config_yaml && !tr->config_yaml))
        rc = llmt_fail(LLMT_ENOMEM, "llmt_trainer_create: out of host memory");
    if (!rc)
        rc = llmt_metrics_open(tr, cfg->metrics_path);
    if (!rc && parts->eval_loader) {
        tr->eval_start.version = LLMT_LOADER_STATE_VERSION;
        rc = llmt_loader_get_state(parts->eval_loader, &tr->eval_start);
    }
    if (!rc && cfg->adaptive) {
        const llmt_model *m = parts->model;
        llmt_controller_init(&tr->ctl, m, comm ? NULL : parts->slicer, cfg->batch_size,
                             cfg->seq_len, m->rc_flags[0], llmt_slicer_micro_batch(parts->slicer));
        rc = llmt_controller_apply(&tr->ctl, tr->ctl.base, parts->recompute, parts->slicer);
    }
    if (comm) { /* the ranks must run the same steps over the same data */
        rc = llmt_comm_agree(comm, rc);
        if (!rc)
            rc = llmt_comm_check_same(comm, "the trainer's configuration (batch, micro-batch, "
                                      "recompute, schedule of evaluations and checkpoints) or "
                                      "the data position", llmt_trainer_dist_hash(tr));
    }
    if (rc) {
        llmt_trainer_free(tr);
        return rc;
    }
    *out = tr;
    return LLMT_OK;
}

void llmt_trainer_free(llmt_trainer *tr)
{
    if (!tr)
        return;
    if (tr->parts.store)
        llmt_ckpt_wait(tr->parts.store);
    llmt_trainer_dist_free(tr); /* local: abandons a data-parallel save in flight */
    llmt_dist_fast_free(tr);
    llmt_metrics_close(tr);
    if (tr->owned)
        llmt_trainer_free_owned(tr);
    free(tr->tokens);
    free(tr->targets);
    free(tr->config_yaml);
    free(tr);
}

int llmt_trainer_set_callback(llmt_trainer *tr, llmt_step_callback cb, void *user)
{
    if (!tr)
        return llmt_fail(LLMT_EINVAL, "llmt_trainer_set_callback: tr is NULL");
    tr->callback = cb;
    tr->callback_user = user;
    return LLMT_OK;
}

int llmt_trainer_set_log(llmt_trainer *tr, llmt_log_callback cb, void *user)
{
    if (!tr)
        return llmt_fail(LLMT_EINVAL, "llmt_trainer_set_log: tr is NULL");
    tr->log = cb;
    tr->log_user = user;
    return LLMT_OK;
}

int64_t llmt_trainer_step_index(const llmt_trainer *tr)
{
    return tr ? tr->step : -1;
}

llmt_model *llmt_trainer_model(const llmt_trainer *tr)
{
    return tr ? tr->parts.model : NULL;
}

llmt_context *llmt_trainer_context(const llmt_trainer *tr)
{
    return tr ? tr->ctx : NULL;
}

llmt_optimizer *llmt_trainer_optimizer(const llmt_trainer *tr)
{
    return tr ? tr->parts.optimizer : NULL;
}

/* A status every rank of a data-parallel run learns (a rank that failed
 * alone would leave the others waiting in the next collective). */
static int agreed(llmt_trainer *tr, int rc)
{
    llmt_comm *comm = tr->parts.optimizer->comm;
    return comm ? llmt_comm_agree(comm, rc) : rc;
}

/* The capacity the monitor measures against. */
static uint64_t capacity(const llmt_trainer *tr, const llmt_memory_stats *s)
{
    return tr->cfg.capacity ? tr->cfg.capacity : s->budget ? s->budget : s->device_total;
}

/* Forward and backward of the loaded batch, retrying after LLMT_ENOMEM with
 * a configuration that fits (adaptive only). */
static int forward_backward(llmt_trainer *tr, double scale, double *loss, int32_t *retries)
{
    const llmt_trainer_parts *p = &tr->parts;
    const int32_t B = tr->cfg.batch_size, T = tr->cfg.seq_len;
    for (*retries = 0;; (*retries)++) {
        /* A data-parallel step zeroes them itself, after it has chosen how
         * their host copy is kept (dist.c): zeroing first would allocate
         * the whole of it. */
        if (!p->optimizer->comm)
            LLMT_TRY(llmt_model_zero_grads(p->model));
        /* In a data-parallel run every rank learns that one ran out of
         * memory, and all escalate alike (the same plan on each). */
        int failed = LLMT_OK;
        int rc = p->optimizer->comm
                     ? llmt_trainer_dist_forward_backward(tr, scale, loss, &failed)
                 : p->slicer ? llmt_slicer_forward_backward(p->slicer, tr->tokens, tr->targets, B,
                                                            T, scale, loss)
                             : llmt_model_forward_backward(p->model, tr->tokens, tr->targets, B, T,
                                                           scale, 0.0, loss);
        if (!p->optimizer->comm)
            failed = rc;
        if (failed != LLMT_ENOMEM || !tr->cfg.adaptive)
            return rc;
        /* Partial gradients are discarded (zeroed on the next attempt), and
         * the controller frees the step's layout and picks a notch that
         * fits. */
        char why[512];
        snprintf(why, sizeof why, "%s", llmt_error_last());
        if (!p->optimizer->comm) /* as above: a data-parallel step zeroes them itself */
            LLMT_TRY(llmt_model_zero_grads(p->model));
        LLMT_TRY(llmt_trainer_escalate_to_fit(tr, why));
    }
}

/* Loss over eval_batches batches of the eval loader from its start, run in
 * slices no larger than the training micro-batch (the arena holds them). */
int llmt_trainer_evaluate(llmt_trainer *tr, double *loss)
{
    if (!tr || !loss)
        return llmt_fail(LLMT_EINVAL, "llmt_trainer_evaluate: %s is NULL", tr ? "loss" : "tr");
    const llmt_trainer_parts *p = &tr->parts;
    if (!p->eval_loader)
        return llmt_fail(LLMT_ESTATE, "llmt_trainer_evaluate: the trainer has no eval loader");
    const int32_t B = tr->cfg.batch_size, T = tr->cfg.seq_len;
    int32_t micro = p->slicer ? llmt_slicer_micro_batch(p->slicer) : B;
    micro = micro < B ? micro : B;
    LLMT_TRY(llmt_loader_set_state(p->eval_loader, &tr->eval_start));
    double sum = 0.0;
    int64_t count = 0;
    for (int32_t b = 0; b < tr->cfg.eval_batches; b++) {
        LLMT_TRY(llmt_loader_next(p->eval_loader, tr->tokens, tr->targets, (size_t)B * (size_t)T));
        for (int32_t first = 0; first < B; first += micro) {
            int32_t rows = B - first < micro ? B - first : micro;
            size_t off = (size_t)first * (size_t)T;
            double l = 0.0;
            LLMT_TRY(llmt_model_forward(p->model, tr->tokens + off, tr->targets + off, rows, T, &l));
            int64_t n = 0;
            for (size_t i = 0; i < (size_t)rows * (size_t)T; i++)
                n += tr->targets[off + i] >= 0;
            sum += l * (double)n;
            count += n;
        }
    }
    *loss = count ? sum / (double)count : 0.0;
    return LLMT_OK;
}

/* Joins the store's async save; when it failed, the step it was saving is
 * not this trainer's in that tier. */
static int join_save(llmt_trainer *tr)
{
    int rc = llmt_ckpt_wait(tr->parts.store);
    if (rc && tr->saving_tier >= 0)
        tr->saved[tr->saving_tier] = -1;
    tr->saving_tier = -1;
    return rc;
}

/* Saves the state in a tier: async when configured, falling back to a
 * synchronous save when the staging buffer does not fit the budget. The
 * previous async save is joined first, so its failure (even LLMT_ENOMEM) is
 * returned rather than taken for "does not fit". */
static int save_tier(llmt_trainer *tr, int32_t tier, int async)
{
    if (tr->parts.optimizer->comm)
        return llmt_trainer_dist_save(tr, tier, async);
    llmt_train_state st = LLMT_TRAIN_STATE_INIT;
    char blob[256];
    llmt_trainer_fill_state(tr, &st, blob, sizeof blob);
    LLMT_TRY(join_save(tr));
    int rc = async ? llmt_ckpt_save_async(tr->parts.store, &st, tier)
                   : llmt_ckpt_save(tr->parts.store, &st, tier);
    int in_flight = async && !rc;
    if (async && rc == LLMT_ENOMEM) {
        llmt_trainer_log(tr, "checkpoint", "step %lld: async save does not fit (%s); saving "
                         "synchronously", (long long)tr->step, llmt_error_last());
        rc = llmt_ckpt_save(tr->parts.store, &st, tier);
    }
    tr->saved[tier] = rc ? -1 : tr->step;
    tr->saving_tier = in_flight ? tier : -1;
    /* An async save's own failure is reported by the next call that joins it. */
    return rc;
}

int llmt_trainer_save(llmt_trainer *tr, int32_t tier)
{
    if (tr && tr->parts.optimizer->comm) {
        if (tier != LLMT_CKPT_DURABLE && tier != LLMT_CKPT_FAST)
            return llmt_fail(LLMT_EINVAL, "llmt_trainer_save: tier = %d is not a tier", tier);
        /* The save in flight is finished (its failure reported here); then
         * rank 0 decides, as below, whether the step is saved already. */
        LLMT_TRY(llmt_trainer_dist_join(tr));
        llmt_ckpt_store *st = tr->parts.store;
        int64_t done = st && tr->saved[tier] == tr->step && llmt_ckpt_committed(st, tier) == tr->step;
        LLMT_TRY(llmt_comm_broadcast(tr->parts.optimizer->comm, "llmt_trainer_save", &done,
                                     sizeof done, 0));
        return done ? LLMT_OK : save_tier(tr, tier, 0);
    }
    if (!tr || !tr->parts.store)
        return llmt_fail(LLMT_EINVAL, "llmt_trainer_save: %s", tr ? "the trainer has no store"
                                                                  : "tr is NULL");
    if (tier != LLMT_CKPT_DURABLE && tier != LLMT_CKPT_FAST)
        return llmt_fail(LLMT_EINVAL, "llmt_trainer_save: tier = %d is not a tier", tier);
    /* A failed async save is reported here (once, by whichever call joins
     * it); then only a step that this trainer saved (or resumed from) in
     * this tier and that the store committed there is not saved again:
     * another trainer's save or a load of that step into other objects holds
     * other weights. */
    LLMT_TRY(join_save(tr));
    if (tr->saved[tier] == tr->step && llmt_ckpt_committed(tr->parts.store, tier) == tr->step)
        return LLMT_OK;
    return save_tier(tr, tier, 0);
}

int llmt_trainer_step(llmt_trainer *tr, llmt_step_report *report)
{
    if (!tr)
        return llmt_fail(LLMT_EINVAL, "llmt_trainer_step: tr is NULL");
    if (report && report->version != LLMT_STEP_REPORT_VERSION)
        return llmt_fail(LLMT_EVERSION, "llmt_trainer_step: report->version = %u, this library "
                         "knows %u", report->version, LLMT_STEP_REPORT_VERSION);
    const llmt_trainer_parts *p = &tr->parts;
    const int32_t B = tr->cfg.batch_size, T = tr->cfg.seq_len;
    double t0 = now_seconds();
    llmt_step_report r;
    memset(&r, 0, sizeof r);
    r.version = LLMT_STEP_REPORT_VERSION;
    r.eval_loss = NAN;
    LLMT_TRY(llmt_context_reset_peak(tr->ctx));
    /* A step that fails before it counts gives its batch back: calling
     * again retries the same data. */
    llmt_loader_state at = LLMT_LOADER_STATE_INIT;
    LLMT_TRY(llmt_loader_get_state(p->loader, &at));
    LLMT_TRY(agreed(tr, llmt_loader_next(p->loader, tr->tokens, tr->targets,
                                         (size_t)B * (size_t)T)));
    double scale = p->scaler ? llmt_loss_scaler_scale(p->scaler) : 1.0;
    int rc = forward_backward(tr, scale, &r.loss, &r.retries);
    llmt_update_report u = LLMT_UPDATE_REPORT_INIT;
    if (!rc)
        rc = llmt_optimizer_step(p->optimizer, p->scaler, &u);
    if (rc) {
        (void)llmt_loader_set_state(p->loader, &at); /* rc's message stays */
        return rc;
    }
    /* The layout that ran the step: read after the retries, which change it. */
    r.micro_batch = p->slicer ? llmt_slicer_micro_batch(p->slicer) : B;
    r.recompute = p->model->rc_flags[0];
    for (int64_t l = 0; l < p->model->dims.layers; l++)
        r.recompute_layers += p->model->rc_flags[l] != 0;
    /* Training throughput: evaluation and checkpoints below are not in it. */
    r.tokens_per_second = (double)B * T / (now_seconds() - t0);
    tr->step++;
    tr->tokens_seen += (int64_t)B * T;

    /* Monitor, and the controller's decision for the next step. */
    llmt_memory_stats ms = LLMT_MEMORY_STATS_INIT;
    LLMT_TRY(llmt_context_memory_stats(tr->ctx, &ms));
    r.capacity = capacity(tr, &ms);
    r.mem_peak = ms.total_peak;
    /* The controller decides from this rank's own figures (its decisions
     * are agreed in adapt.c); the report gives the ranks' largest peak and
     * smallest capacity, the same on every rank (so is whether to adapt). */
    const uint64_t own_peak = r.mem_peak, own_capacity = r.capacity;
    if (p->optimizer->comm)
        LLMT_TRY(llmt_trainer_dist_memory(tr, &r.mem_peak, &r.capacity));
    r.mem_ratio = r.capacity ? (double)r.mem_peak / (double)r.capacity : 0.0;
    if (tr->cfg.adaptive && r.capacity)
        LLMT_TRY(llmt_trainer_adapt(tr, own_peak, own_capacity));

    if (tr->cfg.eval_every && tr->step % tr->cfg.eval_every == 0)
        LLMT_TRY(agreed(tr, llmt_trainer_evaluate(tr, &r.eval_loss)));
    if (p->optimizer->comm) /* a data-parallel save in flight commits once written */
        LLMT_TRY(llmt_trainer_dist_poll(tr));
    if (tr->cfg.fast_checkpoint_every && tr->step % tr->cfg.fast_checkpoint_every == 0) {
        LLMT_TRY(save_tier(tr, LLMT_CKPT_FAST, tr->cfg.checkpoint_async));
        r.checkpointed |= 1 << LLMT_CKPT_FAST;
    }
    if (tr->cfg.checkpoint_every && tr->step % tr->cfg.checkpoint_every == 0) {
        LLMT_TRY(save_tier(tr, LLMT_CKPT_DURABLE, tr->cfg.checkpoint_async));
        r.checkpointed |= 1 << LLMT_CKPT_DURABLE;
    }
    /* The run's last step, reached on every rank: its save commits here,
     * not in llmt_trainer_free, which runs no collective. */
    if (p->optimizer->comm && tr->step >= tr->cfg.total_steps)
        LLMT_TRY(llmt_trainer_dist_join(tr));
    LLMT_TRY(llmt_context_memory_stats(tr->ctx, &ms));
    memcpy(r.mem_current, ms.current, sizeof r.mem_current);
    r.step = tr->step;
    r.grad_norm = u.grad_norm;
    r.lr = u.lr;
    r.loss_scale = u.loss_scale;
    r.skipped = u.skipped;
    r.seconds = now_seconds() - t0;
    r.tokens_seen = tr->tokens_seen;
    llmt_metrics_step(tr, &r);
    if (report)
        *report = r;
    return LLMT_OK;
}

int llmt_trainer_run(llmt_trainer *tr, int64_t steps)
{
    if (!tr || steps < 0)
        return llmt_fail(LLMT_EINVAL, "llmt_trainer_run: %s", tr ? "steps < 0" : "tr is NULL");
    for (int64_t i = 0; i < steps && tr->step < tr->cfg.total_steps; i++) {
        llmt_step_report r;
        memset(&r, 0, sizeof r);
        r.version = LLMT_STEP_REPORT_VERSION;
        LLMT_TRY(llmt_trainer_step(tr, &r));
        int stop = tr->callback && tr->callback(tr->callback_user, &r);
        if (tr->parts.optimizer->comm) /* one rank's stop stops them all */
            LLMT_TRY(llmt_trainer_dist_any(tr, &stop));
        if (stop)
            break;
    }
    /* Every rank gets here alike (the stop is agreed): the save in flight
     * commits before the caller may free. */
    return tr->parts.optimizer->comm ? llmt_trainer_dist_join(tr) : LLMT_OK;
}
