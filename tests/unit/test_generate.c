/* llmt_generator: cached logits and greedy tokens against a full recompute
 * of the prefix through llmt_model_logits each token (fp32, bf16_mixed and
 * fp16_mixed, GQA, MQA and MHA, tied and untied, prompts of one chunk and of
 * several, up to max_seq_len), sampling against a reference sampler written here, seeds,
 * the stop token, memory accounting and argument checks; and the CPU op
 * attention_kv_fwd alone against a double-precision reference. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "test_util.h"

#include "core/half.h"
#include "core/rng.h"
#include "ops/ops.h"
#include "llmt/llmt.h"
#include "test_context.h"
#include "test_rand.h"

/* A tiny model; precision, tied and kv_heads vary, seq is max_seq_len. */
static llmt_model_config tiny(int precision, int tied, int kv_heads, int seq)
{
    llmt_model_config c = LLMT_MODEL_CONFIG_INIT;
    c.vocab_size = 37;
    c.hidden_size = 32;
    c.num_layers = 2;
    c.num_heads = 4;
    c.num_kv_heads = kv_heads;
    c.ffn_size = 48;
    c.max_seq_len = seq;
    c.tie_embeddings = tied;
    c.precision = precision;
    return c;
}

/* Creates the model with weights N(0, 0.25^2) (norm weights 1 + N(0, 0.1^2)),
 * far from the default 0.02 so that logits are spread and greedy choices are
 * not near ties. */
static llmt_model *make_model(llmt_context *ctx, const llmt_model_config *c, uint64_t seed)
{
    llmt_model *m = NULL;
    assert_int_equal(llmt_model_create(&m, ctx, c), LLMT_OK);
    uint64_t s = seed;
    for (int32_t i = 0; i < llmt_model_num_tensors(m); i++) {
        llmt_tensor_info ti = LLMT_TENSOR_INFO_INIT;
        assert_int_equal(llmt_model_tensor_info(m, i, &ti), LLMT_OK);
        float *w = malloc((size_t)ti.numel * sizeof *w);
        int norm = ti.ndim == 1;
        for (int64_t j = 0; j < ti.numel; j++)
            w[j] = (float)(norm ? 1.0 + 0.1 * trand_normal(&s) : 0.25 * trand_normal(&s));
        assert_int_equal(llmt_model_set_param(m, ti.name, w, (size_t)ti.numel), LLMT_OK);
        free(w);
    }
    return m;
}

static void random_tokens(int32_t *t, int n, int vocab, uint64_t seed)
{
    uint64_t s = seed;
    for (int i = 0; i < n; i++)
        t[i] = (int32_t)(trand_u64(&s) % (uint64_t)vocab);
}

/* The logits after tokens[0..n), recomputed from scratch (the independent path). */
static void full_logits(llmt_model *m, const int32_t *tokens, int n, int vocab, float *out)
{
    float *all = malloc((size_t)n * (size_t)vocab * sizeof *all);
    assert_int_equal(llmt_model_logits(m, tokens, 1, n, all, (size_t)n * (size_t)vocab), LLMT_OK);
    memcpy(out, all + (size_t)(n - 1) * (size_t)vocab, (size_t)vocab * sizeof *out);
    free(all);
}

static int argmax(const float *x, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}

/* Largest |a - b| over n, relative to the largest |b|. */
static double rel_diff(const float *a, const float *b, int n)
{
    double d = 0, scale = 0;
    for (int i = 0; i < n; i++) {
        d = fmax(d, fabs((double)a[i] - b[i]));
        scale = fmax(scale, fabs((double)b[i]));
    }
    return d / scale;
}

typedef struct variant {
    int precision, tied, kv_heads, seq, prompt;
    double tol; /* cached vs recomputed logits, relative to the largest */
} variant;

