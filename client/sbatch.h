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

/* The comment every gpurun job carries in Slurm, so that `gpurun status` can tell the user's
 * gpurun jobs from the others. A --comment follows it: "gpurun: TEXT" (see sbatch_comment). */
#define SBATCH_COMMENT "gpurun"

/* The longest --comment taken, far more than a person writes; with the marker it still fits
 * a buffer of SBATCH_COMMENT_LEN_MAX + 16 bytes. */
#define SBATCH_COMMENT_LEN_MAX 1024

/* Which memory option a job gives: sbatch's --mem, --mem-per-cpu and --mem-per-gpu exclude
 * each other. */
enum sbatch_mem_per { SBATCH_MEM_NONE, SBATCH_MEM_NODE, SBATCH_MEM_CPU, SBATCH_MEM_GPU };

/* --exclusive[=user|mcs]: whom the job's nodes may be shared with. */
enum sbatch_exclusive {
    SBATCH_SHARED_DEFAULT, /* the partition's OverSubscribe decides */
    SBATCH_EXCLUSIVE,      /* nobody */
    SBATCH_EXCLUSIVE_USER, /* the user's own jobs */
    SBATCH_EXCLUSIVE_MCS,  /* jobs of the same MCS label */
};

/* --mail-type's bits, Slurm's MAIL_* values (slurmlib.c checks them against slurm.h). */
#define SBATCH_MAIL_BEGIN          (1u << 0)
#define SBATCH_MAIL_END            (1u << 1)
#define SBATCH_MAIL_FAIL           (1u << 2)
#define SBATCH_MAIL_REQUEUE        (1u << 3)
#define SBATCH_MAIL_TIME100        (1u << 4)
#define SBATCH_MAIL_TIME90         (1u << 5)
#define SBATCH_MAIL_TIME80         (1u << 6)
#define SBATCH_MAIL_TIME50         (1u << 7)
#define SBATCH_MAIL_STAGE_OUT      (1u << 8)
#define SBATCH_MAIL_ARRAY_TASKS    (1u << 9)
#define SBATCH_MAIL_INVALID_DEPEND (1u << 10)

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
    enum sbatch_mem_per mem_per;     /* which of --mem, --mem-per-cpu, --mem-per-gpu; or none */
    unsigned long long mem_mb;       /* its size in MiB (0 with --mem: all of each node's) */
    enum sbatch_exclusive exclusive; /* --exclusive[=user|mcs] */
    const char *constraint;          /* --constraint: node features; or NULL */
    const char *dependency;          /* --dependency, checked by sbatch_check_dependency */
    const char *nodelist;            /* --nodelist: nodes the job must have; or NULL */
    const char *exclude;             /* --exclude: nodes it must not have; or NULL */
    const char *reservation;         /* --reservation; or NULL */
    const char *gres;                /* --gres besides the GPUs, "name[:type]:count,..." */
    const char *begin;               /* --begin as given (the directive); or NULL */
    long long begin_time;            /* --begin as a time_t (the descriptor) */
    bool hold;                       /* --hold: submitted with priority 0 */
    bool requeue;                    /* --requeue: Slurm may requeue it (preemption) */
    bool no_kill;     /* --no-kill, and srun's: a node's failure ends neither the job nor its step
                       * (the job has hot spares to take its place) */
    int max_requeues; /* --max-requeues: the script requeues a job whose ranks
                       * checkpointed on the pre-timeout signal, while
                       * SLURM_RESTART_COUNT is below it */
    const char *comment;        /* --comment: follows SBATCH_COMMENT; or NULL */
    unsigned mail_type;         /* SBATCH_MAIL_* bits; 0: none asked */
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

/* Parses a memory size as sbatch does: a whole number with an optional unit K, M, G or T
 * (either case, a 'B' may follow), M by default; K rounds up to whole MiB. Returns 0 with
 * *mb, -EINVAL (not a size) or -ERANGE (too large). */
int sbatch_parse_mem(const char *s, unsigned long long *mb);

/* Writes mb as the largest unit that holds it whole ("64G", "1536M") into buf (n bytes). */
void sbatch_format_mem(char *buf, size_t n, unsigned long long mb);

/* Parses --mail-type: a comma-separated list of sbatch's words (NONE, BEGIN, END, FAIL,
 * REQUEUE, ALL, INVALID_DEPEND, STAGE_OUT, TIME_LIMIT, TIME_LIMIT_90, TIME_LIMIT_80,
 * TIME_LIMIT_50, ARRAY_TASKS; either case). Returns the SBATCH_MAIL_* bits (0 for NONE), or
 * -EINVAL with *bad (n bytes) holding the first word that is none of them. */
int sbatch_parse_mail_type(const char *s, char *bad, size_t n);

/* Checks a --dependency value's syntax as slurmctld reads it: "singleton", or
 * TYPE:ID[:ID...] with TYPE after, afterany, afterburstbuffer, aftercorr, afternotok or
 * afterok, ID a job id (with _TASK for an array task, and "+MINUTES" for after), the items
 * joined by ',' (all of them) or '?' (any of them), not both. Returns 0 or -EINVAL with why
 * (the caller's) saying what is wrong. */
int sbatch_check_dependency(const char *s, struct errmsg *why);

/* The longest --gres taken: dozens of items; with "gres:" before each and the GPUs it fits
 * 4 * SBATCH_GRES_LEN_MAX bytes. */
#define SBATCH_GRES_LEN_MAX 256

/* Checks a --gres value: "name[:type][:count]" items joined by ',', none of them "gpu" (the
 * GPUs are --gpus-per-node's), SBATCH_GRES_LEN_MAX bytes at most. Returns 0 or -EINVAL with
 * why (the caller's) filled. */
int sbatch_check_gres(const char *s, struct errmsg *why);

/* The longest GPU type taken from --gres gpu:TYPE:N ("a100", "h100_80gb"...). */
#define SBATCH_GPU_TYPE_MAX 63

/* sbatch's habit of asking for GPUs by --gres: s's "gpu[:TYPE][:N]" item ("gres:" or "gres/"
 * before it too; N 1 when left out) taken out of the list, its N into *gpus (0: s has no GPU
 * item) and its TYPE into type (tn bytes; "" for none), the other items into rest (rn bytes,
 * at least SBATCH_GRES_LEN_MAX + 1; "" for none), unchecked (sbatch_check_gres). Returns 0 or
 * -EINVAL with why filled: two GPU items, an N that is not a whole number from 1 to 1024, a
 * TYPE longer than SBATCH_GPU_TYPE_MAX or with other than letters, digits, '_', '-', '.'. */
int sbatch_split_gres(const char *s, int *gpus, char *type, size_t tn, char *rest, size_t rn,
                      struct errmsg *why);

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
