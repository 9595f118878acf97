/* The GPT-2 ops of the CPU backend (the maths and layouts are in ops.h). The matmuls, which
 * take nearly all of a step's time, and the attention's products run on one blocked GEMM with
 * packed operands and a register-tiled micro-kernel (AVX-512, AVX2+FMA or plain C, picked once
 * per process); the element-wise ops are compiled for those ISA levels too (target_clones). */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define OPS_X86 1
#endif

#include "ops.h"
#include "banned.h"

/* Element-wise loops: one copy per x86-64 ISA level, chosen by the loader (ifunc). GCC only:
 * clang 14 has target_clones but not the arch= form. */
#if defined(OPS_X86) && !defined(__clang__)
#define OPS_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define OPS_CLONES
#endif

/* ---- threads -------------------------------------------------------------------------------- */

static int team_size(void)
{
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

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

/* ---- GEMM ------------------------------------------------------------------------------------
 * C[M,N] = A[M,K] B[K,N] (or C += A B), with A(i,p) = a[i*a_rs + p*a_cs] and
 * B(p,j) = b[p*b_rs + j*b_cs], so one routine serves out = inp W^T (B is W read across its
 * rows), dinp = dout W, dW = dout^T inp and the attention's products without transposing copies.
 *
 * B is packed into panels of NR columns (p-major: NR contiguous floats per p), all of K at
 * once, and A into panels of MR rows (MR contiguous floats per p), zero-padded at the edges
 * (the AVX-512 kernel reads A where it lies instead when its rows or its columns are
 * contiguous, packing only a last partial row tile). K is cut into blocks of at most KC_MAX;
 * the micro-kernel accumulates an MR x NR tile of C in registers over one block, starting
 * from zero or the bias, then stores it (first block, when not accumulating) or adds it to C.
 * An element of C thus sums its products in p order within a block and adds the blocks in
 * order: the result depends on K (and the kernel) only, never on M, N, the packing or how the
 * work is split between threads. */
#define KC_MAX     256 /* a packed B panel (KC_MAX x NR floats, 32 KiB for NR 32) stays in L1 */
#define MR_MAX     12
#define NR_MAX     32
#define PACK_ALIGN 64 /* cache line: the micro-kernels use aligned vector loads */

typedef void (*gemm_kernel_fn)(int kc, const float *a, const float *b, float *c, ptrdiff_t ldc,
                               bool accumulate, const float *init);
typedef void (*gemm_direct_fn)(int kc, const float *a, ptrdiff_t a_ps, ptrdiff_t a_is,
                               const float *b, float *c, ptrdiff_t ldc, bool accumulate,
                               const float *init);
typedef void (*gemm_pack_fn)(float *dst, const float *x, ptrdiff_t ls, ptrdiff_t ps, int w,
                             int valid, int kc);

/* A micro-kernel: fn computes the MR x NR tile from kc packed A and B floats per p into c
 * (row stride ldc), adding to c when accumulate, else starting from init (NR floats, the
 * bias) or zero. */
struct gemm_kernel {
    const char *name;
    int mr, nr;
    gemm_kernel_fn fn;
    gemm_pack_fn pack; /* packs one panel of A or B (pack_panel's contract) */
    /* fn with A read unpacked, A(i, p) at a[i*a_is + p*a_ps] with a_ps or a_is 1; or NULL */
    gemm_direct_fn direct;
};

struct gemm {
    int M, N, K;
    const float *a;
    ptrdiff_t a_rs, a_cs;
    const float *b;
    ptrdiff_t b_rs, b_cs;
    float *c;
    ptrdiff_t ldc;
    bool accumulate;   /* C += A B, else C = A B (+ bias) */
    const float *bias; /* without accumulate: C(i, j) = bias[j] + sum_p A(i,p) B(p,j), the sum
                        * starting from the bias (as llm.c's matmul) */
    /* Causal: only C(i, j) with j <= i + diag is wanted; micro-tiles wholly above that
     * diagonal are skipped (left as they were). */
    bool causal;
    int diag;
};

/* Packs one panel: w lines (A's rows or B's columns), `valid` of them real and the rest
 * zero, kc deep, element (line l, depth p) at x[l*ls + p*ps], into dst[p*w + l]. w is a
 * constant in each caller below, so that the loops unroll. */
static inline __attribute__((always_inline)) void pack_panel_w(float *restrict dst,
                                                               const float *restrict x,
                                                               ptrdiff_t ls, ptrdiff_t ps, int w,
                                                               int valid, int kc)
{
    if (valid < w)
        memset(dst, 0, (size_t)kc * w * sizeof(float));
    if (ls == 1) {
        /* Lines adjacent (B = W in dinp, a transposed A): w contiguous floats per p. */
        if (valid == w) {
            /* A constant size: the copy is inlined as vector moves. */
            for (int p = 0; p < kc; p++)
                memcpy(dst + (size_t)p * w, x + (ptrdiff_t)p * ps, (size_t)w * sizeof(float));
        } else {
            for (int p = 0; p < kc; p++) {
                const float *s = x + (ptrdiff_t)p * ps;
                for (int l = 0; l < valid; l++)
                    dst[(size_t)p * w + l] = s[l];
            }
        }
        return;
    }
    /* Lines apart (A = inp, B = W^T in the forward): a transposition, in slabs of 16 deep so
     * that each line is read in whole cache lines and the writes stay in L1. */
    for (int p0 = 0; p0 < kc; p0 += 16) {
        int n = kc - p0 < 16 ? kc - p0 : 16;
        for (int l = 0; l < valid; l++) {
            const float *s = x + (ptrdiff_t)l * ls + (ptrdiff_t)p0 * ps;
            for (int k = 0; k < n; k++)
                dst[(size_t)(p0 + k) * w + l] = s[(ptrdiff_t)k * ps];
        }
    }
}

OPS_CLONES static void pack_panel(float *dst, const float *x, ptrdiff_t ls, ptrdiff_t ps, int w,
                                  int valid, int kc)
{
    switch (w) {
    case 4:
        pack_panel_w(dst, x, ls, ps, 4, valid, kc);
        break;
    case 6:
        pack_panel_w(dst, x, ls, ps, 6, valid, kc);
        break;
    case 12:
        pack_panel_w(dst, x, ls, ps, 12, valid, kc);
        break;
    case 16:
        pack_panel_w(dst, x, ls, ps, 16, valid, kc);
        break;
    case 32:
        pack_panel_w(dst, x, ls, ps, 32, valid, kc);
        break;
    default:
        pack_panel_w(dst, x, ls, ps, w, valid, kc);
        break;
    }
}

#ifdef OPS_X86
/* Transposes the 16 x 16 block r in registers (r[i] lane j becomes r[j] lane i): pairs of
 * rows, then 64-bit pairs, then 128-bit and 256-bit lanes. */
__attribute__((target("avx512f"))) static inline void transpose16(__m512 r[16])
{
    __m512 t[16];
    const __m512i lo128 =
        _mm512_set_epi32(27, 26, 25, 24, 11, 10, 9, 8, 19, 18, 17, 16, 3, 2, 1, 0);
    const __m512i hi128 =
        _mm512_set_epi32(31, 30, 29, 28, 15, 14, 13, 12, 23, 22, 21, 20, 7, 6, 5, 4);

    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int i = 0; i < 4; i++) {
        t[i] = _mm512_permutex2var_ps(r[i], lo128, r[i + 4]);
        t[i + 4] = _mm512_permutex2var_ps(r[i], hi128, r[i + 4]);
        t[i + 8] = _mm512_permutex2var_ps(r[i + 8], lo128, r[i + 12]);
        t[i + 12] = _mm512_permutex2var_ps(r[i + 8], hi128, r[i + 12]);
    }
    for (int i = 0; i < 8; i++) {
        r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], _MM_SHUFFLE(1, 0, 1, 0));
        r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], _MM_SHUFFLE(3, 2, 3, 2));
    }
}

