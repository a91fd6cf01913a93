/* The planner with optimizer offload: the plan of every placement (none, a
 * prefix of layers, all) equals the context's measured peak per category to
 * the byte after training steps with the optimizer so placed, host bytes
 * included; the offloaded bytes match a hand count of the parameters; a CUDA
 * plan adds the two double staging buffers (where this build has the CUDA plugin;
 * no GPU is needed); llmt_plan_fit_offload climbs recompute,
 * then offload, then halves the micro-batch; bad offload fields are named.
 * With gradient offload (OPTIMIZER | GRADS) the plan equals the measured
 * peaks of a step after llmt_optimizer_set_offload, its bytes match the
 * gradient split and bucket counted by hand, and the fit's rungs offload
 * the gradients too. A sharded optimizer's rank offloads the part of its
 * range inside the prefix (every rank against a hand count; rank -1 the
 * largest device peak), and with gradient offload every rank the whole
 * model's gradient prefix, as one process does.
 * cfg->host_budget keeps the fit's offload to what the host holds. */
#include <stdio.h>
#include <stdlib.h>

#include "test_util.h"

#include "llmt/llmt.h"
#include "test_context.h"
#include "test_rand.h"

enum { B = 8, T = 12, L = 3, V = 41, D = 32, KV = 16, F = 48 };

/* Parameters by hand: the embedding is stored first, then each layer (two
 * norms, q k v o, gate up down), the final norm and the untied LM head. */
#define EMBED ((int64_t)V * D)
#define PER_LAYER ((int64_t)2 * D + 2 * D * D + 2 * KV * D + 3 * F * D)
#define PARAMS (2 * EMBED + L * PER_LAYER + D)

static llmt_plan_config plan_config(int precision)
{
    llmt_plan_config pc = LLMT_PLAN_CONFIG_INIT;
    pc.model.vocab_size = V;
    pc.model.hidden_size = D;
    pc.model.num_layers = L;
    pc.model.num_heads = 4;
    pc.model.num_kv_heads = 2;
    pc.model.ffn_size = F;
    pc.model.max_seq_len = 16;
    pc.model.precision = precision;
    pc.seq_len = T;
    return pc;
}

/* The flat prefix whose state layers offloads, by hand. */
static int64_t prefix(int32_t layers)
{
    if (layers == LLMT_OFFLOAD_ALL_LAYERS)
        return PARAMS;
    return layers == 0 ? 0 : EMBED + layers * PER_LAYER;
}

/* Bytes of AdamW state per parameter: two moments (bf16 in bf16_pure, else
 * fp32) and an fp32 master copy in the mixed modes. */
static uint64_t state_bytes(int precision)
{
    if (precision == LLMT_PRECISION_BF16_PURE)
        return 4;
    return precision == LLMT_PRECISION_FP32 ? 8 : 12;
}

/* Bytes of a weight (and gradient) in the storage dtype. */
static uint64_t elem_bytes(int precision)
{
    return precision == LLMT_PRECISION_FP32 ? 4 : 2;
}

/* The gradient split of an offloaded prefix: rounded down to the 4096
 * elements of a granule. */
static int64_t grad_split(int64_t prefix_elems)
{
    return prefix_elems / 4096 * 4096;
}

/* The device bucket of gradient split gs, by hand: the largest bucket
 * (embedding, a layer, the tail of final norm and LM head) that starts
 * below gs; on a backend whose memory the host cannot read two slots (one
 * stored while backward writes the other), each at least min(gs, 2^20)
 * elements for the norm's uploads, plus 128 for alignment, rounded up to a
 * multiple of 128 (each slot starts on a 256-byte boundary). */
static int64_t bucket_elems(int64_t gs, int host_memory)
{
    if (gs == 0)
        return 0;
    int64_t most = 0, start = 0;
    const int64_t size[L + 2] = {EMBED, PER_LAYER, PER_LAYER, PER_LAYER, D + EMBED};
    for (int b = 0; b < L + 2; b++) {
        if (start < gs && size[b] > most)
            most = size[b];
        start += size[b];
    }
    if (host_memory)
        return most;
    /* And 128 elements (256 bytes of bf16) to keep each bucket's alignment. */
    int64_t stats = gs < (1 << 20) ? gs : (1 << 20);
    return 2 * (((stats > most ? stats : most) + 128 + 127) / 128 * 128);
}

/* Two training steps with the optimizer created at (parts, layers), or,
 * with `moved`, created without offload and moved there by
 * llmt_optimizer_set_offload (the peaks reset after the move): every
 * category's measured peak equals the plan, host_state included (with
 * gradient offload from creation, the model's gradients are never all on
 * the device), the device totals leave host_state out, and the plan's
 * optimizer, gradient and host bytes are those counted by hand. */
