/* Model weights through safetensors: exact round trips in F32, BF16 and F16,
 * the file decoded by hand, and refusals of damaged or mismatched files that
 * leave the model untouched. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test_util.h"

#include "llmt/llmt.h"
#include "test_context.h"
#include "test_rand.h"
#include "test_tensors.h"
#include "ckpt/safetensors.h"
#include "util/fsutil.h"

static char dir[64];
static char path[128];

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/llmt-io-XXXXXX");
    if (!mkdtemp(dir))
        return -1;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    return llmt_remove_tree(dir);
}

static llmt_model *make_model(llmt_context **ctx, uint64_t seed, int hidden)
{
    *ctx = test_context(1, seed);
    llmt_model_config c = LLMT_MODEL_CONFIG_INIT;
    c.vocab_size = 19;
    c.hidden_size = hidden;
    c.num_layers = 2;
    c.num_heads = 2;
    c.num_kv_heads = 1;
    c.ffn_size = 24;
    c.max_seq_len = 8;
    llmt_model *m = NULL;
    assert_int_equal(llmt_model_create(&m, *ctx, &c), LLMT_OK);
    return m;
}

static unsigned char *slurp(const char *p, size_t *len)
{
    FILE *f = fopen(p, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = malloc(*len + 1);
    assert_int_equal(fread(buf, 1, *len, f), *len);
    fclose(f);
    buf[*len] = 0;
    return buf;
}

static void spit(const char *p, const unsigned char *buf, size_t len)
{
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(buf, 1, len, f), len);
    fclose(f);
}

/* bf16 of x by round-to-nearest-even, written here independently. */
static float bf16_round(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&x, &u, 4);
    return x;
}

static void test_round_trip_f32_exact(void **state)
{
    (void)state;
    llmt_context *c1, *c2;
    llmt_model *a = make_model(&c1, 1, 16), *b = make_model(&c2, 2, 16);
    float *pa = test_all_params(a), *pb = test_all_params(b);
    size_t n = (size_t)llmt_model_num_params(a);
    assert_memory_not_equal(pa, pb, n * sizeof(float)); /* different seeds */
    assert_int_equal(llmt_model_save_safetensors(a, path, LLMT_DTYPE_F32), LLMT_OK);
    assert_int_equal(llmt_model_load_safetensors(b, path), LLMT_OK);
    float *pb2 = test_all_params(b);
    assert_memory_equal(pa, pb2, n * sizeof(float));

    /* Decode the file by hand: 8-byte length, JSON header, raw data. */
    size_t len = 0;
    unsigned char *file = slurp(path, &len);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | file[i];
    assert_int_equal((8 + hlen) % 8, 0);
    assert_int_equal(len, 8 + hlen + n * 4); /* the data is exactly the weights */
    char *header = strndup((char *)file + 8, hlen);
    assert_contains(header, "\"model.embed_tokens.weight\":{\"dtype\":\"F32\",\"shape\":[19,16],"
                            "\"data_offsets\":[0,1216]}");
    assert_contains(header, "\"__metadata__\":{\"format\":\"pt\"");
    assert_contains(header, "\\\"hidden_size\\\":16");
    /* Tensors are stored in the model's order: the data is the flat weights. */
    assert_memory_equal(file + 8 + hlen, pa, n * sizeof(float));
    free(header);
    free(file);
    free(pa);
    free(pb);
    free(pb2);
    llmt_model_free(a);
    llmt_model_free(b);
    llmt_context_free(c1);
    llmt_context_free(c2);
}

