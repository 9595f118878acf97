/* The device set-up the CUDA backend's unit tests share (test_cuda_ops.c, test_cuda_model.c,
 * test_coll_nccl.c): the check that SKIPs a test without a CUDA device, a context on device 0
 * with the seed of the test's random inputs, the host and device buffers a test allocates
 * (freed with the context at its end), and the random numbers. Header-only, with static state:
 * each test file has its own, and each test runs in a process of its own (the runner forks
 * it). Only for builds with the CUDA backend (GPURUN_CUDA); include after test.h. */
#ifndef GPURUN_TESTS_CUDA_TEST_H
#define GPURUN_TESTS_CUDA_TEST_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "cuda/cuda_ops.h"
#include "optim.h"

/* The running test's context on device 0, from test_device_setup to test_device_finish. */
static struct gpu_ctx *ctx;
/* next_u64's state: the seed, GPURUN_TEST_SEED or TEST_SEED_DEFAULT, printed by the set-up. */
static uint64_t rng_state;
#define TEST_SEED_DEFAULT 1u

/* The buffers hmalloc and dmalloc hand out, freed by test_device_finish: room to spare for
 * the test that allocates the most (one past it fails that test at its CHECK_INT). */
#define TEST_MAX_BUFS 4096
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

/* The largest |gpu - cpu| of one element's parameter change under AdamW, derived from the
 * computation both sides do in fp32 (optim.c's adamw_span, optim.cu's adamw_kernel):
 *   m' = b1 m + (1-b1) g s,  v' = b2 v + (1-b2) (g s)^2,  r = (m'/c1) / (sqrt(v'/c2) + eps),
 *   p' = p - lr (r + wd p),  and the change read back as p' - p.
 * Each operation rounds with a relative error of at most u = 2^-24. m' may cancel, so its
 * error is bounded by the size of its terms, not its own: 3u (b1|m| + (1-b1)|g s|); v' is a
 * sum of positive terms: 4u relative, 5u after the division, half that through the square
 * root plus its own u. Through r = mhat / den: e_mhat / den + |r| e_den / den + u |r|; through
 * the update: lr (e_r + u wd |p|) + 2u |lr inner|. Then p' is rounded at p's scale: half an
 * ulp of p' (the term that failed 1 run in 30 for LayerNorm weights of 1.0, whose ulp is
 * 1.2e-7 beside changes of 1e-3), and the change read back rounds once more. Both sides err
 * independently (x2), and FMA contraction may fold two roundings into one or keep both in
 * another order (x2). The same bound holds for p' itself (the read-back term aside). */
static inline double adamw_update_bound(const struct adamw_config *cfg, float p0, float g, float m,
                                        float v, float lr, float scale, float wd, float c1,
                                        float c2)
{
    const double u = 0x1p-24, b1 = cfg->beta1, b2 = cfg->beta2, eps = cfg->eps;
    double gs = fabs((double)g * scale);
    double md = b1 * m + (1 - b1) * (double)g * scale, vd = b2 * v + (1 - b2) * gs * gs;
    double e_m = 3 * u * (b1 * fabs(m) + (1 - b1) * gs);
    double mhat = md / c1, vhat = vd / c2, sq = sqrt(vhat), den = sq + eps;
    double e_mhat = e_m / c1 + u * fabs(mhat);
    double e_den = (2.5 * u + u) * sq + u * den;
    double r = mhat / den, e_r = e_mhat / den + fabs(r) * e_den / den + u * fabs(r);
    double inner = r + wd * (double)p0, delta = lr * inner;
    double e_delta = lr * (e_r + u * wd * fabs(p0) + u * fabs(inner)) + u * fabs(delta);
    double pn = fabs((double)p0 - delta);
    double ulp_pn = (double)nextafterf((float)pn, INFINITY) - (float)pn;
    double side = e_delta + 0.5 * ulp_pn + u * fabs(delta);
    return 2 * 2 * side;
}

/* The largest |gpu - cpu| of AdamW's new moments m' and v' (the same computation as above):
 * m' = b1 m + (1-b1) g s rounds g s, two products and the sum, and may cancel, so its error
 * is bounded by its terms: 3u (b1 |m| + (1-b1) |g s|) (1 - b1 is exact for b1 in [0.5, 1]);
 * v' = b2 v + (1-b2) (g s)^2 adds positive terms: 4u |v'|. Both sides, and FMA (x2 each). */
static inline void adamw_moment_bounds(const struct adamw_config *cfg, float g, float m, float v,
                                       float scale, double *lim_m, double *lim_v)
{
    const double u = 0x1p-24, b1 = cfg->beta1, b2 = cfg->beta2;
    double gs = fabs((double)g * scale);
    *lim_m = 2 * 2 * 3 * u * (b1 * fabs(m) + (1 - b1) * gs);
    *lim_v = 2 * 2 * 4 * u * (b2 * v + (1 - b2) * gs * gs);
}

#endif
