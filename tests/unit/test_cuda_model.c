/* The whole model on the CUDA backend against the CPU backend: every
 * parameter gradient of one step, 16 steps of AdamW training, two CUDA runs
 * giving the same bits, recompute giving the bits of keeping everything,
 * slicing giving the unsliced gradient, weights saved and loaded through
 * the CUDA staging path, optimizer offload giving the device optimizer's
 * bits, and gradient offload's overlapped stores giving the device's
 * gradients. Without a usable
 * CUDA device every test calls skip() and the program exits 77, which CTest
 * reports as skipped; under LLMT_REQUIRE_CUDA=1 every test fails instead
 * (cuda_required.h).
 *
 * Tolerances (stated per check below) are relative to the largest |value|
 * of the CPU's tensor. The model is small (d 128, 2 layers, GQA 2/1 heads of
 * head_dim 64, which the CUDA attention handles; vocab 96), so a step runs
 * in milliseconds on either backend. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test_util.h"

#include "core/context_internal.h"
#include "core/cuda_plugin_info.h"
#include "cuda_required.h"
#include "llmt/llmt.h"
#include "optim/offload.h"
#include "test_batch.h"
#include "test_context.h"
#include "test_rand.h"
#include "test_tensors.h"

enum { B = 4, T = 64, VOCAB = 96, STEPS = 16, SEED = 5 };

static int g_have_cuda;
static char g_why[512];

static llmt_context *make_ctx(int backend)
{
    llmt_context_config cfg = LLMT_CONTEXT_CONFIG_INIT;
    cfg.backend = backend;
    cfg.seed = SEED;
    cfg.num_threads = 2;
    llmt_context *ctx = NULL;
    if (llmt_context_create(&ctx, &cfg) != LLMT_OK)
        fail_msg("context on backend %d: %s", backend, llmt_error_last());
    return ctx;
}

static void need_cuda(void)
{
    if (!g_have_cuda)
        cuda_unavailable(g_why);
}

static llmt_model_config config(int precision, int tied)
{
    llmt_model_config c = LLMT_MODEL_CONFIG_INIT;
    c.vocab_size = VOCAB;
    c.hidden_size = 128;
    c.num_layers = 2;
    c.num_heads = 2;
    c.num_kv_heads = 1;
    c.ffn_size = 256;
    c.max_seq_len = T;
    c.tie_embeddings = tied;
    c.precision = precision;
    return c;
}

/* The learnable stream of test_batch.h, with a few targets ignored. */
static void make_batch(int step, int32_t *tokens, int32_t *targets)
{
    test_learnable_batch(step, B, T, VOCAB, tokens, targets);
    targets[3] = targets[T + 7] = -1;
}

static float *get_all(llmt_model *m, int grads, size_t *len)
{
    size_t total = (size_t)llmt_model_num_params(m), at = 0;
    float *out = malloc(total * sizeof *out);
    for (int32_t i = 0; i < llmt_model_num_tensors(m); i++) {
        llmt_tensor_info info = LLMT_TENSOR_INFO_INIT;
        assert_int_equal(llmt_model_tensor_info(m, i, &info), LLMT_OK);
        int rc = grads ? llmt_model_get_grad(m, info.name, out + at, (size_t)info.numel)
                       : llmt_model_get_param(m, info.name, out + at, (size_t)info.numel);
        assert_int_equal(rc, LLMT_OK);
        at += (size_t)info.numel;
    }
    *len = at;
    return out;
}

/* ---- one step's gradients, CUDA against CPU */

/* Each gradient tensor's largest |CUDA - CPU| is at most tol times the
 * tensor's largest |CPU| value; the losses agree to tol as well. */
