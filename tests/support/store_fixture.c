/* The checkpoint tests' directories and store (store_fixture.h). */
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "store_fixture.h"
#include "train_fixture.h"
#include "util/fsutil.h"

int store_dirs_create(store_dirs *d, const char *name)
{
    snprintf(d->root, sizeof d->root, "/tmp/llmt-%s-XXXXXX", name);
    if (!mkdtemp(d->root))
        return -1;
    snprintf(d->data, sizeof d->data, "%s/data", d->root);
    snprintf(d->store, sizeof d->store, "%s/ckpt", d->root);
    snprintf(d->fast, sizeof d->fast, "%s/fast", d->root);
    if (mkdir(d->data, 0755) != 0)
        return -1;
    fixture_write_shards(d->data);
    return 0;
}

int store_dirs_remove(const store_dirs *d)
{
    chmod(d->store, 0755); /* a read-only test may have left it so */
    return llmt_remove_tree(d->root);
}

llmt_ckpt_store *store_dirs_open(const store_dirs *d, llmt_context *ctx, int keep, int with_fast)
{
    llmt_ckpt_store_config sc = LLMT_CKPT_STORE_CONFIG_INIT;
    sc.keep = keep;
    sc.sync = 0;
    sc.fast_dir = with_fast ? d->fast : NULL;
    llmt_ckpt_store *s = NULL;
    if (llmt_ckpt_store_open(&s, ctx, d->store, &sc) != LLMT_OK) {
        fprintf(stderr, "store_dirs_open %s: %s\n", d->store, llmt_error_last());
        abort();
    }
    return s;
}
