/* The checkpoint store: bit-exact resume (fp32, bf16, fp16 with skipped
 * steps; several save points, an epoch boundary, two resumes in a row),
 * corruption failing closed, async isolation and write errors, rotation,
 * tiers, mismatches, leftovers of interrupted saves, and the format decoded
 * by hand. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "test_util.h"

#include "llmt/llmt.h"
#include "file_limit.h"
#include "test_rand.h"
#include "store_fixture.h"
#include "train_fixture.h"
#include "util/fsutil.h"

static store_dirs dirs;

static int setup(void **state)
{
    (void)state;
    return store_dirs_create(&dirs, "ckpt");
}

static int teardown(void **state)
{
    (void)state;
    return store_dirs_remove(&dirs);
}

/* Empties the store directories: each test starts without checkpoints. */
static void fresh_stores(void)
{
    assert_int_equal(llmt_remove_tree(dirs.store), LLMT_OK);
    assert_int_equal(llmt_remove_tree(dirs.fast), LLMT_OK);
}

static llmt_ckpt_store *open_store(llmt_context *ctx, int keep, int with_fast)
{
    return store_dirs_open(&dirs, ctx, keep, with_fast);
}

/* ---- bit-exact resume */

/* Trains `total` steps in segments ending at each of cuts[] (ascending,
 * last == total): at each cut but the last the state is saved, every object
 * is destroyed, new ones are created from scratch and the checkpoint is
 * loaded. Losses of every step go to losses[]; the final state to *out. */
static void run_with_resumes(int precision, const int *cuts, int n_cuts, int async, double *losses,
                             unsigned char **out, size_t *out_len)
{
    fixture f;
    fixture_open(&f, dirs.data, precision, 16);
    int done = 0;
    for (int c = 0; c < n_cuts; c++) {
        fixture_train(&f, cuts[c] - done, losses + done);
        done = cuts[c];
        if (c == n_cuts - 1)
            break;
        llmt_ckpt_store *s = open_store(f.ctx, 10, 0);
        llmt_train_state st = fixture_state(&f);
        assert_int_equal(async ? llmt_ckpt_save_async(s, &st, LLMT_CKPT_DURABLE)
                               : llmt_ckpt_save(s, &st, LLMT_CKPT_DURABLE),
                         LLMT_OK);
        llmt_ckpt_store_free(s); /* waits for an async save */
        fixture_close(&f);
        fixture_open(&f, dirs.data, precision, 16); /* fresh objects, fresh init */
        s = open_store(f.ctx, 10, 0);
        llmt_train_state ld = fixture_state(&f);
        if (llmt_ckpt_load(s, done, LLMT_CKPT_DURABLE, &ld, NULL, 0, NULL) != LLMT_OK)
            fail_msg("load at %d: %s", done, llmt_error_last());
        assert_int_equal(ld.step, done);
        f.step = ld.step;
        f.tokens_seen = ld.tokens_seen;
        llmt_ckpt_store_free(s);
    }
    *out = fixture_state_bytes(&f, out_len);
    fixture_close(&f);
}

static void check_resume(int precision, const int *cuts, int n_cuts, int async)
{
    enum { MAX = 64 };
    double straight[MAX], resumed[MAX];
    unsigned char *a = NULL, *b = NULL;
    size_t la = 0, lb = 0;
    int total = cuts[n_cuts - 1];
    run_with_resumes(precision, &total, 1, 0, straight, &a, &la);
    run_with_resumes(precision, cuts, n_cuts, async, resumed, &b, &lb);
    assert_int_equal(la, lb);
    if (memcmp(a, b, la) != 0)
        fail_msg("precision %d: final state differs after resuming", precision);
    for (int i = 0; i < total; i++)
        if (memcmp(&straight[i], &resumed[i], sizeof(double)) != 0)
            fail_msg("precision %d: step %d loss %.17g vs %.17g", precision, i, straight[i], resumed[i]);
    free(a);
    free(b);
    fresh_stores(); /* for the next case */
}

