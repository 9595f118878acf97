/* Tests of the gpurun client's modules: the option table and its messages, Slurm time
 * limits, job dir creation (modes and job.json), command lookup, the exit status rules, the
 * log and status printers, and the launcher and status query against the real rendezvousd
 * (skipped where it is not built). */
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

#include "../client/args.h"
#include "../client/jobdir.h"
#include "../client/local.h"
#include "../client/logs.h"
#include "../client/python.h"
#include "../client/status.h"
#include "auth.h"
#include "fsutil.h"
#include "jobspec.h"
#include "test.h"
#include "banned.h"

/* --- helpers ------------------------------------------------------------------------------- */

#define MAX_ARGV 64

/* Parses a NULL-terminated list of words as gpurun's argv[1..]. The words are string
 * literals, which outlive args as args_parse() requires. */
static int parse(struct gpurun_args *args, struct errmsg *err, const char *const *words)
{
    static char *argv[MAX_ARGV];
    int argc = 0;

    argv[argc++] = (char *)"gpurun";
    for (; *words && argc < MAX_ARGV - 1; words++)
        argv[argc++] = (char *)*words;
    argv[argc] = NULL;
    args_init(args);
    memset(err, 0, sizeof(*err));
    return args_parse(args, argc, argv, err);
}

#define WORDS(...) ((const char *const[]){__VA_ARGS__, NULL})

/* Writes "dir/name" to out (n bytes); a path that does not fit fails the test. */
static void join(char *out, size_t n, const char *dir, const char *name)
{
    if (snprintf(out, n, "%s/%s", dir, name) >= (int)n)
        test_fail(__FILE__, __LINE__, "path '%s/%s' too long", dir, name);
}

/* "dir/name" in static storage, overwritten by the next call. */
static char *path_in(const char *dir, const char *name)
{
    static char buf[PATH_MAX];

    join(buf, sizeof(buf), dir, name);
    return buf;
}

static int mode_of(const char *path)
{
    struct stat st;

    if (stat(path, &st) < 0)
        return -1;
    return (int)(st.st_mode & 07777);
}

static void write_file(const char *path, const char *text, mode_t mode)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, mode);

    CHECK(fd >= 0);
    CHECK_EQ(write(fd, text, strlen(text)), (long long)strlen(text));
    CHECK_EQ(fchmod(fd, mode), 0);
    close(fd);
}

/* A FILE whose output lands in *buf (new: free it after fclose). */
static void capture_begin(FILE **f, char **buf, size_t *len)
{
    *f = open_memstream(buf, len);
    CHECK(*f != NULL);
}

static const char *rendezvousd_or_skip(void)
{
    const char *p = test_build_path("rendezvousd");

    if (access(p, X_OK) < 0)
        test_skip("'%s' is not built", p);
    return p;
}

/* --- the option table ---------------------------------------------------------------------- */

TEST(cli_args_defaults)
{
    struct gpurun_args a;
    struct errmsg err;
    struct jobspec def;

    jobspec_init(&def);
    CHECK_EQ(parse(&a, &err, WORDS("--local", "--", "true")), 0);
    CHECK_EQ(a.cmd, CMD_RUN);
    CHECK_EQ(a.spec.nnodes, 1);
    CHECK_EQ(a.spec.nprocs, 1);
    CHECK_EQ(a.spec.join_timeout_ms, def.join_timeout_ms);
    CHECK_EQ(a.spec.hb_interval_ms, def.hb_interval_ms);
    CHECK_EQ(a.spec.hb_timeout_ms, 10 * def.hb_interval_ms);
    CHECK_EQ(a.spec.kill_grace_ms, def.kill_grace_ms);
    CHECK_EQ(a.spec.hang_timeout_ms, def.hang_timeout_ms);
    CHECK_EQ(a.time_limit_s, 0);
    CHECK(a.local);
    CHECK(!a.help && !a.version && !a.json && !a.wait && !a.emit_sbatch && !a.no_gpus);
    CHECK_EQ(a.cpus_per_gpu, 1);
    CHECK_EQ(a.spec.max_restarts, 0);
    /* Pre-flight: a GPU with less than 90% of its memory free fails (a leftover process). */
    CHECK_EQ(a.spec.min_gpu_free_pct, 90);
    CHECK_EQ(a.spec.min_gpu_free_pct, def.min_gpu_free_pct);
    CHECK(args_given(&a, "local") && !args_given(&a, "nodes"));
    CHECK(a.job_dir == NULL && a.output == NULL && a.target == NULL);
    CHECK_STR(a.log_level_name, "warn");
    CHECK_EQ(a.cmd_argc, 1);
    CHECK_STR(a.cmd_argv[0], "true");
    CHECK(a.cmd_argv[1] == NULL);
    CHECK(a.spec.env == NULL);
    CHECK(a.script == NULL);
    /* Every rank sees all of its node's GPUs, as under torchrun; the pre-timeout signal only
     * reaches the ranks that ask for it. */
    CHECK_EQ(a.spec.gpu_bind, GPU_BIND_NONE);
    CHECK_EQ(a.spec.preempt_signal, def.preempt_signal);
    CHECK_EQ(a.spec.preempt_all, 0);
    CHECK(a.signal.text == NULL);
    CHECK_EQ(a.signal.sig, 0);
    /* None of sbatch's own options: Slurm's defaults. */
    CHECK(!a.qos && !a.constraint && !a.dependency && !a.nodelist && !a.exclude && !a.reservation &&
          !a.gres && !a.begin && !a.chdir && !a.comment && !a.mail_user);
    CHECK_EQ(a.mem_per, SLURMOPT_MEM_NONE);
    CHECK_EQ(a.exclusive, SLURMOPT_SHARED_DEFAULT);
    CHECK(!a.hold && a.mail_type == 0);
    CHECK(args_slurm_only_given(&a) == NULL);
    args_release(&a);
    jobspec_release(&def);
}

TEST(cli_args_every_run_option)
{
    struct gpurun_args a;
    struct errmsg err;
    int r = parse(&a, &err,
                  WORDS("-N", "3", "--gpus-per-node=4", "-t", "1:30", "-p", "gpu", "-A", "proj",
                        "-J", "tiny", "-o", "out.txt", "--local", "--job-dir", "/tmp/j",
                        "--hang-timeout", "60", "--kill-grace=0.25", "--heartbeat", "0.5",
                        "--join-timeout", "12.5", "--export", "A=1", "--export=B=x=y",
                        "--log-level", "debug", "--max-restarts", "2", "--cpus-per-gpu", "3",
                        "--no-gpus", "--wait", "--emit-sbatch", "--", "prog", "--nodes", "x"));

    CHECK_EQ(r, 0);
    CHECK_EQ(a.spec.nnodes, 3);
    CHECK_EQ(a.spec.nprocs, 4);
    CHECK_EQ(a.time_limit_s, 90);
    CHECK_STR(a.partition, "gpu");
    CHECK_STR(a.account, "proj");
    CHECK_STR(a.job_name, "tiny");
    CHECK_STR(a.output, "out.txt");
    CHECK(a.local);
    CHECK_STR(a.job_dir, "/tmp/j");
    CHECK_EQ(a.spec.hang_timeout_ms, 60000);
    CHECK_EQ(a.spec.kill_grace_ms, 250);
    CHECK_EQ(a.spec.hb_interval_ms, 500);
    CHECK_EQ(a.spec.hb_timeout_ms, 5000); /* ten heartbeats */
    CHECK_EQ(a.spec.join_timeout_ms, 12500);
    CHECK_STR(a.spec.env[0], "A=1");
    CHECK_STR(a.spec.env[1], "B=x=y");
    CHECK(a.spec.env[2] == NULL);
    CHECK_EQ(a.log_level, LOG_DEBUG);
    CHECK_STR(a.log_level_name, "debug");
    CHECK_EQ(a.spec.max_restarts, 2);
    CHECK_EQ(a.cpus_per_gpu, 3);
    CHECK(a.no_gpus && a.wait && a.emit_sbatch);
    CHECK(args_given(&a, "nodes") && args_given(&a, "time") && args_given(&a, "no-gpus"));
    CHECK(!args_given(&a, "help") && !args_given(&a, "bogus"));
    /* Everything after "--" is the command's, options included. */
    CHECK_EQ(a.cmd_argc, 3);
    CHECK_STR(a.cmd_argv[0], "prog");
    CHECK_STR(a.cmd_argv[1], "--nodes");
    CHECK_STR(a.cmd_argv[2], "x");
    args_release(&a);
}

TEST(cli_args_short_forms_and_last_wins)
{
    struct gpurun_args a;
    struct errmsg err;

    CHECK_EQ(parse(&a, &err, WORDS("-N2", "-t5", "-N", "4", "-h")), 0);
    CHECK_EQ(a.spec.nnodes, 4);
    CHECK_EQ(a.time_limit_s, 300);
    CHECK(a.help);
    args_release(&a);
}

TEST(cli_args_heartbeat_timeout)
{
    struct gpurun_args a;
    struct errmsg err;

    CHECK_EQ(parse(&a, &err, WORDS("--heartbeat-timeout", "3", "--heartbeat", "0.1")), 0);
    CHECK_EQ(a.spec.hb_interval_ms, 100);
    CHECK_EQ(a.spec.hb_timeout_ms, 3000);
    args_release(&a);
    /* Ten beats of 600 s would pass the timeout's range: it is clamped to the range. */
    CHECK_EQ(parse(&a, &err, WORDS("--heartbeat", "600")), 0);
    CHECK_EQ(a.spec.hb_timeout_ms, 3600000);
    args_release(&a);
    CHECK_EQ(parse(&a, &err, WORDS("--heartbeat", "2", "--heartbeat-timeout", "2")), -EINVAL);
    CHECK_STR(err.text, "--heartbeat-timeout: 2 seconds is not longer than the heartbeat (2)");
    args_release(&a);
}

/* Pre-flight's thresholds go to the job spec that every node's agent reads. */
TEST(cli_args_preflight_thresholds)
{
    struct gpurun_args a;
    struct errmsg err;

    CHECK_EQ(parse(&a, &err, WORDS("--min-gpu-free=50", "--min-free", "128", "--", "true")), 0);
    CHECK_EQ(a.spec.min_gpu_free_pct, 50);
    CHECK_EQ(a.spec.min_free_mb, 128);
    args_release(&a);
    /* 0: the GPUs' memory is not checked. */
    CHECK_EQ(parse(&a, &err, WORDS("--min-gpu-free", "0", "--", "true")), 0);
    CHECK_EQ(a.spec.min_gpu_free_pct, 0);
    CHECK(args_given(&a, "min-gpu-free"));
    args_release(&a);
}

/* sbatch's options, with sbatch's spelling: long and short. */
TEST(cli_args_sbatch_options)
{
    struct gpurun_args a;
    struct errmsg err;

    CHECK_EQ(parse(&a, &err,
                   WORDS("--qos", "high", "--mem-per-gpu", "80G", "--exclusive", "--constraint",
                         "a100&ib", "--dependency=afterok:12:13", "--nodelist", "node[1-2]",
                         "--exclude=node3", "--reservation", "maint", "--gres", "nvme:1", "--begin",
                         "now+1hour", "--hold", "--chdir", "/tmp", "--comment", "my run",
                         "--mail-type", "END,FAIL", "--mail-user", "me@x", "--", "true")),
             0);
    CHECK_STR(a.qos, "high");
    CHECK_EQ(a.mem_per, SLURMOPT_MEM_GPU);
    CHECK_EQ(a.mem_mb, 80 * 1024);
    CHECK_EQ(a.exclusive, SLURMOPT_EXCLUSIVE);
    CHECK_STR(a.constraint, "a100&ib");
    CHECK_STR(a.dependency, "afterok:12:13");
    CHECK_STR(a.nodelist, "node[1-2]");
    CHECK_STR(a.exclude, "node3");
    CHECK_STR(a.reservation, "maint");
    CHECK_STR(a.gres, "nvme:1");
    CHECK_STR(a.begin, "now+1hour");
    CHECK(a.hold);
    CHECK_STR(a.chdir, "/tmp");
    CHECK_STR(a.comment, "my run");
    CHECK_EQ(a.mail_type, SLURMOPT_MAIL_END | SLURMOPT_MAIL_FAIL);
    CHECK_STR(a.mail_type_text, "END,FAIL");
    CHECK_STR(a.mail_user, "me@x");
    CHECK_STR(args_slurm_only_given(&a), "qos");
    args_release(&a);

    /* The short forms; -w is --nodelist for a run and --watch for status. */
    CHECK_EQ(parse(&a, &err,
                   WORDS("-q", "low", "-C", "ib", "-d", "singleton", "-w", "node1", "-xnode2", "-H",
                         "-D", "/", "--exclusive=user", "--mem", "0", "--", "true")),
             0);
    CHECK_STR(a.qos, "low");
    CHECK_STR(a.constraint, "ib");
    CHECK_STR(a.dependency, "singleton");
    CHECK_STR(a.nodelist, "node1");
    CHECK_STR(a.exclude, "node2");
    CHECK(a.hold && !a.watch);
    CHECK_STR(a.chdir, "/");
    CHECK_EQ(a.exclusive, SLURMOPT_EXCLUSIVE_USER);
    CHECK_EQ(a.mem_per, SLURMOPT_MEM_NODE);
    CHECK_EQ(a.mem_mb, 0);
    args_release(&a);
    CHECK_EQ(parse(&a, &err, WORDS("status", "-w", "12")), 0);
    CHECK(a.watch && !a.nodelist);
    args_release(&a);
    CHECK_EQ(parse(&a, &err, WORDS("--mem-per-cpu=1536", "--exclusive=mcs", "--", "true")), 0);
    CHECK_EQ(a.mem_per, SLURMOPT_MEM_CPU);
    CHECK_EQ(a.mem_mb, 1536);
    CHECK_EQ(a.exclusive, SLURMOPT_EXCLUSIVE_MCS);
    CHECK(args_slurm_only_given(&a) != NULL);
    args_release(&a);
    /* Neither --chdir nor the rest of the local options is Slurm's alone. */
    CHECK_EQ(parse(&a, &err, WORDS("--local", "-D", "/", "-N", "2", "--", "true")), 0);
    CHECK(args_slurm_only_given(&a) == NULL);
    args_release(&a);
}

