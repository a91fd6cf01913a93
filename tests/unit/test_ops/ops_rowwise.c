/* Op tests of the row-wise ops: embedding, RMSNorm, RoPE, SwiGLU, add and cast
 * (descriptors used by test_ops.c). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops_harness.h"

#include "core/half.h"
#include "core/rng.h"
#include "test_rand.h"

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

const op_test embed_test = {"embedding", 3, dt_name, dt_of, embed_make, embed_run,
                                   embed_ref, embed_free, 1.0};

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

const op_test rms_test = {"rmsnorm", 3, dt_name, dt_of, rms_make, rms_run, rms_ref,
                                 rms_free, 1.0};

/* RoPE forward and inverse on the first `heads` of `row_heads` head vectors
 * per row, row r at position r % seq, in several shapes: whole sequences,
 * a partial last one, fewer rows than one sequence, and (F32 and forward
 * only: 131k rows, slow on the emulator) more than 65535 sequences, so that
 * CUDA's grid, whose height stops there, strides its sequences. Each
 * buffer has a row past m, which
 * must stay as it was. The table rotates every position, the first too
 * (angle (pos + 1) theta_i), so a row at the wrong position or skipped
 * shows. Also: seq 0 is refused, naming it. */

typedef struct rope_case {
    int64_t m, seq, heads, row_heads, hd;
    int inverse; /* the inverse runs too, after the rotation */
} rope_case;

static const rope_case rope_cases[] = {
    {14, 7, 3, 5, 8, 1},           /* two whole sequences */
    {10, 7, 3, 5, 8, 1},           /* a partial last sequence */
    {5, 7, 3, 5, 8, 1},            /* fewer rows than one sequence */
    {2 * 65536 + 1, 2, 1, 1, 2, 0} /* 65537 sequences: past the grid's height */
};

enum { ROPE_CASES = sizeof rope_cases / sizeof *rope_cases };

/* The cases variant v runs: the last (large) one in F32 only. */
static int rope_case_count(int v)
{
    return v == 0 ? ROPE_CASES : ROPE_CASES - 1;
}

/* Elements of case c's buffer: m rows and one more, of row_heads heads. */
static int64_t rope_elems(const rope_case *c)
{
    return (c->m + 1) * c->row_heads * c->hd;
}

typedef struct rope_in {
    int dt;
    float *x[ROPE_CASES];
    float *cs[ROPE_CASES]; /* per position hd / 2 cosines then hd / 2 sines */
} rope_in;

static void *rope_make(int v, uint64_t seed)
{
    uint64_t s = seed;
    rope_in *in = calloc(1, sizeof *in);
    in->dt = dtypes[v];
    for (int k = 0; k < rope_case_count(v); k++) {
        const rope_case *c = &rope_cases[k];
        in->x[k] = randn(&s, rope_elems(c), 1.0, in->dt);
        in->cs[k] = malloc((size_t)(c->seq * c->hd) * sizeof(float));
        for (int64_t pos = 0; pos < c->seq; pos++)
            for (int64_t i = 0; i < c->hd / 2; i++) {
                double angle = (double)(pos + 1) * pow(10000.0, -2.0 * (double)i / (double)c->hd);
                in->cs[k][pos * c->hd + i] = (float)cos(angle);
                in->cs[k][pos * c->hd + c->hd / 2 + i] = (float)sin(angle);
            }
    }
    return in;
}

static void rope_free(void *p)
{
    rope_in *in = p;
    for (int k = 0; k < ROPE_CASES; k++) {
        free(in->x[k]);
        free(in->cs[k]);
    }
    free(in);
}

static void rope_run(backend *b, int v, const void *p, result *out)
{
    const rope_in *in = p;
    const int dt = in->dt;
    for (int k = 0; k < rope_case_count(v); k++) {
        const rope_case *c = &rope_cases[k];
        const int64_t n = rope_elems(c), ld = c->row_heads * c->hd;
        void *x = dput(b, in->x[k], n, dt);
        void *cs = dput(b, in->cs[k], c->seq * c->hd, LLMT_DTYPE_F32);
        char name[40];
        OK(b->ops->rope(b->dev, x, cs, c->m, c->seq, c->heads, c->hd, ld, 0, dt));
        snprintf(name, sizeof name, "m %lld seq %lld: rotated", (long long)c->m, (long long)c->seq);
        add_dev(out, b, name, x, n, dt);
        if (c->inverse) {
            OK(b->ops->rope(b->dev, x, cs, c->m, c->seq, c->heads, c->hd, ld, 1, dt));
            snprintf(name, sizeof name, "m %lld seq %lld: back", (long long)c->m,
                     (long long)c->seq);
            add_dev(out, b, name, x, n, dt);
        }
        if (k == 0) { /* a sequence length of 0 puts a row at no position */
            assert_int_equal(b->ops->rope(b->dev, x, cs, c->m, 0, c->heads, c->hd, ld, 0, dt),
                             LLMT_EINVAL);
            assert_contains(llmt_error_last(), "rope: seq = 0 is not positive");
        }
        dfree(b, x);
        dfree(b, cs);
    }
}

static void rope_ref(int v, const void *p, result *out)
{
    const rope_in *in = p;
    for (int k = 0; k < rope_case_count(v); k++) {
        const rope_case *c = &rope_cases[k];
        const int64_t n = rope_elems(c), half = c->hd / 2;
        double *y = dzeros(n), *back = dzeros(n);
        for (int64_t i = 0; i < n; i++)
            y[i] = back[i] = in->x[k][i];
        for (int64_t r = 0; r < c->m; r++) {
            const float *cos_t = in->cs[k] + (r % c->seq) * c->hd, *sin_t = cos_t + half;
            for (int64_t h = 0; h < c->heads; h++) {
                double *q = y + (r * c->row_heads + h) * c->hd;
                for (int64_t i = 0; i < half; i++) {
                    double x1 = q[i], x2 = q[i + half];
                    q[i] = x1 * cos_t[i] - x2 * sin_t[i];
                    q[i + half] = x2 * cos_t[i] + x1 * sin_t[i];
                }
            }
        }
        char name[40];
        snprintf(name, sizeof name, "m %lld seq %lld: rotated", (long long)c->m, (long long)c->seq);
        add_d(out, name, y, n);
        if (c->inverse) {
            snprintf(name, sizeof name, "m %lld seq %lld: back", (long long)c->m,
                     (long long)c->seq);
            add_d(out, name, back, n); /* the inverse undoes the rotation */
        }
        free(y);
        free(back);
    }
}

const op_test rope_test = {"rope", 3, dt_name, dt_of, rope_make, rope_run, rope_ref,
                                  rope_free, 1.0};

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

const op_test swiglu_test = {"swiglu", 3, dt_name, dt_of, swiglu_make, swiglu_run,
                                    swiglu_ref, swiglu_free, 1.0};

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

const op_test add_test = {"add and cast", 3, dt_name, dt_of, add_make, add_run, add_ref,
                                 add_free, 1.0};
