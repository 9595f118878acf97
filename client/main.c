/* gpurun: launches distributed jobs (DESIGN.md section 1). main() parses the command line
 * and hands it to the subcommand's row; the work lives in the client modules: local.c runs
 * a job on this machine, sbatch.c writes the batch script, slurmlib.c talks to Slurm,
 * submit.c waits for a Slurm job, view.c and status.c make the status, logs.c the logs. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pwd.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <uv.h>

#include "args.h"
#include "fsutil.h"
#include "jobdir.h"
#include "local.h"
#include "logs.h"
#include "sbatch.h"
#include "slurmlib.h"
#include "status.h"
#include "submit.h"
#include "traincfg.h"
#include "view.h"
#include "banned.h"

/* How long status waits for the leader at each step: it answers from its event loop at once,
 * so seconds mean it is stuck or gone. */
#define STATUS_TIMEOUT_MS 5000

/* How long slurmctld has to answer gpurun's first call before gpurun says it is down. A
 * controller that is up answers in milliseconds; libslurm itself would retry for
 * MessageTimeout (10 s by default) before giving up. */
#define SLURM_OPEN_TIMEOUT_S 3

/* status --watch: the refresh period. */
#define WATCH_PERIOD_MS 2000

/* gpurun cancel waits this long for the job's processes to be gone. */
#define CANCEL_WAIT_MS 60000

/* status without a JOBID lists this many of the most recent jobs (--all: every one). */
#define LIST_MAX 20

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

static long long now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};

    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

/* path made absolute against the working directory, into buf (n bytes). */
static int absolute(const char *path, char *buf, size_t n)
{
    char cwd[PATH_MAX];

    if (path[0] == '/')
        return snprintf(buf, n, "%s", path) < (int)n ? 0 : -ENAMETOOLONG;
    if (!getcwd(cwd, sizeof(cwd)))
        return -errno;
    return snprintf(buf, n, "%s/%s", cwd, path) < (int)n ? 0 : -ENAMETOOLONG;
}

/* --metrics-dir into the spec, absolute: every node's daemon reads it (on Slurm the folder is
 * each node's own, node_exporter's, so it need not exist here). Returns 0 or an exit status
 * with the error printed. */
static int set_metrics_dir(const struct gpurun_args *args, struct jobspec *spec)
{
    char dir[PATH_MAX];

    if (!args->metrics_dir)
        return 0;
    if (!args->metrics_dir[0] || absolute(args->metrics_dir, dir, sizeof(dir)) < 0)
        return error_out(EXIT_FAILED, "--metrics-dir '%s': not a usable path", args->metrics_dir);
    if (!(spec->metrics_dir = strdup(dir)))
        return error_out(EXIT_FAILED, "out of memory");
    return 0;
}

/* Where job dirs live: $GPURUN_JOBS, else ~/.gpurun/jobs; absolute. Returns 0, -ENAMETOOLONG
 * or -ENOENT (no home directory), and prints nothing. */
static int jobs_root_path(char *buf, size_t n)
{
    const char *env = getenv("GPURUN_JOBS"), *home;

    if (env && *env)
        return absolute(env, buf, n) < 0 ? -ENAMETOOLONG : 0;
    home = home_dir();
    if (!home || snprintf(buf, n, "%s/.gpurun/jobs", home) >= (int)n)
        return -ENOENT;
    return 0;
}

/* jobs_root_path(), with the message of why not. */
static int jobs_root(char *buf, size_t n)
{
    const char *env = getenv("GPURUN_JOBS");
    int r = jobs_root_path(buf, n);

    if (r == -ENAMETOOLONG)
        return error_out(EXIT_FAILED, "GPURUN_JOBS '%s': path too long", env);
    if (r < 0)
        return error_out(EXIT_FAILED, "no home directory for the job dirs; set GPURUN_JOBS or "
                                      "give --job-dir");
    return 0;
}

/* "a/b" into buf (n bytes); false when it does not fit. */
static bool join_path(char *buf, size_t n, const char *a, const char *b)
{
    int len = snprintf(buf, n, "%s/%s", a, b);

    return len >= 0 && (size_t)len < n;
}

