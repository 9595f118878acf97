/* The GPT-2 model on CPU: parameter layout, activations, forward, backward, initialisation
 * and sampling (see gpt2.h). The op-level maths is in ops.h. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errmsg.h"
#include "gpt2.h"
#include "ops.h"
#include "banned.h"

/* GPT-2's initialisation scale (std of the weights). */
#define INIT_STD   0.02f
/* A model whose buffers would exceed this many floats is refused (2^40 floats, 4 TiB): far
 * beyond any CPU run, and it keeps every size product inside size_t. */
#define MAX_FLOATS 1099511627776.0

/* The tensors: name and whether weight decay applies. Sizes come from gpt2_tensors. */
static const struct {
    const char *name;
    bool decay;
} tensor_info[GPT2_NUM_TENSORS] = {
    [GPT2_WTE] = {"wte", true},           [GPT2_WPE] = {"wpe", true},
    [GPT2_LN1W] = {"ln1w", false},        [GPT2_LN1B] = {"ln1b", false},
    [GPT2_QKVW] = {"qkvw", true},         [GPT2_QKVB] = {"qkvb", false},
    [GPT2_ATTPROJW] = {"attprojw", true}, [GPT2_ATTPROJB] = {"attprojb", false},
    [GPT2_LN2W] = {"ln2w", false},        [GPT2_LN2B] = {"ln2b", false},
    [GPT2_FCW] = {"fcw", true},           [GPT2_FCB] = {"fcb", false},
    [GPT2_FCPROJW] = {"fcprojw", true},   [GPT2_FCPROJB] = {"fcprojb", false},
    [GPT2_LNFW] = {"lnfw", false},        [GPT2_LNFB] = {"lnfb", false},
};

int gpt2_padded_vocab(int vocab_size)
{
    return (vocab_size + GPT2_VOCAB_ALIGN - 1) / GPT2_VOCAB_ALIGN * GPT2_VOCAB_ALIGN;
}

size_t gpt2_tensors(const struct gpt2_config *cfg, struct gpt2_tensor t[GPT2_NUM_TENSORS])
{
    size_t C = (size_t)cfg->n_embd, L = (size_t)cfg->n_layer;
    size_t counts[GPT2_NUM_TENSORS] = {
        [GPT2_WTE] = (size_t)cfg->padded_vocab_size * C,
        [GPT2_WPE] = (size_t)cfg->max_seq_len * C,
        [GPT2_LN1W] = L * C,
        [GPT2_LN1B] = L * C,
        [GPT2_QKVW] = L * 3 * C * C,
        [GPT2_QKVB] = L * 3 * C,
        [GPT2_ATTPROJW] = L * C * C,
        [GPT2_ATTPROJB] = L * C,
        [GPT2_LN2W] = L * C,
        [GPT2_LN2B] = L * C,
        [GPT2_FCW] = L * 4 * C * C,
        [GPT2_FCB] = L * 4 * C,
        [GPT2_FCPROJW] = L * C * 4 * C,
        [GPT2_FCPROJB] = L * C,
        [GPT2_LNFW] = C,
        [GPT2_LNFB] = C,
    };
    size_t offset = 0;

    for (int i = 0; i < GPT2_NUM_TENSORS; i++) {
        t[i].name = tensor_info[i].name;
        t[i].decay = tensor_info[i].decay;
        t[i].offset = offset;
        t[i].count = counts[i];
        offset += counts[i];
    }
    return offset;
}

bool gpt2_config_valid(const struct gpt2_config *cfg, struct errmsg *err)
{
    const struct {
        const char *name;
        int value;
    } sizes[] = {
        {"max_seq_len", cfg->max_seq_len},
        {"vocab_size", cfg->vocab_size},
        {"padded_vocab_size", cfg->padded_vocab_size},
        {"n_layer", cfg->n_layer},
        {"n_head", cfg->n_head},
        {"n_embd", cfg->n_embd},
    };
    double C = cfg->n_embd;

    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
        if (sizes[i].value <= 0)
            return errmsg_set(err, false, "%s (%d) must be positive", sizes[i].name,
                              sizes[i].value);
    if (cfg->n_embd % cfg->n_head)
        return errmsg_set(err, false, "n_head (%d) must divide n_embd (%d)", cfg->n_head,
                          cfg->n_embd);
    if (cfg->padded_vocab_size < cfg->vocab_size)
        return errmsg_set(err, false, "padded_vocab_size (%d) must be at least vocab_size (%d)",
                          cfg->padded_vocab_size, cfg->vocab_size);
    if (((double)cfg->padded_vocab_size + cfg->max_seq_len + 12.0 * cfg->n_layer * C) * C >
        MAX_FLOATS)
        return errmsg_set(err, false, "model too large (n_layer %d, n_embd %d)", cfg->n_layer,
                          cfg->n_embd);
    return true;
}

