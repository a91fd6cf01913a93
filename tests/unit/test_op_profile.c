/* The benchmarks' op profiler (tests/bench/op_profile.c) around the CPU
 * backend, and the step formula it is compared with (tests/bench/op_cost.c):
 * one profiled training step of a tiny model counts, per op family, the
 * calls the model's structure makes (derived here by hand from the layers),
 * spends no more time in the ops than the step took, and records the FLOPs
 * and bytes that op_cost_step predicts; the GEMM FLOPs and the model FLOPs
 * also equal hand formulas (2 m n k per product; 6 N tokens plus attention).
 * The element-wise ops, which a plain step does not call, are checked alone. */
#include "test_util.h"

#include "bench_util.h"

#include "core/context_internal.h"
#include "llmt/llmt.h"
#include "op_profile.h"
#include "test_context.h"

enum { B = 2, T = 8 };

/* One training step as bench_gpu_step runs it. */
static void step(llmt_model *m, llmt_optimizer *o, const int32_t *tokens, const int32_t *targets)
{
    double loss = 0.0;
    assert_int_equal(llmt_model_zero_grads(m), LLMT_OK);
    assert_int_equal(llmt_model_forward_backward(m, tokens, targets, B, T, 1.0, 0.0, &loss),
                     LLMT_OK);
    assert_int_equal(llmt_optimizer_step(o, NULL, NULL), LLMT_OK);
}

/* Profiles the second step of model c (the first casts the master weights
 * and allocates the gradients) and checks it as the header says. */
static void check_profiled_step(const llmt_model_config *c)
{
    llmt_context *ctx = test_context(2, 7);
    const llmt_backend_ops *backend_ops = ctx->backend->ops;
    op_profile prof, other;
    assert_int_equal(op_profile_install(&prof, ctx), 0);
    assert_ptr_equal(ctx->backend->ops, &prof.table);
    assert_int_equal(op_profile_install(&other, ctx), -1); /* one at a time */
    llmt_model *m = NULL;
    llmt_optimizer *o = NULL;
    llmt_optimizer_config oc = LLMT_OPTIMIZER_CONFIG_INIT;
    assert_int_equal(llmt_model_create(&m, ctx, c), LLMT_OK);
    assert_int_equal(llmt_optimizer_create(&o, m, &oc), LLMT_OK);
    int32_t tokens[B * T], targets[B * T];
    for (int i = 0; i < B * T; i++) {
        tokens[i] = (i * 7 + 3) % c->vocab_size;
        targets[i] = (i * 5 + 1) % c->vocab_size;
    }
    step(m, o, tokens, targets);
    for (int f = 0; f < OP_FAMILY_COUNT; f++) /* not recording: nothing counted */
        assert_int_equal(prof.family[f].cost.calls, 0);

    prof.recording = 1;
    double wall = bench_now();
    step(m, o, tokens, targets);
    wall = bench_now() - wall;
    prof.recording = 0;

    const int64_t L = c->num_layers, d = c->hidden_size, V = c->vocab_size, f = c->ffn_size;
    const int64_t hd = d / c->num_heads, M = (int64_t)B * T;
    const int64_t qkv = (c->num_heads + 2 * c->num_kv_heads) * hd, att = c->num_heads * hd;
    const int64_t want[OP_FAMILY_COUNT] = {
        [OP_GEMM_FWD] = 4 * L,     /* qkv, o, gate_up, down */
        [OP_GEMM_BWD] = 8 * L,     /* each: data and weight gradient */
        [OP_ATTN_FWD] = L,
        [OP_ATTN_BWD] = L,
        [OP_LM_HEAD_CE] = 1,
        [OP_RMSNORM] = 4 * L + 2,  /* two per layer and the final one, each both ways */
        [OP_ROPE] = 2 * L,         /* q and k together, both ways */
        [OP_SWIGLU] = 2 * L,
        [OP_EMBEDDING] = 2,
        [OP_ELEMENTWISE] = 0,
        [OP_COPY] = 3,             /* tokens, targets, zeroing: no residual copies (gemm_cd) */
        /* the gradient norm; AdamW on the embedding, per layer ln1 | qkv o |
         * ln2 | gate up down, the final norm, the LM head unless tied */
        [OP_OPTIMIZER] = 1 + 1 + 4 * L + 1 + (c->tie_embeddings ? 0 : 1),
    };
    op_cost formula[OP_FAMILY_COUNT];
    assert_int_equal(op_cost_step(c, B, T, formula), 0);
    double spent = 0.0, flops = 0.0;
    for (int fam = 0; fam < OP_FAMILY_COUNT; fam++) {
        const op_profile_family *p = &prof.family[fam];
        print_message("%-12s calls %3lld  bytes %10.0f  flops %10.0f  %.6f s\n",
                      op_family_name(fam), (long long)p->cost.calls, p->cost.bytes,
                      p->cost.flops, p->seconds);
        assert_int_equal(p->cost.calls, want[fam]);
        assert_int_equal(formula[fam].calls, want[fam]);
        /* sums of integers below 2^53: exact */
        assert_true(p->cost.bytes == formula[fam].bytes);
        assert_true(p->cost.flops == formula[fam].flops);
        assert_true(p->cost.causal_flops == formula[fam].causal_flops);
        assert_true(p->seconds >= 0.0);
        if (want[fam])
            assert_true(p->seconds > 0.0);
        spent += p->seconds;
        flops += p->cost.flops;
    }
    assert_true(spent <= wall);
    /* The layers' products: forward 2 M (qkv d + d att + 2f d + d f) each,
     * backward twice that. */
    double layer_gemm = 2.0 * M * (double)(qkv * d + d * att + 2 * f * d + d * f) * L;
    assert_true(prof.family[OP_GEMM_FWD].cost.flops == layer_gemm);
    assert_true(prof.family[OP_GEMM_BWD].cost.flops == 2.0 * layer_gemm);
    /* All of it: 6 x (the parameters that multiply: not the norms, not the
     * embedding unless it is the LM head too) x tokens, plus attention's
     * 12 layers att_dim T tokens (the full square) as bench_gpu_step counts. */
    double multiplying = (double)llmt_model_num_params(m) - (double)(2 * L + 1) * d -
                         (c->tie_embeddings ? 0.0 : (double)V * d);
    assert_true(flops == 6.0 * multiplying * M + 12.0 * L * att * T * M);
    /* The causal half of attention, diagonal included. */
    assert_true(prof.family[OP_ATTN_FWD].cost.causal_flops ==
                prof.family[OP_ATTN_FWD].cost.flops * (T + 1) / (2.0 * T));

    op_profile_reset(&prof);
    assert_int_equal(prof.family[OP_GEMM_FWD].cost.calls, 0);
    llmt_optimizer_free(o);
    llmt_model_free(m);
    op_profile_uninstall(&prof, ctx);
    assert_ptr_equal(ctx->backend->ops, backend_ops);
    assert_int_equal(op_profile_install(&other, ctx), 0); /* free again */
    op_profile_uninstall(&other, ctx);
    llmt_context_free(ctx);
}

