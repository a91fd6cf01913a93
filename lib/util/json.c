/* The strict JSON parser and the JSON writer.
 *
 * The parser walks the text twice with the same code. The first pass
 * validates everything but duplicate keys and counts: values, string bytes,
 * and the items of each container (in the order containers open). The second
 * fills one exactly sized allocation, [root, items of each container...]
 * [decoded strings and number texts]: a container takes the next block of
 * its recorded size when it opens, so its items are contiguous. */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmt/common.h"
#include "core/error.h"
#include "util/format.h"
#include "util/json.h"

struct llmt_json {
    union {
        const char *str;        /* STRING: decoded bytes; NUMBER: its text; NUL-terminated */
        const llmt_json *items; /* ARRAY: elements; OBJECT: member values, document order */
    };
    const char *key;   /* an object member's decoded key, NUL-terminated */
    size_t len;        /* bytes of str, or number of items */
    size_t key_len;
    size_t offset;     /* where the value starts in the text */
    size_t key_offset; /* where an object member's key starts */
    unsigned char type;
    bool flag; /* BOOL: its value; NUMBER: written as an integer */
};

typedef struct parser {
    const unsigned char *s;
    size_t len, pos;
    const llmt_json_limits *lim;
    bool build;         /* second pass: store what the first counted */
    size_t nodes;       /* values met so far */
    size_t str_used;    /* bytes of strings and number texts so far, NULs included */
    size_t *counts;     /* items of each container, in opening order (counting pass) */
    size_t containers;  /* containers opened so far */
    size_t counts_cap;
    size_t max_members; /* the largest object: the sort buffer size */
    llmt_json *tree;    /* build pass: the root, then every container's items */
    size_t used;        /* nodes of tree in use */
    char *strings;      /* build pass: after the nodes, in the same allocation */
    const llmt_json **sorted; /* build pass: one object's members, to find duplicates */
} parser;

__attribute__((format(printf, 2, 3))) static int fail_at(size_t at, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return llmt_fail(LLMT_ECORRUPT, "JSON at byte %zu: %s", at, msg);
}

static int peek(const parser *p)
{
    return p->pos < p->len ? p->s[p->pos] : -1;
}

static bool is_digit(int c)
{
    return c >= '0' && c <= '9';
}

/* The byte at the parser's position for messages: 'x', 0xNN or end of input. */
static const char *describe(const parser *p, char buf[16])
{
    int c = peek(p);
    if (c < 0)
        return "end of input";
    if (c > 0x20 && c < 0x7f)
        snprintf(buf, 16, "'%c'", c);
    else
        snprintf(buf, 16, "byte 0x%02x", (unsigned)c);
    return buf;
}

static void skip_ws(parser *p)
{
    while (p->pos < p->len) {
        unsigned char c = p->s[p->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r')
            break;
        p->pos++;
    }
}

/* Length of the valid UTF-8 sequence at s (a non-ASCII lead byte, avail bytes
 * readable), or 0 when invalid: RFC 3629 forbids overlong forms, surrogates
 * and code points above U+10FFFF, which the second byte's range excludes. */
static size_t utf8_len(const unsigned char *s, size_t avail)
{
    unsigned char c = s[0], lo = 0x80, hi = 0xBF;
    size_t n;
    if (c >= 0xC2 && c <= 0xDF) {
        n = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        lo = c == 0xE0 ? 0xA0 : lo; /* overlong below U+0800 */
        hi = c == 0xED ? 0x9F : hi; /* U+D800..U+DFFF */
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        lo = c == 0xF0 ? 0x90 : lo; /* overlong below U+10000 */
        hi = c == 0xF4 ? 0x8F : hi; /* above U+10FFFF */
    } else {
        return 0;
    }
    if (avail < n || s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < n; i++)
        if ((s[i] & 0xC0) != 0x80)
            return 0;
    return n;
}

bool llmt_utf8_valid(const char *s, size_t len)
{
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < len;) {
        size_t k = u[i] < 0x80 ? 1 : utf8_len(u + i, len - i);
        if (!k)
            return false;
        i += k;
    }
    return true;
}

/* Appends byte b to the string being decoded into dst (NULL when counting);
 * start locates the string for the length-limit message. */
static int put_byte(parser *p, char *dst, size_t *n, unsigned char b, size_t start)
{
    if (*n == p->lim->max_string_bytes)
        return fail_at(start, "string longer than %zu bytes", p->lim->max_string_bytes);
    if (dst)
        dst[*n] = (char)b;
    (*n)++;
    return LLMT_OK;
}

