/* Tests of kernels/gpt2: the whole model against an independent double-precision GPT-2
 * written here from its definition (loss equal within 1e-5 relative; sampled gradients of
 * every tensor within 1e-3 relative of central differences of that reference's loss), the
 * initialisation, loss ln(V) at init, bit-identical results across runs and thread counts,
 * gradient accumulation, inference, sampling, errors, and a short AdamW run that learns. */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>

#include "errmsg.h"
#include "gpt2.h"
#include "optim.h"
#include "test.h"
#include "banned.h"

#define LOSS_RTOL  1e-5
#define GRAD_RTOL  1e-3
#define GRAD_ATOL  1e-4 /* relative to the tensor's largest sampled gradient */
#define FD_STEP    1e-5
/* Parameters per tensor whose gradient is checked by central differences. */
#define FD_SAMPLES 12

/* V = 60 pads to Vp = 128; two layers of two heads of 8. */
static const struct gpt2_config tiny = {
    .max_seq_len = 12,
    .vocab_size = 60,
    .padded_vocab_size = 128,
    .n_layer = 2,
    .n_head = 2,
    .n_embd = 16,
};

static unsigned long long rng_state = 0x2545f4914f6cdd1dull;

static double urand(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / 9007199254740992.0;
}

static void random_tokens(int *x, int n, int V)
{
    for (int i = 0; i < n; i++)
        x[i] = (int)(urand() * V) % V;
}

/* A model in a livelier state than the init (larger weights, LayerNorm gains off 1, non-zero
 * biases), so that every path carries a gradient worth checking. */
static void init_lively(struct gpt2 *m, uint64_t seed)
{
    gpt2_init_random(m, seed);
    for (size_t i = 0; i < m->n_params; i++)
        m->params[i] += (float)(0.4 * (urand() - 0.5));
}

/* ---- the reference model, in double ------------------------------------------------------ */

struct ref {
    const struct gpt2 *m; /* for the tensor layout and config */
    const int *inputs, *targets;
    int B, T;
};

static const double *ref_tensor(const struct ref *r, const double *p, int i, int l)
{
    const struct gpt2_tensor *t = &r->m->tensors[i];
    return p + t->offset + (size_t)l * (t->count / (i >= 2 && i <= 13 ? r->m->cfg.n_layer : 1));
}

static void ref_layernorm(double *out, const double *x, const double *w, const double *b, int C)
{
    double mean = 0.0, var = 0.0;
    for (int c = 0; c < C; c++)
        mean += x[c];
    mean /= C;
    for (int c = 0; c < C; c++)
        var += (x[c] - mean) * (x[c] - mean);
    double rstd = 1.0 / sqrt(var / C + 1e-5);
    for (int c = 0; c < C; c++)
        out[c] = (x[c] - mean) * rstd * w[c] + b[c];
}

/* out (n) = W (n, k) x (k) + b */
static void ref_linear(double *out, const double *x, const double *w, const double *b, int k, int n)
{
    for (int o = 0; o < n; o++) {
        double s = b ? b[o] : 0.0;
        for (int c = 0; c < k; c++)
            s += w[(size_t)o * k + c] * x[c];
        out[o] = s;
    }
}

