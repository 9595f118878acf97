/* Tests of kernels/ops: every op's forward against an independent double-precision reference
 * written here from the maths in ops.h, and every backward against central differences of
 * that reference (in double, so the differences are accurate to about 1e-10 and the check
 * measures the fp32 backward alone). Also each GEMM micro-kernel the CPU runs, on shapes that
 * cross the blocking edges, and results that do not depend on the number of threads.
 *
 * Tolerances: a forward element passes when |got - ref| <= 1e-5 (1 + |ref|) (fp32 sums of a
 * few hundred terms); a gradient element when |got - fd| <= 1e-3 |fd| + 1e-5 max|fd| (max over
 * that input: cancellation in sums such as LayerNorm's leaves an absolute error of the order
 * of the largest terms). */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>

#include "ops.h"
#include "test.h"
#include "banned.h"

#define FWD_TOL    1e-5
#define GRAD_RTOL  1e-3
#define GRAD_ATOL  1e-5
#define FD_STEP    1e-5
#define MAX_INPUTS 4

/* ---- helpers ------------------------------------------------------------------------------ */

static unsigned long long rng_state = 88172645463325252ull;

static double urand(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / 9007199254740992.0;
}

/* Every buffer a test takes comes from tmalloc and is freed by tfree_all at its end (a
 * passing test must not leak: the ASan run checks). */
#define MAX_TRACKED 256
static void *tracked[MAX_TRACKED];
static int n_tracked;

static void *tmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    CHECK(p);
    CHECK_INT(n_tracked, <, MAX_TRACKED);
    tracked[n_tracked++] = p;
    return p;
}

static void tfree_all(void)
{
    while (n_tracked)
        free(tracked[--n_tracked]);
}

static float *frand(size_t n, float scale)
{
    float *x = tmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        x[i] = (float)((2.0 * urand() - 1.0) * scale);
    return x;
}

static float *fzeros(size_t n)
{
    float *x = tmalloc(n * sizeof(float));
    memset(x, 0, n * sizeof(float));
    return x;
}

static double *to_double(const float *x, size_t n)
{
    double *d = tmalloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++)
        d[i] = x[i];
    return d;
}

static void check_close(const char *what, const float *got, const double *ref, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (!(fabs(got[i] - ref[i]) <= FWD_TOL * (1.0 + fabs(ref[i]))))
            test_fail(__FILE__, __LINE__, "%s[%zu]: %.9g vs reference %.9g", what, i,
                      (double)got[i], ref[i]);
    }
}

/* An op under test: its inputs as double copies and a scalar objective (the reference
 * forward's outputs dotted with fixed random weights), whose gradient is what the fp32
 * backward computes when given those weights as dout. */
struct fd_case {
    int n_in;
    const char *names[MAX_INPUTS];
    double *in[MAX_INPUTS];
    size_t size[MAX_INPUTS];
    const float *grad[MAX_INPUTS]; /* the fp32 backward's gradient of each input */
    double (*objective)(const struct fd_case *c);
    const void *ctx;
};

/* Checks grad[k] of every input against central differences of the objective, on every
 * element, or on `samples` random ones when non-zero. */
static void check_grads(struct fd_case *c, int samples)
{
    for (int k = 0; k < c->n_in; k++) {
        size_t n = c->size[k], count = samples ? (size_t)samples : n;
        double *fd = malloc(count * sizeof(double));
        size_t *idx = malloc(count * sizeof(size_t));
        double max = 0.0;

        CHECK(fd && idx);
        for (size_t s = 0; s < count; s++) {
            size_t i = samples ? (size_t)(urand() * (double)n) % n : s;
            double save = c->in[k][i];
            c->in[k][i] = save + FD_STEP;
            double up = c->objective(c);
            c->in[k][i] = save - FD_STEP;
            double down = c->objective(c);
            c->in[k][i] = save;
            idx[s] = i;
            fd[s] = (up - down) / (2.0 * FD_STEP);
            max = fabs(fd[s]) > max ? fabs(fd[s]) : max;
        }
        CHECK(max > 0.0);
        for (size_t s = 0; s < count; s++) {
            double got = c->grad[k][idx[s]];
            if (!(fabs(got - fd[s]) <= GRAD_RTOL * fabs(fd[s]) + GRAD_ATOL * max))
                test_fail(__FILE__, __LINE__,
                          "d%s[%zu]: backward %.9g vs central difference %.9g (max |grad| %.3g)",
                          c->names[k], idx[s], got, fd[s], max);
        }
        free(fd);
        free(idx);
    }
}

