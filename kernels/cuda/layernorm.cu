/* LayerNorm on the GPU, with the residual add fused in front of it (cuda_ops.h; reference:
 * ops_layernorm_forward/backward, ops_residual_forward).
 *
 * Over N rows of C: mean = sum x / C, var = sum (x - mean)^2 / C, rstd = 1 / sqrt(var + eps),
 * out = (x - mean) rstd weight + bias. Forward: one warp per row, three passes over the row
 * (mean, then variance around it: the two-pass form, no cancellation; then the output), all
 * in fp32; mean and rstd saved in fp32. The fused form first stores residual = a + b in floatX
 * and normalises the stored values, so that it equals the two ops run one after the other.
 *
 * Backward, with n = (x - mean) rstd and g = weight dout:
 *   dinp += rstd (g - mean(g) - n mean(g n))        one warp per row, in 16-byte vectors
 *                                                    where the row's width and pointers allow;
 *   dweight += sum_rows dout n, dbias += sum_rows dout:
 * each block sums a chunk of LN_CHUNK rows for 32 channels (threads: 32 channels x 8 row
 * lanes, the lanes' sums added in lane order) into a partial row in scratch, then one thread
 * per channel adds the chunks' partials in chunk order. Deterministic, no atomics. */
#include <errno.h>
#include <math.h>
#include <stdint.h>

#include "../ops.h" /* OPS_LN_EPS */
#include "common.cuh"
#include "banned.h"

/* Rows per warp-per-row block (8 warps). */
#define LN_WARPS   8
/* Rows summed by one block of the weight-gradient reduction: N/LN_CHUNK partial rows of
 * 2C floats in scratch (for N = 16k rows, C = 768: 128 chunks, 0.8 MB). */
#define LN_CHUNK   128
#define LN_LANES   8
/* The vectors per lane of the vector kernels' instances (GPT-2 small's 768 bf16: 3). */
#define LN_VEC_MAX 4

template <typename T, bool FUSED>
__global__ void layernorm_forward_kernel(T *residual, T *out, float *mean, float *rstd, const T *a,
                                         const T *b, const T *inp, const T *weight, const T *bias,
                                         int N, int C)
{
    int row = blockIdx.x * LN_WARPS + threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    if (row >= N)
        return;
    size_t off = (size_t)row * C;
    const T *x = FUSED ? residual + off : inp + off;
    float sum = 0.0f;
    for (int c = lane; c < C; c += WARP_SIZE) {
        float v;
        if (FUSED) {
            stx(residual + off + c, ldx(a + off + c) + ldx(b + off + c));
            v = ldx(residual + off + c); /* the stored (rounded) value */
        } else {
            v = ldx(x + c);
        }
        sum += v;
    }
    float m = warp_sum(sum) / (float)C;
    float var = 0.0f;
    for (int c = lane; c < C; c += WARP_SIZE) {
        float d = ldx(x + c) - m;
        var += d * d;
    }
    float s = rsqrtf(warp_sum(var) / (float)C + OPS_LN_EPS);
    for (int c = lane; c < C; c += WARP_SIZE)
        stx(out + off + c, (ldx(x + c) - m) * s * ldx(weight + c) + ldx(bias + c));
    if (lane == 0) {
        if (mean)
            mean[row] = m;
        if (rstd)
            rstd[row] = s;
    }
}

/* The forward for rows whose every lane's share is whole 16-byte vectors (as the vector
 * backward below: C a multiple of VEC, at most NV vectors a lane, pointers on 16 bytes). A
 * lane loads its vectors of the row (FUSED: of a and b, and stores their sum as the residual)
 * all before the first use, keeps the row's values in registers for the mean, the variance
 * and the output, and writes the output in vectors: the row is read once, where the scalar
 * kernel read it three times, two bytes a lane at a time (0.17 ms a call at 65,536 x 768 in
 * bf16 on an H200, fused, against the 84 us its 400 MB take at 4.8 TB/s). */
