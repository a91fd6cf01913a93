/* llmt-train: train a LLaMA model from a YAML configuration, with
 * checkpoints, adaptive memory and automatic resume.
 *
 *   llmt-train [--config FILE] [--out DIR] [--steps N] [--resume | --no-resume]
 *
 * Without --config it trains the embedded default: a 3M-parameter byte-level
 * model on the licence texts every Debian system has
 * (/usr/share/common-licenses, /usr/share/doc/x/copyright), tokenized into
 * DIR/data on first use. Run again with the same --out, it resumes from the
 * newest valid checkpoint. Ctrl-C saves a checkpoint and stops. The fast
 * tier goes to /dev/shm (memory) unless the configuration names a directory;
 * that default one is removed when the run ends with its durable checkpoint,
 * so finished runs do not hold memory. */
#define _DEFAULT_SOURCE
#define _XOPEN_SOURCE 700 /* nftw */
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <glob.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <llmt/llmt.h>

#define PROG "llmt-train"

static const char default_config[] =
    "model:\n"
    "  vocab_size: 320\n"
    "  hidden_size: 256\n"
    "  num_layers: 4\n"
    "  num_heads: 4\n"
    "  num_kv_heads: 2\n"
    "  ffn_size: 704\n"
    "  max_seq_len: 256\n"
    "  tie_embeddings: true\n"
    "precision: fp32\n"
    "optimizer:\n"
    "  lr: 3.0e-3\n"
    "  weight_decay: 0.1\n"
    "  grad_clip: 1.0\n"
    "schedule:\n"
    "  kind: cosine\n"
    "  warmup_steps: 30\n"
    "  total_steps: 500\n"
    "  min_lr: 3.0e-4\n"
    "batch:\n"
    "  batch_size: 8\n"
    "  micro_batch: 8\n"
    "  seq_len: 256\n"
    "train:\n"
    "  steps: 500\n"
    "  eval_every: 100\n"
    "  eval_batches: 4\n"
    "  log_every: 10\n"
    "  seed: 1234\n"
    "checkpoint:\n"
    "  every: 100\n"
    "  keep: 3\n"
    "  async: true\n"
    "  fast_every: 10\n"
    "  fast_keep: 2\n";

static volatile sig_atomic_t interrupted;

static void on_sigint(int sig)
{
    (void)sig;
    interrupted = 1;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: " PROG " [--config FILE] [--out DIR] [--steps N] [--resume | --no-resume]\n"
               "Trains the embedded default configuration on Debian's licence texts unless\n"
               "--config is given; DIR (default runs/demo) holds data, checkpoints, metrics.\n");
}

static int die(const char *what)
{
    fprintf(stderr, PROG ": %s: %s\n", what, llmt_error_last());
    return 1;
}

/* Sets a path field to DIR/suffix when the configuration left it empty. */
static void default_path(char *field, const char *dir, const char *suffix)
{
    if (!field[0])
        snprintf(field, LLMT_CONFIG_PATH_MAX, "%s/%s", dir, suffix);
}

/* The licence texts: every regular file (not a link: the links repeat
 * texts) of /usr/share/common-licenses and every /usr/share/doc/x/copyright,
 * sorted as glob sorts them. */
static int corpus_files(glob_t *g)
{
    memset(g, 0, sizeof *g);
    glob("/usr/share/common-licenses/*", 0, NULL, g);
    glob("/usr/share/doc/*/copyright", GLOB_APPEND, NULL, g);
    size_t kept = 0;
    for (size_t i = 0; i < g->gl_pathc; i++) {
        struct stat st;
        if (lstat(g->gl_pathv[i], &st) == 0 && S_ISREG(st.st_mode))
            g->gl_pathv[kept++] = g->gl_pathv[i];
    }
    g->gl_pathc = kept;
    return kept ? 0 : -1;
}

