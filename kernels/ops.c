/* The GPT-2 ops of the CPU backend (the maths and layouts are in ops.h). The matmuls, which
 * take nearly all of a step's time, and the attention's products run on gemm.h's blocked GEMM
 * (AVX-512, AVX2+FMA or plain C micro-kernels, picked once per process); the element-wise ops
 * are compiled for those ISA levels too (target_clones). */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gemm.h"
#include "ops.h"
#include "banned.h"

/* Element-wise loops: one copy per x86-64 ISA level, chosen by the loader (ifunc). GCC only:
 * clang 14 has target_clones but not the arch= form. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define OPS_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define OPS_CLONES
#endif

/* ---- exp and tanh ------------------------------------------------------------------------- */

/* exp(x) = 2^n * exp(r), n = round(x / ln 2), r = x - n ln 2 in [-ln2/2, ln2/2] (ln 2 split in
 * a high part exact in float and a low part: Cody and Waite), exp(r) = 1 + r + r^2 P(r) with
 * Cephes' degree-5 minimax P (relative error under 1.2e-7 on that interval). The clamp keeps
 * 2^n a normal float (n in [-126, 127]). Branch-free, so that loops over it vectorise. */
#define EXP_LO           -87.0f
#define EXP_HI           88.0f
#define LOG2E            1.44269504088896341f
#define LN2_HI           0.693359375f
#define LN2_LO           -2.12194440e-4f
/* 1.5 * 2^23: adding it rounds a float of magnitude < 2^22 to an integer (round to nearest
 * even, the default mode) without a call to rintf, and leaves that integer in the low bits of
 * the sum: bits(sum) = ROUND_MAGIC_BITS + n. */
#define ROUND_MAGIC      12582912.0f
#define ROUND_MAGIC_BITS 0x4b400000u

static inline float exp_inline(float x)
{
    x = x < EXP_LO ? EXP_LO : x;
    x = x > EXP_HI ? EXP_HI : x;
    float m = x * LOG2E + ROUND_MAGIC;
    float n = m - ROUND_MAGIC;
    uint32_t mbits;
    memcpy(&mbits, &m, sizeof(mbits));
    float r = x - n * LN2_HI;
    r = r - n * LN2_LO;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    /* 2^n from n's bits, in unsigned arithmetic: no conversion or shift that a NaN input
     * (a diverged run) could make undefined. */
    uint32_t bits = (mbits - ROUND_MAGIC_BITS + 127u) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof(scale));
    return p * scale;
}

float ops_expf(float x)
{
    return exp_inline(x);
}

/* tanh(u) = 1 - 2 / (exp(2u) + 1): exact at the saturated ends (exp clamps to 1.6e-38 or
 * 1.6e38), absolute error about 1e-7 near 0, where the relative error grows; GELU only needs
 * the absolute one, since it uses 1 + tanh. */
static inline float tanh_inline(float u)
{
    return 1.0f - 2.0f / (exp_inline(2.0f * u) + 1.0f);
}

/* ---- matmul ------------------------------------------------------------------------------- */

const char *ops_matmul_kernel(void)
{
    return gemm_kernel_name();
}

int ops_matmul_use_kernel(const char *name)
{
    return gemm_use_kernel(name);
}

int ops_matmul_forward(float *out, const float *inp, const float *weight, const float *bias, int N,
                       int C, int OC)
{
    struct gemm g = {
        .M = N,
        .N = OC,
        .K = C,
        .a = inp,
        .a_rs = C,
        .a_cs = 1,
        .b = weight,
        .b_rs = 1,
        .b_cs = C,
        .c = out,
        .ldc = OC,
        .bias = bias,
    };

    return gemm_parallel(&g);
}

/* Columns of dbias per thread chunk: a multiple of the vector widths. */
#define BIAS_CHUNK 64

OPS_CLONES static void colsum_span(float *dbias, const float *dout, int N, int OC, int o0, int o1)
{
    for (int n = 0; n < N; n++) {
        const float *row = dout + (size_t)n * OC;
#pragma omp simd
        for (int o = o0; o < o1; o++)
            dbias[o] += row[o];
    }
}

