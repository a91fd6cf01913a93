/* Device helpers shared by the kernels: load/store of each storage dtype,
 * dtype dispatch, deterministic block reductions, Philox.
 *
 * Rules every kernel follows (and the CPU emulator of tests/gpu/emu checks):
 * __syncthreads, shuffles and ballots are reached by every thread of the
 * block the same number of times (no barrier under a condition that differs
 * between threads), and no floating-point atomics are used anywhere: every
 * sum is taken in a fixed order, so the same inputs give the same bits. */
#ifndef LLMT_CUDA_KERNELS_CUH
#define LLMT_CUDA_KERNELS_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

#include "cuda_backend.h"

/* ---- element conversion: storage dtype <-> fp32, round to nearest even */

__device__ __forceinline__ float to_f32(float x)
{
    return x;
}
__device__ __forceinline__ float to_f32(__nv_bfloat16 x)
{
    return __bfloat162float(x);
}
__device__ __forceinline__ float to_f32(__half x)
{
    return __half2float(x);
}

template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x)
{
    return x;
}
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x)
{
    return __float2bfloat16_rn(x);
}
template <> __device__ __forceinline__ __half from_f32<__half>(float x)
{
    return __float2half_rn(x);
}

/* Element i of a tensor whose dtype is known only at run time (cast). */
__device__ __forceinline__ float load_dt(const void *p, int dt, int64_t i)
{
    if (dt == LLMT_DTYPE_BF16)
        return to_f32(((const __nv_bfloat16 *)p)[i]);
    if (dt == LLMT_DTYPE_F16)
        return to_f32(((const __half *)p)[i]);
    return ((const float *)p)[i];
}

__device__ __forceinline__ void store_dt(void *p, int dt, int64_t i, float v)
{
    if (dt == LLMT_DTYPE_BF16)
        ((__nv_bfloat16 *)p)[i] = from_f32<__nv_bfloat16>(v);
    else if (dt == LLMT_DTYPE_F16)
        ((__half *)p)[i] = from_f32<__half>(v);
    else
        ((float *)p)[i] = v;
}

/* ---- 128-bit memory access
 *
 * The element-wise and row-wise kernels move elements in groups of
 * LLMT_GROUP (8: one 16-byte access of bf16 or fp16, two of fp32). A group
 * is moved with 16-byte loads and stores when it is whole and its first
 * element is 16-byte aligned; otherwise (a row's tail, a row starting at an
 * unaligned offset such as a qkv head) element by element. Either way each
 * element gets the same arithmetic, so the bits do not depend on the path. */
#define LLMT_GROUP 8

template <typename T> struct alignas(16) llmt_vec16 {
    T v[16 / sizeof(T)];
};

__device__ __forceinline__ bool llmt_aligned16(const void *p)
{
    return ((uintptr_t)p & 15u) == 0;
}

/* out[i] = p[i] for i < n (n <= LLMT_GROUP). */
template <typename T>
__device__ __forceinline__ void load_group(T (&out)[LLMT_GROUP], const T *p, int n)
{
    constexpr int V = 16 / sizeof(T);
    static_assert(LLMT_GROUP % V == 0, "a group is whole 16-byte vectors");
    if (n == LLMT_GROUP && llmt_aligned16(p)) {
#pragma unroll
        for (int j = 0; j < LLMT_GROUP / V; j++) {
            const llmt_vec16<T> x = reinterpret_cast<const llmt_vec16<T> *>(p)[j];
#pragma unroll
            for (int i = 0; i < V; i++)
                out[j * V + i] = x.v[i];
        }
    } else {
        for (int i = 0; i < n; i++)
            out[i] = p[i];
    }
}

/* p[i] = in[i] for i < n (n <= LLMT_GROUP). */
template <typename T>
__device__ __forceinline__ void store_group(T *p, const T (&in)[LLMT_GROUP], int n)
{
    constexpr int V = 16 / sizeof(T);
    if (n == LLMT_GROUP && llmt_aligned16(p)) {
#pragma unroll
        for (int j = 0; j < LLMT_GROUP / V; j++) {
            llmt_vec16<T> x;
#pragma unroll
            for (int i = 0; i < V; i++)
                x.v[i] = in[j * V + i];
            reinterpret_cast<llmt_vec16<T> *>(p)[j] = x;
        }
    } else {
        for (int i = 0; i < n; i++)
            p[i] = in[i];
    }
}

