/* llmt-generate: text from a model with the KV-cache generator
 * (include/llmt/generate.h, docs/interop.md "Generate").
 *
 *   llmt-generate (--checkpoint DIR [--step N] | --hf DIR | --model FILE)
 *                 (--prompt TEXT | --prompt-tokens I,J,...) [--max-tokens N]
 *                 [--temperature X] [--top-k N] [--top-p X] [--seed N]
 *                 [--stop-token N] [--print-ids] [--bytes]
 *
 * The prompt is encoded with the byte tokenizer (llmt-train's), and the new
 * tokens are printed decoded the same way: bytes as UTF-8 text, escaped as
 * \xNN where they are not valid UTF-8, the end-of-text token as nothing,
 * other ids as <|N|>. A Hugging Face directory with its own tokenizer
 * (tokenizer.json or tokenizer.model), which this C tool cannot run, and any
 * model whose vocab_size is not the byte tokenizer's 257 (one trained on
 * shards of python -m llmt.tokenize) need --prompt-tokens and --print-ids
 * (the Python binding's llmt.generate takes a tokenizers object), unless
 * --bytes says a larger vocabulary is the byte tokenizer's padded (as
 * llmt-train's default model's 320: ids 0..256 are bytes). The cache
 * holds the prompt and the new tokens, not the model's whole context.
 * Exit status: 0 done, 1 failed, 2 bad usage. */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <llmt/llmt.h>

#include "cli_args.h"
#include "model_source.h"
#include "text_escape.h"

#define PROG "llmt-generate"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: " PROG " (--checkpoint DIR [--step N] | --hf DIR | --model FILE)\n"
            "                     (--prompt TEXT | --prompt-tokens I,J,...) [--max-tokens N]\n"
            "                     [--temperature X] [--top-k N] [--top-p X] [--seed N]\n"
            "                     [--stop-token N] [--print-ids] [--bytes]\n"
            "Samples tokens after the prompt with a key/value cache and prints them:\n"
            "decoded as bytes (invalid UTF-8 escaped as \\xNN, end-of-text as nothing,\n"
            "other ids as <|N|>), or with --print-ids as comma-separated token ids.\n"
            "--checkpoint reads the newest checkpoint that verifies, or step N; --hf a\n"
            "Hugging Face directory; --model a safetensors file or step-N dir. A model\n"
            "with its own tokenizer (tokenizer.json or tokenizer.model, or a vocab_size\n"
            "other than the byte tokenizer's 257) needs --prompt-tokens and --print-ids;\n"
            "--bytes says a larger one is the byte tokenizer's padded (llmt-train's default\n"
            "model: 320), so --prompt TEXT and the decoded output work.\n"
            "Defaults: --max-tokens 64 (or what the context leaves) --temperature 1\n"
            "(0: greedy) --top-k 0 (off) --top-p 1 (off) --seed 0 --stop-token -1 (none).\n");
}

/* Parses "I,J,..." (decimal digits only, no sign or space) into a malloc'ed
 * array; -1 with a message on error. */
static int parse_ids(const char *list, int32_t **out, int32_t *n)
{
    size_t cap = strlen(list) / 2 + 1, k = 0;
    int32_t *ids = malloc(cap * sizeof *ids);
    const char *p = list;
    while (ids) {
        int64_t v = 0;
        const char *end = p;
        while (*end >= '0' && *end <= '9' && v <= INT32_MAX)
            v = v * 10 + (*end++ - '0');
        if (end == p || v > INT32_MAX || (*end && *end != ',')) {
            fprintf(stderr, PROG ": --prompt-tokens: '%s' is not a list of token ids "
                    "(I,J,... decimal, each 0..%d)\nTry '" PROG " --help'.\n", list, INT32_MAX);
            free(ids);
            return -1;
        }
        ids[k++] = (int32_t)v;
        if (!*end)
            break;
        p = end + 1;
    }
    if (!ids) {
        fprintf(stderr, PROG ": out of memory\n");
        return -1;
    }
    *out = ids;
    *n = (int32_t)k;
    return 0;
}

