/* The machine's own sgemm rate, measured in the benchmark's process: OpenBLAS
 * on 2048^3 with the given thread count, best of `reps`. */
#ifndef LLMT_BENCH_SGEMM_H
#define LLMT_BENCH_SGEMM_H

#include <cblas.h>

#include "bench_util.h"

static inline double bench_sgemm_gflops(int threads, int reps)
{
    const int n = 2048;
    float *a = malloc(sizeof(float) * n * n), *b = malloc(sizeof(float) * n * n),
          *c = malloc(sizeof(float) * n * n);
    for (long i = 0; i < (long)n * n; i++) {
        a[i] = (float)(i % 7) * 0.1f;
        b[i] = (float)(i % 5) * 0.1f;
    }
    int before = openblas_get_num_threads();
    openblas_set_num_threads(threads);
    double best = 1e30;
    for (int r = 0; r < reps + 2; r++) { /* the first two runs warm up */
        double t = bench_now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f,
                    c, n);
        t = bench_now() - t;
        if (r > 1 && t < best)
            best = t;
    }
    openblas_set_num_threads(before);
    free(a);
    free(b);
    free(c);
    return 2.0 * n * n * (double)n / best / 1e9;
}

#endif
