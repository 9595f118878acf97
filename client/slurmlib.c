/* libslurm, behind gpurun's own types. Written against Slurm 22.05's <slurm/slurm.h>; where
 * 22.05 exports a function without declaring it, the declaration is here with a note. Built
 * without libslurm (GPURUN_NO_LIBSLURM), the module still parses ids and maps states, and
 * slurmlib_open() says what is missing. */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef GPURUN_NO_LIBSLURM
#include <slurm/slurm.h>
#include <slurm/slurm_errno.h>
#endif

#include "log.h"
#include "slurmlib.h"
#include "banned.h"

/* Where libslurm looks when SLURM_CONF is unset (Debian's and upstream's default). */
#define DEFAULT_SLURM_CONF "/etc/slurm/slurm.conf"

/* The bound on every call after the first contact: libslurm gives up on its own after
 * MessageTimeout (10 s by default) for each of a few retries; past this it hangs. */
#define CALL_TIMEOUT_S 60

static const char *const state_names[SLURMLIB_STATE_COUNT] = {
    "PENDING", "RUNNING",   "SUSPENDED", "COMPLETED", "CANCELLED", "FAILED",
    "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE",  "OOM",
};

const char *slurmlib_state_name(enum slurmlib_state state)
{
    return (unsigned)state < SLURMLIB_STATE_COUNT ? state_names[state] : "UNKNOWN";
}

int slurmlib_exit_status(const struct slurmlib_job *job)
{
    int own = job->exit_signal ? 128 + job->exit_signal : job->exit_code > 0 ? job->exit_code : 0;

    switch (job->state) {
    case SLURMLIB_COMPLETED:
        return own;
    case SLURMLIB_FAILED:
        return own ? own : 125;
    case SLURMLIB_CANCELLED:
        return own ? own : 128 + SIGTERM;
    case SLURMLIB_TIMEOUT:
        return 124;
    case SLURMLIB_OOM:
        return 128 + SIGKILL;
    default:
        return 125;
    }
}

void slurmlib_job_release(struct slurmlib_job *job)
{
    free(job->name);
    free(job->partition);
    free(job->reason);
    free(job->nodelist);
    slurmlib_names_free(job->nodes);
    free(job->batch_host);
    free(job->std_out);
    free(job->comment);
    free(job->exc_nodes);
    memset(job, 0, sizeof(*job));
}

void slurmlib_names_free(char **names)
{
    for (char **p = names; p && *p; p++)
        free(*p);
    free(names);
}

int slurmlib_parse_id(const char *s, uint32_t *id)
{
    unsigned long v = 0;

    if (!*s || strlen(s) > 10)
        return -EINVAL;
    for (const char *p = s; *p; p++) {
        if (!isdigit((unsigned char)*p))
            return -EINVAL;
        v = v * 10 + (unsigned long)(*p - '0');
    }
    /* 0 and the top values are Slurm's NO_VAL markers, never a job's id. */
    if (v == 0 || v >= 0xfffffffeUL)
        return -EINVAL;
    *id = (uint32_t)v;
    return 0;
}

int slurmlib_conf_path(char *buf, size_t n)
{
    const char *env = getenv("SLURM_CONF");

    snprintf(buf, n, "%s", env && *env ? env : DEFAULT_SLURM_CONF);
    return access(buf, R_OK) == 0 ? 0 : -ENOENT;
}

#ifdef GPURUN_NO_LIBSLURM

int slurmlib_open(int timeout_s, struct errmsg *err)
{
    (void)timeout_s;
    return errmsg_set(err, -ENOSYS,
                      "this gpurun was built without libslurm (install libslurm-dev and "
                      "rebuild); use --local to run on this machine");
}

void slurmlib_close(void)
{
}

int slurmlib_check(const struct sbatch_job *job, const char *script, struct errmsg *err)
{
    (void)job, (void)script;
    return slurmlib_open(0, err);
}

int slurmlib_submit(const struct sbatch_job *job, const char *script, uint32_t *id,
                    struct errmsg *err)
{
    (void)job, (void)script, (void)id;
    return slurmlib_open(0, err);
}

int slurmlib_load(uint32_t id, struct slurmlib_job *job, struct errmsg *err)
{
    (void)id;
    memset(job, 0, sizeof(*job));
    return slurmlib_open(0, err);
}

int slurmlib_cpus_per_rank(const char *partition, int ranks, bool gpus, int *cpus,
                           struct errmsg *err)
{
    (void)partition, (void)ranks, (void)gpus, (void)cpus;
    return slurmlib_open(0, err);
}

