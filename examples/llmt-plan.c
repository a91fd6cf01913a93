/* llmt-plan: what a configuration needs per memory category, before
 * anything is allocated, for each precision mode and recompute policy.
 *
 *   llmt-plan --preset llama-7b [--seq 2048] [--micro-batch 1]
 *   llmt-plan --config run.yaml [--budget 24GiB] [--precision bf16_mixed]
 *   llmt-plan --preset llama-13b --world 8 [--rank 3] [--reduce fast]
 *   llmt-plan --preset llama-7b --backend cuda --offload optimizer+grads [--offload-layers 16]
 *   llmt-plan --preset llama-7b --offload optimizer+grads --budget 24GiB --host-budget 96GiB
 *   llmt-plan --help | --version
 *
 * The plan is for a backend (--backend cpu by default), whose ops keep
 * different attention state and scratch; it is arithmetic, so no context is
 * made and no device is opened (a CUDA plan needs the CUDA plugin, not a
 * GPU). With --world N the bytes are one rank's of a data-parallel run with
 * the ZeRO-1 sharded optimizer (the largest rank, or --rank). With --offload
 * optimizer the AdamW state (of the first --offload-layers; with --world,
 * of the part of the rank's range among them) is planned in host memory,
 * with --offload optimizer+grads their gradients too (every rank's whole
 * gradient's prefix with --world, which on CUDA a rank of llmt-train's
 * step sends from the device and keeps no host copy of when it adds no two
 * micro-batches before an exchange, --reduce): the peak column is device
 * bytes, the host column host bytes (llmt_plan's host_peak), which
 * --host-budget limits in the fit. Exit status: 0, 1 when
 * planning fails or nothing fits --budget, 2 for a usage error. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <llmt/llmt.h>

#include "cli_args.h"

#define PROG "llmt-plan"

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
#define NUM_PRESETS (sizeof presets / sizeof presets[0])

/* Indexed by llmt_precision; also the order of the budget search, most
 * exact first. */
static const char *const precision_names[] = {"fp32", "bf16_mixed", "fp16_mixed", "bf16_pure"};
#define NUM_PRECISIONS 4

static const int32_t policies[] = {
    LLMT_RECOMPUTE_NONE, LLMT_RECOMPUTE_FFN_ACT, LLMT_RECOMPUTE_ATTN_CORE,
    LLMT_RECOMPUTE_ATTN_CORE | LLMT_RECOMPUTE_FFN_ACT, LLMT_RECOMPUTE_ATTN_CORE | LLMT_RECOMPUTE_FFN,
    LLMT_RECOMPUTE_FULL};

