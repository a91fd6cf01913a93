/* Benchmark of a full training step (zero grads, forward, backward, AdamW)
 * on the CPU backend, for each precision mode, against the backend's own
 * GEMM rate in the matching dtype, all measured in the same process.
 *
 * Usage: bench_step [small|134m] [steps] [threads] [MODES]
 *   MODES: all, or a comma-separated list of fp32, bf16, fp16, bf16pure
 *   small: dim 512, 8 layers, 8 heads, FFN 1408, vocab 8192 (34M parameters)
 *   134m:  dim 768, 12 layers, 12 heads, FFN 2048, vocab 32000
 * Both at B=4, T=512. Model FLOPs per step: 6 * params * tokens plus the
 * attention term 12 * layers * dim * T * tokens; r(noemb) leaves out the
 * input embedding table, which is a lookup, not a product.
 *
 * Noise: the modes' models live side by side and their steps interleave,
 * round by round; after each timed step the reference GEMM (the backend's
 * 2048^3 product in the mode's storage dtype: fp32, or bf16 or fp16 as the
 * backend runs it, natively or widened) is timed again, and that step's
 * ratio is taken against it. The table gives min and median of the step
 * times and the median of the per-step ratios; the last lines, the other
 * modes' steps against fp32's of the same round. The optimizer's throughput
 * counts the bytes of state one step reads and writes, against a memcpy of
 * 1 GiB measured here. */
#include <stdio.h>
#include <string.h>

#include "bench_sgemm.h"
#include "bench_util.h"
#include "llmt/llmt.h"
#include "ops/ops.h"
#include "ops/cpu/cpu_backend.h"

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

/* One precision mode's model and its timings. */
typedef struct mode_run {
    int precision;
    llmt_context *ctx;
    llmt_model *m;
    llmt_optimizer *o;
    llmt_loss_scaler *sc;
    double *times, *opt_times, *ratios;
} mode_run;

static const int B = 4, T = 512;

/* The reference: the CPU backend's own GEMM of 2048^3 in one dtype. */
typedef struct ref_gemm {
    llmt_device *dev;
    void *a[3], *b[3], *c[3], *scratch;
} ref_gemm;

enum { REF_N = 2048 };

static int ref_open(ref_gemm *r, int threads)
{
    memset(r, 0, sizeof *r);
    if (llmt_cpu_backend_create(threads, &r->dev))
        return 1;
    const size_t nn = (size_t)REF_N * REF_N;
    float *x = malloc(nn * sizeof *x), *y = malloc(nn * sizeof *y);
    r->scratch = malloc(3 * nn * sizeof(float));
    for (size_t i = 0; i < nn; i++) {
        x[i] = (float)(i % 7) * 0.1f;
        y[i] = (float)(i % 5) * 0.1f;
    }
    for (int dt = 0; dt < 3; dt++) {
        size_t es = llmt_dtype_size(dt);
        r->a[dt] = malloc(nn * es);
        r->b[dt] = malloc(nn * es);
        r->c[dt] = malloc(nn * es);
        llmt_cpu_cast(r->dev, r->a[dt], dt, x, LLMT_DTYPE_F32, (int64_t)nn);
        llmt_cpu_cast(r->dev, r->b[dt], dt, y, LLMT_DTYPE_F32, (int64_t)nn);
    }
    free(x);
    free(y);
    return 0;
}

static void ref_close(ref_gemm *r)
{
    for (int dt = 0; dt < 3; dt++) {
        free(r->a[dt]);
        free(r->b[dt]);
        free(r->c[dt]);
    }
    free(r->scratch);
    r->dev->ops->destroy(r->dev);
}

/* GFLOP/s of the best of `reps` 2048^3 products in dtype dt. */
static double ref_rate(ref_gemm *r, int dt, int reps)
{
    double best = 1e30;
    for (int i = 0; i < reps; i++) {
        double t = bench_now();
        llmt_cpu_gemm(r->dev, 0, 0, REF_N, REF_N, REF_N, 1.0f, r->a[dt], REF_N, r->b[dt], REF_N,
                      0.0f, r->c[dt], REF_N, dt, r->scratch);
        t = bench_now() - t;
        best = t < best ? t : best;
    }
    return 2.0 * REF_N * (double)REF_N * REF_N / best / 1e9;
}

static int storage_dt(int precision)
{
    switch (precision) {
    case LLMT_PRECISION_FP32: return LLMT_DTYPE_F32;
    case LLMT_PRECISION_FP16_MIXED: return LLMT_DTYPE_F16;
    default: return LLMT_DTYPE_BF16;
    }
}

