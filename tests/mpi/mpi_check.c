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
