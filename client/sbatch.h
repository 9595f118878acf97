/* The batch script of a Slurm job: what gpurun submits and what --emit-sbatch prints, the same
 * text. Its #SBATCH directives say what slurmlib_fill_desc() puts in the job descriptor (a
 * test holds the two together); its body makes the job dir with a fresh key, then starts one
 * rendezvousd per node with srun. Pure text: no libslurm here. */
#ifndef GPURUN_CLIENT_SBATCH_H
#define GPURUN_CLIENT_SBATCH_H

#include <stdbool.h>
#include <stddef.h>

/* The comment every gpurun job carries in Slurm, so that `gpurun status` can tell the user's
 * gpurun jobs from the others. */
#define SBATCH_COMMENT "gpurun"

/* What a job asks of Slurm and what its script runs. Strings are borrowed. */
struct sbatch_job {
    const char *job_name;    /* never NULL */
    int nodes;               /* one rendezvousd each */
    int ranks_per_node;      /* for the script's header comment */
    int gpus_per_node;       /* GRES gpu per node; 0: none asked */
    int cpus_per_task;       /* the node's one task: CPUs for all its ranks */
    long time_limit_min;     /* minutes; 0: the partition's limit */
    int signal_before_s;     /* SIGUSR1 to the batch shell this long before the limit; 0: none */
    const char *signal_text; /* the user's --signal as given (replaces the one above); or NULL */
    int preempt_signal;      /* the signal the script passes on to the leader (SIGUSR1, or
                              * --signal's): its number */
    int signal_time_s;       /* --signal's: seconds before the limit */
    bool signal_batch_only;  /* --signal's "B:" */
    bool signal_reservation; /* --signal's "R:" */
    const char *partition;   /* NULL: the cluster's default */
    const char *account;     /* NULL: the user's default */
    const char *output;      /* the batch output (sbatch --output pattern, %j...); absolute */
    const char *work_dir;    /* absolute: the job's and the ranks' working directory */
    const char *rendezvousd; /* absolute path, the default of $GPURUN_RENDEZVOUSD */
    const char *jobs_root;   /* absolute: the default of $GPURUN_JOBS, the job dir's parent */
    const char *job_dir;     /* absolute: a fixed job dir (--job-dir); NULL: jobs_root/JOBID */
    const char *log_level;   /* the daemons' --log-level */
    const char *spec_json;   /* job.json's text with "job_id": "" (filled in at run time) */
    char *const *argv;       /* the ranks' command, NULL-terminated, for the header comment */
};

/* One line: "--job-name: 'a"b' cannot be written as an #SBATCH directive". */
struct sbatch_error {
    char text[512];
};

/* Renders the script of job into *out (new, NUL-terminated; caller frees). Returns 0, -EINVAL
 * with err filled when a value cannot be written into a directive (a quote or a control
 * character) or the spec lacks the empty job_id, -ENOMEM. */
int sbatch_render(const struct sbatch_job *job, char **out, struct sbatch_error *err);

/* Slurm's time limit in whole minutes for a limit of seconds, rounded up as sbatch does
 * (90 s -> 2); 0 stays 0 (no limit). */
long sbatch_time_minutes(long seconds);

/* How long before the time limit (minutes; 0: unknown) the pre-timeout signal goes out: 120 s,
 * or a quarter of a limit shorter than 8 minutes, so that a short job is not signalled at
 * its start. */
int sbatch_signal_before(long time_limit_min);

/* Writes a time limit of minutes as sbatch's "[D-]HH:MM:00" to buf (n bytes). */
void sbatch_format_time(char *buf, size_t n, long minutes);

#endif
