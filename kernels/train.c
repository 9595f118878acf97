/* gpurun-train: the training loop of the GPT-2 of a train.cfg on a backend of backend.h (cpu,
 * data parallel over the collectives' tcp ring; or cuda, one GPU per rank over NCCL,
 * optionally ZeRO-1), alone (a world of one) or as one rank of a gpurun job, with checkpoints
 * that a resumed run continues from bit for bit and that either backend reads; and
 * `gpurun-train prep`, the byte-level tokenizer that makes token shards from text.
 * docs/design.md, section 7. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "backend.h"
#include "ckpt.h"
#include "coll/coll.h"
#include "data.h"
#include "errmsg.h"
#include "fsutil.h"
#include "gpt2.h"
#include "gr.h"
#include "monotime.h"
#include "optim.h"
#include "traincfg.h"
#include "banned.h"

/* The training backends by train.device (traincfg.h's enum), as coll/coll.c's table holds the
 * collectives: a new backend is a row here and a value of the enum. */
static const struct backend_ops *const backends[] = {
    [TRAINCFG_DEVICE_CPU] = &backend_cpu,
    [TRAINCFG_DEVICE_CUDA] = &backend_cuda,
};

#define PROG "gpurun-train"

/* Checkpoints kept in out_dir: the newest and the one before it, so that a resume still has a
 * checkpoint when the newest cannot be read (a damaged disk; a crash cannot leave a partial
 * one). */
#define CKPT_KEEP          2
/* The metrics file in out_dir: one JSON object per step. */
#define METRICS_NAME       "metrics.jsonl"
/* The largest metrics file a resume rewrites (a million steps of ~130-byte lines). */
#define METRICS_MAX        (256u << 20)
/* Sampling temperature of the text samples: a little below 1 so that a small model's sample
 * reads as words rather than letter soup, without the loops of greedy decoding. */
#define SAMPLE_TEMPERATURE 0.8f
/* The sampling generator starts from the seed mixed with this constant (splitmix64's
 * increment), so that its stream is not the initialisation's, which starts from the seed. */
#define SAMPLE_RNG_SALT    0x9e3779b97f4a7c15ull
/* The default share of the text `prep` keeps for validation. */
#define PREP_VAL_FRACTION  0.05

/* SIGTERM or SIGUSR1 received: finish the step, save a checkpoint, exit 0. */
static volatile sig_atomic_t stop_signal;

static void on_stop(int sig)
{
    stop_signal = sig;
}

/* One training run: what main() sets up and the step loop uses. */
struct run {
    struct traincfg cfg;
    const char *cfg_path;
    struct gr *g; /* NULL when standalone */
    struct coll *coll;
    int rank, world;

    struct data_set *train_ds, *val_ds;
    struct data_loader dl, dl_val;
    int *inputs, *targets; /* B*T each */

    struct gpt2_config mcfg;
    size_t n_params;
    const struct backend_ops *be; /* cfg.device's */
    struct backend *b;            /* the model and its optimizer on it */
    struct lr_schedule sched;
    uint64_t rng;        /* the sampling generator (checkpointed as rng[0]) */
    uint64_t step;       /* the next step to run (0-based); step s is printed as s + 1 */
    uint64_t saved_step; /* the step of the last checkpoint written or loaded; UINT64_MAX: none */
    bool mem_on;         /* memory checkpoints (train.mem_ckpt_every, gr.h), rank 0's word */
    bool mem_said;       /* rank 0 said what its first one cost */
    /* Regrouping in process (gr.h): this rank said it can; the step in flight updated the
     * model already (its last collective, or a later one, failed). */
    bool can_regroup, updated;
    bool regroup_when_saved; /* ZeRO-1: able to regroup once a checkpoint holds every shard */
    struct timespec started; /* CLOCK_REALTIME at the start: older temp files are leftovers */

    FILE *metrics; /* rank 0 */
    char *config_json;
    struct errmsg err; /* the run's failure, printed once, by main */
};

/* Where a key's value came from, for an error: "jobs/tiny.cfg:22", "command line", or the file
 * (a default). */
static const char *cfg_where(const struct run *r, const char *section, const char *name, char *buf,
                             size_t n)
{
    size_t nkeys;
    const struct traincfg_key *keys = traincfg_keys(&nkeys);
    int origin = TRAINCFG_FROM_DEFAULT;

    for (size_t i = 0; i < nkeys; i++)
        if (!strcmp(keys[i].section, section) && !strcmp(keys[i].name, name))
            origin = r->cfg.origin[i];
    if (origin == TRAINCFG_FROM_CMDLINE)
        snprintf(buf, n, "command line");
    else if (origin > 0)
        snprintf(buf, n, "%s:%d", r->cfg_path, origin);
    else
        snprintf(buf, n, "%s", r->cfg_path);
    return buf;
}

/* The shortest decimal text of f that reads back as f (at most 9 significant digits). */
static void fmt_float(char *buf, size_t n, float f)
{
    if (!isfinite(f)) {
        snprintf(buf, n, "null");
        return;
    }
    for (int prec = 1; prec <= 9; prec++) {
        snprintf(buf, n, "%.*g", prec, (double)f);
        if (strtof(buf, NULL) == f)
            return;
    }
}

/* ---- set-up ------------------------------------------------------------------------------- */

/* The rank's place on its node: the job's, else LOCAL_RANK (torchrun's), else 0. */
static int local_rank(const struct run *r)
{
    const char *env = getenv("LOCAL_RANK");

    if (r->g)
        return gr_local_rank(r->g);
    if (env) {
        long v = strtol(env, NULL, 10);
        return v > 0 && v < INT_MAX ? (int)v : 0;
    }
    return 0;
}

/* Joins the job (when started by rendezvousd or a PMIx launcher), opens the backend (cuda: the
 * rank's GPU becomes current, which NCCL's communicator binds to) and then the collectives the
 * backend asks for: the tcp ring on cpu, NCCL on cuda (also for a world of one). */
/* Tells the agent this rank can regroup in process (gr_regroup_enable), once. */
static int say_can_regroup(struct run *r)
{
    int ret;

    if (r->can_regroup)
        return 0;
    r->regroup_when_saved = false;
    ret = gr_regroup_enable(r->g);
    r->can_regroup = ret == 0;
    if (ret < 0 && ret != -ENOSYS)
        return errmsg_set(&r->err, ret, "cannot say this rank can regroup: %s", gr_strerror(r->g));
    return 0;
}

static int setup_world(struct run *r)
{
    const char *backend;
    struct errmsg err;
    int ret;

    r->rank = 0;
    r->world = 1;
    if (getenv("GPURUN_SOCK") || getenv("PMIX_RANK")) {
        ret = gr_init(&r->g);
        if (ret < 0)
            return errmsg_set(&r->err, ret, "cannot join the job: %s", gr_strerror(NULL));
        r->rank = gr_rank(r->g);
        r->world = gr_world_size(r->g);
        /* The trainer checkpoints on the pre-timeout signal: ask for it (a rank that does not
         * ask never gets it). Its handler is installed before setup_world runs. */
        int sig;
        ret = gr_on_preempt(r->g, &sig);
        if (ret < 0)
            return errmsg_set(&r->err, ret, "cannot ask for the pre-timeout signal: %s",
                              gr_strerror(r->g));
        if (sig != SIGUSR1 && sig != SIGTERM) {
            struct sigaction sa = {.sa_handler = on_stop, .sa_flags = SA_RESTART};
            sigemptyset(&sa.sa_mask);
            sigaction(sig, &sa, NULL);
        }
    }
    ret = r->be->open(&r->b, local_rank(r), &err);
    if (ret < 0)
        return errmsg_set(&r->err, ret, "device '%s': %s", r->be->name, err.text);
    backend = r->be->coll ? r->be->coll : r->world > 1 ? "tcp" : "single";
    ret = coll_open(backend, r->g, &r->coll, &err);
    if (ret < 0)
        return errmsg_set(&r->err, ret, "cannot open the collectives: %s", err.text);
    coll_set_timeout(r->coll, r->cfg.coll_timeout_s * 1000);
    /* Where a node of the job is lost and a spare takes its place, this rank goes on in its
     * process with the spare's new ranks (regroup, below) rather than being restarted. Under
     * ZeRO-1 a lost rank's optimizer shard lives only in the checkpoints (rank 0 keeps the
     * whole state): able once there is one. */
    if (r->g && r->world > 1 && r->be->set_coll && r->cfg.regroup) {
        if (r->cfg.zero)
            r->regroup_when_saved = true;
        else
            return say_can_regroup(r);
    }
    return 0;
}

