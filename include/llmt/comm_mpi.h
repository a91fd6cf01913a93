/* llmt/comm_mpi.h: an llmt_comm over the host program's MPI.
 *
 * Header-only and compiled in the host program, against the host's own
 * mpi.h: libllmt never links MPI, and MPI_Comm (an int in MPICH, a pointer
 * in Open MPI) never crosses its ABI. Include it after mpi.h is reachable
 * (mpicc, or CMake's MPI::MPI_C) and link the host with MPI and libllmt (a
 * C++ host defines OMPI_SKIP_MPICXX and MPICH_SKIP_MPICXX so mpi.h leaves
 * out MPI's old C++ bindings and their library):
 *
 *     MPI_Init(&argc, &argv);
 *     llmt_comm_mpi *m = NULL;
 *     if (llmt_comm_mpi_create(&m, MPI_COMM_WORLD) != LLMT_OK) ...
 *     llmt_trainer_create_from_config_dist(&tr, ctx, &cfg, m->comm);
 *     ...
 *     llmt_comm_mpi_free(m);  (before MPI_Finalize)
 *
 * The adapter works on a duplicate of the communicator given, with
 * MPI_ERRORS_RETURN set on it: an error the MPI library can report (a bad
 * argument, a peer it sees fail) comes back from the collective as
 * LLMT_ECOMM naming the collective and the rank, where the status in the
 * message is the MPI error code (MPI_Error_string explains it). Many MPI
 * libraries still abort the whole job when a peer process dies (Open MPI's
 * mpirun does, and names the dead rank): the job ends either way.
 *
 * Threads: one llmt_comm_mpi is used by one thread at a time (the
 * collectives share its count arrays), and MPI must be initialised with a
 * thread level that allows the thread using it (MPI_THREAD_SERIALIZED
 * allows any one at a time). */
#ifndef LLMT_COMM_MPI_H
#define LLMT_COMM_MPI_H

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "llmt/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The adapter's state; the host owns it through llmt_comm_mpi_create and
 * llmt_comm_mpi_free. The fields are read-only for the host. */
typedef struct llmt_comm_mpi {
    llmt_comm *comm;   /* the library's communicator: pass this to the library */
    llmt_comm_ops ops; /* the table comm was created from (user points here) */
    MPI_Comm mpi;      /* the duplicate the collectives run on */
    int *ints;         /* 4 * size ints: one call's counts and displacements */
} llmt_comm_mpi;

/* Converts n size_t counts or offsets to ints; nonzero when one does not
 * fit (the library keeps them under 2^30, so only a misuse gets here). */
static inline int llmt_comm_mpi_to_ints_(int *out, const size_t *in, int n)
{
    for (int i = 0; i < n; i++) {
        if (in[i] > (size_t)INT_MAX)
            return 1;
        out[i] = (int)in[i];
    }
    return 0;
}

static inline int llmt_comm_mpi_alltoallv_(void *user, const void *send, const size_t *send_bytes,
                                           const size_t *send_offsets, void *recv,
                                           const size_t *recv_bytes, const size_t *recv_offsets)
{
    llmt_comm_mpi *m = (llmt_comm_mpi *)user;
    const int n = m->ops.size;
    int *sc = m->ints, *sd = sc + n, *rc = sd + n, *rd = rc + n;
    if (llmt_comm_mpi_to_ints_(sc, send_bytes, n) || llmt_comm_mpi_to_ints_(sd, send_offsets, n) ||
        llmt_comm_mpi_to_ints_(rc, recv_bytes, n) || llmt_comm_mpi_to_ints_(rd, recv_offsets, n))
        return MPI_ERR_COUNT;
    return MPI_Alltoallv(send, sc, sd, MPI_BYTE, recv, rc, rd, MPI_BYTE, m->mpi);
}

static inline int llmt_comm_mpi_allgatherv_(void *user, const void *send, void *recv,
                                            const size_t *bytes, const size_t *offsets)
{
    llmt_comm_mpi *m = (llmt_comm_mpi *)user;
    const int n = m->ops.size, me = m->ops.rank;
    int *counts = m->ints, *displs = counts + n;
    if (llmt_comm_mpi_to_ints_(counts, bytes, n) || llmt_comm_mpi_to_ints_(displs, offsets, n))
        return MPI_ERR_COUNT;
    /* The library's in-place form: this rank's piece already lies in recv. */
    if (send == (const void *)((const char *)recv + offsets[me]))
        return MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_BYTE, recv, counts, displs, MPI_BYTE, m->mpi);
    return MPI_Allgatherv(send, counts[me], MPI_BYTE, recv, counts, displs, MPI_BYTE, m->mpi);
}

static inline int llmt_comm_mpi_broadcast_(void *user, void *buf, size_t bytes, int32_t root)
{
    llmt_comm_mpi *m = (llmt_comm_mpi *)user;
    if (bytes > (size_t)INT_MAX)
        return MPI_ERR_COUNT;
    return MPI_Bcast(buf, (int)bytes, MPI_BYTE, (int)root, m->mpi);
}