int ops_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                        const float *inp, const float *weight, int N, int C, int OC)
{
    struct gemm gi = {
        .M = N,
        .N = C,
        .K = OC,
        .a = dout,
        .a_rs = OC,
        .a_cs = 1,
        .b = weight,
        .b_rs = C,
        .b_cs = 1,
        .c = dinp,
        .ldc = C,
        .accumulate = false,
    };
    struct gemm gw = {
        .M = OC,
        .N = C,
        .K = N,
        .a = dout,
        .a_rs = 1,
        .a_cs = OC,
        .b = inp,
        .b_rs = C,
        .b_cs = 1,
        .c = dweight,
        .ldc = C,
        .accumulate = true,
    };
    int err;

    if (dinp && (err = gemm_parallel(&gi)) < 0)
        return err;
    if ((err = gemm_parallel(&gw)) < 0)
        return err;
    if (dbias) {
        int chunks = (OC + BIAS_CHUNK - 1) / BIAS_CHUNK;
#pragma omp parallel for schedule(static)
        for (int q = 0; q < chunks; q++) {
            int o1 = (q + 1) * BIAS_CHUNK < OC ? (q + 1) * BIAS_CHUNK : OC;
            colsum_span(dbias, dout, N, OC, q * BIAS_CHUNK, o1);
        }
    }
    return 0;
}

/* ---- encoder ------------------------------------------------------------------------------ */

void ops_encoder_forward(float *out, const int *inp, const float *wte, const float *wpe, int B,
                         int T, int C)
{
#pragma omp parallel for schedule(static)
    for (int bt = 0; bt < B * T; bt++) {
        float *o = out + (size_t)bt * C;
        const float *te = wte + (size_t)inp[bt] * C, *pe = wpe + (size_t)(bt % T) * C;
        for (int c = 0; c < C; c++)
            o[c] = te[c] + pe[c];
    }
}

/* Channels per thread chunk in the encoder's and LayerNorm's parameter gradients. */
#define CHANNEL_CHUNK 64

void ops_encoder_backward(float *dwte, float *dwpe, const float *dout, const int *inp, int B, int T,
                          int C)
{
    int chunks = (C + CHANNEL_CHUNK - 1) / CHANNEL_CHUNK;

    /* Threads split the channels, each walking the positions in order: a token seen twice
     * gets its two contributions in the same order whatever the team. */
#pragma omp parallel for schedule(static)
    for (int q = 0; q < chunks; q++) {
        int c0 = q * CHANNEL_CHUNK, c1 = c0 + CHANNEL_CHUNK < C ? c0 + CHANNEL_CHUNK : C;
        for (int bt = 0; bt < B * T; bt++) {
            const float *d = dout + (size_t)bt * C;
            float *te = dwte + (size_t)inp[bt] * C, *pe = dwpe + (size_t)(bt % T) * C;
            for (int c = c0; c < c1; c++) {
                te[c] += d[c];
                pe[c] += d[c];
            }
        }
    }
}

/* ---- layernorm ---------------------------------------------------------------------------- */

OPS_CLONES static void layernorm_row(float *out, float *mean, float *rstd, const float *x,
                                     const float *weight, const float *bias, int C)
{
    float sum = 0.0f, var = 0.0f;

#pragma omp simd reduction(+ : sum)
    for (int c = 0; c < C; c++)
        sum += x[c];
    float m = sum / (float)C;
#pragma omp simd reduction(+ : var)
    for (int c = 0; c < C; c++)
        var += (x[c] - m) * (x[c] - m);
    float s = 1.0f / sqrtf(var / (float)C + OPS_LN_EPS);
#pragma omp simd
    for (int c = 0; c < C; c++)
        out[c] = (x[c] - m) * s * weight[c] + bias[c];
    *mean = m;
    *rstd = s;
}

void ops_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                           const float *weight, const float *bias, int N, int C)
{
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++)
        layernorm_row(out + (size_t)n * C, mean + n, rstd + n, inp + (size_t)n * C, weight, bias,
                      C);
}

