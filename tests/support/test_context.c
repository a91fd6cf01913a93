/* Shared context setup of the tests. */
#include <stdio.h>
#include <stdlib.h>

#include "test_context.h"

llmt_context *test_context(int threads, uint64_t seed)
{
    llmt_context_config cfg = LLMT_CONTEXT_CONFIG_INIT;
    cfg.num_threads = threads;
    cfg.seed = seed;
    llmt_context *ctx = NULL;
    if (llmt_context_create(&ctx, &cfg) != LLMT_OK) {
        fprintf(stderr, "test_context: %s\n", llmt_error_last());
        abort();
    }
    return ctx;
}
