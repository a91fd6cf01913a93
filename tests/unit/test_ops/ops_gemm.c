/* Op tests of GEMM (descriptors used by test_ops.c). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops_harness.h"

#include "core/half.h"
#include "core/rng.h"
#include "test_rand.h"

/* GEMM: the four transpose combinations, beta 0 and 1, padded leading
 * dimensions on some. */

enum { GM = 37, GN = 29, GK = 45 };
/* What C's padding holds before and after a product. */
#define PAD_BYTE 0xA5

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
    const gemm_in *in = p;
    const int dt = in->dt;
    llmt_op_dims dims = {0};
    dims.dt = dt;
    void *scratch = scratch_alloc(b, dims, (GM * GK + GN * GK + GM * GN) * sizeof(float));
    for (int c = 0; c < 8; c++) {
        int64_t na = (in->ta[c] ? GK : GM) * in->lda[c], nb = (in->tb[c] ? GN : GK) * in->ldb[c];
        void *a = dput(b, in->a[c], na, dt), *bb = dput(b, in->b[c], nb, dt);
        /* beta 0 leaves C poisoned (0xFF bytes): the op must not read it;
         * C's padding columns [GN, ldc) hold PAD_BYTE bytes: it must not
         * write them. */
        const size_t e = llmt_dtype_size(dt), c_bytes = (size_t)(GM * in->ldc[c]) * e;
        unsigned char *hc = pack(in->c[c], GM * in->ldc[c], dt);
        if (in->beta[c] == 0.0f)
            memset(hc, 0xFF, c_bytes);
        for (int i = 0; i < GM; i++)
            memset(hc + (size_t)(i * in->ldc[c] + GN) * e, PAD_BYTE,
                   (size_t)(in->ldc[c] - GN) * e);
        void *cc = dput_raw(b, hc, c_bytes);
        OK(b->ops->gemm(b->dev, in->ta[c], in->tb[c], GM, GN, GK, in->alpha, a, in->lda[c], bb,
                        in->ldb[c], in->beta[c], cc, in->ldc[c], dt, scratch));
        OK(b->ops->copy_to_host(b->dev, hc, cc, c_bytes));
        for (int i = 0; i < GM; i++)
            for (size_t x = (size_t)(i * in->ldc[c] + GN) * e; x < (size_t)(i + 1) * in->ldc[c] * e;
                 x++)
                if (hc[x] != PAD_BYTE)
                    fail_msg("gemm case %d (%s): C padding byte %zu of row %d written", c,
                             dt_name(v), x, i);
        free(hc);
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

const op_test gemm_test = {"gemm", 3, dt_name, dt_of, gemm_make, gemm_run, gemm_ref,
                                  gemm_free, 1.0};

/* GEMM on the model's products, at odd sizes large enough to run on two
 * threads and to leave partial blocks in every dimension of the 16-bit
 * kernels: a linear layer (out x in weight W) over M tokens:
 * forward Y = X W^T, data gradient dX = dY W, weight gradient dW += dY^T X.
 * Two layers: 256 tokens, 131 x 77, and 515 tokens, 257 x 131. */

enum { GMODEL_CASES = 6 };

typedef struct gemm_model_in {
    int dt;
    int ta[GMODEL_CASES], tb[GMODEL_CASES];
    int64_t m[GMODEL_CASES], n[GMODEL_CASES], k[GMODEL_CASES];
    float beta[GMODEL_CASES];
    float *a[GMODEL_CASES], *b[GMODEL_CASES], *c[GMODEL_CASES]; /* packed, as stored */
} gemm_model_in;

static const char *const gmodel_names[GMODEL_CASES] = {
    "256x131x77 Y = X W^T", "256x131x77 dX = dY W", "256x131x77 dW += dY^T X",
    "515x257x131 Y = X W^T", "515x257x131 dX = dY W", "515x257x131 dW += dY^T X"};

static void *gemm_model_make(int v, uint64_t seed)
{
    uint64_t s = seed;
    gemm_model_in *in = calloc(1, sizeof *in);
    in->dt = dtypes[v];
    const int64_t layers[2][3] = {{256, 131, 77}, {515, 257, 131}}; /* tokens, out, in */
    for (int c = 0; c < GMODEL_CASES; c++) {
        const int64_t tok = layers[c / 3][0], out = layers[c / 3][1], inn = layers[c / 3][2];
        switch (c % 3) {
        case 0: /* Y[tok, out] = X[tok, in] W[out, in]^T */
            in->ta[c] = 0, in->tb[c] = 1, in->m[c] = tok, in->n[c] = out, in->k[c] = inn;
            break;
        case 1: /* dX[tok, in] = dY[tok, out] W[out, in] */
            in->ta[c] = 0, in->tb[c] = 0, in->m[c] = tok, in->n[c] = inn, in->k[c] = out;
            break;
        default: /* dW[out, in] += dY[tok, out]^T X[tok, in] */
            in->ta[c] = 1, in->tb[c] = 0, in->m[c] = out, in->n[c] = inn, in->k[c] = tok;
            in->beta[c] = 1.0f;
        }
        in->a[c] = randn(&s, in->m[c] * in->k[c], 1.0, in->dt);
        in->b[c] = randn(&s, in->k[c] * in->n[c], 1.0, in->dt);
        in->c[c] = randn(&s, in->m[c] * in->n[c], 1.0, in->dt);
    }
    return in;
}

static void gemm_model_free(void *p)
{
    gemm_model_in *in = p;
    for (int c = 0; c < GMODEL_CASES; c++) {
        free(in->a[c]);
        free(in->b[c]);
        free(in->c[c]);
    }
    free(in);
}

static void gemm_model_run(backend *b, int v, const void *p, result *out)
{
    (void)v;
    const gemm_model_in *in = p;
    const int dt = in->dt;
    llmt_op_dims dims = {0};
    dims.dt = dt;
    void *scratch = scratch_alloc(b, dims, (515 * 131 + 257 * 131 + 515 * 257) * sizeof(float));
    for (int c = 0; c < GMODEL_CASES; c++) {
        const int64_t m = in->m[c], n = in->n[c], k = in->k[c];
        void *a = dput(b, in->a[c], m * k, dt), *bb = dput(b, in->b[c], k * n, dt);
        void *cc = in->beta[c] != 0.0f ? dput(b, in->c[c], m * n, dt)
                                       : dalloc(b, (size_t)(m * n) * llmt_dtype_size(dt));
        OK(b->ops->gemm(b->dev, in->ta[c], in->tb[c], m, n, k, 1.0f, a, in->ta[c] ? m : k, bb,
                        in->tb[c] ? k : n, in->beta[c], cc, n, dt, scratch));
        add_dev(out, b, gmodel_names[c], cc, m * n, dt);
        dfree(b, a);
        dfree(b, bb);
        dfree(b, cc);
    }
    dfree(b, scratch);
}

static void gemm_model_ref(int v, const void *p, result *out)
{
    (void)v;
    const gemm_model_in *in = p;
    for (int c = 0; c < GMODEL_CASES; c++) {
        const int64_t m = in->m[c], n = in->n[c], k = in->k[c];
        double *d = malloc((size_t)(m * n) * sizeof *d);
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) {
                double acc = 0.0;
                for (int64_t l = 0; l < k; l++) {
                    double x = in->ta[c] ? in->a[c][l * m + i] : in->a[c][i * k + l];
                    double y = in->tb[c] ? in->b[c][j * k + l] : in->b[c][l * n + j];
                    acc += x * y;
                }
                d[i * n + j] = acc + (double)in->beta[c] * in->c[c][i * n + j];
            }
        add_d(out, gmodel_names[c], d, m * n);
        free(d);
    }
}

const op_test gemm_model_test = {"gemm_model", 3, dt_name, dt_of, gemm_model_make, gemm_model_run,
                                 gemm_model_ref, gemm_model_free, 1.0};
