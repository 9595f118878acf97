/* Tests of gpurun's Slurm side that need no cluster: the batch script (directives, quoting,
 * refusals, bash syntax), the job descriptor filled from the same job (held against the
 * script's directives), the exit status of each end state, job ids, hostlists through
 * libslurm, and the status view (state, progress bar, timings, text) and logs -f. The
 * cluster itself is tests/integ/slurm_client_*.sh's. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#ifndef GPURUN_NO_LIBSLURM
#include <slurm/slurm.h>
#endif

#include "../client/follow.h"
#include "../client/logs.h"
#include "../client/sbatch.h"
#include "../client/slurmlib.h"
#include "../client/view.h"
#include "test.h"
#include "banned.h"

static const char SPEC[] = "{\n  \"argv\": [\n    \"true\"\n  ],\n  \"job_id\": \"\",\n"
                           "  \"nnodes\": 2\n}\n";

static char *const ARGV[] = {(char *)"python3", (char *)"train.py", (char *)"--lr",
                             (char *)"3e-4",    (char *)"it's",     NULL};

static struct sbatch_job full_job(void)
{
    return (struct sbatch_job){.job_name = "tiny",
                               .nodes = 2,
                               .ranks_per_node = 4,
                               .gpus_per_node = 4,
                               .cpus_per_task = 8,
                               .time_limit_min = 90,
                               .signal_before_s = 120,
                               .partition = "gpu",
                               .account = "proj",
                               .output = "/home/u/.gpurun/jobs/%j.out",
                               .work_dir = "/home/u/work dir",
                               .rendezvousd = "/opt/gpurun/bin/rendezvousd",
                               .jobs_root = "/home/u/.gpurun/jobs",
                               .log_level = "warn",
                               .spec_json = SPEC,
                               .argv = ARGV};
}

/* full_job() with every one of sbatch's scheduling options. */
static struct sbatch_job sched_job(void)
{
    struct sbatch_job job = full_job();

    job.qos = "high";
    job.mem_per = SLURMOPT_MEM_GPU;
    job.mem_mb = 80 * 1024;
    job.exclusive = SLURMOPT_EXCLUSIVE;
    job.constraint = "a100&ib";
    job.nodelist = "node[1-2]";
    job.exclude = "node3";
    job.reservation = "maint";
    job.gres = "nvme:1,gres:tmp:ssd:2";
    job.dependency = "afterok:12:13,afterany:14";
    job.begin = "2030-01-02T03:04:05"; /* begin_time: slurmlib_parse_begin's */
    job.hold = true;
    job.comment = "ablation 3, lr 3e-4";
    job.mail_type = SLURMOPT_MAIL_END | SLURMOPT_MAIL_FAIL | SLURMOPT_MAIL_TIME90;
    job.mail_type_text = "END,fail,TIME_LIMIT_90";
    job.mail_user = "me@example.org";
    return job;
}

static char *render_ok(const struct sbatch_job *job)
{
    struct errmsg err = {{0}};
    char *text = NULL;
    int r = sbatch_render(job, &text, &err);

    if (r != 0)
        test_fail(__FILE__, __LINE__, "sbatch_render: %d: %s", r, err.text);
    return text;
}

/* The value of "#SBATCH --NAME=VALUE" in text (quotes removed) into buf, or NULL. */
static const char *directive(const char *text, const char *name, char *buf, size_t n)
{
    char key[64];
    const char *p;
    size_t len;

    snprintf(key, sizeof(key), "\n#SBATCH --%s=", name);
    p = strstr(text, key);
    if (!p)
        return NULL;
    p += strlen(key);
    len = strcspn(p, "\n");
    if (len >= 2 && p[0] == '"' && p[len - 1] == '"')
        p++, len -= 2;
    snprintf(buf, n, "%.*s", (int)len, p);
    return buf;
}

static long num(const char *s)
{
    return s ? strtol(s, NULL, 10) : -1;
}

/* --- the script ---------------------------------------------------------------------------- */

TEST(slurm_time_and_signal)
{
    char buf[32];

    CHECK_EQ(sbatch_time_minutes(0), 0);
    CHECK_EQ(sbatch_time_minutes(1), 1);
    CHECK_EQ(sbatch_time_minutes(60), 1);
    CHECK_EQ(sbatch_time_minutes(90), 2);
    CHECK_EQ(sbatch_time_minutes(2 * 86400), 2880);
    CHECK_EQ(sbatch_signal_before(0), 120);
    CHECK_EQ(sbatch_signal_before(600), 120);
    CHECK_EQ(sbatch_signal_before(8), 120);
    CHECK_EQ(sbatch_signal_before(4), 60);
    CHECK_EQ(sbatch_signal_before(1), 15);
    sbatch_format_time(buf, sizeof(buf), 90);
    CHECK_STR(buf, "1:30:00");
    sbatch_format_time(buf, sizeof(buf), 5);
    CHECK_STR(buf, "0:05:00");
    sbatch_format_time(buf, sizeof(buf), 2 * 1440 + 61);
    CHECK_STR(buf, "2-01:01:00");
}

