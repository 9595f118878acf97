/* Rendering the batch script. The script is for people as much as for Slurm: directives
 * first, a header that says what runs, then a short body that passes shellcheck. It makes
 * the job dir itself, at run time, because only then is the job id known; so the same text
 * works from gpurun and from a hand-run sbatch, and the key never travels through slurmctld
 * (which keeps a copy of every script). */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "sbatch.h"
#include "slurmopt.h"
#include "version.h"
#include "signame.h"
#include "banned.h"

/* The pre-timeout signal's lead on the limit: two minutes give a training step time to
 * finish and a checkpoint time to be written. */
#define SIGNAL_BEFORE_S 120

/* Below this limit (minutes) the lead is a quarter of the limit instead. */
#define SIGNAL_SHORT_MIN 8

/* How the job.json text marks the job id the script fills in. */
#define EMPTY_JOB_ID "\"job_id\": \"\""

const char *sbatch_comment(const char *user, char *buf, size_t n)
{
    if (user)
        snprintf(buf, n, "%s: %s", SBATCH_COMMENT, user);
    else
        snprintf(buf, n, "%s", SBATCH_COMMENT);
    return buf;
}

bool sbatch_is_gpurun_comment(const char *comment)
{
    size_t n = strlen(SBATCH_COMMENT);

    return comment && !strncmp(comment, SBATCH_COMMENT, n) &&
           (comment[n] == '\0' || (comment[n] == ':' && comment[n + 1] == ' '));
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
static int directive(FILE *f, const char *name, const char *value, struct errmsg *err)
{
    bool blank = false;

    for (const unsigned char *p = (const unsigned char *)value; *p; p++) {
        if (*p == '"' || *p < 0x20 || *p == 0x7f)
            return errmsg_set(err, -EINVAL, "--%s: '%s' cannot be written as an #SBATCH directive",
                              name, value);
        blank = blank || *p == ' ';
    }
    fprintf(f, blank ? "#SBATCH --%s=\"%s\"\n" : "#SBATCH --%s=%s\n", name, value);
    return 0;
}

static int directive_int(FILE *f, const char *name, long value, struct errmsg *err)
{
    char buf[32];

    snprintf(buf, sizeof(buf), "%ld", value);
    return directive(f, name, buf, err);
}

void sbatch_shell_word(FILE *f, const char *s)
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
        sbatch_shell_word(m, *a);
    }
    fclose(m);
    for (char *p = line; p && *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            *p = '?';
    fprintf(f, "#   %s\n", line ? line : "");
    free(line);
}

/* The directive names of --mem, --mem-per-cpu and --mem-per-gpu, by enum slurmopt_mem_per. */
static const char *const mem_directives[] = {
    [SLURMOPT_MEM_NODE] = "mem",
    [SLURMOPT_MEM_CPU] = "mem-per-cpu",
    [SLURMOPT_MEM_GPU] = "mem-per-gpu",
};

/* --exclusive's forms, by enum slurmopt_exclusive. */
static const char *const exclusive_directives[] = {
    [SLURMOPT_EXCLUSIVE] = "#SBATCH --exclusive\n",
    [SLURMOPT_EXCLUSIVE_USER] = "#SBATCH --exclusive=user\n",
    [SLURMOPT_EXCLUSIVE_MCS] = "#SBATCH --exclusive=mcs\n",
};

/* An optional string directive: a row per field of struct sbatch_job. */
static const struct {
    const char *name;
    size_t offset;
} string_directives[] = {
    {"qos", offsetof(struct sbatch_job, qos)},
    {"constraint", offsetof(struct sbatch_job, constraint)},
    {"nodelist", offsetof(struct sbatch_job, nodelist)},
    {"exclude", offsetof(struct sbatch_job, exclude)},
    {"reservation", offsetof(struct sbatch_job, reservation)},
    {"gres", offsetof(struct sbatch_job, gres)},
    {"dependency", offsetof(struct sbatch_job, dependency)},
    {"begin", offsetof(struct sbatch_job, begin)},
};

