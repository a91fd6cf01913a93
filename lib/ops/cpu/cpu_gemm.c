/* CPU GEMM: OpenBLAS sgemm, one BLAS thread per OpenMP thread, each thread
 * computing a contiguous band of C's rows. On the model's shapes this beats
 * OpenBLAS's own threading (docs/PERFORMANCE.md) and keeps one thread pool,
 * and since no thread splits a reduction the result does not depend on
 * scheduling: the same thread count gives the same bits.
 *
 * 16-bit operands are converted to fp32 in scratch, multiplied, and the
 * result rounded back to nearest even: the CPU has no fast 16-bit GEMM in
 * Debian's OpenBLAS (docs/precision.md). */
#include <cblas.h>
#include <omp.h>

#include "core/error.h"
#include "ops/cpu/cpu_backend.h"

/* fp32 scratch elements of a 16-bit GEMM: A, B and C converted. */
static size_t gemm_floats(int64_t m, int64_t n, int64_t k)
{
    return (size_t)(m * k + n * k + m * n);
}

size_t llmt_cpu_gemm_scratch(const llmt_op_dims *d)
{
    if (d->dt == LLMT_DTYPE_F32)
        return 0;
    /* The model's linear layers (out, in); forward, data and weight
     * gradients of each touch the same three sizes. */
    const int64_t m = d->batch * d->seq, att = d->heads * d->head_dim;
    const int64_t shapes[4][2] = {{(d->heads + 2 * d->kv_heads) * d->head_dim, d->hidden},
                                  {d->hidden, att},
                                  {2 * d->ffn, d->hidden},
                                  {d->hidden, d->ffn}};
    size_t most = 0;
    for (int i = 0; i < 4; i++) {
        size_t f = gemm_floats(m, shapes[i][0], shapes[i][1]);
        most = f > most ? f : most;
    }
    return most * sizeof(float);
}

static void sgemm_bands(const llmt_device *dev, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                        float alpha, const float *a, int64_t lda, const float *b, int64_t ldb,
                        float beta, float *c, int64_t ldc)
{
    const CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans;
    const CBLAS_TRANSPOSE tb = trans_b ? CblasTrans : CblasNoTrans;
    /* Bands of at least 32 rows: thinner ones cost more in packing than they
     * gain; products under 2^21 multiply-adds run on one thread. */
    int64_t max_bands = m / 32 > 0 ? m / 32 : 1;
    int nt = threads_for(dev, m * n * k / 64);
    nt = nt < max_bands ? nt : (int)max_bands;
#pragma omp parallel num_threads(nt)
    {
        int64_t r0, r1;
        split_rows(m, omp_get_thread_num(), omp_get_num_threads(), &r0, &r1);
        const float *a_band = trans_a ? a + r0 : a + r0 * lda;
        if (r1 > r0)
            cblas_sgemm(CblasRowMajor, ta, tb, (blasint)(r1 - r0), (blasint)n, (blasint)k, alpha,
                        a_band, (blasint)lda, b, (blasint)ldb, beta, c + r0 * ldc, (blasint)ldc);
    }
}

/* Copies a rows x cols matrix (row stride ld, dtype dt) into packed fp32. */
static void to_f32(llmt_device *dev, float *dst, const void *src, int64_t rows, int64_t cols,
                   int64_t ld, int dt)
{
#pragma omp parallel for schedule(static) num_threads(threads_for(dev, rows * cols))
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < cols; i++)
            dst[r * cols + i] = get(src, dt, r * ld + i);
}

static void from_f32(llmt_device *dev, void *dst, const float *src, int64_t rows, int64_t cols,
                     int64_t ld, int dt)
{
#pragma omp parallel for schedule(static) num_threads(threads_for(dev, rows * cols))
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < cols; i++)
            put(dst, dt, r * ld + i, src[r * cols + i]);
}

int llmt_cpu_gemm(llmt_device *dev, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                  float alpha, const void *a, int64_t lda, const void *b, int64_t ldb, float beta,
                  void *c, int64_t ldc, int dt, void *scratch)
{
    if (m <= 0 || n <= 0)
        return LLMT_OK;
    if (dt == LLMT_DTYPE_F32) {
        sgemm_bands(dev, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c,
                    ldc);
        return LLMT_OK;
    }
    if (!scratch)
        return llmt_fail(LLMT_EINVAL, "cpu gemm: a %s product needs scratch", llmt_dtype_name(dt));
    float *af = scratch, *bf = af + m * k, *cf = bf + n * k;
    to_f32(dev, af, a, trans_a ? k : m, trans_a ? m : k, lda, dt);
    to_f32(dev, bf, b, trans_b ? n : k, trans_b ? k : n, ldb, dt);
    if (beta != 0.0f)
        to_f32(dev, cf, c, m, n, ldc, dt);
    sgemm_bands(dev, trans_a, trans_b, m, n, k, alpha, af, trans_a ? m : k, bf,
                trans_b ? k : n, beta, cf, n);
    from_f32(dev, c, cf, m, n, ldc, dt);
    return LLMT_OK;
}
