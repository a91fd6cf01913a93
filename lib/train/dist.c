/* The trainer's data-parallel step: the global batch's micro-batches run
 * across the ranks of a sharded optimizer, each micro-batch's gradient is
 * reduced to its owners, and checkpoints go through rank 0. */
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "core/error.h"
#include "dist/shard.h"
#include "model/grad_place.h"
#include "model/model_internal.h"
#include "optim/optim_internal.h"
#include "train/trainer_internal.h"

/* Targets that count (not -1) among n. */
static int64_t counted(const int32_t *targets, int64_t n)
{
    int64_t c = 0;
    for (int64_t i = 0; i < n; i++)
        c += targets[i] >= 0;
    return c;
}

/* The geometry of a step: K micro-batches of up to b rows. */
typedef struct split {
    int32_t rows_per, count;
    double denominator; /* counted targets of the global batch (1 when none) */
    int64_t total;
} split;

/* Forward and backward of micro-batch g, its loss sum stored as bits in
 * loss_bits[g] (an allreduce of integers then moves it exactly). */
static int run_micro(llmt_trainer *tr, const split *sp, int32_t g, double scale, int64_t *loss_bits)
{
    const int32_t B = tr->cfg.batch_size, T = tr->cfg.seq_len;
    int32_t first = g * sp->rows_per, rows = B - first < sp->rows_per ? B - first : sp->rows_per;
    size_t off = (size_t)first * (size_t)T;
    double loss = 0.0;
    LLMT_TRY(llmt_model_forward_backward(tr->parts.model, tr->tokens + off, tr->targets + off, rows,
                                         T, scale, sp->denominator, &loss));
    double sum = loss * (double)counted(tr->targets + off, (int64_t)rows * T);
    memcpy(&loss_bits[g], &sum, sizeof sum);
    return LLMT_OK;
}

/* The overlapped reduction of one micro-batch's gradients: the model's
 * bucket_final queues each bucket's exchange as backward finishes it. */
typedef struct overlap {
    llmt_optimizer *o;
    const uint8_t *present;
    int32_t next; /* the next bucket backward finishes; -1 once all are queued */
    int stopped;  /* a queuing failed: nothing more is queued */
} overlap;

static int queue_bucket(void *user, int32_t bucket)
{
    overlap *ov = user;
    int rc = bucket != ov->next /* backward's order is fixed; the ranks' calls must match */
                 ? llmt_fail(LLMT_EINVAL, "trainer: gradient bucket %d became final, %d "
                             "expected", bucket, ov->next)
                 : llmt_optimizer_reduce_bucket(ov->o, bucket, ov->present);
    if (rc)
        ov->stopped = 1; /* a bucket is never queued twice (its windows would add twice) */
    else
        ov->next = bucket - 1;
    return rc;
}

/* Micro-batch g (none when g < 0) with its gradients reduced as backward
 * produces them (present: the round's ranks with a micro-batch). Every
 * rank queues every bucket in the same order, also after a failure of the
 * pass (its bytes then are what the failed pass left, and the failure is
 * agreed before the sum is used), so that the engine's calls stay matched.
 * A failure of the queuing itself stops it: one of the engine aborts the
 * engine; a local one (an offloaded bucket's copy into or out of its slot,
 * on CUDA in practice an error that breaks the context) leaves this rank's
 * calls short of the others'. Either way the other ranks' next collective
 * fails in the engine's bounded wait, and the round's sums are not used. */
static int run_micro_overlapped(llmt_trainer *tr, const split *sp, int32_t g, double scale,
                                int64_t *loss_bits, const uint8_t *present)
{
    llmt_model *m = tr->parts.model;
    overlap ov = {tr->parts.optimizer, present, llmt_grad_bucket_count(m) - 1, 0};
    int rc = LLMT_OK;
    if (g >= 0) {
        m->bucket_final = queue_bucket;
        m->bucket_final_user = &ov;
        rc = run_micro(tr, sp, g, scale, loss_bits);
        m->bucket_final = NULL;
        m->bucket_final_user = NULL;
    }
    int queued = LLMT_OK;
    while (ov.next >= 0 && !ov.stopped)
        queued = queue_bucket(&ov, ov.next);
    if (!ov.stopped)
        queued = llmt_optimizer_reduce_join(ov.o);
    else /* Unjoined, the slots are safe because the caller's next call is the
          * failure's agreement, a collective that first waits (bounded) for
          * everything the engine queued: no device work may come between. */
        llmt_grads_sent_joined(m);
    return rc ? rc : queued;
}

