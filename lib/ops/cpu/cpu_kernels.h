/* Shared pieces of the CPU kernels: per-ISA clones, element load/store for
 * each storage dtype, a vectorisable exp, and row partitioning. */
#ifndef LLMT_OPS_CPU_KERNELS_H
#define LLMT_OPS_CPU_KERNELS_H

#include <math.h>
#include <stdint.h>

#include "llmt/common.h"
#include "core/half.h"
#include "ops/ops.h"

/* Hot row kernels are compiled for the baseline, AVX2 and AVX-512; the
 * loader picks the best the CPU has, once, so results stay deterministic on
 * a given machine. */
#define LLMT_CLONES __attribute__((target_clones("default", "arch=x86-64-v3", "arch=x86-64-v4")))
#define LLMT_INLINE static inline __attribute__((always_inline))

/* Element i of a tensor of storage dtype dt, as fp32. With dt a constant the
 * switch folds away. */
LLMT_INLINE float get(const void *p, int dt, int64_t i)
{
    switch (dt) {
    case LLMT_DTYPE_BF16: return llmt_bf16_to_f32(((const uint16_t *)p)[i]);
    case LLMT_DTYPE_F16: return llmt_f16_to_f32(((const uint16_t *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

/* Stores v as element i, rounding to nearest even for 16-bit dtypes. */
LLMT_INLINE void put(void *p, int dt, int64_t i, float v)
{
    switch (dt) {
    case LLMT_DTYPE_BF16: ((uint16_t *)p)[i] = llmt_f32_to_bf16(v); break;
    case LLMT_DTYPE_F16: ((uint16_t *)p)[i] = llmt_f32_to_f16(v); break;
    default: ((float *)p)[i] = v; break;
    }
}

/* n fp32 values rounded to nearest even into 16-bit dtype dt (BF16 or
 * F16), one loop per dtype so that it vectorises. */
LLMT_INLINE void round_to_16bit(uint16_t *dst, const float *src, int64_t n, int dt)
{
    if (dt == LLMT_DTYPE_BF16)
        for (int64_t i = 0; i < n; i++)
            dst[i] = llmt_f32_to_bf16(src[i]);
    else
        for (int64_t i = 0; i < n; i++)
            dst[i] = llmt_f32_to_f16(src[i]);
}

/* Byte address of element i. */
LLMT_INLINE void *at(void *p, int dt, int64_t i)
{
    return (char *)p + (size_t)i * llmt_dtype_size(dt);
}

LLMT_INLINE const void *cat(const void *p, int dt, int64_t i)
{
    return (const char *)p + (size_t)i * llmt_dtype_size(dt);
}

/* exp(x) in fp32 within about 2 ulp, written so loops over it vectorise:
 * exp(x) = 2^n * e^r with n = rint(x / ln 2), |r| <= ln 2 / 2 and a Cephes
 * polynomial for e^r. Returns 0 below -87.3 (where fp32 would go subnormal)
 * and is clamped at the top (inputs here are <= 0 after max subtraction). */
LLMT_INLINE float fast_expf(float x)
{
    const float hi = 88.37626f, lo = -87.33654f;
    float xc = x > hi ? hi : x;
    xc = xc < lo ? lo : xc;
    /* Round to nearest by adding and removing 1.5 * 2^23 (no libm call, so
     * the loop vectorises). */
    const float magic = 12582912.0f;
    float n = (xc * 1.44269504088896341f + magic) - magic;
    float r = xc - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t e = (int32_t)n + 127;
    float scale = llmt_bits_f32((uint32_t)e << 23);
    return x < lo ? 0.0f : p * scale;
}

/* Largest of row[0..n), n >= 1. */
LLMT_INLINE float row_max(const float *row, int64_t n)
{
    float mx = row[0];
    for (int64_t j = 1; j < n; j++)
        mx = row[j] > mx ? row[j] : mx;
    return mx;
}

/* Sum of exp(row[j] - mx) over j < n with 16 partial sums in a fixed order
 * (so it vectorises and does not depend on the vector width); with store,
 * row[j] becomes exp(row[j] - mx). */
LLMT_INLINE float exp_sum(float *row, int64_t n, float mx, int store)
{
    float acc[16] = {0};
    int64_t j = 0;
    for (; j + 16 <= n; j += 16)
        for (int u = 0; u < 16; u++) {
            float e = fast_expf(row[j + u] - mx);
            if (store)
                row[j + u] = e;
            acc[u] += e;
        }
    for (int u = 0; j + u < n; u++) {
        float e = fast_expf(row[j + u] - mx);
        if (store)
            row[j + u] = e;
        acc[u] += e;
    }
    float sum = 0.0f;
    for (int u = 0; u < 16; u++)
        sum += acc[u];
    return sum;
}

/* Threads worth using for a loop touching `work` elements (or multiply-adds):
 * small loops run on one thread, since waking a team costs more than they
 * take, and far more when other processes hold the cores. */
#define LLMT_PAR_MIN_WORK ((int64_t)1 << 15)
LLMT_INLINE int threads_for(const llmt_device *dev, int64_t work)
{
    return work < LLMT_PAR_MIN_WORK ? 1 : dev->num_threads;
}

/* Row range [*r0, *r1) of thread t of nt over rows rows. */
LLMT_INLINE void split_rows(int64_t rows, int t, int nt, int64_t *r0, int64_t *r1)
{
    *r0 = rows * t / nt;
    *r1 = rows * (t + 1) / nt;
}

/* Instantiates NAME##_f32, NAME##_bf16 and NAME##_f16 (each cloned per ISA)
 * from the always-inline NAME##_t, whose last parameter is the dtype:
 * LLMT_DTYPE_VARIANTS(row, (float *o, int64_t n), o, n) defines row_f32(o, n)
 * calling row_t(o, n, LLMT_DTYPE_F32), and so on. */
#define LLMT_DTYPE_VARIANTS(NAME, PARAMS, ...)                                          \
    LLMT_CLONES static void NAME##_f32 PARAMS { NAME##_t(__VA_ARGS__, LLMT_DTYPE_F32); }   \
    LLMT_CLONES static void NAME##_bf16 PARAMS { NAME##_t(__VA_ARGS__, LLMT_DTYPE_BF16); } \
    LLMT_CLONES static void NAME##_f16 PARAMS { NAME##_t(__VA_ARGS__, LLMT_DTYPE_F16); }

/* The variant of NAME for dtype dt. */
#define LLMT_PICK(NAME, dt) \
    ((dt) == LLMT_DTYPE_BF16 ? NAME##_bf16 : (dt) == LLMT_DTYPE_F16 ? NAME##_f16 : NAME##_f32)

#endif
