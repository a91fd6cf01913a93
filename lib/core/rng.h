/* Counter-based random numbers (Philox4x32-10, Salmon et al. 2011).
 *
 * A stream is (seed, stream id); value number i of a stream is a pure function
 * of (seed, stream, i), so a position is saved as one integer and draws can be
 * made in parallel. Counter layout: ctr = {block lo, block hi, stream lo,
 * stream hi} with block = i / 4; key = {seed lo, seed hi}; lane = i % 4. */
#ifndef LLMT_CORE_RNG_H
#define LLMT_CORE_RNG_H

#include <stddef.h>
#include <stdint.h>

#include "llmt/context.h"

/* Well-known stream ids, one per consumer, so draws of one never shift another's. */
enum {
    LLMT_STREAM_ROOT = 0,
    LLMT_STREAM_INIT = 1,     /* parameter initialisation */
    LLMT_STREAM_DATA = 2,     /* data shuffling */
    LLMT_STREAM_ROUNDING = 3, /* stochastic rounding of BF16_PURE updates */
    LLMT_STREAM_SAMPLING = 4  /* token sampling of llmt_generator (include/llmt/generate.h) */
};

/* One Philox4x32-10 block; inline so kernels drawing per element vectorise. */
static inline void llmt_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2],
                                      uint32_t out[4])
{
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int round = 0; round < 10; round++) {
        uint64_t p0 = (uint64_t)0xD2511F53u * c0;
        uint64_t p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

/* Block number `block` of stream (seed, stream): values 4 block .. 4 block + 3. */
static inline void llmt_rng_block(uint64_t seed, uint64_t stream, uint64_t block, uint32_t out[4])
{
    const uint32_t ctr[4] = {(uint32_t)block, (uint32_t)(block >> 32), (uint32_t)stream,
                             (uint32_t)(stream >> 32)};
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    llmt_philox4x32_10(ctr, key, out);
}

/* Value number index of stream (seed, stream). */
uint32_t llmt_rng_u32_at(uint64_t seed, uint64_t stream, uint64_t index);

/* Next value of the stream; advances offset by one. */
uint32_t llmt_rng_next_u32(llmt_rng_state *s);

/* Uniform float in [0, 1) with 24 random bits from one value. */
float llmt_rng_u32_to_uniform(uint32_t v);

/* n uniforms in [0, 1); advances offset by n. */
void llmt_rng_fill_uniform(llmt_rng_state *s, float *out, size_t n);

/* n normals N(mean, std^2) by Box-Muller: pair p = i / 2 uses values
 * offset + 2p and offset + 2p + 1, even i takes the cosine, odd i the sine.
 * Advances offset by 2 * ceil(n / 2). */
void llmt_rng_fill_normal(llmt_rng_state *s, float *out, size_t n, float mean, float std);

/* Uniform integer in [0, bound) without modulo bias; bound > 0. */
uint64_t llmt_rng_next_below(llmt_rng_state *s, uint64_t bound);

#endif
