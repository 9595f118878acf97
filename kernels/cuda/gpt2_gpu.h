/* The GPT-2 model of the CUDA backend: kernels/gpt2.h's model (the same config, the same flat
 * parameter layout in llm.c's tensor order, the same maths) with its parameters, gradients,
 * activations and AdamW state on one GPU, computed by the launchers of cuda_ops.h.
 *
 * Precision (the model's dtype): GPU_BF16 keeps parameters, gradients and activations in bf16
 * and AdamW's master weights and moments in fp32 (the update runs on the fp32 master and the
 * bf16 parameters receive its rounding); GPU_F32 keeps everything in fp32, so that the CPU
 * backend is its oracle within float rounding.
 *
 * Sharding (ZeRO-1): the parameter and gradient buffers hold n_pad >= n_params elements (the
 * tail stays zero) so that a collective can cut them into equal shards; the optimizer state
 * (master weights, m, v) covers only the shard [opt_lo, opt_hi) of them, and
 * gpt2_gpu_update updates only that range of the parameters. Without sharding the shard is
 * [0, n_params).
 *
 * Thread context: the thread that created the gpu_ctx drives the model. Every call queues
 * work on the context's stream; the calls that return host values (loss, norm, downloads)
 * wait for it. Errors: negative errno with err (the caller's, given at gpt2_gpu_new) holding
 * one line, as gpu_ctx_error. */
#ifndef GPURUN_KERNELS_CUDA_GPT2_GPU_H
#define GPURUN_KERNELS_CUDA_GPT2_GPU_H

#include <stddef.h>
#include <stdint.h>

#include "../gpt2.h"
#include "../optim.h"
#include "cuda_ops.h"

#ifdef GPURUN_CUDA

struct gpt2_gpu;

struct gpt2_gpu_opts {
    enum gpu_dtype dt; /* GPU_BF16 or GPU_F32 (above) */
    int batch_cap,
        seq_cap;           /* activations for up to batch_cap sequences of seq_cap <= max_seq_len */
    size_t n_pad;          /* elements of the parameter and gradient buffers: 0 means n_params,
                            * else >= n_params */
    size_t opt_lo, opt_hi; /* the optimizer's shard of [0, n_pad); both 0 means [0, n_params) */
    struct adamw_config adamw;
    /* Run the training step's kernels as a CUDA graph: one launch in place of some 500 (at
     * GPT-2 small), recorded at the second step of a shape (gpt2_gpu_forward_backward). The
     * results are the same bits. A recording the device refuses turns this off for the
     * model, and gpt2_gpu_graphs_describe says why. */
    bool graphs;
};

/* Device buffers of a model (borrowed: valid until gpt2_gpu_free). Collectives work on them
 * in place. */
struct gpt2_gpu_bufs {
    void *params;  /* n_pad elements of the model's dtype */
    void *grads;   /* n_pad elements of the model's dtype */
    float *master; /* opt_hi - opt_lo fp32 master weights; NULL with GPU_F32 (params
                    * are the master) */
    float *m, *v;  /* opt_hi - opt_lo fp32 each: AdamW's moments for the shard */
    size_t n_params, n_pad, opt_lo, opt_hi;
    enum gpu_dtype dt;
};

/* Sets up a model of cfg (checked with gpt2_config_valid) on ctx's device (borrowed: must
 * outlive the model): parameters, gradients and optimizer state zero. err (borrowed until
 * gpt2_gpu_free) receives this call's and every later call's failure.
 * Returns the new model (free with gpt2_gpu_free) or NULL with err filled (a bad config or
 * shard: -EINVAL's text; device memory: "out of device memory for ..."). */
struct gpt2_gpu *gpt2_gpu_new(struct gpu_ctx *ctx, const struct gpt2_config *cfg,
                              const struct gpt2_gpu_opts *opts, struct errmsg *err);
/* Frees every device buffer of m (waits for the stream); NULL is a no-op. */
void gpt2_gpu_free(struct gpt2_gpu *m);

/* The model's buffers and sizes. */
void gpt2_gpu_buffers(const struct gpt2_gpu *m, struct gpt2_gpu_bufs *b);

/* ---- state from and to the host (fp32, kernels/gpt2.h's layout) ----------------------------- */

