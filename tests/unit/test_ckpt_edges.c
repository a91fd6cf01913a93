/* The checkpoint store's hard edges: a store whose checkpoints are all
 * damaged is refused (naming each and why) while an empty one is a fresh
 * start, and saving over a damaged step replaces it; the store's lock (a
 * second open in this process or in another fails, naming the holder's
 * pid); a stray plain file named like a checkpoint; a read-only store with a
 * leftover of an interrupted save; the trainer's final save of a step it
 * already committed, and not of one whose async save failed; a failed read
 * is not damage; damaged checkpoints do not crowd out valid ones in
 * rotation and are set aside; readers beside a writer; a fork child does not
 * keep the lock; a holder's pid written late; a checkpoint moved aside that
 * cannot be put back; a reader beside a writer that rotates checkpoints away;
 * entries that are not regular files; the trainer's no-op save is its own;
 * the same step set aside twice. */
#define _XOPEN_SOURCE 700 /* nftw */
#define _DEFAULT_SOURCE   /* setgid, setuid */
#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test_util.h"

#include "llmt/llmt.h"
#include "store_fixture.h"
#include "train_fixture.h"
#include "util/fsutil.h"

static store_dirs dirs;

static int setup(void **state)
{
    (void)state;
    return store_dirs_create(&dirs, "edges");
}

static int teardown(void **state)
{
    (void)state;
    return store_dirs_remove(&dirs);
}

static llmt_ckpt_store *open_store(llmt_context *ctx, int keep, int with_fast)
{
    return store_dirs_open(&dirs, ctx, keep, with_fast);
}

/* A trainer over the fixture's parts and store s (no automatic saves unless
 * every > 0). */
static llmt_trainer *make_trainer(fixture *f, llmt_ckpt_store *s, int64_t every, int64_t total)
{
    llmt_trainer_parts p = LLMT_TRAINER_PARTS_INIT;
    p.model = f->model;
    p.optimizer = f->opt;
    p.scaler = f->scaler;
    p.loader = f->loader;
    p.store = s;
    llmt_trainer_config c = LLMT_TRAINER_CONFIG_INIT;
    c.batch_size = FIX_B;
    c.seq_len = FIX_T;
    c.adaptive = 0;
    c.total_steps = total;
    c.checkpoint_every = every;
    c.checkpoint_async = 0;
    llmt_trainer *tr = NULL;
    if (llmt_trainer_create(&tr, &p, &c) != LLMT_OK)
        fail_msg("trainer: %s", llmt_error_last());
    return tr;
}

static void save_at(fixture *f, llmt_ckpt_store *s, int steps, int tier)
{
    fixture_train(f, steps, NULL);
    llmt_train_state st = fixture_state(f);
    if (llmt_ckpt_save(s, &st, tier) != LLMT_OK)
        fail_msg("save: %s", llmt_error_last());
}

static void write_text(const char *path, const char *text)
{
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    fputs(text, fp);
    assert_int_equal(fclose(fp), 0);
}

/* ---- all checkpoints damaged (issue 12, item 6) */

static void test_all_damaged_is_an_error(void **state)
{
    (void)state;
    fixture f;
    fixture_open(&f, dirs.data, LLMT_PRECISION_FP32, 16);
    llmt_ckpt_store *s = open_store(f.ctx, 5, 1);
    int64_t step = 7;
    int32_t tier = 0;
    /* Empty: a fresh start, not an error. */
    assert_int_equal(llmt_ckpt_latest(s, &step, &tier, NULL, 0), LLMT_ENOTFOUND);
    llmt_trainer *tr = make_trainer(&f, s, 0, 100);
    assert_int_equal(llmt_trainer_resume_latest(tr, &step), LLMT_OK);
    assert_int_equal(step, -1);

    save_at(&f, s, 2, LLMT_CKPT_DURABLE);
    save_at(&f, s, 2, LLMT_CKPT_DURABLE);
    save_at(&f, s, 1, LLMT_CKPT_FAST);
    char path[320];
    /* Three kinds of damage: a truncated manifest, a changed byte in the
     * weights, a missing optimizer file. */
    snprintf(path, sizeof path, "%s/step-00000002/MANIFEST", dirs.store);
    assert_int_equal(truncate(path, 10), 0);
    snprintf(path, sizeof path, "%s/step-00000004/model.safetensors", dirs.store);
    int fd = open(path, O_WRONLY);
    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, "\x7f", 1, 200), 1);
    close(fd);
    snprintf(path, sizeof path, "%s/step-00000005/optimizer.safetensors", dirs.fast);
    assert_int_equal(unlink(path), 0);

    char notes[4096];
    assert_int_equal(llmt_ckpt_latest(s, &step, &tier, notes, sizeof notes), LLMT_ECORRUPT);
    const char *msg = llmt_error_last();
    assert_contains(msg, "none of the 3 checkpoints");
    assert_contains(msg, "step-00000002 (durable): file MANIFEST");
    assert_contains(msg, "step-00000004 (durable): file model.safetensors: checksum mismatch");
    assert_contains(msg, "step-00000005 (fast): file optimizer.safetensors");
    assert_contains(notes, "step-00000004");

    step = 7;
    assert_int_equal(llmt_trainer_resume_latest(tr, &step), LLMT_ECORRUPT);
    assert_int_equal(step, -1);
    msg = llmt_error_last();
    assert_contains(msg, "llmt_trainer_resume_latest");
    assert_contains(msg, "step-00000002");
    assert_contains(msg, "step-00000004");
    assert_contains(msg, "step-00000005");
    llmt_trainer_free(tr);

    /* Starting over (no resume) in such a store: the damaged step 2 is
     * replaced by the new one, which then resumes. */
    fixture_close(&f);
    fixture_open(&f, dirs.data, LLMT_PRECISION_FP32, 16);
    tr = make_trainer(&f, s, 2, 2);
    assert_int_equal(llmt_trainer_run(tr, 2), LLMT_OK);
    assert_int_equal(llmt_ckpt_verify(s, 2, LLMT_CKPT_DURABLE), LLMT_OK);
    assert_int_equal(llmt_ckpt_latest(s, &step, &tier, notes, sizeof notes), LLMT_OK);
    assert_int_equal(step, 2);
    assert_int_equal(tier, LLMT_CKPT_DURABLE);
    assert_contains(notes, "step-00000005 (fast)");
    llmt_trainer_free(tr);
    llmt_ckpt_store_free(s);
    fixture_close(&f);
    llmt_remove_tree(dirs.store);
    llmt_remove_tree(dirs.fast);
}

