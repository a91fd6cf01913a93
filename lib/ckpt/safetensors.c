/* safetensors: the atomic, streaming writer and the validating reader. */
#define _GNU_SOURCE /* sync_file_range */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "llmt/common.h"
#include "core/error.h"
#include "ckpt/safetensors.h"
#include "util/fsutil.h"
#include "util/json.h"

/* The most JSON values a header may hold. */
#define ST_MAX_NODES (UINT64_C(1) << 22)

_Static_assert(SIZE_MAX >= UINT64_MAX, "file offsets and sizes must fit size_t");

#define DEFAULT_CHUNK_BYTES ((size_t)8 << 20)
#define METADATA_KEY "__metadata__"
/* One read() or write() call moves at most this much (Linux caps near 2 GiB). */
#define IO_MAX ((size_t)1 << 30)
/* "[" + 8 dims of up to 20 digits, ", "-separated, + "]" + NUL fits. */
#define SHAPE_TEXT_CAP 192

struct llmt_st_file {
    int fd;
    char *path;
    llmt_json *header;     /* owns the names, metadata keys and values */
    const llmt_json *meta; /* the "__metadata__" object, or NULL */
    size_t count;
    llmt_st_tensor *tensors; /* header order */
    const llmt_st_tensor **by_name; /* the tensors sorted by name, for llmt_st_find */
};

/* The byte size of a shape of elem-byte elements into *out; false on overflow. */
static bool shape_bytes(const uint64_t *shape, int ndim, size_t elem, uint64_t *out)
{
    uint64_t bytes = elem;
    for (int i = 0; i < ndim; i++)
        if (__builtin_mul_overflow(bytes, shape[i], &bytes))
            return false;
    *out = bytes;
    return true;
}

/* "[2, 3]" for messages. */
static const char *shape_text(char buf[SHAPE_TEXT_CAP], const uint64_t *shape, int ndim)
{
    size_t o = (size_t)snprintf(buf, SHAPE_TEXT_CAP, "[");
    for (int i = 0; i < ndim; i++)
        o += (size_t)snprintf(buf + o, SHAPE_TEXT_CAP - o, "%s%" PRIu64, i ? ", " : "", shape[i]);
    snprintf(buf + o, SHAPE_TEXT_CAP - o, "]");
    return buf;
}

static const char *quote(char buf[LLMT_JSON_QUOTE_CAP], const char *s, size_t len)
{
    return llmt_json_quote(buf, LLMT_JSON_QUOTE_CAP, s, len);
}

static int compare_names(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Sorts names and returns one that occurs twice, or NULL. */
static const char *repeated_name(const char **names, size_t n)
{
    qsort(names, n, sizeof *names, compare_names);
    for (size_t i = 1; i < n; i++)
        if (strcmp(names[i - 1], names[i]) == 0)
            return names[i];
    return NULL;
}

/* ---- Writer ---- */

/* Checks the tensors and metadata; the data region's size into *data_bytes. */
static int check_write_args(const char *path, const llmt_st_write_tensor *t, size_t n,
                            const llmt_st_meta *meta, size_t n_meta, uint64_t *data_bytes)
{
    char q[LLMT_JSON_QUOTE_CAP], s[SHAPE_TEXT_CAP];
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        const llmt_st_write_tensor *x = &t[i];
        if (!x->name || !x->name[0])
            return llmt_fail(LLMT_EINVAL, "%s: tensors[%zu] has %s name", path, i,
                             x->name ? "an empty" : "a NULL");
        quote(q, x->name, strlen(x->name));
        if (!llmt_utf8_valid(x->name, strlen(x->name)))
            return llmt_fail(LLMT_EINVAL, "%s: tensors[%zu]: name %s is not valid UTF-8", path,
                             i, q);
        if (strcmp(x->name, METADATA_KEY) == 0)
            return llmt_fail(LLMT_EINVAL, "%s: tensors[%zu]: the name %s is reserved", path, i, q);
        size_t elem = llmt_dtype_size(x->dtype);
        if (!elem)
            return llmt_fail(LLMT_EINVAL, "%s: tensor %s: dtype = %d is not a dtype", path, q,
                             x->dtype);
        if (x->ndim < 0 || x->ndim > LLMT_ST_MAX_NDIM)
            return llmt_fail(LLMT_EINVAL, "%s: tensor %s: ndim = %d (0..%d)", path, q, x->ndim,
                             LLMT_ST_MAX_NDIM);
        if (!x->fill && !x->data)
            return llmt_fail(LLMT_EINVAL, "%s: tensor %s: neither fill nor data is set", path, q);
        uint64_t bytes;
        if (!shape_bytes(x->shape, x->ndim, elem, &bytes) ||
            __builtin_add_overflow(total, bytes, &total))
            return llmt_fail(LLMT_EINVAL, "%s: tensor %s: shape %s of %s: size overflows", path,
                             q, shape_text(s, x->shape, x->ndim), llmt_dtype_name(x->dtype));
    }
    for (size_t i = 0; i < n_meta; i++) {
        const char *bad = !meta[i].key ? "key is NULL"
                          : !meta[i].value ? "value is NULL"
                          : !llmt_utf8_valid(meta[i].key, strlen(meta[i].key)) ? "key is not UTF-8"
                          : !llmt_utf8_valid(meta[i].value, strlen(meta[i].value))
                              ? "value is not UTF-8"
                              : NULL;
        if (bad)
            return llmt_fail(LLMT_EINVAL, "%s: meta[%zu]: %s", path, i, bad);
    }
    const char **names = calloc((n > n_meta ? n : n_meta) + 1, sizeof *names);
    if (!names)
        return llmt_fail(LLMT_ENOMEM, "%s: out of memory checking names", path);
    for (size_t i = 0; i < n; i++)
        names[i] = t[i].name;
    const char *dup = repeated_name(names, n);
    const char *what = "tensor name";
    if (!dup) {
        for (size_t i = 0; i < n_meta; i++)
            names[i] = meta[i].key;
        dup = repeated_name(names, n_meta);
        what = "metadata key";
    }
    int rc = dup ? llmt_fail(LLMT_EINVAL, "%s: %s %s given twice", path, what,
                             quote(q, dup, strlen(dup)))
                 : LLMT_OK;
    free(names);
    *data_bytes = total;
    return rc;
}

