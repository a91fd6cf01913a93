/* cuDNN's fused attention against the CUDA plugin's own fp32 kernels
 * (CTest's gpu_attention_cudnn, run by tests/gpu/run.sh's attention-cudnn
 * stage). Two CUDA contexts: one opened with LLMT_CUDA_ATTENTION=cudnn
 * (BF16 and F16 attention must run on cuDNN: a refusal fails the test with
 * cuDNN's reason), one with =fallback (the kernels). On GQA, MQA and MHA
 * shapes, head_dim 64 and 128, T up to 2048, BF16 and F16:
 *   - forward out and backward dqkv agree within a relative L2 error of
 *     REL_OUT / REL_GRAD (the kernels round only their outputs; cuDNN also
 *     rounds P and dS to the 16-bit type for its tensor-core products);
 *   - the saved logsumexp rows agree within 1e-3 (1 + |lse|): both are fp32
 *     natural-log logsumexps of the scaled scores;
 *   - cuDNN's backward is bitwise the same run to run, and with the saved
 *     state or without it (recomputed).
 * The measured errors are printed. The choice of the kernels where cuDNN
 * does not run: F32 under =cudnn gives the bits of =fallback; a shape
 * cuDNN refuses (T = 1) runs under =auto, to what one key gives by hand,
 * and fails under =cudnn by name. The refusal of a bad LLMT_CUDA_ATTENTION
 * and the scratch's accounting of cuDNN's workspace need no device and run
 * everywhere; without a device the rest exits 77 (skipped), or fails under
 * LLMT_REQUIRE_CUDA=1. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

#include "core/context_internal.h"
#include "core/cuda_plugin_info.h"
#include "core/cuda_plugin_ops.h"
#include "core/half.h"
#include "cuda_required.h"
#include "llmt/llmt.h"

static llmt_context *g_dnn, *g_fb, *g_auto;
static char g_why[512];

typedef struct att_case {
    int batch, seq, heads, kv_heads, head_dim;
} att_case;

static const att_case cases[] = {
    {2, 512, 8, 2, 64},   /* GQA, groups of 4 */
    {1, 2048, 8, 2, 128}, /* the longest sequence */
    {2, 1000, 4, 4, 64},  /* MHA; T not a multiple of any tile */
    {1, 333, 6, 1, 128},  /* MQA */
};

/* Relative L2 errors allowed, cuDNN against the kernels: about four times
 * what rounding P, dP and dS to the 16-bit type gives (2^-9 BF16, 2^-11
 * F16, per element); a wrong stride, scale or mask gives 0.1 or more. */
#define REL_OUT_BF16 2e-2
#define REL_GRAD_BF16 4e-2
#define REL_OUT_F16 4e-3
#define REL_GRAD_F16 8e-3

/* Opens a CUDA context with LLMT_CUDA_ATTENTION=mode. */
static int open_ctx(llmt_context **ctx, const char *mode)
{
    setenv("LLMT_CUDA_ATTENTION", mode, 1);
    llmt_context_config cfg = LLMT_CONTEXT_CONFIG_INIT;
    cfg.backend = LLMT_BACKEND_CUDA;
    int rc = llmt_context_create(ctx, &cfg);
    unsetenv("LLMT_CUDA_ATTENTION");
    return rc;
}

static void check_ok(int rc, const char *what)
{
    if (rc)
        fail_msg("%s: %s", what, llmt_error_last());
}

static void *dev_alloc(llmt_context *ctx, size_t bytes)
{
    void *p = NULL;
    check_ok(llmt_ops(ctx)->mem_alloc(ctx->backend, bytes ? bytes : 1, &p), "device allocation");
    return p;
}

/* Uniform in [-2, 2), from a 64-bit LCG. */
static float rnd(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) * (4.0 / 16777216.0) - 2.0);
}

static uint16_t to_half(float f, int dt)
{
    return dt == LLMT_DTYPE_BF16 ? llmt_f32_to_bf16(f) : llmt_f32_to_f16(f);
}

/* Bytes of an element of dt (F32, BF16 or F16). */
static size_t elem_size(int dt)
{
    return dt == LLMT_DTYPE_F32 ? 4 : 2;
}

/* Elements of a case's qkv rows [q heads | k heads | v heads]. */
static size_t qkv_elems(const att_case *c)
{
    return (size_t)c->batch * c->seq * (size_t)(c->heads + 2 * c->kv_heads) * c->head_dim;
}

/* Elements of a case's out (and dout). */
static size_t out_elems(const att_case *c)
{
    return (size_t)c->batch * c->seq * (size_t)c->heads * c->head_dim;
}

