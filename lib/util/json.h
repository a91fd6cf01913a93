/* A strict, bounded JSON parser (RFC 8259) into a read-only tree, and a small
 * JSON writer. Internal: used for safetensors headers and checkpoint manifests.
 *
 * Parsing accepts exactly one value with only whitespace (space, tab, CR, LF)
 * around it and refuses, with LLMT_ECORRUPT and a message "JSON at byte N:
 * ..." (N counted from 0): trailing commas, comments, NaN/Infinity, leading
 * zeros, single quotes, control characters in strings, invalid escapes, lone
 * surrogates, invalid UTF-8 (overlong forms, surrogates, above U+10FFFF), a
 * byte order mark, duplicate keys in one object (compared after decoding) and
 * anything past the caller's limits. Strings are decoded to UTF-8 and may
 * contain U+0000, so their length is always given.
 *
 * Numbers keep their text. A number is an integer when written without a
 * fraction or an exponent ("1.0" and "1e3" are not integers); the integer
 * getters fail on anything else and on values out of range, exactly.
 *
 * Numbers are converted with strtod and written with snprintf, so LC_NUMERIC
 * must use '.' as decimal point (the C locale, the default of a C program). */
#ifndef LLMT_UTIL_JSON_H
#define LLMT_UTIL_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Value types; llmt_json_type() returns one of them, or -1 for NULL. */
enum {
    LLMT_JSON_NULL,
    LLMT_JSON_BOOL,
    LLMT_JSON_NUMBER,
    LLMT_JSON_STRING,
    LLMT_JSON_ARRAY,
    LLMT_JSON_OBJECT
};

/* Hard cap on llmt_json_limits.max_depth: the parser recurses once per level. */
#define LLMT_JSON_MAX_DEPTH 512

/* What a parse may consume; every field must be set (0 allows nothing). */
typedef struct llmt_json_limits {
    size_t max_depth;        /* nesting of arrays and objects: "1" is 0, "[]" is 1, "[{}]" 2 */
    size_t max_input_bytes;  /* length of the text */
    size_t max_string_bytes; /* decoded bytes of one string or key */
    size_t max_nodes;        /* values in the document, containers included */
} llmt_json_limits;

/* A value of a parsed document. The whole tree lives in one allocation owned
 * by the root; every pointer the accessors return is valid until it is freed. */
typedef struct llmt_json llmt_json;

/* Parses text[0, len) under lim into a tree written to *out (NULL on failure).
 * LLMT_ECORRUPT for invalid or over-limit input, LLMT_EINVAL for bad
 * arguments, LLMT_ENOMEM. Memory: 56 bytes per value plus the decoded
 * strings, allocated only once the text has been validated, and while
 * parsing up to 16 bytes per array or object. */
int llmt_json_parse(const char *text, size_t len, const llmt_json_limits *lim, llmt_json **out);

/* Frees a tree returned by llmt_json_parse (only its root); accepts NULL. */
void llmt_json_free(llmt_json *root);

/* LLMT_JSON_* type of v, or -1 when v is NULL. */
int llmt_json_type(const llmt_json *v);

/* Elements of an array or members of an object; 0 for anything else. */
size_t llmt_json_len(const llmt_json *v);

/* Element i of an array, or NULL when v is not an array or i is out of range. */
const llmt_json *llmt_json_at(const llmt_json *v, size_t i);

/* Member i of an object in document order: returns the value and sets *key
 * (NUL-terminated) and *key_len; NULL when v is not an object or i is out of
 * range. key and key_len may be NULL. */
const llmt_json *llmt_json_member(const llmt_json *v, size_t i, const char **key,
                                  size_t *key_len);

/* The value of member key (compared as a NUL-terminated string) of object v,
 * or NULL; a linear search. */
const llmt_json *llmt_json_get(const llmt_json *v, const char *key);

/* Decoded bytes of a string (NUL-terminated, may also contain NUL) and their
 * count in *len (may be NULL); NULL when v is not a string. */
const char *llmt_json_string(const llmt_json *v, size_t *len);

/* The text of a number as written (NUL-terminated) and its length in *len
 * (may be NULL); NULL when v is not a number. */
const char *llmt_json_number_text(const llmt_json *v, size_t *len);

/* True when v is a number written as an integer (no fraction, no exponent). */
bool llmt_json_is_integer(const llmt_json *v);

