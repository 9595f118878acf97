/* Causal attention in bf16 on tensor cores (the GPU_BF16 path of attention.cu's launchers,
 * whose header comment states the maths and layouts), flash style after FlashAttention-2:
 * no (T,T) matrix is stored, lse (B,NH,T) fp32 is saved for the backward.
 *
 * Matrix products go through the WMMA API (nvcuda::wmma, 16x16x16, bf16 inputs, fp32
 * accumulators); fragments are used only through it and through elementwise loops over
 * frag.x[0 .. num_elements), never assuming which elements a lane holds. Row-wise work (the
 * online softmax, masks, P and dS) is done by the warp's lanes on the fragments' copies in
 * shared memory, in fp32. The one row-wise operation on a fragment, the forward's rescale
 * of the output accumulators by the row's correction exp(m_old - m_new), reads the factor of
 * each element from shared memory through a fragment of row indices (element (r, c) = r,
 * loaded with load_matrix_sync), so it needs no knowledge of the layout either.
 *
 * Tiles: a block is TC_WARPS = 4 warps and owns 64 rows of one (b, h); each warp owns 16 of
 * them. The other operand streams through shared memory in tiles of 64 rows. The head size hs
 * is padded with zeros to HP (32, 64 or 128: a template parameter, so that the fragment
 * arrays are registers); rows past T are zeros too.
 *  - forward (blocks over query tiles, the last first: they have the most keys): per key tile,
 *    S = Q K^T (16 x 64 per warp, fp32) -> shared; lanes (two per row) take the row max,
 *    rescale m and l, write P = exp(S scale - m) as bf16 (0 for masked keys: key > query or
 *    key >= T) and the row's correction; O (16 x HP fragments) is rescaled, then O += P V.
 *    At the end O / l is written through shared memory; lse = m + log l.
 *  - D = rowsum(dO * O): attention.cu's delta kernel.
 *  - dq (blocks over query tiles): per key tile, S = Q K^T and dP = dO V^T -> shared; lanes
 *    write dS = P (dP - D) as bf16 with P = exp(S scale - lse); dQ += dS K; dQ *= scale.
 *  - dk, dv (blocks over key tiles, from the block's first key on): per query tile,
 *    S^T = K Q^T and dP^T = V dO^T -> shared; lanes write P^T and dS^T as bf16; dV += P^T dO,
 *    dK += dS^T Q; dK *= scale.
 *  Each warp skips the 16-wide sub-tiles its causal mask removes entirely (on the diagonal
 *  tile, and past T). Every output element has one owning warp and every sum a fixed order:
 *  deterministic, no atomics (P is computed twice, in dq and in dk/dv, for that).
 *
 * Shared memory (bf16 rows padded to HP + 8, fp32 rows of S to 68: 16-byte row steps against
 * bank conflicts, every WMMA pointer 256-bit aligned as the API requires), HP = 64 / 128:
 *  forward: Q, K, V tiles 3 x 64 (HP+8) x 2 B, S 4 x 16 x 68 x 4 B, P 4 x 16 x 72 x 2 B:
 *           53.4 / 77.4 KiB;
 *  dq:      Q, dO, K, V 4 x 64 (HP+8) x 2 B, S and dP 2 x 17 KiB, dS 9 KiB: 79 / 111 KiB;
 *  dk, dv:  the same plus P and lse, D of the tile: 88.5 / 120.5 KiB;
 * all above 48 KiB (cudaFuncSetAttribute) and below 227 KiB; HP = 64 (GPT-2) fits two blocks
 * per SM. The output is staged in the K and V (dk, dv: Q and dO) tiles once they are done. */
#include <errno.h>
#include <math.h>
#include <stdint.h>

#include <mma.h>

#include "common.cuh"
#include "banned.h"

using namespace nvcuda;