/* ---- the lock (item 7) */

static void test_lock(void **state)
{
    (void)state;
    fixture f;
    fixture_open(&f, dirs.data, LLMT_PRECISION_FP32, 16);
    llmt_ckpt_store *s = open_store(f.ctx, 5, 1), *t = (llmt_ckpt_store *)&f;
    llmt_ckpt_store_config plain = LLMT_CKPT_STORE_CONFIG_INIT;
    char pid[32];
    snprintf(pid, sizeof pid, "%ld", (long)getpid());

    /* In this process: flock locks per open file description. */
    assert_int_equal(llmt_ckpt_store_open(&t, f.ctx, dirs.store, &plain), LLMT_EBUSY);
    assert_null(t);
    assert_contains(llmt_error_last(), dirs.store);
    assert_contains(llmt_error_last(), pid);
    /* The fast tier's directory alone, under another durable one. */
    char other[160];
    snprintf(other, sizeof other, "%s/other", dirs.root);
    llmt_ckpt_store_config sc = LLMT_CKPT_STORE_CONFIG_INIT;
    sc.fast_dir = dirs.fast;
    assert_int_equal(llmt_ckpt_store_open(&t, f.ctx, other, &sc), LLMT_EBUSY);
    assert_contains(llmt_error_last(), dirs.fast);
    llmt_ckpt_store_free(s);
    assert_int_equal(llmt_ckpt_store_open(&t, f.ctx, other, &sc), LLMT_OK);
    llmt_ckpt_store_free(t);

    /* Another process holds it: refused at once with that pid; free again
     * once it exits. */
    int ready[2], go[2];
    assert_int_equal(pipe(ready), 0);
    assert_int_equal(pipe(go), 0);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        close(go[1]); /* so the read below ends when the parent closes its end */
        llmt_ckpt_store *c = NULL;
        char ok = llmt_ckpt_store_open(&c, f.ctx, dirs.store, &plain) == LLMT_OK ? 'y' : 'n';
        (void)!write(ready[1], &ok, 1);
        (void)!read(go[0], &ok, 1); /* until the parent closes its end */
        llmt_ckpt_store_free(c);
        _exit(0);
    }
    char ok = 0;
    assert_int_equal(read(ready[0], &ok, 1), 1);
    assert_int_equal(ok, 'y');
    snprintf(pid, sizeof pid, "process %ld", (long)child);
    t = NULL;
    assert_int_equal(llmt_ckpt_store_open(&t, f.ctx, dirs.store, &plain), LLMT_EBUSY);
    assert_contains(llmt_error_last(), pid);
    close(go[1]);
    int status = 0;
    assert_int_equal(waitpid(child, &status, 0), child);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    assert_int_equal(llmt_ckpt_store_open(&t, f.ctx, dirs.store, &plain), LLMT_OK);
    llmt_ckpt_store_free(t);
    close(ready[0]);
    close(ready[1]);
    close(go[0]);
    fixture_close(&f);
    llmt_remove_tree(dirs.store);
    llmt_remove_tree(dirs.fast);
}

/* ---- a stray file, a read-only store, the final save (item 9) */

static void test_stray_file_ignored(void **state)
{
    (void)state;
    assert_int_equal(llmt_mkdirs(dirs.store), LLMT_OK);
    char stray[320], stray0[320];
    snprintf(stray, sizeof stray, "%s/step-00000035", dirs.store);
    write_text(stray, "not a checkpoint");
    snprintf(stray0, sizeof stray0, "%s/step-00000000", dirs.store); /* the oldest, for rotation */
    write_text(stray0, "not one either");
    fixture f;
    fixture_open(&f, dirs.data, LLMT_PRECISION_FP32, 16);
    llmt_ckpt_store *s = open_store(f.ctx, 1, 0);
    /* Every save rotates; the file is neither listed nor moved. */
    for (int i = 0; i < 3; i++)
        save_at(&f, s, 1, LLMT_CKPT_DURABLE);
    int64_t steps[4];
    size_t n = 0;
    assert_int_equal(llmt_ckpt_list(s, LLMT_CKPT_DURABLE, steps, 4, &n), LLMT_OK);
    assert_int_equal(n, 1);
    assert_int_equal(steps[0], 3);
    int64_t step;
    int32_t tier;
    char notes[1024];
    assert_int_equal(llmt_ckpt_latest(s, &step, &tier, notes, sizeof notes), LLMT_OK);
    assert_int_equal(step, 3);
    assert_contains(notes, "step-00000035 (durable): not a directory, ignored");
    /* Saving that very step does not remove the file. */
    fixture_train(&f, 32, NULL);
    llmt_train_state st = fixture_state(&f);
    assert_int_equal(st.step, 35);
    assert_int_equal(llmt_ckpt_save(s, &st, LLMT_CKPT_DURABLE), LLMT_EIO);
    assert_contains(llmt_error_last(), "step-00000035 exists and is not a directory");
    struct stat sb;
    assert_int_equal(stat(stray, &sb), 0);
    assert_true(S_ISREG(sb.st_mode));
    assert_int_equal(stat(stray0, &sb), 0);
    llmt_ckpt_store_free(s);
    fixture_close(&f);
    llmt_remove_tree(dirs.store);
}

static int make_read_only(const char *path, const struct stat *sb, int type, struct FTW *ftw)
{
    (void)ftw;
    return chmod(path, type == FTW_D || type == FTW_DP ? 0555 : (sb->st_mode & 0444));
}

/* In a child that cannot write the store (root drops to nobody, since root
 * writes anywhere): open, find and load the checkpoint, then fail to save
 * with a clear message. Returns the number of the check that failed, 0 if
 * none. */
