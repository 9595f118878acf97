/* Tests of the CUDA backend's GPT-2 model (kernels/cuda/gpt2_gpu.c) against the CPU model of
 * kernels/gpt2.c and AdamW of kernels/optim.c on the same parameters and tokens: the loss and
 * every gradient tensor of a training step (fp32, bf16), gradient accumulation,
 * the step as a CUDA graph, the logits of a forward without targets, the AdamW update whole
 * and as a ZeRO-1 shard,
 * state round trips, the gradients' sum of squares and bad input. Without a CUDA device every
 * test skips. The inputs come from a fixed seed (printed); GPURUN_TEST_SEED=N picks another.
 *
 * Bounds. Each element of each result (the loss, every gradient, the logits) is held to a
 * bound of its own, derived from the computation: a shadow run of the CPU model carries,
 * beside every value, a bound on how far the GPU's may be from it, op by op (own errors from
 * cuda_bounds.h's rules, the inputs' errors through the op's derivatives): "the model's error
 * bounds" below. The AdamW update and its moments are bounded per element from optim.c's
 * arithmetic (cuda_test.h). No tensor-wide constant. */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda/gpt2_gpu.h"
#include "gpt2.h"
#include "ops.h"
#include "optim.h"
#include "test.h"
#include "cuda_test.h"
#include "cuda_bounds.h"
#include "banned.h"

/* Two layers of four heads of 16; V = 100 pads to Vp = 128; wpe has rows the batch never
 * reaches (their gradient stays zero). */
static const struct gpt2_config cfg = {
    .max_seq_len = 24,
    .vocab_size = 100,
    .padded_vocab_size = 128,
    .n_layer = 2,
    .n_head = 4,
    .n_embd = 64,
};
#define B_CAP 2
#define T_CAP 16

static const struct adamw_config adamw_cfg = {0.9f, 0.95f, 1e-8f, 0.1f};

/* The models' error buffer (given to gpt2_gpu_new). */
static struct errmsg gerr;

/* Fails the test when call, an action on a model, returns < 0, with the model's message. */
#define CHECK_GPU(call)                                                                            \
    do {                                                                                           \
        int r_ = (call);                                                                           \
        if (r_ < 0)                                                                                \
            test_fail(__FILE__, __LINE__, "%s: %d (%s)", #call, r_, gerr.text);                    \
    } while (0)

/* bf16 on the host: round to nearest even. */
static float round_dt(enum gpu_dtype dt, float f)
{
    uint32_t u;

    if (dt != GPU_BF16 || isnan(f))
        return f;
    memcpy(&u, &f, sizeof(u));
    u += 0x7fffu + ((u >> 16) & 1u);
    u &= 0xffff0000u;
    memcpy(&f, &u, sizeof(f));
    return f;
}

static void same_bits(const char *what, const void *a, const void *b, size_t bytes)
{
    if (memcmp(a, b, bytes))
        test_fail(__FILE__, __LINE__, "%s: differ", what);
}

/* ---- fixtures ------------------------------------------------------------------------------ */

/* The CPU model, randomly initialised and then perturbed (LayerNorm gains off 1, non-zero
 * biases: every path carries a gradient worth checking), its parameters values of dt. */
static void cpu_model(struct gpt2 *cpu, enum gpu_dtype dt)
{
    CHECK_EQ(gpt2_init(cpu, &cfg, B_CAP, T_CAP), 0);
    gpt2_init_random(cpu, next_u64());
    for (size_t i = 0; i < cpu->n_params; i++) {
        bool wte_pad = i >= (size_t)cfg.vocab_size * cfg.n_embd &&
                       i < (size_t)cfg.padded_vocab_size * cfg.n_embd;
        if (!wte_pad)
            cpu->params[i] += (float)(0.2 * (urand() - 0.5));
        cpu->params[i] = round_dt(dt, cpu->params[i]);
    }
}

static struct gpt2_gpu_opts opts_of(enum gpu_dtype dt)
{
    struct gpt2_gpu_opts o = {.dt = dt, .batch_cap = B_CAP, .seq_cap = T_CAP, .adamw = adamw_cfg};
    return o;
}

/* A GPU model of cfg with opts and the CPU model's parameters. */
static struct gpt2_gpu *gpu_model(const struct gpt2_gpu_opts *o, const struct gpt2 *cpu)
{
    struct gpt2_gpu *m = gpt2_gpu_new(ctx, &cfg, o, &gerr);

    if (!m)
        test_fail(__FILE__, __LINE__, "gpt2_gpu_new: %s", gerr.text);
    CHECK_GPU(gpt2_gpu_set_params(m, cpu->params));
    return m;
}

static int *random_tokens(int n)
{
    int *x = hmalloc((size_t)n * sizeof(int));
    for (int i = 0; i < n; i++)
        x[i] = irand(cfg.vocab_size);
    x[0] = cfg.vocab_size - 1;
    return x;
}

/* ---- the model's error bounds -------------------------------------------------------------
 *
 * The shadow run: the CPU model's forward and backward again, op by op through the same
 * kernels/ops.c calls as gpt2.c (so the same values, bit for bit: shadow_check holds it to
 * that), and beside each value E, the size of |gpu - cpu| that element may reach: a worst case
 * for each op's own errors, a sum in quadrature for those its inputs bring. Each op's E is
 *   own:          the op's rounding errors from inputs both sides share: R2's fp32 sums
 *                 (worst case, gamma(K) on the terms' magnitudes) and the op's other fp32
 *                 errors from cuda_bounds.h (the limits test_cuda_ops.c holds each kernel to),
 *                 and in bf16 each rounding to bf16 on the value it rounds (R3: ub |value|);
 *   propagation:  the inputs' E through the op's first derivatives, written out per op below.
 * Weights are the same values on both sides (R1); activations, their gradients and the
 * statistics (mean, rstd, lse) differ by their E.
 * Propagation adds the inputs' errors in quadrature, sqrt(sum_j (d out_i / d in_j E_j)^2):
 * rounding errors of different elements are independent with mean zero (the model of
 * probabilistic rounding error analysis: Higham and Mary, SIAM J. Sci. Comput. 41(5), 2019),
 * and a weight's sign is independent of its input's error. A worst-case sum of magnitudes,
 * sum_j |d out_i / d in_j| E_j, grows by about sqrt(width) at every matmul and gave bounds of
 * 1e14 at the gradients after two layers (measured): no test at all. Errors common to a row
 * (LayerNorm's mean and rstd, attention's lse) enter each element in full.
 * The comparison allows MODEL_SLACK times E: a sum in quadrature is a typical size, not a
 * worst case (a coverage factor of 2, as a measurement's expanded uncertainty), and the bound is
 * first order (products of two errors, each at most a few ub of its value, are left out).
 * How tight, measured under cudasim (GPURUN_TEST_BOUNDS, 50 seeds, both dtypes): the largest
 * |gpu - cpu| / E was 0.38 (lnfb's gradient in bf16; most comparisons under 0.05). E is about
 * 1e-3 of a gradient tensor's largest element in fp32, and 1e-2 to 0.45 of it in bf16, where
 * a step rounds some 40 values to bf16 on each path. Tried on purpose: a layer's LayerNorm
 * reading layer 0's weight, a dropped bias gradient and a loss scaled by 1.01 each fail the
 * fp32 step test; the first two also fail the bf16 one. */
#define MODEL_SLACK 2.0
#define MAX_LAYERS  2

/* GELU's second derivative (tanh form), for the error of its first at an input off by E. */
static double gelu_grad2_d(double x)
{
    double k = 0.7978845608028654, a = 0.044715, z = k * (x + a * x * x * x), t = tanh(z);
    double dz = k * (1.0 + 3.0 * a * x * x);
    return (1.0 - t * t) * (dz - x * t * dz * dz + 3.0 * a * k * x * x);
}

static double sq(double x)
{
    return x * x;
}

static double *dalloc(size_t n)
{
    return hmalloc(n * sizeof(double));
}

static float *falloc(size_t n)
{
    return hmalloc(n * sizeof(float));
}

static float *fcopy(const float *x, size_t n)
{
    float *c = falloc(n);
    memcpy(c, x, n * sizeof(float));
    return c;
}

static void dadd(double *a, const double *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        a[i] += b[i];
}

/* A parameter tensor of the CPU model (layer l of a per-layer one), as gpt2.c's tensor(). */
static float *par(const struct gpt2 *m, float *base, int id, int l)
{
    const struct gpt2_tensor *t = &m->tensors[id];
    bool per_layer = id >= GPT2_LN1W && id <= GPT2_FCPROJB;
    return base + t->offset + (per_layer ? (size_t)l * (t->count / (size_t)m->cfg.n_layer) : 0);
}

/* The own error of a sum of K terms of magnitudes S in fp32 (R2), both sides, on tensor cores
 * in bf16. The bf16 roundings are counted apart, on the values they round (R3: ub |value|),
 * where the ops' tests count them on S (which holds for any intermediate): in the model the
 * values are known, and a gradient's S can be many times its value. */
static double sum_own(enum gpu_dtype dt, double K, double S)
{
    return (dt == GPU_BF16 ? 3.0 : 2.0) * gam(K) * S;
}

/* out = inp W^T + b, (N,C) x (OC,C), out the CPU's: E_out = E_inp through |W| (propagation);
 * own: R2 on the magnitude run |inp| |W|^T + |b|, and in bf16 the product's and the sum's
 * roundings (the plain path rounds both; the epilogue one). */
static void mm_fwd_bounds(enum gpu_dtype dt, const float *inp, const double *E_inp, const float *w,
                          const float *b, const float *out, int N, int C, int OC, double *E_out)
{
    float *mag = falloc((size_t)N * OC);
    CHECK_EQ(ops_matmul_forward(mag, absv(inp, (size_t)N * C), absv(w, (size_t)OC * C),
                                b ? absv(b, OC) : NULL, N, C, OC),
             0);
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            size_t i = (size_t)n * OC + o;
            double e = 0.0, y = out[i];
            for (int c = 0; c < C; c++)
                e += sq(E_inp[(size_t)n * C + c] * w[(size_t)o * C + c]);
            E_out[i] = sqrt(e) + sum_own(dt, C + 1, mag[i]) +
                       ub_of(dt) * (fabs(y) + (b ? fabs(y - b[o]) : 0.0));
        }
}