/* BF16_MIXED (fp32 master and moments), grouped-query attention, untied. */
static void test_profile_bf16_mixed_gqa(void **state)
{
    (void)state;
    llmt_model_config c = LLMT_MODEL_CONFIG_INIT;
    c.vocab_size = 64, c.hidden_size = 32, c.num_layers = 2, c.num_heads = 4;
    c.num_kv_heads = 2, c.ffn_size = 48, c.max_seq_len = T;
    c.precision = LLMT_PRECISION_BF16_MIXED;
    check_profiled_step(&c);
}

/* FP32, multi-head attention, the LM head tied to the embedding. */
static void test_profile_fp32_tied(void **state)
{
    (void)state;
    llmt_model_config c = LLMT_MODEL_CONFIG_INIT;
    c.vocab_size = 40, c.hidden_size = 16, c.num_layers = 3, c.num_heads = 2;
    c.num_kv_heads = 2, c.ffn_size = 24, c.max_seq_len = T, c.tie_embeddings = 1;
    check_profiled_step(&c);
}

/* The element-wise ops, which a plain step does not call, called through
 * the profiled table: counted with their bytes by hand (n elements: add
 * reads y and x and writes y; cast reads fp32 and writes bf16; accumulate
 * reads and writes the fp32 sum and reads bf16 x), and computed. */
static void test_profile_elementwise(void **state)
{
    (void)state;
    enum { N = 5 };
    llmt_context *ctx = test_context(1, 7);
    op_profile prof;
    assert_int_equal(op_profile_install(&prof, ctx), 0);
    const llmt_backend_ops *ops = ctx->backend->ops;
    float y[N] = {1, 2, 3, 4, 5}, x[N] = {0.5f, 0.5f, 0.5f, 0.5f, 0.5f}, sum[N] = {0};
    uint16_t half[N];
    prof.recording = 1;
    assert_int_equal(ops->add(ctx->backend, y, x, N, LLMT_DTYPE_F32), LLMT_OK);
    assert_int_equal(ops->cast(ctx->backend, half, LLMT_DTYPE_BF16, y, LLMT_DTYPE_F32, N), LLMT_OK);
    assert_int_equal(ops->accumulate(ctx->backend, sum, half, N, LLMT_DTYPE_BF16), LLMT_OK);
    prof.recording = 0;
    for (int i = 0; i < N; i++)
        assert_true(sum[i] == (float)i + 1.5f); /* exact in bf16 */
    const op_profile_family *e = &prof.family[OP_ELEMENTWISE];
    assert_int_equal(e->cost.calls, 3);
    assert_true(e->cost.bytes == N * (3 * 4) + N * (4 + 2) + N * (4 + 4 + 2));
    assert_true(e->cost.flops == 0.0);
    assert_true(e->seconds > 0.0);
    op_profile_uninstall(&prof, ctx);
    llmt_context_free(ctx);
}

