/* The argument checks of gemm_cd (lib/ops/ops.h), shared by the CPU backend,
 * the CUDA plugin and the CUDA emulator's GEMM so that all three refuse the
 * same calls with the same words. Header-only: C and C++. */
#ifndef LLMT_OPS_GEMM_CD_CHECK_H
#define LLMT_OPS_GEMM_CD_CHECK_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* 0 when D = alpha op(A) op(B) + beta C over an m x n block (m, n > 0) of
 * es-byte elements may run; else 1 with the reason in why[0..cap): D is C
 * with another leading dimension, C NULL with a nonzero beta, or D's span
 * (first to last element) intersecting C's without being C. */
static inline int llmt_gemm_cd_refused(char *why, size_t cap, float beta, const void *c,
                                       int64_t ldc, const void *d, int64_t ldd, int64_t m,
                                       int64_t n, size_t es)
{
    if (c == d) {
        if (ldc == ldd)
            return 0;
        snprintf(why, cap, "d is c but ldd = %lld differs from ldc = %lld", (long long)ldd,
                 (long long)ldc);
        return 1;
    }
    if (beta == 0.0f)
        return 0; /* C is not read */
    if (!c) {
        snprintf(why, cap, "c is NULL with beta = %g", (double)beta);
        return 1;
    }
    const uintptr_t c0 = (uintptr_t)c, d0 = (uintptr_t)d;
    const uintptr_t c1 = c0 + (uintptr_t)((m - 1) * ldc + n) * es;
    const uintptr_t d1 = d0 + (uintptr_t)((m - 1) * ldd + n) * es;
    if (c0 < d1 && d0 < c1) {
        snprintf(why, cap, "d overlaps c without being c");
        return 1;
    }
    return 0;
}

#endif