static void usage(FILE *f)
{
    fprintf(f,
            "usage: " PROG " (--preset NAME | --config FILE) [--seq N] [--micro-batch N]\n"
            "                 [--threads N] [--backend cpu|cuda] [--precision NAME]\n"
            "                 [--budget BYTES] [--world N [--rank R] [--reduce MODE]]\n"
            "                 [--offload none|optimizer|optimizer+grads\n"
            "                  [--offload-layers all|K] [--host-budget BYTES]]\n"
            "       " PROG " --help | --version\n"
            "Prints the bytes a training step needs per memory category, for every\n"
            "precision and recompute policy, without allocating anything or opening a\n"
            "device (a cuda plan needs the CUDA plugin, not a GPU): peak is the device's\n"
            "(every category at once), host the offloaded state's in host memory.\n"
            "  --preset NAME      llama-7b, llama-13b, 134m or small (--seq sets max_seq_len)\n"
            "  --config FILE      a training configuration (docs/config.md)\n"
            "  --seq N            tokens per sequence (default 2048, or the config's)\n"
            "  --micro-batch N    sequences per step (default 1, or the config's)\n"
            "  --threads N        host threads, 1..1024 (default 1)\n"
            "  --backend NAME     cpu (default) or cuda\n"
            "  --precision NAME   fp32, bf16_mixed, fp16_mixed or bf16_pure: plan only it\n"
            "  --budget BYTES     also find what fits: 24GiB, 512MiB, 1000000 (units KiB,\n"
            "                     MiB, GiB, TiB, KB, MB, GB, TB); the largest micro-batch\n"
            "                     (halving from --micro-batch) with the lightest recompute,\n"
            "                     for the most exact precision that fits (fp32, bf16_mixed,\n"
            "                     fp16_mixed, bf16_pure), unless --precision pins it\n"
            "  --world N          plan one rank of N (1..65536) in a data-parallel run with\n"
            "                     the ZeRO-1 sharded optimizer: bytes and --budget per rank,\n"
            "                     for the rank with the largest peak; the global batch\n"
            "                     is N micro-batches (or the config's batch_size)\n"
            "  --rank R           with --world: plan rank R (0..N-1) instead\n"
            "  --reduce MODE      with --world: deterministic (default, or the config's\n"
            "                     dist.reduce) or fast; on cuda, with optimizer+grads, a\n"
            "                     rank that adds no two micro-batches before an exchange\n"
            "                     (deterministic, or fast at most one a rank) sends the\n"
            "                     offloaded gradients from the device and keeps no host\n"
            "                     copy of them (but a tied embedding's)\n"
            "  --offload PARTS    none (default, or the config's optimizer.offload),\n"
            "                     optimizer: AdamW's moments and master weights in host\n"
            "                     memory, or optimizer+grads: their gradients too (the\n"
            "                     device keeps one layer's at a time); with --budget,\n"
            "                     offload joins the fit's ladder after recompute, before\n"
            "                     the micro-batch halves; with --world, each rank\n"
            "                     offloads the state of the part of its range in the\n"
            "                     offloaded layers (and all their gradients)\n"
            "  --offload-layers L with --offload optimizer or optimizer+grads: all\n"
            "                     (default) or K, 0..layers: the embedding and layers\n"
            "                     0..K-1 only\n"
            "  --host-budget BYTES with --budget and an offload: the host memory the\n"
            "                     offloaded state may take (as the context's host budget,\n"
            "                     same units; 0: none; default: the config's\n"
            "                     memory.host_budget, though --budget never comes from\n"
            "                     the config); the fit offloads only what it holds and\n"
            "                     halves the micro-batch when that is not enough; with\n"
            "                     --world, per rank (the rank holding the most)\n"
            "Exit status: 0; 1 when planning fails or nothing fits the budget; 2 for a\n"
            "usage error.\n");
}

/* Prints a usage error naming the option and its value; returns 2. */
static int bad_value(const char *option, const char *value, const char *why)
{
    fprintf(stderr, PROG ": %s %s: %s\nTry '" PROG " --help'.\n", option, value, why);
    return 2;
}

static double gib(uint64_t b)
{
    return (double)b / 1073741824.0;
}

/* Parses the byte count of option with the configuration's rules
 * (memory.budget), 0 bytes only when allow_zero: 0 on success, else prints
 * why, naming the option and value, and returns 2. */
static int parse_budget(const char *option, const char *text, int allow_zero, uint64_t *out)
{
    static const char key[] = "memory.budget";
    llmt_train_config c;
    llmt_train_config_init(&c);
    if (llmt_train_config_set(&c, key, text)) {
        /* The library's message names the key ("memory.budget: 'x' is not
         * ..."); say the option instead. */
        const char *why = llmt_error_last();
        if (!strncmp(why, key, sizeof key - 1) && !strncmp(why + sizeof key - 1, ": ", 2))
            why += sizeof key + 1;
        return bad_value(option, text, why);
    }
    if (c.memory_budget == 0 && !allow_zero)
        return bad_value(option, text, "must be more than 0 bytes");
    *out = c.memory_budget;
    return 0;
}

/* The index of name in names[0..n), or -1. */
static int find_name(const char *const *names, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(names[i], name))
            return (int)i;
    return -1;
}

/* Prints the table of every (precision, policy) for precisions
 * [first, last]; returns 0 or 1 after printing the library's error. */