/* Appends code point cp (not a surrogate, at most U+10FFFF) as UTF-8. */
static int put_utf8(parser *p, char *dst, size_t *n, uint32_t cp, size_t start)
{
    unsigned char b[4];
    size_t k;
    if (cp < 0x80) {
        b[0] = (unsigned char)cp;
        k = 1;
    } else if (cp < 0x800) {
        b[0] = (unsigned char)(0xC0 | cp >> 6);
        b[1] = (unsigned char)(0x80 | (cp & 0x3F));
        k = 2;
    } else if (cp < 0x10000) {
        b[0] = (unsigned char)(0xE0 | cp >> 12);
        b[1] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
        b[2] = (unsigned char)(0x80 | (cp & 0x3F));
        k = 3;
    } else {
        b[0] = (unsigned char)(0xF0 | cp >> 18);
        b[1] = (unsigned char)(0x80 | (cp >> 12 & 0x3F));
        b[2] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
        b[3] = (unsigned char)(0x80 | (cp & 0x3F));
        k = 4;
    }
    for (size_t i = 0; i < k; i++) {
        int rc = put_byte(p, dst, n, b[i], start);
        if (rc)
            return rc;
    }
    return LLMT_OK;
}

/* Reads four hex digits at pos into *out; false when they are not there. */
static bool hex4(const parser *p, size_t pos, uint32_t *out)
{
    if (p->len - pos < 4)
        return false;
    uint32_t v = 0;
    for (size_t i = 0; i < 4; i++) {
        unsigned char c = p->s[pos + i];
        uint32_t d;
        if (c >= '0' && c <= '9')
            d = c - '0';
        else if (c >= 'a' && c <= 'f')
            d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F')
            d = c - 'A' + 10;
        else
            return false;
        v = v * 16 + d;
    }
    *out = v;
    return true;
}

/* Decodes the escape at the parser's position (a backslash inside a string). */
static int parse_escape(parser *p, char *dst, size_t *n, size_t start)
{
    static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
    size_t at = p->pos++;
    char cbuf[16];
    int c = peek(p);
    if (c != 'u') {
        const char *hit = c > 0 ? strchr(from, c) : NULL;
        if (!hit)
            return fail_at(at, "invalid escape: backslash followed by %s", describe(p, cbuf));
        p->pos++;
        return put_byte(p, dst, n, (unsigned char)to[hit - from], start);
    }
    uint32_t cp, lo;
    if (!hex4(p, at + 2, &cp))
        return fail_at(at, "invalid \\u escape: expected 4 hex digits");
    p->pos = at + 6;
    if (cp >= 0xD800 && cp <= 0xDBFF) {
        /* A high surrogate must be followed at once by an escaped low one. */
        if (p->len - p->pos < 2 || p->s[p->pos] != '\\' || p->s[p->pos + 1] != 'u' ||
            !hex4(p, p->pos + 2, &lo) || lo < 0xDC00 || lo > 0xDFFF)
            return fail_at(at, "lone surrogate \\u%04" PRIX32, cp);
        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        p->pos += 6;
    } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
        return fail_at(at, "lone surrogate \\u%04" PRIX32, cp);
    }
    return put_utf8(p, dst, n, cp, start);
}

/* Parses the string at the parser's position (its opening quote) into *out
 * (in the build pass) and *out_len. */
static int parse_string(parser *p, const char **out, size_t *out_len)
{
    size_t start = p->pos++;
    char *dst = p->build ? p->strings + p->str_used : NULL;
    size_t n = 0;
    for (;;) {
        if (p->pos >= p->len)
            return fail_at(start, "unterminated string");
        unsigned char c = p->s[p->pos];
        int rc = LLMT_OK;
        if (c == '"') {
            break;
        } else if (c == '\\') {
            rc = parse_escape(p, dst, &n, start);
        } else if (c < 0x20) {
            return fail_at(p->pos, "control character 0x%02x in a string", c);
        } else if (c < 0x80) {
            rc = put_byte(p, dst, &n, c, start);
            p->pos++;
        } else {
            size_t k = utf8_len(p->s + p->pos, p->len - p->pos);
            if (!k)
                return fail_at(p->pos, "invalid UTF-8 byte 0x%02x", c);
            for (size_t i = 0; i < k && !rc; i++)
                rc = put_byte(p, dst, &n, p->s[p->pos + i], start);
            p->pos += k;
        }
        if (rc)
            return rc;
    }
    p->pos++;
    if (dst) {
        dst[n] = '\0';
        *out = dst;
    }
    *out_len = n;
    /* Decoded bytes never outnumber the text's, so this stays below 2 * len. */
    p->str_used += n + 1;
    return LLMT_OK;
}

