/* A fast checkpoint tier local to each node, under mpiexec -n 4.
 *
 * The nodes are simulated on one machine: the fast tier's path is the
 * relative "fast", and each rank works in the directory of its "node"
 * (DIR/<case>/A or B), so the same path names another directory on each
 * node, as /dev/shm does on real nodes. The durable tier is DIR/<case>/
 * durable, shared. Ranks 0 and 1 are on node A, ranks 2 and 3 on node B
 * (the layout "AABB") unless a case says otherwise.
 *
 *   - Saves every 2 steps into the fast tier, every 4 into the durable one,
 *     6 steps: each node keeps its two newest fast checkpoints, node A's
 *     copy holds the common files and the files of ranks 0 and 1, node B's
 *     those of ranks 2 and 3, the MANIFESTs are the same bytes (marked per
 *     node), and nothing else is left in either directory; neither copy
 *     verifies alone (the missing file named, the reason given). The
 *     durable checkpoint is whole and not marked.
 *   - A resume with the ranks where they were takes the fast step 6, and 4
 *     more steps give the uninterrupted run's bits.
 *   - A resume with the ranks on other nodes ("ABAB") cannot read step 6 on
 *     ranks 1 and 2: every rank falls back to the durable step 4 (logged),
 *     and continues to the same bits; without a durable checkpoint, every
 *     rank fails before any object was loaded into.
 *   - Node B's copy of step 6 replaced by another run's (a save of that
 *     step that rank 0 did not commit), or one of its files deleted: every
 *     rank falls back to step 4, the log naming the cause.
 *   - Every rank on one node ("AAAA"): the fast checkpoint is whole and not
 *     marked, as before this tier existed.
 *   - Rank 0's commit failing at steps 6 and 8 (a file in the way) after node
 *     B committed: node B still holds steps 2 and 4 (the other nodes rotate
 *     only after rank 0 committed), a resume takes step 4, and the next save
 *     leaves node B with exactly rank 0's steps (its copies of 6 and 8, which
 *     rank 0 never listed, gone).
 *   - Node B's commit failing (a file in the way): the save fails on every
 *     rank naming it, and no temporary directory or step 6 is left anywhere.
 *   - Node B's directory locked by another process: a resume does not need
 *     it (it loads step 6); the next fast save fails naming the lock.
 *   - Node B's fast path a plain file: the resume falls back to the durable
 *     step 4, and the first fast save fails, leaving no mark of the ranks'
 *     probe of the directories on node A.
 *   - llmt_ckpt_set_aside_invalid (llmt-train --start-over) refuses to set
 *     aside either node's intact copies (LLMT_ESTATE), renaming nothing, and
 *     sets them aside once damaged.
 *
 * Usage: mpiexec -n 4 test_ckpt_node_tier DIR (an absolute path). */
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <mpi.h>

#include "ckpt/manifest.h"
#include "ckpt_fixture.h"
#include "dp_run.h"
#include "llmt/comm_mpi.h"
#include "train/trainer_internal.h"

enum { SAVED = 6, MORE = 4 };

/* The files of a whole checkpoint of 4 ranks (ls -A order). */
#define ALL_FILES                                                                      \
    "MANIFEST\nmodel.safetensors\noptimizer-00001-of-00004.safetensors\n"             \
    "optimizer-00002-of-00004.safetensors\noptimizer-00003-of-00004.safetensors\n"     \
    "optimizer-00004-of-00004.safetensors\nuser.bin\n"

/* Moves this rank into its node's directory of case dir/tag (enter_node),
 * so "fast" is its node's fast tier; durable gets the durable tier's path. */
static void enter(const char *dir, const char *tag, const char *layout, char *durable,
                  size_t cap)
{
    char base[900];
    snprintf(durable, cap, "%s/%s/durable", dir, tag);
    snprintf(base, sizeof base, "%s/%s", dir, tag);
    enter_node(base, layout);
}

/* A run of case tag from step 0 to SAVED with seed, saving as the header
 * says; the last save committed. */
static void save_run(const char *dir, const char *tag, const char *layout, llmt_comm *comm,
                     uint64_t seed)
{
    char durable[900];
    enter(dir, tag, layout, durable, sizeof durable);
    run r;
    run_open(&r, dir, LLMT_PRECISION_BF16_MIXED, comm, LLMT_REDUCE_DETERMINISTIC, durable, 4,
             seed);
    train(&r, SAVED, NULL);
    must(llmt_trainer_save(r.tr, LLMT_CKPT_FAST), "the last save");
    run_close(&r);
}