static int print_table(int32_t backend, int32_t threads, llmt_plan_config pc, int first, int last)
{
    printf("%-11s %-18s %9s %9s %9s %11s %9s %9s %9s   (GiB)\n", "precision", "recompute",
           "params", "grads", "optimizer", "activations", "workspace", "peak", "host");
    for (int prec = first; prec <= last; prec++)
        for (size_t k = 0; k < sizeof policies / sizeof policies[0]; k++) {
            pc.model.precision = prec;
            pc.recompute = policies[k];
            llmt_plan p = LLMT_PLAN_INIT;
            if (llmt_plan_compute_backend(backend, threads, &pc, &p)) {
                fprintf(stderr, PROG ": %s\n", llmt_error_last());
                return 1;
            }
            printf("%-11s %-18s %9.2f %9.2f %9.2f %11.2f %9.2f %9.2f %9.2f\n",
                   precision_names[prec], llmt_recompute_policy_name(policies[k]),
                   gib(p.bytes[LLMT_MEM_PARAMS]), gib(p.bytes[LLMT_MEM_GRADS]),
                   gib(p.bytes[LLMT_MEM_OPTIMIZER]), gib(p.bytes[LLMT_MEM_ACTIVATIONS]),
                   gib(p.bytes[LLMT_MEM_WORKSPACE]), gib(p.peak), gib(p.host_peak));
            if (prec == first && k == 0)
                printf("%-30s (%lld parameters)\n", "", (long long)p.num_params);
        }
    return 0;
}

/* Plans pc's rank `rank` with offload parts `parts` instead of pc's into
 * *out; 0, or 1 after printing why. */
static int plan_rank_with(int32_t backend, int32_t threads, const llmt_plan_config *pc,
                          int32_t parts, int32_t rank, llmt_plan *out)
{
    llmt_plan_config c = *pc;
    c.offload_parts = parts;
    c.rank = rank;
    if (llmt_plan_compute_backend(backend, threads, &c, out)) {
        fprintf(stderr, PROG ": %s\n", llmt_error_last());
        return 1;
    }
    return 0;
}

/* Prints which rank of how many the plans are for, the range of the
 * parameters whose optimizer state it holds and, with offload, the part of
 * it whose state is in host memory: the elements its OPTIMIZER bytes lose
 * against the same rank without offload (both keep the same bytes per
 * element); with the gradients, those every rank keeps in host memory: the
 * host bytes the state alone does not hold. Returns 0 or 1 after printing
 * the library's error. */
static int print_world(int32_t backend, int32_t threads, const llmt_plan_config *pc)
{
    llmt_plan p = LLMT_PLAN_INIT;
    if (llmt_plan_compute_backend(backend, threads, pc, &p)) {
        fprintf(stderr, PROG ": %s\n", llmt_error_last());
        return 1;
    }
    const int64_t first = p.shard_first, end = p.shard_end, owned = end - first;
    printf("per rank, %d ranks (ZeRO-1): rank %d%s holds AdamW state for parameters [%lld, "
           "%lld) (%lld)\n", pc->world_size, p.rank, pc->rank < 0 ? ", the largest," : "",
           (long long)first, (long long)end, (long long)owned);
    if (pc->offload_parts == LLMT_OFFLOAD_NONE)
        return 0;
    llmt_plan whole = LLMT_PLAN_INIT;
    if (plan_rank_with(backend, threads, pc, LLMT_OFFLOAD_NONE, p.rank, &whole))
        return 1;
    const uint64_t all = whole.bytes[LLMT_MEM_OPTIMIZER], kept = p.bytes[LLMT_MEM_OPTIMIZER];
    const uint64_t per_param = owned ? all / (uint64_t)owned : 0;
    const int64_t split = first + (per_param ? (int64_t)((all - kept) / per_param) : 0);
    printf("offloaded on rank %d: the state of [%lld, %lld) (%lld) in host memory, of [%lld, "
           "%lld) (%lld) on the device\n", p.rank, (long long)first, (long long)split,
           (long long)(split - first), (long long)split, (long long)end,
           (long long)(end - split));
    if (!(pc->offload_parts & LLMT_OFFLOAD_GRADS))
        return 0;
    /* The gradients' host bytes: what the state alone does not hold; the
     * offloaded ones: the same in one process, which keeps them all. */
    llmt_plan s = LLMT_PLAN_INIT, one = LLMT_PLAN_INIT, one_s = LLMT_PLAN_INIT;
    llmt_plan_config single = *pc; /* one process, no ordered sum beside the gradients */
    single.world_size = 0, single.rank = -1, single.ordered_accumulation = 0;
    if (plan_rank_with(backend, threads, pc, LLMT_OFFLOAD_OPTIMIZER, p.rank, &s) ||
        plan_rank_with(backend, threads, &single, pc->offload_parts, -1, &one) ||
        plan_rank_with(backend, threads, &single, LLMT_OFFLOAD_OPTIMIZER, -1, &one_s))
        return 1;
    const uint64_t elem = p.bytes[LLMT_MEM_PARAMS] / (uint64_t)p.num_params;
    const long long gs = (long long)((one.host_peak - one_s.host_peak) / elem);
    const long long home = (long long)((p.host_peak - s.host_peak) / elem);
    if (gs == 0)
        printf("offloaded on every rank: no gradients (the offloaded prefix holds no whole "
               "4096-element granule)\n");
    else if (home == gs)
        printf("offloaded on every rank: the gradients of [0, %lld) (%lld) in host memory, the "
               "rest and one layer's bucket on the device\n", gs, gs);
    else
        printf("offloaded on every rank: the gradients of [0, %lld) (%lld), sent to their owners "
               "from the device's bucket as backward ends each layer; in host memory on rank "
               "%d: %lld of them%s\n", gs, gs, p.rank, home,
               home ? " (a tied embedding's, written in the forward)" : "");
    return 0;
}

