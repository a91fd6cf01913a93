/* Token shards: the atomic writer and the validating read-only mapping of
 * llm.c shards and of header-less uint16 files (*.u16, nanoGPT's .bin). */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "llmt/data.h"
#include "core/error.h"
#include "data/shard.h"
#include "util/fsutil.h"

#define HEADER_INTS 256
/* Bytes the writer converts at a time. */
#define WRITE_CHUNK ((size_t)1 << 16)

_Static_assert(LLMT_SHARD_HEADER_BYTES == HEADER_INTS * 4, "the header is 256 int32");

static void put_le32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}

static uint32_t get_le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* ---- Writer ---- */

/* Writes the header and the tokens (already checked) to fd in chunks. */
static int write_shard_body(int fd, const int32_t *tokens, size_t n, int32_t version,
                            const char *path, const char *tmp)
{
    unsigned char *buf = malloc(WRITE_CHUNK);
    if (!buf)
        return llmt_fail(LLMT_ENOMEM, "%s: out of memory for a write buffer", path);
    memset(buf, 0, LLMT_SHARD_HEADER_BYTES);
    put_le32(buf, LLMT_SHARD_MAGIC);
    put_le32(buf + 4, (uint32_t)version);
    put_le32(buf + 8, (uint32_t)n);
    int rc = llmt_write_all(fd, buf, LLMT_SHARD_HEADER_BYTES, path, tmp);
    size_t width = version == LLMT_SHARD_VERSION_U16 ? 2 : 4;
    size_t per_chunk = WRITE_CHUNK / width;
    for (size_t i = 0; !rc && i < n; i += per_chunk) {
        size_t m = n - i < per_chunk ? n - i : per_chunk;
        for (size_t j = 0; j < m; j++) {
            uint32_t v = (uint32_t)tokens[i + j];
            if (width == 2) {
                buf[2 * j] = (unsigned char)v;
                buf[2 * j + 1] = (unsigned char)(v >> 8);
            } else {
                put_le32(buf + 4 * j, v);
            }
        }
        rc = llmt_write_all(fd, buf, m * width, path, tmp);
    }
    free(buf);
    return rc;
}

int llmt_shard_write(const char *path, const int32_t *tokens, size_t n, int32_t version)
{
    if (!path || !path[0])
        return llmt_fail(LLMT_EINVAL, "llmt_shard_write: path is %s", path ? "empty" : "NULL");
    if (!tokens && n)
        return llmt_fail(LLMT_EINVAL, "%s: tokens is NULL with n = %zu", path, n);
    if (version != LLMT_SHARD_VERSION_U16 && version != LLMT_SHARD_VERSION_U32)
        return llmt_fail(LLMT_EINVAL,
                         "%s: shard version = %" PRId32 " (1: uint16 tokens, 2: uint32 tokens)",
                         path, version);
    if (n > INT32_MAX)
        return llmt_fail(LLMT_EINVAL, "%s: n = %zu tokens, more than a shard's int32 count holds",
                         path, n);
    int32_t top = version == LLMT_SHARD_VERSION_U16 ? 65535 : INT32_MAX;
    for (size_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] > top)
            return llmt_fail(LLMT_EINVAL,
                             "%s: tokens[%zu] = %" PRId32
                             " does not fit shard version %" PRId32 " (0..%" PRId32 ")",
                             path, i, tokens[i], version, top);

    static const char suffix[] = ".tmp-XXXXXX";
    size_t path_len = strlen(path);
    char *tmp = malloc(path_len + sizeof suffix);
    if (!tmp)
        return llmt_fail(LLMT_ENOMEM, "%s: out of memory", path);
    memcpy(tmp, path, path_len);
    memcpy(tmp + path_len, suffix, sizeof suffix);
    int fd = mkstemp(tmp);
    if (fd < 0) {
        int rc = llmt_fail(LLMT_EIO, "%s: creating %s: %s", path, tmp, strerror(errno));
        free(tmp);
        return rc;
    }
    int rc = LLMT_OK;
    if (fchmod(fd, 0644) != 0)
        rc = llmt_fail(LLMT_EIO, "%s: chmod %s: %s", path, tmp, strerror(errno));
    if (!rc)
        rc = write_shard_body(fd, tokens, n, version, path, tmp);
    if (!rc && fsync(fd) != 0)
        rc = llmt_fail(LLMT_EIO, "%s: fsync of %s: %s", path, tmp, strerror(errno));
    if (close(fd) != 0 && !rc)
        rc = llmt_fail(LLMT_EIO, "%s: closing %s: %s", path, tmp, strerror(errno));
    if (!rc && rename(tmp, path) != 0)
        rc = llmt_fail(LLMT_EIO, "%s: renaming %s over it: %s", path, tmp, strerror(errno));
    if (rc)
        unlink(tmp);
    else
        rc = llmt_sync_parent(path);
    free(tmp);
    return rc;
}