TEST(slurm_script_directives_and_body)
{
    struct sbatch_job job = full_job();
    char *text = render_ok(&job);

    CHECK(!strncmp(text, "#!/bin/bash\n#SBATCH --job-name=tiny\n", 36));
    CHECK_CONTAINS(text, "\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n"
                         "#SBATCH --cpus-per-task=8\n#SBATCH --gpus-per-node=4\n"
                         "#SBATCH --time=1:30:00\n#SBATCH --partition=gpu\n"
                         "#SBATCH --account=proj\n#SBATCH --output=/home/u/.gpurun/jobs/%j.out\n"
                         "#SBATCH --chdir=\"/home/u/work dir\"\n#SBATCH --signal=B:USR1@120\n"
                         "#SBATCH --no-requeue\n#SBATCH --comment=gpurun\n");
    /* The command in the header, quoted as a shell would need it. */
    CHECK_CONTAINS(text, "each starting 4 ranks of:\n#   python3 train.py --lr 3e-4 'it'\\''s'\n");
    CHECK_CONTAINS(text, "\nset -euo pipefail\n");
    CHECK_CONTAINS(text, "rendezvousd=${GPURUN_RENDEZVOUSD:-/opt/gpurun/bin/rendezvousd}\n");
    CHECK_CONTAINS(text, "jobs=${GPURUN_JOBS:-/home/u/.gpurun/jobs}\ndir=$jobs/$SLURM_JOB_ID\n");
    /* Until srun, builtins but mkdir and od: the job's id goes into job.json by bash. */
    CHECK_CONTAINS(text, "IFS= read -r -d '' spec <<'GPURUN_JOB_JSON' || true\n{\n  \"argv\"");
    CHECK_CONTAINS(text,
                   "\"nnodes\": 2\n}\nGPURUN_JOB_JSON\nempty='\"job_id\": \"\"'\n"
                   "printf '%s' \"${spec/\"$empty\"/\"\\\"job_id\\\": \\\"$SLURM_JOB_ID\\\"\"}\" "
                   ">\"$dir/job.json\"\n");
    CHECK(!strstr(text, "sed 's/\"job_id\""));
    CHECK_CONTAINS(text, "    GPURUN_JOB_START_MS=${EPOCHREALTIME/[.,]/}\n");
    CHECK(strstr(text, "srun_pid=$!") < strstr(text, "cp \"$0\" \"$dir/job.sbatch\"\n"));
    /* The daemons' stderr joins their stdout, so that srun's own messages go to srun.log
     * alone; they reach the output only where they explain a failure the record does not. */
    CHECK_CONTAINS(text, "srun --ntasks-per-node=1 --cpus-per-task=\"${SLURM_CPUS_PER_TASK:-8}\" "
                         "--kill-on-bad-exit=0 \\\n    \"$rendezvousd\" --job-dir \"$dir\" "
                         "--log-level warn --stderr-to-stdout \\\n"
                         "    2>\"$dir/srun.log\" &\n");
    CHECK_CONTAINS(text, "if [ \"$status\" != 0 ] && [ -s \"$dir/srun.log\" ] &&\n"
                         "    { [ -z \"$summary\" ] || [ \"${tasks:-0}\" -gt \"${exits:-0}\" ]; "
                         "}; then\n"
                         "    cat \"$dir/srun.log\" >&2\n");
    /* The pre-timeout signal goes to the leader through the job dir, never to srun (which
     * would signal every process of the step). */
    CHECK_CONTAINS(text, "trap 'echo 10 >\"$dir/preempt.new\" && mv -f \"$dir/preempt.new\" "
                         "\"$dir/preempt\"' USR1\n");
    CHECK(!strstr(text, "kill -USR1"));
    CHECK(!strstr(text, "/tmp"));
    free(text);

    /* The optional ones go; a fixed job dir replaces the jobs root. */
    job.gpus_per_node = 0;
    job.time_limit_min = 0;
    job.signal_before_s = 0;
    job.partition = job.account = NULL;
    job.job_dir = "/scratch/it's here";
    job.ranks_per_node = 1;
    text = render_ok(&job);
    CHECK(!strstr(text, "#SBATCH --gpus-per-node") && !strstr(text, "#SBATCH --time=") &&
          !strstr(text, "#SBATCH --partition") && !strstr(text, "#SBATCH --account") &&
          !strstr(text, "#SBATCH --signal"));
    CHECK(!strstr(text, "GPURUN_JOBS:-"));
    CHECK_CONTAINS(text, "\ndir='/scratch/it'\\''s here'\n");
    CHECK_CONTAINS(text, "each starting 1 rank of:");
    free(text);
}

/* sbatch's scheduling options: one directive each, where sbatch reads them. */
TEST(slurm_script_sbatch_options)
{
    struct sbatch_job job = sched_job();
    char *text = render_ok(&job);

    CHECK_CONTAINS(text, "\n#SBATCH --account=proj\n#SBATCH --mem-per-gpu=80G\n"
                         "#SBATCH --exclusive\n#SBATCH --qos=high\n#SBATCH --constraint=a100&ib\n"
                         "#SBATCH --nodelist=node[1-2]\n#SBATCH --exclude=node3\n"
                         "#SBATCH --reservation=maint\n#SBATCH --gres=nvme:1,gres:tmp:ssd:2\n"
                         "#SBATCH --dependency=afterok:12:13,afterany:14\n"
                         "#SBATCH --begin=2030-01-02T03:04:05\n#SBATCH --hold\n#SBATCH --output=");
    CHECK_CONTAINS(text,
                   "\n#SBATCH --no-requeue\n#SBATCH --comment=\"gpurun: ablation 3, lr 3e-4\"\n"
                   "#SBATCH --mail-type=END,fail,TIME_LIMIT_90\n"
                   "#SBATCH --mail-user=me@example.org\n#\n");
    free(text);
    /* A comment that cannot be a directive is refused, named as the user gave it. */
    job.comment = "say \"hi\"";
    CHECK_EQ(sbatch_render(&job, &text, &(struct errmsg){{0}}), -EINVAL);
}

/* The Slurm comment that marks a job as gpurun's, and what is taken for one. */
TEST(slurm_comments)
{
    char comment[160];

    CHECK_STR(sbatch_comment(NULL, comment, sizeof(comment)), "gpurun");
    CHECK_STR(sbatch_comment("my run", comment, sizeof(comment)), "gpurun: my run");
    CHECK(sbatch_is_gpurun_comment("gpurun") && sbatch_is_gpurun_comment("gpurun: my run"));
    CHECK(!sbatch_is_gpurun_comment(NULL) && !sbatch_is_gpurun_comment("gpurunner") &&
          !sbatch_is_gpurun_comment("gpurun:x") && !sbatch_is_gpurun_comment("my gpurun"));
}

#ifndef GPURUN_NO_LIBSLURM
/* --begin through sbatch's own parser. */
TEST(slurm_begin_times)
{
    struct errmsg err;
    long long t = 0, now = (long long)time(NULL);
    struct tm tm = {.tm_year = 130,
                    .tm_mon = 0,
                    .tm_mday = 2,
                    .tm_hour = 3,
                    .tm_min = 4,
                    .tm_sec = 5,
                    .tm_isdst = -1};

    CHECK_EQ(slurmlib_parse_begin("2030-01-02T03:04:05", &t, &err), 0);
    CHECK_EQ(t, (long long)mktime(&tm));
    CHECK_EQ(slurmlib_parse_begin("now+1hour", &t, &err), 0);
    CHECK(t >= now + 3600 && t <= now + 3600 + 60);
    CHECK_EQ(slurmlib_parse_begin("now+90", &t, &err), 0);
    CHECK(t >= now + 90 && t <= now + 90 + 60);
    CHECK_EQ(slurmlib_parse_begin("tomorrow", &t, &err), 0);
    CHECK(t > now);
    CHECK_EQ(slurmlib_parse_begin("yesterday-ish", &t, &err), -EINVAL);
    CHECK_CONTAINS(err.text, "--begin: 'yesterday-ish' is not a time (sbatch's forms: ");
    CHECK_EQ(slurmlib_parse_begin("", &t, &err), -EINVAL);
    CHECK_EQ(slurmlib_parse_begin("now+1fortnight", &t, &err), -EINVAL);
}
#endif

TEST(slurm_script_refusals)
{
    struct sbatch_job job = full_job();
    struct errmsg err;
    char *text = (char *)"untouched";

    job.job_name = "a\"b";
    CHECK_EQ(sbatch_render(&job, &text, &err), -EINVAL);
    CHECK(text == NULL);
    CHECK_STR(err.text, "--job-name: 'a\"b' cannot be written as an #SBATCH directive");
    job = full_job();
    job.output = "/x/out\n#SBATCH --nodes=100";
    CHECK_EQ(sbatch_render(&job, &text, &err), -EINVAL);
    CHECK_CONTAINS(err.text, "--output: ");
    job = full_job();
    job.spec_json = "{\"job_id\": \"42\"}";
    CHECK_EQ(sbatch_render(&job, &text, &err), -EINVAL);
    CHECK_STR(err.text, "the job spec lacks an empty job_id");
    job.spec_json = "{\"job_id\": \"\",\n\"x\": [\n\"\nGPURUN_JOB_JSON\n\"]}";
    CHECK_EQ(sbatch_render(&job, &text, &err), -EINVAL);
}

