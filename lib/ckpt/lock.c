#define _DEFAULT_SOURCE /* flock */
/* The store's lock: one writing process at a time per checkpoint directory.
 * Two writers on one directory would resume each other's checkpoints and
 * delete each other's saves in progress; the second open fails instead.
 * Readers take no lock (see llmt_ckpt_store_open). */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <time.h>
#include <unistd.h>

#include "ckpt/store_internal.h"
#include "core/error.h"

/* Guards the list of open stores and every store's lock_fd: a fork from
 * another thread finds each lock descriptor either not yet opened or
 * recorded in lock_fd (which the child closes), never open but unrecorded. */
static pthread_mutex_t open_mutex = PTHREAD_MUTEX_INITIALIZER;

/* The holder's pid as the lock file says it ("?" when unreadable). The
 * holder writes it just after taking the lock, so an empty file is read
 * again for up to a second (the documented bound on failing "at once"). */
static void holder_of(int fd, char *pid, size_t cap)
{
    char buf[32] = "";
    for (int tries = 0; tries < 20 && !buf[0]; tries++) {
        if (tries)
            nanosleep(&(struct timespec){0, 50000000}, NULL);
        ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
        buf[n > 0 ? n : 0] = '\0';
        buf[strspn(buf, "0123456789")] = '\0';
    }
    snprintf(pid, cap, "%s", buf[0] ? buf : "?");
}

/* Closes tier's lock descriptor and forgets it, as one step for fork. */
static void close_lock(llmt_ckpt_store *s, int tier)
{
    pthread_mutex_lock(&open_mutex);
    close(s->lock_fd[tier]);
    s->lock_fd[tier] = -1;
    pthread_mutex_unlock(&open_mutex);
}

int llmt_ckpt_lock(llmt_ckpt_store *s, int tier)
{
    const char *dir = s->dir[tier];
    if (access(dir, W_OK) != 0) { /* a directory this process cannot write: read it */
        snprintf(s->read_only[tier], sizeof s->read_only[tier], "%s: not writable: %s", dir,
                 strerror(errno));
        return LLMT_OK;
    }
    size_t n = strlen(dir) + sizeof CKPT_LOCK_FILE + 1;
    char *path = malloc(n);
    if (!path)
        return llmt_fail(LLMT_ENOMEM, "%s: out of memory", dir);
    snprintf(path, n, "%s/%s", dir, CKPT_LOCK_FILE);
    int rc = LLMT_OK;
    pthread_mutex_lock(&open_mutex);
    int fd = s->lock_fd[tier] = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    pthread_mutex_unlock(&open_mutex);
    if (fd < 0)
        rc = llmt_fail(LLMT_EIO, "%s: cannot open: %s", path, strerror(errno));
    if (!rc && flock(fd, LOCK_EX | LOCK_NB) != 0) {
        if (errno == EWOULDBLOCK) {
            char pid[32];
            holder_of(fd, pid, sizeof pid);
            int self = atol(pid) == (long)getpid();
            rc = llmt_fail(LLMT_EBUSY, "%s: the checkpoint directory is locked by %s %s (%s): "
                           "one writing store per directory at a time (open with read_only "
                           "to read beside it)", dir, self ? "this process," : "process", pid,
                           path);
        } else {
            rc = llmt_fail(LLMT_EIO, "%s: cannot lock: %s", path, strerror(errno));
        }
    }
    if (!rc) {
        char pid[32];
        int len = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
        if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)len, 0) != len)
            rc = llmt_fail(LLMT_EIO, "%s: cannot write the pid: %s", path, strerror(errno));
    }
    if (rc && fd >= 0)
        close_lock(s, tier);
    free(path);
    return rc;
}

void llmt_ckpt_unlock(llmt_ckpt_store *s)
{
    for (int t = 0; t < 2; t++)
        if (s->lock_fd[t] >= 0)
            close_lock(s, t); /* releases the flock; the file stays for the next holder */
}

/* ---- fork: the open stores, whose lock descriptors a child closes */

static llmt_ckpt_store *open_stores;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

/* Held across fork, so the child finds the list whole. */
static void before_fork(void)
{
    pthread_mutex_lock(&open_mutex);
}

static void after_fork_parent(void)
{
    pthread_mutex_unlock(&open_mutex);
}

/* In the child: a flock belongs to the open file description, which the
 * child's descriptors share with the parent's, and is released only when
 * every descriptor of it is closed; closing the child's copies (never
 * LOCK_UN, which would release the parent's lock) lets the lock end with
 * the parent's store. The child's copy of a store keeps reading but may not
 * save (no lock), and has no save thread to join. */
static void after_fork_child(void)
{
    /* Only async-signal-safe calls here (the parent may have had threads):
     * close and memcpy, no snprintf. */
    static const char why[] = "a fork child's copy of the store, which holds no lock";
    _Static_assert(sizeof why <= sizeof open_stores->read_only[0], "read_only holds why");
    for (llmt_ckpt_store *s = open_stores; s; s = s->next_open) {
        for (int t = 0; t < 2; t++)
            if (s->lock_fd[t] >= 0) {
                close(s->lock_fd[t]);
                s->lock_fd[t] = -1;
                memcpy(s->read_only[t], why, sizeof why);
            }
        s->in_flight = 0;
    }
    pthread_mutex_unlock(&open_mutex);
}

static void install_atfork(void)
{
    pthread_atfork(before_fork, after_fork_parent, after_fork_child);
}

void llmt_ckpt_track(llmt_ckpt_store *s, int open)
{
    pthread_once(&atfork_once, install_atfork);
    pthread_mutex_lock(&open_mutex);
    llmt_ckpt_store **at = &open_stores;
    while (*at && *at != s)
        at = &(*at)->next_open;
    if (open && !*at) {
        s->next_open = NULL;
        *at = s;
    } else if (!open && *at) {
        *at = s->next_open;
    }
    pthread_mutex_unlock(&open_mutex);
}
