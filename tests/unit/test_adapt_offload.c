/* The adaptive controller with optimizer offload on its ladder (after
 * recompute, before the micro-batch shrinks): a device budget that only
 * fits the batch with part of the optimizer's state in host memory ->
 * every step completes at the configured micro-batch, over the same data,
 * and the losses, weights and optimizer state are bitwise those of an
 * unconstrained run; when memory frees up the controller moves the state
 * back to the device, still bitwise; a run resumed at an offload notch
 * places the optimizer as the notch says and goes on bitwise. With gradient
 * offload allowed (the optimizer created with OPTIMIZER | GRADS of no
 * layer) the offload rungs move the gradients too: a budget that only the
 * gradients' offload makes fit keeps the micro-batch, every step completes
 * once and the run is bitwise the unconstrained one. A sharded optimizer
 * (a world of one over a self communicator) takes the offload rungs too,
 * its device state the controller's prediction to the byte. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

#include "llmt/llmt.h"
#include "test_context.h"
#include "test_self_comm.h"
#include "test_tensors.h"
#include "train/trainer_internal.h"
#include "util/fsutil.h"

enum { B = 4, T = 16, LONG_T = 128, VOCAB = 64, LAYERS = 2 };

static char root[64], shards[128];

/* The communicator the next rigs' optimizers are sharded over (NULL: not
 * sharded). */
static llmt_comm *shard_comm;

/* The recompute policy of every layer the next rigs start with: the
 * controller's base notch. */
static int32_t rig_recompute = LLMT_RECOMPUTE_NONE;

/* The micro-batch the next rigs' slicers start with: the base notch's. */
static int32_t rig_micro = B;

static int setup(void **state)
{
    (void)state;
    snprintf(root, sizeof root, "/tmp/llmt-adapt-offload-XXXXXX");
    if (!mkdtemp(root))
        return -1;
    int32_t tokens[64 * LONG_T + 1];
    uint32_t x = 7;
    for (size_t i = 0; i < sizeof tokens / sizeof tokens[0]; i++) {
        x = x * 1664525u + 1013904223u;
        tokens[i] = (int32_t)((x >> 9) % VOCAB);
    }
    snprintf(shards, sizeof shards, "%s/train_000000.bin", root);
    return llmt_shard_write(shards, tokens, sizeof tokens / sizeof tokens[0],
                            LLMT_SHARD_VERSION_U16);
}

static int teardown(void **state)
{
    (void)state;
    return llmt_remove_tree(root);
}

/* An adaptive trainer over a model whose AdamW state outweighs its
 * activations (the case offload is for); threshold 1.0, so only a failed
 * allocation escalates. */
typedef struct rig {
    llmt_context *ctx;
    llmt_model *model;
    llmt_optimizer *opt;
    llmt_recompute *rc;
    llmt_slicer *slicer;
    llmt_loader *loader;
    llmt_ckpt_store *store;
    llmt_trainer *tr;
    char log[32768];
} rig;

static void on_log(void *user, const char *line)
{
    rig *r = user;
    size_t used = strlen(r->log);
    snprintf(r->log + used, sizeof r->log - used, "%s\n", line);
}

/* store_dir: where the trainer saves (NULL: no store); seq the sequence
 * length; offload_parts the optimizer's at creation (of no layer). */
static void rig_open_as(rig *r, int precision, int relax_window, const char *store_dir,
                        int32_t seq, int32_t offload_parts)
{
    memset(r, 0, sizeof *r);
    r->ctx = test_context(2, 5);
    llmt_model_config mc = LLMT_MODEL_CONFIG_INIT;
    mc.vocab_size = VOCAB;
    mc.hidden_size = 64;
    mc.num_layers = LAYERS;
    mc.num_heads = 4;
    mc.num_kv_heads = 4;
    mc.ffn_size = 128;
    mc.max_seq_len = seq;
    mc.precision = precision;
    llmt_optimizer_config oc = LLMT_OPTIMIZER_CONFIG_INIT;
    oc.lr = 1e-2;
    oc.offload_parts = offload_parts;
    oc.offload_layers = 0;
    llmt_loader_config lc = LLMT_LOADER_CONFIG_INIT;
    lc.batch_size = B;
    lc.seq_len = seq;
    lc.vocab_size = VOCAB;
    const char *paths[1] = {shards};
    assert_int_equal(llmt_model_create(&r->model, r->ctx, &mc), LLMT_OK);
    if (shard_comm)
        assert_int_equal(llmt_optimizer_create_sharded(&r->opt, r->model, &oc, shard_comm,
                                                       LLMT_REDUCE_DETERMINISTIC),
                         LLMT_OK);
    else
        assert_int_equal(llmt_optimizer_create(&r->opt, r->model, &oc), LLMT_OK);
    assert_int_equal(llmt_recompute_create(&r->rc, r->model), LLMT_OK);
    assert_int_equal(llmt_recompute_set_layers(r->rc, 0, LAYERS, rig_recompute), LLMT_OK);
    assert_int_equal(llmt_slicer_create(&r->slicer, r->model, rig_micro), LLMT_OK);
    assert_int_equal(llmt_loader_open(&r->loader, r->ctx, paths, 1, &lc), LLMT_OK);
    if (store_dir) {
        llmt_ckpt_store_config sc = LLMT_CKPT_STORE_CONFIG_INIT;
        sc.sync = 0;
        assert_int_equal(llmt_ckpt_store_open(&r->store, r->ctx, store_dir, &sc), LLMT_OK);
    }
    llmt_trainer_parts p = LLMT_TRAINER_PARTS_INIT;
    p.model = r->model;
    p.optimizer = r->opt;
    p.recompute = r->rc;
    p.slicer = r->slicer;
    p.loader = r->loader;
    p.store = r->store;
    llmt_trainer_config tc = LLMT_TRAINER_CONFIG_INIT;
    tc.batch_size = B;
    tc.seq_len = seq;
    tc.total_steps = 1000;
    tc.memory_threshold = 1.0;
    tc.relax_window = relax_window;
    assert_int_equal(llmt_trainer_create(&r->tr, &p, &tc), LLMT_OK);
    assert_int_equal(llmt_trainer_set_log(r->tr, on_log, r), LLMT_OK);
}