/* pack_panel for the AVX-512 kernel: the transposing case (lines apart, depth contiguous) in
 * 16 x 16 blocks through registers, masked at the edges; the others as pack_panel. */
__attribute__((target("avx512f"))) static void
pack_panel_avx512(float *dst, const float *x, ptrdiff_t ls, ptrdiff_t ps, int w, int valid, int kc)
{
    if (ps != 1 || ls == 1) {
        pack_panel(dst, x, ls, ps, w, valid, kc);
        return;
    }
    for (int p0 = 0; p0 < kc; p0 += 16) {
        int n = kc - p0 < 16 ? kc - p0 : 16;
        __mmask16 in = (__mmask16)((1u << n) - 1);

        for (int l0 = 0; l0 < w; l0 += 16) {
            int nl = w - l0 < 16 ? w - l0 : 16;
            __mmask16 out = (__mmask16)((1u << nl) - 1);
            __m512 r[16];

            /* Rows past `valid` load nothing (an empty mask); the lines are far apart (one
             * row each), so the next slab is fetched meanwhile. */
#pragma GCC unroll 16
            for (int l = 0; l < 16; l++) {
                const float *src = x + (ptrdiff_t)(l0 + l < valid ? l0 + l : 0) * ls + p0;
                r[l] = _mm512_maskz_loadu_ps(l0 + l < valid ? in : 0, src);
                _mm_prefetch((const char *)(src + 16), _MM_HINT_T0);
            }
            transpose16(r);
#pragma GCC unroll 16
            for (int k = 0; k < 16; k++) {
                if (k < n)
                    _mm512_mask_storeu_ps(dst + (size_t)(p0 + k) * w + l0, out, r[k]);
            }
        }
    }
}
#endif