static void check_measured(int precision, int32_t policy, int32_t micro, int32_t parts,
                           int32_t layers, int moved)
{
    llmt_context *ctx = test_context(2, 1);
    llmt_plan_config pc = plan_config(precision);
    pc.recompute = policy;
    pc.micro_batch = micro;
    pc.offload_parts = parts;
    pc.offload_layers = layers;
    llmt_plan p = LLMT_PLAN_INIT;
    assert_int_equal(llmt_plan_compute(ctx, &pc, &p), LLMT_OK);
    assert_int_equal(p.num_params, PARAMS);
    const uint64_t e = elem_bytes(precision);
    int64_t host = parts ? prefix(layers) : 0;
    int64_t gs = parts & LLMT_OFFLOAD_GRADS ? grad_split(host) : 0;
    assert_int_equal(p.host_peak, (uint64_t)host * state_bytes(precision) +
                                      (uint64_t)gs * e); /* no staging */
    assert_int_equal(p.bytes[LLMT_MEM_HOST_STATE], p.host_peak);
    assert_int_equal(p.bytes[LLMT_MEM_OPTIMIZER],
                     (uint64_t)(PARAMS - host) * state_bytes(precision));
    assert_int_equal(p.bytes[LLMT_MEM_GRADS], (uint64_t)(PARAMS - gs + bucket_elems(gs, 1)) * e);

    llmt_model *m = NULL;
    llmt_optimizer *o = NULL;
    llmt_recompute *rc = NULL;
    llmt_slicer *sl = NULL;
    llmt_loss_scaler *sc = NULL;
    llmt_optimizer_config oc = LLMT_OPTIMIZER_CONFIG_INIT;
    oc.offload_parts = moved ? LLMT_OFFLOAD_NONE : parts;
    oc.offload_layers = layers;
    llmt_loss_scaler_config lc = LLMT_LOSS_SCALER_CONFIG_INIT;
    assert_int_equal(llmt_model_create(&m, ctx, &pc.model), LLMT_OK);
    assert_int_equal(llmt_optimizer_create(&o, m, &oc), LLMT_OK);
    assert_int_equal(llmt_recompute_create(&rc, m), LLMT_OK);
    assert_int_equal(llmt_recompute_set_layers(rc, 0, -1, policy), LLMT_OK);
    assert_int_equal(llmt_slicer_create(&sl, m, micro), LLMT_OK);
    assert_int_equal(llmt_loss_scaler_create(&sc, &lc), LLMT_OK);
    if (moved) {
        assert_int_equal(llmt_optimizer_set_offload(o, parts, layers), LLMT_OK);
        assert_int_equal(llmt_context_reset_peak(ctx), LLMT_OK);
    }
    int32_t tokens[B * T], targets[B * T];
    uint64_t seed = 7;
    for (int i = 0; i < B * T; i++) {
        tokens[i] = (int32_t)(trand_u64(&seed) % V);
        targets[i] = (int32_t)(trand_u64(&seed) % V);
    }
    for (int step = 0; step < 2; step++) {
        assert_int_equal(llmt_model_zero_grads(m), LLMT_OK);
        assert_int_equal(llmt_slicer_forward_backward(sl, tokens, targets, B, T,
                                                      llmt_loss_scaler_scale(sc), NULL), LLMT_OK);
        assert_int_equal(llmt_optimizer_step(o, sc, NULL), LLMT_OK);
    }
    llmt_memory_stats s = LLMT_MEMORY_STATS_INIT;
    assert_int_equal(llmt_context_memory_stats(ctx, &s), LLMT_OK);
    for (int cat = 0; cat < LLMT_MEM_CATEGORY_COUNT; cat++)
        if (s.peak[cat] != p.bytes[cat])
            fail_msg("precision %d, %s, micro-batch %d, offload %d/%d%s: %s planned %llu, "
                     "measured peak %llu", precision, llmt_recompute_policy_name(policy), micro,
                     parts, layers, moved ? " (moved)" : "", llmt_mem_category_name(cat),
                     (unsigned long long)p.bytes[cat], (unsigned long long)s.peak[cat]);
    assert_int_equal(s.total_peak, p.peak);
    assert_int_equal(s.peak[LLMT_MEM_HOST_STATE], p.host_peak);
    llmt_loss_scaler_free(sc);
    llmt_slicer_free(sl);
    llmt_recompute_free(rc);
    llmt_optimizer_free(o);
    llmt_model_free(m);
    llmt_context_free(ctx);
}

static void test_plan_equals_measured_with_offload(void **state)
{
    (void)state;
    const int precisions[4] = {LLMT_PRECISION_FP32, LLMT_PRECISION_BF16_MIXED,
                               LLMT_PRECISION_FP16_MIXED, LLMT_PRECISION_BF16_PURE};
    const int32_t layers[4] = {LLMT_OFFLOAD_ALL_LAYERS, 1, L, 0};
    for (int p = 0; p < 4; p++) {
        check_measured(precisions[p], LLMT_RECOMPUTE_NONE, 3, LLMT_OFFLOAD_NONE, 0, 0);
        for (int k = 0; k < 4; k++)
            check_measured(precisions[p], k % 2 ? LLMT_RECOMPUTE_FULL : LLMT_RECOMPUTE_FFN_ACT,
                           k % 2 ? 8 : 3, k < 2 ? LLMT_OFFLOAD_OPTIMIZER
                                              : LLMT_OFFLOAD_OPTIMIZER | LLMT_OFFLOAD_GRADS,
                           layers[(p + k) % 4], 0);
    }
}

static void test_plan_equals_measured_with_grads_offload(void **state)
{
    (void)state;
    const int precisions[4] = {LLMT_PRECISION_FP32, LLMT_PRECISION_BF16_MIXED,
                               LLMT_PRECISION_FP16_MIXED, LLMT_PRECISION_BF16_PURE};
    /* Gradient splits 8192 (a layer straddles it), 20480, 24576 (the tail
     * straddles it) and 0. */
    const int32_t layers[4] = {1, L, LLMT_OFFLOAD_ALL_LAYERS, 0};
    for (int p = 0; p < 4; p++)
        for (int k = 0; k < 4; k++)
            if ((p + k) % 2 == 0 || k == 2)
                check_measured(precisions[p], k % 2 ? LLMT_RECOMPUTE_FULL : LLMT_RECOMPUTE_NONE,
                               k % 2 ? 8 : 3, LLMT_OFFLOAD_OPTIMIZER | LLMT_OFFLOAD_GRADS,
                               layers[k], 1);
}

/* Gradient offload adds to the optimizer's offload exactly the gradients
 * below the split (less the bucket) on the device side and the split on
 * the host side; an ordered slicer over several micro-batches adds its
 * fp32 sum split the same way (the split's 4 bytes a parameter on the
 * host, the rest on the device), and the fits take it. */
