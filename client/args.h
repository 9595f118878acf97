/* gpurun's command line: the subcommands and options as table rows, parsed into one struct.
 * Option names follow sbatch/srun; every number is checked for syntax and range. */
#ifndef GPURUN_CLIENT_ARGS_H
#define GPURUN_CLIENT_ARGS_H

#include <stdbool.h>
#include <stdio.h>

#include "jobspec.h"
#include "log.h"

#define GPURUN_VERSION "0.1.0"

/* Exit statuses of gpurun's own failures, timeout(1)'s convention (DESIGN.md section 1). */
#define EXIT_TIMED_OUT  124
#define EXIT_FAILED     125
#define EXIT_CANNOT_RUN 126
#define EXIT_NOT_FOUND  127

enum gpurun_cmd { CMD_RUN, CMD_STATUS, CMD_LOGS, CMD_CANCEL, CMD_COUNT };

/* The most "section.key=value" overrides one command line may carry. */
#define ARGS_MAX_OVERRIDES 64

/* What the command line says. Strings are borrowed from the argv given to args_parse(); the
 * spec's env (from --export) is owned by the spec. */
struct gpurun_args {
    enum gpurun_cmd cmd;
    struct jobspec spec;        /* nnodes, nprocs, timeouts, max_restarts and env; job_id and
                                 * argv unset */
    long time_limit_s;          /* -t/--time; 0: none */
    const char *partition;      /* -p */
    const char *account;        /* -A */
    const char *job_name;       /* -J */
    const char *output;         /* -o: where the merged stream goes; NULL: the terminal (local)
                                 * or the job dir's neighbour JOBID.out (Slurm) */
    const char *job_dir;        /* --job-dir; NULL: the default */
    const char *log_level_name; /* --log-level as given (validated); "warn" by default */
    enum log_level log_level;
    int cpus_per_gpu; /* CPUs Slurm gives each rank */
    bool no_gpus;     /* ask Slurm for no GPUs (CPU ranks) */
    bool local;
    bool emit_sbatch; /* print the batch script instead of submitting it */
    bool wait;        /* stay until the Slurm job ends, streaming its output */
    bool help;
    bool version;
    bool json;          /* status --json */
    bool watch;         /* status --watch */
    bool follow;        /* logs -f */
    int rank;           /* logs --rank; -1: every rank */
    const char *target; /* run: the train.cfg; status/logs/cancel: the JOBID; or NULL */
    char **cmd_argv;    /* run: the command after "--", NULL-terminated; or NULL */
    int cmd_argc;
    const char *overrides[ARGS_MAX_OVERRIDES]; /* run: "section.key=value" words, in order */
    int n_overrides;
    unsigned long long given; /* bit i: the i-th option row was on the command line */
};

/* One line of what went wrong, without the "gpurun: " prefix:
 * "--nodes: 'abc' is not a number". */
struct args_error {
    char text[320];
};

/* Fills args with the defaults: one node, one rank per node, jobspec's timeouts. */
void args_init(struct gpurun_args *args);

/* Frees what args owns (the spec's env); args may be initialised again. */
void args_release(struct gpurun_args *args);

/* Parses argv[1..argc) (argv borrowed: it must outlive args) into args, which must be
 * initialised. A first argument naming a subcommand selects it. Returns 0, or -EINVAL with
 * err filled for an unknown option, a bad or missing value, an option the subcommand does
 * not take, or a stray argument. A run without a command is not an error here (see
 * args.help / args.target / args.cmd_argv). */
int args_parse(struct gpurun_args *args, int argc, char **argv, struct args_error *err);

/* Parses a Slurm time limit ("minutes", "minutes:seconds", "hours:minutes:seconds",
 * "days-hours", "days-hours:minutes", "days-hours:minutes:seconds", or "UNLIMITED") into
 * seconds (0 for UNLIMITED). Returns 0 or -EINVAL. */
int args_parse_time(const char *s, long *seconds);

/* Whether the option named long_name ("nodes") was given on the command line, so that a
 * train.cfg's [job] value applies only where no flag overrides it. */
bool args_given(const struct gpurun_args *args, const char *long_name);

/* Writes the help of cmd to out: usage line, then one line per option row it takes. */
void args_usage(FILE *out, enum gpurun_cmd cmd);

/* The name of a subcommand ("status"; "gpurun" for CMD_RUN). */
const char *args_cmd_name(enum gpurun_cmd cmd);

#endif
