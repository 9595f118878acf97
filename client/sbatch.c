/* Rendering the batch script. The script is for people as much as for Slurm: directives
 * first, a header that says what runs, then a short body that passes shellcheck. It makes
 * the job dir itself, at run time, because only then is the job id known; so the same text
 * works from gpurun and from a hand-run sbatch, and the key never travels through slurmctld
 * (which keeps a copy of every script). */
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "sbatch.h"
#include "signame.h"
#include "banned.h"

/* The pre-timeout signal's lead on the limit: two minutes give a training step time to
 * finish and a checkpoint time to be written. */
#define SIGNAL_BEFORE_S 120

/* Below this limit (minutes) the lead is a quarter of the limit instead. */
#define SIGNAL_SHORT_MIN 8

/* How the job.json text marks the job id the script fills in. */
#define EMPTY_JOB_ID "\"job_id\": \"\""

static int fail(struct sbatch_error *err, int ret, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int fail(struct sbatch_error *err, int ret, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(err->text, sizeof(err->text), fmt, ap);
    va_end(ap);
    return ret;
}

long sbatch_time_minutes(long seconds)
{
    return seconds <= 0 ? 0 : (seconds + 59) / 60;
}

int sbatch_signal_before(long time_limit_min)
{
    if (time_limit_min <= 0 || time_limit_min >= SIGNAL_SHORT_MIN)
        return SIGNAL_BEFORE_S;
    return (int)(time_limit_min * 60 / 4);
}

void sbatch_format_time(char *buf, size_t n, long minutes)
{
    long d = minutes / 1440, h = minutes / 60 % 24, m = minutes % 60;

    if (d)
        snprintf(buf, n, "%ld-%02ld:%02ld:00", d, h, m);
    else
        snprintf(buf, n, "%ld:%02ld:00", h, m);
}

/* sbatch reads a directive's value up to the first blank unless it is in double quotes, and
 * has no escapes: a value with a quote or a control character cannot be written. */
static int directive(FILE *f, const char *name, const char *value, struct sbatch_error *err)
{
    bool blank = false;

    for (const unsigned char *p = (const unsigned char *)value; *p; p++) {
        if (*p == '"' || *p < 0x20 || *p == 0x7f)
            return fail(err, -EINVAL, "--%s: '%s' cannot be written as an #SBATCH directive", name,
                        value);
        blank = blank || *p == ' ';
    }
    fprintf(f, blank ? "#SBATCH --%s=\"%s\"\n" : "#SBATCH --%s=%s\n", name, value);
    return 0;
}

static int directive_int(FILE *f, const char *name, long value, struct sbatch_error *err)
{
    char buf[32];

    snprintf(buf, sizeof(buf), "%ld", value);
    return directive(f, name, buf, err);
}

/* s as one shell word: in single quotes, each ' written as '\''. A plain word stays bare. */
static void shell_word(FILE *f, const char *s)
{
    bool plain = *s != '\0';

    for (const char *p = s; *p && plain; p++)
        plain = strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/._-+=:,@%",
                       *p) != NULL;
    if (plain) {
        fputs(s, f);
        return;
    }
    fputc('\'', f);
    for (const char *p = s; *p; p++) {
        if (*p == '\'')
            fputs("'\\''", f);
        else
            fputc(*p, f);
    }
    fputc('\'', f);
}

/* The command for the header comment: one line, words quoted as a shell would need, control
 * characters (a newline would end the comment) as '?'. */
static void comment_command(FILE *f, char *const *argv)
{
    char *line = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&line, &len);

    if (!m)
        return;
    for (char *const *a = argv; a && *a; a++) {
        if (a != argv)
            fputc(' ', m);
        shell_word(m, *a);
    }
    fclose(m);
    for (char *p = line; p && *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            *p = '?';
    fprintf(f, "#   %s\n", line ? line : "");
    free(line);
}

static int directives(FILE *f, const struct sbatch_job *j, struct sbatch_error *err)
{
    char buf[64];
    int r = 0;

    r = r ? r : directive(f, "job-name", j->job_name, err);
    r = r ? r : directive_int(f, "nodes", j->nodes, err);
    r = r ? r : directive_int(f, "ntasks-per-node", 1, err);
    r = r ? r : directive_int(f, "cpus-per-task", j->cpus_per_task, err);
    if (j->gpus_per_node > 0)
        r = r ? r : directive_int(f, "gpus-per-node", j->gpus_per_node, err);
    if (j->time_limit_min > 0) {
        sbatch_format_time(buf, sizeof(buf), j->time_limit_min);
        r = r ? r : directive(f, "time", buf, err);
    }
    if (j->partition)
        r = r ? r : directive(f, "partition", j->partition, err);
    if (j->account)
        r = r ? r : directive(f, "account", j->account, err);
    r = r ? r : directive(f, "output", j->output, err);
    r = r ? r : directive(f, "chdir", j->work_dir, err);
    if (j->signal_text) {
        r = r ? r : directive(f, "signal", j->signal_text, err);
    } else if (j->signal_before_s > 0) {
        snprintf(buf, sizeof(buf), "B:USR1@%d", j->signal_before_s);
        r = r ? r : directive(f, "signal", buf, err);
    }
    if (r == 0)
        fprintf(f, "#SBATCH --no-requeue\n");
    r = r ? r : directive(f, "comment", SBATCH_COMMENT, err);
    return r;
}

