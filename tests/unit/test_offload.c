/* Optimizer offload on the CPU backend (issue 15): the state of a prefix of
 * the parameters lives in HOST_STATE and is updated there, and every
 * placement, or a change of placement mid-run, gives bitwise the weights and
 * state of a run without offload; the accounting moves exactly the state's
 * bytes; refusals leave everything as it was; checkpoints load across
 * placements. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "test_util.h"

#include "llmt/llmt.h"
#include "model/model_internal.h"
#include "test_batch.h"
#include "test_context.h"
#include "test_self_comm.h"

enum { B = 4, MICRO = 2, T = 16, VOCAB = 48, D = 32, LAYERS = 2, HEADS = 4, KV = 2, FFN = 64 };
enum { STEPS = 20, MAX_CHANGES = 6 };
/* Optimizer state and gradients. */
#define BOTH (LLMT_OFFLOAD_OPTIMIZER | LLMT_OFFLOAD_GRADS)

static const int precisions[4] = {LLMT_PRECISION_FP32, LLMT_PRECISION_BF16_MIXED,
                                  LLMT_PRECISION_FP16_MIXED, LLMT_PRECISION_BF16_PURE};

/* Elements of one layer's parameters, from the configuration: two norms,
 * q k v o, gate up down. */
static int64_t layer_elems(void)
{
    int64_t hd = D / HEADS;
    return 2 * D + (int64_t)(HEADS + 2 * KV) * hd * D + (int64_t)D * HEADS * hd + 3 * (int64_t)FFN * D;
}

/* Elements stored before layer 1's first parameter: the embedding and
 * layer 0. */
static int64_t prefix_of_layer1(void)
{
    return (int64_t)VOCAB * D + layer_elems();
}

/* Gradient offload's split: a prefix rounded down to the norm's granule. */
static int64_t granule_floor(int64_t prefix)
{
    return prefix / 4096 * 4096;
}

/* Bytes of optimizer state per parameter: two moments and the master. */
static size_t state_bytes_per_param(int precision)
{
    switch (precision) {
    case LLMT_PRECISION_FP32: return 8;
    case LLMT_PRECISION_BF16_PURE: return 4;
    default: return 12;
    }
}

/* One training run; each object is freed by run_free. */
typedef struct run {
    llmt_context *ctx;
    llmt_model *m;
    llmt_optimizer *o;
    llmt_slicer *sl;
    llmt_loss_scaler *sc;
    int step;
} run;

static llmt_model_config model_config(int precision)
{
    llmt_model_config c = LLMT_MODEL_CONFIG_INIT;
    c.vocab_size = VOCAB;
    c.hidden_size = D;
    c.num_layers = LAYERS;
    c.num_heads = HEADS;
    c.num_kv_heads = KV;
    c.ffn_size = FFN;
    c.max_seq_len = T;
    c.precision = precision;
    return c;
}

/* The optimizer's decay_norms in the runs: with 1, the split between the
 * host and device segments falls inside one weight-decay run of update_all. */
static int32_t decay_norms;

static llmt_comm *self_comm(void)
{
    llmt_comm *comm = test_self_comm();
    assert_non_null(comm);
    return comm;
}

/* Non-NULL: run_open makes a sharded optimizer over it. */
static llmt_comm *shard_comm;

/* Nonzero: run_open's slicer accumulates in order (LLMT_ACCUMULATE_ORDERED). */
static int ordered;

/* Batches run_steps accumulates into one optimizer step (the gradients
 * zeroed before the first only). */
static int batches_per_step = 1;

/* Creates a run whose optimizer is created with the placement (parts, layers);
 * returns the optimizer's status (the run is usable only on LLMT_OK). */
static int run_open(run *r, llmt_context *ctx, int precision, int32_t parts, int32_t layers)
{
    memset(r, 0, sizeof *r);
    r->ctx = ctx;
    llmt_model_config c = model_config(precision);
    assert_int_equal(llmt_model_create(&r->m, ctx, &c), LLMT_OK);
    llmt_optimizer_config oc = LLMT_OPTIMIZER_CONFIG_INIT;
    oc.lr = 3e-3;
    oc.weight_decay = 0.01;
    oc.grad_clip = 0.5; /* clipping active: the grad factor is not 1 */
    oc.decay_norms = decay_norms;
    oc.offload_parts = parts;
    oc.offload_layers = layers;
    int rc = shard_comm ? llmt_optimizer_create_sharded(&r->o, r->m, &oc, shard_comm,
                                                        LLMT_REDUCE_DETERMINISTIC)
                        : llmt_optimizer_create(&r->o, r->m, &oc);
    if (rc)
        return rc;
    assert_int_equal(llmt_slicer_create(&r->sl, r->m, MICRO), LLMT_OK);
    if (ordered)
        assert_int_equal(llmt_slicer_set_accumulation(r->sl, LLMT_ACCUMULATE_ORDERED), LLMT_OK);
    llmt_loss_scaler_config lc = LLMT_LOSS_SCALER_CONFIG_INIT;
    if (precision != LLMT_PRECISION_FP16_MIXED) {
        lc.dynamic = 0;
        lc.init_scale = 1.0;
    }
    assert_int_equal(llmt_loss_scaler_create(&r->sc, &lc), LLMT_OK);
    return LLMT_OK;
}