static int read_only_child(fixture *f)
{
    if (geteuid() == 0 && (setgid(65534) != 0 || setuid(65534) != 0))
        return 1;
    llmt_ckpt_store *s = NULL;
    llmt_ckpt_store_config sc = LLMT_CKPT_STORE_CONFIG_INIT;
    if (llmt_ckpt_store_open(&s, f->ctx, dirs.store, &sc) != LLMT_OK)
        return fprintf(stderr, "open: %s\n", llmt_error_last()), 2;
    int64_t step = -1;
    int32_t tier = -1;
    if (llmt_ckpt_latest(s, &step, &tier, NULL, 0) != LLMT_OK || step != 1)
        return fprintf(stderr, "latest: %s\n", llmt_error_last()), 3;
    llmt_train_state st = fixture_state(f);
    if (llmt_ckpt_load(s, 1, LLMT_CKPT_DURABLE, &st, NULL, 0, NULL) != LLMT_OK || st.step != 1)
        return fprintf(stderr, "load: %s\n", llmt_error_last()), 4;
    st.step = 2;
    if (llmt_ckpt_save(s, &st, LLMT_CKPT_DURABLE) != LLMT_EIO ||
        !strstr(llmt_error_last(), "reading only"))
        return fprintf(stderr, "save: %s\n", llmt_error_last()), 5;
    llmt_ckpt_store_free(s);
    return 0;
}

static void test_read_only_store_with_leftover(void **state)
{
    (void)state;
    fixture f;
    fixture_open(&f, dirs.data, LLMT_PRECISION_FP32, 16);
    llmt_ckpt_store *s = open_store(f.ctx, 5, 0);
    save_at(&f, s, 1, LLMT_CKPT_DURABLE);
    llmt_ckpt_store_free(s);
    /* What a save killed part-way leaves. */
    char left[320];
    snprintf(left, sizeof left, "%s/step-00000002.tmp-abcdef", dirs.store);
    assert_int_equal(mkdir(left, 0755), 0);
    strcat(left, "/model.safetensors");
    write_text(left, "partial");
    assert_int_equal(chmod(dirs.root, 0755), 0);
    assert_int_equal(nftw(dirs.store, make_read_only, 8, FTW_PHYS | FTW_DEPTH), 0);

    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0)
        _exit(read_only_child(&f));
    int status = 0;
    assert_int_equal(waitpid(child, &status, 0), child);
    assert_true(WIFEXITED(status));
    if (WEXITSTATUS(status))
        fail_msg("read-only store: check %d failed", WEXITSTATUS(status));
    struct stat sb;
    assert_int_equal(stat(left, &sb), 0); /* left where it was */
    assert_int_equal(chmod(dirs.store, 0755), 0);
    /* Writable again: the next open removes the leftover. */
    s = open_store(f.ctx, 5, 0);
    assert_int_not_equal(stat(left, &sb), 0);
    llmt_ckpt_store_free(s);
    fixture_close(&f);
    llmt_remove_tree(dirs.store);
}

/* The inode of checkpoint step's directory: a new save makes a new one. */
static ino_t inode_of(int64_t step)
{
    char path[320];
    snprintf(path, sizeof path, "%s/step-%08lld", dirs.store, (long long)step);
    struct stat sb;
    if (stat(path, &sb) != 0)
        fail_msg("%s: missing", path);
    return sb.st_ino;
}

static void test_final_save_of_a_saved_step(void **state)
{
    (void)state;
    fixture f;
    fixture_open(&f, dirs.data, LLMT_PRECISION_FP32, 16);
    llmt_ckpt_store *s = open_store(f.ctx, 1, 1);
    llmt_trainer *tr = make_trainer(&f, s, 2, 2);
    assert_int_equal(llmt_trainer_run(tr, 2), LLMT_OK); /* saves step 2 */
    ino_t saved = inode_of(2);
    assert_int_equal(llmt_trainer_save(tr, LLMT_CKPT_DURABLE), LLMT_OK);
    assert_true(inode_of(2) == saved); /* nothing written */
    assert_int_equal(llmt_trainer_save(tr, 7), LLMT_EINVAL);
    llmt_trainer_free(tr);
    fixture_close(&f);

    /* Resumed from step 2 with nothing left to run: the same. The fast tier
     * does not hold it, so saving there writes. */
    fixture_open(&f, dirs.data, LLMT_PRECISION_FP32, 16);
    tr = make_trainer(&f, s, 2, 2);
    int64_t from = -1;
    assert_int_equal(llmt_trainer_resume_latest(tr, &from), LLMT_OK);
    assert_int_equal(from, 2);
    assert_int_equal(llmt_trainer_save(tr, LLMT_CKPT_DURABLE), LLMT_OK);
    assert_true(inode_of(2) == saved);
    assert_int_equal(llmt_trainer_save(tr, LLMT_CKPT_FAST), LLMT_OK);
    assert_int_equal(llmt_ckpt_verify(s, 2, LLMT_CKPT_FAST), LLMT_OK);
    llmt_trainer_free(tr);
    llmt_ckpt_store_free(s);
    fixture_close(&f);
    llmt_remove_tree(dirs.store);
    llmt_remove_tree(dirs.fast);
}

/* ---- the trainer's no-op save needs a committed checkpoint (review A) */

