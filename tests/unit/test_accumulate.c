/* Micro-batch gradients summed in fp32 (issue 17):
 * - the backends' accumulate op (sum fp32 += x widened) against the host's
 *   fp32 addition, bitwise, in each storage dtype;
 * - the sharded owner's in-place rounding of its fp32 sum to 16 bits, in
 *   chunks, against the host's rounding of each value;
 * - an ordered slicer in bf16_mixed and fp16_mixed over 8 micro-batches
 *   leaves bitwise the host's fp32 sum of each micro-batch's gradient
 *   (computed alone through the public API) rounded once, which is closer
 *   to the exact sum than rounding after every micro-batch, as before.
 * `test_accumulate cuda` runs the first two on the CUDA backend; it exits 77,
 * CTest's "skipped", without a usable device (and fails instead under
 * LLMT_REQUIRE_CUDA=1). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

#include "core/context_internal.h"
#include "core/half.h"
#include "cuda_required.h"
#include "llmt/llmt.h"
#include "optim/optim_internal.h"
#include "test_context.h"
#include "test_rand.h"

static llmt_context *g_ctx; /* the backend of this run's op test */
static char g_why[512];     /* why the CUDA backend did not open */

/* fp32 x rounded to dt (nearest even) and back. */
static float round_to(float x, int dt)
{
    if (dt == LLMT_DTYPE_BF16)
        return llmt_bf16_to_f32(llmt_f32_to_bf16(x));
    if (dt == LLMT_DTYPE_F16)
        return llmt_f16_to_f32(llmt_f32_to_f16(x));
    return x;
}

/* n values of dt holding x (exactly representable in dt). */
static void *pack(const float *x, int64_t n, int dt)
{
    void *p = malloc((size_t)n * llmt_dtype_size(dt) + 1);
    for (int64_t i = 0; i < n; i++) {
        if (dt == LLMT_DTYPE_F32)
            ((float *)p)[i] = x[i];
        else
            ((uint16_t *)p)[i] = dt == LLMT_DTYPE_BF16 ? llmt_f32_to_bf16(x[i])
                                                       : llmt_f32_to_f16(x[i]);
    }
    return p;
}

/* sum (fp32) += x (dt) on the backend, against the host's fp32 additions;
 * n above the CPU's one-thread cutoff, odd, so threads split it unevenly. */
static void check_accumulate(llmt_context *ctx)
{
    const llmt_backend_ops *ops = llmt_ops(ctx);
    llmt_device *dev = ctx->backend;
    assert_non_null(ops->accumulate);
    const int64_t n = 100003;
    const int dts[3] = {LLMT_DTYPE_F32, LLMT_DTYPE_BF16, LLMT_DTYPE_F16};
    uint64_t seed = 17;
    float *sum = malloc((size_t)n * sizeof *sum), *x = malloc((size_t)n * sizeof *x);
    float *want = malloc((size_t)n * sizeof *want), *got = malloc((size_t)n * sizeof *got);
    for (int k = 0; k < 3; k++) {
        const int dt = dts[k];
        for (int64_t i = 0; i < n; i++) {
            sum[i] = (float)trand_normal(&seed);
            /* Small against the sum: a 16-bit sum would lose most of it. */
            x[i] = round_to((float)(1e-3 * trand_normal(&seed)), dt);
            want[i] = sum[i] + x[i];
        }
        void *hx = pack(x, n, dt);
        void *dsum = NULL, *dx = NULL;
        size_t xbytes = (size_t)n * llmt_dtype_size(dt);
        assert_int_equal(ops->mem_alloc(dev, (size_t)n * sizeof(float), &dsum), LLMT_OK);
        assert_int_equal(ops->mem_alloc(dev, xbytes, &dx), LLMT_OK);
        assert_int_equal(ops->copy_to_device(dev, dsum, sum, (size_t)n * sizeof(float)), LLMT_OK);
        assert_int_equal(ops->copy_to_device(dev, dx, hx, xbytes), LLMT_OK);
        assert_int_equal(ops->accumulate(dev, dsum, dx, n, dt), LLMT_OK);
        assert_int_equal(ops->copy_to_host(dev, got, dsum, (size_t)n * sizeof(float)), LLMT_OK);
        for (int64_t i = 0; i < n; i++)
            if (memcmp(&got[i], &want[i], sizeof(float)) != 0)
                fail_msg("%s dtype %d: element %lld: %.9g + %.9g gave %.9g, not %.9g", ops->name,
                         dt, (long long)i, sum[i], x[i], got[i], want[i]);
        /* n = 0 touches nothing. */
        assert_int_equal(ops->accumulate(dev, dsum, dx, 0, dt), LLMT_OK);
        assert_int_equal(ops->copy_to_host(dev, sum, dsum, (size_t)n * sizeof(float)), LLMT_OK);
        assert_memory_equal(sum, want, (size_t)n * sizeof(float));
        ops->mem_free(dev, dsum);
        ops->mem_free(dev, dx);
        free(hx);
    }
    free(sum);
    free(x);
    free(want);
    free(got);
}