static void run_steps(run *r, int n)
{
    int32_t tokens[B * T], targets[B * T];
    for (int i = 0; i < n; i++, r->step++) {
        assert_int_equal(llmt_model_zero_grads(r->m), LLMT_OK);
        for (int k = 0; k < batches_per_step; k++) {
            test_learnable_batch(r->step * batches_per_step + k, B, T, VOCAB, tokens, targets);
            double loss = 0;
            assert_int_equal(llmt_slicer_forward_backward(r->sl, tokens, targets, B, T,
                                                          llmt_loss_scaler_scale(r->sc), &loss),
                             LLMT_OK);
        }
        assert_int_equal(llmt_optimizer_step(r->o, r->sc, NULL), LLMT_OK);
    }
}

static void run_free(run *r)
{
    llmt_loss_scaler_free(r->sc);
    llmt_slicer_free(r->sl);
    llmt_optimizer_free(r->o);
    llmt_model_free(r->m);
    llmt_context_free(r->ctx);
}

/* The weights' bytes and every state tensor (llmt_optimizer_get_state, in
 * parameter order, kinds in order), for bitwise comparison. */
typedef struct snapshot {
    size_t weight_bytes, state_count;
    unsigned char *weights;
    float *state;
} snapshot;

static snapshot take(const run *r)
{
    snapshot s = {0};
    s.weight_bytes = r->m->weights.bytes;
    s.weights = malloc(s.weight_bytes);
    assert_non_null(s.weights);
    memcpy(s.weights, r->m->weights.ptr, s.weight_bytes); /* CPU: host memory */
    int kinds = llmt_optimizer_state_dtype(r->o, LLMT_OPT_STATE_MASTER) >= 0 ? 3 : 2;
    int64_t n = llmt_model_num_params(r->m);
    s.state_count = (size_t)(kinds * n);
    s.state = malloc(s.state_count * sizeof *s.state);
    assert_non_null(s.state);
    float *at = s.state;
    for (int k = 0; k < kinds; k++)
        for (int32_t t = 0; t < llmt_model_num_tensors(r->m); t++) {
            llmt_tensor_info info = LLMT_TENSOR_INFO_INIT;
            assert_int_equal(llmt_model_tensor_info(r->m, t, &info), LLMT_OK);
            assert_int_equal(llmt_optimizer_get_state(r->o, k, info.name, at, (size_t)info.numel),
                             LLMT_OK);
            at += info.numel;
        }
    assert_int_equal(at - s.state, (ptrdiff_t)s.state_count);
    return s;
}

static void assert_same(const snapshot *a, const snapshot *b, const char *what)
{
    if (a->weight_bytes != b->weight_bytes || memcmp(a->weights, b->weights, a->weight_bytes))
        fail_msg("%s: the weights differ", what);
    if (a->state_count != b->state_count ||
        memcmp(a->state, b->state, a->state_count * sizeof(float)))
        fail_msg("%s: the optimizer state differs", what);
}

static void drop(snapshot *s)
{
    free(s->weights);
    free(s->state);
}

static llmt_memory_stats stats_of(const llmt_context *ctx)
{
    llmt_memory_stats s = LLMT_MEMORY_STATS_INIT;
    assert_int_equal(llmt_context_memory_stats(ctx, &s), LLMT_OK);
    return s;
}

/* STEPS steps from the placement made at creation, changing it to
 * changes[i] before step at[i]. */
typedef struct placement_change {
    int at;
    int32_t parts, layers;
} placement_change;

static snapshot train(int precision, int32_t parts, int32_t layers, const placement_change *changes,
                      int n_changes)
{
    run r;
    assert_int_equal(run_open(&r, test_context(2, 7), precision, parts, layers), LLMT_OK);
    for (int c = 0; c <= n_changes; c++) {
        int until = c < n_changes ? changes[c].at : STEPS;
        run_steps(&r, until - r.step);
        if (c < n_changes)
            assert_int_equal(llmt_optimizer_set_offload(r.o, changes[c].parts, changes[c].layers),
                             LLMT_OK);
    }
    snapshot s = take(&r);
    run_free(&r);
    return s;
}

/* Offload none, all, layers 1 of 2 and every layer (2) from creation, of
 * the optimizer's state alone and with the gradients (two micro-batches
 * accumulate through the device bucket): bitwise the same after 20 steps in
 * each precision mode; bf16_pure's stochastic rounding draws the same bits
 * on the host. */
static void test_placements_bitwise(void **state)
{
    (void)state;
    const int32_t layers[3] = {LLMT_OFFLOAD_ALL_LAYERS, 1, LAYERS};
    const int32_t parts[2] = {LLMT_OFFLOAD_OPTIMIZER, BOTH};
    for (decay_norms = 0; decay_norms <= 1; decay_norms++)
        for (int p = 0; p < 4; p++) {
            snapshot ref = train(precisions[p], LLMT_OFFLOAD_NONE, 0, NULL, 0);
            for (int k = 0; k < 6; k++) {
                snapshot got = train(precisions[p], parts[k / 3], layers[k % 3], NULL, 0);
                char what[112];
                snprintf(what, sizeof what, "precision %d, offload %d of layers %d, decay_norms %d",
                         precisions[p], parts[k / 3], layers[k % 3], decay_norms);
                assert_same(&ref, &got, what);
                drop(&got);
            }
            drop(&ref);
        }
    decay_norms = 0;
}

