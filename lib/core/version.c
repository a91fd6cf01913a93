/* Runtime version queries and dtype facts. */
#include "llmt/common.h"

uint32_t llmt_version_number(void)
{
    return LLMT_VERSION_NUMBER;
}

const char *llmt_version_string(void)
{
    return LLMT_VERSION_STRING;
}

size_t llmt_dtype_size(int dtype)
{
    switch (dtype) {
    case LLMT_DTYPE_F32: return 4;
    case LLMT_DTYPE_F16: return 2;
    case LLMT_DTYPE_BF16: return 2;
    case LLMT_DTYPE_I32: return 4;
    default: return 0;
    }
}

const char *llmt_dtype_name(int dtype)
{
    switch (dtype) {
    case LLMT_DTYPE_F32: return "F32";
    case LLMT_DTYPE_F16: return "F16";
    case LLMT_DTYPE_BF16: return "BF16";
    case LLMT_DTYPE_I32: return "I32";
    default: return "?";
    }
}