/* The backward of mm_fwd, gradients accumulating from dw0/db0 to dw1/db1 (the CPU's values
 * before and after):
 *   dinp = dout W:        E_dout through |W|; own R2 over OC terms, bf16's store;
 *   dw += dout^T inp:     E_dout through |inp| and E_inp through |dout|; own R2 over N terms
 *                         and the old value, bf16's store of the new one;
 *   db += sum_n dout:     the E_dout of the column; own likewise.
 * With pre (GELU's input, E_pre), dinp = gelu'(pre) acc, acc = dout W: acc's E through
 * |gelu'|, pre's through |gelu''| |acc|, gelu''s evaluation on both sides (12u on its terms,
 * as in matmul_backward's test), and two bf16 roundings (acc, then the product). */
static void mm_bwd_bounds(enum gpu_dtype dt, const float *dout, const double *E_dout,
                          const float *inp, const double *E_inp, const float *w, const float *dw0,
                          const float *dw1, const float *db0, const float *db1, const float *pre,
                          const double *E_pre, int N, int C, int OC, double *E_dinp, double *E_dw,
                          double *E_db)
{
    size_t ni = (size_t)N * C, nw = (size_t)OC * C, no = (size_t)N * OC;
    float *m_dinp = falloc(ni), *m_dw = absv(dw0, nw), *m_db = db0 ? absv(db0, OC) : NULL;
    double ub = ub_of(dt);

    CHECK_EQ(ops_matmul_backward(m_dinp, m_dw, m_db, absv(dout, no), absv(inp, ni), absv(w, nw), N,
                                 C, OC),
             0);
    if (E_dinp) {
        for (size_t i = 0; i < ni; i++) {
            size_t n = i / (size_t)C, c = i % (size_t)C;
            double e = 0.0, acc = 0.0;
            for (int o = 0; o < OC; o++) {
                e += sq(E_dout[n * OC + o] * w[(size_t)o * C + c]);
                acc += (double)dout[n * OC + o] * w[(size_t)o * C + c];
            }
            e = sqrt(e) + sum_own(dt, OC, m_dinp[i]) + ub * fabs(acc);
            if (pre) {
                double mg, g = fabs(gelu_grad_d(pre[i], &mg));
                e = g * e + fabs(gelu_grad2_d(pre[i]) * acc) * E_pre[i] +
                    12.0 * U32 * mg * m_dinp[i] + ub * g * fabs(acc);
            }
            E_dinp[i] = e;
        }
    }
    for (int o = 0; o < OC; o++)
        for (int c = 0; c < C; c++) {
            size_t i = (size_t)o * C + c;
            double e = 0.0;
            for (int n = 0; n < N; n++)
                e += sq(E_dout[(size_t)n * OC + o] * inp[(size_t)n * C + c]) +
                     sq(dout[(size_t)n * OC + o] * E_inp[(size_t)n * C + c]);
            E_dw[i] += sqrt(e) + sum_own(dt, N + 1, m_dw[i]) + ub * fabs((double)dw1[i]);
        }
    if (db0) {
        for (int o = 0; o < OC; o++) {
            double e = 0.0;
            for (int n = 0; n < N; n++)
                e += sq(E_dout[(size_t)n * OC + o]);
            E_db[o] += sqrt(e) + 2.0 * gam(N + 1) * m_db[o] + ub * fabs((double)db1[o]);
        }
    }
}

/* LayerNorm forward, with n_c = (x_c - mean) rstd and Eb the row's mean of E_x: the mean
 * moves by at most Eb; the variance by (2/C) sum |x_c - mean| (E_c + Eb), so rstd (var^-1/2)
 * by rstd^2 Dn, Dn = mean_c |n_c| (E_c + Eb); n_c by rstd (E_c + Eb + |n_c| Dn), and the
 * output by |w_c| that. Plus layernorm_limits (own). */
static void ln_fwd_bounds(enum gpu_dtype dt, const float *x, const double *E_x, const float *w,
                          const float *b, const float *mean, const float *rstd, int N, int C,
                          double *E_out, double *E_mean, double *E_rstd)
{
    layernorm_limits(dt, x, w, b, mean, rstd, N, C, E_out, E_mean, E_rstd);
    for (int n = 0; n < N; n++) {
        const float *xr = x + (size_t)n * C;
        const double *er = E_x + (size_t)n * C;
        double r = rstd[n], Eb = 0.0, Dn = 0.0;
        for (int c = 0; c < C; c++)
            Eb += sq(er[c]);
        Eb = sqrt(Eb) / C;
        for (int c = 0; c < C; c++)
            Dn += sq(((double)xr[c] - mean[n]) * r * (er[c] + Eb));
        Dn = sqrt(Dn) / C;
        E_mean[n] += Eb;
        E_rstd[n] += r * r * Dn;
        for (int c = 0; c < C; c++) {
            double nn = fabs(((double)xr[c] - mean[n]) * r);
            E_out[(size_t)n * C + c] += fabs((double)w[c]) * r * (er[c] + Eb + nn * Dn);
        }
    }
}

/* LayerNorm backward (ops.h's formula), from the GPU's x, mean and rstd (off by E_x, E_mean,
 * E_rstd) and dout (E_dout), accumulating: with g_c = w_c dout_c and n_c as above, n_c is off
 * by En_c = rstd (E_c + E_mean) + |x_c - mean| E_rstd, g_c by |w_c| E_dout_c, the means by
 * the means of those; dinp_c = rstd (g_c - mean(g) - n_c mean(g n)) by E_rstd |dinp_c| / rstd
 * + rstd (Eg_c + mean(Eg) + En_c |mean(g n)| + |n_c| mean(Eg |n| + |g| En)); dw_c by
 * sum_rows E_dout |n| + |dout| En; db_c by sum_rows E_dout. Plus layernorm_backward_limits'
 * fp32 part (own) with the old values dinp0, dw0, db0, and bf16's stores of the new ones
 * dinp1, dw1, db1 (the CPU's). */
static void ln_bwd_bounds(enum gpu_dtype dt, const float *dout, const double *E_dout,
                          const float *x, const double *E_x, const float *w, const float *mean,
                          const double *E_mean, const float *rstd, const double *E_rstd,
                          const float *dinp0, const float *dinp1, const float *dw0,
                          const float *dw1, const float *db0, const float *db1, int N, int C,
                          double *E_dinp, double *E_dw, double *E_db)
{
    double ub = ub_of(dt);
    double *l_dinp = dalloc((size_t)N * C), *l_dw = dalloc(C), *l_db = dalloc(C);
    double *En = dalloc(C), *Eg = dalloc(C), *Qw = dzero(C), *Qb = dzero(C);

    layernorm_backward_limits(GPU_F32, dout, x, w, mean, rstd, dinp0, dw0, db0, N, C, l_dinp, l_dw,
                              l_db);
    for (int n = 0; n < N; n++) {
        size_t o = (size_t)n * C;
        double r = rstd[n], gb = 0.0, gnb = 0.0, Egb = 0.0, Egn = 0.0;
        for (int c = 0; c < C; c++) {
            double xm = (double)x[o + c] - mean[n], nn = xm * r, g = (double)w[c] * dout[o + c];
            En[c] = r * (E_x[o + c] + E_mean[n]) + fabs(xm) * E_rstd[n];
            Eg[c] = fabs((double)w[c]) * E_dout[o + c];
            gb += g / C;
            gnb += g * nn / C;
            Egb += sq(Eg[c]);
            Egn += sq(Eg[c] * nn) + sq(g * En[c]);
        }
        Egb = sqrt(Egb) / C;
        Egn = sqrt(Egn) / C;
        for (int c = 0; c < C; c++) {
            double xm = (double)x[o + c] - mean[n], nn = xm * r, g = (double)w[c] * dout[o + c];
            E_dinp[o + c] += E_rstd[n] * fabs(g - gb - nn * gnb) +
                             r * (Eg[c] + Egb + En[c] * fabs(gnb) + fabs(nn) * Egn) +
                             l_dinp[o + c] + ub * fabs((double)dinp1[o + c]);
            Qw[c] += sq(E_dout[o + c] * nn) + sq(dout[o + c] * En[c]);
            Qb[c] += sq(E_dout[o + c]);
        }
    }
    for (int c = 0; c < C; c++) {
        E_dw[c] += sqrt(Qw[c]) + l_dw[c] + ub * fabs((double)dw1[c]);
        E_db[c] += sqrt(Qb[c]) + l_db[c] + ub * fabs((double)db1[c]);
    }
}

/* Attention's scores s[t, t2] = q_t . k_t2 / sqrt(hs) are off by Es = sum_i (E_q |k| + |q| E_k)
 * / sqrt(hs). For head h of sequence b, into Es (T x T, rows t, t2 <= t). */
static void scores_err(const float *qkv, const double *E_qkv, int b, int h, int T, int C, int NH,
                       double *Es)
{
    int hs = C / NH;
    double rs = 1.0 / sqrt((double)hs);
    for (int t = 0; t < T; t++)
        for (int t2 = 0; t2 <= t; t2++) {
            size_t q = ((size_t)b * T + t) * 3 * C + (size_t)h * hs;
            size_t k = ((size_t)b * T + t2) * 3 * C + C + (size_t)h * hs;
            double e = 0.0;
            for (int i = 0; i < hs; i++)
                e += sq(E_qkv[q + i] * qkv[k + i]) + sq(qkv[q + i] * E_qkv[k + i]);
            Es[(size_t)t * T + t2] = sqrt(e) * rs;
        }
}

/* Attention forward: p = softmax(s) moves by p (Es + sum p Es) (its derivative), lse by
 * sum p Es, out = sum p v by sum (Ep |v| + p E_v). E_out_p and E_lse_p: the propagated part
 * alone (the backward's own limit has the forward's own errors in it); E_out and E_lse add
 * attention_limits' own. */
static void att_fwd_bounds(enum gpu_dtype dt, const float *qkv, const double *E_qkv,
                           const float *att, const float *lse, const float *out, int B, int T,
                           int C, int NH, double *E_out, double *E_lse, double *E_out_p,
                           double *E_lse_p)
{
    int hs = C / NH;
    size_t TT = (size_t)T * T, nout = (size_t)B * T * C, nl = (size_t)B * NH * T;
    double *Es = dalloc(TT), *Ep = dalloc(TT);

    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const float *P = att + ((size_t)b * NH + h) * TT;
            scores_err(qkv, E_qkv, b, h, T, C, NH, Es);
            for (int t = 0; t < T; t++) {
                double ps = 0.0;
                for (int t2 = 0; t2 <= t; t2++)
                    ps += sq(P[(size_t)t * T + t2] * Es[(size_t)t * T + t2]);
                ps = sqrt(ps);
                for (int t2 = 0; t2 <= t; t2++)
                    Ep[(size_t)t * T + t2] = P[(size_t)t * T + t2] * (Es[(size_t)t * T + t2] + ps);
                E_lse_p[((size_t)b * NH + h) * T + t] = ps;
                for (int i = 0; i < hs; i++) {
                    double e = 0.0;
                    for (int t2 = 0; t2 <= t; t2++) {
                        size_t v = ((size_t)b * T + t2) * 3 * C + 2 * C + (size_t)h * hs + i;
                        e += sq(Ep[(size_t)t * T + t2] * qkv[v]) +
                             sq(P[(size_t)t * T + t2] * E_qkv[v]);
                    }
                    E_out_p[((size_t)b * T + t) * C + (size_t)h * hs + i] = sqrt(e);
                }
            }
        }
    /* The own limits of the forward (those of the backward, with a zero dout, unused). */
    attention_limits(dt, qkv, att, lse, out, falloc(nout), B, T, C, NH, E_out, E_lse,
                     dalloc(3 * nout));
    dadd(E_out, E_out_p, nout);
    dadd(E_lse, E_lse_p, nl);
}