static void rig_open(rig *r, int precision, int relax_window, const char *store_dir)
{
    rig_open_as(r, precision, relax_window, store_dir, T, LLMT_OFFLOAD_NONE);
}

static void rig_close(rig *r)
{
    llmt_trainer_free(r->tr);
    llmt_ckpt_store_free(r->store);
    llmt_loader_free(r->loader);
    llmt_slicer_free(r->slicer);
    llmt_recompute_free(r->rc);
    llmt_optimizer_free(r->opt);
    llmt_model_free(r->model);
    llmt_context_free(r->ctx);
}

static llmt_memory_stats stats(rig *r)
{
    llmt_memory_stats s = LLMT_MEMORY_STATS_INIT;
    assert_int_equal(llmt_context_memory_stats(r->ctx, &s), LLMT_OK);
    return s;
}

/* The plan of the rig's model with full recompute at micro-batch `micro`
 * of a batch of B (summed in order when `ordered`), with offload_parts of
 * `layers` offloaded. */
static llmt_plan plan_of(rig *r, int32_t micro, int ordered, int32_t offload_parts,
                         int32_t layers)
{
    llmt_plan_config pc = LLMT_PLAN_CONFIG_INIT;
    llmt_model_get_config(r->model, &pc.model);
    pc.micro_batch = micro;
    pc.batch_size = B;
    pc.ordered_accumulation = ordered;
    pc.seq_len = pc.model.max_seq_len;
    pc.recompute = LLMT_RECOMPUTE_FULL;
    pc.offload_parts = offload_parts;
    pc.offload_layers = layers;
    llmt_plan p = LLMT_PLAN_INIT;
    assert_int_equal(llmt_plan_compute(r->ctx, &pc, &p), LLMT_OK);
    return p;
}

/* The plan at micro-batch B with full recompute, with offload_parts of
 * `layers` offloaded. */
static llmt_plan plan_placed(rig *r, int32_t offload_parts, int32_t layers)
{
    return plan_of(r, B, 0, offload_parts, layers);
}

static llmt_plan plan_full(rig *r)
{
    return plan_placed(r, LLMT_OFFLOAD_NONE, 0);
}

/* One step, which must succeed, at micro-batch micro (0: any). */
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

/* One step, which must succeed, at the configured micro-batch. */
static llmt_step_report step(rig *r)
{
    return step_at(r, B);
}

/* n steps of both rigs: the same losses, the constrained one within budget;
 * returns its retries. */
static int steps_side_by_side(rig *free_run, rig *tight, int n, uint64_t budget)
{
    int retries = 0;
    for (int i = 0; i < n; i++) {
        llmt_step_report a = step(free_run), b = step(tight);
        assert_memory_equal(&a.loss, &b.loss, sizeof a.loss);
        retries += b.retries;
        assert_true(b.mem_peak <= budget);
    }
    return retries;
}


/* Weights and the AdamW state of a and b are the same bits. */
static void assert_same_state(rig *a, rig *b)
{
    size_t n = (size_t)llmt_model_num_params(a->model);
    float *wa = test_all_params(a->model), *wb = test_all_params(b->model);
    assert_memory_equal(wa, wb, n * sizeof *wa);
    free(wa);
    free(wb);
    for (int kind = 0; kind < 2; kind++) {
        float *sa = test_all_state(a->opt, a->model, kind);
        float *sb = test_all_state(b->opt, b->model, kind);
        assert_memory_equal(sa, sb, n * sizeof *sa);
        free(sa);
        free(sb);
    }
    llmt_loader_state la = LLMT_LOADER_STATE_INIT, lb = LLMT_LOADER_STATE_INIT;
    assert_int_equal(llmt_loader_get_state(a->loader, &la), LLMT_OK);
    assert_int_equal(llmt_loader_get_state(b->loader, &lb), LLMT_OK);
    assert_true(la.windows_consumed == lb.windows_consumed && la.epoch == lb.epoch &&
                la.shard_cursor == lb.shard_cursor && la.window_cursor == lb.window_cursor);
}

/* Sets tight's budget to what it holds plus half the arena of full
 * recompute (no recompute notch fits, full recompute with enough of the
 * state offloaded does, the micro-batch need not shrink) and runs steps
 * steps side by side with free_run: step 1 runs out of memory, the
 * controller offloads part of the optimizer's state (the device state the
 * plan's less the host segment, as the controller predicts) instead of
 * halving the micro-batch, and the runs stay bitwise alike. Returns the
 * budget. */