/* fp32 agrees to rounding (the products sum in other orders: about 1e-6
 * seen); bf16_mixed rounds every activation to 8 bits of mantissa, so a
 * rounding flipped by another order moves a logit by a part in 256 of its
 * inputs (bitwise equal seen here, with the same oneDNN kernels). */
static const variant variants[] = {
    {LLMT_PRECISION_FP32, 0, 2, 24, 5, 1e-5},
    {LLMT_PRECISION_FP32, 1, 4, 24, 1, 1e-5},
    {LLMT_PRECISION_FP32, 0, 1, 80, 70, 1e-5}, /* a prompt of two chunks */
    {LLMT_PRECISION_BF16_MIXED, 0, 2, 24, 5, 1e-2},
    {LLMT_PRECISION_BF16_MIXED, 1, 2, 24, 3, 1e-2},
    {LLMT_PRECISION_FP16_MIXED, 0, 2, 24, 4, 1e-2}, /* fp16: 11 bits, within bf16's bound */
};

/* Feeding a prompt, then one token at a time up to max_seq_len: each step's
 * logits against a full recompute. */
static void test_cached_logits_match_recompute(void **state)
{
    (void)state;
    for (size_t v = 0; v < sizeof variants / sizeof *variants; v++) {
        const variant *x = &variants[v];
        llmt_context *ctx = test_context(2, 3);
        llmt_model_config c = tiny(x->precision, x->tied, x->kv_heads, x->seq);
        llmt_model *m = make_model(ctx, &c, 100 + v);
        llmt_generator *g = NULL;
        assert_int_equal(llmt_generator_create(&g, m, NULL), LLMT_OK);
        int32_t *tokens = malloc((size_t)x->seq * sizeof *tokens);
        random_tokens(tokens, x->seq, c.vocab_size, 7 + v);
        float cached[37], full[37];
        double worst = 0;
        assert_int_equal(llmt_generator_feed(g, tokens, x->prompt, cached, 37), LLMT_OK);
        for (int n = x->prompt;; n++) {
            full_logits(m, tokens, n, 37, full);
            worst = fmax(worst, rel_diff(cached, full, 37));
            if (n == x->seq)
                break;
            assert_int_equal(llmt_generator_feed(g, tokens + n, 1, cached, 37), LLMT_OK);
        }
        int32_t pos = 0;
        assert_int_equal(llmt_generator_position(g, &pos), LLMT_OK);
        assert_int_equal(pos, x->seq);
        printf("variant %zu: cached logits within %.3g of the largest\n", v, worst);
        if (worst > x->tol)
            fail_msg("variant %zu: cached logits differ by %g of the largest (tolerance %g)", v,
                     worst, x->tol);
        free(tokens);
        llmt_generator_free(g);
        llmt_model_free(m);
        llmt_context_free(ctx);
    }
}

