/* A call run on a thread of its own while the caller goes on, its status
 * and message brought back at the join (messages are per thread). */
#ifndef LLMT_UTIL_TASK_H
#define LLMT_UTIL_TASK_H

#include <pthread.h>

#include "core/error.h"

typedef struct llmt_task {
    int (*fn)(void *arg);
    void *arg;
    pthread_t thread;
    int on_thread;
    int rc;
    char error[LLMT_ERROR_CAP];
} llmt_task;

/* Runs fn(arg) on a new thread when `threaded` (and a thread can be had),
 * else here and now. */
void llmt_task_start(llmt_task *t, int (*fn)(void *arg), void *arg, int threaded);

/* Waits for t; returns its status, its message raised on this thread. */
int llmt_task_join(llmt_task *t);

#endif
