/* Job-dir file helpers. The rename dance is what makes summary.json, endpoint.json and
 * job.json safe to read while they are written, on local disks and NFS alike. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <dirent.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fsutil.h"
#include "banned.h"

int fs_fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC), ret = 0;

    if (fd < 0)
        return -errno;
    if (fsync(fd) < 0)
        ret = -errno;
    close(fd);
    return ret;
}

static int fsync_dir_of(const char *path)
{
    char dir[PATH_MAX];
    const char *slash = strrchr(path, '/');

    if (!slash)
        snprintf(dir, sizeof(dir), ".");
    else if (slash == path)
        snprintf(dir, sizeof(dir), "/");
    else
        snprintf(dir, sizeof(dir), "%.*s", (int)(slash - path), path);
    return fs_fsync_dir(dir);
}

static int replace(const char *path, const void *data, size_t len, mode_t mode, bool durable)
{
    char tmp[PATH_MAX];
    const char *p = data;
    int ret = -1, fd = -1;

    if (snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof(tmp))
        return -ENAMETOOLONG;
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
    if (fd < 0)
        return -errno;
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            ret = -errno;
            goto out;
        }
        p += n;
        len -= (size_t)n;
    }
    if (durable && fsync(fd) < 0) {
        ret = -errno;
        goto out;
    }
    if (close(fd) < 0) {
        fd = -1;
        ret = -errno;
        goto out;
    }
    fd = -1;
    if (rename(tmp, path) < 0) {
        ret = -errno;
        goto out;
    }
    return durable ? fsync_dir_of(path) : 0;
out:
    if (fd >= 0)
        close(fd);
    unlink(tmp);
    return ret;
}

int fs_write_atomic(const char *path, const void *data, size_t len, mode_t mode)
{
    return replace(path, data, len, mode, true);
}

int fs_publish(const char *path, const void *data, size_t len, mode_t mode)
{
    return replace(path, data, len, mode, false);
}

int fs_mkdirs(const char *dir, mode_t mode)
{
    char buf[PATH_MAX];
    size_t n = strlen(dir);

    if (n == 0 || n >= sizeof(buf))
        return -ENAMETOOLONG;
    memcpy(buf, dir, n + 1);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(buf, 0700) < 0 && errno != EEXIST)
            return -errno;
        *p = '/';
    }
    if (mkdir(buf, mode) < 0) {
        struct stat st;
        /* EEXIST also means a file of that name: not the directory the caller needs. */
        if (errno != EEXIST)
            return -errno;
        if (stat(buf, &st) < 0)
            return -errno;
        if (!S_ISDIR(st.st_mode))
            return -ENOTDIR;
    }
    return 0;
}

int fs_read_fd(int fd, size_t max, char **out, size_t *len)
{
    struct stat st;
    char *buf = NULL;
    size_t got = 0;
    int ret = -1;

    if (fstat(fd, &st) < 0)
        return -errno;
    if ((size_t)st.st_size > max) {
        ret = -EFBIG;
        goto out;
    }
    buf = malloc((size_t)st.st_size + 1);
    if (!buf) {
        ret = -ENOMEM;
        goto out;
    }
    while (got < (size_t)st.st_size) {
        ssize_t n = read(fd, buf + got, (size_t)st.st_size - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            ret = -errno;
            goto out;
        }
        if (n == 0)
            break;
        got += (size_t)n;
    }
    buf[got] = '\0';
    *out = buf;
    *len = got;
    buf = NULL;
    ret = 0;
out:
    free(buf);
    return ret;
}

int fs_read_all(const char *path, size_t max, char **out, size_t *len)
{
    int ret, fd = open(path, O_RDONLY | O_CLOEXEC);

    if (fd < 0)
        return -errno;
    ret = fs_read_fd(fd, max, out, len);
    close(fd);
    return ret;
}

/* Walks the directory open at fd (taken: closed here): sizes every file into *bytes and, when
 * remove, removes each entry after its contents. Returns 0 or the first negative errno. */
static int walk_fd(int fd, bool remove, uint64_t *bytes)
{
    DIR *d = fdopendir(fd);
    struct dirent *e;
    int ret = 0;

    if (!d) {
        close(fd);
        return -errno;
    }
    while ((e = readdir(d))) {
        struct stat st;
        int r = 0;
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        if (fstatat(fd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
            r = -errno;
        } else if (S_ISDIR(st.st_mode)) {
            int sub = openat(fd, e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            r = sub < 0 ? -errno : walk_fd(sub, remove, bytes);
            if (r == 0 && remove && unlinkat(fd, e->d_name, AT_REMOVEDIR) < 0)
                r = -errno;
        } else {
            if (S_ISREG(st.st_mode))
                *bytes += (uint64_t)st.st_size;
            if (remove && unlinkat(fd, e->d_name, 0) < 0)
                r = -errno;
        }
        if (r < 0 && ret == 0)
            ret = r;
    }
    closedir(d);
    return ret;
}

int fs_remove_tree(const char *dir, uint64_t *bytes)
{
    uint64_t n = 0;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    int ret = fd < 0 ? -errno : walk_fd(fd, true, &n);

    if (bytes)
        *bytes += n;
    if (ret == 0 && rmdir(dir) < 0)
        ret = -errno;
    return ret;
}

int fs_tree_size(const char *dir, uint64_t *bytes)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);

    *bytes = 0;
    return fd < 0 ? -errno : walk_fd(fd, false, bytes);
}

int fs_script_interpreter(const char *path, char *out, size_t n)
{
    char head[256];
    ssize_t got;
    size_t start, len;
    int fd = open(path, O_RDONLY | O_CLOEXEC);

    if (fd < 0)
        return 0;
    got = read(fd, head, sizeof(head) - 1);
    close(fd);
    if (got < 2 || head[0] != '#' || head[1] != '!')
        return 0;
    head[got] = '\0';
    /* Linux: blanks after "#!", then the interpreter up to a blank or the end of the line. */
    start = 2 + strspn(head + 2, " \t");
    len = strcspn(head + start, " \t\n");
    if (len == 0)
        return 0;
    if (len >= n)
        return -ENAMETOOLONG;
    memcpy(out, head + start, len);
    out[len] = '\0';
    return 1;
}