/* The portable micro-kernel: MR 4, NR 16, plain loops the compiler vectorises as it can. */
static void kernel_generic(int kc, const float *restrict a, const float *restrict b,
                           float *restrict c, ptrdiff_t ldc, bool accumulate,
                           const float *restrict init)
{
    float acc[4][16];

    for (int i = 0; i < 4; i++) {
        for (int j = 0; j < 16; j++)
            acc[i][j] = init ? init[j] : 0.0f;
    }
    for (int p = 0; p < kc; p++) {
        for (int i = 0; i < 4; i++) {
            float ai = a[p * 4 + i];
            for (int j = 0; j < 16; j++)
                acc[i][j] += ai * b[p * 16 + j];
        }
    }
    for (int i = 0; i < 4; i++) {
        for (int j = 0; j < 16; j++)
            c[i * ldc + j] = accumulate ? c[i * ldc + j] + acc[i][j] : acc[i][j];
    }
}

#ifdef OPS_X86
/* AVX2 + FMA: 6 x 16, twelve ymm accumulators (of 16 registers), two B loads and six
 * broadcasts per p. */
__attribute__((target("avx2,fma"))) static void
kernel_avx2(int kc, const float *restrict a, const float *restrict b, float *restrict c,
            ptrdiff_t ldc, bool accumulate, const float *restrict init)
{
    __m256 c0[6], c1[6];
    __m256 i0 = init ? _mm256_loadu_ps(init) : _mm256_setzero_ps();
    __m256 i1 = init ? _mm256_loadu_ps(init + 8) : _mm256_setzero_ps();

#pragma GCC unroll 6
    for (int i = 0; i < 6; i++) {
        c0[i] = i0;
        c1[i] = i1;
    }
    for (int p = 0; p < kc; p++) {
        __m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8);
#pragma GCC unroll 6
        for (int i = 0; i < 6; i++) {
            __m256 ai = _mm256_broadcast_ss(a + i);
            c0[i] = _mm256_fmadd_ps(ai, b0, c0[i]);
            c1[i] = _mm256_fmadd_ps(ai, b1, c1[i]);
        }
        a += 6;
        b += 16;
    }
#pragma GCC unroll 6
    for (int i = 0; i < 6; i++) {
        float *ci = c + i * ldc;
        if (accumulate) {
            c0[i] = _mm256_add_ps(_mm256_loadu_ps(ci), c0[i]);
            c1[i] = _mm256_add_ps(_mm256_loadu_ps(ci + 8), c1[i]);
        }
        _mm256_storeu_ps(ci, c0[i]);
        _mm256_storeu_ps(ci + 8, c1[i]);
    }
}

