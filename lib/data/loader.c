/* llmt_loader: windows of seq_len + 1 tokens from mapped shards, served in
 * batches; the shuffle is derived, not stored, so the position is four
 * integers (docs/data.md).
 *
 * Shuffle offsets. Every permutation is a Fisher-Yates shuffle drawn from the
 * Philox stream (seed, LLMT_STREAM_DATA); the permutation number r uses the
 * blocks r * 2^32 + i (values 4 (r 2^32 + i) .. + 3), step i (from n - 1 down
 * to 1) using block r 2^32 + i alone. With S shards, epoch e's shard order is
 * permutation r = e (S + 1) and the window order of shard k (its index in the
 * loader's list) in epoch e is r = e (S + 1) + 1 + k. Windows per shard and S
 * stay below 2^32, so the ranges never overlap while r < 2^32, i.e. for
 * epochs e <= 2^32 / (S + 1) - 1; a later epoch is refused. */
#include <errno.h>
#include <glob.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "llmt/data.h"
#include "core/context_internal.h"
#include "core/error.h"
#include "core/rng.h"
#include "data/loader_internal.h"
#include "data/shard.h"

typedef struct shard {
    char *path;
    llmt_shard_map map;
    uint64_t n_windows;
} shard;

/* A position: the cursors always point at a window that exists. */
typedef struct pos {
    uint64_t epoch, shard_cursor, window_cursor, consumed;
} pos;

struct llmt_loader {
    int32_t batch, seq_len, vocab_size, shuffle;
    uint64_t seed;
    size_t n_shards;
    shard *shards;
    uint64_t windows_per_epoch;
    uint64_t fingerprint;
    uint64_t legacy_fingerprint; /* accepted by set_state, never written */
    uint64_t max_epoch; /* the last epoch the shuffle's offsets cover */
    pos at;

    /* Caches of derived permutations (shuffle only). */
    uint32_t *shard_order; /* n_shards */
    bool shard_order_valid;
    uint64_t shard_order_epoch;
    uint32_t *window_order; /* the most windows of a shard */
    bool window_order_valid;
    uint64_t window_order_epoch;
    size_t window_order_shard;
};

/* ---- Permutations ---- */

/* Permutation r of n elements (n <= 2^32) of stream (seed, LLMT_STREAM_DATA)
 * into p: Fisher-Yates, step i drawing a 64-bit value from block r 2^32 + i;
 * the modulo's bias is below n / 2^64. */
static void draw_permutation(uint64_t seed, uint64_t r, uint32_t *p, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++)
        p[i] = (uint32_t)i;
    for (uint64_t i = n ? n - 1 : 0; i > 0; i--) {
        uint32_t v[4];
        llmt_rng_block(seed, LLMT_STREAM_DATA, (r << 32) | i, v);
        uint64_t x = (uint64_t)v[0] | (uint64_t)v[1] << 32;
        uint64_t j = x % (i + 1);
        uint32_t t = p[i];
        p[i] = p[j];
        p[j] = t;
    }
}

/* The shard at position c of epoch e's order. */
static size_t shard_at(llmt_loader *l, uint64_t e, uint64_t c)
{
    if (!l->shuffle)
        return (size_t)c;
    if (!l->shard_order_valid || l->shard_order_epoch != e) {
        draw_permutation(l->seed, e * (l->n_shards + 1), l->shard_order, l->n_shards);
        l->shard_order_valid = true;
        l->shard_order_epoch = e;
    }
    return l->shard_order[c];
}

/* The window at position c of shard k's order in epoch e. */
static uint64_t window_at(llmt_loader *l, uint64_t e, size_t k, uint64_t c)
{
    if (!l->shuffle)
        return c;
    if (!l->window_order_valid || l->window_order_epoch != e || l->window_order_shard != k) {
        draw_permutation(l->seed, e * (l->n_shards + 1) + 1 + k, l->window_order,
                         l->shards[k].n_windows);
        l->window_order_valid = true;
        l->window_order_epoch = e;
        l->window_order_shard = k;
    }
    return l->window_order[c];
}

static void invalidate(llmt_loader *l)
{
    l->shard_order_valid = false;
    l->window_order_valid = false;
}

/* ---- Opening ---- */

void llmt_loader_config_init(llmt_loader_config *cfg)
{
    if (cfg) {
        const llmt_loader_config d = LLMT_LOADER_CONFIG_INIT;
        *cfg = d;
    }
}

