/* The script a command runs (scripthead.h). */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "scripthead.h"
#include "banned.h"

/* Reads the regular file path (relative: to the directory dfd) into buf (cap bytes at most):
 * the bytes read, or 0. */
static size_t read_head(int dfd, const char *path, char *buf, size_t cap)
{
    struct stat st;
    size_t len = 0;
    int fd = openat(dfd, path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);

    if (fd < 0)
        return 0;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return 0;
    }
    while (len < cap) {
        ssize_t r = read(fd, buf + len, cap - len);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        len += (size_t)r;
    }
    close(fd);
    return len;
}

static int ends_in_py(const char *s)
{
    size_t n = strlen(s);

    return n > 3 && !strcmp(s + n - 3, ".py");
}

size_t script_head(const char *dir, char *const *argv, int argc, char *buf, size_t cap)
{
    size_t n = 0;
    int dfd = dir ? open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : AT_FDCWD;

    if (dir && dfd < 0)
        return 0;
    if (cap > SCRIPT_HEAD_MAX)
        cap = SCRIPT_HEAD_MAX;
    for (int i = 0; i < argc && !n; i++)
        if (argv[i] && ends_in_py(argv[i]))
            n = read_head(dfd, argv[i], buf, cap);
    if (!n && argc > 0 && argv[0] && (n = read_head(dfd, argv[0], buf, cap)) > 0 &&
        (n <= 2 || memcmp(buf, "#!", 2)))
        n = 0;
    if (dir)
        close(dfd);
    return n;
}
