/* Data: shards written byte by byte and read by the loader; shards written
 * by llmt_shard_write and decoded by hand; windows in order against the ones
 * computed by hand from the token arrays; the shuffle as a multiset per
 * epoch, its determinism and its dependence on the seed; save and restore of
 * the position at many points, at an epoch boundary, into a fresh loader and
 * refused over other data; one refusal per bad shard; header-less *.u16
 * files (nanoGPT's .bin) read and refused; the byte tokenizer. */
#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <xxhash.h>

#include "test_util.h"

#include "llmt/llmt.h"
#include "test_context.h"
#include "test_rand.h"
#include "util/fsutil.h"

static char dir[64]; /* made by setup, removed by teardown */

static const char *path_of(const char *name)
{
    static char path[4][PATH_MAX];
    static int next;
    char *p = path[next++ % 4];
    snprintf(p, PATH_MAX, "%s/%s", dir, name);
    return p;
}

static int setup(void **state)
{
    (void)state;
    strcpy(dir, "/tmp/llmt-data-XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    llmt_remove_tree(dir);
    return 0;
}

/* The loader getters' values, asserting success. */
#define GETTER(name)                                                   \
    static uint64_t get_##name(const llmt_loader *l)                   \
    {                                                                  \
        uint64_t v = 0;                                                \
        assert_int_equal(llmt_loader_##name(l, &v), LLMT_OK);          \
        return v;                                                      \
    }
GETTER(epoch)
GETTER(windows_per_epoch)
GETTER(tokens_per_epoch)
GETTER(num_shards)

/* ---- Shards by hand ---- */

static void le32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static uint32_t get32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Writes a shard with fwrite: the 1024-byte header (magic, version, count,
 * zeros), then n tokens of width bytes each, little-endian, then extra zero
 * bytes. */
static void write_raw(const char *path, uint32_t magic, uint32_t version, uint32_t count,
                      const uint32_t *tok, size_t n, int width, size_t extra)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    unsigned char h[1024] = {0};
    le32(h, magic);
    le32(h + 4, version);
    le32(h + 8, count);
    assert_int_equal(fwrite(h, 1, sizeof h, f), sizeof h);
    for (size_t i = 0; i < n; i++) {
        unsigned char b[4];
        le32(b, tok[i]);
        assert_int_equal(fwrite(b, 1, (size_t)width, f), (size_t)width);
    }
    for (size_t i = 0; i < extra; i++)
        assert_int_equal(fputc(0, f), 0);
    assert_int_equal(fclose(f), 0);
}

/* A well-formed shard of n tokens of the given version. */
static void write_good(const char *path, const uint32_t *tok, size_t n, int version)
{
    write_raw(path, 20240520, (uint32_t)version, (uint32_t)n, tok, n, version == 1 ? 2 : 4, 0);
}

static unsigned char *read_file(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    long size = ftell(f);
    assert_true(size >= 0);
    rewind(f);
    unsigned char *buf = malloc((size_t)size + 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)size, f), (size_t)size);
    fclose(f);
    *n = (size_t)size;
    return buf;
}

/* ---- A data set of several shards and its windows computed by hand ---- */

#define MAX_SHARDS 8

typedef struct dataset {
    size_t n_shards;
    size_t n_tokens[MAX_SHARDS];
    uint32_t *tokens[MAX_SHARDS];
    char *paths[MAX_SHARDS];
    int t;                 /* seq_len */
    size_t n_windows;      /* per epoch */
    int32_t *windows;      /* n_windows x (t + 1): shard 0's windows, then shard 1's, ... */
    size_t *window_shard;  /* the shard of each window */
} dataset;

/* Shard k of sizes[k] tokens, token i of shard k = 1000 k + i (so every
 * window is told apart by its content), written as version 1 (odd k as
 * version 2 when mixed) under name_k.bin. */
static dataset make_dataset(const char *name, const size_t *sizes, size_t n_shards, int t,
                            int mixed)
{
    dataset d = {.n_shards = n_shards, .t = t};
    size_t total = 0;
    for (size_t k = 0; k < n_shards; k++) {
        d.n_tokens[k] = sizes[k];
        d.tokens[k] = malloc(sizes[k] * sizeof(uint32_t));
        for (size_t i = 0; i < sizes[k]; i++)
            d.tokens[k][i] = (uint32_t)(1000 * k + i);
        char file[64];
        snprintf(file, sizeof file, "%s_%zu.bin", name, k);
        d.paths[k] = strdup(path_of(file));
        write_good(d.paths[k], d.tokens[k], sizes[k], mixed && k % 2 ? 2 : 1);
        total += (sizes[k] - 1) / (size_t)t;
    }
    d.n_windows = total;
    d.windows = malloc(total * (size_t)(t + 1) * sizeof(int32_t));
    d.window_shard = malloc(total * sizeof(size_t));
    size_t w = 0;
    for (size_t k = 0; k < n_shards; k++)
        for (size_t j = 0; j < (sizes[k] - 1) / (size_t)t; j++, w++) {
            for (int i = 0; i <= t; i++)
                d.windows[w * (size_t)(t + 1) + (size_t)i] =
                    (int32_t)d.tokens[k][j * (size_t)t + (size_t)i];
            d.window_shard[w] = k;
        }
    return d;
}

static void free_dataset(dataset *d)
{
    for (size_t k = 0; k < d->n_shards; k++) {
        free(d->tokens[k]);
        free(d->paths[k]);
    }
    free(d->windows);
    free(d->window_shard);
}

static llmt_loader *open_dataset(const dataset *d, uint64_t seed, int batch, int shuffle)
{
    llmt_context *ctx = test_context(1, seed);
    llmt_loader_config c = LLMT_LOADER_CONFIG_INIT;
    c.batch_size = batch;
    c.seq_len = d->t;
    c.vocab_size = 65536 + 1000;
    c.shuffle = shuffle;
    llmt_loader *l = NULL;
    int rc = llmt_loader_open(&l, ctx, (const char *const *)d->paths, d->n_shards, &c);
    if (rc)
        fail_msg("llmt_loader_open: %s", llmt_error_last());
    llmt_context_free(ctx); /* the loader keeps no reference to it */
    return l;
}

/* Reads n windows (a multiple of the batch) into out, n x (t + 1), checking
 * that every row's targets are its tokens shifted by one. */
static void read_windows(llmt_loader *l, int batch, int t, size_t n, int32_t *out)
{
    assert_int_equal(n % (size_t)batch, 0);
    size_t bt = (size_t)batch * (size_t)t;
    int32_t *in = malloc(bt * sizeof *in), *tg = malloc(bt * sizeof *tg);
    for (size_t w = 0; w < n; w += (size_t)batch) {
        int rc = llmt_loader_next(l, in, tg, bt);
        if (rc)
            fail_msg("llmt_loader_next: %s", llmt_error_last());
        for (int b = 0; b < batch; b++) {
            const int32_t *x = in + (size_t)b * (size_t)t, *y = tg + (size_t)b * (size_t)t;
            int32_t *o = out + (w + (size_t)b) * (size_t)(t + 1);
            for (int i = 0; i < t; i++) {
                if (i + 1 < t)
                    assert_int_equal(y[i], x[i + 1]);
                o[i] = x[i];
            }
            o[t] = y[t - 1];
        }
    }
    free(in);
    free(tg);
}

/* The hand-computed window equal to w, or -1. */
static long find_window(const dataset *d, const int32_t *w)
{
    size_t len = (size_t)(d->t + 1);
    for (size_t i = 0; i < d->n_windows; i++)
        if (!memcmp(d->windows + i * len, w, len * sizeof *w))
            return (long)i;
    return -1;
}

/* Asserts that the n_windows windows at got are the data set's windows
 * exactly once each, shards in contiguous runs; the visit order (indices
 * into d->windows) into order. */
