/* CUDA row-wise kernels: embedding, RMSNorm, RoPE, SwiGLU, residual add and
 * dtype conversion. Each computes in fp32 and rounds to nearest even on
 * store, with the CPU backend's expressions in the CPU's order; this file is
 * compiled without FMA contraction (CMakeLists.txt), so the element-wise
 * ops give the CPU's bits wherever the CPU uses the same functions.
 *
 * Memory moves in groups of LLMT_GROUP elements (16-byte accesses where the
 * group is whole and aligned, cuda_kernels.cuh); rows are indexed by
 * multiplication and grid strides, with no 64-bit division in any loop. */
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
        for (int64_t c = (int64_t)threadIdx.x * LLMT_GROUP; c < d;
             c += (int64_t)blockDim.x * LLMT_GROUP) {
            T v[LLMT_GROUP];
            const int n = group_len(c, d);
            load_group(v, src + c, n);
            store_group(dst + c, v, n);
        }
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

/* ---- RMSNorm: one block per row; thread t takes the row's groups t,
 * t + blockDim.x, ... and sums its squares in column order, then the block
 * tree adds the threads' sums (a fixed order: the same bits every run). */

template <typename T>
__global__ void __launch_bounds__(ROW_THREADS)
    rmsnorm_fwd_kernel(T *out, float *rstd, const T *x, const T *w, int64_t m, int64_t d,
                       float eps)
{
    __shared__ float red[32];
    const int64_t c0 = (int64_t)threadIdx.x * LLMT_GROUP, step = (int64_t)blockDim.x * LLMT_GROUP;
    for (int64_t r = blockIdx.x; r < m; r += gridDim.x) {
        const T *xr = x + r * d;
        float ss = 0.0f;
        for (int64_t c = c0; c < d; c += step) {
            float v[LLMT_GROUP];
            const int n = group_len(c, d);
            load_group_f32(v, xr + c, n);
#pragma unroll
            for (int i = 0; i < LLMT_GROUP; i++)
                if (i < n)
                    ss += v[i] * v[i];
        }
        ss = block_sum(ss, red);
        float rs = 1.0f / sqrtf(ss / (float)d + eps);
        if (threadIdx.x == 0)
            rstd[r] = rs;
        for (int64_t c = c0; c < d; c += step) {
            float v[LLMT_GROUP], wv[LLMT_GROUP];
            const int n = group_len(c, d);
            load_group_f32(v, xr + c, n);
            load_group_f32(wv, w + c, n);
#pragma unroll
            for (int i = 0; i < LLMT_GROUP; i++)
                if (i < n)
                    v[i] = v[i] * rs * wv[i];
            store_group_f32(out + r * d + c, v, n);
        }
    }
}

/* With xhat = x rstd and g = dout w: dx = rstd (g - xhat mean(g xhat)). */
template <typename T>
__global__ void __launch_bounds__(ROW_THREADS)
    rmsnorm_dx_kernel(T *dx, const T *dout, const T *x, const T *w, const float *rstd, int64_t m,
                      int64_t d, int accumulate)
{
    __shared__ float red[32];
    const int64_t c0 = (int64_t)threadIdx.x * LLMT_GROUP, step = (int64_t)blockDim.x * LLMT_GROUP;
    for (int64_t r = blockIdx.x; r < m; r += gridDim.x) {
        const T *dr = dout + r * d, *xr = x + r * d;
        T *dxr = dx + r * d;
        float s = 0.0f;
        for (int64_t c = c0; c < d; c += step) {
            float dv[LLMT_GROUP], wv[LLMT_GROUP], xv[LLMT_GROUP];
            const int n = group_len(c, d);
            load_group_f32(dv, dr + c, n);
            load_group_f32(wv, w + c, n);
            load_group_f32(xv, xr + c, n);
#pragma unroll
            for (int i = 0; i < LLMT_GROUP; i++)
                if (i < n)
                    s += dv[i] * wv[i] * xv[i];
        }
        s = block_sum(s, red);
        const float rs = rstd[r];
        const float mean_gx = s * rs / (float)d;
        for (int64_t c = c0; c < d; c += step) {
            float dv[LLMT_GROUP], wv[LLMT_GROUP], xv[LLMT_GROUP], old[LLMT_GROUP];
            const int n = group_len(c, d);
            load_group_f32(dv, dr + c, n);
            load_group_f32(wv, w + c, n);
            load_group_f32(xv, xr + c, n);
            if (accumulate)
                load_group_f32(old, dxr + c, n);
#pragma unroll
            for (int i = 0; i < LLMT_GROUP; i++)
                if (i < n) {
                    float xhat = xv[i] * rs;
                    float g = dv[i] * wv[i];
                    float v = rs * (g - xhat * mean_gx);
                    dv[i] = accumulate ? old[i] + v : v;
                }
            store_group_f32(dxr + c, dv, n);
        }
    }
}

