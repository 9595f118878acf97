/* Causal multi-head attention on the GPU, flash style (cuda_ops.h; reference:
 * ops_attention_forward/backward). No (T,T) matrix is ever stored.
 *
 * Layout: qkv (B,T,3C) holds q, k, v of position t, head h at channels h*hs + d, C + h*hs + d
 * and 2C + h*hs + d (hs = C/NH <= ATT_MAX_HS); out (B,T,C) at h*hs + d; lse (B,NH,T) fp32.
 * With s[t,t2] = q[t].k[t2] / sqrt(hs) for t2 <= t and P = softmax_t2(s):
 *   out[t] = sum_t2 P[t,t2] v[t2],  lse[t] = log sum_t2 exp(s[t,t2]).
 * Backward, with D[t] = dout[t].out[t] (= sum_t2 P dP) and P recomputed as exp(s - lse):
 *   dP[t,t2] = dout[t].v[t2],  dS = P (dP - D[t]) / sqrt(hs),
 *   dq[t] = sum_t2 dS[t,t2] k[t2],  dk[t2] = sum_t dS[t,t2] q[t],  dv[t2] = sum_t P[t,t2] dout[t].
 *
 * Work split (simple rather than fast: fp32 FMAs from shared memory, no tensor cores):
 *  - forward: a block of ATT_WARPS warps takes ATT_WARPS consecutive query rows of one (b,h),
 *    one warp per row. Keys go through shared memory in tiles of 32; in a tile lane j scores
 *    key j (a whole dot product per lane), the warp's running max m and sum l are rescaled
 *    (online softmax), and each lane accumulates its own dims d = lane + 32i of the output
 *    (the tile's probabilities broadcast by shuffles).
 *  - backward: D per row first; then dq the same way over key tiles (one warp per query row),
 *    and dk, dv over query tiles (one warp per key row, queries t >= t2 only). Each output
 *    element has one owner thread and each sum a fixed order: deterministic, no atomics, at
 *    the price of computing P twice.
 * Shared tiles are fp32 with rows padded to hs + 1 floats, so that lanes reading 32 different
 * rows at one d hit 32 different banks (hs even). */
#include <errno.h>
#include <math.h>

#include "common.cuh"
#include "banned.h"

#define ATT_WARPS   8
#define ATT_THREADS (ATT_WARPS * WARP_SIZE)
/* Keys (or queries) per shared tile: one per lane. */
#define ATT_TILE    32
#define ATT_MAX_HS  128
/* Output dims per lane: d = lane + 32 i for i < ATT_DPL (register arrays, unrolled). */
#define ATT_DPL     (ATT_MAX_HS / WARP_SIZE)

/* Loads rows r0 .. r0 + ATT_TILE - 1 (those < rows) of one head's slice into a padded tile;
 * rows past the end read as 0. src points at row 0's first channel of the head; stride is
 * the row length (3C). */
template <typename T>
__device__ void load_tile(float *tile, const T *src, int r0, int rows, int hs, size_t stride)
{
    for (int i = threadIdx.x; i < ATT_TILE * hs; i += blockDim.x) {
        int r = i / hs, d = i % hs;
        tile[r * (hs + 1) + d] = r0 + r < rows ? ldx(src + (size_t)(r0 + r) * stride + d) : 0.0f;
    }
}

__device__ __forceinline__ float dot_smem(const float *a, const float *b, int hs)
{
    float s = 0.0f;
    for (int d = 0; d < hs; d++)
        s += a[d] * b[d];
    return s;
}