static int check_config(const llmt_loader_config *cfg)
{
    if (cfg->version != LLMT_LOADER_CONFIG_VERSION)
        return llmt_fail(LLMT_EVERSION, "loader config: version = %" PRIu32 " (this library: %d)",
                         cfg->version, LLMT_LOADER_CONFIG_VERSION);
    if (cfg->batch_size < 1)
        return llmt_fail(LLMT_EINVAL, "loader config: batch_size = %" PRId32 " (must be >= 1)",
                         cfg->batch_size);
    if (cfg->seq_len < 1)
        return llmt_fail(LLMT_EINVAL, "loader config: seq_len = %" PRId32 " (must be >= 1)",
                         cfg->seq_len);
    if ((int64_t)cfg->batch_size * cfg->seq_len > INT32_MAX)
        return llmt_fail(LLMT_EINVAL,
                         "loader config: batch_size * seq_len = %" PRId32 " * %" PRId32
                         " = %" PRId64 " is over INT32_MAX",
                         cfg->batch_size, cfg->seq_len, (int64_t)cfg->batch_size * cfg->seq_len);
    if (cfg->vocab_size < 1)
        return llmt_fail(LLMT_EINVAL,
                         "loader config: vocab_size = %" PRId32
                         " (must be >= 1: set it to the model's vocabulary size)",
                         cfg->vocab_size);
    if (cfg->shuffle != 0 && cfg->shuffle != 1)
        return llmt_fail(LLMT_EINVAL, "loader config: shuffle = %" PRId32 " (must be 0 or 1)",
                         cfg->shuffle);
    return LLMT_OK;
}

static void hash_u64(XXH3_state_t *h, uint64_t v)
{
    unsigned char b[8];
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)(v >> (8 * i));
    XXH3_64bits_update(h, b, sizeof b);
}

/* Bytes of a shard's start that its fingerprint holds: its header and
 * first tokens. */
#define FINGERPRINT_HEAD ((uint64_t)4096)

