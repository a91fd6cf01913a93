/* The adaptive controller's decisions: escalate above the threshold, relax
 * with headroom, fit after an allocation failure. Predictions replace the
 * bytes the current notch accounts for (the arena, an ordered slicer's
 * sum, and the optimizer state it leaves on the device) in the measured
 * peak by a candidate's, computed by the functions the model, slicer and
 * optimizer allocate with.
 *
 * Data parallel (a sharded optimizer): a rank's bytes differ from another's
 * (its optimizer range, so the state an offload rung moves), so each rank
 * makes its own candidate decision from its own peak, capacity and
 * predictions, and one allreduce (MAX) per decision point makes it every
 * rank's (one more agrees the host cap first, when the optimizer is
 * placed): escalate to the heaviest of the ranks' targets, relax only when
 * every rank predicts headroom, fit to the heaviest of the ranks' least
 * fitting notches, and fail on every rank when one has none. A rank's
 * failures and its placement's outcome travel in that agreement, so every
 * rank runs the same collectives whatever its own branch; a move is agreed
 * after it is made. A heavier notch than a rank's own choice drops more
 * (recompute, offload, micro-batch), so it fits that rank too; should it
 * not, that rank's next step escalates again, alike on every rank. */
#include <stdio.h>

#include "core/context_internal.h"
#include "core/error.h"
#include "model/grad_place.h"
#include "model/slicer_internal.h"
#include "optim/optim_internal.h"
#include "train/trainer_internal.h"

static double mib(uint64_t b)
{
    return (double)b / 1048576.0;
}

/* The communicator of a data-parallel run; NULL in one process. */
static llmt_comm *comm_of(const llmt_trainer *tr)
{
    return tr->parts.optimizer->comm;
}

/* Moves the optimizer's state to notch k's placement (see
 * llmt_controller_place), with the context's budget and bytes in use. */
static int place(llmt_trainer *tr, int64_t k)
{
    llmt_memory_stats ms = LLMT_MEMORY_STATS_INIT;
    LLMT_TRY(llmt_context_memory_stats(tr->ctx, &ms));
    return llmt_controller_place(&tr->ctl, k, ms.budget, ms.total_current);
}

/* Frees what a notch lays out for its steps, the activation arena and
 * the ordered sum, before a move: the optimizer's state has the room to
 * move, and the next step's peak measures the new layout alone (the next
 * batch lays both out again). In data parallel the model's gradients,
 * which hold no step's gradient there (the owners' sums do) and which
 * each round zeroes before its backward, are zeroed now where allocated:
 * a move copies none of them, and keeps no host copy the step would not
 * (llmt_grads_place). */
static int free_step_layout(llmt_trainer *tr)
{
    llmt_model *m = tr->parts.model;
    LLMT_TRY(llmt_model_release_activations(m));
    llmt_slicer_release_sum(tr->parts.slicer);
    return tr->parts.optimizer->comm && m->grads_live ? llmt_grads_zero(m) : LLMT_OK;
}

/* Moves to notch k: frees the old notch's step layout first, then places
 * the optimizer, then sets recompute and micro-batch. On failure the
 * notch is as it was. */
static int move_to(llmt_trainer *tr, int64_t k)
{
    LLMT_TRY(free_step_layout(tr));
    LLMT_TRY(place(tr, k));
    LLMT_TRY(llmt_controller_apply(&tr->ctl, k, tr->parts.recompute, tr->parts.slicer));
    tr->since_change = 0;
    tr->escalation_refused = 0;
    tr->over_without_remedy = 0;
    return LLMT_OK;
}

/* Decides once, before the first placement, whether the offload rungs
 * place the optimizer: in one process, when llmt_controller_placeable
 * allows it; in data parallel, only when every rank's may be placed (the
 * ladders, and so the notches, must be the same); when the ranks differ
 * (an owner offloaded on some rank) none is, logged. The rungs offload the
 * gradients too where the owner allowed it: in data parallel only where
 * every rank's owner did (the ranks' gradient splits must be the same),
 * else the state alone, logged. Collective on its first call, which every
 * rank makes at the same decision point. */
