/* Token + position embedding on the GPU (cuda_ops.h; reference: ops_encoder_forward/backward).
 *
 * Forward: out[b,t,c] = wte[inp[b,t],c] + wpe[t,c]; out (B,T,C), wte (V,C), wpe (maxT,C), one
 * thread per element.
 * Backward: dwpe[t,c] += sum_b dout[b,t,c] (one thread per (t,c), b in order) and dwte[v,c] +=
 * sum over the positions p holding token v of dout[p,c]. The positions are grouped by token on
 * the host (a stable counting sort: ascending positions within a token), so that one thread
 * sums each (v,c) in position order: deterministic and without atomics, which bf16 rows would
 * otherwise need. Each sum is in fp32 and added to the gradient once. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common.cuh"
#include "banned.h"

template <typename T>
__global__ void encoder_forward_kernel(T *out, const int *inp, const T *wte, const T *wpe, int T_,
                                       int C, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t bt = i / (size_t)C;
        int c = (int)(i % (size_t)C), t = (int)(bt % (size_t)T_);
        stx(out + i, ldx(wte + (size_t)inp[bt] * C + c) + ldx(wpe + (size_t)t * C + c));
    }
}

/* grid.x: one block per token in use (bucket u); grid.y and the threads: the channels. */
template <typename T>
__global__ void encoder_dwte_kernel(T *dwte, const T *dout, const int *tokens, const int *starts,
                                    const int *positions, int C)
{
    int u = blockIdx.x, c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    float sum = 0.0f;
    /* Unrolled so that several rows' loads are in flight (a frequent token has thousands of
     * positions); the additions stay in position order. */
#pragma unroll 8
    for (int k = starts[u]; k < starts[u + 1]; k++)
        sum += ldx(dout + (size_t)positions[k] * C + c);
    T *row = dwte + (size_t)tokens[u] * C;
    stx(row + c, ldx(row + c) + sum);
}

template <typename T>
__global__ void encoder_dwpe_kernel(T *dwpe, const T *dout, int B, int T_, int C)
{
    size_t n = (size_t)T_ * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float sum = 0.0f;
        for (int b = 0; b < B; b++)
            sum += ldx(dout + (size_t)b * n + i);
        stx(dwpe + i, ldx(dwpe + i) + sum);
    }
}

static int check_shape(struct gpu_ctx *ctx, const char *op, int B, int T, int C)
{
    if (B <= 0 || T <= 0 || C <= 0)
        return ctx_fail(ctx, -EINVAL, op, "B (%d), T (%d) and C (%d) must be positive", B, T, C);
    return 0;
}

template <typename T>
static int encoder_forward(struct gpu_ctx *ctx, void *out, const int *inp, const void *wte,
                           const void *wpe, int B, int T_, int C)
{
    size_t n = (size_t)B * T_ * C;
    encoder_forward_kernel<T><<<grid_for(n, 256), 256, 0, ctx->stream>>>(
        (T *)out, inp, (const T *)wte, (const T *)wpe, T_, C, n);
    return ctx_launched(ctx, "encoder_forward");
}

int gpu_encoder_forward(struct gpu_ctx *ctx, enum gpu_dtype dt, void *out, const int *inp,
                        const void *wte, const void *wpe, int B, int T, int C)
{
    int ret = check_shape(ctx, "encoder_forward", B, T, C);
    if (ret < 0)
        return ret;
    DISPATCH_DTYPE(ctx, "encoder_forward", dt, ret, encoder_forward, ctx, out, inp, wte, wpe, B, T,
                   C);
    return ret;
}

/* The buckets of the backward: for each token in use (ascending), its positions ascending.
 * host (N + 2U + 1 ints): positions (N), starts (U + 1), tokens (U). */
struct buckets {
    int *host;
    int n_used;
};

