/* The batch script of a Slurm job: what gpurun submits and what --emit-sbatch prints, the same
 * text. Its #SBATCH directives say what slurmlib_fill_desc() puts in the job descriptor (a
 * test holds the two together); its body makes the job dir with a fresh key, then starts one
 * rendezvousd per node with srun. Pure text: no libslurm here. */
#ifndef GPURUN_CLIENT_SBATCH_H
#define GPURUN_CLIENT_SBATCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "errmsg.h"
#include "slurmopt.h"

/* The comment every gpurun job carries in Slurm, so that `gpurun status` can tell the user's
 * gpurun jobs from the others. A --comment follows it: "gpurun: TEXT" (see sbatch_comment). */
#define SBATCH_COMMENT "gpurun"

/* The longest --comment taken, far more than a person writes; with the marker it still fits
 * a buffer of SBATCH_COMMENT_LEN_MAX + 16 bytes. */
#define SBATCH_COMMENT_LEN_MAX 1024

/* sbatch_job.time_limit_min of a job that asks for no time limit. */
#define SBATCH_TIME_UNLIMITED (-1L)

/* What a job asks of Slurm and what its script runs. Strings are borrowed. */
struct sbatch_job {
    const char *job_name;          /* never NULL */
    int nodes;                     /* one rendezvousd each */
    int ranks_per_node;            /* for the script's header comment */
    const char *container_image;   /* the header comment's too: the ranks' image; NULL: none */
    const char *container_runtime; /* and its runtime as named; NULL: each node's own */
    int gpus_per_node;             /* GRES gpu per node; 0: none asked */
    const char *gpu_type;          /* their type (--gres gpu:TYPE:N); NULL: any */
    int cpus_per_task;             /* the node's one task: CPUs for all its ranks */
    long time_limit_min;           /* minutes; 0: the partition's limit; SBATCH_TIME_UNLIMITED: none
                                    * (sbatch's --time=0 or UNLIMITED, Slurm's INFINITE) */
    int signal_before_s;     /* SIGUSR1 to the batch shell this long before the limit; 0: none */
    const char *signal_text; /* the user's --signal as given (replaces the one above); or NULL */
    int preempt_signal;      /* the signal the script passes on to the leader (SIGUSR1, or
                              * --signal's): its number */
    int signal_time_s;       /* --signal's: seconds before the limit */
    bool signal_batch_only;  /* --signal's "B:" */
    bool signal_reservation; /* --signal's "R:" */
    const char *partition;   /* NULL: the cluster's default */
    const char *account;     /* NULL: the user's default */
    const char *qos;         /* --qos; NULL: the association's default */
    enum slurmopt_mem_per mem_per;     /* which of --mem, --mem-per-cpu, --mem-per-gpu; or none */
    unsigned long long mem_mb;         /* its size in MiB (0 with --mem: all of each node's) */
    enum slurmopt_exclusive exclusive; /* --exclusive[=user|mcs] */
    const char *constraint;            /* --constraint: node features; or NULL */
    const char *dependency;            /* --dependency, checked by slurmopt_check_dependency */
    const char *nodelist;              /* --nodelist: nodes the job must have; or NULL */
    const char *exclude;               /* --exclude: nodes it must not have; or NULL */
    const char *reservation;           /* --reservation; or NULL */
    const char *gres;                  /* --gres besides the GPUs, "name[:type]:count,..." */
    const char *begin;                 /* --begin as given (the directive); or NULL */
    long long begin_time;              /* --begin as a time_t (the descriptor) */
    bool hold;                         /* --hold: submitted with priority 0 */
    bool requeue;                      /* --requeue: Slurm may requeue it (preemption) */
    bool no_kill;     /* --no-kill, and srun's: a node's failure ends neither the job nor its step
                       * (the job has hot spares to take its place) */
    int max_requeues; /* --max-requeues: the script requeues a job whose ranks
                       * checkpointed on the pre-timeout signal, while
                       * SLURM_RESTART_COUNT is below it */
    const char *comment;        /* --comment: follows SBATCH_COMMENT; or NULL */
    unsigned mail_type;         /* SLURMOPT_MAIL_* bits; 0: none asked */
    const char *mail_type_text; /* --mail-type as given (the directive) */
    const char *mail_user;      /* --mail-user; or NULL */
    const char *output;         /* the batch output (sbatch --output pattern, %j...); absolute */
    const char *work_dir;       /* absolute: the job's and the ranks' working directory */
    const char *rendezvousd;    /* absolute path, the default of $GPURUN_RENDEZVOUSD */
    const char *jobs_root;      /* absolute: the default of $GPURUN_JOBS, the job dir's parent */
    const char *job_dir;        /* absolute: a fixed job dir (--job-dir); NULL: jobs_root/JOBID */
    const char *log_level;      /* the daemons' --log-level */
    const char *spec_json;      /* job.json's text with "job_id": "" (filled in at run time) */
    char *const *argv;          /* the ranks' command, NULL-terminated, for the header comment */
};