/* The environment of args_apply_env's tests: NAME=VALUE words. */
#define ENV(...) ((char *const[]){__VA_ARGS__, NULL})

/* sbatch's input variables: where no flag gives the option, with the flag's checks, and
 * errors that name the variable. */
TEST(cli_args_sbatch_variables)
{
    struct gpurun_args a;
    struct errmsg err;

    CHECK_EQ(parse(&a, &err, WORDS("-p", "gpu", "--", "true")), 0);
    CHECK_EQ(args_apply_env(
                 &a,
                 ENV("SBATCH_PARTITION=nope", "SBATCH_ACCOUNT=proj", "SBATCH_QOS=high",
                     "SBATCH_TIMELIMIT=1:30:00", "SBATCH_EXCLUSIVE=user", "SBATCH_CONSTRAINT=ib",
                     "SBATCH_RESERVATION=maint", "SBATCH_GRES=nvme:1", "SBATCH_MEM_PER_CPU=2G",
                     "SBATCH_JOB_NAME=envname", "SBATCH_CPUS_PER_GPU=4", "SBATCH_GPUS_PER_NODE=2",
                     "SBATCH_OUTPUT=o.txt", "SBATCH_SIGNAL=B:USR2@90", "SBATCH_WAIT=0",
                     "SBATCH_HOLD=1", "SBATCH_PARTITIONS=x", "XSBATCH_QOS=y"),
                 &err),
             0);
    CHECK_STR(a.partition, "gpu"); /* the flag beats the variable */
    CHECK_STR(a.account, "proj");
    CHECK_STR(a.qos, "high");
    CHECK_EQ(a.time_limit_s, 5400);
    CHECK_EQ(a.exclusive, SLURMOPT_EXCLUSIVE_USER);
    CHECK_STR(a.constraint, "ib");
    CHECK_STR(a.reservation, "maint");
    CHECK_STR(a.gres, "nvme:1");
    CHECK_EQ(a.mem_per, SLURMOPT_MEM_CPU);
    CHECK_EQ(a.mem_mb, 2048);
    CHECK_STR(a.job_name, "envname");
    CHECK_EQ(a.cpus_per_gpu, 4);
    CHECK_EQ(a.spec.nprocs, 2);
    CHECK_STR(a.output, "o.txt");
    CHECK_EQ(a.signal.sig, SIGUSR2);
    CHECK_EQ(a.signal.time_s, 90);
    CHECK(a.wait);  /* a flag's variable sets it whatever its value, as sbatch's does */
    CHECK(!a.hold); /* sbatch documents no SBATCH_HOLD */
    /* A variable counts as given: it beats a train.cfg's [job] value. */
    CHECK(args_given(&a, "time") && args_given(&a, "account") && args_given(&a, "job-name"));
    CHECK(!args_given(&a, "nodes"));
    args_release(&a);

    /* SBATCH_GRES's GPUs count the ranks per node where nothing else did; its type goes to
     * Slurm, its other items as --gres. */
    CHECK_EQ(parse(&a, &err, WORDS("--", "true")), 0);
    CHECK_EQ(args_apply_env(&a, ENV("SBATCH_GRES=gpu:a100:2,nvme:1"), &err), 0);
    CHECK_EQ(a.spec.nprocs, 2);
    CHECK(args_given(&a, "gpus-per-node"));
    CHECK_STR(a.gpu_type, "a100");
    CHECK_STR(a.gres, "nvme:1");
    args_release(&a);
    CHECK_EQ(parse(&a, &err, WORDS("--gpus-per-node", "4", "--", "true")), 0);
    CHECK_EQ(args_apply_env(&a, ENV("SBATCH_GRES=gpu:2"), &err), 0);
    CHECK_EQ(a.spec.nprocs, 4);
    CHECK(a.gres == NULL);
    args_release(&a);

    /* A memory flag beats every memory variable; two memory variables exclude each other. */
    CHECK_EQ(parse(&a, &err, WORDS("--mem", "4G", "--", "true")), 0);
    CHECK_EQ(args_apply_env(&a, ENV("SBATCH_MEM_PER_GPU=1G", "SBATCH_MEM_PER_CPU=1G"), &err), 0);
    CHECK_EQ(a.mem_per, SLURMOPT_MEM_NODE);
    CHECK_EQ(a.mem_mb, 4096);
    args_release(&a);
    CHECK_EQ(parse(&a, &err, WORDS("--", "true")), 0);
    CHECK_EQ(args_apply_env(&a, ENV("SBATCH_MEM_PER_NODE=1G", "SBATCH_MEM_PER_GPU=1G"), &err),
             -EINVAL);
    CHECK_STR(err.text, "SBATCH_MEM_PER_GPU and SBATCH_MEM_PER_NODE are mutually exclusive (give "
                        "one, or --mem, --mem-per-cpu or --mem-per-gpu)");
    args_release(&a);

    {
        static const struct {
            const char *var, *msg;
        } bad[] = {
            {"SBATCH_MEM_PER_NODE=10X", "SBATCH_MEM_PER_NODE: '10X' is not a size (a whole "
                                        "number and K, M, G or T; M by default)"},
            {"SBATCH_TIMELIMIT=soon", "SBATCH_TIMELIMIT: 'soon' is not a time (minutes, MM:SS, "
                                      "HH:MM:SS or D-HH[:MM[:SS]])"},
            {"SBATCH_PARTITION=", "SBATCH_PARTITION: empty value"},
            {"SBATCH_EXCLUSIVE=1", "SBATCH_EXCLUSIVE: '1' is not exclusive, user or mcs"},
            {"SBATCH_GRES=gpu:a100:two",
             "SBATCH_GRES: 'gpu:a100:two': 'two' is not a number of GPUs"},
            {"SBATCH_GPUS_PER_NODE=a100:2", "SBATCH_GPUS_PER_NODE: 'a100:2' is not a number"},
            {"SBATCH_SIGNAL=FOO", "SBATCH_SIGNAL: 'FOO' is not a signal (a number 1..64, or a "
                                  "name such as USR1 or SIGUSR1)"},
            {"SBATCH_ARRAY_INX=0-3",
             "SBATCH_ARRAY_INX: '0-3' is refused: a gpurun job is one rendezvous of all its "
             "ranks, not an array of jobs; submit one gpurun per task instead (a shell loop, "
             "each with --export TASK=N)"},
        };
        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
            CHECK_EQ(parse(&a, &err, WORDS("--", "true")), 0);
            if (args_apply_env(&a, ENV((char *)bad[i].var), &err) != -EINVAL)
                test_fail(__FILE__, __LINE__, "'%s' taken", bad[i].var);
            CHECK_STR(err.text, bad[i].msg);
            args_release(&a);
        }
    }
}

struct bad_case {
    const char *const *words;
    const char *msg;
};