int slurmlib_list(uint32_t uid, struct slurmlib_job **jobs, size_t *n, struct errmsg *err)
{
    (void)uid;
    *jobs = NULL;
    *n = 0;
    return slurmlib_open(0, err);
}

int slurmlib_kill(uint32_t id, struct errmsg *err)
{
    (void)id;
    return slurmlib_open(0, err);
}

int slurmlib_exclude(uint32_t id, const char *nodes, time_t begin, struct errmsg *err)
{
    (void)id, (void)nodes, (void)begin;
    return slurmlib_open(0, err);
}

int slurmlib_parse_begin(const char *text, long long *t, struct errmsg *err)
{
    (void)text, (void)t;
    return slurmlib_open(0, err);
}

int slurmlib_hostlist_expand(const char *list, char ***names, int *n)
{
    (void)list;
    *names = NULL;
    *n = 0;
    return -ENOSYS;
}

#else /* libslurm */

_Static_assert(JOB_PENDING == (int)SLURMLIB_PENDING && JOB_COMPLETE == (int)SLURMLIB_COMPLETED &&
                   JOB_OOM == (int)SLURMLIB_OOM && JOB_END == (int)SLURMLIB_STATE_COUNT,
               "Slurm's job states moved: update enum slurmlib_state");

_Static_assert(MAIL_JOB_BEGIN == SLURMOPT_MAIL_BEGIN && MAIL_JOB_END == SLURMOPT_MAIL_END &&
                   MAIL_JOB_FAIL == SLURMOPT_MAIL_FAIL &&
                   MAIL_JOB_REQUEUE == SLURMOPT_MAIL_REQUEUE &&
                   MAIL_JOB_TIME100 == SLURMOPT_MAIL_TIME100 &&
                   MAIL_JOB_TIME90 == SLURMOPT_MAIL_TIME90 &&
                   MAIL_JOB_TIME80 == SLURMOPT_MAIL_TIME80 &&
                   MAIL_JOB_TIME50 == SLURMOPT_MAIL_TIME50 &&
                   MAIL_JOB_STAGE_OUT == SLURMOPT_MAIL_STAGE_OUT &&
                   MAIL_ARRAY_TASKS == SLURMOPT_MAIL_ARRAY_TASKS &&
                   MAIL_INVALID_DEPEND == SLURMOPT_MAIL_INVALID_DEPEND,
               "Slurm's mail types moved: update SLURMOPT_MAIL_*");

/* Exported by libslurm 22.05 but missing from its slurm.h. */
extern char *slurm_job_reason_string(enum job_state_reason inx);
/* sbatch's own --begin parser (src/common/parse_time.c): 0 for a time it cannot read. */
extern time_t slurm_parse_time(const char *time_str, int past);
extern void slurm_free_will_run_response_msg(will_run_response_msg_t *msg);

/* --- bounding libslurm ----------------------------------------------------------------------
 * A call runs between guard_enter() and guard_leave(): stderr points at /dev/null (libslurm
 * logs its own version of every error this module reports), and an alarm ends the process
 * with one line if the call outlives its bound. An exit() from inside libslurm (its fatal())
 * is caught at exit the same way. The lines are made before the call: a signal handler may
 * only write(). */

static bool opened;
static volatile sig_atomic_t in_call;
static int saved_stderr = -1;
static char timeout_line[PATH_MAX + 256];
static char fatal_line[PATH_MAX + 256];
static char conf[PATH_MAX];

static void on_alarm(int sig)
{
    (void)sig;
    if (!in_call)
        return;
    if (saved_stderr >= 0)
        dup2(saved_stderr, STDERR_FILENO);
    if (write(STDERR_FILENO, timeout_line, strlen(timeout_line)) < 0) {
        /* nothing left to tell it with */
    }
    _exit(125);
}

static void at_exit(void)
{
    if (!in_call)
        return;
    if (saved_stderr >= 0)
        dup2(saved_stderr, STDERR_FILENO);
    if (write(STDERR_FILENO, fatal_line, strlen(fatal_line)) < 0) {
        /* as above */
    }
    _exit(125);
}

/* quiet: send libslurm's stderr to /dev/null for the call (not at debug level, where its
 * own words may help). */