#ifndef GPURUN_NO_LIBSLURM
/* Every field slurmlib_fill_desc sets, as one line of text (new: free it): two jobs ask
 * slurmctld for the same when their lines are equal. */
static char *desc_text(const struct sbatch_job *job, const char *script)
{
    char *env[] = {(char *)"A=1", NULL}, *out = NULL;
    size_t len = 0;
    job_desc_msg_t d;
    FILE *f = open_memstream(&out, &len);

    CHECK(f != NULL);
    slurmlib_fill_desc(job, script, env, 1, &d);
#define OR_NULL(s) ((s) ? (s) : "(null)")
    fprintf(f,
            "name=%s nodes=%u-%u tasks=%u per_node=%u cpus=%u tres=%s time=%u part=%s acct=%s "
            "out=%s err=%s dir=%s warn=%u@%u/%u requeue=%u open=%u comment=%s qos=%s mem=%llu "
            "mem_tres=%s shared=%u features=%s dep=%s req=%s exc=%s resv=%s begin=%lld prio=%u "
            "mail=%u/%s",
            OR_NULL(d.name), d.min_nodes, d.max_nodes, d.num_tasks, (unsigned)d.ntasks_per_node,
            (unsigned)d.cpus_per_task, OR_NULL(d.tres_per_node), d.time_limit, OR_NULL(d.partition),
            OR_NULL(d.account), OR_NULL(d.std_out), OR_NULL(d.std_err), OR_NULL(d.work_dir),
            (unsigned)d.warn_signal, (unsigned)d.warn_time, (unsigned)d.warn_flags,
            (unsigned)d.requeue, (unsigned)d.open_mode, OR_NULL(d.comment), OR_NULL(d.qos),
            (unsigned long long)d.pn_min_memory, OR_NULL(d.mem_per_tres), (unsigned)d.shared,
            OR_NULL(d.features), OR_NULL(d.dependency), OR_NULL(d.req_nodes), OR_NULL(d.exc_nodes),
            OR_NULL(d.reservation), (long long)d.begin_time, d.priority, (unsigned)d.mail_type,
            OR_NULL(d.mail_user));
#undef OR_NULL
    fclose(f);
    return out;
}
#endif

/* Two optional strings are the same: both absent, or equal. */
#define CHECK_OPT_STR(a, b)                                                                        \
    do {                                                                                           \
        if ((a) || (b))                                                                            \
            CHECK_STR(a, b);                                                                       \
    } while (0)

/* A script read back (sbatch_parse) is the job it was written from, field by field, for every
 * field its directives carry; gpurun rerun submits it again from job.sbatch. */
static void check_read_back(const struct sbatch_job *job)
{
    struct sbatch_job back;
    struct errmsg err = {{0}};
    char *text = render_ok(job), *copy = strdup(text), sig[32];

    CHECK(copy != NULL);
    if (sbatch_parse(copy, &back, &err) != 0)
        test_fail(__FILE__, __LINE__, "sbatch_parse: %s", err.text);
    CHECK_STR(back.job_name, job->job_name);
    CHECK_EQ(back.nodes, job->nodes);
    CHECK_EQ(back.cpus_per_task, job->cpus_per_task);
    CHECK_EQ(back.gpus_per_node, job->gpus_per_node);
    CHECK_OPT_STR(back.gpu_type, job->gpu_type);
    CHECK_EQ(back.time_limit_min, job->time_limit_min);
    CHECK_OPT_STR(back.partition, job->partition);
    CHECK_OPT_STR(back.account, job->account);
    CHECK_OPT_STR(back.qos, job->qos);
    CHECK_EQ(back.mem_per, job->mem_per);
    CHECK_EQ(back.mem_mb, job->mem_mb);
    CHECK_EQ(back.exclusive, job->exclusive);
    CHECK_OPT_STR(back.constraint, job->constraint);
    CHECK_OPT_STR(back.dependency, job->dependency);
    CHECK_OPT_STR(back.nodelist, job->nodelist);
    CHECK_OPT_STR(back.exclude, job->exclude);
    CHECK_OPT_STR(back.reservation, job->reservation);
    CHECK_OPT_STR(back.gres, job->gres);
    CHECK_OPT_STR(back.begin, job->begin);
    CHECK_EQ(back.hold, job->hold);
    CHECK_EQ(back.requeue, job->requeue);
    CHECK_OPT_STR(back.comment, job->comment);
    CHECK_EQ(back.mail_type, job->mail_type);
    CHECK_OPT_STR(back.mail_type_text, job->mail_type_text);
    CHECK_OPT_STR(back.mail_user, job->mail_user);
    CHECK_STR(back.output, job->output);
    CHECK_STR(back.work_dir, job->work_dir);
    CHECK_OPT_STR(back.job_dir, job->job_dir);
    /* gpurun's own pre-timeout signal is written as the --signal it stands for. */
    if (job->signal_text) {
        CHECK_STR(back.signal_text, job->signal_text);
        CHECK_EQ(back.preempt_signal, job->preempt_signal);
        CHECK_EQ(back.signal_time_s, job->signal_time_s);
        CHECK_EQ(back.signal_batch_only, job->signal_batch_only);
        CHECK_EQ(back.signal_reservation, job->signal_reservation);
    } else if (job->signal_before_s > 0) {
        snprintf(sig, sizeof(sig), "B:USR1@%d", job->signal_before_s);
        CHECK_STR(back.signal_text, sig);
        CHECK_EQ(back.preempt_signal, SIGUSR1);
        CHECK_EQ(back.signal_time_s, job->signal_before_s);
        CHECK(back.signal_batch_only && !back.signal_reservation);
    } else {
        CHECK(back.signal_text == NULL);
    }
#ifndef GPURUN_NO_LIBSLURM
    {
        /* What slurmctld gets is the same, field by field. */
        char *want = desc_text(job, text), *got;
        back.begin_time = job->begin_time;
        got = desc_text(&back, text);
        CHECK_STR(got, want);
        free(want);
        free(got);
    }
#endif
    free(copy);
    free(text);
}

TEST(slurm_script_read_back)
{
    struct sbatch_job job = full_job();

    check_read_back(&job);
    job = sched_job();
    check_read_back(&job);
    /* --gres gpu:TYPE:N's type, written as sbatch's --gpus-per-node=TYPE:N. */
    job.gpu_type = "a100";
    check_read_back(&job);
    job.gpu_type = NULL;
    /* The other forms: no GPUs, limit, partition or comment; --requeue, another memory
     * option and --exclusive form, the user's --signal, a fixed job dir to unquote. */
    job.gpus_per_node = 0;
    job.time_limit_min = 0;
    job.partition = job.account = job.comment = NULL;
    job.requeue = true;
    job.max_requeues = 2;
    job.mem_per = SLURMOPT_MEM_CPU;
    job.mem_mb = 1536;
    job.exclusive = SLURMOPT_EXCLUSIVE_USER;
    job.signal_text = "R:USR2@90";
    job.preempt_signal = SIGUSR2;
    job.signal_time_s = 90;
    job.signal_reservation = true;
    job.job_dir = "/scratch/it's here";
    job.job_name = "two words";
    check_read_back(&job);
    job.exclusive = SLURMOPT_EXCLUSIVE_MCS;
    job.mem_per = SLURMOPT_MEM_NODE;
    job.mem_mb = 0;
    job.hold = false;
    job.mail_type = 0;
    job.mail_type_text = NULL;
    job.signal_text = NULL;
    job.signal_before_s = 0;
    check_read_back(&job);
    job.time_limit_min = 3 * 1440 + 61;
    check_read_back(&job);
    /* -t 0: no limit, written as sbatch reads it. */
    job.time_limit_min = SBATCH_TIME_UNLIMITED;
    check_read_back(&job);
}