static void assert_one_epoch(const dataset *d, const int32_t *got, size_t *order)
{
    size_t len = (size_t)(d->t + 1);
    int *seen = calloc(d->n_windows, sizeof *seen);
    int shard_done[MAX_SHARDS] = {0};
    for (size_t i = 0; i < d->n_windows; i++) {
        long w = find_window(d, got + i * len);
        if (w < 0)
            fail_msg("window %zu of the epoch (first token %d) is not a window of the data", i,
                     got[i * len]);
        assert_int_equal(seen[w], 0);
        seen[w] = 1;
        order[i] = (size_t)w;
        size_t k = d->window_shard[w];
        if (i > 0 && d->window_shard[order[i - 1]] != k) {
            assert_int_equal(shard_done[k], 0); /* a shard's windows come in one run */
            shard_done[d->window_shard[order[i - 1]]] = 1;
        }
    }
    free(seen);
}

/* A header-less file (nanoGPT's train.bin): n little-endian uint16 tokens
 * and nothing else, then extra stray bytes. */
static void write_headerless(const char *path, const uint32_t *tok, size_t n, size_t extra)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    for (size_t i = 0; i < n; i++) {
        unsigned char b[2] = {(unsigned char)tok[i], (unsigned char)(tok[i] >> 8)};
        assert_int_equal(fwrite(b, 1, 2, f), 2);
    }
    for (size_t i = 0; i < extra; i++)
        assert_int_equal(fputc(0, f), 0);
    assert_int_equal(fclose(f), 0);
}

/* ---- Tests ---- */

static void test_read_hand_written(void **state)
{
    (void)state;
    /* Version 1 and version 2 (with tokens past 65535), 3 tokens left over. */
    uint32_t a[11], b[9];
    for (int i = 0; i < 11; i++)
        a[i] = (uint32_t)(65535 - 7 * i);
    for (int i = 0; i < 9; i++)
        b[i] = (uint32_t)(70000 + 13 * i);
    const char *pa = path_of("a.bin"), *pb = path_of("b.bin");
    write_good(pa, a, 11, 1);
    write_good(pb, b, 9, 2);
    llmt_context *ctx = test_context(1, 3);
    llmt_loader_config c = LLMT_LOADER_CONFIG_INIT;
    c.batch_size = 1;
    c.seq_len = 4;
    c.vocab_size = 80000;
    c.shuffle = 0;
    const char *paths[] = {pa, pb};
    llmt_loader *l = NULL;
    assert_int_equal(llmt_loader_open(&l, ctx, paths, 2, &c), LLMT_OK);
    assert_int_equal(get_num_shards(l), 2);
    assert_int_equal(get_windows_per_epoch(l), 2 + 2); /* (11-1)/4, (9-1)/4 */
    assert_int_equal(get_tokens_per_epoch(l), 4 * 4);
    /* Windows start at 0, 4 of each shard; inputs w[0..4), targets w[1..4]. */
    const uint32_t *src[] = {a, a, b, b};
    const int start[] = {0, 4, 0, 4};
    for (int w = 0; w < 4; w++) {
        int32_t x[4], y[4];
        assert_int_equal(llmt_loader_next(l, x, y, 4), LLMT_OK);
        for (int i = 0; i < 4; i++) {
            assert_int_equal(x[i], src[w][start[w] + i]);
            assert_int_equal(y[i], src[w][start[w] + i + 1]);
        }
    }
    assert_int_equal(get_epoch(l), 1);
    llmt_loader_free(l);
    llmt_loader_free(NULL);
    llmt_context_free(ctx);
}

/* A *.u16 file is read as a header-less uint16 array (nanoGPT's .bin),
 * beside an llm.c shard and through a glob; the same bytes named *.bin are
 * an llm.c shard with a bad magic, refused with a pointer to the rule. */
static void test_read_headerless(void **state)
{
    (void)state;
    /* 11 tokens; the first two would be an llm.c magic's low half if a
     * header were wrongly assumed. */
    uint32_t a[11] = {0x6D8, 0x134, 65535, 0, 7, 50000, 1, 2, 3, 4, 5}, b[9];
    for (int i = 0; i < 9; i++)
        b[i] = (uint32_t)(1000 + 13 * i);
    const char *pa = path_of("train.u16"), *pb = path_of("b.bin");
    write_headerless(pa, a, 11, 0);
    write_good(pb, b, 9, 1);
    llmt_context *ctx = test_context(1, 3);
    llmt_loader_config c = LLMT_LOADER_CONFIG_INIT;
    c.batch_size = 1;
    c.seq_len = 4;
    c.vocab_size = 65536;
    c.shuffle = 0;
    const char *paths[] = {pa, pb};
    llmt_loader *l = NULL;
    assert_int_equal(llmt_loader_open(&l, ctx, paths, 2, &c), LLMT_OK);
    assert_int_equal(get_windows_per_epoch(l), 2 + 2); /* (11-1)/4, (9-1)/4 */
    const uint32_t *src[] = {a, a, b, b};
    const int start[] = {0, 4, 0, 4};
    for (int w = 0; w < 4; w++) {
        int32_t x[4], y[4];
        assert_int_equal(llmt_loader_next(l, x, y, 4), LLMT_OK);
        for (int i = 0; i < 4; i++) {
            assert_int_equal(x[i], src[w][start[w] + i]);
            assert_int_equal(y[i], src[w][start[w] + i + 1]);
        }
    }
    llmt_loader_free(l);
    assert_int_equal(llmt_loader_open_glob(&l, ctx, path_of("*.u16"), &c), LLMT_OK);
    assert_int_equal(get_num_shards(l), 1);
    int32_t x[4], y[4];
    assert_int_equal(llmt_loader_next(l, x, y, 4), LLMT_OK);
    assert_int_equal(x[2], 65535);
    llmt_loader_free(l);
    /* The same bytes named .bin: not guessed to be header-less. */
    const char *as_bin = path_of("train.bin");
    write_headerless(as_bin, a, 11, 1024);
    assert_int_equal(llmt_loader_open(&l, ctx, &as_bin, 1, &c), LLMT_ECORRUPT);
    assert_contains(llmt_error_last(), "magic");
    assert_contains(llmt_error_last(), "*.u16");
    llmt_context_free(ctx);
}