/* The mean cross-entropy loss of GPT-2 with parameters p, position by position. */
static double ref_loss(const struct ref *r, const double *p)
{
    const struct gpt2_config *cfg = &r->m->cfg;
    int C = cfg->n_embd, NH = cfg->n_head, hs = C / NH, T = r->T, BT = r->B * r->T;
    double *x = calloc((size_t)BT * C, sizeof(double)), *h = malloc(C * sizeof(double));
    double *qkv = malloc((size_t)T * 3 * C * sizeof(double)), *y = malloc(C * sizeof(double));
    double *f = malloc(4 * C * sizeof(double)), *o = malloc(C * sizeof(double));
    double *s = malloc(T * sizeof(double)), loss = 0.0;

    CHECK(x && h && qkv && y && f && o && s);
    for (int bt = 0; bt < BT; bt++) {
        for (int c = 0; c < C; c++)
            x[(size_t)bt * C + c] = ref_tensor(r, p, 0, 0)[(size_t)r->inputs[bt] * C + c] +
                                    ref_tensor(r, p, 1, 0)[(size_t)(bt % T) * C + c];
    }
    for (int l = 0; l < cfg->n_layer; l++) {
        for (int b = 0; b < r->B; b++) {
            double *xb = x + (size_t)b * T * C;
            for (int t = 0; t < T; t++) {
                ref_layernorm(h, xb + (size_t)t * C, ref_tensor(r, p, 2, l), ref_tensor(r, p, 3, l),
                              C);
                ref_linear(qkv + (size_t)t * 3 * C, h, ref_tensor(r, p, 4, l),
                           ref_tensor(r, p, 5, l), C, 3 * C);
            }
            /* Attention for every position before the residual changes xb. */
            double *att_out = calloc((size_t)T * C, sizeof(double));
            CHECK(att_out);
            for (int t = 0; t < T; t++) {
                for (int hd = 0; hd < NH; hd++) {
                    double max = -INFINITY, sum = 0.0;
                    for (int t2 = 0; t2 <= t; t2++) {
                        double d = 0.0;
                        for (int i = 0; i < hs; i++)
                            d += qkv[(size_t)t * 3 * C + hd * hs + i] *
                                 qkv[(size_t)t2 * 3 * C + C + hd * hs + i];
                        s[t2] = d / sqrt((double)hs);
                        max = s[t2] > max ? s[t2] : max;
                    }
                    for (int t2 = 0; t2 <= t; t2++)
                        sum += (s[t2] = exp(s[t2] - max));
                    for (int t2 = 0; t2 <= t; t2++) {
                        for (int i = 0; i < hs; i++)
                            att_out[(size_t)t * C + hd * hs + i] +=
                                s[t2] / sum * qkv[(size_t)t2 * 3 * C + 2 * C + hd * hs + i];
                    }
                }
            }
            for (int t = 0; t < T; t++) {
                double *xt = xb + (size_t)t * C;
                ref_linear(o, att_out + (size_t)t * C, ref_tensor(r, p, 6, l),
                           ref_tensor(r, p, 7, l), C, C);
                for (int c = 0; c < C; c++)
                    xt[c] += o[c];
                ref_layernorm(h, xt, ref_tensor(r, p, 8, l), ref_tensor(r, p, 9, l), C);
                ref_linear(f, h, ref_tensor(r, p, 10, l), ref_tensor(r, p, 11, l), C, 4 * C);
                for (int i = 0; i < 4 * C; i++)
                    f[i] = 0.5 * f[i] *
                           (1.0 + tanh(sqrt(2.0 / M_PI) * (f[i] + 0.044715 * f[i] * f[i] * f[i])));
                ref_linear(o, f, ref_tensor(r, p, 12, l), ref_tensor(r, p, 13, l), 4 * C, C);
                for (int c = 0; c < C; c++)
                    xt[c] += o[c];
            }
            free(att_out);
        }
    }
    for (int bt = 0; bt < BT; bt++) {
        double logits_max = -INFINITY, sum = 0.0, target_logit = 0.0;
        double *logits = malloc(cfg->vocab_size * sizeof(double));
        CHECK(logits);
        ref_layernorm(h, x + (size_t)bt * C, ref_tensor(r, p, 14, 0), ref_tensor(r, p, 15, 0), C);
        /* The tied head over the real vocabulary only. */
        ref_linear(logits, h, ref_tensor(r, p, 0, 0), NULL, C, cfg->vocab_size);
        for (int v = 0; v < cfg->vocab_size; v++)
            logits_max = logits[v] > logits_max ? logits[v] : logits_max;
        for (int v = 0; v < cfg->vocab_size; v++)
            sum += exp(logits[v] - logits_max);
        target_logit = logits[r->targets[bt]];
        loss += logits_max + log(sum) - target_logit;
        free(logits);
    }
    free(x), free(h), free(qkv), free(y), free(f), free(o), free(s);
    return loss / BT;
}