#define TC_WARPS        4
#define TC_THREADS      (TC_WARPS * WARP_SIZE)
/* Rows a block owns, and rows of each streamed tile: 16 per warp (one WMMA tile high). */
#define TC_ROWS         64
#define WM              16
/* Row strides of the fp32 (S, dP) and bf16 (P, dS) per-warp slices: 64 plus 16 bytes. */
#define TC_SS           (TC_ROWS + 4)
#define TC_PS           (TC_ROWS + 8)
/* The alignment the kernels give their dynamic shared memory (WMMA needs 32 bytes). */
#define TC_ALIGN        128
/* Blocks per SM the registers are budgeted for: 2 x 128 threads may use up to 255 each (the
 * accumulators of dk and dv at HP 128 take 128). Without it ptxas aims higher and spills (dq
 * at HP 32: 8 bytes); with it, ptxas -v shows no spills, 139 to 255 registers. */
#define TC_MIN_BLOCKS   2
/* Shared memory a block may have without the opt-in attribute. */
#define TC_SMEM_DEFAULT (48 * 1024)

typedef wmma::fragment<wmma::accumulator, WM, WM, WM, float> frag_acc;
typedef wmma::fragment<wmma::matrix_a, WM, WM, WM, bf16, wmma::row_major> frag_a;
typedef wmma::fragment<wmma::matrix_b, WM, WM, WM, bf16, wmma::row_major> frag_b;
typedef wmma::fragment<wmma::matrix_b, WM, WM, WM, bf16, wmma::col_major> frag_bt;

/* The bytes of each kernel's shared memory for padded head size hp (the header comment). */
static size_t tile_bytes(int hp)
{
    return (size_t)TC_ROWS * (hp + 8) * sizeof(bf16);
}
static const size_t S_BYTES = (size_t)TC_WARPS * WM * TC_SS * sizeof(float);
static const size_t P_BYTES = (size_t)TC_WARPS * WM * TC_PS * sizeof(bf16);

static size_t fwd_smem(int hp)
{
    return TC_ALIGN + 3 * tile_bytes(hp) + S_BYTES + P_BYTES + TC_WARPS * WM * sizeof(float);
}
static size_t dq_smem(int hp)
{
    return TC_ALIGN + 4 * tile_bytes(hp) + 2 * S_BYTES + P_BYTES;
}
static size_t dkv_smem(int hp)
{
    return TC_ALIGN + 4 * tile_bytes(hp) + 2 * TC_ROWS * sizeof(float) + 2 * S_BYTES + 2 * P_BYTES;
}

__device__ __forceinline__ char *tc_align(void *p)
{
    return (char *)(((uintptr_t)p + TC_ALIGN - 1) & ~(uintptr_t)(TC_ALIGN - 1));
}

/* Loads rows r0 .. r0 + TC_ROWS - 1 of one head's slice into a bf16 tile of row stride HP + 8:
 * elements d < hs of the rows below `rows`, zeros elsewhere (d in [hs, HP), rows past the
 * end). src points at row 0's first element, rows `stride` elements apart. vec: hs is a
 * multiple of 8 and src 16-byte aligned (16-byte loads). The whole block takes part. */
template <int HP>
__device__ void tc_load(bf16 *dst, const bf16 *src, int r0, int rows, int hs, size_t stride,
                        bool vec)
{
    constexpr int QS = HP + 8;
    if (vec) {
        constexpr int V = HP / 8;
        for (int i = threadIdx.x; i < TC_ROWS * V; i += TC_THREADS) {
            int r = i / V, c = i % V * 8;
            uint4 v = make_uint4(0, 0, 0, 0);
            if (r0 + r < rows && c < hs)
                v = *(const uint4 *)(src + (size_t)(r0 + r) * stride + c);
            *(uint4 *)(dst + r * QS + c) = v;
        }
    } else {
        for (int i = threadIdx.x; i < TC_ROWS * HP; i += TC_THREADS) {
            int r = i / HP, c = i % HP;
            bf16 v = __float2bfloat16_rn(0.0f);
            if (r0 + r < rows && c < hs)
                v = src[(size_t)(r0 + r) * stride + c];
            dst[r * QS + c] = v;
        }
    }
}

/* Writes the warp's 16 staged fp32 rows (stride HP + 4) times the row factors f (NULL: 1) as
 * bf16 to dst rows row0 .. row0 + 15 that are below T_ (rows `stride` elements apart), hs
 * elements each. */
