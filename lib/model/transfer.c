/* Host <-> device transfers with dtype conversion, through a bounded host
 * buffer so a large tensor never needs a second full copy. */
#include <stdlib.h>

#include "core/error.h"
#include "core/half.h"
#include "model/transfer.h"


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
    int64_t cap = n < LLMT_TRANSFER_CHUNK ? n : LLMT_TRANSFER_CHUNK;
    uint16_t *tmp = malloc((size_t)cap * sizeof *tmp);
    if (!tmp)
        return llmt_fail(LLMT_ENOMEM, "model transfer: out of host memory");
    int rc = LLMT_OK;
    for (int64_t done = 0; done < n && !rc; done += LLMT_TRANSFER_CHUNK) {
        int64_t k = n - done < LLMT_TRANSFER_CHUNK ? n - done : LLMT_TRANSFER_CHUNK;
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
    int64_t cap = n < LLMT_TRANSFER_CHUNK ? n : LLMT_TRANSFER_CHUNK;
    uint16_t *tmp = malloc((size_t)cap * sizeof *tmp);
    if (!tmp)
        return llmt_fail(LLMT_ENOMEM, "model transfer: out of host memory");
    int rc = LLMT_OK;
    for (int64_t done = 0; done < n && !rc; done += LLMT_TRANSFER_CHUNK) {
        int64_t k = n - done < LLMT_TRANSFER_CHUNK ? n - done : LLMT_TRANSFER_CHUNK;
        rc = m->ops->copy_to_host(m->dev, tmp, element(base, dt, off + done),
                                  (size_t)k * sizeof *tmp);
        for (int64_t i = 0; i < k && !rc; i++)
            dst[done + i] = dt == LLMT_DTYPE_BF16 ? llmt_bf16_to_f32(tmp[i])
                                                  : llmt_f16_to_f32(tmp[i]);
    }
    free(tmp);
    return rc;
}

int llmt_transfer_check(const llmt_model *m, const char *fn, const char *name, const void *host,
                        size_t count, const llmt_param **out)
{
    const llmt_param *p = llmt_model_find_param(m, fn, name);
    if (!p)
        return m && name ? LLMT_ENOTFOUND : LLMT_EINVAL;
    if (!host || count != (size_t)p->numel)
        return llmt_fail(LLMT_EINVAL, "%s: \"%s\" has %lld elements, buffer %s%zu", fn, name,
                         (long long)p->numel, host ? "count = " : "is NULL, count = ", count);
    *out = p;
    return LLMT_OK;
}

int llmt_transfer_tensor(const llmt_model *m, const char *fn, const char *name, void *base,
                         int dt, void *host, size_t count, int to_device)
{
    const llmt_param *p = NULL;
    LLMT_TRY(llmt_transfer_check(m, fn, name, host, count, &p));
    return to_device ? llmt_transfer_in(m, base, dt, p->offset, host, p->numel)
                     : llmt_transfer_out(m, base, dt, p->offset, host, p->numel);
}

void llmt_transfer_narrow(void *dst, int dt, const float *src, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        if (dt == LLMT_DTYPE_F32)
            ((float *)dst)[i] = src[i];
        else if (dt == LLMT_DTYPE_BF16)
            ((uint16_t *)dst)[i] = llmt_f32_to_bf16(src[i]);
        else
            ((uint16_t *)dst)[i] = llmt_f32_to_f16(src[i]);
    }
}

void llmt_transfer_widen(float *dst, const void *src, int dt, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        dst[i] = dt == LLMT_DTYPE_F32    ? ((const float *)src)[i]
                 : dt == LLMT_DTYPE_BF16 ? llmt_bf16_to_f32(((const uint16_t *)src)[i])
                                         : llmt_f16_to_f32(((const uint16_t *)src)[i]);
}

int llmt_transfer_weights_out(const llmt_model *m, int64_t off, int disk_dt, size_t byte_offset,
                              size_t bytes, void *dst, float *tmp)
{
    size_t es = llmt_dtype_size(disk_dt);
    if (byte_offset % es || bytes % es)
        return llmt_fail(LLMT_EINVAL, "range [%zu, +%zu) splits an element", byte_offset, bytes);
    off += (int64_t)(byte_offset / es);
    int64_t n = (int64_t)(bytes / es);
    if (disk_dt == m->dt)
        return m->ops->copy_to_host(m->dev, dst, llmt_model_at(m, &m->weights, off), bytes);
    for (int64_t done = 0; done < n; done += LLMT_TRANSFER_CHUNK) {
        int64_t k = n - done < LLMT_TRANSFER_CHUNK ? n - done : LLMT_TRANSFER_CHUNK;
        LLMT_TRY(llmt_transfer_out(m, m->weights.ptr, m->dt, off + done, tmp, k));
        llmt_transfer_narrow((char *)dst + (size_t)done * es, disk_dt, tmp, k);
    }
    return LLMT_OK;
}

int llmt_transfer_tensor_in(const llmt_model *m, void *base, int64_t off, int64_t numel,
                            llmt_st_file *f, size_t idx, void *raw, float *tmp)
{
    int dt = llmt_st_tensor_at(f, idx)->dtype;
    size_t es = llmt_dtype_size(dt);
    for (int64_t done = 0; done < numel; done += LLMT_TRANSFER_CHUNK) {
        int64_t k = numel - done < LLMT_TRANSFER_CHUNK ? numel - done : LLMT_TRANSFER_CHUNK;
        LLMT_TRY(llmt_st_read(f, idx, (size_t)done * es, raw, (size_t)k * es));
        llmt_transfer_widen(tmp, raw, dt, k);
        LLMT_TRY(llmt_transfer_in(m, base, m->dt, off + done, tmp, k));
    }
    return LLMT_OK;
}
