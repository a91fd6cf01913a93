/* Text files to byte-level token shards: each file is a document followed
 * by EOT; the stream is cut into training shards, and its last fraction goes
 * to validation shards. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/error.h"
#include "llmt/data.h"

#define READ_CHUNK ((size_t)1 << 20)

typedef struct shard_sink {
    const char *dir, *prefix;
    int32_t *buf;
    size_t len, cap;
    int val;                    /* writing the validation split */
    uint32_t shards[2];         /* written per split */
    uint64_t tokens[2];
} shard_sink;

static int flush(shard_sink *w)
{
    if (!w->len)
        return LLMT_OK;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s_%s_%06u.bin", w->dir, w->prefix, w->val ? "val" : "train",
             w->shards[w->val]);
    LLMT_TRY(llmt_shard_write(path, w->buf, w->len, LLMT_SHARD_VERSION_U16));
    w->shards[w->val]++;
    w->tokens[w->val] += w->len;
    w->len = 0;
    return LLMT_OK;
}

/* Appends one file's tokens and its EOT, switching to validation after
 * n_train tokens in all (counted in *emitted). */
static int add_file(shard_sink *w, const char *path, uint64_t size, uint64_t n_train,
                    uint64_t *emitted, unsigned char *bytes, int32_t *tok)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return llmt_fail(LLMT_EIO, "%s: cannot open: %s", path, strerror(errno));
    uint64_t got = 0;
    int rc = LLMT_OK;
    for (int end = 0; !end && !rc;) {
        size_t n = fread(bytes, 1, READ_CHUNK, f), n_tok = 0;
        got += n;
        end = n < READ_CHUNK;
        if (end && ferror(f))
            rc = llmt_fail(LLMT_EIO, "%s: read failed", path);
        else if (end && got != size)
            rc = llmt_fail(LLMT_EIO, "%s: changed while being read (%llu bytes, then %llu)", path,
                           (unsigned long long)size, (unsigned long long)got);
        else if (n)
            rc = llmt_byte_encode(bytes, n, tok, READ_CHUNK, &n_tok);
        if (end && !rc)
            tok[n_tok++] = LLMT_TOKEN_EOT;
        for (size_t k = 0; k < n_tok && !rc; k++) {
            w->buf[w->len++] = tok[k];
            int boundary = ++*emitted == n_train;
            if (w->len == w->cap || boundary)
                rc = flush(w);
            if (boundary)
                w->val = 1;
        }
    }
    fclose(f);
    return rc;
}

int llmt_byte_tokenize_files(const char *const *paths, size_t n, const char *out_dir,
                             const char *prefix, uint64_t shard_tokens, double val_fraction,
                             llmt_tokenize_report *report)
{
    const char *fn = "llmt_byte_tokenize_files";
    if (!paths || !n || !out_dir || !out_dir[0] || !prefix || !prefix[0] || strchr(prefix, '/'))
        return llmt_fail(LLMT_EINVAL, "%s: no inputs, or an unusable out_dir or prefix", fn);
    if (shard_tokens < 1 || shard_tokens > INT32_MAX || !(val_fraction >= 0 && val_fraction < 1))
        return llmt_fail(LLMT_EINVAL, "%s: shard_tokens = %llu (1..%d), val_fraction = %g ([0, 1))",
                         fn, (unsigned long long)shard_tokens, INT32_MAX, val_fraction);
    if (report && report->version != LLMT_TOKENIZE_REPORT_VERSION)
        return llmt_fail(LLMT_EVERSION, "%s: report->version = %u, this library knows %u", fn,
                         report->version, LLMT_TOKENIZE_REPORT_VERSION);
    uint64_t *sizes = malloc(n * sizeof *sizes), total = 0, bytes_in = 0;
    if (!sizes)
        return llmt_fail(LLMT_ENOMEM, "%s: out of memory", fn);
    for (size_t i = 0; i < n; i++) {
        struct stat st;
        if (stat(paths[i], &st) != 0 || !S_ISREG(st.st_mode)) {
            free(sizes);
            return llmt_fail(LLMT_EIO, "%s: %s", paths[i],
                             errno && !S_ISREG(st.st_mode) ? strerror(errno) : "not a regular file");
        }
        sizes[i] = (uint64_t)st.st_size;
        bytes_in += sizes[i];
        total += sizes[i] + 1; /* and its EOT */
    }
    uint64_t n_val = val_fraction > 0 ? (uint64_t)ceil(val_fraction * (double)total) : 0;
    n_val = n_val < total ? n_val : total;
    if (total == n_val) {
        free(sizes);
        return llmt_fail(LLMT_EINVAL, "%s: val_fraction %g of %llu tokens leaves none to train on",
                         fn, val_fraction, (unsigned long long)total);
    }
    int rc = LLMT_OK;
    if (mkdir(out_dir, 0755) != 0 && errno != EEXIST)
        rc = llmt_fail(LLMT_EIO, "%s: cannot create: %s", out_dir, strerror(errno));
    shard_sink w = {.dir = out_dir, .prefix = prefix, .cap = (size_t)shard_tokens};
    unsigned char *bytes = malloc(READ_CHUNK);
    int32_t *tok = malloc((READ_CHUNK + 1) * sizeof *tok);
    w.buf = malloc(w.cap * sizeof *w.buf);
    if (!rc && (!bytes || !tok || !w.buf))
        rc = llmt_fail(LLMT_ENOMEM, "%s: out of memory for %zu-token shards", fn, w.cap);
    uint64_t emitted = 0;
    for (size_t i = 0; i < n && !rc; i++)
        rc = add_file(&w, paths[i], sizes[i], total - n_val, &emitted, bytes, tok);
    if (!rc)
        rc = flush(&w);
    if (!rc && report) {
        report->files = n;
        report->bytes = bytes_in;
        report->train_tokens = w.tokens[0];
        report->val_tokens = w.tokens[1];
        report->train_shards = w.shards[0];
        report->val_shards = w.shards[1];
    }
    free(sizes);
    free(bytes);
    free(tok);
    free(w.buf);
    return rc;
}
