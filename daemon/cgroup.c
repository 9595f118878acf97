/* Rank containment in cgroup v2 (cgroup.h): finding our own cgroup, making the job's and the
 * ranks' cgroups below it, and ending one as a whole. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cgroup.h"
#include "banned.h"

/* Rounds of the cgroup.procs fallback (kernels before 5.14): each kills what the last one
 * missed (a process forked meanwhile); a killed process leaves the list within a millisecond
 * or two, so 500 rounds of 1 ms are ample for anything but a fork bomb that outruns SIGKILL. */
#define PROCS_ROUNDS 500
/* The pause between rounds, and between tries of rmdir while the cgroup empties. */
#define ROUND_NS     1000000L

static void pause_round(void)
{
    struct timespec ts = {0, ROUND_NS};

    nanosleep(&ts, NULL);
}

/* Writes text to dir/file. Returns 0 or a negative errno. */
static int write_file(const char *dir, const char *file, const char *text)
{
    char path[PATH_MAX];
    size_t len = strlen(text);
    int fd, ret = 0;

    if (snprintf(path, sizeof(path), "%s/%s", dir, file) >= (int)sizeof(path))
        return -ENAMETOOLONG;
    fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    if (write(fd, text, len) != (ssize_t)len)
        ret = -errno;
    close(fd);
    return ret;
}

/* The cgroup2 mount point and the root of the hierarchy it shows (from mountinfo), each
 * PATH_MAX bytes. */
static int v2_mount(char *mnt, char *root, struct errmsg *why)
{
    char line[2 * PATH_MAX];
    FILE *f;

    mnt[0] = '\0';
    f = fopen("/proc/self/mountinfo", "re");
    if (!f)
        return errmsg_set(why, -errno, "cannot read '/proc/self/mountinfo': %s", strerror(errno));
    while (fgets(line, sizeof(line), f)) {
        char *sep = strstr(line, " - cgroup2 ");
        if (sep && sscanf(line, "%*s %*s %*s %4095s %4095s", root, mnt) == 2)
            break;
        mnt[0] = '\0';
    }
    fclose(f);
    if (!mnt[0])
        return errmsg_set(why, -ENOENT, "no cgroup v2 mount");
    return 0;
}

int cgroup_hierarchy_path(const char *dir, char *out, size_t len)
{
    char mnt[PATH_MAX], root[PATH_MAX];
    struct errmsg why;
    size_t n;
    int ret = v2_mount(mnt, root, &why);

    if (ret < 0)
        return ret;
    n = strlen(mnt);
    if (strncmp(dir, mnt, n) || (dir[n] && dir[n] != '/'))
        return -EINVAL;
    if (snprintf(out, len, "%s%s", strcmp(root, "/") ? root : "", dir[n] ? dir + n : "/") >=
        (int)len)
        return -ENAMETOOLONG;
    return 0;
}

/* Our cgroup v2 directory: the cgroup2 mount point (from mountinfo) joined with our path in
 * the unified hierarchy (the "0::" line of /proc/self/cgroup). */
static int own_dir(char *dir, size_t len, struct errmsg *why)
{
    char line[2 * PATH_MAX], mnt[PATH_MAX] = "", root[PATH_MAX] = "", path[PATH_MAX] = "";
    const char *rel;
    FILE *f;
    int ret = v2_mount(mnt, root, why);

    if (ret < 0)
        return ret;
    f = fopen("/proc/self/cgroup", "re");
    if (!f)
        return errmsg_set(why, -errno, "cannot read '/proc/self/cgroup': %s", strerror(errno));
    while (fgets(line, sizeof(line), f))
        if (!strncmp(line, "0::", 3) && sscanf(line + 3, "%4095s", path) == 1)
            break;
    fclose(f);
    if (path[0] != '/')
        return errmsg_set(why, -ENOENT, "no cgroup v2 entry in '/proc/self/cgroup'");
    /* A mount of a subtree (a container's view) shows our path below its root. */
    rel = path;
    if (strcmp(root, "/")) {
        size_t n = strlen(root);
        if (strncmp(path, root, n) || (path[n] && path[n] != '/'))
            return errmsg_set(why, -ENOENT,
                              "our cgroup '%s' is outside the cgroup v2 mount at '%s'", path, mnt);
        rel = path + n;
    }
    if (snprintf(dir, len, "%s%s", mnt, strcmp(rel, "/") ? rel : "") >= (int)len)
        return errmsg_set(why, -ENAMETOOLONG, "cgroup path too long");
    return 0;
}

int cgroup_make(const char *dir)
{
    char parent[PATH_MAX];
    const char *slash = strrchr(dir, '/');

    if (mkdir(dir, 0755) == 0 || errno == EEXIST)
        return 0;
    /* The job's cgroup, removed by the last shim of a frozen agent (shim.c), is made again. */
    if (errno != ENOENT || !slash || (size_t)(slash - dir) >= sizeof(parent))
        return -errno;
    snprintf(parent, sizeof(parent), "%.*s", (int)(slash - dir), dir);
    if (mkdir(parent, 0755) < 0 && errno != EEXIST)
        return -errno;
    if (mkdir(dir, 0755) < 0 && errno != EEXIST)
        return -errno;
    return 0;
}

