/* Agent socket directories (sockdir.h). Why a directory and not an abstract Unix socket: an
 * abstract name has no permissions, so any process of the node's network namespace could
 * connect and only the SO_PEERCRED uid check would stand; and the ranks' error files
 * (TORCHELASTIC_ERROR_FILE) need a private place anyway. The directory keeps both behind its
 * 0700 mode; the pid in its name is what lets the next agent tell a leftover from a live one. */
#include <dirent.h>
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
#include <unistd.h>

#include "sockdir.h"
#include "banned.h"

#define SOCKDIR_PREFIX    "gpurun-"
/* mkdtemp's suffix: six characters. */
#define SOCKDIR_RAND      6
/* Files a leftover may hold: agent.sock and one error file per rank. More than this and it
 * is not an agent's directory as we know it: it stays. */
#define SOCKDIR_FILES_MAX 4096

/* The pid in name when name is "gpurun-<pid>-XXXXXX", else 0. */
static pid_t name_pid(const char *name)
{
    const char *p = name + strlen(SOCKDIR_PREFIX);
    long pid = 0;

    if (strncmp(name, SOCKDIR_PREFIX, strlen(SOCKDIR_PREFIX)))
        return 0;
    for (; *p >= '0' && *p <= '9' && pid <= INT_MAX / 10; p++)
        pid = pid * 10 + (*p - '0');
    if (p == name + strlen(SOCKDIR_PREFIX) || *p != '-' || strlen(p + 1) != SOCKDIR_RAND ||
        pid <= 0 || pid > INT_MAX / 10)
        return 0;
    return (pid_t)pid;
}

/* Whether a process listens on dir's agent.sock: a live agent of another pid namespace. */
static bool socket_live(int dfd, const char *path)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    struct stat st;
    bool live = false;
    int fd;

    if (fstatat(dfd, "agent.sock", &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISSOCK(st.st_mode))
        return false;
    if (snprintf(sa.sun_path, sizeof(sa.sun_path), "%s/agent.sock", path) >=
        (int)sizeof(sa.sun_path))
        return true; /* cannot tell: leave it */
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return true;
    live = connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 || errno != ECONNREFUSED;
    close(fd);
    return live;
}

/* Removes the directory name of tmp (open as tfd) when it is a leftover; returns 1 when it
 * did, else 0. */
static int sweep_one(int tfd, const char *tmp, const char *name)
{
    char path[PATH_MAX];
    struct stat st;
    struct dirent *e;
    pid_t pid = name_pid(name);
    int dfd, removed = 0, n = 0;
    DIR *d;

    if (pid == 0 || pid == getpid() || kill(pid, 0) == 0 || errno != ESRCH)
        return 0;
    dfd = openat(tfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dfd < 0)
        return 0;
    if (fstat(dfd, &st) < 0 || st.st_uid != getuid() || (st.st_mode & 077) ||
        snprintf(path, sizeof(path), "%s/%s", tmp, name) >= (int)sizeof(path) ||
        socket_live(dfd, path) || !(d = fdopendir(dfd))) {
        close(dfd);
        return 0;
    }
    /* Files only: unlinkat without AT_REMOVEDIR fails on a subdirectory, and then the
     * directory is not empty and rmdir leaves it. */
    while ((e = readdir(d)) && n++ < SOCKDIR_FILES_MAX)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            unlinkat(dirfd(d), e->d_name, 0);
    closedir(d);
    if (unlinkat(tfd, name, AT_REMOVEDIR) == 0)
        removed = 1;
    return removed;
}

int sockdir_sweep(const char *tmp)
{
    struct dirent *e;
    int removed = 0, tfd;
    DIR *d;

    tfd = open(tmp, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (tfd < 0)
        return -errno;
    d = fdopendir(tfd);
    if (!d) {
        close(tfd);
        return -errno;
    }
    while ((e = readdir(d)))
        removed += sweep_one(dirfd(d), tmp, e->d_name);
    closedir(d);
    return removed;
}

int sockdir_create(const char *tmp, char *out, size_t cap)
{
    if (snprintf(out, cap, "%s/" SOCKDIR_PREFIX "%ld-XXXXXX", tmp, (long)getpid()) >= (int)cap)
        return -ENAMETOOLONG;
    if (!mkdtemp(out))
        return -errno;
    return 0;
}
