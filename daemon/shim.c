/* The rank shim. It stays the parent of the rank for the rank's whole life: that costs one
 * small process per rank and buys a guarantee that libuv's spawn cannot give, a parent-death
 * signal that reaches the rank's process group. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "shim.h"
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

/* The agent is gone: nobody will tear this rank down, so do it now, group and all (the
 * shim included). kill() is async-signal-safe. */
static void on_pdeath(int sig)
{
    (void)sig;
    kill(0, SIGKILL);
}

static void exec_child(char **cmd, const sigset_t *old, pid_t agent)
{
    char pid[24];

    /* Under Slurm a task's SLURM_TASK_PID is its own pid, which only the child knows; the
     * rest of Slurm's per-task variables come from rankenv.c. */
    if (getenv("SLURM_TASK_PID") && getenv("SLURM_JOB_ID") && getenv("SLURM_STEP_ID")) {
        snprintf(pid, sizeof(pid), "%d", (int)getpid());
        setenv("SLURM_TASK_PID", pid, 1);
    }
    signal(SHIM_PDEATH_SIG, SIG_DFL);
    /* Where Yama restricts ptrace to ancestors, the agent and what it starts (the stack tool
     * of a hang's capture, stacks.h) may still attach to the rank. EINVAL without Yama. */
    prctl(PR_SET_PTRACER, (unsigned long)agent, 0, 0, 0);
    sigprocmask(SIG_SETMASK, old, NULL);
    execvp(cmd[0], cmd);
    fprintf(stderr, "gpurun: cannot execute '%s': %s\n", cmd[0], strerror(errno));
    _exit(errno == ENOENT ? 127 : 126);
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

int shim_main(int argc, char **argv)
{
    sigset_t block, old;
    char *end;
    long agent;
    pid_t child;
    int status = 0, sig;

    if (argc < 5 || strcmp(argv[3], "--")) {
        fprintf(stderr, "rendezvousd: usage: %s AGENT_PID -- CMD [ARGS...]\n", SHIM_FLAG);
        return 125;
    }
    agent = strtol(argv[2], &end, 10);
    if (*end || agent <= 1) {
        fprintf(stderr, "rendezvousd: %s: '%s' is not a process id\n", SHIM_FLAG, argv[2]);
        return 125;
    }
    struct sigaction sa = {0};
    sa.sa_handler = on_pdeath;
    sigaction(SHIM_PDEATH_SIG, &sa, NULL);
    prctl(PR_SET_PDEATHSIG, SHIM_PDEATH_SIG);
    /* The agent may have died before the request above: then our parent is someone else. */
    if (getppid() != (pid_t)agent)
        return 125;
    sigemptyset(&block);
    for (size_t i = 0; i < sizeof(group_signals) / sizeof(group_signals[0]); i++)
        sigaddset(&block, group_signals[i]);
    sigaddset(&block, SIGCHLD);
    sigprocmask(SIG_BLOCK, &block, &old);
    /* Told to stop before the rank started: do not start it. */
    if ((sig = pending_stop()) != 0)
        return die_of(sig);
    child = fork();
    if (child < 0) {
        fprintf(stderr, "gpurun: cannot fork: %s\n", strerror(errno));
        return 126;
    }
    if (child == 0)
        exec_child(argv + 4, &old, (pid_t)agent);
    /* A stop that reached only the shim, just before the fork, goes on to the rank; one that
     * reached both arrives twice, which a stop signal tolerates. */
    if ((sig = pending_stop()) != 0)
        kill(child, sig);
    sigemptyset(&block);
    sigaddset(&block, SIGCHLD);
    sigprocmask(SIG_UNBLOCK, &block, NULL);
    for (;;) {
        pid_t got = waitpid(child, &status, 0);
        if (got == child)
            break;
        if (got < 0 && errno != EINTR)
            return 125;
    }
    return pass_status(status);
}
