/* A rank program for the multi-process tests of the collectives (kernels/coll/coll.h), run under
 * `gpurun --local`. Modes:
 *
 * Every rank first prints "rank R/W: " and the ring's description (coll_describe).
 *
 *   check   allreduce sums of exact patterns (every sum must be exact) and of random floats
 *           (the result must be bitwise the one the documented ring order gives) for many
 *           sizes, avg and f64 sums, broadcast from every root, barriers (one that must wait
 *           for a late rank); every rank publishes a hash of all its results in the store and
 *           compares it with rank 0's. Prints "hash H" (rank 0) and "rank R/W: all checks
 *           passed" (every rank).
 *   die     the last rank leaves right after the ring is up (exit 0, no close: the kernel
 *           closes its sockets, as for a crash); the others' allreduce must fail with
 *           ECONNRESET within seconds. Prints "rank R/W: error seen: MESSAGE".
 *   stall   the last rank stops taking part but keeps its connections; with a 1 s timeout the
 *           others must fail with ETIMEDOUT or ECONNRESET (a rank whose own neighbour gave up
 *           sees the closed ring). Prints "rank R/W: error seen: MESSAGE".
 *
 * The nccl backend (one GPU per rank: device LOCAL_RANK of those visible, or the only one):
 *   nccl-check  on device memory, allreduce and reduce-scatter averages of values whose sums
 *           are exact (each rank's value is the world size times a small integer: every sum
 *           and every average is exact in f32 and bf16, whatever NCCL's order and rounding),
 *           checked bitwise, in place and out of place, f32 and bf16, for many sizes;
 *           all-gathers checked bitwise; the host operations
 *           (staged through the backend's device buffer) as in check; hashes compared as in
 *           check. Prints "rank R/W: all nccl checks passed".
 *   nccl-die    as die, on device memory: the others' allreduce (2 s timeout) must fail within
 *           seconds (a timeout, or NCCL's error), say that the communicator was aborted, and
 *           the next call give the same error. Prints "rank R/W: error seen: MESSAGE".
 *   nccl-stall  the same with the last rank alive but quiet for NCCL_STALL_MS.
 *   nccl-nojoin the last rank never opens its collectives (it leaves after NCCL_STALL_MS): the
 *           others' coll_open must fail, naming it ("rank 2 did not join"). NCCL's own wait
 *           decides when: COLL_TIMEOUT_MS_DEFAULT, or the emulation's CUDASIM_NCCL_TIMEOUT_MS.
 *   devices     not a rank: prints "nccl VERSION devices N name NAME" (N CUDA devices visible,
 *           the first one's name) or "nccl none: REASON", for the test script to decide what
 *           it can run.
 *
 * usage: coll_rank check|die|stall|nccl-check|nccl-die|nccl-stall|nccl-nojoin|devices
 * Exits 0 when the mode's checks passed, 1 otherwise. */
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifdef GPURUN_NCCL
#include <cuda_runtime_api.h>
#include <nccl.h>
#endif

#include "coll/coll.h"
#include "gr.h"
#include "banned.h"

#define WAIT_MS           (60 * 1000)
/* The late rank's delay in the barrier check, and how long the others must have waited. */
#define LATE_MS           300
#define LATE_SEEN_MS      200
/* How soon a dead peer must be noticed, and how long a stalled rank stays quiet (over the
 * others' 1 s timeout) before it leaves. */
#define DEAD_SEEN_MS      5000
#define STALL_MS          3000
/* nccl-die: the others' 2 s timeout, and time for NCCL's abort (it stops its threads and
 * kernels); nccl-stall: the quiet rank stays longer than that timeout. */
#define NCCL_DEAD_SEEN_MS 20000
#define NCCL_STALL_MS     6000

static int rank = -1, world = 0;

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

static void die(const char *fmt, ...)
{
    char what[1024];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    fprintf(stderr, "coll_rank: rank %d: %s\n", rank, what);
    exit(1);
}

static int64_t now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};

    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

