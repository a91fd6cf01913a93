/* Benchmark of full training steps on the CUDA backend, against the GPU's
 * own bf16 GEMM rate measured in the same process.
 *
 * First the plugin's GEMM (cuBLASLt through the op table) on 8192^3 bf16
 * operands with fp32 accumulation: the rate a perfect trainer would reach.
 * Then, in BF16_MIXED at T = 2048, timed steps (zero grads,
 * forward_backward, AdamW step, synchronised) of
 *   125m: d 768, 12 layers, 12 heads (head_dim 64), ffn 2048, vocab 32000
 *   1b:   d 2048, 16 layers, 16 heads (head_dim 128), 8 kv heads, ffn 5632,
 *         vocab 32000
 * with model FLOPs per step 6 * params * tokens + 12 * layers * d * T *
 * tokens (the attention term counts the full square, as PaLM's MFU does)
 * and MFU = model FLOP/s / measured GEMM FLOP/s.
 *
 * Usage: bench_gpu_step [steps] [125m|1b|all]
 * Exits 0 with a "skipped" line when no CUDA device can be opened. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "core/context_internal.h"
#include "core/half.h"
#include "llmt/llmt.h"

#define CHECK(call)                                                                        \
    do {                                                                                   \
        if ((call) != LLMT_OK) {                                                           \
            fprintf(stderr, "bench_gpu_step: %s: %s\n", #call, llmt_error_last());         \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

/* TFLOP/s of the backend's bf16 GEMM, C[n,n] = A B^T (the layout of a
 * linear layer's forward), best of `reps` after warm-up. */
static double gemm_tflops(llmt_context *ctx, int64_t n, int reps)
{
    const llmt_backend_ops *ops = llmt_ops(ctx);
    llmt_device *dev = ctx->backend;
    size_t bytes = (size_t)(n * n) * 2;
    uint16_t *host = malloc(bytes);
    uint64_t s = 88172645463325252ULL;
    for (int64_t i = 0; i < n * n; i++) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        host[i] = llmt_f32_to_bf16((float)((double)(s >> 11) * 0x1p-53 - 0.5));
    }
    void *a = NULL, *b = NULL, *c = NULL, *scratch = NULL;
    llmt_op_dims dims = {0};
    dims.dt = LLMT_DTYPE_BF16;
    size_t scratch_bytes = ops->scratch_bytes(&dims);
    CHECK(ops->mem_alloc(dev, bytes, &a));
    CHECK(ops->mem_alloc(dev, bytes, &b));
    CHECK(ops->mem_alloc(dev, bytes, &c));
    CHECK(ops->mem_alloc(dev, scratch_bytes, &scratch));
    CHECK(ops->copy_to_device(dev, a, host, bytes));
    CHECK(ops->copy_to_device(dev, b, host, bytes));
    double best = 1e30;
    for (int r = 0; r < reps + 2; r++) { /* two warm-up runs */
        CHECK(ops->synchronize(dev));
        double t = bench_now();
        CHECK(ops->gemm(dev, 0, 1, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n, LLMT_DTYPE_BF16,
                        scratch));
        CHECK(ops->synchronize(dev));
        t = bench_now() - t;
        if (r >= 2 && t < best)
            best = t;
    }
    ops->mem_free(dev, a);
    ops->mem_free(dev, b);
    ops->mem_free(dev, c);
    ops->mem_free(dev, scratch);
    free(host);
    return 2.0 * (double)n * (double)n * (double)n / best / 1e12;
}

typedef struct bench_model {
    const char *name;
    int d, layers, heads, kv_heads, ffn, vocab, batch;
} bench_model;

static const bench_model models[] = {
    {"125m", 768, 12, 12, 12, 2048, 32000, 16},
    {"1b", 2048, 16, 16, 8, 5632, 32000, 8},
};