/* Attention backward from the GPU's out and lse (off by their propagated E_out_p, E_lse_p):
 * p = exp(s - lse) by p (Es + E_lse); D_t = dout_t . out_t by sum (E_dout |out| + |dout| E_out);
 * dP = dout_t . v_t2 by sum (E_dout |v| + |dout| E_v); dS = p (dP - D) by Ep |dP - D| +
 * p (EdP + ED); dq = sum dS k / sqrt(hs) by sum (EdS |k| + |dS| E_k) / sqrt(hs), dk likewise
 * with q, dv = sum p dout by sum (Ep |dout| + p E_dout). Plus attention_limits' own. */
static void att_bwd_bounds(enum gpu_dtype dt, const float *qkv, const double *E_qkv,
                           const float *att, const float *lse, const float *out,
                           const double *E_out_p, const double *E_lse_p, const float *dout,
                           const double *E_dout, int B, int T, int C, int NH, double *E_dqkv)
{
    int hs = C / NH;
    double rs = 1.0 / sqrt((double)hs);
    size_t TT = (size_t)T * T, nout = (size_t)B * T * C, nl = (size_t)B * NH * T;
    double *Es = dalloc(TT), *Ep = dalloc(TT), *dS = dalloc(TT), *EdS = dalloc(TT);

    attention_limits(dt, qkv, att, lse, out, dout, B, T, C, NH, dalloc(nout), dalloc(nl), E_dqkv);
#define QV(t, part, i)                                                                             \
    ((size_t)((size_t)b * T + (t)) * 3 * C + (size_t)(part)*C + (size_t)h * hs + (i))
#define OV(t, i) (((size_t)b * T + (t)) * C + (size_t)h * hs + (i))
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const float *P = att + ((size_t)b * NH + h) * TT;
            scores_err(qkv, E_qkv, b, h, T, C, NH, Es);
            for (int t = 0; t < T; t++) {
                double D = 0.0, ED = 0.0, El = E_lse_p[((size_t)b * NH + h) * T + t];
                for (int i = 0; i < hs; i++) {
                    D += (double)dout[OV(t, i)] * out[OV(t, i)];
                    ED += sq(E_dout[OV(t, i)] * out[OV(t, i)]) +
                          sq(dout[OV(t, i)] * E_out_p[OV(t, i)]);
                }
                ED = sqrt(ED);
                for (int t2 = 0; t2 <= t; t2++) {
                    size_t k = (size_t)t * T + t2;
                    double dP = 0.0, EdP = 0.0;
                    for (int i = 0; i < hs; i++) {
                        dP += (double)dout[OV(t, i)] * qkv[QV(t2, 2, i)];
                        EdP += sq(E_dout[OV(t, i)] * qkv[QV(t2, 2, i)]) +
                               sq(dout[OV(t, i)] * E_qkv[QV(t2, 2, i)]);
                    }
                    EdP = sqrt(EdP);
                    Ep[k] = P[k] * (Es[k] + El);
                    dS[k] = P[k] * (dP - D);
                    EdS[k] = Ep[k] * fabs(dP - D) + P[k] * (EdP + ED);
                }
            }
            for (int t = 0; t < T; t++)
                for (int i = 0; i < hs; i++) {
                    double eq = 0.0;
                    for (int t2 = 0; t2 <= t; t2++) {
                        size_t k = (size_t)t * T + t2;
                        eq += sq(EdS[k] * qkv[QV(t2, 1, i)]) + sq(dS[k] * E_qkv[QV(t2, 1, i)]);
                    }
                    E_dqkv[QV(t, 0, i)] += sqrt(eq) * rs;
                }
            for (int t2 = 0; t2 < T; t2++)
                for (int i = 0; i < hs; i++) {
                    double ek = 0.0, ev = 0.0;
                    for (int t = t2; t < T; t++) {
                        size_t k = (size_t)t * T + t2;
                        ek += sq(EdS[k] * qkv[QV(t, 0, i)]) + sq(dS[k] * E_qkv[QV(t, 0, i)]);
                        ev += sq(Ep[k] * dout[OV(t, i)]) + sq(P[k] * E_dout[OV(t, i)]);
                    }
                    E_dqkv[QV(t2, 1, i)] += sqrt(ek) * rs;
                    E_dqkv[QV(t2, 2, i)] += sqrt(ev);
                }
        }
#undef QV
#undef OV
}

/* Cross-entropy, fused (the loss and, in place, dlogits = dloss (p - onehot)): lse moves by
 * sum p E_logit, a loss by that and its target logit's E, p_j by p_j (E_j + sum p E), so
 * dlogits_j by dloss p_j (E_j + sum p E). Plus crossentropy_limits' own (the fused kernel's). */
static void ce_bounds(enum gpu_dtype dt, const float *logits, const double *E_logits,
                      const int *targets, const float *lse, const float *losses, int N, int V,
                      int Vp, float dloss, double *E_losses, double *E_d)
{
    double *l_lse = dalloc(N);

    crossentropy_limits(dt, logits, targets, lse, losses, N, V, Vp, dloss, l_lse, E_losses, E_d);
    for (int r = 0; r < N; r++) {
        const float *x = logits + (size_t)r * Vp;
        double ps = 0.0;
        for (int j = 0; j < V; j++)
            ps += sq(exp((double)x[j] - lse[r]) * E_logits[(size_t)r * Vp + j]);
        ps = sqrt(ps);
        E_losses[r] += ps + E_logits[(size_t)r * Vp + targets[r]];
        for (int j = 0; j < V; j++)
            E_d[(size_t)r * Vp + j] +=
                dloss * exp((double)x[j] - lse[r]) * (E_logits[(size_t)r * Vp + j] + ps);
    }
}

/* One layer's values and bounds (CPU values, E: bounds on |gpu - cpu|). */
struct shadow_layer {
    const float *x; /* the block's input: the encoding or the last block's residual3 */
    const double *E_x;
    float *ln1, *ln1_mean, *ln1_rstd, *qkv, *att, *lse, *atty, *res2, *ln2, *ln2_mean, *ln2_rstd;
    float *pre, *gelu, *gelu_grad, *res3;
    double *E_ln1, *E_ln1_mean, *E_ln1_rstd, *E_qkv, *E_atty, *E_lse, *E_atty_p, *E_lse_p;
    double *E_res2, *E_ln2, *E_ln2_mean, *E_ln2_rstd, *E_pre, *E_gelu, *E_res3;
};

/* The shadow run of one forward (and backward) of the CPU model m on (B, T) tokens. */
struct shadow {
    enum gpu_dtype dt;
    struct gpt2 *m;
    int B, T;
    const int *in, *tg;
    float *enc, *lnf, *lnf_mean, *lnf_rstd, *logits, *ce_lse, *losses;
    double *E_enc, *E_lnf, *E_lnf_mean, *E_lnf_rstd, *E_logits, *E_losses;
    struct shadow_layer lay[MAX_LAYERS];
    float loss; /* the mean loss (with targets) */
    double E_loss;
};

/* A residual addition out = a + b: E_a + E_b, and each side's rounding of the sum (u in fp32;
 * the GPU's bf16 store, ub). */
static float *residual_bounds(enum gpu_dtype dt, const float *a, const double *E_a, const float *b,
                              const double *E_b, size_t n, double **E_out)
{
    float *out = falloc(n);
    ops_residual_forward(out, a, b, n);
    *E_out = dalloc(n);
    for (size_t i = 0; i < n; i++)
        (*E_out)[i] = E_a[i] + E_b[i] + (2.0 * U32 + ub_of(dt)) * fabs((double)out[i]);
    return out;
}

