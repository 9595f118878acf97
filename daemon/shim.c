/* The rank shim. It stays the parent of the rank for the rank's whole life: that costs one
 * small process per rank and buys guarantees that libuv's spawn cannot give: a parent-death
 * signal that reaches the rank's cgroup and process group, and a watch on the agent's
 * heartbeat that ends the rank when the agent is frozen. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cgroup.h"
#include "fsutil.h"
#include "jobmark.h"
#include "monotime.h"
#include "shim.h"
#include "stall.h"
#include "banned.h"

/* The parent-death signal: one no one else sends, so it always means "the agent died". */
#define SHIM_PDEATH_SIG (SIGRTMIN + 1)

/* Signals the agent sends to the whole group: the rank gets them directly, the shim must
 * survive them to report the rank's status. The shim keeps them blocked, not ignored: an
 * ignored signal is inherited as ignored by the child until it resets it, so a SIGTERM in
 * that window would be lost and the rank would live on until SIGKILL. A blocked one waits. */
static const int group_signals[] = {SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2, SIGQUIT};
/* Of those, the ones that mean "stop". */
static const int stop_signals[] = {SIGTERM, SIGINT, SIGHUP, SIGQUIT};

/* How often the shim looks at the agent's heartbeat pipe: the delay it adds to noticing a
 * frozen agent. */
#define WATCH_MS       100
/* How long the rank's processes may take to leave its cgroup after SIGKILL before the shim
 * gives up removing it (the agent's teardown removes it later). */
#define CGROUP_WAIT_MS 1000

/* What the agent asked for on the command line. */
struct shim_opts {
    long agent;         /* the agent's pid */
    int alive_fd;       /* read end of the agent's heartbeat pipe, or -1 */
    long alive_ms;      /* silence on it that means a frozen agent, or 0 */
    const char *cgroup; /* the rank's cgroup, or NULL */
    const char *mark;   /* the rank's job mark (jobmark.h), or NULL */
    struct jobmark m;   /* mark, parsed */
    char **cmd;
};

static int parse_opts(int argc, char **argv, struct shim_opts *o)
{
    char *end;
    int i;

    *o = (struct shim_opts){.alive_fd = -1};
    if (argc < 5)
        goto usage;
    o->agent = strtol(argv[2], &end, 10);
    if (*end || o->agent <= 1) {
        fprintf(stderr, "rendezvousd: %s: '%s' is not a process id\n", SHIM_FLAG, argv[2]);
        return -1;
    }
    for (i = 3; i + 1 < argc && strcmp(argv[i], "--"); i += 2) {
        long v = strtol(argv[i + 1], &end, 10);
        if (!strcmp(argv[i], "--cgroup")) {
            o->cgroup = argv[i + 1];
            continue;
        }
        if (!strcmp(argv[i], "--mark")) {
            o->mark = argv[i + 1];
            if (jobmark_parse(o->mark, strlen(o->mark), &o->m) < 0) {
                fprintf(stderr, "rendezvousd: %s: --mark: '%s' is not a job mark\n", SHIM_FLAG,
                        o->mark);
                return -1;
            }
            continue;
        }
        if (*end || v < 0 || v > INT_MAX) {
            fprintf(stderr, "rendezvousd: %s: %s: '%s' is not a number\n", SHIM_FLAG, argv[i],
                    argv[i + 1]);
            return -1;
        }
        if (!strcmp(argv[i], "--alive-fd"))
            o->alive_fd = (int)v;
        else if (!strcmp(argv[i], "--alive-ms"))
            o->alive_ms = v;
        else
            goto usage;
    }
    if (i + 1 >= argc || strcmp(argv[i], "--"))
        goto usage;
    o->cmd = argv + i + 1;
    return 0;
usage:
    fprintf(stderr,
            "rendezvousd: usage: %s AGENT_PID [--alive-fd FD --alive-ms MS] [--cgroup DIR] "
            "[--mark MARK] -- CMD [ARGS...]\n",
            SHIM_FLAG);
    return -1;
}

