/* LLMT_REQUIRE_CUDA=1 turns the CUDA tests' "no device" skip into a
 * failure, so a run meant for a GPU (tests/gpu/run.sh) cannot pass without
 * using one. Unset, empty or 0: the tests skip (CMocka skip(), exit 77,
 * CTest's "skipped"). Another value fails, rather than being read as either. */
#ifndef LLMT_TEST_CUDA_REQUIRED_H
#define LLMT_TEST_CUDA_REQUIRED_H

#include <stdlib.h>
#include <string.h>

#include "test_util.h"

/* For a test that needs the CUDA backend, which did not open (why: the
 * error it gave): skips, or fails under LLMT_REQUIRE_CUDA=1. */
static inline void cuda_unavailable(const char *why)
{
    const char *req = getenv("LLMT_REQUIRE_CUDA");
    if (req && *req && strcmp(req, "0") != 0 && strcmp(req, "1") != 0)
        fail_msg("LLMT_REQUIRE_CUDA must be 0 or 1, not '%s'", req);
    if (req && strcmp(req, "1") == 0)
        fail_msg("LLMT_REQUIRE_CUDA=1, but no CUDA backend: %s", why);
    print_message("no CUDA backend: %s\n", why);
    skip();
}

#endif
