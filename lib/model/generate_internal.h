/* The generator's state, shared by its API (generate.c), its cached forward
 * (generate_forward.c) and its sampler (generate_sample.c). */
#ifndef LLMT_MODEL_GENERATE_INTERNAL_H
#define LLMT_MODEL_GENERATE_INTERNAL_H

#include "llmt/generate.h"
#include "model/model_internal.h"

/* Positions run through the model at once when a prompt is fed: the
 * workspace holds this many rows (or max_context, when smaller). */
#define LLMT_GEN_CHUNK 64

/* Byte offsets of the workspace's buffers, each for `rows` positions. */
typedef struct llmt_gen_layout {
    int64_t rows;
    size_t ids, x, h, xmid, q, att, gu, s, rstd, scratch, total;
} llmt_gen_layout;

/* A token and its (tempered) logit, for sorting. */
typedef struct llmt_gen_cand {
    float logit;
    int32_t index;
} llmt_gen_cand;

struct llmt_generator {
    llmt_model *model; /* borrowed */
    llmt_generator_config cfg; /* max_context resolved (never 0) */
    int64_t kv_row;    /* elements of one cache row: 2 kv_heads head_dim */
    llmt_buf kv;       /* ACTIVATIONS: layers x [max_context, kv_row] */
    llmt_buf work;     /* WORKSPACE, laid out by lay */
    llmt_gen_layout lay;
    int64_t pos;       /* positions in the cache */
    /* Host buffers of the sampler, vocab entries each. */
    float *logits;
    llmt_gen_cand *cand;
    double *prob;
};

/* Lays out the workspace of a generator for model m and max_context. */
void llmt_gen_layout_compute(const llmt_model *m, int64_t max_context, llmt_gen_layout *out);

/* Runs tokens[0..n) (n <= lay.rows, already checked) through the model at
 * positions pos.. , appending their keys and values to the cache, and with
 * logits not NULL writes the last position's fp32 logits there (host). */
int llmt_gen_forward_chunk(llmt_generator *g, const int32_t *tokens, int64_t n, float *logits);

/* Samples a token from logits[0..vocab) (modified in place) under g's
 * configuration with uniform draw u in [0, 1). */
int32_t llmt_gen_sample(llmt_generator *g, float *logits, float u);

#endif