/* The byte size of a tensor that check_write_args accepted. */
static uint64_t write_tensor_bytes(const llmt_st_write_tensor *t)
{
    uint64_t bytes = 0;
    shape_bytes(t->shape, t->ndim, llmt_dtype_size(t->dtype), &bytes);
    return bytes;
}

static void put_le64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

/* Builds the file's head: the 8-byte length, the JSON header and the spaces
 * that make the head a multiple of 8 bytes; into *out (malloc'd), *out_len. */
static int build_head(const char *path, const llmt_st_write_tensor *t, size_t n,
                      const llmt_st_meta *meta, size_t n_meta, char **out, size_t *out_len)
{
    llmt_jw w;
    llmt_jw_init(&w);
    /* The writer keeps its first failure, so checking at finish suffices:
     * the arguments are validated, only memory can fail here. */
    llmt_jw_begin_object(&w);
    if (n_meta) {
        llmt_jw_key(&w, METADATA_KEY, strlen(METADATA_KEY));
        llmt_jw_begin_object(&w);
        for (size_t i = 0; i < n_meta; i++) {
            llmt_jw_key(&w, meta[i].key, strlen(meta[i].key));
            llmt_jw_string(&w, meta[i].value, strlen(meta[i].value));
        }
        llmt_jw_end_object(&w);
    }
    uint64_t offset = 0;
    for (size_t i = 0; i < n; i++) {
        const char *dtype = llmt_dtype_name(t[i].dtype);
        llmt_jw_key(&w, t[i].name, strlen(t[i].name));
        llmt_jw_begin_object(&w);
        llmt_jw_key(&w, "dtype", 5);
        llmt_jw_string(&w, dtype, strlen(dtype));
        llmt_jw_key(&w, "shape", 5);
        llmt_jw_begin_array(&w);
        for (int d = 0; d < t[i].ndim; d++)
            llmt_jw_uint64(&w, t[i].shape[d]);
        llmt_jw_end_array(&w);
        llmt_jw_key(&w, "data_offsets", 12);
        llmt_jw_begin_array(&w);
        llmt_jw_uint64(&w, offset);
        offset += write_tensor_bytes(&t[i]);
        llmt_jw_uint64(&w, offset);
        llmt_jw_end_array(&w);
        llmt_jw_end_object(&w);
    }
    llmt_jw_end_object(&w);
    const char *text;
    size_t len;
    int rc = llmt_jw_finish(&w, &text, &len);
    if (rc) {
        llmt_jw_free(&w);
        return llmt_fail_prefix(rc, "%s: building the header", path);
    }
    size_t pad = (8 - len % 8) % 8;
    *out_len = 8 + len + pad;
    *out = malloc(*out_len);
    if (*out) {
        put_le64((unsigned char *)*out, len + pad);
        memcpy(*out + 8, text, len);
        memset(*out + 8 + len, ' ', pad);
    }
    llmt_jw_free(&w);
    return *out ? LLMT_OK : llmt_fail(LLMT_ENOMEM, "%s: out of memory for the header", path);
}

/* Where the writer's bytes go: the temporary file, the running checksum,
 * and with chunk_bytes the checksums of each run of chunk_bytes (chunk_xxh
 * holds the run in progress: hashed % chunk_bytes bytes of it). */
