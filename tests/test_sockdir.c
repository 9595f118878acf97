/* Tests of daemon/sockdir: the agent's socket directory carries its pid, and the sweep removes
 * the directories of agents that are gone, and nothing else: not a live agent's (by pid or by
 * a listening socket), not another name, not a link, not one with a subdirectory. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../daemon/sockdir.h"
#include "test.h"
#include "banned.h"

/* A pid that no process has: a child that exited and was reaped (pids are not reused that
 * fast on an idle pid space; the test checks kill() says so). */
static pid_t dead_pid(void)
{
    pid_t pid = fork();
    int st;

    CHECK(pid >= 0);
    if (pid == 0)
        _exit(0);
    CHECK_EQ(waitpid(pid, &st, 0), pid);
    CHECK(kill(pid, 0) < 0 && errno == ESRCH);
    return pid;
}

/* Makes tmp/name as a 0700 directory holding agent.sock (a bound socket nobody listens on
 * when listen is false) and an error file; returns the listening fd, or -1. */
static int make_dir(const char *tmp, const char *name, bool with_socket, bool listening)
{
    char path[PATH_MAX];
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    int fd = -1;
    FILE *f;

    snprintf(path, sizeof(path), "%s/%s", tmp, name);
    CHECK_EQ(mkdir(path, 0700), 0);
    snprintf(path, sizeof(path), "%s/%s/rank-0.error.json", tmp, name);
    f = fopen(path, "we");
    CHECK(f != NULL);
    fputs("{}", f);
    fclose(f);
    if (!with_socket)
        return -1;
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s/%s/agent.sock", tmp, name);
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    CHECK(fd >= 0);
    CHECK_EQ(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    if (listening) {
        CHECK_EQ(listen(fd, 1), 0);
        return fd;
    }
    close(fd);
    return -1;
}

static bool exists(const char *tmp, const char *name)
{
    char path[PATH_MAX];
    struct stat st;

    snprintf(path, sizeof(path), "%s/%s", tmp, name);
    return lstat(path, &st) == 0;
}

/* A short scratch dir: socket paths must fit sun_path's 108 bytes. */
static void scratch(char *tmp, size_t cap)
{
    snprintf(tmp, cap, "/tmp/gr-sockdir-test-XXXXXX");
    CHECK(mkdtemp(tmp) != NULL);
}

static void remove_tree(const char *tmp)
{
    char *argv[] = {"rm", "-rf", (char *)tmp, NULL};
    pid_t pid = fork();
    int st;

    CHECK(pid >= 0);
    if (pid == 0) {
        execvp("rm", argv);
        _exit(127);
    }
    waitpid(pid, &st, 0);
}

TEST(sockdir_name_carries_the_pid)
{
    char tmp[64], dir[PATH_MAX], want[96];
    struct stat st;

    scratch(tmp, sizeof(tmp));
    CHECK_EQ(sockdir_create(tmp, dir, sizeof(dir)), 0);
    snprintf(want, sizeof(want), "%s/gpurun-%ld-", tmp, (long)getpid());
    CHECK(strncmp(dir, want, strlen(want)) == 0);
    CHECK_EQ(strlen(dir), strlen(want) + 6);
    CHECK_EQ(stat(dir, &st), 0);
    CHECK_EQ(st.st_mode & 0777, 0700);
    /* This process is alive: the sweep leaves its directory. */
    CHECK_EQ(sockdir_sweep(tmp), 0);
    CHECK_EQ(stat(dir, &st), 0);
    CHECK_EQ(sockdir_create(tmp, dir, 16), -ENAMETOOLONG);
    remove_tree(tmp);
}

TEST(sockdir_sweep_removes_only_leftovers)
{
    char tmp[64], name[PATH_MAX], link_path[PATH_MAX], target[PATH_MAX];
    char stale[64], stale_bare[64], live_pid[64], live_sock[64], subdir[64], linkname[64];
    pid_t dead = dead_pid();
    int lfd;

    scratch(tmp, sizeof(tmp));
    /* A leftover: dead pid, its socket bound but not listening (as SIGKILL leaves it). */
    snprintf(stale, sizeof(stale), "gpurun-%ld-aaaaaa", (long)dead);
    make_dir(tmp, stale, true, false);
    /* A leftover from before it listened: no socket. */
    snprintf(stale_bare, sizeof(stale_bare), "gpurun-%ld-bbbbbb", (long)dead);
    make_dir(tmp, stale_bare, false, false);
    /* A live agent: its pid runs. */
    snprintf(live_pid, sizeof(live_pid), "gpurun-%ld-cccccc", (long)getppid());
    make_dir(tmp, live_pid, true, false);
    /* A live agent of another pid namespace: the pid means nothing here, its socket listens. */
    snprintf(live_sock, sizeof(live_sock), "gpurun-%ld-dddddd", (long)dead);
    lfd = make_dir(tmp, live_sock, true, true);
    /* Not an agent's: it holds a directory. */
    snprintf(subdir, sizeof(subdir), "gpurun-%ld-eeeeee", (long)dead);
    make_dir(tmp, subdir, false, false);
    snprintf(name, sizeof(name), "%s/%s/inner", tmp, subdir);
    CHECK_EQ(mkdir(name, 0700), 0);
    /* A link with the name of a leftover, to a directory that must survive. */
    snprintf(linkname, sizeof(linkname), "gpurun-%ld-ffffff", (long)dead);
    snprintf(target, sizeof(target), "%s/target", tmp);
    CHECK_EQ(mkdir(target, 0700), 0);
    snprintf(link_path, sizeof(link_path), "%s/%s", tmp, linkname);
    CHECK_EQ(symlink(target, link_path), 0);
    /* Other names: the old pattern, the test runner's, a pid-less one. */
    make_dir(tmp, "gpurun-abcdef", false, false);
    make_dir(tmp, "gpurun-run.abcdef", false, false);
    make_dir(tmp, "gpurun--abcdef", false, false);

    CHECK_EQ(sockdir_sweep(tmp), 2);
    CHECK(!exists(tmp, stale));
    CHECK(!exists(tmp, stale_bare));
    CHECK(exists(tmp, live_pid));
    CHECK(exists(tmp, live_sock));
    CHECK(exists(tmp, subdir));
    CHECK(exists(tmp, linkname));
    CHECK(exists(tmp, "target"));
    CHECK(exists(tmp, "gpurun-abcdef"));
    CHECK(exists(tmp, "gpurun-run.abcdef"));
    CHECK(exists(tmp, "gpurun--abcdef"));
    /* Once its agent is gone too, the socket's directory goes. */
    close(lfd);
    CHECK_EQ(sockdir_sweep(tmp), 1);
    CHECK(!exists(tmp, live_sock));
    CHECK_EQ(sockdir_sweep("/nonexistent-dir-of-the-test"), -ENOENT);
    remove_tree(tmp);
}
