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
    return NULL;
}

void llmt_task_start(llmt_task *t, int (*fn)(void *arg), void *arg, int threaded)
{
    t->fn = fn;
    t->arg = arg;
    t->rc = LLMT_OK;
    t->error[0] = '\0';
    t->on_thread = threaded && pthread_create(&t->thread, NULL, run, t) == 0;
    if (!t->on_thread) /* not wanted, or no thread to be had: the same work, here */
        run(t);
}

int llmt_task_join(llmt_task *t)
{
    if (t->on_thread)
        pthread_join(t->thread, NULL);
    t->on_thread = 0;
    return t->rc ? llmt_fail(t->rc, "%s", t->error) : LLMT_OK;
}