/* Ordered accumulation (an fp32 sum of the micro-batches' gradients,
 * rounded once) with the gradients offloaded: the sum's host segment
 * follows the gradients' split, and the run is bitwise the ordered run
 * without offload in each precision mode, offloading layer 0, both layers
 * or everything from creation, and moving between them mid-run; two
 * batches go into each step, so the second batch's sum starts from the
 * first's gradients on the host as on the device. After a
 * step with everything offloaded, the sum's bytes are where the plan puts
 * them: 4 bytes a parameter, the gradient split's in HOST_STATE. */
static void test_ordered_with_grads_bitwise(void **state)
{
    (void)state;
    ordered = 1;
    batches_per_step = 2;
    const int32_t layers[3] = {1, LAYERS, LLMT_OFFLOAD_ALL_LAYERS};
    const placement_change changes[3] = {{4, BOTH, LLMT_OFFLOAD_ALL_LAYERS},
                                         {8, BOTH, 1},
                                         {12, LLMT_OFFLOAD_NONE, 0}};
    for (int p = 0; p < 4; p++) {
        snapshot ref = train(precisions[p], LLMT_OFFLOAD_NONE, 0, NULL, 0);
        for (int k = 0; k <= 3; k++) {
            snapshot got = k < 3 ? train(precisions[p], BOTH, layers[k], NULL, 0)
                                 : train(precisions[p], LLMT_OFFLOAD_NONE, 0, changes, 3);
            char what[96];
            snprintf(what, sizeof what, "ordered, precision %d, %s %d", precisions[p],
                     k < 3 ? "gradients offloaded, layers" : "placements changed", layers[k % 3]);
            assert_same(&ref, &got, what);
            drop(&got);
        }
        drop(&ref);
    }
    run r;
    assert_int_equal(run_open(&r, test_context(2, 7), LLMT_PRECISION_BF16_MIXED, BOTH,
                              LLMT_OFFLOAD_ALL_LAYERS), LLMT_OK);
    run_steps(&r, 1);
    llmt_memory_stats s = stats_of(r.ctx);
    llmt_plan_config pc = LLMT_PLAN_CONFIG_INIT;
    pc.model = model_config(LLMT_PRECISION_BF16_MIXED);
    pc.micro_batch = MICRO;
    pc.batch_size = B;
    pc.seq_len = T;
    pc.ordered_accumulation = 1;
    pc.offload_parts = BOTH;
    pc.offload_layers = LLMT_OFFLOAD_ALL_LAYERS;
    llmt_plan plan = LLMT_PLAN_INIT;
    assert_int_equal(llmt_plan_compute(r.ctx, &pc, &plan), LLMT_OK);
    const int64_t n = llmt_model_num_params(r.m), split = granule_floor(n);
    /* State (12 bytes), gradients (2) and the sum (4) of the split. */
    assert_int_equal(s.current[LLMT_MEM_HOST_STATE],
                     (uint64_t)n * 12 + (uint64_t)split * (2 + 4));
    assert_int_equal(plan.bytes[LLMT_MEM_HOST_STATE], s.current[LLMT_MEM_HOST_STATE]);
    assert_int_equal(plan.bytes[LLMT_MEM_GRADS], s.current[LLMT_MEM_GRADS]);
    run_free(&r);
    ordered = 0;
    batches_per_step = 1;
}

/* none -> layers 1 -> all -> with gradients, layers 1 -> all -> optimizer
 * only -> none during the run: the same bits as never moving. */
static void test_migration_mid_run_bitwise(void **state)
{
    (void)state;
    const placement_change changes[6] = {{3, LLMT_OFFLOAD_OPTIMIZER, 1},
                                         {6, LLMT_OFFLOAD_OPTIMIZER, LLMT_OFFLOAD_ALL_LAYERS},
                                         {9, BOTH, 1},
                                         {12, BOTH, LLMT_OFFLOAD_ALL_LAYERS},
                                         {15, LLMT_OFFLOAD_OPTIMIZER, 1},
                                         {17, LLMT_OFFLOAD_NONE, 0}};
    for (int p = 0; p < 4; p++) {
        snapshot ref = train(precisions[p], LLMT_OFFLOAD_NONE, 0, NULL, 0);
        snapshot got = train(precisions[p], LLMT_OFFLOAD_NONE, 0, changes, 6);
        assert_same(&ref, &got, "moved mid-run");
        drop(&got);
        drop(&ref);
    }
}

/* A sharded optimizer (one rank, which owns every element) offloads its
 * state too: created with layers 1, then all, then none mid-run, each
 * precision mode gives the bits of an unsharded optimizer without offload
 * (its AdamW reads the reduced gradient sum, get_state gathers across the
 * host and device segments); and so it does with its gradients (sent to
 * the owner from host memory): created with both of layer 1, then of all,
 * then the state only, then none. */
