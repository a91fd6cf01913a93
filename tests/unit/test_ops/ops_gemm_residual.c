/* Op tests of gemm_cd, the GEMM with a separate output that carries the
 * residual adds (D = alpha op(A) op(B) + beta C): against a double reference
 * (CPU) or the CPU (CUDA), with C left untouched byte for byte, D's padding
 * columns unwritten, D == C in place, C never read when beta is 0, k = 0;
 * the CPU's bits equal to copy + gemm; the refused arguments. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops_harness.h"

enum { RM = 33, RN = 27, RK = 41, CASES = 6 };
/* What the bytes around D's block and a poisoned C hold. */
#define D_PAD 0x5A
#define POISON 0xFF

typedef struct gemm_cd_in {
    int dt;
    float alpha;
    int ta[CASES], tb[CASES], in_place[CASES];
    int64_t k[CASES], lda[CASES], ldb[CASES], ldc[CASES], ldd[CASES];
    float beta[CASES];
    float *a[CASES], *b[CASES], *c[CASES]; /* stored shapes, with their leading dimensions */
} gemm_cd_in;

/* Case c: transposes, k, beta, in place or not, C and D strides. */
static const struct {
    int ta, tb, k, in_place, ldc_pad, ldd_pad;
    float beta;
} cases[CASES] = {
    {0, 1, RK, 0, 0, 0, 1.0f},  /* the model's residual product */
    {0, 1, RK, 0, 1, 3, 1.0f},  /* C and D with different padding */
    {1, 0, RK, 0, 2, 0, 0.5f},  /* another beta */
    {1, 1, RK, 1, 2, 2, 1.0f},  /* D == C */
    {0, 0, RK, 0, 0, 1, 0.0f},  /* beta 0: C poisoned, never read */
    {0, 1, 0, 0, 1, 2, 0.75f},  /* k = 0: D = beta C */
};

static void *gemm_cd_make(int v, uint64_t seed)
{
    uint64_t s = seed;
    gemm_cd_in *in = calloc(1, sizeof *in);
    in->dt = dtypes[v];
    in->alpha = 0.625f;
    for (int c = 0; c < CASES; c++) {
        const int64_t k = cases[c].k;
        in->ta[c] = cases[c].ta, in->tb[c] = cases[c].tb, in->k[c] = k;
        in->in_place[c] = cases[c].in_place, in->beta[c] = cases[c].beta;
        in->lda[c] = (in->ta[c] ? RM : k) + 1;
        in->ldb[c] = (in->tb[c] ? k : RN) + 2;
        in->ldc[c] = RN + cases[c].ldc_pad;
        in->ldd[c] = RN + cases[c].ldd_pad;
        in->a[c] = randn(&s, (in->ta[c] ? k : RM) * in->lda[c], 1.0, in->dt);
        in->b[c] = randn(&s, (in->tb[c] ? RN : k) * in->ldb[c], 1.0, in->dt);
        in->c[c] = randn(&s, RM * in->ldc[c], 1.0, in->dt);
    }
    return in;
}

static void gemm_cd_free(void *p)
{
    gemm_cd_in *in = p;
    for (int c = 0; c < CASES; c++) {
        free(in->a[c]);
        free(in->b[c]);
        free(in->c[c]);
    }
    free(in);
}

static void case_name(char *buf, size_t cap, const gemm_cd_in *in, int c)
{
    snprintf(buf, cap, "D %s%s k %lld beta %g%s", in->ta[c] ? "A^T" : "A",
             in->tb[c] ? "B^T" : "B", (long long)in->k[c], (double)in->beta[c],
             in->in_place[c] ? " D=C" : "");
}

/* The RM x RN block of a matrix with leading dimension ld, as doubles. */
static void add_block(result *r, const char *name, const float *x, int64_t ld)
{
    double *d = malloc(RM * RN * sizeof *d);
    for (int i = 0; i < RM; i++)
        for (int j = 0; j < RN; j++)
            d[i * RN + j] = x[i * ld + j];
    add_d(r, name, d, RM * RN);
    free(d);
}

/* C's bytes as the op receives them: its values, or POISON with beta 0. */
static unsigned char *c_bytes(const gemm_cd_in *in, int c)
{
    const size_t bytes = (size_t)(RM * in->ldc[c]) * llmt_dtype_size(in->dt);
    unsigned char *h = pack(in->c[c], RM * in->ldc[c], in->dt);
    if (in->beta[c] == 0.0f)
        memset(h, POISON, bytes);
    return h;
}

/* D's bytes before the op: POISON in the block (a forgotten element shows
 * as NaN), D_PAD in the padding columns. */
