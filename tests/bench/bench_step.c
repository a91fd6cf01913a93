/* Benchmark of a full training step (zero grads, forward, backward, AdamW)
 * on the CPU backend, against the machine's own sgemm rate measured in the
 * same process, for each precision mode.
 *
 * Usage: bench_step [small|134m] [steps] [threads] [fp32|bf16|fp16|bf16pure|all]
 *   small: dim 512, 8 layers, 8 heads, FFN 1408, vocab 8192 (34M parameters)
 *   134m:  dim 768, 12 layers, 12 heads, FFN 2048, vocab 32000
 * Both at B=4, T=512. Model FLOPs per step: 6 * params * tokens plus the
 * attention term 12 * layers * dim * T * tokens; a second ratio leaves out the
 * input embedding table, which is a lookup, not a product. The optimizer's
 * throughput counts the bytes of state one step reads and writes, against a
 * memcpy of 1 GiB measured here. */
#include <stdio.h>
#include <string.h>

#include "bench_sgemm.h"
#include "bench_util.h"
#include "llmt/llmt.h"

static const char *mode_names[4] = {"fp32", "bf16", "fp16", "bf16pure"};

/* Bytes one optimizer step moves per parameter: the gradient statistics pass
 * reads g; AdamW reads w or master, g, m, v and writes them back (and the
 * 16-bit copy of master). */
static double optimizer_bytes_per_param(int precision)
{
    switch (precision) {
    case LLMT_PRECISION_FP32: return 4 + (4 + 4 + 4 + 4) + (4 + 4 + 4);
    case LLMT_PRECISION_BF16_PURE: return 2 + (2 + 2 + 2 + 2) + (2 + 2 + 2);
    default: return 2 + (4 + 2 + 4 + 4) + (4 + 2 + 4 + 4);
    }
}

static double memcpy_gbps(void)
{
    size_t n = (size_t)1 << 30;
    char *a = malloc(n), *b = malloc(n);
    memset(a, 1, n);
    memset(b, 2, n);
    double best = 1e30;
    for (int r = 0; r < 3; r++) {
        double t = bench_now();
        memcpy(b, a, n);
        t = bench_now() - t;
        best = t < best ? t : best;
    }
    free(a);
    free(b);
    return 2.0 * (double)n / best / 1e9; /* read + write */
}