static void test_sharded_bitwise(void **state)
{
    (void)state;
    const placement_change changes[2] = {{5, LLMT_OFFLOAD_OPTIMIZER, LLMT_OFFLOAD_ALL_LAYERS},
                                         {12, LLMT_OFFLOAD_NONE, 0}};
    const placement_change with_grads[3] = {{5, BOTH, LLMT_OFFLOAD_ALL_LAYERS},
                                            {9, LLMT_OFFLOAD_OPTIMIZER, 1},
                                            {12, LLMT_OFFLOAD_NONE, 0}};
    for (int p = 0; p < 4; p++) {
        snapshot ref = train(precisions[p], LLMT_OFFLOAD_NONE, 0, NULL, 0);
        for (int g = 0; g < 2; g++) {
            shard_comm = self_comm();
            snapshot got = g ? train(precisions[p], BOTH, 1, with_grads, 3)
                             : train(precisions[p], LLMT_OFFLOAD_OPTIMIZER, 1, changes, 2);
            llmt_comm_free(shard_comm);
            shard_comm = NULL;
            char what[80];
            snprintf(what, sizeof what, "sharded, offloaded%s, precision %d",
                     g ? " with the gradients" : "", precisions[p]);
            assert_same(&ref, &got, what);
            drop(&got);
        }
        drop(&ref);
    }
}

/* Moving the state moves exactly its bytes from OPTIMIZER to HOST_STATE (no
 * staging on the CPU), and the device-side totals leave HOST_STATE out. */
static void test_accounting(void **state)
{
    (void)state;
    for (int p = 0; p < 4; p++) {
        run r;
        assert_int_equal(run_open(&r, test_context(2, 7), precisions[p], LLMT_OFFLOAD_NONE, 0),
                         LLMT_OK);
        run_steps(&r, 1);
        int64_t n = llmt_model_num_params(r.m);
        size_t per = state_bytes_per_param(precisions[p]);
        llmt_memory_stats none = stats_of(r.ctx);
        assert_int_equal(none.current[LLMT_MEM_OPTIMIZER], (uint64_t)n * per);
        assert_int_equal(none.current[LLMT_MEM_HOST_STATE], 0);

        const int32_t layers[3] = {1, LLMT_OFFLOAD_ALL_LAYERS, 0};
        const int64_t host_elems[3] = {prefix_of_layer1(), n, 0};
        for (int k = 0; k < 3; k++) {
            assert_int_equal(llmt_optimizer_set_offload(r.o, LLMT_OFFLOAD_OPTIMIZER, layers[k]),
                             LLMT_OK);
            assert_int_equal(llmt_context_reset_peak(r.ctx), LLMT_OK);
            run_steps(&r, 1);
            llmt_memory_stats s = stats_of(r.ctx);
            uint64_t moved = (uint64_t)host_elems[k] * per;
            assert_int_equal(s.current[LLMT_MEM_HOST_STATE], moved);
            assert_int_equal(s.current[LLMT_MEM_OPTIMIZER], none.current[LLMT_MEM_OPTIMIZER] - moved);
            assert_int_equal(s.total_current, none.total_current - moved);
            uint64_t sum = 0;
            for (int c = 0; c < LLMT_MEM_CATEGORY_COUNT; c++)
                sum += c == LLMT_MEM_HOST_STATE ? 0 : s.current[c];
            assert_int_equal(s.total_current, sum);
            assert_int_equal(s.total_peak, none.total_peak - moved);
        }
        /* With the gradients: the offloaded prefix's gradients (up to its
         * last whole granule) leave GRADS for HOST_STATE, and GRADS gains a
         * bucket of the largest offloaded bucket: layer 0 here. */
        size_t es = precisions[p] == LLMT_PRECISION_FP32 ? 4 : 2;
        const int64_t grad_split[2] = {granule_floor(prefix_of_layer1()), granule_floor(n)};
        for (int k = 0; k < 2; k++) {
            assert_int_equal(llmt_optimizer_set_offload(r.o, BOTH, layers[k]), LLMT_OK);
            run_steps(&r, 1);
            llmt_memory_stats s = stats_of(r.ctx);
            uint64_t moved = (uint64_t)host_elems[k] * per;
            assert_true(grad_split[k] > 0);
            assert_int_equal(s.current[LLMT_MEM_HOST_STATE], moved + (uint64_t)grad_split[k] * es);
            assert_int_equal(s.current[LLMT_MEM_GRADS],
                             none.current[LLMT_MEM_GRADS] - (uint64_t)grad_split[k] * es +
                                 (uint64_t)layer_elems() * es);
            int32_t parts = -9, lay = -9;
            assert_int_equal(llmt_optimizer_get_offload(r.o, &parts, &lay), LLMT_OK);
            assert_int_equal(parts, BOTH);
            assert_int_equal(lay, layers[k]);
        }
        assert_int_equal(llmt_optimizer_set_offload(r.o, LLMT_OFFLOAD_OPTIMIZER, 0), LLMT_OK);
        assert_int_equal(stats_of(r.ctx).current[LLMT_MEM_GRADS], none.current[LLMT_MEM_GRADS]);
        int32_t parts = -9, lay = -9;
        assert_int_equal(llmt_optimizer_get_offload(r.o, &parts, &lay), LLMT_OK);
        assert_int_equal(parts, LLMT_OFFLOAD_OPTIMIZER);
        assert_int_equal(lay, 0);
        assert_int_equal(llmt_optimizer_set_offload(r.o, LLMT_OFFLOAD_NONE, 5), LLMT_OK);
        assert_int_equal(llmt_optimizer_get_offload(r.o, &parts, &lay), LLMT_OK);
        assert_int_equal(parts, LLMT_OFFLOAD_NONE);
        assert_int_equal(lay, 0); /* ignored with NONE, stored as 0 */
        assert_int_equal(stats_of(r.ctx).current[LLMT_MEM_HOST_STATE], 0);
        run_free(&r);
    }
}

