/* llmt-train's text sample: byte tokens drawn from the model's logits
 * (sample_logits.h: the KV-cache generator, or a recompute where the backend
 * has no cached attention), and their escaped printing. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../text_escape.h"
#include "sample_logits.h"
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
    sample_logits src = {0};
    float *logits = malloc((size_t)V * sizeof *logits);
    int rc = logits && !sample_logits_open(&src, m) ? 0 : -1;
    if (!rc)
        rc = sample_logits_next(&src, tokens, len, logits) ? -1 : 0;
    for (int i = 0; i < n && !rc; i++) {
        int32_t pick = draw(tr, logits, drawable);
        if (pick == LLMT_TOKEN_EOT || len == CONTEXT_MAX || used + 1 >= cap)
            break;
        tokens[len++] = pick;
        out[used++] = (char)pick;
        if (i + 1 < n)
            rc = sample_logits_next(&src, tokens, len, logits) ? -1 : 0;
    }
    out[used] = '\0';
    sample_logits_close(&src);
    free(logits);
    return rc;
}

void print_escaped(FILE *f, const char *text)
{
    text_print_escaped(f, text, strlen(text));
}
