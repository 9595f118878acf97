/* Softmax + cross-entropy on the GPU (cuda_ops.h; reference: ops_crossentropy_forward/
 * backward). Over the first V of each row's Vp logits:
 *   lse[n] = log sum_{j<V} exp(logits[n,j]),  losses[n] = lse[n] - logits[n, targets[n]],
 *   dlogits[n,j] = dloss (exp(logits[n,j] - lse[n]) - [j == targets[n]]) for j < V, 0 beyond.
 * One block per row. The forward is one pass: each thread keeps a running max m and sum s of
 * exp(x - m) over its strided elements (online softmax: when x exceeds m, s is rescaled by
 * exp(m - x)), then the block combines the (m, s) pairs in a fixed order. The probabilities
 * are never stored: the fused kernel, the training step's, recomputes each from lse as it
 * writes the gradient, reading the row twice and writing it once, in place. Where the rows
 * start on 16 bytes, every load and store moves 16 bytes (vec16): the row's traffic is the
 * kernel's whole cost, and one bf16 a load left most of each memory transaction unused.
 *
 * The training step's form, fused in bf16 with rows of at most CE_REG_VECS x 8 x CE_THREADS
 * logits (GPT-2's 50304 take 13 of each thread's 16 vectors), reads each row once: a thread
 * keeps its 16-byte pieces in registers from the load to the gradient's store, so that a
 * logit costs 2 bytes in and 2 out, the least a classifier that writes its gradient can move
 * (6.6 GB at GPT-2's B 64: 2.75 ms at the H200's 4.8 TB/s, against 4.1 ms for two reads).
 * Without a running pair it takes the row's max first, then the sum of exp(x - max) (one
 * exponential a logit, where the online pair needs one and sometimes two), both combined over
 * the block in a fixed order. */
#include <errno.h>
#include <math.h>
#include <stdint.h>

#include <type_traits>

#include "common.cuh"
#include "banned.h"

#define CE_THREADS 512
#define CE_WARPS   (CE_THREADS / WARP_SIZE)

struct max_sum {
    float m, s;
};

/* The pair for the union of two sets of logits; exact in either order (m is a max, and the
 * sum of the two rescaled terms commutes), so every lane of a butterfly ends equal. */
__device__ __forceinline__ max_sum combine(max_sum a, max_sum b)
{
    if (a.m == -INFINITY)
        return b;
    if (b.m == -INFINITY)
        return a;
    float m = fmaxf(a.m, b.m);
    return {m, a.s * expf(a.m - m) + b.s * expf(b.m - m)};
}

/* The block's pair, in every thread. Ends with a barrier after the last read of the row's
 * first pass, so that the fused kernel may then overwrite the row. */
__device__ max_sum block_combine(max_sum x)
{
    __shared__ float sm[CE_WARPS], ss[CE_WARPS];
    for (int o = WARP_SIZE / 2; o > 0; o /= 2) {
        max_sum y = {__shfl_xor_sync(FULL_MASK, x.m, o), __shfl_xor_sync(FULL_MASK, x.s, o)};
        x = combine(x, y);
    }
    if (threadIdx.x % WARP_SIZE == 0) {
        sm[threadIdx.x / WARP_SIZE] = x.m;
        ss[threadIdx.x / WARP_SIZE] = x.s;
    }
    __syncthreads();
    max_sum r = {sm[0], ss[0]};
    for (int w = 1; w < CE_WARPS; w++)
        r = combine(r, max_sum{sm[w], ss[w]});
    return r;
}

template <typename T>
__device__ void write_grad(T *drow, const T *row, float lse, int target, int V, int Vp, float dloss)
{
    for (int j = threadIdx.x; j < Vp; j += CE_THREADS) {
        float d = 0.0f;
        if (j < V)
            d = dloss * (expf(ldx(row + j) - lse) - (j == target ? 1.0f : 0.0f));
        stx(drow + j, d);
    }
}