/* A device budget that fits only with the state offloaded: creating the
 * optimizer directly offloaded succeeds (nothing goes to the device first)
 * and trains; without offload it is refused. The host budget is exact. */
static void test_budget_fits_only_with_offload(void **state)
{
    (void)state;
    const int precision = LLMT_PRECISION_BF16_MIXED;
    run r;
    assert_int_equal(run_open(&r, test_context(2, 7), precision, LLMT_OFFLOAD_OPTIMIZER,
                              LLMT_OFFLOAD_ALL_LAYERS),
                     LLMT_OK);
    run_steps(&r, 2);
    llmt_memory_stats measured = stats_of(r.ctx);
    snapshot ref = take(&r);
    uint64_t host = measured.current[LLMT_MEM_HOST_STATE];
    assert_int_equal(host, (uint64_t)llmt_model_num_params(r.m) * state_bytes_per_param(precision));
    run_free(&r);

    llmt_context_config cc = LLMT_CONTEXT_CONFIG_INIT;
    cc.num_threads = 2;
    cc.seed = 7;
    cc.memory_budget = measured.total_peak;
    cc.host_memory_budget = host;
    llmt_context *ctx = NULL;
    assert_int_equal(llmt_context_create(&ctx, &cc), LLMT_OK);
    assert_int_equal(run_open(&r, ctx, precision, LLMT_OFFLOAD_NONE, 0), LLMT_ENOMEM);
    assert_contains(llmt_error_last(), "budget");
    llmt_model_free(r.m);
    assert_int_equal(run_open(&r, ctx, precision, LLMT_OFFLOAD_OPTIMIZER, LLMT_OFFLOAD_ALL_LAYERS),
                     LLMT_OK);
    run_steps(&r, 2);
    snapshot got = take(&r);
    assert_same(&ref, &got, "trained in the budget");
    llmt_memory_stats s = stats_of(r.ctx);
    assert_int_equal(s.budget, measured.total_peak);
    assert_int_equal(s.host_budget, host);
    assert_true(s.total_peak <= measured.total_peak);
    /* Moving the state back does not fit the device budget: refused, intact. */
    assert_int_equal(llmt_optimizer_set_offload(r.o, LLMT_OFFLOAD_NONE, 0), LLMT_ENOMEM);
    assert_contains(llmt_error_last(), "refused: budget");
    snapshot after = take(&r);
    assert_same(&got, &after, "after the refused move");
    int32_t parts = 0, layers = 0;
    assert_int_equal(llmt_optimizer_get_offload(r.o, &parts, &layers), LLMT_OK);
    assert_int_equal(parts, LLMT_OFFLOAD_OPTIMIZER);
    assert_int_equal(layers, LLMT_OFFLOAD_ALL_LAYERS);
    assert_int_equal(stats_of(r.ctx).current[LLMT_MEM_HOST_STATE], host);
    drop(&after);
    drop(&got);
    drop(&ref);
    run_free(&r);
}

/* A host budget too small for the move: LLMT_ENOMEM naming the host budget,
 * with the placement, the state and the accounting as they were. */
static void test_host_budget_refuses(void **state)
{
    (void)state;
    run r;
    assert_int_equal(run_open(&r, test_context(2, 7), LLMT_PRECISION_BF16_PURE, LLMT_OFFLOAD_NONE, 0),
                     LLMT_OK);
    run_steps(&r, 3);
    snapshot before = take(&r);
    llmt_memory_stats s0 = stats_of(r.ctx);
    uint64_t need = (uint64_t)prefix_of_layer1() * state_bytes_per_param(LLMT_PRECISION_BF16_PURE);
    assert_int_equal(llmt_context_set_host_budget(r.ctx, need - 1), LLMT_OK);
    assert_int_equal(llmt_optimizer_set_offload(r.o, LLMT_OFFLOAD_OPTIMIZER, 1), LLMT_ENOMEM);
    assert_contains(llmt_error_last(), "host budget");
    assert_contains(llmt_error_last(), "host_state");
    int32_t parts = -1, layers = -1;
    assert_int_equal(llmt_optimizer_get_offload(r.o, &parts, &layers), LLMT_OK);
    assert_int_equal(parts, LLMT_OFFLOAD_NONE);
    assert_int_equal(layers, 0);
    llmt_memory_stats s1 = stats_of(r.ctx);
    assert_int_equal(s1.current[LLMT_MEM_OPTIMIZER], s0.current[LLMT_MEM_OPTIMIZER]);
    assert_int_equal(s1.current[LLMT_MEM_HOST_STATE], 0);
    assert_int_equal(s1.total_current, s0.total_current);
    snapshot after = take(&r);
    assert_same(&before, &after, "after the refused move");
    /* Room for the gradients but not the state: the gradients, moved first,
     * go back, and the state's refusal is the message. */
    uint64_t grads_only = (uint64_t)granule_floor(prefix_of_layer1()) * 2; /* bf16 */
    assert_int_equal(llmt_context_set_host_budget(r.ctx, grads_only), LLMT_OK);
    assert_int_equal(llmt_optimizer_set_offload(r.o, BOTH, 1), LLMT_ENOMEM);
    assert_contains(llmt_error_last(), "offloaded AdamW");
    assert_int_equal(llmt_optimizer_get_offload(r.o, &parts, &layers), LLMT_OK);
    assert_int_equal(parts, LLMT_OFFLOAD_NONE);
    llmt_memory_stats s2 = stats_of(r.ctx);
    assert_int_equal(s2.current[LLMT_MEM_HOST_STATE], 0);
    assert_int_equal(s2.current[LLMT_MEM_GRADS], s0.current[LLMT_MEM_GRADS]);
    assert_int_equal(r.m->grad_split, 0);
    snapshot after2 = take(&r);
    assert_same(&before, &after2, "after the refused move with the gradients");
    drop(&after2);
    /* Exactly enough: the move goes through; then a budget below the use is refused. */
    assert_int_equal(llmt_context_set_host_budget(r.ctx, need), LLMT_OK);
    assert_int_equal(llmt_optimizer_set_offload(r.o, LLMT_OFFLOAD_OPTIMIZER, 1), LLMT_OK);
    assert_int_equal(stats_of(r.ctx).current[LLMT_MEM_HOST_STATE], need);
    assert_int_equal(llmt_context_set_host_budget(r.ctx, need - 1), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "host_state");
    assert_int_equal(llmt_context_set_host_budget(r.ctx, 0), LLMT_OK);
    assert_int_equal(llmt_context_set_host_budget(NULL, 0), LLMT_EINVAL);
    drop(&after);
    drop(&before);
    run_free(&r);
}