/* Greedy generation to max_seq_len equals an argmax loop over full recomputes. */
static void test_greedy_matches_recompute(void **state)
{
    (void)state;
    for (size_t v = 0; v < sizeof variants / sizeof *variants; v++) {
        const variant *x = &variants[v];
        llmt_context *ctx = test_context(2, 3);
        llmt_model_config c = tiny(x->precision, x->tied, x->kv_heads, x->seq);
        llmt_model *m = make_model(ctx, &c, 200 + v);
        llmt_generator_config gc = LLMT_GENERATOR_CONFIG_INIT;
        gc.temperature = 0.0f;
        llmt_generator *g = NULL;
        assert_int_equal(llmt_generator_create(&g, m, &gc), LLMT_OK);
        int32_t *seq = malloc((size_t)x->seq * sizeof *seq), *out = malloc((size_t)x->seq * 4);
        random_tokens(seq, x->prompt, c.vocab_size, 11 + v);
        int32_t max_new = x->seq - x->prompt, n_out = -1;
        assert_int_equal(llmt_generator_generate(g, seq, x->prompt, max_new, -1, out,
                                                 (size_t)max_new, &n_out), LLMT_OK);
        assert_int_equal(n_out, max_new);
        float logits[37];
        for (int n = x->prompt; n < x->seq; n++) {
            full_logits(m, seq, n, 37, logits);
            seq[n] = argmax(logits, 37);
            if (out[n - x->prompt] != seq[n])
                fail_msg("variant %zu: token %d is %d with the cache, %d recomputed", v,
                         n - x->prompt, out[n - x->prompt], seq[n]);
        }
        /* top_k = 1 at temperature 1 draws nothing but the greedy token. */
        llmt_generator *g1 = NULL;
        llmt_generator_config k1 = LLMT_GENERATOR_CONFIG_INIT;
        k1.top_k = 1;
        k1.seed = 99;
        assert_int_equal(llmt_generator_create(&g1, m, &k1), LLMT_OK);
        int32_t *out1 = malloc((size_t)x->seq * 4);
        assert_int_equal(llmt_generator_generate(g1, seq, x->prompt, max_new, -1, out1,
                                                 (size_t)max_new, &n_out), LLMT_OK);
        assert_memory_equal(out1, out, (size_t)max_new * sizeof *out);
        free(seq);
        free(out);
        free(out1);
        llmt_generator_free(g1);
        llmt_generator_free(g);
        llmt_model_free(m);
        llmt_context_free(ctx);
    }
}

/* The reference sampler: HF's warpers spelled out over a copy of logits
 * (temperature, top-k keeping ties, top-p from the least likely up), then
 * the token at which the cumulative probability, most likely first, passes u. */
static int reference_sample(const float *logits_in, int V, float temp, int top_k, float top_p,
                            float u)
{
    double z[64], p[64];
    int keep[64], rank[64];
    float top = logits_in[0];
    for (int i = 1; i < V; i++)
        top = fmaxf(top, logits_in[i]);
    for (int i = 0; i < V; i++) {
        z[i] = (double)((logits_in[i] - top) / temp); /* HF's logits / temp, shifted */
        keep[i] = 1;
    }
    /* rank: how many come before i (larger, or equal with a lower index) */
    for (int i = 0; i < V; i++) {
        rank[i] = 0;
        for (int j = 0; j < V; j++)
            rank[i] += (float)z[j] > (float)z[i] || ((float)z[j] == (float)z[i] && j < i);
    }
    if (top_k > 0)
        for (int i = 0; i < V; i++) {
            int larger = 0;
            for (int j = 0; j < V; j++)
                larger += (float)z[j] > (float)z[i];
            keep[i] = larger < top_k;
        }
    double mx = -INFINITY, sum = 0;
    for (int i = 0; i < V; i++)
        if (keep[i])
            mx = fmax(mx, z[i]);
    for (int i = 0; i < V; i++)
        sum += p[i] = keep[i] ? exp(z[i] - mx) : 0.0;
    for (int i = 0; i < V; i++)
        p[i] /= sum;
    int drop[64] = {0};
    if (top_p < 1.0f)
        for (int i = 0; i < V; i++) {
            /* mass of top-k's tokens ranked at or after i */
            double below = 0;
            for (int j = 0; j < V; j++)
                below += keep[j] && rank[j] >= rank[i] ? p[j] : 0.0;
            drop[i] = rank[i] > 0 && below <= 1.0 - (double)top_p;
        }
    for (int i = 0; i < V; i++)
        keep[i] = keep[i] && !drop[i];
    sum = 0;
    for (int i = 0; i < V; i++)
        sum += keep[i] ? p[i] : 0.0;
    double cum = 0;
    int last = -1;
    for (int r = 0; r < V; r++)
        for (int i = 0; i < V; i++)
            if (rank[i] == r && keep[i]) {
                last = i;
                if ((cum += p[i] / sum) > (double)u)
                    return i;
            }
    return last;
}

/* The first two sampled tokens (draws 0 and 1) against the reference
 * sampler over many seeds and settings, the second on the recomputed logits
 * after the prompt and the first; a seed repeats its tokens, another seed
 * gives others. */
