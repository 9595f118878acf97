/* gpurun clean: removes from the jobs root the job dirs of jobs that have ended (with their
 * batch output), and the links whose job dir is gone; a job that may still run is kept. */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <uv.h>

#include "cmd.h"
#include "fsutil.h"
#include "path.h"
#include "slurmlib.h"
#include "view.h"
#include "banned.h"

/* What gpurun clean did, for its last line. */
struct clean_tally {
    int removed, links, kept_live, kept_recent, kept_unknown, failed;
    uint64_t bytes;
};

/* "12.3 MiB" (or KiB under a MiB) into buf. */
static const char *human_size(char *buf, size_t n, uint64_t bytes)
{
    if (bytes < 1024 * 1024)
        snprintf(buf, n, "%.1f KiB", (double)bytes / 1024.0);
    else
        snprintf(buf, n, "%.1f MiB", (double)bytes / (1024.0 * 1024.0));
    return buf;
}

/* A link in the jobs root, a --job-dir's: its dir is the user's, never removed here; a
 * dangling link is. */
static void clean_link(const struct gpurun_args *args, const char *path, struct clean_tally *t)
{
    struct stat st;

    if (stat(path, &st) == 0 || errno != ENOENT)
        return;
    if (!args->dry_run && unlink(path) < 0) {
        t->failed++;
        fprintf(stderr, "gpurun: cannot remove the link '%s': %s\n", path, uv_strerror(-errno));
        return;
    }
    t->links++;
    printf("%s the link '%s' (its job dir is gone)\n", args->dry_run ? "would remove" : "removed",
           path);
}

/* Slurm's record of the job of job dir NAME, into job where it is asked for. A Slurm job
 * without a summary may still run: only slurmctld can say it has ended (or forgotten it,
 * which it does only after the end). With a summary its batch script may still be finishing:
 * where slurmctld answers, its word decides too. Returns 1 when job was loaded (release it),
 * 0 when there is no record to go by, -EAGAIN when only Slurm could say the job has ended
 * and it did not. */
static int job_record(const char *name, bool slurm_ok, bool has_summary, struct slurmlib_job *job)
{
    struct errmsg err;
    uint32_t id;
    int r;

    if (slurmlib_parse_id(name, &id) != 0 || (!slurm_ok && has_summary))
        return 0;
    r = slurm_ok ? slurmlib_load(id, job, &err) : -EAGAIN;
    if (r < 0 && r != -ENOENT && !has_summary)
        return -EAGAIN;
    return r == 0;
}

/* Removes job dir path and its batch output ROOT/NAME.out, or with --dry-run only measures
 * them; adds what they held to *bytes. Returns 0, or fs_remove_tree's negative errno. */
static int remove_job(const struct gpurun_args *args, const char *root, const char *name,
                      const char *path, uint64_t *bytes)
{
    char file[PATH_MAX + 300];
    struct stat out;

    snprintf(file, sizeof(file), "%s/%s.out", root, name);
    if (args->dry_run) {
        fs_tree_size(path, bytes);
        if (stat(file, &out) == 0)
            *bytes += (uint64_t)out.st_size;
        return 0;
    }
    if (stat(file, &out) == 0 && unlink(file) == 0)
        *bytes += (uint64_t)out.st_size;
    return fs_remove_tree(path, bytes);
}

/* One entry of the jobs root: a dangling link goes; a job dir goes when its job has ended
 * (and longer ago than --older-than), with its batch output ROOT/NAME.out. */
static void clean_one(const struct gpurun_args *args, const char *root, const char *name,
                      bool slurm_ok, struct clean_tally *t)
{
    char path[PATH_MAX], file[PATH_MAX + 300], size[32];
    struct slurmlib_job job = {0};
    struct view_input in = {.job_id = name, .no_live = true};
    struct stat st, sum;
    bool loaded, has_summary;
    uint64_t bytes = 0;
    json_t *v;
    int r;

    if (!path_join(path, sizeof(path), root, name) || lstat(path, &st) < 0)
        return;
    if (S_ISLNK(st.st_mode)) {
        clean_link(args, path, t);
        return;
    }
    snprintf(file, sizeof(file), "%s/job.json", path);
    if (!S_ISDIR(st.st_mode) || access(file, F_OK) < 0)
        return;
    snprintf(file, sizeof(file), "%s/summary.json", path);
    has_summary = stat(file, &sum) == 0;
    r = job_record(name, slurm_ok, has_summary, &job);
    if (r == -EAGAIN) {
        t->kept_unknown++;
        return;
    }
    loaded = r == 1;
    in.slurm = loaded ? &job : NULL;
    in.job_dir = path;
    v = view_build(&in);
    if (!v || !view_ended(v)) {
        t->kept_live++;
        goto out;
    }
    if (args->older_than_days > 0 && time(NULL) - (has_summary ? sum.st_mtime : st.st_mtime) <
                                         (time_t)args->older_than_days * 86400) {
        t->kept_recent++;
        goto out;
    }
    r = remove_job(args, root, name, path, &bytes);
    if (r < 0) {
        t->failed++;
        fprintf(stderr, "gpurun: cannot remove '%s' whole: %s\n", path, uv_strerror(r));
        goto out;
    }
    t->removed++;
    t->bytes += bytes;
    printf("%s '%s' (%s, %s)\n", args->dry_run ? "would remove" : "removed", path,
           json_string_value(json_object_get(v, "state")), human_size(size, sizeof(size), bytes));
out:
    json_decref(v);
    if (loaded)
        slurmlib_job_release(&job);
}

int cmd_clean(struct gpurun_args *args, int *fatal_signal)
{
    struct clean_tally t = {0};
    struct errmsg err;
    struct dirent **ents = NULL;
    char root[PATH_MAX], conf[PATH_MAX], size[32];
    bool slurm_ok = false;
    int n, ret;

    (void)fatal_signal;
    ret = jobs_root(root, sizeof(root));
    if (ret)
        return ret;
    n = scandir(root, &ents, NULL, alphasort);
    if (n < 0 && errno == ENOENT) {
        printf("no job dirs in '%s'\n", root);
        return 0;
    }
    if (n < 0)
        return error_out(EXIT_FAILED, "cannot read '%s': %s", root, uv_strerror(-errno));
    if (slurmlib_conf_path(conf, sizeof(conf)) == 0) {
        slurm_ok = slurmlib_open(OPEN_SLURM_TIMEOUT_S, &err) == 0;
        if (!slurm_ok)
            fprintf(stderr, "gpurun: %s; Slurm jobs without a summary are kept\n", err.text);
    }
    for (int i = 0; i < n; i++) {
        if (ents[i]->d_name[0] != '.')
            clean_one(args, root, ents[i]->d_name, slurm_ok, &t);
        free(ents[i]);
    }
    free(ents);
    if (slurm_ok)
        slurmlib_close();
    printf("%s %d job dir%s and %d link%s, %s; kept %d pending or running",
           args->dry_run ? "would remove" : "removed", t.removed, t.removed == 1 ? "" : "s",
           t.links, t.links == 1 ? "" : "s", human_size(size, sizeof(size), t.bytes), t.kept_live);
    if (args->older_than_days > 0)
        printf(", %d ended %d days ago or later", t.kept_recent, args->older_than_days);
    if (t.kept_unknown)
        printf(", %d Slurm job%s whose end Slurm could not confirm", t.kept_unknown,
               t.kept_unknown == 1 ? "" : "s");
    printf("\n");
    return t.failed ? EXIT_FAILED : 0;
}
