/* llmt_model: a LLaMA-family decoder (the Hugging Face LlamaForCausalLM
 * architecture and tensor names), its parameters, gradients and activation
 * arena, on the backend of its context.
 *
 * Layers: token embedding; per layer RMSNorm -> attention (RoPE rotate-half,
 * grouped-query when kv_heads < heads, causal softmax) -> residual -> RMSNorm
 * -> SwiGLU FFN down(silu(gate(x)) * up(x)) -> residual; final RMSNorm; LM
 * head (its own weight, or the embedding's when tied); cross-entropy over next
 * tokens. */
#ifndef LLMT_MODEL_H
#define LLMT_MODEL_H

#include "llmt/common.h"
#include "llmt/context.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct llmt_model llmt_model;

/* What each precision mode stores in which dtype (docs/precision.md). */
typedef enum llmt_precision {
    LLMT_PRECISION_FP32 = 0,       /* everything fp32 */
    LLMT_PRECISION_BF16_MIXED = 1, /* bf16 weights, activations, grads; fp32 master and moments */
    LLMT_PRECISION_FP16_MIXED = 2, /* fp16 likewise, with the dynamic loss scaler */
    LLMT_PRECISION_BF16_PURE = 3   /* bf16 weights and moments, stochastic rounding */
} llmt_precision;

/* RoPE frequency scaling (llmt_model_config.rope_scaling). */
typedef enum llmt_rope_scaling {
    LLMT_ROPE_SCALING_NONE = 0,  /* inv_freq[i] = theta^(-2i / head_dim) */
    LLMT_ROPE_SCALING_LLAMA3 = 1 /* Llama 3.1's: low frequencies divided by rope_factor,
                                    a smooth blend between (docs/model.md) */
} llmt_rope_scaling;

/* Version 2 appended the RoPE scaling fields; version 1 structs (which end
 * at precision) are still accepted, as having no scaling. */
#define LLMT_MODEL_CONFIG_VERSION 2

typedef struct llmt_model_config {
    uint32_t version;     /* LLMT_MODEL_CONFIG_VERSION */
    int32_t vocab_size;   /* tokens */
    int32_t hidden_size;  /* model width d */
    int32_t num_layers;   /* decoder layers */
    int32_t num_heads;    /* attention heads; hidden_size = num_heads * head_dim */
    int32_t num_kv_heads; /* key/value heads; divides num_heads */
    int32_t ffn_size;     /* SwiGLU inner width */
    int32_t max_seq_len;  /* longest sequence a batch may have */
    float rms_norm_eps;   /* RMSNorm epsilon */
    float rope_theta;     /* RoPE base */
    int32_t tie_embeddings; /* 1: the LM head is the embedding matrix */
    int32_t precision;      /* llmt_precision */
    /* Version 2. The llama3 fields are read only when rope_scaling is
     * LLMT_ROPE_SCALING_LLAMA3 (Hugging Face rope_scaling {"rope_type":
     * "llama3", "factor", "low_freq_factor", "high_freq_factor",
     * "original_max_position_embeddings"}). */
    int32_t rope_scaling;          /* llmt_rope_scaling */
    float rope_factor;             /* >= 1 */
    float rope_low_freq_factor;    /* > 0 */
    float rope_high_freq_factor;   /* > rope_low_freq_factor */
    int32_t rope_original_max_len; /* >= 1: the context length trained before scaling */
} llmt_model_config;

/* A small default (vocab 256 bytes, d 128, 2 layers, 4 heads, 2 kv heads,
 * ffn 384, seq 256, eps 1e-5, theta 10000, untied, FP32, no RoPE scaling). */
#define LLMT_MODEL_CONFIG_INIT \
    {LLMT_MODEL_CONFIG_VERSION, 256, 128, 2, 4, 2, 384, 256, 1e-5f, 10000.0f, 0, \
     LLMT_PRECISION_FP32, LLMT_ROPE_SCALING_NONE, 0.0f, 0.0f, 0.0f, 0}

