/* Signals during the CPU's oneDNN products (lib/ops/cpu/cpu_signals.h: held
 * around each product and around attention's regions). oneDNN 2.6's no-copy
 * fp32 kernels point the stack pointer at a heap workspace for K blocks over
 * 252 (AVX2) or 84 (AVX-512); a signal handled meanwhile had its frame
 * written there, over the heap. A helper thread sends SIGUSR1 every 20 us to
 * the calling thread and to the worker of the device's two-thread team
 * while they run products with K = 256 and 512: every handler must run on
 * its own thread's stack, and the products must still be right. The
 * products go on until the two have handled WANT_HANDLED signals (nearly
 * all on the caller: a worker blocks them for good before its first
 * product): on a busy machine the sending thread may not run at all during
 * a fixed number of products (CI once saw none handled). Without the held
 * signals the process usually aborts in a later free ("corrupted size vs.
 * prev_size") before the count is checked; either way the test fails.
 * Then the same for a worker that libgomp started after the team's workers
 * had blocked them (check_new_worker). Where oneDNN does not pick those
 * kernels (a CPU without AVX, a oneDNN with the fix) the products never run
 * on a heap stack, and this cannot fail. */
#define _GNU_SOURCE
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ops_harness.h"

#include "ops/cpu/cpu_backend.h"

/* The calling thread's stack, [lo, hi); unset (NULL) on other threads. */
static _Thread_local char *t_stack_lo, *t_stack_hi;
/* Signals handled on the two targets, and how many of those off the stack. */
static volatile sig_atomic_t g_handled, g_off_stack;
static pthread_t g_targets[2]; /* the caller and the team's worker */
static atomic_int g_stop;      /* set: the helper thread stops sending */
static struct timespec g_since; /* when the helper thread was started */

/* Notes the calling thread's stack (t_stack_lo, t_stack_hi). */
static void note_stack(void)
{
    pthread_attr_t attr;
    void *lo;
    size_t size;
    assert_int_equal(pthread_getattr_np(pthread_self(), &attr), 0);
    assert_int_equal(pthread_attr_getstack(&attr, &lo, &size), 0);
    pthread_attr_destroy(&attr);
    t_stack_lo = lo;
    t_stack_hi = (char *)lo + size;
}

/* Counts the signal, and whether this frame is off the thread's stack. */
static void on_usr1(int sig)
{
    char here;
    (void)sig;
    if (!t_stack_lo)
        return;
    g_handled++;
    if (&here < t_stack_lo || &here >= t_stack_hi)
        g_off_stack++;
}

/* Sends SIGUSR1 to the two targets in turn until told to stop. */
static void *pester(void *arg)
{
    (void)arg;
    sigset_t usr1;
    sigemptyset(&usr1);
    sigaddset(&usr1, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &usr1, NULL);
    const struct timespec gap = {0, 20000};
    for (unsigned i = 0; !atomic_load(&g_stop); i++) {
        pthread_kill(g_targets[i & 1], SIGUSR1);
        nanosleep(&gap, NULL);
    }
    return NULL;
}

enum { WANT_HANDLED = 20, MOST_SECONDS = 60 };

/* Seconds since the helper thread was started (g_since). */
static double seconds_pestering(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)(now.tv_sec - g_since.tv_sec) + 1e-9 * (double)(now.tv_nsec - g_since.tv_nsec);
}

/* Whether to run another round of products after `round` of them: at least
 * `rounds`, then until the targets have handled WANT_HANDLED signals or
 * MOST_SECONDS have passed since the helper thread started (the check then
 * asserts the count). */
static int another_round(int round, int rounds)
{
    if (round < rounds)
        return 1;
    return g_handled < WANT_HANDLED && seconds_pestering() < MOST_SECONDS;
}

/* Largest |c - a b| over the m x n result, relative to the largest |a b|,
 * from a double reference; row-major with leading dimensions lda, ldb, ldc. */
static double product_error(const float *a, int lda, const float *b, int ldb, const float *c,
                            int ldc, int m, int n, int k)
{
    double err = 0.0, scale = 0.0;
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double want = 0.0;
            for (int l = 0; l < k; l++)
                want += (double)a[i * lda + l] * b[l * ldb + j];
            err = fmax(err, fabs(c[i * ldc + j] - want));
            scale = fmax(scale, fabs(want));
        }
    return err / scale;
}

/* Installs on_usr1 for SIGUSR1 (the old action into *old) and starts the
 * helper thread sending it to g_targets (at g_since). */
static void start_pestering(struct sigaction *old, pthread_t *helper)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    assert_int_equal(sigaction(SIGUSR1, &sa, old), 0);
    g_handled = g_off_stack = 0;
    atomic_store(&g_stop, 0);
    clock_gettime(CLOCK_MONOTONIC, &g_since);
    assert_int_equal(pthread_create(helper, NULL, pester, NULL), 0);
}

