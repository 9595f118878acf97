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
 * survive them to report the rank's status. */
static const int group_signals[] = {SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2, SIGQUIT};

/* The agent is gone: nobody will tear this rank down, so do it now, group and all (the
 * shim included). kill() is async-signal-safe. */
static void on_pdeath(int sig)
{
    (void)sig;
    kill(0, SIGKILL);
}

static void exec_child(char **cmd, const sigset_t *old)
{
    for (size_t i = 0; i < sizeof(group_signals) / sizeof(group_signals[0]); i++)
        signal(group_signals[i], SIG_DFL);
    signal(SHIM_PDEATH_SIG, SIG_DFL);
    sigprocmask(SIG_SETMASK, old, NULL);
    execvp(cmd[0], cmd);
    fprintf(stderr, "gpurun: cannot execute '%s': %s\n", cmd[0], strerror(errno));
    _exit(errno == ENOENT ? 127 : 126);
}

static int pass_status(int status)
{
    struct rlimit none = {0, 0};
    int sig;

    if (WIFEXITED(status))
        return WEXITSTATUS(status);
    sig = WTERMSIG(status);
    /* Die of the same signal so the agent sees what the rank saw; the rank already dumped
     * core if it was going to, the shim must not add one of its own. */
    setrlimit(RLIMIT_CORE, &none);
    signal(sig, SIG_DFL);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, sig);
    sigprocmask(SIG_UNBLOCK, &set, NULL);
    raise(sig);
    return 128 + sig;
}

int shim_main(int argc, char **argv)
{
    sigset_t block, old;
    char *end;
    long agent;
    pid_t child;
    int status = 0;

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
    for (size_t i = 0; i < sizeof(group_signals) / sizeof(group_signals[0]); i++)
        signal(group_signals[i], SIG_IGN);
    sigemptyset(&block);
    sigaddset(&block, SIGCHLD);
    sigprocmask(SIG_BLOCK, &block, &old);
    child = fork();
    if (child < 0) {
        fprintf(stderr, "gpurun: cannot fork: %s\n", strerror(errno));
        return 126;
    }
    if (child == 0)
        exec_child(argv + 4, &old);
    sigprocmask(SIG_SETMASK, &old, NULL);
    for (;;) {
        pid_t got = waitpid(child, &status, 0);
        if (got == child)
            break;
        if (got < 0 && errno != EINTR)
            return 125;
    }
    return pass_status(status);
}
