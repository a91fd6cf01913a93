/* Training data: token shards on disk, a byte-level tokenizer, and
 * llmt_loader, which cuts shards into windows of seq_len + 1 tokens and
 * serves them in batches, shuffled per epoch, from a position that is read
 * and restored exactly (docs/data.md has the file format and the shuffle).
 *
 * Shard file (the llm.c layout): 256 little-endian int32 (magic
 * LLMT_SHARD_MAGIC, version, token count N, then zeros), then N tokens:
 * version 1 uint16 (llm.c), version 2 uint32. The file is exactly
 * 1024 + N * token_bytes long.
 *
 * Threads: a loader is used by one thread at a time; the tokenizer and the
 * shard writer keep no state. */
#ifndef LLMT_DATA_H
#define LLMT_DATA_H

#include "llmt/common.h"
#include "llmt/context.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Shard files ---- */

#define LLMT_SHARD_MAGIC 20240520
#define LLMT_SHARD_HEADER_BYTES 1024
#define LLMT_SHARD_VERSION_U16 1 /* uint16 tokens, as llm.c writes them */
#define LLMT_SHARD_VERSION_U32 2 /* uint32 tokens, for vocabularies over 65536 */

/* Writes tokens[0..n) as a shard of the given version (1 or 2) at path,
 * atomically: a temporary file in the same directory is written, fsynced and
 * renamed over path, then the directory is fsynced, so path holds either its
 * old content or the whole new shard. Errors: LLMT_EINVAL (NULL path, NULL
 * tokens with n > 0, n over INT32_MAX, an unknown version, or a token that
 * does not fit the version's width, naming its position; nothing is written
 * then), LLMT_EIO (naming the file and the system's reason). */
LLMT_API int llmt_shard_write(const char *path, const int32_t *tokens, size_t n,
                              int32_t version);

/* ---- Byte-level tokenizer ---- */

/* Bytes 0..255 are the tokens 0..255; LLMT_TOKEN_EOT ends a document. */
#define LLMT_BYTE_VOCAB 257
#define LLMT_TOKEN_EOT 256

/* Encodes n bytes into one token each (no EOT is added). capacity is the
 * room in tokens; capacity 0 asks for the size: *n_tokens receives the number
 * of tokens needed (n) and nothing is written (tokens may then be NULL).
 * Otherwise *n_tokens receives the number written. Errors: LLMT_EINVAL (NULL
 * bytes with n > 0, NULL n_tokens, NULL tokens with capacity > 0, or capacity
 * below n; *n_tokens then holds the size needed). */
LLMT_API int llmt_byte_encode(const void *bytes, size_t n, int32_t *tokens, size_t capacity,
                              size_t *n_tokens);

/* Decodes n tokens into bytes: a token below 256 is that byte, LLMT_TOKEN_EOT
 * decodes to nothing (so decoding an encoded document gives it back exactly;
 * split at EOT before decoding to keep document boundaries). capacity 0 asks
 * for the size: *n_bytes receives the number of bytes needed (the tokens
 * other than EOT); otherwise *n_bytes receives the number written. Errors:
 * LLMT_EINVAL (a token outside 0..256, naming its position and value, even in
 * a size query; NULL arguments; capacity below the size needed, *n_bytes then
 * holding it). */
LLMT_API int llmt_byte_decode(const int32_t *tokens, size_t n, void *bytes, size_t capacity,
                              size_t *n_bytes);

/* ---- Loader ---- */

typedef struct llmt_loader llmt_loader;

#define LLMT_TOKENIZE_REPORT_VERSION 1

/* What llmt_byte_tokenize_files wrote. */
typedef struct llmt_tokenize_report {
    uint32_t version;        /* set by the caller: LLMT_TOKENIZE_REPORT_VERSION */
    uint64_t files, bytes;   /* inputs read */
    uint64_t train_tokens, val_tokens;
    uint32_t train_shards, val_shards;
} llmt_tokenize_report;

#define LLMT_TOKENIZE_REPORT_INIT {LLMT_TOKENIZE_REPORT_VERSION, 0, 0, 0, 0, 0, 0}

/* Encodes text files with the byte tokenizer, each file a document followed
 * by EOT, and writes the stream as version-1 shards of at most shard_tokens
 * tokens: out_dir/<prefix>_train_NNNNNN.bin, and the last val_fraction
 * (ceil, EOTs counted) as out_dir/<prefix>_val_NNNNNN.bin. out_dir is
 * created if missing (one level). report may be NULL. Errors: LLMT_EINVAL,
 * LLMT_EIO naming the file (unreadable, or changed while read). */
LLMT_API int llmt_byte_tokenize_files(const char *const *paths, size_t n, const char *out_dir, const char *prefix, uint64_t shard_tokens, double val_fraction, llmt_tokenize_report *report);

#define LLMT_LOADER_CONFIG_VERSION 1

typedef struct llmt_loader_config {
    uint32_t version;    /* LLMT_LOADER_CONFIG_VERSION */
    int32_t batch_size;  /* B, windows per batch, >= 1: 8 */
    int32_t seq_len;     /* T, tokens per window's inputs, >= 1, B * T <= INT32_MAX: 256 */
    int32_t vocab_size;  /* every token must be below it; required (0 is refused) */
    int32_t shuffle;     /* 1: shard and window order drawn anew each epoch; 0: in order */
} llmt_loader_config;

#define LLMT_LOADER_CONFIG_INIT {LLMT_LOADER_CONFIG_VERSION, 8, 256, 0, 1}

