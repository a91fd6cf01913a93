/* Creates a context from an installed libllmt and checks the version agrees. */
#include <stdio.h>

#include <llmt/llmt.h>

int main(void)
{
    llmt_context_config cfg = LLMT_CONTEXT_CONFIG_INIT;
    llmt_context *ctx = NULL;
    if (llmt_context_create(&ctx, &cfg) != LLMT_OK) {
        fprintf(stderr, "consumer: %s\n", llmt_error_last());
        return 1;
    }
    llmt_context_free(ctx);
    return llmt_version_number() == LLMT_VERSION_NUMBER ? 0 : 1;
}
