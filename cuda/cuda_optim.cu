/* CUDA optimizer kernels: the one-pass gradient statistics and the fused
 * AdamW update, with the CPU backend's arithmetic. This file is compiled
 * without FMA contraction (CMakeLists.txt), and sqrtf and division are
 * IEEE-rounded in CUDA's default mode, so an AdamW update gives the CPU's
 * bits, stochastic rounding included (same Philox values). */
#include <string.h>

#include "cuda_kernels.cuh"

/* grad_stats: GS_BLOCKS blocks each sum a fixed contiguous range; a single
 * thread then adds the blocks' partials in block order. */
#define GS_BLOCKS 1024
#define GS_THREADS 256
/* grad_stats_blocks: one CUDA block per block of the caller's, at most
 * GSB_LAUNCH of them per launch (what the scratch holds). */
#define GSB_LAUNCH 4096

/* The scratch of grad_stats: GS_BLOCKS doubles, GS_BLOCKS counts, then the
 * two results; of grad_stats_blocks: GSB_LAUNCH doubles, GSB_LAUNCH counts,
 * then the running count. The ops run one after another on the stream, so
 * they share it. */
#define GS_SCRATCH ((size_t)(2 * GS_BLOCKS + 2) * sizeof(double))
#define GSB_SCRATCH ((size_t)(2 * GSB_LAUNCH + 1) * sizeof(double))
const size_t llmt_cuda_optim_scratch_bytes =
    (GS_SCRATCH > GSB_SCRATCH ? GS_SCRATCH : GSB_SCRATCH) + LLMT_CUDA_ALIGN;

/* Block blockIdx.x's contiguous range of g: the sum of the exact double
 * squares of (factor g) (no fp32 square to overflow) and the non-finite count. */
template <typename T>
__global__ void __launch_bounds__(GS_THREADS)
    grad_stats_kernel(const T *g, int64_t n, float factor, double *part, long long *bad)
{
    __shared__ double red_d[32];
    __shared__ long long red_i[32];
    const int64_t i0 = n * blockIdx.x / gridDim.x, i1 = n * (blockIdx.x + 1) / gridDim.x;
    double acc = 0.0;
    long long count = 0;
    for (int64_t i = i0 + threadIdx.x; i < i1; i += blockDim.x) {
        const float x = to_f32(g[i]) * factor;
        count += (__float_as_uint(x) & 0x7f800000u) == 0x7f800000u;
        const double xd = x;
        acc += xd * xd;
    }
    acc = block_sum(acc, red_d);
    count = block_sum(count, red_i);
    if (threadIdx.x == 0) {
        part[blockIdx.x] = acc;
        bad[blockIdx.x] = count;
    }
}

__global__ void grad_stats_final_kernel(double *result, const double *part, const long long *bad,
                                        int blocks)
{
    if (blockIdx.x != 0 || threadIdx.x != 0)
        return;
    double total = 0.0;
    long long count = 0;
    for (int b = 0; b < blocks; b++) {
        total += part[b];
        count += bad[b];
    }
    result[0] = total;
    ((long long *)result)[1] = count;
}

int llmt_cuda_grad_stats(llmt_device *dev, const void *g, int64_t n, int dt, float factor,
                         double *sumsq, int64_t *nonfinite, void *scratch)
{
    const char *op = "grad_stats";
    LLMT_CUDA_CHECK_DT(dev, dt, op);
    llmt_cuda_backend *cb = llmt_cuda(dev);
    if (!scratch)
        return cb->host->fail(LLMT_EINVAL, "CUDA %s: scratch is NULL", op);
    double *part = (double *)llmt_cuda_align_ptr(scratch);
    long long *bad = (long long *)(part + GS_BLOCKS);
    double *result = (double *)(bad + GS_BLOCKS);
    double host[2] = {0.0, 0.0};
    if (n > 0) {
        LLMT_CUDA_DISPATCH(dt, T,
                           LLMT_LAUNCH(GS_BLOCKS, GS_THREADS, cb->stream, grad_stats_kernel<T>)(
                               (const T *)g, n, factor, part, bad));
        LLMT_LAUNCH(1, 32, cb->stream, grad_stats_final_kernel)(result, part, bad, GS_BLOCKS);
        LLMT_CUDA_LAUNCHED(dev, op);
        LLMT_CUDA_CHECK(dev, cudaMemcpyAsync(host, result, sizeof host, cudaMemcpyDeviceToHost,
                                             cb->stream), op);
        LLMT_CUDA_CHECK(dev, cudaStreamSynchronize(cb->stream), op);
    }
    long long count = 0;
    memcpy(&count, &host[1], sizeof count);
    *sumsq = host[0];
    *nonfinite = (int64_t)count;
    return LLMT_OK;
}

