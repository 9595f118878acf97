/* build/bench/train_step: the CPU backend's training step (forward, backward, grad norm,
 * AdamW) for the tiny model of jobs/tiny.cfg and a 6-layer/384-wide one at seq 256, with 1
 * and 2 OpenMP threads, next to the machine's matmul throughput measured on that model's
 * shapes (and a plain reference loop's). Prints markdown tables and a verdict against the
 * target: a step within 1.5x of FLOPs / matmul throughput.
 *
 * usage: train_step [--cfg jobs/tiny.cfg] [--threads 1,2] [--reps N] [--rounds N] [--quick]
 * The tiny model's shape and per-rank batch come from --cfg ([model] and [train] batch_size);
 * without the file, jobs/tiny.cfg's values as of this writing. */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <omp.h>

#include "gpt2.h"
#include "monotime.h"
#include "ops.h"
#include "optim.h"
#include "traincfg.h"
#include "banned.h"

/* The target: a step within this factor of its FLOPs at the matmul throughput. */
#define TARGET_RATIO 1.5
#define MAX_THREADS  8

struct model_case {
    const char *name;
    struct gpt2_config cfg;
    int B, T;
    int reps; /* timed steps (the best is reported), after one warm-up step */
};

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The best of n times: this machine may be shared with other work, which only ever adds
 * time; the bound and the step are both taken this way, so that their ratio is fair. */
static double best(double *x, int n)
{
    qsort(x, (size_t)n, sizeof(double), cmp_double);
    return x[0];
}

static void die(const char *what, int err)
{
    fprintf(stderr, "train_step: %s: %s\n", what, strerror(-err));
    exit(1);
}

static float *random_buffer(size_t n, uint64_t *rng)
{
    float *x = malloc(n * sizeof(float));
    if (!x)
        die("cannot allocate a benchmark buffer", -ENOMEM);
    for (size_t i = 0; i < n; i++)
        x[i] = gpt2_rng_uniform(rng) - 0.5f;
    return x;
}

/* ---- matmul throughput -------------------------------------------------------------------- */

/* The four matmuls of a block and the LM head, for N rows: C -> OC. */
struct mm_shape {
    const char *name;
    int C, OC, per_step; /* per_step: how many of it a step runs (n_layer, or 1) */
};

static void model_shapes(const struct gpt2_config *cfg, struct mm_shape s[5])
{
    int C = cfg->n_embd, L = cfg->n_layer;

    s[0] = (struct mm_shape){"qkv", C, 3 * C, L};
    s[1] = (struct mm_shape){"attproj", C, C, L};
    s[2] = (struct mm_shape){"fc", C, 4 * C, L};
    s[3] = (struct mm_shape){"fcproj", 4 * C, C, L};
    s[4] = (struct mm_shape){"lm head", C, cfg->padded_vocab_size, 1};
}

/* Seconds for a forward and for a backward of one shape (best of reps). */
static void time_matmul(int N, int C, int OC, int reps, double *fwd, double *bwd)
{
    uint64_t rng = 1;
    float *inp = random_buffer((size_t)N * C, &rng), *w = random_buffer((size_t)OC * C, &rng);
    float *b = random_buffer((size_t)OC, &rng), *out = random_buffer((size_t)N * OC, &rng);
    float *dinp = random_buffer((size_t)N * C, &rng), *dw = random_buffer((size_t)OC * C, &rng);
    float *db = random_buffer((size_t)OC, &rng);
    double tf[64], tb[64];
    int err;

    if (reps > 64)
        reps = 64;
    for (int r = -1; r < reps; r++) {
        double t0 = monotime_s();
        if ((err = ops_matmul_forward(out, inp, w, b, N, C, OC)) < 0)
            die("matmul forward", err);
        double t1 = monotime_s();
        if ((err = ops_matmul_backward(dinp, dw, db, out, inp, w, N, C, OC)) < 0)
            die("matmul backward", err);
        double t2 = monotime_s();
        if (r >= 0)
            tf[r] = t1 - t0, tb[r] = t2 - t1;
    }
    *fwd = best(tf, reps);
    *bwd = best(tb, reps);
    free(inp), free(w), free(b), free(out), free(dinp), free(dw), free(db);
}

/* A plain reference loop (one thread): out[n,o] = b[o] + sum_c inp[n,c] w[o,c], the textbook
 * triple loop, for scale. Returns GFLOP/s. */