/* What gpurun would not have written is refused, with the line; directives after the first
 * command are not directives (sbatch stops there too). */
TEST(slurm_script_read_back_refusals)
{
    static const struct {
        const char *script, *msg;
    } bad[] = {
        {"#!/bin/bash\n#SBATCH --job-name=x\n#SBATCH --frob=1\n",
         "line 3: '--frob' is not a directive gpurun writes"},
        {"#!/bin/bash\n#SBATCH -N 2\n", "line 2: '-N 2' is not a directive gpurun writes"},
        {"#!/bin/bash\n#SBATCH --nodes=two\n", "line 2: --nodes: 'two' is not a whole number"},
        {"#!/bin/bash\n#SBATCH --nodes=0\n", "line 2: --nodes: '0' is not a whole number"},
        {"#!/bin/bash\n#SBATCH --ntasks-per-node=4\n",
         "line 2: --ntasks-per-node: '4': gpurun writes only '1'"},
        {"#!/bin/bash\n#SBATCH --hold=yes\n", "line 2: --hold: takes no value"},
        {"#!/bin/bash\n#SBATCH --partition\n", "line 2: --partition: needs a value"},
        {"#!/bin/bash\n#SBATCH --job-name=\"a b\n", "line 2: --job-name: no closing quote"},
        {"#!/bin/bash\n#SBATCH --job-name=a b\n", "line 2: --job-name: more after its value"},
        {"#!/bin/bash\n#SBATCH --signal=B:TERM@60\n",
         "line 2: --signal: 'TERM': gpurun passes only USR1 or USR2 on to the ranks (the time "
         "limit itself ends them with SIGTERM)"},
        {"#!/bin/bash\n#SBATCH --exclusive=all\n", "line 2: --exclusive: 'all' is not user or mcs"},
        {"#!/bin/bash\n#SBATCH --time=soon\n", "line 2: --time: 'soon' is not a time limit"},
        {"#!/bin/bash\n#SBATCH --mem=1X\n", "line 2: --mem: '1X' is not a size"},
        {"#!/bin/bash\n#SBATCH --mail-type=END,often\n",
         "line 2: --mail-type: 'often' is not a mail type"},
        {"#!/bin/bash\n#SBATCH --job-name=x\nset -e\n#SBATCH --nodes=2\n",
         "no --nodes or --job-name directive: not a script gpurun wrote"},
    };

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct sbatch_job job;
        struct errmsg err = {{0}};
        char *text = strdup(bad[i].script);
        CHECK(text != NULL);
        if (sbatch_parse(text, &job, &err) != -EINVAL)
            test_fail(__FILE__, __LINE__, "case %zu accepted", i);
        CHECK_STR(err.text, bad[i].msg);
        free(text);
    }
}

/* The rendered script is valid bash (bash -n), with the hardest values in it. */
TEST(slurm_script_parses_as_bash)
{
    struct sbatch_job job = full_job();
    char path[PATH_MAX];
    char *text;
    FILE *f;
    int st;
    pid_t pid;

    job.rendezvousd = "/opt/$(rm -rf x)/`y`/it's \\ here";
    job.jobs_root = "/home/u/\"quoted\" $HOME";
    text = render_ok(&job);
    snprintf(path, sizeof(path), "%s/job.sh", test_tmpdir());
    f = fopen(path, "w");
    CHECK(f != NULL);
    fputs(text, f);
    fclose(f);
    CHECK_CONTAINS(text, "rendezvousd=${GPURUN_RENDEZVOUSD:-'/opt/$(rm -rf x)/`y`/it'\\''s \\ "
                         "here'}\n");
    pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        int null = open("/dev/null", O_WRONLY);
        dup2(null, STDERR_FILENO);
        execlp("bash", "bash", "-n", path, (char *)NULL);
        _exit(127);
    }
    CHECK_EQ(waitpid(pid, &st, 0), pid);
    if (WIFEXITED(st) && WEXITSTATUS(st) == 127)
        test_skip("no bash here");
    CHECK(WIFEXITED(st));
    CHECK_EQ(WEXITSTATUS(st), 0);
    free(text);
}

/* --- the job descriptor -------------------------------------------------------------------- */