static uint64_t offload_under_budget(rig *free_run, rig *tight, int steps)
{
    llmt_plan p = plan_full(tight);
    uint64_t arena = p.bytes[LLMT_MEM_ACTIVATIONS] + p.bytes[LLMT_MEM_WORKSPACE];
    assert_true(p.bytes[LLMT_MEM_OPTIMIZER] > arena); /* offload can make the room */
    uint64_t budget = stats(tight).total_current + arena / 2;
    assert_int_equal(llmt_context_set_budget(tight->ctx, budget), LLMT_OK);
    assert_int_equal(steps_side_by_side(free_run, tight, steps, budget), 1);
    assert_contains(tight->log, "step 1: out of memory");
    assert_contains(tight->log, "optimizer state offloaded: embedding and layers 0-");
    assert_null(strstr(tight->log, "micro-batch 2"));
    int32_t parts = 0, layers = 0;
    assert_int_equal(llmt_optimizer_get_offload(tight->opt, &parts, &layers), LLMT_OK);
    assert_int_equal(parts, LLMT_OFFLOAD_OPTIMIZER);
    assert_true(layers >= 1);
    llmt_memory_stats s = stats(tight);
    assert_true(s.current[LLMT_MEM_HOST_STATE] > 0);
    assert_int_equal(s.current[LLMT_MEM_OPTIMIZER],
                     p.bytes[LLMT_MEM_OPTIMIZER] - s.current[LLMT_MEM_HOST_STATE]);
    assert_int_equal(s.current[LLMT_MEM_OPTIMIZER], llmt_controller_placed_bytes(&tight->tr->ctl));
    assert_same_state(free_run, tight);
    return budget;
}

static void check_precision(int precision)
{
    enum { TIGHT = 5 };
    rig free_run, tight;
    rig_open(&free_run, precision, 2, NULL);
    rig_open(&tight, precision, 2, NULL);
    uint64_t budget = offload_under_budget(&free_run, &tight, TIGHT);

    /* Memory frees up: the controller relaxes, the state returns to the
     * device, and the run stays bitwise the free one. */
    assert_int_equal(llmt_context_set_budget(tight.ctx, budget * 8), LLMT_OK);
    int back = 0;
    for (int i = 0; i < 60 && !back; i++) {
        llmt_step_report a = step(&free_run), b = step(&tight);
        assert_memory_equal(&a.loss, &b.loss, sizeof a.loss);
        int32_t parts = 0, layers = 0;
        assert_int_equal(llmt_optimizer_get_offload(tight.opt, &parts, &layers), LLMT_OK);
        back = parts == LLMT_OFFLOAD_NONE && b.recompute_layers == 0;
    }
    assert_true(back);
    assert_contains(tight.log, "relaxing from");
    assert_int_equal(stats(&tight).current[LLMT_MEM_HOST_STATE], 0);
    assert_same_state(&free_run, &tight);
    rig_close(&free_run);
    rig_close(&tight);
}

static void test_offload_instead_of_a_smaller_micro_batch(void **state)
{
    (void)state;
    check_precision(LLMT_PRECISION_FP32);
    check_precision(LLMT_PRECISION_BF16_MIXED);
}

/* A sharded optimizer in a world of one: the budget that fits only with
 * part of the state offloaded makes the controller offload it (it used to
 * halve the micro-batch), the device state equals the controller's
 * prediction and the plan's optimizer bytes less the host segment, and the
 * run is bitwise an unsharded unconstrained one. */
static void test_sharded_offload_rungs(void **state)
{
    (void)state;
    enum { TIGHT = 4 };
    rig free_run, tight;
    rig_open(&free_run, LLMT_PRECISION_FP32, 1000, NULL);
    llmt_comm *comm = test_self_comm();
    assert_non_null(comm);
    shard_comm = comm;
    rig_open(&tight, LLMT_PRECISION_FP32, 1000, NULL);
    shard_comm = NULL; /* the next rigs are not sharded, whatever fails below */
    offload_under_budget(&free_run, &tight, TIGHT);
    /* Without a store, the collective resume names itself once. */
    int64_t at = 0;
    assert_int_equal(llmt_trainer_resume_latest(tight.tr, &at), LLMT_ESTATE);
    assert_string_equal(llmt_error_last(),
                        "rank 0: llmt_trainer_resume_latest: the trainer has no store");
    rig_close(&free_run);
    rig_close(&tight);
    llmt_comm_free(comm);
}

/* A device budget that fits the batch at B with the state of the
 * embedding and both layers offloaded (rung 2), not with layer 1's on the
 * device (rung 1), and a host budget one byte under what rung 2 holds: the
 * rungs from 2 on are passed over (the cap is rung 1), and the step that
 * does not fit at B runs at a smaller micro-batch with rung 1's offload,
 * every step completing once, the host bytes within the host budget, and
 * the losses, weights and AdamW state bitwise those of an unconstrained
 * run sliced at that micro-batch from the start. (The step used to fail:
 * the controller offloaded rung 2, which the host budget refused.) With
 * comm, the tight run's optimizer is sharded over it. */
