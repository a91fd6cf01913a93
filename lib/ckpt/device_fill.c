/* Writing tensors that live in device memory (device_fill.h). */
#include <string.h>

#include "ckpt/device_fill.h"
#include "llmt/common.h"

int llmt_ckpt_fill_from_device(void *user, size_t ti, size_t off, void *dst, size_t bytes)
{
    const llmt_ckpt_device_src *src = (const llmt_ckpt_device_src *)user + ti;
    if (off < src->host_bytes) { /* the host segment's part */
        size_t take = src->host_bytes - off < bytes ? src->host_bytes - off : bytes;
        memcpy(dst, src->host + off, take);
        dst = (char *)dst + take;
        off += take;
        bytes -= take;
    }
    if (bytes == 0)
        return LLMT_OK;
    return src->m->ops->copy_to_host(src->m->dev, dst, src->base + (off - src->host_bytes),
                                     bytes);
}
