/* The emulator's block scheduler (fibers) and the CUDA runtime and cuBLASLt
 * calls the plugin makes, as host functions over host memory. See
 * cuda_emu.h. */
#include "cuda_emu.h"

#include <cublasLt.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <ucontext.h>

#include <vector>

namespace emu {

uint3 thread_idx, block_idx;
dim3 block_dim, grid_dim;
uint64_t slot_sets[2][1024];
unsigned slot_turn[1024];

namespace {

enum { RUNNING, AT_BARRIER, DONE };

/* A fiber is made once (ucontext) and then reused for a thread of every
 * block; it switches with _setjmp/_longjmp, which unlike swapcontext make
 * no system call. Between blocks it is parked at the top of its loop. */
struct fiber {
    ucontext_t ctx;
    jmp_buf jb;
    int state;
    char *stack;
};

const size_t stack_bytes = 256 * 1024;
jmp_buf scheduler;
std::vector<fiber *> fibers;
unsigned current;
const std::function<void()> *body_fn;

void fiber_main()
{
    for (;;) {
        /* park until the scheduler hands this fiber a thread */
        if (!_setjmp(fibers[current]->jb))
            _longjmp(scheduler, 1);
        (*body_fn)();
        fibers[current]->state = DONE;
    }
}

/* Runs fiber t until its next barrier or its end. */
__attribute__((noinline)) void resume(unsigned t)
{
    current = t;
    thread_idx = make_uint3(t, 0, 0);
    fibers[t]->state = RUNNING;
    if (!_setjmp(scheduler))
        _longjmp(fibers[t]->jb, 1);
}

/* Runs the newest fiber to its parking point. */
__attribute__((noinline)) void start_newest()
{
    current = (unsigned)fibers.size() - 1;
    if (!_setjmp(scheduler))
        setcontext(&fibers[current]->ctx);
}

/* Makes fibers up to `threads`, each parked. */
void make_fibers(unsigned threads)
{
    while (fibers.size() < threads) {
        fiber *f = new fiber();
        f->stack = (char *)malloc(stack_bytes);
        getcontext(&f->ctx);
        f->ctx.uc_stack.ss_sp = f->stack;
        f->ctx.uc_stack.ss_size = stack_bytes;
        f->ctx.uc_link = NULL;
        makecontext(&f->ctx, fiber_main, 0);
        fibers.push_back(f);
        start_newest();
    }
}

/* Runs one block to completion. */
void run_block(unsigned threads, unsigned long long *round_counter)
{
    make_fibers(threads);
    for (unsigned t = 0; t < threads; t++) {
        fibers[t]->state = RUNNING;
        slot_turn[t] = 0;
    }
    for (;;) {
        /* Alternate the order between barriers, so a read that lacks a
         * barrier after another thread's write sees the wrong value in one
         * of the two orders. */
        const bool reverse = (*round_counter)++ % 2;
        for (unsigned n = 0; n < threads; n++) {
            unsigned t = reverse ? threads - 1 - n : n;
            if (fibers[t]->state != DONE)
                resume(t);
        }
        unsigned done = 0, waiting = 0;
        for (unsigned t = 0; t < threads; t++) {
            done += fibers[t]->state == DONE;
            waiting += fibers[t]->state == AT_BARRIER;
        }
        if (done == threads)
            return;
        if (waiting != threads) {
            fprintf(stderr, "cuda emulator: block (%u,%u,%u): %u threads finished while %u wait "
                    "at a barrier (divergent __syncthreads or shuffle)\n",
                    block_idx.x, block_idx.y, block_idx.z, done, waiting);
            abort();
        }
    }
}

} // namespace

void barrier()
{
    fibers[current]->state = AT_BARRIER;
    if (!_setjmp(fibers[current]->jb))
        _longjmp(scheduler, 1);
}

void run_grid(dim3 grid, dim3 block, const std::function<void()> &body)
{
    static unsigned long long rounds;
    const unsigned threads = block.x * block.y * block.z;
    if (block.y != 1 || block.z != 1 || threads == 0 || threads > 1024) {
        fprintf(stderr, "cuda emulator: unsupported block (%u,%u,%u)\n", block.x, block.y, block.z);
        abort();
    }
    block_dim = block;
    grid_dim = grid;
    body_fn = &body;
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                block_idx = make_uint3(x, y, z);
                run_block(threads, &rounds);
            }
}

} // namespace emu

/* ---- the CUDA runtime, on host memory */

extern "C" {

cudaError_t cudaGetLastError(void)
{
    return cudaSuccess;
}

const char *cudaGetErrorName(cudaError_t error)
{
    return error == cudaSuccess ? "cudaSuccess" : "cudaErrorEmulated";
}

const char *cudaGetErrorString(cudaError_t error)
{
    return error == cudaSuccess ? "no error" : "emulated error";
}

cudaError_t cudaGetDeviceCount(int *count)
{
    *count = 1;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device)
{
    return device == 0 ? cudaSuccess : cudaErrorInvalidDevice;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags)
{
    (void)flags;
    *stream = (cudaStream_t)malloc(1);
    return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
    free((void *)stream);
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
    (void)stream;
    return cudaSuccess;
}

cudaError_t cudaMalloc(void **ptr, size_t size)
{
    /* Like cudaMalloc: 256-byte aligned, contents undefined (poisoned). */
    size_t rounded = (size + 255) / 256 * 256;
    if (posix_memalign(ptr, 256, rounded ? rounded : 256) != 0)
        return cudaErrorMemoryAllocation;
    memset(*ptr, 0xA5, rounded);
    return cudaSuccess;
}

cudaError_t cudaFree(void *ptr)
{
    free(ptr);
    return cudaSuccess;
}

cudaError_t cudaMallocHost(void **ptr, size_t size)
{
    return cudaMalloc(ptr, size);
}

cudaError_t cudaFreeHost(void *ptr)
{
    free(ptr);
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_now, size_t *total)
{
    *free_now = (size_t)8 << 30;
    *total = (size_t)16 << 30;
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream)
{
    (void)kind;
    (void)stream;
    if (count)
        memmove(dst, src, count);
    return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *ptr, int value, size_t count, cudaStream_t stream)
{
    (void)stream;
    if (count)
        memset(ptr, value, count);
    return cudaSuccess;
}

/* ---- cuBLASLt: only the handle (the GEMM itself is emu_gemm.cpp) */

cublasStatus_t cublasLtCreate(cublasLtHandle_t *handle)
{
    *handle = (cublasLtHandle_t)malloc(1);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle)
{
    free((void *)handle);
    return CUBLAS_STATUS_SUCCESS;
}

const char *cublasLtGetStatusString(cublasStatus_t status)
{
    return status == CUBLAS_STATUS_SUCCESS ? "success" : "emulated error";
}

const char *cublasLtGetStatusName(cublasStatus_t status)
{
    return status == CUBLAS_STATUS_SUCCESS ? "CUBLAS_STATUS_SUCCESS" : "CUBLAS_STATUS_EMULATED";
}

} // extern "C"