/* partial[band][c] = sum over the band's rows, in row order, of dout x rstd;
 * each thread owns one group of columns. */
template <typename T>
__global__ void rmsnorm_dw_partial_kernel(float *partial, const T *dout, const T *x,
                                          const float *rstd, int64_t m, int64_t d,
                                          int64_t band_rows)
{
    const int64_t c = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * LLMT_GROUP;
    const int64_t band = blockIdx.y;
    if (c >= d)
        return;
    const int n = group_len(c, d);
    const int64_t r0 = band * band_rows, r1 = r0 + band_rows < m ? r0 + band_rows : m;
    float acc[LLMT_GROUP];
#pragma unroll
    for (int i = 0; i < LLMT_GROUP; i++)
        acc[i] = 0.0f;
    for (int64_t r = r0; r < r1; r++) {
        float dv[LLMT_GROUP], xv[LLMT_GROUP];
        load_group_f32(dv, dout + r * d + c, n);
        load_group_f32(xv, x + r * d + c, n);
        const float rs = rstd[r];
#pragma unroll
        for (int i = 0; i < LLMT_GROUP; i++)
            if (i < n)
                acc[i] += dv[i] * (xv[i] * rs);
    }
    store_group(partial + band * d + c, acc, n);
}

/* dw[c] += the bands' partials, in band order; a group of columns a thread. */
template <typename T>
__global__ void rmsnorm_dw_final_kernel(T *dw, const float *partial, int64_t d, int64_t bands)
{
    const int64_t c = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * LLMT_GROUP;
    if (c >= d)
        return;
    const int n = group_len(c, d);
    float v[LLMT_GROUP];
    load_group_f32(v, dw + c, n);
    for (int64_t b = 0; b < bands; b++) {
        float p[LLMT_GROUP];
        load_group(p, partial + b * d + c, n);
#pragma unroll
        for (int i = 0; i < LLMT_GROUP; i++)
            if (i < n)
                v[i] += p[i];
    }
    store_group_f32(dw + c, v, n);
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
    const int64_t groups = (d + LLMT_GROUP - 1) / LLMT_GROUP;
    const dim3 cols((unsigned)((groups + ROW_THREADS - 1) / ROW_THREADS));
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

/* ---- RoPE: positions on the grid's x, the sequences that hold them on y;
 * a block per row, a thread per rotated pair of the row's heads, 32-bit
 * index arithmetic within the row */

/* Row r is at position r % seq: block (x, y) takes positions t = x, x +
 * gridDim.x, ... and, for each, rows t + seq (y + j gridDim.y), j = 0, 1,
 * ..., below m, so the position is known by construction and no 64-bit
 * division runs (the host divides once, for the grid's height). */
template <typename T>
__global__ void rope_kernel(T *x, const float *cos_sin, int64_t m, int64_t seq, uint32_t heads,
                            uint32_t head_dim, int64_t row_stride, float sign)
{
    const uint32_t half = head_dim / 2, pairs = heads * half;
    for (int64_t t = blockIdx.x; t < seq; t += gridDim.x) {
        const float *cs = cos_sin + 2 * t * half; /* cosines, then sines */
        for (int64_t r = t + blockIdx.y * seq; r < m; r += gridDim.y * seq) {
            T *row = x + r * row_stride;
            for (uint32_t e = threadIdx.x; e < pairs; e += blockDim.x) {
                const uint32_t h = e / half, i = e - h * half;
                const float c = cs[i], s = sign * cs[half + i];
                T *v = row + h * head_dim;
                const float x1 = to_f32(v[i]), x2 = to_f32(v[i + half]);
                v[i] = from_f32<T>(x1 * c - x2 * s);
                v[i + half] = from_f32<T>(x2 * c + x1 * s);
            }
        }
    }
}

int llmt_cuda_rope(llmt_device *dev, void *x, const float *cos_sin, int64_t m, int64_t seq,
                   int64_t heads, int64_t head_dim, int64_t row_stride, int inverse, int dt)
{
    LLMT_CUDA_CHECK_DT(dev, dt, "rope");
    const int64_t total = m * heads * (head_dim / 2);
    if (total <= 0)
        return LLMT_OK;
    if (seq < 1)
        return llmt_cuda(dev)->host->fail(LLMT_EINVAL, "CUDA rope: seq = %lld is not positive",
                                          (long long)seq);
    /* x: positions (at most m of them hold rows); y: the sequences, at most
     * 65535 (the grid's height limit), striding over the rest. */
    const int64_t sequences = (m + seq - 1) / seq;
    const dim3 grid(llmt_cuda_blocks(m < seq ? m : seq, 1),
                    (unsigned)(sequences < 65535 ? sequences : 65535));
    LLMT_CUDA_DISPATCH(dt, T,
                       LLMT_LAUNCH(grid, ROW_THREADS, llmt_cuda(dev)->stream,
                                   rope_kernel<T>)((T *)x, cos_sin, m, seq, (uint32_t)heads,
                                                   (uint32_t)head_dim, row_stride,
                                                   inverse ? -1.0f : 1.0f));
    LLMT_CUDA_LAUNCHED(dev, "rope");
    return LLMT_OK;
}

/* ---- SwiGLU: out = silu(g) u, silu(g) = g sigmoid(g), rows [g | u]; rows
 * on the grid's y, groups of columns on x. Not fused further: the gate and
 * up products come from one GEMM and the down product is cuBLASLt's, which
 * has no SwiGLU prologue or epilogue, so this is one read and one write. */

/* The launch of a [m, f] SwiGLU kernel. */
static dim3 swiglu_grid(int64_t m, int64_t f)
{
    return dim3(llmt_cuda_blocks((f + LLMT_GROUP - 1) / LLMT_GROUP, ROW_THREADS),
                (unsigned)(m < 65535 ? m : 65535));
}

template <typename T>
__global__ void swiglu_fwd_kernel(T *out, const T *gu, int64_t m, int64_t f)
{
    const int64_t j0 = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * LLMT_GROUP;
    const int64_t step = (int64_t)gridDim.x * blockDim.x * LLMT_GROUP;
    for (int64_t r = blockIdx.y; r < m; r += gridDim.y)
        for (int64_t j = j0; j < f; j += step) {
            const T *gr = gu + r * 2 * f + j;
            float g[LLMT_GROUP], u[LLMT_GROUP];
            const int n = group_len(j, f);
            load_group_f32(g, gr, n);
            load_group_f32(u, gr + f, n);
#pragma unroll
            for (int i = 0; i < LLMT_GROUP; i++)
                if (i < n) {
                    const float sig = 1.0f / (1.0f + expf(-g[i]));
                    g[i] = g[i] * sig * u[i];
                }
            store_group_f32(out + r * f + j, g, n);
        }
}

template <typename T>
__global__ void swiglu_bwd_kernel(T *dgu, const T *dout, const T *gu, int64_t m, int64_t f)
{
    const int64_t j0 = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * LLMT_GROUP;
    const int64_t step = (int64_t)gridDim.x * blockDim.x * LLMT_GROUP;
    for (int64_t r = blockIdx.y; r < m; r += gridDim.y)
        for (int64_t j = j0; j < f; j += step) {
            const T *gr = gu + r * 2 * f + j;
            T *dr = dgu + r * 2 * f + j;
            float g[LLMT_GROUP], u[LLMT_GROUP], d[LLMT_GROUP];
            const int n = group_len(j, f);
            load_group_f32(g, gr, n);
            load_group_f32(u, gr + f, n);
            load_group_f32(d, dout + r * f + j, n);
#pragma unroll
            for (int i = 0; i < LLMT_GROUP; i++)
                if (i < n) {
                    const float sig = 1.0f / (1.0f + expf(-g[i]));
                    const float silu = g[i] * sig;
                    const float dg = d[i] * u[i] * sig * (1.0f + g[i] * (1.0f - sig));
                    u[i] = d[i] * silu;
                    g[i] = dg;
                }
            store_group_f32(dr, g, n);
            store_group_f32(dr + f, u, n);
        }
}

int llmt_cuda_swiglu_fwd(llmt_device *dev, void *out, const void *gate_up, int64_t m, int64_t f,
                         int dt)
{
    LLMT_CUDA_CHECK_DT(dev, dt, "swiglu_fwd");
    if (m <= 0 || f <= 0)
        return LLMT_OK;
    LLMT_CUDA_DISPATCH(dt, T,
                       LLMT_LAUNCH(swiglu_grid(m, f), ROW_THREADS, llmt_cuda(dev)->stream,
                                   swiglu_fwd_kernel<T>)((T *)out, (const T *)gate_up, m, f));
    LLMT_CUDA_LAUNCHED(dev, "swiglu_fwd");
    return LLMT_OK;
}

int llmt_cuda_swiglu_bwd(llmt_device *dev, void *dgate_up, const void *dout, const void *gate_up,
                         int64_t m, int64_t f, int dt)
{
    LLMT_CUDA_CHECK_DT(dev, dt, "swiglu_bwd");
    if (m <= 0 || f <= 0)
        return LLMT_OK;
    LLMT_CUDA_DISPATCH(dt, T,
                       LLMT_LAUNCH(swiglu_grid(m, f), ROW_THREADS, llmt_cuda(dev)->stream,
                                   swiglu_bwd_kernel<T>)((T *)dgate_up, (const T *)dout,
                                                         (const T *)gate_up, m, f));
    LLMT_CUDA_LAUNCHED(dev, "swiglu_bwd");
    return LLMT_OK;
}

/* ---- residual add and dtype conversion */

/* y += x, a group of elements per thread and grid stride; X is T or fp32. */
template <typename T, typename X> __global__ void add_kernel(T *y, const X *x, int64_t n)
{
    for (int64_t e = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * LLMT_GROUP; e < n;
         e += (int64_t)gridDim.x * blockDim.x * LLMT_GROUP) {
        float yv[LLMT_GROUP], xv[LLMT_GROUP];
        const int k = group_len(e, n);
        load_group_f32(yv, y + e, k);
        load_group_f32(xv, x + e, k);
#pragma unroll
        for (int i = 0; i < LLMT_GROUP; i++)
            if (i < k)
                yv[i] = yv[i] + xv[i];
        store_group_f32(y + e, yv, k);
    }
}

/* Blocks of a grid-stride loop over the groups of n elements. */
static unsigned group_blocks(int64_t n)
{
    return llmt_cuda_blocks((n + LLMT_GROUP - 1) / LLMT_GROUP, ROW_THREADS);
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
                       LLMT_LAUNCH(group_blocks(n), ROW_THREADS, llmt_cuda(dev)->stream,
                                   add_kernel<T, T>)((T *)y, (const T *)x, n));
    LLMT_CUDA_LAUNCHED(dev, "add");
    return LLMT_OK;
}

int llmt_cuda_add_f32(llmt_device *dev, void *y, const float *x, int64_t n, int dt)
{
    LLMT_CUDA_CHECK_DT(dev, dt, "add");
    if (n <= 0)
        return LLMT_OK;
    LLMT_CUDA_DISPATCH(dt, T,
                       LLMT_LAUNCH(group_blocks(n), ROW_THREADS, llmt_cuda(dev)->stream,
                                   add_kernel<T, float>)((T *)y, x, n));
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