static inline int llmt_comm_mpi_allreduce_i64_(void *user, int64_t *values, size_t count, int32_t op)
{
    llmt_comm_mpi *m = (llmt_comm_mpi *)user;
    if (count > (size_t)INT_MAX)
        return MPI_ERR_COUNT;
    if (op != LLMT_COMM_SUM && op != LLMT_COMM_MAX)
        return MPI_ERR_OP;
    return MPI_Allreduce(MPI_IN_PLACE, values, (int)count, MPI_INT64_T,
                         op == LLMT_COMM_SUM ? MPI_SUM : MPI_MAX, m->mpi);
}

static inline int llmt_comm_mpi_barrier_(void *user)
{
    return MPI_Barrier(((llmt_comm_mpi *)user)->mpi);
}

/* Releases the adapter: the library's communicator, the duplicate
 * communicator (MPI_Comm_free, collective in MPI's terms: every rank calls
 * it, before MPI_Finalize) and the state. NULL accepted. */
static inline void llmt_comm_mpi_free(llmt_comm_mpi *m)
{
    if (!m)
        return;
    llmt_comm_free(m->comm);
    if (m->mpi != MPI_COMM_NULL)
        MPI_Comm_free(&m->mpi);
    free(m->ints);
    free(m);
}

/* Creates the adapter over comm (duplicated; comm itself is not changed
 * and may be freed afterwards) and the library's communicator over it, in
 * (*out)->comm. Collective over comm: every rank calls it, after MPI_Init.
 * Errors, each with its message in llmt_error_last(): those of
 * llmt_comm_create; LLMT_EINVAL when out is NULL or comm is MPI_COMM_NULL;
 * LLMT_ESTATE when MPI is not initialised (or already finalised);
 * LLMT_ENOMEM; LLMT_ECOMM when MPI refuses to duplicate comm or to set its
 * error handler (with MPI's own description). */
static inline int llmt_comm_mpi_create(llmt_comm_mpi **out, MPI_Comm comm)
{
    llmt_error_clear();
    if (!out)
        return llmt_error_set(LLMT_EINVAL, "llmt_comm_mpi_create: out is NULL");
    *out = NULL;
    if (comm == MPI_COMM_NULL)
        return llmt_error_set(LLMT_EINVAL, "llmt_comm_mpi_create: comm is MPI_COMM_NULL");
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (!initialized || finalized)
        return llmt_error_set(LLMT_ESTATE, finalized ? "llmt_comm_mpi_create: MPI is finalised"
                                                     : "llmt_comm_mpi_create: MPI is not "
                                                       "initialised (call MPI_Init first)");
    llmt_comm_mpi *m = (llmt_comm_mpi *)calloc(1, sizeof *m);
    if (!m)
        return llmt_error_set(LLMT_ENOMEM, "llmt_comm_mpi_create: out of memory");
    m->mpi = MPI_COMM_NULL;
    int size = 0, rank = 0;
    int err = MPI_Comm_dup(comm, &m->mpi);
    if (err == MPI_SUCCESS)
        err = MPI_Comm_set_errhandler(m->mpi, MPI_ERRORS_RETURN);
    if (err == MPI_SUCCESS)
        err = MPI_Comm_size(m->mpi, &size);
    if (err == MPI_SUCCESS)
        err = MPI_Comm_rank(m->mpi, &rank);
    if (err != MPI_SUCCESS) {
        char text[MPI_MAX_ERROR_STRING + 96] = "llmt_comm_mpi_create: MPI cannot duplicate the "
                                               "communicator: ";
        size_t used = strlen(text);
        int len = 0;
        if (MPI_Error_string(err, text + used, &len) != MPI_SUCCESS)
            snprintf(text + used, sizeof text - used, "MPI error %d", err);
        llmt_comm_mpi_free(m);
        return llmt_error_set(LLMT_ECOMM, text);
    }
    m->ints = (int *)calloc(4 * (size_t)size, sizeof *m->ints);
    if (!m->ints) {
        llmt_comm_mpi_free(m);
        return llmt_error_set(LLMT_ENOMEM, "llmt_comm_mpi_create: out of memory");
    }
    llmt_comm_ops ops = LLMT_COMM_OPS_INIT;
    ops.rank = rank;
    ops.size = size;
    ops.user = m;
    ops.alltoallv = llmt_comm_mpi_alltoallv_;
    ops.allgatherv = llmt_comm_mpi_allgatherv_;
    ops.broadcast = llmt_comm_mpi_broadcast_;
    ops.allreduce_i64 = llmt_comm_mpi_allreduce_i64_;
    ops.barrier = llmt_comm_mpi_barrier_;
    m->ops = ops;
    int rc = llmt_comm_create(&m->comm, &m->ops);
    if (rc != LLMT_OK) {
        llmt_comm_mpi_free(m);
        return rc;
    }
    *out = m;
    return LLMT_OK;
}

#ifdef __cplusplus
}
#endif

#endif
