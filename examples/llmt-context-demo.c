/* Creates a context, allocates nothing yet, and prints its memory accounting:
 * the smallest program against libllmt. */
#include <stdio.h>

#include <llmt/llmt.h>

int main(void)
{
    llmt_context_config cfg = LLMT_CONTEXT_CONFIG_INIT;
    llmt_context *ctx = NULL;
    if (llmt_context_create(&ctx, &cfg) != LLMT_OK) {
        fprintf(stderr, "llmt-context-demo: %s\n", llmt_error_last());
        return 1;
    }
    llmt_memory_stats stats = LLMT_MEMORY_STATS_INIT;
    if (llmt_context_memory_stats(ctx, &stats) != LLMT_OK) {
        fprintf(stderr, "llmt-context-demo: %s\n", llmt_error_last());
        llmt_context_free(ctx);
        return 1;
    }
    printf("libllmt %s, backend cpu, %d threads\n", llmt_version_string(),
           llmt_context_num_threads(ctx));
    for (int c = 0; c < LLMT_MEM_CATEGORY_COUNT; c++)
        printf("  %-12s current %12llu  peak %12llu bytes\n", llmt_mem_category_name(c),
               (unsigned long long)stats.current[c], (unsigned long long)stats.peak[c]);
    printf("  device total %.1f GiB, free %.1f GiB\n", stats.device_total / 1073741824.0,
           stats.device_free / 1073741824.0);
    llmt_context_free(ctx);
    return 0;
}