static void check_host_cap(llmt_comm *comm)
{
    enum { STEPS = 4 };
    rig free_run, tight;
    rig_open_as(&free_run, LLMT_PRECISION_FP32, 1000, NULL, LONG_T, LLMT_OFFLOAD_NONE);
    /* A sharded optimizer sums the micro-batches' gradients as an ordered
     * slicer does (docs/memory.md). */
    if (comm)
        assert_int_equal(llmt_slicer_set_accumulation(free_run.slicer, LLMT_ACCUMULATE_ORDERED),
                         LLMT_OK);
    shard_comm = comm;
    rig_open_as(&tight, LLMT_PRECISION_FP32, 1000, NULL, LONG_T, LLMT_OFFLOAD_NONE);
    shard_comm = NULL; /* the next rigs are not sharded, whatever fails below */
    /* The plans equal the measured peaks (test_plan_offload.c); a sharded
     * optimizer holds its exchange buffers beside them. */
    llmt_plan rung1 = plan_placed(&tight, LLMT_OFFLOAD_OPTIMIZER, 1);
    llmt_plan rung2 = plan_placed(&tight, LLMT_OFFLOAD_OPTIMIZER, 2);
    assert_true(rung2.peak < rung1.peak);
    uint64_t budget = rung2.peak + (rung1.peak - rung2.peak) / 2 + stats(&tight).total_current -
                      stats(&free_run).total_current;
    uint64_t host_budget = rung2.host_peak - 1;
    assert_int_equal(llmt_context_set_budget(tight.ctx, budget), LLMT_OK);
    assert_int_equal(llmt_context_set_host_budget(tight.ctx, host_budget), LLMT_OK);
    int32_t micro = 0; /* the first step's, any smaller than B */
    for (int i = 0; i < STEPS; i++) {
        llmt_step_report b = step_at(&tight, micro);
        if (i == 0) { /* the free run slices as the tight one does from now on */
            micro = b.micro_batch;
            assert_true(micro < B);
            assert_int_equal(llmt_slicer_set_micro_batch(free_run.slicer, micro), LLMT_OK);
        }
        llmt_step_report a = step_at(&free_run, micro);
        assert_memory_equal(&a.loss, &b.loss, sizeof a.loss);
        assert_int_equal(b.retries, i == 0);
        assert_true(b.mem_peak <= budget);
        assert_true(stats(&tight).peak[LLMT_MEM_HOST_STATE] <= host_budget);
    }
    /* At the first halving (B / 2) with rung 1's offload, the notch one
     * lighter is rung 1 at B: the rungs above the cap are passed over. */
    const llmt_controller *ctl = &tight.tr->ctl;
    const int64_t rung1_notch = (int64_t)(LLMT_LADDER_LEVELS - 1) * LAYERS + 1;
    assert_int_equal(ctl->cap, 1);
    assert_int_equal(micro, B / 2);
    assert_int_equal(ctl->notch, rung1_notch + LAYERS + 1);
    assert_int_equal(llmt_controller_lighter(ctl, ctl->notch), rung1_notch);
    int32_t parts = 0, layers = 0;
    assert_int_equal(llmt_optimizer_get_offload(tight.opt, &parts, &layers), LLMT_OK);
    assert_int_equal(parts, LLMT_OFFLOAD_OPTIMIZER);
    assert_int_equal(layers, 1);
    assert_int_equal(stats(&tight).current[LLMT_MEM_HOST_STATE], rung1.host_peak);
    assert_contains(tight.log, comm ? "step 1: the host budget (the tightest rank's) holds"
                                    : "step 1: the host budget holds");
    assert_contains(tight.log, "holds the optimizer state of the embedding and layers 0-0: the "
                    "offload rungs above are passed over");
    assert_contains(tight.log, "step 1: out of memory");
    assert_contains(tight.log, "optimizer state offloaded: embedding and layers 0-0; micro-batch");
    /* A host budget of everything offloaded would hold rung 2, but not
     * beside rung 1 while the state moves there: the cap stays (it used to
     * rise, the move be refused at every decision and the controller
     * stay stuck); with no host budget it rises to all, the state moves,
     * and the run goes on bitwise. */
    const uint64_t all = plan_placed(&tight, LLMT_OFFLOAD_OPTIMIZER, LLMT_OFFLOAD_ALL_LAYERS).host_peak;
    assert_true(rung1.host_peak + rung2.host_peak > all && rung2.host_peak <= all);
    assert_int_equal(llmt_context_set_host_budget(tight.ctx, all), LLMT_OK);
    for (int i = 0; i < 2; i++) {
        llmt_step_report b = step_at(&tight, micro), a = step_at(&free_run, micro);
        assert_memory_equal(&a.loss, &b.loss, sizeof a.loss);
    }
    assert_int_equal(ctl->cap, 1);
    assert_null(strstr(tight.log, "stays placed as it is"));
    assert_int_equal(llmt_context_set_host_budget(tight.ctx, 0), LLMT_OK);
    for (int i = 0; i < 2; i++) {
        llmt_step_report b = step_at(&tight, micro), a = step_at(&free_run, micro);
        assert_memory_equal(&a.loss, &b.loss, sizeof a.loss);
    }
    assert_int_equal(ctl->cap, LAYERS + 1);
    assert_contains(tight.log, "the host holds all of the optimizer state");
    assert_int_equal(llmt_optimizer_get_offload(tight.opt, &parts, &layers), LLMT_OK);
    assert_int_equal(layers, LLMT_OFFLOAD_ALL_LAYERS);
    assert_null(strstr(tight.log, "stays placed as it is"));
    assert_same_state(&free_run, &tight);
    rig_close(&free_run);
    rig_close(&tight);
}

