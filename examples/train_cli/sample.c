/* llmt-train's text sample: byte tokens drawn from the model's logits, and
 * their escaped printing. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "train_cli.h"

#define CONTEXT_MAX 4096

int sample_text(llmt_trainer *tr, const char *prompt, int n, char *out, size_t cap)
{
    llmt_model *m = llmt_trainer_model(tr);
    llmt_model_config mc;
    if (!cap || llmt_model_get_config(m, &mc))
        return -1;
    /* Only byte tokens become text: ids at or above LLMT_BYTE_VOCAB (a
     * larger vocabulary's rest) are never drawn, and a smaller vocabulary
     * has fewer logits per row than LLMT_BYTE_VOCAB. */
    const int32_t V = mc.vocab_size, drawable = V < LLMT_BYTE_VOCAB ? V : LLMT_BYTE_VOCAB;
    int32_t tokens[CONTEXT_MAX];
    size_t len = 0, used = 0;
    if (llmt_byte_encode(prompt, strlen(prompt), tokens, CONTEXT_MAX, &len))
        return -1;
    for (size_t i = 0; i < len; i++)
        if (tokens[i] >= V) /* a prompt byte the model has no embedding for */
            return -1;
    float *logits = malloc((size_t)mc.max_seq_len * (size_t)V * sizeof *logits);
    int rc = logits ? 0 : -1;
    for (int i = 0; i < n && !rc && len > 0; i++) {
        size_t start = len > (size_t)mc.max_seq_len ? len - (size_t)mc.max_seq_len : 0;
        int32_t t = (int32_t)(len - start);
        rc = llmt_model_logits(m, tokens + start, 1, t, logits, (size_t)t * (size_t)V) ? -1 : 0;
        if (rc)
            break;
        const float *row = logits + (size_t)(t - 1) * (size_t)V;
        double mx = -INFINITY, sum = 0, u = 0;
        for (int32_t v = 0; v < drawable; v++)
            mx = row[v] > mx ? row[v] : mx;
        for (int32_t v = 0; v < drawable; v++)
            sum += exp((row[v] - mx) / 0.8);
        float draw;
        llmt_context_rng_uniform(llmt_trainer_context(tr), &draw, 1);
        int32_t pick = drawable - 1;
        for (int32_t v = 0; v < drawable; v++)
            if ((u += exp((row[v] - mx) / 0.8) / sum) > draw) {
                pick = v;
                break;
            }
        if (pick == LLMT_TOKEN_EOT || len == CONTEXT_MAX || used + 1 >= cap)
            break;
        tokens[len++] = pick;
        out[used++] = (char)pick;
    }
    out[used] = '\0';
    free(logits);
    return rc;
}

/* The length of the valid UTF-8 sequence at s (1..4), or 0 when the bytes
 * there are not one: a stray continuation byte, an overlong form, a
 * surrogate, a code point above U+10FFFF, or a sequence cut short. */
static int utf8_length(const unsigned char *s)
{
    if (s[0] < 0x80)
        return 1;
    int n = s[0] >= 0xc2 && s[0] <= 0xdf ? 2 : s[0] >= 0xe0 && s[0] <= 0xef ? 3
            : s[0] >= 0xf0 && s[0] <= 0xf4 ? 4 : 0;
    for (int i = 1; i < n; i++)
        if ((s[i] & 0xc0) != 0x80)
            return 0;
    if ((s[0] == 0xe0 && s[1] < 0xa0) || (s[0] == 0xed && s[1] > 0x9f) ||
        (s[0] == 0xf0 && s[1] < 0x90) || (s[0] == 0xf4 && s[1] > 0x8f))
        return 0;
    return n;
}

void print_escaped(FILE *f, const char *text)
{
    const unsigned char *s = (const unsigned char *)text;
    while (*s) {
        int n = utf8_length(s);
        if (*s == '\\')
            fputs("\\\\", f);
        else if (n == 0 || *s < 0x20 || *s == 0x7f)
            fprintf(f, "\\x%02x", *s);
        else if (s[0] == 0xc2 && s[1] < 0xa0) /* C1 controls U+0080..U+009F */
            fprintf(f, "\\x%02x\\x%02x", s[0], s[1]);
        else
            fwrite(s, 1, (size_t)n, f);
        s += n ? n : 1;
    }
}