/* The forward, as gpt2_forward (targets may be NULL: no loss). */
static void shadow_forward(struct shadow *s, enum gpu_dtype dt, struct gpt2 *m, const int *in,
                           const int *tg, int B, int T)
{
    const struct gpt2_config *c = &m->cfg;
    int C = c->n_embd, L = c->n_layer, NH = c->n_head, V = c->vocab_size, Vp = c->padded_vocab_size;
    size_t bt = (size_t)B * T, btc = bt * C;
    float *p = m->params;

    CHECK_INT(L, <=, MAX_LAYERS);
    *s = (struct shadow){.dt = dt, .m = m, .B = B, .T = T, .in = in, .tg = tg};
    s->enc = falloc(btc);
    ops_encoder_forward(s->enc, in, par(m, p, GPT2_WTE, 0), par(m, p, GPT2_WPE, 0), B, T, C);
    /* One fp32 addition of the same weights on both sides: the same value, but for bf16's
     * store. */
    s->E_enc = dalloc(btc);
    for (size_t i = 0; i < btc; i++)
        s->E_enc[i] = ub_of(dt) * fabs((double)s->enc[i]);

    for (int l = 0; l < L; l++) {
        struct shadow_layer *y = &s->lay[l];
        y->x = l ? s->lay[l - 1].res3 : s->enc;
        y->E_x = l ? s->lay[l - 1].E_res3 : s->E_enc;
        y->ln1 = falloc(btc), y->ln1_mean = falloc(bt), y->ln1_rstd = falloc(bt);
        y->E_ln1 = dalloc(btc), y->E_ln1_mean = dalloc(bt), y->E_ln1_rstd = dalloc(bt);
        ops_layernorm_forward(y->ln1, y->ln1_mean, y->ln1_rstd, y->x, par(m, p, GPT2_LN1W, l),
                              par(m, p, GPT2_LN1B, l), (int)bt, C);
        ln_fwd_bounds(dt, y->x, y->E_x, par(m, p, GPT2_LN1W, l), par(m, p, GPT2_LN1B, l),
                      y->ln1_mean, y->ln1_rstd, (int)bt, C, y->E_ln1, y->E_ln1_mean, y->E_ln1_rstd);

        y->qkv = falloc(3 * btc), y->E_qkv = dalloc(3 * btc);
        CHECK_EQ(ops_matmul_forward(y->qkv, y->ln1, par(m, p, GPT2_QKVW, l),
                                    par(m, p, GPT2_QKVB, l), (int)bt, C, 3 * C),
                 0);
        mm_fwd_bounds(dt, y->ln1, y->E_ln1, par(m, p, GPT2_QKVW, l), par(m, p, GPT2_QKVB, l),
                      y->qkv, (int)bt, C, 3 * C, y->E_qkv);

        size_t nl = bt * NH;
        y->atty = falloc(btc), y->att = falloc(nl * T), y->lse = falloc(nl);
        y->E_atty = dalloc(btc), y->E_lse = dalloc(nl), y->E_atty_p = dalloc(btc);
        y->E_lse_p = dalloc(nl);
        CHECK_EQ(ops_attention_forward(y->atty, y->att, y->qkv, B, T, C, NH), 0);
        ref_lse(y->lse, y->qkv, B, T, C, NH);
        att_fwd_bounds(dt, y->qkv, y->E_qkv, y->att, y->lse, y->atty, B, T, C, NH, y->E_atty,
                       y->E_lse, y->E_atty_p, y->E_lse_p);

        float *proj = falloc(btc);
        double *E_proj = dalloc(btc);
        CHECK_EQ(ops_matmul_forward(proj, y->atty, par(m, p, GPT2_ATTPROJW, l),
                                    par(m, p, GPT2_ATTPROJB, l), (int)bt, C, C),
                 0);
        mm_fwd_bounds(dt, y->atty, y->E_atty, par(m, p, GPT2_ATTPROJW, l),
                      par(m, p, GPT2_ATTPROJB, l), proj, (int)bt, C, C, E_proj);
        y->res2 = residual_bounds(dt, proj, E_proj, y->x, y->E_x, btc, &y->E_res2);

        y->ln2 = falloc(btc), y->ln2_mean = falloc(bt), y->ln2_rstd = falloc(bt);
        y->E_ln2 = dalloc(btc), y->E_ln2_mean = dalloc(bt), y->E_ln2_rstd = dalloc(bt);
        ops_layernorm_forward(y->ln2, y->ln2_mean, y->ln2_rstd, y->res2, par(m, p, GPT2_LN2W, l),
                              par(m, p, GPT2_LN2B, l), (int)bt, C);
        ln_fwd_bounds(dt, y->res2, y->E_res2, par(m, p, GPT2_LN2W, l), par(m, p, GPT2_LN2B, l),
                      y->ln2_mean, y->ln2_rstd, (int)bt, C, y->E_ln2, y->E_ln2_mean, y->E_ln2_rstd);

        /* fc with GELU in its epilogue: pre's bound is the matmul's (two roundings: the
         * epilogue's aux, or the plain path's product then bias); GELU's output moves by
         * |gelu'(pre)| that, its evaluation on both sides 12u |pre|, and bf16's store. */
        y->pre = falloc(4 * btc), y->gelu = falloc(4 * btc), y->gelu_grad = falloc(4 * btc);
        y->E_pre = dalloc(4 * btc), y->E_gelu = dalloc(4 * btc);
        CHECK_EQ(ops_matmul_forward(y->pre, y->ln2, par(m, p, GPT2_FCW, l), par(m, p, GPT2_FCB, l),
                                    (int)bt, C, 4 * C),
                 0);
        mm_fwd_bounds(dt, y->ln2, y->E_ln2, par(m, p, GPT2_FCW, l), par(m, p, GPT2_FCB, l), y->pre,
                      (int)bt, C, 4 * C, y->E_pre);
        ops_gelu_forward_grad(y->gelu, y->gelu_grad, y->pre, 4 * btc);
        for (size_t i = 0; i < 4 * btc; i++)
            y->E_gelu[i] = fabs(gelu_grad_d(y->pre[i], NULL)) * y->E_pre[i] +
                           12.0 * U32 * fabs((double)y->pre[i]) +
                           ub_of(dt) * fabs(gelu_d(y->pre[i]));

        float *fp = falloc(btc);
        double *E_fp = dalloc(btc);
        CHECK_EQ(ops_matmul_forward(fp, y->gelu, par(m, p, GPT2_FCPROJW, l),
                                    par(m, p, GPT2_FCPROJB, l), (int)bt, 4 * C, C),
                 0);
        mm_fwd_bounds(dt, y->gelu, y->E_gelu, par(m, p, GPT2_FCPROJW, l),
                      par(m, p, GPT2_FCPROJB, l), fp, (int)bt, 4 * C, C, E_fp);
        y->res3 = residual_bounds(dt, fp, E_fp, y->res2, y->E_res2, btc, &y->E_res3);
    }
    const struct shadow_layer *last = &s->lay[L - 1];
    s->lnf = falloc(btc), s->lnf_mean = falloc(bt), s->lnf_rstd = falloc(bt);
    s->E_lnf = dalloc(btc), s->E_lnf_mean = dalloc(bt), s->E_lnf_rstd = dalloc(bt);
    ops_layernorm_forward(s->lnf, s->lnf_mean, s->lnf_rstd, last->res3, par(m, p, GPT2_LNFW, 0),
                          par(m, p, GPT2_LNFB, 0), (int)bt, C);
    ln_fwd_bounds(dt, last->res3, last->E_res3, par(m, p, GPT2_LNFW, 0), par(m, p, GPT2_LNFB, 0),
                  s->lnf_mean, s->lnf_rstd, (int)bt, C, s->E_lnf, s->E_lnf_mean, s->E_lnf_rstd);
    s->logits = falloc(bt * Vp), s->E_logits = dalloc(bt * Vp);
    CHECK_EQ(ops_matmul_forward(s->logits, s->lnf, par(m, p, GPT2_WTE, 0), NULL, (int)bt, C, Vp),
             0);
    mm_fwd_bounds(dt, s->lnf, s->E_lnf, par(m, p, GPT2_WTE, 0), NULL, s->logits, (int)bt, C, Vp,
                  s->E_logits);
    if (!tg)
        return;

    s->ce_lse = falloc(bt), s->losses = falloc(bt), s->E_losses = dalloc(bt);
    ops_crossentropy_forward(s->losses, s->ce_lse, s->logits, tg, (int)bt, V, Vp);
    double sum = 0.0;
    for (size_t i = 0; i < bt; i++)
        sum += s->losses[i];
    s->loss = (float)(sum / (double)bt);
    /* The losses' bounds (ce_bounds' dlogits part unused here), and the mean's: each side
     * sums in double and rounds the mean to fp32. */
    ce_bounds(dt, s->logits, s->E_logits, tg, s->ce_lse, s->losses, (int)bt, V, Vp, 1.0f,
              s->E_losses, dalloc(bt * Vp));
    s->E_loss = 2.0 * U32 * fabs((double)s->loss);
    for (size_t i = 0; i < bt; i++)
        s->E_loss += s->E_losses[i] / (double)bt;
}

/* The backward with grad_scale, as gpt2_backward, into grads (the CPU model's gradients
 * before it: they accumulate) and their bounds E_g (accumulating too). */