static void test_bit_exact_resume(void **state)
{
    (void)state;
    fresh_stores();
    /* 10 windows per epoch, 2 per step: epochs end at steps 5, 10, 15... */
    const int single[2] = {7, 14};
    const int epoch_edge[2] = {5, 12};
    const int twice[3] = {3, 10, 16};
    check_resume(LLMT_PRECISION_FP32, single, 2, 0);
    check_resume(LLMT_PRECISION_FP32, epoch_edge, 2, 0);
    check_resume(LLMT_PRECISION_FP32, twice, 3, 1); /* async saves */
    check_resume(LLMT_PRECISION_BF16_MIXED, twice, 3, 0);
    check_resume(LLMT_PRECISION_BF16_PURE, single, 2, 1);

    /* FP16 with a scale of 2^24: the first steps overflow and are skipped. */
    fixture f;
    fixture_open(&f, dirs.data, LLMT_PRECISION_FP16_MIXED, 16);
    fixture_train(&f, 6, NULL);
    llmt_loss_scaler_state ss = LLMT_LOSS_SCALER_STATE_INIT;
    llmt_loss_scaler_get_state(f.scaler, &ss);
    assert_true(ss.skipped_steps >= 1); /* skipped steps happened before the save at 6 */
    assert_true(llmt_optimizer_step_count(f.opt) < 6);
    fixture_close(&f);
    const int fp16_cuts[3] = {6, 11, 18};
    check_resume(LLMT_PRECISION_FP16_MIXED, fp16_cuts, 3, 0);
}

/* ---- corruption */

static void copy_file(const char *from, const char *to)
{
    FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
    assert_non_null(a);
    assert_non_null(b);
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, a)) > 0)
        assert_int_equal(fwrite(buf, 1, n, b), n);
    fclose(a);
    fclose(b);
}

static long file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

static void test_corruption_fails_closed(void **state)
{
    (void)state;
    fresh_stores();
    fixture f;
    fixture_open(&f, dirs.data, LLMT_PRECISION_BF16_MIXED, 16);
    llmt_ckpt_store *s = open_store(f.ctx, 5, 0);
    fixture_train(&f, 2, NULL);
    llmt_train_state st = fixture_state(&f);
    const char blob[] = "user state";
    st.user_blob = blob;
    st.user_blob_size = sizeof blob;
    assert_int_equal(llmt_ckpt_save(s, &st, LLMT_CKPT_DURABLE), LLMT_OK);
    fixture_train(&f, 1, NULL);
    st = fixture_state(&f);
    st.user_blob = blob;
    st.user_blob_size = sizeof blob;
    assert_int_equal(llmt_ckpt_save(s, &st, LLMT_CKPT_DURABLE), LLMT_OK);
    assert_int_equal(llmt_ckpt_verify(s, 3, LLMT_CKPT_DURABLE), LLMT_OK);

    /* Keep a pristine copy of step 3's files. */
    static const char *const files[4] = {"model.safetensors", "optimizer.safetensors", "user.bin",
                                         "MANIFEST"};
    char dir3[256], path[4][320], backup[4][320];
    snprintf(dir3, sizeof dir3, "%s/step-00000003", dirs.store);
    for (int i = 0; i < 4; i++) {
        snprintf(path[i], sizeof path[i], "%s/%s", dir3, files[i]);
        snprintf(backup[i], sizeof backup[i], "%s/pristine-%d", dirs.root, i);
        copy_file(path[i], backup[i]);
    }
    uint64_t s_rand = 2024;
    int kinds[4] = {0};
    for (int trial = 0; trial < 240; trial++) {
        for (int i = 0; i < 4; i++)
            copy_file(backup[i], path[i]);
        int which = (int)(trial % 4);
        int kind = (int)(trial / 4 % 4); /* flip, truncate, delete, manifest edit */
        if (kind == 3)
            which = 3;
        kinds[kind]++;
        long size = file_size(path[which]);
        if (kind == 0) { /* flip one byte */
            FILE *fp = fopen(path[which], "r+b");
            long at = (long)(trand_u64(&s_rand) % (uint64_t)size);
            fseek(fp, at, SEEK_SET);
            int c = fgetc(fp);
            fseek(fp, at, SEEK_SET);
            fputc(c ^ (int)(1 + trand_u64(&s_rand) % 255), fp);
            fclose(fp);
        } else if (kind == 1) { /* truncate */
            assert_int_equal(truncate(path[which], (off_t)(trand_u64(&s_rand) % (uint64_t)size)), 0);
        } else if (kind == 2) { /* delete */
            assert_int_equal(unlink(path[which]), 0);
        } else { /* edit the manifest: change a digit, or insert a byte */
            size_t len = 0;
            FILE *fp = fopen(path[3], "rb");
            char *text = malloc((size_t)size + 2);
            len = fread(text, 1, (size_t)size, fp);
            fclose(fp);
            size_t at = (size_t)(trand_u64(&s_rand) % len);
            if (trial % 2) {
                while (text[at] < '0' || text[at] > '9')
                    at = (at + 1) % len;
                text[at] = text[at] == '9' ? '0' : (char)(text[at] + 1);
            } else {
                memmove(text + at + 1, text + at, len - at);
                text[at] = ' ';
                len++;
            }
            fp = fopen(path[3], "wb");
            fwrite(text, 1, len, fp);
            fclose(fp);
            free(text);
        }
        int rc = llmt_ckpt_verify(s, 3, LLMT_CKPT_DURABLE);
        if (rc != LLMT_ECORRUPT || !strstr(llmt_error_last(), files[which]))
            fail_msg("trial %d (kind %d, %s): verify returned %d: %s", trial, kind, files[which],
                     rc, llmt_error_last());
        int64_t step = -1;
        int32_t tier = -1;
        char notes[2048];
        assert_int_equal(llmt_ckpt_latest(s, &step, &tier, notes, sizeof notes), LLMT_OK);
        assert_int_equal(step, 2); /* fell back to the previous valid checkpoint */
        assert_contains(notes, "step-00000003");
        assert_contains(notes, files[which]);
    }
    for (int k = 0; k < 4; k++)
        assert_true(kinds[k] >= 50);
    /* Restored, it verifies again and is the latest. */
    for (int i = 0; i < 4; i++)
        copy_file(backup[i], path[i]);
    int64_t step = -1;
    int32_t tier = -1;
    assert_int_equal(llmt_ckpt_latest(s, &step, &tier, NULL, 0), LLMT_OK);
    assert_int_equal(step, 3);
    /* An extra file is refused too. */
    char extra[320];
    snprintf(extra, sizeof extra, "%s/stray.txt", dir3);
    FILE *fp = fopen(extra, "w");
    fputs("x", fp);
    fclose(fp);
    assert_int_equal(llmt_ckpt_verify(s, 3, LLMT_CKPT_DURABLE), LLMT_ECORRUPT);
    assert_contains(llmt_error_last(), "stray.txt");
    unlink(extra);
    llmt_ckpt_store_free(s);
    fixture_close(&f);
}