/* AVX-512: 12 x 32, 24 zmm accumulators (of 32), two B loads and twelve broadcasts per p.
 * A is read at a[i * a_is + p * a_ps]: packed (a_ps 12, a_is 1) or straight from row-major
 * rows (a_ps 1, a_is the row stride), so that A needs no transposing copy when its rows are
 * contiguous. */
__attribute__((target("avx512f"))) static inline __attribute__((always_inline)) void
kernel_avx512_body(int kc, const float *restrict a, ptrdiff_t a_ps, ptrdiff_t a_is,
                   const float *restrict b, float *restrict c, ptrdiff_t ldc, bool accumulate,
                   const float *restrict init)
{
    __m512 c0[12], c1[12];
    __m512 i0 = init ? _mm512_loadu_ps(init) : _mm512_setzero_ps();
    __m512 i1 = init ? _mm512_loadu_ps(init + 16) : _mm512_setzero_ps();

#pragma GCC unroll 12
    for (int i = 0; i < 12; i++) {
        c0[i] = i0;
        c1[i] = i1;
    }
    for (int p = 0; p < kc; p++) {
        __m512 b0 = _mm512_load_ps(b), b1 = _mm512_load_ps(b + 16);
#pragma GCC unroll 12
        for (int i = 0; i < 12; i++) {
            __m512 ai = _mm512_set1_ps(a[i * a_is]);
            c0[i] = _mm512_fmadd_ps(ai, b0, c0[i]);
            c1[i] = _mm512_fmadd_ps(ai, b1, c1[i]);
        }
        a += a_ps;
        b += 32;
    }
#pragma GCC unroll 12
    for (int i = 0; i < 12; i++) {
        float *ci = c + i * ldc;
        if (accumulate) {
            c0[i] = _mm512_add_ps(_mm512_loadu_ps(ci), c0[i]);
            c1[i] = _mm512_add_ps(_mm512_loadu_ps(ci + 16), c1[i]);
        }
        _mm512_storeu_ps(ci, c0[i]);
        _mm512_storeu_ps(ci + 16, c1[i]);
    }
}

__attribute__((target("avx512f"))) static void
kernel_avx512(int kc, const float *restrict a, const float *restrict b, float *restrict c,
              ptrdiff_t ldc, bool accumulate, const float *restrict init)
{
    kernel_avx512_body(kc, a, 12, 1, b, c, ldc, accumulate, init);
}

/* A unpacked: contiguous rows (a_ps 1: inp, dout, P, dS) or contiguous columns (a_is 1: the
 * transposed dout^T, dS^T, P^T); each a constant in its copy of the loop. */
__attribute__((target("avx512f"))) static void
kernel_avx512_direct(int kc, const float *restrict a, ptrdiff_t a_ps, ptrdiff_t a_is,
                     const float *restrict b, float *restrict c, ptrdiff_t ldc, bool accumulate,
                     const float *restrict init)
{
    if (a_ps == 1)
        kernel_avx512_body(kc, a, 1, a_is, b, c, ldc, accumulate, init);
    else
        kernel_avx512_body(kc, a, a_ps, 1, b, c, ldc, accumulate, init);
}
#endif

static const struct gemm_kernel kernels[] = {
#ifdef OPS_X86
    {"avx512", 12, 32, kernel_avx512, pack_panel_avx512, kernel_avx512_direct},
    {"avx2", 6, 16, kernel_avx2, pack_panel, NULL},
#endif
    {"generic", 4, 16, kernel_generic, pack_panel, NULL},
};
#define N_KERNELS (sizeof(kernels) / sizeof(kernels[0]))

static const struct gemm_kernel *kernel = &kernels[N_KERNELS - 1];

static bool kernel_supported(const struct gemm_kernel *k)
{
#ifdef OPS_X86
    __builtin_cpu_init();
    if (!strcmp(k->name, "avx512"))
        return __builtin_cpu_supports("avx512f");
    if (!strcmp(k->name, "avx2"))
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
    return !strcmp(k->name, "generic");
}