static int make_buckets(struct gpu_ctx *ctx, struct buckets *bk, const int *inp, int N, int V)
{
    int ret = -1;
    int *count = (int *)calloc((size_t)V + 1, sizeof(int));
    int *host = (int *)malloc(((size_t)3 * N + 1) * sizeof(int));
    int *positions, *starts, *tokens, used = 0;

    if (!count || !host) {
        ret = ctx_fail(ctx, -ENOMEM, "encoder_backward", "out of memory for %d positions", N);
        goto out;
    }
    for (int p = 0; p < N; p++) {
        if (inp[p] < 0 || inp[p] >= V) {
            ret = ctx_fail(ctx, -EINVAL, "encoder_backward",
                           "token %d at position %d is outside [0, %d)", inp[p], p, V);
            goto out;
        }
        count[inp[p] + 1]++;
    }
    for (int v = 0; v < V; v++)
        used += count[v + 1] > 0;
    positions = host;
    starts = host + N;
    tokens = starts + used + 1;
    /* count[v] becomes the first slot of token v; then positions go in ascending order. */
    for (int v = 0, u = 0; v < V; v++) {
        if (count[v + 1]) {
            starts[u] = count[v];
            tokens[u++] = v;
        }
        count[v + 1] += count[v];
    }
    starts[used] = N;
    for (int p = 0; p < N; p++)
        positions[count[inp[p]]++] = p;
    bk->host = host;
    bk->n_used = used;
    host = NULL;
    ret = 0;
out:
    free(count);
    free(host);
    return ret;
}

template <typename T>
static int encoder_backward(struct gpu_ctx *ctx, void *dwte, void *dwpe, const void *dout,
                            const int *inp_host, int B, int T_, int C, int V)
{
    const char *op = "encoder_backward";
    struct buckets bk = {NULL, 0};
    int N = B * T_, ret;
    size_t ints;
    void *dev = NULL;
    int *d;

    ret = make_buckets(ctx, &bk, inp_host, N, V);
    if (ret < 0)
        goto out;
    ints = (size_t)N + 2 * (size_t)bk.n_used + 1;
    /* The scratch for the most tokens a batch of N can use, not this batch's: it then grows
     * once per shape, not whenever a batch brings more distinct tokens (each growth changes
     * gpu_ctx_buffers_generation, and a CUDA graph of the step is recorded again). */
    ret = ctx_scratch(ctx, ((size_t)N + 2 * (size_t)(N < V ? N : V) + 1) * sizeof(int), &dev, op);
    if (ret < 0)
        goto out;
    d = (int *)dev;
    /* Synchronous: the host buckets are freed below, and the scratch is then in use. */
    ret = ctx_cuda(
        ctx, cudaMemcpyAsync(d, bk.host, ints * sizeof(int), cudaMemcpyHostToDevice, ctx->stream),
        op, "cudaMemcpyAsync");
    if (ret < 0)
        goto out;
    ret = ctx_cuda(ctx, cudaStreamSynchronize(ctx->stream), op, "stream synchronize");
    if (ret < 0)
        goto out;
    if (bk.n_used > 0) {
        dim3 grid((unsigned)bk.n_used, (unsigned)((C + 127) / 128));
        encoder_dwte_kernel<T><<<grid, 128, 0, ctx->stream>>>((T *)dwte, (const T *)dout,
                                                              d + N + bk.n_used + 1, d + N, d, C);
    }
    encoder_dwpe_kernel<T><<<grid_for((size_t)T_ * C, 256), 256, 0, ctx->stream>>>(
        (T *)dwpe, (const T *)dout, B, T_, C);
    ret = ctx_launched(ctx, op);
out:
    free(bk.host);
    return ret;
}

int gpu_encoder_backward(struct gpu_ctx *ctx, enum gpu_dtype dt, void *dwte, void *dwpe,
                         const void *dout, const int *inp_host, int B, int T, int C, int V)
{
    int ret = check_shape(ctx, "encoder_backward", B, T, C);
    if (ret < 0)
        return ret;
    if (V <= 0 || (long long)B * T > (1 << 30))
        return ctx_fail(ctx, -EINVAL, "encoder_backward",
                        "V (%d) must be positive and B*T (%lld) at most 2^30", V, (long long)B * T);
    DISPATCH_DTYPE(ctx, "encoder_backward", dt, ret, encoder_backward, ctx, dwte, dwpe, dout,
                   inp_host, B, T, C, V);
    return ret;
}
