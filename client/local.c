/* The local launcher. gpurun stays a thin parent: it starts the daemons with posix_spawn and
 * then sleeps in sigtimedwait() on SIGCHLD and the signals it forwards, so it adds no polling
 * and no timer to a job's launch or teardown; its only deadlines are the time limit and the
 * bounds on daemons that outlive the job. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <uv.h>

#include "fsutil.h"
#include "jobmark.h"
#include "jobspec.h"
#include "local.h"
#include "monotime.h"
#include "proto.h"
#include "signame.h"
#include "banned.h"

extern char **environ;

/* execvp's search path when PATH is unset (glibc's confstr(_CS_PATH)). */
#define DEFAULT_PATH "/bin:/usr/bin"

/* After a stopped daemon's kill_grace, this much more before gpurun sends SIGKILL: the
 * daemon's own teardown needs the grace for its ranks, then a moment to reap and exit. */
#define STOP_MARGIN_MS 2000

/* How long followers may outlive node 0. The leader exits after every agent has reported
 * and been told to finish, so followers are exiting already: milliseconds, or a second on a
 * loaded machine. One still running after this never found the leader (it failed before
 * writing endpoint.json) or lost it, and would wait for the join or heartbeat timeout. */
#define FOLLOWER_GRACE_MS 2000

/* A follower that exits with 125 while the leader runs either failed to start (the leader
 * would wait for it until the join timeout) or is ending a job that failed with 125 (the
 * leader follows within milliseconds, having recorded why). This long tells them apart. */
#define FOLLOWER_FAIL_GRACE_MS 1000

/* How long a daemon the leader gave up has, continued and told to end, to write what it holds
 * (its ranks' last words, their shims' counts) before it is killed. */
#define GIVEN_UP_GRACE_MS 500

/* The request for the pre-timeout signal in the job dir, holding its number: the leader's
 * PREEMPT_FILE (daemon/leader_int.h), which the batch script writes on Slurm. */
#define PREEMPT_FILE "preempt"

/* 0 when path is an executable regular file, -EACCES when it exists but is not, else the
 * stat error. */
static int check_exec(const char *path)
{
    struct stat st;

    if (stat(path, &st) < 0)
        return -errno;
    if (!S_ISREG(st.st_mode) || access(path, X_OK) < 0)
        return -EACCES;
    return 0;
}

int local_resolve(const char *name, const char *path, char *out, size_t n)
{
    int found = -ENOENT;

    if (!*name)
        return -ENOENT;
    if (strchr(name, '/')) {
        if (snprintf(out, n, "%s", name) >= (int)n)
            return -ENAMETOOLONG;
        found = check_exec(name);
        return found == 0 || found == -EACCES ? found : -ENOENT;
    }
    if (!path || !*path)
        path = DEFAULT_PATH;
    for (const char *p = path;; p++) {
        const char *colon = strchr(p, ':');
        size_t len = colon ? (size_t)(colon - p) : strlen(p);
        int r;

        /* An empty entry is the current directory, as for execvp. */
        if (len == 0)
            r = snprintf(out, n, "%s", name);
        else
            r = snprintf(out, n, "%.*s/%s", (int)len, p, name);
        if (r < (int)n) {
            r = check_exec(out);
            if (r == 0)
                return 0;
            if (r == -EACCES)
                found = -EACCES;
        }
        if (!colon)
            break;
        p = colon;
    }
    return found;
}

int local_gpu_list_count(const char *list)
{
    int count = 0;

    for (const char *p = list; p && *p; count++) {
        size_t len = strcspn(p, ",");
        p += len + (p[len] == ',');
    }
    return count;
}

int local_find_program(const char *name, const char *self, const char *path, char *out, size_t n)
{
    const char *slash = self ? strrchr(self, '/') : NULL;
    char found[PATH_MAX], *real;
    int r;

    if (!(slash &&
          snprintf(found, sizeof(found), "%.*s/%s", (int)(slash - self), self, name) <
              (int)sizeof(found) &&
          check_exec(found) == 0) &&
        local_resolve(name, path, found, sizeof(found)) < 0)
        return -ENOENT;
    /* realpath(found, buf) would write up to PATH_MAX bytes whatever n is. */
    real = realpath(found, NULL);
    if (!real)
        return -errno;
    r = snprintf(out, n, "%s", real) < (int)n ? 0 : -ENAMETOOLONG;
    free(real);
    return r;
}

