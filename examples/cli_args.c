/* cli_args: the strict command-line parser of the llmt tools (cli_args.h). */
#include "cli_args.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include <llmt/llmt.h>

/* Prints "PROG: message" and the hint to stderr; returns CLI_ERROR. */
static int usage_error(const cli_spec *spec, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: ", spec->prog);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\nTry '%s --help'.\n", spec->prog);
    va_end(ap);
    return CLI_ERROR;
}

cli_option *cli_find(const cli_spec *spec, const char *name)
{
    for (size_t i = 0; i < spec->num_options; i++)
        if (!strcmp(spec->options[i].name, name))
            return &spec->options[i];
    return NULL;
}

int cli_given(const cli_spec *spec, const char *name)
{
    const cli_option *o = cli_find(spec, name);
    return o && o->given;
}

/* Optimal string alignment distance (Levenshtein plus adjacent
 * transpositions) between a[0..n) and b[0..m); names are short, so the
 * table is on the stack and longer names count as far apart. */
static size_t edit_distance(const char *a, size_t n, const char *b, size_t m)
{
    enum { MAXLEN = 64 };
    if (n >= MAXLEN || m >= MAXLEN)
        return (size_t)-1;
    size_t d[MAXLEN][MAXLEN];
    for (size_t i = 0; i <= n; i++)
        d[i][0] = i;
    for (size_t j = 0; j <= m; j++)
        d[0][j] = j;
    for (size_t i = 1; i <= n; i++)
        for (size_t j = 1; j <= m; j++) {
            size_t best = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            if (d[i - 1][j] + 1 < best)
                best = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < best)
                best = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
                d[i - 2][j - 2] + 1 < best)
                best = d[i - 2][j - 2] + 1;
            d[i][j] = best;
        }
    return d[n][m];
}

/* The known name closest to the unknown one (len bytes, dashes included),
 * if close enough to be a typo: at most 2 edits, and at most a third of the
 * name. The built-in --help and --version count as known. */
static const char *suggestion(const cli_spec *spec, const char *name, size_t len)
{
    static const char *const builtins[] = {"--help", "--version"};
    const char *best = NULL;
    size_t best_d = (size_t)-1;
    for (size_t i = 0; i < spec->num_options + 2; i++) {
        const char *c = i < spec->num_options ? spec->options[i].name
                                              : builtins[i - spec->num_options];
        size_t d = edit_distance(name, len, c, strlen(c));
        if (d < best_d) {
            best_d = d;
            best = c;
        }
    }
    return best && best_d <= 2 && best_d * 3 <= len ? best : NULL;
}

static int parse_int64(const cli_spec *spec, const cli_option *o, const char *v)
{
    /* strtoll alone would skip spaces and take a '+'; only [-]digits pass. */
    int digits = isdigit((unsigned char)v[0]) || (v[0] == '-' && isdigit((unsigned char)v[1]));
    char *end = NULL;
    errno = 0;
    long long x = digits ? strtoll(v, &end, 10) : 0;
    if (!digits || *end)
        return usage_error(spec, "%s %s: not an integer; expected an integer from %" PRId64
                                 " to %" PRId64, o->name, v, o->int_min, o->int_max);
    if (errno == ERANGE || x < o->int_min || x > o->int_max)
        return usage_error(spec, "%s %s: out of range; expected an integer from %" PRId64
                                 " to %" PRId64, o->name, v, o->int_min, o->int_max);
    *o->dest.i64 = (int64_t)x;
    return CLI_OK;
}

/* Writes x in the fewest significant digits that read back as x, so a
 * bound like nextafter(1, 0) is not shown as 1. */
static void shortest(char *buf, size_t cap, double x)
{
    for (int digits = 1; digits <= 17; digits++) {
        snprintf(buf, cap, "%.*g", digits, x);
        if (strtod(buf, NULL) == x)
            return;
    }
}

