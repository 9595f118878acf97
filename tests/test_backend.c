/* Tests of kernels/backend.h through the cpu backend: a training step through the interface is
 * bit for bit the model's and AdamW's own, its state arrays are the model's buffers and
 * state_set takes another's, errors come back as one line; and the cuda backend's probe says
 * why it cannot run where there is no device. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "coll/coll.h"
#include "gpt2.h"
#include "optim.h"
#include "test.h"
#include "banned.h"

#define B    2
#define T    8
#define SEED 1234

static const struct gpt2_config tiny = {
    .max_seq_len = T,
    .vocab_size = 60,
    .padded_vocab_size = 128,
    .n_layer = 2,
    .n_head = 2,
    .n_embd = 16,
};

static const struct adamw_config hp = {
    .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};

static void tokens(int *x, int n, int salt)
{
    for (int i = 0; i < n; i++)
        x[i] = (i * 7 + salt * 13) % tiny.vocab_size;
}

/* A cpu backend of the tiny model over the collectives of one rank. */
static struct backend *open_cpu(struct coll **c)
{
    struct backend_opts o = {
        .model = tiny, .batch_size = B, .seq_len = T, .adamw = hp, .fp32 = true};
    struct backend *b = NULL;
    struct errmsg err;

    CHECK_EQ(backend_cpu.probe(&err), 0);
    CHECK_EQ(coll_open("single", NULL, c, &err), 0);
    CHECK_EQ(backend_cpu.open(&b, 0, &err), 0);
    o.coll = *c;
    CHECK_EQ(backend_cpu.init(b, &o), 0);
    return b;
}

/* Two steps of two micro-batches each, through the interface and by hand. */
TEST(backend_cpu_step_is_the_models)
{
    struct coll *c;
    struct backend *b = open_cpu(&c);
    struct optim_span spans[GPT2_NUM_TENSORS];
    struct backend_state st = {0};
    struct gpt2 m;
    struct adamw opt;
    int in[B * T], tg[B * T];
    float loss, want_loss;

    CHECK_EQ(gpt2_init(&m, &tiny, B, T), 0);
    CHECK_EQ(b->n_params, m.n_params);
    CHECK_EQ(adamw_init(&opt, m.n_params, &hp, spans, gpt2_optim_spans(&m, spans)), 0);
    gpt2_init_random(&m, SEED);
    CHECK_EQ(backend_cpu.init_random(b, SEED), 0);
    for (int step = 0; step < 2; step++) {
        double norm, want_norm;
        CHECK_EQ(backend_cpu.zero_grad(b), 0);
        gpt2_zero_grad(&m);
        for (int micro = 0; micro < 2; micro++) {
            tokens(in, B * T, 2 * step + micro);
            tokens(tg, B * T, 2 * step + micro + 1);
            CHECK_EQ(backend_cpu.forward_backward(b, in, tg, B, T, 0.5f, &loss), 0);
            CHECK_EQ(gpt2_forward(&m, in, tg, B, T, &want_loss), 0);
            CHECK_EQ(gpt2_backward(&m, 0.5f), 0);
            CHECK(loss == want_loss);
        }
        CHECK_EQ(backend_cpu.average_grads(b), 0);
        CHECK_EQ(backend_cpu.grad_norm(b, &norm), 0);
        want_norm = optim_grad_norm(m.grads, m.n_params);
        CHECK(norm == want_norm);
        CHECK_EQ(backend_cpu.update(b, 1e-3f, optim_clip_scale(norm, 1.0f)), 0);
        adamw_update(&opt, m.params, m.grads, 1e-3f, optim_clip_scale(want_norm, 1.0f));
    }
    CHECK_EQ(backend_cpu.state_host(b, &st), 0);
    CHECK_EQ(backend_cpu.state_get(b, &st), 0);
    CHECK_EQ(st.opt_step, 2);
    CHECK(!memcmp(st.params, m.params, m.n_params * sizeof(float)));
    CHECK(!memcmp(st.m, opt.m, m.n_params * sizeof(float)));
    CHECK(!memcmp(st.v, opt.v, m.n_params * sizeof(float)));
    CHECK_EQ(backend_cpu.eval_loss(b, in, tg, B, T, &loss), 0);
    CHECK_EQ(gpt2_forward(&m, in, tg, B, T, &want_loss), 0);
    CHECK(loss == want_loss);
    backend_cpu.state_release(b, &st);
    adamw_release(&opt);
    gpt2_release(&m);
    coll_close(c);
    backend_cpu.close(b);
}

