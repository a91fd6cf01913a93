/* AdamW against a double-precision reference; settings and their bounds;
 * the loss scaler's overflow handling; memory per parameter of each
 * precision mode; stochastic rounding of BF16_PURE. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "test_util.h"

#include "llmt/llmt.h"
#include "test_context.h"
#include "test_rand.h"
#include "test_tensors.h"

static llmt_context *make_ctx(void)
{
    return test_context(2, 3);
}

static llmt_model_config small_config(int precision)
{
    llmt_model_config c = LLMT_MODEL_CONFIG_INIT;
    c.vocab_size = 29;
    c.hidden_size = 16;
    c.num_layers = 2;
    c.num_heads = 2;
    c.num_kv_heads = 1;
    c.ffn_size = 32;
    c.max_seq_len = 16;
    c.precision = precision;
    return c;
}

/* The reference schedule: warmup then cosine to min_lr at total. */
static double ref_lr(int64_t t, double lr, double min_lr, int64_t warmup, int64_t total)
{
    if (t < warmup)
        return lr * (double)(t + 1) / (double)warmup;
    double p = (double)(t - warmup) / (double)(total - warmup);
    p = p > 1 ? 1 : p;
    return min_lr + (lr - min_lr) * 0.5 * (1 + cos(3.14159265358979323846 * p));
}

static void test_adamw_matches_reference(void **state)
{
    (void)state;
    llmt_context *ctx = make_ctx();
    llmt_model_config c = small_config(LLMT_PRECISION_FP32);
    llmt_model *m = NULL;
    assert_int_equal(llmt_model_create(&m, ctx, &c), LLMT_OK);
    llmt_optimizer_config oc = LLMT_OPTIMIZER_CONFIG_INIT;
    oc.lr = 1e-2;
    oc.beta1 = 0.8;
    oc.beta2 = 0.9;
    oc.eps = 1e-6;
    oc.weight_decay = 0.05;
    oc.grad_clip = 1.0;
    oc.schedule = LLMT_SCHEDULE_COSINE;
    oc.warmup_steps = 4;
    oc.total_steps = 16;
    oc.min_lr = 1e-3;
    llmt_optimizer *o = NULL;
    assert_int_equal(llmt_optimizer_create(&o, m, &oc), LLMT_OK);

    const int32_t nt = llmt_model_num_tensors(m);
    const size_t n = (size_t)llmt_model_num_params(m);
    /* which parameters are norms (no decay by default) */
    char *is_norm = calloc(n, 1);
    size_t at = 0;
    for (int32_t i = 0; i < nt; i++) {
        llmt_tensor_info info = LLMT_TENSOR_INFO_INIT;
        llmt_model_tensor_info(m, i, &info);
        for (int64_t j = 0; j < info.numel; j++)
            is_norm[at + (size_t)j] = info.ndim == 1;
        at += (size_t)info.numel;
    }
    float *w0 = test_all_params(m);
    double *w = malloc(n * sizeof *w), *mm = calloc(n, sizeof *mm), *vv = calloc(n, sizeof *vv);
    for (size_t i = 0; i < n; i++)
        w[i] = w0[i];
    float *g = malloc(n * sizeof *g);
    uint64_t s = 1234;
    int clipped = 0;
    for (int step = 0; step < 20; step++) {
        /* Gradients of varying size so that some steps clip and some do not. */
        double mag = 0.4 * (1 + step % 5) / sqrt((double)n); /* norms 0.4 .. 2 */
        for (size_t i = 0; i < n; i++)
            g[i] = (float)(mag * trand_normal(&s));
        at = 0;
        for (int32_t i = 0; i < nt; i++) {
            llmt_tensor_info info = LLMT_TENSOR_INFO_INIT;
            llmt_model_tensor_info(m, i, &info);
            assert_int_equal(llmt_model_set_grad(m, info.name, g + at, (size_t)info.numel), LLMT_OK);
            at += (size_t)info.numel;
        }
        llmt_update_report r = LLMT_UPDATE_REPORT_INIT;
        assert_int_equal(llmt_optimizer_step(o, NULL, &r), LLMT_OK);

        double norm = 0;
        for (size_t i = 0; i < n; i++)
            norm += (double)g[i] * g[i];
        norm = sqrt(norm);
        double coef = 1.0 / (norm + 1e-6);
        coef = coef < 1 ? coef : 1;
        clipped += coef < 1;
        double lr = ref_lr(step, 1e-2, 1e-3, 4, 16);
        double bc1 = 1 - pow(0.8, step + 1), bc2 = 1 - pow(0.9, step + 1);
        for (size_t i = 0; i < n; i++) {
            double gi = g[i] * coef;
            w[i] *= 1 - lr * (is_norm[i] ? 0.0 : 0.05);
            mm[i] = 0.8 * mm[i] + 0.2 * gi;
            vv[i] = 0.9 * vv[i] + 0.1 * gi * gi;
            w[i] -= lr / bc1 * mm[i] / (sqrt(vv[i]) / sqrt(bc2) + 1e-6);
        }
        assert_int_equal(r.step, step + 1);
        assert_int_equal(r.skipped, 0);
        assert_true(fabs(r.grad_norm - norm) <= 1e-6 * norm);
        assert_true(fabs(r.lr - lr) <= 1e-12 * lr);
        assert_true(r.loss_scale == 1.0);
    }
    assert_true(clipped >= 5 && clipped <= 15); /* both paths were taken */
    float *got_w = test_all_params(m);
    float *got_m = test_all_state(o, m, LLMT_OPT_STATE_EXP_AVG);
    float *got_v = test_all_state(o, m, LLMT_OPT_STATE_EXP_AVG_SQ);
    double max_dw = 0, max_step = 0;
    for (size_t i = 0; i < n; i++) {
        max_dw = fmax(max_dw, fabs(got_w[i] - w[i]));
        max_step = fmax(max_step, fabs(w[i] - w0[i]));
        assert_true(fabs(got_m[i] - mm[i]) <= 1e-5 * fabs(mm[i]) + 1e-9);
        assert_true(fabs(got_v[i] - vv[i]) <= 1e-5 * fabs(vv[i]) + 1e-12);
    }
    /* The weights moved by up to ~0.1 in all; the fp32 path stays within
     * 1e-6 of the double reference. */
    assert_true(max_step > 0.05);
    assert_true(max_dw < 1e-6);
    assert_int_equal(llmt_optimizer_step_count(o), 20);
    free(is_norm); free(w0); free(w); free(mm); free(vv); free(g);
    free(got_w); free(got_m); free(got_v);
    llmt_optimizer_free(o);
    llmt_model_free(m);
    llmt_context_free(ctx);
}