OPS_CLONES static void layernorm_dinp_row(float *dinp, const float *dout, const float *x,
                                          const float *weight, float m, float s, int C)
{
    float gsum = 0.0f, gnsum = 0.0f;

#pragma omp simd reduction(+ : gsum, gnsum)
    for (int c = 0; c < C; c++) {
        float g = weight[c] * dout[c];
        gsum += g;
        gnsum += g * (x[c] - m) * s;
    }
    float gmean = gsum / (float)C, gnmean = gnsum / (float)C;
#pragma omp simd
    for (int c = 0; c < C; c++) {
        float g = weight[c] * dout[c];
        dinp[c] += s * (g - gmean - (x[c] - m) * s * gnmean);
    }
}

OPS_CLONES static void layernorm_dparam_span(float *dweight, float *dbias, const float *dout,
                                             const float *inp, const float *mean, const float *rstd,
                                             int N, int C, int c0, int c1)
{
    for (int n = 0; n < N; n++) {
        const float *d = dout + (size_t)n * C, *x = inp + (size_t)n * C;
        float m = mean[n], s = rstd[n];
#pragma omp simd
        for (int c = c0; c < c1; c++) {
            dweight[c] += d[c] * ((x[c] - m) * s);
            dbias[c] += d[c];
        }
    }
}

void ops_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                            const float *inp, const float *weight, const float *mean,
                            const float *rstd, int N, int C)
{
    int chunks = (C + CHANNEL_CHUNK - 1) / CHANNEL_CHUNK;

    /* Two passes, so that no sum is split across threads: rows for dinp, then channel chunks
     * (each walking the rows in order) for dweight and dbias. */
#pragma omp parallel
    {
#pragma omp for schedule(static)
        for (int n = 0; n < N; n++)
            layernorm_dinp_row(dinp + (size_t)n * C, dout + (size_t)n * C, inp + (size_t)n * C,
                               weight, mean[n], rstd[n], C);
#pragma omp for schedule(static)
        for (int q = 0; q < chunks; q++) {
            int c0 = q * CHANNEL_CHUNK, c1 = c0 + CHANNEL_CHUNK < C ? c0 + CHANNEL_CHUNK : C;
            layernorm_dparam_span(dweight, dbias, dout, inp, mean, rstd, N, C, c0, c1);
        }
    }
}

/* ---- attention ----------------------------------------------------------------------------
 * Per (batch, head), on one thread: the head's operands are packed once (K^T and V, and in the
 * backward V^T, K, Q and dY), then query rows go by blocks of ATT_ROWS: the score products
 * skip the micro-tiles above the diagonal, and the products over keys stop at the block's
 * last row. */

/* Query rows per block: a multiple of every kernel's MR and NR, so that block edges are tile
 * edges. */
#define ATT_ROWS 96

/* One thread's packing space: up to four packed head operands and an A block. */
struct att_ws {
    float *b[4];
    size_t b_stride_t, b_stride_hs; /* panel strides: operands T deep, hs deep */
    float *apack;
};

static size_t round_up(size_t n, size_t m)
{
    return (n + m - 1) / m * m;
}

static int att_ws_init(struct att_ws *ws, int bufs, int T, int hs)
{
    size_t mr = (size_t)gemm_mr(), nr = (size_t)gemm_nr();
    size_t t_pad = round_up((size_t)T, nr), hs_pad = round_up((size_t)hs, nr);
    size_t size = t_pad * hs > hs_pad * T ? t_pad * hs : hs_pad * T;
    size_t rows = round_up(ATT_ROWS, mr);
    int ret = 0;

    memset(ws, 0, sizeof(*ws));
    ws->b_stride_t = (size_t)T * nr;
    ws->b_stride_hs = (size_t)hs * nr;
    for (int i = 0; i < bufs; i++) {
        if (!(ws->b[i] = gemm_alloc(size)))
            ret = -ENOMEM;
    }
    /* A blocks: up to ATT_ROWS rows, up to T (or hs) deep. */
    if (!(ws->apack = gemm_alloc(rows * (size_t)(T > hs ? T : hs))))
        ret = -ENOMEM;
    return ret;
}