static void shadow_backward(struct shadow *s, float grad_scale, float *grads, double *E_g)
{
    struct gpt2 *m = s->m;
    enum gpu_dtype dt = s->dt;
    const struct gpt2_config *c = &m->cfg;
    int C = c->n_embd, L = c->n_layer, NH = c->n_head, V = c->vocab_size, Vp = c->padded_vocab_size;
    int B = s->B, T = s->T;
    size_t bt = (size_t)B * T, btc = bt * C;
    float *p = m->params, dloss = grad_scale / (float)bt;
    double *E_d = dalloc(bt * Vp);

#define G(id, l)      par(m, grads, id, l)
#define EG(id, l)     (E_g + (par(m, grads, id, l) - grads))
#define OLD(id, l, n) fcopy(G(id, l), n)
    ce_bounds(dt, s->logits, s->E_logits, s->tg, s->ce_lse, s->losses, (int)bt, V, Vp, dloss,
              dalloc(bt), E_d);
    float *dlogits = falloc(bt * Vp);
    ops_crossentropy_backward(dlogits, s->logits, s->ce_lse, s->tg, (int)bt, V, Vp, dloss);

    float *dbuf = falloc(4 * btc), *dres = falloc(btc), *dqkv = falloc(3 * btc);
    double *E_dbuf = dalloc(4 * btc), *E_dres = dzero(btc), *E_dqkv = dalloc(3 * btc);
    size_t nwte = (size_t)Vp * C;
    float *wte0 = OLD(GPT2_WTE, 0, nwte);
    CHECK_EQ(ops_matmul_backward(dbuf, G(GPT2_WTE, 0), NULL, dlogits, s->lnf,
                                 par(m, p, GPT2_WTE, 0), (int)bt, C, Vp),
             0);
    mm_bwd_bounds(dt, dlogits, E_d, s->lnf, s->E_lnf, par(m, p, GPT2_WTE, 0), wte0, G(GPT2_WTE, 0),
                  NULL, NULL, NULL, NULL, (int)bt, C, Vp, E_dbuf, EG(GPT2_WTE, 0), NULL);

    const struct shadow_layer *last = &s->lay[L - 1];
    float *dres0 = fcopy(dres, btc), *w0 = OLD(GPT2_LNFW, 0, C), *b0 = OLD(GPT2_LNFB, 0, C);
    ops_layernorm_backward(dres, G(GPT2_LNFW, 0), G(GPT2_LNFB, 0), dbuf, last->res3,
                           par(m, p, GPT2_LNFW, 0), s->lnf_mean, s->lnf_rstd, (int)bt, C);
    ln_bwd_bounds(dt, dbuf, E_dbuf, last->res3, last->E_res3, par(m, p, GPT2_LNFW, 0), s->lnf_mean,
                  s->E_lnf_mean, s->lnf_rstd, s->E_lnf_rstd, dres0, dres, w0, G(GPT2_LNFW, 0), b0,
                  G(GPT2_LNFB, 0), (int)bt, C, E_dres, EG(GPT2_LNFW, 0), EG(GPT2_LNFB, 0));

    for (int l = L - 1; l >= 0; l--) {
        const struct shadow_layer *y = &s->lay[l];
        size_t C2 = (size_t)C * C;

        /* MLP projection, its dinp through GELU's derivative. */
        float *ow = OLD(GPT2_FCPROJW, l, 4 * C2), *ob = OLD(GPT2_FCPROJB, l, C);
        CHECK_EQ(ops_matmul_backward(dbuf, G(GPT2_FCPROJW, l), G(GPT2_FCPROJB, l), dres, y->gelu,
                                     par(m, p, GPT2_FCPROJW, l), (int)bt, 4 * C, C),
                 0);
        ops_gelu_backward_grad(dbuf, y->gelu_grad, dbuf, 4 * btc);
        mm_bwd_bounds(dt, dres, E_dres, y->gelu, y->E_gelu, par(m, p, GPT2_FCPROJW, l), ow,
                      G(GPT2_FCPROJW, l), ob, G(GPT2_FCPROJB, l), y->pre, y->E_pre, (int)bt, 4 * C,
                      C, E_dbuf, EG(GPT2_FCPROJW, l), EG(GPT2_FCPROJB, l));

        float *dln = falloc(btc);
        double *E_dln = dalloc(btc);
        ow = OLD(GPT2_FCW, l, 4 * C2), ob = OLD(GPT2_FCB, l, 4 * C);
        CHECK_EQ(ops_matmul_backward(dln, G(GPT2_FCW, l), G(GPT2_FCB, l), dbuf, y->ln2,
                                     par(m, p, GPT2_FCW, l), (int)bt, C, 4 * C),
                 0);
        mm_bwd_bounds(dt, dbuf, E_dbuf, y->ln2, y->E_ln2, par(m, p, GPT2_FCW, l), ow,
                      G(GPT2_FCW, l), ob, G(GPT2_FCB, l), NULL, NULL, (int)bt, C, 4 * C, E_dln,
                      EG(GPT2_FCW, l), EG(GPT2_FCB, l));

        dres0 = fcopy(dres, btc), w0 = OLD(GPT2_LN2W, l, C), b0 = OLD(GPT2_LN2B, l, C);
        ops_layernorm_backward(dres, G(GPT2_LN2W, l), G(GPT2_LN2B, l), dln, y->res2,
                               par(m, p, GPT2_LN2W, l), y->ln2_mean, y->ln2_rstd, (int)bt, C);
        ln_bwd_bounds(dt, dln, E_dln, y->res2, y->E_res2, par(m, p, GPT2_LN2W, l), y->ln2_mean,
                      y->E_ln2_mean, y->ln2_rstd, y->E_ln2_rstd, dres0, dres, w0, G(GPT2_LN2W, l),
                      b0, G(GPT2_LN2B, l), (int)bt, C, E_dres, EG(GPT2_LN2W, l), EG(GPT2_LN2B, l));

        float *datty = falloc(btc);
        double *E_datty = dalloc(btc);
        ow = OLD(GPT2_ATTPROJW, l, C2), ob = OLD(GPT2_ATTPROJB, l, C);
        CHECK_EQ(ops_matmul_backward(datty, G(GPT2_ATTPROJW, l), G(GPT2_ATTPROJB, l), dres, y->atty,
                                     par(m, p, GPT2_ATTPROJW, l), (int)bt, C, C),
                 0);
        mm_bwd_bounds(dt, dres, E_dres, y->atty, y->E_atty, par(m, p, GPT2_ATTPROJW, l), ow,
                      G(GPT2_ATTPROJW, l), ob, G(GPT2_ATTPROJB, l), NULL, NULL, (int)bt, C, C,
                      E_datty, EG(GPT2_ATTPROJW, l), EG(GPT2_ATTPROJB, l));

        CHECK_EQ(ops_attention_backward(dqkv, datty, y->qkv, y->att, B, T, C, NH), 0);
        att_bwd_bounds(dt, y->qkv, y->E_qkv, y->att, y->lse, y->atty, y->E_atty_p, y->E_lse_p,
                       datty, E_datty, B, T, C, NH, E_dqkv);

        ow = OLD(GPT2_QKVW, l, 3 * C2), ob = OLD(GPT2_QKVB, l, 3 * C);
        CHECK_EQ(ops_matmul_backward(dln, G(GPT2_QKVW, l), G(GPT2_QKVB, l), dqkv, y->ln1,
                                     par(m, p, GPT2_QKVW, l), (int)bt, C, 3 * C),
                 0);
        mm_bwd_bounds(dt, dqkv, E_dqkv, y->ln1, y->E_ln1, par(m, p, GPT2_QKVW, l), ow,
                      G(GPT2_QKVW, l), ob, G(GPT2_QKVB, l), NULL, NULL, (int)bt, C, 3 * C, E_dln,
                      EG(GPT2_QKVW, l), EG(GPT2_QKVB, l));

        dres0 = fcopy(dres, btc), w0 = OLD(GPT2_LN1W, l, C), b0 = OLD(GPT2_LN1B, l, C);
        ops_layernorm_backward(dres, G(GPT2_LN1W, l), G(GPT2_LN1B, l), dln, y->x,
                               par(m, p, GPT2_LN1W, l), y->ln1_mean, y->ln1_rstd, (int)bt, C);
        ln_bwd_bounds(dt, dln, E_dln, y->x, y->E_x, par(m, p, GPT2_LN1W, l), y->ln1_mean,
                      y->E_ln1_mean, y->ln1_rstd, y->E_ln1_rstd, dres0, dres, w0, G(GPT2_LN1W, l),
                      b0, G(GPT2_LN1B, l), (int)bt, C, E_dres, EG(GPT2_LN1W, l), EG(GPT2_LN1B, l));
    }

    /* The encoder: each row of dres added into its token's row of dwte and its position's of
     * dwpe: E_dres of the rows added, R2 on the old value and the rows, bf16's store. */
    size_t nwpe = (size_t)c->max_seq_len * C;
    float *mte = absv(G(GPT2_WTE, 0), nwte), *mpe = absv(G(GPT2_WPE, 0), nwpe);
    ops_encoder_backward(mte, mpe, absv(dres, btc), s->in, B, T, C);
    ops_encoder_backward(G(GPT2_WTE, 0), G(GPT2_WPE, 0), dres, s->in, B, T, C);
    double *q_te = dzero(nwte), *q_pe = dzero(nwpe);
    for (size_t i = 0; i < bt; i++)
        for (int k = 0; k < C; k++) {
            q_te[(size_t)s->in[i] * C + k] += sq(E_dres[i * C + k]);
            q_pe[(i % (size_t)T) * C + k] += sq(E_dres[i * C + k]);
        }
    for (size_t i = 0; i < nwte; i++)
        EG(GPT2_WTE, 0)
    [i] += sqrt(q_te[i]) + 2.0 * gam((double)bt + 1) * mte[i] +
           ub_of(dt) * fabs((double)G(GPT2_WTE, 0)[i]);
    for (size_t i = 0; i < nwpe; i++)
        EG(GPT2_WPE, 0)
    [i] += sqrt(q_pe[i]) + 2.0 * gam(B + 1) * mpe[i] + ub_of(dt) * fabs((double)G(GPT2_WPE, 0)[i]);
#undef G
#undef EG
#undef OLD
}

/* Every parameter tensor of got (n_params floats in gpt2's layout) against ref, each element
 * within its bound E (times MODEL_SLACK), named. */
static void within_tensors(const char *file, int line, const char *what,
                           const struct gpt2_tensor *tensors, const float *got, const float *ref,
                           const double *E)
{
    for (int i = 0; i < GPT2_NUM_TENSORS; i++) {
        char name[64];
        snprintf(name, sizeof(name), "%s %s", what, tensors[i].name);
        within(file, line, name, got + tensors[i].offset, ref + tensors[i].offset,
               E + tensors[i].offset, tensors[i].count, MODEL_SLACK);
    }
}

#define WITHIN_TENSORS(what, tensors, got, ref, E)                                                 \
    within_tensors(__FILE__, __LINE__, what, tensors, got, ref, E)

static void check_loss(const char *what, float got, float ref, double E)
{
    double e = fabs((double)got - ref);
    if (!(e <= MODEL_SLACK * E))
        test_fail(__FILE__, __LINE__, "%s: gpu %.9g vs cpu %.9g (|diff| %.3g > bound %.3g)", what,
                  (double)got, (double)ref, e, MODEL_SLACK * E);
}

/* The shadow run gives the CPU model's own values: its logits (after a forward) or its
 * gradients (after a backward), bit for bit, or the bounds would be of another computation. */
static void shadow_check(const char *what, const float *shadow, const float *model, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (memcmp(&shadow[i], &model[i], sizeof(float)))
            test_fail(__FILE__, __LINE__, "shadow run's %s[%zu] %.9g, the CPU model's %.9g", what,
                      i, (double)shadow[i], (double)model[i]);
}

/* ---- the training step --------------------------------------------------------------------- */

/* One forward_backward against gpt2_forward + gpt2_backward: the loss and every gradient
 * tensor (padding rows of wte and the unused rows of wpe included) within their bounds, and in
 * fp32 a second run giving the same bits. */
static void step(enum gpu_dtype dt)
{
    struct gpt2 cpu;
    struct shadow sh;
    int B = B_CAP, T = T_CAP, n = B * T;
    float loss_cpu = 0.0f, loss = 0.0f, loss2 = 0.0f;

    cpu_model(&cpu, dt);
    struct gpt2_gpu_opts o = opts_of(dt);
    struct gpt2_gpu *m = gpu_model(&o, &cpu);
    int *in = random_tokens(n), *tg = random_tokens(n);
    size_t np = cpu.n_params;
    float *g = hmalloc(np * sizeof(float)), *g2 = hmalloc(np * sizeof(float));
    float *sg = hmalloc(np * sizeof(float));
    double *E_g = hmalloc(np * sizeof(double));

    CHECK_EQ(gpt2_forward(&cpu, in, tg, B, T, &loss_cpu), 0);
    gpt2_zero_grad(&cpu);
    CHECK_EQ(gpt2_backward(&cpu, 1.0f), 0);
    shadow_forward(&sh, dt, &cpu, in, tg, B, T);
    shadow_backward(&sh, 1.0f, sg, E_g);
    shadow_check("loss", &sh.loss, &loss_cpu, 1);
    shadow_check("grads", sg, cpu.grads, np);

    CHECK_GPU(gpt2_gpu_zero_grad(m));
    CHECK_GPU(gpt2_gpu_forward_backward(m, in, tg, B, T, 1.0f, &loss));
    CHECK_GPU(gpt2_gpu_get_grads(m, g));
    check_loss("loss", loss, loss_cpu, sh.E_loss);
    WITHIN_TENSORS("grad", cpu.tensors, g, cpu.grads, E_g);

    if (dt == GPU_F32) {
        CHECK_GPU(gpt2_gpu_zero_grad(m));
        CHECK_GPU(gpt2_gpu_forward_backward(m, in, tg, B, T, 1.0f, &loss2));
        CHECK_GPU(gpt2_gpu_get_grads(m, g2));
        same_bits("loss of a second run", &loss, &loss2, sizeof(float));
        same_bits("gradients of a second run", g, g2, np * sizeof(float));
    }
    gpt2_gpu_free(m);
    gpt2_release(&cpu);
}