TEST(cli_args_refused_with_messages)
{
    const struct bad_case cases[] = {
        {WORDS("--nodes", "abc", "--", "true"), "--nodes: 'abc' is not a number"},
        {WORDS("-N", "0", "--", "true"), "--nodes: must be 1..65536"},
        {WORDS("-N", "65537"), "--nodes: must be 1..65536"},
        {WORDS("-N", "-3"), "--nodes: must be 1..65536"},
        {WORDS("-N", "99999999999999999999999"), "--nodes: must be 1..65536"},
        {WORDS("-N", "2x"), "--nodes: '2x' is not a number"},
        {WORDS("-N", " 2"), "--nodes: ' 2' is not a number"},
        {WORDS("-N", ""), "--nodes: '' is not a number"},
        {WORDS("--gpus-per-node", "1025"), "--gpus-per-node: must be 1..1024"},
        {WORDS("--frob"), "unknown option '--frob' (see 'gpurun --help')"},
        {WORDS("--frob=1"), "unknown option '--frob' (see 'gpurun --help')"},
        {WORDS("-Z"), "unknown option '-Z' (see 'gpurun --help')"},
        {WORDS("--nod", "2"), "unknown option '--nod' (see 'gpurun --help')"},
        {WORDS("--nodes"), "option '--nodes' needs a value"},
        {WORDS("-J", "--", "true"), "option '--job-name' needs a value"},
        {WORDS("-J", "--wait", "--", "true"),
         "option '--job-name' needs a value, and '--wait' looks like an option (for a value that "
         "starts with '-', write --job-name=--wait)"},
        {WORDS("--local=yes"), "option '--local' takes no value"},
        {WORDS("--heartbeat", "0"), "--heartbeat: must be 0.01..600 seconds"},
        {WORDS("--heartbeat", "1e3"), "--heartbeat: '1e3' is not a number of seconds"},
        {WORDS("--heartbeat", "-1"), "--heartbeat: '-1' is not a number of seconds"},
        {WORDS("--heartbeat", "1."), "--heartbeat: '1.' is not a number of seconds"},
        {WORDS("--kill-grace", "601"), "--kill-grace: must be 0..600 seconds"},
        {WORDS("--join-timeout", "99999999999999999999"),
         "--join-timeout: must be 0.01..86400 seconds"},
        {WORDS("-t", "abc"),
         "--time: 'abc' is not a time (minutes, MM:SS, HH:MM:SS or D-HH[:MM[:SS]])"},
        {WORDS("-t", "366-0"), "--time: must be at most 365 days (0: no limit)"},
        {WORDS("--export", "FOO"), "--export: 'FOO' is not NAME=VALUE"},
        {WORDS("--export", "=1"), "--export: '=1' is not NAME=VALUE"},
        {WORDS("--export", "A-B=1"), "--export: 'A-B=1' is not NAME=VALUE"},
        {WORDS("--export", "WORLD_SIZE=9"),
         "--export: 'WORLD_SIZE' is set by gpurun for every rank"},
        {WORDS("--log-level", "loud"), "--log-level: 'loud' is not error, warn, info or debug"},
        {WORDS("--job-dir", ""), "--job-dir: empty value"},
        {WORDS("--emit-sbatch=1"), "option '--emit-sbatch' takes no value"},
        {WORDS("--max-restarts", "1001"), "--max-restarts: must be 0..1000"},
        {WORDS("--min-gpu-free", "101"), "--min-gpu-free: must be 0..100"},
        {WORDS("--min-gpu-free", "-1"), "--min-gpu-free: must be 0..100"},
        {WORDS("--cpus-per-gpu", "0"), "--cpus-per-gpu: must be 1..1024"},
        {WORDS("train.steps=3", "--", "true"),
         "'train.steps=3': overrides are for a train.cfg, not for '-- CMD'"},
        {WORDS("--wait", "--watch"),
         "option '--watch' does not apply to 'gpurun' (see 'gpurun --help')"},
        {WORDS("--local", "--"), "nothing after '--': name the command to run"},
        {WORDS("a.cfg", "b.cfg"), "unexpected argument 'b.cfg' (to run a command, put it after "
                                  "'--': gpurun [options] -- CMD ARGS...)"},
        {WORDS("a.cfg", "--", "true"), "give a train.cfg or '-- CMD', not both"},
        /* A command's own options without '--': the message says where the command goes. */
        {WORDS("--local", "fairseq-hydra-train", "-m", "--config-dir", "C"),
         "'-m' after 'fairseq-hydra-train' is not gpurun's option: to run a command with its own "
         "options, put it after '--' (gpurun [options] -- fairseq-hydra-train -m ...)"},
        {WORDS("torchrun-script", "--lr", "3"),
         "'--lr' after 'torchrun-script' is not gpurun's option: to run a command with its own "
         "options, put it after '--' (gpurun [options] -- torchrun-script --lr ...)"},
        {WORDS("--local", "python3", "train.py", "--lr", "3"),
         "'python3' is not a train.cfg: to run a command, put it after '--' (gpurun [options] -- "
         "python3 train.py ...)"},
        {WORDS("a.cfg", "--bogus"), "unknown option '--bogus' (see 'gpurun --help')"},

        {WORDS("--json"), "option '--json' does not apply to 'gpurun' (see 'gpurun --help')"},
        {WORDS("status", "--nodes", "2"),
         "option '--nodes' does not apply to 'status' (see 'gpurun status --help')"},
        {WORDS("status", "--bogus"), "unknown option '--bogus' (see 'gpurun status --help')"},
        {WORDS("status", "a", "b"), "unexpected argument 'b'"},
        {WORDS("logs", "--rank", "x"), "--rank: 'x' is not a number"},
        {WORDS("logs", "-f=1"), "option '--follow' takes no value"},
        {WORDS("status", "--follow"),
         "option '--follow' does not apply to 'status' (see 'gpurun status --help')"},
        {WORDS("logs", "--json"),
         "option '--json' does not apply to 'logs' (see 'gpurun logs --help')"},
        /* torchrun's spellings: the option's checks, named as spelt; what gpurun cannot do,
         * refused with the way it can. */
        {WORDS("--nnodes", "0"), "--nnodes: must be 1..65536"},
        {WORDS("--nnodes=x"), "--nnodes: 'x' is not a number"},
        {WORDS("--nproc_per_node", "1025"), "--nproc_per_node: must be 1..1024"},
        {WORDS("--nproc-per-node"), "option '--nproc-per-node' needs a value"},
        {WORDS("--nnodes", "1:4", "train.py"),
         "--nnodes: '1:4' is an elastic range, which gpurun does not run: give one number of "
         "nodes (--nnodes N), and --max-restarts N to survive failures"},
        {WORDS("--nnodes=2:3"), "--nnodes: '2:3' is an elastic range, which gpurun does not run: "
                                "give one number of nodes (--nnodes N), and --max-restarts N to "
                                "survive failures"},
        {WORDS("--nproc-per-node", "gpu", "train.py"),
         "--nproc-per-node: 'gpu' is not supported (gpurun does not count the node's devices): "
         "give the number of ranks per node, e.g. --nproc-per-node 8"},
        {WORDS("--nproc_per_node=auto"),
         "--nproc_per_node: 'auto' is not supported (gpurun does not count the node's devices): "
         "give the number of ranks per node, e.g. --nproc_per_node 8"},
        {WORDS("--standalone", "train.py"),
         "'--standalone' is torchrun's: gpurun sets up the rendezvous itself; drop it (--local "
         "runs the job on this machine)"},
        {WORDS("--rdzv_endpoint=h:29400"),
         "'--rdzv_endpoint' is torchrun's: gpurun runs the rendezvous itself; drop it"},
        {WORDS("status", "--nnodes", "2"),
         "option '--nnodes' does not apply to 'status' (see 'gpurun status --help')"},
        {WORDS("status", "--standalone"),
         "unknown option '--standalone' (see 'gpurun status --help')"},
        /* Slips of the hand get the nearest name. */
        {WORDS("--gpus-per-nod", "2"),
         "unknown option '--gpus-per-nod'; did you mean '--gpus-per-node'?"},
        {WORDS("--gpus_per_node=2"),
         "unknown option '--gpus_per_node'; did you mean '--gpus-per-node'?"},
        {WORDS("--nproc-per-nod", "2"),
         "unknown option '--nproc-per-nod'; did you mean '--nproc-per-node'?"},
        {WORDS("--job_name", "x"), "unknown option '--job_name'; did you mean '--job-name'?"},
        {WORDS("--lcoal"), "unknown option '--lcoal'; did you mean '--local'?"},
        {WORDS("status", "--jsno"), "unknown option '--jsno'; did you mean '--json'?"},
        /* A near name of an option the subcommand does not take is no suggestion. */
        {WORDS("--jsno"), "unknown option '--jsno' (see 'gpurun --help')"},
        {WORDS("stauts", "12"),
         "'stauts' is not a gpurun command or a file; did you mean 'status'?"},
        {WORDS("lgos", "12"), "'lgos' is not a gpurun command or a file; did you mean 'logs'?"},
        {WORDS("log"), "'log' is not a gpurun command or a file; did you mean 'logs'?"},
        {WORDS("cancle", "12"),
         "'cancle' is not a gpurun command or a file; did you mean 'cancel'?"},
        {WORDS("Status"), "'Status' is not a gpurun command or a file; did you mean 'status'?"},
        /* The script takes every word after it; what comes before is gpurun's. */
        {WORDS("a.cfg", "train.py"),
         "give a train.cfg or a script, not both ('a.cfg', 'train.py')"},
        {WORDS("train.steps=3", "train.py"),
         "'train.steps=3': overrides are for a train.cfg, not for a script"},
        {WORDS("--bogus", "train.py"), "unknown option '--bogus' (see 'gpurun --help')"},
        /* --gpu-bind: srun's names. */
        {WORDS("--gpu-bind", "x"), "--gpu-bind: 'x' is not none or single"},
        {WORDS("--gpu-bind=single:2"), "--gpu-bind: 'single:2' is not none or single"},
        {WORDS("--gpu-bind="), "--gpu-bind: '' is not none or single"},
        {WORDS("--gpu-bind", "NONE"), "--gpu-bind: 'NONE' is not none or single"},
        {WORDS("--signal", "FOO"), "--signal: 'FOO' is not a signal (a number 1..64, or a name "
                                   "such as USR1 or SIGUSR1)"},
        {WORDS("status", "--signal", "USR1"),
         "option '--signal' does not apply to 'status' (see 'gpurun status --help')"},
        /* sbatch's options: the value named, with sbatch's reasons. */
        {WORDS("--mem", "10X", "--", "true"),
         "--mem: '10X' is not a size (a whole number and K, M, G or T; M by default)"},
        {WORDS("--mem-per-gpu=1.5G"),
         "--mem-per-gpu: '1.5G' is not a size (a whole number and K, M, G or T; M by default)"},
        {WORDS("--mem-per-cpu", "99999999999999999999"),
         "--mem-per-cpu: '99999999999999999999' is more memory than Slurm counts"},
        {WORDS("--mem", "1G", "--mem-per-cpu", "1G", "--", "true"),
         "--mem, --mem-per-cpu and --mem-per-gpu are mutually exclusive"},
        {WORDS("--exclusive=all"), "--exclusive: 'all' is not exclusive, user or mcs"},
        {WORDS("--dependency", "foo"),
         "--dependency: 'foo': 'foo' is not after, afterany, afterburstbuffer, aftercorr, "
         "afternotok, afterok or singleton"},
        {WORDS("-d", "afterok:x"), "--dependency: 'afterok:x': 'x' is not a job id"},
        {WORDS("--gres", "gpu:2", "--gpus-per-node", "3", "--", "true"),
         "--gpus-per-node 3 and --gres gpu:2 differ: gpurun runs one rank per GPU, so both count "
         "the ranks per node (it starts a node's ranks itself); give one of them"},
        {WORDS("--gres", "gpu:a100:2", "--ntasks-per-node", "4", "--", "true"),
         "--ntasks-per-node 4 and --gres gpu:a100:2 differ: gpurun runs one rank per GPU, so "
         "both count the ranks per node (it starts a node's ranks itself); give one of them"},
        {WORDS("--gres", "gpu:2", "--no-gpus", "--", "true"),
         "--gres gpu:2: the job asks for no GPUs (--no-gpus): count its ranks with -n or "
         "--gpus-per-node"},
        {WORDS("--gres", "gpu:2,gpu:a100:1"), "--gres: 'gpu:2,gpu:a100:1': more than one GPU item"},
        {WORDS("--gres", "gpu:a100:x"), "--gres: 'gpu:a100:x': 'x' is not a number of GPUs"},
        {WORDS("--gres", "gpu:0"), "--gres: 'gpu:0': 0 GPUs: must be 1..1024 per node"},
        {WORDS("--gres", "gpu:a 1:2"), "--gres: 'gpu:a 1:2': 'a 1' is not a GPU type"},
        {WORDS("-n", "5", "-N", "2", "--local", "--", "true"),
         "--ntasks 5 cannot be split evenly over --nodes 2: gpurun runs as many ranks on every "
         "node; give a multiple of 2 (4 or 6)"},
        {WORDS("--mail-type", "END,sometimes"),
         "--mail-type: 'sometimes' is not a mail type (BEGIN, END, FAIL, REQUEUE, ALL, "
         "TIME_LIMIT[_90|_80|_50], INVALID_DEPEND, STAGE_OUT, ARRAY_TASKS or NONE)"},
        {WORDS("--hold=yes"), "option '--hold' takes no value"},
        {WORDS("--qos", ""), "--qos: empty value"},
        {WORDS("-C", "--hold"), "option '--constraint' needs a value, and '--hold' looks like an "
                                "option (for a value that starts with '-', write "
                                "--constraint=--hold)"},
        {WORDS("--array", "0-3", "--", "true"),
         "--array: '0-3' is refused: a gpurun job is one rendezvous of all its ranks, not an "
         "array of jobs; submit one gpurun per task instead (a shell loop, each with --export "
         "TASK=N)"},
        {WORDS("-a", "1"), "--array: '1' is refused: a gpurun job is one rendezvous of all its "
                           "ranks, not an array of jobs; submit one gpurun per task instead (a "
                           "shell loop, each with --export TASK=N)"},
        {WORDS("status", "--mem", "1G"),
         "option '--mem' does not apply to 'status' (see 'gpurun status --help')"},
        {WORDS("--quos", "x"), "unknown option '--quos'; did you mean '--qos'?"},
        /* sbatch's counts in gpurun's model (one rank per GPU, as many on every node): what
         * does not fit it is refused, naming the numbers and what to write. */
        {WORDS("--ntasks-per-node", "1", "--gpus-per-node", "8", "--", "true"),
         "--gpus-per-node 8 and --ntasks-per-node 1 differ: gpurun runs one rank per GPU, so "
         "both count the ranks per node (it starts a node's ranks itself); give one of them"},
        {WORDS("--nproc-per-node", "2", "--ntasks-per-node", "4", "train.py"),
         "--gpus-per-node 2 and --ntasks-per-node 4 differ: gpurun runs one rank per GPU, so "
         "both count the ranks per node (it starts a node's ranks itself); give one of them"},
        {WORDS("-n", "10", "-N", "4", "--", "true"),
         "--ntasks 10 cannot be split evenly over --nodes 4: gpurun runs as many ranks on "
         "every node; give a multiple of 4 (8 or 12)"},
        {WORDS("-N", "4", "-n", "2", "--", "true"),
         "--ntasks 2 is fewer than --nodes 4: gpurun runs at least one rank on every node; "
         "give --nodes 2 or fewer"},
        {WORDS("-n", "16", "-N", "2", "--gpus-per-node", "4", "--", "true"),
         "--ntasks 16 over --nodes 2 is 8 ranks per node, but --gpus-per-node says 4: give two "
         "of the three (ranks in all = nodes x ranks per node)"},
        {WORDS("-n", "16", "--", "true"),
         "--ntasks 16 needs -N (16 / N ranks on each node) or --gpus-per-node G (16 / G "
         "nodes): gpurun runs as many ranks on every node"},
        {WORDS("-n", "10", "--ntasks-per-node", "4", "--", "true"),
         "--ntasks 10 is not a multiple of --ntasks-per-node 4: gpurun runs as many ranks on "
         "every node; give -N too, or a multiple of 4"},
        {WORDS("-n", "4096", "-N", "2", "--", "true"),
         "--ntasks 4096 over --nodes 2 is 2048 ranks per node, more than 1024"},
        {WORDS("-n", "0", "--", "true"), "--ntasks: must be 1..67108863"},
        {WORDS("--ntasks-per-node", "x"), "--ntasks-per-node: 'x' is not a number"},
        {WORDS("-G", "12", "-N", "8", "--", "true"),
         "--gpus 12 cannot be split evenly over --nodes 8: gpurun runs as many ranks on every "
         "node; give a multiple of 8 (8 or 16)"},
        {WORDS("-n", "8", "-G", "16", "-N", "2", "--", "true"),
         "--ntasks 8 and --gpus 16 differ: gpurun runs one rank per GPU, so both count the "
         "ranks in all; give one of them"},
        {WORDS("--gpus", "a100:8", "-N", "2", "--", "true"),
         "--gpus: 'a100:8': gpurun asks for GPUs by count, not by type: give --gpus 8 (and "
         "-C/--constraint for nodes with that GPU, where the cluster names it as a feature)"},
        {WORDS("-G", "4", "--no-gpus", "-N", "1", "--", "true"),
         "--gpus 4: the job asks for no GPUs (--no-gpus): count its ranks with -n or "
         "--gpus-per-node"},
        {WORDS("--gpus-per-task", "2", "-N", "2", "--", "true"),
         "--gpus-per-task 2: gpurun runs one rank per GPU, so every rank has one: drop it, and "
         "count the ranks with --gpus-per-node (or -n, -G)"},
        {WORDS("--gpus-per-task=h100:2"),
         "--gpus-per-task: 'h100:2': gpurun asks for GPUs by count, not by type: give "
         "--gpus-per-task 2 (and -C/--constraint for nodes with that GPU, where the cluster "
         "names it as a feature)"},
        {WORDS("status", "-n", "2"),
         "option '--ntasks' does not apply to 'status' (see 'gpurun status --help')"},
        /* --python and rerun. */
        {WORDS("--python", "", "train.py"), "--python: empty value"},
        {WORDS("--python", "--wait", "train.py"),
         "option '--python' needs a value, and '--wait' looks like an option (for a value that "
         "starts with '-', write --python=--wait)"},
        {WORDS("rerun", "-N", "2", "12"),
         "option '--nodes' does not apply to 'rerun' (see 'gpurun rerun --help')"},
        {WORDS("rerun", "1", "2"), "unexpected argument '2'"},
        {WORDS("rerum", "12"), "'rerum' is not a gpurun command or a file; did you mean 'rerun'?"},
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct gpurun_args a;
        struct errmsg err;
        int r = parse(&a, &err, cases[i].words);
        if (r != -EINVAL)
            test_fail(__FILE__, __LINE__, "case %zu ('%s ...'): returned %d, not -EINVAL", i,
                      cases[i].words[0], r);
        CHECK_STR(err.text, cases[i].msg);
        args_release(&a);
    }
}