static int attach(llmt_trainer *tr)
{
    llmt_controller *c = &tr->ctl;
    llmt_comm *comm = comm_of(tr);
    if (c->attached)
        return LLMT_OK;
    int own = 0;
    int32_t parts = 0, layers = 0;
    LLMT_TRY(llmt_controller_placeable(tr->parts.optimizer, &own));
    LLMT_TRY(llmt_optimizer_get_offload(tr->parts.optimizer, &parts, &layers));
    const int grads = (parts & LLMT_OFFLOAD_GRADS) != 0;
    if (!comm)
        return llmt_controller_attach(c, tr->parts.optimizer, own, grads);
    /* MAX: some rank may be placed, some may not; some allows gradient
     * offload, some does not. */
    int64_t v[4] = {own != 0, own == 0, grads, !grads};
    LLMT_TRY(llmt_comm_allreduce_i64(comm, "controller placement", v, 4, LLMT_COMM_MAX));
    if (v[0] && v[1])
        llmt_trainer_log(tr, "escalate", "step %lld: the ranks' optimizers start placed "
                         "differently (an offload set on some rank): the offload rungs place "
                         "none of them", (long long)tr->step);
    else if (v[2] && v[3])
        llmt_trainer_log(tr, "escalate", "step %lld: gradient offload is allowed on some ranks "
                         "only: the offload rungs move the optimizer state alone",
                         (long long)tr->step);
    return llmt_controller_attach(c, tr->parts.optimizer, v[1] == 0, v[3] == 0);
}

/* Text of what the cap offloads: "all of the optimizer state", "the
 * optimizer state and gradients of the embedding and layers 0-3", "none of
 * the optimizer state". */
static void capped_text(const llmt_controller *c, char *buf, size_t size)
{
    const char *what = c->parts & LLMT_OFFLOAD_GRADS ? "optimizer state and gradients"
                                                      : "optimizer state";
    if (c->cap > c->layers)
        snprintf(buf, size, "all of the %s", what);
    else if (c->cap > 0)
        snprintf(buf, size, "the %s of the embedding and layers 0-%d", what, c->cap - 1);
    else
        snprintf(buf, size, "none of the %s", what);
}

/* Sets the ladder's cap for this decision (llmt_controller_host_cap): in
 * data parallel the least of the ranks' caps, agreed by one allreduce that
 * every rank makes (whether the optimizer is placed is agreed), so the
 * ladders stay the same. A cap that changes is logged as of `step`. A
 * current notch on a passed-over rung then snaps to its equal
 * (llmt_controller_snap). */
static int set_cap(llmt_trainer *tr, int64_t step)
{
    llmt_controller *c = &tr->ctl;
    if (!c->opt) {
        llmt_controller_snap(c);
        return LLMT_OK;
    }
    const int32_t top = c->layers + 1;
    int64_t below_top = top - llmt_controller_host_cap(c); /* MAX: the least cap */
    llmt_comm *comm = comm_of(tr);
    if (comm)
        LLMT_TRY(llmt_comm_allreduce_i64(comm, "controller host cap", &below_top, 1,
                                         LLMT_COMM_MAX));
    const int32_t cap = top - (int32_t)below_top;
    const int changed = cap != c->cap;
    c->cap = cap;
    llmt_controller_snap(c); /* also a notch a resume or an escalation left on such a rung */
    if (!changed)
        return LLMT_OK;
    char held[160];
    capped_text(c, held, sizeof held);
    if (cap == top)
        llmt_trainer_log(tr, "escalate", "step %lld: the host holds %s: every offload rung may be "
                         "used", (long long)step, held);
    else
        llmt_trainer_log(tr, "escalate", "step %lld: the host budget%s holds %s: the offload rungs "
                         "above are passed over, and the smaller micro-batches keep that "
                         "placement", (long long)step, comm ? " (the tightest rank's)" : "",
                         held);
    return LLMT_OK;
}

/* The optimizer's placement before a sync_placement, for going back. */
typedef struct placement {
    int32_t parts, layers;
} placement;

/* Gives the optimizer the current notch's placement where it has
 * another: at the first decision after creation, after a resume whose
 * notch is an offload rung, or after the cap changed the placement of a
 * passed-over rung or a smaller micro-batch. A move frees the step layout
 * first, as move_to does. *was receives the placement before; sets *moved
 * when it changed (the step just measured had another). */
