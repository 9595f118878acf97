/* build/bench/train_gpu (make bench-gpu): the CUDA backend's training step on one GPU for the
 * model of jobs/gpt2-124m.cfg (GPT-2 small) at seq 1024, batch 16, 32 and 64, bf16: tokens/s
 * and MFU against the H100's bf16 dense peak, as a markdown table. A step is what
 * gpurun-train runs on each rank without its collectives: zero the gradients, forward and
 * backward, the gradient norm, AdamW. Without a device it prints one SKIP line and exits 0.
 *
 * usage: train_gpu [--cfg jobs/gpt2-124m.cfg] [--batches 16,32,64] [--seq 1024]
 *                  [--warmup N] [--steps N] [--dtype bf16|fp32]
 *                  [--attention auto|cudnn|cudnn-fast|own] [--graphs on|off] [--smoke]
 * --attention: the bf16 attention (gpu_ctx_set_attention; default auto, cuDNN's where it loads).
 * --graphs: the step's forward and backward as one CUDA graph launch (gpt2_gpu_opts.graphs,
 *   as gpurun-train's train.cuda_graphs; default on): recorded in the second warm-up step, so
 *   with --warmup 1 the first timed step records it.
 * --attention-only: instead of the step, the model's causal attention alone, forward and
 *   forward + backward at each batch, for each bf16 attention (own kernels, cuDNN, cuDNN with
 *   its non-deterministic backward): the median of --steps timed calls (device events) after
 *   --warmup, on random inputs, in TFLOP/s of the causal half: 2 B NH T^2 hs forward, 2.5x
 *   that backward (FlashAttention's count).
 * --smoke: a 2-layer, 64-wide model at seq 32, batch 2, 1 warm-up and 2 timed steps, so that
 * the program itself can run under cudasim (whose timings mean nothing). */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "cuda/cuda_ops.h"
#include "cuda/gpt2_gpu.h"
#include "gpt2.h"
#include "monotime.h"
#include "optim.h"
#include "traincfg.h"
#include "banned.h"

#define PROG        "train_gpu"
/* NVIDIA H100 SXM's dense bf16 tensor-core peak (the data sheet's 1979 TFLOP/s is with 2:4
 * sparsity), the denominator of MFU. */
#define PEAK_FLOPS  989e12
#define MAX_BATCHES 8
/* The learning rate of the timed steps: any rate does; this is GPT-2 small's. */
#define BENCH_LR    6e-4f
#define BENCH_CLIP  1.0f

struct opts {
    const char *cfg_path;
    int batches[MAX_BATCHES], n_batches;
    int seq, warmup, steps;
    enum gpu_dtype dt;
    enum gpu_attention attention;
    bool graphs;
    bool smoke, attention_only;
};

static int usage(void)
{
    fprintf(stderr, "usage: " PROG " [--cfg FILE] [--batches B,B,...] [--seq T] [--warmup N] "
                    "[--steps N] [--dtype bf16|fp32] [--attention auto|cudnn|cudnn-fast|own] "
                    "[--graphs on|off] [--smoke] [--attention-only]\n");
    return 1;
}

/* A positive int from s, or -1. */
static int positive(const char *s)
{
    char *end;
    long v = strtol(s, &end, 10);

    return *s && !*end && v > 0 && v <= 1 << 20 ? (int)v : -1;
}

static int parse_batches(struct opts *o, const char *s)
{
    char buf[128];
    char *p = buf, *comma;

    snprintf(buf, sizeof(buf), "%s", s);
    o->n_batches = 0;
    for (;;) {
        comma = strchr(p, ',');
        if (comma)
            *comma = '\0';
        if (o->n_batches == MAX_BATCHES || (o->batches[o->n_batches++] = positive(p)) < 0)
            return -EINVAL;
        if (!comma)
            return 0;
        p = comma + 1;
    }
}