/* Words that are not a subcommand but are files are train.cfgs, whatever they look like;
 * words far from every subcommand are left for the run to refuse. */
TEST(cli_args_misspelt_subcommand_only_when_no_file)
{
    struct gpurun_args a;
    struct errmsg err;
    char cwd[PATH_MAX];

    CHECK(getcwd(cwd, sizeof(cwd)) != NULL);
    CHECK_EQ(chdir(test_tmpdir()), 0);
    write_file("stauts", "[job]\n", 0644);
    CHECK_EQ(parse(&a, &err, WORDS("stauts")), 0);
    CHECK_EQ(a.cmd, CMD_RUN);
    CHECK_STR(a.target, "stauts");
    args_release(&a);
    CHECK_EQ(parse(&a, &err, WORDS("stats")), -EINVAL);
    CHECK_STR(err.text, "'stats' is not a gpurun command or a file; did you mean 'status'?");
    args_release(&a);
    /* Too far from every name: a train.cfg that does not exist, refused when it is read. */
    CHECK_EQ(parse(&a, &err, WORDS("stat_report")), 0);
    CHECK_STR(a.target, "stat_report");
    args_release(&a);
    CHECK_EQ(parse(&a, &err, WORDS("ls")), 0);
    CHECK_STR(a.target, "ls");
    args_release(&a);
    /* Only the first word can be a subcommand, so only it can be a misspelt one. */
    CHECK_EQ(parse(&a, &err, WORDS("--local", "stauts")), 0);
    args_release(&a);
    CHECK_EQ(chdir(cwd), 0);
}

TEST(cli_args_python_script)
{
    struct gpurun_args a;
    struct errmsg err;

    /* torchrun's order: gpurun's options, the script, then the script's own. */
    CHECK_EQ(parse(&a, &err,
                   WORDS("--local", "--nproc-per-node", "2", "train.py", "--lr", "3", "-N", "5",
                         "--", "x.cfg", "a.b=c")),
             0);
    CHECK_STR(a.script, "train.py");
    CHECK_EQ(a.spec.nprocs, 2);
    CHECK_EQ(a.spec.nnodes, 1);
    CHECK(args_given(&a, "gpus-per-node") && !args_given(&a, "nodes"));
    CHECK(a.target == NULL);
    CHECK_EQ(a.n_overrides, 0);
    CHECK_EQ(a.cmd_argc, 8);
    CHECK_STR(a.cmd_argv[0], "train.py");
    CHECK_STR(a.cmd_argv[1], "--lr");
    CHECK_STR(a.cmd_argv[3], "-N");
    CHECK_STR(a.cmd_argv[5], "--");
    CHECK_STR(a.cmd_argv[6], "x.cfg");
    CHECK_STR(a.cmd_argv[7], "a.b=c");
    CHECK(a.cmd_argv[8] == NULL);
    args_release(&a);

    CHECK_EQ(parse(&a, &err, WORDS("scripts/dir.v2/pretrain.py")), 0);
    CHECK_STR(a.script, "scripts/dir.v2/pretrain.py");
    CHECK_EQ(a.cmd_argc, 1);
    args_release(&a);

    /* After "--" a command is run as it is; a first word ending in .py is the script, as
     * torchrun's training script, and --python names its interpreter. */
    CHECK_EQ(parse(&a, &err, WORDS("--", "python3", "train.py", "--lr", "3")), 0);
    CHECK(a.script == NULL);
    CHECK_EQ(a.cmd_argc, 4);
    CHECK_STR(a.cmd_argv[0], "python3");
    args_release(&a);
    CHECK_EQ(parse(&a, &err, WORDS("--python", "/opt/py/bin/python", "--", "train.py", "--lr")), 0);
    CHECK_STR(a.script, "train.py");
    CHECK_STR(a.python, "/opt/py/bin/python");
    CHECK_EQ(a.cmd_argc, 2);
    CHECK_STR(a.cmd_argv[0], "train.py");
    CHECK_STR(a.cmd_argv[1], "--lr");
    args_release(&a);

    /* Not a script: ".py" alone, an override, a JOBID. */
    CHECK_EQ(parse(&a, &err, WORDS(".py")), 0);
    CHECK(a.script == NULL);
    CHECK_STR(a.target, ".py");
    args_release(&a);
    CHECK_EQ(parse(&a, &err, WORDS("x.cfg", "model.init=w.py")), 0);
    CHECK(a.script == NULL);
    CHECK_STR(a.overrides[0], "model.init=w.py");
    args_release(&a);
    CHECK_EQ(parse(&a, &err, WORDS("logs", "job.py")), 0);
    CHECK(a.script == NULL);
    CHECK_STR(a.target, "job.py");
    args_release(&a);
}

TEST(cli_args_torchrun_spellings)
{
    struct gpurun_args a;
    struct errmsg err;

    CHECK_EQ(parse(&a, &err, WORDS("--nproc_per_node=4", "--nnodes", "3", "--", "true")), 0);
    CHECK_EQ(a.spec.nprocs, 4);
    CHECK_EQ(a.spec.nnodes, 3);
    /* The alias sets the option's given bit, so a train.cfg's value does not override it. */
    CHECK(args_given(&a, "gpus-per-node") && args_given(&a, "nodes"));
    args_release(&a);
    CHECK_EQ(parse(&a, &err, WORDS("--nproc-per-node", "8", "--nnodes=2:2", "--", "true")), 0);
    CHECK_EQ(a.spec.nprocs, 8);
    CHECK_EQ(a.spec.nnodes, 2);
    args_release(&a);
    /* The last one given wins, whichever its spelling. */
    CHECK_EQ(parse(&a, &err,
                   WORDS("-N", "2", "--nnodes", "4", "--gpus-per-node", "3", "--nproc-per-node",
                         "1", "--", "true")),
             0);
    CHECK_EQ(a.spec.nnodes, 4);
    CHECK_EQ(a.spec.nprocs, 1);
    args_release(&a);
}

/* sbatch's counts, read in gpurun's model: nodes times ranks per node, one rank per GPU. Each
 * sets what -N and --gpus-per-node set, given bits too (so a train.cfg's [job] keys and
 * sbatch's variables do not override them), in any order. */
TEST(cli_args_sbatch_counts)
{
    const struct {
        const char *const *words;
        int nodes, per_node;
        bool nodes_given, per_node_given;
    } good[] = {
        {WORDS("-N", "2", "-n", "16"), 2, 8, true, true},
        {WORDS("--ntasks=16", "-N2"), 2, 8, true, true},
        {WORDS("--ntasks", "16", "--gpus-per-node", "4"), 4, 4, true, true},
        {WORDS("-n", "16", "-N", "2", "--gpus-per-node", "8"), 2, 8, true, true},
        {WORDS("-n", "12", "--ntasks-per-node", "3"), 4, 3, true, true},
        {WORDS("--ntasks-per-node", "4"), 1, 4, false, true},
        {WORDS("--ntasks-per-node", "4", "-N", "3", "--gpus-per-node", "4"), 3, 4, true, true},
        {WORDS("-G", "8", "-N", "2"), 2, 4, true, true},
        {WORDS("--gpus=8", "-n", "8", "--nproc-per-node", "4"), 2, 4, true, true},
        {WORDS("--nnodes", "2", "--ntasks", "4"), 2, 2, true, true},
        {WORDS("--gpus-per-task", "1", "--gpus-per-node", "2"), 1, 2, false, true},
        /* --gpus-per-task 1 alone says nothing of the size. */
        {WORDS("--gpus-per-task=1"), 1, 1, false, false},
        {WORDS("-n", "3", "-N", "3", "--no-gpus"), 3, 1, true, true},
        /* sbatch's --gres gpu:N is --gpus-per-node N, with a type or none. */
        {WORDS("--gres", "gpu:2"), 1, 2, false, true},
        {WORDS("--gres=gpu:a100:4", "-N", "2"), 2, 4, true, true},
        {WORDS("--gres", "nvme:1,gres:gpu:h100:2"), 1, 2, false, true},
        {WORDS("--gres", "gpu"), 1, 1, false, true},
        {WORDS("-n", "8", "--gres", "gpu:4"), 2, 4, true, true},
        {WORDS("--gres", "gpu:2", "--gpus-per-node", "2"), 1, 2, false, true},
        {WORDS("--gres", "nvme:1"), 1, 1, false, false},
        /* With --local one node is the only meaning of -n and -G alone. */
        {WORDS("--local", "-n", "4"), 1, 4, true, true},
        {WORDS("-G", "2", "--local"), 1, 2, true, true},
        {WORDS("--local", "-N", "2", "-n", "4"), 2, 2, true, true},
        {WORDS("--local", "-n", "4", "--gpus-per-node", "2"), 2, 2, true, true},
    };

    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        struct gpurun_args a;
        struct errmsg err;
        if (parse(&a, &err, good[i].words) != 0)
            test_fail(__FILE__, __LINE__, "case %zu ('%s ...') refused: %s", i, good[i].words[0],
                      err.text);
        if (a.spec.nnodes != good[i].nodes || a.spec.nprocs != good[i].per_node ||
            args_given(&a, "nodes") != good[i].nodes_given ||
            args_given(&a, "gpus-per-node") != good[i].per_node_given)
            test_fail(
                __FILE__, __LINE__,
                "case %zu ('%s ...'): %d nodes x %d (given %d, %d), expected %d x %d (%d, %d)", i,
                good[i].words[0], a.spec.nnodes, a.spec.nprocs, args_given(&a, "nodes"),
                args_given(&a, "gpus-per-node"), good[i].nodes, good[i].per_node,
                good[i].nodes_given, good[i].per_node_given);
        args_release(&a);
    }
}

TEST(cli_args_gpu_bind)
{
    static const struct {
        const char *word;
        int bind;
    } good[] = {{"--gpu-bind=none", GPU_BIND_NONE},
                {"--gpu-bind=single", GPU_BIND_SINGLE},
                {"--gpu-bind=single:1", GPU_BIND_SINGLE}};
    struct gpurun_args a;
    struct errmsg err;

    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        if (parse(&a, &err, WORDS(good[i].word, "--", "true")) != 0)
            test_fail(__FILE__, __LINE__, "'%s' refused: %s", good[i].word, err.text);
        if (a.spec.gpu_bind != good[i].bind)
            test_fail(__FILE__, __LINE__, "'%s': gpu_bind %d, expected %d", good[i].word,
                      a.spec.gpu_bind, good[i].bind);
        CHECK(args_given(&a, "gpu-bind"));
        args_release(&a);
    }
    CHECK_EQ(parse(&a, &err, WORDS("--gpu-bind", "single", "--gpu-bind", "none", "--", "true")), 0);
    CHECK_EQ(a.spec.gpu_bind, GPU_BIND_NONE);
    args_release(&a);
}

