/* Op tests of the fused LM head and cross-entropy (descriptors used by test_ops.c). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops_harness.h"

#include "core/half.h"
#include "core/rng.h"
#include "test_rand.h"

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

const op_test ce_test = {"lm_head_ce", 3, dt_name, dt_of, ce_make, ce_run, ce_ref,
                                ce_free, 1.0};
