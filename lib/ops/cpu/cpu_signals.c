/* Signals held off the threads that run oneDNN's products (cpu_signals.h). */
#include <omp.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>

#include "ops/cpu/cpu_signals.h"

/* The calling thread's holds: their depth and the mask the outermost found. */
static _Thread_local int hold_depth;
static _Thread_local sigset_t hold_saved;

/* Every signal but those a fault raises (held, a fault's signal would hang
 * the thread or kill the process). */
static void held_signals(sigset_t *set)
{
    static const int faults[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS, SIGABRT};
    sigfillset(set);
    for (size_t i = 0; i < sizeof faults / sizeof *faults; i++)
        sigdelset(set, faults[i]);
}

void llmt_cpu_signals_hold(void)
{
    if (hold_depth++ > 0)
        return;
    sigset_t held;
    held_signals(&held);
    pthread_sigmask(SIG_BLOCK, &held, &hold_saved);
}

void llmt_cpu_signals_release(void)
{
    if (--hold_depth == 0)
        pthread_sigmask(SIG_SETMASK, &hold_saved, NULL);
}

void llmt_cpu_signals_hold_workers(int threads)
{
    /* Set on a worker once it blocks them (a worker lives as long as its
     * thread: a new one starts unset). */
    static _Thread_local int worker_holds;
    if (threads <= 1)
        return;
    sigset_t held;
    held_signals(&held);
#pragma omp parallel num_threads(threads)
    if (omp_get_thread_num() != 0 && !worker_holds) {
        pthread_sigmask(SIG_BLOCK, &held, NULL);
        worker_holds = 1;
    }
}