static void guard_enter(int timeout_s, bool quiet)
{
    snprintf(timeout_line, sizeof(timeout_line),
             "gpurun: slurmctld did not answer within %d s (SLURM_CONF '%s'): is it running?\n",
             timeout_s, conf);
    if (quiet && log_threshold < LOG_DEBUG) {
        int null = open("/dev/null", O_WRONLY | O_CLOEXEC);
        fflush(stderr);
        saved_stderr = fcntl(STDERR_FILENO, F_DUPFD_CLOEXEC, 3);
        if (null >= 0 && saved_stderr >= 0)
            dup2(null, STDERR_FILENO);
        if (null >= 0)
            close(null);
    }
    in_call = 1;
    alarm((unsigned)timeout_s);
}

static void guard_leave(void)
{
    alarm(0);
    in_call = 0;
    if (saved_stderr >= 0) {
        dup2(saved_stderr, STDERR_FILENO);
        close(saved_stderr);
        saved_stderr = -1;
    }
}

/* libslurm's text for its last error, lowercased at the start to read as ours. */
static const char *slurm_text(int code, char *buf, size_t n)
{
    snprintf(buf, n, "%s", slurm_strerror(code));
    if (buf[0] && isupper((unsigned char)buf[0]) && !isupper((unsigned char)buf[1]))
        buf[0] = (char)tolower((unsigned char)buf[0]);
    return buf;
}

int slurmlib_open(int timeout_s, struct errmsg *err)
{
    struct sigaction sa = {.sa_handler = on_alarm};
    static bool hooked;
    char text[256];
    int r;

    if (opened)
        return 0;
    if (slurmlib_conf_path(conf, sizeof(conf)) < 0)
        return errmsg_set(
            err, -ENOENT,
            getenv("SLURM_CONF") && *getenv("SLURM_CONF")
                ? "no Slurm configuration: SLURM_CONF names '%s', which does not exist"
                : "no Slurm configuration: SLURM_CONF is unset and '%s' does not exist "
                  "(gpurun --local runs jobs without Slurm)",
            conf);
    if (!hooked) {
        sigemptyset(&sa.sa_mask);
        sigaction(SIGALRM, &sa, NULL);
        atexit(at_exit);
        hooked = true;
    }
    snprintf(fatal_line, sizeof(fatal_line),
             "gpurun: libslurm gave up on the Slurm configuration '%s' (see its message above)\n",
             conf);
    /* slurm_init() parses slurm.conf: its complaints are the useful part, so stderr stays. */
    guard_enter(timeout_s, false);
    slurm_init(NULL);
    guard_leave();
    snprintf(fatal_line, sizeof(fatal_line),
             "gpurun: libslurm ended gpurun (SLURM_CONF '%s'); run with --log-level debug to see "
             "why\n",
             conf);
    guard_enter(timeout_s, true);
    r = slurm_ping(0);
    guard_leave();
    if (r != SLURM_SUCCESS) {
        int code = slurm_get_errno();
        slurm_fini();
        return errmsg_set(err, -EHOSTUNREACH, "cannot reach slurmctld (SLURM_CONF '%s'): %s", conf,
                          slurm_text(code ? code : r, text, sizeof(text)));
    }
    opened = true;
    return 0;
}

void slurmlib_close(void)
{
    if (!opened)
        return;
    slurm_fini();
    opened = false;
}

/* Slurm's shared values for --exclusive, by enum slurmopt_exclusive. */
static const uint16_t shared_values[] = {
    [SLURMOPT_EXCLUSIVE] = JOB_SHARED_NONE,
    [SLURMOPT_EXCLUSIVE_USER] = JOB_SHARED_USER,
    [SLURMOPT_EXCLUSIVE_MCS] = JOB_SHARED_MCS,
};

/* The fields of sbatch's scheduling options, as slurm_opt_create_job_desc() fills them. */
static void fill_scheduling(const struct sbatch_job *job, job_desc_msg_t *d)
{
    static char mem_tres[64];

    d->qos = (char *)job->qos;
    switch (job->mem_per) {
    case SLURMOPT_MEM_NONE:
        break;
    case SLURMOPT_MEM_NODE:
        d->pn_min_memory = job->mem_mb;
        break;
    case SLURMOPT_MEM_CPU:
        d->pn_min_memory = job->mem_mb | MEM_PER_CPU;
        break;
    case SLURMOPT_MEM_GPU:
        snprintf(mem_tres, sizeof(mem_tres), "gres:gpu:%llu", job->mem_mb);
        d->mem_per_tres = mem_tres;
        break;
    }
    if (job->exclusive != SLURMOPT_SHARED_DEFAULT)
        d->shared = shared_values[job->exclusive];
    d->features = (char *)job->constraint;
    d->dependency = (char *)job->dependency;
    d->req_nodes = (char *)job->nodelist;
    d->exc_nodes = (char *)job->exclude;
    d->reservation = (char *)job->reservation;
    if (job->begin)
        d->begin_time = (time_t)job->begin_time;
    /* sbatch --hold: priority 0 is "held by the user" (scontrol release lifts it). */
    if (job->hold)
        d->priority = 0;
    if (job->mail_type)
        d->mail_type = (uint16_t)job->mail_type;
    d->mail_user = (char *)job->mail_user;
}