/* Each op's bytes per call against a hand count from its definition in
 * lib/ops/ops.h (inputs read once, outputs written once, an accumulated
 * output read and written), at es = 2 unless said, small dimensions. */
static void test_op_bytes_by_hand(void **state)
{
    (void)state;
    /* gemm 3x5x7: A 21 + B 35 + C 15 (beta 0) or 2 x 15 (beta 1) elements */
    assert_true(op_cost_gemm(3, 5, 7, 0, 2).bytes == (21 + 35 + 15) * 2);
    assert_true(op_cost_gemm(3, 5, 7, 1, 2).bytes == (21 + 35 + 30) * 2);
    /* attention, 2 x 4 rows, 4 heads, 2 kv heads, head_dim 8: q 256, k 128,
     * v 128, out 256 elements, an fp32 logsumexp per row and head (128 B);
     * backward reads qkv, out, dout, lse and writes dqkv (512) */
    const llmt_attn_dims a = {2, 4, 4, 2, 8};
    assert_true(op_cost_attention(&a, 0, 2).bytes == (512 + 256) * 2 + 128);
    assert_true(op_cost_attention(&a, 1, 2).bytes == (512 + 256 + 256 + 512) * 2 + 128);
    /* lm_head_ce m 3, d 4, vocab 10: h 12, W 40, int32 targets 12 B; with
     * the gradient dh 12 written and dW 40 read and written */
    assert_true(op_cost_lm_head_ce(3, 4, 10, 0, 2).bytes == (12 + 40) * 2 + 12);
    assert_true(op_cost_lm_head_ce(3, 4, 10, 1, 2).bytes == (12 + 40 + 12 + 80) * 2 + 12);
    /* rmsnorm m 3, d 4: forward x 12, w 4, out 12, fp32 rstd 12 B; backward
     * dout 12, x 12, w 4, rstd, dx 12 (24 accumulated), dw 4 read and written */
    assert_true(op_cost_rmsnorm(3, 4, 0, 0, 2).bytes == (12 + 4 + 12) * 2 + 12);
    assert_true(op_cost_rmsnorm(3, 4, 1, 0, 2).bytes == (12 + 12 + 4 + 12 + 8) * 2 + 12);
    assert_true(op_cost_rmsnorm(3, 4, 1, 1, 2).bytes == (12 + 12 + 4 + 24 + 8) * 2 + 12);
    /* rope m 3, 6 heads of 8 rotated in place (144 read and written), the
     * fp32 table of 4 positions x 8 read */
    assert_true(op_cost_rope(3, 4, 6, 8, 2).bytes == 2 * 144 * 2 + 4 * 8 * 4);
    /* swiglu m 3, f 5: forward gate_up 30 in, out 15; backward dout 15,
     * gate_up 30 in, dgate_up 30 out */
    assert_true(op_cost_swiglu(3, 5, 0, 2).bytes == (30 + 15) * 2);
    assert_true(op_cost_swiglu(3, 5, 1, 2).bytes == (15 + 30 + 30) * 2);
    /* embedding m 3, d 4: int32 ids 12 B; forward 12 read, 12 written;
     * backward dout 12 read, 12 rows of dtable read and written */
    assert_true(op_cost_embedding(3, 4, 0, 2).bytes == (12 + 12) * 2 + 12);
    assert_true(op_cost_embedding(3, 4, 1, 2).bytes == (12 + 24) * 2 + 12);
    /* adamw 10 parameters: bf16 gradient, fp32 moments and master read and
     * written, bf16 weights written: 2 + 16 + 8 + 2 per parameter; without
     * master, bf16 moments, weights read and written: 2 + 8 + 4; fp32: 4 + 16 + 8 */
    assert_true(op_cost_adamw(10, 2, 1, 4).bytes == 10 * (2 + 16 + 8 + 2));
    assert_true(op_cost_adamw(10, 2, 0, 2).bytes == 10 * (2 + 8 + 4));
    assert_true(op_cost_adamw(10, 4, 0, 4).bytes == 10 * (4 + 16 + 8));
}

/* The step formula refuses what it cannot cost. */
static void test_step_formula_refuses(void **state)
{
    (void)state;
    op_cost out[OP_FAMILY_COUNT];
    llmt_model_config c = LLMT_MODEL_CONFIG_INIT;
    assert_int_equal(op_cost_step(&c, 1, 8, out), 0);
    assert_int_equal(op_cost_step(&c, 0, 8, out), -1);
    c.precision = 9;
    assert_int_equal(op_cost_step(&c, 1, 8, out), -1);
    assert_string_equal(op_family_name(OP_ATTN_BWD), "attn_bwd");
    assert_string_equal(op_family_name(OP_FAMILY_COUNT), "?");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_profile_bf16_mixed_gqa),
        cmocka_unit_test(test_profile_fp32_tied),
        cmocka_unit_test(test_profile_elementwise),
        cmocka_unit_test(test_op_bytes_by_hand),
        cmocka_unit_test(test_step_formula_refuses),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
