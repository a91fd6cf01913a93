/* CUDA row-wise kernels: embedding, RMSNorm, RoPE, SwiGLU, residual add and
 * dtype conversion. Each computes in fp32 and rounds to nearest even on
 * store, with the CPU backend's expressions in the CPU's order; this file is
 * compiled without FMA contraction (CMakeLists.txt), so the element-wise
 * ops give the CPU's bits wherever the CPU uses the same functions. */
#include "cuda_kernels.cuh"

#define ROW_THREADS 256
/* RMSNorm weight gradient: rows are cut into at most this many bands whose
 * fp32 partial sums are added in band order. */
#define RMS_BANDS 128

/* ---- embedding */

template <typename T>
__global__ void embedding_fwd_kernel(T *out, const T *table, const int32_t *ids, int64_t m,
                                     int64_t d)
{
    for (int64_t i = blockIdx.x; i < m; i += gridDim.x) {
        const T *src = table + (int64_t)ids[i] * d;
        T *dst = out + i * d;
        for (int64_t c = threadIdx.x; c < d; c += blockDim.x)
            dst[c] = src[c];
    }
}

/* Columns of a row that an embedding_bwd block sums at once: each thread
 * holds EMB_PER_THREAD of them in fp32 registers. */
#define EMB_TILE 4096
#define EMB_PER_THREAD (EMB_TILE / ROW_THREADS)

/* dtable[ids[i]] += dout[i], each element the fp32 sum of its row's value
 * and its tokens' dout in token order, rounded to the dtype once, as the
 * CPU: the block of token i does nothing unless i is the first occurrence
 * of its id; then, per tile of EMB_TILE columns, its threads widen their
 * columns of the row, walk the later tokens in order (256 at a time, found
 * with ballots) adding each match's columns, and store the rounded sums.
 * Thread t owns columns t + k ROW_THREADS of the tile throughout, and
 * blocks own distinct rows: no atomics, the same bits for any grid. */
template <typename T>
__global__ void __launch_bounds__(ROW_THREADS)
    embedding_bwd_kernel(T *dtable, const T *dout, const int32_t *ids, int64_t m, int64_t d)
{
    __shared__ unsigned masks[ROW_THREADS / 32];
    for (int64_t i = blockIdx.x; i < m; i += gridDim.x) {
        const int32_t id = ids[i];
        int earlier = 0;
        for (int64_t j = threadIdx.x; j < i; j += blockDim.x)
            earlier |= ids[j] == id;
        if (__syncthreads_or(earlier))
            continue; /* block-uniform */
        T *row = dtable + (int64_t)id * d;
        for (int64_t tile = 0; tile < d; tile += EMB_TILE) {
            const int64_t c0 = tile + threadIdx.x;
            float acc[EMB_PER_THREAD];
#pragma unroll
            for (int k = 0; k < EMB_PER_THREAD; k++) {
                const int64_t c = c0 + k * ROW_THREADS;
                acc[k] = c < d ? to_f32(row[c]) : 0.0f;
            }
            for (int64_t t0 = i; t0 < m; t0 += ROW_THREADS) {
                int64_t j = t0 + threadIdx.x;
                unsigned mask = __ballot_sync(0xffffffffu, j < m && ids[j] == id);
                if ((threadIdx.x & 31) == 0)
                    masks[threadIdx.x >> 5] = mask;
                __syncthreads();
                for (int w = 0; w < ROW_THREADS / 32; w++)
                    for (unsigned bits = masks[w]; bits; bits &= bits - 1) {
                        const T *src = dout + (t0 + 32 * w + (__ffs((int)bits) - 1)) * d;
#pragma unroll
                        for (int k = 0; k < EMB_PER_THREAD; k++) {
                            const int64_t c = c0 + k * ROW_THREADS;
                            if (c < d)
                                acc[k] += to_f32(src[c]);
                        }
                    }
                __syncthreads(); /* before masks is written again */
            }
#pragma unroll
            for (int k = 0; k < EMB_PER_THREAD; k++) {
                const int64_t c = c0 + k * ROW_THREADS;
                if (c < d)
                    row[c] = from_f32<T>(acc[k]);
            }
        }
    }
}

int llmt_cuda_embedding_fwd(llmt_device *dev, void *out, const void *table, const int32_t *ids,
                            int64_t m, int64_t d, int dt)
{
    LLMT_CUDA_CHECK_DT(dev, dt, "embedding_fwd");
    if (m <= 0 || d <= 0)
        return LLMT_OK;
    LLMT_CUDA_DISPATCH(dt, T,
                       LLMT_LAUNCH(llmt_cuda_blocks(m, 1), ROW_THREADS, llmt_cuda(dev)->stream,
                                   embedding_fwd_kernel<T>)((T *)out, (const T *)table, ids, m, d));
    LLMT_CUDA_LAUNCHED(dev, "embedding_fwd");
    return LLMT_OK;
}

