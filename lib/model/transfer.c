/* Host <-> device transfers with dtype conversion, through a bounded host
 * buffer so a large tensor never needs a second full copy. */
#include <stdlib.h>

#include "core/error.h"
#include "core/half.h"
#include "model/transfer.h"

#define TRANSFER_CHUNK ((int64_t)1 << 20)

static void *element(const void *base, int dt, int64_t off)
{
    return (char *)base + (size_t)off * llmt_dtype_size(dt);
}

int llmt_transfer_in(const llmt_model *m, void *base, int dt, int64_t off, const float *src,
                     int64_t n)
{
    if (dt == LLMT_DTYPE_F32)
        return m->ops->copy_to_device(m->dev, element(base, dt, off), src,
                                      (size_t)n * sizeof(float));
    uint16_t *tmp = malloc((size_t)(n < TRANSFER_CHUNK ? n : TRANSFER_CHUNK) * sizeof *tmp);
    if (!tmp)
        return llmt_fail(LLMT_ENOMEM, "model transfer: out of host memory");
    int rc = LLMT_OK;
    for (int64_t done = 0; done < n && !rc; done += TRANSFER_CHUNK) {
        int64_t k = n - done < TRANSFER_CHUNK ? n - done : TRANSFER_CHUNK;
        for (int64_t i = 0; i < k; i++)
            tmp[i] = dt == LLMT_DTYPE_BF16 ? llmt_f32_to_bf16(src[done + i])
                                           : llmt_f32_to_f16(src[done + i]);
        rc = m->ops->copy_to_device(m->dev, element(base, dt, off + done), tmp,
                                    (size_t)k * sizeof *tmp);
    }
    free(tmp);
    return rc;
}

int llmt_transfer_out(const llmt_model *m, const void *base, int dt, int64_t off, float *dst,
                      int64_t n)
{
    if (dt == LLMT_DTYPE_F32)
        return m->ops->copy_to_host(m->dev, dst, element(base, dt, off),
                                    (size_t)n * sizeof(float));
    uint16_t *tmp = malloc((size_t)(n < TRANSFER_CHUNK ? n : TRANSFER_CHUNK) * sizeof *tmp);
    if (!tmp)
        return llmt_fail(LLMT_ENOMEM, "model transfer: out of host memory");
    int rc = LLMT_OK;
    for (int64_t done = 0; done < n && !rc; done += TRANSFER_CHUNK) {
        int64_t k = n - done < TRANSFER_CHUNK ? n - done : TRANSFER_CHUNK;
        rc = m->ops->copy_to_host(m->dev, tmp, element(base, dt, off + done),
                                  (size_t)k * sizeof *tmp);
        for (int64_t i = 0; i < k && !rc; i++)
            dst[done + i] = dt == LLMT_DTYPE_BF16 ? llmt_bf16_to_f32(tmp[i])
                                                  : llmt_f16_to_f32(tmp[i]);
    }
    free(tmp);
    return rc;
}

int llmt_transfer_tensor(const llmt_model *m, const char *fn, const char *name, void *base,
                         int dt, void *host, size_t count, int to_device)
{
    const llmt_param *p = llmt_model_find_param(m, fn, name);
    if (!p)
        return m && name ? LLMT_ENOTFOUND : LLMT_EINVAL;
    if (!host || count != (size_t)p->numel)
        return llmt_fail(LLMT_EINVAL, "%s: \"%s\" has %lld elements, buffer %s%zu", fn, name,
                         (long long)p->numel, host ? "count = " : "is NULL, count = ", count);
    return to_device ? llmt_transfer_in(m, base, dt, p->offset, host, p->numel)
                     : llmt_transfer_out(m, base, dt, p->offset, host, p->numel);
}
