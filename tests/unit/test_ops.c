/* The backend op table, op by op, written once and run per backend.
 *
 * Every op runs on fresh random inputs, stored in the dtype under test
 * (F32, BF16, F16), with its outputs poisoned (all bytes 0xFF: NaN in every
 * dtype) before the run, so an element an op forgets to write shows up.
 *
 * - On the CPU backend (the reference implementation) each op is compared
 *   with a naive double-precision computation from the same (rounded)
 *   inputs, written here from the op's definition in lib/ops/ops.h.
 * - On the CUDA backend each op is compared with the CPU backend's result on
 *   the same inputs, run twice to check that it gives the same bits both
 *   times. Without a usable CUDA device these tests call skip(), or fail
 *   under LLMT_REQUIRE_CUDA=1 (cuda_required.h).
 *
 * Errors are measured as max |got - want| over an output, relative to the
 * largest |want| of that output (so a tolerance is a fraction of the
 * output's scale). Tolerances, per storage dtype:
 * - F32 1e-5: both sides compute in fp32 with sums of at most a few hundred
 *   terms in different orders; fp32 rounding (6e-8 per operation) leaves
 *   them within ~1e-6 of each other and of the double result.
 * - BF16 2e-2: a bf16 result is within half an ulp (2^-9 = 2e-3 of its own
 *   magnitude) of the fp32 value it rounds; two backends whose fp32 values
 *   differ in the last bits can round to neighbouring values (one ulp, 4e-3),
 *   and ops that round an intermediate (attention's output feeds its
 *   backward; the CE gradient on CUDA) stack a few of these.
 * - F16 2e-3: the same with F16's 10-bit mantissa (ulp 2^-10 = 1e-3).
 * The double reference is exact to ~1e-15, so the same numbers bound the
 * CPU's error.
 *
 * The harness is tests/unit/test_ops/ops_harness.[ch]; each op's inputs,
 * runner and reference are in tests/unit/test_ops/ops_*.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cuda_required.h"
#include "ops/cpu/cpu_backend.h"
#include "test_ops/ops_harness.h"
#include "test_rand.h"

#define OP_TESTS(NAME, DESC)                                                                \
    static void test_##NAME##_cpu(void **state)                                            \
    {                                                                                      \
        (void)state;                                                                       \
        check_cpu(&DESC);                                                                  \
    }                                                                                      \
    static void test_##NAME##_cuda(void **state)                                           \
    {                                                                                      \
        (void)state;                                                                       \
        check_cuda(&DESC);                                                                 \
    }

OP_TESTS(gemm, gemm_test)
OP_TESTS(gemm_model, gemm_model_test)
OP_TESTS(gemm_cd, gemm_cd_test)
OP_TESTS(embedding, embed_test)
OP_TESTS(rmsnorm, rms_test)
OP_TESTS(rope, rope_test)
OP_TESTS(attention, attn_test)
OP_TESTS(swiglu, swiglu_test)
OP_TESTS(add_cast, add_test)
OP_TESTS(lm_head_ce, ce_test)
OP_TESTS(grad_stats, gs_test)
OP_TESTS(adamw, adamw_test)

static void test_gemm_cd_bits_cpu(void **state)
{
    (void)state;
    check_gemm_cd_cpu_bits();
    check_gemm_cd_refusals(&g_cpu);
}

static void test_ce_many_rows_cpu(void **state)
{
    (void)state;
    check_ce_many_rows(&g_cpu);
}

static void test_ce_many_rows_cuda(void **state)
{
    (void)state;
    if (!g_have_cuda)
        cuda_unavailable(g_cuda_why);
    check_ce_many_rows(&g_cuda);
}

static void test_gemm_cd_refusals_cuda(void **state)
{
    (void)state;
    if (!g_have_cuda)
        cuda_unavailable(g_cuda_why);
    check_gemm_cd_refusals(&g_cuda);
}

static void test_adamw_cpu_bits(void **state)
{
    (void)state;
    check_adamw_cpu_bits();
}

static void test_adamw_stochastic_bits_cuda(void **state)
{
    (void)state;
    if (!g_have_cuda)
        cuda_unavailable(g_cuda_why);
    check_stochastic_bits();
}

/* 1 under `test_ops widened`: the CPU's 16-bit instructions are masked off
 * (CTest runs it with ONEDNN_MAX_CPU_ISA=AVX512_CORE). */
static int g_widened;

/* 1 unless oneDNN's ISA cap, as the environment sets it, masks off the
 * bf16 instructions. oneDNN 2.6 reads ONEDNN_MAX_CPU_ISA, else the older
 * DNNL_MAX_CPU_ISA, case-insensitively; a value it does not know leaves every
 * ISA allowed. The caps below AVX512_CORE_BF16 are those of its manual. */