void slurmlib_fill_desc(const struct sbatch_job *job, const char *script, char **env,
                        uint32_t env_size, struct job_descriptor *desc)
{
    static char tres[4 * SLURMOPT_GRES_LEN_MAX], comment[SBATCH_COMMENT_LEN_MAX + 16];
    job_desc_msg_t *d = desc;

    slurm_init_job_desc_msg(d);
    d->name = (char *)job->job_name;
    d->script = (char *)script;
    d->environment = env;
    d->env_size = env_size;
    d->user_id = getuid();
    d->group_id = getgid();
    d->min_nodes = d->max_nodes = (uint32_t)job->nodes;
    d->num_tasks = (uint32_t)job->nodes;
    d->ntasks_per_node = 1;
    d->cpus_per_task = (uint16_t)job->cpus_per_task;
    if (job->gpus_per_node > 0 || job->gres) {
        /* The form sbatch sends for --gpus-per-node; "gpu:N" and "gres/gpu:N" are refused.
         * --gres follows, each of its items with "gres:" before it, as sbatch does
         * (gres_prepend_tres_type). */
        size_t len = 0;
        tres[0] = '\0';
        if (job->gpus_per_node > 0)
            len = (size_t)snprintf(tres, sizeof(tres), "gres:gpu:%s%s%d",
                                   job->gpu_type ? job->gpu_type : "", job->gpu_type ? ":" : "",
                                   job->gpus_per_node);
        for (const char *p = job->gres; p && *p && len < sizeof(tres);) {
            size_t n = strcspn(p, ",");
            bool prefixed = n >= 5 && !strncmp(p, "gres:", 5);
            len += (size_t)snprintf(tres + len, sizeof(tres) - len, "%s%s%.*s", len ? "," : "",
                                    prefixed ? "" : "gres:", (int)n, p);
            p += n + (p[n] == ',');
        }
        d->tres_per_node = tres;
    }
    if (job->time_limit_min > 0)
        d->time_limit = (uint32_t)job->time_limit_min;
    else if (job->time_limit_min == SBATCH_TIME_UNLIMITED)
        d->time_limit = INFINITE; /* sbatch's --time=0 or UNLIMITED */
    d->partition = (char *)job->partition;
    d->account = (char *)job->account;
    d->std_out = (char *)job->output;
    d->std_err = (char *)job->output;
    d->work_dir = (char *)job->work_dir;
    if (job->signal_text) {
        /* The user's --signal, as sbatch fills it. */
        d->warn_signal = (uint16_t)job->preempt_signal;
        d->warn_time = (uint16_t)job->signal_time_s;
        d->warn_flags = (job->signal_batch_only ? KILL_JOB_BATCH : 0) |
                        (job->signal_reservation ? KILL_JOB_RESV : 0);
    } else if (job->signal_before_s > 0) {
        d->warn_signal = SIGUSR1;
        d->warn_time = (uint16_t)job->signal_before_s;
        d->warn_flags = KILL_JOB_BATCH; /* the "B:" of --signal: the batch shell only */
    }
    d->requeue = job->requeue ? 1 : 0;
    if (job->no_kill)
        d->kill_on_node_fail = 0;
    if (job->requeue)
        d->open_mode = OPEN_MODE_APPEND;
    d->comment = (char *)sbatch_comment(job->comment, comment, sizeof(comment));
    fill_scheduling(job, d);
}

static uint32_t env_count(char **env)
{
    uint32_t n = 0;

    while (env && env[n])
        n++;
    return n;
}

/* What slurmctld's will-run check says of a value of sbatch's options, and the option whose
 * value it is (a field of struct sbatch_job): the message names both. */
