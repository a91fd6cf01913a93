/* Crash during save: the harness (tests/tools/ckpt_harness.c) trains and
 * saves continually while this test kills it with SIGKILL at random
 * instants; each time a fresh process resumes from the newest valid
 * checkpoint. After at least 30 kills (several of them inside a save, as the
 * temporary directories they leave show) the harness is let finish, and its
 * final state must be byte-identical to an uninterrupted run's. A run that
 * finishes before its kill, or is killed after its last checkpoint, starts
 * the trials over from step 0. */
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "test_util.h"

#include "llmt/llmt.h"
#include "test_rand.h"
#include "train_fixture.h"
#include "util/fsutil.h"

/* MIN_SINCE_RESTART: kills after the last restart (a run that got to its
 * end starts the trials over from step 0), so that the progress checked
 * below is never that of a restart just before the loop ended. */
enum { TOTAL = 240, MIN_KILLS = 30, MIN_IN_SAVE = 3, MAX_RUNS = 300, MIN_SINCE_RESTART = 8 };

static char root[64];

static pid_t spawn(const char *harness, const char *store, const char *fast, const char *out)
{
    char data[128], total[16];
    snprintf(data, sizeof data, "%s/data", root);
    snprintf(total, sizeof total, "%d", TOTAL);
    pid_t pid = fork();
    if (pid == 0) {
        execl(harness, harness, data, store, fast, total, out, (char *)NULL);
        _exit(127);
    }
    return pid;
}

/* Temporary directories an interrupted save left, in both tiers. */
static int leftovers(const char *store, const char *fast)
{
    int n = 0;
    const char *dirs[2] = {store, fast};
    for (int i = 0; i < 2; i++) {
        DIR *d = opendir(dirs[i]);
        struct dirent *e;
        while (d && (e = readdir(d)))
            n += strstr(e->d_name, ".tmp-") != NULL;
        if (d)
            closedir(d);
    }
    return n;
}

static unsigned char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(*len);
    if (fread(b, 1, *len, f) != *len) {
        free(b);
        b = NULL;
    }
    fclose(f);
    return b;
}

