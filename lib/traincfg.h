/* train.cfg: the INI file that describes a training job ([job] for the launcher, [model],
 * [data], [optim] and [train] for gpurun-train), parsed with libinih. Every key is a row of
 * one table (section, name, type, offset, default, range, help); `section.key=value`
 * overrides from a command line go through the same rows. Shared by gpurun and
 * gpurun-train. */
#ifndef GPURUN_TRAINCFG_H
#define GPURUN_TRAINCFG_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#include "errmsg.h"

/* Upper bound of the key table's length (checked at compile time in traincfg.c). */
#define TRAINCFG_MAX_KEYS 64

/* The value of a TRAINCFG_AUTOBOOL key (below) set to "auto"; false and true are 0 and 1. */
#define TRAINCFG_AUTO 2

enum traincfg_device { TRAINCFG_DEVICE_CPU = 0, TRAINCFG_DEVICE_CUDA = 1 };
/* Storage of the cuda backend's parameters, gradients and activations (fp32 master weights and
 * AdamW moments either way); the cpu backend is fp32 only. */
enum traincfg_dtype { TRAINCFG_DTYPE_BF16 = 0, TRAINCFG_DTYPE_FP32 = 1 };
/* The cuda backend's bf16 attention: cuDNN's fused flash attention where cuDNN 9 loads (else
 * the backend's own kernels), cuDNN's or a failure, or the own kernels. */
enum traincfg_attention {
    TRAINCFG_ATTENTION_AUTO = 0,
    TRAINCFG_ATTENTION_CUDNN = 1,
    TRAINCFG_ATTENTION_OWN = 2
};
/* [train] resume: what a run does with the checkpoints already in its out_dir. None of them
 * deletes a checkpoint. */
enum traincfg_resume {
    TRAINCFG_RESUME_OFF = 0,             /* start at step 0; refuse when out_dir holds any */
    TRAINCFG_RESUME_ON = 1,              /* continue from the newest valid one; none: refuse */
    TRAINCFG_RESUME_AUTO = TRAINCFG_AUTO /* continue when there is one, else start at step 0;
                                          * refuse those of another run (model or data) */
};

/* Where a key's value came from, in origin[] below. */
#define TRAINCFG_FROM_DEFAULT 0  /* the table's default */
#define TRAINCFG_FROM_CMDLINE -1 /* an override; > 0: the line of the file */

/* The effective configuration. Strings are new (owned by the struct, freed by
 * traincfg_release); NULL where the key is unset and has no default. Paths from the file
 * ([model] init_from, [data] train and val, [train] out_dir) are made relative to the file's
 * directory when they are not absolute; paths from overrides and defaults stay as they are
 * (relative to the working directory). */
struct traincfg {
    /* [job]: what gpurun asks Slurm for (its flags override these) */
    int nodes;         /* nodes of the job */
    int gpus_per_node; /* ranks per node (one per GPU; CPU ranks under --local) */
    int time_min;      /* time limit in minutes (sbatch --time forms); 0: the partition's */
    char *partition;   /* NULL: the cluster's default */
    char *account;     /* NULL: the user's default */
    char *job_name;    /* NULL: the file's base name without .cfg */
    char *output;      /* sbatch --output pattern; NULL: gpurun's default */
    int max_restarts;  /* generations restarted after a failure */

    /* [model]: GPT-2 shape */
    int n_layer;
    int n_head;
    int n_embd;
    int seq_len;     /* T: context length (rows of the position embedding) */
    int vocab_size;  /* V: tokens of the data (256 for the byte-level tokenizer) */
    char *init_from; /* llm.c GPT-2 checkpoint to start from; NULL: random init */

    /* [data]: token shards (llm.c .bin), a path, a glob or a comma-separated list of them */
    char *train;
    char *val; /* NULL: no validation */

    /* [optim]: AdamW, warmup + cosine learning rate, global-norm clipping */
    double lr;        /* peak learning rate */
    double min_lr;    /* learning rate at the last step */
    int warmup_steps; /* linear warmup from lr/warmup_steps to lr */
    double weight_decay;
    double beta1;
    double beta2;
    double eps;
    double grad_clip; /* max global grad norm; 0: no clipping */

    /* [train] */
    int batch_size;     /* B: sequences per rank per micro-step */
    int grad_accum;     /* micro-steps per step */
    int steps;          /* optimizer steps of the whole run */
    int eval_every;     /* steps between validations; 0: only at the end */
    int eval_batches;   /* validation batches (each W*B sequences) */
    int ckpt_every;     /* steps between checkpoints; 0: only at the end and on signals */
    int mem_ckpt_every; /* steps between memory checkpoints (under gpurun); 0: none */
    bool regroup;       /* regroup in process where a node is lost (under gpurun) */
    char *out_dir;      /* checkpoints and metrics.jsonl */
    int resume;         /* enum traincfg_resume */
    int seed;           /* initialisation and sampling RNG */
    int device;         /* enum traincfg_device */
    int dtype;          /* enum traincfg_dtype: cuda only; a cpu run's reads fp32 (below) */
    int zero;           /* 1: ZeRO-1, the optimizer state sharded over the ranks (cuda only) */
    int attention;      /* enum traincfg_attention: cuda bf16 only */
    bool cuda_graphs;   /* cuda: each micro-step's kernels launched as one CUDA graph */
    int threads;        /* OpenMP threads per rank; 0: OMP_NUM_THREADS or the runtime's */
    int sample_every;   /* steps between text samples; 0: only at the end */
    int sample_tokens;  /* tokens of a sample; 0: no sample */
    int log_every;      /* steps between printed lines (metrics.jsonl gets every step) */
    /* seconds a collective waits for a peer that sends nothing (nccl: an operation may take)
     * before the run fails with the peer named, as torch's init_process_group(timeout=) */
    int coll_timeout_s;