/* Prints ", the optimizer's state offloaded" for parts and layers
 * (llmt_plan_config's offload_parts, not NONE, and offload_layers). */
static void print_offload(int32_t parts, int32_t layers)
{
    const char *what = parts & LLMT_OFFLOAD_GRADS ? "the optimizer's state and gradients"
                                                   : "the optimizer's state";
    if (layers == LLMT_OFFLOAD_ALL_LAYERS)
        printf(", all of %s offloaded", what);
    else if (layers == 0)
        printf(", none of %s offloaded (--offload-layers 0)", what);
    else
        printf(", %s of the embedding and layers 0-%d offloaded", what, layers - 1);
}

/* Parses --offload-layers: "all" or a decimal count 0..layers; 0 on
 * success, else prints why and returns 2. */
static int parse_offload_layers(const char *text, int32_t layers, int32_t *out)
{
    if (!strcmp(text, "all")) {
        *out = LLMT_OFFLOAD_ALL_LAYERS;
        return 0;
    }
    char *end = NULL;
    errno = 0;
    long long k = text[0] >= '0' && text[0] <= '9' ? strtoll(text, &end, 10) : -1;
    if (k < 0 || errno || *end || k > layers) {
        char why[96];
        snprintf(why, sizeof why, "not all or a layer count 0..%d (the model's layers)", layers);
        return bad_value("--offload-layers", text, why);
    }
    *out = (int32_t)k;
    return 0;
}

/* Plans c into *p; with --world and no --rank, p->host_peak is the most
 * host bytes of any rank (the fit's host check), not the planned rank's
 * (the one with the largest device peak, which holds the least offloaded
 * state). 0, or 1 with the library's message on stderr. */
static int plan_most_host(int32_t backend, int32_t threads, llmt_plan_config c, llmt_plan *p)
{
    int32_t ranks = c.world_size > 0 && c.rank < 0 ? c.world_size : 0;
    int rc = llmt_plan_compute_backend(backend, threads, &c, p);
    for (int32_t r = 0; r < ranks && !rc; r++) {
        llmt_plan one = LLMT_PLAN_INIT;
        c.rank = r;
        rc = llmt_plan_compute_backend(backend, threads, &c, &one);
        p->host_peak = one.host_peak > p->host_peak ? one.host_peak : p->host_peak;
    }
    if (rc)
        fprintf(stderr, PROG ": %s\n", llmt_error_last());
    return rc ? 1 : 0;
}

/* Fits the budget for each precision of [first, last] in turn, printing a
 * line for each, until one fits; returns 0 when one does, 1 when none does
 * or planning fails. With pc.offload_parts set, the fit places the offload
 * (llmt_plan_fit_offload) unless fixed_layers pins pc.offload_layers. */
