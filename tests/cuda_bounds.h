/* The error bounds of the CUDA backend's tests (test_cuda_ops.c, each op against the CPU
 * reference; test_cuda_model.c, the ops composed into the model): the rules, the helpers that
 * apply them, and each op's own limits from inputs both sides share. Header-only, as
 * cuda_test.h (include after it).
 *
 * Each output element is judged against a limit of its own, derived from the arithmetic both
 * sides do: the CPU reference (kernels/ops.c, fp32) and the kernel (its file's header says
 * how it computes). With u = 2^-24, fp32's unit roundoff, and ub = 2^-8, bf16's:
 *  R1. The inputs are values of the storage type on both sides: exact.
 *  R2. A sum of K terms (products included) in fp32, in any order, with or without FMA, is
 *      within gamma(K) S of the exact sum, gamma(K) = K u / (1 - K u) and S the sum of the
 *      terms' magnitudes (Higham, Accuracy and Stability of Numerical Algorithms, ch. 3).
 *      Both sides err independently: 2 gamma(K) S. Tensor cores add bf16 products with
 *      truncation, not rounding: the GPU's share doubles there (3 gamma(K) S in all). S is the
 *      reference op run on the inputs' magnitudes ("magnitude run") or summed in the test.
 *  R3. Each rounding to bf16 of a value bounded by S (an output, or an intermediate the
 *      kernel stores in bf16: nb of them on the way) adds ub S.
 *  R4. Through a function f, an error e becomes |f'| e, plus f's own: CUDA's expf, tanhf,
 *      logf within 2 ulp, its __expf within 2 + 1.173 |x| ulp, the CPU's exp_inline within
 *      1.2e-7 plus its own roundings (an ulp is at most 2u relative).
 * The limits below use the reference's values where the exact ones would do (mean, rstd,
 * probabilities): WITHIN allows 1% over a limit for that. */
#ifndef GPURUN_TESTS_CUDA_BOUNDS_H
#define GPURUN_TESTS_CUDA_BOUNDS_H

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "cuda/cuda_ops.h"

#define U32              0x1p-24
/* crossentropy.cu's threads per row (CE_THREADS): a thread's running sum is rescaled at most
 * once per logit it reads. */
#define CE_BLOCK_THREADS 512
#define UBF              0x1p-8
#define SLACK            1.01

static inline double gam(double k)
{
    return k * U32 / (1.0 - k * U32);
}

/* ub where outputs are bf16, else 0 (R3). */
static inline double ub_of(enum gpu_dtype dt)
{
    return dt == GPU_BF16 ? UBF : 0.0;
}

/* R4 for exp at x, both sides' errors: CUDA's __expf (the larger of its two) and the CPU's. */
static inline double exp_err(double x)
{
    return 2.0 * U32 * (2.0 + 1.173 * fabs(x)) + 4.0 * U32;
}

/* The magnitudes of n floats. */
static inline float *absv(const float *x, size_t n)
{
    float *a = hmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        a[i] = fabsf(x[i]);
    return a;
}

static inline double *dzero(size_t n)
{
    double *d = hmalloc(n * sizeof(double));
    memset(d, 0, n * sizeof(double));
    return d;
}

/* R2 and R3 for n sums of at most K terms each, of magnitudes S, with nb bf16 roundings on
 * the way in bf16 (gemm: the GPU sums on tensor cores in bf16). */
static inline double *sum_limits(enum gpu_dtype dt, const float *S, size_t n, double K, int nb,
                                 bool gemm)
{
    double *lim = hmalloc(n * sizeof(double));
    double c = 2.0 * gam(K) + (gemm && dt == GPU_BF16 ? gam(K) : 0.0) + nb * ub_of(dt);
    for (size_t i = 0; i < n; i++)
        lim[i] = c * fabs((double)S[i]);
    return lim;
}

#define WITHIN(what, got, ref, lim, n) within(__FILE__, __LINE__, what, got, ref, lim, n, SLACK)

