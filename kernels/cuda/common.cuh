/* What the CUDA op files share: the context's layout, error reporting into it, the floatX
 * loads and stores (fp32 or bf16 storage, fp32 arithmetic), warp reductions, GELU's maths and
 * the dtype dispatch of the launchers. Internal to kernels/cuda/. */
#ifndef GPURUN_KERNELS_CUDA_COMMON_CUH
#define GPURUN_KERNELS_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cublasLt.h>

#include "cuda_ops.h"

typedef __nv_bfloat16 bf16;

struct cudnn_att;

struct gpu_ctx {
    int device;
    cudaStream_t stream;
    cublasLtHandle_t lt;
    void *workspace; /* cuBLASLt's, GPU_LT_WORKSPACE bytes */
    void *scratch;   /* per-launch temporaries (partial sums, bucket lists), grown on demand */
    size_t scratch_size;
    uint64_t scratch_generation; /* scratch replacements (gpu_ctx_buffers_generation) */
    bool fusion;
    enum gpu_attention attention; /* gpu_ctx_set_attention */
    struct cudnn_att *cudnn;      /* attention_cudnn.h's state, set up on the first bf16 call */
    bool cudnn_tried;             /* set up once: cudnn stays NULL where it failed */
    char cudnn_note[200];         /* why cuDNN is not used, "" while it is (or not yet tried) */
    char err[256];
};

/* cuBLASLt's workspace: what its Hopper kernels ask for at most (split-K, stream-K). */
#define GPU_LT_WORKSPACE (32u << 20)
#define WARP_SIZE        32
#define FULL_MASK        0xffffffffu

/* Frees ctx's cuDNN state (attention.cu). */
void ctx_cudnn_free(struct gpu_ctx *ctx);
/* How many times cuDNN's workspace was replaced (attention.cu; 0 without cuDNN). */
uint64_t ctx_cudnn_generation(const struct gpu_ctx *ctx);

/* Records "op: message" as ctx's error and returns ret (a negative errno). */
int ctx_fail(struct gpu_ctx *ctx, int ret, const char *op, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* After queueing kernels: 0, or -EIO naming op and the launch error (cudaGetLastError). */
int ctx_launched(struct gpu_ctx *ctx, const char *op);
/* A runtime call's result: 0, or -EIO naming op, what and the error. */
int ctx_cuda(struct gpu_ctx *ctx, cudaError_t e, const char *op, const char *what);
/* A device buffer of at least `bytes` in *p, valid until the next ctx_scratch (it may wait
 * for the stream to grow the buffer). Returns 0 or -ENOMEM. */
int ctx_scratch(struct gpu_ctx *ctx, size_t bytes, void **p, const char *op);

/* Blocks of a grid-stride elementwise launch: enough to fill an H100 several times over,
 * capped so that huge n reuse threads rather than launch millions of blocks. */
static inline unsigned grid_for(size_t n, unsigned threads)
{
    size_t blocks = (n + threads - 1) / threads;
    return (unsigned)(blocks < 8192 ? (blocks ? blocks : 1) : 8192);
}

/* ---- floatX storage --------------------------------------------------------------------- */

__device__ __forceinline__ float ldx(const float *p)
{
    return *p;
}
__device__ __forceinline__ float ldx(const bf16 *p)
{
    return __bfloat162float(*p);
}
__device__ __forceinline__ void stx(float *p, float x)
{
    *p = x;
}
__device__ __forceinline__ void stx(bf16 *p, float x)
{
    *p = __float2bfloat16_rn(x);
}

/* ---- reductions --------------------------------------------------------------------------- */

/* Butterfly sums and maxima: every lane gets the result, from the same order of additions. */
__device__ __forceinline__ float warp_sum(float x)
{
    for (int o = WARP_SIZE / 2; o > 0; o /= 2)
        x += __shfl_xor_sync(FULL_MASK, x, o);
    return x;
}
__device__ __forceinline__ float warp_max(float x)
{
    for (int o = WARP_SIZE / 2; o > 0; o /= 2)
        x = fmaxf(x, __shfl_xor_sync(FULL_MASK, x, o));
    return x;
}

/* ---- GELU, tanh form (ops.h) --------------------------------------------------------------- */

#define GELU_K 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_C 0.044715f

__device__ __forceinline__ float gelu_f(float x)
{
    float u = GELU_K * (x + GELU_C * x * x * x);
    return 0.5f * x * (1.0f + tanhf(u));
}
/* d gelu / dx = 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) du/dx, du/dx = k (1 + 3 c x^2). */
__device__ __forceinline__ float gelu_grad_f(float x)
{
    float u = GELU_K * (x + GELU_C * x * x * x);
    float th = tanhf(u);
    return 0.5f * (1.0f + th) +
           0.5f * x * (1.0f - th * th) * GELU_K * (1.0f + 3.0f * GELU_C * x * x);
}

/* Calls `launch_fn<float>(args)` or `launch_fn<bf16>(args)` for dt, into `ret`. */
#define DISPATCH_DTYPE(ctx, op, dt, ret, launch_fn, ...)                                           \
    do {                                                                                           \
        if ((dt) == GPU_F32)                                                                       \
            (ret) = launch_fn<float>(__VA_ARGS__);                                                 \
        else if ((dt) == GPU_BF16)                                                                 \
            (ret) = launch_fn<bf16>(__VA_ARGS__);                                                  \
        else                                                                                       \
            (ret) = ctx_fail((ctx), -EINVAL, (op), "unknown dtype %d", (int)(dt));                 \
    } while (0)

#endif