static void gradients_match(int precision, int tied, double tol)
{
    llmt_model_config c = config(precision, tied);
    llmt_context *ctx[2] = {make_ctx(LLMT_BACKEND_CPU), make_ctx(LLMT_BACKEND_CUDA)};
    llmt_model *m[2];
    double loss[2];
    int32_t tokens[B * T], targets[B * T];
    make_batch(3, tokens, targets);
    for (int k = 0; k < 2; k++) {
        assert_int_equal(llmt_model_create(&m[k], ctx[k], &c), LLMT_OK);
        test_randomize_params(m[k], 77, 0.1);
        assert_int_equal(llmt_model_forward_backward(m[k], tokens, targets, B, T, 1.0, 0.0,
                                                     &loss[k]), LLMT_OK);
    }
    if (fabs(loss[1] - loss[0]) > tol * fabs(loss[0]))
        fail_msg("precision %d tied %d: loss cuda %.9g, cpu %.9g", precision, tied, loss[1],
                 loss[0]);
    double worst = 0;
    const char *worst_name = "";
    for (int32_t i = 0; i < llmt_model_num_tensors(m[0]); i++) {
        llmt_tensor_info info = LLMT_TENSOR_INFO_INIT;
        assert_int_equal(llmt_model_tensor_info(m[0], i, &info), LLMT_OK);
        float *g[2];
        for (int k = 0; k < 2; k++) {
            g[k] = malloc((size_t)info.numel * sizeof(float));
            assert_int_equal(llmt_model_get_grad(m[k], info.name, g[k], (size_t)info.numel),
                             LLMT_OK);
        }
        double max_ref = 0, max_err = 0;
        for (int64_t j = 0; j < info.numel; j++) {
            if (!isfinite(g[1][j]))
                fail_msg("%s[%lld] is %g on CUDA", info.name, (long long)j, (double)g[1][j]);
            max_ref = fmax(max_ref, fabs(g[0][j]));
            max_err = fmax(max_err, fabs((double)g[1][j] - g[0][j]));
        }
        assert_true(max_ref > 0);
        double rel = max_err / max_ref;
        if (rel > tol)
            fail_msg("precision %d tied %d: gradient of %s: max |cuda - cpu| %.3g, max |cpu| "
                     "%.3g: relative %.3g > %.1g", precision, tied, info.name, max_err, max_ref,
                     rel, tol);
        if (rel > worst) {
            worst = rel;
            worst_name = info.name;
        }
        free(g[0]);
        free(g[1]);
    }
    print_message("precision %d tied %d: loss cpu %.6f cuda %.6f; worst gradient %s, relative "
                  "error %.2e (tolerance %.0e)\n", precision, tied, loss[0], loss[1], worst_name,
                  worst, tol);
    for (int k = 0; k < 2; k++) {
        llmt_model_free(m[k]);
        llmt_context_free(ctx[k]);
    }
}

/* FP32: both backends compute in fp32; only summation orders differ
 * (cuBLASLt's against OpenBLAS's, the attention's tiles), each adding
 * relative errors of ~1e-7 that grow a little through two layers and the
 * backward: 1e-4 leaves a wide margin. */
static void test_gradients_fp32(void **state)
{
    (void)state;
    need_cuda();
    gradients_match(LLMT_PRECISION_FP32, 0, 1e-4);
    gradients_match(LLMT_PRECISION_FP32, 1, 1e-4);
}

/* BF16_MIXED: every activation and gradient is rounded to bf16 (8 bits of
 * mantissa, 2^-9 relative per rounding); where the backends' fp32 values
 * straddle a rounding boundary they round one ulp apart, and those
 * differences travel through the rest of the step. 5e-2 of a tensor's
 * scale is a few bf16 ulps. */
static void test_gradients_bf16_mixed(void **state)
{
    (void)state;
    need_cuda();
    gradients_match(LLMT_PRECISION_BF16_MIXED, 0, 5e-2);
}

/* ---- training */

/* STEPS steps of AdamW on the learnable stream; losses[step]. With weights
 * non-NULL, the final weights are returned (malloc'd). */
static void train(int backend, int precision, int steps, double *losses, float **weights,
                  size_t *len)
{
    llmt_context *ctx = make_ctx(backend);
    llmt_model_config c = config(precision, 0);
    llmt_model *m = NULL;
    llmt_optimizer *o = NULL;
    llmt_loss_scaler *sc = NULL;
    llmt_optimizer_config oc = LLMT_OPTIMIZER_CONFIG_INIT;
    oc.lr = 3e-3;
    oc.weight_decay = 0.01;
    llmt_loss_scaler_config lc = LLMT_LOSS_SCALER_CONFIG_INIT;
    if (precision != LLMT_PRECISION_FP16_MIXED) {
        lc.dynamic = 0;
        lc.init_scale = 1.0;
    }
    assert_int_equal(llmt_model_create(&m, ctx, &c), LLMT_OK);
    assert_int_equal(llmt_optimizer_create(&o, m, &oc), LLMT_OK);
    assert_int_equal(llmt_loss_scaler_create(&sc, &lc), LLMT_OK);
    int32_t tokens[B * T], targets[B * T];
    for (int step = 0; step < steps; step++) {
        make_batch(step, tokens, targets);
        assert_int_equal(llmt_model_zero_grads(m), LLMT_OK);
        assert_int_equal(llmt_model_forward_backward(m, tokens, targets, B, T,
                                                     llmt_loss_scaler_scale(sc), 0, &losses[step]),
                         LLMT_OK);
        assert_int_equal(llmt_optimizer_step(o, sc, NULL), LLMT_OK);
    }
    if (weights)
        *weights = get_all(m, 0, len);
    llmt_loss_scaler_free(sc);
    llmt_optimizer_free(o);
    llmt_model_free(m);
    llmt_context_free(ctx);
}

/* Losses of STEPS AdamW steps on CUDA follow the CPU's: each step's
 * |cuda - cpu| is at most `gap`, and the model learns on both. */
