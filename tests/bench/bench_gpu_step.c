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
 * tokens (the attention term counts the full square, as PaLM's MFU does),
 * MFU = model FLOP/s / measured GEMM FLOP/s and against the H100/H200 SXM
 * datasheet's dense bf16 peak (989 TFLOP/s), and each memory category's
 * measured peak next to what llmt_plan_compute predicts for the same run.
 * Then as many steps again through the op profiler (op_profile.h), which
 * synchronizes around every op: per op family the calls, time, FLOPs,
 * TFLOP/s, MFU against both rates, bandwidth and roofline time (op_cost.h),
 * and the profiled step against the unprofiled one.
 *
 * Usage: bench_gpu_step [steps] [125m|1b|all] [json-file]
 *        bench_gpu_step --roofline [125m|1b|all]
 * With json-file, the figures are also written there as one JSON object
 * (tests/gpu/run.sh puts it in its summary). --roofline prints each model's
 * per-family table of FLOPs, bytes and roofline time on an H200 (the one in
 * docs/cuda.md) without opening a device.
 * Exit status: 0 when every model ran; 77 ("skipped") when no CUDA device
 * can be opened, 1 then under LLMT_REQUIRE_CUDA=1 (a GPU run must not pass
 * without one); 1 on any error. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "core/context_internal.h"
#include "core/cuda_plugin_info.h"
#include "core/half.h"
#include "llmt/llmt.h"
#include "op_profile.h"

/* Dense bf16 tensor-core peak of an H100/H200 SXM, by NVIDIA's datasheet. */
#define DATASHEET_BF16_TFLOPS OP_PEAK_TFLOPS

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

/* The sequence length of every run. */
#define SEQ 2048

/* bm's model in BF16_MIXED at T = SEQ. */
static llmt_model_config model_config(const bench_model *bm)
{
    llmt_model_config c = LLMT_MODEL_CONFIG_INIT;
    c.vocab_size = bm->vocab;
    c.hidden_size = bm->d;
    c.num_layers = bm->layers;
    c.num_heads = bm->heads;
    c.num_kv_heads = bm->kv_heads;
    c.ffn_size = bm->ffn;
    c.max_seq_len = SEQ;
    c.precision = LLMT_PRECISION_BF16_MIXED;
    return c;
}

/* Which of a family's two bounds is the larger: compute (causal FLOPs at
 * the peak) or memory (bytes at the HBM bandwidth). */
static const char *bound_of(const op_cost *c)
{
    if (c->calls == 0)
        return "-";
    return c->compute_s >= c->bytes / (OP_HBM_TBPS * 1e12) ? "compute" : "memory";
}

/* Prints bm's roofline table for one step: per family the calls, FLOPs
 * (attention also its causal half), least HBM bytes, arithmetic intensity,
 * bound and roofline time at H200 figures, as a markdown table. */
static int print_roofline(const bench_model *bm)
{
    llmt_model_config c = model_config(bm);
    op_cost cost[OP_FAMILY_COUNT], total = {0};
    if (op_cost_step(&c, bm->batch, SEQ, cost) != 0) {
        fprintf(stderr, "bench_gpu_step: no step formula for model %s\n", bm->name);
        return 1;
    }
    printf("%s: B %d, T %d, BF16_MIXED; H200: %.1f TFLOP/s dense bf16, %.1f TB/s HBM3e\n\n",
           bm->name, bm->batch, SEQ, OP_PEAK_TFLOPS, OP_HBM_TBPS);
    printf("| family | calls | GFLOP | GFLOP causal | GB | FLOP/byte | bound | roofline ms "
           "| measured ms |\n");
    printf("| --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | --- |\n");
    for (int f = 0; f < OP_FAMILY_COUNT; f++) {
        const op_cost *k = &cost[f];
        op_cost_add(&total, *k);
        char intensity[32] = "-"; /* element-wise arithmetic is not counted */
        if (k->causal_flops > 0)
            snprintf(intensity, sizeof intensity, "%.0f", k->causal_flops / k->bytes);
        printf("| %s | %lld | %.1f | %.1f | %.3f | %s | %s | %.3f | no GPU run yet |\n",
               op_family_name(f), (long long)k->calls, k->flops / 1e9, k->causal_flops / 1e9,
               k->bytes / 1e9, intensity, bound_of(k), k->roofline_s * 1e3);
    }
    printf("| total | %lld | %.1f | %.1f | %.3f | %.0f | | %.3f | |\n\n", (long long)total.calls,
           total.flops / 1e9, total.causal_flops / 1e9, total.bytes / 1e9,
           total.causal_flops / total.bytes, total.roofline_s * 1e3);
    printf("%s: roofline step %.3f ms: MFU at most %.1f%% (model FLOPs, full square) with "
           "these ops\n", bm->name, total.roofline_s * 1e3,
           100.0 * total.flops / total.roofline_s / (OP_PEAK_TFLOPS * 1e12));
    return 0;
}

/* x as a JSON number; null when not finite (JSON has no NaN). */
static void json_num(FILE *f, double x)
{
    if (isfinite(x))
        fprintf(f, "%.9g", x);
    else
        fputs("null", f);
}

/* Prints model `name`'s profiled step, per family (each line starts with
 * the name, as tests/gpu/run.sh's closing summary selects lines), and
 * appends it to json (may be NULL) as the "profile" member: figures per
 * step over `steps` profiled ones. step_s: the unprofiled median;
 * prof_step_s: the profiled steps' mean. */
static void report_profile(const char *name, const op_profile *p, int steps, double step_s,
                           double prof_step_s, double gemm_rate, FILE *json)
{
    double ops_s = 0.0;
    for (int f = 0; f < OP_FAMILY_COUNT; f++)
        ops_s += p->family[f].seconds / steps;
    printf("model  family (mean of %d profiled steps, each op between two synchronizations)\n"
           "model  family        calls       ms  share   GFLOP  TFLOP/s MFU(gemm) MFU(989)"
           "    GB/s roofline(ms) x roofline\n", steps);
    if (json)
        fprintf(json, ", \"profile\": {\"steps\": %d, \"step_s\": %.6f, \"profiled_step_s\": "
                      "%.6f, \"ops_s\": %.6f, \"families\": {",
                steps, step_s, prof_step_s, ops_s);
    for (int f = 0; f < OP_FAMILY_COUNT; f++) {
        const op_cost *k = &p->family[f].cost;
        double s = p->family[f].seconds / steps, flops = k->flops / steps;
        double bytes = k->bytes / steps, roof = k->roofline_s / steps;
        double tflops = flops / s / 1e12;
        printf("%-6s %-12s %6lld %8.3f %5.1f%% %7.1f %8.1f %8.1f%% %7.1f%% %7.0f %12.3f %10.2f\n",
               name, op_family_name(f), (long long)(k->calls / steps), s * 1e3, 100.0 * s / ops_s,
               flops / 1e9, s > 0 ? tflops : 0.0, s > 0 ? 100.0 * tflops / gemm_rate : 0.0,
               s > 0 ? 100.0 * tflops / OP_PEAK_TFLOPS : 0.0, s > 0 ? bytes / s / 1e9 : 0.0,
               roof * 1e3, roof > 0 ? s / roof : 0.0);
        if (json) {
            fprintf(json, "%s\"%s\": {\"calls\": %lld, \"seconds\": ", f ? ", " : "",
                    op_family_name(f), (long long)(k->calls / steps));
            json_num(json, s);
            fprintf(json, ", \"flops\": %.0f, \"causal_flops\": %.0f, \"bytes\": %.0f, "
                          "\"roofline_s\": ",
                    flops, k->causal_flops / steps, bytes);
            json_num(json, roof);
            fputs(", \"tflops\": ", json);
            json_num(json, tflops);
            fputs(", \"mfu_vs_measured_gemm\": ", json);
            json_num(json, tflops / gemm_rate);
            fputs(", \"mfu_vs_datasheet\": ", json);
            json_num(json, tflops / OP_PEAK_TFLOPS);
            fputs("}", json);
        }
    }
    if (json)
        fputs("}}", json);
    printf("%-6s ops %.3f s of the profiled step's %.3f s (the rest: host work and "
           "synchronization); unprofiled step %.3f s: profiling adds %.1f%%\n",
           name, ops_s, prof_step_s, step_s, 100.0 * (prof_step_s / step_s - 1.0));
}

/* s as a JSON string body (quotes and backslashes escaped, control
 * characters dropped). */
static void json_str(FILE *f, const char *s)
{
    for (; *s; s++)
        if (*s == '"' || *s == '\\')
            fprintf(f, "\\%c", *s);
        else if ((unsigned char)*s >= 0x20)
            fputc(*s, f);
}

/* Runs bm and prints its table row, then its measured and planned memory;
 * appends its JSON object to json (may be NULL), after a comma unless first. */
static void run(const bench_model *bm, int steps, double gemm_rate, FILE *json, int first)
{
    const int T = SEQ, B = bm->batch;
    llmt_context_config cc = LLMT_CONTEXT_CONFIG_INIT;
    cc.backend = LLMT_BACKEND_CUDA;
    cc.seed = 1;
    llmt_context *ctx = NULL;
    CHECK(llmt_context_create(&ctx, &cc));
    /* Before the model, which keeps the op table it is created with; it
     * only passes calls through until recording is set. */
    op_profile prof;
    if (op_profile_install(&prof, ctx) != 0) {
        fprintf(stderr, "bench_gpu_step: the op profiler is installed already\n");
        exit(1);
    }
    llmt_model_config c = model_config(bm);
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
    double loss = 0, prof_s = 0;
    /* Step -1 warms up (arena, cuBLASLt heuristics); steps..2 steps - 1 are
     * profiled. */
    for (int s = -1; s < 2 * steps; s++) {
        prof.recording = s >= steps;
        CHECK(ctx->backend->ops->synchronize(ctx->backend));
        double t = bench_now();
        CHECK(llmt_model_zero_grads(m));
        CHECK(llmt_model_forward_backward(m, tokens, targets, B, T, 1.0, 0.0, &loss));
        CHECK(ctx->backend->ops->synchronize(ctx->backend));
        double t_fb = bench_now();
        CHECK(llmt_optimizer_step(o, NULL, NULL));
        CHECK(ctx->backend->ops->synchronize(ctx->backend));
        double t_end = bench_now();
        if (s >= steps) {
            prof_s += t_end - t;
        } else if (s >= 0) {
            times[s] = t_end - t;
            fb_times[s] = t_fb - t;
        }
    }
    prof.recording = 0;
    double med = bench_median(times, steps), fb_med = bench_median(fb_times, steps);
    double params = (double)llmt_model_num_params(m), tokens_per_step = (double)B * T;
    double flops = 6.0 * params * tokens_per_step +
                   12.0 * c.num_layers * c.hidden_size * (double)T * tokens_per_step;
    double tflops = flops / med / 1e12;
    llmt_memory_stats ms = LLMT_MEMORY_STATS_INIT;
    CHECK(llmt_context_memory_stats(ctx, &ms));
    /* The same run as the planner sees it: no recompute, one micro-batch of B. */
    llmt_plan_config pc = LLMT_PLAN_CONFIG_INIT;
    pc.model = c;
    pc.micro_batch = B;
    pc.seq_len = T;
    llmt_plan plan = LLMT_PLAN_INIT;
    CHECK(llmt_plan_compute(ctx, &pc, &plan));
    const double gib = 1073741824.0;
    printf("%-6s %6.0fM %3d %5d %8.3f %8.3f %10.0f %8.1f %6.1f%% %6.1f%% %8.2f %7.1f %6.2f\n",
           bm->name, params / 1e6, B, T, med, fb_med, tokens_per_step / med, tflops,
           100.0 * tflops / gemm_rate, 100.0 * tflops / DATASHEET_BF16_TFLOPS,
           ms.total_peak / gib, t_setup, loss);
    printf("       peak GiB measured / planned:");
    for (int k = 0; k < LLMT_MEM_CATEGORY_COUNT; k++)
        printf(" %s %.3f/%.3f", llmt_mem_category_name(k), ms.peak[k] / gib, plan.bytes[k] / gib);
    printf(" total %.3f/%.3f\n", ms.total_peak / gib, plan.peak / gib);
    if (json) {
        fprintf(json,
                "%s{\"name\": \"%s\", \"params\": %.0f, \"batch\": %d, \"seq_len\": %d, "
                "\"steps\": %d, \"step_s\": %.6f, \"forward_backward_s\": %.6f, "
                "\"tokens_per_s\": %.1f, \"model_tflops\": %.3f, \"mfu_vs_measured_gemm\": "
                "%.4f, \"mfu_vs_datasheet\": %.4f, \"setup_s\": %.3f, \"loss\": ",
                first ? "" : ", ", bm->name, params, B, T, steps, med,
                fb_med, tokens_per_step / med, tflops, tflops / gemm_rate,
                tflops / DATASHEET_BF16_TFLOPS, t_setup);
        if (isfinite(loss))
            fprintf(json, "%.6f", loss);
        else
            fputs("null", json); /* JSON has no NaN */
        fprintf(json, ", \"memory_bytes\": {");
        for (int k = 0; k < LLMT_MEM_CATEGORY_COUNT; k++)
            fprintf(json, "\"%s\": {\"measured_peak\": %llu, \"planned\": %llu}, ",
                    llmt_mem_category_name(k), (unsigned long long)ms.peak[k],
                    (unsigned long long)plan.bytes[k]);
        fprintf(json, "\"total\": {\"measured_peak\": %llu, \"planned\": %llu}}",
                (unsigned long long)ms.total_peak, (unsigned long long)plan.peak);
    }
    report_profile(bm->name, &prof, steps, med, prof_s / steps, gemm_rate, json);
    if (json)
        fputc('}', json);
    fflush(stdout);
    free(times);
    free(fb_times);
    free(tokens);
    free(targets);
    llmt_optimizer_free(o);
    llmt_model_free(m);
    op_profile_uninstall(&prof, ctx);
    llmt_context_free(ctx);
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--roofline") == 0) {
        const char *only = argc > 2 ? argv[2] : "all";
        int known = strcmp(only, "all") == 0, found = 0, rc = 0;
        for (size_t i = 0; i < sizeof models / sizeof models[0]; i++)
            known |= strcmp(only, models[i].name) == 0;
        if (argc > 3 || !known) { /* every argument checked before any output */
            fprintf(stderr, "usage: %s --roofline [125m|1b|all]\n", argv[0]);
            return 2;
        }
        for (size_t i = 0; i < sizeof models / sizeof models[0]; i++)
            if (strcmp(only, "all") == 0 || strcmp(only, models[i].name) == 0) {
                if (found++)
                    printf("\n");
                rc |= print_roofline(&models[i]);
            }
        return rc;
    }
    int steps = argc > 1 ? atoi(argv[1]) : 3;
    const char *which = argc > 2 ? argv[2] : "all";
    const char *json_path = argc > 3 ? argv[3] : NULL;
    if (steps < 1 || argc > 4 ||
        (strcmp(which, "all") != 0 && strcmp(which, "125m") != 0 && strcmp(which, "1b") != 0)) {
        fprintf(stderr, "usage: %s [steps >= 1] [125m|1b|all] [json-file]\n"
                        "       %s --roofline [125m|1b|all]\n", argv[0], argv[0]);
        return 2;
    }
    /* LLMT_REQUIRE_CUDA as the CUDA tests read it (tests/unit/cuda_required.h). */
    const char *req = getenv("LLMT_REQUIRE_CUDA");
    if (req && *req && strcmp(req, "0") != 0 && strcmp(req, "1") != 0) {
        fprintf(stderr, "bench_gpu_step: LLMT_REQUIRE_CUDA must be 0 or 1, not '%s'\n", req);
        return 2;
    }
    int required = req && strcmp(req, "1") == 0;
    llmt_context_config cc = LLMT_CONTEXT_CONFIG_INIT;
    cc.backend = LLMT_BACKEND_CUDA;
    llmt_context *ctx = NULL;
    if (llmt_context_create(&ctx, &cc) != LLMT_OK) {
        printf("bench_gpu_step: %s: no CUDA device (%s)\n",
               required ? "FAILED (LLMT_REQUIRE_CUDA=1)" : "skipped", llmt_error_last());
        return required ? 1 : 77;
    }
    char line[1024];
    llmt_cuda_plugin_describe(ctx->plugin_handle, line, sizeof line);
    uint64_t total = 0, free_now = 0;
    CHECK(llmt_ops(ctx)->mem_info(ctx->backend, &total, &free_now));
    double rate = gemm_tflops(ctx, 8192, 10);
    llmt_context_free(ctx);
    FILE *json = NULL;
    if (json_path && !(json = fopen(json_path, "w"))) {
        fprintf(stderr, "bench_gpu_step: cannot write %s\n", json_path);
        return 1;
    }
    printf("CUDA backend: %s\n", line);
    printf("CUDA device: %.1f GiB; bf16 GEMM 8192^3 (cuBLASLt, fp32 accumulate): %.1f TFLOP/s "
           "(datasheet peak %.0f)\n",
           total / 1073741824.0, rate, DATASHEET_BF16_TFLOPS);
    printf("BF16_MIXED, T=2048, median of %d steps (zero grads + forward_backward + AdamW)\n",
           steps);
    printf("model  params   B     T  step(s)    fb(s)   tokens/s TFLOP/s  MFU(gemm) MFU(989) "
           "peak(GiB) setup(s) loss\n");
    if (json) {
        fprintf(json, "{\"backend\": \"");
        json_str(json, line);
        fprintf(json, "\", \"device_bytes\": %llu, \"gemm_bf16_tflops\": %.3f, "
                      "\"datasheet_bf16_tflops\": %.1f, \"hbm_tbps\": %.1f, \"models\": [",
                (unsigned long long)total, rate, DATASHEET_BF16_TFLOPS, OP_HBM_TBPS);
    }
    int first = 1;
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++)
        if (strcmp(which, "all") == 0 || strcmp(which, models[i].name) == 0) {
            run(&models[i], steps, rate, json, first);
            first = 0;
        }
    if (json) {
        fprintf(json, "]}\n");
        if (fclose(json) != 0) {
            fprintf(stderr, "bench_gpu_step: cannot write %s\n", json_path);
            return 1;
        }
    }
    return 0;
}