static void test_grads_offload_bytes(void **state)
{
    (void)state;
    llmt_context *ctx = test_context(1, 1);
    llmt_plan_config pc = plan_config(LLMT_PRECISION_BF16_MIXED);
    pc.offload_parts = LLMT_OFFLOAD_OPTIMIZER;
    pc.offload_layers = 2;
    llmt_plan opt = LLMT_PLAN_INIT, both = LLMT_PLAN_INIT;
    assert_int_equal(llmt_plan_compute(ctx, &pc, &opt), LLMT_OK);
    pc.offload_parts = LLMT_OFFLOAD_OPTIMIZER | LLMT_OFFLOAD_GRADS;
    assert_int_equal(llmt_plan_compute(ctx, &pc, &both), LLMT_OK);
    const int64_t gs = 16384; /* the prefix, EMBED + 2 layers = 16800, in whole granules */
    assert_int_equal(grad_split(prefix(2)), gs);
    for (int cat = 0; cat < LLMT_MEM_CATEGORY_SLOTS; cat++)
        if (cat != LLMT_MEM_GRADS && cat != LLMT_MEM_HOST_STATE)
            assert_int_equal(both.bytes[cat], opt.bytes[cat]);
    assert_int_equal(both.bytes[LLMT_MEM_GRADS],
                     opt.bytes[LLMT_MEM_GRADS] - (uint64_t)(gs - PER_LAYER) * 2);
    assert_int_equal(both.host_peak, opt.host_peak + (uint64_t)gs * 2);
    assert_int_equal(both.peak, opt.peak - (uint64_t)(gs - PER_LAYER) * 2);
    /* Ordered accumulation: one micro-batch holds no sum; several hold it,
     * split at the gradients' split. */
    pc.ordered_accumulation = 1;
    pc.batch_size = pc.micro_batch;
    llmt_plan one = LLMT_PLAN_INIT, sliced = LLMT_PLAN_INIT;
    assert_int_equal(llmt_plan_compute(ctx, &pc, &one), LLMT_OK);
    assert_memory_equal(one.bytes, both.bytes, sizeof one.bytes);
    pc.batch_size = 2 * pc.micro_batch;
    assert_int_equal(llmt_plan_compute(ctx, &pc, &sliced), LLMT_OK);
    const int64_t n = sliced.num_params;
    assert_int_equal(sliced.bytes[LLMT_MEM_GRADS], both.bytes[LLMT_MEM_GRADS] + (uint64_t)(n - gs) * 4);
    assert_int_equal(sliced.host_peak, both.host_peak + (uint64_t)gs * 4);
    int32_t b, r, k;
    pc.batch_size = pc.micro_batch = 2; /* the fit may halve it */
    assert_int_equal(llmt_plan_fit_offload(ctx, &pc, UINT64_MAX, &b, &r, &k), LLMT_OK);
    assert_int_equal(llmt_plan_fit(ctx, &pc, UINT64_MAX, &b, &r), LLMT_OK);
    llmt_context_free(ctx);
}

/* The fit with gradient offload allowed: its offload rungs offload both,
 * so a budget one byte under the optimizer-only rung of one layer fits at
 * one layer, where optimizer offload alone needs more. */
static void test_fit_offload_with_grads(void **state)
{
    (void)state;
    llmt_context *ctx = test_context(2, 3);
    llmt_plan_config pc = plan_config(LLMT_PRECISION_FP32);
    pc.micro_batch = 8;
    pc.seq_len = 16;
    pc.recompute = LLMT_RECOMPUTE_FULL;
    pc.offload_parts = LLMT_OFFLOAD_OPTIMIZER;
    pc.offload_layers = 1;
    llmt_plan one = LLMT_PLAN_INIT, one_g = LLMT_PLAN_INIT;
    assert_int_equal(llmt_plan_compute(ctx, &pc, &one), LLMT_OK);
    pc.offload_parts = LLMT_OFFLOAD_OPTIMIZER | LLMT_OFFLOAD_GRADS;
    assert_int_equal(llmt_plan_compute(ctx, &pc, &one_g), LLMT_OK);
    assert_int_equal(one_g.peak, one.peak - (uint64_t)(8192 - PER_LAYER) * 4);
    int32_t b = 0, r = -1, k = -2;
    pc.offload_layers = LLMT_OFFLOAD_ALL_LAYERS; /* not read by the fit */
    assert_int_equal(llmt_plan_fit_offload(ctx, &pc, one.peak - 1, &b, &r, &k), LLMT_OK);
    assert_int_equal(b, 8);
    assert_int_equal(r, LLMT_RECOMPUTE_FULL);
    assert_int_equal(k, 1);
    pc.offload_parts = LLMT_OFFLOAD_OPTIMIZER;
    assert_int_equal(llmt_plan_fit_offload(ctx, &pc, one.peak - 1, &b, &r, &k), LLMT_OK);
    assert_true(k > 1 || k == LLMT_OFFLOAD_ALL_LAYERS);
    /* Nothing fits: the message names both offloaded. */
    pc.offload_parts = LLMT_OFFLOAD_OPTIMIZER | LLMT_OFFLOAD_GRADS;
    assert_int_equal(llmt_plan_fit_offload(ctx, &pc, 1000, &b, &r, &k), LLMT_ENOMEM);
    assert_contains(llmt_error_last(), "the optimizer and gradients offloaded");
    llmt_context_free(ctx);
}

/* Offload moves bytes from OPTIMIZER to HOST_STATE and changes nothing
 * else; the peak leaves host_state out. */
static void test_offload_moves_only_optimizer_bytes(void **state)
{
    (void)state;
    llmt_context *ctx = test_context(1, 1);
    llmt_plan_config pc = plan_config(LLMT_PRECISION_BF16_MIXED);
    llmt_plan none = LLMT_PLAN_INIT, half = LLMT_PLAN_INIT;
    assert_int_equal(llmt_plan_compute(ctx, &pc, &none), LLMT_OK);
    assert_int_equal(none.host_peak, 0);
    pc.offload_parts = LLMT_OFFLOAD_OPTIMIZER;
    pc.offload_layers = 2;
    assert_int_equal(llmt_plan_compute(ctx, &pc, &half), LLMT_OK);
    uint64_t moved = (uint64_t)(EMBED + 2 * PER_LAYER) * 12;
    for (int cat = 0; cat < LLMT_MEM_CATEGORY_SLOTS; cat++)
        if (cat != LLMT_MEM_OPTIMIZER && cat != LLMT_MEM_HOST_STATE)
            assert_int_equal(half.bytes[cat], none.bytes[cat]);
    assert_int_equal(half.bytes[LLMT_MEM_OPTIMIZER], none.bytes[LLMT_MEM_OPTIMIZER] - moved);
    assert_int_equal(half.bytes[LLMT_MEM_HOST_STATE], moved);
    assert_int_equal(half.host_peak, moved);
    assert_int_equal(half.peak, none.peak - moved);
    /* A version 2 plan has no host_peak: the bytes after it are untouched. */
    struct {
        llmt_plan p;
        uint64_t guard;
    } old;
    memset(&old, 0xab, sizeof old);
    old.p.version = 2;
    assert_int_equal(llmt_plan_compute(ctx, &pc, &old.p), LLMT_OK);
    assert_int_equal(old.p.peak, half.peak);
    assert_int_equal(old.p.host_peak, 0xababababababababull);
    /* A version 2 config ends before the offload fields: no offload. */
    pc.version = 2;
    llmt_plan v2 = LLMT_PLAN_INIT;
    assert_int_equal(llmt_plan_compute(ctx, &pc, &v2), LLMT_OK);
    assert_int_equal(v2.host_peak, 0);
    assert_int_equal(v2.peak, none.peak);
    llmt_context_free(ctx);
}

