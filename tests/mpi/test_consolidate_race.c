/* llmt_ckpt_consolidate never replaces its destination, even one created
 * after its first check (an empty directory, which a plain rename would
 * silently replace):
 *
 *   test_consolidate_race DIR   consolidates step 10 of DIR/ckpt (the
 *       sharded checkpoint of `test_ckpt_sharded save`, opened read-only)
 *       into DIR/race-*: while the output is written, an empty
 *       step-00000010 appears there (the link-time wrapper of
 *       llmt_ckpt_write_dir makes it); the call is refused naming it, the
 *       intruder is left as it was, and no temporary directory stays. The
 *       same with renameat2 refusing RENAME_NOREPLACE (EINVAL, as some file
 *       systems do: the wrapper of renameat2), which takes the fallback; and
 *       the fallback with no intruder gives the very files of the usual path.
 *       An empty step-00000010 there beforehand (what a crash between the
 *       fallback's claim and its rename leaves) is refused with a hint.
 *
 * Linked with -Wl,--wrap=llmt_ckpt_write_dir,--wrap=renameat2 against the
 * static library: the wrappers stand between consolidate.c and the calls. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/store_internal.h"
#include "llmt/llmt.h"

static int failures;

#define EXPECT(cond, ...)                                             \
    do {                                                              \
        if (!(cond)) {                                                \
            fprintf(stderr, "FAILED %s:%d: ", __FILE__, __LINE__);    \
            fprintf(stderr, __VA_ARGS__);                             \
            fprintf(stderr, "\n");                                    \
            failures++;                                               \
        }                                                             \
    } while (0)

static void must(int rc, const char *what)
{
    if (rc != LLMT_OK) {
        fprintf(stderr, "%s: status %d: %s\n", what, rc, llmt_error_last());
        exit(1);
    }
}

/* ---- the wrappers */

static const char *intruder;   /* made (empty) once the output is written; NULL: none */
static int refuse_noreplace;   /* renameat2 fails RENAME_NOREPLACE with EINVAL */
static int noreplace_calls;    /* renameat2 calls with RENAME_NOREPLACE */

int __real_llmt_ckpt_write_dir(const char *tmp, ckpt_snapshot *snap, int sync);
int __wrap_llmt_ckpt_write_dir(const char *tmp, ckpt_snapshot *snap, int sync);
int __real_renameat2(int olddirfd, const char *oldpath, int newdirfd, const char *newpath,
                     unsigned int flags);
int __wrap_renameat2(int olddirfd, const char *oldpath, int newdirfd, const char *newpath,
                     unsigned int flags);

int __wrap_llmt_ckpt_write_dir(const char *tmp, ckpt_snapshot *snap, int sync)
{
    int rc = __real_llmt_ckpt_write_dir(tmp, snap, sync);
    if (intruder && mkdir(intruder, 0755) != 0) {
        fprintf(stderr, "mkdir %s: %s\n", intruder, strerror(errno));
        exit(1);
    }
    return rc;
}

int __wrap_renameat2(int olddirfd, const char *oldpath, int newdirfd, const char *newpath,
                     unsigned int flags)
{
    if (flags & RENAME_NOREPLACE) {
        noreplace_calls++;
        if (refuse_noreplace) {
            errno = EINVAL;
            return -1;
        }
    }
    return __real_renameat2(olddirfd, oldpath, newdirfd, newpath, flags);
}

/* ---- the test */

static int run_cmd(const char *fmt, const char *a, const char *b)
{
    char cmd[2400];
    snprintf(cmd, sizeof cmd, fmt, a, b);
    return system(cmd);
}

/* Consolidates step 10 into out while an empty out/step-00000010 appears:
 * refused naming it, the intruder still empty, nothing else in out. */
