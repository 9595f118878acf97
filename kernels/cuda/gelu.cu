/* GELU on the GPU, tanh form (cuda_ops.h; reference: ops_gelu_forward/backward):
 *   out = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3),
 *   dinp = dout (0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) du/dx),
 * elementwise over n in fp32 (tanhf: within 2 ulp). In place allowed (out = inp, dinp = dout):
 * each element is read before it is written, by the same thread. */
#include <errno.h>

#include "common.cuh"
#include "banned.h"

template <typename T> __global__ void gelu_forward_kernel(T *out, const T *inp, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        stx(out + i, gelu_f(ldx(inp + i)));
}

template <typename T>
__global__ void gelu_backward_kernel(T *dinp, const T *inp, const T *dout, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        stx(dinp + i, ldx(dout + i) * gelu_grad_f(ldx(inp + i)));
}

template <typename T>
static int gelu_forward(struct gpu_ctx *ctx, void *out, const void *inp, size_t n)
{
    gelu_forward_kernel<T><<<grid_for(n, 256), 256, 0, ctx->stream>>>((T *)out, (const T *)inp, n);
    return ctx_launched(ctx, "gelu_forward");
}

template <typename T>
static int gelu_backward(struct gpu_ctx *ctx, void *dinp, const void *inp, const void *dout,
                         size_t n)
{
    gelu_backward_kernel<T>
        <<<grid_for(n, 256), 256, 0, ctx->stream>>>((T *)dinp, (const T *)inp, (const T *)dout, n);
    return ctx_launched(ctx, "gelu_backward");
}

int gpu_gelu_forward(struct gpu_ctx *ctx, enum gpu_dtype dt, void *out, const void *inp, size_t n)
{
    int ret = 0;
    if (!n)
        return 0;
    DISPATCH_DTYPE(ctx, "gelu_forward", dt, ret, gelu_forward, ctx, out, inp, n);
    return ret;
}

int gpu_gelu_backward(struct gpu_ctx *ctx, enum gpu_dtype dt, void *dinp, const void *inp,
                      const void *dout, size_t n)
{
    int ret = 0;
    if (!n)
        return 0;
    DISPATCH_DTYPE(ctx, "gelu_backward", dt, ret, gelu_backward, ctx, dinp, inp, dout, n);
    return ret;
}