static void test_sampling(void **state)
{
    (void)state;
    llmt_context *ctx = test_context(1, 3);
    llmt_model_config c = tiny(LLMT_PRECISION_FP32, 0, 2, 24);
    llmt_model *m = make_model(ctx, &c, 300);
    int32_t prompt[5] = {1, 2, 3, 4, 0};
    float logits[37], next[37];
    full_logits(m, prompt, 4, 37, logits);
    /* Soften the logits' spread with temperatures above 1 so top-k and
     * top-p have several tokens to choose among. */
    static const struct { float temp; int top_k; float top_p; } settings[] = {
        {1.0f, 0, 1.0f}, {3.0f, 0, 1.0f}, {3.0f, 5, 1.0f}, {3.0f, 0, 0.6f}, {5.0f, 8, 0.8f},
        {0.5f, 2, 1.0f},
    };
    int differs = 0;
    for (size_t s = 0; s < sizeof settings / sizeof *settings; s++)
        for (uint64_t seed = 0; seed < 40; seed++) {
            llmt_generator_config gc = LLMT_GENERATOR_CONFIG_INIT;
            gc.temperature = settings[s].temp;
            gc.top_k = settings[s].top_k;
            gc.top_p = settings[s].top_p;
            gc.seed = seed;
            llmt_generator *g = NULL;
            assert_int_equal(llmt_generator_create(&g, m, &gc), LLMT_OK);
            int32_t out[8], again[8], n = 0;
            assert_int_equal(llmt_generator_generate(g, prompt, 4, 8, -1, out, 8, &n), LLMT_OK);
            float u = llmt_rng_u32_to_uniform(llmt_rng_u32_at(seed, LLMT_STREAM_SAMPLING, 0));
            int want = reference_sample(logits, 37, gc.temperature, gc.top_k, gc.top_p, u);
            if (out[0] != want)
                fail_msg("setting %zu seed %llu: sampled %d, reference %d", s,
                         (unsigned long long)seed, out[0], want);
            prompt[4] = out[0];
            full_logits(m, prompt, 5, 37, next);
            u = llmt_rng_u32_to_uniform(llmt_rng_u32_at(seed, LLMT_STREAM_SAMPLING, 1));
            want = reference_sample(next, 37, gc.temperature, gc.top_k, gc.top_p, u);
            if (out[1] != want)
                fail_msg("setting %zu seed %llu: second token %d, reference %d", s,
                         (unsigned long long)seed, out[1], want);
            assert_int_equal(llmt_generator_generate(g, prompt, 4, 8, -1, again, 8, &n), LLMT_OK);
            assert_memory_equal(out, again, sizeof out);
            if (seed > 0) {
                gc.seed = seed - 1;
                llmt_generator *h = NULL;
                assert_int_equal(llmt_generator_create(&h, m, &gc), LLMT_OK);
                assert_int_equal(llmt_generator_generate(h, prompt, 4, 8, -1, again, 8, &n),
                                 LLMT_OK);
                differs += memcmp(out, again, sizeof out) != 0;
                llmt_generator_free(h);
            }
            llmt_generator_free(g);
        }
    assert_true(differs > 0);
    llmt_model_free(m);
    llmt_context_free(ctx);
}

/* A temperature so small that logits / T overflows (1e-38, and the
 * subnormal 1e-39) draws the greedy tokens: no inf - inf makes a NaN. */
