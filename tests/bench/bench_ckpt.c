/* Checkpoint speed against plain file I/O of the same bytes, in one run:
 * synchronous save vs a sequential write + fsync; load (from a cold page
 * cache: the files' pages are dropped with posix_fadvise first) vs a plain
 * read; the time save_async blocks the caller vs a memcpy of the state; and
 * resume (open, latest with its full verification, load) in seconds.
 *
 * Usage: bench_ckpt DIR [hidden] — DIR on the file system to measure. The
 * state is an fp32 model with AdamW moments (12 bytes saved per parameter);
 * the default hidden size 1024 gives 142M parameters, 1.7 GB of state. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "bench_util.h"
#include "llmt/llmt.h"

static void die(const char *what)
{
    fprintf(stderr, "bench_ckpt: %s: %s\n", what, llmt_error_last());
    exit(1);
}

/* Drops a file's cached pages, so the next read comes from the disk. */
static void drop_cache(const char *path)
{
    int fd = open(path, O_RDONLY);
    if (fd >= 0) {
        fdatasync(fd);
        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        close(fd);
    }
}

static double plain_write(const char *path, const char *buf, size_t n)
{
    double t = bench_now();
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    for (size_t off = 0; off < n;) {
        ssize_t k = write(fd, buf + off, n - off < (64u << 20) ? n - off : (64u << 20));
        if (k <= 0)
            die("plain write");
        off += (size_t)k;
    }
    fsync(fd);
    close(fd);
    return bench_now() - t;
}

static double plain_read(const char *path, char *buf, size_t n)
{
    drop_cache(path);
    double t = bench_now();
    int fd = open(path, O_RDONLY);
    for (size_t off = 0; off < n;) {
        ssize_t k = read(fd, buf + off, n - off < (64u << 20) ? n - off : (64u << 20));
        if (k <= 0)
            die("plain read");
        off += (size_t)k;
    }
    close(fd);
    return bench_now() - t;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: bench_ckpt DIR [hidden]\n");
        return 2;
    }
    const char *dir = argv[1];
    int hidden = argc > 2 ? atoi(argv[2]) : 1024;
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
    char store_dir[1024], plain_path[1100];
    snprintf(store_dir, sizeof store_dir, "%s/bench-ckpt", dir);
    snprintf(plain_path, sizeof plain_path, "%s/bench-plain.bin", dir);
    llmt_ckpt_store_config sc = LLMT_CKPT_STORE_CONFIG_INIT;
    sc.keep = 1;
    llmt_ckpt_store *s = NULL;
    if (llmt_ckpt_store_open(&s, ctx, store_dir, &sc))
        die("open");
    llmt_train_state st = LLMT_TRAIN_STATE_INIT;
    st.model = m;
    st.optimizer = o;
    double params = (double)llmt_model_num_params(m);
    size_t state_bytes = (size_t)(params * 12);

    /* Synchronous save vs a plain write + fsync of as many bytes. */
    char *buf = malloc(state_bytes);
    memset(buf, 1, state_bytes);
    double t_plain_w = plain_write(plain_path, buf, state_bytes);
    st.step = 1;
    double t = bench_now();
    if (llmt_ckpt_save(s, &st, LLMT_CKPT_DURABLE))
        die("save");
    double t_save = bench_now() - t;

    /* Load from a cold cache vs a plain cold read. */
    char files[3][1200];
    snprintf(files[0], sizeof files[0], "%s/step-00000001/model.safetensors", store_dir);
    snprintf(files[1], sizeof files[1], "%s/step-00000001/optimizer.safetensors", store_dir);
    snprintf(files[2], sizeof files[2], "%s/step-00000001/MANIFEST", store_dir);
    double t_plain_r = plain_read(plain_path, buf, state_bytes);
    for (int i = 0; i < 3; i++)
        drop_cache(files[i]);
    llmt_train_state ld = st;
    t = bench_now();
    if (llmt_ckpt_load(s, 1, LLMT_CKPT_DURABLE, &ld, NULL, 0, NULL))
        die("load");
    double t_load = bench_now() - t;

    /* save_async's blocking time vs a memcpy of the state (into touched memory). */
    char *copy = malloc(state_bytes);
    memset(copy, 2, state_bytes);
    t = bench_now();
    memcpy(copy, buf, state_bytes);
    double t_memcpy = bench_now() - t;
    double t_async = 0;
    for (int i = 2; i <= 3; i++) { /* the first allocates the staging buffer */
        st.step = i;
        t = bench_now();
        if (llmt_ckpt_save_async(s, &st, LLMT_CKPT_DURABLE))
            die("save_async");
        t_async = bench_now() - t;
        if (llmt_ckpt_wait(s))
            die("wait");
    }
    llmt_ckpt_store_free(s);

    /* Resume: open, latest (verifying every byte), load, from a cold cache. */
    snprintf(files[0], sizeof files[0], "%s/step-00000003/model.safetensors", store_dir);
    snprintf(files[1], sizeof files[1], "%s/step-00000003/optimizer.safetensors", store_dir);
    for (int i = 0; i < 2; i++)
        drop_cache(files[i]);
    t = bench_now();
    int64_t step;
    int32_t tier;
    if (llmt_ckpt_store_open(&s, ctx, store_dir, &sc) || llmt_ckpt_latest(s, &step, &tier, NULL, 0) ||
        llmt_ckpt_load(s, step, tier, &ld, NULL, 0, NULL))
        die("resume");
    double t_resume = bench_now() - t;

    double gb = (double)state_bytes / 1e9;
    printf("state: %.0fM parameters, %.2f GB (fp32 weights + AdamW moments)\n", params / 1e6, gb);
    printf("sync save     %6.2f s  %6.2f GB/s   plain write+fsync %6.2f GB/s   ratio %.2f\n", t_save,
           gb / t_save, gb / t_plain_w, t_plain_w / t_save);
    printf("load (cold)   %6.2f s  %6.2f GB/s   plain read (cold) %6.2f GB/s   ratio %.2f\n", t_load,
           gb / t_load, gb / t_plain_r, t_plain_r / t_load);
    printf("save_async blocks %.3f s, memcpy of the state %.3f s: %.2f x memcpy\n", t_async,
           t_memcpy, t_async / t_memcpy);
    printf("resume (open + latest with verification + load, cold) %.2f s\n", t_resume);
    /* LLaMA-7B: 6.74e9 parameters; bf16 weights 2 + fp32 master 4 + moments 8 = 14 B each. */
    double big = 6.738e9 * 14 / 1e9;
    printf("LLaMA-7B full state (bf16 weights, fp32 master and moments) %.0f GB at these rates: "
           "save %.0f s, load %.0f s, save_async blocks %.0f s (at memcpy speed)\n",
           big, big / (gb / t_save), big / (gb / t_load), big / (gb / t_memcpy));
    llmt_ckpt_store_free(s);
    unlink(plain_path);
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
