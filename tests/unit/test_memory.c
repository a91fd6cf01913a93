/* Memory reduction and prediction: recompute gives bit-identical gradients,
 * slicing gives the unsliced gradient, the planner equals the measured peak
 * per category to the byte, the arena is reused, and fit chooses the
 * largest micro-batch with the lightest recompute. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "test_util.h"

#include "llmt/llmt.h"
#include "model/model_internal.h"
#include "test_context.h"
#include "test_rand.h"
#include "test_tensors.h"

enum { B = 8, T = 12 };

static llmt_model_config config(int precision)
{
    llmt_model_config c = LLMT_MODEL_CONFIG_INIT;
    c.vocab_size = 41;
    c.hidden_size = 32;
    c.num_layers = 3;
    c.num_heads = 4;
    c.num_kv_heads = 2;
    c.ffn_size = 48;
    c.max_seq_len = 16;
    c.precision = precision;
    return c;
}

static void batch(int32_t *tokens, int32_t *targets, uint64_t seed)
{
    uint64_t s = seed;
    for (int i = 0; i < B * T; i++) {
        tokens[i] = (int32_t)(trand_u64(&s) % 41);
        targets[i] = (int32_t)(trand_u64(&s) % 41);
    }
    targets[3] = targets[40] = targets[41] = targets[95] = -1; /* ignored, in several slices */
}

/* All gradients, raw bytes (in the model's dtype), in parameter order. */
static void *raw_grads(llmt_model *m, size_t *bytes)
{
    *bytes = m->grads.bytes;
    void *out = malloc(*bytes);
    memcpy(out, m->grads.ptr, *bytes);
    return out;
}

static void test_recompute_bit_identical(void **state)
{
    (void)state;
    const int precisions[2] = {LLMT_PRECISION_FP32, LLMT_PRECISION_BF16_MIXED};
    int32_t tokens[B * T], targets[B * T];
    batch(tokens, targets, 5);
    for (int p = 0; p < 2; p++) {
        llmt_context *ctx = test_context(2, 9);
        llmt_model_config c = config(precisions[p]);
        llmt_model *m = NULL;
        llmt_recompute *rc = NULL;
        assert_int_equal(llmt_model_create(&m, ctx, &c), LLMT_OK);
        assert_int_equal(llmt_recompute_create(&rc, m), LLMT_OK);
        double ref_loss = 0;
        assert_int_equal(llmt_model_forward_backward(m, tokens, targets, B, T, 1, 0, &ref_loss), LLMT_OK);
        size_t n = 0;
        void *ref = raw_grads(m, &n);
        /* Every combination of flags, then a mix of policies across layers. */
        for (int32_t policy = 1; policy <= LLMT_RECOMPUTE_MASK + 1; policy++) {
            if (policy <= LLMT_RECOMPUTE_MASK) {
                assert_int_equal(llmt_recompute_set_layers(rc, 0, -1, policy), LLMT_OK);
            } else {
                llmt_recompute_set_layers(rc, 0, 1, LLMT_RECOMPUTE_FULL);
                llmt_recompute_set_layers(rc, 1, 1, LLMT_RECOMPUTE_NONE);
                llmt_recompute_set_layers(rc, 2, 1, LLMT_RECOMPUTE_ATTN_CORE | LLMT_RECOMPUTE_FFN);
            }
            assert_int_equal(llmt_model_zero_grads(m), LLMT_OK);
            double loss = 0;
            assert_int_equal(llmt_model_forward_backward(m, tokens, targets, B, T, 1, 0, &loss),
                             LLMT_OK);
            size_t n2 = 0;
            void *got = raw_grads(m, &n2);
            assert_int_equal(n, n2);
            if (memcmp(ref, got, n) != 0 || loss != ref_loss)
                fail_msg("precision %d policy %s: gradients or loss differ from NONE", precisions[p],
                         policy <= LLMT_RECOMPUTE_MASK ? llmt_recompute_policy_name(policy) : "mixed");
            free(got);
        }
        /* The policy really dropped activations: FULL keeps far less. */
        llmt_plan_config pc = LLMT_PLAN_CONFIG_INIT;
        pc.model = c;
        pc.micro_batch = B;
        pc.seq_len = T;
        llmt_plan none = LLMT_PLAN_INIT, full = LLMT_PLAN_INIT;
        assert_int_equal(llmt_plan_compute(ctx, &pc, &none), LLMT_OK);
        pc.recompute = LLMT_RECOMPUTE_FULL;
        assert_int_equal(llmt_plan_compute(ctx, &pc, &full), LLMT_OK);
        assert_true(full.bytes[LLMT_MEM_ACTIVATIONS] * 4 < none.bytes[LLMT_MEM_ACTIVATIONS]);
        free(ref);
        llmt_recompute_free(rc);
        llmt_model_free(m);
        llmt_context_free(ctx);
    }
}

