/* The emulator's block scheduler (fibers) and the CUDA runtime and cuBLASLt
 * calls the plugin makes, as host functions over host memory. See
 * cuda_emu.h. */
#include "cuda_emu.h"

#include <cublasLt.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <ucontext.h>

#include <deque>
#include <iterator>
#include <map>
#include <mutex>
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
    /* A GPU's launch limits: a real launch beyond them fails. */
    if (threads == 0 || threads > 1024 || grid.x == 0 || grid.y == 0 || grid.z == 0 ||
        grid.x > 2147483647u || grid.y > 65535 || grid.z > 65535) {
        fprintf(stderr,
                "cuda emulator: launch of grid (%u,%u,%u), block (%u,%u,%u) beyond CUDA's "
                "limits (1 to 1024 threads a block; gridDim.x 1 to 2^31 - 1, .y and .z 1 "
                "to 65535)\n",
                grid.x, grid.y, grid.z, block.x, block.y, block.z);
        abort();
    }
    if (block.y != 1 || block.z != 1) {
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

} // extern "C"

/* Streams and events. Kernels, copies and memsets run at once on every
 * stream but a lazy one (the backend's copy stream, marked by
 * LLMT_CUDA_EMU_COPY_STREAM): its copies, to the host and to the device
 * alike, wait in a queue until something waits for them (an event recorded
 * after them, waited for by a stream or the host; a synchronize; a free), as
 * late as CUDA allows. The copy then reads its source when it runs, so a
 * missing wait before an op overwrites that source, or before the host or
 * an op reads the destination, gives wrong bits instead of passing by luck. */
namespace {

struct emu_copy {
    void *dst;
    const void *src;
    size_t count;
};

struct emu_stream {
    bool lazy;
    std::deque<emu_copy> queue; /* lazy: copies not yet run */
    uint64_t queued, done;      /* copies queued and run since creation */
};

/* Where an event was recorded: the lazy stream and the copies queued there
 * by then (NULL: complete at once). */
struct emu_event {
    emu_stream *stream;
    uint64_t seq;
};

std::vector<emu_stream *> lazy_streams;

emu_stream *as_stream(cudaStream_t s)
{
    return reinterpret_cast<emu_stream *>(s);
}

emu_event *as_event(cudaEvent_t e)
{
    return reinterpret_cast<emu_event *>(e);
}

/* Runs s's copies up to number seq. */
void run_until(emu_stream *s, uint64_t seq)
{
    while (s->done < seq && !s->queue.empty()) {
        const emu_copy c = s->queue.front();
        s->queue.pop_front();
        memmove(c.dst, c.src, c.count);
        s->done++;
    }
}

/* What a device-wide synchronization does: every lazy copy runs. */
void run_all_lazy()
{
    for (emu_stream *s : lazy_streams)
        run_until(s, s->queued);
}

} // namespace

void emu::lazy_stream(cudaStream_t stream)
{
    emu_stream *s = as_stream(stream);
    if (s && !s->lazy) {
        s->lazy = true;
        lazy_streams.push_back(s);
    }
}

extern "C" {

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags)
{
    (void)flags;
    *stream = reinterpret_cast<cudaStream_t>(new emu_stream());
    return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
    emu_stream *s = as_stream(stream);
    run_until(s, s->queued);
    for (size_t i = 0; i < lazy_streams.size(); i++)
        if (lazy_streams[i] == s)
            lazy_streams.erase(lazy_streams.begin() + (long)i);
    delete s;
    return cudaSuccess;
}

/* Kernels and copies are done at launch; a lazy stream's queued copies run
 * now, as a poll loop of queries would eventually see them done. */
cudaError_t cudaStreamQuery(cudaStream_t stream)
{
    emu_stream *s = as_stream(stream);
    if (s)
        run_until(s, s->queued);
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
    emu_stream *s = as_stream(stream);
    run_until(s, s->queued);
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void)
{
    run_all_lazy();
    return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags)
{
    (void)flags;
    *event = reinterpret_cast<cudaEvent_t>(new emu_event());
    return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event)
{
    delete as_event(event);
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
    emu_stream *s = as_stream(stream);
    emu_event *e = as_event(event);
    e->stream = s && s->lazy ? s : NULL; /* elsewhere all work before it is done */
    e->seq = s ? s->queued : 0;
    return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags)
{
    (void)stream;
    (void)flags;
    /* The waiter's later work runs at once (or, lazy, later still): the
     * work before the event must be done now. */
    emu_event *e = as_event(event);
    if (e->stream)
        run_until(e->stream, e->seq);
    return cudaSuccess;
}

