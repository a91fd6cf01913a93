/* llmt-train's sample logits (examples/train_cli/sample_logits.c): the
 * recompute that backends without cached attention use (CUDA) against the
 * KV-cache generator, token by token past max_seq_len, where both see only
 * the last window; and the CPU opening the generator. */
#include <math.h>
#include <stdlib.h>

#include "test_util.h"

#include "llmt/llmt.h"
#include "sample_logits.h"
#include "test_context.h"
#include "test_rand.h"

#define VOCAB 40
#define WINDOW 8
#define LEN 21

static void test_recompute_matches_cache(void **state)
{
    (void)state;
    llmt_context *ctx = test_context(2, 3);
    llmt_model_config c = LLMT_MODEL_CONFIG_INIT;
    c.vocab_size = VOCAB;
    c.hidden_size = 32;
    c.num_layers = 2;
    c.num_heads = 4;
    c.num_kv_heads = 2;
    c.ffn_size = 48;
    c.max_seq_len = WINDOW;
    llmt_model *m = NULL;
    assert_int_equal(llmt_model_create(&m, ctx, &c), LLMT_OK);
    uint64_t s = 9;
    for (int32_t i = 0; i < llmt_model_num_tensors(m); i++) {
        llmt_tensor_info ti = LLMT_TENSOR_INFO_INIT;
        assert_int_equal(llmt_model_tensor_info(m, i, &ti), LLMT_OK);
        float *w = malloc((size_t)ti.numel * sizeof *w);
        for (int64_t j = 0; j < ti.numel; j++)
            w[j] = (float)(ti.ndim == 1 ? 1.0 + 0.1 * trand_normal(&s) : 0.25 * trand_normal(&s));
        assert_int_equal(llmt_model_set_param(m, ti.name, w, (size_t)ti.numel), LLMT_OK);
        free(w);
    }
    int32_t tokens[LEN];
    for (int i = 0; i < LEN; i++)
        tokens[i] = (int32_t)(trand_u64(&s) % VOCAB);
    sample_logits cached, recomputed;
    assert_int_equal(sample_logits_open(&cached, m), LLMT_OK);
    assert_non_null(cached.gen); /* the CPU has cached attention */
    assert_int_equal(sample_logits_open_recompute(&recomputed, m), LLMT_OK);
    assert_null(recomputed.gen);
    float a[VOCAB], b[VOCAB], window_only[WINDOW * VOCAB];
    for (size_t len = 1; len <= LEN; len++) {
        assert_int_equal(sample_logits_next(&cached, tokens, len, a), LLMT_OK);
        assert_int_equal(sample_logits_next(&recomputed, tokens, len, b), LLMT_OK);
        double diff = 0, scale = 0;
        for (int v = 0; v < VOCAB; v++) {
            diff = fmax(diff, fabs((double)a[v] - b[v]));
            scale = fmax(scale, fabs((double)a[v]));
        }
        if (diff > 1e-5 * scale)
            fail_msg("after %zu tokens: recomputed logits differ by %g (largest %g)", len, diff,
                     scale);
        /* Past the window, only the last WINDOW tokens count. */
        if (len > WINDOW) {
            assert_int_equal(llmt_model_logits(m, tokens + len - WINDOW, 1, WINDOW, window_only,
                                               sizeof window_only / sizeof *window_only),
                             LLMT_OK);
            assert_memory_equal(b, window_only + (WINDOW - 1) * VOCAB, sizeof b);
        }
    }
    sample_logits_close(&cached);
    sample_logits_close(&recomputed);
    sample_logits_close(&recomputed); /* closing twice is harmless */
    llmt_model_free(m);
    llmt_context_free(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_recompute_matches_cache),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