static float from_half(uint16_t h, int dt)
{
    return dt == LLMT_DTYPE_BF16 ? llmt_bf16_to_f32(h) : llmt_f16_to_f32(h);
}

/* What one context computes for a case (out and the dqkv in dt). */
typedef struct att_result {
    void *out, *dqkv, *dqkv_again, *dqkv_recomputed;
    float *lse;
} att_result;

/* Forward, then backward from the saved state twice and without it once;
 * qkv and dout are host arrays in dt. */
static void run(llmt_context *ctx, const att_case *c, int dt, const void *qkv,
                const void *dout, att_result *r)
{
    const llmt_backend_ops *ops = llmt_ops(ctx);
    llmt_device *dev = ctx->backend;
    const size_t qkv_b = qkv_elems(c) * elem_size(dt), out_b = out_elems(c) * elem_size(dt);
    llmt_attn_dims ad = {c->batch, c->seq, c->heads, c->kv_heads, c->head_dim};
    llmt_op_dims od = {0};
    od.batch = c->batch, od.seq = c->seq, od.hidden = c->heads * c->head_dim;
    od.heads = c->heads, od.kv_heads = c->kv_heads, od.head_dim = c->head_dim, od.dt = dt;
    od.num_threads = 1;
    const size_t lse_bytes = ops->attention_saved_bytes(&ad);
    void *d_qkv = dev_alloc(ctx, qkv_b), *d_dout = dev_alloc(ctx, out_b);
    void *d_out = dev_alloc(ctx, out_b), *d_dqkv = dev_alloc(ctx, qkv_b);
    void *d_lse = dev_alloc(ctx, lse_bytes), *scratch = dev_alloc(ctx, ops->scratch_bytes(&od));
    check_ok(ops->copy_to_device(dev, d_qkv, qkv, qkv_b), "copy qkv");
    check_ok(ops->copy_to_device(dev, d_dout, dout, out_b), "copy dout");
    r->out = malloc(out_b);
    r->lse = malloc(lse_bytes);
    r->dqkv = malloc(qkv_b);
    r->dqkv_again = malloc(qkv_b);
    r->dqkv_recomputed = malloc(qkv_b);
    check_ok(ops->attention_fwd(dev, d_out, d_lse, d_qkv, &ad, dt, scratch), "attention_fwd");
    check_ok(ops->copy_to_host(dev, r->out, d_out, out_b), "copy out");
    check_ok(ops->copy_to_host(dev, r->lse, d_lse, lse_bytes), "copy lse");
    void *dst[3] = {r->dqkv, r->dqkv_again, r->dqkv_recomputed};
    for (int pass = 0; pass < 3; pass++) {
        check_ok(ops->mem_zero(dev, d_dqkv, qkv_b), "mem_zero");
        check_ok(ops->attention_bwd(dev, d_dqkv, d_dout, d_qkv, pass == 2 ? NULL : d_lse, d_out,
                                    &ad, dt, scratch), "attention_bwd");
        check_ok(ops->copy_to_host(dev, dst[pass], d_dqkv, qkv_b), "copy dqkv");
    }
    void *bufs[] = {d_qkv, d_dout, d_out, d_dqkv, d_lse, scratch};
    for (int i = 0; i < 6; i++)
        ops->mem_free(dev, bufs[i]);
}

static void free_result(att_result *r)
{
    free(r->out), free(r->dqkv), free(r->dqkv_again), free(r->dqkv_recomputed), free(r->lse);
}

/* ||a - b|| / ||b|| over n 16-bit values. */
static double rel_l2(const uint16_t *a, const uint16_t *b, size_t n, int dt)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        const double x = from_half(a[i], dt), y = from_half(b[i], dt);
        num += (x - y) * (x - y);
        den += y * y;
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* Random qkv and dout of a case in a 16-bit dt. */
static void make_inputs(const att_case *c, int dt, uint16_t **qkv, uint16_t **dout)
{
    const size_t qkv_n = qkv_elems(c), out_n = out_elems(c);
    *qkv = malloc(qkv_n * 2);
    *dout = malloc(out_n * 2);
    uint64_t s = 0x5eed0000u + (uint64_t)c->seq * 131u + (uint64_t)dt;
    for (size_t i = 0; i < qkv_n; i++)
        (*qkv)[i] = to_half(rnd(&s), dt);
    for (size_t i = 0; i < out_n; i++)
        (*dout)[i] = to_half(rnd(&s), dt);
}