/* The entries of path other than "." and "..", sorted, one per line. */
static void entries(const char *path, char *out, size_t cap)
{
    char cmd[1100];
    snprintf(cmd, sizeof cmd, "ls -A '%s' 2>&1", path);
    FILE *p = popen(cmd, "r");
    size_t n = p ? fread(out, 1, cap - 1, p) : 0;
    out[n] = '\0';
    if (p)
        pclose(p);
}

/* The bytes of a file (malloc'ed; NULL when it cannot be read). */
static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    char *buf = f ? malloc(1 << 20) : NULL;
    *len = buf ? fread(buf, 1, 1 << 20, f) : 0;
    if (f)
        fclose(f);
    return buf;
}

/* Expects node's copy of step in case dir (its checkpoint directory path)
 * to hold exactly the files listed in want (ls -A order). */
static void expect_files(const char *ckpt, const char *want)
{
    char got[1024];
    entries(ckpt, got, sizeof got);
    EXPECT(!strcmp(got, want), "%s holds:\n%swanted:\n%s", ckpt, got, want);
}

/* A node's copy of step SAVED alone does not verify: the first file on
 * the other node is named, and the message says why. */
static void expect_copy_refused(const char *dir, char node, const char *missing)
{
    char path[900];
    snprintf(path, sizeof path, "%s/files/%c/fast", dir, node);
    llmt_ckpt_store_config sc = LLMT_CKPT_STORE_CONFIG_INIT;
    sc.read_only = 1;
    llmt_context *ctx = NULL;
    llmt_ckpt_store *s = NULL;
    must(llmt_context_create(&ctx, NULL), "context");
    must(llmt_ckpt_store_open(&s, ctx, path, &sc), path);
    int rc = llmt_ckpt_verify(s, SAVED, LLMT_CKPT_DURABLE);
    EXPECT(rc == LLMT_ECORRUPT && strstr(llmt_error_last(), missing) &&
               strstr(llmt_error_last(), "local to each node"),
           "verify node %c's copy: status %d: %s", node, rc, llmt_error_last());
    llmt_ckpt_store_free(s);
    llmt_context_free(ctx);
}

static void test_layout_of_files(const char *dir, llmt_comm *comm)
{
    save_run(dir, "files", "AABB", comm, 77);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
        char a[900], b[900], got[1024];
        snprintf(a, sizeof a, "%s/files/A/fast", dir);
        snprintf(b, sizeof b, "%s/files/B/fast", dir);
        entries(a, got, sizeof got);
        EXPECT(!strcmp(got, "llmt.lock\nstep-00000004\nstep-00000006\n"), "node A's fast tier "
               "holds:\n%s", got);
        entries(b, got, sizeof got);
        EXPECT(!strcmp(got, "llmt.lock\nstep-00000004\nstep-00000006\n"), "node B's fast tier "
               "holds:\n%s", got);
        snprintf(a, sizeof a, "%s/files/A/fast/step-00000006", dir);
        snprintf(b, sizeof b, "%s/files/B/fast/step-00000006", dir);
        expect_files(a, "MANIFEST\nmodel.safetensors\noptimizer-00001-of-00004.safetensors\n"
                        "optimizer-00002-of-00004.safetensors\nuser.bin\n");
        expect_files(b, "MANIFEST\noptimizer-00003-of-00004.safetensors\n"
                        "optimizer-00004-of-00004.safetensors\n");
        char ma[1000], mb[1000];
        snprintf(ma, sizeof ma, "%s/MANIFEST", a);
        snprintf(mb, sizeof mb, "%s/MANIFEST", b);
        size_t la = 0, lb = 0;
        char *ta = slurp(ma, &la), *tb = slurp(mb, &lb);
        EXPECT(ta && tb && la == lb && !memcmp(ta, tb, la), "the nodes' MANIFESTs differ");
        llmt_manifest m;
        EXPECT(ta && llmt_manifest_parse(ta, la, &m) == LLMT_OK && m.per_node &&
                   m.world_size == 4, "node A's MANIFEST: not a per-node one of 4 ranks");
        llmt_manifest_clear(&m);
        free(ta);
        free(tb);
        char d[900];
        snprintf(d, sizeof d, "%s/files/durable", dir);
        read_manifest(d, 4, &m);
        EXPECT(!m.per_node, "the durable checkpoint is marked per node");
        llmt_manifest_clear(&m);
        snprintf(d, sizeof d, "%s/files/durable/step-00000004", dir);
        expect_files(d, ALL_FILES);
        expect_copy_refused(dir, 'A', "optimizer-00003-of-00004.safetensors");
        expect_copy_refused(dir, 'B', "model.safetensors");
    }
}