/* The best kernel this CPU runs, picked before main() so that no op races to pick it. */
__attribute__((constructor)) static void kernel_pick(void)
{
    for (size_t i = 0; i < N_KERNELS; i++) {
        if (kernel_supported(&kernels[i])) {
            kernel = &kernels[i];
            return;
        }
    }
}

const char *ops_matmul_kernel(void)
{
    return kernel->name;
}

int ops_matmul_use_kernel(const char *name)
{
    for (size_t i = 0; i < N_KERNELS; i++) {
        if (!strcmp(kernels[i].name, name)) {
            if (!kernel_supported(&kernels[i]))
                return -ENOTSUP;
            kernel = &kernels[i];
            return 0;
        }
    }
    return -ENOENT;
}

static size_t round_up(size_t n, size_t m)
{
    return (n + m - 1) / m * m;
}

static float *pack_alloc(size_t floats)
{
    return aligned_alloc(PACK_ALIGN, round_up(floats * sizeof(float), PACK_ALIGN));
}

/* The block length for K: K cut into equal blocks of at most KC_MAX (a function of K only, so
 * that the summation order does not depend on anything else). */
static int gemm_kc(int K)
{
    int blocks = (K + KC_MAX - 1) / KC_MAX;
    return blocks ? (K + blocks - 1) / blocks : 0;
}

/* Fetches the first cache line of n lines `stride` floats apart (the next panel's, while
 * this one is packed). */
static void prefetch_lines(const float *x, ptrdiff_t stride, int n)
{
    for (int l = 0; l < n; l++)
        __builtin_prefetch(x + (ptrdiff_t)l * stride);
}

/* Packs B's column panels [panel0, panel1), all K deep, into dst: panel q at
 * dst + (q - panel0) * K * nr, its K block from p0 at + p0 * nr. */
static void pack_b(const struct gemm_kernel *k, const struct gemm *g, int panel0, int panel1,
                   float *dst)
{
    int nr = k->nr;

    for (int q = panel0; q < panel1; q++) {
        int j0 = q * nr, nj = g->N - j0 < nr ? g->N - j0 : nr;
        if (j0 + nr < g->N)
            prefetch_lines(g->b + (ptrdiff_t)(j0 + nr) * g->b_cs, g->b_cs,
                           g->N - j0 - nr < nr ? g->N - j0 - nr : nr);
        k->pack(dst + (size_t)(q - panel0) * g->K * nr, g->b + (ptrdiff_t)j0 * g->b_cs, g->b_cs,
                g->b_rs, nr, nj, g->K);
    }
}

/* Packs A's rows [i0, i1) (i1 - i0 rounded up to mr, zero rows past M), all K deep, into
 * dst: panel r at dst + r * K * mr, its K block from p0 at + p0 * mr. */
static void pack_a(const struct gemm_kernel *k, const struct gemm *g, int i0, int i1, float *dst)
{
    int mr = k->mr;

    for (int r0 = i0; r0 < i1; r0 += mr) {
        int mi = g->M - r0 < mr ? g->M - r0 : mr;
        prefetch_lines(g->a + (ptrdiff_t)(r0 + mr) * g->a_rs, g->a_rs,
                       r0 + 2 * mr < i1 ? mr : i1 - r0 - mr);
        k->pack(dst + (size_t)(r0 - i0) * g->K, g->a + (ptrdiff_t)r0 * g->a_rs, g->a_rs, g->a_cs,
                mr, mi, g->K);
    }
}

/* One micro-tile at C(i0, j0), A packed at ap (a_ps 0) or read unpacked at a[i*a_is +
 * p*a_ps] (the kernel's direct variant): the kernel straight into C when the tile is whole,
 * else into a scratch tile whose valid part is then stored or added, with the same
 * arithmetic. */
