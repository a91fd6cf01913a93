/* The GEMM entry points of the op table and the plugin's other files, all
 * over llmt_cuda_matmul_cd: cuBLASLt's in cuda_gemm.cu on a GPU, the plain
 * loop of tests/gpu/emu/emu_gemm.cpp on the emulator (which compiles this
 * file as it is). */
#include "cuda_backend.h"

size_t llmt_cuda_gemm_scratch(void)
{
    return LLMT_CUDA_GEMM_WORKSPACE + LLMT_CUDA_ALIGN;
}

int llmt_cuda_matmul(llmt_device *dev, const char *op, int trans_a, int trans_b, int64_t m,
                     int64_t n, int64_t k, float alpha, const void *a, int64_t lda, const void *b,
                     int64_t ldb, int ab_dt, float beta, void *c, int64_t ldc, int c_dt,
                     void *scratch)
{
    return llmt_cuda_matmul_cd(dev, op, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, ab_dt,
                               beta, c, ldc, c, ldc, c_dt, scratch);
}

int llmt_cuda_gemm(llmt_device *dev, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                   float alpha, const void *a, int64_t lda, const void *b, int64_t ldb, float beta,
                   void *c, int64_t ldc, int dt, void *scratch)
{
    return llmt_cuda_matmul(dev, "gemm", trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, dt,
                            beta, c, ldc, dt, scratch);
}

int llmt_cuda_gemm_cd(llmt_device *dev, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                      float alpha, const void *a, int64_t lda, const void *b, int64_t ldb,
                      float beta, const void *c, int64_t ldc, void *d, int64_t ldd, int dt,
                      void *scratch)
{
    return llmt_cuda_matmul_cd(dev, "gemm_cd", trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb,
                               dt, beta, c, ldc, d, ldd, dt, scratch);
}
