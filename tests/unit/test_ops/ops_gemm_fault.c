/* A failing CPU GEMM, injected, and the products an op makes, recorded:
 * test_ops links with -Wl,--wrap=llmt_onednn_gemm (tests/CMakeLists.txt), so
 * every oneDNN product the CPU backend makes passes through
 * __wrap_llmt_onednn_gemm, which fails the product chosen by gemm_fail_at()
 * the way oneDNN or a scratchpad that cannot grow would, and passes the
 * others on. The ops that make those products must return that status, with
 * the failing product's message. The wrapper also notes each product's
 * operand and result dtypes (g_seen), which tells a native 16-bit product
 * from a widened one. */
#include <omp.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "ops_harness.h"

#include "core/error.h"
#include "ops/cpu/cpu_backend.h"

#define INJECTED "injected oneDNN failure"

/* Products left until the one that fails (that one counts 1); 0: none fails. */
static atomic_int g_left;

/* The operand and result dtypes of the first products since the last
 * seen_reset(), and how many there were (products on other threads than
 * the caller's are not recorded). */
#define SEEN_MAX 8
static struct {
    int count, dt[SEEN_MAX], c_dt[SEEN_MAX];
} g_seen;

static void seen_reset(void)
{
    memset(&g_seen, 0, sizeof g_seen);
}

/* The product n calls from now fails (n >= 1), once. */
static void gemm_fail_at(int n)
{
    atomic_store(&g_left, n);
}

int __real_llmt_onednn_gemm(llmt_onednn *d, int threads, int trans_a, int trans_b, int64_t m,
                            int64_t n, int64_t k, float alpha, const void *a, int64_t lda,
                            const void *b, int64_t ldb, float beta, void *c, int64_t ldc, int dt,
                            int c_dt);

int __wrap_llmt_onednn_gemm(llmt_onednn *d, int threads, int trans_a, int trans_b, int64_t m,
                            int64_t n, int64_t k, float alpha, const void *a, int64_t lda,
                            const void *b, int64_t ldb, float beta, void *c, int64_t ldc, int dt,
                            int c_dt);

int __wrap_llmt_onednn_gemm(llmt_onednn *d, int threads, int trans_a, int trans_b, int64_t m,
                            int64_t n, int64_t k, float alpha, const void *a, int64_t lda,
                            const void *b, int64_t ldb, float beta, void *c, int64_t ldc, int dt,
                            int c_dt)
{
    if (omp_get_thread_num() == 0) {
        if (g_seen.count < SEEN_MAX) {
            g_seen.dt[g_seen.count] = dt;
            g_seen.c_dt[g_seen.count] = c_dt;
        }
        g_seen.count++;
    }
    if (atomic_load(&g_left) > 0 && atomic_fetch_sub(&g_left, 1) == 1)
        return llmt_fail(LLMT_ENOMEM, "cpu gemm: " INJECTED " (%lld x %lld x %lld)",
                         (long long)m, (long long)n, (long long)k);
    return __real_llmt_onednn_gemm(d, threads, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb,
                                   beta, c, ldc, dt, c_dt);
}

/* The fused LM head and cross-entropy (one chunk, fp32, with gradient) makes
 * three products: logits, dh, dw. Failing each in turn fails the op with
 * that product's message; with none failing it succeeds. */