static int print_fit(int32_t backend, int32_t threads, llmt_plan_config pc, uint64_t budget,
                     int first, int last, int fixed_layers)
{
    char label[96];
    int n = snprintf(label, sizeof label, "budget %.2f GiB%s", gib(budget),
                     pc.world_size ? " per rank" : "");
    if (pc.host_budget && n > 0 && (size_t)n < sizeof label)
        snprintf(label + n, sizeof label - (size_t)n, ", host %.2f GiB", gib(pc.host_budget));
    /* Whose host bytes plan_most_host gives. */
    const char *whose = pc.world_size && pc.rank < 0 ? " on the rank holding the most" : "";
    pc.recompute = LLMT_RECOMPUTE_NONE;
    for (int prec = first; prec <= last; prec++) {
        pc.model.precision = prec;
        int32_t b = 0, r = 0, k = pc.offload_parts ? pc.offload_layers : 0;
        int rc = fixed_layers
                     ? llmt_plan_fit_backend(backend, threads, &pc, budget, &b, &r)
                     : llmt_plan_fit_offload_backend(backend, threads, &pc, budget, &b, &r, &k);
        if (rc == LLMT_OK) {
            printf("%s: %s, micro-batch %d with recompute %s", label, precision_names[prec], b,
                   llmt_recompute_policy_name(r));
            if (k != 0) {
                llmt_plan_config chosen = pc;
                llmt_plan p = LLMT_PLAN_INIT;
                chosen.micro_batch = b, chosen.recompute = r, chosen.offload_layers = k;
                chosen.model.precision = prec;
                if (plan_most_host(backend, threads, chosen, &p))
                    return 1;
                print_offload(pc.offload_parts, k);
                printf(" (host %.2f GiB%s)", gib(p.host_peak), whose);
            }
            printf(" fits\n");
            return 0;
        }
        /* Nothing fits: the smallest plan, micro-batch 1 with full recompute
         * (and everything offloaded, if offload may be used). */
        llmt_plan_config smallest = pc;
        smallest.micro_batch = 1;
        smallest.recompute = LLMT_RECOMPUTE_FULL;
        smallest.offload_layers = fixed_layers ? pc.offload_layers : LLMT_OFFLOAD_ALL_LAYERS;
        llmt_plan p = LLMT_PLAN_INIT;
        if (rc != LLMT_ENOMEM) {
            fprintf(stderr, PROG ": %s\n", llmt_error_last());
            return 1;
        }
        if (plan_most_host(backend, threads, smallest, &p))
            return 1;
        printf("%s: %s does not fit: micro-batch 1 with full recompute%s needs %.2f GiB", label,
               precision_names[prec],
               !pc.offload_parts ? ""
               : smallest.offload_layers != LLMT_OFFLOAD_ALL_LAYERS ? " and the given offload"
               : pc.offload_parts & LLMT_OFFLOAD_GRADS
                   ? " and all of the optimizer and gradients offloaded"
                   : " and all of the optimizer offloaded",
               gib(p.peak));
        if (pc.host_budget)
            printf(" and %.2f GiB of host memory%s", gib(p.host_peak), whose);
        printf("\n");
    }
    printf("%s: nothing fits\n", label);
    return 1;
}

