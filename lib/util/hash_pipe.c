/* The hashing thread of llmt_hash_pipe: a bounded FIFO of ranges. */
#include <pthread.h>
#include <stdlib.h>
#include <xxhash.h>

#include "llmt/common.h"
#include "util/hash_pipe.h"
#include "core/error.h"

#define QUEUE 8

struct llmt_hash_pipe {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t changed;
    XXH3_state_t *state;
    const void *data[QUEUE];
    size_t len[QUEUE];
    uint64_t pushed, hashed; /* tickets: ranges queued and ranges done */
    int stop;
};

static void *hash_loop(void *arg)
{
    llmt_hash_pipe *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (p->hashed == p->pushed && !p->stop)
            pthread_cond_wait(&p->changed, &p->mu);
        if (p->hashed == p->pushed)
            break; /* stopped and drained */
        size_t slot = p->hashed % QUEUE;
        const void *data = p->data[slot];
        size_t len = p->len[slot];
        pthread_mutex_unlock(&p->mu);
        XXH3_64bits_update(p->state, data, len);
        pthread_mutex_lock(&p->mu);
        p->hashed++;
        pthread_cond_broadcast(&p->changed);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

int llmt_hash_pipe_start(llmt_hash_pipe **out)
{
    llmt_hash_pipe *p = calloc(1, sizeof *p);
    if (!p || !(p->state = XXH3_createState())) {
        free(p);
        return llmt_fail(LLMT_ENOMEM, "hash pipe: out of memory");
    }
    XXH3_64bits_reset(p->state);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->changed, NULL);
    if (pthread_create(&p->thread, NULL, hash_loop, p) != 0) {
        XXH3_freeState(p->state);
        free(p);
        return llmt_fail(LLMT_ENOMEM, "hash pipe: cannot start a thread");
    }
    *out = p;
    return LLMT_OK;
}

uint64_t llmt_hash_pipe_push(llmt_hash_pipe *p, const void *data, size_t len)
{
    pthread_mutex_lock(&p->mu);
    while (p->pushed - p->hashed == QUEUE)
        pthread_cond_wait(&p->changed, &p->mu);
    p->data[p->pushed % QUEUE] = data;
    p->len[p->pushed % QUEUE] = len;
    uint64_t ticket = ++p->pushed;
    pthread_cond_broadcast(&p->changed);
    pthread_mutex_unlock(&p->mu);
    return ticket;
}

void llmt_hash_pipe_wait(llmt_hash_pipe *p, uint64_t ticket)
{
    pthread_mutex_lock(&p->mu);
    while (p->hashed < ticket)
        pthread_cond_wait(&p->changed, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

uint64_t llmt_hash_pipe_finish(llmt_hash_pipe *p)
{
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->changed);
    pthread_mutex_unlock(&p->mu);
    pthread_join(p->thread, NULL);
    uint64_t digest = XXH3_64bits_digest(p->state);
    XXH3_freeState(p->state);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->changed);
    free(p);
    return digest;
}