#ifndef GPURUN_NO_LIBSLURM
/* What slurmctld gets is what the script's directives say, field by field. */
TEST(slurm_desc_matches_the_directives)
{
    struct sbatch_job job = full_job();
    char *env[] = {(char *)"A=1", (char *)"B=2", NULL};
    char *text = render_ok(&job), buf[256], tres[64], bad[32];
    struct errmsg serr;
    unsigned long long mb;
    long long t;
    job_desc_msg_t d;

    slurmlib_fill_desc(&job, text, env, 2, &d);
    CHECK_STR(d.name, directive(text, "job-name", buf, sizeof(buf)));
    CHECK_EQ(d.min_nodes, num(directive(text, "nodes", buf, sizeof(buf))));
    CHECK_EQ(d.max_nodes, d.min_nodes);
    CHECK_EQ(d.num_tasks, d.min_nodes);
    CHECK_EQ(d.ntasks_per_node, num(directive(text, "ntasks-per-node", buf, sizeof(buf))));
    CHECK_EQ(d.cpus_per_task, num(directive(text, "cpus-per-task", buf, sizeof(buf))));
    snprintf(tres, sizeof(tres), "gres:gpu:%s", directive(text, "gpus-per-node", buf, sizeof(buf)));
    CHECK_STR(d.tres_per_node, tres);
    CHECK_EQ(d.time_limit, 90);
    CHECK_STR(directive(text, "time", buf, sizeof(buf)), "1:30:00");
    CHECK_STR(d.partition, directive(text, "partition", buf, sizeof(buf)));
    CHECK_STR(d.account, directive(text, "account", buf, sizeof(buf)));
    CHECK_STR(d.std_out, directive(text, "output", buf, sizeof(buf)));
    CHECK_STR(d.std_err, d.std_out);
    CHECK_STR(d.work_dir, directive(text, "chdir", buf, sizeof(buf)));
    CHECK_STR(directive(text, "signal", buf, sizeof(buf)), "B:USR1@120");
    CHECK_EQ(d.warn_signal, SIGUSR1);
    CHECK_EQ(d.warn_time, 120);
    CHECK_EQ(d.warn_flags, KILL_JOB_BATCH);
    CHECK(strstr(text, "\n#SBATCH --no-requeue\n") && d.requeue == 0);
    CHECK_STR(d.comment, directive(text, "comment", buf, sizeof(buf)));
    CHECK(d.script == text);
    CHECK(d.environment == env && d.env_size == 2);
    CHECK_EQ(d.user_id, getuid());
    CHECK_EQ(d.group_id, getgid());
    free(text);

    /* sbatch's scheduling options, each one directive and one field. */
    job = sched_job();
    CHECK_EQ(slurmlib_parse_begin(job.begin, &job.begin_time, &serr), 0);
    text = render_ok(&job);
    slurmlib_fill_desc(&job, text, env, 2, &d);
    CHECK_STR(d.qos, directive(text, "qos", buf, sizeof(buf)));
    CHECK_EQ(slurmopt_parse_mem(directive(text, "mem-per-gpu", buf, sizeof(buf)), &mb), 0);
    snprintf(tres, sizeof(tres), "gres:gpu:%llu", mb);
    CHECK_STR(d.mem_per_tres, tres);
    CHECK_EQ(mb, 80 * 1024);
    CHECK(strstr(text, "\n#SBATCH --exclusive\n") && d.shared == JOB_SHARED_NONE);
    CHECK_STR(d.features, directive(text, "constraint", buf, sizeof(buf)));
    CHECK_STR(d.req_nodes, directive(text, "nodelist", buf, sizeof(buf)));
    CHECK_STR(d.exc_nodes, directive(text, "exclude", buf, sizeof(buf)));
    CHECK_STR(d.reservation, directive(text, "reservation", buf, sizeof(buf)));
    /* The GPUs, then each --gres item with "gres:" before it (sbatch's
     * gres_prepend_tres_type). */
    CHECK_STR(directive(text, "gres", buf, sizeof(buf)), "nvme:1,gres:tmp:ssd:2");
    CHECK_STR(d.tres_per_node, "gres:gpu:4,gres:nvme:1,gres:tmp:ssd:2");
    CHECK_STR(d.dependency, directive(text, "dependency", buf, sizeof(buf)));
    CHECK_EQ(slurmlib_parse_begin(directive(text, "begin", buf, sizeof(buf)), &t, &serr), 0);
    CHECK_EQ(d.begin_time, (time_t)t);
    CHECK(strstr(text, "\n#SBATCH --hold\n") && d.priority == 0);
    CHECK_STR(d.comment, directive(text, "comment", buf, sizeof(buf)));
    CHECK_STR(d.comment, "gpurun: ablation 3, lr 3e-4");
    CHECK_EQ(d.mail_type, (unsigned)slurmopt_parse_mail_type(
                              directive(text, "mail-type", buf, sizeof(buf)), bad, sizeof(bad)));
    CHECK_EQ(d.mail_type, MAIL_JOB_END | MAIL_JOB_FAIL | MAIL_JOB_TIME90);
    CHECK_STR(d.mail_user, directive(text, "mail-user", buf, sizeof(buf)));
    CHECK(!strstr(text, "scontrol requeue"));
    free(text);

    /* --requeue, and --max-requeues: the script requeues a checkpointed job N times at most,
     * and a requeued job's output goes on in its file. */
    job.requeue = true;
    job.max_requeues = 3;
    text = render_ok(&job);
    slurmlib_fill_desc(&job, text, env, 2, &d);
    CHECK(strstr(text, "\n#SBATCH --requeue\n") && d.requeue == 1);
    CHECK(strstr(text, "\n#SBATCH --open-mode=append\n") && d.open_mode == OPEN_MODE_APPEND);
    CHECK_CONTAINS(text, "[ \"$requeues\" -lt 3 ]");
    CHECK_CONTAINS(text, "    scontrol requeue \"$SLURM_JOB_ID\"");
    free(text);

    /* The other memory options, and --exclusive's other forms. */
    job.mem_per = SLURMOPT_MEM_NODE;
    job.mem_mb = 1536;
    job.exclusive = SLURMOPT_EXCLUSIVE_USER;
    job.gres = NULL;
    text = render_ok(&job);
    slurmlib_fill_desc(&job, text, env, 2, &d);
    CHECK_EQ(slurmopt_parse_mem(directive(text, "mem", buf, sizeof(buf)), &mb), 0);
    CHECK_EQ(d.pn_min_memory, mb);
    CHECK_EQ(mb, 1536);
    CHECK(d.mem_per_tres == NULL);
    CHECK_STR(directive(text, "exclusive", buf, sizeof(buf)), "user");
    CHECK_EQ(d.shared, JOB_SHARED_USER);
    CHECK_STR(d.tres_per_node, "gres:gpu:4");
    free(text);
    job.mem_per = SLURMOPT_MEM_CPU;
    job.mem_mb = 2048;
    job.exclusive = SLURMOPT_EXCLUSIVE_MCS;
    text = render_ok(&job);
    slurmlib_fill_desc(&job, text, env, 2, &d);
    CHECK_EQ(slurmopt_parse_mem(directive(text, "mem-per-cpu", buf, sizeof(buf)), &mb), 0);
    CHECK_STR(buf, "2G");
    CHECK_EQ(d.pn_min_memory, mb | MEM_PER_CPU);
    CHECK_EQ(d.shared, JOB_SHARED_MCS);
    free(text);
    /* A GPU type: in the directive and the descriptor, as sbatch sends it. */
    job.gpu_type = "h100";
    text = render_ok(&job);
    slurmlib_fill_desc(&job, text, env, 2, &d);
    CHECK_STR(directive(text, "gpus-per-node", buf, sizeof(buf)), "h100:4");
    CHECK_STR(d.tres_per_node, "gres:gpu:h100:4");
    free(text);
    job.gpu_type = NULL;
    /* --gres without GPUs. */
    job.gpus_per_node = 0;
    job.gres = "gres:nvme:2";
    slurmlib_fill_desc(&job, "#!/bin/bash\n", env, 2, &d);
    CHECK_STR(d.tres_per_node, "gres:nvme:2");
    job = full_job();

    /* No GPUs, no limit, no signal: slurm_init_job_desc_msg's "unset" stays. */
    job.gpus_per_node = 0;
    job.time_limit_min = 0;
    job.signal_before_s = 0;
    job.partition = NULL;
    slurmlib_fill_desc(&job, "#!/bin/bash\n", env, 2, &d);
    CHECK(d.tres_per_node == NULL);
    CHECK_EQ(d.time_limit, NO_VAL);
    {
        job_desc_msg_t fresh;
        slurm_init_job_desc_msg(&fresh);
        CHECK_EQ(d.warn_signal, fresh.warn_signal);
        CHECK_EQ(d.warn_time, fresh.warn_time);
        /* None of sbatch's scheduling options: Slurm's defaults. */
        CHECK_EQ(d.pn_min_memory, fresh.pn_min_memory);
        CHECK_EQ(d.shared, fresh.shared);
        CHECK_EQ(d.priority, fresh.priority);
        CHECK_EQ(d.begin_time, fresh.begin_time);
        CHECK_EQ(d.mail_type, fresh.mail_type);
        CHECK(!d.qos && !d.mem_per_tres && !d.features && !d.dependency && !d.req_nodes &&
              !d.exc_nodes && !d.reservation && !d.mail_user);
        CHECK_STR(d.comment, "gpurun");
    }
    CHECK(d.partition == NULL);

    /* -t 0 (or UNLIMITED): no limit, INFINITE as sbatch's --time=0 asks. */
    job.time_limit_min = SBATCH_TIME_UNLIMITED;
    text = render_ok(&job);
    CHECK_STR(directive(text, "time", buf, sizeof(buf)), "UNLIMITED");
    slurmlib_fill_desc(&job, text, env, 2, &d);
    CHECK_EQ(d.time_limit, INFINITE);
    free(text);
}

