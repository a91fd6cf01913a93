/* A CPU context for tests: the given thread count and seed, asserting success. */
#ifndef LLMT_TEST_CONTEXT_H
#define LLMT_TEST_CONTEXT_H

#include "llmt/llmt.h"

llmt_context *test_context(int threads, uint64_t seed);

#endif
