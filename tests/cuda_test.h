/* The device set-up the CUDA backend's unit tests share (test_cuda_ops.c, test_cuda_model.c,
 * test_coll_nccl.c): the check that SKIPs a test without a CUDA device, a context on device 0
 * with the seed of the test's random inputs, the host and device buffers a test allocates
 * (freed with the context at its end), and the random numbers. Header-only, with static state:
 * each test file has its own, and each test runs in a process of its own (the runner forks
 * it). Only for builds with the CUDA backend (GPURUN_CUDA); include after test.h. */
#ifndef GPURUN_TESTS_CUDA_TEST_H
#define GPURUN_TESTS_CUDA_TEST_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "cuda/cuda_ops.h"

/* The running test's context on device 0, from test_device_setup to test_device_finish. */
static struct gpu_ctx *ctx;
/* next_u64's state: the seed, GPURUN_TEST_SEED or TEST_SEED_DEFAULT, printed by the set-up. */
static uint64_t rng_state;
#define TEST_SEED_DEFAULT 1u

/* The buffers hmalloc and dmalloc hand out, freed by test_device_finish: room to spare for
 * the test that allocates the most (one past it fails that test at its CHECK_INT). */
#define TEST_MAX_BUFS 512
static void *test_host_bufs[TEST_MAX_BUFS], *test_dev_bufs[TEST_MAX_BUFS];
static int test_n_host, test_n_dev;

/* Fails the test when call, an action on ctx, returns < 0, with ctx's message. */
#define CHECK_CTX(call)                                                                            \
    do {                                                                                           \
        int r_ = (call);                                                                           \
        if (r_ < 0)                                                                                \
            test_fail(__FILE__, __LINE__, "%s: %d (%s)", #call, r_, gpu_ctx_error(ctx));           \
    } while (0)

/* Skips the running test unless a CUDA device is usable (gpu_require_device's reason). */
static inline void test_need_device(void)
{
    struct errmsg err;

    if (gpu_require_device(&err) < 0)
        test_skip("%s", err.text);
}

/* Skips without a device; else ctx on device 0 and the seed (printed, so that
 * GPURUN_TEST_SEED=N repeats a run). */
static inline void test_device_setup(void)
{
    struct errmsg err;
    const char *s = getenv("GPURUN_TEST_SEED");

    test_need_device();
    ctx = gpu_ctx_new(0, &err);
    if (!ctx)
        test_fail(__FILE__, __LINE__, "%s", err.text);
    /* A fixed seed by default: a run of the suite is the same run every time, and a
     * tolerance is shown to hold over many seeds by a sweep (run-gpu-checks.sh's seeds step,
     * make cudasim-seeds), not by the luck of one make test. */
    rng_state = s && *s ? strtoull(s, NULL, 10) : TEST_SEED_DEFAULT;
    fprintf(stderr, "seed %llu (GPURUN_TEST_SEED repeats it)\n", (unsigned long long)rng_state);
}

/* Waits for the stream (a fault of a kernel fails the test), frees every buffer of hmalloc
 * and dmalloc, and ctx. */
static inline void test_device_finish(void)
{
    CHECK_CTX(gpu_ctx_sync(ctx));
    while (test_n_dev)
        gpu_free(ctx, test_dev_bufs[--test_n_dev]);
    while (test_n_host)
        free(test_host_bufs[--test_n_host]);
    gpu_ctx_free(ctx);
    ctx = NULL;
}

/* Zeroed host memory of `bytes`, owned by the test (test_device_finish frees it). */
static inline void *hmalloc(size_t bytes)
{
    void *p = calloc(1, bytes ? bytes : 1);

    CHECK(p);
    CHECK_INT(test_n_host, <, TEST_MAX_BUFS);
    test_host_bufs[test_n_host++] = p;
    return p;
}

/* Device memory of `bytes` on ctx, owned by the test (test_device_finish frees it). */
static inline void *dmalloc(size_t bytes)
{
    void *p = NULL;

    CHECK_CTX(gpu_alloc(ctx, &p, bytes));
    CHECK_INT(test_n_dev, <, TEST_MAX_BUFS);
    test_dev_bufs[test_n_dev++] = p;
    return p;
}

/* splitmix64 */
static inline uint64_t next_u64(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [0, 1), 53 bits. */
static inline double urand(void)
{
    return (double)(next_u64() >> 11) / 9007199254740992.0;
}

/* Uniform in [0, n). */
static inline int irand(int n)
{
    return (int)(next_u64() % (uint64_t)n);
}

#endif