/* params (host, n_params fp32, borrowed for the call) become the model's parameters (rounded
 * to bf16 in bf16 mode) and its master weights for the shard (exact). Returns 0 or -EIO. */
int gpt2_gpu_set_params(struct gpt2_gpu *m, const float *params);
/* The optimizer moments from full host arrays (n_params fp32 each, borrowed): the shard's part
 * is uploaded, padding is zero. NULL sets that moment to zero. Returns 0 or -EIO. */
int gpt2_gpu_set_moments(struct gpt2_gpu *m, const float *mom1, const float *mom2);
/* The shard's fp32 master weights (the parameters themselves in fp32 mode), m and v into host
 * buffers of opt_hi - opt_lo floats each (any may be NULL: skipped). Returns 0 or -EIO. */
int gpt2_gpu_get_shard(struct gpt2_gpu *m, float *master, float *mom1, float *mom2);
/* All n_params parameters as fp32 on the host (the bf16 values widened in bf16 mode: use
 * gpt2_gpu_get_shard for the master weights). Returns 0 or -EIO. */
int gpt2_gpu_get_params(struct gpt2_gpu *m, float *params);
/* All n_params gradients as fp32 on the host (the tests compare them with the CPU's). */
int gpt2_gpu_get_grads(struct gpt2_gpu *m, float *grads);

/* ---- the step ------------------------------------------------------------------------------- */

/* grads = 0 (all n_pad). */
int gpt2_gpu_zero_grad(struct gpt2_gpu *m);

/* Forward and backward of one micro-batch of B sequences of T tokens (B <= batch_cap,
 * T <= seq_cap): inputs and targets (B,T) host ints, borrowed for the call, each in [0, V)
 * (-EINVAL otherwise, naming the first bad one). grads += grad_scale * d(mean loss)/d(params)
 * as gpt2_backward; *loss (may be NULL) gets the mean loss (summed on the host in double, in
 * position order). The cross-entropy is fused with its gradient: the logits are gone after
 * this call. Returns 0, -EINVAL, -EIO. */
int gpt2_gpu_forward_backward(struct gpt2_gpu *m, const int *inputs, const int *targets, int B,
                              int T, float grad_scale, float *loss);
/* Whether the step runs as a CUDA graph, in words for a start-up line: "on", "off", or
 * "off (why)" after a recording failed. */
void gpt2_gpu_graphs_describe(const struct gpt2_gpu *m, char *buf, size_t len);
/* How many micro-steps ran as a launch of a recorded graph. */
uint64_t gpt2_gpu_graph_launches(const struct gpt2_gpu *m);

/* Forward only (evaluation and sampling): with targets, *loss gets the mean loss (may be
 * NULL); with or without them (targets NULL), the logits are kept for gpt2_gpu_logits_row
 * until the next forward_backward or set_params. Returns 0, -EINVAL, -EIO. */
int gpt2_gpu_forward(struct gpt2_gpu *m, const int *inputs, const int *targets, int B, int T,
                     float *loss);
/* Row (b, t) of the last gpt2_gpu_forward's logits as padded_vocab_size fp32 into row (host).
 * Returns 0, -EINVAL (no such row, or no logits), -EIO. */
int gpt2_gpu_logits_row(struct gpt2_gpu *m, int b, int t, float *row);

/* The sum of squares of the gradients [lo, hi) of [0, n_pad), in double (a fixed order of
 * additions for a given range), into *sumsq. Returns 0, -EINVAL, -EIO. */
int gpt2_gpu_grad_sumsq(struct gpt2_gpu *m, size_t lo, size_t hi, double *sumsq);

/* One AdamW update of the shard [opt_lo, opt_hi) with adamw_update's maths: t is the update's
 * number from 1, lr the rate, grad_scale the clipping factor; weight decay on the 2D tensors'
 * elements only (gpt2_tensors' decay; none on the padding). The gradients of the shard must be
 * the reduced ones. Parameters outside the shard are left as they are (a ZeRO-1 step gathers
 * them afterwards). Returns 0 or -EIO. */
int gpt2_gpu_update(struct gpt2_gpu *m, uint64_t t, float lr, float grad_scale);

#endif /* GPURUN_CUDA */

#endif
