/* GEMM with cuBLASLt: fp32, bf16 and fp16 operands, fp32 accumulation
 * (CUBLAS_COMPUTE_32F; for fp32 operands that is true fp32, no TF32), a
 * 16-bit result rounded once (no split-K that adds parts in 16 bits).
 *
 * cuBLASLt is column-major. A row-major matrix X with leading dimension ld
 * is the column-major X^T with the same ld, so the row-major product
 *   C[m,n] = op(A) op(B)   is computed as the column-major   C^T[n,m] = op(B)^T op(A)^T,
 * i.e. cuBLASLt's "A" is our B (transposed iff trans_b) and its "B" is our A
 * (transposed iff trans_a), with M = n, N = m. beta = 1 accumulates into the
 * existing C (weight gradients). gemm_cd passes a separate output D
 * (cuBLASLt's C != D): the residual add x + att Wo^T is read from x and
 * written to xmid in the product's epilogue, with no copy of x beforehand.
 *
 * The algorithm comes from cuBLASLt's heuristic, asked once per shape and
 * remembered; the heuristic is told the real alignment of each pointer
 * (its default assumes 256 bytes, which a pointer into the middle of a qkv
 * row does not have). cuBLASLt gives the same bits for the same algorithm,
 * shapes and GPU, so the step stays deterministic. */
#include <string.h>

#include "cuda_kernels.cuh"
#include "ops/gemm_cd_check.h"

static cudaDataType_t cuda_type(int dt)
{
    return dt == LLMT_DTYPE_BF16 ? CUDA_R_16BF : dt == LLMT_DTYPE_F16 ? CUDA_R_16F : CUDA_R_32F;
}

/* Largest power of two, up to 256, that divides the address. */
static uint32_t alignment_of(const void *p)
{
    uintptr_t u = (uintptr_t)p;
    uint32_t a = 256;
    while (a > 1 && u % a)
        a >>= 1;
    return a;
}

/* D = beta C over an m x n block (a product with k = 0), C not read when
 * beta is 0: rows on the grid's y, columns on x, no division. */
template <typename T>
__global__ void scale_kernel(T *d, int64_t ldd, const T *c, int64_t ldc, int64_t m, int64_t n,
                             float beta)
{
    for (int64_t r = blockIdx.y; r < m; r += gridDim.y)
        for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < n;
             j += (int64_t)gridDim.x * blockDim.x)
            d[r * ldd + j] = from_f32<T>(beta == 0.0f ? 0.0f : beta * to_f32(c[r * ldc + j]));
}

/* Descriptors of one call, released on every path. */
struct lt_call {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr, ld = nullptr;
    cublasLtMatmulPreference_t pref = nullptr;
    ~lt_call()
    {
        if (pref)
            cublasLtMatmulPreferenceDestroy(pref);
        if (ld)
            cublasLtMatrixLayoutDestroy(ld);
        if (lc)
            cublasLtMatrixLayoutDestroy(lc);
        if (lb)
            cublasLtMatrixLayoutDestroy(lb);
        if (la)
            cublasLtMatrixLayoutDestroy(la);
        if (desc)
            cublasLtMatmulDescDestroy(desc);
    }
};

