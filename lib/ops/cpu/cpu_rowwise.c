/* CPU row-wise kernels: embedding, RMSNorm, RoPE, SwiGLU, residual add. Each
 * is a per-row function instantiated per dtype and ISA, run over row bands by
 * OpenMP with a static schedule. */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "ops/cpu/cpu_backend.h"

/* Sum of a[i] * b[i] in fp32 with 16 partial sums in a fixed order, so the
 * loop vectorises and the result does not depend on the vector width. */
LLMT_INLINE float dot_t(const void *a, const void *b, int64_t n, int dt)
{
    float acc[16] = {0};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++)
            acc[j] += get(a, dt, i + j) * get(b, dt, i + j);
    for (int j = 0; i + j < n; j++)
        acc[j] += get(a, dt, i + j) * get(b, dt, i + j);
    float s = 0.0f;
    for (int j = 0; j < 16; j++)
        s += acc[j];
    return s;
}

/* ---- embedding */

LLMT_INLINE void embed_row_t(void *out, const void *table, int64_t d, int dt)
{
    memcpy(out, table, (size_t)d * llmt_dtype_size(dt));
}

int llmt_cpu_embedding_fwd(llmt_device *dev, void *out, const void *table, const int32_t *ids,
                           int64_t m, int64_t d, int dt)
{
#pragma omp parallel for schedule(static) num_threads(threads_for(dev, m * d))
    for (int64_t i = 0; i < m; i++)
        embed_row_t(at(out, dt, i * d), cat(table, dt, (int64_t)ids[i] * d), d, dt);
    return LLMT_OK;
}

/* A token as embedding backward orders them: by id, then by position. */
typedef struct embed_token {
    int64_t pos;
    int32_t id;
} embed_token;

static int embed_token_cmp(const void *a, const void *b)
{
    const embed_token *x = a, *y = b;
    if (x->id != y->id)
        return x->id < y->id ? -1 : 1;
    return x->pos < y->pos ? -1 : x->pos > y->pos;
}

/* Columns an fp32 accumulator tile of embed_bwd_band_t holds (on the stack). */
#define EMBED_TILE 512

/* Columns [c0, c1) of every row the tokens name: the row's value widened to
 * fp32, plus its tokens' dout rows in token order in fp32, rounded to the
 * dtype once. order: the m tokens sorted by (id, position), so each row's
 * tokens are one run, in token order. */
LLMT_INLINE void embed_bwd_band_t(void *dtable, const void *dout, const embed_token *order,
                                  int64_t m, int64_t d, int64_t c0, int64_t c1, int dt)
{
    float acc[EMBED_TILE];
    for (int64_t r0 = 0, r1; r0 < m; r0 = r1) {
        for (r1 = r0 + 1; r1 < m && order[r1].id == order[r0].id; r1++)
            ;
        const int64_t row = (int64_t)order[r0].id * d;
        for (int64_t t0 = c0; t0 < c1; t0 += EMBED_TILE) {
            const int w = c1 - t0 < EMBED_TILE ? (int)(c1 - t0) : EMBED_TILE;
            for (int c = 0; c < w; c++)
                acc[c] = get(dtable, dt, row + t0 + c);
            for (int64_t k = r0; k < r1; k++) {
                const int64_t src = order[k].pos * d + t0;
                for (int c = 0; c < w; c++)
                    acc[c] += get(dout, dt, src + c);
            }
            for (int c = 0; c < w; c++)
                put(dtable, dt, row + t0 + c, acc[c]);
        }
    }
}
LLMT_DTYPE_VARIANTS(embed_bwd_band,
                    (void *dt_, const void *dout, const embed_token *order, int64_t m, int64_t d,
                     int64_t c0, int64_t c1),
                    dt_, dout, order, m, d, c0, c1)

int llmt_cpu_embedding_bwd(llmt_device *dev, void *dtable, const void *dout, const int32_t *ids,
                           int64_t m, int64_t d, int dt)
{
    if (m <= 0 || d <= 0)
        return LLMT_OK;
    /* The tokens grouped by id (a stable sort: qsort with the position as
     * the tie-break); each thread then owns a band of columns of every row,
     * so each element is one thread's fp32 sum in token order: the same
     * bits for any thread count. */
    embed_token *order = malloc((size_t)m * sizeof *order);
    if (!order)
        return llmt_fail(LLMT_ENOMEM, "cpu embedding_bwd: no memory to order %lld tokens",
                         (long long)m);
    for (int64_t i = 0; i < m; i++)
        order[i] = (embed_token){.pos = i, .id = ids[i]};
    qsort(order, (size_t)m, sizeof *order, embed_token_cmp);
    void (*band)(void *, const void *, const embed_token *, int64_t, int64_t, int64_t, int64_t) =
        LLMT_PICK(embed_bwd_band, dt);
#pragma omp parallel num_threads(threads_for(dev, m * d))
    {
        int64_t c0, c1;
        split_rows(d, omp_get_thread_num(), omp_get_num_threads(), &c0, &c1);
        band(dtable, dout, order, m, d, c0, c1);
    }
    free(order);
    return LLMT_OK;
}