static const struct {
    int code;
    const char *option;
    size_t offset;
} refusals[] = {
    {ESLURM_INVALID_QOS, "qos", offsetof(struct sbatch_job, qos)},
    {ESLURM_INVALID_FEATURE, "constraint", offsetof(struct sbatch_job, constraint)},
    {ESLURM_INVALID_NODE_NAME, "nodelist", offsetof(struct sbatch_job, nodelist)},
    {ESLURM_INVALID_NODE_NAME, "exclude", offsetof(struct sbatch_job, exclude)},
    {ESLURM_RESERVATION_INVALID, "reservation", offsetof(struct sbatch_job, reservation)},
    {ESLURM_RESERVATION_ACCESS, "reservation", offsetof(struct sbatch_job, reservation)},
    {ESLURM_RESERVATION_NOT_USABLE, "reservation", offsetof(struct sbatch_job, reservation)},
    {ESLURM_DEPENDENCY, "dependency", offsetof(struct sbatch_job, dependency)},
    {ESLURM_INVALID_GRES, "gres", offsetof(struct sbatch_job, gres)},
};

/* The memory options' names, by enum slurmopt_mem_per, for the refusal of a job that asks
 * more than a node has. */
static const char *const mem_options[] = {
    [SLURMOPT_MEM_NODE] = "mem",
    [SLURMOPT_MEM_CPU] = "mem-per-cpu",
    [SLURMOPT_MEM_GPU] = "mem-per-gpu",
};

int slurmlib_check(const struct sbatch_job *job, const char *script, struct errmsg *err)
{
    extern char **environ;
    will_run_response_msg_t *resp = NULL;
    job_desc_msg_t d;
    char text[256];
    int r, code;

    slurmlib_fill_desc(job, script, environ, env_count(environ), &d);
    guard_enter(CALL_TIMEOUT_S, true);
    r = slurm_job_will_run2(&d, &resp);
    code = r == SLURM_SUCCESS ? 0 : slurm_get_errno();
    guard_leave();
    if (resp)
        slurm_free_will_run_response_msg(resp);
    if (r == SLURM_SUCCESS)
        return 0;
    for (size_t i = 0; i < sizeof(refusals) / sizeof(refusals[0]); i++) {
        const char *v = *(const char *const *)((const char *)job + refusals[i].offset);
        if (refusals[i].code == code && v)
            return errmsg_set(err, -EINVAL, "--%s: '%s': %s", refusals[i].option, v,
                              slurm_text(code, text, sizeof(text)));
    }
    switch (code) {
    case ESLURM_INVALID_PARTITION_NAME:
        return errmsg_set(err, -EINVAL, "unknown partition '%s'",
                          job->partition ? job->partition : "");
    case ESLURM_INVALID_ACCOUNT:
        return errmsg_set(err, -EINVAL, "invalid account '%s'", job->account ? job->account : "");
    case ESLURM_INVALID_TIME_LIMIT:
        if (job->time_limit_min == SBATCH_TIME_UNLIMITED)
            return errmsg_set(err, -EINVAL,
                              "no time limit (-t 0) is over the partition's: give -t with a "
                              "limit");
        return errmsg_set(err, -EINVAL, "time limit of %ld minutes is over the partition's",
                          job->time_limit_min);
    case ESLURM_REQUESTED_NODE_CONFIG_UNAVAILABLE:
    case ESLURM_INVALID_NODE_COUNT:
    case ESLURM_NODES_BUSY:
        if (code != ESLURM_NODES_BUSY) {
            char mem[64] = "", cpus[64];
            int ranks = job->ranks_per_node;
            /* The CPUs are the ranks' (one task per node asks for all of them): say which
             * option sets them. */
            if (ranks > 0 && job->cpus_per_task % ranks == 0)
                snprintf(cpus, sizeof(cpus), " (--cpus-per-gpu %d x %d rank%s)",
                         job->cpus_per_task / ranks, ranks, ranks == 1 ? "" : "s");
            else
                snprintf(cpus, sizeof(cpus), " (--cpus-per-gpu sets them)");
            if (job->mem_per != SLURMOPT_MEM_NONE) {
                char size[32];
                slurmopt_format_mem(size, sizeof(size), job->mem_mb);
                snprintf(mem, sizeof(mem), ", --%s=%s", mem_options[job->mem_per], size);
            }
            return errmsg_set(
                err, -EINVAL,
                "Slurm cannot give %d node%s with %d GPU%s and %d CPU%s each%s%s%s%s%s (%s)",
                job->nodes, job->nodes == 1 ? "" : "s", job->gpus_per_node,
                job->gpus_per_node == 1 ? "" : "s", job->cpus_per_task,
                job->cpus_per_task == 1 ? "" : "s", cpus, mem, job->partition ? " in '" : "",
                job->partition ? job->partition : "", job->partition ? "'" : "",
                slurm_text(code, text, sizeof(text)));
        }
        return 0;
    default:
        if (code == SLURM_PROTOCOL_SOCKET_IMPL_TIMEOUT ||
            code == SLURM_COMMUNICATIONS_CONNECTION_ERROR)
            return errmsg_set(err, -EHOSTUNREACH, "cannot reach slurmctld: %s",
                              slurm_text(code, text, sizeof(text)));
        return errmsg_set(err, -EINVAL, "Slurm refuses the job: %s",
                          slurm_text(code, text, sizeof(text)));
    }
}

