/* llmt_model on the CPU backend: parameters and their names, forward values
 * against a double-precision reference, gradients against its finite
 * differences, learning, determinism, accumulation and argument checks. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "test_util.h"

#include "llama_ref.h"
#include "llmt/llmt.h"
#include "test_context.h"
#include "test_rand.h"
#include "test_tensors.h"

static llmt_context *make_ctx(int threads)
{
    return test_context(threads, 7);
}

/* A tiny GQA model: 4 heads over 2 kv heads, head_dim 4. */
static llmt_model_config tiny_config(int tied)
{
    llmt_model_config c = LLMT_MODEL_CONFIG_INIT;
    c.vocab_size = 37;
    c.hidden_size = 16;
    c.num_layers = 2;
    c.num_heads = 4;
    c.num_kv_heads = 2;
    c.ffn_size = 24;
    c.max_seq_len = 16;
    c.tie_embeddings = tied;
    return c;
}

static void random_tokens(int32_t *t, int n, int vocab, uint64_t seed)
{
    uint64_t s = seed;
    for (int i = 0; i < n; i++)
        t[i] = (int32_t)(trand_u64(&s) % (uint64_t)vocab);
}

static void test_tensor_table(void **state)
{
    (void)state;
    llmt_context *ctx = make_ctx(1);
    llmt_model_config c = tiny_config(0);
    c.num_layers = 1;
    llmt_model *m = NULL;
    assert_int_equal(llmt_model_create(&m, ctx, &c), LLMT_OK);
    static const char *names[] = {
        "model.embed_tokens.weight",
        "model.layers.0.input_layernorm.weight",
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.self_attn.k_proj.weight",
        "model.layers.0.self_attn.v_proj.weight",
        "model.layers.0.self_attn.o_proj.weight",
        "model.layers.0.post_attention_layernorm.weight",
        "model.layers.0.mlp.gate_proj.weight",
        "model.layers.0.mlp.up_proj.weight",
        "model.layers.0.mlp.down_proj.weight",
        "model.norm.weight",
        "lm_head.weight",
    };
    static const int64_t shapes[][2] = {{37, 16}, {16, 0}, {16, 16}, {8, 16}, {8, 16}, {16, 16},
                                        {16, 0},  {24, 16}, {24, 16}, {16, 24}, {16, 0}, {37, 16}};
    assert_int_equal(llmt_model_num_tensors(m), 12);
    int64_t total = 0;
    for (int32_t i = 0; i < 12; i++) {
        llmt_tensor_info info = LLMT_TENSOR_INFO_INIT;
        assert_int_equal(llmt_model_tensor_info(m, i, &info), LLMT_OK);
        assert_string_equal(info.name, names[i]);
        assert_int_equal(info.shape[0], shapes[i][0]);
        assert_int_equal(info.shape[1], shapes[i][1]);
        assert_int_equal(info.ndim, shapes[i][1] ? 2 : 1);
        assert_int_equal(info.dtype, LLMT_DTYPE_F32);
        total += info.numel;
        int32_t idx = -1;
        assert_int_equal(llmt_model_tensor_find(m, names[i], &idx), LLMT_OK);
        assert_int_equal(idx, i);
    }
    /* V d + (2 d + d (H + 2 KV) hd + H hd d + 3 d F) + d + V d */
    assert_int_equal(total, 37 * 16 + (2 * 16 + 16 * 32 + 16 * 16 + 3 * 16 * 24) + 16 + 37 * 16);
    assert_int_equal(llmt_model_num_params(m), total);

    /* Memory: 4 bytes of weights per parameter, and 4 of gradients from
     * their first use on (here zero_grads). */
    llmt_memory_stats s = LLMT_MEMORY_STATS_INIT;
    assert_int_equal(llmt_context_memory_stats(ctx, &s), LLMT_OK);
    assert_int_equal(s.current[LLMT_MEM_PARAMS], 4 * total);
    assert_int_equal(s.current[LLMT_MEM_GRADS], 0);
    assert_int_equal(llmt_model_zero_grads(m), LLMT_OK);
    assert_int_equal(llmt_context_memory_stats(ctx, &s), LLMT_OK);
    assert_int_equal(s.current[LLMT_MEM_GRADS], 4 * total);

    /* Initialisation: norms 1, matrices N(0, 0.02^2). */
    float norm[16];
    assert_int_equal(llmt_model_get_param(m, "model.norm.weight", norm, 16), LLMT_OK);
    for (int i = 0; i < 16; i++)
        assert_true(norm[i] == 1.0f);
    float *e = malloc(37 * 16 * sizeof *e);
    assert_int_equal(llmt_model_get_param(m, "model.embed_tokens.weight", e, 37 * 16), LLMT_OK);
    double ss = 0, sum = 0;
    for (int i = 0; i < 37 * 16; i++) {
        ss += (double)e[i] * e[i];
        sum += e[i];
    }
    double sd = sqrt(ss / (37 * 16));
    assert_true(fabs(sd - 0.02) < 0.002); /* 592 samples: sd of the estimate ~ 0.0006 */
    assert_true(fabs(sum / (37 * 16)) < 0.003);
    free(e);
    llmt_model_free(m);

    /* Tied: no lm_head tensor, V d fewer parameters. */
    c.tie_embeddings = 1;
    assert_int_equal(llmt_model_create(&m, ctx, &c), LLMT_OK);
    assert_int_equal(llmt_model_num_tensors(m), 11);
    assert_int_equal(llmt_model_num_params(m), total - 37 * 16);
    assert_int_equal(llmt_model_tensor_find(m, "lm_head.weight", NULL), LLMT_ENOTFOUND);
    llmt_model_free(m);
    llmt_context_free(ctx);
}