TEST_T(cuda_model_step_f32, 120)
{
    test_device_setup();
    step(GPU_F32);
    test_device_finish();
}

/* bf16: parameters are the same bf16 values on both sides, but the GPU stores every
 * activation, activation gradient and gradient in bf16 and the CPU keeps them in fp32: the
 * bounds carry each of those roundings (ub of the value, R3) through the rest of the step. */
TEST_T(cuda_model_step_bf16, 120)
{
    test_device_setup();
    step(GPU_BF16);
    test_device_finish();
}

/* Two micro-batches of a smaller shape with grad_scale 1/2 each, added into one gradient. */
TEST_T(cuda_model_accumulation_f32, 120)
{
    struct gpt2 cpu;
    struct shadow sh;
    int B = 2, T = 11, n = B * T;
    float lc[2], lg[2];

    test_device_setup();
    cpu_model(&cpu, GPU_F32);
    struct gpt2_gpu_opts o = opts_of(GPU_F32);
    struct gpt2_gpu *m = gpu_model(&o, &cpu);
    size_t np = cpu.n_params;
    float *g = hmalloc(np * sizeof(float)), *sg = hmalloc(np * sizeof(float));
    double *E_g = hmalloc(np * sizeof(double));

    gpt2_zero_grad(&cpu);
    CHECK_GPU(gpt2_gpu_zero_grad(m));
    for (int k = 0; k < 2; k++) {
        int *in = random_tokens(n), *tg = random_tokens(n);
        CHECK_EQ(gpt2_forward(&cpu, in, tg, B, T, &lc[k]), 0);
        CHECK_EQ(gpt2_backward(&cpu, 0.5f), 0);
        shadow_forward(&sh, GPU_F32, &cpu, in, tg, B, T);
        shadow_backward(&sh, 0.5f, sg, E_g);
        CHECK_GPU(gpt2_gpu_forward_backward(m, in, tg, B, T, 0.5f, &lg[k]));
        check_loss("micro-batch loss", lg[k], lc[k], sh.E_loss);
    }
    shadow_check("accumulated grads", sg, cpu.grads, np);
    CHECK_GPU(gpt2_gpu_get_grads(m, g));
    WITHIN_TENSORS("accumulated grad", cpu.tensors, g, cpu.grads, E_g);

    gpt2_gpu_free(m);
    gpt2_release(&cpu);
    test_device_finish();
}

/* CUDA graphs (opts.graphs): steps of one shape and grad_scale (the first as itself, the
 * second recorded, the rest launched), then another grad_scale and another shape, each beside
 * a model without graphs from the same parameters and tokens (new tokens every step: a graph
 * reads them from the device at each launch): the same loss and gradients bit for bit, and the
 * graph launched exactly where it should be. An evaluation between steps leaves it alone. */
static void graphs(enum gpu_dtype dt)
{
    struct gpt2 cpu;
    static const struct {
        int B, T;
        float scale;
        uint64_t launches; /* gpt2_gpu_graph_launches after the step */
    } steps[] = {{2, 16, 1.0f, 0}, {2, 16, 1.0f, 1}, {2, 16, 1.0f, 2},
                 {2, 16, 0.5f, 2}, {2, 16, 0.5f, 3}, {2, 16, 0.5f, 4},
                 {1, 9, 1.0f, 4},  {1, 9, 1.0f, 5},  {1, 9, 1.0f, 6}};
    char what[96];

    cpu_model(&cpu, dt);
    struct gpt2_gpu_opts o = opts_of(dt), og = opts_of(dt);
    og.graphs = true;
    struct gpt2_gpu *plain = gpu_model(&o, &cpu), *gm = gpu_model(&og, &cpu);
    size_t np = cpu.n_params;
    float *g1 = hmalloc(np * sizeof(float)), *g2 = hmalloc(np * sizeof(float));

    gpt2_gpu_graphs_describe(gm, what, sizeof(what));
    CHECK_STR(what, "on");
    gpt2_gpu_graphs_describe(plain, what, sizeof(what));
    CHECK_STR(what, "off");
    for (size_t k = 0; k < sizeof(steps) / sizeof(steps[0]); k++) {
        int n = steps[k].B * steps[k].T;
        int *in = random_tokens(n), *tg = random_tokens(n);
        float l1 = 0.0f, l2 = 0.0f;

        CHECK_GPU(gpt2_gpu_zero_grad(plain));
        CHECK_GPU(gpt2_gpu_zero_grad(gm));
        CHECK_GPU(
            gpt2_gpu_forward_backward(plain, in, tg, steps[k].B, steps[k].T, steps[k].scale, &l1));
        CHECK_GPU(
            gpt2_gpu_forward_backward(gm, in, tg, steps[k].B, steps[k].T, steps[k].scale, &l2));
        CHECK_GPU(gpt2_gpu_get_grads(plain, g1));
        CHECK_GPU(gpt2_gpu_get_grads(gm, g2));
        snprintf(what, sizeof(what), "step %zu's loss", k + 1);
        same_bits(what, &l1, &l2, sizeof(float));
        snprintf(what, sizeof(what), "step %zu's gradients", k + 1);
        same_bits(what, g1, g2, np * sizeof(float));
        CHECK_EQ(gpt2_gpu_graph_launches(gm), steps[k].launches);
        if (k == 2)
            CHECK_GPU(gpt2_gpu_forward(gm, in, NULL, steps[k].B, steps[k].T, NULL));
    }
    CHECK_EQ(gpt2_gpu_graph_launches(plain), 0);
    gpt2_gpu_graphs_describe(gm, what, sizeof(what));
    CHECK_STR(what, "on");
    gpt2_gpu_free(plain);
    gpt2_gpu_free(gm);
    gpt2_release(&cpu);
}

TEST_T(cuda_model_graphs_f32, 120)
{
    test_device_setup();
    graphs(GPU_F32);
    test_device_finish();
}

TEST_T(cuda_model_graphs_bf16, 120)
{
    test_device_setup();
    graphs(GPU_BF16);
    test_device_finish();
}

/* ---- forward only -------------------------------------------------------------------------- */

/* Logits of a forward without targets, every row, against gpt2_logits; the loss of a forward
 * with targets; no logits after a training step. */
static void forward_only(enum gpu_dtype dt)
{
    struct gpt2 cpu;
    struct shadow sh;
    int B = 2, T = 13, n = B * T, Vp = cfg.padded_vocab_size;
    float loss_cpu = 0.0f, loss = 0.0f;

    cpu_model(&cpu, dt);
    struct gpt2_gpu_opts o = opts_of(dt);
    struct gpt2_gpu *m = gpu_model(&o, &cpu);
    int *in = random_tokens(n), *tg = random_tokens(n);
    float *row = hmalloc((size_t)Vp * sizeof(float));

    CHECK_EQ(gpt2_forward(&cpu, in, NULL, B, T, NULL), 0);
    shadow_forward(&sh, dt, &cpu, in, NULL, B, T);
    shadow_check("logits", sh.logits, gpt2_logits(&cpu), (size_t)n * Vp);
    CHECK_GPU(gpt2_gpu_forward(m, in, NULL, B, T, NULL));
    for (int b = 0; b < B; b++)
        for (int p = 0; p < T; p++) {
            char what[48];
            size_t r = ((size_t)b * T + p) * Vp;
            snprintf(what, sizeof(what), "logits row (%d, %d)", b, p);
            CHECK_GPU(gpt2_gpu_logits_row(m, b, p, row));
            within(__FILE__, __LINE__, what, row, sh.logits + r, sh.E_logits + r, (size_t)Vp,
                   MODEL_SLACK);
            for (int j = cfg.vocab_size; j < Vp; j++)
                CHECK(row[j] == 0.0f); /* wte's padding rows are zero */
        }
    CHECK_EQ(gpt2_gpu_logits_row(m, B, 0, row), -EINVAL);
    CHECK_CONTAINS(gerr.text, "outside");
    CHECK_EQ(gpt2_gpu_logits_row(m, 0, T, row), -EINVAL);

    CHECK_EQ(gpt2_forward(&cpu, in, tg, B, T, &loss_cpu), 0);
    shadow_forward(&sh, dt, &cpu, in, tg, B, T);
    CHECK_GPU(gpt2_gpu_forward(m, in, tg, B, T, &loss));
    check_loss("evaluation loss", loss, loss_cpu, sh.E_loss);

    CHECK_GPU(gpt2_gpu_forward_backward(m, in, tg, B, T, 1.0f, NULL));
    CHECK_EQ(gpt2_gpu_logits_row(m, 0, 0, row), -EINVAL);
    CHECK_CONTAINS(gerr.text, "no logits");

    gpt2_gpu_free(m);
    gpt2_release(&cpu);
}

TEST_T(cuda_model_forward_f32, 120)
{
    test_device_setup();
    forward_only(GPU_F32);
    test_device_finish();
}

TEST_T(cuda_model_forward_bf16, 120)
{
    test_device_setup();
    forward_only(GPU_BF16);
    test_device_finish();
}

/* ---- the update ---------------------------------------------------------------------------- */

/* n floats of moments: m around 0, v small and positive. */
static float *random_moments(size_t n, bool second)
{
    float *x = hmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        x[i] = second ? (float)(urand() * urand() * 1e-3) : (float)((urand() - 0.5) * 0.02);
    return x;
}

/* After a training step, gpt2_gpu_update against adamw_update on the GPU's own gradients
 * (so that only the update is compared), from non-zero moments at t = 4: the parameter change,
 * m and v; in bf16 mode the master weights, and the parameters their bf16 rounding. */