static void test_tiny_temperature_is_greedy(void **state)
{
    (void)state;
    llmt_context *ctx = test_context(1, 3);
    llmt_model_config c = tiny(LLMT_PRECISION_FP32, 0, 2, 24);
    llmt_model *m = make_model(ctx, &c, 350);
    int32_t prompt[3] = {5, 6, 7}, greedy[12], out[12], n = 0;
    llmt_generator_config gc = LLMT_GENERATOR_CONFIG_INIT;
    gc.temperature = 0.0f;
    llmt_generator *g = NULL;
    assert_int_equal(llmt_generator_create(&g, m, &gc), LLMT_OK);
    assert_int_equal(llmt_generator_generate(g, prompt, 3, 12, -1, greedy, 12, &n), LLMT_OK);
    llmt_generator_free(g);
    static const float temps[] = {1e-38f, 1e-39f};
    for (size_t t = 0; t < 2; t++)
        for (uint64_t seed = 0; seed < 4; seed++) {
            gc.temperature = temps[t];
            gc.seed = seed;
            assert_int_equal(llmt_generator_create(&g, m, &gc), LLMT_OK);
            assert_int_equal(llmt_generator_generate(g, prompt, 3, 12, -1, out, 12, &n), LLMT_OK);
            assert_int_equal(n, 12);
            if (memcmp(out, greedy, sizeof out) != 0)
                fail_msg("temperature %g seed %llu: not the greedy tokens (first %d, greedy %d)",
                         (double)temps[t], (unsigned long long)seed, out[0], greedy[0]);
            llmt_generator_free(g);
        }
    llmt_model_free(m);
    llmt_context_free(ctx);
}

/* Generation stops after the stop token, which is written. */
static void test_stop_token(void **state)
{
    (void)state;
    llmt_context *ctx = test_context(1, 3);
    llmt_model_config c = tiny(LLMT_PRECISION_FP32, 0, 2, 24);
    llmt_model *m = make_model(ctx, &c, 400);
    llmt_generator_config gc = LLMT_GENERATOR_CONFIG_INIT;
    gc.seed = 5;
    gc.temperature = 2.0f;
    llmt_generator *g = NULL;
    assert_int_equal(llmt_generator_create(&g, m, &gc), LLMT_OK);
    int32_t prompt[2] = {9, 10}, out[20], out2[20], n = 0, n2 = 0;
    assert_int_equal(llmt_generator_generate(g, prompt, 2, 20, -1, out, 20, &n), LLMT_OK);
    assert_int_equal(n, 20);
    int first = 0; /* the first position of the token at index 6 */
    while (out[first] != out[6])
        first++;
    assert_int_equal(llmt_generator_generate(g, prompt, 2, 20, out[6], out2, 20, &n2), LLMT_OK);
    assert_int_equal(n2, first + 1);
    assert_memory_equal(out2, out, (size_t)n2 * sizeof *out);
    llmt_generator_free(g);
    llmt_model_free(m);
    llmt_context_free(ctx);
}

/* The cache is ACTIVATIONS memory of exactly layers x context x 2 kv heads
 * x head_dim elements, and the budget can refuse it. The workspace of a long
 * context is what cached attention needs per thread, (64 + 4 head_dim)
 * context floats, plus the chunk's buffers (64 rows of a few hidden widths):
 * not the training attention's (128 + 8 head_dim) context floats. */
