/* Op tests of the optimizer ops: gradient statistics and AdamW
 * (descriptors used by test_ops.c). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops_harness.h"

#include "core/half.h"
#include "core/rng.h"
#include "test_rand.h"

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

const op_test gs_test = {"grad_stats", 3, dt_name, dt_of, gs_make, gs_run, gs_ref,
                                gs_free, 1.0};

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

const op_test adamw_test = {"adamw", ADAMW_VARIANTS, adamw_name, adamw_dt, adamw_make,
                                   adamw_run, adamw_ref, adamw_free, 1.0};

/* One AdamW element in fp32, written from lib/ops/ops.h's definition in
 * the order of operations of PyTorch's AdamW (the same expressions as the
 * CUDA kernel); ISO C contracts no FMA. Returns the new weight. */
static float adamw_scalar(const llmt_adamw_args *a, float w, float g, float *m, float *v)
{
    g *= a->grad_factor;
    w *= 1.0f - a->lr * a->weight_decay;
    *m = a->beta1 * *m + (1.0f - a->beta1) * g;
    *v = a->beta2 * *v + (1.0f - a->beta2) * g * g;
    float denom = sqrtf(*v) / sqrtf(a->bias_correction2) + a->eps;
    return w - (a->lr / a->bias_correction1) * *m / denom;
}

static uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

void check_adamw_cpu_bits(void)
{
    backend *b = &g_cpu;
    for (int var = 0; var < ADAMW_VARIANTS; var++)
        for (int64_t n = 1; n <= WN; n += WN - 1) { /* one element, and tiles plus a tail */
            adamw_in *in = adamw_make(var, 99 + (uint64_t)var);
            in->g[1 % n] = INFINITY; /* the weight becomes NaN or stays, as the formula says */
            in->g[2 % n] = NAN;
            in->v[3 % n] = 0.0f;
            llmt_adamw_args a = in->args;
            a.n = n;
            a.stochastic = 0; /* the stochastic draw is check_stochastic_bits' */
            a.w = pack(in->w, n, a.w_dt);
            a.g = pack(in->g, n, a.w_dt);
            a.m = pack(in->m, n, a.state_dt);
            a.v = pack(in->v, n, a.state_dt);
            a.master = in->var.master ? pack(in->master, n, LLMT_DTYPE_F32) : NULL;
            OK(b->ops->adamw(b->dev, &a));
            float got[4];
            for (int64_t i = 0; i < n; i++) {
                /* The inputs as stored (rounded to their dtypes), updated by hand. */
                float m = round_dt(in->m[i], a.state_dt), v = round_dt(in->v[i], a.state_dt);
                float w0 = in->var.master ? in->master[i] : round_dt(in->w[i], a.w_dt);
                float w = adamw_scalar(&a, w0, round_dt(in->g[i], a.w_dt), &m, &v);
                unpack(&got[0], (const char *)a.w + i * (int64_t)llmt_dtype_size(a.w_dt), 1, a.w_dt);
                unpack(&got[1], (const char *)a.m + i * (int64_t)llmt_dtype_size(a.state_dt), 1,
                       a.state_dt);
                unpack(&got[2], (const char *)a.v + i * (int64_t)llmt_dtype_size(a.state_dt), 1,
                       a.state_dt);
                got[3] = a.master ? a.master[i] : w;
                const float want[4] = {round_dt(w, a.w_dt), round_dt(m, a.state_dt),
                                       round_dt(v, a.state_dt), w};
                for (int k = 0; k < 4; k++)
                    if (bits_of(got[k]) != bits_of(want[k]) && !(isnan(got[k]) && isnan(want[k]))) {
                        fprintf(stderr, "adamw %s n %lld element %lld output %d: %a, by hand %a\n",
                                in->var.name, (long long)n, (long long)i, k, got[k], want[k]);
                        fail();
                    }
            }
            free((void *)a.w);
            free((void *)a.g);
            free(a.m);
            free(a.v);
            free(a.master);
            adamw_free(in);
        }
}

/* The stochastic rounding of BF16_PURE must draw the CPU's Philox values:
 * a wrong draw still lands within one ulp (inside any tolerance), so the
 * CUDA weights must equal the CPU's bit for bit (both compute the update
 * with the same fp32 expression, without contraction). */
void check_stochastic_bits(void)
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
