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
    LLMT_STREAM_ROUNDING = 3  /* stochastic rounding of BF16_PURE updates */
};

/* One Philox4x32-10 block. */
void llmt_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

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