/* One rank of a sharded optimizer over world ranks, its state offloaded
 * for layers with offload parts: for each rank, the plan's range
 * [first, end) with the hand prefix clamped to it, split, gives OPTIMIZER =
 * the state of [split, end) and HOST_STATE = that of [first, split) (no
 * staging on the CPU); with LLMT_OFFLOAD_GRADS, HOST_STATE holds the
 * gradients of the whole model's prefix up to its granule too, and GRADS
 * trades them for the bucket, on every rank alike (by hand); the range and
 * every other category are those of the same rank without offload. Rank -1
 * is the lowest rank whose plan has the largest device peak, which is
 * want_largest (the gradients weigh the same on every rank). */
static void check_sharded_offload(llmt_context *ctx, int precision, int32_t parts, int32_t world,
                                  int32_t layers, int32_t want_largest)
{
    enum { MAX_WORLD = 16 };
    assert_true(world <= MAX_WORLD);
    llmt_plan_config pc = plan_config(precision);
    pc.world_size = world;
    const uint64_t per = state_bytes(precision), e = elem_bytes(precision);
    const int64_t pre = prefix(layers);
    const int64_t gs = parts & LLMT_OFFLOAD_GRADS ? grad_split(pre) : 0;
    const uint64_t grad_host = (uint64_t)gs * e, bucket = (uint64_t)bucket_elems(gs, 1) * e;
    llmt_plan got[MAX_WORLD];
    int32_t largest = 0;
    for (int32_t r = 0; r < world; r++) {
        llmt_plan none = LLMT_PLAN_INIT;
        got[r] = none;
        pc.rank = r;
        pc.offload_parts = LLMT_OFFLOAD_NONE;
        pc.offload_layers = LLMT_OFFLOAD_ALL_LAYERS;
        assert_int_equal(llmt_plan_compute(ctx, &pc, &none), LLMT_OK);
        pc.offload_parts = parts;
        pc.offload_layers = layers;
        assert_int_equal(llmt_plan_compute(ctx, &pc, &got[r]), LLMT_OK);
        const llmt_plan *g = &got[r];
        const int64_t first = g->shard_first, end = g->shard_end;
        const int64_t split = pre < first ? first : pre > end ? end : pre;
        assert_int_equal(g->rank, r);
        assert_int_equal(first, none.shard_first);
        assert_int_equal(end, none.shard_end);
        assert_int_equal(none.bytes[LLMT_MEM_OPTIMIZER], (uint64_t)(end - first) * per);
        const uint64_t host = (uint64_t)(split - first) * per + grad_host;
        const uint64_t grads = none.bytes[LLMT_MEM_GRADS] - grad_host + bucket;
        if (g->bytes[LLMT_MEM_OPTIMIZER] != (uint64_t)(end - split) * per ||
            g->bytes[LLMT_MEM_HOST_STATE] != host || g->host_peak != host ||
            g->bytes[LLMT_MEM_GRADS] != grads)
            fail_msg("precision %d, parts %d, %d ranks, rank %d [%lld, %lld), offload %d layers "
                     "(prefix %lld): optimizer %llu, host %llu (host_peak %llu), gradients %llu, "
                     "by hand %llu, %llu and %llu", precision, parts, world, r, (long long)first,
                     (long long)end, layers, (long long)pre,
                     (unsigned long long)g->bytes[LLMT_MEM_OPTIMIZER],
                     (unsigned long long)g->bytes[LLMT_MEM_HOST_STATE],
                     (unsigned long long)g->host_peak,
                     (unsigned long long)g->bytes[LLMT_MEM_GRADS],
                     (unsigned long long)((end - split) * per), (unsigned long long)host,
                     (unsigned long long)grads);
        for (int cat = 0; cat < LLMT_MEM_CATEGORY_SLOTS; cat++)
            if (cat != LLMT_MEM_OPTIMIZER && cat != LLMT_MEM_HOST_STATE && cat != LLMT_MEM_GRADS)
                assert_int_equal(g->bytes[cat], none.bytes[cat]);
        assert_int_equal(g->peak, none.peak - (uint64_t)(split - first) * per - grad_host + bucket);
        if (g->peak > got[largest].peak)
            largest = r;
    }
    assert_int_equal(largest, want_largest);
    llmt_plan any = LLMT_PLAN_INIT;
    pc.rank = -1;
    assert_int_equal(llmt_plan_compute(ctx, &pc, &any), LLMT_OK);
    assert_int_equal(any.rank, largest);
    assert_int_equal(any.shard_first, got[largest].shard_first);
    for (int cat = 0; cat < LLMT_MEM_CATEGORY_SLOTS; cat++)
        assert_int_equal(any.bytes[cat], got[largest].bytes[cat]);
    assert_int_equal(any.peak, got[largest].peak);
}

/* 7 granules (25888 parameters) over 1, 2, 3 and 16 ranks, with prefixes 0,
 * 9056 (the embedding and layer 0), 16800, 24544 (all layers, not the tail)
 * and 25888 (all): ranks wholly inside the prefix, past it, and split by it.
 * The largest rank is the last on 2 and 3 ranks (it holds the most, the
 * partial granule included, and is offloaded last). On 16 ranks, ranks 2,
 * 4, 6, 9, 11 and 13 own a granule each and 15 the last 1312 elements:
 * without offload, or all of it, rank 2 (the lowest with a whole granule)
 * is the largest; otherwise the lowest that keeps the most state on the
 * device: 9 (the first granule past 9056), 13 (past 16800), 13 again (its
 * [20480, 24576) split at 24544 keeps 32 elements', rank 15's smaller
 * gradient sum and receive buffer weigh less). */