int llmt_cuda_embedding_bwd(llmt_device *dev, void *dtable, const void *dout, const int32_t *ids,
                            int64_t m, int64_t d, int dt)
{
    LLMT_CUDA_CHECK_DT(dev, dt, "embedding_bwd");
    if (m <= 0 || d <= 0)
        return LLMT_OK;
    LLMT_CUDA_DISPATCH(dt, T,
                       LLMT_LAUNCH(llmt_cuda_blocks(m, 1), ROW_THREADS, llmt_cuda(dev)->stream,
                                   embedding_bwd_kernel<T>)((T *)dtable, (const T *)dout, ids, m,
                                                            d));
    LLMT_CUDA_LAUNCHED(dev, "embedding_bwd");
    return LLMT_OK;
}

/* ---- RMSNorm: one block per row */

template <typename T>
__global__ void __launch_bounds__(ROW_THREADS)
    rmsnorm_fwd_kernel(T *out, float *rstd, const T *x, const T *w, int64_t m, int64_t d,
                       float eps)
{
    __shared__ float red[32];
    for (int64_t r = blockIdx.x; r < m; r += gridDim.x) {
        const T *xr = x + r * d;
        float ss = 0.0f;
        for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
            float v = to_f32(xr[c]);
            ss += v * v;
        }
        ss = block_sum(ss, red);
        float rs = 1.0f / sqrtf(ss / (float)d + eps);
        if (threadIdx.x == 0)
            rstd[r] = rs;
        for (int64_t c = threadIdx.x; c < d; c += blockDim.x)
            out[r * d + c] = from_f32<T>(to_f32(xr[c]) * rs * to_f32(w[c]));
    }
}

/* With xhat = x rstd and g = dout w: dx = rstd (g - xhat mean(g xhat)). */
template <typename T>
__global__ void __launch_bounds__(ROW_THREADS)
    rmsnorm_dx_kernel(T *dx, const T *dout, const T *x, const T *w, const float *rstd, int64_t m,
                      int64_t d, int accumulate)
{
    __shared__ float red[32];
    for (int64_t r = blockIdx.x; r < m; r += gridDim.x) {
        const T *dr = dout + r * d, *xr = x + r * d;
        float s = 0.0f;
        for (int64_t c = threadIdx.x; c < d; c += blockDim.x)
            s += to_f32(dr[c]) * to_f32(w[c]) * to_f32(xr[c]);
        s = block_sum(s, red);
        const float rs = rstd[r];
        const float mean_gx = s * rs / (float)d;
        for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
            float xhat = to_f32(xr[c]) * rs;
            float g = to_f32(dr[c]) * to_f32(w[c]);
            float v = rs * (g - xhat * mean_gx);
            T *p = dx + r * d + c;
            *p = from_f32<T>(accumulate ? to_f32(*p) + v : v);
        }
    }
}

/* partial[band][c] = sum over the band's rows, in row order, of dout x rstd. */
template <typename T>
__global__ void rmsnorm_dw_partial_kernel(float *partial, const T *dout, const T *x,
                                          const float *rstd, int64_t m, int64_t d,
                                          int64_t band_rows)
{
    const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t band = blockIdx.y;
    if (c >= d)
        return;
    const int64_t r0 = band * band_rows, r1 = r0 + band_rows < m ? r0 + band_rows : m;
    float acc = 0.0f;
    for (int64_t r = r0; r < r1; r++)
        acc += to_f32(dout[r * d + c]) * (to_f32(x[r * d + c]) * rstd[r]);
    partial[band * d + c] = acc;
}

/* dw[c] += the bands' partials, in band order. */
template <typename T>
__global__ void rmsnorm_dw_final_kernel(T *dw, const float *partial, int64_t d, int64_t bands)
{
    const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= d)
        return;
    float v = to_f32(dw[c]);
    for (int64_t b = 0; b < bands; b++)
        v += partial[b * d + c];
    dw[c] = from_f32<T>(v);
}

size_t llmt_cuda_rmsnorm_scratch(const llmt_op_dims *d)
{
    return (size_t)RMS_BANDS * (size_t)d->hidden * sizeof(float) + LLMT_CUDA_ALIGN;
}