static double dot(const double *a, const float *w, size_t n)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        s += a[i] * w[i];
    return s;
}

/* ---- matmul ------------------------------------------------------------------------------- */

struct mm_shape {
    int N, C, OC;
    bool bias;
    const float *dout;
};

static void ref_matmul(double *out, const double *inp, const double *w, const double *b, int N,
                       int C, int OC)
{
    for (int n = 0; n < N; n++) {
        for (int o = 0; o < OC; o++) {
            double s = b ? b[o] : 0.0;
            for (int c = 0; c < C; c++)
                s += inp[(size_t)n * C + c] * w[(size_t)o * C + c];
            out[(size_t)n * OC + o] = s;
        }
    }
}

static double matmul_objective(const struct fd_case *c)
{
    const struct mm_shape *s = c->ctx;
    double *out = malloc((size_t)s->N * s->OC * sizeof(double));
    CHECK(out);
    ref_matmul(out, c->in[0], c->in[1], s->bias ? c->in[2] : NULL, s->N, s->C, s->OC);
    double v = dot(out, s->dout, (size_t)s->N * s->OC);
    free(out);
    return v;
}

/* Forward and backward of one matmul shape against the reference; `samples` as in
 * check_grads. dweight and dbias start non-zero to check that they accumulate. */
static void check_matmul(int N, int C, int OC, bool bias, int samples)
{
    size_t ni = (size_t)N * C, nw = (size_t)OC * C, no = (size_t)N * OC;
    float *inp = frand(ni, 1.0f), *w = frand(nw, 0.5f), *b = bias ? frand(OC, 0.5f) : NULL;
    float *out = frand(no, 9.0f), *dout = frand(no, 1.0f), *dinp = frand(ni, 9.0f);
    float *dw0 = frand(nw, 1.0f), *dw = tmalloc(nw * sizeof(float));
    float *db0 = frand(OC, 1.0f), *db = tmalloc(OC * sizeof(float));
    struct mm_shape shape = {N, C, OC, bias, dout};
    struct fd_case fc = {
        .n_in = bias ? 3 : 2,
        .names = {"inp", "weight", "bias"},
        .in = {to_double(inp, ni), to_double(w, nw), bias ? to_double(b, OC) : NULL},
        .size = {ni, nw, (size_t)OC},
        .objective = matmul_objective,
        .ctx = &shape,
    };
    double *ref = tmalloc(no * sizeof(double));

    CHECK(dw && db && ref);
    CHECK_EQ(ops_matmul_forward(out, inp, w, b, N, C, OC), 0);
    ref_matmul(ref, fc.in[0], fc.in[1], fc.in[2], N, C, OC);
    check_close("out", out, ref, no);

    memcpy(dw, dw0, nw * sizeof(float));
    memcpy(db, db0, OC * sizeof(float));
    CHECK_EQ(ops_matmul_backward(dinp, dw, bias ? db : NULL, dout, inp, w, N, C, OC), 0);
    /* The accumulated part: subtract what was there. */
    for (size_t i = 0; i < nw; i++)
        dw[i] -= dw0[i];
    for (int i = 0; i < OC; i++)
        db[i] -= db0[i];
    fc.grad[0] = dinp;
    fc.grad[1] = dw;
    fc.grad[2] = db;
    check_grads(&fc, samples);
    tfree_all();
}

static const char *const kernel_names[] = {"avx512", "avx2", "generic"};