int main(int argc, char **argv)
{
    const char *preset_name = NULL, *config_path = NULL, *backend_name = "cpu";
    const char *precision_name = NULL, *budget_text = NULL;
    const char *offload_name = NULL, *offload_layers_text = NULL, *host_budget_text = NULL;
    const char *reduce_name = NULL;
    int64_t seq = 2048, micro = 1, threads = 1, world = 0, rank = -1;
    cli_option opts[] = {
        CLI_OPT_STRING("--preset", &preset_name),
        CLI_OPT_STRING("--config", &config_path),
        CLI_OPT_INT64("--seq", &seq, 1, INT32_MAX),
        CLI_OPT_INT64("--micro-batch", &micro, 1, INT32_MAX),
        CLI_OPT_INT64("--threads", &threads, 1, 1024),
        CLI_OPT_STRING("--backend", &backend_name),
        CLI_OPT_STRING("--precision", &precision_name),
        CLI_OPT_STRING("--budget", &budget_text),
        CLI_OPT_INT64("--world", &world, 1, LLMT_PLAN_MAX_WORLD),
        CLI_OPT_INT64("--rank", &rank, 0, LLMT_PLAN_MAX_WORLD - 1),
        CLI_OPT_STRING("--reduce", &reduce_name),
        CLI_OPT_STRING("--offload", &offload_name),
        CLI_OPT_STRING("--offload-layers", &offload_layers_text),
        CLI_OPT_STRING("--host-budget", &host_budget_text),
    };
    static const char *const exclusive[][2] = {{"--preset", "--config"}};
    cli_spec spec = {PROG, usage, opts, sizeof opts / sizeof *opts, exclusive, 1, 0};
    int npos = 0, parsed = cli_parse(&spec, argc, argv, &npos);
    if (parsed != CLI_OK)
        return parsed == CLI_DONE ? 0 : 2;
    if (!preset_name && !config_path) {
        fprintf(stderr, PROG ": give --preset NAME or --config FILE\nTry '" PROG " --help'.\n");
        return 2;
    }

    int32_t backend;
    if (!strcmp(backend_name, "cpu"))
        backend = LLMT_BACKEND_CPU;
    else if (!strcmp(backend_name, "cuda"))
        backend = LLMT_BACKEND_CUDA;
    else
        return bad_value("--backend", backend_name, "not a backend (cpu or cuda)");
    int first = 0, last = NUM_PRECISIONS - 1;
    if (precision_name) {
        first = last = find_name(precision_names, NUM_PRECISIONS, precision_name);
        if (first < 0)
            return bad_value("--precision", precision_name,
                             "not a precision (fp32, bf16_mixed, fp16_mixed or bf16_pure)");
    }
    uint64_t budget = 0;
    if (budget_text && parse_budget("--budget", budget_text, 0, &budget))
        return 2;
    if (host_budget_text && !budget_text)
        return bad_value("--host-budget", host_budget_text,
                         "needs --budget (it limits what the fit offloads)");
    uint64_t host_budget = 0;
    if (host_budget_text && parse_budget("--host-budget", host_budget_text, 1, &host_budget))
        return 2;
    /* The accepted values of --offload and their llmt_offload_part bits. */
    static const char *const offload_names[] = {"none", "optimizer", "optimizer+grads"};
    static const int32_t offload_parts[] = {LLMT_OFFLOAD_NONE, LLMT_OFFLOAD_OPTIMIZER,
                                            LLMT_OFFLOAD_OPTIMIZER | LLMT_OFFLOAD_GRADS};
    int offload = offload_name ? find_name(offload_names, 3, offload_name) : -1;
    if (offload_name && !strcmp(offload_name, "grads"))
        return bad_value("--offload", offload_name,
                         "gradient offload needs the optimizer's too (the host AdamW reads the "
                         "offloaded gradients): use optimizer+grads");
    if (offload_name && offload < 0)
        return bad_value("--offload", offload_name,
                         "not an offload (none, optimizer or optimizer+grads)");
    if (rank >= 0 && (world == 0 || rank >= world)) {
        char value[24], why[64];
        snprintf(value, sizeof value, "%lld", (long long)rank);
        if (world)
            snprintf(why, sizeof why, "not a rank of --world %lld (0..%lld)", (long long)world,
                     (long long)world - 1);
        else
            snprintf(why, sizeof why, "needs --world N");
        return bad_value("--rank", value, why);
    }
    static const char *const reduce_names[] = {"deterministic", "fast"}; /* llmt_reduce_mode */
    int reduce = reduce_name ? find_name(reduce_names, 2, reduce_name) : -1;
    if (reduce_name && reduce < 0)
        return bad_value("--reduce", reduce_name, "not a reduce mode (deterministic or fast)");
    if (reduce_name && world == 0)
        return bad_value("--reduce", reduce_name, "needs --world N");

    llmt_plan_config pc = LLMT_PLAN_CONFIG_INIT;
    if (config_path) {
        llmt_train_config cfg;
        llmt_train_config_init(&cfg);
        if (llmt_train_config_load_yaml(&cfg, config_path)) {
            fprintf(stderr, PROG ": %s\n", llmt_error_last());
            return 1;
        }
        pc.model = cfg.model;
        if (cli_given(&spec, "--seq") && seq > cfg.model.max_seq_len) {
            char value[24], why[96];
            snprintf(value, sizeof value, "%lld", (long long)seq);
            snprintf(why, sizeof why, "more than the configuration's model.max_seq_len, %d",
                     (int)cfg.model.max_seq_len);
            return bad_value("--seq", value, why);
        }
        seq = cli_given(&spec, "--seq") ? seq : cfg.seq_len;
        micro = cli_given(&spec, "--micro-batch") ? micro : cfg.micro_batch;
        /* The configuration's global batch and accumulation (an ordered
         * slicer's gradient sum, counted without --world). */
        pc.batch_size = cfg.batch_size > micro ? cfg.batch_size : (int32_t)micro;
        pc.ordered_accumulation = cfg.accumulation == LLMT_ACCUMULATE_ORDERED;
        pc.offload_parts = cfg.optimizer.offload_parts;
        pc.offload_layers = cfg.optimizer.offload_layers;
        pc.reduce_mode = cfg.dist_reduce;
        if (!host_budget_text)
            host_budget = cfg.memory_host_budget;
    } else {
        const char *names[NUM_PRESETS];
        for (size_t i = 0; i < NUM_PRESETS; i++)
            names[i] = presets[i].name;
        int i = find_name(names, NUM_PRESETS, preset_name);
        if (i < 0)
            return bad_value("--preset", preset_name,
                             "not a preset (llama-7b, llama-13b, 134m or small)");
        const preset *p = &presets[i];
        pc.model.vocab_size = p->vocab, pc.model.hidden_size = p->hidden;
        pc.model.num_layers = p->layers, pc.model.num_heads = p->heads;
        pc.model.num_kv_heads = p->kv_heads, pc.model.ffn_size = p->ffn;
        pc.model.rms_norm_eps = 1e-6f;
        pc.model.max_seq_len = (int32_t)seq;
    }
    if (offload >= 0) {
        pc.offload_parts = offload_parts[offload];
        pc.offload_layers = LLMT_OFFLOAD_ALL_LAYERS;
    }
    if (offload_layers_text && pc.offload_parts == LLMT_OFFLOAD_NONE)
        return bad_value("--offload-layers", offload_layers_text,
                         "needs --offload optimizer or optimizer+grads");
    if (offload_layers_text &&
        parse_offload_layers(offload_layers_text, pc.model.num_layers, &pc.offload_layers))
        return 2;
    if (host_budget_text && host_budget && pc.offload_parts == LLMT_OFFLOAD_NONE)
        return bad_value("--host-budget", host_budget_text,
                         "needs --offload optimizer or optimizer+grads (or the config's "
                         "optimizer.offload): nothing else is planned in host memory");
    /* Nothing offloaded, nothing for a host budget (a config's) to limit. */
    pc.host_budget = pc.offload_parts != LLMT_OFFLOAD_NONE ? host_budget : 0;
    pc.micro_batch = (int32_t)micro;
    pc.seq_len = (int32_t)seq;
    pc.world_size = (int32_t)world;
    pc.rank = (int32_t)rank;
    if (reduce >= 0)
        pc.reduce_mode = reduce;
    if (!config_path && world) /* a micro-batch a rank */
        pc.batch_size = (int32_t)(micro * world < INT32_MAX ? micro * world : INT32_MAX);

    const llmt_model_config *m = &pc.model;
    printf("model: vocab %d, hidden %d, layers %d, heads %d/%d kv, ffn %d; micro-batch %d x seq "
           "%d; %s backend, %d thread(s); AdamW state included",
           m->vocab_size, m->hidden_size, m->num_layers, m->num_heads, m->num_kv_heads,
           m->ffn_size, pc.micro_batch, pc.seq_len, backend_name, (int)threads);
    if (pc.offload_parts != LLMT_OFFLOAD_NONE)
        print_offload(pc.offload_parts, pc.offload_layers);
    printf("\n");
    if (world && print_world(backend, (int32_t)threads, &pc))
        return 1;
    if (print_table(backend, (int32_t)threads, pc, first, last))
        return 1;
    /* A placement given (--offload-layers, or the config's offload_layers
     * when the command line does not override the config) stays as it is
     * in the fit; --offload optimizer[+grads] alone lets the fit choose, and
     * so does a config's optimizer+grads of 0 layers (the owner's leave to
     * the controller, as the trainer reads it). */
    int config_leave = (pc.offload_parts & LLMT_OFFLOAD_GRADS) && pc.offload_layers == 0;
    int fixed = offload_layers_text != NULL ||
                (offload < 0 && pc.offload_parts && !config_leave &&
                 pc.offload_layers != LLMT_OFFLOAD_ALL_LAYERS);
    return budget ? print_fit(backend, (int32_t)threads, pc, budget, first, last, fixed) : 0;
}
