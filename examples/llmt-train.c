/* llmt-train: train a LLaMA model from a YAML configuration, with
 * checkpoints, adaptive memory and automatic resume.
 *
 *   llmt-train [--config FILE] [--out DIR] [--steps N] [--data-parallel] [--fail-wait S]
 *              [--resume | --no-resume | --start-over]
 *              [--optimizer-settings checkpoint|config] [KEY=VALUE...]
 *   llmt-train --help | --version
 *
 * Without --config it trains the embedded default: a 3M-parameter byte-level
 * model on the licence texts every Debian system has
 * (/usr/share/common-licenses, /usr/share/doc/x/copyright), tokenized into
 * DIR/data on first use. KEY=VALUE arguments set configuration keys after
 * the file (optimizer.lr=3e-4, docs/config.md), checked as the file is.
 * DIR and its parents are created, and locked against a second llmt-train.
 * Run again with the same --out, it resumes from the newest valid
 * checkpoint; checkpoints none of which verify are an error unless
 * --start-over, which sets them aside (step-N.refused-XXXXXX). A resume
 * takes the checkpoint's optimizer settings, or with --optimizer-settings
 * config the configuration's. SIGINT (Ctrl-C) and SIGTERM save a checkpoint
 * and stop (exit 130 and 143); before training starts they stop without
 * training. The fast tier goes to /dev/shm (memory) unless the
 * configuration names a directory; that default one is removed when the
 * run ends with its durable checkpoint, so finished runs do not hold
 * memory, and when a run that created it ends before saving anything
 * there. Exit status: 0 done, 1 failed, 2 bad usage, 130/143 interrupted
 * (docs/trainer.md).
 *
 * Under mpirun/mpiexec or srun (or a torchrun-style environment that an MPI
 * launch backs), each process is one rank of a data-parallel run
 * (train_cli/launch.c, docs/distributed.md): rank 0 alone prints progress,
 * locks and writes DIR; each rank's errors reach stderr as "rank N: ..."; the
 * ranks agree on a stop signal and stop after the same step. On the cuda
 * backend the ranks train over an NCCL communicator (train_cli/nccl_comm.c),
 * MPI carrying its id. --data-parallel trains so even as one rank. */
#define _DEFAULT_SOURCE
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <llmt/llmt.h>

#include "cli_args.h"
#include "train_cli/train_cli.h"

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

/* The signal that asked to stop (SIGINT or SIGTERM), 0 while none has. */
static volatile sig_atomic_t stop_signal;

/* This process's place in the run (a single process unless launched). */
static launch L;

/* The stop as the ranks agreed it last (agree_stop): what every decision
 * after a point of agreement reads, so all ranks act alike even when the
 * signal reached only some, or arrived just after the agreement. */
static int stop_agreed;

static void on_stop_signal(int sig)
{
    stop_signal = sig;
}

/* Installed before anything else, so a signal during start-up, tokenizing
 * or resume stops the run where it can stop cleanly instead of killing it.
 * SA_RESTART: the library's reads and writes are not cut short.
 * SA_RESETHAND: the same signal a second time kills at once, for a user
 * who will not wait for the step and the save. */
static void catch_stop_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sa.sa_flags = SA_RESTART | SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

/* Agrees across the ranks on whether to stop: the largest signal any rank
 * caught (0 none; -1 when the ranks could not be reached, which stops too).
 * Every rank calls it at the same points. */
static int agree_stop(void)
{
    stop_agreed = launch_max(&L, stop_signal);
    return stop_agreed;
}

/* The exit status of a run stopped by a signal: 128 + its number, as a
 * shell reports a process the signal killed (130 SIGINT, 143 SIGTERM). */
