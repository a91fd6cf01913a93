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

/* partials: GS_BLOCKS doubles, GS_BLOCKS counts, then the two results. */
const size_t llmt_cuda_optim_scratch_bytes =
    (size_t)(2 * GS_BLOCKS + 2) * sizeof(double) + LLMT_CUDA_ALIGN;

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
        acc += (double)(x * x);
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

/* One AdamW element, as lib/ops/cpu/cpu_optim.c: WT the weights' (and
 * gradients') storage type, ST the moments'. */
template <typename WT, typename ST>
__global__ void adamw_kernel(llmt_adamw_args a)
{
    WT *w = (WT *)a.w;
    const WT *gr = (const WT *)a.g;
    ST *ms = (ST *)a.m, *vs = (ST *)a.v;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < a.n;
         i += (int64_t)gridDim.x * blockDim.x) {
        float m = to_f32(ms[i]), v = to_f32(vs[i]);
        float wv = a.master ? a.master[i] : to_f32(w[i]);
        float g = to_f32(gr[i]);
        g *= a.grad_factor;
        wv *= 1.0f - a.lr * a.weight_decay;
        m = a.beta1 * m + (1.0f - a.beta1) * g;
        v = a.beta2 * v + (1.0f - a.beta2) * g * g;
        const float denom = sqrtf(v) / sqrtf(a.bias_correction2) + a.eps;
        const float nw = wv - (a.lr / a.bias_correction1) * m / denom;
        ms[i] = from_f32<ST>(m);
        vs[i] = from_f32<ST>(v);
        if (a.master) {
            a.master[i] = nw;
            w[i] = from_f32<WT>(nw);
        } else if (a.stochastic) {
            /* Only BF16_PURE rounds stochastically (checked by the launcher). */
            const uint32_t r = philox_value(a.seed, 3 /* LLMT_STREAM_ROUNDING */,
                                            a.rng_offset + (uint64_t)i);
            ((__nv_bfloat16 *)w)[i] = bf16_stochastic(nw, r);
        } else {
            w[i] = from_f32<WT>(nw);
        }
    }
}

int llmt_cuda_adamw(llmt_device *dev, const llmt_adamw_args *a)
{
    llmt_cuda_backend *cb = llmt_cuda(dev);
    if (a->n <= 0)
        return LLMT_OK;
    const unsigned blocks = llmt_cuda_blocks(a->n, 256);
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
