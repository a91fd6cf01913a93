/* llmt_task: a call on a thread of its own, joined with its status. */
#include <stdio.h>

#include "core/error.h"
#include "llmt/common.h"
#include "util/task.h"

static void *run(void *arg)
{
    llmt_task *t = arg;
    t->rc = t->fn(t->arg);
    if (t->rc)
        snprintf(t->error, sizeof t->error, "%s", llmt_error_last());
    atomic_store(&t->done, 1);
    return NULL;
}

void llmt_task_start(llmt_task *t, int (*fn)(void *arg), void *arg, int threaded)
{
    t->fn = fn;
    t->arg = arg;
    t->rc = LLMT_OK;
    t->error[0] = '\0';
    atomic_store(&t->done, 0);
    t->on_thread = threaded && pthread_create(&t->thread, NULL, run, t) == 0;
    if (!t->on_thread) /* not wanted, or no thread to be had: the same work, here */
        run(t);
}

int llmt_task_done(llmt_task *t)
{
    return atomic_load(&t->done);
}

void llmt_task_wait(llmt_task *t)
{
    if (t->on_thread)
        pthread_join(t->thread, NULL);
    t->on_thread = 0;
}

int llmt_task_join(llmt_task *t)
{
    llmt_task_wait(t);
    return t->rc ? llmt_fail(t->rc, "%s", t->error) : LLMT_OK;
}

int llmt_task_pair(int (*first)(void *a), void *a, int (*second)(void *b), void *b,
                   int threaded)
{
    llmt_task t;
    llmt_task_start(&t, first, a, threaded);
    const int stopped = !t.on_thread && t.rc; /* first ran here and failed */
    int rc = second && !stopped ? second(b) : LLMT_OK;
    int first_rc = llmt_task_join(&t); /* its message, when it failed */
    return first_rc ? first_rc : rc;
}