static int parse_args(struct opts *o, int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--smoke")) {
            o->smoke = true;
            continue;
        }
        if (!strcmp(a, "--attention-only")) {
            o->attention_only = true;
            continue;
        }
        if (!v)
            return -EINVAL;
        i++;
        if (!strcmp(a, "--cfg"))
            o->cfg_path = v;
        else if (!strcmp(a, "--batches") && parse_batches(o, v) == 0)
            continue;
        else if (!strcmp(a, "--seq") && (o->seq = positive(v)) > 0)
            continue;
        else if (!strcmp(a, "--warmup") && (o->warmup = positive(v)) > 0)
            continue;
        else if (!strcmp(a, "--steps") && (o->steps = positive(v)) > 0)
            continue;
        else if (!strcmp(a, "--dtype") && (!strcmp(v, "bf16") || !strcmp(v, "fp32")))
            o->dt = !strcmp(v, "bf16") ? GPU_BF16 : GPU_F32;
        else if (!strcmp(a, "--attention") && !strcmp(v, "auto"))
            o->attention = GPU_ATT_AUTO;
        else if (!strcmp(a, "--attention") && !strcmp(v, "cudnn"))
            o->attention = GPU_ATT_CUDNN;
        else if (!strcmp(a, "--attention") && !strcmp(v, "cudnn-fast"))
            o->attention = GPU_ATT_CUDNN_FAST;
        else if (!strcmp(a, "--attention") && !strcmp(v, "own"))
            o->attention = GPU_ATT_OWN;
        else if (!strcmp(a, "--graphs") && (!strcmp(v, "on") || !strcmp(v, "off")))
            o->graphs = !strcmp(v, "on");
        else
            return -EINVAL;
    }
    return 0;
}

/* The model: --cfg's [model] (its seq_len replaced by --seq), or the smoke model. */
static int model_config(const struct opts *o, struct gpt2_config *mc)
{
    struct traincfg cfg;
    struct errmsg err;
    struct errmsg why;
    int ret;

    if (o->smoke) {
        *mc = (struct gpt2_config){.max_seq_len = o->seq,
                                   .vocab_size = 256,
                                   .padded_vocab_size = gpt2_padded_vocab(256),
                                   .n_layer = 2,
                                   .n_head = 2,
                                   .n_embd = 64};
        return 0;
    }
    ret = traincfg_init(&cfg);
    if (ret == 0)
        ret = traincfg_load(&cfg, o->cfg_path, &err);
    if (ret < 0) {
        fprintf(stderr, PROG ": %s\n", ret == -ENOMEM ? "out of memory" : err.text);
        traincfg_release(&cfg);
        return ret;
    }
    *mc = (struct gpt2_config){.max_seq_len = o->seq,
                               .vocab_size = cfg.vocab_size,
                               .padded_vocab_size = gpt2_padded_vocab(cfg.vocab_size),
                               .n_layer = cfg.n_layer,
                               .n_head = cfg.n_head,
                               .n_embd = cfg.n_embd};
    traincfg_release(&cfg);
    if (!gpt2_config_valid(mc, &why)) {
        fprintf(stderr, PROG ": '%s': %s\n", o->cfg_path, why.text);
        return -EINVAL;
    }
    return 0;
}

/* One step as gpurun-train runs it on a rank of its own. */
static int step(struct gpt2_gpu *m, const int *inp, const int *tgt, int B, int T, uint64_t t,
                size_t n_params, float *loss)
{
    double sumsq;
    int ret = gpt2_gpu_zero_grad(m);

    if (ret == 0)
        ret = gpt2_gpu_forward_backward(m, inp, tgt, B, T, 1.0f, loss);
    if (ret == 0)
        ret = gpt2_gpu_grad_sumsq(m, 0, n_params, &sumsq);
    if (ret == 0)
        ret = gpt2_gpu_update(m, t, BENCH_LR, optim_clip_scale(sqrt(sumsq), BENCH_CLIP));
    return ret;
}