static bool is_dir(const char *path)
{
    struct stat st;

    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* --- which job a status/logs/cancel command means ------------------------------------------ */

struct target {
    char id[256];   /* the job's id: Slurm's, or a local job's */
    uint32_t slurm; /* the Slurm id; 0: a local job */
    char dir[PATH_MAX];
    bool has_dir; /* dir exists (a pending Slurm job has none yet) */
};

/* The job's id from DIR/job.json, into t->id. */
static int id_from_dir(struct target *t)
{
    char path[PATH_MAX + 16];
    json_error_t je;
    json_t *spec;
    const char *id;

    snprintf(path, sizeof(path), "%s/job.json", t->dir);
    spec = json_load_file(path, 0, &je);
    id = json_string_value(json_object_get(spec, "job_id"));
    if (!id) {
        json_decref(spec);
        return error_out(EXIT_FAILED, "'%s' is not a job dir (no job.json)", t->dir);
    }
    snprintf(t->id, sizeof(t->id), "%s", id);
    json_decref(spec);
    return 0;
}

/* t->dir with its links resolved: a local job run with --job-dir is linked from the jobs
 * root by its id (link_job_dir), and its real place is what a person wants to see. */
static void resolve_dir(struct target *t)
{
    char real[PATH_MAX];

    if (realpath(t->dir, real))
        snprintf(t->dir, sizeof(t->dir), "%s", real);
}

/* Resolves --job-dir or JOBID. A numeric id is a Slurm job, whose dir may not exist yet; any
 * other id must name a job dir (a local job's, or the link to one). */
static int resolve_target(const struct gpurun_args *args, struct target *t)
{
    char root[PATH_MAX];
    int ret;

    memset(t, 0, sizeof(*t));
    if (args->job_dir) {
        if (absolute(args->job_dir, t->dir, sizeof(t->dir)) < 0)
            return error_out(EXIT_FAILED, "job dir '%s': path too long", args->job_dir);
        if (!is_dir(t->dir))
            return error_out(EXIT_FAILED, "no job dir '%s'", t->dir);
        ret = id_from_dir(t);
        if (ret)
            return ret;
        if (args->target && strcmp(args->target, t->id))
            return error_out(EXIT_FAILED, "job dir '%s' holds job '%s', not '%s'", t->dir, t->id,
                             args->target);
        slurmlib_parse_id(t->id, &t->slurm);
        t->has_dir = true;
        resolve_dir(t);
        return 0;
    }
    if (!args->target)
        return error_out(EXIT_FAILED, "%s: name a JOBID or --job-dir DIR (see 'gpurun %s --help')",
                         args_cmd_name(args->cmd), args_cmd_name(args->cmd));
    ret = jobs_root(root, sizeof(root));
    if (ret)
        return ret;
    snprintf(t->id, sizeof(t->id), "%s", args->target);
    if (strchr(t->id, '/') || !strcmp(t->id, ".") || !strcmp(t->id, ".."))
        return error_out(EXIT_FAILED, "'%s' is not a job id (for a directory use --job-dir)",
                         t->id);
    if (!join_path(t->dir, sizeof(t->dir), root, t->id))
        return error_out(EXIT_FAILED, "job dir of '%s': path too long", t->id);
    t->has_dir = is_dir(t->dir);
    if (t->has_dir)
        resolve_dir(t);
    if (slurmlib_parse_id(t->id, &t->slurm) == 0)
        return 0;
    if (!t->has_dir)
        return error_out(EXIT_FAILED, "no job '%s' (no '%s', and it is not a Slurm job id)", t->id,
                         t->dir);
    return 0;
}

/* Opens libslurm for a command; prints the one line of why not. */
static int open_slurm(void)
{
    struct slurmlib_error err;

    if (slurmlib_open(SLURM_OPEN_TIMEOUT_S, &err) < 0)
        return error_out(EXIT_FAILED, "%s", err.text);
    return 0;
}

/* The CPUs each rank asks Slurm for: --cpus-per-gpu (or SBATCH_CPUS_PER_GPU) when given;
 * else the partition's share per GPU, its nodes' CPUs over their GPUs (the least), so that
 * data loaders and OMP_NUM_THREADS get what a rank's GPU comes with rather than sbatch's one
 * CPU; else, with Slurm out of reach, 1. */
static int slurm_cpus_per_rank(const struct gpurun_args *args)
{
    struct slurmlib_error err;
    char conf[PATH_MAX];
    int cpus;

    if (args_given(args, "cpus-per-gpu") || slurmlib_conf_path(conf, sizeof(conf)) < 0 ||
        slurmlib_open(SLURM_OPEN_TIMEOUT_S, &err) < 0 ||
        slurmlib_cpus_per_rank(args->partition, args->spec.nprocs, !args->no_gpus, &cpus, &err) < 0)
        return args->cpus_per_gpu;
    return cpus;
}

/* --- status ---------------------------------------------------------------------------------- */

static int print_json(const json_t *v, size_t flags)
{
    if (json_dumpf(v, stdout, flags | JSON_PRESERVE_ORDER) < 0)
        return -EIO;
    fputc('\n', stdout);
    return 0;
}

/* The view of target t now. Slurm must be open for a Slurm job (or have failed: then the view
 * says why and shows what the job dir has). */
static json_t *target_view(const struct target *t, bool slurm_open, const char *slurm_why)
{
    struct slurmlib_job job;
    struct slurmlib_error err;
    struct view_input in = {
        .job_id = t->id, .job_dir = t->has_dir ? t->dir : NULL, .timeout_ms = STATUS_TIMEOUT_MS};
    json_t *v;
    bool loaded = false;

    memset(&job, 0, sizeof(job));
    if (t->slurm && slurm_open) {
        int r = slurmlib_load(t->slurm, &job, &err);
        if (r == 0)
            loaded = true;
        else if (r == -ENOENT)
            in.slurm_error = "Slurm no longer knows the job (it forgets ended jobs after "
                             "MinJobAge)";
        else
            in.slurm_error = err.text;
    } else if (t->slurm) {
        in.slurm_error = slurm_why;
    }
    in.slurm = loaded ? &job : NULL;
    v = view_build(&in);
    slurmlib_job_release(&job);
    return v;
}

/* status without a JOBID: the user's gpurun jobs that Slurm knows, then the job dirs it does
 * not (ended long ago, or local jobs), newest first. */
static int status_list(const struct gpurun_args *args)
{
    struct slurmlib_job *jobs = NULL;
    struct slurmlib_error err;
    size_t n = 0;
    char root[PATH_MAX], conf[PATH_MAX];
    json_t *views = json_array();
    struct dirent **ents = NULL;
    int nents = 0, shown = 0, hidden = 0, ret;

    ret = jobs_root(root, sizeof(root));
    if (ret)
        return ret;
    if (slurmlib_conf_path(conf, sizeof(conf)) == 0) {
        if (slurmlib_open(SLURM_OPEN_TIMEOUT_S, &err) < 0 ||
            slurmlib_list(getuid(), &jobs, &n, &err) < 0)
            fprintf(stderr, "gpurun: %s\n", err.text);
    }
    /* Newest first: Slurm's jobs by id, descending (Slurm forgets a job minutes after its
     * end, so these are the recent ones), then the job dirs it has forgotten. */
    for (size_t k = 0; k < n; k++) {
        size_t i = n - 1 - k;
        struct target t = {.slurm = jobs[i].id};
        struct view_input in = {.slurm = &jobs[i], .timeout_ms = 0};
        if (!args->all && shown >= LIST_MAX) {
            hidden++;
            continue;
        }
        shown++;
        snprintf(t.id, sizeof(t.id), "%u", jobs[i].id);
        in.job_id = t.id;
        in.job_dir = join_path(t.dir, sizeof(t.dir), root, t.id) && is_dir(t.dir) ? t.dir : NULL;
        in.no_live = true;
        json_array_append_new(views, view_build(&in));
    }
    nents = scandir(root, &ents, NULL, NULL);
    /* Newest first, by the job dir's modification time. */
    if (nents > 0) {
        struct {
            double mtime;
            int i;
        } *order = calloc((size_t)nents, sizeof(*order));
        int k = 0;
        for (int i = 0; order && i < nents; i++) {
            char path[PATH_MAX + 300];
            struct stat st;
            uint32_t id;
            bool known = false;
            snprintf(path, sizeof(path), "%s/%s/job.json", root, ents[i]->d_name);
            if (ents[i]->d_name[0] == '.' || stat(path, &st) < 0)
                continue;
            if (slurmlib_parse_id(ents[i]->d_name, &id) == 0)
                for (size_t j = 0; j < n; j++)
                    known = known || jobs[j].id == id;
            if (known)
                continue;
            order[k].mtime = (double)st.st_mtim.tv_sec + st.st_mtim.tv_nsec / 1e9;
            order[k++].i = i;
        }
        for (int a = 0; order && a < k; a++)
            for (int b = a + 1; b < k; b++)
                if (order[b].mtime > order[a].mtime) {
                    double m = order[a].mtime;
                    int i = order[a].i;
                    order[a] = order[b];
                    order[b].mtime = m;
                    order[b].i = i;
                }
        hidden += args->all || k <= LIST_MAX - shown ? 0 : k - (LIST_MAX - shown);
        for (int a = 0; order && a < k && (args->all || shown < LIST_MAX); a++, shown++) {
            struct target t;
            struct view_input in = {.timeout_ms = 0};
            memset(&t, 0, sizeof(t));
            snprintf(t.id, sizeof(t.id), "%s", ents[order[a].i]->d_name);
            if (!join_path(t.dir, sizeof(t.dir), root, t.id))
                continue;
            resolve_dir(&t);
            in.job_id = t.id;
            in.job_dir = t.dir;
            in.no_live = true;
            json_array_append_new(views, view_build(&in));
        }
        free(order);
    }
    for (int i = 0; i < nents; i++)
        free(ents[i]);
    free(ents);
    for (size_t i = 0; i < n; i++)
        slurmlib_job_release(&jobs[i]);
    free(jobs);
    slurmlib_close();
    if (args->json)
        ret = print_json(views, JSON_INDENT(2)) < 0 ? EXIT_FAILED : 0;
    else if (json_array_size(views) == 0)
        printf("no gpurun jobs (Slurm's, or job dirs in '%s')\n", root);
    else
        view_print_list(stdout, views);
    if (hidden && !args->json)
        printf("(%d older job%s not shown: gpurun status --all)\n", hidden, hidden == 1 ? "" : "s");
    json_decref(views);
    return ret;
}

static int cmd_status(struct gpurun_args *args, int *fatal_signal)
{
    struct slurmlib_error err = {{0}};
    struct target t;
    bool slurm_open = false, tty = isatty(STDOUT_FILENO);
    int ret;

    (void)fatal_signal;
    if (!args->target && !args->job_dir)
        return status_list(args);
    ret = resolve_target(args, &t);
    if (ret)
        return ret;
    if (t.slurm) {
        slurm_open = slurmlib_open(SLURM_OPEN_TIMEOUT_S, &err) == 0;
        if (!slurm_open && !t.has_dir)
            return error_out(EXIT_FAILED, "%s", err.text);
    }
    for (;;) {
        json_t *v = target_view(&t, slurm_open, err.text);
        const json_t *sl = json_object_get(v, "slurm");
        bool ended;

        if (!v)
            return error_out(EXIT_FAILED, "out of memory");
        if (t.slurm && !json_is_object(sl) && !t.has_dir) {
            json_decref(v);
            return error_out(EXIT_FAILED, "no job %s: Slurm does not know it and there is no '%s'",
                             t.id, t.dir);
        }
        /* Without Slurm's record and a summary, the leader's answer is all there is: its
         * failure is the command's. */
        if (!json_is_object(sl) && json_is_null(json_object_get(v, "summary")) &&
            json_object_get(v, "live_error")) {
            ret = error_out(EXIT_FAILED, "%s", json_string_value(json_object_get(v, "live_error")));
            json_decref(v);
            return ret;
        }
        ended = view_ended(v);
        if (args->watch && tty && !args->json)
            fputs("\033[H\033[2J", stdout);
        if (args->json)
            ret = print_json(v, args->watch ? JSON_COMPACT : JSON_INDENT(2)) < 0 ? EXIT_FAILED : 0;
        else
            view_print(stdout, v);
        json_decref(v);
        fflush(stdout);
        if (!args->watch || ended || ret)
            break;
        sleep_ms(WATCH_PERIOD_MS);
        /* A job dir appears when a pending job starts. */
        if (!t.has_dir)
            t.has_dir = is_dir(t.dir);
    }
    slurmlib_close();
    return ret;
}

/* --- logs ------------------------------------------------------------------------------------ */

struct follow_state {
    const struct target *t;
    long long next_ms; /* when Slurm is asked again */
    bool ended;
};

/* Whether the followed job is over: Slurm's word for a Slurm job (asked once a second), the
 * summary and a gone leader for a local one. */
static bool follow_ended(void *arg)
{
    struct follow_state *s = arg;
    char path[PATH_MAX + 32];

    if (s->ended)
        return true;
    if (s->t->slurm) {
        struct slurmlib_job job;
        struct slurmlib_error err;
        int r;
        if (now_ms() < s->next_ms)
            return false;
        s->next_ms = now_ms() + SUBMIT_POLL_MAX_MS;
        r = slurmlib_load(s->t->slurm, &job, &err);
        s->ended = r < 0 || job.ended;
        slurmlib_job_release(&job);
        return s->ended;
    }
    snprintf(path, sizeof(path), "%s/summary.json", s->t->dir);
    if (access(path, F_OK) == 0) {
        /* The leader writes the summary, then waits for every node to finish: give the
         * followers' last lines the time of a poll. */
        s->ended = s->next_ms != 0 && now_ms() >= s->next_ms;
        if (!s->next_ms)
            s->next_ms = now_ms() + LOGS_POLL_MS;
    }
    return s->ended;
}

static int cmd_logs(struct gpurun_args *args, int *fatal_signal)
{
    struct follow_state fs = {0};
    struct logs_error err;
    struct target t;
    int ret;

    (void)fatal_signal;
    ret = resolve_target(args, &t);
    if (ret)
        return ret;
    fs.t = &t;
    if (t.slurm && (args->follow || !t.has_dir)) {
        ret = open_slurm();
        if (ret)
            return ret;
    }
    if (!t.has_dir && !args->follow) {
        struct slurmlib_job job;
        struct slurmlib_error serr;
        if (slurmlib_load(t.slurm, &job, &serr) < 0)
            return error_out(EXIT_FAILED, "%s", serr.text);
        ret = error_out(EXIT_FAILED,
                        "job %s has no logs yet (%s; its job dir '%s' is made when "
                        "it starts; -f waits for them)",
                        t.id, slurmlib_state_name(job.state), t.dir);
        slurmlib_job_release(&job);
        return ret;
    }
    if (args->follow)
        ret = logs_follow(stdout, t.dir, args->rank, follow_ended, &fs, &err);
    else
        ret = logs_print(stdout, t.dir, args->rank, &err);
    slurmlib_close();
    if (ret < 0)
        return error_out(EXIT_FAILED, "%s", err.text);
    return 0;
}

/* --- cancel ---------------------------------------------------------------------------------- */

/* A local job: SIGTERM to its leader (the node 0 rendezvousd), which ends the job on every
 * node; returns once the leader is gone. */
static int cancel_local(const struct target *t)
{
    char path[PATH_MAX + 32];
    json_error_t je;
    json_t *ep;
    pid_t pid;
    long long until;

    snprintf(path, sizeof(path), "%s/summary.json", t->dir);
    if (access(path, F_OK) == 0) {
        fprintf(stderr, "gpurun: job %s has ended already\n", t->id);
        return 0;
    }
    snprintf(path, sizeof(path), "%s/endpoint.json", t->dir);
    ep = json_load_file(path, 0, &je);
    pid = (pid_t)json_integer_value(json_object_get(ep, "pid"));
    json_decref(ep);
    if (pid <= 0)
        return error_out(EXIT_FAILED, "job %s has no leader to stop (no '%s')", t->id, path);
    if (kill(pid, SIGTERM) < 0)
        return errno == ESRCH ? error_out(EXIT_FAILED, "the leader of job %s (pid %d) is gone",
                                          t->id, (int)pid)
                              : error_out(EXIT_FAILED, "cannot signal pid %d: %s", (int)pid,
                                          uv_strerror(-errno));
    for (until = now_ms() + CANCEL_WAIT_MS; now_ms() < until && kill(pid, 0) == 0;)
        sleep_ms(50);
    return 0;
}

static int cmd_cancel(struct gpurun_args *args, int *fatal_signal)
{
    struct slurmlib_error err;
    struct slurmlib_job job;
    struct target t;
    long long until;
    int ret, r;

    (void)fatal_signal;
    /* --job-dir alone names the job too: resolve_target reads its id from the dir. */
    ret = resolve_target(args, &t);
    if (ret)
        return ret;
    if (!t.slurm)
        return cancel_local(&t);
    ret = open_slurm();
    if (ret)
        return ret;
    r = slurmlib_kill(t.slurm, &err);
    if (r == -EALREADY) {
        fprintf(stderr, "gpurun: %s\n", err.text);
        ret = 0;
        goto out;
    }
    if (r < 0) {
        ret = error_out(EXIT_FAILED, "%s", err.text);
        goto out;
    }
    /* Slurm says CANCELLED at once; the processes go over KillWait. Return when they have. */
    for (until = now_ms() + CANCEL_WAIT_MS;; sleep_ms(SUBMIT_POLL_MIN_MS)) {
        r = slurmlib_load(t.slurm, &job, &err);
        bool ended = r < 0 || job.ended;
        slurmlib_job_release(&job);
        if (ended)
            break;
        if (now_ms() >= until) {
            fprintf(stderr, "gpurun: job %s is still completing after %d s\n", t.id,
                    CANCEL_WAIT_MS / 1000);
            break;
        }
    }
out:
    slurmlib_close();
    return ret;
}

/* --- run ------------------------------------------------------------------------------------- */

/* The path of the running gpurun, or NULL. */
static const char *self_path(char *buf, size_t n)
{
    ssize_t len = readlink("/proc/self/exe", buf, n - 1);

    if (len <= 0)
        return NULL;
    buf[len] = '\0';
    return buf;
}

/* Finds a program gpurun ships: beside gpurun, else on PATH. Writes an absolute path. */
static int find_program(const char *name, char *out, size_t n)
{
    char self[PATH_MAX], found[PATH_MAX];
    const char *s = self_path(self, sizeof(self)), *slash = s ? strrchr(s, '/') : NULL;

    if (slash &&
        snprintf(found, sizeof(found), "%.*s/%s", (int)(slash - s), s, name) < (int)sizeof(found) &&
        access(found, X_OK) == 0)
        return realpath(found, out) ? 0 : -errno;
    if (local_resolve(name, getenv("PATH"), found, sizeof(found)) < 0)
        return -ENOENT;
    (void)n;
    return realpath(found, out) ? 0 : -errno;
}

/* Checks CMD the way the daemons will exec it, so that a typo fails here with 127 before a
 * job dir, a daemon or a Slurm job exists. */
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

/* The interpreter of a SCRIPT.py run. torchrun runs a script with its own Python; gpurun is no
 * Python program, so each node takes python3 from its PATH (an activated venv's, a module's),
 * as it finds any command. */
#define SCRIPT_INTERPRETER "python3"

/* What a run needs besides the options: the ranks' command and, for a train.cfg, the
 * configuration whose strings the options borrow. */
struct run_plan {
    struct traincfg cfg;
    bool have_cfg;
    char **argv; /* NULL-terminated; new, strings borrowed or in store */
    int argc;
    char train[PATH_MAX], cfg_path[PATH_MAX];
    char job_name[256];
};

static void plan_release(struct run_plan *p)
{
    if (p->have_cfg)
        traincfg_release(&p->cfg);
    free(p->argv);
}

/* A train.cfg: its [job] keys where no flag is given, and gpurun-train as the command. */
static int plan_cfg(struct gpurun_args *args, struct run_plan *p)
{
    struct traincfg_error terr;
    struct traincfg *c = &p->cfg;
    const char *base;
    size_t len;

    if (access(args->target, F_OK) < 0)
        return error_out(EXIT_FAILED,
                         "'%s': no such file (to run a command, put it after '--': gpurun "
                         "[options] -- %s)",
                         args->target, args->target);
    if (traincfg_read(c, args->target, args->overrides, (size_t)args->n_overrides, &terr) < 0)
        return error_out(EXIT_FAILED, "%s", terr.text);
    p->have_cfg = true;
    if (!args_given(args, "nodes")) {
        if (c->nodes > 65536)
            return error_out(EXIT_FAILED, "%s: [job] nodes: must be 1..65536", args->target);
        args->spec.nnodes = c->nodes;
    }
    if (!args_given(args, "gpus-per-node"))
        args->spec.nprocs = c->gpus_per_node;
    if (!args_given(args, "time") && c->time_min > 0)
        args->time_limit_s = (long)c->time_min * 60;
    if (!args_given(args, "partition") && c->partition)
        args->partition = c->partition;
    if (!args_given(args, "account") && c->account)
        args->account = c->account;
    if (!args_given(args, "output") && c->output)
        args->output = c->output;
    if (!args_given(args, "max-restarts"))
        args->spec.max_restarts = c->max_restarts;
    if (!args_given(args, "no-gpus") && c->device == TRAINCFG_DEVICE_CPU)
        args->no_gpus = true;
    if (!args_given(args, "job-name")) {
        if (c->job_name) {
            args->job_name = c->job_name;
        } else {
            base = strrchr(args->target, '/');
            base = base ? base + 1 : args->target;
            len = strlen(base);
            if (len > 4 && !strcmp(base + len - 4, ".cfg"))
                len -= 4;
            snprintf(p->job_name, sizeof(p->job_name), "%.*s", (int)len, base);
            args->job_name = p->job_name;
        }
    }
    if (find_program("gpurun-train", p->train, sizeof(p->train)) < 0)
        return error_out(EXIT_NOT_FOUND, "cannot find 'gpurun-train' beside gpurun or on PATH");
    if (!realpath(args->target, p->cfg_path))
        return error_out(EXIT_FAILED, "cannot resolve '%s': %s", args->target, uv_strerror(-errno));
    p->argc = 2 + args->n_overrides;
    p->argv = calloc((size_t)p->argc + 1, sizeof(*p->argv));
    if (!p->argv)
        return error_out(EXIT_FAILED, "out of memory");
    p->argv[0] = p->train;
    p->argv[1] = p->cfg_path;
    for (int i = 0; i < args->n_overrides; i++)
        p->argv[2 + i] = (char *)args->overrides[i];
    return 0;
}

/* The default name of a job running argv (argc words): the file name of its first word that
 * ends in ".py" (the script of "python3 train.py"), else of the command. */
static void default_job_name(char *buf, size_t n, char *const *argv, int argc)
{
    const char *word = argv[0], *base;

    for (int i = 0; i < argc; i++) {
        size_t len = strlen(argv[i]);
        if (len > 3 && !strcmp(argv[i] + len - 3, ".py")) {
            word = argv[i];
            break;
        }
    }
    base = strrchr(word, '/');
    snprintf(buf, n, "%s", base ? base + 1 : word);
}

static int plan_run(struct gpurun_args *args, struct run_plan *p)
{
    struct stat st;
    int ret, lead = args->script ? 1 : 0;

    if (args->target)
        return plan_cfg(args, p);
    if (args->n_overrides > 0)
        return error_out(EXIT_FAILED, "'%s': an override needs a train.cfg to apply to",
                         args->overrides[0]);
    if (!args->cmd_argv)
        return error_out(EXIT_FAILED, "no command to run: give a train.cfg, a SCRIPT.py or "
                                      "'-- CMD ARGS...' (see 'gpurun --help')");
    /* torchrun's "train.py ARGS": python3 runs it, found on PATH by each node as any command
     * is; the script is checked here, where it is named. */
    if (args->script && stat(args->script, &st) < 0) {
        if (errno == ENOENT || errno == ENOTDIR)
            return error_out(EXIT_NOT_FOUND, "'%s': no such file", args->script);
        return error_out(EXIT_CANNOT_RUN, "'%s': %s", args->script, uv_strerror(-errno));
    }
    ret = check_command(args->script ? SCRIPT_INTERPRETER : args->cmd_argv[0]);
    if (ret)
        return ret;
    p->argc = lead + args->cmd_argc;
    p->argv = calloc((size_t)p->argc + 1, sizeof(*p->argv));
    if (!p->argv)
        return error_out(EXIT_FAILED, "out of memory");
    if (args->script)
        p->argv[0] = (char *)SCRIPT_INTERPRETER;
    memcpy(p->argv + lead, args->cmd_argv, (size_t)args->cmd_argc * sizeof(*p->argv));
    if (!args->job_name) {
        default_job_name(p->job_name, sizeof(p->job_name), p->argv, p->argc);
        args->job_name = p->job_name;
    }
    return 0;
}

/* What the daemons know of the job besides its command: its name and its time limit. */
static int plan_spec(struct gpurun_args *args)
{
    args->spec.time_limit_s = (int)args->time_limit_s;
    if (args->job_name && !(args->spec.name = strdup(args->job_name)))
        return error_out(EXIT_FAILED, "out of memory");
    return 0;
}

/* A local job whose dir was given with --job-dir: a link to it from the jobs root, named by
 * its id, so that "gpurun status|logs|cancel ID" find it as they find any local job. Not
 * being able to link costs only that: said, not fatal. */
static void link_job_dir(const char *job_id, const char *abs_dir)
{
    char root[PATH_MAX], link[PATH_MAX], real[PATH_MAX];
    int r = jobs_root_path(root, sizeof(root));

    if (r == 0 && !join_path(link, sizeof(link), root, job_id))
        r = -ENAMETOOLONG;
    /* Already there: a --job-dir that names the default place. */
    if (r == 0 && realpath(link, real) && !strcmp(real, abs_dir))
        return;
    if (r == 0)
        r = fs_mkdirs(root, 0700);
    if (r == 0 && symlink(abs_dir, link) < 0)
        r = -errno;
    if (r < 0)
        fprintf(stderr,
                "gpurun: cannot link the job's id to its dir in the jobs root: %s; give "
                "gpurun status|logs|cancel --job-dir '%s'\n",
                uv_strerror(r), abs_dir);
}

/* The job's and the ranks' working directory into buf (n bytes): --chdir's, absolute (as
 * sbatch makes it), else gpurun's own. */
static int work_dir(const struct gpurun_args *args, char *buf, size_t n)
{
    struct stat st;
    int r;

    if (!args->chdir) {
        if (!getcwd(buf, n))
            return error_out(EXIT_FAILED, "cannot get the working directory: %s",
                             uv_strerror(-errno));
        return 0;
    }
    r = absolute(args->chdir, buf, n);
    if (r < 0)
        return error_out(EXIT_FAILED, "--chdir: '%s': %s", args->chdir, uv_strerror(r));
    /* The job dir is on a filesystem every node shares: so, as a rule, is the job's own. */
    if (stat(buf, &st) < 0 || !S_ISDIR(st.st_mode))
        return error_out(EXIT_FAILED, "--chdir: '%s' is not a directory", args->chdir);
    return 0;
}

static int run_local(struct gpurun_args *args, struct run_plan *p, int *fatal_signal)
{
    char daemon[PATH_MAX], job_id[128], dir[PATH_MAX], root[PATH_MAX], cwd[PATH_MAX];
    char abs_dir[PATH_MAX];
    struct local_job job = {.out_fd = -1};
    struct jobdir_error jerr;
    struct jobspec *spec = &args->spec;
    int ret;

    if (args->emit_sbatch)
        return error_out(EXIT_FAILED, "--emit-sbatch writes a Slurm batch script: drop --local");
    if (args_slurm_only_given(args))
        log_info("--%s and Slurm's other options are ignored with --local",
                 args_slurm_only_given(args));
    if (find_program("rendezvousd", daemon, sizeof(daemon)) < 0)
        return error_out(EXIT_FAILED, "cannot find 'rendezvousd' beside gpurun or on PATH");
    if (jobdir_local_id(job_id, sizeof(job_id), time(NULL), (long)getpid()) < 0)
        return error_out(EXIT_FAILED, "cannot make a job id");
    if (args->job_dir) {
        if (snprintf(dir, sizeof(dir), "%s", args->job_dir) >= (int)sizeof(dir))
            return error_out(EXIT_FAILED, "job dir '%s': path too long", args->job_dir);
    } else {
        ret = jobs_root(root, sizeof(root));
        if (ret)
            return ret;
        if (snprintf(dir, sizeof(dir), "%s/%s", root, job_id) >= (int)sizeof(dir))
            return error_out(EXIT_FAILED, "job dir '%s/%s': path too long", root, job_id);
    }
    spec->job_id = strdup(job_id);
    if (!spec->job_id || jobspec_set_argv(spec, p->argc, p->argv) < 0)
        return error_out(EXIT_FAILED, "out of memory");
    spec->loopback = true;
    ret = work_dir(args, cwd, sizeof(cwd));
    if (ret)
        return ret;
    if (!(spec->workdir = strdup(cwd)))
        return error_out(EXIT_FAILED, "out of memory");
    ret = set_metrics_dir(args, spec);
    if (ret)
        return ret;

    /* Opened before the job dir exists, so that a bad path leaves nothing behind. O_APPEND
     * keeps the daemons' lines whole when they share the file. */
    if (args->output) {
        job.out_fd = open(args->output, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0666);
        if (job.out_fd < 0)
            return error_out(EXIT_FAILED, "cannot open '%s': %s", args->output,
                             uv_strerror(-errno));
    }
    if (jobdir_create(dir, spec, &jerr) < 0) {
        ret = error_out(EXIT_FAILED, "%s", jerr.text);
        goto out;
    }
    /* Ranks get the job dir in GPURUN_JOB_DIR and may change directory: make it absolute. */
    if (!realpath(dir, abs_dir)) {
        ret = error_out(EXIT_FAILED, "cannot resolve '%s': %s", dir, uv_strerror(-errno));
        goto out;
    }
    if (args->job_dir)
        link_job_dir(job_id, abs_dir);
    /* Before any rank speaks, so that another shell can follow the job at once. */
    fprintf(stderr, "gpurun: job %s, job dir %s\n", job_id, abs_dir);

    job.job_dir = abs_dir;
    job.daemon = daemon;
    job.log_level = args->log_level_name;
    job.nnodes = spec->nnodes;
    job.time_limit_s = args->time_limit_s;
    job.kill_grace_ms = spec->kill_grace_ms;
    /* The pre-timeout signal as on Slurm: --signal's lead, else 120 s (a quarter of a
     * shorter limit, so that a short job is not signalled at its start). */
    job.preempt_signal = spec->preempt_signal;
    job.preempt_before_s = args->signal.text                ? args->signal.time_s
                           : args->time_limit_s >= 4 * 120L ? 120
                                                            : args->time_limit_s / 4;
    ret = local_run(&job, fatal_signal);
    if (ret != 0 && !*fatal_signal)
        fprintf(stderr, "gpurun: job '%s' exited with status %d; logs in '%s/logs'\n", job_id, ret,
                abs_dir);
out:
    if (job.out_fd >= 0)
        close(job.out_fd);
    return ret;
}

/* job.json's text for spec (job_id empty: the script fills it in), through jobspec_save so
 * that the daemons read what the one writer of job.json writes. */
static int spec_text(const struct jobspec *spec, char **text)
{
    char tmpl[PATH_MAX], path[PATH_MAX + 16];
    const char *tmp = getenv("TMPDIR");
    size_t len;
    int ret;

    snprintf(tmpl, sizeof(tmpl), "%s/gpurun-spec.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(tmpl))
        return -errno;
    snprintf(path, sizeof(path), "%s/job.json", tmpl);
    ret = jobspec_save(spec, path);
    if (ret == 0)
        ret = fs_read_all(path, 4 * 1024 * 1024, text, &len);
    unlink(path);
    rmdir(tmpl);
    return ret;
}

/* sbatch's options that gpurun passes on as they are: into job, with the checks that need
 * more than one option or libslurm. */
static int sbatch_options(const struct gpurun_args *args, struct sbatch_job *job)
{
    struct slurmlib_error serr;

    if (args->mem_per == SBATCH_MEM_GPU && args->no_gpus)
        return error_out(EXIT_FAILED, "--mem-per-gpu: the job asks for no GPUs (--no-gpus): give "
                                      "--mem or --mem-per-cpu");
    if (args->comment && strlen(args->comment) > SBATCH_COMMENT_LEN_MAX)
        return error_out(EXIT_FAILED, "--comment: longer than %d bytes", SBATCH_COMMENT_LEN_MAX);
    if (args->begin && slurmlib_parse_begin(args->begin, &job->begin_time, &serr) < 0)
        return error_out(EXIT_FAILED, "%s", serr.text);
    job->begin = args->begin;
    job->qos = args->qos;
    job->mem_per = args->mem_per;
    job->mem_mb = args->mem_mb;
    job->exclusive = (enum sbatch_exclusive)args->exclusive;
    job->constraint = args->constraint;
    job->dependency = args->dependency;
    job->nodelist = args->nodelist;
    job->exclude = args->exclude;
    job->reservation = args->reservation;
    job->gres = args->gres;
    job->hold = args->hold;
    if (args->no_requeue && (args->requeue || args->max_requeues > 0))
        return error_out(EXIT_FAILED, "--no-requeue: the job also asks to be requeued (%s)",
                         args->requeue ? "--requeue" : "--max-requeues");
    job->requeue = args->requeue || args->max_requeues > 0;
    job->max_requeues = args->max_requeues;
    job->comment = args->comment;
    job->mail_type = args->mail_type;
    job->mail_type_text = args->mail_type_text;
    job->mail_user = args->mail_user;
    return 0;
}

/* -w names nodes the job must have: as in sbatch, their number is the job's node count when
 * neither -N (nor SBATCH_... nor a train.cfg) gives one, and may not pass the count given. */
static int nodelist_nodes(struct gpurun_args *args, const struct run_plan *p)
{
    char **names = NULL;
    int n = 0, r;

    if (!args->nodelist)
        return 0;
    r = slurmlib_hostlist_expand(args->nodelist, &names, &n);
    slurmlib_names_free(names);
    if (r == -ENOSYS) /* no libslurm: slurmctld will say, if it is ever asked */
        return 0;
    if (r < 0 || n == 0)
        return error_out(EXIT_FAILED, "--nodelist: '%s' is not a list of nodes (node[1-2],gpu7)",
                         args->nodelist);
    if (!args_given(args, "nodes") && !p->have_cfg) {
        args->spec.nnodes = n;
        return 0;
    }
    if (n > args->spec.nnodes)
        return error_out(EXIT_FAILED, "--nodelist: '%s' names %d nodes, more than the job's %d",
                         args->nodelist, n, args->spec.nnodes);
    return 0;
}

static int run_slurm(struct gpurun_args *args, struct run_plan *p, int *fatal_signal)
{
    char cwd[PATH_MAX], root[PATH_MAX], job_dir[PATH_MAX], output[PATH_MAX], daemon[PATH_MAX];
    char dir[PATH_MAX];
    struct jobspec *spec = &args->spec;
    struct sbatch_job job = {0};
    struct sbatch_error berr;
    struct slurmlib_error serr;
    char *json = NULL, *script = NULL;
    uint32_t id;
    int ret, r;

    ret = work_dir(args, cwd, sizeof(cwd));
    if (ret)
        return ret;
    ret = jobs_root(root, sizeof(root));
    if (ret)
        return ret;
    ret = sbatch_options(args, &job);
    if (ret == 0)
        ret = nodelist_nodes(args, p);
    if (ret)
        return ret;
    /* Slurm counts whole minutes: the daemons must know the limit Slurm will enforce. */
    if (args->time_limit_s % 60) {
        long min = sbatch_time_minutes(args->time_limit_s);
        if (!args->emit_sbatch)
            fprintf(stderr, "gpurun: -t %lds: Slurm counts whole minutes; the limit is %ld:00\n",
                    args->time_limit_s, min);
        args->time_limit_s = min * 60;
        spec->time_limit_s = (int)args->time_limit_s;
    }
    if (args->job_dir && absolute(args->job_dir, job_dir, sizeof(job_dir)) < 0)
        return error_out(EXIT_FAILED, "job dir '%s': path too long", args->job_dir);
    /* A relative -o is relative to the job's working directory, as sbatch makes it. */
    if (args->output
            ? snprintf(output, sizeof(output), "%s%s%s", args->output[0] == '/' ? "" : cwd,
                       args->output[0] == '/' ? "" : "/", args->output) >= (int)sizeof(output)
            : snprintf(output, sizeof(output), "%s/%%j.out", root) >= (int)sizeof(output))
        return error_out(EXIT_FAILED, "output '%s': path too long", args->output);
    if (find_program("rendezvousd", daemon, sizeof(daemon)) < 0)
        return error_out(EXIT_FAILED, "cannot find 'rendezvousd' beside gpurun or on PATH");
    if (jobspec_set_argv(spec, p->argc, p->argv) < 0 || !(spec->workdir = strdup(cwd)))
        return error_out(EXIT_FAILED, "out of memory");
    r = set_metrics_dir(args, spec);
    if (r)
        return r;
    spec->loopback = false;
    r = spec_text(spec, &json);
    if (r < 0)
        return error_out(EXIT_FAILED, "cannot write the job spec: %s",
                         r == -EINVAL ? "a string is not UTF-8" : uv_strerror(r));

    job.job_name = args->job_name;
    job.nodes = spec->nnodes;
    job.ranks_per_node = spec->nprocs;
    job.gpus_per_node = args->no_gpus ? 0 : spec->nprocs;
    job.cpus_per_task = slurm_cpus_per_rank(args) * spec->nprocs;
    job.time_limit_min = sbatch_time_minutes(args->time_limit_s);
    job.signal_before_s = sbatch_signal_before(job.time_limit_min);
    job.preempt_signal = spec->preempt_signal;
    if (args->signal.text) {
        job.signal_text = args->signal.text;
        job.signal_time_s = args->signal.time_s;
        job.signal_batch_only = args->signal.batch_only;
        job.signal_reservation = args->signal.reservation;
    }
    job.partition = args->partition;
    job.account = args->account;
    job.output = output;
    job.work_dir = cwd;
    job.rendezvousd = daemon;
    job.jobs_root = root;
    job.job_dir = args->job_dir ? job_dir : NULL;
    job.log_level = args->log_level_name;
    job.spec_json = json;
    job.argv = p->argv;
    if (job.cpus_per_task > 65535) {
        ret = error_out(EXIT_FAILED, "--cpus-per-gpu: %d CPUs per node is more than Slurm takes",
                        job.cpus_per_task);
        goto out;
    }
    if (sbatch_render(&job, &script, &berr) < 0) {
        ret = error_out(EXIT_FAILED, "%s", berr.text);
        goto out;
    }
    /* Slurm opens the batch output before the script runs: its directory must exist. */
    if (!args->output && (r = fs_mkdirs(root, 0700)) < 0) {
        ret = error_out(EXIT_FAILED, "cannot create '%s': %s", root, uv_strerror(r));
        goto out;
    }
    if (args->emit_sbatch) {
        fputs(script, stdout);
        ret = 0;
        goto out;
    }
    ret = open_slurm();
    if (ret)
        goto out;
    if (slurmlib_check(&job, script, &serr) < 0 || slurmlib_submit(&job, script, &id, &serr) < 0) {
        ret = error_out(EXIT_FAILED, "%s; nothing submitted", serr.text);
        goto out;
    }
    printf("Submitted job %u\n", id);
    fflush(stdout);
    if (args->wait) {
        char num[16];
        snprintf(num, sizeof(num), "%u", id);
        if (args->job_dir)
            snprintf(dir, sizeof(dir), "%s", job_dir);
        else if (!join_path(dir, sizeof(dir), root, num))
            dir[0] = '\0';
        ret = submit_wait(id, dir[0] ? dir : NULL, fatal_signal);
    }
out:
    slurmlib_close();
    free(script);
    free(json);
    return ret;
}

static int cmd_run(struct gpurun_args *args, int *fatal_signal)
{
    extern char **environ;
    struct args_error err;
    struct run_plan plan;
    int ret;

    /* sbatch's variables are for Slurm jobs, as sbatch reads them; before the train.cfg,
     * which they beat. */
    if (!args->local && args_apply_env(args, environ, &err) < 0)
        return error_out(EXIT_FAILED, "%s", err.text);
    memset(&plan, 0, sizeof(plan));
    ret = plan_run(args, &plan);
    if (ret == 0)
        ret = plan_spec(args);
    if (ret == 0)
        ret = args->local ? run_local(args, &plan, fatal_signal)
                          : run_slurm(args, &plan, fatal_signal);
    plan_release(&plan);
    return ret;
}

/* --- clean ----------------------------------------------------------------------------------- */

/* What gpurun clean did, for its last line. */
struct clean_tally {
    int removed, links, kept_live, kept_recent, kept_unknown, failed;
    uint64_t bytes;
};

/* "12.3 MiB" (or KiB under a MiB) into buf. */
static const char *human_size(char *buf, size_t n, uint64_t bytes)
{
    if (bytes < 1024 * 1024)
        snprintf(buf, n, "%.1f KiB", (double)bytes / 1024.0);
    else
        snprintf(buf, n, "%.1f MiB", (double)bytes / (1024.0 * 1024.0));
    return buf;
}

/* One entry of the jobs root: a dangling link goes; a job dir goes when its job has ended
 * (and longer ago than --older-than), with its batch output ROOT/NAME.out. */
static void clean_one(const struct gpurun_args *args, const char *root, const char *name,
                      bool slurm_ok, struct clean_tally *t)
{
    char path[PATH_MAX], file[PATH_MAX + 300], size[32];
    struct slurmlib_job job = {0};
    struct slurmlib_error err;
    struct stat st, sum;
    bool loaded = false, has_summary, ended;
    uint64_t bytes = 0;
    uint32_t id;
    json_t *v;
    int r;

    if (!join_path(path, sizeof(path), root, name) || lstat(path, &st) < 0)
        return;
    if (S_ISLNK(st.st_mode)) {
        /* A --job-dir's link: its dir is the user's, never removed here; a dangling link is. */
        if (stat(path, &st) < 0 && errno == ENOENT) {
            if (!args->dry_run && unlink(path) < 0) {
                t->failed++;
                fprintf(stderr, "gpurun: cannot remove the link '%s': %s\n", path,
                        uv_strerror(-errno));
                return;
            }
            t->links++;
            printf("%s the link '%s' (its job dir is gone)\n",
                   args->dry_run ? "would remove" : "removed", path);
        }
        return;
    }
    snprintf(file, sizeof(file), "%s/job.json", path);
    if (!S_ISDIR(st.st_mode) || access(file, F_OK) < 0)
        return;
    snprintf(file, sizeof(file), "%s/summary.json", path);
    has_summary = stat(file, &sum) == 0;
    /* A Slurm job without a summary may still run: only slurmctld can say it has ended (or
     * forgotten it, which it does only after the end). With a summary its batch script may
     * still be finishing: where slurmctld answers, its word decides too. */
    if (slurmlib_parse_id(name, &id) == 0 && (slurm_ok || !has_summary)) {
        r = slurm_ok ? slurmlib_load(id, &job, &err) : -EAGAIN;
        if (r < 0 && r != -ENOENT && !has_summary) {
            t->kept_unknown++;
            return;
        }
        loaded = r == 0;
    }
    {
        struct view_input in = {
            .job_id = name, .slurm = loaded ? &job : NULL, .job_dir = path, .no_live = true};
        v = view_build(&in);
    }
    ended = v && view_ended(v);
    if (!ended) {
        t->kept_live++;
        goto out;
    }
    if (args->older_than_days > 0 && time(NULL) - (has_summary ? sum.st_mtime : st.st_mtime) <
                                         (time_t)args->older_than_days * 86400) {
        t->kept_recent++;
        goto out;
    }
    snprintf(file, sizeof(file), "%s/%s.out", root, name);
    if (args->dry_run) {
        struct stat out;
        fs_tree_size(path, &bytes);
        if (stat(file, &out) == 0)
            bytes += (uint64_t)out.st_size;
    } else {
        struct stat out;
        if (stat(file, &out) == 0 && unlink(file) == 0)
            bytes += (uint64_t)out.st_size;
        r = fs_remove_tree(path, &bytes);
        if (r < 0) {
            t->failed++;
            fprintf(stderr, "gpurun: cannot remove '%s' whole: %s\n", path, uv_strerror(r));
            goto out;
        }
    }
    t->removed++;
    t->bytes += bytes;
    printf("%s '%s' (%s, %s)\n", args->dry_run ? "would remove" : "removed", path,
           json_string_value(json_object_get(v, "state")), human_size(size, sizeof(size), bytes));
out:
    json_decref(v);
    if (loaded)
        slurmlib_job_release(&job);
}

static int cmd_clean(struct gpurun_args *args, int *fatal_signal)
{
    struct clean_tally t = {0};
    struct slurmlib_error err;
    struct dirent **ents = NULL;
    char root[PATH_MAX], conf[PATH_MAX], size[32];
    bool slurm_ok = false;
    int n, ret;

    (void)fatal_signal;
    ret = jobs_root(root, sizeof(root));
    if (ret)
        return ret;
    n = scandir(root, &ents, NULL, alphasort);
    if (n < 0 && errno == ENOENT) {
        printf("no job dirs in '%s'\n", root);
        return 0;
    }
    if (n < 0)
        return error_out(EXIT_FAILED, "cannot read '%s': %s", root, uv_strerror(-errno));
    if (slurmlib_conf_path(conf, sizeof(conf)) == 0) {
        slurm_ok = slurmlib_open(SLURM_OPEN_TIMEOUT_S, &err) == 0;
        if (!slurm_ok)
            fprintf(stderr, "gpurun: %s; Slurm jobs without a summary are kept\n", err.text);
    }
    for (int i = 0; i < n; i++) {
        if (ents[i]->d_name[0] != '.')
            clean_one(args, root, ents[i]->d_name, slurm_ok, &t);
        free(ents[i]);
    }
    free(ents);
    if (slurm_ok)
        slurmlib_close();
    printf("%s %d job dir%s and %d link%s, %s; kept %d pending or running",
           args->dry_run ? "would remove" : "removed", t.removed, t.removed == 1 ? "" : "s",
           t.links, t.links == 1 ? "" : "s", human_size(size, sizeof(size), t.bytes), t.kept_live);
    if (args->older_than_days > 0)
        printf(", %d ended %d days ago or later", t.kept_recent, args->older_than_days);
    if (t.kept_unknown)
        printf(", %d Slurm job%s whose end Slurm could not confirm", t.kept_unknown,
               t.kept_unknown == 1 ? "" : "s");
    printf("\n");
    return t.failed ? EXIT_FAILED : 0;
}

/* Indexed by enum gpurun_cmd. */
static int (*const handlers[CMD_COUNT])(struct gpurun_args *, int *) = {
    [CMD_RUN] = cmd_run,       [CMD_STATUS] = cmd_status, [CMD_LOGS] = cmd_logs,
    [CMD_CANCEL] = cmd_cancel, [CMD_CLEAN] = cmd_clean,
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
