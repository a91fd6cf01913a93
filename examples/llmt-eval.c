/* llmt-eval: held-out loss and perplexity of a model on token shards
 * (docs/interop.md "Evaluate").
 *
 *   llmt-eval (--checkpoint DIR [--step N] | --hf DIR | --model FILE)
 *             --data GLOB [--seq-len T] [--batch-size B] [--batches N]
 *
 * The shards matching GLOB (sorted by name) are cut into windows of T + 1
 * tokens as the trainer's loader cuts them, in order (no shuffle); each
 * window scores its T next-token predictions. N batches of B windows are
 * evaluated, at most one pass (a window is never counted twice); by default
 * every window of one pass (the last batch may be short). T defaults to the
 * model's max_seq_len, at most 1024 for --hf (a Hugging Face max_seq_len,
 * 131072 for Llama 3, is far too long for attention on the CPU). Prints the
 * mean loss over the predictions and its exp, the perplexity. Exit status:
 * 0 done, 1 failed, 2 bad usage. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <llmt/llmt.h>

#include "cli_args.h"
#include "model_source.h"

#define PROG "llmt-eval"

/* The default --seq-len of a Hugging Face directory at most. */
#define HF_SEQ_DEFAULT_MAX 1024

static void usage(FILE *f)
{
    fprintf(f,
            "usage: " PROG " (--checkpoint DIR [--step N] | --hf DIR | --model FILE)\n"
            "                 --data GLOB [--seq-len T] [--batch-size B] [--batches N]\n"
            "Mean next-token loss and perplexity of the model over the windows of T + 1\n"
            "tokens of the shards matching GLOB (in name order, not shuffled).\n"
            "--checkpoint reads the newest checkpoint that verifies, or step N; --hf a\n"
            "Hugging Face directory; --model a safetensors file or step-N directory.\n"
            "Defaults: --seq-len the model's max_seq_len (at most 1024 with --hf),\n"
            "--batch-size 8, --batches: every window once (the last batch may be short);\n"
            "more batches than one pass holds evaluate the pass once.\n");
}

/* Loss summed over the predictions of `windows` windows read one by one
 * from the loader (a window is one row of the forward's batch). */
static int eval_batches(llmt_model *model, llmt_loader *loader, int64_t windows, int32_t batch,
                        int32_t seq, double *sum)
{
    int32_t *tok = malloc((size_t)batch * (size_t)seq * sizeof *tok);
    int32_t *tgt = malloc((size_t)batch * (size_t)seq * sizeof *tgt);
    int rc = tok && tgt ? LLMT_OK : LLMT_ENOMEM;
    if (rc)
        fprintf(stderr, PROG ": out of memory\n");
    for (int64_t done = 0; !rc && done < windows;) {
        int32_t rows = windows - done < batch ? (int32_t)(windows - done) : batch;
        for (int32_t r = 0; !rc && r < rows; r++)
            rc = llmt_loader_next(loader, tok + (size_t)r * (size_t)seq,
                                  tgt + (size_t)r * (size_t)seq, (size_t)seq);
        double loss = 0;
        if (!rc)
            rc = llmt_model_forward(model, tok, tgt, rows, seq, &loss);
        if (rc)
            fprintf(stderr, PROG ": %s\n", llmt_error_last());
        *sum += loss * (double)rows * (double)seq; /* every target counts: none is -1 */
        done += rows;
    }
    free(tok);
    free(tgt);
    return rc;
}

int main(int argc, char **argv)
{
    model_source src = {NULL, -1, NULL, NULL};
    const char *data = NULL;
    int64_t seq = 0, batch = 8, batches = 0;
    cli_option opts[] = {
        CLI_OPT_STRING("--checkpoint", &src.checkpoint),
        CLI_OPT_INT64("--step", &src.step, 0, INT64_MAX),
        CLI_OPT_STRING("--hf", &src.hf),
        CLI_OPT_STRING("--model", &src.model),
        CLI_OPT_STRING("--data", &data),
        CLI_OPT_INT64("--seq-len", &seq, 1, INT32_MAX),
        CLI_OPT_INT64("--batch-size", &batch, 1, 65536),
        CLI_OPT_INT64("--batches", &batches, 1, INT64_MAX),
    };
    cli_spec spec = {PROG, usage, opts, sizeof opts / sizeof *opts, NULL, 0, 0};
    int npos, r = cli_parse(&spec, argc, argv, &npos);
    if (r != CLI_OK)
        return r == CLI_DONE ? 0 : 2;
    if (model_source_check(PROG, &src))
        return 2;
    if (!data) {
        fprintf(stderr, PROG ": give --data GLOB (token shards)\nTry '" PROG " --help'.\n");
        return 2;
    }
    llmt_context *ctx = NULL;
    llmt_model *model = NULL;
    llmt_loader *loader = NULL;
    llmt_model_config mc;
    char what[4200];
    uint64_t per_epoch = 0;
    int rc = llmt_context_create(&ctx, NULL);
    if (rc)
        fprintf(stderr, PROG ": %s\n", llmt_error_last());
    else if (model_source_load(PROG, &src, ctx, &model, what, sizeof what))
        rc = -1;
    if (!rc) {
        llmt_model_get_config(model, &mc);
        if (!seq)
            seq = src.hf && mc.max_seq_len > HF_SEQ_DEFAULT_MAX ? HF_SEQ_DEFAULT_MAX
                                                                : mc.max_seq_len;
        if (seq > mc.max_seq_len) {
            fprintf(stderr, PROG ": --seq-len %lld is above the model's max_seq_len %d\n",
                    (long long)seq, mc.max_seq_len);
            rc = -1;
        }
    }
    if (!rc) {
        llmt_loader_config lc = LLMT_LOADER_CONFIG_INIT;
        lc.batch_size = 1;
        lc.seq_len = (int32_t)seq;
        lc.vocab_size = mc.vocab_size;
        lc.shuffle = 0;
        rc = llmt_loader_open_glob(&loader, ctx, data, &lc);
        if (!rc)
            rc = llmt_loader_windows_per_epoch(loader, &per_epoch);
        if (rc)
            fprintf(stderr, PROG ": --data %s: %s\n", data, llmt_error_last());
    }
    /* At most one pass (of at least one window: the loader refuses a shard
     * shorter than T + 1); batches * batch is compared without being formed. */
    int64_t windows = (int64_t)per_epoch;
    if (batches && (uint64_t)batches <= per_epoch / (uint64_t)batch)
        windows = batches * batch;
    else if (!rc && batches)
        fprintf(stderr, PROG ": --batches %lld of %lld windows is more than one pass: "
                "evaluating its %lld windows once\n", (long long)batches, (long long)batch,
                (long long)per_epoch);
    double sum = 0;
    if (!rc)
        rc = eval_batches(model, loader, windows, (int32_t)batch, (int32_t)seq, &sum);
    if (!rc) {
        double tokens = (double)windows * (double)seq, mean = sum / tokens;
        printf("%s: %lld windows of %lld tokens (%.0f predictions): loss %.6f perplexity %.6f\n",
               what, (long long)windows, (long long)seq, tokens, mean, exp(mean));
    }
    llmt_loader_free(loader);
    llmt_model_free(model);
    llmt_context_free(ctx);
    return rc ? 1 : 0;
}
