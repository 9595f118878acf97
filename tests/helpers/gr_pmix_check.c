/* The rank library's PMIx transport, checked from inside a job that a PMIx launcher started
 * without rendezvousd (srun --mpi=pmix on the Slurm test cluster, or OpenMPI's mpirun): the
 * place gr_init reports against the launcher's own variables, a key the last rank puts late
 * read by every rank without a barrier, every rank's key read by every rank, binary, empty
 * and largest values, the errors (missing key, wait that runs out, small buffer, kv_del), a
 * barrier one rank gives up on and the barrier after it, a report and the refusal of one
 * without its size. Prints one line per rank,
 * "gr_pmix_check: rank R/W local L node N: ok", and exits 0 when every check passed.
 *
 * usage: gr_pmix_check */
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gr.h"
#include "banned.h"

/* How long a rank waits for the others: they start within a second or two. */
#define WAIT_MS  (30 * 1000)
/* The late put comes this long after the start; a get without a barrier must wait for it. */
#define LATE_MS  300
/* The wait that must run out, and how much later than asked it may end. */
#define SHORT_MS 300
#define SLACK_MS 2000

static struct gr *g;

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

static void die(const char *fmt, ...)
{
    char what[512];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    fprintf(stderr, "gr_pmix_check: rank %d: %s\n", g ? gr_rank(g) : -1, what);
    exit(1);
}

static int64_t now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, ms % 1000 * 1000000};

    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

/* The launcher's word for a number of this rank's place: Slurm's, else OpenMPI's (ompi may be
 * NULL); -1 when neither says. */
static long launcher(const char *slurm, const char *ompi)
{
    const char *s = getenv(slurm);
    char *end;
    long v;

    if (!s && ompi)
        s = getenv(ompi);
    if (!s || !*s)
        return -1;
    v = strtol(s, &end, 10);
    return *end ? -1 : v;
}

