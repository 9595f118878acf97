/* The GEMM engine of the CPU ops (ops.c's matmuls and the attention's products): one blocked
 * GEMM with packed operands and a register-tiled micro-kernel (AVX-512, AVX2+FMA or plain C,
 * the best this CPU runs picked once per process). Internal to kernels/: the ops' contract is
 * ops.h.
 *
 * C[M,N] = A[M,K] B[K,N] (or C += A B), with A(i,p) = a[i*a_rs + p*a_cs] and
 * B(p,j) = b[p*b_rs + j*b_cs], so one routine serves out = inp W^T (B is W read across its
 * rows), dinp = dout W, dW = dout^T inp and the attention's products without transposing copies.
 *
 * B is packed into panels of NR columns (p-major: NR contiguous floats per p), all of K at
 * once, and A into panels of MR rows (MR contiguous floats per p), zero-padded at the edges
 * (the AVX-512 kernel reads A where it lies instead when its rows or its columns are
 * contiguous, packing only a last partial row tile). K is cut into blocks of at most KC_MAX; the
 * micro-kernel accumulates an MR x NR tile of C in registers over one block, starting from
 * zero or the bias, then stores it (first block, when not accumulating) or adds it to C. An
 * element of C thus sums its products in p order within a block and adds the blocks in
 * order: the result depends on K (and the kernel) only, never on M, N, the packing or how the
 * work is split between threads.
 *
 * Thread context: gemm_parallel uses the calling thread's OpenMP team (not from inside a
 * parallel region); gemm_serial and gemm_pack_b run on the calling thread alone (from inside
 * one). The kernel in use changes only through gemm_use_kernel, between products. */
#ifndef GPURUN_KERNELS_GEMM_H
#define GPURUN_KERNELS_GEMM_H

#include <stdbool.h>
#include <stddef.h>

/* One product (above). */
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

/* The product g (its buffers borrowed for the call) with the calling thread's OpenMP team: per
 * column chunk, B packed by all, then (row block, panel group) units handed out to the
 * threads. Returns 0 or -ENOMEM (C is then unspecified). */
int gemm_parallel(const struct gemm *g);

/* The product g on the calling thread alone, with B already packed (gemm_pack_b; bpack at the
 * depth where g's K starts, b_stride floats between panels) and A packed into apack (room for
 * M rounded up to gemm_mr() rows, K deep; g's b is not read). */
void gemm_serial(const struct gemm *g, const float *bpack, size_t b_stride, float *apack);

/* Packs all of B (columns [0, N), depth [0, K), B(p,j) = b[p*b_rs + j*b_cs]) into dst as
 * panels depth_cap deep: panel q at dst + q * depth_cap * gemm_nr(), so that a product over a
 * prefix or a suffix of K can use it (pointer + p0 * gemm_nr(), same stride). dst holds
 * N rounded up to gemm_nr() columns times depth_cap floats. */
void gemm_pack_b(float *dst, const float *b, ptrdiff_t b_rs, ptrdiff_t b_cs, int N, int K,
                 int depth_cap);

/* A packing buffer of `floats` floats aligned for the micro-kernels' vector loads: new, freed
 * with free(); NULL without memory. */
float *gemm_alloc(size_t floats);

/* The micro-tile of the kernel in use: its rows (MR) and columns (NR). */
int gemm_mr(void);
int gemm_nr(void);

/* The kernel in use ("avx512", "avx2" or "generic"; borrowed static string), and the choice of
 * another (ops_matmul_use_kernel's contract: 0, -ENOTSUP when this CPU lacks its
 * instructions, -ENOENT for an unknown name). */
const char *gemm_kernel_name(void);
int gemm_use_kernel(const char *name);

#endif