static double reference_gflops(int N, int C, int OC)
{
    uint64_t rng = 2;
    float *inp = random_buffer((size_t)N * C, &rng), *w = random_buffer((size_t)OC * C, &rng);
    float *b = random_buffer((size_t)OC, &rng), *out = random_buffer((size_t)N * OC, &rng);
    double t0 = monotime_s();

    for (int n = 0; n < N; n++) {
        for (int o = 0; o < OC; o++) {
            float s = b[o];
            for (int c = 0; c < C; c++)
                s += inp[(size_t)n * C + c] * w[(size_t)o * C + c];
            out[(size_t)n * OC + o] = s;
        }
    }
    double t = monotime_s() - t0;
    /* Keep the result observable. */
    volatile float sink = out[(size_t)(N - 1) * OC + OC - 1];
    (void)sink;
    free(inp), free(w), free(b), free(out);
    return 2.0 * N * C * OC / t / 1e9;
}

/* Best seconds so far of each of a model's matmul shapes, forward and backward. */
struct mm_times {
    double fwd[5], bwd[5];
};

/* Times a model's matmuls at N = B x T rows (reps each), keeping the best in *mt. */
static void time_model_matmuls(const struct model_case *mc, int reps, struct mm_times *mt)
{
    struct mm_shape s[5];
    int N = mc->B * mc->T;

    model_shapes(&mc->cfg, s);
    for (int i = 0; i < 5; i++) {
        double fwd, bwd;
        time_matmul(N, s[i].C, s[i].OC, reps, &fwd, &bwd);
        mt->fwd[i] = fwd < mt->fwd[i] ? fwd : mt->fwd[i];
        mt->bwd[i] = bwd < mt->bwd[i] ? bwd : mt->bwd[i];
    }
}

/* The matmul throughput of a model's step: its matmuls (forward and backward, each shape as
 * often as a step runs it) at their best times, in GFLOP/s; with a table row per shape when
 * print. */
static double matmul_bound(const struct model_case *mc, int threads, const struct mm_times *mt,
                           int print)
{
    struct mm_shape s[5];
    int N = mc->B * mc->T;
    double flops = 0.0, secs = 0.0;

    model_shapes(&mc->cfg, s);
    for (int i = 0; i < 5; i++) {
        double f = 2.0 * N * s[i].C * s[i].OC;
        flops += 3.0 * f * s[i].per_step;
        secs += (mt->fwd[i] + mt->bwd[i]) * s[i].per_step;
        if (print)
            printf("| %s | %d | %s %d x %d -> %d | %.1f | %.1f |\n", mc->name, threads, s[i].name,
                   N, s[i].C, s[i].OC, f / mt->fwd[i] / 1e9, 2.0 * f / mt->bwd[i] / 1e9);
    }
    return flops / secs / 1e9;
}

/* ---- the step ----------------------------------------------------------------------------- */

struct step_times {
    double fwd, bwd, update, step; /* seconds, best of the reps */
    float loss;
};