/* ---- async isolation and write errors */

static void test_async_isolation(void **state)
{
    (void)state;
    fresh_stores();
    fixture f;
    fixture_open(&f, dirs.data, LLMT_PRECISION_FP32, 16);
    llmt_ckpt_store *s = open_store(f.ctx, 5, 0);
    fixture_train(&f, 2, NULL);
    size_t len0 = 0;
    unsigned char *before = fixture_state_bytes(&f, &len0);
    llmt_train_state st = fixture_state(&f);
    assert_int_equal(llmt_ckpt_save_async(s, &st, LLMT_CKPT_DURABLE), LLMT_OK);
    /* Change the weights at once: the save must not see it. */
    float junk[16];
    for (int i = 0; i < 16; i++)
        junk[i] = 1234.0f;
    assert_int_equal(llmt_model_set_param(f.model, "model.norm.weight", junk, 16), LLMT_OK);
    fixture_train(&f, 1, NULL);
    assert_int_equal(llmt_ckpt_wait(s), LLMT_OK);
    /* The staging buffer is accounted, and kept for the next save. */
    llmt_memory_stats ms = LLMT_MEMORY_STATS_INIT;
    llmt_context_memory_stats(f.ctx, &ms);
    assert_true(ms.current[LLMT_MEM_STAGING] >= ms.current[LLMT_MEM_PARAMS] + ms.current[LLMT_MEM_OPTIMIZER]);

    fixture g;
    fixture_open(&g, dirs.data, LLMT_PRECISION_FP32, 16);
    llmt_train_state ld = fixture_state(&g);
    assert_int_equal(llmt_ckpt_load(s, 2, LLMT_CKPT_DURABLE, &ld, NULL, 0, NULL), LLMT_OK);
    g.step = ld.step;
    g.tokens_seen = ld.tokens_seen;
    size_t len1 = 0;
    unsigned char *loaded = fixture_state_bytes(&g, &len1);
    assert_int_equal(len0, len1);
    /* Everything, the context's random stream included, is as it was at the save. */
    assert_memory_equal(before, loaded, len0);
    free(before);
    free(loaded);
    fixture_close(&g);

    /* A write error in the background (here the file size limit, which
     * holds for root too) is reported by the next call, and the older
     * checkpoint survives. */
    struct rlimit old;
    assert_int_equal(file_limit_set(16 * 1024, &old), 0);
    st = fixture_state(&f);
    assert_int_equal(llmt_ckpt_save_async(s, &st, LLMT_CKPT_DURABLE), LLMT_OK);
    int rc = llmt_ckpt_wait(s);
    file_limit_restore(&old);
    assert_int_equal(rc, LLMT_EIO);
    assert_contains(llmt_error_last(), "previous async save failed");
    assert_contains(llmt_error_last(), "step-00000003");
    size_t count = 0;
    int64_t steps[8];
    assert_int_equal(llmt_ckpt_list(s, LLMT_CKPT_DURABLE, steps, 8, &count), LLMT_OK);
    assert_int_equal(count, 1);
    assert_int_equal(steps[0], 2);
    assert_int_equal(llmt_ckpt_verify(s, 2, LLMT_CKPT_DURABLE), LLMT_OK);
    /* No temporary directory was left behind. */
    char cmd[256];
    snprintf(cmd, sizeof cmd, "ls '%s' | grep -c tmp > /dev/null", dirs.store);
    assert_int_not_equal(system(cmd), 0);
    llmt_ckpt_store_free(s);
    fixture_close(&f);
}