/* Tokenizes the corpus into DIR/data once; a READY file marks completion. */
static int prepare_data(const char *out)
{
    char data[4096], ready[4200];
    snprintf(data, sizeof data, "%s/data", out);
    snprintf(ready, sizeof ready, "%s/READY", data);
    if (access(ready, F_OK) == 0)
        return 0;
    glob_t g;
    if (corpus_files(&g)) {
        fprintf(stderr, PROG ": no text found under /usr/share/common-licenses or /usr/share/doc\n");
        return -1;
    }
    llmt_tokenize_report r = LLMT_TOKENIZE_REPORT_INIT;
    if (llmt_byte_tokenize_files((const char *const *)g.gl_pathv, g.gl_pathc, data, "text",
                                 10000000, 0.02, &r) != LLMT_OK) {
        globfree(&g);
        return die("tokenizing the corpus");
    }
    printf("tokenized %llu files (%.1f MB of text): %llu training tokens, %llu held out\n",
           (unsigned long long)r.files, (double)r.bytes / 1e6,
           (unsigned long long)r.train_tokens, (unsigned long long)r.val_tokens);
    globfree(&g);
    FILE *f = fopen(ready, "w");
    return f && fclose(f) == 0 ? 0 : -1;
}

/* Entropy (nats) of the token frequencies of the held-out shards: what a
 * model that knows nothing but byte frequencies would score. */
static double unigram_entropy(const char *pattern)
{
    glob_t g;
    double counts[65536] = {0}, total = 0;
    if (glob(pattern, 0, NULL, &g) != 0)
        return NAN;
    for (size_t i = 0; i < g.gl_pathc; i++) {
        FILE *f = fopen(g.gl_pathv[i], "rb");
        int32_t head[256];
        if (!f || fread(head, 4, 256, f) != 256 || head[1] != LLMT_SHARD_VERSION_U16) {
            if (f)
                fclose(f);
            continue;
        }
        uint16_t tok;
        while (fread(&tok, 2, 1, f) == 1) {
            counts[tok]++;
            total++;
        }
        fclose(f);
    }
    globfree(&g);
    double h = 0;
    for (int i = 0; i < 65536; i++)
        if (counts[i] > 0)
            h -= counts[i] / total * log(counts[i] / total);
    return h;
}

/* Whether dir holds a checkpoint directory (step-N). */
static int has_checkpoints(const char *dir)
{
    DIR *d = dir[0] ? opendir(dir) : NULL;
    struct dirent *e;
    int found = 0;
    while (d && !found && (e = readdir(d)))
        found = strncmp(e->d_name, "step-", 5) == 0 && !strchr(e->d_name, '.');
    if (d)
        closedir(d);
    return found;
}

typedef struct progress {
    int64_t total, log_every;
    double started, seconds;
    int64_t first_step;
} progress;

static int remove_entry(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
    (void)st;
    (void)type;
    (void)ftw;
    return remove(path);
}

/* Removes the default fast-tier directory after the final durable save: its
 * checkpoints are no newer than that one. */
static void remove_fast_tier(const char *dir)
{
    if (nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0 && errno != ENOENT)
        fprintf(stderr, PROG ": cannot remove the fast tier %s: %s\n", dir, strerror(errno));
}

static int on_step(void *user, const llmt_step_report *r)
{
    progress *p = user;
    p->seconds += r->seconds;
    if (r->step % p->log_every == 0 || r->step == p->total || !isnan(r->eval_loss)) {
        double per_step = p->seconds / (double)(r->step - p->first_step);
        double eta = per_step * (double)(p->total - r->step);
        printf("step %5lld/%lld  loss %.4f  lr %.2e  %6.0f tok/s  mem %.1f MiB (%.0f%%)  "
               "micro-batch %d  eta %dm%02ds%s",
               (long long)r->step, (long long)p->total, r->loss, r->lr, r->tokens_per_second,
               (double)r->mem_peak / 1048576.0, 100.0 * r->mem_ratio, r->micro_batch,
               (int)eta / 60, (int)eta % 60, r->checkpointed & (1 << LLMT_CKPT_DURABLE) ? "  [saved]" : "");
        if (!isnan(r->eval_loss))
            printf("  held-out loss %.4f", r->eval_loss);
        printf("\n");
        fflush(stdout);
    }
    return interrupted;
}

