/* llmt-train's run directory: creating it, locking it, removing the default
 * fast tier (after the final save, or unused after a failed start), and the
 * final metrics record. */
#define _DEFAULT_SOURCE
#define _XOPEN_SOURCE 700 /* nftw */
#include <errno.h>
#include <fcntl.h>
#include <dirent.h>
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "train_cli.h"

int make_dirs(const char *dir)
{
    char path[4096];
    if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path) {
        fprintf(stderr, PROG ": --out %s: path too long\n", dir);
        return -1;
    }
    /* Each prefix ending before a '/' (the root and empty names skipped),
     * then the whole path. */
    for (char *p = path + 1;; p++) {
        if (*p != '/' && *p)
            continue;
        char saved = *p;
        *p = '\0';
        struct stat st;
        if (mkdir(path, 0755) != 0) {
            int err = errno; /* EEXIST, or EACCES/EROFS on a directory that exists */
            if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode)) {
                fprintf(stderr, PROG ": cannot create %s: %s\n", path,
                        err == EEXIST ? "it exists and is not a directory" : strerror(err));
                return -1;
            }
        }
        *p = saved;
        if (!saved)
            return 0;
    }
}

/* Reads the pid the holder of the lock wrote; it writes it just after
 * taking the lock, so an empty file is retried for up to a second. */
static long read_holder_pid(int fd)
{
    for (int tries = 0; tries < 20; tries++) {
        char buf[32] = {0};
        ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
        long pid = n > 0 ? strtol(buf, NULL, 10) : 0;
        if (pid > 0)
            return pid;
        nanosleep(&(struct timespec){0, 50000000}, NULL);
    }
    return 0;
}

int lock_run_dir(const char *dir)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/.llmt-train.lock", dir);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
        fprintf(stderr, PROG ": cannot open the lock file %s: %s\n", path, strerror(errno));
        return -1;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int err = errno;
        long pid = err == EWOULDBLOCK ? read_holder_pid(fd) : 0;
        if (err != EWOULDBLOCK)
            fprintf(stderr, PROG ": cannot lock %s: %s\n", path, strerror(err));
        else if (pid)
            fprintf(stderr, PROG ": %s is in use by another llmt-train (pid %ld, lock %s); "
                    "wait for it to end or choose another --out\n", dir, pid, path);
        else
            fprintf(stderr, PROG ": %s is in use by another llmt-train (lock %s); wait for it "
                    "to end or choose another --out\n", dir, path);
        close(fd);
        return -1;
    }
    char pid[32];
    int len = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
    if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)len, 0) != len) {
        fprintf(stderr, PROG ": cannot write the lock file %s: %s\n", path, strerror(errno));
        close(fd);
        return -1;
    }
    return fd;
}

static int remove_entry(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
    (void)st;
    (void)type;
    (void)ftw;
    return remove(path);
}

void remove_tree(const char *dir)
{
    if (nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0 && errno != ENOENT)
        fprintf(stderr, PROG ": cannot remove %s: %s\n", dir, strerror(errno));
}

/* Whether dir's only entry (besides . and ..) is the file named only. */
static int holds_only(const char *dir, const char *only)
{
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    int others = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        others += strcmp(e->d_name, ".") && strcmp(e->d_name, "..") && strcmp(e->d_name, only);
    closedir(d);
    return !others;
}

void remove_fast_dir_if_unused(const char *dir)
{
    static const char lock_name[] = "llmt.lock"; /* the store's (llmt/checkpoint.h) */
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, lock_name);
    int fd = open(path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT) /* made, never locked: rmdir fails unless it is empty */
            rmdir(dir);
        return;
    }
    /* Held from here until after the rmdir: no store can take it meanwhile.
     * The file locked must still be the one the path names (not one a
     * cleaner like this unlinked and a store created again). */
    struct stat held, named;
    if (flock(fd, LOCK_EX | LOCK_NB) == 0 && fstat(fd, &held) == 0 && lstat(path, &named) == 0 &&
        held.st_dev == named.st_dev && held.st_ino == named.st_ino && holds_only(dir, lock_name) &&
        unlink(path) == 0)
        rmdir(dir); /* ENOTEMPTY: a store created its lock file since; the directory is its */
    close(fd);
}

int append_final_eval(const char *path, long long step, double loss)
{
    FILE *f = fopen(path, "a");
    if (f && isfinite(loss))
        fprintf(f, "{\"event\":\"final_eval\",\"step\":%lld,\"eval_loss\":%.17g}\n", step, loss);
    else if (f)
        fprintf(f, "{\"event\":\"final_eval\",\"step\":%lld,\"eval_loss\":null}\n", step);
    if (!f || fclose(f) != 0) {
        fprintf(stderr, PROG ": cannot append to %s: %s\n", path, strerror(errno));
        return -1;
    }
    return 0;
}