/* Where a job may run and when: sbatch's scheduling options, each when given. */
static int scheduling_directives(FILE *f, const struct sbatch_job *j, struct errmsg *err)
{
    char buf[32];
    int r = 0;

    if (j->mem_per != SLURMOPT_MEM_NONE) {
        slurmopt_format_mem(buf, sizeof(buf), j->mem_mb);
        r = directive(f, mem_directives[j->mem_per], buf, err);
    }
    if (r == 0 && j->exclusive != SLURMOPT_SHARED_DEFAULT)
        fputs(exclusive_directives[j->exclusive], f);
    for (size_t i = 0; r == 0 && i < sizeof(string_directives) / sizeof(string_directives[0]);
         i++) {
        const char *v = *(const char *const *)((const char *)j + string_directives[i].offset);
        if (v)
            r = directive(f, string_directives[i].name, v, err);
    }
    if (r == 0 && j->hold)
        fputs("#SBATCH --hold\n", f);
    return r;
}

static int directives(FILE *f, const struct sbatch_job *j, struct errmsg *err)
{
    char buf[SBATCH_COMMENT_LEN_MAX + 16];
    int r = 0;

    r = r ? r : directive(f, "job-name", j->job_name, err);
    r = r ? r : directive_int(f, "nodes", j->nodes, err);
    r = r ? r : directive_int(f, "ntasks-per-node", 1, err);
    r = r ? r : directive_int(f, "cpus-per-task", j->cpus_per_task, err);
    if (j->gpus_per_node > 0 && j->gpu_type) {
        snprintf(buf, sizeof(buf), "%.*s:%d", SLURMOPT_GPU_TYPE_MAX, j->gpu_type, j->gpus_per_node);
        r = r ? r : directive(f, "gpus-per-node", buf, err);
    } else if (j->gpus_per_node > 0) {
        r = r ? r : directive_int(f, "gpus-per-node", j->gpus_per_node, err);
    }
    if (j->time_limit_min > 0) {
        sbatch_format_time(buf, sizeof(buf), j->time_limit_min);
        r = r ? r : directive(f, "time", buf, err);
    } else if (j->time_limit_min == SBATCH_TIME_UNLIMITED) {
        r = r ? r : directive(f, "time", "UNLIMITED", err);
    }
    if (j->partition)
        r = r ? r : directive(f, "partition", j->partition, err);
    if (j->account)
        r = r ? r : directive(f, "account", j->account, err);
    r = r ? r : scheduling_directives(f, j, err);
    r = r ? r : directive(f, "output", j->output, err);
    r = r ? r : directive(f, "chdir", j->work_dir, err);
    if (j->signal_text) {
        r = r ? r : directive(f, "signal", j->signal_text, err);
    } else if (j->signal_before_s > 0) {
        snprintf(buf, sizeof(buf), "B:USR1@%d", j->signal_before_s);
        r = r ? r : directive(f, "signal", buf, err);
    }
    /* A requeued job's output goes on in the same file. */
    if (r == 0)
        fprintf(f, "#SBATCH --%s\n",
                j->requeue ? "requeue\n#SBATCH --open-mode=append" : "no-requeue");
    /* With hot spares a node's failure is the leader's to handle: Slurm keeps the job and
     * its step running on the other nodes. */
    if (r == 0 && j->no_kill)
        fprintf(f, "#SBATCH --no-kill\n");
    r = r ? r : directive(f, "comment", sbatch_comment(j->comment, buf, sizeof(buf)), err);
    if (j->mail_type)
        r = r ? r : directive(f, "mail-type", j->mail_type_text, err);
    if (j->mail_user)
        r = r ? r : directive(f, "mail-user", j->mail_user, err);
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
    if (j->container_image)
        fprintf(f,
                "# in the image %s (job.json's container_*),\n"
                "# through %s; rendezvousd stays on the host.\n",
                j->container_image,
                j->container_runtime ? j->container_runtime : "the runtime each node has");
    fprintf(f,
            "# The job dir, %s, is made below with a fresh key. Submit this\n"
            "# file with sbatch, edited or not; the environment may override the paths.\n"
            "set -euo pipefail\n\n"
            ": \"${SLURM_JOB_ID:?this is a batch script: submit it with sbatch}\"\n"
            "# When the job started: Slurm's time limit counts from here, and the leader,\n"
            "# which starts seconds later on a busy node, reads the limit from it. Until\n"
            "# srun, shell builtins where they do (bash 5's clock): each command run costs\n"
            "# a millisecond or two of the job's start.\n"
            "if [ -n \"${EPOCHREALTIME:-}\" ]; then\n"
            "    GPURUN_JOB_START_MS=${EPOCHREALTIME/[.,]/}\n"
            "    GPURUN_JOB_START_MS=${GPURUN_JOB_START_MS%%???}\n"
            "else\n"
            "    GPURUN_JOB_START_MS=$(date +%%s%%3N)\n"
            "fi\n"
            "export GPURUN_JOB_START_MS\n"
            "rendezvousd=${GPURUN_RENDEZVOUSD:-",
            j->job_dir ? "given by --job-dir" : "$GPURUN_JOBS/<job id>");
    sbatch_shell_word(f, j->rendezvousd);
    fprintf(f, "}\n");
    if (j->job_dir) {
        fprintf(f, "dir=");
        sbatch_shell_word(f, j->job_dir);
        fprintf(f, "\n");
    } else {
        fprintf(f, "jobs=${GPURUN_JOBS:-");
        sbatch_shell_word(f, j->jobs_root);
        fprintf(f, "}\ndir=$jobs/$SLURM_JOB_ID\n");
    }
    fprintf(f, "\numask 077\n"
               "# A requeued job (Slurm keeps its id) goes on in its own dir: checkpoints and\n"
               "# logs stay, the last segment's summary moves to segments/N.json. Otherwise\n"
               "# a dir an earlier job left under the same name (Slurm's ids start again from\n"
               "# 1 when its state is reset) is kept aside, not reused.\n"
               "requeues=${SLURM_RESTART_COUNT:-0}\n"
               "if [ \"$requeues\" -gt 0 ] && grep -qsF '\"job_id\": \"'\"$SLURM_JOB_ID\"'\"' "
               "\"$dir/job.json\"; then\n"
               "    mkdir -p \"$dir/segments\" \"$dir/logs\"\n"
               "    if [ -e \"$dir/summary.json\" ]; then\n"
               "        mv -f \"$dir/summary.json\" \"$dir/segments/$((requeues - 1)).json\"\n"
               "    fi\n"
               "    rm -f \"$dir/endpoint.json\" \"$dir/preempt\" \"$dir/preempt.new\" "
               "\"$dir/key\"\n"
               "else\n"
               "    if [ -e \"$dir\" ] && ! rmdir \"$dir\" 2>/dev/null; then\n"
               "        mv \"$dir\" \"$dir.$(date +%%Y%%m%%d-%%H%%M%%S)\"\n"
               "    fi\n"
               "    mkdir -p \"$dir/logs\"\n"
               "fi\n"
               "\n");
    fprintf(f,
            "# One rendezvousd per node with all the node's CPUs for its ranks (srun 22.05 no\n"
            "# longer takes --cpus-per-task from the job). scancel's SIGTERM reaches this shell\n"
            "# and srun passes it on. The pre-timeout signal (--signal=B:...) goes to the\n"
            "# leader on this host through the job dir, not through srun: srun would signal\n"
            "# every process of the step, and it must reach only the ranks that asked for it.\n"
            "# Each daemon's stderr joins its stdout (whole lines, docs/design.md, section 4), so\n"
            "# that srun's stderr holds srun's own messages alone: they go to srun.log, and to\n"
            "# the job's output only where they explain its end (below).\n"
            "srun --ntasks-per-node=1 --cpus-per-task=\"${SLURM_CPUS_PER_TASK:-%d}\" "
            "--kill-on-bad-exit=0%s \\\n"
            "    \"$rendezvousd\" --job-dir \"$dir\" --log-level %s --stderr-to-stdout \\\n"
            "    2>\"$dir/srun.log\" &\n"
            "srun_pid=$!\n"
            "# While srun starts the daemons (tens of ms), which wait for them: the key (bash\n"
            "# 5.1's SRANDOM is getrandom(2)), job.json with the job's id, the copy of this\n"
            "# script that gpurun rerun submits again.\n"
            "if [ -n \"${SRANDOM:-}\" ]; then\n"
            "    printf '%%08x' \"$SRANDOM\" \"$SRANDOM\" \"$SRANDOM\" \"$SRANDOM\" \"$SRANDOM\" "
            "\"$SRANDOM\" \"$SRANDOM\" \\\n"
            "        \"$SRANDOM\" >\"$dir/key\"\n"
            "else\n"
            "    key=$(od -An -vtx1 -N32 /dev/urandom)\n"
            "    printf '%%s' \"${key//[$' \\n']/}\" >\"$dir/key\"\n"
            "    unset key\n"
            "fi\n"
            "IFS= read -r -d '' spec <<'GPURUN_JOB_JSON' || true\n",
            j->cpus_per_task, j->no_kill ? " --no-kill" : "", j->log_level);
    fputs(j->spec_json, f);
    if (j->spec_json[0] && j->spec_json[strlen(j->spec_json) - 1] != '\n')
        fputc('\n', f);
    fprintf(
        f,
        "GPURUN_JOB_JSON\n"
        "empty='" EMPTY_JOB_ID "'\n"
        "printf '%%s' \"${spec/\"$empty\"/\"\\\"job_id\\\": \\\"$SLURM_JOB_ID\\\"\"}\" "
        ">\"$dir/job.json\"\n"
        "unset spec empty\n"
        "cp \"$0\" \"$dir/job.sbatch\"\n"
        "# A node the leader gave up (lost, fenced) whose daemon still runs once the job's\n"
        "# record is written (stopped, frozen) would keep srun waiting for ever: the step\n"
        "# (0, this script's only one) is killed half a second later, time for the other\n"
        "# daemons to end as they do at once, and Slurm kills every process of it, that\n"
        "# daemon's ranks too. Shell builtins but sleep, until the record exists.\n"
        "(\n"
        "    while kill -0 \"$srun_pid\" 2>/dev/null; do\n"
        "        if [ -e \"$dir/summary.json\" ]; then\n"
        "            grep -qsE '\"state\":\"(lost|fenced)\"' \"$dir/summary.json\" || exit 0\n"
        "            sleep 0.5\n"
        "            kill -0 \"$srun_pid\" 2>/dev/null || exit 0\n"
        "            echo \"gpurun: a node the leader gave up still runs: ending the step\" >&2\n"
        "            scancel --signal=KILL \"$SLURM_JOB_ID.0\" || true\n"
        "            exit 0\n"
        "        fi\n"
        "        sleep 0.2\n"
        "    done\n"
        ") &\n"
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
        "# srun's messages (\"Force Terminated\", \"task 1: Killed\" of a node a spare replaced,\n"
        "# a cancel's, a daemon's exit status) are noise beside the job's record, except\n"
        "# where they explain a failed job's end it does not: no record (the leader was\n"
        "# lost), or a daemon that did not exit (\"task 1: Killed\": its node lost). Its\n"
        "# \"nodeN: task K: ...\" names a daemon, one a node, so K is a node, not a rank.\n"
        "tasks=$(grep -c ': task [0-9][0-9]*: ' \"$dir/srun.log\" 2>/dev/null || true)\n"
        "exits=$(grep -c ': task [0-9][0-9]*: Exited with exit code ' \"$dir/srun.log\" "
        "2>/dev/null || true)\n"
        "if [ \"$status\" != 0 ] && [ -s \"$dir/srun.log\" ] &&\n"
        "    { [ -z \"$summary\" ] || [ \"${tasks:-0}\" -gt \"${exits:-0}\" ]; }; then\n"
        "    cat \"$dir/srun.log\" >&2\n"
        "    if [ \"${tasks:-0}\" -gt 0 ]; then\n"
        "        echo \"gpurun: srun's 'task K' is node K's rendezvousd, not rank K (gpurun "
        "status $SLURM_JOB_ID names the node and rank that failed)\" >&2\n"
        "    fi\n"
        "fi\n",
        psig, tname);
    if (j->max_requeues > 0)
        fprintf(f,
                "# --max-requeues: ranks that checkpointed on the pre-timeout signal and ended\n"
                "# well go on in a requeued job, with this id and job dir, %d times at most.\n"
                "if [ \"$status\" = 0 ] && [ \"$requeues\" -lt %d ] &&\n"
                "    grep -qs '^  \"preempt_signal\": ' \"$dir/summary.json\"; then\n"
                "    echo \"gpurun: job $SLURM_JOB_ID checkpointed at its time limit: requeue "
                "$((requeues + 1)) of %d\" >&2\n"
                "    scontrol requeue \"$SLURM_JOB_ID\" || status=125\n"
                "fi\n",
                j->max_requeues, j->max_requeues, j->max_requeues);
    fprintf(f, "exit \"$status\"\n");
}

