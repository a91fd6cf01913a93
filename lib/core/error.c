/* Thread-local error messages and status strings. */
#include <stdio.h>
#include <string.h>

#include "llmt/common.h"
#include "core/error.h"

static _Thread_local char error_message[LLMT_ERROR_CAP];

int llmt_vfail(int code, const char *fmt, va_list ap)
{
    vsnprintf(error_message, sizeof error_message, fmt, ap);
    return code;
}

int llmt_fail(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    llmt_vfail(code, fmt, ap);
    va_end(ap);
    return code;
}

int llmt_fail_prefix(int code, const char *fmt, ...)
{
    char inner[LLMT_ERROR_CAP];
    memcpy(inner, error_message, sizeof inner);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(error_message, sizeof error_message, fmt, ap);
    va_end(ap);
    /* Append ": inner", truncating at the buffer's end. */
    size_t used = strlen(error_message);
    size_t room = sizeof error_message - used;
    if (room > 3) {
        size_t inner_len = strnlen(inner, room - 3);
        memcpy(error_message + used, ": ", 2);
        memcpy(error_message + used + 2, inner, inner_len);
        error_message[used + 2 + inner_len] = '\0';
    }
    return code;
}

const char *llmt_error_last(void)
{
    return error_message;
}

void llmt_error_clear(void)
{
    error_message[0] = '\0';
}

int llmt_error_set(int status, const char *message)
{
    snprintf(error_message, sizeof error_message, "%s", message ? message : "");
    return status;
}

const char *llmt_status_string(int status)
{
    switch (status) {
    case LLMT_OK: return "success";
    case LLMT_EINVAL: return "invalid argument";
    case LLMT_ENOMEM: return "out of memory";
    case LLMT_EIO: return "input/output error";
    case LLMT_ECORRUPT: return "corrupt data";
    case LLMT_EVERSION: return "unknown version";
    case LLMT_EUNSUPPORTED: return "not supported";
    case LLMT_ECUDA: return "CUDA error";
    case LLMT_ESTATE: return "invalid state";
    case LLMT_ENOTFOUND: return "not found";
    case LLMT_EBUSY: return "in use by another process";
    case LLMT_ECOMM: return "communication failed or ranks disagree";
    default: return "unknown status";
    }
}
