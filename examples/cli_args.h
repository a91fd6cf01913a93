/* cli_args: the strict, table-driven command-line parser of the llmt tools.
 *
 * A tool describes its options in a table and calls cli_parse once:
 *
 *     int64_t steps = -1;
 *     const char *out = "runs/demo";
 *     int resume = 0, no_resume = 0;
 *     cli_option opts[] = {
 *         CLI_OPT_STRING("--out", &out),
 *         CLI_OPT_INT64("--steps", &steps, 0, INT64_MAX),
 *         CLI_OPT_FLAG("--resume", &resume),
 *         CLI_OPT_FLAG("--no-resume", &no_resume),
 *     };
 *     static const char *const exclusive[][2] = {{"--resume", "--no-resume"}};
 *     cli_spec spec = {"llmt-train", usage, opts, 4, exclusive, 1, CLI_ANY_POSITIONAL};
 *     int npos, r = cli_parse(&spec, argc, argv, &npos);
 *     if (r != CLI_OK)
 *         return r == CLI_DONE ? 0 : 2;
 *     // argv[1] .. argv[npos] are the positional arguments, in order.
 *
 * Rules (all errors print one line "PROG: ..." to stderr naming the option
 * and the value, then "Try 'PROG --help'."; cli_parse returns CLI_ERROR):
 * - Options are long names written "--name VALUE" or "--name=VALUE"; a flag
 *   takes no value ("--resume=1" is an error). The value after a separate
 *   "--name" is the next argument unless that begins with "--" (then the
 *   value is missing; "--name=--x" passes such a value).
 * - Unknown options are named, with "did you mean --steps?" when a known
 *   option is within a small edit distance (transpositions count as one).
 * - An option given twice is an error, as is a pair listed as exclusive.
 * - CLI_INT64: base-10 integer, the whole string (no sign other than '-',
 *   no spaces, no "1e3"), within [min, max]; CLI_DOUBLE: strtod over the
 *   whole string, finite, within [min, max]; CLI_STRING: non-empty.
 * - "--help" and "-h" print spec->usage to stdout, "--version" prints
 *   "PROG VERSION" (the library's llmt_version_string()); both return
 *   CLI_DONE (exit 0). They are built in: do not list them in the table.
 * - "--" ends the options: every later argument is positional, as is "-".
 *
 * Destinations are written only for options that are given, so they keep
 * the caller's defaults otherwise; cli_option.given tells which were given.
 * On CLI_ERROR destinations may be partly written. Not thread-safe (it
 * permutes argv). */
#ifndef LLMT_CLI_ARGS_H
#define LLMT_CLI_ARGS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef enum cli_kind {
    CLI_FLAG,   /* no value; *dest.flag = 1 */
    CLI_STRING, /* *dest.string = the argument (borrowed from argv) */
    CLI_INT64,  /* *dest.i64, within [int_min, int_max] */
    CLI_DOUBLE  /* *dest.f64, within [min, max] */
} cli_kind;

typedef struct cli_option {
    const char *name; /* "--steps": with its leading dashes */
    cli_kind kind;
    union {
        int *flag;
        const char **string;
        int64_t *i64;
        double *f64;
    } dest;
    int64_t int_min, int_max; /* CLI_INT64 bounds, inclusive */
    double min, max;          /* CLI_DOUBLE bounds, inclusive */
    int given;                /* set by cli_parse: 1 when the option was given */
} cli_option;

/* Table entries; the pointer types are checked by the compiler. */
#define CLI_OPT_FLAG(n, p) {.name = (n), .kind = CLI_FLAG, .dest.flag = (p)}
#define CLI_OPT_STRING(n, p) {.name = (n), .kind = CLI_STRING, .dest.string = (p)}
#define CLI_OPT_INT64(n, p, lo, hi) \
    {.name = (n), .kind = CLI_INT64, .dest.i64 = (p), .int_min = (lo), .int_max = (hi)}
#define CLI_OPT_DOUBLE(n, p, lo, hi) \
    {.name = (n), .kind = CLI_DOUBLE, .dest.f64 = (p), .min = (lo), .max = (hi)}

/* max_positional: how many positional arguments the tool takes. */
#define CLI_ANY_POSITIONAL (-1)

typedef struct cli_spec {
    const char *prog;             /* the tool's name, first word of every message */
    void (*usage)(FILE *f);       /* prints the usage text (for --help) */
    cli_option *options;          /* the table; cli_parse sets .given */
    size_t num_options;
    const char *const (*exclusive)[2]; /* pairs of option names not to be given together */
    size_t num_exclusive;
    int max_positional; /* CLI_ANY_POSITIONAL, or the most allowed (0: none) */
} cli_spec;

enum {
    CLI_OK = 0,   /* parsed: go on */
    CLI_DONE = 1, /* --help or --version was printed: exit with status 0 */
    CLI_ERROR = 2 /* a usage error was printed: exit with status 2 */
};

/* Parses argv[1..argc-1] against spec. On CLI_OK, *num_positional receives
 * the number of positional arguments, which are moved, in their order, to
 * argv[1] .. argv[*num_positional]. Returns CLI_OK, CLI_DONE or CLI_ERROR
 * (see above). */
int cli_parse(cli_spec *spec, int argc, char **argv, int *num_positional);

/* The option of the table named name (with its dashes), or NULL. */
cli_option *cli_find(const cli_spec *spec, const char *name);

/* Whether the option named name was given (0 for a name not in the table). */
int cli_given(const cli_spec *spec, const char *name);

#endif