static void training_matches(int precision, double gap)
{
    double cpu[STEPS], gpu[STEPS];
    train(LLMT_BACKEND_CPU, precision, STEPS, cpu, NULL, NULL);
    train(LLMT_BACKEND_CUDA, precision, STEPS, gpu, NULL, NULL);
    double worst = 0;
    int at = 0;
    for (int s = 0; s < STEPS; s++)
        if (fabs(gpu[s] - cpu[s]) > worst) {
            worst = fabs(gpu[s] - cpu[s]);
            at = s;
        }
    print_message("precision %d: loss cpu %.4f -> %.4f, cuda %.4f -> %.4f; largest per-step gap "
                  "%.2e at step %d (tolerance %.0e)\n", precision, cpu[0], cpu[STEPS - 1], gpu[0],
                  gpu[STEPS - 1], worst, at, gap);
    if (worst > gap)
        fail_msg("precision %d: step %d loss cuda %.6f, cpu %.6f", precision, at, gpu[at], cpu[at]);
    assert_true(gpu[STEPS - 1] < gpu[0] - 0.5); /* it learns: ln 96 = 4.56 at the start */
}

/* FP32: the per-step differences start at ~1e-7 relative and AdamW, which
 * normalises updates, lets them grow slowly over 16 steps; 2e-3 in loss (of
 * about 4.6 falling towards 1) is far above that and far below a real
 * error, which shifts the first steps already by more. */
static void test_training_fp32(void **state)
{
    (void)state;
    need_cuda();
    training_matches(LLMT_PRECISION_FP32, 2e-3);
}

/* BF16_MIXED: bf16 rounding differences between the backends (see above)
 * make the trajectories differ by about what test_precision measures
 * between BF16_MIXED and FP32 over the first 100 steps (< 0.01; the CPU
 * emulator of tests/gpu/emu gives 0.009 here): 5e-2, while a wrong kernel
 * moves the loss by tenths. */
static void test_training_bf16_mixed(void **state)
{
    (void)state;
    need_cuda();
    training_matches(LLMT_PRECISION_BF16_MIXED, 5e-2);
}

/* Two CUDA runs with the same seed and data give the same bits: losses,
 * and weights after a few steps of BF16_MIXED and of FP32. */
static void test_cuda_deterministic(void **state)
{
    (void)state;
    need_cuda();
    enum { N = 2 };
    const int precisions[2] = {LLMT_PRECISION_BF16_MIXED, LLMT_PRECISION_FP32};
    for (int p = 0; p < 2; p++) {
        double l1[N], l2[N];
        float *w1, *w2;
        size_t n1, n2;
        train(LLMT_BACKEND_CUDA, precisions[p], N, l1, &w1, &n1);
        train(LLMT_BACKEND_CUDA, precisions[p], N, l2, &w2, &n2);
        assert_int_equal(n1, n2);
        assert_memory_equal(l1, l2, sizeof l1);
        assert_memory_equal(w1, w2, n1 * sizeof(float));
        free(w1);
        free(w2);
    }
}

/* Recompute on CUDA gives the bits of keeping everything (attention then
 * reruns its forward kernel for the logsumexp): one step's loss and every
 * gradient, with selective recompute on layer 0 and full on layer 1. */
static void test_recompute_same_bits(void **state)
{
    (void)state;
    need_cuda();
    llmt_context *ctx = make_ctx(LLMT_BACKEND_CUDA);
    llmt_model_config c = config(LLMT_PRECISION_BF16_MIXED, 0);
    llmt_model *m = NULL;
    llmt_recompute *rc = NULL;
    assert_int_equal(llmt_model_create(&m, ctx, &c), LLMT_OK);
    test_randomize_params(m, 78, 0.1);
    assert_int_equal(llmt_recompute_create(&rc, m), LLMT_OK);
    int32_t tokens[B * T], targets[B * T];
    make_batch(5, tokens, targets);
    double loss[2];
    float *g[2];
    size_t n[2];
    for (int k = 0; k < 2; k++) {
        if (k == 1) {
            assert_int_equal(llmt_recompute_set_layers(rc, 0, 1, LLMT_RECOMPUTE_ATTN_CORE |
                                                                 LLMT_RECOMPUTE_FFN_ACT),
                             LLMT_OK);
            assert_int_equal(llmt_recompute_set_layers(rc, 1, 1, LLMT_RECOMPUTE_FULL), LLMT_OK);
        }
        assert_int_equal(llmt_model_zero_grads(m), LLMT_OK);
        assert_int_equal(llmt_model_forward_backward(m, tokens, targets, B, T, 1.0, 0.0, &loss[k]),
                         LLMT_OK);
        g[k] = get_all(m, 1, &n[k]);
    }
    assert_memory_equal(&loss[0], &loss[1], sizeof loss[0]);
    assert_int_equal(n[0], n[1]);
    assert_memory_equal(g[0], g[1], n[0] * sizeof(float));
    free(g[0]);
    free(g[1]);
    llmt_recompute_free(rc);
    llmt_model_free(m);
    llmt_context_free(ctx);
}

/* Slicing on CUDA: the batch as micro-batches of 1, 2 and 3 (slices of 3
 * and 1) gives the unsliced gradient up to fp32 summation order (FP32,
 * within 1e-5 of the largest gradient; the loss within 1e-6, as on the CPU
 * in test_memory.c), and a second sliced run gives the same bits. */
