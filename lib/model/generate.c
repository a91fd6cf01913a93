/* llmt_generator's public functions: argument checks, the cache's
 * allocation and the generation loop (include/llmt/generate.h). */
#include <math.h>
#include <stdlib.h>

#include "core/error.h"
#include "core/rng.h"
#include "model/generate_internal.h"

void llmt_generator_config_init(llmt_generator_config *cfg)
{
    if (cfg)
        *cfg = (llmt_generator_config)LLMT_GENERATOR_CONFIG_INIT;
}

/* Checks cfg against model m and resolves max_context 0 into *out. */
static int check_config(const llmt_generator_config *cfg, const llmt_model *m,
                        llmt_generator_config *out)
{
    const char *fn = "llmt_generator_create";
    if (cfg->version != LLMT_GENERATOR_CONFIG_VERSION)
        return llmt_fail(LLMT_EVERSION, "%s: cfg->version = %u (this library knows %d)", fn,
                         cfg->version, LLMT_GENERATOR_CONFIG_VERSION);
    if (cfg->max_context < 0 || cfg->max_context > m->cfg.max_seq_len)
        return llmt_fail(LLMT_EINVAL, "%s: cfg->max_context = %d (need 0 for the model's "
                         "max_seq_len, or 1..%d)", fn, cfg->max_context, m->cfg.max_seq_len);
    if (!isfinite(cfg->temperature) || cfg->temperature < 0.0f)
        return llmt_fail(LLMT_EINVAL, "%s: cfg->temperature = %g (need a finite value >= 0; "
                         "0 is greedy)", fn, (double)cfg->temperature);
    if (cfg->top_k < 0)
        return llmt_fail(LLMT_EINVAL, "%s: cfg->top_k = %d (need >= 0; 0 is off)", fn,
                         cfg->top_k);
    if (!(cfg->top_p > 0.0f && cfg->top_p <= 1.0f))
        return llmt_fail(LLMT_EINVAL, "%s: cfg->top_p = %g (need 0 < top_p <= 1; 1 is off)",
                         fn, (double)cfg->top_p);
    *out = *cfg;
    if (out->max_context == 0)
        out->max_context = m->cfg.max_seq_len;
    return LLMT_OK;
}

int llmt_generator_create(llmt_generator **out, llmt_model *model,
                          const llmt_generator_config *cfg)
{
    const char *fn = "llmt_generator_create";
    if (!out || !model)
        return llmt_fail(LLMT_EINVAL, "%s: %s is NULL", fn, out ? "model" : "out");
    *out = NULL;
    if (!model->ops->attention_kv_fwd || !model->ops->attention_kv_scratch_bytes)
        return llmt_fail(LLMT_EUNSUPPORTED, "%s: the %s backend has no cached attention "
                         "(attention_kv_fwd)", fn, model->ops->name);
    llmt_generator_config def = LLMT_GENERATOR_CONFIG_INIT;
    llmt_generator *g = calloc(1, sizeof *g);
    if (!g)
        return llmt_fail(LLMT_ENOMEM, "%s: out of host memory", fn);
    g->model = model;
    int rc = check_config(cfg ? cfg : &def, model, &g->cfg);
    const int64_t V = model->dims.vocab;
    g->kv_row = 2 * model->dims.kv_heads * model->dims.head_dim;
    if (!rc) {
        llmt_gen_layout_compute(model, g->cfg.max_context, &g->lay);
        g->logits = malloc((size_t)V * sizeof *g->logits);
        g->cand = malloc((size_t)V * sizeof *g->cand);
        g->prob = malloc((size_t)V * sizeof *g->prob);
        if (!g->logits || !g->cand || !g->prob)
            rc = llmt_fail(LLMT_ENOMEM, "%s: out of host memory", fn);
    }
    if (!rc)
        rc = llmt_buf_alloc(model->ctx, &g->kv, LLMT_MEM_ACTIVATIONS,
                            (size_t)(model->dims.layers * g->cfg.max_context * g->kv_row) *
                                llmt_dtype_size(model->dt),
                            "generator KV cache");
    if (!rc)
        rc = llmt_buf_alloc(model->ctx, &g->work, LLMT_MEM_WORKSPACE, g->lay.total,
                            "generator workspace");
    if (rc) {
        llmt_generator_free(g);
        return rc;
    }
    *out = g;
    return LLMT_OK;
}

void llmt_generator_free(llmt_generator *gen)
{
    if (!gen)
        return;
    llmt_buf_free(gen->model->ctx, &gen->kv);
    llmt_buf_free(gen->model->ctx, &gen->work);
    free(gen->logits);
    free(gen->cand);
    free(gen->prob);
    free(gen);
}

int llmt_generator_reset(llmt_generator *gen)
{
    if (!gen)
        return llmt_fail(LLMT_EINVAL, "llmt_generator_reset: gen is NULL");
    gen->pos = 0;
    return LLMT_OK;
}

