/* The cost of handing a cache line from one CPU to another and back, which bounds every
 * transfer through shared memory between two ranks: two threads, each pinned to one of the
 * first two CPUs this process may use, pass a counter back and forth. Prints
 *
 *   handoff cpus=A,B round_trip_ns=N
 *
 * (the mean of 1,000,000 round trips), or "handoff skipped: REASON" with fewer than 2 CPUs.
 * On a VM the host may move the virtual CPUs between cores that share a cache and cores that
 * do not, for seconds at a time: bench/allreduce.sh prints this before and after its runs so
 * that a reader sees which case the table was measured in.
 *
 * usage: handoff */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "monotime.h"
#include "banned.h"

#define ROUND_TRIPS 1000000L

static _Alignas(64) _Atomic long turn;

static int pin(int cpu)
{
    cpu_set_t set;

    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    return pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

/* Waits for the odd values, answers with the even ones (also where it could not be pinned,
 * so that the other side never waits forever; it says so by returning arg). */
static void *answer(void *arg)
{
    void *ret = pin(*(int *)arg) != 0 ? arg : NULL;

    for (long v = 1; v < 2 * ROUND_TRIPS; v += 2) {
        while (atomic_load_explicit(&turn, memory_order_acquire) != v)
            ;
        atomic_store_explicit(&turn, v + 1, memory_order_release);
    }
    return ret;
}

int main(int argc, char **argv)
{
    int cpus[2], n = 0, err;
    cpu_set_t set;
    pthread_t t;
    void *failed = NULL;
    double t0, dt;

    (void)argv;
    if (argc != 1) {
        fprintf(stderr, "usage: handoff\n");
        return 2;
    }
    if (sched_getaffinity(0, sizeof(set), &set) == 0)
        for (int c = 0; c < CPU_SETSIZE && n < 2; c++)
            if (CPU_ISSET(c, &set))
                cpus[n++] = c;
    if (n < 2) {
        printf("handoff skipped: fewer than 2 CPUs to run on\n");
        return 0;
    }
    if ((err = pin(cpus[0])) != 0 || (err = pthread_create(&t, NULL, answer, &cpus[1])) != 0) {
        fprintf(stderr, "handoff: cannot start on CPUs %d and %d: %s\n", cpus[0], cpus[1],
                strerror(err));
        return 1;
    }
    atomic_store(&turn, 0);
    t0 = monotime_s();
    for (long v = 1; v < 2 * ROUND_TRIPS; v += 2) {
        atomic_store_explicit(&turn, v, memory_order_release);
        while (atomic_load_explicit(&turn, memory_order_acquire) != v + 1)
            ;
    }
    dt = monotime_s() - t0;
    pthread_join(t, &failed);
    if (failed) {
        fprintf(stderr, "handoff: cannot run on CPU %d\n", cpus[1]);
        return 1;
    }
    printf("handoff cpus=%d,%d round_trip_ns=%.0f\n", cpus[0], cpus[1], dt / ROUND_TRIPS * 1e9);
    return 0;
}