/* ---- Reader ---- */

/* Said where a file has no llm.c header, for nanoGPT's header-less files. */
#define HEADERLESS_HINT                                                                      \
    " (a header-less uint16 file, as nanoGPT writes, is read when its name ends in *" \
    LLMT_SHARD_HEADERLESS_SUFFIX ": docs/data.md)"

static int is_headerless(const char *path)
{
    size_t n = strlen(path), k = strlen(LLMT_SHARD_HEADERLESS_SUFFIX);
    return n >= k && strcmp(path + n - k, LLMT_SHARD_HEADERLESS_SUFFIX) == 0;
}

/* Whether the file is a whole, consistent llm.c shard: the magic, a known
 * version and a count that accounts for every byte. Sets no error. */
static int is_llmc_shard(const unsigned char *h, uint64_t file_bytes)
{
    if (file_bytes < LLMT_SHARD_HEADER_BYTES || get_le32(h) != LLMT_SHARD_MAGIC)
        return 0;
    uint32_t ver = get_le32(h + 4), count = get_le32(h + 8);
    if ((ver != LLMT_SHARD_VERSION_U16 && ver != LLMT_SHARD_VERSION_U32) || count > INT32_MAX)
        return 0;
    uint64_t width = ver == LLMT_SHARD_VERSION_U16 ? 2 : 4;
    return file_bytes == LLMT_SHARD_HEADER_BYTES + (uint64_t)count * width;
}

static int check_header(const char *path, const unsigned char *h, uint64_t file_bytes,
                        int32_t *version, uint64_t *n_tokens)
{
    int32_t magic = (int32_t)get_le32(h), ver = (int32_t)get_le32(h + 4),
            count = (int32_t)get_le32(h + 8);
    if (magic != LLMT_SHARD_MAGIC)
        return llmt_fail(LLMT_ECORRUPT,
                         "%s: byte offset 0: magic %" PRId32
                         ", expected %d: not a token shard" HEADERLESS_HINT,
                         path, magic, LLMT_SHARD_MAGIC);
    if (ver != LLMT_SHARD_VERSION_U16 && ver != LLMT_SHARD_VERSION_U32)
        return llmt_fail(LLMT_EVERSION,
                         "%s: byte offset 4: shard version %" PRId32
                         " is unknown (1: uint16 tokens, 2: uint32 tokens)",
                         path, ver);
    if (count < 0)
        return llmt_fail(LLMT_ECORRUPT, "%s: byte offset 8: token count %" PRId32 " is negative",
                         path, count);
    uint64_t width = ver == LLMT_SHARD_VERSION_U16 ? 2 : 4;
    uint64_t expect = LLMT_SHARD_HEADER_BYTES + (uint64_t)count * width;
    if (file_bytes < expect)
        return llmt_fail(LLMT_ECORRUPT,
                         "%s: truncated: the header (byte offset 8) counts %" PRId32
                         " tokens of %" PRIu64 " bytes, which need %" PRIu64
                         " bytes, but the file ends at byte offset %" PRIu64 ", %" PRIu64
                         " bytes short",
                         path, count, width, expect, file_bytes, expect - file_bytes);
    if (file_bytes > expect)
        return llmt_fail(LLMT_ECORRUPT,
                         "%s: %" PRIu64 " extra bytes from byte offset %" PRIu64
                         ": the header (byte offset 8) counts %" PRId32 " tokens of %" PRIu64
                         " bytes, which need %" PRIu64 " bytes, but the file has %" PRIu64,
                         path, file_bytes - expect, expect, count, width, expect, file_bytes);
    *version = ver;
    *n_tokens = (uint64_t)count;
    return LLMT_OK;
}