TEST(slurm_hostlists_through_libslurm)
{
    char **names = NULL;
    int n = -1;

    CHECK_EQ(slurmlib_hostlist_expand("node[1-3],gpu07", &names, &n), 0);
    CHECK_EQ(n, 4);
    CHECK_STR(names[0], "node1");
    CHECK_STR(names[2], "node3");
    CHECK_STR(names[3], "gpu07");
    CHECK(names[4] == NULL);
    slurmlib_names_free(names);
    CHECK_EQ(slurmlib_hostlist_expand("a[01-02]", &names, &n), 0);
    CHECK_EQ(n, 2);
    CHECK_STR(names[1], "a02");
    slurmlib_names_free(names);
}
#endif

/* --- states, statuses, ids ----------------------------------------------------------------- */

TEST(slurm_exit_status_of_each_end)
{
    static const struct {
        enum slurmlib_state state;
        int code, sig, want;
    } cases[] = {
        {SLURMLIB_COMPLETED, 0, 0, 0},     {SLURMLIB_FAILED, 3, 0, 3},
        {SLURMLIB_FAILED, 0, 0, 125},      {SLURMLIB_FAILED, -1, 9, 137},
        {SLURMLIB_CANCELLED, -1, 15, 143}, {SLURMLIB_CANCELLED, 0, 0, 143},
        {SLURMLIB_CANCELLED, 7, 0, 7},     {SLURMLIB_TIMEOUT, 0, 15, 124},
        {SLURMLIB_OOM, 0, 0, 137},         {SLURMLIB_NODE_FAIL, 0, 0, 125},
        {SLURMLIB_BOOT_FAIL, 0, 0, 125},   {SLURMLIB_PREEMPTED, 0, 0, 125},
        {SLURMLIB_DEADLINE, 0, 0, 125},
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct slurmlib_job j = {
            .state = cases[i].state, .exit_code = cases[i].code, .exit_signal = cases[i].sig};
        int got = slurmlib_exit_status(&j);
        if (got != cases[i].want)
            test_fail(__FILE__, __LINE__, "%s code %d signal %d: %d, not %d",
                      slurmlib_state_name(cases[i].state), cases[i].code, cases[i].sig, got,
                      cases[i].want);
    }
    CHECK_STR(slurmlib_state_name(SLURMLIB_NODE_FAIL), "NODE_FAIL");
    CHECK_STR(slurmlib_state_name(SLURMLIB_STATE_COUNT), "UNKNOWN");
}

/* slurmstepd's word of a cancel leaves gpurun --wait's stream (its own last line says it);
 * one that says why, and every other line, stays. */