/* Parses -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)? keeping its text. */
static int parse_number(parser *p, llmt_json *v)
{
    size_t start = p->pos;
    char cbuf[16];
    bool integer = true;
    if (peek(p) == '-')
        p->pos++;
    if (peek(p) == '0') {
        p->pos++;
        if (is_digit(peek(p)))
            return fail_at(p->pos - 1, "leading zero in a number");
    } else if (is_digit(peek(p))) {
        while (is_digit(peek(p)))
            p->pos++;
    } else {
        return fail_at(p->pos, "expected a digit, found %s", describe(p, cbuf));
    }
    if (peek(p) == '.') {
        p->pos++;
        integer = false;
        if (!is_digit(peek(p)))
            return fail_at(p->pos, "expected a digit after '.', found %s", describe(p, cbuf));
        while (is_digit(peek(p)))
            p->pos++;
    }
    if (peek(p) == 'e' || peek(p) == 'E') {
        p->pos++;
        integer = false;
        if (peek(p) == '+' || peek(p) == '-')
            p->pos++;
        if (!is_digit(peek(p)))
            return fail_at(p->pos, "expected a digit in the exponent, found %s",
                           describe(p, cbuf));
        while (is_digit(peek(p)))
            p->pos++;
    }
    size_t n = p->pos - start;
    v->type = LLMT_JSON_NUMBER;
    v->flag = integer;
    v->len = n;
    if (p->build) {
        char *text = p->strings + p->str_used;
        memcpy(text, p->s + start, n);
        text[n] = '\0';
        v->str = text;
    }
    p->str_used += n + 1;
    return LLMT_OK;
}

static int parse_literal(parser *p, llmt_json *v, const char *word, int type, bool flag)
{
    size_t n = strlen(word);
    if (p->len - p->pos < n || memcmp(p->s + p->pos, word, n) != 0)
        return fail_at(p->pos, "invalid literal (expected %s)", word);
    p->pos += n;
    v->type = (unsigned char)type;
    v->flag = flag;
    return LLMT_OK;
}

static int compare_keys(const void *a, const void *b)
{
    const llmt_json *x = *(const llmt_json *const *)a, *y = *(const llmt_json *const *)b;
    int c = memcmp(x->key, y->key, x->key_len < y->key_len ? x->key_len : y->key_len);
    if (c)
        return c;
    if (x->key_len != y->key_len)
        return x->key_len < y->key_len ? -1 : 1;
    return (x->key_offset > y->key_offset) - (x->key_offset < y->key_offset);
}

/* Refuses an object whose n members repeat a key, naming the first
 * repetition in document order. Sorting by (key, offset) puts equal keys
 * together; every member of a run but the first repeats its key. */
static int check_duplicates(parser *p, const llmt_json *members, size_t n)
{
    for (size_t i = 0; i < n; i++)
        p->sorted[i] = &members[i];
    qsort(p->sorted, n, sizeof *p->sorted, compare_keys);
    const llmt_json *dup = NULL;
    for (size_t i = 1; i < n; i++) {
        const llmt_json *a = p->sorted[i - 1], *b = p->sorted[i];
        if (a->key_len == b->key_len && memcmp(a->key, b->key, a->key_len) == 0 &&
            (!dup || b->key_offset < dup->key_offset))
            dup = b;
    }
    if (!dup)
        return LLMT_OK;
    char q[LLMT_JSON_QUOTE_CAP];
    return fail_at(dup->key_offset, "duplicate key %s",
                   llmt_json_quote(q, sizeof q, dup->key, dup->key_len));
}

/* Opens container number k, v: makes room to record it when counting; when
 * building, gives it the next block of the tree, of the size counted, in
 * *block. */