static unsigned char *d_bytes(const gemm_cd_in *in, int c)
{
    const size_t e = llmt_dtype_size(in->dt), bytes = (size_t)(RM * in->ldd[c]) * e;
    unsigned char *h = malloc(bytes);
    memset(h, D_PAD, bytes);
    for (int i = 0; i < RM; i++)
        memset(h + (size_t)(i * in->ldd[c]) * e, POISON, (size_t)RN * e);
    return h;
}

static void gemm_cd_run(backend *b, int v, const void *p, result *out)
{
    const gemm_cd_in *in = p;
    const int dt = in->dt;
    const size_t e = llmt_dtype_size(dt);
    llmt_op_dims dims = {0};
    dims.dt = dt;
    void *scratch = scratch_alloc(b, dims, (RM * RK + RN * RK + RM * RN) * sizeof(float));
    for (int c = 0; c < CASES; c++) {
        const int64_t k = in->k[c];
        const int64_t na = (in->ta[c] ? k : RM) * in->lda[c];
        const int64_t nb = (in->tb[c] ? RN : k) * in->ldb[c];
        void *a = dput(b, in->a[c], na, dt), *bb = dput(b, in->b[c], nb, dt);
        const size_t cb = (size_t)(RM * in->ldc[c]) * e, db = (size_t)(RM * in->ldd[c]) * e;
        unsigned char *hc = c_bytes(in, c), *hd = in->in_place[c] ? NULL : d_bytes(in, c);
        void *dc = dput_raw(b, hc, cb), *dd = in->in_place[c] ? dc : dput_raw(b, hd, db);
        OK(b->ops->gemm_cd(b->dev, in->ta[c], in->tb[c], RM, RN, k, in->alpha, a, in->lda[c], bb,
                           in->ldb[c], in->beta[c], dc, in->ldc[c], dd, in->ldd[c], dt, scratch));
        char name[48];
        case_name(name, sizeof name, in, c);
        if (!in->in_place[c]) {
            unsigned char *after = malloc(cb > db ? cb : db);
            OK(b->ops->copy_to_host(b->dev, after, dc, cb));
            if (memcmp(after, hc, cb) != 0)
                fail_msg("%s gemm_cd %s (%s): C was written", b->name, name, dt_name(v));
            OK(b->ops->copy_to_host(b->dev, after, dd, db));
            for (int i = 0; i < RM; i++)
                for (size_t x = (size_t)(i * in->ldd[c] + RN) * e;
                     x < (size_t)(i + 1) * in->ldd[c] * e; x++)
                    if (after[x] != D_PAD)
                        fail_msg("%s gemm_cd %s (%s): D padding byte %zu of row %d written",
                                 b->name, name, dt_name(v), x, i);
            free(after);
        }
        float *h = malloc((size_t)(RM * in->ldd[c]) * sizeof *h);
        dget(b, h, dd, RM * in->ldd[c], dt);
        add_block(out, name, h, in->ldd[c]);
        free(h);
        free(hc);
        free(hd);
        dfree(b, a);
        dfree(b, bb);
        dfree(b, dc);
        if (dd != dc)
            dfree(b, dd);
    }
    dfree(b, scratch);
}

static void gemm_cd_ref(int v, const void *p, result *out)
{
    (void)v;
    const gemm_cd_in *in = p;
    double *d = malloc(RM * RN * sizeof *d);
    for (int c = 0; c < CASES; c++) {
        const int64_t la = in->lda[c], lb = in->ldb[c];
        for (int i = 0; i < RM; i++)
            for (int j = 0; j < RN; j++) {
                double acc = 0.0;
                for (int64_t k = 0; k < in->k[c]; k++) {
                    double x = in->ta[c] ? in->a[c][k * la + i] : in->a[c][i * la + k];
                    double y = in->tb[c] ? in->b[c][j * lb + k] : in->b[c][k * lb + j];
                    acc += x * y;
                }
                const double c0 = in->beta[c] != 0.0f ? in->c[c][i * in->ldc[c] + j] : 0.0;
                d[i * RN + j] = in->alpha * acc + in->beta[c] * c0;
            }
        char name[48];
        case_name(name, sizeof name, in, c);
        add_d(out, name, d, RM * RN);
    }
    free(d);
}

static int gemm_cd_dt(int v)
{
    return dtypes[v];
}

const op_test gemm_cd_test = {"gemm_cd", 3, dt_name, gemm_cd_dt, gemm_cd_make, gemm_cd_run,
                              gemm_cd_ref, gemm_cd_free, 1.0};

