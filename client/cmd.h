/* gpurun's subcommands, one file each (cmd_run.c, cmd_status.c, cmd_logs.c, cmd_cancel.c,
 * cmd_clean.c, cmd_help.c, cmd_rerun.c, cmd_preflight.c), and what their command-line bodies share
 * (cmd.c): the error line, the jobs root with the message of why there is none, which job a command
 * means, a job's default name, opening Slurm.
 * Internal to gpurun: main.c's table of subcommands calls these. */
#ifndef GPURUN_CLIENT_CMD_H
#define GPURUN_CLIENT_CMD_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "args.h"

/* How long slurmctld has to answer gpurun's first call before gpurun says it is down. A
 * controller that is up answers in milliseconds; libslurm itself would retry for
 * MessageTimeout (10 s by default) before giving up. */
#define OPEN_SLURM_TIMEOUT_S 3

/* A subcommand: runs what args (parsed by args_parse; the command may fill in more of it)
 * asks. Returns gpurun's exit status, its failures printed as "gpurun: ..." lines on stderr.
 * Sets *fatal_signal (0 on entry) to a signal that stopped the job, which gpurun dies of once
 * it has cleaned up; only run's jobs take signals. Thread context: the process's only thread. */
typedef int cmd_fn(struct gpurun_args *args, int *fatal_signal);

cmd_fn cmd_run;       /* gpurun [options] CMD...: a job, on Slurm or with --local here */
cmd_fn cmd_status;    /* gpurun status [JOBID]: one job's view, or the list of jobs */
cmd_fn cmd_logs;      /* gpurun logs JOBID: its rank logs, -f while it runs */
cmd_fn cmd_cancel;    /* gpurun cancel JOBID: ends it, and waits for its processes */
cmd_fn cmd_clean;     /* gpurun clean: removes the job dirs of ended jobs */
cmd_fn cmd_help;      /* gpurun help [SUBCOMMAND]: gpurun's help, or the subcommand's */
cmd_fn cmd_preflight; /* gpurun preflight: the pre-flight checks alone, a line per node */
cmd_fn cmd_rerun;     /* gpurun rerun JOBID: submits an ended Slurm job's batch script again */

/* Prints "gpurun: <text>" to stderr and returns status, for "return error_out(125, ...)". */
int error_out(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The default name of a job running argv (argc words, borrowed) into buf (n bytes): the file
 * name of its first word that ends in ".py" (the script of "python3 train.py"), else of the
 * command. */
void job_default_name(char *buf, size_t n, char *const *argv, int argc);

/* jobdir_root() into buf (n bytes). Returns 0, or EXIT_FAILED with the message of why there
 * is no jobs root printed. */
int jobs_root(char *buf, size_t n);

/* The job a status, logs, cancel or rerun command means. */
struct target {
    char id[256];   /* the job's id: Slurm's, or a local job's */
    uint32_t slurm; /* the Slurm id; 0: a local job */
    char dir[PATH_MAX];
    bool has_dir; /* dir exists (a pending Slurm job has none yet) */
};

/* Fills t from --job-dir or JOBID. A numeric id is a Slurm job, whose dir may not exist yet;
 * any other id must name a job dir (a local job's, or the link to one) in the jobs root. The
 * dir is given with its links resolved. Returns 0, or EXIT_FAILED with the error printed. */
int resolve_target(const struct gpurun_args *args, struct target *t);

/* As resolve_target, but with neither a JOBID nor --job-dir, the newest job: the job dir of
 * the jobs root whose job.json is the newest (gpurun status's list, a pending Slurm job
 * aside), which a line on stderr names. Returns 0, or EXIT_FAILED with the error printed. */
int resolve_newest(const struct gpurun_args *args, struct target *t);

/* t->dir with its links resolved: a local job run with --job-dir is linked from the jobs
 * root by its id, and its real place is what a person wants to see. Left as it is when it
 * cannot be resolved. */
void resolve_dir(struct target *t);

/* Opens libslurm for a command (slurmlib_open, OPEN_SLURM_TIMEOUT_S). Returns 0, or
 * EXIT_FAILED with the one line of why not printed. */
int open_slurm(void);

#endif
