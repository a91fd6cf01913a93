/* The adaptive controller's decisions: escalate above the threshold, relax
 * with headroom, fit after an allocation failure. Predictions replace the
 * current arena's bytes in the measured peak by a candidate's, computed by
 * the layout function the model allocates with. */
#include <stdio.h>

#include "core/context_internal.h"
#include "core/error.h"
#include "optim/optim_internal.h"
#include "train/trainer_internal.h"

static double mib(uint64_t b)
{
    return (double)b / 1048576.0;
}

/* Moves to notch k and frees the arena laid out for the old one at once,
 * so the next step's peak measures the new layout alone. */
static int move_to(llmt_trainer *tr, int64_t k)
{
    LLMT_TRY(llmt_controller_apply(&tr->ctl, k, tr->parts.recompute, tr->parts.slicer));
    LLMT_TRY(llmt_model_release_activations(tr->parts.model));
    tr->since_change = 0;
    return LLMT_OK;
}

int llmt_trainer_adapt(llmt_trainer *tr, uint64_t peak, uint64_t cap)
{
    llmt_controller *c = &tr->ctl;
    uint64_t arena = 0;
    LLMT_TRY(llmt_controller_arena_bytes(c, c->notch, &arena));
    uint64_t other = peak > arena ? peak - arena : 0; /* everything but the arena */
    double ratio = (double)peak / (double)cap;
    char from[256], to[256];
    tr->since_change++;
    if (ratio > tr->cfg.memory_threshold && c->notch < c->max) {
        uint64_t limit = (uint64_t)(tr->cfg.memory_threshold * (double)cap);
        int64_t k = -1;
        LLMT_TRY(llmt_controller_find(c, other, limit, &k));
        int64_t target = k >= 0 ? k : c->max;
        uint64_t next = 0;
        LLMT_TRY(llmt_controller_arena_bytes(c, target, &next));
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
    if (c->notch > c->base && tr->since_change >= tr->cfg.relax_window) {
        uint64_t lighter = 0;
        LLMT_TRY(llmt_controller_arena_bytes(c, c->notch - 1, &lighter));
        double predicted = (double)(other + lighter) / (double)cap;
        if (predicted < tr->cfg.memory_threshold - tr->cfg.hysteresis) {
            llmt_controller_describe(c, c->notch, from, sizeof from);
            llmt_controller_describe(c, c->notch - 1, to, sizeof to);
            llmt_trainer_log(tr, "relax", "step %lld: %lld steps at most %.3f of capacity: "
                             "relaxing from [%s] to [%s], predicted peak %.1f MiB (%.3f, under "
                             "%.2f)", (long long)tr->step, (long long)tr->since_change, ratio,
                             from, to, mib(other + lighter), predicted,
                             tr->cfg.memory_threshold - tr->cfg.hysteresis);
            return move_to(tr, c->notch - 1);
        }
    }
    return LLMT_OK;
}

int llmt_trainer_escalate_to_fit(llmt_trainer *tr, const char *why)
{
    llmt_controller *c = &tr->ctl;
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
    int64_t k = -1;
    LLMT_TRY(llmt_controller_find(c, 0, room, &k));
    char from[256], to[256];
    llmt_controller_describe(c, c->notch, from, sizeof from);
    if (k < 0) {
        uint64_t least = 0;
        LLMT_TRY(llmt_controller_arena_bytes(c, c->max, &least));
        return llmt_fail(LLMT_ENOMEM, "step %lld does not fit: micro-batch 1 with full recompute "
                         "needs %llu bytes of activations and workspace (the planner's figure), "
                         "%llu are free (budget %llu, %llu in use); the failed allocation: %s",
                         (long long)tr->step + 1, (unsigned long long)least,
                         (unsigned long long)room, (unsigned long long)budget,
                         (unsigned long long)in_use, why);
    }
    uint64_t need = 0;
    LLMT_TRY(llmt_controller_arena_bytes(c, k, &need));
    llmt_controller_describe(c, k, to, sizeof to);
    llmt_trainer_log(tr, "escalate", "step %lld: out of memory (%s): retrying the same batch with "
                     "[%s] instead of [%s], whose arena of %.1f MiB fits the %.1f MiB free",
                     (long long)tr->step + 1, why, to, from, mib(need), mib(room));
    return move_to(tr, k);
}