/* Deterministic: round j runs micro-batch j N + r on rank r, and each owner
 * adds the round's gradients in rank order, which is micro-batch order;
 * with `overlap`, while backward runs. */
static int deterministic_rounds(llmt_trainer *tr, const split *sp, int overlap, double scale,
                                int64_t *loss_bits, uint8_t *present, int *failed)
{
    llmt_optimizer *o = tr->parts.optimizer;
    const int32_t n = llmt_comm_size(o->comm), me = llmt_comm_rank(o->comm);
    for (int32_t j = 0; j * n < sp->count; j++) {
        int32_t g = j * n + me;
        for (int32_t r = 0; r < n; r++)
            present[r] = j * n + r < sp->count;
        int rc = llmt_model_zero_grads(tr->parts.model);
        if (overlap) {
            int q = run_micro_overlapped(tr, sp, rc || g >= sp->count ? -1 : g, scale, loss_bits,
                                         present);
            rc = rc ? rc : q;
        } else if (!rc && g < sp->count)
            rc = run_micro(tr, sp, g, scale, loss_bits);
        LLMT_TRY(llmt_comm_agree_code(o->comm, rc, failed));
        if (!overlap)
            LLMT_TRY(llmt_optimizer_reduce_round(o, present));
    }
    return LLMT_OK;
}

/* Fast: rank r runs its window of micro-batches in place, then one
 * exchange; with `overlap`, during the last micro-batch's backward. */
static int fast_window(llmt_trainer *tr, const split *sp, int overlap, double scale,
                       int64_t *loss_bits, uint8_t *present, int *failed)
{
    llmt_optimizer *o = tr->parts.optimizer;
    const int32_t n = llmt_comm_size(o->comm), me = llmt_comm_rank(o->comm);
    int32_t first = 0, end = 0;
    llmt_fast_window(sp->count, n, me, &first, &end);
    for (int32_t r = 0; r < n; r++) {
        int32_t a = 0, b = 0;
        llmt_fast_window(sp->count, n, r, &a, &b);
        present[r] = b > a;
    }
    int rc = llmt_model_zero_grads(tr->parts.model);
    for (int32_t g = first; !rc && g < end - (overlap ? 1 : 0); g++)
        rc = run_micro(tr, sp, g, scale, loss_bits);
    if (overlap) {
        int q = run_micro_overlapped(tr, sp, rc || end == first ? -1 : end - 1, scale, loss_bits,
                                     present);
        rc = rc ? rc : q;
    }
    LLMT_TRY(llmt_comm_agree_code(o->comm, rc, failed));
    return overlap ? LLMT_OK : llmt_optimizer_reduce_round(o, present);
}

