/* The checkpoint store's hard edges: a store whose checkpoints are all
 * damaged is refused (naming each and why) while an empty one is a fresh
 * start, and saving over a damaged step replaces it; the store's lock (a
 * second open in this process or in another fails, naming the holder's
 * pid); a stray plain file named like a checkpoint; a read-only store with a
 * leftover of an interrupted save; the trainer's final save of a step it
 * already committed. */
#define _XOPEN_SOURCE 700 /* nftw */
#define _DEFAULT_SOURCE   /* setgid, setuid */
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test_util.h"

#include "llmt/llmt.h"
#include "train_fixture.h"
#include "util/fsutil.h"

static char root[64], data_dir[128], store_dir[128], fast_dir[128];

static int setup(void **state)
{
    (void)state;
    snprintf(root, sizeof root, "/tmp/llmt-edges-XXXXXX");
    if (!mkdtemp(root))
        return -1;
    snprintf(data_dir, sizeof data_dir, "%s/data", root);
    snprintf(store_dir, sizeof store_dir, "%s/ckpt", root);
    snprintf(fast_dir, sizeof fast_dir, "%s/fast", root);
    mkdir(data_dir, 0755);
    fixture_write_shards(data_dir);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    chmod(store_dir, 0755); /* the read-only test may have left it so */
    return llmt_remove_tree(root);
}

static llmt_ckpt_store *open_store(llmt_context *ctx, int keep, int with_fast)
{
    llmt_ckpt_store_config sc = LLMT_CKPT_STORE_CONFIG_INIT;
    sc.keep = keep;
    sc.sync = 0;
    sc.fast_dir = with_fast ? fast_dir : NULL;
    llmt_ckpt_store *s = NULL;
    if (llmt_ckpt_store_open(&s, ctx, store_dir, &sc) != LLMT_OK)
        fail_msg("store open: %s", llmt_error_last());
    return s;
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
    fixture_open(&f, data_dir, LLMT_PRECISION_FP32, 16);
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
    snprintf(path, sizeof path, "%s/step-00000002/MANIFEST", store_dir);
    assert_int_equal(truncate(path, 10), 0);
    snprintf(path, sizeof path, "%s/step-00000004/model.safetensors", store_dir);
    int fd = open(path, O_WRONLY);
    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, "\x7f", 1, 200), 1);
    close(fd);
    snprintf(path, sizeof path, "%s/step-00000005/optimizer.safetensors", fast_dir);
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
    fixture_open(&f, data_dir, LLMT_PRECISION_FP32, 16);
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
    llmt_remove_tree(store_dir);
    llmt_remove_tree(fast_dir);
}

/* ---- the lock (item 7) */

static void test_lock(void **state)
{
    (void)state;
    fixture f;
    fixture_open(&f, data_dir, LLMT_PRECISION_FP32, 16);
    llmt_ckpt_store *s = open_store(f.ctx, 5, 1), *t = (llmt_ckpt_store *)&f;
    llmt_ckpt_store_config plain = LLMT_CKPT_STORE_CONFIG_INIT;
    char pid[32];
    snprintf(pid, sizeof pid, "%ld", (long)getpid());

    /* In this process: flock locks per open file description. */
    assert_int_equal(llmt_ckpt_store_open(&t, f.ctx, store_dir, &plain), LLMT_EBUSY);
    assert_null(t);
    assert_contains(llmt_error_last(), store_dir);
    assert_contains(llmt_error_last(), pid);
    /* The fast tier's directory alone, under another durable one. */
    char other[160];
    snprintf(other, sizeof other, "%s/other", root);
    llmt_ckpt_store_config sc = LLMT_CKPT_STORE_CONFIG_INIT;
    sc.fast_dir = fast_dir;
    assert_int_equal(llmt_ckpt_store_open(&t, f.ctx, other, &sc), LLMT_EBUSY);
    assert_contains(llmt_error_last(), fast_dir);
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
        char ok = llmt_ckpt_store_open(&c, f.ctx, store_dir, &plain) == LLMT_OK ? 'y' : 'n';
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
    assert_int_equal(llmt_ckpt_store_open(&t, f.ctx, store_dir, &plain), LLMT_EBUSY);
    assert_contains(llmt_error_last(), pid);
    close(go[1]);
    int status = 0;
    assert_int_equal(waitpid(child, &status, 0), child);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    assert_int_equal(llmt_ckpt_store_open(&t, f.ctx, store_dir, &plain), LLMT_OK);
    llmt_ckpt_store_free(t);
    close(ready[0]);
    close(ready[1]);
    close(go[0]);
    fixture_close(&f);
    llmt_remove_tree(store_dir);
    llmt_remove_tree(fast_dir);
}

/* ---- a stray file, a read-only store, the final save (item 9) */

static void test_stray_file_ignored(void **state)
{
    (void)state;
    assert_int_equal(llmt_mkdirs(store_dir), LLMT_OK);
    char stray[320], stray0[320];
    snprintf(stray, sizeof stray, "%s/step-00000035", store_dir);
    write_text(stray, "not a checkpoint");
    snprintf(stray0, sizeof stray0, "%s/step-00000000", store_dir); /* the oldest, for rotation */
    write_text(stray0, "not one either");
    fixture f;
    fixture_open(&f, data_dir, LLMT_PRECISION_FP32, 16);
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
    llmt_remove_tree(store_dir);
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
    if (llmt_ckpt_store_open(&s, f->ctx, store_dir, &sc) != LLMT_OK)
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
    fixture_open(&f, data_dir, LLMT_PRECISION_FP32, 16);
    llmt_ckpt_store *s = open_store(f.ctx, 5, 0);
    save_at(&f, s, 1, LLMT_CKPT_DURABLE);
    llmt_ckpt_store_free(s);
    /* What a save killed part-way leaves. */
    char left[320];
    snprintf(left, sizeof left, "%s/step-00000002.tmp-abcdef", store_dir);
    assert_int_equal(mkdir(left, 0755), 0);
    strcat(left, "/model.safetensors");
    write_text(left, "partial");
    assert_int_equal(chmod(root, 0755), 0);
    assert_int_equal(nftw(store_dir, make_read_only, 8, FTW_PHYS | FTW_DEPTH), 0);

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
    assert_int_equal(chmod(store_dir, 0755), 0);
    /* Writable again: the next open removes the leftover. */
    s = open_store(f.ctx, 5, 0);
    assert_int_not_equal(stat(left, &sb), 0);
    llmt_ckpt_store_free(s);
    fixture_close(&f);
    llmt_remove_tree(store_dir);
}

/* The inode of checkpoint step's directory: a new save makes a new one. */
static ino_t inode_of(int64_t step)
{
    char path[320];
    snprintf(path, sizeof path, "%s/step-%08lld", store_dir, (long long)step);
    struct stat sb;
    if (stat(path, &sb) != 0)
        fail_msg("%s: missing", path);
    return sb.st_ino;
}

static void test_final_save_of_a_saved_step(void **state)
{
    (void)state;
    fixture f;
    fixture_open(&f, data_dir, LLMT_PRECISION_FP32, 16);
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
    fixture_open(&f, data_dir, LLMT_PRECISION_FP32, 16);
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
    llmt_remove_tree(store_dir);
    llmt_remove_tree(fast_dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_all_damaged_is_an_error),
        cmocka_unit_test(test_lock),
        cmocka_unit_test(test_stray_file_ignored),
        cmocka_unit_test(test_read_only_store_with_leftover),
        cmocka_unit_test(test_final_save_of_a_saved_step),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