/* Fails when an element of got is further from ref than its limit times slack (NaN always
 * is), after printing the first such elements. */
static inline void within(const char *file, int line, const char *what, const float *got,
                          const float *ref, const double *lim, size_t n, double slack)
{
    size_t bad = 0;
    double worst = 0.0;

    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - ref[i]), l = slack * lim[i];
        if (!(e <= l)) {
            if (bad < 8)
                fprintf(stderr, "%s[%zu]: gpu %.9g vs cpu %.9g (|diff| %.3g > limit %.3g)\n", what,
                        i, (double)got[i], (double)ref[i], e, l);
            bad++;
        } else if (l > 0.0 && e / l > worst) {
            worst = e / l;
        }
    }
    if (bad)
        test_fail(file, line, "%s: %zu of %zu elements outside their derived limits", what, bad, n);
    /* GPURUN_TEST_BOUNDS=FILE: how close each comparison came to its limits, appended. */
    const char *path = getenv("GPURUN_TEST_BOUNDS");
    FILE *f = path && *path ? fopen(path, "a") : NULL;
    if (f) {
        fprintf(f, "%s\t%.3g\n", what, worst);
        fclose(f);
    }
}

/* GELU (tanh form) and its derivative in double, and a bound on the magnitudes the
 * derivative's fp32 evaluation adds up (R4 on its terms). */
static inline double gelu_d(double x)
{
    double z = 0.7978845608028654 * (x + 0.044715 * x * x * x);
    return 0.5 * x * (1.0 + tanh(z));
}

static inline double gelu_grad_d(double x, double *mag)
{
    double k = 0.7978845608028654, z = k * (x + 0.044715 * x * x * x), t = tanh(z);
    double b = 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * x * x);
    if (mag)
        *mag = 0.5 * (1.0 + fabs(t)) + fabs(b);
    return 0.5 * (1.0 + t) + b;
}

/* The forward's limits (layernorm.cu: two passes in fp32, then the output), per row with
 * A = sum |x| / C:
 *   mean: a sum of C terms and a division, both sides: 2 (gamma(C) + u) A = dm.
 *   rstd: the variance, a sum of C squares of rounded differences (3 roundings each) and a
 *     division, is within gamma(C + 4) relative on each side, and the two-pass form feels the
 *     mean's error only in second order (dm^2 / var); 1/sqrt halves it and adds 2u (sqrt and
 *     division, or rsqrtf's 2 ulp): er = gamma(C + 5) + 4u + dm^2 / var, both sides.
 *   out = (x - mean) rstd w + b: with P = |x - mean| rstd |w|, the mean's error dm rstd |w|,
 *     rstd's er P, four roundings on each side 8u P + 2u |b| (6u |b| kept), and in bf16 one
 *     rounding of the output ub (P + |b|). */
static inline void layernorm_limits(enum gpu_dtype dt, const float *x, const float *w,
                                    const float *b, const float *mean, const float *rstd, int N,
                                    int C, double *l_out, double *l_mean, double *l_rstd)
{
    for (int n = 0; n < N; n++) {
        const float *xr = x + (size_t)n * C;
        double A = 0.0, var = 0.0, m = mean[n], r = rstd[n];
        for (int c = 0; c < C; c++) {
            A += fabs((double)xr[c]);
            var += ((double)xr[c] - m) * ((double)xr[c] - m);
        }
        A /= C;
        var /= C;
        double dm = 2.0 * (gam(C) + U32) * A;
        double er = gam(C + 5) + 4.0 * U32 + (var > 0.0 ? dm * dm / var : 0.0);
        l_mean[n] = dm;
        l_rstd[n] = er * r;
        for (int c = 0; c < C; c++) {
            double P = fabs((double)xr[c] - m) * r * fabs((double)w[c]);
            double B = fabs((double)b[c]);
            l_out[(size_t)n * C + c] = dm * r * fabs((double)w[c]) + P * (er + 8.0 * U32) +
                                       6.0 * U32 * B + ub_of(dt) * (P + B);
        }
    }
}