/* Stops the helper thread and restores SIGUSR1's old action; SIG_IGN first
 * drops what is still pending (a worker keeps SIGUSR1 blocked). */
static void stop_pestering(const struct sigaction *old, pthread_t helper)
{
    atomic_store(&g_stop, 1);
    pthread_join(helper, NULL);
    signal(SIGUSR1, SIG_IGN);
    assert_int_equal(sigaction(SIGUSR1, old, NULL), 0);
}

/* The team's workers change: a 3-thread device's product blocks its two
 * workers, a 2-thread team of the caller's retires one (libgomp), and a
 * 3-thread team starts a new one with the caller's mask, signals
 * unblocked. Signals then go to that new worker during 3-thread products:
 * it must block them before it runs one (were the blocking done once per
 * team size, it would run the heap-stack kernel with them open). */
static void check_new_worker(const float *a, const float *b, float *c, int m, int n, int k)
{
    llmt_device *dev = NULL;
    OK(llmt_cpu_backend_create(3, &dev));
    OK(llmt_cpu_gemm(dev, 0, 0, m, n, k, 1.0f, a, k, b, n, 0.0f, c, n, LLMT_DTYPE_F32, NULL));
#pragma omp parallel num_threads(2)
    note_stack();
#pragma omp parallel num_threads(3)
    {
        note_stack();
        if (omp_get_thread_num() == 2)
            g_targets[1] = pthread_self();
    }
    struct sigaction old;
    pthread_t helper;
    start_pestering(&old, &helper);
    for (int r = 0; another_round(r, 40); r++)
        OK(llmt_cpu_gemm(dev, 0, 0, m, n, k, 1.0f, a, k, b, n, 0.0f, c, n, LLMT_DTYPE_F32, NULL));
    stop_pestering(&old, helper);
    double err = product_error(a, k, b, n, c, n, m, n, k);
    printf("three threads, a new worker: signals handled %d, off the stack %d; error %.2e\n",
           (int)g_handled, (int)g_off_stack, err);
    assert_true(g_handled >= WANT_HANDLED);
    assert_int_equal(g_off_stack, 0);
    assert_true(err < 1e-5);
    llmt_cpu_destroy(dev);
}

void check_gemm_signals(void)
{
    llmt_device *dev = g_cpu.dev;
    assert_int_equal(dev->num_threads, 2);
    enum { M = 128, N = 128, K = 512, REPS = 60 };
    uint64_t seed = 7;
    float *a = randn(&seed, M * K, 1.0, LLMT_DTYPE_F32);
    float *b = randn(&seed, K * N, 1.0, LLMT_DTYPE_F32);
    float *c = calloc((size_t)M * N, sizeof *c), *cs = calloc(2 * 64 * 64, sizeof *cs);
    assert_non_null(c);
    assert_non_null(cs);
    g_targets[0] = pthread_self();
#pragma omp parallel num_threads(2)
    {
        note_stack();
        if (omp_get_thread_num() == 1)
            g_targets[1] = pthread_self();
    }
    struct sigaction old;
    pthread_t helper;
    start_pestering(&old, &helper);
    double err_serial = 0.0;
    for (int r = 0; another_round(r, REPS); r++) {
        /* one thread, K = 256: the caller's */
        OK(llmt_cpu_gemm(dev, 0, 0, 64, 64, 256, 1.0f, a, K, b, N, 0.0f, c, N, LLMT_DTYPE_F32,
                         NULL));
        /* both threads of the team, K = 512 */
        OK(llmt_cpu_gemm(dev, 0, 0, M, N, K, 1.0f, a, K, b, N, 0.0f, c, N, LLMT_DTYPE_F32, NULL));
        /* each thread its own product on its own oneDNN state, as attention does */
#pragma omp parallel num_threads(2)
        {
            float *mine = cs + omp_get_thread_num() * 64 * 64;
            if (llmt_cpu_sgemm_serial(dev, 0, 0, 64, 64, 256, 1.0f, a, K, b, N, 0.0f, mine, 64))
                mine[0] = NAN;
        }
    }
    stop_pestering(&old, helper);
    double err = product_error(a, K, b, N, c, N, M, N, K);
    for (int t = 0; t < 2; t++)
        err_serial = fmax(err_serial, product_error(a, K, b, N, cs + t * 64 * 64, 64, 64, 64, 256));
    printf("signals handled %d, off the stack %d; errors %.2e, serial %.2e\n", (int)g_handled,
           (int)g_off_stack, err, err_serial);
    assert_true(g_handled >= WANT_HANDLED);
    assert_int_equal(g_off_stack, 0);
    assert_true(err < 1e-5);
    assert_true(err_serial < 1e-5);
    check_new_worker(a, b, c, M, N, K);
    free(cs);
    free(c);
    free(b);
    free(a);
}
