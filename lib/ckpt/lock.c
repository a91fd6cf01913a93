#define _DEFAULT_SOURCE /* flock */
/* The store's lock: one process at a time per checkpoint directory. Two
 * processes on one directory would resume each other's checkpoints and
 * delete each other's saves in progress; the second open fails instead. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include "ckpt/store_internal.h"
#include "core/error.h"

/* The holder's pid as the lock file says it ("?" when unreadable). */
static void holder_of(int fd, char *pid, size_t cap)
{
    char buf[32];
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    buf[n > 0 ? n : 0] = '\0';
    buf[strspn(buf, "0123456789")] = '\0';
    snprintf(pid, cap, "%s", buf[0] ? buf : "?");
}

int llmt_ckpt_lock(llmt_ckpt_store *s, int tier)
{
    const char *dir = s->dir[tier];
    size_t n = strlen(dir) + sizeof CKPT_LOCK_FILE + 1;
    char *path = malloc(n);
    if (!path)
        return llmt_fail(LLMT_ENOMEM, "%s: out of memory", dir);
    snprintf(path, n, "%s/%s", dir, CKPT_LOCK_FILE);
    int rc = LLMT_OK, writable = 1;
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0 && (errno == EACCES || errno == EPERM || errno == EROFS)) {
        /* A directory this process cannot write: open it for reading only.
         * An existing lock file is still locked (flock needs no write
         * access); without one nothing is locked, and nothing is written. */
        snprintf(s->read_only[tier], sizeof s->read_only[tier], "%s: cannot create: %s", path,
                 strerror(errno));
        writable = 0;
        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0 && errno == ENOENT) {
            free(path);
            return LLMT_OK;
        }
    }
    if (fd < 0)
        rc = llmt_fail(LLMT_EIO, "%s: cannot open: %s", path, strerror(errno));
    if (!rc && writable && access(dir, W_OK) != 0) /* a writable lock file in a read-only directory */
        snprintf(s->read_only[tier], sizeof s->read_only[tier], "%s: not writable: %s", dir,
                 strerror(errno));
    if (!rc && flock(fd, LOCK_EX | LOCK_NB) != 0) {
        if (errno == EWOULDBLOCK) {
            char pid[32];
            holder_of(fd, pid, sizeof pid);
            int self = atol(pid) == (long)getpid();
            rc = llmt_fail(LLMT_EBUSY, "%s: the checkpoint directory is locked by %s %s (%s): "
                           "one store per directory at a time", dir,
                           self ? "this process," : "process", pid, path);
        } else {
            rc = llmt_fail(LLMT_EIO, "%s: cannot lock: %s", path, strerror(errno));
        }
    }
    if (!rc && writable) {
        char pid[32];
        int len = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
        if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)len, 0) != len)
            rc = llmt_fail(LLMT_EIO, "%s: cannot write the pid: %s", path, strerror(errno));
    }
    if (rc && fd >= 0)
        close(fd);
    else if (!rc)
        s->lock_fd[tier] = fd;
    free(path);
    return rc;
}

void llmt_ckpt_unlock(llmt_ckpt_store *s)
{
    for (int t = 0; t < 2; t++)
        if (s->lock_fd[t] >= 0) {
            close(s->lock_fd[t]); /* releases the flock; the file stays for the next holder */
            s->lock_fd[t] = -1;
        }
}