static void test_host_budget_caps_the_offload(void **state)
{
    (void)state;
    check_host_cap(NULL);
    llmt_comm *comm = test_self_comm();
    assert_non_null(comm);
    check_host_cap(comm);
    llmt_comm_free(comm);
}

/* An optimizer its owner placed (here: offload of no layer) is left where
 * it is: the same budget makes the micro-batch shrink instead. */
static void test_owner_placement_is_kept(void **state)
{
    (void)state;
    rig r;
    rig_open(&r, LLMT_PRECISION_FP32, 1000, NULL);
    assert_int_equal(llmt_optimizer_set_offload(r.opt, LLMT_OFFLOAD_OPTIMIZER, 0), LLMT_OK);
    llmt_plan p = plan_full(&r);
    uint64_t arena = p.bytes[LLMT_MEM_ACTIVATIONS] + p.bytes[LLMT_MEM_WORKSPACE];
    assert_int_equal(llmt_context_set_budget(r.ctx, stats(&r).total_current + arena / 2), LLMT_OK);
    llmt_step_report rep = {.version = LLMT_STEP_REPORT_VERSION};
    assert_int_equal(llmt_trainer_step(r.tr, &rep), LLMT_OK);
    assert_true(rep.micro_batch < B);
    int32_t parts = 0, layers = -1;
    assert_int_equal(llmt_optimizer_get_offload(r.opt, &parts, &layers), LLMT_OK);
    assert_int_equal(parts, LLMT_OFFLOAD_OPTIMIZER);
    assert_int_equal(layers, 0);
    assert_null(strstr(r.log, "offloaded"));
    rig_close(&r);
}

/* Saved at an offload notch and resumed into a fresh optimizer (all its
 * state on the device): the first step that does not fit places the state
 * as the notch says and retries; the run goes on bitwise. */
static void test_resume_at_an_offload_notch(void **state)
{
    (void)state;
    char dir[160];
    snprintf(dir, sizeof dir, "%s/ckpt", root);
    rig free_run, tight;
    rig_open(&free_run, LLMT_PRECISION_FP32, 1000, NULL);
    rig_open(&tight, LLMT_PRECISION_FP32, 1000, dir);
    llmt_plan p = plan_full(&tight);
    uint64_t arena = p.bytes[LLMT_MEM_ACTIVATIONS] + p.bytes[LLMT_MEM_WORKSPACE];
    uint64_t budget = stats(&tight).total_current + arena / 2;
    assert_int_equal(llmt_context_set_budget(tight.ctx, budget), LLMT_OK);
    for (int i = 0; i < 3; i++) {
        llmt_step_report a = step(&free_run), b = step(&tight);
        assert_memory_equal(&a.loss, &b.loss, sizeof a.loss);
    }
    assert_int_equal(llmt_trainer_save(tight.tr, LLMT_CKPT_DURABLE), LLMT_OK);
    rig_close(&tight);

    rig_open(&tight, LLMT_PRECISION_FP32, 1000, dir);
    int64_t at = -1;
    assert_int_equal(llmt_trainer_resume_latest(tight.tr, &at), LLMT_OK);
    assert_int_equal(at, 3);
    assert_int_equal(llmt_context_set_budget(tight.ctx, budget), LLMT_OK);
    int retries = 0;
    for (int i = 0; i < 3; i++) {
        llmt_step_report a = step(&free_run), b = step(&tight);
        assert_memory_equal(&a.loss, &b.loss, sizeof a.loss);
        retries += b.retries;
    }
    assert_int_equal(retries, 1);
    assert_contains(tight.log, "step 4: out of memory");
    assert_contains(tight.log, "with the optimizer placed as [recompute full on layers 0-1; "
                    "optimizer state offloaded");
    int32_t parts = 0, layers = 0;
    assert_int_equal(llmt_optimizer_get_offload(tight.opt, &parts, &layers), LLMT_OK);
    assert_int_equal(parts, LLMT_OFFLOAD_OPTIMIZER);
    assert_same_state(&free_run, &tight);
    rig_close(&free_run);
    rig_close(&tight);
}

/* A budget one byte under what full recompute needs with all of the
 * optimizer's state offloaded: optimizer offload alone must halve the
 * micro-batch, but with the gradients offloaded too the batch fits at B.
 * Every step completes (one retry, the first) and the losses, weights,
 * AdamW state and data position are bitwise the unconstrained run's. */