int local_exit_status(int wstatus)
{
    /* A daemon ends on a signal only when it is killed: that is the launch failing (125),
     * not a rank's 128 + signal, which the daemon passes on as an exit status. */
    if (WIFEXITED(wstatus))
        return WEXITSTATUS(wstatus);
    return 125;
}

int local_combine(const int *status, const bool *stopped, int n)
{
    if (n <= 0)
        return 125;
    if (!stopped[0] && status[0] != 0)
        return status[0];
    for (int k = 1; k < n; k++)
        if (!stopped[k] && status[k] != 0)
            return status[k];
    return stopped[0] ? 125 : 0;
}

/* --- supervision ------------------------------------------------------------------------- */

struct supervisor {
    const struct local_job *job;
    pid_t *pid;    /* of node k's daemon; 0 once reaped (or never started) */
    int *status;   /* its exit status once reaped */
    bool *stopped; /* gpurun sent it SIGTERM on its own account */
    int running;
    int fatal_signal;
    bool timed_out;
    long long limit_at;         /* monotonic ms of the time limit; 0: none */
    long long warn_at;          /* when the pre-timeout signal goes out; 0: none (or sent) */
    long long straggle_at;      /* when followers still alive after node 0 are stopped; 0: none */
    long long kill_at;          /* when stopped daemons still alive get SIGKILL; 0: none */
    long long given_up_at;      /* when daemons the leader gave up still alive get SIGKILL */
    bool *given_up;             /* node k's daemon was given up by the leader (end_judged) */
    long long follower_fail_at; /* when a follower's 125 stops the job; 0: none */
    int follower_fail;          /* that follower */
    int *termsig;               /* the signal that killed node k's daemon; 0: none */
    /* Why gpurun ended the job on its own account, when it did: the record's first failure
     * (launcher_record), since the leader only sees the SIGTERM that followed. */
    char stop_cause[320];
    const char *stop_outcome;
    int stop_status;
    int stop_node;
};

static void send_all(struct supervisor *s, int sig)
{
    for (int k = 0; k < s->job->nnodes; k++)
        if (s->pid[k] > 0)
            kill(s->pid[k], sig);
}

/* Stops the daemons still running for a reason of gpurun's own (their statuses then say
 * nothing about the job), with SIGKILL after the job's grace if they do not go. */
static void stop_all(struct supervisor *s)
{
    for (int k = 0; k < s->job->nnodes; k++) {
        if (s->pid[k] > 0) {
            s->stopped[k] = true;
            kill(s->pid[k], SIGTERM);
        }
    }
    if (!s->kill_at)
        s->kill_at = monotime_ms() + s->job->kill_grace_ms + STOP_MARGIN_MS;
}

/* stop_all() for a cause of gpurun's own, which the record keeps (the first one). */
static void stop_for(struct supervisor *s, int node, int status, const char *outcome,
                     const char *cause)
{
    if (!s->stop_cause[0]) {
        snprintf(s->stop_cause, sizeof(s->stop_cause), "%s", cause);
        s->stop_outcome = outcome;
        s->stop_status = status;
        s->stop_node = node;
    }
    stop_all(s);
}

int local_judged_nodes(const json_t *summary, bool *out, int n)
{
    const json_t *node;
    size_t i;
    int count = 0;

    json_array_foreach(json_object_get(summary, "nodes"), i, node)
    {
        json_int_t k = json_integer_value(json_object_get(node, "node"));
        const char *st = json_string_value(json_object_get(node, "state"));
        if (k > 0 && k < n && st && (!strcmp(st, "lost") || !strcmp(st, "fenced")) && !out[k]) {
            out[k] = true;
            count++;
        }
    }
    return count;
}

/* Node 0 has ended the job: the daemons its record judged lost or fenced are continued (a
 * stopped one would never handle a SIGTERM) and told to end, and killed GIVEN_UP_GRACE_MS
 * later if still there, their shims ending their ranks as their parent dies; the others get a
 * grace to exit on their own. */
