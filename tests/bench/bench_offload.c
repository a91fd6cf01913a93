/* Optimizer offload on the CPU (issue 15): what the host AdamW costs.
 *
 * 1. Host AdamW throughput (the CPU backend's kernel, which updates the
 *    offloaded state) against memcpy on the same threads. Traffic counts
 *    bytes read plus bytes written per element: fp32 reads w, g, m, v and
 *    writes w, m, v (7 x 4 = 28 B); bf16_mixed reads g (2), master, m, v
 *    (12) and writes w (2), master, m, v (12): 28 B. A memcpy of S bytes is
 *    2 S of traffic. The ratio is AdamW's traffic per second over memcpy's.
 * 2. The step time (zero grads, forward, backward, AdamW) of a small model
 *    with the state offloaded whole against none, in alternating rounds
 *    (median); on the CPU backend the host segment is updated in place, so
 *    the ratio should be ~1.
 * 3. The same with the batch of 4 run as micro-batches of 1 summed in
 *    order (LLMT_ACCUMULATE_ORDERED): with the gradients offloaded, the
 *    fp32 sum's host part is added to by the host after each micro-batch.
 *
 * Usage: bench_offload [threads (2)] [elements in millions (16)] [rounds (5)] */
#include <omp.h>
#include <stdio.h>
#include <string.h>

#include "bench_util.h"
#include "llmt/llmt.h"
#include "ops/ops.h"

/* Seconds of one memcpy of bytes split over threads (median of rounds). */
static double time_memcpy(char *dst, const char *src, size_t bytes, int threads, int rounds)
{
    double t[16];
    for (int r = 0; r < rounds; r++) {
        double t0 = bench_now();
#pragma omp parallel num_threads(threads)
        {
            int i = omp_get_thread_num(), n = omp_get_num_threads();
            size_t a = bytes * (size_t)i / (size_t)n, b = bytes * (size_t)(i + 1) / (size_t)n;
            memcpy(dst + a, src + a, b - a);
        }
        t[r] = bench_now() - t0;
    }
    return bench_median(t, rounds);
}

/* Seconds of one AdamW over n elements in mode w_dt (F32: no master; BF16:
 * fp32 master), median of rounds. */
static double time_adamw(llmt_device *dev, int w_dt, int64_t n, int rounds)
{
    size_t ws = w_dt == LLMT_DTYPE_F32 ? 4 : 2;
    char *w = calloc((size_t)n, ws), *g = calloc((size_t)n, ws);
    float *m = calloc((size_t)n, 4), *v = calloc((size_t)n, 4);
    float *master = w_dt == LLMT_DTYPE_F32 ? NULL : calloc((size_t)n, 4);
    if (!w || !g || !m || !v || (w_dt != LLMT_DTYPE_F32 && !master)) {
        fprintf(stderr, "bench_offload: out of memory\n");
        exit(1);
    }
    llmt_adamw_args a = {.w = w, .master = master, .g = g, .m = m, .v = v, .n = n,
                         .w_dt = w_dt, .state_dt = LLMT_DTYPE_F32, .grad_factor = 1.0f,
                         .lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                         .weight_decay = 0.1f, .bias_correction1 = 0.1f,
                         .bias_correction2 = 0.05f};
    double t[16];
    dev->ops->adamw(dev, &a); /* touches every page once */
    for (int r = 0; r < rounds; r++) {
        double t0 = bench_now();
        if (dev->ops->adamw(dev, &a)) {
            fprintf(stderr, "bench_offload: %s\n", llmt_error_last());
            exit(1);
        }
        t[r] = bench_now() - t0;
    }
    free(w), free(g), free(m), free(v), free(master);
    return bench_median(t, rounds);
}

/* Median step seconds of a small model with offload `parts` (ALL layers),
 * its batch in one piece (ordered 0) or in micro-batches of 1 summed in
 * order; *stats: the accounting after the last step. */