/* Checks every token against vocab_size; the first one out of range fails. */
static int check_tokens(const char *path, const llmt_shard_map *s, int32_t vocab_size)
{
    if (s->token_bytes == 2 && vocab_size > 65535)
        return LLMT_OK; /* every uint16 fits */
    uint32_t vocab = (uint32_t)vocab_size;
    for (uint64_t i = 0; i < s->n_tokens; i++) {
        uint32_t t = llmt_shard_token(s, i);
        if (t >= vocab)
            return llmt_fail(LLMT_ECORRUPT,
                             "%s: token at position %" PRIu64 " (byte offset %" PRIu64
                             ") is %" PRIu32 ", not below vocab_size %" PRId32,
                             path, i, s->data_offset + i * (uint64_t)s->token_bytes, t,
                             vocab_size);
    }
    return LLMT_OK;
}

int llmt_shard_map_open(llmt_shard_map *s, const char *path, uint64_t min_tokens,
                        int32_t vocab_size)
{
    memset(s, 0, sizeof *s);
    /* O_NONBLOCK: opening a FIFO for reading would otherwise wait for a
     * writer; it is refused below as not a regular file. */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return llmt_fail(LLMT_EIO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int rc = llmt_fail(LLMT_EIO, "%s: cannot stat: %s", path, strerror(errno));
        close(fd);
        return rc;
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return llmt_fail(LLMT_EIO, "%s: not a regular file (a shard must be one)", path);
    }
    uint64_t bytes = (uint64_t)st.st_size;
    int headerless = is_headerless(path);
    int rc = LLMT_OK;
    if (!headerless && bytes < LLMT_SHARD_HEADER_BYTES)
        rc = llmt_fail(LLMT_ECORRUPT,
                       "%s: %" PRIu64
                       " bytes, shorter than the %d-byte shard header" HEADERLESS_HINT,
                       path, bytes, LLMT_SHARD_HEADER_BYTES);
    else if (headerless && bytes % 2)
        rc = llmt_fail(LLMT_ECORRUPT,
                       "%s: %" PRIu64 " bytes, an odd size for a header-less uint16 file: "
                       "byte offset %" PRIu64 " is half a token",
                       path, bytes, bytes - 1);
    else if (headerless && bytes / 2 < min_tokens) /* also keeps an empty file from mmap */
        rc = llmt_fail(LLMT_EINVAL, "%s: %" PRIu64 " tokens, fewer than seq_len + 1 = %" PRIu64,
                       path, bytes / 2, min_tokens);
    if (rc) {
        close(fd);
        return rc;
    }
    if (bytes > SIZE_MAX) {
        close(fd);
        return llmt_fail(LLMT_EIO, "%s: %" PRIu64 " bytes do not fit the address space", path,
                         bytes);
    }
    void *map = mmap(NULL, (size_t)bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    int map_errno = errno;
    close(fd);
    if (map == MAP_FAILED)
        return llmt_fail(LLMT_EIO, "%s: cannot map: %s", path, strerror(map_errno));

    llmt_shard_map m = {.map = map, .file_bytes = bytes};
    if (headerless) {
        m.version = LLMT_SHARD_VERSION_U16;
        m.n_tokens = bytes / 2;
        if (is_llmc_shard(m.map, bytes))
            rc = llmt_fail(LLMT_ECORRUPT,
                           "%s: starts with an llm.c shard header (byte offset 0: magic %d, "
                           "version, a count matching the size): an llm.c shard named as a "
                           "header-less *" LLMT_SHARD_HEADERLESS_SUFFIX " file; name it *.bin",
                           path, LLMT_SHARD_MAGIC);
    } else {
        m.data_offset = LLMT_SHARD_HEADER_BYTES;
        rc = check_header(path, m.map, bytes, &m.version, &m.n_tokens);
    }
    if (!rc) {
        m.token_bytes = m.version == LLMT_SHARD_VERSION_U16 ? 2 : 4;
        if (m.n_tokens < min_tokens)
            rc = llmt_fail(LLMT_EINVAL,
                           "%s: %" PRIu64 " tokens, fewer than seq_len + 1 = %" PRIu64, path,
                           m.n_tokens, min_tokens);
    }
    if (!rc) {
        posix_madvise(map, (size_t)bytes, POSIX_MADV_SEQUENTIAL);
        rc = check_tokens(path, &m, vocab_size);
        posix_madvise(map, (size_t)bytes, POSIX_MADV_NORMAL);
    }
    if (rc) {
        munmap(map, (size_t)bytes);
        return rc;
    }
    *s = m;
    return LLMT_OK;
}

void llmt_shard_map_close(llmt_shard_map *s)
{
    if (s && s->map)
        munmap((void *)s->map, (size_t)s->file_bytes);
    if (s)
        memset(s, 0, sizeof *s);
}
