/* The CPU backend's GEMM (cpu_gemm.c: oneDNN) in fp32 and bf16 against
 * OpenBLAS's sgemm with its own threading, on the linear layers of the
 * benchmark model (M = 2048 tokens; forward, data-gradient and
 * weight-gradient products), all in one process, interleaved.
 *
 * Usage: bench_gemm [threads] */
#include <cblas.h>
#include <stdio.h>

#include "bench_util.h"
#include "ops/cpu/cpu_backend.h"

typedef struct shape {
    const char *name;
    int k, n; /* a linear layer from k to n features */
} shape;

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 2;
    const int M = 2048;
    const shape shapes[] = {{"qkv", 512, 1536}, {"o", 512, 512}, {"gate_up", 512, 2816},
                            {"down", 1408, 512}, {"lm_head", 512, 8192}};
    llmt_device *dev = NULL;
    if (llmt_cpu_backend_create(threads, &dev))
        return 1;
    float *x = malloc(sizeof(float) * (size_t)M * 8192), *w = malloc(sizeof(float) * 8192 * 2816),
          *y = malloc(sizeof(float) * (size_t)M * 8192);
    for (size_t i = 0; i < (size_t)M * 8192; i++)
        x[i] = y[i] = (float)(i % 13) * 0.01f;
    for (size_t i = 0; i < (size_t)8192 * 2816; i++)
        w[i] = (float)(i % 7) * 0.01f;
    /* bf16 copies of the operands, and scratch for a widened bf16 product */
    uint16_t *xh = malloc(2 * (size_t)M * 8192), *wh = malloc(2 * (size_t)8192 * 2816),
             *yh = malloc(2 * (size_t)M * 8192);
    llmt_cpu_cast(dev, xh, LLMT_DTYPE_BF16, x, LLMT_DTYPE_F32, (int64_t)M * 8192);
    llmt_cpu_cast(dev, yh, LLMT_DTYPE_BF16, y, LLMT_DTYPE_F32, (int64_t)M * 8192);
    llmt_cpu_cast(dev, wh, LLMT_DTYPE_BF16, w, LLMT_DTYPE_F32, (int64_t)8192 * 2816);
    float *scratch = malloc(sizeof(float) * ((size_t)M * 512 + 8192 * 512 + (size_t)M * 8192));
    const char *kinds[3] = {"Y = X W^T", "dX = dY W", "dW += dY^T X"};
    double total_flops = 0, t[3] = {0, 0, 0};
    printf("%-8s %-13s %10s %10s %13s\n", "layer", "product", "f32 GF/s", "bf16 GF/s",
           "openblas GF/s");
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int K = shapes[s].k, N = shapes[s].n;
        for (int v = 0; v < 3; v++) {
            double best[3] = {1e30, 1e30, 1e30};
            for (int r = 0; r < 6; r++) {
                for (int which = 0; which < 3; which++) {
                    const int dt = which == 1 ? LLMT_DTYPE_BF16 : LLMT_DTYPE_F32;
                    void *X = which == 1 ? (void *)xh : x, *W = which == 1 ? (void *)wh : w,
                         *Y = which == 1 ? (void *)yh : y;
                    openblas_set_num_threads(which == 2 ? threads : 1);
                    double t0 = bench_now();
                    if (which < 2) {
                        if (v == 0) llmt_cpu_gemm(dev, 0, 1, M, N, K, 1, X, K, W, K, 0, Y, N, dt, scratch);
                        if (v == 1) llmt_cpu_gemm(dev, 0, 0, M, K, N, 1, Y, N, W, K, 0, X, K, dt, scratch);
                        if (v == 2) llmt_cpu_gemm(dev, 1, 0, N, K, M, 1, Y, N, X, K, 1, W, K, dt, scratch);
                    } else {
                        if (v == 0) cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1, x, K, w, K, 0, y, N);
                        if (v == 1) cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, K, N, 1, y, N, w, K, 0, x, K);
                        if (v == 2) cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, N, K, M, 1, y, N, x, K, 1, w, K);
                    }
                    t0 = bench_now() - t0;
                    if (r > 0 && t0 < best[which]) /* run 0 warms up */
                        best[which] = t0;
                }
            }
            double flops = 2.0 * M * (double)N * K;
            printf("%-8s %-13s %10.1f %10.1f %13.1f\n", shapes[s].name, kinds[v],
                   flops / best[0] / 1e9, flops / best[1] / 1e9, flops / best[2] / 1e9);
            total_flops += flops;
            for (int i = 0; i < 3; i++)
                t[i] += best[i];
        }
    }
    openblas_set_num_threads(1);
    printf("all: f32 %.1f GF/s, bf16 %.1f GF/s (%s), openblas threaded %.1f GF/s (%d threads, core %s)\n",
           total_flops / t[0] / 1e9, total_flops / t[1] / 1e9,
           llmt_cpu_gemm_native(dev, LLMT_DTYPE_BF16) ? "native" : "widened",
           total_flops / t[2] / 1e9, threads, openblas_get_corename());
    free(xh);
    free(wh);
    free(yh);
    free(scratch);
    dev->ops->destroy(dev);
    free(x);
    free(w);
    free(y);
    return 0;
}