/* Whether dir holds a tokenizer other than bytes. */
static int has_hf_tokenizer(const char *dir)
{
    static const char *const names[] = {"tokenizer.json", "tokenizer.model"};
    char path[4096];
    for (size_t i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        if (access(path, F_OK) == 0)
            return 1;
    }
    return 0;
}

/* Prints tokens as text: each run of byte tokens escaped as one string. */
static int print_text(const int32_t *t, int32_t n)
{
    unsigned char *run = malloc((size_t)n + 1);
    if (!run) {
        fprintf(stderr, PROG ": out of memory\n");
        return 1;
    }
    size_t len = 0;
    for (int32_t i = 0; i <= n; i++) {
        if (i < n && t[i] < 256) {
            run[len++] = (unsigned char)t[i];
            continue;
        }
        text_print_escaped(stdout, run, len);
        len = 0;
        if (i < n && t[i] != LLMT_TOKEN_EOT)
            printf("<|%d|>", t[i]);
    }
    putchar('\n');
    free(run);
    return 0;
}

/* Encodes the prompt; -1 with a message on error. */
static int prompt_tokens(const char *text, const char *ids, int hf_tokenizer, int print_ids,
                         const char *hf, int32_t **out, int32_t *n)
{
    if (hf_tokenizer && (!ids || !print_ids)) {
        fprintf(stderr, PROG ": %s has its own tokenizer (tokenizer.json or tokenizer.model), "
                "which this tool cannot run: give --prompt-tokens and --print-ids, or use the "
                "Python binding (llmt.generate with a tokenizers object)\n", hf);
        return -1;
    }
    if (ids)
        return parse_ids(ids, out, n);
    size_t len = strlen(text), got = 0;
    *out = malloc((len ? len : 1) * sizeof **out);
    if (!*out || llmt_byte_encode(text, len, *out, len, &got)) {
        fprintf(stderr, PROG ": --prompt: %s\n", *out ? llmt_error_last() : "out of memory");
        return -1;
    }
    *n = (int32_t)got;
    return 0;
}

/* Whether the model's text is the byte tokenizer's (its vocab_size, or
 * with --bytes a padded one of at least 257): else --prompt and the decoded
 * output would be wrong, so ids are required (message, -1). */
static int check_byte_vocab(const llmt_model_config *mc, const char *what, const char *ids,
                            int print_ids, int bytes)
{
    if (bytes && mc->vocab_size < LLMT_BYTE_VOCAB) {
        fprintf(stderr, PROG ": --bytes: %s has vocab_size %d, fewer than the byte tokenizer's "
                "%d ids\n", what, mc->vocab_size, LLMT_BYTE_VOCAB);
        return -1;
    }
    if (mc->vocab_size == LLMT_BYTE_VOCAB || bytes || (ids && print_ids))
        return 0;
    fprintf(stderr, PROG ": %s has vocab_size %d, not the byte tokenizer's %d: give "
            "--prompt-tokens and --print-ids%s; the Python binding's llmt.generate takes a "
            "tokenizers object\n", what, mc->vocab_size, LLMT_BYTE_VOCAB,
            mc->vocab_size > LLMT_BYTE_VOCAB ? ", or --bytes if it was trained on bytes with a "
                                               "padded vocabulary (llmt-train's default model: "
                                               "320)" : "");
    return -1;
}