/* ---- activations -------------------------------------------------------------------------- */

/* The activations of a forward of shape (B, T): views into m->acts, each tensor at a fixed
 * offset sized for the capacity, used in its (B, T) layout. Per-layer tensors hold layer l at
 * l * (its per-layer size). */
struct acts {
    float *encoded;                   /* (B,T,C) */
    float *ln1, *ln1_mean, *ln1_rstd; /* (L,B,T,C), (L,B,T), (L,B,T) */
    float *qkv;                       /* (L,B,T,3C) */
    float *atty;                      /* (L,B,T,C) */
    float *att;                       /* (L,B,NH,T,T) */
    float *residual2;                 /* (L,B,T,C) = residual + attention projection */
    float *ln2, *ln2_mean, *ln2_rstd; /* (L,B,T,C), (L,B,T), (L,B,T) */
    float *fch, *fch_gelu;            /* (L,B,T,4C) each; fch ends up holding GELU's
                                       * derivative at itself (ops_gelu_forward_grad) */
    float *residual3;                 /* (L,B,T,C) = residual2 + MLP projection */
    float *lnf, *lnf_mean, *lnf_rstd; /* (B,T,C), (B,T), (B,T) */
    float *logits;                    /* (B,T,Vp) */
    float *lse, *losses;              /* (B,T) each */
};

#define N_ACTS 21

/* Sizes of the acts' tensors, in struct order, for B*T = bt positions of T. */
static void acts_sizes(const struct gpt2_config *cfg, size_t B, size_t T, size_t s[N_ACTS])
{
    size_t C = (size_t)cfg->n_embd, L = (size_t)cfg->n_layer, NH = (size_t)cfg->n_head;
    size_t bt = B * T;
    size_t i = 0;

    s[i++] = bt * C;                              /* encoded */
    s[i++] = L * bt * C;                          /* ln1 */
    s[i++] = L * bt;                              /* ln1_mean */
    s[i++] = L * bt;                              /* ln1_rstd */
    s[i++] = L * bt * 3 * C;                      /* qkv */
    s[i++] = L * bt * C;                          /* atty */
    s[i++] = L * B * NH * T * T;                  /* att */
    s[i++] = L * bt * C;                          /* residual2 */
    s[i++] = L * bt * C;                          /* ln2 */
    s[i++] = L * bt;                              /* ln2_mean */
    s[i++] = L * bt;                              /* ln2_rstd */
    s[i++] = L * bt * 4 * C;                      /* fch */
    s[i++] = L * bt * 4 * C;                      /* fch_gelu */
    s[i++] = L * bt * C;                          /* residual3 */
    s[i++] = bt * C;                              /* lnf */
    s[i++] = bt;                                  /* lnf_mean */
    s[i++] = bt;                                  /* lnf_rstd */
    s[i++] = bt * (size_t)cfg->padded_vocab_size; /* logits */
    s[i++] = bt;                                  /* lse */
    s[i++] = bt;                                  /* losses */
    s[i++] = 0;                                   /* (end) */
}

static void acts_views(const struct gpt2 *m, struct acts *a)
{
    size_t cap[N_ACTS];
    float **views[N_ACTS - 1] = {
        &a->encoded,  &a->ln1,      &a->ln1_mean,  &a->ln1_rstd,  &a->qkv,
        &a->atty,     &a->att,      &a->residual2, &a->ln2,       &a->ln2_mean,
        &a->ln2_rstd, &a->fch,      &a->fch_gelu,  &a->residual3, &a->lnf,
        &a->lnf_mean, &a->lnf_rstd, &a->logits,    &a->lse,       &a->losses,
    };
    float *p = m->acts;

    acts_sizes(&m->cfg, (size_t)m->batch_cap, (size_t)m->seq_cap, cap);
    for (int i = 0; i < N_ACTS - 1; i++) {
        *views[i] = p;
        p += cap[i];
    }
}

