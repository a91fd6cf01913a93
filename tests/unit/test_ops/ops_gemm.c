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

const op_test gemm_test = {"gemm", 3, dt_name, dt_of, gemm_make, gemm_run, gemm_ref,
                                  gemm_free, 1.0};