static int open_container(parser *p, size_t k, llmt_json *v, llmt_json **block)
{
    if (p->build) {
        *block = p->tree + p->used;
        v->items = *block;
        p->used += p->counts[k];
        return LLMT_OK;
    }
    if (k == p->counts_cap) {
        size_t cap = k ? 2 * k : 64;
        size_t *counts = cap <= SIZE_MAX / sizeof *counts
                             ? realloc(p->counts, cap * sizeof *counts)
                             : NULL;
        if (!counts)
            return llmt_fail(LLMT_ENOMEM, "llmt_json_parse: out of memory for %zu containers", cap);
        p->counts = counts;
        p->counts_cap = cap;
    }
    return LLMT_OK;
}

/* Closes container number k, v, with its n items: records n when counting,
 * checks the keys when building. */
static int close_container(parser *p, size_t k, llmt_json *v, size_t n)
{
    v->len = n;
    if (!p->build) {
        p->counts[k] = n;
        if (v->type == LLMT_JSON_OBJECT && n > p->max_members)
            p->max_members = n;
        return LLMT_OK;
    }
    return v->type == LLMT_JSON_OBJECT && n > 1 ? check_duplicates(p, v->items, n) : LLMT_OK;
}

static int parse_value(parser *p, size_t depth, llmt_json *v);

/* Parses the array or object at the parser's position into v, which is
 * nested in depth containers. */
static int parse_container(parser *p, size_t depth, llmt_json *v, int type)
{
    const int close = type == LLMT_JSON_OBJECT ? '}' : ']';
    char cbuf[16];
    if (depth >= p->lim->max_depth)
        return fail_at(p->pos, "nesting deeper than %zu levels", p->lim->max_depth);
    v->type = (unsigned char)type;
    p->pos++;
    size_t k = p->containers++, n = 0;
    llmt_json *block = NULL;
    int rc = open_container(p, k, v, &block);
    if (rc)
        return rc;
    skip_ws(p);
    if (peek(p) == close) {
        p->pos++;
        return close_container(p, k, v, n);
    }
    for (;; n++) {
        /* The build pass meets the items the counting pass counted, so
         * item n stays inside the block; the counting pass stores nothing. */
        llmt_json spare;
        llmt_json *item = p->build ? &block[n] : &spare;
        const char *key = NULL;
        size_t key_len = 0, key_at = p->pos;
        if (type == LLMT_JSON_OBJECT) {
            if (peek(p) != '"')
                return fail_at(p->pos, "expected a string key, found %s", describe(p, cbuf));
            rc = parse_string(p, &key, &key_len);
            if (rc)
                return rc;
            skip_ws(p);
            if (peek(p) != ':')
                return fail_at(p->pos, "expected ':' after a key, found %s", describe(p, cbuf));
            p->pos++;
            skip_ws(p);
        }
        rc = parse_value(p, depth + 1, item);
        if (rc)
            return rc;
        item->key = key;
        item->key_len = key_len;
        item->key_offset = key_at;
        skip_ws(p);
        if (peek(p) == close) {
            p->pos++;
            return close_container(p, k, v, n + 1);
        }
        if (peek(p) != ',')
            return fail_at(p->pos, "expected ',' or '%c', found %s", close, describe(p, cbuf));
        size_t comma = p->pos++;
        skip_ws(p);
        if (peek(p) == close)
            return fail_at(comma, "trailing comma");
    }
}

/* Parses the value at the parser's position into v, nested in depth containers. */
static int parse_value(parser *p, size_t depth, llmt_json *v)
{
    char cbuf[16];
    memset(v, 0, sizeof *v);
    v->offset = p->pos;
    if (++p->nodes > p->lim->max_nodes)
        return fail_at(p->pos, "more than %zu values", p->lim->max_nodes);
    int c = peek(p);
    switch (c) {
    case '{':
        return parse_container(p, depth, v, LLMT_JSON_OBJECT);
    case '[':
        return parse_container(p, depth, v, LLMT_JSON_ARRAY);
    case '"':
        v->type = LLMT_JSON_STRING;
        return parse_string(p, &v->str, &v->len);
    case 't':
        return parse_literal(p, v, "true", LLMT_JSON_BOOL, true);
    case 'f':
        return parse_literal(p, v, "false", LLMT_JSON_BOOL, false);
    case 'n':
        return parse_literal(p, v, "null", LLMT_JSON_NULL, false);
    default:
        if (c == '-' || is_digit(c))
            return parse_number(p, v);
        return fail_at(p->pos, "unexpected %s", describe(p, cbuf));
    }
}