static int stopped_status(void)
{
    return stop_agreed > 0 ? 128 + stop_agreed : 1;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: " PROG " [--config FILE] [--out DIR] [--steps N] [--data-parallel]\n"
            "                  [--fail-wait S] [--resume | --no-resume | --start-over]\n"
            "                  [--optimizer-settings checkpoint|config] [KEY=VALUE...]\n"
            "Trains the embedded default configuration on Debian's licence texts unless\n"
            "--config is given; DIR (default runs/demo, created with its parents) holds\n"
            "data, checkpoints, metrics. KEY=VALUE sets a configuration key after the\n"
            "file (optimizer.lr=3e-4 batch.batch_size=4; keys in docs/config.md);\n"
            "--steps N is train.steps=N.\n"
            "  --resume      fail unless a checkpoint is resumed (default: resume if any)\n"
            "  --no-resume   fail if DIR already holds checkpoints\n"
            "  --start-over  train from step 0 although DIR holds checkpoints, none of\n"
            "                which verifies (refused when one does); they are renamed\n"
            "                step-N.refused-XXXXXX and kept\n"
            "  --optimizer-settings checkpoint|config  on a resume, the optimizer settings\n"
            "                (lr, betas, eps, weight decay, decay_norms, grad clip,\n"
            "                schedule, its steps, min_lr) are the checkpoint's\n"
            "                (default) or the configuration's; the step, moments and\n"
            "                data position are the checkpoint's either way. Without a\n"
            "                resume (none found, --no-resume, --start-over) it\n"
            "                changes nothing\n"
            "  --data-parallel  train as a data-parallel run (sharded optimizer and\n"
            "                checkpoints) even as one process, over MPI on the cpu\n"
            "                backend and NCCL on cuda; under mpirun/srun it always is\n"
            "  --fail-wait S  a rank that failed waits at most S seconds (default 30)\n"
            "                for the others to answer (one may be stuck in the NCCL\n"
            "                join), then ends the job\n"
            "  --version     print the library version\n"
            "SIGINT and SIGTERM save a checkpoint and stop (exit 130, 143).\n");
}

static int die(const char *what)
{
    fprintf(stderr, PROG ": %s: %s\n", what, llmt_error_last());
    return 1;
}

/* die, naming the status too (LLMT_ECUDA's "CUDA error"). */
static int die_status(const char *what, int status)
{
    fprintf(stderr, PROG ": %s: %s: %s\n", what, llmt_status_string(status), llmt_error_last());
    return 1;
}

/* --optimizer-settings config, after a resume made the optimizer's settings
 * the checkpoint's (the trainer's log named each that differs): the
 * configuration's again, on every rank. 0, or -1 with the reason on
 * stderr. */
static int use_configured_settings(llmt_trainer *tr, const llmt_optimizer_config *configured)
{
    if (llmt_optimizer_set_settings(llmt_trainer_optimizer(tr), configured)) {
        fprintf(stderr, PROG ": --optimizer-settings config: %s\n", llmt_error_last());
        return -1;
    }
    printf("  the configured optimizer settings are used (--optimizer-settings config)\n");
    return 0;
}

/* Agrees across the ranks on whether a step failed (failed: on this rank);
 * a rank that did not fail itself says which step failed elsewhere. 1 when
 * any rank failed, else 0. */
static int any_failed(int failed, const char *what)
{
    int any = launch_max(&L, failed != 0) != 0;
    if (any && !failed)
        fprintf(stderr, PROG ": %s failed on another rank (that rank's message says why)\n", what);
    return any;
}

/* Sets a path field to DIR/suffix when the configuration left it empty. */
static void default_path(char *field, const char *dir, const char *suffix)
{
    if (!field[0])
        snprintf(field, LLMT_CONFIG_PATH_MAX, "%s/%s", dir, suffix);
}

typedef struct progress {
    int64_t total, log_every;
    double seconds;
    int64_t first_step;
} progress;

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
    return agree_stop() != 0;
}

/* The command line, parsed. */
typedef struct options {
    const char *config, *out;
    int64_t steps; /* -1: the configuration's */
    int resume, no_resume, start_over;
    int data_parallel; /* --data-parallel */
    int configured_settings; /* --optimizer-settings config: 1; checkpoint (default): 0 */
    int64_t fail_wait; /* --fail-wait: seconds; LAUNCH_FAIL_WAIT_S by default */
} options;