/* Opens one shard set of [data] and its loader. */
static int open_data(struct run *r, const char *key, const char *spec, int accum,
                     struct data_set **ds, struct data_loader *dl)
{
    struct errmsg derr;
    char where[PATH_MAX + 32];

    *ds = data_open(spec, r->cfg.vocab_size, &derr);
    if (!*ds || data_loader_init(dl, *ds, r->cfg.batch_size, r->cfg.seq_len, r->rank, r->world,
                                 accum, &derr) < 0)
        return errmsg_set(&r->err, -EINVAL, "%s: data.%s: %s",
                          cfg_where(r, "data", key, where, sizeof(where)), key, derr.text);
    return 0;
}

static int setup_data(struct run *r)
{
    size_t bt = (size_t)r->cfg.batch_size * (size_t)r->cfg.seq_len;
    int ret;

    ret = open_data(r, "train", r->cfg.train, r->cfg.grad_accum, &r->train_ds, &r->dl);
    if (ret == 0 && r->cfg.val)
        ret = open_data(r, "val", r->cfg.val, 1, &r->val_ds, &r->dl_val);
    if (ret < 0)
        return ret;
    r->inputs = malloc(bt * sizeof(int));
    r->targets = malloc(bt * sizeof(int));
    if (!r->inputs || !r->targets)
        return errmsg_set(&r->err, -ENOMEM, "out of memory for a batch of %zu tokens", bt);
    return 0;
}

/* The model and its optimizer on the backend, and the learning-rate schedule. */
static int setup_model(struct run *r)
{
    struct backend_opts o = {
        .batch_size = r->cfg.batch_size,
        .seq_len = r->cfg.seq_len,
        .adamw =
            {
                .beta1 = (float)r->cfg.beta1,
                .beta2 = (float)r->cfg.beta2,
                .eps = (float)r->cfg.eps,
                .weight_decay = (float)r->cfg.weight_decay,
            },
        .fp32 = r->cfg.dtype == TRAINCFG_DTYPE_FP32,
        .attention = r->cfg.attention,
        .graphs = r->cfg.cuda_graphs,
        .zero = r->cfg.zero,
        .coll = r->coll,
    };
    char where[PATH_MAX + 32];
    struct errmsg why;
    int ret;

    r->mcfg = (struct gpt2_config){
        .max_seq_len = r->cfg.seq_len,
        .vocab_size = r->cfg.vocab_size,
        .padded_vocab_size = gpt2_padded_vocab(r->cfg.vocab_size),
        .n_layer = r->cfg.n_layer,
        .n_head = r->cfg.n_head,
        .n_embd = r->cfg.n_embd,
    };
    if (!gpt2_config_valid(&r->mcfg, &why))
        return errmsg_set(&r->err, -EINVAL, "%s: %s",
                          cfg_where(r, "model", "n_embd", where, sizeof(where)), why.text);
    r->sched = (struct lr_schedule){
        .lr = (float)r->cfg.lr,
        .min_lr = (float)r->cfg.min_lr,
        .warmup_steps = r->cfg.warmup_steps,
        .total_steps = r->cfg.steps,
    };
    r->rng = (uint64_t)r->cfg.seed ^ SAMPLE_RNG_SALT;
    o.model = r->mcfg;
    ret = r->be->init(r->b, &o);
    if (ret < 0)
        return errmsg_set(&r->err, ret, "%s", r->b->err.text);
    r->n_params = r->b->n_params;
    return 0;
}

static struct ckpt_model ckpt_shape(const struct run *r)
{
    return (struct ckpt_model){
        .n_layer = r->mcfg.n_layer,
        .n_head = r->mcfg.n_head,
        .n_embd = r->mcfg.n_embd,
        .seq_len = r->mcfg.max_seq_len,
        .vocab_size = r->mcfg.vocab_size,
        .padded_vocab = r->mcfg.padded_vocab_size,
    };
}

/* The state rank 0 decides at start and the others take from it. */
struct start_state {
    int32_t status;   /* 0, or rank 0's negative errno: text says why */
    int32_t from;     /* START_* */
    int32_t mem_on;   /* memory checkpoints: rank 0's node keeps them, and the config asks */
    int32_t from_mem; /* START_CKPT from rank 0's memory checkpoint, not out_dir */
    uint64_t step, opt_step, rng;
    struct data_pos data;
    char text[ERRMSG_MAX]; /* rank 0's failure, or the checkpoint it resumes from */
};
enum { START_RANDOM, START_LLMC, START_CKPT };

/* Points st at the backend's host arrays for its state (backend.h); a no-op when it already
 * does. */
static int state_open(struct run *r, struct backend_state *st)
{
    int ret;

    if (st->params)
        return 0;
    ret = r->be->state_host(r->b, st);
    return ret < 0 ? errmsg_set(&r->err, ret, "%s", r->b->err.text) : 0;
}

/* Rank 0: init_from's llm.c checkpoint into the parameters of hs, its shape checked against
 * [model]. */
static int load_llmc(struct run *r, struct backend_state *hs)
{
    struct ckpt_model want = ckpt_shape(r), found;
    struct errmsg cerr;
    char where[PATH_MAX + 32];
    float *params = NULL;
    size_t nparams = 0;
    int ret;

    ret = ckpt_load_llmc(r->cfg.init_from, r->cfg.seq_len, &found, &params, &nparams, &cerr);
    if (ret < 0)
        return errmsg_set(&r->err, ret, "%s: model.init_from: %s",
                          cfg_where(r, "model", "init_from", where, sizeof(where)), cerr.text);
    const struct {
        const char *name;
        int have, want;
    } f[] = {
        {"n_layer", found.n_layer, want.n_layer},
        {"n_head", found.n_head, want.n_head},
        {"n_embd", found.n_embd, want.n_embd},
        {"seq_len", found.seq_len, want.seq_len},
        {"vocab_size", found.vocab_size, want.vocab_size},
        {"padded vocabulary", found.padded_vocab, want.padded_vocab},
    };
    for (size_t i = 0; i < sizeof(f) / sizeof(f[0]); i++) {
        if (f[i].have != f[i].want) {
            ret = errmsg_set(
                &r->err, -EINVAL, "%s: '%s': %s is %d in the checkpoint, %d in [model]",
                cfg_where(r, "model", i == 5 ? "vocab_size" : f[i].name, where, sizeof(where)),
                r->cfg.init_from, f[i].name, f[i].have, f[i].want);
            goto out;
        }
    }
    if (nparams != r->n_params) {
        ret = errmsg_set(&r->err, -EINVAL, "'%s': %zu parameters, the model has %zu",
                         r->cfg.init_from, nparams, r->n_params);
        goto out;
    }
    ret = state_open(r, hs);
    if (ret < 0)
        goto out;
    memcpy(hs->params, params, nparams * sizeof(float));
    ret = 0;
out:
    free(params);
    return ret;
}

