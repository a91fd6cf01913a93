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
 * The measured errors are printed. The refusal of a bad LLMT_CUDA_ATTENTION
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

static llmt_context *g_dnn, *g_fb;
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

static float from_half(uint16_t h, int dt)
{
    return dt == LLMT_DTYPE_BF16 ? llmt_bf16_to_f32(h) : llmt_f16_to_f32(h);
}

/* What one context computes for a case. */
typedef struct att_result {
    uint16_t *out, *dqkv, *dqkv_again, *dqkv_recomputed;
    float *lse;
} att_result;

static void run(llmt_context *ctx, const att_case *c, int dt, const uint16_t *qkv,
                const uint16_t *dout, att_result *r)
{
    const llmt_backend_ops *ops = llmt_ops(ctx);
    llmt_device *dev = ctx->backend;
    const size_t m = (size_t)c->batch * c->seq;
    const size_t qkv_n = m * (size_t)(c->heads + 2 * c->kv_heads) * c->head_dim;
    const size_t out_n = m * (size_t)c->heads * c->head_dim;
    llmt_attn_dims ad = {c->batch, c->seq, c->heads, c->kv_heads, c->head_dim};
    llmt_op_dims od = {0};
    od.batch = c->batch, od.seq = c->seq, od.hidden = c->heads * c->head_dim;
    od.heads = c->heads, od.kv_heads = c->kv_heads, od.head_dim = c->head_dim, od.dt = dt;
    od.num_threads = 1;
    const size_t lse_bytes = ops->attention_saved_bytes(&ad);
    void *d_qkv = dev_alloc(ctx, qkv_n * 2), *d_dout = dev_alloc(ctx, out_n * 2);
    void *d_out = dev_alloc(ctx, out_n * 2), *d_dqkv = dev_alloc(ctx, qkv_n * 2);
    void *d_lse = dev_alloc(ctx, lse_bytes), *scratch = dev_alloc(ctx, ops->scratch_bytes(&od));
    check_ok(ops->copy_to_device(dev, d_qkv, qkv, qkv_n * 2), "copy qkv");
    check_ok(ops->copy_to_device(dev, d_dout, dout, out_n * 2), "copy dout");
    r->out = malloc(out_n * 2);
    r->lse = malloc(lse_bytes);
    r->dqkv = malloc(qkv_n * 2);
    r->dqkv_again = malloc(qkv_n * 2);
    r->dqkv_recomputed = malloc(qkv_n * 2);
    check_ok(ops->attention_fwd(dev, d_out, d_lse, d_qkv, &ad, dt, scratch), "attention_fwd");
    check_ok(ops->copy_to_host(dev, r->out, d_out, out_n * 2), "copy out");
    check_ok(ops->copy_to_host(dev, r->lse, d_lse, lse_bytes), "copy lse");
    uint16_t *dst[3] = {r->dqkv, r->dqkv_again, r->dqkv_recomputed};
    for (int pass = 0; pass < 3; pass++) {
        check_ok(ops->mem_zero(dev, d_dqkv, qkv_n * 2), "mem_zero");
        check_ok(ops->attention_bwd(dev, d_dqkv, d_dout, d_qkv, pass == 2 ? NULL : d_lse, d_out,
                                    &ad, dt, scratch), "attention_bwd");
        check_ok(ops->copy_to_host(dev, dst[pass], d_dqkv, qkv_n * 2), "copy dqkv");
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

static void check_case(const att_case *c, int dt)
{
    const size_t m = (size_t)c->batch * c->seq;
    const size_t qkv_n = m * (size_t)(c->heads + 2 * c->kv_heads) * c->head_dim;
    const size_t out_n = m * (size_t)c->heads * c->head_dim;
    const size_t rows = (size_t)c->batch * c->heads * c->seq;
    uint16_t *qkv = malloc(qkv_n * 2), *dout = malloc(out_n * 2);
    uint64_t s = 0x5eed0000u + (uint64_t)c->seq * 131u + (uint64_t)dt;
    for (size_t i = 0; i < qkv_n; i++)
        qkv[i] = to_half(rnd(&s), dt);
    for (size_t i = 0; i < out_n; i++)
        dout[i] = to_half(rnd(&s), dt);
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
    if (!g_dnn || !g_fb)
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

static int64_t pad(int64_t x, int64_t to)
{
    return (x + to - 1) / to * to;
}

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
    if (open_ctx(&g_dnn, "cudnn") || open_ctx(&g_fb, "fallback")) {
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
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    int have = g_dnn && g_fb;
    llmt_context_free(g_dnn);
    llmt_context_free(g_fb);
    return failed ? failed : have ? 0 : 77;
}