/* One row of the table: batch B, or a row saying why it could not run (out of device memory
 * is a result, not a failure). Returns 0 or a negative errno for a failure. */
static int bench_batch(struct gpu_ctx *ctx, const struct opts *o, const struct gpt2_config *mc,
                       const float *params, size_t n_params, int B)
{
    struct gpt2_gpu_opts go = {
        .dt = o->dt,
        .batch_cap = B,
        .seq_cap = o->seq,
        .adamw = {.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f},
        .graphs = o->graphs,
    };
    size_t bt = (size_t)B * (size_t)o->seq;
    int *tok = malloc((bt + 1) * sizeof(int));
    struct gpt2_gpu *m = NULL;
    uint64_t rng = 42, t = 0;
    double t0, dt, flops;
    float loss = NAN;
    struct errmsg err;
    int ret = -ENOMEM;

    if (!tok) {
        fprintf(stderr, PROG ": out of memory for %zu tokens\n", bt);
        goto out;
    }
    m = gpt2_gpu_new(ctx, mc, &go, &err);
    if (!m) {
        if (strstr(err.text, "out of device memory")) {
            printf("| %d | %d | out of device memory | | | | |\n", B, o->seq);
            ret = 0;
        } else {
            fprintf(stderr, PROG ": batch %d: %s\n", B, err.text);
            ret = -EINVAL;
        }
        goto out;
    }
    /* Random tokens: the speed of a step does not depend on which. */
    for (size_t i = 0; i <= bt; i++)
        tok[i] = (int)(gpt2_rng_next(&rng) % (uint64_t)mc->vocab_size);
    ret = gpt2_gpu_set_params(m, params);
    for (int i = 0; ret == 0 && i < o->warmup; i++)
        ret = step(m, tok, tok + 1, B, o->seq, ++t, n_params, &loss);
    if (ret == 0)
        ret = gpu_ctx_sync(ctx);
    t0 = monotime_s();
    for (int i = 0; ret == 0 && i < o->steps; i++)
        ret = step(m, tok, tok + 1, B, o->seq, ++t, n_params, &loss);
    if (ret == 0)
        ret = gpu_ctx_sync(ctx);
    if (ret < 0) {
        fprintf(stderr, PROG ": batch %d: %s\n", B, err.text);
        goto out;
    }
    dt = (monotime_s() - t0) / o->steps;
    flops = gpt2_flops_per_sequence(mc, o->seq) * B;
    printf("| %d | %d | %.1f | %.0f | %.1f | **%.1f%%** | %.3f |\n", B, o->seq, 1e3 * dt,
           (double)bt / dt, flops / dt / 1e12, 100.0 * flops / dt / PEAK_FLOPS, (double)loss);
    ret = 0;
out:
    gpt2_gpu_free(m);
    free(tok);
    return ret;
}

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* The median of n runs (at most 64) of forward (and backward, with bwd) in ms; -1 with the
 * context's error on a failure. */