/* Rank 0: a checkpoint of out_dir that this run cannot continue from (why: "'FILE': what
 * differs"), another model or other training data. With train.resume=1 that is the error;
 * with auto the checkpoints are another run's, which this one must neither continue nor
 * overwrite, and the line says how to go on. */
static int other_run(struct run *r, int mode, const char *why)
{
    if (mode == TRAINCFG_RESUME_ON)
        return errmsg_set(&r->err, -EINVAL, "cannot resume: %s", why);
    return errmsg_set(&r->err, -EINVAL,
                      "out_dir '%s' holds another run's checkpoints (%s): to start afresh, give "
                      "another train.out_dir or move them out of '%s'",
                      r->cfg.out_dir, why, r->cfg.out_dir);
}

/* The name of gpurun-train's memory checkpoint (gr_mem_tmp_path): rank 0's whole state. */
#define MEM_CKPT_NAME "ckpt"

/* Rank 0, in a restarted generation: its memory checkpoint (gr.h), from its node's memory or
 * the node that holds its node's copies, into hs. It is saved at every disk checkpoint too,
 * after the file; a failure between the two, or a holder's copy that had not yet come when
 * rank 0's node was lost, leaves it older than out_dir's newest, which then serves. Returns 1
 * when loaded, 0 when there is none or it cannot be used (said: the disk's then serves). */
static int load_mem(struct run *r, struct start_state *st, struct backend_state *hs)
{
    struct ckpt_model shape = ckpt_shape(r);
    struct ckpt_state cs = {0};
    struct errmsg cerr;
    char path[PATH_MAX];
    int64_t step;
    uint64_t size;
    long long disk_step;
    int ret;

    ret = gr_mem_find(r->g, MEM_CKPT_NAME, path, sizeof(path), &step, &size);
    if (ret < 0) {
        if (ret != -ENOENT)
            fprintf(stderr, PROG ": warning: no memory checkpoint: %s\n", gr_strerror(r->g));
        return 0;
    }
    ret = ckpt_newest_step(r->cfg.out_dir, &disk_step, &cerr);
    if (ret < 0)
        return errmsg_set(&r->err, ret, "cannot resume: %s", cerr.text);
    if (disk_step > step) {
        printf("the memory checkpoint of step %" PRId64 " is older than '%s' of step %lld: "
               "resuming from the disk\n",
               step, r->cfg.out_dir, disk_step);
        return 0;
    }
    ret = state_open(r, hs);
    if (ret < 0)
        return ret;
    cs.params = hs->params;
    cs.m = hs->m;
    cs.v = hs->v;
    ret = ckpt_read(path, &shape, r->n_params, &cs, &cerr);
    if (ret == 0 && (cs.data.ntokens != r->train_ds->ntokens || cs.data.nseq != r->dl.nseq))
        ret = errmsg_set(&cerr, -EINVAL, "'%s': of other training data", path);
    if (ret < 0) {
        fprintf(stderr, PROG ": warning: the memory checkpoint is not used: %s\n", cerr.text);
        return 0;
    }
    st->step = cs.step;
    st->opt_step = cs.opt_step;
    st->rng = cs.rng[0];
    st->data = cs.data;
    st->from_mem = 1;
    snprintf(st->text, sizeof(st->text), "the memory checkpoint of step %" PRIu64, cs.step);
    return 1;
}

/* Rank 0: the newest valid checkpoint of out_dir into hs, when there is one (mode: the
 * effective train.resume, on or auto). Returns 1 when one was loaded, 0 when out_dir holds no
 * checkpoint file. A damaged newest checkpoint gives way to the newest valid one behind it
 * (the one kept for that, CKPT_KEEP) and is set aside with a warning; a newer format, a file
 * that cannot be read, damage with nothing valid behind it, a checkpoint of another model or
 * data (other_run) are errors, leaving out_dir as it was. */
static int load_ckpt(struct run *r, int mode, struct start_state *st, struct backend_state *hs)
{
    struct ckpt_model shape = ckpt_shape(r);
    struct ckpt_state cs = {0};
    struct ckpt_newest nw = {0};
    struct errmsg cerr;
    char aside[PATH_MAX + 32];
    int ret;

    ret = state_open(r, hs);
    if (ret < 0)
        return ret;
    cs.params = hs->params;
    cs.m = hs->m;
    cs.v = hs->v;
    ret = ckpt_load_newest(r->cfg.out_dir, &shape, r->n_params, &cs, &nw, &cerr);
    /* -EINVAL: a valid checkpoint of another model (ckpt.h). */
    if (ret == -EINVAL)
        return other_run(r, mode, cerr.text);
    if (ret <= 0)
        return ret < 0 ? errmsg_set(&r->err, ret, "cannot resume: %s", cerr.text) : 0;
    /* The data position only means something for the same token stream. */
    if (cs.data.ntokens != r->train_ds->ntokens || cs.data.nseq != r->dl.nseq) {
        char why[ERRMSG_MAX];
        snprintf(why, sizeof(why),
                 "'%s': the training data changed: %" PRIu64 " tokens (%" PRIu64
                 " sequences) then, %" PRIu64 " (%" PRIu64 ") now in '%s'",
                 nw.path, cs.data.ntokens, cs.data.nseq, r->train_ds->ntokens, r->dl.nseq,
                 r->cfg.train);
        ret = other_run(r, mode, why);
        goto out;
    }
    for (size_t i = 0; i < nw.ndamaged; i++) {
        ret = ckpt_set_aside(nw.damaged[i].path, aside, sizeof(aside), &cerr);
        if (ret < 0) {
            errmsg_set(&r->err, ret, "cannot resume: %s", cerr.text);
            goto out;
        }
        fprintf(stderr, PROG ": warning: %s; kept as '%s', resuming from the older '%s'\n",
                nw.damaged[i].why.text, aside, nw.path);
    }
    st->step = cs.step;
    st->opt_step = cs.opt_step;
    st->rng = cs.rng[0];
    st->data = cs.data;
    snprintf(st->text, sizeof(st->text), "%s", nw.path);
    ret = 1;
out:
    ckpt_newest_release(&nw);
    return ret;
}

/* Rank 0, at every start: the temp files of saves killed before their rename (the rule that
 * tells them from a live writer's is ckpt_clean_tmp's). */
static int clean_tmp(struct run *r)
{
    struct errmsg cerr;
    uint64_t bytes;
    int removed, ret;

    ret = ckpt_clean_tmp(r->cfg.out_dir, &r->started, &removed, &bytes, &cerr);
    if (ret < 0)
        return errmsg_set(&r->err, ret, "%s", cerr.text);
    if (removed)
        printf("out_dir '%s': removed %d temp file%s of interrupted saves (%.1f MB)\n",
               r->cfg.out_dir, removed, removed == 1 ? "" : "s", (double)bytes / 1e6);
    return 0;
}

/* Rank 0, with train.resume=0: a run that must start at step 0 in an out_dir that holds
 * checkpoints is refused, naming the newest. Starting there would mix two runs (a later resume
 * would take the old one's newest checkpoint; this run's saves and pruning would replace and
 * remove the old one's), and gpurun-train never deletes a checkpoint that no newer valid one
 * of the same run replaces (ckpt_prune). */