int slurmlib_submit(const struct sbatch_job *job, const char *script, uint32_t *id,
                    struct errmsg *err)
{
    extern char **environ;
    submit_response_msg_t *resp = NULL;
    job_desc_msg_t d;
    char text[256];
    int r, code;

    slurmlib_fill_desc(job, script, environ, env_count(environ), &d);
    guard_enter(CALL_TIMEOUT_S, true);
    r = slurm_submit_batch_job(&d, &resp);
    code = r == SLURM_SUCCESS ? 0 : slurm_get_errno();
    guard_leave();
    if (r != SLURM_SUCCESS || !resp) {
        if (resp)
            slurm_free_submit_response_response_msg(resp);
        return errmsg_set(err, -EIO, "Slurm refused the job: %s",
                          slurm_text(code, text, sizeof(text)));
    }
    *id = resp->job_id;
    slurm_free_submit_response_response_msg(resp);
    return 0;
}

int slurmlib_parse_begin(const char *text, long long *t, struct errmsg *err)
{
    time_t v;

    /* parse_time() says what it could not read on stderr, in words of its own. */
    guard_enter(CALL_TIMEOUT_S, true);
    v = slurm_parse_time(text, 0);
    guard_leave();
    if (v == 0)
        return errmsg_set(err, -EINVAL,
                          "--begin: '%s' is not a time (sbatch's forms: HH:MM[:SS], now+N[minutes|"
                          "hours|days|weeks], YYYY-MM-DD[THH:MM[:SS]], MM/DD[/YY], today, "
                          "tomorrow, midnight, noon)",
                          text);
    *t = (long long)v;
    return 0;
}

static char *dup_or_null(const char *s)
{
    return s && *s ? strdup(s) : NULL;
}

int slurmlib_hostlist_expand(const char *list, char ***names, int *n)
{
    hostlist_t hl;
    char *host, **out;
    int count, i = 0;

    *names = NULL;
    *n = 0;
    hl = slurm_hostlist_create(list);
    if (!hl)
        return -EINVAL;
    count = slurm_hostlist_count(hl);
    out = calloc((size_t)(count > 0 ? count : 0) + 1, sizeof(*out));
    if (!out) {
        slurm_hostlist_destroy(hl);
        return -ENOMEM;
    }
    /* slurm_hostlist_shift() returns malloc()ed names: they are ours to keep. */
    while (i < count && (host = slurm_hostlist_shift(hl)))
        out[i++] = host;
    slurm_hostlist_destroy(hl);
    *names = out;
    *n = i;
    return 0;
}