/* A checkpoint saved with one placement loads into another: state and
 * weights bitwise equal (sync saves read the state in place, async ones
 * through the staging). */
static void test_checkpoint_across_placements(void **state)
{
    (void)state;
    const int32_t save_layers[3] = {LLMT_OFFLOAD_ALL_LAYERS, 0, 1};
    const int32_t save_parts[3] = {BOTH, LLMT_OFFLOAD_NONE, LLMT_OFFLOAD_OPTIMIZER};
    const int32_t load_layers[3] = {0, LLMT_OFFLOAD_ALL_LAYERS, LLMT_OFFLOAD_ALL_LAYERS};
    const int32_t load_parts[3] = {LLMT_OFFLOAD_NONE, BOTH, LLMT_OFFLOAD_NONE};
    for (int p = 0; p < 4; p++)
        for (int k = 0; k < 3; k++) {
            char dir[] = "/tmp/llmt-offload-XXXXXX";
            assert_non_null(mkdtemp(dir));
            run a, b;
            assert_int_equal(run_open(&a, test_context(2, 7), precisions[p], save_parts[k],
                                      save_layers[k]),
                             LLMT_OK);
            run_steps(&a, 3);
            llmt_ckpt_store *st = NULL;
            assert_int_equal(llmt_ckpt_store_open(&st, a.ctx, dir, NULL), LLMT_OK);
            llmt_train_state ts = LLMT_TRAIN_STATE_INIT;
            ts.model = a.m;
            ts.optimizer = a.o;
            ts.scaler = a.sc;
            ts.step = 3;
            if (k == 2) {
                assert_int_equal(llmt_ckpt_save_async(st, &ts, LLMT_CKPT_DURABLE), LLMT_OK);
                assert_int_equal(llmt_ckpt_wait(st), LLMT_OK);
            } else {
                assert_int_equal(llmt_ckpt_save(st, &ts, LLMT_CKPT_DURABLE), LLMT_OK);
            }
            snapshot saved = take(&a);

            assert_int_equal(run_open(&b, test_context(2, 7), precisions[p], load_parts[k],
                                      load_layers[k]),
                             LLMT_OK);
            llmt_train_state tl = LLMT_TRAIN_STATE_INIT;
            tl.model = b.m;
            tl.optimizer = b.o;
            tl.scaler = b.sc;
            assert_int_equal(llmt_ckpt_load(st, 3, LLMT_CKPT_DURABLE, &tl, NULL, 0, NULL), LLMT_OK);
            snapshot loaded = take(&b);
            assert_same(&saved, &loaded, "loaded into another placement");
            /* And training on from there agrees too. */
            run_steps(&a, 2);
            b.step = a.step - 2;
            run_steps(&b, 2);
            snapshot a2 = take(&a), b2 = take(&b);
            assert_same(&a2, &b2, "trained on after loading");
            drop(&a2);
            drop(&b2);
            drop(&loaded);
            drop(&saved);
            llmt_ckpt_store_free(st);
            run_free(&b);
            run_free(&a);
            char cmd[128];
            snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
            assert_int_equal(system(cmd), 0);
        }
}

