/* The training backends behind one interface (docs/design.md, section 7): a GPT-2 model and its
 * AdamW optimizer on one device, as gpurun-train's step loop drives them. "cpu" is gpt2.h's
 * model and optim.h's AdamW in host memory, fp32 (backend_cpu.c); "cuda" is cuda/gpt2_gpu.h's
 * model on one GPU per rank, bf16 with fp32 master weights or fp32, optionally with the
 * optimizer state sharded over the ranks (ZeRO-1) (backend_cuda.c). Both hold the parameters
 * in gpt2.h's flat layout, so that a checkpoint of one is a checkpoint of the other.
 *
 * Lifecycle: probe (may this process use it at all?), open (the device: before the
 * collectives open, since NCCL binds to the device current then), init (the model and the
 * optimizer, over the collectives), a starting state (init_random or state_set), the steps,
 * close (after coll_close: the device outlives NCCL's communicator).
 *
 * Collective operations: every rank calls them in the same order, as the coll_* calls they
 * make (coll/coll.h). The others are the rank's own.
 *
 * Errors: every operation returns 0 or a negative errno; on failure the backend's err holds
 * one line saying what failed and why ("forward/backward failed: token inputs[3] (300)
 * outside [0, 256)"), which the caller prefixes with its context.
 *
 * Thread context: the thread that opened a backend drives it. */
#ifndef GPURUN_KERNELS_BACKEND_H
#define GPURUN_KERNELS_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "errmsg.h"
#include "gpt2.h"
#include "optim.h"

struct coll;

/* What init sets up. */
struct backend_opts {
    struct gpt2_config model; /* checked by init (gpt2_config_valid and the backend's own) */
    int batch_size, seq_len;  /* the largest micro-batch a forward takes */
    struct adamw_config adamw;
    bool fp32;         /* cuda: fp32 throughout, else bf16 with fp32 master weights; cpu: fp32 */
    bool zero;         /* cuda: ZeRO-1 (the optimizer state sharded over the ranks) */
    int attention;     /* cuda bf16: enum traincfg_attention */
    bool graphs;       /* cuda: each micro-step's kernels as one CUDA graph */
    struct coll *coll; /* borrowed until close: the collectives the gradients are averaged over */
};

/* The model's state as flat fp32 host arrays in gpt2.h's layout, n_params floats each: what a
 * checkpoint holds and what rank 0 hands the other ranks at the start. */
struct backend_state {
    float *params;     /* the parameters (cuda bf16: the fp32 master weights) */
    float *m, *v;      /* AdamW's moments */
    uint64_t opt_step; /* AdamW's count of updates */
};

/* The part every backend shares; each embeds it first in its own struct. */
struct backend {
    const struct backend_ops *ops;
    size_t n_params;   /* the model's parameters, from init on */
    struct errmsg err; /* the last failure's line (errmsg_set) */
};

struct backend_ops {
    const char *name; /* train.device's value: "cpu", "cuda" */
    /* The collectives backend (coll_open's name) for the ranks of this backend: "nccl", also
     * for one rank; NULL for "tcp" with several ranks and "single" with one. */
    const char *coll;

    /* Whether this process can use the backend (cuda: a device is there), before anything
     * takes time: 0, or a negative errno with why (the caller's) saying why not. */
    int (*probe)(struct errmsg *why);
    /* The backend of this rank (cuda: the device of local_rank, the node-local rank, made
     * current). Returns 0 with *out new (close frees it), or a negative errno with *out NULL
     * and err (the caller's) saying why. */
    int (*open)(struct backend **out, int local_rank, struct errmsg *err);
    /* The model and its optimizer (o borrowed for the call), parameters and moments zero; sets
     * b->n_params. */
    int (*init)(struct backend *b, const struct backend_opts *o);
    /* Frees b and all it holds (NULL: nothing). */
    void (*close)(struct backend *b);
    /* What the run computes on, in words, for the set-up line (buf: len bytes): "cpu, 4
     * threads per rank", "cuda, one GPU per rank, bf16 (fp32 master weights)". */
    void (*describe)(const struct backend *b, char *buf, size_t len);

    /* ---- state --------------------------------------------------------------------------- */

    /* GPT-2's initialisation from seed (gpt2_init_random's, the same on every backend), the
     * moments zero. */
    int (*init_random)(struct backend *b, uint64_t seed);
    /* Points st's arrays at host memory for the state: the model's own buffers on cpu (then
     * they are the state: borrowed until close), staging buffers on cuda (until
     * state_release). The arrays hold the state only after state_get; whatever they hold goes
     * to the model with state_set. */
    int (*state_host)(struct backend *b, struct backend_state *st);
    /* The model's state into st (st from state_host on rank 0; NULL on the other ranks, which
     * take part only). Collective with cuda's ZeRO-1 (the shards are gathered). */
    int (*state_get)(struct backend *b, struct backend_state *st);
    /* st's state becomes the model's (st borrowed for the call; its arrays may be
     * state_host's): the parameters, AdamW's step count, and the moments with with_moments,
     * else zero. */
    int (*state_set)(struct backend *b, const struct backend_state *st, bool with_moments);
    /* Frees what state_host allocated (nothing for an st it never filled: all zero) and
     * clears st. */
    void (*state_release)(struct backend *b, struct backend_state *st);
    /* Optional (NULL: the backend cannot regroup in process, gr.h): the collectives it uses
     * from now on, the old ones closed. Under cuda's ZeRO-1, whose state_get gathers every
     * rank's shard, a regroup takes the state from the last checkpoint instead (train.c). */
    void (*set_coll)(struct backend *b, struct coll *coll);

    /* ---- the step ------------------------------------------------------------------------ */

    /* Gradients = 0. */
    int (*zero_grad)(struct backend *b);
    /* Forward and backward of B sequences of T tokens (inputs and targets (B,T), borrowed for
     * the call): gradients += grad_scale * d(mean loss)/d(params), *loss the mean loss. */
    int (*forward_backward)(struct backend *b, const int *inputs, const int *targets, int B, int T,
                            float grad_scale, float *loss);
    /* The gradients averaged over the ranks (with ZeRO-1, this rank's shard of them).
     * Collective. */
    int (*average_grads)(struct backend *b);
    /* The L2 norm of the averaged gradients, the same on every rank, into *norm. Collective
     * (with ZeRO-1). */
    int (*grad_norm)(struct backend *b, double *norm);
    /* One AdamW update at rate lr with the gradients scaled by grad_scale (the clipping
     * factor); every rank's parameters are the same after it. Collective (with ZeRO-1: the
     * shards are gathered). */
    int (*update)(struct backend *b, float lr, float grad_scale);

    /* ---- evaluation and sampling --------------------------------------------------------- */

    /* Forward only: the mean loss of B sequences of T tokens against targets into *loss. */
    int (*eval_loss)(struct backend *b, const int *inputs, const int *targets, int B, int T,
                     float *loss);
    /* Forward of one sequence of T tokens: *row gets the logits at its last position,
     * padded_vocab_size floats (borrowed until the next call on b). */
    int (*last_logits)(struct backend *b, const int *tokens, int T, const float **row);
};

/* The backends (backend_cpu.c, backend_cuda.c). In a build without the CUDA backend, cuda's
 * probe says so and nothing else of it may be called. */
extern const struct backend_ops backend_cpu;
extern const struct backend_ops backend_cuda;

#endif