/* The fp32 model's loss and every tensor's sampled gradients against the reference. */
static void check_against_reference(int B, int T, int cap_B, int cap_T)
{
    struct gpt2 m;
    int *in = malloc((size_t)B * T * sizeof(int)), *tg = malloc((size_t)B * T * sizeof(int));
    float loss;

    CHECK(in && tg);
    CHECK_EQ(gpt2_init(&m, &tiny, cap_B, cap_T), 0);
    init_lively(&m, 7);
    random_tokens(in, B * T, tiny.vocab_size);
    random_tokens(tg, B * T, tiny.vocab_size);
    CHECK_EQ(gpt2_forward(&m, in, tg, B, T, &loss), 0);
    gpt2_zero_grad(&m);
    CHECK_EQ(gpt2_backward(&m, 1.0f), 0);

    struct ref r = {&m, in, tg, B, T};
    double *p = malloc(m.n_params * sizeof(double));
    CHECK(p);
    for (size_t i = 0; i < m.n_params; i++)
        p[i] = m.params[i];
    double want = ref_loss(&r, p);
    if (!(fabs(loss - want) <= LOSS_RTOL * want))
        test_fail(__FILE__, __LINE__, "loss %.9g vs reference %.9g", (double)loss, want);

    for (int k = 0; k < GPT2_NUM_TENSORS; k++) {
        const struct gpt2_tensor *t = &m.tensors[k];
        double fd[FD_SAMPLES], max = 0.0;
        size_t idx[FD_SAMPLES];
        /* wte: sample the real rows only; the padding rows' gradients are checked to be 0. */
        size_t n = k == 0 ? (size_t)tiny.vocab_size * tiny.n_embd : t->count;

        for (int s = 0; s < FD_SAMPLES; s++) {
            /* The largest gradient first, then random elements. */
            size_t i = 0;
            if (s == 0) {
                for (size_t j = 1; j < n; j++)
                    i = fabsf(m.grads[t->offset + j]) > fabsf(m.grads[t->offset + i]) ? j : i;
            } else {
                i = (size_t)(urand() * (double)n) % n;
            }
            double *pi = p + t->offset + i, save = *pi;
            *pi = save + FD_STEP;
            double up = ref_loss(&r, p);
            *pi = save - FD_STEP;
            double down = ref_loss(&r, p);
            *pi = save;
            idx[s] = i;
            fd[s] = (up - down) / (2.0 * FD_STEP);
            max = fabs(fd[s]) > max ? fabs(fd[s]) : max;
        }
        CHECK(max > 0.0);
        for (int s = 0; s < FD_SAMPLES; s++) {
            double got = m.grads[t->offset + idx[s]];
            if (!(fabs(got - fd[s]) <= GRAD_RTOL * fabs(fd[s]) + GRAD_ATOL * max))
                test_fail(__FILE__, __LINE__, "d%s[%zu]: backward %.9g vs central difference %.9g",
                          t->name, idx[s], got, fd[s]);
        }
        if (k == 0) {
            for (size_t j = n; j < t->count; j++)
                CHECK(m.grads[t->offset + j] == 0.0f);
        }
    }
    free(p), free(in), free(tg);
    gpt2_release(&m);
}

TEST_T(gpt2_matches_reference_model, 60)
{
    check_against_reference(2, 8, 2, 8);
}

/* A forward smaller than the capacity uses the buffers in its own layout. */
TEST_T(gpt2_matches_reference_below_capacity, 60)
{
    check_against_reference(1, 5, 3, 12);
}

/* ---- initialisation ----------------------------------------------------------------------- */

static void moments(const float *x, size_t n, double *mean, double *std)
{
    double s = 0.0, s2 = 0.0;
    for (size_t i = 0; i < n; i++)
        s += x[i], s2 += (double)x[i] * x[i];
    *mean = s / n;
    *std = sqrt(s2 / n - *mean * *mean);
}