static void test_slicing_matches_unsliced(void **state)
{
    (void)state;
    need_cuda();
    llmt_context *ctx = make_ctx(LLMT_BACKEND_CUDA);
    llmt_model_config c = config(LLMT_PRECISION_FP32, 0);
    llmt_model *m = NULL;
    llmt_slicer *sl = NULL;
    assert_int_equal(llmt_model_create(&m, ctx, &c), LLMT_OK);
    test_randomize_params(m, 80, 0.1);
    assert_int_equal(llmt_slicer_create(&sl, m, B), LLMT_OK);
    int32_t tokens[B * T], targets[B * T];
    make_batch(6, tokens, targets);
    double whole_loss = 0;
    assert_int_equal(llmt_slicer_forward_backward(sl, tokens, targets, B, T, 1.0, &whole_loss),
                     LLMT_OK);
    size_t n = 0;
    float *whole = get_all(m, 1, &n);
    double gmax = 0;
    for (size_t i = 0; i < n; i++)
        gmax = fmax(gmax, fabs(whole[i]));
    const int32_t micro[3] = {1, 2, 3};
    for (int k = 0; k < 3; k++) {
        assert_int_equal(llmt_slicer_set_micro_batch(sl, micro[k]), LLMT_OK);
        float *got[2];
        double loss[2];
        for (int r = 0; r < 2; r++) {
            assert_int_equal(llmt_model_zero_grads(m), LLMT_OK);
            assert_int_equal(
                llmt_slicer_forward_backward(sl, tokens, targets, B, T, 1.0, &loss[r]), LLMT_OK);
            got[r] = get_all(m, 1, &n);
        }
        double err = 0;
        for (size_t i = 0; i < n; i++)
            err = fmax(err, fabs((double)got[0][i] - whole[i]));
        print_message("micro-batch %d: max gradient error %.2e of %.2e, loss %.9f vs %.9f\n",
                      micro[k], err, gmax, loss[0], whole_loss);
        if (err > 1e-5 * gmax || fabs(loss[0] - whole_loss) > 1e-6 * whole_loss)
            fail_msg("micro-batch %d: max gradient error %g (max %g), loss %.9f vs %.9f",
                     micro[k], err, gmax, loss[0], whole_loss);
        assert_memory_equal(&loss[0], &loss[1], sizeof loss[0]);
        assert_memory_equal(got[0], got[1], n * sizeof(float));
        free(got[0]);
        free(got[1]);
    }
    free(whole);
    llmt_slicer_free(sl);
    llmt_model_free(m);
    llmt_context_free(ctx);
}

/* Weights saved from a CUDA model and loaded into another come back with
 * the same bits: the load goes through a STAGING buffer, which on CUDA is
 * pinned host memory that the copies must tell from device memory. */
static void test_safetensors_roundtrip(void **state)
{
    (void)state;
    need_cuda();
    llmt_context *ctx = make_ctx(LLMT_BACKEND_CUDA);
    llmt_model_config c = config(LLMT_PRECISION_BF16_MIXED, 0);
    llmt_model *m[2];
    for (int k = 0; k < 2; k++)
        assert_int_equal(llmt_model_create(&m[k], ctx, &c), LLMT_OK);
    test_randomize_params(m[0], 79, 0.1);
    char path[] = "/tmp/llmt_cuda_model_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(llmt_model_save_safetensors(m[0], path, LLMT_DTYPE_BF16), LLMT_OK);
    assert_int_equal(llmt_model_load_safetensors(m[1], path), LLMT_OK);
    unlink(path);
    size_t n[2];
    float *w[2];
    for (int k = 0; k < 2; k++)
        w[k] = get_all(m[k], 0, &n[k]);
    assert_int_equal(n[0], n[1]);
    assert_memory_equal(w[0], w[1], n[0] * sizeof(float));
    for (int k = 0; k < 2; k++) {
        free(w[k]);
        llmt_model_free(m[k]);
    }
    llmt_context_free(ctx);
}

/* ---- optimizer offload: the host's AdamW gives the device's bits */

/* Weights then every state tensor of o, as fp32, appended to out. */
static float *weights_and_state(llmt_model *m, llmt_optimizer *o, size_t *len)
{
    size_t n = 0;
    float *w = get_all(m, 0, &n);
    int kinds = llmt_optimizer_state_dtype(o, LLMT_OPT_STATE_MASTER) >= 0 ? 3 : 2;
    float *out = realloc(w, n * (size_t)(1 + kinds) * sizeof *out);
    assert_non_null(out);
    size_t at = n;
    for (int k = 0; k < kinds; k++)
        for (int32_t i = 0; i < llmt_model_num_tensors(m); i++) {
            llmt_tensor_info info = LLMT_TENSOR_INFO_INIT;
            assert_int_equal(llmt_model_tensor_info(m, i, &info), LLMT_OK);
            assert_int_equal(llmt_optimizer_get_state(o, k, info.name, out + at, (size_t)info.numel),
                             LLMT_OK);
            at += (size_t)info.numel;
        }
    *len = at;
    return out;
}