typedef struct sink {
    int fd;
    const char *path, *tmp;
    XXH3_state_t *xxh;
    uint64_t written;
    int durable;
    uint64_t started, dropped; /* durable: writeback started before, dropped before */
    uint64_t chunk_bytes, hashed;
    XXH3_state_t *chunk_xxh;
    uint64_t *chunks;
    size_t n_chunks, cap_chunks;
} sink;

/* Appends the digest of the run in progress and starts the next. */
static int push_chunk(sink *s)
{
    if (s->n_chunks == s->cap_chunks) {
        size_t cap = s->cap_chunks ? 2 * s->cap_chunks : 16;
        uint64_t *grown = realloc(s->chunks, cap * sizeof *grown);
        if (!grown)
            return llmt_fail(LLMT_ENOMEM, "%s: out of memory for the chunk checksums", s->path);
        s->chunks = grown;
        s->cap_chunks = cap;
    }
    s->chunks[s->n_chunks++] = XXH3_64bits_digest(s->chunk_xxh);
    XXH3_64bits_reset(s->chunk_xxh);
    return LLMT_OK;
}

/* Feeds n bytes to the per-run checksums, closing each run that fills. */
static int hash_runs(sink *s, const char *p, size_t n)
{
    while (n) {
        uint64_t room = s->chunk_bytes - s->hashed % s->chunk_bytes;
        size_t take = n < room ? n : (size_t)room;
        XXH3_64bits_update(s->chunk_xxh, p, take);
        s->hashed += take;
        p += take;
        n -= take;
        if (s->hashed % s->chunk_bytes == 0)
            LLMT_TRY(push_chunk(s));
    }
    return LLMT_OK;
}

/* A durable file goes to the disk as it is written: once a window of
 * FLUSH_WINDOW bytes is written, its writeback is started, and the window
 * before it is waited for and dropped from the page cache. The file then
 * holds about two windows of page cache instead of all of its bytes dirty
 * until the fsync, which is left little to do, and a checkpoint does not
 * evict the page cache the run relies on. (DONTNEED drops whole pages
 * only: the page a window boundary falls in stays cached.) */
#define FLUSH_WINDOW ((uint64_t)64 << 20)

/* sync_file_range failed: a file system without it (EINVAL, ENOSYS,
 * ESPIPE) only loses the streaming. Any other error is the file's: the
 * wait hands a writeback error to its caller and not again to the fsync
 * (Linux's errseq), so it must be reported here. */
static int stream_failed(const sink *s)
{
    if (errno == EINVAL || errno == ENOSYS || errno == ESPIPE)
        return LLMT_OK;
    return llmt_fail(LLMT_EIO, "%s: writing %s back: %s", s->path, s->tmp, strerror(errno));
}

static int stream_to_disk(sink *s)
{
    if (!s->durable || s->written - s->started < FLUSH_WINDOW)
        return LLMT_OK;
    if (sync_file_range(s->fd, (off_t)s->started, (off_t)(s->written - s->started),
                        SYNC_FILE_RANGE_WRITE) != 0)
        LLMT_TRY(stream_failed(s));
    if (s->started > s->dropped) {
        if (sync_file_range(s->fd, (off_t)s->dropped, (off_t)(s->started - s->dropped),
                            SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE |
                                SYNC_FILE_RANGE_WAIT_AFTER) != 0)
            LLMT_TRY(stream_failed(s));
        (void)posix_fadvise(s->fd, (off_t)s->dropped, (off_t)(s->started - s->dropped),
                            POSIX_FADV_DONTNEED); /* a hint: it reports no write error */
    }
    s->dropped = s->started;
    s->started = s->written;
    return LLMT_OK;
}

/* Hashes and writes n bytes; a durable file in pieces of at most a window,
 * so that a large tensor written from host memory streams too. */
static int sink_write(sink *s, const char *p, size_t n)
{
    XXH3_64bits_update(s->xxh, p, n);
    if (s->chunk_bytes)
        LLMT_TRY(hash_runs(s, p, n));
    const size_t piece = s->durable ? (size_t)FLUSH_WINDOW : n;
    for (size_t off = 0; off < n;) {
        size_t take = n - off < piece ? n - off : piece;
        LLMT_TRY(llmt_write_all(s->fd, p + off, take, s->path, s->tmp));
        s->written += take;
        off += take;
        LLMT_TRY(stream_to_disk(s));
    }
    return LLMT_OK;
}

/* Streams the tensors' bytes in order through buf (cap bytes): each fill call
 * produces the next range of one tensor, and buf is written out when full, so
 * small tensors share a write and large ones take several. The thread's
 * message is cleared before each fill, so one set there can be told apart. */
