/* The job spec: what gpurun decides and every rendezvousd of the job reads, kept as
 * job.json in the job dir. Keys are table rows (name, type, offset, default, range). */
#ifndef GPURUN_JOBSPEC_H
#define GPURUN_JOBSPEC_H

#include <stdbool.h>

#include "errmsg.h"

struct jobspec {
    char *job_id;            /* "local-<time>-<pid>" or Slurm's job id */
    int nnodes;              /* nodes whose agents run the ranks */
    int spare_nodes;         /* more agents that join as hot spares (--spare-nodes): node ranks
                              * nnodes.. of nnodes + spare_nodes; a spare takes the place of a
                              * node that fails for the node's sake (FAILURE_NODE) */
    int nprocs;              /* ranks per node */
    char **argv;             /* NULL-terminated command of every rank */
    char **env;              /* NULL-terminated "K=V" added to every rank's environment */
    char *workdir;           /* ranks' working directory; NULL: the daemon's */
    char *out_dir;           /* a train.cfg's train.out_dir (relative: to workdir), checked by
                              * pre-flight; NULL: not a gpurun-train job */
    char *metrics_dir;       /* where every node's daemon keeps its Prometheus text file
                              * (gpurun --metrics-dir, metrics.h); NULL: none */
    char *output_ranks;      /* the ranks whose output the merged stream shows live, as
                              * --output-ranks gave them ("0,2-3", ranklist.h); NULL: every
                              * rank's. Every rank's log is whole either way */
    char *container_image;   /* the image every rank runs in (--container-image,
                              * container.h); NULL: none, ranks run on the host */
    char *container_mounts;  /* --container-mounts "SRC:DST[:ro|:rw],..."; NULL: none */
    char *container_workdir; /* the ranks' working directory inside; NULL: the image's */
    char *container_env;     /* --container-env: host-layout variables (PATH, HOME...)
                              * passed in all the same, "A,B"; NULL: none */
    char *container_runtime; /* --container-runtime's name; NULL: found on each node */
    char *name;              /* the job's name for people (gpurun -J, else its default: the
                              * train.cfg's job_name, the script's or the command's file name);
                              * NULL: none */
    int join_timeout_ms;     /* how long the leader waits for all agents */
    int hb_interval_ms;      /* heartbeat period, both ways */
    int hb_timeout_ms;       /* silence after which a peer counts as lost */
    int hang_timeout_ms;     /* no progress report for this long fails the job; 0: off */
    int hang_watch;          /* what hang_timeout watches: HANG_WATCH_REPORT or _OUTPUT */
    int term_cols;           /* the width of the terminal gpurun --wait shows a Slurm job's
                              * output on (the ranks' COLUMNS where their daemon's own output is
                              * no terminal); 0: none */
    int restart_on;          /* the failure classes max_restarts restarts: 1 << FAILURE_* bits */
    int preflight;           /* 1: each agent runs the pre-flight checks before it joins
                              * (preflight.h); 0: --preflight=off */
    int preflight_only;      /* 1: gpurun preflight: the checks alone, no rank started */
    int gpus_per_node;       /* GPUs each node must show (pre-flight); 0: none asked (--local) */
    int min_free_mb;         /* MiB the job dir's file system must have free (pre-flight) */
    int mem_ckpt_max_mb;     /* MiB of memory checkpoints a node keeps (daemon/memckpt.h);
                              * 0: a quarter of the node's memory */
    int min_gpu_free_pct;    /* percent of each GPU's memory that must be free (pre-flight,
                              * through NVML); 0: not checked */
    int straggler_pct;       /* a rank this many percent slower per step than the job's median is
                              * a straggler (leader.c); 0: not watched */
    int straggler_action;    /* STRAGGLER_REPORT, or STRAGGLER_REPLACE: a straggler's node gives
                              * its place to a spare at the next restart */
    int kill_grace_ms;       /* SIGTERM to SIGKILL */
    int max_restarts;        /* generations the leader may start after a failure */
    int gpu_bind;            /* GPU_BIND_NONE: every rank sees the node's GPUs (torchrun's way);
                              * GPU_BIND_SINGLE: rank n sees the n-th of them only */
    int preempt_signal;      /* the pre-timeout signal (SIGUSR1 unless --signal says otherwise) */
    int preempt_all;         /* 1: the user asked for --signal, so every rank gets it; 0: only the
                              * ranks that asked for it (gpurun.on_preempt, gr_on_preempt) */
    int time_limit_s;        /* the job's time limit (0: none): a SIGTERM at it is a timeout */
    int local_rank_arg;      /* LOCAL_RANK_ARG_*: each rank's command gets "--local_rank=N" (N its
                              * local rank) as torch.distributed.launch passes it; NONE: not */
    int local_rank_at;       /* where that word goes: before argv[local_rank_at] (at most argc) */
    int mpi_env;             /* 1: ranks get MPICH's and Intel MPI's PMI_RANK, PMI_SIZE,
                              * MPI_LOCALRANKID and MPI_LOCALNRANKS too (--mpi-env) */
    int horovod;             /* 1: the job uses horovod, and the leader serves its HTTP
                              * rendezvous (daemon/hvd.h) to the job's hosts; 0: no such port */
    bool loopback;           /* --local: the leader binds 127.0.0.1 only */