static int run_to_end(const char *harness, const char *store, const char *fast, const char *out)
{
    int status = 0;
    waitpid(spawn(harness, store, fast, out), &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* The step of the newest valid checkpoint in the two tiers (-1: none, or
 * a tier's directory not made yet) and its tier, read without changing
 * the store. */
static int64_t latest_step(const char *store, const char *fast, int32_t *tier)
{
    llmt_context_config cc = LLMT_CONTEXT_CONFIG_INIT;
    llmt_context *ctx = NULL;
    llmt_ckpt_store *cs = NULL;
    llmt_ckpt_store_config sc = LLMT_CKPT_STORE_CONFIG_INIT;
    sc.fast_dir = fast;
    sc.read_only = 1;
    assert_int_equal(llmt_context_create(&ctx, &cc), LLMT_OK);
    /* Read-only, a missing directory is LLMT_ENOTFOUND (a run killed
     * before it made its store's). */
    int rc = llmt_ckpt_store_open(&cs, ctx, store, &sc);
    if (rc != LLMT_ENOTFOUND)
        assert_int_equal(rc, LLMT_OK);
    int64_t step = -1;
    if (!rc)
        rc = llmt_ckpt_latest(cs, &step, tier, NULL, 0);
    if (rc != LLMT_ENOTFOUND)
        assert_int_equal(rc, LLMT_OK);
    llmt_ckpt_store_free(cs);
    llmt_context_free(ctx);
    return rc == LLMT_OK ? step : -1;
}

/* Whether a killed run had got to its end: its output written, or its last
 * step checkpointed (the kill came between that save and the exit). Such a
 * run has no progress left to lose, as one that finished before its kill. */
static int reached_end(const char *store, const char *fast, const char *out)
{
    struct stat st;
    int32_t tier = -1;
    return stat(out, &st) == 0 || latest_step(store, fast, &tier) == TOTAL;
}

/* Fails unless the files at paths a and b hold the same bytes. */
static void assert_same_bytes(const char *a_path, const char *b_path)
{
    size_t la = 0, lb = 0;
    unsigned char *a = slurp(a_path, &la), *b = slurp(b_path, &lb);
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal(la, lb);
    assert_memory_equal(a, b, la);
    free(a);
    free(b);
}

/* Removes what a run that got to its end left, so the next starts at step
 * 0; the final state it wrote (whole: written aside, then renamed) must be
 * the uninterrupted run's (ref_out). */
static void start_over(const char *store, const char *fast, const char *out, const char *ref_out)
{
    struct stat st;
    assert_int_equal(llmt_remove_tree(store), LLMT_OK);
    assert_int_equal(llmt_remove_tree(fast), LLMT_OK);
    if (stat(out, &st) == 0) {
        assert_same_bytes(ref_out, out);
        assert_int_equal(unlink(out), 0);
    }
}

static void test_kill_and_resume(void **state)
{
    (void)state;
    const char *harness = getenv("LLMT_CKPT_HARNESS");
    assert_non_null(harness);
    snprintf(root, sizeof root, "/tmp/llmt-crash-XXXXXX");
    assert_non_null(mkdtemp(root));
    char data[128], ref_store[128], ref_fast[128], store[128], fast[128], ref_out[128], out[128];
    snprintf(data, sizeof data, "%s/data", root);
    snprintf(ref_store, sizeof ref_store, "%s/ref", root);
    snprintf(ref_fast, sizeof ref_fast, "%s/ref-fast", root);
    snprintf(store, sizeof store, "%s/run", root);
    snprintf(fast, sizeof fast, "%s/run-fast", root);
    snprintf(ref_out, sizeof ref_out, "%s/ref.bin", root);
    snprintf(out, sizeof out, "%s/run.bin", root);
    mkdir(data, 0755);
    fixture_write_shards(data);

    /* The uninterrupted run; its duration scales the kill delays, so that a
     * slow build (sanitizers) progresses between kills as a fast one does. */
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    assert_int_equal(run_to_end(harness, ref_store, ref_fast, ref_out), 0);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    int64_t run_ns = (int64_t)(t1.tv_sec - t0.tv_sec) * 1000000000 + (t1.tv_nsec - t0.tv_nsec);

    /* The killed runs. LLMT_CRASH_SEED sets the kill delays' seed (nonzero;
     * the delays still scale with the measured run and land as the
     * machine schedules them). */
    const char *seed = getenv("LLMT_CRASH_SEED");
    uint64_t rnd = seed ? strtoull(seed, NULL, 10) : (uint64_t)time(NULL);
    assert_true(rnd != 0);
    print_message("kill delays from seed %llu (LLMT_CRASH_SEED)\n", (unsigned long long)rnd);
    int kills = 0, in_save = 0, finished = 0, since_restart = 0;
    while ((kills < MIN_KILLS || in_save < MIN_IN_SAVE || since_restart < MIN_SINCE_RESTART) &&
           kills + finished < MAX_RUNS) {
        pid_t pid = spawn(harness, store, fast, out);
        /* Between 1/30 and 1/10 of an uninterrupted run. */
        int64_t ns = run_ns / 30 + (int64_t)(trand_u64(&rnd) % (uint64_t)(run_ns / 15));
        struct timespec delay = {(time_t)(ns / 1000000000), (long)(ns % 1000000000)};
        nanosleep(&delay, NULL);
        kill(pid, SIGKILL);
        int status = 0;
        waitpid(pid, &status, 0);
        if (WIFEXITED(status))
            assert_int_equal(WEXITSTATUS(status), 0);
        const int partial = leftovers(store, fast) > 0;
        if (WIFEXITED(status) || reached_end(store, fast, out)) {
            /* it finished, or as good as, before the kill: start over */
            finished++;
            start_over(store, fast, out, ref_out);
            since_restart = 0;
            continue;
        }
        kills++;
        since_restart++;
        in_save += partial;
    }
    print_message("%d kills, %d inside a save (temporary directory left), %d runs finished early "
                  "(or killed after their last checkpoint)\n", kills, in_save, finished);
    assert_true(kills >= MIN_KILLS);
    assert_true(in_save >= MIN_IN_SAVE);

    /* The kills left progress behind: a verified checkpoint well into the run. */
    int32_t tier = -1;
    const int64_t resumed_from = latest_step(store, fast, &tier);
    print_message("the last run resumes from step %lld of %d (%s tier)\n", (long long)resumed_from,
                  TOTAL, tier ? "fast" : "durable");
    assert_true(resumed_from >= TOTAL / 10 && resumed_from < TOTAL);

    /* Let it finish: resuming from whatever the kills left. */
    assert_int_equal(run_to_end(harness, store, fast, out), 0);
    assert_same_bytes(ref_out, out);
    assert_int_equal(llmt_remove_tree(root), LLMT_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_kill_and_resume)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