int llmt_generator_position(const llmt_generator *gen, int32_t *out)
{
    if (!gen || !out)
        return llmt_fail(LLMT_EINVAL, "llmt_generator_position: %s is NULL", gen ? "out" : "gen");
    *out = (int32_t)gen->pos;
    return LLMT_OK;
}

/* Checks tokens[0..n) against the vocabulary; what names them in messages. */
static int check_tokens(const llmt_generator *g, const char *fn, const char *what,
                        const int32_t *tokens, int32_t n)
{
    for (int32_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= g->model->dims.vocab)
            return llmt_fail(LLMT_EINVAL, "%s: %s[%d] = %d is outside the vocabulary [0, %lld)",
                             fn, what, i, tokens[i], (long long)g->model->dims.vocab);
    return LLMT_OK;
}

/* Feeds checked tokens chunk by chunk; a backend failure empties the cache. */
static int feed(llmt_generator *g, const int32_t *tokens, int64_t n, float *logits)
{
    for (int64_t at = 0; at < n; at += g->lay.rows) {
        int64_t rows = n - at < g->lay.rows ? n - at : g->lay.rows;
        int rc = llmt_gen_forward_chunk(g, tokens + at, rows, at + rows == n ? logits : NULL);
        if (rc) {
            g->pos = 0;
            return rc;
        }
        g->pos += rows;
    }
    return LLMT_OK;
}

int llmt_generator_feed(llmt_generator *gen, const int32_t *tokens, int32_t n, float *logits,
                        size_t count)
{
    const char *fn = "llmt_generator_feed";
    if (!gen || !tokens)
        return llmt_fail(LLMT_EINVAL, "%s: %s is NULL", fn, gen ? "tokens" : "gen");
    if (n < 1 || n > gen->cfg.max_context - gen->pos)
        return llmt_fail(LLMT_EINVAL, "%s: n = %d (need 1..%lld: the cache holds %lld of "
                         "max_context %d positions)", fn, n,
                         (long long)(gen->cfg.max_context - gen->pos), (long long)gen->pos,
                         gen->cfg.max_context);
    if (logits && count != (size_t)gen->model->dims.vocab)
        return llmt_fail(LLMT_EINVAL, "%s: count = %zu (logits must hold vocab_size = %lld "
                         "floats)", fn, count, (long long)gen->model->dims.vocab);
    LLMT_TRY(check_tokens(gen, fn, "tokens", tokens, n));
    return feed(gen, tokens, n, logits);
}

int llmt_generator_generate(llmt_generator *gen, const int32_t *prompt, int32_t n_prompt,
                            int32_t max_new, int32_t stop_token, int32_t *out, size_t cap,
                            int32_t *n_out)
{
    const char *fn = "llmt_generator_generate";
    if (!gen || !prompt || !out || !n_out)
        return llmt_fail(LLMT_EINVAL, "%s: %s is NULL", fn,
                         !gen ? "gen" : !prompt ? "prompt" : !out ? "out" : "n_out");
    *n_out = 0;
    const int32_t ctx = gen->cfg.max_context;
    if (n_prompt < 1 || n_prompt > ctx)
        return llmt_fail(LLMT_EINVAL, "%s: n_prompt = %d (need 1..max_context = %d)", fn,
                         n_prompt, ctx);
    if (max_new < 0 || max_new > ctx - n_prompt)
        return llmt_fail(LLMT_EINVAL, "%s: max_new = %d (need 0..%d: n_prompt %d + max_new "
                         "must fit max_context %d)", fn, max_new, ctx - n_prompt, n_prompt, ctx);
    if (cap < (size_t)max_new)
        return llmt_fail(LLMT_EINVAL, "%s: cap = %zu is below max_new = %d", fn, cap, max_new);
    if (stop_token < -1 || stop_token >= gen->model->dims.vocab)
        return llmt_fail(LLMT_EINVAL, "%s: stop_token = %d (need -1 for none, or a token in "
                         "[0, %lld))", fn, stop_token, (long long)gen->model->dims.vocab);
    LLMT_TRY(check_tokens(gen, fn, "prompt", prompt, n_prompt));
    gen->pos = 0;
    if (max_new == 0)
        return LLMT_OK;
    LLMT_TRY(feed(gen, prompt, n_prompt, gen->logits));
    for (int32_t i = 0; i < max_new; i++) {
        float u = llmt_rng_u32_to_uniform(llmt_rng_u32_at(gen->cfg.seed, LLMT_STREAM_SAMPLING,
                                                          (uint64_t)i));
        int32_t tok = llmt_gen_sample(gen, gen->logits, u);
        out[(*n_out)++] = tok;
        if (tok == stop_token || i + 1 == max_new)
            break;
        LLMT_TRY(feed(gen, &tok, 1, gen->logits));
    }
    return LLMT_OK;
}