/* Block blockIdx.x of `block` elements from g (the last one ends at n):
 * the sum of the exact double squares of (factor g) over a fixed per-thread
 * stride and tree, so a partial depends only on its block's elements, not
 * on where the block sits in g or in the launch. */
template <typename T>
__global__ void __launch_bounds__(GS_THREADS)
    grad_stats_blocks_kernel(const T *g, int64_t n, int64_t block, float factor, double *part,
                             long long *bad)
{
    __shared__ double red_d[32];
    __shared__ long long red_i[32];
    const int64_t i0 = (int64_t)blockIdx.x * block;
    const int64_t i1 = n - i0 < block ? n : i0 + block;
    double acc = 0.0;
    long long count = 0;
    for (int64_t i = i0 + threadIdx.x; i < i1; i += blockDim.x) {
        const float x = to_f32(g[i]) * factor;
        count += (__float_as_uint(x) & 0x7f800000u) == 0x7f800000u;
        const double xd = x;
        acc += xd * xd;
    }
    acc = block_sum(acc, red_d);
    count = block_sum(count, red_i);
    if (threadIdx.x == 0) {
        part[blockIdx.x] = acc;
        bad[blockIdx.x] = count;
    }
}

/* *total = (first ? 0 : *total) + the sum of bad[0, blocks): one block. */
__global__ void __launch_bounds__(GS_THREADS)
    count_sum_kernel(long long *total, const long long *bad, int blocks, int first)
{
    __shared__ long long red_i[32];
    long long count = 0;
    for (int b = threadIdx.x; b < blocks; b += blockDim.x)
        count += bad[b];
    count = block_sum(count, red_i);
    if (threadIdx.x == 0)
        *total = (first ? 0 : *total) + count;
}

int llmt_cuda_grad_stats_blocks(llmt_device *dev, const void *g, int64_t n, int dt, float factor,
                                int64_t block, double *partials, int64_t *nonfinite,
                                void *scratch)
{
    const char *op = "grad_stats_blocks";
    LLMT_CUDA_CHECK_DT(dev, dt, op);
    llmt_cuda_backend *cb = llmt_cuda(dev);
    if (!scratch || !partials || !nonfinite || block <= 0 || n < 0)
        return cb->host->fail(LLMT_EINVAL, "CUDA %s: %s", op,
                              !scratch    ? "scratch is NULL"
                              : !partials ? "partials is NULL"
                              : !nonfinite ? "nonfinite is NULL"
                              : block <= 0 ? "block is not positive"
                                           : "n is negative");
    double *part = (double *)llmt_cuda_align_ptr(scratch);
    long long *bad = (long long *)(part + GSB_LAUNCH);
    long long *total = bad + GSB_LAUNCH;
    long long count = 0;
    const int64_t blocks = (n + block - 1) / block;
    /* Each launch's partials are copied out on the stream before the next
     * launch overwrites the scratch (stream order); one wait at the end. */
    for (int64_t b0 = 0; b0 < blocks; b0 += GSB_LAUNCH) {
        const int k = (int)(blocks - b0 < GSB_LAUNCH ? blocks - b0 : GSB_LAUNCH);
        const int64_t e0 = b0 * block;
        LLMT_CUDA_DISPATCH(dt, T,
                           LLMT_LAUNCH(k, GS_THREADS, cb->stream, grad_stats_blocks_kernel<T>)(
                               (const T *)g + e0, n - e0, block, factor, part, bad));
        LLMT_LAUNCH(1, GS_THREADS, cb->stream, count_sum_kernel)(total, bad, k, b0 == 0);
        LLMT_CUDA_LAUNCHED(dev, op);
        LLMT_CUDA_CHECK(dev, cudaMemcpyAsync(partials + b0, part, (size_t)k * sizeof(double),
                                             cudaMemcpyDeviceToHost, cb->stream), op);
    }
    if (blocks > 0) {
        LLMT_CUDA_CHECK(dev, cudaMemcpyAsync(&count, total, sizeof count, cudaMemcpyDeviceToHost,
                                             cb->stream), op);
        LLMT_CUDA_CHECK(dev, cudaStreamSynchronize(cb->stream), op);
    }
    *nonfinite = (int64_t)count;
    return LLMT_OK;
}

