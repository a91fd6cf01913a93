/* Checkpoint speed against plain file I/O of the same bytes, in one process:
 * R interleaved rounds, each a synchronous save and a sequential write +
 * fsync of as many bytes into a new file (the previous round's removed, as
 * the save removes the previous step), then a load and a plain read of the
 * checkpoint's own files, both from a cold page cache (the files' pages
 * are dropped with posix_fadvise after fdatasync). Which side goes first
 * alternates from round to round, and each round's ratio (plain time / our
 * time, > 1: we are faster) is taken within the round, so a disk whose
 * speed drifts between rounds moves both sides. Prints every round, each
 * side's min and median, the median and min of the per-round ratios and of
 * the order-balanced pairs of rounds (bench_ratio.h); then the time save_async blocks the caller
 * against a memcpy of the state, and a resume (open, latest with its full
 * verification, load) in seconds.
 *
 * Usage: bench_ckpt DIR [rounds] [hidden] — DIR on the file system to
 * measure; rounds 6 by default (even: as many rounds of each order). The
 * state is an fp32 model with AdamW moments (12 bytes saved per
 * parameter); the default hidden size 1024 gives 143M parameters, 1.71 GB
 * of state. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "bench_ratio.h"
#include "bench_file_io.h"
#include "bench_util.h"
#include "llmt/llmt.h"

static void die(const char *what)
{
    fprintf(stderr, "bench_ckpt: %s: %s\n", what, llmt_error_last());
    exit(1);
}

/* bench_write_new, timed. */
static double plain_write(const char *path, const char *old, const char *buf, size_t n)
{
    bench_settle();
    double t = bench_now();
    const char *failed = bench_write_new(path, old, buf, n);
    if (failed)
        die(failed);
    return bench_now() - t;
}

/* A plain sequential read of the n files at paths, one after the other,
 * into buf (cap bytes), from a cold page cache. */
static double plain_read(const char *const *paths, int n, char *buf, size_t cap)
{
    for (int i = 0; i < n; i++)
        bench_drop_cache(paths[i]);
    bench_settle();
    double t = bench_now();
    for (int i = 0; i < n; i++) {
        size_t got = 0;
        const char *failed = bench_read_whole(paths[i], buf, cap, &got);
        if (failed)
            die(failed);
        buf += got;
        cap -= got;
    }
    return bench_now() - t;
}

static double timed_save(llmt_ckpt_store *s, llmt_train_state *st, int64_t step)
{
    st->step = step;
    bench_settle();
    double t = bench_now();
    if (llmt_ckpt_save(s, st, LLMT_CKPT_DURABLE))
        die("save");
    return bench_now() - t;
}

/* The paths of checkpoint step's files in store_dir: the MANIFEST, the
 * weights, the optimizer state. */
typedef struct ckpt_files {
    char path[3][1200];
    const char *p[3];
} ckpt_files;

static void ckpt_files_of(ckpt_files *f, const char *store_dir, int64_t step)
{
    static const char *const names[3] = {"MANIFEST", "model.safetensors", "optimizer.safetensors"};
    for (int i = 0; i < 3; i++) {
        snprintf(f->path[i], sizeof f->path[i], "%s/step-%08lld/%s", store_dir, (long long)step,
                 names[i]);
        f->p[i] = f->path[i];
    }
}

/* A load of checkpoint step from a cold page cache. */
static double timed_load(llmt_ckpt_store *s, const ckpt_files *f, llmt_train_state *ld,
                         int64_t step)
{
    for (int i = 0; i < 3; i++)
        bench_drop_cache(f->path[i]);
    bench_settle();
    double t = bench_now();
    if (llmt_ckpt_load(s, step, LLMT_CKPT_DURABLE, ld, NULL, 0, NULL))
        die("load");
    return bench_now() - t;
}

