/* llmt-tokenize: text files to byte-level token shards (docs/data.md).
 *
 *   llmt-tokenize [--out-dir DIR] [--prefix NAME] [--shard-tokens N]
 *                 [--val-fraction F] FILE...
 *   llmt-tokenize --help | --version
 *
 * Each file (a directory stands for the regular files in it, sorted by name,
 * not recursively) is one document: its bytes, then LLMT_TOKEN_EOT. The
 * token stream of all documents, in argument order, is cut into version-1
 * shards of at most N tokens, DIR/NAME_train_000000.bin, ...; with F > 0 the
 * last ceil(F * total) tokens go to DIR/NAME_val_000000.bin, ... instead.
 * The same inputs always give the same shards. Unreadable inputs are skipped
 * with a warning. Exit status: 0 done, 1 failed, 2 bad usage. */
#define _POSIX_C_SOURCE 200809L

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <llmt/llmt.h>

#include "cli_args.h"

#define PROG "llmt-tokenize"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: " PROG " [--out-dir DIR] [--prefix NAME] [--shard-tokens N]\n"
            "                     [--val-fraction F] FILE...\n"
            "Encodes each FILE (a directory: every regular file in it, sorted) as bytes\n"
            "followed by an end-of-text token, and writes token shards (llm.c format,\n"
            "version 1) DIR/NAME_train_000000.bin, ... of at most N tokens; with F > 0\n"
            "the last fraction F of the tokens goes to DIR/NAME_val_000000.bin, ...\n"
            "Defaults: --out-dir . --prefix data --shard-tokens 10000000 --val-fraction 0\n"
            "--version prints the library version; -- ends the options.\n");
}

/* ---- Inputs ---- */

typedef struct inputs {
    char **paths;
    size_t n, cap;
} inputs;

static int add_input(inputs *in, const char *path)
{
    if (in->n == in->cap) {
        size_t cap = in->cap ? 2 * in->cap : 16;
        char **p = realloc(in->paths, cap * sizeof *p);
        if (!p) {
            fprintf(stderr, PROG ": out of memory\n");
            return -1;
        }
        in->paths = p;
        in->cap = cap;
    }
    if (!(in->paths[in->n] = strdup(path))) {
        fprintf(stderr, PROG ": out of memory\n");
        return -1;
    }
    in->n++;
    return 0;
}

static int compare_strings(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Appends the regular files of directory d, sorted by name. */
static int add_directory(inputs *in, const char *d)
{
    DIR *h = opendir(d);
    if (!h) {
        fprintf(stderr, PROG ": warning: skipping directory %s: %s\n", d, strerror(errno));
        return 0;
    }
    char **names = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    struct dirent *e;
    while (!rc && (e = readdir(h))) {
        if (e->d_name[0] == '.' && (!e->d_name[1] || (e->d_name[1] == '.' && !e->d_name[2])))
            continue;
        size_t len = strlen(d) + strlen(e->d_name) + 2;
        char *p = malloc(len);
        if (!p) {
            rc = -1;
            break;
        }
        snprintf(p, len, "%s%s%s", d, d[strlen(d) - 1] == '/' ? "" : "/", e->d_name);
        struct stat st;
        if (stat(p, &st) != 0 || !S_ISREG(st.st_mode)) {
            free(p);
            continue;
        }
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            char **q = realloc(names, cap * sizeof *q);
            if (!q) {
                free(p);
                rc = -1;
                break;
            }
            names = q;
        }
        names[n++] = p;
    }
    closedir(h);
    if (rc)
        fprintf(stderr, PROG ": out of memory\n");
    if (!rc && n) {
        qsort(names, n, sizeof *names, compare_strings);
        for (size_t i = 0; i < n && !rc; i++)
            rc = add_input(in, names[i]);
    }
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
    return rc;
}

/* ---- Output ---- */