static void on_log(void *user, const char *line)
{
    (void)user;
    printf("  %s\n", line);
}

/* Continues text from a prompt, one byte at a time, sampling at temperature
 * 0.8 with the context's random stream; returns the bytes in out. */
static int sample(llmt_trainer *tr, const char *prompt, int n, char *out, size_t cap)
{
    llmt_model *m = llmt_trainer_model(tr);
    llmt_model_config mc;
    llmt_model_get_config(m, &mc);
    int32_t ctx_tokens[4096];
    size_t len = 0;
    if (llmt_byte_encode(prompt, strlen(prompt), ctx_tokens, 4096, &len))
        return -1;
    float *logits = malloc((size_t)mc.max_seq_len * (size_t)mc.vocab_size * sizeof *logits);
    size_t used = 0;
    for (int i = 0; i < n && logits; i++) {
        size_t start = len > (size_t)mc.max_seq_len ? len - (size_t)mc.max_seq_len : 0;
        int32_t t = (int32_t)(len - start);
        if (llmt_model_logits(m, ctx_tokens + start, 1, t, logits, (size_t)t * (size_t)mc.vocab_size))
            break;
        const float *row = logits + (size_t)(t - 1) * (size_t)mc.vocab_size;
        double mx = -INFINITY, sum = 0, u = 0;
        for (int v = 0; v < LLMT_BYTE_VOCAB; v++)
            mx = row[v] > mx ? row[v] : mx;
        for (int v = 0; v < LLMT_BYTE_VOCAB; v++)
            sum += exp((row[v] - mx) / 0.8);
        float draw;
        llmt_context_rng_uniform(llmt_trainer_context(tr), &draw, 1);
        int32_t pick = LLMT_BYTE_VOCAB - 1;
        for (int v = 0; v < LLMT_BYTE_VOCAB; v++)
            if ((u += exp((row[v] - mx) / 0.8) / sum) > draw) {
                pick = v;
                break;
            }
        if (pick == LLMT_TOKEN_EOT || len == 4096 || used + 1 >= cap)
            break;
        ctx_tokens[len++] = pick;
        out[used++] = (char)pick;
    }
    out[used] = '\0';
    free(logits);
    return 0;
}