    /* Bookkeeping */
    char *path;                    /* the file read; NULL when none */
    int origin[TRAINCFG_MAX_KEYS]; /* per key-table row: TRAINCFG_FROM_* or a line number */
};

/* Types of the key table's rows. */
enum traincfg_type {
    TRAINCFG_INT,
    TRAINCFG_FLOAT,
    TRAINCFG_STRING,
    TRAINCFG_PATH,     /* a string resolved against the file's directory */
    TRAINCFG_PATHLIST, /* comma-separated paths, each resolved so */
    TRAINCFG_BOOL,
    TRAINCFG_AUTOBOOL, /* a boolean or "auto", stored as int 0, 1 or TRAINCFG_AUTO */
    TRAINCFG_ENUM,
    TRAINCFG_TIME, /* sbatch time forms, stored as int minutes */
};

/* One row of the key table, for help texts and tools: borrowed static storage. */
struct traincfg_key {
    const char *section;
    const char *name;
    enum traincfg_type type;
    size_t offset;              /* into struct traincfg */
    const char *def;            /* default as written in a file; NULL: unset */
    double min, max;            /* INT, FLOAT: the accepted range (inclusive) */
    const char *const *choices; /* ENUM: NULL-terminated names, index = stored value */
    const char *help;           /* one line */
};

/* Fills cfg with every key's default; cfg owns nothing else. Returns 0 or -ENOMEM. */
int traincfg_init(struct traincfg *cfg);

/* Frees what cfg owns; cfg may be initialised again. */
void traincfg_release(struct traincfg *cfg);

/* Reads path (borrowed) into cfg (initialised, normally fresh). Unknown sections and keys,
 * a key given twice, syntax errors, malformed numbers and values out of range are errors
 * that name the file and line. Does not run the cross-key checks (traincfg_check).
 * Returns 0, or a negative errno with err filled (-EINVAL for the file's faults). */
int traincfg_load(struct traincfg *cfg, const char *path, struct errmsg *err);

/* Applies one command-line override "section.key=value" (borrowed) to cfg; a later override
 * of the same key wins. Returns 0, or -EINVAL with err filled ("command line:
 * 'train.stepz=3': unknown key 'train.stepz'"). */
int traincfg_override(struct traincfg *cfg, const char *arg, struct errmsg *err);

/* True when arg looks like an override (an '=' after a "section.key" without '/'), so that
 * a command line can tell overrides from file names. */
bool traincfg_is_override(const char *arg);

/* The checks between keys, each error naming the line of the key at fault (the one set
 * last when both are set): n_head divides n_embd, min_lr <= lr, beta1 and beta2 below 1,
 * eps above 0, batch_size x seq_len within int, [data] train given, and the cuda-only keys
 * (dtype bf16 set explicitly, zero 1) refused with device cpu. Returns 0 or -EINVAL with err
 * filled ("jobs/tiny.cfg:7: n_head (5) must divide n_embd (64)"). */
int traincfg_check(const struct traincfg *cfg, struct errmsg *err);

/* The usual sequence: init, load path (NULL: no file), apply n overrides, check; then the
 * effective values: a cpu run's dtype becomes fp32 (the default bf16 is the cuda backend's).
 * On failure cfg is released. Returns 0 or a negative errno with err filled. */
int traincfg_read(struct traincfg *cfg, const char *path, const char *const *overrides, size_t n,
                  struct errmsg *err);

/* Parses an sbatch --time value: "MINUTES", "MINUTES:SECONDS", "HOURS:MINUTES:SECONDS",
 * "DAYS-HOURS", "DAYS-HOURS:MINUTES" or "DAYS-HOURS:MINUTES:SECONDS", rounding seconds up to
 * the next minute as Slurm does. Returns 0 with *minutes set, or -EINVAL (-ERANGE above
 * INT_MAX minutes). */
int traincfg_parse_time(const char *s, int *minutes);

/* The effective configuration as a new JSON object {"job": {...}, "model": {...}, ...},
 * every key with its value (null for unset strings), for logs, metrics and checkpoints.
 * Floats are doubles: dump with JSON_REAL_PRECISION(10) or so for 6e-4 rather than
 * 0.00059999999999999995.
 * Returns NULL when memory runs out (caller json_decref()s). */
json_t *traincfg_to_json(const struct traincfg *cfg);

/* The key table: *n rows of borrowed static storage. */
const struct traincfg_key *traincfg_keys(size_t *n);

#endif
