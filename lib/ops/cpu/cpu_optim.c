/* CPU optimizer kernels: the one-pass gradient statistics (unscale, check for
 * inf/NaN, sum of squares) and the fused AdamW update. */
#include <omp.h>

#include "core/error.h"
#include "core/rng.h"
#include "ops/cpu/cpu_backend.h"

#define MAX_STAT_THREADS 1024

/* Sum of squares (fp32 partials of 16 lanes, flushed to double every block)
 * and non-finite count of factor * g[0..n). */
LLMT_INLINE void stats_band_t(const void *g, int64_t n, float factor, double *sumsq,
                              int64_t *bad, int dt)
{
    const int64_t block = 4096;
    double total = 0.0;
    int64_t nonfinite = 0;
    for (int64_t b0 = 0; b0 < n; b0 += block) {
        int64_t b1 = b0 + block < n ? b0 + block : n;
        float acc[16] = {0};
        int32_t cnt[16] = {0};
        int64_t i = b0;
        for (; i + 16 <= b1; i += 16)
            for (int j = 0; j < 16; j++) {
                float x = get(g, dt, i + j) * factor;
                cnt[j] += (llmt_f32_bits(x) & 0x7f800000u) == 0x7f800000u;
                acc[j] += x * x;
            }
        for (int j = 0; i + j < b1; j++) {
            float x = get(g, dt, i + j) * factor;
            cnt[j] += (llmt_f32_bits(x) & 0x7f800000u) == 0x7f800000u;
            acc[j] += x * x;
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
                               int64_t block, double *partials, int64_t *nonfinite)
{
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

/* One element of AdamW; returns the new weight in fp32. */
LLMT_INLINE float adamw_one(const llmt_adamw_args *a, float w, float g, float *m, float *v)
{
    g *= a->grad_factor;
    w *= 1.0f - a->lr * a->weight_decay;
    *m = a->beta1 * *m + (1.0f - a->beta1) * g;
    *v = a->beta2 * *v + (1.0f - a->beta2) * g * g;
    float denom = sqrtf(*v) / sqrtf(a->bias_correction2) + a->eps;
    return w - (a->lr / a->bias_correction1) * *m / denom;
}

/* A band [i0, i1) of the update, for weight dtype wdt and state dtype sdt. */
LLMT_INLINE void adamw_band_t(const llmt_adamw_args *a, int64_t i0, int64_t i1, int wdt, int sdt)
{
    uint32_t block[4];
    for (int64_t i = i0; i < i1; i++) {
        float m = get(a->m, sdt, i), v = get(a->v, sdt, i);
        float w = a->master ? a->master[i] : get(a->w, wdt, i);
        float nw = adamw_one(a, w, get(a->g, wdt, i), &m, &v);
        put(a->m, sdt, i, m);
        put(a->v, sdt, i, v);
        if (a->master) {
            a->master[i] = nw;
            put(a->w, wdt, i, nw);
        } else if (a->stochastic) {
            /* Value rng_offset + i of the stream: one Philox block serves four. */
            uint64_t idx = a->rng_offset + (uint64_t)i;
            if (i == i0 || idx % 4 == 0)
                llmt_rng_block(a->seed, LLMT_STREAM_ROUNDING, idx / 4, block);
            ((uint16_t *)a->w)[i] = bf16_stochastic(nw, block[idx % 4]);
        } else {
            put(a->w, wdt, i, nw);
        }
    }
}

LLMT_CLONES static void adamw_f32(const llmt_adamw_args *a, int64_t i0, int64_t i1)
{
    adamw_band_t(a, i0, i1, LLMT_DTYPE_F32, LLMT_DTYPE_F32);
}
LLMT_CLONES static void adamw_bf16_master(const llmt_adamw_args *a, int64_t i0, int64_t i1)
{
    adamw_band_t(a, i0, i1, LLMT_DTYPE_BF16, LLMT_DTYPE_F32);
}
LLMT_CLONES static void adamw_f16_master(const llmt_adamw_args *a, int64_t i0, int64_t i1)
{
    adamw_band_t(a, i0, i1, LLMT_DTYPE_F16, LLMT_DTYPE_F32);
}
LLMT_CLONES static void adamw_bf16_pure(const llmt_adamw_args *a, int64_t i0, int64_t i1)
{
    adamw_band_t(a, i0, i1, LLMT_DTYPE_BF16, LLMT_DTYPE_BF16);
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
