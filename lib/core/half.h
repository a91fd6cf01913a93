/* Conversions between fp32 and the 16-bit float formats, round-to-nearest-even
 * on narrowing, NaN kept NaN. Plain C that compilers vectorise. */
#ifndef LLMT_CORE_HALF_H
#define LLMT_CORE_HALF_H

#include <stdint.h>
#include <string.h>

static inline uint32_t llmt_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float llmt_bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline float llmt_bf16_to_f32(uint16_t h)
{
    return llmt_bits_f32((uint32_t)h << 16);
}

static inline uint16_t llmt_f32_to_bf16(float f)
{
    uint32_t u = llmt_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float llmt_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    if (exp == 0) /* zero or subnormal: mant * 2^-24 is exact in fp32 */
        return llmt_bits_f32(sign | llmt_f32_bits((float)mant * 0x1p-24f));
    if (exp == 31)
        return llmt_bits_f32(sign | 0x7f800000u | (mant << 13));
    return llmt_bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

/* After F. Giesen's float_to_half_fast3_rtne. */
static inline uint16_t llmt_f32_to_f16(float f)
{
    uint32_t u = llmt_f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a >= 0x47800000u) /* beyond the largest half: inf, or NaN */
        return sign | (a > 0x7f800000u ? 0x7e00u : 0x7c00u);
    if (a < 0x38800000u) { /* half subnormal or zero: let the FPU round */
        float r = llmt_bits_f32(a) + 0.5f;
        return sign | (uint16_t)(llmt_f32_bits(r) - 0x3f000000u);
    }
    uint32_t odd = (a >> 13) & 1u;
    a += 0xc8000fffu + odd; /* rebias exponent by (15 - 127) << 23, round */
    return sign | (uint16_t)(a >> 13);
}

#endif