static int refuse_checkpoints(struct run *r)
{
    char newest[NAME_MAX + 1] = "";
    struct dirent *de;
    DIR *d = opendir(r->cfg.out_dir);
    int n = 0;

    if (!d)
        return errno == ENOENT ? 0
                               : errmsg_set(&r->err, -errno, "cannot read '%s': %s", r->cfg.out_dir,
                                            strerror(errno));
    while ((de = readdir(d))) {
        if (!ckpt_is_name(de->d_name))
            continue;
        n++;
        /* Names of more digits are later steps; of as many, the greater name. */
        if (strlen(de->d_name) > strlen(newest) ||
            (strlen(de->d_name) == strlen(newest) && strcmp(de->d_name, newest) > 0))
            snprintf(newest, sizeof(newest), "%s", de->d_name);
    }
    closedir(d);
    if (n == 0)
        return 0;
    return errmsg_set(&r->err, -EEXIST,
                      "out_dir '%s' holds %d checkpoint%s (the newest '%s/%s') and train.resume is "
                      "0: to continue them, set train.resume=auto; to start afresh, give another "
                      "train.out_dir or move them out of '%s'",
                      r->cfg.out_dir, n, n == 1 ? "" : "s", r->cfg.out_dir, newest, r->cfg.out_dir);
}

/* Rank 0, starting at step 0: metrics.jsonl of a run that never saved a checkpoint here (or
 * whose checkpoints were moved away) would be taken for this run's first lines: removed. */
static int remove_metrics(struct run *r)
{
    char path[PATH_MAX];

    snprintf(path, sizeof(path), "%s/%s", r->cfg.out_dir, METRICS_NAME);
    if (unlink(path) < 0 && errno != ENOENT)
        return errmsg_set(&r->err, -errno, "cannot remove '%s': %s", path, strerror(errno));
    return 0;
}

/* Rank 0, first of all: out_dir exists (created when missing) and this process may write in
 * it, so that a read-only or foreign out_dir is one line before anything is loaded, rather than
 * the failure of the first file written there. */
static int check_out_dir(struct run *r)
{
    int ret = fs_mkdirs(r->cfg.out_dir, 0755);

    if (ret < 0)
        return errmsg_set(&r->err, ret, "cannot create '%s': %s", r->cfg.out_dir, strerror(-ret));
    if (access(r->cfg.out_dir, W_OK | X_OK) < 0)
        return errmsg_set(&r->err, -errno, "out_dir '%s': not writable (%s)", r->cfg.out_dir,
                          strerror(errno));
    return 0;
}

/* Rank 0, resuming at step: drops the metrics lines of steps after it (written after the
 * checkpoint by the run that stopped), so that the file reads as one run. */
static int trim_metrics(struct run *r, uint64_t step)
{
    char path[PATH_MAX];
    char *text = NULL, *out = NULL, *line, *next;
    size_t len, olen = 0;
    int ret;

    snprintf(path, sizeof(path), "%s/%s", r->cfg.out_dir, METRICS_NAME);
    ret = fs_read_all(path, METRICS_MAX, &text, &len);
    if (ret == -ENOENT)
        return 0;
    if (ret < 0)
        return errmsg_set(&r->err, ret, "cannot read '%s': %s", path, strerror(-ret));
    out = malloc(len + 1);
    if (!out) {
        ret = errmsg_set(&r->err, -ENOMEM, "cannot rewrite '%s': out of memory", path);
        goto out;
    }
    for (line = text; line && *line; line = next) {
        json_t *j, *s;
        next = strchr(line, '\n');
        if (next)
            *next++ = '\0';
        j = json_loads(line, 0, NULL);
        s = json_object_get(j, "step");
        if (json_is_integer(s) && json_integer_value(s) >= 0 &&
            (uint64_t)json_integer_value(s) <= step) {
            size_t n = strlen(line);
            memcpy(out + olen, line, n);
            out[olen + n] = '\n';
            olen += n + 1;
        }
        json_decref(j);
    }
    ret = fs_write_atomic(path, out, olen, 0644);
    if (ret < 0)
        errmsg_set(&r->err, ret, "cannot rewrite '%s': %s", path, strerror(-ret));
out:
    free(text);
    free(out);
    return ret;
}

/* Every rank: rank 0's st (its decision) and, from a checkpoint or init_from, its state in hs
 * to every rank, which make it their model's; from none, the seed's. The same collectives
 * whether a run starts or regroups in process (regroup), so that a spare's new rank takes
 * part in either. */
static int share_start(struct run *r, struct start_state *st, struct backend_state *hs)
{
    int ret = coll_broadcast(r->coll, st, sizeof(*st), 0);

    if (ret < 0)
        return errmsg_set(&r->err, ret, "cannot agree on the starting state: %s",
                          coll_strerror(r->coll));
    if (st->status < 0)
        return errmsg_set(&r->err, st->status, "%s", st->text);
    if (st->from != START_RANDOM) {
        ret = state_open(r, hs);
        if (ret < 0)
            return ret;
        if (r->world > 1)
            ret = coll_broadcast(r->coll, hs->params, r->n_params * sizeof(float), 0);
        if (ret == 0 && st->from == START_CKPT && r->world > 1) {
            ret = coll_broadcast(r->coll, hs->m, r->n_params * sizeof(float), 0);
            if (ret == 0)
                ret = coll_broadcast(r->coll, hs->v, r->n_params * sizeof(float), 0);
        }
        if (ret < 0)
            return errmsg_set(&r->err, ret, "cannot share the starting state: %s",
                              coll_strerror(r->coll));
        hs->opt_step = st->opt_step;
        ret = r->be->state_set(r->b, hs, st->from == START_CKPT);
    } else {
        ret = r->be->init_random(r->b, (uint64_t)r->cfg.seed);
    }
    if (ret < 0)
        return errmsg_set(&r->err, ret, "%s", r->b->err.text);
    return 0;
}

/* The run's starting point: rank 0 picks it (the newest checkpoint when resuming, else
 * init_from, else the seed) and the others take it, so that out_dir and init_from need only
 * be readable on rank 0's node. */
static int setup_start(struct run *r)
{
    struct start_state st = {.from = START_RANDOM};
    struct backend_state hs = {0};
    int mode = r->cfg.resume;
    const char *restarts = getenv("GPURUN_RESTART_COUNT");
    int ret = 0;

    /* A generation restarted by rendezvousd after a failure goes on from the last checkpoint
     * (docs/design.md, section 4), or starts at step 0 when the failed one saved none, whatever
     * train.resume says. */
    if (restarts && strcmp(restarts, "0") != 0)
        mode = TRAINCFG_RESUME_AUTO;
    if (r->rank == 0) {
        ret = check_out_dir(r);
        st.mem_on = r->g && r->cfg.mem_ckpt_every > 0 && getenv("GPURUN_MEM_DIR") &&
                    *getenv("GPURUN_MEM_DIR");
        if (ret >= 0 && mode == TRAINCFG_RESUME_OFF)
            ret = refuse_checkpoints(r);
        else if (ret >= 0 && st.mem_on && restarts && strcmp(restarts, "0") != 0 &&
                 (ret = load_mem(r, &st, &hs)) == 1)
            ;
        else if (ret >= 0)
            ret = load_ckpt(r, mode, &st, &hs);
        if (ret == 0 && mode == TRAINCFG_RESUME_ON)
            ret = errmsg_set(&r->err, -ENOENT,
                             "cannot resume: no checkpoint in '%s' (train.resume=auto would start "
                             "at step 0)",
                             r->cfg.out_dir);
        if (ret == 1) {
            st.from = START_CKPT;
        } else if (ret == 0) {
            if (r->cfg.init_from) {
                ret = load_llmc(r, &hs);
                st.from = START_LLMC;
            }
        }
        if (ret >= 0)
            ret = clean_tmp(r);
        if (ret >= 0)
            ret = st.from == START_CKPT ? trim_metrics(r, st.step) : remove_metrics(r);
        st.status = ret < 0 ? ret : 0;
        if (ret < 0)
            snprintf(st.text, sizeof(st.text), "%s", r->err.text);
    }
    ret = share_start(r, &st, &hs);
    if (ret < 0)
        goto out;
    r->saved_step = UINT64_MAX;
    r->mem_on = st.mem_on;
    if (st.from == START_CKPT) {
        r->step = st.step;
        /* From memory: out_dir may not have this step's checkpoint, which a save must write. */
        r->saved_step = st.from_mem ? UINT64_MAX : st.step;
        r->rng = st.rng;
        data_loader_restore(&r->dl, &st.data);
    }
    if (r->rank == 0) {
        if (st.from == START_CKPT)
            printf(st.from_mem ? "resuming from %s at step %" PRIu64 "\n"
                               : "resuming from '%s' at step %" PRIu64 "\n",
                   st.text, st.step);
        else if (st.from == START_LLMC)
            printf("starting from '%s' (llm.c checkpoint)\n", r->cfg.init_from);
        else if (mode == TRAINCFG_RESUME_AUTO)
            printf("no checkpoint in '%s': starting from step 0\n", r->cfg.out_dir);
    }
    ret = 0;
out:
    r->be->state_release(r->b, &hs);
    return ret;
}