static void test_settings(void **state)
{
    (void)state;
    llmt_context *ctx = make_ctx();
    llmt_model_config c = small_config(LLMT_PRECISION_FP32);
    llmt_model *m = NULL;
    assert_int_equal(llmt_model_create(&m, ctx, &c), LLMT_OK);
    llmt_optimizer_config oc = LLMT_OPTIMIZER_CONFIG_INIT;
    llmt_optimizer *o = NULL;
    oc.beta1 = 1.0;
    assert_int_equal(llmt_optimizer_create(&o, m, &oc), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "beta1 = 1");
    oc = (llmt_optimizer_config)LLMT_OPTIMIZER_CONFIG_INIT;
    oc.version = 9;
    assert_int_equal(llmt_optimizer_create(&o, m, &oc), LLMT_EVERSION);
    oc = (llmt_optimizer_config)LLMT_OPTIMIZER_CONFIG_INIT;
    assert_int_equal(llmt_optimizer_create(&o, m, &oc), LLMT_OK);

    double v = 0;
    assert_int_equal(llmt_optimizer_set(o, LLMT_OPT_LR, 0.0), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "lr = 0");
    assert_int_equal(llmt_optimizer_set(o, LLMT_OPT_LR, NAN), LLMT_EINVAL);
    assert_int_equal(llmt_optimizer_set(o, LLMT_OPT_SCHEDULE, 3), LLMT_EINVAL);
    assert_int_equal(llmt_optimizer_set(o, LLMT_OPT_WARMUP_STEPS, 1.5), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "whole number");
    assert_int_equal(llmt_optimizer_set(o, LLMT_OPT_MIN_LR, 1.0), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "min_lr");
    assert_int_equal(llmt_optimizer_set(o, 99, 1.0), LLMT_EINVAL);
    assert_int_equal(llmt_optimizer_get(o, LLMT_OPT_LR, &v), LLMT_OK);
    assert_true(v == 3e-4); /* refused sets changed nothing */
    assert_int_equal(llmt_optimizer_set(o, LLMT_OPT_LR, 0.5), LLMT_OK);
    assert_int_equal(llmt_optimizer_set(o, LLMT_OPT_WARMUP_STEPS, 10), LLMT_OK);
    assert_int_equal(llmt_optimizer_get(o, LLMT_OPT_WARMUP_STEPS, &v), LLMT_OK);
    assert_true(v == 10);
    assert_true(llmt_optimizer_lr(o) == 0.05); /* warmup step 1 of 10 */
    llmt_optimizer_config got = LLMT_OPTIMIZER_CONFIG_INIT;
    got.version = 0; /* unset: refused, nothing written */
    assert_int_equal(llmt_optimizer_get_config(o, &got), LLMT_EVERSION);
    assert_contains(llmt_error_last(), "out->version = 0");
    assert_true(got.lr == 3e-4);
    got.version = LLMT_OPTIMIZER_CONFIG_VERSION;
    assert_int_equal(llmt_optimizer_get_config(o, &got), LLMT_OK);
    assert_true(got.lr == 0.5 && got.warmup_steps == 10);

    /* All settings at once: a lower lr with a lower min_lr, which one set
     * at a time in this order refuses; the placement and step stay. */
    assert_int_equal(llmt_optimizer_set(o, LLMT_OPT_MIN_LR, 0.25), LLMT_OK);
    llmt_optimizer_config want = LLMT_OPTIMIZER_CONFIG_INIT;
    want.lr = 0.125, want.beta1 = 0.8, want.beta2 = 0.9, want.eps = 1e-6;
    want.weight_decay = 0.01, want.decay_norms = 1, want.grad_clip = 2;
    want.schedule = LLMT_SCHEDULE_LINEAR, want.warmup_steps = 3, want.total_steps = 40;
    want.min_lr = 0.0625;
    want.offload_parts = LLMT_OFFLOAD_OPTIMIZER; /* not read */
    assert_int_equal(llmt_optimizer_set(o, LLMT_OPT_LR, want.lr), LLMT_EINVAL);
    assert_int_equal(llmt_optimizer_set_settings(o, &want), LLMT_OK);
    got.version = LLMT_OPTIMIZER_CONFIG_VERSION;
    assert_int_equal(llmt_optimizer_get_config(o, &got), LLMT_OK);
    assert_true(got.lr == 0.125 && got.beta1 == 0.8 && got.beta2 == 0.9 && got.eps == 1e-6);
    assert_true(got.weight_decay == 0.01 && got.decay_norms == 1 && got.grad_clip == 2);
    assert_int_equal(got.schedule, LLMT_SCHEDULE_LINEAR);
    assert_true(got.warmup_steps == 3 && got.total_steps == 40 && got.min_lr == 0.0625);
    assert_int_equal(got.offload_parts, LLMT_OFFLOAD_NONE);
    assert_int_equal(llmt_optimizer_get(o, LLMT_OPT_TOTAL_STEPS, &v), LLMT_OK);
    assert_true(v == 40);
    assert_true(llmt_optimizer_lr(o) == 0.125 / 3); /* warmup step 1 of 3 */
    /* All or none: a bad setting, or min_lr above lr, changes nothing. */
    llmt_optimizer_config bad = want;
    bad.lr = 1.0, bad.beta2 = 1.0;
    assert_int_equal(llmt_optimizer_set_settings(o, &bad), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "beta2 = 1");
    bad = want;
    bad.min_lr = 0.25;
    assert_int_equal(llmt_optimizer_set_settings(o, &bad), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "min_lr = 0.25 is above lr = 0.125");
    assert_int_equal(llmt_optimizer_get(o, LLMT_OPT_LR, &v), LLMT_OK);
    assert_true(v == 0.125);
    bad.version = 7;
    assert_int_equal(llmt_optimizer_set_settings(o, &bad), LLMT_EVERSION);
    assert_int_equal(llmt_optimizer_set_settings(o, NULL), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "cfg is NULL");
    assert_int_equal(llmt_optimizer_set_settings(NULL, &want), LLMT_EINVAL);

    /* FP32 has no master weights. */
    assert_int_equal(llmt_optimizer_state_dtype(o, LLMT_OPT_STATE_MASTER), -1);
    float buf[16];
    assert_int_equal(llmt_optimizer_get_state(o, LLMT_OPT_STATE_MASTER, "model.norm.weight", buf, 16),
                     LLMT_ENOTFOUND);
    assert_int_equal(llmt_optimizer_get_state(o, 7, "model.norm.weight", buf, 16), LLMT_EINVAL);
    assert_int_equal(llmt_optimizer_set_step_count(o, -1), LLMT_EINVAL);
    llmt_optimizer_free(o);
    llmt_optimizer_free(NULL);
    llmt_model_free(m);
    llmt_context_free(ctx);
}