/* bf16 from fp32 rounding up with probability equal to the dropped fraction:
 * add 16 random bits below the kept ones, then truncate (inf and NaN are
 * rounded to nearest, which keeps them). */
__device__ __forceinline__ __nv_bfloat16 bf16_stochastic(float f, uint32_t random)
{
    const uint32_t u = __float_as_uint(f);
    if ((u & 0x7f800000u) == 0x7f800000u)
        return __float2bfloat16_rn(f);
    const unsigned short bits = (unsigned short)((u + (random & 0xffffu)) >> 16);
    __nv_bfloat16_raw raw;
    raw.x = bits;
    return __nv_bfloat16(raw);
}

/* AdamW, as lib/ops/cpu/cpu_optim.c: WT the weights' (and gradients')
 * storage type, ST the moments'. A thread updates a group of LLMT_GROUP
 * elements at a time (16-byte accesses where aligned), each element with
 * the CPU's arithmetic. */
template <typename WT, typename ST>
__global__ void adamw_kernel(llmt_adamw_args a)
{
    WT *w = (WT *)a.w;
    const WT *gr = (const WT *)a.g;
    ST *ms = (ST *)a.m, *vs = (ST *)a.v;
    for (int64_t e = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * LLMT_GROUP; e < a.n;
         e += (int64_t)gridDim.x * blockDim.x * LLMT_GROUP) {
        const int n = group_len(e, a.n);
        float m[LLMT_GROUP], v[LLMT_GROUP], wv[LLMT_GROUP], g[LLMT_GROUP];
        load_group_f32(m, ms + e, n);
        load_group_f32(v, vs + e, n);
        if (a.master)
            load_group(wv, a.master + e, n);
        else
            load_group_f32(wv, w + e, n);
        load_group_f32(g, gr + e, n);
        WT out[LLMT_GROUP];
        __nv_bfloat16 rounded[LLMT_GROUP]; /* stochastic rounding's (w is bf16 then) */
        const bool stochastic = !a.master && a.stochastic;
#pragma unroll
        for (int i = 0; i < LLMT_GROUP; i++) {
            if (i >= n)
                continue;
            g[i] *= a.grad_factor;
            wv[i] *= 1.0f - a.lr * a.weight_decay;
            m[i] = a.beta1 * m[i] + (1.0f - a.beta1) * g[i];
            v[i] = a.beta2 * v[i] + (1.0f - a.beta2) * g[i] * g[i];
            const float denom = sqrtf(v[i]) / sqrtf(a.bias_correction2) + a.eps;
            wv[i] = wv[i] - (a.lr / a.bias_correction1) * m[i] / denom;
            if (stochastic) {
                /* Only BF16_PURE rounds stochastically (checked by the launcher). */
                const uint32_t r = philox_value(a.seed, 3 /* LLMT_STREAM_ROUNDING */,
                                                a.rng_offset + (uint64_t)(e + i));
                rounded[i] = bf16_stochastic(wv[i], r);
            } else {
                out[i] = from_f32<WT>(wv[i]);
            }
        }
        store_group_f32(ms + e, m, n);
        store_group_f32(vs + e, v, n);
        if (a.master)
            store_group(a.master + e, wv, n);
        if (stochastic)
            store_group((__nv_bfloat16 *)w + e, rounded, n);
        else
            store_group(w + e, out, n);
    }
}