/* --signal asks for the signal by name: every rank gets it, not only those that registered. */
TEST(cli_args_signal_sets_the_spec)
{
    struct gpurun_args a;
    struct errmsg err;

    CHECK_EQ(parse(&a, &err, WORDS("--signal=B:USR2@90", "--", "true")), 0);
    CHECK_STR(a.signal.text, "B:USR2@90");
    CHECK_EQ(a.signal.sig, SIGUSR2);
    CHECK_EQ(a.signal.time_s, 90);
    CHECK(a.signal.batch_only && !a.signal.reservation);
    CHECK_EQ(a.spec.preempt_signal, SIGUSR2);
    CHECK_EQ(a.spec.preempt_all, 1);
    CHECK(args_given(&a, "signal"));
    args_release(&a);
    CHECK_EQ(parse(&a, &err, WORDS("--signal", "USR2", "--", "true")), 0);
    CHECK_EQ(a.spec.preempt_signal, SIGUSR2);
    CHECK_EQ(a.signal.time_s, SLURMOPT_SIGNAL_TIME_DEFAULT);
    CHECK_EQ(a.spec.preempt_all, 1);
    args_release(&a);
}

TEST(cli_args_subcommands)
{
    struct gpurun_args a;
    struct errmsg err;

    CHECK_EQ(parse(&a, &err, WORDS("status", "--job-dir", "d", "--json")), 0);
    CHECK_EQ(a.cmd, CMD_STATUS);
    CHECK_STR(a.job_dir, "d");
    CHECK(a.json);
    args_release(&a);

    CHECK_EQ(parse(&a, &err, WORDS("logs", "local-1", "--rank", "3")), 0);
    CHECK_EQ(a.cmd, CMD_LOGS);
    CHECK_STR(a.target, "local-1");
    CHECK_EQ(a.rank, 3);
    args_release(&a);

    CHECK_EQ(parse(&a, &err, WORDS("logs", "--", "-odd-id")), 0);
    CHECK_STR(a.target, "-odd-id");
    CHECK_EQ(a.rank, -1);
    args_release(&a);

    CHECK_EQ(parse(&a, &err, WORDS("cancel", "42")), 0);
    CHECK_EQ(a.cmd, CMD_CANCEL);
    CHECK_STR(a.target, "42");
    args_release(&a);

    CHECK_EQ(parse(&a, &err, WORDS("rerun", "42", "--wait")), 0);
    CHECK_EQ(a.cmd, CMD_RERUN);
    CHECK_STR(a.target, "42");
    CHECK(a.wait);
    args_release(&a);
    CHECK_EQ(parse(&a, &err, WORDS("rerun", "--job-dir", "d")), 0);
    CHECK_EQ(a.cmd, CMD_RERUN);
    CHECK_STR(a.job_dir, "d");
    CHECK(a.target == NULL);
    args_release(&a);

    /* A subcommand is only a subcommand in first place. */
    CHECK_EQ(parse(&a, &err, WORDS("--local", "status")), 0);
    CHECK_EQ(a.cmd, CMD_RUN);
    CHECK_STR(a.target, "status");
    args_release(&a);

    CHECK_STR(args_cmd_name(CMD_LOGS), "logs");
}

TEST(cli_args_help_subcommand)
{
    struct gpurun_args a;
    struct errmsg err;
    FILE *f;
    char *buf = NULL;
    size_t len = 0;

    CHECK_EQ(parse(&a, &err, WORDS("help")), 0);
    CHECK_EQ(a.cmd, CMD_HELP);
    CHECK_EQ(a.help_cmd, CMD_RUN);
    CHECK(!a.help);
    args_release(&a);

    CHECK_EQ(parse(&a, &err, WORDS("help", "status")), 0);
    CHECK_EQ(a.cmd, CMD_HELP);
    CHECK_EQ(a.help_cmd, CMD_STATUS);
    args_release(&a);

    CHECK_EQ(parse(&a, &err, WORDS("help", "help")), 0);
    CHECK_EQ(a.help_cmd, CMD_HELP);
    args_release(&a);

    CHECK_EQ(parse(&a, &err, WORDS("help", "gpurun")), 0);
    CHECK_EQ(a.help_cmd, CMD_RUN);
    args_release(&a);

    /* help's own help. */
    CHECK_EQ(parse(&a, &err, WORDS("help", "--help")), 0);
    CHECK_EQ(a.cmd, CMD_HELP);
    CHECK(a.help);
    args_release(&a);

    CHECK_EQ(parse(&a, &err, WORDS("help", "stat")), -EINVAL);
    CHECK_STR(err.text, "'stat': no such subcommand (gpurun's are status, logs, cancel, clean, "
                        "help, rerun, preflight)");
    args_release(&a);
    CHECK_EQ(parse(&a, &err, WORDS("help", "status", "logs")), -EINVAL);
    CHECK_STR(err.text, "gpurun help takes one subcommand: unexpected argument 'logs'");
    args_release(&a);
    CHECK_EQ(parse(&a, &err, WORDS("help", "--json")), -EINVAL);
    CHECK_CONTAINS(err.text, "'--json' does not apply to 'help'");
    args_release(&a);

    /* What cmd_help prints is what --help prints. */
    capture_begin(&f, &buf, &len);
    args_usage(f, CMD_HELP);
    fclose(f);
    CHECK_CONTAINS(buf, "usage: gpurun help [SUBCOMMAND]\n");
    CHECK_CONTAINS(buf, "-h, --help");
    CHECK(!strstr(buf, "--log-level"));
    free(buf);
}

/* -t 0 is taken, and counts as given (Slurm is then asked for no limit). */
TEST(cli_args_time_zero)
{
    struct gpurun_args a;
    struct errmsg err;

    CHECK_EQ(parse(&a, &err, WORDS("-t", "0", "--", "true")), 0);
    CHECK_EQ(a.time_limit_s, 0);
    CHECK(args_given(&a, "time"));
    args_release(&a);
}

/* Whether a help line is an option alone ("  -x, --name META", "      --name"), its help on
 * the lines below. */
static bool option_alone(const char *line)
{
    const char *p = line + strspn(line, " ");

    if (p[0] == '-' && p[1] != '-' && p[2] == ',' && p[3] == ' ')
        p += 4;
    if (strncmp(p, "--", 2))
        return false;
    p += strcspn(p, " ");
    if (*p == ' ')
        p += 1 + strcspn(p + 1, " ");
    return *p == '\0';
}

/* Every option of every subcommand's help: its help starts in the help column (on the
 * option's line, or under it when the option is too long for its column), and a default
 * the help says in words is not said again as " [N]". */
TEST(cli_args_usage_columns_and_defaults)
{
    for (int cmd = 0; cmd < CMD_COUNT; cmd++) {
        FILE *f;
        char *buf = NULL, *line, *save = NULL, entry[1024] = "";
        size_t len = 0;
        bool in_options = false;

        capture_begin(&f, &buf, &len);
        args_usage(f, (enum gpurun_cmd)cmd);
        fclose(f);
        /* A '\n' ends every entry's text in entry; checked when the next entry starts. */
        for (line = strtok_r(buf, "\n", &save);; line = strtok_r(NULL, "\n", &save)) {
            bool option = line && (!strncmp(line, "  -", 3) || !strncmp(line, "      --", 8));
            bool cont = line && !strncmp(line, "                               ", 31);
            if (entry[0] && !cont) {
                size_t n = strlen(entry);
                if (strstr(entry, "default") && n > 0 && entry[n - 1] == ']')
                    test_fail(__FILE__, __LINE__, "%s: a default said twice: '%s'",
                              args_cmd_name((enum gpurun_cmd)cmd), entry);
                entry[0] = '\0';
            }
            if (!line)
                break;
            if (!strcmp(line, "options:"))
                in_options = true;
            else if (line[0] != ' ')
                in_options = false;
            if (!in_options || (!option && !cont))
                continue;
            if (option) {
                size_t n = strlen(line);
                bool alone = option_alone(line);
                if (!alone && !(n > 31 && line[30] == ' ' && line[31] != ' '))
                    test_fail(__FILE__, __LINE__, "%s: help out of its column: '%s'",
                              args_cmd_name((enum gpurun_cmd)cmd), line);
                snprintf(entry, sizeof(entry), "%s", alone ? " " : line + 31);
            } else {
                size_t n = strlen(entry);
                snprintf(entry + n, sizeof(entry) - n, " %s", line + 31);
            }
        }
        free(buf);
    }
}

TEST(cli_args_usage_lists_the_rows)
{
    FILE *f;
    char *buf = NULL;
    size_t len = 0;

    capture_begin(&f, &buf, &len);
    args_usage(f, CMD_RUN);
    fclose(f);
    CHECK_CONTAINS(buf, "usage: gpurun [options] (train.cfg [section.key=value...] | SCRIPT.py "
                        "[ARGS...] | -- CMD [ARGS...])");
    CHECK_CONTAINS(buf, "--emit-sbatch");
    CHECK_CONTAINS(buf, "--max-restarts N");
    CHECK_CONTAINS(buf, "-N, --nodes N");
    CHECK_CONTAINS(buf, "--gpus-per-node N");
    CHECK_CONTAINS(buf, "--kill-grace SEC");
    CHECK_CONTAINS(buf, "[5]"); /* kill_grace's default, from jobspec */
    CHECK_CONTAINS(buf, "--export K=V");
    CHECK_CONTAINS(buf, "--version");
    /* The new options, and their defaults in words. */
    CHECK_CONTAINS(buf, "--gpu-bind MODE");
    CHECK_CONTAINS(buf, "none: every rank sees all its node's GPUs, as with torchrun;");
    CHECK_CONTAINS(buf, "single:1");
    CHECK_CONTAINS(buf, "GPU only [none]\n");
    CHECK_CONTAINS(buf, "--signal [B:]SIG[@TIME]");
    CHECK_CONTAINS(buf, "(default 60)");
    CHECK_CONTAINS(buf, "without it, SIGUSR1");
    CHECK_CONTAINS(buf, "\"PYTHON SCRIPT.py ARGS\"");
    CHECK_CONTAINS(buf, "PYTHON is --python's, else $VIRTUAL_ENV/bin/python in a venv, else "
                        "python3\non each node's PATH");
    CHECK_CONTAINS(buf, "\n      --python PATH            the Python that runs SCRIPT.py");
    CHECK_CONTAINS(buf, "\n  rerun                        submits an ended Slurm job again");
    /* sbatch's counts, with what each means here; no "[0]" for one not given. */
    CHECK_CONTAINS(buf, "\n  -n, --ntasks N               sbatch's: N ranks in all");
    CHECK_CONTAINS(buf, "\n      --ntasks-per-node N      sbatch's: ranks per node, so the same "
                        "as --gpus-per-node\n");
    CHECK_CONTAINS(buf, "\n  -G, --gpus N                 sbatch's: N GPUs in all, one rank "
                        "each, so the same as -n N\n");
    CHECK_CONTAINS(buf, "\n      --gpus-per-task 1        sbatch's: 1 only");
    CHECK_CONTAINS(buf, "\"gpurun: job ID, job dir DIR\"");
    CHECK_CONTAINS(buf, "The job's\nname is -J's");
    /* The subcommands, a line each from their rows. */
    CHECK_CONTAINS(buf, "\nsubcommands ('gpurun help SUBCOMMAND' or 'gpurun SUBCOMMAND --help' for "
                        "more):\n  status   ");
    CHECK_CONTAINS(buf, "\n  clean                        removes the job dirs of ended jobs\n");
    CHECK_CONTAINS(buf, "\n  help                         gpurun's help, or a subcommand's\n");
    /* A continued help line starts under the first. */
    CHECK_CONTAINS(buf, "as with torchrun;\n                               single");
    /* torchrun's spellings, from the alias table. */
    CHECK_CONTAINS(buf, "--nproc-per-node N       same as --gpus-per-node");
    CHECK_CONTAINS(buf, "--nnodes N               same as --nodes");
    CHECK_CONTAINS(buf, "--standalone");
    CHECK_CONTAINS(buf, "--rdzv-endpoint");
    /* sbatch's options and variables. */
    CHECK_CONTAINS(buf, "-q, --qos QOS");
    CHECK_CONTAINS(buf, "    --mem SIZE");
    CHECK_CONTAINS(buf, "    --mem-per-gpu SIZE");
    CHECK_CONTAINS(buf, "    --mem-per-cpu SIZE");
    CHECK_CONTAINS(buf, "    --exclusive[=user|mcs]");
    CHECK_CONTAINS(buf, "-C, --constraint LIST");
    CHECK_CONTAINS(buf, "-d, --dependency LIST");
    CHECK_CONTAINS(buf, "-w, --nodelist NODES");
    CHECK_CONTAINS(buf, "-x, --exclude NODES");
    CHECK_CONTAINS(buf, "    --reservation NAME");
    CHECK_CONTAINS(buf, "    --gres LIST");
    CHECK_CONTAINS(buf, "    --begin TIME");
    CHECK_CONTAINS(buf, "-H, --hold");
    CHECK_CONTAINS(buf, "-D, --chdir DIR");
    CHECK_CONTAINS(buf, "    --comment TEXT");
    CHECK_CONTAINS(buf, "    --mail-type TYPES");
    CHECK_CONTAINS(buf, "    --mail-user USER");
    CHECK_CONTAINS(buf, "-a, --array INDEXES");
    CHECK_CONTAINS(buf, "\n  SBATCH_PARTITION             --partition\n");
    CHECK_CONTAINS(buf, "\n  SBATCH_MEM_PER_NODE          --mem\n");
    CHECK_CONTAINS(buf, "flag >\nvariable > train.cfg [job] > default");
    CHECK(!strstr(buf, "-w, --watch"));
    CHECK(!strstr(buf, "--rank"));
    CHECK(!strstr(buf, "--json"));
    /* -t 0 is no limit, as for sbatch. */
    CHECK_CONTAINS(buf, "\n                               0 or UNLIMITED: none");
    free(buf);

    buf = NULL;
    capture_begin(&f, &buf, &len);
    args_usage(f, CMD_STATUS);
    fclose(f);
    CHECK_CONTAINS(buf, "usage: gpurun status");
    CHECK_CONTAINS(buf, "--json");
    CHECK_CONTAINS(buf, "--job-dir DIR");
    CHECK(!strstr(buf, "--nodes"));
    CHECK(!strstr(buf, "torchrun"));
    free(buf);

    buf = NULL;
    capture_begin(&f, &buf, &len);
    args_usage(f, CMD_RERUN);
    fclose(f);
    CHECK_CONTAINS(buf, "usage: gpurun rerun (JOBID | --job-dir DIR) [--wait]\n");
    CHECK_CONTAINS(buf, "job.sbatch");
    CHECK_CONTAINS(buf, "\n      --wait ");
    CHECK_CONTAINS(buf, "\n      --job-dir DIR ");
    CHECK(!strstr(buf, "--nodes") && !strstr(buf, "--python"));
    free(buf);
}

