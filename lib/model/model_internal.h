/* The model's internals: parameter table, per-layer offsets, the activation
 * arena and its layout. */
#ifndef LLMT_MODEL_INTERNAL_H
#define LLMT_MODEL_INTERNAL_H

#include "llmt/model.h"
#include "llmt/recompute.h"
#include "core/buffer.h"
#include "ops/ops.h"

typedef enum llmt_param_kind {
    LLMT_PARAM_NORM = 0,   /* RMSNorm weight: init 1, no weight decay by default */
    LLMT_PARAM_MATRIX = 1, /* linear layer: init N(0, 0.02^2) */
    LLMT_PARAM_EMBED = 2   /* embedding table: init N(0, 0.02^2) */
} llmt_param_kind;

/* One named tensor: a range of the flat parameter (and gradient) buffer. */
typedef struct llmt_param {
    char name[96];
    int32_t ndim;
    int64_t shape[2];
    int64_t numel;
    int64_t offset; /* elements from the start of the flat buffer */
    int kind;       /* llmt_param_kind */
} llmt_param;

/* Element offsets of a layer's weights. q, k, v are adjacent (one fused
 * [(H + 2 KV) hd, d] matrix) and so are gate and up ([2 F, d]). */
typedef struct llmt_layer_offsets {
    int64_t ln1, wqkv, wo, ln2, wgu, wdown;
} llmt_layer_offsets;

/* Dimensions derived from the config. */
typedef struct llmt_dims {
    int64_t vocab, d, layers, heads, kv_heads, head_dim, qkv_dim, att_dim, ffn, max_seq;
} llmt_dims;

void llmt_dims_from_config(const llmt_model_config *cfg, llmt_dims *out);

/* Storage dtype of parameters, gradients and activations for a precision. */
int llmt_precision_dtype(int precision);

/* Validates cfg (of the current version), naming the field at fault. */
int llmt_model_config_check(const llmt_model_config *cfg, const char *fn);

/* Copies a caller's configuration of any known version into *out as the
 * current version (fields a version lacks take their defaults), then
 * validates it. */
int llmt_model_config_upgrade(const llmt_model_config *in, llmt_model_config *out, const char *fn);

/* The activations of a layer, in their arena order. */
/* ACT_ATTN is what attention keeps for backward (backend-defined), ACT_ATT
 * its output. */
enum { ACT_X, ACT_RSTD1, ACT_H1, ACT_QKV, ACT_ATTN, ACT_ATT, ACT_XMID, ACT_RSTD2, ACT_H2, ACT_GU,
       ACT_S, ACT_COUNT };

#define LLMT_NO_OFFSET ((size_t)-1)

/* Everything sized by (config, dtype, recompute flags, batch, seq, threads).
 * The model allocates exactly this and the planner reports exactly this. */
typedef struct llmt_layout {
    int64_t batch, seq;
    size_t act_bytes;       /* ACTIVATIONS arena */
    size_t work_bytes;      /* WORKSPACE arena */
    size_t tokens, targets; /* int32 ids, in the activation arena */
    size_t x_final;         /* residual stream after the last layer (arena) */
    /* Workspace: final norm output and stats, gradient buffers, op scratch. */
    size_t hf, rstdf, g_res, g_h, g_wide, g_mid, scratch;
    /* Workspace slots holding one layer's activation of each kind that some
     * layer does not keep (LLMT_NO_OFFSET where every layer keeps it). */
    size_t slot[ACT_COUNT];
    /* num_layers * ACT_COUNT arena offsets, LLMT_NO_OFFSET when not kept;
     * NULL unless asked for. */
    size_t *off;
} llmt_layout;

/* Computes the layout for per-layer recompute flags rc_flags (NULL: none);
 * with want_offsets the per-layer offsets are allocated too. */
int llmt_layout_compute(const llmt_model_config *cfg, const uint8_t *rc_flags, int64_t batch,
                        int64_t seq, int num_threads, const llmt_backend_ops *ops,
                        int want_offsets, llmt_layout *out);
void llmt_layout_free(llmt_layout *l);

/* Constant buffers the model allocates besides parameters and gradients
 * (WORKSPACE): the RoPE table. */
size_t llmt_model_constant_bytes(const llmt_model_config *cfg);

struct llmt_model {
    llmt_context *ctx;
    const llmt_backend_ops *ops;
    llmt_device *dev;
    llmt_model_config cfg;
    llmt_dims dims;
    int dt; /* storage dtype */

    llmt_param *params;
    int32_t n_params;
    llmt_layer_offsets *layer;
    int64_t embed, norm, lm_head; /* element offsets; lm_head == embed when tied */
    int64_t num_params;

