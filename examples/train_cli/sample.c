/* llmt-train's text sample: byte tokens drawn from the model's logits,
 * computed with the KV-cache generator (include/llmt/generate.h), and their
 * escaped printing. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../text_escape.h"
#include "train_cli.h"

#define CONTEXT_MAX 4096

/* Draws a byte token from logits at temperature 0.8 with one uniform of the
 * context's root stream. Only byte tokens become text: ids at or above
 * LLMT_BYTE_VOCAB (a larger vocabulary's rest) are never drawn, and a
 * smaller vocabulary has fewer logits than LLMT_BYTE_VOCAB. */
static int32_t draw(llmt_trainer *tr, const float *row, int32_t drawable)
{
    double mx = -INFINITY, sum = 0, u = 0;
    for (int32_t v = 0; v < drawable; v++)
        mx = row[v] > mx ? row[v] : mx;
    for (int32_t v = 0; v < drawable; v++)
        sum += exp((row[v] - mx) / 0.8);
    float r;
    llmt_context_rng_uniform(llmt_trainer_context(tr), &r, 1);
    for (int32_t v = 0; v < drawable; v++)
        if ((u += exp((row[v] - mx) / 0.8) / sum) > r)
            return v;
    return drawable - 1;
}

/* Feeds tokens[0..len) to gen, whose cache holds a prefix of them ending at
 * len - 1, so that it holds the last max_seq_len of them: one token when it
 * has room, else the window again from an empty cache. */
static int feed_window(llmt_generator *gen, const int32_t *tokens, size_t len, size_t window,
                       float *logits, size_t vocab)
{
    int32_t pos = 0;
    if (llmt_generator_position(gen, &pos))
        return -1;
    if ((size_t)pos < window && pos > 0)
        return llmt_generator_feed(gen, tokens + len - 1, 1, logits, vocab) ? -1 : 0;
    size_t start = len > window ? len - window : 0;
    if (llmt_generator_reset(gen) ||
        llmt_generator_feed(gen, tokens + start, (int32_t)(len - start), logits, vocab))
        return -1;
    return 0;
}

int sample_text(llmt_trainer *tr, const char *prompt, int n, char *out, size_t cap)
{
    llmt_model *m = llmt_trainer_model(tr);
    llmt_model_config mc;
    if (!cap || llmt_model_get_config(m, &mc))
        return -1;
    const int32_t V = mc.vocab_size, drawable = V < LLMT_BYTE_VOCAB ? V : LLMT_BYTE_VOCAB;
    int32_t tokens[CONTEXT_MAX];
    size_t len = 0, used = 0;
    if (llmt_byte_encode(prompt, strlen(prompt), tokens, CONTEXT_MAX, &len))
        return -1;
    for (size_t i = 0; i < len; i++)
        if (tokens[i] >= V) /* a prompt byte the model has no embedding for */
            return -1;
    out[0] = '\0';
    if (len == 0)
        return 0;
    /* Training is over: the cache takes the activation arena's place. */
    llmt_model_release_activations(m);
    llmt_generator *gen = NULL;
    float *logits = malloc((size_t)V * sizeof *logits);
    int rc = logits && !llmt_generator_create(&gen, m, NULL) ? 0 : -1;
    if (!rc)
        rc = feed_window(gen, tokens, len, (size_t)mc.max_seq_len, logits, (size_t)V);
    for (int i = 0; i < n && !rc; i++) {
        int32_t pick = draw(tr, logits, drawable);
        if (pick == LLMT_TOKEN_EOT || len == CONTEXT_MAX || used + 1 >= cap)
            break;
        tokens[len++] = pick;
        out[used++] = (char)pick;
        if (i + 1 < n)
            rc = feed_window(gen, tokens, len, (size_t)mc.max_seq_len, logits, (size_t)V);
    }
    out[used] = '\0';
    llmt_generator_free(gen);
    free(logits);
    return rc;
}

void print_escaped(FILE *f, const char *text)
{
    text_print_escaped(f, text, strlen(text));
}