template <int HP>
__device__ void tc_write(bf16 *dst, const float *stage, const float *f, int row0, int T_, int hs,
                         size_t stride)
{
    int lane = threadIdx.x % WARP_SIZE;
    for (int i = lane; i < WM * hs; i += WARP_SIZE) {
        int r = i / hs, d = i % hs;
        if (row0 + r < T_)
            dst[(size_t)(row0 + r) * stride + d] =
                __float2bfloat16_rn(stage[r * (HP + 4) + d] * (f ? f[r] : 1.0f));
    }
}

/* grid (T / 64 rounded up, NH, B), TC_THREADS threads. */
template <int HP>
__global__ void __launch_bounds__(TC_THREADS, TC_MIN_BLOCKS)
    attention_tc_forward_kernel(bf16 *out, float *lse, const bf16 *qkv, int T_, int C, int NH,
                                float scale, int vec)
{
    constexpr int QS = HP + 8, NF = HP / WM;
    extern __shared__ float4 tc_smem4[];
    char *smem = tc_align(tc_smem4);
    bf16 *Qs = (bf16 *)smem, *Ks = Qs + TC_ROWS * QS, *Vs = Ks + TC_ROWS * QS;
    float *Sall = (float *)(Vs + TC_ROWS * QS);
    bf16 *Pall = (bf16 *)(Sall + TC_WARPS * WM * TC_SS);
    float *Call = (float *)(Pall + TC_WARPS * WM * TC_PS);
    int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    float *Sw = Sall + warp * WM * TC_SS, *Cw = Call + warp * WM;
    bf16 *Pw = Pall + warp * WM * TC_PS;
    int h = blockIdx.y, b = blockIdx.z, q0 = (gridDim.x - 1 - blockIdx.x) * TC_ROWS;
    int hs = C / NH, last = min(q0 + TC_ROWS, T_) - 1; /* the block's last row, and key */
    size_t stride = 3 * (size_t)C;
    const bf16 *base = qkv + (size_t)b * T_ * stride + h * hs;
    int qw = q0 + WM * warp; /* the warp's first row */
    bool active = qw < T_;   /* else all its rows are padding */
    int wlast = min(qw + WM - 1, T_ - 1);
    int r = lane / 2, half = lane % 2; /* a lane pair per row, 32 columns each */
    int q = qw + r, c0 = half * 32;
    float m = -INFINITY, l = 0.0f;

    /* Element (r, c) of rowf is r: the row of each of a lane's accumulator elements. */
    frag_acc rowf, o[NF], s[TC_ROWS / WM];
    for (int i = lane; i < WM * WM; i += WARP_SIZE)
        Sw[i / WM * TC_SS + i % WM] = (float)(i / WM);
    __syncwarp();
    wmma::load_matrix_sync(rowf, Sw, TC_SS, wmma::mem_row_major);
#pragma unroll
    for (int j = 0; j < NF; j++)
        wmma::fill_fragment(o[j], 0.0f);
    tc_load<HP>(Qs, base, q0, T_, hs, stride, vec);

    /* Every tile starts at or before the block's first row: each row has a key in it. */
    for (int k0 = 0; k0 <= last; k0 += TC_ROWS) {
        __syncthreads(); /* the previous tiles are consumed */
        tc_load<HP>(Ks, base + C, k0, T_, hs, stride, vec);
        tc_load<HP>(Vs, base + 2 * C, k0, T_, hs, stride, vec);
        __syncthreads();
        if (!active)
            continue;
        int nk = min(TC_ROWS / WM, (wlast - k0) / WM + 1); /* sub-tiles with a visible key */

        /* S = Q K^T: K's rows read as the columns of a col-major B. */
#pragma unroll
        for (int j = 0; j < TC_ROWS / WM; j++)
            wmma::fill_fragment(s[j], 0.0f);
#pragma unroll
        for (int kk = 0; kk < NF; kk++) {
            frag_a a;
            wmma::load_matrix_sync(a, Qs + WM * warp * QS + WM * kk, QS);
#pragma unroll
            for (int j = 0; j < TC_ROWS / WM; j++)
                if (j < nk) {
                    frag_bt bt;
                    wmma::load_matrix_sync(bt, Ks + WM * j * QS + WM * kk, QS);
                    wmma::mma_sync(s[j], a, bt, s[j]);
                }
        }
#pragma unroll
        for (int j = 0; j < TC_ROWS / WM; j++)
            if (j < nk)
                wmma::store_matrix_sync(Sw + WM * j, s[j], TC_SS, wmma::mem_row_major);
        __syncwarp();

        /* Online softmax of row r over columns [c0, c1). */
        int c1 = min(c0 + 32, WM * nk);
        float mx = -INFINITY, sum = 0.0f;
        for (int c = c0; c < c1; c++) {
            int key = k0 + c;
            if (key <= q && key < T_)
                mx = fmaxf(mx, Sw[r * TC_SS + c] * scale);
        }
        float mnew = fmaxf(m, fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, 1))); /* finite: key k0 */
        float corr = __expf(m - mnew);                                       /* 0 at first */
        for (int c = c0; c < c1; c++) {
            int key = k0 + c;
            float p = key <= q && key < T_ ? __expf(Sw[r * TC_SS + c] * scale - mnew) : 0.0f;
            Pw[r * TC_PS + c] = __float2bfloat16_rn(p);
            sum += p;
        }
        sum += __shfl_xor_sync(FULL_MASK, sum, 1);
        l = l * corr + sum;
        m = mnew;
        if (half == 0)
            Cw[r] = corr;
        __syncwarp();

        /* O = O corr + P V. */
