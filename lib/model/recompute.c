/* llmt_recompute: a handle on the model's per-layer recompute flags. */
#include <stdlib.h>

#include "core/error.h"
#include "llmt/recompute.h"
#include "model/model_internal.h"

struct llmt_recompute {
    llmt_model *model;
};

int llmt_recompute_create(llmt_recompute **out, llmt_model *model)
{
    if (!out || !model)
        return llmt_fail(LLMT_EINVAL, "llmt_recompute_create: %s is NULL", out ? "model" : "out");
    *out = calloc(1, sizeof **out);
    if (!*out)
        return llmt_fail(LLMT_ENOMEM, "llmt_recompute_create: out of host memory");
    (*out)->model = model;
    return LLMT_OK;
}

void llmt_recompute_free(llmt_recompute *rc)
{
    free(rc);
}

int llmt_recompute_set_layers(llmt_recompute *rc, int32_t first, int32_t count, int32_t policy)
{
    const char *fn = "llmt_recompute_set_layers";
    if (!rc)
        return llmt_fail(LLMT_EINVAL, "%s: rc is NULL", fn);
    int64_t layers = rc->model->dims.layers;
    if (count == -1)
        count = (int32_t)(layers - first);
    if (first < 0 || count < 0 || (int64_t)first + count > layers)
        return llmt_fail(LLMT_EINVAL, "%s: layers [%d, %d + %d) outside the model's 0..%lld", fn,
                         first, first, count, (long long)layers);
    if (policy < 0 || policy > LLMT_RECOMPUTE_MASK)
        return llmt_fail(LLMT_EINVAL, "%s: policy = %d is not a combination of "
                         "llmt_recompute_policy flags", fn, policy);
    for (int32_t l = first; l < first + count; l++)
        rc->model->rc_flags[l] = (uint8_t)policy;
    return LLMT_OK;
}

int32_t llmt_recompute_get_layer(const llmt_recompute *rc, int32_t layer)
{
    if (!rc || layer < 0 || layer >= rc->model->dims.layers)
        return llmt_fail(LLMT_EINVAL, "llmt_recompute_get_layer: %s", rc ? "layer out of range"
                                                                           : "rc is NULL");
    return rc->model->rc_flags[layer];
}

const char *llmt_recompute_policy_name(int32_t policy)
{
    static const char *const names[LLMT_RECOMPUTE_MASK + 1] = {
        "none",          "attn_core",          "ffn_act",          "attn_core+ffn_act",
        "ffn",           "attn_core+ffn",      "ffn_act+ffn",      "attn_core+ffn_act+ffn",
        "full",          "full+attn_core",     "full+ffn_act",     "full+attn_core+ffn_act",
        "full+ffn",      "full+attn_core+ffn", "full+ffn_act+ffn", "full+all"};
    return policy >= 0 && policy <= LLMT_RECOMPUTE_MASK ? names[policy] : "?";
}
