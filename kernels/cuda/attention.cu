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
 * GPU_BF16 runs on tensor cores (attention_tc.cu, same contracts); the kernels here serve
 * GPU_F32, with exact fp32 maths.
 *
 * Work split (fp32 FMAs from shared memory, no tensor cores). A block of ATT_WARPS warps owns
 * ATT_TILE consecutive rows of one (b,h), ATT_RPW rows per warp; the other operand streams
 * through shared memory in tiles of ATT_TILE rows, one per lane:
 *  - forward: query rows; over the key tiles up to the block's last row, lane j scores key j
 *    against the warp's ATT_RPW query rows (each key element read once for all of them), the
 *    running max m and sum l of each row are rescaled (online softmax), the probabilities go
 *    to the warp's slice of shared memory and each lane accumulates its dims d = lane + 32i
 *    of the outputs.
 *  - backward: D per row first; then dq the same way over key tiles, and dk, dv over query
 *    tiles from the block's first key on (one warp per ATT_RPW key rows). Each output element
 *    has one owner thread and each sum a fixed order: deterministic, no atomics, at the price
 *    of computing P twice.
 * Tile rows are padded to hs + 4 floats when hs is a multiple of 4 (dot products read float4:
 * the 8 lanes of each phase hit distinct banks), else hs + 1 (scalar reads, 32 distinct
 * banks for even hs). Rows past T are computed as copies of row T-1 and never stored, so
 * that no row is empty. */
#include <errno.h>
#include <math.h>

#include <type_traits>

#include "common.cuh"
#if defined(GPURUN_CUDNN) && !defined(GPURUN_CUDASIM)
#include "attention_cudnn.h"
#define HAVE_CUDNN 1
#endif
#include "banned.h"

/* The bf16 path on tensor cores (attention_tc.cu): the same contracts, after check_shape. */
int attention_tc_forward(struct gpu_ctx *ctx, void *out, float *lse, const void *qkv, int B, int T,
                         int C, int NH);
int attention_tc_backward(struct gpu_ctx *ctx, void *dqkv, const void *dout, const void *qkv,
                          const float *lse, const float *D, int B, int T, int C, int NH);

#define ATT_WARPS        8
#define ATT_THREADS      (ATT_WARPS * WARP_SIZE)
/* Rows per shared tile (one per lane) and per block. */
#define ATT_TILE         32
/* Rows per warp: ATT_WARPS * ATT_RPW = ATT_TILE. Each element of the streamed tile is read
 * from shared memory once for ATT_RPW rows. */
#define ATT_RPW          (ATT_TILE / ATT_WARPS)
#define ATT_MAX_HS       128
/* Output dims per lane: d = lane + 32 i for i < ATT_DPL (register arrays, unrolled). */
#define ATT_DPL          (ATT_MAX_HS / WARP_SIZE)
/* Blocks per SM the register budget is cut for: 2 x 256 threads at up to 128 registers, so
 * that the kernels' per-row accumulators (ATT_RPW rows x ATT_DPL dims, twice in dkv) do not
 * spill (ptxas -v shows 80 registers and spills at 3). */
#define ATT_MIN_BLOCKS   2
/* Shared memory a block may have without the opt-in attribute. */
#define ATT_SMEM_DEFAULT (48 * 1024)

/* Row stride of the shared tiles (see the header comment). */
__host__ __device__ __forceinline__ int tile_stride(int hs)
{
    return hs % 4 == 0 ? hs + 4 : hs + 1;
}

/* Loads rows r0 .. r0 + ATT_TILE - 1 (those < rows) of one head's slice into a tile of row
 * stride ks; rows past the end read as 0. src points at row 0's first channel of the head;
 * stride is the row length in elements. One warp per row: coalesced. */
template <typename T>
__device__ void load_tile(float *tile, const T *src, int r0, int rows, int hs, int ks,
                          size_t stride)
{
    int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    for (int r = warp; r < ATT_TILE; r += ATT_WARPS) {
        const T *s = src + (size_t)(r0 + r) * stride;
        bool in = r0 + r < rows;
        for (int d = lane; d < hs; d += WARP_SIZE)
            tile[r * ks + d] = in ? ldx(s + d) : 0.0f;
    }
}

