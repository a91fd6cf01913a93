/* A call run on a thread of its own while the caller goes on, its status
 * and message brought back at the join (messages are per thread). */
#ifndef LLMT_UTIL_TASK_H
#define LLMT_UTIL_TASK_H

#include <pthread.h>
#include <stdatomic.h>

#include "core/error.h"

typedef struct llmt_task {
    int (*fn)(void *arg);
    void *arg;
    pthread_t thread;
    int on_thread;
    atomic_int done; /* fn returned: rc and error are set */
    int rc;
    char error[LLMT_ERROR_CAP]; /* fn's message when rc is a failure */
} llmt_task;

/* Runs fn(arg) on a new thread when `threaded` (and a thread can be had),
 * else here and now. */
void llmt_task_start(llmt_task *t, int (*fn)(void *arg), void *arg, int threaded);

/* Whether t's call has returned (it may still need a join). */
int llmt_task_done(llmt_task *t);

/* Waits for t; then t->rc and t->error hold its status and message. */
void llmt_task_wait(llmt_task *t);

/* Waits for t; returns its status, its message raised on this thread. */
int llmt_task_join(llmt_task *t);

/* first(a) and second(b) at once, first on a thread of its own, when
 * `threaded`; else first, then second unless first failed. second may be
 * NULL. Returns first's failure (its message), else second's status. */
int llmt_task_pair(int (*first)(void *a), void *a, int (*second)(void *b), void *b,
                   int threaded);

#endif
