/* The allreduce benchmark: coll_allreduce_sum_f32 of the tcp backend (kernels/coll.h), run as
 * every rank of a `gpurun --local` job, timed over the sizes and with the schedule of its
 * anchor bench/mpi_allreduce.c. Rank 0 prints one line per size:
 *
 *   allreduce bytes=B world=W iters=I time_us=T algbw_gbs=A busbw_gbs=U
 *
 * where T is the mean time per call (of the slowest rank, in the fastest batch), A = B / T and
 * U = A * 2(W-1)/W, the bytes each rank moves over its links (nccl-tests' bus bandwidth).
 *
 * usage: allreduce [--min-bytes B] [--max-bytes B]   (default 1 MiB .. 256 MiB, x4) */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll.h"
#include "gr.h"
#include "monotime.h"
#include "banned.h"

/* The schedule both benchmarks share: about 256 MiB of buffer reduced per size (at least 3
 * and at most 50 timed iterations) in BATCHES batches, of which the fastest counts (its mean
 * per call on the slowest rank), so that a burst of other work on a shared machine does not
 * decide a row; after one untimed warm-up that also checks the result. */
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
    struct gr *g = NULL;
    struct coll *c = NULL;
    int rank, world, bad = 0, ret = 1;
    double *times = NULL;
    float *buf = NULL;
    struct errmsg err;

    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--min-bytes") && i + 1 < argc)
            bad |= parse_bytes(argv[++i], &min_bytes);
        else if (!strcmp(argv[i], "--max-bytes") && i + 1 < argc)
            bad |= parse_bytes(argv[++i], &max_bytes);
        else
            bad = 1;
    }
    if (bad) {
        fprintf(stderr, "usage: allreduce [--min-bytes B] [--max-bytes B]\n");
        return 2;
    }
    if (gr_init(&g) < 0) {
        fprintf(stderr, "allreduce: cannot start: %s\n", gr_strerror(NULL));
        return 1;
    }
    rank = gr_rank(g);
    world = gr_world_size(g);
    if (coll_open("tcp", g, &c, &err) < 0) {
        fprintf(stderr, "allreduce: rank %d: cannot open the collectives: %s\n", rank, err.text);
        goto out;
    }
    buf = malloc(max_bytes);
    times = calloc((size_t)world, sizeof(*times));
    if (!buf || !times) {
        fprintf(stderr, "allreduce: rank %d: out of memory for %zu bytes\n", rank, max_bytes);
        goto out;
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
        if (coll_allreduce_sum_f32(c, buf, n) < 0)
            goto coll_failed;
        for (size_t i = 0; i < n; i++) {
            float want = 0;
            for (int r = 0; r < world; r++)
                want += (float)((i + (size_t)r) % 7);
            if (buf[i] != want) {
                fprintf(stderr, "allreduce: rank %d: element %zu is %g, expected %g\n", rank, i,
                        buf[i], want);
                goto out;
            }
        }
        for (size_t i = 0; i < n; i++)
            buf[i] = 1.0f;
        iters = (iters + BATCHES - 1) / BATCHES * BATCHES;
        for (int b = 0; b < BATCHES; b++) {
            if (coll_barrier(c) < 0)
                goto coll_failed;
            t0 = monotime_s();
            for (int it = 0; it < iters / BATCHES; it++)
                if (coll_allreduce_sum_f32(c, buf, n) < 0)
                    goto coll_failed;
            memset(times, 0, (size_t)world * sizeof(*times));
            times[rank] = (monotime_s() - t0) / (iters / BATCHES);
            if (coll_allreduce_sum_f64(c, times, (size_t)world) < 0)
                goto coll_failed;
            t = 0;
            for (int r = 0; r < world; r++)
                t = times[r] > t ? times[r] : t;
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
    ret = 0;
    goto out;
coll_failed:
    fprintf(stderr, "allreduce: rank %d: %s\n", rank, coll_strerror(c));
out:
    free(buf);
    free(times);
    coll_close(c);
    if (ret == 0 && gr_finalize(g) < 0) {
        fprintf(stderr, "allreduce: rank %d: finalize: %s\n", rank, gr_strerror(NULL));
        ret = 1;
    }
    return ret;
}