/* FNV-1a, over every result a rank computed. */
static uint64_t hash = 0xcbf29ce484222325ULL;

static void hash_bytes(const void *p, size_t n)
{
    const unsigned char *b = p;

    for (size_t i = 0; i < n; i++)
        hash = (hash ^ b[i]) * 0x100000001b3ULL;
}

/* Small integers: every partial sum is exact, whatever the order. */
static float exact_val(int r, size_t i)
{
    return (float)((int)((i * 7 + (size_t)r * 13) % 64) - 16);
}

/* Random floats of mixed magnitudes and signs: the sum depends on the order of additions. */
static float random_val(int r, size_t i, uint64_t seed)
{
    uint64_t h = mix(seed * 0x9e3779b97f4a7c15ULL + (uint64_t)r * 0x100000001ULL + i);
    double u = (double)(h & 0xffffff) / (double)0x1000000 - 0.5;

    return (float)(u * (double)(1 << (h >> 60)) / 64.0);
}

/* The ring's documented order (coll.h): the buffer in parts of W x COLL_RING_SEGMENT_BYTES; in a
 * part of m elements, segment k holds elements [k*q + min(k, m%W), ...) of q = m/W (+1 for the
 * first m%W segments), starts as rank k's value, and each later rank of the ring adds its own
 * value in front: x[k+j] + acc for j = 1..W-1. */
static float ring_sum(size_t n, size_t i, uint64_t seed)
{
    size_t part = (size_t)world * (COLL_RING_SEGMENT_BYTES / sizeof(float)), base = i / part * part;
    size_t m = n - base < part ? n - base : part, at = i - base;
    size_t w = (size_t)world, q = m / w, rem = m % w, k = 0;
    float acc;

    while (k + 1 < w && at >= (k + 1) * q + (k + 1 < rem ? k + 1 : rem))
        k++;
    acc = random_val((int)k, i, seed);
    for (size_t j = 1; j < w; j++)
        acc = random_val((int)((k + j) % w), i, seed) + acc;
    return acc;
}

static void check_sum_f32(struct coll *c, size_t n)
{
    float *buf = malloc((n ? n : 1) * sizeof(float));
    uint64_t seed = n * 31 + 7;
    int ret;

    if (!buf)
        die("out of memory for %zu floats", n);
    for (size_t i = 0; i < n; i++)
        buf[i] = exact_val(rank, i);
    if ((ret = coll_allreduce_sum_f32(c, buf, n)) < 0)
        die("allreduce of %zu floats: %s", n, coll_strerror(c));
    for (size_t i = 0; i < n; i++) {
        float want = 0;
        for (int r = 0; r < world; r++)
            want += exact_val(r, i);
        if (buf[i] != want)
            die("allreduce of %zu floats: element %zu is %g, expected %g", n, i, buf[i], want);
    }
    hash_bytes(buf, n * sizeof(float));

    for (size_t i = 0; i < n; i++)
        buf[i] = random_val(rank, i, seed);
    if ((ret = coll_allreduce_sum_f32(c, buf, n)) < 0)
        die("allreduce of %zu random floats: %s", n, coll_strerror(c));
    for (size_t i = 0; i < n; i++) {
        float want = ring_sum(n, i, seed);
        if (memcmp(&buf[i], &want, sizeof(float)))
            die("allreduce of %zu random floats: element %zu is %a, the ring order gives %a", n, i,
                buf[i], want);
    }
    hash_bytes(buf, n * sizeof(float));

    for (size_t i = 0; i < n; i++)
        buf[i] = random_val(rank, i, seed);
    if ((ret = coll_allreduce_avg_f32(c, buf, n)) < 0)
        die("allreduce avg of %zu floats: %s", n, coll_strerror(c));
    for (size_t i = 0; i < n; i++) {
        float want = ring_sum(n, i, seed) / (float)world;
        if (memcmp(&buf[i], &want, sizeof(float)))
            die("allreduce avg of %zu floats: element %zu is %a, expected %a", n, i, buf[i], want);
    }
    hash_bytes(buf, n * sizeof(float));
    free(buf);
}

