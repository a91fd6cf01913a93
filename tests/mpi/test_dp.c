/* Data-parallel training under mpiexec -n N: in deterministic mode, 20 steps
 * on N ranks give bitwise the weights, optimizer state and losses of one
 * process without a communicator whose slicer accumulates in order (the
 * reference, run on every rank), in every precision mode (fp16_mixed with
 * loss-scale overflows skipping steps), also when a rank owns no
 * parameters or runs no micro-batch, and with the optimizer's state
 * offloaded (ranges inside, straddling and past the offloaded prefix; each
 * rank's placement changed mid-run), also with the gradients (sent from
 * host memory), and adaptive under a budget that only
 * fits with part of each rank's optimizer state on the host (the
 * controller's offload rungs, the same notch on every rank at every step,
 * the device state its prediction to the byte, then relaxing back; also
 * with the gradients), and
 * adaptive with budgets that differ by rank (one rank over the threshold
 * escalates every rank to its choice; its veto keeps every rank from
 * relaxing), with a move one rank's host budget refuses (every rank stays
 * at one notch), and with one rank's host budget capping every rank's
 * offload; fast mode stays within a tolerance; a
 * checkpoint saved by N ranks resumes on N ranks and in one process to the
 * same bits; ranks that disagree (weights, micro-batch, gradient
 * placement) are refused on every rank; a step callback stopping one rank stops all. Threads: one
 * per rank. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <mpi.h>

#include "dp_run.h"
#include "llmt/comm_mpi.h"
#include "llmt/llmt.h"
#include "model/model_internal.h"
#include "optim/optim_internal.h"
#include "train/trainer_internal.h"

/* Largest |a - b| over the weights and every optimizer state tensor (0 when
 * bitwise equal: then also memcmp-equal). get_state is collective for a
 * sharded optimizer: every rank calls this in step. */
static double max_difference(const run *a, const run *b, int *bitwise)
{
    const llmt_model *ma = a->model, *mb = b->model;
    *bitwise = memcmp(ma->weights.ptr, mb->weights.ptr, ma->weights.bytes) == 0;
    double worst = 0.0;
    for (int32_t i = 0; i < ma->n_params; i++) {
        const llmt_param *p = &ma->params[i];
        float *x = malloc((size_t)p->numel * sizeof *x), *y = malloc((size_t)p->numel * sizeof *y);
        for (int kind = 0; kind < 3; kind++) {
            if (llmt_optimizer_state_dtype(a->opt, kind) < 0)
                continue;
            must(llmt_optimizer_get_state(a->opt, kind, p->name, x, (size_t)p->numel), "get_state");
            must(llmt_optimizer_get_state(b->opt, kind, p->name, y, (size_t)p->numel), "get_state");
            *bitwise &= memcmp(x, y, (size_t)p->numel * sizeof *x) == 0;
            for (int64_t j = 0; j < p->numel; j++)
                worst = fmax(worst, fabs((double)x[j] - (double)y[j]));
        }
        must(llmt_model_get_param(a->model, p->name, x, (size_t)p->numel), "get_param");
        must(llmt_model_get_param(b->model, p->name, y, (size_t)p->numel), "get_param");
        for (int64_t j = 0; j < p->numel; j++)
            worst = fmax(worst, fabs((double)x[j] - (double)y[j]));
        free(x);
        free(y);
    }
    return worst;
}

/* Checks that r's weights and optimizer state after STEPS are bitwise
 * ref's, and that its losses of steps from + 1 .. STEPS are ref's
 * (collective: max_difference). */
static void expect_like_ref(const run *r, const run *ref, const double *loss,
                            const double *ref_loss, int from, const char *what)
{
    int bitwise = 0;
    double diff = max_difference(r, ref, &bitwise);
    EXPECT(bitwise, "%s on %d ranks: state differs from one process (max %g)", what, size, diff);
    EXPECT(memcmp(loss + from, ref_loss + from, (size_t)(STEPS - from) * sizeof *loss) == 0,
           "%s: losses differ (step 20: %.17g vs %.17g)", what, loss[STEPS - 1],
           ref_loss[STEPS - 1]);
}

/* x clamped to [lo, hi]. */
static int64_t clamp(int64_t x, int64_t lo, int64_t hi)
{
    return x < lo ? lo : x > hi ? hi : x;
}

/* Where each rank's range lies against the offloaded prefix. */
enum { EMPTY, INSIDE, STRADDLING, PAST };

/* Checks that r's sharded optimizer holds `off` offloaded layers of
 * `parts` as this rank's range asks: the state of [first, split) in the
 * host buffers and that of [split, end) in the device ones, split = P
 * clamped to the range; with LLMT_OFFLOAD_GRADS the model's gradients of
 * [0, P rounded down to a 4096-element granule) in host memory, the whole
 * model's prefix on every rank, else none. Returns where this rank's range
 * lies against the prefix. */
static int expect_placement(const run *r, int32_t parts_want, int32_t off, const char *name)
{
    const llmt_optimizer *o = r->opt;
    int64_t first = 0, end = 0;
    int32_t parts = -1, got = -2;
    must(llmt_optimizer_shard(o, &first, &end), "shard");
    must(llmt_optimizer_get_offload(o, &parts, &got), "get_offload");
    const int64_t p = offload_prefix_of(r->model, off);
    const int64_t split = clamp(p, first, end);
    const size_t sb = llmt_dtype_size(o->state_dt), mb = o->has_master ? sizeof(float) : 0;
    EXPECT(parts == parts_want && got == off, "%s: placement (%d, %d), not (%d, %d)", name, parts,
           got, parts_want, off);
    const int64_t gs = parts_want & LLMT_OFFLOAD_GRADS ? p / 4096 * 4096 : 0;
    EXPECT(r->model->grad_split == gs &&
               r->model->host_grads.bytes == (size_t)gs * llmt_dtype_size(r->model->dt),
           "%s, %d layers offloaded: the gradients split at %lld (%zu host bytes), not %lld", name,
           off, (long long)r->model->grad_split, r->model->host_grads.bytes, (long long)gs);
    EXPECT(o->split == split && o->hm.bytes == (size_t)(split - first) * sb &&
               o->hv.bytes == o->hm.bytes && o->hmaster.bytes == (size_t)(split - first) * mb &&
               o->m.bytes == (size_t)(end - split) * sb &&
               o->master.bytes == (size_t)(end - split) * mb,
           "%s, %d layers offloaded: [%lld, %lld) split at %lld (host %zu, device %zu bytes), "
           "not at %lld", name, off, (long long)first, (long long)end, (long long)o->split,
           o->hm.bytes, o->m.bytes, (long long)split);
    return first == end ? EMPTY : end <= p ? INSIDE : first >= p ? PAST : STRADDLING;
}

/* Rank 0 prints each rank's range, offloaded layers (-1: all), split and
 * where the range lies (collective). */
static void print_placement(const run *r, int32_t off, int where, const char *when)
{
    static const char *const names[] = {"empty", "inside", "straddling", "past"};
    int64_t mine[5] = {r->opt->first, r->opt->end, r->opt->split, off, where};
    int64_t *all = malloc((size_t)size * sizeof mine);
    MPI_Gather(mine, 5, MPI_INT64_T, all, 5, MPI_INT64_T, 0, MPI_COMM_WORLD);
    for (int i = 0; rank == 0 && i < size; i++)
        printf("  %s: rank %d [%lld, %lld) %lld layers: split %lld, %s\n", when, i,
               (long long)all[5 * i], (long long)all[5 * i + 1], (long long)all[5 * i + 3],
               (long long)all[5 * i + 2], names[all[5 * i + 4]]);
    free(all);
}