static void check_case(const att_case *c, int dt)
{
    const size_t qkv_n = qkv_elems(c), out_n = out_elems(c);
    const size_t rows = (size_t)c->batch * c->heads * c->seq;
    uint16_t *qkv, *dout;
    make_inputs(c, dt, &qkv, &dout);
    att_result dnn, fb;
    run(g_dnn, c, dt, qkv, dout, &dnn);
    run(g_fb, c, dt, qkv, dout, &fb);
    char name[96];
    snprintf(name, sizeof name, "%s B%d T%d H%d/%d hd%d", dt == LLMT_DTYPE_BF16 ? "BF16" : "F16",
             c->batch, c->seq, c->heads, c->kv_heads, c->head_dim);
    const double e_out = rel_l2(dnn.out, fb.out, out_n, dt);
    const double e_grad = rel_l2(dnn.dqkv, fb.dqkv, qkv_n, dt);
    double e_lse = 0;
    for (size_t i = 0; i < rows; i++) {
        const double d = fabs((double)dnn.lse[i] - fb.lse[i]) / (1.0 + fabs((double)fb.lse[i]));
        e_lse = d > e_lse || isnan(d) ? d : e_lse;
    }
    const double tol_out = dt == LLMT_DTYPE_BF16 ? REL_OUT_BF16 : REL_OUT_F16;
    const double tol_grad = dt == LLMT_DTYPE_BF16 ? REL_GRAD_BF16 : REL_GRAD_F16;
    printf("%-28s cuDNN vs kernels: out %.2e (<= %.0e), dqkv %.2e (<= %.0e), lse %.2e (<= 1e-3)\n",
           name, e_out, tol_out, e_grad, tol_grad, e_lse);
    if (!(e_out <= tol_out) || !(e_grad <= tol_grad) || !(e_lse <= 1e-3))
        fail_msg("%s: cuDNN and the kernels disagree beyond the tolerances", name);
    if (memcmp(dnn.dqkv, dnn.dqkv_again, qkv_n * 2) != 0)
        fail_msg("%s: cuDNN's backward is not bitwise the same run to run", name);
    if (memcmp(dnn.dqkv, dnn.dqkv_recomputed, qkv_n * 2) != 0)
        fail_msg("%s: cuDNN's backward without the saved state differs from it with", name);
    free_result(&dnn);
    free_result(&fb);
    free(qkv);
    free(dout);
}

static void need_device(void)
{
    if (!g_dnn || !g_fb || !g_auto)
        cuda_unavailable(g_why);
}

static void test_bf16(void **state)
{
    (void)state;
    need_device();
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        check_case(&cases[i], LLMT_DTYPE_BF16);
}

static void test_f16(void **state)
{
    (void)state;
    need_device();
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        check_case(&cases[i], LLMT_DTYPE_F16);
}

/* F32 never runs on cuDNN: under LLMT_CUDA_ATTENTION=cudnn it runs on the
 * kernels (not a refusal) and gives the bits of =fallback. */
static void test_f32_on_kernels(void **state)
{
    (void)state;
    need_device();
    const att_case c = {2, 100, 4, 2, 64};
    const size_t qkv_n = qkv_elems(&c), out_n = out_elems(&c);
    float *qkv = malloc(qkv_n * 4), *dout = malloc(out_n * 4);
    uint64_t s = 0x5eed32u;
    for (size_t i = 0; i < qkv_n; i++)
        qkv[i] = rnd(&s);
    for (size_t i = 0; i < out_n; i++)
        dout[i] = rnd(&s);
    att_result dnn, fb;
    run(g_dnn, &c, LLMT_DTYPE_F32, qkv, dout, &dnn);
    run(g_fb, &c, LLMT_DTYPE_F32, qkv, dout, &fb);
    assert_memory_equal(dnn.out, fb.out, out_n * 4);
    assert_memory_equal(dnn.lse, fb.lse, (size_t)c.batch * c.heads * c.seq * 4);
    assert_memory_equal(dnn.dqkv, fb.dqkv, qkv_n * 4);
    assert_memory_equal(dnn.dqkv_recomputed, fb.dqkv, qkv_n * 4);
    free_result(&dnn);
    free_result(&fb);
    free(qkv);
    free(dout);
}

/* T = 1, a shape cuDNN refuses (the frontend's sdpa_backward validation:
 * "s_q = s_kv = 1 is not supported"). Under =auto forward and backward run
 * (the kernels take what cuDNN declines) and give what one key gives, by
 * hand in double: out = the v of the query head's kv head, lse = scale q.k,
 * dV = the sum of dO over the kv head's query heads, dQ = dK = 0 (dS = P (dP
 * - D) with P = 1 and dP = D = dO.v). Under =cudnn the refusal fails the
 * op by name. */