static void time_steps(const struct model_case *mc, struct step_times *st)
{
    struct gpt2 m;
    struct adamw opt;
    struct optim_span spans[GPT2_NUM_TENSORS];
    struct adamw_config hp = {.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
    int n = mc->B * mc->T, err;
    int *tokens = malloc((size_t)(n + 1) * sizeof(int));
    double tf[64], tb[64], tu[64], ts[64];
    uint64_t rng = 3;
    int reps = mc->reps < 64 ? mc->reps : 64;

    if (!tokens)
        die("cannot allocate tokens", -ENOMEM);
    for (int i = 0; i <= n; i++)
        tokens[i] = (int)(gpt2_rng_next(&rng) % (uint64_t)mc->cfg.vocab_size);
    if ((err = gpt2_init(&m, &mc->cfg, mc->B, mc->T)) < 0)
        die("cannot set up the model", err);
    gpt2_init_random(&m, 1337);
    if ((err = adamw_init(&opt, m.n_params, &hp, spans, gpt2_optim_spans(&m, spans))) < 0)
        die("cannot set up AdamW", err);

    for (int r = -1; r < reps; r++) {
        double t0 = monotime_s();
        if ((err = gpt2_forward(&m, tokens, tokens + 1, mc->B, mc->T, &st->loss)) < 0)
            die("forward", err);
        double t1 = monotime_s();
        gpt2_zero_grad(&m);
        if ((err = gpt2_backward(&m, 1.0f)) < 0)
            die("backward", err);
        double t2 = monotime_s();
        double norm = optim_grad_norm(m.grads, m.n_params);
        adamw_update(&opt, m.params, m.grads, 1e-4f, optim_clip_scale(norm, 1.0f));
        double t3 = monotime_s();
        if (r >= 0)
            tf[r] = t1 - t0, tb[r] = t2 - t1, tu[r] = t3 - t2, ts[r] = t3 - t0;
    }
    /* Keep the best of this and earlier rounds. */
    st->fwd = fmin(st->fwd, best(tf, reps));
    st->bwd = fmin(st->bwd, best(tb, reps));
    st->update = fmin(st->update, best(tu, reps));
    st->step = fmin(st->step, best(ts, reps));
    adamw_release(&opt);
    gpt2_release(&m);
    free(tokens);
}

static int parse_threads(const char *s, int *out)
{
    int n = 0;
    char *end;

    while (*s && n < MAX_THREADS) {
        long v = strtol(s, &end, 10);
        if (end == s || v < 1 || v > 1024)
            return -1;
        out[n++] = (int)v;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',')
            return -1;
    }
    return n;
}

