/* A test-local random generator (xorshift64*), independent of the library's. */
#ifndef LLMT_TEST_RAND_H
#define LLMT_TEST_RAND_H

#include <math.h>
#include <stdint.h>

static inline uint64_t trand_u64(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545F4914F6CDD1DULL;
}

/* Uniform in [0, 1). */
static inline double trand_uniform(uint64_t *s)
{
    return (double)(trand_u64(s) >> 11) * 0x1p-53;
}

static inline double trand_normal(uint64_t *s)
{
    double u1 = trand_uniform(s) + 0x1p-60, u2 = trand_uniform(s);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

#endif