int sbatch_render(const struct sbatch_job *job, char **out, struct errmsg *err)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f;
    int ret;

    *out = NULL;
    if (!strstr(job->spec_json, EMPTY_JOB_ID))
        return errmsg_set(err, -EINVAL, "the job spec lacks an empty job_id");
    if (strstr(job->spec_json, "\nGPURUN_JOB_JSON\n"))
        return errmsg_set(err, -EINVAL, "the job spec holds the script's heredoc delimiter");
    f = open_memstream(&text, &len);
    if (!f)
        return errmsg_set(err, -ENOMEM, "out of memory");
    fprintf(f, "#!/bin/bash\n");
    ret = directives(f, job, err);
    if (ret == 0)
        body(f, job);
    if (fclose(f) != 0 && ret == 0)
        ret = errmsg_set(err, -ENOMEM, "out of memory");
    if (ret < 0) {
        free(text);
        return ret;
    }
    *out = text;
    return 0;
}

/* --- reading a script back ----------------------------------------------------------------- */

/* What a directive's value is, read back into struct sbatch_job. */
enum parse_kind {
    PARSE_STRING,    /* the value, borrowed from the text, at offset */
    PARSE_INT,       /* a whole number >= 1 into the int at offset */
    PARSE_TIME,      /* sbatch_format_time's text, or UNLIMITED, into time_limit_min */
    PARSE_MEM,       /* a size into mem_mb; arg: its enum slurmopt_mem_per */
    PARSE_EXCLUSIVE, /* --exclusive[=user|mcs] */
    PARSE_SIGNAL,    /* --signal=[{R|B}:]SIG[@TIME] */
    PARSE_FLAG,      /* no value: the bool at offset; (size_t)-1: none to set */
    PARSE_COMMENT,   /* "gpurun" or "gpurun: TEXT" (sbatch_comment): TEXT into comment */
    PARSE_MAIL_TYPE, /* mail_type and its text */
    PARSE_FIXED,     /* the one value gpurun writes (arg_text), nothing to set */
    PARSE_GPUS,      /* "[TYPE:]N" into gpus_per_node and gpu_type */
};