    /* 1: a job of several ranks that never met (daemon/together.h) fails */
    int require_rendezvous;
};

enum straggler_action { STRAGGLER_REPORT, STRAGGLER_REPLACE };

/* What a failure is (docs/design.md, section 4), for --restart-on and the records:
 *   user-error  a rank's exception or non-zero exit that nothing ties to its node
 *   node        the node: its daemon lost or silent, or a GPU or NCCL error a rank reports
 *   hang        --hang-timeout found the job stuck
 *   oom         a rank killed for memory
 *   signal      a rank killed by a signal (a crash, the OOM killer aside) */
enum failure_class {
    FAILURE_USER_ERROR,
    FAILURE_NODE,
    FAILURE_HANG,
    FAILURE_OOM,
    FAILURE_SIGNAL,
    FAILURE_CLASS_COUNT
};
/* By default every class but user-error: three restarts of a Python bug only burn the
 * allocation. */
#define RESTART_ON_DEFAULT                                                                         \
    ((1 << FAILURE_NODE) | (1 << FAILURE_HANG) | (1 << FAILURE_OOM) | (1 << FAILURE_SIGNAL))
#define RESTART_ON_ALL    ((1 << FAILURE_CLASS_COUNT) - 1)
/* The failures a spare can fix: those that take a node out of the job. */
#define RESTART_ON_SPARES ((1 << FAILURE_NODE) | (1 << FAILURE_HANG))

/* A class's name ("user-error"), or "?" out of range. */
const char *failure_class_name(int c);

/* jobspec.hang_watch: the ranks' progress reports (gpurun.report, gr_report), or their output
 * (any byte on stdout or stderr), for scripts that do not report. */
#define HANG_WATCH_REPORT 0
#define HANG_WATCH_OUTPUT 1

/* jobspec.local_rank_arg: the spelling of the argument (local_rank_arg_name()). */
enum local_rank_arg { LOCAL_RANK_ARG_NONE, LOCAL_RANK_ARG_UNDERSCORE, LOCAL_RANK_ARG_DASH };

/* "--local_rank" or "--local-rank" for a LOCAL_RANK_ARG_* other than NONE; NULL otherwise. */
const char *local_rank_arg_name(int a);

/* jobspec.gpu_bind: srun's --gpu-bind names. */
#define GPU_BIND_NONE   0
#define GPU_BIND_SINGLE 1

/* A spare serves only at a restart (docs/design.md, section 4), so K spares imply up to K
 * restarts of the failures a spare can fix (RESTART_ON_SPARES) where the user set neither
 * max_restarts (restarts_given: --max-restarts or a train.cfg's) nor restart_on
 * (restart_on_given: --restart-on; with it, its classes are kept). Fills note (n bytes) with
 * one line for the user: what was implied, or why the spares will never serve as asked;
 * "" when there is nothing to say (no spares). Returns true when it changed spec. */
bool jobspec_spare_restarts(struct jobspec *spec, bool restarts_given, bool restart_on_given,
                            char *note, size_t n);

/* Fills spec with the defaults of every key; argv and env empty. */
void jobspec_init(struct jobspec *spec);

/* Frees what spec owns; spec may be initialised again. */
void jobspec_release(struct jobspec *spec);

/* Reads path into spec (which must be initialised). Unknown keys, wrong types and values out
 * of range are errors. Returns 0, or a negative errno with err filled ("DIR/job.json: 'nnodes'
 * must be 1..65536"). */
int jobspec_load(struct jobspec *spec, const char *path, struct errmsg *err);

/* Writes spec to path atomically (temp file, fsync, rename, directory fsync), mode 0600.
 * Returns 0, -EINVAL when a string of spec is not UTF-8 (JSON cannot hold it; nothing is
 * written), or a negative errno. */
int jobspec_save(const struct jobspec *spec, const char *path);

/* Copies argc strings of argv (borrowed) into spec->argv. Returns 0 or -ENOMEM. */
int jobspec_set_argv(struct jobspec *spec, int argc, char *const *argv);

/* Appends "K=V" (borrowed, copied) to spec->env. Returns 0, -EINVAL without '=', -ENOMEM. */
int jobspec_add_env(struct jobspec *spec, const char *kv);

#endif