static void test_trainer_save_after_failed_async(void **state)
{
    (void)state;
    fixture f;
    fixture_open(&f, dirs.data, LLMT_PRECISION_FP32, 16);
    llmt_ckpt_store *s = open_store(f.ctx, 5, 1);
    /* The fast save of step 1 fails on its thread: a plain file holds its name. */
    char stray[320];
    snprintf(stray, sizeof stray, "%s/step-00000001", dirs.fast);
    write_text(stray, "in the way");
    llmt_trainer_parts p = LLMT_TRAINER_PARTS_INIT;
    p.model = f.model;
    p.optimizer = f.opt;
    p.scaler = f.scaler;
    p.loader = f.loader;
    p.store = s;
    llmt_trainer_config c = LLMT_TRAINER_CONFIG_INIT;
    c.batch_size = FIX_B;
    c.seq_len = FIX_T;
    c.adaptive = 0;
    c.total_steps = 10;
    c.checkpoint_every = 1;
    c.fast_checkpoint_every = 1;
    c.checkpoint_async = 1;
    llmt_trainer *tr = NULL;
    assert_int_equal(llmt_trainer_create(&tr, &p, &c), LLMT_OK);
    /* The durable save joins the failed fast one: the step reports it. */
    assert_int_equal(llmt_trainer_step(tr, NULL), LLMT_EIO);
    assert_contains(llmt_error_last(), "not a directory");
    assert_int_equal(llmt_trainer_step_index(tr), 1);
    /* Nothing was committed in either tier: each save must write (the fast
     * one fails again while the file is there). */
    assert_int_equal(llmt_trainer_save(tr, LLMT_CKPT_FAST), LLMT_EIO);
    assert_contains(llmt_error_last(), "step-00000001 exists and is not a directory");
    assert_int_equal(unlink(stray), 0);
    assert_int_equal(llmt_trainer_save(tr, LLMT_CKPT_FAST), LLMT_OK);
    assert_int_equal(llmt_ckpt_verify(s, 1, LLMT_CKPT_FAST), LLMT_OK);
    assert_int_equal(llmt_trainer_save(tr, LLMT_CKPT_DURABLE), LLMT_OK);
    assert_int_equal(llmt_ckpt_verify(s, 1, LLMT_CKPT_DURABLE), LLMT_OK);
    llmt_trainer_free(tr);
    llmt_ckpt_store_free(s);
    fixture_close(&f);
    llmt_remove_tree(dirs.store);
    llmt_remove_tree(dirs.fast);
}

/* ---- what is damage, rotation past damaged ones, setting them aside (review B) */

/* Saves the fixture's state as checkpoint step (the step only names it). */
static void save_as(fixture *f, llmt_ckpt_store *s, int64_t step)
{
    llmt_train_state st = fixture_state(f);
    st.step = step;
    if (llmt_ckpt_save(s, &st, LLMT_CKPT_DURABLE) != LLMT_OK)
        fail_msg("save %lld: %s", (long long)step, llmt_error_last());
}

static llmt_ckpt_store *open_reader(llmt_context *ctx, const char *dir, int *rc);

/* In a child that is not root (so mode 000 keeps it out): a reader of the
 * store finds step 2's weights unreadable, which is LLMT_EIO, not damage.
 * Returns the number of the check that failed, 0 if none. */
static int unreadable_child(fixture *f)
{
    if (geteuid() == 0 && (setgid(65534) != 0 || setuid(65534) != 0))
        return 1;
    int rc = 0;
    llmt_ckpt_store *r = open_reader(f->ctx, dirs.store, &rc);
    if (rc != LLMT_OK)
        return fprintf(stderr, "open: %s\n", llmt_error_last()), 2;
    int64_t step = -1;
    int32_t tier = -1;
    if (llmt_ckpt_latest(r, &step, &tier, NULL, 0) != LLMT_EIO || step != -1 ||
        !strstr(llmt_error_last(), "step-00000002"))
        return fprintf(stderr, "latest: %s\n", llmt_error_last()), 3;
    if (llmt_ckpt_verify(r, 2, LLMT_CKPT_DURABLE) != LLMT_EIO)
        return fprintf(stderr, "verify: %s\n", llmt_error_last()), 4;
    llmt_ckpt_store_free(r);
    return 0;
}

static void test_unreadable_is_not_damage(void **state)
{
    (void)state;
    fixture f;
    fixture_open(&f, dirs.data, LLMT_PRECISION_FP32, 16);
    llmt_ckpt_store *s = open_store(f.ctx, 5, 0);
    save_as(&f, s, 1);
    save_as(&f, s, 2);
    /* Step 2's weights are there but cannot be read (mode 000, read by a
     * child that is not root; a flaky disk or a lost mount would do the
     * same): the newest checkpoint may be good, so neither is it passed over
     * for step 1 nor are the checkpoints called damaged. */
    char path[320], dir[160];
    snprintf(dir, sizeof dir, "%s/step-00000002", dirs.store);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    assert_int_equal(chmod(dirs.root, 0755), 0);
    assert_int_equal(chmod(dir, 0755), 0);
    assert_int_equal(chmod(path, 0), 0);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0)
        _exit(unreadable_child(&f));
    int status = 0;
    assert_int_equal(waitpid(child, &status, 0), child);
    assert_true(WIFEXITED(status));
    if (WEXITSTATUS(status))
        fail_msg("an unreadable file: check %d failed", WEXITSTATUS(status));
    int64_t step = -1;
    int32_t tier = -1;
    /* A missing file is damage. */
    assert_int_equal(unlink(path), 0);
    assert_int_equal(llmt_ckpt_verify(s, 2, LLMT_CKPT_DURABLE), LLMT_ECORRUPT);
    assert_int_equal(llmt_ckpt_latest(s, &step, &tier, NULL, 0), LLMT_OK);
    assert_int_equal(step, 1);
    llmt_ckpt_store_free(s);
    fixture_close(&f);
    llmt_remove_tree(dirs.store);
}

/* The number of entries of dirs.store whose name starts with prefix. */
static int entries_named(const char *prefix)
{
    DIR *d = opendir(dirs.store);
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
    closedir(d);
    return n;
}

