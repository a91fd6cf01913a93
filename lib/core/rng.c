/* Philox4x32-10 streams. */
#include <math.h>

#include "core/rng.h"

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

void llmt_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4])
{
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int round = 0; round < 10; round++) {
        uint64_t p0 = (uint64_t)PHILOX_M0 * c0;
        uint64_t p1 = (uint64_t)PHILOX_M1 * c2;
        uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

static void stream_block(uint64_t seed, uint64_t stream, uint64_t block, uint32_t out[4])
{
    const uint32_t ctr[4] = {(uint32_t)block, (uint32_t)(block >> 32), (uint32_t)stream,
                             (uint32_t)(stream >> 32)};
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    llmt_philox4x32_10(ctr, key, out);
}

uint32_t llmt_rng_u32_at(uint64_t seed, uint64_t stream, uint64_t index)
{
    uint32_t block[4];
    stream_block(seed, stream, index / 4, block);
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
