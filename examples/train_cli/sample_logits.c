/* The sample's logits, cached or recomputed (sample_logits.h). */
#include <stdlib.h>
#include <string.h>

#include "sample_logits.h"

/* Fills the fields both ways share. */
static int init(sample_logits *s, llmt_model *m)
{
    llmt_model_config mc;
    memset(s, 0, sizeof *s);
    int rc = llmt_model_get_config(m, &mc);
    if (rc)
        return rc;
    s->model = m;
    s->window = (size_t)mc.max_seq_len;
    s->vocab = (size_t)mc.vocab_size;
    return LLMT_OK;
}

int sample_logits_open_recompute(sample_logits *s, llmt_model *m)
{
    int rc = init(s, m);
    if (rc)
        return rc;
    s->rows = malloc(s->window * s->vocab * sizeof *s->rows);
    return s->rows ? LLMT_OK : LLMT_ENOMEM;
}

int sample_logits_open(sample_logits *s, llmt_model *m)
{
    int rc = init(s, m);
    if (!rc)
        rc = llmt_generator_create(&s->gen, m, NULL);
    return rc == LLMT_EUNSUPPORTED ? sample_logits_open_recompute(s, m) : rc;
}

/* The cache holds a prefix of tokens ending at len - 1: one token more when
 * it has room, else the last window again from an empty cache. */
static int next_cached(sample_logits *s, const int32_t *tokens, size_t len, float *logits)
{
    int32_t pos = 0;
    int rc = llmt_generator_position(s->gen, &pos);
    if (rc)
        return rc;
    if ((size_t)pos < s->window && pos > 0 && (size_t)pos + 1 == len)
        return llmt_generator_feed(s->gen, tokens + len - 1, 1, logits, s->vocab);
    size_t start = len > s->window ? len - s->window : 0;
    rc = llmt_generator_reset(s->gen);
    return rc ? rc
              : llmt_generator_feed(s->gen, tokens + start, (int32_t)(len - start), logits,
                                    s->vocab);
}

/* The whole window through the model; its last row. */
static int next_recomputed(sample_logits *s, const int32_t *tokens, size_t len, float *logits)
{
    size_t start = len > s->window ? len - s->window : 0, t = len - start;
    int rc = llmt_model_logits(s->model, tokens + start, 1, (int32_t)t, s->rows, t * s->vocab);
    if (!rc)
        memcpy(logits, s->rows + (t - 1) * s->vocab, s->vocab * sizeof *logits);
    return rc;
}

int sample_logits_next(sample_logits *s, const int32_t *tokens, size_t len, float *logits)
{
    return s->gen ? next_cached(s, tokens, len, logits) : next_recomputed(s, tokens, len, logits);
}

void sample_logits_close(sample_logits *s)
{
    llmt_generator_free(s->gen);
    free(s->rows);
    memset(s, 0, sizeof *s);
}