/* The file execvp would run for cmd (as it searches PATH) into out, or -ENOENT. */
static int find_command(const char *cmd, char *out, size_t n)
{
    const char *path = getenv("PATH");

    if (strchr(cmd, '/'))
        return snprintf(out, n, "%s", cmd) < (int)n && access(out, F_OK) == 0 ? 0 : -ENOENT;
    for (const char *p = path ? path : "/usr/bin:/bin"; *p;) {
        size_t len = strcspn(p, ":");
        if (snprintf(out, n, "%.*s%s%s", (int)len, p, len ? "/" : "", cmd) < (int)n &&
            access(out, X_OK) == 0)
            return 0;
        p += len + (p[len] == ':');
    }
    return -ENOENT;
}

/* Why exec failed, on the rank's stderr. ENOENT for a command that exists is its "#!" line's
 * interpreter missing: said so, not as the script's own absence. */
static void say_exec_failure(const char *cmd, int err)
{
    char file[PATH_MAX], interp[PATH_MAX];

    if (err == ENOENT && find_command(cmd, file, sizeof(file)) == 0 &&
        fs_script_interpreter(file, interp, sizeof(interp)) == 1 && access(interp, F_OK) < 0) {
        fprintf(stderr,
                "gpurun: cannot execute '%s': its interpreter '%s' (from its #! line) does not "
                "exist\n",
                cmd, interp);
        return;
    }
    fprintf(stderr, "gpurun: cannot execute '%s': %s\n", cmd, strerror(err));
}

static void exec_child(const struct shim_opts *o, const sigset_t *old, bool in_cgroup)
{
    char pid[24];
    int ret;

    /* Into the rank's cgroup before anything of the rank runs: nothing it starts can be
     * outside. */
    if (in_cgroup && (ret = cgroup_enter(o->cgroup, (int)getpid())) < 0)
        fprintf(stderr, "gpurun: cannot enter cgroup '%s': %s; the rank runs without one\n",
                o->cgroup, strerror(-ret));
    /* The mark goes with the rank's environment to everything it starts, and not in the
     * shim's own: a sweep never ends the shim that is cleaning up. */
    if (o->mark && setenv(JOBMARK_ENV, o->mark, 1) < 0)
        fprintf(stderr, "gpurun: cannot set %s: %s\n", JOBMARK_ENV, strerror(errno));

    /* Under Slurm a task's SLURM_TASK_PID is its own pid, which only the child knows; the
     * rest of Slurm's per-task variables come from rankenv.c. */
    if (getenv("SLURM_TASK_PID") && getenv("SLURM_JOB_ID") && getenv("SLURM_STEP_ID")) {
        snprintf(pid, sizeof(pid), "%d", (int)getpid());
        setenv("SLURM_TASK_PID", pid, 1);
    }
    /* Where Yama restricts ptrace to ancestors, the agent and what it starts (the stack tool
     * of a hang's capture, stacks.h) may still attach to the rank. EINVAL without Yama. */
    prctl(PR_SET_PTRACER, (unsigned long)o->agent, 0, 0, 0);
    sigprocmask(SIG_SETMASK, old, NULL);
    execvp(o->cmd[0], o->cmd);
    int err = errno;
    say_exec_failure(o->cmd[0], err);
    _exit(err == ENOENT ? 127 : 126);
}

/* A stop signal pending in the shim: one sent to the group before the rank existed, or in
 * the instant around the fork. Returns it, or 0. */
static int pending_stop(void)
{
    sigset_t pend;

    sigpending(&pend);
    for (size_t i = 0; i < sizeof(stop_signals) / sizeof(stop_signals[0]); i++)
        if (sigismember(&pend, stop_signals[i]))
            return stop_signals[i];
    return 0;
}

/* Dies of sig (the shim's own pending copies included), so that the agent sees what the rank
 * saw; the rank already dumped core if it was going to, the shim must not add one. */
