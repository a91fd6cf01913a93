/* llmt-train's NCCL communicator: data-parallel training on the CUDA
 * backend moves device memory, so the library's trainer takes an NCCL
 * communicator made on each rank's context (docs/distributed.md, "CUDA and
 * NCCL"); the launch's MPI communicator only carries the unique id and
 * llmt-train's own agreements (stop signals, failures). */
#include <stdint.h>
#include <stdio.h>

#include "train_cli.h"

/* Agrees whether any rank failed (failed: this one did, with its message
 * printed); a rank that did not fail names the lowest one that did. bounded:
 * a rank may be stuck where the failed one never arrives (launch_max_bounded).
 * 1 when any rank failed, else 0. */
static int any_rank_failed(const launch *l, int failed, int bounded, const char *what)
{
    /* The largest of world - rank over the failed ranks: the lowest of them. */
    int mine = failed ? l->world - l->rank : 0;
    int top = bounded ? launch_max_bounded(l, mine, 1) : launch_max(l, mine);
    if (top > 0 && !failed)
        fprintf(stderr, PROG ": %s failed on rank %d (that rank's message says why)\n", what,
                l->world - top);
    return top != 0;
}

int nccl_comm_create(const launch *l, llmt_context *ctx, int device, llmt_comm **out)
{
    *out = NULL;
    uint8_t id[LLMT_COMM_NCCL_ID_BYTES] = {0};
    int rc = l->rank == 0 ? llmt_comm_nccl_unique_id(ctx, id) : LLMT_OK;
    if (rc)
        fprintf(stderr, PROG ": the NCCL communicator: %s: %s\n", llmt_status_string(rc),
                llmt_error_last());
    if (any_rank_failed(l, rc != LLMT_OK, 0, "making the NCCL unique id"))
        return 1;
    if (launch_broadcast(l, id, sizeof id))
        return 1;
    /* Collective: returns when every rank has joined (NCCL's wait). A rank
     * that fails before joining leaves the others waiting in it: the
     * bounded agreement then ends the job. */
    rc = llmt_comm_create_nccl(out, ctx, id, l->rank, l->world);
    if (rc)
        fprintf(stderr, PROG ": the NCCL communicator (rank %d of %d, device %d): %s: %s\n",
                l->rank, l->world, device, llmt_status_string(rc),
                llmt_error_last());
    if (any_rank_failed(l, rc != LLMT_OK, 1, "creating the NCCL communicator")) {
        llmt_comm_free(*out);
        *out = NULL;
        return 1;
    }
    return 0;
}