/* The layers offloaded by every rank in an offloaded run's first half: with
 * 2 layers, at -n 2 rank 0's range lies inside the prefix and rank 1's
 * straddles its end; at -n 4 ranks 0, 1 and 2..3 are inside, straddling and
 * past (asserted in test_offloaded). */
static int32_t first_half_layers(void)
{
    int32_t off = size == 2 ? 2 : 1;
    return off < layers ? off : layers;
}

/* This rank's layers after step HALF: the first placement (0..layers, then
 * all), from a start that differs by rank, whose split of this rank's range
 * differs from that of `off`, so the state moves between its segments;
 * `off` for an empty range. */
static int32_t second_half_layers(const run *r, int32_t off)
{
    int64_t first = 0, end = 0;
    must(llmt_optimizer_shard(r->opt, &first, &end), "shard");
    const int64_t was = offload_prefix_of(r->model, off);
    const int32_t n = layers + 2;
    for (int32_t i = 0; i < n; i++) {
        int32_t l = (rank + 1 + i) % n, v = l > layers ? LLMT_OFFLOAD_ALL_LAYERS : l;
        if (clamp(offload_prefix_of(r->model, v), first, end) != clamp(was, first, end))
            return v;
    }
    return off;
}

/* The deterministic run again, its optimizer state offloaded: every rank
 * the same layers from the config, then from step HALF each its own
 * (set_offload between steps). With LLMT_OFFLOAD_GRADS in parts each
 * rank's gradients of the prefix are offloaded too and sent to their
 * owners from host memory; their placement must be the same on every rank,
 * so from step HALF every rank offloads all layers. Bitwise ref's state
 * and losses after STEPS. */
