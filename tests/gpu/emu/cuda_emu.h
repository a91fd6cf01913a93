/* A CPU emulator for the CUDA backend's kernels, for checking their logic on
 * machines without a GPU. It is force-included (-include) when the plugin sources are
 * compiled as plain C++ by the host compiler (tests/gpu/emulate.sh).
 *
 * Each block runs alone; its threads are fibers (ucontext) run one after
 * another up to their next barrier, so __shared__ variables become static
 * locals shared by the block's fibers. __syncthreads, shuffles, ballots and
 * __syncthreads_or are barriers of the whole block: the emulator aborts when
 * threads of a block reach different numbers of them (the kernels are
 * written so that they never do), and it runs the fibers in alternating
 * order between barriers so that a missing barrier shows up as a wrong
 * result. Floating-point arithmetic is the host's (no FMA contraction). The
 * GEMM is not emulated here: emu_gemm.cpp replaces cuda_gemm.cu with a plain
 * loop, and the CUDA runtime calls are host functions (emu_runtime.cpp).
 * Work runs at launch, except the copies of the backend's copy stream, which
 * run only when waited for (so a missing wait shows up as wrong bits). */
#ifndef LLMT_CUDA_EMU_H
#define LLMT_CUDA_EMU_H

#define LLMT_CUDA_EMULATE 1

#define __global__
#define __device__
#define __host__
#define __shared__ static
#define __launch_bounds__(...)

#include <cuda_runtime.h>

#include <stdint.h>
#include <string.h>

#include <functional>

namespace emu {

/* The running fiber's coordinates (one OS thread runs every fiber). */
extern uint3 thread_idx, block_idx;
extern dim3 block_dim, grid_dim;

/* Waits until every thread of the block has arrived. */
void barrier();
/* The value slots collectives (shuffles, ballots, __syncthreads_or)
 * exchange through: two sets used alternately, so one barrier per
 * collective suffices (a set is written again only two collectives later,
 * after every thread has passed the barrier that follows its reads). */
extern uint64_t slot_sets[2][1024];
extern unsigned slot_turn[1024];

/* Publishes this thread's value and waits for the block; returns the set. */
static inline uint64_t *exchange(uint64_t v)
{
    uint64_t *set = slot_sets[slot_turn[thread_idx.x]++ & 1];
    set[thread_idx.x] = v;
    barrier();
    return set;
}

void run_grid(dim3 grid, dim3 block, const std::function<void()> &body);

/* Makes stream lazy: its copies run only when something waits for them
 * (emu_runtime.cpp). */
void lazy_stream(cudaStream_t stream);

template <typename K> struct launcher {
    dim3 grid, block;
    K kernel;
    template <typename... A> void operator()(A... args) const
    {
        K k = kernel;
        run_grid(grid, block, [&]() { k(args...); });
    }
};

template <typename K> launcher<K> launch(dim3 grid, dim3 block, K kernel)
{
    return launcher<K>{grid, block, kernel};
}

} // namespace emu

#define threadIdx (::emu::thread_idx)
#define blockIdx (::emu::block_idx)
#define blockDim (::emu::block_dim)
#define gridDim (::emu::grid_dim)

#define LLMT_LAUNCH(grid, block, stream, ...)                                              \
    ((void)(stream), ::emu::launch((grid), (block), __VA_ARGS__))
#define LLMT_CUDA_EMU_COPY_STREAM(stream) ::emu::lazy_stream(stream)

static inline void __syncthreads()
{
    ::emu::barrier();
}

static inline int __syncthreads_or(int p)
{
    const uint64_t *set = ::emu::exchange(p != 0);
    int any = 0;
    for (unsigned t = 0; t < blockDim.x; t++)
        any |= set[t] != 0;
    return any;
}

template <typename V> static inline V __shfl_xor_sync(unsigned mask, V v, int off)
{
    (void)mask;
    static_assert(sizeof(V) <= sizeof(uint64_t), "shuffle of a value wider than 8 bytes");
    uint64_t bits = 0;
    memcpy(&bits, &v, sizeof v);
    const uint64_t *set = ::emu::exchange(bits);
    const unsigned from = threadIdx.x ^ (unsigned)off;
    bits = set[from < blockDim.x ? from : threadIdx.x];
    V out;
    memcpy(&out, &bits, sizeof out);
    return out;
}

static inline unsigned __ballot_sync(unsigned mask, int p)
{
    (void)mask;
    const uint64_t *set = ::emu::exchange(p != 0);
    const unsigned w0 = threadIdx.x & ~31u;
    unsigned bits = 0;
    for (unsigned l = 0; l < 32 && w0 + l < blockDim.x; l++)
        bits |= (unsigned)(set[w0 + l] != 0) << l;
    return bits;
}

static inline int __ffs(int x)
{
    return __builtin_ffs(x);
}

static inline unsigned __umulhi(unsigned a, unsigned b)
{
    return (unsigned)(((unsigned long long)a * b) >> 32);
}

static inline unsigned __float_as_uint(float f)
{
    unsigned u;
    memcpy(&u, &f, sizeof u);
    return u;
}

#endif