/* A copy of case "files" as case tag, made by rank 0. */
static void copy_case(const char *dir, const char *tag)
{
    char from[900], to[900];
    snprintf(from, sizeof from, "%s/files", dir);
    snprintf(to, sizeof to, "%s/%s", dir, tag);
    if (rank == 0) {
        sh("rm -rf '%s'%s", to, "");
        sh("cp -a '%s' '%s'", from, to);
    }
    MPI_Barrier(MPI_COMM_WORLD);
}

/* Resumes case tag with the ranks in layout: every rank from step want, its
 * log holding logged (when not NULL); then MORE steps (saving on) give the
 * uninterrupted run's state. */
static void resume_case(const char *dir, const char *tag, const char *layout, llmt_comm *comm,
                        int64_t want, const char *logged)
{
    char durable[900];
    enter(dir, tag, layout, durable, sizeof durable);
    run r;
    int rc = LLMT_OK;
    int64_t step = resume(&r, dir, comm, durable, &rc);
    EXPECT(rc == LLMT_OK && step == want, "%s (%s): resumed from step %lld, status %d (%s); "
           "wanted step %lld", tag, layout, (long long)step, rc, llmt_error_last(),
           (long long)want);
    EXPECT(!logged || strstr(log_text, logged), "%s (%s): the log does not say \"%s\":\n%s",
           tag, layout, logged, log_text);
    if (rc == LLMT_OK && step == want) {
        train(&r, MORE, NULL);
        EXPECT(same_as_uninterrupted(&r, dir, want + MORE), "%s (%s): after %d more steps, "
               "not the uninterrupted run's state", tag, layout, MORE);
    }
    run_close(&r);
}

/* The ranks on other nodes ("ABAB") and no durable checkpoint: no fast
 * one loads either, and every rank fails before any object was touched
 * (each rank checks that its node holds its files before rank 0 loads the
 * weights), so the run's objects are still usable. */
static void test_moved_nothing_else(const char *dir, llmt_comm *comm)
{
    copy_case(dir, "moved2");
    char path[900];
    if (rank == 0) {
        snprintf(path, sizeof path, "%s/moved2/durable/step-00000004", dir);
        sh("rm -r '%s'%s", path, "");
    }
    MPI_Barrier(MPI_COMM_WORLD);
    char durable[900];
    enter(dir, "moved2", "ABAB", durable, sizeof durable);
    run r;
    int rc = LLMT_OK;
    int64_t step = resume(&r, dir, comm, durable, &rc);
    EXPECT(rc == LLMT_ECORRUPT && step == -1 && !strstr(llmt_error_last(), "partly") &&
               strstr(llmt_error_last(), "not on this rank's node"),
           "moved2: step %lld, status %d: %s", (long long)step, rc, llmt_error_last());
    run_close(&r);
}

/* Node B's copy of step SAVED replaced by that of another run (seed 78)
 * saved to the same steps. */
static void test_stale_copy(const char *dir, llmt_comm *comm)
{
    save_run(dir, "other", "AABB", comm, 78);
    copy_case(dir, "stale");
    char from[900], to[900];
    snprintf(from, sizeof from, "%s/other/B/fast/step-%08d", dir, SAVED);
    snprintf(to, sizeof to, "%s/stale/B/fast/step-%08d", dir, SAVED);
    if (rank == 0) {
        sh("rm -rf '%s' && mkdir '%s'", to, to);
        sh("cp -a '%s/.' '%s'", from, to);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    resume_case(dir, "stale", "AABB", comm, 4, "not the one rank 0 read");
}

/* One of node B's files of step SAVED deleted. */
static void test_deleted_file(const char *dir, llmt_comm *comm)
{
    copy_case(dir, "deleted");
    char path[900];
    snprintf(path, sizeof path, "%s/deleted/B/fast/step-%08d", dir, SAVED);
    if (rank == 0)
        sh("rm '%s/%s'", path, "optimizer-00004-of-00004.safetensors");
    MPI_Barrier(MPI_COMM_WORLD);
    resume_case(dir, "deleted", "AABB", comm, 4, "optimizer-00004-of-00004.safetensors");
}

/* Every rank on node A: one directory, the protocol of a shared fast tier. */
static void test_one_node(const char *dir, llmt_comm *comm)
{
    save_run(dir, "one", "AAAA", comm, 77);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
        char path[900];
        snprintf(path, sizeof path, "%s/one/A/fast/step-%08d", dir, SAVED);
        expect_files(path, ALL_FILES);
        llmt_manifest m;
        snprintf(path, sizeof path, "%s/one/A/fast", dir);
        read_manifest(path, SAVED, &m);
        EXPECT(!m.per_node, "one node: the fast checkpoint is marked per node");
        llmt_manifest_clear(&m);
    }
    /* Saved on one node, resumed on two: node B has no copy. */
    resume_case(dir, "one", "ABAB", comm, 4, "not on this rank's node");
}

