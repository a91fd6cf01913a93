/* What the trainer needs of a slicer beyond the public API. */
#ifndef LLMT_MODEL_SLICER_INTERNAL_H
#define LLMT_MODEL_SLICER_INTERNAL_H

#include <stdint.h>

#include "llmt/slicer.h"

/* Bytes of the fp32 sum of every gradient that ordered accumulation holds
 * (GRADS) while a batch of `batch` sequences runs as micro-batches of
 * `micro`: num_params x 4 when the slicer accumulates in order and the
 * batch has more than one micro-batch, else 0. */
uint64_t llmt_slicer_sum_bytes(const llmt_slicer *s, int32_t batch, int32_t micro);

/* Frees the ordered accumulation's sum (the next batch that runs in order
 * allocates it again), so that a new layout's peak is measured without
 * the old one's sum. */
void llmt_slicer_release_sum(llmt_slicer *s);

#endif
