/* Tests of cudasim itself (tests/cudasim/): the execution model on kernels with known answers
 * (selftest.cu), its race detection (a kernel without its barrier gives different results under
 * the two schedules), launch errors as CUDA reports them, the runtime's device and memory
 * checks, and the kernel bugs it must stop with a message (run in a child process each). Linked
 * into the sim flavour's runner only. */
#include <cuda_runtime_api.h>

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../test.h"
#include "selftest.h"
#include "banned.h"

/* ---- helpers ------------------------------------------------------------------------------- */

static void set_schedule(const char *s)
{
    CHECK_EQ(setenv("CUDASIM_SCHEDULE", s, 1), 0);
}

/* The child's body for expect_death: one of the deliberate bugs, with its arguments. */
static void (*child_fn)(void);
static size_t overrun_n, overrun_index;

static void overrun(void)
{
    selftest_overrun(overrun_n, overrun_index);
}

static void overread(void)
{
    selftest_overread(overrun_n, overrun_index);
}

/* Runs child_fn in a child process with its output captured into out (len bytes) and checks
 * that it died of signal sig and said `says`. */
static void expect_death(void (*fn)(void), int sig, const char *says)
{
    char out[4096];
    int fds[2], status = 0;
    ssize_t n, got = 0;
    pid_t pid;

    child_fn = fn;
    CHECK_EQ(pipe(fds), 0);
    fflush(stdout);
    fflush(stderr);
    pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        struct rlimit no_core = {0, 0};
        setrlimit(RLIMIT_CORE, &no_core);
        dup2(fds[1], 2);
        dup2(fds[1], 1);
        close(fds[0]);
        close(fds[1]);
        child_fn();
        fprintf(stderr, "the child survived\n");
        _exit(0);
    }
    close(fds[1]);
    while ((n = read(fds[0], out + got, sizeof(out) - 1 - (size_t)got)) > 0)
        got += n;
    close(fds[0]);
    out[got] = '\0';
    CHECK_EQ(waitpid(pid, &status, 0), pid);
    fprintf(stderr, "child output: %s", out);
    if (!WIFSIGNALED(status))
        test_fail(__FILE__, __LINE__, "the child exited with status %d instead of dying of %s",
                  WEXITSTATUS(status), strsignal(sig));
    CHECK_EQ(WTERMSIG(status), sig);
    CHECK_CONTAINS(out, says);
}

/* ---- the execution model ------------------------------------------------------------------- */

/* Static shared memory and __syncthreads: each block reverses its slice, in either schedule. */
TEST(cudasim_shared_memory_barrier)
{
    enum { BLOCKS = 3, N = 256 };
    static float in[BLOCKS * N], out[BLOCKS * N];
    const char *schedules[] = {"forward", "reverse"};

    for (int i = 0; i < BLOCKS * N; i++)
        in[i] = (float)i;
    for (int s = 0; s < 2; s++) {
        set_schedule(schedules[s]);
        memset(out, 0, sizeof(out));
        CHECK_EQ(selftest_reverse(out, in, BLOCKS, N, 1), cudaSuccess);
        for (int b = 0; b < BLOCKS; b++)
            for (int t = 0; t < N; t++)
                if (out[b * N + t] != in[b * N + N - 1 - t])
                    test_fail(__FILE__, __LINE__, "%s: block %d thread %d: %g, not %g",
                              schedules[s], b, t, (double)out[b * N + t],
                              (double)in[b * N + N - 1 - t]);
    }
}

/* Warp shuffles (xor and down) and shared memory across warps sum each block exactly. */
TEST(cudasim_shuffle_reduction)
{
    enum { BLOCKS = 4 };
    static float in[BLOCKS * 1024], sums[BLOCKS];
    const int sizes[] = {32, 96, 256, 1024};

    for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
        int n = sizes[k];
        for (int i = 0; i < BLOCKS * n; i++)
            in[i] = (float)(i % 7 + 1);
        CHECK_EQ(selftest_reduce(sums, in, BLOCKS, n), cudaSuccess);
        for (int b = 0; b < BLOCKS; b++) {
            double want = 0.0;
            for (int t = 0; t < n; t++)
                want += in[b * n + t];
            if (sums[b] != (float)want)
                test_fail(__FILE__, __LINE__, "n %d block %d: sum %g, not %g", n, b,
                          (double)sums[b], want);
        }
    }
}

/* __shfl_sync broadcast, __shfl_up_sync at the warp's start, __shfl_down_sync within segments of
 * width 8, __ballot_sync. */
TEST(cudasim_warp_operations)
{
    enum { N = 64 };
    static int res[N * 4];
    unsigned ballot = 0;

    for (int l = 0; l < 32; l++)
        if (l % 3 == 0)
            ballot |= 1u << l;
    CHECK_EQ(selftest_warp_ops(res, N), cudaSuccess);
    for (int t = 0; t < N; t++) {
        int lane = t % 32, warp = t / 32;
        CHECK_EQ(res[4 * t], 100 + warp * 32 + 5);
        CHECK_EQ(res[4 * t + 1], lane >= 1 ? t - 1 : t);
        CHECK_EQ(res[4 * t + 2], lane % 8 + 2 < 8 ? t + 2 : t);
        CHECK_EQ((unsigned)res[4 * t + 3], ballot);
    }
}