static void att_ws_release(struct att_ws *ws)
{
    for (int i = 0; i < 4; i++)
        free(ws->b[i]);
    free(ws->apack);
}

/* The attention's row loops go by blocks of ROW_W columns with a fixed-length inner loop
 * (one vector on AVX-512), the columns past the row's end masked inside it, and their partial
 * sums in ROW_W accumulators added in a fixed order: no scalar remainder loop, and the same
 * order of additions in every ISA copy. Blocks that would run past the buffer's row (T not a
 * multiple of ROW_W) go one column at a time. */
#define ROW_W 16

static float sum_lanes(const float acc[ROW_W])
{
    float s = 0.0f;
    for (int k = 0; k < ROW_W; k++)
        s += acc[k];
    return s;
}

/* Row t of one head's scores s (length T, valid up to t) becomes its softmax in place, scaled
 * by `scale` inside the exp, with zeros after t. */
static inline __attribute__((always_inline)) void attention_softmax_row(float *s, int t, int T,
                                                                        float scale)
{
    int n = t + 1, vec = (n + ROW_W - 1) / ROW_W * ROW_W;
    float mx[ROW_W], acc[ROW_W] = {0}, max, sum, tail = 0.0f;

    vec = vec <= T / ROW_W * ROW_W ? vec : n / ROW_W * ROW_W;
    for (int k = 0; k < ROW_W; k++)
        mx[k] = -INFINITY;
    for (int j0 = 0; j0 < vec; j0 += ROW_W) {
#pragma omp simd
        for (int k = 0; k < ROW_W; k++) {
            float v = j0 + k < n ? s[j0 + k] : -INFINITY;
            mx[k] = v > mx[k] ? v : mx[k];
        }
    }
    max = mx[0];
    for (int k = 1; k < ROW_W; k++)
        max = mx[k] > max ? mx[k] : max;
    for (int j = vec; j < n; j++)
        max = s[j] > max ? s[j] : max;

    for (int j0 = 0; j0 < vec; j0 += ROW_W) {
#pragma omp simd
        for (int k = 0; k < ROW_W; k++) {
            bool in = j0 + k < n;
            float e = exp_inline(in ? (s[j0 + k] - max) * scale : EXP_LO);
            e = in ? e : 0.0f;
            s[j0 + k] = e;
            acc[k] += e;
        }
    }
    for (int j = vec; j < n; j++) {
        s[j] = exp_inline((s[j] - max) * scale);
        tail += s[j];
    }
    sum = sum_lanes(acc) + tail;

    float inv = 1.0f / sum;
    for (int j0 = 0; j0 < vec; j0 += ROW_W) {
#pragma omp simd
        for (int k = 0; k < ROW_W; k++)
            s[j0 + k] *= inv;
    }
    for (int j = vec; j < n; j++)
        s[j] *= inv;
    int z = vec > n ? vec : n;
    if (z < T)
        memset(s + z, 0, (size_t)(T - z) * sizeof(float));
}

/* Row t of dP becomes dS = scale * P * (dP - sum_j P dP) in place, zero from t+1 to `end`
 * (<= T, the row's length; P is zero past t, dP undefined there). */
static inline __attribute__((always_inline)) void
attention_dsoftmax_row(float *dp, const float *p, int t, int end, int T, float scale)
{
    int n = t + 1, vec = (n + ROW_W - 1) / ROW_W * ROW_W;
    float acc[ROW_W] = {0}, dot, tail = 0.0f;

    vec = vec <= T / ROW_W * ROW_W ? vec : n / ROW_W * ROW_W;
    for (int j0 = 0; j0 < vec; j0 += ROW_W) {
#pragma omp simd
        for (int k = 0; k < ROW_W; k++)
            acc[k] += j0 + k < n ? p[j0 + k] * dp[j0 + k] : 0.0f;
    }
    for (int j = vec; j < n; j++)
        tail += p[j] * dp[j];
    dot = sum_lanes(acc) + tail;

    for (int j0 = 0; j0 < vec; j0 += ROW_W) {
#pragma omp simd
        for (int k = 0; k < ROW_W; k++) {
            float d = scale * p[j0 + k] * (dp[j0 + k] - dot);
            dp[j0 + k] = j0 + k < n ? d : 0.0f;
        }
    }
    for (int j = vec; j < n; j++)
        dp[j] = scale * p[j] * (dp[j] - dot);
    int z = vec > n ? vec : n;
    if (z < end)
        memset(dp + z, 0, (size_t)(end - z) * sizeof(float));
}