int main(int argc, char **argv)
{
    struct model_case cases[2] = {
        /* jobs/tiny.cfg: one rank's step (batch_size 4 per rank). */
        {"tiny (4L/128, T 128, B 4)",
         {.max_seq_len = 128,
          .vocab_size = 256,
          .padded_vocab_size = 256,
          .n_layer = 4,
          .n_head = 4,
          .n_embd = 128},
         4,
         128,
         20},
        {"6L/384 (T 256, B 4)",
         {.max_seq_len = 256,
          .vocab_size = 256,
          .padded_vocab_size = 256,
          .n_layer = 6,
          .n_head = 6,
          .n_embd = 384},
         4,
         256,
         10},
    };
    int threads[MAX_THREADS] = {1, 2}, n_threads = 2, mm_reps = 5, reps_override = 0;
    int rounds = 3;
    struct mm_times mt[2][MAX_THREADS];
    double bound[2][MAX_THREADS];
    struct step_times st[2][MAX_THREADS];

    const char *cfg_path = "jobs/tiny.cfg";
    bool cfg_given = false;

    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--cfg") && i + 1 < argc) {
            cfg_path = argv[++i];
            cfg_given = true;
        } else if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
            if ((n_threads = parse_threads(argv[++i], threads)) <= 0) {
                fprintf(stderr, "train_step: bad --threads '%s'\n", argv[i]);
                return 2;
            }
        } else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
            reps_override = (int)strtol(argv[++i], NULL, 10);
            if (reps_override < 1 || reps_override > 64) {
                fprintf(stderr, "train_step: bad --reps '%s' (1..64)\n", argv[i]);
                return 2;
            }
        } else if (!strcmp(argv[i], "--rounds") && i + 1 < argc) {
            rounds = (int)strtol(argv[++i], NULL, 10);
            if (rounds < 1 || rounds > 100) {
                fprintf(stderr, "train_step: bad --rounds '%s' (1..100)\n", argv[i]);
                return 2;
            }
        } else if (!strcmp(argv[i], "--quick")) {
            reps_override = 2;
            mm_reps = 2;
            rounds = 1;
        } else {
            fprintf(stderr,
                    "usage: train_step [--cfg FILE] [--threads 1,2] [--reps N] [--rounds N] "
                    "[--quick]\n");
            return 2;
        }
    }
    if (cfg_given || access(cfg_path, R_OK) == 0) {
        struct traincfg tc;
        struct errmsg terr;
        static char name[160];

        if (traincfg_init(&tc) < 0 || traincfg_load(&tc, cfg_path, &terr) < 0) {
            fprintf(stderr, "train_step: %s\n", terr.text);
            return 2;
        }
        cases[0].cfg = (struct gpt2_config){
            .max_seq_len = tc.seq_len,
            .vocab_size = tc.vocab_size,
            .padded_vocab_size = gpt2_padded_vocab(tc.vocab_size),
            .n_layer = tc.n_layer,
            .n_head = tc.n_head,
            .n_embd = tc.n_embd,
        };
        cases[0].B = tc.batch_size;
        cases[0].T = tc.seq_len;
        snprintf(name, sizeof(name), "%s (%dL/%d, T %d, B %d)", cfg_path, tc.n_layer, tc.n_embd,
                 tc.seq_len, tc.batch_size);
        cases[0].name = name;
        traincfg_release(&tc);
    }
    if (reps_override)
        cases[0].reps = cases[1].reps = reps_override;

    printf("Matmul kernel: %s. FLOPs per step: 6 x (matmul parameters: 12 L C^2 + Vp C) x B T "
           "(2 per multiply-add forward, 4 backward) + 6 L C T (T+1) x B (the causal attention "
           "products QK^T and att V, T (T+1) / 2 dot products of C each, the same 3x); "
           "embeddings, LayerNorm, GELU, softmax and AdamW are not counted.\n\n",
           ops_matmul_kernel());

    /* Rounds over every case, the best of each measure kept: a burst of other work on the
     * machine then spoils one round, not a row. */
    for (int c = 0; c < 2; c++) {
        for (int t = 0; t < n_threads; t++) {
            for (int i = 0; i < 5; i++)
                mt[c][t].fwd[i] = mt[c][t].bwd[i] = INFINITY;
            st[c][t] = (struct step_times){INFINITY, INFINITY, INFINITY, INFINITY, 0.0f};
        }
    }
    for (int r = 0; r < rounds; r++) {
        for (int c = 0; c < 2; c++) {
            for (int t = 0; t < n_threads; t++) {
                omp_set_num_threads(threads[t]);
                time_model_matmuls(&cases[c], mm_reps, &mt[c][t]);
                time_steps(&cases[c], &st[c][t]);
            }
        }
    }

    printf("Matmul throughput on each model's shapes (N = B x T rows; GFLOP/s, best of %d x %d; "
           "backward = dinp and dweight):\n\n",
           rounds, mm_reps);
    printf("| model | threads | matmul | forward | backward |\n|---|---:|---|---:|---:|\n");
    for (int c = 0; c < 2; c++) {
        for (int t = 0; t < n_threads; t++)
            bound[c][t] = matmul_bound(&cases[c], threads[t], &mt[c][t], 1);
    }
    printf("| plain triple loop (reference), 1 thread | 1 | fc %d x %d -> %d | %.1f | |\n\n", 1024,
           384, 1536, reference_gflops(1024, 384, 1536));

    printf("Training step (forward, backward, grad norm, AdamW; best of %d rounds of %d and %d "
           "steps). Bound = the model's matmuls, forward and backward as a step runs them, timed "
           "alone; ideal = FLOPs / bound. Target: step <= %.1f x ideal.\n\n",
           rounds, cases[0].reps, cases[1].reps, TARGET_RATIO);
    printf("| model | threads | params | GFLOP/step | forward ms | backward ms | update ms | "
           "step ms | tokens/s | GFLOP/s | bound GFLOP/s | step / ideal | target |\n");
    printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n");
    for (int c = 0; c < 2; c++) {
        struct model_case *mc = &cases[c];
        struct gpt2_tensor tensors[GPT2_NUM_TENSORS];
        double params = (double)gpt2_tensors(&mc->cfg, tensors);
        double flops = gpt2_flops_per_sequence(&mc->cfg, mc->T) * mc->B;

        for (int t = 0; t < n_threads; t++) {
            struct step_times *s = &st[c][t];
            double ideal = flops / (bound[c][t] * 1e9), ratio = s->step / ideal;
            int met = ratio <= TARGET_RATIO;
            printf("| %s | %d | %.2fM | %.2f | %.1f | %.1f | %.1f | **%.1f** | %.0f | %.1f | "
                   "%.1f | %.2f | %s |\n",
                   mc->name, threads[t], params / 1e6, flops / 1e9, s->fwd * 1e3, s->bwd * 1e3,
                   s->update * 1e3, s->step * 1e3, mc->B * mc->T / s->step, flops / s->step / 1e9,
                   bound[c][t], ratio, met ? "met" : "**missed**");
            if (!isfinite(s->loss)) {
                fprintf(stderr, "train_step: loss is not finite\n");
                return 1;
            }
        }
    }
    printf("\n");
    return 0;
}
