/* CPU GEMM: dispatch between the CPU's own instructions for the storage
 * dtype and widening to fp32 (docs/cpu.md).
 *
 * - fp32, and bf16 where the CPU has AVX512_BF16 or AMX: one oneDNN matmul
 *   on the operands as stored, accumulated in fp32, bf16 results rounded to
 *   nearest even (cpu_gemm_onednn.c).
 * - Otherwise (bf16 without those instructions, fp16 always with Debian's
 *   oneDNN 2.6): the operands are converted to fp32 in scratch, multiplied
 *   by the fp32 path and the result rounded back to nearest even.
 * The choice is made once per device (llmt_cpu_backend_create), so a run
 * never mixes the two. */
#include <omp.h>
#include <string.h>

#include "core/error.h"
#include "ops/gemm_cd_check.h"
#include "ops/cpu/cpu_backend.h"

/* fp32 scratch elements of a widened 16-bit GEMM: A, B and C converted. */
static size_t gemm_floats(int64_t m, int64_t n, int64_t k)
{
    return (size_t)(m * k + n * k + m * n);
}

/* Sized for the widened path whatever the CPU, so that a model's memory plan
 * does not depend on the machine it is made on. */
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

int llmt_cpu_gemm_native(const llmt_device *dev, int dt)
{
    const llmt_cpu_device *cpu = (const llmt_cpu_device *)dev;
    return dt >= 0 && dt < 3 && cpu->gemm_native[dt];
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

/* C = beta C over an m x n matrix of row stride ldc, stored as dt. */
static void scale_c(llmt_device *dev, void *c, int64_t m, int64_t n, int64_t ldc, float beta,
                    int dt)
{
#pragma omp parallel for schedule(static) num_threads(threads_for(dev, m * n))
    for (int64_t r = 0; r < m; r++)
        for (int64_t i = 0; i < n; i++)
            put(c, dt, r * ldc + i, beta == 0.0f ? 0.0f : beta * get(c, dt, r * ldc + i));
}

int llmt_cpu_gemm(llmt_device *dev, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                  float alpha, const void *a, int64_t lda, const void *b, int64_t ldb, float beta,
                  void *c, int64_t ldc, int dt, void *scratch)
{
    if (m <= 0 || n <= 0)
        return LLMT_OK;
    if (k <= 0) { /* C = beta C (oneDNN divides by k); beta 0 overwrites NaNs too */
        scale_c(dev, c, m, n, ldc, beta, dt);
        return LLMT_OK;
    }
    llmt_onednn *onednn = ((llmt_cpu_device *)dev)->onednn;
    /* Products under 2^21 multiply-adds run on one thread: waking a team
     * costs more than they take. */
    const int nt = threads_for(dev, m * n * k / 64);
    if (llmt_cpu_gemm_native(dev, dt))
        return llmt_onednn_gemm(onednn, nt, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb,
                                beta, c, ldc, dt, dt);
    if (!scratch)
        return llmt_fail(LLMT_EINVAL, "cpu gemm: a %s product needs scratch", llmt_dtype_name(dt));
    float *af = scratch, *bf = af + m * k, *cf = bf + n * k;
    to_f32(dev, af, a, trans_a ? k : m, trans_a ? m : k, lda, dt);
    to_f32(dev, bf, b, trans_b ? n : k, trans_b ? k : n, ldb, dt);
    if (beta != 0.0f)
        to_f32(dev, cf, c, m, n, ldc, dt);
    LLMT_TRY(llmt_onednn_gemm(onednn, nt, trans_a, trans_b, m, n, k, alpha, af, trans_a ? m : k,
                              bf, trans_b ? k : n, beta, cf, n, LLMT_DTYPE_F32, LLMT_DTYPE_F32));
    from_f32(dev, c, cf, m, n, ldc, dt);
    return LLMT_OK;
}

int llmt_cpu_gemm_cd(llmt_device *dev, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                     float alpha, const void *a, int64_t lda, const void *b, int64_t ldb,
                     float beta, const void *c, int64_t ldc, void *d, int64_t ldd, int dt,
                     void *scratch)
{
    if (m <= 0 || n <= 0)
        return LLMT_OK;
    const size_t es = llmt_dtype_size(dt);
    char why[96];
    if (llmt_gemm_cd_refused(why, sizeof why, beta, c, ldc, d, ldd, m, n, es))
        return llmt_fail(LLMT_EINVAL, "cpu gemm_cd: %s", why);
    if (beta != 0.0f && c != d) {
        /* Row by row: C's padding columns are not D's to write. */
#pragma omp parallel for schedule(static) num_threads(threads_for(dev, m * n))
        for (int64_t r = 0; r < m; r++)
            memcpy((char *)d + (size_t)(r * ldd) * es, (const char *)c + (size_t)(r * ldc) * es,
                   (size_t)n * es);
    }
    return llmt_cpu_gemm(dev, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, d, ldd, dt,
                         scratch);
}

int llmt_cpu_gemm_serial(llmt_device *dev, int trans_a, int trans_b, int64_t m, int64_t n,
                         int64_t k, float alpha, const void *a, int64_t lda, const void *b,
                         int64_t ldb, float beta, void *c, int64_t ldc, int dt, int c_dt)
{
    if (dt != LLMT_DTYPE_F32 && !llmt_cpu_gemm_native(dev, dt))
        return llmt_fail(LLMT_EUNSUPPORTED, "cpu gemm: no native %s product on this CPU",
                         llmt_dtype_name(dt));
    if (m <= 0 || n <= 0)
        return LLMT_OK;
    if (k <= 0) {
        scale_c(dev, c, m, n, ldc, beta, c_dt);
        return LLMT_OK;
    }
    llmt_onednn *mine = ((llmt_cpu_device *)dev)->onednn_thread[omp_get_thread_num()];
    return llmt_onednn_gemm(mine, 1, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c,
                            ldc, dt, c_dt);
}

int llmt_cpu_sgemm_serial(llmt_device *dev, int trans_a, int trans_b, int64_t m, int64_t n,
                          int64_t k, float alpha, const float *a, int64_t lda, const float *b,
                          int64_t ldb, float beta, float *c, int64_t ldc)
{
    return llmt_cpu_gemm_serial(dev, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c,
                                ldc, LLMT_DTYPE_F32, LLMT_DTYPE_F32);
}

int llmt_cpu_gemm_to_f32(llmt_device *dev, int trans_a, int trans_b, int64_t m, int64_t n,
                         int64_t k, float alpha, const void *a, int64_t lda, const void *b,
                         int64_t ldb, float beta, float *c, int64_t ldc, int dt)
{
    if (dt == LLMT_DTYPE_F32 || !llmt_cpu_gemm_native(dev, dt))
        return llmt_fail(LLMT_EUNSUPPORTED, "cpu gemm: no native %s product with an fp32 result",
                         llmt_dtype_name(dt));
    if (m <= 0 || n <= 0)
        return LLMT_OK;
    if (k <= 0) {
        scale_c(dev, c, m, n, ldc, beta, LLMT_DTYPE_F32);
        return LLMT_OK;
    }
    return llmt_onednn_gemm(((llmt_cpu_device *)dev)->onednn, threads_for(dev, m * n * k / 64),
                            trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, dt,
                            LLMT_DTYPE_F32);
}
