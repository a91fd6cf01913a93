/* CUDA backend: device memory, pinned host memory for staging, and copies
 * on the context's stream. Copies that involve the host wait for the stream;
 * everything else is queued, and copy_to_host_async runs on the copy stream.
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

/* The copy stream's ordering, which the emulator (running everything at
 * once) cannot show wrong, so it is argued here:
 * - The copy reads src after the ops that wrote it: `queued` is recorded on
 *   the compute stream at the call, after every op queued before it, and
 *   the copy stream waits for it before the copy. Reusing the one event is
 *   safe: cudaStreamWaitEvent takes the record made before it, and a later
 *   record does not change what an earlier wait waits for.
 * - Nothing overwrites src or reads dst too early: the caller's contract
 *   (ops.h) is to wait_fence(fence) first, which makes the compute stream
 *   wait for fence's last record, made on the copy stream after this copy
 *   (and, in stream order, after every earlier copy on it); the host's
 *   readers of dst call synchronize, which waits for both streams.
 * - Copies on the copy stream run in the order queued, so a later store of
 *   the same host bytes lands last. */
int llmt_cuda_copy_to_host_async(llmt_device *dev, void *dst, const void *src, size_t bytes,
                                 int fence)
{
    llmt_cuda_backend *cb = llmt_cuda(dev);
    if (fence < 0 || fence >= LLMT_COPY_FENCES)
        return cb->host->fail(LLMT_EINVAL, "CUDA copy to host (async): fence = %d is not in "
                              "0..%d", fence, LLMT_COPY_FENCES - 1);
    if (bytes == 0)
        return LLMT_OK;
    LLMT_CUDA_CHECK(dev, cudaEventRecord(cb->queued, cb->stream), "copy to host (async)");
    LLMT_CUDA_CHECK(dev, cudaStreamWaitEvent(cb->copy_stream, cb->queued, 0),
                    "copy to host (async)");
    LLMT_CUDA_CHECK(dev, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, cb->copy_stream),
                    "copy to host (async)");
    LLMT_CUDA_CHECK(dev, cudaEventRecord(cb->fence[fence], cb->copy_stream),
                    "copy to host (async)");
    return LLMT_OK;
}

int llmt_cuda_wait_fence(llmt_device *dev, int fence)
{
    llmt_cuda_backend *cb = llmt_cuda(dev);
    if (fence < 0 || fence >= LLMT_COPY_FENCES)
        return cb->host->fail(LLMT_EINVAL, "CUDA wait for copies: fence = %d is not in 0..%d",
                              fence, LLMT_COPY_FENCES - 1);
    LLMT_CUDA_CHECK(dev, cudaStreamWaitEvent(cb->stream, cb->fence[fence], 0), "wait for copies");
    return LLMT_OK;
}
