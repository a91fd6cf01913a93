/* llmt-plan: what a configuration needs per memory category, before
 * anything is allocated, for each precision mode and recompute policy.
 *
 *   llmt-plan --preset llama-7b [--seq 2048] [--micro-batch 1]
 *   llmt-plan --config run.yaml [--budget 24GiB]
 *
 * The plan is for the backend of the context it creates (--backend cpu by
 * default; cuda needs a GPU): backends keep different attention state. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <llmt/llmt.h>

typedef struct preset {
    const char *name;
    int32_t vocab, hidden, layers, heads, kv_heads, ffn;
} preset;

/* Hugging Face sizes of the LLaMA family, and the benchmark configurations. */
static const preset presets[] = {
    {"llama-7b", 32000, 4096, 32, 32, 32, 11008},
    {"llama-13b", 32000, 5120, 40, 40, 40, 13824},
    {"134m", 32000, 768, 12, 12, 12, 2048},
    {"small", 8192, 512, 8, 8, 8, 1408},
};

static const char *const precision_names[4] = {"fp32", "bf16_mixed", "fp16_mixed", "bf16_pure"};
static const int32_t policies[] = {
    LLMT_RECOMPUTE_NONE, LLMT_RECOMPUTE_FFN_ACT, LLMT_RECOMPUTE_ATTN_CORE,
    LLMT_RECOMPUTE_ATTN_CORE | LLMT_RECOMPUTE_FFN_ACT, LLMT_RECOMPUTE_ATTN_CORE | LLMT_RECOMPUTE_FFN,
    LLMT_RECOMPUTE_FULL};

static void usage(void)
{
    fprintf(stderr,
            "usage: llmt-plan (--preset NAME | --config FILE) [--seq N] [--micro-batch N]\n"
            "                 [--threads N] [--backend cpu|cuda] [--budget BYTES]\n"
            "presets: llama-7b, llama-13b, 134m, small\n");
}

static double gib(uint64_t b)
{
    return (double)b / 1073741824.0;
}

/* Parses "24GiB", "512MiB", "1000000" through the YAML config's byte rules. */
static int parse_budget(const char *text, uint64_t *out)
{
    llmt_train_config c;
    llmt_train_config_init(&c);
    char yaml[256];
    snprintf(yaml, sizeof yaml, "memory:\n  budget: %s\n", text);
    if (llmt_train_config_parse_yaml(&c, yaml, strlen(yaml), "--budget"))
        return -1;
    *out = c.memory_budget;
    return 0;
}

int main(int argc, char **argv)
{
    llmt_train_config cfg;
    llmt_train_config_init(&cfg);
    const char *preset_name = NULL, *config_path = NULL;
    int32_t seq = 2048, micro = 1, threads = 1, backend = LLMT_BACKEND_CPU;
    int seq_given = 0, micro_given = 0;
    uint64_t budget = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            usage();
            return 2;
        }
        if (!strcmp(a, "--preset")) preset_name = v;
        else if (!strcmp(a, "--config")) config_path = v;
        else if (!strcmp(a, "--seq")) seq = atoi(v), seq_given = 1;
        else if (!strcmp(a, "--micro-batch")) micro = atoi(v), micro_given = 1;
        else if (!strcmp(a, "--threads")) threads = atoi(v);
        else if (!strcmp(a, "--backend")) backend = strcmp(v, "cuda") == 0 ? LLMT_BACKEND_CUDA : LLMT_BACKEND_CPU;
        else if (!strcmp(a, "--budget")) {
            if (parse_budget(v, &budget)) {
                fprintf(stderr, "llmt-plan: %s\n", llmt_error_last());
                return 2;
            }
        } else {
            usage();
            return 2;
        }
        i++;
    }
    llmt_model_config model;
    llmt_model_config_init(&model);
    if (config_path) {
        if (llmt_train_config_load_yaml(&cfg, config_path)) {
            fprintf(stderr, "llmt-plan: %s\n", llmt_error_last());
            return 1;
        }
        model = cfg.model;
        seq = seq_given ? seq : cfg.seq_len;
        micro = micro_given ? micro : cfg.micro_batch;
    } else if (preset_name) {
        const preset *p = NULL;
        for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
            if (!strcmp(presets[i].name, preset_name))
                p = &presets[i];
        if (!p) {
            usage();
            return 2;
        }
        model.vocab_size = p->vocab, model.hidden_size = p->hidden, model.num_layers = p->layers;
        model.num_heads = p->heads, model.num_kv_heads = p->kv_heads, model.ffn_size = p->ffn;
        model.rms_norm_eps = 1e-6f;
        model.max_seq_len = seq;
    } else {
        usage();
        return 2;
    }

    llmt_context_config cc = LLMT_CONTEXT_CONFIG_INIT;
    cc.num_threads = threads;
    cc.backend = backend;
    llmt_context *ctx = NULL;
    if (llmt_context_create(&ctx, &cc)) {
        fprintf(stderr, "llmt-plan: %s\n", llmt_error_last());
        return 1;
    }
    llmt_plan_config pc = LLMT_PLAN_CONFIG_INIT;
    pc.model = model;
    pc.micro_batch = micro;
    pc.seq_len = seq;
    printf("model: vocab %d, hidden %d, layers %d, heads %d/%d kv, ffn %d; micro-batch %d x seq "
           "%d; %s backend, %d thread(s); AdamW state included\n",
           model.vocab_size, model.hidden_size, model.num_layers, model.num_heads,
           model.num_kv_heads, model.ffn_size, micro, seq, backend == LLMT_BACKEND_CUDA ? "cuda" : "cpu",
           threads);
    printf("%-11s %-18s %9s %9s %9s %11s %9s %9s   (GiB)\n", "precision", "recompute", "params",
           "grads", "optimizer", "activations", "workspace", "peak");
    int status = 0;
    for (int32_t prec = 0; prec < 4 && !status; prec++)
        for (size_t k = 0; k < sizeof policies / sizeof policies[0]; k++) {
            pc.model.precision = prec;
            pc.recompute = policies[k];
            llmt_plan p = LLMT_PLAN_INIT;
            if (llmt_plan_compute(ctx, &pc, &p)) {
                fprintf(stderr, "llmt-plan: %s\n", llmt_error_last());
                status = 1;
                break;
            }
            printf("%-11s %-18s %9.2f %9.2f %9.2f %11.2f %9.2f %9.2f\n", precision_names[prec],
                   llmt_recompute_policy_name(policies[k]), gib(p.bytes[LLMT_MEM_PARAMS]),
                   gib(p.bytes[LLMT_MEM_GRADS]), gib(p.bytes[LLMT_MEM_OPTIMIZER]),
                   gib(p.bytes[LLMT_MEM_ACTIVATIONS]), gib(p.bytes[LLMT_MEM_WORKSPACE]),
                   gib(p.peak));
            if (prec == 0 && k == 0)
                printf("%-30s (%lld parameters)\n", "", (long long)p.num_params);
        }
    if (!status && budget) {
        pc.model.precision = model.precision;
        pc.recompute = LLMT_RECOMPUTE_NONE;
        int32_t b = 0, r = 0;
        if (llmt_plan_fit(ctx, &pc, budget, &b, &r) == LLMT_OK)
            printf("budget %.2f GiB (%s): micro-batch %d with recompute %s fits\n", gib(budget),
                   precision_names[model.precision], b, llmt_recompute_policy_name(r));
        else
            printf("budget %.2f GiB: %s\n", gib(budget), llmt_error_last());
    }
    llmt_context_free(ctx);
    return status;
}
