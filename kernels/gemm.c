/* The GEMM engine of the CPU ops (gemm.h): packing, the micro-kernels (AVX-512, AVX2+FMA and
 * plain C; the best one this CPU runs is picked before main()), and the blocked product over
 * them, with the calling thread's OpenMP team or on one thread. */
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define GEMM_X86 1
#endif

#include "gemm.h"
#include "banned.h"

/* The packing loops: one copy per x86-64 ISA level, chosen by the loader (ifunc), as ops.c's
 * element-wise loops. GCC only: clang 14 has target_clones but not the arch= form. */
#if defined(GEMM_X86) && !defined(__clang__)
#define GEMM_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define GEMM_CLONES
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

/* ---- packing and the micro-kernels ----------------------------------------------------------- */

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

GEMM_CLONES static void pack_panel(float *dst, const float *x, ptrdiff_t ls, ptrdiff_t ps, int w,
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

#ifdef GEMM_X86
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

#ifdef GEMM_X86
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

/* ---- the kernel in use ----------------------------------------------------------------------- */

static const struct gemm_kernel kernels[] = {
#ifdef GEMM_X86
    {"avx512", 12, 32, kernel_avx512, pack_panel_avx512, kernel_avx512_direct},
    {"avx2", 6, 16, kernel_avx2, pack_panel, NULL},
#endif
    {"generic", 4, 16, kernel_generic, pack_panel, NULL},
};
#define N_KERNELS (sizeof(kernels) / sizeof(kernels[0]))

static const struct gemm_kernel *kernel = &kernels[N_KERNELS - 1];

static bool kernel_supported(const struct gemm_kernel *k)
{
#ifdef GEMM_X86
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

const char *gemm_kernel_name(void)
{
    return kernel->name;
}

int gemm_mr(void)
{
    return kernel->mr;
}

int gemm_nr(void)
{
    return kernel->nr;
}

int gemm_use_kernel(const char *name)
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

/* ---- the product ----------------------------------------------------------------------------- */

static size_t round_up(size_t n, size_t m)
{
    return (n + m - 1) / m * m;
}

float *gemm_alloc(size_t floats)
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

int gemm_parallel(const struct gemm *g)
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

    bpack = gemm_alloc((size_t)chunk_panels * k->nr * g->K);
    if (!bpack)
        return -ENOMEM;

#pragma omp parallel
    {
        float *apack = gemm_alloc((size_t)max_rows * g->K);

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

void gemm_pack_b(float *dst, const float *b, ptrdiff_t b_rs, ptrdiff_t b_cs, int N, int K,
                 int depth_cap)
{
    const struct gemm_kernel *k = kernel;

    for (int q = 0; q * k->nr < N; q++) {
        int nj = N - q * k->nr < k->nr ? N - q * k->nr : k->nr;
        k->pack(dst + (size_t)q * depth_cap * k->nr, b + (ptrdiff_t)q * k->nr * b_cs, b_cs, b_rs,
                k->nr, nj, K);
    }
}

void gemm_serial(const struct gemm *g, const float *bpack, size_t b_stride, float *apack)
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
