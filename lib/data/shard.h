/* Token shards (docs/data.md): the validating, read-only mapping used by the
 * loader. The writer is llmt_shard_write (include/llmt/data.h). */
#ifndef LLMT_DATA_SHARD_H
#define LLMT_DATA_SHARD_H

#include <stdint.h>
#include <stddef.h>

/* A shard mapped read-only, its header checked. */
typedef struct llmt_shard_map {
    const unsigned char *map; /* the whole file */
    uint64_t file_bytes;
    uint64_t n_tokens;
    uint64_t data_offset;     /* where token 0 starts: 1024, or 0 for a header-less file */
    int32_t version;          /* 1 or 2 (1 for a header-less file) */
    int32_t token_bytes;      /* 2 or 4 */
} llmt_shard_map;

/* The name suffix of a header-less file (nanoGPT's train.bin): an array of
 * little-endian uint16 tokens and nothing else. Only the name decides, so a
 * damaged llm.c shard (*.bin) is never read as one. */
#define LLMT_SHARD_HEADERLESS_SUFFIX ".u16"

/* Opens and maps path and validates it: magic, version, a size of exactly
 * 1024 + N * token_bytes (for a *.u16 file: an even size, and not an llm.c
 * shard under that name), at least min_tokens tokens, and every token below
 * vocab_size. On failure *s is left empty (nothing to close) and the message
 * names path: LLMT_EIO (open, stat, mmap), LLMT_ECORRUPT (magic, size,
 * count, a token out of range with its position and byte offset),
 * LLMT_EVERSION (an unknown format version), LLMT_EINVAL (fewer than
 * min_tokens tokens). */
int llmt_shard_map_open(llmt_shard_map *s, const char *path, uint64_t min_tokens,
                        int32_t vocab_size);

/* Unmaps a shard; an empty one is accepted. */
void llmt_shard_map_close(llmt_shard_map *s);

/* Token number i of a mapped shard (i < n_tokens). */
static inline uint32_t llmt_shard_token(const llmt_shard_map *s, uint64_t i)
{
    const unsigned char *p = s->map + s->data_offset;
    if (s->token_bytes == 2) {
        p += 2 * i;
        return (uint32_t)p[0] | (uint32_t)p[1] << 8;
    }
    p += 4 * i;
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

#endif
