/* The byte-level tokenizer: bytes are tokens 0..255, LLMT_TOKEN_EOT is 256. */
#include <inttypes.h>

#include "llmt/data.h"
#include "core/error.h"

int llmt_byte_encode(const void *bytes, size_t n, int32_t *tokens, size_t capacity,
                     size_t *n_tokens)
{
    if (!n_tokens)
        return llmt_fail(LLMT_EINVAL, "llmt_byte_encode: n_tokens is NULL");
    if (!bytes && n)
        return llmt_fail(LLMT_EINVAL, "llmt_byte_encode: bytes is NULL with n = %zu", n);
    *n_tokens = n;
    if (capacity == 0)
        return LLMT_OK;
    if (!tokens)
        return llmt_fail(LLMT_EINVAL, "llmt_byte_encode: tokens is NULL with capacity = %zu",
                         capacity);
    if (capacity < n)
        return llmt_fail(LLMT_EINVAL,
                         "llmt_byte_encode: capacity = %zu tokens, but %zu bytes need %zu",
                         capacity, n, n);
    const unsigned char *b = bytes;
    for (size_t i = 0; i < n; i++)
        tokens[i] = b[i];
    return LLMT_OK;
}

int llmt_byte_decode(const int32_t *tokens, size_t n, void *bytes, size_t capacity,
                     size_t *n_bytes)
{
    if (!n_bytes)
        return llmt_fail(LLMT_EINVAL, "llmt_byte_decode: n_bytes is NULL");
    if (!tokens && n)
        return llmt_fail(LLMT_EINVAL, "llmt_byte_decode: tokens is NULL with n = %zu", n);
    size_t need = 0;
    for (size_t i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] > LLMT_TOKEN_EOT)
            return llmt_fail(LLMT_EINVAL,
                             "llmt_byte_decode: tokens[%zu] = %" PRId32
                             " is not a byte token (0..255, or %d for EOT)",
                             i, tokens[i], LLMT_TOKEN_EOT);
        need += tokens[i] != LLMT_TOKEN_EOT;
    }
    *n_bytes = need;
    if (capacity == 0)
        return LLMT_OK;
    if (!bytes)
        return llmt_fail(LLMT_EINVAL, "llmt_byte_decode: bytes is NULL with capacity = %zu",
                         capacity);
    if (capacity < need)
        return llmt_fail(LLMT_EINVAL,
                         "llmt_byte_decode: capacity = %zu bytes, but the tokens decode to %zu",
                         capacity, need);
    unsigned char *out = bytes;
    size_t o = 0;
    for (size_t i = 0; i < n; i++)
        if (tokens[i] != LLMT_TOKEN_EOT)
            out[o++] = (unsigned char)tokens[i];
    return LLMT_OK;
}