/* x into the running pair (online softmax). */
__device__ __forceinline__ void accumulate(max_sum &acc, float x)
{
    if (x > acc.m) {
        acc.s = acc.s * expf(acc.m - x) + 1.0f;
        acc.m = x;
    } else {
        acc.s += expf(x - acc.m);
    }
}

/* The vectorized rows: 16 bytes a load and a store (8 bf16 or 4 floats), where every row
 * starts on 16 bytes (the logits' base does, and Vp * sizeof(T) is a multiple of 16). A
 * thread takes the same 16-byte pieces in both passes, so that the gradient pass reads what
 * the first pass brought into the cache; the lanes of a warp read 512 contiguous bytes. */
template <typename T> struct vec16 {
    static constexpr int N = 16 / (int)sizeof(T);
    union {
        uint4 raw;
        T x[N];
    };
};

template <typename T> static bool vec16_ok(const void *logits, int Vp)
{
    return ((uintptr_t)logits % 16) == 0 && ((size_t)Vp * sizeof(T)) % 16 == 0;
}

template <typename T> __device__ __forceinline__ max_sum row_max_sum(const T *row, int V, bool vec)
{
    max_sum acc = {-INFINITY, 0.0f};
    constexpr int W = vec16<T>::N;

    if (!vec) {
        for (int j = threadIdx.x; j < V; j += CE_THREADS)
            accumulate(acc, ldx(row + j));
        return acc;
    }
    for (int j = threadIdx.x * W; j < V; j += CE_THREADS * W) {
        vec16<T> v;
        v.raw = *(const uint4 *)(row + j);
        for (int e = 0; e < W && j + e < V; e++)
            accumulate(acc, ldx(&v.x[e]));
    }
    return acc;
}

template <typename T>
__device__ __forceinline__ void write_grad_vec(T *drow, const T *row, float lse, int target, int V,
                                               int Vp, float dloss)
{
    constexpr int W = vec16<T>::N;

    for (int j = threadIdx.x * W; j < Vp; j += CE_THREADS * W) {
        vec16<T> v, d;
        v.raw = *(const uint4 *)(row + j);
        for (int e = 0; e < W; e++) {
            float g = 0.0f;
            if (j + e < V)
                g = dloss * (expf(ldx(&v.x[e]) - lse) - (j + e == target ? 1.0f : 0.0f));
            stx(&d.x[e], g);
        }
        *(uint4 *)(drow + j) = d.raw;
    }
}

/* FUSED: also the gradient, into the logits. vec: 16-byte loads and stores (vec16_ok). */
template <typename T, bool FUSED>
__global__ void __launch_bounds__(CE_THREADS)
    crossentropy_forward_kernel(float *losses, float *lse, T *logits, const int *targets, int V,
                                int Vp, float dloss, bool vec)
{
    size_t n = blockIdx.x;
    T *row = logits + n * Vp;
    max_sum acc = block_combine(row_max_sum(row, V, vec));
    float l = acc.m + logf(acc.s);
    int t = targets[n];
    bool valid = t >= 0 && t < V;
    if (threadIdx.x == 0) {
        lse[n] = l;
        losses[n] = valid ? l - ldx(row + t) : NAN;
    }
    if (FUSED) {
        __syncthreads(); /* thread 0's read of row[t] before anyone overwrites it */
        if (vec)
            write_grad_vec(row, row, l, valid ? t : -1, V, Vp, dloss);
        else
            write_grad(row, row, l, valid ? t : -1, V, Vp, dloss);
    }
}

/* The one-read kernel's threads, and the 16-byte vectors of a row each holds: 32 registers of
 * the 64 a thread may have with 1024 in a block. The loops over a vector's 8 logits that take
 * exponentials are not unrolled: unrolled, ptxas keeps their 64 values live at once and
 * spills (200 bytes a thread); rolled, it uses 64 registers and no local memory. */
#define CE_REG_THREADS 1024
#define CE_REG_VECS    8
#define CE_REG_MAX     (CE_REG_VECS * 8 * CE_REG_THREADS)

