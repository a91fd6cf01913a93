/* The trainer and its adaptive memory controller: a budget the configured
 * micro-batch does not fit (every step completes, the data consumed is
 * identical to an unconstrained run, the loss within floating-point
 * tolerance), a budget nothing fits (fails fast with the planner's figure),
 * a budget that fits but crosses the threshold (escalates before any
 * allocation fails, relaxes when memory frees up), ordered accumulation's
 * sum in the predictions, metrics, resume. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "test_util.h"

#include "llmt/llmt.h"
#include "test_context.h"
#include "test_tensors.h"
#include "util/fsutil.h"

enum { B = 8, T = 32, VOCAB = 40, LAYERS = 3, STEPS = 10 };

static char root[64], shards[128];

static int setup(void **state)
{
    (void)state;
    snprintf(root, sizeof root, "/tmp/llmt-trainer-XXXXXX");
    if (!mkdtemp(root))
        return -1;
    int32_t tokens[40 * T + 1];
    uint32_t x = 99;
    for (size_t i = 0; i < sizeof tokens / sizeof tokens[0]; i++) {
        x = x * 1664525u + 1013904223u;
        tokens[i] = (int32_t)((i % 5 == 0 ? (x >> 10) : i * 7) % VOCAB);
    }
    snprintf(shards, sizeof shards, "%s/train_000000.bin", root);
    return llmt_shard_write(shards, tokens, sizeof tokens / sizeof tokens[0], LLMT_SHARD_VERSION_U16);
}

static int teardown(void **state)
{
    (void)state;
    return llmt_remove_tree(root);
}

/* A trainer and its parts, adaptive, micro-batch B, no recompute. */
typedef struct rig {
    llmt_context *ctx;
    llmt_model *model;
    llmt_optimizer *opt;
    llmt_recompute *rc;
    llmt_slicer *slicer;
    llmt_loader *loader;
    llmt_trainer *tr;
    char log[16384];
} rig;

static void on_log(void *user, const char *line)
{
    rig *r = user;
    size_t used = strlen(r->log);
    snprintf(r->log + used, sizeof r->log - used, "%s\n", line);
}

/* The memory threshold of the next rigs' trainers (0: the default). */
static double rig_threshold;

static void rig_open(rig *r, int relax_window, const char *metrics)
{
    memset(r, 0, sizeof *r);
    r->ctx = test_context(2, 5);
    llmt_model_config mc = LLMT_MODEL_CONFIG_INIT;
    mc.vocab_size = VOCAB;
    mc.hidden_size = 32;
    mc.num_layers = LAYERS;
    mc.num_heads = 4;
    mc.num_kv_heads = 2;
    mc.ffn_size = 64;
    mc.max_seq_len = T;
    llmt_optimizer_config oc = LLMT_OPTIMIZER_CONFIG_INIT;
    oc.lr = 1e-2;
    llmt_loader_config lc = LLMT_LOADER_CONFIG_INIT;
    lc.batch_size = B;
    lc.seq_len = T;
    lc.vocab_size = VOCAB;
    const char *paths[1] = {shards};
    assert_int_equal(llmt_model_create(&r->model, r->ctx, &mc), LLMT_OK);
    assert_int_equal(llmt_optimizer_create(&r->opt, r->model, &oc), LLMT_OK);
    assert_int_equal(llmt_recompute_create(&r->rc, r->model), LLMT_OK);
    assert_int_equal(llmt_slicer_create(&r->slicer, r->model, B), LLMT_OK);
    assert_int_equal(llmt_loader_open(&r->loader, r->ctx, paths, 1, &lc), LLMT_OK);
    llmt_trainer_parts p = LLMT_TRAINER_PARTS_INIT;
    p.model = r->model;
    p.optimizer = r->opt;
    p.recompute = r->rc;
    p.slicer = r->slicer;
    p.loader = r->loader;
    llmt_trainer_config tc = LLMT_TRAINER_CONFIG_INIT;
    tc.batch_size = B;
    tc.seq_len = T;
    tc.total_steps = 1000;
    tc.relax_window = relax_window;
    tc.metrics_path = metrics;
    if (rig_threshold > 0)
        tc.memory_threshold = rig_threshold;
    assert_int_equal(llmt_trainer_create(&r->tr, &p, &tc), LLMT_OK);
    assert_int_equal(llmt_trainer_set_log(r->tr, on_log, r), LLMT_OK);
}

static void rig_close(rig *r)
{
    llmt_trainer_free(r->tr);
    llmt_loader_free(r->loader);
    llmt_slicer_free(r->slicer);
    llmt_recompute_free(r->rc);
    llmt_optimizer_free(r->opt);
    llmt_model_free(r->model);
    llmt_context_free(r->ctx);
}