/* Bad arguments are refused naming them, and nothing changes. */
static void test_bad_arguments(void **state)
{
    (void)state;
    run r;
    assert_int_equal(run_open(&r, test_context(2, 7), LLMT_PRECISION_FP32, LLMT_OFFLOAD_OPTIMIZER, 1),
                     LLMT_OK);
    assert_int_equal(llmt_optimizer_set_offload(NULL, LLMT_OFFLOAD_NONE, 0), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "opt is NULL");
    const int32_t bad_parts[3] = {LLMT_OFFLOAD_GRADS, 4, -1};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(llmt_optimizer_set_offload(r.o, bad_parts[i], 0), LLMT_EINVAL);
        assert_contains(llmt_error_last(), "parts");
        assert_contains(llmt_error_last(), i ? "is not LLMT_OFFLOAD_NONE" : "needs LLMT_OFFLOAD_OPTIMIZER");
    }
    const int32_t bad_layers[3] = {-2, LAYERS + 1, INT32_MAX};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(llmt_optimizer_set_offload(r.o, LLMT_OFFLOAD_OPTIMIZER, bad_layers[i]),
                         LLMT_EINVAL);
        assert_contains(llmt_error_last(), "layers");
    }
    int32_t parts = 0, layers = 0;
    assert_int_equal(llmt_optimizer_get_offload(r.o, &parts, &layers), LLMT_OK);
    assert_int_equal(parts, LLMT_OFFLOAD_OPTIMIZER);
    assert_int_equal(layers, 1);
    assert_int_equal(llmt_optimizer_get_offload(NULL, &parts, &layers), LLMT_EINVAL);
    assert_int_equal(llmt_optimizer_get_offload(r.o, NULL, &layers), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "parts");
    assert_int_equal(llmt_optimizer_get_offload(r.o, &parts, NULL), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "layers");
    llmt_optimizer_config got = LLMT_OPTIMIZER_CONFIG_INIT;
    assert_int_equal(llmt_optimizer_get_config(r.o, &got), LLMT_OK);
    assert_int_equal(got.offload_parts, LLMT_OFFLOAD_OPTIMIZER);
    assert_int_equal(got.offload_layers, 1);
    llmt_optimizer_config v1 = LLMT_OPTIMIZER_CONFIG_INIT;
    v1.version = 1;
    v1.offload_parts = 77; /* past a version 1 struct's end: not written */
    assert_int_equal(llmt_optimizer_get_config(r.o, &v1), LLMT_OK);
    assert_int_equal(v1.version, 1);
    assert_int_equal(v1.offload_parts, 77);

    /* The configuration's fields are checked the same way. */
    llmt_optimizer *o = NULL;
    llmt_optimizer_config oc = LLMT_OPTIMIZER_CONFIG_INIT;
    oc.offload_parts = LLMT_OFFLOAD_GRADS;
    assert_int_equal(llmt_optimizer_create(&o, r.m, &oc), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "offload_parts");
    assert_contains(llmt_error_last(), "needs LLMT_OFFLOAD_OPTIMIZER");
    oc.offload_parts = LLMT_OFFLOAD_OPTIMIZER;
    oc.offload_layers = LAYERS + 1;
    assert_int_equal(llmt_optimizer_create(&o, r.m, &oc), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "layers");
    assert_null(o);
    /* A version 1 struct is read only as far as its fields: no offload. */
    oc.version = 1;
    assert_int_equal(llmt_optimizer_create(&o, r.m, &oc), LLMT_OK);
    assert_int_equal(llmt_optimizer_get_offload(o, &parts, &layers), LLMT_OK);
    assert_int_equal(parts, LLMT_OFFLOAD_NONE);
    llmt_optimizer_free(o);

    /* A sharded optimizer offloads its gradients too (the whole model's
     * prefix), and its bad placements are named as an unsharded one's. */
    llmt_comm *comm = self_comm();
    oc = (llmt_optimizer_config)LLMT_OPTIMIZER_CONFIG_INIT;
    oc.offload_parts = BOTH;
    oc.offload_layers = 1;
    assert_int_equal(llmt_optimizer_create_sharded(&o, r.m, &oc, comm, LLMT_REDUCE_DETERMINISTIC),
                     LLMT_OK);
    assert_true(granule_floor(prefix_of_layer1()) > 0);
    assert_int_equal(r.m->grad_split, granule_floor(prefix_of_layer1()));
    assert_int_equal(llmt_optimizer_set_offload(o, LLMT_OFFLOAD_GRADS, 1), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "LLMT_OFFLOAD_GRADS alone");
    assert_int_equal(llmt_optimizer_set_offload(o, BOTH, LAYERS + 1), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "layers");
    assert_int_equal(llmt_optimizer_get_offload(o, &parts, &layers), LLMT_OK);
    assert_int_equal(parts, BOTH); /* unchanged by the refusals */
    assert_int_equal(layers, 1);
    assert_int_equal(llmt_optimizer_set_offload(o, LLMT_OFFLOAD_OPTIMIZER, 1), LLMT_OK);
    assert_int_equal(r.m->grad_split, 0);
    assert_int_equal(llmt_optimizer_set_offload(o, LLMT_OFFLOAD_NONE, 0), LLMT_OK);
    llmt_optimizer_free(o);
    llmt_comm_free(comm);
    run_free(&r);
}

/* Version 1 of the context config and of the memory stats are still
 * accepted; the v1 stats struct's end is not written past. */
