/* gpurun status: one job's view (Slurm's record, the leader's live view, the summary; view.c
 * builds and prints it), once or every WATCH_PERIOD_MS with --watch; without a JOBID, the
 * list of the user's jobs. */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "cmd.h"
#include "monotime.h"
#include "path.h"
#include "slurmlib.h"
#include "view.h"
#include "banned.h"

/* How long status waits for the leader at each step: it answers from its event loop at once,
 * so seconds mean it is stuck or gone. */
#define STATUS_TIMEOUT_MS 5000

/* status --watch: the refresh period. */
#define WATCH_PERIOD_MS 2000

/* status without a JOBID lists this many of the most recent jobs (--all: every one). */
#define LIST_MAX 20

static int print_json(const json_t *v, size_t flags)
{
    if (json_dumpf(v, stdout, flags | JSON_PRESERVE_ORDER) < 0)
        return -EIO;
    fputc('\n', stdout);
    return 0;
}

/* The view of target t now. Slurm must be open for a Slurm job (or have failed: then the view
 * says why and shows what the job dir has). */
static json_t *target_view(const struct target *t, bool slurm_open, const char *slurm_why)
{
    struct slurmlib_job job;
    struct errmsg err;
    struct view_input in = {
        .job_id = t->id, .job_dir = t->has_dir ? t->dir : NULL, .timeout_ms = STATUS_TIMEOUT_MS};
    json_t *v;
    bool loaded = false;

    memset(&job, 0, sizeof(job));
    if (t->slurm && slurm_open) {
        int r = slurmlib_load(t->slurm, &job, &err);
        if (r == 0)
            loaded = true;
        else if (r == -ENOENT)
            in.slurm_error = "Slurm no longer knows the job (it forgets ended jobs after "
                             "MinJobAge)";
        else
            in.slurm_error = err.text;
    } else if (t->slurm) {
        in.slurm_error = slurm_why;
    }
    in.slurm = loaded ? &job : NULL;
    v = view_build(&in);
    slurmlib_job_release(&job);
    return v;
}

/* A list of jobs being made: Slurm's jobs of the user (n, as slurmlib_list gives them), the
 * views so far, and how many were shown and left out (LIST_MAX without --all). */
struct job_list {
    const struct gpurun_args *args;
    const char *root; /* the jobs root */
    struct slurmlib_job *jobs;
    size_t n;
    json_t *views;
    int shown, hidden;
};

/* A job dir of the list, by its modification time. */
struct dir_order {
    double mtime;
    int i; /* its entry in the jobs root's scandir() */
};

/* Slurm's jobs, newest first: by id, descending (Slurm forgets a job minutes after its end,
 * so these are the recent ones). */
static void list_slurm_jobs(struct job_list *l)
{
    for (size_t k = 0; k < l->n; k++) {
        size_t i = l->n - 1 - k;
        struct target t = {.slurm = l->jobs[i].id};
        struct view_input in = {.slurm = &l->jobs[i], .timeout_ms = 0};
        if (!l->args->all && l->shown >= LIST_MAX) {
            l->hidden++;
            continue;
        }
        l->shown++;
        snprintf(t.id, sizeof(t.id), "%u", l->jobs[i].id);
        in.job_id = t.id;
        in.job_dir =
            path_join(t.dir, sizeof(t.dir), l->root, t.id) && path_is_dir(t.dir) ? t.dir : NULL;
        in.no_live = true;
        json_array_append_new(l->views, view_build(&in));
    }
}

/* The job dirs among the jobs root's nents entries that Slurm's list does not hold, into
 * order; returns how many. */
static int dirs_not_in_slurm(const struct job_list *l, struct dirent **ents, int nents,
                             struct dir_order *order)
{
    int k = 0;

    for (int i = 0; i < nents; i++) {
        char path[PATH_MAX + 300];
        struct stat st;
        uint32_t id;
        bool known = false;
        snprintf(path, sizeof(path), "%s/%s/job.json", l->root, ents[i]->d_name);
        if (ents[i]->d_name[0] == '.' || stat(path, &st) < 0)
            continue;
        if (slurmlib_parse_id(ents[i]->d_name, &id) == 0)
            for (size_t j = 0; j < l->n; j++)
                known = known || l->jobs[j].id == id;
        if (known)
            continue;
        order[k].mtime = (double)st.st_mtim.tv_sec + st.st_mtim.tv_nsec / 1e9;
        order[k++].i = i;
    }
    return k;
}

/* The job dirs Slurm has forgotten (or never knew: local jobs), newest first by their
 * modification time. */
