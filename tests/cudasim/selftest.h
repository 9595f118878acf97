/* cudasim's self-test kernels (tests/cudasim/selftest.cu) as C functions for
 * tests/cudasim/test_cudasim.c. Host arrays in and out; each function allocates, copies,
 * launches and copies back, and returns the launch's error (cudaGetLastError after it, 0 for
 * success) unless said otherwise. Built into the sim flavour only. */
#ifndef GPURUN_CUDASIM_SELFTEST_H
#define GPURUN_CUDASIM_SELFTEST_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Each block of n threads (n <= 1024) reverses its slice of in (blocks * n floats) through
 * static shared memory; without the barrier between the writes and the reads. */
int selftest_reverse(float *out, const float *in, int blocks, int n, int with_barrier);
/* sums[b] = the sum of block b's n floats of in, by warp shuffles (xor, then down) and a
 * shared array across the warps. */
int selftest_reduce(float *sums, const float *in, int blocks, int n);
/* One block of n threads; for thread t, res[4t..4t+3] = lane 5's value broadcast (t's warp's
 * thread 5 holds 100 + its index), __shfl_up_sync(index, 1), __shfl_down_sync(index, 2, width
 * 8), __ballot_sync(lane % 3 == 0). */
int selftest_warp_ops(int *res, int n);
/* One block of n threads rotates in by one through dynamic shared memory of smem bytes
 * (out[t] = in[(t + 1) % n]); smem must hold n ints. */
int selftest_dyn_smem(int *out, const int *in, int n, size_t smem);
/* Grid (gx, gy, gz) of blocks (bx, by, bz): each thread writes its indices, packed as
 * tx | ty << 4 | tz << 8 | bx << 12 | by << 16 | bz << 20, at its linear position (blocks in
 * x-major order, threads x-major within a block). */
int selftest_indices(int *out, int gx, int gy, int gz, int bx, int by, int bz);
/* A launch of a trivial kernel with `threads` threads in one block. */
int selftest_launch_threads(int threads);
/* A launch asking for smem bytes of dynamic shared memory; with raise, after
 * cudaFuncSetAttribute allowed that much. Returns the launch's error, or the attribute call's. */
int selftest_launch_smem(size_t smem, int raise);
/* One block of n threads (n <= 64): out[t] = the value thread (t + 1) % n stored in shared
 * memory, read after a barrier or (with_barrier 0) without one: a race. */
int selftest_neighbour(int *out, int n, int with_barrier);
/* What the host sees of streams' work (CUDASIM_ASYNC=1 defers it), into obs[0..9]: a pinned
 * int that a kernel on a non-blocking stream sets to 1, read at once (0), then
 * cudaStreamQuery's answer (cudaErrorNotReady), the int after a cudaMemcpy on the legacy
 * stream (still 0), the second query's answer (cudaSuccess) and the int after it (1); the int
 * after a kernel on a blocking stream sets it to 2 and a legacy cudaMemcpy follows (2); a
 * pageable cudaMemcpyAsync on a second non-blocking stream made to wait (an event) for a
 * kernel setting 3 (3); a pinned int that a cudaMemcpyAsync on the first stream fills from a
 * kernel's 4, read before (0) and after (4) cudaStreamSynchronize; the device int after a
 * cudaMemcpyAsync from a pageable int that was changed right after the call (its old value,
 * 5). Returns cudaGetLastError at the end. */
int selftest_async(int *obs);

/* Stream capture and graphs, into obs[0..12]: a capture of a kernel adding k (2) to a device
 * int and a copy of it into another: cudaStreamIsCapturing's status inside (active, 1),
 * cudaStreamEndCapture's answer (0), the int after the capture (0: not run), the copy after
 * three launches of the graph, k changed to 100 meanwhile (6); then captures that the
 * runtime must refuse: cudaStreamSynchronize's answer inside one (cudaErrorStreamCapture-
 * Unsupported), the status after it (invalidated, 2), cudaStreamEndCapture's answer
 * (cudaErrorStreamCaptureInvalidated) and whether the graph is NULL (1); a copy from pageable
 * memory and the end's answer; a cudaMalloc and the end's answer; a capture of the legacy
 * stream's answer (unsupported). Returns cudaGetLastError at the end (0). */
int selftest_graph(int *obs);

/* Deliberate kernel bugs, each to run in a child process that cudasim ends with a message:
 * a write to element index of an allocation of n floats; */
void selftest_overrun(size_t n, size_t index);
/* a read of element index of an allocation of n floats; */
void selftest_overread(size_t n, size_t index);
/* a kernel argument that is host memory; */
void selftest_host_pointer(void);
/* a __syncthreads that half of the block never reaches (those threads have returned); */
void selftest_divergent_barrier(void);
/* two groups of the block at two different __syncthreads (an if and its else); */
void selftest_two_barriers(void);
/* a shuffle whose mask names a lane that has returned. */
void selftest_exited_lane(void);

#ifdef __cplusplus
}
#endif

#endif