static int die_of(int sig)
{
    struct rlimit none = {0, 0};

    setrlimit(RLIMIT_CORE, &none);
    signal(sig, SIG_DFL);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, sig);
    sigprocmask(SIG_UNBLOCK, &set, NULL);
    raise(sig);
    return 128 + sig;
}

static int pass_status(int status)
{
    if (WIFEXITED(status))
        return WEXITSTATUS(status);
    return die_of(WTERMSIG(status));
}

/* Ends the rank as a whole: its cgroup, then the child itself in case it had not entered
 * it yet; reaps the child. */
static void end_rank(const struct shim_opts *o, pid_t child, bool in_cgroup)
{
    if (in_cgroup)
        cgroup_kill(o->cgroup);
    kill(child, SIGKILL);
    while (waitpid(child, NULL, 0) < 0 && errno == EINTR)
        ;
}

/* Ends what carries the rank's mark: what left its process group and its cgroup. Returns
 * how many processes that was. */
static int sweep_mark(const struct shim_opts *o)
{
    struct jobmark_sweep_stats st = {0};

    if (o->mark)
        jobmark_sweep(&o->m, JOBMARK_RANK, 0, &st);
    return st.killed;
}

/* The agent is gone or frozen: nobody will tear this rank down, so do it now, cgroup and
 * group and all (the shim included). Nothing is said after the agent's death: its end of the
 * rank's stderr is gone, and a write there would end the shim with SIGPIPE. */
static int agent_lost(const struct shim_opts *o, pid_t child, bool in_cgroup, bool dead)
{
    int swept;

    end_rank(o, child, in_cgroup);
    swept = sweep_mark(o);
    if (swept > 0 && !dead)
        fprintf(stderr,
                "gpurun: ended %d process%s of the rank outside its process group and cgroup\n",
                swept, swept == 1 ? "" : "es");
    if (in_cgroup) {
        char job[PATH_MAX];
        const char *slash = strrchr(o->cgroup, '/');
        cgroup_remove(o->cgroup, CGROUP_WAIT_MS);
        /* A dead agent cannot remove the job's cgroup, nor can a frozen one that gpurun then
         * kills (it gives up a node whose daemon the leader gave up): the last rank's shim
         * does (an rmdir while other ranks' cgroups remain fails, harmlessly). An agent that
         * runs again has its next rank's shim make it anew (cgroup_make). */
        if (slash && (size_t)(slash - o->cgroup) < sizeof(job)) {
            snprintf(job, sizeof(job), "%.*s", (int)(slash - o->cgroup), o->cgroup);
            rmdir(job);
        }
    }
    kill(0, SIGKILL);
    return 128 + SIGKILL;
}

/* Reads what the agent wrote on the heartbeat pipe. Returns 1 if it wrote, 0 if not, -1 at
 * end of file (the agent is gone). */
static int drain_alive(int fd)
{
    char buf[256];
    int got = 0;
    ssize_t n;

    while ((n = read(fd, buf, sizeof(buf))) > 0)
        got = 1;
    if (n == 0)
        return -1;
    return got;
}

/* A warm shim's spec, kept for the shim's life: its arguments and the rank's environment
 * point into it. */
static char *spec_buf;
static char **spec_argv, **spec_env;

/* The largest spec read: far above an exec's own limit on arguments and environment. */
#define SPEC_MAX (64 << 20)

/* Reads fd to its end into spec_buf. Returns its length, or -1. */
static ssize_t read_spec(int fd)
{
    size_t cap = 1 << 16, len = 0;

    spec_buf = malloc(cap);
    while (spec_buf) {
        ssize_t n;
        if (len == cap) {
            char *bigger = cap < SPEC_MAX ? realloc(spec_buf, cap * 2) : NULL;
            if (!bigger)
                return -1;
            spec_buf = bigger;
            cap *= 2;
        }
        n = read(fd, spec_buf + len, cap - len);
        if (n == 0)
            return (ssize_t)len;
        if (n < 0 && errno != EINTR)
            return -1;
        if (n > 0)
            len += (size_t)n;
    }
    return -1;
}

