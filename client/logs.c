/* Printing rank logs. Lines are copied as read, whatever their length, so that a log full of
 * progress bars or binary junk comes out as it went in. */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <uv.h>

#include "logs.h"
#include "banned.h"

static int fail(struct logs_error *err, int ret, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Fills err and returns ret. */
static int fail(struct logs_error *err, int ret, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(err->text, sizeof(err->text), fmt, ap);
    va_end(ap);
    return ret;
}

/* The rank of a file named "rank-N.log", or -1 for any other name. */
static int log_rank(const char *name)
{
    long r = 0;
    const char *p = name + 5;

    if (strncmp(name, "rank-", 5) || *p < '0' || *p > '9' || (*p == '0' && p[1] != '.'))
        return -1;
    for (; *p >= '0' && *p <= '9'; p++) {
        r = r * 10 + (*p - '0');
        if (r > INT_MAX)
            return -1;
    }
    return strcmp(p, ".log") ? -1 : (int)r;
}

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* Copies path to out, each line prefixed with prefix (NULL: none). */
static int copy_log(FILE *out, const char *path, const char *prefix, struct logs_error *err)
{
    FILE *in = fopen(path, "re");
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    int ret = 0;

    if (!in)
        return fail(err, -errno, "cannot open '%s': %s", path, uv_strerror(-errno));
    while ((n = getline(&line, &cap, in)) > 0) {
        if (prefix)
            fputs(prefix, out);
        fwrite(line, 1, (size_t)n, out);
        if (prefix && line[n - 1] != '\n')
            fputc('\n', out);
    }
    if (ferror(in))
        ret = fail(err, -EIO, "cannot read '%s': %s", path, uv_strerror(-EIO));
    free(line);
    fclose(in);
    return ret;
}

int logs_print(FILE *out, const char *job_dir, int rank, struct logs_error *err)
{
    char dir[PATH_MAX], path[PATH_MAX + 32], prefix[32];
    int *ranks = NULL, nranks = 0, cap = 0, ret = -1;
    DIR *d = NULL;
    struct dirent *e;

    if (snprintf(dir, sizeof(dir), "%s/logs", job_dir) >= (int)sizeof(dir))
        return fail(err, -ENAMETOOLONG, "job dir '%s': path too long", job_dir);
    if (rank >= 0) {
        snprintf(path, sizeof(path), "%s/rank-%d.log", dir, rank);
        ret = copy_log(out, path, NULL, err);
        if (ret == -ENOENT)
            fail(err, ret, "no log of rank %d in '%s'", rank, dir);
        return ret;
    }
    d = opendir(dir);
    if (!d) {
        ret = fail(err, -errno, "cannot open '%s': %s", dir, uv_strerror(-errno));
        goto out;
    }
    while ((e = readdir(d))) {
        int r = log_rank(e->d_name);
        if (r < 0)
            continue;
        if (nranks == cap) {
            int *nr = realloc(ranks, (size_t)(cap ? cap * 2 : 64) * sizeof(*nr));
            if (!nr) {
                ret = fail(err, -ENOMEM, "out of memory");
                goto out;
            }
            ranks = nr;
            cap = cap ? cap * 2 : 64;
        }
        ranks[nranks++] = r;
    }
    if (nranks == 0) {
        ret = fail(err, -ENOENT, "no rank logs in '%s' yet", dir);
        goto out;
    }
    qsort(ranks, (size_t)nranks, sizeof(*ranks), cmp_int);
    for (int i = 0; i < nranks; i++) {
        snprintf(path, sizeof(path), "%s/rank-%d.log", dir, ranks[i]);
        snprintf(prefix, sizeof(prefix), "[%d] ", ranks[i]);
        ret = copy_log(out, path, prefix, err);
        if (ret < 0)
            goto out;
    }
    ret = 0;
out:
    free(ranks);
    if (d)
        closedir(d);
    return ret;
}