/* Fills cfg with the defaults of LLMT_MODEL_CONFIG_INIT. */
LLMT_API void llmt_model_config_init(llmt_model_config *cfg);

/* Creates a model on ctx and initialises its parameters deterministically
 * from the context's seed: linear and embedding weights N(0, 0.02^2), norm
 * weights 1 (docs/model.md). Gradients start at zero; their memory (GRADS)
 * is allocated at their first use (zero_grads, a backward, get/set_grad, an
 * optimizer step), where an optimizer's offload has placed them by then, so
 * a budget too small for them is refused there. cfg is required (NULL
 * is refused: an architecture has no default worth training by accident;
 * LLMT_MODEL_CONFIG_INIT is a small one). Errors: LLMT_EINVAL
 * naming the field, LLMT_EVERSION, LLMT_ENOMEM (budget), LLMT_EUNSUPPORTED.
 * The model borrows ctx, which must outlive it. */
LLMT_API int llmt_model_create(llmt_model **out, llmt_context *ctx, const llmt_model_config *cfg);

/* For llmt_model_create_from_file: the precision the file was saved in. */
#define LLMT_PRECISION_AS_SAVED (-1)

/* Creates a model on ctx from a file that says what it is, and loads its
 * weights: path is either a safetensors file whose __metadata__ holds the
 * configuration under "llmt.model_config" (llmt_model_save_safetensors and
 * checkpoints write it), a checkpoint directory (step-NNNNNNNN, e.g. from
 * llmt_ckpt_path), whose MANIFEST gives the configuration and whose
 * model.safetensors must match the manifest's size and checksum, or a
 * directory holding a config.json, read as llmt_model_create_from_hf does
 * (without its notes). precision is
 * an llmt_precision, or LLMT_PRECISION_AS_SAVED for the one the file records;
 * weights are converted as llmt_model_load_safetensors does (exact when the
 * precision is the saved one). Only the weights are loaded: to resume
 * training, use llmt_ckpt_load. Errors: LLMT_EINVAL (NULL argument, precision
 * out of range, a file without the configuration), LLMT_EIO and LLMT_ECORRUPT
 * naming the file, and those of llmt_model_create and
 * llmt_model_load_safetensors. The model is the caller's (llmt_model_free). */
LLMT_API int llmt_model_create_from_file(llmt_model **out, llmt_context *ctx, const char *path, int32_t precision);

/* Creates a model on ctx from a Hugging Face model directory (LlamaForCausalLM):
 * the architecture from dir/config.json, the weights from dir/model.safetensors
 * or from the shards that dir/model.safetensors.index.json names (F32, BF16
 * or F16). What config.json may say is in docs/interop.md; anything this
 * library does not implement (another architecture or model_type, a
 * rope_scaling type other than llama3, attention or MLP biases, another
 * activation, a head_dim other than hidden_size / num_attention_heads) is
 * refused with LLMT_EUNSUPPORTED naming the key. Every parameter must be
 * present exactly once; tensors that are not parameters but are implied by
 * config.json (rotary_emb.inv_freq, lm_head.weight of a tied model) are
 * skipped, each with a line in notes (caller buffer of notes_cap bytes,
 * NUL-terminated, cut to fit; NULL with 0 when not wanted). precision is an
 * llmt_precision, or LLMT_PRECISION_AS_SAVED: FP32 for F32 weights,
 * BF16_MIXED for BF16, FP16_MIXED for F16. Errors: LLMT_EINVAL (arguments, a
 * missing or extra tensor, a shape), LLMT_EUNSUPPORTED, LLMT_EIO and
 * LLMT_ECORRUPT naming the file and key or tensor, and those of
 * llmt_model_create. The model is the caller's (llmt_model_free). */
LLMT_API int llmt_model_create_from_hf(llmt_model **out, llmt_context *ctx, const char *dir, int32_t precision, char *notes, size_t notes_cap);

