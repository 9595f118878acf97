/* The allreduce benchmark: coll_allreduce_sum_f32 of the tcp backend (kernels/coll/coll.h), run as
 * every rank of a `gpurun --local` job, timed over the sizes and with the schedule of its
 * anchor bench/mpi_allreduce.c. Rank 0 prints one line per size:
 *
 *   allreduce bytes=B world=W iters=I time_us=T algbw_gbs=A busbw_gbs=U
 *
 * where T is the mean time per call (of the slowest rank, in the fastest batch), A = B / T and
 * U = A * 2(W-1)/W, the bytes each rank moves over its links (nccl-tests' bus bandwidth).
 *
 * With --floor it times instead what bounds the ring's bus bandwidth on this machine, every
 * rank at once and with the same schedule, and prints "floor KIND bytes=B world=W iters=I
 * time_us=T gbs=G" (G = B / T, what one rank moves per second):
 *   memcpy    each rank copies B bytes from one buffer of its own to another: what a rank
 *             gets from memory while the others copy too, the bound of the shared-memory
 *             links (each of which the ring's two ends copy through);
 *   loopback  each rank sends B bytes to rank+1 and receives B from rank-1 over loopback TCP
 *             (TCP_NODELAY, as the ring): the ring's links without the ring.
 *
 * With --paired-floor it times the allreduce, and each of its batches is followed at once by
 * a batch of the memcpy floor on the same buffer; the line gains "floor_gbs=F vs_floor=R", R
 * the median over the batches of the batch's bus bandwidth over the floor's right after it,
 * and F that batch's floor. Paired so, the ring and its floor meet the same machine: a VM's
 * host may move its virtual CPUs between cores that share a cache and cores that do not for
 * seconds at a time, which moves the floor one way and the ring the other.
 *
 * usage: allreduce [--floor memcpy|loopback | --paired-floor] [--min-bytes B] [--max-bytes B]
 *        (sizes default to 1 MiB .. 256 MiB, x4) */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "coll/coll.h"
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

enum kind { ALLREDUCE, FLOOR_MEMCPY, FLOOR_LOOPBACK };

/* One rank's state: the collectives (barriers and the slowest rank's time), the buffers, and
 * for the loopback floor its links. */
struct bench {
    struct gr *g;
    struct coll *c;
    int rank, world;
    enum kind kind;
    bool paired; /* --paired-floor */
    char *buf, *buf2;
    int send_fd, recv_fd;
    double *times;
};

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

/* How long a floor's link may stay silent before the run gives up. */
#define LINK_TIMEOUT_MS 30000

/* --- the loopback floor's links ------------------------------------------------------------- */

static int set_nonblocking(int fd)
{
    int one = 1;

    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

/* The connection rank-1 makes to lfd, waited for up to ms (it may have failed): the socket,
 * or -1 with errno. */
static int accept_within(int lfd, int ms)
{
    struct pollfd pfd = {.fd = lfd, .events = POLLIN};
    int ready;

    while ((ready = poll(&pfd, 1, ms)) < 0 && errno == EINTR)
        ;
    if (ready == 0)
        errno = ETIMEDOUT;
    return ready > 0 ? accept(lfd, NULL, NULL) : -1;
}

/* Listens on 127.0.0.1, publishes the port under "floor/port/<rank>", connects to rank+1 and
 * accepts rank-1. */
static int open_links(struct bench *b)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t slen = sizeof(sa);
    char key[64], value[16];
    size_t vlen = 0;
    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), ret = -1;

    if (lfd < 0 || bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(lfd, 4) < 0 ||
        getsockname(lfd, (struct sockaddr *)&sa, &slen) < 0) {
        fprintf(stderr, "allreduce: rank %d: cannot listen on 127.0.0.1: %s\n", b->rank,
                strerror(errno));
        goto out;
    }
    snprintf(key, sizeof(key), "floor/port/%d", b->rank);
    snprintf(value, sizeof(value), "%u", ntohs(sa.sin_port));
    if (gr_kv_put(b->g, key, value, strlen(value)) < 0)
        goto store_failed;
    snprintf(key, sizeof(key), "floor/port/%d", (b->rank + 1) % b->world);
    if (gr_kv_get(b->g, key, value, sizeof(value) - 1, &vlen, LINK_TIMEOUT_MS) < 0)
        goto store_failed;
    value[vlen] = '\0';
    sa.sin_port = htons((uint16_t)strtoul(value, NULL, 10));
    b->send_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (b->send_fd < 0 || connect(b->send_fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
        (b->recv_fd = accept_within(lfd, LINK_TIMEOUT_MS)) < 0 || set_nonblocking(b->send_fd) < 0 ||
        set_nonblocking(b->recv_fd) < 0) {
        fprintf(stderr, "allreduce: rank %d: cannot link to rank %d: %s\n", b->rank,
                (b->rank + 1) % b->world, strerror(errno));
        goto out;
    }
    ret = 0;
    goto out;
store_failed:
    fprintf(stderr, "allreduce: rank %d: store key '%s': %s\n", b->rank, key, gr_strerror(b->g));
out:
    if (lfd >= 0)
        close(lfd);
    return ret;
}