/* The backward's limits, from the same mean and rstd on both sides (inputs), with g = w dout,
 * nn = |x - mean| rstd, G = sum |g| / C and GN = sum |g| nn / C over the row:
 *   dinp += rstd (g - mean(g) - n mean(g n)): mean(g) within (gamma(C + 1) + u) G and
 *     mean(g n) within (gamma(C + 3) + u) GN on each side (sums of C products of 1 and 3
 *     roundings, a division), n within 2u nn, and the expression's own 4 roundings and the
 *     accumulation's 2 on Q = |g| + G + nn GN and on the sum: per side
 *     rstd ((gamma(C + 2) G + (gamma(C + 4) + 2u) nn GN) + 6u Q) + 2u (rstd Q + |dinp0|),
 *     twice, and ub (rstd Q + |dinp0|) for bf16's store.
 *   dweight += sum_rows dout n: N terms of 3 roundings and the old value: 2 gamma(N + 4) S,
 *     S = |dweight0| + sum |dout| nn; dbias: 2 gamma(N + 1) (|dbias0| + sum |dout|). The
 *     chunks' partial sums stay fp32 and reach the gradient once: one bf16 rounding. */
static inline void layernorm_backward_limits(enum gpu_dtype dt, const float *dout, const float *x,
                                             const float *w, const float *mean, const float *rstd,
                                             const float *dinp0, const float *dw0, const float *db0,
                                             int N, int C, double *l_dinp, double *l_dw,
                                             double *l_db)
{
    double *Sw = dzero((size_t)C), *Sb = dzero((size_t)C);

    for (int n = 0; n < N; n++) {
        size_t o = (size_t)n * C;
        double G = 0.0, GN = 0.0, s = rstd[n];
        for (int c = 0; c < C; c++) {
            double g = fabs((double)w[c] * dout[o + c]), nn = fabs((double)x[o + c] - mean[n]) * s;
            G += g;
            GN += g * nn;
            Sw[c] += fabs((double)dout[o + c]) * nn;
            Sb[c] += fabs((double)dout[o + c]);
        }
        G /= C;
        GN /= C;
        for (int c = 0; c < C; c++) {
            double g = fabs((double)w[c] * dout[o + c]), nn = fabs((double)x[o + c] - mean[n]) * s;
            double Q = g + G + nn * GN, D0 = fabs((double)dinp0[o + c]);
            double side =
                s * (gam(C + 2) * G + (gam(C + 4) + 2.0 * U32) * nn * GN + 6.0 * U32 * Q) +
                2.0 * U32 * (s * Q + D0);
            l_dinp[o + c] = 2.0 * side + ub_of(dt) * (s * Q + D0);
        }
    }
    for (int c = 0; c < C; c++) {
        double W = Sw[c] + fabs((double)dw0[c]), Bs = Sb[c] + fabs((double)db0[c]);
        l_dw[c] = 2.0 * gam(N + 4) * W + ub_of(dt) * W;
        l_db[c] = 2.0 * gam(N + 1) * Bs + ub_of(dt) * Bs;
    }
}

/* Cross-entropy's limits (crossentropy.cu), per row with m its max, R its range and
 * p_j = exp(x_j - lse):
 *   lse = m + log s, s = sum_{j<V} exp(x_j - m): s within gamma(V) relative on each side, each
 *     term within u |x_j - m| (the subtraction) and exp's error (R4) relative; on the GPU a
 *     thread's running sum is rescaled when a larger logit comes (at most one rescale per
 *     element it reads, V/512 rounded up, and 2 per combining step, 9), each within exp's
 *     error at R and u. The log: s's relative error, plus 2 ulp of log s and the addition's
 *     u |lse|, on each side.
 *   loss = lse - x_target: lse's limit and 2u |loss|.
 *   dlogits_j = dloss (p_j - [j == target]): p_j within dlse + 2u |x_j - lse| + exp's error
 *     relative (dlse: the fused kernel's own lse against the CPU's, lse's limit), the
 *     subtraction and product 4u |p_j - [j == t]|, and bf16's store; the padding (j >= V) is
 *     0 on both sides. */