/* Prints the trainer's log lines; user: the options. Where the resume
 * says the checkpoint's optimizer settings replaced the configured ones,
 * and the configured ones were not asked for, says how to ask. */
static void on_log(void *user, const char *line)
{
    const options *o = user;
    printf("  %s\n", line);
    if (!o->configured_settings && strstr(line, "optimizer settings replace the configured"))
        printf("  (--optimizer-settings config takes the configured ones)\n");
}

/* Parses argv into o and the configuration: file (or the default), then the
 * KEY=VALUE overrides in order, then --steps. Returns GO_ON, or the exit
 * status (0 after --help/--version, 1 bad configuration file, 2 bad usage,
 * a bad override included). */
#define GO_ON (-1)
static int parse_command_line(int argc, char **argv, options *o, llmt_train_config *cfg)
{
    *o = (options){NULL, "runs/demo", -1, 0, 0, 0, 0, 0, LAUNCH_FAIL_WAIT_S};
    const char *settings = "checkpoint";
    cli_option opts[] = {
        CLI_OPT_STRING("--config", &o->config),
        CLI_OPT_STRING("--out", &o->out),
        CLI_OPT_INT64("--steps", &o->steps, 0, 1000000000000000LL),
        CLI_OPT_FLAG("--resume", &o->resume),
        CLI_OPT_FLAG("--no-resume", &o->no_resume),
        CLI_OPT_FLAG("--start-over", &o->start_over),
        CLI_OPT_FLAG("--data-parallel", &o->data_parallel),
        CLI_OPT_INT64("--fail-wait", &o->fail_wait, 1, 86400),
        CLI_OPT_STRING("--optimizer-settings", &settings),
    };
    static const char *const exclusive[][2] = {
        {"--resume", "--no-resume"}, {"--resume", "--start-over"}, {"--no-resume", "--start-over"}};
    cli_spec spec = {PROG, usage, opts, sizeof opts / sizeof *opts, exclusive,
                     sizeof exclusive / sizeof *exclusive, CLI_ANY_POSITIONAL};
    int npos = 0, parsed = cli_parse(&spec, argc, argv, &npos);
    if (parsed != CLI_OK)
        return parsed == CLI_DONE ? 0 : 2;
    if (strcmp(settings, "checkpoint") && strcmp(settings, "config")) {
        fprintf(stderr, PROG ": --optimizer-settings %s: neither checkpoint nor config\n"
                "Try '" PROG " --help'.\n", settings);
        return 2;
    }
    o->configured_settings = !strcmp(settings, "config");
    for (int i = 1; i <= npos; i++)
        if (!strchr(argv[i], '=') || argv[i][0] == '=') {
            fprintf(stderr, PROG ": unexpected argument '%s': configuration overrides are "
                    "KEY=VALUE (optimizer.lr=3e-4)\nTry '" PROG " --help'.\n", argv[i]);
            return 2;
        }
    llmt_train_config_init(cfg);
    cfg->device = -1; /* unset, unless the file or an override sets it (pick_device) */
    int rc = o->config ? llmt_train_config_load_yaml(cfg, o->config)
                       : llmt_train_config_parse_yaml(cfg, default_config,
                                                      sizeof default_config - 1, "default config");
    if (rc)
        return die("configuration");
    for (int i = 1; i <= npos; i++) {
        char *eq = strchr(argv[i], '=');
        *eq = '\0';
        if (o->steps >= 0 && !strcmp(argv[i], "train.steps")) {
            fprintf(stderr, PROG ": --steps and train.steps=%s both given\n", eq + 1);
            return 2;
        }
        rc = llmt_train_config_set(cfg, argv[i], eq + 1);
        if (rc)
            fprintf(stderr, PROG ": override %s\n", llmt_error_last()); /* names key, value */
        *eq = '=';
        if (rc)
            return 2;
    }
    if (o->steps >= 0)
        cfg->steps = o->steps;
    return GO_ON;
}

/* The device this rank's context opens: train.device when the
 * configuration sets it, else on CUDA the node-local rank (one device per
 * process). cfg->device itself goes back to its default then, so that the
 * configuration every rank hands the library is the same. */
