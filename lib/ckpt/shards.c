#define _GNU_SOURCE
/* The optimizer files of a sharded checkpoint: each rank writes its range,
 * and a reader at any world size takes the parts of the files that overlap
 * its own range, checking the chunk checksums of what it reads. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "ckpt/device_fill.h"
#include "ckpt/shards.h"
#include "core/error.h"
#include "model/model_internal.h"
#include "optim/optim_internal.h"
#include "util/fsutil.h"

/* The state sections in file order: tensor names of a shard file and
 * suffixes of optimizer.safetensors (format 1). */
static const char *const section_name[3] = {"exp_avg", "exp_avg_sq", "master"};

/* 3 with fp32 master weights (mixed precision), else 2. Not o->master.ptr:
 * a rank whose range is empty has no buffer, but its file has the tensor. */
static int sections_of(const llmt_optimizer *o)
{
    size_t moment = 0, master = 0;
    llmt_optimizer_sizes(o->model->cfg.precision, 1, &moment, &master);
    return master ? 3 : 2;
}

static int section_dtype(const llmt_optimizer *o, int sec)
{
    return sec == 2 ? LLMT_DTYPE_F32 : o->state_dt;
}

static char *path_of(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p)
        snprintf(p, n, "%s/%s", dir, name);
    else
        llmt_fail(LLMT_ENOMEM, "out of memory");
    return p;
}

#define CHUNK LLMT_MANIFEST_CHUNK_BYTES /* what a save writes */

int llmt_ckpt_shard_write(const char *dir, const llmt_optimizer *o, int32_t rank, int32_t size,
                          int sync, llmt_manifest_shard *out)
{
    static const char empty = 0; /* the data of an empty range (never read) */
    memset(out, 0, sizeof *out);
    llmt_manifest_shard_name(out->file.name, sizeof out->file.name, rank, size);
    out->first = o->first;
    out->end = o->end;
    llmt_st_write_tensor t[3];
    llmt_ckpt_device_src src[3];
    memset(t, 0, sizeof t);
    int n = sections_of(o);
    /* Each section is its host segment [first, split) (an offloaded
     * optimizer's; an async save's staged copy has none: split = first),
     * then its device segment [split, end) in the backend's memory: read in
     * place where that is host memory and there is one segment, else
     * through the fill, which copies from the device as the file is written
     * (an async save stages host copies only on backends whose memory is
     * host memory: lib/train/dist_ckpt_async.c). */
    const int on_host = o->model->ops->host_memory;
    for (int sec = 0; sec < n; sec++) {
        const llmt_buf *host, *b;
        llmt_offload_section(o, sec, &host, &b);
        t[sec].name = section_name[sec];
        t[sec].dtype = section_dtype(o, sec);
        t[sec].ndim = 1;
        t[sec].shape[0] = (uint64_t)(o->end - o->first);
        if (!host->bytes && (on_host || !b->ptr)) {
            t[sec].data = b->ptr ? b->ptr : &empty;
        } else {
            src[sec] = (llmt_ckpt_device_src){.m = o->model, .base = b->ptr, .host = host->ptr,
                                              .host_bytes = host->bytes};
            t[sec].fill = llmt_ckpt_fill_from_device;
            t[sec].user = src;
        }
    }
    char first[24], end[24], ranks[24], elements[24];
    snprintf(first, sizeof first, "%" PRId64, o->first);
    snprintf(end, sizeof end, "%" PRId64, o->end);
    snprintf(ranks, sizeof ranks, "%d", (int)size);
    snprintf(elements, sizeof elements, "%" PRId64, o->model->num_params);
    const llmt_st_meta meta[5] = {{"format", "pt"}, {"llmt.first", first}, {"llmt.end", end},
                                  {"llmt.world_size", ranks}, {"llmt.elements", elements}};
    llmt_st_write_opts opts = LLMT_ST_WRITE_OPTS_INIT;
    opts.durable = sync;
    opts.hash_chunk_bytes = CHUNK; /* the manifest's chunk checksums, hashed as written */
    llmt_st_write_result res = {0, 0, NULL, 0};
    char *path = path_of(dir, out->file.name);
    int rc = path ? llmt_st_write(path, t, (size_t)n, meta, 5, &opts, &res) : LLMT_ENOMEM;
    out->file.bytes = res.file_bytes;
    out->file.xxh3 = res.xxh3;
    out->chunks = res.chunks;
    out->n_chunks = res.n_chunks;
    free(path);
    return rc;
}