template <typename T, int NV, bool FUSED>
__global__ void layernorm_forward_vec_kernel(T *__restrict__ residual, T *__restrict__ out,
                                             float *__restrict__ mean, float *__restrict__ rstd,
                                             const T *__restrict__ a, const T *__restrict__ b,
                                             const T *__restrict__ inp,
                                             const T *__restrict__ weight,
                                             const T *__restrict__ bias, int N, int C)
{
    constexpr int VEC = 16 / sizeof(T);
    int row = blockIdx.x * LN_WARPS + threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    if (row >= N)
        return;
    size_t off = (size_t)row * C;
    uint4 av[NV], bv[NV];
    float x[NV][VEC], sum = 0.0f, var = 0.0f;
#pragma unroll
    for (int k = 0; k < NV; k++) {
        int c = (k * WARP_SIZE + lane) * VEC;
        if (c < C) {
            av[k] = *(const uint4 *)((FUSED ? a : inp) + off + c);
            if (FUSED)
                bv[k] = *(const uint4 *)(b + off + c);
        }
    }
#pragma unroll
    for (int k = 0; k < NV; k++) {
        int c = (k * WARP_SIZE + lane) * VEC;
        if (c >= C)
            continue;
        if (FUSED) {
            /* The residual as stored (rounded to T), so that the output normalises the values
             * the next layer reads. */
            uint4 rv;
            T *r = (T *)&rv;
            const T *pa = (const T *)&av[k], *pb = (const T *)&bv[k];
#pragma unroll
            for (int j = 0; j < VEC; j++) {
                stx(r + j, ldx(pa + j) + ldx(pb + j));
                x[k][j] = ldx(r + j);
            }
            *(uint4 *)(residual + off + c) = rv;
        } else {
            const T *pa = (const T *)&av[k];
#pragma unroll
            for (int j = 0; j < VEC; j++)
                x[k][j] = ldx(pa + j);
        }
#pragma unroll
        for (int j = 0; j < VEC; j++)
            sum += x[k][j];
    }
    float m = warp_sum(sum) / (float)C;
#pragma unroll
    for (int k = 0; k < NV; k++) {
        if ((k * WARP_SIZE + lane) * VEC >= C)
            continue;
#pragma unroll
        for (int j = 0; j < VEC; j++)
            var += (x[k][j] - m) * (x[k][j] - m);
    }
    float s = rsqrtf(warp_sum(var) / (float)C + OPS_LN_EPS);
#pragma unroll
    for (int k = 0; k < NV; k++) {
        int c = (k * WARP_SIZE + lane) * VEC;
        if (c >= C)
            continue;
        uint4 wv = *(const uint4 *)(weight + c), bsv = *(const uint4 *)(bias + c), ov;
        const T *w = (const T *)&wv, *bb = (const T *)&bsv;
        T *o = (T *)&ov;
#pragma unroll
        for (int j = 0; j < VEC; j++)
            stx(o + j, (x[k][j] - m) * s * ldx(w + j) + ldx(bb + j));
        *(uint4 *)(out + off + c) = ov;
    }
    if (lane == 0) {
        if (mean)
            mean[row] = m;
        if (rstd)
            rstd[row] = s;
    }
}

template <typename T>
__global__ void layernorm_dinp_kernel(T *dinp, const T *dout, const T *inp, const T *weight,
                                      const float *mean, const float *rstd, int N, int C)
{
    int row = blockIdx.x * LN_WARPS + threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    if (row >= N)
        return;
    size_t off = (size_t)row * C;
    float m = mean[row], s = rstd[row], sg = 0.0f, sgn = 0.0f;
    for (int c = lane; c < C; c += WARP_SIZE) {
        float g = ldx(weight + c) * ldx(dout + off + c);
        sg += g;
        sgn += g * (ldx(inp + off + c) - m) * s;
    }
    float mg = warp_sum(sg) / (float)C, mgn = warp_sum(sgn) / (float)C;
    for (int c = lane; c < C; c += WARP_SIZE) {
        float g = ldx(weight + c) * ldx(dout + off + c);
        float n = (ldx(inp + off + c) - m) * s;
        stx(dinp + off + c, ldx(dinp + off + c) + s * (g - mg - n * mgn));
    }
}