void check_ce_gemm_failure(void)
{
    enum { M = 4, D = 8, V = 16 };
    backend *b = &g_cpu;
    float h[M * D], w[V * D];
    for (int i = 0; i < M * D; i++)
        h[i] = (float)(i % 7) - 3.0f;
    for (int i = 0; i < V * D; i++)
        w[i] = 0.1f * (float)(i % 5);
    const int32_t targets[M] = {1, 2, 3, 4};
    llmt_op_dims dims = {0};
    dims.batch = 1, dims.seq = M, dims.hidden = D, dims.vocab = V, dims.ce_chunk = M;
    dims.dt = LLMT_DTYPE_F32;
    void *scratch = scratch_alloc(b, dims, 0);
    void *hd = dput(b, h, M * D, LLMT_DTYPE_F32), *wd = dput(b, w, V * D, LLMT_DTYPE_F32);
    void *dh = dalloc(b, sizeof h), *dw = dalloc(b, sizeof w);
    for (int fail = 1; fail <= 4; fail++) {
        double loss = -1.0;
        int64_t count = -1;
        llmt_ce_args a = {
            .h = hd, .w = wd, .targets = targets, .m = M, .d = D, .vocab = V, .chunk = M,
            .dt = LLMT_DTYPE_F32, .want_grad = 1, .grad_scale = 1.0f, .dh = dh, .dw = dw,
            .scratch = scratch, .loss_sum = &loss, .count = &count,
        };
        gemm_fail_at(fail);
        int rc = b->ops->lm_head_ce(b->dev, &a);
        int left = atomic_exchange(&g_left, 0);
        if (fail <= 3) {
            assert_int_equal(rc, LLMT_ENOMEM);
            assert_contains(llmt_error_last(), INJECTED);
            assert_true(loss == -1.0); /* nothing reported from stale logits */
        } else {
            assert_int_equal(rc, LLMT_OK);
            assert_int_equal(left, 1); /* exactly three products were made */
            assert_int_equal(count, M);
        }
    }
    dfree(b, hd);
    dfree(b, wd);
    dfree(b, dh);
    dfree(b, dw);
    dfree(b, scratch);
}

/* One attention call's buffers on the CPU backend, in dtype dt: qkv of
 * random values (seed), the output, dqkv, what forward keeps and scratch. */
typedef struct attn_case {
    llmt_attn_dims ad;
    int dt;
    float *x;
    void *scratch, *qkv, *dqkv, *o, *saved;
} attn_case;

static attn_case attn_case_open(llmt_attn_dims ad, int dt, uint64_t seed)
{
    backend *b = &g_cpu;
    const int64_t m = ad.batch * ad.seq, ld = 3 * ad.heads * ad.head_dim;
    const int64_t od = ad.heads * ad.head_dim;
    const size_t es = llmt_dtype_size(dt);
    llmt_op_dims dims = {0};
    dims.batch = ad.batch, dims.seq = ad.seq, dims.hidden = od, dims.heads = ad.heads;
    dims.kv_heads = ad.kv_heads, dims.head_dim = ad.head_dim, dims.dt = dt;
    attn_case c = {.ad = ad, .dt = dt};
    c.x = randn(&seed, m * ld, 1.0, dt);
    c.scratch = scratch_alloc(b, dims, 0);
    c.qkv = dput(b, c.x, m * ld, dt);
    c.dqkv = dalloc(b, (size_t)(m * ld) * es);
    c.o = dalloc(b, (size_t)(m * od) * es);
    c.saved = dalloc(b, b->ops->attention_saved_bytes(&c.ad));
    return c;
}

static void attn_case_free(attn_case *c)
{
    backend *b = &g_cpu;
    free(c->x);
    dfree(b, c->qkv);
    dfree(b, c->dqkv);
    dfree(b, c->o);
    dfree(b, c->saved);
    dfree(b, c->scratch);
}

/* Attention's products run on the threads of a parallel region: a failing
 * one fails the op, forward and backward, keeping the failing thread's
 * message (not just its status). */
void check_attention_gemm_failure(void)
{
    backend *b = &g_cpu;
    /* big enough to run on every thread (threads_for) */
    attn_case c = attn_case_open((llmt_attn_dims){1, 128, 4, 4, 16}, LLMT_DTYPE_F32, 11);
    for (int pass = 0; pass < 2; pass++) {
        gemm_fail_at(3); /* of a dozen or more */
        int rc = pass == 0 ? b->ops->attention_fwd(b->dev, c.o, c.saved, c.qkv, &c.ad,
                                                   LLMT_DTYPE_F32, c.scratch)
                           : b->ops->attention_bwd(b->dev, c.dqkv, c.o, c.qkv, NULL, c.o, &c.ad,
                                                   LLMT_DTYPE_F32, c.scratch);
        assert_true(atomic_exchange(&g_left, 0) <= 0); /* the failure was reached */
        assert_int_equal(rc, LLMT_ENOMEM);
        assert_contains(llmt_error_last(), INJECTED);
    }
    attn_case_free(&c);
}

