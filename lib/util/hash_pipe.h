/* A pipelined XXH3-64: the caller queues ranges of memory in order and goes
 * on (reading the next part of a file), while a thread hashes them. */
#ifndef LLMT_UTIL_HASH_PIPE_H
#define LLMT_UTIL_HASH_PIPE_H

#include <stddef.h>
#include <stdint.h>

typedef struct llmt_hash_pipe llmt_hash_pipe;

/* Starts the hashing thread. */
int llmt_hash_pipe_start(llmt_hash_pipe **out);

/* Queues len bytes at data, hashed after everything queued before; blocks
 * while the queue is full. The bytes must stay unchanged until the returned
 * ticket has been waited for (or the pipe finished). */
uint64_t llmt_hash_pipe_push(llmt_hash_pipe *p, const void *data, size_t len);

/* Waits until the range of ticket has been hashed. */
void llmt_hash_pipe_wait(llmt_hash_pipe *p, uint64_t ticket);

/* Waits for every range, stops the thread, frees p; returns the digest. */
uint64_t llmt_hash_pipe_finish(llmt_hash_pipe *p);

#endif
