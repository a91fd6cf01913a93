/* The memory planner: what a configuration needs per category before
 * anything is allocated, and the largest micro-batch and lightest recompute
 * that fit a budget.
 *
 *   plan_demo [budget_GiB] */
#include <stdio.h>
#include <stdlib.h>

#include <llmt/llmt.h>

int main(int argc, char **argv)
{
    double budget_gib = argc > 1 ? atof(argv[1]) : 2.0;
    llmt_context_config cc = LLMT_CONTEXT_CONFIG_INIT;
    llmt_context *ctx = NULL;
    if (llmt_context_create(&ctx, &cc)) {
        fprintf(stderr, "plan_demo: %s\n", llmt_error_last());
        return 1;
    }
    /* A 134M-parameter LLaMA at sequence 1024, bf16 mixed precision. */
    llmt_plan_config pc = LLMT_PLAN_CONFIG_INIT;
    pc.model.vocab_size = 32000, pc.model.hidden_size = 768, pc.model.num_layers = 12;
    pc.model.num_heads = 12, pc.model.num_kv_heads = 12, pc.model.ffn_size = 2048;
    pc.model.max_seq_len = 1024, pc.model.precision = LLMT_PRECISION_BF16_MIXED;
    pc.micro_batch = 16;
    pc.seq_len = 1024;
    const int32_t policies[3] = {LLMT_RECOMPUTE_NONE,
                                 LLMT_RECOMPUTE_ATTN_CORE | LLMT_RECOMPUTE_FFN_ACT,
                                 LLMT_RECOMPUTE_FULL};
    for (int i = 0; i < 3; i++) {
        pc.recompute = policies[i];
        llmt_plan p = LLMT_PLAN_INIT;
        if (llmt_plan_compute(ctx, &pc, &p)) {
            fprintf(stderr, "plan_demo: %s\n", llmt_error_last());
            return 1;
        }
        printf("micro-batch 16, recompute %-18s peak %6.2f GiB (activations %.2f)\n",
               llmt_recompute_policy_name(policies[i]), p.peak / 1073741824.0,
               p.bytes[LLMT_MEM_ACTIVATIONS] / 1073741824.0);
    }
    int32_t micro = 0, policy = 0;
    pc.recompute = LLMT_RECOMPUTE_NONE;
    if (llmt_plan_fit(ctx, &pc, (uint64_t)(budget_gib * 1073741824.0), &micro, &policy) == LLMT_OK)
        printf("a %.1f GiB budget fits micro-batch %d with recompute %s\n", budget_gib, micro,
               llmt_recompute_policy_name(policy));
    else
        printf("a %.1f GiB budget: %s\n", budget_gib, llmt_error_last());
    llmt_context_free(ctx);
    return 0;
}