/* ---- RMSNorm */

LLMT_INLINE void rms_fwd_row_t(void *out, float *rstd, const void *x, const void *w, int64_t d,
                               float eps, int dt)
{
    float r = 1.0f / sqrtf(dot_t(x, x, d, dt) / (float)d + eps);
    *rstd = r;
    for (int64_t i = 0; i < d; i++)
        put(out, dt, i, get(x, dt, i) * r * get(w, dt, i));
}
LLMT_DTYPE_VARIANTS(rms_fwd_row,
                    (void *out, float *rstd, const void *x, const void *w, int64_t d, float eps),
                    out, rstd, x, w, d, eps)

int llmt_cpu_rmsnorm_fwd(llmt_device *dev, void *out, float *rstd, const void *x, const void *w,
                         int64_t m, int64_t d, float eps, int dt)
{
    void (*row)(void *, float *, const void *, const void *, int64_t, float) =
        LLMT_PICK(rms_fwd_row, dt);
#pragma omp parallel for schedule(static) num_threads(threads_for(dev, m * d))
    for (int64_t i = 0; i < m; i++)
        row(at(out, dt, i * d), rstd + i, cat(x, dt, i * d), w, d, eps);
    return LLMT_OK;
}

/* With xhat = x * rstd and g = dout * w:
 * dx = rstd * (g - xhat * mean(g * xhat)), dw += dout * xhat. */
LLMT_INLINE void rms_bwd_row_t(void *dx, float *dw_acc, const void *dout, const void *x,
                               const void *w, float rstd, int64_t d, int accumulate, int dt)
{
    float acc[16] = {0};
    int64_t i = 0;
    for (; i + 16 <= d; i += 16)
        for (int j = 0; j < 16; j++)
            acc[j] += get(dout, dt, i + j) * get(w, dt, i + j) * get(x, dt, i + j);
    for (int j = 0; i + j < d; j++)
        acc[j] += get(dout, dt, i + j) * get(w, dt, i + j) * get(x, dt, i + j);
    float s = 0.0f;
    for (int j = 0; j < 16; j++)
        s += acc[j];
    /* mean(g * xhat) = rstd * sum(g * x) / d */
    float mean_gx = s * rstd / (float)d;
    for (int64_t k = 0; k < d; k++) {
        float xhat = get(x, dt, k) * rstd;
        float g = get(dout, dt, k) * get(w, dt, k);
        float v = rstd * (g - xhat * mean_gx);
        put(dx, dt, k, accumulate ? get(dx, dt, k) + v : v);
        dw_acc[k] += get(dout, dt, k) * xhat;
    }
}
LLMT_DTYPE_VARIANTS(rms_bwd_row,
                    (void *dx, float *dw_acc, const void *dout, const void *x, const void *w,
                     float rstd, int64_t d, int accumulate),
                    dx, dw_acc, dout, x, w, rstd, d, accumulate)

int llmt_cpu_rmsnorm_bwd(llmt_device *dev, void *dx, void *dw, const void *dout, const void *x,
                         const void *w, const float *rstd, int64_t m, int64_t d, int accumulate,
                         int dt, void *scratch)
{
    /* Each thread sums its rows' dw into its own fp32 partial (scratch);
     * the partials are then added to dw in thread order. */
    float *partial = scratch;
    int nt = threads_for(dev, m * d);
    void (*row)(void *, float *, const void *, const void *, const void *, float, int64_t, int) =
        LLMT_PICK(rms_bwd_row, dt);
    /* Zeroed up front: a team smaller than asked for leaves zero partials. */
    memset(partial, 0, (size_t)(nt * d) * sizeof *partial);
#pragma omp parallel num_threads(nt)
    {
        int t = omp_get_thread_num();
        float *mine = partial + (int64_t)t * d;
        int64_t r0, r1;
        split_rows(m, t, omp_get_num_threads(), &r0, &r1);
        for (int64_t i = r0; i < r1; i++)
            row(at(dx, dt, i * d), mine, cat(dout, dt, i * d), cat(x, dt, i * d), w, rstd[i], d,
                accumulate);
#pragma omp barrier
#pragma omp for schedule(static)
        for (int64_t k = 0; k < d; k++) {
            float v = get(dw, dt, k);
            for (int u = 0; u < nt; u++)
                v += partial[(int64_t)u * d + k];
            put(dw, dt, k, v);
        }
    }
    return LLMT_OK;
}

/* ---- RoPE */

LLMT_INLINE void rope_row_t(void *x, const float *cs, const float *sn, int64_t heads,
                            int64_t head_dim, int inverse, int dt)
{
    int64_t half = head_dim / 2;
    float sign = inverse ? -1.0f : 1.0f;
    for (int64_t h = 0; h < heads; h++) {
        void *v = at(x, dt, h * head_dim);
        for (int64_t i = 0; i < half; i++) {
            float x1 = get(v, dt, i), x2 = get(v, dt, i + half);
            float c = cs[i], s = sign * sn[i];
            put(v, dt, i, x1 * c - x2 * s);
            put(v, dt, i + half, x2 * c + x1 * s);
        }
    }
}
LLMT_DTYPE_VARIANTS(rope_row,
                    (void *x, const float *cs, const float *sn, int64_t heads, int64_t head_dim,
                     int inverse),
                    x, cs, sn, heads, head_dim, inverse)

