/* The CUDA backend's device query, context (stream, cuBLASLt handle, workspace, scratch),
 * memory helpers and dtype conversion (cuda_ops.h). */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.cuh"
#include "banned.h"

int ctx_fail(struct gpu_ctx *ctx, int ret, const char *op, const char *fmt, ...)
{
    va_list ap;
    int n = snprintf(ctx->err, sizeof(ctx->err), "%s: ", op);

    if (n < 0 || (size_t)n >= sizeof(ctx->err))
        return ret;
    va_start(ap, fmt);
    vsnprintf(ctx->err + n, sizeof(ctx->err) - (size_t)n, fmt, ap);
    va_end(ap);
    return ret;
}

int ctx_cuda(struct gpu_ctx *ctx, cudaError_t e, const char *op, const char *what)
{
    if (e == cudaSuccess)
        return 0;
    return ctx_fail(ctx, -EIO, op, "%s failed: %s", what, cudaGetErrorString(e));
}

int ctx_launched(struct gpu_ctx *ctx, const char *op)
{
    return ctx_cuda(ctx, cudaGetLastError(), op, "kernel launch");
}

int ctx_scratch(struct gpu_ctx *ctx, size_t bytes, void **p, const char *op)
{
    void *q = NULL;

    if (bytes <= ctx->scratch_size) {
        *p = ctx->scratch;
        return 0;
    }
    /* Kernels queued earlier may still read the old buffer. */
    if (ctx_cuda(ctx, cudaStreamSynchronize(ctx->stream), op, "stream synchronize") < 0)
        return -EIO;
    cudaFree(ctx->scratch);
    ctx->scratch = NULL;
    ctx->scratch_size = 0;
    ctx->scratch_generation++;
    if (cudaMalloc(&q, bytes) != cudaSuccess) {
        cudaGetLastError();
        return ctx_fail(ctx, -ENOMEM, op, "cannot allocate %zu bytes of scratch", bytes);
    }
    ctx->scratch = q;
    ctx->scratch_size = bytes;
    *p = q;
    return 0;
}

/* ---- device query -------------------------------------------------------------------------- */

