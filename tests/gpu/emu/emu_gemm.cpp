/* The emulator's stand-in for cuda_gemm.cu (cuBLASLt cannot run without a
 * GPU): the same contract, row-major D = alpha op(A) op(B) + beta C with
 * fp32 accumulation over k in order, C read only and not at all when beta
 * is 0, D == C or a separate output, as a plain loop. It checks the
 * arguments cuBLASLt would reject, and refuses what cuda_gemm.cu refuses. */
#include "cuda_emu.h"

#include <stdio.h>
#include <stdlib.h>

#include "../../../cuda/cuda_backend.h"
#include "core/half.h"
#include "ops/gemm_cd_check.h"

static float get(const void *p, int dt, int64_t i)
{
    if (dt == LLMT_DTYPE_BF16)
        return llmt_bf16_to_f32(((const uint16_t *)p)[i]);
    if (dt == LLMT_DTYPE_F16)
        return llmt_f16_to_f32(((const uint16_t *)p)[i]);
    return ((const float *)p)[i];
}

static void put(void *p, int dt, int64_t i, float v)
{
    if (dt == LLMT_DTYPE_BF16)
        ((uint16_t *)p)[i] = llmt_f32_to_bf16(v);
    else if (dt == LLMT_DTYPE_F16)
        ((uint16_t *)p)[i] = llmt_f32_to_f16(v);
    else
        ((float *)p)[i] = v;
}

int llmt_cuda_matmul_cd(llmt_device *dev, const char *op, int trans_a, int trans_b, int64_t m,
                        int64_t n, int64_t k, float alpha, const void *a, int64_t lda,
                        const void *b, int64_t ldb, int ab_dt, float beta, const void *c,
                        int64_t ldc, void *d, int64_t ldd, int c_dt, void *scratch)
{
    (void)scratch;
    llmt_cuda_backend *cb = llmt_cuda(dev);
    LLMT_CUDA_CHECK_DT(dev, ab_dt, op);
    LLMT_CUDA_CHECK_DT(dev, c_dt, op);
    if (m <= 0 || n <= 0)
        return LLMT_OK;
    char why[96];
    if (llmt_gemm_cd_refused(why, sizeof why, beta, c, ldc, d, ldd, m, n, llmt_cuda_dt_size(c_dt)))
        return cb->host->fail(LLMT_EINVAL, "CUDA %s: %s", op, why);
    /* cuBLASLt's limits on the leading dimensions of the stored matrices. */
    if (lda < (trans_a ? m : k) || ldb < (trans_b ? k : n) ||
        (beta != 0.0f && ldc < n) || ldd < n) {
        fprintf(stderr, "emulated %s: bad leading dimension (lda %lld ldb %lld ldc %lld ldd %lld "
                "for m %lld n %lld k %lld, trans %d %d)\n", op, (long long)lda, (long long)ldb,
                (long long)ldc, (long long)ldd, (long long)m, (long long)n, (long long)k,
                trans_a, trans_b);
        abort();
    }
    /* op(A) as [m, k] and op(B)^T as [n, k], fp32, so each dot product
     * runs over contiguous memory. */
    float *ak = (float *)malloc((size_t)(m * k) * sizeof(float) + 4);
    float *bk = (float *)malloc((size_t)(n * k) * sizeof(float) + 4);
    for (int64_t i = 0; i < m; i++)
        for (int64_t p = 0; p < k; p++)
            ak[i * k + p] = get(a, ab_dt, trans_a ? p * lda + i : i * lda + p);
    for (int64_t j = 0; j < n; j++)
        for (int64_t p = 0; p < k; p++)
            bk[j * k + p] = get(b, ab_dt, trans_b ? j * ldb + p : p * ldb + j);
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            const float *x = ak + i * k, *y = bk + j * k;
            float acc = 0.0f;
            for (int64_t p = 0; p < k; p++)
                acc += x[p] * y[p];
            float v = alpha * acc;
            if (beta != 0.0f)
                v += beta * get(c, c_dt, i * ldc + j);
            put(d, c_dt, i * ldd + j, v);
        }
    free(ak);
    free(bk);
    return LLMT_OK;
}