static void update_whole(enum gpu_dtype dt)
{
    struct gpt2 cpu;
    struct adamw opt;
    struct optim_span spans[GPT2_NUM_TENSORS];
    int B = B_CAP, T = T_CAP, n = B * T;
    uint64_t t = 4;
    float lr = 1e-3f, scale = 0.7f;

    cpu_model(&cpu, dt);
    struct gpt2_gpu_opts o = opts_of(dt);
    struct gpt2_gpu *m = gpu_model(&o, &cpu);
    size_t np = cpu.n_params;
    int *in = random_tokens(n), *tg = random_tokens(n);
    float *g = hmalloc(np * sizeof(float)), *p0 = hmalloc(np * sizeof(float));
    float *p = hmalloc(np * sizeof(float)), *master = hmalloc(np * sizeof(float));
    float *m1 = random_moments(np, false), *m2 = random_moments(np, true);
    float *gm1 = hmalloc(np * sizeof(float)), *gm2 = hmalloc(np * sizeof(float));

    CHECK_GPU(gpt2_gpu_zero_grad(m));
    CHECK_GPU(gpt2_gpu_forward_backward(m, in, tg, B, T, 1.0f, NULL));
    CHECK_GPU(gpt2_gpu_get_grads(m, g));
    CHECK_GPU(gpt2_gpu_set_moments(m, m1, m2));
    CHECK_GPU(gpt2_gpu_update(m, t, lr, scale));

    memcpy(p0, cpu.params, np * sizeof(float));
    size_t nspans = gpt2_optim_spans(&cpu, spans);
    CHECK_EQ(adamw_init(&opt, np, &adamw_cfg, spans, nspans), 0);
    memcpy(opt.m, m1, np * sizeof(float));
    memcpy(opt.v, m2, np * sizeof(float));
    opt.step = t - 1;
    adamw_update(&opt, cpu.params, g, lr, scale);

    CHECK_GPU(gpt2_gpu_get_shard(m, master, gm1, gm2));
    CHECK_GPU(gpt2_gpu_get_params(m, p));
    double *lim_m = hmalloc(np * sizeof(double)), *lim_v = hmalloc(np * sizeof(double));
    for (size_t i = 0; i < np; i++)
        adamw_moment_bounds(&adamw_cfg, g[i], m1[i], m2[i], scale, &lim_m[i], &lim_v[i]);
    WITHIN_TENSORS("m", cpu.tensors, gm1, opt.m, lim_m);
    WITHIN_TENSORS("v", cpu.tensors, gm2, opt.v, lim_v);
    /* The change, not the parameters: lr is small beside them. */
    for (size_t i = 0; i < np; i++) {
        master[i] -= p0[i];
        cpu.params[i] -= p0[i];
    }
    /* Each element against its own derived bound (adamw_update_bound, cuda_test.h): a tensor-wide
     * tolerance was either loose for the changes of small parameters or tight for those of 1.0. */
    float c1 = (float)(1.0 - pow(adamw_cfg.beta1, (double)t));
    float c2 = (float)(1.0 - pow(adamw_cfg.beta2, (double)t));
    for (int k = 0; k < GPT2_NUM_TENSORS; k++) {
        size_t off = cpu.tensors[k].offset, bad = 0;
        float wd = 0.0f;
        for (size_t s = 0; s < nspans; s++)
            if (spans[s].offset <= off && off < spans[s].offset + spans[s].count)
                wd = spans[s].decay ? adamw_cfg.weight_decay : 0.0f;
        for (size_t i = off; i < off + cpu.tensors[k].count; i++) {
            double lim =
                adamw_update_bound(&adamw_cfg, p0[i], g[i], m1[i], m2[i], lr, scale, wd, c1, c2);
            double e = fabs((double)master[i] - cpu.params[i]);
            if (!(e <= lim) && bad++ < 8)
                fprintf(stderr, "update %s[%zu]: gpu %.9g vs cpu %.9g (|diff| %.3g > %.3g)\n",
                        cpu.tensors[k].name, i - off, (double)master[i], (double)cpu.params[i], e,
                        lim);
        }
        if (bad)
            test_fail(__FILE__, __LINE__, "update %s: %zu of %zu elements outside their bound",
                      cpu.tensors[k].name, bad, cpu.tensors[k].count);
    }
    if (dt == GPU_BF16) {
        for (size_t i = 0; i < np; i++)
            if (p[i] != round_dt(dt, master[i] + p0[i]))
                test_fail(__FILE__, __LINE__, "params[%zu] %.9g is not bf16(master %.9g)", i,
                          (double)p[i], (double)(master[i] + p0[i]));
    } else {
        for (size_t i = 0; i < np; i++)
            p[i] -= p0[i];
        same_bits("fp32 params and master", p, master, np * sizeof(float));
    }
    adamw_release(&opt);
    gpt2_gpu_free(m);
    gpt2_release(&cpu);
}

TEST_T(cuda_model_update_f32, 120)
{
    test_device_setup();
    update_whole(GPU_F32);
    test_device_finish();
}

TEST_T(cuda_model_update_bf16, 120)
{
    test_device_setup();
    update_whole(GPU_BF16);
    test_device_finish();
}

/* n floatX elements at device address d (floatX of dt) as host floats. */
static void dev_floats(enum gpu_dtype dt, float *dst, const void *d, size_t n)
{
    if (dt == GPU_F32) {
        CHECK_CTX(gpu_download(ctx, dst, d, n * sizeof(float)));
        return;
    }
    uint16_t *b = malloc(n * sizeof(uint16_t) + 1);
    CHECK(b);
    CHECK_CTX(gpu_download(ctx, b, d, n * sizeof(uint16_t)));
    for (size_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)b[i] << 16;
        memcpy(&dst[i], &u, sizeof(float));
    }
    free(b);
}

/* ZeRO-1's view: three ranks' shards of n_pad = 3 s >= n_params; the shard of rank r updated
 * alone (after the same parameters, moments and gradients as an unsharded model of the same
 * n_pad) changes exactly [lo, hi) of the parameters, to the unsharded model's values bit for
 * bit; its moments (and master weights) are the unsharded model's over the shard; the
 * padding stays zero. Rank 1's shard crosses tensor boundaries, rank 2's reaches the padding. */
static void update_shard(enum gpu_dtype dt, int rank)
{
    struct gpt2 cpu;
    uint64_t t = 2;
    float lr = 3e-3f, scale = 1.0f;

    cpu_model(&cpu, dt);
    size_t np = cpu.n_params, s = (np / 3 / 8 + 1) * 8, n_pad = 3 * s;
    size_t lo = (size_t)rank * s, hi = lo + s, es = gpu_dtype_size(dt);
    struct gpt2_gpu_opts ow = opts_of(dt), os = opts_of(dt);
    ow.n_pad = os.n_pad = n_pad;
    os.opt_lo = lo;
    os.opt_hi = hi;
    CHECK_INT(n_pad, >, np);
    struct gpt2_gpu *whole = gpu_model(&ow, &cpu), *shard = gpu_model(&os, &cpu);
    struct gpt2_gpu_bufs bw, bs;
    float *m1 = random_moments(np, false), *m2 = random_moments(np, true);
    float *g = hmalloc(n_pad * sizeof(float));
    float *pw = hmalloc(n_pad * sizeof(float)), *ps = hmalloc(n_pad * sizeof(float));
    float *sw[3], *ss[3];

    gpt2_gpu_buffers(whole, &bw);
    gpt2_gpu_buffers(shard, &bs);
    CHECK_EQ(bs.opt_lo, lo);
    CHECK_EQ(bs.opt_hi, hi);
    CHECK_EQ(bw.opt_lo, 0);
    CHECK_EQ(bw.opt_hi, np);
    CHECK_EQ(bs.n_pad, n_pad);
    /* The same gradients in both (the reduced ones, as after a reduce-scatter), zero padding. */
    for (size_t i = 0; i < np; i++)
        g[i] = round_dt(dt, (float)((urand() - 0.5) * 0.1));
    for (int k = 0; k < 2; k++) {
        struct gpt2_gpu_bufs *b = k ? &bs : &bw;
        if (dt == GPU_BF16) {
            uint16_t *h = hmalloc(n_pad * sizeof(uint16_t));
            for (size_t i = 0; i < n_pad; i++) {
                uint32_t u;
                memcpy(&u, &g[i], sizeof(u));
                h[i] = (uint16_t)(u >> 16);
            }
            CHECK_CTX(gpu_upload(ctx, b->grads, h, n_pad * es));
        } else {
            CHECK_CTX(gpu_upload(ctx, b->grads, g, n_pad * es));
        }
    }
    CHECK_GPU(gpt2_gpu_set_moments(whole, m1, m2));
    CHECK_GPU(gpt2_gpu_set_moments(shard, m1, m2));
    CHECK_GPU(gpt2_gpu_update(whole, t, lr, scale));
    CHECK_GPU(gpt2_gpu_update(shard, t, lr, scale));

    dev_floats(dt, pw, bw.params, n_pad);
    dev_floats(dt, ps, bs.params, n_pad);
    size_t still = 0;
    for (size_t i = 0; i < n_pad; i++) {
        float init = i < np ? cpu.params[i] : 0.0f;
        float want = i >= lo && i < hi ? pw[i] : init;
        if (memcmp(&ps[i], &want, sizeof(float)))
            test_fail(__FILE__, __LINE__,
                      "shard [%zu, %zu) param %zu: %.9g, want %.9g (unsharded %.9g, before %.9g)",
                      lo, hi, i, (double)ps[i], (double)want, (double)pw[i], (double)init);
        still += i >= lo && i < hi && i < np && pw[i] == init;
    }
    /* fp32 parameters move, but for the rare one whose step (the Adam term less the decay)
     * falls below half an ulp; bf16 ones may not move by lr's small steps. */
    if (dt == GPU_F32 && still > (hi - lo) / 1000)
        test_fail(__FILE__, __LINE__, "%zu of the shard's %zu parameters did not move", still,
                  hi - lo);
    for (int k = 0; k < 3; k++) {
        sw[k] = hmalloc(np * sizeof(float));
        ss[k] = hmalloc(s * sizeof(float));
    }
    CHECK_GPU(gpt2_gpu_get_shard(whole, sw[0], sw[1], sw[2]));
    CHECK_GPU(gpt2_gpu_get_shard(shard, ss[0], ss[1], ss[2]));
    for (int k = 0; k < 3; k++)
        for (size_t i = lo; i < hi; i++) {
            float want = i < np ? sw[k][i] : 0.0f;
            if (memcmp(&ss[k][i - lo], &want, sizeof(float)))
                test_fail(__FILE__, __LINE__, "shard's %s[%zu]: %.9g, want %.9g",
                          k == 0   ? "master"
                          : k == 1 ? "m"
                                   : "v",
                          i, (double)ss[k][i - lo], (double)want);
        }
    gpt2_gpu_free(whole);
    gpt2_gpu_free(shard);
    gpt2_release(&cpu);
}

TEST_T(cuda_model_update_shard_f32, 120)
{
    test_device_setup();
    update_shard(GPU_F32, 1);
    update_shard(GPU_F32, 2);
    test_device_finish();
}