int gpu_device_count(void)
{
    int n = 0;

    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

int gpu_require_device(struct errmsg *err)
{
    int n = 0, driver = 0, runtime = 0;
    cudaError_t e = cudaGetDeviceCount(&n);

    cudaGetLastError();
    if (e == cudaSuccess && n > 0)
        return 0;
    /* No device, or no driver at all (libcuda absent reads as an insufficient driver of
     * version 0): the plain line. A driver that is there but too old says so. */
    cudaDriverGetVersion(&driver);
    cudaRuntimeGetVersion(&runtime);
    if (e == cudaSuccess || e == cudaErrorNoDevice ||
        (e == cudaErrorInsufficientDriver && driver == 0))
        errmsg_set(err, 0, "no CUDA device available");
    else if (e == cudaErrorInsufficientDriver)
        errmsg_set(err, 0,
                   "no CUDA device available: the driver supports CUDA %d.%d, this program needs "
                   "%d.%d",
                   driver / 1000, driver % 1000 / 10, runtime / 1000, runtime % 1000 / 10);
    else
        errmsg_set(err, 0, "no CUDA device available: %s", cudaGetErrorString(e));
    cudaGetLastError();
    return -ENODEV;
}

size_t gpu_dtype_size(enum gpu_dtype dt)
{
    return dt == GPU_BF16 ? sizeof(bf16) : sizeof(float);
}

/* ---- context ------------------------------------------------------------------------------- */

struct gpu_ctx *gpu_ctx_new(int device, struct errmsg *err)
{
    struct gpu_ctx *ctx = (struct gpu_ctx *)calloc(1, sizeof(*ctx));
    const char *what = NULL;
    cudaError_t e = cudaSuccess;

    if (!ctx) {
        errmsg_set(err, 0, "cannot allocate a CUDA context: out of memory");
        return NULL;
    }
    ctx->device = device;
    ctx->fusion = true;
    if ((e = cudaSetDevice(device)) != cudaSuccess)
        what = "cudaSetDevice";
    else if ((e = cudaStreamCreateWithFlags(&ctx->stream, cudaStreamNonBlocking)) != cudaSuccess)
        what = "cudaStreamCreate";
    else if ((e = cudaMalloc(&ctx->workspace, GPU_LT_WORKSPACE)) != cudaSuccess)
        what = "cudaMalloc of the matmul workspace";
    if (what) {
        errmsg_set(err, 0, "cannot set up CUDA device %d: %s failed: %s", device, what,
                   cudaGetErrorString(e));
        cudaGetLastError();
        gpu_ctx_free(ctx);
        return NULL;
    }
    cublasStatus_t s = cublasLtCreate(&ctx->lt);
    if (s != CUBLAS_STATUS_SUCCESS) {
        errmsg_set(err, 0, "cannot set up CUDA device %d: cublasLtCreate failed: %s", device,
                   cublasLtGetStatusString(s));
        ctx->lt = NULL;
        gpu_ctx_free(ctx);
        return NULL;
    }
    return ctx;
}

void gpu_ctx_free(struct gpu_ctx *ctx)
{
    if (!ctx)
        return;
    if (ctx->stream)
        cudaStreamSynchronize(ctx->stream);
    if (ctx->lt)
        cublasLtDestroy(ctx->lt);
    ctx_cudnn_free(ctx);
    cudaFree(ctx->workspace);
    cudaFree(ctx->scratch);
    if (ctx->stream)
        cudaStreamDestroy(ctx->stream);
    cudaGetLastError();
    free(ctx);
}

const char *gpu_ctx_error(const struct gpu_ctx *ctx)
{
    return ctx->err;
}

void *gpu_ctx_stream(struct gpu_ctx *ctx)
{
    return (void *)ctx->stream;
}

void gpu_ctx_set_attention(struct gpu_ctx *ctx, enum gpu_attention a)
{
    ctx->attention = a;
}

void gpu_ctx_set_fusion(struct gpu_ctx *ctx, bool on)
{
    ctx->fusion = on;
}

uint64_t gpu_ctx_buffers_generation(const struct gpu_ctx *ctx)
{
    /* Each count only grows, so their sum changes whenever either does. */
    return ctx->scratch_generation + ctx_cudnn_generation(ctx);
}

/* ---- graphs -------------------------------------------------------------------------------- */

struct gpu_graph {
    cudaGraphExec_t exec;
};

int gpu_graph_begin(struct gpu_ctx *ctx)
{
    /* ThreadLocal: this thread's calls that CUDA deems unsafe in a capture (an allocation, a
     * device-wide synchronisation) fail and end the recording, other threads' do not. */
    return ctx_cuda(ctx, cudaStreamBeginCapture(ctx->stream, cudaStreamCaptureModeThreadLocal),
                    "graph", "cudaStreamBeginCapture");
}

int gpu_graph_end(struct gpu_ctx *ctx, struct gpu_graph **out)
{
    cudaGraph_t g = NULL;
    cudaGraphExec_t x = NULL;
    cudaError_t e = cudaStreamEndCapture(ctx->stream, &g);

    *out = NULL;
    if (e != cudaSuccess) {
        cudaGetLastError();
        return ctx_fail(ctx, -ENOTSUP, "graph",
                        "the recording failed (%s): a call in it waits for the device or "
                        "allocates",
                        cudaGetErrorString(e));
    }
    e = cudaGraphInstantiate(&x, g, 0);
    cudaGraphDestroy(g);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return ctx_fail(ctx, -ENOTSUP, "graph", "cudaGraphInstantiate: %s", cudaGetErrorString(e));
    }
    struct gpu_graph *gg = (struct gpu_graph *)calloc(1, sizeof(*gg));
    if (!gg) {
        cudaGraphExecDestroy(x);
        return ctx_fail(ctx, -ENOMEM, "graph", "out of memory");
    }
    gg->exec = x;
    *out = gg;
    return 0;
}