/* extern __shared__: exactly the launch's bytes, shared by the block, across a barrier. */
TEST(cudasim_dynamic_shared_memory)
{
    enum { N = 128 };
    static int in[N], out[N];

    for (int i = 0; i < N; i++)
        in[i] = 1000 + i;
    CHECK_EQ(selftest_dyn_smem(out, in, N, N * sizeof(int)), cudaSuccess);
    for (int t = 0; t < N; t++)
        CHECK_EQ(out[t], in[(t + 1) % N]);
}

/* threadIdx, blockIdx, blockDim, gridDim in three dimensions, x fastest. */
TEST(cudasim_indices)
{
    enum { GX = 2, GY = 3, GZ = 2, BX = 4, BY = 2, BZ = 3 };
    static int out[GX * GY * GZ * BX * BY * BZ];
    int i = 0;

    CHECK_EQ(selftest_indices(out, GX, GY, GZ, BX, BY, BZ), cudaSuccess);
    for (int bz = 0; bz < GZ; bz++)
        for (int by = 0; by < GY; by++)
            for (int bx = 0; bx < GX; bx++)
                for (int tz = 0; tz < BZ; tz++)
                    for (int ty = 0; ty < BY; ty++)
                        for (int tx = 0; tx < BX; tx++, i++)
                            CHECK_EQ(out[i],
                                     tx | ty << 4 | tz << 8 | bx << 12 | by << 16 | bz << 20);
}

/* A bad configuration runs nothing and leaves its error for cudaGetLastError, which clears it;
 * dynamic shared memory above 48 KiB needs cudaFuncSetAttribute, and 227 KiB is the most. */
TEST(cudasim_launch_errors)
{
    CHECK_EQ(selftest_launch_threads(1025), cudaErrorInvalidConfiguration);
    CHECK_EQ(cudaGetLastError(), cudaSuccess);
    CHECK_EQ(selftest_launch_threads(0), cudaErrorInvalidConfiguration);
    CHECK_EQ(selftest_launch_threads(1024), cudaSuccess);
    CHECK_EQ(selftest_launch_smem(48 << 10, 0), cudaSuccess);
    CHECK_EQ(selftest_launch_smem(64 << 10, 0), cudaErrorInvalidValue);
    CHECK_EQ(selftest_launch_smem(64 << 10, 1), cudaSuccess);
    CHECK_EQ(selftest_launch_smem(300 << 10, 1), cudaErrorInvalidValue);
    CHECK_STR(cudaGetErrorString(cudaErrorInvalidConfiguration), "invalid configuration argument");
}

/* The race detector: a kernel missing its barrier gives different results under the forward
 * and reverse schedules; with the barrier, the right one under both. */
TEST(cudasim_race_detected)
{
    enum { N = 64 };
    static int fwd[N], rev[N], in[N * 4];
    static float fin[N], ffwd[N], frev[N];

    set_schedule("forward");
    CHECK_EQ(selftest_neighbour(fwd, N, 0), cudaSuccess);
    set_schedule("reverse");
    CHECK_EQ(selftest_neighbour(rev, N, 0), cudaSuccess);
    CHECK(memcmp(fwd, rev, sizeof(fwd)) != 0);

    for (int s = 0; s < 2; s++) {
        int *out = s ? rev : fwd;
        set_schedule(s ? "reverse" : "forward");
        CHECK_EQ(selftest_neighbour(out, N, 1), cudaSuccess);
        for (int t = 0; t < N; t++)
            CHECK_EQ(out[t], (t + 1) % N + 1);
    }
    CHECK(memcmp(fwd, rev, sizeof(fwd)) == 0);

    /* Shared memory starts as 0xff bytes: a read before the write shows as NaN. */
    for (int i = 0; i < N; i++)
        fin[i] = (float)i;
    set_schedule("forward");
    CHECK_EQ(selftest_reverse(ffwd, fin, 1, N, 0), cudaSuccess);
    set_schedule("reverse");
    CHECK_EQ(selftest_reverse(frev, fin, 1, N, 0), cudaSuccess);
    CHECK(ffwd[0] != ffwd[0]);
    CHECK(frev[N - 1] != frev[N - 1]);
    (void)in;
}

/* CUDASIM_ASYNC=1: a stream's work waits until CUDA's rules force it, so a host read without
 * a synchronisation sees the old data; the legacy stream waits for blocking streams only. */
TEST(cudasim_async_streams)
{
    static const int want[10] = {0, cudaErrorNotReady, 0, cudaSuccess, 1, 2, 3, 0, 4, 5};
    int obs[10];

    /* Before this process's first CUDA call: the runtime reads it once. */
    CHECK_EQ(setenv("CUDASIM_ASYNC", "1", 1), 0);
    memset(obs, 0xff, sizeof(obs));
    CHECK_EQ(selftest_async(obs), cudaSuccess);
    for (int i = 0; i < 10; i++)
        CHECK_EQ(obs[i], want[i]);
}