static int run(const char *which, llmt_model_config c, int precision, int steps, int threads,
               double sgemm, double copy_gbps)
{
    const int B = 4, T = 512;
    c.precision = precision;
    llmt_context_config cc = LLMT_CONTEXT_CONFIG_INIT;
    cc.num_threads = threads;
    llmt_context *ctx = NULL;
    llmt_model *m = NULL;
    llmt_optimizer *o = NULL;
    llmt_loss_scaler *sc = NULL;
    llmt_optimizer_config oc = LLMT_OPTIMIZER_CONFIG_INIT;
    llmt_loss_scaler_config lc = LLMT_LOSS_SCALER_CONFIG_INIT;
    if (precision != LLMT_PRECISION_FP16_MIXED) {
        lc.dynamic = 0;
        lc.init_scale = 1.0;
    }
    if (llmt_context_create(&ctx, &cc) || llmt_model_create(&m, ctx, &c) ||
        llmt_optimizer_create(&o, m, &oc) || llmt_loss_scaler_create(&sc, &lc)) {
        fprintf(stderr, "bench_step: %s\n", llmt_error_last());
        return 1;
    }
    int32_t *tokens = malloc(sizeof(int32_t) * B * T), *targets = malloc(sizeof(int32_t) * B * T);
    for (int i = 0; i < B * T; i++) {
        tokens[i] = (int32_t)((i * 2654435761u) % (unsigned)c.vocab_size);
        targets[i] = (int32_t)(((i + 1) * 2654435761u) % (unsigned)c.vocab_size);
    }
    double *times = malloc(sizeof(double) * (size_t)steps), *opt_times = malloc(sizeof(double) * (size_t)steps);
    double loss = 0;
    for (int s = -1; s < steps; s++) { /* step -1 warms up (arena allocation) */
        double t = bench_now();
        if (llmt_model_zero_grads(m) ||
            llmt_model_forward_backward(m, tokens, targets, B, T, llmt_loss_scaler_scale(sc), 0,
                                        &loss)) {
            fprintf(stderr, "bench_step: %s\n", llmt_error_last());
            return 1;
        }
        double t_opt = bench_now();
        if (llmt_optimizer_step(o, sc, NULL)) {
            fprintf(stderr, "bench_step: %s\n", llmt_error_last());
            return 1;
        }
        double t_end = bench_now();
        if (s >= 0) {
            times[s] = t_end - t;
            opt_times[s] = t_end - t_opt;
        }
    }
    double best = times[0], opt_best = opt_times[0];
    for (int s = 1; s < steps; s++) {
        best = times[s] < best ? times[s] : best;
        opt_best = opt_times[s] < opt_best ? opt_times[s] : opt_best;
    }
    double median = bench_median(times, steps);
    double params = (double)llmt_model_num_params(m), tokens_per_step = (double)B * T;
    double flops = 6.0 * params * tokens_per_step +
                   12.0 * c.num_layers * c.hidden_size * (double)T * tokens_per_step;
    double lookup = c.tie_embeddings ? 0.0 : (double)c.vocab_size * c.hidden_size;
    double matmul_flops = flops - 6.0 * lookup * tokens_per_step;
    double opt_gbps = optimizer_bytes_per_param(precision) * params / opt_best / 1e9;
    printf("%-6s %-9s %7.3f %7.3f %8.0f %8.1f %6.3f %6.3f %8.3f %7.1f %6.2f\n", which,
           mode_names[precision], best, median, tokens_per_step / best, flops / best / 1e9,
           flops / best / 1e9 / sgemm, matmul_flops / best / 1e9 / sgemm, opt_best, opt_gbps,
           opt_gbps / copy_gbps);
    free(times);
    free(opt_times);
    free(tokens);
    free(targets);
    llmt_loss_scaler_free(sc);
    llmt_optimizer_free(o);
    llmt_model_free(m);
    llmt_context_free(ctx);
    return 0;
}

int main(int argc, char **argv)
{
    const char *which = argc > 1 ? argv[1] : "small";
    int steps = argc > 2 ? atoi(argv[2]) : 5;
    int threads = argc > 3 ? atoi(argv[3]) : 2;
    const char *mode = argc > 4 ? argv[4] : "fp32";
    llmt_model_config c = LLMT_MODEL_CONFIG_INIT;
    c.max_seq_len = 512;
    if (strcmp(which, "134m") == 0) {
        c.vocab_size = 32000, c.hidden_size = 768, c.num_layers = 12, c.num_heads = 12;
        c.num_kv_heads = 12, c.ffn_size = 2048;
    } else {
        c.vocab_size = 8192, c.hidden_size = 512, c.num_layers = 8, c.num_heads = 8;
        c.num_kv_heads = 8, c.ffn_size = 1408;
    }
    double sgemm = bench_sgemm_gflops(threads, 6);
    double copy = memcpy_gbps();
    printf("B=4 T=512, %d threads, OpenBLAS core %s, sgemm 2048^3 %.1f GFLOP/s, memcpy %.1f GB/s\n",
           threads, openblas_get_corename(), sgemm, copy);
    printf("config mode      min(s)  med(s) tokens/s  GFLOP/s  ratio r(noemb)   opt(s)  opt GB/s vs memcpy\n");
    for (int p = 0; p < 4; p++)
        if (strcmp(mode, "all") == 0 || strcmp(mode, mode_names[p]) == 0)
            if (run(which, c, p, steps, threads, sgemm, copy))
                return 1;
    return 0;
}