/* The backward's activation gradients, each for B*T positions of the capacity. */
struct grad_acts {
    float *dres; /* (B,T,C): the residual stream's gradient, carried through the layers */
    float *dbuf; /* (B,T,C): gradient of an LN output or of the attention output */
    float *dqkv; /* (B,T,3C) */
    float *dfch; /* (B,T,4C): gradient of the MLP's hidden layer, before and after GELU */
};

static size_t grad_acts_size(const struct gpt2_config *cfg, size_t bt)
{
    return bt * 9 * (size_t)cfg->n_embd;
}

static void grad_acts_views(const struct gpt2 *m, struct grad_acts *g)
{
    size_t btc = (size_t)m->batch_cap * m->seq_cap * m->cfg.n_embd;

    g->dres = m->scratch;
    g->dbuf = g->dres + btc;
    g->dqkv = g->dbuf + btc;
    g->dfch = g->dqkv + 3 * btc;
}

/* ---- lifecycle ---------------------------------------------------------------------------- */

int gpt2_init(struct gpt2 *m, const struct gpt2_config *cfg, int batch_cap, int seq_cap)
{
    struct errmsg err;
    size_t sizes[N_ACTS], bt;
    double total = 0.0;

    memset(m, 0, sizeof(*m));
    if (!gpt2_config_valid(cfg, &err) || batch_cap <= 0 || seq_cap <= 0 ||
        seq_cap > cfg->max_seq_len)
        return -EINVAL;
    acts_sizes(cfg, (size_t)batch_cap, (size_t)seq_cap, sizes);
    for (int i = 0; i < N_ACTS; i++)
        total += (double)sizes[i];
    bt = (size_t)batch_cap * seq_cap;
    if (total + (double)grad_acts_size(cfg, bt) > MAX_FLOATS)
        return -EINVAL;

    m->cfg = *cfg;
    m->n_params = gpt2_tensors(cfg, m->tensors);
    m->batch_cap = batch_cap;
    m->seq_cap = seq_cap;
    m->n_acts = 0;
    for (int i = 0; i < N_ACTS; i++)
        m->n_acts += sizes[i];
    m->n_scratch = grad_acts_size(cfg, bt);
    m->params = calloc(m->n_params, sizeof(float));
    m->grads = calloc(m->n_params, sizeof(float));
    m->acts = malloc(m->n_acts * sizeof(float));
    m->scratch = malloc(m->n_scratch * sizeof(float));
    m->tokens = malloc(2 * bt * sizeof(int));
    if (!m->params || !m->grads || !m->acts || !m->scratch || !m->tokens) {
        gpt2_release(m);
        return -ENOMEM;
    }
    return 0;
}

void gpt2_release(struct gpt2 *m)
{
    free(m->params);
    free(m->grads);
    free(m->acts);
    free(m->scratch);
    free(m->tokens);
    memset(m, 0, sizeof(*m));
}

/* ---- random numbers ----------------------------------------------------------------------- */

uint64_t gpt2_rng_next(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);

    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

float gpt2_rng_uniform(uint64_t *state)
{
    return (float)(gpt2_rng_next(state) >> 40) * (1.0f / 16777216.0f);
}

float gpt2_rng_normal(uint64_t *state)
{
    /* u1 in (0, 1] so that the log is finite. */
    double u1 = ((double)(gpt2_rng_next(state) >> 11) + 1.0) * (1.0 / 9007199254740992.0);
    double u2 = (double)(gpt2_rng_next(state) >> 11) * (1.0 / 9007199254740992.0);

    return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
}

void gpt2_init_random(struct gpt2 *m, uint64_t seed)
{
    const struct gpt2_config *cfg = &m->cfg;
    float resid_std = INIT_STD / sqrtf(2.0f * (float)cfg->n_layer);
    uint64_t rng = seed;

    for (int i = 0; i < GPT2_NUM_TENSORS; i++) {
        const struct gpt2_tensor *t = &m->tensors[i];
        float *p = m->params + t->offset;
        size_t n = t->count;
        float std = 0.0f, fill = 0.0f;

        switch (i) {
        case GPT2_WTE:
            /* The padding rows stay 0: no token selects them and the loss ignores their
             * logits. */
            n = (size_t)cfg->vocab_size * cfg->n_embd;
            memset(p + n, 0, (t->count - n) * sizeof(float));
            std = INIT_STD;
            break;
        case GPT2_WPE:
        case GPT2_QKVW:
        case GPT2_FCW:
            std = INIT_STD;
            break;
        case GPT2_ATTPROJW:
        case GPT2_FCPROJW:
            std = resid_std;
            break;
        case GPT2_LN1W:
        case GPT2_LN2W:
        case GPT2_LNFW:
            fill = 1.0f;
            break;
        default:
            break;
        }
        for (size_t j = 0; j < n; j++)
            p[j] = std > 0.0f ? std * gpt2_rng_normal(&rng) : fill;
    }
}

