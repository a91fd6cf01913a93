/* llmt_generator: text generation from a model with a key/value cache.
 *
 * A generator borrows a model and keeps, per layer, the keys and values of
 * the positions it has seen (the KV cache, device memory in the ACTIVATIONS
 * category; its scratch is WORKSPACE). Feeding tokens runs only the new
 * positions through the model; sampling follows Hugging Face generate:
 * logits / temperature (computed as (logits - their maximum) / temperature,
 * the same distribution, so that a tiny temperature cannot overflow), then
 * top-k, then top-p (nucleus), then a draw from the softmax of what is left,
 * with one uniform per token from the generator's own random stream of its
 * seed. Temperature 0 is greedy (the lowest index among equal maxima). The
 * model's weights are used as they are stored (fp32, bf16 or fp16); a change
 * to them makes the cache stale (llmt_generator_reset, or
 * llmt_generator_generate, which starts afresh). */
#ifndef LLMT_GENERATE_H
#define LLMT_GENERATE_H

#include "llmt/common.h"
#include "llmt/model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct llmt_generator llmt_generator;

#define LLMT_GENERATOR_CONFIG_VERSION 1

typedef struct llmt_generator_config {
    uint32_t version;    /* LLMT_GENERATOR_CONFIG_VERSION */
    int32_t max_context; /* positions the cache holds (prompt + new tokens); 0: the
                            model's max_seq_len, which is also the most allowed */
    float temperature;   /* 0: greedy; > 0: the logits are divided by it */
    int32_t top_k;       /* 0: off; k >= 1 keeps the tokens whose logit is at least
                            the k-th largest (ties kept, as Hugging Face does) */
    float top_p;         /* in (0, 1]; 1: off; else keeps the most likely tokens
                            whose probabilities first reach top_p (at least one) */
    uint64_t seed;       /* seed of the sampling stream */
} llmt_generator_config;

/* The model's context, temperature 1, no top-k, no top-p, seed 0. */
#define LLMT_GENERATOR_CONFIG_INIT {LLMT_GENERATOR_CONFIG_VERSION, 0, 1.0f, 0, 1.0f, 0}

/* Fills cfg with the defaults of LLMT_GENERATOR_CONFIG_INIT. */
LLMT_API void llmt_generator_config_init(llmt_generator_config *cfg);

/* Creates a generator for model (borrowed: it must outlive the generator)
 * and allocates its cache for cfg->max_context positions on the model's
 * context. cfg NULL means the defaults. Errors: LLMT_EINVAL (NULL out or
 * model, a field out of range, naming it), LLMT_EVERSION, LLMT_ENOMEM (the
 * context's budget), LLMT_EUNSUPPORTED (a backend without cached attention).
 * The generator is the caller's (llmt_generator_free). */
LLMT_API int llmt_generator_create(llmt_generator **out, llmt_model *model, const llmt_generator_config *cfg);

/* Releases a generator and its cache; NULL is accepted. */
LLMT_API void llmt_generator_free(llmt_generator *gen);

/* Empties the cache: the next token fed is at position 0. Errors:
 * LLMT_EINVAL (gen NULL). */
LLMT_API int llmt_generator_reset(llmt_generator *gen);

/* The number of positions in the cache, into *out. Errors: LLMT_EINVAL (gen
 * or out NULL). */
LLMT_API int llmt_generator_position(const llmt_generator *gen, int32_t *out);

/* Appends n >= 1 tokens to the cache (they are the positions from
 * llmt_generator_position on) and, when logits is not NULL, writes the fp32
 * logits that follow the last of them into logits (count must be the
 * vocabulary size). Errors: LLMT_EINVAL (NULL tokens, n < 1, a token out of
 * range naming its index, the cache would pass max_context, count; the
 * cache is unchanged then), and the backend's errors (the cache is then
 * emptied). */
LLMT_API int llmt_generator_feed(llmt_generator *gen, const int32_t *tokens, int32_t n, float *logits, size_t count);

/* Generates up to max_new tokens after the prompt, from an empty cache and
 * the start of the sampling stream, so a call is a pure function of the
 * model, the configuration and the arguments. Each token is sampled from the
 * logits that follow the tokens before it and written to out (cap >=
 * max_new tokens); *n_out receives the number written. Generation ends after
 * max_new tokens, or after stop_token is written (it is included; -1 for no
 * stop token). Errors: LLMT_EINVAL (NULL arguments, n_prompt < 1, max_new <
 * 0, n_prompt + max_new > max_context, cap < max_new, a prompt token or
 * stop_token out of range, naming it), and those of llmt_generator_feed. */
LLMT_API int llmt_generator_generate(llmt_generator *gen, const int32_t *prompt, int32_t n_prompt, int32_t max_new, int32_t stop_token, int32_t *out, size_t cap, int32_t *n_out);

#ifdef __cplusplus
}
#endif

#endif