/* Sends bytes to rank+1 while receiving bytes from rank-1: 0, or -1 with errno (ECONNRESET:
 * rank-1 closed; ETIMEDOUT: nothing moved for LINK_TIMEOUT_MS). */
static int stream_links(struct bench *b, size_t bytes)
{
    size_t sent = 0, got = 0;

    while (sent < bytes || got < bytes) {
        bool moved = false;
        ssize_t k;
        int ready;

        if (got < bytes) {
            k = recv(b->recv_fd, b->buf2 + got, bytes - got, 0);
            if (k == 0) {
                errno = ECONNRESET;
                return -1;
            }
            if (k < 0 && errno != EAGAIN && errno != EINTR)
                return -1;
            got += k > 0 ? (size_t)k : 0;
            moved |= k > 0;
        }
        if (sent < bytes) {
            k = send(b->send_fd, b->buf + sent, bytes - sent, MSG_NOSIGNAL);
            if (k < 0 && errno != EAGAIN && errno != EINTR)
                return -1;
            sent += k > 0 ? (size_t)k : 0;
            moved |= k > 0;
        }
        if (moved)
            continue;
        struct pollfd pfd[2] = {{.fd = got < bytes ? b->recv_fd : -1, .events = POLLIN},
                                {.fd = sent < bytes ? b->send_fd : -1, .events = POLLOUT}};
        ready = poll(pfd, 2, LINK_TIMEOUT_MS);
        if (ready == 0)
            errno = ETIMEDOUT;
        if (ready == 0 || (ready < 0 && errno != EINTR))
            return -1;
    }
    return 0;
}

/* --- the schedule ---------------------------------------------------------------------------- */

static int run_once(struct bench *b, enum kind kind, size_t bytes)
{
    switch (kind) {
    case FLOOR_MEMCPY:
        memcpy(b->buf2, b->buf, bytes);
        /* Something the compiler cannot see through between copies. */
        b->buf[bytes / 2] ^= b->buf2[bytes / 3];
        return 0;
    case FLOOR_LOOPBACK:
        if (stream_links(b, bytes) < 0) {
            fprintf(stderr, "allreduce: rank %d: loopback floor: %s\n", b->rank, strerror(errno));
            return -1;
        }
        return 0;
    default:
        if (coll_allreduce_sum_f32(b->c, (float *)b->buf, bytes / sizeof(float)) < 0) {
            fprintf(stderr, "allreduce: rank %d: %s\n", b->rank, coll_strerror(b->c));
            return -1;
        }
        return 0;
    }
}

/* The first allreduce of a size, checked: small integers, so that every sum is exact. */
static int check_allreduce(struct bench *b, size_t bytes)
{
    float *buf = (float *)b->buf;
    size_t n = bytes / sizeof(float);

    for (size_t i = 0; i < n; i++)
        buf[i] = (float)((i + (size_t)b->rank) % 7);
    if (run_once(b, ALLREDUCE, bytes) < 0)
        return -1;
    for (size_t i = 0; i < n; i++) {
        float want = 0;
        for (int r = 0; r < b->world; r++)
            want += (float)((i + (size_t)r) % 7);
        if (buf[i] != want) {
            fprintf(stderr, "allreduce: rank %d: element %zu is %g, expected %g\n", b->rank, i,
                    buf[i], want);
            return -1;
        }
    }
    for (size_t i = 0; i < n; i++)
        buf[i] = 1.0f;
    return 0;
}