int main(int argc, char **argv)
{
    int rounds = argc > 2 ? atoi(argv[2]) : 6;
    int hidden = argc > 3 ? atoi(argv[3]) : 1024;
    if (argc < 2 || argc > 4 || rounds < 1 || rounds > BENCH_MAX_ROUNDS || hidden < 64 ||
        hidden % 64) {
        fprintf(stderr, "usage: bench_ckpt DIR [rounds 1..%d, default 6] [hidden: a multiple of "
                        "64, default 1024]\n", BENCH_MAX_ROUNDS);
        return 2;
    }
    const char *dir = argv[1];
    llmt_context_config cc = LLMT_CONTEXT_CONFIG_INIT;
    cc.num_threads = 2;
    llmt_context *ctx = NULL;
    llmt_model *m = NULL;
    llmt_optimizer *o = NULL;
    llmt_model_config c = LLMT_MODEL_CONFIG_INIT;
    c.vocab_size = 32000, c.hidden_size = hidden, c.num_layers = 6, c.num_heads = hidden / 64;
    c.num_kv_heads = hidden / 64, c.ffn_size = hidden * 11 / 4, c.max_seq_len = 64;
    llmt_optimizer_config oc = LLMT_OPTIMIZER_CONFIG_INIT;
    if (llmt_context_create(&ctx, &cc) || llmt_model_create(&m, ctx, &c) ||
        llmt_optimizer_create(&o, m, &oc))
        die("setup");
    char store_dir[1024], plain_path[2][1100];
    snprintf(store_dir, sizeof store_dir, "%s/bench-ckpt", dir);
    llmt_ckpt_store_config sc = LLMT_CKPT_STORE_CONFIG_INIT;
    sc.keep = 1;
    llmt_ckpt_store *s = NULL;
    if (llmt_ckpt_store_open(&s, ctx, store_dir, &sc))
        die("open");
    llmt_train_state st = LLMT_TRAIN_STATE_INIT;
    st.model = m;
    st.optimizer = o;
    llmt_train_state ld = st;
    double params = (double)llmt_model_num_params(m);
    size_t state_bytes = (size_t)(params * 12);
    double gb = (double)state_bytes / 1e9;
    size_t cap = state_bytes + ((size_t)1 << 20); /* the files' headers and the MANIFEST too */
    char *buf = malloc(cap);
    if (!buf)
        die("malloc");
    memset(buf, 1, cap);
    printf("state: %.0fM parameters, %.2f GB (fp32 weights + AdamW moments); %d interleaved "
           "rounds, ratio = plain / ours (> 1: we are faster)\n", params / 1e6, gb, rounds);

    /* Each round: save and plain write, then load and plain read, the
     * plain side first in rounds 1, 3, ... (as printed), ours in 2, 4, ... The plain read
     * reads the checkpoint's own files (the same bytes in the same blocks:
     * the ratio is what the load adds to the read); the plain write's file
     * is read cold too, for comparison. */
    double save[BENCH_MAX_ROUNDS], write_t[BENCH_MAX_ROUNDS];
    double load[BENCH_MAX_ROUNDS], read_t[BENCH_MAX_ROUNDS];
    double file_t[BENCH_MAX_ROUNDS];
    for (int r = 0; r < rounds; r++) {
        int64_t step = r + 1;
        int plain_first = r % 2 == 0;
        char *path = plain_path[r % 2], *old = r ? plain_path[(r + 1) % 2] : NULL;
        snprintf(path, sizeof plain_path[0], "%s/bench-plain-%d.bin", dir, r + 1);
        const char *plain_file[1] = {path};
        ckpt_files f;
        ckpt_files_of(&f, store_dir, step);
        if (plain_first) {
            write_t[r] = plain_write(path, old, buf, state_bytes);
            save[r] = timed_save(s, &st, step);
            file_t[r] = plain_read(plain_file, 1, buf, cap);
            read_t[r] = plain_read(f.p, 3, buf, cap);
            load[r] = timed_load(s, &f, &ld, step);
        } else {
            save[r] = timed_save(s, &st, step);
            write_t[r] = plain_write(path, old, buf, state_bytes);
            load[r] = timed_load(s, &f, &ld, step);
            read_t[r] = plain_read(f.p, 3, buf, cap);
            file_t[r] = plain_read(plain_file, 1, buf, cap);
        }
        printf("round %d (%s first): save %5.2f s, plain write+fsync %5.2f s, ratio %.2f | load "
               "%5.2f s, plain read %5.2f s, ratio %.2f | plain write's file read %5.2f s\n", r + 1,
               plain_first ? "plain" : "ours", save[r], write_t[r], write_t[r] / save[r],
               load[r], read_t[r], read_t[r] / load[r], file_t[r]);
        fflush(stdout);
    }
    double t_save =
        bench_ratio_summary("sync save", save, "plain write+fsync", write_t, rounds, gb);
    double t_load =
        bench_ratio_summary("load (cold)", load, "plain read (cold)", read_t, rounds, gb);
    double file_med = bench_median(file_t, rounds);
    printf("the plain write's file, read cold: min %.2f s, median %.2f s (%.2f GB/s)\n", file_t[0],
           file_med, gb / file_med);

    /* save_async's blocking time vs a memcpy of the state (into touched memory). */
    char *copy = malloc(state_bytes);
    if (!copy)
        die("malloc");
    memset(copy, 2, state_bytes);
    double t = bench_now();
    memcpy(copy, buf, state_bytes);
    double t_memcpy = bench_now() - t;
    double t_async = 0;
    for (int i = 1; i <= 2; i++) { /* the first allocates the staging buffer */
        st.step = rounds + i;
        t = bench_now();
        if (llmt_ckpt_save_async(s, &st, LLMT_CKPT_DURABLE))
            die("save_async");
        t_async = bench_now() - t;
        if (llmt_ckpt_wait(s))
            die("wait");
    }
    llmt_ckpt_store_free(s);

    /* Resume: open, latest (verifying every byte), load, from a cold cache. */
    ckpt_files last;
    ckpt_files_of(&last, store_dir, rounds + 2);
    for (int i = 0; i < 3; i++)
        bench_drop_cache(last.path[i]);
    t = bench_now();
    int64_t step;
    int32_t tier;
    if (llmt_ckpt_store_open(&s, ctx, store_dir, &sc) ||
        llmt_ckpt_latest(s, &step, &tier, NULL, 0) ||
        llmt_ckpt_load(s, step, tier, &ld, NULL, 0, NULL))
        die("resume");
    double t_resume = bench_now() - t;

    printf("save_async blocks %.3f s, memcpy of the state %.3f s: %.2f x memcpy\n", t_async,
           t_memcpy, t_async / t_memcpy);
    printf("resume (open + latest with verification + load, cold) %.2f s\n", t_resume);
    /* LLaMA-7B: 6.74e9 parameters; bf16 weights 2 + fp32 master 4 + moments 8 = 14 B each. */
    double big = 6.738e9 * 14 / 1e9;
    printf("LLaMA-7B full state (bf16 weights, fp32 master and moments) %.0f GB at the median "
           "rates: save %.0f s, load %.0f s, save_async blocks %.0f s (at memcpy speed)\n",
           big, big / (gb / t_save), big / (gb / t_load), big / (gb / t_memcpy));
    llmt_ckpt_store_free(s);
    unlink(plain_path[(rounds - 1) % 2]);
    char cmd[1100];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", store_dir);
    if (system(cmd) != 0)
        fprintf(stderr, "bench_ckpt: cannot remove %s\n", store_dir);
    free(buf);
    free(copy);
    llmt_optimizer_free(o);
    llmt_model_free(m);
    llmt_context_free(ctx);
    return 0;
}