static void test_damaged_do_not_crowd_out_valid(void **state)
{
    (void)state;
    fixture f;
    fixture_open(&f, dirs.data, LLMT_PRECISION_FP32, 16);
    llmt_ckpt_store *s = open_store(f.ctx, 3, 0);
    save_as(&f, s, 400);
    save_as(&f, s, 500);
    char path[320];
    for (int step = 400; step <= 500; step += 100) {
        snprintf(path, sizeof path, "%s/step-%08d/MANIFEST", dirs.store, step);
        assert_int_equal(truncate(path, 10), 0);
    }
    int64_t step = -1, steps[8];
    int32_t tier = -1;
    assert_int_equal(llmt_ckpt_latest(s, &step, &tier, NULL, 0), LLMT_ECORRUPT);
    /* Starting over at step 0 with keep = 3: both new ones are kept. */
    save_as(&f, s, 100);
    save_as(&f, s, 200);
    size_t n = 0;
    assert_int_equal(llmt_ckpt_list(s, LLMT_CKPT_DURABLE, steps, 8, &n), LLMT_OK);
    assert_int_equal(n, 4);
    assert_int_equal(steps[0], 100);
    assert_int_equal(steps[1], 200);
    /* Set aside: the damaged ones renamed (kept), the valid ones untouched. */
    char notes[2048];
    size_t moved = 0;
    assert_int_equal(llmt_ckpt_set_aside_invalid(s, &moved, notes, sizeof notes), LLMT_OK);
    assert_int_equal(moved, 2);
    assert_contains(notes, "step-00000400");
    assert_contains(notes, "step-00000500");
    assert_int_equal(llmt_ckpt_list(s, LLMT_CKPT_DURABLE, steps, 8, &n), LLMT_OK);
    assert_int_equal(n, 2);
    assert_int_equal(entries_named("step-00000400.refused-"), 1);
    assert_int_equal(entries_named("step-00000500.refused-"), 1);
    assert_int_equal(llmt_ckpt_latest(s, &step, &tier, NULL, 0), LLMT_OK);
    assert_int_equal(step, 200);
    /* Rotation goes on over valid ones only, and never touches those set aside. */
    save_as(&f, s, 300);
    save_as(&f, s, 400);
    assert_int_equal(llmt_ckpt_list(s, LLMT_CKPT_DURABLE, steps, 8, &n), LLMT_OK);
    assert_int_equal(n, 3);
    assert_int_equal(steps[0], 200);
    assert_int_equal(entries_named("step-00000400.refused-"), 1);
    assert_int_equal(llmt_ckpt_set_aside_invalid(s, &moved, NULL, 0), LLMT_OK);
    assert_int_equal(moved, 0);
    assert_int_equal(llmt_ckpt_set_aside_invalid(NULL, &moved, NULL, 0), LLMT_EINVAL);
    llmt_ckpt_store_free(s);
    fixture_close(&f);
    llmt_remove_tree(dirs.store);
}

/* ---- readers, fork, the holder's pid (review C) */

static llmt_ckpt_store *open_reader(llmt_context *ctx, const char *dir, int *rc)
{
    llmt_ckpt_store_config sc = LLMT_CKPT_STORE_CONFIG_INIT;
    sc.read_only = 1;
    llmt_ckpt_store *r = NULL;
    *rc = llmt_ckpt_store_open(&r, ctx, dir, &sc);
    return r;
}

static void test_readers_beside_a_writer(void **state)
{
    (void)state;
    fixture f;
    fixture_open(&f, dirs.data, LLMT_PRECISION_FP32, 16);
    int rc = 0;
    /* A reader of a directory that does not exist: nothing is created. */
    assert_null(open_reader(f.ctx, dirs.store, &rc));
    assert_int_equal(rc, LLMT_ENOTFOUND);
    struct stat sb;
    assert_int_not_equal(stat(dirs.store, &sb), 0);

    llmt_ckpt_store *w = open_store(f.ctx, 5, 0);
    save_as(&f, w, 1);
    /* A writer's save in progress, which a reader must leave alone. */
    char tmp[320];
    snprintf(tmp, sizeof tmp, "%s/step-00000002.tmp-inprogress", dirs.store);
    assert_int_equal(mkdir(tmp, 0755), 0);
    llmt_ckpt_store *r1 = open_reader(f.ctx, dirs.store, &rc);
    assert_int_equal(rc, LLMT_OK);
    llmt_ckpt_store *r2 = open_reader(f.ctx, dirs.store, &rc);
    assert_int_equal(rc, LLMT_OK);
    assert_int_equal(stat(tmp, &sb), 0);
    int64_t step = -1;
    int32_t tier = -1;
    assert_int_equal(llmt_ckpt_latest(r1, &step, &tier, NULL, 0), LLMT_OK);
    assert_int_equal(step, 1);
    llmt_train_state st = fixture_state(&f);
    assert_int_equal(llmt_ckpt_load(r2, 1, LLMT_CKPT_DURABLE, &st, NULL, 0, NULL), LLMT_OK);
    assert_int_equal(llmt_ckpt_save(r1, &st, LLMT_CKPT_DURABLE), LLMT_EIO);
    assert_contains(llmt_error_last(), "read_only");
    assert_int_equal(llmt_ckpt_set_aside_invalid(r1, NULL, NULL, 0), LLMT_EIO);
    /* Readers do not keep a writer out, and a second writer is still refused. */
    llmt_ckpt_store_free(w);
    w = open_store(f.ctx, 5, 0);
    llmt_ckpt_store *w2 = NULL;
    llmt_ckpt_store_config plain = LLMT_CKPT_STORE_CONFIG_INIT;
    assert_int_equal(llmt_ckpt_store_open(&w2, f.ctx, dirs.store, &plain), LLMT_EBUSY);
    llmt_ckpt_store_free(w);
    llmt_ckpt_store_free(r1);
    llmt_ckpt_store_free(r2);
    /* A version 1 configuration (before read_only) opens a writer. */
    llmt_ckpt_store_config v1 = LLMT_CKPT_STORE_CONFIG_INIT;
    v1.version = 1;
    v1.read_only = 7; /* not part of a version 1 struct: not read */
    assert_int_equal(llmt_ckpt_store_open(&w2, f.ctx, dirs.store, &v1), LLMT_OK);
    assert_int_equal(stat(tmp, &sb) != 0, 1); /* a writer cleans */
    llmt_ckpt_store_free(w2);
    plain.read_only = 2;
    assert_int_equal(llmt_ckpt_store_open(&w2, f.ctx, dirs.store, &plain), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "read_only = 2");
    fixture_close(&f);
    llmt_remove_tree(dirs.store);
}

