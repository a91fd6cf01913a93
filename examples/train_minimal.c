/* The smallest complete trainer against libllmt's public API: a LLaMA model,
 * AdamW and a loader over token shards, stepped by hand.
 *
 *   train_minimal 'data/text_train_*.bin' [steps]
 *
 * (llmt-tokenize or llmt-train make such shards from text.) */
#include <stdio.h>
#include <stdlib.h>

#include <llmt/llmt.h>

#define CHECK(call)                                                        \
    do {                                                                   \
        if ((call) != LLMT_OK) {                                           \
            fprintf(stderr, "train_minimal: %s\n", llmt_error_last());     \
            return 1;                                                      \
        }                                                                  \
    } while (0)

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: train_minimal SHARD_GLOB [steps]\n");
        return 2;
    }
    int steps = argc > 2 ? atoi(argv[2]) : 50;
    enum { B = 8, T = 128 };

    /* A context on the CPU, all cores, seed 1. */
    llmt_context_config cc = LLMT_CONTEXT_CONFIG_INIT;
    cc.seed = 1;
    llmt_context *ctx = NULL;
    CHECK(llmt_context_create(&ctx, &cc));

    /* A small byte-level model. */
    llmt_model_config mc = LLMT_MODEL_CONFIG_INIT;
    mc.vocab_size = 320; /* 256 bytes + end of text, rounded up */
    mc.hidden_size = 128;
    mc.num_layers = 2;
    mc.num_heads = 4;
    mc.num_kv_heads = 2;
    mc.ffn_size = 384;
    mc.max_seq_len = T;
    llmt_model *model = NULL;
    CHECK(llmt_model_create(&model, ctx, &mc));

    /* AdamW with warmup and cosine decay. */
    llmt_optimizer_config oc = LLMT_OPTIMIZER_CONFIG_INIT;
    oc.lr = 3e-3;
    oc.schedule = LLMT_SCHEDULE_COSINE;
    oc.warmup_steps = 10;
    oc.total_steps = steps;
    llmt_optimizer *opt = NULL;
    CHECK(llmt_optimizer_create(&opt, model, &oc));

    /* Windows of T + 1 tokens from the shards, shuffled per epoch. */
    llmt_loader_config lc = LLMT_LOADER_CONFIG_INIT;
    lc.batch_size = B;
    lc.seq_len = T;
    lc.vocab_size = mc.vocab_size;
    llmt_loader *data = NULL;
    CHECK(llmt_loader_open_glob(&data, ctx, argv[1], &lc));

    static int32_t tokens[B * T], targets[B * T];
    for (int step = 1; step <= steps; step++) {
        double loss = 0;
        llmt_update_report r = LLMT_UPDATE_REPORT_INIT;
        CHECK(llmt_loader_next(data, tokens, targets, B * T));
        CHECK(llmt_model_zero_grads(model));
        CHECK(llmt_model_forward_backward(model, tokens, targets, B, T, 1.0, 0.0, &loss));
        CHECK(llmt_optimizer_step(opt, NULL, &r));
        if (step % 10 == 0 || step == steps)
            printf("step %4d  loss %.4f  grad norm %.3f  lr %.2e\n", step, loss, r.grad_norm, r.lr);
    }

    llmt_memory_stats ms = LLMT_MEMORY_STATS_INIT;
    CHECK(llmt_context_memory_stats(ctx, &ms));
    printf("memory: params %.1f MiB, grads %.1f, optimizer %.1f, activations %.1f (peak %.1f MiB)\n",
           ms.current[LLMT_MEM_PARAMS] / 1048576.0, ms.current[LLMT_MEM_GRADS] / 1048576.0,
           ms.current[LLMT_MEM_OPTIMIZER] / 1048576.0,
           ms.current[LLMT_MEM_ACTIVATIONS] / 1048576.0, ms.total_peak / 1048576.0);
    CHECK(llmt_model_save_safetensors(model, "train_minimal.safetensors", LLMT_DTYPE_BF16));
    printf("weights saved to train_minimal.safetensors (bf16, Hugging Face names)\n");

    llmt_loader_free(data);
    llmt_optimizer_free(opt);
    llmt_model_free(model);
    llmt_context_free(ctx);
    return 0;
}