/* Rows [t0, t1) of a head's T x T scores at s: one call per block, the rows in one ISA copy. */
OPS_CLONES static void attention_softmax_rows(float *s, int t0, int t1, int T, float scale)
{
    for (int t = t0; t < t1; t++)
        attention_softmax_row(s + (size_t)t * T, t, T, scale);
}

OPS_CLONES static void attention_dsoftmax_rows(float *dp, const float *p, int t0, int t1, int T,
                                               float scale)
{
    for (int t = t0; t < t1; t++)
        attention_dsoftmax_row(dp + (size_t)t * T, p + (size_t)t * T, t, t1, T, scale);
}

int ops_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int NH)
{
    int hs = C / NH, C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
    int err = 0;

#pragma omp parallel
    {
        struct att_ws ws;
        int failed = att_ws_init(&ws, 2, T, hs) < 0;

        if (failed) {
#pragma omp atomic write
            err = 1;
        }
#pragma omp for schedule(static)
        for (int bh = 0; bh < B * NH; bh++) {
            int b = bh / NH, h = bh % NH;
            const float *q = qkv + (size_t)b * T * C3 + h * hs;
            float *a = att + (size_t)bh * T * T;

            if (failed)
                continue;
            /* ws.b[0] = K^T (T columns, hs deep), ws.b[1] = V (hs columns, T deep). */
            gemm_pack_b(ws.b[0], q + C, 1, C3, T, hs, hs);
            gemm_pack_b(ws.b[1], q + 2 * C, C3, 1, hs, T, T);
            for (int i0 = 0; i0 < T; i0 += ATT_ROWS) {
                int i1 = i0 + ATT_ROWS < T ? i0 + ATT_ROWS : T;
                struct gemm s = {
                    .M = i1 - i0,
                    .N = i1,
                    .K = hs,
                    .a = q + (size_t)i0 * C3,
                    .a_rs = C3,
                    .a_cs = 1,
                    .c = a + (size_t)i0 * T,
                    .ldc = T,
                    .causal = true,
                    .diag = i0,
                };
                struct gemm y = {
                    .M = i1 - i0,
                    .N = hs,
                    .K = i1,
                    .a = a + (size_t)i0 * T,
                    .a_rs = T,
                    .a_cs = 1,
                    .c = out + ((size_t)b * T + i0) * C + h * hs,
                    .ldc = C,
                };

                gemm_serial(&s, ws.b[0], ws.b_stride_hs, ws.apack);
                attention_softmax_rows(a, i0, i1, T, scale);
                gemm_serial(&y, ws.b[1], ws.b_stride_t, ws.apack);
            }
        }
        att_ws_release(&ws);
    }
    return err ? -ENOMEM : 0;
}