#pragma unroll
        for (int j = 0; j < NF; j++)
#pragma unroll
            for (int i = 0; i < o[j].num_elements; i++)
                o[j].x[i] *= Cw[(int)rowf.x[i]];
#pragma unroll
        for (int kk = 0; kk < TC_ROWS / WM; kk++)
            if (kk < nk) {
                frag_a a;
                wmma::load_matrix_sync(a, Pw + WM * kk, TC_PS);
#pragma unroll
                for (int j = 0; j < NF; j++) {
                    frag_b bv;
                    wmma::load_matrix_sync(bv, Vs + WM * kk * QS + WM * j, QS);
                    wmma::mma_sync(o[j], a, bv, o[j]);
                }
            }
    }

    __syncthreads(); /* the K and V tiles become the output's staging */
    if (!active)
        return;
    float *Ow = (float *)Ks + warp * WM * (HP + 4);
#pragma unroll
    for (int j = 0; j < NF; j++)
        wmma::store_matrix_sync(Ow + WM * j, o[j], HP + 4, wmma::mem_row_major);
    if (half == 0) {
        Cw[r] = 1.0f / l;
        if (q < T_)
            lse[((size_t)b * NH + h) * T_ + q] = m + logf(l);
    }
    __syncwarp();
    tc_write<HP>(out + (size_t)b * T_ * C + h * hs, Ow, Cw, qw, T_, hs, (size_t)C);
}