static void list_job_dirs(struct job_list *l)
{
    struct dirent **ents = NULL;
    struct dir_order *order;
    int nents = scandir(l->root, &ents, NULL, NULL), k;

    order = nents > 0 ? calloc((size_t)nents, sizeof(*order)) : NULL;
    k = order ? dirs_not_in_slurm(l, ents, nents, order) : 0;
    for (int a = 0; a < k; a++)
        for (int b = a + 1; b < k; b++)
            if (order[b].mtime > order[a].mtime) {
                struct dir_order o = order[a];
                order[a] = order[b];
                order[b] = o;
            }
    l->hidden += l->args->all || k <= LIST_MAX - l->shown ? 0 : k - (LIST_MAX - l->shown);
    for (int a = 0; a < k && (l->args->all || l->shown < LIST_MAX); a++, l->shown++) {
        struct target t;
        struct view_input in = {.timeout_ms = 0};
        memset(&t, 0, sizeof(t));
        snprintf(t.id, sizeof(t.id), "%s", ents[order[a].i]->d_name);
        if (!path_join(t.dir, sizeof(t.dir), l->root, t.id))
            continue;
        resolve_dir(&t);
        in.job_id = t.id;
        in.job_dir = t.dir;
        in.no_live = true;
        json_array_append_new(l->views, view_build(&in));
    }
    free(order);
    for (int i = 0; i < nents; i++)
        free(ents[i]);
    free(ents);
}

/* status without a JOBID: the user's gpurun jobs that Slurm knows, then the job dirs it does
 * not (ended long ago, or local jobs), newest first. */
static int status_list(const struct gpurun_args *args)
{
    struct job_list l = {.args = args};
    struct errmsg err;
    char root[PATH_MAX], conf[PATH_MAX];
    int ret;

    ret = jobs_root(root, sizeof(root));
    if (ret)
        return ret;
    l.root = root;
    l.views = json_array();
    if (slurmlib_conf_path(conf, sizeof(conf)) == 0) {
        if (slurmlib_open(OPEN_SLURM_TIMEOUT_S, &err) < 0 ||
            slurmlib_list(getuid(), &l.jobs, &l.n, &err) < 0)
            fprintf(stderr, "gpurun: %s\n", err.text);
    }
    list_slurm_jobs(&l);
    list_job_dirs(&l);
    for (size_t i = 0; i < l.n; i++)
        slurmlib_job_release(&l.jobs[i]);
    free(l.jobs);
    slurmlib_close();
    if (args->json)
        ret = print_json(l.views, JSON_INDENT(2)) < 0 ? EXIT_FAILED : 0;
    else if (json_array_size(l.views) == 0)
        printf("no gpurun jobs (Slurm's, or job dirs in '%s')\n", root);
    else
        view_print_list(stdout, l.views);
    if (l.hidden && !args->json)
        printf("(%d older job%s not shown: gpurun status --all)\n", l.hidden,
               l.hidden == 1 ? "" : "s");
    json_decref(l.views);
    return ret;
}

int cmd_status(struct gpurun_args *args, int *fatal_signal)
{
    struct errmsg err = {{0}};
    struct target t;
    bool slurm_open = false, tty = isatty(STDOUT_FILENO);
    int ret;

    (void)fatal_signal;
    if (!args->target && !args->job_dir)
        return status_list(args);
    ret = resolve_target(args, &t);
    if (ret)
        return ret;
    if (t.slurm) {
        slurm_open = slurmlib_open(OPEN_SLURM_TIMEOUT_S, &err) == 0;
        if (!slurm_open && !t.has_dir)
            return error_out(EXIT_FAILED, "%s", err.text);
    }
    for (;;) {
        json_t *v = target_view(&t, slurm_open, err.text);
        const json_t *sl = json_object_get(v, "slurm");
        bool ended;

        if (!v)
            return error_out(EXIT_FAILED, "out of memory");
        if (t.slurm && !json_is_object(sl) && !t.has_dir) {
            json_decref(v);
            return error_out(EXIT_FAILED, "no job %s: Slurm does not know it and there is no '%s'",
                             t.id, t.dir);
        }
        /* Without Slurm's record and a summary, the leader's answer is all there is: its
         * failure is the command's. */
        if (!json_is_object(sl) && json_is_null(json_object_get(v, "summary")) &&
            json_object_get(v, "live_error")) {
            ret = error_out(EXIT_FAILED, "%s", json_string_value(json_object_get(v, "live_error")));
            json_decref(v);
            return ret;
        }
        ended = view_ended(v);
        if (args->watch && tty && !args->json)
            fputs("\033[H\033[2J", stdout);
        if (args->json)
            ret = print_json(v, args->watch ? JSON_COMPACT : JSON_INDENT(2)) < 0 ? EXIT_FAILED : 0;
        else
            view_print(stdout, v);
        json_decref(v);
        fflush(stdout);
        if (!args->watch || ended || ret)
            break;
        monotime_sleep_ms(WATCH_PERIOD_MS);
        /* A job dir appears when a pending job starts. */
        if (!t.has_dir)
            t.has_dir = path_is_dir(t.dir);
    }
    slurmlib_close();
    return ret;
}
