/* Tests of the collectives' nccl backend (kernels/coll/coll_nccl.c) in a world of one rank: a real
 * NCCL communicator of one rank whose every operation, on device and on host memory, leaves
 * the data as it is bit for bit (through the staging buffers, across their piece size); the
 * argument errors; and, on every machine, the clean failure without a CUDA device. The tests
 * that need a device SKIP without one. Several ranks run in tests/integ/coll_nccl.sh. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef GPURUN_NCCL
#include <cuda_runtime_api.h>
#endif

#include "coll/coll.h"
#include "test.h"
#ifdef GPURUN_NCCL
#include "cuda_test.h"
#endif
#include "banned.h"

/* Past the backend's 4 MiB staging piece, so that host operations take several pieces. */
#define BIG_BYTES ((9u << 20) + 13)

/* The machine has no CUDA device (or the build no NCCL): coll_open fails at once with the
 * reason, returns no coll, and a later open fails the same way. */
TEST(coll_nccl_without_device)
{
    struct coll *c = (struct coll *)&c;
    struct errmsg err = {""};
    struct timespec t0, t1;

    /* Before this process's first CUDA call: the runtime reads it once. The emulation's
     * variable hides its device too. */
    CHECK_EQ(setenv("CUDA_VISIBLE_DEVICES", "", 1), 0);
    CHECK_EQ(setenv("CUDASIM_DEVICES", "0", 1), 0);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < 2; i++) {
#ifdef GPURUN_NCCL
        CHECK_EQ(coll_open("nccl", NULL, &c, &err), -ENODEV);
        CHECK_STR(err.text, "nccl: no CUDA device available");
#else
        CHECK_EQ(coll_open("nccl", NULL, &c, &err), -ENOTSUP);
        CHECK_STR(err.text, "nccl: built without NCCL");
#endif
        CHECK(c == NULL);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    CHECK_INT(t1.tv_sec - t0.tv_sec, <, 10);
}

#ifdef GPURUN_NCCL

/* Skips without a device; else device 0 is current. */
static void need_device(void)
{
    cudaError_t e;

    test_need_device();
    if ((e = cudaSetDevice(0)) != cudaSuccess)
        test_fail(__FILE__, __LINE__, "cudaSetDevice(0): %s", cudaGetErrorString(e));
}

#define CHECK_CUDA(call)                                                                           \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess)                                                                     \
            test_fail(__FILE__, __LINE__, "%s: %s", #call, cudaGetErrorString(e_));                \
    } while (0)

/* cudaMemcpy from pageable host memory may return before its copy has landed, and cudaMemset
 * returns at once: both run on the legacy default stream, which a stream created with
 * cudaStreamNonBlocking does not wait for. Called after them, before a collective queued on
 * such a stream reads what they wrote. */
static void device_idle(void)
{
    CHECK_CUDA(cudaDeviceSynchronize());
}

static struct coll *open_one(void)
{
    struct coll *c = NULL;
    struct errmsg err = {"unchanged"};