static int isa_cap_allows_bf16(void)
{
    const char *cap = getenv("ONEDNN_MAX_CPU_ISA");
    if (!cap || !*cap)
        cap = getenv("DNNL_MAX_CPU_ISA");
    if (!cap)
        return 1;
    static const char *const below[] = {"SSE41",      "AVX",           "AVX2",
                                        "AVX2_VNNI",  "AVX512_MIC",    "AVX512_MIC_4OPS",
                                        "AVX512_CORE", "AVX512_CORE_VNNI"};
    for (size_t i = 0; i < sizeof below / sizeof *below; i++)
        if (strcasecmp(cap, below[i]) == 0)
            return 0;
    return 1;
}

/* The CPU backend multiplies bf16 with the CPU's own instructions exactly
 * where it has them (AVX512_BF16, which AMX CPUs also have) and they are not
 * masked off (by `test_ops widened`'s environment, or the user's), fp32
 * always, fp16 never (Debian's oneDNN 2.6 has no fp16 matmul); a product on
 * two threads gives the same bits twice. */
static void test_gemm_dispatch_cpu(void **state)
{
    (void)state;
    backend *b = &g_cpu;
    if (g_widened)
        assert_false(isa_cap_allows_bf16()); /* else `widened` would test nothing */
    const int bf16 = isa_cap_allows_bf16() && __builtin_cpu_supports("avx512bf16");
    assert_int_equal(llmt_cpu_gemm_native(b->dev, LLMT_DTYPE_BF16), bf16);
    assert_int_equal(llmt_cpu_gemm_native(b->dev, LLMT_DTYPE_F32), 1);
    assert_int_equal(llmt_cpu_gemm_native(b->dev, LLMT_DTYPE_F16), 0);
    enum { M = 300, N = 200, K = 600 };
    uint64_t s = 7;
    float *x = randn(&s, M * K, 1.0, LLMT_DTYPE_BF16), *w = randn(&s, N * K, 1.0, LLMT_DTYPE_BF16);
    void *a = dput(b, x, M * K, LLMT_DTYPE_BF16), *bb = dput(b, w, N * K, LLMT_DTYPE_BF16);
    void *c[2];
    llmt_op_dims dims = {0};
    dims.dt = LLMT_DTYPE_BF16;
    void *scratch = scratch_alloc(b, dims, (M * K + N * K + M * N) * sizeof(float));
    for (int r = 0; r < 2; r++) {
        c[r] = dalloc(b, M * N * 2);
        OK(b->ops->gemm(b->dev, 0, 1, M, N, K, 1.0f, a, K, bb, K, 0.0f, c[r], N,
                        LLMT_DTYPE_BF16, scratch));
    }
    assert_memory_equal(c[0], c[1], M * N * 2);
    for (int r = 0; r < 2; r++)
        dfree(b, c[r]);
    dfree(b, a);
    dfree(b, bb);
    dfree(b, scratch);
    free(x);
    free(w);
}

/* The bf16 LM head and attention multiply on the CPU's bf16 instructions
 * where the dispatch test above expects them, and widen where they are
 * masked off. */
static void test_bf16_products_native_cpu(void **state)
{
    (void)state;
    const int native = isa_cap_allows_bf16() && __builtin_cpu_supports("avx512bf16");
    check_ce_native_products(native);
    check_attention_native_products(native);
}

/* k = 0: C = beta C in every dtype, beta 0 overwriting what C held. */
static void test_gemm_empty_k_cpu(void **state)
{
    (void)state;
    backend *b = &g_cpu;
    for (int v = 0; v < 3; v++) {
        const int dt = dtypes[v];
        const float c0[6] = {1, -2, 3, -4, 5, -6};
        float got[6];
        llmt_op_dims dims = {0};
        dims.dt = dt;
        void *scratch = scratch_alloc(b, dims, 64);
        void *ab = dalloc(b, 64), *c = dput(b, c0, 6, dt);
        OK(b->ops->gemm(b->dev, 0, 0, 2, 3, 0, 1.0f, ab, 1, ab, 3, 0.5f, c, 3, dt, scratch));
        dget(b, got, c, 6, dt);
        for (int i = 0; i < 6; i++)
            assert_true(got[i] == 0.5f * c0[i]);
        float poison[6] = {NAN, NAN, NAN, NAN, NAN, NAN};
        dfree(b, c);
        c = dput(b, poison, 6, dt);
        OK(b->ops->gemm(b->dev, 0, 0, 2, 3, 0, 1.0f, ab, 1, ab, 3, 0.0f, c, 3, dt, scratch));
        dget(b, got, c, 6, dt);
        for (int i = 0; i < 6; i++)
            assert_true(got[i] == 0.0f);
        dfree(b, c);
        dfree(b, ab);
        dfree(b, scratch);
    }
}

