/* llmt-ckpt: inspect and convert the checkpoints of one store directory
 * (docs/checkpoint-format.md).
 *
 *   llmt-ckpt verify DIR [--step N]
 *   llmt-ckpt list DIR
 *   llmt-ckpt info DIR --step N [--json]
 *   llmt-ckpt consolidate DIR --step N [--out OUTDIR] [--hf HFDIR [--hf-dtype T]]
 *   llmt-ckpt --help | --version
 *
 * The store is opened read_only: no lock is taken and nothing in DIR is
 * written or cleaned, so a training writing into DIR is not disturbed.
 * Exit status: 0; 1 when a checkpoint is refused or an operation fails;
 * 2 for a usage error. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <llmt/llmt.h>

#include "cli_args.h"

#define PROG "llmt-ckpt"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: " PROG " verify DIR [--step N]\n"
            "       " PROG " list DIR\n"
            "       " PROG " info DIR --step N [--json]\n"
            "       " PROG " consolidate DIR --step N [--out OUTDIR] [--hf HFDIR\n"
            "                 [--hf-dtype f32|bf16|f16]]\n"
            "       " PROG " --help | --version\n"
            "Inspects the checkpoints (step-N directories) of the store directory DIR,\n"
            "opened read-only: no lock, nothing written there, so a training writing into\n"
            "DIR is not disturbed.\n"
            "  verify       checks every checkpoint (or step N) whole: the MANIFEST and\n"
            "               every file's size and checksum; prints OK or why refused\n"
            "  list         one line per checkpoint from its MANIFEST (not verified):\n"
            "               step, tokens seen, format, world size, files and bytes\n"
            "  info         what the MANIFEST of step N says (checksum checked, files\n"
            "               not): step, epoch, tokens, precision, model, world size...;\n"
            "               --json prints one JSON object\n"
            "  consolidate  --out: rewrites sharded step N (format 2, from a data-parallel\n"
            "               run) as OUTDIR/step-N in the single-file layout (format 1);\n"
            "               --hf: writes the weights of step N (any format) as a Hugging\n"
            "               Face directory HFDIR (new or empty), in --hf-dtype (default:\n"
            "               the checkpoint's own weight dtype, so nothing is rounded)\n"
            "Exit status: 0; 1 when a checkpoint is refused (or DIR holds none, for\n"
            "verify) or an operation fails; 2 for a usage error.\n");
}

/* Prints a usage error; returns 2. */
static int usage_error(const char *what)
{
    fprintf(stderr, PROG ": %s\nTry '" PROG " --help'.\n", what);
    return 2;
}

/* Prints the library's last error after what; returns 1. */
static int failed(const char *what)
{
    fprintf(stderr, PROG ": %s%s%s\n", what, what[0] ? ": " : "", llmt_error_last());
    return 1;
}

static const char *precision_name(int32_t p)
{
    static const char *const names[] = {"fp32", "bf16_mixed", "fp16_mixed", "bf16_pure"};
    return p >= 0 && p < 4 ? names[p] : "unknown";
}

/* The steps of the store's checkpoints, ascending, malloc'ed (NULL when
 * none, or on failure: then -1 after printing why). */
static int list_steps(llmt_ckpt_store *store, const char *dir, int64_t **steps, size_t *n)
{
    *steps = NULL;
    *n = 0;
    size_t count = 0;
    if (llmt_ckpt_list(store, LLMT_CKPT_DURABLE, NULL, 0, &count)) {
        failed(dir);
        return -1;
    }
    if (!count)
        return 0;
    /* A writer beside this reader may commit more meanwhile: room for some. */
    size_t cap = count + 16;
    *steps = malloc(cap * sizeof **steps);
    if (!*steps) {
        fprintf(stderr, PROG ": out of memory\n");
        return -1;
    }
    if (llmt_ckpt_list(store, LLMT_CKPT_DURABLE, *steps, cap, n)) {
        free(*steps);
        *steps = NULL;
        failed(dir);
        return -1;
    }
    return 0;
}

/* 0 when the store holds checkpoint step; else -1 after printing which
 * steps it holds. */
static int require_step(llmt_ckpt_store *store, const char *dir, int64_t step)
{
    int64_t *steps;
    size_t n;
    if (list_steps(store, dir, &steps, &n))
        return -1;
    int found = 0;
    for (size_t i = 0; i < n; i++)
        found |= steps[i] == step;
    if (!found) {
        fprintf(stderr, PROG ": %s: no checkpoint of step %lld (steps there:", dir,
                (long long)step);
        for (size_t i = 0; i < n; i++)
            fprintf(stderr, " %lld", (long long)steps[i]);
        fprintf(stderr, "%s)\n", n ? "" : " none");
    }
    free(steps);
    return found ? 0 : -1;
}