TEST(gpt2_init_random_follows_gpt2)
{
    struct gpt2_config cfg = {.max_seq_len = 64,
                              .vocab_size = 300,
                              .padded_vocab_size = 384,
                              .n_layer = 4,
                              .n_head = 4,
                              .n_embd = 64};
    struct gpt2 a, b;
    double mean, std;

    CHECK_EQ(gpt2_init(&a, &cfg, 1, 8), 0);
    CHECK_EQ(gpt2_init(&b, &cfg, 1, 8), 0);
    gpt2_init_random(&a, 42);
    gpt2_init_random(&b, 42);
    CHECK(!memcmp(a.params, b.params, a.n_params * sizeof(float)));
    gpt2_init_random(&b, 43);
    CHECK(memcmp(a.params, b.params, a.n_params * sizeof(float)));

    for (int k = 0; k < GPT2_NUM_TENSORS; k++) {
        const struct gpt2_tensor *t = &a.tensors[k];
        const float *x = a.params + t->offset;
        size_t n = k == 0 ? (size_t)cfg.vocab_size * cfg.n_embd : t->count;
        bool ln_weight =
            !strcmp(t->name, "ln1w") || !strcmp(t->name, "ln2w") || !strcmp(t->name, "lnfw");
        bool resid = !strcmp(t->name, "attprojw") || !strcmp(t->name, "fcprojw");

        if (t->decay) {
            double want = resid ? 0.02 / sqrt(2.0 * cfg.n_layer) : 0.02;
            moments(x, n, &mean, &std);
            if (!(fabs(std - want) < 0.05 * want && fabs(mean) < 0.05 * want))
                test_fail(__FILE__, __LINE__, "%s: mean %g std %g, want std %g", t->name, mean, std,
                          want);
        } else {
            for (size_t i = 0; i < n; i++)
                CHECK(x[i] == (ln_weight ? 1.0f : 0.0f));
        }
        if (k == 0) {
            for (size_t i = n; i < t->count; i++)
                CHECK(x[i] == 0.0f);
        }
    }
    gpt2_release(&a);
    gpt2_release(&b);
}

TEST(gpt2_tensor_layout_is_llmc)
{
    static const char *const names[GPT2_NUM_TENSORS] = {
        "wte",  "wpe",  "ln1w", "ln1b", "qkvw",    "qkvb",    "attprojw", "attprojb",
        "ln2w", "ln2b", "fcw",  "fcb",  "fcprojw", "fcprojb", "lnfw",     "lnfb"};
    struct gpt2_config cfg = {.max_seq_len = 1024,
                              .vocab_size = 50257,
                              .padded_vocab_size = gpt2_padded_vocab(50257),
                              .n_layer = 12,
                              .n_head = 12,
                              .n_embd = 768};
    struct gpt2_tensor t[GPT2_NUM_TENSORS];
    size_t n = gpt2_tensors(&cfg, t);

    CHECK_EQ(cfg.padded_vocab_size, 50304);
    CHECK_EQ(gpt2_padded_vocab(256), 256);
    CHECK_EQ(gpt2_padded_vocab(257), 384);
    /* GPT-2 small with the padded vocabulary: llm.c's parameter count. */
    CHECK_EQ(n, 124475904);
    for (int k = 0; k < GPT2_NUM_TENSORS; k++) {
        CHECK_STR(t[k].name, names[k]);
        CHECK_EQ(t[k].offset, k ? t[k - 1].offset + t[k - 1].count : 0);
    }
    CHECK_EQ(t[4].count, 12u * 3 * 768 * 768);
    CHECK_EQ(t[12].count, 12u * 768 * 4 * 768);
}

TEST(gpt2_config_checks)
{
    struct gpt2_config cfg = tiny;
    struct errmsg err;
    struct gpt2 m;

    CHECK(gpt2_config_valid(&cfg, &err));
    cfg.n_head = 5;
    CHECK(!gpt2_config_valid(&cfg, &err));
    CHECK_STR(err.text, "n_head (5) must divide n_embd (16)");
    CHECK_EQ(gpt2_init(&m, &cfg, 1, 4), -EINVAL);
    cfg = tiny;
    cfg.padded_vocab_size = 59;
    CHECK(!gpt2_config_valid(&cfg, &err));
    CHECK_STR(err.text, "padded_vocab_size (59) must be at least vocab_size (60)");
    cfg = tiny;
    cfg.n_layer = 0;
    CHECK(!gpt2_config_valid(&cfg, &err));
    CHECK_STR(err.text, "n_layer (0) must be positive");
    /* A sequence capacity beyond wpe. */
    CHECK_EQ(gpt2_init(&m, &tiny, 1, tiny.max_seq_len + 1), -EINVAL);
}