/* The host waits for the work before the event: it is done now. */
cudaError_t cudaEventSynchronize(cudaEvent_t event)
{
    emu_event *e = as_event(event);
    if (e->stream)
        run_until(e->stream, e->seq);
    return cudaSuccess;
}

} // extern "C"

/* The live allocations of cudaMalloc (device) and cudaMallocHost (pinned
 * host), by start address, so that cudaPointerGetAttributes can tell
 * device memory from host memory although both are host memory here. */
namespace {

struct emu_alloc {
    size_t bytes;
    cudaMemoryType type;
};

std::mutex allocs_mutex;
std::map<const char *, emu_alloc> allocs;

/* Like cudaMalloc: 256-byte aligned, contents undefined (poisoned); recorded as type. */
cudaError_t allocate(void **ptr, size_t size, cudaMemoryType type)
{
    size_t rounded = (size + 255) / 256 * 256;
    if (!rounded)
        rounded = 256;
    if (posix_memalign(ptr, 256, rounded) != 0)
        return cudaErrorMemoryAllocation;
    memset(*ptr, 0xA5, rounded);
    std::lock_guard<std::mutex> hold(allocs_mutex);
    allocs[(const char *)*ptr] = emu_alloc{rounded, type};
    return cudaSuccess;
}

/* Frees synchronize the device, as CUDA's do: no queued copy outlives its
 * buffers. */
cudaError_t release(void *ptr)
{
    run_all_lazy();
    if (ptr) {
        std::lock_guard<std::mutex> hold(allocs_mutex);
        allocs.erase((const char *)ptr);
    }
    free(ptr);
    return cudaSuccess;
}

} // namespace

extern "C" {

cudaError_t cudaMalloc(void **ptr, size_t size)
{
    return allocate(ptr, size, cudaMemoryTypeDevice);
}

cudaError_t cudaFree(void *ptr)
{
    return release(ptr);
}

cudaError_t cudaMallocHost(void **ptr, size_t size)
{
    return allocate(ptr, size, cudaMemoryTypeHost);
}

cudaError_t cudaFreeHost(void *ptr)
{
    return release(ptr);
}

/* Device memory (inside a cudaMalloc allocation) of device 0, pinned host
 * memory (cudaMallocHost), or else ordinary host memory (unregistered). */
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes *attributes, const void *ptr)
{
    if (!attributes)
        return cudaErrorInvalidValue;
    memset(attributes, 0, sizeof *attributes);
    attributes->type = cudaMemoryTypeUnregistered;
    const char *p = (const char *)ptr;
    std::lock_guard<std::mutex> hold(allocs_mutex);
    auto after = allocs.upper_bound(p);
    if (after == allocs.begin())
        return cudaSuccess;
    auto at = std::prev(after);
    if (p >= at->first + at->second.bytes)
        return cudaSuccess;
    attributes->type = at->second.type;
    attributes->device = 0;
    attributes->devicePointer = (void *)ptr;
    attributes->hostPointer = at->second.type == cudaMemoryTypeHost ? (void *)ptr : NULL;
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
    emu_stream *s = as_stream(stream);
    if (s && s->lazy) {
        s->queue.push_back(emu_copy{dst, src, count});
        s->queued++;
    } else if (count) {
        memmove(dst, src, count);
    }
    return cudaSuccess;
}

/* A copy of height rows of width bytes between pitched buffers: a
 * cudaMemcpyAsync a row (lazy on the copy stream, in order, as one copy
 * would be); a pitch below the width is refused, as CUDA does. */
cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
                              size_t width, size_t height, enum cudaMemcpyKind kind,
                              cudaStream_t stream)
{
    if (width > dpitch || width > spitch)
        return cudaErrorInvalidPitchValue;
    for (size_t r = 0; r < height; r++)
        cudaMemcpyAsync((char *)dst + r * dpitch, (const char *)src + r * spitch, width, kind,
                        stream);
    return cudaSuccess;
}

cudaError_t cudaMemset(void *ptr, int value, size_t count)
{
    if (count)
        memset(ptr, value, count);
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