/* --- the job dir --------------------------------------------------------------------------- */

TEST(cli_jobdir_ids_and_paths)
{
    char buf[PATH_MAX + 32], cwd[PATH_MAX], want[PATH_MAX + 16];

    setenv("TZ", "UTC", 1);
    tzset();
    CHECK_EQ(jobdir_local_id(buf, sizeof(buf), 86400 + 3 * 3600 + 4 * 60 + 5, 42), 0);
    CHECK_STR(buf, "local-19700102-030405-42");
    CHECK_EQ(jobdir_local_id(buf, 10, 0, 42), -ENAMETOOLONG);

    /* The jobs root: HOME's without GPURUN_JOBS, else GPURUN_JOBS made absolute. */
    unsetenv("GPURUN_JOBS");
    setenv("HOME", "/home/u", 1);
    CHECK_EQ(jobdir_root(buf, sizeof(buf)), 0);
    CHECK_STR(buf, "/home/u/.gpurun/jobs");
    CHECK_EQ(jobdir_root(buf, 8), -ENOENT);
    setenv("GPURUN_JOBS", "runs/jobs", 1);
    CHECK(getcwd(cwd, sizeof(cwd)) != NULL);
    snprintf(want, sizeof(want), "%s/runs/jobs", cwd);
    CHECK_EQ(jobdir_root(buf, sizeof(buf)), 0);
    CHECK_STR(buf, want);
    CHECK_EQ(jobdir_root(buf, 8), -ENAMETOOLONG);
    unsetenv("GPURUN_JOBS");
}

static void spec_for_test(struct jobspec *spec)
{
    char *const argv[] = {(char *)"sh", (char *)"-c", (char *)"echo hi", NULL};

    jobspec_init(spec);
    spec->job_id = strdup("local-test-1");
    CHECK(spec->job_id != NULL);
    CHECK_EQ(jobspec_set_argv(spec, 3, argv), 0);
    CHECK_EQ(jobspec_add_env(spec, "A=1"), 0);
    spec->nnodes = 2;
    spec->nprocs = 3;
    spec->hb_timeout_ms = 4321;
    spec->loopback = true;
}

TEST(cli_jobdir_create_modes_and_spec)
{
    struct jobspec spec, back;
    struct errmsg jerr;
    struct errmsg err;
    struct auth_key key, zero = {{0}};
    char dir[PATH_MAX];

    /* A permissive umask must not leak into the job dir's modes. */
    umask(0);
    spec_for_test(&spec);
    snprintf(dir, sizeof(dir), "%s/a/b/job", test_tmpdir());
    CHECK_EQ(jobdir_create(dir, &spec, &err), 0);
    CHECK_EQ(mode_of(dir), 0700);
    CHECK_EQ(mode_of(path_in(test_tmpdir(), "a")), 0700);
    CHECK_EQ(mode_of(path_in(dir, "logs")), 0700);
    CHECK_EQ(mode_of(path_in(dir, "key")), 0600);
    CHECK_EQ(mode_of(path_in(dir, "job.json")), 0600);
    CHECK_EQ(auth_key_read(path_in(dir, "key"), &key), 0);
    CHECK(memcmp(&key, &zero, sizeof(key)) != 0);

    jobspec_init(&back);
    CHECK_EQ(jobspec_load(&back, path_in(dir, "job.json"), &jerr), 0);
    CHECK_STR(back.job_id, "local-test-1");
    CHECK_STR(back.argv[0], "sh");
    CHECK_STR(back.argv[2], "echo hi");
    CHECK(back.argv[3] == NULL);
    CHECK_STR(back.env[0], "A=1");
    CHECK_EQ(back.nnodes, 2);
    CHECK_EQ(back.nprocs, 3);
    CHECK_EQ(back.hb_timeout_ms, 4321);
    CHECK(back.loopback);
    jobspec_release(&back);
    jobspec_release(&spec);
}

TEST(cli_jobdir_two_jobs_get_two_keys)
{
    struct jobspec spec;
    struct errmsg err;
    struct auth_key k1, k2;
    char d1[PATH_MAX], d2[PATH_MAX];

    spec_for_test(&spec);
    join(d1, sizeof(d1), test_tmpdir(), "j1");
    join(d2, sizeof(d2), test_tmpdir(), "j2");
    CHECK_EQ(jobdir_create(d1, &spec, &err), 0);
    CHECK_EQ(jobdir_create(d2, &spec, &err), 0);
    CHECK_EQ(auth_key_read(path_in(d1, "key"), &k1), 0);
    CHECK_EQ(auth_key_read(path_in(d2, "key"), &k2), 0);
    CHECK(memcmp(&k1, &k2, sizeof(k1)) != 0);
    jobspec_release(&spec);
}

TEST(cli_jobdir_existing_dirs)
{
    struct jobspec spec;
    struct errmsg err;
    char dir[PATH_MAX], file[PATH_MAX + 8];

    spec_for_test(&spec);
    /* An empty directory is taken, and made private. */
    join(dir, sizeof(dir), test_tmpdir(), "given");
    CHECK_EQ(mkdir(dir, 0755), 0);
    CHECK_EQ(chmod(dir, 0755), 0);
    CHECK_EQ(jobdir_create(dir, &spec, &err), 0);
    CHECK_EQ(mode_of(dir), 0700);
    /* A directory holding a job is refused and left as it was. */
    CHECK_EQ(jobdir_create(dir, &spec, &err), -EEXIST);
    CHECK_CONTAINS(err.text, "is not empty");
    CHECK_EQ(mode_of(path_in(dir, "key")), 0600);
    /* So is any non-empty directory: nothing is written into it. */
    join(dir, sizeof(dir), test_tmpdir(), "other");
    CHECK_EQ(mkdir(dir, 0755), 0);
    join(file, sizeof(file), dir, "notes.txt");
    write_file(file, "mine\n", 0644);
    CHECK_EQ(jobdir_create(dir, &spec, &err), -EEXIST);
    CHECK_EQ(access(path_in(dir, "key"), F_OK), -1);
    CHECK_EQ(mode_of(dir) & 0777, 0755);
    /* A file in the way. */
    CHECK_EQ(jobdir_create(file, &spec, &err), -ENOTDIR);
    CHECK_CONTAINS(err.text, "notes.txt");
    jobspec_release(&spec);
}

TEST(cli_jobdir_failure_leaves_nothing)
{
    struct jobspec spec;
    struct errmsg err;
    char dir[PATH_MAX], ro[PATH_MAX];

    if (geteuid() == 0)
        test_skip("root ignores directory permissions");
    spec_for_test(&spec);
    join(ro, sizeof(ro), test_tmpdir(), "ro");
    CHECK_EQ(mkdir(ro, 0500), 0);
    join(dir, sizeof(dir), ro, "job");
    CHECK(jobdir_create(dir, &spec, &err) < 0);
    CHECK_CONTAINS(err.text, "cannot create job dir");
    CHECK_EQ(access(dir, F_OK), -1);
    jobspec_release(&spec);
}

/* --- finding commands ---------------------------------------------------------------------- */

TEST(cli_resolve_commands)
{
    char out[PATH_MAX], path[3 * PATH_MAX], a[PATH_MAX], b[PATH_MAX];
    const char *t = test_tmpdir();

    join(a, sizeof(a), t, "a");
    join(b, sizeof(b), t, "b");
    CHECK_EQ(mkdir(a, 0755), 0);
    CHECK_EQ(mkdir(b, 0755), 0);
    write_file(path_in(a, "tool"), "#!/bin/sh\n", 0644); /* not executable */
    write_file(path_in(b, "tool"), "#!/bin/sh\n", 0755);
    write_file(path_in(a, "only"), "#!/bin/sh\n", 0644);
    CHECK_EQ(mkdir(path_in(b, "sub"), 0755), 0);
    CHECK(snprintf(path, sizeof(path), "%s:%s", a, b) < (int)sizeof(path));

    /* The first executable match wins, as for execvp. */
    CHECK_EQ(local_resolve("tool", path, out, sizeof(out)), 0);
    CHECK_STR(out, path_in(b, "tool"));
    CHECK_EQ(local_resolve("only", path, out, sizeof(out)), -EACCES);
    CHECK_EQ(local_resolve("sub", path, out, sizeof(out)), -EACCES);
    CHECK_EQ(local_resolve("missing", path, out, sizeof(out)), -ENOENT);
    CHECK_EQ(local_resolve("", path, out, sizeof(out)), -ENOENT);
    /* A name with a slash is a path, PATH unused. */
    CHECK_EQ(local_resolve(path_in(b, "tool"), "/nonexistent", out, sizeof(out)), 0);
    CHECK_EQ(local_resolve(path_in(a, "tool"), path, out, sizeof(out)), -EACCES);
    CHECK_EQ(local_resolve(path_in(a, "nope"), path, out, sizeof(out)), -ENOENT);
    CHECK_EQ(local_resolve(b, path, out, sizeof(out)), -EACCES);
    /* No PATH: the system's default still finds sh. */
    CHECK_EQ(local_resolve("sh", NULL, out, sizeof(out)), 0);
    CHECK_EQ(local_resolve("sh", path, out, 4), -ENOENT);
}

/* The "#!" interpreter a script names, as the kernel reads its first line. */
TEST(cli_script_interpreter)
{
    char out[PATH_MAX], small[8];
    const char *t = test_tmpdir();

    write_file(path_in(t, "py"), "#!/no/such/python\nprint(1)\n", 0755);
    CHECK_EQ(fs_script_interpreter(path_in(t, "py"), out, sizeof(out)), 1);
    CHECK_STR(out, "/no/such/python");
    write_file(path_in(t, "env"), "#! /usr/bin/env python3 -u\n", 0755);
    CHECK_EQ(fs_script_interpreter(path_in(t, "env"), out, sizeof(out)), 1);
    CHECK_STR(out, "/usr/bin/env");
    write_file(path_in(t, "tab"), "#!\t/bin/sh", 0755);
    CHECK_EQ(fs_script_interpreter(path_in(t, "tab"), out, sizeof(out)), 1);
    CHECK_STR(out, "/bin/sh");
    /* No "#!", or nothing after it: no interpreter. */
    write_file(path_in(t, "plain"), "echo hi\n", 0755);
    CHECK_EQ(fs_script_interpreter(path_in(t, "plain"), out, sizeof(out)), 0);
    write_file(path_in(t, "bare"), "#!\n", 0755);
    CHECK_EQ(fs_script_interpreter(path_in(t, "bare"), out, sizeof(out)), 0);
    write_file(path_in(t, "one"), "#", 0755);
    CHECK_EQ(fs_script_interpreter(path_in(t, "one"), out, sizeof(out)), 0);
    CHECK_EQ(fs_script_interpreter(path_in(t, "missing"), out, sizeof(out)), 0);
    CHECK_EQ(fs_script_interpreter(path_in(t, "py"), small, sizeof(small)), -ENAMETOOLONG);
}