static inline void crossentropy_limits(enum gpu_dtype dt, const float *logits, const int *targets,
                                       const float *lse, const float *losses, int N, int V, int Vp,
                                       float dloss, double *l_lse, double *l_loss, double *l_dfused)
{
    for (int n = 0; n < N; n++) {
        const float *x = logits + (size_t)n * Vp;
        double m = -INFINITY, lo = INFINITY, E = 0.0, L = lse[n];
        for (int j = 0; j < V; j++) {
            m = x[j] > m ? x[j] : m;
            lo = x[j] < lo ? x[j] : lo;
        }
        for (int j = 0; j < V; j++) {
            double p = exp((double)x[j] - L);
            E += p * (2.0 * U32 * fabs(x[j] - m) + exp_err(x[j] - m));
        }
        double rescales = (V + CE_BLOCK_THREADS - 1) / CE_BLOCK_THREADS + 18;
        E += 2.0 * gam(V) + rescales * (exp_err(m - lo) + U32);
        l_lse[n] = E + 2.0 * (4.0 * U32 * fabs(L - m) + U32 * fabs(L));
        l_loss[n] = l_lse[n] + 2.0 * U32 * fabs((double)losses[n]);
        int t = targets[n];
        for (int j = 0; j < Vp; j++) {
            size_t i = (size_t)n * Vp + j;
            if (j >= V) {
                l_dfused[i] = 0.0;
                continue;
            }
            double p = exp((double)x[j] - L), q = fabs(p - (j == t ? 1.0 : 0.0));
            double own = p * (2.0 * U32 * fabs(x[j] - L) + exp_err(x[j] - L)) + 4.0 * U32 * q;
            l_dfused[i] = dloss * (own + p * l_lse[n] + ub_of(dt) * q);
        }
    }
}

/* log sum_t2<=t exp(q[t].k[t2] / sqrt(hs)) in double. */
static inline void ref_lse(float *lse, const float *qkv, int B, int T, int C, int NH)
{
    int hs = C / NH;
    double *s = malloc((size_t)T * sizeof(double));
    CHECK(s);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const float *q = qkv + ((size_t)b * T + t) * 3 * C + h * hs;
                double m = -INFINITY, sum = 0.0;
                for (int t2 = 0; t2 <= t; t2++) {
                    const float *k = qkv + ((size_t)b * T + t2) * 3 * C + C + h * hs;
                    double d = 0.0;
                    for (int i = 0; i < hs; i++)
                        d += (double)q[i] * k[i];
                    s[t2] = d / sqrt((double)hs);
                    m = s[t2] > m ? s[t2] : m;
                }
                for (int t2 = 0; t2 <= t; t2++)
                    sum += exp(s[t2] - m);
                lse[((size_t)b * NH + h) * T + t] = (float)(m + log(sum));
            }
    free(s);
}