/* The name of path after its last '/'. */
static const char *base_name(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

/* The fingerprints of the loader's data (docs/data.md), every integer as 8
 * little-endian bytes, each string preceded by its length:
 * - current (tag "llmt-loader-2"): the shard count, each shard's base name,
 *   file size and first FINGERPRINT_HEAD bytes (all of a smaller file),
 *   seq_len and the shuffle flag. Not the directories: a run directory may
 *   be moved, or its data named by another path, and still resume;
 * - legacy (tag "llmt-loader-1", what states saved before it hold): the
 *   same with each path as given instead of the name and bytes. */
static int compute_fingerprint(llmt_loader *l)
{
    XXH3_state_t *h = XXH3_createState(), *old = XXH3_createState();
    if (!h || !old) {
        XXH3_freeState(h);
        XXH3_freeState(old);
        return llmt_fail(LLMT_ENOMEM, "loader: out of memory for the fingerprint");
    }
    static const char tag[] = "llmt-loader-2", old_tag[] = "llmt-loader-1";
    XXH3_64bits_reset(h);
    XXH3_64bits_reset(old);
    XXH3_64bits_update(h, tag, sizeof tag);
    XXH3_64bits_update(old, old_tag, sizeof old_tag);
    hash_u64(h, l->n_shards);
    hash_u64(old, l->n_shards);
    for (size_t i = 0; i < l->n_shards; i++) {
        const shard *sh = &l->shards[i];
        const char *name = base_name(sh->path);
        size_t len = strlen(name), path_len = strlen(sh->path);
        uint64_t size = sh->map.file_bytes;
        hash_u64(h, len);
        XXH3_64bits_update(h, name, len);
        hash_u64(h, size);
        XXH3_64bits_update(h, sh->map.map, size < FINGERPRINT_HEAD ? size : FINGERPRINT_HEAD);
        hash_u64(old, path_len);
        XXH3_64bits_update(old, sh->path, path_len);
        hash_u64(old, size);
    }
    XXH3_state_t *both[2] = {h, old};
    for (int i = 0; i < 2; i++) {
        hash_u64(both[i], (uint64_t)l->seq_len);
        hash_u64(both[i], (uint64_t)l->shuffle);
    }
    l->fingerprint = XXH3_64bits_digest(h);
    l->legacy_fingerprint = XXH3_64bits_digest(old);
    XXH3_freeState(h);
    XXH3_freeState(old);
    return LLMT_OK;
}

void llmt_loader_free(llmt_loader *l)
{
    if (!l)
        return;
    for (size_t i = 0; i < l->n_shards; i++) {
        llmt_shard_map_close(&l->shards[i].map);
        free(l->shards[i].path);
    }
    free(l->shards);
    free(l->shard_order);
    free(l->window_order);
    free(l);
}

int llmt_loader_open(llmt_loader **out, llmt_context *ctx, const char *const *paths,
                     size_t n_paths, const llmt_loader_config *cfg)
{
    if (!out)
        return llmt_fail(LLMT_EINVAL, "llmt_loader_open: out is NULL");
    *out = NULL;
    if (!ctx || !cfg)
        return llmt_fail(LLMT_EINVAL, "llmt_loader_open: %s is NULL", !ctx ? "ctx"
                         : "cfg (required: vocab_size has no default)");
    LLMT_TRY(check_config(cfg));
    if (n_paths == 0)
        return llmt_fail(LLMT_EINVAL, "llmt_loader_open: n_paths = 0: no shard given");
    if (!paths)
        return llmt_fail(LLMT_EINVAL, "llmt_loader_open: paths is NULL with n_paths = %zu",
                         n_paths);
    if (n_paths >= UINT32_MAX)
        return llmt_fail(LLMT_EINVAL, "llmt_loader_open: n_paths = %zu shards (at most %" PRIu32
                         ")", n_paths, UINT32_MAX - 1);
    for (size_t i = 0; i < n_paths; i++)
        if (!paths[i])
            return llmt_fail(LLMT_EINVAL, "llmt_loader_open: paths[%zu] is NULL", i);

    llmt_loader *l = calloc(1, sizeof *l);
    if (!l || !(l->shards = calloc(n_paths, sizeof *l->shards))) {
        free(l);
        return llmt_fail(LLMT_ENOMEM, "llmt_loader_open: out of memory for %zu shards", n_paths);
    }
    l->batch = cfg->batch_size;
    l->seq_len = cfg->seq_len;
    l->vocab_size = cfg->vocab_size;
    l->shuffle = cfg->shuffle;
    l->seed = ctx->cfg.seed;
    l->n_shards = n_paths;

    uint64_t t = (uint64_t)l->seq_len, most = 0;
    int rc = LLMT_OK;
    for (size_t i = 0; i < n_paths && !rc; i++) {
        shard *s = &l->shards[i];
        if (!(s->path = strdup(paths[i]))) {
            rc = llmt_fail(LLMT_ENOMEM, "%s: out of memory", paths[i]);
            break;
        }
        rc = llmt_shard_map_open(&s->map, s->path, t + 1, l->vocab_size);
        if (rc)
            break;
        s->n_windows = (s->map.n_tokens - 1) / t;
        l->windows_per_epoch += s->n_windows;
        if (s->n_windows > most)
            most = s->n_windows;
    }
    if (!rc)
        rc = compute_fingerprint(l);
    if (!rc && l->shuffle) {
        l->shard_order = malloc(n_paths * sizeof *l->shard_order);
        l->window_order = malloc((size_t)most * sizeof *l->window_order);
        if (!l->shard_order || !l->window_order)
            rc = llmt_fail(LLMT_ENOMEM, "llmt_loader_open: out of memory for the shuffle");
        l->max_epoch = (UINT64_C(1) << 32) / ((uint64_t)n_paths + 1) - 1;
    } else {
        l->max_epoch = UINT64_MAX;
    }
    if (rc) {
        llmt_loader_free(l);
        return rc;
    }
    *out = l;
    return LLMT_OK;
}

static int compare_strings(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The directory glob could not read, for the message; a missing one is
 * no match rather than an error. */
static _Thread_local char glob_failed_path[512];
static _Thread_local int glob_failed_errno;

static int glob_error(const char *path, int err)
{
    if (err == ENOENT || err == ENOTDIR)
        return 0;
    snprintf(glob_failed_path, sizeof glob_failed_path, "%s", path);
    glob_failed_errno = err;
    return 1;
}

int llmt_loader_open_glob(llmt_loader **out, llmt_context *ctx, const char *pattern,
                          const llmt_loader_config *cfg)
{
    if (!out)
        return llmt_fail(LLMT_EINVAL, "llmt_loader_open_glob: out is NULL");
    *out = NULL;
    if (!pattern)
        return llmt_fail(LLMT_EINVAL, "llmt_loader_open_glob: pattern is NULL");
    glob_t g;
    memset(&g, 0, sizeof g);
    glob_failed_path[0] = '\0';
    int grc = glob(pattern, 0, glob_error, &g);
    int rc = LLMT_OK;
    if (grc == GLOB_NOMATCH || (grc == 0 && g.gl_pathc == 0))
        rc = llmt_fail(LLMT_EINVAL, "shard pattern '%s' matches no file", pattern);
    else if (grc == GLOB_NOSPACE)
        rc = llmt_fail(LLMT_ENOMEM, "shard pattern '%s': out of memory", pattern);
    else if (grc != 0)
        rc = llmt_fail(LLMT_EIO, "shard pattern '%s': cannot read directory %s: %s", pattern,
                       glob_failed_path, strerror(glob_failed_errno));
    if (!rc) {
        /* glob sorts by the locale's collation; sort by bytes so the order
         * (and the fingerprint) does not depend on the locale. */
        qsort(g.gl_pathv, g.gl_pathc, sizeof *g.gl_pathv, compare_strings);
        rc = llmt_loader_open(out, ctx, (const char *const *)g.gl_pathv, g.gl_pathc, cfg);
    }
    globfree(&g);
    return rc;
}

/* ---- Serving ---- */

/* Moves p one window on. */
static void advance(const llmt_loader *l, pos *p, size_t k)
{
    p->consumed++;
    if (++p->window_cursor < l->shards[k].n_windows)
        return;
    p->window_cursor = 0;
    if (++p->shard_cursor < l->n_shards)
        return;
    p->shard_cursor = 0;
    p->epoch++;
}

static int epoch_limit_error(const llmt_loader *l, uint64_t epoch)
{
    return llmt_fail(LLMT_ESTATE,
                     "loader: epoch %" PRIu64 " is past the last epoch (%" PRIu64
                     ") whose shuffle offsets are disjoint for %zu shards (docs/data.md)",
                     epoch, l->max_epoch, l->n_shards);
}

int llmt_loader_next(llmt_loader *l, int32_t *tokens, int32_t *targets, size_t count)
{
    if (!l || !tokens || !targets)
        return llmt_fail(LLMT_EINVAL, "llmt_loader_next: %s is NULL",
                         !l ? "loader" : !tokens ? "tokens" : "targets");
    size_t bt = (size_t)l->batch * (size_t)l->seq_len;
    if (count != bt)
        return llmt_fail(LLMT_EINVAL,
                         "llmt_loader_next: count = %zu, but batch_size * seq_len = %" PRId32
                         " * %" PRId32 " = %zu",
                         count, l->batch, l->seq_len, bt);
    /* The last window of this batch lies in epoch + (in_epoch + B - 1) / W. */
    uint64_t w = l->windows_per_epoch;
    uint64_t in_epoch = l->at.consumed - l->at.epoch * w;
    uint64_t last = l->at.epoch + (in_epoch + (uint64_t)l->batch - 1) / w;
    if (last > l->max_epoch)
        return epoch_limit_error(l, last);

    size_t t = (size_t)l->seq_len;
    pos p = l->at;
    for (int32_t b = 0; b < l->batch; b++) {
        size_t k = shard_at(l, p.epoch, p.shard_cursor);
        const shard *s = &l->shards[k];
        uint64_t start = window_at(l, p.epoch, k, p.window_cursor) * t;
        int32_t *in = tokens + (size_t)b * t, *tg = targets + (size_t)b * t;
        int32_t prev = (int32_t)llmt_shard_token(&s->map, start);
        for (size_t i = 0; i < t; i++) {
            int32_t next = (int32_t)llmt_shard_token(&s->map, start + i + 1);
            in[i] = prev;
            tg[i] = next;
            prev = next;
        }
        advance(l, &p, k);
    }
    l->at = p;
    return LLMT_OK;
}

/* ---- Position ---- */

int llmt_loader_get_state(const llmt_loader *l, llmt_loader_state *out)
{
    if (!l || !out)
        return llmt_fail(LLMT_EINVAL, "llmt_loader_get_state: %s is NULL", !l ? "loader" : "out");
    if (out->version != LLMT_LOADER_STATE_VERSION)
        return llmt_fail(LLMT_EVERSION,
                         "llmt_loader_get_state: out->version = %" PRIu32 " (this library: %d)",
                         out->version, LLMT_LOADER_STATE_VERSION);
    out->epoch = l->at.epoch;
    out->shard_cursor = l->at.shard_cursor;
    out->window_cursor = l->at.window_cursor;
    out->windows_consumed = l->at.consumed;
    out->seed = l->seed;
    out->fingerprint = l->fingerprint;
    return LLMT_OK;
}

int llmt_loader_set_state(llmt_loader *l, const llmt_loader_state *st)
{
    if (!l || !st)
        return llmt_fail(LLMT_EINVAL, "llmt_loader_set_state: %s is NULL",
                         !l ? "loader" : "state");
    if (st->version != LLMT_LOADER_STATE_VERSION)
        return llmt_fail(LLMT_EVERSION,
                         "llmt_loader_set_state: state->version = %" PRIu32 " (this library: %d)",
                         st->version, LLMT_LOADER_STATE_VERSION);
    if (st->fingerprint != l->fingerprint && st->fingerprint != l->legacy_fingerprint)
        return llmt_fail(LLMT_EINVAL,
                         "llmt_loader_set_state: state fingerprint %016" PRIx64
                         " does not match this loader's %016" PRIx64
                         ": it was saved over other data (shard names, sizes or first "
                         "bytes), another seq_len or another shuffle setting",
                         st->fingerprint, l->fingerprint);
    if (st->epoch > l->max_epoch)
        return llmt_fail(LLMT_EINVAL,
                         "llmt_loader_set_state: epoch = %" PRIu64
                         " is past the last epoch the shuffle covers (%" PRIu64 ")",
                         st->epoch, l->max_epoch);
    if (st->shard_cursor >= l->n_shards)
        return llmt_fail(LLMT_EINVAL,
                         "llmt_loader_set_state: shard_cursor = %" PRIu64 " (%zu shards)",
                         st->shard_cursor, l->n_shards);

    /* Draw the permutations with the state's seed; restore the old ones'
     * seed if the state is refused. */
    uint64_t old_seed = l->seed;
    l->seed = st->seed;
    invalidate(l);
    size_t k = shard_at(l, st->epoch, st->shard_cursor);
    int rc = LLMT_OK;
    uint64_t before = 0, expect = 0;
    for (uint64_t c = 0; c < st->shard_cursor; c++)
        before += l->shards[shard_at(l, st->epoch, c)].n_windows;
    if (st->window_cursor >= l->shards[k].n_windows)
        rc = llmt_fail(LLMT_EINVAL,
                       "llmt_loader_set_state: window_cursor = %" PRIu64
                       ", but shard %s (shard_cursor %" PRIu64 " of epoch %" PRIu64
                       ") has %" PRIu64 " windows",
                       st->window_cursor, l->shards[k].path, st->shard_cursor, st->epoch,
                       l->shards[k].n_windows);
    else if (__builtin_mul_overflow(st->epoch, l->windows_per_epoch, &expect) ||
             __builtin_add_overflow(expect, before + st->window_cursor, &expect) ||
             expect != st->windows_consumed)
        rc = llmt_fail(LLMT_EINVAL,
                       "llmt_loader_set_state: windows_consumed = %" PRIu64
                       " does not match epoch %" PRIu64 ", shard_cursor %" PRIu64
                       ", window_cursor %" PRIu64 " (%" PRIu64 " windows per epoch)",
                       st->windows_consumed, st->epoch, st->shard_cursor, st->window_cursor,
                       l->windows_per_epoch);
    if (rc) {
        l->seed = old_seed;
        invalidate(l);
        return rc;
    }
    l->at = (pos){st->epoch, st->shard_cursor, st->window_cursor, st->windows_consumed};
    return LLMT_OK;
}

/* The getters: *out receives the value; NULL arguments are refused, naming
 * the function and the argument. */
static int check_getter(const llmt_loader *l, const void *out, const char *fn)
{
    if (!l || !out)
        return llmt_fail(LLMT_EINVAL, "%s: %s is NULL", fn, l ? "out" : "loader");
    return LLMT_OK;
}

int llmt_loader_epoch(const llmt_loader *l, uint64_t *out)
{
    LLMT_TRY(check_getter(l, out, "llmt_loader_epoch"));
    *out = l->at.epoch;
    return LLMT_OK;
}

int llmt_loader_windows_per_epoch(const llmt_loader *l, uint64_t *out)
{
    LLMT_TRY(check_getter(l, out, "llmt_loader_windows_per_epoch"));
    *out = l->windows_per_epoch;
    return LLMT_OK;
}

int llmt_loader_tokens_per_epoch(const llmt_loader *l, uint64_t *out)
{
    LLMT_TRY(check_getter(l, out, "llmt_loader_tokens_per_epoch"));
    *out = l->windows_per_epoch * (uint64_t)l->seq_len;
    return LLMT_OK;
}

int llmt_loader_num_shards(const llmt_loader *l, uint64_t *out)
{
    LLMT_TRY(check_getter(l, out, "llmt_loader_num_shards"));
    *out = (uint64_t)l->n_shards;
    return LLMT_OK;
}

void llmt_loader_shape(const llmt_loader *l, int32_t *batch_size, int32_t *seq_len)
{
    *batch_size = l->batch;
    *seq_len = l->seq_len;
}