static void test_accumulate_op(void **state)
{
    (void)state;
    if (!g_ctx)
        cuda_unavailable(g_why);
    check_accumulate(g_ctx);
}

/* The sharded owner's rounding of its fp32 sum, in place: through bounce
 * buffers of one element, of a chunk that leaves an uneven last one, of
 * exactly n and of more, the first n x e bytes are the host's rounding of
 * each value; a bounce smaller than one element is refused. */
static void test_round_in_place(void **state)
{
    (void)state;
    if (!g_ctx)
        cuda_unavailable(g_why);
    const llmt_backend_ops *ops = llmt_ops(g_ctx);
    llmt_device *dev = g_ctx->backend;
    const int64_t n = 10007;
    const int64_t bounces[4] = {1, 1000, n, n + 5};
    const int dts[2] = {LLMT_DTYPE_BF16, LLMT_DTYPE_F16};
    uint64_t seed = 23;
    float *x = malloc((size_t)n * sizeof *x);
    for (int64_t i = 0; i < n; i++)
        x[i] = (float)trand_normal(&seed);
    uint16_t *got = malloc((size_t)n * 2);
    void *buf = NULL, *bounce = NULL;
    assert_int_equal(ops->mem_alloc(dev, (size_t)n * sizeof(float), &buf), LLMT_OK);
    assert_int_equal(ops->mem_alloc(dev, (size_t)(n + 5) * 2, &bounce), LLMT_OK);
    for (int k = 0; k < 2; k++) {
        uint16_t *want = pack(x, n, dts[k]);
        for (int b = 0; b < 4; b++) {
            assert_int_equal(ops->copy_to_device(dev, buf, x, (size_t)n * sizeof(float)), LLMT_OK);
            assert_int_equal(llmt_round_in_place(dev, buf, n, dts[k], bounce,
                                                 (size_t)bounces[b] * 2),
                             LLMT_OK);
            assert_int_equal(ops->copy_to_host(dev, got, buf, (size_t)n * 2), LLMT_OK);
            for (int64_t i = 0; i < n; i++)
                if (got[i] != want[i])
                    fail_msg("%s dtype %d, bounce of %lld: element %lld (%.9g) is 0x%04x, not "
                             "0x%04x", ops->name, dts[k], (long long)bounces[b], (long long)i,
                             x[i], got[i], want[i]);
        }
        free(want);
    }
    assert_int_equal(llmt_round_in_place(dev, buf, n, LLMT_DTYPE_BF16, bounce, 1), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "bounce_bytes = 1");
    assert_int_equal(llmt_round_in_place(dev, buf, 0, LLMT_DTYPE_BF16, bounce, 0), LLMT_OK);
    ops->mem_free(dev, buf);
    ops->mem_free(dev, bounce);
    free(got);
    free(x);
}

enum { VOCAB = 41, B = 16, MICRO = 2, K = B / MICRO, T = 12 };

