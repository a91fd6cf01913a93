// Creates a context from an installed libllmt, from C++, and checks that the
// header's version and the library's agree.
#include <cstdio>

#include <llmt/llmt.h>

int main()
{
    llmt_context_config cfg = LLMT_CONTEXT_CONFIG_INIT;
    llmt_context *ctx = nullptr;
    if (llmt_context_create(&ctx, &cfg) != LLMT_OK) {
        std::fprintf(stderr, "consumer_cxx: %s\n", llmt_error_last());
        return 1;
    }
    llmt_context_free(ctx);
    return llmt_version_number() == LLMT_VERSION_NUMBER ? 0 : 1;
}