/* Fills cfg with the defaults of LLMT_LOADER_CONFIG_INIT. */
LLMT_API void llmt_loader_config_init(llmt_loader_config *cfg);

/* Opens a loader over n_paths shard files, taken in the given order. cfg is
 * required (NULL is refused: vocab_size has no default). Every
 * shard is validated before this returns (header, size, every token below
 * vocab_size, at least seq_len + 1 tokens) and mapped read-only; the files
 * must not change while the loader is open. ctx is read only for its seed
 * (the data stream LLMT_STREAM_DATA of that seed shuffles) and is not kept;
 * the loader allocates host memory only. The loader is the caller's; release
 * it with llmt_loader_free. The position starts at epoch 0, window 0.
 * Errors: LLMT_EINVAL (NULL argument, no path, a config field out of range,
 * naming it), LLMT_EVERSION (cfg->version, or a shard's format version, naming
 * the file), LLMT_EIO (a file cannot be opened or read, naming it and the
 * reason), LLMT_ECORRUPT (a shard's magic, size, token count or a token out
 * of range, naming the file and the byte offset or token position),
 * LLMT_ENOMEM. */
LLMT_API int llmt_loader_open(llmt_loader **out, llmt_context *ctx, const char *const *paths,
                              size_t n_paths, const llmt_loader_config *cfg);

/* Like llmt_loader_open over the files matching a glob(3) pattern, sorted by
 * byte-wise name (cfg required likewise). Errors: those of llmt_loader_open; LLMT_EINVAL when nothing
 * matches, naming the pattern; LLMT_EIO when a directory cannot be read. */
LLMT_API int llmt_loader_open_glob(llmt_loader **out, llmt_context *ctx, const char *pattern,
                                   const llmt_loader_config *cfg);

/* Releases a loader and unmaps its shards; NULL is accepted. */
LLMT_API void llmt_loader_free(llmt_loader *loader);

/* Fills tokens and targets (caller buffers of count = B * T int32 each) with
 * the next B windows, row b holding window w's tokens w[0..T) and targets
 * w[1..T], crossing shard and epoch boundaries, and advances the position by
 * B windows. Errors: LLMT_EINVAL (NULL buffer, count other than B * T; the
 * position does not move), LLMT_ESTATE (the shuffle's random offsets for
 * this epoch are exhausted, see docs/data.md; the position does not move). */
LLMT_API int llmt_loader_next(llmt_loader *loader, int32_t *tokens, int32_t *targets,
                              size_t count);

#define LLMT_LOADER_STATE_VERSION 1

/* The loader's position: what llmt_loader_get_state reads and
 * llmt_loader_set_state restores. */
typedef struct llmt_loader_state {
    uint32_t version;          /* set by the caller: LLMT_LOADER_STATE_VERSION */
    uint64_t epoch;            /* the current epoch, from 0 */
    uint64_t shard_cursor;     /* index into the epoch's shard order */
    uint64_t window_cursor;    /* index into that shard's window order */
    uint64_t windows_consumed; /* windows served since epoch 0, window 0 */
    uint64_t seed;             /* seed of the shuffle's random stream */
    uint64_t fingerprint;      /* XXH3-64 of the shards' names, sizes and first bytes,
                                  seq_len and shuffle (docs/data.md) */
} llmt_loader_state;

#define LLMT_LOADER_STATE_INIT {LLMT_LOADER_STATE_VERSION, 0, 0, 0, 0, 0, 0}

/* Reads the position into *out, whose version the caller has set. The next
 * window served is the window_cursor-th of the shard_cursor-th shard of the
 * epoch (both always in range: a finished shard or epoch moves the cursors
 * on at once). Errors: LLMT_EINVAL (NULL), LLMT_EVERSION. */
LLMT_API int llmt_loader_get_state(const llmt_loader *loader, llmt_loader_state *out);

/* Restores a position read by llmt_loader_get_state, from this loader or
 * another one over the same files (the same names in the same order, sizes
 * and first 4096 bytes; their directories may differ: a run moved still
 * resumes), seq_len and shuffle flag; the batch size may differ. A state
 * saved by an earlier version (its fingerprint over the paths as given) is
 * accepted too, over the same paths spelled as then. The loader
 * adopts state->seed, so the stream continues exactly as it would have.
 * Errors: LLMT_EINVAL (NULL; a fingerprint that does not match, i.e. other
 * data, seq_len or shuffle flag; cursors out of range or windows_consumed not
 * matching them; the loader keeps its position then), LLMT_EVERSION. */
LLMT_API int llmt_loader_set_state(llmt_loader *loader, const llmt_loader_state *state);

/* The getters below write the value to *out and return LLMT_OK, or
 * LLMT_EINVAL for a NULL loader or out (then *out is not written). */

/* The current epoch (from 0). */
LLMT_API int llmt_loader_epoch(const llmt_loader *loader, uint64_t *out);

/* Windows in one epoch: the sum over shards of floor((N - 1) / T). */
LLMT_API int llmt_loader_windows_per_epoch(const llmt_loader *loader, uint64_t *out);

/* Input tokens served in one epoch, windows_per_epoch * T (each window also
 * gives T targets). */
LLMT_API int llmt_loader_tokens_per_epoch(const llmt_loader *loader, uint64_t *out);

/* The number of shards. */
LLMT_API int llmt_loader_num_shards(const llmt_loader *loader, uint64_t *out);

#ifdef __cplusplus
}
#endif

#endif
