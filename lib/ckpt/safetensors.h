/* Reading and writing safetensors files (internal).
 *
 * Layout: 8 bytes little-endian N, N bytes of UTF-8 JSON header, then the data
 * region. The header is an object: an optional "__metadata__" object of
 * string values, and per tensor name {"dtype", "shape", "data_offsets":
 * [begin, end]} with offsets relative to the data region, which the tensors
 * must cover exactly.
 *
 * Supported dtypes are those of llmt_dtype (F32, F16, BF16, I32). The reader
 * refuses other dtype names with LLMT_EUNSUPPORTED (the file may be valid,
 * this library cannot use it); everything else wrong with a file is
 * LLMT_ECORRUPT, an I/O failure LLMT_EIO, a bad argument LLMT_EINVAL. Every
 * message starts with the file's path and names the tensor where one is
 * concerned. */
#ifndef LLMT_CKPT_SAFETENSORS_H
#define LLMT_CKPT_SAFETENSORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define LLMT_ST_MAX_NDIM 8

/* Produces bytes [byte_offset, byte_offset + bytes) of tensor tensor_index
 * (its index in the array given to llmt_st_write) into dst. Returns LLMT_OK,
 * or a negative LLMT_E* status that aborts the write and is returned by it;
 * a message the callback set with llmt_fail is kept, prefixed with the file
 * and the tensor. */
typedef int (*llmt_st_fill_fn)(void *user, size_t tensor_index, size_t byte_offset, void *dst,
                               size_t bytes);

/* One tensor to write. */
typedef struct llmt_st_write_tensor {
    const char *name; /* non-empty, valid UTF-8, not "__metadata__", unique */
    int dtype;        /* llmt_dtype */
    int ndim;         /* 0..LLMT_ST_MAX_NDIM */
    uint64_t shape[LLMT_ST_MAX_NDIM];
    llmt_st_fill_fn fill; /* called for consecutive ranges, never for 0 bytes */
    void *user;           /* passed to fill */
    const void *data;     /* or the bytes in host memory, written directly (fill unused) */
} llmt_st_write_tensor;

/* One "__metadata__" entry: UTF-8 strings, keys unique. */
typedef struct llmt_st_meta {
    const char *key;
    const char *value;
} llmt_st_meta;

typedef struct llmt_st_write_opts {
    bool durable;       /* fsync the file before the rename and its directory after */
    size_t chunk_bytes; /* staging buffer for the data; 0 means 8 MiB */
    uint64_t hash_chunk_bytes; /* > 0: also hash each run of this many bytes of the
                                  file (the last may be shorter), as they are written */
} llmt_st_write_opts;

#define LLMT_ST_WRITE_OPTS_INIT {true, 0, 0}

typedef struct llmt_st_write_result {
    uint64_t file_bytes; /* size of the file written */
    uint64_t xxh3;       /* XXH3-64 (seed 0) of all its bytes, header included */
    uint64_t *chunks;    /* with hash_chunk_bytes: the XXH3-64 of each run, in file order
                            (malloc'd: the caller frees it); else NULL */
    size_t n_chunks;
} llmt_st_write_result;

/* Writes n tensors, laid out in the order given, and n_meta metadata entries
 * (omitted from the header when n_meta is 0) to path, atomically: the bytes
 * go to "<path>.tmp-XXXXXX" in the same directory, which is renamed over path
 * once complete. On failure the temporary file is removed and a file already
 * at path is untouched. The data streams through one buffer of
 * opts->chunk_bytes, filled by the tensors' callbacks, so memory use does not
 * depend on the tensors' sizes. The header is compact JSON in the order
 * given, padded with spaces so that 8 + N is a multiple of 8. The file gets
 * mode 0644. opts may be NULL (LLMT_ST_WRITE_OPTS_INIT); result may be NULL. */
int llmt_st_write(const char *path, const llmt_st_write_tensor *tensors, size_t n,
                  const llmt_st_meta *meta, size_t n_meta, const llmt_st_write_opts *opts,
                  llmt_st_write_result *result);

/* What llmt_st_open accepts. */
typedef struct llmt_st_limits {
    /* N; 0 means 100 MiB (the reference reader's bound). Parsing is also
     * bounded to 4 Mi JSON values, so even an adversarial header costs at
     * most a few hundred MiB; a real one, a few bytes per header byte. */
    uint64_t max_header_bytes;
} llmt_st_limits;

#define LLMT_ST_DEFAULT_MAX_HEADER_BYTES (UINT64_C(100) << 20)

/* A tensor of an open file. */
typedef struct llmt_st_tensor {
    const char *name; /* non-empty, without NUL bytes */
    int dtype;        /* llmt_dtype */
    int ndim;
    uint64_t shape[LLMT_ST_MAX_NDIM]; /* ndim entries, the rest 0 */
    uint64_t begin, end;              /* byte range in the data region */
    uint64_t file_offset;             /* absolute offset of begin in the file */
} llmt_st_tensor;

typedef struct llmt_st_file llmt_st_file;

/* Opens and validates path; *out is NULL on failure. Besides the JSON rules of
 * util/json.h, refused are: a file under 8 bytes; N over the limit or past
 * the end; a header not an object; "__metadata__" not an object of strings;
 * a tensor entry not exactly {dtype, shape, data_offsets}; a dtype not a
 * string (or unsupported); a shape not 0..8 non-negative integers;
 * data_offsets not two integers begin <= end; end - begin not the shape's
 * byte size; tensors that, sorted by offsets, overlap or leave a gap from 0;
 * a file longer or shorter than 8 + N + the data; names empty, repeated or
 * containing NUL bytes (as are metadata keys and values). limits may be NULL. */
int llmt_st_open(const char *path, const llmt_st_limits *limits, llmt_st_file **out);

/* Closes f; accepts NULL. */
void llmt_st_close(llmt_st_file *f);

/* Number of tensors of f. */
size_t llmt_st_count(const llmt_st_file *f);

/* Tensor i in header order, or NULL when i is out of range. */
const llmt_st_tensor *llmt_st_tensor_at(const llmt_st_file *f, size_t i);

/* Index of the tensor called name into *index; LLMT_ENOTFOUND when absent. */
int llmt_st_find(const llmt_st_file *f, const char *name, size_t *index);

/* Number of "__metadata__" entries. */
size_t llmt_st_meta_count(const llmt_st_file *f);

/* Key of metadata entry i in header order, its value into *value; NULL when
 * i is out of range. */
const char *llmt_st_meta_at(const llmt_st_file *f, size_t i, const char **value);

/* Value of metadata key, or NULL when absent. */
const char *llmt_st_meta_get(const llmt_st_file *f, const char *key);

/* Reads bytes [byte_offset, byte_offset + bytes) of tensor tensor_index into
 * dst; a range beyond the tensor is refused with LLMT_EINVAL. Uses pread
 * only, so threads may read one open file at once. */
int llmt_st_read(llmt_st_file *f, size_t tensor_index, size_t byte_offset, void *dst,
                 size_t bytes);

#endif