static void body(FILE *f, const struct sbatch_job *j)
{
    int psig = j->preempt_signal > 0 ? j->preempt_signal : SIGUSR1;
    char sn[SIGNAME_LEN];
    /* trap takes a name ("USR1"); a signal without one (a real-time signal) goes by number. */
    const char *tname = signame(psig, sn);

    if (!strncmp(tname, "SIG", 3))
        tname += 3;
    else
        snprintf(sn, sizeof(sn), "%d", psig);

    fprintf(f,
            "#\n# A gpurun %s job: one rendezvousd per node (node 0's also runs the leader),\n"
            "# each starting %d rank%s of:\n",
            GPURUN_VERSION, j->ranks_per_node, j->ranks_per_node == 1 ? "" : "s");
    comment_command(f, j->argv);
    fprintf(f,
            "# The job dir, %s, is made below with a fresh key. Submit this\n"
            "# file with sbatch, edited or not; the environment may override the paths.\n"
            "set -euo pipefail\n\n"
            ": \"${SLURM_JOB_ID:?this is a batch script: submit it with sbatch}\"\n"
            "rendezvousd=${GPURUN_RENDEZVOUSD:-",
            j->job_dir ? "given by --job-dir" : "$GPURUN_JOBS/<job id>");
    shell_word(f, j->rendezvousd);
    fprintf(f, "}\n");
    if (j->job_dir) {
        fprintf(f, "dir=");
        shell_word(f, j->job_dir);
        fprintf(f, "\n");
    } else {
        fprintf(f, "jobs=${GPURUN_JOBS:-");
        shell_word(f, j->jobs_root);
        fprintf(f, "}\ndir=$jobs/$SLURM_JOB_ID\n");
    }
    fprintf(f, "\numask 077\nmkdir -p \"$(dirname \"$dir\")\"\n"
               "# Slurm's job ids start again from 1 when its state is reset: a dir an earlier\n"
               "# job left under the same name is kept aside, not reused.\n"
               "if [ -e \"$dir\" ] && ! rmdir \"$dir\" 2>/dev/null; then\n"
               "    mv \"$dir\" \"$dir.$(date +%%Y%%m%%d-%%H%%M%%S)\"\n"
               "fi\n"
               "mkdir \"$dir\" \"$dir/logs\"\n"
               "od -An -vtx1 -N32 /dev/urandom | tr -d ' \\n' >\"$dir/key\"\n"
               "sed 's/" EMPTY_JOB_ID "/\"job_id\": \"'\"$SLURM_JOB_ID\"'\"/' "
               ">\"$dir/job.json\" <<'GPURUN_JOB_JSON'\n");
    fputs(j->spec_json, f);
    if (j->spec_json[0] && j->spec_json[strlen(j->spec_json) - 1] != '\n')
        fputc('\n', f);
    fprintf(
        f,
        "GPURUN_JOB_JSON\n"
        "cp \"$0\" \"$dir/job.sbatch\"\n\n"
        "# One rendezvousd per node with all the node's CPUs for its ranks (srun 22.05 no\n"
        "# longer takes --cpus-per-task from the job). scancel's SIGTERM reaches this shell\n"
        "# and srun passes it on. The pre-timeout signal (--signal=B:...) goes to the\n"
        "# leader on this host through the job dir, not through srun: srun would signal\n"
        "# every process of the step, and it must reach only the ranks that asked for it.\n"
        "srun --ntasks-per-node=1 --cpus-per-task=\"${SLURM_CPUS_PER_TASK:-%d}\" "
        "--kill-on-bad-exit=0 \\\n"
        "    \"$rendezvousd\" --job-dir \"$dir\" --log-level %s &\n"
        "srun_pid=$!\n"
        "trap 'echo %d >\"$dir/preempt.new\" && mv -f \"$dir/preempt.new\" \"$dir/preempt\"' %s\n"
        "trap 'kill -TERM \"$srun_pid\" 2>/dev/null || true' TERM INT HUP\n"
        "status=0\n"
        "wait \"$srun_pid\" || status=$?\n"
        "# A trapped signal ends the wait early (128+N) while srun still runs: wait again.\n"
        "while [ \"$status\" -gt 128 ] && kill -0 \"$srun_pid\" 2>/dev/null; do\n"
        "    status=0\n"
        "    wait \"$srun_pid\" || status=$?\n"
        "done\n"
        "# The job's own record decides the exit status, so that Slurm's agrees with\n"
        "# summary.json; without one (the leader was lost) srun's 128+N of a killed daemon\n"
        "# would read as a rank's signal: it is gpurun's failure, 125.\n"
        "summary=$(sed -n 's/^  \"exit_status\": \\([0-9]*\\).*/\\1/p' \"$dir/summary.json\" "
        "2>/dev/null || true)\n"
        "if [ -n \"$summary\" ]; then\n"
        "    status=$summary\n"
        "elif [ \"$status\" != 0 ]; then\n"
        "    status=125\n"
        "fi\n"
        "exit \"$status\"\n",
        j->cpus_per_task, j->log_level, psig, tname);
}

int sbatch_render(const struct sbatch_job *job, char **out, struct sbatch_error *err)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f;
    int ret;

    *out = NULL;
    if (!strstr(job->spec_json, EMPTY_JOB_ID))
        return fail(err, -EINVAL, "the job spec lacks an empty job_id");
    if (strstr(job->spec_json, "\nGPURUN_JOB_JSON\n"))
        return fail(err, -EINVAL, "the job spec holds the script's heredoc delimiter");
    f = open_memstream(&text, &len);
    if (!f)
        return fail(err, -ENOMEM, "out of memory");
    fprintf(f, "#!/bin/bash\n");
    ret = directives(f, job, err);
    if (ret == 0)
        body(f, job);
    if (fclose(f) != 0 && ret == 0)
        ret = fail(err, -ENOMEM, "out of memory");
    if (ret < 0) {
        free(text);
        return ret;
    }
    *out = text;
    return 0;
}