/* One batch of n calls of KIND: its time per call, or < 0. An allreduce's is the mean of its
 * slowest rank (as the anchor's). A floor's is from the first rank's start to the last rank's
 * end (one clock: the ranks share a machine), over the calls: ranks that share a CPU may
 * otherwise each time their batch alone, one after the other. */
static double time_batch(struct bench *b, enum kind kind, size_t bytes, int n)
{
    int w = b->world;
    double t0, t = 0, first = 0, last = 0;

    if (coll_barrier(b->c) < 0)
        goto coll_failed;
    t0 = monotime_s();
    for (int it = 0; it < n; it++)
        if (run_once(b, kind, bytes) < 0)
            return -1;
    memset(b->times, 0, 3 * (size_t)w * sizeof(*b->times));
    b->times[b->rank] = (monotime_s() - t0) / n;
    b->times[w + b->rank] = t0;
    b->times[2 * w + b->rank] = monotime_s();
    if (coll_allreduce_sum_f64(b->c, b->times, 3 * (size_t)w) < 0)
        goto coll_failed;
    for (int r = 0; r < w; r++) {
        t = b->times[r] > t ? b->times[r] : t;
        first = r == 0 || b->times[w + r] < first ? b->times[w + r] : first;
        last = b->times[2 * w + r] > last ? b->times[2 * w + r] : last;
    }
    return kind == ALLREDUCE ? t : (last - first) / n;
coll_failed:
    fprintf(stderr, "allreduce: rank %d: %s\n", b->rank, coll_strerror(b->c));
    return -1;
}

/* A size's times: the fastest of BATCHES batches; with --paired-floor, each allreduce batch
 * followed at once by a memcpy floor batch, and the median over the batches of the ring's bus
 * bandwidth over the floor's, with that batch's floor. */
struct timing {
    double best;     /* seconds per call */
    double floor;    /* GB/s per rank */
    double vs_floor; /* ratio */
};

static int time_size(struct bench *b, size_t bytes, int iters, struct timing *out)
{
    int n = iters / BATCHES;
    double ratio[BATCHES], floor[BATCHES], bus = 2.0 * (b->world - 1) / b->world;

    out->best = 0;
    for (int k = 0; k < BATCHES; k++) {
        double t = time_batch(b, b->kind, bytes, n), f;
        if (t < 0)
            return -1;
        out->best = k == 0 || t < out->best ? t : out->best;
        if (!b->paired)
            continue;
        if ((f = time_batch(b, FLOOR_MEMCPY, bytes, n)) < 0)
            return -1;
        floor[k] = (double)bytes / f / 1e9;
        ratio[k] = (double)bytes / t / 1e9 * bus / floor[k];
        /* Insertion by ratio, the floors alongside: the median ends up in the middle. */
        for (int j = k; j > 0 && ratio[j - 1] > ratio[j]; j--) {
            double x = ratio[j];
            ratio[j] = ratio[j - 1], ratio[j - 1] = x;
            x = floor[j], floor[j] = floor[j - 1], floor[j - 1] = x;
        }
    }
    if (b->paired) {
        out->vs_floor = ratio[(BATCHES - 1) / 2];
        out->floor = floor[(BATCHES - 1) / 2];
    }
    return 0;
}