/* ---- behaviour ---------------------------------------------------------------------------- */

TEST(gpt2_initial_loss_is_log_vocab)
{
    struct gpt2_config cfg = tiny;
    struct gpt2 m;
    int in[4 * 12], tg[4 * 12];
    float loss;

    cfg.n_embd = 64;
    cfg.n_head = 4;
    CHECK_EQ(gpt2_init(&m, &cfg, 4, 12), 0);
    gpt2_init_random(&m, 1);
    random_tokens(in, 48, cfg.vocab_size);
    random_tokens(tg, 48, cfg.vocab_size);
    CHECK_EQ(gpt2_forward(&m, in, tg, 4, 12, &loss), 0);
    /* Not exactly ln(V): the tied embedding lifts the input token's own logit a little. */
    if (!(fabs(loss - log(cfg.vocab_size)) < 0.1))
        test_fail(__FILE__, __LINE__, "initial loss %g, want ln(%d) = %g", (double)loss,
                  cfg.vocab_size, log(cfg.vocab_size));
    gpt2_release(&m);
}

/* Loss and gradients identical bit for bit across runs and for 1, 2 and 3 threads. */
TEST(gpt2_deterministic_across_threads)
{
    /* T over one attention row block (96), rows over several matmul row blocks. */
    struct gpt2_config cfg = {.max_seq_len = 112,
                              .vocab_size = 200,
                              .padded_vocab_size = 256,
                              .n_layer = 2,
                              .n_head = 4,
                              .n_embd = 48};
    int B = 3, T = 110, in[3 * 110], tg[3 * 110];
    float loss[4];
    float *grads[4];
    struct gpt2 m;

    random_tokens(in, B * T, cfg.vocab_size);
    random_tokens(tg, B * T, cfg.vocab_size);
    CHECK_EQ(gpt2_init(&m, &cfg, B, T), 0);
    for (int run = 0; run < 4; run++) {
        omp_set_num_threads(run ? run : 2);
        gpt2_init_random(&m, 5);
        gpt2_zero_grad(&m);
        CHECK_EQ(gpt2_forward(&m, in, tg, B, T, &loss[run]), 0);
        CHECK_EQ(gpt2_backward(&m, 1.0f), 0);
        grads[run] = malloc(m.n_params * sizeof(float));
        CHECK(grads[run]);
        memcpy(grads[run], m.grads, m.n_params * sizeof(float));
        if (run) {
            CHECK(!memcmp(&loss[run], &loss[0], sizeof(float)));
            CHECK(!memcmp(grads[run], grads[0], m.n_params * sizeof(float)));
        }
    }
    for (int run = 0; run < 4; run++)
        free(grads[run]);
    gpt2_release(&m);
}

/* Two backwards with grad_scale 0.5 add up to one with 1.0, and two micro-batches of one
 * sequence to one batch of two, within rounding (the parameter gradients are summed into the
 * buffer row by row, so the order of additions differs). */
static void check_grads_close(const float *got, const float *want, size_t n, double rtol)
{
    double max = 0.0;

    for (size_t i = 0; i < n; i++)
        max = fabsf(want[i]) > max ? fabsf(want[i]) : max;
    for (size_t i = 0; i < n; i++) {
        if (!(fabsf(got[i] - want[i]) <= rtol * max))
            test_fail(__FILE__, __LINE__, "grad %zu: %.9g vs %.9g (max |grad| %g)", i,
                      (double)got[i], (double)want[i], max);
    }
}