#define JOB_FIELD(f) offsetof(struct sbatch_job, f)
#define NO_FIELD     ((size_t)-1)

/* The directives directives() writes and what each sets, besides string_directives[] (each
 * a PARSE_STRING). A script with any other was not written by gpurun. */
static const struct parse_row {
    const char *name;
    enum parse_kind kind;
    size_t offset;
    int arg;
    const char *arg_text;
} parse_rows[] = {
    {"job-name", PARSE_STRING, JOB_FIELD(job_name), 0, NULL},
    {"nodes", PARSE_INT, JOB_FIELD(nodes), 0, NULL},
    {"ntasks-per-node", PARSE_FIXED, NO_FIELD, 0, "1"},
    {"cpus-per-task", PARSE_INT, JOB_FIELD(cpus_per_task), 0, NULL},
    {"gpus-per-node", PARSE_GPUS, JOB_FIELD(gpus_per_node), 0, NULL},
    {"time", PARSE_TIME, JOB_FIELD(time_limit_min), 0, NULL},
    {"partition", PARSE_STRING, JOB_FIELD(partition), 0, NULL},
    {"account", PARSE_STRING, JOB_FIELD(account), 0, NULL},
    {"mem", PARSE_MEM, JOB_FIELD(mem_mb), SLURMOPT_MEM_NODE, NULL},
    {"mem-per-cpu", PARSE_MEM, JOB_FIELD(mem_mb), SLURMOPT_MEM_CPU, NULL},
    {"mem-per-gpu", PARSE_MEM, JOB_FIELD(mem_mb), SLURMOPT_MEM_GPU, NULL},
    {"exclusive", PARSE_EXCLUSIVE, JOB_FIELD(exclusive), 0, NULL},
    {"hold", PARSE_FLAG, JOB_FIELD(hold), 0, NULL},
    {"output", PARSE_STRING, JOB_FIELD(output), 0, NULL},
    {"chdir", PARSE_STRING, JOB_FIELD(work_dir), 0, NULL},
    {"signal", PARSE_SIGNAL, JOB_FIELD(signal_text), 0, NULL},
    {"requeue", PARSE_FLAG, JOB_FIELD(requeue), 0, NULL},
    {"no-kill", PARSE_FLAG, JOB_FIELD(no_kill), 0, NULL},
    {"no-requeue", PARSE_FLAG, NO_FIELD, 0, NULL},
    {"open-mode", PARSE_FIXED, NO_FIELD, 0, "append"},
    {"comment", PARSE_COMMENT, JOB_FIELD(comment), 0, NULL},
    {"mail-type", PARSE_MAIL_TYPE, JOB_FIELD(mail_type), 0, NULL},
    {"mail-user", PARSE_STRING, JOB_FIELD(mail_user), 0, NULL},
};