static void print_setup(const struct run *r)
{
    uint64_t tokens_step = r->dl.G * (uint64_t)r->cfg.seq_len;
    char what[512];

    printf("model: GPT-2, %d layers, %d heads, %d channels, context %d, vocabulary %d "
           "(padded %d): %.2fM parameters\n",
           r->mcfg.n_layer, r->mcfg.n_head, r->mcfg.n_embd, r->mcfg.max_seq_len, r->mcfg.vocab_size,
           r->mcfg.padded_vocab_size, (double)r->n_params / 1e6);
    printf("data: %" PRIu64 " training tokens in %zu shard%s", r->train_ds->ntokens,
           r->train_ds->nshards, r->train_ds->nshards == 1 ? "" : "s");
    if (r->val_ds) {
        /* An evaluation of more batches than the set holds goes over some of them again. */
        uint64_t distinct = data_loader_val_batches(&r->dl_val);
        printf(", %" PRIu64 " validation tokens (%" PRIu64 " batch%s", r->val_ds->ntokens, distinct,
               distinct == 1 ? "" : "es");
        if (r->cfg.eval_every > 0 && (uint64_t)r->cfg.eval_batches > distinct)
            printf(": train.eval_batches %d repeats some", r->cfg.eval_batches);
        printf(")");
    }
    printf("; %" PRIu64 " tokens per step (%d rank%s x batch %d x accum %d x seq %d), an epoch "
           "is %" PRIu64 " steps\n",
           tokens_step, r->world, r->world == 1 ? "" : "s", r->cfg.batch_size, r->cfg.grad_accum,
           r->cfg.seq_len, r->dl.nseq / r->dl.G);
    r->be->describe(r->b, what, sizeof(what));
    printf("run: %d steps, %s, %s; out_dir '%s'\n", r->cfg.steps, what, coll_describe(r->coll),
           r->cfg.out_dir);
}

/* ---- the step loop ------------------------------------------------------------------------ */

/* Mean validation loss over eval_batches batches and all ranks. */
static int evaluate(struct run *r, float *val_loss)
{
    double sum = 0.0;
    float loss;
    int ret;

    for (int e = 0; e < r->cfg.eval_batches; e++) {
        struct errmsg derr;
        ret = data_loader_val_batch(&r->dl_val, e, r->inputs, r->targets, &derr);
        if (ret < 0)
            return errmsg_set(&r->err, ret, "validation: %s", derr.text);
        ret =
            r->be->eval_loss(r->b, r->inputs, r->targets, r->cfg.batch_size, r->cfg.seq_len, &loss);
        if (ret < 0)
            return errmsg_set(&r->err, ret, "validation %s", r->b->err.text);
        sum += loss;
    }
    sum /= r->cfg.eval_batches;
    ret = coll_allreduce_sum_f64(r->coll, &sum, 1);
    if (ret < 0)
        return errmsg_set(&r->err, ret, "validation: %s", coll_strerror(r->coll));
    *val_loss = (float)(sum / r->world);
    return 0;
}

/* Length of the well-formed UTF-8 sequence at p (n bytes left) that encodes a character past
 * ASCII, or 0: a lead byte, its continuation bytes, no overlong form or surrogate. */
static int utf8_len(const int *p, int n)
{
    int len = p[0] >= 0xf0 && p[0] <= 0xf4 ? 4 : p[0] >= 0xe0 ? 3 : p[0] >= 0xc2 ? 2 : 0;
    int cp;

    if (p[0] >= 0xf5 || len == 0 || len > n)
        return 0;
    cp = p[0] & (0x7f >> len);
    for (int i = 1; i < len; i++) {
        if ((p[i] & 0xc0) != 0x80)
            return 0;
        cp = (cp << 6) | (p[i] & 0x3f);
    }
    if ((len == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) ||
        (len == 4 && (cp < 0x10000 || cp > 0x10ffff)))
        return 0;
    return len;
}

/* Prints n tokens: with a byte-level vocabulary as text (well-formed UTF-8, newlines and tabs
 * as they are, any other byte as \xNN so that the terminal sees only printable text), else
 * as token ids. */
static void print_tokens(const int *tok, int n, int vocab_size)
{
    for (int i = 0; i < n; i++) {
        int len;
        if (vocab_size > 256) {
            printf("%s%d", i ? " " : "", tok[i]);
        } else if ((tok[i] >= 0x20 && tok[i] < 0x7f) || tok[i] == '\n' || tok[i] == '\t') {
            putchar(tok[i]);
        } else if ((len = utf8_len(tok + i, n - i)) > 0) {
            for (int k = 0; k < len; k++)
                putchar(tok[i + k]);
            i += len - 1;
        } else {
            printf("\\x%02x", tok[i]);
        }
    }
    putchar('\n');
}

/* Rank 0: n tokens sampled after the first token of the training data, each from the
 * window of the last seq_len tokens (the context the model was trained on), printed. */
static int sample(struct run *r, int n)
{
    int T = r->cfg.seq_len, V = r->mcfg.vocab_size;
    int *ctx = malloc((size_t)(n + 1) * sizeof(int));
    struct errmsg derr;
    uint16_t first;
    int ret;

    if (!ctx)
        return errmsg_set(&r->err, -ENOMEM, "sample: out of memory");
    ret = data_read(r->train_ds, 0, 1, &first, &derr);
    if (ret < 0) {
        free(ctx);
        return errmsg_set(&r->err, ret, "sample: %s", derr.text);
    }
    ctx[0] = first;
    for (int len = 1; len <= n; len++) {
        int t = len < T ? len : T;
        const float *row;

        ret = r->be->last_logits(r->b, ctx + len - t, t, &row);
        if (ret < 0) {
            free(ctx);
            return errmsg_set(&r->err, ret, "sample: %s", r->b->err.text);
        }
        ctx[len] = gpt2_sample_next(row, V, SAMPLE_TEMPERATURE, &r->rng);
    }
    printf("sample after step %" PRIu64 " (%d tokens, temperature %.1f):\n", r->step, n,
           (double)SAMPLE_TEMPERATURE);
    print_tokens(ctx, n + 1, V);
    free(ctx);
    return 0;
}

/* The checkpoint of hs, the state before step r->step (rank 0's, whole). */
static struct ckpt_state ckpt_state_of(const struct run *r, const struct backend_state *hs)
{
    return (struct ckpt_state){
        .model = ckpt_shape(r),
        .world_size = r->world,
        .batch_size = r->cfg.batch_size,
        .grad_accum = r->cfg.grad_accum,
        .step = r->step,
        .opt_step = hs->opt_step,
        .rng = {r->rng},
        .data = data_loader_pos(&r->dl, r->step),
        .nparams = r->n_params,
        .params = hs->params,
        .m = hs->m,
        .v = hs->v,
    };
}

/* Rank 0: hs as its memory checkpoint (gr.h), written into its node's memory in the disk
 * checkpoint's format and kept there and by the node that holds its node's copies. A failure
 * is a warning: the disk checkpoints stand. */