static void test_shard_write_decoded_by_hand(void **state)
{
    (void)state;
    int32_t tok[70000];
    for (int i = 0; i < 70000; i++)
        tok[i] = (i * 7919) % 65536;
    for (int version = 1; version <= 2; version++) {
        const char *p = path_of(version == 1 ? "w1.bin" : "w2.bin");
        size_t n = version == 1 ? 70000 : 1000;
        if (version == 2)
            for (int i = 0; i < 1000; i++)
                tok[i] = i % 3 ? i * 2000003 : i;
        assert_int_equal(llmt_shard_write(p, tok, n, version), LLMT_OK);
        size_t size;
        unsigned char *f = read_file(p, &size);
        size_t width = version == 1 ? 2 : 4;
        assert_int_equal(size, 1024 + n * width);
        assert_int_equal(get32(f), 20240520);
        assert_int_equal(get32(f + 4), (uint32_t)version);
        assert_int_equal(get32(f + 8), n);
        for (int i = 3; i < 256; i++)
            assert_int_equal(get32(f + 4 * i), 0);
        for (size_t i = 0; i < n; i++) {
            const unsigned char *q = f + 1024 + i * width;
            uint32_t v = version == 1 ? (uint32_t)q[0] | (uint32_t)q[1] << 8 : get32(q);
            assert_int_equal(v, (uint32_t)tok[i]);
        }
        free(f);
        struct stat st;
        assert_int_equal(stat(p, &st), 0);
        assert_int_equal(st.st_mode & 0777, 0644);
    }
    /* Replacing a file; an empty shard; no temporary file is left. */
    const char *p = path_of("w1.bin");
    assert_int_equal(llmt_shard_write(p, tok, 0, 1), LLMT_OK);
    size_t size;
    unsigned char *f = read_file(p, &size);
    assert_int_equal(size, 1024);
    assert_int_equal(get32(f + 8), 0);
    free(f);
    DIR *h = opendir(dir);
    struct dirent *e;
    int files = 0;
    while ((e = readdir(h)))
        if (e->d_name[0] != '.') {
            files++;
            assert_null(strstr(e->d_name, "tmp"));
        }
    closedir(h);
    assert_int_equal(files, 2);

    /* Refusals name the position; nothing is written. */
    const char *q = path_of("bad.bin");
    int32_t bad[5] = {1, 2, 3, 65536, 4};
    assert_int_equal(llmt_shard_write(q, bad, 5, 1), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "tokens[3] = 65536");
    assert_contains(llmt_error_last(), "bad.bin");
    bad[3] = 7;
    bad[1] = -1;
    assert_int_equal(llmt_shard_write(q, bad, 5, 1), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "tokens[1] = -1");
    assert_int_equal(llmt_shard_write(q, bad, 5, 2), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "tokens[1] = -1");
    assert_int_equal(access(q, F_OK), -1);
    assert_int_equal(llmt_shard_write(q, bad, 5, 3), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "version = 3");
    assert_int_equal(llmt_shard_write(q, bad, (size_t)INT32_MAX + 1, 1), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "2147483648");
    assert_int_equal(llmt_shard_write(q, NULL, 5, 1), LLMT_EINVAL);
    assert_int_equal(llmt_shard_write(NULL, bad, 5, 1), LLMT_EINVAL);
    assert_int_equal(access(q, F_OK), -1);
    assert_int_equal(llmt_shard_write(path_of("no/such/dir.bin"), bad + 2, 3, 1), LLMT_EIO);
    assert_contains(llmt_error_last(), "no/such/dir.bin");

    /* What the writer wrote, the loader reads back. */
    int32_t small[9] = {5, 4, 3, 2, 1, 0, 9, 8, 7};
    const char *r = path_of("r.bin");
    assert_int_equal(llmt_shard_write(r, small, 9, 2), LLMT_OK);
    llmt_context *ctx = test_context(1, 1);
    llmt_loader_config c = LLMT_LOADER_CONFIG_INIT;
    c.batch_size = 2;
    c.seq_len = 4;
    c.vocab_size = 10;
    c.shuffle = 0;
    llmt_loader *l = NULL;
    assert_int_equal(llmt_loader_open(&l, ctx, &r, 1, &c), LLMT_OK);
    int32_t x[8], y[8];
    assert_int_equal(llmt_loader_next(l, x, y, 8), LLMT_OK);
    for (int i = 0; i < 8; i++) {
        assert_int_equal(x[i], small[i]);
        assert_int_equal(y[i], small[i + 1]);
    }
    llmt_loader_free(l);
    llmt_context_free(ctx);
}

static void test_windows_in_order(void **state)
{
    (void)state;
    /* T = 3: 10, 17, 7, 4 tokens give 3, 5, 2, 1 windows; B = 4 crosses
     * shard and epoch boundaries at every offset. */
    const size_t sizes[] = {10, 17, 7, 4};
    dataset d = make_dataset("ord", sizes, 4, 3, 1);
    assert_int_equal(d.n_windows, 11);
    llmt_loader *l = open_dataset(&d, 5, 4, 0);
    assert_int_equal(get_windows_per_epoch(l), 11);
    assert_int_equal(get_tokens_per_epoch(l), 33);
    size_t n = 4 * 11; /* four epochs */
    int32_t *got = malloc(n * 4 * sizeof *got);
    for (size_t w = 0; w < n; w += 4) {
        read_windows(l, 4, 3, 4, got + w * 4);
        assert_int_equal(get_epoch(l), (w + 4) / 11);
    }
    for (size_t w = 0; w < n; w++)
        for (int i = 0; i < 4; i++)
            assert_int_equal(got[w * 4 + (size_t)i], d.windows[(w % 11) * 4 + (size_t)i]);
    free(got);
    llmt_loader_free(l);
    free_dataset(&d);
}

static void test_shuffle_epochs(void **state)
{
    (void)state;
    const size_t sizes[] = {41, 26, 9, 33, 17};
    dataset d = make_dataset("shuf", sizes, 5, 4, 1);
    size_t w = d.n_windows, len = 5;
    assert_int_equal(w, 10 + 6 + 2 + 8 + 4);
    llmt_loader *l = open_dataset(&d, 11, 1, 1);
    int32_t *got = malloc(3 * w * len * sizeof *got);
    size_t *order = malloc(3 * w * sizeof *order);
    for (int e = 0; e < 3; e++) {
        assert_int_equal(get_epoch(l), e);
        read_windows(l, 1, 4, w, got + (size_t)e * w * len);
        assert_one_epoch(&d, got + (size_t)e * w * len, order + (size_t)e * w);
    }
    assert_int_equal(get_epoch(l), 3);
    /* Each epoch is shuffled anew: the orders differ, and none is the file order. */
    assert_memory_not_equal(order, order + w, w * sizeof *order);
    assert_memory_not_equal(order + w, order + 2 * w, w * sizeof *order);
    size_t identity = 0;
    for (size_t i = 0; i < w; i++)
        identity += order[i] == i;
    assert_true(identity < w);
    /* The shard order is drawn anew per epoch: the runs' shard sequences of
     * the three epochs are not all the same, nor all the file order. */
    size_t runs[3][MAX_SHARDS] = {{0}};
    for (int e = 0; e < 3; e++) {
        const size_t *o = order + (size_t)e * w;
        size_t r = 0;
        for (size_t i = 0; i < w; i++)
            if (i == 0 || d.window_shard[o[i]] != d.window_shard[o[i - 1]])
                runs[e][r++] = d.window_shard[o[i]];
        assert_int_equal(r, 5);
    }
    static const size_t file_order[5] = {0, 1, 2, 3, 4};
    assert_true(memcmp(runs[0], runs[1], 5 * sizeof(size_t)) ||
                memcmp(runs[1], runs[2], 5 * sizeof(size_t)));
    assert_true(memcmp(runs[0], file_order, sizeof file_order) ||
                memcmp(runs[1], file_order, sizeof file_order) ||
                memcmp(runs[2], file_order, sizeof file_order));
    /* Within a shard the windows are shuffled too: in every epoch, no shard
     * of 4 windows or more has its windows in file order. */
    for (int e = 0; e < 3; e++) {
        const size_t *o = order + (size_t)e * w;
        for (size_t i = 0; i < w;) {
            size_t j = i + 1, increasing = 1;
            for (; j < w && d.window_shard[o[j]] == d.window_shard[o[i]]; j++)
                increasing &= o[j] > o[j - 1];
            if (j - i >= 4 && increasing)
                fail_msg("epoch %d: shard %zu's windows come in file order", e,
                         d.window_shard[o[i]]);
            i = j;
        }
    }

    /* The same seed gives the same stream, over a loader with another batch. */
    llmt_loader *same = open_dataset(&d, 11, 3, 1);
    int32_t *again = malloc(3 * w * len * sizeof *again);
    read_windows(same, 3, 4, 3 * w, again);
    assert_memory_equal(got, again, 3 * w * len * sizeof *got);
    llmt_loader_free(same);

    /* Another seed, another stream, still one epoch each. */
    llmt_loader *other = open_dataset(&d, 12, 1, 1);
    read_windows(other, 1, 4, w, again);
    size_t *order2 = malloc(w * sizeof *order2);
    assert_one_epoch(&d, again, order2);
    assert_memory_not_equal(order, order2, w * sizeof *order);
    llmt_loader_free(other);

    free(order2);
    free(again);
    free(order);
    free(got);
    llmt_loader_free(l);
    free_dataset(&d);
}

