/* CPU optimizer kernels: the one-pass gradient statistics (unscale, check for
 * inf/NaN, sum of squares) and the fused AdamW update. */
#include <math.h>
#include <omp.h>

#include "core/error.h"
#include "core/rng.h"
#include "ops/cpu/cpu_backend.h"

#define MAX_STAT_THREADS 1024

/* Sum of squares and non-finite count of factor * g[0..n): the product
 * rounds to fp32 (as the op is defined), and is squared and summed in
 * double, so a finite value whose fp32 square would overflow (|x| > 1.8e19)
 * counts exactly. 16 double lanes, flushed to the total every block of
 * 4096 that starts at g (the blocks keep the lane counts small). */
LLMT_INLINE void stats_band_t(const void *g, int64_t n, float factor, double *sumsq,
                              int64_t *bad, int dt)
{
    const int64_t block = 4096;
    double total = 0.0;
    int64_t nonfinite = 0;
    for (int64_t b0 = 0; b0 < n; b0 += block) {
        int64_t b1 = b0 + block < n ? b0 + block : n;
        double acc[16] = {0};
        int32_t cnt[16] = {0};
        int64_t i = b0;
        for (; i + 16 <= b1; i += 16)
            for (int j = 0; j < 16; j++) {
                float x = get(g, dt, i + j) * factor;
                cnt[j] += (llmt_f32_bits(x) & 0x7f800000u) == 0x7f800000u;
                acc[j] += (double)x * (double)x;
            }
        for (int j = 0; i + j < b1; j++) {
            float x = get(g, dt, i + j) * factor;
            cnt[j] += (llmt_f32_bits(x) & 0x7f800000u) == 0x7f800000u;
            acc[j] += (double)x * (double)x;
        }
        for (int j = 0; j < 16; j++) {
            total += acc[j];
            nonfinite += cnt[j];
        }
    }
    *sumsq = total;
    *bad = nonfinite;
}
LLMT_DTYPE_VARIANTS(stats_band,
                    (const void *g, int64_t n, float factor, double *sumsq, int64_t *bad), g, n,
                    factor, sumsq, bad)

int llmt_cpu_grad_stats(llmt_device *dev, const void *g, int64_t n, int dt, float factor,
                        double *sumsq, int64_t *nonfinite, void *scratch)
{
    (void)scratch;
    double part[MAX_STAT_THREADS] = {0};
    int64_t bad[MAX_STAT_THREADS] = {0};
    int nt = threads_for(dev, n);
    nt = nt < MAX_STAT_THREADS ? nt : MAX_STAT_THREADS;
    void (*band)(const void *, int64_t, float, double *, int64_t *) = LLMT_PICK(stats_band, dt);
#pragma omp parallel num_threads(nt)
    {
        int t = omp_get_thread_num();
        int64_t i0, i1;
        split_rows(n, t, omp_get_num_threads(), &i0, &i1);
        band(cat(g, dt, i0), i1 - i0, factor, &part[t], &bad[t]);
    }
    double total = 0.0;
    int64_t count = 0;
    for (int t = 0; t < nt; t++) { /* in thread order: deterministic */
        total += part[t];
        count += bad[t];
    }
    *sumsq = total;
    *nonfinite = count;
    return LLMT_OK;
}

int llmt_cpu_grad_stats_blocks(llmt_device *dev, const void *g, int64_t n, int dt, float factor,
                               int64_t block, double *partials, int64_t *nonfinite,
                               void *scratch)
{
    (void)scratch;
    void (*band)(const void *, int64_t, float, double *, int64_t *) = LLMT_PICK(stats_band, dt);
    const int64_t blocks = (n + block - 1) / block;
    int64_t count = 0;
    /* Each block is summed by one thread alone: the partials do not depend
     * on the thread count. */
#pragma omp parallel for num_threads(threads_for(dev, n)) schedule(static) reduction(+ : count)
    for (int64_t b = 0; b < blocks; b++) {
        int64_t i0 = b * block, len = n - i0 < block ? n - i0 : block, bad = 0;
        band(cat(g, dt, i0), len, factor, &partials[b], &bad);
        count += bad;
    }
    *nonfinite = count;
    return LLMT_OK;
}

