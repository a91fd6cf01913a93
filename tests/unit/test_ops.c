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
 *   times. Without a usable CUDA device these tests call skip().
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
 *   backward; the CE gradient on CUDA) or round after every addition
 *   (embedding backward) stack a few of these.
 * - F16 2e-3: the same with F16's 10-bit mantissa (ulp 2^-10 = 1e-3).
 * The double reference is exact to ~1e-15, so the same numbers bound the
 * CPU's error. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

#include "core/context_internal.h"
#include "core/half.h"
#include "core/rng.h"
#include "llmt/llmt.h"
#include "test_context.h"
#include "test_rand.h"

/* ---- backends */

typedef struct backend {
    const char *name;
    llmt_context *ctx;
    llmt_device *dev;
    const llmt_backend_ops *ops;
} backend;

static backend g_cpu, g_cuda;
static int g_have_cuda;
static char g_cuda_why[512];

static void open_backends(void)
{
    g_cpu.name = "cpu";
    g_cpu.ctx = test_context(2, 1);
    g_cpu.dev = g_cpu.ctx->backend;
    g_cpu.ops = llmt_ops(g_cpu.ctx);
    llmt_context_config cfg = LLMT_CONTEXT_CONFIG_INIT;
    cfg.backend = LLMT_BACKEND_CUDA;
    cfg.seed = 1;
    if (llmt_context_create(&g_cuda.ctx, &cfg) == LLMT_OK) {
        g_cuda.name = "cuda";
        g_cuda.dev = g_cuda.ctx->backend;
        g_cuda.ops = llmt_ops(g_cuda.ctx);
        g_have_cuda = 1;
    } else {
        snprintf(g_cuda_why, sizeof g_cuda_why, "%s", llmt_error_last());
    }
}

static void close_backends(void)
{
    llmt_context_free(g_cuda.ctx);
    llmt_context_free(g_cpu.ctx);
}

