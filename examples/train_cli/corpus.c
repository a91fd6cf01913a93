/* llmt-train's default corpus: the licence texts every Debian system has,
 * tokenized byte-level into the run directory once. */
#define _DEFAULT_SOURCE
#include <glob.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "train_cli.h"

/* Every regular file (not a link: the links repeat texts) of
 * /usr/share/common-licenses and every /usr/share/doc/x/copyright, sorted
 * as glob sorts them: the first *kept entries of g->gl_pathv. The others
 * are swapped behind them, not dropped, and gl_pathc is left whole, so
 * that globfree frees every entry. */
static int corpus_files(glob_t *g, size_t *kept)
{
    memset(g, 0, sizeof *g);
    glob("/usr/share/common-licenses/*", 0, NULL, g);
    glob("/usr/share/doc/*/copyright", GLOB_APPEND, NULL, g);
    *kept = 0;
    for (size_t i = 0; i < g->gl_pathc; i++) {
        struct stat st;
        if (lstat(g->gl_pathv[i], &st) == 0 && S_ISREG(st.st_mode)) {
            char *path = g->gl_pathv[i];
            g->gl_pathv[i] = g->gl_pathv[*kept];
            g->gl_pathv[(*kept)++] = path;
        }
    }
    return *kept ? 0 : -1;
}

int prepare_default_corpus(const char *out)
{
    char data[4096], ready[4200];
    snprintf(data, sizeof data, "%s/data", out);
    snprintf(ready, sizeof ready, "%s/READY", data);
    if (access(ready, F_OK) == 0)
        return 0;
    glob_t g;
    size_t kept;
    if (corpus_files(&g, &kept)) {
        globfree(&g);
        fprintf(stderr, PROG ": no text found under /usr/share/common-licenses or /usr/share/doc\n");
        return -1;
    }
    llmt_tokenize_report r = LLMT_TOKENIZE_REPORT_INIT;
    if (llmt_byte_tokenize_files((const char *const *)g.gl_pathv, kept, data, "text",
                                 10000000, 0.02, &r) != LLMT_OK) {
        globfree(&g);
        fprintf(stderr, PROG ": tokenizing the corpus: %s\n", llmt_error_last());
        return -1;
    }
    printf("tokenized %llu files (%.1f MB of text): %llu training tokens, %llu held out\n",
           (unsigned long long)r.files, (double)r.bytes / 1e6,
           (unsigned long long)r.train_tokens, (unsigned long long)r.val_tokens);
    globfree(&g);
    FILE *f = fopen(ready, "w");
    if (!f || fclose(f) != 0) {
        fprintf(stderr, PROG ": cannot create %s\n", ready);
        return -1;
    }
    return 0;
}

double unigram_entropy(const char *pattern)
{
    glob_t g;
    static double counts[65536];
    double total = 0;
    memset(counts, 0, sizeof counts);
    if (glob(pattern, 0, NULL, &g) != 0)
        return NAN;
    for (size_t i = 0; i < g.gl_pathc; i++) {
        FILE *f = fopen(g.gl_pathv[i], "rb");
        int32_t head[256];
        if (!f || fread(head, 4, 256, f) != 256 || head[1] != LLMT_SHARD_VERSION_U16) {
            if (f)
                fclose(f);
            continue;
        }
        uint16_t tok;
        while (fread(&tok, 2, 1, f) == 1) {
            counts[tok]++;
            total++;
        }
        fclose(f);
    }
    globfree(&g);
    double h = 0;
    for (int i = 0; i < 65536; i++)
        if (counts[i] > 0)
            h -= counts[i] / total * log(counts[i] / total);
    return h;
}