static int stream_data(sink *s, const llmt_st_write_tensor *t, size_t n, char *buf, size_t cap)
{
    size_t used = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t size = write_tensor_bytes(&t[i]);
        if (t[i].data) { /* bytes in host memory: written as they are */
            int rc = used ? sink_write(s, buf, used) : LLMT_OK;
            used = 0;
            if (!rc)
                rc = sink_write(s, t[i].data, (size_t)size);
            if (rc)
                return rc;
            continue;
        }
        for (uint64_t off = 0; off < size;) {
            size_t take = cap - used < size - off ? cap - used : (size_t)(size - off);
            llmt_error_clear();
            int rc = t[i].fill(t[i].user, i, (size_t)off, buf + used, take);
            if (rc) {
                char q[LLMT_JSON_QUOTE_CAP];
                quote(q, t[i].name, strlen(t[i].name));
                if (llmt_error_last()[0])
                    return llmt_fail_prefix(rc, "%s: tensor %s: fill at byte %" PRIu64, s->path,
                                            q, off);
                return llmt_fail(rc, "%s: tensor %s: fill at byte %" PRIu64 " returned %d (%s)",
                                 s->path, q, off, rc, llmt_status_string(rc));
            }
            used += take;
            off += take;
            if (used == cap) {
                rc = sink_write(s, buf, used);
                if (rc)
                    return rc;
                used = 0;
            }
        }
    }
    return used ? sink_write(s, buf, used) : LLMT_OK;
}

/* Writes head and data to a temporary file, then renames it over path. */
static int write_file(const char *path, const llmt_st_write_tensor *t, size_t n,
                      const char *head, size_t head_len, uint64_t data_bytes,
                      const llmt_st_write_opts *o, llmt_st_write_result *result)
{
    static const char suffix[] = ".tmp-XXXXXX";
    size_t path_len = strlen(path);
    size_t cap = data_bytes < o->chunk_bytes ? (size_t)data_bytes : o->chunk_bytes;
    char *tmp = malloc(path_len + sizeof suffix);
    char *buf = cap ? malloc(cap) : NULL;
    XXH3_state_t *xxh = XXH3_createState();
    XXH3_state_t *chunk_xxh = o->hash_chunk_bytes ? XXH3_createState() : NULL;
    sink s = {.fd = -1, .path = path, .xxh = xxh, .durable = o->durable,
              .chunk_bytes = o->hash_chunk_bytes, .chunk_xxh = chunk_xxh};
    int rc = LLMT_OK;
    if (!tmp || (cap && !buf) || !xxh || (o->hash_chunk_bytes && !chunk_xxh)) {
        rc = llmt_fail(LLMT_ENOMEM, "%s: out of memory for a %zu-byte buffer", path, cap);
        goto out;
    }
    memcpy(tmp, path, path_len);
    memcpy(tmp + path_len, suffix, sizeof suffix);
    s.tmp = tmp;
    s.fd = mkstemp(tmp);
    if (s.fd < 0) {
        rc = llmt_fail(LLMT_EIO, "%s: creating %s: %s", path, tmp, strerror(errno));
        goto out;
    }
    XXH3_64bits_reset(xxh);
    if (chunk_xxh)
        XXH3_64bits_reset(chunk_xxh);
    if (fchmod(s.fd, 0644) != 0)
        rc = llmt_fail(LLMT_EIO, "%s: chmod %s: %s", path, tmp, strerror(errno));
    if (!rc)
        rc = sink_write(&s, head, head_len);
    if (!rc)
        rc = stream_data(&s, t, n, buf, cap);
    if (!rc && s.chunk_bytes && s.hashed % s.chunk_bytes)
        rc = push_chunk(&s); /* the last, shorter run */
    if (!rc && o->durable && fsync(s.fd) != 0)
        rc = llmt_fail(LLMT_EIO, "%s: fsync of %s: %s", path, tmp, strerror(errno));
    if (close(s.fd) != 0 && !rc)
        rc = llmt_fail(LLMT_EIO, "%s: closing %s: %s", path, tmp, strerror(errno));
    if (!rc && rename(tmp, path) != 0)
        rc = llmt_fail(LLMT_EIO, "%s: renaming %s over it: %s", path, tmp, strerror(errno));
    if (rc) {
        unlink(tmp);
        goto out;
    }
    if (o->durable)
        rc = llmt_sync_parent(path);
    if (!rc && result) {
        result->file_bytes = s.written;
        result->xxh3 = XXH3_64bits_digest(xxh);
        result->chunks = s.chunks;
        result->n_chunks = s.n_chunks;
        s.chunks = NULL;
    }
out:
    free(s.chunks);
    XXH3_freeState(chunk_xxh);
    XXH3_freeState(xxh);
    free(buf);
    free(tmp);
    return rc;
}

