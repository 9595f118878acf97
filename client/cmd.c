/* What gpurun's subcommands share: the one way they print an error, the jobs root, and which
 * job a status, logs or cancel command means. */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <jansson.h>

#include "cmd.h"
#include "jobdir.h"
#include "path.h"
#include "slurmlib.h"
#include "banned.h"

int error_out(int status, const char *fmt, ...)
{
    char line[2048];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    fprintf(stderr, "gpurun: %s\n", line);
    return status;
}

void job_default_name(char *buf, size_t n, char *const *argv, int argc)
{
    const char *word = argv[0], *base;

    for (int i = 0; i < argc; i++) {
        size_t len = strlen(argv[i]);
        if (len > 3 && !strcmp(argv[i] + len - 3, ".py")) {
            word = argv[i];
            break;
        }
    }
    base = strrchr(word, '/');
    snprintf(buf, n, "%s", base ? base + 1 : word);
}

int jobs_root(char *buf, size_t n)
{
    const char *env = getenv(JOBDIR_ENV);
    int r = jobdir_root(buf, n);

    if (r == -ENAMETOOLONG)
        return error_out(EXIT_FAILED, JOBDIR_ENV " '%s': path too long", env);
    if (r < 0)
        return error_out(EXIT_FAILED, "no home directory for the job dirs; set " JOBDIR_ENV
                                      " or give --job-dir");
    return 0;
}

/* The job's id from DIR/job.json, into t->id. */
static int id_from_dir(struct target *t)
{
    char path[PATH_MAX + 16];
    json_error_t je;
    json_t *spec;
    const char *id;

    snprintf(path, sizeof(path), "%s/job.json", t->dir);
    spec = json_load_file(path, 0, &je);
    id = json_string_value(json_object_get(spec, "job_id"));
    if (!id) {
        json_decref(spec);
        return error_out(EXIT_FAILED, "'%s' is not a job dir (no job.json)", t->dir);
    }
    snprintf(t->id, sizeof(t->id), "%s", id);
    json_decref(spec);
    return 0;
}

void resolve_dir(struct target *t)
{
    char real[PATH_MAX];

    if (realpath(t->dir, real))
        snprintf(t->dir, sizeof(t->dir), "%s", real);
}

int resolve_target(const struct gpurun_args *args, struct target *t)
{
    char root[PATH_MAX];
    int ret;

    memset(t, 0, sizeof(*t));
    if (args->job_dir) {
        if (path_absolute(args->job_dir, t->dir, sizeof(t->dir)) < 0)
            return error_out(EXIT_FAILED, "job dir '%s': path too long", args->job_dir);
        if (!path_is_dir(t->dir))
            return error_out(EXIT_FAILED, "no job dir '%s'", t->dir);
        ret = id_from_dir(t);
        if (ret)
            return ret;
        if (args->target && strcmp(args->target, t->id))
            return error_out(EXIT_FAILED, "job dir '%s' holds job '%s', not '%s'", t->dir, t->id,
                             args->target);
        slurmlib_parse_id(t->id, &t->slurm);
        t->has_dir = true;
        resolve_dir(t);
        return 0;
    }
    if (!args->target)
        return error_out(EXIT_FAILED, "%s: name a JOBID or --job-dir DIR (see 'gpurun %s --help')",
                         args_cmd_name(args->cmd), args_cmd_name(args->cmd));
    ret = jobs_root(root, sizeof(root));
    if (ret)
        return ret;
    snprintf(t->id, sizeof(t->id), "%s", args->target);
    if (strchr(t->id, '/') || !strcmp(t->id, ".") || !strcmp(t->id, ".."))
        return error_out(EXIT_FAILED, "'%s' is not a job id (for a directory use --job-dir)",
                         t->id);
    if (!path_join(t->dir, sizeof(t->dir), root, t->id))
        return error_out(EXIT_FAILED, "job dir of '%s': path too long", t->id);
    t->has_dir = path_is_dir(t->dir);
    if (t->has_dir)
        resolve_dir(t);
    if (slurmlib_parse_id(t->id, &t->slurm) == 0)
        return 0;
    if (!t->has_dir)
        return error_out(EXIT_FAILED, "no job '%s' (no '%s', and it is not a Slurm job id)", t->id,
                         t->dir);
    return 0;
}

int resolve_newest(const struct gpurun_args *args, struct target *t)
{
    char root[PATH_MAX], path[PATH_MAX + 300], best[256] = "";
    struct timespec newest = {0, 0};
    struct gpurun_args named;
    struct dirent *e;
    DIR *d;
    int ret;

    if (args->target || args->job_dir)
        return resolve_target(args, t);
    ret = jobs_root(root, sizeof(root));
    if (ret)
        return ret;
    /* As gpurun status lists them: the job dir whose job.json is newest. */
    d = opendir(root);
    while (d && (e = readdir(d))) {
        struct stat st;
        snprintf(path, sizeof(path), "%s/%s/job.json", root, e->d_name);
        if (e->d_name[0] == '.' || strlen(e->d_name) >= sizeof(best) || stat(path, &st) < 0)
            continue;
        if (st.st_mtim.tv_sec > newest.tv_sec ||
            (st.st_mtim.tv_sec == newest.tv_sec && st.st_mtim.tv_nsec > newest.tv_nsec)) {
            newest = st.st_mtim;
            snprintf(best, sizeof(best), "%s", e->d_name);
        }
    }
    if (d)
        closedir(d);
    if (!best[0])
        return error_out(EXIT_FAILED, "%s: no job in '%s' to show; name a JOBID or --job-dir DIR",
                         args_cmd_name(args->cmd), root);
    named = *args; /* a shallow copy, only read */
    named.target = best;
    ret = resolve_target(&named, t);
    if (ret == 0)
        fprintf(stderr, "gpurun: job %s, the newest (gpurun status lists the others)\n", t->id);
    return ret;
}

int open_slurm(void)
{
    struct errmsg err;

    if (slurmlib_open(OPEN_SLURM_TIMEOUT_S, &err) < 0)
        return error_out(EXIT_FAILED, "%s", err.text);
    return 0;
}