static void check_sum_f64(struct coll *c, size_t n)
{
    double buf[256];

    for (size_t i = 0; i < n; i++)
        buf[i] = 0.25 * (double)(rank + 1) + (double)i * 1e9;
    if (coll_allreduce_sum_f64(c, buf, n) < 0)
        die("allreduce of %zu doubles: %s", n, coll_strerror(c));
    for (size_t i = 0; i < n; i++) {
        double want = 0;
        for (int r = 0; r < world; r++)
            want += 0.25 * (double)(r + 1) + (double)i * 1e9;
        if (buf[i] != want)
            die("allreduce of %zu doubles: element %zu is %.17g, expected %.17g", n, i, buf[i],
                want);
    }
    hash_bytes(buf, n * sizeof(double));
}

static void check_broadcast(struct coll *c, size_t bytes, int root)
{
    unsigned char *buf = malloc(bytes ? bytes : 1);

    if (!buf)
        die("out of memory for %zu bytes", bytes);
    for (size_t i = 0; i < bytes; i++)
        buf[i] = rank == root ? (unsigned char)mix(i + (size_t)root) : 0xee;
    if (coll_broadcast(c, buf, bytes, root) < 0)
        die("broadcast of %zu bytes from rank %d: %s", bytes, root, coll_strerror(c));
    for (size_t i = 0; i < bytes; i++)
        if (buf[i] != (unsigned char)mix(i + (size_t)root))
            die("broadcast of %zu bytes from rank %d: byte %zu is 0x%02x, expected 0x%02x", bytes,
                root, i, buf[i], (unsigned char)mix(i + (size_t)root));
    hash_bytes(buf, bytes);
    free(buf);
}

static void check_barrier(struct coll *c)
{
    int64_t t0;

    for (int i = 0; i < 50; i++)
        if (coll_barrier(c) < 0)
            die("barrier %d: %s", i, coll_strerror(c));
    if (rank == 0)
        sleep_ms(LATE_MS);
    t0 = now_ms();
    if (coll_barrier(c) < 0)
        die("barrier after a late rank: %s", coll_strerror(c));
    if (rank != 0 && now_ms() - t0 < LATE_SEEN_MS)
        die("barrier returned after %lld ms, before rank 0 (%d ms late) arrived",
            (long long)(now_ms() - t0), LATE_MS);
}

/* The last operation of a ring: rank 0 closes as soon as its own part is done, while rank
 * W-1 may still be receiving its part from rank W-2; that allreduce must still succeed
 * everywhere. A race, so tried on a few fresh rings. */
#define EARLY_CLOSE_ROUNDS 4

static void check_early_close(struct gr *g)
{
    size_t n = 1 << 20;
    float *buf = malloc(n * sizeof(float));
    struct coll *c = NULL;
    struct errmsg err;

    if (!buf)
        die("out of memory for %zu floats", n);
    for (int round = 0; round < EARLY_CLOSE_ROUNDS; round++) {
        if (coll_open("tcp", g, &c, &err) < 0)
            die("cannot open ring %d: %s", round, err.text);
        for (size_t i = 0; i < n; i++)
            buf[i] = exact_val(rank, i);
        if (coll_allreduce_sum_f32(c, buf, n) < 0)
            die("allreduce before rank 0 closes: %s", coll_strerror(c));
        if (rank == 0)
            coll_close(c);
        for (size_t i = 0; i < n; i++) {
            float want = 0;
            for (int r = 0; r < world; r++)
                want += exact_val(r, i);
            if (buf[i] != want)
                die("allreduce before rank 0 closes: element %zu is %g, expected %g", i, buf[i],
                    want);
        }
        if (rank != 0)
            coll_close(c);
    }
    free(buf);
}

