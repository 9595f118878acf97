/* The GPT-2 model of the CUDA backend (gpt2_gpu.h): kernels/gpt2.c's forward and backward, op
 * for op, through the launchers of cuda_ops.h, with the parameters, gradients, optimizer
 * state and activations in a few device allocations cut into views as gpt2.c does.
 *
 * Device memory, in bytes, with e the dtype's size (2 or 4), P = n_pad, S = opt_hi - opt_lo,
 * N = batch_cap * seq_cap positions and the model's C, L, NH, Vp:
 *   parameters + gradients      2 P e
 *   master (bf16 only), m, v    12 S (8 S in fp32 mode: the parameters are the master)
 *   activations                 e N (C + 16 L C + C + Vp)        floatX, kept for the backward
 *                               + 4 N (4 L + L NH + 4) + 8 N     fp32 statistics, tokens
 *   activation gradients        e N 9 C                           one set, reused by every layer
 *   staging                     4 MiB                             host conversions
 * plus the context's 32 MiB cuBLASLt workspace and its small scratch. GPT-2 124M (C 768, L 12,
 * NH 12, Vp 50304, P ~ S ~ 124.5M) at batch 64 x 1024 in bf16: 0.5 GB + 1.5 GB + 26.1 GB
 * (of which the logits 6.6 GB) + 0.05 GB + 0.9 GB, about 29 GB of an H100's 80 (fp32 mode:
 * about 56 GB). */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpt2_gpu.h"
#include "banned.h"

/* Floats of the staging buffer through which host fp32 arrays and bf16 device arrays are
 * converted in chunks (4 MiB: small beside the model, large enough that a 124M-parameter
 * transfer is ~120 round trips). */
#define STAGE_FLOATS  ((size_t)1 << 20)
/* Byte alignment of each activation view (cuBLASLt's preferred operand alignment). */
#define VIEW_ALIGN    256
/* The attention kernels' largest head size (cuda_ops.h). */
#define MAX_HEAD_SIZE 128

/* The activations of a forward of shape (B, T), gpt2.c's plus what the flash attention and
 * the cross-entropy keep in place of the (T,T) attention matrix and the probabilities.
 * floatX unless marked; per-layer tensors hold layer l at l * (their per-layer size for the
 * forward's B, T). */
struct acts {
    void *encoded;              /* (B,T,C) */
    void *ln1;                  /* (L,B,T,C) */
    float *ln1_mean, *ln1_rstd; /* (L,B,T) fp32 each */
    void *qkv;                  /* (L,B,T,3C) */
    void *atty;                 /* (L,B,T,C) */
    float *att_lse;             /* (L,B,NH,T) fp32: each query row's log-sum-exp */
    void *residual2;            /* (L,B,T,C) */
    void *ln2;                  /* (L,B,T,C) */
    float *ln2_mean, *ln2_rstd; /* (L,B,T) fp32 each */
    void *fch, *fch_gelu;       /* (L,B,T,4C) each: GELU's input and output */
    void *residual3;            /* (L,B,T,C) */
    void *lnf;                  /* (B,T,C) */
    float *lnf_mean, *lnf_rstd; /* (B,T) fp32 each */
    void *logits;               /* (B,T,Vp); their gradient after the fused loss */
    float *losses, *ce_lse;     /* (B,T) fp32 each */
    int *inputs, *targets;      /* (B,T) int each, on the device */
};

/* The backward's activation gradients (floatX), each for the capacity's positions, shared by
 * all layers (gpt2.c's grad_acts). */
struct grad_acts {
    void *dres; /* (B,T,C): the residual stream's gradient, carried through the layers */
    void *dbuf; /* (B,T,C): gradient of an LN output or of the attention output */
    void *dqkv; /* (B,T,3C) */
    void *dfch; /* (B,T,4C): gradient of the MLP's hidden layer (after GELU's gradient) */
};

struct gpt2_gpu {
    struct gpu_ctx *ctx; /* borrowed */
    struct gpt2_config cfg;
    struct gpt2_tensor tensors[GPT2_NUM_TENSORS];
    enum gpu_dtype dt;
    size_t es; /* bytes per floatX element */
    size_t n_params, n_pad, opt_lo, opt_hi;
    struct adamw_config adamw;
    int batch_cap, seq_cap;

    void *params, *grads; /* n_pad floatX each */
    float *master;        /* opt_hi - opt_lo, bf16 mode only */
    float *m, *v;         /* opt_hi - opt_lo each */
    void *acts;           /* every view of struct acts, for the capacity */
    void *grad_acts;      /* struct grad_acts's views */
    float *stage;         /* stage_n floats */
    size_t stage_n;
    float *host_losses; /* batch_cap * seq_cap: the losses summed on the host */

    int B, T;         /* shape of the last forward; 0 before the first */
    bool have_logits; /* the last forward left its logits (no fused loss since) */

    /* The training step's device work as a CUDA graph (opts.graphs; fb_device): recorded at
     * the second call of a shape and grad_scale under the same buffers generation (the first
     * runs as usual, so that every buffer and plan it needs exists), launched from then on. */
    bool graphs;          /* opts.graphs, and no recording failed */
    struct gpu_graph *fb; /* the recording, or NULL */
    int fb_B, fb_T;       /* its key: shape, */
    float fb_scale;       /* grad_scale, */
    uint64_t fb_gen;      /* gpu_ctx_buffers_generation */
    bool fb_seen;         /* the key ran once without a graph */
    uint64_t fb_launches; /* micro-steps run as a graph launch */
    char graph_note[200]; /* why graphs are off, "" otherwise */