static void mem_write(struct run *r, const struct backend_state *hs)
{
    struct ckpt_state cs = ckpt_state_of(r, hs);
    struct errmsg cerr;
    char path[PATH_MAX];
    double t0 = monotime_s();
    int ret;

    if (!r->mem_on)
        return;
    ret = gr_mem_tmp_path(r->g, MEM_CKPT_NAME, path, sizeof(path));
    if (ret == 0 && ckpt_write(path, &cs, r->config_json, &cerr) < 0) {
        fprintf(stderr, PROG ": warning: no memory checkpoint of step %" PRIu64 ": %s\n", r->step,
                cerr.text);
        return;
    }
    if (ret == 0)
        ret = gr_mem_keep(r->g, MEM_CKPT_NAME, (int64_t)r->step);
    if (ret < 0) {
        fprintf(stderr, PROG ": warning: no memory checkpoint of step %" PRIu64 ": %s\n", r->step,
                gr_strerror(r->g));
        return;
    }
    if (!r->mem_said)
        printf("memory checkpoint of step %" PRIu64 " (%.1f MB in %.0f ms), every %d steps\n",
               r->step, (double)r->n_params * 12.0 / 1e6, 1e3 * (monotime_s() - t0),
               r->cfg.mem_ckpt_every);
    r->mem_said = true;
}

/* Every rank: the state before step r->step gathered at rank 0 (a collective), which keeps
 * it as its memory checkpoint. No barrier: the next step's collectives wait for rank 0. */
static int save_mem_ckpt(struct run *r)
{
    struct backend_state hs = {0};
    int ret;

    if (r->rank == 0 && (ret = state_open(r, &hs)) < 0)
        goto out;
    if ((ret = r->be->state_get(r->b, r->rank == 0 ? &hs : NULL)) < 0) {
        errmsg_set(&r->err, ret, "%s", r->b->err.text);
        goto out;
    }
    if (r->rank == 0)
        mem_write(r, &hs);
    ret = 0;
out:
    r->be->state_release(r->b, &hs);
    return ret;
}

/* Rank 0 writes the checkpoint of the state before step r->step (and keeps it as its memory
 * checkpoint too, so that one is never older than the disk's); every rank then waits for it
 * at a barrier, so that none exits or goes on before the file is complete. */
static int save_ckpt(struct run *r)
{
    struct backend_state hs = {0};
    struct ckpt_state cs;
    struct errmsg cerr;
    char path[PATH_MAX];
    double t0 = monotime_s();
    int ret;

    if (r->saved_step == r->step)
        return 0;
    if (r->rank == 0 && (ret = state_open(r, &hs)) < 0)
        goto out;
    if ((ret = r->be->state_get(r->b, r->rank == 0 ? &hs : NULL)) < 0) {
        errmsg_set(&r->err, ret, "%s", r->b->err.text);
        goto out;
    }
    if (r->rank == 0) {
        cs = ckpt_state_of(r, &hs);
        ret = ckpt_save(r->cfg.out_dir, &cs, r->config_json, &cerr);
        if (ret == 0)
            ret = ckpt_prune(r->cfg.out_dir, CKPT_KEEP, &cerr);
        if (ret < 0) {
            errmsg_set(&r->err, ret, "%s", cerr.text);
            goto out;
        }
        ckpt_path(path, sizeof(path), r->cfg.out_dir, r->step);
        printf("saved '%s' (%.1f MB in %.0f ms)\n", path, (double)r->n_params * 12.0 / 1e6,
               1e3 * (monotime_s() - t0));
        mem_write(r, &hs);
    }
    ret = coll_barrier(r->coll);
    if (ret < 0) {
        errmsg_set(&r->err, ret, "waiting for rank 0's checkpoint: %s", coll_strerror(r->coll));
        goto out;
    }
    r->saved_step = r->step;
    ret = 0;
out:
    r->be->state_release(r->b, &hs);
    return ret;
}

/* What one step measured, for the metrics line, the printed line and the progress report. */
struct step_stats {
    uint64_t step; /* 1-based, as printed */
    float loss, lr, grad_norm, val_loss;
    bool have_val;
    double tokens_per_s, ms;
};

static void write_metrics(struct run *r, const struct step_stats *s)
{
    char loss[32], lr[32], norm[32], val[32];

    fmt_float(loss, sizeof(loss), s->loss);
    fmt_float(lr, sizeof(lr), s->lr);
    fmt_float(norm, sizeof(norm), s->grad_norm);
    fprintf(r->metrics,
            "{\"step\": %" PRIu64 ", \"loss\": %s, \"lr\": %s, \"tokens_per_s\": %.1f, "
            "\"grad_norm\": %s",
            s->step, loss, lr, s->tokens_per_s, norm);
    if (s->have_val) {
        fmt_float(val, sizeof(val), s->val_loss);
        fprintf(r->metrics, ", \"val_loss\": %s", val);
    }
    fprintf(r->metrics, "}\n");
    fflush(r->metrics);
}

static void print_step(const struct run *r, const struct step_stats *s)
{
    int w = snprintf(NULL, 0, "%d", r->cfg.steps);

    printf("step %*" PRIu64 "/%d | loss %.4f", w, s->step, r->cfg.steps, (double)s->loss);
    if (s->have_val)
        printf(" | val %.4f", (double)s->val_loss);
    printf(" | lr %.2e | norm %.3f | %.0f tok/s | %.1f ms\n", (double)s->lr, (double)s->grad_norm,
           s->tokens_per_s, s->ms);
}

/* One optimizer step: grad_accum forward/backward pairs, the gradients averaged over the
 * ranks, clipped by their global norm, AdamW. Returns the rank's mean loss in *loss, and in
 * *own the seconds of its forward and backward passes, which wait on no other rank (the
 * stragglers rule's step time). */
static int train_step(struct run *r, float *loss, float *lr, float *grad_norm, double *own)
{
    const struct backend_ops *be = r->be;
    int accum = r->cfg.grad_accum;
    double sum = 0.0, norm = 0.0, t0 = monotime_s();
    float l;
    int ret;

    ret = be->zero_grad(r->b);
    for (int micro = 0; ret == 0 && micro < accum; micro++) {
        struct errmsg derr;
        ret = data_loader_batch(&r->dl, r->step, micro, r->inputs, r->targets, &derr);
        if (ret < 0)
            return errmsg_set(&r->err, ret, "step %" PRIu64 ": %s", r->step + 1, derr.text);
        ret = be->forward_backward(r->b, r->inputs, r->targets, r->cfg.batch_size, r->cfg.seq_len,
                                   1.0f / (float)accum, &l);
        if (ret == 0)
            sum += l;
    }
    *own = monotime_s() - t0;
    if (ret == 0)
        ret = be->average_grads(r->b);
    if (ret == 0)
        ret = be->grad_norm(r->b, &norm);
    *lr = optim_lr(&r->sched, (long)r->step);
    if (ret == 0)
        ret = be->update(r->b, *lr, optim_clip_scale(norm, (float)r->cfg.grad_clip));
    if (ret < 0)
        return errmsg_set(&r->err, ret, "step %" PRIu64 ": %s", r->step + 1, r->b->err.text);
    *loss = (float)(sum / accum);
    *grad_norm = (float)norm;
    return 0;
}

static bool every(int n, uint64_t step)
{
    return n > 0 && step % (uint64_t)n == 0;
}

static int open_metrics(struct run *r);

/* Rank 0 regrouping under ZeRO-1: the lost rank's optimizer shard lives only in the
 * checkpoints, so every rank goes back to the newest (rank 0's memory one, else out_dir's),
 * whose whole state rank 0 holds; the metrics after it go (the file rewritten, then opened
 * again). */