/* A failing product fails the ops that make it (an injected failure). */
static void test_gemm_failure_cpu(void **state)
{
    (void)state;
    check_ce_gemm_failure();
    check_attention_gemm_failure();
}

/* A signal during a product is handled on the stack, not over the heap. */
static void test_gemm_signals_cpu(void **state)
{
    (void)state;
    check_gemm_signals();
}

/* Per-block gradient statistics. Both backends add exact double squares in
 * double (the CPU in 16 lanes, CUDA in a tree): well within 1e-12. */
static void test_grad_stats_blocks_cpu(void **state)
{
    (void)state;
    check_grad_stats_blocks(&g_cpu, 1e-12);
}

static void test_grad_stats_blocks_cuda(void **state)
{
    (void)state;
    if (!g_have_cuda)
        cuda_unavailable(g_cuda_why);
    check_grad_stats_blocks(&g_cuda, 1e-12);
    check_grad_stats_blocks_args(&g_cuda);
}

/* One ulp of the 16-bit dtype dt (BF16 or F16) at x, a nonzero normal value. */
static double ulp16(double x, int dt)
{
    int e;
    frexp(x, &e); /* |x| = f 2^e, f in [0.5, 1) */
    return ldexp(1.0, e - 1 - (dt == LLMT_DTYPE_BF16 ? 7 : 10));
}

/* Embedding backward where one id repeats a thousand times with dout far
 * below its row's ulp (issue 17: rounding after every add lost them all).
 * Each element must be round(float(dtable) + the fp32 sum of its tokens'
 * dout in token order), bit for bit, computed here on the host; in the
 * 16-bit dtypes that is within one ulp of the exact sum. Rows no token
 * names stay as they were. D needs two of CUDA's 4096-column tiles. */
static void check_embedding_swamping(backend *b)
{
    enum { V = 6, M = 1100, D = 4100, HOT = 2 };
    for (int v = 0; v < 3; v++) {
        const int dt = dtypes[v];
        /* an eighth of the 16-bit dtype's ulp at 1 (fp32 takes bf16's) */
        const double tiny = dt == LLMT_DTYPE_F16 ? 0x1p-13 : 0x1p-10;
        uint64_t s = 77;
        int32_t ids[M];
        for (int i = 0; i < M; i++) /* V - 1 never occurs */
            ids[i] = i % 11 == 3 ? (int32_t)(trand_u64(&s) % (V - 1)) : HOT;
        float *init = malloc((size_t)V * D * sizeof *init);
        float *dout = malloc((size_t)M * D * sizeof *dout);
        for (int64_t e = 0; e < (int64_t)V * D; e++)
            init[e] = round_dt((float)(1.0 + 0.5 * trand_uniform(&s)), dt);
        for (int i = 0; i < M; i++)
            for (int c = 0; c < D; c++)
                dout[(int64_t)i * D + c] =
                    round_dt((float)(ids[i] == HOT ? tiny * (trand_uniform(&s) - 0.2)
                                                   : trand_normal(&s)),
                             dt);
        void *dids = dput_raw(b, ids, sizeof ids), *ddout = dput(b, dout, (int64_t)M * D, dt);
        void *dtable = dput(b, init, (int64_t)V * D, dt);
        OK(b->ops->embedding_bwd(b->dev, dtable, ddout, dids, M, D, dt));
        float *got = malloc((size_t)V * D * sizeof *got);
        dget(b, got, dtable, (int64_t)V * D, dt);
        int64_t wrong = 0, far = 0;
        for (int r = 0; r < V; r++)
            for (int c = 0; c < D; c++) {
                float acc = init[(int64_t)r * D + c];
                double exact = acc;
                for (int i = 0; i < M; i++)
                    if (ids[i] == r) {
                        acc += dout[(int64_t)i * D + c];
                        exact += dout[(int64_t)i * D + c];
                    }
                const float want = round_dt(acc, dt), g = got[(int64_t)r * D + c];
                wrong += memcmp(&want, &g, sizeof g) != 0;
                far += dt != LLMT_DTYPE_F32 && fabs(g - exact) > ulp16(exact, dt);
            }
        if (wrong || far)
            fail_msg("%s embedding_bwd %s: %lld of %d elements differ from the fp32 token-order "
                     "sum rounded once, %lld are more than one ulp from the exact sum",
                     b->name, llmt_dtype_name(dt), (long long)wrong, V * D, (long long)far);
        free(init);
        free(dout);
        free(got);
        dfree(b, dids);
        dfree(b, ddout);
        dfree(b, dtable);
    }
}