static int pick_device(llmt_train_config *cfg)
{
    if (cfg->device >= 0)
        return cfg->device;
    cfg->device = 0;
    return cfg->backend == LLMT_BACKEND_CUDA && L.local_rank > 0 ? L.local_rank : 0;
}

/* The default corpus (no data.train) is byte-level: a vocabulary without
 * room for its ids is refused before anything is made. 0 or -1 (reported). */
static int check_default_corpus_vocab(const llmt_train_config *cfg)
{
    if (cfg->train_data[0] || cfg->model.vocab_size >= LLMT_BYTE_VOCAB)
        return 0;
    fprintf(stderr, PROG ": model.vocab_size = %d is below %d, the byte tokenizer's vocabulary "
            "(256 bytes and end-of-text) the default corpus is written in; set "
            "model.vocab_size to %d or more, or name data.train\n",
            cfg->model.vocab_size, LLMT_BYTE_VOCAB, LLMT_BYTE_VOCAB);
    return -1;
}

/* Fills the paths the configuration left empty under out, preparing the
 * default corpus when no training data is named. 0 or -1 (reported). */
static int fill_paths(llmt_train_config *cfg, const char *out, int *default_fast_dir)
{
    if (!cfg->train_data[0]) { /* the default corpus */
        if (prepare_default_corpus(out))
            return -1;
        default_path(cfg->train_data, out, "data/text_train_*.bin");
        default_path(cfg->val_data, out, "data/text_val_*.bin");
    }
    default_path(cfg->checkpoint_dir, out, "checkpoints");
    default_path(cfg->metrics, out, "metrics.jsonl");
    *default_fast_dir = 0;
    if (!cfg->fast_checkpoint_dir[0] && cfg->fast_checkpoint_every && access("/dev/shm", W_OK) == 0) {
        *default_fast_dir = 1;
        char real[4096];
        unsigned long h = 5381;
        const char *name = realpath(out, real) ? real : out;
        for (const char *c = name; *c; c++)
            h = h * 33 + (unsigned char)*c;
        snprintf(cfg->fast_checkpoint_dir, LLMT_CONFIG_PATH_MAX, "/dev/shm/llmt-train-%lx", h);
    } else if (!cfg->fast_checkpoint_dir[0]) {
        cfg->fast_checkpoint_every = 0;
    }
    return 0;
}

/* What the options ask of the checkpoints already there, before the
 * trainer opens them: --no-resume refuses any, --start-over sets invalid
 * ones aside (and refuses a valid one). 0, or 1 with the reason on stderr. */
static int check_existing(llmt_context *ctx, const options *o, const llmt_train_config *cfg)
{
    if (o->no_resume) {
        size_t n = 0, fast = 0;
        if (count_checkpoints(ctx, cfg->checkpoint_dir, &n) ||
            count_checkpoints(ctx, cfg->fast_checkpoint_dir, &fast))
            return 1;
        if (n + fast) {
            fprintf(stderr, PROG ": --no-resume, but %s already has checkpoints: choose another "
                    "--out or remove them\n", o->out);
            return 1;
        }
    }
    if (o->start_over &&
        set_aside_for_start_over(ctx, o->out, cfg->checkpoint_dir, cfg->fast_checkpoint_dir))
        return 1;
    return 0;
}

/* Resumes as the options say (after check_existing); *from receives the
 * step resumed (-1: none). 0, or 1 with the reason on stderr. */
static int resume_as_asked(llmt_trainer *tr, const options *o, const llmt_train_config *cfg,
                           int64_t *from)
{
    *from = -1;
    if (o->no_resume)
        return 0;
    int rc = llmt_trainer_resume_latest(tr, from);
    if (rc == LLMT_ECORRUPT) {
        fprintf(stderr, PROG ": resume: %s\n" PROG ": no checkpoint in %s verifies; to train "
                "from step 0, run again with --start-over (which sets them aside)\n",
                llmt_error_last(), o->out);
        return 1;
    }
    if (rc)
        return die("resume");
    if (o->resume && *from < 0) {
        fprintf(stderr, PROG ": --resume: no checkpoint in %s\n", cfg->checkpoint_dir);
        return 1;
    }
    return 0;
}

