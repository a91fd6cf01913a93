/* File-system helpers: directories, whole-file writes and reads, hashing. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "llmt/common.h"
#include "util/fsutil.h"
#include "util/hash_pipe.h"
#include "core/error.h"

#define IO_CHUNK ((size_t)8 << 20)

int llmt_mkdirs(const char *dir)
{
    char *path = strdup(dir);
    if (!path)
        return llmt_fail(LLMT_ENOMEM, "%s: out of memory", dir);
    int rc = LLMT_OK;
    for (char *p = path + 1;; p++) {
        if (*p == '/' || *p == '\0') {
            char keep = *p;
            *p = '\0';
            if (mkdir(path, 0755) != 0 && errno != EEXIST) {
                rc = llmt_fail(LLMT_EIO, "%s: cannot create directory %s: %s", dir, path,
                               strerror(errno));
                break;
            }
            *p = keep;
            if (!keep)
                break;
        }
    }
    struct stat st;
    if (!rc && (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)))
        rc = llmt_fail(LLMT_EIO, "%s: not a directory", dir);
    free(path);
    return rc;
}

int llmt_remove_tree(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return errno == ENOENT ? LLMT_OK
                               : llmt_fail(LLMT_EIO, "%s: cannot open: %s", dir, strerror(errno));
    int rc = LLMT_OK;
    struct dirent *e;
    while ((e = readdir(d)) && !rc) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        size_t n = strlen(dir) + strlen(e->d_name) + 2;
        char *p = malloc(n);
        if (!p) {
            rc = llmt_fail(LLMT_ENOMEM, "%s: out of memory", dir);
            break;
        }
        snprintf(p, n, "%s/%s", dir, e->d_name);
        struct stat st;
        if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode))
            rc = llmt_remove_tree(p);
        else if (unlink(p) != 0 && errno != ENOENT)
            rc = llmt_fail(LLMT_EIO, "%s: cannot remove: %s", p, strerror(errno));
        free(p);
    }
    closedir(d);
    if (!rc && rmdir(dir) != 0 && errno != ENOENT)
        rc = llmt_fail(LLMT_EIO, "%s: cannot remove: %s", dir, strerror(errno));
    return rc;
}

int llmt_sync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0 || fsync(fd) != 0) {
        int rc = llmt_fail(LLMT_EIO, "%s: cannot sync directory: %s", dir, strerror(errno));
        if (fd >= 0)
            close(fd);
        return rc;
    }
    close(fd);
    return LLMT_OK;
}

int llmt_sync_parent(const char *path)
{
    const char *slash = strrchr(path, '/');
    char *dir = !slash ? strdup(".") : strndup(path, slash == path ? 1 : (size_t)(slash - path));
    if (!dir)
        return llmt_fail(LLMT_ENOMEM, "%s: out of memory", path);
    int rc = llmt_sync_dir(dir);
    free(dir);
    return rc ? llmt_fail_prefix(rc, "%s: written, but", path) : LLMT_OK;
}

int llmt_write_all(int fd, const void *data, size_t n, const char *path, const char *tmp)
{
    const char *p = data;
    while (n) {
        ssize_t k = write(fd, p, n < IO_CHUNK ? n : IO_CHUNK);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return llmt_fail(LLMT_EIO, "%s: writing %s: %s", path, tmp,
                             k < 0 ? strerror(errno) : "no progress");
        p += k;
        n -= (size_t)k;
    }
    return LLMT_OK;
}

int llmt_write_file(const char *path, const void *data, size_t len, int sync, uint64_t *xxh3)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0)
        return llmt_fail(LLMT_EIO, "%s: cannot create: %s", path, strerror(errno));
    int rc = llmt_write_all(fd, data, len, path, path);
    if (!rc && sync && fsync(fd) != 0)
        rc = llmt_fail(LLMT_EIO, "%s: fsync failed: %s", path, strerror(errno));
    if (close(fd) != 0 && !rc)
        rc = llmt_fail(LLMT_EIO, "%s: close failed: %s", path, strerror(errno));
    if (!rc && xxh3)
        *xxh3 = XXH3_64bits(data, len);
    return rc;
}

int llmt_pread_all(int fd, const char *path, void *buf, size_t len, uint64_t offset)
{
    char *p = buf;
    while (len) {
        ssize_t k = pread(fd, p, len < IO_CHUNK ? len : IO_CHUNK, (off_t)offset);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return llmt_fail(LLMT_EIO, "%s: read at byte %llu failed: %s", path,
                             (unsigned long long)offset, k < 0 ? strerror(errno) : "unexpected end");
        p += k;
        len -= (size_t)k;
        offset += (uint64_t)k;
    }
    return LLMT_OK;
}

int llmt_read_file(const char *path, size_t max, char **out, size_t *len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return llmt_fail(LLMT_EIO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    int rc = LLMT_OK;
    if (fstat(fd, &st) != 0)
        rc = llmt_fail(LLMT_EIO, "%s: cannot stat: %s", path, strerror(errno));
    else if ((uint64_t)st.st_size > max)
        rc = llmt_fail(LLMT_ECORRUPT, "%s: %lld bytes, more than the %zu allowed", path,
                       (long long)st.st_size, max);
    char *buf = rc ? NULL : malloc((size_t)st.st_size + 1);
    if (!rc && !buf)
        rc = llmt_fail(LLMT_ENOMEM, "%s: out of memory", path);
    if (!rc)
        rc = llmt_pread_all(fd, path, buf, (size_t)st.st_size, 0);
    close(fd);
    if (rc) {
        free(buf);
        return rc;
    }
    buf[st.st_size] = '\0';
    *out = buf;
    *len = (size_t)st.st_size;
    return LLMT_OK;
}

int llmt_hash_file(const char *path, uint64_t *size, uint64_t *xxh3)
{
    /* Buffers filled in turn while the pipe hashes the ones before. */
    enum { BUFS = 3 };
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return llmt_fail(LLMT_EIO, "%s: cannot open: %s", path, strerror(errno));
    posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    char *buf = malloc(BUFS * IO_CHUNK);
    llmt_hash_pipe *pipe = NULL;
    uint64_t ticket[BUFS] = {0}, total = 0;
    int rc = buf ? llmt_hash_pipe_start(&pipe) : llmt_fail(LLMT_ENOMEM, "%s: out of memory", path);
    for (int k = 0; !rc; k = (k + 1) % BUFS) {
        llmt_hash_pipe_wait(pipe, ticket[k]);
        char *to = buf + (size_t)k * IO_CHUNK;
        ssize_t got;
        do
            got = read(fd, to, IO_CHUNK);
        while (got < 0 && errno == EINTR);
        if (got < 0)
            rc = llmt_fail(LLMT_EIO, "%s: read failed: %s", path, strerror(errno));
        if (got <= 0)
            break;
        ticket[k] = llmt_hash_pipe_push(pipe, to, (size_t)got);
        total += (uint64_t)got;
    }
    uint64_t digest = pipe ? llmt_hash_pipe_finish(pipe) : 0;
    if (!rc) {
        *size = total;
        *xxh3 = digest;
    }
    free(buf);
    close(fd);
    return rc;
}
