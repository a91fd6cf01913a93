/* What the trainer needs of a slicer beyond the public API. */
#ifndef LLMT_MODEL_SLICER_INTERNAL_H
#define LLMT_MODEL_SLICER_INTERNAL_H

#include <stdint.h>

#include "llmt/slicer.h"

/* Bytes of the fp32 sum of every gradient that ordered accumulation holds
 * while a batch of `batch` sequences runs as micro-batches of `micro`,
 * with the gradients split at grad_split (grad_place.h): on the device
 * (GRADS) and in host memory (HOST_STATE); 4 bytes a parameter in all
 * when the slicer accumulates in order and the batch has more than one
 * micro-batch, else none. */
void llmt_slicer_sum_bytes(const llmt_slicer *s, int32_t batch, int32_t micro, int64_t grad_split,
                           uint64_t *device, uint64_t *host);

/* Host bytes of the ordered accumulation's sum allocated now (HOST_STATE). */
uint64_t llmt_slicer_sum_host_held(const llmt_slicer *s);

/* Frees the ordered accumulation's sum (the next batch that runs in order
 * allocates it again), so that a new layout's peak is measured without
 * the old one's sum. */
void llmt_slicer_release_sum(llmt_slicer *s);

#endif
