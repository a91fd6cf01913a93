/* Moving fp32 host data in and out of device buffers of any float dtype. */
#ifndef LLMT_MODEL_TRANSFER_H
#define LLMT_MODEL_TRANSFER_H

#include "model/model_internal.h"

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

#endif
