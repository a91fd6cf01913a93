/* Data-parallel training under mpiexec -n N: in deterministic mode, 20 steps
 * on N ranks give bitwise the weights, optimizer state and losses of one
 * process without a communicator whose slicer accumulates in order (the
 * reference, run on every rank), in every precision mode (fp16_mixed with
 * loss-scale overflows skipping steps), also when a rank owns no
 * parameters or runs no micro-batch, and with the optimizer's state
 * offloaded (ranges inside, straddling and past the offloaded prefix; each
 * rank's placement changed mid-run); fast mode stays within a tolerance; a
 * checkpoint saved by N ranks resumes on N ranks and in one process to the
 * same bits; ranks that disagree (weights, micro-batch) are refused on
 * every rank; a step callback stopping one rank stops all. Threads: one
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

/* The end P of the prefix [0, P) whose state `off` offloaded layers put in
 * host memory, from the parameters' names (not the library's
 * llmt_offload_prefix): none for 0, else the embedding's and layers
 * 0..off-1's elements, stored first in that order; every element for
 * LLMT_OFFLOAD_ALL_LAYERS. */
static int64_t prefix_of(const llmt_model *m, int32_t off)
{
    if (off == 0)
        return 0;
    if (off == LLMT_OFFLOAD_ALL_LAYERS)
        return m->num_params;
    int64_t p = 0;
    for (int32_t i = 0; i < m->n_params; i++) {
        int layer = -1;
        const char *name = m->params[i].name;
        if (!strcmp(name, "model.embed_tokens.weight") ||
            (sscanf(name, "model.layers.%d.", &layer) == 1 && layer < off))
            p += m->params[i].numel;
    }
    return p;
}

/* x clamped to [lo, hi]. */
static int64_t clamp(int64_t x, int64_t lo, int64_t hi)
{
    return x < lo ? lo : x > hi ? hi : x;
}

/* Where each rank's range lies against the offloaded prefix. */
enum { EMPTY, INSIDE, STRADDLING, PAST };

/* Checks that r's sharded optimizer holds `off` offloaded layers as this
 * rank's range asks: the state of [first, split) in the host buffers and
 * that of [split, end) in the device ones, split = P clamped to the range.
 * Returns where this rank's range lies against the prefix. */
static int expect_placement(const run *r, int32_t off, const char *name)
{
    const llmt_optimizer *o = r->opt;
    int64_t first = 0, end = 0;
    int32_t parts = -1, got = -2;
    must(llmt_optimizer_shard(o, &first, &end), "shard");
    must(llmt_optimizer_get_offload(o, &parts, &got), "get_offload");
    const int64_t p = prefix_of(r->model, off);
    const int64_t split = clamp(p, first, end);
    const size_t sb = llmt_dtype_size(o->state_dt), mb = o->has_master ? sizeof(float) : 0;
    EXPECT(parts == LLMT_OFFLOAD_OPTIMIZER && got == off, "%s: placement (%d, %d), not "
           "(optimizer, %d)", name, parts, got, off);
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
    const int64_t was = prefix_of(r->model, off);
    const int32_t n = layers + 2;
    for (int32_t i = 0; i < n; i++) {
        int32_t l = (rank + 1 + i) % n, v = l > layers ? LLMT_OFFLOAD_ALL_LAYERS : l;
        if (clamp(prefix_of(r->model, v), first, end) != clamp(was, first, end))
            return v;
    }
    return off;
}

/* The deterministic run again, its optimizer state offloaded: every rank
 * the same layers from the config, then from step HALF each its own
 * (set_offload between steps). Bitwise ref's state and losses after STEPS. */
static void test_offloaded(const char *dir, int precision, const char *name, llmt_comm *comm,
                           const run *ref, const double *ref_loss)
{
    run off;
    double loss[STEPS];
    const int32_t first = first_half_layers();
    offload_parts = LLMT_OFFLOAD_OPTIMIZER;
    offload_layers = first;
    run_open(&off, dir, precision, comm, LLMT_REDUCE_DETERMINISTIC, NULL, 0, 77);
    offload_parts = LLMT_OFFLOAD_NONE;
    offload_layers = LLMT_OFFLOAD_ALL_LAYERS;
    int where = expect_placement(&off, first, name), seen[4] = {0}, any[4] = {0};
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
    const int32_t second = second_half_layers(&off, first);
    const int64_t split = off.opt->split;
    must(llmt_optimizer_set_offload(off.opt, LLMT_OFFLOAD_OPTIMIZER, second), "set_offload");
    where = expect_placement(&off, second, name);
    EXPECT(where == EMPTY || off.opt->split != split, "%s: %d layers left the split at %lld",
           name, second, (long long)split);
    if (precision == LLMT_PRECISION_FP32)
        print_placement(&off, second, where, "steps 11-20");
    train(&off, STEPS - HALF, loss + HALF);
    int bitwise = 0;
    double diff = max_difference(&off, ref, &bitwise);
    EXPECT(bitwise, "%s offloaded on %d ranks: state differs from one process (max %g)", name,
           size, diff);
    EXPECT(memcmp(loss, ref_loss, sizeof loss) == 0, "%s offloaded: losses differ (step 20: "
           "%.17g vs %.17g)", name, loss[STEPS - 1], ref_loss[STEPS - 1]);
    run_close(&off);
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
    int bitwise = 0;
    double diff = max_difference(&dp, &ref, &bitwise);
    EXPECT(bitwise, "%s deterministic on %d ranks: state differs from one process (max %g)", name,
           size, diff);
    EXPECT(memcmp(dp_loss, ref_loss, sizeof dp_loss) == 0, "%s: losses differ (step 20: %.17g vs "
           "%.17g)", name, dp_loss[STEPS - 1], ref_loss[STEPS - 1]);
    EXPECT(ref_loss[STEPS - 1] < ref_loss[0] - 0.2 || layers < 2 || micro == B,
           "%s: the reference did not learn (%g -> %g)", name, ref_loss[0], ref_loss[STEPS - 1]);
    run_close(&dp);
    /* Not at -n 1 (tests/unit/test_offload.c's test_sharded_bitwise runs a
     * world of one), nor with one micro-batch for all ranks (the optimizer
     * sees what the run before gave it): the suite's time. */
    if (size > 1 && micro < B)
        test_offloaded(dir, precision, name, comm, &ref, ref_loss);
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
    diff = max_difference(&fast, &ref, &bitwise);
    double tol = precision == LLMT_PRECISION_FP32 ? 2e-4 : 2e-2;
    EXPECT(diff <= tol, "%s fast on %d ranks: max difference %g over %g", name, size, diff, tol);
    EXPECT(fabs(fast_loss[STEPS - 1] - ref_loss[STEPS - 1]) < 1e-2, "%s fast: loss %g vs %g", name,
           fast_loss[STEPS - 1], ref_loss[STEPS - 1]);
    if (rank == 0)
        printf("%s on %d ranks: deterministic bitwise %s; fast max difference %.3g\n", name, size,
               failures ? "NO" : "yes", diff);
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