static void end_judged(struct supervisor *s)
{
    char path[PATH_MAX];
    json_t *sum;
    bool *judged;

    if (!s->job->job_dir ||
        snprintf(path, sizeof(path), "%s/summary.json", s->job->job_dir) >= (int)sizeof(path))
        return;
    judged = calloc((size_t)s->job->nnodes, sizeof(*judged));
    sum = json_load_file(path, 0, NULL);
    if (judged && sum && local_judged_nodes(sum, judged, s->job->nnodes) > 0) {
        for (int k = 1; k < s->job->nnodes; k++) {
            if (!judged[k] || s->pid[k] <= 0)
                continue;
            fprintf(stderr,
                    "gpurun: node %d's rendezvousd still runs, given up by the leader: ending "
                    "it and its ranks\n",
                    k);
            s->stopped[k] = true;
            s->given_up[k] = true;
            kill(s->pid[k], SIGCONT);
            kill(s->pid[k], SIGTERM);
            s->given_up_at = monotime_ms() + GIVEN_UP_GRACE_MS;
        }
    }
    json_decref(sum);
    free(judged);
}

static void on_daemon_exit(struct supervisor *s, int k, int wstatus)
{
    s->pid[k] = 0;
    s->status[k] = local_exit_status(wstatus);
    if (WIFSIGNALED(wstatus))
        s->termsig[k] = WTERMSIG(wstatus);
    s->running--;
    if (s->running == 0)
        return;
    if (k == 0) {
        s->follower_fail_at = 0;
        /* The leader has ended the job; a signal now would only cut the followers' own exit
         * short (their status then counts for nothing), so they get a grace first. */
        if (!s->straggle_at)
            s->straggle_at = monotime_ms() + FOLLOWER_GRACE_MS;
        end_judged(s);
    } else if (WIFEXITED(wstatus) && s->status[k] == 125 && !s->stopped[k] &&
               !s->follower_fail_at) {
        /* A follower that cannot start never joins, and the leader would wait for it until
         * the join timeout: unless the leader ends first, the job ends now. */
        s->follower_fail_at = monotime_ms() + FOLLOWER_FAIL_GRACE_MS;
        s->follower_fail = k;
    }
    /* A follower killed by a signal is the leader's to notice, as on Slurm: a lost link once
     * it joined, the join timeout naming it before; the leader then ends the job and keeps
     * its record (signalling it now would leave none). */
}

static void reap(struct supervisor *s)
{
    for (;;) {
        int wstatus;
        pid_t pid = waitpid(-1, &wstatus, WNOHANG);

        if (pid <= 0)
            return;
        for (int k = 0; k < s->job->nnodes; k++) {
            if (s->pid[k] == pid) {
                on_daemon_exit(s, k, wstatus);
                break;
            }
        }
    }
}

static void on_signal(struct supervisor *s, const siginfo_t *info)
{
    int sig = info->si_signo;

    if (sig == SIGCHLD) {
        reap(s);
        return;
    }
    if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP) {
        if (!s->fatal_signal)
            s->fatal_signal = sig;
        /* A terminal's ^C (si_code SI_KERNEL) went to the whole foreground process group,
         * the daemons included: sending it again would count as a second interrupt. */
        if (info->si_code == SI_KERNEL && sig != SIGHUP)
            return;
        send_all(s, sig == SIGHUP ? SIGTERM : sig);
        return;
    }
    send_all(s, sig); /* SIGUSR1, SIGUSR2: for the ranks, e.g. "checkpoint now" */
}

/* The pre-timeout signal, passed on as the batch script passes on Slurm's: a request in the
 * job dir (PREEMPT_FILE), which the leader takes, records in summary.json (preempt_signal:
 * when it came) and hands to every agent for the ranks that asked for it (gpurun.on_preempt).
 * Only where the request cannot be written do the daemons get the signal itself (they pass it
 * on all the same, but the job's record then does not say it came). */
