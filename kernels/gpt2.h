/* The GPT-2 model of the CPU backend: token + position embeddings, pre-LayerNorm blocks
 * (causal multi-head attention, GELU MLP), a final LayerNorm and the LM head tied to the token
 * embedding, over a vocabulary padded for alignment. Parameters live in one flat fp32 buffer
 * in llm.c's tensor order (so that llm.c checkpoints load as they are and a checkpoint is one
 * write) and gradients in one flat buffer of the same layout (so that a collective reduces
 * them in one call). Also the model's random number generator (init, sampling).
 *
 * Thread context: one thread drives a model; the ops inside use that thread's OpenMP team
 * and give bit-identical results whatever its size. */
#ifndef GPURUN_KERNELS_GPT2_H
#define GPURUN_KERNELS_GPT2_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "optim.h"

struct errmsg;

/* The vocabulary is padded to a multiple of this (llm.c's choice: 50257 -> 50304). */
#define GPT2_VOCAB_ALIGN 128
/* Parameter tensors, in llm.c's order: the index of each in gpt2_tensors' array and in the
 * flat buffer's layout, for both backends. The per-layer ones are GPT2_LN1W to GPT2_FCPROJB. */
enum gpt2_tensor_id {
    GPT2_WTE,
    GPT2_WPE,
    GPT2_LN1W,
    GPT2_LN1B,
    GPT2_QKVW,
    GPT2_QKVB,
    GPT2_ATTPROJW,
    GPT2_ATTPROJB,
    GPT2_LN2W,
    GPT2_LN2B,
    GPT2_FCW,
    GPT2_FCB,
    GPT2_FCPROJW,
    GPT2_FCPROJB,
    GPT2_LNFW,
    GPT2_LNFB,
    GPT2_NUM_TENSORS,
};

struct gpt2_config {
    int max_seq_len;       /* T_max: rows of wpe */
    int vocab_size;        /* V: token ids are in [0, V) */
    int padded_vocab_size; /* Vp >= V: rows of wte and length of a logits row */
    int n_layer;           /* L */
    int n_head;            /* NH, divides n_embd */
    int n_embd;            /* C */
};

/* V rounded up to GPT2_VOCAB_ALIGN. */
int gpt2_padded_vocab(int vocab_size);

/* Whether cfg is usable: every size positive, n_head divides n_embd, padded_vocab_size >=
 * vocab_size, and the buffers' sizes fit. On false, err says which rule failed, e.g.
 * "n_head (5) must divide n_embd (64)". */
bool gpt2_config_valid(const struct gpt2_config *cfg, struct errmsg *err);

/* One parameter tensor of the flat buffer. */
struct gpt2_tensor {
    const char *name; /* "wte", "qkvw", ...: static string */
    size_t offset;    /* in floats, into params and grads */
    size_t count;     /* floats; a per-layer tensor holds all L layers, layer l at l * count/L */
    bool decay;       /* AdamW's weight decay applies (2D weights: wte, wpe, qkvw, attprojw,
                       * fcw, fcprojw; not biases or LayerNorm parameters) */
};

/* Fills t with cfg's tensors in llm.c's order; returns the total number of parameters. */
size_t gpt2_tensors(const struct gpt2_config *cfg, struct gpt2_tensor t[GPT2_NUM_TENSORS]);

struct gpt2 {
    struct gpt2_config cfg;
    struct gpt2_tensor tensors[GPT2_NUM_TENSORS];
    size_t n_params;
    float *params; /* n_params floats, owned; layout per tensors[] */
    float *grads;  /* n_params floats, owned; same layout */

    /* The activation capacity (batch_cap * seq_cap positions) and the private buffers: read
     * only through the functions below. */
    int batch_cap, seq_cap;
    float *acts;
    size_t n_acts;
    float *scratch; /* the backward's activation gradients */
    size_t n_scratch;
    int *tokens; /* inputs then targets of the last forward, 2 * batch_cap * seq_cap */
    int B, T;    /* shape of the last forward; 0 before the first */
    bool have_targets;
    float loss; /* mean loss of the last forward with targets */
};

