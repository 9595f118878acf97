/* cudasim's self-test kernels (selftest.h): small kernels whose answers are known exactly, each
 * exercising one part of the execution model (static and dynamic shared memory with barriers,
 * warp shuffles and votes, the index variables, launch errors), a kernel with a race that the
 * two schedules expose, and deliberate bugs that cudasim must stop with a message. Valid CUDA
 * too; built into the sim flavour only. */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#include "selftest.h"
#include "banned.h"

#define FULL_MASK 0xffffffffu
#define WARP      32

/* cudaMalloc'd copy of n host bytes (src NULL: left as cudaMalloc returns it). */
static void *dev_copy(const void *src, size_t n)
{
    void *d = NULL;
    if (cudaMalloc(&d, n) != cudaSuccess)
        return NULL;
    if (src)
        cudaMemcpy(d, src, n, cudaMemcpyHostToDevice);
    return d;
}

static int finish(void *host, void *dev, size_t n)
{
    int e = (int)cudaGetLastError();
    if (host && dev)
        cudaMemcpy(host, dev, n, cudaMemcpyDeviceToHost);
    cudaFree(dev);
    return e;
}

__global__ void reverse_kernel(float *out, const float *in, int n, int with_barrier)
{
    __shared__ float buf[1024];
    int t = threadIdx.x;
    size_t base = (size_t)blockIdx.x * n;
    buf[t] = in[base + t];
    if (with_barrier)
        __syncthreads();
    out[base + t] = buf[n - 1 - t];
}

int selftest_reverse(float *out, const float *in, int blocks, int n, int with_barrier)
{
    size_t bytes = (size_t)blocks * n * sizeof(float);
    float *din = (float *)dev_copy(in, bytes), *dout = (float *)dev_copy(NULL, bytes);
    reverse_kernel<<<blocks, n>>>(dout, din, n, with_barrier);
    cudaFree(din);
    return finish(out, dout, bytes);
}

__global__ void reduce_kernel(float *sums, const float *in, int n)
{
    __shared__ float warp_sums[WARP];
    int t = threadIdx.x, lane = t % WARP, warp = t / WARP, warps = (n + WARP - 1) / WARP;
    float x = in[(size_t)blockIdx.x * n + t];
    for (int o = WARP / 2; o > 0; o /= 2)
        x += __shfl_xor_sync(FULL_MASK, x, o);
    if (lane == 0)
        warp_sums[warp] = x;
    __syncthreads();
    if (warp == 0) {
        x = lane < warps ? warp_sums[lane] : 0.0f;
        for (int o = WARP / 2; o > 0; o /= 2)
            x += __shfl_down_sync(FULL_MASK, x, o);
        if (lane == 0)
            sums[blockIdx.x] = x;
    }
}

int selftest_reduce(float *sums, const float *in, int blocks, int n)
{
    float *din = (float *)dev_copy(in, (size_t)blocks * n * sizeof(float));
    float *dsum = (float *)dev_copy(NULL, (size_t)blocks * sizeof(float));
    reduce_kernel<<<blocks, n>>>(dsum, din, n);
    cudaFree(din);
    return finish(sums, dsum, (size_t)blocks * sizeof(float));
}

__global__ void warp_ops_kernel(int *res)
{
    int t = threadIdx.x, lane = t % WARP;
    int *r = res + 4 * t;
    r[0] = __shfl_sync(FULL_MASK, 100 + t, 5);
    r[1] = __shfl_up_sync(FULL_MASK, t, 1);
    r[2] = __shfl_down_sync(FULL_MASK, t, 2, 8);
    r[3] = (int)__ballot_sync(FULL_MASK, lane % 3 == 0);
}

int selftest_warp_ops(int *res, int n)
{
    size_t bytes = (size_t)n * 4 * sizeof(int);
    int *d = (int *)dev_copy(NULL, bytes);
    warp_ops_kernel<<<1, n>>>(d);
    return finish(res, d, bytes);
}

__global__ void dyn_smem_kernel(int *out, const int *in)
{
    extern __shared__ int dyn[];
    int t = threadIdx.x, n = blockDim.x;
    dyn[t] = in[t];
    __syncthreads();
    out[t] = dyn[(t + 1) % n];
}

int selftest_dyn_smem(int *out, const int *in, int n, size_t smem)
{
    size_t bytes = (size_t)n * sizeof(int);
    int *din = (int *)dev_copy(in, bytes), *dout = (int *)dev_copy(NULL, bytes);
    dyn_smem_kernel<<<1, n, smem>>>(dout, din);
    cudaFree(din);
    return finish(out, dout, bytes);
}

