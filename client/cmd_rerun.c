/* gpurun rerun: submits an ended Slurm job again from the batch script its job dir keeps
 * (job.sbatch, the copy the script makes of itself as it starts), read back into the job
 * descriptor it was submitted with (sbatch_parse); or, for a local job, which has no batch
 * script, runs it again in gpurun's foreground with the command line its job.json gives. */
#include <errno.h>
#include <stdarg.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <uv.h>

#include "cmd.h"
#include "follow.h"
#include "fsutil.h"
#include "jobdir.h"
#include "jobspec.h"
#include "path.h"
#include "sbatch.h"
#include "signame.h"
#include "slurmlib.h"
#include "view.h"
#include "banned.h"

/* The largest batch script read back: gpurun's are a few KiB (the job spec is the bulk). */
#define SCRIPT_MAX (4 * 1024 * 1024)

/* --- a local job: the command that runs it again ---------------------------------------------- */

/* The options whose value job.json keeps as an int, and whether it is in milliseconds
 * (written as seconds, the option's unit). Each is written when it is not its default. */
static const struct {
    const char *option;
    size_t offset; /* an int of struct jobspec */
    bool ms;
} spec_options[] = {
    {"--nodes", offsetof(struct jobspec, nnodes), false},
    {"--gpus-per-node", offsetof(struct jobspec, nprocs), false},
    {"--max-restarts", offsetof(struct jobspec, max_restarts), false},
    {"--spare-nodes", offsetof(struct jobspec, spare_nodes), false},
    {"--hang-timeout", offsetof(struct jobspec, hang_timeout_ms), true},
    {"--kill-grace", offsetof(struct jobspec, kill_grace_ms), true},
    {"--join-timeout", offsetof(struct jobspec, join_timeout_ms), true},
    {"--heartbeat", offsetof(struct jobspec, hb_interval_ms), true},
    {"--heartbeat-timeout", offsetof(struct jobspec, hb_timeout_ms), true},
};

/* The heartbeat timeout gpurun gives a job whose command line names none: ten beats, at
 * most --heartbeat-timeout's largest value (args.c). */
#define HB_BEATS       10
#define HB_TIMEOUT_MAX 3600000

/* The words of a command line being made: a NULL-terminated array of new strings. */
struct words {
    char **v;
    size_t n, cap;
    bool failed; /* out of memory: the words are incomplete */
};

