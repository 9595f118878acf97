/* The cuda training backend (backend.h): cuda/gpt2_gpu.h's model on the rank's GPU, its
 * gradients averaged by NCCL on the device, and with ZeRO-1 its optimizer state sharded over
 * the ranks (reduce-scatter of the gradients, each rank updating its shard, all-gather of the
 * parameters). Built with GPURUN_CUDA (where nvcc is found); without it the backend only says
 * so. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "traincfg.h"
#include "coll/coll.h"
#ifdef GPURUN_CUDA
#include "cuda/cuda_ops.h"
#include "cuda/gpt2_gpu.h"
#endif
#include "banned.h"

#ifndef GPURUN_CUDA

static int cuda_probe(struct errmsg *why)
{
    return errmsg_set(
        why, -ENOTSUP,
        "this gpurun-train has no CUDA backend (built without nvcc); use device = cpu");
}

const struct backend_ops backend_cuda = {
    .name = "cuda",
    .coll = "nccl",
    .probe = cuda_probe,
};

#else

/* ZeRO-1 pads the parameter and gradient buffers to a multiple of world x this many elements:
 * every rank's shard is then the same size (what reduce-scatter and all-gather need) and
 * starts 128 elements (256 bytes in bf16, 512 in fp32) after the previous one, so that each
 * shard keeps cudaMalloc's 256-byte alignment for the vectorised kernels and NCCL. */
#define ZERO_PAD_ELEMS 128

struct cuda {
    struct backend b;    /* first: a struct backend * is a struct cuda * */
    int device;          /* within CUDA_VISIBLE_DEVICES */
    struct gpu_ctx *gpu; /* the rank's device context */
    struct gpt2_gpu *gm; /* the model on it */
    struct gpt2_gpu_bufs gb;
    struct gpt2_config mcfg;
    enum coll_dtype cdt; /* the model's dtype, for the collectives */
    bool zero;
    struct coll *coll; /* borrowed */
    int rank, world;
    uint64_t opt_step;    /* AdamW's update count */
    float *logits_row;    /* last_logits' row: padded_vocab_size floats */
    struct errmsg gerr;   /* the gpu model's last failure */
    bool graphs_off_said; /* the warning that a CUDA graph recording failed is out */
};

static struct cuda *cuda_of(struct backend *b)
{
    return (struct cuda *)b;
}

static int cuda_probe(struct errmsg *why)
{
    return gpu_require_device(why);
}

/* By default every local rank sees all of the node's GPUs (as under torchrun) and the local
 * rank picks one; under --gpu-bind=single it sees only its own, device 0. */
static int cuda_open(struct backend **out, int local_rank, struct errmsg *err)
{
    struct cuda *c = calloc(1, sizeof(*c));
    int count = gpu_device_count();
    struct errmsg why;

    *out = NULL;
    if (!c)
        return errmsg_set(err, -ENOMEM, "out of memory");
    c->b.ops = &backend_cuda;
    c->device = count > 1 && local_rank > 0 ? local_rank % count : 0;
    c->gpu = gpu_ctx_new(c->device, &why);
    if (!c->gpu) {
        errmsg_set(err, -ENODEV, "cannot set up device %d: %s", c->device, why.text);
        free(c);
        return -ENODEV;
    }
    *out = &c->b;
    return 0;
}

/* With zero, the parameter and gradient buffers are padded (ZERO_PAD_ELEMS) and this rank's
 * optimizer shard is [r n_pad / W, (r+1) n_pad / W). */