static void test_round_trip_16bit(void **state)
{
    (void)state;
    llmt_context *c1, *c2;
    llmt_model *a = make_model(&c1, 3, 16), *b = make_model(&c2, 4, 16);
    float *pa = test_all_params(a);
    size_t n = (size_t)llmt_model_num_params(a);
    assert_int_equal(llmt_model_save_safetensors(a, path, LLMT_DTYPE_BF16), LLMT_OK);
    assert_int_equal(llmt_model_load_safetensors(b, path), LLMT_OK);
    float *pb = test_all_params(b);
    for (size_t i = 0; i < n; i++)
        assert_true(pb[i] == bf16_round(pa[i]));
    size_t len = 0;
    free(slurp(path, &len));
    assert_true(len < 8 + 4096 + n * 2 + 1); /* two bytes a weight */
    /* F16: weights of ~0.02 keep 10 mantissa bits: within 2^-11 relative. */
    assert_int_equal(llmt_model_save_safetensors(a, path, LLMT_DTYPE_F16), LLMT_OK);
    assert_int_equal(llmt_model_load_safetensors(b, path), LLMT_OK);
    free(pb);
    pb = test_all_params(b);
    int changed = 0;
    for (size_t i = 0; i < n; i++) {
        assert_true(fabsf(pb[i] - pa[i]) <= fabsf(pa[i]) * 0x1p-11f + 0x1p-24f);
        changed += pb[i] != pa[i];
    }
    assert_true(changed > 0);
    /* And saving what was loaded from F16 as F16 again reproduces the file. */
    size_t l1 = 0, l2 = 0;
    unsigned char *f1 = slurp(path, &l1);
    assert_int_equal(llmt_model_save_safetensors(b, path, LLMT_DTYPE_F16), LLMT_OK);
    unsigned char *f2 = slurp(path, &l2);
    assert_int_equal(l1, l2);
    assert_memory_equal(f1, f2, l1);
    free(f1);
    free(f2);
    free(pa);
    free(pb);
    llmt_model_free(a);
    llmt_model_free(b);
    llmt_context_free(c1);
    llmt_context_free(c2);
}

/* Loads a damaged file into b, expects rc and a message containing both
 * needles, and checks b's weights did not change. */
static void expect_refused(llmt_model *b, const char *file, int rc, const char *needle1,
                           const char *needle2)
{
    float *before = test_all_params(b);
    assert_int_equal(llmt_model_load_safetensors(b, file), rc);
    assert_contains(llmt_error_last(), needle1);
    assert_contains(llmt_error_last(), needle2);
    float *after = test_all_params(b);
    assert_memory_equal(before, after, (size_t)llmt_model_num_params(b) * sizeof(float));
    free(before);
    free(after);
}

static void test_refusals(void **state)
{
    (void)state;
    llmt_context *c1, *c2, *c3;
    llmt_model *a = make_model(&c1, 5, 16), *b = make_model(&c2, 6, 16);
    llmt_model *wide = make_model(&c3, 7, 32);
    assert_int_equal(llmt_model_save_safetensors(a, path, LLMT_DTYPE_F32), LLMT_OK);
    size_t len = 0;
    unsigned char *good = slurp(path, &len);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | good[i];
    char bad_path[160];
    snprintf(bad_path, sizeof bad_path, "%s/bad.safetensors", dir);
    unsigned char *buf = malloc(len);

    /* A corrupted header: a brace turned into garbage. */
    memcpy(buf, good, len);
    buf[8] = '#';
    spit(bad_path, buf, len);
    expect_refused(b, bad_path, LLMT_ECORRUPT, bad_path, "JSON at byte 0");

    /* An offset out of range: the embedding's end pushed past the data. */
    memcpy(buf, good, len);
    char *at = strstr((char *)buf + 8, "[0,1216]");
    assert_non_null(at);
    memcpy(at, "[0,9216]", 8);
    spit(bad_path, buf, len);
    expect_refused(b, bad_path, LLMT_ECORRUPT, bad_path, "model.embed_tokens.weight");

    /* Truncated: the last 100 bytes of data missing. */
    spit(bad_path, good, len - 100);
    expect_refused(b, bad_path, LLMT_ECORRUPT, bad_path, "");

    /* A header length that runs past the end of the file. */
    memcpy(buf, good, len);
    buf[3] = 0x7f;
    spit(bad_path, buf, len);
    expect_refused(b, bad_path, LLMT_ECORRUPT, bad_path, "header length");

    /* Wrong shape: a wider model's file, caught by the stored config... */
    assert_int_equal(llmt_model_save_safetensors(wide, bad_path, LLMT_DTYPE_F32), LLMT_OK);
    expect_refused(b, bad_path, LLMT_EINVAL, "hidden_size = 32", "this model 16");

    /* ...and, without the config (a file from elsewhere), by the shape check:
     * the metadata value's key renamed so the reader no longer finds it. */
    unsigned char *wf = slurp(bad_path, &len);
    char *key = strstr((char *)wf + 8, "llmt.model_config");
    assert_non_null(key);
    key[0] = 'x';
    spit(bad_path, wf, len);
    expect_refused(b, bad_path, LLMT_EINVAL, "model.embed_tokens.weight", "shape [19, 32]");
    free(wf);

    /* A missing file. */
    expect_refused(b, "/nonexistent/model.safetensors", LLMT_EIO, "/nonexistent/model.safetensors", "");

    /* Bad arguments. */
    assert_int_equal(llmt_model_save_safetensors(a, path, LLMT_DTYPE_I32), LLMT_EINVAL);
    assert_int_equal(llmt_model_save_safetensors(a, NULL, LLMT_DTYPE_F32), LLMT_EINVAL);
    assert_int_equal(llmt_model_load_safetensors(NULL, path), LLMT_EINVAL);
    /* Saving into a missing directory fails and leaves nothing behind. */
    assert_int_equal(llmt_model_save_safetensors(a, "/nonexistent/x.safetensors", LLMT_DTYPE_F32),
                     LLMT_EIO);
    assert_contains(llmt_error_last(), "/nonexistent/x.safetensors");

    free(buf);
    free(good);
    llmt_model_free(a);
    llmt_model_free(b);
    llmt_model_free(wide);
    llmt_context_free(c1);
    llmt_context_free(c2);
    llmt_context_free(c3);
}