static void check_place(void)
{
    static const struct {
        const char *what, *slurm, *ompi;
        int (*get)(const struct gr *);
    } rows[] = {
        {"rank", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", gr_rank},
        {"world size", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", gr_world_size},
        {"local rank", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", gr_local_rank},
        {"local world size", "SLURM_NTASKS_PER_NODE", "OMPI_COMM_WORLD_LOCAL_SIZE",
         gr_local_world_size},
        {"node rank", "SLURM_NODEID", NULL, gr_node_rank},
    };
    int checked = 0;

    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        long want = launcher(rows[i].slurm, rows[i].ompi);
        if (want < 0)
            continue;
        if (rows[i].get(g) != want)
            die("%s is %d, the launcher says %ld", rows[i].what, rows[i].get(g), want);
        checked++;
    }
    if (checked < 3)
        die("the launcher gave only %d of the place's numbers to compare", checked);
}

/* Reads key, waiting up to timeout_ms, and fails unless it holds want (len bytes). */
static void expect_value(const char *key, const void *want, size_t len, int timeout_ms)
{
    static unsigned char got[GR_VALUE_MAX];
    size_t n = 0;

    if (gr_kv_get(g, key, got, sizeof(got), &n, timeout_ms) < 0)
        die("cannot read '%s': %s", key, gr_strerror(g));
    if (n != len || (len && memcmp(got, want, len)))
        die("'%s' has %zu bytes that differ from the %zu put", key, n, len);
}

static void check_store(void)
{
    static unsigned char big[GR_VALUE_MAX];
    unsigned char bin[5] = {'a', 0, 0xff, 0, 'z'};
    char key[64], val[64], small[4];
    int me = gr_rank(g), last = gr_world_size(g) - 1;
    size_t n = 0;
    int64_t t0;
    int ret;

    /* The last rank puts late; no barrier between its put and the others' gets. */
    if (me == last) {
        sleep_ms(LATE_MS);
        if (gr_kv_put(g, "late", "from the last rank", 18) < 0)
            die("cannot put 'late': %s", gr_strerror(g));
    }
    expect_value("late", "from the last rank", 18, WAIT_MS);

    /* Every rank's key, read by every rank, still without a barrier. */
    snprintf(key, sizeof(key), "each/%d", me);
    snprintf(val, sizeof(val), "value of rank %d", me);
    if (gr_kv_put(g, key, val, strlen(val)) < 0)
        die("cannot put '%s': %s", key, gr_strerror(g));
    for (int r = 0; r < gr_world_size(g); r++) {
        snprintf(key, sizeof(key), "each/%d", r);
        snprintf(val, sizeof(val), "value of rank %d", r);
        expect_value(key, val, strlen(val), WAIT_MS);
    }

    /* Binary, empty and largest values, from rank 0, under keys without a rank hint. */
    for (size_t i = 0; i < sizeof(big); i++)
        big[i] = (unsigned char)(i * 7 + 3);
    if (me == 0 && (gr_kv_put(g, "binary", bin, sizeof(bin)) < 0 ||
                    gr_kv_put(g, "empty", "", 0) < 0 || gr_kv_put(g, "big", big, sizeof(big)) < 0))
        die("cannot put the binary values: %s", gr_strerror(g));
    expect_value("binary", bin, sizeof(bin), WAIT_MS);
    expect_value("empty", "", 0, WAIT_MS);
    expect_value("big", big, sizeof(big), WAIT_MS);

    /* The errors. */
    ret = gr_kv_get(g, "big", small, sizeof(small), &n, 0);
    if (ret != -ENOBUFS || n != sizeof(big))
        die("a small buffer gave %d (%zu bytes needed), expected -ENOBUFS and %zu", ret, n,
            sizeof(big));
    ret = gr_kv_get(g, "nobody/put/this", small, sizeof(small), &n, 0);
    if (ret != -ENOENT)
        die("a missing key without a wait gave %d (%s), expected -ENOENT", ret, gr_strerror(g));
    t0 = now_ms();
    ret = gr_kv_get(g, "nobody/put/this", small, sizeof(small), &n, SHORT_MS);
    if (ret != -ETIMEDOUT)
        die("a missing key with a wait gave %d (%s), expected -ETIMEDOUT", ret, gr_strerror(g));
    if (now_ms() - t0 < SHORT_MS || now_ms() - t0 > SHORT_MS + SLACK_MS)
        die("a wait of %d ms ran out after %lld ms", SHORT_MS, (long long)(now_ms() - t0));
    ret = gr_kv_del(g, "late");
    if (ret != -EOPNOTSUPP)
        die("kv_del gave %d (%s), expected -EOPNOTSUPP", ret, gr_strerror(g));
}

static void check_barriers(void)
{
    struct gr_progress p = GR_PROGRESS_INIT, unset = {0};
    int64_t t0;
    int ret;

    p.step = 1;
    p.loss = 2.5;

    if (gr_barrier(g, "start", WAIT_MS) < 0)
        die("barrier 'start': %s", gr_strerror(g));
    /* Rank 0 gives up on a barrier the others reach a second later; its arrival still
     * counts, so that the next barrier meets everybody. */
    if (gr_rank(g) == 0 && gr_world_size(g) > 1) {
        t0 = now_ms();
        ret = gr_barrier(g, "late", SHORT_MS);
        if (ret != -ETIMEDOUT)
            die("a barrier the others reach late gave %d (%s), expected -ETIMEDOUT", ret,
                gr_strerror(g));
        if (now_ms() - t0 > SHORT_MS + SLACK_MS)
            die("a barrier of %d ms gave up after %lld ms", SHORT_MS, (long long)(now_ms() - t0));
    } else {
        sleep_ms(1000);
        if (gr_barrier(g, "late", WAIT_MS) < 0)
            die("barrier 'late': %s", gr_strerror(g));
    }
    if (gr_barrier(g, NULL, WAIT_MS) < 0)
        die("the barrier after 'late': %s", gr_strerror(g));
    if (gr_report(g, &p) < 0)
        die("report: %s", gr_strerror(g));
    /* Under PMIx a report goes nowhere, but its argument is checked as with an agent. */
    ret = gr_report(g, &unset);
    if (ret != -EINVAL)
        die("a report of a struct without its size gave %d, expected -EINVAL", ret);
}

int main(void)
{
    int ret;

    setvbuf(stdout, NULL, _IOLBF, 0);
    if (gr_init(&g) < 0)
        die("cannot start: %s", gr_strerror(NULL));
    check_place();
    check_store();
    check_barriers();
    printf("gr_pmix_check: rank %d/%d local %d node %d: ok\n", gr_rank(g), gr_world_size(g),
           gr_local_rank(g), gr_node_rank(g));
    ret = gr_finalize(g);
    g = NULL;
    if (ret < 0) {
        fprintf(stderr, "gr_pmix_check: finalize: %s\n", gr_strerror(NULL));
        return 1;
    }
    return 0;
}
