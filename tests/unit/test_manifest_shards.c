/* The format-2 MANIFEST's shard table (docs/checkpoint-format.md): a real
 * manifest of a 4-rank save (the fuzz corpus's manifest_sharded) parses,
 * and each way of breaking the table that the format refuses is refused,
 * with the trailer checksum recomputed so only the table is at fault. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "test_util.h"

#include "ckpt/manifest.h"
#include "llmt/llmt.h"

#define CORPUS LLMT_SOURCE_DIR "/tests/fuzz/corpus/fuzz_manifest/manifest_sharded"

static char body[1 << 16]; /* the JSON and its newline, without the trailer */

static int setup(void **state)
{
    (void)state;
    FILE *f = fopen(CORPUS, "rb");
    if (!f)
        return -1;
    size_t n = fread(body, 1, sizeof body - 1, f);
    fclose(f);
    body[n] = '\0';
    char *trailer = strstr(body, "\nxxh3:");
    if (!trailer)
        return -1;
    trailer[1] = '\0';
    return 0;
}

/* Parses the body with `from` replaced by `to` (NULL: as it is) and a
 * fresh trailer; returns the status, the message in *why. */
static int parse_with(const char *from, const char *to)
{
    static char text[sizeof body + 64];
    char *at = from ? strstr(body, from) : NULL;
    assert_true(!from || at); /* the pattern is in the corpus manifest */
    size_t n = 0;
    if (at) {
        n = (size_t)(at - body);
        memcpy(text, body, n);
        n += (size_t)snprintf(text + n, sizeof text - n, "%s%s", to, at + strlen(from));
    } else {
        n = (size_t)snprintf(text, sizeof text, "%s", body);
    }
    n += (size_t)snprintf(text + n, sizeof text - n, "xxh3:%016llx\n",
                          (unsigned long long)XXH3_64bits(text, n));
    llmt_manifest m;
    int rc = llmt_manifest_parse(text, n, &m);
    if (!rc)
        llmt_manifest_clear(&m);
    return rc;
}

static void test_as_saved_parses(void **state)
{
    (void)state;
    assert_int_equal(parse_with(NULL, NULL), LLMT_OK);
}

/* Each change must be refused as damage; the message names the table. */
static void test_broken_tables_refused(void **state)
{
    (void)state;
    static const char *const cases[][3] = {
        {"[4096,12288]", "[4100,12288]", "a gap between ranges"},
        {"[12288,16384]", "[12000,16384]", "overlapping ranges"},
        {"\"elements\":20640", "\"elements\":20641", "ranges short of the elements"},
        {"optimizer-00003-of-00004", "optimizer-00003-of-00005", "a file of another world size"},
        {"\"world_size\":4", "\"world_size\":3", "world size 3 with 4 files"},
        {"{\"name\":\"user.bin\"", "{\"name\":\"optimizer-00001-of-00004.safetensors\"",
         "a shard also listed in files"},
        {"\"chunks\":[\"688c69c283d84d34\"]", "\"chunks\":[]", "a chunk list of the wrong length"},
        {"\"range\":[0,4096]", "\"range\":[4096,0]", "a range that ends before it starts"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int rc = parse_with(cases[i][0], cases[i][1]);
        if (rc != LLMT_ECORRUPT)
            fail_msg("%s: status %d (%s), not LLMT_ECORRUPT", cases[i][2], rc, llmt_error_last());
    }
}

/* A per-node fast tier's copy says "per_node": true in the table, and
 * that alone: a false or a number is refused. */
static void test_per_node_flag(void **state)
{
    (void)state;
    static char text[sizeof body + 64];
    const char *from = "\"chunk_bytes\":";
    char *at = strstr(body, from);
    assert_non_null(at);
    size_t n = (size_t)(at - body);
    memcpy(text, body, n);
    n += (size_t)snprintf(text + n, sizeof text - n, "\"per_node\":true,%s", at);
    n += (size_t)snprintf(text + n, sizeof text - n, "xxh3:%016llx\n",
                          (unsigned long long)XXH3_64bits(text, n));
    llmt_manifest m;
    assert_int_equal(llmt_manifest_parse(text, n, &m), LLMT_OK);
    assert_true(m.per_node);
    char *again = NULL;
    size_t len = 0;
    assert_int_equal(llmt_manifest_format(&m, &again, &len), LLMT_OK);
    assert_non_null(strstr(again, "\"per_node\":true"));
    /* Without it: not per node, as every save before the flag existed, and
     * a manifest not per node is formatted without it. */
    m.per_node = 0;
    free(again);
    assert_int_equal(llmt_manifest_format(&m, &again, &len), LLMT_OK);
    assert_null(strstr(again, "per_node"));
    llmt_manifest_clear(&m);
    assert_int_equal(llmt_manifest_parse(again, len, &m), LLMT_OK);
    assert_false(m.per_node);
    llmt_manifest_clear(&m);
    free(again);
    assert_int_equal(parse_with(from, "\"per_node\":false,\"chunk_bytes\":"), LLMT_ECORRUPT);
    assert_int_equal(parse_with(from, "\"per_node\":1,\"chunk_bytes\":"), LLMT_ECORRUPT);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_as_saved_parses),
        cmocka_unit_test(test_broken_tables_refused),
        cmocka_unit_test(test_per_node_flag),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