/* Verifies one checkpoint, printing its line. Returns 0 OK, 1 refused or
 * not checked, 2 gone meanwhile (rotated away by a writer: not refused). */
static int verify_one(llmt_ckpt_store *store, int64_t step, int skip_gone)
{
    int rc = llmt_ckpt_verify(store, step, LLMT_CKPT_DURABLE);
    if (rc == LLMT_OK) {
        printf("step %lld: OK\n", (long long)step);
        return 0;
    }
    if (rc == LLMT_ENOTFOUND && skip_gone) {
        printf("step %lld: gone (a writer rotated it away meanwhile)\n", (long long)step);
        return 2;
    }
    printf("step %lld: %s: %s\n", (long long)step,
           rc == LLMT_ECORRUPT ? "REFUSED" : "NOT CHECKED", llmt_error_last());
    return 1;
}

static int cmd_verify(llmt_ckpt_store *store, const char *dir, int64_t step)
{
    if (step >= 0)
        return require_step(store, dir, step) ? 1 : verify_one(store, step, 0) ? 1 : 0;
    int64_t *steps;
    size_t n;
    if (list_steps(store, dir, &steps, &n))
        return 1;
    size_t ok = 0, bad = 0;
    for (size_t i = 0; i < n; i++) {
        int r = verify_one(store, steps[i], 1);
        ok += r == 0;
        bad += r == 1;
    }
    free(steps);
    if (bad)
        fprintf(stderr, PROG ": %s: %zu of %zu checkpoints refused or not checked\n", dir, bad,
                ok + bad);
    else if (!ok)
        fprintf(stderr, PROG ": %s: no checkpoint to verify\n", dir);
    return bad || !ok ? 1 : 0;
}

static int cmd_list(llmt_ckpt_store *store, const char *dir)
{
    int64_t *steps;
    size_t n;
    if (list_steps(store, dir, &steps, &n))
        return 1;
    printf("%12s %14s %6s %10s %5s %14s\n", "step", "tokens_seen", "format", "world_size",
           "files", "bytes");
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        llmt_ckpt_info info = {.version = LLMT_CKPT_INFO_VERSION};
        if (llmt_ckpt_get_info(store, steps[i], LLMT_CKPT_DURABLE, &info)) {
            printf("%12lld   %s\n", (long long)steps[i], llmt_error_last());
            rc = 1;
            continue;
        }
        printf("%12lld %14lld %6d %10d %5d %14" PRIu64 "\n", (long long)info.step,
               (long long)info.tokens_seen, info.format_version, info.world_size, info.num_files,
               info.total_bytes);
    }
    free(steps);
    if (rc)
        fprintf(stderr, PROG ": %s: a checkpoint's MANIFEST could not be read\n", dir);
    return rc;
}

/* f as the shortest %.Ng (6 <= N <= 9) that reads back as f. */
static void print_float(float f)
{
    char buf[32];
    for (int digits = 6; digits <= 9; digits++) {
        snprintf(buf, sizeof buf, "%.*g", digits, (double)f);
        if (strtof(buf, NULL) == f)
            break;
    }
    fputs(buf, stdout);
}

/* s as a JSON string. */
static void print_json_string(const char *s)
{
    putchar('"');
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            printf("\\%c", *p);
        else if (*p < 0x20)
            printf("\\u%04x", *p);
        else
            putchar(*p);
    }
    putchar('"');
}

static void print_info_json(const char *path, const llmt_ckpt_info *in)
{
    const llmt_model_config *m = &in->model;
    printf("{\"path\": ");
    print_json_string(path);
    printf(", \"step\": %lld, \"epoch\": %lld, \"tokens_seen\": %lld, \"format_version\": %d, "
           "\"world_size\": %d, \"library_version\": ", (long long)in->step, (long long)in->epoch,
           (long long)in->tokens_seen, in->format_version, in->world_size);
    print_json_string(in->library_version);
    printf(", \"precision\": \"%s\", \"model\": {\"vocab_size\": %d, \"hidden_size\": %d, "
           "\"num_layers\": %d, \"num_heads\": %d, \"num_kv_heads\": %d, \"ffn_size\": %d, "
           "\"max_seq_len\": %d, \"tie_embeddings\": %d, \"rms_norm_eps\": ",
           precision_name(m->precision), m->vocab_size, m->hidden_size, m->num_layers,
           m->num_heads, m->num_kv_heads, m->ffn_size, m->max_seq_len, m->tie_embeddings);
    print_float(m->rms_norm_eps);
    printf(", \"rope_theta\": ");
    print_float(m->rope_theta);
    printf(", \"rope_scaling\": \"%s\"}, \"has_optimizer\": %s, \"optimizer_steps\": %lld, "
           "\"has_scaler\": %s, \"has_data\": %s, \"num_files\": %d, \"total_bytes\": %" PRIu64
           "}\n", m->rope_scaling == LLMT_ROPE_SCALING_LLAMA3 ? "llama3" : "none",
           in->has_optimizer ? "true" : "false", (long long)in->optimizer_steps,
           in->has_scaler ? "true" : "false", in->has_data ? "true" : "false", in->num_files,
           in->total_bytes);
}