/* grid (T / ATT_WARPS rounded up, NH, B). shared: K and V tiles, then each warp's q row. */
template <typename T>
__global__ void __launch_bounds__(ATT_THREADS)
    attention_forward_kernel(T *out, float *lse, const T *qkv, int T_, int C, int NH, float scale)
{
    extern __shared__ float smem[];
    int hs = C / NH, ks = hs + 1;
    float *Ks = smem, *Vs = Ks + ATT_TILE * ks, *Qs = Vs + ATT_TILE * ks;
    int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    int h = blockIdx.y, b = blockIdx.z, t0 = blockIdx.x * ATT_WARPS, t = t0 + warp;
    int last = min(t0 + ATT_WARPS, T_) - 1; /* the block's last query row, and key */
    size_t stride = 3 * (size_t)C;
    const T *base = qkv + (size_t)b * T_ * stride + h * hs;
    float *q = Qs + warp * hs;
    bool active = t < T_;

    if (active)
        for (int d = lane; d < hs; d += WARP_SIZE)
            q[d] = ldx(base + (size_t)t * stride + d);
    float m = -INFINITY, l = 0.0f, acc[ATT_DPL];
#pragma unroll
    for (int i = 0; i < ATT_DPL; i++)
        acc[i] = 0.0f;

    for (int k0 = 0; k0 <= last; k0 += ATT_TILE) {
        __syncthreads(); /* the previous tile is consumed; q is written */
        load_tile(Ks, base + C, k0, last + 1, hs, stride);
        load_tile(Vs, base + 2 * C, k0, last + 1, hs, stride);
        __syncthreads();
        if (!active || k0 > t)
            continue;
        int kt = k0 + lane, nk = min(ATT_TILE, t - k0 + 1);
        float s = kt <= t ? dot_smem(q, Ks + lane * ks, hs) * scale : -INFINITY;
        float mnew = fmaxf(m, warp_max(s)); /* finite: key k0 <= t is in the tile */
        float corr = expf(m - mnew);        /* 0 on the first tile */
        float p = kt <= t ? expf(s - mnew) : 0.0f;
        l = l * corr + warp_sum(p);
#pragma unroll
        for (int i = 0; i < ATT_DPL; i++)
            acc[i] *= corr;
        for (int j = 0; j < nk; j++) {
            float pj = __shfl_sync(FULL_MASK, p, j);
#pragma unroll
            for (int i = 0; i < ATT_DPL; i++) {
                int d = lane + WARP_SIZE * i;
                if (d < hs)
                    acc[i] += pj * Vs[j * ks + d];
            }
        }
        m = mnew;
    }
    if (!active)
        return;
    float inv = 1.0f / l;
    T *o = out + ((size_t)b * T_ + t) * C + h * hs;
#pragma unroll
    for (int i = 0; i < ATT_DPL; i++) {
        int d = lane + WARP_SIZE * i;
        if (d < hs)
            stx(o + d, acc[i] * inv);
    }
    if (lane == 0)
        lse[((size_t)b * NH + h) * T_ + t] = m + logf(l);
}

/* D[b,h,t] = dout[b,t,h] . out[b,t,h]: one warp per (b,t,h) row. */
template <typename T>
__global__ void attention_delta_kernel(float *D, const T *dout, const T *out, int B, int T_, int C,
                                       int NH)
{
    size_t row = blockIdx.x * (size_t)ATT_WARPS + threadIdx.x / WARP_SIZE;
    int lane = threadIdx.x % WARP_SIZE, hs = C / NH;
    if (row >= (size_t)B * T_ * NH)
        return;
    int h = (int)(row % NH);
    size_t bt = row / NH, b = bt / T_, t = bt % T_;
    const T *x = dout + bt * C + h * hs, *y = out + bt * C + h * hs;
    float s = 0.0f;
    for (int d = lane; d < hs; d += WARP_SIZE)
        s += ldx(x + d) * ldx(y + d);
    s = warp_sum(s);
    if (lane == 0)
        D[(b * NH + h) * T_ + t] = s;
}

/* dq: grid as the forward; one warp per query row over the key tiles. shared: K and V tiles,
 * then each warp's q and dout rows. */
template <typename T>
__global__ void __launch_bounds__(ATT_THREADS)
    attention_dq_kernel(T *dqkv, const T *dout, const T *qkv, const float *lse, const float *D,
                        int T_, int C, int NH, float scale)
{
    extern __shared__ float smem[];
    int hs = C / NH, ks = hs + 1;
    float *Ks = smem, *Vs = Ks + ATT_TILE * ks, *Qs = Vs + ATT_TILE * ks, *Os = Qs + ATT_WARPS * hs;
    int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    int h = blockIdx.y, b = blockIdx.z, t0 = blockIdx.x * ATT_WARPS, t = t0 + warp;
    int last = min(t0 + ATT_WARPS, T_) - 1;
    size_t stride = 3 * (size_t)C;
    const T *base = qkv + (size_t)b * T_ * stride + h * hs;
    float *q = Qs + warp * hs, *dO = Os + warp * hs;
    bool active = t < T_;
    float lse_t = 0.0f, D_t = 0.0f, dq[ATT_DPL];
#pragma unroll
    for (int i = 0; i < ATT_DPL; i++)
        dq[i] = 0.0f;
    if (active) {
        for (int d = lane; d < hs; d += WARP_SIZE) {
            q[d] = ldx(base + (size_t)t * stride + d);
            dO[d] = ldx(dout + ((size_t)b * T_ + t) * C + h * hs + d);
        }
        lse_t = lse[((size_t)b * NH + h) * T_ + t];
        D_t = D[((size_t)b * NH + h) * T_ + t];
    }

    for (int k0 = 0; k0 <= last; k0 += ATT_TILE) {
        __syncthreads();
        load_tile(Ks, base + C, k0, last + 1, hs, stride);
        load_tile(Vs, base + 2 * C, k0, last + 1, hs, stride);
        __syncthreads();
        if (!active || k0 > t)
            continue;
        int kt = k0 + lane, nk = min(ATT_TILE, t - k0 + 1);
        float ds = 0.0f;
        if (kt <= t) {
            float p = expf(dot_smem(q, Ks + lane * ks, hs) * scale - lse_t);
            float dp = dot_smem(dO, Vs + lane * ks, hs);
            ds = p * (dp - D_t) * scale;
        }
        for (int j = 0; j < nk; j++) {
            float dsj = __shfl_sync(FULL_MASK, ds, j);
#pragma unroll
            for (int i = 0; i < ATT_DPL; i++) {
                int d = lane + WARP_SIZE * i;
                if (d < hs)
                    dq[i] += dsj * Ks[j * ks + d];
            }
        }
    }
    if (!active)
        return;
    T *o = dqkv + ((size_t)b * T_ + t) * stride + h * hs;
#pragma unroll
    for (int i = 0; i < ATT_DPL; i++) {
        int d = lane + WARP_SIZE * i;
        if (d < hs)
            stx(o + d, dq[i]);
    }
}