/* Bytes allocated now, and the activation arena's size for (micro, policy). */
static uint64_t in_use(rig *r)
{
    llmt_memory_stats s = LLMT_MEMORY_STATS_INIT;
    llmt_context_memory_stats(r->ctx, &s);
    return s.total_current;
}

static uint64_t arena(rig *r, int32_t micro, int32_t policy)
{
    llmt_plan_config pc = LLMT_PLAN_CONFIG_INIT;
    llmt_model_get_config(r->model, &pc.model);
    pc.micro_batch = micro;
    pc.seq_len = T;
    pc.recompute = policy;
    pc.with_optimizer = 0;
    llmt_plan p = LLMT_PLAN_INIT;
    assert_int_equal(llmt_plan_compute(r->ctx, &pc, &p), LLMT_OK);
    /* ACTIVATIONS and the arena's share of WORKSPACE: all of it but the RoPE
     * table (cos and sin, T positions, head_dim / 2 = 4 values, fp32). */
    return p.bytes[LLMT_MEM_ACTIVATIONS] + p.bytes[LLMT_MEM_WORKSPACE] - (uint64_t)(2 * T * 4 * 4);
}

static void test_adapts_to_a_budget_the_batch_does_not_fit(void **state)
{
    (void)state;
    rig free_run, tight;
    double loss_free[STEPS], loss_tight[STEPS];
    rig_open(&free_run, 1000, NULL);
    for (int i = 0; i < STEPS; i++) {
        llmt_step_report rep = {.version = LLMT_STEP_REPORT_VERSION};
        assert_int_equal(llmt_trainer_step(free_run.tr, &rep), LLMT_OK);
        loss_free[i] = rep.loss;
        assert_int_equal(rep.retries, 0);
    }
    assert_string_equal(free_run.log, ""); /* nothing to adapt to */

    rig_open(&tight, 1000, NULL);
    /* The owner places the optimizer (nothing offloaded), so the controller
     * keeps its state on the device and the micro-batch must shrink
     * (test_adapt_offload.c has the controller offload it). */
    assert_int_equal(llmt_optimizer_set_offload(tight.opt, LLMT_OFFLOAD_OPTIMIZER, 0), LLMT_OK);
    uint64_t full = arena(&tight, B, LLMT_RECOMPUTE_NONE), quarter = arena(&tight, B / 4, LLMT_RECOMPUTE_FULL);
    assert_true(quarter < full / 2);
    /* Room for a quarter micro-batch with full recompute, not for the batch. */
    assert_int_equal(llmt_context_set_budget(tight.ctx, in_use(&tight) + quarter + quarter / 8), LLMT_OK);
    int retried = 0;
    for (int i = 0; i < STEPS; i++) {
        llmt_step_report rep = {.version = LLMT_STEP_REPORT_VERSION};
        if (llmt_trainer_step(tight.tr, &rep) != LLMT_OK)
            fail_msg("step %d: %s", i, llmt_error_last());
        loss_tight[i] = rep.loss;
        retried += rep.retries;
        assert_true(rep.micro_batch < B);
        /* The report names the layout that ran, which fits the room. */
        assert_true(rep.recompute != LLMT_RECOMPUTE_NONE && rep.recompute_layers > 0);
        if (rep.recompute_layers == LAYERS)
            assert_true(arena(&tight, rep.micro_batch, rep.recompute) <= quarter + quarter / 8);
        assert_true(fabs(loss_tight[i] - loss_free[i]) <= 1e-4 * loss_free[i]);
    }
    assert_true(retried >= 1);
    assert_int_equal(llmt_trainer_step_index(tight.tr), STEPS);
    assert_contains(tight.log, "step 1: out of memory");
    assert_contains(tight.log, "retrying the same batch with");
    print_message("%s", tight.log);
    /* The same data was consumed. */
    llmt_loader_state a = LLMT_LOADER_STATE_INIT, b = LLMT_LOADER_STATE_INIT;
    llmt_loader_get_state(free_run.loader, &a);
    llmt_loader_get_state(tight.loader, &b);
    assert_true(a.windows_consumed == b.windows_consumed && a.epoch == b.epoch &&
                a.shard_cursor == b.shard_cursor && a.window_cursor == b.window_cursor);
    /* And the weights agree to fp32 summation order. */
    size_t n = (size_t)llmt_model_num_params(free_run.model);
    float *wa = test_all_params(free_run.model), *wb = test_all_params(tight.model);
    double err = 0, mx = 0;
    for (size_t i = 0; i < n; i++) {
        err = fmax(err, fabs((double)wa[i] - wb[i]));
        mx = fmax(mx, fabs(wa[i]));
    }
    assert_true(err <= 1e-4 * mx);
    free(wa);
    free(wb);
    rig_close(&free_run);
    rig_close(&tight);
}