/* Stream capture: the work is recorded, replayed by each launch with the arguments of the
 * capture; what CUDA refuses in a capture invalidates it. */
TEST(cudasim_graphs)
{
    int obs[13];
    const int U = cudaErrorStreamCaptureUnsupported, I = cudaErrorStreamCaptureInvalidated;
    const int want[13] = {cudaStreamCaptureStatusActive,
                          0,
                          0,
                          6,
                          U,
                          cudaStreamCaptureStatusInvalidated,
                          I,
                          1,
                          U,
                          I,
                          U,
                          I,
                          U};

    memset(obs, 0xff, sizeof(obs));
    CHECK_EQ(selftest_graph(obs), cudaSuccess);
    for (int i = 0; i < 13; i++)
        CHECK_EQ(obs[i], want[i]);
}

/* ---- the runtime ----------------------------------------------------------------------------- */

/* CUDASIM_DEVICES=0: no device, as a machine without a GPU answers. */
TEST(cudasim_no_device)
{
    int n = -1;
    void *p = NULL;

    /* Before this process's first CUDA call: the runtime reads it once. */
    CHECK_EQ(setenv("CUDASIM_DEVICES", "0", 1), 0);
    CHECK_EQ(cudaGetDeviceCount(&n), cudaErrorNoDevice);
    CHECK_EQ(n, 0);
    CHECK_EQ(cudaMalloc(&p, 64), cudaErrorNoDevice);
    CHECK_EQ(cudaGetLastError(), cudaErrorNoDevice);
    CHECK_EQ(cudaGetLastError(), cudaSuccess);
}

/* Copies and fills stay inside their allocation; freeing twice, or a host pointer, is refused. */
TEST(cudasim_memory_checks)
{
    float *d = NULL, host[80];
    struct cudaDeviceProp prop;

    /* cudaMalloc's alignment (CUDASIM_TIGHT=1 gives it up, read at the first allocation). */
    CHECK_EQ(unsetenv("CUDASIM_TIGHT"), 0);

    CHECK_EQ(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
    CHECK_STR(prop.name, "cudasim");
    CHECK_EQ(prop.major, 9);
    CHECK_EQ(cudaMalloc((void **)&d, 64 * sizeof(float)), cudaSuccess);
    CHECK_EQ((uintptr_t)d % 256, 0);
    /* Fresh memory reads as 0xff bytes: NaN. */
    CHECK_EQ(cudaMemcpy(host, d, 64 * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    CHECK(host[0] != host[0] && host[63] != host[63]);
    CHECK_EQ(cudaMemcpy(d, host, 80 * sizeof(float), cudaMemcpyHostToDevice),
             cudaErrorInvalidValue);
    CHECK_EQ(cudaMemcpy(host, host + 1, sizeof(float), cudaMemcpyDeviceToHost),
             cudaErrorInvalidValue);
    CHECK_EQ(cudaMemset(d + 1, 0, 64 * sizeof(float)), cudaErrorInvalidValue);
    CHECK_EQ(cudaMemset(d, 0, 64 * sizeof(float)), cudaSuccess);
    CHECK_EQ(cudaGetLastError(), cudaErrorInvalidValue);
    CHECK_EQ(cudaFree(d), cudaSuccess);
    CHECK_EQ(cudaFree(d), cudaErrorInvalidValue);
    CHECK_EQ(cudaFree(host), cudaErrorInvalidValue);
}

/* ---- kernel bugs cudasim stops ------------------------------------------------------------- */

/* CUDASIM_TIGHT=1: an allocation ends at the guard page, so a read just past it faults. */
TEST(cudasim_tight_read)
{
    CHECK_EQ(setenv("CUDASIM_TIGHT", "1", 1), 0);
    overrun_n = 60;
    overrun_index = 60;
    expect_death(overread, SIGSEGV, "1 byte(s) beyond the last byte of a 240-byte allocation");
}

/* A write just past an allocation whose size is a multiple of 256 hits the guard page. */
TEST(cudasim_guard_page)
{
    overrun_n = 64;
    overrun_index = 64;
    expect_death(overrun, SIGSEGV, "beyond the last byte of a 256-byte allocation");
    CHECK(1);
}

/* Past a 240-byte allocation, before the guard: the canary, checked after the launch. */
TEST(cudasim_canary)
{
    CHECK_EQ(unsetenv("CUDASIM_TIGHT"), 0);
    overrun_n = 60;
    overrun_index = 61;
    expect_death(overrun, SIGABRT, "beyond the last byte of a 240-byte cudaMalloc allocation");
}

TEST(cudasim_host_pointer_argument)
{
    expect_death(selftest_host_pointer, SIGABRT, "is not device memory");
}

TEST(cudasim_divergent_barrier)
{
    expect_death(selftest_divergent_barrier, SIGABRT, "a barrier in divergent code");
}

TEST(cudasim_two_barriers)
{
    expect_death(selftest_two_barriers, SIGABRT, "must reach the same one");
}

TEST(cudasim_exited_lane)
{
    expect_death(selftest_exited_lane, SIGABRT, "exited while lane");
}