/* The model of the offload tests: d 96, so layer 1's parameters start 128
 * bytes past a 256-byte boundary in 16-bit storage and an offloaded
 * bucket's alignment is exercised. */
static llmt_model_config offload_config(int precision, int tied)
{
    llmt_model_config c = config(precision, tied);
    c.hidden_size = 96;
    c.num_heads = 3;
    c.num_kv_heads = 1;
    return c;
}

/* N steps on CUDA with the optimizer's state placed at (parts, layers) from
 * creation and moved to (parts2, layers2) after step N / 2. One sequence of
 * OT tokens a step: what offload changes is the optimizer's and the
 * gradients' placement, which the batch does not reach, and the test's 36
 * runs take a tenth of the time on the emulator. */
static float *offload_train(int precision, int32_t parts, int32_t layers, int32_t parts2,
                            int32_t layers2, size_t *len)
{
    enum { N = 4, OT = 16 };
    llmt_context *ctx = make_ctx(LLMT_BACKEND_CUDA);
    llmt_model_config c = offload_config(precision, 0);
    llmt_model *m = NULL;
    llmt_optimizer *o = NULL;
    llmt_optimizer_config oc = LLMT_OPTIMIZER_CONFIG_INIT;
    oc.lr = 3e-3;
    oc.weight_decay = 0.01;
    oc.offload_parts = parts;
    oc.offload_layers = layers;
    assert_int_equal(llmt_model_create(&m, ctx, &c), LLMT_OK);
    assert_int_equal(llmt_optimizer_create(&o, m, &oc), LLMT_OK);
    int32_t tokens[B * T], targets[B * T];
    for (int step = 0; step < N; step++) {
        if (step == N / 2)
            assert_int_equal(llmt_optimizer_set_offload(o, parts2, layers2), LLMT_OK);
        test_learnable_batch(step, 1, OT, VOCAB, tokens, targets);
        double loss = 0;
        assert_int_equal(llmt_model_zero_grads(m), LLMT_OK);
        assert_int_equal(llmt_model_forward_backward(m, tokens, targets, 1, OT, 1.0, 0, &loss),
                         LLMT_OK);
        assert_int_equal(llmt_optimizer_step(o, NULL, NULL), LLMT_OK);
    }
    if (parts2 != LLMT_OFFLOAD_NONE) { /* host state and its staging are accounted */
        llmt_memory_stats s = LLMT_MEMORY_STATS_INIT;
        assert_int_equal(llmt_context_memory_stats(ctx, &s), LLMT_OK);
        assert_true(s.current[LLMT_MEM_HOST_STATE] > 0);
    }
    float *out = weights_and_state(m, o, len);
    llmt_optimizer_free(o);
    llmt_model_free(m);
    llmt_context_free(ctx);
    return out;
}

/* In each precision mode, the optimizer state (alone or with the gradients)
 * offloaded whole, for layer 0 only, or moved mid-run (none -> all, layer 1
 * -> none, gradients back to the device) gives the weights
 * and state of the device's optimizer bit for bit: the host runs the CPU
 * kernel, which the CUDA kernel matches (-fmad=false), stochastic rounding
 * included. */
static void test_offload_same_bits(void **state)
{
    (void)state;
    need_cuda();
    const int precisions[4] = {LLMT_PRECISION_FP32, LLMT_PRECISION_BF16_MIXED,
                               LLMT_PRECISION_FP16_MIXED, LLMT_PRECISION_BF16_PURE};
    const int32_t both = LLMT_OFFLOAD_OPTIMIZER | LLMT_OFFLOAD_GRADS;
    const int32_t runs[8][4] = {
        {LLMT_OFFLOAD_OPTIMIZER, LLMT_OFFLOAD_ALL_LAYERS, LLMT_OFFLOAD_OPTIMIZER, LLMT_OFFLOAD_ALL_LAYERS},
        {LLMT_OFFLOAD_OPTIMIZER, 1, LLMT_OFFLOAD_OPTIMIZER, 1},
        {LLMT_OFFLOAD_NONE, 0, LLMT_OFFLOAD_OPTIMIZER, LLMT_OFFLOAD_ALL_LAYERS},
        {LLMT_OFFLOAD_OPTIMIZER, 1, LLMT_OFFLOAD_NONE, 0},
        /* With the gradients: the norm of host gradients uploaded through
         * the bucket, AdamW reading them in place. */
        {both, LLMT_OFFLOAD_ALL_LAYERS, both, LLMT_OFFLOAD_ALL_LAYERS},
        {both, 1, both, 1},
        {LLMT_OFFLOAD_NONE, 0, both, LLMT_OFFLOAD_ALL_LAYERS},
        {both, 1, LLMT_OFFLOAD_OPTIMIZER, 1}};
    for (int p = 0; p < 4; p++) {
        size_t n_ref = 0;
        float *ref = offload_train(precisions[p], LLMT_OFFLOAD_NONE, 0, LLMT_OFFLOAD_NONE, 0, &n_ref);
        for (int r = 0; r < 8; r++) {
            size_t n = 0;
            float *got = offload_train(precisions[p], runs[r][0], runs[r][1], runs[r][2],
                                       runs[r][3], &n);
            assert_int_equal(n, n_ref);
            if (memcmp(ref, got, n * sizeof *got))
                fail_msg("precision %d, offload (%d, %d) then (%d, %d): weights or state differ "
                         "from the device optimizer's", precisions[p], runs[r][0], runs[r][1],
                         runs[r][2], runs[r][3]);
            free(got);
        }
        free(ref);
    }
}