static void test_slicing_matches_unsliced(void **state)
{
    (void)state;
    llmt_context *ctx = test_context(2, 4);
    llmt_model_config c = config(LLMT_PRECISION_FP32);
    llmt_model *m = NULL;
    llmt_slicer *s = NULL;
    assert_int_equal(llmt_model_create(&m, ctx, &c), LLMT_OK);
    assert_int_equal(llmt_slicer_create(&s, m, B), LLMT_OK);
    int32_t tokens[B * T], targets[B * T];
    batch(tokens, targets, 6);
    double whole_loss = 0;
    assert_int_equal(llmt_slicer_forward_backward(s, tokens, targets, B, T, 1.0, &whole_loss), LLMT_OK);
    float *whole = test_all_grads(m);
    size_t n = (size_t)llmt_model_num_params(m);
    double gmax = 0;
    for (size_t i = 0; i < n; i++)
        gmax = fmax(gmax, fabs(whole[i]));
    const int32_t micro[5] = {1, 2, 4, 8, 3}; /* 3: slices of 3, 3, 2 */
    for (int k = 0; k < 5; k++) {
        assert_int_equal(llmt_slicer_set_micro_batch(s, micro[k]), LLMT_OK);
        assert_int_equal(llmt_model_zero_grads(m), LLMT_OK);
        double loss = 0;
        assert_int_equal(llmt_slicer_forward_backward(s, tokens, targets, B, T, 1.0, &loss), LLMT_OK);
        float *got = test_all_grads(m);
        double err = 0;
        for (size_t i = 0; i < n; i++)
            err = fmax(err, fabs((double)got[i] - whole[i]));
        if (err > 1e-5 * gmax || fabs(loss - whole_loss) > 1e-6 * whole_loss)
            fail_msg("micro-batch %d: max gradient error %g (max %g), loss %.9f vs %.9f", micro[k],
                     err, gmax, loss, whole_loss);
        /* The arena holds exactly one micro-batch. */
        assert_int_equal(m->layout.batch, micro[k]);
        free(got);
    }
    free(whole);
    llmt_slicer_free(s);
    llmt_model_free(m);
    llmt_context_free(ctx);
}

/* One training step of (precision, policy, micro-batch) on a fresh context;
 * the planner's bytes must equal the measured peak of every category. */
static void check_plan(int precision, int32_t policy, int32_t micro)
{
    llmt_context *ctx = test_context(2, 1);
    llmt_model_config c = config(precision);
    llmt_plan_config pc = LLMT_PLAN_CONFIG_INIT;
    pc.model = c;
    pc.recompute = policy;
    pc.micro_batch = micro;
    pc.seq_len = T;
    llmt_plan p = LLMT_PLAN_INIT;
    assert_int_equal(llmt_plan_compute(ctx, &pc, &p), LLMT_OK);
    llmt_memory_stats s = LLMT_MEMORY_STATS_INIT;
    assert_int_equal(llmt_context_memory_stats(ctx, &s), LLMT_OK);
    assert_int_equal(s.total_peak, 0); /* planning allocated nothing */

    llmt_model *m = NULL;
    llmt_optimizer *o = NULL;
    llmt_recompute *rc = NULL;
    llmt_slicer *sl = NULL;
    llmt_loss_scaler *sc = NULL;
    llmt_optimizer_config oc = LLMT_OPTIMIZER_CONFIG_INIT;
    llmt_loss_scaler_config lc = LLMT_LOSS_SCALER_CONFIG_INIT;
    assert_int_equal(llmt_model_create(&m, ctx, &c), LLMT_OK);
    assert_int_equal(llmt_optimizer_create(&o, m, &oc), LLMT_OK);
    assert_int_equal(llmt_recompute_create(&rc, m), LLMT_OK);
    assert_int_equal(llmt_recompute_set_layers(rc, 0, -1, policy), LLMT_OK);
    assert_int_equal(llmt_slicer_create(&sl, m, micro), LLMT_OK);
    assert_int_equal(llmt_loss_scaler_create(&sc, &lc), LLMT_OK);
    int32_t tokens[B * T], targets[B * T];
    batch(tokens, targets, 7);
    for (int step = 0; step < 2; step++) {
        assert_int_equal(llmt_model_zero_grads(m), LLMT_OK);
        assert_int_equal(llmt_slicer_forward_backward(sl, tokens, targets, B, T,
                                                      llmt_loss_scaler_scale(sc), NULL), LLMT_OK);
        assert_int_equal(llmt_optimizer_step(o, sc, NULL), LLMT_OK);
    }
    assert_int_equal(llmt_context_memory_stats(ctx, &s), LLMT_OK);
    for (int cat = 0; cat < LLMT_MEM_CATEGORY_COUNT; cat++)
        if (s.peak[cat] != p.bytes[cat])
            fail_msg("precision %d, %s, micro-batch %d: %s planned %llu, measured peak %llu",
                     precision, llmt_recompute_policy_name(policy), micro,
                     llmt_mem_category_name(cat), (unsigned long long)p.bytes[cat],
                     (unsigned long long)s.peak[cat]);
    assert_int_equal(s.total_peak, p.peak);
    assert_int_equal(p.num_params, llmt_model_num_params(m));
    llmt_loss_scaler_free(sc);
    llmt_slicer_free(sl);
    llmt_recompute_free(rc);
    llmt_optimizer_free(o);
    llmt_model_free(m);
    llmt_context_free(ctx);
}