/* state_set from arrays of the caller's: the parameters and step always, the moments only
 * when asked (else zero); last_logits is the last position's row of a forward. */
TEST(backend_cpu_state_set_and_logits)
{
    struct coll *c;
    struct backend *b = open_cpu(&c);
    size_t n = b->n_params;
    struct backend_state mine = {
        .params = calloc(n, sizeof(float)),
        .m = malloc(n * sizeof(float)),
        .v = malloc(n * sizeof(float)),
        .opt_step = 7,
    };
    struct backend_state st = {0}, got = {0};
    struct gpt2 m;
    const float *row;
    float loss;
    int in[T];

    for (size_t i = 0; i < n; i++) {
        mine.m[i] = 1.0f;
        mine.v[i] = 2.0f;
    }
    CHECK_EQ(gpt2_init(&m, &tiny, 1, T), 0);
    gpt2_init_random(&m, SEED + 1);
    memcpy(mine.params, m.params, n * sizeof(float));
    CHECK_EQ(backend_cpu.state_set(b, &mine, true), 0);
    CHECK_EQ(backend_cpu.state_host(b, &st), 0);
    CHECK(st.params != mine.params);
    CHECK_EQ(backend_cpu.state_get(b, &got), 0);
    CHECK_EQ(got.opt_step, 7);
    CHECK(!memcmp(st.params, mine.params, n * sizeof(float)));
    CHECK(st.m[0] == 1.0f && st.v[n - 1] == 2.0f);
    CHECK_EQ(backend_cpu.state_set(b, &mine, false), 0);
    CHECK(st.m[0] == 0.0f && st.v[n - 1] == 0.0f);

    tokens(in, T, 3);
    CHECK_EQ(backend_cpu.last_logits(b, in, T, &row), 0);
    CHECK_EQ(gpt2_forward(&m, in, NULL, 1, T, &loss), 0);
    CHECK(!memcmp(row, gpt2_logits(&m) + (size_t)(T - 1) * tiny.padded_vocab_size,
                  (size_t)tiny.padded_vocab_size * sizeof(float)));
    backend_cpu.state_release(b, &st);
    free(mine.params);
    free(mine.m);
    free(mine.v);
    gpt2_release(&m);
    coll_close(c);
    backend_cpu.close(b);
}

/* A token outside the vocabulary: -EINVAL and a line saying what failed. */
TEST(backend_cpu_errors_are_one_line)
{
    struct coll *c;
    struct backend *b = open_cpu(&c);
    int in[B * T], tg[B * T];
    float loss;

    tokens(in, B * T, 0);
    tokens(tg, B * T, 1);
    in[3] = tiny.vocab_size;
    CHECK_EQ(backend_cpu.forward_backward(b, in, tg, B, T, 1.0f, &loss), -EINVAL);
    CHECK_CONTAINS(b->err.text, "forward/backward failed: ");
    CHECK_EQ(backend_cpu.eval_loss(b, in, tg, B, T, &loss), -EINVAL);
    CHECK_CONTAINS(b->err.text, "forward failed: ");
    coll_close(c);
    backend_cpu.close(b);
}

/* Without a device (or without the CUDA backend) the probe fails and says why. */
TEST(backend_cuda_probe)
{
    struct errmsg why = {""};
    int ret = backend_cuda.probe(&why);

    CHECK_STR(backend_cuda.name, "cuda");
    CHECK_STR(backend_cuda.coll, "nccl");
    if (ret == 0)
        test_skip("a CUDA device is available");
    CHECK(ret == -ENODEV || ret == -ENOTSUP);
    CHECK(why.text[0] != '\0');
}