/* N steps on CUDA of a batch of two sequences sliced one by one and summed
 * in order (LLMT_ACCUMULATE_ORDERED), with the optimizer's state and
 * gradients placed at (parts, layers) from creation. */
static float *ordered_train(int precision, int32_t parts, int32_t layers, size_t *len)
{
    enum { N = 3, OT = 16 };
    llmt_context *ctx = make_ctx(LLMT_BACKEND_CUDA);
    llmt_model_config c = offload_config(precision, 0);
    llmt_model *m = NULL;
    llmt_optimizer *o = NULL;
    llmt_slicer *sl = NULL;
    llmt_optimizer_config oc = LLMT_OPTIMIZER_CONFIG_INIT;
    oc.lr = 3e-3;
    oc.offload_parts = parts;
    oc.offload_layers = layers;
    assert_int_equal(llmt_model_create(&m, ctx, &c), LLMT_OK);
    assert_int_equal(llmt_optimizer_create(&o, m, &oc), LLMT_OK);
    assert_int_equal(llmt_slicer_create(&sl, m, 1), LLMT_OK);
    assert_int_equal(llmt_slicer_set_accumulation(sl, LLMT_ACCUMULATE_ORDERED), LLMT_OK);
    int32_t tokens[2 * OT], targets[2 * OT];
    for (int step = 0; step < N; step++) {
        test_learnable_batch(step, 2, OT, VOCAB, tokens, targets);
        double loss = 0;
        assert_int_equal(llmt_model_zero_grads(m), LLMT_OK);
        assert_int_equal(llmt_slicer_forward_backward(sl, tokens, targets, 2, OT, 1.0, &loss),
                         LLMT_OK);
        assert_int_equal(llmt_optimizer_step(o, NULL, NULL), LLMT_OK);
    }
    float *out = weights_and_state(m, o, len);
    llmt_slicer_free(sl);
    llmt_optimizer_free(o);
    llmt_model_free(m);
    llmt_context_free(ctx);
    return out;
}

/* Ordered accumulation with the gradients offloaded (the fp32 sum's host
 * part added to by the host, from pinned host gradients the copy stream
 * filled) gives the weights and state of the ordered run without offload
 * bit for bit, fp32 and bf16_mixed, layer 0 or everything offloaded. */
static void test_offload_ordered_same_bits(void **state)
{
    (void)state;
    need_cuda();
    const int precisions[2] = {LLMT_PRECISION_FP32, LLMT_PRECISION_BF16_MIXED};
    const int32_t both = LLMT_OFFLOAD_OPTIMIZER | LLMT_OFFLOAD_GRADS;
    const int32_t layers[2] = {1, LLMT_OFFLOAD_ALL_LAYERS};
    for (int p = 0; p < 2; p++) {
        size_t n_ref = 0;
        float *ref = ordered_train(precisions[p], LLMT_OFFLOAD_NONE, 0, &n_ref);
        for (int k = 0; k < 2; k++) {
            size_t n = 0;
            float *got = ordered_train(precisions[p], both, layers[k], &n);
            assert_int_equal(n, n_ref);
            if (memcmp(ref, got, n * sizeof *got))
                fail_msg("precision %d, gradients offloaded (layers %d), ordered: weights or "
                         "state differ from the run without offload", precisions[p], layers[k]);
            free(got);
        }
        free(ref);
    }
}

/* The model of the chunked offload test: a 32768-token vocabulary of
 * d 128 (untied) puts 2^22 parameters in the embedding and as many in the
 * LM head, 8.5 M in all, so the offloaded segment is three chunks of
 * LLMT_OFFLOAD_CHUNK and more (four with the gradients: their split cuts
 * the last); one layer and 8 tokens keep a step short on the emulator. */
static llmt_model_config chunked_config(int precision)
{
    llmt_model_config c = config(precision, 0);
    c.vocab_size = 32768;
    c.num_layers = 1;
    c.max_seq_len = 8;
    return c;
}

/* Two steps on CUDA of chunked_config's model with every layer's state
 * placed at parts. With decay_norms the whole buffer is one AdamW run and
 * one host update crosses every chunk; without, the norms' runs split it
 * into seven updates (the embedding and the head one chunk each), each of
 * whose first chunk reuses staging half 0 while the previous update's
 * uploads from it may still be pending. */