/* Every rank's hash against rank 0's, through the store. */
static void compare_hashes(struct gr *g)
{
    char key[64], mine[32], got[32];
    size_t len = 0;

    snprintf(mine, sizeof(mine), "%016llx", (unsigned long long)hash);
    snprintf(key, sizeof(key), "coll_rank/hash/%d", rank);
    if (gr_kv_put(g, key, mine, strlen(mine)) < 0)
        die("cannot publish '%s': %s", key, gr_strerror(g));
    if (gr_kv_get(g, "coll_rank/hash/0", got, sizeof(got) - 1, &len, WAIT_MS) < 0)
        die("cannot read rank 0's hash: %s", gr_strerror(g));
    got[len] = '\0';
    if (strcmp(got, mine))
        die("results differ from rank 0's: hash %s, rank 0 has %s", mine, got);
    if (rank == 0)
        printf("hash %s\n", mine);
}

static void run_check(struct gr *g, struct coll *c)
{
    /* The largest: allreduces in several parts (W x COLL_RING_SEGMENT_BYTES), the last of
     * them short. */
    const size_t sizes[] = {
        0, 1, 2, 3, 4, 5, 7, 8, 1031, 65535, 65537, 262147, 1048576, 1000003, (4u << 20) + 3};
    const size_t bsizes[] = {1, 5, 4096, 300001, (4u << 20) + 7};

    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
        check_sum_f32(c, sizes[i]);
    /* The sizes around the world size: fewer elements than ranks, and one over. */
    check_sum_f32(c, (size_t)world - 1);
    check_sum_f32(c, (size_t)world + 1);
    for (size_t n = 1; n <= 9; n += 2)
        check_sum_f64(c, n);
    check_sum_f64(c, 256);
    for (int root = 0; root < world; root++)
        for (size_t i = 0; i < sizeof(bsizes) / sizeof(bsizes[0]); i++)
            check_broadcast(c, bsizes[i], root);
    if (coll_broadcast(c, &rank, sizeof(rank), world) != -EINVAL)
        die("broadcast from rank %d of %d was not refused", world, world);
    check_barrier(c);
    check_early_close(g);
    compare_hashes(g);
}

/* die and stall: the last rank leaves or goes quiet, the others must see an error soon. */
static void run_failure(struct coll *c, bool stall)
{
    size_t n = 4 << 20;
    float *buf = calloc(n, sizeof(float));
    int64_t t0;
    int ret;

    if (!buf)
        die("out of memory for %zu floats", n);
    /* One allreduce that works, so that the failure comes in the middle of a used ring. */
    if (coll_allreduce_sum_f32(c, buf, 1024) < 0)
        die("allreduce before the failure: %s", coll_strerror(c));
    if (rank == world - 1) {
        if (!stall)
            _exit(0);
        sleep_ms(STALL_MS);
        exit(0);
    }
    coll_set_timeout(c, 1000);
    t0 = now_ms();
    ret = coll_allreduce_sum_f32(c, buf, n);
    if (ret == 0)
        die("allreduce succeeded without rank %d", world - 1);
    if (now_ms() - t0 > DEAD_SEEN_MS)
        die("the failure took %lld ms to be seen", (long long)(now_ms() - t0));
    if (ret != -ECONNRESET && !(stall && ret == -ETIMEDOUT))
        die("allreduce returned %d (%s), not %s", ret, coll_strerror(c),
            stall ? "ETIMEDOUT or ECONNRESET" : "ECONNRESET");
    if (coll_barrier(c) != ret)
        die("a broken ring's next call returned another error than %d", ret);
    printf("rank %d/%d: error seen: %s\n", rank, world, coll_strerror(c));
    free(buf);
}

/* --- nccl ----------------------------------------------------------------------------------- */

#ifdef GPURUN_NCCL

#define CUDA_OK(call)                                                                              \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess)                                                                     \
            die("%s: %s", #call, cudaGetErrorString(e_));                                          \
    } while (0)

static cudaStream_t stream;

/* cudaMemcpy from pageable host memory may return before its copy has landed, and cudaMemset
 * returns at once: both run on the legacy default stream, which `stream` (non-blocking) does
 * not wait for. Called after them, before a collective on `stream` reads what they wrote. */