/* dq: grid as the forward. */
template <int HP>
__global__ void __launch_bounds__(TC_THREADS, TC_MIN_BLOCKS)
    attention_tc_dq_kernel(bf16 *dqkv, const bf16 *dout, const bf16 *qkv, const float *lse,
                           const float *D, int T_, int C, int NH, float scale, int vec)
{
    constexpr int QS = HP + 8, NF = HP / WM;
    extern __shared__ float4 tc_smem4[];
    char *smem = tc_align(tc_smem4);
    bf16 *Qs = (bf16 *)smem, *Os = Qs + TC_ROWS * QS, *Ks = Os + TC_ROWS * QS;
    bf16 *Vs = Ks + TC_ROWS * QS;
    float *Sall = (float *)(Vs + TC_ROWS * QS), *DPall = Sall + TC_WARPS * WM * TC_SS;
    bf16 *dSall = (bf16 *)(DPall + TC_WARPS * WM * TC_SS);
    int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    float *Sw = Sall + warp * WM * TC_SS, *DPw = DPall + warp * WM * TC_SS;
    bf16 *dSw = dSall + warp * WM * TC_PS;
    int h = blockIdx.y, b = blockIdx.z, q0 = (gridDim.x - 1 - blockIdx.x) * TC_ROWS;
    int hs = C / NH, last = min(q0 + TC_ROWS, T_) - 1;
    size_t stride = 3 * (size_t)C;
    const bf16 *base = qkv + (size_t)b * T_ * stride + h * hs;
    int qw = q0 + WM * warp;
    bool active = qw < T_;
    int wlast = min(qw + WM - 1, T_ - 1);
    int r = lane / 2, half = lane % 2, q = qw + r, c0 = half * 32;
    size_t row = ((size_t)b * NH + h) * T_ + q;
    float lse_r = q < T_ ? lse[row] : 0.0f, D_r = q < T_ ? D[row] : 0.0f;

    frag_acc dq[NF], s[TC_ROWS / WM];
#pragma unroll
    for (int j = 0; j < NF; j++)
        wmma::fill_fragment(dq[j], 0.0f);
    tc_load<HP>(Qs, base, q0, T_, hs, stride, vec);
    tc_load<HP>(Os, dout + (size_t)b * T_ * C + h * hs, q0, T_, hs, (size_t)C, vec);

    for (int k0 = 0; k0 <= last; k0 += TC_ROWS) {
        __syncthreads();
        tc_load<HP>(Ks, base + C, k0, T_, hs, stride, vec);
        tc_load<HP>(Vs, base + 2 * C, k0, T_, hs, stride, vec);
        __syncthreads();
        if (!active)
            continue;
        int nk = min(TC_ROWS / WM, (wlast - k0) / WM + 1);

        /* S = Q K^T, then dP = dO V^T, each through shared memory. */
#pragma unroll
        for (int pass = 0; pass < 2; pass++) {
            const bf16 *A = pass ? Os : Qs, *Bm = pass ? Vs : Ks;
#pragma unroll
            for (int j = 0; j < TC_ROWS / WM; j++)
                wmma::fill_fragment(s[j], 0.0f);
#pragma unroll
            for (int kk = 0; kk < NF; kk++) {
                frag_a a;
                wmma::load_matrix_sync(a, A + WM * warp * QS + WM * kk, QS);
#pragma unroll
                for (int j = 0; j < TC_ROWS / WM; j++)
                    if (j < nk) {
                        frag_bt bt;
                        wmma::load_matrix_sync(bt, Bm + WM * j * QS + WM * kk, QS);
                        wmma::mma_sync(s[j], a, bt, s[j]);
                    }
            }
#pragma unroll
            for (int j = 0; j < TC_ROWS / WM; j++)
                if (j < nk)
                    wmma::store_matrix_sync((pass ? DPw : Sw) + WM * j, s[j], TC_SS,
                                            wmma::mem_row_major);
        }
        __syncwarp();

        /* dS = P (dP - D), P = exp(S scale - lse); 0 where masked and on padding rows. */
        int c1 = min(c0 + 32, WM * nk);
        for (int c = c0; c < c1; c++) {
            int key = k0 + c;
            float ds = 0.0f;
            if (key <= q && q < T_) {
                float p = __expf(Sw[r * TC_SS + c] * scale - lse_r);
                ds = p * (DPw[r * TC_SS + c] - D_r);
            }
            dSw[r * TC_PS + c] = __float2bfloat16_rn(ds);
        }
        __syncwarp();

        /* dQ += dS K. */
#pragma unroll
        for (int kk = 0; kk < TC_ROWS / WM; kk++)
            if (kk < nk) {
                frag_a a;
                wmma::load_matrix_sync(a, dSw + WM * kk, TC_PS);
#pragma unroll
                for (int j = 0; j < NF; j++) {
                    frag_b bk;
                    wmma::load_matrix_sync(bk, Ks + WM * kk * QS + WM * j, QS);
                    wmma::mma_sync(dq[j], a, bk, dq[j]);
                }
            }
    }

    __syncthreads(); /* the K and V tiles become the staging */
    if (!active)
        return;
    float *Ow = (float *)Ks + warp * WM * (HP + 4);
#pragma unroll
    for (int j = 0; j < NF; j++) {
#pragma unroll
        for (int i = 0; i < dq[j].num_elements; i++)
            dq[j].x[i] *= scale;
        wmma::store_matrix_sync(Ow + WM * j, dq[j], HP + 4, wmma::mem_row_major);
    }
    __syncwarp();
    tc_write<HP>(dqkv + (size_t)b * T_ * stride + h * hs, Ow, NULL, qw, T_, hs, stride);
}