/* The GPUs --gpu-bind=single hands out: CUDA_VISIBLE_DEVICES's entries as the daemon reads
 * them. */
TEST(cli_gpu_list_count)
{
    CHECK_EQ(local_gpu_list_count(NULL), 0);
    CHECK_EQ(local_gpu_list_count(""), 0);
    CHECK_EQ(local_gpu_list_count("0"), 1);
    CHECK_EQ(local_gpu_list_count("0,1"), 2);
    CHECK_EQ(local_gpu_list_count("0,1,"), 2);
    CHECK_EQ(local_gpu_list_count("GPU-1a2b,GPU-3c4d,MIG-5e6f"), 3);
}

/* The daemons gpurun kills once the leader has ended: those its record judged lost or fenced,
 * never node 0's, nor one out of range. */
TEST(cli_local_judged_nodes)
{
    json_t *sum = json_loads("{\"nodes\": [{\"node\": 0, \"state\": \"lost\"},"
                             " {\"node\": 1, \"state\": \"lost\"},"
                             " {\"node\": 2, \"state\": \"done\"},"
                             " {\"node\": 3, \"state\": \"fenced\"},"
                             " {\"node\": 4, \"state\": \"spare\"},"
                             " {\"node\": 9, \"state\": \"lost\"}]}",
                             0, NULL);
    bool judged[5] = {false};

    CHECK(sum != NULL);
    CHECK_EQ(local_judged_nodes(sum, judged, 5), 2);
    CHECK(!judged[0] && judged[1] && !judged[2] && judged[3] && !judged[4]);
    /* Marked already: not counted twice. */
    CHECK_EQ(local_judged_nodes(sum, judged, 5), 0);
    CHECK_EQ(local_judged_nodes(NULL, judged, 5), 0);
    json_decref(sum);
}

/* A jobs root that cannot be made is named by where it came from: GPURUN_JOBS, or the home
 * directory's default. */
TEST(cli_jobs_root_make_names_its_source)
{
    char root[PATH_MAX], file[PATH_MAX];
    struct errmsg err;

    join(file, sizeof(file), test_tmpdir(), "a-file");
    write_file(file, "x\n", 0644);
    join(root, sizeof(root), file, "jobs");
    setenv("GPURUN_JOBS", root, 1);
    CHECK(jobdir_root_make(root, &err) < 0);
    CHECK_CONTAINS(err.text, "GPURUN_JOBS '");
    CHECK_CONTAINS(err.text, "/a-file/jobs': cannot create it: ");
    unsetenv("GPURUN_JOBS");
    CHECK(jobdir_root_make(root, &err) < 0);
    CHECK_CONTAINS(err.text, "cannot create the jobs root '");
    CHECK(!strstr(err.text, "GPURUN_JOBS"));
    /* One that can is made (0700), and one that is there is taken. */
    join(root, sizeof(root), test_tmpdir(), "r/jobs");
    setenv("GPURUN_JOBS", root, 1);
    CHECK_EQ(jobdir_root_make(root, &err), 0);
    CHECK_EQ(mode_of(root), 0700);
    CHECK_EQ(jobdir_root_make(root, &err), 0);
    unsetenv("GPURUN_JOBS");
}

/* A program gpurun ships: beside gpurun first, then on PATH; written with its links resolved,
 * and refused where it does not fit the caller's buffer. */
TEST(cli_find_program_beside_self_then_path)
{
    char out[PATH_MAX], t[PATH_MAX], bin[PATH_MAX], other[PATH_MAX], self[PATH_MAX + 8],
        want[PATH_MAX];
    size_t len;

    /* The expected paths are realpath's too: the test dir's parents may be links. */
    CHECK(realpath(test_tmpdir(), t) != NULL);
    join(bin, sizeof(bin), t, "bin");
    join(other, sizeof(other), t, "other");
    CHECK_EQ(mkdir(bin, 0755), 0);
    CHECK_EQ(mkdir(other, 0755), 0);
    join(self, sizeof(self), bin, "gpurun");
    write_file(path_in(other, "rendezvousd"), "#!/bin/sh\n", 0755);

    CHECK_EQ(local_find_program("rendezvousd", self, other, out, sizeof(out)), 0);
    CHECK_STR(out, path_in(other, "rendezvousd"));
    /* A directory of that name beside gpurun is passed over. */
    CHECK_EQ(mkdir(path_in(bin, "rendezvousd"), 0755), 0);
    CHECK_EQ(local_find_program("rendezvousd", self, other, out, sizeof(out)), 0);
    CHECK_STR(out, path_in(other, "rendezvousd"));
    CHECK_EQ(rmdir(path_in(bin, "rendezvousd")), 0);
    write_file(path_in(bin, "rendezvousd"), "#!/bin/sh\n", 0755);
    CHECK_EQ(local_find_program("rendezvousd", self, other, out, sizeof(out)), 0);
    CHECK_STR(out, path_in(bin, "rendezvousd"));
    CHECK_EQ(local_find_program("rendezvousd", NULL, other, out, sizeof(out)), 0);
    CHECK_STR(out, path_in(other, "rendezvousd"));
    CHECK_EQ(
        local_find_program("rendezvousd", "/nonexistent/gpurun", "/nonexistent", out, sizeof(out)),
        -ENOENT);
    CHECK_EQ(local_find_program("gpurun-train", self, other, out, sizeof(out)), -ENOENT);

    /* A link beside gpurun: the file it leads to. */
    write_file(path_in(other, "gpurun-train"), "#!/bin/sh\n", 0755);
    join(want, sizeof(want), other, "gpurun-train");
    CHECK_EQ(symlink(want, path_in(bin, "gpurun-train")), 0);
    CHECK_EQ(local_find_program("gpurun-train", self, "/nonexistent", out, sizeof(out)), 0);
    CHECK_STR(out, want);

    /* Bounded by the caller's size: the path and its NUL fit, or -ENAMETOOLONG. */
    len = strlen(want);
    CHECK_EQ(local_find_program("gpurun-train", self, NULL, out, len + 1), 0);
    CHECK_STR(out, want);
    memset(out, 'x', sizeof(out));
    CHECK_EQ(local_find_program("gpurun-train", self, NULL, out, len), -ENAMETOOLONG);
    CHECK_EQ(out[len], 'x');
    CHECK_EQ(local_find_program("gpurun-train", self, NULL, out, 0), -ENAMETOOLONG);
}

/* --- exit statuses ------------------------------------------------------------------------- */

static int wait_status_of(void (*child)(void))
{
    int st;
    pid_t pid = fork();

    CHECK(pid >= 0);
    if (pid == 0) {
        child();
        _exit(99);
    }
    CHECK_EQ(waitpid(pid, &st, 0), pid);
    return st;
}

static void exit_3(void)
{
    _exit(3);
}

static void die_of_kill(void)
{
    signal(SIGKILL, SIG_DFL);
    raise(SIGKILL);
}

TEST(cli_exit_status_of_wait_status)
{
    CHECK_EQ(local_exit_status(wait_status_of(exit_3)), 3);
    CHECK_EQ(local_exit_status(wait_status_of(die_of_kill)), 125);
}

TEST(cli_combine_daemon_statuses)
{
    static const struct {
        int status[3];
        bool stopped[3];
        int n, want;
    } cases[] = {
        {{0, 0, 0}, {0}, 3, 0},
        {{3, 3, 3}, {0}, 3, 3},     /* the job's own status */
        {{7, 125, 0}, {0}, 3, 7},   /* node 0's wins */
        {{0, 125, 0}, {0}, 3, 125}, /* a failure elsewhere is not hidden */
        {{0, 0, 137}, {0}, 3, 137},
        {{143, 125, 143}, {1, 0, 1}, 3, 125}, /* node 0 stopped after node 1 failed */
        {{143, 0, 0}, {1, 0, 0}, 3, 125},     /* stopped with no failure to report */
        {{0, 143, 0}, {0, 1, 0}, 3, 0},       /* a straggler gpurun stopped */
        {{0}, {0}, 1, 0},
        {{5}, {0}, 1, 5},
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int got = local_combine(cases[i].status, cases[i].stopped, cases[i].n);
        if (got != cases[i].want)
            test_fail(__FILE__, __LINE__, "case %zu: %d, expected %d", i, got, cases[i].want);
    }
}

/* --- logs and status printing -------------------------------------------------------------- */

TEST(cli_logs_print_in_rank_order)
{
    struct errmsg err;
    char logs[PATH_MAX];
    FILE *f;
    char *buf = NULL;
    size_t len = 0;
    const char *t = test_tmpdir();

    join(logs, sizeof(logs), t, "logs");
    CHECK_EQ(mkdir(logs, 0700), 0);
    write_file(path_in(logs, "rank-10.log"), "ten\n", 0600);
    write_file(path_in(logs, "rank-2.log"), "two a\ntwo b", 0600); /* no final newline */
    write_file(path_in(logs, "rank-0.log"), "zero\n", 0600);
    write_file(path_in(logs, "rank-x.log"), "not a rank\n", 0600);
    write_file(path_in(logs, "rank-01.log"), "not a rank either\n", 0600);

    capture_begin(&f, &buf, &len);
    CHECK_EQ(logs_print(f, t, -1, &err), 0);
    fclose(f);
    CHECK_STR(buf, "[0] zero\n[2] two a\n[2] two b\n[10] ten\n");
    free(buf);

    buf = NULL;
    capture_begin(&f, &buf, &len);
    CHECK_EQ(logs_print(f, t, 2, &err), 0);
    fclose(f);
    CHECK_STR(buf, "two a\ntwo b");
    free(buf);

    f = fopen("/dev/null", "w");
    CHECK_EQ(logs_print(f, t, 3, &err), -ENOENT);
    CHECK_CONTAINS(err.text, "no log of rank 3");
    CHECK_EQ(logs_print(f, "/nonexistent", -1, &err), -ENOENT);
    CHECK_CONTAINS(err.text, "cannot open '/nonexistent/logs'");
    fclose(f);
}

TEST(cli_status_without_a_leader)
{
    struct errmsg err;
    json_t *job = NULL;
    char ep[PATH_MAX + 16];
    const char *t = test_tmpdir();

    CHECK_EQ(status_query(t, 1000, &job, &err), -ENOENT);
    CHECK_CONTAINS(err.text, "endpoint.json");
    CHECK_EQ(status_load_summary(t, &job, &err), -ENOENT);
    /* An endpoint nobody listens on: port 1 of loopback refuses. */
    join(ep, sizeof(ep), t, "endpoint.json");
    write_file(ep, "{\"host\": \"127.0.0.1\", \"port\": 1, \"pid\": 1}", 0600);
    {
        struct auth_key k;
        CHECK_EQ(auth_key_generate(&k), 0);
        CHECK_EQ(auth_key_write(path_in(t, "key"), &k), 0);
    }
    CHECK_EQ(status_query(t, 1000, &job, &err), -ECONNREFUSED);
    CHECK_STR(err.text, "cannot connect to '127.0.0.1:1': connection refused");
    write_file(ep, "{\"host\": \"127.0.0.1\"}", 0600);
    CHECK_EQ(status_query(t, 1000, &job, &err), -EBADMSG);
    CHECK(job == NULL);
}

/* --- against the real daemon --------------------------------------------------------------- */

/* Makes a job dir under the test's tmpdir for argv (NULL-terminated). */
static void make_job(char *dir, size_t n, const char *name, int nnodes, int nprocs,
                     char *const *argv)
{
    struct jobspec spec;
    struct errmsg err;
    int argc = 0;

    while (argv[argc])
        argc++;
    jobspec_init(&spec);
    spec.job_id = strdup(name);
    CHECK_EQ(jobspec_set_argv(&spec, argc, argv), 0);
    spec.nnodes = nnodes;
    spec.nprocs = nprocs;
    spec.loopback = true;
    spec.kill_grace_ms = 1000;
    spec.join_timeout_ms = 20000;
    join(dir, n, test_tmpdir(), name);
    if (jobdir_create(dir, &spec, &err) < 0)
        test_fail(__FILE__, __LINE__, "%s", err.text);
    jobspec_release(&spec);
}

static int run_local(const char *dir, int nnodes, long time_limit_s, int *sig)
{
    struct local_job job = {.job_dir = dir,
                            .daemon = rendezvousd_or_skip(),
                            .log_level = "error",
                            .nnodes = nnodes,
                            .time_limit_s = time_limit_s,
                            .kill_grace_ms = 1000};
    int null = open("/dev/null", O_WRONLY | O_CLOEXEC);

    CHECK(null >= 0);
    job.out_fd = null;
    *sig = -1;
    int ret = local_run(&job, sig);
    close(null);
    return ret;
}