static float *chunked_train(int precision, int32_t parts, int decay_norms, size_t *len)
{
    enum { TOKENS = 8 };
    llmt_context *ctx = make_ctx(LLMT_BACKEND_CUDA);
    llmt_model_config c = chunked_config(precision);
    llmt_model *m = NULL;
    llmt_optimizer *o = NULL;
    llmt_optimizer_config oc = LLMT_OPTIMIZER_CONFIG_INIT;
    oc.lr = 3e-3;
    oc.weight_decay = 0.01;
    oc.decay_norms = decay_norms;
    oc.offload_parts = parts;
    oc.offload_layers = LLMT_OFFLOAD_ALL_LAYERS;
    assert_int_equal(llmt_model_create(&m, ctx, &c), LLMT_OK);
    assert_true(llmt_model_num_params(m) > 2 * LLMT_OFFLOAD_CHUNK);
    assert_int_equal(llmt_optimizer_create(&o, m, &oc), LLMT_OK);
    int32_t tokens[TOKENS], targets[TOKENS];
    for (int step = 0; step < 2; step++) {
        test_learnable_batch(step, 1, TOKENS, c.vocab_size, tokens, targets);
        double loss = 0;
        assert_int_equal(llmt_model_zero_grads(m), LLMT_OK);
        assert_int_equal(llmt_model_forward_backward(m, tokens, targets, 1, TOKENS, 1.0, 0, &loss),
                         LLMT_OK);
        assert_int_equal(llmt_optimizer_step(o, NULL, NULL), LLMT_OK);
    }
    float *out = weights_and_state(m, o, len);
    llmt_optimizer_free(o);
    llmt_model_free(m);
    llmt_context_free(ctx);
    return out;
}

/* The host AdamW pipelined with its copies (the copy stream downloads the
 * next chunk and uploads the last one while the host updates this one, in
 * alternating staging halves) over a segment of several chunks gives the
 * device optimizer's weights and state bit for bit: optimizer alone
 * (gradients and, in fp32, weights downloaded) and with the gradients
 * (read in place but for the tail), fp32 and bf16_mixed (master: no weight
 * downloads); bf16_mixed in one update over every chunk, fp32 in several
 * updates (norms not decayed), so one update's staging is handed to the
 * next with its uploads pending. On the emulator the copy stream's copies
 * run only when waited for, so a missing host or compute-stream wait
 * changes bits. */
static void test_offload_chunks_pipelined(void **state)
{
    (void)state;
    need_cuda();
    const int precisions[2] = {LLMT_PRECISION_FP32, LLMT_PRECISION_BF16_MIXED};
    const int decay_norms[2] = {0, 1};
    const int32_t parts[2] = {LLMT_OFFLOAD_OPTIMIZER, LLMT_OFFLOAD_OPTIMIZER | LLMT_OFFLOAD_GRADS};
    for (int p = 0; p < 2; p++) {
        size_t n_ref = 0;
        float *ref = chunked_train(precisions[p], LLMT_OFFLOAD_NONE, decay_norms[p], &n_ref);
        for (int r = 0; r < 2; r++) {
            size_t n = 0;
            float *got = chunked_train(precisions[p], parts[r], decay_norms[p], &n);
            assert_int_equal(n, n_ref);
            size_t first = 0;
            while (first < n && !memcmp(&ref[first], &got[first], sizeof *got))
                first++;
            if (first < n)
                fail_msg("precision %d, offload parts %d over several chunks (decay_norms %d): "
                         "value %zu of %zu (weights, then each state) differs from the device "
                         "optimizer's",
                         precisions[p], parts[r], decay_norms[p], first, n);
            free(got);
        }
        free(ref);
    }
}

/* Every gradient after two micro-batches accumulated (no zeroing between,
 * so the second loads each offloaded bucket back from host memory) on CUDA,
 * with the optimizer created at (parts, layers); with parts, the device's
 * GRADS and HOST_STATE peaks are checked against the plan. */