/* dk, dv: grid (T / 64 rounded up, NH, B), blocks over key tiles. */
template <int HP>
__global__ void __launch_bounds__(TC_THREADS, TC_MIN_BLOCKS)
    attention_tc_dkv_kernel(bf16 *dqkv, const bf16 *dout, const bf16 *qkv, const float *lse,
                            const float *D, int T_, int C, int NH, float scale, int vec)
{
    constexpr int QS = HP + 8, NF = HP / WM;
    extern __shared__ float4 tc_smem4[];
    char *smem = tc_align(tc_smem4);
    bf16 *Ks = (bf16 *)smem, *Vs = Ks + TC_ROWS * QS, *Qs = Vs + TC_ROWS * QS;
    bf16 *Os = Qs + TC_ROWS * QS;
    float *Lt = (float *)(Os + TC_ROWS * QS), *Dt = Lt + TC_ROWS;
    float *Sall = Dt + TC_ROWS, *DPall = Sall + TC_WARPS * WM * TC_SS;
    bf16 *Pall = (bf16 *)(DPall + TC_WARPS * WM * TC_SS), *dSall = Pall + TC_WARPS * WM * TC_PS;
    int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    float *Sw = Sall + warp * WM * TC_SS, *DPw = DPall + warp * WM * TC_SS;
    bf16 *Pw = Pall + warp * WM * TC_PS, *dSw = dSall + warp * WM * TC_PS;
    int h = blockIdx.y, b = blockIdx.z, j0 = blockIdx.x * TC_ROWS;
    int hs = C / NH;
    size_t stride = 3 * (size_t)C;
    const bf16 *base = qkv + (size_t)b * T_ * stride + h * hs;
    const bf16 *dbase = dout + (size_t)b * T_ * C + h * hs;
    const float *lrow = lse + ((size_t)b * NH + h) * T_, *drow = D + ((size_t)b * NH + h) * T_;
    int jw = j0 + WM * warp; /* the warp's first key */
    bool active = jw < T_;
    int r = lane / 2, half = lane % 2, key = jw + r, c0 = half * 32;

    frag_acc dk[NF], dv[NF], s[TC_ROWS / WM];
#pragma unroll
    for (int j = 0; j < NF; j++) {
        wmma::fill_fragment(dk[j], 0.0f);
        wmma::fill_fragment(dv[j], 0.0f);
    }
    tc_load<HP>(Ks, base + C, j0, T_, hs, stride, vec);
    tc_load<HP>(Vs, base + 2 * C, j0, T_, hs, stride, vec);

    for (int q0 = j0; q0 < T_; q0 += TC_ROWS) {
        __syncthreads();
        tc_load<HP>(Qs, base, q0, T_, hs, stride, vec);
        tc_load<HP>(Os, dbase, q0, T_, hs, (size_t)C, vec);
        if (threadIdx.x < TC_ROWS) {
            int t = q0 + threadIdx.x;
            Lt[threadIdx.x] = t < T_ ? lrow[t] : 0.0f;
            Dt[threadIdx.x] = t < T_ ? drow[t] : 0.0f;
        }
        __syncthreads();
        if (!active)
            continue;
        /* Query sub-tiles [js, je): those past the warp's first key (the diagonal tile) and
         * before T. */
        int js = q0 == j0 ? warp : 0, je = min(TC_ROWS / WM, (T_ - q0 + WM - 1) / WM);

        /* S^T = K Q^T, then dP^T = V dO^T: Q's and dO's rows as the columns of B. */
#pragma unroll
        for (int pass = 0; pass < 2; pass++) {
            const bf16 *A = pass ? Vs : Ks, *Bm = pass ? Os : Qs;
#pragma unroll
            for (int j = 0; j < TC_ROWS / WM; j++)
                wmma::fill_fragment(s[j], 0.0f);
#pragma unroll
            for (int kk = 0; kk < NF; kk++) {
                frag_a a;
                wmma::load_matrix_sync(a, A + WM * warp * QS + WM * kk, QS);
#pragma unroll
                for (int j = 0; j < TC_ROWS / WM; j++)
                    if (j >= js && j < je) {
                        frag_bt bt;
                        wmma::load_matrix_sync(bt, Bm + WM * j * QS + WM * kk, QS);
                        wmma::mma_sync(s[j], a, bt, s[j]);
                    }
            }
#pragma unroll
            for (int j = 0; j < TC_ROWS / WM; j++)
                if (j >= js && j < je)
                    wmma::store_matrix_sync((pass ? DPw : Sw) + WM * j, s[j], TC_SS,
                                            wmma::mem_row_major);
        }
        __syncwarp();

        /* P^T and dS^T = P^T (dP^T - D) for key row r, query columns [ca, cb). */
        int ca = max(c0, WM * js), cb = min(c0 + 32, WM * je);
        for (int c = ca; c < cb; c++) {
            int t = q0 + c;
            float p = 0.0f, ds = 0.0f;
            if (t >= key && t < T_) {
                p = __expf(Sw[r * TC_SS + c] * scale - Lt[c]);
                ds = p * (DPw[r * TC_SS + c] - Dt[c]);
            }
            Pw[r * TC_PS + c] = __float2bfloat16_rn(p);
            dSw[r * TC_PS + c] = __float2bfloat16_rn(ds);
        }
        __syncwarp();

        /* dV += P^T dO, dK += dS^T Q. */
#pragma unroll
        for (int kk = 0; kk < TC_ROWS / WM; kk++)
            if (kk >= js && kk < je) {
                frag_a ap, ads;
                wmma::load_matrix_sync(ap, Pw + WM * kk, TC_PS);
                wmma::load_matrix_sync(ads, dSw + WM * kk, TC_PS);
#pragma unroll
                for (int j = 0; j < NF; j++) {
                    frag_b bo, bq;
                    wmma::load_matrix_sync(bo, Os + WM * kk * QS + WM * j, QS);
                    wmma::mma_sync(dv[j], ap, bo, dv[j]);
                    wmma::load_matrix_sync(bq, Qs + WM * kk * QS + WM * j, QS);
                    wmma::mma_sync(dk[j], ads, bq, dk[j]);
                }
            }
    }

    __syncthreads(); /* the Q and dO tiles become the staging */
    if (!active)
        return;
    float *Ow = (float *)Qs + warp * WM * (HP + 4);
    bf16 *dst = dqkv + (size_t)b * T_ * stride + h * hs;
#pragma unroll
    for (int j = 0; j < NF; j++) {
#pragma unroll
        for (int i = 0; i < dk[j].num_elements; i++)
            dk[j].x[i] *= scale;
        wmma::store_matrix_sync(Ow + WM * j, dk[j], HP + 4, wmma::mem_row_major);
    }
    __syncwarp();
    tc_write<HP>(dst + C, Ow, NULL, jw, T_, hs, stride);
    __syncwarp(); /* the staging is read before dv overwrites it */
#pragma unroll
    for (int j = 0; j < NF; j++)
        wmma::store_matrix_sync(Ow + WM * j, dv[j], HP + 4, wmma::mem_row_major);
    __syncwarp();
    tc_write<HP>(dst + 2 * C, Ow, NULL, jw, T_, hs, stride);
}