/* Trains from the current step to cfg->steps, saves the final checkpoint,
 * and, when not stopped, prints the held-out loss (into *final_loss, which
 * stays NaN without held-out data) and a sample. 0 or 1. */
static int train(llmt_trainer *tr, const llmt_train_config *cfg, double *final_loss)
{
    progress p = {cfg->steps, cfg->log_every, 0, llmt_trainer_step_index(tr)};
    llmt_trainer_set_callback(tr, on_step, &p);
    if (llmt_trainer_run(tr, cfg->steps))
        return die("training");
    agree_stop(); /* a signal after the last step's agreement counts on every rank or none */
    if (llmt_trainer_step_index(tr) > 0) {
        if (llmt_trainer_save(tr, LLMT_CKPT_DURABLE))
            return die("final checkpoint");
        if (stop_agreed)
            printf("interrupted at step %lld: checkpoint saved; run again to continue\n",
                   (long long)llmt_trainer_step_index(tr));
    }
    if (stop_agreed)
        return 0;
    if (llmt_trainer_evaluate(tr, final_loss) == LLMT_OK)
        printf("final held-out loss %.4f nats\n", *final_loss);
    char text[512];
    if (sample_text(tr, "The ", 120, text, sizeof text) == 0) {
        printf("sample: The ");
        print_escaped(stdout, text);
        printf("\n");
    }
    return 0;
}

/* Rank 0 creates and locks the run directory and prepares the default
 * corpus; then the other ranks fill the same paths, which name what rank 0
 * made (DIR on a filesystem every rank sees). 0 or -1 (reported). */
static int prepare_run_dir(const options *o, llmt_train_config *cfg, int *default_fast_dir)
{
    *default_fast_dir = 0;
    int bad = check_default_corpus_vocab(cfg) != 0;
    if (!bad && L.rank == 0)
        bad = make_dirs(o->out) || lock_run_dir(o->out) < 0 ||
              fill_paths(cfg, o->out, default_fast_dir);
    if (any_failed(bad, "preparing the run directory"))
        return -1;
    if (L.rank != 0)
        bad = fill_paths(cfg, o->out, default_fast_dir) != 0;
    return any_failed(bad, "preparing the run directory") ? -1 : 0;
}

/* The run in its prepared directory: the context, the trainer, the resume
 * and the training, all released before it returns. *trained: the run
 * ended with its final checkpoint. Returns the exit status. */