static int parse_document(parser *p, llmt_json *root)
{
    char cbuf[16];
    skip_ws(p);
    if (p->pos == p->len)
        return fail_at(p->pos, "no value (empty input)");
    int rc = parse_value(p, 0, root);
    if (rc)
        return rc;
    skip_ws(p);
    if (p->pos != p->len)
        return fail_at(p->pos, "unexpected %s after the value", describe(p, cbuf));
    return LLMT_OK;
}

int llmt_json_parse(const char *text, size_t len, const llmt_json_limits *lim, llmt_json **out)
{
    if (!out)
        return llmt_fail(LLMT_EINVAL, "llmt_json_parse: out is NULL");
    *out = NULL;
    if (!lim || (!text && len))
        return llmt_fail(LLMT_EINVAL, "llmt_json_parse: %s is NULL", lim ? "text" : "lim");
    if (lim->max_depth > LLMT_JSON_MAX_DEPTH)
        return llmt_fail(LLMT_EINVAL, "llmt_json_parse: lim->max_depth = %zu (at most %d)",
                         lim->max_depth, LLMT_JSON_MAX_DEPTH);
    /* The second bound keeps every count below (2 * len), far from overflow. */
    if (len > lim->max_input_bytes || len > SIZE_MAX / 4)
        return fail_at(lim->max_input_bytes, "input of %zu bytes is over the limit of %zu bytes",
                       len, lim->max_input_bytes);

    parser p = {.s = (const unsigned char *)text, .len = len, .lim = lim};
    llmt_json spare;
    int rc = parse_document(&p, &spare);
    size_t *counts = p.counts;
    llmt_json *tree = NULL;
    const llmt_json **sorted = NULL;
    size_t nodes = p.nodes, bytes;
    if (rc)
        goto out;
    if (__builtin_mul_overflow(nodes, sizeof(llmt_json), &bytes) ||
        __builtin_add_overflow(bytes, p.str_used, &bytes)) {
        rc = llmt_fail(LLMT_ENOMEM, "llmt_json_parse: %zu values do not fit in memory", nodes);
        goto out;
    }
    tree = malloc(bytes);
    sorted = p.max_members ? malloc(p.max_members * sizeof *sorted) : NULL;
    if (!tree || (p.max_members && !sorted)) {
        rc = llmt_fail(LLMT_ENOMEM, "llmt_json_parse: out of memory for %zu values", nodes);
        goto out;
    }
    /* The same walk over the same text meets the same counts, so every store
     * lands inside what was allocated. */
    p = (parser){.s = p.s, .len = len, .lim = lim, .build = true, .counts = counts,
                 .tree = tree, .used = 1, .strings = (char *)(tree + nodes), .sorted = sorted};
    rc = parse_document(&p, tree);
out:
    free(counts);
    free(sorted);
    if (rc) {
        free(tree);
        return rc;
    }
    *out = tree;
    return LLMT_OK;
}

void llmt_json_free(llmt_json *root)
{
    free(root);
}

int llmt_json_type(const llmt_json *v)
{
    return v ? v->type : -1;
}

size_t llmt_json_len(const llmt_json *v)
{
    return v && (v->type == LLMT_JSON_ARRAY || v->type == LLMT_JSON_OBJECT) ? v->len : 0;
}

const llmt_json *llmt_json_at(const llmt_json *v, size_t i)
{
    return v && v->type == LLMT_JSON_ARRAY && i < v->len ? &v->items[i] : NULL;
}

const llmt_json *llmt_json_member(const llmt_json *v, size_t i, const char **key,
                                  size_t *key_len)
{
    if (!v || v->type != LLMT_JSON_OBJECT || i >= v->len)
        return NULL;
    const llmt_json *m = &v->items[i];
    if (key)
        *key = m->key;
    if (key_len)
        *key_len = m->key_len;
    return m;
}

const llmt_json *llmt_json_get(const llmt_json *v, const char *key)
{
    if (!v || v->type != LLMT_JSON_OBJECT || !key)
        return NULL;
    size_t n = strlen(key);
    for (size_t i = 0; i < v->len; i++)
        if (v->items[i].key_len == n && memcmp(v->items[i].key, key, n) == 0)
            return &v->items[i];
    return NULL;
}

const char *llmt_json_string(const llmt_json *v, size_t *len)
{
    if (!v || v->type != LLMT_JSON_STRING)
        return NULL;
    if (len)
        *len = v->len;
    return v->str;
}