static void test_sharded_offload_per_rank(void **state)
{
    (void)state;
    llmt_context *ctx = test_context(1, 1);
    const int precisions[4] = {LLMT_PRECISION_FP32, LLMT_PRECISION_BF16_MIXED,
                               LLMT_PRECISION_FP16_MIXED, LLMT_PRECISION_BF16_PURE};
    const int32_t layers[5] = {0, 1, 2, L, LLMT_OFFLOAD_ALL_LAYERS};
    const int32_t largest_of_16[5] = {2, 9, 13, 13, 2};
    const int32_t parts[2] = {LLMT_OFFLOAD_OPTIMIZER, LLMT_OFFLOAD_OPTIMIZER | LLMT_OFFLOAD_GRADS};
    for (int p = 0; p < 4; p++)
        for (int k = 0; k < 5; k++)
            for (int g = 0; g < 2; g++) {
                check_sharded_offload(ctx, precisions[p], parts[g], 1, layers[k], 0);
                check_sharded_offload(ctx, precisions[p], parts[g], 2, layers[k], 1);
                check_sharded_offload(ctx, precisions[p], parts[g], 3, layers[k], 2);
                check_sharded_offload(ctx, precisions[p], parts[g], 16, layers[k],
                                      largest_of_16[k]);
            }
    llmt_context_free(ctx);
}

/* On CUDA (whose memory the host cannot read) the host segment comes with
 * two staging buffers (gradients in, weights out) of two halves each (the
 * copies of one chunk overlap the host's AdamW on the next), a half being
 * min(segment, 2^22) weight elements, and gradient offload with a device
 * bucket of two slots. */
static void test_cuda_staging(void **state)
{
    (void)state;
#ifdef LLMT_TEST_HAVE_CUDA_PLUGIN
    llmt_plan_config pc = plan_config(LLMT_PRECISION_BF16_MIXED);
    pc.offload_parts = LLMT_OFFLOAD_OPTIMIZER;
    pc.offload_layers = 1;
    llmt_plan cpu = LLMT_PLAN_INIT, cuda = LLMT_PLAN_INIT;
    assert_int_equal(llmt_plan_compute_backend(LLMT_BACKEND_CPU, 1, &pc, &cpu), LLMT_OK);
    assert_int_equal(llmt_plan_compute_backend(LLMT_BACKEND_CUDA, 1, &pc, &cuda), LLMT_OK);
    uint64_t host = (uint64_t)(EMBED + PER_LAYER);
    assert_int_equal(cpu.host_peak, host * 12);
    assert_int_equal(cuda.host_peak, host * 12 + 2 * 2 * host * 2);
    assert_int_equal(cuda.bytes[LLMT_MEM_OPTIMIZER], cpu.bytes[LLMT_MEM_OPTIMIZER]);
    /* With the gradients (split 8192): each of the device bucket's two
     * slots also holds the norm's uploads of min(split, 2^20) host
     * gradients, so it is the split, not layer 0's 7744 gradients as on the
     * CPU, and 128 elements more that keep each bucket's alignment (8320, a
     * multiple of 128). */
    pc.offload_parts = LLMT_OFFLOAD_OPTIMIZER | LLMT_OFFLOAD_GRADS;
    assert_int_equal(llmt_plan_compute_backend(LLMT_BACKEND_CUDA, 1, &pc, &cuda), LLMT_OK);
    assert_int_equal(bucket_elems(8192, 0), 2 * (8192 + 128));
    assert_int_equal(cuda.bytes[LLMT_MEM_GRADS], (uint64_t)(PARAMS - 8192 + 2 * 8320) * 2);
    assert_int_equal(cuda.host_peak, host * 12 + 2 * 2 * host * 2 + 8192 * 2);
    pc.offload_parts = LLMT_OFFLOAD_OPTIMIZER;
    /* A sharded rank stages its own host segment: on 3 ranks rank 1 owns
     * [8192, 16384), of which [8192, 9056) is offloaded; rank 2 nothing. */
    pc.world_size = 3;
    pc.rank = 1;
    assert_int_equal(llmt_plan_compute_backend(LLMT_BACKEND_CUDA, 1, &pc, &cuda), LLMT_OK);
    assert_int_equal(cuda.host_peak, 864 * 12 + 2 * 2 * 864 * 2);
    pc.rank = 2;
    assert_int_equal(llmt_plan_compute_backend(LLMT_BACKEND_CUDA, 1, &pc, &cuda), LLMT_OK);
    assert_int_equal(cuda.host_peak, 0);
    pc.world_size = 0;
    pc.rank = -1;
    /* LLaMA-7B, all offloaded: the staging is capped at 2^22 elements. */
    pc.model.vocab_size = 32000, pc.model.hidden_size = 4096, pc.model.num_layers = 32;
    pc.model.num_heads = pc.model.num_kv_heads = 32, pc.model.ffn_size = 11008;
    pc.model.max_seq_len = pc.seq_len = 2048;
    pc.micro_batch = 1;
    pc.recompute = LLMT_RECOMPUTE_FULL;
    pc.offload_layers = LLMT_OFFLOAD_ALL_LAYERS;
    assert_int_equal(llmt_plan_compute_backend(LLMT_BACKEND_CUDA, 1, &pc, &cuda), LLMT_OK);
    assert_int_equal(cuda.num_params, 6738415616);
    assert_int_equal(cuda.host_peak, 6738415616ull * 12 + 2 * 2 * (1ull << 22) * 2);
    assert_int_equal(cuda.bytes[LLMT_MEM_OPTIMIZER], 0);
    /* And its gradients: 1,645,121 whole granules, all on the host; two
     * slots of a layer's 202,383,360 gradients and 128 (a multiple of 128). */
    pc.offload_parts = LLMT_OFFLOAD_OPTIMIZER | LLMT_OFFLOAD_GRADS;
    assert_int_equal(llmt_plan_compute_backend(LLMT_BACKEND_CUDA, 1, &pc, &cuda), LLMT_OK);
    assert_int_equal(cuda.bytes[LLMT_MEM_GRADS], 2ull * (202383360 + 128) * 2);
    assert_int_equal(cuda.host_peak, 6738415616ull * 14 + 2 * 2 * (1ull << 22) * 2);
#else
    /* This build has no CUDA plugin: a CUDA plan is refused, naming why. */
    llmt_plan_config pc = plan_config(LLMT_PRECISION_BF16_MIXED);
    pc.offload_parts = LLMT_OFFLOAD_OPTIMIZER;
    llmt_plan p = LLMT_PLAN_INIT;
    assert_int_equal(llmt_plan_compute_backend(LLMT_BACKEND_CUDA, 1, &pc, &p), LLMT_EUNSUPPORTED);
    assert_contains(llmt_error_last(), "-DLLMT_CUDA=ON");
#endif
}

