/* The plain file I/O the checkpoint benchmarks (bench_ckpt, bench_ckpt_dp)
 * time against the library's: a write + fsync into a new file, a whole-file
 * read, and dropping a file's cached pages. Each returns 0, or names the
 * step that failed (errno says why). Needs _GNU_SOURCE (or POSIX 2008). */
#ifndef LLMT_BENCH_FILE_IO_H
#define LLMT_BENCH_FILE_IO_H

#include <fcntl.h>
#include <stddef.h>
#include <unistd.h>

/* One read() or write() moves at most this much. */
#define BENCH_IO_CHUNK ((size_t)64 << 20)

/* Drops a file's cached pages, so the next read comes from the disk (or
 * from what caches below the guest's page cache: a VM's host). */
static inline void bench_drop_cache(const char *path)
{
    int fd = open(path, O_RDONLY);
    if (fd >= 0) {
        fdatasync(fd);
        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        close(fd);
    }
}

/* Seconds a timed phase waits before it starts (bench_settle). */
#define BENCH_SETTLE_S 3

/* Flushes dirty pages, then waits BENCH_SETTLE_S seconds, so that every
 * timed phase starts from the same state of the machine's memory: a VM
 * guest with free page reporting (virtio-balloon, as on these machines)
 * hands pages back to the host about 2 s after they are freed (a removed
 * file's cache, dropped pages), and touching them again costs a host fault
 * each (about 1 s per GB of page cache here: `dd` of 1.17 GB with fsync
 * took 0.97 s right after the same write, 1.83-1.95 s six seconds later).
 * Without the wait, whichever side ran second in a round found the first
 * side's freed pages still warm and wrote 2-3x faster. */
static inline void bench_settle(void)
{
    sync();
    sleep(BENCH_SETTLE_S);
}

/* Writes n bytes of buf to a new file at path and fsyncs it, then removes
 * old (NULL: none), as a save with keep = 1 writes a new step and then
 * removes the one before: both sides allocate fresh blocks and free as
 * many. On a VM's disk, blocks written before are often much faster to
 * write again than fresh ones, so an overwrite in place would not be the
 * same work. */
static inline const char *bench_write_new(const char *path, const char *old, const char *buf,
                                          size_t n)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0)
        return "plain open for writing";
    for (size_t off = 0; off < n;) {
        ssize_t k = write(fd, buf + off, n - off < BENCH_IO_CHUNK ? n - off : BENCH_IO_CHUNK);
        if (k <= 0) {
            close(fd);
            return "plain write";
        }
        off += (size_t)k;
    }
    int synced = fsync(fd) == 0;
    close(fd);
    if (!synced)
        return "plain fsync";
    return old && unlink(old) != 0 ? "removing the previous plain file" : NULL;
}

/* Reads path whole into buf (cap bytes at most), its size into *got. */
static inline const char *bench_read_whole(const char *path, char *buf, size_t cap, size_t *got)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return "plain open for reading";
    size_t off = 0;
    for (;;) {
        ssize_t k = read(fd, buf + off, cap - off < BENCH_IO_CHUNK ? cap - off : BENCH_IO_CHUNK);
        if (k < 0 || (k == 0 && off == cap)) {
            close(fd);
            return "plain read: the buffer is too small or read failed";
        }
        if (k == 0)
            break;
        off += (size_t)k;
    }
    close(fd);
    *got = off;
    return NULL;
}

#endif