int llmt_st_write(const char *path, const llmt_st_write_tensor *tensors, size_t n,
                  const llmt_st_meta *meta, size_t n_meta, const llmt_st_write_opts *opts,
                  llmt_st_write_result *result)
{
    if (!path || (n && !tensors) || (n_meta && !meta))
        return llmt_fail(LLMT_EINVAL, "llmt_st_write: %s is NULL",
                         !path ? "path" : n && !tensors ? "tensors" : "meta");
    llmt_st_write_opts o = LLMT_ST_WRITE_OPTS_INIT;
    if (opts)
        o = *opts;
    if (!o.chunk_bytes)
        o.chunk_bytes = DEFAULT_CHUNK_BYTES;
    /* stream_data clears the thread's message; a successful call restores it. */
    char saved[1024];
    snprintf(saved, sizeof saved, "%s", llmt_error_last());

    uint64_t data_bytes = 0;
    char *head = NULL;
    size_t head_len = 0;
    int rc = check_write_args(path, tensors, n, meta, n_meta, &data_bytes);
    if (!rc)
        rc = build_head(path, tensors, n, meta, n_meta, &head, &head_len);
    if (!rc && data_bytes > UINT64_MAX - head_len)
        rc = llmt_fail(LLMT_EINVAL, "%s: the file would exceed 2^64 bytes", path);
    if (!rc)
        rc = write_file(path, tensors, n, head, head_len, data_bytes, &o, result);
    free(head);
    if (!rc)
        llmt_fail(LLMT_OK, "%s", saved);
    return rc;
}

/* ---- Reader ---- */

/* Reads exactly bytes at offset of the file. */
static int read_at(const llmt_st_file *f, void *dst, size_t bytes, uint64_t offset)
{
    char *p = dst;
    while (bytes) {
        ssize_t k = pread(f->fd, p, bytes < IO_MAX ? bytes : IO_MAX, (off_t)offset);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0)
            return llmt_fail(LLMT_EIO, "%s: reading at byte %" PRIu64 ": %s", f->path, offset,
                             strerror(errno));
        if (k == 0)
            return llmt_fail(LLMT_EIO, "%s: end of file at byte %" PRIu64 " (did it shrink?)",
                             f->path, offset);
        p += k;
        bytes -= (size_t)k;
        offset += (uint64_t)k;
    }
    return LLMT_OK;
}

/* Checks the "__metadata__" object: string values, no NUL bytes. */
static int load_meta(llmt_st_file *f, const llmt_json *meta)
{
    char q[LLMT_JSON_QUOTE_CAP];
    if (llmt_json_type(meta) != LLMT_JSON_OBJECT)
        return llmt_fail(LLMT_ECORRUPT, "%s: \"__metadata__\" is not an object", f->path);
    for (size_t i = 0; i < llmt_json_len(meta); i++) {
        const char *key, *value;
        size_t key_len, value_len;
        value = llmt_json_string(llmt_json_member(meta, i, &key, &key_len), &value_len);
        quote(q, key, key_len);
        if (!value)
            return llmt_fail(LLMT_ECORRUPT, "%s: \"__metadata__\" entry %s is not a string",
                             f->path, q);
        if (strlen(key) != key_len || strlen(value) != value_len)
            return llmt_fail(LLMT_ECORRUPT, "%s: \"__metadata__\" entry %s contains a NUL byte",
                             f->path, q);
    }
    f->meta = meta;
    return LLMT_OK;
}

/* Reads one non-negative integer of a shape or data_offsets array. */
static int load_dim(const llmt_st_file *f, const char *q, const char *what, size_t i,
                    const llmt_json *v, uint64_t *out)
{
    if (llmt_json_uint64(v, out) == LLMT_OK)
        return LLMT_OK;
    size_t len;
    const char *text = llmt_json_number_text(v, &len);
    if (!text)
        return llmt_fail(LLMT_ECORRUPT, "%s: tensor %s: %s[%zu] is not a number", f->path, q,
                         what, i);
    return llmt_fail(LLMT_ECORRUPT, "%s: tensor %s: %s[%zu] = %.*s is not a non-negative integer",
                     f->path, q, what, i, len > 40 ? 40 : (int)len, text);
}