TEST(ops_matmul_small_grad)
{
    check_matmul(5, 7, 9, true, 0);
    check_matmul(3, 4, 2, false, 0);
    tfree_all();
}

/* Every kernel the CPU runs, on shapes with edges in M, N and two K blocks (K > 256). */
TEST_T(ops_matmul_kernels_blocked, 60)
{
    int ran = 0;

    for (size_t i = 0; i < sizeof(kernel_names) / sizeof(kernel_names[0]); i++) {
        if (ops_matmul_use_kernel(kernel_names[i]) < 0)
            continue;
        ran++;
        check_matmul(37, 300, 45, true, 40);
        check_matmul(300, 29, 70, true, 40);
    }
    CHECK_INT(ran, >=, 1);
    CHECK_EQ(ops_matmul_use_kernel("no-such-kernel"), -ENOENT);
    tfree_all();
}

/* Threads split rows and columns of the output, never a sum: identical bits for 1, 2 and 3
 * threads, forward and backward. */
TEST(ops_matmul_thread_independent)
{
    int N = 97, C = 300, OC = 70;
    float *inp = frand((size_t)N * C, 1.0f), *w = frand((size_t)OC * C, 1.0f);
    float *b = frand(OC, 1.0f), *dout = frand((size_t)N * OC, 1.0f);
    float *out[3], *dinp[3], *dw[3], *db[3];

    for (int t = 0; t < 3; t++) {
        omp_set_num_threads(t + 1);
        out[t] = fzeros((size_t)N * OC), dinp[t] = fzeros((size_t)N * C);
        dw[t] = fzeros((size_t)OC * C), db[t] = fzeros(OC);
        CHECK_EQ(ops_matmul_forward(out[t], inp, w, b, N, C, OC), 0);
        CHECK_EQ(ops_matmul_backward(dinp[t], dw[t], db[t], dout, inp, w, N, C, OC), 0);
        if (t) {
            CHECK(!memcmp(out[t], out[0], (size_t)N * OC * sizeof(float)));
            CHECK(!memcmp(dinp[t], dinp[0], (size_t)N * C * sizeof(float)));
            CHECK(!memcmp(dw[t], dw[0], (size_t)OC * C * sizeof(float)));
            CHECK(!memcmp(db[t], db[0], (size_t)OC * sizeof(float)));
        }
    }
    /* A row's result does not depend on the other rows either: the first 10 rows alone. */
    float *part = fzeros((size_t)10 * OC);
    CHECK_EQ(ops_matmul_forward(part, inp, w, b, 10, C, OC), 0);
    CHECK(!memcmp(part, out[0], (size_t)10 * OC * sizeof(float)));
    tfree_all();
}

/* ---- attention ---------------------------------------------------------------------------- */

struct att_shape {
    int B, T, C, NH;
    const float *dout;
};

static void ref_attention(double *out, double *att, const double *qkv, int B, int T, int C, int NH)
{
    int hs = C / NH;
    double scale = 1.0 / sqrt((double)hs);
    double *s = malloc((size_t)T * sizeof(double));

    CHECK(s);
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            for (int t = 0; t < T; t++) {
                const double *q = qkv + ((size_t)b * T + t) * 3 * C + h * hs;
                double max = -INFINITY, sum = 0.0;
                for (int t2 = 0; t2 <= t; t2++) {
                    const double *k = qkv + ((size_t)b * T + t2) * 3 * C + C + h * hs;
                    double d = 0.0;
                    for (int i = 0; i < hs; i++)
                        d += q[i] * k[i];
                    s[t2] = d * scale;
                    max = s[t2] > max ? s[t2] : max;
                }
                for (int t2 = 0; t2 <= t; t2++) {
                    s[t2] = exp(s[t2] - max);
                    sum += s[t2];
                }
                double *o = out + ((size_t)b * T + t) * C + h * hs;
                for (int i = 0; i < hs; i++)
                    o[i] = 0.0;
                for (int t2 = 0; t2 < T; t2++) {
                    double p = t2 <= t ? s[t2] / sum : 0.0;
                    const double *v = qkv + ((size_t)b * T + t2) * 3 * C + 2 * C + h * hs;
                    if (att)
                        att[(((size_t)b * NH + h) * T + t) * T + t2] = p;
                    for (int i = 0; i < hs; i++)
                        o[i] += p * v[i];
                }
            }
        }
    }
    free(s);
}