static int mode_open(mode_run *r, llmt_model_config c, int precision, int steps, int threads)
{
    memset(r, 0, sizeof *r);
    r->precision = precision;
    c.precision = precision;
    llmt_context_config cc = LLMT_CONTEXT_CONFIG_INIT;
    cc.num_threads = threads;
    llmt_optimizer_config oc = LLMT_OPTIMIZER_CONFIG_INIT;
    llmt_loss_scaler_config lc = LLMT_LOSS_SCALER_CONFIG_INIT;
    if (precision != LLMT_PRECISION_FP16_MIXED) {
        lc.dynamic = 0;
        lc.init_scale = 1.0;
    }
    r->times = malloc(sizeof(double) * (size_t)steps);
    r->opt_times = malloc(sizeof(double) * (size_t)steps);
    r->ratios = malloc(sizeof(double) * (size_t)steps);
    if (llmt_context_create(&r->ctx, &cc) || llmt_model_create(&r->m, r->ctx, &c) ||
        llmt_optimizer_create(&r->o, r->m, &oc) || llmt_loss_scaler_create(&r->sc, &lc)) {
        fprintf(stderr, "bench_step: %s\n", llmt_error_last());
        return 1;
    }
    return 0;
}

static void mode_close(mode_run *r)
{
    free(r->times);
    free(r->opt_times);
    free(r->ratios);
    llmt_loss_scaler_free(r->sc);
    llmt_optimizer_free(r->o);
    llmt_model_free(r->m);
    llmt_context_free(r->ctx);
}

/* One step of r; step s >= 0 is recorded (-1 warms up: arena allocation). */
static int mode_step(mode_run *r, const int32_t *tokens, const int32_t *targets, int s)
{
    double loss, t = bench_now();
    if (llmt_model_zero_grads(r->m) ||
        llmt_model_forward_backward(r->m, tokens, targets, B, T, llmt_loss_scaler_scale(r->sc), 0,
                                    &loss)) {
        fprintf(stderr, "bench_step: %s\n", llmt_error_last());
        return 1;
    }
    double t_opt = bench_now();
    if (llmt_optimizer_step(r->o, r->sc, NULL)) {
        fprintf(stderr, "bench_step: %s\n", llmt_error_last());
        return 1;
    }
    double t_end = bench_now();
    if (s >= 0) {
        r->times[s] = t_end - t;
        r->opt_times[s] = t_end - t_opt;
    }
    return 0;
}

static double min_of(const double *v, int n)
{
    double m = v[0];
    for (int i = 1; i < n; i++)
        m = v[i] < m ? v[i] : m;
    return m;
}

static void report(const char *which, const mode_run *r, const llmt_model_config *c, int steps,
                   double copy_gbps)
{
    double best = min_of(r->times, steps), opt_best = min_of(r->opt_times, steps);
    double *v = malloc(sizeof(double) * (size_t)steps);
    memcpy(v, r->times, sizeof(double) * (size_t)steps);
    double median = bench_median(v, steps);
    memcpy(v, r->ratios, sizeof(double) * (size_t)steps);
    double ratio = bench_median(v, steps);
    free(v);
    double params = (double)llmt_model_num_params(r->m), tokens_per_step = (double)B * T;
    double flops = 6.0 * params * tokens_per_step +
                   12.0 * c->num_layers * c->hidden_size * (double)T * tokens_per_step;
    double lookup = c->tie_embeddings ? 0.0 : (double)c->vocab_size * c->hidden_size;
    double matmul_share = (flops - 6.0 * lookup * tokens_per_step) / flops;
    double opt_gbps = optimizer_bytes_per_param(r->precision) * params / opt_best / 1e9;
    printf("%-6s %-9s %7.3f %7.3f %8.0f %8.1f %4s %6.3f %6.3f %8.3f %7.1f %6.2f\n", which,
           mode_names[r->precision], best, median, tokens_per_step / best, flops / best / 1e9,
           llmt_dtype_name(storage_dt(r->precision)), ratio, ratio * matmul_share, opt_best,
           opt_gbps, opt_gbps / copy_gbps);
}

/* FLOPs of one step: the per-step ratio needs them as each step ends. */
static double step_flops(const mode_run *r, const llmt_model_config *c)
{
    double tokens_per_step = (double)B * T;
    return 6.0 * (double)llmt_model_num_params(r->m) * tokens_per_step +
           12.0 * c->num_layers * c->hidden_size * (double)T * tokens_per_step;
}