/* The next NUL-ended string of spec_buf[*off..len) as a count, or -1. */
static long spec_count(size_t len, size_t *off)
{
    char *end, *s = spec_buf + *off;
    char *nul = *off < len ? memchr(s, '\0', len - *off) : NULL;
    long v;

    if (!nul)
        return -1;
    v = strtol(s, &end, 10);
    if (end != nul || v < 0 || v > (long)len)
        return -1;
    *off = (size_t)(nul - spec_buf) + 1;
    return v;
}

/* n NUL-ended strings of spec_buf[*off..len) into a new NULL-ended array after first (the
 * first nfirst words kept), or NULL. */
static char **spec_words(size_t len, size_t *off, long n, char **first, int nfirst)
{
    char **v = calloc((size_t)n + (size_t)nfirst + 1, sizeof(*v));

    if (!v)
        return NULL;
    for (int i = 0; i < nfirst; i++)
        v[i] = first[i];
    for (long i = 0; i < n; i++) {
        char *nul = *off < len ? memchr(spec_buf + *off, '\0', len - *off) : NULL;
        if (!nul) {
            free(v);
            return NULL;
        }
        v[nfirst + i] = spec_buf + *off;
        *off = (size_t)(nul - spec_buf) + 1;
    }
    return v;
}

/* A warm shim (its last arguments "--spec-fd FD"): started by the agent before its rank was
 * known, it reads from FD, to its end, the rest of its arguments and the rank's environment,
 * each a count then that many NUL-ended strings. Returns 0 with *argc and *argv its whole
 * arguments and environ the rank's (or left alone when not a warm shim), 1 when FD ended
 * empty (the agent had no rank for it), -1 on a spec it cannot read (said on stderr). */
static int take_spec(int *argc, char ***argv)
{
    int n = *argc, fd;
    char **v = *argv, *end;
    long nargs, nenv;
    size_t off = 0;
    ssize_t len;

    if (n < 4 || strcmp(v[n - 2], "--spec-fd"))
        return 0;
    /* Only among the shim's own options: a command (after "--") may end in these words. */
    for (int i = 3; i < n - 2; i++)
        if (!strcmp(v[i], "--"))
            return 0;
    fd = (int)strtol(v[n - 1], &end, 10);
    if (*end || fd < 0) {
        fprintf(stderr, "rendezvousd: %s: --spec-fd: '%s' is not a file descriptor\n", SHIM_FLAG,
                v[n - 1]);
        return -1;
    }
    len = read_spec(fd);
    close(fd);
    if (len == 0)
        return 1;
    if (len < 0 || (nargs = spec_count((size_t)len, &off)) < 0 ||
        !(spec_argv = spec_words((size_t)len, &off, nargs, v, n - 2)) ||
        (nenv = spec_count((size_t)len, &off)) < 0 ||
        !(spec_env = spec_words((size_t)len, &off, nenv, NULL, 0)) || off != (size_t)len) {
        fprintf(stderr,
                "gpurun: the rank shim could not read its rank's arguments from its "
                "agent (fd %d)\n",
                fd);
        return -1;
    }
    *argc = n - 2 + (int)nargs;
    *argv = spec_argv;
    environ = spec_env;
    return 0;
}