static void test_fails_fast_when_nothing_fits(void **state)
{
    (void)state;
    rig r;
    rig_open(&r, 1000, NULL);
    /* Placed by its owner: offloading the optimizer is not on the ladder. */
    assert_int_equal(llmt_optimizer_set_offload(r.opt, LLMT_OFFLOAD_OPTIMIZER, 0), LLMT_OK);
    uint64_t least = arena(&r, 1, LLMT_RECOMPUTE_FULL);
    assert_int_equal(llmt_context_set_budget(r.ctx, in_use(&r) + least / 2), LLMT_OK);
    llmt_step_report rep = {.version = LLMT_STEP_REPORT_VERSION};
    assert_int_equal(llmt_trainer_step(r.tr, &rep), LLMT_ENOMEM);
    char figure[64];
    snprintf(figure, sizeof figure, "needs %llu bytes", (unsigned long long)least);
    assert_contains(llmt_error_last(), "micro-batch 1 with full recompute");
    assert_contains(llmt_error_last(), figure);
    assert_int_equal(llmt_trainer_step_index(r.tr), 0); /* no step was counted */
    rig_close(&r);
}

/* One step of r, which must succeed at micro-batch micro (0: any). */
static llmt_step_report step_at(rig *r, int32_t micro)
{
    llmt_step_report rep = {.version = LLMT_STEP_REPORT_VERSION};
    if (llmt_trainer_step(r->tr, &rep) != LLMT_OK)
        fail_msg("step %lld: %s\n%s", (long long)llmt_trainer_step_index(r->tr) + 1,
                 llmt_error_last(), r->log);
    if (micro)
        assert_int_equal(rep.micro_batch, micro);
    return rep;
}

/* Ordered accumulation holds an fp32 sum of every gradient while a batch
 * has several micro-batches, and the controller counts it. With room (the
 * budget less what the trainer holds) for a quarter micro-batch with full
 * recompute and the sum, not for half of one with the sum (though for half
 * of one alone), the step that does not fit at B is retried once, at B/4:
 * the prediction is exact (it used to pick B/2, whose sum then did not
 * fit: a second retry). The run is bitwise one that slices at B/4 in order
 * from the start. */
static void test_ordered_sum_is_predicted(void **state)
{
    (void)state;
    rig free_run, tight;
    rig_open(&free_run, 1000, NULL);
    rig_threshold = 1.0; /* only a failed allocation escalates */
    rig_open(&tight, 1000, NULL);
    rig_threshold = 0;
    assert_int_equal(llmt_slicer_set_accumulation(free_run.slicer, LLMT_ACCUMULATE_ORDERED),
                     LLMT_OK);
    assert_int_equal(llmt_slicer_set_micro_batch(free_run.slicer, B / 4), LLMT_OK);
    assert_int_equal(llmt_slicer_set_accumulation(tight.slicer, LLMT_ACCUMULATE_ORDERED),
                     LLMT_OK);
    /* Placed by its owner: the controller keeps the state on the device. */
    assert_int_equal(llmt_optimizer_set_offload(tight.opt, LLMT_OFFLOAD_OPTIMIZER, 0), LLMT_OK);
    const uint64_t sum = (uint64_t)llmt_model_num_params(tight.model) * sizeof(float);
    const uint64_t half = arena(&tight, B / 2, LLMT_RECOMPUTE_FULL);
    const uint64_t quarter = arena(&tight, B / 4, LLMT_RECOMPUTE_FULL);
    const uint64_t room = quarter + sum + (half - quarter) / 2;
    /* The case: B itself does not fit at any recompute, half of a batch
     * would without its sum. */
    assert_true(arena(&tight, B, LLMT_RECOMPUTE_FULL) > room && half <= room && half + sum > room);
    const uint64_t budget = in_use(&tight) + room;
    assert_int_equal(llmt_context_set_budget(tight.ctx, budget), LLMT_OK);
    int retries = 0;
    for (int i = 0; i < 4; i++) {
        llmt_step_report b = step_at(&tight, i ? B / 4 : 0), a = step_at(&free_run, B / 4);
        assert_int_equal(b.micro_batch, B / 4);
        assert_memory_equal(&a.loss, &b.loss, sizeof a.loss);
        assert_true(b.mem_peak <= budget);
        retries += b.retries;
    }
    assert_int_equal(retries, 1);
    assert_contains(tight.log, "step 1: out of memory");
    size_t n = (size_t)llmt_model_num_params(free_run.model);
    float *wa = test_all_params(free_run.model), *wb = test_all_params(tight.model);
    assert_memory_equal(wa, wb, n * sizeof *wa);
    free(wa);
    free(wb);
    rig_close(&free_run);
    rig_close(&tight);
}