static void send_preempt(struct supervisor *s)
{
    char path[PATH_MAX], text[16];
    int r = -ENAMETOOLONG, n = snprintf(text, sizeof(text), "%d\n", s->job->preempt_signal);

    if (s->job->job_dir &&
        snprintf(path, sizeof(path), "%s/" PREEMPT_FILE, s->job->job_dir) < (int)sizeof(path))
        r = fs_write_atomic(path, text, (size_t)n, 0600);
    if (r < 0) {
        if (s->job->job_dir)
            fprintf(stderr,
                    "gpurun: cannot write '%s/" PREEMPT_FILE "': %s; signalling the daemons\n",
                    s->job->job_dir, uv_strerror(r));
        send_all(s, s->job->preempt_signal);
    }
}

static void on_deadline(struct supervisor *s, long long now)
{
    if (s->warn_at && now >= s->warn_at) {
        s->warn_at = 0;
        send_preempt(s);
    }
    if (s->limit_at && now >= s->limit_at) {
        s->limit_at = 0;
        s->timed_out = true;
        char cause[96];
        fprintf(stderr, "gpurun: time limit of %ld s reached; stopping the job\n",
                s->job->time_limit_s);
        snprintf(cause, sizeof(cause), "time limit of %ld s reached", s->job->time_limit_s);
        stop_for(s, -1, 124, "timeout", cause);
    }
    if (s->follower_fail_at && now >= s->follower_fail_at) {
        char cause[96];
        s->follower_fail_at = 0;
        fprintf(stderr,
                "gpurun: node %d's rendezvousd failed (exit status 125); stopping the job\n",
                s->follower_fail);
        snprintf(cause, sizeof(cause), "node %d's rendezvousd failed (exit status 125)",
                 s->follower_fail);
        stop_for(s, s->follower_fail, 125, "failed", cause);
    }
    if (s->straggle_at && now >= s->straggle_at) {
        s->straggle_at = 0;
        fprintf(stderr, "gpurun: %d rendezvousd still running after node 0 ended; stopping them\n",
                s->running);
        stop_all(s);
    }
    if (s->given_up_at && now >= s->given_up_at) {
        s->given_up_at = 0;
        for (int k = 1; k < s->job->nnodes; k++)
            if (s->given_up[k] && s->pid[k] > 0)
                kill(s->pid[k], SIGKILL);
    }
    if (s->kill_at && now >= s->kill_at) {
        s->kill_at = 0;
        fprintf(stderr, "gpurun: %d rendezvousd did not stop in time; killing them\n", s->running);
        send_all(s, SIGKILL);
    }
}

/* The nearest deadline, or NULL to wait for a signal only. */
static struct timespec *next_timeout(const struct supervisor *s, struct timespec *ts)
{
    long long at = 0, now;
    const long long cand[] = {s->limit_at, s->warn_at,          s->straggle_at,
                              s->kill_at,  s->follower_fail_at, s->given_up_at};

    for (size_t i = 0; i < sizeof(cand) / sizeof(cand[0]); i++)
        if (cand[i] && (!at || cand[i] < at))
            at = cand[i];
    if (!at)
        return NULL;
    now = monotime_ms();
    if (at < now)
        at = now;
    ts->tv_sec = (at - now) / 1000;
    ts->tv_nsec = (long)((at - now) % 1000) * 1000000;
    return ts;
}

static int spawn_daemon(const struct local_job *job, int k, const sigset_t *child_mask, pid_t *pid)
{
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t attr;
    char node[16], self[24];
    char *argv[] = {(char *)"rendezvousd",
                    (char *)"--job-dir",
                    (char *)job->job_dir,
                    (char *)"--node-rank",
                    node,
                    (char *)"--log-level",
                    (char *)job->log_level,
                    (char *)"--launcher-pid",
                    self,
                    NULL};
    int r;

    snprintf(node, sizeof(node), "%d", k);
    snprintf(self, sizeof(self), "%ld", (long)getpid());
    posix_spawn_file_actions_init(&fa);
    posix_spawnattr_init(&attr);
    posix_spawnattr_setsigmask(&attr, child_mask);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
    if (job->out_fd >= 0) {
        posix_spawn_file_actions_adddup2(&fa, job->out_fd, STDOUT_FILENO);
        posix_spawn_file_actions_adddup2(&fa, job->out_fd, STDERR_FILENO);
    }
    r = posix_spawn(pid, job->daemon, &fa, &attr, argv, environ);
    posix_spawnattr_destroy(&attr);
    posix_spawn_file_actions_destroy(&fa);
    return -r;
}