/* The same for rows whose every lane's share is whole 16-byte vectors: C a multiple of VEC
 * (16 bytes of T), at most NV vectors per lane, every pointer 16-byte aligned. A lane reads
 * its vectors of dout, inp and weight once, all of them before the first use, and keeps the
 * products in registers for the second pass; dinp is read and written in vectors too. The
 * scalar kernel above issued 8x the loads, one row element per lane at a time, and read the
 * row twice: 1.66 ms a call at 65,536 x 768 in bf16 on an H200, where the forward of the same
 * shape took 0.17. */
template <typename T, int NV>
__global__ void layernorm_dinp_vec_kernel(T *__restrict__ dinp, const T *__restrict__ dout,
                                          const T *__restrict__ inp, const T *__restrict__ weight,
                                          const float *__restrict__ mean,
                                          const float *__restrict__ rstd, int N, int C)
{
    constexpr int VEC = 16 / sizeof(T);
    int row = blockIdx.x * LN_WARPS + threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    if (row >= N)
        return;
    size_t off = (size_t)row * C;
    float m = mean[row], s = rstd[row], sg = 0.0f, sgn = 0.0f;
    uint4 dv[NV], xv[NV], wv[NV];
#pragma unroll
    for (int k = 0; k < NV; k++) {
        int c = (k * WARP_SIZE + lane) * VEC;
        if (c < C) {
            dv[k] = *(const uint4 *)(dout + off + c);
            xv[k] = *(const uint4 *)(inp + off + c);
            wv[k] = *(const uint4 *)(weight + c);
        }
    }
    float g[NV][VEC], n[NV][VEC];
#pragma unroll
    for (int k = 0; k < NV; k++) {
        if ((k * WARP_SIZE + lane) * VEC >= C)
            continue;
        const T *d = (const T *)&dv[k], *x = (const T *)&xv[k], *w = (const T *)&wv[k];
#pragma unroll
        for (int j = 0; j < VEC; j++) {
            g[k][j] = ldx(w + j) * ldx(d + j);
            n[k][j] = (ldx(x + j) - m) * s;
            sg += g[k][j];
            sgn += g[k][j] * n[k][j];
        }
    }
    float mg = warp_sum(sg) / (float)C, mgn = warp_sum(sgn) / (float)C;
#pragma unroll
    for (int k = 0; k < NV; k++) {
        int c = (k * WARP_SIZE + lane) * VEC;
        if (c >= C)
            continue;
        uint4 ov = *(const uint4 *)(dinp + off + c);
        T *o = (T *)&ov;
#pragma unroll
        for (int j = 0; j < VEC; j++)
            stx(o + j, ldx(o + j) + s * (g[k][j] - mg - n[k][j] * mgn));
        *(uint4 *)(dinp + off + c) = ov;
    }
}

/* grid (C/32 rounded up, chunks), block (32, LN_LANES). part: (chunks, 2C) fp32, the weight
 * partials in [0, C) and the bias partials in [C, 2C). */
template <typename T>
__global__ void layernorm_dparams_partial(float *part, const T *dout, const T *inp,
                                          const float *mean, const float *rstd, int N, int C)
{
    __shared__ float sw[LN_LANES][WARP_SIZE], sb[LN_LANES][WARP_SIZE];
    int c = blockIdx.x * WARP_SIZE + threadIdx.x, chunk = blockIdx.y;
    int r0 = chunk * LN_CHUNK, r1 = min(r0 + LN_CHUNK, N);
    float w = 0.0f, bsum = 0.0f;
    if (c < C) {
        for (int r = r0 + threadIdx.y; r < r1; r += LN_LANES) {
            float d = ldx(dout + (size_t)r * C + c);
            w += d * (ldx(inp + (size_t)r * C + c) - mean[r]) * rstd[r];
            bsum += d;
        }
    }
    sw[threadIdx.y][threadIdx.x] = w;
    sb[threadIdx.y][threadIdx.x] = bsum;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        for (int l = 1; l < LN_LANES; l++) {
            w += sw[l][threadIdx.x];
            bsum += sb[l][threadIdx.x];
        }
        part[(size_t)chunk * 2 * C + c] = w;
        part[(size_t)chunk * 2 * C + C + c] = bsum;
    }
}

