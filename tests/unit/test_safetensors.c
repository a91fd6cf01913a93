/* safetensors: files built byte by byte and decoded by the reader; files
 * written by the writer and decoded by hand; the checksum; one test per
 * refusal (each naming the file and the tensor); atomic replacement when a
 * write fails; tensors larger than the staging buffer. */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "test_util.h"

#include "llmt/common.h"
#include "ckpt/safetensors.h"
#include "core/error.h"
#include "util/fsutil.h"

static char dir[64]; /* made by setup, removed by teardown */

static const char *path_of(const char *name)
{
    static char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return path;
}

static void write_bytes(const char *path, const void *bytes, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(bytes, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

/* The whole file at path into a malloc'd buffer, its size into *n. */
static unsigned char *read_bytes(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    long size = ftell(f);
    assert_true(size >= 0);
    rewind(f);
    unsigned char *buf = malloc((size_t)size + 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)size, f), (size_t)size);
    fclose(f);
    *n = (size_t)size;
    return buf;
}

/* Writes a safetensors file by hand: 8-byte little-endian length of header,
 * header, then data. */
static void make_file(const char *path, const char *header, const void *data, size_t data_len)
{
    size_t n = strlen(header);
    unsigned char *buf = malloc(8 + n + data_len + 1);
    assert_non_null(buf);
    for (int i = 0; i < 8; i++)
        buf[i] = (unsigned char)((uint64_t)n >> (8 * i));
    memcpy(buf + 8, header, n);
    if (data_len)
        memcpy(buf + 8 + n, data, data_len);
    write_bytes(path, buf, 8 + n + data_len);
    free(buf);
}

/* Number of entries in directory d other than . and .. */
static int count_entries(const char *d)
{
    DIR *h = opendir(d);
    assert_non_null(h);
    int n = 0;
    for (struct dirent *e; (e = readdir(h));)
        n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(h);
    return n;
}