#define OK(call)                                                                           \
    do {                                                                                   \
        int rc_ = (call);                                                                  \
        if (rc_ != LLMT_OK)                                                                \
            fail_msg("%s failed (%d): %s", #call, rc_, llmt_error_last());                 \
    } while (0)

/* ---- host values in a storage dtype */

static const int dtypes[3] = {LLMT_DTYPE_F32, LLMT_DTYPE_BF16, LLMT_DTYPE_F16};

static float round_dt(float x, int dt)
{
    if (dt == LLMT_DTYPE_BF16)
        return llmt_bf16_to_f32(llmt_f32_to_bf16(x));
    if (dt == LLMT_DTYPE_F16)
        return llmt_f16_to_f32(llmt_f32_to_f16(x));
    return x;
}

/* n values of dt from fp32 (malloc'd). */
static void *pack(const float *x, int64_t n, int dt)
{
    size_t e = llmt_dtype_size(dt);
    void *p = malloc((size_t)n * e + 1);
    for (int64_t i = 0; i < n; i++) {
        if (dt == LLMT_DTYPE_BF16)
            ((uint16_t *)p)[i] = llmt_f32_to_bf16(x[i]);
        else if (dt == LLMT_DTYPE_F16)
            ((uint16_t *)p)[i] = llmt_f32_to_f16(x[i]);
        else
            ((float *)p)[i] = x[i];
    }
    return p;
}

static void unpack(float *out, const void *p, int64_t n, int dt)
{
    for (int64_t i = 0; i < n; i++)
        out[i] = dt == LLMT_DTYPE_BF16 ? llmt_bf16_to_f32(((const uint16_t *)p)[i])
                 : dt == LLMT_DTYPE_F16 ? llmt_f16_to_f32(((const uint16_t *)p)[i])
                                        : ((const float *)p)[i];
}

/* n normal values times scale, rounded to dt. */
static float *randn(uint64_t *s, int64_t n, double scale, int dt)
{
    float *x = malloc((size_t)n * sizeof *x + 1);
    for (int64_t i = 0; i < n; i++)
        x[i] = round_dt((float)(scale * trand_normal(s)), dt);
    return x;
}

static double *dzeros(int64_t n)
{
    return calloc((size_t)n + 1, sizeof(double));
}

/* ---- device buffers (asserting success) */

static void *dalloc(backend *b, size_t bytes)
{
    void *p = NULL;
    OK(b->ops->mem_alloc(b->dev, bytes ? bytes : 1, &p));
    if (bytes) { /* poison: all bytes 0xFF is NaN in F32, BF16 and F16 */
        void *h = malloc(bytes);
        memset(h, 0xFF, bytes);
        OK(b->ops->copy_to_device(b->dev, p, h, bytes));
        free(h);
    }
    return p;
}

static void *dput_raw(backend *b, const void *host, size_t bytes)
{
    void *p = dalloc(b, bytes);
    if (bytes)
        OK(b->ops->copy_to_device(b->dev, p, host, bytes));
    return p;
}

static void *dput(backend *b, const float *x, int64_t n, int dt)
{
    void *h = pack(x, n, dt);
    void *p = dput_raw(b, h, (size_t)n * llmt_dtype_size(dt));
    free(h);
    return p;
}

static void dget(backend *b, float *out, const void *p, int64_t n, int dt)
{
    size_t bytes = (size_t)n * llmt_dtype_size(dt);
    void *h = malloc(bytes + 1);
    OK(b->ops->copy_to_host(b->dev, h, p, bytes));
    unpack(out, h, n, dt);
    free(h);
}

static void dfree(backend *b, void *p)
{
    b->ops->mem_free(b->dev, p);
}

/* Scratch for ops of these dimensions: exactly what the backend asks for
 * (the CPU's 16-bit GEMM sizes its scratch from the model's linear layers,
 * so a test GEMM passes its own need as cpu_floor). */
static void *scratch_alloc(backend *b, llmt_op_dims d, size_t cpu_floor)
{
    d.num_threads = b->dev->num_threads;
    size_t bytes = b->ops->scratch_bytes(&d);
    if (b == &g_cpu && bytes < cpu_floor)
        bytes = cpu_floor;
    return dalloc(b, bytes);
}

/* ---- results: named outputs as doubles */

#define MAX_OUT 16

typedef struct result {
    int count;
    char name[MAX_OUT][40];
    double *v[MAX_OUT];
    int64_t n[MAX_OUT];
} result;

static void add_d(result *r, const char *name, const double *x, int64_t n)
{
    assert_true(r->count < MAX_OUT);
    int k = r->count++;
    snprintf(r->name[k], sizeof r->name[k], "%s", name);
    r->v[k] = malloc((size_t)n * sizeof(double) + 1);
    memcpy(r->v[k], x, (size_t)n * sizeof(double));
    r->n[k] = n;
}

static void add_f(result *r, const char *name, const float *x, int64_t n)
{
    double *d = malloc((size_t)n * sizeof *d + 1);
    for (int64_t i = 0; i < n; i++)
        d[i] = x[i];
    add_d(r, name, d, n);
    free(d);
}

/* Downloads n elements of dtype dt as an output. */
static void add_dev(result *r, backend *b, const char *name, const void *p, int64_t n, int dt)
{
    float *h = malloc((size_t)n * sizeof *h + 1);
    dget(b, h, p, n, dt);
    add_f(r, name, h, n);
    free(h);
}

static void add_scalar(result *r, const char *name, double v)
{
    add_d(r, name, &v, 1);
}

static void result_free(result *r)
{
    for (int k = 0; k < r->count; k++)
        free(r->v[k]);
    memset(r, 0, sizeof *r);
}

/* Whether x and y are the same non-finite value class. */
static int same_special(double x, double y)
{
    if (isnan(x) || isnan(y))
        return isnan(x) && isnan(y);
    return x == y; /* infinities */
}

/* Fails unless every output of got is within tol (relative to the output's
 * largest finite |want|) of want; returns the largest relative error. */
static double compare(const char *what, const result *got, const result *want, double tol)
{
    assert_int_equal(got->count, want->count);
    double worst = 0.0;
    for (int k = 0; k < want->count; k++) {
        assert_string_equal(got->name[k], want->name[k]);
        assert_int_equal(got->n[k], want->n[k]);
        double max_ref = 0.0, max_err = 0.0;
        int64_t at = -1;
        for (int64_t i = 0; i < want->n[k]; i++) {
            double w = want->v[k][i], g = got->v[k][i];
            if (!isfinite(w) || !isfinite(g)) {
                if (!same_special(w, g))
                    fail_msg("%s: output %s[%lld] = %g, want %g", what, want->name[k],
                             (long long)i, g, w);
                continue;
            }
            max_ref = fmax(max_ref, fabs(w));
            if (fabs(g - w) > max_err) {
                max_err = fabs(g - w);
                at = i;
            }
        }
        double rel = max_ref > 0 ? max_err / max_ref : max_err;
        if (rel > tol)
            fail_msg("%s: output %s: max |error| %.3g at [%lld] (got %.9g, want %.9g), max |want| "
                     "%.3g: relative %.3g > tolerance %.1g",
                     what, want->name[k], max_err, (long long)at, got->v[k][at], want->v[k][at],
                     max_ref, rel, tol);
        worst = fmax(worst, rel);
    }
    return worst;
}

/* ---- an op under test: inputs made from a seed, run on a backend, and a
 * double-precision reference. Most ops have one variant per dtype. */

typedef struct op_test {
    const char *name;
    int variants;
    const char *(*variant_name)(int v);
    int (*variant_dt)(int v); /* dtype whose tolerance applies */
    void *(*make)(int v, uint64_t seed);
    void (*run)(backend *b, int v, const void *in, result *out);
    void (*ref)(int v, const void *in, result *out);
    void (*free_in)(void *in);
    double tol_scale; /* multiplies the dtype tolerances */
} op_test;

static double tolerance(int dt)
{
    return dt == LLMT_DTYPE_BF16 ? 2e-2 : dt == LLMT_DTYPE_F16 ? 2e-3 : 1e-5;
}

static const char *dt_name(int v)
{
    return llmt_dtype_name(dtypes[v]);
}

static int dt_of(int v)
{
    return dtypes[v];
}

static void check_cpu(const op_test *t)
{
    for (int v = 0; v < t->variants; v++) {
        void *in = t->make(v, 1000 + (uint64_t)v);
        result got = {0}, want = {0};
        t->run(&g_cpu, v, in, &got);
        t->ref(v, in, &want);
        char what[128];
        snprintf(what, sizeof what, "%s %s (cpu vs double reference)", t->name, t->variant_name(v));
        double tol = tolerance(t->variant_dt(v)) * t->tol_scale;
        double err = compare(what, &got, &want, tol);
        print_message("%-44s max relative error %.2e (tolerance %.0e)\n", what, err, tol);
        result_free(&got);
        result_free(&want);
        t->free_in(in);
    }
}

static void check_cuda(const op_test *t)
{
    if (!g_have_cuda) {
        print_message("no CUDA backend: %s\n", g_cuda_why);
        skip();
    }
    for (int v = 0; v < t->variants; v++) {
        void *in = t->make(v, 2000 + (uint64_t)v);
        result cpu = {0}, gpu = {0}, again = {0};
        t->run(&g_cpu, v, in, &cpu);
        t->run(&g_cuda, v, in, &gpu);
        t->run(&g_cuda, v, in, &again);
        char what[128];
        snprintf(what, sizeof what, "%s %s (cuda vs cpu)", t->name, t->variant_name(v));
        double tol = tolerance(t->variant_dt(v)) * t->tol_scale;
        double err = compare(what, &gpu, &cpu, tol);
        print_message("%-44s max relative error %.2e (tolerance %.0e)\n", what, err, tol);
        /* Deterministic: a second run gives the same bits. */
        for (int k = 0; k < gpu.count; k++)
            if (memcmp(gpu.v[k], again.v[k], (size_t)gpu.n[k] * sizeof(double)) != 0)
                fail_msg("%s: output %s differs between two CUDA runs", what, gpu.name[k]);
        result_free(&cpu);
        result_free(&gpu);
        result_free(&again);
        t->free_in(in);
    }
}

/* ======================================================================== */
/* GEMM: the four transpose combinations, beta 0 and 1, padded leading
 * dimensions on some. */

enum { GM = 37, GN = 29, GK = 45 };

typedef struct gemm_in {
    int dt;
    float alpha;
    int ta[8], tb[8];
    float beta[8];
    int64_t lda[8], ldb[8], ldc[8];
    float *a[8], *b[8], *c[8]; /* stored shapes, with their leading dimensions */
} gemm_in;

static void *gemm_make(int v, uint64_t seed)
{
    uint64_t s = seed;
    gemm_in *in = calloc(1, sizeof *in);
    in->dt = dtypes[v];
    in->alpha = 0.75f;
    for (int c = 0; c < 8; c++) {
        in->ta[c] = c & 1;
        in->tb[c] = (c >> 1) & 1;
        in->beta[c] = (c >> 2) ? 1.0f : 0.0f;
        int pad = c % 3; /* 0, 1 or 2 extra columns */
        in->lda[c] = (in->ta[c] ? GM : GK) + pad;
        in->ldb[c] = (in->tb[c] ? GK : GN) + 2 * pad;
        in->ldc[c] = GN + pad;
        in->a[c] = randn(&s, (in->ta[c] ? GK : GM) * in->lda[c], 1.0, in->dt);
        in->b[c] = randn(&s, (in->tb[c] ? GN : GK) * in->ldb[c], 1.0, in->dt);
        in->c[c] = randn(&s, GM * in->ldc[c], 1.0, in->dt);
    }
    return in;
}

static void gemm_free(void *p)
{
    gemm_in *in = p;
    for (int c = 0; c < 8; c++) {
        free(in->a[c]);
        free(in->b[c]);
        free(in->c[c]);
    }
    free(in);
}

static void gemm_name(char *buf, size_t cap, const gemm_in *in, int c)
{
    snprintf(buf, cap, "C %s%s beta %g", in->ta[c] ? "A^T" : "A", in->tb[c] ? "B^T" : "B",
             (double)in->beta[c]);
}

/* The m x n block of a C with leading dimension ldc, as doubles. */
static void add_c_block(result *r, const char *name, const float *c, int64_t ldc)
{
    double *d = malloc(GM * GN * sizeof *d);
    for (int i = 0; i < GM; i++)
        for (int j = 0; j < GN; j++)
            d[i * GN + j] = c[i * ldc + j];
    add_d(r, name, d, GM * GN);
    free(d);
}

static void gemm_run(backend *b, int v, const void *p, result *out)
{
    (void)v;
    const gemm_in *in = p;
    const int dt = in->dt;
    llmt_op_dims dims = {0};
    dims.dt = dt;
    void *scratch = scratch_alloc(b, dims, (GM * GK + GN * GK + GM * GN) * sizeof(float));
    for (int c = 0; c < 8; c++) {
        int64_t na = (in->ta[c] ? GK : GM) * in->lda[c], nb = (in->tb[c] ? GN : GK) * in->ldb[c];
        void *a = dput(b, in->a[c], na, dt), *bb = dput(b, in->b[c], nb, dt);
        /* beta 0 leaves C poisoned: the op must not read it */
        void *cc = in->beta[c] != 0.0f ? dput(b, in->c[c], GM * in->ldc[c], dt)
                                       : dalloc(b, (size_t)(GM * in->ldc[c]) * llmt_dtype_size(dt));
        OK(b->ops->gemm(b->dev, in->ta[c], in->tb[c], GM, GN, GK, in->alpha, a, in->lda[c], bb,
                        in->ldb[c], in->beta[c], cc, in->ldc[c], dt, scratch));
        float *h = malloc((size_t)(GM * in->ldc[c]) * sizeof *h);
        dget(b, h, cc, GM * in->ldc[c], dt);
        char name[40];
        gemm_name(name, sizeof name, in, c);
        add_c_block(out, name, h, in->ldc[c]);
        free(h);
        dfree(b, a);
        dfree(b, bb);
        dfree(b, cc);
    }
    dfree(b, scratch);
}

static void gemm_ref(int v, const void *p, result *out)
{
    (void)v;
    const gemm_in *in = p;
    double *d = malloc(GM * GN * sizeof *d);
    for (int c = 0; c < 8; c++) {
        for (int i = 0; i < GM; i++)
            for (int j = 0; j < GN; j++) {
                double acc = 0.0;
                for (int k = 0; k < GK; k++) {
                    const int64_t la = in->lda[c], lb = in->ldb[c];
                    double x = in->ta[c] ? in->a[c][k * la + i] : in->a[c][i * la + k];
                    double y = in->tb[c] ? in->b[c][j * lb + k] : in->b[c][k * lb + j];
                    acc += x * y;
                }
                double c0 = in->c[c][i * in->ldc[c] + j];
                d[i * GN + j] = in->alpha * acc + (in->beta[c] != 0.0f ? in->beta[c] * c0 : 0.0);
            }
        char name[40];
        gemm_name(name, sizeof name, in, c);
        add_d(out, name, d, GM * GN);
    }
    free(d);
}

static const op_test gemm_test = {"gemm", 3, dt_name, dt_of, gemm_make, gemm_run, gemm_ref,
                                  gemm_free, 1.0};

/* ======================================================================== */
/* Embedding forward and backward, ids repeating. */

enum { EV = 11, EM = 40, ED = 70 };

typedef struct embed_in {
    int dt;
    int32_t ids[EM];
    float *table, *dtable, *dout;
} embed_in;

static void *embed_make(int v, uint64_t seed)
{
    uint64_t s = seed;
    embed_in *in = calloc(1, sizeof *in);
    in->dt = dtypes[v];
    for (int i = 0; i < EM; i++)
        in->ids[i] = (int32_t)(trand_u64(&s) % EV);
    in->ids[5] = in->ids[0]; /* make sure of repeats */
    in->ids[EM - 1] = in->ids[0];
    in->table = randn(&s, EV * ED, 1.0, in->dt);
    in->dtable = randn(&s, EV * ED, 1.0, in->dt);
    in->dout = randn(&s, EM * ED, 1.0, in->dt);
    return in;
}

static void embed_free(void *p)
{
    embed_in *in = p;
    free(in->table);
    free(in->dtable);
    free(in->dout);
    free(in);
}

static void embed_run(backend *b, int v, const void *p, result *out)
{
    (void)v;
    const embed_in *in = p;
    const int dt = in->dt;
    void *ids = dput_raw(b, in->ids, sizeof in->ids);
    void *table = dput(b, in->table, EV * ED, dt), *dtable = dput(b, in->dtable, EV * ED, dt);
    void *dout = dput(b, in->dout, EM * ED, dt);
    void *o = dalloc(b, EM * ED * llmt_dtype_size(dt));
    OK(b->ops->embedding_fwd(b->dev, o, table, ids, EM, ED, dt));
    OK(b->ops->embedding_bwd(b->dev, dtable, dout, ids, EM, ED, dt));
    add_dev(out, b, "out", o, EM * ED, dt);
    add_dev(out, b, "dtable", dtable, EV * ED, dt);
    dfree(b, ids);
    dfree(b, table);
    dfree(b, dtable);
    dfree(b, dout);
    dfree(b, o);
}

static void embed_ref(int v, const void *p, result *out)
{
    (void)v;
    const embed_in *in = p;
    double *o = dzeros(EM * ED), *dt = dzeros(EV * ED);
    for (int i = 0; i < EV * ED; i++)
        dt[i] = in->dtable[i];
    for (int i = 0; i < EM; i++)
        for (int c = 0; c < ED; c++) {
            o[i * ED + c] = in->table[in->ids[i] * ED + c];
            dt[in->ids[i] * ED + c] += in->dout[i * ED + c];
        }
    add_d(out, "out", o, EM * ED);
    add_d(out, "dtable", dt, EV * ED);
    free(o);
    free(dt);
}

static const op_test embed_test = {"embedding", 3, dt_name, dt_of, embed_make, embed_run,
                                   embed_ref, embed_free, 1.0};

/* ======================================================================== */
/* RMSNorm forward, and backward with and without accumulation into dx. */

enum { RM = 9, RD = 300 };
static const float rms_eps = 1e-5f;

typedef struct rms_in {
    int dt;
    float *x, *w, *dout, *dx0, *dw0;
} rms_in;

static void *rms_make(int v, uint64_t seed)
{
    uint64_t s = seed;
    rms_in *in = calloc(1, sizeof *in);
    in->dt = dtypes[v];
    in->x = randn(&s, RM * RD, 2.0, in->dt);
    in->w = randn(&s, RD, 0.1, in->dt);
    for (int i = 0; i < RD; i++)
        in->w[i] = round_dt(1.0f + in->w[i], in->dt);
    in->dout = randn(&s, RM * RD, 1.0, in->dt);
    in->dx0 = randn(&s, RM * RD, 1.0, in->dt);
    in->dw0 = randn(&s, RD, 1.0, in->dt);
    return in;
}

static void rms_free(void *p)
{
    rms_in *in = p;
    free(in->x);
    free(in->w);
    free(in->dout);
    free(in->dx0);
    free(in->dw0);
    free(in);
}

static void rms_run(backend *b, int v, const void *p, result *out)
{
    (void)v;
    const rms_in *in = p;
    const int dt = in->dt;
    const size_t e = llmt_dtype_size(dt);
    llmt_op_dims dims = {0};
    dims.batch = 1, dims.seq = RM, dims.hidden = RD, dims.dt = dt;
    void *scratch = scratch_alloc(b, dims, 0);
    void *x = dput(b, in->x, RM * RD, dt), *w = dput(b, in->w, RD, dt);
    void *dout = dput(b, in->dout, RM * RD, dt);
    void *o = dalloc(b, RM * RD * e), *rstd = dalloc(b, RM * sizeof(float));
    OK(b->ops->rmsnorm_fwd(b->dev, o, rstd, x, w, RM, RD, rms_eps, dt));
    add_dev(out, b, "out", o, RM * RD, dt);
    add_dev(out, b, "rstd", rstd, RM, LLMT_DTYPE_F32);
    for (int acc = 0; acc <= 1; acc++) {
        void *dx = acc ? dput(b, in->dx0, RM * RD, dt) : dalloc(b, RM * RD * e);
        void *dw = dput(b, in->dw0, RD, dt);
        OK(b->ops->rmsnorm_bwd(b->dev, dx, dw, dout, x, w, rstd, RM, RD, acc, dt, scratch));
        add_dev(out, b, acc ? "dx (accumulated)" : "dx", dx, RM * RD, dt);
        add_dev(out, b, acc ? "dw (second)" : "dw", dw, RD, dt);
        dfree(b, dx);
        dfree(b, dw);
    }
    dfree(b, x);
    dfree(b, w);
    dfree(b, dout);
    dfree(b, o);
    dfree(b, rstd);
    dfree(b, scratch);
}

static void rms_ref(int v, const void *p, result *out)
{
    (void)v;
    const rms_in *in = p;
    double *o = dzeros(RM * RD), *rs = dzeros(RM), *dx = dzeros(RM * RD), *dw = dzeros(RD);
    for (int r = 0; r < RM; r++) {
        double ss = 0;
        for (int c = 0; c < RD; c++)
            ss += (double)in->x[r * RD + c] * in->x[r * RD + c];
        rs[r] = 1.0 / sqrt(ss / RD + rms_eps);
        for (int c = 0; c < RD; c++)
            o[r * RD + c] = in->x[r * RD + c] * rs[r] * in->w[c];
    }
    add_d(out, "out", o, RM * RD);
    add_d(out, "rstd", rs, RM);
    for (int acc = 0; acc <= 1; acc++) {
        for (int c = 0; c < RD; c++)
            dw[c] = in->dw0[c];
        for (int r = 0; r < RM; r++) {
            double s = 0;
            for (int c = 0; c < RD; c++)
                s += (double)in->dout[r * RD + c] * in->w[c] * in->x[r * RD + c];
            double mean = s * rs[r] / RD;
            for (int c = 0; c < RD; c++) {
                double xhat = in->x[r * RD + c] * rs[r];
                double g = (double)in->dout[r * RD + c] * in->w[c];
                dx[r * RD + c] = rs[r] * (g - xhat * mean) + (acc ? in->dx0[r * RD + c] : 0.0);
                dw[c] += in->dout[r * RD + c] * xhat;
            }
        }
        add_d(out, acc ? "dx (accumulated)" : "dx", dx, RM * RD);
        add_d(out, acc ? "dw (second)" : "dw", dw, RD);
    }
    free(o);
    free(rs);
    free(dx);
    free(dw);
}

static const op_test rms_test = {"rmsnorm", 3, dt_name, dt_of, rms_make, rms_run, rms_ref,
                                 rms_free, 1.0};

/* ======================================================================== */
/* RoPE forward and inverse on the first 3 of 5 head vectors per row, rows
 * wrapping around the sequence length. */

enum { PSEQ = 7, PM = 14, PHEADS = 3, PROW_HEADS = 5, PHD = 8 };

typedef struct rope_in {
    int dt;
    float *x;
    float cs[PSEQ * PHD]; /* per position hd / 2 cosines then hd / 2 sines */
} rope_in;

static void *rope_make(int v, uint64_t seed)
{
    uint64_t s = seed;
    rope_in *in = calloc(1, sizeof *in);
    in->dt = dtypes[v];
    in->x = randn(&s, PM * PROW_HEADS * PHD, 1.0, in->dt);
    for (int pos = 0; pos < PSEQ; pos++)
        for (int i = 0; i < PHD / 2; i++) {
            double angle = pos * pow(10000.0, -2.0 * i / PHD);
            in->cs[pos * PHD + i] = (float)cos(angle);
            in->cs[pos * PHD + PHD / 2 + i] = (float)sin(angle);
        }
    return in;
}

static void rope_free(void *p)
{
    rope_in *in = p;
    free(in->x);
    free(in);
}

static void rope_run(backend *b, int v, const void *p, result *out)
{
    (void)v;
    const rope_in *in = p;
    const int dt = in->dt;
    const int64_t n = PM * PROW_HEADS * PHD;
    void *x = dput(b, in->x, n, dt), *cs = dput(b, in->cs, PSEQ * PHD, LLMT_DTYPE_F32);
    OK(b->ops->rope(b->dev, x, cs, PM, PSEQ, PHEADS, PHD, PROW_HEADS * PHD, 0, dt));
    add_dev(out, b, "rotated", x, n, dt);
    OK(b->ops->rope(b->dev, x, cs, PM, PSEQ, PHEADS, PHD, PROW_HEADS * PHD, 1, dt));
    add_dev(out, b, "rotated back", x, n, dt);
    dfree(b, x);
    dfree(b, cs);
}

static void rope_ref(int v, const void *p, result *out)
{
    (void)v;
    const rope_in *in = p;
    const int64_t n = PM * PROW_HEADS * PHD;
    double *y = dzeros(n), *back = dzeros(n);
    for (int64_t i = 0; i < n; i++)
        y[i] = back[i] = in->x[i];
    for (int r = 0; r < PM; r++) {
        const float *c = in->cs + (r % PSEQ) * PHD, *sn = c + PHD / 2;
        for (int h = 0; h < PHEADS; h++) {
            double *q = y + (r * PROW_HEADS + h) * PHD;
            for (int i = 0; i < PHD / 2; i++) {
                double x1 = q[i], x2 = q[i + PHD / 2];
                q[i] = x1 * c[i] - x2 * sn[i];
                q[i + PHD / 2] = x2 * c[i] + x1 * sn[i];
            }
        }
    }
    add_d(out, "rotated", y, n);
    add_d(out, "rotated back", back, n); /* the inverse undoes the rotation */
    free(y);
    free(back);
}

static const op_test rope_test = {"rope", 3, dt_name, dt_of, rope_make, rope_run, rope_ref,
                                  rope_free, 1.0};

/* ======================================================================== */
/* Attention forward and backward with grouped-query heads; sequence lengths
 * that are not multiples of any tile; backward with the saved state and
 * with recompute (which must give the same bits). */

typedef struct attn_case {
    int batch, seq, heads, kv_heads, head_dim;
} attn_case;

static const attn_case attn_cases[] = {
    {2, 77, 4, 2, 32}, /* GQA, two query blocks, three key tiles */
    {1, 40, 2, 1, 64}, /* MQA */
    {1, 33, 2, 2, 128},
    {1, 200, 4, 1, 64}, /* four query blocks, group of four heads */
};
#define ATTN_CASES ((int)(sizeof attn_cases / sizeof attn_cases[0]))

typedef struct attn_in {
    int dt;
    attn_case c;
    float *qkv, *dout;
} attn_in;

static const char *attn_name(int v)
{
    static char buf[ATTN_CASES * 3][64];
    const attn_case *c = &attn_cases[v % ATTN_CASES];
    snprintf(buf[v], sizeof buf[v], "%s B%d T%d H%d/%d hd%d",
             llmt_dtype_name(dtypes[v / ATTN_CASES]), c->batch, c->seq, c->heads, c->kv_heads,
             c->head_dim);
    return buf[v];
}

static int attn_dt(int v)
{
    return dtypes[v / ATTN_CASES];
}

static int64_t attn_ld(const attn_case *c)
{
    return (int64_t)(c->heads + 2 * c->kv_heads) * c->head_dim;
}

static void *attn_make(int v, uint64_t seed)
{
    uint64_t s = seed;
    attn_in *in = calloc(1, sizeof *in);
    in->dt = attn_dt(v);
    in->c = attn_cases[v % ATTN_CASES];
    const int64_t m = (int64_t)in->c.batch * in->c.seq;
    in->qkv = randn(&s, m * attn_ld(&in->c), 1.0, in->dt);
    in->dout = randn(&s, m * in->c.heads * in->c.head_dim, 1.0, in->dt);
    return in;
}

static void attn_free(void *p)
{
    attn_in *in = p;
    free(in->qkv);
    free(in->dout);
    free(in);
}

static void attn_run(backend *b, int v, const void *p, result *out)
{
    (void)v;
    const attn_in *in = p;
    const int dt = in->dt;
    const attn_case *c = &in->c;
    const size_t e = llmt_dtype_size(dt);
    const int64_t m = (int64_t)c->batch * c->seq, ld = attn_ld(c);
    const int64_t od = (int64_t)c->heads * c->head_dim;
    llmt_attn_dims ad = {c->batch, c->seq, c->heads, c->kv_heads, c->head_dim};
    llmt_op_dims dims = {0};
    dims.batch = c->batch, dims.seq = c->seq, dims.hidden = od, dims.heads = c->heads;
    dims.kv_heads = c->kv_heads, dims.head_dim = c->head_dim, dims.dt = dt;
    void *scratch = scratch_alloc(b, dims, 0);
    void *qkv = dput(b, in->qkv, m * ld, dt), *dout = dput(b, in->dout, m * od, dt);
    void *o = dalloc(b, (size_t)(m * od) * e);
    void *saved = dalloc(b, b->ops->attention_saved_bytes(&ad));
    void *dqkv = dalloc(b, (size_t)(m * ld) * e), *dqkv2 = dalloc(b, (size_t)(m * ld) * e);
    OK(b->ops->attention_fwd(b->dev, o, saved, qkv, &ad, dt, scratch));
    OK(b->ops->attention_bwd(b->dev, dqkv, dout, qkv, saved, o, &ad, dt, scratch));
    OK(b->ops->attention_bwd(b->dev, dqkv2, dout, qkv, NULL, o, &ad, dt, scratch));
    add_dev(out, b, "out", o, m * od, dt);
    add_dev(out, b, "dqkv", dqkv, m * ld, dt);
    /* Recompute gives the bits of the saved state. */
    void *h1 = malloc((size_t)(m * ld) * e), *h2 = malloc((size_t)(m * ld) * e);
    OK(b->ops->copy_to_host(b->dev, h1, dqkv, (size_t)(m * ld) * e));
    OK(b->ops->copy_to_host(b->dev, h2, dqkv2, (size_t)(m * ld) * e));
    if (memcmp(h1, h2, (size_t)(m * ld) * e) != 0)
        fail_msg("attention %s on %s: backward with recompute differs from backward with the "
                 "saved state", attn_name(v), b->name);
    free(h1);
    free(h2);
    dfree(b, qkv);
    dfree(b, dout);
    dfree(b, o);
    dfree(b, saved);
    dfree(b, dqkv);
    dfree(b, dqkv2);
    dfree(b, scratch);
}

static void attn_ref(int v, const void *p, result *out)
{
    (void)v;
    const attn_in *in = p;
    const attn_case *c = &in->c;
    const int T = c->seq, H = c->heads, hd = c->head_dim, group = c->heads / c->kv_heads;
    const int64_t m = (int64_t)c->batch * T, ld = attn_ld(c), od = (int64_t)H * hd;
    const double scale = 1.0 / sqrt((double)hd);
    double *o = dzeros(m * od), *dqkv = dzeros(m * ld);
    double *pr = dzeros((int64_t)T * T), *dp = dzeros((int64_t)T * T);
    for (int b = 0; b < c->batch; b++)
        for (int h = 0; h < H; h++) {
            const int g = h / group;
            const float *base = in->qkv + (int64_t)b * T * ld;
#define Q(i, k) base[(int64_t)(i) * ld + h * hd + (k)]
#define K(j, k) base[(int64_t)(j) * ld + (H + g) * hd + (k)]
#define V(j, k) base[(int64_t)(j) * ld + (H + c->kv_heads + g) * hd + (k)]
#define DO(i, k) in->dout[((int64_t)b * T + (i)) * od + h * hd + (k)]
            for (int i = 0; i < T; i++) {
                double mx = -INFINITY, sum = 0;
                for (int j = 0; j <= i; j++) {
                    double s = 0;
                    for (int k = 0; k < hd; k++)
                        s += (double)Q(i, k) * K(j, k);
                    pr[i * T + j] = s * scale;
                    mx = fmax(mx, s * scale);
                }
                for (int j = 0; j <= i; j++)
                    sum += (pr[i * T + j] = exp(pr[i * T + j] - mx));
                for (int j = 0; j <= i; j++)
                    pr[i * T + j] /= sum;
                for (int k = 0; k < hd; k++) {
                    double acc = 0;
                    for (int j = 0; j <= i; j++)
                        acc += pr[i * T + j] * V(j, k);
                    o[((int64_t)b * T + i) * od + h * hd + k] = acc;
                }
            }
            for (int i = 0; i < T; i++) {
                double dsum = 0; /* D_i = sum_j P_ij dP_ij */
                for (int j = 0; j <= i; j++) {
                    double s = 0;
                    for (int k = 0; k < hd; k++)
                        s += (double)DO(i, k) * V(j, k);
                    dp[i * T + j] = s;
                    dsum += pr[i * T + j] * s;
                }
                double *dq = dqkv + ((int64_t)b * T + i) * ld + h * hd;
                for (int j = 0; j <= i; j++) {
                    double ds = pr[i * T + j] * (dp[i * T + j] - dsum);
                    double *dk = dqkv + ((int64_t)b * T + j) * ld + (H + g) * hd;
                    double *dv = dqkv + ((int64_t)b * T + j) * ld + (H + c->kv_heads + g) * hd;
                    for (int k = 0; k < hd; k++) {
                        dq[k] += scale * ds * K(j, k);
                        dk[k] += scale * ds * Q(i, k);
                        dv[k] += pr[i * T + j] * DO(i, k);
                    }
                }
            }
#undef Q
#undef K
#undef V
#undef DO
        }
    add_d(out, "out", o, m * od);
    add_d(out, "dqkv", dqkv, m * ld);
    free(o);
    free(dqkv);
    free(pr);
    free(dp);
}

static const op_test attn_test = {"attention", 3 * ATTN_CASES, attn_name, attn_dt, attn_make,
                                  attn_run, attn_ref, attn_free, 1.0};

/* ======================================================================== */
/* SwiGLU forward and backward. */

enum { SM = 5, SF = 70 };

typedef struct swiglu_in {
    int dt;
    float *gu, *dout;
} swiglu_in;

static void *swiglu_make(int v, uint64_t seed)
{
    uint64_t s = seed;
    swiglu_in *in = calloc(1, sizeof *in);
    in->dt = dtypes[v];
    in->gu = randn(&s, SM * 2 * SF, 2.0, in->dt);
    in->dout = randn(&s, SM * SF, 1.0, in->dt);
    return in;
}

static void swiglu_free(void *p)
{
    swiglu_in *in = p;
    free(in->gu);
    free(in->dout);
    free(in);
}

static void swiglu_run(backend *b, int v, const void *p, result *out)
{
    (void)v;
    const swiglu_in *in = p;
    const int dt = in->dt;
    const size_t e = llmt_dtype_size(dt);
    void *gu = dput(b, in->gu, SM * 2 * SF, dt), *dout = dput(b, in->dout, SM * SF, dt);
    void *o = dalloc(b, SM * SF * e), *dgu = dalloc(b, SM * 2 * SF * e);
    OK(b->ops->swiglu_fwd(b->dev, o, gu, SM, SF, dt));
    OK(b->ops->swiglu_bwd(b->dev, dgu, dout, gu, SM, SF, dt));
    add_dev(out, b, "out", o, SM * SF, dt);
    add_dev(out, b, "dgate_up", dgu, SM * 2 * SF, dt);
    dfree(b, gu);
    dfree(b, dout);
    dfree(b, o);
    dfree(b, dgu);
}

static void swiglu_ref(int v, const void *p, result *out)
{
    (void)v;
    const swiglu_in *in = p;
    double *o = dzeros(SM * SF), *dgu = dzeros(SM * 2 * SF);
    for (int r = 0; r < SM; r++)
        for (int i = 0; i < SF; i++) {
            double g = in->gu[r * 2 * SF + i], u = in->gu[r * 2 * SF + SF + i];
            double sig = 1.0 / (1.0 + exp(-g)), d = in->dout[r * SF + i];
            o[r * SF + i] = g * sig * u;
            dgu[r * 2 * SF + i] = d * u * sig * (1.0 + g * (1.0 - sig)); /* d(silu)/dg */
            dgu[r * 2 * SF + SF + i] = d * g * sig;
        }
    add_d(out, "out", o, SM * SF);
    add_d(out, "dgate_up", dgu, SM * 2 * SF);
    free(o);
    free(dgu);
}

static const op_test swiglu_test = {"swiglu", 3, dt_name, dt_of, swiglu_make, swiglu_run,
                                    swiglu_ref, swiglu_free, 1.0};

/* ======================================================================== */
/* Residual add, and dtype conversion from each dtype to each. */

enum { AN = 1000 };

typedef struct add_in {
    int dt;
    float *x, *y;
} add_in;

static void *add_make(int v, uint64_t seed)
{
    uint64_t s = seed;
    add_in *in = calloc(1, sizeof *in);
    in->dt = dtypes[v];
    in->x = randn(&s, AN, 30.0, in->dt);
    in->y = randn(&s, AN, 30.0, in->dt);
    return in;
}

static void add_free(void *p)
{
    add_in *in = p;
    free(in->x);
    free(in->y);
    free(in);
}

static void add_run(backend *b, int v, const void *p, result *out)
{
    (void)v;
    const add_in *in = p;
    const int dt = in->dt;
    void *x = dput(b, in->x, AN, dt), *y = dput(b, in->y, AN, dt);
    OK(b->ops->add(b->dev, y, x, AN, dt));
    add_dev(out, b, "y + x", y, AN, dt);
    /* cast of x to every dtype */
    for (int k = 0; k < 3; k++) {
        void *dst = dalloc(b, AN * llmt_dtype_size(dtypes[k]));
        OK(b->ops->cast(b->dev, dst, dtypes[k], x, dt, AN));
        char name[40];
        snprintf(name, sizeof name, "cast to %s", llmt_dtype_name(dtypes[k]));
        add_dev(out, b, name, dst, AN, dtypes[k]);
        dfree(b, dst);
    }
    dfree(b, x);
    dfree(b, y);
}

static void add_ref(int v, const void *p, result *out)
{
    (void)v;
    const add_in *in = p;
    double *y = dzeros(AN), *x = dzeros(AN);
    for (int i = 0; i < AN; i++) {
        y[i] = (double)in->y[i] + in->x[i];
        x[i] = in->x[i];
    }
    add_d(out, "y + x", y, AN);
    for (int k = 0; k < 3; k++) {
        /* A conversion's exact result is the input rounded to nearest even
         * in the target dtype (lib/core/half.h, checked by test_half). */
        for (int i = 0; i < AN; i++)
            x[i] = round_dt(in->x[i], dtypes[k]);
        char name[40];
        snprintf(name, sizeof name, "cast to %s", llmt_dtype_name(dtypes[k]));
        add_d(out, name, x, AN);
    }
    free(x);
    free(y);
}

static const op_test add_test = {"add and cast", 3, dt_name, dt_of, add_make, add_run, add_ref,
                                 add_free, 1.0};

/* ======================================================================== */
/* Fused LM head and cross-entropy: three chunks (the last partial), ignored
 * targets, with and without gradient, logits copied out, and logits only. */

enum { CM = 23, CCHUNK = 8, CD = 40, CV = 50 };
static const float ce_scale = 0.37f;

typedef struct ce_in {
    int dt;
    float *h, *w, *dw0;
    int32_t targets[CM];
} ce_in;

static void *ce_make(int v, uint64_t seed)
{
    uint64_t s = seed;
    ce_in *in = calloc(1, sizeof *in);
    in->dt = dtypes[v];
    in->h = randn(&s, CM * CD, 1.0, in->dt);
    in->w = randn(&s, CV * CD, 0.3, in->dt);
    in->dw0 = randn(&s, CV * CD, 1.0, in->dt);
    for (int i = 0; i < CM; i++)
        in->targets[i] = (int32_t)(trand_u64(&s) % CV);
    in->targets[0] = in->targets[9] = in->targets[10] = in->targets[CM - 1] = -1;
    return in;
}

static void ce_free(void *p)
{
    ce_in *in = p;
    free(in->h);
    free(in->w);
    free(in->dw0);
    free(in);
}

static void ce_run(backend *b, int v, const void *p, result *out)
{
    (void)v;
    const ce_in *in = p;
    const int dt = in->dt;
    const size_t e = llmt_dtype_size(dt);
    llmt_op_dims dims = {0};
    dims.batch = 1, dims.seq = CM, dims.hidden = CD, dims.vocab = CV, dims.ce_chunk = CCHUNK;
    dims.dt = dt;
    void *scratch = scratch_alloc(b, dims, 0);
    void *h = dput(b, in->h, CM * CD, dt), *w = dput(b, in->w, CV * CD, dt);
    void *tg = dput_raw(b, in->targets, sizeof in->targets);
    float *logits = malloc(CM * CV * sizeof *logits);
    for (int variant = 0; variant < 3; variant++) {
        /* 0: gradient and logits; 1: loss only; 2: logits only */
        void *dh = dalloc(b, CM * CD * e), *dw = dput(b, in->dw0, CV * CD, dt);
        double loss = -1.0;
        int64_t count = -1;
        memset(logits, 0xFF, CM * CV * sizeof *logits);
        llmt_ce_args a = {
            .h = h, .w = w, .targets = variant == 2 ? NULL : tg, .m = CM, .d = CD, .vocab = CV,
            .chunk = CCHUNK, .dt = dt, .want_grad = variant == 0, .grad_scale = ce_scale,
            .dh = dh, .dw = dw, .scratch = scratch, .loss_sum = &loss, .count = &count,
            .logits_out = variant == 1 ? NULL : logits,
        };
        OK(b->ops->lm_head_ce(b->dev, &a));
        char name[40];
        if (variant != 2) {
            snprintf(name, sizeof name, "loss sum (%s)", variant ? "no grad" : "grad");
            add_scalar(out, name, loss);
            snprintf(name, sizeof name, "count (%s)", variant ? "no grad" : "grad");
            add_scalar(out, name, (double)count);
        }
        if (variant == 0) {
            add_dev(out, b, "dh", dh, CM * CD, dt);
            add_dev(out, b, "dw", dw, CV * CD, dt);
        }
        if (variant != 1) {
            snprintf(name, sizeof name, "logits (%s)", variant ? "logits only" : "grad");
            add_f(out, name, logits, CM * CV);
        }
        dfree(b, dh);
        dfree(b, dw);
    }
    free(logits);
    dfree(b, h);
    dfree(b, w);
    dfree(b, tg);
    dfree(b, scratch);
}

static void ce_ref(int v, const void *p, result *out)
{
    (void)v;
    const ce_in *in = p;
    double *logits = dzeros(CM * CV), *g = dzeros(CM * CV);
    double *dh = dzeros(CM * CD), *dw = dzeros(CV * CD);
    double loss = 0;
    int64_t count = 0;
    for (int r = 0; r < CM; r++) {
        double mx = -INFINITY, sum = 0;
        for (int k = 0; k < CV; k++) {
            double s = 0;
            for (int c = 0; c < CD; c++)
                s += (double)in->h[r * CD + c] * in->w[k * CD + c];
            logits[r * CV + k] = s;
            mx = fmax(mx, s);
        }
        for (int k = 0; k < CV; k++)
            sum += exp(logits[r * CV + k] - mx);
        int t = in->targets[r];
        if (t < 0)
            continue;
        loss += mx + log(sum) - logits[r * CV + t];
        count++;
        for (int k = 0; k < CV; k++)
            g[r * CV + k] = ce_scale * (exp(logits[r * CV + k] - mx) / sum - (k == t));
    }
    for (int i = 0; i < CV * CD; i++)
        dw[i] = in->dw0[i];
    for (int r = 0; r < CM; r++)
        for (int k = 0; k < CV; k++)
            for (int c = 0; c < CD; c++) {
                dh[r * CD + c] += g[r * CV + k] * in->w[k * CD + c];
                dw[k * CD + c] += g[r * CV + k] * in->h[r * CD + c];
            }
    add_scalar(out, "loss sum (grad)", loss);
    add_scalar(out, "count (grad)", (double)count);
    add_d(out, "dh", dh, CM * CD);
    add_d(out, "dw", dw, CV * CD);
    add_d(out, "logits (grad)", logits, CM * CV);
    add_scalar(out, "loss sum (no grad)", loss);
    add_scalar(out, "count (no grad)", (double)count);
    add_d(out, "logits (logits only)", logits, CM * CV);
    free(logits);
    free(g);
    free(dh);
    free(dw);
}

static const op_test ce_test = {"lm_head_ce", 3, dt_name, dt_of, ce_make, ce_run, ce_ref,
                                ce_free, 1.0};

/* ======================================================================== */
/* Gradient statistics: sum of squares and non-finite count of factor * g,
 * without and with inf and NaN. */

enum { GSN = 100003 };
static const float gs_factor = 0.5f;

typedef struct gs_in {
    int dt;
    float *g;
} gs_in;

static void *gs_make(int v, uint64_t seed)
{
    uint64_t s = seed;
    gs_in *in = calloc(1, sizeof *in);
    in->dt = dtypes[v];
    in->g = randn(&s, GSN, 0.01, in->dt);
    return in;
}

static void gs_free(void *p)
{
    gs_in *in = p;
    free(in->g);
    free(in);
}

static void gs_run(backend *b, int v, const void *p, result *out)
{
    (void)v;
    const gs_in *in = p;
    const int dt = in->dt;
    void *scratch = dalloc(b, b->ops->optim_scratch_bytes);
    float *bad = malloc(GSN * sizeof *bad);
    memcpy(bad, in->g, GSN * sizeof *bad);
    bad[17] = INFINITY;
    bad[GSN - 1] = -INFINITY;
    bad[50000] = NAN;
    for (int k = 0; k < 2; k++) {
        void *g = dput(b, k ? bad : in->g, GSN, dt);
        double sumsq = -1;
        int64_t nonfinite = -1;
        OK(b->ops->grad_stats(b->dev, g, GSN, dt, gs_factor, &sumsq, &nonfinite, scratch));
        if (!k)
            add_scalar(out, "sum of squares", sumsq);
        add_scalar(out, k ? "non-finite (with inf, nan)" : "non-finite", (double)nonfinite);
        dfree(b, g);
    }
    free(bad);
    dfree(b, scratch);
}

static void gs_ref(int v, const void *p, result *out)
{
    (void)v;
    const gs_in *in = p;
    double ss = 0;
    for (int i = 0; i < GSN; i++)
        ss += (double)gs_factor * in->g[i] * gs_factor * in->g[i];
    add_scalar(out, "sum of squares", ss);
    add_scalar(out, "non-finite", 0);
    add_scalar(out, "non-finite (with inf, nan)", 3);
}

static const op_test gs_test = {"grad_stats", 3, dt_name, dt_of, gs_make, gs_run, gs_ref,
                                gs_free, 1.0};

/* ======================================================================== */
/* AdamW for every (weights, state, master, stochastic) combination the
 * precision modes use. */

typedef struct adamw_variant {
    const char *name;
    int w_dt, state_dt, master, stochastic;
} adamw_variant;

static const adamw_variant adamw_variants[] = {
    {"FP32", LLMT_DTYPE_F32, LLMT_DTYPE_F32, 0, 0},
    {"BF16_MIXED", LLMT_DTYPE_BF16, LLMT_DTYPE_F32, 1, 0},
    {"FP16_MIXED", LLMT_DTYPE_F16, LLMT_DTYPE_F32, 1, 0},
    {"BF16_PURE", LLMT_DTYPE_BF16, LLMT_DTYPE_BF16, 0, 1},
    {"BF16 weights and state, nearest", LLMT_DTYPE_BF16, LLMT_DTYPE_BF16, 0, 0},
};
#define ADAMW_VARIANTS ((int)(sizeof adamw_variants / sizeof adamw_variants[0]))

enum { WN = 5003 };

typedef struct adamw_in {
    adamw_variant var;
    llmt_adamw_args args; /* scalars; pointers set per backend */
    float *w, *master, *g, *m, *v;
} adamw_in;

static const char *adamw_name(int v)
{
    return adamw_variants[v].name;
}

static int adamw_dt(int v)
{
    return adamw_variants[v].w_dt;
}

static void *adamw_make(int v, uint64_t seed)
{
    uint64_t s = seed;
    adamw_in *in = calloc(1, sizeof *in);
    in->var = adamw_variants[v];
    in->master = randn(&s, WN, 0.5, LLMT_DTYPE_F32);
    in->w = malloc(WN * sizeof *in->w);
    for (int i = 0; i < WN; i++)
        in->w[i] = round_dt(in->master[i], in->var.w_dt);
    in->g = randn(&s, WN, 0.1, in->var.w_dt);
    in->m = randn(&s, WN, 0.01, in->var.state_dt);
    in->v = randn(&s, WN, 0.001, in->var.state_dt);
    for (int i = 0; i < WN; i++)
        in->v[i] = fabsf(in->v[i]);
    llmt_adamw_args a = {0};
    a.n = WN;
    a.w_dt = in->var.w_dt;
    a.state_dt = in->var.state_dt;
    a.grad_factor = 0.8f;
    a.lr = 1e-2f;
    a.beta1 = 0.9f;
    a.beta2 = 0.95f;
    a.eps = 1e-8f;
    a.weight_decay = 0.1f;
    a.bias_correction1 = (float)(1.0 - pow(0.9, 3));
    a.bias_correction2 = (float)(1.0 - pow(0.95, 3));
    a.stochastic = in->var.stochastic;
    a.seed = 0x1234567890abcdefULL;
    a.rng_offset = 777; /* not a multiple of 4: values start mid-block */
    in->args = a;
    return in;
}

static void adamw_free(void *p)
{
    adamw_in *in = p;
    free(in->w);
    free(in->master);
    free(in->g);
    free(in->m);
    free(in->v);
    free(in);
}

static void adamw_run(backend *b, int v, const void *p, result *out)
{
    (void)v;
    const adamw_in *in = p;
    llmt_adamw_args a = in->args;
    a.w = dput(b, in->w, WN, a.w_dt);
    a.g = dput(b, in->g, WN, a.w_dt);
    a.m = dput(b, in->m, WN, a.state_dt);
    a.v = dput(b, in->v, WN, a.state_dt);
    a.master = in->var.master ? dput(b, in->master, WN, LLMT_DTYPE_F32) : NULL;
    OK(b->ops->adamw(b->dev, &a));
    add_dev(out, b, "w", a.w, WN, a.w_dt);
    add_dev(out, b, "m", a.m, WN, a.state_dt);
    add_dev(out, b, "v", a.v, WN, a.state_dt);
    if (a.master) {
        add_dev(out, b, "master", a.master, WN, LLMT_DTYPE_F32);
        dfree(b, a.master);
    }
    dfree(b, a.w);
    dfree(b, (void *)a.g);
    dfree(b, a.m);
    dfree(b, a.v);
}

static void adamw_ref(int v, const void *p, result *out)
{
    (void)v;
    const adamw_in *in = p;
    const llmt_adamw_args *a = &in->args;
    double *w = dzeros(WN), *m = dzeros(WN), *vv = dzeros(WN);
    for (int i = 0; i < WN; i++) {
        double g = (double)in->g[i] * a->grad_factor;
        double w0 = in->var.master ? in->master[i] : in->w[i];
        m[i] = a->beta1 * (double)in->m[i] + (1.0 - a->beta1) * g;
        vv[i] = a->beta2 * (double)in->v[i] + (1.0 - a->beta2) * g * g;
        w[i] = w0 * (1.0 - (double)a->lr * a->weight_decay) -
               (double)a->lr / a->bias_correction1 * m[i] /
                   (sqrt(vv[i]) / sqrt((double)a->bias_correction2) + a->eps);
    }
    /* Stochastic rounding lands on one of the two bf16 neighbours: within
     * one bf16 ulp of the exact value, inside the BF16 tolerance. */
    add_d(out, "w", w, WN);
    add_d(out, "m", m, WN);
    add_d(out, "v", vv, WN);
    if (in->var.master)
        add_d(out, "master", w, WN);
    free(w);
    free(m);
    free(vv);
}

static const op_test adamw_test = {"adamw", ADAMW_VARIANTS, adamw_name, adamw_dt, adamw_make,
                                   adamw_run, adamw_ref, adamw_free, 1.0};

/* The stochastic rounding of BF16_PURE must draw the CPU's Philox values:
 * a wrong draw still lands within one ulp (inside any tolerance), so the
 * CUDA weights must equal the CPU's bit for bit (both compute the update
 * with the same fp32 expression, without contraction). */
static void check_stochastic_bits(void)
{
    void *in = adamw_make(3, 99);
    result cpu = {0}, gpu = {0};
    adamw_run(&g_cpu, 3, in, &cpu);
    adamw_run(&g_cuda, 3, in, &gpu);
    int64_t differ = 0;
    for (int64_t i = 0; i < WN; i++)
        differ += cpu.v[0][i] != gpu.v[0][i];
    print_message("adamw BF16_PURE: %lld of %d stochastically rounded weights differ from the "
                  "CPU's\n", (long long)differ, WN);
    assert_true(differ == 0);
    result_free(&cpu);
    result_free(&gpu);
    adamw_free(in);
}

/* ======================================================================== */

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
OP_TESTS(embedding, embed_test)
OP_TESTS(rmsnorm, rms_test)
OP_TESTS(rope, rope_test)
OP_TESTS(attention, attn_test)
OP_TESTS(swiglu, swiglu_test)
OP_TESTS(add_cast, add_test)
OP_TESTS(lm_head_ce, ce_test)
OP_TESTS(grad_stats, gs_test)
OP_TESTS(adamw, adamw_test)

static void test_adamw_stochastic_bits_cuda(void **state)
{
    (void)state;
    if (!g_have_cuda)
        skip();
    check_stochastic_bits();
}

/* The CUDA backend refuses what it does not handle, with a message. */
static void test_unsupported_cuda(void **state)
{
    (void)state;
    if (!g_have_cuda)
        skip();
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
 * CTest's "skipped", when no CUDA device can be opened. */
int main(int argc, char **argv)
{
    int cuda = argc > 1 && strcmp(argv[1], "cuda") == 0;
    if (argc > 1 && !cuda) {
        fprintf(stderr, "usage: %s [cuda]\n", argv[0]);
        return 2;
    }
    open_backends();
    const struct CMUnitTest cpu_tests[] = {
        cmocka_unit_test(test_gemm_cpu),
        cmocka_unit_test(test_embedding_cpu),
        cmocka_unit_test(test_rmsnorm_cpu),
        cmocka_unit_test(test_rope_cpu),
        cmocka_unit_test(test_attention_cpu),
        cmocka_unit_test(test_swiglu_cpu),
        cmocka_unit_test(test_add_cast_cpu),
        cmocka_unit_test(test_lm_head_ce_cpu),
        cmocka_unit_test(test_grad_stats_cpu),
        cmocka_unit_test(test_adamw_cpu),
    };
    const struct CMUnitTest cuda_tests[] = {
        cmocka_unit_test(test_gemm_cuda),
        cmocka_unit_test(test_embedding_cuda),
        cmocka_unit_test(test_rmsnorm_cuda),
        cmocka_unit_test(test_rope_cuda),
        cmocka_unit_test(test_attention_cuda),
        cmocka_unit_test(test_swiglu_cuda),
        cmocka_unit_test(test_add_cast_cuda),
        cmocka_unit_test(test_lm_head_ce_cuda),
        cmocka_unit_test(test_grad_stats_cuda),
        cmocka_unit_test(test_adamw_cuda),
        cmocka_unit_test(test_adamw_stochastic_bits_cuda),
        cmocka_unit_test(test_unsupported_cuda),
    };
    int failed = cuda ? cmocka_run_group_tests_name("cuda", cuda_tests, NULL, NULL)
                      : cmocka_run_group_tests_name("cpu", cpu_tests, NULL, NULL);
    close_backends();
    return failed ? failed : cuda && !g_have_cuda ? 77 : 0;
}
