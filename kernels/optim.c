/* AdamW, the warmup + cosine learning rate and the global gradient norm (see optim.h). */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "optim.h"
#include "banned.h"

/* Gradients per partial sum of the norm: fixed, so that the summation order is too. */
#define NORM_CHUNK 16384

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

void adamw_update(struct adamw *opt, float *params, const float *grads, float lr, float grad_scale)
{
    const struct adamw_config *c = &opt->cfg;
    float *m = opt->m, *v = opt->v;

    opt->step++;
    /* Bias corrections in double: beta^t for t in the millions stays accurate. */
    float corr1 = (float)(1.0 - pow(c->beta1, (double)opt->step));
    float corr2 = (float)(1.0 - pow(c->beta2, (double)opt->step));

    for (size_t s = 0; s < opt->n_spans; s++) {
        const struct optim_span *sp = &opt->spans[s];
        float wd = sp->decay ? c->weight_decay : 0.0f;
        long lo = (long)sp->offset, hi = (long)(sp->offset + sp->count);

#pragma omp parallel for simd schedule(static)
        for (long i = lo; i < hi; i++) {
            float g = grads[i] * grad_scale;
            float mi = c->beta1 * m[i] + (1.0f - c->beta1) * g;
            float vi = c->beta2 * v[i] + (1.0f - c->beta2) * g * g;
            float mhat = mi / corr1, vhat = vi / corr2;
            m[i] = mi;
            v[i] = vi;
            params[i] -= lr * (mhat / (sqrtf(vhat) + c->eps) + wd * params[i]);
        }
    }
}

double optim_grad_norm(const float *grads, size_t n)
{
    long chunks = (long)((n + NORM_CHUNK - 1) / NORM_CHUNK);
    double *part, total = 0.0;

    part = malloc((size_t)(chunks ? chunks : 1) * sizeof(*part));
    if (!part) {
        /* No memory for the partial sums: the same sums, one thread. */
        for (long q = 0; q < chunks; q++) {
            double s = 0.0;
            for (size_t i = (size_t)q * NORM_CHUNK; i < n && i < (size_t)(q + 1) * NORM_CHUNK; i++)
                s += (double)grads[i] * grads[i];
            total += s;
        }
        return sqrt(total);
    }
#pragma omp parallel for schedule(static)
    for (long q = 0; q < chunks; q++) {
        size_t i0 = (size_t)q * NORM_CHUNK, i1 = i0 + NORM_CHUNK < n ? i0 + NORM_CHUNK : n;
        double s = 0.0;
        for (size_t i = i0; i < i1; i++)
            s += (double)grads[i] * grads[i];
        part[q] = s;
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