int main(int argc, char **argv)
{
    model_source src = {NULL, -1, NULL, NULL};
    const char *prompt = NULL, *ids = NULL;
    int64_t max_tokens = 64, top_k = 0, seed = 0, stop = -1;
    double temperature = 1.0, top_p = 1.0;
    int print_ids = 0, bytes = 0;
    cli_option opts[] = {
        CLI_OPT_STRING("--checkpoint", &src.checkpoint),
        CLI_OPT_INT64("--step", &src.step, 0, INT64_MAX),
        CLI_OPT_STRING("--hf", &src.hf),
        CLI_OPT_STRING("--model", &src.model),
        CLI_OPT_STRING("--prompt", &prompt),
        CLI_OPT_STRING("--prompt-tokens", &ids),
        CLI_OPT_INT64("--max-tokens", &max_tokens, 0, INT32_MAX),
        CLI_OPT_DOUBLE("--temperature", &temperature, 0.0, 1e6),
        CLI_OPT_INT64("--top-k", &top_k, 0, INT32_MAX),
        CLI_OPT_DOUBLE("--top-p", &top_p, 1e-9, 1.0),
        CLI_OPT_INT64("--seed", &seed, 0, INT64_MAX),
        CLI_OPT_INT64("--stop-token", &stop, -1, INT32_MAX),
        CLI_OPT_FLAG("--print-ids", &print_ids),
        CLI_OPT_FLAG("--bytes", &bytes),
    };
    static const char *const exclusive[][2] = {{"--prompt", "--prompt-tokens"}};
    cli_spec spec = {PROG, usage, opts, sizeof opts / sizeof *opts, exclusive, 1, 0};
    int npos, r = cli_parse(&spec, argc, argv, &npos);
    if (r != CLI_OK)
        return r == CLI_DONE ? 0 : 2;
    if (model_source_check(PROG, &src))
        return 2;
    if (!prompt && !ids) {
        fprintf(stderr, PROG ": give --prompt TEXT or --prompt-tokens I,J,...\n"
                "Try '" PROG " --help'.\n");
        return 2;
    }
    int32_t *tokens = NULL, n_prompt = 0, *out = NULL, n_out = 0;
    if (prompt_tokens(prompt, ids, src.hf && has_hf_tokenizer(src.hf), print_ids, src.hf,
                      &tokens, &n_prompt))
        return 2;
    llmt_context *ctx = NULL;
    llmt_model *model = NULL;
    llmt_generator *gen = NULL;
    llmt_model_config mc;
    char what[4200];
    int usage = 0, rc = llmt_context_create(&ctx, NULL);
    if (rc)
        fprintf(stderr, PROG ": %s\n", llmt_error_last());
    else if (model_source_load(PROG, &src, ctx, &model, what, sizeof what))
        rc = -1;
    if (!rc) {
        llmt_model_get_config(model, &mc);
        rc = usage = check_byte_vocab(&mc, what, ids, print_ids, bytes);
    }
    if (!rc) {
        llmt_generator_config gc = LLMT_GENERATOR_CONFIG_INIT;
        gc.temperature = (float)temperature;
        gc.top_k = (int32_t)top_k;
        gc.top_p = (float)top_p;
        gc.seed = (uint64_t)seed;
        /* The default max-tokens shrinks to what the context leaves; an explicit one does not. */
        if (!cli_given(&spec, "--max-tokens") && max_tokens > mc.max_seq_len - n_prompt)
            max_tokens = mc.max_seq_len - n_prompt > 0 ? mc.max_seq_len - n_prompt : 0;
        /* The cache holds this call's tokens (at least one position, at most
         * the model's context, where generate names what does not fit). */
        int64_t need = (int64_t)n_prompt + max_tokens;
        gc.max_context = (int32_t)(need < 1 ? 1 : need < mc.max_seq_len ? need : mc.max_seq_len);
        rc = llmt_generator_create(&gen, model, &gc);
        out = malloc(((size_t)max_tokens + 1) * sizeof *out);
        if (!rc && out)
            rc = llmt_generator_generate(gen, tokens, n_prompt, (int32_t)max_tokens,
                                         (int32_t)stop, out, (size_t)max_tokens, &n_out);
        if (rc || !out)
            fprintf(stderr, PROG ": %s: %s\n", what, out ? llmt_error_last() : "out of memory");
        rc = rc ? rc : !out;
    }
    if (!rc && print_ids) {
        for (int32_t i = 0; i < n_out; i++)
            printf(i ? ",%d" : "%d", out[i]);
        putchar('\n');
    } else if (!rc) {
        rc = print_text(out, n_out);
    }
    free(out);
    free(tokens);
    llmt_generator_free(gen);
    llmt_model_free(model);
    llmt_context_free(ctx);
    return usage ? 2 : rc ? 1 : 0;
}
