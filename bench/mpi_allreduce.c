/* The anchor of the allreduce benchmark: MPI_Allreduce (sum of floats, in place) timed over
 * the same sizes and with the same schedule as bench/allreduce.c, so that the two tables line
 * up. Built with OpenMPI's mpicc and run under mpirun; rank 0 prints one line per size:
 *
 *   allreduce bytes=B world=W iters=I time_us=T algbw_gbs=A busbw_gbs=U
 *
 * usage: mpi_allreduce [--min-bytes B] [--max-bytes B]   (default 1 MiB .. 256 MiB, x4) */
#include <errno.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "banned.h"

/* The schedule both benchmarks share: about 256 MiB of buffer reduced per size (at least 3
 * and at most 50 timed iterations) in BATCHES batches, of which the fastest counts (its mean
 * per call on the slowest rank), so that a burst of other work on a shared machine does not
 * decide a row; after one untimed warm-up. */
#define BYTES_PER_SIZE (256.0 * 1024 * 1024)
#define ITERS_MIN      3
#define ITERS_MAX      50
#define BATCHES        3

static int parse_bytes(const char *s, size_t *out)
{
    char *end;
    unsigned long long v;

    errno = 0;
    v = strtoull(s, &end, 10);
    if (errno || end == s || *end || v < 4)
        return -1;
    *out = (size_t)v;
    return 0;
}

int main(int argc, char **argv)
{
    size_t min_bytes = 1 << 20, max_bytes = (size_t)256 << 20;
    int rank, world, bad = 0;
    float *buf;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--min-bytes") && i + 1 < argc)
            bad |= parse_bytes(argv[++i], &min_bytes);
        else if (!strcmp(argv[i], "--max-bytes") && i + 1 < argc)
            bad |= parse_bytes(argv[++i], &max_bytes);
        else
            bad = 1;
    }
    if (bad) {
        if (rank == 0)
            fprintf(stderr, "usage: mpi_allreduce [--min-bytes B] [--max-bytes B]\n");
        MPI_Finalize();
        return 2;
    }
    buf = malloc(max_bytes);
    if (!buf) {
        fprintf(stderr, "mpi_allreduce: rank %d: out of memory for %zu bytes\n", rank, max_bytes);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (size_t bytes = min_bytes; bytes <= max_bytes; bytes *= 4) {
        size_t n = bytes / sizeof(float);
        double iters_f = BYTES_PER_SIZE / (double)bytes, t0, t = 0, best = 0;
        int iters = iters_f < ITERS_MIN   ? ITERS_MIN
                    : iters_f > ITERS_MAX ? ITERS_MAX
                                          : (int)iters_f;

        /* Small integers: every sum is exact, so the first result can be checked. */
        for (size_t i = 0; i < n; i++)
            buf[i] = (float)((i + (size_t)rank) % 7);
        MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        for (size_t i = 0; i < n; i++) {
            float want = 0;
            for (int r = 0; r < world; r++)
                want += (float)((i + (size_t)r) % 7);
            if (buf[i] != want) {
                fprintf(stderr, "mpi_allreduce: rank %d: element %zu is %g, expected %g\n", rank, i,
                        buf[i], want);
                MPI_Abort(MPI_COMM_WORLD, 1);
            }
        }
        for (size_t i = 0; i < n; i++)
            buf[i] = 1.0f;
        iters = (iters + BATCHES - 1) / BATCHES * BATCHES;
        for (int b = 0; b < BATCHES; b++) {
            MPI_Barrier(MPI_COMM_WORLD);
            t0 = MPI_Wtime();
            for (int it = 0; it < iters / BATCHES; it++)
                MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            t = (MPI_Wtime() - t0) / (iters / BATCHES);
            MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
            best = b == 0 || t < best ? t : best;
        }
        t = best;
        if (rank == 0)
            printf("allreduce bytes=%zu world=%d iters=%d time_us=%.1f algbw_gbs=%.3f "
                   "busbw_gbs=%.3f\n",
                   bytes, world, iters, t * 1e6, (double)bytes / t / 1e9,
                   (double)bytes / t / 1e9 * 2.0 * (world - 1) / world);
        fflush(stdout);
    }
    free(buf);
    MPI_Finalize();
    return 0;
}
