/* Tests of the CUDA backend's GPT-2 model (kernels/cuda/gpt2_gpu.c) against the CPU model of
 * kernels/gpt2.c and AdamW of kernels/optim.c on the same parameters and tokens: the loss and
 * every gradient tensor of a training step (fp32 tight, bf16 loose), gradient accumulation,
 * the logits of a forward without targets, the AdamW update whole and as a ZeRO-1 shard,
 * state round trips, the gradients' sum of squares and bad input. Without a CUDA device every
 * test skips. The inputs come from a fixed seed (printed); GPURUN_TEST_SEED=N picks another.
 *
 * Tolerance. Every op of a step is held to limits derived element by element from its
 * arithmetic in test_cuda_ops.c; here the ops are composed, and the limits are per tensor,
 * not derived for each element: an element passes when |gpu - cpu| <= atol + rtol |cpu| with
 * atol = arel max|cpu| over the tensor (a gradient element near zero is a sum that cancelled:
 * judged against the tensor's scale). fp32 (TOL_F32): each of the step's ops errs by at most
 * 2 gamma(K) of its terms' magnitudes on the two sides (K <= 4C + 1 = 257 terms here: 3.1e-5),
 * and the backward's chain through two layers adds a few such errors to an element: rtol 1e-4
 * and arel 1e-5. The AdamW update is the exception, derived per element (adamw_update_bound,
 * cuda_test.h), since a tensor-wide limit failed 1 run in 30 there. bf16 (TOL_BF16_*): see
 * bf16_step. These tests show the wiring; the ops' limits show the numerics. */
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
#include "optim.h"
#include "test.h"
#include "cuda_test.h"
#include "banned.h"

struct tol {
    double rtol, arel;
};

static const struct tol TOL_F32 = {1e-4, 1e-5};
/* bf16 activations: see bf16_step. */
static const struct tol TOL_BF16_GRAD = {5e-2, 5e-2};
/* Relative L2 error of a whole bf16 gradient tensor (see bf16_step). */
#define BF16_GRAD_L2   3e-2
#define BF16_LOSS_RTOL 1e-2

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

#define COMPARE(what, got, ref, n, tol) compare(__FILE__, __LINE__, what, got, ref, n, tol, 0.0)

/* Fails when an element of got is outside the tolerance of ref (NaN always is), after
 * printing the first mismatches (name and index), or when the relative L2 error of the whole
 * exceeds l2 (0: not checked). */
static void compare(const char *file, int line, const char *what, const float *got,
                    const float *ref, size_t n, struct tol t, double l2)
{
    double maxref = 0.0, num = 0.0, den = 0.0, atol, rel;
    size_t bad = 0, first = 0;

    for (size_t i = 0; i < n; i++)
        maxref = fabs(ref[i]) > maxref ? fabs(ref[i]) : maxref;
    atol = t.arel * maxref;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - ref[i]), lim = atol + t.rtol * fabs(ref[i]);
        if (!(e <= lim)) {
            if (bad < 8)
                fprintf(stderr, "%s[%zu]: gpu %.9g vs cpu %.9g (|diff| %.3g > %.3g)\n", what, i,
                        (double)got[i], (double)ref[i], e, lim);
            if (!bad)
                first = i;
            bad++;
        }
        num += isfinite(e) ? e * e : INFINITY;
        den += (double)ref[i] * ref[i];
    }
    rel = den > 0 ? sqrt(num / den) : sqrt(num);
    if (bad)
        test_fail(file, line,
                  "%s: %zu of %zu elements outside rtol %g + atol %g, the first at [%zu]; "
                  "relative L2 error %.3g",
                  what, bad, n, t.rtol, atol, first, rel);
    if (l2 > 0 && !(rel <= l2))
        test_fail(file, line, "%s: relative L2 error %.3g above %g", what, rel, l2);
}

/* Every parameter tensor of got against ref (n_params floats in gpt2's layout), named. */
static void compare_tensors(const char *file, int line, const char *what,
                            const struct gpt2_tensor *tensors, const float *got, const float *ref,
                            struct tol t, double l2)
{
    for (int i = 0; i < GPT2_NUM_TENSORS; i++) {
        char name[64];
        snprintf(name, sizeof(name), "%s %s", what, tensors[i].name);
        compare(file, line, name, got + tensors[i].offset, ref + tensors[i].offset,
                tensors[i].count, t, l2);
    }
}

