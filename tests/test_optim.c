/* Tests of kernels/optim: AdamW against steps computed by hand (in double), weight decay only
 * on the spans marked for it, clipping through grad_scale, the learning-rate schedule's
 * values, the global norm, and results that do not depend on the number of threads. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>

#include "optim.h"
#include "test.h"
#include "banned.h"

static const struct adamw_config hp = {
    .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};

static void check_near(const char *what, int i, double got, double want, double tol)
{
    if (!(fabs(got - want) <= tol * (1.0 + fabs(want))))
        test_fail(__FILE__, __LINE__, "%s[%d]: %.9g vs %.9g", what, i, got, want);
}

/* Three updates of four parameters, the first two decayed, against the formulas in double. */
TEST(optim_adamw_matches_hand_computation)
{
    struct optim_span spans[2] = {{0, 2, true}, {2, 2, false}};
    float params[4] = {0.5f, -1.0f, 2.0f, 0.0f};
    const float grads[3][4] = {
        {0.1f, -0.2f, 0.3f, 0.0f}, {-0.05f, 0.4f, 0.3f, 1.0f}, {0.2f, 0.1f, -0.6f, -2.0f}};
    const float lr[3] = {1e-3f, 2e-3f, 5e-4f}, scale[3] = {1.0f, 0.5f, 2.0f};
    double p[4], m[4] = {0}, v[4] = {0};
    struct adamw opt;

    for (int i = 0; i < 4; i++)
        p[i] = params[i];
    CHECK_EQ(adamw_init(&opt, 4, &hp, spans, 2), 0);
    for (int t = 1; t <= 3; t++) {
        adamw_update(&opt, params, grads[t - 1], lr[t - 1], scale[t - 1]);
        for (int i = 0; i < 4; i++) {
            double g = (double)grads[t - 1][i] * scale[t - 1], wd = i < 2 ? 0.1 : 0.0;
            m[i] = 0.9 * m[i] + 0.1 * g;
            v[i] = 0.95 * v[i] + 0.05 * g * g;
            double mhat = m[i] / (1.0 - pow(0.9, t)), vhat = v[i] / (1.0 - pow(0.95, t));
            p[i] -= lr[t - 1] * (mhat / (sqrt(vhat) + 1e-8) + wd * p[i]);
            check_near("m", i, opt.m[i], m[i], 1e-6);
            check_near("v", i, opt.v[i], v[i], 1e-6);
            check_near("param", i, params[i], p[i], 1e-6);
        }
        CHECK_EQ(opt.step, t);
    }
    adamw_release(&opt);
}

/* The first step moves every parameter by lr * sign(g) (mhat / sqrt(vhat) = g / |g|), plus
 * lr * wd * param where decayed: a check that needs no formula replay. */