TEST(cli_local_run_statuses)
{
    char dir[PATH_MAX];
    char *const ok[] = {(char *)"true", NULL};
    char *const three[] = {(char *)"sh", (char *)"-c", (char *)"exit 3", NULL};
    int sig;

    rendezvousd_or_skip();
    make_job(dir, sizeof(dir), "ok", 2, 2, ok);
    CHECK_EQ(run_local(dir, 2, 0, &sig), 0);
    CHECK_EQ(sig, 0);
    CHECK_EQ(access(path_in(dir, "summary.json"), F_OK), 0);
    make_job(dir, sizeof(dir), "three", 2, 2, three);
    CHECK_EQ(run_local(dir, 2, 0, &sig), 3);
    CHECK_EQ(sig, 0);
}

TEST(cli_local_run_time_limit)
{
    char dir[PATH_MAX];
    char *const slow[] = {(char *)"sleep", (char *)"30", NULL};
    struct timespec t0, t1;
    int sig;

    rendezvousd_or_skip();
    make_job(dir, sizeof(dir), "slow", 1, 2, slow);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    CHECK_EQ(run_local(dir, 1, 1, &sig), 124);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    CHECK_EQ(sig, 0);
    /* One second of limit, then the daemon's teardown within its kill_grace. */
    CHECK_INT(t1.tv_sec - t0.tv_sec, <=, 10);
}

TEST(cli_status_query_live_leader)
{
    char dir[PATH_MAX], other[PATH_MAX];
    char *const slow[] = {(char *)"sleep", (char *)"30", NULL};
    struct errmsg err;
    json_t *job = NULL;
    const char *daemon = rendezvousd_or_skip();
    pid_t pid;
    int st, tries;

    make_job(dir, sizeof(dir), "live", 1, 2, slow);
    pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 1);
        dup2(null, 2);
        execl(daemon, "rendezvousd", "--job-dir", dir, "--log-level", "error", (char *)NULL);
        _exit(127);
    }
    /* The leader writes endpoint.json once it listens. */
    for (tries = 0; tries < 500 && access(path_in(dir, "endpoint.json"), F_OK) < 0; tries++)
        usleep(10000);
    CHECK_INT(tries, <, 500);
    CHECK_EQ(status_query(dir, 5000, &job, &err), 0);
    CHECK_STR(json_string_value(json_object_get(job, "job_id")), "live");
    CHECK_EQ(json_integer_value(json_object_get(job, "world_size")), 2);
    CHECK_EQ(json_array_size(json_object_get(job, "ranks")), 2);
    json_decref(job);
    job = NULL;

    /* The same endpoint with another job's key: the leader's challenge fails the check. */
    make_job(other, sizeof(other), "other", 1, 1, slow);
    CHECK_EQ(fs_write_atomic(path_in(other, "endpoint.json"), "", 0, 0600), 0);
    {
        char *text = NULL;
        size_t len;
        CHECK_EQ(fs_read_all(path_in(dir, "endpoint.json"), 4096, &text, &len), 0);
        CHECK_EQ(fs_write_atomic(path_in(other, "endpoint.json"), text, len, 0600), 0);
        free(text);
    }
    CHECK_EQ(status_query(other, 5000, &job, &err), -EACCES);
    CHECK_CONTAINS(err.text, "does not hold this job's key");

    kill(pid, SIGTERM);
    CHECK_EQ(waitpid(pid, &st, 0), pid);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) != 0);
}

TEST(cli_args_overrides_beside_a_cfg)
{
    struct gpurun_args a;
    struct errmsg err;

    CHECK_EQ(parse(&a, &err, WORDS("train.steps=3", "-N", "2", "jobs/x.cfg", "job.nodes=4")), 0);
    CHECK_STR(a.target, "jobs/x.cfg");
    CHECK_EQ(a.n_overrides, 2);
    CHECK_STR(a.overrides[0], "train.steps=3");
    CHECK_STR(a.overrides[1], "job.nodes=4");
    CHECK(a.cmd_argv == NULL);
    args_release(&a);
    /* A JOBID of status is never an override. */
    CHECK_EQ(parse(&a, &err, WORDS("status", "a.b=c")), 0);
    CHECK_STR(a.target, "a.b=c");
    CHECK_EQ(a.n_overrides, 0);
    args_release(&a);
}

/* --- the Python of a SCRIPT.py -------------------------------------------------------------- */

TEST(cli_python_choose)
{
    struct python_choice c;
    char cwd[PATH_MAX], want[PATH_MAX + 32];

    CHECK(getcwd(cwd, sizeof(cwd)) != NULL);
    /* --python first, a relative path made absolute (not resolved), a name left to PATH. */
    CHECK_EQ(python_choose(&c, "/opt/py/bin/python", "/home/u/venv"), 0);
    CHECK_STR(c.path, "/opt/py/bin/python");
    CHECK_EQ(c.source, PYTHON_GIVEN);
    CHECK_EQ(python_choose(&c, "venv/bin/python", NULL), 0);
    snprintf(want, sizeof(want), "%s/venv/bin/python", cwd);
    CHECK_STR(c.path, want);
    CHECK_EQ(python_choose(&c, "python3.11", "/home/u/venv"), 0);
    CHECK_STR(c.path, "python3.11");
    CHECK_EQ(c.source, PYTHON_GIVEN);
    /* Then the active venv's, then python3 on PATH. */
    CHECK_EQ(python_choose(&c, NULL, "/home/u/venv"), 0);
    CHECK_STR(c.path, "/home/u/venv/bin/python");
    CHECK_EQ(c.source, PYTHON_VENV);
    CHECK_EQ(python_choose(&c, NULL, ""), 0);
    CHECK_STR(c.path, "python3");
    CHECK_EQ(c.source, PYTHON_PATH);
    CHECK_EQ(python_choose(&c, NULL, NULL), 0);
    CHECK_STR(c.path, "python3");
}

/* The module a failed rank could not import: from torch's error record, else the last
 * ModuleNotFoundError line of its log's tail; any other failure is none. */
TEST(cli_python_missing_module)
{
    static const struct {
        const char *summary;
        const char *module; /* NULL: not a missing module */
        int rank;
    } cases[] = {
        {"{\"first_failure\": {\"rank\": 3, \"tail\": \"Traceback (most recent call last):\\n"
         "  File \\\"t.py\\\", line 1, in <module>\\n    import torch\\nModuleNotFoundError: No "
         "module named 'torch'\"}}",
         "torch", 3},
        {"{\"first_failure\": {\"rank\": 0, \"error\": {\"type\": \"ModuleNotFoundError\", "
         "\"message\": \"No module named 'torch.distributed'\"}, \"tail\": \"x\"}}",
         "torch.distributed", 0},
        /* The last one ended the rank: an earlier one was caught. */
        {"{\"first_failure\": {\"rank\": 1, \"tail\": \"ModuleNotFoundError: No module named "
         "'apex'\\nfalling back\\nModuleNotFoundError: No module named 'flash_attn'\\n\"}}",
         "flash_attn", 1},
        {"{\"first_failure\": {\"rank\": 1, \"tail\": \"ValueError: bad batch\"}}", NULL, 0},
        {"{\"first_failure\": {\"rank\": 1, \"tail\": \"print('ModuleNotFoundError: No module "
         "named x')\"}}",
         NULL, 0},
        {"{\"first_failure\": {\"rank\": 2, \"error\": {\"type\": \"ImportError\", \"message\": "
         "\"cannot import name 'x'\"}}}",
         NULL, 0},
        /* A node's failure (a cancelled job) has no rank. */
        {"{\"first_failure\": {\"node\": 0, \"tail\": \"ModuleNotFoundError: No module named "
         "'torch'\"}}",
         NULL, 0},
        {"{\"outcome\": \"completed\", \"first_failure\": null}", NULL, 0},
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        json_error_t je;
        json_t *sum = json_loads(cases[i].summary, 0, &je);
        char module[64] = "";
        int rank = -1;
        bool found;
        if (!sum)
            test_fail(__FILE__, __LINE__, "case %zu: bad JSON: %s", i, je.text);
        found = python_missing_module(sum, module, sizeof(module), &rank);
        if (found != (cases[i].module != NULL) ||
            (found && (strcmp(module, cases[i].module) || rank != cases[i].rank)))
            test_fail(__FILE__, __LINE__, "case %zu: found %d, '%s', rank %d; expected %s, rank %d",
                      i, found, module, rank, cases[i].module ? cases[i].module : "none",
                      cases[i].rank);
        json_decref(sum);
    }
}

/* A rank that ended looking for torch.distributed.launch's --local_rank: its log's last lines
 * name it; a node's failure, or a rank's other error, does not. */
TEST(cli_python_wants_local_rank)
{
    static const struct {
        const char *summary;
        bool wants;
        int rank;
    } cases[] = {
        {"{\"first_failure\": {\"rank\": 1, \"tail\": \"usage: t.py [-h] --local_rank "
         "LOCAL_RANK\\nt.py: error: the following arguments are required: --local_rank\"}}",
         true, 1},
        {"{\"first_failure\": {\"rank\": 0, \"tail\": \"    assert args.local_rank is not "
         "None\\nAssertionError\"}}",
         true, 0},
        {"{\"first_failure\": {\"rank\": 3, \"tail\": \"t.py: error: unrecognized arguments: "
         "--local-rank=3\"}}",
         true, 3},
        {"{\"first_failure\": {\"rank\": 1, \"tail\": \"ValueError: bad batch\"}}", false, 0},
        {"{\"first_failure\": {\"node\": 0, \"tail\": \"local_rank\"}}", false, 0},
        {"{\"outcome\": \"completed\", \"first_failure\": null}", false, 0},
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        json_error_t je;
        json_t *sum = json_loads(cases[i].summary, 0, &je);
        int rank = -1;
        bool wants;
        if (!sum)
            test_fail(__FILE__, __LINE__, "case %zu: bad JSON: %s", i, je.text);
        wants = python_wants_local_rank(sum, &rank);
        if (wants != cases[i].wants || (wants && rank != cases[i].rank))
            test_fail(__FILE__, __LINE__, "case %zu: %d, rank %d; expected %d, rank %d", i, wants,
                      rank, cases[i].wants, cases[i].rank);
        json_decref(sum);
    }
}

/* torch.distributed.launch's options: --local-rank-arg's spellings into the spec, --use_env
 * (either spelling) taken. */
TEST(cli_args_launch_options)
{
    struct gpurun_args a;
    struct errmsg err;

    CHECK_EQ(parse(&a, &err, WORDS("--local-rank-arg", "--use_env", "t.py")), 0);
    CHECK_EQ(a.spec.local_rank_arg, LOCAL_RANK_ARG_UNDERSCORE);
    CHECK(a.use_env);
    args_release(&a);
    CHECK_EQ(parse(&a, &err, WORDS("--local-rank-arg=local-rank", "--use-env", "t.py")), 0);
    CHECK_EQ(a.spec.local_rank_arg, LOCAL_RANK_ARG_DASH);
    args_release(&a);
    CHECK_EQ(parse(&a, &err, WORDS("t.py")), 0);
    CHECK_EQ(a.spec.local_rank_arg, LOCAL_RANK_ARG_NONE);
    args_release(&a);
    CHECK(parse(&a, &err, WORDS("--local-rank-arg=rank", "t.py")) < 0);
    args_release(&a);
}

/* The line names the Python that ran and the way to choose another, for each way it was
 * chosen. */
TEST(cli_python_missing_module_line)
{
    struct python_choice c;
    char *buf = NULL;
    size_t len = 0;
    FILE *f;

    capture_begin(&f, &buf, &len);
    CHECK_EQ(python_choose(&c, NULL, NULL), 0);
    python_print_missing(f, &c, "/usr/bin/python3", "torch", 0);
    CHECK_EQ(python_choose(&c, NULL, "/home/u/venv"), 0);
    python_print_missing(f, &c, NULL, "torch", 2);
    CHECK_EQ(python_choose(&c, "/opt/py", NULL), 0);
    python_print_missing(f, &c, NULL, "numpy", 1);
    fclose(f);
    CHECK_STR(buf, "gpurun: rank 0 has no module 'torch' in Python 'python3' (the first on each "
                   "node's PATH; here '/usr/bin/python3'): activate the venv that has it, or "
                   "choose a Python with --python PATH\n"
                   "gpurun: rank 2 has no module 'torch' in Python '/home/u/venv/bin/python' (the "
                   "active venv's, VIRTUAL_ENV): install 'torch' there, or choose another Python "
                   "with --python PATH\n"
                   "gpurun: rank 1 has no module 'numpy' in Python '/opt/py' (--python's): give "
                   "--python the path of a Python that has it\n");
    free(buf);
}