/* dk, dv: grid (T / ATT_WARPS rounded up, NH, B); one warp per key row j over the query tiles
 * from the block's first key on (earlier queries do not see these keys). shared: Q and dout
 * tiles, the tile's lse and D, then each warp's k and v rows. */
template <typename T>
__global__ void __launch_bounds__(ATT_THREADS)
    attention_dkv_kernel(T *dqkv, const T *dout, const T *qkv, const float *lse, const float *D,
                         int T_, int C, int NH, float scale)
{
    extern __shared__ float smem[];
    int hs = C / NH, ks = hs + 1;
    float *Qt = smem, *Ot = Qt + ATT_TILE * ks, *Lt = Ot + ATT_TILE * ks, *Dt = Lt + ATT_TILE;
    float *Kw = Dt + ATT_TILE, *Vw = Kw + ATT_WARPS * hs;
    int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    int h = blockIdx.y, b = blockIdx.z, j0 = blockIdx.x * ATT_WARPS, j = j0 + warp;
    size_t stride = 3 * (size_t)C;
    const T *base = qkv + (size_t)b * T_ * stride + h * hs;
    const T *dbase = dout + (size_t)b * T_ * C + h * hs;
    const float *lrow = lse + ((size_t)b * NH + h) * T_, *drow = D + ((size_t)b * NH + h) * T_;
    float *k = Kw + warp * hs, *v = Vw + warp * hs;
    bool active = j < T_;
    float dk[ATT_DPL], dv[ATT_DPL];
#pragma unroll
    for (int i = 0; i < ATT_DPL; i++)
        dk[i] = dv[i] = 0.0f;
    if (active)
        for (int d = lane; d < hs; d += WARP_SIZE) {
            k[d] = ldx(base + (size_t)j * stride + C + d);
            v[d] = ldx(base + (size_t)j * stride + 2 * C + d);
        }

    for (int q0 = j0; q0 < T_; q0 += ATT_TILE) {
        __syncthreads();
        load_tile(Qt, base, q0, T_, hs, stride);
        load_tile(Ot, dbase, q0, T_, hs, (size_t)C);
        if (threadIdx.x < ATT_TILE) {
            int r = q0 + threadIdx.x;
            Lt[threadIdx.x] = r < T_ ? lrow[r] : 0.0f;
            Dt[threadIdx.x] = r < T_ ? drow[r] : 0.0f;
        }
        __syncthreads();
        if (!active || q0 + ATT_TILE - 1 < j)
            continue;
        int qi = q0 + lane;
        float p = 0.0f, ds = 0.0f;
        if (qi >= j && qi < T_) {
            p = expf(dot_smem(Qt + lane * ks, k, hs) * scale - Lt[lane]);
            float dp = dot_smem(Ot + lane * ks, v, hs);
            ds = p * (dp - Dt[lane]) * scale;
        }
        /* Rows before j, and past T, have p = ds = 0: start at j, stop at the last row. */
        int i0 = max(0, j - q0), i1 = min(ATT_TILE, T_ - q0);
        for (int r = i0; r < i1; r++) {
            float pr = __shfl_sync(FULL_MASK, p, r), dsr = __shfl_sync(FULL_MASK, ds, r);
#pragma unroll
            for (int i = 0; i < ATT_DPL; i++) {
                int d = lane + WARP_SIZE * i;
                if (d < hs) {
                    dv[i] += pr * Ot[r * ks + d];
                    dk[i] += dsr * Qt[r * ks + d];
                }
            }
        }
    }
    if (!active)
        return;
    T *o = dqkv + ((size_t)b * T_ + j) * stride + h * hs;
#pragma unroll
    for (int i = 0; i < ATT_DPL; i++) {
        int d = lane + WARP_SIZE * i;
        if (d < hs) {
            stx(o + C + d, dk[i]);
            stx(o + 2 * C + d, dv[i]);
        }
    }
}