static int setup(void **state)
{
    (void)state;
    strcpy(dir, "/tmp/llmt-st-XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    llmt_remove_tree(dir);
    return 0;
}

/* ---- Reading files built by hand ---- */

/* Five tensors in header order w, idx, h, s, z; data in order w, h, idx, s. */
static const char hand_header[] =
    "{\"__metadata__\":{\"format\":\"pt\",\"note\":\"\xC3\xA9\"},"
    "\"w\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]},"
    "\"idx\":{\"dtype\":\"I32\",\"shape\":[3],\"data_offsets\":[22,34]},"
    "\"h\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[16,22]},"
    "\"s\":{\"dtype\":\"F16\",\"shape\":[],\"data_offsets\":[34,36]},"
    "\"z\":{\"dtype\":\"F32\",\"shape\":[0,3],\"data_offsets\":[36,36]}}";

static const unsigned char hand_data[36] = {
    0x00, 0x00, 0x80, 0x3F, 0x00, 0x00, 0x00, 0xC0, /* w: 1.0f, -2.0f */
    0x00, 0x00, 0x00, 0x3F, 0x00, 0x00, 0x40, 0x40, /*    0.5f, 3.0f */
    0x80, 0x3F, 0x80, 0xBF, 0x00, 0x40,             /* h: bf16 1.0, -1.0, 2.0 */
    0x01, 0x00, 0x00, 0x00, 0xFF, 0xFF, 0xFF, 0xFF, /* idx: 1, -1 */
    0x78, 0x56, 0x34, 0x12,                         /*      0x12345678 */
    0x00, 0x3C,                                     /* s: f16 1.0 */
};

static void test_read_hand_built(void **state)
{
    (void)state;
    const char *path = path_of("hand.safetensors");
    make_file(path, hand_header, hand_data, sizeof hand_data);
    llmt_st_file *f = NULL;
    assert_int_equal(llmt_st_open(path, NULL, &f), LLMT_OK);
    assert_int_equal(llmt_st_count(f), 5);

    const uint64_t data_start = 8 + strlen(hand_header);
    static const struct {
        const char *name;
        int dtype, ndim;
        uint64_t shape[2], begin, end;
    } expect[] = {
        {"w", LLMT_DTYPE_F32, 2, {2, 2}, 0, 16},   {"idx", LLMT_DTYPE_I32, 1, {3, 0}, 22, 34},
        {"h", LLMT_DTYPE_BF16, 1, {3, 0}, 16, 22}, {"s", LLMT_DTYPE_F16, 0, {0, 0}, 34, 36},
        {"z", LLMT_DTYPE_F32, 2, {0, 3}, 36, 36},
    };
    for (size_t i = 0; i < 5; i++) {
        const llmt_st_tensor *t = llmt_st_tensor_at(f, i);
        assert_non_null(t);
        assert_string_equal(t->name, expect[i].name);
        assert_int_equal(t->dtype, expect[i].dtype);
        assert_int_equal(t->ndim, expect[i].ndim);
        for (int d = 0; d < t->ndim; d++)
            assert_int_equal(t->shape[d], expect[i].shape[d]);
        assert_int_equal(t->begin, expect[i].begin);
        assert_int_equal(t->end, expect[i].end);
        assert_int_equal(t->file_offset, data_start + expect[i].begin);
        size_t index = 99;
        assert_int_equal(llmt_st_find(f, expect[i].name, &index), LLMT_OK);
        assert_int_equal(index, i);
        unsigned char buf[16];
        size_t bytes = (size_t)(expect[i].end - expect[i].begin);
        assert_int_equal(llmt_st_read(f, i, 0, buf, bytes), LLMT_OK);
        assert_memory_equal(buf, hand_data + expect[i].begin, bytes);
    }
    assert_null(llmt_st_tensor_at(f, 5));

    /* The F32 values themselves (the test host is little-endian). */
    float w[4];
    assert_int_equal(llmt_st_read(f, 0, 0, w, sizeof w), LLMT_OK);
    assert_true(w[0] == 1.0f && w[1] == -2.0f && w[2] == 0.5f && w[3] == 3.0f);
    int32_t idx[3];
    assert_int_equal(llmt_st_read(f, 1, 0, idx, sizeof idx), LLMT_OK);
    assert_true(idx[0] == 1 && idx[1] == -1 && idx[2] == 0x12345678);

    /* Part of a tensor; reads beyond it are refused. */
    unsigned char part[8];
    static const unsigned char w_4_12[8] = {0x00, 0x00, 0x00, 0xC0, 0x00, 0x00, 0x00, 0x3F};
    assert_int_equal(llmt_st_read(f, 0, 4, part, 8), LLMT_OK);
    assert_memory_equal(part, w_4_12, 8);
    assert_int_equal(llmt_st_read(f, 0, 16, part, 0), LLMT_OK);
    assert_int_equal(llmt_st_read(f, 0, 12, part, 8), LLMT_EINVAL);
    assert_contains(llmt_error_last(), path);
    assert_contains(llmt_error_last(), "tensor \"w\": reading 8 bytes at byte 12 goes beyond");
    assert_int_equal(llmt_st_read(f, 0, 17, part, 0), LLMT_EINVAL);
    assert_int_equal(llmt_st_read(f, 0, SIZE_MAX, part, 2), LLMT_EINVAL);
    assert_int_equal(llmt_st_read(f, 0, 2, part, SIZE_MAX), LLMT_EINVAL);
    assert_int_equal(llmt_st_read(f, 5, 0, part, 1), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "tensor index 5 out of range");
    assert_int_equal(llmt_st_read(f, 4, 0, NULL, 0), LLMT_OK); /* z is empty */

    size_t index;
    assert_int_equal(llmt_st_find(f, "nope", &index), LLMT_ENOTFOUND);
    assert_contains(llmt_error_last(), path);
    assert_contains(llmt_error_last(), "no tensor \"nope\"");

    assert_int_equal(llmt_st_meta_count(f), 2);
    const char *value = NULL;
    assert_string_equal(llmt_st_meta_at(f, 0, &value), "format");
    assert_string_equal(value, "pt");
    assert_string_equal(llmt_st_meta_at(f, 1, &value), "note");
    assert_string_equal(value, "\xC3\xA9");
    assert_null(llmt_st_meta_at(f, 2, &value));
    assert_string_equal(llmt_st_meta_get(f, "format"), "pt");
    assert_null(llmt_st_meta_get(f, "missing"));
    llmt_st_close(f);
    llmt_st_close(NULL);
}

static void test_read_minimal_and_arguments(void **state)
{
    (void)state;
    /* No tensors and no metadata; the header may carry padding spaces. */
    const char *path = path_of("empty.safetensors");
    make_file(path, "{}      ", NULL, 0);
    llmt_st_file *f = NULL;
    assert_int_equal(llmt_st_open(path, NULL, &f), LLMT_OK);
    assert_int_equal(llmt_st_count(f), 0);
    assert_int_equal(llmt_st_meta_count(f), 0);
    assert_null(llmt_st_meta_get(f, "x"));
    size_t index;
    assert_int_equal(llmt_st_find(f, "x", &index), LLMT_ENOTFOUND);
    llmt_st_close(f);

    f = (llmt_st_file *)&f;
    assert_int_equal(llmt_st_open(path_of("absent"), NULL, &f), LLMT_EIO);
    assert_null(f);
    assert_contains(llmt_error_last(), path_of("absent"));
    assert_contains(llmt_error_last(), "No such file");
    assert_int_equal(llmt_st_open(dir, NULL, &f), LLMT_EIO);
    assert_contains(llmt_error_last(), "not a regular file");
    assert_int_equal(llmt_st_open(NULL, NULL, &f), LLMT_EINVAL);
    assert_int_equal(llmt_st_open(path, NULL, NULL), LLMT_EINVAL);
    assert_int_equal(llmt_st_read(NULL, 0, 0, NULL, 0), LLMT_EINVAL);
}

/* ---- Refusals: one test each, all through run_refusal ---- */

typedef struct refusal {
    const char *name;     /* the test's and the file's name */
    const char *header;   /* the header, followed by data_len bytes of data */
    size_t data_len;
    const char *raw;      /* or, when set, the whole file: raw_len bytes */
    size_t raw_len;
    uint64_t max_header;  /* llmt_st_limits.max_header_bytes; 0 for the default */
    int status;
    const char *needles[3]; /* what the message must say besides the path */
} refusal;

#define T1_F32(name, shape, offsets)                                                         \
    "\"" name "\":{\"dtype\":\"F32\",\"shape\":" shape ",\"data_offsets\":" offsets "}"

static refusal refusals[] = {
    {"short_file", NULL, 0, "\x02\x00\x00", 3, 0, LLMT_ECORRUPT, {"3 bytes, too short"}},
    {"header_length_past_end", NULL, 0, "\x00\x01\x00\x00\x00\x00\x00\x00{}", 10, 0,
     LLMT_ECORRUPT, {"header length 256 runs past the end of the file (10 bytes)"}},
    {"header_length_huge", NULL, 0, "\xff\xff\xff\xff\xff\xff\xff\xff{}", 10, 0, LLMT_ECORRUPT,
     {"header length 18446744073709551615 is over the limit"}},
    {"header_over_limit", "{" T1_F32("a", "[1]", "[0,4]") "}", 4, NULL, 0, 16, LLMT_ECORRUPT,
     {"header length 54 is over the limit of 16 bytes"}},
    {"invalid_json", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],}}", 4, NULL,
     0, 0, LLMT_ECORRUPT, {"header: JSON at byte 52: trailing comma"}},
    {"invalid_utf8", "{\"\xff\":{}}", 0, NULL, 0, 0, LLMT_ECORRUPT,
     {"JSON at byte 2: invalid UTF-8"}},
    {"empty_header", "", 0, NULL, 0, 0, LLMT_ECORRUPT, {"JSON at byte 0: no value"}},
    {"not_an_object", "[1,2]", 0, NULL, 0, 0, LLMT_ECORRUPT, {"header is not a JSON object"}},
    {"too_deep", "{\"a\":{\"dtype\":\"F32\",\"shape\":[[1]],\"data_offsets\":[0,4]}}", 4, NULL, 0,
     0, LLMT_ECORRUPT, {"nesting deeper than 3"}},
    {"entry_not_object", "{\"a\":[0,4]}", 4, NULL, 0, 0, LLMT_ECORRUPT,
     {"tensor \"a\": entry is not an object"}},
    {"missing_key", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}", 0, NULL, 0, 0, LLMT_ECORRUPT,
     {"tensor \"w\": missing \"data_offsets\""}},
    {"extra_key", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"align\":8}}",
     4, NULL, 0, 0, LLMT_ECORRUPT, {"tensor \"w\": unknown key \"align\""}},
    {"unknown_dtype", "{\"w\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8, NULL,
     0, 0, LLMT_EUNSUPPORTED, {"tensor \"w\": dtype \"F64\" is not supported"}},
    {"lowercase_dtype", "{\"w\":{\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, NULL,
     0, 0, LLMT_EUNSUPPORTED, {"tensor \"w\": dtype \"f32\""}},
    {"dtype_not_string", "{\"w\":{\"dtype\":0,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, NULL, 0,
     0, LLMT_ECORRUPT, {"tensor \"w\": dtype is not a string"}},
    {"negative_shape", "{" T1_F32("w", "[2,-1]", "[0,4]") "}", 4, NULL, 0, 0, LLMT_ECORRUPT,
     {"tensor \"w\": shape[1] = -1 is not a non-negative integer"}},
    {"fractional_shape", "{" T1_F32("w", "[2.0]", "[0,8]") "}", 8, NULL, 0, 0, LLMT_ECORRUPT,
     {"tensor \"w\": shape[0] = 2.0 is not a non-negative integer"}},
    {"exponent_shape", "{" T1_F32("w", "[1e0]", "[0,4]") "}", 4, NULL, 0, 0, LLMT_ECORRUPT,
     {"tensor \"w\": shape[0] = 1e0"}},
    {"string_shape", "{" T1_F32("w", "[\"2\"]", "[0,8]") "}", 8, NULL, 0, 0, LLMT_ECORRUPT,
     {"tensor \"w\": shape[0] is not a number"}},
    {"shape_not_array", "{" T1_F32("w", "4", "[0,16]") "}", 16, NULL, 0, 0, LLMT_ECORRUPT,
     {"tensor \"w\": shape is not an array"}},
    {"nine_dims", "{" T1_F32("w", "[1,1,1,1,1,1,1,1,1]", "[0,4]") "}", 4, NULL, 0, 0,
     LLMT_ECORRUPT, {"tensor \"w\": shape is not an array of at most 8 sizes"}},
    {"shape_overflow", "{" T1_F32("w", "[4294967296,4294967296,4294967296]", "[0,0]") "}", 0,
     NULL, 0, 0, LLMT_ECORRUPT,
     {"tensor \"w\": shape [4294967296, 4294967296, 4294967296] of F32 overflows"}},
    {"offsets_mismatch", "{" T1_F32("model.norm.weight", "[4]", "[0,12]") "}", 12, NULL, 0, 0,
     LLMT_ECORRUPT,
     {"tensor \"model.norm.weight\": data_offsets [0, 12] do not match shape [4] of F32 (16 "
      "bytes)"}},
    {"offsets_reversed", "{" T1_F32("w", "[0]", "[8,4]") "}", 8, NULL, 0, 0, LLMT_ECORRUPT,
     {"tensor \"w\": data_offsets [8, 4] end before they begin"}},
    {"offsets_one", "{" T1_F32("w", "[0]", "[0]") "}", 0, NULL, 0, 0, LLMT_ECORRUPT,
     {"tensor \"w\": data_offsets is not an array of two integers"}},
    {"offsets_negative", "{" T1_F32("w", "[1]", "[-4,0]") "}", 4, NULL, 0, 0, LLMT_ECORRUPT,
     {"tensor \"w\": data_offsets[0] = -4"}},
    {"offsets_huge", "{" T1_F32("w", "[1]", "[0,18446744073709551616]") "}", 4, NULL, 0, 0,
     LLMT_ECORRUPT, {"tensor \"w\": data_offsets[1] = 18446744073709551616"}},
    {"overlap", "{" T1_F32("a", "[2]", "[0,8]") "," T1_F32("b", "[2]", "[4,12]") "}", 12, NULL, 0,
     0, LLMT_ECORRUPT, {"tensor \"b\": data_offsets [4, 12] overlap tensor \"a\" [0, 8]"}},
    {"same_range", "{" T1_F32("a", "[1]", "[0,4]") "," T1_F32("b", "[1]", "[0,4]") "}", 4, NULL,
     0, 0, LLMT_ECORRUPT, {"overlap tensor"}},
    {"gap", "{" T1_F32("a", "[1]", "[0,4]") "," T1_F32("b", "[1]", "[8,12]") "}", 12, NULL, 0, 0,
     LLMT_ECORRUPT, {"tensor \"b\": data_offsets [8, 12] leave a gap", "data bytes [4, 8)"}},
    {"not_from_zero", "{" T1_F32("a", "[1]", "[4,8]") "}", 8, NULL, 0, 0, LLMT_ECORRUPT,
     {"tensor \"a\"", "data bytes [0, 4)"}},
    {"truncated", "{" T1_F32("a", "[1]", "[0,4]") "," T1_F32("b", "[2]", "[4,12]") "}", 10, NULL,
     0, 0, LLMT_ECORRUPT,
     {"tensor \"b\": data_offsets [4, 12] run past the end of the file", "has 10 bytes"}},
    {"trailing_bytes", "{" T1_F32("a", "[1]", "[0,4]") "}", 6, NULL, 0, 0, LLMT_ECORRUPT,
     {"2 trailing bytes"}},
    {"duplicate_name", "{" T1_F32("a", "[1]", "[0,4]") "," T1_F32("a", "[1]", "[4,8]") "}", 8,
     NULL, 0, 0, LLMT_ECORRUPT, {"duplicate key \"a\""}},
    {"empty_name", "{" T1_F32("", "[1]", "[0,4]") "}", 4, NULL, 0, 0, LLMT_ECORRUPT,
     {"a tensor has an empty name"}},
    {"nul_in_name", "{" T1_F32("a\\u0000b", "[1]", "[0,4]") "}", 4, NULL, 0, 0, LLMT_ECORRUPT,
     {"tensor \"a\\x00b\": name contains a NUL byte"}},
    {"metadata_not_object", "{\"__metadata__\":[\"a\"]}", 0, NULL, 0, 0, LLMT_ECORRUPT,
     {"\"__metadata__\" is not an object"}},
    {"metadata_not_string", "{\"__metadata__\":{\"epoch\":3}}", 0, NULL, 0, 0, LLMT_ECORRUPT,
     {"\"__metadata__\" entry \"epoch\" is not a string"}},
    {"metadata_nul", "{\"__metadata__\":{\"k\":\"a\\u0000\"}}", 0, NULL, 0, 0, LLMT_ECORRUPT,
     {"\"__metadata__\" entry \"k\" contains a NUL byte"}},
};