static int cuda_init(struct backend *b, const struct backend_opts *o)
{
    struct cuda *c = cuda_of(b);
    struct gpt2_tensor t[GPT2_NUM_TENSORS];
    struct gpt2_gpu_opts go = {
        .dt = o->fp32 ? GPU_F32 : GPU_BF16,
        .batch_cap = o->batch_size,
        .seq_cap = o->seq_len,
        .adamw = o->adamw,
        .graphs = o->graphs,
    };

    c->mcfg = o->model;
    c->zero = o->zero;
    gpu_ctx_set_attention(c->gpu, o->attention == TRAINCFG_ATTENTION_CUDNN ? GPU_ATT_CUDNN
                                  : o->attention == TRAINCFG_ATTENTION_OWN ? GPU_ATT_OWN
                                                                           : GPU_ATT_AUTO);
    c->coll = o->coll;
    c->rank = coll_rank(o->coll);
    c->world = coll_world_size(o->coll);
    b->n_params = gpt2_tensors(&o->model, t);
    if (o->zero) {
        size_t unit = (size_t)c->world * ZERO_PAD_ELEMS;
        go.n_pad = (b->n_params + unit - 1) / unit * unit;
        go.opt_lo = go.n_pad / (size_t)c->world * (size_t)c->rank;
        go.opt_hi = go.opt_lo + go.n_pad / (size_t)c->world;
    }
    c->cdt = go.dt == GPU_BF16 ? COLL_BF16 : COLL_F32;
    c->gm = gpt2_gpu_new(c->gpu, &o->model, &go, &c->gerr);
    if (!c->gm)
        return errmsg_set(&b->err, -ENOMEM, "cannot set up the model on cuda device %d: %s",
                          c->device, c->gerr.text);
    gpt2_gpu_buffers(c->gm, &c->gb);
    c->logits_row = malloc((size_t)o->model.padded_vocab_size * sizeof(float));
    if (!c->logits_row)
        return errmsg_set(&b->err, -ENOMEM, "out of memory for a row of logits");
    return 0;
}

static void cuda_close(struct backend *b)
{
    struct cuda *c = cuda_of(b);

    if (!c)
        return;
    gpt2_gpu_free(c->gm);
    free(c->logits_row);
    gpu_ctx_free(c->gpu);
    free(c);
}

static void cuda_describe(const struct backend *b, char *buf, size_t len)
{
    const struct cuda *c = (const struct cuda *)b;
    int n = snprintf(buf, len, "cuda, one GPU per rank, %s",
                     c->gb.dt == GPU_BF16 ? "bf16 (fp32 master weights)" : "fp32");

    if (c->zero && n >= 0 && (size_t)n < len)
        n += snprintf(buf + n, len - (size_t)n,
                      ", ZeRO-1 (optimizer shard of %zu of %zu padded parameters)",
                      c->gb.opt_hi - c->gb.opt_lo, c->gb.n_pad);
    if (c->gb.dt == GPU_BF16 && n >= 0 && (size_t)n < len) {
        char att[300];
        gpu_ctx_attention_describe(c->gpu, att, sizeof(att));
        n += snprintf(buf + n, len - (size_t)n, ", attention: %s", att);
    }
    if (n >= 0 && (size_t)n < len) {
        char gr[240];
        gpt2_gpu_graphs_describe(c->gm, gr, sizeof(gr));
        snprintf(buf + n, len - (size_t)n, ", CUDA graphs: %s", gr);
    }
}

/* ---- state --------------------------------------------------------------------------------- */

/* The seed's initialisation, made on the host by the cpu model's code so that both backends
 * start from the same parameters. */
static int cuda_init_random(struct backend *b, uint64_t seed)
{
    struct cuda *c = cuda_of(b);
    struct gpt2 init;
    int ret;

    /* A model with room for one position: its parameter buffer is what is used. */
    ret = gpt2_init(&init, &c->mcfg, 1, 1);
    if (ret < 0)
        return errmsg_set(&b->err, ret, "cannot initialise the parameters: %s", strerror(-ret));
    gpt2_init_random(&init, seed);
    ret = gpt2_gpu_set_params(c->gm, init.params);
    gpt2_release(&init);
    if (ret < 0)
        return errmsg_set(&b->err, ret, "cannot load the starting state onto cuda device %d: %s",
                          c->device, c->gerr.text);
    return 0;
}

/* Staging buffers: the device keeps the state between uses. */
static int cuda_state_host(struct backend *b, struct backend_state *st)
{
    size_t bytes = b->n_params * sizeof(float);

    *st = (struct backend_state){0};
    st->params = malloc(bytes);
    st->m = malloc(bytes);
    st->v = malloc(bytes);
    if (!st->params || !st->m || !st->v)
        return errmsg_set(&b->err, -ENOMEM, "out of memory for a host copy of %zu parameters",
                          b->n_params);
    return 0;
}

static void cuda_state_release(struct backend *b, struct backend_state *st)
{
    (void)b;
    free(st->params);
    free(st->m);
    free(st->v);
    *st = (struct backend_state){0};
}

/* The fp32 master weights (the parameters in fp32 mode) and AdamW's moments into st on rank 0.
 * Without zero rank 0 holds them whole; with zero every rank's shard is gathered into a device
 * buffer, one array at a time, and rank 0 downloads the first n_params of it (the padding is
 * no parameter). */
