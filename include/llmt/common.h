/* libllmt common definitions: export macro, status codes, error reporting,
 * data types and version queries.
 *
 * Threads: an object is used by one thread at a time; distinct objects may be
 * used from distinct threads at once. Error messages are kept per thread. */
#ifndef LLMT_COMMON_H
#define LLMT_COMMON_H

#include <stddef.h>
#include <stdint.h>

#include "llmt/version.h"

#ifdef __cplusplus
extern "C" {
#endif

/* LLMT_API marks every exported function; nothing else is exported. */
#if defined(__GNUC__)
#define LLMT_API __attribute__((visibility("default")))
#else
#define LLMT_API
#endif

/* Status codes. 0 is success; errors are negative and never change meaning
 * once released. */
enum {
    LLMT_OK = 0,
    LLMT_EINVAL = -1,       /* an argument is invalid */
    LLMT_ENOMEM = -2,       /* out of memory, or the context's budget refused */
    LLMT_EIO = -3,          /* a file system or I/O operation failed */
    LLMT_ECORRUPT = -4,     /* data on disk failed validation */
    LLMT_EVERSION = -5,     /* a struct or file version this library does not know */
    LLMT_EUNSUPPORTED = -6, /* the feature is not available in this build or backend */
    LLMT_ECUDA = -7,        /* the CUDA runtime or a CUDA library reported an error */
    LLMT_ESTATE = -8,       /* the object is not in a state that allows the call */
    LLMT_ENOTFOUND = -9,    /* the requested item does not exist */
    LLMT_EBUSY = -10,       /* another process (or handle) holds the item's lock */
    LLMT_ECOMM = -11        /* a collective failed, or the ranks of a run disagree */
};

/* Static text describing a status code ("invalid argument"); never NULL. */
LLMT_API const char *llmt_status_string(int status);

/* The message of the last failure on the calling thread, naming the argument
 * or file and the value that was wrong. Never NULL; empty when no call on this
 * thread has failed. Valid until the next failing call on this thread. */
LLMT_API const char *llmt_error_last(void);

/* Forgets the calling thread's last error message. */
LLMT_API void llmt_error_clear(void);

/* Sets the calling thread's error message (truncated to 4095 bytes; NULL
 * clears it) and returns status: for code compiled outside the library that
 * reports through llmt_error_last(), such as the header-only adapter
 * llmt/comm_mpi.h. */
LLMT_API int llmt_error_set(int status, const char *message);

/* Element types of tensors. */
typedef enum llmt_dtype {
    LLMT_DTYPE_F32 = 0,
    LLMT_DTYPE_F16 = 1,
    LLMT_DTYPE_BF16 = 2,
    LLMT_DTYPE_I32 = 3
} llmt_dtype;

/* Bytes of one element of dtype, or 0 for an unknown dtype. */
LLMT_API size_t llmt_dtype_size(int dtype);

/* Name of dtype as in safetensors ("F32", "F16", "BF16", "I32"), or "?". */
LLMT_API const char *llmt_dtype_name(int dtype);

/* LLMT_VERSION_NUMBER of the library at run time, to compare with the header. */
LLMT_API uint32_t llmt_version_number(void);

/* LLMT_VERSION_STRING of the library at run time. */
LLMT_API const char *llmt_version_string(void);

#ifdef __cplusplus
}
#endif

#endif