static void run_refusal(void **state)
{
    const refusal *r = *state;
    const char *path = path_of(r->name);
    if (r->raw) {
        write_bytes(path, r->raw, r->raw_len);
    } else {
        unsigned char data[64];
        assert_true(r->data_len <= sizeof data);
        for (size_t i = 0; i < r->data_len; i++)
            data[i] = (unsigned char)(i * 37 + 1);
        make_file(path, r->header, data, r->data_len);
    }
    llmt_st_limits limits = {r->max_header};
    llmt_st_file *f = (llmt_st_file *)&limits; /* must come back NULL */
    int rc = llmt_st_open(path, &limits, &f);
    if (rc != r->status)
        fail_msg("status %d (%s), expected %d", rc, llmt_error_last(), r->status);
    assert_null(f);
    const char *msg = llmt_error_last();
    assert_true(strncmp(msg, path, strlen(path)) == 0); /* the message starts with the file */
    for (int i = 0; i < 3 && r->needles[i]; i++)
        assert_contains(msg, r->needles[i]);
    unlink(path);
}

/* ---- Writing ---- */

/* A fill callback serving bytes from a test-owned array per tensor. */
static int fill_from(void *user, size_t tensor_index, size_t byte_offset, void *dst, size_t bytes)
{
    const unsigned char *const *arrays = user;
    memcpy(dst, arrays[tensor_index] + byte_offset, bytes);
    return LLMT_OK;
}