/* The exit status summary.json records when it records a failure, else -1. The leader's
 * record is the job's one truth: gpurun's own view of its daemons (which of them it had to
 * stop, in which order they went) must not contradict it. */
static int summary_failure(const char *job_dir)
{
    char path[PATH_MAX];
    json_t *sum;
    json_int_t st;

    if (!job_dir || snprintf(path, sizeof(path), "%s/summary.json", job_dir) >= (int)sizeof(path))
        return -1;
    sum = json_load_file(path, 0, NULL);
    st = json_integer_value(json_object_get(sum, "exit_status"));
    json_decref(sum);
    return st > 0 && st < 256 ? (int)st : -1;
}

/* The nodes the leader fenced (summary.json's swaps: each gave its place to a spare): their
 * daemons' ends say nothing about the job's. Marks them in out (n nodes). */
static void summary_fenced(const char *job_dir, bool *out, int n)
{
    char path[PATH_MAX];
    json_t *sum, *sw;
    size_t i;

    if (!job_dir || snprintf(path, sizeof(path), "%s/summary.json", job_dir) >= (int)sizeof(path))
        return;
    sum = json_load_file(path, 0, NULL);
    json_array_foreach(json_object_get(sum, "swaps"), i, sw)
    {
        json_int_t k = json_integer_value(json_object_get(sw, "node"));
        if (k > 0 && k < n)
            out[k] = true;
    }
    json_decref(sum);
}

/* The record's first failure, as the leader writes it (leader.c's failure_pack), with its
 * class (FAILURE_*; -1: none, as for a time limit, which is no failure of a class). */
static json_t *failure_json(const char *cause, int node, int sig, int cls)
{
    char sn[SIGNAME_LEN];
    json_t *f = json_pack("{s:s, s:i, s:i, s:s, s:i, s:i, s:s, s:s}", "cause", cause, "rank", -1,
                          "node", node, "hostname", "", "code", 0, "signal", sig, "signal_name",
                          sig ? signame(sig, sn) : "", "tail", "");

    if (f && cls >= 0)
        json_object_set_new(f, "class", json_string(failure_class_name(cls)));
    return f;
}

/* What gpurun saw end the job, when the leader left no record: a daemon killed by a signal
 * (the leader first), or one that exited without writing one. Fills cause; returns the node
 * named (-1: none) and sets *sig. */
static int seen_cause(const struct supervisor *s, char *cause, size_t n, int *sig)
{
    char sn[SIGNAME_LEN];

    for (int k = 0; k < s->job->nnodes; k++) {
        if (!s->termsig[k] || s->stopped[k])
            continue;
        *sig = s->termsig[k];
        snprintf(cause, n, "node %d's rendezvousd%s was killed by signal %d (%s)", k,
                 k == 0 ? " (the leader)" : "", *sig, signame(*sig, sn));
        return k;
    }
    *sig = 0;
    snprintf(cause, n, "node 0's rendezvousd (the leader) exited with status %d and left no record",
             s->status[0]);
    return 0;
}

/* summary.json's record of what gpurun knows (local.h: "one record always"), written over the
 * leader's only where gpurun ended the job itself and the leader saw only that, or the leader
 * wrote none. Returns gpurun's exit status: the record's. */