/* ---- forward and backward ----------------------------------------------------------------- */

/* Parameter tensor i of the flat buffer base (params or grads), layer l's slice. */
static float *tensor(const struct gpt2 *m, float *base, int i, int l)
{
    const struct gpt2_tensor *t = &m->tensors[i];
    bool per_layer = i >= GPT2_LN1W && i <= GPT2_FCPROJB;

    return base + t->offset + (per_layer ? (size_t)l * (t->count / (size_t)m->cfg.n_layer) : 0);
}

int gpt2_forward(struct gpt2 *m, const int *inputs, const int *targets, int B, int T, float *loss)
{
    const struct gpt2_config *cfg = &m->cfg;
    int C = cfg->n_embd, L = cfg->n_layer, NH = cfg->n_head, V = cfg->vocab_size;
    int Vp = cfg->padded_vocab_size;
    size_t bt = (size_t)B * T, btc = bt * C, att_layer = (size_t)B * NH * T * T;
    float *p = m->params;
    struct acts a;
    int err;

    if (B <= 0 || T <= 0 || B > m->batch_cap || T > m->seq_cap)
        return -EINVAL;
    for (size_t i = 0; i < bt; i++) {
        if (inputs[i] < 0 || inputs[i] >= V || (targets && (targets[i] < 0 || targets[i] >= V)))
            return -EINVAL;
    }
    m->B = B;
    m->T = T;
    m->have_targets = false;
    memcpy(m->tokens, inputs, bt * sizeof(int));
    if (targets)
        memcpy(m->tokens + bt, targets, bt * sizeof(int));
    acts_views(m, &a);

    ops_encoder_forward(a.encoded, inputs, tensor(m, p, GPT2_WTE, 0), tensor(m, p, GPT2_WPE, 0), B,
                        T, C);
    for (int l = 0; l < L; l++) {
        const float *residual = l ? a.residual3 + (l - 1) * btc : a.encoded;
        float *ln1 = a.ln1 + l * btc, *qkv = a.qkv + 3 * l * btc, *atty = a.atty + l * btc;
        float *res2 = a.residual2 + l * btc, *ln2 = a.ln2 + l * btc;
        float *fch = a.fch + 4 * l * btc, *fch_gelu = a.fch_gelu + 4 * l * btc;
        float *res3 = a.residual3 + l * btc;

        ops_layernorm_forward(ln1, a.ln1_mean + l * bt, a.ln1_rstd + l * bt, residual,
                              tensor(m, p, GPT2_LN1W, l), tensor(m, p, GPT2_LN1B, l), (int)bt, C);
        if ((err = ops_matmul_forward(qkv, ln1, tensor(m, p, GPT2_QKVW, l),
                                      tensor(m, p, GPT2_QKVB, l), (int)bt, C, 3 * C)) < 0)
            return err;
        if ((err = ops_attention_forward(atty, a.att + l * att_layer, qkv, B, T, C, NH)) < 0)
            return err;
        if ((err = ops_matmul_forward(res2, atty, tensor(m, p, GPT2_ATTPROJW, l),
                                      tensor(m, p, GPT2_ATTPROJB, l), (int)bt, C, C)) < 0)
            return err;
        ops_residual_forward(res2, res2, residual, btc);
        ops_layernorm_forward(ln2, a.ln2_mean + l * bt, a.ln2_rstd + l * bt, res2,
                              tensor(m, p, GPT2_LN2W, l), tensor(m, p, GPT2_LN2B, l), (int)bt, C);
        if ((err = ops_matmul_forward(fch, ln2, tensor(m, p, GPT2_FCW, l),
                                      tensor(m, p, GPT2_FCB, l), (int)bt, C, 4 * C)) < 0)
            return err;
        /* fch keeps GELU's derivative from here on: the backward needs nothing else. */
        ops_gelu_forward_grad(fch_gelu, fch, fch, 4 * btc);
        if ((err = ops_matmul_forward(res3, fch_gelu, tensor(m, p, GPT2_FCPROJW, l),
                                      tensor(m, p, GPT2_FCPROJB, l), (int)bt, 4 * C, C)) < 0)
            return err;
        ops_residual_forward(res3, res3, res2, btc);
    }
    ops_layernorm_forward(a.lnf, a.lnf_mean, a.lnf_rstd, a.residual3 + (L - 1) * btc,
                          tensor(m, p, GPT2_LNFW, 0), tensor(m, p, GPT2_LNFB, 0), (int)bt, C);
    /* The LM head, tied: logits = lnf wte^T over all Vp rows of wte. */
    if ((err = ops_matmul_forward(a.logits, a.lnf, tensor(m, p, GPT2_WTE, 0), NULL, (int)bt, C,
                                  Vp)) < 0)
        return err;
    if (!targets)
        return 0;

    ops_crossentropy_forward(a.losses, a.lse, a.logits, targets, (int)bt, V, Vp);
    double sum = 0.0;
    for (size_t i = 0; i < bt; i++)
        sum += a.losses[i];
    m->loss = (float)(sum / (double)bt);
    m->have_targets = true;
    if (loss)
        *loss = m->loss;
    return 0;
}

