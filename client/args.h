/* gpurun's command line: the subcommands and options as table rows, parsed into one struct.
 * Option names follow sbatch/srun; every number is checked for syntax and range. */
#ifndef GPURUN_CLIENT_ARGS_H
#define GPURUN_CLIENT_ARGS_H

#include <stdbool.h>
#include <stdio.h>

#include "errmsg.h"
#include "jobspec.h"
#include "log.h"
#include "slurmopt.h"

/* Exit statuses of gpurun's own failures, timeout(1)'s convention (docs/design.md, section 1). */
#define EXIT_TIMED_OUT  124
#define EXIT_FAILED     125
#define EXIT_CANNOT_RUN 126
#define EXIT_NOT_FOUND  127

enum gpurun_cmd {
    CMD_RUN,
    CMD_STATUS,
    CMD_LOGS,
    CMD_CANCEL,
    CMD_CLEAN,
    CMD_HELP,
    CMD_RERUN,
    CMD_PREFLIGHT,
    CMD_COUNT
};

/* The most "section.key=value" overrides one command line may carry. */
#define ARGS_MAX_OVERRIDES 64

/* 64-bit words of gpurun_args.given: one bit per option row. */
#define ARGS_GIVEN_WORDS 2

/* What the command line says. Strings are borrowed from the argv given to args_parse(); the
 * spec's env (from --export) is owned by the spec. */
struct gpurun_args {
    enum gpurun_cmd cmd;
    struct jobspec spec;      /* nnodes, nprocs, timeouts, max_restarts, env, gpu_bind and,
                               * with --signal, preempt_signal and preempt_all; job_id,
                               * argv, name and time_limit_s unset */
    long time_limit_s;        /* -t/--time; 0: none (given as 0 or UNLIMITED: none asked of
                               * Slurm either, see args_time_unlimited) */
    const char *partition;    /* -p */
    const char *account;      /* -A */
    const char *job_name;     /* -J; NULL: the run's default (see gpurun --help) */
    const char *output;       /* -o: where the merged stream goes; NULL: the terminal (local)
                               * or the job dir's neighbour JOBID.out (Slurm) */
    const char *job_dir;      /* --job-dir; NULL: the default */
    const char *metrics_dir;  /* --metrics-dir; NULL: no metrics files */
    const char *output_ranks; /* --output-ranks as given (checked against the job's ranks by
                               * the run: ranklist.h); NULL: every rank's output shown */
    /* sbatch's options with sbatch's meaning (struct sbatch_job says what each asks); NULL,
     * 0 or false: not given. */
    const char *qos;               /* -q */
    enum slurmopt_mem_per mem_per; /* --mem, --mem-per-cpu or --mem-per-gpu, whichever given */
    unsigned long long mem_mb;     /* its size in MiB */
    int exclusive;                 /* --exclusive[=user|mcs]: an enum slurmopt_exclusive */
    const char *constraint;        /* -C */
    const char *dependency;        /* -d, its syntax checked */
    const char *nodelist;          /* -w */
    const char *exclude;           /* -x */
    const char *reservation;       /* --reservation */
    const char *gres;              /* --gres without its GPU item (gres_rest), checked; NULL:
                                    * none, or only GPUs */
    int gres_gpus;                 /* --gres gpu[:TYPE]:N's N, a count per node as
                                    * --gpus-per-node; 0: none */
    char gpu_type[SLURMOPT_GPU_TYPE_MAX + 1];  /* its TYPE; "": any */
    char gres_rest[SLURMOPT_GRES_LEN_MAX + 1]; /* the other items of --gres */
    const char *begin;                         /* --begin as given: slurmlib_parse_begin reads it */
    bool hold;                                 /* -H */
    bool requeue;                              /* --requeue */
    bool no_requeue;                           /* --no-requeue */
    int max_requeues;                          /* --max-requeues */
    const char *chdir;          /* -D as given (relative to gpurun's working directory) */
    const char *comment;        /* --comment */
    unsigned mail_type;         /* --mail-type's SLURMOPT_MAIL_* bits */
    const char *mail_type_text; /* --mail-type as given */
    const char *mail_user;      /* --mail-user */
    const char *log_level_name; /* --log-level as given (validated); "warn" by default */
    enum log_level log_level;
    int cpus_per_gpu; /* CPUs Slurm gives each rank */
    bool no_gpus;     /* ask Slurm for no GPUs (CPU ranks) */
    /* sbatch's counts, read in gpurun's model (one rank per GPU) into spec.nnodes and
     * spec.nprocs once the command line is parsed; 0: not given. */
    int ntasks;          /* -n: ranks in all */
    int ntasks_per_node; /* --ntasks-per-node: ranks per node, as --gpus-per-node */
    int gpus;            /* -G: GPUs in all, so ranks in all */
    int gpus_per_task;   /* --gpus-per-task: only 1, gpurun's model */
    const char *python;  /* --python: the interpreter of a SCRIPT.py; NULL: the default */
    /* --container-image, -mounts, -workdir, -env, -runtime as given (checked by cmd_run,
     * container.h); NULL: not given */
    const char *container_image, *container_mounts, *container_workdir, *container_env,
        *container_runtime;
    /* --require-rendezvous: spec.require_rendezvous */
    bool require_rendezvous;
    bool use_env; /* --use-env (torch.distributed.launch's): taken, nothing to do */
    bool mpi_env; /* --mpi-env: spec.mpi_env */
    int horovod;  /* --horovod[=on|off|auto]: an enum horovod_choice (horovod.h) */
    bool local;
    bool emit_sbatch; /* print the batch script instead of submitting it */
    bool wait;        /* stay until the Slurm job ends, streaming its output */
    bool help;
    bool version;
    bool json;                     /* status --json */
    bool all;                      /* status --all: every job, not the most recent */
    bool dry_run;                  /* clean --dry-run */
    int older_than_days;           /* clean --older-than; 0: any ended job */
    bool watch;                    /* status --watch */
    bool follow;                   /* logs -f */
    int rank;                      /* logs --rank; -1: every rank */
    struct slurmopt_signal signal; /* --signal */
    const char *target;            /* run: the train.cfg; status/logs/cancel/rerun: the JOBID; help:
                                    * the SUBCOMMAND; or NULL */
    enum gpurun_cmd help_cmd; /* help: the subcommand whose help to print (CMD_RUN: gpurun's) */
    const char *script;       /* run: the first positional word ending in ".py" (torchrun's
                               * "train.py ARGS..."), or the first word after "--" when it
                               * ends in ".py": run by the ranks as "PYTHON SCRIPT ARGS..."
                               * (cmd_run.c says which Python); it and every word after it
                               * are in cmd_argv; or NULL */
    char **cmd_argv;          /* run: the command after "--", or the script and its arguments;
                               * NULL-terminated; or NULL */
    int cmd_argc;
    const char *overrides[ARGS_MAX_OVERRIDES]; /* run: "section.key=value" words, in order */
    int n_overrides;
    char *ran_dir; /* run: the job dir of the job that ran (--local) or was followed to its
                    * end (--wait); NULL: none (malloc'd) */
    unsigned long long given[ARGS_GIVEN_WORDS]; /* bit i: the i-th option row was given */
};