static int run(const bench_model *bm, int steps, double gemm_rate)
{
    const int T = 2048, B = bm->batch;
    llmt_context_config cc = LLMT_CONTEXT_CONFIG_INIT;
    cc.backend = LLMT_BACKEND_CUDA;
    cc.seed = 1;
    llmt_context *ctx = NULL;
    CHECK(llmt_context_create(&ctx, &cc));
    llmt_model_config c = LLMT_MODEL_CONFIG_INIT;
    c.vocab_size = bm->vocab;
    c.hidden_size = bm->d;
    c.num_layers = bm->layers;
    c.num_heads = bm->heads;
    c.num_kv_heads = bm->kv_heads;
    c.ffn_size = bm->ffn;
    c.max_seq_len = T;
    c.precision = LLMT_PRECISION_BF16_MIXED;
    llmt_model *m = NULL;
    llmt_optimizer *o = NULL;
    llmt_optimizer_config oc = LLMT_OPTIMIZER_CONFIG_INIT;
    double t_setup = bench_now();
    CHECK(llmt_model_create(&m, ctx, &c));
    CHECK(llmt_optimizer_create(&o, m, &oc));
    t_setup = bench_now() - t_setup;
    int32_t *tokens = malloc(sizeof(int32_t) * (size_t)B * T);
    int32_t *targets = malloc(sizeof(int32_t) * (size_t)B * T);
    for (int i = 0; i < B * T; i++) {
        tokens[i] = (int32_t)((i * 2654435761u) % (unsigned)c.vocab_size);
        targets[i] = (int32_t)(((i + 1) * 2654435761u) % (unsigned)c.vocab_size);
    }
    double *times = malloc(sizeof(double) * (size_t)steps);
    double *fb_times = malloc(sizeof(double) * (size_t)steps);
    double loss = 0;
    for (int s = -1; s < steps; s++) { /* step -1 warms up (arena, cuBLASLt heuristics) */
        CHECK(ctx->backend->ops->synchronize(ctx->backend));
        double t = bench_now();
        CHECK(llmt_model_zero_grads(m));
        CHECK(llmt_model_forward_backward(m, tokens, targets, B, T, 1.0, 0.0, &loss));
        CHECK(ctx->backend->ops->synchronize(ctx->backend));
        double t_fb = bench_now();
        CHECK(llmt_optimizer_step(o, NULL, NULL));
        CHECK(ctx->backend->ops->synchronize(ctx->backend));
        double t_end = bench_now();
        if (s >= 0) {
            times[s] = t_end - t;
            fb_times[s] = t_fb - t;
        }
    }
    double med = bench_median(times, steps), fb_med = bench_median(fb_times, steps);
    double params = (double)llmt_model_num_params(m), tokens_per_step = (double)B * T;
    double flops = 6.0 * params * tokens_per_step +
                   12.0 * c.num_layers * c.hidden_size * (double)T * tokens_per_step;
    double tflops = flops / med / 1e12;
    llmt_memory_stats ms = LLMT_MEMORY_STATS_INIT;
    CHECK(llmt_context_memory_stats(ctx, &ms));
    printf("%-6s %6.0fM %3d %5d %8.3f %8.3f %10.0f %8.1f %6.1f%% %8.1f %7.1f %6.1f\n", bm->name,
           params / 1e6, B, T, med, fb_med, tokens_per_step / med, tflops,
           100.0 * tflops / gemm_rate, ms.total_peak / 1073741824.0, t_setup, loss);
    fflush(stdout);
    free(times);
    free(fb_times);
    free(tokens);
    free(targets);
    llmt_optimizer_free(o);
    llmt_model_free(m);
    llmt_context_free(ctx);
    return 0;
}

int main(int argc, char **argv)
{
    int steps = argc > 1 ? atoi(argv[1]) : 3;
    const char *which = argc > 2 ? argv[2] : "all";
    if (steps < 1)
        steps = 1;
    llmt_context_config cc = LLMT_CONTEXT_CONFIG_INIT;
    cc.backend = LLMT_BACKEND_CUDA;
    llmt_context *ctx = NULL;
    if (llmt_context_create(&ctx, &cc) != LLMT_OK) {
        printf("bench_gpu_step: skipped: no CUDA device (%s)\n", llmt_error_last());
        return 0;
    }
    uint64_t total = 0, free_now = 0;
    CHECK(llmt_ops(ctx)->mem_info(ctx->backend, &total, &free_now));
    double rate = gemm_tflops(ctx, 8192, 10);
    llmt_context_free(ctx);
    printf("CUDA device: %.1f GiB; bf16 GEMM 8192^3 (cuBLASLt, fp32 accumulate): %.1f TFLOP/s\n",
           total / 1073741824.0, rate);
    printf("BF16_MIXED, T=2048, median of %d steps (zero grads + forward_backward + AdamW)\n",
           steps);
    printf("model  params   B     T  step(s)    fb(s)   tokens/s TFLOP/s    MFU peak(GiB) "
           "setup(s)  loss\n");
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++)
        if (strcmp(which, "all") == 0 || strcmp(which, models[i].name) == 0)
            if (run(&models[i], steps, rate))
                return 1;
    return 0;
}
