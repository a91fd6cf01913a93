/* The adaptive controller's decisions: escalate above the threshold, relax
 * with headroom, fit after an allocation failure. Predictions replace the
 * bytes the current notch accounts for (the arena, and the optimizer state
 * it leaves on the device) in the measured peak by a candidate's, computed
 * by the functions the model and optimizer allocate with. */
#include <stdio.h>

#include "core/context_internal.h"
#include "core/error.h"
#include "optim/optim_internal.h"
#include "train/trainer_internal.h"

static double mib(uint64_t b)
{
    return (double)b / 1048576.0;
}

/* Moves the optimizer's state to notch k's placement (see
 * llmt_controller_place), with the context's budget and bytes in use. */
static int place(llmt_trainer *tr, int64_t k)
{
    llmt_memory_stats ms = LLMT_MEMORY_STATS_INIT;
    LLMT_TRY(llmt_context_memory_stats(tr->ctx, &ms));
    return llmt_controller_place(&tr->ctl, tr->parts.optimizer, k, ms.budget, ms.total_current);
}

/* Moves to notch k: frees the arena laid out for the old one first (so the
 * optimizer's state has room to move, and the next step's peak measures
 * the new layout alone), then places the optimizer, then sets recompute and
 * micro-batch. On failure the notch is as it was. */
static int move_to(llmt_trainer *tr, int64_t k)
{
    LLMT_TRY(llmt_model_release_activations(tr->parts.model));
    LLMT_TRY(place(tr, k));
    LLMT_TRY(llmt_controller_apply(&tr->ctl, k, tr->parts.recompute, tr->parts.slicer));
    tr->since_change = 0;
    return LLMT_OK;
}

/* Gives the optimizer the current notch's placement: the first decision
 * after creation, or after a resume whose notch is an offload rung. Sets
 * *moved when the state moved (the step just measured had another). */
static int sync_placement(llmt_trainer *tr, int *moved)
{
    const llmt_optimizer *o = tr->parts.optimizer;
    int64_t split = o->split;
    LLMT_TRY(place(tr, tr->ctl.notch));
    *moved = o->split != split;
    return LLMT_OK;
}

int llmt_trainer_adapt(llmt_trainer *tr, uint64_t peak, uint64_t cap)
{
    llmt_controller *c = &tr->ctl;
    int moved = 0;
    int rc = sync_placement(tr, &moved);
    if (rc == LLMT_ENOMEM) { /* the step is applied: it stays placed as it is */
        llmt_trainer_log(tr, "escalate", "step %lld: the optimizer stays placed as it is (%s)",
                         (long long)tr->step, llmt_error_last());
        return LLMT_OK;
    }
    LLMT_TRY(rc);
    if (moved) /* the peak was measured with another placement: decide next step */
        return LLMT_OK;
    uint64_t current = 0;
    LLMT_TRY(llmt_controller_bytes(c, c->notch, &current));
    uint64_t other = peak > current ? peak - current : 0; /* everything the notch leaves */
    double ratio = (double)peak / (double)cap;
    char from[320], to[320];
    tr->since_change++;
    if (ratio > tr->cfg.memory_threshold && c->notch < c->max) {
        uint64_t limit = (uint64_t)(tr->cfg.memory_threshold * (double)cap);
        int64_t k = -1;
        LLMT_TRY(llmt_controller_find(c, other, limit, &k));
        int64_t target = k >= 0 ? k : c->max;
        uint64_t next = 0;
        LLMT_TRY(llmt_controller_bytes(c, target, &next));
        llmt_controller_describe(c, c->notch, from, sizeof from);
        llmt_controller_describe(c, target, to, sizeof to);
        llmt_trainer_log(tr, "escalate", "step %lld: peak %.1f MiB is %.3f of capacity %.1f MiB, "
                         "over the threshold %.2f: escalating from [%s] to [%s], predicted peak "
                         "%.1f MiB (%.3f)%s", (long long)tr->step, mib(peak), ratio, mib(cap),
                         tr->cfg.memory_threshold, from, to, mib(other + next),
                         (double)(other + next) / (double)cap,
                         k >= 0 ? "" : "; the heaviest setting, still over the threshold");
        return move_to(tr, target);
    }
    int64_t lighter_notch = llmt_controller_lighter(c, c->notch);
    if (lighter_notch < c->notch && tr->since_change >= tr->cfg.relax_window) {
        uint64_t lighter = 0;
        LLMT_TRY(llmt_controller_bytes(c, lighter_notch, &lighter));
        double predicted = (double)(other + lighter) / (double)cap;
        if (predicted < tr->cfg.memory_threshold - tr->cfg.hysteresis) {
            llmt_controller_describe(c, c->notch, from, sizeof from);
            llmt_controller_describe(c, lighter_notch, to, sizeof to);
            llmt_trainer_log(tr, "relax", "step %lld: %lld steps at most %.3f of capacity: "
                             "relaxing from [%s] to [%s], predicted peak %.1f MiB (%.3f, under "
                             "%.2f)", (long long)tr->step, (long long)tr->since_change, ratio,
                             from, to, mib(other + lighter), predicted,
                             tr->cfg.memory_threshold - tr->cfg.hysteresis);
            int rc = move_to(tr, lighter_notch);
            if (rc != LLMT_ENOMEM)
                return rc;
            /* The state could not move back (a budget refused it): the
             * notch is as it was; try again after another window. */
            llmt_trainer_log(tr, "relax", "step %lld: relaxing refused, staying at [%s]: %s",
                             (long long)tr->step, from, llmt_error_last());
            tr->since_change = 0;
        }
    }
    return LLMT_OK;
}