/* The row of directive name (n bytes); a string_directives[] one is a PARSE_STRING row in
 * *tmp. NULL: none. */
static const struct parse_row *parse_row_of(const char *name, size_t n, struct parse_row *tmp)
{
    for (size_t i = 0; i < sizeof(parse_rows) / sizeof(parse_rows[0]); i++)
        if (strlen(parse_rows[i].name) == n && !strncmp(parse_rows[i].name, name, n))
            return &parse_rows[i];
    for (size_t i = 0; i < sizeof(string_directives) / sizeof(string_directives[0]); i++) {
        if (strlen(string_directives[i].name) != n || strncmp(string_directives[i].name, name, n))
            continue;
        *tmp = (struct parse_row){string_directives[i].name, PARSE_STRING,
                                  string_directives[i].offset, 0, NULL};
        return tmp;
    }
    return NULL;
}

/* A whole number >= 1 that fits an int. */
static bool positive_int(const char *s, int *out)
{
    long v = 0;

    if (!*s)
        return false;
    for (const char *p = s; *p; p++) {
        if (!isdigit((unsigned char)*p) || v > (INT_MAX - 9) / 10)
            return false;
        v = v * 10 + (*p - '0');
    }
    *out = (int)v;
    return v >= 1;
}

/* Sets what directive row r says of job, its value val (NULL: none given). */
static int parse_value(const struct parse_row *r, char *val, struct sbatch_job *job,
                       struct errmsg *err)
{
    void *field = (char *)job + (r->offset == NO_FIELD ? 0 : r->offset);
    struct slurmopt_signal sig;
    char bad[64];
    long secs;
    int v;