/* Logits of the library and of the double reference agree to 1e-5 of their
 * largest magnitude, for MHA, GQA and MQA heads, tied and untied. */
static void test_forward_matches_reference(void **state)
{
    (void)state;
    const int kv_heads[] = {4, 2, 1};
    for (int tied = 0; tied <= 1; tied++)
        for (int k = 0; k < 3; k++) {
            llmt_context *ctx = make_ctx(2);
            llmt_model_config c = tiny_config(tied);
            c.num_kv_heads = kv_heads[k];
            llmt_model *m = NULL;
            assert_int_equal(llmt_model_create(&m, ctx, &c), LLMT_OK);
            test_randomize_params(m, 100 + (uint64_t)k, 0.3);
            enum { B = 3, T = 11 };
            int32_t tokens[B * T];
            random_tokens(tokens, B * T, c.vocab_size, 5 + (uint64_t)k);
            size_t n = (size_t)B * T * c.vocab_size;
            float *got = malloc(n * sizeof *got);
            double *want = malloc(n * sizeof *want);
            assert_int_equal(llmt_model_logits(m, tokens, B, T, got, n), LLMT_OK);
            ref_weights w;
            assert_int_equal(ref_weights_from_model(m, &w), 0);
            ref_forward(&w, tokens, NULL, B, T, want);
            double max_err = 0, max_ref = 0;
            for (size_t i = 0; i < n; i++) {
                max_err = fmax(max_err, fabs(got[i] - want[i]));
                max_ref = fmax(max_ref, fabs(want[i]));
            }
            if (max_err > 1e-5 * max_ref)
                fail_msg("tied %d kv %d: max |error| %g vs max |logit| %g", tied, kv_heads[k],
                         max_err, max_ref);
            assert_true(max_ref > 1.0); /* the weights made the logits non-trivial */
            ref_weights_free(&w);
            free(got);
            free(want);
            llmt_model_free(m);
            llmt_context_free(ctx);
        }
}

/* Every tensor's gradient, on up to 48 sampled entries each, against central
 * finite differences of the double reference's loss (eps 1e-5). An entry
 * passes when |g - fd| <= 1e-3 |fd|, or |g - fd| <= 1e-6 for gradients so
 * small that fp32 rounding dominates (typical entries are ~1e-2). */