static int sync_placement(llmt_trainer *tr, placement *was, int *moved)
{
    *moved = 0;
    LLMT_TRY(llmt_optimizer_get_offload(tr->parts.optimizer, &was->parts, &was->layers));
    if (llmt_controller_moves(&tr->ctl, tr->ctl.notch))
        LLMT_TRY(free_step_layout(tr));
    LLMT_TRY(place(tr, tr->ctl.notch));
    placement now; /* a placement changes its layers (llmt_controller_place) */
    LLMT_TRY(llmt_optimizer_get_offload(tr->parts.optimizer, &now.parts, &now.layers));
    *moved = now.layers != was->layers;
    return LLMT_OK;
}

/* After a sync_placement that failed on some rank, which stays placed as
 * it was (or, where its own way back failed too, at the cap's placement):
 * where the rungs move gradients, whose placement must be the same on
 * every rank (dist.c), a rank whose own move worked goes back to `was`
 * (the state alone may be placed differently by rank). Should that fail,
 * or the failed rank be left elsewhere, the next step fails on every rank
 * naming the gradients' placement; logged here when it is this rank's. */
static void undo_sync(llmt_trainer *tr, const placement *was, int moved)
{
    if (!moved || !tr->ctl.opt || !(tr->ctl.parts & LLMT_OFFLOAD_GRADS))
        return;
    if (llmt_optimizer_set_offload(tr->ctl.opt, was->parts, was->layers))
        llmt_trainer_log(tr, "escalate", "step %lld: going back to the placement another rank "
                         "kept failed (%s): the ranks' gradients are placed differently, which "
                         "the next step refuses", (long long)tr->step, llmt_error_last());
}

/* One rank's part of a decision, agreed entry by entry as the MAX over the
 * ranks (in one process: its own). */
enum {
    AG_FAILED, /* size - rank of the lowest rank whose own work failed; 0: none */
    AG_STAYED, /* a placement the budget refused: the state stays as it is */
    AG_MOVED,  /* the optimizer's placement changed to the notch's */
    AG_NOTCH,  /* the notch wanted: the escalation or fit target; max + 1: none fits */
    AG_VETO,   /* relaxing predicts no headroom */
    AG_NONE,   /* size - rank of the lowest rank where no notch fits; 0: none */
    AG_COUNT
};

/* Agrees v across the ranks of a data-parallel run (nothing in one
 * process). rc is this rank's own failure (its message is kept): it
 * becomes v[AG_FAILED]. Returns rc, or LLMT_ECOMM naming the failed rank
 * on the others, or the collective's failure. */
static int agree(llmt_trainer *tr, int rc, int64_t *v)
{
    llmt_comm *comm = comm_of(tr);
    if (!comm)
        return rc;
    const int32_t me = llmt_comm_rank(comm), n = llmt_comm_size(comm);
    char own[512];
    if (rc)
        snprintf(own, sizeof own, "%s", llmt_error_last());
    v[AG_FAILED] = rc ? n - me : 0;
    int crc = llmt_comm_allreduce_i64(comm, "controller decision", v, AG_COUNT, LLMT_COMM_MAX);
    if (rc && crc) {
        char agreement[512];
        snprintf(agreement, sizeof agreement, "%s", llmt_error_last());
        return llmt_fail(crc, "%s (this rank had failed before: %s)", agreement, own);
    }
    if (rc)
        return llmt_fail(rc, "%s", own);
    if (crc || !v[AG_FAILED])
        return crc;
    return llmt_fail(LLMT_ECOMM, "rank %d: rank %lld failed in the adaptive controller", me,
                     (long long)(n - v[AG_FAILED]));
}

/* A move every rank made (or tried): its failure on any rank becomes every
 * rank's (the lowest failed rank's status in *failed). */
static int agree_move(llmt_trainer *tr, int rc, int *failed)
{
    llmt_comm *comm = comm_of(tr);
    *failed = rc;
    return comm ? llmt_comm_agree_code(comm, rc, failed) : rc;
}

/* Moves every rank to notch k (move_to; collective in data parallel).
 * When the move fails on any rank, the ranks whose own move worked go back
 * to the notch they left, so that every rank stays at one notch, the
 * window restarts on every rank alike, and the failure is every rank's.
 * *refused (may be NULL) is set when the failure is only a budget's
 * refusal (LLMT_ENOMEM, the lowest failed rank's) with every rank back
 * where it was: a rank's own failure of another kind, or a way back that
 * fails, is not. Should going back fail (a budget refusing the state's
 * return), the ranks' notches may differ: the next step's shape check
 * then refuses to run (dist.c). */