/* Validates the entry v of tensor name into *t (offsets relative to the data). */
static int load_tensor(const llmt_st_file *f, const char *name, size_t name_len,
                       const llmt_json *v, llmt_st_tensor *t)
{
    char q[LLMT_JSON_QUOTE_CAP], s[SHAPE_TEXT_CAP];
    const char *path = f->path;
    quote(q, name, name_len);
    if (!name_len)
        return llmt_fail(LLMT_ECORRUPT, "%s: a tensor has an empty name", path);
    if (strlen(name) != name_len)
        return llmt_fail(LLMT_ECORRUPT, "%s: tensor %s: name contains a NUL byte", path, q);
    if (llmt_json_type(v) != LLMT_JSON_OBJECT)
        return llmt_fail(LLMT_ECORRUPT, "%s: tensor %s: entry is not an object", path, q);

    static const char *const keys[3] = {"dtype", "shape", "data_offsets"};
    const llmt_json *field[3] = {NULL, NULL, NULL};
    for (size_t i = 0; i < llmt_json_len(v); i++) {
        const char *key;
        size_t key_len, k = 0;
        const llmt_json *m = llmt_json_member(v, i, &key, &key_len);
        while (k < 3 && (strlen(keys[k]) != key_len || memcmp(keys[k], key, key_len) != 0))
            k++;
        if (k == 3) {
            char qk[LLMT_JSON_QUOTE_CAP];
            return llmt_fail(LLMT_ECORRUPT, "%s: tensor %s: unknown key %s", path, q,
                             quote(qk, key, key_len));
        }
        field[k] = m; /* the JSON parser refused repeated keys */
    }
    for (int k = 0; k < 3; k++)
        if (!field[k])
            return llmt_fail(LLMT_ECORRUPT, "%s: tensor %s: missing \"%s\"", path, q, keys[k]);

    size_t dlen;
    const char *dtype = llmt_json_string(field[0], &dlen);
    if (!dtype)
        return llmt_fail(LLMT_ECORRUPT, "%s: tensor %s: dtype is not a string", path, q);
    t->dtype = -1;
    for (int d = LLMT_DTYPE_F32; d <= LLMT_DTYPE_I32; d++)
        if (strlen(llmt_dtype_name(d)) == dlen && memcmp(llmt_dtype_name(d), dtype, dlen) == 0)
            t->dtype = d;
    if (t->dtype < 0) {
        char qd[LLMT_JSON_QUOTE_CAP];
        return llmt_fail(LLMT_EUNSUPPORTED,
                         "%s: tensor %s: dtype %s is not supported (F32, F16, BF16, I32)", path, q,
                         quote(qd, dtype, dlen));
    }

    const llmt_json *shape = field[1], *offsets = field[2];
    if (llmt_json_type(shape) != LLMT_JSON_ARRAY || llmt_json_len(shape) > LLMT_ST_MAX_NDIM)
        return llmt_fail(LLMT_ECORRUPT, "%s: tensor %s: shape is not an array of at most %d sizes",
                         path, q, LLMT_ST_MAX_NDIM);
    t->ndim = (int)llmt_json_len(shape);
    for (int d = 0; d < t->ndim; d++) {
        int rc = load_dim(f, q, "shape", (size_t)d, llmt_json_at(shape, (size_t)d), &t->shape[d]);
        if (rc)
            return rc;
    }
    if (llmt_json_type(offsets) != LLMT_JSON_ARRAY || llmt_json_len(offsets) != 2)
        return llmt_fail(LLMT_ECORRUPT, "%s: tensor %s: data_offsets is not an array of two integers",
                         path, q);
    int rc = load_dim(f, q, "data_offsets", 0, llmt_json_at(offsets, 0), &t->begin);
    if (!rc)
        rc = load_dim(f, q, "data_offsets", 1, llmt_json_at(offsets, 1), &t->end);
    if (rc)
        return rc;
    if (t->begin > t->end)
        return llmt_fail(LLMT_ECORRUPT, "%s: tensor %s: data_offsets [%" PRIu64 ", %" PRIu64
                         "] end before they begin", path, q, t->begin, t->end);
    uint64_t bytes;
    if (!shape_bytes(t->shape, t->ndim, llmt_dtype_size(t->dtype), &bytes))
        return llmt_fail(LLMT_ECORRUPT, "%s: tensor %s: shape %s of %s overflows 64 bits", path, q,
                         shape_text(s, t->shape, t->ndim), dtype);
    if (bytes != t->end - t->begin)
        return llmt_fail(LLMT_ECORRUPT,
                         "%s: tensor %s: data_offsets [%" PRIu64 ", %" PRIu64
                         "] do not match shape %s of %s (%" PRIu64 " bytes)",
                         path, q, t->begin, t->end, shape_text(s, t->shape, t->ndim), dtype, bytes);
    t->name = name;
    return LLMT_OK;
}

/* Sorts tensors by their data offsets. */
static int compare_offsets(const void *a, const void *b)
{
    const llmt_st_tensor *x = *(const llmt_st_tensor *const *)a;
    const llmt_st_tensor *y = *(const llmt_st_tensor *const *)b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    return (x->end > y->end) - (x->end < y->end);
}