static void words_add(struct words *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void words_add(struct words *w, const char *fmt, ...)
{
    va_list ap;
    char *s;

    if (w->failed)
        return;
    if (w->n + 2 > w->cap) {
        size_t cap = w->cap ? 2 * w->cap : 16;
        char **v = realloc(w->v, cap * sizeof(*v));
        if (!v) {
            w->failed = true;
            return;
        }
        w->v = v;
        w->cap = cap;
    }
    va_start(ap, fmt);
    if (vasprintf(&s, fmt, ap) < 0) {
        w->failed = true;
        s = NULL;
    }
    va_end(ap);
    w->v[w->n] = s;
    w->n += s != NULL;
    w->v[w->n] = NULL;
}

static void words_release(struct words *w)
{
    for (size_t i = 0; i < w->n; i++)
        free(w->v[i]);
    free(w->v);
    memset(w, 0, sizeof(*w));
}

/* Milliseconds as the seconds an option takes: "5", "0.25", into buf (n bytes). */
static const char *seconds_text(char *buf, size_t n, int ms)
{
    int frac = ms % 1000, digits = 3;

    if (!frac) {
        snprintf(buf, n, "%d", ms / 1000);
        return buf;
    }
    for (; frac % 10 == 0; frac /= 10)
        digits--;
    snprintf(buf, n, "%d.%0*d", ms / 1000, digits, frac);
    return buf;
}

/* The command line of the local job spec into w: "gpurun --local OPTIONS -- ARGV...", with
 * the options whose values differ from a plain run's. */
static void local_words(const struct jobspec *spec, struct words *w)
{
    struct jobspec def;
    char name[256], sn[SIGNAME_LEN], sec[32];
    int argc = 0;

    jobspec_init(&def);
    def.hb_timeout_ms = spec->hb_interval_ms * HB_BEATS > HB_TIMEOUT_MAX
                            ? HB_TIMEOUT_MAX
                            : spec->hb_interval_ms * HB_BEATS;
    words_add(w, "gpurun");
    words_add(w, "--local");
    for (size_t i = 0; i < sizeof(spec_options) / sizeof(spec_options[0]); i++) {
        int v = *(const int *)((const char *)spec + spec_options[i].offset);
        if (v == *(const int *)((const char *)&def + spec_options[i].offset))
            continue;
        words_add(w, "%s", spec_options[i].option);
        if (spec_options[i].ms)
            words_add(w, "%s", seconds_text(sec, sizeof(sec), v));
        else
            words_add(w, "%d", v);
    }
    if (spec->time_limit_s > 0) {
        words_add(w, "-t");
        words_add(w, "%d:%02d:%02d", spec->time_limit_s / 3600, spec->time_limit_s / 60 % 60,
                  spec->time_limit_s % 60);
    }
    if (spec->gpu_bind == GPU_BIND_SINGLE)
        words_add(w, "--gpu-bind=single");
    /* --signal's TIME is not in job.json: the signal comes at the default lead. */
    if (spec->preempt_all) {
        const char *s = signame(spec->preempt_signal, sn);
        words_add(w, "--signal=%s", strncmp(s, "SIG", 3) ? s : s + 3);
    }
    for (char **e = spec->env; e && *e; e++) {
        words_add(w, "--export");
        words_add(w, "%s", *e);
    }
    if (spec->metrics_dir) {
        words_add(w, "--metrics-dir");
        words_add(w, "%s", spec->metrics_dir);
    }
    if (spec->output_ranks) {
        words_add(w, "--output-ranks");
        words_add(w, "%s", spec->output_ranks);
    }
    if (spec->local_rank_arg)
        words_add(w, "--local-rank-arg=%s", local_rank_arg_name(spec->local_rank_arg) + 2);
    if (spec->mpi_env)
        words_add(w, "--mpi-env");
    if (spec->require_rendezvous)
        words_add(w, "--require-rendezvous");
    if (spec->horovod)
        words_add(w, "--horovod");
    static const struct {
        const char *option;
        size_t offset;
    } containers[] = {
        {"--container-image", offsetof(struct jobspec, container_image)},
        {"--container-mounts", offsetof(struct jobspec, container_mounts)},
        {"--container-workdir", offsetof(struct jobspec, container_workdir)},
        {"--container-env", offsetof(struct jobspec, container_env)},
        {"--container-runtime", offsetof(struct jobspec, container_runtime)},
    };
    for (size_t i = 0; i < sizeof(containers) / sizeof(containers[0]); i++) {
        const char *v = *(char *const *)((const char *)spec + containers[i].offset);
        if (v) {
            words_add(w, "%s", containers[i].option);
            words_add(w, "%s", v);
        }
    }
    while (spec->argv[argc])
        argc++;
    job_default_name(name, sizeof(name), spec->argv, argc);
    if (spec->name && strcmp(spec->name, name)) {
        words_add(w, "-J");
        words_add(w, "%s", spec->name);
    }
    words_add(w, "--");
    for (char **a = spec->argv; *a; a++)
        words_add(w, "%s", *a);
    jobspec_release(&def);
}

/* The words as a shell would need them, after "cd DIR && " where dir is not NULL, into
 * *line (new: free it). */
static int words_line(const struct words *w, const char *dir, char **line)
{
    size_t len = 0;
    FILE *f = open_memstream(line, &len);

    if (!f)
        return -ENOMEM;
    if (dir) {
        fputs("cd ", f);
        sbatch_shell_word(f, dir);
        fputs(" && ", f);
    }
    for (size_t i = 0; i < w->n; i++) {
        if (i)
            fputc(' ', f);
        /* The options and "gpurun" need no quotes; the values may. */
        sbatch_shell_word(f, w->v[i]);
    }
    return fclose(f) == 0 ? 0 : -ENOMEM;
}

/* A local job ran in gpurun's foreground, not from a script: it runs again the same way,
 * this gpurun exec'd with the command line job.json gives, in the job's working directory;
 * the line says which. Returns only on failure. */
static int rerun_local(const struct target *t)
{
    char path[PATH_MAX + 16], *line = NULL;
    struct words w = {0};
    struct jobspec spec;
    struct errmsg err;
    int ret;

    snprintf(path, sizeof(path), "%s/job.json", t->dir);
    jobspec_init(&spec);
    if (jobspec_load(&spec, path, &err) < 0 || !spec.argv || !spec.argv[0]) {
        ret = error_out(EXIT_FAILED,
                        "job '%s' ran with --local and its command cannot be known: '%s' %s", t->id,
                        path, spec.argv ? err.text : "holds none");
        goto out;
    }
    if (view_local_leader_alive(t->dir)) {
        ret = error_out(EXIT_FAILED,
                        "job '%s' is running: only a job that has ended runs again (gpurun cancel "
                        "%s first, or wait for its end)",
                        t->id, t->id);
        goto out;
    }
    local_words(&spec, &w);
    if (w.failed || words_line(&w, spec.workdir, &line) < 0) {
        ret = error_out(EXIT_FAILED, "out of memory");
        goto out;
    }
    if (spec.workdir && chdir(spec.workdir) < 0) {
        ret = error_out(EXIT_FAILED, "job '%s' cannot run again: its working directory '%s': %s",
                        t->id, spec.workdir, uv_strerror(-errno));
        goto out;
    }
    fprintf(stderr, "gpurun: running local job '%s' again: %s\n", t->id, line);
    fflush(stderr);
    execv("/proc/self/exe", w.v);
    ret = error_out(EXIT_FAILED, "cannot run gpurun again ('/proc/self/exe'): %s; run: %s",
                    uv_strerror(-errno), line);
out:
    free(line);
    words_release(&w);
    jobspec_release(&spec);
    return ret;
}

/* --- a Slurm job: its batch script again ------------------------------------------------------ */

/* Refuses a job that has not ended: its script would run twice at once, both in job dirs
 * named by their ids but with the same checkpoints. A job Slurm has forgotten has ended. */
static int check_ended(const struct target *t)
{
    struct slurmlib_job job;
    struct errmsg err;
    int r = slurmlib_load(t->slurm, &job, &err), ret = 0;

    if (r == -ENOENT)
        return 0;
    if (r < 0)
        return error_out(EXIT_FAILED, "%s", err.text);
    if (!job.ended)
        ret = error_out(EXIT_FAILED,
                        "job %u is %s%s: only a job that has ended is submitted again (gpurun "
                        "cancel %u first, or wait for its end: gpurun status %u --watch)",
                        t->slurm, slurmlib_state_name(job.state),
                        job.completing ? " (completing)" : "", t->slurm, t->slurm);
    slurmlib_job_release(&job);
    return ret;
}

/* The job's saved batch script (new: free it) at path (PATH_MAX bytes). */
static int read_script(const struct target *t, char *path, char **script)
{
    size_t len;
    int r;

    if (!t->has_dir)
        return error_out(EXIT_FAILED,
                         "job %u has no job dir '%s': its batch script never ran (or the dir "
                         "was removed), so there is no job.sbatch to submit again",
                         t->slurm, t->dir);
    if (!path_join(path, PATH_MAX, t->dir, "job.sbatch"))
        return error_out(EXIT_FAILED, "job dir '%s': path too long", t->dir);
    r = fs_read_all(path, SCRIPT_MAX, script, &len);
    if (r == -ENOENT)
        return error_out(EXIT_FAILED,
                         "job %u's dir '%s' has no job.sbatch: it was not started by a gpurun "
                         "batch script, so there is none to submit again",
                         t->slurm, t->dir);
    if (r < 0)
        return error_out(EXIT_FAILED, "cannot read '%s': %s", path, uv_strerror(r));
    return 0;
}

/* Where the new job's dir will be: the script's fixed one, else the jobs root's, as
 * gpurun --wait looks for it. */
static void new_job_dir(const struct sbatch_job *job, uint32_t id, char *dir, size_t n)
{
    char root[PATH_MAX], num[16];

    snprintf(num, sizeof(num), "%u", id);
    if (job->job_dir)
        snprintf(dir, n, "%s", job->job_dir);
    else if (jobdir_root(root, sizeof(root)) < 0 || !path_join(dir, n, root, num))
        dir[0] = '\0';
}

int cmd_rerun(struct gpurun_args *args, int *fatal_signal)
{
    char path[PATH_MAX], dir[PATH_MAX], *script = NULL, *text = NULL;
    struct sbatch_job job;
    struct target t;
    struct errmsg err;
    uint32_t id;
    int ret;

    ret = resolve_target(args, &t);
    if (ret)
        return ret;
    if (!t.slurm)
        return rerun_local(&t);
    ret = open_slurm();
    if (ret == 0)
        ret = check_ended(&t);
    if (ret == 0)
        ret = read_script(&t, path, &script);
    if (ret)
        goto out;
    /* sbatch_parse cuts the values out of its copy; Slurm gets the script as it was. */
    if (!(text = strdup(script))) {
        ret = error_out(EXIT_FAILED, "out of memory");
        goto out;
    }
    if (sbatch_parse(text, &job, &err) < 0) {
        ret = error_out(EXIT_FAILED, "'%s': %s (submit it yourself: sbatch '%s')", path, err.text,
                        path);
        goto out;
    }
    /* A relative --begin ("now+1hour") counts from now, as sbatch would read it. */
    if (job.begin && slurmlib_parse_begin(job.begin, &job.begin_time, &err) < 0) {
        ret = error_out(EXIT_FAILED, "%s", err.text);
        goto out;
    }
    if (slurmlib_check(&job, script, &err) < 0 || slurmlib_submit(&job, script, &id, &err) < 0) {
        ret = error_out(EXIT_FAILED, "%s; nothing submitted", err.text);
        goto out;
    }
    printf("Submitted job %u\n", id);
    fflush(stdout);
    if (args->wait) {
        new_job_dir(&job, id, dir, sizeof(dir));
        ret = follow_job(id, dir[0] ? dir : NULL, fatal_signal);
    }
out:
    slurmlib_close();
    free(text);
    free(script);
    return ret;
}