/* The integer v into *out; LLMT_ECORRUPT when v is not an integer number or
 * is outside int64 ("-0" is 0). */
int llmt_json_int64(const llmt_json *v, int64_t *out);

/* The integer v into *out; LLMT_ECORRUPT when v is not an integer number or
 * is outside uint64 ("-0" is 0). */
int llmt_json_uint64(const llmt_json *v, uint64_t *out);

/* The number v rounded to the nearest double (any number, integer or not;
 * values below the smallest subnormal round to zero); LLMT_ECORRUPT when v
 * is not a number or its magnitude rounds beyond DBL_MAX. */
int llmt_json_double(const llmt_json *v, double *out);

/* The boolean v into *out; LLMT_ECORRUPT when v is not true or false. */
int llmt_json_bool(const llmt_json *v, bool *out);

/* True when s[0, len) is valid UTF-8 (RFC 3629). */
bool llmt_utf8_valid(const char *s, size_t len);

/* Capacity for llmt_json_quote buffers that show a name in a message. */
#define LLMT_JSON_QUOTE_CAP 128

/* Writes s[0, len) into buf (cap >= 16) as a double-quoted string for error
 * messages: quotes, backslashes, control and invalid UTF-8 bytes escaped,
 * cut with "..." to fit. Returns buf. */
const char *llmt_json_quote(char *buf, size_t cap, const char *s, size_t len);

/* The writer: builds compact JSON text in a growing buffer. Commas are
 * automatic, and the calls are checked against JSON's structure (a key only
 * where an object expects one, one top-level value, at most
 * LLMT_JW_MAX_DEPTH levels). Strings and keys must be valid UTF-8; anything
 * else is refused with LLMT_EINVAL rather than altered. The first failure is
 * kept: every later call returns it, so a sequence can be checked once, at
 * llmt_jw_finish. Out of memory is LLMT_ENOMEM. */
#define LLMT_JW_MAX_DEPTH 64

typedef struct llmt_jw {
    char *buf;        /* text so far, NUL-terminated when cap > 0 */
    size_t len, cap;
    int status;       /* first failure, or LLMT_OK */
    size_t depth;     /* open containers */
    unsigned char state[LLMT_JW_MAX_DEPTH + 1]; /* per level: what may come next */
} llmt_jw;

/* Starts an empty writer. */
void llmt_jw_init(llmt_jw *w);

/* Releases the writer's buffer (the text from llmt_jw_finish with it). */
void llmt_jw_free(llmt_jw *w);

/* Opens an object. */
int llmt_jw_begin_object(llmt_jw *w);

/* Closes the innermost object; refused after a key that has no value. */
int llmt_jw_end_object(llmt_jw *w);

/* Opens an array. */
int llmt_jw_begin_array(llmt_jw *w);

/* Closes the innermost array. */
int llmt_jw_end_array(llmt_jw *w);

/* Writes an object key (len bytes of UTF-8, may contain NUL); the next call
 * writes its value. */
int llmt_jw_key(llmt_jw *w, const char *s, size_t len);

/* llmt_jw_key of a NUL-terminated key. */
int llmt_jw_keyz(llmt_jw *w, const char *key);

/* Writes a string value (len bytes of UTF-8, may contain NUL), escaping '"',
 * '\' and control characters; other characters are written as they are. */
int llmt_jw_string(llmt_jw *w, const char *s, size_t len);

/* Writes a signed integer. */
int llmt_jw_int64(llmt_jw *w, int64_t v);

/* Writes an unsigned integer. */
int llmt_jw_uint64(llmt_jw *w, uint64_t v);

/* Writes a finite double as the shortest of "%.15g", "%.16g", "%.17g" that
 * reads back as the same double (so it round-trips bit-exactly, -0 as "-0");
 * NaN and infinities are refused with LLMT_EINVAL. */
int llmt_jw_double(llmt_jw *w, double v);

/* Writes true or false. */
int llmt_jw_bool(llmt_jw *w, bool v);

/* Writes null. */
int llmt_jw_null(llmt_jw *w);

/* Checks that exactly one complete value was written and gives its text
 * (NUL-terminated, owned by w) and length; or returns the kept failure. */
int llmt_jw_finish(llmt_jw *w, const char **text, size_t *len);

#endif