int shim_main(int argc, char **argv)
{
    struct shim_opts o;
    sigset_t block, old, waitset;
    bool in_cgroup = false;
    pid_t child;
    int status = 0, sig, ret;
    int64_t last_alive;
    struct stall stall;

    if ((ret = take_spec(&argc, &argv)) != 0)
        return ret > 0 ? 0 : 125;
    if (parse_opts(argc, argv, &o) < 0)
        return 125;
    /* The parent-death signal stays blocked and is taken by sigtimedwait() below, with
     * SIGCHLD: the cleanup it starts is not async-signal-safe. */
    sigemptyset(&block);
    for (size_t i = 0; i < sizeof(group_signals) / sizeof(group_signals[0]); i++)
        sigaddset(&block, group_signals[i]);
    sigaddset(&block, SIGCHLD);
    sigaddset(&block, SHIM_PDEATH_SIG);
    sigprocmask(SIG_BLOCK, &block, &old);
    prctl(PR_SET_PDEATHSIG, SHIM_PDEATH_SIG);
    /* The agent may have died before the request above: then our parent is someone else. */
    if (getppid() != (pid_t)o.agent)
        return 125;
    if (o.alive_fd >= 0) {
        fcntl(o.alive_fd, F_SETFD, FD_CLOEXEC);
        fcntl(o.alive_fd, F_SETFL, fcntl(o.alive_fd, F_GETFL) | O_NONBLOCK);
    }
    if (o.cgroup) {
        ret = cgroup_make(o.cgroup);
        if (ret < 0)
            fprintf(stderr, "gpurun: cannot create cgroup '%s': %s; the rank runs without one\n",
                    o.cgroup, strerror(-ret));
        in_cgroup = ret == 0;
    }
    /* Told to stop before the rank started: do not start it. */
    if ((sig = pending_stop()) != 0)
        return die_of(sig);
    child = fork();
    if (child < 0) {
        fprintf(stderr, SPAWN_FORK_FAILED " the rank: %s (the node's limit on processes)\n",
                strerror(errno));
        return 125;
    }
    if (child == 0)
        exec_child(&o, &old, in_cgroup);
    /* A stop that reached only the shim, just before the fork, goes on to the rank; one that
     * reached both arrives twice, which a stop signal tolerates. */
    if ((sig = pending_stop()) != 0)
        kill(child, sig);
    sigemptyset(&waitset);
    sigaddset(&waitset, SIGCHLD);
    sigaddset(&waitset, SHIM_PDEATH_SIG);
    last_alive = monotime_ms();
    stall_init(&stall, WATCH_MS, last_alive);
    for (;;) {
        struct timespec ts = {0, WATCH_MS * 1000000L};
        pid_t got = waitpid(child, &status, WNOHANG);
        int64_t now, stalled;

        if (got == child)
            break;
        if (got < 0 && errno != EINTR)
            return 125;
        sig = sigtimedwait(&waitset, NULL, &ts);
        /* The signal follows the thread that spawned the shim: a warm shim's (posix_spawn on
         * the agent's pre-flight thread) ends before the agent does. Then the kernel gives
         * the shim to another of the agent's threads, the agent still its parent process:
         * not a death, and the signal is asked for again, of the new parent thread. */
        if (sig == SHIM_PDEATH_SIG && getppid() == (pid_t)o.agent) {
            prctl(PR_SET_PDEATHSIG, SHIM_PDEATH_SIG);
            continue;
        }
        if (sig == SHIM_PDEATH_SIG)
            return agent_lost(&o, child, in_cgroup, true);
        if (o.alive_fd < 0)
            continue;
        ret = drain_alive(o.alive_fd);
        if (ret < 0)
            return agent_lost(&o, child, in_cgroup, true);
        now = monotime_ms();
        /* The pipe is read before the agent is judged, and only over the shim's own time:
         * a shim that did not run for a while (starved of CPU, or stopped with its machine,
         * the agent too) does not blame the agent for it. */
        stalled = stall_check(&stall, now);
        if (stalled > 0)
            last_alive = last_alive + stalled < now ? last_alive + stalled : now;
        if (ret > 0)
            last_alive = now;
        else if (o.alive_ms > 0 && now - last_alive > o.alive_ms) {
            fprintf(stderr,
                    "gpurun: the agent (pid %ld) has not answered for %lld ms: ending the rank\n",
                    o.agent, (long long)(now - last_alive));
            return agent_lost(&o, child, in_cgroup, false);
        }
    }
    /* What the rank started ends with it. What left its cgroup carrying its mark is the
     * agent's to end, once per restart and at its end (a sweep of /proc here would delay
     * every rank's exit by a scan: about 20 us a process). */
    if (in_cgroup)
        cgroup_remove(o.cgroup, CGROUP_WAIT_MS);
    return pass_status(status);
}
