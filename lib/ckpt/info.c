/* llmt_ckpt_get_info: what a checkpoint's MANIFEST says of it, the manifest
 * checked (its checksum, its step) but not the files it lists. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ckpt/store_internal.h"
#include "core/error.h"

/* Copies what info holds of m. */
static void fill(llmt_ckpt_info *info, const llmt_manifest *m)
{
    uint32_t version = info->version;
    memset(info, 0, sizeof *info);
    info->version = version;
    info->step = m->step;
    info->epoch = m->epoch;
    info->tokens_seen = m->tokens_seen;
    info->format_version = (int32_t)m->format;
    snprintf(info->library_version, sizeof info->library_version, "%s", m->library_version);
    info->model = m->model;
    info->has_optimizer = m->has_optimizer != 0;
    info->has_scaler = m->has_scaler != 0;
    info->has_data = m->has_loader != 0;
    info->optimizer_steps = m->has_optimizer ? m->optimizer_steps : 0;
    /* Only format 2 has shards: 0 ranks for a single-file checkpoint. */
    info->world_size = m->format == LLMT_MANIFEST_FORMAT_SHARDED ? m->world_size : 0;
    info->num_files = m->n_files + info->world_size;
    for (int i = 0; i < m->n_files; i++)
        info->total_bytes += m->files[i].bytes;
    for (int32_t r = 0; r < info->world_size; r++)
        info->total_bytes += m->shards[r].file.bytes;
}

int llmt_ckpt_get_info(llmt_ckpt_store *s, int64_t step, int32_t tier, llmt_ckpt_info *info)
{
    const char *fn = "llmt_ckpt_get_info";
    if (!s || !info)
        return llmt_fail(LLMT_EINVAL, "%s: %s is NULL", fn, !s ? "store" : "info");
    if (info->version != LLMT_CKPT_INFO_VERSION)
        return llmt_fail(LLMT_EVERSION, "%s: info->version = %u, this library knows %u", fn,
                         info->version, LLMT_CKPT_INFO_VERSION);
    if ((tier != LLMT_CKPT_DURABLE && tier != LLMT_CKPT_FAST) || !s->dir[tier])
        return llmt_fail(LLMT_EINVAL, "%s: tier = %d is not a tier of this store", fn, tier);
    if (step < 0)
        return llmt_fail(LLMT_EINVAL, "%s: step = %lld is negative", fn, (long long)step);
    LLMT_TRY(llmt_ckpt_join(s));
    char *dir = llmt_ckpt_file(s, tier, step, NULL);
    if (!dir)
        return llmt_fail(LLMT_ENOMEM, "%s: out of memory", fn);
    /* A checkpoint is a directory (docs/checkpoint-format.md): anything else
     * of that name is not one, as llmt_ckpt_list has it. */
    struct stat st;
    int rc = LLMT_OK;
    if (lstat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        char name[64];
        llmt_ckpt_dirname(name, sizeof name, step);
        rc = llmt_fail(LLMT_ENOTFOUND, "%s: no checkpoint %s in %s", fn, name, s->dir[tier]);
    }
    llmt_manifest m;
    memset(&m, 0, sizeof m);
    if (!rc)
        rc = llmt_ckpt_read_manifest(s, step, tier, &m);
    if (!rc)
        fill(info, &m);
    llmt_manifest_clear(&m);
    free(dir);
    return rc;
}