int llmt_cuda_matmul_cd(llmt_device *dev, const char *op, int trans_a, int trans_b, int64_t m,
                        int64_t n, int64_t k, float alpha, const void *a, int64_t lda,
                        const void *b, int64_t ldb, int ab_dt, float beta, const void *c,
                        int64_t ldc, void *d, int64_t ldd, int c_dt, void *scratch)
{
    llmt_cuda_backend *cb = llmt_cuda(dev);
    LLMT_CUDA_CHECK_DT(dev, ab_dt, op);
    LLMT_CUDA_CHECK_DT(dev, c_dt, op);
    if (m <= 0 || n <= 0)
        return LLMT_OK;
    char why[96];
    if (llmt_gemm_cd_refused(why, sizeof why, beta, c, ldc, d, ldd, m, n, llmt_cuda_dt_size(c_dt)))
        return cb->host->fail(LLMT_EINVAL, "CUDA %s: %s", op, why);
    if (k <= 0) {
        const dim3 grid(llmt_cuda_blocks(n, 256), (unsigned)(m < 65535 ? m : 65535));
        LLMT_CUDA_DISPATCH(c_dt, T,
                           LLMT_LAUNCH(grid, 256, cb->stream, scale_kernel<T>)(
                               (T *)d, ldd, (const T *)c, ldc, m, n, beta));
        LLMT_CUDA_LAUNCHED(dev, op);
        return LLMT_OK;
    }
    if (beta == 0.0f)
        c = d; /* not read: D's own layout and alignment serve for C */
    const bool in_place = c == d;
    void *workspace = scratch ? llmt_cuda_align_ptr(scratch) : NULL;
    uint64_t ws_bytes = scratch ? LLMT_CUDA_GEMM_WORKSPACE : 0;

    /* cuBLASLt's A is our B, its B our A (see the top of the file). */
    const cublasOperation_t op_a = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_b = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    lt_call call;
    LLMT_CUBLAS_CHECK(dev, cublasLtMatmulDescCreate(&call.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
                      op);
    LLMT_CUBLAS_CHECK(dev, cublasLtMatmulDescSetAttribute(call.desc, CUBLASLT_MATMUL_DESC_TRANSA,
                                                          &op_a, sizeof op_a), op);
    LLMT_CUBLAS_CHECK(dev, cublasLtMatmulDescSetAttribute(call.desc, CUBLASLT_MATMUL_DESC_TRANSB,
                                                          &op_b, sizeof op_b), op);
    /* Stored (pre-op) shapes, column-major: rows x cols with leading dimension ld. */
    LLMT_CUBLAS_CHECK(dev, cublasLtMatrixLayoutCreate(&call.la, cuda_type(ab_dt),
                                                      (uint64_t)(trans_b ? k : n),
                                                      (uint64_t)(trans_b ? n : k), ldb), op);
    LLMT_CUBLAS_CHECK(dev, cublasLtMatrixLayoutCreate(&call.lb, cuda_type(ab_dt),
                                                      (uint64_t)(trans_a ? m : k),
                                                      (uint64_t)(trans_a ? k : m), lda), op);
    LLMT_CUBLAS_CHECK(dev, cublasLtMatrixLayoutCreate(&call.lc, cuda_type(c_dt), (uint64_t)n,
                                                      (uint64_t)m, in_place ? ldd : ldc), op);
    if (!in_place)
        LLMT_CUBLAS_CHECK(dev, cublasLtMatrixLayoutCreate(&call.ld, cuda_type(c_dt), (uint64_t)n,
                                                          (uint64_t)m, ldd), op);
    const cublasLtMatrixLayout_t layout_d = in_place ? call.lc : call.ld;

    llmt_cuda_gemm_key key;
    memset(&key, 0, sizeof key);
    key.m = m, key.n = n, key.k = k, key.lda = lda, key.ldb = ldb;
    key.ldc = in_place ? ldd : ldc, key.ldd = ldd;
    key.trans_a = trans_a != 0, key.trans_b = trans_b != 0, key.ab_dt = ab_dt, key.c_dt = c_dt;
    key.align_a = alignment_of(a), key.align_b = alignment_of(b), key.align_c = alignment_of(c);
    key.align_d = alignment_of(d);
    key.pad = scratch != NULL;
    const cublasLtMatmulAlgo_t *algo = NULL;
    for (int i = 0; i < cb->gemm_cached && !algo; i++)
        if (memcmp(&cb->gemm_cache[i].key, &key, sizeof key) == 0)
            algo = &cb->gemm_cache[i].algo;
    if (!algo) {
        LLMT_CUBLAS_CHECK(dev, cublasLtMatmulPreferenceCreate(&call.pref), op);
        LLMT_CUBLAS_CHECK(dev, cublasLtMatmulPreferenceSetAttribute(
                                   call.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                   sizeof ws_bytes), op);
        /* Our A is cuBLASLt's B and the other way round. */
        const cublasLtMatmulPreferenceAttributes_t attrs[4] = {
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
        const uint32_t aligns[4] = {key.align_b, key.align_a, key.align_c, key.align_d};
        for (int i = 0; i < 4; i++)
            LLMT_CUBLAS_CHECK(dev, cublasLtMatmulPreferenceSetAttribute(call.pref, attrs[i],
                                                                        &aligns[i],
                                                                        sizeof aligns[i]), op);
        /* A product split over k keeps its parts in the output's type under
         * the INPLACE and OUTPUT_TYPE reduction schemes (cuBLAS docs,
         * cublasLtReductionScheme_t): a 16-bit result would be rounded once
         * per part. Only fp32 parts (COMPUTE_TYPE) then; algorithms that do
         * not split k (scheme NONE) pass any mask. */
        const uint32_t schemes = c_dt == LLMT_DTYPE_F32 ? CUBLASLT_REDUCTION_SCHEME_MASK
                                                         : CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
        LLMT_CUBLAS_CHECK(dev, cublasLtMatmulPreferenceSetAttribute(
                                   call.pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes,
                                   sizeof schemes), op);
        cublasLtMatmulHeuristicResult_t result;
        memset(&result, 0, sizeof result);
        int found = 0;
        LLMT_CUBLAS_CHECK(dev, cublasLtMatmulAlgoGetHeuristic(cb->lt, call.desc, call.la, call.lb,
                                                              call.lc, layout_d, call.pref, 1,
                                                              &result, &found), op);
        if (found < 1 || result.state != CUBLAS_STATUS_SUCCESS) /* each result has a state */
            return cb->host->fail(LLMT_ECUDA, "CUDA %s: cuBLASLt has no algorithm for %lld x "
                                  "%lld x %lld (%s%s, operands %s, result %s)", op,
                                  (long long)m, (long long)n, (long long)k, trans_a ? "A^T " : "A ",
                                  trans_b ? "B^T" : "B", llmt_cuda_dt_name(ab_dt),
                                  llmt_cuda_dt_name(c_dt));
        int slot = cb->gemm_next;
        cb->gemm_next = (cb->gemm_next + 1) % LLMT_CUDA_GEMM_CACHE;
        if (cb->gemm_cached < LLMT_CUDA_GEMM_CACHE)
            cb->gemm_cached++;
        cb->gemm_cache[slot].key = key;
        cb->gemm_cache[slot].algo = result.algo;
        algo = &cb->gemm_cache[slot].algo;
    }
    LLMT_CUBLAS_CHECK(dev, cublasLtMatmul(cb->lt, call.desc, &alpha, b, call.la, a, call.lb, &beta,
                                          c, call.lc, d, layout_d, algo, workspace, ws_bytes,
                                          cb->stream), op);
    return LLMT_OK;
}
