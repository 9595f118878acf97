/* Tests of the CUDA backend (kernels/cuda/): every launcher against the CPU ops of kernels/ops.c
 * and kernels/optim.c on fresh random inputs, in fp32 and in bf16 storage, outputs poisoned
 * with NaN beforehand so that an element left unwritten fails. Without a CUDA device the kernel
 * tests skip; the "no CUDA device available" check is tested on every machine (with no device
 * visible). The inputs come from a fixed seed (printed); GPURUN_TEST_SEED=N picks another.
 *
 * Tolerance: each element against a limit of its own, derived from the arithmetic both sides
 * do (the rules and each op's limits are in cuda_bounds.h): no tensor-wide constant.
 * GPURUN_TEST_BOUNDS=FILE appends, per comparison, how close it came (the largest |gpu - cpu| /
 * limit). */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda/cuda_ops.h"
#include "ops.h"
#include "optim.h"
#include "test.h"
#include "cuda_test.h"
#include "cuda_bounds.h"
#include "banned.h"

/* ---- harness ------------------------------------------------------------------------------- */

/* bf16 on the host: round to nearest even (NaN stays a quiet NaN). */
static uint16_t bf16_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static float bf16_float(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

static float round_dt(enum gpu_dtype dt, float x)
{
    return dt == GPU_BF16 ? bf16_float(bf16_bits(x)) : x;
}

/* n floats uniform in [offset - scale, offset + scale], each a value of dt. */
static float *hrand_off(enum gpu_dtype dt, size_t n, float scale, float offset)
{
    float *x = hmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        x[i] = round_dt(dt, offset + (float)((2.0 * urand() - 1.0) * scale));
    return x;
}

static float *hrand(enum gpu_dtype dt, size_t n, float scale)
{
    return hrand_off(dt, n, scale, 0.0f);
}

/* A device copy of n host floats, stored as dt (exact: they are dt values). */
static void *dput(enum gpu_dtype dt, const float *h, size_t n)
{
    void *d = dmalloc(n * gpu_dtype_size(dt));
    if (dt == GPU_BF16) {
        uint16_t *b = hmalloc(n * sizeof(uint16_t));
        for (size_t i = 0; i < n; i++)
            b[i] = bf16_bits(h[i]);
        CHECK_CTX(gpu_upload(ctx, d, b, n * sizeof(uint16_t)));
    } else {
        CHECK_CTX(gpu_upload(ctx, d, h, n * sizeof(float)));
    }
    return d;
}

/* As dput, at element `off` of a larger allocation (tensors inside the flat parameter buffer
 * are less aligned than an allocation). */
static void *dput_at(enum gpu_dtype dt, const float *h, size_t n, size_t off)
{
    size_t es = gpu_dtype_size(dt);
    char *d = dmalloc((n + off) * es);
    void *src = (void *)h;

    if (dt == GPU_BF16) {
        uint16_t *b = hmalloc(n * sizeof(uint16_t));
        for (size_t i = 0; i < n; i++)
            b[i] = bf16_bits(h[i]);
        src = b;
    }
    CHECK_CTX(gpu_upload(ctx, d + off * es, src, n * es));
    return d + off * es;
}

static float *dputf(const float *h, size_t n)
{
    return dput(GPU_F32, h, n);
}

static int *dputi(const int *h, size_t n)
{
    int *d = dmalloc(n * sizeof(int));
    CHECK_CTX(gpu_upload(ctx, d, h, n * sizeof(int)));
    return d;
}

/* n elements of dt, all NaN. */
static void *dnan(enum gpu_dtype dt, size_t n)
{
    void *d = dmalloc(n * gpu_dtype_size(dt));
    CHECK_CTX(gpu_fill_bytes(ctx, d, 0xff, n * gpu_dtype_size(dt)));
    return d;
}

/* n NaN elements of dt at element `off` of a larger allocation. */
static void *dnan_at(enum gpu_dtype dt, size_t n, size_t off)
{
    return (char *)dnan(dt, n + off) + off * gpu_dtype_size(dt);
}

/* The n elements of dt at d, as host floats. */
static float *dget(enum gpu_dtype dt, const void *d, size_t n)
{
    float *h = hmalloc(n * sizeof(float));
    if (dt == GPU_BF16) {
        uint16_t *b = hmalloc(n * sizeof(uint16_t));
        CHECK_CTX(gpu_download(ctx, b, d, n * sizeof(uint16_t)));
        for (size_t i = 0; i < n; i++)
            h[i] = bf16_float(b[i]);
    } else {
        CHECK_CTX(gpu_download(ctx, h, d, n * sizeof(float)));
    }
    return h;
}

static float *dgetf(const float *d, size_t n)
{
    return dget(GPU_F32, d, n);
}

/* Runs body(dt) as two tests, one per storage type. */
#define CUDA_TEST(name)                                                                            \
    static void name(enum gpu_dtype dt);                                                           \
    TEST(cuda_##name##_f32)                                                                        \
    {                                                                                              \
        test_device_setup();                                                                       \
        name(GPU_F32);                                                                             \
        test_device_finish();                                                                      \
    }                                                                                              \
    TEST(cuda_##name##_bf16)                                                                       \
    {                                                                                              \
        test_device_setup();                                                                       \
        name(GPU_BF16);                                                                            \
        test_device_finish();                                                                      \
    }                                                                                              \
    static void name(enum gpu_dtype dt)

/* ---- device check -------------------------------------------------------------------------- */

/* With no device visible (on any machine): no device, and gpurun-train's one line. */
TEST(cuda_no_device_message)
{
    struct errmsg err = {""};

    /* Before this process's first CUDA call: the runtime reads it once. */
    CHECK_EQ(setenv("CUDA_VISIBLE_DEVICES", "", 1), 0);
    CHECK_EQ(gpu_device_count(), 0);
    CHECK_EQ(gpu_require_device(&err), -ENODEV);
    CHECK_STR(err.text, "no CUDA device available");
}

TEST(cuda_device_context)
{
    struct errmsg err = {""};

    test_device_setup();
    CHECK_INT(gpu_device_count(), >=, 1);
    CHECK_EQ(gpu_require_device(&err), 0);
    CHECK(gpu_ctx_stream(ctx) != NULL);
    CHECK_STR(gpu_ctx_error(ctx), "");
    test_device_finish();
}

/* Launchers refuse bad shapes before launching, naming the op. */
TEST(cuda_shape_errors)
{
    test_device_setup();
    void *buf = dmalloc(1 << 16);
    CHECK_EQ(gpu_layernorm_forward(ctx, GPU_F32, buf, NULL, NULL, buf, buf, buf, 0, 8), -EINVAL);
    CHECK_CONTAINS(gpu_ctx_error(ctx), "layernorm_forward: N (0)");
    CHECK_EQ(gpu_matmul_forward(ctx, GPU_BF16, buf, NULL, buf, buf, NULL, 4, 12, 8), -EINVAL);
    CHECK_CONTAINS(gpu_ctx_error(ctx), "multiples of 8");
    CHECK_EQ(gpu_attention_forward(ctx, GPU_F32, buf, buf, buf, 1, 4, 258, 2), -EINVAL);
    CHECK_CONTAINS(gpu_ctx_error(ctx), "head size 129");
    CHECK_EQ(gpu_attention_forward(ctx, GPU_F32, buf, buf, buf, 1, 4, 96, 5), -EINVAL);
    CHECK_EQ(gpu_crossentropy_forward(ctx, GPU_F32, buf, buf, buf, buf, 4, 10, 8), -EINVAL);
    CHECK_EQ(gpu_adamw_update(ctx, GPU_BF16, buf, NULL, buf, buf, buf, NULL, 0,
                              &(struct adamw_config){0.9f, 0.95f, 1e-8f, 0.1f}, 1, 1e-3f, 1.0f),
             -EINVAL);
    CHECK_CONTAINS(gpu_ctx_error(ctx), "master");
    test_device_finish();
}

/* A recording of ctx's stream: nothing runs until a launch, each launch runs it all again on
 * what the buffers hold then; a call that waits for the device fails inside one, and so does
 * its end, saying why. */
TEST(cuda_graph_recording)
{
    struct gpu_graph *g = NULL;
    float h[4] = {1.5f, -2.0f, 3.25f, 0.0f}, out[4];

    test_device_setup();
    float *src = dmalloc(sizeof(h)), *dst = dmalloc(sizeof(h));
    uint16_t *mid = dmalloc(4 * sizeof(uint16_t));
    CHECK_CTX(gpu_fill_bytes(ctx, dst, 0, sizeof(h)));
    CHECK_CTX(gpu_graph_begin(ctx));
    CHECK_CTX(gpu_convert(ctx, GPU_BF16, mid, GPU_F32, src, 4));
    CHECK_CTX(gpu_convert(ctx, GPU_F32, dst, GPU_BF16, mid, 4));
    CHECK_CTX(gpu_graph_end(ctx, &g));
    CHECK_CTX(gpu_download(ctx, out, dst, sizeof(out)));
    for (int i = 0; i < 4; i++)
        CHECK(out[i] == 0.0f); /* recorded, not run */
    for (int k = 0; k < 2; k++) {
        for (int i = 0; i < 4; i++)
            h[i] += (float)k;
        CHECK_CTX(gpu_upload(ctx, src, h, sizeof(h)));
        CHECK_CTX(gpu_graph_launch(ctx, g));
        CHECK_CTX(gpu_download(ctx, out, dst, sizeof(out)));
        for (int i = 0; i < 4; i++)
            CHECK(out[i] == h[i]); /* exact in bf16 */
    }
    gpu_graph_free(g);

    CHECK_CTX(gpu_graph_begin(ctx));
    CHECK_CTX(gpu_fill_bytes(ctx, dst, 0, sizeof(h)));
    CHECK(gpu_download(ctx, out, dst, sizeof(out)) < 0);
    CHECK_EQ(gpu_graph_end(ctx, &g), -ENOTSUP);
    CHECK(g == NULL);
    CHECK_CONTAINS(gpu_ctx_error(ctx), "the recording failed");
    /* The stream works as before. */
    CHECK_CTX(gpu_fill_bytes(ctx, dst, 0, sizeof(h)));
    CHECK_CTX(gpu_ctx_sync(ctx));
    test_device_finish();
}

/* fp32 -> bf16 rounds to nearest even, bf16 -> fp32 is exact; ties, NaN, infinities. */
TEST(cuda_convert)
{
    size_t n = 4096;
    float *x;
    uint16_t *b;

    test_device_setup();
    x = hmalloc(n * sizeof(float));
    b = hmalloc(n * sizeof(uint16_t));
    for (size_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)next_u64();
        if (i % 4 == 1)
            u = (u & 0xffff0000u) | 0x8000u; /* an exact tie */
        if (i % 4 == 2)
            u &= 0xbfffffffu; /* a moderate exponent */
        memcpy(&x[i], &u, sizeof(u));
    }
    x[0] = NAN, x[4] = INFINITY, x[8] = -INFINITY, x[12] = -0.0f, x[16] = 3.4028235e38f;
    float *d32 = dputf(x, n);
    void *d16 = dnan(GPU_BF16, n);
    CHECK_CTX(gpu_convert(ctx, GPU_BF16, d16, GPU_F32, d32, n));
    CHECK_CTX(gpu_download(ctx, b, d16, n * sizeof(uint16_t)));
    for (size_t i = 0; i < n; i++) {
        if (isnan(x[i])) {
            CHECK(isnan(bf16_float(b[i])));
            continue;
        }
        if (b[i] != bf16_bits(x[i]))
            test_fail(__FILE__, __LINE__, "bf16(%a) [%zu]: gpu 0x%04x vs 0x%04x", (double)x[i], i,
                      b[i], bf16_bits(x[i]));
    }
    float *back = dnan(GPU_F32, n);
    CHECK_CTX(gpu_convert(ctx, GPU_F32, back, GPU_BF16, d16, n));
    float *h = dgetf(back, n);
    for (size_t i = 0; i < n; i++) {
        float want = bf16_float(b[i]);
        CHECK(memcmp(&h[i], &want, sizeof(float)) == 0 || (isnan(h[i]) && isnan(want)));
    }
    test_device_finish();
}

/* ---- encoder ------------------------------------------------------------------------------- */

CUDA_TEST(encoder)
{
    int B = 3, T = 37, C = 72, V = 11, maxT = 40; /* V small: tokens repeat */
    size_t nout = (size_t)B * T * C;
    float *wte = hrand(dt, (size_t)V * C, 1.0f), *wpe = hrand(dt, (size_t)maxT * C, 1.0f);
    int *inp = hmalloc((size_t)B * T * sizeof(int));
    for (int i = 0; i < B * T; i++)
        inp[i] = irand(V);
    inp[0] = V - 1;

    float *ref = hmalloc(nout * sizeof(float));
    size_t nte = (size_t)V * C, npe = (size_t)maxT * C;
    ops_encoder_forward(ref, inp, wte, wpe, B, T, C);
    for (size_t i = 0; i < nout; i++)
        ref[i] = round_dt(dt, ref[i]);
    int *dinp = dputi(inp, (size_t)B * T);
    void *out = dnan(dt, nout);
    CHECK_CTX(
        gpu_encoder_forward(ctx, dt, out, dinp, dput(dt, wte, nte), dput(dt, wpe, npe), B, T, C));
    /* One fp32 addition of the same operands, rounded once to the same type: the same bits. */
    WITHIN("out", dget(dt, out, nout), ref, dzero(nout), nout);

    float *dout = hrand(dt, nout, 1.0f);
    float *dwte = hrand(dt, nte, 1.0f), *dwpe = hrand(dt, npe, 1.0f);
    float *mte = absv(dwte, nte), *mpe = absv(dwpe, npe);
    void *g_dwte = dput(dt, dwte, nte), *g_dwpe = dput(dt, dwpe, npe);
    ops_encoder_backward(dwte, dwpe, dout, inp, B, T, C);
    ops_encoder_backward(mte, mpe, absv(dout, nout), inp, B, T, C);
    CHECK_CTX(gpu_encoder_backward(ctx, dt, g_dwte, g_dwpe, dput(dt, dout, nout), inp, B, T, C, V));
    /* Sums of the gradient and a token's B T positions at most (a position's B rows for
     * dwpe), in fp32, added to the gradient once (one bf16 rounding). */
    WITHIN("dwte", dget(dt, g_dwte, nte), dwte, sum_limits(dt, mte, nte, B * T + 1, 1, false), nte);
    WITHIN("dwpe", dget(dt, g_dwpe, npe), dwpe, sum_limits(dt, mpe, npe, B + 1, 1, false), npe);

    inp[5] = V;
    CHECK_EQ(gpu_encoder_backward(ctx, dt, g_dwte, g_dwpe, dput(dt, dout, nout), inp, B, T, C, V),
             -EINVAL);
    CHECK_CONTAINS(gpu_ctx_error(ctx), "outside [0, 11)");
}

/* ---- layernorm ----------------------------------------------------------------------------- */

/* {N, C, off}: the backward's kernel for each (layernorm_backward picks by C and alignment).
 * 300 x 200: rows in 3 chunks of the weight-gradient sum, C not a multiple of 32; 16-byte
 * vectors, one per lane and some lanes idle (bf16) or two per lane (fp32: the 4-vector kernel).
 * 32 x 128: one vector per lane, every lane busy, in both types. 64 x 768, GPT-2's width: three
 * vectors per lane in bf16; six in fp32, past the vector kernel, so one element per lane.
 * 16 x 512 and 16 x 1024: four vectors per lane, the vector kernel's most, in fp32 and bf16.
 * 40 x 18: C not a multiple of a vector. 32 x 128 at element 1 of its allocations (off):
 * pointers off 16-byte alignment, so one element per lane again. */
static const int ln_shapes[][3] = {{300, 200, 0}, {32, 128, 0}, {64, 768, 0}, {16, 512, 0},
                                   {16, 1024, 0}, {40, 18, 0},  {32, 128, 1}};

static void layernorm_case(enum gpu_dtype dt, int N, int C, size_t off)
{
    size_t n = (size_t)N * C;
    float *x = hrand_off(dt, n, 2.0f, 0.7f), *w = hrand_off(dt, C, 0.5f, 1.0f);
    float *b = hrand(dt, C, 0.5f);
    float *out = hmalloc(n * sizeof(float)), *mean = hmalloc(N * sizeof(float));
    float *rstd = hmalloc(N * sizeof(float));

    ops_layernorm_forward(out, mean, rstd, x, w, b, N, C);
    void *g_x = dput(dt, x, n), *g_w = dput(dt, w, C), *g_b = dput(dt, b, C);
    void *g_out = dnan(dt, n);
    float *g_mean = dnan(GPU_F32, N), *g_rstd = dnan(GPU_F32, N);
    CHECK_CTX(gpu_layernorm_forward(ctx, dt, g_out, g_mean, g_rstd, g_x, g_w, g_b, N, C));
    double *l_out = hmalloc(n * sizeof(double)), *l_mean = hmalloc(N * sizeof(double));
    double *l_rstd = hmalloc(N * sizeof(double));
    layernorm_limits(dt, x, w, b, mean, rstd, N, C, l_out, l_mean, l_rstd);
    WITHIN("out", dget(dt, g_out, n), out, l_out, n);
    WITHIN("mean", dgetf(g_mean, N), mean, l_mean, N);
    WITHIN("rstd", dgetf(g_rstd, N), rstd, l_rstd, N);

    /* Backward from the CPU's mean and rstd; all three gradients accumulate. */
    float *dout = hrand(dt, n, 1.0f), *dinp = hrand(dt, n, 1.0f);
    float *dw = hrand(dt, C, 1.0f), *db = hrand(dt, C, 1.0f);
    double *l_dinp = hmalloc(n * sizeof(double)), *l_dw = hmalloc(C * sizeof(double));
    double *l_db = hmalloc(C * sizeof(double));
    layernorm_backward_limits(dt, dout, x, w, mean, rstd, dinp, dw, db, N, C, l_dinp, l_dw, l_db);
    void *g_dinp = dput_at(dt, dinp, n, off), *g_dw = dput(dt, dw, C), *g_db = dput(dt, db, C);
    ops_layernorm_backward(dinp, dw, db, dout, x, w, mean, rstd, N, C);
    CHECK_CTX(gpu_layernorm_backward(ctx, dt, g_dinp, g_dw, g_db, dput_at(dt, dout, n, off),
                                     dput_at(dt, x, n, off), dput_at(dt, w, C, off), dputf(mean, N),
                                     dputf(rstd, N), N, C));
    WITHIN("dinp", dget(dt, g_dinp, n), dinp, l_dinp, n);
    WITHIN("dweight", dget(dt, g_dw, C), dw, l_dw, C);
    WITHIN("dbias", dget(dt, g_db, C), db, l_db, C);
}

CUDA_TEST(layernorm)
{
    for (size_t k = 0; k < sizeof(ln_shapes) / sizeof(ln_shapes[0]); k++)
        layernorm_case(dt, ln_shapes[k][0], ln_shapes[k][1], (size_t)ln_shapes[k][2]);
}

/* residual = a + b stored in dt, then the LayerNorm of the stored values; also in place over a. */
CUDA_TEST(residual_layernorm)
{
    int N = 77, C = 136;
    size_t n = (size_t)N * C;
    float *a = hrand_off(dt, n, 1.0f, 0.3f), *b = hrand(dt, n, 1.0f);
    float *w = hrand_off(dt, C, 0.5f, 1.0f), *bias = hrand(dt, C, 0.5f);
    float *res = hmalloc(n * sizeof(float)), *out = hmalloc(n * sizeof(float));
    float *mean = hmalloc(N * sizeof(float)), *rstd = hmalloc(N * sizeof(float));

    ops_residual_forward(res, a, b, n);
    for (size_t i = 0; i < n; i++)
        res[i] = round_dt(dt, res[i]);
    ops_layernorm_forward(out, mean, rstd, res, w, bias, N, C);

    void *g_a = dput(dt, a, n), *g_b = dput(dt, b, n), *g_w = dput(dt, w, C);
    void *g_bias = dput(dt, bias, C), *g_res = dnan(dt, n), *g_out = dnan(dt, n);
    float *g_mean = dnan(GPU_F32, N), *g_rstd = dnan(GPU_F32, N);
    CHECK_CTX(gpu_residual_layernorm_forward(ctx, dt, g_res, g_out, g_mean, g_rstd, g_a, g_b, g_w,
                                             g_bias, N, C));
    /* The residual: one fp32 addition of the same operands on both sides, rounded once to
     * the same type: the same bits (limit 0). So the LayerNorm's input is the same on both
     * sides too, and layernorm_limits' hold. */
    double *l_res = dzero(n), *l_out = hmalloc(n * sizeof(double));
    double *l_mean = hmalloc(N * sizeof(double)), *l_rstd = hmalloc(N * sizeof(double));
    layernorm_limits(dt, res, w, bias, mean, rstd, N, C, l_out, l_mean, l_rstd);
    WITHIN("residual", dget(dt, g_res, n), res, l_res, n);
    WITHIN("out", dget(dt, g_out, n), out, l_out, n);
    WITHIN("mean", dgetf(g_mean, N), mean, l_mean, N);
    WITHIN("rstd", dgetf(g_rstd, N), rstd, l_rstd, N);

    g_out = dnan(dt, n);
    CHECK_CTX(gpu_residual_layernorm_forward(ctx, dt, g_a, g_out, NULL, NULL, g_a, g_b, g_w, g_bias,
                                             N, C));
    WITHIN("residual in a", dget(dt, g_a, n), res, l_res, n);
    WITHIN("out (in place)", dget(dt, g_out, n), out, l_out, n);
}

/* ---- matmul -------------------------------------------------------------------------------- */

/* Forward with and without bias and GELU, through cuBLASLt's epilogues and through our own. */
static void matmul_forward_case(enum gpu_dtype dt, int N, int C, int OC, bool bias, bool gelu,
                                bool fusion, size_t off)
{
    size_t ni = (size_t)N * C, nw = (size_t)OC * C, no = (size_t)N * OC;
    float scale = 1.0f / sqrtf((float)C);
    float *inp = hrand(dt, ni, 1.0f), *w = hrand(dt, nw, 2.0f * scale);
    float *b = bias ? hrand(dt, OC, 0.5f) : NULL;
    float *pre = hmalloc(no * sizeof(float)), *out = hmalloc(no * sizeof(float));
    char what[64];

    CHECK_EQ(ops_matmul_forward(pre, inp, w, b, N, C, OC), 0);
    if (gelu)
        ops_gelu_forward(out, pre, no);
    /* pre: sums of C products and the bias (R2, on tensor cores in bf16), rounded to bf16
     * once (the fused epilogue's aux) or twice (the plain path: the product, then with the
     * bias), so nb = 2 with a bias or GELU. out = gelu(pre): pre's limit times |gelu'(pre)|,
     * GELU's evaluation on both sides (CUDA's tanhf in gelu_f or cuBLASLt's epilogue, the
     * CPU's tanh_inline: 12u |pre| in all) and the output's rounding ub |out|. */
    float *mag = hmalloc(no * sizeof(float));
    CHECK_EQ(ops_matmul_forward(mag, absv(inp, ni), absv(w, nw), b ? absv(b, OC) : NULL, N, C, OC),
             0);
    double *l_pre = sum_limits(dt, mag, no, C + 1, bias || gelu ? 2 : 1, true);
    double *l_out = l_pre;
    if (gelu) {
        l_out = hmalloc(no * sizeof(double));
        for (size_t i = 0; i < no; i++)
            l_out[i] = fabs(gelu_grad_d(pre[i], NULL)) * l_pre[i] + 12.0 * U32 * fabs(pre[i]) +
                       ub_of(dt) * fabs(gelu_d(pre[i]));
    }
    void *g_out = dnan_at(dt, no, off), *g_pre = gelu ? dnan_at(dt, no, off) : NULL;
    gpu_ctx_set_fusion(ctx, fusion);
    CHECK_CTX(gpu_matmul_forward(ctx, dt, g_out, g_pre, dput_at(dt, inp, ni, off),
                                 dput_at(dt, w, nw, off), bias ? dput_at(dt, b, OC, off) : NULL, N,
                                 C, OC));
    snprintf(what, sizeof(what), "out (%dx%dx%d%s%s%s%s)", N, C, OC, bias ? " bias" : "",
             gelu ? " gelu" : "", fusion ? " fused" : "", off ? " offset" : "");
    WITHIN(what, dget(dt, g_out, no), gelu ? out : pre, l_out, no);
    if (gelu) {
        snprintf(what, sizeof(what), "pre_gelu (%dx%dx%d%s%s)", N, C, OC, bias ? " bias" : "",
                 fusion ? " fused" : "");
        WITHIN(what, dget(dt, g_pre, no), pre, l_pre, no);
    }
}

CUDA_TEST(matmul_forward)
{
    for (int f = 0; f < 2; f++)
        for (int k = 0; k < 4; k++) {
            matmul_forward_case(dt, 45, 64, 96, k & 1, k & 2, f, 0);
            matmul_forward_case(dt, 150, 136, 200, k & 1, k & 2, f, 0);
        }
    /* Operands 16 (bf16) or 32 (fp32) bytes past an allocation's alignment. */
    matmul_forward_case(dt, 45, 64, 96, true, true, true, 8);
    matmul_forward_case(dt, 45, 64, 96, true, false, true, 8);
}

/* Backward: dinp overwritten (or skipped), dweight and dbias accumulate; with pre_gelu the
 * GELU gradient on dinp, by cuBLASLt's DGELU epilogue or our kernel. */
static void matmul_backward_case(enum gpu_dtype dt, int N, int C, int OC, bool bias, bool gelu,
                                 bool want_dinp, bool fusion, size_t off)
{
    size_t ni = (size_t)N * C, nw = (size_t)OC * C, no = (size_t)N * OC;
    float scale = 1.0f / sqrtf((float)C);
    float *pre = gelu ? hrand(dt, ni, 3.0f) : NULL, *inp = hrand(dt, ni, 1.0f);
    float *w = hrand(dt, nw, 2.0f * scale), *dout = hrand(dt, no, 1.0f);
    float *dinp = hmalloc(ni * sizeof(float)), *dw = hrand(dt, nw, 1.0f);
    float *db = bias ? hrand(dt, OC, 1.0f) : NULL;
    char what[80];

    if (gelu) {
        ops_gelu_forward(inp, pre, ni);
        for (size_t i = 0; i < ni; i++)
            inp[i] = round_dt(dt, inp[i]);
    }
    void *g_dw = dput_at(dt, dw, nw, off), *g_db = bias ? dput_at(dt, db, OC, off) : NULL;
    void *g_dinp = want_dinp ? dnan_at(dt, ni, off) : NULL;
    /* The magnitude run: dinp's sums of OC products; dweight's and dbias's of N products or
     * terms and the old value. Each rounded to bf16 once (cuBLASLt's beta = 1 adds the old
     * value in fp32; dbias: our two-stage fp32 column sum). With GELU, dinp = gelu'(pre) acc:
     * acc's limit through |gelu'(pre)|, gelu''s evaluation on both sides (12u on its terms'
     * magnitude), and two bf16 roundings (acc, then the product: the plain path's) of at most
     * |gelu'(pre)| S each. */
    float *m_dinp = hmalloc(ni * sizeof(float)), *m_dw = absv(dw, nw);
    float *m_db = bias ? absv(db, OC) : NULL;
    CHECK_EQ(ops_matmul_backward(m_dinp, m_dw, m_db, absv(dout, no), absv(inp, ni), absv(w, nw), N,
                                 C, OC),
             0);
    double *l_dinp = sum_limits(dt, m_dinp, ni, OC, 1, true);
    if (gelu) {
        double *acc = sum_limits(dt, m_dinp, ni, OC, 0, true);
        for (size_t i = 0; i < ni; i++) {
            double mg, g = fabs(gelu_grad_d(pre[i], &mg));
            l_dinp[i] = g * acc[i] + 12.0 * U32 * mg * m_dinp[i] + 2.0 * ub_of(dt) * g * m_dinp[i];
        }
    }
    double *l_dw = sum_limits(dt, m_dw, nw, N + 1, 1, true);
    double *l_db = bias ? sum_limits(dt, m_db, OC, N + 1, 1, false) : NULL;
    CHECK_EQ(ops_matmul_backward(dinp, dw, db, dout, inp, w, N, C, OC), 0);
    if (gelu)
        ops_gelu_backward(dinp, pre, dinp, ni);
    gpu_ctx_set_fusion(ctx, fusion);
    CHECK_CTX(gpu_matmul_backward(ctx, dt, g_dinp, g_dw, g_db, dput_at(dt, dout, no, off),
                                  dput_at(dt, inp, ni, off), dput_at(dt, w, nw, off),
                                  gelu ? dput_at(dt, pre, ni, off) : NULL, N, C, OC));
    snprintf(what, sizeof(what), "(%dx%dx%d%s%s%s%s)", N, C, OC, bias ? " bias" : "",
             gelu ? " gelu" : "", fusion ? " fused" : "", off ? " offset" : "");
    if (want_dinp) {
        char w2[96];
        snprintf(w2, sizeof(w2), "dinp %s", what);
        WITHIN(w2, dget(dt, g_dinp, ni), dinp, l_dinp, ni);
    }
    char w3[96];
    snprintf(w3, sizeof(w3), "dweight %s", what);
    WITHIN(w3, dget(dt, g_dw, nw), dw, l_dw, nw);
    if (bias) {
        snprintf(w3, sizeof(w3), "dbias %s", what);
        WITHIN(w3, dget(dt, g_db, OC), db, l_db, OC);
    }
}

CUDA_TEST(matmul_backward)
{
    for (int f = 0; f < 2; f++)
        for (int k = 0; k < 4; k++) {
            matmul_backward_case(dt, 45, 64, 96, k & 1, k & 2, true, f, 0);
            matmul_backward_case(dt, 300, 136, 200, k & 1, k & 2, true, f, 0);
        }
    matmul_backward_case(dt, 45, 64, 96, true, false, false, true, 0);
    matmul_backward_case(dt, 45, 64, 96, true, true, true, true, 8);
}

/* ---- cross-entropy ------------------------------------------------------------------------- */

static void crossentropy_case(enum gpu_dtype dt, int N, int V, int Vp)
{
    size_t n = (size_t)N * Vp;
    float *logits = hrand(dt, n, 4.0f), dloss = 1.0f / (float)N;
    int *targets = hmalloc((size_t)N * sizeof(int));
    float *losses = hmalloc(N * sizeof(float)), *lse = hmalloc(N * sizeof(float));
    float *dlogits = hmalloc(n * sizeof(float));

    for (int i = 0; i < N; i++)
        targets[i] = irand(V);
    targets[0] = V - 1;
    ops_crossentropy_forward(losses, lse, logits, targets, N, V, Vp);
    ops_crossentropy_backward(dlogits, logits, lse, targets, N, V, Vp, dloss);
    double *l_lse = hmalloc(N * sizeof(double)), *l_loss = hmalloc(N * sizeof(double));
    double *l_df = hmalloc(n * sizeof(double));
    crossentropy_limits(dt, logits, targets, lse, losses, N, V, Vp, dloss, l_lse, l_loss, l_df);

    void *g_logits = dput(dt, logits, n);
    int *g_targets = dputi(targets, N);
    float *g_losses = dnan(GPU_F32, N), *g_lse = dnan(GPU_F32, N);
    CHECK_CTX(gpu_crossentropy_forward(ctx, dt, g_losses, g_lse, g_logits, g_targets, N, V, Vp));
    WITHIN("losses", dgetf(g_losses, N), losses, l_loss, N);
    WITHIN("lse", dgetf(g_lse, N), lse, l_lse, N);

    /* Fused, in place over a copy of the logits. */
    g_losses = dnan(GPU_F32, N), g_lse = dnan(GPU_F32, N);
    void *g_inplace = dput(dt, logits, n);
    CHECK_CTX(
        gpu_crossentropy_fused(ctx, dt, g_losses, g_lse, g_inplace, g_targets, N, V, Vp, dloss));
    WITHIN("fused losses", dgetf(g_losses, N), losses, l_loss, N);
    WITHIN("fused lse", dgetf(g_lse, N), lse, l_lse, N);
    WITHIN("fused dlogits", dget(dt, g_inplace, n), dlogits, l_df, n);
}

CUDA_TEST(crossentropy)
{
    crossentropy_case(dt, 37, 1003, 1024);
    crossentropy_case(dt, 3, 50257, 50304);
    crossentropy_case(dt, 5, 7, 7);
    /* bf16's fused one-read kernel takes rows up to 65536 logits; past it, the two-read one. */
    crossentropy_case(dt, 2, 65530, 65536);
    crossentropy_case(dt, 2, 65601, 65608);

    /* A target outside [0, V): a NaN loss, the row's other values as usual; fused too. */
    int N = 2, V = 10, Vp = 16, targets[2] = {3, 10};
    float *logits = hrand(dt, (size_t)N * Vp, 2.0f);
    float *losses = dnan(GPU_F32, N), *lse = dnan(GPU_F32, N);
    CHECK_CTX(gpu_crossentropy_forward(ctx, dt, losses, lse, dput(dt, logits, (size_t)N * Vp),
                                       dputi(targets, N), N, V, Vp));
    float *h = dgetf(losses, N), *hl = dgetf(lse, N);
    CHECK(isfinite(h[0]) && isnan(h[1]));
    CHECK(isfinite(hl[0]) && isfinite(hl[1]));
    losses = dnan(GPU_F32, N), lse = dnan(GPU_F32, N);
    CHECK_CTX(gpu_crossentropy_fused(ctx, dt, losses, lse, dput(dt, logits, (size_t)N * Vp),
                                     dputi(targets, N), N, V, Vp, 0.5f));
    h = dgetf(losses, N), hl = dgetf(lse, N);
    CHECK(isfinite(h[0]) && isnan(h[1]));
    CHECK(isfinite(hl[0]) && isfinite(hl[1]));
}

/* ---- attention ----------------------------------------------------------------------------- */

/* One case against the CPU reference; the forward runs with attention fwd and the backward
 * with bwd (gpu_ctx_set_attention; the context is left at bwd). */
static void attention_modes(enum gpu_dtype dt, int B, int T, int C, int NH, enum gpu_attention fwd,
                            enum gpu_attention bwd)
{
    size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C, nl = (size_t)B * NH * T;
    float *qkv = hrand(dt, nqkv, 1.5f), *dout = hrand(dt, nout, 1.0f);
    float *out = hmalloc(nout * sizeof(float)), *att = hmalloc(nl * T * sizeof(float));
    float *lse = hmalloc(nl * sizeof(float)), *dqkv = hmalloc(nqkv * sizeof(float));
    char what[64];

    CHECK_EQ(ops_attention_forward(out, att, qkv, B, T, C, NH), 0);
    ref_lse(lse, qkv, B, T, C, NH);
    CHECK_EQ(ops_attention_backward(dqkv, dout, qkv, att, B, T, C, NH), 0);

    void *g_qkv = dput(dt, qkv, nqkv), *g_out = dnan(dt, nout);
    float *g_lse = dnan(GPU_F32, nl);
    gpu_ctx_set_attention(ctx, fwd);
    CHECK_CTX(gpu_attention_forward(ctx, dt, g_out, g_lse, g_qkv, B, T, C, NH));
    double *l_out = hmalloc(nout * sizeof(double)), *l_lse = hmalloc(nl * sizeof(double));
    double *l_dqkv = hmalloc(nqkv * sizeof(double));
    attention_limits(dt, qkv, att, lse, out, dout, B, T, C, NH, l_out, l_lse, l_dqkv);
    snprintf(what, sizeof(what), "out (B %d T %d C %d NH %d)", B, T, C, NH);
    WITHIN(what, dget(dt, g_out, nout), out, l_out, nout);
    snprintf(what, sizeof(what), "lse (B %d T %d C %d NH %d)", B, T, C, NH);
    WITHIN(what, dgetf(g_lse, nl), lse, l_lse, nl);

    /* The backward from the GPU's own out and lse, as in training. */
    void *g_dqkv = dnan(dt, nqkv);
    gpu_ctx_set_attention(ctx, bwd);
    CHECK_CTX(gpu_attention_backward(ctx, dt, g_dqkv, dput(dt, dout, nout), g_qkv, g_out, g_lse, B,
                                     T, C, NH));
    snprintf(what, sizeof(what), "dqkv (B %d T %d C %d NH %d)", B, T, C, NH);
    WITHIN(what, dget(dt, g_dqkv, nqkv), dqkv, l_dqkv, nqkv);
}

/* One case with the default choice (GPU_ATT_AUTO: cuDNN's where it can, else our kernels). */
static void attention_case(enum gpu_dtype dt, int B, int T, int C, int NH)
{
    attention_modes(dt, B, T, C, NH, GPU_ATT_AUTO, GPU_ATT_AUTO);
}

CUDA_TEST(attention)
{
    attention_case(dt, 2, 70, 96, 3);   /* hs 32; T across tiles and row blocks */
    attention_case(dt, 1, 129, 128, 2); /* hs 64 */
    attention_case(dt, 2, 33, 128, 1);  /* hs 128 */
    attention_case(dt, 1, 41, 80, 2);   /* hs 40: part of a lane's dims unused */
    attention_case(dt, 3, 1, 64, 4);    /* one position */
    attention_case(dt, 1, 45, 54, 2);   /* hs 27: not a multiple of 4 (scalar reads) */
    attention_case(dt, 1, 300, 64, 1);  /* hs 64: ten tiles */
}

/* Forward and backward twice on the same inputs: identical bits (under cudasim the second run
 * takes the other schedule, as in the deterministic test). */
static void attention_repeat(enum gpu_dtype dt, int B, int T, int C, int NH)
{
    size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C, nl = (size_t)B * NH * T;
    void *qkv = dput(dt, hrand(dt, nqkv, 1.5f), nqkv),
         *dout = dput(dt, hrand(dt, nout, 1.0f), nout);
    float *got[2][3];

    for (int r = 0; r < 2; r++) {
        if (r == 1) {
            const char *s = getenv("CUDASIM_SCHEDULE");
            bool rev = s && !strcmp(s, "reverse");
            CHECK_EQ(setenv("CUDASIM_SCHEDULE", rev ? "forward" : "reverse", 1), 0);
        }
        void *out = dnan(dt, nout), *dqkv = dnan(dt, nqkv);
        float *lse = dnan(GPU_F32, nl);
        CHECK_CTX(gpu_attention_forward(ctx, dt, out, lse, qkv, B, T, C, NH));
        CHECK_CTX(gpu_attention_backward(ctx, dt, dqkv, dout, qkv, out, lse, B, T, C, NH));
        got[r][0] = dget(dt, out, nout);
        got[r][1] = dgetf(lse, nl);
        got[r][2] = dget(dt, dqkv, nqkv);
    }
    if (memcmp(got[0][0], got[1][0], nout * sizeof(float)) ||
        memcmp(got[0][1], got[1][1], nl * sizeof(float)) ||
        memcmp(got[0][2], got[1][2], nqkv * sizeof(float)))
        test_fail(__FILE__, __LINE__, "attention (B %d T %d C %d NH %d): two runs differ", B, T, C,
                  NH);
}

/* bf16 runs on tensor cores (attention_tc.cu; the attention test covers other head sizes): the
 * head sizes of its 64- and 128-wide kernels, T ragged across several 64-row tiles, a single
 * tile, one position, a head size padded with zeros and read element by element. */
TEST(cuda_attention_tc_bf16)
{
    test_device_setup();
    gpu_ctx_set_attention(ctx, GPU_ATT_OWN);
#define attention_case(dt, B, T, C, NH) attention_modes(dt, B, T, C, NH, GPU_ATT_OWN, GPU_ATT_OWN)
    attention_case(GPU_BF16, 2, 300, 128, 2); /* hs 64 (GPT-2's), five tiles, the last ragged */
    attention_case(GPU_BF16, 1, 300, 256, 2); /* hs 128 */
    attention_case(GPU_BF16, 1, 64, 256, 2);  /* hs 128, exactly one tile */
    attention_case(GPU_BF16, 2, 1, 128, 2);   /* T 1 */
    attention_case(GPU_BF16, 1, 1, 128, 1);   /* T 1, hs 128 */
    attention_case(GPU_BF16, 1, 130, 20, 1);  /* hs 20: padded to 32, scalar loads */
#undef attention_case
    attention_repeat(GPU_BF16, 1, 300, 256, 2);
    attention_repeat(GPU_BF16, 2, 129, 128, 2);
    test_device_finish();
}

/* cuDNN's fused attention (attention_cudnn.cpp), forced: against the CPU reference at GPT-2's
 * head size with T ragged, at head size 128, at one position (its forward; our backward);
 * its forward's lse feeding our backward and ours feeding its backward (the two share the
 * lse); two runs identical bit for bit (its deterministic backward). Skips where cuDNN cannot
 * be used (no libcudnn.so.9, a build without the cuDNN frontend, cudasim), with why. */
TEST(cuda_attention_cudnn_bf16)
{
    char why[320];

    test_device_setup();
    gpu_ctx_attention_describe(ctx, why, sizeof(why));
    if (strncmp(why, "cuDNN ", 6) != 0) {
        test_device_finish();
        test_skip("%s", why);
    }
    fprintf(stderr, "attention: %s\n", why);
    attention_modes(GPU_BF16, 2, 300, 128, 2, GPU_ATT_CUDNN, GPU_ATT_CUDNN); /* hs 64 */
    attention_modes(GPU_BF16, 1, 300, 256, 2, GPU_ATT_CUDNN, GPU_ATT_CUDNN); /* hs 128 */
    /* T 1: cuDNN's forward; its backward refuses one position ("s_q = s_kv = 1 is not
     * supported", cuDNN 9.19 on an H200): GPU_ATT_AUTO runs ours. */
    attention_modes(GPU_BF16, 2, 1, 128, 2, GPU_ATT_CUDNN, GPU_ATT_AUTO);
    attention_modes(GPU_BF16, 1, 512, 768, 12, GPU_ATT_CUDNN, GPU_ATT_CUDNN); /* GPT-2's heads */
    attention_modes(GPU_BF16, 2, 200, 128, 2, GPU_ATT_CUDNN, GPU_ATT_OWN);
    attention_modes(GPU_BF16, 2, 200, 128, 2, GPU_ATT_OWN, GPU_ATT_CUDNN);
    /* A shape cuDNN refuses (head size 20: its rows are not 16-byte aligned) runs our kernels
     * under GPU_ATT_AUTO and is refused under GPU_ATT_CUDNN. */
    attention_modes(GPU_BF16, 1, 130, 20, 1, GPU_ATT_AUTO, GPU_ATT_AUTO);
    gpu_ctx_set_attention(ctx, GPU_ATT_CUDNN);
    void *q = dput(GPU_BF16, hrand(GPU_BF16, 130 * 60, 1.0f), 130 * 60);
    CHECK_EQ(gpu_attention_forward(ctx, GPU_BF16, dnan(GPU_BF16, 130 * 20), dnan(GPU_F32, 130), q,
                                   1, 130, 20, 1),
             -ENOTSUP);
    CHECK(strstr(gpu_ctx_error(ctx), "cuDNN") != NULL);
    gpu_ctx_set_attention(ctx, GPU_ATT_CUDNN);
    attention_repeat(GPU_BF16, 1, 300, 256, 2);
    attention_repeat(GPU_BF16, 2, 129, 128, 2);
    test_device_finish();
}

/* ---- optimizer ----------------------------------------------------------------------------- */

CUDA_TEST(adamw)
{
    struct optim_span spans[] = {
        {0, 1000, true}, {1000, 37, false}, {1037, 4000, true}, {5037, 3, false}};
    size_t n = 5040, ns = sizeof(spans) / sizeof(spans[0]);
    struct adamw_config cfg = {0.9f, 0.95f, 1e-8f, 0.1f};
    struct adamw opt;
    uint64_t t = 5;
    float lr = 1e-2f, scale = 0.5f;
    float *params = hrand(GPU_F32, n, 1.0f), *grads = hrand(dt, n, 1.0f);
    float *m = hrand(GPU_F32, n, 0.1f), *v = hmalloc(n * sizeof(float));

    for (size_t i = 0; i < n; i++)
        v[i] = (float)(urand() * urand() * 0.01);
    float *g_master = dt == GPU_BF16 ? dputf(params, n) : NULL;
    void *g_params = dt == GPU_BF16 ? dnan(dt, n) : dputf(params, n);
    float *g_m = dputf(m, n), *g_v = dputf(v, n);

    CHECK_EQ(adamw_init(&opt, n, &cfg, spans, ns), 0);
    memcpy(opt.m, m, n * sizeof(float));
    memcpy(opt.v, v, n * sizeof(float));
    opt.step = t - 1;
    /* m' = b1 m + (1-b1) g s may cancel: 3 roundings on its terms' magnitudes, each side;
     * v' is a sum of positive terms: 4u relative, each side; the parameters: cuda_test.h's
     * adamw_update_bound (the master weights in bf16). */
    double *l_m = hmalloc(n * sizeof(double)), *l_v = hmalloc(n * sizeof(double));
    double *l_p = hmalloc(n * sizeof(double));
    float c1 = (float)(1.0 - pow(cfg.beta1, (double)t)),
          c2 = (float)(1.0 - pow(cfg.beta2, (double)t));
    for (size_t s = 0; s < ns; s++)
        for (size_t i = spans[s].offset; i < spans[s].offset + spans[s].count; i++) {
            double gs = fabs((double)grads[i] * scale);
            l_m[i] = 6.0 * U32 * (cfg.beta1 * fabs(m[i]) + (1.0 - cfg.beta1) * gs);
            l_v[i] = 8.0 * U32 * (cfg.beta2 * v[i] + (1.0 - cfg.beta2) * gs * gs);
            l_p[i] = adamw_update_bound(&cfg, params[i], grads[i], m[i], v[i], lr, scale,
                                        spans[s].decay ? cfg.weight_decay : 0.0f, c1, c2);
        }
    adamw_update(&opt, params, grads, lr, scale);
    CHECK_CTX(gpu_adamw_update(ctx, dt, g_params, g_master, dput(dt, grads, n), g_m, g_v, spans, ns,
                               &cfg, t, lr, scale));
    WITHIN("m", dgetf(g_m, n), opt.m, l_m, n);
    WITHIN("v", dgetf(g_v, n), opt.v, l_v, n);
    if (dt == GPU_BF16) {
        float *master = dgetf(g_master, n), *p = dget(dt, g_params, n);
        WITHIN("master", master, params, l_p, n);
        for (size_t i = 0; i < n; i++)
            if (p[i] != round_dt(GPU_BF16, master[i]))
                test_fail(__FILE__, __LINE__, "params[%zu] %.9g is not bf16(master %.9g)", i,
                          (double)p[i], (double)master[i]);
    } else {
        WITHIN("params", dgetf(g_params, n), params, l_p, n);
    }
    adamw_release(&opt);
}

CUDA_TEST(grad_norm)
{
    size_t sizes[] = {1, 255, 100003, 3000017};
    for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
        size_t n = sizes[k];
        float *g = hrand(dt, n, 1.0f);
        double got, sumsq = -1.0, again = -1.0, want = optim_grad_norm(g, n);
        void *d = dput(dt, g, n);
        /* The norm is the square root of the sum, as the training step takes it. */
        CHECK_CTX(gpu_sum_squares(ctx, dt, d, n, &sumsq));
        got = sqrt(sumsq);
        if (!(fabs(got - want) <= 1e-12 * want))
            test_fail(__FILE__, __LINE__, "norm of %zu: gpu %.17g vs cpu %.17g", n, got, want);
        /* The same order of additions every time. */
        CHECK_CTX(gpu_sum_squares(ctx, dt, d, n, &again));
        if (again != sumsq)
            test_fail(__FILE__, __LINE__, "sum of squares of %zu: %.17g, then %.17g", n, sumsq,
                      again);
    }
}

/* ---- determinism ---------------------------------------------------------------------------- */

/* One run of every op with a reduction on the inputs of struct det_in: each output, downloaded,
 * into out[k] (bytes[k] bytes, named name[k]). */
#define DET_OUTS 16

struct det_in {
    int N, C, OC, B, T, NH, V, Vp;
    void *x, *w, *b, *dout, *mm_w, *mm_dout, *qkv, *att_dout, *logits;
    float *mean, *rstd;
    int *tok, *g_targets;
};

struct det_out {
    int n;
    const char *name[DET_OUTS];
    void *data[DET_OUTS];
    size_t bytes[DET_OUTS];
};

static void det_keep(struct det_out *o, enum gpu_dtype dt, const char *name, const void *d,
                     size_t n)
{
    CHECK_INT(o->n, <, DET_OUTS);
    o->name[o->n] = name;
    o->data[o->n] = dget(dt, d, n);
    o->bytes[o->n] = n * sizeof(float);
    o->n++;
}

static void det_run(enum gpu_dtype dt, const struct det_in *in, struct det_out *o)
{
    int N = in->N, C = in->C, OC = in->OC, B = in->B, T = in->T, NH = in->NH;
    size_t n = (size_t)N * C, nqkv = (size_t)B * T * 3 * C, natt = (size_t)B * T * C;
    size_t nl = (size_t)B * T * in->Vp;
    double sumsq = 0.0;

    /* LayerNorm: forward, then all three gradients (accumulating onto copies of x and w). */
    void *out = dnan(dt, n), *dinp = dnan(dt, n), *dw = dnan(dt, C), *db = dnan(dt, C);
    float *mean = dnan(GPU_F32, N), *rstd = dnan(GPU_F32, N);
    CHECK_CTX(gpu_layernorm_forward(ctx, dt, out, mean, rstd, in->x, in->w, in->b, N, C));
    CHECK_CTX(gpu_convert(ctx, dt, dinp, dt, in->x, n));
    CHECK_CTX(gpu_convert(ctx, dt, dw, dt, in->w, C));
    CHECK_CTX(gpu_convert(ctx, dt, db, dt, in->b, C));
    CHECK_CTX(gpu_layernorm_backward(ctx, dt, dinp, dw, db, in->dout, in->x, in->w, in->mean,
                                     in->rstd, N, C));
    det_keep(o, dt, "layernorm out", out, n);
    det_keep(o, GPU_F32, "layernorm rstd", rstd, N);
    det_keep(o, dt, "layernorm dinp", dinp, n);
    det_keep(o, dt, "layernorm dweight", dw, C);
    det_keep(o, dt, "layernorm dbias", db, C);

    /* Encoder backward (tokens repeat: V is small). */
    void *dwte = dnan(dt, (size_t)in->V * C), *dwpe = dnan(dt, (size_t)T * C);
    CHECK_CTX(gpu_fill_bytes(ctx, dwte, 0, (size_t)in->V * C * gpu_dtype_size(dt)));
    CHECK_CTX(gpu_fill_bytes(ctx, dwpe, 0, (size_t)T * C * gpu_dtype_size(dt)));
    CHECK_CTX(gpu_encoder_backward(ctx, dt, dwte, dwpe, in->dout, in->tok, B, T, C, in->V));
    det_keep(o, dt, "encoder dwte", dwte, (size_t)in->V * C);
    det_keep(o, dt, "encoder dwpe", dwpe, (size_t)T * C);

    /* Matmul backward with bias and GELU: dbias is our column sum. */
    void *mdinp = dnan(dt, n), *mdw = dnan(dt, (size_t)OC * C), *mdb = dnan(dt, OC);
    CHECK_CTX(gpu_fill_bytes(ctx, mdw, 0, (size_t)OC * C * gpu_dtype_size(dt)));
    CHECK_CTX(gpu_fill_bytes(ctx, mdb, 0, OC * gpu_dtype_size(dt)));
    CHECK_CTX(gpu_matmul_backward(ctx, dt, mdinp, mdw, mdb, in->mm_dout, in->x, in->mm_w, in->x, N,
                                  C, OC));
    det_keep(o, dt, "matmul dinp", mdinp, n);
    det_keep(o, dt, "matmul dbias", mdb, OC);

    /* Attention forward and backward. */
    void *aout = dnan(dt, natt), *dqkv = dnan(dt, nqkv);
    float *lse = dnan(GPU_F32, (size_t)B * NH * T);
    CHECK_CTX(gpu_attention_forward(ctx, dt, aout, lse, in->qkv, B, T, C, NH));
    CHECK_CTX(gpu_attention_backward(ctx, dt, dqkv, in->att_dout, in->qkv, aout, lse, B, T, C, NH));
    det_keep(o, dt, "attention out", aout, natt);
    det_keep(o, GPU_F32, "attention lse", lse, (size_t)B * NH * T);
    det_keep(o, dt, "attention dqkv", dqkv, nqkv);

    /* Cross-entropy, fused, over a copy of the logits. */
    void *logits = dnan(dt, nl);
    float *losses = dnan(GPU_F32, (size_t)B * T), *clse = dnan(GPU_F32, (size_t)B * T);
    CHECK_CTX(gpu_convert(ctx, dt, logits, dt, in->logits, nl));
    CHECK_CTX(gpu_crossentropy_fused(ctx, dt, losses, clse, logits, in->g_targets, B * T, in->V,
                                     in->Vp, 1.0f / (float)(B * T)));
    det_keep(o, GPU_F32, "crossentropy losses", losses, (size_t)B * T);
    det_keep(o, dt, "crossentropy dlogits", logits, nl);

    /* The gradient norm's sum over everything the attention produced. */
    CHECK_CTX(gpu_sum_squares(ctx, dt, dqkv, nqkv, &sumsq));
    double *h = hmalloc(sizeof(double));
    *h = sumsq;
    CHECK_INT(o->n, <, DET_OUTS);
    o->name[o->n] = "gradient sum of squares";
    o->data[o->n] = h;
    o->bytes[o->n++] = sizeof(double);
}

/* Every op with a reduction of its own (and the matmuls), twice on the same inputs: identical
 * bits. Shapes off every tile and warp multiple. */
CUDA_TEST(deterministic)
{
    struct det_in in = {.N = 301, .C = 96, .OC = 40, .B = 2, .T = 101, .NH = 3, .V = 7, .Vp = 16};
    size_t n = (size_t)in.N * in.C, nbt = (size_t)in.B * in.T;
    struct det_out o[2];
    int *targets = hmalloc(nbt * sizeof(int));

    in.x = dput(dt, hrand(dt, n, 1.0f), n);
    in.w = dput(dt, hrand_off(dt, in.C, 0.5f, 1.0f), in.C);
    in.b = dput(dt, hrand(dt, in.C, 0.5f), in.C);
    in.dout = dput(dt, hrand(dt, n, 1.0f), n);
    in.mm_w = dput(dt, hrand(dt, (size_t)in.OC * in.C, 0.2f), (size_t)in.OC * in.C);
    in.mm_dout = dput(dt, hrand(dt, (size_t)in.N * in.OC, 1.0f), (size_t)in.N * in.OC);
    in.mean = dputf(hrand(GPU_F32, in.N, 0.1f), in.N);
    in.rstd = dputf(hrand_off(GPU_F32, in.N, 0.1f, 1.0f), in.N);
    in.qkv = dput(dt, hrand(dt, nbt * 3 * in.C, 1.0f), nbt * 3 * in.C);
    in.att_dout = dput(dt, hrand(dt, nbt * in.C, 1.0f), nbt * in.C);
    in.logits = dput(dt, hrand(dt, nbt * in.Vp, 4.0f), nbt * in.Vp);
    in.tok = hmalloc(nbt * sizeof(int));
    for (size_t i = 0; i < nbt; i++) {
        in.tok[i] = irand(in.V);
        targets[i] = irand(in.V);
    }
    in.g_targets = dputi(targets, nbt);
    for (int r = 0; r < 2; r++) {
        /* Under cudasim the second run takes the other order of threads (its schedules): a
         * kernel whose result depends on that order has a race. A GPU ignores the variable. */
        if (r == 1) {
            const char *s = getenv("CUDASIM_SCHEDULE");
            bool rev = s && !strcmp(s, "reverse");
            CHECK_EQ(setenv("CUDASIM_SCHEDULE", rev ? "forward" : "reverse", 1), 0);
        }
        o[r].n = 0;
        det_run(dt, &in, &o[r]);
    }
    for (int k = 0; k < o[0].n; k++)
        if (memcmp(o[0].data[k], o[1].data[k], o[0].bytes[k]))
            test_fail(__FILE__, __LINE__, "%s: two runs on the same inputs differ", o[0].name[k]);
}