/* A failure below fills the caller's struct errmsg with one line: "--job-name: 'a"b' cannot be
 * written as an #SBATCH directive". */

/* Renders the script of job into *out (new, NUL-terminated; caller frees). Returns 0, -EINVAL
 * with err filled when a value cannot be written into a directive (a quote or a control
 * character) or the spec lacks the empty job_id, -ENOMEM. */
int sbatch_render(const struct sbatch_job *job, char **out, struct errmsg *err);

/* The comment of a job with a user's comment (or NULL): "gpurun" alone, or "gpurun: TEXT",
 * into buf (n bytes). Returns buf. */
const char *sbatch_comment(const char *user, char *buf, size_t n);

/* Whether a job's Slurm comment marks it as gpurun's: "gpurun", or "gpurun: ..." */
bool sbatch_is_gpurun_comment(const char *comment);

/* Reads a batch script back into the job it asks Slurm for: the inverse of sbatch_render's
 * directives, so that a job can be submitted again from the copy of its script its job dir
 * keeps (job.sbatch). text is modified (each value is cut out of it in place) and must
 * outlive job, whose strings point into it. Directives are read up to the script's first
 * command, as sbatch reads them; the body gives job_dir where it is fixed (--job-dir; NULL
 * where the script makes $GPURUN_JOBS/<job id>). A --signal directive (gpurun's default
 * "B:USR1@N" too) fills signal_text and its parts. Fields nothing in the script sets are 0:
 * ranks_per_node, rendezvousd, jobs_root, log_level, spec_json, argv and max_requeues (the
 * script's own body acts on these), and begin_time (slurmlib_parse_begin reads begin).
 * Returns 0, or -EINVAL with err filled for a directive gpurun does not write or a value it
 * would not ("line 3: '--frob' is not a directive gpurun writes"), or a script without
 * --nodes and --job-name. */
int sbatch_parse(char *text, struct sbatch_job *job, struct errmsg *err);

/* Writes s (borrowed) as one shell word to f: bare when it is plain, else in single quotes
 * with each ' written as '\''. */
void sbatch_shell_word(FILE *f, const char *s);

/* Slurm's time limit in whole minutes for a limit of seconds, rounded up as sbatch does
 * (90 s -> 2); 0 stays 0 (no limit). */
long sbatch_time_minutes(long seconds);

/* How long before the time limit (minutes; 0 or less: unknown or none) the pre-timeout signal
 * goes out: 120 s,
 * or a quarter of a limit shorter than 8 minutes, so that a short job is not signalled at
 * its start. */
int sbatch_signal_before(long time_limit_min);

/* Writes a time limit of minutes as sbatch's "[D-]HH:MM:00" to buf (n bytes). */
void sbatch_format_time(char *buf, size_t n, long minutes);

#endif