/* Attention's limits (attention.cu's header states the maths; attention_tc.cu the bf16
 * kernels, cuDNN's held to the same), per (b, h) and query t, with s = q.k / sqrt(hs), m_t the
 * row's max score, p the CPU's probabilities, R_t the row's score range, tc = bf16 (tensor
 * cores, R2's factor 3 instead of 2 on every GPU sum) and 2 for fp32:
 *   scores: dt_t = the row's largest tc gamma(hs) sum|q||k| / sqrt(hs) + 4u |s| (the dot
 *     product, the scale and its rounding; both sides).
 *   p_t2 within ep = 2 dt_t (softmax moves by at most twice the largest score error) +
 *     2u |s - m| + exp's error at s - m + den_t, den_t = tc gamma(T) + the terms' own errors
 *     (weighted by p) + the online rescales', at most one per key tile (T/16 + 2 counted), each
 *     exp's error at R_t and u.
 *   out: sum ep p |v| + tc gamma(T) A + rescales (exp's error at R_t + u) A + 2u A, A =
 *     sum p |v|; bf16: P stored for the product and the output, 2 ub A.
 *   lse: dt_t + den_t + 4u |lse - m| + 2u |lse| (the log's 2 ulp and the addition, twice).
 *   backward, from the GPU's own out and lse: p recomputed as exp(s - lse) within ep' = ep +
 *     lse's limit + dt_t + 2u |s - lse| + exp's error (+ ub: stored in bf16 for the products);
 *     D = dout.out (GPU) against sum p dP (CPU): out's limit through |dout|, tc gamma(hs)
 *     sum |dout||out|, and the CPU's ep p |dP| + 2 gamma(T + hs) sum p |dP|; dP = dout.v
 *     within tc gamma(hs) DP, DP = sum |dout||v|; dS = p (dP - D) bounded by M = p (DP + |D|),
 *     within ep' M + p (ddP + dD) + 4u M (+ ub M: stored in bf16);
 *     dq = sum dS k / sqrt(hs), dk = sum dS q / sqrt(hs), dv = sum p dout: the dS (or p)
 *     errors through the magnitudes, tc gamma(T + 2) on the sums of M |k| (M |q|, p |dout|),
 *     and the output's bf16 rounding. */