/* The one-read kernel's block max and sum (CE_REG_THREADS threads), in every thread, each
 * combined in a fixed order. Separate shared slots, so that one may follow the other without
 * a barrier in between. */
__device__ float block_max(float x)
{
    __shared__ float sm[CE_REG_THREADS / WARP_SIZE];
    for (int o = WARP_SIZE / 2; o > 0; o /= 2)
        x = fmaxf(x, __shfl_xor_sync(FULL_MASK, x, o));
    if (threadIdx.x % WARP_SIZE == 0)
        sm[threadIdx.x / WARP_SIZE] = x;
    __syncthreads();
    float r = sm[0];
    for (int w = 1; w < CE_REG_THREADS / WARP_SIZE; w++)
        r = fmaxf(r, sm[w]);
    return r;
}

__device__ float block_sum(float x)
{
    __shared__ float ss[CE_REG_THREADS / WARP_SIZE];
    for (int o = WARP_SIZE / 2; o > 0; o /= 2)
        x += __shfl_xor_sync(FULL_MASK, x, o);
    if (threadIdx.x % WARP_SIZE == 0)
        ss[threadIdx.x / WARP_SIZE] = x;
    __syncthreads();
    float r = ss[0];
    for (int w = 1; w < CE_REG_THREADS / WARP_SIZE; w++)
        r += ss[w];
    return r;
}

/* Logit e (0..7) of a 16-byte vector of bf16, exactly, by bits: the data stays in the
 * vector's four registers (a union indexed through a pointer can put them in local memory). */
__device__ __forceinline__ float bf16_of(const uint4 &r, int e)
{
    uint32_t w = e < 2 ? r.x : e < 4 ? r.y : e < 6 ? r.z : r.w;
    return __uint_as_float(e % 2 ? w & 0xffff0000u : w << 16);
}

/* f rounded to the nearest bf16, ties to even (as __float2bfloat16_rn; NaN stays NaN). */
__device__ __forceinline__ uint32_t bf16_bits(float f)
{
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return 0x7fc0u;
    return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}

/* The fused kernel reading each row once (the header comment): bf16, Vp <= CE_REG_MAX, rows on
 * 16 bytes. Thread i's vector k is the row's 8 logits from (k CE_REG_THREADS + i) 8: the
 * warp's loads and stores are 512 contiguous bytes. */
__global__ void __launch_bounds__(CE_REG_THREADS, 1)
    crossentropy_fused_reg_kernel(float *losses, float *lse, bf16 *logits, const int *targets,
                                  int V, int Vp, float dloss)
{
    size_t n = blockIdx.x;
    bf16 *row = logits + n * (size_t)Vp;
    uint4 v[CE_REG_VECS];
    float m = -INFINITY, s = 0.0f;

#pragma unroll
    for (int k = 0; k < CE_REG_VECS; k++) {
        int j = (k * CE_REG_THREADS + (int)threadIdx.x) * 8;
        v[k] = j < Vp ? *(const uint4 *)(row + j) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int k = 0; k < CE_REG_VECS; k++) {
        int j = (k * CE_REG_THREADS + (int)threadIdx.x) * 8;
#pragma unroll
        for (int e = 0; e < 8; e++)
            if (j + e < V)
                m = fmaxf(m, bf16_of(v[k], e));
    }
    m = block_max(m);
#pragma unroll
    for (int k = 0; k < CE_REG_VECS; k++) {
        int j = (k * CE_REG_THREADS + (int)threadIdx.x) * 8;
#pragma unroll 1
        for (int e = 0; e < 8; e++)
            if (j + e < V)
                s += __expf(bf16_of(v[k], e) - m);
    }
    float l = m + logf(block_sum(s));
    int t = targets[n];
    bool valid = t >= 0 && t < V;
    if (threadIdx.x == 0) {
        lse[n] = l;
        if (!valid)
            losses[n] = NAN;
    }
#pragma unroll
    for (int k = 0; k < CE_REG_VECS; k++) {
        int j = (k * CE_REG_THREADS + (int)threadIdx.x) * 8;
        if (j >= Vp)
            continue;
        uint32_t d[4];
#pragma unroll 1
        for (int e = 0; e < 8; e += 2) {
            float x0 = bf16_of(v[k], e), x1 = bf16_of(v[k], e + 1), g0 = 0.0f, g1 = 0.0f;
            if (j + e < V)
                g0 = dloss * (__expf(x0 - l) - (j + e == t ? 1.0f : 0.0f));
            if (j + e + 1 < V)
                g1 = dloss * (__expf(x1 - l) - (j + e + 1 == t ? 1.0f : 0.0f));
            if (valid && (t == j + e || t == j + e + 1))
                losses[n] = l - (t == j + e ? x0 : x1);
            d[e / 2] = bf16_bits(g0) | bf16_bits(g1) << 16;
        }
        *(uint4 *)(row + j) = make_uint4(d[0], d[1], d[2], d[3]);
    }
}

