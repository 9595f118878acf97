/* AdamW, the warmup + cosine learning rate and the global gradient norm (see optim.h). */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "optim.h"
#include "banned.h"

/* Gradients per partial sum of the norm: fixed, so that the summation order is too. */
#define NORM_CHUNK 16384

/* The loops below, one copy per x86-64 ISA level (as in ops.c). Each element's arithmetic is
 * the same in every copy (no FMA contraction in ISO C mode), so the results are too. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define OPTIM_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define OPTIM_CLONES
#endif

int adamw_init(struct adamw *opt, size_t n, const struct adamw_config *cfg,
               const struct optim_span *spans, size_t n_spans)
{
    size_t next = 0;

    memset(opt, 0, sizeof(*opt));
    if (!(cfg->beta1 >= 0.0f && cfg->beta1 < 1.0f) || !(cfg->beta2 >= 0.0f && cfg->beta2 < 1.0f) ||
        !(cfg->eps > 0.0f) || !(cfg->weight_decay >= 0.0f))
        return -EINVAL;
    for (size_t i = 0; i < n_spans; i++) {
        if (spans[i].offset != next || spans[i].count > n - next)
            return -EINVAL;
        next += spans[i].count;
    }
    if (next != n)
        return -EINVAL;

    opt->m = calloc(n ? n : 1, sizeof(float));
    opt->v = calloc(n ? n : 1, sizeof(float));
    opt->spans = malloc((n_spans ? n_spans : 1) * sizeof(*spans));
    if (!opt->m || !opt->v || !opt->spans) {
        adamw_release(opt);
        return -ENOMEM;
    }
    if (n_spans)
        memcpy(opt->spans, spans, n_spans * sizeof(*spans));
    opt->n = n;
    opt->n_spans = n_spans;
    opt->cfg = *cfg;
    return 0;
}

void adamw_release(struct adamw *opt)
{
    free(opt->m);
    free(opt->v);
    free(opt->spans);
    memset(opt, 0, sizeof(*opt));
}

OPTIM_CLONES static void adamw_span(float *restrict params, const float *restrict grads,
                                    float *restrict m, float *restrict v, size_t n,
                                    const struct adamw_config *c, float lr, float grad_scale,
                                    float wd, float corr1, float corr2)
{
    float b1 = c->beta1, b2 = c->beta2, eps = c->eps;

#pragma omp simd
    for (size_t i = 0; i < n; i++) {
        float g = grads[i] * grad_scale;
        float mi = b1 * m[i] + (1.0f - b1) * g;
        float vi = b2 * v[i] + (1.0f - b2) * g * g;
        float mhat = mi / corr1, vhat = vi / corr2;
        m[i] = mi;
        v[i] = vi;
        params[i] -= lr * (mhat / (sqrtf(vhat) + eps) + wd * params[i]);
    }
}

/* Elements per thread chunk of the update. */
#define UPDATE_CHUNK 8192

void adamw_update(struct adamw *opt, float *params, const float *grads, float lr, float grad_scale)
{
    const struct adamw_config *c = &opt->cfg;
    long total = 0;

    opt->step++;
    /* Bias corrections in double: beta^t for t in the millions stays accurate. */
    float corr1 = (float)(1.0 - pow(c->beta1, (double)opt->step));
    float corr2 = (float)(1.0 - pow(c->beta2, (double)opt->step));

    /* One parallel loop over every span's chunks (chunk q of the whole list: the span whose
     * first chunk index is the last one <= q), not a loop per span: small spans (biases,
     * LayerNorms) would leave the team idle. */
    for (size_t sp = 0; sp < opt->n_spans; sp++)
        total += (long)((opt->spans[sp].count + UPDATE_CHUNK - 1) / UPDATE_CHUNK);
#pragma omp parallel for schedule(static)
    for (long q = 0; q < total; q++) {
        size_t sp = 0;
        long first = 0, n_sp;
        while ((n_sp = (long)((opt->spans[sp].count + UPDATE_CHUNK - 1) / UPDATE_CHUNK)) <=
               q - first) {
            first += n_sp;
            sp++;
        }
        const struct optim_span *span = &opt->spans[sp];
        size_t off = (size_t)(q - first) * UPDATE_CHUNK, i0 = span->offset + off;
        size_t n = span->count - off < UPDATE_CHUNK ? span->count - off : UPDATE_CHUNK;
        adamw_span(params + i0, grads + i0, opt->m + i0, opt->v + i0, n, c, lr, grad_scale,
                   span->decay ? c->weight_decay : 0.0f, corr1, corr2);
    }
}

/* Sum of squares of n gradients in double, in a fixed order: 8 interleaved partial sums
 * (so that the loop vectorises the same way in every ISA copy), added in order at the end. */
OPTIM_CLONES static double sum_squares(const float *g, size_t n)
{
    double acc[8] = {0};
    size_t i = 0;

    for (; i + 8 <= n; i += 8) {
#pragma omp simd
        for (int k = 0; k < 8; k++)
            acc[k] += (double)g[i + k] * g[i + k];
    }
    for (int k = 0; i < n; i++, k++)
        acc[k] += (double)g[i] * g[i];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

double optim_grad_norm(const float *grads, size_t n)
{
    long chunks = (long)((n + NORM_CHUNK - 1) / NORM_CHUNK);
    double *part, total = 0.0;

    part = malloc((size_t)(chunks ? chunks : 1) * sizeof(*part));
    if (!part) {
        /* No memory for the partial sums: the same sums, one thread. */
        for (long q = 0; q < chunks; q++) {
            size_t i0 = (size_t)q * NORM_CHUNK;
            total += sum_squares(grads + i0, n - i0 < NORM_CHUNK ? n - i0 : NORM_CHUNK);
        }
        return sqrt(total);
    }
#pragma omp parallel for schedule(static)
    for (long q = 0; q < chunks; q++) {
        size_t i0 = (size_t)q * NORM_CHUNK;
        part[q] = sum_squares(grads + i0, n - i0 < NORM_CHUNK ? n - i0 : NORM_CHUNK);
    }
    for (long q = 0; q < chunks; q++)
        total += part[q];
    free(part);
    return sqrt(total);
}

float optim_clip_scale(double norm, float max_norm)
{
    if (max_norm <= 0.0f || !(norm > max_norm))
        return 1.0f;
    return (float)(max_norm / norm);
}

float optim_lr(const struct lr_schedule *s, long step)
{
    if (step < s->warmup_steps)
        return s->lr * (float)(step + 1) / (float)s->warmup_steps;
    if (step >= s->total_steps)
        return s->min_lr;
    double ratio = (double)(step - s->warmup_steps) / (double)(s->total_steps - s->warmup_steps);
    double coeff = 0.5 * (1.0 + cos(M_PI * ratio));
    return (float)(s->min_lr + coeff * (s->lr - s->min_lr));
}
