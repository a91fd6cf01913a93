/* CPU backend: memory functions. Device memory is host memory, 64-byte aligned. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "llmt/common.h"
#include "core/error.h"
#include "ops/cpu/cpu_backend.h"

#define CPU_ALIGNMENT 64

int llmt_cpu_mem_alloc(llmt_device *dev, size_t bytes, void **out)
{
    (void)dev;
    void *p = NULL;
    size_t rounded = (bytes + CPU_ALIGNMENT - 1) / CPU_ALIGNMENT * CPU_ALIGNMENT;
    if (rounded < bytes || posix_memalign(&p, CPU_ALIGNMENT, rounded) != 0)
        return llmt_fail(LLMT_ENOMEM, "cpu backend: malloc of %zu bytes failed", bytes);
    *out = p;
    return LLMT_OK;
}

void llmt_cpu_mem_free(llmt_device *dev, void *ptr)
{
    (void)dev;
    free(ptr);
}

int llmt_cpu_copy(llmt_device *dev, void *dst, const void *src, size_t bytes)
{
    (void)dev;
    if (bytes)
        memmove(dst, src, bytes);
    return LLMT_OK;
}

int llmt_cpu_mem_zero(llmt_device *dev, void *dst, size_t bytes)
{
    (void)dev;
    if (bytes)
        memset(dst, 0, bytes);
    return LLMT_OK;
}

int llmt_cpu_mem_info(llmt_device *dev, uint64_t *total, uint64_t *free_now)
{
    (void)dev;
    long page = sysconf(_SC_PAGESIZE);
    long pages = sysconf(_SC_PHYS_PAGES);
    long avail = sysconf(_SC_AVPHYS_PAGES);
    *total = (page > 0 && pages > 0) ? (uint64_t)page * (uint64_t)pages : 0;
    *free_now = (page > 0 && avail > 0) ? (uint64_t)page * (uint64_t)avail : 0;
    return LLMT_OK;
}

int llmt_cpu_synchronize(llmt_device *dev)
{
    (void)dev;
    return LLMT_OK;
}

void llmt_cpu_destroy(llmt_device *dev)
{
    llmt_cpu_device *cpu = (llmt_cpu_device *)dev;
    llmt_onednn_free(cpu->onednn);
    if (cpu->onednn_thread)
        for (int t = 0; t < dev->num_threads; t++)
            llmt_onednn_free(cpu->onednn_thread[t]);
    free(cpu->onednn_thread);
    free(cpu);
}