int gpu_graph_launch(struct gpu_ctx *ctx, struct gpu_graph *g)
{
    return ctx_cuda(ctx, cudaGraphLaunch(g->exec, ctx->stream), "graph", "cudaGraphLaunch");
}

void gpu_graph_free(struct gpu_graph *g)
{
    if (!g)
        return;
    cudaGraphExecDestroy(g->exec);
    free(g);
}

int gpu_ctx_sync(struct gpu_ctx *ctx)
{
    return ctx_cuda(ctx, cudaStreamSynchronize(ctx->stream), "sync", "stream synchronize");
}

/* ---- memory -------------------------------------------------------------------------------- */

int gpu_alloc(struct gpu_ctx *ctx, void **p, size_t bytes)
{
    *p = NULL;
    if (cudaMalloc(p, bytes ? bytes : 1) != cudaSuccess) {
        cudaGetLastError();
        *p = NULL;
        return ctx_fail(ctx, -ENOMEM, "alloc", "cannot allocate %zu bytes on device %d", bytes,
                        ctx->device);
    }
    return 0;
}

void gpu_free(struct gpu_ctx *ctx, void *p)
{
    if (!p)
        return;
    cudaStreamSynchronize(ctx->stream);
    cudaFree(p);
    cudaGetLastError();
}

static int copy(struct gpu_ctx *ctx, void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                const char *op)
{
    if (!bytes)
        return 0;
    if (ctx_cuda(ctx, cudaMemcpyAsync(dst, src, bytes, kind, ctx->stream), op, "cudaMemcpyAsync"))
        return -EIO;
    return ctx_cuda(ctx, cudaStreamSynchronize(ctx->stream), op, "stream synchronize");
}

int gpu_upload(struct gpu_ctx *ctx, void *dst, const void *src, size_t bytes)
{
    return copy(ctx, dst, src, bytes, cudaMemcpyHostToDevice, "upload");
}

int gpu_download(struct gpu_ctx *ctx, void *dst, const void *src, size_t bytes)
{
    return copy(ctx, dst, src, bytes, cudaMemcpyDeviceToHost, "download");
}

int gpu_fill_bytes(struct gpu_ctx *ctx, void *dst, int byte, size_t bytes)
{
    return ctx_cuda(ctx, cudaMemsetAsync(dst, byte, bytes, ctx->stream), "fill", "cudaMemsetAsync");
}

/* ---- conversion ---------------------------------------------------------------------------- */

template <typename D, typename S> __global__ void convert_kernel(D *dst, const S *src, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        stx(dst + i, ldx(src + i));
}

template <typename D, typename S>
static void convert_launch(struct gpu_ctx *ctx, void *dst, const void *src, size_t n)
{
    convert_kernel<D, S><<<grid_for(n, 256), 256, 0, ctx->stream>>>((D *)dst, (const S *)src, n);
}

int gpu_convert(struct gpu_ctx *ctx, enum gpu_dtype dst_dt, void *dst, enum gpu_dtype src_dt,
                const void *src, size_t n)
{
    if (!n)
        return 0;
    if (dst_dt == src_dt) {
        if (dst == src)
            return 0;
        return ctx_cuda(ctx,
                        cudaMemcpyAsync(dst, src, n * gpu_dtype_size(dst_dt),
                                        cudaMemcpyDeviceToDevice, ctx->stream),
                        "convert", "cudaMemcpyAsync");
    }
    if (dst_dt == GPU_BF16 && src_dt == GPU_F32)
        convert_launch<bf16, float>(ctx, dst, src, n);
    else if (dst_dt == GPU_F32 && src_dt == GPU_BF16)
        convert_launch<float, bf16>(ctx, dst, src, n);
    else
        return ctx_fail(ctx, -EINVAL, "convert", "unknown dtype pair %d, %d", (int)dst_dt,
                        (int)src_dt);
    return ctx_launched(ctx, "convert");
}
