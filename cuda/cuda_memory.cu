/* CUDA backend: device memory, pinned host memory for staging, and copies
 * on the context's stream. Copies that involve the host wait for the stream;
 * everything else is queued, and the async copies (both directions) run on
 * the copy stream.
 *
 * Copies let the runtime tell host from device pointers (cudaMemcpyDefault,
 * unified addressing): the library hands STAGING buffers, which are pinned
 * host memory here, to the copy functions like device memory (a model load
 * fills one with copy_to_device and moves it with copy_on_device). */
#include "cuda_backend.h"

int llmt_cuda_mem_alloc(llmt_device *dev, size_t bytes, void **out)
{
    LLMT_CUDA_CHECK(dev, cudaMalloc(out, bytes), "cudaMalloc");
    return LLMT_OK;
}

void llmt_cuda_mem_free(llmt_device *dev, void *ptr)
{
    (void)dev;
    cudaFree(ptr);
}

int llmt_cuda_host_alloc(llmt_device *dev, size_t bytes, void **out)
{
    LLMT_CUDA_CHECK(dev, cudaMallocHost(out, bytes), "cudaMallocHost");
    return LLMT_OK;
}

void llmt_cuda_host_free(llmt_device *dev, void *ptr)
{
    /* A copy queued from or to it may still be running, on either stream. */
    cudaStreamSynchronize(llmt_cuda(dev)->stream);
    cudaStreamSynchronize(llmt_cuda(dev)->copy_stream);
    cudaFreeHost(ptr);
}

/* Queues a copy; with wait, returns when it is done (the host side may be
 * reused or freed as soon as the call returns). */
static int cuda_copy(llmt_device *dev, void *dst, const void *src, size_t bytes, int wait,
                     const char *op)
{
    if (bytes == 0)
        return LLMT_OK;
    cudaStream_t stream = llmt_cuda(dev)->stream;
    LLMT_CUDA_CHECK(dev, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream), op);
    if (wait)
        LLMT_CUDA_CHECK(dev, cudaStreamSynchronize(stream), op);
    return LLMT_OK;
}

int llmt_cuda_copy_to_device(llmt_device *dev, void *dst, const void *src, size_t bytes)
{
    return cuda_copy(dev, dst, src, bytes, 1, "copy to device");
}

int llmt_cuda_copy_to_host(llmt_device *dev, void *dst, const void *src, size_t bytes)
{
    return cuda_copy(dev, dst, src, bytes, 1, "copy to host");
}

int llmt_cuda_copy_on_device(llmt_device *dev, void *dst, const void *src, size_t bytes)
{
    return cuda_copy(dev, dst, src, bytes, 0, "copy on device");
}

int llmt_cuda_mem_zero(llmt_device *dev, void *dst, size_t bytes)
{
    if (bytes == 0)
        return LLMT_OK;
    LLMT_CUDA_CHECK(dev, cudaMemsetAsync(dst, 0, bytes, llmt_cuda(dev)->stream), "memset");
    return LLMT_OK;
}

int llmt_cuda_mem_info(llmt_device *dev, uint64_t *total, uint64_t *free_now)
{
    size_t t = 0, f = 0;
    LLMT_CUDA_CHECK(dev, cudaMemGetInfo(&f, &t), "cudaMemGetInfo");
    *total = t;
    *free_now = f;
    return LLMT_OK;
}

int llmt_cuda_synchronize(llmt_device *dev)
{
    LLMT_CUDA_CHECK(dev, cudaStreamSynchronize(llmt_cuda(dev)->stream), "synchronize");
    LLMT_CUDA_CHECK(dev, cudaStreamSynchronize(llmt_cuda(dev)->copy_stream),
                    "synchronize (copy stream)");
    return LLMT_OK;
}

/* Checks fence for op; LLMT_OK or LLMT_EINVAL naming it. */
static int check_fence(llmt_device *dev, int fence, const char *op)
{
    if (fence < 0 || fence >= LLMT_COPY_FENCES)
        return llmt_cuda(dev)->host->fail(LLMT_EINVAL, "CUDA %s: fence = %d is not in 0..%d",
                                          op, fence, LLMT_COPY_FENCES - 1);
    return LLMT_OK;
}

/* The copy stream's ordering, argued here (the emulator runs the copy
 * stream's copies only when something waits for them, so a missing wait
 * changes bits there):
 * - A copy reads its source after the ops that wrote it: `queued` is
 *   recorded on the compute stream at the call, after every op queued
 *   before it, and the copy stream waits for it before the copy. Reusing
 *   the one event is safe: cudaStreamWaitEvent takes the record made before
 *   it, and a later record does not change what an earlier wait waits for.
 * - Copies on the copy stream run in the order queued (one stream), so a
 *   later copy of the same bytes lands last, and a fence's mark covers
 *   every copy queued before it.
 * - Nothing overwrites a source or reads a destination too early: the
 *   caller's contract (ops.h) is, on the device side, to wait_fence(fence)
 *   first, which makes the compute stream wait for fence's last record,
 *   and on the host side to fence_sync(fence) (or synchronize), which
 *   waits for it on the host. */
static int copy_async(llmt_device *dev, void *dst, const void *src, size_t bytes, int fence,
                      const char *op)
{
    llmt_cuda_backend *cb = llmt_cuda(dev);
    int rc = check_fence(dev, fence, op);
    if (rc || bytes == 0)
        return rc;
    LLMT_CUDA_CHECK(dev, cudaEventRecord(cb->queued, cb->stream), op);
    LLMT_CUDA_CHECK(dev, cudaStreamWaitEvent(cb->copy_stream, cb->queued, 0), op);
    LLMT_CUDA_CHECK(dev, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, cb->copy_stream), op);
    LLMT_CUDA_CHECK(dev, cudaEventRecord(cb->fence[fence], cb->copy_stream), op);
    return LLMT_OK;
}

int llmt_cuda_copy_to_host_async(llmt_device *dev, void *dst, const void *src, size_t bytes,
                                 int fence)
{
    return copy_async(dev, dst, src, bytes, fence, "copy to host (async)");
}

int llmt_cuda_copy_to_device_async(llmt_device *dev, void *dst, const void *src, size_t bytes,
                                   int fence)
{
    return copy_async(dev, dst, src, bytes, fence, "copy to device (async)");
}

int llmt_cuda_wait_fence(llmt_device *dev, int fence)
{
    int rc = check_fence(dev, fence, "wait for copies");
    if (rc)
        return rc;
    llmt_cuda_backend *cb = llmt_cuda(dev);
    LLMT_CUDA_CHECK(dev, cudaStreamWaitEvent(cb->stream, cb->fence[fence], 0), "wait for copies");
    return LLMT_OK;
}

/* cudaEventSynchronize on an event never recorded returns at once. */
int llmt_cuda_fence_sync(llmt_device *dev, int fence)
{
    int rc = check_fence(dev, fence, "host wait for copies");
    if (rc)
        return rc;
    LLMT_CUDA_CHECK(dev, cudaEventSynchronize(llmt_cuda(dev)->fence[fence]),
                    "host wait for copies");
    return LLMT_OK;
}