/* Opens a run of case tag from step 0 with the ranks in layout, saving
 * synchronously (a failed save fails its step) into the fast tier every 2
 * steps and nowhere else. */
static void open_case(run *r, const char *dir, const char *tag, const char *layout,
                      llmt_comm *comm)
{
    char durable[900];
    enter(dir, tag, layout, durable, sizeof durable);
    run_open(r, dir, LLMT_PRECISION_BF16_MIXED, comm, LLMT_REDUCE_DETERMINISTIC, durable, 0, 77);
    r->tr->cfg.checkpoint_async = 0;
    log_text[0] = '\0';
    must(llmt_trainer_set_log(r->tr, keep_log, NULL), "log");
}

/* One step; its status, the message into why (cap bytes). */
static int step_once(run *r, char *why, size_t cap)
{
    llmt_step_report rep;
    memset(&rep, 0, sizeof rep);
    rep.version = LLMT_STEP_REPORT_VERSION;
    int rc = llmt_trainer_step(r->tr, &rep);
    snprintf(why, cap, "%s", rc ? llmt_error_last() : "");
    return rc;
}

/* The entries of case tag's node directory (A or B) fast/, one line each. */
static void node_entries(const char *dir, const char *tag, char node, char *out, size_t cap)
{
    char path[900];
    snprintf(path, sizeof path, "%s/%s/%c/fast", dir, tag, node);
    entries(path, out, cap);
}

/* Rank 0's commits of steps 6 and 8 fail after node B committed. */
static void test_rank0_commit_fails(const char *dir, llmt_comm *comm)
{
    char why[2048], got[1024], path[900];
    run r;
    open_case(&r, dir, "late", "AABB", comm);
    if (rank == 0)
        for (int step = 6; step <= 8; step += 2) { /* in the way of rank 0's rename */
            snprintf(path, sizeof path, "%s/late/A/fast/step-%08d", dir, step);
            sh(": > '%s'%s", path, "");
        }
    MPI_Barrier(MPI_COMM_WORLD);
    for (int step = 1; step <= 8; step++) {
        int rc = step_once(&r, why, sizeof why);
        int want_fail = step == 6 || step == 8;
        EXPECT(want_fail ? rc == LLMT_EIO && strstr(why, "is not a directory") : rc == LLMT_OK,
               "late: step %d: status %d: %s", step, rc, why);
    }
    run_close(&r);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
        node_entries(dir, "late", 'B', got, sizeof got);
        EXPECT(!strcmp(got, "llmt.lock\nstep-00000002\nstep-00000004\nstep-00000006\n"
                            "step-00000008\n"),
               "late: node B's fast tier after rank 0's failed commits:\n%s", got);
        for (int step = 6; step <= 8; step += 2) {
            snprintf(path, sizeof path, "%s/late/A/fast/step-%08d", dir, step);
            sh("rm '%s'%s", path, "");
        }
    }
    MPI_Barrier(MPI_COMM_WORLD);
    char durable[900];
    enter(dir, "late", "AABB", durable, sizeof durable);
    int rc = LLMT_OK;
    int64_t step = resume(&r, dir, comm, durable, &rc);
    EXPECT(rc == LLMT_OK && step == 4, "late: resumed from step %lld, status %d (%s); wanted 4",
           (long long)step, rc, llmt_error_last());
    if (rc == LLMT_OK && step == 4) {
        train(&r, 2, NULL); /* saves step 6: rank 0 keeps 4 and 6, and so does node B */
        must(llmt_trainer_save(r.tr, LLMT_CKPT_FAST), "late: the save of step 6, joined");
        MPI_Barrier(MPI_COMM_WORLD);
        if (rank == 0) {
            node_entries(dir, "late", 'B', got, sizeof got);
            EXPECT(!strcmp(got, "llmt.lock\nstep-00000004\nstep-00000006\n"),
                   "late: node B's fast tier after the next save:\n%s", got);
        }
        train(&r, 2, NULL);
        EXPECT(same_as_uninterrupted(&r, dir, 8), "late: not the uninterrupted run's state");
    }
    run_close(&r);
}

