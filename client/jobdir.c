/* Where job dirs live, and creating one. The directory is made private before the key is
 * written into it, and every file goes through lib/ (auth_key_write, jobspec_save) so that
 * the daemons read what gpurun wrote with the same code. */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <pwd.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <uv.h>

#include "auth.h"
#include "fsutil.h"
#include "jobdir.h"
#include "path.h"
#include "banned.h"

int jobdir_local_id(char *buf, size_t n, time_t t, long pid)
{
    struct tm tm;
    char stamp[32];

    if (!localtime_r(&t, &tm) || !strftime(stamp, sizeof(stamp), "%Y%m%d-%H%M%S", &tm))
        return -EINVAL;
    if (snprintf(buf, n, "local-%s-%ld", stamp, pid) >= (int)n)
        return -ENAMETOOLONG;
    return 0;
}

static const char *home_dir(void)
{
    const char *home = getenv("HOME");
    struct passwd *pw;

    if (home && *home)
        return home;
    pw = getpwuid(getuid());
    return pw ? pw->pw_dir : NULL;
}

int jobdir_root(char *buf, size_t n)
{
    const char *env = getenv(JOBDIR_ENV), *home;

    if (env && *env)
        return path_absolute(env, buf, n) < 0 ? -ENAMETOOLONG : 0;
    home = home_dir();
    if (!home || snprintf(buf, n, "%s/" JOBDIR_HOME_ROOT, home) >= (int)n)
        return -ENOENT;
    return 0;
}

int jobdir_root_make(const char *root, struct errmsg *err)
{
    const char *env = getenv(JOBDIR_ENV);
    int r = fs_mkdirs(root, 0700);

    if (r == 0)
        return 0;
    /* The variable as the user wrote it: the path alone would not say where it came from. */
    if (env && *env)
        return errmsg_set(err, r, JOBDIR_ENV " '%s': cannot create it: %s", env, uv_strerror(r));
    return errmsg_set(err, r, "cannot create the jobs root '%s': %s", root, uv_strerror(r));
}

/* 1: dir has no entries; 0: it has some; negative errno: it cannot be read. */
static int dir_is_empty(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    int empty = 1;

    if (!d)
        return -errno;
    while ((e = readdir(d))) {
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            empty = 0;
            break;
        }
    }
    closedir(d);
    return empty;
}

/* Creates dir (mode 0700) with its missing parents; *made says whether dir itself is new. An
 * existing dir must be an empty directory. */
static int make_dir(const char *dir, bool *made, struct errmsg *err)
{
    char parent[PATH_MAX];
    const char *slash = strrchr(dir, '/');
    int r;

    *made = false;
    if (slash && slash != dir) {
        if (snprintf(parent, sizeof(parent), "%.*s", (int)(slash - dir), dir) >=
            (int)sizeof(parent))
            return errmsg_set(err, -ENAMETOOLONG, "job dir '%s': path too long", dir);
        r = fs_mkdirs(parent, 0700);
        if (r < 0)
            return errmsg_set(err, r, "cannot create '%s': %s", parent, uv_strerror(r));
    }
    if (mkdir(dir, 0700) == 0) {
        *made = true;
        return 0;
    }
    r = -errno;
    if (r != -EEXIST)
        return errmsg_set(err, r, "cannot create job dir '%s': %s", dir, uv_strerror(r));
    r = dir_is_empty(dir);
    if (r < 0)
        return errmsg_set(err, r, "cannot use job dir '%s': %s", dir, uv_strerror(r));
    if (r == 0) {
        return errmsg_set(err, -EEXIST,
                          "job dir '%s' is not empty (a job dir holds one job; give a new one)",
                          dir);
    }
    return 0;
}

int jobdir_create(const char *dir, const struct jobspec *spec, struct errmsg *err)
{
    char logs[PATH_MAX], key_path[PATH_MAX], spec_path[PATH_MAX];
    bool made = false, made_logs = false, made_key = false;
    struct auth_key key;
    int ret = -1;

    if (snprintf(logs, sizeof(logs), "%s/logs", dir) >= (int)sizeof(logs) ||
        snprintf(key_path, sizeof(key_path), "%s/key", dir) >= (int)sizeof(key_path) ||
        snprintf(spec_path, sizeof(spec_path), "%s/job.json", dir) >= (int)sizeof(spec_path))
        return errmsg_set(err, -ENAMETOOLONG, "job dir '%s': path too long", dir);
    ret = make_dir(dir, &made, err);
    if (ret < 0)
        return ret;
    /* mkdir's mode passes through the umask, and a directory we were given may be wider. */
    if (chmod(dir, 0700) < 0) {
        ret = errmsg_set(err, -errno, "cannot make job dir '%s' private: %s", dir,
                         uv_strerror(-errno));
        goto out;
    }
    if (mkdir(logs, 0700) < 0) {
        ret = errmsg_set(err, -errno, "cannot create '%s': %s", logs, uv_strerror(-errno));
        goto out;
    }
    made_logs = true;
    ret = auth_key_generate(&key);
    if (ret < 0) {
        errmsg_set(err, ret, "cannot generate the job key: %s", uv_strerror(ret));
        goto out;
    }
    ret = auth_key_write(key_path, &key);
    if (ret < 0) {
        errmsg_set(err, ret, "cannot write '%s': %s", key_path, uv_strerror(ret));
        goto out;
    }
    made_key = true;
    ret = jobspec_save(spec, spec_path);
    if (ret < 0) {
        errmsg_set(err, ret, "cannot write '%s': %s", spec_path, uv_strerror(ret));
        goto out;
    }
    ret = 0;
out:
    OPENSSL_cleanse(&key, sizeof(key));
    if (ret < 0) {
        if (made_key)
            unlink(key_path);
        if (made_logs)
            rmdir(logs);
        if (made)
            rmdir(dir);
    }
    return ret;
}
