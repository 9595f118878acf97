/* An MPI program for the Slurm test cluster: every rank prints where it runs and the sum of
 * all ranks from an MPI_Allreduce, so that a script checks that `srun --mpi=pmix` wired the
 * ranks of several nodes together (each line must say sum = size * (size - 1) / 2).
 *
 * usage: mpi_hello          prints "mpi_hello: rank R/S on HOST sum=N" per rank */
#include <mpi.h>
#include <stdio.h>

#include "banned.h"

int main(int argc, char **argv)
{
    char host[MPI_MAX_PROCESSOR_NAME];
    int rank = 0, size = 0, len = 0, sum = 0;

    if (MPI_Init(&argc, &argv) != MPI_SUCCESS) {
        fprintf(stderr, "mpi_hello: MPI_Init failed\n");
        return 1;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Get_processor_name(host, &len);
    if (MPI_Allreduce(&rank, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD) != MPI_SUCCESS) {
        fprintf(stderr, "mpi_hello: rank %d: MPI_Allreduce failed\n", rank);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    printf("mpi_hello: rank %d/%d on %s sum=%d\n", rank, size, host, sum);
    fflush(stdout);
    MPI_Finalize();
    return 0;
}