int llmt_cpu_rope(llmt_device *dev, void *x, const float *cos_sin, int64_t m, int64_t seq,
                  int64_t heads, int64_t head_dim, int64_t row_stride, int inverse, int dt)
{
    if (m > 0 && seq < 1) /* row r is at position r % seq */
        return llmt_fail(LLMT_EINVAL, "cpu rope: seq = %lld is not positive", (long long)seq);
    int64_t half = head_dim / 2;
    void (*row)(void *, const float *, const float *, int64_t, int64_t, int) =
        LLMT_PICK(rope_row, dt);
#pragma omp parallel for schedule(static) num_threads(threads_for(dev, m * heads * head_dim))
    for (int64_t r = 0; r < m; r++) {
        int64_t pos = r % seq;
        row(at(x, dt, r * row_stride), cos_sin + 2 * pos * half, cos_sin + (2 * pos + 1) * half,
            heads, head_dim, inverse);
    }
    return LLMT_OK;
}

/* ---- SwiGLU: out = silu(g) * u, silu(g) = g * sigmoid(g) */

LLMT_INLINE void swiglu_fwd_row_t(void *out, const void *gu, int64_t f, int dt)
{
    for (int64_t i = 0; i < f; i++) {
        float g = get(gu, dt, i), u = get(gu, dt, f + i);
        float sig = 1.0f / (1.0f + fast_expf(-g));
        put(out, dt, i, g * sig * u);
    }
}
LLMT_DTYPE_VARIANTS(swiglu_fwd_row, (void *out, const void *gu, int64_t f), out, gu, f)

int llmt_cpu_swiglu_fwd(llmt_device *dev, void *out, const void *gate_up, int64_t m, int64_t f,
                        int dt)
{
    void (*row)(void *, const void *, int64_t) = LLMT_PICK(swiglu_fwd_row, dt);
#pragma omp parallel for schedule(static) num_threads(threads_for(dev, m * f))
    for (int64_t i = 0; i < m; i++)
        row(at(out, dt, i * f), cat(gate_up, dt, i * 2 * f), f);
    return LLMT_OK;
}

LLMT_INLINE void swiglu_bwd_row_t(void *dgu, const void *dout, const void *gu, int64_t f, int dt)
{
    for (int64_t i = 0; i < f; i++) {
        float g = get(gu, dt, i), u = get(gu, dt, f + i), d = get(dout, dt, i);
        float sig = 1.0f / (1.0f + fast_expf(-g));
        float silu = g * sig;
        put(dgu, dt, i, d * u * sig * (1.0f + g * (1.0f - sig)));
        put(dgu, dt, f + i, d * silu);
    }
}
LLMT_DTYPE_VARIANTS(swiglu_bwd_row, (void *dgu, const void *dout, const void *gu, int64_t f), dgu,
                    dout, gu, f)

int llmt_cpu_swiglu_bwd(llmt_device *dev, void *dgate_up, const void *dout, const void *gate_up,
                        int64_t m, int64_t f, int dt)
{
    void (*row)(void *, const void *, const void *, int64_t) = LLMT_PICK(swiglu_bwd_row, dt);
#pragma omp parallel for schedule(static) num_threads(threads_for(dev, m * f))
    for (int64_t i = 0; i < m; i++)
        row(at(dgate_up, dt, i * 2 * f), cat(dout, dt, i * f), cat(gate_up, dt, i * 2 * f), f);
    return LLMT_OK;
}

/* ---- residual add */

LLMT_INLINE void add_band_t(void *y, const void *x, int64_t n, int dt)
{
    for (int64_t i = 0; i < n; i++)
        put(y, dt, i, get(y, dt, i) + get(x, dt, i));
}
LLMT_DTYPE_VARIANTS(add_band, (void *y, const void *x, int64_t n), y, x, n)

int llmt_cpu_add(llmt_device *dev, void *y, const void *x, int64_t n, int dt)
{
    void (*band)(void *, const void *, int64_t) = LLMT_PICK(add_band, dt);
#pragma omp parallel num_threads(threads_for(dev, n))
    {
        int64_t i0, i1;
        split_rows(n, omp_get_thread_num(), omp_get_num_threads(), &i0, &i1);
        band(at(y, dt, i0), cat(x, dt, i0), i1 - i0);
    }
    return LLMT_OK;
}

/* ---- dtype conversion */

int llmt_cpu_cast(llmt_device *dev, void *dst, int dst_dt, const void *src, int src_dt, int64_t n)
{
#pragma omp parallel for schedule(static) num_threads(threads_for(dev, n))
    for (int64_t i = 0; i < n; i++)
        put(dst, dst_dt, i, get(src, src_dt, i));
    return LLMT_OK;
}