static void test_plan_equals_measured_peak(void **state)
{
    (void)state;
    const int precisions[4] = {LLMT_PRECISION_FP32, LLMT_PRECISION_BF16_MIXED,
                               LLMT_PRECISION_FP16_MIXED, LLMT_PRECISION_BF16_PURE};
    const int32_t policies[5] = {LLMT_RECOMPUTE_NONE, LLMT_RECOMPUTE_ATTN_CORE | LLMT_RECOMPUTE_FFN_ACT,
                                 LLMT_RECOMPUTE_FFN, LLMT_RECOMPUTE_FULL, LLMT_RECOMPUTE_FFN_ACT};
    const int32_t micro[3] = {1, 3, 8};
    int combos = 0;
    for (int p = 0; p < 4; p++)
        for (int k = 0; k < 5; k++, combos++)
            check_plan(precisions[p], policies[k], micro[(p + k) % 3]);
    assert_true(combos >= 12);
}

static void test_arena_reused(void **state)
{
    (void)state;
    llmt_context *ctx = test_context(2, 2);
    llmt_model_config c = config(LLMT_PRECISION_FP32);
    llmt_model *m = NULL;
    llmt_slicer *s = NULL;
    llmt_recompute *rc = NULL;
    assert_int_equal(llmt_model_create(&m, ctx, &c), LLMT_OK);
    assert_int_equal(llmt_slicer_create(&s, m, 3), LLMT_OK);
    assert_int_equal(llmt_recompute_create(&rc, m), LLMT_OK);
    int32_t tokens[B * T], targets[B * T];
    batch(tokens, targets, 8);
    assert_int_equal(llmt_slicer_forward_backward(s, tokens, targets, B, T, 1, NULL), LLMT_OK);
    void *acts = m->acts.ptr;
    size_t bytes = m->acts.bytes;
    for (int i = 0; i < 3; i++) /* same shape, same policy: same arena */
        assert_int_equal(llmt_slicer_forward_backward(s, tokens, targets, B, T, 1, NULL), LLMT_OK);
    assert_ptr_equal(m->acts.ptr, acts);
    /* A policy change re-lays it out, smaller; a micro-batch change too. */
    assert_int_equal(llmt_recompute_set_layers(rc, 0, -1, LLMT_RECOMPUTE_FULL), LLMT_OK);
    assert_int_equal(llmt_slicer_forward_backward(s, tokens, targets, B, T, 1, NULL), LLMT_OK);
    assert_true(m->acts.bytes < bytes);
    size_t full_bytes = m->acts.bytes;
    assert_int_equal(llmt_slicer_set_micro_batch(s, 1), LLMT_OK);
    assert_int_equal(llmt_slicer_forward_backward(s, tokens, targets, B, T, 1, NULL), LLMT_OK);
    assert_true(m->acts.bytes < full_bytes);
    /* Released, nothing is left in the category. */
    assert_int_equal(llmt_model_release_activations(m), LLMT_OK);
    llmt_memory_stats st = LLMT_MEMORY_STATS_INIT;
    llmt_context_memory_stats(ctx, &st);
    assert_int_equal(st.current[LLMT_MEM_ACTIVATIONS], 0);
    llmt_recompute_free(rc);
    llmt_slicer_free(s);
    llmt_model_free(m);
    llmt_context_free(ctx);
}