static int regroup_saved(struct run *r, struct start_state *st, struct backend_state *hs)
{
    int ret = r->mem_on ? load_mem(r, st, hs) : 0;

    if (ret == 0)
        ret = load_ckpt(r, TRAINCFG_RESUME_AUTO, st, hs);
    if (ret == 0)
        ret = errmsg_set(&r->err, -ENOENT,
                         "ZeRO-1: no checkpoint to regroup from (neither in memory nor in '%s')",
                         r->cfg.out_dir);
    if (ret > 0 && r->metrics) {
        fclose(r->metrics);
        r->metrics = NULL;
        ret = trim_metrics(r, st->step);
        if (ret == 0)
            ret = open_metrics(r);
    }
    return ret;
}

/* How long a rank whose peer was lost waits for the job to regroup: the leader sees a lost
 * node at once, a silent one at its heartbeat timeout. */
#define REGROUP_WAIT_MS (5 * 60 * 1000)

/* After a collective failed with failed (r->err saying why): where a peer was lost
 * (-ECONNRESET) and this rank can regroup, waits for the job's next generation, re-forms the
 * collectives with the spare's new ranks through its store and takes rank 0's state (the
 * same collectives as a start: share_start), and returns 0 to go on from rank 0's step: the
 * step in flight is lost, unless rank 0 had updated its model with it. Else returns failed,
 * or the regroup's own failure. */
static int regroup(struct run *r, int failed)
{
    struct start_state st = {.from = START_CKPT, .from_mem = 1};
    struct backend_state hs = {0};
    char why[ERRMSG_MAX];
    struct errmsg err;
    const char *backend = r->be->coll ? r->be->coll : "tcp";
    int gen, ret;

    if (!r->can_regroup || failed != -ECONNRESET)
        return failed;
    snprintf(why, sizeof(why), "%s", r->err.text);
    if (r->updated) {
        r->step++;
        r->updated = false;
    }
    if (r->rank == 0)
        printf("a peer was lost after step %" PRIu64 ": waiting for the job to regroup (%s)\n",
               r->step, why);
    gen = gr_regroup(r->g, REGROUP_WAIT_MS);
    if (gen < 0)
        return errmsg_set(&r->err, failed, "%s (no regroup: %s)", why, gr_strerror(r->g));
    coll_close(r->coll);
    r->coll = NULL;
    ret = coll_open(backend, r->g, &r->coll, &err);
    if (ret < 0)
        return errmsg_set(&r->err, ret,
                          "regrouping as generation %d: cannot open the "
                          "collectives: %s",
                          gen, err.text);
    coll_set_timeout(r->coll, r->cfg.coll_timeout_s * 1000);
    r->be->set_coll(r->b, r->coll);
    if (r->rank == 0 && r->cfg.zero) {
        ret = regroup_saved(r, &st, &hs);
    } else if (r->rank == 0) {
        ret = state_open(r, &hs);
        if (ret == 0 && (ret = r->be->state_get(r->b, &hs)) < 0)
            errmsg_set(&r->err, ret, "%s", r->b->err.text);
        st.step = r->step;
        st.opt_step = hs.opt_step;
        st.rng = r->rng;
        st.data = data_loader_pos(&r->dl, r->step);
        snprintf(st.text, sizeof(st.text), "the live state of rank 0");
    }
    if (r->rank == 0) {
        st.status = ret < 0 ? ret : 0;
        st.mem_on = r->mem_on;
        if (ret < 0)
            snprintf(st.text, sizeof(st.text), "%s", r->err.text);
    }
    ret = share_start(r, &st, &hs);
    r->be->state_release(r->b, &hs);
    if (ret < 0)
        return ret;
    r->step = st.step;
    r->rng = st.rng;
    data_loader_restore(&r->dl, &st.data);
    r->mem_on = st.mem_on;
    /* Every rank alike, the spare's new ones too (setup_start from memory): the next save
     * writes whatever step it comes at. */
    r->saved_step = UINT64_MAX;
    if (r->rank == 0)
        printf("regrouped in process as generation %d: going on from step %" PRIu64 " (%s)\n", gen,
               r->step, st.text);
    return 0;
}

static int train(struct run *r)
{
    uint64_t steps = (uint64_t)r->cfg.steps;
    double t_start = monotime_s();
    uint64_t first = r->step;
    float last_loss = NAN, last_val = NAN;
    int ret;

    if (r->step >= steps) {
        if (r->rank == 0)
            printf("nothing to do: the run is at step %" PRIu64 " of %" PRIu64 "\n", r->step,
                   steps);
        return 0;
    }
    while (r->step < steps) {
        struct step_stats s = {.step = r->step + 1};
        double t0 = monotime_s(), agree[2], own = 0;
        bool last;

        ret = train_step(r, &s.loss, &s.lr, &s.grad_norm, &own);
        if (ret < 0) {
            if ((ret = regroup(r, ret)) < 0)
                return ret;
            continue;
        }
        r->updated = true;
        /* The mean loss over the ranks, and whether any rank was asked to stop: all stop after
         * the same step. */
        agree[0] = s.loss;
        agree[1] = stop_signal ? 1.0 : 0.0;
        ret = coll_allreduce_sum_f64(r->coll, agree, 2);
        if (ret < 0) {
            ret = errmsg_set(&r->err, ret, "step %" PRIu64 ": %s", s.step, coll_strerror(r->coll));
            if ((ret = regroup(r, ret)) < 0)
                return ret;
            continue;
        }
        s.loss = (float)(agree[0] / r->world);
        s.ms = 1e3 * (monotime_s() - t0);
        s.tokens_per_s = (double)(r->dl.G * (uint64_t)r->cfg.seq_len) / (s.ms / 1e3);
        r->step++;
        r->updated = false;
        last = r->step == steps || agree[1] > 0.0;

        if (r->val_ds && agree[1] == 0.0 &&
            (every(r->cfg.eval_every, r->step) || r->step == steps)) {
            ret = evaluate(r, &s.val_loss);
            if (ret < 0) {
                if ((ret = regroup(r, ret)) < 0)
                    return ret;
                continue;
            }
            s.have_val = true;
            last_val = s.val_loss;
        }
        last_loss = s.loss;
        if (r->g) {
            struct gr_progress p = GR_PROGRESS_INIT;

            p.step = (int64_t)s.step;
            p.loss = s.loss;
            p.lr = s.lr;
            /* This rank's share: gpurun status adds the ranks' up. */
            p.tokens_per_s = s.tokens_per_s / r->world;
            p.grad_norm = s.grad_norm;
            p.total_steps = r->cfg.steps;
            p.step_time = own;
            gr_report(r->g, &p);
        }
        if (r->rank == 0) {
            write_metrics(r, &s);
            if (every(r->cfg.log_every, s.step) || s.step == first + 1 || last || s.have_val)
                print_step(r, &s);
            if (every(r->cfg.sample_every, s.step) && !last && r->cfg.sample_tokens > 0) {
                ret = sample(r, r->cfg.sample_tokens);
                if (ret < 0)
                    return ret;
            }
        }
        if (every(r->cfg.ckpt_every, r->step) || last)
            ret = save_ckpt(r);
        else if (r->mem_on && every(r->cfg.mem_ckpt_every, r->step))
            ret = save_mem_ckpt(r);
        else
            ret = 1; /* nothing saved */
        /* ZeRO-1: every shard is in a checkpoint now. */
        if (ret == 0 && r->regroup_when_saved)
            ret = say_can_regroup(r);
        if (ret < 0) {
            if ((ret = regroup(r, ret)) < 0)
                return ret;
            continue;
        }
        if (agree[1] > 0.0) {
            if (r->rank == 0)
                printf("stopped by a signal after step %" PRIu64 "; continue with train.resume=1\n",
                       r->step);
            return 0;
        }
    }
    /* A regroup at the last step's save: the run ends with its checkpoint all the same. */
    if (r->saved_step != r->step) {
        ret = save_ckpt(r);
        if (ret < 0)
            return ret;
    }
    if (r->rank == 0) {
        printf("done: %" PRIu64 " steps in %.1f s, loss %.4f", r->step - first,
               monotime_s() - t_start, (double)last_loss);
        if (!isnan(last_val))
            printf(", val loss %.4f", (double)last_val);
        printf("\n");
        if (r->cfg.sample_tokens > 0)
            return sample(r, r->cfg.sample_tokens);
    }
    return 0;
}