static int check_shape(struct gpu_ctx *ctx, const char *op, int N, int V, int Vp)
{
    if (N <= 0 || V <= 0 || Vp < V)
        return ctx_fail(ctx, -EINVAL, op, "N (%d) and V (%d) must be positive and Vp (%d) >= V", N,
                        V, Vp);
    return 0;
}

template <typename T, bool FUSED>
static int crossentropy_forward(struct gpu_ctx *ctx, const char *op, float *losses, float *lse,
                                void *logits, const int *targets, int N, int V, int Vp, float dloss)
{
    if (FUSED && std::is_same<T, bf16>::value && Vp <= CE_REG_MAX && vec16_ok<T>(logits, Vp)) {
        crossentropy_fused_reg_kernel<<<(unsigned)N, CE_REG_THREADS, 0, ctx->stream>>>(
            losses, lse, (bf16 *)logits, targets, V, Vp, dloss);
        return ctx_launched(ctx, op);
    }
    crossentropy_forward_kernel<T, FUSED><<<(unsigned)N, CE_THREADS, 0, ctx->stream>>>(
        losses, lse, (T *)logits, targets, V, Vp, dloss, vec16_ok<T>(logits, Vp));
    return ctx_launched(ctx, op);
}

template <typename T>
static int forward_only(struct gpu_ctx *ctx, const char *op, float *losses, float *lse,
                        void *logits, const int *targets, int N, int V, int Vp, float dloss)
{
    return crossentropy_forward<T, false>(ctx, op, losses, lse, logits, targets, N, V, Vp, dloss);
}

template <typename T>
static int fused(struct gpu_ctx *ctx, const char *op, float *losses, float *lse, void *logits,
                 const int *targets, int N, int V, int Vp, float dloss)
{
    return crossentropy_forward<T, true>(ctx, op, losses, lse, logits, targets, N, V, Vp, dloss);
}

int gpu_crossentropy_forward(struct gpu_ctx *ctx, enum gpu_dtype dt, float *losses, float *lse,
                             const void *logits, const int *targets, int N, int V, int Vp)
{
    const char *op = "crossentropy_forward";
    int ret = check_shape(ctx, op, N, V, Vp);
    if (ret < 0)
        return ret;
    /* The non-fused kernel never writes the logits. */
    DISPATCH_DTYPE(ctx, op, dt, ret, forward_only, ctx, op, losses, lse, (void *)logits, targets, N,
                   V, Vp, 0.0f);
    return ret;
}

int gpu_crossentropy_fused(struct gpu_ctx *ctx, enum gpu_dtype dt, float *losses, float *lse,
                           void *logits, const int *targets, int N, int V, int Vp, float dloss)
{
    const char *op = "crossentropy_fused";
    int ret = check_shape(ctx, op, N, V, Vp);
    if (ret < 0)
        return ret;
    DISPATCH_DTYPE(ctx, op, dt, ret, fused, ctx, op, losses, lse, logits, targets, N, V, Vp, dloss);
    return ret;
}