static void refused(llmt_ckpt_store *s, const char *out, int fallback)
{
    char final[1100];
    snprintf(final, sizeof final, "%s/step-00000010", out);
    run_cmd("rm -rf '%s'%s", out, "");
    intruder = final;
    refuse_noreplace = fallback;
    noreplace_calls = 0;
    int rc = llmt_ckpt_consolidate(s, 10, LLMT_CKPT_DURABLE, out);
    intruder = NULL;
    refuse_noreplace = 0;
    const char *how = fallback ? "the fallback" : "RENAME_NOREPLACE";
    EXPECT(noreplace_calls == 1, "%s: renameat2 with RENAME_NOREPLACE called %d times", how,
           noreplace_calls);
    EXPECT(rc == LLMT_EINVAL && strstr(llmt_error_last(), final) &&
               strstr(llmt_error_last(), "created while consolidating"),
           "%s: a destination created meanwhile: status %d: %s", how, rc, llmt_error_last());
    EXPECT(run_cmd("test -d '%s' && test -z \"$(ls -A '%s')\"", final, final) == 0,
           "%s: the intruder %s was replaced or filled", how, final);
    EXPECT(run_cmd("test \"$(ls -A '%s')\" = step-00000010%s", out, "") == 0,
           "%s: %s holds more than the intruder", how, out);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR (the directory of test_ckpt_sharded save)\n", argv[0]);
        return 2;
    }
    char ckpt[900], out[900], plain[900];
    snprintf(ckpt, sizeof ckpt, "%s/ckpt", argv[1]);
    llmt_context *ctx = NULL;
    llmt_context_config cc = LLMT_CONTEXT_CONFIG_INIT;
    cc.num_threads = 1;
    must(llmt_context_create(&ctx, &cc), "context");
    llmt_ckpt_store_config sc = LLMT_CKPT_STORE_CONFIG_INIT;
    sc.read_only = 1; /* the fixture is shared with the load tests */
    llmt_ckpt_store *s = NULL;
    must(llmt_ckpt_store_open(&s, ctx, ckpt, &sc), ckpt);

    snprintf(out, sizeof out, "%s/race-noreplace", argv[1]);
    refused(s, out, 0);
    snprintf(out, sizeof out, "%s/race-fallback", argv[1]);
    refused(s, out, 1);

    /* An empty destination left beforehand: refused, saying how it comes
     * about and what to do. */
    snprintf(out, sizeof out, "%s/race-left", argv[1]);
    char final[1100];
    snprintf(final, sizeof final, "%s/step-00000010", out);
    run_cmd("rm -rf '%s' && mkdir -p '%s'", out, final);
    int rc = llmt_ckpt_consolidate(s, 10, LLMT_CKPT_DURABLE, out);
    EXPECT(rc == LLMT_EINVAL && strstr(llmt_error_last(), final) &&
               strstr(llmt_error_last(), "crashed between claiming it and renaming") &&
               strstr(llmt_error_last(), "remove it"),
           "an empty destination left by a crash: status %d: %s", rc, llmt_error_last());

    /* The fallback, undisturbed, against the usual path: the same files. */
    snprintf(plain, sizeof plain, "%s/race-plain", argv[1]);
    run_cmd("rm -rf '%s' '%s'", out, plain);
    must(llmt_ckpt_consolidate(s, 10, LLMT_CKPT_DURABLE, plain), "consolidate");
    refuse_noreplace = 1;
    rc = llmt_ckpt_consolidate(s, 10, LLMT_CKPT_DURABLE, out);
    refuse_noreplace = 0;
    EXPECT(rc == LLMT_OK, "the fallback: status %d: %s", rc, llmt_error_last());
    static const char *const files[] = {"MANIFEST", "model.safetensors", "optimizer.safetensors",
                                        "user.bin"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char a[1100], b[1100];
        snprintf(a, sizeof a, "%s/step-00000010/%s", out, files[i]);
        snprintf(b, sizeof b, "%s/step-00000010/%s", plain, files[i]);
        EXPECT(run_cmd("cmp -s '%s' '%s'", a, b) == 0, "the fallback's %s differs", files[i]);
    }
    EXPECT(run_cmd("test \"$(ls -A '%s')\" = step-00000010%s", out, "") == 0,
           "the fallback left more than step-00000010 in %s", out);
    llmt_ckpt_store_free(s);
    llmt_context_free(ctx);
    printf("consolidate race: %s\n", failures ? "FAILED" : "all passed");
    return failures ? 1 : 0;
}