static void test_threshold_escalates_before_failure_and_relaxes(void **state)
{
    (void)state;
    char metrics[160];
    snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", root);
    rig r;
    rig_open(&r, 3, metrics);
    uint64_t full = arena(&r, B, LLMT_RECOMPUTE_NONE);
    /* Fits the batch (about 0.9 of the budget at peak): no allocation fails,
     * but the peak is over 0.85. */
    uint64_t budget = (uint64_t)((double)(in_use(&r) + full) / 0.90);
    assert_int_equal(llmt_context_set_budget(r.ctx, budget), LLMT_OK);
    for (int i = 0; i < 4; i++) {
        llmt_step_report rep = {.version = LLMT_STEP_REPORT_VERSION};
        assert_int_equal(llmt_trainer_step(r.tr, &rep), LLMT_OK);
        assert_int_equal(rep.retries, 0);
        if (i == 0)
            assert_true(rep.mem_ratio > 0.85);
        else
            assert_true(rep.mem_ratio <= 0.85);
    }
    assert_contains(r.log, "step 1: peak");
    assert_contains(r.log, "over the threshold 0.85: escalating");
    assert_null(strstr(r.log, "relaxing"));
    /* Memory frees up: after the window the controller relaxes back. */
    assert_int_equal(llmt_context_set_budget(r.ctx, budget * 4), LLMT_OK);
    int relaxed = 0;
    for (int i = 0; i < 40 && !relaxed; i++) {
        llmt_step_report rep = {.version = LLMT_STEP_REPORT_VERSION};
        assert_int_equal(llmt_trainer_step(r.tr, &rep), LLMT_OK);
        relaxed = rep.recompute_layers == 0 && rep.micro_batch == B;
    }
    assert_true(relaxed);
    assert_contains(r.log, "relaxing from");
    rig_close(&r);

    /* The metrics file has a line per step and the events. */
    FILE *f = fopen(metrics, "r");
    assert_non_null(f);
    char line[4096];
    int steps = 0, events = 0;
    while (fgets(line, sizeof line, f)) {
        steps += strncmp(line, "{\"step\":", 8) == 0;
        events += strstr(line, "\"event\":\"escalate\"") != NULL;
        if (strncmp(line, "{\"step\":1,", 10) == 0) {
            assert_contains(line, "\"loss\":");
            assert_contains(line, "\"memory\":{\"params\":");
            assert_contains(line, "\"micro_batch\":8");
        }
    }
    fclose(f);
    assert_true(steps >= 5);
    assert_true(events >= 1);
}

static void test_arguments(void **state)
{
    (void)state;
    llmt_trainer_parts p = LLMT_TRAINER_PARTS_INIT;
    llmt_trainer_config c = LLMT_TRAINER_CONFIG_INIT;
    c.batch_size = B;
    c.seq_len = T;
    llmt_trainer *tr = NULL;
    assert_int_equal(llmt_trainer_create(&tr, &p, &c), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "parts->model is NULL");
    rig r;
    rig_open(&r, 5, NULL);
    p.model = r.model;
    p.optimizer = r.opt;
    p.loader = r.loader;
    assert_int_equal(llmt_trainer_create(&tr, &p, &c), LLMT_EINVAL); /* adaptive without slicer */
    assert_contains(llmt_error_last(), "recompute");
    c.adaptive = 0;
    c.eval_every = 10;
    assert_int_equal(llmt_trainer_create(&tr, &p, &c), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "eval_loader");
    c.eval_every = 0;
    c.memory_threshold = 1.5;
    assert_int_equal(llmt_trainer_create(&tr, &p, &c), LLMT_EINVAL);
    double loss;
    assert_int_equal(llmt_trainer_evaluate(r.tr, &loss), LLMT_ESTATE);
    int64_t step;
    assert_int_equal(llmt_trainer_resume_latest(r.tr, &step), LLMT_ESTATE);
    llmt_trainer_free(NULL);
    rig_close(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_adapts_to_a_budget_the_batch_does_not_fit),
        cmocka_unit_test(test_fails_fast_when_nothing_fits),
        cmocka_unit_test(test_ordered_sum_is_predicted),
        cmocka_unit_test(test_threshold_escalates_before_failure_and_relaxes),
        cmocka_unit_test(test_arguments),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