/* Checks that the tensors, sorted by offsets, tile [0, data_bytes) exactly. */
static int check_layout(const llmt_st_file *f, const llmt_st_tensor **sorted, uint64_t data_bytes)
{
    char q[LLMT_JSON_QUOTE_CAP], q2[LLMT_JSON_QUOTE_CAP];
    qsort(sorted, f->count, sizeof *sorted, compare_offsets);
    uint64_t covered = 0; /* the data region is tiled up to here */
    const llmt_st_tensor *prev = NULL;
    for (size_t i = 0; i < f->count; i++) {
        const llmt_st_tensor *t = sorted[i];
        quote(q, t->name, strlen(t->name));
        if (t->begin < covered)
            return llmt_fail(LLMT_ECORRUPT,
                             "%s: tensor %s: data_offsets [%" PRIu64 ", %" PRIu64
                             "] overlap tensor %s [%" PRIu64 ", %" PRIu64 "]",
                             f->path, q, t->begin, t->end, quote(q2, prev->name, strlen(prev->name)),
                             prev->begin, prev->end);
        if (t->begin > covered)
            return llmt_fail(LLMT_ECORRUPT,
                             "%s: tensor %s: data_offsets [%" PRIu64 ", %" PRIu64
                             "] leave a gap: no tensor covers data bytes [%" PRIu64 ", %" PRIu64 ")",
                             f->path, q, t->begin, t->end, covered, t->begin);
        covered = t->end;
        prev = t;
    }
    if (covered > data_bytes)
        return llmt_fail(LLMT_ECORRUPT,
                         "%s: tensor %s: data_offsets [%" PRIu64 ", %" PRIu64
                         "] run past the end of the file: the data region has %" PRIu64 " bytes",
                         f->path, quote(q, prev->name, strlen(prev->name)), prev->begin, prev->end,
                         data_bytes);
    if (covered < data_bytes)
        return llmt_fail(LLMT_ECORRUPT,
                         "%s: %" PRIu64 " trailing bytes: the tensors end at data byte %" PRIu64
                         " but the data region has %" PRIu64,
                         f->path, data_bytes - covered, covered, data_bytes);
    return LLMT_OK;
}

static int compare_tensor_names(const void *a, const void *b)
{
    return strcmp((*(const llmt_st_tensor *const *)a)->name,
                  (*(const llmt_st_tensor *const *)b)->name);
}

/* Validates the parsed header and the layout of a file of file_bytes. */
static int load_header(llmt_st_file *f, uint64_t header_bytes, uint64_t file_bytes)
{
    const llmt_json *root = f->header;
    if (llmt_json_type(root) != LLMT_JSON_OBJECT)
        return llmt_fail(LLMT_ECORRUPT, "%s: the header is not a JSON object", f->path);
    size_t members = llmt_json_len(root);
    f->tensors = calloc(members + 1, sizeof *f->tensors);
    f->by_name = calloc(members + 1, sizeof *f->by_name);
    if (!f->tensors || !f->by_name)
        return llmt_fail(LLMT_ENOMEM, "%s: out of memory for %zu tensors", f->path, members);
    for (size_t i = 0; i < members; i++) {
        const char *key;
        size_t key_len;
        const llmt_json *v = llmt_json_member(root, i, &key, &key_len);
        int rc;
        if (key_len == strlen(METADATA_KEY) && memcmp(key, METADATA_KEY, key_len) == 0) {
            rc = load_meta(f, v);
        } else {
            rc = load_tensor(f, key, key_len, v, &f->tensors[f->count]);
            f->by_name[f->count] = &f->tensors[f->count];
            f->count++;
        }
        if (rc)
            return rc;
    }
    /* 8 + header_bytes <= file_bytes was checked before the header was read.
     * by_name serves as scratch for the layout check, then is sorted by name. */
    uint64_t data_start = 8 + header_bytes;
    int rc = check_layout(f, f->by_name, file_bytes - data_start);
    if (rc)
        return rc;
    for (size_t i = 0; i < f->count; i++)
        f->tensors[i].file_offset = data_start + f->tensors[i].begin;
    qsort(f->by_name, f->count, sizeof *f->by_name, compare_tensor_names);
    return LLMT_OK;
}

static uint64_t get_le64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