/* Exactly 4+4+8, 2+2+4+8, 2+2+4+8 and 2+2+4 bytes per parameter. */
static void test_memory_per_parameter(void **state)
{
    (void)state;
    const int modes[4] = {LLMT_PRECISION_FP32, LLMT_PRECISION_BF16_MIXED,
                          LLMT_PRECISION_FP16_MIXED, LLMT_PRECISION_BF16_PURE};
    const uint64_t weights[4] = {4, 2, 2, 2}, optimizer[4] = {8, 12, 12, 4};
    for (int i = 0; i < 4; i++) {
        llmt_context *ctx = make_ctx();
        llmt_model_config c = small_config(modes[i]);
        llmt_model *m = NULL;
        llmt_optimizer *o = NULL;
        llmt_optimizer_config oc = LLMT_OPTIMIZER_CONFIG_INIT;
        assert_int_equal(llmt_model_create(&m, ctx, &c), LLMT_OK);
        assert_int_equal(llmt_optimizer_create(&o, m, &oc), LLMT_OK);
        uint64_t p = (uint64_t)llmt_model_num_params(m);
        llmt_memory_stats s = LLMT_MEMORY_STATS_INIT;
        assert_int_equal(llmt_context_memory_stats(ctx, &s), LLMT_OK);
        assert_int_equal(s.current[LLMT_MEM_PARAMS], weights[i] * p);
        assert_int_equal(s.current[LLMT_MEM_GRADS], weights[i] * p);
        assert_int_equal(s.current[LLMT_MEM_OPTIMIZER], optimizer[i] * p);
        llmt_optimizer_free(o);
        llmt_model_free(m);
        llmt_context_free(ctx);
    }
}