static int run_sizes(struct bench *b, size_t min_bytes, size_t max_bytes)
{
    static const char *const names[] = {[FLOOR_MEMCPY] = "memcpy", [FLOOR_LOOPBACK] = "loopback"};

    for (size_t bytes = min_bytes; bytes <= max_bytes; bytes *= 4) {
        double iters_f = BYTES_PER_SIZE / (double)bytes;
        struct timing t = {0};
        int iters = iters_f < ITERS_MIN   ? ITERS_MIN
                    : iters_f > ITERS_MAX ? ITERS_MAX
                                          : (int)iters_f;

        iters = (iters + BATCHES - 1) / BATCHES * BATCHES;
        if (b->kind == ALLREDUCE ? check_allreduce(b, bytes) < 0 : run_once(b, b->kind, bytes) < 0)
            return -1;
        if (time_size(b, bytes, iters, &t) < 0)
            return -1;
        if (b->rank != 0)
            continue;
        if (b->kind == ALLREDUCE)
            printf("allreduce bytes=%zu world=%d iters=%d time_us=%.1f algbw_gbs=%.3f "
                   "busbw_gbs=%.3f",
                   bytes, b->world, iters, t.best * 1e6, (double)bytes / t.best / 1e9,
                   (double)bytes / t.best / 1e9 * 2.0 * (b->world - 1) / b->world);
        else
            printf("floor %s bytes=%zu world=%d iters=%d time_us=%.1f gbs=%.3f", names[b->kind],
                   bytes, b->world, iters, t.best * 1e6, (double)bytes / t.best / 1e9);
        if (b->paired)
            printf(" floor_gbs=%.3f vs_floor=%.3f", t.floor, t.vs_floor);
        printf("\n");
        fflush(stdout);
    }
    return 0;
}

int main(int argc, char **argv)
{
    size_t min_bytes = 1 << 20, max_bytes = (size_t)256 << 20;
    struct bench b = {.kind = ALLREDUCE, .send_fd = -1, .recv_fd = -1};
    int bad = 0, ret = 1;
    struct errmsg err;

    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--min-bytes") && i + 1 < argc)
            bad |= parse_bytes(argv[++i], &min_bytes);
        else if (!strcmp(argv[i], "--max-bytes") && i + 1 < argc)
            bad |= parse_bytes(argv[++i], &max_bytes);
        else if (!strcmp(argv[i], "--floor") && i + 1 < argc && !strcmp(argv[i + 1], "memcpy"))
            b.kind = FLOOR_MEMCPY, i++;
        else if (!strcmp(argv[i], "--floor") && i + 1 < argc && !strcmp(argv[i + 1], "loopback"))
            b.kind = FLOOR_LOOPBACK, i++;
        else if (!strcmp(argv[i], "--paired-floor"))
            b.paired = true;
        else
            bad = 1;
    }
    if (bad) {
        fprintf(stderr, "usage: allreduce [--floor memcpy|loopback | --paired-floor] "
                        "[--min-bytes B] [--max-bytes B]\n");
        return 2;
    }
    if (b.paired && b.kind != ALLREDUCE) {
        fprintf(stderr, "allreduce: --paired-floor times the allreduce, not a floor\n");
        return 2;
    }
    if (gr_init(&b.g) < 0) {
        fprintf(stderr, "allreduce: cannot start: %s\n", gr_strerror(NULL));
        return 1;
    }
    b.rank = gr_rank(b.g);
    b.world = gr_world_size(b.g);
    if (coll_open("tcp", b.g, &b.c, &err) < 0) {
        fprintf(stderr, "allreduce: rank %d: cannot open the collectives: %s\n", b.rank, err.text);
        goto out;
    }
    b.buf = malloc(max_bytes);
    b.buf2 = b.kind == ALLREDUCE && !b.paired ? NULL : malloc(max_bytes);
    b.times = calloc(3 * (size_t)b.world, sizeof(*b.times));
    if (!b.buf || (!b.buf2 && (b.kind != ALLREDUCE || b.paired)) || !b.times) {
        fprintf(stderr, "allreduce: rank %d: out of memory for %zu bytes\n", b.rank, max_bytes);
        goto out;
    }
    if (b.buf2) {
        memset(b.buf, 1, max_bytes);
        memset(b.buf2, 2, max_bytes);
    }
    if (b.kind == FLOOR_LOOPBACK && (b.world < 2 || open_links(&b) < 0)) {
        if (b.world < 2)
            fprintf(stderr, "allreduce: the loopback floor needs 2 ranks or more\n");
        goto out;
    }
    if (run_sizes(&b, min_bytes, max_bytes) == 0)
        ret = 0;
out:
    if (b.send_fd >= 0)
        close(b.send_fd);
    if (b.recv_fd >= 0)
        close(b.recv_fd);
    free(b.buf);
    free(b.buf2);
    free(b.times);
    coll_close(b.c);
    if (ret == 0 && gr_finalize(b.g) < 0) {
        fprintf(stderr, "allreduce: rank %d: finalize: %s\n", b.rank, gr_strerror(NULL));
        ret = 1;
    }
    return ret;
}