static void device_idle(void)
{
    CUDA_OK(cudaDeviceSynchronize());
}

/* A small integer, the same on every rank for (r, i): world * k sums and averages exactly. */
static int small_int(int r, size_t i, uint64_t seed)
{
    return (int)(mix(seed + (uint64_t)r * 0x100000001ULL + i) % 33) - 16;
}

static size_t dt_size(enum coll_dtype dt)
{
    return dt == COLL_BF16 ? 2 : 4;
}

static const char *dt_name(enum coll_dtype dt)
{
    return dt == COLL_BF16 ? "bf16" : "f32";
}

/* Stores v (an exact small value in both types) as element i of p. */
static void put_val(void *p, enum coll_dtype dt, size_t i, float v)
{
    uint32_t bits;

    memcpy(&bits, &v, sizeof(bits));
    if (dt == COLL_BF16) {
        uint16_t h = (uint16_t)(bits >> 16);
        memcpy((char *)p + 2 * i, &h, 2);
    } else {
        memcpy((char *)p + 4 * i, &bits, 4);
    }
}

static float get_val(const void *p, enum coll_dtype dt, size_t i)
{
    uint32_t bits = 0;
    float v;

    if (dt == COLL_BF16) {
        uint16_t h;
        memcpy(&h, (const char *)p + 2 * i, 2);
        bits = (uint32_t)h << 16;
    } else {
        memcpy(&bits, (const char *)p + 4 * i, 4);
    }
    memcpy(&v, &bits, sizeof(v));
    return v;
}

/* The bytes of want against got: the first element that differs fails the rank. */
static void expect_same(const char *what, const void *got, const void *want, size_t n,
                        enum coll_dtype dt)
{
    for (size_t i = 0; i < n; i++)
        if (memcmp((const char *)got + i * dt_size(dt), (const char *)want + i * dt_size(dt),
                   dt_size(dt)))
            die("%s: element %zu of %zu is %g, expected %g", what, i, n, get_val(got, dt, i),
                get_val(want, dt, i));
}

/* Allreduce average of n elements, in place. */
static void nccl_allreduce(struct coll *c, size_t n, enum coll_dtype dt, void *d, void *h,
                           void *want)
{
    uint64_t seed = n * 131 + (uint64_t)dt;
    char what[96];

    snprintf(what, sizeof(what), "device allreduce of %zu %s", n, dt_name(dt));
    for (size_t i = 0; i < n; i++) {
        int sum = 0;
        for (int r = 0; r < world; r++)
            sum += small_int(r, i, seed);
        put_val(h, dt, i, (float)(world * small_int(rank, i, seed)));
        put_val(want, dt, i, (float)sum);
    }
    CUDA_OK(cudaMemcpy(d, h, n * dt_size(dt), cudaMemcpyHostToDevice));
    device_idle();
    if (coll_dev_allreduce_avg(c, d, n, dt, stream) < 0)
        die("%s: %s", what, coll_strerror(c));
    CUDA_OK(cudaMemcpy(h, d, n * dt_size(dt), cudaMemcpyDeviceToHost));
    expect_same(what, h, want, n, dt);
    hash_bytes(h, n * dt_size(dt));
}

/* Reduce-scatter average of count elements per rank, in place (recv inside send) or not. */
static void nccl_reduce_scatter(struct coll *c, size_t count, enum coll_dtype dt, bool in_place,
                                void *d, void *d2, void *h, void *want)
{
    uint64_t seed = count * 177 + (uint64_t)dt + (in_place ? 7 : 0);
    size_t es = dt_size(dt), total = count * (size_t)world;
    void *recv = in_place ? (char *)d + (size_t)rank * count * es : d2;
    char what[128];

    snprintf(what, sizeof(what), "device reduce-scatter of %zu %s per rank%s", count, dt_name(dt),
             in_place ? " in place" : "");
    for (size_t i = 0; i < total; i++)
        put_val(h, dt, i, (float)(world * small_int(rank, i, seed)));
    for (size_t i = 0; i < count; i++) {
        int sum = 0;
        for (int r = 0; r < world; r++)
            sum += small_int(r, (size_t)rank * count + i, seed);
        put_val(want, dt, i, (float)sum);
    }
    CUDA_OK(cudaMemcpy(d, h, total * es, cudaMemcpyHostToDevice));
    if (!in_place)
        CUDA_OK(cudaMemset(d2, 0xff, count * es));
    device_idle();
    if (coll_dev_reduce_scatter_avg(c, d, recv, count, dt, stream) < 0)
        die("%s: %s", what, coll_strerror(c));
    CUDA_OK(cudaMemcpy(h, recv, count * es, cudaMemcpyDeviceToHost));
    /* Each rank has its own block: checked, not hashed. */
    expect_same(what, h, want, count, dt);
}

