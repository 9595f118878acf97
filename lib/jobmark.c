/* The job mark (jobmark.h): its value, the pure rules that read and match it, and the sweep
 * of /proc that ends the processes carrying it. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "jobmark.h"
#include "banned.h"

/* Scans of one sweep at most: each ends what the last one missed (a child forked between its
 * parent's read and its kill). A marked process forks a few children at most before its
 * SIGKILL lands, so a sweep ends in two or three scans; the bound only stops a fork bomb from
 * holding the caller. */
#define JOBMARK_ROUNDS 20
/* A process's environment read at most: the kernel's own bound for an exec'd environment
 * is a quarter of the stack limit (2 MiB at the usual 8 MiB); past this the rest is not
 * looked at. */
#define ENVIRON_MAX    (16u << 20)
/* The first read of an environment: most are a few KiB, so one read takes them whole. */
#define ENVIRON_FIRST  16384u

int jobmark_format(const struct jobmark *m, char *out, size_t n)
{
    int len = snprintf(out, n, "%016" PRIx64 "/%ld/%llu/%d", m->job, m->daemon, m->start, m->rank);

    return len < 0 || (size_t)len >= n ? -ENAMETOOLONG : 0;
}

/* One decimal field of s[*i..len), up to '/' or the end, into *v (at most max). Returns 0 or
 * -EINVAL. */
static int parse_dec(const char *s, size_t len, size_t *i, unsigned long long max,
                     unsigned long long *v)
{
    size_t from = *i;

    *v = 0;
    for (; *i < len && s[*i] != '/'; (*i)++) {
        if (s[*i] < '0' || s[*i] > '9' || *v > (max - (unsigned)(s[*i] - '0')) / 10)
            return -EINVAL;
        *v = *v * 10 + (unsigned)(s[*i] - '0');
    }
    return *i > from ? 0 : -EINVAL;
}

int jobmark_parse(const char *s, size_t len, struct jobmark *m)
{
    unsigned long long pid, start, rank;
    uint64_t job = 0;
    size_t i;

    for (i = 0; i < 16; i++) {
        char c = i < len ? s[i] : '\0';
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0)
            return -EINVAL;
        job = job << 4 | (uint64_t)d;
    }
    if (i >= len || s[i++] != '/' || parse_dec(s, len, &i, LONG_MAX, &pid) < 0 || pid == 0 ||
        i >= len || s[i++] != '/' || parse_dec(s, len, &i, ULLONG_MAX, &start) < 0 || i >= len ||
        s[i++] != '/' || parse_dec(s, len, &i, INT_MAX, &rank) < 0 || i != len)
        return -EINVAL;
    *m = (struct jobmark){.job = job, .daemon = (long)pid, .start = start, .rank = (int)rank};
    return 0;
}

size_t jobmark_find(const char *env, size_t len, struct jobmark *out, size_t max)
{
    static const char name[] = JOBMARK_ENV "=";
    const size_t nl = sizeof(name) - 1;
    size_t found = 0;

    for (size_t i = 0; i < len;) {
        const char *end = memchr(env + i, '\0', len - i);
        size_t n = end ? (size_t)(end - (env + i)) : len - i;
        struct jobmark m;

        if (n > nl && !memcmp(env + i, name, nl) && jobmark_parse(env + i + nl, n - nl, &m) == 0) {
            if (found < max)
                out[found] = m;
            found++;
        }
        i += n + 1;
    }
    return found;
}

bool jobmark_matches(const struct jobmark *have, const struct jobmark *want,
                     enum jobmark_scope scope)
{
    switch (scope) {
    case JOBMARK_RANK:
        if (have->rank != want->rank)
            return false;
        /* fall through */
    case JOBMARK_DAEMON:
        if (have->daemon != want->daemon || have->start != want->start)
            return false;
        /* fall through */
    case JOBMARK_JOB:
        return have->job == want->job;
    case JOBMARK_STALE:
        break;
    }
    return false;
}

bool jobmark_owner_gone(const struct jobmark *m, unsigned long long start_now)
{
    if (start_now == 0)
        return true;
    return m->start != 0 && m->start != start_now;
}

int jobmark_proc_start(long pid, unsigned long long *start)
{
    char path[64], buf[1024], *p;
    ssize_t n;
    int fd, field;

    snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT ? -ENOENT : -errno;
    n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return n == 0 ? -ENOENT : -errno;
    buf[n] = '\0';
    /* The command name (field 2) may hold spaces and parentheses: fields count from the last
     * ')'. Field 3 follows it, so field 22 is 19 spaces on. */
    p = strrchr(buf, ')');
    /* A zombie has ended: it only waits for its parent (a killed daemon's, killed too, leaves
     * it to a subreaper that may take its time). */
    if (p && (p[1] != ' ' || p[2] == 'Z' || p[2] == 'X'))
        return -ENOENT;
    for (field = 2; p && field < 22; field++)
        p = strchr(p + 1, ' ');
    if (!p || sscanf(p + 1, "%llu", start) != 1)
        return -EINVAL;
    return 0;
}

