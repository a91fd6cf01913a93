/* Activation memory and step time of each recompute policy, measured in one
 * run on the benchmark model (dim 512, 8 layers, 8 heads, FFN 1408, vocab
 * 8192; B=4, T=512 unless told): the peak of the ACTIVATIONS category after a step, and
 * the step time (zero grads, forward, backward, AdamW) relative to NONE.
 * Policies are measured in rounds (each round runs every policy once) so
 * that drift of the machine's speed affects them alike; each measurement
 * follows an untimed step that touches the freshly laid-out arena.
 *
 * Usage: bench_recompute [rounds (at most 16)] [threads] [fp32|bf16] [B T] */
#include <stdio.h>
#include <string.h>

#include "bench_util.h"
#include "llmt/llmt.h"

static const int32_t policies[] = {
    LLMT_RECOMPUTE_NONE, LLMT_RECOMPUTE_FFN_ACT, LLMT_RECOMPUTE_ATTN_CORE,
    LLMT_RECOMPUTE_ATTN_CORE | LLMT_RECOMPUTE_FFN_ACT, LLMT_RECOMPUTE_ATTN_CORE | LLMT_RECOMPUTE_FFN,
    LLMT_RECOMPUTE_FULL};
#define NP ((int)(sizeof policies / sizeof policies[0]))

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 3;
    rounds = rounds < 1 ? 1 : rounds > 16 ? 16 : rounds;
    int threads = argc > 2 ? atoi(argv[2]) : 2;
    int precision = argc > 3 && !strcmp(argv[3], "bf16") ? LLMT_PRECISION_BF16_MIXED : LLMT_PRECISION_FP32;
    const int B = argc > 5 ? atoi(argv[4]) : 4, T = argc > 5 ? atoi(argv[5]) : 512;
    if (B < 1 || T < 1) {
        fprintf(stderr, "bench_recompute: B and T must be positive\n");
        return 1;
    }
    llmt_model_config c = LLMT_MODEL_CONFIG_INIT;
    c.vocab_size = 8192, c.hidden_size = 512, c.num_layers = 8, c.num_heads = 8;
    c.num_kv_heads = 8, c.ffn_size = 1408, c.max_seq_len = T, c.precision = precision;
    llmt_context_config cc = LLMT_CONTEXT_CONFIG_INIT;
    cc.num_threads = threads;
    llmt_context *ctx = NULL;
    llmt_model *m = NULL;
    llmt_optimizer *o = NULL;
    llmt_recompute *rc = NULL;
    llmt_optimizer_config oc = LLMT_OPTIMIZER_CONFIG_INIT;
    if (llmt_context_create(&ctx, &cc) || llmt_model_create(&m, ctx, &c) ||
        llmt_optimizer_create(&o, m, &oc) || llmt_recompute_create(&rc, m)) {
        fprintf(stderr, "bench_recompute: %s\n", llmt_error_last());
        return 1;
    }
    int32_t *tokens = malloc(sizeof(int32_t) * B * T), *targets = malloc(sizeof(int32_t) * B * T);
    for (int i = 0; i < B * T; i++) {
        tokens[i] = (int32_t)((i * 2654435761u) % 8192u);
        targets[i] = (int32_t)(((i + 1) * 2654435761u) % 8192u);
    }
    double times[NP][16];
    uint64_t act[NP] = {0};
    for (int r = 0; r < rounds; r++) {
        for (int k = 0; k < NP; k++) {
            llmt_recompute_set_layers(rc, 0, -1, policies[k]);
            llmt_model_reserve_activations(m, B, T);
            llmt_context_reset_peak(ctx);
            /* An untimed step first: the new arena's pages are touched once. */
            double t = 0;
            for (int pass = 0; pass < 2; pass++) {
                t = bench_now();
                if (llmt_model_zero_grads(m) ||
                    llmt_model_forward_backward(m, tokens, targets, B, T, 1.0, 0.0, NULL) ||
                    llmt_optimizer_step(o, NULL, NULL)) {
                    fprintf(stderr, "bench_recompute: %s\n", llmt_error_last());
                    return 1;
                }
                t = bench_now() - t;
            }
            llmt_memory_stats s = LLMT_MEMORY_STATS_INIT;
            llmt_context_memory_stats(ctx, &s);
            act[k] = s.peak[LLMT_MEM_ACTIVATIONS];
            times[k][r] = t;
        }
    }
    double base = bench_median(times[0], rounds);
    printf("%s, B=%d T=%d, %d threads, %d rounds\n", precision == LLMT_PRECISION_FP32 ? "fp32" : "bf16_mixed",
           B, T, threads, rounds);
    printf("%-18s %16s %10s %12s %12s\n", "recompute", "activations MiB", "saved", "median s",
           "time vs none");
    for (int k = 0; k < NP; k++) {
        double med = bench_median(times[k], rounds);
        printf("%-18s %16.1f %9.1f%% %12.3f %+11.1f%%\n", llmt_recompute_policy_name(policies[k]),
               (double)act[k] / 1048576.0, 100.0 * (1.0 - (double)act[k] / (double)act[0]), med,
               100.0 * (med / base - 1.0));
    }
    free(tokens);
    free(targets);
    llmt_recompute_free(rc);
    llmt_optimizer_free(o);
    llmt_model_free(m);
    llmt_context_free(ctx);
    return 0;
}