TEST(slurm_follow_leaves_out_the_cancel_line)
{
    static const struct {
        const char *line;
        bool noise;
    } cases[] = {
        {"slurmstepd-node1: error: *** JOB 6 ON node1 CANCELLED AT 2026-12-01T23:41:09 ***", true},
        {"slurmstepd-node1: error: *** STEP 6.0 ON node1 CANCELLED AT 2026-12-01T23:41:09 ***",
         true},
        {"slurmstepd: error: *** JOB 12 ON gpu7 CANCELLED AT 2026-12-01T23:41:09 ***", true},
        {"slurmstepd-node1: error: *** JOB 6 ON node1 CANCELLED AT 2026-12-01T23:41:09 DUE TO "
         "TIME LIMIT ***",
         false},
        {"slurmstepd-node1: error: *** JOB 6 ON node1 CANCELLED AT 2026-12-01T23:41:09 ***x",
         false},
        {"[0] slurmstepd-node1: error: *** JOB 6 ON node1 CANCELLED AT 2026-12-01T23:41:09 ***",
         false},
        {"slurmstepd-node1: error: Detected 1 oom_kill event in StepId=6.0", false},
        {"slurmstepd-node1: error: *** JOB 6 ON node1 CANCELLED AT  ***", false},
        {"slurmstepd", false},
        {"", false},
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        if (follow_slurm_noise(cases[i].line, strlen(cases[i].line)) != cases[i].noise)
            test_fail(__FILE__, __LINE__, "'%s': %s, not %s", cases[i].line,
                      cases[i].noise ? "kept" : "left out", cases[i].noise ? "left out" : "kept");
}

TEST(slurm_job_ids)
{
    static const char *const bad[] = {"",    "0",   "-1",         "12a",         "1_2",
                                      "3+0", " 12", "4294967294", "99999999999", "local-1"};
    uint32_t id = 0;

    CHECK_EQ(slurmlib_parse_id("1", &id), 0);
    CHECK_EQ(id, 1);
    CHECK_EQ(slurmlib_parse_id("4294967293", &id), 0);
    CHECK_EQ(id, 4294967293u);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        if (slurmlib_parse_id(bad[i], &id) == 0)
            test_fail(__FILE__, __LINE__, "'%s' taken as job id %u", bad[i], id);
}

TEST(slurm_conf_path)
{
    char buf[PATH_MAX], conf[PATH_MAX];

    snprintf(conf, sizeof(conf), "%s/slurm.conf", test_tmpdir());
    setenv("SLURM_CONF", conf, 1);
    CHECK_EQ(slurmlib_conf_path(buf, sizeof(buf)), -ENOENT);
    CHECK_STR(buf, conf);
    close(open(conf, O_WRONLY | O_CREAT, 0644));
    CHECK_EQ(slurmlib_conf_path(buf, sizeof(buf)), 0);
    unsetenv("SLURM_CONF");
    slurmlib_conf_path(buf, sizeof(buf));
    CHECK_STR(buf, "/etc/slurm/slurm.conf");
}

/* A missing slurm.conf is one error, at once, and libslurm is never called. */
TEST(slurm_open_without_configuration)
{
    struct errmsg err;
    char conf[PATH_MAX];

    snprintf(conf, sizeof(conf), "%s/none.conf", test_tmpdir());
    setenv("SLURM_CONF", conf, 1);
#ifdef GPURUN_NO_LIBSLURM
    CHECK_EQ(slurmlib_open(3, &err), -ENOSYS);
#else
    CHECK_EQ(slurmlib_open(3, &err), -ENOENT);
    CHECK_CONTAINS(err.text, "no Slurm configuration: SLURM_CONF names '");
    CHECK_CONTAINS(err.text, "none.conf', which does not exist");
#endif
}

/* --- the status view ----------------------------------------------------------------------- */

static void write_text(const char *dir, const char *name, const char *text)
{
    char path[PATH_MAX];
    FILE *f;

    snprintf(path, sizeof(path), "%s/%s", dir, name);
    f = fopen(path, "w");
    CHECK(f != NULL);
    fputs(text, f);
    fclose(f);
}

TEST(slurm_view_bar_and_durations)
{
    char buf[128];

    view_bar(buf, sizeof(buf), 25, 100);
    CHECK_STR(buf, "[##########..............................]  25% (25/100)");
    view_bar(buf, sizeof(buf), 0, 10);
    CHECK_STR(buf, "[........................................]   0% (0/10)");
    view_bar(buf, sizeof(buf), 12, 10);
    CHECK_STR(buf, "[########################################] 100% (12/10)");
    view_bar(buf, sizeof(buf), 5, 0);
    CHECK_STR(buf, "-");
    view_duration(buf, sizeof(buf), 3723);
    CHECK_STR(buf, "1:02:03");
    view_duration(buf, sizeof(buf), 2 * 86400 + 5);
    CHECK_STR(buf, "2-00:00:05");
    view_duration(buf, sizeof(buf), -1);
    CHECK_STR(buf, "-");
}

/* A job's elapsed time from its job dir: start to end, or to now while it runs. */
TEST(slurm_view_elapsed_of_a_job_slurm_does_not_know)
{
    CHECK_EQ(view_elapsed_s(1000.0, 1061.6, false, 5000.0), 62);
    CHECK_EQ(view_elapsed_s(1000.0, 0, true, 1075.9), 75);
    CHECK_EQ(view_elapsed_s(1000.0, 0, true, 999.0), 0); /* a clock set back */
    CHECK_EQ(view_elapsed_s(1000.0, 0, false, 5000.0), -1);
    CHECK_EQ(view_elapsed_s(0, 1061.0, false, 5000.0), -1);
    CHECK_EQ(view_elapsed_s(1000.0, 900.0, false, 5000.0), -1);
}

/* The total steps of the progress are the ranks' reported total_steps: not the train.cfg's
 * [train] steps of a gpurun-train job (which may have been edited since the start), and none
 * where no rank reported one. */
TEST(slurm_view_total_steps_are_the_ranks_reports)
{
    const char *t = test_tmpdir();
    struct view_input in = {.job_id = "local-1", .job_dir = t, .timeout_ms = 100};
    char text[2 * PATH_MAX];
    json_t *v;

    write_text(t, "run.cfg", "[train]\nsteps = 50\n");
    snprintf(text, sizeof(text),
             "{\"job_id\": \"local-1\", \"argv\": [\"/opt/bin/gpurun-train\", \"%s/run.cfg\", "
             "\"train.steps=70\"]}",
             t);
    write_text(t, "job.json", text);
    write_text(t, "summary.json",
               "{\"job_id\": \"local-1\", \"outcome\": \"completed\", \"exit_status\": 0,"
               " \"ranks\": [{\"rank\": 0, \"node\": 0, \"phase\": \"exited\", \"step\": 20,"
               "              \"total_steps\": 80},"
               "             {\"rank\": 1, \"node\": 0, \"phase\": \"exited\", \"step\": 20,"
               "              \"total_steps\": 80}]}");
    v = view_build(&in);
    CHECK(v != NULL);
    CHECK_EQ(json_integer_value(json_object_get(json_object_get(v, "progress"), "steps_total")),
             80);
    json_decref(v);

    /* No rank reported a total: none, whatever the train.cfg says. */
    write_text(t, "summary.json",
               "{\"job_id\": \"local-1\", \"outcome\": \"completed\", \"exit_status\": 0,"
               " \"ranks\": [{\"rank\": 0, \"node\": 0, \"phase\": \"exited\", \"step\": 20,"
               "              \"total_steps\": 0}]}");
    v = view_build(&in);
    CHECK(v != NULL);
    CHECK(json_is_null(json_object_get(json_object_get(v, "progress"), "steps_total")));
    CHECK(!json_object_get(json_object_get(v, "progress"), "eta_s"));
    json_decref(v);
}

/* An ended Slurm job: Slurm's state and status, the summary's failure and ranks, the
 * timings from the job dir's files; and the text made of it. */
TEST(slurm_view_of_an_ended_job)
{
    const char *t = test_tmpdir();
    char *nodes[] = {(char *)"node1", (char *)"node2", NULL};
    struct slurmlib_job sj = {.id = 12,
                              .name = (char *)"tiny",
                              .partition = (char *)"debug",
                              .nodelist = (char *)"node[1-2]",
                              .nodes = nodes,
                              .n_nodes = 2,
                              .state = SLURMLIB_FAILED,
                              .ended = true,
                              .submit_time = 1000,
                              .start_time = 1002,
                              .end_time = 1010,
                              .elapsed_s = 8,
                              .time_limit_min = 10,
                              .exit_code = 3};
    struct view_input in = {.job_id = "12", .slurm = &sj, .job_dir = t, .timeout_ms = 100};
    json_t *v;
    char *buf = NULL;
    size_t len = 0;
    FILE *f;

    write_text(t, "key", "k");
    write_text(t, "endpoint.json", "{\"host\": \"127.0.0.1\", \"port\": 1, \"pid\": 1}");
    write_text(
        t, "summary.json",
        "{\"job_id\": \"12\", \"outcome\": \"failed\", \"exit_status\": 3,"
        " \"nodes\": [{\"node\": 0, \"hostname\": \"node1\", \"hb_age_ms\": 5},"
        "             {\"node\": 1, \"hostname\": \"node2\", \"hb_age_ms\": 7}],"
        " \"ranks\": [{\"rank\": 0, \"node\": 0, \"phase\": \"exited\", \"step\": 7,"
        "              \"loss\": 2.5, \"signal\": 15, \"killed\": true},"
        "             {\"rank\": 1, \"node\": 1, \"phase\": \"exited\", \"step\": 5,"
        "              \"loss\": 2.75, \"code\": 3}],"
        " \"first_failure\": {\"rank\": 1, \"node\": 1, \"hostname\": \"node2\","
        "     \"code\": 3, \"signal\": 0, \"cause\": \"exit\", \"tail\": \"boom\\nbang\"},"
        " \"timings\": {\"rendezvous_ms\": 20, \"first_step_ms\": 120, \"total_ms\": 1500}}");
    v = view_build(&in);
    CHECK(v != NULL);
    CHECK_STR(json_string_value(json_object_get(v, "state")), "FAILED");
    CHECK(view_ended(v));
    CHECK_EQ(json_integer_value(json_object_get(v, "exit_status")), 3);
    CHECK(json_is_null(json_object_get(v, "live")));
    CHECK_EQ(json_integer_value(json_object_get(json_object_get(v, "first_failure"), "rank")), 1);
    {
        json_t *p = json_object_get(v, "progress");
        CHECK_EQ(json_integer_value(json_object_get(p, "exited")), 2);
        CHECK_EQ(json_integer_value(json_object_get(p, "step_min")), 5);
        CHECK_EQ(json_integer_value(json_object_get(p, "step_max")), 7);
        CHECK(json_real_value(json_object_get(p, "loss_mean")) == 2.625);
    }
    {
        json_t *d = json_object_get(json_object_get(v, "timings"), "durations");
        CHECK(json_real_value(json_object_get(d, "queued_s")) == 2.0);
        CHECK(json_real_value(json_object_get(d, "rendezvous_s")) > 0.0199 &&
              json_real_value(json_object_get(d, "rendezvous_s")) < 0.0201);
        CHECK(json_real_value(json_object_get(d, "run_s")) > 1.4999 &&
              json_real_value(json_object_get(d, "run_s")) < 1.5001);
    }
    CHECK_EQ(json_integer_value(json_object_get(json_object_get(v, "slurm"), "time_limit_s")), 600);

    f = open_memstream(&buf, &len);
    view_print(f, v);
    fclose(f);
    CHECK(!strncmp(buf,
                   "job: 12 (tiny)\nstate: FAILED, exit status 3\noutcome: failed\n"
                   "nodes: node[1-2] (2)\nelapsed: 0:00:08, time limit 0:10:00\n",
                   strlen("job: 12 (tiny)\nstate: FAILED, exit status 3\noutcome: failed\n"
                          "nodes: node[1-2] (2)\nelapsed: 0:00:08, time limit 0:10:00\n")));
    /* The cause, said once (it names the rank, node and host itself). */
    CHECK_CONTAINS(buf, "first failure: exit\n"
                        "last lines of its log:\n  boom\n  bang\n");
    CHECK_CONTAINS(buf, "timings: queued 2 s, ");
    CHECK_CONTAINS(buf,
                   "rank  node  host   phase   step  loss    tokens/s  heartbeat  report  output  "
                   "exit\n");
    /* tokens/s: these ranks never reported one ("-", not 0); no output known, no last line. */
    CHECK_CONTAINS(buf, "\n0     0     node1  exited  7     2.5000  -         0.0s       -       "
                        "-       signal 15 (torn down)\n");
    CHECK_CONTAINS(buf, "\n1     1     node2  exited  5     2.7500  -         0.0s       -       "
                        "-       exit 3\n");
    free(buf);
    json_decref(v);
}

/* The batch script's start from summary.json (to the ms) where it says it, before the key's
 * file time (the kernel's tick). */
TEST(slurm_view_script_start_from_summary)
{
    const char *t = test_tmpdir();
    struct view_input in = {.job_id = "13", .job_dir = t, .timeout_ms = 100};
    struct timespec now;
    char text[256];
    long long ms;
    json_t *v, *at, *d;

    clock_gettime(CLOCK_REALTIME, &now);
    ms = (long long)now.tv_sec * 1000 + now.tv_nsec / 1000000 - 2500;
    write_text(t, "key", "k");
    write_text(t, "endpoint.json", "{\"host\": \"127.0.0.1\", \"port\": 1, \"pid\": 1}");
    snprintf(text, sizeof(text),
             "{\"job_id\": \"13\", \"outcome\": \"completed\", \"exit_status\": 0,"
             " \"timings\": {\"rendezvous_ms\": 3, \"first_step_ms\": -1, \"total_ms\": 9,"
             " \"script_started_ms\": %lld}}",
             ms);
    write_text(t, "summary.json", text);
    v = view_build(&in);
    CHECK(v != NULL);
    at = json_object_get(v, "timings");
    d = json_object_get(at, "durations");
    CHECK(json_real_value(json_object_get(at, "script_started")) == (double)ms / 1000.0);
    /* endpoint.json was written just now: the daemons came up 2.5 s after the script. */
    CHECK(json_real_value(json_object_get(d, "startup_s")) > 2.45 &&
          json_real_value(json_object_get(d, "startup_s")) < 2.6);
    json_decref(v);
}

/* A pending Slurm job: no job dir yet, the reason shown. */
TEST(slurm_view_of_a_pending_job)
{
    struct slurmlib_job sj = {.id = 5,
                              .name = (char *)"big",
                              .reason = (char *)"Resources",
                              .n_nodes = 4,
                              .state = SLURMLIB_PENDING,
                              .submit_time = 1000,
                              .exit_code = -1};
    struct view_input in = {.job_id = "5", .slurm = &sj};
    json_t *v = view_build(&in), *views = json_array();
    char *buf = NULL;
    size_t len = 0;
    FILE *f;

    CHECK_STR(json_string_value(json_object_get(v, "state")), "PENDING");
    CHECK(!view_ended(v));
    CHECK(json_is_null(json_object_get(v, "exit_status")));
    CHECK(json_is_null(json_object_get(v, "progress")));
    f = open_memstream(&buf, &len);
    view_print(f, v);
    fclose(f);
    CHECK_CONTAINS(buf, "state: PENDING (Resources)\nnodes: 4 asked for\n");
    free(buf);
    json_array_append(views, v);
    buf = NULL;
    f = open_memstream(&buf, &len);
    view_print_list(f, views);
    fclose(f);
    CHECK_STR(buf, "jobid  name  state    nodes  elapsed  nodelist(reason)\n"
                   "5      big   PENDING  4      0:00:00  (Resources)\n");
    free(buf);
    json_decref(views);
    json_decref(v);
}

/* --- logs -f ------------------------------------------------------------------------------- */

static void append_text(const char *dir, const char *name, const char *text)
{
    char path[PATH_MAX];
    FILE *f;

    snprintf(path, sizeof(path), "%s/%s", dir, name);
    f = fopen(path, "a");
    CHECK(f != NULL);
    fputs(text, f);
    fclose(f);
}

struct follow_script {
    const char *dir;
    int calls;
};

/* The job, one step per poll: logs/ appears with a line and a half; the half line ends and
 * two more ranks appear (10 sorts after 1); then a last line without its newline, and the
 * job ends. */
static bool follow_step(void *arg)
{
    struct follow_script *s = arg;
    char logs[PATH_MAX];

    switch (s->calls++) {
    case 0:
        return false;
    case 1:
        snprintf(logs, sizeof(logs), "%s/logs", s->dir);
        CHECK_EQ(mkdir(logs, 0700), 0);
        append_text(s->dir, "logs/rank-0.log", "a0\nb0 part");
        return false;
    case 2:
        append_text(s->dir, "logs/rank-0.log", "ial\n");
        append_text(s->dir, "logs/rank-10.log", "x\n");
        append_text(s->dir, "logs/rank-1.log", "a1\n");
        return false;
    default:
        append_text(s->dir, "logs/rank-1.log", "tail without newline");
        return true;
    }
}

TEST(slurm_logs_follow)
{
    struct follow_script s = {.dir = test_tmpdir()};
    struct errmsg err;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);

    CHECK_EQ(logs_follow(f, s.dir, -1, follow_step, &s, &err), 0);
    fclose(f);
    CHECK_EQ(s.calls, 4);
    CHECK_STR(buf, "[0] a0\n[0] b0 partial\n[1] a1\n[10] x\n[1] tail without newline\n");
    free(buf);

    /* One rank: its log as written (the job appended to its unended line), the last line
     * ended. */
    buf = NULL;
    f = open_memstream(&buf, &len);
    s.calls = 3;
    CHECK_EQ(logs_follow(f, s.dir, 1, follow_step, &s, &err), 0);
    fclose(f);
    CHECK_STR(buf, "a1\ntail without newlinetail without newline\n");
    free(buf);
}