static void test_grads_offload_instead_of_a_smaller_micro_batch(void **state)
{
    (void)state;
    enum { STEPS = 4 };
    const int32_t both = LLMT_OFFLOAD_OPTIMIZER | LLMT_OFFLOAD_GRADS;
    rig free_run, tight, alone;
    rig_open_as(&free_run, LLMT_PRECISION_FP32, 1000, NULL, LONG_T, LLMT_OFFLOAD_NONE);
    rig_open_as(&tight, LLMT_PRECISION_FP32, 1000, NULL, LONG_T, both);
    rig_open_as(&alone, LLMT_PRECISION_FP32, 1000, NULL, LONG_T, LLMT_OFFLOAD_NONE);
    /* The plans equal the measured peaks (test_plan_offload.c). */
    llmt_plan full = plan_full(&tight);
    llmt_plan opt_all = plan_placed(&tight, LLMT_OFFLOAD_OPTIMIZER, LLMT_OFFLOAD_ALL_LAYERS);
    llmt_plan both_all = plan_placed(&tight, both, LLMT_OFFLOAD_ALL_LAYERS);
    assert_true(both_all.peak < opt_all.peak); /* the gradients make room */
    uint64_t budget = opt_all.peak - 1;
    assert_true(budget >= stats(&tight).total_current);
    assert_int_equal(stats(&alone).total_current, stats(&tight).total_current);
    assert_int_equal(llmt_context_set_budget(tight.ctx, budget), LLMT_OK);
    assert_int_equal(llmt_context_set_budget(alone.ctx, budget), LLMT_OK);
    assert_int_equal(steps_side_by_side(&free_run, &tight, STEPS, budget), 1);
    assert_contains(tight.log, "step 1: out of memory");
    assert_contains(tight.log, "optimizer state and gradients offloaded: embedding and layers 0-");
    int32_t parts = 0, layers = 0;
    assert_int_equal(llmt_optimizer_get_offload(tight.opt, &parts, &layers), LLMT_OK);
    assert_int_equal(parts, both);
    assert_true(layers >= 1 || layers == LLMT_OFFLOAD_ALL_LAYERS);
    llmt_memory_stats s = stats(&tight);
    assert_true(s.current[LLMT_MEM_GRADS] < full.bytes[LLMT_MEM_GRADS]);
    assert_true(s.current[LLMT_MEM_HOST_STATE] > 0);
    assert_same_state(&free_run, &tight);
    /* The optimizer's offload alone does not fit the batch: it halves. */
    llmt_step_report rep = {.version = LLMT_STEP_REPORT_VERSION};
    assert_int_equal(llmt_trainer_step(alone.tr, &rep), LLMT_OK);
    assert_true(rep.micro_batch < B);
    rig_close(&free_run);
    rig_close(&tight);
    rig_close(&alone);
}

/* The plan of the rig's model at micro-batch B/2 of a batch of B summed
 * in order, full recompute, with offload_parts of `layers` offloaded. */
static llmt_plan plan_ordered(rig *r, int32_t offload_parts, int32_t layers)
{
    return plan_of(r, B / 2, 1, offload_parts, layers);
}

/* An ordered slicer at micro-batch B/2 (the fp32 sum of every gradient,
 * split as the gradients are) and an optimizer whose owner allows
 * gradient offload, under the budget that fits with everything offloaded:
 * step 1 runs out of memory, the controller offloads state and gradients
 * (the sum's host part with them) without halving again, every step
 * completes with one retry in all, the measured GRADS and HOST_STATE are
 * the plan's for the placement taken, and the run is bitwise an
 * unconstrained ordered one at B/2. The host cap counts the sum's host
 * part. */
static void test_ordered_accumulation_with_grads(void **state)
{
    (void)state;
    enum { STEPS = 4 };
    const int32_t both = LLMT_OFFLOAD_OPTIMIZER | LLMT_OFFLOAD_GRADS;
    rig free_run, tight;
    rig_micro = B / 2;
    rig_open_as(&free_run, LLMT_PRECISION_BF16_MIXED, 1000, NULL, LONG_T, LLMT_OFFLOAD_NONE);
    rig_open_as(&tight, LLMT_PRECISION_BF16_MIXED, 1000, NULL, LONG_T, both);
    rig_micro = B;
    assert_int_equal(llmt_slicer_set_accumulation(free_run.slicer, LLMT_ACCUMULATE_ORDERED),
                     LLMT_OK);
    assert_int_equal(llmt_slicer_set_accumulation(tight.slicer, LLMT_ACCUMULATE_ORDERED),
                     LLMT_OK);
    const uint64_t budget = plan_ordered(&tight, both, LLMT_OFFLOAD_ALL_LAYERS).peak;
    assert_true(plan_ordered(&tight, LLMT_OFFLOAD_NONE, 0).peak > budget);
    assert_int_equal(llmt_context_set_budget(tight.ctx, budget), LLMT_OK);
    int retries = 0;
    for (int i = 0; i < STEPS; i++) {
        llmt_step_report a = step_at(&free_run, B / 2), b = step_at(&tight, B / 2);
        assert_memory_equal(&a.loss, &b.loss, sizeof a.loss);
        assert_true(b.mem_peak <= budget);
        retries += b.retries;
    }
    assert_int_equal(retries, 1);
    assert_contains(tight.log, "optimizer state and gradients offloaded: ");
    int32_t parts = 0, layers = 0;
    assert_int_equal(llmt_optimizer_get_offload(tight.opt, &parts, &layers), LLMT_OK);
    assert_int_equal(parts, both);
    llmt_plan want = plan_ordered(&tight, both, layers);
    llmt_memory_stats s = stats(&tight);
    assert_int_equal(s.current[LLMT_MEM_GRADS], want.bytes[LLMT_MEM_GRADS]);
    assert_int_equal(s.current[LLMT_MEM_HOST_STATE], want.bytes[LLMT_MEM_HOST_STATE]);
    assert_same_state(&free_run, &tight);
    /* The host cap counts the sum's host part: a host budget one byte
     * under what everything offloaded holds with the sum (though over it
     * without) caps the rungs at every layer (the final norm's and the LM
     * head's stay on the device); at layer 0's placement with its sum, at
     * rung 1. Asked of a fresh trainer's controller, nothing held. */
    rig probe;
    rig_micro = B / 2;
    rig_open_as(&probe, LLMT_PRECISION_BF16_MIXED, 1000, NULL, LONG_T, both);
    rig_micro = B;
    assert_int_equal(llmt_slicer_set_accumulation(probe.slicer, LLMT_ACCUMULATE_ORDERED), LLMT_OK);
    llmt_controller *ctl = &probe.tr->ctl;
    assert_int_equal(llmt_controller_attach(ctl, probe.opt, 1, 1), LLMT_OK);
    const uint64_t all = plan_ordered(&probe, both, LLMT_OFFLOAD_ALL_LAYERS).host_peak;
    assert_true(plan_placed(&probe, both, LLMT_OFFLOAD_ALL_LAYERS).host_peak < all - 1);
    assert_int_equal(llmt_context_set_host_budget(probe.ctx, all - 1), LLMT_OK);
    assert_int_equal(llmt_controller_host_cap(ctl), LAYERS);
    assert_int_equal(llmt_context_set_host_budget(probe.ctx, plan_ordered(&probe, both, 1).host_peak),
                     LLMT_OK);
    assert_int_equal(llmt_controller_host_cap(ctl), 1);
    rig_close(&probe);
    rig_close(&free_run);
    rig_close(&tight);
}