/* Opens a loader over d, reads n windows with batch 1, then returns it. */
static llmt_loader *loader_at(const dataset *d, uint64_t seed, int shuffle, size_t n)
{
    llmt_loader *l = open_dataset(d, seed, 1, shuffle);
    int32_t *skip = malloc((n ? n : 1) * (size_t)(d->t + 1) * sizeof *skip);
    read_windows(l, 1, d->t, n, skip);
    free(skip);
    return l;
}

static void check_save_restore(int shuffle)
{
    const size_t sizes[] = {23, 14, 31, 8};
    dataset d = make_dataset(shuffle ? "sr1" : "sr0", sizes, 4, 3, 0);
    size_t w = d.n_windows, len = 4, total = 4 * w;
    assert_int_equal(w, 7 + 4 + 10 + 2);
    /* The reference: four epochs read straight. */
    llmt_loader *ref_l = open_dataset(&d, 21, 1, shuffle);
    int32_t *ref = malloc(total * len * sizeof *ref);
    read_windows(ref_l, 1, 3, total, ref);
    llmt_loader_free(ref_l);
    int32_t *got = malloc(total * len * sizeof *got);

    uint64_t rs = 99;
    for (int trial = 0; trial < 40; trial++) {
        /* Points: random, both ends of an epoch, the start. */
        size_t p = trial == 0 ? 0 : trial == 1 ? w : trial == 2 ? 2 * w : trial == 3 ? w - 1
                                 : (size_t)(trand_u64(&rs) % (3 * w));
        llmt_loader *a = loader_at(&d, 21, shuffle, p);
        llmt_loader_state s = LLMT_LOADER_STATE_INIT;
        assert_int_equal(llmt_loader_get_state(a, &s), LLMT_OK);
        assert_int_equal(s.windows_consumed, p);
        assert_int_equal(s.epoch, p / w);
        assert_int_equal(s.seed, 21);
        if (p % w == 0) { /* exactly at an epoch boundary */
            assert_int_equal(s.shard_cursor, 0);
            assert_int_equal(s.window_cursor, 0);
        }
        /* Read on, come back, read the same again. */
        size_t m = 1 + (size_t)(trand_u64(&rs) % (total - p - 1));
        read_windows(a, 1, 3, m, got);
        assert_memory_equal(got, ref + p * len, m * len * sizeof *got);
        assert_int_equal(llmt_loader_set_state(a, &s), LLMT_OK);
        read_windows(a, 1, 3, m, got);
        assert_memory_equal(got, ref + p * len, m * len * sizeof *got);

        /* Into a fresh loader made from a context of another seed, with another batch. */
        llmt_loader *b = open_dataset(&d, 1234, 2, shuffle);
        assert_int_equal(llmt_loader_set_state(b, &s), LLMT_OK);
        size_t rest = (total - p) / 2 * 2;
        read_windows(b, 2, 3, rest, got);
        assert_memory_equal(got, ref + p * len, rest * len * sizeof *got);
        llmt_loader_state s2 = LLMT_LOADER_STATE_INIT;
        assert_int_equal(llmt_loader_get_state(b, &s2), LLMT_OK);
        assert_int_equal(s2.windows_consumed, p + rest);
        llmt_loader_free(b);
        llmt_loader_free(a);
    }

    /* Twice within one epoch (epoch 1), restored in the other order. */
    llmt_loader *a = loader_at(&d, 21, shuffle, w + 3);
    llmt_loader_state s1 = LLMT_LOADER_STATE_INIT, s2 = LLMT_LOADER_STATE_INIT;
    assert_int_equal(llmt_loader_get_state(a, &s1), LLMT_OK);
    read_windows(a, 1, 3, 9, got);
    assert_int_equal(llmt_loader_get_state(a, &s2), LLMT_OK);
    assert_int_equal(s1.epoch, 1);
    assert_int_equal(s2.epoch, 1);
    llmt_loader *b = open_dataset(&d, 21, 1, shuffle);
    assert_int_equal(llmt_loader_set_state(b, &s2), LLMT_OK);
    read_windows(b, 1, 3, 2 * w, got);
    assert_memory_equal(got, ref + (w + 12) * len, 2 * w * len * sizeof *got);
    assert_int_equal(llmt_loader_set_state(b, &s1), LLMT_OK);
    read_windows(b, 1, 3, 2 * w, got);
    assert_memory_equal(got, ref + (w + 3) * len, 2 * w * len * sizeof *got);
    llmt_loader_free(b);

    /* Refused: other files, another T, another shuffle flag, a bad cursor;
     * the loader then keeps its position. */
    llmt_loader_state keep = LLMT_LOADER_STATE_INIT;
    assert_int_equal(llmt_loader_get_state(a, &keep), LLMT_OK);
    llmt_context *ctx = test_context(1, 21);
    llmt_loader_config c = LLMT_LOADER_CONFIG_INIT;
    c.batch_size = 1;
    c.seq_len = 3;
    c.vocab_size = 66536;
    c.shuffle = shuffle;
    llmt_loader *o = NULL;
    assert_int_equal(llmt_loader_open(&o, ctx, (const char *const *)d.paths, 3, &c), LLMT_OK);
    assert_int_equal(llmt_loader_set_state(o, &s1), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "fingerprint");
    assert_contains(llmt_error_last(), "other data");
    llmt_loader_free(o);
    /* The same sizes under other names. */
    const size_t sizes2[] = {23, 14, 31, 8};
    dataset d2 = make_dataset(shuffle ? "sr1x" : "sr0x", sizes2, 4, 3, 0);
    assert_int_equal(llmt_loader_open(&o, ctx, (const char *const *)d2.paths, 4, &c), LLMT_OK);
    assert_int_equal(llmt_loader_set_state(o, &s1), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "fingerprint");
    llmt_loader_free(o);
    free_dataset(&d2);
    c.seq_len = 2;
    assert_int_equal(llmt_loader_open(&o, ctx, (const char *const *)d.paths, 4, &c), LLMT_OK);
    assert_int_equal(llmt_loader_set_state(o, &s1), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "seq_len");
    llmt_loader_free(o);
    c.seq_len = 3;
    c.shuffle = !shuffle;
    assert_int_equal(llmt_loader_open(&o, ctx, (const char *const *)d.paths, 4, &c), LLMT_OK);
    assert_int_equal(llmt_loader_set_state(o, &s1), LLMT_EINVAL);
    llmt_loader_free(o);

    llmt_loader_state bad = s1;
    bad.windows_consumed++;
    assert_int_equal(llmt_loader_set_state(a, &bad), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "windows_consumed");
    bad = s1;
    bad.shard_cursor = 4;
    assert_int_equal(llmt_loader_set_state(a, &bad), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "shard_cursor = 4");
    bad = s1;
    bad.window_cursor = 10;
    assert_int_equal(llmt_loader_set_state(a, &bad), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "window_cursor = 10");
    bad = s1;
    bad.version = 2;
    assert_int_equal(llmt_loader_set_state(a, &bad), LLMT_EVERSION);
    llmt_loader_state newer = {.version = 2};
    assert_int_equal(llmt_loader_get_state(a, &newer), LLMT_EVERSION);
    if (shuffle) { /* a state of another seed over the same cursors */
        bad = s1;
        bad.seed = 22;
        bad.window_cursor = 0;
        bad.shard_cursor = 3;
        /* windows_consumed no longer matches unless shard orders agree: either
         * refused, or accepted and then consistent with itself. */
        if (llmt_loader_set_state(a, &bad) == LLMT_OK) {
            assert_int_equal(llmt_loader_set_state(a, &keep), LLMT_OK);
        }
    }
    llmt_loader_state now = LLMT_LOADER_STATE_INIT;
    assert_int_equal(llmt_loader_get_state(a, &now), LLMT_OK);
    assert_int_equal(now.epoch, keep.epoch);
    assert_int_equal(now.shard_cursor, keep.shard_cursor);
    assert_int_equal(now.window_cursor, keep.window_cursor);
    assert_int_equal(now.windows_consumed, keep.windows_consumed);
    assert_int_equal(now.seed, keep.seed);
    assert_int_equal(now.fingerprint, keep.fingerprint);
    read_windows(a, 1, 3, w, got);
    assert_memory_equal(got, ref + (w + 12) * len, w * len * sizeof *got);
    assert_int_equal(llmt_loader_set_state(NULL, &s1), LLMT_EINVAL);
    assert_int_equal(llmt_loader_set_state(a, NULL), LLMT_EINVAL);
    assert_int_equal(llmt_loader_get_state(a, NULL), LLMT_EINVAL);

    llmt_loader_free(a);
    llmt_context_free(ctx);
    free(got);
    free(ref);
    free_dataset(&d);
}