#define LLMT_HF_EXPORT_OPTIONS_VERSION 1

/* How llmt_model_export_hf writes a directory. */
typedef struct llmt_hf_export_options {
    uint32_t version;         /* LLMT_HF_EXPORT_OPTIONS_VERSION */
    int32_t dtype;            /* LLMT_DTYPE_F32, _BF16 or _F16: weights on disk and torch_dtype */
    uint64_t max_shard_bytes; /* 0: one model.safetensors; else shards of at most this
                                 many tensor bytes (a larger tensor gets a shard alone) */
    const char *tokenizer_dir; /* NULL, or a directory whose tokenizer files are copied */
    int32_t bos_token_id;     /* written to config.json; -1 writes null */
    int32_t eos_token_id;     /* likewise */
} llmt_hf_export_options;

/* BF16 weights, one file, no tokenizer, no BOS/EOS ids. */
#define LLMT_HF_EXPORT_OPTIONS_INIT \
    {LLMT_HF_EXPORT_OPTIONS_VERSION, LLMT_DTYPE_BF16, 0, NULL, -1, -1}

/* Fills opts with the defaults of LLMT_HF_EXPORT_OPTIONS_INIT. */
LLMT_API void llmt_hf_export_options_init(llmt_hf_export_options *opts);

/* Writes the model as a Hugging Face directory that
 * LlamaForCausalLM.from_pretrained(dir) loads: config.json, the weights
 * (model.safetensors, or model-0000k-of-0000n.safetensors shards and
 * model.safetensors.index.json) and, from opts->tokenizer_dir, whichever of
 * tokenizer.json, tokenizer.model, tokenizer_config.json,
 * special_tokens_map.json and added_tokens.json exist. Everything is
 * written and synced in a temporary directory beside dir, which is then
 * renamed to dir: dir must not exist, or be an empty directory, and a
 * failure leaves no dir behind. opts may be NULL (the defaults). Errors:
 * LLMT_EINVAL (arguments, options, dir exists and is not empty),
 * LLMT_EVERSION, LLMT_EIO naming the file, LLMT_ENOMEM. */
LLMT_API int llmt_model_export_hf(const llmt_model *model, const char *dir, const llmt_hf_export_options *opts);

/* Releases a model and everything it allocated; NULL is accepted. */
LLMT_API void llmt_model_free(llmt_model *model);

/* Copies the model's configuration into *out. */
LLMT_API int llmt_model_get_config(const llmt_model *model, llmt_model_config *out);

/* Number of parameters (elements), the tied embedding counted once. */
LLMT_API int64_t llmt_model_num_params(const llmt_model *model);

/* One micro-batch: forward, cross-entropy over targets, backward. tokens and
 * targets are host int32 arrays of batch * seq_len; a target of -1 is
 * ignored. The gradient of  grad_scale * sum(loss_i) / normaliser  over the
 * counted tokens is ADDED to the parameter gradients, so calls over slices of
 * one batch, each given the whole batch's count as normaliser, add up to the
 * gradient of the whole batch's mean loss. normaliser <= 0 means this call's
 * own count. grad_scale is the loss multiplier (the loss scale of mixed
 * precision; 1 otherwise). *loss (may be NULL) receives this call's mean loss
 * over its counted tokens (0 when none). Errors: LLMT_EINVAL (shapes, token
 * or target out of range, naming the position), LLMT_ENOMEM (the activation
 * arena does not fit; nothing is accumulated then). */
LLMT_API int llmt_model_forward_backward(llmt_model *model, const int32_t *tokens,
                                         const int32_t *targets, int32_t batch, int32_t seq_len,
                                         double grad_scale, double normaliser, double *loss);

/* Forward only: the mean loss over the counted targets (for evaluation);
 * gradients are not touched. */