    if ((r->kind == PARSE_FLAG) != !val && r->kind != PARSE_EXCLUSIVE)
        return errmsg_set(err, -EINVAL, val ? "takes no value" : "needs a value");
    switch (r->kind) {
    case PARSE_STRING:
        *(const char **)field = val;
        return 0;
    case PARSE_INT:
        if (!positive_int(val, &v))
            return errmsg_set(err, -EINVAL, "'%s' is not a whole number", val);
        *(int *)field = v;
        return 0;
    case PARSE_TIME:
        if (slurmopt_parse_time(val, &secs) < 0)
            return errmsg_set(err, -EINVAL, "'%s' is not a time limit", val);
        *(long *)field = secs == 0 ? SBATCH_TIME_UNLIMITED : sbatch_time_minutes(secs);
        return 0;
    case PARSE_MEM:
        if (slurmopt_parse_mem(val, &job->mem_mb) < 0)
            return errmsg_set(err, -EINVAL, "'%s' is not a size", val);
        job->mem_per = (enum slurmopt_mem_per)r->arg;
        return 0;
    case PARSE_EXCLUSIVE:
        /* exclusive_directives[]: bare, "=user" or "=mcs". */
        if (!val)
            job->exclusive = SLURMOPT_EXCLUSIVE;
        else if (!strcmp(val, "user"))
            job->exclusive = SLURMOPT_EXCLUSIVE_USER;
        else if (!strcmp(val, "mcs"))
            job->exclusive = SLURMOPT_EXCLUSIVE_MCS;
        else
            return errmsg_set(err, -EINVAL, "'%s' is not user or mcs", val);
        return 0;
    case PARSE_SIGNAL:
        if (slurmopt_parse_signal(val, &sig, err) < 0) {
            /* Its message names --signal already: said once, by the caller. */
            char why[sizeof(err->text)];
            snprintf(why, sizeof(why), "%s", err->text + strcspn(err->text, " ") + 1);
            return errmsg_set(err, -EINVAL, "%s", why);
        }
        job->signal_text = val;
        job->preempt_signal = sig.sig;
        job->signal_time_s = sig.time_s;
        job->signal_batch_only = sig.batch_only;
        job->signal_reservation = sig.reservation;
        return 0;
    case PARSE_FLAG:
        if (r->offset != NO_FIELD)
            *(bool *)field = true;
        return 0;
    case PARSE_COMMENT:
        /* gpurun's mark, then the user's comment: sbatch_comment() adds the mark again. */
        if (!strcmp(val, SBATCH_COMMENT))
            job->comment = NULL;
        else if (sbatch_is_gpurun_comment(val))
            job->comment = val + strlen(SBATCH_COMMENT) + 2;
        else
            job->comment = val;
        return 0;
    case PARSE_MAIL_TYPE:
        v = slurmopt_parse_mail_type(val, bad, sizeof(bad));
        if (v < 0)
            return errmsg_set(err, -EINVAL, "'%s' is not a mail type", bad);
        job->mail_type = (unsigned)v;
        job->mail_type_text = val;
        return 0;
    case PARSE_GPUS: {
        char *colon = strrchr(val, ':');
        if (!positive_int(colon ? colon + 1 : val, &v) || colon == val)
            return errmsg_set(err, -EINVAL, "'%s' is not [TYPE:]N", val);
        if (colon)
            *colon = '\0';
        job->gpus_per_node = v;
        job->gpu_type = colon ? val : NULL;
        return 0;
    }
    case PARSE_FIXED:
        if (strcmp(val, r->arg_text))
            return errmsg_set(err, -EINVAL, "'%s': gpurun writes only '%s'", val, r->arg_text);
        return 0;
    }
    return errmsg_set(err, -EINVAL, "bad directive row");
}