static float *accumulated_grads(int precision, int tied, int32_t parts, int32_t layers,
                                size_t *len)
{
    llmt_context *ctx = make_ctx(LLMT_BACKEND_CUDA);
    llmt_model_config c = offload_config(precision, tied);
    llmt_model *m = NULL;
    llmt_optimizer *o = NULL;
    llmt_optimizer_config oc = LLMT_OPTIMIZER_CONFIG_INIT;
    oc.offload_parts = parts;
    oc.offload_layers = layers;
    assert_int_equal(llmt_model_create(&m, ctx, &c), LLMT_OK);
    assert_int_equal(llmt_optimizer_create(&o, m, &oc), LLMT_OK);
    int32_t tokens[B * T], targets[B * T];
    assert_int_equal(llmt_model_zero_grads(m), LLMT_OK);
    for (int micro = 0; micro < 2; micro++) {
        double loss = 0;
        make_batch(micro, tokens, targets);
        assert_int_equal(llmt_model_forward_backward(m, tokens, targets, B, T, 0.5, 0, &loss),
                         LLMT_OK);
    }
    float *out = get_all(m, 1, len);
    llmt_plan_config pc = LLMT_PLAN_CONFIG_INIT;
    pc.model = c;
    pc.micro_batch = B;
    pc.seq_len = T;
    pc.offload_parts = parts;
    pc.offload_layers = layers;
    llmt_plan p = LLMT_PLAN_INIT;
    llmt_memory_stats s = LLMT_MEMORY_STATS_INIT;
    assert_int_equal(llmt_plan_compute(ctx, &pc, &p), LLMT_OK);
    assert_int_equal(llmt_context_memory_stats(ctx, &s), LLMT_OK);
    const int cats[2] = {LLMT_MEM_GRADS, LLMT_MEM_HOST_STATE};
    for (int i = 0; i < 2; i++)
        if (s.peak[cats[i]] != p.bytes[cats[i]])
            fail_msg("precision %d, tied %d, offload (%d, %d): %s planned %llu, measured %llu",
                     precision, tied, parts, layers, llmt_mem_category_name(cats[i]),
                     (unsigned long long)p.bytes[cats[i]], (unsigned long long)s.peak[cats[i]]);
    llmt_optimizer_free(o);
    llmt_model_free(m);
    llmt_context_free(ctx);
    return out;
}

/* Gradient offload on CUDA stores each bucket on the copy stream while
 * backward writes the next one in the other slot, and a second micro-batch
 * loads the stored buckets back: the accumulated gradients are the bits of
 * keeping them on the device, tied and untied, with every layer offloaded
 * and with layer 0 alone (its bucket straddles the split); the device
 * holds the planned two slots. (On the emulator the copy stream's copies
 * run only when waited for, so a missing wait changes bits here.) */
static void test_offload_grads_overlap(void **state)
{
    (void)state;
    need_cuda();
    const int32_t both = LLMT_OFFLOAD_OPTIMIZER | LLMT_OFFLOAD_GRADS;
    const int precisions[2] = {LLMT_PRECISION_FP32, LLMT_PRECISION_BF16_MIXED};
    for (int p = 0; p < 2; p++)
        for (int tied = 0; tied < 2; tied++) {
            size_t n_ref = 0, n_all = 0, n_one = 0;
            float *ref = accumulated_grads(precisions[p], tied, LLMT_OFFLOAD_NONE, 0, &n_ref);
            float *all = accumulated_grads(precisions[p], tied, both, LLMT_OFFLOAD_ALL_LAYERS,
                                           &n_all);
            float *one = accumulated_grads(precisions[p], tied, both, 1, &n_one);
            assert_int_equal(n_all, n_ref);
            assert_int_equal(n_one, n_ref);
            if (memcmp(ref, all, n_ref * sizeof *ref) || memcmp(ref, one, n_ref * sizeof *ref))
                fail_msg("precision %d, tied %d: offloaded gradients differ from the device's "
                         "(all layers: %s, layer 0: %s)", precisions[p], tied,
                         memcmp(ref, all, n_ref * sizeof *ref) ? "differ" : "same",
                         memcmp(ref, one, n_ref * sizeof *ref) ? "differ" : "same");
            free(ref);
            free(all);
            free(one);
        }
}

/* An argument runs only the tests whose names match it (cmocka's filter). */
int main(int argc, char **argv)
{
    if (argc > 1)
        cmocka_set_test_filter(argv[1]);
    llmt_context_config cfg = LLMT_CONTEXT_CONFIG_INIT;
    cfg.backend = LLMT_BACKEND_CUDA;
    llmt_context *probe = NULL;
    if (llmt_context_create(&probe, &cfg) == LLMT_OK) {
        g_have_cuda = 1;
        char line[1024];
        llmt_cuda_plugin_describe(probe->plugin_handle, line, sizeof line);
        printf("CUDA backend: %s\n", line);
        llmt_context_free(probe);
    } else {
        snprintf(g_why, sizeof g_why, "%s", llmt_error_last());
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gradients_fp32),
        cmocka_unit_test(test_gradients_bf16_mixed),
        cmocka_unit_test(test_training_fp32),
        cmocka_unit_test(test_training_bf16_mixed),
        cmocka_unit_test(test_cuda_deterministic),
        cmocka_unit_test(test_recompute_same_bits),
        cmocka_unit_test(test_slicing_matches_unsliced),
        cmocka_unit_test(test_safetensors_roundtrip),
        cmocka_unit_test(test_offload_same_bits),
        cmocka_unit_test(test_offload_ordered_same_bits),
        cmocka_unit_test(test_offload_grads_overlap),
        cmocka_unit_test(test_offload_chunks_pipelined),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    /* 77: CTest's SKIP_RETURN_CODE for this test (tests/CMakeLists.txt). */
    return failed ? failed : g_have_cuda ? 0 : 77;
}