static double attention_objective(const struct fd_case *c)
{
    const struct att_shape *s = c->ctx;
    size_t no = (size_t)s->B * s->T * s->C;
    double *out = malloc(no * sizeof(double));
    CHECK(out);
    ref_attention(out, NULL, c->in[0], s->B, s->T, s->C, s->NH);
    double v = dot(out, s->dout, no);
    free(out);
    return v;
}

static void check_attention(int B, int T, int C, int NH, int samples)
{
    size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C, na = (size_t)B * NH * T * T;
    float *qkv = frand(nq, 1.0f), *out = frand(no, 9.0f), *att = frand(na, 9.0f);
    float *dout = frand(no, 1.0f), *dqkv = frand(nq, 9.0f);
    double *ref = tmalloc(no * sizeof(double)), *ref_att = tmalloc(na * sizeof(double));
    struct att_shape shape = {B, T, C, NH, dout};
    struct fd_case fc = {
        .n_in = 1,
        .names = {"qkv"},
        .in = {to_double(qkv, nq)},
        .size = {nq},
        .grad = {dqkv},
        .objective = attention_objective,
        .ctx = &shape,
    };

    CHECK(ref && ref_att);
    CHECK_EQ(ops_attention_forward(out, att, qkv, B, T, C, NH), 0);
    ref_attention(ref, ref_att, fc.in[0], B, T, C, NH);
    check_close("out", out, ref, no);
    /* att is the saved softmax, exactly zero above the diagonal. */
    check_close("att", att, ref_att, na);
    for (size_t i = 0; i < na; i++) {
        if (ref_att[i] == 0.0)
            CHECK(att[i] == 0.0f);
    }
    CHECK_EQ(ops_attention_backward(dqkv, dout, qkv, att, B, T, C, NH), 0);
    check_grads(&fc, samples);
    tfree_all();
}

TEST(ops_attention_small_grad)
{
    check_attention(2, 5, 8, 2, 0);
    check_attention(1, 3, 6, 3, 0);
    tfree_all();
}

/* More positions than a row block (64) and head sizes off the kernels' tile widths. */
TEST_T(ops_attention_blocked, 60)
{
    check_attention(1, 70, 24, 2, 60);
    check_attention(2, 130, 16, 1, 40);
    tfree_all();
}

TEST(ops_attention_thread_independent)
{
    int B = 3, T = 67, C = 32, NH = 4;
    size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C, na = (size_t)B * NH * T * T;
    float *qkv = frand(nq, 1.0f), *dout = frand(no, 1.0f);
    float *out[2], *att[2], *dqkv[2];

    for (int t = 0; t < 2; t++) {
        omp_set_num_threads(t + 1);
        out[t] = fzeros(no), att[t] = fzeros(na), dqkv[t] = fzeros(nq);
        CHECK_EQ(ops_attention_forward(out[t], att[t], qkv, B, T, C, NH), 0);
        CHECK_EQ(ops_attention_backward(dqkv[t], dout, qkv, att[t], B, T, C, NH), 0);
    }
    CHECK(!memcmp(out[0], out[1], no * sizeof(float)));
    CHECK(!memcmp(att[0], att[1], na * sizeof(float)));
    CHECK(!memcmp(dqkv[0], dqkv[1], nq * sizeof(float)));
    tfree_all();
}

/* ---- layernorm ---------------------------------------------------------------------------- */

struct ln_shape {
    int N, C;
    const float *dout;
};

