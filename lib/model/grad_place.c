/* Gradient placement: the bucket geometry shared with the planner. */
#include "dist/shard.h"
#include "model/grad_place.h"

int64_t llmt_grad_split(int64_t prefix)
{
    return prefix / LLMT_SHARD_GRANULE * LLMT_SHARD_GRANULE;
}

int32_t llmt_grad_bucket_count(const llmt_model *m)
{
    return (int32_t)m->dims.layers + 2;
}

void llmt_grad_bucket_range(const llmt_model *m, int32_t b, int64_t *start, int64_t *end)
{
    const int64_t L = m->dims.layers;
    /* The embedding is stored first, then each layer, then the tail. */
    *start = b == 0 ? m->embed : b <= L ? m->layer[b - 1].ln1 : m->norm;
    *end = b == 0 ? (L > 0 ? m->layer[0].ln1 : m->norm) : b < L ? m->layer[b].ln1
                                                    : b == L ? m->norm
                                                             : m->num_params;
}

int32_t llmt_grad_bucket_slots(int host_memory)
{
    return host_memory ? 1 : 2;
}

int64_t llmt_grad_slot_elems(const llmt_model *m, int64_t split, int host_memory)
{
    if (split <= 0)
        return 0;
    int64_t most = 0;
    for (int32_t b = 0; b < llmt_grad_bucket_count(m); b++) {
        int64_t s, e;
        llmt_grad_bucket_range(m, b, &s, &e);
        if (s < split && e - s > most)
            most = e - s;
    }
    if (host_memory)
        return most;
    int64_t stats = split < LLMT_GRAD_STATS_CHUNK ? split : LLMT_GRAD_STATS_CHUNK;
    int64_t need = (stats > most ? stats : most) + LLMT_GRAD_BUCKET_PAD;
    return (need + LLMT_GRAD_BUCKET_PAD - 1) / LLMT_GRAD_BUCKET_PAD * LLMT_GRAD_BUCKET_PAD;
}

int64_t llmt_grad_bucket_elems(const llmt_model *m, int64_t split, int host_memory)
{
    return llmt_grad_bucket_slots(host_memory) * llmt_grad_slot_elems(m, split, host_memory);
}