/* Lets kernel fn have smem bytes of dynamic shared memory. */
static int tc_allow_smem(struct gpu_ctx *ctx, const char *op, const void *fn, size_t smem)
{
    if (smem <= TC_SMEM_DEFAULT)
        return 0;
    return ctx_cuda(
        ctx, cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem), op,
        "cudaFuncSetAttribute");
}

static dim3 tc_grid(int B, int T, int NH)
{
    return dim3((unsigned)((T + TC_ROWS - 1) / TC_ROWS), (unsigned)NH, (unsigned)B);
}

/* 16-byte loads: whole 8-element groups per row, and aligned rows. */
static int tc_vec(int hs, const void *a, const void *b)
{
    return hs % 8 == 0 && (uintptr_t)a % 16 == 0 && (uintptr_t)b % 16 == 0;
}

template <int HP>
static int tc_forward(struct gpu_ctx *ctx, bf16 *out, float *lse, const bf16 *qkv, int B, int T_,
                      int C, int NH)
{
    const char *op = "attention_forward";
    int hs = C / NH;
    size_t smem = fwd_smem(HP);
    int ret = tc_allow_smem(ctx, op, (const void *)attention_tc_forward_kernel<HP>, smem);
    if (ret < 0)
        return ret;
    attention_tc_forward_kernel<HP><<<tc_grid(B, T_, NH), TC_THREADS, smem, ctx->stream>>>(
        out, lse, qkv, T_, C, NH, 1.0f / sqrtf((float)hs), tc_vec(hs, qkv, qkv));
    return ctx_launched(ctx, op);
}