/* The rung just lighter than (recompute, layers) at micro-batch b in the
 * fit's ladder, and whether there is one at b. */
static int lighter_rung(int32_t recompute, int32_t layers, llmt_plan_config *c)
{
    static const int32_t ladder[5] = {
        LLMT_RECOMPUTE_NONE, LLMT_RECOMPUTE_FFN_ACT,
        LLMT_RECOMPUTE_FFN_ACT | LLMT_RECOMPUTE_ATTN_CORE,
        LLMT_RECOMPUTE_ATTN_CORE | LLMT_RECOMPUTE_FFN, LLMT_RECOMPUTE_FULL};
    c->offload_parts = LLMT_OFFLOAD_OPTIMIZER;
    if (layers == LLMT_OFFLOAD_ALL_LAYERS || layers > 1) {
        c->recompute = LLMT_RECOMPUTE_FULL;
        c->offload_layers = layers == LLMT_OFFLOAD_ALL_LAYERS ? L : layers - 1;
        return 1;
    }
    c->offload_layers = 0;
    if (layers == 1) {
        c->recompute = LLMT_RECOMPUTE_FULL;
        return 1;
    }
    for (int i = 1; i < 5; i++)
        if (ladder[i] == recompute) {
            c->recompute = ladder[i - 1];
            return 1;
        }
    return 0;
}

/* Fits budget and checks the answer: its plan fits, the next lighter rung
 * at the same micro-batch does not, and neither does the heaviest rung at
 * the micro-batch before the last halving. */
static void fit_and_check(llmt_context *ctx, llmt_plan_config pc, uint64_t budget, int32_t *b,
                          int32_t *r, int32_t *k)
{
    int32_t start = pc.micro_batch;
    assert_int_equal(llmt_plan_fit_offload(ctx, &pc, budget, b, r, k), LLMT_OK);
    pc.micro_batch = *b;
    pc.batch_size = start;
    pc.recompute = *r;
    pc.offload_layers = *k;
    llmt_plan p = LLMT_PLAN_INIT;
    assert_int_equal(llmt_plan_compute(ctx, &pc, &p), LLMT_OK);
    assert_true(p.peak <= budget);
    if (lighter_rung(*r, *k, &pc)) {
        assert_int_equal(llmt_plan_compute(ctx, &pc, &p), LLMT_OK);
        assert_true(p.peak > budget);
    }
    if (*b < start) {
        pc.micro_batch = *b * 2 <= start ? *b * 2 : start;
        pc.recompute = LLMT_RECOMPUTE_FULL;
        pc.offload_layers = LLMT_OFFLOAD_ALL_LAYERS;
        assert_int_equal(llmt_plan_compute(ctx, &pc, &p), LLMT_OK);
        assert_true(p.peak > budget);
    }
}

static void test_fit_offload_ladder(void **state)
{
    (void)state;
    llmt_context *ctx = test_context(2, 3);
    llmt_plan_config pc = plan_config(LLMT_PRECISION_FP32);
    pc.micro_batch = 8;
    pc.seq_len = 16;
    pc.offload_parts = LLMT_OFFLOAD_OPTIMIZER;
    llmt_plan full = LLMT_PLAN_INIT, one = LLMT_PLAN_INIT, all = LLMT_PLAN_INIT;
    pc.recompute = LLMT_RECOMPUTE_FULL;
    pc.offload_layers = 0;
    assert_int_equal(llmt_plan_compute(ctx, &pc, &full), LLMT_OK);
    pc.offload_layers = 1;
    assert_int_equal(llmt_plan_compute(ctx, &pc, &one), LLMT_OK);
    pc.offload_layers = LLMT_OFFLOAD_ALL_LAYERS;
    assert_int_equal(llmt_plan_compute(ctx, &pc, &all), LLMT_OK);
    assert_true(one.peak < full.peak && all.peak < one.peak);
    pc.offload_layers = 2; /* not read by the fit */
    int32_t b = 0, r = -1, k = -2;

    /* Just under full recompute: offload of one layer, not a halving, where
     * llmt_plan_fit halves. */
    fit_and_check(ctx, pc, full.peak - 1, &b, &r, &k);
    assert_int_equal(b, 8);
    assert_int_equal(r, LLMT_RECOMPUTE_FULL);
    assert_int_equal(k, 1);
    llmt_plan_config no_offload = pc;
    no_offload.offload_parts = LLMT_OFFLOAD_NONE;
    assert_int_equal(llmt_plan_fit(ctx, &no_offload, full.peak - 1, &b, &r), LLMT_OK);
    assert_true(b < 8);
    /* Just under one layer: two; at the all-offloaded plan: all. */
    fit_and_check(ctx, pc, one.peak - 1, &b, &r, &k);
    assert_int_equal(b, 8);
    assert_true(k >= 2 || k == LLMT_OFFLOAD_ALL_LAYERS);
    fit_and_check(ctx, pc, all.peak, &b, &r, &k);
    assert_int_equal(b, 8);
    assert_int_equal(k, LLMT_OFFLOAD_ALL_LAYERS);
    /* Under even that: the micro-batch halves, and the ladder starts again
     * (no offload when the smaller micro-batch fits without). */
    fit_and_check(ctx, pc, all.peak - 1, &b, &r, &k);
    assert_true(b < 8);
    /* A budget that fits everything: the lightest rung. */
    fit_and_check(ctx, pc, UINT64_MAX, &b, &r, &k);
    assert_int_equal(b, 8);
    assert_int_equal(r, LLMT_RECOMPUTE_NONE);
    assert_int_equal(k, 0);
    /* Without offload allowed it is llmt_plan_fit. */
    pc.offload_parts = LLMT_OFFLOAD_NONE;
    int32_t b2 = 0, r2 = -1;
    assert_int_equal(llmt_plan_fit_offload(ctx, &pc, full.peak - 1, &b, &r, &k), LLMT_OK);
    assert_int_equal(llmt_plan_fit(ctx, &pc, full.peak - 1, &b2, &r2), LLMT_OK);
    assert_int_equal(b, b2);
    assert_int_equal(r, r2);
    assert_int_equal(k, 0);
    /* Nothing fits: the message gives the all-offloaded plan. */
    pc.offload_parts = LLMT_OFFLOAD_OPTIMIZER;
    assert_int_equal(llmt_plan_fit_offload(ctx, &pc, 1000, &b, &r, &k), LLMT_ENOMEM);
    assert_contains(llmt_error_last(), "full recompute and the optimizer offloaded");
    /* Without a context, the same answer. */
    int32_t b3 = 0, r3 = -1, k3 = -2;
    fit_and_check(ctx, pc, one.peak - 1, &b, &r, &k);
    assert_int_equal(llmt_plan_fit_offload_backend(LLMT_BACKEND_CPU, 2, &pc, one.peak - 1, &b3,
                                                   &r3, &k3), LLMT_OK);
    assert_int_equal(b3, b);
    assert_int_equal(r3, r);
    assert_int_equal(k3, k);
    llmt_context_free(ctx);
}