static uint64_t get_le64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* Tensors given as host pointers are written as they are: the file is
 * byte-identical to the one written through fill callbacks, chunk sizes
 * notwithstanding. */
static void test_write_from_pointers(void **state)
{
    (void)state;
    static unsigned char big[3 * 4096 + 12];
    for (size_t i = 0; i < sizeof big; i++)
        big[i] = (unsigned char)(i * 7 + 3);
    static const unsigned char small[6] = {1, 2, 3, 4, 5, 6};
    const unsigned char *arrays[3] = {small, big, small};
    llmt_st_write_tensor by_fill[3] = {
        {"s", LLMT_DTYPE_BF16, 1, {3}, fill_from, arrays, NULL},
        {"big", LLMT_DTYPE_F32, 1, {sizeof big / 4}, fill_from, arrays, NULL},
        {"s2", LLMT_DTYPE_F16, 1, {3}, fill_from, arrays, NULL},
    };
    llmt_st_write_tensor by_pointer[3];
    memcpy(by_pointer, by_fill, sizeof by_fill);
    by_pointer[0].fill = NULL, by_pointer[0].data = small;
    by_pointer[1].fill = NULL, by_pointer[1].data = big; /* the middle one only by pointer too */
    by_pointer[2].data = NULL;
    const llmt_st_write_opts opts = {false, 4096, 0};
    llmt_st_write_result r1 = {0, 0, NULL, 0}, r2 = {0, 0, NULL, 0};
    const char *p1 = path_of("fill.safetensors");
    assert_int_equal(llmt_st_write(p1, by_fill, 3, NULL, 0, &opts, &r1), LLMT_OK);
    size_t n1 = 0, n2 = 0;
    unsigned char *f1 = read_bytes(p1, &n1);
    const char *p2 = path_of("pointer.safetensors");
    assert_int_equal(llmt_st_write(p2, by_pointer, 3, NULL, 0, &opts, &r2), LLMT_OK);
    unsigned char *f2 = read_bytes(p2, &n2);
    assert_int_equal(n1, n2);
    assert_memory_equal(f1, f2, n1);
    assert_true(r1.xxh3 == r2.xxh3 && r1.xxh3 == XXH3_64bits(f2, n2));
    free(f1);
    free(f2);
}

