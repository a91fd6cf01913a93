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

/* Whether buffers of category live in host memory (ops->host_alloc, pinned
 * on CUDA, where the backend has it): STAGING and HOST_STATE. */
static inline int llmt_buf_is_host(int category)
{
    return category == LLMT_MEM_STAGING || category == LLMT_MEM_HOST_STATE;
}

/* Allocates bytes of device memory in category (host memory for
 * llmt_buf_is_host categories), charged to ctx. Refuses with LLMT_ENOMEM
 * when the budget (the host budget for HOST_STATE) would be passed; `what`
 * names the buffer in the message. A zero-byte request succeeds with ptr NULL. */
int llmt_buf_alloc(llmt_context *ctx, llmt_buf *b, int category, size_t bytes, const char *what);

/* Releases b (a zero buffer is accepted) and leaves it zeroed. */
void llmt_buf_free(llmt_context *ctx, llmt_buf *b);

#endif