/* ---- rotation and tiers */

/* The optimizer state's file, written on a thread of its own while the
 * weights are written here, fails alone (a file size limit between the two
 * files' sizes): the save fails naming it, and leaves neither the step nor
 * a temporary directory. */
static void test_failed_state_file(void **state)
{
    (void)state;
    fresh_stores();
    fixture f;
    fixture_open(&f, dirs.data, LLMT_PRECISION_FP32, 16);
    llmt_ckpt_store *s = open_store(f.ctx, 3, 0);
    fixture_train(&f, 1, NULL);
    llmt_train_state st = fixture_state(&f);
    assert_int_equal(llmt_ckpt_save(s, &st, LLMT_CKPT_DURABLE), LLMT_OK);
    char path[600];
    struct stat weights, opt;
    snprintf(path, sizeof path, "%s/step-00000001/model.safetensors", dirs.store);
    assert_int_equal(stat(path, &weights), 0);
    snprintf(path, sizeof path, "%s/step-00000001/optimizer.safetensors", dirs.store);
    assert_int_equal(stat(path, &opt), 0);
    assert_true(weights.st_size + 1024 < opt.st_size); /* fp32: moments twice the weights */

    fixture_train(&f, 1, NULL);
    st = fixture_state(&f);
    struct rlimit old;
    assert_int_equal(file_limit_set((rlim_t)(weights.st_size + opt.st_size) / 2, &old), 0);
    int rc = llmt_ckpt_save(s, &st, LLMT_CKPT_DURABLE);
    file_limit_restore(&old);
    assert_int_equal(rc, LLMT_EIO);
    assert_contains(llmt_error_last(), "optimizer.safetensors");
    int64_t steps[4];
    size_t n = 0;
    assert_int_equal(llmt_ckpt_list(s, LLMT_CKPT_DURABLE, steps, 4, &n), LLMT_OK);
    assert_int_equal(n, 1);
    assert_int_equal(steps[0], 1);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "ls '%s' | grep -c tmp > /dev/null", dirs.store);
    assert_int_not_equal(system(cmd), 0);
    llmt_ckpt_store_free(s);
    fixture_close(&f);
}