/* Opens f->path and validates it all. */
static int load_file(llmt_st_file *f, uint64_t max_header_bytes)
{
    const char *path = f->path;
    f->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (f->fd < 0)
        return llmt_fail(LLMT_EIO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(f->fd, &st) != 0)
        return llmt_fail(LLMT_EIO, "%s: stat: %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode))
        return llmt_fail(LLMT_EIO, "%s: not a regular file", path);
    uint64_t file_bytes = (uint64_t)st.st_size;
    if (file_bytes < 8)
        return llmt_fail(LLMT_ECORRUPT, "%s: %" PRIu64 " bytes, too short for a safetensors file",
                         path, file_bytes);
    unsigned char len8[8];
    int rc = read_at(f, len8, 8, 0);
    if (rc)
        return rc;
    uint64_t n = get_le64(len8);
    if (n > max_header_bytes)
        return llmt_fail(LLMT_ECORRUPT, "%s: header length %" PRIu64 " is over the limit of %" PRIu64
                         " bytes", path, n, max_header_bytes);
    if (n > file_bytes - 8)
        return llmt_fail(LLMT_ECORRUPT, "%s: header length %" PRIu64
                         " runs past the end of the file (%" PRIu64 " bytes)", path, n, file_bytes);
    char *text = malloc(n + 1);
    if (!text)
        return llmt_fail(LLMT_ENOMEM, "%s: out of memory for a %" PRIu64 "-byte header", path, n);
    rc = read_at(f, text, n, 8);
    /* Depth 3: the header object, a tensor entry, its shape or offsets. Every
     * value takes at least one byte, every string at most all of them. A real
     * tensor entry is about a dozen values, so ST_MAX_NODES (4 Mi, ~300k
     * tensors) bounds what a hostile header can make the parser allocate. */
    const llmt_json_limits lim = {.max_depth = 3, .max_input_bytes = n, .max_string_bytes = n,
                                  .max_nodes = n < ST_MAX_NODES ? n : ST_MAX_NODES};
    if (!rc) {
        rc = llmt_json_parse(text, n, &lim, &f->header);
        if (rc)
            llmt_fail_prefix(rc, "%s: header", path);
    }
    free(text);
    return rc ? rc : load_header(f, n, file_bytes);
}

int llmt_st_open(const char *path, const llmt_st_limits *limits, llmt_st_file **out)
{
    if (!out)
        return llmt_fail(LLMT_EINVAL, "llmt_st_open: out is NULL");
    *out = NULL;
    if (!path)
        return llmt_fail(LLMT_EINVAL, "llmt_st_open: path is NULL");
    uint64_t max_header = limits && limits->max_header_bytes ? limits->max_header_bytes
                                                             : LLMT_ST_DEFAULT_MAX_HEADER_BYTES;
    llmt_st_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(path))) {
        free(f);
        return llmt_fail(LLMT_ENOMEM, "%s: out of memory", path);
    }
    f->fd = -1;
    int rc = load_file(f, max_header);
    if (rc) {
        llmt_st_close(f);
        return rc;
    }
    *out = f;
    return LLMT_OK;
}

void llmt_st_close(llmt_st_file *f)
{
    if (!f)
        return;
    if (f->fd >= 0)
        close(f->fd);
    llmt_json_free(f->header);
    free(f->tensors);
    free(f->by_name);
    free(f->path);
    free(f);
}

size_t llmt_st_count(const llmt_st_file *f)
{
    return f ? f->count : 0;
}

const llmt_st_tensor *llmt_st_tensor_at(const llmt_st_file *f, size_t i)
{
    return f && i < f->count ? &f->tensors[i] : NULL;
}

int llmt_st_find(const llmt_st_file *f, const char *name, size_t *index)
{
    if (!f || !name || !index)
        return llmt_fail(LLMT_EINVAL, "llmt_st_find: %s is NULL",
                         !f ? "f" : !name ? "name" : "index");
    size_t lo = 0, hi = f->count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(name, f->by_name[mid]->name);
        if (c == 0) {
            *index = (size_t)(f->by_name[mid] - f->tensors);
            return LLMT_OK;
        }
        if (c < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    char q[LLMT_JSON_QUOTE_CAP];
    return llmt_fail(LLMT_ENOTFOUND, "%s: no tensor %s", f->path, quote(q, name, strlen(name)));
}

size_t llmt_st_meta_count(const llmt_st_file *f)
{
    return f ? llmt_json_len(f->meta) : 0;
}

const char *llmt_st_meta_at(const llmt_st_file *f, size_t i, const char **value)
{
    const char *key = NULL;
    const llmt_json *v = f ? llmt_json_member(f->meta, i, &key, NULL) : NULL;
    if (v && value)
        *value = llmt_json_string(v, NULL);
    return v ? key : NULL;
}

const char *llmt_st_meta_get(const llmt_st_file *f, const char *key)
{
    return f ? llmt_json_string(llmt_json_get(f->meta, key), NULL) : NULL;
}

int llmt_st_read(llmt_st_file *f, size_t tensor_index, size_t byte_offset, void *dst,
                 size_t bytes)
{
    if (!f || (!dst && bytes))
        return llmt_fail(LLMT_EINVAL, "llmt_st_read: %s is NULL", !f ? "f" : "dst");
    if (tensor_index >= f->count)
        return llmt_fail(LLMT_EINVAL, "%s: tensor index %zu out of range (%zu tensors)", f->path,
                         tensor_index, f->count);
    const llmt_st_tensor *t = &f->tensors[tensor_index];
    uint64_t size = t->end - t->begin;
    if (byte_offset > size || bytes > size - byte_offset) {
        char q[LLMT_JSON_QUOTE_CAP];
        return llmt_fail(LLMT_EINVAL,
                         "%s: tensor %s: reading %zu bytes at byte %zu goes beyond its %" PRIu64
                         " bytes",
                         f->path, quote(q, t->name, strlen(t->name)), bytes, byte_offset, size);
    }
    return read_at(f, dst, bytes, t->file_offset + byte_offset);
}