int ops_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *att,
                           int B, int T, int C, int NH)
{
    size_t nr = (size_t)gemm_nr();
    int hs = C / NH, C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
    int err = 0;

#pragma omp parallel
    {
        struct att_ws ws;
        float *ds = malloc((size_t)T * T * sizeof(float));
        int failed = att_ws_init(&ws, 4, T, hs) < 0 || !ds;

        if (failed) {
#pragma omp atomic write
            err = 1;
        }
#pragma omp for schedule(static)
        for (int bh = 0; bh < B * NH; bh++) {
            int b = bh / NH, h = bh % NH;
            const float *q = qkv + (size_t)b * T * C3 + h * hs;
            const float *a = att + (size_t)bh * T * T;
            const float *dy = dout + (size_t)b * T * C + h * hs;
            float *dq = dqkv + (size_t)b * T * C3 + h * hs;

            if (failed)
                continue;
            /* V^T (T columns, hs deep); K, Q and dY (hs columns, T deep). */
            gemm_pack_b(ws.b[0], q + 2 * C, 1, C3, T, hs, hs);
            gemm_pack_b(ws.b[1], q + C, C3, 1, hs, T, T);
            gemm_pack_b(ws.b[2], q, C3, 1, hs, T, T);
            gemm_pack_b(ws.b[3], dy, C, 1, hs, T, T);
            /* Row blocks: dP = dY V^T, then dS in place, then dQ = dS K. */
            for (int i0 = 0; i0 < T; i0 += ATT_ROWS) {
                int i1 = i0 + ATT_ROWS < T ? i0 + ATT_ROWS : T;
                struct gemm dp = {
                    .M = i1 - i0,
                    .N = i1,
                    .K = hs,
                    .a = dy + (size_t)i0 * C,
                    .a_rs = C,
                    .a_cs = 1,
                    .c = ds + (size_t)i0 * T,
                    .ldc = T,
                    .causal = true,
                    .diag = i0,
                };
                struct gemm dqg = {
                    .M = i1 - i0,
                    .N = hs,
                    .K = i1,
                    .a = ds + (size_t)i0 * T,
                    .a_rs = T,
                    .a_cs = 1,
                    .c = dq + (size_t)i0 * C3,
                    .ldc = C3,
                };

                gemm_serial(&dp, ws.b[0], ws.b_stride_hs, ws.apack);
                attention_dsoftmax_rows(ds, a, i0, i1, T, scale);
                gemm_serial(&dqg, ws.b[1], ws.b_stride_t, ws.apack);
            }
            /* Key blocks [j0, j1): dK = dS^T Q and dV = P^T dY over the queries t >= j0 (the
             * entries above the diagonal inside the block are zero in both dS and P). */
            for (int j0 = 0; j0 < T; j0 += ATT_ROWS) {
                int j1 = j0 + ATT_ROWS < T ? j0 + ATT_ROWS : T;
                struct gemm dk = {
                    .M = j1 - j0,
                    .N = hs,
                    .K = T - j0,
                    .a = ds + (size_t)j0 * T + j0,
                    .a_rs = 1,
                    .a_cs = T,
                    .c = dq + (size_t)j0 * C3 + C,
                    .ldc = C3,
                };
                struct gemm dv = {
                    .M = j1 - j0,
                    .N = hs,
                    .K = T - j0,
                    .a = a + (size_t)j0 * T + j0,
                    .a_rs = 1,
                    .a_cs = T,
                    .c = dq + (size_t)j0 * C3 + 2 * C,
                    .ldc = C3,
                };

                gemm_serial(&dk, ws.b[2] + (size_t)j0 * nr, ws.b_stride_t, ws.apack);
                gemm_serial(&dv, ws.b[3] + (size_t)j0 * nr, ws.b_stride_t, ws.apack);
            }
        }
        att_ws_release(&ws);
        free(ds);
    }
    return err ? -ENOMEM : 0;
}

/* ---- GELU --------------------------------------------------------------------------------- */

#define GELU_SCALE 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_CUBE  0.044715f
/* Elements per thread chunk of the element-wise ops. */
#define ELEM_CHUNK 4096

OPS_CLONES static void gelu_forward_span(float *out, const float *inp, size_t n)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float u = GELU_SCALE * (x + GELU_CUBE * x * x * x);
        out[i] = 0.5f * x * (1.0f + tanh_inline(u));
    }
}

OPS_CLONES static void gelu_backward_span(float *dinp, const float *inp, const float *dout,
                                          size_t n)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float u = GELU_SCALE * (x + GELU_CUBE * x * x * x);
        float th = tanh_inline(u);
        float du = GELU_SCALE * (1.0f + 3.0f * GELU_CUBE * x * x);
        dinp[i] = dout[i] * (0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du);
    }
}

OPS_CLONES static void gelu_forward_grad_span(float *out, float *grad, const float *inp, size_t n)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float u = GELU_SCALE * (x + GELU_CUBE * x * x * x);
        float th = tanh_inline(u);
        float du = GELU_SCALE * (1.0f + 3.0f * GELU_CUBE * x * x);
        out[i] = 0.5f * x * (1.0f + th);
        grad[i] = 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du;
    }
}

