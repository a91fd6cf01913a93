/* ZeRO-1 ownership ranges, the sizes of the buffers that follow, and the
 * micro-batches a rank runs between exchanges. */
#include "dist/shard.h"

#include "llmt/optimizer.h"

void llmt_shard_range(int64_t num_params, int32_t size, int32_t rank, int64_t *first, int64_t *end)
{
    int64_t granules = (num_params + LLMT_SHARD_GRANULE - 1) / LLMT_SHARD_GRANULE;
    int64_t g0 = granules * rank / size, g1 = granules * (rank + 1) / size;
    *first = g0 * LLMT_SHARD_GRANULE < num_params ? g0 * LLMT_SHARD_GRANULE : num_params;
    *end = g1 * LLMT_SHARD_GRANULE < num_params ? g1 * LLMT_SHARD_GRANULE : num_params;
}

int64_t llmt_exchange_window(int32_t size, size_t elem_size)
{
    int64_t w = (int64_t)(LLMT_EXCHANGE_BYTES / (size_t)size / elem_size);
    w -= w % LLMT_SHARD_GRANULE;
    return w > LLMT_SHARD_GRANULE ? w : LLMT_SHARD_GRANULE;
}

void llmt_shard_buffer_sizes(int64_t num_params, int32_t size, int32_t rank, size_t grad_size,
                             size_t *grad_sum_bytes, size_t *recv_bytes)
{
    int64_t first = 0, end = 0;
    llmt_shard_range(num_params, size, rank, &first, &end);
    int64_t owned = end - first, window = llmt_exchange_window(size, grad_size);
    int64_t per_sender = owned < window ? owned : window;
    *grad_sum_bytes = (size_t)owned * sizeof(float);
    *recv_bytes = (size_t)per_sender * (size_t)size * grad_size;
}

void llmt_fast_window(int32_t count, int32_t size, int32_t rank, int32_t *first, int32_t *end)
{
    *first = (int32_t)((int64_t)count * rank / size);
    *end = (int32_t)((int64_t)count * (rank + 1) / size);
}

int llmt_one_micro_per_exchange(int32_t reduce_mode, int32_t count, int32_t size, int32_t rank)
{
    int32_t first = 0, end = 0;
    llmt_fast_window(count, size, rank, &first, &end);
    return reduce_mode != LLMT_REDUCE_FAST || end - first <= 1;
}