int llmt_cuda_rmsnorm_fwd(llmt_device *dev, void *out, float *rstd, const void *x, const void *w,
                          int64_t m, int64_t d, float eps, int dt)
{
    LLMT_CUDA_CHECK_DT(dev, dt, "rmsnorm_fwd");
    if (m <= 0 || d <= 0)
        return LLMT_OK;
    LLMT_CUDA_DISPATCH(dt, T,
                       LLMT_LAUNCH(llmt_cuda_blocks(m, 1), ROW_THREADS, llmt_cuda(dev)->stream,
                                   rmsnorm_fwd_kernel<T>)((T *)out, rstd, (const T *)x,
                                                          (const T *)w, m, d, eps));
    LLMT_CUDA_LAUNCHED(dev, "rmsnorm_fwd");
    return LLMT_OK;
}

int llmt_cuda_rmsnorm_bwd(llmt_device *dev, void *dx, void *dw, const void *dout, const void *x,
                          const void *w, const float *rstd, int64_t m, int64_t d, int accumulate,
                          int dt, void *scratch)
{
    LLMT_CUDA_CHECK_DT(dev, dt, "rmsnorm_bwd");
    if (m <= 0 || d <= 0)
        return LLMT_OK;
    if (!scratch)
        return llmt_cuda(dev)->host->fail(LLMT_EINVAL, "CUDA rmsnorm_bwd: scratch is NULL");
    cudaStream_t stream = llmt_cuda(dev)->stream;
    float *partial = (float *)llmt_cuda_align_ptr(scratch);
    const int64_t band_rows = (m + RMS_BANDS - 1) / RMS_BANDS;
    const int64_t bands = (m + band_rows - 1) / band_rows;
    const dim3 cols((unsigned)((d + ROW_THREADS - 1) / ROW_THREADS));
    const dim3 grid(cols.x, (unsigned)bands);
    LLMT_CUDA_DISPATCH(dt, T, {
        LLMT_LAUNCH(llmt_cuda_blocks(m, 1), ROW_THREADS, stream, rmsnorm_dx_kernel<T>)(
            (T *)dx, (const T *)dout, (const T *)x, (const T *)w, rstd, m, d, accumulate);
        LLMT_LAUNCH(grid, ROW_THREADS, stream, rmsnorm_dw_partial_kernel<T>)(
            partial, (const T *)dout, (const T *)x, rstd, m, d, band_rows);
        LLMT_LAUNCH(cols, ROW_THREADS, stream, rmsnorm_dw_final_kernel<T>)((T *)dw, partial, d,
                                                                         bands);
    });
    LLMT_CUDA_LAUNCHED(dev, "rmsnorm_bwd");
    return LLMT_OK;
}

/* ---- RoPE: one thread per rotated pair */

template <typename T>
__global__ void rope_kernel(T *x, const float *cos_sin, int64_t m, int64_t seq, int64_t heads,
                            int64_t head_dim, int64_t row_stride, float sign)
{
    const int64_t half = head_dim / 2, total = m * heads * half;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total;
         e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t i = e % half, h = (e / half) % heads, r = e / (half * heads);
        const int64_t pos = r % seq;
        const float c = cos_sin[2 * pos * half + i], s = sign * cos_sin[(2 * pos + 1) * half + i];
        T *v = x + r * row_stride + h * head_dim;
        const float x1 = to_f32(v[i]), x2 = to_f32(v[i + half]);
        v[i] = from_f32<T>(x1 * c - x2 * s);
        v[i + half] = from_f32<T>(x2 * c + x1 * s);
    }
}

int llmt_cuda_rope(llmt_device *dev, void *x, const float *cos_sin, int64_t m, int64_t seq,
                   int64_t heads, int64_t head_dim, int64_t row_stride, int inverse, int dt)
{
    LLMT_CUDA_CHECK_DT(dev, dt, "rope");
    const int64_t total = m * heads * (head_dim / 2);
    if (total <= 0)
        return LLMT_OK;
    LLMT_CUDA_DISPATCH(dt, T,
                       LLMT_LAUNCH(llmt_cuda_blocks(total, ROW_THREADS), ROW_THREADS,
                                   llmt_cuda(dev)->stream, rope_kernel<T>)(
                           (T *)x, cos_sin, m, seq, heads, head_dim, row_stride,
                           inverse ? -1.0f : 1.0f));
    LLMT_CUDA_LAUNCHED(dev, "rope");
    return LLMT_OK;
}

/* ---- SwiGLU: out = silu(g) u, silu(g) = g sigmoid(g), rows [g | u] */

template <typename T>
__global__ void swiglu_fwd_kernel(T *out, const T *gu, int64_t m, int64_t f)
{
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < m * f;
         e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = e / f, i = e % f;
        const float g = to_f32(gu[r * 2 * f + i]), u = to_f32(gu[r * 2 * f + f + i]);
        const float sig = 1.0f / (1.0f + expf(-g));
        out[e] = from_f32<T>(g * sig * u);
    }
}

