/* The CPU backend's GEMM (row bands over OpenMP threads, OpenBLAS on one
 * thread each) against OpenBLAS's own threading, on the linear layers of the
 * benchmark model (M = 2048 tokens; forward, data-gradient and
 * weight-gradient products), all in one process.
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
    const char *kinds[3] = {"Y = X W^T", "dX = dY W", "dW += dY^T X"};
    double total_flops = 0, t_ours = 0, t_blas = 0;
    printf("%-8s %-13s %12s %12s\n", "layer", "product", "ours GF/s", "openblas GF/s");
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int K = shapes[s].k, N = shapes[s].n;
        for (int v = 0; v < 3; v++) {
            double best[2] = {1e30, 1e30};
            for (int r = 0; r < 6; r++) {
                for (int which = 0; which < 2; which++) {
                    openblas_set_num_threads(which ? threads : 1);
                    double t = bench_now();
                    if (which == 0) {
                        if (v == 0) llmt_cpu_gemm(dev, 0, 1, M, N, K, 1, x, K, w, K, 0, y, N, LLMT_DTYPE_F32, NULL);
                        if (v == 1) llmt_cpu_gemm(dev, 0, 0, M, K, N, 1, y, N, w, K, 0, x, K, LLMT_DTYPE_F32, NULL);
                        if (v == 2) llmt_cpu_gemm(dev, 1, 0, N, K, M, 1, y, N, x, K, 1, w, K, LLMT_DTYPE_F32, NULL);
                    } else {
                        if (v == 0) cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1, x, K, w, K, 0, y, N);
                        if (v == 1) cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, K, N, 1, y, N, w, K, 0, x, K);
                        if (v == 2) cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, N, K, M, 1, y, N, x, K, 1, w, K);
                    }
                    t = bench_now() - t;
                    if (r > 0 && t < best[which]) /* run 0 warms up */
                        best[which] = t;
                }
            }
            double flops = 2.0 * M * (double)N * K;
            printf("%-8s %-13s %12.1f %12.1f\n", shapes[s].name, kinds[v], flops / best[0] / 1e9,
                   flops / best[1] / 1e9);
            total_flops += flops;
            t_ours += best[0];
            t_blas += best[1];
        }
    }
    openblas_set_num_threads(1);
    printf("all: ours %.1f GF/s, openblas threaded %.1f GF/s (%d threads, core %s)\n",
           total_flops / t_ours / 1e9, total_flops / t_blas / 1e9, threads, openblas_get_corename());
    dev->ops->destroy(dev);
    free(x);
    free(w);
    free(y);
    return 0;
}