/* bf16 from fp32 rounding up with probability equal to the dropped fraction:
 * add 16 random bits below the kept ones, then truncate. */
LLMT_INLINE uint16_t bf16_stochastic(float f, uint32_t random)
{
    uint32_t u = llmt_f32_bits(f);
    if ((u & 0x7f800000u) == 0x7f800000u)
        return llmt_f32_to_bf16(f); /* inf and NaN as they are */
    return (uint16_t)((u + (random & 0xffffu)) >> 16);
}

/* Elements per tile: the 16-bit modes widen a tile into fp32 arrays on the
 * stack, update it, and narrow it back. */
#define ADAMW_TILE 512

/* The loop invariants of one update, each the same fp32 operation on the
 * same operands as the per-element formula it replaces, so the same bits. */
typedef struct adamw_consts {
    float grad_factor, decay, beta1, one_minus_beta1, beta2, one_minus_beta2;
    float sqrt_bc2, eps, step_size;
} adamw_consts;

static adamw_consts adamw_consts_of(const llmt_adamw_args *a)
{
    adamw_consts k = {
        .grad_factor = a->grad_factor,
        .decay = 1.0f - a->lr * a->weight_decay,
        .beta1 = a->beta1,
        .one_minus_beta1 = 1.0f - a->beta1,
        .beta2 = a->beta2,
        .one_minus_beta2 = 1.0f - a->beta2,
        .sqrt_bc2 = sqrtf(a->bias_correction2),
        .eps = a->eps,
        .step_size = a->lr / a->bias_correction1,
    };
    return k;
}

/* AdamW over n fp32 elements, in place (PyTorch's order of operations;
 * the CUDA kernel computes the same expressions with -fmad=false). No FMA
 * is contracted (ISO C mode), and the vector sqrt and division are
 * correctly rounded, so vectorising changes no bit. */
LLMT_INLINE void adamw_f32_run(const adamw_consts *k, float *restrict w, const float *restrict g,
                               float *restrict m, float *restrict v, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        float gi = g[i] * k->grad_factor;
        float wi = w[i] * k->decay;
        float mi = k->beta1 * m[i] + k->one_minus_beta1 * gi;
        float vi = k->beta2 * v[i] + k->one_minus_beta2 * gi * gi;
        float denom = sqrtf(vi) / k->sqrt_bc2 + k->eps;
        m[i] = mi;
        v[i] = vi;
        w[i] = wi - k->step_size * mi / denom;
    }
}

/* Widens n 16-bit values (dtype dt) to fp32, and narrows back rounding to
 * nearest even. */
LLMT_INLINE void widen(float *restrict out, const void *restrict in, int dt, int n)
{
    for (int i = 0; i < n; i++)
        out[i] = get(in, dt, i);
}
LLMT_INLINE void narrow(void *restrict out, const float *restrict in, int dt, int n)
{
    for (int i = 0; i < n; i++)
        put(out, dt, i, in[i]);
}

LLMT_CLONES static void adamw_f32(const llmt_adamw_args *a, int64_t i0, int64_t i1)
{
    const adamw_consts k = adamw_consts_of(a);
    adamw_f32_run(&k, (float *)a->w + i0, (const float *)a->g + i0, (float *)a->m + i0,
                  (float *)a->v + i0, i1 - i0);
}

/* 16-bit weights and gradients, fp32 master weights and moments: the
 * update runs on the master; the weights are its rounding. */
