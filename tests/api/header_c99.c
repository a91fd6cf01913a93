/* Compiled as C99 with -pedantic -Werror: the public headers must be plain C.
 * Run, it checks that the library it links against is the headers' version. */
#include <stdio.h>
#include <string.h>

#include "llmt/llmt.h"

int main(void)
{
    llmt_context_config cfg = LLMT_CONTEXT_CONFIG_INIT;
    llmt_memory_stats stats = LLMT_MEMORY_STATS_INIT;
    if (llmt_version_number() != LLMT_VERSION_NUMBER ||
        strcmp(llmt_version_string(), LLMT_VERSION_STRING) != 0) {
        fprintf(stderr, "header version %s, library %s\n", LLMT_VERSION_STRING,
                llmt_version_string());
        return 1;
    }
    return cfg.version == LLMT_CONTEXT_CONFIG_VERSION &&
                   stats.version == LLMT_MEMORY_STATS_VERSION
               ? 0
               : 1;
}