static void test_offloaded(const char *dir, int precision, const char *name, llmt_comm *comm,
                           const run *ref, const double *ref_loss, int32_t parts)
{
    run off;
    double loss[STEPS];
    const int32_t first = first_half_layers();
    char what[96];
    snprintf(what, sizeof what, "%s, %s offloaded", name,
             parts & LLMT_OFFLOAD_GRADS ? "state and gradients" : "state");
    name = what;
    offload_parts = parts;
    offload_layers = first;
    run_open(&off, dir, precision, comm, LLMT_REDUCE_DETERMINISTIC, NULL, 0, 77);
    offload_parts = LLMT_OFFLOAD_NONE;
    offload_layers = LLMT_OFFLOAD_ALL_LAYERS;
    int where = expect_placement(&off, parts, first, name), seen[4] = {0}, any[4] = {0};
    seen[where] = 1;
    MPI_Allreduce(seen, any, 4, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    /* The cases the placement was chosen for, so the test cannot degrade. */
    EXPECT(size < 2 || (any[INSIDE] && any[STRADDLING]), "%s on %d ranks: no range inside "
           "(%d) or none straddling (%d) the prefix of %d layers", name, size, any[INSIDE],
           any[STRADDLING], first);
    EXPECT(size < 4 || layers < 2 || any[PAST], "%s on %d ranks: no range past the prefix of "
           "%d layers", name, size, first);
    if (precision == LLMT_PRECISION_FP32)
        print_placement(&off, first, where, "steps 1-10");
    train(&off, HALF, loss);
    const int grads = parts & LLMT_OFFLOAD_GRADS;
    const int32_t second = grads ? LLMT_OFFLOAD_ALL_LAYERS : second_half_layers(&off, first);
    const int64_t split = off.opt->split;
    must(llmt_optimizer_set_offload(off.opt, parts, second), "set_offload");
    where = expect_placement(&off, parts, second, name);
    EXPECT(grads || where == EMPTY || off.opt->split != split, "%s: %d layers left the split at "
           "%lld", name, second, (long long)split);
    if (precision == LLMT_PRECISION_FP32)
        print_placement(&off, second, where, "steps 11-20");
    train(&off, STEPS - HALF, loss + HALF);
    expect_like_ref(&off, ref, loss, ref_loss, 0, name);
    run_close(&off);
}

/* Checks, on this rank, that the device bytes of r's optimizer state are
 * what its range and offload leave on the device, from the parameters'
 * names (offload_prefix_of: fp32 moments, 8 bytes an element), and equal the
 * controller's prediction. Returns this rank's host state bytes. */
static uint64_t expect_predicted(const run *r, int step)
{
    int64_t first = 0, end = 0;
    int32_t parts = 0, off = 0;
    must(llmt_optimizer_shard(r->opt, &first, &end), "shard");
    must(llmt_optimizer_get_offload(r->opt, &parts, &off), "get_offload");
    const int64_t split = parts ? clamp(offload_prefix_of(r->model, off), first, end) : first;
    llmt_memory_stats ms = LLMT_MEMORY_STATS_INIT;
    must(llmt_context_memory_stats(r->ctx, &ms), "memory stats");
    const uint64_t device = ms.current[LLMT_MEM_OPTIMIZER];
    EXPECT(device == (uint64_t)(end - split) * 8 && ms.current[LLMT_MEM_HOST_STATE] ==
               (uint64_t)(split - first) * 8 && device == llmt_controller_placed_bytes(&r->tr->ctl),
           "step %d: [%lld, %lld) with %d layers offloaded: %llu device and %llu host bytes of "
           "state, the controller predicts %llu, the range %lld and %lld", step, (long long)first,
           (long long)end, off, (unsigned long long)device,
           (unsigned long long)ms.current[LLMT_MEM_HOST_STATE],
           (unsigned long long)llmt_controller_placed_bytes(&r->tr->ctl),
           (long long)(end - split) * 8, (long long)(split - first) * 8);
    return ms.current[LLMT_MEM_HOST_STATE];
}

/* An adaptive run's budget: room for half the arena of full recompute
 * beside what this rank holds now (its optimizer's state on the device). */
static uint64_t tight_budget(const run *r)
{
    llmt_plan_config pc = LLMT_PLAN_CONFIG_INIT;
    dp_model_config(&pc.model, LLMT_PRECISION_FP32);
    pc.micro_batch = MICRO;
    pc.seq_len = T;
    pc.recompute = LLMT_RECOMPUTE_FULL;
    llmt_plan plan = LLMT_PLAN_INIT;
    must(llmt_plan_compute(r->ctx, &pc, &plan), "plan");
    llmt_memory_stats ms = LLMT_MEMORY_STATS_INIT;
    must(llmt_context_memory_stats(r->ctx, &ms), "memory stats");
    const uint64_t arena = plan.bytes[LLMT_MEM_ACTIVATIONS] + plan.bytes[LLMT_MEM_WORKSPACE];
    return ms.total_current + arena / 2;
}

/* adaptive_step_agreed, and this rank's optimizer's device bytes are
 * predicted. Returns whether the state is all on the device. */
static int adaptive_step(run *r, int i, uint64_t budget, double *loss)
{
    adaptive_step_agreed(r, i, budget, loss);
    expect_predicted(r, i + 1);
    int32_t parts = 0, off = 0;
    must(llmt_optimizer_get_offload(r->opt, &parts, &off), "get_offload");
    return parts == LLMT_OFFLOAD_NONE;
}

/* Adaptive and deterministic (fp32) under tight_budget: no recompute notch
 * fits, so step 1 runs out of memory on every rank and the controller moves
 * to an offload rung (the heaviest of the ranks' least fitting ones); some
 * rank's state moves to the host, the micro-batch stays. Saved at step
 * TIGHT; then the budget grows eightfold and the controller relaxes one
 * notch a step, the state returning to the device. A fresh run (another
 * seed) resumed from step TIGHT under its tight budget places each rank's
 * optimizer as the saved notch says at its first step. At every step every
 * rank has the same notch and offload, and after STEPS the weights, the
 * optimizer state and the losses of both runs are bitwise ref's. */
static void test_adaptive_offload(const char *dir, llmt_comm *comm, const run *ref,
                                  const double *ref_loss)
{
    enum { TIGHT = 4 };
    const double t0 = MPI_Wtime();
    static char log[8192];
    char ckpt[600];
    snprintf(ckpt, sizeof ckpt, "%s/ckpt-adaptive", dir);
    log[0] = '\0';
    run ad;
    double loss[STEPS];
    adaptive = 1;
    run_open(&ad, dir, LLMT_PRECISION_FP32, comm, LLMT_REDUCE_DETERMINISTIC, ckpt, 0, 77);
    must(llmt_trainer_set_log(ad.tr, append_log, log), "log");
    const uint64_t budget = tight_budget(&ad);
    must(llmt_context_set_budget(ad.ctx, budget), "budget");
    int64_t host_max = 0;
    int relaxed = 0;
    for (int i = 0; i < STEPS; i++) {
        if (i == TIGHT) {
            int64_t host = (int64_t)expect_predicted(&ad, i);
            MPI_Allreduce(&host, &host_max, 1, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
            const llmt_optimizer *o = ad.opt;
            print_placement(&ad, o->offload_layers, o->first == o->end ? EMPTY
                                                    : o->split == o->end ? INSIDE
                                                    : o->split == o->first ? PAST : STRADDLING,
                            "adaptive, step 5");
            must(llmt_trainer_save(ad.tr, LLMT_CKPT_DURABLE), "save");
            must(llmt_context_set_budget(ad.ctx, budget * 8), "budget");
        }
        relaxed = adaptive_step(&ad, i, i < TIGHT ? budget : 0, loss);
    }
    /* The cases the budget was chosen for, so the test cannot degrade. */
    EXPECT(host_max > 0 && strstr(log, "step 1: out of memory") &&
               strstr(log, "optimizer state offloaded: embedding and layers"),
           "no rank's state went to the host under the budget (most host bytes %lld); log:\n%s",
           (long long)host_max, log);
    EXPECT(relaxed && strstr(log, "relaxing from"), "the state did not return to the device "
           "after the budget grew; log:\n%s", log);
    expect_like_ref(&ad, ref, loss, ref_loss, 0, "adaptive with offload");
    run_close(&ad);

    log[0] = '\0';
    run_open(&ad, dir, LLMT_PRECISION_FP32, comm, LLMT_REDUCE_DETERMINISTIC, ckpt, 0, 5);
    adaptive = 0;
    must(llmt_trainer_set_log(ad.tr, append_log, log), "log");
    int64_t step = -1;
    must(llmt_trainer_resume_latest(ad.tr, &step), "resume");
    EXPECT(step == TIGHT, "resumed from step %lld, not %d", (long long)step, TIGHT);
    const uint64_t again = tight_budget(&ad);
    must(llmt_context_set_budget(ad.ctx, again), "budget");
    for (int i = TIGHT; i < STEPS; i++)
        adaptive_step(&ad, i, again, loss);
    EXPECT(strstr(log, "with the optimizer placed as [recompute full"), "the resumed run did not "
           "place the optimizer as its notch says; log:\n%s", log);
    expect_like_ref(&ad, ref, loss, ref_loss, TIGHT, "adaptive, resumed at an offload notch");
    if (rank == 0)
        printf("adaptive with offload on %d ranks: most host bytes %lld, bitwise %s (%.2f s)\n",
               size, (long long)host_max, failures ? "NO" : "yes", MPI_Wtime() - t0);
    run_close(&ad);
}

/* Adaptive and deterministic (fp32) with an optimizer whose owner allows
 * gradient offload (OPTIMIZER | GRADS, no layer offloaded: the rungs move
 * each rank's state and its whole gradient's prefix): under tight_budget
 * step 1 runs out of memory on every rank and every rank takes the same
 * offload rung, with gradients in host memory on every rank; the device
 * bytes the controller says it placed are the context's state and
 * gradients less the owner's sum. After the budget grows eightfold the
 * controller relaxes back to nothing offloaded. After STEPS the weights,
 * state and losses are bitwise ref's. With `mixed` only rank 0's owner
 * allows gradient offload (the others' optimizers start without offload):
 * the rungs then move the state alone on every rank (logged), no rank's
 * gradients leave the device, and the rest holds. */
static void test_adaptive_grads(const char *dir, llmt_comm *comm, const run *ref,
                                const double *ref_loss, int mixed)
{
    enum { TIGHT = 4 };
    static char log[8192];
    log[0] = '\0';
    run ad;
    double loss[STEPS];
    const char *what = mixed ? "adaptive, gradient offload allowed on rank 0 only"
                             : "adaptive with gradient offload";
    adaptive = 1;
    offload_parts = mixed && rank > 0 ? LLMT_OFFLOAD_NONE
                                      : LLMT_OFFLOAD_OPTIMIZER | LLMT_OFFLOAD_GRADS;
    offload_layers = 0;
    run_open(&ad, dir, LLMT_PRECISION_FP32, comm, LLMT_REDUCE_DETERMINISTIC, NULL, 0, 77);
    adaptive = 0;
    offload_parts = LLMT_OFFLOAD_NONE;
    offload_layers = LLMT_OFFLOAD_ALL_LAYERS;
    must(llmt_trainer_set_log(ad.tr, append_log, log), "log");
    const uint64_t budget = tight_budget(&ad);
    must(llmt_context_set_budget(ad.ctx, budget), "budget");
    int64_t host_grads[2] = {0, 0}, range[2] = {0, 0}; /* this rank's, as {-x, x}: MAX */
    for (int i = 0; i < STEPS; i++) {
        if (i == TIGHT) {
            host_grads[1] = (int64_t)ad.model->host_grads.bytes;
            host_grads[0] = -host_grads[1];
            MPI_Allreduce(host_grads, range, 2, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
            llmt_memory_stats ms = LLMT_MEMORY_STATS_INIT;
            must(llmt_context_memory_stats(ad.ctx, &ms), "memory stats");
            const uint64_t placed =
                ms.current[LLMT_MEM_OPTIMIZER] +
                (mixed ? 0 : ms.current[LLMT_MEM_GRADS] - ad.opt->grad_sum.bytes);
            EXPECT(placed == llmt_controller_placed_bytes(&ad.tr->ctl), "step %d: %llu device "
                   "bytes of state and gradients, the controller predicts %llu", i,
                   (unsigned long long)placed,
                   (unsigned long long)llmt_controller_placed_bytes(&ad.tr->ctl));
            must(llmt_context_set_budget(ad.ctx, budget * 8), "budget");
        }
        adaptive_step_agreed(&ad, i, i < TIGHT ? budget : 0, loss);
    }
    /* The cases the budget was chosen for, so the test cannot degrade. */
    const long long fewest = -range[0], most = range[1];
    if (mixed)
        EXPECT(most == 0 && strstr(log, "step 1: out of memory") &&
                   strstr(log, "gradient offload is allowed on some ranks only") &&
                   strstr(log, "; optimizer state offloaded: "),
               "%s: a rank's gradients left the device (most host bytes %lld), or no state "
               "offload; log:\n%s", what, most, log);
    else
        EXPECT(fewest > 0 && strstr(log, "step 1: out of memory") &&
                   strstr(log, "optimizer state and gradients offloaded"),
               "%s: a rank kept its gradients on the device under the budget (fewest host bytes "
               "%lld); log:\n%s", what, fewest, log);
    EXPECT(ad.model->grad_split == 0 && strstr(log, "relaxing from"), "%s: the gradients did not "
           "return to the device after the budget grew (split %lld); log:\n%s", what,
           (long long)ad.model->grad_split, log);
    expect_like_ref(&ad, ref, loss, ref_loss, 0, what);
    if (rank == 0)
        printf("%s on %d ranks: host gradient bytes %lld to %lld a rank, bitwise %s\n", what,
               size, fewest, most, failures ? "NO" : "yes");
    run_close(&ad);
}

/* The number of ranks where cond holds (collective). */
static int ranks_where(int cond)
{
    int n = 0;
    MPI_Allreduce(&cond, &n, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    return n;
}

/* This rank's peak of the last step over its budget. */
static double own_ratio(const run *r)
{
    llmt_memory_stats ms = LLMT_MEMORY_STATS_INIT;
    must(llmt_context_memory_stats(r->ctx, &ms), "memory stats");
    return (double)ms.total_peak / (double)ms.budget;
}

/* This rank's peak of the last step with notch k's bytes in place of the
 * current notch's (the controller's predictions of both). */
static uint64_t peak_at(const run *r, int64_t k)
{
    const llmt_controller *c = &r->tr->ctl;
    llmt_memory_stats ms = LLMT_MEMORY_STATS_INIT;
    uint64_t now = 0, then = 0;
    must(llmt_context_memory_stats(r->ctx, &ms), "memory stats");
    must(llmt_controller_bytes(c, c->notch, &now), "bytes");
    must(llmt_controller_bytes(c, k, &then), "bytes");
    return ms.total_peak - now + then;
}

/* The notch this rank would escalate to on its own after the last step,
 * searched here notch by notch: the lightest above the current whose
 * predicted peak is within threshold * budget; -1 when none. */
static int64_t own_target(const run *r, double threshold)
{
    llmt_memory_stats ms = LLMT_MEMORY_STATS_INIT;
    must(llmt_context_memory_stats(r->ctx, &ms), "memory stats");
    const uint64_t limit = (uint64_t)(threshold * (double)ms.budget);
    for (int64_t k = r->tr->ctl.notch + 1; k <= r->tr->ctl.max; k++)
        if (peak_at(r, k) <= limit)
            return k;
    return -1;
}

/* Opens r as an adaptive fp32 deterministic run (seed 77) at full recompute
 * on every layer, with the memory threshold and relax window given; the
 * next runs are opened with dp_run's defaults again. */
static void open_full_recompute(run *r, const char *dir, llmt_comm *comm, double threshold,
                                int32_t window)
{
    adaptive = 1;
    adaptive_threshold = threshold;
    adaptive_relax_window = window;
    adaptive_recompute = LLMT_RECOMPUTE_FULL;
    run_open(r, dir, LLMT_PRECISION_FP32, comm, LLMT_REDUCE_DETERMINISTIC, NULL, 0, 77);
    adaptive = 0;
    adaptive_threshold = 1.0;
    adaptive_relax_window = 1;
    adaptive_recompute = LLMT_RECOMPUTE_NONE;
}

/* Adaptive and deterministic (fp32), threshold 0.9, relax window 2, every
 * layer at full recompute from the start (the notches above are the
 * offload rungs), the budgets differing by rank so that the ranks' own
 * decisions differ; the last rank is the odd one:
 * - step 1 has no budget; each rank's budget is then its step-1 peak over
 *   0.95 on the last rank (over the threshold), over 0.85 elsewhere
 *   (under it): after step 2 every rank escalates, without running out of
 *   memory, to the notch the last rank's own search finds (an offload
 *   rung), and from step 3 on its peak is under the threshold;
 * - then every budget but the last rank's grows eightfold: the others
 *   predict headroom at the lighter notch, the last rank (still at 0.95
 *   there) none, so through step VETOED, the window full since step 4, no
 *   rank relaxes;
 * - then the last rank's budget grows too: every rank relaxes one notch
 *   after step VETOED + 1.
 * At every step every rank has the same notch and offload; after STEPS the
 * weights, optimizer state and losses are bitwise ref's. */
static void test_adaptive_agreement(const char *dir, llmt_comm *comm, const run *ref,
                                    const double *ref_loss)
{
    enum { WINDOW = 2, VETOED = 5 };
    const double threshold = 0.9, t0 = MPI_Wtime();
    const int odd = rank == size - 1;
    static char log[8192];
    log[0] = '\0';
    run ad;
    double loss[STEPS];
    open_full_recompute(&ad, dir, comm, threshold, WINDOW);
    must(llmt_trainer_set_log(ad.tr, append_log, log), "log");
    const int64_t base = ad.tr->ctl.notch;
    adaptive_step(&ad, 0, 0, loss);
    llmt_memory_stats ms = LLMT_MEMORY_STATS_INIT;
    must(llmt_context_memory_stats(ad.ctx, &ms), "memory stats");
    uint64_t budget = (uint64_t)((double)ms.total_peak / (odd ? 0.95 : 0.85));
    must(llmt_context_set_budget(ad.ctx, budget), "budget");
    /* The last rank's own choice at step 2's figures, which are step 1's
     * (the same layout), to be every rank's. */
    int64_t want = odd ? own_target(&ad, threshold) : 0;
    MPI_Bcast(&want, 1, MPI_INT64_T, size - 1, MPI_COMM_WORLD);
    const uint64_t step1_peak = ms.total_peak;
    adaptive_step(&ad, 1, budget, loss);
    must(llmt_context_memory_stats(ad.ctx, &ms), "memory stats");
    const double ratio2 = own_ratio(&ad);
    /* The disagreement the budgets were chosen for, so the test cannot
     * degrade: only the last rank over the threshold at step 2. */
    EXPECT(ranks_where(ratio2 > threshold) == 1 && ranks_where(odd && ratio2 > threshold) == 1 &&
               ms.total_peak == step1_peak,
           "step 2: this rank's peak %.4f of its budget (threshold %.2f, step 1's peak %llu, "
           "step 2's %llu): not the last rank alone over it", ratio2, threshold,
           (unsigned long long)step1_peak, (unsigned long long)ms.total_peak);
    EXPECT(want > base && ad.tr->ctl.notch == want, "step 2: notch %lld, not the last rank's "
           "own choice %lld (from %lld)", (long long)ad.tr->ctl.notch, (long long)want,
           (long long)base);
    int64_t host = (int64_t)expect_predicted(&ad, 2);
    EXPECT(!odd || host > 0, "step 2: the last rank's escalation moved none of its state to "
           "the host");
    if (!odd) {
        budget *= 8;
        must(llmt_context_set_budget(ad.ctx, budget), "budget");
    }
    int i = 2;
    for (; i < VETOED; i++) {
        adaptive_step(&ad, i, budget, loss);
        const double ratio = own_ratio(&ad);
        const int headroom = peak_at(&ad, want - 1) < (threshold - ad.tr->cfg.hysteresis) *
                                                          (double)budget;
        /* The veto the budgets were chosen for: the last rank alone sees
         * no headroom at the lighter notch. */
        EXPECT(!odd || ratio <= threshold, "step %d: the last rank's peak is still %.4f of its "
               "budget after the escalation", i + 1, ratio);
        EXPECT(ranks_where(headroom) == size - 1 && ranks_where(odd && !headroom) == 1,
               "step %d: %s at the lighter notch on this rank", i + 1,
               headroom ? "headroom" : "no headroom");
        EXPECT(ad.tr->ctl.notch == want, "step %d: notch %lld, not %lld (the last rank vetoes "
               "relaxing)", i + 1, (long long)ad.tr->ctl.notch, (long long)want);
    }
    if (odd) {
        budget *= 8;
        must(llmt_context_set_budget(ad.ctx, budget), "budget");
    }
    adaptive_step(&ad, i++, budget, loss);
    EXPECT(ad.tr->ctl.notch == want - 1, "step %d: notch %lld, not %lld: no relax once every "
           "rank had headroom", i, (long long)ad.tr->ctl.notch, (long long)want - 1);
    for (; i < STEPS; i++)
        adaptive_step(&ad, i, budget, loss);
    EXPECT(!strstr(log, "out of memory"), "an allocation failed; log:\n%s", log);
    expect_like_ref(&ad, ref, loss, ref_loss, 0, "adaptive, ranks disagreeing");
    if (rank == 0)
        printf("adaptive, ranks disagreeing on %d ranks: escalated from notch %lld to %lld, "
               "vetoed, relaxed; bitwise %s (%.2f s)\n", size, (long long)base, (long long)want,
               failures ? "NO" : "yes", MPI_Wtime() - t0);
    run_close(&ad);
}

/* One step of r, which must succeed and be counted as step s on every
 * rank, at one notch. */
static void agreed_step(run *r, int64_t s, llmt_step_report *rep)
{
    memset(rep, 0, sizeof *rep);
    rep->version = LLMT_STEP_REPORT_VERSION;
    must(llmt_trainer_step(r->tr, rep), "adaptive step");
    EXPECT(llmt_trainer_step_index(r->tr) == s, "step %lld was not counted", (long long)s);
    EXPECT(same_on_all(r->tr->ctl.notch) && same_on_all(r->tr->since_change),
           "after step %lld: notch %lld, window %lld differ between the ranks", (long long)s,
           (long long)r->tr->ctl.notch, (long long)r->tr->since_change);
}

/* Sets r's budget to this rank's peak in the step rep reports over 0.95:
 * over the threshold 0.9, so the next decision escalates. */
static void budget_over_threshold(run *r, const llmt_step_report *rep)
{
    must(llmt_context_set_budget(r->ctx, (uint64_t)((double)rep->mem_peak / 0.95)), "budget");
}

/* This rank's host_state bytes now. */
static uint64_t host_bytes(const run *r)
{
    llmt_memory_stats ms = LLMT_MEMORY_STATS_INIT;
    must(llmt_context_memory_stats(r->ctx, &ms), "memory stats");
    return ms.current[LLMT_MEM_HOST_STATE];
}

/* A move one rank's host budget refuses: full recompute from the start,
 * relax window 3, each rank's budget its step-1 peak over 0.95, so every
 * rank escalates after step 2 to an offload rung T. The lowest rank whose
 * range straddles T's prefix (some of its state on the host, some on the
 * device, and more on the host at rung T + 1) gets a host budget of what
 * rung T + 1 holds of its range: the ladder takes that rung (under every
 * rank's cap), but the move from T holds both host segments, which the
 * host budget refuses. With the budgets at step 3's peaks over 0.95, the
 * escalation after step 4 is refused on that rank: the step stands on
 * every rank (counted, the refusal logged), every rank is left at T with
 * the same window and its state as it was (the ranks whose move worked
 * went back); steps 5 and 6 wait for the window (no attempt, though the
 * host budget is lifted after step 5), and after step 7 every rank
 * escalates alike. */
static void test_adaptive_refused_move(const char *dir, llmt_comm *comm)
{
    run ad;
    open_full_recompute(&ad, dir, comm, 0.9, 3);
    char log[8192] = "";
    must(llmt_trainer_set_log(ad.tr, append_log, log), "log");
    llmt_step_report rep;
    agreed_step(&ad, 1, &rep);
    budget_over_threshold(&ad, &rep);
    agreed_step(&ad, 2, &rep);
    const int64_t at = ad.tr->ctl.notch;
    int32_t parts = 0, t = 0;
    must(llmt_optimizer_get_offload(ad.opt, &parts, &t), "offload");
    const int32_t next = t == ad.model->dims.layers ? LLMT_OFFLOAD_ALL_LAYERS : t + 1;
    int64_t first = 0, end = 0;
    must(llmt_optimizer_shard(ad.opt, &first, &end), "shard");
    const int64_t split = clamp(offload_prefix_of(ad.model, t), first, end);
    const int64_t split_next = clamp(offload_prefix_of(ad.model, next), first, end);
    int straddles = parts == LLMT_OFFLOAD_OPTIMIZER && t > 0 && first < split &&
                    split < split_next;
    int odd = straddles ? rank : size;
    MPI_Allreduce(MPI_IN_PLACE, &odd, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    EXPECT(odd < size, "after step 2 no rank's range straddles the offload of %d layers", t);
    const uint64_t host_at = host_bytes(&ad); /* fp32: two moments, 8 bytes an element */
    EXPECT(host_at == (uint64_t)(split - first) * 8, "host bytes %llu at %d layers",
           (unsigned long long)host_at, t);
    if (rank == odd)
        must(llmt_context_set_host_budget(ad.ctx, (uint64_t)(split_next - first) * 8),
             "host budget");
    agreed_step(&ad, 3, &rep);
    budget_over_threshold(&ad, &rep);
    for (int64_t s = 4; s <= 6; s++) {
        agreed_step(&ad, s, &rep); /* succeeds: the refused move is not its failure */
        EXPECT(ad.tr->ctl.notch == at, "after step %lld: notch %lld, not %lld", (long long)s,
               (long long)ad.tr->ctl.notch, (long long)at);
        int32_t p = -1, l = -1;
        must(llmt_optimizer_get_offload(ad.opt, &p, &l), "offload");
        EXPECT(p == parts && l == t && host_bytes(&ad) == host_at,
               "after step %lld: offload (%d, %d), %llu host bytes: not as before the refusal",
               (long long)s, p, l, (unsigned long long)host_bytes(&ad));
        if (s == 5 && rank == odd) /* lifted: the window, not the budget, decides */
            must(llmt_context_set_host_budget(ad.ctx, 0), "host budget");
    }
    EXPECT(strstr(log, "step 4: escalating refused, staying at [") != NULL,
           "the refusal after step 4 was not logged:\n%s", log);
    EXPECT(strstr(log, "step 5: ") == NULL && strstr(log, "step 6: a rank's peak") == NULL,
           "an escalation was tried within the window:\n%s", log);
    agreed_step(&ad, 7, &rep);
    EXPECT(ad.tr->ctl.notch > at, "the ranks did not escalate after the window (notch %lld)",
           (long long)ad.tr->ctl.notch);
    if (rank == 0)
        printf("adaptive, a move refused on rank %d of %d: every rank stayed at notch %lld, "
               "waited for the window, then escalated to %lld: %s\n", odd, size, (long long)at,
               (long long)ad.tr->ctl.notch, failures ? "NO" : "yes");
    run_close(&ad);
}

/* One rank's host budget caps every rank's ladder, above the threshold
 * and out of memory. Above the threshold: full recompute from the
 * start, each rank's budget its step-1 peak over 0.95, and rank 0's host
 * budget 1 byte (its range begins with the embedding, which every rung
 * offloads), so the least of the ranks' caps is none: after step
 * 2 every rank escalates past the offload rungs to a smaller micro-batch,
 * nothing offloaded on any rank (logged as the tightest rank's cap). With
 * that host budget lifted after step 3, the cap is all again on every
 * rank, and at step 4's decision the notch (whose smaller micro-batch
 * keeps the cap's placement) moves every rank's state to the host. */
static void test_adaptive_host_cap(const char *dir, llmt_comm *comm)
{
    run ad;
    open_full_recompute(&ad, dir, comm, 0.9, 1000);
    char log[8192] = "";
    must(llmt_trainer_set_log(ad.tr, append_log, log), "log");
    const int64_t base = ad.tr->ctl.notch;
    llmt_step_report rep;
    agreed_step(&ad, 1, &rep);
    budget_over_threshold(&ad, &rep);
    if (rank == 0)
        must(llmt_context_set_host_budget(ad.ctx, 1), "host budget");
    agreed_step(&ad, 2, &rep);
    const int32_t micro = rep.micro_batch;
    agreed_step(&ad, 3, &rep);
    int32_t parts = -1, layers = -1;
    must(llmt_optimizer_get_offload(ad.opt, &parts, &layers), "offload");
    EXPECT(ad.tr->ctl.notch > base && rep.micro_batch < micro && parts == LLMT_OFFLOAD_NONE &&
               host_bytes(&ad) == 0,
           "step 3: notch %lld, micro-batch %d (step 2: %d), offload %d, %llu host bytes: not a "
           "smaller micro-batch with nothing offloaded", (long long)ad.tr->ctl.notch,
           rep.micro_batch, micro, parts, (unsigned long long)host_bytes(&ad));
    EXPECT(strstr(log, "step 2: the host budget (the tightest rank's) holds none of the "
                       "optimizer state") != NULL, "the cap was not logged:\n%s", log);
    const int32_t micro_then = rep.micro_batch;
    if (rank == 0)
        must(llmt_context_set_host_budget(ad.ctx, 0), "host budget");
    agreed_step(&ad, 4, &rep);
    must(llmt_optimizer_get_offload(ad.opt, &parts, &layers), "offload");
    EXPECT(layers == LLMT_OFFLOAD_ALL_LAYERS && same_on_all(layers) &&
               strstr(log, "step 4: the host holds all of the optimizer state") != NULL,
           "step 4: offload of %d layers after the cap rose; log:\n%s", layers, log);
    run_close(&ad);

    /* The out-of-memory path: after step 1 (no budgets, the cap all),
     * rank 0's host budget of 1 byte, and a budget with room beside what
     * each rank holds for micro-batch 1's arena but not MICRO's (both the
     * controller's figures). Step 2 runs out of memory on every rank; the
     * cap, agreed again on that path, is none, so every rank retries it at
     * micro-batch 1 with nothing offloaded (an offload rung would fail on
     * rank 0). */
    open_full_recompute(&ad, dir, comm, 1.0, 1000);
    log[0] = '\0';
    must(llmt_trainer_set_log(ad.tr, append_log, log), "log");
    agreed_step(&ad, 1, &rep);
    const llmt_controller *ctl = &ad.tr->ctl;
    uint64_t at_max = 0, at_base = 0;
    must(llmt_controller_bytes(ctl, ctl->max, &at_max), "bytes"); /* everything offloaded */
    must(llmt_controller_bytes(ctl, ctl->notch, &at_base), "bytes");
    const uint64_t arena_1 = at_max, arena_micro = at_base - llmt_controller_placed_bytes(ctl);
    EXPECT(arena_1 < arena_micro, "arena at micro-batch 1 %llu, at %d %llu",
           (unsigned long long)arena_1, MICRO, (unsigned long long)arena_micro);
    must(llmt_model_release_activations(ad.model), "release");
    llmt_memory_stats ms = LLMT_MEMORY_STATS_INIT;
    must(llmt_context_memory_stats(ad.ctx, &ms), "memory stats");
    must(llmt_context_set_budget(ad.ctx, ms.total_current + (arena_1 + arena_micro) / 2),
         "budget");
    if (rank == 0)
        must(llmt_context_set_host_budget(ad.ctx, 1), "host budget");
    agreed_step(&ad, 2, &rep);
    must(llmt_optimizer_get_offload(ad.opt, &parts, &layers), "offload");
    EXPECT(rep.retries == 1 && rep.micro_batch == 1 && parts == LLMT_OFFLOAD_NONE &&
               host_bytes(&ad) == 0 &&
               strstr(log, "step 2: the host budget (the tightest rank's) holds none") != NULL,
           "out of memory under the cap: %d retries, micro-batch %d, offload %d, %llu host bytes; "
           "log:\n%s", rep.retries, rep.micro_batch, parts, (unsigned long long)host_bytes(&ad),
           log);
    if (rank == 0)
        printf("adaptive, rank 0's host budget of 1 byte on %d ranks: every rank at "
               "micro-batch %d with nothing offloaded, then all of it once lifted; out of "
               "memory, retried at micro-batch %d: %s\n", size, micro_then, rep.micro_batch,
               failures ? "NO" : "yes");
    run_close(&ad);
}

static void test_precision(const char *dir, int precision, const char *name, llmt_comm *comm,
                           int size, int with_fast)
{
    double ref_loss[STEPS], dp_loss[STEPS], fast_loss[STEPS];
    run ref, dp, fast;
    run_open(&ref, dir, precision, NULL, 0, NULL, 0, 77);
    train(&ref, STEPS, ref_loss);

    run_open(&dp, dir, precision, comm, LLMT_REDUCE_DETERMINISTIC, NULL, 0, 77);
    int64_t first = 0, end = 0;
    must(llmt_optimizer_shard(dp.opt, &first, &end), "shard");
    EXPECT(end - first < dp.model->num_params || size == 1,
           "%s: rank owns [%lld, %lld) of %lld", name, (long long)first, (long long)end,
           (long long)dp.model->num_params);
    train(&dp, STEPS, dp_loss);
    char what[64];
    snprintf(what, sizeof what, "%s deterministic", name);
    expect_like_ref(&dp, &ref, dp_loss, ref_loss, 0, what);
    EXPECT(ref_loss[STEPS - 1] < ref_loss[0] - 0.2 || layers < 2 || micro == B,
           "%s: the reference did not learn (%g -> %g)", name, ref_loss[0], ref_loss[STEPS - 1]);
    run_close(&dp);
    /* Not at -n 1 (tests/unit/test_offload.c's test_sharded_bitwise runs a
     * world of one), nor with one micro-batch for all ranks (the optimizer
     * sees what the run before gave it): the suite's time. */
    if (size > 1 && micro < B) {
        test_offloaded(dir, precision, name, comm, &ref, ref_loss, LLMT_OFFLOAD_OPTIMIZER);
        test_offloaded(dir, precision, name, comm, &ref, ref_loss,
                       LLMT_OFFLOAD_OPTIMIZER | LLMT_OFFLOAD_GRADS);
    }
    if (precision == LLMT_PRECISION_FP32 && layers == 2 && micro < B) {
        test_adaptive_offload(dir, comm, &ref, ref_loss);
        test_adaptive_grads(dir, comm, &ref, ref_loss, 0);
        if (size > 1)
            test_adaptive_grads(dir, comm, &ref, ref_loss, 1);
    }
    if (precision == LLMT_PRECISION_FP32 && layers == 2 && micro < B && size > 1)
        test_adaptive_agreement(dir, comm, &ref, ref_loss);
    if (precision == LLMT_PRECISION_FP32 && layers == 2 && micro < B && size > 1) {
        test_adaptive_refused_move(dir, comm);
        test_adaptive_host_cap(dir, comm);
    }
    if (!with_fast) {
        if (rank == 0)
            printf("%s on %d ranks (%d layers, micro-batch %d): deterministic bitwise %s\n", name,
                   size, layers, micro, failures ? "NO" : "yes");
        run_close(&ref);
        return;
    }

    /* Fast: one exchange of each rank's in-place sum; rounding differs. */
    run_open(&fast, dir, precision, comm, LLMT_REDUCE_FAST, NULL, 0, 77);
    train(&fast, STEPS, fast_loss);
    int bitwise = 0;
    double diff = max_difference(&fast, &ref, &bitwise);
    double tol = precision == LLMT_PRECISION_FP32 ? 2e-4 : 2e-2;
    EXPECT(diff <= tol, "%s fast on %d ranks: max difference %g over %g", name, size, diff, tol);
    EXPECT(fabs(fast_loss[STEPS - 1] - ref_loss[STEPS - 1]) < 1e-2, "%s fast: loss %g vs %g", name,
           fast_loss[STEPS - 1], ref_loss[STEPS - 1]);
    /* Fast with the state and gradients of every layer offloaded (each
     * rank's micro-batches summed through host memory): the fast run's
     * bits. */
    run fast_off;
    double off_loss[STEPS];
    offload_parts = LLMT_OFFLOAD_OPTIMIZER | LLMT_OFFLOAD_GRADS;
    run_open(&fast_off, dir, precision, comm, LLMT_REDUCE_FAST, NULL, 0, 77);
    offload_parts = LLMT_OFFLOAD_NONE;
    EXPECT(fast_off.model->grad_split > 0, "%s fast: no gradient offloaded", name);
    train(&fast_off, STEPS, off_loss);
    double off_diff = max_difference(&fast_off, &fast, &bitwise);
    EXPECT(bitwise && memcmp(off_loss, fast_loss, sizeof off_loss) == 0, "%s fast on %d ranks, "
           "state and gradients offloaded: differs from fast without (max %g)", name, size,
           off_diff);
    run_close(&fast_off);
    if (rank == 0)
        printf("%s on %d ranks: deterministic bitwise %s; fast max difference %.3g, the same "
               "with offload\n", name, size, failures ? "NO" : "yes", diff);
    run_close(&fast);
    run_close(&ref);
}

/* Saved at step 10 by N ranks, resumed by N ranks and by one process: both
 * finish at the uninterrupted run's bits. */
static void test_resume(const char *dir, const char *ckpt, llmt_comm *comm, int size)
{
    run ref, first, again;
    run_open(&ref, dir, LLMT_PRECISION_BF16_MIXED, NULL, 0, NULL, 0, 77);
    train(&ref, STEPS, NULL);
    run_open(&first, dir, LLMT_PRECISION_BF16_MIXED, comm, LLMT_REDUCE_DETERMINISTIC, ckpt, HALF,
             77);
    if (first.store) { /* a sharded optimizer goes through the trainer, never the store alone */
        llmt_train_state st = LLMT_TRAIN_STATE_INIT;
        st.model = first.model;
        st.optimizer = first.opt;
        int rc = llmt_ckpt_save(first.store, &st, LLMT_CKPT_DURABLE);
        EXPECT(rc == LLMT_EUNSUPPORTED && strstr(llmt_error_last(), "sharded"),
               "llmt_ckpt_save of a sharded optimizer: status %d, \"%s\"", rc, llmt_error_last());
        rc = llmt_ckpt_load(first.store, 0, LLMT_CKPT_DURABLE, &st, NULL, 0, NULL);
        EXPECT(rc == LLMT_EUNSUPPORTED && strstr(llmt_error_last(), "sharded"),
               "llmt_ckpt_load into a sharded optimizer: status %d, \"%s\"", rc, llmt_error_last());
    }
    train(&first, HALF, NULL);
    /* Short of total_steps: step 10's async save commits here, not in free. */
    must(llmt_trainer_save(first.tr, LLMT_CKPT_DURABLE), "the wait for step 10");
    run_close(&first);
    int64_t step = -1;
    int bitwise = 0;
    double diff = 0.0;
    if (rank == 0) { /* the same checkpoint in one process: world size N -> 1 */
        run solo;
        run_open(&solo, dir, LLMT_PRECISION_BF16_MIXED, NULL, 0, ckpt, 0, 5);
        must(llmt_trainer_resume_latest(solo.tr, &step), "resume alone");
        train(&solo, STEPS - HALF, NULL);
        diff = max_difference(&solo, &ref, &bitwise);
        EXPECT(bitwise, "resumed in one process: differs (max %g)", diff);
        run_close(&solo);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    /* Another seed: every weight must come from the checkpoint. */
    run_open(&again, dir, LLMT_PRECISION_BF16_MIXED, comm, LLMT_REDUCE_DETERMINISTIC, ckpt, 0, 5);
    must(llmt_trainer_resume_latest(again.tr, &step), "resume");
    EXPECT(step == HALF, "resumed from step %lld, not %d", (long long)step, HALF);
    train(&again, STEPS - HALF, NULL);
    diff = max_difference(&again, &ref, &bitwise);
    EXPECT(bitwise, "resumed on %d ranks: differs from the uninterrupted run (max %g)", size, diff);
    run_close(&again);
    run_close(&ref);
}

/* Ranks with other weights (another seed on the last rank) are refused on
 * every rank, naming the difference and a rank. */
static void test_disagreement(llmt_comm *comm, int size)
{
    llmt_context_config cc = LLMT_CONTEXT_CONFIG_INIT;
    cc.num_threads = 1;
    cc.seed = rank == size - 1 ? 8 : 7;
    llmt_context *ctx = NULL;
    llmt_model *model = NULL;
    must(llmt_context_create(&ctx, &cc), "context");
    llmt_model_config mc = LLMT_MODEL_CONFIG_INIT;
    mc.vocab_size = VOCAB;
    mc.hidden_size = 32;
    mc.num_layers = 1;
    mc.num_heads = 4;
    mc.num_kv_heads = 2;
    mc.ffn_size = 64;
    mc.max_seq_len = T;
    must(llmt_model_create(&model, ctx, &mc), "model");
    llmt_optimizer_config oc = LLMT_OPTIMIZER_CONFIG_INIT;
    llmt_optimizer *opt = NULL;
    int rc = llmt_optimizer_create_sharded(&opt, model, &oc, comm, LLMT_REDUCE_DETERMINISTIC);
    char expect[64];
    snprintf(expect, sizeof expect, "rank %d", size - 1);
    EXPECT(rc == LLMT_ECOMM && opt == NULL && strstr(llmt_error_last(), "weights") &&
               strstr(llmt_error_last(), expect),
           "mismatched weights: status %d, message \"%s\"", rc, llmt_error_last());
    llmt_optimizer_free(opt);
    llmt_model_free(model);
    llmt_context_free(ctx);
}

/* A rank configured with another micro-batch is refused when the trainer
 * is created, on every rank. */
static void test_micro_mismatch(const char *dir, llmt_comm *comm, int size)
{
    run r;
    memset(&r, 0, sizeof r);
    llmt_context_config cc = LLMT_CONTEXT_CONFIG_INIT;
    cc.num_threads = 1;
    cc.seed = 77;
    must(llmt_context_create(&r.ctx, &cc), "context");
    llmt_model_config mc = LLMT_MODEL_CONFIG_INIT;
    mc.vocab_size = VOCAB;
    mc.hidden_size = 32;
    mc.num_layers = 1;
    mc.num_heads = 4;
    mc.num_kv_heads = 2;
    mc.ffn_size = 64;
    mc.max_seq_len = T;
    must(llmt_model_create(&r.model, r.ctx, &mc), "model");
    llmt_optimizer_config oc = LLMT_OPTIMIZER_CONFIG_INIT;
    must(llmt_optimizer_create_sharded(&r.opt, r.model, &oc, comm, LLMT_REDUCE_DETERMINISTIC),
         "sharded optimizer");
    must(llmt_slicer_create(&r.slicer, r.model, rank == size - 1 ? 3 : 2), "slicer");
    char pattern[600];
    snprintf(pattern, sizeof pattern, "%s/train_*.bin", dir);
    llmt_loader_config dc = LLMT_LOADER_CONFIG_INIT;
    dc.batch_size = B;
    dc.seq_len = T;
    dc.vocab_size = VOCAB;
    must(llmt_loader_open_glob(&r.loader, r.ctx, pattern, &dc), "loader");
    llmt_trainer_parts p = LLMT_TRAINER_PARTS_INIT;
    p.model = r.model;
    p.optimizer = r.opt;
    p.slicer = r.slicer;
    p.loader = r.loader;
    llmt_trainer_config tc = LLMT_TRAINER_CONFIG_INIT;
    tc.batch_size = B;
    tc.seq_len = T;
    tc.adaptive = 0;
    int rc = llmt_trainer_create(&r.tr, &p, &tc);
    EXPECT(rc == LLMT_ECOMM && !r.tr && strstr(llmt_error_last(), "micro-batch"),
           "micro-batch 3 on the last rank: status %d, \"%s\"", rc, llmt_error_last());
    run_close(&r);
}

/* The last rank offloads its gradients of the embedding and layer 0, the
 * others only their state: the exchange's windows would not line up, so a
 * trainer's step and a sharded llmt_optimizer_step are refused on every
 * rank, naming the gradient placement and the last rank, with the weights
 * unchanged; once every rank places them alike, both run. */
static void test_grad_placement_mismatch(const char *dir, llmt_comm *comm, int size)
{
    run r;
    run_open(&r, dir, LLMT_PRECISION_FP32, comm, LLMT_REDUCE_DETERMINISTIC, NULL, 0, 77);
    const int32_t grads = LLMT_OFFLOAD_OPTIMIZER | LLMT_OFFLOAD_GRADS;
    must(llmt_optimizer_set_offload(r.opt, rank == size - 1 ? grads : LLMT_OFFLOAD_OPTIMIZER, 1),
         "set_offload");
    char last[32];
    snprintf(last, sizeof last, "rank %d", size - 1);
    const size_t bytes = r.model->weights.bytes; /* host memory on the CPU backend */
    void *before = malloc(bytes);
    memcpy(before, r.model->weights.ptr, bytes);
    llmt_step_report rep;
    memset(&rep, 0, sizeof rep);
    rep.version = LLMT_STEP_REPORT_VERSION;
    int rc = llmt_trainer_step(r.tr, &rep);
    EXPECT(rc == LLMT_ECOMM && strstr(llmt_error_last(), "gradient placement") &&
               strstr(llmt_error_last(), last) && memcmp(before, r.model->weights.ptr, bytes) == 0,
           "gradients offloaded on the last rank only: trainer step status %d, \"%s\", the "
           "weights %s", rc, llmt_error_last(),
           memcmp(before, r.model->weights.ptr, bytes) ? "changed" : "unchanged");
    free(before);
    int32_t tokens[T] = {1, 2, 3, 4, 5, 6, 7, 8}, targets[T] = {2, 3, 4, 5, 6, 7, 8, 9};
    double loss = 0.0;
    must(llmt_model_zero_grads(r.model), "zero_grads");
    must(llmt_model_forward_backward(r.model, tokens, targets, 1, T, 1.0, T, &loss), "backward");
    rc = llmt_optimizer_step(r.opt, NULL, NULL);
    EXPECT(rc == LLMT_ECOMM && strstr(llmt_error_last(), "gradient placement") &&
               strstr(llmt_error_last(), last),
           "gradients offloaded on the last rank only: optimizer step status %d, \"%s\"", rc,
           llmt_error_last());
    must(llmt_optimizer_set_offload(r.opt, grads, 1), "set_offload");
    must(llmt_optimizer_step(r.opt, NULL, NULL), "optimizer step, placed alike");
    must(llmt_trainer_step(r.tr, &rep), "trainer step, placed alike");
    run_close(&r);
}

/* The last rank's callback asks to stop after step 2: every rank stops. */
static int stop_after_two(void *user, const llmt_step_report *report)
{
    (void)user;
    return report->step >= 2;
}

static void test_callback_stop(const char *dir, llmt_comm *comm, int size)
{
    run r;
    run_open(&r, dir, LLMT_PRECISION_FP32, comm, LLMT_REDUCE_DETERMINISTIC, NULL, 0, 77);
    if (rank == size - 1)
        must(llmt_trainer_set_callback(r.tr, stop_after_two, NULL), "callback");
    must(llmt_trainer_run(r.tr, 10), "run");
    EXPECT(llmt_trainer_step_index(r.tr) == 2, "stopped at step %lld, not 2",
           (long long)llmt_trainer_step_index(r.tr));
    run_close(&r);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    llmt_comm_mpi *m = NULL;
    must(llmt_comm_mpi_create(&m, MPI_COMM_WORLD), "comm");
    /* Rank 0's directory holds the data and the checkpoints: every rank
     * reads the same shard paths, as a real run does. */
    char dir[] = "/tmp/llmt-dp-XXXXXX";
    if (rank == 0 && !mkdtemp(dir))
        must(LLMT_EIO, "mkdtemp");
    if (rank == 0)
        write_shard(dir);
    MPI_Bcast(dir, (int)sizeof dir, MPI_CHAR, 0, MPI_COMM_WORLD);
    char ckpt[sizeof dir + 16];
    snprintf(ckpt, sizeof ckpt, "%s/ckpt", dir);

    test_precision(dir, LLMT_PRECISION_FP32, "fp32", m->comm, size, 1);
    test_precision(dir, LLMT_PRECISION_BF16_MIXED, "bf16_mixed", m->comm, size, 1);
    test_precision(dir, LLMT_PRECISION_BF16_PURE, "bf16_pure", m->comm, size, 0);
    test_precision(dir, LLMT_PRECISION_FP16_MIXED, "fp16_mixed", m->comm, size, 0);
    test_resume(dir, ckpt, m->comm, size);
    /* One layer: 3 granules, so at -n 4 a rank owns nothing (its master
     * weights are empty); then one micro-batch for all ranks. */
    layers = 1;
    test_precision(dir, LLMT_PRECISION_BF16_MIXED, "bf16_mixed", m->comm, size, 0);
    snprintf(ckpt, sizeof ckpt, "%s/ckpt1", dir);
    test_resume(dir, ckpt, m->comm, size);
    micro = B;
    test_precision(dir, LLMT_PRECISION_BF16_MIXED, "bf16_mixed", m->comm, size, 0);
    layers = 2;
    micro = MICRO;
    test_callback_stop(dir, m->comm, size);
    if (size > 1) {
        test_disagreement(m->comm, size);
        test_micro_mismatch(dir, m->comm, size);
        test_grad_placement_mismatch(dir, m->comm, size);
    }

    int all = 0;
    MPI_Allreduce(&failures, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (rank == 0 && system(cmd) != 0)
        fprintf(stderr, "rank %d: could not remove %s\n", rank, dir);
    llmt_comm_mpi_free(m);
    MPI_Finalize();
    if (rank == 0)
        printf("%s\n", all ? "FAILED" : "all passed");
    return all ? 1 : 0;
}