static void test_rotation_and_tiers(void **state)
{
    (void)state;
    fresh_stores();
    fixture f;
    fixture_open(&f, dirs.data, LLMT_PRECISION_FP32, 16);
    llmt_ckpt_store_config sc = LLMT_CKPT_STORE_CONFIG_INIT;
    sc.keep = 3;
    sc.sync = 0;
    sc.fast_dir = dirs.fast;
    sc.fast_keep = 1;
    llmt_ckpt_store *s = NULL;
    assert_int_equal(llmt_ckpt_store_open(&s, f.ctx, dirs.store, &sc), LLMT_OK);
    for (int i = 1; i <= 10; i++) {
        fixture_train(&f, 1, NULL);
        llmt_train_state st = fixture_state(&f);
        if (i == 8) { /* a failed save in the middle: nothing is rotated for it */
            struct rlimit old;
            /* step 7's fast save done first: the limit fails this save only */
            assert_int_equal(llmt_ckpt_wait(s), LLMT_OK);
            file_limit_set(32 * 1024, &old);
            assert_int_equal(llmt_ckpt_save(s, &st, LLMT_CKPT_DURABLE), LLMT_EIO);
            file_limit_restore(&old);
        } else {
            assert_int_equal(llmt_ckpt_save(s, &st, LLMT_CKPT_DURABLE), LLMT_OK);
        }
        assert_int_equal(llmt_ckpt_save_async(s, &st, LLMT_CKPT_FAST), LLMT_OK);
    }
    assert_int_equal(llmt_ckpt_wait(s), LLMT_OK);
    int64_t steps[16];
    size_t n = 0;
    assert_int_equal(llmt_ckpt_list(s, LLMT_CKPT_DURABLE, steps, 16, &n), LLMT_OK);
    assert_int_equal(n, 3);
    assert_int_equal(steps[0], 7);
    assert_int_equal(steps[1], 9);
    assert_int_equal(steps[2], 10);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(llmt_ckpt_verify(s, steps[i], LLMT_CKPT_DURABLE), LLMT_OK);
    assert_int_equal(llmt_ckpt_list(s, LLMT_CKPT_FAST, steps, 16, &n), LLMT_OK);
    assert_int_equal(n, 1);
    assert_int_equal(steps[0], 10);

    /* The fast tier alone ahead: latest takes it; equal steps prefer durable. */
    int64_t step;
    int32_t tier;
    assert_int_equal(llmt_ckpt_latest(s, &step, &tier, NULL, 0), LLMT_OK);
    assert_int_equal(step, 10);
    assert_int_equal(tier, LLMT_CKPT_DURABLE);
    fixture_train(&f, 1, NULL);
    llmt_train_state st = fixture_state(&f);
    assert_int_equal(llmt_ckpt_save(s, &st, LLMT_CKPT_FAST), LLMT_OK);
    assert_int_equal(llmt_ckpt_latest(s, &step, &tier, NULL, 0), LLMT_OK);
    assert_int_equal(step, 11);
    assert_int_equal(tier, LLMT_CKPT_FAST);
    /* Saving the same step again replaces it. */
    assert_int_equal(llmt_ckpt_save(s, &st, LLMT_CKPT_DURABLE), LLMT_OK);
    assert_int_equal(llmt_ckpt_save(s, &st, LLMT_CKPT_DURABLE), LLMT_OK);
    assert_int_equal(llmt_ckpt_verify(s, 11, LLMT_CKPT_DURABLE), LLMT_OK);
    llmt_ckpt_store_free(s);
    fixture_close(&f);
}

/* ---- leftovers, mismatches and arguments */

static void test_leftovers_and_mismatches(void **state)
{
    (void)state;
    fresh_stores();
    fixture f;
    fixture_open(&f, dirs.data, LLMT_PRECISION_FP32, 16);
    llmt_ckpt_store *s = open_store(f.ctx, 5, 0);
    fixture_train(&f, 1, NULL);
    llmt_train_state st = fixture_state(&f);
    assert_int_equal(llmt_ckpt_save(s, &st, LLMT_CKPT_DURABLE), LLMT_OK);
    llmt_ckpt_store_free(s);
    /* What interrupted saves leave: a temporary directory, and a checkpoint
     * moved aside whose replacement never arrived. */
    char tmp[256], old[256], cmd[1024];
    snprintf(tmp, sizeof tmp, "%s/step-00000005.tmp-abcdef", dirs.store);
    snprintf(old, sizeof old, "%s/step-00000001.old-abcdef", dirs.store);
    mkdir(tmp, 0755);
    snprintf(cmd, sizeof cmd, "touch '%s/model.safetensors' && mv '%s/step-00000001' '%s'", tmp,
             dirs.store, old);
    assert_int_equal(system(cmd), 0);
    s = open_store(f.ctx, 5, 0);
    assert_int_equal(file_size(tmp), -1);
    assert_int_equal(llmt_ckpt_verify(s, 1, LLMT_CKPT_DURABLE), LLMT_OK); /* put back */

    /* A model of another width or precision is refused, naming the field. */
    fixture g;
    fixture_open(&g, dirs.data, LLMT_PRECISION_FP32, 32);
    llmt_train_state ld = fixture_state(&g);
    assert_int_equal(llmt_ckpt_load(s, 1, LLMT_CKPT_DURABLE, &ld, NULL, 0, NULL), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "step-00000001");
    assert_contains(llmt_error_last(), "hidden_size = 16, this model 32");
    fixture_close(&g);
    fixture_open(&g, dirs.data, LLMT_PRECISION_BF16_MIXED, 16);
    ld = fixture_state(&g);
    assert_int_equal(llmt_ckpt_load(s, 1, LLMT_CKPT_DURABLE, &ld, NULL, 0, NULL), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "precision");
    fixture_close(&g);

    /* Arguments. */
    assert_int_equal(llmt_ckpt_save(s, NULL, LLMT_CKPT_DURABLE), LLMT_EINVAL);
    st = fixture_state(&f);
    assert_int_equal(llmt_ckpt_save(s, &st, LLMT_CKPT_FAST), LLMT_EINVAL); /* no fast tier */
    assert_contains(llmt_error_last(), "fast_dir");
    st.version = 9;
    assert_int_equal(llmt_ckpt_save(s, &st, LLMT_CKPT_DURABLE), LLMT_EVERSION);
    int64_t step;
    int32_t tier;
    assert_int_equal(llmt_ckpt_verify(s, 77, LLMT_CKPT_DURABLE), LLMT_ENOTFOUND); /* no such one */
    assert_contains(llmt_error_last(), "step-00000077");
    llmt_ckpt_store_free(s);
    llmt_ckpt_store_config sc = LLMT_CKPT_STORE_CONFIG_INIT;
    sc.keep = 0;
    assert_int_equal(llmt_ckpt_store_open(&s, f.ctx, dirs.store, &sc), LLMT_EINVAL);
    snprintf(cmd, sizeof cmd, "%s/empty", dirs.root);
    s = NULL;
    sc.keep = 1;
    assert_int_equal(llmt_ckpt_store_open(&s, f.ctx, cmd, &sc), LLMT_OK);
    assert_int_equal(llmt_ckpt_latest(s, &step, &tier, NULL, 0), LLMT_ENOTFOUND);
    llmt_ckpt_store_free(s);
    fixture_close(&f);
}

