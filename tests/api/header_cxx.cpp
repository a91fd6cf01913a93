// Compiled as C++11 with -pedantic -Werror: the public headers must be usable
// from C++ (extern "C", no C-only constructs).
#include <cstdio>
#include <cstring>

#include "llmt/llmt.h"

int main()
{
    llmt_context_config cfg = LLMT_CONTEXT_CONFIG_INIT;
    llmt_context *ctx = nullptr;
    if (llmt_context_create(&ctx, &cfg) != LLMT_OK) {
        std::fprintf(stderr, "llmt_context_create: %s\n", llmt_error_last());
        return 1;
    }
    llmt_memory_stats stats = LLMT_MEMORY_STATS_INIT;
    int rc = llmt_context_memory_stats(ctx, &stats);
    llmt_context_free(ctx);
    if (rc != LLMT_OK || stats.total_current != 0)
        return 1;
    return std::strcmp(llmt_version_string(), LLMT_VERSION_STRING) == 0 ? 0 : 1;
}