TEST_T(cuda_model_update_shard_bf16, 120)
{
    test_device_setup();
    update_shard(GPU_BF16, 1);
    update_shard(GPU_BF16, 2);
    test_device_finish();
}

/* ---- state round trips --------------------------------------------------------------------- */

/* set_params / get_params (bf16: the rounding), the master weights exact, set_moments /
 * get_shard (NULL: zero), gradients zeroed, the padding zero throughout; in a shard reaching
 * into the padding. */
static void round_trips(enum gpu_dtype dt)
{
    struct gpt2 cpu;

    cpu_model(&cpu, GPU_F32); /* fp32 values: bf16 mode must round them */
    size_t np = cpu.n_params, n_pad = np + 40, lo = np - 100, hi = n_pad;
    struct gpt2_gpu_opts o = opts_of(dt);
    o.n_pad = n_pad;
    o.opt_lo = lo;
    o.opt_hi = hi;
    struct gpt2_gpu *m = gpu_model(&o, &cpu);
    struct gpt2_gpu_bufs b;
    float *p = hmalloc(n_pad * sizeof(float)), *sh[3];
    float *m1 = random_moments(np, false), *m2 = random_moments(np, true);
    size_t s = hi - lo;

    gpt2_gpu_buffers(m, &b);
    CHECK_EQ(b.n_params, np);
    CHECK_EQ(b.n_pad, n_pad);
    CHECK_EQ(b.dt, dt);
    CHECK((b.master != NULL) == (dt == GPU_BF16));
    CHECK_GPU(gpt2_gpu_get_params(m, p));
    for (size_t i = 0; i < np; i++)
        if (memcmp(&p[i], &(float){round_dt(dt, cpu.params[i])}, sizeof(float)))
            test_fail(__FILE__, __LINE__, "params[%zu]: %.9g, set %.9g", i, (double)p[i],
                      (double)cpu.params[i]);
    for (int k = 0; k < 3; k++)
        sh[k] = hmalloc(s * sizeof(float));
    CHECK_GPU(gpt2_gpu_set_moments(m, m1, m2));
    CHECK_GPU(gpt2_gpu_get_shard(m, sh[0], sh[1], sh[2]));
    for (size_t i = lo; i < hi; i++) {
        bool pad = i >= np;
        /* The master weights exact in both modes (fp32: the parameters themselves). */
        float want[3] = {pad ? 0.0f : cpu.params[i], pad ? 0.0f : m1[i], pad ? 0.0f : m2[i]};
        for (int k = 0; k < 3; k++)
            if (memcmp(&sh[k][i - lo], &want[k], sizeof(float)))
                test_fail(__FILE__, __LINE__, "shard %d [%zu]: %.9g, want %.9g", k, i,
                          (double)sh[k][i - lo], (double)want[k]);
    }
    CHECK_GPU(gpt2_gpu_set_moments(m, NULL, m2));
    CHECK_GPU(gpt2_gpu_get_shard(m, NULL, sh[1], NULL));
    for (size_t i = 0; i < s; i++)
        CHECK(sh[1][i] == 0.0f);

    /* Padding: zero in the parameters and, after a step and zero_grad, in the gradients. */
    int n = B_CAP * T_CAP, *in = random_tokens(n), *tg = random_tokens(n);
    CHECK_GPU(gpt2_gpu_forward_backward(m, in, tg, B_CAP, T_CAP, 1.0f, NULL));
    CHECK_GPU(gpt2_gpu_update(m, 1, 1e-3f, 1.0f));
    dev_floats(dt, p, b.params, n_pad);
    for (size_t i = np; i < n_pad; i++)
        CHECK(p[i] == 0.0f);
    dev_floats(dt, p, b.grads, n_pad);
    for (size_t i = np; i < n_pad; i++)
        CHECK(p[i] == 0.0f);
    CHECK_GPU(gpt2_gpu_zero_grad(m));
    dev_floats(dt, p, b.grads, n_pad);
    for (size_t i = 0; i < n_pad; i++)
        CHECK(p[i] == 0.0f);
    CHECK_GPU(gpt2_gpu_get_shard(m, sh[0], NULL, NULL));
    for (size_t i = np; i < hi; i++)
        CHECK(sh[0][i - lo] == 0.0f);

    gpt2_gpu_free(m);
    gpt2_release(&cpu);
}

TEST_T(cuda_model_round_trips_f32, 120)
{
    test_device_setup();
    round_trips(GPU_F32);
    test_device_finish();
}

TEST_T(cuda_model_round_trips_bf16, 120)
{
    test_device_setup();
    round_trips(GPU_BF16);
    test_device_finish();
}

/* ---- gradient norm ------------------------------------------------------------------------- */

/* The sum of squares over ranges of a step's gradients against the host's, in double. */
TEST_T(cuda_model_grad_sumsq, 120)
{
    struct gpt2 cpu;
    int n = B_CAP * T_CAP;

    test_device_setup();
    cpu_model(&cpu, GPU_BF16);
    struct gpt2_gpu_opts o = opts_of(GPU_BF16);
    size_t np = cpu.n_params;
    o.n_pad = np + 13;
    struct gpt2_gpu *m = gpu_model(&o, &cpu);
    int *in = random_tokens(n), *tg = random_tokens(n);
    float *g = hmalloc(np * sizeof(float));
    size_t ranges[][2] = {{0, np}, {0, np + 13}, {np / 3, 2 * np / 3}, {5, 6}, {7, 7}};

    CHECK_GPU(gpt2_gpu_zero_grad(m));
    CHECK_GPU(gpt2_gpu_forward_backward(m, in, tg, B_CAP, T_CAP, 1.0f, NULL));
    CHECK_GPU(gpt2_gpu_get_grads(m, g));
    for (size_t k = 0; k < sizeof(ranges) / sizeof(ranges[0]); k++) {
        size_t lo = ranges[k][0], hi = ranges[k][1];
        double want = 0.0, got = -1.0, again = -1.0;
        for (size_t i = lo; i < hi && i < np; i++)
            want += (double)g[i] * g[i];
        CHECK_GPU(gpt2_gpu_grad_sumsq(m, lo, hi, &got));
        CHECK_GPU(gpt2_gpu_grad_sumsq(m, lo, hi, &again));
        /* Exact squares of bf16 values (16 significant bits), summed in double in another
         * order: each side within gamma(n) want of the exact sum, u = 2^-53. */
        double nn = (double)(hi - lo), bound = 2.0 * nn * 0x1p-53 / (1.0 - nn * 0x1p-53) * want;
        if (!(fabs(got - want) <= bound) || memcmp(&got, &again, sizeof(got)))
            test_fail(__FILE__, __LINE__, "sumsq [%zu, %zu): gpu %.17g (again %.17g) vs %.17g", lo,
                      hi, got, again, want);
    }
    CHECK_EQ(gpt2_gpu_grad_sumsq(m, 0, np + 14, &(double){0}), -EINVAL);
    CHECK_CONTAINS(gerr.text, "outside");

    gpt2_gpu_free(m);
    gpt2_release(&cpu);
    test_device_finish();
}

/* ---- errors -------------------------------------------------------------------------------- */

TEST_T(cuda_model_bad_input, 120)
{
    struct gpt2 cpu;
    int n = B_CAP * T_CAP;

    test_device_setup();
    cpu_model(&cpu, GPU_F32);
    struct gpt2_gpu_opts o = opts_of(GPU_F32);
    struct gpt2_gpu *m = gpu_model(&o, &cpu);
    int *in = random_tokens(n), *tg = random_tokens(n);

    in[5] = cfg.vocab_size;
    CHECK_EQ(gpt2_gpu_forward_backward(m, in, tg, B_CAP, T_CAP, 1.0f, NULL), -EINVAL);
    CHECK_CONTAINS(gerr.text, "inputs[5] (100) outside [0, 100)");
    in[5] = 0;
    tg[7] = -1;
    CHECK_EQ(gpt2_gpu_forward(m, in, tg, B_CAP, T_CAP, NULL), -EINVAL);
    CHECK_CONTAINS(gerr.text, "targets[7] (-1)");
    tg[7] = 0;
    CHECK_EQ(gpt2_gpu_forward_backward(m, in, tg, B_CAP + 1, T_CAP, 1.0f, NULL), -EINVAL);
    CHECK_CONTAINS(gerr.text, "capacity");
    CHECK_EQ(gpt2_gpu_forward(m, in, NULL, B_CAP, T_CAP + 1, NULL), -EINVAL);
    CHECK_EQ(gpt2_gpu_forward(m, in, NULL, 0, T_CAP, NULL), -EINVAL);
    CHECK_EQ(gpt2_gpu_forward_backward(m, in, NULL, B_CAP, T_CAP, 1.0f, NULL), -EINVAL);
    /* Still usable. */
    CHECK_GPU(gpt2_gpu_forward_backward(m, in, tg, B_CAP, T_CAP, 1.0f, NULL));
    gpt2_gpu_free(m);

    /* Configs and options gpt2_gpu_new refuses, each with its reason. */
    struct gpt2_config c = cfg;
    struct errmsg err = {""};
    c.n_embd = 60;
    c.n_head = 4;
    CHECK(!gpt2_gpu_new(ctx, &c, &o, &err));
    CHECK_CONTAINS(err.text, "multiple of 8");
    c = cfg;
    c.n_head = 3;
    CHECK(!gpt2_gpu_new(ctx, &c, &o, &err));
    CHECK_CONTAINS(err.text, "n_head (3) must divide n_embd (64)");
    c = cfg;
    c.n_embd = 256;
    c.n_head = 1;
    CHECK(!gpt2_gpu_new(ctx, &c, &o, &err));
    CHECK_CONTAINS(err.text, "head size 256");
    struct gpt2_gpu_opts bad = o;
    bad.seq_cap = cfg.max_seq_len + 1;
    CHECK(!gpt2_gpu_new(ctx, &cfg, &bad, &err));
    CHECK_CONTAINS(err.text, "seq_cap");
    bad = o;
    bad.n_pad = cpu.n_params - 1;
    CHECK(!gpt2_gpu_new(ctx, &cfg, &bad, &err));
    CHECK_CONTAINS(err.text, "n_pad");
    bad = o;
    bad.opt_lo = 10;
    bad.opt_hi = cpu.n_params + 1;
    CHECK(!gpt2_gpu_new(ctx, &cfg, &bad, &err));
    CHECK_CONTAINS(err.text, "shard");
    bad = o;
    bad.opt_lo = 10;
    bad.opt_hi = 10;
    CHECK(!gpt2_gpu_new(ctx, &cfg, &bad, &err));
    CHECK_CONTAINS(err.text, "shard");

    gpt2_release(&cpu);
    test_device_finish();
}