static void print_info_text(const char *path, const llmt_ckpt_info *in)
{
    const llmt_model_config *m = &in->model;
    printf("checkpoint       %s\n", path);
    printf("step             %lld\n", (long long)in->step);
    printf("epoch            %lld\n", (long long)in->epoch);
    printf("tokens_seen      %lld\n", (long long)in->tokens_seen);
    printf("format_version   %d (%s)\n", in->format_version,
           in->format_version == 2 ? "sharded" : "single-file");
    printf("world_size       %d\n", in->world_size);
    printf("library_version  %s\n", in->library_version);
    printf("precision        %s\n", precision_name(m->precision));
    printf("model            vocab %d, hidden %d, layers %d, heads %d/%d kv, ffn %d, "
           "max_seq_len %d, tied %d, rms_norm_eps ", m->vocab_size, m->hidden_size,
           m->num_layers, m->num_heads, m->num_kv_heads, m->ffn_size, m->max_seq_len,
           m->tie_embeddings);
    print_float(m->rms_norm_eps);
    printf(", rope_theta ");
    print_float(m->rope_theta);
    printf("%s\n", m->rope_scaling == LLMT_ROPE_SCALING_LLAMA3 ? ", rope_scaling llama3" : "");
    if (in->has_optimizer)
        printf("optimizer        yes, %lld steps\n", (long long)in->optimizer_steps);
    else
        printf("optimizer        no\n");
    printf("loss_scaler      %s\n", in->has_scaler ? "yes" : "no");
    printf("data             %s\n", in->has_data ? "yes" : "no");
    printf("files            %d, %" PRIu64 " bytes\n", in->num_files, in->total_bytes);
}

static int cmd_info(llmt_ckpt_store *store, const char *dir, int64_t step, int json)
{
    if (require_step(store, dir, step))
        return 1;
    llmt_ckpt_info info = {.version = LLMT_CKPT_INFO_VERSION};
    char path[4096];
    if (llmt_ckpt_get_info(store, step, LLMT_CKPT_DURABLE, &info) ||
        llmt_ckpt_path(store, step, LLMT_CKPT_DURABLE, path, sizeof path, NULL))
        return failed(dir);
    if (json)
        print_info_json(path, &info);
    else
        print_info_text(path, &info);
    return 0;
}

/* The llmt_dtype of --hf-dtype, or of the checkpoint's weights when name is
 * NULL; -1 for a name that is none. */
static int32_t hf_dtype(const char *name, int32_t precision)
{
    if (!name)
        return precision == LLMT_PRECISION_FP32         ? LLMT_DTYPE_F32
               : precision == LLMT_PRECISION_FP16_MIXED ? LLMT_DTYPE_F16
                                                        : LLMT_DTYPE_BF16;
    return !strcmp(name, "f32") ? LLMT_DTYPE_F32 : !strcmp(name, "bf16") ? LLMT_DTYPE_BF16
           : !strcmp(name, "f16") ? LLMT_DTYPE_F16 : -1;
}

/* Writes the weights of checkpoint step as a Hugging Face directory. */
static int export_hf(llmt_ckpt_store *store, llmt_context *ctx, const char *dir, int64_t step,
                     const char *hf_dir, const char *dtype_name)
{
    char path[4096];
    llmt_model *model = NULL;
    if (llmt_ckpt_path(store, step, LLMT_CKPT_DURABLE, path, sizeof path, NULL) ||
        llmt_model_create_from_file(&model, ctx, path, LLMT_PRECISION_AS_SAVED))
        return failed(dir);
    llmt_model_config cfg;
    llmt_hf_export_options o = LLMT_HF_EXPORT_OPTIONS_INIT;
    int rc = llmt_model_get_config(model, &cfg);
    if (!rc) {
        o.dtype = hf_dtype(dtype_name, cfg.precision);
        rc = llmt_model_export_hf(model, hf_dir, &o);
    }
    llmt_model_free(model);
    if (rc)
        return failed("");
    printf("wrote %s: the weights of step %lld as a Hugging Face directory (%s)\n", hf_dir,
           (long long)step, llmt_dtype_name(o.dtype));
    return 0;
}