static void gradient_check(int tied)
{
    llmt_context *ctx = make_ctx(2);
    llmt_model_config c = tiny_config(tied);
    llmt_model *m = NULL;
    assert_int_equal(llmt_model_create(&m, ctx, &c), LLMT_OK);
    test_randomize_params(m, 42 + (uint64_t)tied, 0.3);
    enum { B = 2, T = 9 };
    int32_t tokens[B * T], targets[B * T];
    random_tokens(tokens, B * T, c.vocab_size, 11);
    random_tokens(targets, B * T, c.vocab_size, 12);
    targets[3] = targets[10] = -1; /* ignored positions */
    double loss = 0;
    assert_int_equal(llmt_model_forward_backward(m, tokens, targets, B, T, 1.0, 0.0, &loss),
                     LLMT_OK);
    ref_weights w;
    assert_int_equal(ref_weights_from_model(m, &w), 0);
    double ref_loss = ref_forward(&w, tokens, targets, B, T, NULL);
    assert_true(fabs(loss - ref_loss) < 1e-5 * ref_loss);

    uint64_t s = 99;
    int checked = 0, large = 0;
    for (int32_t i = 0; i < w.count; i++) {
        float *g = malloc((size_t)w.numel[i] * sizeof *g);
        assert_int_equal(llmt_model_get_grad(m, w.names[i], g, (size_t)w.numel[i]), LLMT_OK);
        int samples = w.numel[i] < 48 ? (int)w.numel[i] : 48;
        for (int k = 0; k < samples; k++) {
            int64_t j = w.numel[i] <= 48 ? k : (int64_t)(trand_u64(&s) % (uint64_t)w.numel[i]);
            double keep = w.data[i][j], eps = 1e-5;
            w.data[i][j] = keep + eps;
            double up = ref_forward(&w, tokens, targets, B, T, NULL);
            w.data[i][j] = keep - eps;
            double down = ref_forward(&w, tokens, targets, B, T, NULL);
            w.data[i][j] = keep;
            double fd = (up - down) / (2 * eps), err = fabs(g[j] - fd);
            if (err > 1e-3 * fabs(fd) && err > 1e-6)
                fail_msg("tied %d: %s[%lld]: gradient %.9g, finite difference %.9g", tied,
                         w.names[i], (long long)j, (double)g[j], fd);
            checked++;
            large += fabs(fd) > 1e-3;
        }
        free(g);
    }
    assert_true(checked > 400);
    assert_true(large > checked / 2); /* most checks were on gradients well above the floor */
    ref_weights_free(&w);
    llmt_model_free(m);
    llmt_context_free(ctx);
}

static void test_gradients_untied(void **state)
{
    (void)state;
    gradient_check(0);
}

static void test_gradients_tied(void **state)
{
    (void)state;
    gradient_check(1);
}

/* Plain SGD on a repeating token sequence drives the loss below 0.1. */
static void test_learns_repeating_sequence(void **state)
{
    (void)state;
    llmt_context *ctx = make_ctx(2);
    llmt_model_config c = tiny_config(0);
    c.vocab_size = 16;
    c.hidden_size = 32;
    c.ffn_size = 64;
    llmt_model *m = NULL;
    assert_int_equal(llmt_model_create(&m, ctx, &c), LLMT_OK);
    enum { B = 4, T = 16 };
    int32_t tokens[B * T], targets[B * T];
    static const int pattern[8] = {3, 1, 4, 15, 9, 2, 6, 5};
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            tokens[b * T + t] = pattern[(b + t) % 8];
            targets[b * T + t] = pattern[(b + t + 1) % 8];
        }
    int32_t n = llmt_model_num_tensors(m);
    double first = 0, loss = 0;
    int step;
    for (step = 0; step < 400; step++) {
        assert_int_equal(llmt_model_zero_grads(m), LLMT_OK);
        assert_int_equal(llmt_model_forward_backward(m, tokens, targets, B, T, 1.0, 0.0, &loss),
                         LLMT_OK);
        if (step == 0)
            first = loss;
        if (loss < 0.1)
            break;
        for (int32_t i = 0; i < n; i++) { /* w -= lr * g */
            llmt_tensor_info info = LLMT_TENSOR_INFO_INIT;
            llmt_model_tensor_info(m, i, &info);
            float *w = malloc((size_t)info.numel * sizeof *w), *g = malloc((size_t)info.numel * sizeof *g);
            llmt_model_get_param(m, info.name, w, (size_t)info.numel);
            llmt_model_get_grad(m, info.name, g, (size_t)info.numel);
            for (int64_t j = 0; j < info.numel; j++)
                w[j] -= 0.5f * g[j];
            llmt_model_set_param(m, info.name, w, (size_t)info.numel);
            free(w);
            free(g);
        }
    }
    print_message("SGD: loss %.4f -> %.4f in %d steps\n", first, loss, step);
    assert_true(first > 2.0); /* about ln 16 at the start */
    assert_true(loss < 0.1);
    llmt_model_free(m);
    llmt_context_free(ctx);
}

/* Same inputs, same bits: twice on one model, and on a second model made
 * from the same seed. */
