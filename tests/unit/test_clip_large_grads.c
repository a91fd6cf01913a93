/* Gradient clipping with finite gradients whose fp32 squares overflow
 * (issue 17): llmt_optimizer_step must report the true global norm and
 * clip by it, as a double-precision AdamW computed here does. With the
 * squares taken in fp32 the norm came out infinite while no value was
 * counted non-finite, so the clip coefficient clip / (inf + 1e-6) = 0 turned
 * the step into one with a zero gradient. */
#include <float.h>
#include <math.h>
#include <stdlib.h>

#include "test_util.h"

#include "llmt/llmt.h"
#include "test_context.h"
#include "test_rand.h"
#include "test_tensors.h"

/* A one-layer fp32 model small enough to check every weight by hand. */
static llmt_model *tiny_fp32_model(llmt_context *ctx)
{
    llmt_model_config c = LLMT_MODEL_CONFIG_INIT;
    c.vocab_size = 29;
    c.hidden_size = 16;
    c.num_layers = 1;
    c.num_heads = 2;
    c.num_kv_heads = 1;
    c.ffn_size = 32;
    c.max_seq_len = 16;
    c.precision = LLMT_PRECISION_FP32;
    llmt_model *m = NULL;
    assert_int_equal(llmt_model_create(&m, ctx, &c), LLMT_OK);
    return m;
}

/* Every gradient N(0, 1e18^2) with one element at 1e20 (squares up to 1e40,
 * past fp32's 3.4e38), two steps, grad_clip 1, no weight decay (so norm
 * weights and matrices update alike): the reported norm within 1e-12 of
 * the double norm, and every weight within fp32 rounding of a double AdamW
 * with coefficient clip / (norm + 1e-6). */
static void test_clip_with_overflowing_squares(void **state)
{
    (void)state;
    llmt_context *ctx = test_context(2, 3);
    llmt_model *m = tiny_fp32_model(ctx);
    llmt_optimizer_config oc = LLMT_OPTIMIZER_CONFIG_INIT;
    oc.lr = 1e-2;
    oc.weight_decay = 0.0;
    oc.grad_clip = 1.0;
    llmt_optimizer *o = NULL;
    assert_int_equal(llmt_optimizer_create(&o, m, &oc), LLMT_OK);

    const size_t n = (size_t)llmt_model_num_params(m);
    const int32_t nt = llmt_model_num_tensors(m);
    float *w0 = test_all_params(m), *g = malloc(n * sizeof *g);
    double *w = malloc(n * sizeof *w), *mm = calloc(n, sizeof *mm), *vv = calloc(n, sizeof *vv);
    for (size_t i = 0; i < n; i++)
        w[i] = w0[i];
    uint64_t s = 17;
    for (int step = 1; step <= 2; step++) {
        for (size_t i = 0; i < n; i++)
            g[i] = (float)(1e18 * trand_normal(&s));
        g[n / 3 * step] = step == 1 ? 1e20f : -1e20f;
        size_t at = 0;
        for (int32_t t = 0; t < nt; t++) {
            llmt_tensor_info info = LLMT_TENSOR_INFO_INIT;
            assert_int_equal(llmt_model_tensor_info(m, t, &info), LLMT_OK);
            assert_int_equal(llmt_model_set_grad(m, info.name, g + at, (size_t)info.numel),
                             LLMT_OK);
            at += (size_t)info.numel;
        }
        llmt_update_report r = LLMT_UPDATE_REPORT_INIT;
        assert_int_equal(llmt_optimizer_step(o, NULL, &r), LLMT_OK);

        double sumsq = 0.0;
        for (size_t i = 0; i < n; i++)
            sumsq += (double)g[i] * g[i];
        const double norm = sqrt(sumsq), coef = 1.0 / (norm + 1e-6);
        assert_int_equal(r.skipped, 0);
        assert_int_equal(r.step, step);
        if (!(fabs(r.grad_norm - norm) <= 1e-12 * norm))
            fail_msg("step %d: grad_norm %.17g, want %.17g", step, r.grad_norm, norm);
        const double bc1 = 1 - pow(0.9, step), bc2 = 1 - pow(0.95, step);
        for (size_t i = 0; i < n; i++) {
            const double gi = g[i] * coef;
            mm[i] = 0.9 * mm[i] + 0.1 * gi;
            vv[i] = 0.95 * vv[i] + 0.05 * gi * gi;
            w[i] -= oc.lr / bc1 * mm[i] / (sqrt(vv[i]) / sqrt(bc2) + oc.eps);
        }
    }
    /* Each step moves a weight by about lr (Adam's first steps are close
     * to sign steps); fp32 keeps a weight within a few ulp of |w| + lr. */
    float *got = test_all_params(m);
    size_t far = 0, moved = 0;
    for (size_t i = 0; i < n; i++) {
        far += !(fabs(got[i] - w[i]) <= 8 * FLT_EPSILON * (fabs(w[i]) + oc.lr));
        moved += fabs(w[i] - w0[i]) > 0.5 * oc.lr;
    }
    if (far)
        fail_msg("%zu of %zu weights differ from the double AdamW beyond fp32 rounding", far, n);
    assert_true(moved > n / 2); /* the reference did move them */
    free(w0);
    free(g);
    free(w);
    free(mm);
    free(vv);
    free(got);
    llmt_optimizer_free(o);
    llmt_model_free(m);
    llmt_context_free(ctx);
}