template <int HP>
static int tc_backward(struct gpu_ctx *ctx, bf16 *dqkv, const bf16 *dout, const bf16 *qkv,
                       const float *lse, const float *D, int B, int T_, int C, int NH)
{
    const char *op = "attention_backward";
    int hs = C / NH, vec = tc_vec(hs, qkv, dout);
    float scale = 1.0f / sqrtf((float)hs);
    int ret;
    if ((ret = tc_allow_smem(ctx, op, (const void *)attention_tc_dq_kernel<HP>, dq_smem(HP))) < 0 ||
        (ret = tc_allow_smem(ctx, op, (const void *)attention_tc_dkv_kernel<HP>, dkv_smem(HP))) < 0)
        return ret;
    attention_tc_dq_kernel<HP><<<tc_grid(B, T_, NH), TC_THREADS, dq_smem(HP), ctx->stream>>>(
        dqkv, dout, qkv, lse, D, T_, C, NH, scale, vec);
    attention_tc_dkv_kernel<HP><<<tc_grid(B, T_, NH), TC_THREADS, dkv_smem(HP), ctx->stream>>>(
        dqkv, dout, qkv, lse, D, T_, C, NH, scale, vec);
    return ctx_launched(ctx, op);
}

/* attention.cu's bf16 path, after its shape checks (hs <= 128). */
int attention_tc_forward(struct gpu_ctx *ctx, void *out, float *lse, const void *qkv, int B, int T,
                         int C, int NH)
{
    int hs = C / NH;
    if (hs <= 32)
        return tc_forward<32>(ctx, (bf16 *)out, lse, (const bf16 *)qkv, B, T, C, NH);
    if (hs <= 64)
        return tc_forward<64>(ctx, (bf16 *)out, lse, (const bf16 *)qkv, B, T, C, NH);
    return tc_forward<128>(ctx, (bf16 *)out, lse, (const bf16 *)qkv, B, T, C, NH);
}

/* The same, for the backward with D = rowsum(dout * out) computed (B, NH, T). */
int attention_tc_backward(struct gpu_ctx *ctx, void *dqkv, const void *dout, const void *qkv,
                          const float *lse, const float *D, int B, int T, int C, int NH)
{
    int hs = C / NH;
    if (hs <= 32)
        return tc_backward<32>(ctx, (bf16 *)dqkv, (const bf16 *)dout, (const bf16 *)qkv, lse, D, B,
                               T, C, NH);
    if (hs <= 64)
        return tc_backward<64>(ctx, (bf16 *)dqkv, (const bf16 *)dout, (const bf16 *)qkv, lse, D, B,
                               T, C, NH);
    return tc_backward<128>(ctx, (bf16 *)dqkv, (const bf16 *)dout, (const bf16 *)qkv, lse, D, B, T,
                            C, NH);
}