static int copy_job(const slurm_job_info_t *j, struct slurmlib_job *out)
{
    uint32_t base = j->job_state & JOB_STATE_BASE;
    time_t now = time(NULL);
    char path[PATH_MAX];

    memset(out, 0, sizeof(*out));
    out->id = j->job_id;
    out->user_id = j->user_id;
    out->state = base < JOB_END ? (enum slurmlib_state)base : SLURMLIB_FAILED;
    out->completing = (j->job_state & JOB_COMPLETING) != 0;
    out->ended = base >= JOB_COMPLETE && !out->completing;
    out->submit_time = j->submit_time;
    out->start_time = base == JOB_PENDING ? 0 : j->start_time;
    out->begin_time = base == JOB_PENDING ? j->start_time : 0;
    out->end_time = base >= JOB_COMPLETE ? j->end_time : 0;
    if (out->start_time) {
        time_t until = out->end_time ? out->end_time : now;
        out->elapsed_s = (long)(until - out->start_time) - (long)j->pre_sus_time;
        if (base == JOB_SUSPENDED)
            out->elapsed_s = (long)j->pre_sus_time;
        if (out->elapsed_s < 0)
            out->elapsed_s = 0;
    }
    out->requeues = (int)j->restart_cnt;
    out->time_limit_min =
        j->time_limit == INFINITE || j->time_limit == NO_VAL ? 0 : (long)j->time_limit;
    out->exit_code = -1;
    if (base >= JOB_COMPLETE && !out->completing) {
        if (WIFSIGNALED(j->exit_code))
            out->exit_signal = WTERMSIG(j->exit_code);
        else
            out->exit_code = WEXITSTATUS(j->exit_code);
    }
    if (j->state_reason != WAIT_NO_REASON)
        out->reason =
            dup_or_null(j->state_desc && *j->state_desc ? j->state_desc
                                                        : slurm_job_reason_string(j->state_reason));
    out->name = dup_or_null(j->name);
    out->partition = dup_or_null(j->partition);
    out->nodelist = dup_or_null(j->nodes);
    out->batch_host = dup_or_null(j->batch_host);
    out->comment = dup_or_null(j->comment);
    out->exc_nodes = j->exc_nodes && *j->exc_nodes ? dup_or_null(j->exc_nodes) : NULL;
    if (out->nodelist) {
        if (slurmlib_hostlist_expand(out->nodelist, &out->nodes, &out->n_nodes) < 0)
            return -ENOMEM;
    } else {
        out->n_nodes = (int)j->num_nodes;
    }
    if (j->std_out) {
        slurm_get_job_stdout(path, sizeof(path), (job_info_t *)j);
        out->std_out = dup_or_null(path);
    }
    return 0;
}

int slurmlib_load(uint32_t id, struct slurmlib_job *job, struct errmsg *err)
{
    job_info_msg_t *msg = NULL;
    char text[256];
    int r, code;

    memset(job, 0, sizeof(*job));
    guard_enter(CALL_TIMEOUT_S, true);
    r = slurm_load_job(&msg, id, SHOW_DETAIL);
    code = r == SLURM_SUCCESS ? 0 : slurm_get_errno();
    guard_leave();
    /* An unknown id comes back as the return value itself, not as -1 and errno. */
    if (r == ESLURM_INVALID_JOB_ID || code == ESLURM_INVALID_JOB_ID)
        return errmsg_set(err, -ENOENT, "Slurm knows no job %u", id);
    if (r != SLURM_SUCCESS || !msg || msg->record_count < 1) {
        if (msg)
            slurm_free_job_info_msg(msg);
        return errmsg_set(err, -EIO, "cannot load job %u from slurmctld: %s", id,
                          slurm_text(code ? code : r, text, sizeof(text)));
    }
    r = copy_job(&msg->job_array[0], job);
    slurm_free_job_info_msg(msg);
    if (r < 0) {
        slurmlib_job_release(job);
        return errmsg_set(err, r, "out of memory");
    }
    return 0;
}

int slurmlib_list(uint32_t uid, struct slurmlib_job **jobs, size_t *n, struct errmsg *err)
{
    job_info_msg_t *msg = NULL;
    struct slurmlib_job *out = NULL;
    char text[256];
    size_t k = 0;
    int r, code;

    *jobs = NULL;
    *n = 0;
    guard_enter(CALL_TIMEOUT_S, true);
    r = slurm_load_job_user(&msg, uid, SHOW_DETAIL);
    code = r == SLURM_SUCCESS ? 0 : slurm_get_errno();
    guard_leave();
    if (r != SLURM_SUCCESS || !msg)
        return errmsg_set(err, -EIO, "cannot list jobs from slurmctld: %s",
                          slurm_text(code ? code : r, text, sizeof(text)));
    out = calloc(msg->record_count + 1, sizeof(*out));
    if (!out) {
        slurm_free_job_info_msg(msg);
        return errmsg_set(err, -ENOMEM, "out of memory");
    }
    for (uint32_t i = 0; i < msg->record_count; i++) {
        const slurm_job_info_t *j = &msg->job_array[i];
        if (!sbatch_is_gpurun_comment(j->comment))
            continue;
        if (copy_job(j, &out[k]) < 0) {
            slurmlib_job_release(&out[k]);
            continue;
        }
        k++;
    }
    slurm_free_job_info_msg(msg);
    *jobs = out;
    *n = k;
    return 0;
}

