/* AdamW and the global gradient norm on the GPU (cuda_ops.h; reference: adamw_update and
 * optim_grad_norm of kernels/optim.h).
 *
 * AdamW, per element, with g = grad * grad_scale and wd = weight_decay on decay spans only:
 *   m = b1 m + (1 - b1) g,  v = b2 v + (1 - b2) g^2,
 *   p -= lr (m / (1 - b1^t) / (sqrt(v / (1 - b2^t)) + eps) + wd p)
 * in fp32 on the fp32 master weights (the parameters themselves in fp32 mode; in bf16 mode the
 * bf16 parameters then receive the master's rounding). One launch per span (a handful).
 *
 * Norm: sum g^2 in double (the caller takes its square root, after the sum over shards
 * where the gradients are sharded). NORM_BLOCKS blocks (fewer for small n) stride over the
 * buffer, each thread summing in double, each block reducing its threads in a fixed tree;
 * one block then adds the block sums in a fixed tree. The order depends on n alone. */
#include <errno.h>
#include <math.h>

#include "common.cuh"
#include "banned.h"

#define ADAMW_THREADS 256
#define NORM_THREADS  256
#define NORM_BLOCKS   1024

template <typename T>
__global__ void adamw_kernel(T *params, float *master, const T *grads, float *m, float *v, size_t n,
                             float lr, float b1, float b2, float eps, float wd, float corr1,
                             float corr2, float grad_scale)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float g = ldx(grads + i) * grad_scale;
        float mi = b1 * m[i] + (1.0f - b1) * g;
        float vi = b2 * v[i] + (1.0f - b2) * g * g;
        float mhat = mi / corr1, vhat = vi / corr2;
        float p = master ? master[i] : ldx(params + i);
        p -= lr * (mhat / (sqrtf(vhat) + eps) + wd * p);
        m[i] = mi;
        v[i] = vi;
        if (master)
            master[i] = p;
        stx(params + i, p);
    }
}

template <typename T>
static int adamw(struct gpu_ctx *ctx, void *params, float *master, const void *grads, float *m,
                 float *v, const struct optim_span *spans, size_t n_spans,
                 const struct adamw_config *cfg, uint64_t t, float lr, float grad_scale)
{
    /* Bias corrections in double, as the CPU does. */
    float corr1 = (float)(1.0 - pow(cfg->beta1, (double)t));
    float corr2 = (float)(1.0 - pow(cfg->beta2, (double)t));

    for (size_t s = 0; s < n_spans; s++) {
        size_t off = spans[s].offset, n = spans[s].count;
        if (!n)
            continue;
        adamw_kernel<T><<<grid_for(n, ADAMW_THREADS), ADAMW_THREADS, 0, ctx->stream>>>(
            (T *)params + off, master ? master + off : NULL, (const T *)grads + off, m + off,
            v + off, n, lr, cfg->beta1, cfg->beta2, cfg->eps,
            spans[s].decay ? cfg->weight_decay : 0.0f, corr1, corr2, grad_scale);
    }
    return ctx_launched(ctx, "adamw_update");
}

int gpu_adamw_update(struct gpu_ctx *ctx, enum gpu_dtype dt, void *params, float *master,
                     const void *grads, float *m, float *v, const struct optim_span *spans,
                     size_t n_spans, const struct adamw_config *cfg, uint64_t t, float lr,
                     float grad_scale)
{
    const char *op = "adamw_update";
    int ret;
    if (t < 1)
        return ctx_fail(ctx, -EINVAL, op, "update number t (0) must start at 1");
    if (dt == GPU_F32 && master)
        return ctx_fail(ctx, -EINVAL, op, "fp32 parameters take no master copy");
    if (dt == GPU_BF16 && !master)
        return ctx_fail(ctx, -EINVAL, op, "bf16 parameters need the fp32 master copy");
    for (size_t s = 1; s < n_spans; s++)
        if (spans[s].offset != spans[s - 1].offset + spans[s - 1].count)
            return ctx_fail(ctx, -EINVAL, op, "span %zu does not start where span %zu ends", s,
                            s - 1);
    DISPATCH_DTYPE(ctx, op, dt, ret, adamw, ctx, params, master, grads, m, v, spans, n_spans, cfg,
                   t, lr, grad_scale);
    return ret;
}

/* Tree sum of one double per thread over the block (blockDim.x a power of two); the result
 * in thread 0. */
__device__ double block_sum_double(double x)
{
    __shared__ double sh[NORM_THREADS];
    sh[threadIdx.x] = x;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s /= 2) {
        if ((int)threadIdx.x < s)
            sh[threadIdx.x] += sh[threadIdx.x + s];
        __syncthreads();
    }
    return sh[0];
}

template <typename T> __global__ void norm_partial_kernel(double *part, const T *g, size_t n)
{
    double s = 0.0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        double x = ldx(g + i);
        s += x * x;
    }
    s = block_sum_double(s);
    if (threadIdx.x == 0)
        part[blockIdx.x] = s;
}

/* One block of NORM_THREADS: the block sums, each thread adding a strided set in order, then
 * the tree. */
__global__ void norm_final_kernel(double *out, const double *part, int blocks)
{
    double s = 0.0;
    for (int i = threadIdx.x; i < blocks; i += blockDim.x)
        s += part[i];
    s = block_sum_double(s);
    if (threadIdx.x == 0)
        out[0] = s;
}

template <typename T>
static int sum_squares(struct gpu_ctx *ctx, const char *op, const void *grads, size_t n,
                       double *sumsq)
{
    size_t want = (n + NORM_THREADS - 1) / NORM_THREADS;
    int blocks = (int)(want < NORM_BLOCKS ? (want ? want : 1) : NORM_BLOCKS);
    void *part = NULL;
    double sum = 0.0;
    int ret = ctx_scratch(ctx, (size_t)(blocks + 1) * sizeof(double), &part, op);
    if (ret < 0)
        return ret;
    double *p = (double *)part;
    norm_partial_kernel<T><<<blocks, NORM_THREADS, 0, ctx->stream>>>(p + 1, (const T *)grads, n);
    norm_final_kernel<<<1, NORM_THREADS, 0, ctx->stream>>>(p, p + 1, blocks);
    ret = ctx_launched(ctx, op);
    if (ret < 0)
        return ret;
    ret = ctx_cuda(ctx, cudaMemcpyAsync(&sum, p, sizeof(sum), cudaMemcpyDeviceToHost, ctx->stream),
                   op, "cudaMemcpyAsync");
    if (ret < 0)
        return ret;
    ret = ctx_cuda(ctx, cudaStreamSynchronize(ctx->stream), op, "stream synchronize");
    if (ret < 0)
        return ret;
    *sumsq = sum;
    return 0;
}

int gpu_sum_squares(struct gpu_ctx *ctx, enum gpu_dtype dt, const void *grads, size_t n,
                    double *sumsq)
{
    const char *op = "sum_squares";
    int ret;
    *sumsq = 0.0;
    if (!n)
        return 0;
    DISPATCH_DTYPE(ctx, op, dt, ret, sum_squares, ctx, op, grads, n, sumsq);
    return ret;
}