static void test_plan_fit(void **state)
{
    (void)state;
    llmt_context *ctx = test_context(2, 3);
    llmt_plan_config pc = LLMT_PLAN_CONFIG_INIT;
    pc.model = config(LLMT_PRECISION_FP32);
    pc.micro_batch = 8;
    pc.seq_len = 16;
    llmt_plan p8 = LLMT_PLAN_INIT, p8act = LLMT_PLAN_INIT, p4 = LLMT_PLAN_INIT;
    assert_int_equal(llmt_plan_compute(ctx, &pc, &p8), LLMT_OK);
    pc.recompute = LLMT_RECOMPUTE_FFN_ACT;
    assert_int_equal(llmt_plan_compute(ctx, &pc, &p8act), LLMT_OK);
    pc.recompute = LLMT_RECOMPUTE_NONE;
    pc.micro_batch = 4;
    assert_int_equal(llmt_plan_compute(ctx, &pc, &p4), LLMT_OK);
    pc.micro_batch = 8;
    int32_t b = 0, r = -1;
    assert_int_equal(llmt_plan_fit(ctx, &pc, p8.peak, &b, &r), LLMT_OK);
    assert_int_equal(b, 8);
    assert_int_equal(r, LLMT_RECOMPUTE_NONE);
    assert_int_equal(llmt_plan_fit(ctx, &pc, p8.peak - 1, &b, &r), LLMT_OK);
    assert_int_equal(b, 8);
    assert_int_equal(r, LLMT_RECOMPUTE_FFN_ACT);
    assert_true(p8act.peak < p8.peak);
    /* A budget that only a smaller micro-batch meets. */
    pc.recompute = LLMT_RECOMPUTE_FULL;
    llmt_plan p8full = LLMT_PLAN_INIT;
    assert_int_equal(llmt_plan_compute(ctx, &pc, &p8full), LLMT_OK);
    pc.recompute = LLMT_RECOMPUTE_NONE;
    if (p4.peak < p8full.peak) {
        assert_int_equal(llmt_plan_fit(ctx, &pc, p8full.peak - 1, &b, &r), LLMT_OK);
        assert_true(b < 8);
    }
    assert_int_equal(llmt_plan_fit(ctx, &pc, 1000, &b, &r), LLMT_ENOMEM);
    assert_contains(llmt_error_last(), "micro-batch 1 with full recompute needs");
    llmt_context_free(ctx);
}

static void test_invalid_arguments(void **state)
{
    (void)state;
    llmt_context *ctx = test_context(1, 3);
    llmt_model_config c = config(LLMT_PRECISION_FP32);
    llmt_model *m = NULL;
    llmt_recompute *rc = NULL;
    llmt_slicer *s = NULL;
    assert_int_equal(llmt_model_create(&m, ctx, &c), LLMT_OK);
    assert_int_equal(llmt_recompute_create(&rc, m), LLMT_OK);
    assert_int_equal(llmt_recompute_set_layers(rc, 2, 2, 1), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "layers [2, 2 + 2)");
    assert_int_equal(llmt_recompute_set_layers(rc, 0, -1, 16), LLMT_EINVAL);
    assert_int_equal(llmt_recompute_set_layers(rc, 1, -1, LLMT_RECOMPUTE_FFN), LLMT_OK);
    assert_int_equal(llmt_recompute_get_layer(rc, 0), LLMT_RECOMPUTE_NONE);
    assert_int_equal(llmt_recompute_get_layer(rc, 2), LLMT_RECOMPUTE_FFN);
    assert_true(llmt_recompute_get_layer(rc, 3) < 0);
    assert_string_equal(llmt_recompute_policy_name(3), "attn_core+ffn_act");
    assert_int_equal(llmt_slicer_create(&s, m, 0), LLMT_EINVAL);
    assert_int_equal(llmt_slicer_create(&s, m, 2), LLMT_OK);
    assert_int_equal(llmt_slicer_set_micro_batch(s, -1), LLMT_EINVAL);
    assert_int_equal(llmt_slicer_micro_batch(s), 2);
    assert_int_equal(llmt_slicer_forward_backward(s, NULL, NULL, 1, 1, 1, NULL), LLMT_EINVAL);
    llmt_plan_config pc = LLMT_PLAN_CONFIG_INIT;
    llmt_plan p = LLMT_PLAN_INIT;
    pc.seq_len = 100000;
    assert_int_equal(llmt_plan_compute(ctx, &pc, &p), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "seq_len = 100000");
    pc = (llmt_plan_config)LLMT_PLAN_CONFIG_INIT;
    pc.recompute = 99;
    assert_int_equal(llmt_plan_compute(ctx, &pc, &p), LLMT_EINVAL);
    p.version = 0;
    pc.recompute = 0;
    assert_int_equal(llmt_plan_compute(ctx, &pc, &p), LLMT_EVERSION);
    assert_int_equal(llmt_model_reserve_activations(m, 0, 4), LLMT_EINVAL);
    llmt_slicer_free(s);
    llmt_recompute_free(rc);
    llmt_model_free(m);
    llmt_context_free(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_recompute_bit_identical),
        cmocka_unit_test(test_slicing_matches_unsliced),
        cmocka_unit_test(test_plan_equals_measured_peak),
        cmocka_unit_test(test_arena_reused),
        cmocka_unit_test(test_plan_fit),
        cmocka_unit_test(test_invalid_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