static int move_all(llmt_trainer *tr, int64_t k, int *refused)
{
    const int64_t was = tr->ctl.notch;
    if (refused)
        *refused = 0;
    const int own = move_to(tr, k);
    char own_why[512] = "";
    if (own)
        snprintf(own_why, sizeof own_why, "%s", llmt_error_last());
    int failed = LLMT_OK;
    int rc = agree_move(tr, own, &failed);
    if (!rc || !comm_of(tr)) {
        if (refused)
            *refused = rc == LLMT_ENOMEM;
        return rc;
    }
    char why[512];
    snprintf(why, sizeof why, "%s", llmt_error_last());
    /* A rank whose own move failed other than for memory fails its way
     * back too, so the agreement below fails on every rank and *refused
     * stays 0: only a budget's refusal everywhere it failed is "refused". */
    int back = own == LLMT_OK       ? move_to(tr, was)
               : own == LLMT_ENOMEM ? LLMT_OK
                                    : llmt_fail(own, "%s", own_why);
    tr->since_change = 0; /* on every rank, whatever the way back gives */
    int back_failed = LLMT_OK;
    LLMT_TRY(agree_move(tr, back, &back_failed));
    if (refused)
        *refused = failed == LLMT_ENOMEM;
    return llmt_fail(rc, "%s", why);
}

/* The outcome rc of a move between steps that move_all made (an
 * escalation above the threshold when escalating, else a relaxation with
 * headroom). A move only a budget refused (refused) left every rank where
 * it was: logged ("escalate" or "relax": "<moving> refused, staying at
 * [from]"), the window restarts and the step just counted stands. A
 * refused escalation is tried again once the window reaches relax_window
 * (not at every step: the ranks whose move worked would move their state
 * out and back each time); a step that does not fit meanwhile takes the
 * out-of-memory path, which fits it or fails before the step is counted.
 * Any other failure is returned. */
static int stay_if_refused(llmt_trainer *tr, int rc, int refused, int escalating,
                           const char *from)
{
    if (!rc || !refused)
        return rc;
    llmt_trainer_log(tr, escalating ? "escalate" : "relax",
                     "step %lld: %s refused, staying at [%s]: %s%s", (long long)tr->step,
                     escalating ? "escalating" : "relaxing", from, llmt_error_last(),
                     escalating ? "; tried again in relax_window steps, or at once should a "
                                  "step run out of memory" : "");
    tr->since_change = 0;
    tr->escalation_refused = escalating;
    return LLMT_OK;
}

/* The figures of this rank's candidates after a step, which the logs give. */
typedef struct candidate {
    uint64_t other;  /* the peak's bytes that the notch leaves */
    double ratio;    /* peak over capacity */
    int64_t found;   /* the lightest notch under the threshold; -1: none */
    int64_t least;   /* with found -1: the heavier notch predicted lowest */
    int64_t lighter; /* the notch relaxing moves to (the notch itself: none) */
    uint64_t lighter_bytes;
} candidate;

/* This rank's candidates after a step that peaked at `peak` of `cap`
 * bytes: when over the threshold (with a heavier notch left) the
 * escalation target into v[AG_NOTCH]: max + 1 when none gets under it but
 * one is predicted lower than the current (cd->least), the current notch
 * when none is (with an ordered slicer the first halving adds the sum of
 * every gradient, so a heavier notch is not always lower); and whether
 * relaxing would leave no headroom into v[AG_VETO]. */