static void test_write_layout(void **state)
{
    (void)state;
    static const unsigned char a[8] = {0x00, 0x00, 0xC0, 0x3F, 0x00, 0x00, 0x80, 0xBE};
    static const unsigned char b[6] = {0x10, 0x11, 0x12, 0x13, 0x14, 0x15};
    static const unsigned char c[4] = {0x07, 0x00, 0x00, 0x00};
    const unsigned char *arrays[3] = {a, b, c};
    const llmt_st_write_tensor tensors[3] = {
        {"a", LLMT_DTYPE_F32, 1, {2}, fill_from, arrays, NULL},
        {"b", LLMT_DTYPE_BF16, 2, {1, 3}, fill_from, arrays, NULL},
        {"c", LLMT_DTYPE_I32, 0, {0}, fill_from, arrays, NULL},
    };
    const llmt_st_meta meta[2] = {{"format", "pt"}, {"step", "12"}};
    const char *path = path_of("written.safetensors");
    llmt_st_write_result result = {0, 0, NULL, 0};
    llmt_fail(LLMT_EINVAL, "an earlier failure");
    assert_int_equal(llmt_st_write(path, tensors, 3, meta, 2, NULL, &result), LLMT_OK);
    assert_string_equal(llmt_error_last(), "an earlier failure"); /* a success keeps it */

    static const char expected_header[] =
        "{\"__metadata__\":{\"format\":\"pt\",\"step\":\"12\"},"
        "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
        "\"b\":{\"dtype\":\"BF16\",\"shape\":[1,3],\"data_offsets\":[8,14]},"
        "\"c\":{\"dtype\":\"I32\",\"shape\":[],\"data_offsets\":[14,18]}}";
    const size_t json_len = sizeof expected_header - 1;
    size_t size;
    unsigned char *file = read_bytes(path, &size);
    uint64_t n = get_le64(file);
    assert_int_equal((8 + n) % 8, 0);
    assert_true(n >= json_len && n < json_len + 8);
    assert_memory_equal(file + 8, expected_header, json_len);
    for (uint64_t i = json_len; i < n; i++)
        assert_int_equal(file[8 + i], ' ');
    assert_int_equal(size, 8 + n + 18);
    assert_memory_equal(file + 8 + n, a, 8);
    assert_memory_equal(file + 8 + n + 8, b, 6);
    assert_memory_equal(file + 8 + n + 14, c, 4);
    assert_int_equal(result.file_bytes, size);
    assert_true(result.xxh3 == XXH3_64bits(file, size));
    free(file);

    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0644);

    llmt_st_file *f = NULL;
    assert_int_equal(llmt_st_open(path, NULL, &f), LLMT_OK);
    assert_int_equal(llmt_st_count(f), 3);
    assert_string_equal(llmt_st_meta_get(f, "step"), "12");
    const llmt_st_tensor *tb = llmt_st_tensor_at(f, 1);
    assert_string_equal(tb->name, "b");
    assert_int_equal(tb->dtype, LLMT_DTYPE_BF16);
    assert_int_equal(tb->ndim, 2);
    assert_int_equal(tb->shape[0], 1);
    assert_int_equal(tb->shape[1], 3);
    unsigned char got[6];
    assert_int_equal(llmt_st_read(f, 1, 0, got, 6), LLMT_OK);
    assert_memory_equal(got, b, 6);
    llmt_st_close(f);

    /* No tensors, no metadata: "{}" and six spaces. */
    path = path_of("nothing.safetensors");
    assert_int_equal(llmt_st_write(path, NULL, 0, NULL, 0, NULL, &result), LLMT_OK);
    file = read_bytes(path, &size);
    assert_int_equal(size, 16);
    assert_memory_equal(file, "\x08\0\0\0\0\0\0\0{}      ", 16);
    assert_true(result.xxh3 == XXH3_64bits(file, size));
    free(file);
}

