/* Moving fp32 host data in and out of device buffers of any float dtype. */
#ifndef LLMT_MODEL_TRANSFER_H
#define LLMT_MODEL_TRANSFER_H

#include "ckpt/safetensors.h"
#include "model/model_internal.h"

/* Elements per step of the transfers: the host buffers the two functions at
 * the end take hold this many floats. */
#define LLMT_TRANSFER_CHUNK ((int64_t)1 << 20)

/* Writes n fp32 values at element offset off of device buffer base (dtype dt,
 * rounded to nearest even). */
int llmt_transfer_in(const llmt_model *m, void *base, int dt, int64_t off, const float *src,
                     int64_t n);

/* Reads n elements at element offset off of device buffer base as fp32. */
int llmt_transfer_out(const llmt_model *m, const void *base, int dt, int64_t off, float *dst,
                      int64_t n);

/* Copies the parameter named name of a flat buffer (base, dtype dt, in the
 * model's parameter order: weights, gradients or optimizer state) between
 * the device and a host fp32 buffer of exactly its numel; to_device copies
 * host -> device. fn names the public caller in messages: LLMT_ENOTFOUND for
 * an unknown name, LLMT_EINVAL for NULLs or a wrong count. */
int llmt_transfer_tensor(const llmt_model *m, const char *fn, const char *name, void *base,
                         int dt, void *host, size_t count, int to_device);

/* The checks of llmt_transfer_tensor: *out = the parameter named name when
 * host is non-NULL and count its numel (same errors and messages). */
int llmt_transfer_check(const llmt_model *m, const char *fn, const char *name, const void *host,
                        size_t count, const llmt_param **out);

/* Converts n fp32 values at src to dtype dt (F32, BF16 or F16; rounded to
 * nearest even) at host dst, and back: conversions on host memory. */
void llmt_transfer_narrow(void *dst, int dt, const float *src, int64_t n);
void llmt_transfer_widen(float *dst, const void *src, int dt, int64_t n);


/* Writes the n weights from element offset off to host dst in dtype disk_dt:
 * a straight copy when that is the model's dtype, else through fp32 in tmp
 * (LLMT_TRANSFER_CHUNK floats). byte_offset and bytes of the caller's range
 * must be whole elements of disk_dt (LLMT_EINVAL otherwise). */
int llmt_transfer_weights_out(const llmt_model *m, int64_t off, int disk_dt, size_t byte_offset,
                              size_t bytes, void *dst, float *tmp);

/* Reads safetensors tensor idx of f (F32, BF16 or F16, numel elements) into
 * device buffer base (the model's dtype) at element offset off, through raw
 * and tmp (LLMT_TRANSFER_CHUNK floats each). */
int llmt_transfer_tensor_in(const llmt_model *m, void *base, int64_t off, int64_t numel,
                            llmt_st_file *f, size_t idx, void *raw, float *tmp);

#endif