/* Node B's commit of step 6 fails. */
static void test_node_commit_fails(const char *dir, llmt_comm *comm)
{
    char why[2048], got[1024], path[900];
    run r;
    open_case(&r, dir, "bfail", "AABB", comm);
    if (rank == 0) {
        snprintf(path, sizeof path, "%s/bfail/B/fast/step-%08d", dir, SAVED);
        sh("mkdir -p \"$(dirname '%s')\" && : > '%s'", path, path);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    for (int step = 1; step <= SAVED; step++) {
        int rc = step_once(&r, why, sizeof why);
        EXPECT(step == SAVED ? rc == LLMT_EIO && strstr(why, "rank 2") &&
                                   strstr(why, "step-00000006 exists and is not a directory")
                             : rc == LLMT_OK,
               "bfail: step %d: status %d: %s", step, rc, why);
    }
    run_close(&r);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
        node_entries(dir, "bfail", 'A', got, sizeof got);
        EXPECT(!strcmp(got, "llmt.lock\nstep-00000002\nstep-00000004\n"),
               "bfail: node A's fast tier:\n%s", got);
        node_entries(dir, "bfail", 'B', got, sizeof got);
        EXPECT(!strcmp(got, "llmt.lock\nstep-00000002\nstep-00000004\nstep-00000006\n"),
               "bfail: node B's fast tier (step-6 being the file in the way):\n%s", got);
    }
}

/* Node B's fast directory locked by another holder (this process, through
 * a descriptor of its own). */