/* The environment of pid into *buf (grown as needed, *cap bytes), opened below proc (the
 * /proc directory's fd); its length, or a negative errno (a process of another user, one gone
 * meanwhile). A read of /proc/PID/environ is short only at its end (environ_read in the
 * kernel's fs/proc/base.c loops until the buffer is full or the environment ends), so a
 * short read needs no second one to see the end: that saves a third of the syscalls of a
 * sweep, which costs about 20 us a process on a virtual machine. */
static ssize_t read_environ(int proc, long pid, char **buf, size_t *cap)
{
    char path[64];
    size_t len = 0;
    ssize_t n;
    int fd;

    snprintf(path, sizeof(path), "%ld/environ", pid);
    fd = openat(proc, path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    for (;;) {
        if (len == *cap) {
            size_t ncap = *cap ? *cap * 2 : ENVIRON_FIRST;
            char *nb = ncap <= ENVIRON_MAX ? realloc(*buf, ncap) : NULL;
            if (!nb)
                break;
            *buf = nb;
            *cap = ncap;
        }
        n = read(fd, *buf + len, *cap - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        len += (size_t)n;
        if (len < *cap)
            break;
    }
    close(fd);
    return (ssize_t)len;
}

/* Whether pid runs in our pid namespace. */
static bool same_pid_ns(long pid, const struct stat *ours)
{
    char path[64];
    struct stat st;

    snprintf(path, sizeof(path), "/proc/%ld/ns/pid", pid);
    return stat(path, &st) == 0 && st.st_ino == ours->st_ino && st.st_dev == ours->st_dev;
}

/* Whether the environment env (len bytes) of process pid is to be ended. */
static bool judge(const char *env, size_t len, long pid, const struct jobmark *want,
                  enum jobmark_scope scope, const struct stat *ns)
{
    struct jobmark marks[4];
    size_t n = jobmark_find(env, len, marks, sizeof(marks) / sizeof(marks[0]));

    if (n > sizeof(marks) / sizeof(marks[0]))
        n = sizeof(marks) / sizeof(marks[0]);
    for (size_t i = 0; i < n; i++) {
        unsigned long long start = 0;
        int ret;

        if (scope != JOBMARK_STALE) {
            if (jobmark_matches(&marks[i], want, scope))
                return true;
            continue;
        }
        if (!same_pid_ns(pid, ns))
            return false;
        /* Only a daemon known to be gone counts: a /proc that cannot be read says nothing. */
        ret = jobmark_proc_start(marks[i].daemon, &start);
        if (ret == -ENOENT)
            start = 0;
        else if (ret < 0)
            continue;
        if (jobmark_owner_gone(&marks[i], start))
            return true;
    }
    return false;
}

/* Whether pid is in killed[0..n). */
static bool listed(const pid_t *killed, int n, pid_t pid)
{
    for (int i = 0; i < n; i++)
        if (killed[i] == pid)
            return true;
    return false;
}

int jobmark_sweep(const struct jobmark *want, enum jobmark_scope scope, pid_t skip,
                  struct jobmark_sweep_stats *stats)
{
    struct jobmark_sweep_stats st = {0};
    pid_t self = getpid(), *killed = NULL;
    int nkilled = 0, capkilled = 0, ret = 0;
    struct stat ns = {0};
    size_t cap = 0;
    char *buf = NULL;

    if ((scope == JOBMARK_STALE) != (want == NULL))
        return -EINVAL;
    if (scope == JOBMARK_STALE && stat("/proc/self/ns/pid", &ns) < 0)
        return -errno;
    for (bool more = true; more && st.rounds < JOBMARK_ROUNDS;) {
        DIR *d = opendir("/proc");
        struct dirent *e;

        if (!d) {
            ret = -errno;
            break;
        }
        more = false;
        st.rounds++;
        while ((e = readdir(d))) {
            char *end;
            long pid = strtol(e->d_name, &end, 10);
            ssize_t len;

            if (*end || pid <= 0 || pid == (long)self || pid == (long)skip)
                continue;
            st.scanned++;
            len = read_environ(dirfd(d), pid, &buf, &cap);
            if (len <= 0 || !judge(buf, (size_t)len, pid, want, scope, &ns))
                continue;
            if (listed(killed, nkilled, (pid_t)pid) || kill((pid_t)pid, SIGKILL) < 0)
                continue;
            if (nkilled == capkilled) {
                int ncap = capkilled ? capkilled * 2 : 16;
                pid_t *nk = realloc(killed, (size_t)ncap * sizeof(*nk));
                if (!nk)
                    continue;
                killed = nk;
                capkilled = ncap;
            }
            killed[nkilled++] = (pid_t)pid;
            more = true;
        }
        closedir(d);
    }
    st.killed = nkilled;
    free(buf);
    free(killed);
    if (stats)
        *stats = st;
    return ret;
}
