/* Internal error reporting: sets the calling thread's message and returns the code. */
#ifndef LLMT_CORE_ERROR_H
#define LLMT_CORE_ERROR_H

#include <stdarg.h>

/* Bytes of a thread's message, its terminating zero included: room for a
 * message naming several files (llmt_ckpt_latest names every checkpoint it
 * refused). */
#define LLMT_ERROR_CAP 4096

/* Records a formatted message for llmt_error_last() and returns code, so a
 * failing path reads `return llmt_fail(LLMT_EINVAL, "...", ...);`. */
int llmt_fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Like llmt_fail, with a va_list. */
int llmt_vfail(int code, const char *fmt, va_list ap);

/* Prepends "prefix: " to the calling thread's message and returns code; used
 * to add context (a file, a tensor) to an error raised deeper down. */
int llmt_fail_prefix(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Returns from the calling function when call fails, passing its status on. */
#define LLMT_TRY(call)         \
    do {                       \
        int rc_ = (call);      \
        if (rc_)               \
            return rc_;        \
    } while (0)

#endif