TEST(gpt2_gradient_accumulation)
{
    struct gpt2 m;
    int B = 2, T = 10, in[20], tg[20];
    float *once, loss, l0, l1;

    random_tokens(in, B * T, tiny.vocab_size);
    random_tokens(tg, B * T, tiny.vocab_size);
    CHECK_EQ(gpt2_init(&m, &tiny, B, T), 0);
    init_lively(&m, 3);
    once = malloc(m.n_params * sizeof(float));
    CHECK(once);

    gpt2_zero_grad(&m);
    CHECK_EQ(gpt2_forward(&m, in, tg, B, T, &loss), 0);
    CHECK_EQ(gpt2_backward(&m, 1.0f), 0);
    memcpy(once, m.grads, m.n_params * sizeof(float));

    gpt2_zero_grad(&m);
    for (int k = 0; k < 2; k++) {
        CHECK_EQ(gpt2_forward(&m, in, tg, B, T, NULL), 0);
        CHECK_EQ(gpt2_backward(&m, 0.5f), 0);
    }
    check_grads_close(m.grads, once, m.n_params, 1e-6);

    gpt2_zero_grad(&m);
    CHECK_EQ(gpt2_forward(&m, in, tg, 1, T, &l0), 0);
    CHECK_EQ(gpt2_backward(&m, 0.5f), 0);
    CHECK_EQ(gpt2_forward(&m, in + T, tg + T, 1, T, &l1), 0);
    CHECK_EQ(gpt2_backward(&m, 0.5f), 0);
    CHECK(fabsf((l0 + l1) / 2 - loss) <= 1e-6f * loss);
    check_grads_close(m.grads, once, m.n_params, 1e-5);
    free(once);
    gpt2_release(&m);
}

TEST(gpt2_inference_and_errors)
{
    struct gpt2 m;
    int in[16], tg[16];
    float loss, *logits;
    size_t n = 2 * 8 * (size_t)tiny.padded_vocab_size;

    random_tokens(in, 16, tiny.vocab_size);
    random_tokens(tg, 16, tiny.vocab_size);
    CHECK_EQ(gpt2_init(&m, &tiny, 2, 8), 0);
    init_lively(&m, 11);
    CHECK_EQ(gpt2_forward(&m, in, tg, 2, 8, &loss), 0);
    logits = malloc(n * sizeof(float));
    CHECK(logits);
    memcpy(logits, gpt2_logits(&m), n * sizeof(float));
    /* Logits only: the same logits, and no backward from it. */
    CHECK_EQ(gpt2_forward(&m, in, NULL, 2, 8, NULL), 0);
    CHECK(!memcmp(logits, gpt2_logits(&m), n * sizeof(float)));
    CHECK_EQ(gpt2_backward(&m, 1.0f), -EINVAL);
    /* One backward per forward. */
    CHECK_EQ(gpt2_forward(&m, in, tg, 2, 8, NULL), 0);
    CHECK_EQ(gpt2_backward(&m, 1.0f), 0);
    CHECK_EQ(gpt2_backward(&m, 1.0f), -EINVAL);
    /* Shapes beyond the capacity, tokens outside the vocabulary. */
    CHECK_EQ(gpt2_forward(&m, in, tg, 3, 4, NULL), -EINVAL);
    CHECK_EQ(gpt2_forward(&m, in, tg, 1, 9, NULL), -EINVAL);
    CHECK_EQ(gpt2_forward(&m, in, tg, 0, 8, NULL), -EINVAL);
    tg[5] = tiny.vocab_size;
    CHECK_EQ(gpt2_forward(&m, in, tg, 2, 8, NULL), -EINVAL);
    in[3] = -1;
    CHECK_EQ(gpt2_forward(&m, in, NULL, 2, 8, NULL), -EINVAL);
    free(logits);
    gpt2_release(&m);
}