static int launcher_record(struct supervisor *s, int ret)
{
    char path[PATH_MAX], cause[320];
    json_t *sum, *ff = NULL;
    const char *outcome, *oc;
    int node, sig = 0, r;

    if (!s->job->job_dir ||
        snprintf(path, sizeof(path), "%s/summary.json", s->job->job_dir) >= (int)sizeof(path))
        return ret;
    sum = json_load_file(path, 0, NULL);
    /* The leader's record stands unless all it saw was gpurun's own SIGTERM (a cancel): a
     * job that completed, or failed on its own, just before gpurun's cause keeps its record,
     * and gpurun's exit status follows it. */
    oc = json_string_value(json_object_get(sum, "outcome"));
    if (sum && (!s->stop_cause[0] || !oc || strcmp(oc, "cancelled"))) {
        json_int_t st = json_integer_value(json_object_get(sum, "exit_status"));
        json_decref(sum);
        return oc && st >= 0 && st < 256 ? (int)st : ret;
    }
    if (s->stop_cause[0]) {
        /* gpurun's own causes: a daemon that could not start or failed (its node's), or the
         * time limit (no node named, no class). */
        ff = failure_json(s->stop_cause, s->stop_node, 0, s->stop_node >= 0 ? FAILURE_NODE : -1);
        outcome = s->stop_outcome;
        ret = s->stop_status;
    } else {
        node = seen_cause(s, cause, sizeof(cause), &sig);
        /* A daemon killed, or the leader gone without a record: the node's. */
        ff = failure_json(cause, node, sig, FAILURE_NODE);
        outcome = s->fatal_signal ? "cancelled" : "failed";
        fprintf(stderr, "gpurun: %s; the job's record is gpurun's\n", cause);
    }
    if (!sum)
        sum = json_pack("{s:s, s:s, s:i, s:i, s:s}", "job_id", s->job->job_id ? s->job->job_id : "",
                        "state", "finished", "world_size", s->job->world_size, "nnodes",
                        s->job->nnodes, "recorded_by", "gpurun");
    else
        json_object_set(sum, "leader_first_failure", json_object_get(sum, "first_failure"));
    if (!sum || !ff || json_object_set_new(sum, "outcome", json_string(outcome)) < 0 ||
        json_object_set_new(sum, "exit_status", json_integer(ret)) < 0 ||
        json_object_set(sum, "first_failure", ff) < 0) {
        fprintf(stderr, "gpurun: cannot write '%s': out of memory\n", path);
    } else {
        char *text = json_dumps(sum, JSON_INDENT(2));
        r = text ? fs_write_atomic(path, text, strlen(text), 0600) : -ENOMEM;
        if (r < 0)
            fprintf(stderr, "gpurun: cannot write '%s': %s\n", path, uv_strerror(r));
        free(text);
    }
    json_decref(ff);
    json_decref(sum);
    return ret;
}

/* Ends what still carries the job's mark (jobmark.h) once its daemons are gone: a rank whose
 * daemon and shim were both killed, or a process that left its rank's process group and
 * cgroup. Says how many, when any. */
static void sweep_job(const struct local_job *job)
{
    struct jobmark_sweep_stats st;
    struct jobmark want = {0};
    struct auth_key key;
    char path[PATH_MAX];

    if (!job->job_dir ||
        snprintf(path, sizeof(path), "%s/key", job->job_dir) >= (int)sizeof(path) ||
        auth_key_read(path, &key) < 0)
        return;
    want.job = jobmark_job(&key);
    if (jobmark_sweep(&want, JOBMARK_JOB, 0, &st) == 0 && st.killed > 0)
        fprintf(stderr, "gpurun: ended %d process%s of job '%s' still running after its daemons\n",
                st.killed, st.killed == 1 ? "" : "es", job->job_id);
}

/* The nodes' memory checkpoints (lib/proto.h's proto_mem_dir) once their daemons are gone:
 * a daemon that was killed could not remove its own. */
static void remove_mem_dirs(const struct local_job *job)
{
    char dir[PATH_MAX];

    for (int k = 0; job->job_id && k < job->nnodes; k++)
        if (proto_mem_dir(dir, sizeof(dir), job->job_id, k) == 0)
            fs_remove_tree(dir, NULL);
}

