/* Optimizer offload (issue 15): which prefix of the flat parameter buffer
 * keeps its optimizer state in host memory, and what that costs. Shared by
 * the optimizer and the planner, so the plan and the measurement agree. */
#ifndef LLMT_OPTIM_OFFLOAD_H
#define LLMT_OPTIM_OFFLOAD_H

#include <stddef.h>
#include <stdint.h>

#include "llmt/optimizer.h"

/* Elements per transfer chunk on a backend whose memory the host cannot
 * read: the two staging buffers (gradients in, weights out) each have
 * LLMT_OFFLOAD_HALVES halves of this many weight-dtype elements, or of the
 * host segment if it is smaller; consecutive chunks alternate halves, so
 * the copies of one overlap the host's AdamW on the next (offload.c). */
#define LLMT_OFFLOAD_CHUNK ((int64_t)1 << 22)
/* Fixed: offload.c's pipeline alternates two halves (asserted there). */
#define LLMT_OFFLOAD_HALVES 2
/* The copy-stream fence of staging half h is LLMT_OFFLOAD_FENCE + h (ops.h's
 * LLMT_COPY_FENCES: 0 and 1 are the gradient buckets'). */
#define LLMT_OFFLOAD_FENCE 2

typedef struct llmt_model llmt_model;

/* The end P of the offloaded prefix [0, P) for layers (LLMT_OFFLOAD_ALL_LAYERS:
 * num_params; k: the offset of layer k's first parameter, num_layers: that of
 * the parameters after the last layer) under parts; 0 for LLMT_OFFLOAD_NONE.
 * layers must have been checked (llmt_offload_check). */
int64_t llmt_offload_prefix(const llmt_model *m, int32_t parts, int32_t layers);

/* Where the host segment of an optimizer owning [first, end) ends when the
 * prefix [0, prefix) is offloaded: prefix clamped to the range (the
 * optimizer's placement and the planner's both use it). */
int64_t llmt_offload_split_of(int64_t prefix, int64_t first, int64_t end);

/* Validates an offload parts value (NONE, OPTIMIZER, OPTIMIZER | GRADS),
 * naming fn and the argument `name` at fault (LLMT_EINVAL). */
int llmt_offload_check_parts(const char *fn, const char *name, int32_t parts);

/* Validates parts and layers for a model of num_layers layers, naming fn and
 * the argument at fault (LLMT_EINVAL). */
int llmt_offload_check(const char *fn, int32_t parts, int32_t layers, int64_t num_layers);

/* The gradient split of the placement (parts, layers) of m: the offloaded
 * prefix's end rounded down to a granule (llmt_grad_split) with
 * LLMT_OFFLOAD_GRADS, else 0. Never clamped to an optimizer's range: every
 * rank, sharded or not, holds the whole model's gradients (checked layers). */
int64_t llmt_offload_grad_split_of(const llmt_model *m, int32_t parts, int32_t layers);

/* Bytes of HOST_STATE staging for a host segment of host_elems elements of
 * weight dtype size w_size: 0 where the backend's memory is host memory. */
size_t llmt_offload_staging_bytes(int host_memory, int64_t host_elems, size_t w_size);

#endif
