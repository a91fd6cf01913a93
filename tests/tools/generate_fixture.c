/* Inputs and expected outputs for the llmt-generate and llmt-eval tool
 * tests, computed through paths independent of the tools: a tiny byte-vocab
 * model with spread-out weights (two weight sets, A and B), written as a
 * checkpoint store (step-1 A, step-2 B), a safetensors file (A), Hugging
 * Face directories (B; one with a tokenizer.json), two token shards, and:
 *   greedy_a.ids, greedy_b.ids  the greedy continuation of the prompt "ab"
 *       (12 tokens) by an argmax over llmt_model_logits of the whole prefix
 *       each token, comma-separated;
 *   eval_a.txt, eval_b.txt   the mean loss of A, of B, over every window
 *       of 16 + 1 tokens of the shards, by llmt_model_forward one window at
 *       a time;
 * and hf_long, B with max_seq_len 2048, with a shard long_000000.bin of 2100
 * tokens (two windows of 1024 + 1, one of 2048 + 1); model_v300.safetensors,
 * a model of vocab_size 300 (not the byte tokenizer's); hf_huge, a one-layer
 * model (head_dim 2) of max_seq_len 2^20, whose cache and attention scratch
 * for the whole context take hundreds of MiB.
 *
 * Usage: generate_fixture OUT_DIR */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "llmt/llmt.h"
#include "test_rand.h"

#define SEQ 16
#define NEW 12

static void check(int rc, const char *what)
{
    if (rc != LLMT_OK) {
        fprintf(stderr, "generate_fixture: %s: %s\n", what, llmt_error_last());
        exit(1);
    }
}

/* Weights N(0, 0.25^2), norms 1 + N(0, 0.1^2): greedy choices far from ties. */
static void set_weights(llmt_model *m, uint64_t seed)
{
    uint64_t s = seed;
    for (int32_t i = 0; i < llmt_model_num_tensors(m); i++) {
        llmt_tensor_info ti = LLMT_TENSOR_INFO_INIT;
        check(llmt_model_tensor_info(m, i, &ti), "tensor_info");
        float *w = malloc((size_t)ti.numel * sizeof *w);
        for (int64_t j = 0; j < ti.numel; j++)
            w[j] = (float)(ti.ndim == 1 ? 1.0 + 0.1 * trand_normal(&s) : 0.25 * trand_normal(&s));
        check(llmt_model_set_param(m, ti.name, w, (size_t)ti.numel), ti.name);
        free(w);
    }
}

/* The shards' tokens: random bytes and EOTs. */
static const int lens[2] = {300, 200};

static int32_t *shard_tokens(int k)
{
    uint64_t s = 3 + (uint64_t)k;
    int32_t *t = malloc((size_t)lens[k] * sizeof *t);
    for (int i = 0; i < lens[k]; i++)
        t[i] = (int32_t)(trand_u64(&s) % LLMT_BYTE_VOCAB);
    return t;
}

/* m's mean loss over every window of SEQ + 1 tokens of the shards, with the
 * window count, into dir/name.txt. */
static void write_eval(llmt_model *m, const char *dir, const char *name)
{
    double sum = 0;
    int64_t windows = 0;
    for (int k = 0; k < 2; k++) {
        int32_t *t = shard_tokens(k);
        for (int w = 0; (w + 1) * SEQ + 1 <= lens[k]; w++, windows++) {
            double loss = 0;
            check(llmt_model_forward(m, t + w * SEQ, t + w * SEQ + 1, 1, SEQ, &loss), "forward");
            sum += loss;
        }
        free(t);
    }
    char path[512];
    snprintf(path, sizeof path, "%s/%s.txt", dir, name);
    FILE *f = fopen(path, "w");
    fprintf(f, "%lld %.9f %.9f\n", (long long)windows, sum / (double)windows,
            exp(sum / (double)windows));
    fclose(f);
}