static double time_steps(int threads, int32_t parts, int ordered, int rounds,
                         llmt_memory_stats *stats)
{
    llmt_context_config cc = LLMT_CONTEXT_CONFIG_INIT;
    cc.num_threads = threads;
    llmt_model_config c = LLMT_MODEL_CONFIG_INIT;
    c.vocab_size = 4096, c.hidden_size = 256, c.num_layers = 4, c.num_heads = 4;
    c.num_kv_heads = 4, c.ffn_size = 704, c.max_seq_len = 128;
    llmt_optimizer_config oc = LLMT_OPTIMIZER_CONFIG_INIT;
    oc.offload_parts = parts;
    llmt_context *ctx = NULL;
    llmt_model *m = NULL;
    llmt_optimizer *o = NULL;
    llmt_slicer *sl = NULL;
    if (llmt_context_create(&ctx, &cc) || llmt_model_create(&m, ctx, &c) ||
        llmt_optimizer_create(&o, m, &oc) || llmt_slicer_create(&sl, m, ordered ? 1 : 4) ||
        llmt_slicer_set_accumulation(sl, ordered ? LLMT_ACCUMULATE_ORDERED
                                                 : LLMT_ACCUMULATE_IN_PLACE)) {
        fprintf(stderr, "bench_offload: %s\n", llmt_error_last());
        exit(1);
    }
    enum { B = 4, T = 128 };
    int32_t tokens[B * T], targets[B * T];
    for (int i = 0; i < B * T; i++) {
        tokens[i] = (int32_t)((i * 2654435761u) % 4096u);
        targets[i] = (int32_t)(((i + 1) * 2654435761u) % 4096u);
    }
    double t[17];
    for (int r = 0; r <= rounds; r++) { /* the first is untimed */
        double t0 = bench_now(), loss = 0;
        if (llmt_model_zero_grads(m) ||
            llmt_slicer_forward_backward(sl, tokens, targets, B, T, 1.0, &loss) ||
            llmt_optimizer_step(o, NULL, NULL)) {
            fprintf(stderr, "bench_offload: %s\n", llmt_error_last());
            exit(1);
        }
        t[r] = bench_now() - t0;
    }
    stats->version = LLMT_MEMORY_STATS_VERSION;
    llmt_context_memory_stats(ctx, stats);
    llmt_slicer_free(sl);
    llmt_optimizer_free(o);
    llmt_model_free(m);
    llmt_context_free(ctx);
    return bench_median(t + 1, rounds);
}

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 2;
    double millions = argc > 2 ? atof(argv[2]) : 16;
    int rounds = argc > 3 ? atoi(argv[3]) : 5;
    threads = threads < 1 ? 1 : threads;
    rounds = rounds < 1 ? 1 : rounds > 16 ? 16 : rounds;
    int64_t n = (int64_t)(millions * 1e6);
    if (n < 1) {
        fprintf(stderr, "bench_offload: elements must be positive\n");
        return 1;
    }
    llmt_device *dev = NULL;
    if (llmt_cpu_backend_create(threads, &dev)) {
        fprintf(stderr, "bench_offload: %s\n", llmt_error_last());
        return 1;
    }
    size_t traffic = 28 * (size_t)n; /* bytes read + written per update, both modes */
    char *src = malloc(traffic / 2), *dst = malloc(traffic / 2);
    if (!src || !dst) {
        fprintf(stderr, "bench_offload: out of memory\n");
        return 1;
    }
    memset(src, 1, traffic / 2);
    memset(dst, 0, traffic / 2);
    double t_copy = time_memcpy(dst, src, traffic / 2, threads, rounds);
    double copy_rate = (double)traffic / t_copy;
    printf("threads %d, %lld elements (%.0f MB of traffic per update: 28 B each)\n", threads,
           (long long)n, (double)traffic / 1e6);
    printf("memcpy of %.0f MB:          %.3f s, %.2f GB/s of traffic (read + write)\n",
           (double)traffic / 2e6, t_copy, copy_rate / 1e9);
    const int modes[2] = {LLMT_DTYPE_F32, LLMT_DTYPE_BF16};
    const char *names[2] = {"fp32      ", "bf16_mixed"};
    for (int k = 0; k < 2; k++) {
        double t = time_adamw(dev, modes[k], n, rounds);
        double rate = (double)traffic / t;
        printf("host AdamW %s:         %.3f s, %.2f GB/s of traffic, %.2f x memcpy, "
               "%.1f M params/s\n", names[k], t, rate / 1e9, rate / copy_rate, (double)n / t / 1e6);
    }
    dev->ops->destroy(dev);
    free(src), free(dst);

    const int32_t grads = LLMT_OFFLOAD_OPTIMIZER | LLMT_OFFLOAD_GRADS;
    double none[16], opt[16], both[16], ord_none[16], ord_both[16];
    for (int r = 0; r < rounds; r++) { /* alternating, so drift hits all alike */
        llmt_memory_stats s = LLMT_MEMORY_STATS_INIT, sb = LLMT_MEMORY_STATS_INIT;
        llmt_memory_stats so = LLMT_MEMORY_STATS_INIT;
        none[r] = time_steps(threads, LLMT_OFFLOAD_NONE, 0, 3, &s);
        opt[r] = time_steps(threads, LLMT_OFFLOAD_OPTIMIZER, 0, 3, &s);
        both[r] = time_steps(threads, grads, 0, 3, &sb);
        ord_none[r] = time_steps(threads, LLMT_OFFLOAD_NONE, 1, 3, &so);
        ord_both[r] = time_steps(threads, grads, 1, 3, &so);
        if (r == 0)
            printf("step model: dim 256, 4 layers, vocab 4096, B 4 x T 128; offloaded "
                   "host_state %.1f MB, optimizer on the device %.1f MB; with the gradients "
                   "host_state %.1f MB, grads on the device %.1f MB\n",
                   (double)s.current[LLMT_MEM_HOST_STATE] / 1e6,
                   (double)s.current[LLMT_MEM_OPTIMIZER] / 1e6,
                   (double)sb.current[LLMT_MEM_HOST_STATE] / 1e6,
                   (double)sb.current[LLMT_MEM_GRADS] / 1e6);
        if (r == 0)
            printf("ordered with the gradients offloaded: host_state %.1f MB (the fp32 sum's "
                   "host part too), grads on the device %.1f MB\n",
                   (double)so.current[LLMT_MEM_HOST_STATE] / 1e6,
                   (double)so.current[LLMT_MEM_GRADS] / 1e6);
    }
    double tn = bench_median(none, rounds), to = bench_median(opt, rounds);
    double tb = bench_median(both, rounds);
    printf("step time: offload none %.1f ms, optimizer (all layers) %.1f ms: %.3f x, "
           "optimizer+grads (all layers) %.1f ms: %.3f x\n",
           tn * 1e3, to * 1e3, to / tn, tb * 1e3, tb / tn);
    double ton = bench_median(ord_none, rounds), tob = bench_median(ord_both, rounds);
    printf("ordered, 4 micro-batches of 1: offload none %.1f ms, optimizer+grads (all layers) "
           "%.1f ms: %.3f x\n", ton * 1e3, tob * 1e3, tob / ton);
    return 0;
}