/* The plan of micro-batch b, recompute r and offload rung k of pc. */
static llmt_plan plan_of(llmt_context *ctx, llmt_plan_config pc, int32_t b, int32_t r, int32_t k)
{
    pc.batch_size = pc.micro_batch;
    pc.micro_batch = b;
    pc.recompute = r;
    pc.offload_layers = k;
    llmt_plan p = LLMT_PLAN_INIT;
    assert_int_equal(llmt_plan_compute(ctx, &pc, &p), LLMT_OK);
    return p;
}

/* cfg->host_budget limits the host bytes of the fit's offload rungs: the
 * rungs the host cannot hold are passed over (the micro-batch halves when
 * no other fits), the bound is inclusive, 1 byte leaves no offload at all,
 * a version 3 struct has no host budget, and the failure names it. */
static void test_fit_offload_host_budget(void **state)
{
    (void)state;
    llmt_context *ctx = test_context(2, 3);
    llmt_plan_config pc = plan_config(LLMT_PRECISION_FP32);
    pc.micro_batch = 8;
    pc.seq_len = 16;
    pc.offload_parts = LLMT_OFFLOAD_OPTIMIZER;
    llmt_plan one = plan_of(ctx, pc, 8, LLMT_RECOMPUTE_FULL, 1);
    int32_t b = 0, r = -1, k = -2;
    /* Unlimited: two layers or more offloaded at micro-batch 8. */
    assert_int_equal(llmt_plan_fit_offload(ctx, &pc, one.peak - 1, &b, &r, &k), LLMT_OK);
    assert_int_equal(b, 8);
    assert_true(k >= 2 || k == LLMT_OFFLOAD_ALL_LAYERS);
    int32_t k0 = k;
    uint64_t host0 = plan_of(ctx, pc, 8, LLMT_RECOMPUTE_FULL, k0).host_peak;
    assert_true(host0 > one.host_peak);

    /* A host budget of exactly those bytes: the same answer. */
    pc.host_budget = host0;
    assert_int_equal(llmt_plan_fit_offload(ctx, &pc, one.peak - 1, &b, &r, &k), LLMT_OK);
    assert_int_equal(b, 8);
    assert_int_equal(k, k0);

    /* One byte less: no rung at micro-batch 8 fits both (the lighter ones
     * not the device, the heavier ones not the host), so it halves; the
     * answer fits both budgets, and its lighter rung does not. */
    pc.host_budget = host0 - 1;
    assert_int_equal(llmt_plan_fit_offload(ctx, &pc, one.peak - 1, &b, &r, &k), LLMT_OK);
    assert_true(b < 8);
    llmt_plan got = plan_of(ctx, pc, b, r, k);
    assert_true(got.peak <= one.peak - 1 && got.host_peak <= host0 - 1);
    llmt_plan_config lighter = pc;
    if (lighter_rung(r, k, &lighter)) {
        llmt_plan p = plan_of(ctx, pc, b, lighter.recompute, lighter.offload_layers);
        assert_true(p.peak > one.peak - 1 || p.host_peak > host0 - 1);
    }
    for (int32_t kk = 1; kk <= L; kk++) { /* micro-batch 8 has no rung that fits both */
        llmt_plan p = plan_of(ctx, pc, 8, LLMT_RECOMPUTE_FULL, kk);
        assert_true(p.peak > one.peak - 1 || p.host_peak > host0 - 1);
    }

    /* One byte: no offload rung is held, so it is llmt_plan_fit's answer. */
    pc.host_budget = 1;
    assert_int_equal(llmt_plan_fit_offload(ctx, &pc, one.peak - 1, &b, &r, &k), LLMT_OK);
    assert_int_equal(k, 0);
    llmt_plan_config none = pc;
    none.offload_parts = LLMT_OFFLOAD_NONE;
    int32_t b2 = 0, r2 = -1;
    assert_int_equal(llmt_plan_fit(ctx, &none, one.peak - 1, &b2, &r2), LLMT_OK);
    assert_int_equal(b, b2);
    assert_int_equal(r, r2);

    /* A version 3 struct ends before host_budget: the unlimited answer. */
    pc.version = 3;
    assert_int_equal(llmt_plan_fit_offload(ctx, &pc, one.peak - 1, &b, &r, &k), LLMT_OK);
    assert_int_equal(b, 8);
    assert_int_equal(k, k0);
    pc.version = LLMT_PLAN_CONFIG_VERSION;

    /* Nothing fits: the message names the host budget. */
    assert_int_equal(llmt_plan_fit_offload(ctx, &pc, 1000, &b, &r, &k), LLMT_ENOMEM);
    assert_contains(llmt_error_last(), "nothing fits 1000 bytes with a host budget of 1:");

    /* llmt_plan_fit keeps cfg's placement: it fits only if the host holds it. */
    pc.offload_layers = LLMT_OFFLOAD_ALL_LAYERS;
    llmt_plan all = plan_of(ctx, pc, 8, LLMT_RECOMPUTE_NONE, LLMT_OFFLOAD_ALL_LAYERS);
    pc.host_budget = all.host_peak;
    assert_int_equal(llmt_plan_fit(ctx, &pc, UINT64_MAX, &b, &r), LLMT_OK);
    assert_int_equal(b, 8);
    assert_int_equal(r, LLMT_RECOMPUTE_NONE);
    pc.host_budget = all.host_peak - 1;
    assert_int_equal(llmt_plan_fit(ctx, &pc, UINT64_MAX, &b, &r), LLMT_ENOMEM);
    assert_contains(llmt_error_last(), "with a host budget of");
    llmt_context_free(ctx);
}