LLMT_INLINE void adamw_master_t(const llmt_adamw_args *a, int64_t i0, int64_t i1, int wdt)
{
    const adamw_consts k = adamw_consts_of(a);
    float g[ADAMW_TILE];
    for (int64_t t = i0; t < i1; t += ADAMW_TILE) {
        int n = i1 - t < ADAMW_TILE ? (int)(i1 - t) : ADAMW_TILE;
        widen(g, cat(a->g, wdt, t), wdt, n);
        adamw_f32_run(&k, a->master + t, g, (float *)a->m + t, (float *)a->v + t, n);
        narrow(at(a->w, wdt, t), a->master + t, wdt, n);
    }
}

LLMT_CLONES static void adamw_bf16_master(const llmt_adamw_args *a, int64_t i0, int64_t i1)
{
    adamw_master_t(a, i0, i1, LLMT_DTYPE_BF16);
}
LLMT_CLONES static void adamw_f16_master(const llmt_adamw_args *a, int64_t i0, int64_t i1)
{
    adamw_master_t(a, i0, i1, LLMT_DTYPE_F16);
}

/* bf16 weights, gradients and moments: the weights round stochastically,
 * element i with value rng_offset + i of the rounding stream (one Philox
 * block serves four). */
LLMT_CLONES static void adamw_bf16_pure(const llmt_adamw_args *a, int64_t i0, int64_t i1)
{
    const adamw_consts k = adamw_consts_of(a);
    const int dt = LLMT_DTYPE_BF16;
    float w[ADAMW_TILE], g[ADAMW_TILE], m[ADAMW_TILE], v[ADAMW_TILE];
    uint32_t block[4];
    for (int64_t t = i0; t < i1; t += ADAMW_TILE) {
        int n = i1 - t < ADAMW_TILE ? (int)(i1 - t) : ADAMW_TILE;
        widen(w, cat(a->w, dt, t), dt, n);
        widen(g, cat(a->g, dt, t), dt, n);
        widen(m, cat(a->m, dt, t), dt, n);
        widen(v, cat(a->v, dt, t), dt, n);
        adamw_f32_run(&k, w, g, m, v, n);
        narrow(at(a->m, dt, t), m, dt, n);
        narrow(at(a->v, dt, t), v, dt, n);
        uint16_t *out = (uint16_t *)a->w + t;
        if (!a->stochastic) {
            narrow(out, w, dt, n);
            continue;
        }
        for (int j = 0; j < n; j++) {
            uint64_t idx = a->rng_offset + (uint64_t)(t + j);
            if ((t == i0 && j == 0) || idx % 4 == 0)
                llmt_rng_block(a->seed, LLMT_STREAM_ROUNDING, idx / 4, block);
            out[j] = bf16_stochastic(w[j], block[idx % 4]);
        }
    }
}

int llmt_cpu_adamw(llmt_device *dev, const llmt_adamw_args *a)
{
    void (*band)(const llmt_adamw_args *, int64_t, int64_t);
    if (a->w_dt == LLMT_DTYPE_F32 && a->state_dt == LLMT_DTYPE_F32 && !a->master)
        band = adamw_f32;
    else if (a->w_dt == LLMT_DTYPE_BF16 && a->state_dt == LLMT_DTYPE_F32 && a->master)
        band = adamw_bf16_master;
    else if (a->w_dt == LLMT_DTYPE_F16 && a->state_dt == LLMT_DTYPE_F32 && a->master)
        band = adamw_f16_master;
    else if (a->w_dt == LLMT_DTYPE_BF16 && a->state_dt == LLMT_DTYPE_BF16 && !a->master)
        band = adamw_bf16_pure;
    else
        return llmt_fail(LLMT_EUNSUPPORTED, "cpu adamw: weights %s, state %s%s",
                         llmt_dtype_name(a->w_dt), llmt_dtype_name(a->state_dt),
                         a->master ? " with master weights" : "");
#pragma omp parallel num_threads(threads_for(dev, a->n))
    {
        int64_t i0, i1;
        split_rows(a->n, omp_get_thread_num(), omp_get_num_threads(), &i0, &i1);
        band(a, i0, i1);
    }
    return LLMT_OK;
}
