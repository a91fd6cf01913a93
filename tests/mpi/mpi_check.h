/* Failure reporting of the tests run as MPI jobs: each rank counts its own
 * failed expectations and names itself in every message. */
#ifndef LLMT_TEST_MPI_CHECK_H
#define LLMT_TEST_MPI_CHECK_H

#include <stdint.h>
#include <stdio.h>

#include "llmt/llmt.h"

/* This process's rank and the world's size (set by the test's main), and
 * the count of failed expectations on this rank. */
extern int rank, size, failures;

/* Aborts the job, naming the rank and the library's message, unless rc is 0. */
void must(int rc, const char *what);

/* Whether v is the same on every rank of MPI_COMM_WORLD (collective). */
int same_on_all(int64_t v);

/* Counts a failed expectation on this rank, with a message. */
#define EXPECT(cond, ...)                                                          \
    do {                                                                           \
        if (!(cond)) {                                                             \
            fprintf(stderr, "rank %d: FAILED %s:%d: ", rank, __FILE__, __LINE__);  \
            fprintf(stderr, __VA_ARGS__);                                          \
            fprintf(stderr, "\n");                                                 \
            failures++;                                                            \
        }                                                                          \
    } while (0)

#endif
