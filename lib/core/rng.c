/* Philox4x32-10 streams. */
#include <math.h>

#include "core/rng.h"

uint32_t llmt_rng_u32_at(uint64_t seed, uint64_t stream, uint64_t index)
{
    uint32_t block[4];
    llmt_rng_block(seed, stream, index / 4, block);
    return block[index % 4];
}

uint32_t llmt_rng_next_u32(llmt_rng_state *s)
{
    return llmt_rng_u32_at(s->seed, s->stream, s->offset++);
}

float llmt_rng_u32_to_uniform(uint32_t v)
{
    return (float)(v >> 8) * (1.0f / 16777216.0f);
}

void llmt_rng_fill_uniform(llmt_rng_state *s, float *out, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = llmt_rng_u32_to_uniform(llmt_rng_u32_at(s->seed, s->stream, s->offset + i));
    s->offset += n;
}

void llmt_rng_fill_normal(llmt_rng_state *s, float *out, size_t n, float mean, float std)
{
    const double two_pi = 6.283185307179586476925286766559;
    /* Each value depends only on its index: the loop may run in parallel. */
#pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; i++) {
        uint64_t pair = s->offset + 2 * (i / 2);
        /* u1 in (0, 1] keeps the logarithm finite. */
        double u1 = ((double)llmt_rng_u32_at(s->seed, s->stream, pair) + 1.0) / 4294967296.0;
        double u2 = (double)llmt_rng_u32_at(s->seed, s->stream, pair + 1) / 4294967296.0;
        double radius = sqrt(-2.0 * log(u1));
        double z = (i % 2 == 0) ? radius * cos(two_pi * u2) : radius * sin(two_pi * u2);
        out[i] = (float)(mean + std * z);
    }
    s->offset += 2 * ((n + 1) / 2);
}

uint64_t llmt_rng_next_below(llmt_rng_state *s, uint64_t bound)
{
    /* Rejection sampling on 64-bit values: reject the top partial range. */
    uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
    for (;;) {
        uint64_t hi = llmt_rng_next_u32(s);
        uint64_t v = (hi << 32) | llmt_rng_next_u32(s);
        if (v < limit)
            return v % bound;
    }
}