static void test_fork_child_releases_the_lock(void **state)
{
    (void)state;
    fixture f;
    fixture_open(&f, dirs.data, LLMT_PRECISION_FP32, 16);
    llmt_ckpt_store *s = open_store(f.ctx, 5, 0);
    int go[2], ready[2];
    assert_int_equal(pipe(go), 0);
    assert_int_equal(pipe(ready), 0);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) { /* a worker that outlives the parent's store */
        close(go[1]);
        char c = 'y'; /* fork has returned here: the atfork handler has run */
        (void)!write(ready[1], &c, 1);
        (void)!read(go[0], &c, 1);
        _exit(0);
    }
    close(go[0]);
    char c = 0;
    assert_int_equal(read(ready[0], &c, 1), 1);
    close(ready[0]);
    close(ready[1]);
    llmt_ckpt_store_free(s);
    int rc = llmt_ckpt_store_open(&s, f.ctx, dirs.store, NULL);
    close(go[1]);
    int status = 0;
    assert_int_equal(waitpid(child, &status, 0), child);
    if (rc != LLMT_OK)
        fail_msg("reopen while a fork child lives: %s", llmt_error_last());
    llmt_ckpt_store_free(s);
    fixture_close(&f);
    llmt_remove_tree(dirs.store);
}

static void test_holder_pid_written_late(void **state)
{
    (void)state;
    fixture f;
    fixture_open(&f, dirs.data, LLMT_PRECISION_FP32, 16);
    assert_int_equal(llmt_mkdirs(dirs.store), LLMT_OK);
    char path[320];
    snprintf(path, sizeof path, "%s/llmt.lock", dirs.store);
    /* A holder that has the lock but has not written its pid yet. */
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
    assert_true(fd >= 0);
    assert_int_equal(flock(fd, LOCK_EX | LOCK_NB), 0);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        /* Late, but well inside the second the reader waits. */
        nanosleep(&(struct timespec){0, 50000000}, NULL);
        _exit(pwrite(fd, "4242\n", 5, 0) == 5 ? 0 : 1);
    }
    llmt_ckpt_store *s = NULL;
    llmt_ckpt_store_config plain = LLMT_CKPT_STORE_CONFIG_INIT;
    assert_int_equal(llmt_ckpt_store_open(&s, f.ctx, dirs.store, &plain), LLMT_EBUSY);
    assert_contains(llmt_error_last(), "process 4242");
    int status = 0;
    assert_int_equal(waitpid(child, &status, 0), child);
    close(fd);
    fixture_close(&f);
    llmt_remove_tree(dirs.store);
}

/* ---- a checkpoint moved aside that cannot be put back (review D) */

static void test_unrestored_old_checkpoint(void **state)
{
    (void)state;
    fixture f;
    fixture_open(&f, dirs.data, LLMT_PRECISION_FP32, 16);
    llmt_ckpt_store *s = open_store(f.ctx, 5, 0);
    save_as(&f, s, 5);
    llmt_ckpt_store_free(s);
    /* What a save replacing step 5 left when killed, and a link in the
     * way of putting it back: a writable store must say so, not lose it. */
    char ckpt[320], old[320];
    snprintf(ckpt, sizeof ckpt, "%s/step-00000005", dirs.store);
    snprintf(old, sizeof old, "%s/step-00000005.old-abcdef", dirs.store);
    assert_int_equal(rename(ckpt, old), 0);
    assert_int_equal(symlink("/nonexistent", ckpt), 0);
    s = NULL;
    llmt_ckpt_store_config plain = LLMT_CKPT_STORE_CONFIG_INIT;
    assert_int_equal(llmt_ckpt_store_open(&s, f.ctx, dirs.store, &plain), LLMT_EIO);
    assert_contains(llmt_error_last(), "step-00000005.old-abcdef");
    struct stat sb;
    assert_int_equal(stat(old, &sb), 0); /* kept */
    /* A reader leaves it and notes it in latest. */
    int rc = 0;
    llmt_ckpt_store *r = open_reader(f.ctx, dirs.store, &rc);
    assert_int_equal(rc, LLMT_OK);
    int64_t step = -1;
    int32_t tier = -1;
    char notes[1024];
    assert_int_equal(llmt_ckpt_latest(r, &step, &tier, notes, sizeof notes), LLMT_ENOTFOUND);
    assert_contains(notes, "step-00000005.old-abcdef (durable): moved aside");
    llmt_ckpt_store_free(r);
    /* With the link gone, the next open puts it back. */
    assert_int_equal(unlink(ckpt), 0);
    s = open_store(f.ctx, 5, 0);
    assert_int_equal(llmt_ckpt_verify(s, 5, LLMT_CKPT_DURABLE), LLMT_OK);
    llmt_ckpt_store_free(s);
    fixture_close(&f);
    llmt_remove_tree(dirs.store);
}

/* ---- second review: rotation beside a reader, entries that are not files,
 * the trainer's own no-op save, setting aside twice */

/* The writer side of test_reader_beside_rotating_writer: saves steps
 * first.. first+count-1 with keep = 1, each rotating the previous away, a
 * few milliseconds apart (back to back, no listing would ever be made while
 * the directory stands still). */
typedef struct rotating_writer {
    fixture *f;
    llmt_ckpt_store *w;
    int64_t first, count;
    int rc;
    char error[1024];
    atomic_int done;
} rotating_writer;

static void *rotate_saves(void *arg)
{
    rotating_writer *rw = arg;
    for (int64_t k = 0; k < rw->count && !rw->rc; k++) {
        llmt_train_state st = fixture_state(rw->f);
        st.step = rw->first + k;
        rw->rc = llmt_ckpt_save(rw->w, &st, LLMT_CKPT_DURABLE);
        if (rw->rc)
            snprintf(rw->error, sizeof rw->error, "%s", llmt_error_last());
        nanosleep(&(struct timespec){0, 3000000}, NULL);
    }
    atomic_store(&rw->done, 1);
    return NULL;
}