static void test_memory(void **state)
{
    (void)state;
    llmt_context *ctx = test_context(1, 3);
    llmt_model_config c = tiny(LLMT_PRECISION_BF16_MIXED, 0, 2, 24);
    llmt_model *m = make_model(ctx, &c, 500);
    llmt_memory_stats before = LLMT_MEMORY_STATS_INIT, during = LLMT_MEMORY_STATS_INIT,
                      after = LLMT_MEMORY_STATS_INIT;
    assert_int_equal(llmt_context_memory_stats(ctx, &before), LLMT_OK);
    llmt_generator_config gc = LLMT_GENERATOR_CONFIG_INIT;
    gc.max_context = 20;
    llmt_generator *g = NULL;
    assert_int_equal(llmt_generator_create(&g, m, &gc), LLMT_OK);
    assert_int_equal(llmt_context_memory_stats(ctx, &during), LLMT_OK);
    assert_int_equal(during.current[LLMT_MEM_ACTIVATIONS] - before.current[LLMT_MEM_ACTIVATIONS],
                     2 * 20 * 2 * 2 * 8 * 2); /* layers, positions, k and v, kv heads, hd, bf16 */
    assert_true(during.current[LLMT_MEM_WORKSPACE] > before.current[LLMT_MEM_WORKSPACE]);
    llmt_generator_free(g);
    assert_int_equal(llmt_context_memory_stats(ctx, &after), LLMT_OK);
    assert_int_equal(after.total_current, before.total_current);
    assert_int_equal(llmt_context_set_budget(ctx, before.total_current + 100), LLMT_OK);
    assert_int_equal(llmt_generator_create(&g, m, &gc), LLMT_ENOMEM);
    assert_null(g);
    llmt_model_free(m);
    llmt_context_free(ctx);

    const int threads = 2, ctx_len = 4096, hd = 8;
    ctx = test_context(threads, 3);
    c = tiny(LLMT_PRECISION_BF16_MIXED, 0, 2, ctx_len);
    m = make_model(ctx, &c, 501);
    assert_int_equal(llmt_context_memory_stats(ctx, &before), LLMT_OK);
    assert_int_equal(llmt_generator_create(&g, m, NULL), LLMT_OK);
    assert_int_equal(llmt_context_memory_stats(ctx, &during), LLMT_OK);
    uint64_t work = during.current[LLMT_MEM_WORKSPACE] - before.current[LLMT_MEM_WORKSPACE];
    uint64_t attention = (uint64_t)threads * (64 + 4 * hd) * ctx_len * sizeof(float);
    printf("workspace %llu bytes for cached attention's %llu\n", (unsigned long long)work,
           (unsigned long long)attention);
    assert_true(work >= attention);
    assert_true(work <= attention + 64 * 1024);
    llmt_generator_free(g);
    llmt_model_free(m);
    llmt_context_free(ctx);
}

static void expect(int rc, int want, const char *needle)
{
    assert_int_equal(rc, want);
    assert_contains(llmt_error_last(), needle);
}