/* One "#SBATCH --NAME[=VALUE]" line (its text after "#SBATCH", NUL-terminated, modified). */
static int parse_directive(char *p, struct sbatch_job *job, struct errmsg *err)
{
    struct parse_row tmp;
    const struct parse_row *r;
    char *name, *val = NULL, *end, *rest;
    size_t n;

    p += strspn(p, " \t");
    if (strncmp(p, "--", 2))
        return errmsg_set(err, -EINVAL, "'%s' is not a directive gpurun writes", p);
    name = p + 2;
    n = strcspn(name, "= \t");
    r = parse_row_of(name, n, &tmp);
    if (!r)
        return errmsg_set(err, -EINVAL, "'--%.*s' is not a directive gpurun writes", (int)n, name);
    end = name + n;
    if (*end == '=') {
        /* directive(): the value in double quotes where it holds a blank, else bare. */
        val = end + 1;
        if (*val == '"') {
            val++;
            end = strchr(val, '"');
            if (!end)
                return errmsg_set(err, -EINVAL, "--%s: no closing quote", r->name);
        } else {
            end = val + strcspn(val, " \t");
        }
    }
    rest = end + (*end == '"'); /* past a closing quote */
    if (rest[strspn(rest, " \t")] != '\0')
        return errmsg_set(err, -EINVAL, "--%s: more after its value", r->name);
    *end = '\0';
    if (parse_value(r, val, job, err) < 0) {
        char why[sizeof(err->text)];
        snprintf(why, sizeof(why), "%s", err->text);
        return errmsg_set(err, -EINVAL, "--%s: %s", r->name, why);
    }
    return 0;
}