    struct errmsg *err; /* borrowed (gpt2_gpu_new) */
};

/* ---- errors -------------------------------------------------------------------------------- */

static int failf(struct gpt2_gpu *m, int ret, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int failf(struct gpt2_gpu *m, int ret, const char *fmt, ...)
{
    va_list ap;

    if (!m->err)
        return ret;
    va_start(ap, fmt);
    errmsg_vset(m->err, ret, fmt, ap);
    va_end(ap);
    return ret;
}

/* A launcher's failure (ret < 0): its line from the context becomes the model's. */
static int fail_ctx(struct gpt2_gpu *m, int ret)
{
    return failf(m, ret, "%s", gpu_ctx_error(m->ctx));
}

/* ---- layout -------------------------------------------------------------------------------- */

static size_t align_up(size_t x, size_t a)
{
    return (x + a - 1) / a * a;
}

/* The activation views, in layout order. */
enum act_id {
    A_ENCODED,
    A_LN1,
    A_LN1_MEAN,
    A_LN1_RSTD,
    A_QKV,
    A_ATTY,
    A_ATT_LSE,
    A_RESIDUAL2,
    A_LN2,
    A_LN2_MEAN,
    A_LN2_RSTD,
    A_FCH,
    A_FCH_GELU,
    A_RESIDUAL3,
    A_LNF,
    A_LNF_MEAN,
    A_LNF_RSTD,
    A_LOGITS,
    A_LOSSES,
    A_CE_LSE,
    A_INPUTS,
    A_TARGETS,
    N_ACTS,
};

/* Lays out the activations of the capacity from base (NULL: sizes only, a untouched);
 * returns the bytes. */
static size_t acts_layout(const struct gpt2_gpu *m, char *base, struct acts *a)
{
    size_t C = (size_t)m->cfg.n_embd, L = (size_t)m->cfg.n_layer, NH = (size_t)m->cfg.n_head;
    size_t Vp = (size_t)m->cfg.padded_vocab_size;
    size_t N = (size_t)m->batch_cap * (size_t)m->seq_cap, e = m->es, f = sizeof(float);
    size_t bytes[N_ACTS] = {
        [A_ENCODED] = e * N * C,
        [A_LN1] = e * L * N * C,
        [A_LN1_MEAN] = f * L * N,
        [A_LN1_RSTD] = f * L * N,
        [A_QKV] = e * L * N * 3 * C,
        [A_ATTY] = e * L * N * C,
        [A_ATT_LSE] = f * L * N * NH,
        [A_RESIDUAL2] = e * L * N * C,
        [A_LN2] = e * L * N * C,
        [A_LN2_MEAN] = f * L * N,
        [A_LN2_RSTD] = f * L * N,
        [A_FCH] = e * L * N * 4 * C,
        [A_FCH_GELU] = e * L * N * 4 * C,
        [A_RESIDUAL3] = e * L * N * C,
        [A_LNF] = e * N * C,
        [A_LNF_MEAN] = f * N,
        [A_LNF_RSTD] = f * N,
        [A_LOGITS] = e * N * Vp,
        [A_LOSSES] = f * N,
        [A_CE_LSE] = f * N,
        [A_INPUTS] = sizeof(int) * N,
        [A_TARGETS] = sizeof(int) * N,
    };
    size_t off[N_ACTS], total = 0;

    for (int i = 0; i < N_ACTS; i++) {
        off[i] = total;
        total += align_up(bytes[i], VIEW_ALIGN);
    }
    if (!base)
        return total;
    a->encoded = base + off[A_ENCODED];
    a->ln1 = base + off[A_LN1];
    a->ln1_mean = (float *)(base + off[A_LN1_MEAN]);
    a->ln1_rstd = (float *)(base + off[A_LN1_RSTD]);
    a->qkv = base + off[A_QKV];
    a->atty = base + off[A_ATTY];
    a->att_lse = (float *)(base + off[A_ATT_LSE]);
    a->residual2 = base + off[A_RESIDUAL2];
    a->ln2 = base + off[A_LN2];
    a->ln2_mean = (float *)(base + off[A_LN2_MEAN]);
    a->ln2_rstd = (float *)(base + off[A_LN2_RSTD]);
    a->fch = base + off[A_FCH];
    a->fch_gelu = base + off[A_FCH_GELU];
    a->residual3 = base + off[A_RESIDUAL3];
    a->lnf = base + off[A_LNF];
    a->lnf_mean = (float *)(base + off[A_LNF_MEAN]);
    a->lnf_rstd = (float *)(base + off[A_LNF_RSTD]);
    a->logits = base + off[A_LOGITS];
    a->losses = (float *)(base + off[A_LOSSES]);
    a->ce_lse = (float *)(base + off[A_CE_LSE]);
    a->inputs = (int *)(base + off[A_INPUTS]);
    a->targets = (int *)(base + off[A_TARGETS]);
    return total;
}

static size_t grad_acts_layout(const struct gpt2_gpu *m, char *base, struct grad_acts *g)
{
    size_t btc = (size_t)m->batch_cap * (size_t)m->seq_cap * (size_t)m->cfg.n_embd * m->es;
    size_t btc_al = align_up(btc, VIEW_ALIGN);

    if (g) {
        g->dres = base;
        g->dbuf = base + btc_al;
        g->dqkv = base + 2 * btc_al;
        g->dfch = base + 2 * btc_al + align_up(3 * btc, VIEW_ALIGN);
    }
    return 2 * btc_al + align_up(3 * btc, VIEW_ALIGN) + align_up(4 * btc, VIEW_ALIGN);
}

/* Element i of a floatX buffer. */
static void *at(const struct gpt2_gpu *m, void *base, size_t i)
{
    return (char *)base + i * m->es;
}

/* Layer l's slice of parameter tensor i in base (params or grads). */
static void *tensor(const struct gpt2_gpu *m, void *base, int i, int l)
{
    const struct gpt2_tensor *t = &m->tensors[i];
    bool per_layer = i >= GPT2_LN1W && i <= GPT2_FCPROJB;

    return at(m, base,
              t->offset + (per_layer ? (size_t)l * (t->count / (size_t)m->cfg.n_layer) : 0));
}

/* ---- lifecycle ----------------------------------------------------------------------------- */

/* The CUDA launchers' own limits on a config that gpt2_config_valid accepts. */
static bool cuda_config_valid(const struct gpt2_config *cfg, struct errmsg *err)
{
    if (cfg->n_embd % 8)
        return errmsg_set(err, false, "n_embd (%d) must be a multiple of 8 for the CUDA backend",
                          cfg->n_embd);
    if (cfg->padded_vocab_size % 8)
        return errmsg_set(err, false,
                          "padded_vocab_size (%d) must be a multiple of 8 for the CUDA backend",
                          cfg->padded_vocab_size);
    if (cfg->n_embd / cfg->n_head > MAX_HEAD_SIZE)
        return errmsg_set(err, false,
                          "head size %d (n_embd / n_head) above %d for the CUDA backend",
                          cfg->n_embd / cfg->n_head, MAX_HEAD_SIZE);
    return true;
}

static bool opts_valid(const struct gpt2_config *cfg, const struct gpt2_gpu_opts *o,
                       size_t n_params, struct errmsg *err)
{
    size_t n_pad = o->n_pad ? o->n_pad : n_params;

    if (o->dt != GPU_F32 && o->dt != GPU_BF16)
        return errmsg_set(err, false, "unknown dtype %d", (int)o->dt);
    if (o->batch_cap <= 0 || o->seq_cap <= 0 || o->seq_cap > cfg->max_seq_len)
        return errmsg_set(err, false, "batch_cap (%d) must be positive and seq_cap (%d) in [1, %d]",
                          o->batch_cap, o->seq_cap, cfg->max_seq_len);
    if (n_pad < n_params)
        return errmsg_set(err, false, "n_pad (%zu) below the %zu parameters", o->n_pad, n_params);
    if ((o->opt_lo || o->opt_hi) && !(o->opt_lo < o->opt_hi && o->opt_hi <= n_pad))
        return errmsg_set(err, false,
                          "optimizer shard [%zu, %zu) not a non-empty range of [0, %zu)", o->opt_lo,
                          o->opt_hi, n_pad);
    /* The launchers count rows (positions) in int. */
    if ((double)o->batch_cap * o->seq_cap > 2147483647.0)
        return errmsg_set(err, false, "batch_cap %d x seq_cap %d: too many positions", o->batch_cap,
                          o->seq_cap);
    return true;
}

/* gpu_alloc of bytes into *p, named for the message on failure. */
static int alloc(struct gpt2_gpu *m, void **p, size_t bytes, const char *what)
{
    if (gpu_alloc(m->ctx, p, bytes) < 0)
        return failf(m, -ENOMEM, "out of device memory for %s (%zu bytes)", what, bytes);
    return 0;
}

struct gpt2_gpu *gpt2_gpu_new(struct gpu_ctx *ctx, const struct gpt2_config *cfg,
                              const struct gpt2_gpu_opts *opts, struct errmsg *err)
{
    struct gpt2_gpu *m = NULL;
    struct gpt2_tensor tensors[GPT2_NUM_TENSORS];
    size_t n_params, shard;

    if (!gpt2_config_valid(cfg, err) || !cuda_config_valid(cfg, err))
        return NULL;
    n_params = gpt2_tensors(cfg, tensors);
    if (!opts_valid(cfg, opts, n_params, err))
        return NULL;
    m = calloc(1, sizeof(*m));
    if (!m) {
        errmsg_set(err, 0, "cannot allocate the CUDA model: out of memory");
        return NULL;
    }
    m->ctx = ctx;
    m->cfg = *cfg;
    memcpy(m->tensors, tensors, sizeof(tensors));
    m->dt = opts->dt;
    m->es = gpu_dtype_size(opts->dt);
    m->n_params = n_params;
    m->n_pad = opts->n_pad ? opts->n_pad : n_params;
    m->opt_lo = opts->opt_lo;
    m->opt_hi = opts->opt_lo || opts->opt_hi ? opts->opt_hi : n_params;
    m->adamw = opts->adamw;
    m->graphs = opts->graphs;
    m->batch_cap = opts->batch_cap;
    m->seq_cap = opts->seq_cap;
    m->err = err;
    shard = m->opt_hi - m->opt_lo;
    m->stage_n = STAGE_FLOATS;

    m->host_losses = malloc((size_t)m->batch_cap * m->seq_cap * sizeof(float));
    if (!m->host_losses) {
        failf(m, -ENOMEM, "cannot allocate the CUDA model's loss buffer: out of memory");
        goto fail;
    }
    if (alloc(m, &m->params, m->n_pad * m->es, "the parameters") < 0 ||
        alloc(m, &m->grads, m->n_pad * m->es, "the gradients") < 0 ||
        (m->dt == GPU_BF16 &&
         alloc(m, (void **)&m->master, shard * sizeof(float), "the master weights") < 0) ||
        alloc(m, (void **)&m->m, shard * sizeof(float), "adamw's m") < 0 ||
        alloc(m, (void **)&m->v, shard * sizeof(float), "adamw's v") < 0 ||
        alloc(m, &m->acts, acts_layout(m, NULL, NULL), "the activations") < 0 ||
        alloc(m, &m->grad_acts, grad_acts_layout(m, NULL, NULL), "the activation gradients") < 0 ||
        alloc(m, (void **)&m->stage, m->stage_n * sizeof(float), "the staging buffer") < 0)
        goto fail;
    if (gpu_fill_bytes(ctx, m->params, 0, m->n_pad * m->es) < 0 ||
        gpu_fill_bytes(ctx, m->grads, 0, m->n_pad * m->es) < 0 ||
        (m->master && gpu_fill_bytes(ctx, m->master, 0, shard * sizeof(float)) < 0) ||
        gpu_fill_bytes(ctx, m->m, 0, shard * sizeof(float)) < 0 ||
        gpu_fill_bytes(ctx, m->v, 0, shard * sizeof(float)) < 0 || gpu_ctx_sync(ctx) < 0) {
        fail_ctx(m, -EIO);
        goto fail;
    }
    return m;

fail:
    gpt2_gpu_free(m);
    return NULL;
}

void gpt2_gpu_free(struct gpt2_gpu *m)
{
    if (!m)
        return;
    gpu_free(m->ctx, m->params);
    gpu_free(m->ctx, m->grads);
    gpu_free(m->ctx, m->master);
    gpu_free(m->ctx, m->m);
    gpu_free(m->ctx, m->v);
    gpu_free(m->ctx, m->acts);
    gpu_free(m->ctx, m->grad_acts);
    gpu_free(m->ctx, m->stage);
    gpu_graph_free(m->fb);
    free(m->host_losses);
    free(m);
}

void gpt2_gpu_buffers(const struct gpt2_gpu *m, struct gpt2_gpu_bufs *b)
{
    b->params = m->params;
    b->grads = m->grads;
    b->master = m->master;
    b->m = m->m;
    b->v = m->v;
    b->n_params = m->n_params;
    b->n_pad = m->n_pad;
    b->opt_lo = m->opt_lo;
    b->opt_hi = m->opt_hi;
    b->dt = m->dt;
}

/* ---- host transfers ------------------------------------------------------------------------ */

/* n host floats into the floatX buffer dst (rounded to bf16 on the device in bf16 mode,
 * through the staging buffer). Returns 0 or -EIO. */
static int upload_x(struct gpt2_gpu *m, void *dst, const float *src, size_t n)
{
    if (m->dt == GPU_F32)
        return gpu_upload(m->ctx, dst, src, n * sizeof(float)) < 0 ? fail_ctx(m, -EIO) : 0;
    for (size_t i = 0; i < n; i += m->stage_n) {
        size_t k = n - i < m->stage_n ? n - i : m->stage_n;
        if (gpu_upload(m->ctx, m->stage, src + i, k * sizeof(float)) < 0 ||
            gpu_convert(m->ctx, GPU_BF16, at(m, dst, i), GPU_F32, m->stage, k) < 0)
            return fail_ctx(m, -EIO);
    }
    return 0;
}

/* n floatX elements at src into host floats (bf16 widened exactly). Returns 0 or -EIO. */
static int download_x(struct gpt2_gpu *m, float *dst, const void *src, size_t n)
{
    if (m->dt == GPU_F32)
        return gpu_download(m->ctx, dst, src, n * sizeof(float)) < 0 ? fail_ctx(m, -EIO) : 0;
    for (size_t i = 0; i < n; i += m->stage_n) {
        size_t k = n - i < m->stage_n ? n - i : m->stage_n;
        if (gpu_convert(m->ctx, GPU_F32, m->stage, GPU_BF16, at(m, (void *)src, i), k) < 0 ||
            gpu_download(m->ctx, dst + i, m->stage, k * sizeof(float)) < 0)
            return fail_ctx(m, -EIO);
    }
    return 0;
}

/* The shard's fp32 buffer dst (opt_hi - opt_lo floats) from the full host array src
 * (n_params floats; NULL: zeros): the part below n_params uploaded, the padding zero. */
static int upload_shard(struct gpt2_gpu *m, float *dst, const float *src)
{
    size_t shard = m->opt_hi - m->opt_lo;
    size_t real = m->opt_lo < m->n_params
                      ? (m->opt_hi < m->n_params ? m->opt_hi : m->n_params) - m->opt_lo
                      : 0;

    if (!src)
        real = 0;
    if (real && gpu_upload(m->ctx, dst, src + m->opt_lo, real * sizeof(float)) < 0)
        return fail_ctx(m, -EIO);
    if (real < shard && gpu_fill_bytes(m->ctx, dst + real, 0, (shard - real) * sizeof(float)) < 0)
        return fail_ctx(m, -EIO);
    return 0;
}

int gpt2_gpu_set_params(struct gpt2_gpu *m, const float *params)
{
    int ret;

    m->have_logits = false;
    if ((ret = upload_x(m, m->params, params, m->n_params)) < 0)
        return ret;
    if (m->n_pad > m->n_params && gpu_fill_bytes(m->ctx, at(m, m->params, m->n_params), 0,
                                                 (m->n_pad - m->n_params) * m->es) < 0)
        return fail_ctx(m, -EIO);
    if (m->master && (ret = upload_shard(m, m->master, params)) < 0)
        return ret;
    return gpu_ctx_sync(m->ctx) < 0 ? fail_ctx(m, -EIO) : 0;
}

int gpt2_gpu_set_moments(struct gpt2_gpu *m, const float *mom1, const float *mom2)
{
    int ret;

    if ((ret = upload_shard(m, m->m, mom1)) < 0 || (ret = upload_shard(m, m->v, mom2)) < 0)
        return ret;
    return gpu_ctx_sync(m->ctx) < 0 ? fail_ctx(m, -EIO) : 0;
}

int gpt2_gpu_get_shard(struct gpt2_gpu *m, float *master, float *mom1, float *mom2)
{
    size_t bytes = (m->opt_hi - m->opt_lo) * sizeof(float);
    const float *src = m->master ? m->master : (const float *)at(m, m->params, m->opt_lo);

    if ((master && gpu_download(m->ctx, master, src, bytes) < 0) ||
        (mom1 && gpu_download(m->ctx, mom1, m->m, bytes) < 0) ||
        (mom2 && gpu_download(m->ctx, mom2, m->v, bytes) < 0))
        return fail_ctx(m, -EIO);
    return 0;
}

int gpt2_gpu_get_params(struct gpt2_gpu *m, float *params)
{
    return download_x(m, params, m->params, m->n_params);
}

int gpt2_gpu_get_grads(struct gpt2_gpu *m, float *grads)
{
    return download_x(m, grads, m->grads, m->n_params);
}

/* ---- the step ------------------------------------------------------------------------------ */

int gpt2_gpu_zero_grad(struct gpt2_gpu *m)
{
    if (gpu_fill_bytes(m->ctx, m->grads, 0, m->n_pad * m->es) < 0)
        return fail_ctx(m, -EIO);
    return 0;
}

/* The first token of tok (n, named name) outside [0, V): -EINVAL naming it; else 0. */
static int check_tokens(struct gpt2_gpu *m, const char *name, const int *tok, size_t n)
{
    int V = m->cfg.vocab_size;

    for (size_t i = 0; i < n; i++) {
        if (tok[i] < 0 || tok[i] >= V)
            return failf(m, -EINVAL, "token %s[%zu] (%d) outside [0, %d)", name, i, tok[i], V);
    }
    return 0;
}

/* Checks the shape and the tokens and uploads them to the device buffers the forward reads.
 * Leaves the shape in m->B, m->T. */
static int stage_tokens(struct gpt2_gpu *m, const int *inputs, const int *targets, int B, int T)
{
    size_t bt = (size_t)B * T;
    struct acts a;
    int ret;

    m->have_logits = false;
    if (B <= 0 || T <= 0 || B > m->batch_cap || T > m->seq_cap)
        return failf(m, -EINVAL, "batch %d x %d outside the model's capacity %d x %d", B, T,
                     m->batch_cap, m->seq_cap);
    if ((ret = check_tokens(m, "inputs", inputs, bt)) < 0 ||
        (targets && (ret = check_tokens(m, "targets", targets, bt)) < 0))
        return ret;
    acts_layout(m, m->acts, &a);
    if (gpu_upload(m->ctx, a.inputs, inputs, bt * sizeof(int)) < 0 ||
        (targets && gpu_upload(m->ctx, a.targets, targets, bt * sizeof(int)) < 0))
        return fail_ctx(m, -EIO);
    m->B = B;
    m->T = T;
    return 0;
}

/* The forward up to the logits (gpt2_forward's ops, the residual additions fused into the
 * LayerNorm that follows each), from the staged tokens: device work only. */
static int forward(struct gpt2_gpu *m, int B, int T)
{
    struct gpu_ctx *ctx = m->ctx;
    enum gpu_dtype dt = m->dt;
    int C = m->cfg.n_embd, L = m->cfg.n_layer, NH = m->cfg.n_head;
    int Vp = m->cfg.padded_vocab_size;
    size_t bt = (size_t)B * T, btc = bt * C;
    void *p = m->params;
    struct acts a;
    int ret;

    acts_layout(m, m->acts, &a);
    if (gpu_encoder_forward(ctx, dt, a.encoded, a.inputs, tensor(m, p, GPT2_WTE, 0),
                            tensor(m, p, GPT2_WPE, 0), B, T, C) < 0)
        return fail_ctx(m, -EIO);
    for (int l = 0; l < L; l++) {
        void *ln1 = at(m, a.ln1, l * btc), *qkv = at(m, a.qkv, 3 * l * btc);
        void *atty = at(m, a.atty, l * btc), *res2 = at(m, a.residual2, l * btc);
        void *ln2 = at(m, a.ln2, l * btc), *fch = at(m, a.fch, 4 * l * btc);
        void *fch_gelu = at(m, a.fch_gelu, 4 * l * btc), *res3 = at(m, a.residual3, l * btc);
        void *residual = l ? at(m, a.residual3, (l - 1) * btc) : a.encoded;
        float *ln1_mean = a.ln1_mean + l * bt, *ln1_rstd = a.ln1_rstd + l * bt;
        float *ln2_mean = a.ln2_mean + l * bt, *ln2_rstd = a.ln2_rstd + l * bt;

        /* residual3 of the previous layer = its MLP projection + residual2, then LN1. */
        if (l == 0)
            ret = gpu_layernorm_forward(ctx, dt, ln1, ln1_mean, ln1_rstd, residual,
                                        tensor(m, p, GPT2_LN1W, l), tensor(m, p, GPT2_LN1B, l),
                                        (int)bt, C);
        else
            ret = gpu_residual_layernorm_forward(ctx, dt, residual, ln1, ln1_mean, ln1_rstd,
                                                 residual, at(m, a.residual2, (l - 1) * btc),
                                                 tensor(m, p, GPT2_LN1W, l),
                                                 tensor(m, p, GPT2_LN1B, l), (int)bt, C);
        if (ret < 0 ||
            gpu_matmul_forward(ctx, dt, qkv, NULL, ln1, tensor(m, p, GPT2_QKVW, l),
                               tensor(m, p, GPT2_QKVB, l), (int)bt, C, 3 * C) < 0 ||
            gpu_attention_forward(ctx, dt, atty, a.att_lse + l * bt * NH, qkv, B, T, C, NH) < 0 ||
            gpu_matmul_forward(ctx, dt, res2, NULL, atty, tensor(m, p, GPT2_ATTPROJW, l),
                               tensor(m, p, GPT2_ATTPROJB, l), (int)bt, C, C) < 0 ||
            gpu_residual_layernorm_forward(ctx, dt, res2, ln2, ln2_mean, ln2_rstd, res2, residual,
                                           tensor(m, p, GPT2_LN2W, l), tensor(m, p, GPT2_LN2B, l),
                                           (int)bt, C) < 0 ||
            gpu_matmul_forward(ctx, dt, fch_gelu, fch, ln2, tensor(m, p, GPT2_FCW, l),
                               tensor(m, p, GPT2_FCB, l), (int)bt, C, 4 * C) < 0 ||
            gpu_matmul_forward(ctx, dt, res3, NULL, fch_gelu, tensor(m, p, GPT2_FCPROJW, l),
                               tensor(m, p, GPT2_FCPROJB, l), (int)bt, 4 * C, C) < 0)
            return fail_ctx(m, -EIO);
    }
    /* The LM head, tied: logits = lnf wte^T over all Vp rows of wte. */
    void *res3_last = at(m, a.residual3, (L - 1) * btc);
    if (gpu_residual_layernorm_forward(ctx, dt, res3_last, a.lnf, a.lnf_mean, a.lnf_rstd, res3_last,
                                       at(m, a.residual2, (L - 1) * btc),
                                       tensor(m, p, GPT2_LNFW, 0), tensor(m, p, GPT2_LNFB, 0),
                                       (int)bt, C) < 0 ||
        gpu_matmul_forward(ctx, dt, a.logits, NULL, a.lnf, tensor(m, p, GPT2_WTE, 0), NULL, (int)bt,
                           C, Vp) < 0)
        return fail_ctx(m, -EIO);
    return 0;
}

/* The mean of the last loss computation's bt losses, summed on the host in double in
 * position order. */
static int mean_loss(struct gpt2_gpu *m, const float *losses, size_t bt, float *loss)
{
    double sum = 0.0;

    if (gpu_download(m->ctx, m->host_losses, losses, bt * sizeof(float)) < 0)
        return fail_ctx(m, -EIO);
    for (size_t i = 0; i < bt; i++)
        sum += m->host_losses[i];
    if (loss)
        *loss = (float)(sum / (double)bt);
    return 0;
}

/* The training step's device work from the staged tokens: the forward, the fused loss and
 * the backward down to the first layer's LayerNorm; all but the encoder's backward, which
 * groups the tokens on the host. Launches only (no wait, no allocation past the first call
 * of a shape): what a graph records. */
static int fb_device(struct gpt2_gpu *m, int B, int T, float grad_scale)
{
    struct gpu_ctx *ctx = m->ctx;
    enum gpu_dtype dt = m->dt;
    int C = m->cfg.n_embd, L = m->cfg.n_layer, NH = m->cfg.n_head, V = m->cfg.vocab_size;
    int Vp = m->cfg.padded_vocab_size;
    size_t bt = (size_t)B * T, btc = bt * C;
    void *p = m->params, *g = m->grads;
    struct acts a;
    struct grad_acts d;
    int ret;

    if ((ret = forward(m, B, T)) < 0)
        return ret;
    acts_layout(m, m->acts, &a);
    grad_acts_layout(m, m->grad_acts, &d);

    /* The loss and, in place, the logits' gradient of grad_scale * mean loss. */
    if (gpu_crossentropy_fused(ctx, dt, a.losses, a.ce_lse, a.logits, a.targets, (int)bt, V, Vp,
                               grad_scale / (float)bt) < 0)
        return fail_ctx(m, -EIO);

    void *res3_last = at(m, a.residual3, (L - 1) * btc);
    if (gpu_matmul_backward(ctx, dt, d.dbuf, tensor(m, g, GPT2_WTE, 0), NULL, a.logits, a.lnf,
                            tensor(m, p, GPT2_WTE, 0), NULL, (int)bt, C, Vp) < 0 ||
        gpu_fill_bytes(ctx, d.dres, 0, btc * m->es) < 0 ||
        gpu_layernorm_backward(ctx, dt, d.dres, tensor(m, g, GPT2_LNFW, 0),
                               tensor(m, g, GPT2_LNFB, 0), d.dbuf, res3_last,
                               tensor(m, p, GPT2_LNFW, 0), a.lnf_mean, a.lnf_rstd, (int)bt, C) < 0)
        return fail_ctx(m, -EIO);

    /* d.dres holds the gradient of the block's output residual3; both residual additions pass
     * it unchanged to their two inputs, so the LayerNorms add into it in place. */
    for (int l = L - 1; l >= 0; l--) {
        void *residual = l ? at(m, a.residual3, (l - 1) * btc) : a.encoded;
        void *ln1 = at(m, a.ln1, l * btc), *qkv = at(m, a.qkv, 3 * l * btc);
        void *atty = at(m, a.atty, l * btc), *res2 = at(m, a.residual2, l * btc);
        void *ln2 = at(m, a.ln2, l * btc), *fch = at(m, a.fch, 4 * l * btc);
        void *fch_gelu = at(m, a.fch_gelu, 4 * l * btc);

        /* The MLP projection's input was gelu(fch): its dinp is the gradient at fch. */
        if (gpu_matmul_backward(ctx, dt, d.dfch, tensor(m, g, GPT2_FCPROJW, l),
                                tensor(m, g, GPT2_FCPROJB, l), d.dres, fch_gelu,
                                tensor(m, p, GPT2_FCPROJW, l), fch, (int)bt, 4 * C, C) < 0 ||
            gpu_matmul_backward(ctx, dt, d.dbuf, tensor(m, g, GPT2_FCW, l),
                                tensor(m, g, GPT2_FCB, l), d.dfch, ln2, tensor(m, p, GPT2_FCW, l),
                                NULL, (int)bt, C, 4 * C) < 0 ||
            gpu_layernorm_backward(ctx, dt, d.dres, tensor(m, g, GPT2_LN2W, l),
                                   tensor(m, g, GPT2_LN2B, l), d.dbuf, res2,
                                   tensor(m, p, GPT2_LN2W, l), a.ln2_mean + l * bt,
                                   a.ln2_rstd + l * bt, (int)bt, C) < 0 ||
            gpu_matmul_backward(ctx, dt, d.dbuf, tensor(m, g, GPT2_ATTPROJW, l),
                                tensor(m, g, GPT2_ATTPROJB, l), d.dres, atty,
                                tensor(m, p, GPT2_ATTPROJW, l), NULL, (int)bt, C, C) < 0 ||
            gpu_attention_backward(ctx, dt, d.dqkv, d.dbuf, qkv, atty, a.att_lse + l * bt * NH, B,
                                   T, C, NH) < 0 ||
            gpu_matmul_backward(ctx, dt, d.dbuf, tensor(m, g, GPT2_QKVW, l),
                                tensor(m, g, GPT2_QKVB, l), d.dqkv, ln1, tensor(m, p, GPT2_QKVW, l),
                                NULL, (int)bt, C, 3 * C) < 0 ||
            gpu_layernorm_backward(ctx, dt, d.dres, tensor(m, g, GPT2_LN1W, l),
                                   tensor(m, g, GPT2_LN1B, l), d.dbuf, residual,
                                   tensor(m, p, GPT2_LN1W, l), a.ln1_mean + l * bt,
                                   a.ln1_rstd + l * bt, (int)bt, C) < 0)
            return fail_ctx(m, -EIO);
    }
    return 0;
}

/* Turns graphs off for m, with why (the context's error) for gpt2_gpu_graphs_describe. */
static void graphs_off(struct gpt2_gpu *m)
{
    snprintf(m->graph_note, sizeof(m->graph_note), "%s", gpu_ctx_error(m->ctx));
    m->graphs = false;
    gpu_graph_free(m->fb);
    m->fb = NULL;
}

static int graph_launch(struct gpt2_gpu *m)
{
    if (gpu_graph_launch(m->ctx, m->fb) < 0)
        return fail_ctx(m, -EIO);
    m->fb_launches++;
    return 0;
}

/* fb_device, as a graph where one is recorded for this key (fb_B..fb_gen), or recorded now
 * when the key ran once before; without graphs, or while the key is new, as itself. A
 * recording that fails turns graphs off for good, and the work then runs as itself. */
static int fb_run(struct gpt2_gpu *m, int B, int T, float grad_scale)
{
    uint64_t gen = gpu_ctx_buffers_generation(m->ctx);
    struct gpu_graph *g = NULL;

    if (!m->graphs)
        return fb_device(m, B, T, grad_scale);
    if (!(m->fb_B == B && m->fb_T == T && m->fb_scale == grad_scale && m->fb_gen == gen)) {
        gpu_graph_free(m->fb);
        m->fb = NULL;
        m->fb_B = B, m->fb_T = T, m->fb_scale = grad_scale, m->fb_gen = gen;
        m->fb_seen = false;
    }
    if (m->fb)
        return graph_launch(m);
    if (!m->fb_seen) {
        m->fb_seen = true;
        return fb_device(m, B, T, grad_scale);
    }
    if (gpu_graph_begin(m->ctx) < 0) {
        graphs_off(m);
        return fb_device(m, B, T, grad_scale);
    }
    int ret = fb_device(m, B, T, grad_scale);
    if (gpu_graph_end(m->ctx, &g) < 0 || ret < 0) {
        /* Nothing recorded ran: run it as itself. */
        gpu_graph_free(g);
        graphs_off(m);
        return fb_device(m, B, T, grad_scale);
    }
    m->fb = g;
    return graph_launch(m);
}

uint64_t gpt2_gpu_graph_launches(const struct gpt2_gpu *m)
{
    return m->fb_launches;
}

void gpt2_gpu_graphs_describe(const struct gpt2_gpu *m, char *buf, size_t len)
{
    if (m->graphs)
        snprintf(buf, len, "on");
    else if (m->graph_note[0])
        snprintf(buf, len, "off (%s)", m->graph_note);
    else
        snprintf(buf, len, "off");
}

int gpt2_gpu_forward_backward(struct gpt2_gpu *m, const int *inputs, const int *targets, int B,
                              int T, float grad_scale, float *loss)
{
    size_t bt = (size_t)B * T;
    struct acts a;
    struct grad_acts d;
    int ret;

    if (!targets)
        return failf(m, -EINVAL, "forward_backward needs targets");
    if ((ret = stage_tokens(m, inputs, targets, B, T)) < 0 ||
        (ret = fb_run(m, B, T, grad_scale)) < 0)
        return ret;
    acts_layout(m, m->acts, &a);
    grad_acts_layout(m, m->grad_acts, &d);
    /* After the graph (it waits for the device: see fb_device), then the loss. */
    if (gpu_encoder_backward(m->ctx, m->dt, tensor(m, m->grads, GPT2_WTE, 0),
                             tensor(m, m->grads, GPT2_WPE, 0), d.dres, inputs, B, T, m->cfg.n_embd,
                             m->cfg.vocab_size) < 0)
        return fail_ctx(m, -EIO);
    if (loss && (ret = mean_loss(m, a.losses, bt, loss)) < 0)
        return ret;
    return 0;
}

int gpt2_gpu_forward(struct gpt2_gpu *m, const int *inputs, const int *targets, int B, int T,
                     float *loss)
{
    struct acts a;
    size_t bt = (size_t)B * T;
    int ret;

    if ((ret = stage_tokens(m, inputs, targets, B, T)) < 0 || (ret = forward(m, B, T)) < 0)
        return ret;
    if (targets) {
        acts_layout(m, m->acts, &a);
        if (gpu_crossentropy_forward(m->ctx, m->dt, a.losses, a.ce_lse, a.logits, a.targets,
                                     (int)bt, m->cfg.vocab_size, m->cfg.padded_vocab_size) < 0)
            return fail_ctx(m, -EIO);
        if ((ret = mean_loss(m, a.losses, bt, loss)) < 0)
            return ret;
    } else if (gpu_ctx_sync(m->ctx) < 0) {
        return fail_ctx(m, -EIO);
    }
    m->have_logits = true;
    return 0;
}

int gpt2_gpu_logits_row(struct gpt2_gpu *m, int b, int t, float *row)
{
    size_t Vp = (size_t)m->cfg.padded_vocab_size;
    struct acts a;

    if (!m->have_logits)
        return failf(m, -EINVAL, "no logits: the last call was not a forward");
    if (b < 0 || b >= m->B || t < 0 || t >= m->T)
        return failf(m, -EINVAL, "logits row (%d, %d) outside the last forward's %d x %d", b, t,
                     m->B, m->T);
    acts_layout(m, m->acts, &a);
    return download_x(m, row, at(m, a.logits, ((size_t)b * m->T + t) * Vp), Vp);
}

int gpt2_gpu_grad_sumsq(struct gpt2_gpu *m, size_t lo, size_t hi, double *sumsq)
{
    if (lo > hi || hi > m->n_pad)
        return failf(m, -EINVAL, "gradient range [%zu, %zu) outside [0, %zu)", lo, hi, m->n_pad);
    if (gpu_sum_squares(m->ctx, m->dt, at(m, m->grads, lo), hi - lo, sumsq) < 0)
        return fail_ctx(m, -EIO);
    return 0;
}

int gpt2_gpu_update(struct gpt2_gpu *m, uint64_t t, float lr, float grad_scale)
{
    struct optim_span spans[GPT2_NUM_TENSORS + 1];
    size_t n = 0, lo = m->opt_lo, hi = m->opt_hi;

    /* The tensors' spans cut to the shard, then the padding (no decay); offsets from opt_lo. */
    for (int i = 0; i <= GPT2_NUM_TENSORS; i++) {
        size_t s0 = i < GPT2_NUM_TENSORS ? m->tensors[i].offset : m->n_params;
        size_t s1 = i < GPT2_NUM_TENSORS ? s0 + m->tensors[i].count : m->n_pad;
        size_t a = s0 > lo ? s0 : lo, b = s1 < hi ? s1 : hi;
        if (a >= b)
            continue;
        spans[n].offset = a - lo;
        spans[n].count = b - a;
        spans[n].decay = i < GPT2_NUM_TENSORS && m->tensors[i].decay;
        n++;
    }
    if (gpu_adamw_update(m->ctx, m->dt, at(m, m->params, lo), m->master, at(m, m->grads, lo), m->m,
                         m->v, spans, n, &m->adamw, t, lr, grad_scale) < 0)
        return fail_ctx(m, -EIO);
    return 0;
}