/* rmdir of dir after the cgroups below it, deepest first. Returns 0 or a negative errno. */
static int remove_tree(const char *dir);

/* Removes the empty job cgroups of daemons that are gone (killed before their end): a
 * cgroup with processes is left alone, as is one whose pid is in use (perhaps another
 * daemon's, in a pid namespace we cannot see into). */
static void remove_leftovers(const char *own)
{
    char path[PATH_MAX];
    struct dirent *e;
    DIR *d = opendir(own);

    if (!d)
        return;
    while ((e = readdir(d))) {
        char *end;
        long pid;

        if (e->d_type != DT_DIR || strncmp(e->d_name, "gpurun-", 7))
            continue;
        pid = strtol(e->d_name + 7, &end, 10);
        if (*end || pid <= 0 || pid == (long)getpid() || kill((pid_t)pid, 0) == 0 || errno != ESRCH)
            continue;
        if (snprintf(path, sizeof(path), "%s/%s", own, e->d_name) < (int)sizeof(path))
            remove_tree(path);
    }
    closedir(d);
}

int cgroup_job_create(char *dir, size_t len, struct errmsg *why)
{
    char own[PATH_MAX], procs[PATH_MAX + 16];
    int ret;

    ret = own_dir(own, sizeof(own), why);
    if (ret < 0)
        return ret;
    /* Moving a rank from our cgroup into one below needs write access to our cgroup.procs
     * (the common ancestor's): without it the kernel would refuse every rank. */
    snprintf(procs, sizeof(procs), "%s/cgroup.procs", own);
    if (access(procs, W_OK) < 0)
        return errmsg_set(why, -errno, "cgroup '%s' is not writable: %s", own, strerror(errno));
    remove_leftovers(own);
    if (snprintf(dir, len, "%s/gpurun-%d", own, (int)getpid()) >= (int)len)
        return errmsg_set(why, -ENAMETOOLONG, "cgroup path too long");
    ret = cgroup_make(dir);
    if (ret < 0) {
        errmsg_set(why, ret, "cannot create cgroup '%s': %s", dir, strerror(-ret));
        dir[0] = '\0';
    }
    return ret;
}

int cgroup_enter(const char *dir, int pid)
{
    char text[24];

    snprintf(text, sizeof(text), "%d", pid);
    return write_file(dir, "cgroup.procs", text);
}

/* One round of the fallback over dir and the cgroups below it: SIGKILL to every pid listed.
 * Returns how many pids were listed, or a negative errno. */
static int kill_listed(const char *dir)
{
    char path[PATH_MAX];
    int n = 0;
    long pid;
    FILE *f;
    DIR *d;
    struct dirent *e;

    if (snprintf(path, sizeof(path), "%s/cgroup.procs", dir) >= (int)sizeof(path))
        return -ENAMETOOLONG;
    f = fopen(path, "re");
    if (!f)
        return -errno;
    while (fscanf(f, "%ld", &pid) == 1) {
        kill((pid_t)pid, SIGKILL);
        n++;
    }
    fclose(f);
    d = opendir(dir);
    if (!d)
        return n;
    while ((e = readdir(d))) {
        if (e->d_type != DT_DIR || e->d_name[0] == '.')
            continue;
        if (snprintf(path, sizeof(path), "%s/%s", dir, e->d_name) >= (int)sizeof(path))
            continue;
        int k = kill_listed(path);
        if (k > 0)
            n += k;
    }
    closedir(d);
    return n;
}

int cgroup_kill(const char *dir)
{
    struct stat st;
    int ret;

    ret = write_file(dir, "cgroup.kill", "1");
    if (ret != -ENOENT)
        return ret;
    if (stat(dir, &st) < 0)
        return -errno;
    for (int i = 0; i < PROCS_ROUNDS; i++) {
        ret = kill_listed(dir);
        if (ret <= 0)
            return ret;
        pause_round();
    }
    return -EBUSY;
}

/* rmdir of dir after the cgroups below it, deepest first. Returns 0 or a negative errno. */
static int remove_tree(const char *dir)
{
    char path[PATH_MAX];
    struct dirent *e;
    DIR *d;

    d = opendir(dir);
    if (!d)
        return errno == ENOENT ? 0 : -errno;
    while ((e = readdir(d))) {
        if (e->d_type != DT_DIR || e->d_name[0] == '.')
            continue;
        if (snprintf(path, sizeof(path), "%s/%s", dir, e->d_name) < (int)sizeof(path))
            remove_tree(path);
    }
    closedir(d);
    if (rmdir(dir) < 0 && errno != ENOENT)
        return -errno;
    return 0;
}

int cgroup_remove(const char *dir, int wait_ms)
{
    int ret = cgroup_kill(dir);

    if (ret == -ENOENT)
        return 0;
    /* The killed processes leave the cgroup as they exit (zombies do not count), and rmdir
     * says EBUSY until then. */
    for (long waited = 0;; waited += ROUND_NS) {
        ret = remove_tree(dir);
        if (ret != -EBUSY || waited / 1000000 >= wait_ms)
            return ret;
        pause_round();
    }
}
