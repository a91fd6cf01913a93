/* CPU attention of new query rows against a key/value cache (generation).
 *
 * One task per query head; a task takes the head's query rows in blocks of
 * KV_QB and, per block, makes two single-threaded oneDNN products over the
 * cache rows the block can see: scores = scale Q K^T, then out = P V. The
 * causal softmax is the training forward's (same fast_expf, same row order),
 * so cached logits differ from a full recompute only by the products' order
 * of summation. */
#include <omp.h>
#include <stdio.h>

#include "core/error.h"
#include "ops/cpu/cpu_backend.h"
#include "ops/cpu/cpu_signals.h"

#define KV_QB 64

/* Per-thread scratch floats for a cache of t rows: a [KV_QB, t] probability
 * block and, for 16-bit dtypes (F32 is read and written in place), fp32
 * copies of the head's K and V [t, hd] and of a block's Q and O (at most
 * min(KV_QB, m) <= t rows each). */
static size_t per_thread_floats(int64_t t, int64_t hd)
{
    return (size_t)(KV_QB * t + 4 * t * hd);
}

size_t llmt_cpu_attention_kv_scratch(const llmt_attn_dims *a, int num_threads)
{
    return per_thread_floats(a->seq, a->head_dim) * sizeof(float) * (size_t)num_threads;
}

/* A [rows, hd] fp32 matrix view with row stride ld. */
typedef struct kv_view {
    const float *p;
    int64_t ld;
} kv_view;

/* rows x hd of src (row stride ld, dtype dt) as fp32: src itself for F32,
 * else a copy converted into buf (stride hd). */
static kv_view load_rows(float *buf, const void *src, int64_t rows, int64_t hd, int64_t ld,
                         int dt)
{
    if (dt == LLMT_DTYPE_F32)
        return (kv_view){src, ld};
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < hd; i++)
            buf[r * hd + i] = get(src, dt, r * ld + i);
    return (kv_view){buf, hd};
}

/* Causal softmax of block rows whose first sees `first_n` cache rows; the
 * row stride is ld, and entries past a row's last visible column, up to
 * `width`, are zeroed. */
LLMT_CLONES static void softmax_cached_rows(float *p, int64_t ld, int64_t rows, int64_t first_n,
                                     int64_t width)
{
    for (int64_t r = 0; r < rows; r++) {
        float *row = p + r * ld;
        int64_t n = first_n + r;
        float inv = 1.0f / exp_sum(row, n, row_max(row, n), 1);
        for (int64_t k = 0; k < n; k++)
            row[k] *= inv;
        for (int64_t k = n; k < width; k++)
            row[k] = 0.0f;
    }
}

/* One head's query rows [i0, i1) (of m), against the first past + i1 cache
 * rows, into o (row stride ldo). */
static int head_block(llmt_device *dev, float *p, kv_view q, kv_view k, kv_view v, float *o,
                      int64_t ldo, int64_t t, int64_t past, int64_t i0, int64_t i1, int64_t hd,
                      float scale)
{
    int64_t rows = i1 - i0, width = past + i1;
    LLMT_TRY(llmt_cpu_sgemm_serial(dev, 0, 1, rows, width, hd, scale, q.p, q.ld, k.p, k.ld, 0.0f,
                                   p, t));
    softmax_cached_rows(p, t, rows, past + i0 + 1, width);
    return llmt_cpu_sgemm_serial(dev, 0, 0, rows, hd, width, 1.0f, p, t, v.p, v.ld, 0.0f, o, ldo);
}

int llmt_cpu_attention_kv_fwd(llmt_device *dev, void *out, const void *q, const void *kv,
                              int64_t m, const llmt_attn_dims *a, int dt, void *scratch)
{
    const int64_t t = a->seq, hd = a->head_dim, H = a->heads, KV = a->kv_heads;
    const int64_t past = t - m, ld_kv = 2 * KV * hd, group = H / KV;
    const float scale = 1.0f / sqrtf((float)hd);
    int failed = LLMT_OK;
    char message[512] = "";
#pragma omp parallel num_threads(threads_for(dev, H * m * t * hd / 64))
    {
        llmt_cpu_signals_hold(); /* many products: once for them all */
        float *pblk = (float *)scratch + per_thread_floats(t, hd) * (size_t)omp_get_thread_num();
        float *ck = pblk + KV_QB * t, *cv = ck + t * hd, *cq = cv + t * hd, *co = cq + t * hd;
#pragma omp for schedule(static)
        for (int64_t h = 0; h < H; h++) {
            int64_t g = h / group;
            kv_view k = load_rows(ck, cat(kv, dt, g * hd), t, hd, ld_kv, dt);
            kv_view v = load_rows(cv, cat(kv, dt, (KV + g) * hd), t, hd, ld_kv, dt);
            for (int64_t i0 = 0; i0 < m; i0 += KV_QB) {
                int64_t i1 = i0 + KV_QB < m ? i0 + KV_QB : m;
                const int64_t row0 = i0 * H * hd + h * hd;
                kv_view qb = load_rows(cq, cat(q, dt, row0), i1 - i0, hd, H * hd, dt);
                /* F32 writes its rows in place; 16-bit dtypes through co. */
                float *o = dt == LLMT_DTYPE_F32 ? (float *)out + row0 : co;
                int64_t ldo = dt == LLMT_DTYPE_F32 ? H * hd : hd;
                int rc = head_block(dev, pblk, qb, k, v, o, ldo, t, past, i0, i1, hd, scale);
                if (rc != LLMT_OK) {
#pragma omp critical(llmt_attention_kv_failure)
                    if (failed == LLMT_OK) {
                        failed = rc;
                        snprintf(message, sizeof message, "%s", llmt_error_last());
                    }
                    continue;
                }
                if (dt != LLMT_DTYPE_F32)
                    for (int64_t r = 0; r < i1 - i0; r++)
                        for (int64_t i = 0; i < hd; i++)
                            put(out, dt, row0 + r * H * hd + i, co[r * hd + i]);
            }
        }
        llmt_cpu_signals_release();
    }
    return failed == LLMT_OK ? LLMT_OK : llmt_fail(failed, "cpu attention (kv cache): %s", message);
}
