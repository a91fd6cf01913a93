/* Creating a model from what a file says of it: a safetensors file whose
 * __metadata__ holds the configuration (llmt_model_save_safetensors and
 * checkpoints write it), a checkpoint directory (its MANIFEST holds the
 * configuration and the checksum of model.safetensors), or a Hugging Face
 * directory (its config.json; hf_import.c). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ckpt/check.h"
#include "ckpt/safetensors.h"
#include "ckpt/store_internal.h"
#include "core/error.h"
#include "model/config_json.h"
#include "model/hf_internal.h"

/* The metadata key holding the model configuration as JSON (as model_io.c). */
#define CONFIG_KEY "llmt.model_config"

/* The configuration in a safetensors file's metadata. */
static int config_of_file(const char *path, llmt_model_config *cfg)
{
    llmt_st_file *f = NULL;
    LLMT_TRY(llmt_st_open(path, NULL, &f));
    const char *text = llmt_st_meta_get(f, CONFIG_KEY);
    int rc = LLMT_OK;
    if (!text) {
        rc = llmt_fail(LLMT_EINVAL, "%s: no \"%s\" in __metadata__: the model's configuration is "
                       "unknown (create the model, then llmt_model_load_safetensors)", path,
                       CONFIG_KEY);
    } else {
        llmt_json *root = NULL;
        const llmt_json_limits lim = {8, strlen(text), 64, 64};
        rc = llmt_json_parse(text, strlen(text), &lim, &root);
        if (!rc)
            rc = llmt_model_config_read_json(root, cfg);
        llmt_json_free(root);
        if (rc)
            rc = llmt_fail_prefix(LLMT_ECORRUPT, "%s: metadata %s", path, CONFIG_KEY);
    }
    llmt_st_close(f);
    return rc;
}

/* The configuration in a checkpoint directory's MANIFEST, and the path of
 * its model.safetensors (malloc'ed) once the directory passes the store's
 * own check of that file (llmt_ckpt_check_dir): the manifest names the
 * directory's step when its name is a checkpoint's, and the weights match
 * the manifest. */
static int config_of_checkpoint(const char *dir, llmt_model_config *cfg, char **weights)
{
    size_t n = strlen(dir) + sizeof CKPT_MODEL_FILE + 1;
    if (!(*weights = malloc(n)))
        return llmt_fail(LLMT_ENOMEM, "%s: out of memory", dir);
    snprintf(*weights, n, "%s/%s", dir, CKPT_MODEL_FILE);
    char label[4200];
    snprintf(label, sizeof label, "checkpoint %s", dir);
    llmt_manifest m;
    int rc = llmt_ckpt_check_dir(dir, label, llmt_ckpt_step_of(dir), 0, &m);
    if (!rc)
        *cfg = m.model;
    llmt_manifest_clear(&m);
    return rc;
}

int llmt_model_create_from_file(llmt_model **out, llmt_context *ctx, const char *path,
                                int32_t precision)
{
    const char *fn = "llmt_model_create_from_file";
    if (!out)
        return llmt_fail(LLMT_EINVAL, "%s: out is NULL", fn);
    *out = NULL;
    if (!ctx || !path)
        return llmt_fail(LLMT_EINVAL, "%s: %s is NULL", fn, ctx ? "path" : "ctx");
    if (precision < -1 || precision > LLMT_PRECISION_BF16_PURE)
        return llmt_fail(LLMT_EINVAL, "%s: precision = %d (-1 for the file's, or an "
                         "llmt_precision)", fn, precision);
    struct stat st;
    if (stat(path, &st) != 0)
        return llmt_fail(LLMT_EIO, "%s: cannot stat: %s", path, strerror(errno));
    llmt_model_config cfg;
    char *weights = NULL;
    int rc;
    if (S_ISDIR(st.st_mode) && llmt_hf_is_model_dir(path)) {
        return llmt_model_create_from_hf(out, ctx, path, precision, NULL, 0);
    } else if (S_ISDIR(st.st_mode)) {
        rc = config_of_checkpoint(path, &cfg, &weights);
    } else if (S_ISREG(st.st_mode)) {
        rc = (weights = strdup(path)) ? config_of_file(path, &cfg)
                                      : llmt_fail(LLMT_ENOMEM, "%s: out of memory", fn);
    } else {
        rc = llmt_fail(LLMT_EIO, "%s: neither a safetensors file nor a checkpoint directory", path);
    }
    if (!rc && precision >= 0)
        cfg.precision = precision;
    llmt_model *m = NULL;
    if (!rc && (rc = llmt_model_create(&m, ctx, &cfg)) != LLMT_OK)
        llmt_fail_prefix(rc, "%s: the configuration it holds", path);
    if (!rc)
        rc = llmt_model_load_safetensors(m, weights);
    free(weights);
    if (rc) {
        llmt_model_free(m);
        return rc;
    }
    *out = m;
    return LLMT_OK;
}