/* Undoes sbatch_shell_word in place: a bare word, or words in single quotes with each '
 * written as '\''. */
static void shell_unword(char *s)
{
    char *out = s;
    bool quoted = false;

    for (char *p = s; *p; p++) {
        if (*p == '\'')
            quoted = !quoted;
        else if (!quoted && *p == '\\' && p[1])
            *out++ = *++p;
        else
            *out++ = *p;
    }
    *out = '\0';
}

/* The body's "dir=WORD" line, where the job dir was fixed (--job-dir); "dir=$jobs/..." is
 * the jobs root's. Looked for before the job spec's heredoc only. */
#define FIXED_DIR "dir="

int sbatch_parse(char *text, struct sbatch_job *job, struct errmsg *err)
{
    bool directives = true;
    int lineno = 0;

    memset(job, 0, sizeof(*job));
    for (char *line = text, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next)
            *next++ = '\0';
        lineno++;
        if (strstr(line, "GPURUN_JOB_JSON"))
            break;
        /* sbatch reads directives up to the first command. */
        if (directives && line[0] != '#' && line[strspn(line, " \t")] != '\0')
            directives = false;
        if (directives && !strncmp(line, "#SBATCH", 7) && parse_directive(line + 7, job, err)) {
            char why[sizeof(err->text)];
            snprintf(why, sizeof(why), "%s", err->text);
            return errmsg_set(err, -EINVAL, "line %d: %s", lineno, why);
        }
        if (!directives && !strncmp(line, FIXED_DIR, strlen(FIXED_DIR)) &&
            line[strlen(FIXED_DIR)] != '$') {
            shell_unword(line + strlen(FIXED_DIR));
            job->job_dir = line + strlen(FIXED_DIR);
        }
    }
    if (job->nodes == 0 || !job->job_name)
        return errmsg_set(err, -EINVAL,
                          "no --nodes or --job-name directive: not a script gpurun wrote");
    return 0;
}