static void gemm_tile(const struct gemm_kernel *k, const struct gemm *g, int kc, const float *ap,
                      ptrdiff_t a_ps, ptrdiff_t a_is, const float *bp, int i0, int j0,
                      bool accumulate)
{
    float *c = g->c + (ptrdiff_t)i0 * g->ldc + j0;
    int mi = g->M - i0 < k->mr ? g->M - i0 : k->mr;
    int nj = g->N - j0 < k->nr ? g->N - j0 : k->nr;
    float tile[MR_MAX * NR_MAX] __attribute__((aligned(PACK_ALIGN)));
    float init_pad[NR_MAX];
    bool whole = mi == k->mr && nj == k->nr;
    float *dst = whole ? c : tile;
    ptrdiff_t ldd = whole ? g->ldc : k->nr;
    const float *init = NULL;

    /* The bias starts the first block's sums (padded with zeros past N at an edge). */
    if (!accumulate && g->bias) {
        init = g->bias + j0;
        if (nj < k->nr) {
            memset(init_pad, 0, sizeof(init_pad));
            memcpy(init_pad, init, (size_t)nj * sizeof(float));
            init = init_pad;
        }
    }
    if (a_ps)
        k->direct(kc, ap, a_ps, a_is, bp, dst, ldd, whole && accumulate, init);
    else
        k->fn(kc, ap, bp, dst, ldd, whole && accumulate, init);
    if (whole)
        return;
    for (int i = 0; i < mi; i++) {
        for (int j = 0; j < nj; j++) {
            float *ci = c + (ptrdiff_t)i * g->ldc + j;
            *ci = accumulate ? *ci + tile[i * k->nr + j] : tile[i * k->nr + j];
        }
    }
}

/* Rows [i0, i1) times column panels [panel0, panel1), B packed at bpack from panel q_base
 * with b_stride floats from one panel to the next: packs A into apack, then per B panel and K
 * block, the block's B panel (kept in L1) meets every A panel, the C tiles (in L1 or L2)
 * taking the blocks' sums in order. */
static void gemm_unit(const struct gemm_kernel *k, const struct gemm *g, const float *bpack,
                      size_t b_stride, int q_base, float *apack, int i0, int i1, int panel0,
                      int panel1)
{
    int kc_max = gemm_kc(g->K);
    /* A with contiguous rows or columns goes to the kernel unpacked where it has a direct
     * variant: only a last, partial row tile is packed (zero rows past M), into apack's first
     * panel. */
    bool direct = k->direct && (g->a_cs == 1 || g->a_rs == 1);
    int full_end = direct ? i0 + (i1 - i0) / k->mr * k->mr : i0;
    ptrdiff_t a_ps = g->a_cs == 1 ? 1 : g->a_cs, a_is = g->a_cs == 1 ? g->a_rs : 1;

    if (!direct)
        pack_a(k, g, i0, i1, apack);
    else if (full_end < i1)
        pack_a(k, g, full_end, i1, apack);
    for (int q = panel0; q < panel1; q++) {
        const float *bq = bpack + (size_t)(q - q_base) * b_stride;
        /* Causal: the first row tile with a wanted column in this panel. */
        int r_first = i0;
        if (g->causal && q * k->nr - g->diag > i0)
            r_first = i0 + (q * k->nr - g->diag - i0) / k->mr * k->mr;
        for (int p0 = 0; p0 < g->K; p0 += kc_max) {
            int kc = g->K - p0 < kc_max ? g->K - p0 : kc_max;
            bool accumulate = g->accumulate || p0 > 0;

            for (int r0 = r_first; r0 < i1; r0 += k->mr) {
                const float *ap;

                /* The first block fetches the next tile's rows of C (a wide C has been
                 * evicted since they were last written) while this tile computes. */
                if (!p0 && r0 + k->mr < i1) {
                    for (int i = 0; i < k->mr && r0 + k->mr + i < g->M; i++) {
                        const float *c = g->c + (ptrdiff_t)(r0 + k->mr + i) * g->ldc + q * k->nr;
                        __builtin_prefetch(c, 1);
                        __builtin_prefetch(c + k->nr - 1, 1);
                    }
                }
                if (r0 < full_end) {
                    ap = g->a + (ptrdiff_t)r0 * g->a_rs + (ptrdiff_t)p0 * g->a_cs;
                    gemm_tile(k, g, kc, ap, a_ps, a_is, bq + (size_t)p0 * k->nr, r0, q * k->nr,
                              accumulate);
                } else {
                    ap =
                        apack + (size_t)(r0 - (direct ? full_end : i0)) * g->K + (size_t)p0 * k->mr;
                    gemm_tile(k, g, kc, ap, 0, 0, bq + (size_t)p0 * k->nr, r0, q * k->nr,
                              accumulate);
                }
            }
        }
    }
}

