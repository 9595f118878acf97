/* gpurun rerun: submits an ended Slurm job again from the batch script its job dir keeps
 * (job.sbatch, the copy the script makes of itself as it starts), read back into the job
 * descriptor it was submitted with (sbatch_parse); or, for a local job, which has no batch
 * script, says the command line that runs it again, from its job.json. */
#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* Milliseconds as the seconds an option takes: "5", "0.25". */
static void put_seconds(FILE *f, int ms)
{
    int frac = ms % 1000, digits = 3;

    fprintf(f, "%d", ms / 1000);
    if (!frac)
        return;
    for (; frac % 10 == 0; frac /= 10)
        digits--;
    fprintf(f, ".%0*d", digits, frac);
}

/* The command line of the local job spec into *line (new: free it): "cd DIR && gpurun --local
 * OPTIONS -- ARGV...", with the options whose values differ from a plain run's. */
static int local_command(const struct jobspec *spec, char **line)
{
    struct jobspec def;
    char name[256], sn[SIGNAME_LEN];
    size_t len = 0;
    FILE *f = open_memstream(line, &len);
    int argc = 0;

    if (!f)
        return -ENOMEM;
    jobspec_init(&def);
    def.hb_timeout_ms = spec->hb_interval_ms * HB_BEATS > HB_TIMEOUT_MAX
                            ? HB_TIMEOUT_MAX
                            : spec->hb_interval_ms * HB_BEATS;
    if (spec->workdir) {
        fputs("cd ", f);
        sbatch_shell_word(f, spec->workdir);
        fputs(" && ", f);
    }
    fputs("gpurun --local", f);
    for (size_t i = 0; i < sizeof(spec_options) / sizeof(spec_options[0]); i++) {
        int v = *(const int *)((const char *)spec + spec_options[i].offset);
        if (v == *(const int *)((const char *)&def + spec_options[i].offset))
            continue;
        fprintf(f, " %s ", spec_options[i].option);
        if (spec_options[i].ms)
            put_seconds(f, v);
        else
            fprintf(f, "%d", v);
    }
    if (spec->time_limit_s > 0)
        fprintf(f, " -t %d:%02d:%02d", spec->time_limit_s / 3600, spec->time_limit_s / 60 % 60,
                spec->time_limit_s % 60);
    if (spec->gpu_bind == GPU_BIND_SINGLE)
        fputs(" --gpu-bind=single", f);
    /* --signal's TIME is not in job.json: the signal comes at the default lead. */
    if (spec->preempt_all) {
        const char *s = signame(spec->preempt_signal, sn);
        fprintf(f, " --signal=%s", strncmp(s, "SIG", 3) ? s : s + 3);
    }
    for (char **e = spec->env; e && *e; e++) {
        fputs(" --export ", f);
        sbatch_shell_word(f, *e);
    }
    if (spec->metrics_dir) {
        fputs(" --metrics-dir ", f);
        sbatch_shell_word(f, spec->metrics_dir);
    }
    if (spec->output_ranks) {
        fputs(" --output-ranks ", f);
        sbatch_shell_word(f, spec->output_ranks);
    }
    while (spec->argv[argc])
        argc++;
    job_default_name(name, sizeof(name), spec->argv, argc);
    if (spec->name && strcmp(spec->name, name)) {
        fputs(" -J ", f);
        sbatch_shell_word(f, spec->name);
    }
    fputs(" --", f);
    for (char **a = spec->argv; *a; a++) {
        fputc(' ', f);
        sbatch_shell_word(f, *a);
    }
    jobspec_release(&def);
    return fclose(f) == 0 ? 0 : -ENOMEM;
}

/* A local job ran in gpurun's foreground, not from a script: refused, with the command line
 * that runs it again where its job.json holds one. */
static int rerun_local(const struct target *t)
{
    char path[PATH_MAX + 16], *line = NULL;
    struct jobspec spec;
    struct errmsg err;
    int ret;

    snprintf(path, sizeof(path), "%s/job.json", t->dir);
    jobspec_init(&spec);
    if (jobspec_load(&spec, path, &err) < 0 || !spec.argv || !spec.argv[0]) {
        ret = error_out(EXIT_FAILED,
                        "job '%s' ran with --local, so it has no batch script to submit again, "
                        "and its command cannot be known: '%s' %s",
                        t->id, path, spec.argv ? err.text : "holds none");
        goto out;
    }
    if (local_command(&spec, &line) < 0) {
        ret = error_out(EXIT_FAILED, "out of memory");
        goto out;
    }
    ret = error_out(EXIT_FAILED,
                    "job '%s' ran with --local, so it has no batch script to submit again; run "
                    "it again with: %s",
                    t->id, line);
out:
    free(line);
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