template <typename T>
__global__ void layernorm_dparams_final(T *dweight, T *dbias, const float *part, int chunks, int C)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    float w = 0.0f, bsum = 0.0f;
    for (int k = 0; k < chunks; k++) {
        w += part[(size_t)k * 2 * C + c];
        bsum += part[(size_t)k * 2 * C + C + c];
    }
    stx(dweight + c, ldx(dweight + c) + w);
    stx(dbias + c, ldx(dbias + c) + bsum);
}

static int check_shape(struct gpu_ctx *ctx, const char *op, int N, int C)
{
    if (N <= 0 || C <= 0)
        return ctx_fail(ctx, -EINVAL, op, "N (%d) and C (%d) must be positive", N, C);
    return 0;
}

template <typename T>
static int layernorm_forward(struct gpu_ctx *ctx, const char *op, void *residual, void *out,
                             float *mean, float *rstd, const void *a, const void *b,
                             const void *inp, const void *weight, const void *bias, int N, int C)
{
    unsigned grid = (unsigned)((N + LN_WARPS - 1) / LN_WARPS);
    const int vec = 16 / (int)sizeof(T), per_lane = (C / vec + WARP_SIZE - 1) / WARP_SIZE;
    bool aligned = ((uintptr_t)residual | (uintptr_t)out | (uintptr_t)a | (uintptr_t)b |
                    (uintptr_t)inp | (uintptr_t)weight | (uintptr_t)bias) %
                       16 ==
                   0;
    if (aligned && C % vec == 0 && per_lane <= LN_VEC_MAX) {
        if (residual)
            layernorm_forward_vec_kernel<T, LN_VEC_MAX, true>
                <<<grid, LN_WARPS * WARP_SIZE, 0, ctx->stream>>>(
                    (T *)residual, (T *)out, mean, rstd, (const T *)a, (const T *)b, NULL,
                    (const T *)weight, (const T *)bias, N, C);
        else
            layernorm_forward_vec_kernel<T, LN_VEC_MAX, false>
                <<<grid, LN_WARPS * WARP_SIZE, 0, ctx->stream>>>(
                    NULL, (T *)out, mean, rstd, NULL, NULL, (const T *)inp, (const T *)weight,
                    (const T *)bias, N, C);
        return ctx_launched(ctx, op);
    }
    if (residual)
        layernorm_forward_kernel<T, true><<<grid, LN_WARPS * WARP_SIZE, 0, ctx->stream>>>(
            (T *)residual, (T *)out, mean, rstd, (const T *)a, (const T *)b, NULL,
            (const T *)weight, (const T *)bias, N, C);
    else
        layernorm_forward_kernel<T, false><<<grid, LN_WARPS * WARP_SIZE, 0, ctx->stream>>>(
            NULL, (T *)out, mean, rstd, NULL, NULL, (const T *)inp, (const T *)weight,
            (const T *)bias, N, C);
    return ctx_launched(ctx, op);
}

int gpu_layernorm_forward(struct gpu_ctx *ctx, enum gpu_dtype dt, void *out, float *mean,
                          float *rstd, const void *inp, const void *weight, const void *bias, int N,
                          int C)
{
    const char *op = "layernorm_forward";
    int ret = check_shape(ctx, op, N, C);
    if (ret < 0)
        return ret;
    DISPATCH_DTYPE(ctx, op, dt, ret, layernorm_forward, ctx, op, NULL, out, mean, rstd, NULL, NULL,
                   inp, weight, bias, N, C);
    return ret;
}