static void ref_layernorm(double *out, double *mean, double *rstd, const double *inp,
                          const double *w, const double *b, int N, int C)
{
    for (int n = 0; n < N; n++) {
        const double *x = inp + (size_t)n * C;
        double m = 0.0, v = 0.0;
        for (int c = 0; c < C; c++)
            m += x[c];
        m /= C;
        for (int c = 0; c < C; c++)
            v += (x[c] - m) * (x[c] - m);
        double s = 1.0 / sqrt(v / C + (double)OPS_LN_EPS);
        for (int c = 0; c < C; c++)
            out[(size_t)n * C + c] = (x[c] - m) * s * w[c] + b[c];
        if (mean)
            mean[n] = m, rstd[n] = s;
    }
}

static double layernorm_objective(const struct fd_case *c)
{
    const struct ln_shape *s = c->ctx;
    size_t n = (size_t)s->N * s->C;
    double *out = malloc(n * sizeof(double));
    CHECK(out);
    ref_layernorm(out, NULL, NULL, c->in[0], c->in[1], c->in[2], s->N, s->C);
    double v = dot(out, s->dout, n);
    free(out);
    return v;
}

static void check_layernorm(int N, int C)
{
    size_t n = (size_t)N * C;
    float *inp = frand(n, 2.0f), *w = frand(C, 1.0f), *b = frand(C, 1.0f);
    float *out = fzeros(n), *mean = fzeros(N), *rstd = fzeros(N), *dout = frand(n, 1.0f);
    float *dinp0 = frand(n, 1.0f), *dinp = tmalloc(n * sizeof(float));
    float *dw0 = frand(C, 1.0f), *dw = tmalloc(C * sizeof(float));
    float *db0 = frand(C, 1.0f), *db = tmalloc(C * sizeof(float));
    double *ref = tmalloc(n * sizeof(double)), *rmean = tmalloc(N * sizeof(double));
    double *rrstd = tmalloc(N * sizeof(double));
    struct ln_shape shape = {N, C, dout};
    struct fd_case fc = {
        .n_in = 3,
        .names = {"inp", "weight", "bias"},
        .in = {to_double(inp, n), to_double(w, C), to_double(b, C)},
        .size = {n, (size_t)C, (size_t)C},
        .grad = {dinp, dw, db},
        .objective = layernorm_objective,
        .ctx = &shape,
    };

    CHECK(dinp && dw && db && ref && rmean && rrstd);
    ops_layernorm_forward(out, mean, rstd, inp, w, b, N, C);
    ref_layernorm(ref, rmean, rrstd, fc.in[0], fc.in[1], fc.in[2], N, C);
    check_close("out", out, ref, n);
    check_close("mean", mean, rmean, N);
    check_close("rstd", rstd, rrstd, N);

    /* All three gradients accumulate. */
    memcpy(dinp, dinp0, n * sizeof(float));
    memcpy(dw, dw0, C * sizeof(float));
    memcpy(db, db0, C * sizeof(float));
    ops_layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
    for (size_t i = 0; i < n; i++)
        dinp[i] -= dinp0[i];
    for (int i = 0; i < C; i++)
        dw[i] -= dw0[i], db[i] -= db0[i];
    check_grads(&fc, 0);
    tfree_all();
}

TEST(ops_layernorm_grad)
{
    check_layernorm(4, 10);
    check_layernorm(3, 130); /* channels across the 64-wide chunks */
    tfree_all();
}

/* ---- encoder ------------------------------------------------------------------------------ */

struct enc_shape {
    int B, T, C;
    const int *tokens;
    const float *dout;
};

static double encoder_objective(const struct fd_case *c)
{
    const struct enc_shape *s = c->ctx;
    double v = 0.0;
    for (int bt = 0; bt < s->B * s->T; bt++) {
        for (int i = 0; i < s->C; i++) {
            double o = c->in[0][(size_t)s->tokens[bt] * s->C + i] +
                       c->in[1][(size_t)(bt % s->T) * s->C + i];
            v += o * s->dout[(size_t)bt * s->C + i];
        }
    }
    return v;
}