static int run_in_dir(const options *o, const llmt_train_config *cfg, int device, int *trained)
{
    *trained = 0;
    llmt_context_config cc = LLMT_CONTEXT_CONFIG_INIT;
    cc.num_threads = cfg->threads;
    cc.seed = cfg->seed;
    cc.backend = cfg->backend;
    cc.device = device;
    llmt_context *ctx = NULL;
    llmt_trainer *tr = NULL;
    int rc = llmt_context_create(&ctx, &cc);
    if (any_failed(rc != LLMT_OK, "creating the context"))
        return rc ? die_status("context", rc) : 1;
    /* Data-parallel on CUDA: the library's trainer takes an NCCL
     * communicator (device memory); MPI's stays for llmt-train's own. */
    llmt_comm *nccl = NULL;
    if (cfg->backend == LLMT_BACKEND_CUDA && (L.comm || o->data_parallel) &&
        nccl_comm_create(&L, ctx, device, &nccl)) {
        llmt_context_free(ctx);
        return 1;
    }
    llmt_comm *comm = nccl ? nccl : L.comm;
    rc = 0;
    if (any_failed(L.rank == 0 && check_existing(ctx, o, cfg), "checking the checkpoints"))
        rc = 1;
    else if (llmt_trainer_create_from_config_dist(&tr, ctx, cfg, comm)) /* agreed by the ranks */
        rc = die("setup");
    if (rc) {
        llmt_comm_free(nccl);
        llmt_context_free(ctx);
        return rc;
    }
    llmt_trainer_set_log(tr, on_log, (void *)o);
    int64_t from = -1;
    double final_loss = NAN;
    rc = resume_as_asked(tr, o, cfg, &from);
    if (!rc && from >= 0 && o->configured_settings && /* from: the same on every rank */
        any_failed(use_configured_settings(tr, &cfg->optimizer) != 0,
                   "applying the configured optimizer settings"))
        rc = 1;
    if (!rc && agree_stop()) {
        printf("interrupted before training started: nothing trained\n");
    } else if (!rc) {
        double h = unigram_entropy(cfg->val_data);
        char ranks[48] = "";
        if (comm)
            snprintf(ranks, sizeof ranks, ", %d rank%s%s", L.world, L.world > 1 ? "s" : "",
                     nccl ? " over NCCL" : "");
        printf("%s: %lld parameters, %s%s; %s at step %lld of %lld; byte unigram entropy of the "
               "held-out text %.3f nats\n", PROG, (long long)llmt_model_num_params(llmt_trainer_model(tr)),
               o->config ? o->config : "default config", ranks, from >= 0 ? "resuming" : "starting",
               (long long)llmt_trainer_step_index(tr), (long long)cfg->steps, h);
        if (cfg->fast_checkpoint_every)
            printf("fast tier: %s, every %lld steps\n", cfg->fast_checkpoint_dir,
                   (long long)cfg->fast_checkpoint_every);
        fflush(stdout);
        rc = train(tr, cfg, &final_loss);
        *trained = !rc;
    }
    long long last_step = (long long)llmt_trainer_step_index(tr);
    llmt_trainer_free(tr); /* waits for a fast save in flight; closes the metrics file */
    llmt_comm_free(nccl);  /* before its context */
    llmt_context_free(ctx);
    if (!rc && !isnan(final_loss) && cfg->metrics[0] && L.rank == 0)
        rc = append_final_eval(cfg->metrics, last_step, final_loss) ? 1 : 0;
    return rc ? 1 : stop_agreed ? stopped_status() : 0;
}

/* The run, once the launch is known; returns the exit status. */
static int run(int argc, char **argv)
{
    options o;
    llmt_train_config cfg;
    int rc = parse_command_line(argc, argv, &o, &cfg);
    if (any_failed(rc != GO_ON && rc != 0, "reading the command line and configuration"))
        return rc == GO_ON ? 1 : rc;
    if (rc != GO_ON) /* --help, --version */
        return rc;
    L.fail_wait_s = (int)o.fail_wait;
    /* One process trained data-parallel on the cpu backend: MPI's communicator of one. */
    if (o.data_parallel && cfg.backend != LLMT_BACKEND_CUDA && (rc = launch_start_alone(&L)))
        return rc;
    int device = pick_device(&cfg);
    int default_fast_dir = 0;
    if (prepare_run_dir(&o, &cfg, &default_fast_dir))
        return agree_stop() ? stopped_status() : 1;
    /* Whether this run makes the default fast tier (the store creates it):
     * asked after DIR's lock, so no other llmt-train on DIR makes it meanwhile. */
    int fast_dir_is_new = default_fast_dir && L.rank == 0 &&
                          access(cfg.fast_checkpoint_dir, F_OK) != 0 && errno == ENOENT;
    int trained = 0;
    if (agree_stop()) {
        printf("interrupted before training started: nothing trained\n");
        rc = stopped_status();
    } else {
        rc = run_in_dir(&o, &cfg, device, &trained);
    }
    if (trained && default_fast_dir && L.rank == 0) /* nothing there is newer than the final checkpoint */
        remove_tree(cfg.fast_checkpoint_dir);
    else if (fast_dir_is_new) /* a failed or stopped start: what it made, if it saved nothing there */
        remove_fast_dir_if_unused(cfg.fast_checkpoint_dir);
    return rc;
}

int main(int argc, char **argv)
{
    catch_stop_signals();
    int rc = launch_detect(&L);
    if (!rc)
        rc = launch_start(&L, &argc, &argv);
    if (!rc)
        rc = run(argc, argv);
    return launch_end(&L, rc);
}