/* ---- reading */

/* One open shard file, read chunk by chunk: each chunk is hashed whole
 * against the manifest before any byte of it is used. */
typedef struct checked_file {
    const llmt_manifest_shard *sh;
    uint64_t chunk;  /* bytes per checksum */
    const char *path;
    int fd;
    char *buf;      /* the chunk last read and checked */
    int64_t loaded; /* its index, -1: none */
} checked_file;

/* The bytes of chunk c (the last chunk of a file may be shorter). */
static size_t chunk_size(const checked_file *f, uint64_t c)
{
    uint64_t at = c * f->chunk;
    return (size_t)(f->sh->file.bytes - at < f->chunk ? f->sh->file.bytes - at : f->chunk);
}

/* Reads chunk c into buf and checks it against the manifest. */
static int read_chunk(checked_file *f, uint64_t c, char *buf)
{
    uint64_t at = c * f->chunk;
    size_t take = chunk_size(f, c);
    LLMT_TRY(llmt_pread_all(f->fd, f->path, buf, take, at));
    if (XXH3_64bits(buf, take) != f->sh->chunks[c])
        return llmt_fail(LLMT_ECORRUPT, "file %s: checksum mismatch in chunk %" PRIu64
                         " (bytes %" PRIu64 "..%" PRIu64 ")", f->sh->file.name, c, at,
                         at + take);
    return LLMT_OK;
}

/* Chunk c into f->buf (unless it is there already), checked. */
static int load_chunk(checked_file *f, uint64_t c)
{
    if (f->loaded == (int64_t)c)
        return LLMT_OK;
    f->loaded = -1;
    LLMT_TRY(read_chunk(f, c, f->buf));
    f->loaded = (int64_t)c;
    return LLMT_OK;
}

/* Bytes [offset, offset + bytes) of the file into dst (NULL: only checked):
 * host memory when on_host, else the device memory of m (NULL when
 * on_host). A chunk that host memory takes whole is read straight into it
 * and checked there (no copy); when it does not match, dst holds unchecked
 * bytes and the read fails: the caller must not use them. Every other
 * chunk passes through f->buf, checked before a byte of it is copied. */
static int read_checked(checked_file *f, const llmt_model *m, uint64_t offset, uint64_t bytes,
                        char *dst, int on_host)
{
    if (offset + bytes > f->sh->file.bytes)
        return llmt_fail(LLMT_ECORRUPT, "file %s: bytes %" PRIu64 "..%" PRIu64 " lie past its "
                         "end", f->sh->file.name, offset, offset + bytes);
    while (bytes) {
        uint64_t c = offset / f->chunk, in = offset - c * f->chunk;
        uint64_t take = f->chunk - in < bytes ? f->chunk - in : bytes;
        if (dst && on_host && in == 0 && take == chunk_size(f, c) && f->loaded != (int64_t)c) {
            LLMT_TRY(read_chunk(f, c, dst));
        } else {
            LLMT_TRY(load_chunk(f, c));
            if (dst && on_host)
                memcpy(dst, f->buf + in, (size_t)take);
            else if (dst)
                LLMT_TRY(m->ops->copy_to_device(m->dev, dst, f->buf + in, (size_t)take));
        }
        if (dst)
            dst += take;
        offset += take;
        bytes -= take;
    }
    return LLMT_OK;
}

/* Opens a shard file: present, a regular file of the manifest's size. */
static int open_checked(checked_file *f, const char *dir)
{
    char *path = path_of(dir, f->sh->file.name);
    if (!path)
        return LLMT_ENOMEM;
    f->path = path;
    struct stat st;
    f->fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (f->fd < 0)
        return llmt_fail(errno == ENOENT || errno == ELOOP ? LLMT_ECORRUPT : LLMT_EIO,
                         "file %s: cannot open: %s", f->sh->file.name, strerror(errno));
    if (fstat(f->fd, &st) != 0)
        return llmt_fail(LLMT_EIO, "file %s: %s", f->sh->file.name, strerror(errno));
    if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size != f->sh->file.bytes)
        return llmt_fail(LLMT_ECORRUPT, "file %s: size %lld, the manifest says %" PRIu64,
                         f->sh->file.name, (long long)st.st_size, f->sh->file.bytes);
    if (!(f->buf = malloc((size_t)f->chunk)))
        return llmt_fail(LLMT_ENOMEM, "out of memory");
    posix_fadvise(f->fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    return LLMT_OK;
}