/* The most host bytes of any rank of pc (world_size ranks) at micro-batch
 * b, recompute r and offload rung k, each rank planned by itself. */
static uint64_t most_rank_host(llmt_context *ctx, llmt_plan_config pc, int32_t b, int32_t r,
                               int32_t k)
{
    uint64_t most = 0;
    for (pc.rank = 0; pc.rank < pc.world_size; pc.rank++) {
        uint64_t h = plan_of(ctx, pc, b, r, k).host_peak;
        most = h > most ? h : most;
    }
    return most;
}

/* With world_size and rank -1 the host budget holds for every rank: the
 * planned rank (the largest device peak) holds the least offloaded state,
 * so its host bytes are not the ones to check. With the gradients (parts)
 * every rank's host holds the whole prefix's too. */
static void fit_host_budget_every_rank(int32_t parts)
{
    llmt_context *ctx = test_context(2, 3);
    llmt_plan_config pc = plan_config(LLMT_PRECISION_FP32);
    pc.world_size = 4;
    pc.offload_parts = parts;
    pc.offload_layers = 1;
    uint64_t most = most_rank_host(ctx, pc, 1, LLMT_RECOMPUTE_NONE, 1);
    llmt_plan planned = plan_of(ctx, pc, 1, LLMT_RECOMPUTE_NONE, 1);
    assert_true(planned.host_peak < most); /* the case that matters */
    int32_t b = 0, r = -1, k = -2;
    /* llmt_plan_fit keeps the placement: every rank's host must hold it. */
    pc.host_budget = most;
    assert_int_equal(llmt_plan_fit(ctx, &pc, UINT64_MAX, &b, &r), LLMT_OK);
    pc.host_budget = most - 1;
    assert_int_equal(llmt_plan_fit(ctx, &pc, UINT64_MAX, &b, &r), LLMT_ENOMEM);
    assert_contains(llmt_error_last(), "with a host budget of");
    /* llmt_plan_fit_offload: its answer fits every rank's host. */
    pc.micro_batch = 4;
    llmt_plan all = plan_of(ctx, pc, 4, LLMT_RECOMPUTE_FULL, LLMT_OFFLOAD_ALL_LAYERS);
    pc.host_budget = 0;
    assert_int_equal(llmt_plan_fit_offload(ctx, &pc, all.peak, &b, &r, &k), LLMT_OK);
    assert_true(k != 0);
    uint64_t need = most_rank_host(ctx, pc, b, r, k);
    pc.host_budget = need - 1;
    assert_int_equal(llmt_plan_fit_offload(ctx, &pc, all.peak, &b, &r, &k), LLMT_OK);
    assert_true(plan_of(ctx, pc, b, r, k).peak <= all.peak);
    assert_true(most_rank_host(ctx, pc, b, r, k) <= need - 1);
    llmt_context_free(ctx);
}

static void test_fit_host_budget_every_rank(void **state)
{
    (void)state;
    fit_host_budget_every_rank(LLMT_OFFLOAD_OPTIMIZER);
    fit_host_budget_every_rank(LLMT_OFFLOAD_OPTIMIZER | LLMT_OFFLOAD_GRADS);
}

static void test_invalid_offload_fields(void **state)
{
    (void)state;
    llmt_context *ctx = test_context(1, 3);
    llmt_plan_config pc = plan_config(LLMT_PRECISION_FP32);
    llmt_plan p = LLMT_PLAN_INIT;
    pc.offload_parts = LLMT_OFFLOAD_GRADS;
    assert_int_equal(llmt_plan_compute(ctx, &pc, &p), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "cfg->offload_parts = LLMT_OFFLOAD_GRADS alone");
    assert_contains(llmt_error_last(), "needs LLMT_OFFLOAD_OPTIMIZER");
    pc.offload_parts = 4;
    assert_int_equal(llmt_plan_compute(ctx, &pc, &p), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "cfg->offload_parts = 4");
    pc.offload_parts = LLMT_OFFLOAD_OPTIMIZER;
    pc.offload_layers = L + 1;
    assert_int_equal(llmt_plan_compute(ctx, &pc, &p), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "cfg->offload_layers = 4");
    pc.offload_layers = -2;
    assert_int_equal(llmt_plan_compute(ctx, &pc, &p), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "cfg->offload_layers = -2");
    pc.offload_layers = LLMT_OFFLOAD_ALL_LAYERS;
    pc.with_optimizer = 0;
    assert_int_equal(llmt_plan_compute(ctx, &pc, &p), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "needs cfg->with_optimizer = 1");
    pc.with_optimizer = 1;
    int32_t b, r, k;
    pc.offload_parts = LLMT_OFFLOAD_OPTIMIZER;
    pc.world_size = 0;
    assert_int_equal(llmt_plan_fit_offload(ctx, &pc, 1u << 30, &b, &r, NULL), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "offload_layers is NULL");
    assert_int_equal(llmt_plan_fit_offload(NULL, &pc, 1u << 30, &b, &r, &k), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "ctx is NULL");
    assert_int_equal(llmt_plan_fit_offload_backend(7, 1, &pc, 1u << 30, &b, &r, &k), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "backend = 7");
    pc.version = LLMT_PLAN_CONFIG_VERSION + 1;
    assert_int_equal(llmt_plan_compute(ctx, &pc, &p), LLMT_EVERSION);
    llmt_context_free(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plan_equals_measured_with_offload),
        cmocka_unit_test(test_offload_moves_only_optimizer_bytes),
        cmocka_unit_test(test_plan_equals_measured_with_grads_offload),
        cmocka_unit_test(test_grads_offload_bytes),
        cmocka_unit_test(test_sharded_offload_per_rank),
        cmocka_unit_test(test_fit_offload_with_grads),
        cmocka_unit_test(test_cuda_staging),
        cmocka_unit_test(test_fit_offload_ladder),
        cmocka_unit_test(test_fit_offload_host_budget),
        cmocka_unit_test(test_fit_host_budget_every_rank),
        cmocka_unit_test(test_invalid_offload_fields),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