static void test_save_restore_shuffled(void **state)
{
    (void)state;
    check_save_restore(1);
}

static void test_save_restore_in_order(void **state)
{
    (void)state;
    check_save_restore(0);
}

/* Appends v to buf at *at as 8 little-endian bytes. */
static void put_u64(unsigned char *buf, size_t *at, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        buf[(*at)++] = (unsigned char)(v >> (8 * i));
}

/* Appends n bytes to buf at *at. */
static void put_bytes(unsigned char *buf, size_t *at, const void *p, size_t n)
{
    memcpy(buf + *at, p, n);
    *at += n;
}

/* A loader's fingerprint as docs/data.md gives it, computed here over one
 * buffer: legacy (tag llmt-loader-1) each path as given and its size, else
 * (llmt-loader-2) each base name, size and first 4096 bytes; then t and the
 * shuffle flag. */
static uint64_t fingerprint_by_hand(char *const *paths, size_t n, int t, int shuffle, int legacy)
{
    size_t cap = 64, at = 0;
    for (size_t k = 0; k < n; k++)
        cap += strlen(paths[k]) + 16 + 4096;
    unsigned char *buf = malloc(cap);
    assert_non_null(buf);
    const char *tag = legacy ? "llmt-loader-1" : "llmt-loader-2";
    put_bytes(buf, &at, tag, strlen(tag) + 1);
    put_u64(buf, &at, n);
    for (size_t k = 0; k < n; k++) {
        size_t bytes = 0;
        unsigned char *file = read_file(paths[k], &bytes);
        const char *slash = strrchr(paths[k], '/');
        const char *name = legacy || !slash ? paths[k] : slash + 1;
        put_u64(buf, &at, strlen(name));
        put_bytes(buf, &at, name, strlen(name));
        put_u64(buf, &at, bytes);
        if (!legacy)
            put_bytes(buf, &at, file, bytes < 4096 ? bytes : 4096);
        free(file);
    }
    put_u64(buf, &at, (uint64_t)t);
    put_u64(buf, &at, (uint64_t)shuffle);
    uint64_t h = XXH3_64bits(buf, at);
    free(buf);
    return h;
}