#define COMPARE_TENSORS(what, tensors, got, ref, t, l2)                                            \
    compare_tensors(__FILE__, __LINE__, what, tensors, got, ref, t, l2)

static void same_bits(const char *what, const void *a, const void *b, size_t bytes)
{
    if (memcmp(a, b, bytes))
        test_fail(__FILE__, __LINE__, "%s: differ", what);
}

static void check_loss(const char *what, float got, float ref, double rtol)
{
    if (!(fabs((double)got - ref) <= rtol * fabs(ref)))
        test_fail(__FILE__, __LINE__, "%s: gpu %.9g vs cpu %.9g (rtol %g)", what, (double)got,
                  (double)ref, rtol);
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

/* ---- the training step --------------------------------------------------------------------- */

/* One forward_backward against gpt2_forward + gpt2_backward in fp32: loss, every gradient
 * tensor (padding rows of wte and the unused rows of wpe included), and a second run giving
 * the same bits. */
TEST_T(cuda_model_step_f32, 120)
{
    struct gpt2 cpu;
    int B = B_CAP, T = T_CAP, n = B * T;
    float loss_cpu = 0.0f, loss = 0.0f, loss2 = 0.0f;

    test_device_setup();
    cpu_model(&cpu, GPU_F32);
    struct gpt2_gpu_opts o = opts_of(GPU_F32);
    struct gpt2_gpu *m = gpu_model(&o, &cpu);
    int *in = random_tokens(n), *tg = random_tokens(n);
    float *g = hmalloc(cpu.n_params * sizeof(float)), *g2 = hmalloc(cpu.n_params * sizeof(float));

    CHECK_EQ(gpt2_forward(&cpu, in, tg, B, T, &loss_cpu), 0);
    gpt2_zero_grad(&cpu);
    CHECK_EQ(gpt2_backward(&cpu, 1.0f), 0);
    CHECK_GPU(gpt2_gpu_zero_grad(m));
    CHECK_GPU(gpt2_gpu_forward_backward(m, in, tg, B, T, 1.0f, &loss));
    CHECK_GPU(gpt2_gpu_get_grads(m, g));
    check_loss("loss", loss, loss_cpu, 1e-5);
    COMPARE_TENSORS("grad", cpu.tensors, g, cpu.grads, TOL_F32, 0.0);

    CHECK_GPU(gpt2_gpu_zero_grad(m));
    CHECK_GPU(gpt2_gpu_forward_backward(m, in, tg, B, T, 1.0f, &loss2));
    CHECK_GPU(gpt2_gpu_get_grads(m, g2));
    same_bits("loss of a second run", &loss, &loss2, sizeof(float));
    same_bits("gradients of a second run", g, g2, cpu.n_params * sizeof(float));

    gpt2_gpu_free(m);
    gpt2_release(&cpu);
    test_device_finish();
}

/* Two micro-batches of a smaller shape with grad_scale 1/2 each, added into one gradient. */
TEST_T(cuda_model_accumulation_f32, 120)
{
    struct gpt2 cpu;
    int B = 2, T = 11, n = B * T;
    float lc[2], lg[2];

    test_device_setup();
    cpu_model(&cpu, GPU_F32);
    struct gpt2_gpu_opts o = opts_of(GPU_F32);
    struct gpt2_gpu *m = gpu_model(&o, &cpu);
    float *g = hmalloc(cpu.n_params * sizeof(float));

    gpt2_zero_grad(&cpu);
    CHECK_GPU(gpt2_gpu_zero_grad(m));
    for (int k = 0; k < 2; k++) {
        int *in = random_tokens(n), *tg = random_tokens(n);
        CHECK_EQ(gpt2_forward(&cpu, in, tg, B, T, &lc[k]), 0);
        CHECK_EQ(gpt2_backward(&cpu, 0.5f), 0);
        CHECK_GPU(gpt2_gpu_forward_backward(m, in, tg, B, T, 0.5f, &lg[k]));
        check_loss("micro-batch loss", lg[k], lc[k], 1e-5);
    }
    CHECK_GPU(gpt2_gpu_get_grads(m, g));
    COMPARE_TENSORS("accumulated grad", cpu.tensors, g, cpu.grads, TOL_F32, 0.0);

    gpt2_gpu_free(m);
    gpt2_release(&cpu);
    test_device_finish();
}

/* bf16: parameters are the same bf16 values on both sides, but the GPU stores every
 * activation and activation gradient in bf16 (2^-9 relative rounding each) and the CPU keeps
 * them in fp32. The loss moves by a few of those roundings (rtol 1e-2). A gradient element is
 * a long chain of rounded products and of sums that partly cancel, so single elements can be
 * off by several percent of their own size: each element within 5% of itself plus 5% of its
 * tensor's largest, and the tensor as a whole within 3% in L2 norm (what catches a bug: a
 * wrong term shifts the whole tensor, not a few elements). */
TEST_T(cuda_model_step_bf16, 120)
{
    struct gpt2 cpu;
    int B = B_CAP, T = T_CAP, n = B * T;
    float loss_cpu = 0.0f, loss = 0.0f;

    test_device_setup();
    cpu_model(&cpu, GPU_BF16);
    struct gpt2_gpu_opts o = opts_of(GPU_BF16);
    struct gpt2_gpu *m = gpu_model(&o, &cpu);
    int *in = random_tokens(n), *tg = random_tokens(n);
    float *g = hmalloc(cpu.n_params * sizeof(float));

    CHECK_EQ(gpt2_forward(&cpu, in, tg, B, T, &loss_cpu), 0);
    gpt2_zero_grad(&cpu);
    CHECK_EQ(gpt2_backward(&cpu, 1.0f), 0);
    CHECK_GPU(gpt2_gpu_zero_grad(m));
    CHECK_GPU(gpt2_gpu_forward_backward(m, in, tg, B, T, 1.0f, &loss));
    CHECK_GPU(gpt2_gpu_get_grads(m, g));
    check_loss("loss", loss, loss_cpu, BF16_LOSS_RTOL);
    COMPARE_TENSORS("grad", cpu.tensors, g, cpu.grads, TOL_BF16_GRAD, BF16_GRAD_L2);

    gpt2_gpu_free(m);
    gpt2_release(&cpu);
    test_device_finish();
}

/* ---- forward only -------------------------------------------------------------------------- */

/* Logits of a forward without targets, every row, against gpt2_logits; the loss of a forward
 * with targets; no logits after a training step. */
static void forward_only(enum gpu_dtype dt)
{
    struct gpt2 cpu;
    int B = 2, T = 13, n = B * T, Vp = cfg.padded_vocab_size;
    float loss_cpu = 0.0f, loss = 0.0f;
    struct tol t = dt == GPU_BF16 ? (struct tol){2e-2, 2e-2} : TOL_F32;

    cpu_model(&cpu, dt);
    struct gpt2_gpu_opts o = opts_of(dt);
    struct gpt2_gpu *m = gpu_model(&o, &cpu);
    int *in = random_tokens(n), *tg = random_tokens(n);
    float *row = hmalloc((size_t)Vp * sizeof(float));

    CHECK_EQ(gpt2_forward(&cpu, in, NULL, B, T, NULL), 0);
    CHECK_GPU(gpt2_gpu_forward(m, in, NULL, B, T, NULL));
    for (int b = 0; b < B; b++)
        for (int p = 0; p < T; p++) {
            char what[48];
            snprintf(what, sizeof(what), "logits row (%d, %d)", b, p);
            CHECK_GPU(gpt2_gpu_logits_row(m, b, p, row));
            compare(__FILE__, __LINE__, what, row, gpt2_logits(&cpu) + ((size_t)b * T + p) * Vp,
                    (size_t)Vp, t, 0.0);
            for (int j = cfg.vocab_size; j < Vp; j++)
                CHECK(row[j] == 0.0f); /* wte's padding rows are zero */
        }
    CHECK_EQ(gpt2_gpu_logits_row(m, B, 0, row), -EINVAL);
    CHECK_CONTAINS(gerr.text, "outside");
    CHECK_EQ(gpt2_gpu_logits_row(m, 0, T, row), -EINVAL);

    CHECK_EQ(gpt2_forward(&cpu, in, tg, B, T, &loss_cpu), 0);
    CHECK_GPU(gpt2_gpu_forward(m, in, tg, B, T, &loss));
    check_loss("evaluation loss", loss, loss_cpu, dt == GPU_BF16 ? BF16_LOSS_RTOL : 1e-5);

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
    COMPARE_TENSORS("m", cpu.tensors, gm1, opt.m, TOL_F32, 0.0);
    COMPARE_TENSORS("v", cpu.tensors, gm2, opt.v, TOL_F32, 0.0);
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
        /* Exact squares of bf16 values, summed in double in another order. */
        if (!(fabs(got - want) <= 1e-10 * want) || memcmp(&got, &again, sizeof(got)))
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