OPS_CLONES static void mul_span(float *out, const float *a, const float *b, size_t n)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++)
        out[i] = b[i] * a[i];
}

void ops_gelu_forward(float *out, const float *inp, size_t n)
{
    long chunks = (long)((n + ELEM_CHUNK - 1) / ELEM_CHUNK);

#pragma omp parallel for schedule(static)
    for (long q = 0; q < chunks; q++) {
        size_t i0 = (size_t)q * ELEM_CHUNK, len = n - i0 < ELEM_CHUNK ? n - i0 : ELEM_CHUNK;
        gelu_forward_span(out + i0, inp + i0, len);
    }
}

void ops_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n)
{
    long chunks = (long)((n + ELEM_CHUNK - 1) / ELEM_CHUNK);

#pragma omp parallel for schedule(static)
    for (long q = 0; q < chunks; q++) {
        size_t i0 = (size_t)q * ELEM_CHUNK, len = n - i0 < ELEM_CHUNK ? n - i0 : ELEM_CHUNK;
        gelu_backward_span(dinp + i0, inp + i0, dout + i0, len);
    }
}

void ops_gelu_forward_grad(float *out, float *grad, const float *inp, size_t n)
{
    long chunks = (long)((n + ELEM_CHUNK - 1) / ELEM_CHUNK);

#pragma omp parallel for schedule(static)
    for (long q = 0; q < chunks; q++) {
        size_t i0 = (size_t)q * ELEM_CHUNK, len = n - i0 < ELEM_CHUNK ? n - i0 : ELEM_CHUNK;
        gelu_forward_grad_span(out + i0, grad + i0, inp + i0, len);
    }
}

void ops_gelu_backward_grad(float *dinp, const float *grad, const float *dout, size_t n)
{
    long chunks = (long)((n + ELEM_CHUNK - 1) / ELEM_CHUNK);

#pragma omp parallel for schedule(static)
    for (long q = 0; q < chunks; q++) {
        size_t i0 = (size_t)q * ELEM_CHUNK, len = n - i0 < ELEM_CHUNK ? n - i0 : ELEM_CHUNK;
        mul_span(dinp + i0, grad + i0, dout + i0, len);
    }
}

/* ---- residual ----------------------------------------------------------------------------- */

void ops_residual_forward(float *out, const float *a, const float *b, size_t n)
{
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++)
        out[i] = a[i] + b[i];
}

void ops_residual_backward(float *da, float *db, const float *dout, size_t n)
{
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
        da[i] += dout[i];
        db[i] += dout[i];
    }
}

/* ---- softmax + cross-entropy -------------------------------------------------------------- */

OPS_CLONES static float logsumexp_row(const float *x, int V)
{
    float max = x[0], sum = 0.0f;

#pragma omp simd reduction(max : max)
    for (int j = 1; j < V; j++)
        max = x[j] > max ? x[j] : max;
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j < V; j++)
        sum += exp_inline(x[j] - max);
    return max + logf(sum);
}

void ops_crossentropy_forward(float *losses, float *lse, const float *logits, const int *targets,
                              int N, int V, int Vp)
{
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *x = logits + (size_t)n * Vp;
        lse[n] = logsumexp_row(x, V);
        losses[n] = lse[n] - x[targets[n]];
    }
}

OPS_CLONES static void crossentropy_backward_row(float *d, const float *x, float lse, int target,
                                                 int V, int Vp, float dloss)
{
#pragma omp simd
    for (int j = 0; j < V; j++)
        d[j] = dloss * exp_inline(x[j] - lse);
    d[target] -= dloss;
    for (int j = V; j < Vp; j++)
        d[j] = 0.0f;
}

void ops_crossentropy_backward(float *dlogits, const float *logits, const float *lse,
                               const int *targets, int N, int V, int Vp, float dloss)
{
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++)
        crossentropy_backward_row(dlogits + (size_t)n * Vp, logits + (size_t)n * Vp, lse[n],
                                  targets[n], V, Vp, dloss);
}