static llmt_model *small_model(llmt_context *ctx, int precision)
{
    llmt_model_config c = LLMT_MODEL_CONFIG_INIT;
    c.vocab_size = VOCAB;
    c.hidden_size = 32;
    c.num_layers = 2;
    c.num_heads = 4;
    c.num_kv_heads = 2;
    c.ffn_size = 48;
    c.max_seq_len = 16;
    c.precision = precision;
    llmt_model *m = NULL;
    assert_int_equal(llmt_model_create(&m, ctx, &c), LLMT_OK);
    return m;
}

/* Every gradient as fp32, in tensor order, through the public API. */
static void read_grads(llmt_model *m, float *out)
{
    int64_t at = 0;
    for (int32_t t = 0; t < llmt_model_num_tensors(m); t++) {
        llmt_tensor_info info = LLMT_TENSOR_INFO_INIT;
        assert_int_equal(llmt_model_tensor_info(m, t, &info), LLMT_OK);
        assert_int_equal(llmt_model_get_grad(m, info.name, out + at, (size_t)info.numel), LLMT_OK);
        at += info.numel;
    }
    assert_int_equal(at, llmt_model_num_params(m));
}

/* Sum over i of |a[i] - exact[i]|. */
static double error_of(const float *a, const double *exact, int64_t n)
{
    double e = 0.0;
    for (int64_t i = 0; i < n; i++)
        e += fabs((double)a[i] - exact[i]);
    return e;
}

/* One precision: the slicer's ordered sum of K micro-batches, from zero and
 * then on top of gradients already held, against the host. */
static void check_ordered(int precision, int dt)
{
    llmt_context *ctx = test_context(2, 5);
    llmt_model *m = small_model(ctx, precision);
    const int64_t P = llmt_model_num_params(m);
    int32_t tokens[B * T], targets[B * T];
    uint64_t s = 99;
    int64_t counted = 0;
    for (int i = 0; i < B * T; i++) {
        tokens[i] = (int32_t)(trand_u64(&s) % VOCAB);
        targets[i] = i % 29 == 3 ? -1 : (int32_t)(trand_u64(&s) % VOCAB);
        counted += targets[i] >= 0;
    }
    /* Each micro-batch's gradient alone, normalised by the whole batch. */
    float *g = malloc((size_t)(K * P) * sizeof *g);
    for (int k = 0; k < K; k++) {
        assert_int_equal(llmt_model_zero_grads(m), LLMT_OK);
        size_t off = (size_t)k * MICRO * T;
        assert_int_equal(llmt_model_forward_backward(m, tokens + off, targets + off, MICRO, T, 1.0,
                                                     (double)counted, NULL),
                         LLMT_OK);
        read_grads(m, g + (size_t)k * P);
    }
    /* By hand: fp32 sum in micro-batch order from zero, rounded once; the
     * old way, rounded after each addition; the exact sum in double. */
    float *once = malloc((size_t)P * sizeof *once), *each = malloc((size_t)P * sizeof *each);
    double *exact = malloc((size_t)P * sizeof *exact);
    for (int64_t i = 0; i < P; i++) {
        float f = 0.0f, r = 0.0f;
        double d = 0.0;
        for (int k = 0; k < K; k++) {
            f += g[(size_t)k * P + i];
            r = round_to(r + g[(size_t)k * P + i], dt);
            d += (double)g[(size_t)k * P + i];
        }
        once[i] = round_to(f, dt);
        each[i] = r;
        exact[i] = d;
    }
    llmt_slicer *sl = NULL;
    assert_int_equal(llmt_slicer_create(&sl, m, MICRO), LLMT_OK);
    assert_int_equal(llmt_slicer_set_accumulation(sl, LLMT_ACCUMULATE_ORDERED), LLMT_OK);
    assert_int_equal(llmt_model_zero_grads(m), LLMT_OK);
    assert_int_equal(llmt_slicer_forward_backward(sl, tokens, targets, B, T, 1.0, NULL), LLMT_OK);
    float *got = malloc((size_t)P * sizeof *got);
    read_grads(m, got);
    for (int64_t i = 0; i < P; i++)
        if (memcmp(&got[i], &once[i], sizeof(float)) != 0)
            fail_msg("precision %d: gradient %lld is %.9g, the fp32 sum rounded once %.9g "
                     "(rounded after each micro-batch %.9g)", precision, (long long)i, got[i],
                     once[i], each[i]);
    const double err_once = error_of(once, exact, P), err_each = error_of(each, exact, P);
    print_message("precision %d, %d micro-batches: |error| summed over %lld gradients: rounded "
                  "once %.6g, after each micro-batch %.6g\n", precision, K, (long long)P,
                  err_once, err_each);
    assert_true(err_once < err_each);

    /* Again without zeroing: the sum starts from the gradients held (got),
     * widened, and is still rounded once. */
    assert_int_equal(llmt_slicer_forward_backward(sl, tokens, targets, B, T, 1.0, NULL), LLMT_OK);
    float *again = malloc((size_t)P * sizeof *again);
    read_grads(m, again);
    for (int64_t i = 0; i < P; i++) {
        float f = got[i];
        for (int k = 0; k < K; k++)
            f += g[(size_t)k * P + i];
        f = round_to(f, dt);
        if (memcmp(&again[i], &f, sizeof(float)) != 0)
            fail_msg("precision %d, second batch: gradient %lld is %.9g, not %.9g", precision,
                     (long long)i, again[i], f);
    }
    /* The sum is held (P fp32 values) while batches have several
     * micro-batches; a batch in one micro-batch frees it, as planned. */
    llmt_memory_stats ms = LLMT_MEMORY_STATS_INIT;
    assert_int_equal(llmt_context_memory_stats(ctx, &ms), LLMT_OK);
    const uint64_t with_sum = ms.current[LLMT_MEM_GRADS];
    assert_int_equal(llmt_slicer_set_micro_batch(sl, B), LLMT_OK);
    assert_int_equal(llmt_slicer_forward_backward(sl, tokens, targets, B, T, 1.0, NULL), LLMT_OK);
    assert_int_equal(llmt_context_memory_stats(ctx, &ms), LLMT_OK);
    assert_int_equal(with_sum - ms.current[LLMT_MEM_GRADS], (uint64_t)P * sizeof(float));
    free(again);
    free(got);
    free(once);
    free(each);
    free(exact);
    free(g);
    llmt_slicer_free(sl);
    llmt_model_free(m);
    llmt_context_free(ctx);
}