__global__ void indices_kernel(int *out)
{
    size_t block = ((size_t)blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
    size_t thread = ((size_t)threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x;
    size_t per_block = (size_t)blockDim.x * blockDim.y * blockDim.z;
    out[block * per_block + thread] = (int)(threadIdx.x | threadIdx.y << 4 | threadIdx.z << 8 |
                                            blockIdx.x << 12 | blockIdx.y << 16 | blockIdx.z << 20);
}

int selftest_indices(int *out, int gx, int gy, int gz, int bx, int by, int bz)
{
    size_t bytes = (size_t)gx * gy * gz * bx * by * bz * sizeof(int);
    int *d = (int *)dev_copy(NULL, bytes);
    indices_kernel<<<dim3(gx, gy, gz), dim3(bx, by, bz)>>>(d);
    return finish(out, d, bytes);
}

__global__ void nothing_kernel(int *out)
{
    if (out)
        out[threadIdx.x] = 1;
}

int selftest_launch_threads(int threads)
{
    nothing_kernel<<<1, threads>>>(NULL);
    return (int)cudaGetLastError();
}

__global__ void smem_kernel(int *out)
{
    extern __shared__ int big[];
    big[threadIdx.x] = (int)threadIdx.x;
    __syncthreads();
    if (out)
        out[threadIdx.x] = big[threadIdx.x];
}

int selftest_launch_smem(size_t smem, int raise)
{
    if (raise) {
        cudaError_t e = cudaFuncSetAttribute(
            smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) {
            cudaGetLastError();
            return (int)e;
        }
    }
    smem_kernel<<<1, 32, smem>>>(NULL);
    return (int)cudaGetLastError();
}

__global__ void neighbour_kernel(int *out, int with_barrier)
{
    __shared__ int buf[64];
    int t = threadIdx.x;
    buf[t] = t + 1;
    if (with_barrier)
        __syncthreads();
    out[t] = buf[(t + 1) % blockDim.x];
}

int selftest_neighbour(int *out, int n, int with_barrier)
{
    size_t bytes = (size_t)n * sizeof(int);
    int *d = (int *)dev_copy(NULL, bytes);
    neighbour_kernel<<<1, n>>>(d, with_barrier);
    return finish(out, d, bytes);
}

__global__ void set_kernel(int *p, int *q, int v)
{
    if (threadIdx.x == 0) {
        *p = v;
        *q = v;
    }
}

int selftest_async(int *obs)
{
    cudaStream_t nb = NULL, nb2 = NULL, bl = NULL;
    cudaEvent_t ev = NULL;
    int *pinned = NULL, *pinned2 = NULL, *d = NULL, *other = NULL, host = 0, v = 0, e;

    if (cudaStreamCreateWithFlags(&nb, cudaStreamNonBlocking) ||
        cudaStreamCreateWithFlags(&nb2, cudaStreamNonBlocking) || cudaStreamCreate(&bl) ||
        cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) ||
        cudaMallocHost((void **)&pinned, sizeof(int)) ||
        cudaMallocHost((void **)&pinned2, sizeof(int)) || cudaMalloc((void **)&d, sizeof(int)) ||
        cudaMalloc((void **)&other, sizeof(int)))
        return (int)cudaGetLastError();
    *pinned = *pinned2 = 0;
    cudaMemcpy(d, &host, sizeof(int), cudaMemcpyHostToDevice);

    /* A kernel on a non-blocking stream, then host reads without a synchronisation. */
    set_kernel<<<1, 32, 0, nb>>>(pinned, d, 1);
    obs[0] = *pinned;
    obs[1] = (int)cudaStreamQuery(nb);
    cudaMemcpy(other, &host, sizeof(int), cudaMemcpyHostToDevice); /* the legacy stream */
    obs[2] = *pinned;
    obs[3] = (int)cudaStreamQuery(nb);
    obs[4] = *pinned;
    /* A blocking stream: the legacy stream's next operation waits for it. */
    set_kernel<<<1, 32, 0, bl>>>(pinned, d, 2);
    cudaMemcpy(other, &host, sizeof(int), cudaMemcpyHostToDevice);
    obs[5] = *pinned;
    /* An event orders two non-blocking streams; a copy into pageable memory completes. */
    set_kernel<<<1, 32, 0, nb>>>(pinned, d, 3);
    cudaEventRecord(ev, nb);
    cudaStreamWaitEvent(nb2, ev, 0);
    cudaMemcpyAsync(&host, d, sizeof(int), cudaMemcpyDeviceToHost, nb2);
    obs[6] = host;
    /* A copy into pinned memory waits in the queue; one from pageable memory is staged. */
    set_kernel<<<1, 32, 0, nb>>>(pinned, d, 4);
    cudaMemcpyAsync(pinned2, d, sizeof(int), cudaMemcpyDeviceToHost, nb);
    obs[7] = *pinned2;
    v = 5;
    cudaMemcpyAsync(d, &v, sizeof(int), cudaMemcpyHostToDevice, nb);
    v = 6;
    cudaStreamSynchronize(nb);
    obs[8] = *pinned2;
    cudaMemcpy(&host, d, sizeof(int), cudaMemcpyDeviceToHost);
    obs[9] = host;

    e = (int)cudaGetLastError();
    cudaFree(d);
    cudaFree(other);
    cudaFreeHost(pinned);
    cudaFreeHost(pinned2);
    cudaEventDestroy(ev);
    cudaStreamDestroy(nb);
    cudaStreamDestroy(nb2);
    cudaStreamDestroy(bl);
    return e;
}

__global__ void add_kernel(int *d, int k)
{
    if (threadIdx.x == 0)
        *d += k;
}

int selftest_graph(int *obs)
{
    cudaStream_t s = NULL;
    cudaGraph_t g = NULL;
    cudaGraphExec_t x = NULL;
    enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    int *d = NULL, *d2 = NULL, host = 0, k = 2;
    void *p = NULL;

    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) ||
        cudaMalloc((void **)&d, sizeof(int)) || cudaMalloc((void **)&d2, sizeof(int)))
        return (int)cudaGetLastError();
    cudaMemset(d, 0, sizeof(int));
    cudaMemset(d2, 0, sizeof(int));

    /* Recorded, not run: add k (its value at the capture), then copy into d2. */
    cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
    add_kernel<<<1, 32, 0, s>>>(d, k);
    cudaMemcpyAsync(d2, d, sizeof(int), cudaMemcpyDeviceToDevice, s);
    cudaStreamIsCapturing(s, &st);
    obs[0] = (int)st;
    obs[1] = (int)cudaStreamEndCapture(s, &g);
    k = 100;
    cudaMemcpy(&host, d, sizeof(int), cudaMemcpyDeviceToHost);
    obs[2] = host;
    cudaGraphInstantiate(&x, g, 0);
    cudaGraphDestroy(g);
    for (int i = 0; i < 3; i++)
        cudaGraphLaunch(x, s);
    cudaStreamSynchronize(s);
    cudaMemcpy(&host, d2, sizeof(int), cudaMemcpyDeviceToHost);
    obs[3] = host;

    /* What a capture refuses, each invalidating it. */
    cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
    obs[4] = (int)cudaStreamSynchronize(s);
    cudaStreamIsCapturing(s, &st);
    obs[5] = (int)st;
    obs[6] = (int)cudaStreamEndCapture(s, &g);
    obs[7] = g == NULL;
    cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
    obs[8] = (int)cudaMemcpyAsync(d, &host, sizeof(int), cudaMemcpyHostToDevice, s);
    obs[9] = (int)cudaStreamEndCapture(s, &g);
    cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
    obs[10] = (int)cudaMalloc(&p, 64);
    obs[11] = (int)cudaStreamEndCapture(s, &g);
    /* The legacy default stream cannot capture. */
    obs[12] = (int)cudaStreamBeginCapture(0, cudaStreamCaptureModeThreadLocal);

    cudaGetLastError();
    cudaGraphExecDestroy(x);
    cudaFree(d);
    cudaFree(d2);
    cudaStreamDestroy(s);
    return (int)cudaGetLastError();
}

