/* The shape of a real rank, on the rank library alone: rank 0 publishes a 128-byte binary id
 * (like an ncclUniqueId) that every rank reads back byte for byte, every rank publishes an
 * address and reads all the others' after a barrier, reports a few steps of progress, and
 * meets the others at a last barrier. Exits 0 and prints one line when all of it worked.
 *
 * usage: gr_example [--steps N] [--step-ms MS] [--stall-rank R --stall-step K]
 * (default 5 steps, no pause between them; rank R stops for good before reporting step K,
 * as a rank stuck in a deadlock would, for the hang tests) */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gr.h"
#include "banned.h"

/* Size of an ncclUniqueId. */
#define UID_LEN 128
/* How long a rank waits for the others: ranks of a job start within seconds of each other. */
#define WAIT_MS (60 * 1000)

static void die(struct gr *g, const char *fmt, ...) __attribute__((format(printf, 2, 3), noreturn));

static void die(struct gr *g, const char *fmt, ...)
{
    char what[512];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    if (g)
        fprintf(stderr, "gr_example: rank %d: %s\n", gr_rank(g), what);
    else
        fprintf(stderr, "gr_example: %s\n", what);
    /* No gr_finalize: exiting closes the link, and a failing rank must not wait on it. */
    exit(1);
}

/* A binary pattern with NUL and high bytes in it, the same on every rank. */
static void make_uid(unsigned char *uid)
{
    for (int i = 0; i < UID_LEN; i++)
        uid[i] = (unsigned char)(i * 151 + 7);
    uid[5] = 0x00;
    uid[6] = 0xff;
}

static int parse_count(const char *s, long *out)
{
    char *end;

    errno = 0;
    *out = strtol(s, &end, 10);
    return errno || end == s || *end || *out < 0 || *out > 1000000 ? -1 : 0;
}

static void check_uid(struct gr *g)
{
    unsigned char want[UID_LEN], got[UID_LEN + 1];
    size_t len = 0;
    int ret;

    make_uid(want);
    if (gr_rank(g) == 0 && (ret = gr_kv_put(g, "uid", want, sizeof(want))) < 0)
        die(g, "cannot publish 'uid': %s", gr_strerror(g));
    ret = gr_kv_get(g, "uid", got, sizeof(got), &len, WAIT_MS);
    if (ret < 0)
        die(g, "cannot read 'uid': %s", gr_strerror(g));
    if (len != UID_LEN)
        die(g, "'uid' has %zu bytes, expected %d", len, UID_LEN);
    for (int i = 0; i < UID_LEN; i++)
        if (got[i] != want[i])
            die(g, "'uid' differs at byte %d: 0x%02x, expected 0x%02x", i, got[i], want[i]);
}

static void check_addrs(struct gr *g)
{
    char key[64], want[64], got[64];
    size_t len = 0;

    snprintf(key, sizeof(key), "addr/%d", gr_rank(g));
    snprintf(want, sizeof(want), "node%d:%d", gr_node_rank(g), 29500 + gr_rank(g));
    if (gr_kv_put(g, key, want, strlen(want)) < 0)
        die(g, "cannot publish '%s': %s", key, gr_strerror(g));
    if (gr_barrier(g, NULL, WAIT_MS) < 0)
        die(g, "barrier after publishing addresses: %s", gr_strerror(g));
    /* Every rank published before the barrier, so nothing is waited for now. */
    for (int r = 0; r < gr_world_size(g); r++) {
        int ln = gr_local_world_size(g);
        snprintf(key, sizeof(key), "addr/%d", r);
        snprintf(want, sizeof(want), "node%d:%d", r / ln, 29500 + r);
        if (gr_kv_get(g, key, got, sizeof(got), &len, 0) < 0)
            die(g, "cannot read '%s' after the barrier: %s", key, gr_strerror(g));
        if (len != strlen(want) || memcmp(got, want, len))
            die(g, "'%s' is '%.*s', expected '%s'", key, (int)len, got, want);
    }
}

static void report_steps(struct gr *g, long steps, long step_ms, long stall_rank, long stall_step)
{
    for (long s = 0; s < steps; s++) {
        if (gr_rank(g) == stall_rank && s == stall_step) {
            printf("rank %d stalls before step %ld\n", gr_rank(g), s);
            for (;;)
                pause();
        }
        struct gr_progress p = GR_PROGRESS_INIT;

        p.step = s;
        p.loss = 10.0 / (double)(s + 1);
        p.lr = 3e-4;
        p.tokens_per_s = 1000.0 * (gr_rank(g) + 1);
        p.grad_norm = 1.0;
        if (step_ms > 0) {
            struct timespec ts = {step_ms / 1000, step_ms % 1000 * 1000000};
            while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
                ;
        }
        if (gr_report(g, &p) < 0)
            die(g, "cannot report step %ld: %s", s, gr_strerror(g));
    }
}

int main(int argc, char **argv)
{
    long steps = 5, step_ms = 0, stall_rank = -1, stall_step = -1;
    struct gr *g = NULL;
    int ret;

    for (int i = 1; i < argc; i++) {
        long *dst = !strcmp(argv[i], "--steps")        ? &steps
                    : !strcmp(argv[i], "--step-ms")    ? &step_ms
                    : !strcmp(argv[i], "--stall-rank") ? &stall_rank
                    : !strcmp(argv[i], "--stall-step") ? &stall_step
                                                       : NULL;
        if (!dst || i + 1 == argc || parse_count(argv[i + 1], dst) < 0) {
            fprintf(stderr, "usage: gr_example [--steps N] [--step-ms MS] [--stall-rank R "
                            "--stall-step K]\n");
            return 2;
        }
        i++;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    ret = gr_init(&g);
    if (ret < 0)
        die(NULL, "cannot start: %s", gr_strerror(NULL));
    check_uid(g);
    check_addrs(g);
    report_steps(g, steps, step_ms, stall_rank, stall_step);
    if (gr_barrier(g, "done", WAIT_MS) < 0)
        die(g, "barrier 'done': %s", gr_strerror(g));
    printf("rank %d/%d local %d node %d: store ok, barrier ok\n", gr_rank(g), gr_world_size(g),
           gr_local_rank(g), gr_node_rank(g));
    ret = gr_finalize(g);
    g = NULL;
    if (ret < 0) {
        fprintf(stderr, "gr_example: finalize: %s\n", gr_strerror(NULL));
        return 1;
    }
    return 0;
}