static void test_reader_beside_rotating_writer(void **state)
{
    (void)state;
    fixture f;
    fixture_open(&f, dirs.data, LLMT_PRECISION_FP32, 16);
    llmt_ckpt_store *w = open_store(f.ctx, 1, 0);
    save_as(&f, w, 1);
    int rc = 0;
    llmt_ckpt_store *r = open_reader(f.ctx, dirs.store, &rc);
    assert_int_equal(rc, LLMT_OK);
    int64_t steps[4];
    size_t n = 0;
    assert_int_equal(llmt_ckpt_list(r, LLMT_CKPT_DURABLE, steps, 4, &n), LLMT_OK);
    assert_int_equal(n, 1);
    assert_int_equal(steps[0], 1);
    /* The writer saves step 2 and rotates step 1 away: gone, not damaged. */
    save_as(&f, w, 2);
    assert_int_equal(llmt_ckpt_verify(r, 1, LLMT_CKPT_DURABLE), LLMT_ENOTFOUND);
    assert_contains(llmt_error_last(), "step-00000001");
    assert_contains(llmt_error_last(), "no longer there");
    int64_t step = -1;
    int32_t tier = -1;
    assert_int_equal(llmt_ckpt_latest(r, &step, &tier, NULL, 0), LLMT_OK);
    assert_int_equal(step, 2);

    /* latest beside a writer rotating fast: each call finds a checkpoint,
     * never "damaged". (Rarely, every listing it makes is torn by the
     * writer's renames and it finds none: LLMT_ENOTFOUND, counted.) */
    rotating_writer rw = {.f = &f, .w = w, .first = 3, .count = 60};
    atomic_init(&rw.done, 0);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, rotate_saves, &rw), 0);
    int calls = 0, bad = 0, torn = 0;
    char notes[2048], why[1024] = "";
    while (!atomic_load(&rw.done) && !bad) {
        step = -1;
        rc = llmt_ckpt_latest(r, &step, &tier, notes, sizeof notes);
        torn += rc == LLMT_ENOTFOUND;
        bad = rc == LLMT_ENOTFOUND ? 0 : rc != LLMT_OK || step < 2;
        if (bad)
            snprintf(why, sizeof why, "rc %d, step %lld: %s", rc, (long long)step,
                     llmt_error_last());
        calls++;
    }
    assert_int_equal(pthread_join(th, NULL), 0);
    if (rw.rc)
        fail_msg("writer: %s", rw.error);
    if (bad)
        fail_msg("latest beside a rotating writer, call %d: %s", calls, why);
    print_message("latest called %d times beside the writer (%d found none)\n", calls, torn);
    llmt_ckpt_store_free(r);
    llmt_ckpt_store_free(w);
    fixture_close(&f);
    llmt_remove_tree(dirs.store);
}

static void test_not_a_regular_file(void **state)
{
    (void)state;
    fixture f;
    fixture_open(&f, dirs.data, LLMT_PRECISION_FP32, 16);
    llmt_ckpt_store *s = open_store(f.ctx, 5, 0);
    for (int64_t k = 1; k <= 3; k++)
        save_as(&f, s, k);
    char path[320];
    /* A directory in place of the weights, a dangling link in place of the
     * manifest: damage, which latest passes over and set_aside moves. */
    snprintf(path, sizeof path, "%s/step-00000003/model.safetensors", dirs.store);
    assert_int_equal(unlink(path), 0);
    assert_int_equal(mkdir(path, 0755), 0);
    assert_int_equal(llmt_ckpt_verify(s, 3, LLMT_CKPT_DURABLE), LLMT_ECORRUPT);
    assert_contains(llmt_error_last(), "model.safetensors: not a regular file");
    snprintf(path, sizeof path, "%s/step-00000002/MANIFEST", dirs.store);
    assert_int_equal(unlink(path), 0);
    assert_int_equal(symlink("/nonexistent", path), 0);
    assert_int_equal(llmt_ckpt_verify(s, 2, LLMT_CKPT_DURABLE), LLMT_ECORRUPT);
    assert_contains(llmt_error_last(), "MANIFEST: not a regular file");
    int64_t step = -1;
    int32_t tier = -1;
    char notes[2048];
    assert_int_equal(llmt_ckpt_latest(s, &step, &tier, notes, sizeof notes), LLMT_OK);
    assert_int_equal(step, 1);
    assert_contains(notes, "step-00000003");
    assert_contains(notes, "step-00000002");
    size_t moved = 0;
    assert_int_equal(llmt_ckpt_set_aside_invalid(s, &moved, NULL, 0), LLMT_OK);
    assert_int_equal(moved, 2);
    assert_int_equal(entries_named("step-00000002.refused-"), 1);
    assert_int_equal(entries_named("step-00000003.refused-"), 1);
    /* A FIFO is refused by its type, before an open that would block. */
    snprintf(path, sizeof path, "%s/step-00000001/optimizer.safetensors", dirs.store);
    assert_int_equal(unlink(path), 0);
    assert_int_equal(mkfifo(path, 0644), 0);
    assert_int_equal(llmt_ckpt_verify(s, 1, LLMT_CKPT_DURABLE), LLMT_ECORRUPT);
    assert_contains(llmt_error_last(), "optimizer.safetensors: not a regular file");
    llmt_ckpt_store_free(s);
    fixture_close(&f);
    llmt_remove_tree(dirs.store);
}

/* A fixture whose training sees other batches than another's (its loader
 * is one batch ahead), so its weights at a step differ. */
static void open_other(fixture *f)
{
    fixture_open(f, dirs.data, LLMT_PRECISION_FP32, 16);
    int32_t tokens[FIX_B * FIX_T], targets[FIX_B * FIX_T];
    assert_int_equal(llmt_loader_next(f->loader, tokens, targets, FIX_B * FIX_T), LLMT_OK);
}