static void check_refused_shape(int dt)
{
    const att_case c = {2, 1, 4, 2, 64};
    const int64_t H = c.heads, KV = c.kv_heads, hd = c.head_dim, ld = (H + 2 * KV) * hd;
    const size_t qkv_n = qkv_elems(&c);
    uint16_t *qkv, *dout;
    make_inputs(&c, dt, &qkv, &dout);
    att_result r;
    run(g_auto, &c, dt, qkv, dout, &r);
    const uint16_t *out = r.out, *dqkv = r.dqkv;
    const double scale = 1.0 / sqrt((double)hd);
    const double tol = dt == LLMT_DTYPE_BF16 ? REL_OUT_BF16 : REL_OUT_F16;
    double out_err = 0, out_den = 0, dv_err = 0, dv_den = 0, dqk_max = 0, lse_err = 0;
    for (int64_t b = 0; b < c.batch; b++) {
        const uint16_t *row = qkv + b * ld, *drow = dqkv + b * ld;
        for (int64_t h = 0; h < H; h++) {
            const int64_t kvh = h / (H / KV);
            double qk = 0;
            for (int64_t e = 0; e < hd; e++) {
                qk += (double)from_half(row[h * hd + e], dt) * from_half(row[(H + kvh) * hd + e], dt);
                const double v = from_half(row[(H + KV + kvh) * hd + e], dt);
                const double o = from_half(out[(b * H + h) * hd + e], dt);
                out_err += (o - v) * (o - v), out_den += v * v;
            }
            const double lse = r.lse[b * H + h];
            lse_err = fmax(lse_err, fabs(lse - scale * qk) / (1.0 + fabs(scale * qk)));
        }
        for (int64_t j = 0; j < (H + KV) * hd; j++) /* dQ and dK */
            dqk_max = fmax(dqk_max, fabs((double)from_half(drow[j], dt)));
        for (int64_t kvh = 0; kvh < KV; kvh++)
            for (int64_t e = 0; e < hd; e++) {
                double want = 0;
                for (int64_t h = kvh * (H / KV); h < (kvh + 1) * (H / KV); h++)
                    want += from_half(dout[(b * H + h) * hd + e], dt);
                const double got = from_half(drow[(H + KV + kvh) * hd + e], dt);
                dv_err += (got - want) * (got - want), dv_den += want * want;
            }
    }
    out_err = sqrt(out_err / out_den), dv_err = sqrt(dv_err / dv_den);
    printf("%s T=1 under auto: out %.2e, dV %.2e (<= %.0e), |dQ|,|dK| <= %.2e (<= 1e-3), "
           "lse %.2e (<= 1e-4)\n", dt == LLMT_DTYPE_BF16 ? "BF16" : "F16", out_err, dv_err, tol,
           dqk_max, lse_err);
    if (!(out_err <= tol) || !(dv_err <= tol) || !(dqk_max <= 1e-3) || !(lse_err <= 1e-4))
        fail_msg("T=1 under LLMT_CUDA_ATTENTION=auto: not what one key gives");
    assert_memory_equal(r.dqkv, r.dqkv_again, qkv_n * 2);
    assert_memory_equal(r.dqkv, r.dqkv_recomputed, qkv_n * 2);
    free_result(&r);

    /* =cudnn: backward without saved state (its forward rerun for the
     * logsumexp may be refused first); nothing runs, the error names why. */
    const llmt_backend_ops *ops = llmt_ops(g_dnn);
    llmt_device *dev = g_dnn->backend;
    llmt_attn_dims ad = {c.batch, c.seq, c.heads, c.kv_heads, c.head_dim};
    llmt_op_dims od = {0};
    od.batch = c.batch, od.seq = c.seq, od.hidden = H * hd, od.heads = H, od.kv_heads = KV;
    od.head_dim = hd, od.dt = dt, od.num_threads = 1;
    const size_t out_b = out_elems(&c) * 2;
    void *d_qkv = dev_alloc(g_dnn, qkv_n * 2), *d_dout = dev_alloc(g_dnn, out_b);
    void *d_out = dev_alloc(g_dnn, out_b), *d_dqkv = dev_alloc(g_dnn, qkv_n * 2);
    void *scratch = dev_alloc(g_dnn, ops->scratch_bytes(&od));
    check_ok(ops->copy_to_device(dev, d_qkv, qkv, qkv_n * 2), "copy qkv");
    check_ok(ops->copy_to_device(dev, d_dout, dout, out_b), "copy dout");
    check_ok(ops->mem_zero(dev, d_out, out_b), "mem_zero");
    const int rc = ops->attention_bwd(dev, d_dqkv, d_dout, d_qkv, NULL, d_out, &ad, dt, scratch);
    printf("%s T=1 under cudnn: %s\n", dt == LLMT_DTYPE_BF16 ? "BF16" : "F16",
           rc ? llmt_error_last() : "ran");
    if (rc != LLMT_EUNSUPPORTED || !strstr(llmt_error_last(), "LLMT_CUDA_ATTENTION=cudnn"))
        fail_msg("T=1 under LLMT_CUDA_ATTENTION=cudnn: rc %d, want the refusal "
                 "(LLMT_EUNSUPPORTED naming LLMT_CUDA_ATTENTION=cudnn)", rc);
    void *bufs[] = {d_qkv, d_dout, d_out, d_dqkv, scratch};
    for (int i = 0; i < 5; i++)
        ops->mem_free(dev, bufs[i]);
    free(qkv);
    free(dout);
}