static int cmd_consolidate(llmt_ckpt_store *store, llmt_context *ctx, const char *dir,
                           int64_t step, const char *out, const char *hf_dir, const char *dtype)
{
    if (require_step(store, dir, step))
        return 1;
    if (out) {
        if (llmt_ckpt_consolidate(store, step, LLMT_CKPT_DURABLE, out))
            return failed("");
        printf("wrote %s/step-%08lld: step %lld in the single-file layout (format 1)\n", out,
               (long long)step, (long long)step);
    }
    return hf_dir ? export_hf(store, ctx, dir, step, hf_dir, dtype) : 0;
}

/* Which options each subcommand takes (the others are refused). */
typedef struct command {
    const char *name;
    const char *options[5];
} command;

static const command commands[] = {
    {"verify", {"--step"}},
    {"list", {0}},
    {"info", {"--step", "--json"}},
    {"consolidate", {"--step", "--out", "--hf", "--hf-dtype"}},
};
#define NUM_COMMANDS (sizeof commands / sizeof commands[0])

/* 0 when every option given is one of c's; else prints which is not and
 * returns 2. */
static int check_options(const cli_spec *spec, const command *c)
{
    for (size_t i = 0; i < spec->num_options; i++) {
        if (!spec->options[i].given)
            continue;
        int allowed = 0;
        for (size_t k = 0; k < 5 && c->options[k]; k++)
            allowed |= !strcmp(c->options[k], spec->options[i].name);
        if (!allowed) {
            char why[128];
            snprintf(why, sizeof why, "%s is not an option of %s", spec->options[i].name,
                     c->name);
            return usage_error(why);
        }
    }
    return 0;
}

int main(int argc, char **argv)
{
    int64_t step = -1;
    const char *out = NULL, *hf_dir = NULL, *dtype = NULL;
    int json = 0;
    cli_option opts[] = {
        CLI_OPT_INT64("--step", &step, 0, INT64_MAX),
        CLI_OPT_FLAG("--json", &json),
        CLI_OPT_STRING("--out", &out),
        CLI_OPT_STRING("--hf", &hf_dir),
        CLI_OPT_STRING("--hf-dtype", &dtype),
    };
    cli_spec spec = {PROG, usage, opts, sizeof opts / sizeof *opts, NULL, 0, 2};
    int npos = 0, parsed = cli_parse(&spec, argc, argv, &npos);
    if (parsed != CLI_OK)
        return parsed == CLI_DONE ? 0 : 2;
    if (npos == 0)
        return usage_error("give a command: verify, list, info or consolidate");
    const command *c = NULL;
    for (size_t i = 0; i < NUM_COMMANDS && !c; i++)
        if (!strcmp(argv[1], commands[i].name))
            c = &commands[i];
    if (!c) {
        char why[160];
        snprintf(why, sizeof why, "unknown command '%.64s' (verify, list, info or consolidate)",
                 argv[1]);
        return usage_error(why);
    }
    if (npos < 2) {
        char why[96];
        snprintf(why, sizeof why, "%s needs the checkpoint directory DIR", c->name);
        return usage_error(why);
    }
    if (check_options(&spec, c))
        return 2;
    const char *dir = argv[2];
    int is_info = !strcmp(c->name, "info"), is_consolidate = !strcmp(c->name, "consolidate");
    if ((is_info || is_consolidate) && step < 0) {
        char why[96];
        snprintf(why, sizeof why, "%s needs --step N", c->name);
        return usage_error(why);
    }
    if (is_consolidate && !out && !hf_dir)
        return usage_error("consolidate needs --out OUTDIR, --hf HFDIR or both");
    if (dtype && !hf_dir)
        return usage_error("--hf-dtype needs --hf");
    if (dtype && hf_dtype(dtype, 0) < 0) {
        char why[128];
        snprintf(why, sizeof why, "--hf-dtype %.32s: not f32, bf16 or f16", dtype);
        return usage_error(why);
    }

    llmt_context_config cc = LLMT_CONTEXT_CONFIG_INIT;
    cc.num_threads = 1;
    llmt_context *ctx = NULL;
    llmt_ckpt_store_config sc = LLMT_CKPT_STORE_CONFIG_INIT;
    sc.read_only = 1;
    llmt_ckpt_store *store = NULL;
    if (llmt_context_create(&ctx, &cc))
        return failed("");
    if (llmt_ckpt_store_open(&store, ctx, dir, &sc)) {
        int rc = failed("");
        llmt_context_free(ctx);
        return rc;
    }
    int rc;
    if (!strcmp(c->name, "verify"))
        rc = cmd_verify(store, dir, step);
    else if (!strcmp(c->name, "list"))
        rc = cmd_list(store, dir);
    else if (is_info)
        rc = cmd_info(store, dir, step, json);
    else
        rc = cmd_consolidate(store, ctx, dir, step, out, hf_dir, dtype);
    llmt_ckpt_store_free(store);
    llmt_context_free(ctx);
    return rc;
}
