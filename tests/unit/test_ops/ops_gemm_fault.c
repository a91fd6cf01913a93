/* A failing CPU GEMM, injected: test_ops links with
 * -Wl,--wrap=llmt_onednn_gemm (tests/CMakeLists.txt), so every oneDNN product
 * the CPU backend makes passes through __wrap_llmt_onednn_gemm, which fails
 * the product chosen by gemm_fail_at() the way oneDNN or a scratchpad that
 * cannot grow would, and passes the others on. The ops that make those
 * products must return that status, with the failing product's message. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "ops_harness.h"

#include "core/error.h"
#include "ops/cpu/cpu_backend.h"

#define INJECTED "injected oneDNN failure"

/* Products left until the one that fails (that one counts 1); 0: none fails. */
static atomic_int g_left;

/* The product n calls from now fails (n >= 1), once. */
static void gemm_fail_at(int n)
{
    atomic_store(&g_left, n);
}

int __real_llmt_onednn_gemm(llmt_onednn *d, int threads, int trans_a, int trans_b, int64_t m,
                            int64_t n, int64_t k, float alpha, const void *a, int64_t lda,
                            const void *b, int64_t ldb, float beta, void *c, int64_t ldc, int dt);

int __wrap_llmt_onednn_gemm(llmt_onednn *d, int threads, int trans_a, int trans_b, int64_t m,
                            int64_t n, int64_t k, float alpha, const void *a, int64_t lda,
                            const void *b, int64_t ldb, float beta, void *c, int64_t ldc, int dt);

int __wrap_llmt_onednn_gemm(llmt_onednn *d, int threads, int trans_a, int trans_b, int64_t m,
                            int64_t n, int64_t k, float alpha, const void *a, int64_t lda,
                            const void *b, int64_t ldb, float beta, void *c, int64_t ldc, int dt)
{
    if (atomic_load(&g_left) > 0 && atomic_fetch_sub(&g_left, 1) == 1)
        return llmt_fail(LLMT_ENOMEM, "cpu gemm: " INJECTED " (%lld x %lld x %lld)",
                         (long long)m, (long long)n, (long long)k);
    return __real_llmt_onednn_gemm(d, threads, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb,
                                   beta, c, ldc, dt);
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

/* Attention's products run on the threads of a parallel region: a failing
 * one fails the op, forward and backward, keeping the failing thread's
 * message (not just its status). */
void check_attention_gemm_failure(void)
{
    backend *b = &g_cpu;
    /* big enough to run on every thread (threads_for) */
    llmt_attn_dims ad = {1, 128, 4, 4, 16};
    const int64_t m = ad.batch * ad.seq, ld = 3 * ad.heads * ad.head_dim;
    const int64_t od = ad.heads * ad.head_dim;
    llmt_op_dims dims = {0};
    dims.batch = ad.batch, dims.seq = ad.seq, dims.hidden = od, dims.heads = ad.heads;
    dims.kv_heads = ad.kv_heads, dims.head_dim = ad.head_dim, dims.dt = LLMT_DTYPE_F32;
    uint64_t s = 11;
    float *x = randn(&s, m * ld, 1.0, LLMT_DTYPE_F32);
    void *scratch = scratch_alloc(b, dims, 0);
    void *qkv = dput(b, x, m * ld, LLMT_DTYPE_F32), *dqkv = dalloc(b, (size_t)(m * ld) * 4);
    void *o = dalloc(b, (size_t)(m * od) * 4);
    void *saved = dalloc(b, b->ops->attention_saved_bytes(&ad));
    for (int pass = 0; pass < 2; pass++) {
        gemm_fail_at(3); /* of a dozen or more */
        int rc = pass == 0 ? b->ops->attention_fwd(b->dev, o, saved, qkv, &ad, LLMT_DTYPE_F32,
                                                   scratch)
                           : b->ops->attention_bwd(b->dev, dqkv, o, qkv, NULL, o, &ad,
                                                   LLMT_DTYPE_F32, scratch);
        assert_true(atomic_exchange(&g_left, 0) <= 0); /* the failure was reached */
        assert_int_equal(rc, LLMT_ENOMEM);
        assert_contains(llmt_error_last(), INJECTED);
    }
    free(x);
    dfree(b, qkv);
    dfree(b, dqkv);
    dfree(b, o);
    dfree(b, saved);
    dfree(b, scratch);
}