static void test_no_op_save_is_the_trainers_own(void **state)
{
    (void)state;
    fixture a, b;
    fixture_open(&a, dirs.data, LLMT_PRECISION_FP32, 16);
    llmt_ckpt_store *s = open_store(a.ctx, 5, 0);
    llmt_trainer *ta = make_trainer(&a, s, 2, 2);
    assert_int_equal(llmt_trainer_run(ta, 2), LLMT_OK); /* A saves step 2 */
    llmt_trainer_free(ta);
    /* Trainer B reaches step 2 with other weights: its save writes. */
    ino_t by_a = inode_of(2);
    open_other(&b);
    llmt_trainer *tb = make_trainer(&b, s, 0, 2);
    assert_int_equal(llmt_trainer_run(tb, 2), LLMT_OK);
    assert_int_equal(llmt_trainer_save(tb, LLMT_CKPT_DURABLE), LLMT_OK);
    ino_t by_b = inode_of(2);
    assert_true(by_b != by_a);
    /* Its own committed save is not repeated. */
    assert_int_equal(llmt_trainer_save(tb, LLMT_CKPT_DURABLE), LLMT_OK);
    assert_true(inode_of(2) == by_b);
    llmt_trainer_free(tb);
    fixture_close(&b);
    /* Step 2 loaded into A's objects: a trainer that reached step 2 on its
     * own still writes. */
    llmt_train_state st = fixture_state(&a);
    assert_int_equal(llmt_ckpt_load(s, 2, LLMT_CKPT_DURABLE, &st, NULL, 0, NULL), LLMT_OK);
    open_other(&b);
    tb = make_trainer(&b, s, 0, 2);
    assert_int_equal(llmt_trainer_run(tb, 2), LLMT_OK);
    assert_int_equal(llmt_trainer_save(tb, LLMT_CKPT_DURABLE), LLMT_OK);
    assert_true(inode_of(2) != by_b);
    llmt_trainer_free(tb);
    llmt_ckpt_store_free(s);
    fixture_close(&b);
    fixture_close(&a);
    llmt_remove_tree(dirs.store);
}

static void test_set_aside_twice(void **state)
{
    (void)state;
    fixture f;
    fixture_open(&f, dirs.data, LLMT_PRECISION_FP32, 16);
    llmt_ckpt_store *s = open_store(f.ctx, 5, 0);
    char path[320], notes[1024];
    snprintf(path, sizeof path, "%s/step-00000005/MANIFEST", dirs.store);
    /* Within the same second: each gets a name of its own. */
    for (int round = 1; round <= 2; round++) {
        save_as(&f, s, 5);
        assert_int_equal(truncate(path, 10), 0);
        size_t moved = 0;
        if (llmt_ckpt_set_aside_invalid(s, &moved, notes, sizeof notes) != LLMT_OK)
            fail_msg("set aside, round %d: %s", round, llmt_error_last());
        assert_int_equal(moved, 1);
        assert_contains(notes, "step-00000005 (durable): file MANIFEST");
        assert_int_equal(entries_named("step-00000005.refused-"), round);
    }
    llmt_ckpt_store_free(s);
    fixture_close(&f);
    llmt_remove_tree(dirs.store);
}

/* A trainer log callback: appends the line to the char[4096] user. */
static void append_line(void *user, const char *line)
{
    char *log = user;
    size_t used = strlen(log);
    snprintf(log + used, 4096 - used, "%s\n", line);
}

/* A resume replaces the optimizer's settings with the checkpoint's, as
 * llmt_ckpt_load does, and says so for each one that differs (none is
 * replaced silently); equal settings log nothing. */
static void test_resume_logs_replaced_settings(void **state)
{
    (void)state;
    fixture f;
    fixture_open(&f, dirs.data, LLMT_PRECISION_FP32, 16);
    llmt_ckpt_store *s = open_store(f.ctx, 5, 0);
    llmt_trainer *saver = make_trainer(&f, s, 2, 100);
    assert_int_equal(llmt_trainer_run(saver, 2), LLMT_OK); /* saves step 2 */
    double saved_lr = 0;
    assert_int_equal(llmt_optimizer_get(f.opt, LLMT_OPT_LR, &saved_lr), LLMT_OK);
    llmt_trainer_free(saver);
    llmt_ckpt_store_free(s);
    fixture_close(&f);
    for (int changed = 0; changed < 2; changed++) {
        fixture g;
        fixture_open(&g, dirs.data, LLMT_PRECISION_FP32, 16);
        if (changed) {
            assert_int_equal(llmt_optimizer_set(g.opt, LLMT_OPT_LR, saved_lr / 4), LLMT_OK);
            assert_int_equal(llmt_optimizer_set(g.opt, LLMT_OPT_TOTAL_STEPS, 600), LLMT_OK);
        }
        s = open_store(g.ctx, 5, 0);
        llmt_trainer *tr = make_trainer(&g, s, 0, 100);
        char log[4096] = "";
        assert_int_equal(llmt_trainer_set_log(tr, append_line, log), LLMT_OK);
        int64_t step = -1;
        if (llmt_trainer_resume_latest(tr, &step) != LLMT_OK)
            fail_msg("resume: %s", llmt_error_last());
        assert_int_equal(step, 2);
        double lr = 0;
        assert_int_equal(llmt_optimizer_get(g.opt, LLMT_OPT_LR, &lr), LLMT_OK);
        assert_true(lr == saved_lr); /* the checkpoint's */
        char want[256];
        snprintf(want, sizeof want, "replace the configured ones: lr %.9g (configured %.9g), "
                 "total_steps 60 (configured 600)", saved_lr, saved_lr / 4);
        if (changed)
            assert_contains(log, want);
        else
            assert_null(strstr(log, "optimizer settings"));
        llmt_trainer_free(tr);
        llmt_ckpt_store_free(s);
        fixture_close(&g);
    }
    llmt_remove_tree(dirs.store);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_all_damaged_is_an_error),
        cmocka_unit_test(test_lock),
        cmocka_unit_test(test_stray_file_ignored),
        cmocka_unit_test(test_read_only_store_with_leftover),
        cmocka_unit_test(test_final_save_of_a_saved_step),
        cmocka_unit_test(test_trainer_save_after_failed_async),
        cmocka_unit_test(test_unreadable_is_not_damage),
        cmocka_unit_test(test_damaged_do_not_crowd_out_valid),
        cmocka_unit_test(test_readers_beside_a_writer),
        cmocka_unit_test(test_fork_child_releases_the_lock),
        cmocka_unit_test(test_holder_pid_written_late),
        cmocka_unit_test(test_unrestored_old_checkpoint),
        cmocka_unit_test(test_reader_beside_rotating_writer),
        cmocka_unit_test(test_not_a_regular_file),
        cmocka_unit_test(test_no_op_save_is_the_trainers_own),
        cmocka_unit_test(test_set_aside_twice),
        cmocka_unit_test(test_resume_logs_replaced_settings),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
