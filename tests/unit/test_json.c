/* The strict JSON parser and the writer: decoded values checked against
 * hand-written expectations, every refusal with its byte offset, the limits,
 * writer output against hand-written text, and doubles round-tripped
 * bit-exactly. */
#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "test_util.h"

#include "llmt/common.h"
#include "util/json.h"

/* Generous limits for documents that are not about limits. */
static const llmt_json_limits loose = {
    .max_depth = 64, .max_input_bytes = 1 << 20, .max_string_bytes = 1 << 20, .max_nodes = 1 << 20};

static llmt_json *parse_n(const char *text, size_t len)
{
    llmt_json *root = NULL;
    if (llmt_json_parse(text, len, &loose, &root) != LLMT_OK)
        fail_msg("parsing <%s> failed: %s", text, llmt_error_last());
    assert_non_null(root);
    return root;
}

static llmt_json *parse(const char *text)
{
    return parse_n(text, strlen(text));
}

/* Fails unless the double bits of a and b are identical (so -0 != 0). */
static void assert_same_double(double a, double b)
{
    if (memcmp(&a, &b, sizeof a) != 0)
        fail_msg("expected %.17g, got %.17g", b, a);
}

static void test_strings(void **state)
{
    (void)state;
    static const struct {
        const char *json;
        const char *bytes;
        size_t len;
    } cases[] = {
        {"\"\"", "", 0},
        {"\"abc\"", "abc", 3},
        {"\"a\\u0000b\"", "a\0b", 3},
        {"\"\\\"\\\\\\/\\b\\f\\n\\r\\t\"", "\"\\/\b\f\n\r\t", 8},
        {"\"\\u0041\\u00e9\\u00E9\"", "A\xC3\xA9\xC3\xA9", 5},
        {"\"\\u0080\\u07FF\"", "\xC2\x80\xDF\xBF", 4},
        {"\"\\u0800\\u20ac\\uFFFF\"", "\xE0\xA0\x80\xE2\x82\xAC\xEF\xBF\xBF", 9},
        {"\"\\ud83d\\ude00\"", "\xF0\x9F\x98\x80", 4},         /* U+1F600 */
        {"\"\\uD800\\uDC00\"", "\xF0\x90\x80\x80", 4},         /* U+10000 */
        {"\"\\uDBFF\\uDFFF\"", "\xF4\x8F\xBF\xBF", 4},         /* U+10FFFF */
        {"\"h\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80\"", "h\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80", 10},
        {"\"\x7f\"", "\x7f", 1},                                /* DEL is not a control here */
        {"\"\\u001f\"", "\x1f", 1},
        {" \t\r\n\"x\" \n", "x", 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        llmt_json *root = parse(cases[i].json);
        size_t len = 99;
        assert_int_equal(llmt_json_type(root), LLMT_JSON_STRING);
        const char *s = llmt_json_string(root, &len);
        assert_non_null(s);
        assert_int_equal(len, cases[i].len);
        assert_memory_equal(s, cases[i].bytes, cases[i].len);
        assert_int_equal(s[len], '\0');
        assert_null(llmt_json_number_text(root, NULL));
        llmt_json_free(root);
    }
}

static void test_integers(void **state)
{
    (void)state;
    static const struct {
        const char *json;
        bool i64_ok;
        int64_t i64;
        bool u64_ok;
        uint64_t u64;
    } cases[] = {
        {"0", true, 0, true, 0},
        {"-0", true, 0, true, 0},
        {"42", true, 42, true, 42},
        {"-1", true, -1, false, 0},
        {"9223372036854775807", true, INT64_MAX, true, 9223372036854775807u},
        {"9223372036854775808", false, 0, true, 9223372036854775808u},
        {"-9223372036854775808", true, INT64_MIN, false, 0},
        {"-9223372036854775809", false, 0, false, 0},
        {"18446744073709551615", false, 0, true, UINT64_MAX},
        {"18446744073709551616", false, 0, false, 0},
        {"184467440737095516150", false, 0, false, 0},
        {"100000000000000000000000", false, 0, false, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        llmt_json *root = parse(cases[i].json);
        assert_int_equal(llmt_json_type(root), LLMT_JSON_NUMBER);
        assert_true(llmt_json_is_integer(root));
        size_t len = 0;
        assert_string_equal(llmt_json_number_text(root, &len), cases[i].json);
        assert_int_equal(len, strlen(cases[i].json));
        int64_t i64 = 7;
        uint64_t u64 = 7;
        int rc = llmt_json_int64(root, &i64);
        if (cases[i].i64_ok) {
            assert_int_equal(rc, LLMT_OK);
            assert_true(i64 == cases[i].i64);
        } else {
            assert_int_equal(rc, LLMT_ECORRUPT);
            assert_contains(llmt_error_last(), "JSON at byte 0: ");
            assert_contains(llmt_error_last(), "out of range for int64");
            assert_true(i64 == 7);
        }
        rc = llmt_json_uint64(root, &u64);
        if (cases[i].u64_ok) {
            assert_int_equal(rc, LLMT_OK);
            assert_true(u64 == cases[i].u64);
        } else {
            assert_int_equal(rc, LLMT_ECORRUPT);
            assert_contains(llmt_error_last(), "out of range for uint64");
        }
        llmt_json_free(root);
    }

    /* Written with a fraction or an exponent: not integers, whatever the value. */
    static const char *const not_integers[] = {"1.0", "1e3", "1E+2", "-0.0", "1e300",
                                               "1e999999999999999999999"};
    for (size_t i = 0; i < sizeof not_integers / sizeof not_integers[0]; i++) {
        llmt_json *root = parse(not_integers[i]);
        int64_t i64;
        uint64_t u64;
        assert_false(llmt_json_is_integer(root));
        assert_int_equal(llmt_json_int64(root, &i64), LLMT_ECORRUPT);
        assert_contains(llmt_error_last(), "is not an integer");
        assert_int_equal(llmt_json_uint64(root, &u64), LLMT_ECORRUPT);
        llmt_json_free(root);
    }
}

static void test_doubles(void **state)
{
    (void)state;
    static const struct {
        const char *json;
        double value;
    } cases[] = {
        {"0", 0.0},
        {"-0", -0.0},
        {"0.1", 0.1},
        {"-2.5e-3", -2.5e-3},
        {"1E+2", 100.0},
        {"1e300", 1e300},
        {"5e-324", 4.9406564584124654e-324},
        {"2.2250738585072014e-308", DBL_MIN},
        {"1.7976931348623157e308", DBL_MAX},
        {"-1.7976931348623157e308", -DBL_MAX},
        {"1e-400", 0.0}, /* below the smallest subnormal: rounds to zero */
        {"9007199254740993", 9007199254740992.0}, /* 2^53 + 1: ties to even */
        {"123456789012345678901234567890", 1.2345678901234568e29},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        llmt_json *root = parse(cases[i].json);
        double d = 42;
        assert_int_equal(llmt_json_double(root, &d), LLMT_OK);
        assert_same_double(d, cases[i].value);
        llmt_json_free(root);
    }
    /* Beyond DBL_MAX after rounding: refused, never an infinity. */
    static const char *const too_big[] = {"1e309", "-1e400", "1e999999999999999999999",
                                          "1.797693134862316e308"};
    for (size_t i = 0; i < sizeof too_big / sizeof too_big[0]; i++) {
        llmt_json *root = parse(too_big[i]);
        double d = 42;
        assert_int_equal(llmt_json_double(root, &d), LLMT_ECORRUPT);
        assert_contains(llmt_error_last(), "out of range for double");
        assert_true(d == 42);
        llmt_json_free(root);
    }
}

static void test_literals_and_types(void **state)
{
    (void)state;
    bool b = false;
    llmt_json *root = parse(" true ");
    assert_int_equal(llmt_json_type(root), LLMT_JSON_BOOL);
    assert_int_equal(llmt_json_bool(root, &b), LLMT_OK);
    assert_true(b);
    llmt_json_free(root);

    root = parse("false");
    assert_int_equal(llmt_json_bool(root, &b), LLMT_OK);
    assert_false(b);
    llmt_json_free(root);

    root = parse("null");
    assert_int_equal(llmt_json_type(root), LLMT_JSON_NULL);
    assert_int_equal(llmt_json_bool(root, &b), LLMT_ECORRUPT);
    assert_contains(llmt_error_last(), "JSON at byte 0: expected a boolean, found null");
    llmt_json_free(root);

    /* Getters on the wrong type name the offset of the value. */
    root = parse("[1.5, \"7\"]");
    int64_t i64;
    double d;
    assert_int_equal(llmt_json_int64(llmt_json_at(root, 0), &i64), LLMT_ECORRUPT);
    assert_contains(llmt_error_last(), "JSON at byte 1: 1.5 is not an integer");
    assert_int_equal(llmt_json_double(llmt_json_at(root, 1), &d), LLMT_ECORRUPT);
    assert_contains(llmt_error_last(), "JSON at byte 6: expected a number, found a string");
    assert_int_equal(llmt_json_int64(llmt_json_at(root, 2), &i64), LLMT_ECORRUPT);
    assert_contains(llmt_error_last(), "found nothing");
    llmt_json_free(root);

    assert_int_equal(llmt_json_type(NULL), -1);
    assert_int_equal(llmt_json_len(NULL), 0);
    llmt_json_free(NULL);
}

static void test_tree(void **state)
{
    (void)state;
    llmt_json *root = parse("{\"a\": [1, {\"b\": null}], \"c\": \"x\", \"\": {}, \"d\": [],"
                            " \"k\\u0000z\": true}");
    assert_int_equal(llmt_json_type(root), LLMT_JSON_OBJECT);
    assert_int_equal(llmt_json_len(root), 5);

    static const char *const keys[] = {"a", "c", "", "d", "k\0z"};
    static const size_t key_lens[] = {1, 1, 0, 1, 3};
    static const int types[] = {LLMT_JSON_ARRAY, LLMT_JSON_STRING, LLMT_JSON_OBJECT,
                                LLMT_JSON_ARRAY, LLMT_JSON_BOOL};
    for (size_t i = 0; i < 5; i++) {
        const char *key = NULL;
        size_t key_len = 99;
        const llmt_json *v = llmt_json_member(root, i, &key, &key_len);
        assert_non_null(v);
        assert_int_equal(key_len, key_lens[i]);
        assert_memory_equal(key, keys[i], key_lens[i]);
        assert_int_equal(key[key_len], '\0');
        assert_int_equal(llmt_json_type(v), types[i]);
    }
    assert_null(llmt_json_member(root, 5, NULL, NULL));

    const llmt_json *a = llmt_json_get(root, "a");
    assert_ptr_equal(a, llmt_json_member(root, 0, NULL, NULL));
    assert_int_equal(llmt_json_len(a), 2);
    int64_t one = 0;
    assert_int_equal(llmt_json_int64(llmt_json_at(a, 0), &one), LLMT_OK);
    assert_int_equal(one, 1);
    const llmt_json *inner = llmt_json_at(a, 1);
    assert_int_equal(llmt_json_len(inner), 1);
    assert_int_equal(llmt_json_type(llmt_json_get(inner, "b")), LLMT_JSON_NULL);
    assert_null(llmt_json_at(a, 2));

    assert_string_equal(llmt_json_string(llmt_json_get(root, "c"), NULL), "x");
    assert_int_equal(llmt_json_len(llmt_json_get(root, "")), 0);
    assert_int_equal(llmt_json_type(llmt_json_get(root, "d")), LLMT_JSON_ARRAY);
    assert_int_equal(llmt_json_len(llmt_json_get(root, "d")), 0);
    assert_null(llmt_json_get(root, "k"));  /* "k\0z" is not "k" */
    assert_null(llmt_json_get(root, "zz"));

    /* Accessors of the wrong kind answer nothing. */
    assert_null(llmt_json_at(root, 0));
    assert_null(llmt_json_get(a, "a"));
    assert_null(llmt_json_member(a, 0, NULL, NULL));
    assert_null(llmt_json_string(a, NULL));
    assert_int_equal(llmt_json_len(llmt_json_get(root, "c")), 0);
    assert_false(llmt_json_is_integer(a));
    llmt_json_free(root);
}

static void test_invalid_documents(void **state)
{
    (void)state;
    static const struct {
        const char *json;
        size_t len; /* 0: strlen */
        size_t at;  /* the byte offset the message must give */
        const char *why;
    } cases[] = {
        {"", 0, 0, "empty input"},
        {"   ", 0, 3, "empty input"},
        {"[1,2,]", 0, 4, "trailing comma"},
        {"{\"a\":1,}", 0, 6, "trailing comma"},
        {"[1,,2]", 0, 3, "unexpected ','"},
        {"01", 0, 0, "leading zero"},
        {"[-01]", 0, 2, "leading zero"},
        {"\"\\ud800\"", 0, 1, "lone surrogate \\uD800"},
        {"\"\\udc00\"", 0, 1, "lone surrogate \\uDC00"},
        {"\"\\ud800\\u0041\"", 0, 1, "lone surrogate"},
        {"\"ab\\ud83d\"", 0, 3, "lone surrogate"},
        {"\"\\ud83d\\ud83d\"", 0, 1, "lone surrogate"},
        {"\"\xC0\xAF\"", 0, 1, "invalid UTF-8 byte 0xc0"},      /* overlong '/' */
        {"\"\xE0\x80\x80\"", 0, 1, "invalid UTF-8"},            /* overlong, 3 bytes */
        {"\"\xF0\x80\x80\x80\"", 0, 1, "invalid UTF-8"},        /* overlong, 4 bytes */
        {"\"\xED\xA0\x80\"", 0, 1, "invalid UTF-8 byte 0xed"},  /* U+D800 */
        {"\"\xF4\x90\x80\x80\"", 0, 1, "invalid UTF-8"},        /* U+110000 */
        {"\"a\xE2\x82\"", 0, 2, "invalid UTF-8"},               /* cut short */
        {"\"\x80\"", 0, 1, "invalid UTF-8"},                    /* stray continuation */
        {"\"\xFF\"", 0, 1, "invalid UTF-8"},
        {"{\"dtype\":1,\"dtype\":2}", 0, 11, "duplicate key \"dtype\""},
        {"{\"a\":1,\"\\u0061\":2}", 0, 7, "duplicate key \"a\""},  /* equal once decoded */
        {"{\"x\":{\"k\":1,\"k\":2}}", 0, 12, "duplicate key \"k\""},
        {"{\"b\":1,\"a\":2,\"a\":3,\"b\":4}", 0, 13, "duplicate key \"a\""},
        {"\"a\nb\"", 0, 2, "control character 0x0a"},
        {"\"\x01\"", 0, 1, "control character 0x01"},
        {"\"\t\"", 0, 1, "control character 0x09"},
        {"1 2", 0, 2, "after the value"},
        {"{} x", 0, 3, "unexpected 'x' after the value"},
        {"[1]]", 0, 3, "after the value"},
        {"[1]\0", 4, 3, "unexpected byte 0x00"},
        {"NaN", 0, 0, "unexpected 'N'"},
        {"[NaN]", 0, 1, "unexpected 'N'"},
        {"Infinity", 0, 0, "unexpected 'I'"},
        {"-Infinity", 0, 1, "expected a digit"},
        {"[1 /* c */]", 0, 3, "expected ',' or ']'"},
        {"// c\n1", 0, 0, "unexpected '/'"},
        {"['a']", 0, 1, "unexpected '''"},
        {"{'a':1}", 0, 1, "expected a string key"},
        {"{1:2}", 0, 1, "expected a string key"},
        {"{\"a\" 1}", 0, 5, "expected ':'"},
        {"tru", 0, 0, "invalid literal"},
        {"True", 0, 0, "unexpected 'T'"},
        {"nul", 0, 0, "invalid literal"},
        {".5", 0, 0, "unexpected '.'"},
        {"+1", 0, 0, "unexpected '+'"},
        {"1.", 0, 2, "expected a digit after '.'"},
        {"1.e5", 0, 2, "expected a digit after '.'"},
        {"1e", 0, 2, "exponent"},
        {"1e+", 0, 3, "exponent"},
        {"-", 0, 1, "expected a digit"},
        {"0x10", 0, 1, "unexpected 'x'"},
        {"\"abc", 0, 0, "unterminated string"},
        {"[1,", 0, 3, "unexpected end of input"},
        {"[1", 0, 2, "expected ',' or ']', found end of input"},
        {"{", 0, 1, "expected a string key, found end of input"},
        {"\"\\x\"", 0, 1, "invalid escape"},
        {"\"\\u12G4\"", 0, 1, "4 hex digits"},
        {"\"\\u12\"", 0, 1, "4 hex digits"},
        {"\"\\", 0, 1, "invalid escape: backslash followed by end of input"},
        {"\xEF\xBB\xBF{}", 0, 0, "unexpected byte 0xef"}, /* a byte order mark */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t len = cases[i].len ? cases[i].len : strlen(cases[i].json);
        llmt_json *root = (llmt_json *)&root; /* must come back NULL */
        int rc = llmt_json_parse(cases[i].json, len, &loose, &root);
        if (rc != LLMT_ECORRUPT)
            fail_msg("case %zu <%s>: status %d", i, cases[i].json, rc);
        assert_null(root);
        char at[64];
        snprintf(at, sizeof at, "JSON at byte %zu: ", cases[i].at);
        assert_contains(llmt_error_last(), at);
        assert_contains(llmt_error_last(), cases[i].why);
    }
}

/* Parses text under lim and returns the status. */
static int parse_limited(const char *text, const llmt_json_limits *lim)
{
    llmt_json *root = NULL;
    int rc = llmt_json_parse(text, strlen(text), lim, &root);
    assert_true(rc == LLMT_OK ? root != NULL : root == NULL);
    llmt_json_free(root);
    return rc;
}

static void test_limits(void **state)
{
    (void)state;
    llmt_json_limits lim = loose;

    lim.max_depth = 2;
    assert_int_equal(parse_limited("[[1]]", &lim), LLMT_OK);
    assert_int_equal(parse_limited("[[[1]]]", &lim), LLMT_ECORRUPT);
    assert_contains(llmt_error_last(), "JSON at byte 2: nesting deeper than 2 levels");
    assert_int_equal(parse_limited("{\"a\":{\"b\":{}}}", &lim), LLMT_ECORRUPT);
    assert_contains(llmt_error_last(), "JSON at byte 10: nesting deeper");
    lim.max_depth = 0;
    assert_int_equal(parse_limited("\"only a scalar\"", &lim), LLMT_OK);
    assert_int_equal(parse_limited("[]", &lim), LLMT_ECORRUPT);
    assert_contains(llmt_error_last(), "JSON at byte 0: nesting deeper than 0");

    /* Deep input stops at the limit, without recursing further. */
    lim.max_depth = LLMT_JSON_MAX_DEPTH;
    size_t deep = 100000;
    char *text = malloc(deep + 1);
    assert_non_null(text);
    memset(text, '[', deep);
    text[deep] = '\0';
    assert_int_equal(parse_limited(text, &lim), LLMT_ECORRUPT);
    char at[64];
    snprintf(at, sizeof at, "JSON at byte %d: nesting deeper", LLMT_JSON_MAX_DEPTH);
    assert_contains(llmt_error_last(), at);
    free(text);
    lim.max_depth = LLMT_JSON_MAX_DEPTH + 1;
    assert_int_equal(parse_limited("1", &lim), LLMT_EINVAL);
    assert_contains(llmt_error_last(), "max_depth");
    lim = loose;

    /* Decoded bytes count, for keys as for values. */
    lim.max_string_bytes = 3;
    assert_int_equal(parse_limited("\"abc\"", &lim), LLMT_OK);
    assert_int_equal(parse_limited("\"\\u00e9x\"", &lim), LLMT_OK);
    assert_int_equal(parse_limited("\"abcd\"", &lim), LLMT_ECORRUPT);
    assert_contains(llmt_error_last(), "JSON at byte 0: string longer than 3 bytes");
    assert_int_equal(parse_limited("\"\\u00e9\\u00e9\"", &lim), LLMT_ECORRUPT);
    assert_int_equal(parse_limited("{\"abcd\":1}", &lim), LLMT_ECORRUPT);
    assert_contains(llmt_error_last(), "JSON at byte 1: string longer");
    lim = loose;

    /* Every value counts, containers too. */
    lim.max_nodes = 3;
    assert_int_equal(parse_limited("[1,2]", &lim), LLMT_OK);
    assert_int_equal(parse_limited("{\"a\":[]}", &lim), LLMT_OK);
    assert_int_equal(parse_limited("[1,2,3]", &lim), LLMT_ECORRUPT);
    assert_contains(llmt_error_last(), "JSON at byte 5: more than 3 values");
    lim = loose;

    lim.max_input_bytes = 4;
    assert_int_equal(parse_limited("[12]", &lim), LLMT_OK);
    assert_int_equal(parse_limited("[1,2]", &lim), LLMT_ECORRUPT);
    assert_contains(llmt_error_last(), "input of 5 bytes is over the limit of 4 bytes");

    llmt_json *root = NULL;
    assert_int_equal(llmt_json_parse(NULL, 1, &loose, &root), LLMT_EINVAL);
    assert_int_equal(llmt_json_parse("1", 1, NULL, &root), LLMT_EINVAL);
    assert_int_equal(llmt_json_parse("1", 1, &loose, NULL), LLMT_EINVAL);
}

static void test_quote(void **state)
{
    (void)state;
    char buf[LLMT_JSON_QUOTE_CAP];
    assert_string_equal(llmt_json_quote(buf, sizeof buf, "a\"b\\c\x01\xC3\xA9", 8),
                        "\"a\\\"b\\\\c\\x01\xC3\xA9\"");
    assert_string_equal(llmt_json_quote(buf, sizeof buf, "\xFF" "x", 2), "\"\\xffx\"");
    char small[16];
    assert_string_equal(llmt_json_quote(small, sizeof small, "abcdefghijklmnop", 16),
                        "\"abcdefghij...\"");
}

/* The text of a finished writer, which must succeed. */
static const char *finish_ok(llmt_jw *w)
{
    const char *text = NULL;
    size_t len = 0;
    if (llmt_jw_finish(w, &text, &len) != LLMT_OK)
        fail_msg("llmt_jw_finish: %s", llmt_error_last());
    assert_int_equal(strlen(text), len);
    return text;
}

static void test_writer_output(void **state)
{
    (void)state;
    static const char s[] = "q\"\\/\n\x01\x1f\x7f\xC3\xA9" "\0z\b\f\r\t";
    llmt_jw w;
    llmt_jw_init(&w);
    llmt_jw_begin_object(&w);
    llmt_jw_key(&w, "a", 1);
    llmt_jw_int64(&w, -5);
    llmt_jw_key(&w, "b", 1);
    llmt_jw_begin_array(&w);
    llmt_jw_uint64(&w, UINT64_MAX);
    llmt_jw_int64(&w, INT64_MIN);
    llmt_jw_bool(&w, true);
    llmt_jw_bool(&w, false);
    llmt_jw_null(&w);
    llmt_jw_double(&w, 0.5);
    llmt_jw_begin_object(&w);
    llmt_jw_end_object(&w);
    llmt_jw_begin_array(&w);
    llmt_jw_end_array(&w);
    llmt_jw_end_array(&w);
    llmt_jw_key(&w, "s", 1);
    llmt_jw_string(&w, s, sizeof s - 1);
    llmt_jw_key(&w, "k\"\n", 3);
    llmt_jw_string(&w, "", 0);
    llmt_jw_end_object(&w);
    assert_string_equal(finish_ok(&w),
                        "{\"a\":-5,\"b\":[18446744073709551615,-9223372036854775808,true,false,"
                        "null,0.5,{},[]],\"s\":\"q\\\"\\\\/\\n\\u0001\\u001f\x7f\xC3\xA9"
                        "\\u0000z\\b\\f\\r\\t\",\"k\\\"\\n\":\"\"}");
    llmt_jw_free(&w);

    /* A scalar alone is a document. */
    llmt_jw_init(&w);
    llmt_jw_string(&w, "x", 1);
    assert_string_equal(finish_ok(&w), "\"x\"");
    llmt_jw_free(&w);

    static const struct {
        double v;
        const char *text;
    } doubles[] = {
        {0.1, "0.1"},
        {-0.0, "-0"},
        {1.0, "1"},
        {1e-300, "1e-300"},
        {5e-324, "4.94065645841247e-324"},
        {DBL_MAX, "1.7976931348623157e+308"},
        {DBL_MIN, "2.2250738585072014e-308"},
        {1.5e300, "1.5e+300"},
        {0.30000000000000004, "0.30000000000000004"},
        {1.0 / 3.0, "0.3333333333333333"},
    };
    for (size_t i = 0; i < sizeof doubles / sizeof doubles[0]; i++) {
        llmt_jw_init(&w);
        llmt_jw_double(&w, doubles[i].v);
        assert_string_equal(finish_ok(&w), doubles[i].text);
        llmt_jw_free(&w);
    }
}

/* Runs one writer misuse and checks the status and message; the failure is
 * then kept by the writer. */
static void expect_misuse(llmt_jw *w, int rc, int expected, const char *why)
{
    assert_int_equal(rc, expected);
    assert_contains(llmt_error_last(), why);
    const char *text;
    size_t len;
    assert_int_equal(llmt_jw_null(w), expected);  /* sticky */
    assert_int_equal(llmt_jw_finish(w, &text, &len), expected);
    llmt_jw_free(w);
    llmt_jw_init(w);
}

static void test_writer_refusals(void **state)
{
    (void)state;
    llmt_jw w;
    llmt_jw_init(&w);
    expect_misuse(&w, llmt_jw_double(&w, NAN), LLMT_EINVAL, "NaN");
    expect_misuse(&w, llmt_jw_double(&w, -INFINITY), LLMT_EINVAL, "infinity");
    expect_misuse(&w, llmt_jw_string(&w, "\xC0\xAF", 2), LLMT_EINVAL, "not valid UTF-8");
    expect_misuse(&w, llmt_jw_string(&w, "\xED\xA0\x80", 3), LLMT_EINVAL, "not valid UTF-8");
    llmt_jw_begin_object(&w);
    expect_misuse(&w, llmt_jw_key(&w, "\xFF", 1), LLMT_EINVAL, "not valid UTF-8");
    expect_misuse(&w, llmt_jw_key(&w, "a", 1), LLMT_EINVAL, "outside an object");
    llmt_jw_begin_array(&w);
    expect_misuse(&w, llmt_jw_key(&w, "a", 1), LLMT_EINVAL, "outside an object");
    llmt_jw_begin_object(&w);
    expect_misuse(&w, llmt_jw_int64(&w, 1), LLMT_EINVAL, "without a key");
    llmt_jw_begin_object(&w);
    llmt_jw_key(&w, "a", 1);
    expect_misuse(&w, llmt_jw_key(&w, "b", 1), LLMT_EINVAL, "right after a key");
    llmt_jw_begin_object(&w);
    llmt_jw_key(&w, "a", 1);
    expect_misuse(&w, llmt_jw_end_object(&w), LLMT_EINVAL, "does not close");
    llmt_jw_begin_array(&w);
    expect_misuse(&w, llmt_jw_end_object(&w), LLMT_EINVAL, "does not close");
    llmt_jw_begin_object(&w);
    expect_misuse(&w, llmt_jw_end_array(&w), LLMT_EINVAL, "does not close");
    expect_misuse(&w, llmt_jw_end_array(&w), LLMT_EINVAL, "does not close");
    llmt_jw_int64(&w, 1);
    expect_misuse(&w, llmt_jw_int64(&w, 2), LLMT_EINVAL, "a second top-level value");
    llmt_jw_begin_array(&w);
    const char *text;
    size_t len;
    expect_misuse(&w, llmt_jw_finish(&w, &text, &len), LLMT_EINVAL, "1 containers still open");
    expect_misuse(&w, llmt_jw_finish(&w, &text, &len), LLMT_EINVAL, "no value written");

    for (int i = 0; i < LLMT_JW_MAX_DEPTH; i++)
        assert_int_equal(llmt_jw_begin_array(&w), LLMT_OK);
    expect_misuse(&w, llmt_jw_begin_array(&w), LLMT_EINVAL, "more than 64 nested");
    llmt_jw_free(&w);
}

static void test_round_trips(void **state)
{
    (void)state;
    const double values[] = {0.1, 1e-300, 5e-324, DBL_MAX, -0.0, 0.0, DBL_MIN, -DBL_MAX,
                             1.0 / 3.0, 2.0 / 3.0, 123456789.123456789, 1e22, 1e23,
                             9007199254740993.0, 0.1 + 0.2, 4.35, 1e-7, 3 * 5e-324,
                             -2.2250738585072009e-308 /* largest subnormal */};
    const size_t n = sizeof values / sizeof values[0];
    llmt_jw w;
    llmt_jw_init(&w);
    llmt_jw_begin_array(&w);
    for (size_t i = 0; i < n; i++)
        llmt_jw_double(&w, values[i]);
    llmt_jw_end_array(&w);
    const char *text = finish_ok(&w);
    llmt_json *root = parse(text);
    assert_int_equal(llmt_json_len(root), n);
    for (size_t i = 0; i < n; i++) {
        double d;
        assert_int_equal(llmt_json_double(llmt_json_at(root, i), &d), LLMT_OK);
        assert_same_double(d, values[i]);
    }
    llmt_json_free(root);
    llmt_jw_free(&w);

    /* Every ASCII byte and some UTF-8 survive writing and parsing. */
    char s[140];
    size_t len = 0;
    for (int c = 0; c < 128; c++)
        s[len++] = (char)c;
    memcpy(s + len, "\xC3\xA9\xF0\x9F\x98\x80", 6);
    len += 6;
    llmt_jw_init(&w);
    llmt_jw_begin_object(&w);
    llmt_jw_key(&w, s, len);
    llmt_jw_string(&w, s, len);
    llmt_jw_end_object(&w);
    root = parse(finish_ok(&w));
    const char *key;
    size_t key_len, value_len;
    const char *value = llmt_json_string(llmt_json_member(root, 0, &key, &key_len), &value_len);
    assert_int_equal(key_len, len);
    assert_memory_equal(key, s, len);
    assert_int_equal(value_len, len);
    assert_memory_equal(value, s, len);
    llmt_json_free(root);
    llmt_jw_free(&w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_strings),
        cmocka_unit_test(test_integers),
        cmocka_unit_test(test_doubles),
        cmocka_unit_test(test_literals_and_types),
        cmocka_unit_test(test_tree),
        cmocka_unit_test(test_invalid_documents),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_quote),
        cmocka_unit_test(test_writer_output),
        cmocka_unit_test(test_writer_refusals),
        cmocka_unit_test(test_round_trips),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