static void test_embedding_swamping_cpu(void **state)
{
    (void)state;
    check_embedding_swamping(&g_cpu);
}

static void test_embedding_swamping_cuda(void **state)
{
    (void)state;
    if (!g_have_cuda)
        cuda_unavailable(g_cuda_why);
    check_embedding_swamping(&g_cuda);
}

/* grad_stats and grad_stats_blocks over gradients holding finite values
 * whose fp32 square overflows (issue 17: |x| > 1.8e19 gave an infinite sum
 * with no non-finite value counted): the sum of squares, and each block's,
 * within 1e-12 of the sum of exact double squares, and none non-finite; in
 * fp32 and bf16, with and without a value near fp32's largest. */
static void check_grad_stats_huge(backend *b)
{
    enum { N = 6000, BLOCK = 4096 };
    const float factor = 0.5f; /* a power of two: factor g is exact */
    void *scratch = dalloc(b, b->ops->optim_scratch_bytes);
    for (int v = 0; v < 4; v++) {
        const int dt = v & 1 ? LLMT_DTYPE_BF16 : LLMT_DTYPE_F32, near_max = v >> 1;
        uint64_t s = 5;
        float *g = randn(&s, N, 1.0, dt);
        g[7] = round_dt(1e20f, dt);
        g[N - 3] = round_dt(-4e19f, dt);
        if (near_max)
            g[BLOCK + 1] = round_dt(-3e38f, dt);
        double want = 0.0, want_blk[2] = {0.0, 0.0};
        for (int i = 0; i < N; i++) {
            const double x = (double)(g[i] * factor);
            want += x * x;
            want_blk[i / BLOCK] += x * x;
        }
        void *dg = dput(b, g, N, dt);
        double sumsq = NAN, part[2] = {NAN, NAN};
        int64_t bad = -1, bad_blk = -1;
        OK(b->ops->grad_stats(b->dev, dg, N, dt, factor, &sumsq, &bad, scratch));
        OK(b->ops->grad_stats_blocks(b->dev, dg, N, dt, factor, BLOCK, part, &bad_blk, scratch));
        const double err = fabs(sumsq - want) / want;
        const double err_blk = fmax(fabs(part[0] - want_blk[0]) / want_blk[0],
                                    fabs(part[1] - want_blk[1]) / want_blk[1]);
        if (!(err <= 1e-12 && err_blk <= 1e-12) || bad != 0 || bad_blk != 0)
            fail_msg("%s grad_stats %s%s: sum of squares %g (want %g), blocks %g %g (want %g "
                     "%g), non-finite %lld and %lld (want 0)",
                     b->name, llmt_dtype_name(dt), near_max ? " with -3e38" : "", sumsq, want,
                     part[0], part[1], want_blk[0], want_blk[1], (long long)bad,
                     (long long)bad_blk);
        free(g);
        dfree(b, dg);
    }
    dfree(b, scratch);
}

static void test_grad_stats_huge_cpu(void **state)
{
    (void)state;
    check_grad_stats_huge(&g_cpu);
}

static void test_grad_stats_huge_cuda(void **state)
{
    (void)state;
    if (!g_have_cuda)
        cuda_unavailable(g_cuda_why);
    check_grad_stats_huge(&g_cuda);
}

/* The CUDA backend refuses what it does not handle, with a message. */
static void test_unsupported_cuda(void **state)
{
    (void)state;
    if (!g_have_cuda)
        cuda_unavailable(g_cuda_why);
    backend *b = &g_cuda;
    llmt_attn_dims ad = {1, 8, 2, 1, 48};
    void *buf = dalloc(b, 4096);
    assert_int_equal(b->ops->attention_fwd(b->dev, buf, NULL, buf, &ad, LLMT_DTYPE_F32, buf),
                     LLMT_EUNSUPPORTED);
    assert_contains(llmt_error_last(), "head_dim = 48");
    llmt_adamw_args a = {0};
    a.n = 4;
    a.w_dt = LLMT_DTYPE_F16;
    a.state_dt = LLMT_DTYPE_F16;
    a.w = a.m = a.v = buf;
    a.g = buf;
    assert_int_equal(b->ops->adamw(b->dev, &a), LLMT_EUNSUPPORTED);
    dfree(b, buf);
}

