/* The cpu training backend (backend.h): gpt2.h's model and optim.h's AdamW in host memory,
 * fp32 with OpenMP, the gradients averaged over the ranks by the host collectives. Its state
 * needs no staging: the model's and AdamW's buffers are the host arrays. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "backend.h"
#include "coll/coll.h"
#include "banned.h"

struct cpu {
    struct backend b; /* first: a struct backend * is a struct cpu * */
    struct gpt2 model;
    bool model_ready;
    struct adamw opt;
    bool opt_ready;
    struct coll *coll; /* borrowed */
};

static struct cpu *cpu_of(struct backend *b)
{
    return (struct cpu *)b;
}

static int cpu_probe(struct errmsg *why)
{
    (void)why;
    return 0;
}

static int cpu_open(struct backend **out, int local_rank, struct errmsg *err)
{
    struct cpu *c = calloc(1, sizeof(*c));

    (void)local_rank;
    *out = NULL;
    if (!c)
        return errmsg_set(err, -ENOMEM, "out of memory");
    c->b.ops = &backend_cpu;
    *out = &c->b;
    return 0;
}

static int cpu_init(struct backend *b, const struct backend_opts *o)
{
    struct cpu *c = cpu_of(b);
    struct optim_span spans[GPT2_NUM_TENSORS];
    size_t nspans;
    int ret;

    c->coll = o->coll;
    ret = gpt2_init(&c->model, &o->model, o->batch_size, o->seq_len);
    if (ret < 0)
        return errmsg_set(&b->err, ret, "cannot set up the model: %s", strerror(-ret));
    c->model_ready = true;
    b->n_params = c->model.n_params;
    nspans = gpt2_optim_spans(&c->model, spans);
    ret = adamw_init(&c->opt, c->model.n_params, &o->adamw, spans, nspans);
    if (ret < 0)
        return errmsg_set(&b->err, ret, "cannot set up AdamW: %s", strerror(-ret));
    c->opt_ready = true;
    return 0;
}

static void cpu_close(struct backend *b)
{
    struct cpu *c = cpu_of(b);

    if (!c)
        return;
    if (c->opt_ready)
        adamw_release(&c->opt);
    if (c->model_ready)
        gpt2_release(&c->model);
    free(c);
}

static void cpu_describe(const struct backend *b, char *buf, size_t len)
{
#ifdef _OPENMP
    int threads = omp_get_max_threads();
#else
    int threads = 1;
#endif

    (void)b;
    snprintf(buf, len, "cpu, %d thread%s per rank", threads, threads == 1 ? "" : "s");
}

static int cpu_init_random(struct backend *b, uint64_t seed)
{
    gpt2_init_random(&cpu_of(b)->model, seed);
    return 0;
}

static int cpu_state_host(struct backend *b, struct backend_state *st)
{
    struct cpu *c = cpu_of(b);

    *st = (struct backend_state){.params = c->model.params, .m = c->opt.m, .v = c->opt.v};
    return 0;
}

static int cpu_state_get(struct backend *b, struct backend_state *st)
{
    if (st)
        st->opt_step = cpu_of(b)->opt.step;
    return 0;
}

/* src into dst unless they are the same array (the state_host arrays are the model's). */
static void copy_in(float *dst, const float *src, size_t n)
{
    if (dst != src)
        memcpy(dst, src, n * sizeof(float));
}

static int cpu_state_set(struct backend *b, const struct backend_state *st, bool with_moments)
{
    struct cpu *c = cpu_of(b);
    size_t n = b->n_params;

    copy_in(c->model.params, st->params, n);
    if (with_moments) {
        copy_in(c->opt.m, st->m, n);
        copy_in(c->opt.v, st->v, n);
    } else {
        memset(c->opt.m, 0, n * sizeof(float));
        memset(c->opt.v, 0, n * sizeof(float));
    }
    c->opt.step = st->opt_step;
    return 0;
}

static void cpu_set_coll(struct backend *b, struct coll *coll)
{
    cpu_of(b)->coll = coll;
}

static void cpu_state_release(struct backend *b, struct backend_state *st)
{
    (void)b;
    *st = (struct backend_state){0};
}

static int cpu_zero_grad(struct backend *b)
{
    gpt2_zero_grad(&cpu_of(b)->model);
    return 0;
}

static int cpu_forward_backward(struct backend *b, const int *inputs, const int *targets, int B,
                                int T, float grad_scale, float *loss)
{
    struct cpu *c = cpu_of(b);
    int ret;

    ret = gpt2_forward(&c->model, inputs, targets, B, T, loss);
    if (ret == 0)
        ret = gpt2_backward(&c->model, grad_scale);
    if (ret < 0)
        return errmsg_set(&b->err, ret, "forward/backward failed: %s", strerror(-ret));
    return 0;
}

static int cpu_average_grads(struct backend *b)
{
    struct cpu *c = cpu_of(b);
    int ret;

    ret = coll_allreduce_avg_f32(c->coll, c->model.grads, c->model.n_params);
    if (ret < 0)
        return errmsg_set(&b->err, ret, "gradient allreduce: %s", coll_strerror(c->coll));
    return 0;
}

/* The gradients are bitwise equal on every rank after the allreduce, and so are the norm and
 * the update. */
static int cpu_grad_norm(struct backend *b, double *norm)
{
    struct cpu *c = cpu_of(b);

    *norm = optim_grad_norm(c->model.grads, c->model.n_params);
    return 0;
}

static int cpu_update(struct backend *b, float lr, float grad_scale)
{
    struct cpu *c = cpu_of(b);

    adamw_update(&c->opt, c->model.params, c->model.grads, lr, grad_scale);
    return 0;
}

static int cpu_eval_loss(struct backend *b, const int *inputs, const int *targets, int B, int T,
                         float *loss)
{
    int ret = gpt2_forward(&cpu_of(b)->model, inputs, targets, B, T, loss);

    return ret < 0 ? errmsg_set(&b->err, ret, "forward failed: %s", strerror(-ret)) : 0;
}

static int cpu_last_logits(struct backend *b, const int *tokens, int T, const float **row)
{
    struct cpu *c = cpu_of(b);
    int ret = gpt2_forward(&c->model, tokens, NULL, 1, T, NULL);

    if (ret < 0)
        return errmsg_set(&b->err, ret, "forward failed: %s", strerror(-ret));
    *row = gpt2_logits(&c->model) + (size_t)(T - 1) * (size_t)c->model.cfg.padded_vocab_size;
    return 0;
}

const struct backend_ops backend_cpu = {
    .name = "cpu",
    .probe = cpu_probe,
    .open = cpu_open,
    .init = cpu_init,
    .close = cpu_close,
    .describe = cpu_describe,
    .init_random = cpu_init_random,
    .state_host = cpu_state_host,
    .state_get = cpu_state_get,
    .state_set = cpu_state_set,
    .state_release = cpu_state_release,
    .set_coll = cpu_set_coll,
    .zero_grad = cpu_zero_grad,
    .forward_backward = cpu_forward_backward,
    .average_grads = cpu_average_grads,
    .grad_norm = cpu_grad_norm,
    .update = cpu_update,
    .eval_loss = cpu_eval_loss,
    .last_logits = cpu_last_logits,
};