/* The files as docs/checkpoint-format.md describes them, read by hand. */
static void test_format_by_hand(void **state)
{
    (void)state;
    fresh_stores();
    fixture f;
    fixture_open(&f, dirs.data, LLMT_PRECISION_FP32, 16);
    llmt_ckpt_store *s = open_store(f.ctx, 5, 0);
    fixture_train(&f, 4, NULL);
    llmt_train_state st = fixture_state(&f);
    st.config_yaml = "model:\n  hidden_size: 16\n";
    assert_int_equal(llmt_ckpt_save(s, &st, LLMT_CKPT_DURABLE), LLMT_OK);
    char path[320];
    snprintf(path, sizeof path, "%s/step-00000004/MANIFEST", dirs.store);
    FILE *fp = fopen(path, "rb");
    char text[16384];
    size_t len = fread(text, 1, sizeof text - 1, fp);
    fclose(fp);
    text[len] = 0;
    /* Last line: "xxh3:" and the XXH3-64 of everything before it. */
    char *trailer = text + len - 22;
    assert_memory_equal(trailer, "xxh3:", 5);
    char want[32];
    snprintf(want, sizeof want, "xxh3:%016llx\n",
             (unsigned long long)XXH3_64bits(text, (size_t)(trailer - text)));
    assert_string_equal(trailer, want);
    assert_contains(text, "\"format\":\"llmt-checkpoint\"");
    assert_contains(text, "\"step\":4");
    assert_contains(text, "\"tokens_seen\":64");
    assert_contains(text, "\"step_count\":4");
    assert_contains(text, "\"config_yaml\":\"model:\\n  hidden_size: 16\\n\"");
    assert_contains(text, "{\"name\":\"model.safetensors\",\"bytes\":");
    /* The weights file is a plain safetensors file of the model. */
    fixture g;
    fixture_open(&g, dirs.data, LLMT_PRECISION_FP32, 16);
    snprintf(path, sizeof path, "%s/step-00000004/model.safetensors", dirs.store);
    assert_int_equal(llmt_model_load_safetensors(g.model, path), LLMT_OK);
    float a[16], b[16];
    llmt_model_get_param(f.model, "model.norm.weight", a, 16);
    llmt_model_get_param(g.model, "model.norm.weight", b, 16);
    assert_memory_equal(a, b, sizeof a);
    fixture_close(&g);
    llmt_ckpt_store_free(s);
    fixture_close(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bit_exact_resume),
        cmocka_unit_test(test_corruption_fails_closed),
        cmocka_unit_test(test_async_isolation),
        cmocka_unit_test(test_failed_state_file),
        cmocka_unit_test(test_rotation_and_tiers),
        cmocka_unit_test(test_leftovers_and_mismatches),
        cmocka_unit_test(test_format_by_hand),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
