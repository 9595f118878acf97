/* gpurun: launches distributed jobs (DESIGN.md section 1). main() parses the command line
 * and hands it to the subcommand's row; the work lives in the client modules. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pwd.h>
#include <stdarg.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <uv.h>

#include "args.h"
#include "jobdir.h"
#include "local.h"
#include "logs.h"
#include "status.h"
#include "banned.h"

/* How long status waits for the leader at each step: it answers from its event loop at once,
 * so seconds mean it is stuck or gone. */
#define STATUS_TIMEOUT_MS 5000

static int error_out(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prints "gpurun: <text>" to stderr and returns status, for "return error_out(125, ...)". */
static int error_out(int status, const char *fmt, ...)
{
    char line[2048];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    fprintf(stderr, "gpurun: %s\n", line);
    return status;
}

static const char *home_dir(void)
{
    const char *home = getenv("HOME");
    struct passwd *pw;

    if (home && *home)
        return home;
    pw = getpwuid(getuid());
    return pw ? pw->pw_dir : NULL;
}

/* The job dir a status/logs/cancel command means: --job-dir, else the local job JOBID's. */
static int target_dir(const struct gpurun_args *args, char *buf, size_t n)
{
    const char *home = home_dir();
    char spec[PATH_MAX + 16];
    struct stat st;

    if (args->job_dir) {
        if (snprintf(buf, n, "%s", args->job_dir) >= (int)n)
            return error_out(EXIT_FAILED, "job dir '%s': path too long", args->job_dir);
    } else if (!args->target) {
        return error_out(EXIT_FAILED, "%s: name a JOBID or --job-dir DIR (see 'gpurun %s --help')",
                         args_cmd_name(args->cmd), args_cmd_name(args->cmd));
    } else if (!home || jobdir_default_path(buf, n, home, args->target) < 0) {
        return error_out(EXIT_FAILED, "cannot find the job dir of '%s': no home directory",
                         args->target);
    }
    if (stat(buf, &st) < 0 || !S_ISDIR(st.st_mode)) {
        if (args->job_dir)
            return error_out(EXIT_FAILED, "no job dir '%s'", buf);
        return error_out(EXIT_FAILED,
                         "no local job '%s' (no '%s'; Slurm jobs are not supported yet)",
                         args->target, buf);
    }
    if (snprintf(spec, sizeof(spec), "%s/job.json", buf) >= (int)sizeof(spec) ||
        access(spec, F_OK) < 0)
        return error_out(EXIT_FAILED, "'%s' is not a job dir (no job.json)", buf);
    return 0;
}

static int print_json(const json_t *v)
{
    if (json_dumpf(v, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER) < 0)
        return -EIO;
    fputc('\n', stdout);
    return 0;
}

static int cmd_status(struct gpurun_args *args, int *fatal_signal)
{
    char dir[PATH_MAX];
    struct status_error err;
    json_t *v = NULL;
    int ret, r;

    (void)fatal_signal;
    ret = target_dir(args, dir, sizeof(dir));
    if (ret)
        return ret;
    /* A job that has ended has a summary; one that runs has a leader to ask. Ask, and look
     * for the summary again if the leader is gone, as it may have ended meanwhile. */
    r = status_load_summary(dir, &v, &err);
    if (r == -ENOENT) {
        r = status_query(dir, STATUS_TIMEOUT_MS, &v, &err);
        if (r < 0 && status_load_summary(dir, &v, &(struct status_error){{0}}) == 0)
            r = 1;
        if (r == -ENOENT)
            return error_out(EXIT_FAILED, "job in '%s' has not started: no endpoint.json yet", dir);
    } else if (r == 0) {
        r = 1;
    }
    if (r < 0)
        return error_out(EXIT_FAILED, "%s", err.text);
    if (args->json)
        ret = print_json(v) < 0 ? EXIT_FAILED : 0;
    else if (r == 1)
        status_print_summary(stdout, v);
    else
        status_print(stdout, v);
    json_decref(v);
    return ret;
}

static int cmd_logs(struct gpurun_args *args, int *fatal_signal)
{
    char dir[PATH_MAX];
    struct logs_error err;
    int ret;

    (void)fatal_signal;
    ret = target_dir(args, dir, sizeof(dir));
    if (ret)
        return ret;
    if (logs_print(stdout, dir, args->rank, &err) < 0)
        return error_out(EXIT_FAILED, "%s", err.text);
    return 0;
}

/* Checks CMD the way the daemons will exec it, so that a typo fails here with 127 before a
 * job dir or a daemon exists. */
static int check_command(const char *cmd)
{
    char found[PATH_MAX];
    int r = local_resolve(cmd, getenv("PATH"), found, sizeof(found));

    if (r == -ENOENT)
        return error_out(EXIT_NOT_FOUND,
                         strchr(cmd, '/') ? "'%s': no such file" : "'%s': command not found", cmd);
    if (r == -EACCES)
        return error_out(EXIT_CANNOT_RUN, "'%s': permission denied (not an executable file)", cmd);
    if (r < 0)
        return error_out(EXIT_NOT_FOUND, "'%s': %s", cmd, uv_strerror(r));
    return 0;
}

/* Fills in what the options do not say: the job id, the command, loopback, the workdir. */
static int local_spec(struct gpurun_args *args, const char *job_id)
{
    struct jobspec *spec = &args->spec;
    char cwd[PATH_MAX];

    spec->job_id = strdup(job_id);
    if (!spec->job_id || jobspec_set_argv(spec, args->cmd_argc, args->cmd_argv) < 0)
        return -ENOMEM;
    spec->loopback = true;
    if (getcwd(cwd, sizeof(cwd))) {
        spec->workdir = strdup(cwd);
        if (!spec->workdir)
            return -ENOMEM;
    }
    return 0;
}

static int cmd_run(struct gpurun_args *args, int *fatal_signal)
{
    char self[PATH_MAX], daemon[PATH_MAX], job_id[128], dir[PATH_MAX], abs_dir[PATH_MAX];
    struct local_job job = {.out_fd = -1};
    struct jobdir_error jerr;
    const char *home;
    ssize_t n;
    int ret;

    if (!args->cmd_argv && !args->target)
        return error_out(EXIT_FAILED, "no command to run: give a train.cfg or '-- CMD ARGS...' "
                                      "(see 'gpurun --help')");
    if (args->target) {
        if (access(args->target, F_OK) < 0)
            return error_out(EXIT_FAILED,
                             "'%s': no such file (to run a command, put it after '--': gpurun "
                             "[options] -- %s)",
                             args->target, args->target);
        return error_out(EXIT_FAILED,
                         "'%s': train.cfg jobs need the training core, which this gpurun "
                         "lacks; use '-- CMD'",
                         args->target);
    }
    if (!args->local)
        return error_out(EXIT_FAILED, "Slurm submission is not implemented yet; add --local to "
                                      "run on this machine");
    ret = check_command(args->cmd_argv[0]);
    if (ret)
        return ret;
    if (args->partition || args->account)
        log_info("--partition and --account are for Slurm: ignored with --local");

    n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    self[n > 0 ? n : 0] = '\0';
    if (local_find_daemon(n > 0 ? self : NULL, getenv("PATH"), daemon, sizeof(daemon)) < 0)
        return error_out(EXIT_FAILED, "cannot find 'rendezvousd' beside '%s' or on PATH",
                         n > 0 ? self : "gpurun");

    if (jobdir_local_id(job_id, sizeof(job_id), time(NULL), (long)getpid()) < 0)
        return error_out(EXIT_FAILED, "cannot make a job id");
    if (args->job_dir) {
        if (snprintf(dir, sizeof(dir), "%s", args->job_dir) >= (int)sizeof(dir))
            return error_out(EXIT_FAILED, "job dir '%s': path too long", args->job_dir);
    } else {
        home = home_dir();
        if (!home || jobdir_default_path(dir, sizeof(dir), home, job_id) < 0)
            return error_out(EXIT_FAILED, "no home directory for the job dir; give --job-dir");
    }
    if (local_spec(args, job_id) < 0)
        return error_out(EXIT_FAILED, "out of memory");

    /* Opened before the job dir exists, so that a bad path leaves nothing behind. O_APPEND
     * keeps the daemons' lines whole when they share the file. */
    if (args->output) {
        job.out_fd = open(args->output, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0666);
        if (job.out_fd < 0)
            return error_out(EXIT_FAILED, "cannot open '%s': %s", args->output,
                             uv_strerror(-errno));
    }
    if (jobdir_create(dir, &args->spec, &jerr) < 0) {
        ret = error_out(EXIT_FAILED, "%s", jerr.text);
        goto out;
    }
    /* Ranks get the job dir in GPURUN_JOB_DIR and may change directory: make it absolute. */
    if (!realpath(dir, abs_dir)) {
        ret = error_out(EXIT_FAILED, "cannot resolve '%s': %s", dir, uv_strerror(-errno));
        goto out;
    }
    log_info("job '%s' in '%s'", job_id, abs_dir);

    job.job_dir = abs_dir;
    job.daemon = daemon;
    job.log_level = args->log_level_name;
    job.nnodes = args->spec.nnodes;
    job.time_limit_s = args->time_limit_s;
    job.kill_grace_ms = args->spec.kill_grace_ms;
    ret = local_run(&job, fatal_signal);
    if (ret != 0 && !*fatal_signal)
        fprintf(stderr, "gpurun: job '%s' exited with status %d; logs in '%s/logs'\n", job_id, ret,
                abs_dir);
out:
    if (job.out_fd >= 0)
        close(job.out_fd);
    return ret;
}

static int cmd_cancel(struct gpurun_args *args, int *fatal_signal)
{
    (void)args;
    (void)fatal_signal;
    return error_out(EXIT_FAILED, "cancel: not implemented yet (it needs the Slurm support)");
}

/* Indexed by enum gpurun_cmd. */
static int (*const handlers[CMD_COUNT])(struct gpurun_args *, int *) = {
    [CMD_RUN] = cmd_run,
    [CMD_STATUS] = cmd_status,
    [CMD_LOGS] = cmd_logs,
    [CMD_CANCEL] = cmd_cancel,
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
    struct args_error err;
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
        ret = handlers[args.cmd](&args, &fatal_signal);
    }
    if (fflush(stdout) != 0 && !ret)
        ret = error_out(EXIT_FAILED, "cannot write to stdout: %s", uv_strerror(-errno));
out:
    args_release(&args);
    if (fatal_signal)
        ret = die_of(fatal_signal);
    return ret;
}
