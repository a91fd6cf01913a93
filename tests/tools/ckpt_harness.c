/* The process the crash test kills: trains the fixture model to a fixed step
 * count, resuming from the newest valid checkpoint when there is one, saving
 * to the fast tier (async) every step and the durable tier (sync) every 3rd,
 * and at the end writes the whole final state to OUT.
 *
 * Usage: ckpt_harness DATA_DIR STORE_DIR FAST_DIR TOTAL_STEPS OUT */
#include <stdio.h>
#include <stdlib.h>

#include "llmt/llmt.h"
#include "train_fixture.h"

static void check(int rc, const char *what)
{
    if (rc != LLMT_OK) {
        fprintf(stderr, "ckpt_harness: %s: %s\n", what, llmt_error_last());
        exit(1);
    }
}

int main(int argc, char **argv)
{
    if (argc != 6) {
        fprintf(stderr, "usage: ckpt_harness DATA_DIR STORE_DIR FAST_DIR TOTAL_STEPS OUT\n");
        return 2;
    }
    int total = atoi(argv[4]);
    fixture f;
    fixture_open(&f, argv[1], LLMT_PRECISION_BF16_MIXED, 64);
    llmt_ckpt_store_config sc = LLMT_CKPT_STORE_CONFIG_INIT;
    sc.keep = 3;
    sc.fast_dir = argv[3];
    sc.fast_keep = 2;
    llmt_ckpt_store *s = NULL;
    check(llmt_ckpt_store_open(&s, f.ctx, argv[2], &sc), "open store");
    int64_t step;
    int32_t tier;
    if (llmt_ckpt_latest(s, &step, &tier, NULL, 0) == LLMT_OK) {
        llmt_train_state st = fixture_state(&f);
        check(llmt_ckpt_load(s, step, tier, &st, NULL, 0, NULL), "load");
        f.step = st.step;
        f.tokens_seen = st.tokens_seen;
    }
    while (f.step < total) {
        fixture_train(&f, 1, NULL);
        llmt_train_state st = fixture_state(&f);
        check(llmt_ckpt_save_async(s, &st, LLMT_CKPT_FAST), "fast save");
        if (f.step % 3 == 0)
            check(llmt_ckpt_save(s, &st, LLMT_CKPT_DURABLE), "durable save");
    }
    check(llmt_ckpt_wait(s), "wait");
    size_t len = 0;
    unsigned char *bytes = fixture_state_bytes(&f, &len);
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", argv[5]);
    FILE *out = fopen(tmp, "wb");
    if (!out || fwrite(bytes, 1, len, out) != len || fclose(out) != 0 || rename(tmp, argv[5]) != 0) {
        fprintf(stderr, "ckpt_harness: cannot write %s\n", argv[5]);
        return 1;
    }
    free(bytes);
    llmt_ckpt_store_free(s);
    fixture_close(&f);
    return 0;
}
