/* llmt-train's questions about the checkpoints already in its directories,
 * asked through the store (the public API) before the trainer opens them,
 * so that the CLI and the library agree on what a checkpoint is. */
#include <stdio.h>
#include <string.h>

#include "train_cli.h"

/* Opens a store on dir (and fast_dir when not empty); NULL with the message
 * in llmt_error_last() on failure. */
static int open_store(llmt_ckpt_store **s, llmt_context *ctx, const char *dir,
                      const char *fast_dir, int read_only)
{
    llmt_ckpt_store_config sc = LLMT_CKPT_STORE_CONFIG_INIT;
    sc.fast_dir = fast_dir[0] ? fast_dir : NULL;
    sc.read_only = read_only;
    return llmt_ckpt_store_open(s, ctx, dir, &sc);
}

int count_checkpoints(llmt_context *ctx, const char *dir, size_t *count)
{
    *count = 0;
    llmt_ckpt_store *s = NULL;
    int rc = dir[0] ? open_store(&s, ctx, dir, "", 1) : LLMT_ENOTFOUND;
    if (rc == LLMT_ENOTFOUND) /* no such directory: none */
        return 0;
    if (!rc)
        rc = llmt_ckpt_list(s, LLMT_CKPT_DURABLE, NULL, 0, count);
    llmt_ckpt_store_free(s);
    if (rc)
        fprintf(stderr, PROG ": %s: %s\n", dir, llmt_error_last());
    return rc ? -1 : 0;
}

int set_aside_for_start_over(llmt_context *ctx, const char *out, const char *dir,
                             const char *fast_dir)
{
    llmt_ckpt_store *s = NULL;
    int64_t step = -1;
    int32_t tier = 0;
    char notes[4096];
    size_t n = 0;
    int rc = open_store(&s, ctx, dir, fast_dir, 0);
    if (!rc)
        rc = llmt_ckpt_latest(s, &step, &tier, NULL, 0);
    if (rc == LLMT_OK) {
        fprintf(stderr, PROG ": --start-over, but the checkpoint of step %lld in %s is valid: "
                "resume it (leave out --start-over), or choose another --out\n", (long long)step,
                out);
        llmt_ckpt_store_free(s);
        return -1;
    }
    if (rc == LLMT_ECORRUPT) /* checkpoints, none valid: moved aside, kept for inspection */
        rc = llmt_ckpt_set_aside_invalid(s, &n, notes, sizeof notes);
    else if (rc == LLMT_ENOTFOUND)
        rc = LLMT_OK;
    if (!rc && n)
        printf("--start-over: %zu invalid checkpoint%s set aside (renamed step-N.refused-XXXXXX):\n%s",
               n, n == 1 ? "" : "s", notes);
    else if (rc)
        fprintf(stderr, PROG ": --start-over: %s\n", llmt_error_last());
    llmt_ckpt_store_free(s);
    return rc ? -1 : 0;
}