/* Greedy continuation of "ab" by full recompute, into dir/name.ids. */
static void write_greedy(llmt_model *m, const char *dir, const char *name, int vocab)
{
    int32_t t[2 + NEW] = {'a', 'b'};
    float *logits = malloc((size_t)(2 + NEW) * (size_t)vocab * sizeof *logits);
    for (int n = 2; n < 2 + NEW; n++) {
        check(llmt_model_logits(m, t, 1, n, logits, (size_t)n * (size_t)vocab), "logits");
        const float *row = logits + (size_t)(n - 1) * (size_t)vocab;
        int best = 0;
        for (int v = 1; v < vocab; v++)
            best = row[v] > row[best] ? v : best;
        t[n] = best;
    }
    char path[512];
    snprintf(path, sizeof path, "%s/%s.ids", dir, name);
    FILE *f = fopen(path, "w");
    for (int i = 2; i < 2 + NEW; i++)
        fprintf(f, i > 2 ? ",%d" : "%d", t[i]);
    fprintf(f, "\n");
    fclose(f);
    free(logits);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: generate_fixture OUT_DIR\n");
        return 2;
    }
    const char *dir = argv[1];
    char path[512], path2[512];
    llmt_context *ctx = NULL;
    check(llmt_context_create(&ctx, NULL), "context");
    llmt_model_config c = LLMT_MODEL_CONFIG_INIT;
    c.vocab_size = LLMT_BYTE_VOCAB;
    c.hidden_size = 32;
    c.num_layers = 2;
    c.num_heads = 4;
    c.num_kv_heads = 2;
    c.ffn_size = 48;
    c.max_seq_len = SEQ;
    llmt_model *m = NULL;
    check(llmt_model_create(&m, ctx, &c), "model");

    /* Weights A: step-1, model_a.safetensors. */
    llmt_ckpt_store_config sc = LLMT_CKPT_STORE_CONFIG_INIT;
    sc.sync = 0;
    llmt_ckpt_store *store = NULL;
    snprintf(path, sizeof path, "%s/ckpt", dir);
    check(llmt_ckpt_store_open(&store, ctx, path, &sc), "store");
    llmt_train_state st = LLMT_TRAIN_STATE_INIT;
    st.model = m;
    set_weights(m, 1);
    st.step = 1;
    check(llmt_ckpt_save(store, &st, LLMT_CKPT_DURABLE), "save step 1");
    snprintf(path, sizeof path, "%s/model_a.safetensors", dir);
    check(llmt_model_save_safetensors(m, path, LLMT_DTYPE_F32), "save A");
    write_greedy(m, dir, "greedy_a", c.vocab_size);
    write_eval(m, dir, "eval_a");

    /* Weights B: step-2, the Hugging Face directories. */
    set_weights(m, 2);
    st.step = 2;
    check(llmt_ckpt_save(store, &st, LLMT_CKPT_DURABLE), "save step 2");
    llmt_ckpt_store_free(store);
    llmt_hf_export_options o = LLMT_HF_EXPORT_OPTIONS_INIT;
    o.dtype = LLMT_DTYPE_F32;
    snprintf(path, sizeof path, "%s/hf", dir);
    check(llmt_model_export_hf(m, path, &o), "export hf");
    snprintf(path, sizeof path, "%s/tok", dir);
    mkdir(path, 0755);
    snprintf(path2, sizeof path2, "%s/tok/tokenizer.json", dir);
    FILE *f = fopen(path2, "w");
    fputs("{}\n", f);
    fclose(f);
    o.tokenizer_dir = path;
    snprintf(path2, sizeof path2, "%s/hf_tok", dir);
    check(llmt_model_export_hf(m, path2, &o), "export hf_tok");
    write_greedy(m, dir, "greedy_b", c.vocab_size);

    /* Two shards of random byte tokens and EOTs, and B's loss over them. */
    for (int k = 0; k < 2; k++) {
        int32_t *t = shard_tokens(k);
        snprintf(path, sizeof path, "%s/val_%06d.bin", dir, k);
        check(llmt_shard_write(path, t, (size_t)lens[k], LLMT_SHARD_VERSION_U16), "shard");
        free(t);
    }
    write_eval(m, dir, "eval_b");
    llmt_model_free(m);

    /* B with a long context, and a shard for it. */
    c.max_seq_len = 2048;
    check(llmt_model_create(&m, ctx, &c), "long model");
    set_weights(m, 2);
    snprintf(path, sizeof path, "%s/hf_long", dir);
    o.tokenizer_dir = NULL;
    check(llmt_model_export_hf(m, path, &o), "export hf_long");
    llmt_model_free(m);
    int32_t *t = malloc(2100 * sizeof *t);
    uint64_t s = 5;
    for (int i = 0; i < 2100; i++)
        t[i] = (int32_t)(trand_u64(&s) % LLMT_BYTE_VOCAB);
    snprintf(path, sizeof path, "%s/long_000000.bin", dir);
    check(llmt_shard_write(path, t, 2100, LLMT_SHARD_VERSION_U16), "long shard");
    free(t);

    /* A context far longer than any prompt here. */
    llmt_model_config h = c;
    h.hidden_size = 8;
    h.num_layers = 1;
    h.ffn_size = 16;
    h.max_seq_len = 1 << 20;
    check(llmt_model_create(&m, ctx, &h), "huge-context model");
    set_weights(m, 4);
    snprintf(path, sizeof path, "%s/hf_huge", dir);
    check(llmt_model_export_hf(m, path, &o), "export hf_huge");
    llmt_model_free(m);

    /* A vocabulary other than the byte tokenizer's. */
    c.max_seq_len = SEQ;
    c.vocab_size = 300;
    check(llmt_model_create(&m, ctx, &c), "vocab 300 model");
    set_weights(m, 3);
    snprintf(path, sizeof path, "%s/model_v300.safetensors", dir);
    check(llmt_model_save_safetensors(m, path, LLMT_DTYPE_F32), "save vocab 300");
    llmt_model_free(m);
    llmt_context_free(ctx);
    return 0;
}