const char *llmt_json_number_text(const llmt_json *v, size_t *len)
{
    if (!v || v->type != LLMT_JSON_NUMBER)
        return NULL;
    if (len)
        *len = v->len;
    return v->str;
}

bool llmt_json_is_integer(const llmt_json *v)
{
    return v && v->type == LLMT_JSON_NUMBER && v->flag;
}

static const char *type_name(const llmt_json *v)
{
    static const char *const names[] = {"null", "a boolean", "a number",
                                        "a string", "an array", "an object"};
    return v ? names[v->type] : "nothing";
}

/* Fails for v, which is not `expected`. */
static int wrong_type(const llmt_json *v, const char *expected)
{
    if (!v)
        return llmt_fail(LLMT_ECORRUPT, "JSON: expected %s, found nothing", expected);
    return fail_at(v->offset, "expected %s, found %s", expected, type_name(v));
}

/* Fails for number v, which is `why` (its text shown up to 40 bytes). */
static int number_error(const llmt_json *v, const char *why)
{
    int shown = v->len > 40 ? 40 : (int)v->len;
    return fail_at(v->offset, "%.*s%s %s", shown, v->str, v->len > 40 ? "..." : "", why);
}

/* The magnitude of integer number v (sign skipped); false above UINT64_MAX. */
static bool magnitude(const llmt_json *v, uint64_t *out)
{
    uint64_t m = 0;
    for (size_t i = v->str[0] == '-'; i < v->len; i++) {
        unsigned d = (unsigned)(v->str[i] - '0');
        if (m > (UINT64_MAX - d) / 10)
            return false;
        m = m * 10 + d;
    }
    *out = m;
    return true;
}

int llmt_json_int64(const llmt_json *v, int64_t *out)
{
    if (!v || v->type != LLMT_JSON_NUMBER)
        return wrong_type(v, "an integer");
    if (!v->flag)
        return number_error(v, "is not an integer");
    uint64_t m;
    bool negative = v->str[0] == '-';
    /* INT64_MIN's magnitude is INT64_MAX + 1. */
    if (!magnitude(v, &m) || m > (uint64_t)INT64_MAX + negative)
        return number_error(v, "is out of range for int64");
    *out = !negative ? (int64_t)m : m ? -(int64_t)(m - 1) - 1 : 0;
    return LLMT_OK;
}

int llmt_json_uint64(const llmt_json *v, uint64_t *out)
{
    if (!v || v->type != LLMT_JSON_NUMBER)
        return wrong_type(v, "an integer");
    if (!v->flag)
        return number_error(v, "is not an integer");
    uint64_t m;
    if (!magnitude(v, &m) || (v->str[0] == '-' && m != 0))
        return number_error(v, "is out of range for uint64");
    *out = m;
    return LLMT_OK;
}

int llmt_json_double(const llmt_json *v, double *out)
{
    if (!v || v->type != LLMT_JSON_NUMBER)
        return wrong_type(v, "a number");
    /* The text is validated JSON, so strtod reads all of it; it can only
     * return an infinity on overflow. */
    double d = strtod(v->str, NULL);
    if (isinf(d))
        return number_error(v, "is out of range for double");
    *out = d;
    return LLMT_OK;
}

int llmt_json_bool(const llmt_json *v, bool *out)
{
    if (!v || v->type != LLMT_JSON_BOOL)
        return wrong_type(v, "a boolean");
    *out = v->flag;
    return LLMT_OK;
}

const char *llmt_json_quote(char *buf, size_t cap, const char *s, size_t len)
{
    /* Whatever is appended, room stays for "...", the closing quote and NUL. */
    const size_t limit = cap - 5;
    size_t o = 0, i = 0;
    buf[o++] = '"';
    while (i < len) {
        const unsigned char *u = (const unsigned char *)s + i;
        char piece[8];
        size_t k, take = 1;
        if (*u == '"' || *u == '\\') {
            piece[0] = '\\';
            piece[1] = (char)*u;
            k = 2;
        } else if (*u >= 0x20 && *u < 0x7f) {
            piece[0] = (char)*u;
            k = 1;
        } else if (*u >= 0x80 && (take = utf8_len(u, len - i)) != 0) {
            memcpy(piece, u, take);
            k = take;
        } else {
            snprintf(piece, sizeof piece, "\\x%02x", (unsigned)*u);
            k = 4;
            take = 1;
        }
        if (o + k > limit) {
            memcpy(buf + o, "...", 3);
            o += 3;
            break;
        }
        memcpy(buf + o, piece, k);
        o += k;
        i += take;
    }
    buf[o++] = '"';
    buf[o] = '\0';
    return buf;
}