TEST(ops_encoder_grad)
{
    int B = 2, T = 4, C = 70, V = 5, maxT = 6;
    int tokens[8] = {1, 3, 1, 0, 4, 1, 3, 3}; /* repeats, and token 2 never occurs */
    float *wte = frand((size_t)V * C, 1.0f), *wpe = frand((size_t)maxT * C, 1.0f);
    float *out = fzeros((size_t)B * T * C), *dout = frand((size_t)B * T * C, 1.0f);
    float *dwte = fzeros((size_t)V * C), *dwpe = fzeros((size_t)maxT * C);
    struct enc_shape shape = {B, T, C, tokens, dout};
    struct fd_case fc = {
        .n_in = 2,
        .names = {"wte", "wpe"},
        .in = {to_double(wte, (size_t)V * C), to_double(wpe, (size_t)maxT * C)},
        .size = {(size_t)V * C, (size_t)maxT * C},
        .grad = {dwte, dwpe},
        .objective = encoder_objective,
        .ctx = &shape,
    };

    ops_encoder_forward(out, tokens, wte, wpe, B, T, C);
    for (int bt = 0; bt < B * T; bt++) {
        for (int i = 0; i < C; i++)
            CHECK(out[(size_t)bt * C + i] ==
                  wte[(size_t)tokens[bt] * C + i] + wpe[(size_t)(bt % T) * C + i]);
    }
    ops_encoder_backward(dwte, dwpe, dout, tokens, B, T, C);
    check_grads(&fc, 0);
    for (int i = 0; i < C; i++)
        CHECK(dwte[2 * C + i] == 0.0f);
    tfree_all();
}

/* ---- GELU, residual ----------------------------------------------------------------------- */

