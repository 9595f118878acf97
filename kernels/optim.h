/* The optimizer of the training core: AdamW over flat fp32 buffers (the model's one parameter
 * buffer and one gradient buffer), the learning-rate schedule (linear warmup, cosine decay)
 * and the global gradient norm used for clipping. Backend-neutral maths; the state is flat so
 * that a checkpoint saves m, v and step as they are. */
#ifndef GPURUN_KERNELS_OPTIM_H
#define GPURUN_KERNELS_OPTIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A run of the flat buffer with its weight-decay choice: the model lists its tensors
 * (gpt2_optim_spans), so that decay applies to 2D weights only. */
struct optim_span {
    size_t offset, count;
    bool decay;
};

/* AdamW's constants (the learning rate comes per update, from the schedule). */
struct adamw_config {
    float beta1, beta2, eps, weight_decay;
};

/* AdamW state: m and v (fp32, n each, owned) and the number of updates done. */
struct adamw {
    size_t n;
    float *m, *v;
    uint64_t step;
    struct adamw_config cfg;
    struct optim_span *spans; /* owned copy, covering [0, n) in order */
    size_t n_spans;
};

/* Sets up opt for n parameters with m = v = 0 and step 0. spans (borrowed, copied) must cover
 * [0, n) in increasing order without gaps or overlaps. Returns 0, -EINVAL for bad spans or
 * hyperparameters (betas outside [0, 1), eps <= 0, weight_decay < 0), -ENOMEM. On failure opt
 * needs no release. */
int adamw_init(struct adamw *opt, size_t n, const struct adamw_config *cfg,
               const struct optim_span *spans, size_t n_spans);
/* Frees m, v and the spans; opt can be initialised again. */
void adamw_release(struct adamw *opt);

/* One update (step becomes t = step + 1), for every element i with g = grads[i] * grad_scale:
 *   m = beta1 m + (1 - beta1) g,  v = beta2 v + (1 - beta2) g^2,
 *   mhat = m / (1 - beta1^t),  vhat = v / (1 - beta2^t),
 *   param -= lr * (mhat / (sqrt(vhat) + eps) + wd * param)
 * with wd = weight_decay on spans marked decay and 0 elsewhere (decoupled weight decay, as in
 * PyTorch's AdamW and llm.c). grad_scale carries the clipping factor (optim_clip_scale). Each
 * element is independent: bit-identical whatever the number of OpenMP threads. */
void adamw_update(struct adamw *opt, float *params, const float *grads, float lr, float grad_scale);

/* The global L2 norm of n gradients, summed in double in fixed chunks and then the chunk sums
 * in order, so that the result does not depend on the number of threads. */
double optim_grad_norm(const float *grads, size_t n);

/* The factor clipping by global norm applies: max_norm / norm when norm > max_norm, else 1
 * (also 1 when max_norm <= 0: clipping off). */
float optim_clip_scale(double norm, float max_norm);

/* Learning rate at 0-based step `step`: lr * (step + 1) / warmup_steps during the first
 * warmup_steps steps, then a cosine from lr down to min_lr over the steps up to total_steps:
 *   min_lr + 0.5 (lr - min_lr) (1 + cos(pi * (step - warmup) / (total - warmup))),
 * and min_lr from total_steps on. (llm.c's schedule.) */
struct lr_schedule {
    float lr, min_lr;
    long warmup_steps, total_steps;
};
float optim_lr(const struct lr_schedule *s, long step);

#endif