    llmt_buf weights, rope;
    /* Gradients (grad_place.h): elements [0, grad_split) in host_grads
     * (HOST_STATE; element i at i), [grad_split, num_params) in grads (GRADS;
     * element grad_split + i at i). grad_split is 0 (everything in grads,
     * the default) or a multiple of LLMT_SHARD_GRANULE. Backward writes an
     * offloaded bucket (one whose start is below grad_split) in grad_bucket
     * (GRADS), which holds bucket `loaded` (-1: none) between an acquire and
     * the next flush. host_grads has room for [0, its bytes / dtype size),
     * the home: all of [0, grad_split), or with grads_home_on_demand what
     * the stores have needed so far (grad_buckets.c). host_valid[b]: bucket
     * b's host part holds its gradient in host_grads, inside the home (else
     * that part is zero and host_grads' bytes there, if any, are stale). */
    llmt_buf grads, host_grads, grad_bucket;
    int64_t grad_split;
    int grads_live;      /* the three buffers are allocated (llmt_grads_ensure) */
    int grads_home_on_demand; /* llmt_grads_home_on_demand */
    int grads_all_zero;  /* every gradient is zero (llmt_grads_zero, _ensure; cleared by a write) */
    uint8_t *host_valid; /* per bucket (llmt_grad_bucket_count) */
    int32_t loaded;
    /* Slots of grad_bucket (bit k: slot k) that a queued exchange may
     * still read (llmt_grads_sent); cleared by llmt_grads_sent_joined. */
    uint8_t slots_sent;
    /* Counts changes made to the weights from outside the optimizer
     * (set_param, load), so mixed-precision master weights can follow. */
    uint64_t weights_epoch;
    uint8_t *rc_flags; /* per layer */

    /* The activation arena, allocated for (batch, seq, rc_flags). */
    llmt_layout layout;
    int have_arena;
    uint8_t *arena_flags; /* rc_flags the arena was laid out for */
    llmt_buf acts, work;
    /* Dimensions of the micro-batch being run (at most the arena's). */
    int64_t run_batch, run_seq;
    /* Called by backward as each gradient bucket's values become final
     * for the micro-batch, in the order L + 1, L, ..., 0 (the tail first,
     * the embedding last, L the model's layers); its failure ends backward.
     * NULL: none. Set around one micro-batch by the data-parallel step to
     * reduce gradients while backward runs (lib/train/dist.c). */
    int (*bucket_final)(void *user, int32_t bucket);
    void *bucket_final_user;
};

/* Device address of element offset off in buffer b of the model's dtype. */
static inline void *llmt_model_at(const llmt_model *m, const llmt_buf *b, int64_t off)
{
    return (char *)b->ptr + (size_t)off * llmt_dtype_size(m->dt);
}

/* The tensor named name, or NULL with LLMT_EINVAL (NULL arguments) or
 * LLMT_ENOTFOUND set; fn names the caller in the message. */
const llmt_param *llmt_model_find_param(const llmt_model *m, const char *fn, const char *name);

/* Builds the tensor table and offsets (params.c). */
int llmt_model_build_params(llmt_model *m);
/* Fills the weights with the documented initialisation (params.c). */
int llmt_model_init_weights(llmt_model *m);
/* Fills the RoPE cos/sin table (params.c). */
int llmt_model_init_rope(llmt_model *m);

/* Makes sure the activation arena holds (batch, seq) under the current flags. */
int llmt_model_prepare(llmt_model *m, int64_t batch, int64_t seq);

/* Lays the arena out for exactly (batch, seq) and the current flags. */
int llmt_model_allocate_arena(llmt_model *m, int64_t batch, int64_t seq);
/* Releases the activation arena. */
void llmt_model_release_arena(llmt_model *m);

/* Forward (and backward with want_grad) of one micro-batch already checked;
 * loss_sum and count receive the summed loss and counted targets. Returns
 * with no gradient bucket loaded (llmt_grads_flush), also on failure. */
int llmt_model_run(llmt_model *m, const int32_t *tokens, const int32_t *targets, int64_t batch,
                   int64_t seq, int want_grad, float row_grad_scale, double *loss_sum,
                   int64_t *count);

/* Whether layer flags keep activation `which` in the arena. */
int llmt_act_kept(uint8_t flags, int which);

/* Forward to the final norm output (in the workspace's hf). */
int llmt_model_forward_hidden(llmt_model *m, const int32_t *tokens, int64_t batch, int64_t seq);

/* Forward of a checked batch writing every position's fp32 logits to out. */
int llmt_model_run_logits(llmt_model *m, const int32_t *tokens, int64_t batch, int64_t seq,
                          float *out);

/* The backward pass after a forward with want_grad (backward.c). */
int llmt_model_backward(llmt_model *m);

/* Where layer_forward starts: the whole layer, the FFN block, or only the
 * SwiGLU product. */
enum { FWD_LAYER, FWD_FFN, FWD_SWIGLU };

/* Runs layer l's forward from `from`, writing kept activations to the arena
 * and the others to the recompute slots; with want_next also the residual
 * stream into layer l + 1's input. Forward and backward's recompute both use
 * it, so recompute runs the same ops on the same inputs. */
int llmt_layer_forward(llmt_model *m, int64_t l, int from, int want_next);

/* Device address of layer l's activation `which` (arena or slot); NULL for
 * attention state that is not kept. Layer num_layers's ACT_X is the final
 * residual stream. */
void *llmt_act_ptr(const llmt_model *m, int64_t l, int which);

#endif
