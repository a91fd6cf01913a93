/* Failure reporting of the MPI tests (mpi_check.h). */
#include <mpi.h>

#include "mpi_check.h"

int rank, size, failures;

void must(int rc, const char *what)
{
    if (rc != LLMT_OK) {
        fprintf(stderr, "rank %d: %s: status %d: %s\n", rank, what, rc, llmt_error_last());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
}

int same_on_all(int64_t v)
{
    int64_t lo = 0, hi = 0;
    MPI_Allreduce(&v, &lo, 1, MPI_INT64_T, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&v, &hi, 1, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
    return lo == hi;
}