/* All-gather of count elements per rank, in place (send inside recv) or not. */
static void nccl_all_gather(struct coll *c, size_t count, enum coll_dtype dt, bool in_place,
                            void *d, void *d2, void *h, void *want)
{
    uint64_t seed = count * 191 + (uint64_t)dt + (in_place ? 5 : 0);
    size_t es = dt_size(dt), total = count * (size_t)world;
    void *send = in_place ? (char *)d + (size_t)rank * count * es : d2;
    char what[128];

    snprintf(what, sizeof(what), "device all-gather of %zu %s per rank%s", count, dt_name(dt),
             in_place ? " in place" : "");
    for (size_t i = 0; i < total; i++)
        put_val(want, dt, i, random_val((int)(i / count), i % count, seed));
    CUDA_OK(cudaMemset(d, 0xff, total * es));
    CUDA_OK(cudaMemcpy(send, (char *)want + (size_t)rank * count * es, count * es,
                       cudaMemcpyHostToDevice));
    device_idle();
    if (coll_dev_all_gather(c, send, d, count, dt, stream) < 0)
        die("%s: %s", what, coll_strerror(c));
    CUDA_OK(cudaMemcpy(h, d, total * es, cudaMemcpyDeviceToHost));
    expect_same(what, h, want, total, dt);
    hash_bytes(h, total * es);
}

/* The host operations on nccl: exact sums (the random ones' order is NCCL's, not the ring's),
 * averages of multiples of the world size, broadcasts across the staging piece, barriers. */
static void nccl_host_ops(struct coll *c)
{
    const size_t sizes[] = {1, 3, 1031, 1048576 + 5};
    const size_t bsizes[] = {1, 4096, (4u << 20) + 7};

    for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
        size_t n = sizes[k];
        float *buf = malloc(n * sizeof(float));
        if (!buf)
            die("out of memory for %zu floats", n);
        for (size_t i = 0; i < n; i++)
            buf[i] = exact_val(rank, i);
        if (coll_allreduce_sum_f32(c, buf, n) < 0)
            die("host allreduce of %zu floats: %s", n, coll_strerror(c));
        for (size_t i = 0; i < n; i++) {
            float want = 0;
            for (int r = 0; r < world; r++)
                want += exact_val(r, i);
            if (buf[i] != want)
                die("host allreduce of %zu floats: element %zu is %g, expected %g", n, i, buf[i],
                    want);
        }
        for (size_t i = 0; i < n; i++)
            buf[i] = (float)(world * small_int(rank, i, n));
        if (coll_allreduce_avg_f32(c, buf, n) < 0)
            die("host allreduce avg of %zu floats: %s", n, coll_strerror(c));
        for (size_t i = 0; i < n; i++) {
            int sum = 0;
            for (int r = 0; r < world; r++)
                sum += small_int(r, i, n);
            if (buf[i] != (float)sum)
                die("host allreduce avg of %zu floats: element %zu is %g, expected %d", n, i,
                    buf[i], sum);
        }
        hash_bytes(buf, n * sizeof(float));
        free(buf);
    }
    check_sum_f64(c, 5);
    check_sum_f64(c, 256);
    for (int root = 0; root < world; root++)
        for (size_t i = 0; i < sizeof(bsizes) / sizeof(bsizes[0]); i++)
            check_broadcast(c, bsizes[i], root);
    if (coll_broadcast(c, &rank, sizeof(rank), world) != -EINVAL)
        die("broadcast from rank %d of %d was not refused", world, world);
    check_barrier(c);
}