static void tokens_for(int32_t *tokens, int32_t *targets, int b_count, int t_count, int vocab)
{
    for (int b = 0; b < b_count; b++)
        for (int t = 0; t < t_count; t++) {
            int pos = b * 5 + t;
            tokens[b * t_count + t] = (pos * 7 + (pos / 11)) % vocab;
            targets[b * t_count + t] = ((pos + 1) * 7 + ((pos + 1) / 11)) % vocab;
        }
}

/* An overflow (a loss scale so large fp16 gradients become inf) skips the
 * step: weights, master weights, moments and step count stay bit-identical,
 * the scale halves and the skip is counted; after growth_interval clean
 * steps the scale doubles. */
static void test_fp16_overflow_skips(void **state)
{
    (void)state;
    llmt_context *ctx = make_ctx();
    llmt_model_config c = small_config(LLMT_PRECISION_FP16_MIXED);
    llmt_model *m = NULL;
    llmt_optimizer *o = NULL;
    llmt_loss_scaler *sc = NULL;
    llmt_optimizer_config oc = LLMT_OPTIMIZER_CONFIG_INIT;
    llmt_loss_scaler_config lc = LLMT_LOSS_SCALER_CONFIG_INIT;
    lc.init_scale = 1099511627776.0; /* 2^40: fp16 gradients overflow */
    lc.max_scale = 1125899906842624.0; /* 2^50 */
    lc.growth_interval = 3;
    assert_int_equal(llmt_model_create(&m, ctx, &c), LLMT_OK);
    assert_int_equal(llmt_optimizer_create(&o, m, &oc), LLMT_OK);
    assert_int_equal(llmt_loss_scaler_create(&sc, &lc), LLMT_OK);
    enum { B = 2, T = 8 };
    int32_t tokens[B * T], targets[B * T];
    tokens_for(tokens, targets, B, T, c.vocab_size);

    /* One clean step first, so the moments are not all zero. */
    llmt_loss_scaler_state st = LLMT_LOSS_SCALER_STATE_INIT;
    assert_int_equal(llmt_loss_scaler_get_state(sc, &st), LLMT_OK);
    st.scale = 1024.0;
    assert_int_equal(llmt_loss_scaler_set_state(sc, &st), LLMT_OK);
    assert_int_equal(llmt_model_forward_backward(m, tokens, targets, B, T,
                                                 llmt_loss_scaler_scale(sc), 0, NULL), LLMT_OK);
    llmt_update_report r = LLMT_UPDATE_REPORT_INIT;
    assert_int_equal(llmt_optimizer_step(o, sc, &r), LLMT_OK);
    assert_int_equal(r.skipped, 0);
    assert_true(r.loss_scale == 1024.0);

    st.scale = lc.init_scale;
    st.clean_steps = 0;
    assert_int_equal(llmt_loss_scaler_set_state(sc, &st), LLMT_OK);
    size_t n = (size_t)llmt_model_num_params(m);
    float *w0 = test_all_params(m), *ms0 = test_all_state(o, m, LLMT_OPT_STATE_MASTER);
    float *m0 = test_all_state(o, m, LLMT_OPT_STATE_EXP_AVG), *v0 = test_all_state(o, m, LLMT_OPT_STATE_EXP_AVG_SQ);
    assert_int_equal(llmt_model_zero_grads(m), LLMT_OK);
    assert_int_equal(llmt_model_forward_backward(m, tokens, targets, B, T,
                                                 llmt_loss_scaler_scale(sc), 0, NULL), LLMT_OK);
    assert_int_equal(llmt_optimizer_step(o, sc, &r), LLMT_OK);
    assert_int_equal(r.skipped, 1);
    assert_true(isinf(r.grad_norm));
    assert_int_equal(r.step, 1);
    assert_int_equal(llmt_optimizer_step_count(o), 1);
    float *w1 = test_all_params(m), *ms1 = test_all_state(o, m, LLMT_OPT_STATE_MASTER);
    float *m1 = test_all_state(o, m, LLMT_OPT_STATE_EXP_AVG), *v1 = test_all_state(o, m, LLMT_OPT_STATE_EXP_AVG_SQ);
    assert_memory_equal(w0, w1, n * sizeof(float));
    assert_memory_equal(ms0, ms1, n * sizeof(float));
    assert_memory_equal(m0, m1, n * sizeof(float));
    assert_memory_equal(v0, v1, n * sizeof(float));
    assert_int_equal(llmt_loss_scaler_get_state(sc, &st), LLMT_OK);
    assert_true(st.scale == lc.init_scale / 2);
    assert_int_equal(st.skipped_steps, 1);

    /* Now a safe scale: three clean steps, then the scale doubles. */
    st.scale = 512.0;
    assert_int_equal(llmt_loss_scaler_set_state(sc, &st), LLMT_OK);
    for (int i = 0; i < 3; i++) {
        assert_true(llmt_loss_scaler_scale(sc) == 512.0);
        assert_int_equal(llmt_model_zero_grads(m), LLMT_OK);
        assert_int_equal(llmt_model_forward_backward(m, tokens, targets, B, T,
                                                     llmt_loss_scaler_scale(sc), 0, NULL), LLMT_OK);
        assert_int_equal(llmt_optimizer_step(o, sc, &r), LLMT_OK);
        assert_int_equal(r.skipped, 0);
    }
    assert_true(llmt_loss_scaler_scale(sc) == 1024.0);
    assert_int_equal(llmt_optimizer_step_count(o), 4);
    /* The clean steps changed the weights. */
    float *w2 = test_all_params(m);
    assert_memory_not_equal(w0, w2, n * sizeof(float));
    free(w0); free(ms0); free(m0); free(v0); free(w1); free(ms1); free(m1); free(v1); free(w2);
    llmt_loss_scaler_free(sc);
    llmt_optimizer_free(o);
    llmt_model_free(m);
    llmt_context_free(ctx);
}