/* The writer's per-level states. JW_TOP is 0, so a zeroed writer is empty. */
enum {
    JW_TOP,          /* top level, nothing written */
    JW_TOP_DONE,     /* top level, the value written */
    JW_ARRAY_FIRST,  /* in an array, no element yet */
    JW_ARRAY_NEXT,   /* in an array, after an element */
    JW_OBJECT_FIRST, /* in an object, no member yet: a key or the end may come */
    JW_OBJECT_NEXT,  /* in an object, after a member: a key or the end may come */
    JW_OBJECT_VALUE  /* in an object, after a key: its value must come */
};

__attribute__((format(printf, 3, 4))) static int jw_fail(llmt_jw *w, int code,
                                                         const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    w->status = llmt_fail(code, "llmt_jw: %s", msg);
    return w->status;
}

/* Appends n bytes, keeping the text NUL-terminated. */
static int jw_put(llmt_jw *w, const char *s, size_t n)
{
    if (n >= w->cap - w->len) {
        size_t cap = w->cap ? w->cap : 256;
        while (cap - w->len <= n) {
            if (cap > SIZE_MAX / 2)
                return jw_fail(w, LLMT_ENOMEM, "text of %zu bytes is too large", w->len);
            cap *= 2;
        }
        char *buf = realloc(w->buf, cap);
        if (!buf)
            return jw_fail(w, LLMT_ENOMEM, "out of memory growing the text to %zu bytes", cap);
        w->buf = buf;
        w->cap = cap;
    }
    if (n)
        memcpy(w->buf + w->len, s, n);
    w->len += n;
    w->buf[w->len] = '\0';
    return LLMT_OK;
}

/* Checks that a value may come next, writes the comma it needs, records it. */
static int jw_before_value(llmt_jw *w)
{
    if (w->status)
        return w->status;
    unsigned char *st = &w->state[w->depth];
    switch (*st) {
    case JW_TOP:
        *st = JW_TOP_DONE;
        return LLMT_OK;
    case JW_ARRAY_FIRST:
        *st = JW_ARRAY_NEXT;
        return LLMT_OK;
    case JW_ARRAY_NEXT:
        return jw_put(w, ",", 1);
    case JW_OBJECT_VALUE:
        *st = JW_OBJECT_NEXT;
        return LLMT_OK;
    case JW_TOP_DONE:
        return jw_fail(w, LLMT_EINVAL, "a second top-level value");
    default:
        return jw_fail(w, LLMT_EINVAL, "a value in an object without a key");
    }
}

/* Writes s as a JSON string; refuses invalid UTF-8. */
static int jw_quoted(llmt_jw *w, const char *s, size_t len)
{
    if (!s && len)
        return jw_fail(w, LLMT_EINVAL, "string is NULL");
    if (!llmt_utf8_valid(s, len))
        return jw_fail(w, LLMT_EINVAL, "string is not valid UTF-8");
    const unsigned char *u = (const unsigned char *)s;
    int rc = jw_put(w, "\"", 1);
    size_t run = 0; /* start of the bytes written as they are */
    for (size_t i = 0; i < len && !rc; i++) {
        if (u[i] >= 0x20 && u[i] != '"' && u[i] != '\\')
            continue;
        char esc[8];
        const char *short_form = strchr("\"\\\b\f\n\r\t", u[i]);
        if (u[i] && short_form)
            snprintf(esc, sizeof esc, "\\%c", "\"\\bfnrt"[short_form - "\"\\\b\f\n\r\t"]);
        else
            snprintf(esc, sizeof esc, "\\u%04x", (unsigned)u[i]);
        rc = jw_put(w, s + run, i - run);
        if (!rc)
            rc = jw_put(w, esc, strlen(esc));
        run = i + 1;
    }
    if (!rc && run < len)
        rc = jw_put(w, s + run, len - run);
    return rc ? rc : jw_put(w, "\"", 1);
}

/* Writes a value given as text. */
static int jw_scalar(llmt_jw *w, const char *text, size_t n)
{
    int rc = jw_before_value(w);
    return rc ? rc : jw_put(w, text, n);
}