const float *gpt2_logits(const struct gpt2 *m)
{
    struct acts a;

    acts_views(m, &a);
    return a.logits;
}

/* Floats per thread chunk of gpt2_zero_grad. */
#define ZERO_CHUNK 65536

void gpt2_zero_grad(struct gpt2 *m)
{
    long chunks = (long)((m->n_params + ZERO_CHUNK - 1) / ZERO_CHUNK);

#pragma omp parallel for schedule(static)
    for (long q = 0; q < chunks; q++) {
        size_t i0 = (size_t)q * ZERO_CHUNK;
        size_t n = m->n_params - i0 < ZERO_CHUNK ? m->n_params - i0 : ZERO_CHUNK;
        memset(m->grads + i0, 0, n * sizeof(float));
    }
}

int gpt2_backward(struct gpt2 *m, float grad_scale)
{
    const struct gpt2_config *cfg = &m->cfg;
    int C = cfg->n_embd, L = cfg->n_layer, NH = cfg->n_head, V = cfg->vocab_size;
    int Vp = cfg->padded_vocab_size, B = m->B, T = m->T;
    size_t bt = (size_t)B * T, btc = bt * C, att_layer = (size_t)B * NH * T * T;
    const int *inputs = m->tokens, *targets = m->tokens + bt;
    float *p = m->params, *g = m->grads;
    struct acts a;
    struct grad_acts d;
    int err;

    if (!m->have_targets)
        return -EINVAL;
    /* The logits become their gradient: no second backward of this forward. */
    m->have_targets = false;
    acts_views(m, &a);
    grad_acts_views(m, &d);

    ops_crossentropy_backward(a.logits, a.logits, a.lse, targets, (int)bt, V, Vp,
                              grad_scale / (float)bt);
    if ((err = ops_matmul_backward(d.dbuf, tensor(m, g, GPT2_WTE, 0), NULL, a.logits, a.lnf,
                                   tensor(m, p, GPT2_WTE, 0), (int)bt, C, Vp)) < 0)
        return err;
    memset(d.dres, 0, btc * sizeof(float));
    ops_layernorm_backward(d.dres, tensor(m, g, GPT2_LNFW, 0), tensor(m, g, GPT2_LNFB, 0), d.dbuf,
                           a.residual3 + (L - 1) * btc, tensor(m, p, GPT2_LNFW, 0), a.lnf_mean,
                           a.lnf_rstd, (int)bt, C);

    /* d.dres holds the gradient of the block's output residual3; both residual additions pass
     * it unchanged to their two inputs, so the LayerNorms add into it in place. */
    for (int l = L - 1; l >= 0; l--) {
        const float *residual = l ? a.residual3 + (l - 1) * btc : a.encoded;
        const float *ln1 = a.ln1 + l * btc, *qkv = a.qkv + 3 * l * btc;
        const float *atty = a.atty + l * btc, *res2 = a.residual2 + l * btc;
        const float *ln2 = a.ln2 + l * btc, *fch = a.fch + 4 * l * btc;
        const float *fch_gelu = a.fch_gelu + 4 * l * btc;

        if ((err = ops_matmul_backward(d.dfch, tensor(m, g, GPT2_FCPROJW, l),
                                       tensor(m, g, GPT2_FCPROJB, l), d.dres, fch_gelu,
                                       tensor(m, p, GPT2_FCPROJW, l), (int)bt, 4 * C, C)) < 0)
            return err;
        ops_gelu_backward_grad(d.dfch, fch, d.dfch, 4 * btc);
        if ((err = ops_matmul_backward(d.dbuf, tensor(m, g, GPT2_FCW, l), tensor(m, g, GPT2_FCB, l),
                                       d.dfch, ln2, tensor(m, p, GPT2_FCW, l), (int)bt, C, 4 * C)) <
            0)
            return err;
        ops_layernorm_backward(d.dres, tensor(m, g, GPT2_LN2W, l), tensor(m, g, GPT2_LN2B, l),
                               d.dbuf, res2, tensor(m, p, GPT2_LN2W, l), a.ln2_mean + l * bt,
                               a.ln2_rstd + l * bt, (int)bt, C);
        if ((err = ops_matmul_backward(d.dbuf, tensor(m, g, GPT2_ATTPROJW, l),
                                       tensor(m, g, GPT2_ATTPROJB, l), d.dres, atty,
                                       tensor(m, p, GPT2_ATTPROJW, l), (int)bt, C, C)) < 0)
            return err;
        if ((err = ops_attention_backward(d.dqkv, d.dbuf, qkv, a.att + l * att_layer, B, T, C,
                                          NH)) < 0)
            return err;
        if ((err = ops_matmul_backward(d.dbuf, tensor(m, g, GPT2_QKVW, l),
                                       tensor(m, g, GPT2_QKVB, l), d.dqkv, ln1,
                                       tensor(m, p, GPT2_QKVW, l), (int)bt, C, 3 * C)) < 0)
            return err;
        ops_layernorm_backward(d.dres, tensor(m, g, GPT2_LN1W, l), tensor(m, g, GPT2_LN1B, l),
                               d.dbuf, residual, tensor(m, p, GPT2_LN1W, l), a.ln1_mean + l * bt,
                               a.ln1_rstd + l * bt, (int)bt, C);
    }
    ops_encoder_backward(tensor(m, g, GPT2_WTE, 0), tensor(m, g, GPT2_WPE, 0), d.dres, inputs, B, T,
                         C);
    return 0;
}