/* A move the host budget refuses half-way (through "all offloaded", then
 * back to a partial rung, whose move holds two host segments): the call
 * fails with the placement as it was, no step counted and the loader where
 * it was, and no call ever counts a step it reports as failed. */
static void test_refused_move_counts_no_step(void **state)
{
    (void)state;
    const int32_t both = LLMT_OFFLOAD_OPTIMIZER | LLMT_OFFLOAD_GRADS;
    rig r;
    rig_open_as(&r, LLMT_PRECISION_FP32, 1000, NULL, T, both);
    llmt_plan all = plan_placed(&r, both, LLMT_OFFLOAD_ALL_LAYERS);
    uint64_t in_use = stats(&r).total_current;
    assert_int_equal(llmt_context_set_budget(r.ctx, all.peak > in_use ? all.peak : in_use),
                     LLMT_OK);
    assert_int_equal(llmt_context_set_host_budget(r.ctx, all.host_peak + 4096), LLMT_OK);
    int failed = 0;
    for (int i = 0; i < 3; i++) {
        int64_t before = llmt_trainer_step_index(r.tr);
        llmt_loader_state at = LLMT_LOADER_STATE_INIT, now = LLMT_LOADER_STATE_INIT;
        assert_int_equal(llmt_loader_get_state(r.loader, &at), LLMT_OK);
        llmt_step_report rep = {.version = LLMT_STEP_REPORT_VERSION};
        int rc = llmt_trainer_step(r.tr, &rep);
        int64_t after = llmt_trainer_step_index(r.tr);
        assert_int_equal(llmt_loader_get_state(r.loader, &now), LLMT_OK);
        if (rc == LLMT_OK) {
            assert_int_equal(after, before + 1);
            continue;
        }
        failed++;
        assert_int_equal(rc, LLMT_ENOMEM);
        assert_int_equal(after, before); /* a failed call counts no step */
        assert_memory_equal(&now, &at, sizeof at); /* and gives its batch back */
        int32_t parts = 0, layers = -1;
        assert_int_equal(llmt_optimizer_get_offload(r.opt, &parts, &layers), LLMT_OK);
        assert_int_equal(parts, both);
        assert_int_equal(layers, 0); /* as it was */
    }
    assert_true(failed > 0); /* the budgets do refuse the move */
    rig_close(&r);
}

/* Sets r's budget so that the peak just measured (peak) is 0.95 of it:
 * over the threshold 0.9, so the next decision escalates. */
static void budget_for_escalation(rig *r, uint64_t peak)
{
    assert_int_equal(llmt_context_set_budget(r->ctx, (uint64_t)((double)peak / 0.95)), LLMT_OK);
}

/* One step of each rig, the same loss, counted as step i. */
static llmt_step_report step_both(rig *free_run, rig *r, int64_t i)
{
    llmt_step_report a = step(free_run), b = step(r);
    assert_memory_equal(&a.loss, &b.loss, sizeof a.loss);
    assert_int_equal(llmt_trainer_step_index(r->tr), i);
    return b;
}

