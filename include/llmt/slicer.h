/* llmt_slicer: runs a global batch of B sequences as micro-batches of at most
 * b sequences (the last may be smaller), accumulating into the model's
 * gradients, with the loss normalised over the global count of counted
 * targets. The gradient equals that of the unsliced batch up to fp32
 * summation order (and, in the 16-bit modes with in-place accumulation,
 * the rounding after each micro-batch); only the activations of one
 * micro-batch exist at once. */
#ifndef LLMT_SLICER_H
#define LLMT_SLICER_H

#include "llmt/common.h"
#include "llmt/model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct llmt_slicer llmt_slicer;

/* Creates a slicer for model with micro-batch b >= 1. The model must outlive it. */
LLMT_API int llmt_slicer_create(llmt_slicer **out, llmt_model *model, int32_t micro_batch);

/* Releases a slicer; NULL accepted. */
LLMT_API void llmt_slicer_free(llmt_slicer *slicer);

/* Changes the micro-batch (>= 1); the activation arena is resized at the
 * next forward_backward. */
LLMT_API int llmt_slicer_set_micro_batch(llmt_slicer *slicer, int32_t micro_batch);

/* The micro-batch, or -1 for NULL. */
LLMT_API int32_t llmt_slicer_micro_batch(const llmt_slicer *slicer);

/* How the micro-batches' gradients are summed. */
typedef enum llmt_accumulation {
    /* Each micro-batch's backward adds into the model's gradients (no
     * extra memory; the default). In the 16-bit modes the gradients are
     * stored in bf16 or fp16, so the sum is rounded to that dtype after
     * every micro-batch: k micro-batches round k times, and contributions
     * small against the running sum lose bits. */
    LLMT_ACCUMULATE_IN_PLACE = 0,
    /* Each micro-batch's gradient is computed alone, then added to a sum in
     * micro-batch order: the bits of a data-parallel run in
     * LLMT_REDUCE_DETERMINISTIC at any world size. The sum is fp32 in every
     * mode (it starts as the gradients held, widened) and the model's
     * gradients receive it rounded once (to nearest even) at the end of the
     * batch. Costs one fp32 gradient buffer, 4 bytes a parameter
     * (GRADIENTS), while a batch has more than one micro-batch; with
     * gradient offload (LLMT_OFFLOAD_GRADS) the offloaded gradients' part
     * of it is in host memory (HOST_STATE), added to by the host with the
     * same arithmetic, so the bits do not depend on the placement. */
    LLMT_ACCUMULATE_ORDERED = 1
} llmt_accumulation;

/* Sets the accumulation (llmt_accumulation). */
LLMT_API int llmt_slicer_set_accumulation(llmt_slicer *slicer, int32_t accumulation);

/* The accumulation, or -1 for NULL. */
LLMT_API int32_t llmt_slicer_accumulation(const llmt_slicer *slicer);

/* Forward and backward of a global batch (host int32 tokens and targets of
 * batch * seq_len, targets -1 ignored), adding to the gradients the gradient
 * of grad_scale * (mean loss over the batch's counted targets). The arena is
 * sized for min(micro_batch, batch) sequences. *loss (may be NULL) receives
 * the batch's mean loss. On error (LLMT_ENOMEM from the arena or the
 * ordered sum, under the budget or the host budget; bad tokens) the
 * gradients may hold part of the batch: zero them before retrying. */
LLMT_API int llmt_slicer_forward_backward(llmt_slicer *slicer, const int32_t *tokens,
                                          const int32_t *targets, int32_t batch, int32_t seq_len,
                                          double grad_scale, double *loss);

#ifdef __cplusplus
}
#endif

#endif