/* Prints the shards of one split: all full but the last. */
static void report_split(const char *dir, const char *prefix, const char *split, uint32_t shards,
                         uint64_t tokens, uint64_t shard_tokens)
{
    for (uint32_t i = 0; i < shards; i++)
        printf("wrote %s/%s_%s_%06u.bin: %" PRIu64 " tokens\n", dir, prefix, split, i,
               i + 1 < shards ? shard_tokens : tokens - (uint64_t)i * shard_tokens);
    char path[4096];
    snprintf(path, sizeof path, "%s/%s_%s_%06u.bin", dir, prefix, split, shards);
    if (access(path, F_OK) == 0) /* a shard of an earlier run would follow the last one */
        fprintf(stderr,
                PROG ": warning: %s is left from an earlier run and is not part of this "
                     "output; remove it before loading %s/%s_%s_*.bin\n",
                path, dir, prefix, split);
}

int main(int argc, char **argv)
{
    const char *out_dir = ".", *prefix = "data";
    int64_t shard_tokens = 10000000;
    double val_fraction = 0;
    inputs in = {0}, files = {0};
    int status = 1;

    cli_option opts[] = {
        CLI_OPT_STRING("--out-dir", &out_dir),
        CLI_OPT_STRING("--prefix", &prefix),
        CLI_OPT_INT64("--shard-tokens", &shard_tokens, 1, INT32_MAX),
        CLI_OPT_DOUBLE("--val-fraction", &val_fraction, 0, nextafter(1.0, 0.0)), /* [0, 1) */
    };
    cli_spec spec = {PROG, usage, opts, sizeof opts / sizeof *opts, NULL, 0, CLI_ANY_POSITIONAL};
    int npos = 0, parsed = cli_parse(&spec, argc, argv, &npos);
    if (parsed != CLI_OK)
        return parsed == CLI_DONE ? 0 : 2;
    for (int i = 1; i <= npos; i++)
        if (add_input(&in, argv[i]))
            goto out;
    if (strchr(prefix, '/')) {
        fprintf(stderr, PROG ": --prefix '%s': a name, not a path\n", prefix);
        status = 2;
        goto out;
    }
    if (!in.n) {
        fprintf(stderr, PROG ": no input files\n");
        usage(stderr);
        status = 2;
        goto out;
    }

    /* Directories become their files; every input is opened once to learn
     * its size, and unreadable ones are dropped with a warning. */
    for (size_t i = 0; i < in.n; i++) {
        struct stat st;
        if (stat(in.paths[i], &st) == 0 && S_ISDIR(st.st_mode)) {
            if (add_directory(&files, in.paths[i]))
                goto out;
        } else if (add_input(&files, in.paths[i])) {
            goto out;
        }
    }
    size_t kept = 0;
    for (size_t i = 0; i < files.n; i++) {
        int fd = open(files.paths[i], O_RDONLY);
        struct stat st;
        const char *why = fd < 0 || fstat(fd, &st) != 0 ? strerror(errno)
                          : !S_ISREG(st.st_mode)        ? "not a regular file"
                                                        : NULL;
        if (fd >= 0)
            close(fd);
        if (why) {
            fprintf(stderr, PROG ": warning: skipping %s: %s\n", files.paths[i], why);
            free(files.paths[i]);
            continue;
        }
        files.paths[kept++] = files.paths[i];
    }
    files.n = kept;
    if (!kept) {
        fprintf(stderr, PROG ": no readable input\n");
        goto out;
    }
    llmt_tokenize_report r = LLMT_TOKENIZE_REPORT_INIT;
    if (llmt_byte_tokenize_files((const char *const *)files.paths, files.n, out_dir, prefix,
                                 (uint64_t)shard_tokens, val_fraction, &r) != LLMT_OK) {
        fprintf(stderr, PROG ": %s\n", llmt_error_last());
        goto out;
    }
    report_split(out_dir, prefix, "train", r.train_shards, r.train_tokens, (uint64_t)shard_tokens);
    report_split(out_dir, prefix, "val", r.val_shards, r.val_tokens, (uint64_t)shard_tokens);
    printf("%zu files, %" PRIu64 " bytes, %" PRIu64 " tokens: train %" PRIu64
           " tokens in %u shards, val %" PRIu64 " tokens in %u shards\n",
           files.n, r.bytes, r.train_tokens + r.val_tokens, r.train_tokens, r.train_shards,
           r.val_tokens, r.val_shards);
    status = 0;

out:
    for (size_t i = 0; i < files.n; i++)
        free(files.paths[i]);
    free(files.paths);
    for (size_t i = 0; i < in.n; i++)
        free(in.paths[i]);
    free(in.paths);
    return status;
}