/* test_ops runs the CPU half (each op against the double reference);
 * test_ops cuda the CUDA half (each op against the CPU), which exits 77,
 * CTest's "skipped", when no CUDA device can be opened (and fails instead
 * under LLMT_REQUIRE_CUDA=1); test_ops widened the CPU's GEMMs with its
 * 16-bit instructions masked off (ONEDNN_MAX_CPU_ISA=AVX512_CORE). */
int main(int argc, char **argv)
{
    int cuda = argc > 1 && strcmp(argv[1], "cuda") == 0;
    g_widened = argc > 1 && strcmp(argv[1], "widened") == 0;
    if (argc > 1 && !cuda && !g_widened) {
        fprintf(stderr, "usage: %s [cuda|widened]\n", argv[0]);
        return 2;
    }
    open_backends();
    const struct CMUnitTest widened_tests[] = {
        cmocka_unit_test(test_gemm_dispatch_cpu),
        cmocka_unit_test(test_gemm_empty_k_cpu),
        cmocka_unit_test(test_gemm_cpu),
        cmocka_unit_test(test_gemm_model_cpu),
        cmocka_unit_test(test_gemm_cd_cpu),
        cmocka_unit_test(test_gemm_cd_bits_cpu),
        cmocka_unit_test(test_attention_cpu),
        cmocka_unit_test(test_lm_head_ce_cpu),
        cmocka_unit_test(test_bf16_products_native_cpu),
    };
    const struct CMUnitTest cpu_tests[] = {
        cmocka_unit_test(test_gemm_dispatch_cpu),
        cmocka_unit_test(test_gemm_empty_k_cpu),
        cmocka_unit_test(test_gemm_cpu),
        cmocka_unit_test(test_gemm_model_cpu),
        cmocka_unit_test(test_gemm_cd_cpu),
        cmocka_unit_test(test_gemm_cd_bits_cpu),
        cmocka_unit_test(test_embedding_cpu),
        cmocka_unit_test(test_embedding_swamping_cpu),
        cmocka_unit_test(test_rmsnorm_cpu),
        cmocka_unit_test(test_rope_cpu),
        cmocka_unit_test(test_attention_cpu),
        cmocka_unit_test(test_swiglu_cpu),
        cmocka_unit_test(test_add_cast_cpu),
        cmocka_unit_test(test_lm_head_ce_cpu),
        cmocka_unit_test(test_ce_many_rows_cpu),
        cmocka_unit_test(test_bf16_products_native_cpu),
        cmocka_unit_test(test_grad_stats_cpu),
        cmocka_unit_test(test_grad_stats_blocks_cpu),
        cmocka_unit_test(test_grad_stats_huge_cpu),
        cmocka_unit_test(test_adamw_cpu),
        cmocka_unit_test(test_adamw_cpu_bits),
        cmocka_unit_test(test_gemm_failure_cpu),
        cmocka_unit_test(test_gemm_signals_cpu),
    };
    const struct CMUnitTest cuda_tests[] = {
        cmocka_unit_test(test_gemm_cuda),
        cmocka_unit_test(test_gemm_model_cuda),
        cmocka_unit_test(test_gemm_cd_cuda),
        cmocka_unit_test(test_gemm_cd_refusals_cuda),
        cmocka_unit_test(test_embedding_cuda),
        cmocka_unit_test(test_embedding_swamping_cuda),
        cmocka_unit_test(test_rmsnorm_cuda),
        cmocka_unit_test(test_rope_cuda),
        cmocka_unit_test(test_attention_cuda),
        cmocka_unit_test(test_swiglu_cuda),
        cmocka_unit_test(test_add_cast_cuda),
        cmocka_unit_test(test_lm_head_ce_cuda),
        cmocka_unit_test(test_ce_many_rows_cuda),
        cmocka_unit_test(test_grad_stats_cuda),
        cmocka_unit_test(test_grad_stats_blocks_cuda),
        cmocka_unit_test(test_grad_stats_huge_cuda),
        cmocka_unit_test(test_adamw_cuda),
        cmocka_unit_test(test_adamw_stochastic_bits_cuda),
        cmocka_unit_test(test_unsupported_cuda),
    };
    int failed = cuda       ? cmocka_run_group_tests_name("cuda", cuda_tests, NULL, NULL)
                 : g_widened ? cmocka_run_group_tests_name("widened", widened_tests, NULL, NULL)
                             : cmocka_run_group_tests_name("cpu", cpu_tests, NULL, NULL);
    close_backends();
    return failed ? failed : cuda && !g_have_cuda ? 77 : 0;
}