/* Byte i of tensor t in the large-tensor tests: the test's own pattern. */
static unsigned char pattern(size_t t, size_t i)
{
    return (unsigned char)(i * 7 + t * 31 + (i >> 8) + (i >> 16));
}

typedef struct fill_log {
    size_t next[3];      /* the offset each tensor's next call must ask for */
    size_t calls[3];
    size_t max_bytes;    /* the largest range asked for */
} fill_log;

/* Produces the pattern, checking that the ranges come in order. */
static int fill_pattern(void *user, size_t t, size_t byte_offset, void *dst, size_t bytes)
{
    fill_log *log = user;
    assert_true(t < 3);
    assert_int_equal(byte_offset, log->next[t]);
    assert_true(bytes > 0);
    for (size_t i = 0; i < bytes; i++)
        ((unsigned char *)dst)[i] = pattern(t, byte_offset + i);
    log->next[t] += bytes;
    log->calls[t]++;
    if (bytes > log->max_bytes)
        log->max_bytes = bytes;
    return LLMT_OK;
}

/* Writes three tensors, the middle one of big_elems F32, through a buffer of
 * chunk bytes (0: the default), and checks every byte through the reader and
 * the checksum of each 1000-byte run (runs that cross the buffer's writes)
 * against the file read back. */
static void round_trip_large(const char *name, size_t big_elems, size_t chunk, size_t max_chunk)
{
    fill_log log = {{0}, {0}, 0};
    const llmt_st_write_tensor tensors[3] = {
        {"x", LLMT_DTYPE_F16, 1, {5}, fill_pattern, &log, NULL},
        {"big", LLMT_DTYPE_F32, 2, {1, big_elems}, fill_pattern, &log, NULL},
        {"y", LLMT_DTYPE_I32, 1, {1}, fill_pattern, &log, NULL},
    };
    const size_t sizes[3] = {10, 4 * big_elems, 4};
    const char *path = path_of(name);
    llmt_st_write_opts opts = {false, chunk, 1000};
    llmt_st_write_result result;
    assert_int_equal(llmt_st_write(path, tensors, 3, NULL, 0, &opts, &result), LLMT_OK);
    for (int t = 0; t < 3; t++)
        assert_int_equal(log.next[t], sizes[t]);
    assert_true(log.calls[1] > 1); /* the big tensor took several buffers */
    assert_true(log.max_bytes <= max_chunk);

    llmt_st_file *f = NULL;
    assert_int_equal(llmt_st_open(path, NULL, &f), LLMT_OK);
    unsigned char *buf = malloc(sizes[1]);
    assert_non_null(buf);
    for (size_t t = 0; t < 3; t++) {
        assert_int_equal(llmt_st_read(f, t, 0, buf, sizes[t]), LLMT_OK);
        for (size_t i = 0; i < sizes[t]; i++)
            if (buf[i] != pattern(t, i))
                fail_msg("tensor %zu byte %zu: %u, expected %u", t, i, buf[i], pattern(t, i));
    }
    llmt_st_close(f);

    size_t size;
    unsigned char *file = read_bytes(path, &size);
    assert_int_equal(result.file_bytes, size);
    assert_true(result.xxh3 == XXH3_64bits(file, size));
    assert_int_equal(result.n_chunks, (size + 999) / 1000);
    for (size_t c = 0; c < result.n_chunks; c++) {
        size_t at = c * 1000, len = size - at < 1000 ? size - at : 1000;
        if (result.chunks[c] != XXH3_64bits(file + at, len))
            fail_msg("run %zu of %zu: checksum differs from the file's bytes", c, result.n_chunks);
    }
    free(result.chunks);
    free(file);
    free(buf);
    unlink(path);
}