static double ref_gelu(double x)
{
    return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

struct elem_shape {
    size_t n;
    const float *dout;
};

static double gelu_objective(const struct fd_case *c)
{
    const struct elem_shape *s = c->ctx;
    double v = 0.0;
    for (size_t i = 0; i < s->n; i++)
        v += ref_gelu(c->in[0][i]) * s->dout[i];
    return v;
}

TEST(ops_gelu_grad)
{
    size_t n = 9000; /* three thread chunks, the last partial */
    float *x = frand(n, 6.0f), *out = fzeros(n), *dout = frand(n, 1.0f), *dx = fzeros(n);
    double *ref = tmalloc(n * sizeof(double));
    struct elem_shape shape = {n, dout};
    struct fd_case fc = {
        .n_in = 1,
        .names = {"inp"},
        .in = {to_double(x, n)},
        .size = {n},
        .grad = {dx},
        .objective = gelu_objective,
        .ctx = &shape,
    };

    CHECK(ref);
    x[0] = 0.0f, x[1] = -20.0f, x[2] = 20.0f, x[3] = 1e-4f;
    fc.in[0][0] = 0.0, fc.in[0][1] = -20.0, fc.in[0][2] = 20.0, fc.in[0][3] = (double)x[3];
    ops_gelu_forward(out, x, n);
    for (size_t i = 0; i < n; i++)
        ref[i] = ref_gelu(fc.in[0][i]);
    check_close("out", out, ref, n);
    ops_gelu_backward(dx, x, dout, n);
    check_grads(&fc, 300);
    /* The model's pair gives the same bits: the derivative saved by the forward (in place of
     * the input), times dout. */
    float *out2 = fzeros(n), *grad = fzeros(n), *dx2 = fzeros(n);
    memcpy(grad, x, n * sizeof(float));
    ops_gelu_forward_grad(out2, grad, grad, n);
    CHECK(!memcmp(out2, out, n * sizeof(float)));
    ops_gelu_backward_grad(dx2, grad, dout, n);
    CHECK(!memcmp(dx2, dx, n * sizeof(float)));
    /* In place: dinp == dout. */
    ops_gelu_backward(dout, x, dout, n);
    CHECK(!memcmp(dout, dx, n * sizeof(float)));
    tfree_all();
}

TEST(ops_residual)
{
    size_t n = 5000;
    float *a = frand(n, 1.0f), *b = frand(n, 1.0f), *out = fzeros(n), *dout = frand(n, 1.0f);
    float *da = frand(n, 1.0f), *db = frand(n, 1.0f);
    float *da0 = tmalloc(n * sizeof(float)), *db0 = tmalloc(n * sizeof(float));

    CHECK(da0 && db0);
    memcpy(da0, da, n * sizeof(float));
    memcpy(db0, db, n * sizeof(float));
    ops_residual_forward(out, a, b, n);
    ops_residual_backward(da, db, dout, n);
    for (size_t i = 0; i < n; i++) {
        CHECK(out[i] == a[i] + b[i]);
        CHECK(da[i] == da0[i] + dout[i]);
        CHECK(db[i] == db0[i] + dout[i]);
    }
    tfree_all();
}

/* ---- cross-entropy ------------------------------------------------------------------------ */

struct ce_shape {
    int N, V, Vp;
    const int *targets;
    double dloss;
};

static double ce_objective(const struct fd_case *c)
{
    const struct ce_shape *s = c->ctx;
    double v = 0.0;
    for (int n = 0; n < s->N; n++) {
        const double *x = c->in[0] + (size_t)n * s->Vp;
        double max = x[0], sum = 0.0;
        for (int j = 1; j < s->V; j++)
            max = x[j] > max ? x[j] : max;
        for (int j = 0; j < s->V; j++)
            sum += exp(x[j] - max);
        v += s->dloss * (max + log(sum) - x[s->targets[n]]);
    }
    return v;
}

TEST(ops_crossentropy_grad)
{
    int N = 6, V = 11, Vp = 16;
    int targets[6] = {0, 10, 3, 3, 7, 5};
    size_t nl = (size_t)N * Vp;
    float *logits = frand(nl, 4.0f), *losses = fzeros(N), *lse = fzeros(N), *d = fzeros(nl);
    double rl[6];
    struct ce_shape shape = {N, V, Vp, targets, 0.37};
    struct fd_case fc = {
        .n_in = 1,
        .names = {"logits"},
        .in = {to_double(logits, nl)},
        .size = {nl},
        .grad = {d},
        .objective = ce_objective,
        .ctx = &shape,
    };

    /* The padding logits are ignored whatever they hold. */
    for (int n = 0; n < N; n++)
        logits[(size_t)n * Vp + V] = 1e30f;
    ops_crossentropy_forward(losses, lse, logits, targets, N, V, Vp);
    for (int n = 0; n < N; n++) {
        struct ce_shape one = {1, V, Vp, &targets[n], 1.0};
        struct fd_case single = {.in = {fc.in[0] + (size_t)n * Vp}, .ctx = &one};
        rl[n] = ce_objective(&single);
    }
    check_close("losses", losses, rl, N);
    ops_crossentropy_backward(d, logits, lse, targets, N, V, Vp, 0.37f);
    check_grads(&fc, 0);
    for (int n = 0; n < N; n++) {
        for (int j = V; j < Vp; j++)
            CHECK(d[(size_t)n * Vp + j] == 0.0f);
    }
    /* In place gives the same bits. */
    ops_crossentropy_backward(logits, logits, lse, targets, N, V, Vp, 0.37f);
    CHECK(!memcmp(logits, d, nl * sizeof(float)));
    tfree_all();
}

/* ---- exp ---------------------------------------------------------------------------------- */

TEST(ops_expf_accuracy)
{
    double worst = 0.0;

    for (int i = 0; i <= 200000; i++) {
        float x = -87.0f + 175.0f * (float)i / 200000.0f;
        double ref = exp((double)x), got = ops_expf(x);
        double rel = fabs(got - ref) / ref;
        worst = rel > worst ? rel : worst;
    }
    if (!(worst < 2.5e-7))
        test_fail(__FILE__, __LINE__, "ops_expf relative error %.3g, over 2.5e-7", worst);
    CHECK(ops_expf(0.0f) == 1.0f);
    CHECK(ops_expf(-1000.0f) > 0.0f && ops_expf(-1000.0f) < 1e-37f);
    CHECK(isfinite(ops_expf(1000.0f)));
    tfree_all();
}