/* ---- main --------------------------------------------------------------------------------- */

static void run_release(struct run *r)
{
    if (r->metrics)
        fclose(r->metrics);
    free(r->inputs);
    free(r->targets);
    data_close(r->train_ds);
    data_close(r->val_ds);
    /* NCCL's communicator before the device it runs on. */
    coll_close(r->coll);
    if (r->b)
        r->be->close(r->b);
    if (r->g)
        gr_finalize(r->g);
    free(r->config_json);
    traincfg_release(&r->cfg);
}

static int open_metrics(struct run *r)
{
    char path[PATH_MAX];

    if (snprintf(path, sizeof(path), "%s/%s", r->cfg.out_dir, METRICS_NAME) >= (int)sizeof(path))
        return errmsg_set(&r->err, -ENAMETOOLONG, "'%s': path too long", r->cfg.out_dir);
    r->metrics = fopen(path, "ae");
    if (!r->metrics)
        return errmsg_set(&r->err, -errno, "cannot open '%s': %s", path, strerror(errno));
    return 0;
}

static int train_main(const char *path, const char *const *overrides, size_t n)
{
    struct run r = {.cfg_path = path};
    struct errmsg cerr, why;
    struct sigaction sa = {.sa_handler = on_stop, .sa_flags = SA_RESTART};
    char where[PATH_MAX + 32];
    json_t *j;
    int ret;

    clock_gettime(CLOCK_REALTIME, &r.started);
    ret = traincfg_read(&r.cfg, path, overrides, n, &cerr);
    if (ret < 0) {
        fprintf(stderr, PROG ": %s\n", cerr.text);
        return 1;
    }
    /* Before anything that takes time or joins the collectives: a rank without a GPU says so
     * in one line. */
    r.be = backends[r.cfg.device];
    ret = r.be->probe(&why);
    if (ret < 0) {
        errmsg_set(&r.err, ret, "%s: device '%s': %s",
                   cfg_where(&r, "train", "device", where, sizeof(where)), r.be->name, why.text);
        goto out;
    }
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);
#ifdef _OPENMP
    if (r.cfg.threads > 0)
        omp_set_num_threads(r.cfg.threads);
#endif
    j = traincfg_to_json(&r.cfg);
    r.config_json =
        j ? json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10)) : NULL;
    json_decref(j);

    ret = setup_world(&r);
    if (ret == 0)
        ret = setup_data(&r);
    if (ret == 0)
        ret = setup_model(&r);
    if (ret == 0)
        ret = setup_start(&r);
    /* ZeRO-1 resumed from a checkpoint: it holds every shard. */
    if (ret == 0 && r.regroup_when_saved && r.step > 0)
        ret = say_can_regroup(&r);
    if (ret == 0 && r.rank == 0) {
        ret = open_metrics(&r);
        print_setup(&r);
    }
    if (ret == 0)
        ret = train(&r);
out:
    if (ret < 0)
        fprintf(stderr, PROG ": %s\n", r.err.text);
    fflush(stdout);
    run_release(&r);
    return ret < 0 ? 1 : 0;
}

/* gpurun-train prep TEXT... -o DIR [--val-fraction F] */
static int prep_main(int argc, char **argv)
{
    const char **inputs = calloc((size_t)argc, sizeof(char *));
    const char *out_dir = NULL;
    double frac = PREP_VAL_FRACTION;
    struct errmsg derr;
    size_t n = 0;
    int ret = 1;

    if (!inputs) {
        fprintf(stderr, PROG ": out of memory\n");
        return 1;
    }
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "-o") || !strcmp(argv[i], "--val-fraction")) {
            char *end;
            if (i + 1 == argc) {
                fprintf(stderr, PROG ": prep: %s needs a value\n", argv[i]);
                goto out;
            }
            if (argv[i][1] == 'o') {
                out_dir = argv[++i];
                continue;
            }
            errno = 0;
            frac = strtod(argv[++i], &end);
            if (errno || *end || !(frac > 0.0 && frac < 1.0)) {
                fprintf(stderr,
                        PROG ": prep: --val-fraction: '%s' is not a number between 0 and 1\n",
                        argv[i]);
                goto out;
            }
        } else if (argv[i][0] == '-' && argv[i][1]) {
            fprintf(stderr, PROG ": prep: unknown option '%s'\n", argv[i]);
            goto out;
        } else {
            inputs[n++] = argv[i];
        }
    }
    if (!out_dir || n == 0) {
        fprintf(stderr, PROG ": prep: usage: " PROG " prep TEXT... -o DIR [--val-fraction F]\n");
        goto out;
    }
    if (data_prep(inputs, n, out_dir, frac, &derr) < 0) {
        fprintf(stderr, PROG ": %s\n", derr.text);
        goto out;
    }
    printf("prep: %zu text file%s -> '%s' (train_*.bin, val_*.bin; the last %g%% for "
           "validation)\n",
           n, n == 1 ? "" : "s", out_dir, frac * 100.0);
    ret = 0;
out:
    free(inputs);
    return ret;
}

static void usage(FILE *out)
{
    fprintf(out,
            "usage: " PROG " TRAIN.CFG [section.key=value...]\n"
            "       " PROG " prep TEXT... -o DIR [--val-fraction F]\n"
            "\n"
            "Trains the GPT-2 that TRAIN.CFG describes ([model], [data], [optim], [train];\n"
            "see jobs/README.md), one rank of a gpurun job or alone. SIGTERM or SIGUSR1:\n"
            "finish the step, save a checkpoint, exit 0; the same command again continues\n"
            "(train.resume=auto, the default: never deletes a checkpoint).\n"
            "prep: byte-level token shards (DIR/train_000000.bin, DIR/val_000000.bin) from\n"
            "text, the last %g%% for validation.\n",
            PREP_VAL_FRACTION * 100.0);
}

int main(int argc, char **argv)
{
    const char **overrides = NULL;
    const char *path = NULL;
    size_t n = 0;
    int ret;

    /* Progress lines go through a pipe to rendezvousd: one write per line, as it happens. */
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc >= 2 && !strcmp(argv[1], "prep"))
        return prep_main(argc - 2, argv + 2);
    if (argc >= 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
        usage(stdout);
        return 0;
    }
    overrides = calloc((size_t)argc, sizeof(char *));
    if (!overrides) {
        fprintf(stderr, PROG ": out of memory\n");
        return 1;
    }
    for (int i = 1; i < argc; i++) {
        if (traincfg_is_override(argv[i])) {
            overrides[n++] = argv[i];
        } else if (argv[i][0] == '-') {
            fprintf(stderr, PROG ": unknown option '%s' (see '" PROG " --help')\n", argv[i]);
            free(overrides);
            return 1;
        } else if (path) {
            fprintf(stderr, PROG ": unexpected argument '%s': one train.cfg, then overrides\n",
                    argv[i]);
            free(overrides);
            return 1;
        } else {
            path = argv[i];
        }
    }
    if (!path) {
        usage(stderr);
        free(overrides);
        return 1;
    }
    ret = train_main(path, overrides, n);
    free(overrides);
    return ret;
}