int local_run(const struct local_job *job, int *fatal_signal)
{
    struct supervisor s = {.job = job};
    bool spawn_failed = false;
    struct timespec zero = {0, 0};
    sigset_t set, old, child_mask;
    int ret;

    *fatal_signal = 0;
    s.pid = calloc((size_t)job->nnodes, sizeof(*s.pid));
    s.status = calloc((size_t)job->nnodes, sizeof(*s.status));
    s.stopped = calloc((size_t)job->nnodes, sizeof(*s.stopped));
    s.termsig = calloc((size_t)job->nnodes, sizeof(*s.termsig));
    s.given_up = calloc((size_t)job->nnodes, sizeof(*s.given_up));
    if (!s.pid || !s.status || !s.stopped || !s.termsig || !s.given_up) {
        fprintf(stderr, "gpurun: out of memory\n");
        ret = 125;
        goto out;
    }
    /* Blocked from before the first spawn, so no exit and no ^C can slip between spawning
     * and waiting. The daemons get the mask gpurun started with, less these: they are the
     * daemon's to handle. */
    sigemptyset(&set);
    sigaddset(&set, SIGCHLD);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGHUP);
    sigaddset(&set, SIGUSR1);
    sigaddset(&set, SIGUSR2);
    sigprocmask(SIG_BLOCK, &set, &old);
    child_mask = old;
    for (int i = 1; i < NSIG; i++)
        if (sigismember(&set, i) == 1)
            sigdelset(&child_mask, i);

    for (int k = 0; k < job->nnodes; k++) {
        int r = spawn_daemon(job, k, &child_mask, &s.pid[k]);
        if (r < 0) {
            char cause[200];
            /* posix_spawn's EAGAIN (or ENOMEM) is its fork refused: the machine's limit on
             * processes, not the program. */
            bool fork = r == -EAGAIN || r == -ENOMEM;
            const char *limit = fork ? " (this machine's limit on processes)" : "";
            fprintf(stderr, "gpurun: cannot %s node %d's rendezvousd '%s': %s%s\n",
                    fork ? "fork" : "start", k, job->daemon, uv_strerror(r), limit);
            snprintf(cause, sizeof(cause), "gpurun cannot %s node %d's rendezvousd: %s%s",
                     fork ? "fork" : "start", k, uv_strerror(r), limit);
            s.pid[k] = 0;
            spawn_failed = true;
            stop_for(&s, k, 125, "failed", cause);
            break;
        }
        s.running++;
    }
    if (job->time_limit_s > 0)
        s.limit_at = monotime_ms() + job->time_limit_s * 1000;
    if (job->time_limit_s > 0 && job->preempt_signal > 0 && job->preempt_before_s > 0)
        s.warn_at = s.limit_at - job->preempt_before_s * 1000;

    while (s.running > 0) {
        struct timespec ts;
        siginfo_t info;
        int sig = sigtimedwait(&set, &info, next_timeout(&s, &ts));

        if (sig > 0) {
            on_signal(&s, &info);
        } else if (errno == EAGAIN) {
            on_deadline(&s, monotime_ms());
        } else if (errno != EINTR) {
            fprintf(stderr, "gpurun: cannot wait for signals: %s\n", uv_strerror(-errno));
            send_all(&s, SIGKILL);
            while (waitpid(-1, NULL, 0) > 0 || errno == EINTR)
                ;
            spawn_failed = true;
            break;
        }
    }
    /* A request the leader never took (the job ended first) would outlive the job. */
    if (job->job_dir) {
        char path[PATH_MAX];
        if (snprintf(path, sizeof(path), "%s/" PREEMPT_FILE, job->job_dir) < (int)sizeof(path))
            unlink(path);
    }
    sweep_job(job);
    remove_mem_dirs(job);
    summary_fenced(job->job_dir, s.stopped, job->nnodes);
    ret = local_combine(s.status, s.stopped, job->nnodes);
    if (spawn_failed)
        ret = 125;
    else if (s.timed_out)
        ret = 124;
    else if (summary_failure(job->job_dir) > 0)
        ret = summary_failure(job->job_dir);
    *fatal_signal = s.fatal_signal;
    ret = launcher_record(&s, ret);
    /* What is still pending is spoken for (SIGCHLD of reaped daemons, a second ^C already
     * recorded): take it before unblocking, or a default action would end gpurun here. */
    while (sigtimedwait(&set, NULL, &zero) > 0)
        ;
    sigprocmask(SIG_SETMASK, &old, NULL);
out:
    free(s.pid);
    free(s.status);
    free(s.stopped);
    free(s.termsig);
    free(s.given_up);
    return ret;
}