template <typename T>
__global__ void swiglu_bwd_kernel(T *dgu, const T *dout, const T *gu, int64_t m, int64_t f)
{
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < m * f;
         e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = e / f, i = e % f;
        const float g = to_f32(gu[r * 2 * f + i]), u = to_f32(gu[r * 2 * f + f + i]);
        const float d = to_f32(dout[e]);
        const float sig = 1.0f / (1.0f + expf(-g));
        const float silu = g * sig;
        dgu[r * 2 * f + i] = from_f32<T>(d * u * sig * (1.0f + g * (1.0f - sig)));
        dgu[r * 2 * f + f + i] = from_f32<T>(d * silu);
    }
}

int llmt_cuda_swiglu_fwd(llmt_device *dev, void *out, const void *gate_up, int64_t m, int64_t f,
                         int dt)
{
    LLMT_CUDA_CHECK_DT(dev, dt, "swiglu_fwd");
    if (m * f <= 0)
        return LLMT_OK;
    LLMT_CUDA_DISPATCH(dt, T,
                       LLMT_LAUNCH(llmt_cuda_blocks(m * f, ROW_THREADS), ROW_THREADS,
                                   llmt_cuda(dev)->stream, swiglu_fwd_kernel<T>)(
                           (T *)out, (const T *)gate_up, m, f));
    LLMT_CUDA_LAUNCHED(dev, "swiglu_fwd");
    return LLMT_OK;
}

int llmt_cuda_swiglu_bwd(llmt_device *dev, void *dgate_up, const void *dout, const void *gate_up,
                         int64_t m, int64_t f, int dt)
{
    LLMT_CUDA_CHECK_DT(dev, dt, "swiglu_bwd");
    if (m * f <= 0)
        return LLMT_OK;
    LLMT_CUDA_DISPATCH(dt, T,
                       LLMT_LAUNCH(llmt_cuda_blocks(m * f, ROW_THREADS), ROW_THREADS,
                                   llmt_cuda(dev)->stream, swiglu_bwd_kernel<T>)(
                           (T *)dgate_up, (const T *)dout, (const T *)gate_up, m, f));
    LLMT_CUDA_LAUNCHED(dev, "swiglu_bwd");
    return LLMT_OK;
}

/* ---- residual add and dtype conversion */

template <typename T> __global__ void add_kernel(T *y, const T *x, int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        y[i] = from_f32<T>(to_f32(y[i]) + to_f32(x[i]));
}

template <typename T> __global__ void add_f32_kernel(T *y, const float *x, int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        y[i] = from_f32<T>(to_f32(y[i]) + x[i]);
}

__global__ void cast_kernel(void *dst, int dst_dt, const void *src, int src_dt, int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        store_dt(dst, dst_dt, i, load_dt(src, src_dt, i));
}

int llmt_cuda_add(llmt_device *dev, void *y, const void *x, int64_t n, int dt)
{
    LLMT_CUDA_CHECK_DT(dev, dt, "add");
    if (n <= 0)
        return LLMT_OK;
    LLMT_CUDA_DISPATCH(dt, T,
                       LLMT_LAUNCH(llmt_cuda_blocks(n, ROW_THREADS), ROW_THREADS,
                                   llmt_cuda(dev)->stream, add_kernel<T>)((T *)y, (const T *)x, n));
    LLMT_CUDA_LAUNCHED(dev, "add");
    return LLMT_OK;
}

int llmt_cuda_add_f32(llmt_device *dev, void *y, const float *x, int64_t n, int dt)
{
    LLMT_CUDA_CHECK_DT(dev, dt, "add");
    if (n <= 0)
        return LLMT_OK;
    LLMT_CUDA_DISPATCH(dt, T,
                       LLMT_LAUNCH(llmt_cuda_blocks(n, ROW_THREADS), ROW_THREADS,
                                   llmt_cuda(dev)->stream, add_f32_kernel<T>)((T *)y, x, n));
    LLMT_CUDA_LAUNCHED(dev, "add");
    return LLMT_OK;
}

int llmt_cuda_cast(llmt_device *dev, void *dst, int dst_dt, const void *src, int src_dt, int64_t n)
{
    LLMT_CUDA_CHECK_DT(dev, dst_dt, "cast");
    LLMT_CUDA_CHECK_DT(dev, src_dt, "cast");
    if (n <= 0)
        return LLMT_OK;
    LLMT_LAUNCH(llmt_cuda_blocks(n, ROW_THREADS), ROW_THREADS, llmt_cuda(dev)->stream,
                cast_kernel)(dst, dst_dt, src, src_dt, n);
    LLMT_CUDA_LAUNCHED(dev, "cast");
    return LLMT_OK;
}