/* A failure below fills the caller's struct errmsg with one line of what went wrong, without
 * the "gpurun: " prefix: "--nodes: 'abc' is not a number". */

/* Fills args with the defaults: one node, one rank per node, jobspec's timeouts. */
void args_init(struct gpurun_args *args);

/* Frees what args owns (the spec's env); args may be initialised again. */
void args_release(struct gpurun_args *args);

/* Parses argv[1..argc) (argv borrowed: it must outlive args) into args, which must be
 * initialised. A first argument naming a subcommand selects it. Long options may also be
 * spelt as torchrun spells them (--nproc-per-node, --nnodes; '_' for '-'), with the same
 * checks. sbatch's counts (-n/--ntasks, --ntasks-per-node, -G/--gpus, --gpus-per-task) are
 * read in gpurun's model, one rank per GPU: they set spec.nnodes and spec.nprocs (and count
 * as -N and --gpus-per-node given) or are refused with what to write instead. Returns 0, or
 * -EINVAL with err filled for an unknown option (with the nearest option's name when one is
 * close), a bad or missing value, counts that disagree or cannot be split evenly over the
 * nodes, an option the subcommand does not take, a stray argument, or a first argument that
 * is neither a subcommand nor an existing file but is close to a subcommand's name ("did you
 * mean 'status'?"): the only check that looks at the filesystem. A run without a command is
 * not an error here (see args.help / args.target / args.script / args.cmd_argv). */
int args_parse(struct gpurun_args *args, int argc, char **argv, struct errmsg *err);

/* Applies sbatch's input environment variables (SBATCH_PARTITION, SBATCH_TIMELIMIT... the
 * ones of options gpurun has: see README.md, "On Slurm") from envp (borrowed,
 * NULL-terminated "NAME=VALUE" strings, e.g. environ; it must outlive args) to the options no
 * flag gave, with the flags' checks, as sbatch does: a flag beats a variable. A memory flag
 * (--mem, --mem-per-cpu, --mem-per-gpu) beats every memory variable. Each option a variable
 * sets counts as given (args_given), so that it beats a train.cfg's [job] value. Returns 0, or
 * -EINVAL with err naming the variable ("SBATCH_MEM_PER_NODE: '10X' is not a size ..."). */
int args_apply_env(struct gpurun_args *args, char *const *envp, struct errmsg *err);

/* Writes the variables args_apply_env reads, and their options, one "  NAME  --option" line
 * each, to out. */
void args_env_usage(FILE *out);

/* Whether the option named long_name ("nodes") was given on the command line or by an sbatch
 * variable (args_apply_env), so that a train.cfg's [job] value applies only where neither
 * says otherwise. */
bool args_given(const struct gpurun_args *args, const char *long_name);

/* The long name of the first option given that only Slurm acts on (--partition, --mem...),
 * or NULL: --local says it ignores them. */
const char *args_slurm_only_given(const struct gpurun_args *args);

/* Writes the help of cmd to out: usage line, then one line per option row it takes; gpurun's
 * own (CMD_RUN) also lists the subcommands, one line each. */
void args_usage(FILE *out, enum gpurun_cmd cmd);

/* The name of a subcommand ("status"; "gpurun" for CMD_RUN). */
const char *args_cmd_name(enum gpurun_cmd cmd);

#endif