/* The bf16 LM head's products run natively exactly where bf16 GEMMs do
 * (native: the test's own reading of the CPU and of oneDNN's ISA cap):
 * logits and head gradient from bf16 operands into fp32, dh from bf16 into
 * bf16; widened, all three are fp32 products. One chunk, with gradient. */
void check_ce_native_products(int native)
{
    enum { M = 4, D = 8, V = 16 };
    const int dt = LLMT_DTYPE_BF16;
    backend *b = &g_cpu;
    assert_int_equal(llmt_cpu_gemm_native(b->dev, dt), native);
    uint64_t s = 5;
    float *h = randn(&s, M * D, 1.0, dt), *w = randn(&s, V * D, 0.3, dt);
    const int32_t targets[M] = {1, 2, 3, 4};
    llmt_op_dims dims = {0};
    dims.batch = 1, dims.seq = M, dims.hidden = D, dims.vocab = V, dims.ce_chunk = M;
    dims.dt = dt;
    void *scratch = scratch_alloc(b, dims, 0);
    void *hd = dput(b, h, M * D, dt), *wd = dput(b, w, V * D, dt);
    void *dh = dalloc(b, M * D * 2), *dw = dput(b, w, V * D, dt);
    double loss = -1.0;
    llmt_ce_args a = {
        .h = hd, .w = wd, .targets = targets, .m = M, .d = D, .vocab = V, .chunk = M, .dt = dt,
        .want_grad = 1, .grad_scale = 1.0f, .dh = dh, .dw = dw, .scratch = scratch,
        .loss_sum = &loss,
    };
    seen_reset();
    OK(b->ops->lm_head_ce(b->dev, &a));
    assert_int_equal(g_seen.count, 3);
    const int operands = native ? dt : LLMT_DTYPE_F32; /* logits, dh, head gradient */
    const int results[3] = {LLMT_DTYPE_F32, operands, LLMT_DTYPE_F32};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(g_seen.dt[i], operands);
        assert_int_equal(g_seen.c_dt[i], results[i]);
    }
    free(h);
    free(w);
    dfree(b, hd);
    dfree(b, wd);
    dfree(b, dh);
    dfree(b, dw);
    dfree(b, scratch);
}

/* bf16 attention's products likewise (one head, one block of queries):
 * forward scores from bf16 operands into fp32, and the output P V in fp32
 * either way; backward dP (fp32), dQ (bf16), dK and dV (fp32 accumulators),
 * all from bf16 operands; widened, all six are fp32 products. */
void check_attention_native_products(int native)
{
    const int dt = LLMT_DTYPE_BF16;
    backend *b = &g_cpu;
    attn_case c = attn_case_open((llmt_attn_dims){1, 8, 1, 1, 16}, dt, 3);
    const int operands = native ? dt : LLMT_DTYPE_F32;
    seen_reset();
    OK(b->ops->attention_fwd(b->dev, c.o, c.saved, c.qkv, &c.ad, dt, c.scratch));
    assert_int_equal(g_seen.count, 2);
    const int fwd_operands[2] = {operands, LLMT_DTYPE_F32};
    for (int i = 0; i < 2; i++) {
        assert_int_equal(g_seen.dt[i], fwd_operands[i]);
        assert_int_equal(g_seen.c_dt[i], LLMT_DTYPE_F32);
    }
    seen_reset();
    OK(b->ops->attention_bwd(b->dev, c.dqkv, c.o, c.qkv, c.saved, c.o, &c.ad, dt, c.scratch));
    assert_int_equal(g_seen.count, 4);
    const int bwd_results[4] = {LLMT_DTYPE_F32, operands, LLMT_DTYPE_F32, LLMT_DTYPE_F32};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(g_seen.dt[i], operands);
        assert_int_equal(g_seen.c_dt[i], bwd_results[i]);
    }
    attn_case_free(&c);
}