int llmt_cuda_adamw(llmt_device *dev, const llmt_adamw_args *a)
{
    llmt_cuda_backend *cb = llmt_cuda(dev);
    if (a->n <= 0)
        return LLMT_OK;
    const unsigned blocks = llmt_cuda_blocks((a->n + LLMT_GROUP - 1) / LLMT_GROUP, 256);
    const int f32 = LLMT_DTYPE_F32, bf16 = LLMT_DTYPE_BF16, f16 = LLMT_DTYPE_F16;
    /* The combinations the CPU backend supports (the precision modes). */
    if (a->w_dt == f32 && a->state_dt == f32 && !a->master && !a->stochastic)
        LLMT_LAUNCH(blocks, 256, cb->stream, adamw_kernel<float, float>)(*a);
    else if (a->w_dt == bf16 && a->state_dt == f32 && a->master)
        LLMT_LAUNCH(blocks, 256, cb->stream, adamw_kernel<__nv_bfloat16, float>)(*a);
    else if (a->w_dt == f16 && a->state_dt == f32 && a->master)
        LLMT_LAUNCH(blocks, 256, cb->stream, adamw_kernel<__half, float>)(*a);
    else if (a->w_dt == bf16 && a->state_dt == bf16 && !a->master)
        LLMT_LAUNCH(blocks, 256, cb->stream, adamw_kernel<__nv_bfloat16, __nv_bfloat16>)(*a);
    else
        return cb->host->fail(LLMT_EUNSUPPORTED, "CUDA adamw: weights %s, state %s%s%s",
                              llmt_cuda_dt_name(a->w_dt), llmt_cuda_dt_name(a->state_dt),
                              a->master ? " with master weights" : "",
                              a->stochastic ? " with stochastic rounding" : "");
    LLMT_CUDA_LAUNCHED(dev, "adamw");
    return LLMT_OK;
}

/* ---- the fp32 gradient sum (ops.h's accumulate) */

template <typename T> __global__ void accumulate_kernel(float *sum, const T *x, int64_t n)
{
    for (int64_t e = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * LLMT_GROUP; e < n;
         e += (int64_t)gridDim.x * blockDim.x * LLMT_GROUP) {
        const int k = group_len(e, n);
        float s[LLMT_GROUP], xv[LLMT_GROUP];
        load_group(s, sum + e, k);
        load_group_f32(xv, x + e, k);
#pragma unroll
        for (int i = 0; i < LLMT_GROUP; i++)
            if (i < k)
                s[i] += xv[i];
        store_group(sum + e, s, k);
    }
}

int llmt_cuda_accumulate_on(llmt_device *dev, cudaStream_t stream, float *sum, const void *x,
                            int64_t n, int dt)
{
    LLMT_CUDA_CHECK_DT(dev, dt, "accumulate");
    if (n <= 0)
        return LLMT_OK;
    LLMT_CUDA_DISPATCH(dt, T,
                       LLMT_LAUNCH(llmt_cuda_blocks((n + LLMT_GROUP - 1) / LLMT_GROUP, 256), 256,
                                   stream, accumulate_kernel<T>)(sum, (const T *)x, n));
    LLMT_CUDA_LAUNCHED(dev, "accumulate");
    return LLMT_OK;
}

int llmt_cuda_accumulate(llmt_device *dev, float *sum, const void *x, int64_t n, int dt)
{
    return llmt_cuda_accumulate_on(dev, llmt_cuda(dev)->stream, sum, x, n, dt);
}
