/* ZeRO-1 ownership: which range of the flat parameter buffer each rank
 * owns, the buffers a sharded optimizer allocates for it, and which
 * micro-batches a rank runs between exchanges. The optimizer, the trainer
 * and the planner size with these functions. */
#ifndef LLMT_DIST_SHARD_H
#define LLMT_DIST_SHARD_H

#include <stddef.h>
#include <stdint.h>

/* Ranges start and end on multiples of this many elements (except the last
 * end, the buffer's): the gradient norm is summed per granule, so partial
 * sums do not depend on where one rank's range ends. */
#define LLMT_SHARD_GRANULE 4096

/* Bytes of gradient one exchange window moves per rank pair at most is
 * LLMT_EXCHANGE_BYTES / size: the receive buffer stays under this. */
#define LLMT_EXCHANGE_BYTES ((size_t)64 << 20)

/* The range [*first, *end) of num_params elements that rank owns among
 * size ranks: granules split as evenly as they go (ranks may own nothing
 * when there are fewer granules than ranks). */
void llmt_shard_range(int64_t num_params, int32_t size, int32_t rank, int64_t *first,
                      int64_t *end);

/* Elements of one exchange window for size ranks and elem_size-byte
 * gradients (a multiple of LLMT_SHARD_GRANULE, at least one granule). */
int64_t llmt_exchange_window(int32_t size, size_t elem_size);

/* Bytes a sharded optimizer allocates on rank (see llmt_optimizer_sizes for
 * the moments and master weights of `owned` elements): the owner's gradient
 * sum, fp32 whatever grad_size (GRADIENTS), and the exchange receive buffer
 * of grad_size-byte gradients (WORKSPACE). */
void llmt_shard_buffer_sizes(int64_t num_params, int32_t size, int32_t rank, size_t grad_size,
                             size_t *grad_sum_bytes, size_t *recv_bytes);

/* The micro-batches [*first, *end) of a data-parallel step's count that
 * rank runs before its one exchange in fast mode (llmt_reduce_mode):
 * contiguous windows, as even as they go. */
void llmt_fast_window(int32_t count, int32_t size, int32_t rank, int32_t *first, int32_t *end);

/* Whether rank adds no two micro-batches' gradients before an exchange in
 * a data-parallel step of count micro-batches: always in deterministic
 * mode (a round is one micro-batch a rank), in fast mode when its window
 * holds at most one. Then gradients sent from their slots need no host
 * copy (llmt_grads_home_on_demand). */
int llmt_one_micro_per_exchange(int32_t reduce_mode, int32_t count, int32_t size, int32_t rank);

#endif