static void test_determinism(void **state)
{
    (void)state;
    llmt_model_config c = tiny_config(0);
    c.hidden_size = 32;
    c.ffn_size = 48;
    enum { B = 4, T = 16 };
    int32_t tokens[B * T], targets[B * T];
    random_tokens(tokens, B * T, c.vocab_size, 1);
    random_tokens(targets, B * T, c.vocab_size, 2);
    float *grads[3];
    double losses[3];
    size_t len = 0;
    for (int run = 0; run < 3; run++) {
        static llmt_context *ctx;
        static llmt_model *m;
        if (run != 1) {
            ctx = make_ctx(2);
            assert_int_equal(llmt_model_create(&m, ctx, &c), LLMT_OK);
        }
        assert_int_equal(llmt_model_zero_grads(m), LLMT_OK);
        assert_int_equal(llmt_model_forward_backward(m, tokens, targets, B, T, 1.0, 0.0,
                                                     &losses[run]), LLMT_OK);
        grads[run] = test_all_grads(m);
        len = (size_t)llmt_model_num_params(m);
        if (run != 0) {
            llmt_model_free(m);
            llmt_context_free(ctx);
        }
    }
    for (int run = 1; run < 3; run++) {
        assert_memory_equal(&losses[0], &losses[run], sizeof(double));
        assert_memory_equal(grads[0], grads[run], len * sizeof(float));
    }
    for (int run = 0; run < 3; run++)
        free(grads[run]);
}

/* Two calls over halves of a batch, each normalised by the whole batch's
 * count, add up to one call over the batch (to fp32 summation order); the
 * loss multiplier scales the gradient. */
static void test_accumulation(void **state)
{
    (void)state;
    llmt_context *ctx = make_ctx(2);
    llmt_model_config c = tiny_config(0);
    llmt_model *m = NULL;
    assert_int_equal(llmt_model_create(&m, ctx, &c), LLMT_OK);
    test_randomize_params(m, 3, 0.3);
    enum { B = 4, T = 8 };
    int32_t tokens[B * T], targets[B * T];
    random_tokens(tokens, B * T, c.vocab_size, 21);
    random_tokens(targets, B * T, c.vocab_size, 22);
    targets[0] = targets[1] = targets[17] = -1;
    const double count = B * T - 3;
    size_t len = 0;
    double whole_loss = 0, l1 = 0, l2 = 0;
    assert_int_equal(llmt_model_forward_backward(m, tokens, targets, B, T, 1.0, 0.0, &whole_loss),
                     LLMT_OK);
    float *whole = test_all_grads(m);
    len = (size_t)llmt_model_num_params(m);
    assert_int_equal(llmt_model_zero_grads(m), LLMT_OK);
    assert_int_equal(llmt_model_forward_backward(m, tokens, targets, 2, T, 1.0, count, &l1), LLMT_OK);
    assert_int_equal(llmt_model_forward_backward(m, tokens + 2 * T, targets + 2 * T, 2, T, 1.0,
                                                 count, &l2), LLMT_OK);
    float *parts = test_all_grads(m);
    /* half 1 has 14 counted targets, half 2 has 15 */
    assert_true(fabs((l1 * 14 + l2 * 15) / count - whole_loss) < 1e-6 * whole_loss);
    double max_err = 0, max_g = 0;
    for (size_t i = 0; i < len; i++) {
        max_err = fmax(max_err, fabs((double)parts[i] - whole[i]));
        max_g = fmax(max_g, fabs(whole[i]));
    }
    assert_true(max_err <= 1e-5 * max_g);

    /* A loss multiplier of 8 (a power of two) scales every gradient exactly. */
    assert_int_equal(llmt_model_zero_grads(m), LLMT_OK);
    assert_int_equal(llmt_model_forward_backward(m, tokens, targets, B, T, 8.0, 0.0, NULL), LLMT_OK);
    float *scaled = test_all_grads(m);
    for (size_t i = 0; i < len; i++)
        assert_true(scaled[i] == 8.0f * whole[i]);
    free(whole);
    free(parts);
    free(scaled);
    llmt_model_free(m);
    llmt_context_free(ctx);
}