__global__ void store_kernel(float *p, size_t index)
{
    if (threadIdx.x == 0)
        p[index] = 1.0f;
}

void selftest_overrun(size_t n, size_t index)
{
    float *d = (float *)dev_copy(NULL, n * sizeof(float));
    store_kernel<<<1, 32>>>(d, index);
    cudaDeviceSynchronize();
    cudaFree(d);
}

__global__ void load_kernel(float *p, size_t index)
{
    if (threadIdx.x == 0)
        p[0] = p[index];
}

void selftest_overread(size_t n, size_t index)
{
    float *d = (float *)dev_copy(NULL, n * sizeof(float));
    load_kernel<<<1, 32>>>(d, index);
    cudaDeviceSynchronize();
    cudaFree(d);
}

void selftest_host_pointer(void)
{
    float *h = (float *)malloc(64 * sizeof(float));
    store_kernel<<<1, 32>>>(h, 0);
    free(h);
}

__global__ void divergent_kernel(int *out)
{
    if (threadIdx.x < blockDim.x / 2)
        return;
    __syncthreads();
    out[threadIdx.x] = 1;
}

void selftest_divergent_barrier(void)
{
    int *d = (int *)dev_copy(NULL, 64 * sizeof(int));
    divergent_kernel<<<1, 64>>>(d);
    cudaFree(d);
}

__global__ void two_barriers_kernel(int *out)
{
    int t = threadIdx.x;
    if (t % 2) {
        out[t] = 1;
        __syncthreads();
    } else {
        out[t] = 2;
        __syncthreads();
    }
}

void selftest_two_barriers(void)
{
    int *d = (int *)dev_copy(NULL, 64 * sizeof(int));
    two_barriers_kernel<<<1, 64>>>(d);
    cudaFree(d);
}

__global__ void exited_lane_kernel(int *out)
{
    int t = threadIdx.x;
    if (t == 3)
        return;
    out[t] = __shfl_xor_sync(FULL_MASK, t, 1);
}

void selftest_exited_lane(void)
{
    int *d = (int *)dev_copy(NULL, 32 * sizeof(int));
    exited_lane_kernel<<<1, 32>>>(d);
    cudaFree(d);
}