static void test_tensor_larger_than_buffer(void **state)
{
    (void)state;
    round_trip_large("small_chunks.safetensors", 10007, 4096, 4096);
    /* The default 8 MiB buffer with a 9 MiB tensor. */
    round_trip_large("default_chunk.safetensors", (9u << 20) / 4 + 1, 0, 8u << 20);
}

/* Fails tensor fail_tensor at its byte fail_at, with or without a message. */
typedef struct failing {
    size_t fail_tensor, fail_at;
    int status;
    bool with_message;
} failing;

static int fill_failing(void *user, size_t t, size_t byte_offset, void *dst, size_t bytes)
{
    const failing *how = user;
    if (t == how->fail_tensor && byte_offset + bytes > how->fail_at) {
        if (how->with_message)
            return llmt_fail(how->status, "disk on fire");
        return how->status;
    }
    memset(dst, 0x5a, bytes);
    return LLMT_OK;
}

static void test_atomic_replace(void **state)
{
    (void)state;
    char sub[PATH_MAX];
    snprintf(sub, sizeof sub, "%s/atomic", dir);
    assert_int_equal(mkdir(sub, 0700), 0);
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/model.safetensors", sub);

    failing ok = {99, 0, LLMT_OK, false};
    llmt_st_write_tensor tensors[3] = {
        {"a", LLMT_DTYPE_F32, 1, {3000}, fill_failing, &ok, NULL},
        {"b", LLMT_DTYPE_F32, 1, {5000}, fill_failing, &ok, NULL},
        {"c", LLMT_DTYPE_F32, 1, {10}, fill_failing, &ok, NULL},
    };
    assert_int_equal(llmt_st_write(path, tensors, 3, NULL, 0, NULL, NULL), LLMT_OK);
    size_t old_size;
    unsigned char *old = read_bytes(path, &old_size);
    assert_int_equal(count_entries(sub), 1);

    /* Tensor b fails after several 4 KiB buffers have reached the temporary file. */
    const failing cases[2] = {{1, 12000, LLMT_EIO, true}, {1, 12000, LLMT_ENOMEM, false}};
    for (int i = 0; i < 2; i++) {
        for (int t = 0; t < 3; t++) {
            tensors[t].user = (void *)&cases[i];
            tensors[t].dtype = LLMT_DTYPE_I32; /* would change the header */
        }
        llmt_st_write_opts opts = {true, 4096, 0};
        llmt_st_write_result result = {1, 2, NULL, 0};
        int rc = llmt_st_write(path, tensors, 3, NULL, 0, &opts, &result);
        assert_int_equal(rc, cases[i].status);
        const char *msg = llmt_error_last();
        assert_contains(msg, path);
        assert_contains(msg, "tensor \"b\": fill at byte ");
        assert_contains(msg, cases[i].with_message ? "disk on fire" : "returned -2");
        assert_true(result.file_bytes == 1 && result.xxh3 == 2); /* untouched */

        size_t size;
        unsigned char *now = read_bytes(path, &size);
        assert_int_equal(size, old_size);
        assert_memory_equal(now, old, size);
        free(now);
        assert_int_equal(count_entries(sub), 1); /* no temporary file left */
    }

    /* A successful write does replace it. */
    for (int t = 0; t < 3; t++)
        tensors[t].user = &ok;
    assert_int_equal(llmt_st_write(path, tensors, 3, NULL, 0, NULL, NULL), LLMT_OK);
    size_t size;
    unsigned char *now = read_bytes(path, &size);
    assert_int_equal(size, old_size);
    assert_memory_not_equal(now, old, size); /* the dtypes changed */
    free(now);
    free(old);
    assert_int_equal(count_entries(sub), 1);
    unlink(path);
    rmdir(sub);

    /* A directory that does not exist: EIO naming the path. */
    char missing[PATH_MAX + 32];
    snprintf(missing, sizeof missing, "%s/no/such/dir/x.safetensors", dir);
    assert_int_equal(llmt_st_write(missing, tensors, 3, NULL, 0, NULL, NULL), LLMT_EIO);
    assert_contains(llmt_error_last(), missing);
    assert_contains(llmt_error_last(), "No such file or directory");
}

