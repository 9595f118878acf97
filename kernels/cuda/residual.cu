/* The residual add on the GPU (cuda_ops.h; reference: ops_residual_forward/backward):
 * out = a + b, and backward da += dout, db += dout, elementwise over n in fp32. The model's
 * forward uses the form fused into the next LayerNorm (layernorm.cu); this one serves the last
 * block and the tests. */
#include <errno.h>

#include "common.cuh"
#include "banned.h"

template <typename T>
__global__ void residual_forward_kernel(T *out, const T *a, const T *b, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        stx(out + i, ldx(a + i) + ldx(b + i));
}

template <typename T>
__global__ void residual_backward_kernel(T *da, T *db, const T *dout, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float d = ldx(dout + i);
        stx(da + i, ldx(da + i) + d);
        stx(db + i, ldx(db + i) + d);
    }
}

template <typename T>
static int residual_forward(struct gpu_ctx *ctx, void *out, const void *a, const void *b, size_t n)
{
    residual_forward_kernel<T>
        <<<grid_for(n, 256), 256, 0, ctx->stream>>>((T *)out, (const T *)a, (const T *)b, n);
    return ctx_launched(ctx, "residual_forward");
}

template <typename T>
static int residual_backward(struct gpu_ctx *ctx, void *da, void *db, const void *dout, size_t n)
{
    residual_backward_kernel<T>
        <<<grid_for(n, 256), 256, 0, ctx->stream>>>((T *)da, (T *)db, (const T *)dout, n);
    return ctx_launched(ctx, "residual_backward");
}

int gpu_residual_forward(struct gpu_ctx *ctx, enum gpu_dtype dt, void *out, const void *a,
                         const void *b, size_t n)
{
    int ret = 0;
    if (!n)
        return 0;
    DISPATCH_DTYPE(ctx, "residual_forward", dt, ret, residual_forward, ctx, out, a, b, n);
    return ret;
}

int gpu_residual_backward(struct gpu_ctx *ctx, enum gpu_dtype dt, void *da, void *db,
                          const void *dout, size_t n)
{
    int ret = 0;
    if (!n)
        return 0;
    if (da == db)
        return ctx_fail(ctx, -EINVAL, "residual_backward", "da and db are the same buffer");
    DISPATCH_DTYPE(ctx, "residual_backward", dt, ret, residual_backward, ctx, da, db, dout, n);
    return ret;
}