static int check_shape(struct gpu_ctx *ctx, const char *op, int B, int T, int C, int NH)
{
    if (B <= 0 || T <= 0 || C <= 0 || NH <= 0)
        return ctx_fail(ctx, -EINVAL, op, "B (%d), T (%d), C (%d) and NH (%d) must be positive", B,
                        T, C, NH);
    if (C % NH)
        return ctx_fail(ctx, -EINVAL, op, "NH (%d) must divide C (%d)", NH, C);
    if (C / NH > ATT_MAX_HS)
        return ctx_fail(ctx, -EINVAL, op, "head size %d above %d", C / NH, ATT_MAX_HS);
    if (NH > 65535 || B > 65535)
        return ctx_fail(ctx, -EINVAL, op, "B (%d) and NH (%d) must be at most 65535", B, NH);
    return 0;
}

static dim3 att_grid(int B, int T, int NH)
{
    return dim3((unsigned)((T + ATT_WARPS - 1) / ATT_WARPS), (unsigned)NH, (unsigned)B);
}

template <typename T>
static int attention_forward(struct gpu_ctx *ctx, void *out, float *lse, const void *qkv, int B,
                             int T_, int C, int NH)
{
    int hs = C / NH;
    size_t smem = (2 * ATT_TILE * (size_t)(hs + 1) + ATT_WARPS * (size_t)hs) * sizeof(float);
    attention_forward_kernel<T><<<att_grid(B, T_, NH), ATT_THREADS, smem, ctx->stream>>>(
        (T *)out, lse, (const T *)qkv, T_, C, NH, 1.0f / sqrtf((float)hs));
    return ctx_launched(ctx, "attention_forward");
}

int gpu_attention_forward(struct gpu_ctx *ctx, enum gpu_dtype dt, void *out, float *lse,
                          const void *qkv, int B, int T, int C, int NH)
{
    int ret = check_shape(ctx, "attention_forward", B, T, C, NH);
    if (ret < 0)
        return ret;
    DISPATCH_DTYPE(ctx, "attention_forward", dt, ret, attention_forward, ctx, out, lse, qkv, B, T,
                   C, NH);
    return ret;
}

template <typename T>
static int attention_backward(struct gpu_ctx *ctx, void *dqkv, const void *dout, const void *qkv,
                              const void *out, const float *lse, int B, int T_, int C, int NH)
{
    const char *op = "attention_backward";
    int hs = C / NH;
    size_t rows = (size_t)B * T_ * NH;
    float scale = 1.0f / sqrtf((float)hs);
    void *D = NULL;
    int ret = ctx_scratch(ctx, rows * sizeof(float), &D, op);
    if (ret < 0)
        return ret;

    attention_delta_kernel<T>
        <<<(unsigned)((rows + ATT_WARPS - 1) / ATT_WARPS), ATT_THREADS, 0, ctx->stream>>>(
            (float *)D, (const T *)dout, (const T *)out, B, T_, C, NH);
    size_t tiles = 2 * ATT_TILE * (size_t)(hs + 1) * sizeof(float);
    size_t rows_w = 2 * ATT_WARPS * (size_t)hs * sizeof(float);
    attention_dq_kernel<T><<<att_grid(B, T_, NH), ATT_THREADS, tiles + rows_w, ctx->stream>>>(
        (T *)dqkv, (const T *)dout, (const T *)qkv, lse, (const float *)D, T_, C, NH, scale);
    attention_dkv_kernel<T><<<att_grid(B, T_, NH), ATT_THREADS,
                              tiles + rows_w + 2 * ATT_TILE * sizeof(float), ctx->stream>>>(
        (T *)dqkv, (const T *)dout, (const T *)qkv, lse, (const float *)D, T_, C, NH, scale);
    return ctx_launched(ctx, op);
}

int gpu_attention_backward(struct gpu_ctx *ctx, enum gpu_dtype dt, void *dqkv, const void *dout,
                           const void *qkv, const void *out, const float *lse, int B, int T, int C,
                           int NH)
{
    int ret = check_shape(ctx, "attention_backward", B, T, C, NH);
    if (ret < 0)
        return ret;
    DISPATCH_DTYPE(ctx, "attention_backward", dt, ret, attention_backward, ctx, dqkv, dout, qkv,
                   out, lse, B, T, C, NH);
    return ret;
}