static int parse_double(const cli_spec *spec, const cli_option *o, const char *v)
{
    char *end = NULL, lo[32], hi[32];
    errno = 0;
    double x = !v[0] || isspace((unsigned char)v[0]) ? 0 : strtod(v, &end);
    shortest(lo, sizeof lo, o->min);
    shortest(hi, sizeof hi, o->max);
    if (!end || end == v || *end)
        return usage_error(spec, "%s %s: not a number; expected a number from %s to %s",
                           o->name, v, lo, hi);
    if (errno == ERANGE || !isfinite(x) || !(x >= o->min && x <= o->max))
        return usage_error(spec, "%s %s: out of range; expected a number from %s to %s",
                           o->name, v, lo, hi);
    *o->dest.f64 = x;
    return CLI_OK;
}

/* Stores the value v (NULL: none was given) of option o. */
static int set_value(const cli_spec *spec, cli_option *o, const char *v)
{
    if (o->given)
        return usage_error(spec, "%s given twice", o->name);
    o->given = 1;
    if (o->kind == CLI_FLAG) {
        if (v)
            return usage_error(spec, "%s takes no value (got '%s')", o->name, v);
        *o->dest.flag = 1;
        return CLI_OK;
    }
    if (!v)
        return usage_error(spec, "%s needs a value", o->name);
    switch (o->kind) {
    case CLI_STRING:
        if (!v[0])
            return usage_error(spec, "%s needs a non-empty value", o->name);
        *o->dest.string = v;
        return CLI_OK;
    case CLI_INT64:
        return parse_int64(spec, o, v);
    default:
        return parse_double(spec, o, v);
    }
}

int cli_parse(cli_spec *spec, int argc, char **argv, int *num_positional)
{
    int npos = 0, only_positional = 0;
    for (size_t i = 0; i < spec->num_options; i++)
        spec->options[i].given = 0;
    for (int i = 1; i < argc; i++) {
        char *a = argv[i];
        if (only_positional || a[0] != '-' || !a[1]) {
            if (spec->max_positional != CLI_ANY_POSITIONAL && npos >= spec->max_positional)
                return usage_error(spec, "unexpected argument '%s'", a);
            /* argv[1..npos] holds the positionals so far; the options
             * between them and i are consumed, so a can move down. */
            argv[++npos] = a;
            continue;
        }
        if (!strcmp(a, "--")) {
            only_positional = 1;
            continue;
        }
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            spec->usage(stdout);
            return CLI_DONE;
        }
        if (!strcmp(a, "--version")) {
            printf("%s %s\n", spec->prog, llmt_version_string());
            return CLI_DONE;
        }
        const char *eq = strchr(a, '=');
        size_t len = eq ? (size_t)(eq - a) : strlen(a);
        cli_option *o = NULL;
        for (size_t k = 0; k < spec->num_options && !o; k++)
            if (strlen(spec->options[k].name) == len && !strncmp(spec->options[k].name, a, len))
                o = &spec->options[k];
        if (!o && eq && ((len == 6 && !strncmp(a, "--help", 6)) ||
                         (len == 9 && !strncmp(a, "--version", 9))))
            return usage_error(spec, "%.*s takes no value", (int)len, a);
        if (!o) {
            const char *s = suggestion(spec, a, len);
            return usage_error(spec, "unknown option %.*s%s%s%s", (int)len, a,
                               s ? "; did you mean " : "", s ? s : "", s ? "?" : "");
        }
        const char *v = eq ? eq + 1 : NULL;
        if (!eq && o->kind != CLI_FLAG && i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0)
            v = argv[++i];
        int r = set_value(spec, o, v);
        if (r != CLI_OK)
            return r;
    }
    for (size_t k = 0; k < spec->num_exclusive; k++)
        if (cli_given(spec, spec->exclusive[k][0]) && cli_given(spec, spec->exclusive[k][1]))
            return usage_error(spec, "%s and %s cannot be given together", spec->exclusive[k][0],
                               spec->exclusive[k][1]);
    *num_positional = npos;
    return CLI_OK;
}
