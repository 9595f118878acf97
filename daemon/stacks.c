/* Stack capture targets and tools. /proc is read once per capture: a hang is rare and the
 * scan costs a millisecond per thousand processes. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "stacks.h"
#include "banned.h"

/* Processes of the machine read in one scan (all of /proc, to find a rank's descendants):
 * a node runs far fewer; past this a rank's target may be missed, and it gets no stack. */
#define MAX_PROCS 65536

struct pp {
    pid_t pid, ppid;
};

static pid_t parent_of(pid_t pid)
{
    char path[64], buf[512], *p;
    int ppid = 0;
    FILE *f;

    snprintf(path, sizeof(path), "/proc/%ld/stat", (long)pid);
    f = fopen(path, "re");
    if (!f)
        return 0;
    /* The command name may hold blanks and parentheses: the fields start after the last ')'. */
    if (fgets(buf, sizeof(buf), f) && (p = strrchr(buf, ')')))
        sscanf(p + 2, "%*c %d", &ppid);
    fclose(f);
    return (pid_t)ppid;
}

static size_t list_procs(struct pp *out, size_t cap)
{
    DIR *d = opendir("/proc");
    struct dirent *e;
    size_t n = 0;

    if (!d)
        return 0;
    while ((e = readdir(d)) && n < cap) {
        char *end;
        long pid = strtol(e->d_name, &end, 10);
        if (*end || pid <= 0)
            continue;
        out[n].pid = (pid_t)pid;
        out[n].ppid = parent_of((pid_t)pid);
        n++;
    }
    closedir(d);
    return n;
}

static bool is_python(pid_t pid)
{
    char path[64], exe[PATH_MAX];
    ssize_t len;
    const char *base;

    snprintf(path, sizeof(path), "/proc/%ld/exe", (long)pid);
    len = readlink(path, exe, sizeof(exe) - 1);
    if (len <= 0)
        return false;
    exe[len] = '\0';
    base = strrchr(exe, '/');
    base = base ? base + 1 : exe;
    return !strncmp(base, "python", 6);
}

int stacks_find_target(pid_t root, struct stack_target *t)
{
    struct pp *procs = calloc(MAX_PROCS, sizeof(*procs));
    pid_t queue[256];
    size_t n, head = 0, tail = 0;
    int ret = -ESRCH;

    memset(t, 0, sizeof(*t));
    if (!procs)
        return -ENOMEM;
    n = list_procs(procs, MAX_PROCS);
    queue[tail++] = root;
    while (head < tail) {
        pid_t p = queue[head++];
        for (size_t i = 0; i < n; i++) {
            if (procs[i].ppid != p)
                continue;
            if (!t->pid)
                t->pid = procs[i].pid; /* root's first child: the command itself */
            if (is_python(procs[i].pid)) {
                t->pid = procs[i].pid;
                t->python = true;
                ret = 0;
                goto out;
            }
            if (tail < sizeof(queue) / sizeof(queue[0]))
                queue[tail++] = procs[i].pid;
        }
    }
    if (t->pid)
        ret = 0;
out:
    free(procs);
    return ret;
}

int stacks_find_marked(const struct jobmark *want, struct stack_target *t)
{
    DIR *d = opendir("/proc");
    struct dirent *e;
    static char env[64 * 1024];

    memset(t, 0, sizeof(*t));
    if (!d)
        return -errno;
    while ((e = readdir(d))) {
        char path[64], *end;
        struct jobmark have[4];
        long pid = strtol(e->d_name, &end, 10);
        ssize_t len;
        size_t found;
        int fd;

        if (*end || pid <= 0 || !is_python((pid_t)pid))
            continue;
        snprintf(path, sizeof(path), "/proc/%ld/environ", pid);
        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            continue;
        len = read(fd, env, sizeof(env));
        close(fd);
        if (len <= 0)
            continue;
        found = jobmark_find(env, (size_t)len, have, 4);
        for (size_t i = 0; i < found && i < 4; i++)
            if (jobmark_matches(&have[i], want, JOBMARK_RANK)) {
                t->pid = (pid_t)pid;
                t->python = true;
                closedir(d);
                return 0;
            }
    }
    closedir(d);
    return -ESRCH;
}

/* The absolute path of name on PATH into out, or false. */
static bool on_path(const char *name, char *out, size_t cap)
{
    const char *path = getenv("PATH");

    for (const char *p = path ? path : "/usr/bin:/bin"; *p;) {
        size_t n = strcspn(p, ":");
        if (n && snprintf(out, cap, "%.*s/%s", (int)n, p, name) < (int)cap &&
            access(out, X_OK) == 0)
            return true;
        p += n + (p[n] == ':');
    }
    return false;
}

int stacks_tool_argv(pid_t pid, char *buf, size_t cap, char **argv, const char **tool)
{
    size_t half = cap / 2;
    char *exe = buf, *num = buf + half;

    snprintf(num, cap - half, "%ld", (long)pid);
    if (on_path("eu-stack", exe, half)) {
        /* -p: every thread of the process; -s: source lines where debug info has them. */
        char *v[] = {exe, "-s", "-p", num, NULL};
        memcpy(argv, v, sizeof(v));
        *tool = "eu-stack";
        return 0;
    }
    if (on_path("gdb", exe, half)) {
        char *v[] = {exe, "-batch", "-nx", "-p", num, "-ex", "thread apply all bt", NULL};
        memcpy(argv, v, sizeof(v));
        *tool = "gdb";
        return 0;
    }
    return -ENOENT;
}