static int propose(llmt_trainer *tr, uint64_t peak, uint64_t cap, candidate *cd, int64_t *v)
{
    llmt_controller *c = &tr->ctl;
    uint64_t current = 0;
    LLMT_TRY(llmt_controller_bytes(c, c->notch, &current));
    cd->other = peak > current ? peak - current : 0; /* everything the notch leaves */
    cd->ratio = (double)peak / (double)cap;
    cd->found = -1;
    if (cd->ratio > tr->cfg.memory_threshold && c->notch < c->max) {
        uint64_t limit = (uint64_t)(tr->cfg.memory_threshold * (double)cap);
        uint64_t least = 0;
        LLMT_TRY(llmt_controller_find(c, cd->other, limit, &cd->found, &cd->least, &least));
        v[AG_NOTCH] = cd->found >= 0 ? cd->found : least < current ? c->max + 1 : c->notch;
    }
    /* The relax window counts this step (since_change is the same on every
     * rank): the prediction is needed only when the window is full. */
    cd->lighter = llmt_controller_lighter(c, c->notch);
    v[AG_VETO] = 1;
    if (cd->lighter < c->notch && tr->since_change + 1 >= tr->cfg.relax_window) {
        LLMT_TRY(llmt_controller_bytes(c, cd->lighter, &cd->lighter_bytes));
        double predicted = (double)(cd->other + cd->lighter_bytes) / (double)cap;
        v[AG_VETO] = !(predicted < tr->cfg.memory_threshold - tr->cfg.hysteresis);
    }
    return LLMT_OK;
}

/* Escalates to the agreed notch (above the current). A budget that
 * refuses the move on any rank leaves every rank where it was
 * (stay_if_refused). */
static int escalate(llmt_trainer *tr, uint64_t peak, uint64_t cap, const candidate *cd,
                    int64_t agreed)
{
    llmt_controller *c = &tr->ctl;
    /* None under the threshold: the lowest prediction, which in data
     * parallel (no ordered sum: the bytes never rise along the ladder) is
     * the heaviest notch not passed over on every rank; taken as that
     * there, so the ranks agree whatever their own bytes. */
    int64_t target = agreed <= c->max ? agreed
                     : comm_of(tr)    ? llmt_controller_lighter(c, c->max + 1)
                                      : cd->least;
    if (target <= c->notch) /* nothing heavier changes anything */
        return LLMT_OK;
    uint64_t next = 0;
    LLMT_TRY(llmt_controller_bytes(c, target, &next));
    char from[320], to[320];
    llmt_controller_describe(c, c->notch, from, sizeof from);
    llmt_controller_describe(c, target, to, sizeof to);
    double predicted = (double)(cd->other + next) / (double)cap;
    if (!comm_of(tr))
        llmt_trainer_log(tr, "escalate", "step %lld: peak %.1f MiB is %.3f of capacity %.1f MiB, "
                         "over the threshold %.2f: escalating from [%s] to [%s], predicted peak "
                         "%.1f MiB (%.3f)%s", (long long)tr->step, mib(peak), cd->ratio, mib(cap),
                         tr->cfg.memory_threshold, from, to, mib(cd->other + next), predicted,
                         cd->found >= 0 ? "" : "; no setting gets under the threshold: the one "
                                               "predicted lowest");
    else
        llmt_trainer_log(tr, "escalate", "step %lld: a rank's peak is over the threshold %.2f "
                         "(this rank's: %.1f MiB, %.3f of capacity %.1f MiB): every rank "
                         "escalating from [%s] to [%s], the heaviest of the ranks' choices; "
                         "predicted peak on this rank %.1f MiB (%.3f)%s", (long long)tr->step,
                         tr->cfg.memory_threshold, mib(peak), cd->ratio, mib(cap), from, to,
                         mib(cd->other + next), predicted,
                         agreed <= c->max ? "" : "; no setting gets under the threshold on "
                                                 "some rank: the one predicted lowest");
    int refused = 0;
    int rc = move_all(tr, target, &refused);
    return stay_if_refused(tr, rc, refused, 1, from);
}

/* Relaxes to the lighter notch, which every rank predicted under the
 * threshold less the hysteresis. A budget that refuses the move on any
 * rank leaves every rank where it was (stay_if_refused). */