/* An escalation above the threshold that the host budget refuses, relax
 * window 3. Every layer is at full recompute from the start, so the
 * escalations' targets are offload rungs: after step 2 the controller
 * offloads the embedding's and layer 0's state (rung 1); then the host
 * budget is set to what rung 2 holds, which the ladder takes (its cap),
 * but the move from rung 1 holds both host segments at once, and the host
 * budget refuses it after step 4. That step stands, counted, the refusal
 * logged and the notch and placement as they were; the next escalation
 * waits for the window (steps 5 and 6 try none, though the host budget is
 * lifted after step 5), and after step 7 it escalates. The run stays
 * bitwise the unconstrained one throughout. */
static void test_refused_escalation_keeps_the_step(void **state)
{
    (void)state;
    enum { WINDOW = 3 };
    rig free_run, r;
    rig_open(&free_run, LLMT_PRECISION_FP32, 1000, NULL);
    rig_recompute = LLMT_RECOMPUTE_FULL;
    rig_open(&r, LLMT_PRECISION_FP32, WINDOW, NULL);
    rig_recompute = LLMT_RECOMPUTE_NONE; /* the next rigs', whatever fails below */
    r.tr->cfg.memory_threshold = 0.9;
    const int64_t rung1 = r.tr->ctl.notch + 1;
    llmt_step_report b = step_both(&free_run, &r, 1);
    budget_for_escalation(&r, b.mem_peak);
    step_both(&free_run, &r, 2);
    assert_int_equal(r.tr->ctl.notch, rung1);
    const uint64_t host1 = stats(&r).current[LLMT_MEM_HOST_STATE];
    assert_int_equal(host1, plan_placed(&r, LLMT_OFFLOAD_OPTIMIZER, 1).host_peak);
    const uint64_t host2 = plan_placed(&r, LLMT_OFFLOAD_OPTIMIZER, 2).host_peak;
    assert_int_equal(llmt_context_set_host_budget(r.ctx, host2), LLMT_OK);
    b = step_both(&free_run, &r, 3); /* its peak is rung 1's */
    budget_for_escalation(&r, b.mem_peak);
    for (int64_t i = 4; i <= 6; i++) {
        b = step_both(&free_run, &r, i); /* succeeds: the refused move is not its failure */
        assert_true(b.mem_ratio > 0.9);
        assert_int_equal(r.tr->ctl.notch, rung1);
        int32_t parts = -1, layers = -1;
        assert_int_equal(llmt_optimizer_get_offload(r.opt, &parts, &layers), LLMT_OK);
        assert_int_equal(parts, LLMT_OFFLOAD_OPTIMIZER);
        assert_int_equal(layers, 1);
        assert_int_equal(stats(&r).current[LLMT_MEM_HOST_STATE], host1);
        if (i == 5) /* lifted: the window, not the budget, decides when to try */
            assert_int_equal(llmt_context_set_host_budget(r.ctx, 0), LLMT_OK);
    }
    assert_contains(r.log, "step 3: the host budget holds the optimizer state of the embedding and "
                    "layers 0-1: the offload rungs above are passed over");
    assert_contains(r.log, "step 4: escalating refused, staying at [");
    char refusal[96];
    snprintf(refusal, sizeof refusal, "refused: host budget %llu bytes", (unsigned long long)host2);
    assert_contains(r.log, refusal);
    /* The wait is in the trainer's checkpointed state, so a resume keeps
     * it; a blob written before its key restores no wait. */
    llmt_train_state st;
    char blob[256], old_blob[128];
    llmt_trainer_fill_state(r.tr, &st, blob, sizeof blob);
    assert_non_null(strstr(blob, "\"escalation_refused\":1"));
    snprintf(old_blob, sizeof old_blob, "{\"trainer\":1,\"notch\":%lld,\"since_change\":%lld}",
             (long long)r.tr->ctl.notch, (long long)r.tr->since_change);
    assert_int_equal(llmt_trainer_restore_blob(r.tr, old_blob, strlen(old_blob)), LLMT_OK);
    assert_int_equal(r.tr->escalation_refused, 0);
    assert_int_equal(llmt_trainer_restore_blob(r.tr, blob, st.user_blob_size), LLMT_OK);
    assert_int_equal(r.tr->escalation_refused, 1);
    assert_null(strstr(r.log, "step 5: ")); /* waiting: no attempt, no line */
    /* Step 6's decision sees the lifted budget (a line), and waits. */
    assert_contains(r.log, "step 6: the host holds all of the optimizer state");
    assert_null(strstr(r.log, "step 6: peak"));
    step_both(&free_run, &r, 7);
    assert_contains(r.log, "step 7: peak");
    assert_true(r.tr->ctl.notch > rung1);
    assert_true(stats(&r).current[LLMT_MEM_HOST_STATE] > host1); /* a heavier offload rung */
    step_both(&free_run, &r, 8);
    assert_same_state(&free_run, &r);
    rig_close(&free_run);
    rig_close(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_offload_instead_of_a_smaller_micro_batch),
        cmocka_unit_test(test_sharded_offload_rungs),
        cmocka_unit_test(test_host_budget_caps_the_offload),
        cmocka_unit_test(test_owner_placement_is_kept),
        cmocka_unit_test(test_resume_at_an_offload_notch),
        cmocka_unit_test(test_grads_offload_instead_of_a_smaller_micro_batch),
        cmocka_unit_test(test_ordered_accumulation_with_grads),
        cmocka_unit_test(test_refused_move_counts_no_step),
        cmocka_unit_test(test_refused_escalation_keeps_the_step),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