static void test_refused_shape(void **state)
{
    (void)state;
    need_device();
    check_refused_shape(LLMT_DTYPE_BF16);
    check_refused_shape(LLMT_DTYPE_F16);
}

/* A value that is none of auto, fallback, cudnn: refused by name before
 * any device is touched. */
static void test_bad_mode(void **state)
{
    (void)state;
    llmt_context *ctx = NULL;
    const int rc = open_ctx(&ctx, "cudnn9");
    llmt_context_free(ctx);
    assert_int_equal(rc, LLMT_EINVAL);
    assert_non_null(strstr(llmt_error_last(), "LLMT_CUDA_ATTENTION = 'cudnn9'"));
}

#ifdef LLMT_TEST_HAVE_CUDNN
static int64_t pad(int64_t x, int64_t to)
{
    return (x + to - 1) / to * to;
}
#endif

static size_t round256(size_t x)
{
    return (x + 255) / 256 * 256;
}

/* scratch_bytes where attention's need is the largest (B 16, T 8192, 64
 * heads, 8 kv heads, hd 128), by hand (docs/memory.md): D and the
 * logsumexp rows (64 MiB, more than the GEMM's 32 MiB workspace), and in
 * BF16 with cuDNN a recomputed forward's output and the workspace bound;
 * F32 never runs on cuDNN. */
static void test_scratch_accounting(void **state)
{
    (void)state;
    const llmt_backend_ops *ops;
    if (llmt_cuda_plugin_ops(&ops))
        fail_msg("the plugin's op table: %s", llmt_error_last());
    const int64_t B = 16, T = 8192, H = 64, KV = 8, hd = 128;
    llmt_op_dims d = {0};
    d.batch = B, d.seq = T, d.hidden = H * hd, d.heads = H, d.kv_heads = KV, d.head_dim = hd;
    d.num_threads = 1;
    const size_t rows = round256((size_t)(B * H * T) * 4);
    d.dt = LLMT_DTYPE_F32;
    assert_int_equal(ops->scratch_bytes(&d), 2 * rows + 256);
    d.dt = LLMT_DTYPE_BF16;
    size_t want = 2 * rows + 256;
#ifdef LLMT_TEST_HAVE_CUDNN
    const int64_t r = B * H * pad(T, 128);
    const size_t ws = (size_t)(B * H * pad(T, 64) * pad(T, 128) * 2 + r * hd * 4 + r * 8) +
                      ((size_t)64 << 20);
    want += round256((size_t)(B * T * H * hd) * 2) + round256(ws);
#endif
    assert_int_equal(ops->scratch_bytes(&d), want);
}

int main(void)
{
    if (open_ctx(&g_dnn, "cudnn") || open_ctx(&g_fb, "fallback") || open_ctx(&g_auto, "auto")) {
        snprintf(g_why, sizeof g_why, "%s", llmt_error_last());
    } else {
        char line[512];
        llmt_cuda_plugin_describe(g_dnn->plugin_handle, line, sizeof line);
        printf("CUDA backend: %s\n", line);
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_mode),
        cmocka_unit_test(test_scratch_accounting),
        cmocka_unit_test(test_bf16),
        cmocka_unit_test(test_f16),
        cmocka_unit_test(test_f32_on_kernels),
        cmocka_unit_test(test_refused_shape),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    int have = g_dnn && g_fb && g_auto;
    llmt_context_free(g_dnn);
    llmt_context_free(g_fb);
    llmt_context_free(g_auto);
    return failed ? failed : have ? 0 : 77;
}