static int cuda_state_get(struct backend *b, struct backend_state *st)
{
    struct cuda *c = cuda_of(b);
    const struct gpt2_gpu_bufs *g = &c->gb;
    size_t count = g->opt_hi - g->opt_lo;
    const float *src[3] = {g->master ? g->master : (const float *)g->params + g->opt_lo, g->m,
                           g->v};
    float *dst[3] = {st ? st->params : NULL, st ? st->m : NULL, st ? st->v : NULL};
    void *all = NULL;
    int ret;

    if (st)
        st->opt_step = c->opt_step;
    if (!c->zero) {
        ret = st ? gpt2_gpu_get_shard(c->gm, st->params, st->m, st->v) : 0;
        return ret < 0 ? errmsg_set(&b->err, ret, "cannot download the optimizer state: %s",
                                    c->gerr.text)
                       : 0;
    }
    ret = gpu_alloc(c->gpu, &all, g->n_pad * sizeof(float));
    if (ret < 0)
        return errmsg_set(&b->err, ret, "cannot gather the optimizer state for a checkpoint: %s",
                          gpu_ctx_error(c->gpu));
    for (int i = 0; i < 3; i++) {
        ret = coll_dev_all_gather(c->coll, src[i], all, count, COLL_F32, gpu_ctx_stream(c->gpu));
        if (ret < 0) {
            errmsg_set(&b->err, ret, "cannot gather the optimizer state for a checkpoint: %s",
                       coll_strerror(c->coll));
            goto out;
        }
        if (dst[i] && (ret = gpu_download(c->gpu, dst[i], all, b->n_params * sizeof(float))) < 0) {
            errmsg_set(&b->err, ret, "cannot download the optimizer state: %s",
                       gpu_ctx_error(c->gpu));
            goto out;
        }
    }
    ret = 0;
out:
    gpu_free(c->gpu, all);
    return ret;
}

static int cuda_state_set(struct backend *b, const struct backend_state *st, bool with_moments)
{
    struct cuda *c = cuda_of(b);
    int ret;

    ret = gpt2_gpu_set_params(c->gm, st->params);
    if (ret == 0)
        ret = gpt2_gpu_set_moments(c->gm, with_moments ? st->m : NULL, with_moments ? st->v : NULL);
    if (ret < 0)
        return errmsg_set(&b->err, ret, "cannot load the starting state onto cuda device %d: %s",
                          c->device, c->gerr.text);
    c->opt_step = st->opt_step;
    return 0;
}

/* ---- the step ------------------------------------------------------------------------------ */

/* Regrouping in process (train.c): the new generation's communicator, of the same ranks. */
static void cuda_set_coll(struct backend *b, struct coll *coll)
{
    cuda_of(b)->coll = coll;
}

static int cuda_zero_grad(struct backend *b)
{
    struct cuda *c = cuda_of(b);
    int ret = gpt2_gpu_zero_grad(c->gm);

    return ret < 0 ? errmsg_set(&b->err, ret, "forward/backward failed: %s", c->gerr.text) : 0;
}

static int cuda_forward_backward(struct backend *b, const int *inputs, const int *targets, int B,
                                 int T, float grad_scale, float *loss)
{
    struct cuda *c = cuda_of(b);
    int ret = gpt2_gpu_forward_backward(c->gm, inputs, targets, B, T, grad_scale, loss);
    char gr[240];

    gpt2_gpu_graphs_describe(c->gm, gr, sizeof(gr));
    if (!c->graphs_off_said && !strncmp(gr, "off (", 5)) {
        /* A recording failed: the run goes on, launching the kernels one by one. */
        fprintf(stderr,
                "gpurun-train: warning: CUDA graphs %s; the kernels are launched one "
                "by one\n",
                gr);
        c->graphs_off_said = true;
    }
    return ret < 0 ? errmsg_set(&b->err, ret, "forward/backward failed: %s", c->gerr.text) : 0;
}

/* With zero the reduce-scatter leaves each rank the average of its own shard of the
 * gradients, in place. */