TEST(gpt2_sampling)
{
    const float logits[4] = {1.0f, 3.0f, 2.0f, 100.0f};
    int counts[3] = {0};
    uint64_t rng = 99, rng2 = 99;
    int n = 30000;

    /* Argmax at temperature 0, over the first V only. */
    CHECK_EQ(gpt2_sample_next(logits, 3, 0.0f, &rng), 1);
    CHECK_EQ(gpt2_sample_next(logits, 4, 0.0f, &rng), 3);
    for (int i = 0; i < n; i++)
        counts[gpt2_sample_next(logits, 3, 1.0f, &rng)]++;
    double z = exp(1.0) + exp(3.0) + exp(2.0);
    const double p[3] = {exp(1.0) / z, exp(3.0) / z, exp(2.0) / z};
    for (int j = 0; j < 3; j++) {
        double freq = (double)counts[j] / n, sd = sqrt(p[j] * (1 - p[j]) / n);
        if (!(fabs(freq - p[j]) < 5 * sd))
            test_fail(__FILE__, __LINE__, "token %d drawn %.4f of the time, want %.4f", j, freq,
                      p[j]);
    }
    /* A low temperature sharpens towards the argmax; the same state draws the same tokens. */
    rng = 99;
    for (int i = 0; i < 100; i++) {
        int a = gpt2_sample_next(logits, 3, 1.0f, &rng),
            b = gpt2_sample_next(logits, 3, 1.0f, &rng2);
        CHECK_EQ(a, b);
    }
    for (int i = 0; i < 100; i++)
        CHECK_EQ(gpt2_sample_next(logits, 3, 0.05f, &rng), 1);
}

TEST(gpt2_rng)
{
    uint64_t s = 1, t = 1;
    double sum = 0.0, sum2 = 0.0;
    int n = 100000;

    /* splitmix64's published first output for state 1 (after the increment). */
    CHECK(gpt2_rng_next(&s) == 0x910a2dec89025cc1ull);
    CHECK(gpt2_rng_next(&t) == 0x910a2dec89025cc1ull);
    for (int i = 0; i < n; i++) {
        float u = gpt2_rng_uniform(&s);
        CHECK(u >= 0.0f && u < 1.0f);
        double g = gpt2_rng_normal(&t);
        sum += g, sum2 += g * g;
    }
    CHECK(fabs(sum / n) < 0.02);
    CHECK(fabs(sum2 / n - 1.0) < 0.02);
}

TEST(gpt2_flop_count)
{
    struct gpt2_config cfg = {.max_seq_len = 256,
                              .vocab_size = 256,
                              .padded_vocab_size = 256,
                              .n_layer = 6,
                              .n_head = 6,
                              .n_embd = 384};
    double C = 384, T = 256;
    /* Per position: qkv 3C^2, attproj C^2, fc 4C^2, fcproj 4C^2 multiply-adds per layer and
     * Vp C for the head; 2 FLOPs each forward, 4 backward. Attention: position t attends to
     * t+1 positions, for QK^T and att V, C multiply-adds each. */
    double matmul = 6.0 * (6 * 12 * C * C + 256 * C) * T;
    double attention = 0;
    for (int t = 0; t < 256; t++)
        attention += 6 * 3 * 2 * 2 * (t + 1) * C;

    CHECK(fabs(gpt2_flops_per_sequence(&cfg, 256) - (matmul + attention)) < 1.0);
}

/* The model learns: 30 AdamW steps on one batch bring its loss well down. */
TEST_T(gpt2_adamw_overfits_a_batch, 60)
{
    struct gpt2 m;
    struct adamw opt;
    struct optim_span spans[GPT2_NUM_TENSORS];
    struct adamw_config hp = {.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.0f};
    int in[4 * 12], tg[4 * 12];
    float first = 0.0f, loss = 0.0f;

    random_tokens(in, 48, tiny.vocab_size);
    random_tokens(tg, 48, tiny.vocab_size);
    CHECK_EQ(gpt2_init(&m, &tiny, 4, 12), 0);
    gpt2_init_random(&m, 2);
    CHECK_EQ(adamw_init(&opt, m.n_params, &hp, spans, gpt2_optim_spans(&m, spans)), 0);
    for (int step = 0; step < 30; step++) {
        gpt2_zero_grad(&m);
        CHECK_EQ(gpt2_forward(&m, in, tg, 4, 12, &loss), 0);
        CHECK_EQ(gpt2_backward(&m, 1.0f), 0);
        double norm = optim_grad_norm(m.grads, m.n_params);
        adamw_update(&opt, m.params, m.grads, 1e-2f, optim_clip_scale(norm, 1.0f));
        if (!step)
            first = loss;
    }
    if (!(loss < 0.5f * first))
        test_fail(__FILE__, __LINE__, "loss %g after 30 steps, from %g", (double)loss,
                  (double)first);
    adamw_release(&opt);
    gpt2_release(&m);
}