static void run_nccl_check(struct gr *g, struct coll *c)
{
    const size_t counts[] = {1, 2, 3, 7, 1031, 65537, 1000003};
    const enum coll_dtype dts[] = {COLL_F32, COLL_BF16};
    size_t max = 1000003 * (size_t)world * sizeof(float) + 64;
    void *d = NULL, *d2 = NULL, *h = malloc(max), *want = malloc(max);

    if (!h || !want)
        die("out of memory for %zu bytes", max);
    CUDA_OK(cudaMalloc(&d, max));
    CUDA_OK(cudaMalloc(&d2, max));
    for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]); k++)
        for (size_t t = 0; t < 2; t++) {
            nccl_allreduce(c, counts[k], dts[t], d, h, want);
            nccl_reduce_scatter(c, counts[k], dts[t], false, d, d2, h, want);
            nccl_reduce_scatter(c, counts[k], dts[t], true, d, d2, h, want);
            nccl_all_gather(c, counts[k], dts[t], false, d, d2, h, want);
            nccl_all_gather(c, counts[k], dts[t], true, d, d2, h, want);
        }
    nccl_host_ops(c);
    CUDA_OK(cudaFree(d));
    CUDA_OK(cudaFree(d2));
    free(h);
    free(want);
    compare_hashes(g);
}

/* nccl-die and nccl-stall: the last rank leaves, or goes quiet, once the communicator has
 * worked; the others must see an error within seconds, from their timeout or from NCCL. */
static void run_nccl_die(struct coll *c, bool stall)
{
    size_t n = 1 << 20;
    void *d = NULL;
    int64_t t0;
    int ret;

    CUDA_OK(cudaMalloc(&d, n * sizeof(float)));
    CUDA_OK(cudaMemset(d, 0, n * sizeof(float)));
    device_idle();
    if (coll_dev_allreduce_avg(c, d, 1024, COLL_F32, stream) < 0)
        die("allreduce before the failure: %s", coll_strerror(c));
    if (rank == world - 1) {
        if (!stall)
            _exit(0);
        sleep_ms(NCCL_STALL_MS);
        exit(0);
    }
    coll_set_timeout(c, 2000);
    t0 = now_ms();
    ret = coll_dev_allreduce_avg(c, d, n, COLL_F32, stream);
    if (ret == 0)
        die("allreduce succeeded without rank %d", world - 1);
    if (now_ms() - t0 > NCCL_DEAD_SEEN_MS)
        die("the failure took %lld ms to be seen", (long long)(now_ms() - t0));
    if (ret != -ETIMEDOUT && ret != -ECONNRESET && ret != -EIO)
        die("allreduce returned %d (%s), not ETIMEDOUT, ECONNRESET or EIO", ret, coll_strerror(c));
    if (!strstr(coll_strerror(c), "communicator aborted"))
        die("the error does not say the communicator was aborted: %s", coll_strerror(c));
    if (coll_barrier(c) != ret || coll_dev_allreduce_avg(c, d, 1, COLL_BF16, stream) != ret)
        die("a broken communicator's next call returned another error than %d", ret);
    printf("rank %d/%d: error seen: %s\n", rank, world, coll_strerror(c));
}

/* nccl-nojoin: every rank but the last must fail to open, naming the last one. */
static int run_nccl_nojoin(struct gr *g)
{
    struct coll *c = NULL;
    struct errmsg err;
    char want[64];
    int ret;

    if (rank == world - 1) {
        sleep_ms(NCCL_STALL_MS);
        exit(0);
    }
    ret = coll_open("nccl", g, &c, &err);
    if (ret == 0)
        die("the collectives opened without rank %d", world - 1);
    snprintf(want, sizeof(want), "rank %d did not join", world - 1);
    if (!strstr(err.text, want))
        die("coll_open returned %d, '%s', which does not say '%s'", ret, err.text, want);
    printf("rank %d/%d: error seen: %s\n", rank, world, err.text);
    if (gr_finalize(g) < 0)
        die("finalize: %s", gr_strerror(NULL));
    return 0;
}