/* out[r] = a . b_r for the ATT_RPW rows b_r = b + r * bs (shared memory, read by every lane
 * alike) and a the lane's own row, all hs long; float4 reads when hs is a multiple of 4 (then
 * a, b and bs are 16-byte aligned). */
__device__ __forceinline__ void dots(float out[ATT_RPW], const float *a, const float *b, int bs,
                                     int hs)
{
#pragma unroll
    for (int r = 0; r < ATT_RPW; r++)
        out[r] = 0.0f;
    if (hs % 4 == 0) {
        for (int d = 0; d < hs; d += 4) {
            float4 x = *(const float4 *)(a + d);
#pragma unroll
            for (int r = 0; r < ATT_RPW; r++) {
                float4 y = *(const float4 *)(b + r * bs + d);
                out[r] += x.x * y.x + x.y * y.y + x.z * y.z + x.w * y.w;
            }
        }
    } else {
        for (int d = 0; d < hs; d++) {
            float x = a[d];
#pragma unroll
            for (int r = 0; r < ATT_RPW; r++)
                out[r] += x * b[r * bs + d];
        }
    }
}

/* acc[r][i] += sum_{j < n} w[r * ATT_TILE + j] * tile[j][lane + 32 i]: the weights (the warp's
 * slice of shared memory, ATT_RPW rows of ATT_TILE, 16-byte aligned) times the tile's rows,
 * into each lane's dims, j in order. The weights go by float4: j runs on to n rounded up to 4
 * (within the tile), where the callers' weights are 0 and the tile's rows finite. */
__device__ __forceinline__ void accumulate(float acc[ATT_RPW][ATT_DPL], const float *w,
                                           const float *tile, int ks, int n, int hs)
{
    int lane = threadIdx.x % WARP_SIZE;
    for (int j = 0; j < n; j += 4) {
        float4 wj[ATT_RPW];
#pragma unroll
        for (int r = 0; r < ATT_RPW; r++)
            wj[r] = *(const float4 *)(w + r * ATT_TILE + j);
#pragma unroll
        for (int i = 0; i < ATT_DPL; i++) {
            int d = lane + WARP_SIZE * i;
            if (d < hs) {
                const float *x = tile + j * ks + d;
                float x0 = x[0], x1 = x[ks], x2 = x[2 * ks], x3 = x[3 * ks];
#pragma unroll
                for (int r = 0; r < ATT_RPW; r++) {
                    float a = acc[r][i];
                    a += wj[r].x * x0;
                    a += wj[r].y * x1;
                    a += wj[r].z * x2;
                    a += wj[r].w * x3;
                    acc[r][i] = a;
                }
            }
        }
    }
}

/* grid (T / ATT_TILE rounded up, NH, B). shared: K and V tiles, the query rows, the
 * probabilities (ATT_RPW x ATT_TILE per warp). */