int main(int argc, char **argv)
{
    const char *config_path = NULL, *out = "runs/demo";
    long long steps = -1;
    int resume = -1; /* -1: when there is a checkpoint */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--resume")) resume = 1;
        else if (!strcmp(a, "--no-resume")) resume = 0;
        else if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); return 0; }
        else if (v && !strcmp(a, "--config")) config_path = argv[++i];
        else if (v && !strcmp(a, "--out")) out = argv[++i];
        else if (v && !strcmp(a, "--steps")) steps = atoll(argv[++i]);
        else { usage(stderr); return 2; }
    }
    llmt_train_config cfg;
    llmt_train_config_init(&cfg);
    int rc = config_path ? llmt_train_config_load_yaml(&cfg, config_path)
                         : llmt_train_config_parse_yaml(&cfg, default_config,
                                                        sizeof default_config - 1, "default config");
    if (rc)
        return die("configuration");
    if (steps >= 0)
        cfg.steps = steps;
    if (mkdir(out, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, PROG ": cannot create %s: %s\n", out, strerror(errno));
        return 1;
    }
    if (!cfg.train_data[0]) { /* the default corpus */
        if (prepare_data(out))
            return 1;
        default_path(cfg.train_data, out, "data/text_train_*.bin");
        default_path(cfg.val_data, out, "data/text_val_*.bin");
    }
    default_path(cfg.checkpoint_dir, out, "checkpoints");
    default_path(cfg.metrics, out, "metrics.jsonl");
    int default_fast_dir = 0;
    if (!cfg.fast_checkpoint_dir[0] && cfg.fast_checkpoint_every && access("/dev/shm", W_OK) == 0) {
        default_fast_dir = 1;
        char real[4096];
        unsigned long h = 5381;
        const char *name = realpath(out, real) ? real : out;
        for (const char *c = name; *c; c++)
            h = h * 33 + (unsigned char)*c;
        snprintf(cfg.fast_checkpoint_dir, LLMT_CONFIG_PATH_MAX, "/dev/shm/llmt-train-%lx", h);
    } else if (!cfg.fast_checkpoint_dir[0]) {
        cfg.fast_checkpoint_every = 0;
    }

    llmt_context_config cc = LLMT_CONTEXT_CONFIG_INIT;
    cc.num_threads = cfg.threads;
    cc.seed = cfg.seed;
    cc.backend = cfg.backend;
    cc.device = cfg.device;
    llmt_context *ctx = NULL;
    llmt_trainer *tr = NULL;
    if (llmt_context_create(&ctx, &cc))
        return die("context");
    if (llmt_trainer_create_from_config(&tr, ctx, &cfg)) {
        llmt_context_free(ctx);
        return die("setup");
    }
    llmt_trainer_set_log(tr, on_log, NULL);
    int64_t from = -1;
    if (resume != 0 && llmt_trainer_resume_latest(tr, &from))
        rc = die("resume");
    else if (resume == 1 && from < 0)
        rc = fprintf(stderr, PROG ": --resume: no checkpoint in %s\n", cfg.checkpoint_dir) > 0;
    else if (resume == 0 && (has_checkpoints(cfg.checkpoint_dir) ||
                             has_checkpoints(cfg.fast_checkpoint_dir)))
        rc = fprintf(stderr, PROG ": --no-resume, but %s already has checkpoints: choose another "
                     "--out or remove them\n", out) > 0;
    if (!rc) {
        double h = unigram_entropy(cfg.val_data);
        printf("%s: %lld parameters, %s; %s at step %lld of %lld; byte unigram entropy of the "
               "held-out text %.3f nats\n", PROG, (long long)llmt_model_num_params(llmt_trainer_model(tr)),
               config_path ? config_path : "default config", from >= 0 ? "resuming" : "starting",
               (long long)llmt_trainer_step_index(tr), (long long)cfg.steps, h);
        if (cfg.fast_checkpoint_every)
            printf("fast tier: %s, every %lld steps\n", cfg.fast_checkpoint_dir,
                   (long long)cfg.fast_checkpoint_every);
        fflush(stdout);
        signal(SIGINT, on_sigint);
        progress p = {cfg.steps, cfg.log_every, 0, 0, llmt_trainer_step_index(tr)};
        llmt_trainer_set_callback(tr, on_step, &p);
        if (llmt_trainer_run(tr, cfg.steps))
            rc = die("training");
    }
    if (!rc && llmt_trainer_step_index(tr) > 0) {
        if (llmt_trainer_save(tr, LLMT_CKPT_DURABLE))
            rc = die("final checkpoint");
        else if (interrupted)
            printf("interrupted at step %lld: checkpoint saved; run again to continue\n",
                   (long long)llmt_trainer_step_index(tr));
    }
    if (!rc && !interrupted) {
        double loss = 0;
        if (llmt_trainer_evaluate(tr, &loss) == LLMT_OK)
            printf("final held-out loss %.4f nats\n", loss);
        char text[512];
        if (sample(tr, "The ", 120, text, sizeof text) == 0)
            printf("sample: The %s\n", text);
    }
    llmt_trainer_free(tr); /* waits for a fast save in flight */
    llmt_context_free(ctx);
    if (!rc && default_fast_dir)
        remove_fast_tier(cfg.fast_checkpoint_dir);
    return rc ? 1 : interrupted ? 130 : 0;
}