static void test_locked_node(const char *dir, llmt_comm *comm)
{
    copy_case(dir, "locked");
    char path[900], why[2048];
    int fd = -1;
    if (rank == 0) {
        snprintf(path, sizeof path, "%s/locked/B/fast/llmt.lock", dir);
        fd = open(path, O_RDWR);
        if (fd < 0 || flock(fd, LOCK_EX | LOCK_NB) != 0)
            must(LLMT_EIO, path);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    char durable[900];
    enter(dir, "locked", "AABB", durable, sizeof durable);
    run r;
    int rc = LLMT_OK;
    int64_t step = resume(&r, dir, comm, durable, &rc);
    EXPECT(rc == LLMT_OK && step == SAVED, "locked: resumed from step %lld, status %d (%s)",
           (long long)step, rc, llmt_error_last());
    r.tr->cfg.checkpoint_async = 0;
    rc = step_once(&r, why, sizeof why); /* step 7 */
    EXPECT(rc == LLMT_OK, "locked: step 7: %s", why);
    rc = step_once(&r, why, sizeof why); /* step 8 saves */
    EXPECT(rc == LLMT_EBUSY && strstr(why, "fast/llmt.lock"), "locked: step 8: status %d: %s", rc,
           why);
    run_close(&r);
    if (fd >= 0)
        close(fd);
}

/* Node B's fast path a plain file: the resume falls back to the durable
 * step 4 (ranks 2 and 3 find nothing there), and the first fast save fails
 * in the ranks' probe, leaving no mark on node A. */
static void test_blocked_node(const char *dir, llmt_comm *comm)
{
    copy_case(dir, "blocked");
    char path[900], why[2048], got[1024];
    if (rank == 0) {
        snprintf(path, sizeof path, "%s/blocked/B/fast", dir);
        sh("rm -r '%s' && : > '%s'", path, path);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    char durable[900];
    enter(dir, "blocked", "AABB", durable, sizeof durable);
    run r;
    int rc = LLMT_OK;
    int64_t step = resume(&r, dir, comm, durable, &rc);
    EXPECT(rc == LLMT_OK && step == 4, "blocked: resumed from step %lld, status %d (%s)",
           (long long)step, rc, llmt_error_last());
    r.tr->cfg.checkpoint_async = 0;
    rc = step_once(&r, why, sizeof why); /* step 5 */
    EXPECT(rc == LLMT_OK, "blocked: step 5: %s", why);
    rc = step_once(&r, why, sizeof why); /* step 6 saves */
    EXPECT(rc == LLMT_EIO && strstr(why, "the fast checkpoint directory"), "blocked: step 6: "
           "status %d: %s", rc, why);
    run_close(&r);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
        node_entries(dir, "blocked", 'A', got, sizeof got);
        EXPECT(!strstr(got, "probe"), "blocked: node A's fast tier:\n%s", got);
    }
}

/* llmt_ckpt_set_aside_invalid over a store whose fast tier is node's copy
 * of case "aside" (durable: an empty directory): its status, *n the count
 * set aside; want_same: the fast tier's entries must be unchanged. */
static int set_aside_in(const char *dir, char node, size_t *n, int want_same)
{
    char none[900], fast[900], before[1024], after[1024];
    snprintf(none, sizeof none, "%s/aside/none", dir);
    snprintf(fast, sizeof fast, "%s/aside/%c/fast", dir, node);
    sh("mkdir -p '%s'%s", none, "");
    entries(fast, before, sizeof before);
    llmt_context *ctx = NULL;
    llmt_ckpt_store *s = NULL;
    llmt_ckpt_store_config sc = LLMT_CKPT_STORE_CONFIG_INIT;
    sc.fast_dir = fast;
    must(llmt_context_create(&ctx, NULL), "context");
    must(llmt_ckpt_store_open(&s, ctx, none, &sc), none);
    *n = 99;
    int rc = llmt_ckpt_set_aside_invalid(s, n, NULL, 0);
    char why[2048];
    snprintf(why, sizeof why, "%s", llmt_error_last());
    llmt_ckpt_store_free(s);
    llmt_context_free(ctx);
    entries(fast, after, sizeof after);
    EXPECT(!want_same || !strcmp(before, after), "set aside changed node %c's fast tier:\n%s",
           node, after);
    llmt_error_set(rc, why);
    return rc;
}

/* llmt_ckpt_set_aside_invalid (llmt-train --start-over) over each node's
 * copies: refused, renaming nothing, while a copy's own files are intact
 * (node B's hold no weights); set aside once they are damaged. */
static void test_no_set_aside(const char *dir)
{
    copy_case(dir, "aside");
    if (rank != 0)
        return;
    size_t n = 0;
    for (char node = 'A'; node <= 'B'; node++) {
        int rc = set_aside_in(dir, node, &n, 1);
        EXPECT(rc == LLMT_ESTATE && strstr(llmt_error_last(), "its own files are intact") && !n,
               "set aside on node %c: status %d, %zu set aside: %s", node, rc, n,
               llmt_error_last());
    }
    char path[900];
    for (int step = 4; step <= SAVED; step += 2) { /* a byte of each copy of node B changed */
        snprintf(path, sizeof path, "%s/aside/B/fast/step-%08d", dir, step);
        sh("printf x | dd of='%s/%s' bs=1 seek=9000 conv=notrunc 2>/dev/null", path,
           "optimizer-00004-of-00004.safetensors");
    }
    int rc = set_aside_in(dir, 'B', &n, 0);
    EXPECT(rc == LLMT_OK && n == 2, "set aside damaged copies on node B: status %d, %zu set "
           "aside: %s", rc, n, llmt_error_last());
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc != 2 || argv[1][0] != '/' || size != 4) {
        if (rank == 0)
            fprintf(stderr, "usage: mpiexec -n 4 %s DIR (absolute)\n", argv[0]);
        MPI_Finalize();
        return 2;
    }
    const char *dir = argv[1];
    if (rank == 0) {
        sh("rm -rf '%s'; mkdir -p '%s'", dir, dir);
        write_shard(dir);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    fast_dir = "fast";
    fast_every = 2;
    llmt_comm_mpi *m = NULL;
    must(llmt_comm_mpi_create(&m, MPI_COMM_WORLD), "comm");
    test_layout_of_files(dir, m->comm);
    copy_case(dir, "same");
    resume_case(dir, "same", "AABB", m->comm, SAVED, NULL); /* step 6: fast only */
    copy_case(dir, "moved");
    resume_case(dir, "moved", "ABAB", m->comm, 4, ".safetensors: not on this rank's node");
    test_moved_nothing_else(dir, m->comm);
    test_stale_copy(dir, m->comm);
    test_deleted_file(dir, m->comm);
    test_one_node(dir, m->comm);
    test_rank0_commit_fails(dir, m->comm);
    test_node_commit_fails(dir, m->comm);
    test_locked_node(dir, m->comm);
    test_blocked_node(dir, m->comm);
    test_no_set_aside(dir);
    int all = 0;
    MPI_Allreduce(&failures, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    llmt_comm_mpi_free(m);
    MPI_Finalize();
    if (rank == 0)
        printf("node tier on %d ranks: %s\n", size, all ? "FAILED" : "all passed");
    return all ? 1 : 0;
}