static inline void attention_limits(enum gpu_dtype dt, const float *qkv, const float *att,
                                    const float *lse, const float *out, const float *dout, int B,
                                    int T, int C, int NH, double *l_out, double *l_lse,
                                    double *l_dqkv)
{
    int hs = C / NH;
    double tc = dt == GPU_BF16 ? 3.0 : 2.0, ub = ub_of(dt), rs = 1.0 / sqrt((double)hs);
    double rescales = T / 16 + 2;
    size_t TT = (size_t)T * T;
    double *sc = hmalloc(TT * sizeof(double)), *ep = hmalloc(TT * sizeof(double));
    double *epb = hmalloc(TT * sizeof(double)), *DP = hmalloc(TT * sizeof(double));
    double *dS = hmalloc(TT * sizeof(double)), *Mg = hmalloc(TT * sizeof(double));
    double *dD = hmalloc(T * sizeof(double)), *Dm = hmalloc(T * sizeof(double));

    for (size_t i = 0; i < (size_t)B * T * 3 * C; i++)
        l_dqkv[i] = 0.0;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const float *P = att + ((size_t)b * NH + h) * TT;
            const float *L = lse + ((size_t)b * NH + h) * T;
#define QKV(t, part, d) ((double)qkv[((size_t)b * T + (t)) * 3 * C + (part)*C + h * hs + (d)])
#define DOUT(t, d)      ((double)dout[((size_t)b * T + (t)) * C + h * hs + (d)])
            for (int t = 0; t < T; t++) {
                double m = -INFINITY, lo = INFINITY, dlt = 0.0, den = 2.0 * gam(T) * tc / 2.0;
                for (int t2 = 0; t2 <= t; t2++) {
                    double d = 0.0, a = 0.0, dp = 0.0;
                    for (int i = 0; i < hs; i++) {
                        d += QKV(t, 0, i) * QKV(t2, 1, i);
                        a += fabs(QKV(t, 0, i) * QKV(t2, 1, i));
                        dp += fabs(DOUT(t, i) * QKV(t2, 2, i));
                    }
                    sc[(size_t)t * T + t2] = d * rs;
                    DP[(size_t)t * T + t2] = dp;
                    double e = tc * gam(hs) * a * rs + 4.0 * U32 * fabs(d * rs);
                    dlt = e > dlt ? e : dlt;
                    m = d * rs > m ? d * rs : m;
                    lo = d * rs < lo ? d * rs : lo;
                }
                double resc = rescales * (exp_err(m - lo) + U32);
                for (int t2 = 0; t2 <= t; t2++) {
                    double x = sc[(size_t)t * T + t2] - m;
                    den += P[(size_t)t * T + t2] * (2.0 * U32 * fabs(x) + exp_err(x));
                }
                den += resc;
                double lt = dlt + den + 4.0 * U32 * fabs(L[t] - m) + 2.0 * U32 * fabs((double)L[t]);
                l_lse[((size_t)b * NH + h) * T + t] = lt;
                for (int t2 = 0; t2 <= t; t2++) {
                    size_t k = (size_t)t * T + t2;
                    double x = sc[k] - m, y = sc[k] - L[t];
                    ep[k] = 2.0 * dlt + 2.0 * U32 * fabs(x) + exp_err(x) + den;
                    epb[k] = ep[k] + lt + dlt + 2.0 * U32 * fabs(y) + exp_err(y) + ub;
                }
                /* out, and D's two sides */
                double D = 0.0, Dabs = 0.0, dDg = 0.0, pdp = 0.0, pdp_err = 0.0;
                for (int i = 0; i < hs; i++) {
                    double A = 0.0, E = 0.0;
                    for (int t2 = 0; t2 <= t; t2++) {
                        size_t k = (size_t)t * T + t2;
                        A += P[k] * fabs(QKV(t2, 2, i));
                        E += ep[k] * P[k] * fabs(QKV(t2, 2, i));
                    }
                    size_t o = ((size_t)b * T + t) * C + h * hs + i;
                    l_out[o] = E + (tc * gam(T) + resc + 2.0 * U32 + 2.0 * ub) * A;
                    D += DOUT(t, i) * out[o];
                    Dabs += fabs(DOUT(t, i) * out[o]);
                    dDg += fabs(DOUT(t, i)) * l_out[o];
                }
                for (int t2 = 0; t2 <= t; t2++) {
                    size_t k = (size_t)t * T + t2;
                    pdp += P[k] * DP[k];
                    pdp_err += ep[k] * P[k] * DP[k];
                }
                Dm[t] = fabs(D);
                dD[t] = dDg + tc * gam(hs) * Dabs + pdp_err + 2.0 * gam(T + hs) * pdp;
                for (int t2 = 0; t2 <= t; t2++) {
                    size_t k = (size_t)t * T + t2;
                    Mg[k] = P[k] * (DP[k] + Dm[t]);
                    dS[k] = epb[k] * Mg[k] + P[k] * (tc * gam(hs) * DP[k] + dD[t]) +
                            (4.0 * U32 + ub) * Mg[k];
                }
            }
            /* dq (rows t), dk and dv (rows t2) */
            double cs = tc * gam(T + 2);
            for (int t = 0; t < T; t++)
                for (int i = 0; i < hs; i++) {
                    double e = 0.0, mg = 0.0;
                    for (int t2 = 0; t2 <= t; t2++) {
                        size_t k = (size_t)t * T + t2;
                        e += dS[k] * fabs(QKV(t2, 1, i));
                        mg += Mg[k] * fabs(QKV(t2, 1, i));
                    }
                    l_dqkv[((size_t)b * T + t) * 3 * C + h * hs + i] =
                        (e + (cs + 2.0 * U32 + ub) * mg) * rs;
                }
            for (int t2 = 0; t2 < T; t2++)
                for (int i = 0; i < hs; i++) {
                    double ek = 0.0, mk = 0.0, ev = 0.0, mv = 0.0;
                    for (int t = t2; t < T; t++) {
                        size_t k = (size_t)t * T + t2;
                        ek += dS[k] * fabs(QKV(t, 0, i));
                        mk += Mg[k] * fabs(QKV(t, 0, i));
                        ev += epb[k] * P[k] * fabs(DOUT(t, i));
                        mv += P[k] * fabs(DOUT(t, i));
                    }
                    size_t o = ((size_t)b * T + t2) * 3 * C + h * hs + i;
                    l_dqkv[o + C] = (ek + (cs + 2.0 * U32 + ub) * mk) * rs;
                    l_dqkv[o + 2 * C] = ev + (cs + ub) * mv;
                }
#undef QKV
#undef DOUT
        }
}

#endif