/* C = bias (or 0) for an empty K; nothing when accumulating. */
static void gemm_empty(const struct gemm *g)
{
    if (g->accumulate)
        return;
    for (int i = 0; i < g->M; i++) {
        float *c = g->c + (ptrdiff_t)i * g->ldc;
        if (g->bias)
            memcpy(c, g->bias, (size_t)g->N * sizeof(float));
        else
            memset(c, 0, (size_t)g->N * sizeof(float));
    }
}

/* Rows per A block: enough B-panel reuse, a block (MC x KC) that stays in L2. */
#define MC_TARGET        96
/* Work units per thread a GEMM aims at (when it has enough panels), for balance. */
#define UNITS_PER_THREAD 4
/* Floats of packed B per column chunk (4 MiB): B is packed for all of K at once, in chunks
 * of columns when K x N is larger. */
#define B_CHUNK_FLOATS   (1 << 20)

/* The GEMM with the calling thread's OpenMP team: per column chunk, B packed by all, then
 * (row block, panel group) units handed out to the threads. Returns 0 or -ENOMEM. */
static int gemm_parallel(const struct gemm *g)
{
    const struct gemm_kernel *k = kernel;
    int nth = team_size();
    int n_panels = (g->N + k->nr - 1) / k->nr, m_tiles = (g->M + k->mr - 1) / k->mr;
    int chunk_panels, m_blocks, max_rows;
    float *bpack = NULL;
    int err = 0;

    if (g->M <= 0 || g->N <= 0)
        return 0;
    if (g->K == 0) {
        gemm_empty(g);
        return 0;
    }
    chunk_panels = B_CHUNK_FLOATS / ((size_t)g->K * k->nr);
    chunk_panels = chunk_panels < 1 ? 1 : chunk_panels > n_panels ? n_panels : chunk_panels;
    /* Row blocks of about MC_TARGET rows. */
    m_blocks = (m_tiles * k->mr + MC_TARGET - 1) / MC_TARGET;
    if (m_blocks > m_tiles)
        m_blocks = m_tiles;
    max_rows = ((m_tiles + m_blocks - 1) / m_blocks) * k->mr;

    bpack = pack_alloc((size_t)chunk_panels * k->nr * g->K);
    if (!bpack)
        return -ENOMEM;

#pragma omp parallel
    {
        float *apack = pack_alloc((size_t)max_rows * g->K);

        if (!apack) {
#pragma omp atomic write
            err = 1;
        }
#pragma omp barrier
        int failed;
#pragma omp atomic read
        failed = err;
        for (int c0 = 0; !failed && c0 < n_panels; c0 += chunk_panels) {
            int c1 = c0 + chunk_panels < n_panels ? c0 + chunk_panels : n_panels;
            /* Panel groups too, so that there are several units per thread to even out their
             * sizes (handed out dynamically: which thread computes a unit does not change its
             * result). */
            int n_groups = 1;
            while (m_blocks * n_groups < UNITS_PER_THREAD * nth && n_groups < c1 - c0)
                n_groups++;
            int n_units = m_blocks * n_groups;

#pragma omp for schedule(static)
            for (int q = c0; q < c1; q++)
                pack_b(k, g, q, q + 1, bpack + (size_t)(q - c0) * g->K * k->nr);

#pragma omp for schedule(dynamic, 1)
            for (int u = 0; u < n_units; u++) {
                int mb = u / n_groups, ng = u % n_groups;
                int t0 = (int)((long)mb * m_tiles / m_blocks);
                int t1 = (int)((long)(mb + 1) * m_tiles / m_blocks);
                int q0 = c0 + (int)((long)ng * (c1 - c0) / n_groups);
                int q1 = c0 + (int)((long)(ng + 1) * (c1 - c0) / n_groups);
                int i1 = t1 * k->mr < g->M ? t1 * k->mr : g->M;

                if (t1 > t0 && q1 > q0)
                    gemm_unit(k, g, bpack, (size_t)g->K * k->nr, c0, apack, t0 * k->mr, i1, q0, q1);
            }
        }
        free(apack);
    }
    free(bpack);
    return err ? -ENOMEM : 0;
}