/* A finite norm so large against grad_clip that the update's factor, clip /
 * norm, is no normal fp32 value (1e-30 / 1e20: it would round to 0 and apply
 * a zero gradient): the step is skipped like an overflow, reporting the
 * true norm; the weights and the step count stay. With a normal factor the
 * same gradient is applied. */
static void test_underflowing_factor_skips(void **state)
{
    (void)state;
    llmt_context *ctx = test_context(2, 3);
    llmt_model *m = tiny_fp32_model(ctx);
    const size_t n = (size_t)llmt_model_num_params(m);
    float *w0 = test_all_params(m);
    /* Factors 1e-50 (0 in fp32), 1e-40 (subnormal), 1e-30 (normal). */
    const double clips[3] = {1e-30, 1e-20, 1e-10};
    for (int k = 0; k < 3; k++) {
        llmt_optimizer_config oc = LLMT_OPTIMIZER_CONFIG_INIT;
        oc.grad_clip = clips[k];
        llmt_optimizer *o = NULL;
        assert_int_equal(llmt_optimizer_create(&o, m, &oc), LLMT_OK);
        llmt_tensor_info info = LLMT_TENSOR_INFO_INIT;
        assert_int_equal(llmt_model_tensor_info(m, 0, &info), LLMT_OK);
        float *g = calloc((size_t)info.numel, sizeof *g);
        g[0] = 1e20f;
        assert_int_equal(llmt_model_zero_grads(m), LLMT_OK);
        assert_int_equal(llmt_model_set_grad(m, info.name, g, (size_t)info.numel), LLMT_OK);
        llmt_update_report r = LLMT_UPDATE_REPORT_INIT;
        assert_int_equal(llmt_optimizer_step(o, NULL, &r), LLMT_OK);
        const int applied = k == 2;
        assert_int_equal(r.skipped, !applied);
        assert_int_equal(r.step, applied);
        assert_true(fabs(r.grad_norm - (double)1e20f) <= 1e-12 * 1e20);
        float *w = test_all_params(m);
        if (applied) /* down by lr c / (c + eps), c = 1e20 * 1e-30 against eps 1e-8: ~lr / 100 */
            assert_true(w[0] < w0[0] - 0.005 * oc.lr);
        else
            assert_memory_equal(w, w0, n * sizeof *w);
        free(w);
        free(g);
        llmt_optimizer_free(o);
    }
    free(w0);
    llmt_model_free(m);
    llmt_context_free(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_clip_with_overflowing_squares),
        cmocka_unit_test(test_underflowing_factor_skips),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
