/* Ordered accumulation's fp32 sum of every gradient, laid out as the
 * gradients are (grad_place.h): elements [0, split) in host memory beside
 * the offloaded gradients (HOST_STATE), [split, num_params) on the device
 * (GRADS). Each micro-batch's gradient, computed alone, is added to it
 * element by element in fp32 (the backend's accumulate op on the device
 * part, the CPU backend's on the host part), and the sum is rounded into
 * the gradients once at the end of the batch (the backends' cast ops), so
 * the bits do not depend on where the gradients live. */
#ifndef LLMT_MODEL_ORDERED_SUM_H
#define LLMT_MODEL_ORDERED_SUM_H

#include <stdint.h>

#include "core/buffer.h"

typedef struct llmt_model llmt_model;
typedef struct llmt_device llmt_device;

typedef struct llmt_ordered_sum {
    llmt_buf dev, host;
    int64_t split; /* the gradient split the buffers are laid out for */
    int live;      /* the buffers are allocated (either may be empty) */
    /* The CPU device that runs the host part's ops where the backend's
     * memory is not host memory (CUDA); NULL otherwise (the model's device
     * runs them). */
    llmt_device *host_dev;
} llmt_ordered_sum;

/* Bytes of the sum for a model of num_params parameters whose gradients
 * are split at grad_split: on the device and in host memory. */
void llmt_ordered_sum_bytes(int64_t num_params, int64_t grad_split, uint64_t *device,
                            uint64_t *host);

/* Starts a batch: (re)allocates the sum for the model's gradient split
 * when it has none or another split's, and sets it to the gradients held
 * now. On failure nothing is added to what was allocated before. */
int llmt_ordered_sum_begin(llmt_ordered_sum *s, llmt_model *m);

/* Adds the model's gradients (one micro-batch's) to the sum. */
int llmt_ordered_sum_add(llmt_ordered_sum *s, llmt_model *m);

/* Ends a batch: the sum becomes the model's gradients (swapped in fp32,
 * else rounded once to the gradients' dtype, to nearest even). */
int llmt_ordered_sum_end(llmt_ordered_sum *s, llmt_model *m);

/* Frees the sum (the next llmt_ordered_sum_begin allocates it again). */
void llmt_ordered_sum_release(llmt_ordered_sum *s, llmt_context *ctx);

#endif
