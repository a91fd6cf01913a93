/* Writing tensors that live in device memory: a safetensors fill callback
 * (llmt_st_fill_fn) that copies each range from the device, for backends
 * whose memory the host cannot read. Shared by the single-file save
 * (save.c) and the shard files of a sharded save (shards.c). */
#ifndef LLMT_CKPT_DEVICE_FILL_H
#define LLMT_CKPT_DEVICE_FILL_H

#include <stddef.h>

#include "model/model_internal.h"

/* Where one tensor's bytes are: the model whose backend holds them, and the
 * device address of the tensor's first byte; or, for a tensor stored in two
 * segments (an offloaded optimizer's state section), its first host_bytes
 * in host memory at host and the rest on the device from base. */
typedef struct llmt_ckpt_device_src {
    const llmt_model *m;
    const char *base;
    const char *host; /* NULL: no host segment (host_bytes 0) */
    size_t host_bytes;
} llmt_ckpt_device_src;

/* llmt_st_fill_fn: user is an array of llmt_ckpt_device_src indexed by
 * tensor index (entry ti describes tensor ti); copies bytes [off, off +
 * bytes) of that tensor into dst: those of its host segment with memcpy,
 * the others from the device (ops->copy_to_host). Runs on the thread that
 * writes the file. */
int llmt_ckpt_fill_from_device(void *user, size_t ti, size_t off, void *dst, size_t bytes);

#endif