int gpu_residual_layernorm_forward(struct gpu_ctx *ctx, enum gpu_dtype dt, void *residual,
                                   void *out, float *mean, float *rstd, const void *a,
                                   const void *b, const void *weight, const void *bias, int N,
                                   int C)
{
    const char *op = "residual_layernorm_forward";
    int ret = check_shape(ctx, op, N, C);
    if (ret < 0)
        return ret;
    if (!residual)
        return ctx_fail(ctx, -EINVAL, op, "no residual buffer");
    DISPATCH_DTYPE(ctx, op, dt, ret, layernorm_forward, ctx, op, residual, out, mean, rstd, a, b,
                   NULL, weight, bias, N, C);
    return ret;
}

template <typename T>
static int layernorm_backward(struct gpu_ctx *ctx, void *dinp, void *dweight, void *dbias,
                              const void *dout, const void *inp, const void *weight,
                              const float *mean, const float *rstd, int N, int C)
{
    const char *op = "layernorm_backward";
    int chunks = (N + LN_CHUNK - 1) / LN_CHUNK;
    void *part = NULL;
    int ret = ctx_scratch(ctx, (size_t)chunks * 2 * C * sizeof(float), &part, op);
    if (ret < 0)
        return ret;

    const int vec = 16 / (int)sizeof(T), per_lane = (C / vec + WARP_SIZE - 1) / WARP_SIZE;
    unsigned blocks = (unsigned)((N + LN_WARPS - 1) / LN_WARPS);
    bool aligned =
        ((uintptr_t)dinp | (uintptr_t)dout | (uintptr_t)inp | (uintptr_t)weight) % 16 == 0;
    if (aligned && C % vec == 0 && per_lane <= 1)
        layernorm_dinp_vec_kernel<T, 1><<<blocks, LN_WARPS * WARP_SIZE, 0, ctx->stream>>>(
            (T *)dinp, (const T *)dout, (const T *)inp, (const T *)weight, mean, rstd, N, C);
    else if (aligned && C % vec == 0 && per_lane <= LN_VEC_MAX)
        layernorm_dinp_vec_kernel<T, LN_VEC_MAX><<<blocks, LN_WARPS * WARP_SIZE, 0, ctx->stream>>>(
            (T *)dinp, (const T *)dout, (const T *)inp, (const T *)weight, mean, rstd, N, C);
    else
        layernorm_dinp_kernel<T><<<blocks, LN_WARPS * WARP_SIZE, 0, ctx->stream>>>(
            (T *)dinp, (const T *)dout, (const T *)inp, (const T *)weight, mean, rstd, N, C);
    dim3 grid((unsigned)((C + WARP_SIZE - 1) / WARP_SIZE), (unsigned)chunks);
    layernorm_dparams_partial<T><<<grid, dim3(WARP_SIZE, LN_LANES), 0, ctx->stream>>>(
        (float *)part, (const T *)dout, (const T *)inp, mean, rstd, N, C);
    layernorm_dparams_final<T><<<(unsigned)((C + 255) / 256), 256, 0, ctx->stream>>>(
        (T *)dweight, (T *)dbias, (const float *)part, chunks, C);
    return ctx_launched(ctx, op);
}

int gpu_layernorm_backward(struct gpu_ctx *ctx, enum gpu_dtype dt, void *dinp, void *dweight,
                           void *dbias, const void *dout, const void *inp, const void *weight,
                           const float *mean, const float *rstd, int N, int C)
{
    const char *op = "layernorm_backward";
    int ret = check_shape(ctx, op, N, C);
    if (ret < 0)
        return ret;
    if (N > 65535 * LN_CHUNK)
        return ctx_fail(ctx, -EINVAL, op, "N (%d) above %d rows", N, 65535 * LN_CHUNK);
    DISPATCH_DTYPE(ctx, op, dt, ret, layernorm_backward, ctx, dinp, dweight, dbias, dout, inp,
                   weight, mean, rstd, N, C);
    return ret;
}