static void test_scaler_rules(void **state)
{
    (void)state;
    llmt_loss_scaler *s = NULL;
    llmt_loss_scaler_config c = LLMT_LOSS_SCALER_CONFIG_INIT;
    c.backoff_factor = 1.0;
    assert_int_equal(llmt_loss_scaler_create(&s, &c), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "backoff_factor");
    c = (llmt_loss_scaler_config)LLMT_LOSS_SCALER_CONFIG_INIT;
    c.init_scale = 4.0;
    c.min_scale = 2.0;
    c.max_scale = 16.0;
    c.growth_interval = 2;
    assert_int_equal(llmt_loss_scaler_create(&s, &c), LLMT_OK);
    assert_true(llmt_loss_scaler_scale(s) == 4.0);
    llmt_loss_scaler_update(s, 1);
    llmt_loss_scaler_update(s, 1);
    assert_true(llmt_loss_scaler_scale(s) == 2.0); /* bounded below */
    for (int i = 0; i < 8; i++)
        llmt_loss_scaler_update(s, 0);
    assert_true(llmt_loss_scaler_scale(s) == 16.0); /* doubled every 2, bounded above */
    llmt_loss_scaler_state st = LLMT_LOSS_SCALER_STATE_INIT;
    assert_int_equal(llmt_loss_scaler_get_state(s, &st), LLMT_OK);
    assert_int_equal(st.skipped_steps, 2);
    st.scale = 100.0;
    assert_int_equal(llmt_loss_scaler_set_state(s, &st), LLMT_EINVAL);
    llmt_loss_scaler_free(s);

    c.dynamic = 0; /* static: skips are counted, the scale stays */
    assert_int_equal(llmt_loss_scaler_create(&s, &c), LLMT_OK);
    llmt_loss_scaler_update(s, 1);
    for (int i = 0; i < 5; i++)
        llmt_loss_scaler_update(s, 0);
    assert_true(llmt_loss_scaler_scale(s) == 4.0);
    assert_int_equal(llmt_loss_scaler_get_state(s, &st), LLMT_OK);
    assert_int_equal(st.skipped_steps, 1);
    llmt_loss_scaler_free(s);
}

