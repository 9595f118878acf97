/* Tests of daemon/cgroup.c: a rank's cgroup ends everything in it, setsid'd descendants
 * included, and is removed. Skipped where this machine has no writable cgroup v2. */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../daemon/cgroup.h"
#include "test.h"
#include "banned.h"

static void job_cgroup(char *dir, size_t len)
{
    struct errmsg why;

    if (cgroup_job_create(dir, len, &why) < 0)
        test_skip("no writable cgroup v2: %s", why.text);
}

static bool running(pid_t pid)
{
    char path[64], buf[512], *p;
    char state = 0;
    FILE *f;

    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    f = fopen(path, "re");
    if (!f)
        return false;
    if (fgets(buf, sizeof(buf), f) && (p = strrchr(buf, ')')))
        state = p[2];
    fclose(f);
    return state && state != 'Z' && state != 'X';
}

/* Remove of a cgroup holding a process and its setsid'd, double-forked descendant: both are
 * killed, the cgroup and the job's are gone. */
TEST(cgroup_remove_kills_setsid_descendants)
{
    char job[PATH_MAX], rank[PATH_MAX + 16];
    int fds[2];
    pid_t child, grandchild = 0;

    job_cgroup(job, sizeof(job));
    snprintf(rank, sizeof(rank), "%s/rank-0", job);
    CHECK_EQ(cgroup_make(rank), 0);
    CHECK_EQ(cgroup_make(rank), 0); /* an existing one is reused */
    CHECK_EQ(pipe(fds), 0);
    child = fork();
    CHECK(child >= 0);
    if (child == 0) {
        if (cgroup_enter(rank, 0) < 0)
            _exit(1);
        pid_t g = fork();
        if (g == 0) {
            setsid();
            pid_t gg = fork();
            if (gg == 0) {
                pid_t self = getpid();
                if (write(fds[1], &self, sizeof(self)) != sizeof(self))
                    _exit(1);
                pause();
            }
            _exit(0);
        }
        waitpid(g, NULL, 0);
        pause();
        _exit(0);
    }
    close(fds[1]);
    CHECK_EQ(read(fds[0], &grandchild, sizeof(grandchild)), (long)sizeof(grandchild));
    close(fds[0]);
    CHECK(running(child));
    CHECK(running(grandchild));
    CHECK_EQ(cgroup_remove(rank, 1000), 0);
    int status = 0;
    CHECK_EQ(waitpid(child, &status, 0), child);
    if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGKILL)
        test_fail(__FILE__, __LINE__, "the cgroup's process: expected SIGKILL, got status 0x%x",
                  status);
    /* The grandchild is init's (or a subreaper's) now: gone or a zombie. */
    for (int i = 0; i < 100 && running(grandchild); i++)
        usleep(10000);
    if (running(grandchild))
        test_fail(__FILE__, __LINE__, "setsid'd descendant %d still running", (int)grandchild);
    struct stat st;
    CHECK_EQ(stat(rank, &st) < 0 ? errno : 0, ENOENT);
    CHECK_EQ(cgroup_remove(job, 1000), 0);
    CHECK_EQ(stat(job, &st) < 0 ? errno : 0, ENOENT);
}

/* What does not exist is removed already; killing it says so. */
TEST(cgroup_missing)
{
    char job[PATH_MAX], rank[PATH_MAX + 16];

    job_cgroup(job, sizeof(job));
    snprintf(rank, sizeof(rank), "%s/rank-7", job);
    CHECK_EQ(cgroup_remove(rank, 0), 0);
    CHECK_EQ(cgroup_kill(rank), -ENOENT);
    CHECK_EQ(cgroup_remove(job, 0), 0);
    CHECK_EQ(cgroup_make("/proc/no/such/dir"), -ENOENT);
}

/* The empty job cgroup of a daemon that is gone is removed by the next daemon's start. */
TEST(cgroup_leftover_removed)
{
    char job[PATH_MAX], old[PATH_MAX + 32];
    struct stat st;
    pid_t gone = fork();

    CHECK(gone >= 0);
    if (gone == 0)
        _exit(0);
    CHECK_EQ(waitpid(gone, NULL, 0), gone);
    job_cgroup(job, sizeof(job));
    *strrchr(job, '/') = '\0';
    snprintf(old, sizeof(old), "%s/gpurun-%d", job, (int)gone);
    CHECK_EQ(cgroup_make(old), 0);
    snprintf(old + strlen(old), sizeof(old) - strlen(old), "/rank-3");
    CHECK_EQ(cgroup_make(old), 0);
    job_cgroup(job, sizeof(job));
    *strrchr(old, '/') = '\0';
    if (stat(old, &st) == 0)
        test_fail(__FILE__, __LINE__, "leftover '%s' still there", old);
    CHECK_EQ(cgroup_remove(job, 0), 0);
}
