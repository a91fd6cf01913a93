/* Accounted device buffers: every tensor the library allocates is one. */
#ifndef LLMT_CORE_BUFFER_H
#define LLMT_CORE_BUFFER_H

#include <stddef.h>

#include "llmt/context.h"

typedef struct llmt_buf {
    void *ptr;    /* device memory; NULL when bytes is 0 */
    size_t bytes; /* size as accounted */
    int category; /* llmt_mem_category */
} llmt_buf;

/* Allocates bytes of device memory in category, charged to ctx. Refuses with
 * LLMT_ENOMEM when the budget would be passed; `what` names the buffer in the
 * message. A zero-byte request succeeds with ptr NULL. */
int llmt_buf_alloc(llmt_context *ctx, llmt_buf *b, int category, size_t bytes, const char *what);

/* Releases b (a zero buffer is accepted) and leaves it zeroed. */
void llmt_buf_free(llmt_context *ctx, llmt_buf *b);

#endif