template <typename T>
__global__ void __launch_bounds__(ATT_THREADS, ATT_MIN_BLOCKS)
    attention_forward_kernel(T *out, float *lse, const T *qkv, int T_, int C, int NH, float scale)
{
    extern __shared__ float4 smem4[];
    float *smem = (float *)smem4;
    int hs = C / NH, ks = tile_stride(hs);
    float *Ks = smem, *Vs = Ks + ATT_TILE * ks, *Qs = Vs + ATT_TILE * ks;
    float *Ps = Qs + ATT_TILE * ks;
    int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    /* The last rows first: they have the most keys (a shorter tail of blocks). */
    int h = blockIdx.y, b = blockIdx.z, t0 = (gridDim.x - 1 - blockIdx.x) * ATT_TILE;
    int last = min(t0 + ATT_TILE, T_) - 1; /* the block's last query row, and key */
    int r0 = warp * ATT_RPW;               /* the warp's first row in the block */
    size_t stride = 3 * (size_t)C;
    const T *base = qkv + (size_t)b * T_ * stride + h * hs;
    float *q = Qs + r0 * ks, *p = Ps + warp * ATT_RPW * ATT_TILE;
    int t[ATT_RPW];
#pragma unroll
    for (int r = 0; r < ATT_RPW; r++)
        t[r] = min(t0 + r0 + r, last);

    load_tile(Qs, base, t0, last + 1, hs, ks, stride);
    float m[ATT_RPW], l[ATT_RPW], acc[ATT_RPW][ATT_DPL];
#pragma unroll
    for (int r = 0; r < ATT_RPW; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0f; /* this lane's share of the row's sum */
#pragma unroll
        for (int i = 0; i < ATT_DPL; i++)
            acc[r][i] = 0.0f;
    }

    /* Every tile starts at or before the block's first row: each row has a key in it. */
    for (int k0 = 0; k0 <= last; k0 += ATT_TILE) {
        __syncthreads(); /* the previous tile is consumed */
        load_tile(Ks, base + C, k0, last + 1, hs, ks, stride);
        load_tile(Vs, base + 2 * C, k0, last + 1, hs, ks, stride);
        __syncthreads();
        int kt = k0 + lane;
        float s[ATT_RPW];
        dots(s, Ks + lane * ks, q, ks, hs);
#pragma unroll
        for (int r = 0; r < ATT_RPW; r++) {
            float x = kt <= t[r] ? s[r] * scale : -INFINITY;
            float mnew = fmaxf(m[r], warp_max(x)); /* finite: key k0 <= t[r] */
            float corr = expf(m[r] - mnew);        /* 0 on the first tile */
            float e = kt <= t[r] ? expf(x - mnew) : 0.0f;
            l[r] = l[r] * corr + e;
#pragma unroll
            for (int i = 0; i < ATT_DPL; i++)
                acc[r][i] *= corr;
            m[r] = mnew;
            p[r * ATT_TILE + lane] = e;
        }
        __syncwarp();
        accumulate(acc, p, Vs, ks, min(ATT_TILE, t[ATT_RPW - 1] - k0 + 1), hs);
        __syncwarp(); /* p is read before the next tile overwrites it */
    }
#pragma unroll
    for (int r = 0; r < ATT_RPW; r++) {
        float sum = warp_sum(l[r]);
        if (t0 + r0 + r > last)
            continue; /* a copy of row last */
        float inv = 1.0f / sum;
        T *o = out + ((size_t)b * T_ + t[r]) * C + h * hs;
#pragma unroll
        for (int i = 0; i < ATT_DPL; i++) {
            int d = lane + WARP_SIZE * i;
            if (d < hs)
                stx(o + d, acc[r][i] * inv);
        }
        if (lane == 0)
            lse[((size_t)b * NH + h) * T_ + t[r]] = m[r] + logf(sum);
    }
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

/* dq: grid as the forward; ATT_RPW query rows per warp over the key tiles. shared: K and V
 * tiles, the query and dout rows, dS (ATT_RPW x ATT_TILE per warp). */
template <typename T>
__global__ void __launch_bounds__(ATT_THREADS, ATT_MIN_BLOCKS)
    attention_dq_kernel(T *dqkv, const T *dout, const T *qkv, const float *lse, const float *D,
                        int T_, int C, int NH, float scale)
{
    extern __shared__ float4 smem4[];
    float *smem = (float *)smem4;
    int hs = C / NH, ks = tile_stride(hs);
    float *Ks = smem, *Vs = Ks + ATT_TILE * ks, *Qs = Vs + ATT_TILE * ks;
    float *Os = Qs + ATT_TILE * ks, *Ss = Os + ATT_TILE * ks;
    int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    /* The last rows first: they have the most keys (a shorter tail of blocks). */
    int h = blockIdx.y, b = blockIdx.z, t0 = (gridDim.x - 1 - blockIdx.x) * ATT_TILE;
    int last = min(t0 + ATT_TILE, T_) - 1;
    int r0 = warp * ATT_RPW;
    size_t stride = 3 * (size_t)C;
    const T *base = qkv + (size_t)b * T_ * stride + h * hs;
    const float *lrow = lse + ((size_t)b * NH + h) * T_, *drow = D + ((size_t)b * NH + h) * T_;
    float *q = Qs + r0 * ks, *dO = Os + r0 * ks, *ds = Ss + warp * ATT_RPW * ATT_TILE;
    int t[ATT_RPW];
    float lse_t[ATT_RPW], D_t[ATT_RPW], dq[ATT_RPW][ATT_DPL];
#pragma unroll
    for (int r = 0; r < ATT_RPW; r++) {
        t[r] = min(t0 + r0 + r, last);
        lse_t[r] = lrow[t[r]];
        D_t[r] = drow[t[r]];
#pragma unroll
        for (int i = 0; i < ATT_DPL; i++)
            dq[r][i] = 0.0f;
    }
    load_tile(Qs, base, t0, last + 1, hs, ks, stride);
    load_tile(Os, dout + (size_t)b * T_ * C + h * hs, t0, last + 1, hs, ks, (size_t)C);

    for (int k0 = 0; k0 <= last; k0 += ATT_TILE) {
        __syncthreads();
        load_tile(Ks, base + C, k0, last + 1, hs, ks, stride);
        load_tile(Vs, base + 2 * C, k0, last + 1, hs, ks, stride);
        __syncthreads();
        int kt = k0 + lane;
        float s[ATT_RPW], dp[ATT_RPW];
        dots(s, Ks + lane * ks, q, ks, hs);
        dots(dp, Vs + lane * ks, dO, ks, hs);
#pragma unroll
        for (int r = 0; r < ATT_RPW; r++) {
            float x = 0.0f;
            if (kt <= t[r]) {
                float pr = expf(s[r] * scale - lse_t[r]);
                x = pr * (dp[r] - D_t[r]) * scale;
            }
            ds[r * ATT_TILE + lane] = x;
        }
        __syncwarp();
        accumulate(dq, ds, Ks, ks, min(ATT_TILE, t[ATT_RPW - 1] - k0 + 1), hs);
        __syncwarp();
    }
#pragma unroll
    for (int r = 0; r < ATT_RPW; r++) {
        if (t0 + r0 + r > last)
            continue;
        T *o = dqkv + ((size_t)b * T_ + t[r]) * stride + h * hs;
#pragma unroll
        for (int i = 0; i < ATT_DPL; i++) {
            int d = lane + WARP_SIZE * i;
            if (d < hs)
                stx(o + d, dq[r][i]);
        }
    }
}

/* dk, dv: grid (T / ATT_TILE rounded up, NH, B); ATT_RPW key rows per warp over the query tiles
 * from the block's first key on (earlier queries do not see these keys). shared: Q and dout
 * tiles, the tile's lse and D, the block's k and v rows, P and dS (ATT_RPW x ATT_TILE per
 * warp each). */
template <typename T>
__global__ void __launch_bounds__(ATT_THREADS, ATT_MIN_BLOCKS)
    attention_dkv_kernel(T *dqkv, const T *dout, const T *qkv, const float *lse, const float *D,
                         int T_, int C, int NH, float scale)
{
    extern __shared__ float4 smem4[];
    float *smem = (float *)smem4;
    int hs = C / NH, ks = tile_stride(hs);
    float *Qt = smem, *Ot = Qt + ATT_TILE * ks, *Kb = Ot + ATT_TILE * ks, *Vb = Kb + ATT_TILE * ks;
    float *Lt = Vb + ATT_TILE * ks, *Dt = Lt + ATT_TILE, *Pw = Dt + ATT_TILE;
    float *Sw = Pw + ATT_WARPS * ATT_RPW * ATT_TILE;
    int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    int h = blockIdx.y, b = blockIdx.z, j0 = blockIdx.x * ATT_TILE;
    int jlast = min(j0 + ATT_TILE, T_) - 1;
    int r0 = warp * ATT_RPW;
    size_t stride = 3 * (size_t)C;
    const T *base = qkv + (size_t)b * T_ * stride + h * hs;
    const T *dbase = dout + (size_t)b * T_ * C + h * hs;
    const float *lrow = lse + ((size_t)b * NH + h) * T_, *drow = D + ((size_t)b * NH + h) * T_;
    float *k = Kb + r0 * ks, *v = Vb + r0 * ks;
    float *p = Pw + warp * ATT_RPW * ATT_TILE, *ds = Sw + warp * ATT_RPW * ATT_TILE;
    int j[ATT_RPW];
    float dk[ATT_RPW][ATT_DPL], dv[ATT_RPW][ATT_DPL];
#pragma unroll
    for (int r = 0; r < ATT_RPW; r++) {
        j[r] = min(j0 + r0 + r, jlast);
#pragma unroll
        for (int i = 0; i < ATT_DPL; i++)
            dk[r][i] = dv[r][i] = 0.0f;
    }
    load_tile(Kb, base + C, j0, jlast + 1, hs, ks, stride);
    load_tile(Vb, base + 2 * C, j0, jlast + 1, hs, ks, stride);

    for (int q0 = j0; q0 < T_; q0 += ATT_TILE) {
        __syncthreads();
        load_tile(Qt, base, q0, T_, hs, ks, stride);
        load_tile(Ot, dbase, q0, T_, hs, ks, (size_t)C);
        if (threadIdx.x < ATT_TILE) {
            int row = q0 + threadIdx.x;
            Lt[threadIdx.x] = row < T_ ? lrow[row] : 0.0f;
            Dt[threadIdx.x] = row < T_ ? drow[row] : 0.0f;
        }
        __syncthreads();
        int qi = q0 + lane;
        float s[ATT_RPW], dp[ATT_RPW];
        dots(s, Qt + lane * ks, k, ks, hs);
        dots(dp, Ot + lane * ks, v, ks, hs);
#pragma unroll
        for (int r = 0; r < ATT_RPW; r++) {
            float pr = 0.0f, x = 0.0f;
            if (qi >= j[r] && qi < T_) {
                pr = expf(s[r] * scale - Lt[lane]);
                x = pr * (dp[r] - Dt[lane]) * scale;
            }
            p[r * ATT_TILE + lane] = pr;
            ds[r * ATT_TILE + lane] = x;
        }
        __syncwarp();
        /* Rows past T have p = ds = 0: stop at the last one. */
        int n = min(ATT_TILE, T_ - q0);
        accumulate(dv, p, Ot, ks, n, hs);
        accumulate(dk, ds, Qt, ks, n, hs);
        __syncwarp();
    }
#pragma unroll
    for (int r = 0; r < ATT_RPW; r++) {
        if (j0 + r0 + r > jlast)
            continue;
        T *o = dqkv + ((size_t)b * T_ + j[r]) * stride + h * hs;
#pragma unroll
        for (int i = 0; i < ATT_DPL; i++) {
            int d = lane + WARP_SIZE * i;
            if (d < hs) {
                stx(o + C + d, dk[r][i]);
                stx(o + 2 * C + d, dv[r][i]);
            }
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
    return dim3((unsigned)((T + ATT_TILE - 1) / ATT_TILE), (unsigned)NH, (unsigned)B);
}

/* Lets kernel fn have smem bytes of dynamic shared memory (past the default 48 KiB for the
 * largest head sizes). */
static int allow_smem(struct gpu_ctx *ctx, const char *op, const void *fn, size_t smem)
{
    if (smem <= ATT_SMEM_DEFAULT)
        return 0;
    return ctx_cuda(
        ctx, cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem), op,
        "cudaFuncSetAttribute");
}

/* ---- cuDNN (attention_cudnn.h) ----------------------------------------------------------------
 */

/* ctx's cuDNN state, set up on first use: NULL, with ctx->cudnn_note saying why, where cuDNN
 * cannot be used. */
static struct cudnn_att *ctx_cudnn(struct gpu_ctx *ctx)
{
#ifdef HAVE_CUDNN
    if (!ctx->cudnn_tried) {
        ctx->cudnn_tried = true;
        if (cudnn_att_new(&ctx->cudnn, ctx->stream, ctx->cudnn_note, sizeof(ctx->cudnn_note)) < 0)
            ctx->cudnn = NULL;
    }
    return ctx->cudnn;
#elif defined(GPURUN_CUDASIM)
    snprintf(ctx->cudnn_note, sizeof(ctx->cudnn_note),
             "cudasim runs attention_tc.cu's kernels, not cuDNN");
    return NULL;
#else
    snprintf(ctx->cudnn_note, sizeof(ctx->cudnn_note),
             "built without the cuDNN frontend's headers (scripts/deps.sh installs them)");
    return NULL;
#endif
}

uint64_t ctx_cudnn_generation(const struct gpu_ctx *ctx)
{
#ifdef HAVE_CUDNN
    return ctx->cudnn ? cudnn_att_generation(ctx->cudnn) : 0;
#else
    (void)ctx;
    return 0;
#endif
}

void ctx_cudnn_free(struct gpu_ctx *ctx)
{
#ifdef HAVE_CUDNN
    cudnn_att_free(ctx->cudnn);
#endif
    ctx->cudnn = NULL;
}

void gpu_ctx_attention_describe(struct gpu_ctx *ctx, char *buf, size_t len)
{
    if (ctx->attention == GPU_ATT_OWN) {
        snprintf(buf, len, "own kernels");
        return;
    }
    if (ctx_cudnn(ctx) && !ctx->cudnn_note[0]) {
#ifdef HAVE_CUDNN
        size_t v = cudnn_att_version();
        snprintf(buf, len, "cuDNN %zu.%zu.%zu fused flash attention%s", v / 10000, v / 100 % 100,
                 v % 100, ctx->attention == GPU_ATT_CUDNN_FAST ? " (backward with atomics)" : "");
        return;
#endif
    }
    snprintf(buf, len, "own kernels (cuDNN not used: %s)", ctx->cudnn_note);
}

/* The bf16 attention through cuDNN: 0 done, 1 not done (the caller's own kernels run; under
 * GPU_ATT_AUTO ctx->cudnn_note says why), or a negative errno (a failure, or GPU_ATT_CUDNN
 * where cuDNN cannot). */
static int cudnn_fallback(struct gpu_ctx *ctx, int ret, const char *op, const char *why)
{
    if (ret != -ENOTSUP)
        return ctx_fail(ctx, ret, op, "%s", why);
    if (ctx->attention == GPU_ATT_CUDNN || ctx->attention == GPU_ATT_CUDNN_FAST)
        return ctx_fail(ctx, -ENOTSUP, op, "cuDNN attention unavailable: %s", why);
    if (why != ctx->cudnn_note)
        snprintf(ctx->cudnn_note, sizeof(ctx->cudnn_note), "%s", why);
    return 1;
}

/* Whether cuDNN is to run op: 0 with *a set, else what cudnn_fallback says (1: our kernels). */
static int cudnn_begin(struct gpu_ctx *ctx, const char *op, struct cudnn_att **a)
{
    if (ctx->attention == GPU_ATT_OWN)
        return 1;
    *a = ctx_cudnn(ctx);
    return *a ? 0 : cudnn_fallback(ctx, -ENOTSUP, op, ctx->cudnn_note);
}

static int cudnn_forward(struct gpu_ctx *ctx, void *out, float *lse, const void *qkv, int B, int T,
                         int C, int NH)
{
    const char *op = "attention_forward";
    struct cudnn_att *a = NULL;
    int begin = cudnn_begin(ctx, op, &a);
    if (begin != 0)
        return begin;
#ifdef HAVE_CUDNN
    char why[sizeof(ctx->cudnn_note)];
    int ret = cudnn_att_forward(a, out, lse, qkv, B, T, C, NH, why, sizeof(why));
    return ret < 0 ? cudnn_fallback(ctx, ret, op, why) : 0;
#else
    (void)out, (void)lse, (void)qkv, (void)B, (void)T, (void)C, (void)NH;
    return 1;
#endif
}

static int cudnn_backward(struct gpu_ctx *ctx, void *dqkv, const void *dout, const void *qkv,
                          const void *out, const float *lse, int B, int T, int C, int NH)
{
    const char *op = "attention_backward";
    struct cudnn_att *a = NULL;
    int begin = cudnn_begin(ctx, op, &a);
    if (begin != 0)
        return begin;
#ifdef HAVE_CUDNN
    char why[sizeof(ctx->cudnn_note)];
    int ret = cudnn_att_backward(a, dqkv, dout, qkv, out, lse, B, T, C, NH,
                                 ctx->attention != GPU_ATT_CUDNN_FAST, why, sizeof(why));
    return ret < 0 ? cudnn_fallback(ctx, ret, op, why) : 0;
#else
    (void)dqkv, (void)dout, (void)qkv, (void)out, (void)lse, (void)B, (void)T, (void)C, (void)NH;
    return 1;
#endif
}

/* ---- launchers ------------------------------------------------------------------------------- */

template <typename T>
static int attention_forward(struct gpu_ctx *ctx, void *out, float *lse, const void *qkv, int B,
                             int T_, int C, int NH)
{
    const char *op = "attention_forward";
    int hs = C / NH;
    if constexpr (std::is_same<T, bf16>::value) {
        int done = cudnn_forward(ctx, out, lse, qkv, B, T_, C, NH);
        if (done <= 0)
            return done;
        return attention_tc_forward(ctx, out, lse, qkv, B, T_, C, NH);
    }
    size_t smem = (3 * ATT_TILE * (size_t)tile_stride(hs) + ATT_TILE * ATT_TILE) * sizeof(float);
    int ret = allow_smem(ctx, op, (const void *)attention_forward_kernel<T>, smem);
    if (ret < 0)
        return ret;
    attention_forward_kernel<T><<<att_grid(B, T_, NH), ATT_THREADS, smem, ctx->stream>>>(
        (T *)out, lse, (const T *)qkv, T_, C, NH, 1.0f / sqrtf((float)hs));
    return ctx_launched(ctx, op);
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
    size_t rows = (size_t)B * T_ * NH, tile = ATT_TILE * (size_t)tile_stride(hs) * sizeof(float);
    size_t weights = ATT_TILE * ATT_TILE * sizeof(float); /* ATT_RPW x ATT_TILE per warp */
    size_t smem_dq = 4 * tile + weights,
           smem_dkv = 4 * tile + 2 * weights + 2 * ATT_TILE * sizeof(float);
    float scale = 1.0f / sqrtf((float)hs);
    void *D = NULL;
    if constexpr (std::is_same<T, bf16>::value) {
        int done = cudnn_backward(ctx, dqkv, dout, qkv, out, lse, B, T_, C, NH);
        if (done <= 0)
            return done;
    }
    int ret = ctx_scratch(ctx, rows * sizeof(float), &D, op);
    if (ret < 0)
        return ret;
    attention_delta_kernel<T>
        <<<(unsigned)((rows + ATT_WARPS - 1) / ATT_WARPS), ATT_THREADS, 0, ctx->stream>>>(
            (float *)D, (const T *)dout, (const T *)out, B, T_, C, NH);
    if constexpr (std::is_same<T, bf16>::value)
        return attention_tc_backward(ctx, dqkv, dout, qkv, lse, (const float *)D, B, T_, C, NH);
    if ((ret = allow_smem(ctx, op, (const void *)attention_dq_kernel<T>, smem_dq)) < 0 ||
        (ret = allow_smem(ctx, op, (const void *)attention_dkv_kernel<T>, smem_dkv)) < 0)
        return ret;

    attention_dq_kernel<T><<<att_grid(B, T_, NH), ATT_THREADS, smem_dq, ctx->stream>>>(
        (T *)dqkv, (const T *)dout, (const T *)qkv, lse, (const float *)D, T_, C, NH, scale);
    attention_dkv_kernel<T><<<att_grid(B, T_, NH), ATT_THREADS, smem_dkv, ctx->stream>>>(
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