size_t gpt2_optim_spans(const struct gpt2 *m, struct optim_span spans[GPT2_NUM_TENSORS])
{
    for (int i = 0; i < GPT2_NUM_TENSORS; i++) {
        spans[i].offset = m->tensors[i].offset;
        spans[i].count = m->tensors[i].count;
        spans[i].decay = m->tensors[i].decay;
    }
    return GPT2_NUM_TENSORS;
}

double gpt2_flops_per_sequence(const struct gpt2_config *cfg, int T)
{
    double C = cfg->n_embd, L = cfg->n_layer, Vp = cfg->padded_vocab_size;
    double matmul_params = L * 12.0 * C * C + Vp * C;
    double attention = L * 6.0 * (double)T * (T + 1.0) * C;

    return 6.0 * matmul_params * T + attention;
}

int gpt2_sample_next(const float *logits, int V, float temperature, uint64_t *rng)
{
    int best = 0;

    for (int j = 1; j < V; j++)
        best = logits[j] > logits[best] ? j : best;
    if (temperature <= 0.0f)
        return best;

    double sum = 0.0, max = logits[best];
    for (int j = 0; j < V; j++)
        sum += exp(((double)logits[j] - max) / temperature);
    double r = (double)gpt2_rng_uniform(rng) * sum, acc = 0.0;
    for (int j = 0; j < V; j++) {
        acc += exp(((double)logits[j] - max) / temperature);
        if (r < acc)
            return j;
    }
    /* Rounding left r at the very top: the last token with any weight. */
    for (int j = V - 1; j > 0; j--) {
        if (exp(((double)logits[j] - max) / temperature) > 0.0)
            return j;
    }
    return best;
}
