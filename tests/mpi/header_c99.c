/* llmt/comm_mpi.h compiled as C99 with -pedantic -Werror, and run: the
 * adapter's communicator has MPI's rank and size. */
#include <stdio.h>

#include "llmt/comm_mpi.h"

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank = -1, size = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    llmt_comm_mpi *m = NULL;
    int rc = llmt_comm_mpi_create(&m, MPI_COMM_WORLD);
    int ok = rc == LLMT_OK && llmt_comm_rank(m->comm) == rank && llmt_comm_size(m->comm) == size;
    if (!ok)
        fprintf(stderr, "header_c99: rank %d: %s %s\n", rank, llmt_status_string(rc),
                llmt_error_last());
    llmt_comm_mpi_free(m);
    MPI_Finalize();
    return ok ? 0 : 1;
}