/* The tensor of section sec in shard file st, checked against the shard. */
static int shard_tensor(llmt_st_file *st, const checked_file *f, const llmt_optimizer *o, int sec,
                        const llmt_st_tensor **out)
{
    size_t idx = 0;
    const char *name = f->sh->file.name;
    if (llmt_st_count(st) != (size_t)sections_of(o))
        return llmt_fail(LLMT_EINVAL, "file %s: %zu state tensors; this optimizer has %d (the "
                         "checkpoint was saved with another precision)", name, llmt_st_count(st),
                         sections_of(o));
    if (llmt_st_find(st, section_name[sec], &idx))
        return llmt_fail(LLMT_ECORRUPT, "file %s: tensor \"%s\" is missing", name,
                         section_name[sec]);
    const llmt_st_tensor *t = llmt_st_tensor_at(st, idx);
    if (t->ndim != 1 || t->shape[0] != (uint64_t)(f->sh->end - f->sh->first))
        return llmt_fail(LLMT_ECORRUPT, "file %s: tensor \"%s\" does not hold its range [%" PRId64
                         ", %" PRId64 ")", name, section_name[sec], f->sh->first, f->sh->end);
    if (t->dtype != section_dtype(o, sec))
        return llmt_fail(LLMT_EINVAL, "file %s: tensor \"%s\" is %s; this optimizer keeps %s",
                         name, section_name[sec], llmt_dtype_name(t->dtype),
                         llmt_dtype_name(section_dtype(o, sec)));
    *out = t;
    return LLMT_OK;
}

/* Elements [a, b) of state section sec from the file bytes at offset
 * (element a's), into the optimizer's host segment [first, split) and
 * device segment [split, end) (an offloaded optimizer's; without offload
 * split = first). */
static int read_state(checked_file *f, llmt_optimizer *o, int sec, uint64_t offset, int64_t a,
                      int64_t b)
{
    const llmt_model *m = o->model;
    size_t es = llmt_dtype_size(section_dtype(o, sec));
    while (a < b) {
        int64_t idx = 0, end = a < o->split && o->split < b ? o->split : b;
        char *base = llmt_offload_state_base(o, sec, a, &idx);
        LLMT_TRY(read_checked(f, m, offset, (uint64_t)(end - a) * es, base + (size_t)idx * es,
                              a < o->split || m->ops->host_memory));
        offset += (uint64_t)(end - a) * es;
        a = end;
    }
    return LLMT_OK;
}

/* Checks the chunks that hold the file's header (its 8-byte length, then
 * the JSON) before anything parses it. */
static int check_header(checked_file *f)
{
    unsigned char len[8];
    LLMT_TRY(read_checked(f, NULL, 0, sizeof len, (char *)len, 1));
    uint64_t n = 0;
    for (int i = (int)sizeof len - 1; i >= 0; i--)
        n = n << 8 | len[i];
    if (n > f->sh->file.bytes - sizeof len)
        return llmt_fail(LLMT_ECORRUPT, "file %s: a header of %" PRIu64 " bytes in a file of %"
                         PRIu64, f->sh->file.name, n, f->sh->file.bytes);
    return read_checked(f, NULL, sizeof len, n, NULL, 1);
}

/* Reads the part of shard sh that overlaps [o->first, o->end). */
static int read_shard(const char *dir, const llmt_manifest_shard *sh, uint64_t chunk,
                      llmt_optimizer *o)
{
    checked_file f = {sh, chunk, NULL, -1, NULL, -1};
    llmt_st_file *st = NULL;
    int rc = open_checked(&f, dir);
    if (!rc)
        rc = check_header(&f);
    if (!rc)
        rc = llmt_st_open(f.path, NULL, &st);
    int64_t a = sh->first > o->first ? sh->first : o->first;
    int64_t b = sh->end < o->end ? sh->end : o->end;
    for (int sec = 0; sec < sections_of(o) && !rc; sec++) {
        const llmt_st_tensor *t = NULL;
        size_t es = llmt_dtype_size(section_dtype(o, sec));
        rc = shard_tensor(st, &f, o, sec, &t);
        if (!rc && b > a)
            rc = read_state(&f, o, sec, t->file_offset + (uint64_t)(a - sh->first) * es, a, b);
    }
    llmt_st_close(st);
    if (f.fd >= 0)
        close(f.fd);
    free(f.buf);
    free((char *)f.path);
    return rc;
}

/* Bytes of optimizer.safetensors read at once into the host bounce buffer
 * on the way to device memory (format 1 on a backend whose memory is not
 * host memory). */