TEST(optim_adamw_first_step_is_signed_lr)
{
    struct optim_span spans[3] = {{0, 3, false}, {3, 3, true}, {6, 2, false}};
    float params[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    float grads[8] = {3.0f, -1e-3f, 0.0f, 7.0f, -2.0f, 0.0f, 1.0f, -1.0f};
    struct adamw opt;

    CHECK_EQ(adamw_init(&opt, 8, &hp, spans, 3), 0);
    adamw_update(&opt, params, grads, 0.01f, 1.0f);
    const double want[8] = {0.99, 1.01, 1.0, 0.99 - 0.001, 1.01 - 0.001, 1.0 - 0.001, 0.99, 1.01};
    for (int i = 0; i < 8; i++)
        check_near("param", i, params[i], want[i], 2e-6);
    adamw_release(&opt);
}

TEST(optim_adamw_init_checks)
{
    struct optim_span gap[2] = {{0, 2, true}, {3, 1, false}};
    struct optim_span over[1] = {{0, 5, true}};
    struct optim_span ok[1] = {{0, 4, true}};
    struct adamw_config bad = hp;
    struct adamw opt;

    CHECK_EQ(adamw_init(&opt, 4, &hp, gap, 2), -EINVAL);
    CHECK_EQ(adamw_init(&opt, 4, &hp, over, 1), -EINVAL);
    CHECK_EQ(adamw_init(&opt, 4, &hp, ok, 0), -EINVAL);
    bad.beta1 = 1.0f;
    CHECK_EQ(adamw_init(&opt, 4, &bad, ok, 1), -EINVAL);
    bad = hp;
    bad.eps = 0.0f;
    CHECK_EQ(adamw_init(&opt, 4, &bad, ok, 1), -EINVAL);
    CHECK_EQ(adamw_init(&opt, 4, &hp, ok, 1), 0);
    CHECK_EQ(opt.step, 0);
    for (int i = 0; i < 4; i++)
        CHECK(opt.m[i] == 0.0f && opt.v[i] == 0.0f);
    adamw_release(&opt);
}

/* Clipping through grad_scale equals an update with the clipped gradients. */
TEST(optim_clip_scale_and_norm)
{
    float g[3] = {3.0f, 4.0f, 0.0f}, clipped[3];
    float pa[3] = {0.1f, 0.2f, 0.3f}, pb[3] = {0.1f, 0.2f, 0.3f};
    struct optim_span span = {0, 3, true};
    struct adamw a, b;

    CHECK(optim_grad_norm(g, 3) == 5.0);
    CHECK(optim_clip_scale(5.0, 1.0f) == 0.2f);
    CHECK(optim_clip_scale(5.0, 10.0f) == 1.0f);
    CHECK(optim_clip_scale(5.0, 0.0f) == 1.0f);
    CHECK(optim_clip_scale(NAN, 1.0f) == 1.0f);
    for (int i = 0; i < 3; i++)
        clipped[i] = g[i] * 0.2f;
    CHECK_EQ(adamw_init(&a, 3, &hp, &span, 1), 0);
    CHECK_EQ(adamw_init(&b, 3, &hp, &span, 1), 0);
    for (int s = 0; s < 3; s++) {
        adamw_update(&a, pa, g, 1e-2f, optim_clip_scale(optim_grad_norm(g, 3), 1.0f));
        adamw_update(&b, pb, clipped, 1e-2f, 1.0f);
    }
    CHECK(!memcmp(pa, pb, sizeof(pa)));
    CHECK(!memcmp(a.m, b.m, 3 * sizeof(float)));
    adamw_release(&a);
    adamw_release(&b);
}

/* A norm over many chunks: within double rounding of the exact sum, and the same bits for 1,
 * 2 and 3 threads. */
TEST(optim_grad_norm_thread_independent)
{
    size_t n = 100003;
    float *g = malloc(n * sizeof(float));
    double exact = 0.0, norms[3];

    CHECK(g);
    for (size_t i = 0; i < n; i++) {
        g[i] = (float)((double)((i * 2654435761u) % 1000) / 1000.0 - 0.5);
        exact += (double)g[i] * g[i];
    }
    for (int t = 0; t < 3; t++) {
        omp_set_num_threads(t + 1);
        norms[t] = optim_grad_norm(g, n);
    }
    CHECK(norms[0] == norms[1] && norms[1] == norms[2]);
    CHECK(fabs(norms[0] - sqrt(exact)) <= 1e-12 * sqrt(exact));
    CHECK(optim_grad_norm(g, 0) == 0.0);
    free(g);
}

TEST(optim_adamw_thread_independent)
{
    size_t n = 50000;
    struct optim_span spans[2] = {{0, 30000, true}, {30000, 20000, false}};
    float *g = malloc(n * sizeof(float)), *p[2];
    struct adamw opt[2];

    CHECK(g);
    for (size_t i = 0; i < n; i++)
        g[i] = (float)sin((double)i);
    for (int t = 0; t < 2; t++) {
        omp_set_num_threads(t + 1);
        p[t] = malloc(n * sizeof(float));
        CHECK(p[t]);
        for (size_t i = 0; i < n; i++)
            p[t][i] = (float)cos((double)i);
        CHECK_EQ(adamw_init(&opt[t], n, &hp, spans, 2), 0);
        for (int s = 0; s < 3; s++)
            adamw_update(&opt[t], p[t], g, 3e-4f, 0.7f);
    }
    CHECK(!memcmp(p[0], p[1], n * sizeof(float)));
    CHECK(!memcmp(opt[0].v, opt[1].v, n * sizeof(float)));
    for (int t = 0; t < 2; t++) {
        adamw_release(&opt[t]);
        free(p[t]);
    }
    free(g);
}

TEST(optim_lr_schedule)
{
    struct lr_schedule s = {.lr = 6e-4f, .min_lr = 6e-5f, .warmup_steps = 10, .total_steps = 110};

    /* Warmup: linear, reaching lr at the last warmup step. */
    CHECK(fabsf(optim_lr(&s, 0) - 6e-5f) < 1e-10f);
    CHECK(fabsf(optim_lr(&s, 4) - 3e-4f) < 1e-10f);
    CHECK(fabsf(optim_lr(&s, 9) - 6e-4f) < 1e-10f);
    /* Cosine: lr at its start, the midpoint halfway, min_lr at the end and after. */
    CHECK(fabsf(optim_lr(&s, 10) - 6e-4f) < 1e-10f);
    CHECK(fabsf(optim_lr(&s, 60) - 3.3e-4f) < 1e-9f);
    CHECK(fabsf(optim_lr(&s, 35) - (float)(6e-5 + 0.5 * 5.4e-4 * (1 + cos(M_PI / 4)))) < 1e-9f);
    CHECK(fabsf(optim_lr(&s, 110) - 6e-5f) < 1e-10f);
    CHECK(fabsf(optim_lr(&s, 500) - 6e-5f) < 1e-10f);
    /* Decreasing after warmup. */
    for (long i = 10; i < 110; i++)
        CHECK(optim_lr(&s, i + 1) <= optim_lr(&s, i));
    /* No warmup, and a schedule no longer than its warmup. */
    s.warmup_steps = 0;
    CHECK(fabsf(optim_lr(&s, 0) - 6e-4f) < 1e-10f);
    s.warmup_steps = 200;
    CHECK(fabsf(optim_lr(&s, 199) - 6e-4f) < 1e-10f);
    CHECK(fabsf(optim_lr(&s, 200) - 6e-5f) < 1e-10f);
}
