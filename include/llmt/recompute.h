/* llmt_recompute: which activations each layer keeps for backward and which
 * it drops in forward and recomputes in backward. Recompute runs the same
 * ops on the same inputs, so gradients are bit-identical to keeping
 * everything; it trades compute for activation memory (docs/memory.md).
 *
 * Policies are flags and combine: LLMT_RECOMPUTE_ATTN_CORE |
 * LLMT_RECOMPUTE_FFN_ACT is the "selective" recompute of Korthikanti et al.
 * A recompute object is a handle on its model's per-layer policy: changes
 * take effect at the next forward (the activation arena is re-laid out then),
 * so they may be made between steps. */
#ifndef LLMT_RECOMPUTE_H
#define LLMT_RECOMPUTE_H

#include "llmt/common.h"
#include "llmt/model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct llmt_recompute llmt_recompute;

typedef enum llmt_recompute_policy {
    LLMT_RECOMPUTE_NONE = 0,      /* keep every activation */
    LLMT_RECOMPUTE_ATTN_CORE = 1, /* drop what attention keeps (CPU: the probabilities) */
    LLMT_RECOMPUTE_FFN_ACT = 2,   /* drop silu(gate) * up */
    LLMT_RECOMPUTE_FFN = 4,       /* drop the FFN's norm output, gate/up and product */
    LLMT_RECOMPUTE_FULL = 8       /* keep only the layer's input */
} llmt_recompute_policy;

/* Every valid combination of the flags above. */
#define LLMT_RECOMPUTE_MASK 15

/* Creates a handle on model's recompute policy (initially as the model has
 * it: NONE for a new model). The model must outlive it. */
LLMT_API int llmt_recompute_create(llmt_recompute **out, llmt_model *model);

/* Releases the handle (the model keeps the policy last set); NULL accepted. */
LLMT_API void llmt_recompute_free(llmt_recompute *rc);

/* Sets the policy of layers [first, first + count); count -1 means through
 * the last layer. Errors: LLMT_EINVAL for a range outside the model or an
 * unknown flag. */
LLMT_API int llmt_recompute_set_layers(llmt_recompute *rc, int32_t first, int32_t count,
                                       int32_t policy);

/* The policy of one layer, or a negative status for a bad argument. */
LLMT_API int32_t llmt_recompute_get_layer(const llmt_recompute *rc, int32_t layer);

/* Short name of a policy's flags ("none", "attn_core+ffn_act", ...); static. */
LLMT_API const char *llmt_recompute_policy_name(int32_t policy);

#ifdef __cplusplus
}
#endif

#endif