/* The GPUs in a node's GRES string ("gpu:8", "gpu:a100:4(S:0-1),nvme:2"): the count of its
 * gpu items. */
static int gres_gpus(const char *gres)
{
    int n = 0;

    for (const char *p = gres; p && *p;) {
        size_t len = strcspn(p, ",");
        if (!strncmp(p, "gpu:", 4)) {
            const char *end = p + len, *paren = memchr(p, '(', len), *c;
            if (paren)
                end = paren;
            for (c = end; c > p && c[-1] != ':'; c--)
                ;
            n += (int)strtol(c, NULL, 10);
        }
        p += len + (p[len] == ',');
    }
    return n;
}

int slurmlib_cpus_per_rank(const char *partition, int ranks, bool gpus, int *cpus,
                           struct errmsg *err)
{
    partition_info_msg_t *parts = NULL;
    node_info_msg_t *nodes = NULL;
    partition_info_t *part = NULL;
    hostlist_t hl = NULL;
    int best = 0, ret = 0, r;

    guard_enter(CALL_TIMEOUT_S, true);
    r = slurm_load_partitions(0, &parts, SHOW_ALL);
    if (r == SLURM_SUCCESS)
        r = slurm_load_node(0, &nodes, SHOW_ALL);
    if (r != SLURM_SUCCESS)
        ret = errmsg_set(err, -EIO, "cannot read the partitions and nodes: %s",
                         slurm_strerror(slurm_get_errno()));
    guard_leave();
    if (ret)
        goto out;
    for (uint32_t i = 0; i < parts->record_count && !part; i++) {
        partition_info_t *p = &parts->partition_array[i];
        if (partition ? (p->name && !strcmp(p->name, partition))
                      : (p->flags & PART_FLAG_DEFAULT) != 0)
            part = p;
    }
    if (!part || !part->nodes || !(hl = slurm_hostlist_create(part->nodes))) {
        ret = errmsg_set(err, -ENOENT, "no partition '%s'", partition ? partition : "(default)");
        goto out;
    }
    for (uint32_t i = 0; i < nodes->record_count; i++) {
        node_info_t *n = &nodes->node_array[i];
        int g = gres_gpus(n->gres), per;
        if (!n->name || slurm_hostlist_find(hl, n->name) < 0 || (gpus && g < ranks))
            continue;
        per = gpus ? n->cpus / g : n->cpus / ranks;
        if (per >= 1 && (!best || per < best))
            best = per;
    }
    if (!best)
        ret = errmsg_set(err, -ENOENT, "no node of partition '%s' has %d %s", part->name, ranks,
                         gpus ? "GPUs" : "CPUs");
    *cpus = best;
out:
    if (hl)
        slurm_hostlist_destroy(hl);
    if (nodes)
        slurm_free_node_info_msg(nodes);
    if (parts)
        slurm_free_partition_info_msg(parts);
    return ret;
}

int slurmlib_kill(uint32_t id, struct errmsg *err)
{
    char text[256];
    int r, code;

    guard_enter(CALL_TIMEOUT_S, true);
    r = slurm_kill_job(id, SIGKILL, 0);
    code = r == SLURM_SUCCESS ? 0 : slurm_get_errno();
    guard_leave();
    if (r == SLURM_SUCCESS)
        return 0;
    if (code == ESLURM_ALREADY_DONE)
        return errmsg_set(err, -EALREADY, "job %u has ended already", id);
    if (code == ESLURM_INVALID_JOB_ID)
        return errmsg_set(err, -ENOENT, "Slurm knows no job %u", id);
    return errmsg_set(err, -EIO, "cannot cancel job %u: %s", id,
                      slurm_text(code, text, sizeof(text)));
}

int slurmlib_exclude(uint32_t id, const char *nodes, time_t begin, struct errmsg *err)
{
    job_desc_msg_t d;
    char text[256];
    int r, code;

    slurm_init_job_desc_msg(&d);
    d.job_id = id;
    d.exc_nodes = (char *)nodes;
    if (begin > time(NULL))
        d.begin_time = begin;
    guard_enter(CALL_TIMEOUT_S, true);
    r = slurm_update_job(&d);
    code = r == SLURM_SUCCESS ? 0 : slurm_get_errno();
    guard_leave();
    if (r == SLURM_SUCCESS)
        return 0;
    return errmsg_set(err, -EIO, "cannot exclude nodes %s from job %u: %s", nodes, id,
                      slurm_text(code, text, sizeof(text)));
}

#endif