/* A copy of the file from into to. */
static void copy_file(const char *from, const char *to)
{
    size_t n = 0;
    unsigned char *bytes = read_file(from, &n);
    FILE *f = fopen(to, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(bytes, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
    free(bytes);
}

/* The fingerprint holds the shards' names, sizes and first bytes, not
 * their directories: a position restores over copies of the files
 * elsewhere (a run directory moved, or its data named by another path), and
 * goes on with the windows the original loader serves; a copy with one
 * token changed is refused; a state saved before (the legacy fingerprint,
 * computed here) still restores. Both fingerprints are checked against
 * this file's computation from the documented recipe. */
static void test_restore_where_the_files_moved(void **state)
{
    (void)state;
    const size_t sizes[] = {40, 25, 31};
    dataset d = make_dataset("mv", sizes, 3, 3, 1);
    llmt_loader *a = open_dataset(&d, 5, 2, 1);
    int32_t before[6 * 4], after[6 * 4], moved[6 * 4];
    read_windows(a, 2, 3, 6, before);
    llmt_loader_state s = LLMT_LOADER_STATE_INIT;
    assert_int_equal(llmt_loader_get_state(a, &s), LLMT_OK);
    assert_true(s.fingerprint == fingerprint_by_hand(d.paths, 3, 3, 1, 0));
    read_windows(a, 2, 3, 6, after);

    dataset copy = d; /* the same tokens and windows, at other paths */
    assert_int_equal(mkdir(path_of("moved"), 0700), 0);
    for (size_t k = 0; k < 3; k++) {
        char file[64];
        snprintf(file, sizeof file, "moved/mv_%zu.bin", k);
        copy.paths[k] = strdup(path_of(file));
        copy_file(d.paths[k], copy.paths[k]);
    }
    llmt_loader *b = open_dataset(&copy, 9, 2, 1);
    assert_int_equal(llmt_loader_set_state(b, &s), LLMT_OK);
    read_windows(b, 2, 3, 6, moved);
    assert_memory_equal(moved, after, sizeof after);
    llmt_loader_free(b);

    /* Saved with the legacy fingerprint (paths as given): still restores. */
    llmt_loader_state legacy = s;
    legacy.fingerprint = fingerprint_by_hand(d.paths, 3, 3, 1, 1);
    assert_true(legacy.fingerprint != s.fingerprint);
    b = open_dataset(&d, 9, 2, 1);
    assert_int_equal(llmt_loader_set_state(b, &legacy), LLMT_OK);
    read_windows(b, 2, 3, 6, moved);
    assert_memory_equal(moved, after, sizeof after);
    llmt_loader_free(b);

    /* One token of a copy changed (same name, same size): refused. */
    uint32_t changed[40];
    memcpy(changed, d.tokens[0], sizeof changed);
    changed[7] += 1;
    write_good(copy.paths[0], changed, 40, 1);
    b = open_dataset(&copy, 9, 2, 1);
    assert_int_equal(llmt_loader_set_state(b, &s), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "fingerprint");
    llmt_loader_free(b);
    for (size_t k = 0; k < 3; k++)
        free(copy.paths[k]);
    llmt_loader_free(a);
    free_dataset(&d);
}

static void test_restore_adopts_seed(void **state)
{
    (void)state;
    const size_t sizes[] = {50, 30};
    dataset d = make_dataset("seed", sizes, 2, 4, 0);
    size_t w = d.n_windows, len = 5;
    llmt_loader *a = loader_at(&d, 7, 1, 5);
    llmt_loader_state s = LLMT_LOADER_STATE_INIT;
    assert_int_equal(llmt_loader_get_state(a, &s), LLMT_OK);
    int32_t *x = malloc(2 * w * len * sizeof *x), *y = malloc(2 * w * len * sizeof *y);
    read_windows(a, 1, 4, 2 * w, x);
    llmt_loader *b = open_dataset(&d, 8, 1, 1);
    llmt_loader_state sb = LLMT_LOADER_STATE_INIT;
    assert_int_equal(llmt_loader_get_state(b, &sb), LLMT_OK);
    assert_int_equal(sb.seed, 8);
    assert_int_equal(sb.fingerprint, s.fingerprint); /* the seed is not data */
    assert_int_equal(llmt_loader_set_state(b, &s), LLMT_OK);
    read_windows(b, 1, 4, 2 * w, y);
    assert_memory_equal(x, y, 2 * w * len * sizeof *x);
    assert_int_equal(llmt_loader_get_state(b, &sb), LLMT_OK);
    assert_int_equal(sb.seed, 7);
    free(x);
    free(y);
    llmt_loader_free(a);
    llmt_loader_free(b);
    free_dataset(&d);
}

static void test_shuffle_epoch_limit(void **state)
{
    (void)state;
    /* One shard of one window: the offsets cover epochs 0 .. 2^31 - 1. */
    const size_t sizes[] = {5};
    dataset d = make_dataset("lim", sizes, 1, 4, 0);
    llmt_loader *l = open_dataset(&d, 3, 1, 1);
    llmt_loader_state s = LLMT_LOADER_STATE_INIT;
    assert_int_equal(llmt_loader_get_state(l, &s), LLMT_OK);
    s.epoch = (UINT64_C(1) << 31) - 1;
    s.windows_consumed = s.epoch;
    assert_int_equal(llmt_loader_set_state(l, &s), LLMT_OK);
    int32_t x[4], y[4];
    assert_int_equal(llmt_loader_next(l, x, y, 4), LLMT_OK);
    assert_int_equal(x[0], 0);
    assert_int_equal(get_epoch(l), UINT64_C(1) << 31);
    assert_int_equal(llmt_loader_next(l, x, y, 4), LLMT_ESTATE);
    assert_contains(llmt_error_last(), "epoch 2147483648");
    s.epoch++;
    s.windows_consumed++;
    assert_int_equal(llmt_loader_set_state(l, &s), LLMT_EINVAL);
    llmt_loader_free(l);
    /* Without shuffle there is no limit. */
    l = open_dataset(&d, 3, 1, 0);
    assert_int_equal(llmt_loader_get_state(l, &s), LLMT_OK);
    s.epoch = s.windows_consumed = UINT64_C(1) << 40;
    assert_int_equal(llmt_loader_set_state(l, &s), LLMT_OK);
    assert_int_equal(llmt_loader_next(l, x, y, 4), LLMT_OK);
    llmt_loader_free(l);
    free_dataset(&d);
}

static void test_next_arguments(void **state)
{
    (void)state;
    const size_t sizes[] = {20};
    dataset d = make_dataset("args", sizes, 1, 3, 0);
    llmt_loader *l = open_dataset(&d, 3, 2, 0);
    int32_t x[6], y[6];
    assert_int_equal(llmt_loader_next(l, x, y, 5), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "count = 5");
    assert_int_equal(llmt_loader_next(l, NULL, y, 6), LLMT_EINVAL);
    assert_int_equal(llmt_loader_next(l, x, NULL, 6), LLMT_EINVAL);
    assert_int_equal(llmt_loader_next(NULL, x, y, 6), LLMT_EINVAL);
    assert_int_equal(llmt_loader_next(l, x, y, 6), LLMT_OK); /* nothing moved before */
    assert_int_equal(x[0], 0);
    assert_int_equal(x[3], 3);
    /* The getters refuse NULL with a status (epoch 0 is a real epoch) and
     * leave *out alone. */
    uint64_t v = 77;
    assert_int_equal(llmt_loader_epoch(NULL, &v), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "llmt_loader_epoch: loader is NULL");
    assert_int_equal(llmt_loader_epoch(l, NULL), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "out is NULL");
    assert_int_equal(llmt_loader_windows_per_epoch(NULL, &v), LLMT_EINVAL);
    assert_int_equal(llmt_loader_tokens_per_epoch(NULL, &v), LLMT_EINVAL);
    assert_int_equal(llmt_loader_num_shards(NULL, &v), LLMT_EINVAL);
    assert_int_equal(llmt_loader_num_shards(l, NULL), LLMT_EINVAL);
    assert_int_equal(v, 77);
    assert_int_equal(llmt_loader_epoch(l, &v), LLMT_OK);
    assert_int_equal(v, 0);
    llmt_loader_free(l);
    free_dataset(&d);
}

static void test_open_arguments(void **state)
{
    (void)state;
    uint32_t tok[16] = {0};
    const char *p = path_of("ok.bin");
    write_good(p, tok, 16, 1);
    llmt_context *ctx = test_context(1, 1);
    llmt_loader_config c = LLMT_LOADER_CONFIG_INIT, d;
    llmt_loader_config_init(&d);
    assert_memory_equal(&c, &d, sizeof c);
    assert_int_equal(c.vocab_size, 0); /* required */
    assert_int_equal(c.shuffle, 1);
    c.vocab_size = 5;
    c.seq_len = 4;
    llmt_loader *l = (llmt_loader *)&c; /* overwritten with NULL on failure */
    struct {
        const char *field;
        int32_t *slot, value;
    } bad[] = {
        {"batch_size = 0", &c.batch_size, 0},   {"seq_len = -1", &c.seq_len, -1},
        {"vocab_size = 0", &c.vocab_size, 0},   {"shuffle = 2", &c.shuffle, 2},
        {"INT32_MAX", &c.batch_size, 1 << 30},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int32_t old = *bad[i].slot;
        *bad[i].slot = bad[i].value;
        assert_int_equal(llmt_loader_open(&l, ctx, &p, 1, &c), LLMT_EINVAL);
        assert_null(l);
        assert_contains(llmt_error_last(), bad[i].field);
        *bad[i].slot = old;
    }
    c.version = 99;
    assert_int_equal(llmt_loader_open(&l, ctx, &p, 1, &c), LLMT_EVERSION);
    c.version = LLMT_LOADER_CONFIG_VERSION;
    assert_int_equal(llmt_loader_open(&l, ctx, &p, 0, &c), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "no shard");
    assert_int_equal(llmt_loader_open(&l, NULL, &p, 1, &c), LLMT_EINVAL);
    assert_int_equal(llmt_loader_open(&l, ctx, NULL, 1, &c), LLMT_EINVAL);
    assert_int_equal(llmt_loader_open(&l, ctx, &p, 1, NULL), LLMT_EINVAL);
    assert_int_equal(llmt_loader_open(NULL, ctx, &p, 1, &c), LLMT_EINVAL);
    const char *with_null[] = {p, NULL};
    assert_int_equal(llmt_loader_open(&l, ctx, with_null, 2, &c), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "paths[1]");
    assert_int_equal(llmt_loader_open(&l, ctx, &p, 1, &c), LLMT_OK);
    llmt_loader_free(l);
    llmt_context_free(ctx);
}

/* A FIFO (or any non-regular file) named as a shard is refused at once,
 * naming it, instead of blocking in open(2) waiting for a writer. The alarm
 * turns a hang into a failure. */
static void test_fifo_refused(void **state)
{
    (void)state;
    const char *p = path_of("fifo.bin");
    assert_int_equal(mkfifo(p, 0600), 0);
    llmt_context *ctx = test_context(1, 1);
    llmt_loader_config c = LLMT_LOADER_CONFIG_INIT;
    c.vocab_size = 5;
    c.seq_len = 4;
    llmt_loader *l = NULL;
    alarm(20);
    assert_int_equal(llmt_loader_open(&l, ctx, &p, 1, &c), LLMT_EIO);
    alarm(0);
    assert_null(l);
    assert_contains(llmt_error_last(), p);
    assert_contains(llmt_error_last(), "not a regular file");
    const char *d = dir; /* a directory too */
    assert_int_equal(llmt_loader_open(&l, ctx, &d, 1, &c), LLMT_EIO);
    assert_contains(llmt_error_last(), "not a regular file");
    llmt_context_free(ctx);
}

static void test_glob(void **state)
{
    (void)state;
    /* Written in the order c, a, b; the glob serves a, b, c. */
    const char *names[] = {"g_c.bin", "g_a.bin", "g_b.bin"};
    const uint32_t first[] = {300, 100, 200};
    for (int k = 0; k < 3; k++) {
        uint32_t tok[5];
        for (int i = 0; i < 5; i++)
            tok[i] = first[k] + (uint32_t)i;
        write_good(path_of(names[k]), tok, 5, 1);
    }
    write_good(path_of("other.bin"), first, 3, 1); /* not matched */
    llmt_context *ctx = test_context(1, 1);
    llmt_loader_config c = LLMT_LOADER_CONFIG_INIT;
    c.batch_size = 3;
    c.seq_len = 4;
    c.vocab_size = 1000;
    c.shuffle = 0;
    llmt_loader *l = NULL;
    assert_int_equal(llmt_loader_open_glob(&l, ctx, path_of("g_*.bin"), &c), LLMT_OK);
    assert_int_equal(get_num_shards(l), 3);
    int32_t x[12], y[12];
    assert_int_equal(llmt_loader_next(l, x, y, 12), LLMT_OK);
    assert_int_equal(x[0], 100);
    assert_int_equal(x[4], 200);
    assert_int_equal(x[8], 300);
    assert_int_equal(y[11], 304);
    /* The same files listed by hand: the same fingerprint. */
    llmt_loader_state s = LLMT_LOADER_STATE_INIT;
    assert_int_equal(llmt_loader_get_state(l, &s), LLMT_OK);
    llmt_loader_free(l);
    const char *sorted[] = {path_of("g_a.bin"), path_of("g_b.bin"), path_of("g_c.bin")};
    assert_int_equal(llmt_loader_open(&l, ctx, sorted, 3, &c), LLMT_OK);
    assert_int_equal(llmt_loader_set_state(l, &s), LLMT_OK);
    llmt_loader_free(l);

    const char *none = path_of("nothing_*.bin");
    l = (llmt_loader *)&c;
    assert_int_equal(llmt_loader_open_glob(&l, ctx, none, &c), LLMT_EINVAL);
    assert_null(l);
    assert_contains(llmt_error_last(), none);
    assert_contains(llmt_error_last(), "matches no file");
    const char *missing_dir = path_of("no_dir/*.bin");
    assert_int_equal(llmt_loader_open_glob(&l, ctx, missing_dir, &c), LLMT_EINVAL);
    assert_contains(llmt_error_last(), missing_dir);
    assert_int_equal(llmt_loader_open_glob(&l, ctx, NULL, &c), LLMT_EINVAL);
    llmt_context_free(ctx);
}

/* ---- Refusals of bad shards ---- */

typedef struct bad_shard {
    const char *name;
    int code;
    const char *needle[3]; /* besides the file's path */
    void (*make)(const char *path);
    int32_t seq_len, vocab_size;
} bad_shard;

static const uint32_t seq16[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};

static void make_magic(const char *p) { write_raw(p, 20240521, 1, 16, seq16, 16, 2, 0); }
static void make_version(const char *p) { write_raw(p, 20240520, 3, 16, seq16, 16, 2, 0); }
static void make_version0(const char *p) { write_raw(p, 20240520, 0, 16, seq16, 16, 2, 0); }
static void make_truncated(const char *p) { write_raw(p, 20240520, 1, 16, seq16, 10, 2, 0); }
static void make_truncated_v2(const char *p) { write_raw(p, 20240520, 2, 16, seq16, 16, 2, 0); }
static void make_extra(const char *p) { write_raw(p, 20240520, 1, 16, seq16, 16, 2, 3); }
static void make_negative(const char *p) { write_raw(p, 20240520, 1, 0xFFFFFFFFu, seq16, 0, 2, 0); }
static void make_too_short(const char *p) { write_raw(p, 20240520, 1, 5, seq16, 5, 2, 0); }
static void make_zero(const char *p) { write_raw(p, 20240520, 1, 0, seq16, 0, 2, 0); }
static void make_headerless(const char *p)
{
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    static const unsigned char junk[100] = {0x30, 0x08, 0x35, 0x01};
    assert_int_equal(fwrite(junk, 1, sizeof junk, f), sizeof junk);
    fclose(f);
}
static void make_empty(const char *p)
{
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    fclose(f);
}
static void make_vocab_v1(const char *p)
{
    uint32_t t[16];
    memcpy(t, seq16, sizeof t);
    t[13] = 77;
    write_raw(p, 20240520, 1, 16, t, 16, 2, 0);
}
static void make_vocab_v2(const char *p)
{
    uint32_t t[16];
    memcpy(t, seq16, sizeof t);
    t[9] = 0x80000000u; /* would be negative as an int32 */
    write_raw(p, 20240520, 2, 16, t, 16, 4, 0);
}
static void make_u16_odd(const char *p) { write_headerless(p, seq16, 16, 1); }
static void make_u16_llmc(const char *p) { write_good(p, seq16, 16, 1); }
static void make_u16_vocab(const char *p)
{
    uint32_t t[16];
    memcpy(t, seq16, sizeof t);
    t[13] = 77;
    write_headerless(p, t, 16, 0);
}
static void make_u16_short(const char *p) { write_headerless(p, seq16, 5, 0); }
static void make_u16_empty(const char *p) { write_headerless(p, seq16, 0, 0); }
static void make_nothing(const char *p) { (void)p; }
static void make_directory(const char *p) { assert_int_equal(mkdir(p, 0755), 0); }

static const bad_shard bad_shards[] = {
    {"bad_magic", LLMT_ECORRUPT, {"byte offset 0", "magic 20240521", "*.u16"}, make_magic, 4,
     50},
    {"bad_version", LLMT_EVERSION, {"byte offset 4", "version 3", NULL}, make_version, 4, 50},
    {"bad_version0", LLMT_EVERSION, {"version 0", NULL, NULL}, make_version0, 4, 50},
    {"truncated", LLMT_ECORRUPT, {"truncated", "byte offset 1044", "12 bytes short"},
     make_truncated, 4, 50},
    {"truncated_v2", LLMT_ECORRUPT, {"truncated", "need 1088 bytes", NULL}, make_truncated_v2, 4,
     50},
    {"extra_bytes", LLMT_ECORRUPT, {"3 extra bytes", "byte offset 1056", NULL}, make_extra, 4, 50},
    {"negative_count", LLMT_ECORRUPT, {"byte offset 8", "-1", NULL}, make_negative, 4, 50},
    {"headerless", LLMT_ECORRUPT, {"100 bytes", "1024-byte", "*.u16"}, make_headerless, 4, 50},
    {"empty_file", LLMT_ECORRUPT, {"0 bytes", NULL, NULL}, make_empty, 4, 50},
    {"token_over_vocab_v1", LLMT_ECORRUPT,
     {"position 13", "byte offset 1050", "77, not below vocab_size 50"}, make_vocab_v1, 4, 50},
    {"token_over_vocab_v2", LLMT_ECORRUPT,
     {"position 9", "byte offset 1060", "2147483648"}, make_vocab_v2, 4, 50},
    {"too_short", LLMT_EINVAL, {"5 tokens", "seq_len + 1 = 6", NULL}, make_too_short, 5, 50},
    {"zero_tokens", LLMT_EINVAL, {"0 tokens", NULL, NULL}, make_zero, 1, 50},
    {"missing_file", LLMT_EIO, {"cannot open", NULL, NULL}, make_nothing, 4, 50},
    {"directory", LLMT_EIO, {"not a regular file", NULL, NULL}, make_directory, 4, 50},
    {"u16_odd_size.u16", LLMT_ECORRUPT, {"33 bytes", "odd", "byte offset 32"}, make_u16_odd, 4,
     50},
    {"u16_llmc_header.u16", LLMT_ECORRUPT, {"llm.c shard header", "*.bin", NULL}, make_u16_llmc,
     4, 50},
    {"u16_token_over_vocab.u16", LLMT_ECORRUPT,
     {"position 13", "byte offset 26", "77, not below vocab_size 50"}, make_u16_vocab, 4, 50},
    {"u16_too_short.u16", LLMT_EINVAL, {"5 tokens", "seq_len + 1 = 6", NULL}, make_u16_short, 5,
     50},
    {"u16_empty.u16", LLMT_EINVAL, {"0 tokens", NULL, NULL}, make_u16_empty, 1, 50},
};

/* Each bad shard, alone and after a good one (the message names the bad). */
static void run_bad_shard(void **state)
{
    const bad_shard *b = *state;
    const char *good = path_of("good.bin");
    write_good(good, seq16, 16, 1);
    char bad_path[PATH_MAX];
    snprintf(bad_path, sizeof bad_path, "%s", path_of(b->name));
    b->make(bad_path);
    llmt_context *ctx = test_context(1, 1);
    llmt_loader_config c = LLMT_LOADER_CONFIG_INIT;
    c.seq_len = b->seq_len;
    c.vocab_size = b->vocab_size;
    for (int with_good = 0; with_good < 2; with_good++) {
        const char *paths[] = {good, bad_path};
        llmt_loader *l = (llmt_loader *)&c;
        int rc = llmt_loader_open(&l, ctx, paths + !with_good, 1 + (size_t)with_good, &c);
        if (rc != b->code)
            fail_msg("%s: status %d, expected %d: %s", b->name, rc, b->code, llmt_error_last());
        assert_null(l);
        assert_contains(llmt_error_last(), bad_path);
        for (int i = 0; i < 3 && b->needle[i]; i++)
            assert_contains(llmt_error_last(), b->needle[i]);
    }
    /* Through a glob too. */
    llmt_loader *l = NULL;
    if (b->make != make_nothing) {
        assert_int_equal(llmt_loader_open_glob(&l, ctx, bad_path, &c), b->code);
        assert_contains(llmt_error_last(), bad_path);
    }
    llmt_context_free(ctx);
}

/* ---- Tokenizer ---- */

static void test_byte_tokenizer(void **state)
{
    (void)state;
    unsigned char bytes[256 + 1000];
    for (int i = 0; i < 256; i++)
        bytes[i] = (unsigned char)(255 - i);
    uint64_t s = 5;
    for (int i = 256; i < 1256; i++)
        bytes[i] = (unsigned char)trand_u64(&s);
    size_t n = 0;
    assert_int_equal(llmt_byte_encode(bytes, sizeof bytes, NULL, 0, &n), LLMT_OK);
    assert_int_equal(n, sizeof bytes);
    int32_t tok[1300];
    assert_int_equal(llmt_byte_encode(bytes, sizeof bytes, tok, 1300, &n), LLMT_OK);
    assert_int_equal(n, sizeof bytes);
    for (size_t i = 0; i < sizeof bytes; i++)
        assert_int_equal(tok[i], bytes[i]);
    unsigned char back[1300];
    size_t m = 0;
    assert_int_equal(llmt_byte_decode(tok, n, NULL, 0, &m), LLMT_OK);
    assert_int_equal(m, sizeof bytes);
    assert_int_equal(llmt_byte_decode(tok, n, back, sizeof back, &m), LLMT_OK);
    assert_int_equal(m, sizeof bytes);
    assert_memory_equal(back, bytes, sizeof bytes);

    /* EOT decodes to nothing: "ab" EOT "c" EOT -> "abc". */
    assert_int_equal(LLMT_BYTE_VOCAB, 257);
    assert_int_equal(LLMT_TOKEN_EOT, 256);
    const int32_t docs[] = {'a', 'b', LLMT_TOKEN_EOT, 'c', LLMT_TOKEN_EOT};
    assert_int_equal(llmt_byte_decode(docs, 5, NULL, 0, &m), LLMT_OK);
    assert_int_equal(m, 3);
    char text[4] = {0};
    assert_int_equal(llmt_byte_decode(docs, 5, text, 3, &m), LLMT_OK);
    assert_int_equal(m, 3);
    assert_memory_equal(text, "abc", 3);
    assert_int_equal(llmt_byte_decode(docs + 2, 1, text, 3, &m), LLMT_OK);
    assert_int_equal(m, 0);
    /* Too small a buffer: refused, the size needed given. */
    assert_int_equal(llmt_byte_decode(docs, 5, text, 2, &m), LLMT_EINVAL);
    assert_int_equal(m, 3);
    assert_contains(llmt_error_last(), "capacity = 2");
    assert_int_equal(llmt_byte_encode("xyz", 3, tok, 2, &n), LLMT_EINVAL);
    assert_int_equal(n, 3);
    /* Tokens that are not bytes, named by position, even in a size query. */
    const int32_t bad[] = {'a', 256, 'b', 257};
    assert_int_equal(llmt_byte_decode(bad, 4, NULL, 0, &m), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "tokens[3] = 257");
    const int32_t neg[] = {-1};
    assert_int_equal(llmt_byte_decode(neg, 1, text, 4, &m), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "tokens[0] = -1");
    /* Empty input, NULL arguments. */
    assert_int_equal(llmt_byte_encode(NULL, 0, NULL, 0, &n), LLMT_OK);
    assert_int_equal(n, 0);
    assert_int_equal(llmt_byte_decode(NULL, 0, NULL, 0, &m), LLMT_OK);
    assert_int_equal(m, 0);
    assert_int_equal(llmt_byte_encode(bytes, 3, tok, 3, NULL), LLMT_EINVAL);
    assert_int_equal(llmt_byte_encode(NULL, 3, tok, 3, &n), LLMT_EINVAL);
    assert_int_equal(llmt_byte_encode(bytes, 3, NULL, 3, &n), LLMT_EINVAL);
    assert_int_equal(llmt_byte_decode(tok, 3, NULL, 3, &m), LLMT_EINVAL);
    assert_int_equal(llmt_byte_decode(NULL, 3, back, 3, &m), LLMT_EINVAL);
}

int main(void)
{
    static const struct CMUnitTest fixed[] = {
        cmocka_unit_test_setup_teardown(test_read_hand_written, setup, teardown),
        cmocka_unit_test_setup_teardown(test_read_headerless, setup, teardown),
        cmocka_unit_test_setup_teardown(test_shard_write_decoded_by_hand, setup, teardown),
        cmocka_unit_test_setup_teardown(test_windows_in_order, setup, teardown),
        cmocka_unit_test_setup_teardown(test_shuffle_epochs, setup, teardown),
        cmocka_unit_test_setup_teardown(test_save_restore_shuffled, setup, teardown),
        cmocka_unit_test_setup_teardown(test_save_restore_in_order, setup, teardown),
        cmocka_unit_test_setup_teardown(test_restore_adopts_seed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_shuffle_epoch_limit, setup, teardown),
        cmocka_unit_test_setup_teardown(test_next_arguments, setup, teardown),
        cmocka_unit_test_setup_teardown(test_open_arguments, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fifo_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_glob, setup, teardown),
        cmocka_unit_test_setup_teardown(test_restore_where_the_files_moved, setup, teardown),
        cmocka_unit_test(test_byte_tokenizer),
    };
    enum { N_FIXED = sizeof fixed / sizeof fixed[0],
           N_BAD = sizeof bad_shards / sizeof bad_shards[0] };
    struct CMUnitTest tests[N_FIXED + N_BAD];
    memcpy(tests, fixed, sizeof fixed);
    for (size_t i = 0; i < N_BAD; i++)
        tests[N_FIXED + i] = (struct CMUnitTest){.name = bad_shards[i].name,
                                                 .test_func = run_bad_shard,
                                                 .setup_func = setup,
                                                 .teardown_func = teardown,
                                                 .initial_state = (void *)&bad_shards[i]};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
