/* CPU backend: the fp32 gradient sum's accumulate op. */
#include <omp.h>

#include "ops/cpu/cpu_backend.h"
#include "ops/cpu/cpu_kernels.h"

/* sum[i] += x[i] widened to fp32: one fp32 addition per element, so the
 * result does not depend on the thread count. */
LLMT_INLINE void accumulate_band_t(float *sum, const void *x, int64_t n, int dt)
{
    for (int64_t i = 0; i < n; i++)
        sum[i] += get(x, dt, i);
}
LLMT_DTYPE_VARIANTS(accumulate_band, (float *sum, const void *x, int64_t n), sum, x, n)

int llmt_cpu_accumulate(llmt_device *dev, float *sum, const void *x, int64_t n, int dt)
{
    void (*band)(float *, const void *, int64_t) = LLMT_PICK(accumulate_band, dt);
#pragma omp parallel num_threads(threads_for(dev, n))
    {
        int64_t i0, i1;
        split_rows(n, omp_get_thread_num(), omp_get_num_threads(), &i0, &i1);
        band(sum + i0, cat(x, dt, i0), i1 - i0);
    }
    return LLMT_OK;
}