/* Sets up m for cfg (checked with gpt2_config_valid) with activations for up to batch_cap
 * sequences of up to seq_cap <= max_seq_len positions. Parameters and gradients are zero:
 * call gpt2_init_random or load parameters into m->params. Returns 0, -EINVAL for a bad
 * config or capacity, -ENOMEM. On failure m needs no release. */
int gpt2_init(struct gpt2 *m, const struct gpt2_config *cfg, int batch_cap, int seq_cap);
/* Frees every buffer of m. */
void gpt2_release(struct gpt2 *m);

/* GPT-2's initialisation from seed, reproducible bit for bit: weights (wte's first V rows,
 * wpe, qkvw, fcw) normal with std 0.02, the projections into the residual stream (attprojw,
 * fcprojw) std 0.02 / sqrt(2 L), LayerNorm weights 1, biases and wte's padding rows 0. The
 * normals come from gpt2_rng_normal on a generator seeded with seed, tensor by tensor in
 * order, layer by layer. */
void gpt2_init_random(struct gpt2 *m, uint64_t seed);

/* Forward pass of B sequences of T tokens (B <= batch_cap, T <= seq_cap), inputs (B,T)
 * borrowed for the call. With targets (B,T) the next tokens: stores the mean cross-entropy
 * loss in *loss (may be NULL) and keeps what gpt2_backward needs; targets NULL: logits only.
 * Returns 0, -EINVAL for a bad shape or a token outside [0, V), -ENOMEM. */
int gpt2_forward(struct gpt2 *m, const int *inputs, const int *targets, int B, int T, float *loss);

/* The logits of the last forward: (B, T, Vp) floats, row b*T + t for position t of sequence
 * b, the first V meaningful. Borrowed: valid until the next forward or backward (the backward
 * turns them into its own gradients). */
const float *gpt2_logits(const struct gpt2 *m);

/* grads = 0. */
void gpt2_zero_grad(struct gpt2 *m);

/* Backward pass of the last forward (which must have had targets): grads += grad_scale *
 * d(mean loss)/d(params). Gradient accumulation over k micro-batches: zero once, then k
 * forward/backward pairs with grad_scale 1/k. Returns 0, -EINVAL without a forward with
 * targets, -ENOMEM. */
int gpt2_backward(struct gpt2 *m, float grad_scale);

/* Spans for the optimizer, one per tensor, with the decay choice above: writes
 * GPT2_NUM_TENSORS entries to spans and returns that count. */
size_t gpt2_optim_spans(const struct gpt2 *m, struct optim_span spans[GPT2_NUM_TENSORS]);

/* Forward + backward FLOPs of one sequence of T positions: 6 per parameter use in a matmul
 * (the L blocks' four weights and the tied LM head; 2 forward, 4 backward) plus the causal
 * attention products (QK^T and att V: T(T+1)/2 dot products of C each, 3x for the backward). */
double gpt2_flops_per_sequence(const struct gpt2_config *cfg, int T);

/* Next token from a row of logits (the first V used): argmax when temperature <= 0, else a
 * draw from softmax(logits / temperature) with gpt2_rng_uniform on *rng. */
int gpt2_sample_next(const float *logits, int V, float temperature, uint64_t *rng);

/* The model's generator: splitmix64 on one 64-bit state, so that a checkpoint stores it as
 * one number. Next 64 random bits: */
uint64_t gpt2_rng_next(uint64_t *state);
/* A float uniform in [0, 1) (24 random bits). */
float gpt2_rng_uniform(uint64_t *state);
/* A standard normal (Box-Muller, in double, one value per two uniforms). */
float gpt2_rng_normal(uint64_t *state);

#endif