int llmt_trainer_dist_forward_backward(llmt_trainer *tr, double scale, double *loss, int *failed)
{
    const llmt_trainer_parts *p = &tr->parts;
    llmt_optimizer *o = p->optimizer;
    const int32_t B = tr->cfg.batch_size, T = tr->cfg.seq_len;
    int32_t micro = p->slicer ? llmt_slicer_micro_batch(p->slicer) : B;
    split sp = {micro < B ? micro : B, 0, 1.0, counted(tr->targets, (int64_t)B * T)};
    sp.count = (B + sp.rows_per - 1) / sp.rows_per;
    sp.denominator = sp.total > 0 ? (double)sp.total : 1.0;
    *failed = LLMT_OK;
    llmt_model *m = p->model;
    int rc = LLMT_OK;
    /* One micro-batch's arena, as the slicer keeps it. */
    if (!m->have_arena || m->layout.batch != sp.rows_per || m->layout.seq != T ||
        memcmp(m->arena_flags, m->rc_flags, (size_t)m->dims.layers) != 0)
        rc = llmt_model_reserve_activations(m, sp.rows_per, T);
    int64_t *loss_bits = calloc((size_t)sp.count, sizeof *loss_bits);
    uint8_t *present = calloc((size_t)llmt_comm_size(o->comm), 1);
    if (!rc && (!loss_bits || !present))
        rc = llmt_fail(LLMT_ENOMEM, "trainer: out of host memory");
    if (!rc)
        rc = llmt_optimizer_reduce_begin(o);
    int overlap = 0;
    if (!rc)
        rc = llmt_optimizer_reduce_overlaps(
            o, llmt_one_micro_per_exchange(o->reduce_mode, sp.count, llmt_comm_size(o->comm),
                                           llmt_comm_rank(o->comm)),
            &overlap);
    /* Every rank's local work before the first collective of the step is
     * agreed, then the step's shape: the same micro-batch, recompute and
     * overlap on every rank, or the micro-batches (and the engine's calls)
     * would not line up; the same gradient split, where the exchange's
     * windows are cut (sharded.c); and the same notch of the adaptive
     * controller, whose decisions are collectives (adapt.c). */
    rc = llmt_comm_agree_code(o->comm, rc, failed);
    uint64_t shape = (uint64_t)sp.rows_per << 32 | (uint64_t)T | (uint64_t)overlap << 63;
    uint64_t agreed[2] = {(uint64_t)tr->ctl.notch, (uint64_t)llmt_offload_grad_split(o)};
    if (!rc)
        rc = llmt_comm_check_same(o->comm, "the micro-batch, recompute policy, reduction "
                                  "overlap, gradient placement (offloaded layers) and adaptive "
                                  "controller's notch of the step",
                                  XXH3_64bits_withSeed(m->rc_flags, (size_t)m->dims.layers, shape) ^
                                      XXH3_64bits(agreed, sizeof agreed));
    if (!rc)
        rc = o->reduce_mode == LLMT_REDUCE_FAST
                 ? fast_window(tr, &sp, overlap, scale, loss_bits, present, failed)
                 : deterministic_rounds(tr, &sp, overlap, scale, loss_bits, present, failed);
    /* Each micro-batch's loss sum came from one rank, zeros from the others. */
    if (!rc)
        rc = llmt_comm_allreduce_i64(o->comm, "loss", loss_bits, (size_t)sp.count, LLMT_COMM_SUM);
    double sum = 0.0;
    for (int32_t g = 0; !rc && g < sp.count; g++) { /* micro-batch order, as the slicer */
        double x = 0.0;
        memcpy(&x, &loss_bits[g], sizeof x);
        sum += x;
    }
    *loss = sp.total > 0 ? sum / (double)sp.total : 0.0;
    free(loss_bits);
    free(present);
    if (rc || *failed) /* no whole sum: a later llmt_optimizer_step reduces anew */
        o->grads_reduced = 0;
    return rc;
}

uint64_t llmt_trainer_dist_hash(const llmt_trainer *tr)
{
    const llmt_trainer_parts *p = &tr->parts;
    const llmt_trainer_config *c = &tr->cfg;
    llmt_loader_state at[2] = {LLMT_LOADER_STATE_INIT, LLMT_LOADER_STATE_INIT};
    llmt_loader_get_state(p->loader, &at[0]);
    if (p->eval_loader)
        llmt_loader_get_state(p->eval_loader, &at[1]);
    uint64_t v[] = {(uint64_t)c->batch_size, (uint64_t)c->seq_len, (uint64_t)c->total_steps,
                    (uint64_t)c->eval_every, (uint64_t)c->eval_batches,
                    (uint64_t)c->checkpoint_every, (uint64_t)c->fast_checkpoint_every,
                    (uint64_t)c->adaptive, (uint64_t)c->relax_window,
                    (uint64_t)(c->memory_threshold * 1e9), (uint64_t)(c->hysteresis * 1e9),
                    (uint64_t)(p->slicer ? llmt_slicer_micro_batch(p->slicer) : 0),
                    p->scaler != NULL, p->eval_loader != NULL,
                    at[0].epoch, at[0].shard_cursor, at[0].window_cursor, at[0].windows_consumed,
                    at[0].seed, at[0].fingerprint, at[1].seed, at[1].fingerprint};
    return XXH3_64bits_withSeed(v, sizeof v, XXH3_64bits(p->model->rc_flags,
                                                         (size_t)p->model->dims.layers));
}

int llmt_trainer_dist_memory(llmt_trainer *tr, uint64_t *peak, uint64_t *capacity)
{
    /* The largest peak and the smallest capacity: MAX of (peak, -capacity). */
    int64_t v[2] = {(int64_t)*peak, -(int64_t)*capacity};
    LLMT_TRY(llmt_comm_allreduce_i64(tr->parts.optimizer->comm, "memory agreement", v, 2,
                                     LLMT_COMM_MAX));
    *peak = (uint64_t)v[0];
    *capacity = (uint64_t)-v[1];
    return LLMT_OK;
}

int llmt_trainer_dist_any(llmt_trainer *tr, int *flag)
{
    int64_t v = *flag != 0;
    LLMT_TRY(llmt_comm_allreduce_i64(tr->parts.optimizer->comm, "stop agreement", &v, 1,
                                     LLMT_COMM_MAX));
    *flag = (int)v;
    return LLMT_OK;
}
