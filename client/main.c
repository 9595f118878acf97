/* gpurun: launches distributed jobs (docs/design.md, section 1). main() parses the command line
 * (args.c) and runs the subcommand's row of the table below. Each subcommand's body is its
 * cmd_X.c (cmd.h); the parts they use are the other files: local.c runs a job here, sbatch.c
 * writes the batch script, slurmlib.c talks to Slurm, follow.c follows a Slurm job, view.c
 * and status.c make the status, logs.c the logs, jobdir.c the job dirs and where they live. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <unistd.h>

#include <uv.h>

#include "args.h"
#include "version.h"
#include "cmd.h"
#include "log.h"
#include "banned.h"

/* The subcommands, as git's builtin table: args_parse() finds the row a command line names
 * (args.c's own rows give each subcommand's name, usage and options) and main() runs it.
 * Adding a subcommand is a row here, a row in args.c and its cmd_X.c. */
static cmd_fn *const subcommands[CMD_COUNT] = {
    [CMD_RUN] = cmd_run,       [CMD_STATUS] = cmd_status,       [CMD_LOGS] = cmd_logs,
    [CMD_CANCEL] = cmd_cancel, [CMD_CLEAN] = cmd_clean,         [CMD_HELP] = cmd_help,
    [CMD_RERUN] = cmd_rerun,   [CMD_PREFLIGHT] = cmd_preflight,
};

/* Ends gpurun by the signal it received, once its daemons are gone, so that its parent sees
 * what happened (a shell stops a loop on a child killed by SIGINT, not on exit 130). */
static int die_of(int sig)
{
    sigset_t set;

    fflush(NULL);
    signal(sig, SIG_DFL);
    sigemptyset(&set);
    sigaddset(&set, sig);
    raise(sig);
    sigprocmask(SIG_UNBLOCK, &set, NULL);
    return 128 + sig;
}

int main(int argc, char **argv)
{
    struct gpurun_args args;
    struct errmsg err;
    int ret, fatal_signal = 0;

    args_init(&args);
    if (args_parse(&args, argc, argv, &err) < 0) {
        ret = error_out(EXIT_FAILED, "%s", err.text);
        goto out;
    }
    log_setup("gpurun", STDERR_FILENO, args.log_level);
    if (args.help) {
        args_usage(stdout, args.cmd);
        ret = 0;
    } else if (args.version) {
        printf("gpurun %s\n", GPURUN_VERSION);
        ret = 0;
    } else {
        ret = subcommands[args.cmd](&args, &fatal_signal);
    }
    if (fflush(stdout) != 0 && !ret)
        ret = error_out(EXIT_FAILED, "cannot write to stdout: %s", uv_strerror(-errno));
out:
    args_release(&args);
    if (fatal_signal)
        ret = die_of(fatal_signal);
    return ret;
}
