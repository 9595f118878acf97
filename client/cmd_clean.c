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

/* One entry of the jobs root: a dangling link goes; a job dir goes when its job has ended
 * (and longer ago than --older-than), with its batch output ROOT/NAME.out. */
static void clean_one(const struct gpurun_args *args, const char *root, const char *name,
                      bool slurm_ok, struct clean_tally *t)
{
    char path[PATH_MAX], file[PATH_MAX + 300], size[32];
    struct slurmlib_job job = {0};
    struct slurmlib_error err;
    struct stat st, sum;
    bool loaded = false, has_summary, ended;
    uint64_t bytes = 0;
    uint32_t id;
    json_t *v;
    int r;

    if (!path_join(path, sizeof(path), root, name) || lstat(path, &st) < 0)
        return;
    if (S_ISLNK(st.st_mode)) {
        /* A --job-dir's link: its dir is the user's, never removed here; a dangling link is. */
        if (stat(path, &st) < 0 && errno == ENOENT) {
            if (!args->dry_run && unlink(path) < 0) {
                t->failed++;
                fprintf(stderr, "gpurun: cannot remove the link '%s': %s\n", path,
                        uv_strerror(-errno));
                return;
            }
            t->links++;
            printf("%s the link '%s' (its job dir is gone)\n",
                   args->dry_run ? "would remove" : "removed", path);
        }
        return;
    }
    snprintf(file, sizeof(file), "%s/job.json", path);
    if (!S_ISDIR(st.st_mode) || access(file, F_OK) < 0)
        return;
    snprintf(file, sizeof(file), "%s/summary.json", path);
    has_summary = stat(file, &sum) == 0;
    /* A Slurm job without a summary may still run: only slurmctld can say it has ended (or
     * forgotten it, which it does only after the end). With a summary its batch script may
     * still be finishing: where slurmctld answers, its word decides too. */
    if (slurmlib_parse_id(name, &id) == 0 && (slurm_ok || !has_summary)) {
        r = slurm_ok ? slurmlib_load(id, &job, &err) : -EAGAIN;
        if (r < 0 && r != -ENOENT && !has_summary) {
            t->kept_unknown++;
            return;
        }
        loaded = r == 0;
    }
    {
        struct view_input in = {
            .job_id = name, .slurm = loaded ? &job : NULL, .job_dir = path, .no_live = true};
        v = view_build(&in);
    }
    ended = v && view_ended(v);
    if (!ended) {
        t->kept_live++;
        goto out;
    }
    if (args->older_than_days > 0 && time(NULL) - (has_summary ? sum.st_mtime : st.st_mtime) <
                                         (time_t)args->older_than_days * 86400) {
        t->kept_recent++;
        goto out;
    }
    snprintf(file, sizeof(file), "%s/%s.out", root, name);
    if (args->dry_run) {
        struct stat out;
        fs_tree_size(path, &bytes);
        if (stat(file, &out) == 0)
            bytes += (uint64_t)out.st_size;
    } else {
        struct stat out;
        if (stat(file, &out) == 0 && unlink(file) == 0)
            bytes += (uint64_t)out.st_size;
        r = fs_remove_tree(path, &bytes);
        if (r < 0) {
            t->failed++;
            fprintf(stderr, "gpurun: cannot remove '%s' whole: %s\n", path, uv_strerror(r));
            goto out;
        }
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
    struct slurmlib_error err;
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
        slurm_ok = slurmlib_open(SLURM_OPEN_TIMEOUT_S, &err) == 0;
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