#define V1_BOUNCE ((size_t)4 << 20)

/* Bytes [off, off + bytes) of tensor idx of st into dst: straight there
 * when dst is host memory (on_host), else through bounce (V1_BOUNCE bytes)
 * into the device memory of m. */
static int read_slice(llmt_st_file *st, size_t idx, size_t off, char *dst, size_t bytes,
                      const llmt_model *m, int on_host, char *bounce)
{
    if (on_host)
        return llmt_st_read(st, idx, off, dst, bytes);
    for (size_t done = 0; done < bytes;) {
        size_t take = bytes - done < V1_BOUNCE ? bytes - done : V1_BOUNCE;
        LLMT_TRY(llmt_st_read(st, idx, off + done, bounce, take));
        LLMT_TRY(m->ops->copy_to_device(m->dev, dst + done, bounce, take));
        done += take;
    }
    return LLMT_OK;
}

/* Format 1: o's range of each section from optimizer.safetensors, tensor
 * by tensor (each parameter's overlap with the range), into the host
 * segment [first, split) and the device segment [split, end). */
static int read_v1(const char *dir, llmt_optimizer *o)
{
    const llmt_model *m = o->model;
    char *path = path_of(dir, CKPT_OPTIMIZER_FILE);
    char *bounce = NULL;
    llmt_st_file *st = NULL;
    int rc = path ? LLMT_OK : LLMT_ENOMEM;
    if (!rc && !m->ops->host_memory && !(bounce = malloc(V1_BOUNCE)))
        rc = llmt_fail(LLMT_ENOMEM, "%s: out of memory for a read buffer", CKPT_OPTIMIZER_FILE);
    if (!rc)
        rc = llmt_st_open(path, NULL, &st);
    for (int sec = 0; sec < sections_of(o) && !rc; sec++) {
        size_t es = llmt_dtype_size(section_dtype(o, sec));
        for (int32_t i = 0; i < m->n_params && !rc; i++) {
            const llmt_param *p = &m->params[i];
            int64_t a = p->offset > o->first ? p->offset : o->first;
            int64_t b = p->offset + p->numel < o->end ? p->offset + p->numel : o->end;
            char name[160];
            size_t idx = 0;
            snprintf(name, sizeof name, "%s.%s", p->name, section_name[sec]);
            if (b <= a)
                continue;
            if (llmt_st_find(st, name, &idx))
                rc = llmt_fail(LLMT_EINVAL, "file %s: no tensor \"%s\" (saved with another "
                               "precision or model?)", CKPT_OPTIMIZER_FILE, name);
            else if (llmt_st_tensor_at(st, idx)->dtype != section_dtype(o, sec) ||
                     llmt_st_tensor_at(st, idx)->end - llmt_st_tensor_at(st, idx)->begin !=
                         (uint64_t)p->numel * es)
                rc = llmt_fail(LLMT_EINVAL, "file %s: tensor \"%s\" has another dtype or size "
                               "than this optimizer's", CKPT_OPTIMIZER_FILE, name);
            for (int64_t e = a; e < b && !rc;) { /* across the split */
                int64_t at = 0, end = e < o->split && o->split < b ? o->split : b;
                char *base = llmt_offload_state_base(o, sec, e, &at);
                rc = read_slice(st, idx, (size_t)(e - p->offset) * es, base + (size_t)at * es,
                                (size_t)(end - e) * es, m, e < o->split || m->ops->host_memory,
                                bounce);
                e = end;
            }
        }
    }
    llmt_st_close(st);
    free(bounce);
    free(path);
    return rc;
}

int llmt_ckpt_shard_read(const char *dir, const llmt_manifest *mf, llmt_optimizer *o)
{
    if (!mf->has_optimizer)
        return llmt_fail(LLMT_EINVAL, "the checkpoint has no optimizer state to load");
    if (mf->format != LLMT_MANIFEST_FORMAT_SHARDED)
        return read_v1(dir, o);
    if (mf->num_elements != o->model->num_params)
        return llmt_fail(LLMT_EINVAL, "the checkpoint's optimizer state has %" PRId64 " elements, "
                         "this model %" PRId64, mf->num_elements, o->model->num_params);
    int rc = LLMT_OK;
    for (int32_t r = 0; r < mf->world_size && !rc; r++)
        if (mf->shards[r].end > o->first && mf->shards[r].first < o->end)
            rc = read_shard(dir, &mf->shards[r], mf->chunk_bytes, o);
    return rc;
}