static int relax(llmt_trainer *tr, const candidate *cd, uint64_t cap)
{
    llmt_controller *c = &tr->ctl;
    const int64_t was = c->notch;
    char from[320], to[320];
    llmt_controller_describe(c, was, from, sizeof from);
    llmt_controller_describe(c, cd->lighter, to, sizeof to);
    double predicted = (double)(cd->other + cd->lighter_bytes) / (double)cap;
    llmt_trainer_log(tr, "relax", "step %lld: %lld steps at most %.3f of capacity%s: "
                     "relaxing from [%s] to [%s], predicted peak %.1f MiB (%.3f, under %.2f)",
                     (long long)tr->step, (long long)tr->since_change, cd->ratio,
                     comm_of(tr) ? " on this rank, every rank predicting headroom" : "", from, to,
                     mib(cd->other + cd->lighter_bytes), predicted,
                     tr->cfg.memory_threshold - tr->cfg.hysteresis);
    int refused = 0;
    int rc = move_all(tr, cd->lighter, &refused);
    return stay_if_refused(tr, rc, refused, 0, from);
}

/* Logs once (until the next move) that this rank's peak is over the
 * threshold and no heavier notch is predicted lower, so the controller
 * stays. */
static void note_no_remedy(llmt_trainer *tr, uint64_t peak, uint64_t cap)
{
    if (tr->over_without_remedy)
        return;
    char at[320];
    llmt_controller_describe(&tr->ctl, tr->ctl.notch, at, sizeof at);
    llmt_trainer_log(tr, "escalate", "step %lld: peak %.1f MiB is %.3f of capacity %.1f MiB, over "
                     "the threshold %.2f, and no heavier setting is predicted lower: staying at "
                     "[%s]", (long long)tr->step, mib(peak), (double)peak / (double)cap, mib(cap),
                     tr->cfg.memory_threshold, at);
    tr->over_without_remedy = 1;
}

int llmt_trainer_adapt(llmt_trainer *tr, uint64_t peak, uint64_t cap)
{
    llmt_controller *c = &tr->ctl;
    int64_t v[AG_COUNT] = {0};
    v[AG_NOTCH] = c->notch;
    candidate cd = {0};
    int moved = 0;
    placement was = {0, 0};
    char stayed[512] = "a rank's budget refused the move to the notch's placement";
    int rc = attach(tr);
    if (!rc)
        rc = set_cap(tr, tr->step);
    if (!rc)
        rc = sync_placement(tr, &was, &moved);
    if (rc == LLMT_ENOMEM) { /* the step is applied: it stays placed as it is */
        snprintf(stayed, sizeof stayed, "%s", llmt_error_last());
        v[AG_STAYED] = 1;
        rc = LLMT_OK;
    }
    v[AG_MOVED] = moved;
    if (!rc && !v[AG_STAYED] && !moved)
        rc = propose(tr, peak, cap, &cd, v);
    rc = agree(tr, rc, v);
    if (rc) { /* a rank failed otherwise: no rank keeps a move the others lack */
        char failed[512];
        snprintf(failed, sizeof failed, "%s", llmt_error_last());
        undo_sync(tr, &was, moved);
        return llmt_fail(rc, "%s", failed);
    }
    if (v[AG_STAYED]) {
        undo_sync(tr, &was, moved);
        llmt_trainer_log(tr, "escalate", "step %lld: the optimizer stays placed as it is (%s)",
                         (long long)tr->step, stayed);
        return LLMT_OK;
    }
    if (v[AG_MOVED]) /* the peak was measured with another placement: decide next step */
        return LLMT_OK;
    tr->since_change++;
    /* After a refused escalation, the next waits for the window (the
     * flag and the window are the same on every rank). */
    const int waiting = tr->escalation_refused && tr->since_change < tr->cfg.relax_window;
    if (v[AG_NOTCH] > c->notch)
        return waiting ? LLMT_OK : escalate(tr, peak, cap, &cd, v[AG_NOTCH]);
    if (cd.ratio > tr->cfg.memory_threshold)
        note_no_remedy(tr, peak, cap);
    if (cd.lighter < c->notch && tr->since_change >= tr->cfg.relax_window && !v[AG_VETO])
        return relax(tr, &cd, cap);
    return LLMT_OK;
}