/* BF16_PURE rounds updates stochastically: an update far below half a bf16
 * ulp, which round-to-nearest would lose every time, moves the weights by
 * its size on average. */
static void test_stochastic_rounding_keeps_small_updates(void **state)
{
    (void)state;
    llmt_context *ctx = make_ctx();
    llmt_model_config c = small_config(LLMT_PRECISION_BF16_PURE);
    c.vocab_size = 512;
    c.hidden_size = 64;
    c.num_heads = 4;
    c.num_kv_heads = 4;
    llmt_model *m = NULL;
    llmt_optimizer *o = NULL;
    llmt_optimizer_config oc = LLMT_OPTIMIZER_CONFIG_INIT;
    oc.lr = 1e-3; /* Adam's first steps move each weight by about lr */
    oc.weight_decay = 0.0;
    oc.grad_clip = 0.0;
    assert_int_equal(llmt_model_create(&m, ctx, &c), LLMT_OK);
    assert_int_equal(llmt_optimizer_create(&o, m, &oc), LLMT_OK);
    const char *name = "model.embed_tokens.weight";
    size_t n = 512 * 64;
    float *w = malloc(n * sizeof *w), *g = malloc(n * sizeof *g);
    for (size_t i = 0; i < n; i++) {
        w[i] = 1.0f; /* bf16 ulp at 1 is 2^-7 = 0.0078: an update of 1e-3 is an eighth */
        g[i] = 1.0f;
    }
    assert_int_equal(llmt_model_set_param(m, name, w, n), LLMT_OK);
    for (int step = 0; step < 10; step++) {
        assert_int_equal(llmt_model_zero_grads(m), LLMT_OK);
        assert_int_equal(llmt_model_set_grad(m, name, g, n), LLMT_OK);
        assert_int_equal(llmt_optimizer_step(o, NULL, NULL), LLMT_OK);
    }
    assert_int_equal(llmt_model_get_param(m, name, w, n), LLMT_OK);
    double mean = 0;
    int moved = 0;
    for (size_t i = 0; i < n; i++) {
        mean += w[i];
        moved += w[i] != 1.0f;
    }
    mean /= (double)n;
    /* Ten steps of exactly lr each (m / sqrt(v) = 1 for a constant gradient):
     * expected 1 - 0.01. Each weight lands on a bf16 neighbour; the mean of
     * 32768 such draws is within 1e-3 of 0.99 by a wide margin. */
    assert_true(fabs(mean - 0.99) < 1e-3);
    assert_true(moved > (int)n / 2);
    free(w);
    free(g);
    llmt_optimizer_free(o);
    llmt_model_free(m);
    llmt_context_free(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_adamw_matches_reference),
        cmocka_unit_test(test_settings),
        cmocka_unit_test(test_memory_per_parameter),
        cmocka_unit_test(test_fp16_overflow_skips),
        cmocka_unit_test(test_scaler_rules),
        cmocka_unit_test(test_stochastic_rounding_keeps_small_updates),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