/* f[i] = p[i] widened to fp32, for i < n. */
template <typename T>
__device__ __forceinline__ void load_group_f32(float (&f)[LLMT_GROUP], const T *p, int n)
{
    T raw[LLMT_GROUP];
    load_group(raw, p, n);
#pragma unroll
    for (int i = 0; i < LLMT_GROUP; i++)
        if (i < n)
            f[i] = to_f32(raw[i]);
}

/* p[i] = f[i] rounded to T (nearest even), for i < n. */
template <typename T>
__device__ __forceinline__ void store_group_f32(T *p, const float (&f)[LLMT_GROUP], int n)
{
    T raw[LLMT_GROUP];
#pragma unroll
    for (int i = 0; i < LLMT_GROUP; i++)
        if (i < n)
            raw[i] = from_f32<T>(f[i]);
    store_group(p, raw, n);
}

/* Elements in the group starting at e of a range of n: LLMT_GROUP or the tail. */
__device__ __forceinline__ int group_len(int64_t e, int64_t n)
{
    return n - e < LLMT_GROUP ? (int)(n - e) : LLMT_GROUP;
}

/* Runs the statements with T the storage type of dt (F32, BF16 or F16;
 * callers have checked dt with LLMT_CUDA_CHECK_DT). */
#define LLMT_CUDA_DISPATCH(dt, T, ...)                                                      \
    do {                                                                                   \
        if ((dt) == LLMT_DTYPE_BF16) {                                                     \
            typedef __nv_bfloat16 T;                                                       \
            __VA_ARGS__;                                                                   \
        } else if ((dt) == LLMT_DTYPE_F16) {                                               \
            typedef __half T;                                                              \
            __VA_ARGS__;                                                                   \
        } else {                                                                           \
            typedef float T;                                                               \
            __VA_ARGS__;                                                                   \
        }                                                                                  \
    } while (0)

/* ---- deterministic block reductions
 *
 * A butterfly over the warp (every lane ends with the same value: IEEE
 * addition is commutative, so lane i and lane i ^ off add the same pair),
 * then every warp reduces the per-warp results the same way. The tree is
 * fixed by blockDim, so the result does not depend on scheduling. blockDim.x
 * must be a multiple of 32 and at most 1024; `shared` holds 32 values. */

template <typename V> __device__ __forceinline__ V warp_sum(V v)
{
    for (int off = 16; off > 0; off >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

__device__ __forceinline__ float warp_max(float v)
{
    for (int off = 16; off > 0; off >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}

template <typename V> __device__ __forceinline__ V block_sum(V v, V *shared)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    v = warp_sum(v);
    if (lane == 0)
        shared[warp] = v;
    __syncthreads();
    V w = lane < warps ? shared[lane] : (V)0;
    w = warp_sum(w);
    __syncthreads(); /* shared may be reused right after */
    return w;
}

__device__ __forceinline__ float block_max(float v, float *shared)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    v = warp_max(v);
    if (lane == 0)
        shared[warp] = v;
    __syncthreads();
    float w = lane < warps ? shared[lane] : -INFINITY;
    w = warp_max(w);
    __syncthreads();
    return w;
}

/* ---- Philox4x32-10, as lib/core/rng.h: counter {block lo, block hi,
 * stream lo, stream hi}, key {seed lo, seed hi}; value i of a stream is lane
 * i % 4 of block i / 4. */
__device__ __forceinline__ uint32_t philox_value(uint64_t seed, uint64_t stream, uint64_t index)
{
    const uint64_t block = index / 4;
    uint32_t c0 = (uint32_t)block, c1 = (uint32_t)(block >> 32), c2 = (uint32_t)stream,
             c3 = (uint32_t)(stream >> 32);
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int round = 0; round < 10; round++) {
        uint32_t hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
        uint32_t hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    switch (index % 4) {
    case 0: return c0;
    case 1: return c1;
    case 2: return c2;
    default: return c3;
    }
}

#endif
