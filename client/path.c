/* Path helpers of the client. Nothing here resolves links: a job dir reached through a link
 * keeps the name it was given until a command asks for its real place. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include "path.h"
#include "banned.h"

int path_absolute(const char *path, char *buf, size_t n)
{
    char cwd[PATH_MAX];

    if (path[0] == '/')
        return snprintf(buf, n, "%s", path) < (int)n ? 0 : -ENAMETOOLONG;
    if (!getcwd(cwd, sizeof(cwd)))
        return -errno;
    return snprintf(buf, n, "%s/%s", cwd, path) < (int)n ? 0 : -ENAMETOOLONG;
}

bool path_join(char *buf, size_t n, const char *a, const char *b)
{
    int len = snprintf(buf, n, "%s/%s", a, b);

    return len >= 0 && (size_t)len < n;
}

bool path_is_dir(const char *path)
{
    struct stat st;

    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}