void check_gemm_cd_cpu_bits(void)
{
    backend *b = &g_cpu;
    for (int v = 0; v < 3; v++) {
        gemm_cd_in *in = gemm_cd_make(v, 31 + (uint64_t)v);
        const int dt = in->dt, c = 1; /* C and D with different padding */
        const size_t e = llmt_dtype_size(dt), db = (size_t)(RM * in->ldd[c]) * e;
        llmt_op_dims dims = {0};
        dims.dt = dt;
        void *scratch = scratch_alloc(b, dims, (RM * RK + RN * RK + RM * RN) * sizeof(float));
        void *a = dput(b, in->a[c], (in->ta[c] ? RK : RM) * in->lda[c], dt);
        void *bb = dput(b, in->b[c], (in->tb[c] ? RN : RK) * in->ldb[c], dt);
        void *dc = dput(b, in->c[c], RM * in->ldc[c], dt);
        unsigned char *hd = d_bytes(in, c), *want = malloc(db), *got = malloc(db);
        /* Today's way: C's rows copied into D, then a beta = 1 product on D. */
        void *dd = dput_raw(b, hd, db);
        for (int i = 0; i < RM; i++)
            OK(b->ops->copy_on_device(b->dev, (char *)dd + (size_t)(i * in->ldd[c]) * e,
                                      (char *)dc + (size_t)(i * in->ldc[c]) * e, (size_t)RN * e));
        OK(b->ops->gemm(b->dev, in->ta[c], in->tb[c], RM, RN, RK, in->alpha, a, in->lda[c], bb,
                        in->ldb[c], in->beta[c], dd, in->ldd[c], dt, scratch));
        OK(b->ops->copy_to_host(b->dev, want, dd, db));
        dfree(b, dd);
        dd = dput_raw(b, hd, db);
        OK(b->ops->gemm_cd(b->dev, in->ta[c], in->tb[c], RM, RN, RK, in->alpha, a, in->lda[c], bb,
                           in->ldb[c], in->beta[c], dc, in->ldc[c], dd, in->ldd[c], dt, scratch));
        OK(b->ops->copy_to_host(b->dev, got, dd, db));
        if (memcmp(got, want, db) != 0)
            fail_msg("cpu gemm_cd %s: not the bits of copy + gemm", dt_name(v));
        free(hd);
        free(want);
        free(got);
        dfree(b, a);
        dfree(b, bb);
        dfree(b, dc);
        dfree(b, dd);
        dfree(b, scratch);
        gemm_cd_free(in);
    }
}

void check_gemm_cd_refusals(backend *b)
{
    const int dt = LLMT_DTYPE_F32;
    float *x = calloc(4 * RN * RN, sizeof *x);
    void *buf = dput(b, x, 4 * RN * RN, dt), *a = dput(b, x, RN * RN, dt);
    char *base = buf;
    /* D is C with another leading dimension. */
    assert_int_equal(b->ops->gemm_cd(b->dev, 0, 0, RN, RN, RN, 1.0f, a, RN, a, RN, 1.0f, base, RN,
                                     base, RN + 1, dt, NULL),
                     LLMT_EINVAL);
    assert_contains(llmt_error_last(), "ldd = 28 differs from ldc = 27");
    /* D overlaps C's last row. */
    char *d = base + (size_t)((RN - 1) * RN + 3) * sizeof(float);
    assert_int_equal(b->ops->gemm_cd(b->dev, 0, 0, RN, RN, RN, 1.0f, a, RN, a, RN, 1.0f, base, RN,
                                     d, RN, dt, NULL),
                     LLMT_EINVAL);
    assert_contains(llmt_error_last(), "d overlaps c");
    /* C missing while beta reads it. */
    assert_int_equal(b->ops->gemm_cd(b->dev, 0, 0, RN, RN, RN, 1.0f, a, RN, a, RN, 1.0f, NULL, RN,
                                     base, RN, dt, NULL),
                     LLMT_EINVAL);
    assert_contains(llmt_error_last(), "c is NULL with beta = 1");
    /* D right after C's block: no overlap, accepted; beta 0 with no C too. */
    OK(b->ops->gemm_cd(b->dev, 0, 0, RN, RN, RN, 1.0f, a, RN, a, RN, 1.0f, base, RN,
                       base + (size_t)(RN * RN) * sizeof(float), RN, dt, NULL));
    OK(b->ops->gemm_cd(b->dev, 0, 0, RN, RN, RN, 1.0f, a, RN, a, RN, 0.0f, NULL, RN, base, RN, dt,
                       NULL));
    OK(b->ops->synchronize(b->dev));
    dfree(b, buf);
    dfree(b, a);
    free(x);
}