/* Opens a container: '{' or '['. */
static int jw_begin(llmt_jw *w, char open, unsigned char state)
{
    int rc = jw_before_value(w);
    if (rc)
        return rc;
    if (w->depth == LLMT_JW_MAX_DEPTH)
        return jw_fail(w, LLMT_EINVAL, "more than %d nested containers", LLMT_JW_MAX_DEPTH);
    rc = jw_put(w, &open, 1);
    if (!rc)
        w->state[++w->depth] = state;
    return rc;
}

/* Closes a container if the innermost level is in one of states a or b. */
static int jw_end(llmt_jw *w, char close, unsigned char a, unsigned char b)
{
    if (w->status)
        return w->status;
    unsigned char st = w->state[w->depth];
    if (w->depth == 0 || (st != a && st != b))
        return jw_fail(w, LLMT_EINVAL, "'%c' does not close an open %s", close,
                       close == '}' ? "object awaiting a key" : "array");
    w->depth--;
    return jw_put(w, &close, 1);
}

void llmt_jw_init(llmt_jw *w)
{
    memset(w, 0, sizeof *w);
}

void llmt_jw_free(llmt_jw *w)
{
    free(w->buf);
    llmt_jw_init(w);
}

int llmt_jw_begin_object(llmt_jw *w)
{
    return jw_begin(w, '{', JW_OBJECT_FIRST);
}

int llmt_jw_end_object(llmt_jw *w)
{
    return jw_end(w, '}', JW_OBJECT_FIRST, JW_OBJECT_NEXT);
}

int llmt_jw_begin_array(llmt_jw *w)
{
    return jw_begin(w, '[', JW_ARRAY_FIRST);
}

int llmt_jw_end_array(llmt_jw *w)
{
    return jw_end(w, ']', JW_ARRAY_FIRST, JW_ARRAY_NEXT);
}

int llmt_jw_key(llmt_jw *w, const char *s, size_t len)
{
    if (w->status)
        return w->status;
    unsigned char *st = &w->state[w->depth];
    if (*st != JW_OBJECT_FIRST && *st != JW_OBJECT_NEXT)
        return jw_fail(w, LLMT_EINVAL, "a key outside an object or right after a key");
    int rc = *st == JW_OBJECT_NEXT ? jw_put(w, ",", 1) : LLMT_OK;
    *st = JW_OBJECT_VALUE;
    if (!rc)
        rc = jw_quoted(w, s, len);
    return rc ? rc : jw_put(w, ":", 1);
}

int llmt_jw_keyz(llmt_jw *w, const char *key)
{
    return llmt_jw_key(w, key, strlen(key));
}

int llmt_jw_string(llmt_jw *w, const char *s, size_t len)
{
    int rc = jw_before_value(w);
    return rc ? rc : jw_quoted(w, s, len);
}

int llmt_jw_int64(llmt_jw *w, int64_t v)
{
    char text[24];
    int n = snprintf(text, sizeof text, "%" PRId64, v);
    return jw_scalar(w, text, (size_t)n);
}

int llmt_jw_uint64(llmt_jw *w, uint64_t v)
{
    char text[24];
    int n = snprintf(text, sizeof text, "%" PRIu64, v);
    return jw_scalar(w, text, (size_t)n);
}

int llmt_jw_double(llmt_jw *w, double v)
{
    if (w->status)
        return w->status;
    if (!isfinite(v))
        return jw_fail(w, LLMT_EINVAL, "%s has no JSON form", isnan(v) ? "NaN" : "an infinity");
    char text[32];
    int n = llmt_format_double(text, v);
    return jw_scalar(w, text, (size_t)n);
}

int llmt_jw_bool(llmt_jw *w, bool v)
{
    return v ? jw_scalar(w, "true", 4) : jw_scalar(w, "false", 5);
}

int llmt_jw_null(llmt_jw *w)
{
    return jw_scalar(w, "null", 4);
}

int llmt_jw_finish(llmt_jw *w, const char **text, size_t *len)
{
    if (w->status)
        return w->status;
    if (w->depth)
        return jw_fail(w, LLMT_EINVAL, "%zu containers still open", w->depth);
    if (w->state[0] != JW_TOP_DONE)
        return jw_fail(w, LLMT_EINVAL, "no value written");
    *text = w->buf;
    *len = w->len;
    return LLMT_OK;
}