/* Device LOCAL_RANK of those visible (the agent gives each rank its own GPU through
 * CUDA_VISIBLE_DEVICES, so that is usually the only one). */
static void nccl_device(struct gr *g)
{
    int n = 0;

    CUDA_OK(cudaGetDeviceCount(&n));
    CUDA_OK(cudaSetDevice(gr_local_rank(g) % n));
    CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
}

static int run_devices(void)
{
    struct cudaDeviceProp prop;
    int n = 0, version = 0;
    cudaError_t e = cudaGetDeviceCount(&n);

    ncclGetVersion(&version);
    if (e != cudaSuccess || n == 0) {
        printf("nccl %d.%d.%d devices 0 name -\n", version / 10000, version / 100 % 100,
               version % 100);
        return 0;
    }
    CUDA_OK(cudaGetDeviceProperties(&prop, 0));
    printf("nccl %d.%d.%d devices %d name %s\n", version / 10000, version / 100 % 100,
           version % 100, n, prop.name);
    return 0;
}

#else

static void nccl_device(struct gr *g)
{
    (void)g;
}

static void run_nccl_check(struct gr *g, struct coll *c)
{
    (void)g;
    (void)c;
}

static void run_nccl_die(struct coll *c, bool stall)
{
    (void)c;
    (void)stall;
}

static int run_nccl_nojoin(struct gr *g)
{
    (void)g;
    die("built without NCCL");
}

static int run_devices(void)
{
    printf("nccl none: built without NCCL\n");
    return 0;
}

#endif

int main(int argc, char **argv)
{
    static const char *const modes[] = {"check",    "die",        "stall",       "nccl-check",
                                        "nccl-die", "nccl-stall", "nccl-nojoin", "devices"};
    struct gr *g = NULL;
    struct coll *c = NULL;
    struct errmsg err;
    const char *mode = argc == 2 ? argv[1] : "";
    bool known = false, nccl = !strncmp(mode, "nccl-", 5);

    for (size_t i = 0; i < sizeof(modes) / sizeof(modes[0]); i++)
        known |= !strcmp(mode, modes[i]);
    if (!known) {
        fprintf(stderr, "usage: coll_rank "
                        "check|die|stall|nccl-check|nccl-die|nccl-stall|nccl-nojoin|devices\n");
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (!strcmp(mode, "devices"))
        return run_devices();
    if (gr_init(&g) < 0)
        die("cannot start: %s", gr_strerror(NULL));
    rank = gr_rank(g);
    world = gr_world_size(g);
    if (nccl)
        nccl_device(g);
    if (!strcmp(mode, "nccl-nojoin"))
        return run_nccl_nojoin(g);
    if (coll_open(nccl ? "nccl" : "tcp", g, &c, &err) < 0)
        die("cannot open the collectives: %s", err.text);
    if (coll_rank(c) != rank || coll_world_size(c) != world)
        die("coll has rank %d of %d", coll_rank(c), coll_world_size(c));
    printf("rank %d/%d: %s\n", rank, world, coll_describe(c));
    if (!strcmp(mode, "check")) {
        run_check(g, c);
        printf("rank %d/%d: all checks passed\n", rank, world);
    } else if (!strcmp(mode, "nccl-check")) {
        run_nccl_check(g, c);
        printf("rank %d/%d: all nccl checks passed\n", rank, world);
    } else if (nccl) {
        run_nccl_die(c, !strcmp(mode, "nccl-stall"));
    } else {
        run_failure(c, !strcmp(mode, "stall"));
    }
    coll_close(c);
    if (gr_finalize(g) < 0)
        die("finalize: %s", gr_strerror(NULL));
    return 0;
}