static float attention_time(struct gpu_ctx *ctx, int n, bool bwd, void *out, float *lse, void *qkv,
                            void *dout, void *dqkv, int B, int T, int C, int NH)
{
    cudaStream_t s = (cudaStream_t)gpu_ctx_stream(ctx);
    cudaEvent_t e0, e1;
    float ms[64];

    if (cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess)
        return -1;
    for (int i = 0; i < n; i++) {
        cudaEventRecord(e0, s);
        if (gpu_attention_forward(ctx, GPU_BF16, out, lse, qkv, B, T, C, NH) < 0 ||
            (bwd &&
             gpu_attention_backward(ctx, GPU_BF16, dqkv, dout, qkv, out, lse, B, T, C, NH) < 0))
            return -1;
        cudaEventRecord(e1, s);
        if (cudaEventSynchronize(e1) != cudaSuccess ||
            cudaEventElapsedTime(&ms[i], e0, e1) != cudaSuccess)
            return -1;
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    qsort(ms, (size_t)n, sizeof(float), cmp_float);
    return ms[n / 2];
}

/* --attention-only's table. */
static int attention_table(struct gpu_ctx *ctx, const struct opts *o, const struct gpt2_config *mc)
{
    static const struct {
        enum gpu_attention a;
        const char *name;
    } kinds[] = {{GPU_ATT_OWN, "own (attention_tc.cu)"},
                 {GPU_ATT_CUDNN, "cuDNN, deterministic"},
                 {GPU_ATT_CUDNN_FAST, "cuDNN, atomics in dq"}};
    int C = mc->n_embd, NH = mc->n_head, T = o->seq, hs = C / NH;
    int n = o->steps > 64 ? 64 : o->steps;

    printf("| attention | batch | seq | heads | hs | fwd ms | fwd TFLOP/s | fwd+bwd ms | fwd+bwd "
           "TFLOP/s |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int bi = 0; bi < o->n_batches; bi++) {
        int B = o->batches[bi];
        size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C;
        void *qkv = NULL, *out = NULL, *dout = NULL, *dqkv = NULL;
        float *lse = NULL, *h = malloc(nqkv * sizeof(float));
        uint64_t st = 0x9e3779b97f4a7c15ull;
        if (!h || gpu_alloc(ctx, &qkv, nqkv * 2) < 0 || gpu_alloc(ctx, &dqkv, nqkv * 2) < 0 ||
            gpu_alloc(ctx, &out, nout * 2) < 0 || gpu_alloc(ctx, &dout, nout * 2) < 0 ||
            gpu_alloc(ctx, (void **)&lse, (size_t)B * NH * T * sizeof(float)) < 0) {
            fprintf(stderr, PROG ": out of memory for the attention at batch %d\n", B);
            return -1;
        }
        /* Random inputs, not zeros (which can run faster than real data). */
        for (size_t i = 0; i < nqkv; i++) {
            st ^= st << 13, st ^= st >> 7, st ^= st << 17;
            h[i] = (float)((double)(st >> 11) / 9007199254740992.0 * 2.0 - 1.0);
        }
        void *f32 = NULL;
        if (gpu_alloc(ctx, &f32, nqkv * sizeof(float)) < 0 ||
            gpu_upload(ctx, f32, h, nqkv * sizeof(float)) < 0 ||
            gpu_convert(ctx, GPU_BF16, qkv, GPU_F32, f32, nqkv) < 0 ||
            gpu_convert(ctx, GPU_BF16, dout, GPU_F32, (float *)f32 + nout, nout) < 0) {
            fprintf(stderr, PROG ": random inputs: %s\n", gpu_ctx_error(ctx));
            return -1;
        }
        gpu_free(ctx, f32);
        double fwd_flop = 2.0 * B * NH * (double)T * T * hs;
        for (size_t k = 0; k < sizeof(kinds) / sizeof(kinds[0]); k++) {
            gpu_ctx_set_attention(ctx, kinds[k].a);
            float f = -1, fb = -1;
            if (attention_time(ctx, o->warmup, true, out, lse, qkv, dout, dqkv, B, T, C, NH) >= 0)
                f = attention_time(ctx, n, false, out, lse, qkv, dout, dqkv, B, T, C, NH);
            if (f >= 0)
                fb = attention_time(ctx, n, true, out, lse, qkv, dout, dqkv, B, T, C, NH);
            if (fb < 0) {
                printf("| %s | %d | %d | %d | %d | unavailable: %s |||||\n", kinds[k].name, B, T,
                       NH, hs, gpu_ctx_error(ctx));
                continue;
            }
            printf("| %s | %d | %d | %d | %d | %.3f | %.0f | %.3f | %.0f |\n", kinds[k].name, B, T,
                   NH, hs, f, fwd_flop / f / 1e9, fb, 3.5 * fwd_flop / fb / 1e9);
        }
        gpu_free(ctx, qkv);
        gpu_free(ctx, dqkv);
        gpu_free(ctx, out);
        gpu_free(ctx, dout);
        gpu_free(ctx, lse);
        free(h);
    }
    gpu_ctx_set_attention(ctx, o->attention);
    return 0;
}

int main(int argc, char **argv)
{
    struct opts o = {.cfg_path = "jobs/gpt2-124m.cfg",
                     .batches = {16, 32, 64},
                     .n_batches = 3,
                     .seq = 1024,
                     .warmup = 3,
                     .steps = 10,
                     .dt = GPU_BF16,
                     .graphs = true};
    struct gpt2_config mc;
    struct gpt2 init = {0};
    struct gpu_ctx *ctx = NULL;
    struct cudaDeviceProp prop;
    struct errmsg err;
    int ret = 1;

    setvbuf(stdout, NULL, _IOLBF, 0);
    if (parse_args(&o, argc, argv) < 0)
        return usage();
    if (o.smoke) {
        o.seq = 32;
        o.batches[0] = 2;
        o.n_batches = 1;
        o.warmup = 1;
        o.steps = 2;
    }
    if (gpu_require_device(&err) < 0) {
        printf("SKIP " PROG ": %s\n", err.text);
        return 0;
    }
    if (model_config(&o, &mc) < 0)
        return 1;
    ctx = gpu_ctx_new(0, &err);
    if (!ctx) {
        fprintf(stderr, PROG ": %s\n", err.text);
        return 1;
    }
    gpu_ctx_set_attention(ctx, o.attention);
    /* GPT-2's initialisation, as gpurun-train starts a run. */
    if (gpt2_init(&init, &mc, 1, 1) < 0) {
        fprintf(stderr, PROG ": out of memory for the parameters\n");
        goto out;
    }
    gpt2_init_random(&init, 1337);
    if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess)
        snprintf(prop.name, sizeof(prop.name), "CUDA device 0");
    printf("GPT-2 training step on %s: %d layers, %d heads, %d channels, vocabulary %d "
           "(padded %d), %.1fM parameters, %s; %d warm-up then %d timed steps per row; CUDA "
           "graphs %s\n",
           prop.name, mc.n_layer, mc.n_head, mc.n_embd, mc.vocab_size, mc.padded_vocab_size,
           (double)init.n_params / 1e6, o.dt == GPU_BF16 ? "bf16 (fp32 master weights)" : "fp32",
           o.warmup, o.steps, o.graphs ? "on" : "off");
    if (o.dt == GPU_BF16) {
        char att[320];
        gpu_ctx_attention_describe(ctx, att, sizeof(att));
        printf("attention: %s\n", att);
    }
    printf("FLOPs per sequence = 6 x (12 L C^2 + Vp C) x T + 6 L C T (T + 1) = %.1f GFLOP "
           "(matmul weights, 2 forward + 4 backward per weight and token, plus causal "
           "attention); MFU = FLOPs per sequence x B / step time / %.0f TFLOP/s (H100 SXM bf16 "
           "dense peak)\n\n",
           gpt2_flops_per_sequence(&mc, o.seq) / 1e9, PEAK_FLOPS / 1e12);
    if (o.attention_only) {
        ret = o.dt == GPU_BF16 && attention_table(ctx, &o, &mc) == 0 ? 0 : 1;
        goto out;
    }
    printf("| batch | seq | ms/step | tokens/s | TFLOP/s | MFU | loss |\n");
    printf("|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int i = 0; i < o.n_batches; i++)
        if (bench_batch(ctx, &o, &mc, init.params, init.n_params, o.batches[i]) < 0)
            goto out;
    ret = 0;
out:
    gpt2_release(&init);
    gpu_ctx_free(ctx);
    return ret;
}