int llmt_trainer_escalate_to_fit(llmt_trainer *tr, const char *why)
{
    llmt_controller *c = &tr->ctl;
    llmt_comm *comm = comm_of(tr);
    int64_t v[AG_COUNT] = {0};
    int moved = 0;
    placement was = {0, 0};
    int rc = free_step_layout(tr); /* the arena is remade for the notch the retry takes */
    if (!rc)
        rc = attach(tr);
    if (!rc)
        rc = set_cap(tr, tr->step + 1);
    if (!rc)
        rc = sync_placement(tr, &was, &moved);
    v[AG_MOVED] = moved;
    llmt_memory_stats ms = LLMT_MEMORY_STATS_INIT;
    if (!rc)
        rc = llmt_context_memory_stats(tr->ctx, &ms);
    uint64_t budget = ms.budget ? ms.budget : ms.device_total;
    uint64_t in_use = ms.total_current; /* the arena is released */
    uint64_t room = budget > in_use ? budget - in_use : 0;
    /* A notch's bytes include the optimizer state it leaves on the device,
     * which in_use holds for the current placement: that is room too. */
    uint64_t placed = llmt_controller_placed_bytes(c);
    int64_t k = -1;
    if (!rc && !moved)
        rc = llmt_controller_find(c, 0, room + placed, &k, NULL, NULL);
    if (!rc && !moved && k < 0 && comm)
        v[AG_NONE] = llmt_comm_size(comm) - llmt_comm_rank(comm);
    v[AG_NOTCH] = k >= 0 ? k : c->max + 1;
    rc = agree(tr, rc, v);
    if (rc) {
        char failed[512];
        snprintf(failed, sizeof failed, "%s", llmt_error_last());
        undo_sync(tr, &was, moved);
        return llmt_fail(rc, "%s", failed);
    }
    char from[320], to[320];
    if (v[AG_MOVED]) { /* the notch (a resumed one) had not placed the optimizer yet */
        llmt_controller_describe(c, c->notch, to, sizeof to);
        llmt_trainer_log(tr, "escalate", "step %lld: out of memory (%s): retrying the same batch "
                         "with the optimizer placed as [%s] says", (long long)tr->step + 1, why,
                         to);
        return LLMT_OK;
    }
    llmt_controller_describe(c, c->notch, from, sizeof from);
    if (k < 0) {
        uint64_t least = 0;
        LLMT_TRY(llmt_controller_bytes(c, c->max, &least));
        char offloaded[224] = "";
        if (c->opt) {
            char held[160];
            capped_text(c, held, sizeof held);
            snprintf(offloaded, sizeof offloaded, " and %s offloaded%s", held,
                     c->cap > c->layers ? ""
                     : comm ? " (what the tightest rank's host budget holds)"
                            : " (what the host budget holds)");
        }
        const int summed = c->slicer && c->batch > 1 &&
                           llmt_slicer_accumulation(c->slicer) == LLMT_ACCUMULATE_ORDERED;
        return llmt_fail(LLMT_ENOMEM, "step %lld does not fit: micro-batch 1 with full recompute%s "
                         "needs %llu bytes of activations and workspace%s%s (the planner's "
                         "figure), %llu are free (budget %llu, %llu in use%s); the failed "
                         "allocation: %s",
                         (long long)tr->step + 1, offloaded, (unsigned long long)least,
                         c->opt ? ", with the optimizer state it leaves on the device" : "",
                         summed ? ", with the ordered gradient sum's device part" : "",
                         (unsigned long long)(room + placed), (unsigned long long)budget,
                         (unsigned long long)in_use,
                         c->opt ? ", the optimizer's device state counted as free" : "", why);
    }
    if (v[AG_NONE]) /* fits here, not on another rank: every rank fails alike */
        return llmt_fail(LLMT_ENOMEM, "step %lld does not fit on rank %lld (micro-batch 1 with "
                         "full recompute needs more than its budget leaves; its message says "
                         "how much); the failed allocation: %s", (long long)tr->step + 1,
                         (long long)(llmt_comm_size(comm) - v[AG_NONE]), why);
    int64_t target = v[AG_NOTCH]; /* the heaviest of the ranks' least fitting notches */
    uint64_t need = 0;
    LLMT_TRY(llmt_controller_bytes(c, target, &need));
    llmt_controller_describe(c, target, to, sizeof to);
    llmt_trainer_log(tr, "escalate", "step %lld: out of memory (%s): retrying the same batch with "
                     "[%s] instead of [%s], which needs %.1f MiB of the %.1f MiB free%s",
                     (long long)tr->step + 1, why, to, from, mib(need), mib(room + placed),
                     comm ? " on this rank (the heaviest of the ranks' least fitting notches)"
                          : "");
    return move_all(tr, target, NULL);
}
