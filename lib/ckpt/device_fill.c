/* Writing tensors that live in device memory (device_fill.h). */
#include "ckpt/device_fill.h"

int llmt_ckpt_fill_from_device(void *user, size_t ti, size_t off, void *dst, size_t bytes)
{
    const llmt_ckpt_device_src *src = (const llmt_ckpt_device_src *)user + ti;
    return src->m->ops->copy_to_host(src->m->dev, dst, src->base + off, bytes);
}