static void test_invalid_arguments(void **state)
{
    (void)state;
    llmt_context *ctx = make_ctx(1);
    llmt_model_config c = tiny_config(0);
    llmt_model *m = NULL;
    c.num_kv_heads = 3;
    assert_int_equal(llmt_model_create(&m, ctx, &c), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "num_kv_heads = 3");
    assert_null(m);
    c = tiny_config(0);
    c.hidden_size = 18; /* head_dim 4.5 */
    assert_int_equal(llmt_model_create(&m, ctx, &c), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "hidden_size = 18");
    c = tiny_config(0);
    c.version = LLMT_MODEL_CONFIG_VERSION + 1;
    assert_int_equal(llmt_model_create(&m, ctx, &c), LLMT_EVERSION);
    c = tiny_config(0);
    c.rms_norm_eps = 0.0f;
    assert_int_equal(llmt_model_create(&m, ctx, &c), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "rms_norm_eps");
    assert_int_equal(llmt_model_create(&m, NULL, &c), LLMT_EINVAL);

    c = tiny_config(0);
    assert_int_equal(llmt_model_create(&m, ctx, &c), LLMT_OK);
    int32_t tokens[2 * 4] = {1, 2, 3, 4, 5, 6, 37, 8}, targets[2 * 4] = {0};
    assert_int_equal(llmt_model_forward_backward(m, tokens, targets, 2, 4, 1, 0, NULL), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "tokens[6] (sequence 1, position 2) = 37");
    tokens[6] = 7;
    targets[5] = -2;
    assert_int_equal(llmt_model_forward_backward(m, tokens, targets, 2, 4, 1, 0, NULL), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "targets[5]");
    targets[5] = 0;
    assert_int_equal(llmt_model_forward_backward(m, tokens, targets, 1, 17, 1, 0, NULL), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "seq_len = 17");
    assert_int_equal(llmt_model_forward_backward(m, tokens, NULL, 2, 4, 1, 0, NULL), LLMT_EINVAL);
    assert_int_equal(llmt_model_forward_backward(m, tokens, targets, 2, 4, NAN, 0, NULL), LLMT_EINVAL);
    float small[3];
    assert_int_equal(llmt_model_get_param(m, "model.norm.weight", small, 3), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "has 16 elements");
    assert_int_equal(llmt_model_get_param(m, "model.nope", small, 3), LLMT_ENOTFOUND);
    assert_contains(llmt_error_last(), "model.nope");
    llmt_tensor_info info = LLMT_TENSOR_INFO_INIT;
    assert_int_equal(llmt_model_tensor_info(m, 99, &info), LLMT_EINVAL);
    info.version = 5;
    assert_int_equal(llmt_model_tensor_info(m, 0, &info), LLMT_EVERSION);
    float logits[4];
    assert_int_equal(llmt_model_logits(m, tokens, 2, 4, logits, 4), LLMT_EINVAL);
    llmt_model_free(m);
    llmt_model_free(NULL);

    /* A budget too small for the activation arena: ENOMEM, gradients untouched. */
    llmt_context_config cc = LLMT_CONTEXT_CONFIG_INIT;
    llmt_context *tight = NULL;
    assert_int_equal(llmt_context_create(&tight, &cc), LLMT_OK);
    assert_int_equal(llmt_model_create(&m, tight, &c), LLMT_OK);
    assert_int_equal(llmt_model_zero_grads(m), LLMT_OK); /* the gradients exist */
    llmt_memory_stats s = LLMT_MEMORY_STATS_INIT;
    llmt_context_memory_stats(tight, &s);
    assert_int_equal(llmt_context_set_budget(tight, s.total_current + 1000), LLMT_OK);
    assert_int_equal(llmt_model_forward_backward(m, tokens, targets, 2, 4, 1, 0, NULL), LLMT_ENOMEM);
    assert_contains(llmt_error_last(), "activation");
    float g[16];
    assert_int_equal(llmt_model_get_grad(m, "model.norm.weight", g, 16), LLMT_OK);
    for (int i = 0; i < 16; i++)
        assert_true(g[i] == 0.0f);
    llmt_model_free(m);
    llmt_context_free(tight);
    llmt_context_free(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tensor_table),
        cmocka_unit_test(test_forward_matches_reference),
        cmocka_unit_test(test_gradients_untied),
        cmocka_unit_test(test_gradients_tied),
        cmocka_unit_test(test_learns_repeating_sequence),
        cmocka_unit_test(test_determinism),
        cmocka_unit_test(test_accumulation),
        cmocka_unit_test(test_invalid_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