    if (coll_open("nccl", NULL, &c, &err) < 0)
        test_fail(__FILE__, __LINE__, "coll_open(\"nccl\"): %s", err.text);
    CHECK_STR(err.text, "");
    return c;
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;

/* Random bytes that read as finite fp32 or bf16 values of mixed magnitudes and signs, no NaN,
 * no infinity, no subnormal (the top byte stays inside 0x20..0x3f, sign apart, in either
 * layout). */
static void fill_values(void *p, size_t bytes)
{
    unsigned char *b = p;

    for (size_t i = 0; i < bytes; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        b[i] = (unsigned char)(rng >> 56);
        if (i % 2 == 1)
            b[i] = (unsigned char)((b[i] & 0x80) | 0x20 | (b[i] & 0x3f));
    }
}

/* The first byte where a and b differ, or -1. */
static long first_diff(const void *a, const void *b, size_t n)
{
    const unsigned char *x = a, *y = b;

    for (size_t i = 0; i < n; i++)
        if (x[i] != y[i])
            return (long)i;
    return -1;
}

#define CHECK_SAME(a, b, n)                                                                        \
    do {                                                                                           \
        long d_ = first_diff(a, b, n);                                                             \
        if (d_ >= 0)                                                                               \
            test_fail(__FILE__, __LINE__, "%s and %s differ at byte %ld of %zu", #a, #b, d_,       \
                      (size_t)(n));                                                                \
    } while (0)

/* A world of one: the communicator is real and NCCL's; every device operation leaves its data
 * as it was, in place and out of place, f32 and bf16, on a stream of ours and on the default
 * stream. */
TEST(coll_nccl_world_of_one_device_ops)
{
    const size_t counts[] = {1, 3, 1031, 1000003};
    const enum coll_dtype dts[] = {COLL_F32, COLL_BF16};
    size_t max = 1000003 * sizeof(float);
    unsigned char *want, *got;
    void *d_a = NULL, *d_b = NULL;
    cudaStream_t s = NULL;
    struct coll *c;

    need_device();
    c = open_one();
    CHECK_STR(coll_backend(c), "nccl");
    CHECK_EQ(coll_rank(c), 0);
    CHECK_EQ(coll_world_size(c), 1);
    CHECK_CONTAINS(coll_describe(c), "nccl: one rank on CUDA device 0 (");
    CHECK_CONTAINS(coll_describe(c), "), NCCL ");
    want = malloc(max);
    got = malloc(max);
    CHECK(want && got);
    CHECK_CUDA(cudaMalloc(&d_a, max));
    CHECK_CUDA(cudaMalloc(&d_b, max));
    CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    for (size_t ci = 0; ci < sizeof(counts) / sizeof(counts[0]); ci++) {
        for (size_t di = 0; di < 2; di++) {
            size_t n = counts[ci], bytes = n * (dts[di] == COLL_BF16 ? 2 : 4);
            void *stream = ci % 2 ? (void *)s : NULL;

            fill_values(want, bytes);
            CHECK_CUDA(cudaMemcpy(d_a, want, bytes, cudaMemcpyHostToDevice));
            device_idle();
            CHECK_EQ(coll_dev_allreduce_avg(c, d_a, n, dts[di], stream), 0);
            CHECK_CUDA(cudaMemcpy(got, d_a, bytes, cudaMemcpyDeviceToHost));
            CHECK_SAME(got, want, bytes);

            /* In place: rank 0's block starts at send. */
            CHECK_EQ(coll_dev_reduce_scatter_avg(c, d_a, d_a, n, dts[di], stream), 0);
            CHECK_CUDA(cudaMemcpy(got, d_a, bytes, cudaMemcpyDeviceToHost));
            CHECK_SAME(got, want, bytes);
            CHECK_EQ(coll_dev_all_gather(c, d_a, d_a, n, dts[di], stream), 0);
            CHECK_CUDA(cudaMemcpy(got, d_a, bytes, cudaMemcpyDeviceToHost));
            CHECK_SAME(got, want, bytes);

            /* Out of place: recv is overwritten whole. */
            CHECK_CUDA(cudaMemset(d_b, 0xff, bytes));
            device_idle();
            CHECK_EQ(coll_dev_reduce_scatter_avg(c, d_a, d_b, n, dts[di], stream), 0);
            CHECK_CUDA(cudaMemcpy(got, d_b, bytes, cudaMemcpyDeviceToHost));
            CHECK_SAME(got, want, bytes);
            CHECK_CUDA(cudaMemset(d_b, 0xff, bytes));
            device_idle();
            CHECK_EQ(coll_dev_all_gather(c, d_a, d_b, n, dts[di], stream), 0);
            CHECK_CUDA(cudaMemcpy(got, d_b, bytes, cudaMemcpyDeviceToHost));
            CHECK_SAME(got, want, bytes);
        }
    }
    CHECK_STR(coll_strerror(c), "");
    coll_close(c);
    CHECK_CUDA(cudaStreamDestroy(s));
    CHECK_CUDA(cudaFree(d_a));
    CHECK_CUDA(cudaFree(d_b));
    free(want);
    free(got);
}

/* The host operations through the staging buffers: unchanged bit for bit, in pieces too. */
TEST(coll_nccl_world_of_one_host_ops)
{
    size_t nf = BIG_BYTES / sizeof(float), nd = 3000;
    unsigned char *want = malloc(BIG_BYTES), *got = malloc(BIG_BYTES);
    double *d = malloc(nd * sizeof(double)), *d0 = malloc(nd * sizeof(double));
    struct coll *c;

    need_device();
    c = open_one();
    CHECK(want && got && d && d0);
    fill_values(want, BIG_BYTES);
    memcpy(got, want, BIG_BYTES);
    CHECK_EQ(coll_allreduce_sum_f32(c, (float *)got, nf), 0);
    CHECK_SAME(got, want, nf * sizeof(float));
    CHECK_EQ(coll_allreduce_avg_f32(c, (float *)got, 7), 0);
    CHECK_SAME(got, want, 7 * sizeof(float));
    for (size_t i = 0; i < nd; i++)
        d[i] = d0[i] = (double)i * 1e300 / (double)nd - 0.25;
    CHECK_EQ(coll_allreduce_sum_f64(c, d, nd), 0);
    CHECK_SAME(d, d0, nd * sizeof(double));
    CHECK_EQ(coll_broadcast(c, got, BIG_BYTES, 0), 0);
    CHECK_SAME(got, want, BIG_BYTES);
    CHECK_EQ(coll_broadcast(c, got, 1, 0), 0);
    CHECK_EQ(coll_barrier(c), 0);
    CHECK_EQ(coll_barrier(c), 0);
    CHECK_STR(coll_strerror(c), "");
    coll_close(c);
    free(want);
    free(got);
    free(d);
    free(d0);
}

/* Arguments refused before NCCL sees them leave the collectives usable; a count of 0 does
 * nothing; several communicators open and close in turn. */
TEST(coll_nccl_arguments)
{
    void *d_a = NULL;
    float one = 1.0f;
    struct coll *c;

    need_device();
    CHECK_CUDA(cudaMalloc(&d_a, 64));
    for (int round = 0; round < 3; round++) {
        c = open_one();
        coll_set_timeout(c, 5000);
        CHECK_EQ(coll_dev_allreduce_avg(c, d_a, 4, (enum coll_dtype)9, NULL), -EINVAL);
        CHECK_STR(coll_strerror(c), "device allreduce: unknown dtype 9");
        CHECK_EQ(coll_dev_all_gather(c, NULL, d_a, 4, COLL_F32, NULL), -EINVAL);
        CHECK_STR(coll_strerror(c), "device all-gather: a null buffer");
        CHECK_EQ(coll_dev_reduce_scatter_avg(c, NULL, NULL, 0, COLL_BF16, NULL), 0);
        CHECK_EQ(coll_dev_allreduce_avg(c, NULL, 0, COLL_F32, NULL), 0);
        CHECK_EQ(coll_broadcast(c, &one, sizeof(one), 1), -EINVAL);
        CHECK_EQ(coll_dev_allreduce_avg(c, d_a, 16, COLL_F32, NULL), 0);
        CHECK_EQ(coll_allreduce_sum_f32(c, &one, 1), 0);
        CHECK(one == 1.0f);
        CHECK_STR(coll_strerror(c), "");
        coll_close(c);
    }
    CHECK_CUDA(cudaFree(d_a));
}

#endif