int llmt_trainer_escalate_to_fit(llmt_trainer *tr, const char *why)
{
    llmt_controller *c = &tr->ctl;
    char to_placed[320];
    int moved = 0;
    LLMT_TRY(sync_placement(tr, &moved));
    if (moved) { /* the notch (a resumed one) had not placed the optimizer yet */
        llmt_controller_describe(c, c->notch, to_placed, sizeof to_placed);
        llmt_trainer_log(tr, "escalate", "step %lld: out of memory (%s): retrying the same batch "
                         "with the optimizer placed as [%s] says", (long long)tr->step + 1, why,
                         to_placed);
        return LLMT_OK;
    }
    llmt_memory_stats ms = LLMT_MEMORY_STATS_INIT;
    LLMT_TRY(llmt_context_memory_stats(tr->ctx, &ms));
    uint64_t budget = ms.budget ? ms.budget : ms.device_total;
    uint64_t in_use = ms.total_current; /* the arena is released */
    uint64_t room = budget > in_use ? budget - in_use : 0;
    llmt_comm *comm = tr->parts.optimizer->comm;
    if (comm) { /* every rank takes the smallest room, so all choose alike */
        int64_t least_room = -(int64_t)room;
        LLMT_TRY(llmt_comm_allreduce_i64(comm, "memory room", &least_room, 1, LLMT_COMM_MAX));
        room = (uint64_t)-least_room;
    }
    /* A notch's bytes include the optimizer state it leaves on the device,
     * which in_use holds for the current placement: that is room too. */
    uint64_t placed = llmt_controller_placed_bytes(c);
    int64_t k = -1;
    LLMT_TRY(llmt_controller_find(c, 0, room + placed, &k));
    char from[320], to[320];
    llmt_controller_describe(c, c->notch, from, sizeof from);
    if (k < 0) {
        uint64_t least = 0;
        LLMT_TRY(llmt_controller_bytes(c, c->max, &least));
        return llmt_fail(LLMT_ENOMEM, "step %lld does not fit: micro-batch 1 with full recompute%s "
                         "needs %llu bytes of activations and workspace (the planner's figure), "
                         "%llu are free (budget %llu, %llu in use%s); the failed allocation: %s",
                         (long long)tr->step + 1,
                         c->opt ? " and all of the optimizer's state offloaded" : "",
                         (unsigned long long)least, (unsigned long long)(room + placed),
                         (unsigned long long)budget, (unsigned long long)in_use,
                         c->opt ? ", the optimizer's device state counted as free" : "", why);
    }
    uint64_t need = 0;
    LLMT_TRY(llmt_controller_bytes(c, k, &need));
    llmt_controller_describe(c, k, to, sizeof to);
    llmt_trainer_log(tr, "escalate", "step %lld: out of memory (%s): retrying the same batch with "
                     "[%s] instead of [%s], which needs %.1f MiB of the %.1f MiB free",
                     (long long)tr->step + 1, why, to, from, mib(need), mib(room + placed));
    return move_to(tr, k);
}