static void test_errors(void **state)
{
    (void)state;
    llmt_context *ctx = test_context(1, 3);
    llmt_model_config c = tiny(LLMT_PRECISION_FP32, 0, 2, 16);
    llmt_model *m = make_model(ctx, &c, 600);
    llmt_generator *g = NULL;
    llmt_generator_config gc = LLMT_GENERATOR_CONFIG_INIT;
    expect(llmt_generator_create(NULL, m, NULL), LLMT_EINVAL, "out is NULL");
    expect(llmt_generator_create(&g, NULL, NULL), LLMT_EINVAL, "model is NULL");
    gc.version = 99;
    expect(llmt_generator_create(&g, m, &gc), LLMT_EVERSION, "cfg->version = 99");
    llmt_generator_config_init(&gc);
    gc.max_context = 17;
    expect(llmt_generator_create(&g, m, &gc), LLMT_EINVAL, "cfg->max_context = 17");
    llmt_generator_config_init(&gc);
    gc.temperature = -0.5f;
    expect(llmt_generator_create(&g, m, &gc), LLMT_EINVAL, "cfg->temperature = -0.5");
    gc.temperature = NAN;
    expect(llmt_generator_create(&g, m, &gc), LLMT_EINVAL, "cfg->temperature");
    llmt_generator_config_init(&gc);
    gc.top_k = -1;
    expect(llmt_generator_create(&g, m, &gc), LLMT_EINVAL, "cfg->top_k = -1");
    llmt_generator_config_init(&gc);
    gc.top_p = 0.0f;
    expect(llmt_generator_create(&g, m, &gc), LLMT_EINVAL, "cfg->top_p = 0");
    gc.top_p = 1.5f;
    expect(llmt_generator_create(&g, m, &gc), LLMT_EINVAL, "cfg->top_p = 1.5");
    assert_null(g);

    llmt_generator_config_init(&gc);
    gc.max_context = 8;
    assert_int_equal(llmt_generator_create(&g, m, &gc), LLMT_OK);
    int32_t p[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, out[10], n = 0;
    expect(llmt_generator_generate(g, p, 9, 0, -1, out, 10, &n), LLMT_EINVAL, "n_prompt = 9");
    expect(llmt_generator_generate(g, p, 0, 1, -1, out, 10, &n), LLMT_EINVAL, "n_prompt = 0");
    expect(llmt_generator_generate(g, p, 5, 4, -1, out, 10, &n), LLMT_EINVAL, "max_new = 4");
    expect(llmt_generator_generate(g, p, 5, -1, -1, out, 10, &n), LLMT_EINVAL, "max_new = -1");
    expect(llmt_generator_generate(g, p, 5, 3, -1, out, 2, &n), LLMT_EINVAL, "cap = 2");
    expect(llmt_generator_generate(g, p, 5, 3, 37, out, 10, &n), LLMT_EINVAL, "stop_token = 37");
    expect(llmt_generator_generate(g, p, 5, 3, -2, out, 10, &n), LLMT_EINVAL, "stop_token = -2");
    expect(llmt_generator_generate(g, NULL, 5, 3, -1, out, 10, &n), LLMT_EINVAL, "prompt is NULL");
    p[3] = 37;
    expect(llmt_generator_generate(g, p, 5, 3, -1, out, 10, &n), LLMT_EINVAL, "prompt[3] = 37");
    p[3] = -1;
    expect(llmt_generator_feed(g, p, 5, NULL, 0), LLMT_EINVAL, "tokens[3] = -1");
    p[3] = 4;
    int32_t pos = -1;
    assert_int_equal(llmt_generator_position(g, &pos), LLMT_OK);
    assert_int_equal(pos, 0); /* refused feeds leave the cache as it was */
    float logits[37];
    expect(llmt_generator_feed(g, p, 5, logits, 36), LLMT_EINVAL, "count = 36");
    assert_int_equal(llmt_generator_feed(g, p, 6, NULL, 0), LLMT_OK);
    expect(llmt_generator_feed(g, p, 3, NULL, 0), LLMT_EINVAL, "n = 3 (need 1..2");
    expect(llmt_generator_feed(g, p, 0, NULL, 0), LLMT_EINVAL, "n = 0");
    assert_int_equal(llmt_generator_position(g, &pos), LLMT_OK);
    assert_int_equal(pos, 6);
    assert_int_equal(llmt_generator_reset(g), LLMT_OK);
    assert_int_equal(llmt_generator_position(g, &pos), LLMT_OK);
    assert_int_equal(pos, 0);
    expect(llmt_generator_reset(NULL), LLMT_EINVAL, "gen is NULL");
    expect(llmt_generator_position(g, NULL), LLMT_EINVAL, "out is NULL");
    llmt_generator_free(g);
    llmt_generator_free(NULL);
    llmt_model_free(m);
    llmt_context_free(ctx);
}

/* attention_kv_fwd on the CPU against attention computed in double here:
 * query blocks past the first (m > 64), a cache before the new rows, GQA,
 * MQA and MHA, fp32 and bf16, three threads. Inputs are rounded to the dtype
 * first, so the reference sees what the op sees. */
static void test_attention_kv_op(void **state)
{
    (void)state;
    static const struct { int64_t H, KV, hd, t, m; } cases[] = {
        {4, 2, 8, 100, 70}, {4, 1, 16, 9, 1}, {2, 2, 4, 5, 5}, {4, 4, 8, 130, 130},
    };
    llmt_device *dev = NULL;
    assert_int_equal(llmt_cpu_backend_create(3, &dev), LLMT_OK);
    uint64_t seed = 17;
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++)
        for (int dt = LLMT_DTYPE_F32; dt != -1; dt = dt == LLMT_DTYPE_F32 ? LLMT_DTYPE_BF16 : -1) {
            const int64_t H = cases[c].H, KV = cases[c].KV, hd = cases[c].hd, t = cases[c].t,
                          m = cases[c].m, past = t - m, ldkv = 2 * KV * hd;
            const size_t es = dt == LLMT_DTYPE_F32 ? 4 : 2;
            size_t nq = (size_t)(m * H * hd), nkv = (size_t)(t * ldkv);
            double *q = malloc(nq * sizeof *q), *kv = malloc(nkv * sizeof *kv);
            void *dq = malloc(nq * es), *dkv = malloc(nkv * es), *dout = malloc(nq * es);
            for (size_t i = 0; i < nq + nkv; i++) {
                float v = (float)trand_normal(&seed);
                uint16_t b = llmt_f32_to_bf16(v);
                double r = dt == LLMT_DTYPE_F32 ? v : llmt_bf16_to_f32(b);
                double *dst = i < nq ? &q[i] : &kv[i - nq];
                void *raw = i < nq ? dq : dkv;
                size_t j = i < nq ? i : i - nq;
                *dst = r;
                if (dt == LLMT_DTYPE_F32)
                    ((float *)raw)[j] = v;
                else
                    ((uint16_t *)raw)[j] = b;
            }
            /* Exactly the scratch the op asks for: the sanitizers see an overrun. */
            llmt_attn_dims ad = {1, t, H, KV, hd};
            void *scratch = malloc(dev->ops->attention_kv_scratch_bytes(&ad, 3));
            assert_int_equal(dev->ops->attention_kv_fwd(dev, dout, dq, dkv, m, &ad, dt, scratch),
                             LLMT_OK);
            double worst = 0, scale = 0;
            for (int64_t h = 0; h < H; h++)
                for (int64_t i = 0; i < m; i++) {
                    int64_t g = h / (H / KV), seen = past + i + 1;
                    double *p = malloc((size_t)seen * sizeof *p), mx = -INFINITY, sum = 0;
                    for (int64_t j = 0; j < seen; j++) {
                        double dot = 0;
                        for (int64_t e = 0; e < hd; e++)
                            dot += q[(i * H + h) * hd + e] * kv[j * ldkv + g * hd + e];
                        p[j] = dot / sqrt((double)hd);
                        mx = fmax(mx, p[j]);
                    }
                    for (int64_t j = 0; j < seen; j++)
                        sum += p[j] = exp(p[j] - mx);
                    for (int64_t e = 0; e < hd; e++) {
                        double want = 0;
                        for (int64_t j = 0; j < seen; j++)
                            want += p[j] / sum * kv[j * ldkv + (KV + g) * hd + e];
                        size_t at = (size_t)((i * H + h) * hd + e);
                        double got = dt == LLMT_DTYPE_F32
                                         ? ((float *)dout)[at]
                                         : llmt_bf16_to_f32(((uint16_t *)dout)[at]);
                        worst = fmax(worst, fabs(got - want));
                        scale = fmax(scale, fabs(want));
                    }
                    free(p);
                }
            /* fp32: the sums' order and fast_expf (about 1e-7 relative);
             * bf16: the output's rounding, 2^-9 relative. */
            double tol = (dt == LLMT_DTYPE_F32 ? 1e-5 : 4e-3) * scale;
            if (worst > tol)
                fail_msg("case %zu dtype %d: off by %g (tolerance %g)", c, dt, worst, tol);
            free(q);
            free(kv);
            free(dq);
            free(dkv);
            free(dout);
            free(scratch);
        }
    dev->ops->destroy(dev);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cached_logits_match_recompute),
        cmocka_unit_test(test_greedy_matches_recompute),
        cmocka_unit_test(test_sampling),
        cmocka_unit_test(test_tiny_temperature_is_greedy),
        cmocka_unit_test(test_stop_token),
        cmocka_unit_test(test_memory),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_attention_kv_op),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