/* The model's logits for a fixed batch, malloc'ed (count floats). */
static float *logits_of(llmt_model *m, size_t *count)
{
    enum { LB = 2, LT = 8 };
    int32_t tokens[LB * LT];
    for (int i = 0; i < LB * LT; i++)
        tokens[i] = (i * 7 + 3) % 19;
    llmt_model_config c;
    assert_int_equal(llmt_model_get_config(m, &c), LLMT_OK);
    *count = (size_t)LB * LT * (size_t)c.vocab_size;
    float *out = malloc(*count * sizeof *out);
    assert_int_equal(llmt_model_logits(m, tokens, LB, LT, out, *count), LLMT_OK);
    return out;
}

/* b, created from a file written from a, has a's configuration (precision
 * as given), bit-identical weights and bit-identical logits. */
static void expect_same_model(llmt_model *a, llmt_model *b, int precision)
{
    llmt_model_config ca, cb;
    assert_int_equal(llmt_model_get_config(a, &ca), LLMT_OK);
    assert_int_equal(llmt_model_get_config(b, &cb), LLMT_OK);
    assert_int_equal(cb.precision, precision);
    cb.precision = ca.precision;
    assert_memory_equal(&ca, &cb, sizeof ca);
    size_t n = (size_t)llmt_model_num_params(a), la = 0, lb = 0;
    float *pa = test_all_params(a), *pb = test_all_params(b);
    assert_memory_equal(pa, pb, n * sizeof(float));
    float *xa = logits_of(a, &la), *xb = logits_of(b, &lb);
    assert_int_equal(la, lb);
    if (ca.precision == precision) /* same precision: the same arithmetic */
        assert_memory_equal(xa, xb, la * sizeof(float));
    free(pa);
    free(pb);
    free(xa);
    free(xb);
}