/* Packs all of B (columns [0, N), depth [0, K)) into dst as panels `depth_cap` deep: panel q
 * at dst + q * depth_cap * nr, so that a product over a prefix or a suffix of K can use it
 * (pointer + p0 * nr, same stride). */
static void pack_b_whole(const struct gemm_kernel *k, float *dst, const float *b, ptrdiff_t b_rs,
                         ptrdiff_t b_cs, int N, int K, int depth_cap)
{
    for (int q = 0; q * k->nr < N; q++) {
        int nj = N - q * k->nr < k->nr ? N - q * k->nr : k->nr;
        k->pack(dst + (size_t)q * depth_cap * k->nr, b + (ptrdiff_t)q * k->nr * b_cs, b_cs, b_rs,
                k->nr, nj, K);
    }
}

/* The GEMM on the calling thread alone (inside a parallel region), with B already packed
 * (pack_b_whole; bpack at the depth where g's K starts, b_stride floats between panels) and
 * A packed into apack (room for M x K). */
static void gemm_serial(const struct gemm *g, const float *bpack, size_t b_stride, float *apack)
{
    const struct gemm_kernel *k = kernel;

    if (g->M <= 0 || g->N <= 0)
        return;
    if (g->K == 0) {
        gemm_empty(g);
        return;
    }
    gemm_unit(k, g, bpack, b_stride, 0, apack, 0, g->M, 0, (g->N + k->nr - 1) / k->nr);
}

/* ---- matmul ------------------------------------------------------------------------------- */

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

static int att_ws_init(struct att_ws *ws, int bufs, int T, int hs)
{
    const struct gemm_kernel *k = kernel;
    size_t t_pad = round_up((size_t)T, (size_t)k->nr), hs_pad = round_up((size_t)hs, (size_t)k->nr);
    size_t size = t_pad * hs > hs_pad * T ? t_pad * hs : hs_pad * T;
    size_t rows = round_up(ATT_ROWS, (size_t)k->mr);
    int ret = 0;

    memset(ws, 0, sizeof(*ws));
    ws->b_stride_t = (size_t)T * k->nr;
    ws->b_stride_hs = (size_t)hs * k->nr;
    for (int i = 0; i < bufs; i++) {
        if (!(ws->b[i] = pack_alloc(size)))
            ret = -ENOMEM;
    }
    /* A blocks: up to ATT_ROWS rows, up to T (or hs) deep. */
    if (!(ws->apack = pack_alloc(rows * (size_t)(T > hs ? T : hs))))
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
    const struct gemm_kernel *k = kernel;
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
            pack_b_whole(k, ws.b[0], q + C, 1, C3, T, hs, hs);
            pack_b_whole(k, ws.b[1], q + 2 * C, C3, 1, hs, T, T);
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
    const struct gemm_kernel *k = kernel;
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
            pack_b_whole(k, ws.b[0], q + 2 * C, 1, C3, T, hs, hs);
            pack_b_whole(k, ws.b[1], q + C, C3, 1, hs, T, T);
            pack_b_whole(k, ws.b[2], q, C3, 1, hs, T, T);
            pack_b_whole(k, ws.b[3], dy, C, 1, hs, T, T);
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

                gemm_serial(&dk, ws.b[2] + (size_t)j0 * k->nr, ws.b_stride_t, ws.apack);
                gemm_serial(&dv, ws.b[3] + (size_t)j0 * k->nr, ws.b_stride_t, ws.apack);
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