LLMT_API int llmt_model_forward(llmt_model *model, const int32_t *tokens, const int32_t *targets,
                                int32_t batch, int32_t seq_len, double *loss);

/* Forward only: the logits of every position, fp32, into a caller buffer of
 * count = batch * seq_len * vocab_size floats. */
LLMT_API int llmt_model_logits(llmt_model *model, const int32_t *tokens, int32_t batch,
                               int32_t seq_len, float *out, size_t count);

/* Allocates the activation arena for micro-batches of up to batch sequences
 * of up to seq_len tokens under the current recompute policy, freeing the
 * old arena first. Forward calls within those bounds reuse it; a larger one,
 * or a policy change, lays it out anew. Errors: LLMT_ENOMEM (budget). */
LLMT_API int llmt_model_reserve_activations(llmt_model *model, int32_t batch, int32_t seq_len);

/* Frees the activation arena (the next forward allocates it again). */
LLMT_API int llmt_model_release_activations(llmt_model *model);

/* Sets every gradient to zero. */
LLMT_API int llmt_model_zero_grads(llmt_model *model);

#define LLMT_TENSOR_INFO_VERSION 1

typedef struct llmt_tensor_info {
    uint32_t version;  /* set by the caller: LLMT_TENSOR_INFO_VERSION */
    const char *name;  /* Hugging Face name; borrowed, lives as long as the model */
    int32_t ndim;      /* 1 or 2 */
    int64_t shape[4];  /* shape[0..ndim) */
    int64_t numel;     /* elements */
    int32_t dtype;     /* storage dtype of the parameter (llmt_dtype) */
} llmt_tensor_info;

#define LLMT_TENSOR_INFO_INIT {LLMT_TENSOR_INFO_VERSION, 0, 0, {0, 0, 0, 0}, 0, 0}

/* Number of named parameter tensors. */
LLMT_API int32_t llmt_model_num_tensors(const llmt_model *model);

/* Describes tensor `index` (0 <= index < llmt_model_num_tensors). */
LLMT_API int llmt_model_tensor_info(const llmt_model *model, int32_t index, llmt_tensor_info *out);

/* Index of the tensor with this Hugging Face name; LLMT_ENOTFOUND if none. */
LLMT_API int llmt_model_tensor_find(const llmt_model *model, const char *name, int32_t *index);

/* Copies a parameter out as fp32 into a caller buffer of exactly its numel. */
LLMT_API int llmt_model_get_param(const llmt_model *model, const char *name, float *out,
                                  size_t count);

/* Copies a parameter in from fp32 (rounded to the storage dtype). */
LLMT_API int llmt_model_set_param(llmt_model *model, const char *name, const float *in,
                                  size_t count);

/* Copies a parameter's gradient out as fp32. After a data-parallel
 * trainer step it is not the step's gradient (docs/distributed.md). */
LLMT_API int llmt_model_get_grad(const llmt_model *model, const char *name, float *out,
                                 size_t count);

/* Copies a gradient in from fp32 (for custom losses and tests). */
LLMT_API int llmt_model_set_grad(llmt_model *model, const char *name, const float *in,
                                 size_t count);

/* Writes the weights to a safetensors file under Hugging Face names, in
 * dtype (F32, BF16 or F16) on disk, with the configuration in __metadata__.
 * The file is written under a temporary name, synced and renamed into place:
 * a failure leaves any previous file at path untouched. */
LLMT_API int llmt_model_save_safetensors(const llmt_model *model, const char *path, int dtype);

/* Reads weights written by llmt_model_save_safetensors (or any safetensors
 * file with the same names and shapes, F32/BF16/F16). The header is validated
 * before anything is read and the model is changed only when every tensor
 * has been read: LLMT_ECORRUPT or LLMT_EINVAL with a message naming the
 * tensor leave the model as it was. */
LLMT_API int llmt_model_load_safetensors(llmt_model *model, const char *path);

#ifdef __cplusplus
}
#endif

#endif