static void test_create_from_file(void **state)
{
    (void)state;
    llmt_context *c1, *c2 = test_context(1, 99);
    llmt_model *a = make_model(&c1, 1, 16), *b = NULL;
    test_randomize_params(a, 5, 0.3);
    /* A safetensors file carrying its configuration. */
    assert_int_equal(llmt_model_save_safetensors(a, path, LLMT_DTYPE_F32), LLMT_OK);
    assert_int_equal(llmt_model_create_from_file(&b, c2, path, LLMT_PRECISION_AS_SAVED), LLMT_OK);
    expect_same_model(a, b, LLMT_PRECISION_FP32);
    llmt_model_free(b);

    /* A bf16 model, as saved and converted to fp32 (bf16 values are exact in fp32). */
    llmt_model_config cfg;
    assert_int_equal(llmt_model_get_config(a, &cfg), LLMT_OK);
    cfg.precision = LLMT_PRECISION_BF16_MIXED;
    llmt_model *h = NULL;
    assert_int_equal(llmt_model_create(&h, c1, &cfg), LLMT_OK);
    test_randomize_params(h, 6, 0.3);
    assert_int_equal(llmt_model_save_safetensors(h, path, LLMT_DTYPE_BF16), LLMT_OK);
    assert_int_equal(llmt_model_create_from_file(&b, c2, path, LLMT_PRECISION_AS_SAVED), LLMT_OK);
    expect_same_model(h, b, LLMT_PRECISION_BF16_MIXED);
    llmt_model_free(b);
    assert_int_equal(llmt_model_create_from_file(&b, c2, path, LLMT_PRECISION_FP32), LLMT_OK);
    expect_same_model(h, b, LLMT_PRECISION_FP32);
    llmt_model_free(b);
    llmt_model_free(h);

    /* A checkpoint directory, named through its store. */
    char store_dir[128], ckpt[256];
    snprintf(store_dir, sizeof store_dir, "%s/ckpt", dir);
    llmt_ckpt_store *s = NULL;
    assert_int_equal(llmt_ckpt_store_open(&s, c1, store_dir, NULL), LLMT_OK);
    llmt_train_state st = LLMT_TRAIN_STATE_INIT;
    st.model = a;
    st.step = 3;
    assert_int_equal(llmt_ckpt_save(s, &st, LLMT_CKPT_DURABLE), LLMT_OK);
    assert_int_equal(llmt_ckpt_path(s, 3, LLMT_CKPT_DURABLE, ckpt, sizeof ckpt, NULL), LLMT_OK);
    llmt_ckpt_store_free(s);
    assert_int_equal(llmt_model_create_from_file(&b, c2, ckpt, LLMT_PRECISION_AS_SAVED), LLMT_OK);
    expect_same_model(a, b, LLMT_PRECISION_FP32);
    llmt_model_free(b);

    /* Refusals: a checkpoint directory whose name says another step than its
     * manifest (the store's own check), damaged checkpoint weights, a file
     * without the configuration, no such file, bad arguments; *out stays NULL. */
    char moved[300];
    snprintf(moved, sizeof moved, "%s/step-00000099", store_dir);
    assert_int_equal(rename(ckpt, moved), 0);
    b = (llmt_model *)c2;
    assert_int_equal(llmt_model_create_from_file(&b, c2, moved, -1), LLMT_ECORRUPT);
    assert_null(b);
    assert_contains(llmt_error_last(), "manifest says step 3");
    assert_int_equal(rename(moved, ckpt), 0);
    char weights[300];
    snprintf(weights, sizeof weights, "%s/model.safetensors", ckpt);
    size_t len = 0;
    unsigned char *bytes = slurp(weights, &len);
    bytes[len - 1] ^= 1;
    spit(weights, bytes, len);
    free(bytes);
    b = (llmt_model *)c2;
    assert_int_equal(llmt_model_create_from_file(&b, c2, ckpt, -1), LLMT_ECORRUPT);
    assert_null(b);
    assert_contains(llmt_error_last(), ckpt);
    assert_contains(llmt_error_last(), "file model.safetensors: checksum mismatch");
    float x[4] = {1, 2, 3, 4};
    llmt_st_write_tensor t = {.name = "x", .dtype = LLMT_DTYPE_F32, .ndim = 1, .data = x};
    t.shape[0] = 4;
    const llmt_st_meta meta[1] = {{"format", "pt"}};
    assert_int_equal(llmt_st_write(path, &t, 1, meta, 1, NULL, NULL), LLMT_OK);
    assert_int_equal(llmt_model_create_from_file(&b, c2, path, -1), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "no \"llmt.model_config\" in __metadata__");
    assert_int_equal(llmt_model_create_from_file(&b, c2, "/nonexistent/m.safetensors", -1), LLMT_EIO);
    assert_contains(llmt_error_last(), "/nonexistent/m.safetensors");
    assert_int_equal(llmt_model_create_from_file(&b, c2, dir, -1), LLMT_ECORRUPT); /* no MANIFEST */
    assert_contains(llmt_error_last(), "MANIFEST");
    assert_int_equal(llmt_model_create_from_file(&b, c2, ckpt, 4), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "precision = 4");
    assert_int_equal(llmt_model_create_from_file(&b, NULL, ckpt, -1), LLMT_EINVAL);
    assert_int_equal(llmt_model_create_from_file(&b, c2, NULL, -1), LLMT_EINVAL);
    assert_int_equal(llmt_model_create_from_file(NULL, c2, ckpt, -1), LLMT_EINVAL);
    assert_null(b);
    llmt_model_free(a);
    llmt_context_free(c1);
    llmt_context_free(c2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_round_trip_f32_exact, setup, teardown),
        cmocka_unit_test_setup_teardown(test_round_trip_16bit, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refusals, setup, teardown),
        cmocka_unit_test_setup_teardown(test_create_from_file, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