static int fill_never(void *user, size_t t, size_t byte_offset, void *dst, size_t bytes)
{
    (void)user, (void)t, (void)byte_offset, (void)dst, (void)bytes;
    fail_msg("fill called for refused arguments");
    return LLMT_EINVAL;
}

static void test_write_refusals(void **state)
{
    (void)state;
    const char *path = path_of("refused.safetensors");
    const llmt_st_write_tensor good = {"t", LLMT_DTYPE_F32, 1, {2}, fill_never, NULL, NULL};
    static const struct {
        const char *name;
        int dtype, ndim;
        uint64_t shape0;
        bool no_fill;
        const char *needle;
    } bad[] = {
        {NULL, LLMT_DTYPE_F32, 1, 2, false, "tensors[1] has a NULL name"},
        {"", LLMT_DTYPE_F32, 1, 2, false, "tensors[1] has an empty name"},
        {"__metadata__", LLMT_DTYPE_F32, 1, 2, false, "the name \"__metadata__\" is reserved"},
        {"\xff", LLMT_DTYPE_F32, 1, 2, false, "name \"\\xff\" is not valid UTF-8"},
        {"u", 9, 1, 2, false, "tensor \"u\": dtype = 9 is not a dtype"},
        {"u", LLMT_DTYPE_F32, 9, 2, false, "tensor \"u\": ndim = 9 (0..8)"},
        {"u", LLMT_DTYPE_F32, -1, 2, false, "tensor \"u\": ndim = -1"},
        {"u", LLMT_DTYPE_F32, 1, 2, true, "tensor \"u\": neither fill nor data is set"},
        {"u", LLMT_DTYPE_F32, 1, UINT64_MAX / 2, false,
         "tensor \"u\": shape [9223372036854775807] of F32: size overflows"},
        {"t", LLMT_DTYPE_F32, 1, 2, false, "tensor name \"t\" given twice"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        llmt_st_write_tensor t[2] = {good, good};
        t[1].name = bad[i].name;
        t[1].dtype = bad[i].dtype;
        t[1].ndim = bad[i].ndim;
        t[1].shape[0] = bad[i].shape0;
        t[1].fill = bad[i].no_fill ? NULL : fill_never;
        assert_int_equal(llmt_st_write(path, t, 2, NULL, 0, NULL, NULL), LLMT_EINVAL);
        assert_contains(llmt_error_last(), path);
        assert_contains(llmt_error_last(), bad[i].needle);
    }
    /* The total, not only each tensor, must fit. */
    llmt_st_write_tensor big[2] = {good, good};
    big[0].shape[0] = big[1].shape[0] = UINT64_MAX / 8 + 1;
    big[1].name = "u";
    assert_int_equal(llmt_st_write(path, big, 2, NULL, 0, NULL, NULL), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "tensor \"u\"");

    const llmt_st_meta dup[2] = {{"k", "1"}, {"k", "2"}};
    assert_int_equal(llmt_st_write(path, &good, 1, dup, 2, NULL, NULL), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "metadata key \"k\" given twice");
    const llmt_st_meta null_value[1] = {{"k", NULL}};
    assert_int_equal(llmt_st_write(path, &good, 1, null_value, 1, NULL, NULL), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "meta[0]: value is NULL");
    const llmt_st_meta bad_utf8[1] = {{"k", "\xC0\xAF"}};
    assert_int_equal(llmt_st_write(path, &good, 1, bad_utf8, 1, NULL, NULL), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "meta[0]: value is not UTF-8");
    assert_int_equal(llmt_st_write(NULL, &good, 1, NULL, 0, NULL, NULL), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "path is NULL");
    assert_int_equal(llmt_st_write(path, NULL, 1, NULL, 0, NULL, NULL), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "tensors is NULL");
    assert_int_equal(access(path, F_OK), -1); /* nothing was created */
}

int main(void)
{
    static const struct CMUnitTest fixed[] = {
        cmocka_unit_test(test_read_hand_built),
        cmocka_unit_test(test_read_minimal_and_arguments),
        cmocka_unit_test(test_write_layout),
        cmocka_unit_test(test_write_from_pointers),
        cmocka_unit_test(test_tensor_larger_than_buffer),
        cmocka_unit_test(test_atomic_replace),
        cmocka_unit_test(test_write_refusals),
    };
    enum { N_FIXED = sizeof fixed / sizeof fixed[0],
           N_REFUSALS = sizeof refusals / sizeof refusals[0] };
    /* One named test per refusal, each given its case as the initial state. */
    struct CMUnitTest tests[N_FIXED + N_REFUSALS];
    memcpy(tests, fixed, sizeof fixed);
    for (size_t i = 0; i < N_REFUSALS; i++)
        tests[N_FIXED + i] = (struct CMUnitTest){.name = refusals[i].name,
                                                 .test_func = run_refusal,
                                                 .initial_state = &refusals[i]};
    return _cmocka_run_group_tests("test_safetensors", tests, N_FIXED + N_REFUSALS, setup,
                                   teardown);
}