static int cuda_average_grads(struct backend *b)
{
    struct cuda *c = cuda_of(b);
    const struct gpt2_gpu_bufs *g = &c->gb;
    size_t esz = gpu_dtype_size(g->dt);
    void *stream = gpu_ctx_stream(c->gpu);
    int ret;

    if (!c->zero)
        ret = coll_dev_allreduce_avg(c->coll, g->grads, g->n_params, c->cdt, stream);
    else
        ret = coll_dev_reduce_scatter_avg(c->coll, g->grads, (char *)g->grads + g->opt_lo * esz,
                                          g->opt_hi - g->opt_lo, c->cdt, stream);
    if (ret < 0)
        return errmsg_set(&b->err, ret, "gradient %s: %s", c->zero ? "reduce-scatter" : "allreduce",
                          coll_strerror(c->coll));
    return 0;
}

/* With zero the sum of the shards' squares over the ranks (the shard's padding is zero: it
 * adds nothing). */
static int cuda_grad_norm(struct backend *b, double *norm)
{
    struct cuda *c = cuda_of(b);
    const struct gpt2_gpu_bufs *g = &c->gb;
    double sumsq = 0.0;
    int ret;

    ret = c->zero ? gpt2_gpu_grad_sumsq(c->gm, g->opt_lo, g->opt_hi, &sumsq)
                  : gpt2_gpu_grad_sumsq(c->gm, 0, g->n_params, &sumsq);
    if (ret < 0)
        return errmsg_set(&b->err, ret, "gradient norm: %s", c->gerr.text);
    if (c->zero && (ret = coll_allreduce_sum_f64(c->coll, &sumsq, 1)) < 0)
        return errmsg_set(&b->err, ret, "gradient norm: %s", coll_strerror(c->coll));
    *norm = sqrt(sumsq);
    return 0;
}

/* With zero each rank updates its shard of the parameters and the all-gather hands every rank
 * the others' (in place). */
static int cuda_update(struct backend *b, float lr, float grad_scale)
{
    struct cuda *c = cuda_of(b);
    const struct gpt2_gpu_bufs *g = &c->gb;
    size_t esz = gpu_dtype_size(g->dt);
    int ret;

    ret = gpt2_gpu_update(c->gm, c->opt_step + 1, lr, grad_scale);
    if (ret < 0)
        return errmsg_set(&b->err, ret, "AdamW update failed: %s", c->gerr.text);
    c->opt_step++;
    if (c->zero &&
        (ret = coll_dev_all_gather(c->coll, (char *)g->params + g->opt_lo * esz, g->params,
                                   g->opt_hi - g->opt_lo, c->cdt, gpu_ctx_stream(c->gpu))) < 0)
        return errmsg_set(&b->err, ret, "parameter all-gather: %s", coll_strerror(c->coll));
    return 0;
}

/* ---- evaluation and sampling --------------------------------------------------------------- */

static int cuda_eval_loss(struct backend *b, const int *inputs, const int *targets, int B, int T,
                          float *loss)
{
    struct cuda *c = cuda_of(b);
    int ret = gpt2_gpu_forward(c->gm, inputs, targets, B, T, loss);

    return ret < 0 ? errmsg_set(&b->err, ret, "forward failed: %s", c->gerr.text) : 0;
}

static int cuda_last_logits(struct backend *b, const int *tokens, int T, const float **row)
{
    struct cuda *c = cuda_of(b);
    int ret = gpt2_gpu_forward(c->gm, tokens, NULL, 1, T, NULL);

    if (ret == 0)
        ret = gpt2_gpu_logits_row(c->gm, 0, T - 1, c->logits_row);
    if (ret < 0)
        return errmsg_set(&b->err, ret, "forward failed: %s", c->gerr.text);
    *row = c->logits_row;
    return 0;
}

const struct backend_ops backend_cuda = {
    .name = "cuda",
    .coll = "nccl",
    .probe = cuda_probe,
    .open = cuda_open,
    .init = cuda_init,
    .close = cuda_close,
    .describe = cuda_describe,
    .init_random = cuda_init_random,
    .state_host = cuda_state_host,
    .state_get = cuda_state_get,
    .state_set = cuda_state_set,
    .state_release = cuda_state_release,
    .set_coll = cuda_set_coll,
    .zero_grad = cuda_zero_grad,
    .forward_backward = cuda_forward_backward,
    .average_grads = cuda_average_grads,
    .grad_norm = cuda_grad_norm,
    .update = cuda_update,
    .eval_loss = cuda_eval_loss,
    .last_logits = cuda_last_logits,
};

#endif /* GPURUN_CUDA */