/* 1 when name is one of the comma-separated words of list. */
static int in_list(const char *list, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = list; p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL)
        if (strncmp(p, name, n) == 0 && (p[n] == ',' || p[n] == '\0'))
            return 1;
    return 0;
}

int main(int argc, char **argv)
{
    const char *which = argc > 1 ? argv[1] : "small";
    int steps = argc > 2 ? atoi(argv[2]) : 5;
    int threads = argc > 3 ? atoi(argv[3]) : 2;
    const char *mode = argc > 4 ? argv[4] : "fp32";
    if (steps < 1 || threads < 1) {
        fprintf(stderr, "usage: bench_step [small|134m] [steps >= 1] [threads >= 1] "
                        "[all|fp32,bf16,fp16,bf16pure]\n");
        return 2;
    }
    llmt_model_config c = LLMT_MODEL_CONFIG_INIT;
    c.max_seq_len = 512;
    if (strcmp(which, "134m") == 0) {
        c.vocab_size = 32000, c.hidden_size = 768, c.num_layers = 12, c.num_heads = 12;
        c.num_kv_heads = 12, c.ffn_size = 2048;
    } else {
        c.vocab_size = 8192, c.hidden_size = 512, c.num_layers = 8, c.num_heads = 8;
        c.num_kv_heads = 8, c.ffn_size = 1408;
    }
    ref_gemm ref;
    if (ref_open(&ref, threads)) {
        fprintf(stderr, "bench_step: %s\n", llmt_error_last());
        return 1;
    }
    double sgemm = bench_sgemm_gflops(threads, 4);
    double copy = memcpy_gbps();
    printf("B=4 T=512, %d threads; OpenBLAS (core %s) sgemm 2048^3 %.1f GFLOP/s, memcpy %.1f GB/s\n",
           threads, openblas_get_corename(), sgemm, copy);
    printf("backend GEMM 2048^3 at start: f32 %.1f, bf16 %.1f (%s), f16 %.1f (%s) GFLOP/s\n",
           ref_rate(&ref, LLMT_DTYPE_F32, 3), ref_rate(&ref, LLMT_DTYPE_BF16, 3),
           llmt_cpu_gemm_native(ref.dev, LLMT_DTYPE_BF16) ? "native" : "widened",
           ref_rate(&ref, LLMT_DTYPE_F16, 3),
           llmt_cpu_gemm_native(ref.dev, LLMT_DTYPE_F16) ? "native" : "widened");
    mode_run runs[4];
    int n = 0;
    for (int p = 0; p < 4; p++)
        if (strcmp(mode, "all") == 0 || in_list(mode, mode_names[p]))
            if (mode_open(&runs[n++], c, p, steps, threads))
                return 1;
    if (n == 0) {
        fprintf(stderr, "bench_step: unknown mode '%s'\n", mode);
        return 2;
    }
    int32_t *tokens = malloc(sizeof(int32_t) * B * T), *targets = malloc(sizeof(int32_t) * B * T);
    for (int i = 0; i < B * T; i++) {
        tokens[i] = (int32_t)((i * 2654435761u) % (unsigned)c.vocab_size);
        targets[i] = (int32_t)(((i + 1) * 2654435761u) % (unsigned)c.vocab_size);
    }
    for (int s = -1; s < steps; s++)
        for (int i = 0; i < n; i++) {
            if (mode_step(&runs[i], tokens, targets, s))
                return 1;
            if (s >= 0) {
                double gemm = ref_rate(&ref, storage_dt(runs[i].precision), 2);
                runs[i].ratios[s] = step_flops(&runs[i], &c) / runs[i].times[s] / 1e9 / gemm;
            }
        }
    printf("config mode      min(s)  med(s) tokens/s  GFLOP/s  ref  ratio r(noemb)   opt(s)  opt GB/s vs memcpy\n");
    for (int i = 0; i < n; i++)
        report(which, &runs[i], &c, steps, copy);
    if (n > 1 && runs[0].precision == LLMT_PRECISION_FP32) {
        double *v = malloc(sizeof(double) * (size_t)steps);
        for (int i = 1; i < n; i++) {
            for (int s = 0; s < steps; s++)
                v[s] = runs[0].times[s] / runs[i].times[s];
            double lo = min_of(v, steps), med = bench_median(v, steps);
            printf("fp32 step / %s step, same round: median %.2f, min %.2f\n",
                   mode_names[runs[i].precision], med, lo);
        }
        free(v);
    }
    for (int i = 0; i < n; i++)
        mode_close(&runs[i]);
    ref_close(&ref);
    free(tokens);
    free(targets);
    return 0;
}