static void test_context_versions(void **state)
{
    (void)state;
    llmt_context_config cc = LLMT_CONTEXT_CONFIG_INIT;
    cc.version = 1;
    cc.num_threads = 1;
    cc.host_memory_budget = 12345; /* past a v1 struct's end: not read */
    llmt_context *ctx = NULL;
    assert_int_equal(llmt_context_create(&ctx, &cc), LLMT_OK);
    llmt_memory_stats s = LLMT_MEMORY_STATS_INIT;
    s.version = 1;
    s.host_budget = 777; /* past a v1 struct's end: not written */
    assert_int_equal(llmt_context_memory_stats(ctx, &s), LLMT_OK);
    assert_int_equal(s.host_budget, 777);
    assert_int_equal(s.version, 1);
    s.version = LLMT_MEMORY_STATS_VERSION;
    assert_int_equal(llmt_context_memory_stats(ctx, &s), LLMT_OK);
    assert_int_equal(s.host_budget, 0);
    assert_string_equal(llmt_mem_category_name(LLMT_MEM_HOST_STATE), "host_state");
    s.version = 3;
    assert_int_equal(llmt_context_memory_stats(ctx, &s), LLMT_EVERSION);
    llmt_context_free(ctx);
    cc.version = 2;
    assert_int_equal(llmt_context_create(&ctx, &cc), LLMT_OK);
    s.version = LLMT_MEMORY_STATS_VERSION;
    assert_int_equal(llmt_context_memory_stats(ctx, &s), LLMT_OK);
    assert_int_equal(s.host_budget, 12345);
    llmt_context_free(ctx);
}

/* Weights set between steps win over the master weights on both sides of
 * the split: the offloaded master is taken again from them, as the
 * device's is. */
static void test_master_follows_set_weights(void **state)
{
    (void)state;
    const int32_t parts[2] = {LLMT_OFFLOAD_NONE, LLMT_OFFLOAD_OPTIMIZER};
    snapshot s[2];
    for (int k = 0; k < 2; k++) {
        run r;
        assert_int_equal(run_open(&r, test_context(2, 7), LLMT_PRECISION_BF16_MIXED, parts[k],
                                  LLMT_OFFLOAD_ALL_LAYERS),
                         LLMT_OK);
        run_steps(&r, 2);
        float *emb = malloc((size_t)VOCAB * D * sizeof *emb);
        assert_non_null(emb);
        for (int i = 0; i < VOCAB * D; i++)
            emb[i] = (float)((i * 37) % 101 - 50) / 1024.0f;
        assert_int_equal(llmt_model_set_param(r.m, "model.embed_tokens.weight", emb,
                                              (size_t)VOCAB * D),
                         LLMT_OK);
        free(emb);
        run_steps(&r, 2);
        s[k] = take(&r);
        run_free(&r);
    }
    assert_same(&s[0], &s[1], "weights set mid-run");
    drop(&s[0]);
    drop(&s[1]);
}

/* The trainer's configuration keys: optimizer.offload (none | optimizer)
 * and optimizer.offload_layers (all | K), checked against the model's
 * layers, and written back as read. */
static void test_config_keys(void **state)
{
    (void)state;
    llmt_train_config c;
    llmt_train_config_init(&c);
    assert_int_equal(c.version, LLMT_TRAIN_CONFIG_VERSION);
    assert_int_equal(c.optimizer.offload_parts, LLMT_OFFLOAD_NONE);
    assert_int_equal(c.optimizer.offload_layers, LLMT_OFFLOAD_ALL_LAYERS);
    const char *yaml = "optimizer:\n  offload: optimizer\n  offload_layers: 1\n";
    assert_int_equal(llmt_train_config_parse_yaml(&c, yaml, strlen(yaml), "run.yaml"), LLMT_OK);
    assert_int_equal(c.optimizer.offload_parts, LLMT_OFFLOAD_OPTIMIZER);
    assert_int_equal(c.optimizer.offload_layers, 1);
    assert_int_equal(llmt_train_config_check(&c), LLMT_OK);
    char text[8192];
    assert_int_equal(llmt_train_config_to_yaml(&c, text, sizeof text, NULL), LLMT_OK);
    assert_contains(text, "offload: optimizer");
    assert_contains(text, "offload_layers: 1");
    assert_int_equal(llmt_train_config_set(&c, "optimizer.offload_layers", "all"), LLMT_OK);
    assert_int_equal(c.optimizer.offload_layers, LLMT_OFFLOAD_ALL_LAYERS);
    assert_int_equal(llmt_train_config_to_yaml(&c, text, sizeof text, NULL), LLMT_OK);
    assert_contains(text, "offload_layers: all");
    assert_int_equal(llmt_train_config_set(&c, "optimizer.offload", "grads"), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "optimizer.offload");
    assert_int_equal(llmt_train_config_set(&c, "optimizer.offload_layers", "-1"), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "offload_layers");
    assert_int_equal(llmt_train_config_set(&c, "optimizer.offload_layers", "some"), LLMT_EINVAL);
    /* More layers than the model has: refused by the check. */
    assert_int_equal(llmt_train_config_set(&c, "optimizer.offload_layers", "9"), LLMT_OK);
    c.model.num_layers = 8;
    assert_int_equal(llmt_train_config_check(&c), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "optimizer.offload_layers = 9");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_placements_bitwise),
        cmocka_unit_test(test_migration_mid_run_bitwise),
        cmocka_unit_test(test_ordered_with_grads_bitwise),
        cmocka_unit_test(test_sharded_bitwise),
        cmocka_unit_test(test_accounting),
        cmocka_unit_test(test_budget_fits_only_with_offload),
        cmocka_unit_test(test_host_budget_refuses),
        cmocka_unit_test(test_checkpoint_across_placements),
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_context_versions),
        cmocka_unit_test(test_master_follows_set_weights),
        cmocka_unit_test(test_config_keys),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