static void test_ordered_bf16_rounded_once(void **state)
{
    (void)state;
    check_ordered(LLMT_PRECISION_BF16_MIXED, LLMT_DTYPE_BF16);
}

static void test_ordered_fp16_rounded_once(void **state)
{
    (void)state;
    check_ordered(LLMT_PRECISION_FP16_MIXED, LLMT_DTYPE_F16);
}

int main(int argc, char **argv)
{
    const int cuda = argc > 1 && strcmp(argv[1], "cuda") == 0;
    if (argc > 1 && !cuda) {
        fprintf(stderr, "usage: %s [cuda]\n", argv[0]);
        return 2;
    }
    if (cuda) {
        llmt_context_config cfg = LLMT_CONTEXT_CONFIG_INIT;
        cfg.backend = LLMT_BACKEND_CUDA;
        if (llmt_context_create(&g_ctx, &cfg) != LLMT_OK)
            snprintf(g_why, sizeof g_why, "%s", llmt_error_last());
    } else {
        g_ctx = test_context(2, 1);
    }
    const struct CMUnitTest cpu_tests[] = {
        cmocka_unit_test(test_accumulate_op),
        cmocka_unit_test(test_round_in_place),
        cmocka_unit_test(test_ordered_bf16_rounded_once),
        cmocka_unit_test(test_ordered_fp16_rounded_once),
    };
    const struct CMUnitTest cuda_tests[] = {
        cmocka_unit_test(test_accumulate_op),
        cmocka_unit_test(test_round_in_place),
    };
    const int have_cuda = g_ctx != NULL;
    int failed = cuda ? cmocka_run_group_tests_name("cuda", cuda_tests, NULL, NULL)
                      : cmocka_run_group_tests_name("cpu", cpu_tests, NULL, NULL);
    llmt_context_free(g_ctx);
    return failed ? failed : cuda && !have_cuda ? 77 : 0;
}
